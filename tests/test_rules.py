"""The shape-rule language: parsing, rendering and interpretation agree."""

from __future__ import annotations

import itertools

import pytest

from codegen import rules
from codegen.errors import RuleSyntaxError

TENSORS = frozenset({"x", "w"})
NAMES = frozenset({"dim", "N", "keepdim", "dims", "reduction"})


def parse(text: str) -> rules.Expr:
    return rules.parse_rule(text, TENSORS, NAMES)


SHAPE_CONTEXT = rules.Naming(
    name=lambda n: f"{n}_shape" if n in TENSORS else f"values[{n!r}]",
    tensor_attr=lambda t, a: f"len({t}_shape)" if a == "ndim" else f"{t}_shape",
    helper=lambda h: h if h in ("len", "min", "max") else f"helpers.{h}",
)

RULES = [
    "x.ndim >= 1",
    "-x.ndim <= dim < x.ndim",
    "x.shape[dim] == N",
    "x.shape[:-1] + (x.shape[-1] // 2,)",
    "x.shape[1:3]",
    "numel(x) // N",
    "prod(x.shape) % 7 + 3 * N - 1",
    "(N,) if keepdim else ()",
    "reduced_shape(x.shape, dims, keepdim)",
    "broadcast_shapes(x.shape, w.shape)",
    "not (x.ndim == 2 or N > 4) and N != 3",
    "dims is None or len(dims) <= x.ndim",
    "max(x.ndim, 2) - min(N, 5)",
    "-(N - 1) * 2",
    "2 * (N + 1) // 3",
    "(x.shape[0],) if reduction == 'none' else ()",
]


@pytest.mark.parametrize("text", RULES)
def test_rendered_python_agrees_with_interpreter(text: str) -> None:
    from tileops import _shape_rules as helpers

    expr = parse(text)
    code = rules.render(expr, SHAPE_CONTEXT)
    compiled = compile(code, "<rule>", "eval")
    for shape, dim, n, keepdim in itertools.product(
            [(1,), (3, 5), (2, 1, 4), (6, 2, 3, 5)], [0, -1], [1, 3, 8], [False, True]):
        shapes = {"x": shape, "w": shape[-1:]}
        values = {"dim": dim, "N": n, "keepdim": keepdim, "dims": None if n == 8 else (0,),
                  "reduction": "none" if keepdim else "mean"}

        def outcome(fn):
            try:
                return ("ok", fn())
            except (ValueError, IndexError, ZeroDivisionError) as exc:
                return ("error", type(exc).__name__)

        interpreted = outcome(lambda: rules.evaluate(expr, shapes, values))
        rendered = outcome(lambda: eval(compiled, {"helpers": helpers, "values": values,
                                                   "x_shape": shape, "w_shape": shape[-1:]}))
        assert interpreted == rendered, (text, shapes, values)


@pytest.mark.parametrize("text", RULES)
def test_source_round_trips(text: str) -> None:
    expr = parse(text)
    assert parse(rules.to_source(expr)) == expr


@pytest.mark.parametrize("text, message", [
    ("x.shape[0] ** 2", "operator `Pow`"),
    ("x.dtype == 3", "tensor attribute `dtype`"),
    ("y.ndim > 1", "unknown tensor `y`"),
    ("N / 2", "operator `Div`"),
    ("open('f')", "only the helpers"),
    ("x.shape[::2]", "slices take no step"),
    ("[N]", "`List` is outside"),
    ("N > 1.5", "constant 1.5 is not an integer"),
    ("lambda: 1", "`Lambda` is outside"),
    ("x.shape[", "cannot parse"),
    ("N.real", "attributes are allowed only on tensors"),
    ("numel(x=1)", "positional arguments only"),
])
def test_rejects_what_is_outside_the_grammar(text: str, message: str) -> None:
    with pytest.raises(RuleSyntaxError) as info:
        parse(text)
    assert message in str(info.value)


def test_output_rule_form() -> None:
    output, shape = rules.parse_output_rule("y.shape == x.shape[:-1]", frozenset({"y"}), TENSORS, NAMES)
    assert output == "y"
    assert rules.evaluate(shape, {"x": (2, 3, 4)}, {}) == (2, 3)
    with pytest.raises(RuleSyntaxError, match="must read"):
        rules.parse_output_rule("y.ndim == 2", frozenset({"y"}), TENSORS, NAMES)


def test_chained_comparison_short_circuits_like_python() -> None:
    expr = parse("-x.ndim <= dim < x.ndim")
    assert rules.evaluate(expr, {"x": (2, 3)}, {"dim": -2}) is True
    assert rules.evaluate(expr, {"x": (2, 3)}, {"dim": 2}) is False
    assert rules.evaluate(expr, {"x": (2, 3)}, {"dim": -3}) is False


def test_broadcastable_agrees_with_torch_at_any_rank() -> None:
    """Pairs and triples of shapes up to rank 10, sizes 1 to 3: the helper answers as torch does."""
    import random

    import torch

    from tileops._shape_rules import broadcastable

    generator = random.Random(0)
    for _ in range(3000):
        shapes = [tuple(generator.choice((1, 1, 2, 3)) for _ in range(generator.randint(0, 10)))
                  for _ in range(generator.choice((2, 3)))]
        try:
            torch.broadcast_shapes(*shapes)
            expected = True
        except RuntimeError:
            expected = False
        assert broadcastable(*shapes) is expected, shapes
