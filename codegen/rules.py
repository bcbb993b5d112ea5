"""The shape-rule language: one parser, one expression tree, three uses.

A rule is parsed with ``ast`` and converted into the project's own tree; any
construct outside the grammar is rejected.  The same tree is

* rendered into Python for generated op code (``render``, with a ``Naming``
  that says how names, tensors and helpers are spelled in that context),
* interpreted over concrete shapes and parameters (``evaluate``), and
* printed back canonically for error messages (``to_source``).

Grammar: integer constants (and ``None``/``True``/``False``, and strings to compare
with str params), names, ``t.ndim``,
``t.shape``, ``t.shape[i]``, ``t.shape[a:b]``, tuple literals, ``+ - * // %``,
unary ``-``/``+``/``not``, chained comparisons (``== != < <= > >= is``, ``is not``),
``and``/``or``, ``a if c else b`` and calls to the closed set of helpers in
``tileops._shape_rules.HELPERS``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Tuple, Union

from tileops._shape_rules import HELPERS

from .errors import RuleSyntaxError

__all__ = [
    "Expr", "Const", "Name", "TensorAttr", "Index", "SliceOf", "TupleOf", "BinOp", "UnaryOp",
    "Compare", "BoolOp", "IfElse", "Call", "parse_rule", "parse_output_rule", "names_in",
    "tensors_in", "evaluate", "render", "to_source", "Naming", "SOURCE_NAMING",
]


# ---- the tree ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Const:
    value: Union[int, bool, str, None]


@dataclass(frozen=True)
class Name:
    id: str


@dataclass(frozen=True)
class TensorAttr:
    tensor: str
    attr: str  # "ndim" | "shape"


@dataclass(frozen=True)
class Index:
    value: "Expr"
    index: "Expr"


@dataclass(frozen=True)
class SliceOf:
    value: "Expr"
    lower: Optional["Expr"]
    upper: Optional["Expr"]


@dataclass(frozen=True)
class TupleOf:
    items: Tuple["Expr", ...]


@dataclass(frozen=True)
class BinOp:
    op: str
    left: "Expr"
    right: "Expr"


@dataclass(frozen=True)
class UnaryOp:
    op: str  # "-" | "+" | "not"
    operand: "Expr"


@dataclass(frozen=True)
class Compare:
    left: "Expr"
    ops: Tuple[str, ...]
    comparators: Tuple["Expr", ...]


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    values: Tuple["Expr", ...]


@dataclass(frozen=True)
class IfElse:
    test: "Expr"
    body: "Expr"
    orelse: "Expr"


@dataclass(frozen=True)
class Call:
    func: str
    args: Tuple["Expr", ...]


Expr = Union[Const, Name, TensorAttr, Index, SliceOf, TupleOf, BinOp, UnaryOp, Compare, BoolOp,
             IfElse, Call]

_BIN_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_CMP_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
            ast.GtE: ">=", ast.Is: "is", ast.IsNot: "is not"}
_UNARY_OPS = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not"}


# ---- parsing -----------------------------------------------------------------------------
def parse_rule(text: str, tensors: FrozenSet[str], names: FrozenSet[str]) -> Expr:
    """Parse ``text``; every name must be a tensor in ``tensors`` or a value in ``names``."""
    if not isinstance(text, str) or not text.strip():
        raise RuleSyntaxError("a rule must be a non-empty string")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise RuleSyntaxError(f"cannot parse `{text}`: {exc.msg}") from None
    return _Converter(text, tensors, names).convert(tree.body)


def parse_output_rule(text: str, outputs: FrozenSet[str], tensors: FrozenSet[str],
                      names: FrozenSet[str]) -> Tuple[str, Expr]:
    """Parse ``<output>.shape == <shape expression>``; returns (output name, expression)."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise RuleSyntaxError(f"cannot parse `{text}`: {exc.msg}") from None
    if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq)
            and isinstance(tree.left, ast.Attribute) and tree.left.attr == "shape"
            and isinstance(tree.left.value, ast.Name) and tree.left.value.id in outputs):
        raise RuleSyntaxError(f"an output rule must read `<output>.shape == <shape>`, got `{text}`")
    shape = _Converter(text, tensors, names).convert(tree.comparators[0])
    return tree.left.value.id, shape


class _Converter:
    def __init__(self, text: str, tensors: FrozenSet[str], names: FrozenSet[str]) -> None:
        self.text = text
        self.tensors = tensors
        self.names = names

    def fail(self, node: ast.AST, what: str) -> RuleSyntaxError:
        col = getattr(node, "col_offset", 0)
        return RuleSyntaxError(f"{what} in `{self.text}` (column {col + 1})")

    def convert(self, node: ast.AST) -> Expr:  # noqa: C901 - one branch per grammar form
        if isinstance(node, ast.Constant):
            # Strings only compare with str params (e.g. reduction == "none").
            if node.value is None or isinstance(node.value, (bool, int, str)):
                return Const(node.value)
            raise self.fail(node, f"constant {node.value!r} is not an integer")
        if isinstance(node, ast.Name):
            if node.id in self.tensors or node.id in self.names:
                return Name(node.id)
            raise self.fail(node, f"unknown name `{node.id}`")
        if isinstance(node, ast.Attribute):
            if not isinstance(node.value, ast.Name) or node.value.id in self.names:
                raise self.fail(node, "attributes are allowed only on tensors")
            if node.value.id not in self.tensors:
                raise self.fail(node, f"unknown tensor `{node.value.id}`")
            if node.attr not in ("ndim", "shape"):
                raise self.fail(node, f"tensor attribute `{node.attr}` is not `ndim` or `shape`")
            return TensorAttr(node.value.id, node.attr)
        if isinstance(node, ast.Subscript):
            value = self.convert(node.value)
            if isinstance(node.slice, ast.Slice):
                if node.slice.step is not None:
                    raise self.fail(node, "slices take no step")
                lower = self.convert(node.slice.lower) if node.slice.lower else None
                upper = self.convert(node.slice.upper) if node.slice.upper else None
                return SliceOf(value, lower, upper)
            return Index(value, self.convert(node.slice))
        if isinstance(node, ast.Tuple):
            return TupleOf(tuple(self.convert(e) for e in node.elts))
        if isinstance(node, ast.BinOp):
            op = _BIN_OPS.get(type(node.op))
            if op is None:
                raise self.fail(node, f"operator `{type(node.op).__name__}` is not allowed")
            return BinOp(op, self.convert(node.left), self.convert(node.right))
        if isinstance(node, ast.UnaryOp):
            op = _UNARY_OPS.get(type(node.op))
            if op is None:
                raise self.fail(node, f"operator `{type(node.op).__name__}` is not allowed")
            return UnaryOp(op, self.convert(node.operand))
        if isinstance(node, ast.Compare):
            ops = []
            for op_node in node.ops:
                op = _CMP_OPS.get(type(op_node))
                if op is None:
                    raise self.fail(node, f"comparison `{type(op_node).__name__}` is not allowed")
                ops.append(op)
            return Compare(self.convert(node.left), tuple(ops),
                           tuple(self.convert(c) for c in node.comparators))
        if isinstance(node, ast.BoolOp):
            op = "and" if isinstance(node.op, ast.And) else "or"
            return BoolOp(op, tuple(self.convert(v) for v in node.values))
        if isinstance(node, ast.IfExp):
            return IfElse(self.convert(node.test), self.convert(node.body), self.convert(node.orelse))
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in HELPERS:
                raise self.fail(node, f"only the helpers {sorted(HELPERS)} may be called")
            if node.keywords:
                raise self.fail(node, "helpers take positional arguments only")
            return Call(node.func.id, tuple(self.convert(a) for a in node.args))
        raise self.fail(node, f"`{type(node).__name__}` is outside the shape-rule grammar")


# ---- walking -----------------------------------------------------------------------------
def _children(expr: Expr) -> Tuple[Expr, ...]:
    if isinstance(expr, (Index,)):
        return (expr.value, expr.index)
    if isinstance(expr, SliceOf):
        return tuple(e for e in (expr.value, expr.lower, expr.upper) if e is not None)
    if isinstance(expr, TupleOf):
        return expr.items
    if isinstance(expr, BinOp):
        return (expr.left, expr.right)
    if isinstance(expr, UnaryOp):
        return (expr.operand,)
    if isinstance(expr, Compare):
        return (expr.left,) + expr.comparators
    if isinstance(expr, BoolOp):
        return expr.values
    if isinstance(expr, IfElse):
        return (expr.test, expr.body, expr.orelse)
    if isinstance(expr, Call):
        return expr.args
    return ()


def _walk(expr: Expr):
    yield expr
    for child in _children(expr):
        yield from _walk(child)


def names_in(expr: Expr) -> FrozenSet[str]:
    """Plain names (params, static dims, variables, bare tensors) the expression reads."""
    return frozenset(e.id for e in _walk(expr) if isinstance(e, Name))


def tensors_in(expr: Expr, tensors: FrozenSet[str]) -> FrozenSet[str]:
    """Tensors whose shape or rank the expression reads."""
    found = {e.tensor for e in _walk(expr) if isinstance(e, TensorAttr)}
    found |= {n for n in names_in(expr) if n in tensors}
    return frozenset(found)


# ---- interpretation ----------------------------------------------------------------------
_BIN_IMPL: Dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "//": lambda a, b: a // b, "%": lambda a, b: a % b,
}
_CMP_IMPL: Dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "is": lambda a, b: a is b, "is not": lambda a, b: a is not b,
}


def evaluate(expr: Expr, shapes: Mapping[str, Tuple[int, ...]], values: Mapping[str, Any]) -> Any:
    """Interpret ``expr`` with tensor ``shapes`` and named ``values`` (params, dims, vars)."""
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Name):
        if expr.id in shapes:
            return tuple(shapes[expr.id])
        return values[expr.id]
    if isinstance(expr, TensorAttr):
        shape = tuple(shapes[expr.tensor])
        return len(shape) if expr.attr == "ndim" else shape
    if isinstance(expr, Index):
        return evaluate(expr.value, shapes, values)[evaluate(expr.index, shapes, values)]
    if isinstance(expr, SliceOf):
        lower = None if expr.lower is None else evaluate(expr.lower, shapes, values)
        upper = None if expr.upper is None else evaluate(expr.upper, shapes, values)
        return tuple(evaluate(expr.value, shapes, values)[lower:upper])
    if isinstance(expr, TupleOf):
        return tuple(evaluate(e, shapes, values) for e in expr.items)
    if isinstance(expr, BinOp):
        return _BIN_IMPL[expr.op](evaluate(expr.left, shapes, values),
                                  evaluate(expr.right, shapes, values))
    if isinstance(expr, UnaryOp):
        operand = evaluate(expr.operand, shapes, values)
        return {"-": lambda v: -v, "+": lambda v: +v, "not": lambda v: not v}[expr.op](operand)
    if isinstance(expr, Compare):
        left = evaluate(expr.left, shapes, values)
        for op, comparator in zip(expr.ops, expr.comparators):
            right = evaluate(comparator, shapes, values)
            if not _CMP_IMPL[op](left, right):
                return False
            left = right
        return True
    if isinstance(expr, BoolOp):
        result: Any = expr.op == "and"
        for value in expr.values:
            result = evaluate(value, shapes, values)
            if (expr.op == "and") != bool(result):
                return result
        return result
    if isinstance(expr, IfElse):
        branch = expr.body if evaluate(expr.test, shapes, values) else expr.orelse
        return evaluate(branch, shapes, values)
    if isinstance(expr, Call):
        return HELPERS[expr.func](*(evaluate(a, shapes, values) for a in expr.args))
    raise TypeError(f"not a rule expression: {expr!r}")


# ---- rendering ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Naming:
    """How one rendering context spells names, tensor attributes and helper calls."""

    name: Callable[[str], str]
    tensor_attr: Callable[[str, str], str]
    helper: Callable[[str], str]


SOURCE_NAMING = Naming(
    name=lambda n: n,
    tensor_attr=lambda t, a: f"{t}.{a}",
    helper=lambda h: h,
)

# Binding strength, loosest first, as in Python's grammar.
_PREC = {"ifelse": 0, "or": 1, "and": 2, "not": 3, "cmp": 4, "+": 5, "-": 5, "*": 6, "//": 6,
         "%": 6, "unary": 7, "atom": 9}


def render(expr: Expr, naming: Naming) -> str:
    """Python source for ``expr`` in the context ``naming`` describes."""
    return _render(expr, naming)[0]


def to_source(expr: Expr) -> str:
    """The canonical text of a rule, for messages."""
    return render(expr, SOURCE_NAMING)


def _wrap(part: Tuple[str, int], minimum: int) -> str:
    text, prec = part
    return f"({text})" if prec < minimum else text


def _render(expr: Expr, naming: Naming) -> Tuple[str, int]:  # noqa: C901
    atom = _PREC["atom"]
    if isinstance(expr, Const):
        return repr(expr.value), atom
    if isinstance(expr, Name):
        return naming.name(expr.id), atom
    if isinstance(expr, TensorAttr):
        return naming.tensor_attr(expr.tensor, expr.attr), atom
    if isinstance(expr, Index):
        return f"{_wrap(_render(expr.value, naming), atom)}[{render(expr.index, naming)}]", atom
    if isinstance(expr, SliceOf):
        lower = "" if expr.lower is None else render(expr.lower, naming)
        upper = "" if expr.upper is None else render(expr.upper, naming)
        return f"{_wrap(_render(expr.value, naming), atom)}[{lower}:{upper}]", atom
    if isinstance(expr, TupleOf):
        items = [render(e, naming) for e in expr.items]
        if len(items) == 1:
            return f"({items[0]},)", atom
        return f"({', '.join(items)})", atom
    if isinstance(expr, BinOp):
        prec = _PREC[expr.op]
        left = _wrap(_render(expr.left, naming), prec)
        right = _wrap(_render(expr.right, naming), prec + 1)  # left-associative
        return f"{left} {expr.op} {right}", prec
    if isinstance(expr, UnaryOp):
        if expr.op == "not":
            return f"not {_wrap(_render(expr.operand, naming), _PREC['not'])}", _PREC["not"]
        return f"{expr.op}{_wrap(_render(expr.operand, naming), _PREC['unary'])}", _PREC["unary"]
    if isinstance(expr, Compare):
        prec = _PREC["cmp"]
        parts = [_wrap(_render(expr.left, naming), prec + 1)]
        for op, comparator in zip(expr.ops, expr.comparators):
            parts += [op, _wrap(_render(comparator, naming), prec + 1)]
        return " ".join(parts), prec
    if isinstance(expr, BoolOp):
        prec = _PREC[expr.op]
        return f" {expr.op} ".join(_wrap(_render(v, naming), prec + 1) for v in expr.values), prec
    if isinstance(expr, IfElse):
        prec = _PREC["ifelse"]
        body = _wrap(_render(expr.body, naming), prec + 1)
        test = _wrap(_render(expr.test, naming), prec + 1)
        orelse = _wrap(_render(expr.orelse, naming), prec)
        return f"{body} if {test} else {orelse}", prec
    if isinstance(expr, Call):
        args = ", ".join(render(a, naming) for a in expr.args)
        return f"{naming.helper(expr.func)}({args})", atom
    raise TypeError(f"not a rule expression: {expr!r}")
