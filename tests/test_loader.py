"""Manifest loading: every defect is one located message, and nothing is built."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from codegen import ManifestErrors, load_files, load_manifest
from codegen.loader import SCHEMA_COMMENT

GOOD = """@COMMENT@
AddOneFwdOp:
  family: demo
  status: spec-only
  summary: "y = x + 1"
  signature:
    inputs:
      x: {dtype: "float16 | bfloat16 | float32"}
      w: {dtype: "same_as(x)", shape: [N]}
    outputs:
      y: {dtype: "same_as(x)"}
    params:
      dim: {type: int, default: -1}
  static_dims:
    N: "x.shape[dim]"
  shape_rules:
    - "-x.ndim <= dim < x.ndim"
    - "y.shape == x.shape"
  reference: "x + 1"
  roofline:
    flops: "numel(x)"
    bytes: "2 * numel(x) * elem_bytes"
  kernel_map:
    add_one: AddOneFwdKernel
  backward: reference
"""


def write(tmp_path: Path, text: str, name: str = "demo.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("@COMMENT@", SCHEMA_COMMENT))
    return path


def errors_of(tmp_path: Path, *paths: Path) -> list:
    with pytest.raises(ManifestErrors) as info:
        load_files(paths, root=tmp_path)
    return info.value.errors


def line_of(text: str, needle: str) -> int:
    for number, line in enumerate(text.replace("@COMMENT@", SCHEMA_COMMENT).splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(needle)


def test_good_manifest_builds_a_located_model(tmp_path: Path) -> None:
    manifest = load_files([write(tmp_path, GOOD)], root=tmp_path)
    op = manifest.op("AddOneFwdOp")
    assert op.location.file == "demo.yaml" and op.location.line == 2
    assert op.static_dims[0].axis_param == "dim"
    assert [r.text for r in op.shape_rules if r.implied] == ["w.ndim == 1", "w.shape[0] == N"]
    assert op.resolved_dtype_names("y") == ("float16", "bfloat16", "float32")
    with pytest.raises(Exception):
        op.name = "other"  # frozen


def test_a_rule_s_why_reaches_the_rule_a_declared_shape_implies(tmp_path: Path) -> None:
    """A written precondition the inputs' declared shapes already imply is not checked twice: the
    implied rule, checked first, takes the written one's words."""
    text = GOOD.replace('    - "-x.ndim <= dim < x.ndim"\n',
                        '    - {rule: "-x.ndim <= dim < x.ndim", why: "dim must be an axis of x"}\n'
                        '    - {rule: "w.ndim == 1", why: "w must be a vector"}\n')
    op = load_files([write(tmp_path, text)], root=tmp_path).op("AddOneFwdOp")
    assert [(r.text, r.why, r.implied) for r in op.shape_rules] == [
        ("w.ndim == 1", "w must be a vector", True), ("w.shape[0] == N", "", True),
        ("-x.ndim <= dim < x.ndim", "dim must be an axis of x", False)]


# GOOD's params with an out_dtype param after dim.
WITH_OUT_DTYPE_PARAM = 'dim: {type: int, default: -1}\n      out_dtype: {type: "Optional[dtype]", default: null}'


@pytest.mark.parametrize("edit, needle, message", [
    (lambda t: t.replace('  summary: "y = x + 1"\n', '  summary: "y = x + 1"\n  colour: red\n'),
     "colour: red", "unknown key 'colour'"),
    (lambda t: t.replace("default: -1", "default: minus-one"), "default: minus-one", "is not a int"),
    (lambda t: t.replace('"-x.ndim <= dim < x.ndim"', '"x.ndim ** 2 > 1"'), "x.ndim ** 2", "operator `Pow`"),
    (lambda t: t.replace('"same_as(x)", shape', '"same_as(q)", shape'), "same_as(q)", "same_as(q) names no input"),
    (lambda t: t.replace('N: "x.shape[dim]"', 'N: "z.shape[dim]"'), "z.shape[dim]", "not an input"),
    (lambda t: t.replace('N: "x.shape[dim]"', 'N: "x.shape[axis]"'), "x.shape[axis]", "neither an integer nor an int param"),
    (lambda t: t.replace("status: spec-only", "status: done"), "status: done", "expected one of ['spec-only', 'implemented']"),
    (lambda t: t.replace('reference: "x + 1"', 'reference: "x + bias"'), "reference:", "unknown name 'bias'"),
    (lambda t: t.replace('    - "y.shape == x.shape"\n', ''), "shape_rules:", "no `y.shape == ...` rule"),
    (lambda t: t.replace("family: demo", "family: demo\n  family: other"), "family: other", "duplicate key 'family'"),
    (lambda t: t.replace("AddOneFwdOp:", "AddOne:"), "AddOne:", "does not match"),
    (lambda t: t.replace("    flops: \"numel(x)\"", "    flops: \"numel(q)\""), "numel(q)", "unknown name `q`"),
    (lambda t: t.replace("inputs:\n", "inputs:\n      x: {dtype: float16}\n", 1), "x: {dtype: \"float16 | bfloat16", "duplicate key 'x'"),
    (lambda t: t.replace("  kernel_map:\n    add_one: AddOneFwdKernel\n", ""), "AddOneFwdOp:", "'kernel_map' is a required property"),
    (lambda t: t.replace('x: {dtype: "float16 | bfloat16 | float32"}', 'x: {dtype: "float16 | half"}'), "float16 | half", "does not match"),
    (lambda t: t.replace('w: {dtype: "same_as(x)", shape: [N]}', 'w: {dtype: "same_as(x)", shape: [N], saved: true}'),
     "saved: true", "only outputs can be saved"),
    (lambda t: t.replace('y: {dtype: "same_as(x)"}', 'y: {dtype: "same_as(x)", saved: true}'),
     "saved: true", "every output is saved"),
    # The functional form's dtype casts one floating-point input whose dtypes are named.
    (lambda t: t.replace('y: {dtype: "same_as(x)"}', 'y: {dtype: "same_as(x)", cast_by_dtype: true}'),
     "cast_by_dtype: true", "only inputs can be cast"),
    (lambda t: t.replace('w: {dtype: "same_as(x)", shape: [N]}', 'w: {dtype: "same_as(x)", shape: [N], cast_by_dtype: true}'),
     "cast_by_dtype: true", "takes floating-point dtypes named in a union, got 'same_as(x)'"),
    (lambda t: t.replace('x: {dtype: "float16 | bfloat16 | float32"}', 'x: {dtype: "float32 | int64", cast_by_dtype: true}'),
     "cast_by_dtype: true", "got 'float32 | int64'"),
    (lambda t: t.replace('x: {dtype: "float16 | bfloat16 | float32"}', 'x: {dtype: "float32", cast_by_dtype: true}')
     .replace('w: {dtype: "same_as(x)", shape: [N]}', 'w: {dtype: "float32", shape: [N], cast_by_dtype: true}'),
     "w: {dtype", "only one input can be cast by the functional form's dtype, got ['x', 'w']"),
    # An output's dtype from the param out_dtype, which the functional form's dtype keyword gives.
    (lambda t: t.replace('y: {dtype: "same_as(x)"}', 'y: {dtype: "same_as(x)", dtype_param: dim}'),
     "dtype_param: dim", "dtype_param: 'out_dtype' was expected"),
    (lambda t: t.replace('y: {dtype: "same_as(x)"}', 'y: {dtype: "same_as(x)", dtype_param: out_dtype}'),
     "dtype_param: out_dtype", "dtype_param 'out_dtype' must be out_dtype, a param of type Optional[dtype]"),
    (lambda t: t.replace('y: {dtype: "same_as(x)"}', 'y: {dtype: "same_as(x)", dtype_param: out_dtype}')
     .replace("dim: {type: int, default: -1}", WITH_OUT_DTYPE_PARAM),
     "dtype_param: out_dtype", "needs an input with cast_by_dtype"),
    (lambda t: t.replace('w: {dtype: "same_as(x)", shape: [N]}',
                         'w: {dtype: "same_as(x)", shape: [N], dtype_param: out_dtype}'),
     "dtype_param: out_dtype", "only outputs take their dtype from a param"),
    (lambda t: t.replace("dim: {type: int, default: -1}", WITH_OUT_DTYPE_PARAM),
     "out_dtype: {type", "param 'out_dtype' of type Optional[dtype] is no output's dtype_param"),
    # Bounds: on numbers only, ints on int params, in order, around the default.
    (lambda t: t.replace("dim: {type: int, default: -1}", "mode: {type: str, default: a, minimum: 0}"),
     "mode: {type: str", "minimum applies to int and float"),
    (lambda t: t.replace("dim: {type: int, default: -1}", "dim: {type: int, default: -1, maximum: 0.5}"),
     "maximum: 0.5", "maximum of an int param must be an int, got 0.5"),
    (lambda t: t.replace("dim: {type: int, default: -1}", "dim: {type: int, default: -1, minimum: 1, maximum: 0}"),
     "minimum: 1", "minimum 1 is above maximum 0"),
    (lambda t: t.replace("dim: {type: int, default: -1}", "dim: {type: int, default: -1, minimum: 0}"),
     "minimum: 0", "default -1 lies outside [0, None]"),
    (lambda t: t.replace("dim: {type: int, default: -1}", "dim: {type: int, default: -1, minimum: low}"),
     "minimum: low", "expected number, got 'low'"),
    # A rule's words for its error: preconditions only, and never without the rule.
    (lambda t: t.replace('    - "y.shape == x.shape"\n', '    - {rule: "y.shape == x.shape", why: "y is x plus one"}\n'),
     "y is x plus one", "an output's shape rule is never broken by a call; it takes no `why`"),
    (lambda t: t.replace('    - "-x.ndim <= dim < x.ndim"\n', '    - {rule: "-x.ndim <= dim < x.ndim"}\n'),
     "{rule:", "missing required key: 'why' is a required property"),
])
def test_each_defect_is_one_located_error(tmp_path: Path, edit, needle: str, message: str) -> None:
    text = edit(GOOD)
    errors = errors_of(tmp_path, write(tmp_path, text))
    assert len(errors) == 1, [str(e) for e in errors]
    error = errors[0]
    assert message in str(error)
    assert error.location.file == "demo.yaml"
    assert error.location.line == line_of(text, needle), str(error)


# GOOD with an output dtype the functional form's dtype keyword gives, and a workload naming one.
WITH_OUT_DTYPE = (GOOD.replace('x: {dtype: "float16 | bfloat16 | float32"}',
                               'x: {dtype: "float16 | bfloat16 | float32", cast_by_dtype: true}')
                  .replace('y: {dtype: "same_as(x)"}', 'y: {dtype: "same_as(x)", dtype_param: out_dtype}')
                  .replace("dim: {type: int, default: -1}", WITH_OUT_DTYPE_PARAM)
                  + "  workloads:\n    - {label: wide, shapes: {x: [4, 8], w: [8]}, dtypes: [bfloat16], "
                    "params: {out_dtype: float32}}\n")


def test_an_output_dtype_param_is_named_in_workloads(tmp_path: Path) -> None:
    op = load_files([write(tmp_path, WITH_OUT_DTYPE)], root=tmp_path).op("AddOneFwdOp")
    assert op.tensor("y").dtype_param == "out_dtype" and op.tensor("x").cast_by_dtype
    assert dict(op.workloads[0].params) == {"out_dtype": "float32"}
    text = WITH_OUT_DTYPE.replace("out_dtype: float32}", "out_dtype: half}")
    (error,) = errors_of(tmp_path, write(tmp_path, text))
    assert "out_dtype names a dtype: one of ['float16', 'bfloat16', 'float32', 'float64'], got 'half'" in str(error)
    assert error.location.line == line_of(text, "out_dtype: half")


def test_error_names_the_key_path(tmp_path: Path) -> None:
    text = GOOD.replace("default: -1", "default: minus-one")
    (error,) = errors_of(tmp_path, write(tmp_path, text))
    assert str(error).startswith(f"demo.yaml:{line_of(text, 'minus-one')} AddOneFwdOp.signature.params.dim.default:")


def test_yaml_syntax_error_is_located(tmp_path: Path) -> None:
    text = GOOD.replace("  family: demo\n", "  family: [demo\n")
    (error,) = errors_of(tmp_path, write(tmp_path, text))
    assert "YAML syntax error" in str(error) and error.location.file == "demo.yaml"


def test_duplicate_op_across_files_names_both_places(tmp_path: Path) -> None:
    first = write(tmp_path, GOOD, "a.yaml")
    second = write(tmp_path, GOOD, "b.yaml")
    (error,) = errors_of(tmp_path, first, second)
    assert str(error).startswith("b.yaml:2 AddOneFwdOp:")
    assert "first defined at a.yaml:2" in str(error)


def test_missing_schema_comment_is_an_error(tmp_path: Path) -> None:
    (error,) = errors_of(tmp_path, write(tmp_path, GOOD.replace("@COMMENT@\n", "")))
    assert "must start with" in str(error) and error.location.line == 1


def test_backward_must_name_a_manifest_op(tmp_path: Path) -> None:
    text = GOOD.replace("  backward: reference\n", "  backward: {op: AddOneBwdOp, saves: [x]}\n")
    (error,) = errors_of(tmp_path, write(tmp_path, text))
    assert "backward op 'AddOneBwdOp' is not in the manifest" in str(error)


def test_a_differentiable_fwd_op_must_say_how_it_is_differentiated(tmp_path: Path) -> None:
    (error,) = errors_of(tmp_path, write(tmp_path, GOOD.replace("  backward: reference\n", "")))
    assert str(error).startswith("demo.yaml:2 AddOneFwdOp:") and "`backward: reference`" in str(error)
    integer_output = GOOD.replace("  backward: reference\n", "")
    integer_output = integer_output.replace('y: {dtype: "same_as(x)"}', 'y: {dtype: "int64"}')
    (op,) = load_files([write(tmp_path, integer_output)], root=tmp_path).ops
    assert op.backward is None and not op.backward_by_reference


BWD = """
AddOneBwdOp:
  family: demo
  status: spec-only
  summary: "grad_x = grad_y"
  signature:
    inputs:
      grad_y: {dtype: "float16 | bfloat16 | float32"}
    outputs:
      grad_x: {dtype: "same_as(grad_y)"}
@MORE_OUTPUTS@  shape_rules:
    - "grad_x.shape == grad_y.shape"
@MORE_RULES@  reference: "grad_y"
  roofline:
    flops: "0"
    bytes: "2 * numel(grad_y) * elem_bytes"
  kernel_map:
    add_one_bwd: AddOneBwdKernel
"""


def _with_bwd_op(backward: str, more_outputs: str = "") -> str:
    more_rules = "    - \"grad_w.shape == grad_y.shape\"\n" if more_outputs else ""
    bwd = BWD.replace("@MORE_OUTPUTS@", more_outputs).replace("@MORE_RULES@", more_rules)
    return GOOD.replace("  backward: reference\n", f"  backward: {backward}\n") + bwd


def test_an_input_may_take_the_gradient_of_another(tmp_path: Path) -> None:
    fwd, _ = load_files([write(tmp_path, _with_bwd_op("{op: AddOneBwdOp, same_gradient: {w: x}}"))],
                        root=tmp_path).ops
    assert fwd.backward.same_gradient == (("w", "x"),) and fwd.backward.bwd_outputs == ("grad_x",)


@pytest.mark.parametrize("same_gradient, more_outputs, message", [
    ("{w: q}", "", "same_gradient names 'q', which is no input"),
    ("{w: w}", "", "'w' takes the gradient of 'w', which must be another input"),
    ("{x: w, w: x}", "", "'x' takes the gradient of 'w', which must be another input"),
    ("{x: w}", "", "'x' takes grad_w, which AddOneBwdOp does not return"),
    ("{w: x}", "      grad_w: {dtype: \"same_as(grad_y)\"}\n", "AddOneBwdOp returns grad_w too"),
])
def test_same_gradient_errors_are_located(tmp_path: Path, same_gradient: str, more_outputs: str,
                                          message: str) -> None:
    text = _with_bwd_op(f"{{op: AddOneBwdOp, same_gradient: {same_gradient}}}", more_outputs)
    (error,) = errors_of(tmp_path, write(tmp_path, text))
    assert message in str(error)
    assert error.location.line == line_of(text, "backward:")


def test_a_bwd_op_gives_every_floating_input_a_gradient_unless_it_is_constant(tmp_path: Path) -> None:
    """``w`` without grad_w: an error at the Bwd op's outputs, unless ``w`` is marked constant;
    a constant input whose gradient the Bwd op returns is an error at the mark."""
    missing = _with_bwd_op("{op: AddOneBwdOp}")
    (error,) = errors_of(tmp_path, write(tmp_path, missing))
    assert "AddOneBwdOp returns no gradient of the floating-point input 'w'" in str(error)
    assert "AddOneBwdOp.signature.outputs" in str(error)
    constant = missing.replace('w: {dtype: "same_as(x)", shape: [N]}', 'w: {dtype: "same_as(x)", shape: [N], constant: true}')
    fwd, _ = load_files([write(tmp_path, constant)], root=tmp_path).ops
    assert [t.name for t in fwd.inputs if t.constant] == ["w"]
    both = _with_bwd_op("{op: AddOneBwdOp}", "      grad_w: {dtype: \"same_as(grad_y)\"}\n").replace(
        'w: {dtype: "same_as(x)", shape: [N]}', 'w: {dtype: "same_as(x)", shape: [N], constant: true}')
    (error,) = errors_of(tmp_path, write(tmp_path, both))
    assert "'w' is constant, but AddOneBwdOp returns its gradient" in str(error)
    assert "AddOneFwdOp.signature.inputs.w.constant" in str(error)


def _with_formulas(text: str) -> str:
    return GOOD.replace("  backward: reference\n", text)


def test_gradient_formulas_load_in_input_order(tmp_path: Path) -> None:
    (op,) = load_files([write(tmp_path, _with_formulas(
        "  backward:\n    saves: [w]\n    gradients:\n      w: \"grad_y.sum_to_size(w.shape) * dim\"\n"
        "      x: \"unreduce(grad_y, x.shape, None, True) * w\"\n"))], root=tmp_path).ops
    assert op.backward is None and not op.backward_by_reference and op.differentiable
    assert op.formula_backward.saves == ("w",)
    assert [name for name, _ in op.formula_backward.gradients] == ["x", "w"]


@pytest.mark.parametrize("backward, message", [
    ('{gradients: {x: "grad_y * z", w: "grad_y"}, saves: [w]}', "reads unknown name 'z'"),
    ('{gradients: {x: "grad_y * x", w: "grad_y"}}', "reads the values of 'x', which the backward does not save"),
    ('{gradients: {x: "grad_y"}}', "no gradient formula for the floating-point input 'w'"),
    ('{gradients: {x: "grad_y", w: "grad_y", v: "grad_y"}}', "a gradient formula for 'v', which is no input"),
    ('{gradients: {x: "grad_y", w: "(lambda t: t)(grad_y)"}}', "`Lambda` is not allowed"),
    ('{gradients: {x: "grad_y +", w: "grad_y"}}', "is not a Python expression"),
    ('{gradients: {x: "grad_y", w: "grad_y"}, saves: [q]}', "saves 'q', which is no input or output"),
])
def test_gradient_formula_errors_are_located(tmp_path: Path, backward: str, message: str) -> None:
    text = _with_formulas(f"  backward: {backward}\n")
    (error,) = errors_of(tmp_path, write(tmp_path, text))
    assert message in str(error)
    assert error.location.line == line_of(text, "backward:")


def test_formula_helpers_are_the_helper_module_s_functions() -> None:
    from codegen.model import FORMULA_HELPERS
    from tileops.ops import gradient_formulas

    assert FORMULA_HELPERS == set(gradient_formulas.__all__) - {"ShapeOf"}


def test_real_manifest_loads_and_every_file_declares_the_schema() -> None:
    manifest = load_manifest()
    assert {"RMSNormFwdOp", "CumsumFwdOp"} <= set(manifest.by_name())
    for file in manifest.files:
        assert (Path(__file__).parent.parent / file).read_text().startswith(SCHEMA_COMMENT)


def test_schema_describes_every_field() -> None:
    import json

    schema = json.loads((Path(__file__).parent.parent / "manifest" / "schema.json").read_text())

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.get("properties", {}).items():
                assert "description" in value, f"{path}.{key} has no description"
            if node.get("type") == "object" and "properties" in node:
                assert node.get("additionalProperties") is False or "$ref" in str(node.get("additionalProperties")), path
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}[{index}]")

    walk(schema, "schema")
    assert re.search("2020-12", schema["$schema"])


def test_the_schema_names_exactly_the_param_types_ops_check() -> None:
    import json

    from tileops._params import PARAM_TYPES

    schema = json.loads((Path(__file__).parent.parent / "manifest" / "schema.json").read_text())
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "Optional[Sequence[int]]" in node.get("enum", ()):
                found.append(node["enum"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert found and all(sorted(enum) == sorted(PARAM_TYPES) for enum in found)
