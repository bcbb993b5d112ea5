"""Load manifests: YAML -> schema validation -> cross-field checks -> typed model.

Every defect becomes a ``ManifestError`` located at ``file:line op.key.path``.
The loader reports one message per defective entry (the most specific schema
error, or the first cross-field problem) and builds nothing when any exists.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import jsonschema
import yaml

from tileops import _params as param_types

from . import rules
from .errors import Location, ManifestError, ManifestErrors, RuleSyntaxError
from .model import (
    FLOATING_DTYPES, FORMULA_HELPERS, SHAPE_ONLY_ATTRIBUTES, Backward, DtypeSpec, FormulaBackward,
    KernelRef, Manifest, OpSpec, OutputRule, ParamSpec, ReferenceBackward,
    Roofline, ShapeRule, StaticDim, TensorSpec, Workload, snake_case,
)

__all__ = ["load_manifest", "load_files", "SCHEMA_PATH", "MANIFEST_DIR", "SCHEMA_COMMENT"]

ROOT = Path(__file__).resolve().parent.parent
MANIFEST_DIR = ROOT / "manifest"
SCHEMA_PATH = MANIFEST_DIR / "schema.json"
SCHEMA_COMMENT = "# yaml-language-server: $schema=schema.json"

# Names an op may not use for params or static dims: they are taken by the generated code.
RESERVED_NAMES = frozenset({"self", "dtype", "kernel_map", "tune", "torch", "math", "rules",
                            "elem_bytes", "out_elem_bytes", "Kernel", "Op"})
# ``backward: reference``: differentiate the op through its reference (see ``OpSpec.backward_by_reference``).
REFERENCE_BACKWARD = "reference"
# Param types a manifest may bound with ``minimum`` and ``maximum``.
NUMBER_PARAM_TYPES = ("int", "float", "Optional[int]", "Optional[float]")
REFERENCE_GLOBALS = frozenset({"torch", "math"})
_STATIC_DIM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\.shape\[\s*(-?\d+|[A-Za-z_][A-Za-z0-9_]*)\s*\]\s*$")

Path_ = Tuple[Any, ...]


# ---- YAML with line numbers ----------------------------------------------------------------
def _compose(text: str, file: str) -> Tuple[Any, Dict[Path_, int]]:
    """Parse YAML into plain data plus a map from key path to 1-based line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestErrors([ManifestError(Location(file, line), f"YAML syntax error: {problem}")])
    lines: Dict[Path_, int] = {(): 1}
    if node is None:
        return {}, lines
    constructor = yaml.SafeLoader("")

    def build(n: yaml.Node, path: Path_) -> Any:
        if isinstance(n, yaml.MappingNode):
            out: Dict[Any, Any] = {}
            for key_node, value_node in n.value:
                key = constructor.construct_object(key_node, deep=True)
                if key in out:
                    raise ManifestErrors([ManifestError(
                        Location(file, key_node.start_mark.line + 1, _dotted(path + (key,))),
                        f"duplicate key {key!r}")])
                lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = build(value_node, path + (key,))
            return out
        if isinstance(n, yaml.SequenceNode):
            items = []
            for index, item in enumerate(n.value):
                lines[path + (index,)] = item.start_mark.line + 1
                items.append(build(item, path + (index,)))
            return items
        return constructor.construct_object(n, deep=True)

    return build(node, ()), lines


def _dotted(path: Sequence[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Locator:
    """Turns key paths of one file into ``Location`` objects."""

    def __init__(self, file: str, lines: Dict[Path_, int]) -> None:
        self.file = file
        self.lines = lines

    def __call__(self, *path: Any) -> Location:
        probe = tuple(path)
        while probe not in self.lines and probe:
            probe = probe[:-1]
        return Location(self.file, self.lines.get(probe, 1), _dotted(path))


# ---- schema --------------------------------------------------------------------------------
def _schema_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    return jsonschema.Draft202012Validator(schema)


def _schema_errors(data: Any, locate: _Locator) -> List[ManifestError]:
    if not isinstance(data, dict):
        return [ManifestError(locate(), "a manifest is a mapping of op names to entries")]
    validator = _schema_validator()
    by_entry: Dict[Any, List[jsonschema.ValidationError]] = {}
    for error in validator.iter_errors(data):
        entry = error.absolute_path[0] if error.absolute_path else None
        if _is_name_error(error):
            entry = error.instance
        by_entry.setdefault(entry, []).append(error)
    found = []
    for entry, errors in by_entry.items():
        best = jsonschema.exceptions.best_match(errors)
        found.append(_explain(best, locate))
    return found


def _is_name_error(error: jsonschema.ValidationError) -> bool:
    """True when the error is about a mapping key (a ``propertyNames`` rule), not a value."""
    return "propertyNames" in error.absolute_schema_path


def _explain(error: jsonschema.ValidationError, locate: _Locator) -> ManifestError:
    path = tuple(error.absolute_path)
    if _is_name_error(error):
        key = error.instance
        return ManifestError(locate(*path, key), f"name {key!r} does not match {error.validator_value!r}")
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        if extra:
            expected = ", ".join(sorted(allowed))
            return ManifestError(locate(*path, extra[0]),
                                 f"unknown key {extra[0]!r}; expected one of: {expected}")
    if error.validator == "required":
        return ManifestError(locate(*path), f"missing required key: {error.message}")
    if error.validator == "type":
        return ManifestError(locate(*path), f"expected {error.validator_value}, got {error.instance!r}")
    if error.validator == "enum":
        return ManifestError(locate(*path), f"expected one of {error.validator_value}, got {error.instance!r}")
    if error.validator == "pattern":
        return ManifestError(locate(*path), f"{error.instance!r} does not match {error.validator_value!r}")
    return ManifestError(locate(*path), error.message)


# ---- cross-field checks and model building ---------------------------------------------------
class _EntryBuilder:
    """Builds one ``OpSpec`` from a schema-valid entry, raising located errors."""

    def __init__(self, name: str, entry: Dict[str, Any], locate: _Locator) -> None:
        self.name = name
        self.entry = entry
        self.locate = locate

    def at(self, *path: Any) -> Location:
        return self.locate(self.name, *path)

    def fail(self, message: str, *path: Any) -> ManifestError:
        return ManifestError(self.at(*path), message)

    def build(self) -> OpSpec:
        e = self.entry
        family = e["family"]
        sig = e["signature"]
        inputs = self._tensors(sig["inputs"], "inputs")
        outputs = self._tensors(sig["outputs"], "outputs")
        self._check_tensor_names(inputs, outputs)
        params = self._params(sig.get("params") or {})
        self._check_dtype_params(inputs, outputs, params)
        self._resolve_dtypes(inputs + outputs)
        static_dims = self._static_dims(e.get("static_dims") or {}, inputs, params)
        self._check_name_clashes(inputs, outputs, params, static_dims)
        tensor_names = frozenset(t.name for t in inputs)
        value_names = frozenset(p.name for p in params) | frozenset(d.name for d in static_dims)
        shape_rules, output_rules = self._shape_rules(
            e.get("shape_rules") or [], inputs, outputs, tensor_names, value_names)
        stem = self.name[: -len("Op")]
        op = OpSpec(
            name=self.name,
            family=family,
            status=e["status"],
            summary=e["summary"],
            ref_api=e.get("ref_api", ""),
            op_base=e.get("op_base", "Op"),
            module=e.get("module", snake_case(stem)),
            inputs=inputs,
            outputs=outputs,
            params=params,
            static_dims=static_dims,
            shape_rules=shape_rules,
            output_rules=output_rules,
            dtype_combos=self._dtype_combos(e.get("dtype_combos") or [], inputs),
            reference=self._reference(e["reference"], tensor_names, value_names),
            roofline=self._roofline(e["roofline"], tensor_names, value_names),
            kernels=self._kernels(e["kernel_map"], family),
            backward=self._backward(e.get("backward"), inputs, outputs),
            workloads=self._workloads(e.get("workloads") or [], inputs, params),
            location=self.at(),
            reference_backward=self._reference_backward(e.get("backward")),
            formula_backward=self._formula_backward(e.get("backward"), inputs, outputs, value_names),
        )
        self._check_differentiable(op)
        self._check_formulas_cover_inputs(op)
        return op

    def _check_formulas_cover_inputs(self, op: OpSpec) -> None:
        """Gradient formulas give every floating-point input its gradient, unless it is constant."""
        if op.formula_backward is None:
            return
        covered = {name for name, _ in op.formula_backward.gradients}
        for name in op.differentiated_inputs:
            if name not in covered:
                raise self.fail(f"no gradient formula for the floating-point input {name!r}", "backward", "gradients")

    def _check_differentiable(self, op: OpSpec) -> None:
        """A Fwd op with a floating-point output says how it is differentiated."""
        if op.direction != "Fwd" or op.differentiable:
            return
        if any(op.may_be_floating(output.name) for output in op.outputs):
            raise self.fail("a Fwd op with a floating-point output names its backward: `backward: {op: "
                            "...BwdOp, saves: [...]}`, `backward: {saves: [...], gradients: {<input>: "
                            "<formula>}}`, or `backward: reference` to differentiate its reference with "
                            "PyTorch's autograd")

    def _tensors(self, spec: Dict[str, Any], group: str) -> Tuple[TensorSpec, ...]:
        out = []
        for name, t in spec.items():
            dtype_text = t["dtype"].strip()
            match = re.fullmatch(r"same_as\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)", dtype_text)
            dtype = (DtypeSpec(same_as=match.group(1)) if match
                     else DtypeSpec(names=tuple(n.strip() for n in dtype_text.split("|"))))
            if len(set(dtype.names)) != len(dtype.names):
                raise self.fail(f"dtype union {dtype_text!r} repeats a dtype", "signature", group, name, "dtype")
            if t.get("optional") and group == "outputs":
                raise self.fail("outputs cannot be optional", "signature", group, name, "optional")
            if t.get("saved") and group == "inputs":
                raise self.fail("only outputs can be saved for the backward", "signature", group, name, "saved")
            if t.get("constant") and group == "outputs":
                raise self.fail("only inputs can be constant", "signature", group, name, "constant")
            if t.get("cast_by_dtype"):
                self._check_cast_by_dtype(dtype, group, name)
            shape = tuple(t["shape"]) if "shape" in t else None
            out.append(TensorSpec(name, dtype, shape, bool(t.get("optional", False)),
                                  t.get("description", ""), self.at("signature", group, name),
                                  saved=bool(t.get("saved", False)), constant=bool(t.get("constant", False)),
                                  cast_by_dtype=bool(t.get("cast_by_dtype", False)),
                                  dtype_param=t.get("dtype_param")))
        cast = [t.name for t in out if t.cast_by_dtype]
        if len(cast) > 1:
            raise self.fail(f"only one input can be cast by the functional form's dtype, got {cast}",
                            "signature", group, cast[1], "cast_by_dtype")
        if group == "outputs" and out and all(t.saved for t in out):
            raise self.fail("every output is saved: the functional form would return nothing",
                            "signature", group, out[0].name, "saved")
        return tuple(out)

    def _check_cast_by_dtype(self, dtype: DtypeSpec, group: str, name: str) -> None:
        """The functional form's ``dtype`` casts an input to one of the floating-point dtypes it takes."""
        if group == "outputs":
            raise self.fail("only inputs can be cast by the functional form's dtype", "signature", group, name,
                            "cast_by_dtype")
        if dtype.same_as or not set(dtype.names) <= FLOATING_DTYPES:
            raise self.fail(f"an input cast by the functional form's dtype takes floating-point dtypes named in "
                            f"a union, got {dtype.text()!r}", "signature", group, name, "cast_by_dtype")

    def _check_dtype_params(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                            params: Sequence[ParamSpec]) -> None:
        """An output's ``dtype_param`` is an ``Optional[dtype]`` param, defaulting to None, that the
        functional form's ``dtype`` keyword gives: the op then needs an input that keyword casts."""
        by_name = {p.name: p for p in params}
        for group, tensors in (("inputs", inputs), ("outputs", outputs)):
            for t in tensors:
                if t.dtype_param is None:
                    continue
                if group == "inputs":
                    raise self.fail("only outputs take their dtype from a param", "signature", group, t.name,
                                    "dtype_param")
                # The schema allows one name, out_dtype: the op base reads it (``Op._kernel_dtypes``).
                param = by_name.get(t.dtype_param)
                if param is None or param.type != "Optional[dtype]" or param.default is not None:
                    raise self.fail(f"dtype_param {t.dtype_param!r} must be out_dtype, a param of type "
                                    f"Optional[dtype] with default null", "signature", group, t.name, "dtype_param")
                # A Bwd op's is its gradient's dtype, which its Fwd op gives (it has no functional form).
                if self.name.endswith("FwdOp") and not any(i.cast_by_dtype for i in inputs):
                    raise self.fail("an output with a dtype_param needs an input with cast_by_dtype: the "
                                    "functional form's dtype keyword is the param", "signature", group, t.name,
                                    "dtype_param")
        typed = [p.name for p in params if p.type == "Optional[dtype]"]
        named = {t.dtype_param for t in outputs}
        if any(name not in named for name in typed):
            unnamed = next(name for name in typed if name not in named)
            raise self.fail(f"param {unnamed!r} of type Optional[dtype] is no output's dtype_param",
                            "signature", "params", unnamed)

    def _check_tensor_names(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
        seen = {t.name for t in inputs}
        for t in outputs:
            if t.name in seen:
                raise self.fail(f"output {t.name!r} has the name of an input", "signature", "outputs", t.name)

    def _resolve_dtypes(self, tensors: Sequence[TensorSpec]) -> None:
        by_name = {t.name: t for t in tensors}
        for t in tensors:
            seen = [t.name]
            current = t
            while current.dtype.same_as is not None:
                target = current.dtype.same_as
                if target not in by_name:
                    raise self.fail(f"same_as({target}) names no input or output of {self.name}; "
                                    f"expected one of {sorted(by_name)}",
                                    "signature", _group_of(t, tensors, self.entry), t.name, "dtype")
                if target in seen:
                    raise self.fail(f"same_as cycle: {' -> '.join(seen + [target])}",
                                    "signature", _group_of(t, tensors, self.entry), t.name, "dtype")
                seen.append(target)
                current = by_name[target]

    def _params(self, spec: Dict[str, Any]) -> Tuple[ParamSpec, ...]:
        out = []
        seen_default = False
        for name, p in spec.items():
            has_default = "default" in p
            if seen_default and not has_default:
                raise self.fail("a param without a default follows one with a default; list required "
                                "params first (they become positional arguments of the functional form)",
                                "signature", "params", name)
            seen_default = seen_default or has_default
            default = p.get("default")
            if has_default and not param_types.accepts(p["type"], default):
                raise self.fail(f"default {default!r} is not a {p['type']}", "signature", "params", name, "default")
            if has_default:
                default = param_types.normalized(p["type"], default)
            choices = tuple(p["choices"]) if "choices" in p else None
            if choices is not None and has_default and default not in choices:
                raise self.fail(f"default {default!r} is not one of the choices {list(choices)}",
                                "signature", "params", name, "default")
            minimum, maximum = self._param_bounds(name, p, default if has_default else None)
            out.append(ParamSpec(name, p["type"], has_default, default, choices,
                                 p.get("description", ""), self.at("signature", "params", name), minimum, maximum))
        return tuple(out)

    def _param_bounds(self, name: str, spec: Dict[str, Any],
                      default: Any) -> Tuple[Optional[float], Optional[float]]:
        """A number param's inclusive ``minimum`` and ``maximum`` (None where absent), checked
        against its type and its default."""
        minimum, maximum = spec.get("minimum"), spec.get("maximum")
        for key, bound in (("minimum", minimum), ("maximum", maximum)):
            if bound is None:
                continue
            if spec["type"] not in NUMBER_PARAM_TYPES:
                raise self.fail(f"{key} applies to {' and '.join(NUMBER_PARAM_TYPES)} params, not {spec['type']}",
                                "signature", "params", name, key)
            if spec["type"] in ("int", "Optional[int]") and not isinstance(bound, int):
                raise self.fail(f"{key} of an int param must be an int, got {bound!r}", "signature", "params", name, key)
        if minimum is not None and maximum is not None and minimum > maximum:
            raise self.fail(f"minimum {minimum!r} is above maximum {maximum!r}", "signature", "params", name, "minimum")
        if default is not None and ((minimum is not None and default < minimum)
                                    or (maximum is not None and default > maximum)):
            raise self.fail(f"default {default!r} lies outside [{minimum}, {maximum}]",
                            "signature", "params", name, "default")
        return minimum, maximum

    def _static_dims(self, spec: Dict[str, str], inputs: Sequence[TensorSpec],
                     params: Sequence[ParamSpec]) -> Tuple[StaticDim, ...]:
        out = []
        input_names = {t.name: t for t in inputs}
        int_params = {p.name for p in params if p.type == "int"}
        for name, text in spec.items():
            match = _STATIC_DIM.match(text)
            if not match:
                raise self.fail(f"expected `<input>.shape[<axis>]`, got {text!r}", "static_dims", name)
            tensor, axis_text = match.groups()
            if tensor not in input_names:
                raise self.fail(f"static dim names tensor {tensor!r}, which is not an input "
                                f"(inputs: {sorted(input_names)})", "static_dims", name)
            if re.fullmatch(r"-?\d+", axis_text):
                axis_value = int(axis_text)
                axis: rules.Expr = (rules.Const(axis_value) if axis_value >= 0
                                    else rules.UnaryOp("-", rules.Const(-axis_value)))
                rank = input_names[tensor].shape
                if rank is not None and not -len(rank) <= axis_value < len(rank):
                    raise self.fail(f"axis {axis_value} does not exist on {tensor!r} of rank {len(rank)}",
                                    "static_dims", name)
            elif axis_text in int_params:
                axis = rules.Name(axis_text)
            else:
                raise self.fail(f"axis {axis_text!r} is neither an integer nor an int param "
                                f"(int params: {sorted(int_params)})", "static_dims", name)
            out.append(StaticDim(name, tensor, axis, text.strip(), self.at("static_dims", name)))
        return tuple(out)

    def _check_name_clashes(self, inputs, outputs, params, static_dims) -> None:
        seen: Dict[str, str] = {}
        groups = [("input", inputs, ("signature", "inputs")), ("output", outputs, ("signature", "outputs")),
                  ("param", params, ("signature", "params")), ("static dim", static_dims, ("static_dims",))]
        for kind, items, path in groups:
            for item in items:
                if item.name in RESERVED_NAMES:
                    raise self.fail(f"{kind} name {item.name!r} is reserved by the generated code", *path, item.name)
                if item.name in seen:
                    raise self.fail(f"{kind} {item.name!r} has the name of a {seen[item.name]}", *path, item.name)
                seen[item.name] = kind

    def _shape_rules(self, texts, inputs, outputs, tensors, names):
        preconditions: List[ShapeRule] = list(self._implied_rules(inputs, tensors, names))
        output_rules: List[OutputRule] = []
        output_names = frozenset(t.name for t in outputs)
        for index, item in enumerate(texts):
            where = self.at("shape_rules", index)
            text, why = (item["rule"], item["why"]) if isinstance(item, dict) else (item, "")
            try:
                head = text.split("==")[0].strip() if "==" in text else ""
                if head.endswith(".shape") and head[: -len(".shape")] in output_names:
                    if why:
                        raise RuleSyntaxError("an output's shape rule is never broken by a call; it takes no `why`")
                    output, shape = rules.parse_output_rule(text, output_names, tensors, names)
                    if any(r.output == output for r in output_rules):
                        raise RuleSyntaxError(f"a second rule for the shape of {output!r}")
                    output_rules.append(OutputRule(output, text, shape, where))
                else:
                    self._add_precondition(preconditions, ShapeRule(text, rules.parse_rule(text, tensors, names),
                                                                    where, why=why))
            except RuleSyntaxError as exc:
                raise ManifestError(where, str(exc)) from None
        missing = [t.name for t in outputs if not any(r.output == t.name for r in output_rules)]
        if missing:
            raise self.fail(f"no `{missing[0]}.shape == ...` rule for output {missing[0]!r}", "shape_rules")
        return tuple(preconditions), tuple(output_rules)

    @staticmethod
    def _add_precondition(preconditions: List[ShapeRule], rule: ShapeRule) -> None:
        """Append ``rule``, unless an input's declared shape already implies it: that rule, checked
        first, then carries the written one's ``why``."""
        source = rules.to_source(rule.expr)
        for index, known in enumerate(preconditions):
            if known.implied and rules.to_source(known.expr) == source:
                if rule.why:
                    preconditions[index] = replace(known, why=rule.why)
                return
        preconditions.append(rule)

    def _implied_rules(self, inputs, tensors, names):
        """Rules implied by fixed-rank ``shape`` declarations of inputs."""
        first_seen: Dict[str, str] = {}
        for t in inputs:
            if t.shape is None:
                continue
            where = self.at("signature", "inputs", t.name, "shape")
            texts = [f"{t.name}.ndim == {len(t.shape)}"]
            for axis, dim in enumerate(t.shape):
                if isinstance(dim, int):
                    texts.append(f"{t.name}.shape[{axis}] == {dim}")
                elif dim in names:
                    texts.append(f"{t.name}.shape[{axis}] == {dim}")
                elif dim in first_seen:
                    texts.append(f"{t.name}.shape[{axis}] == {first_seen[dim]}")
                else:
                    first_seen[dim] = f"{t.name}.shape[{axis}]"
            for text in texts:
                yield ShapeRule(text, rules.parse_rule(text, tensors, names), where, implied=True)

    def _dtype_combos(self, combos, inputs):
        by_name = {t.name: t for t in inputs}
        out = []
        for index, row in enumerate(combos):
            for tensor, dtype in row.items():
                if tensor not in by_name:
                    raise self.fail(f"{tensor!r} is not an input", "dtype_combos", index, tensor)
                names = by_name[tensor].dtype.names
                if names and dtype not in names:
                    raise self.fail(f"{dtype} is outside {tensor}'s dtype {by_name[tensor].dtype.text()}",
                                    "dtype_combos", index, tensor)
            out.append(tuple(sorted(row.items())))
        return tuple(out)

    def _expression(self, text, allowed, kind, may_use, *where):
        """The parsed PyTorch expression ``text`` (a reference or a gradient formula): Python syntax,
        only ``allowed`` names, no lambdas or assignments."""
        try:
            tree = ast.parse(str(text).strip(), mode="eval")
        except SyntaxError as exc:
            raise self.fail(f"{kind} is not a Python expression: {exc.msg}", *where) from None
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id not in allowed:
                raise self.fail(f"{kind} reads unknown name {node.id!r}; it may use {may_use}", *where)
            if isinstance(node, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
                raise self.fail(f"`{type(node).__name__}` is not allowed in a {kind}", *where)
        return tree

    def _reference(self, text, tensors, names):
        self._expression(text, tensors | names | REFERENCE_GLOBALS, "reference",
                         "inputs, params, static dims, torch and math", "reference")
        return text.strip()

    def _roofline(self, spec, tensors, names):
        vars_ = []
        known = names | {"elem_bytes", "out_elem_bytes"}
        for var, text in (spec.get("vars") or {}).items():
            if var in known or var in tensors:
                raise self.fail(f"roofline var {var!r} shadows an existing name", "roofline", "vars", var)
            vars_.append((var, self._rule(text, tensors, known, "roofline", "vars", var), text))
            known = known | {var}
        return Roofline(
            vars=tuple(vars_),
            flops=self._rule(spec["flops"], tensors, known, "roofline", "flops"),
            flops_text=spec["flops"],
            bytes=self._rule(spec["bytes"], tensors, known, "roofline", "bytes"),
            bytes_text=spec["bytes"],
            location=self.at("roofline"),
        )

    def _rule(self, text, tensors, names, *path):
        try:
            return rules.parse_rule(str(text), tensors, names)
        except RuleSyntaxError as exc:
            raise self.fail(str(exc), *path) from None

    def _kernels(self, spec, family):
        out = []
        for key, value in spec.items():
            module, _, class_name = value.rpartition(":")
            if not module:
                stem = re.sub(r"(Fwd|Bwd)?Kernel$", "", class_name)
                module = f"{family}.{snake_case(stem)}"
            out.append(KernelRef(key, class_name, f"tileops.kernels.{module}", self.at("kernel_map", key)))
        return tuple(out)

    def _backward(self, spec, inputs, outputs):
        if spec is None:
            return None
        if not self.name.endswith("FwdOp"):
            raise self.fail("only a Fwd op names a backward", "backward")
        if spec == REFERENCE_BACKWARD or "gradients" in spec:
            return None
        return Backward(spec["op"], self._saves(spec, inputs, outputs), self.at("backward"),
                        same_gradient=self._same_gradient(spec.get("same_gradient") or {}, inputs))

    def _saves(self, spec, inputs, outputs):
        """The tensors a backward keeps (``saves``), each an input or output of the op."""
        known = {t.name for t in inputs + outputs}
        for index, name in enumerate(spec.get("saves") or []):
            if name not in known:
                raise self.fail(f"saves {name!r}, which is no input or output (known: {sorted(known)})",
                                "backward", "saves", index)
        return tuple(spec.get("saves") or ())

    def _same_gradient(self, spec, inputs):
        """``{input: other input}``: inputs that take another input's gradient (checked against
        the Bwd op's outputs in ``_resolve_backward``)."""
        names = [t.name for t in inputs]
        for name, source in spec.items():
            where = ("backward", "same_gradient", name)
            for each in (name, source):
                if each not in names:
                    raise self.fail(f"same_gradient names {each!r}, which is no input (inputs: {names})", *where)
            if name == source or source in spec:
                raise self.fail(f"{name!r} takes the gradient of {source!r}, which must be another input "
                                "with a gradient of its own", *where)
        return tuple((name, spec[name]) for name in names if name in spec)

    def _reference_backward(self, spec):
        if self.name.endswith("BwdOp"):
            # A Bwd op's own gradients (a double backward, ``create_graph=True``) come from autograd
            # of its reference, which writes the gradient out in PyTorch.
            return ReferenceBackward(self.at("reference"))
        if spec != REFERENCE_BACKWARD:
            return None
        return ReferenceBackward(self.at("backward"))

    def _formula_backward(self, spec, inputs, outputs, values):
        if not isinstance(spec, dict) or "gradients" not in spec:
            return None
        if len(outputs) != 1:
            raise self.fail("gradient formulas serve ops with one output; name a Bwd op instead", "backward")
        saves = self._saves(spec, inputs, outputs)
        formulas = spec["gradients"]
        for name in formulas:
            if name not in {t.name for t in inputs}:
                raise self.fail(f"a gradient formula for {name!r}, which is no input", "backward", "gradients", name)
        unsaved = {t.name for t in inputs} - set(saves)
        allowed = (values | set(saves) | unsaved | {f"grad_{t.name}" for t in outputs} | REFERENCE_GLOBALS
                   | FORMULA_HELPERS)
        gradients = tuple((t.name, self._formula(formulas[t.name], allowed, unsaved, t.name))
                          for t in inputs if t.name in formulas)
        return FormulaBackward(saves, gradients, self.at("backward"))

    def _formula(self, text, allowed, unsaved, name):
        where = ("backward", "gradients", name)
        tree = self._expression(text, allowed, "gradient formula", "saved tensors, grad_<output>, params, static "
                                f"dims, torch, math and {', '.join(sorted(FORMULA_HELPERS))}", *where)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            parent = parents.get(node)
            if (isinstance(node, ast.Name) and node.id in unsaved
                    and not (isinstance(parent, ast.Attribute) and parent.attr in SHAPE_ONLY_ATTRIBUTES)):
                raise self.fail(f"gradient formula reads the values of {node.id!r}, which the backward does not "
                                f"save (add it to saves, or use only its {', '.join(sorted(SHAPE_ONLY_ATTRIBUTES))})",
                                *where)
        return str(text).strip()

    def _workloads(self, specs, inputs, params):
        out = []
        input_names = {t.name for t in inputs}
        param_names = {p.name for p in params}
        dtype_params = {p.name for p in params if p.type == "Optional[dtype]"}
        labels = set()
        for index, w in enumerate(specs):
            if w["label"] in labels:
                raise self.fail(f"duplicate workload label {w['label']!r}", "workloads", index, "label")
            labels.add(w["label"])
            for tensor in w["shapes"]:
                if tensor not in input_names:
                    raise self.fail(f"{tensor!r} is not an input", "workloads", index, "shapes", tensor)
            for param, value in (w.get("params") or {}).items():
                if param not in param_names:
                    raise self.fail(f"{param!r} is not a param", "workloads", index, "params", param)
                if param in dtype_params and value not in param_types.DTYPE_NAMES:
                    raise self.fail(f"{param} names a dtype: one of {list(param_types.DTYPE_NAMES)}, got {value!r}",
                                    "workloads", index, "params", param)
            out.append(Workload(w["label"], tuple((k, tuple(v)) for k, v in w["shapes"].items()),
                                tuple(w["dtypes"]), tuple((w.get("params") or {}).items()),
                                self.at("workloads", index)))
        return tuple(out)


def _group_of(tensor: TensorSpec, tensors: Sequence[TensorSpec], entry: Dict[str, Any]) -> str:
    return "inputs" if tensor.name in entry["signature"]["inputs"] else "outputs"


# ---- whole-manifest checks -----------------------------------------------------------------
def _resolve_backward(op: OpSpec, bwd: OpSpec) -> OpSpec:
    """Check that ``bwd`` can differentiate ``op`` and record how to call it."""
    link = op.backward
    assert link is not None
    where = link.location
    grads_of_outputs = {f"grad_{name}" for name in op.output_names}
    for name in bwd.input_names:
        if name not in grads_of_outputs and name not in link.saves:
            raise ManifestError(where.child("saves"), f"{bwd.name} takes {name!r}, which is neither "
                                f"grad_<output> ({sorted(grads_of_outputs)}) nor a saved tensor {list(link.saves)}")
    for name in link.saves:
        if name not in bwd.input_names:
            raise ManifestError(where.child("saves"), f"saves {name!r}, which {bwd.name} does not take")
    grads_of_inputs = {f"grad_{name}" for name in op.input_names}
    for name in bwd.output_names:
        if name not in grads_of_inputs:
            raise ManifestError(bwd.location.child("signature.outputs"),
                                f"{name!r} is not grad_<input> of {op.name} ({sorted(grads_of_inputs)})")
    for name, source in link.same_gradient:
        if f"grad_{source}" not in bwd.output_names:
            raise ManifestError(where.child(f"same_gradient.{name}"),
                                f"{name!r} takes grad_{source}, which {bwd.name} does not return")
        if f"grad_{name}" in bwd.output_names:
            raise ManifestError(where.child(f"same_gradient.{name}"),
                                f"{name!r} takes grad_{source}, but {bwd.name} returns grad_{name} too")
    given = {name for name in op.input_names if f"grad_{dict(link.same_gradient).get(name, name)}" in bwd.output_names}
    for tensor in op.inputs:
        if tensor.constant and tensor.name in given:
            raise ManifestError(tensor.location.child("constant"), f"{tensor.name!r} is constant, but "
                                f"{bwd.name} returns its gradient")
    for name in op.differentiated_inputs:
        if name not in given:
            raise ManifestError(bwd.location.child("signature.outputs"), f"{bwd.name} returns no gradient of "
                                f"the floating-point input {name!r}: add grad_{name}, or mark "
                                f"{name!r} `constant: true` if the op does not differentiate it")
    for dim in bwd.static_dim_names:
        if dim not in op.static_dim_names:
            raise ManifestError(bwd.location.child("static_dims"), f"static dim {dim} is not one of {op.name}'s")
    for param in bwd.param_names:
        if param not in op.param_names:
            raise ManifestError(bwd.location.child("signature.params"), f"param {param} is not one of {op.name}'s")
    module = f".{bwd.module}" if bwd.family == op.family else f"{bwd.package}.{bwd.module}"
    resolved = replace(link, bwd_inputs=bwd.input_names, bwd_outputs=bwd.output_names,
                       bwd_import=f"from {module} import {bwd.name}", bwd_primary=bwd.primary_input.name,
                       bwd_static_dims=bwd.static_dim_names, bwd_params=bwd.param_names)
    return replace(op, backward=resolved)


def _check_links(ops: List[OpSpec]) -> List[ManifestError]:
    by_name = {op.name: op for op in ops}
    errors = []
    for index, op in enumerate(ops):
        if op.backward is not None and op.backward.op not in by_name:
            errors.append(ManifestError(op.backward.location.child("op"),
                                        f"backward op {op.backward.op!r} is not in the manifest"))
        elif op.backward is not None:
            try:
                ops[index] = _resolve_backward(op, by_name[op.backward.op])
            except ManifestError as exc:
                errors.append(exc)
        for workload in op.workloads:
            for dtype in workload.dtypes:
                allowed = op.resolved_dtype_names(op.primary_input.name)
                if dtype not in allowed:
                    errors.append(ManifestError(workload.location.child("dtypes"),
                                                f"{dtype} is outside {op.primary_input.name}'s dtypes {list(allowed)}"))
    return errors


def load_files(paths: Iterable[Path], root: Path = ROOT) -> Manifest:
    """Load and check the given manifest files; raise ``ManifestErrors`` on any defect."""
    errors: List[ManifestError] = []
    ops: List[OpSpec] = []
    first_definition: Dict[str, Location] = {}
    files = []
    for path in sorted(paths):
        rel = _relative(path, root)
        files.append(rel)
        text = path.read_text()
        if not text.startswith(SCHEMA_COMMENT):
            errors.append(ManifestError(Location(rel, 1), f"the file must start with `{SCHEMA_COMMENT}`"))
            continue
        try:
            data, lines = _compose(text, rel)
        except ManifestErrors as exc:
            errors.extend(exc.errors)
            continue
        locate = _Locator(rel, lines)
        schema_errors = _schema_errors(data, locate)
        if schema_errors:
            errors.extend(schema_errors)
            continue
        for name, entry in data.items():
            where = locate(name)
            if name in first_definition:
                errors.append(ManifestError(where, f"duplicate op name {name!r}; first defined at "
                                                   f"{first_definition[name]}"))
                continue
            first_definition[name] = Location(where.file, where.line)
            try:
                ops.append(_EntryBuilder(name, entry, locate).build())
            except ManifestError as exc:
                errors.append(exc)
    if not errors:
        errors = _check_links(ops)
    if errors:
        raise ManifestErrors(errors)
    return Manifest(tuple(ops), tuple(files))


def load_manifest(directory: Path = MANIFEST_DIR, root: Path = ROOT) -> Manifest:
    """Load every ``*.yaml`` manifest in ``directory``."""
    return load_files(sorted(Path(directory).glob("*.yaml")), root)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)
