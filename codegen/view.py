"""What the slot templates print, computed from one ``OpSpec``.

Templates stay declarative: every piece of Python they emit (signatures, rule
checks, shape expressions) is prepared here from the model and the shape-rule
renderer, so the same tree feeds generated code, the interpreter and messages.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from tileops._params import annotation as param_annotation

from . import rules
from .model import FORMULA_HELPERS, OpSpec, ParamSpec, TensorSpec, snake_case

__all__ = ["OpView", "FunctionView", "forward_naming", "shapes_naming"]

_TORCH_DTYPE = {name: f"torch.{name}" for name in (
    "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")}


# Manifest param types in the custom-op schema language.
_SCHEMA_TYPES = {
    "int": "int", "float": "float", "bool": "bool", "str": "str", "Optional[int]": "int?",
    "Optional[float]": "float?", "Optional[str]": "str?", "Sequence[int]": "int[1]",
    "Optional[Sequence[int]]": "int[1]?", "Optional[dtype]": "ScalarType?",
}


def _helper(name: str) -> str:
    # Builtins are called directly; the rest come from the shared helper module.
    return name if name in ("len", "min", "max") else f"rules.{name}"


def forward_naming(op: OpSpec) -> rules.Naming:
    """Names as ``forward`` sees them: tensors are arguments, the rest attributes."""
    tensors = set(op.input_names)
    return rules.Naming(
        name=lambda n: f"{n}.shape" if n in tensors else f"self.{n}",
        tensor_attr=lambda t, a: f"{t}.{a}",
        helper=_helper,
    )


def shapes_naming(op: OpSpec, local_names: Sequence[str] = ()) -> rules.Naming:
    """Names as shape-level methods see them: ``<tensor>_shape`` tuples."""
    tensors = set(op.input_names)
    local = set(local_names)

    def name(n: str) -> str:
        if n in tensors:
            return f"{n}_shape"
        return n if n in local else f"self.{n}"

    return rules.Naming(
        name=name,
        tensor_attr=lambda t, a: f"len({t}_shape)" if a == "ndim" else f"{t}_shape",
        helper=_helper,
    )


@dataclass(frozen=True)
class RuleCheck:
    condition: str
    text: str  # the rule as the manifest's language writes it, as a string literal
    guard: Optional[str]  # an optional tensor that must be present for the rule to apply
    values: str  # a dict literal of the params and static dims the rule reads, for its error
    why: str  # the manifest's words on what the rule asks, as a string literal ("" where none)


def _string_literal(text: str) -> str:
    """``text`` as a double-quoted Python string literal, as the generated code writes strings
    (a JSON string is one, escapes included)."""
    return json.dumps(text, ensure_ascii=False)


def _bounds_doc(param: ParamSpec) -> str:
    """The docstring's words on a param's bounds (empty where it has none)."""
    if param.minimum is not None and param.maximum is not None:
        return f" From {param.minimum!r} to {param.maximum!r}."
    if param.minimum is not None:
        return f" At least {param.minimum!r}."
    if param.maximum is not None:
        return f" At most {param.maximum!r}."
    return ""


def tensors_annotation(count: int) -> str:
    """The annotation of ``count`` returned tensors."""
    if count == 1:
        return "torch.Tensor"
    return "Tuple[" + ", ".join("torch.Tensor" for _ in range(count)) + "]"


class OpView:
    """Template-facing view of one op."""

    def __init__(self, op: OpSpec) -> None:
        self.op = op
        self.name = op.name
        self._fwd = forward_naming(op)

    # ---- S1 / S7 -------------------------------------------------------------------
    @property
    def module_summary(self) -> str:
        kind = "forward" if self.op.direction == "Fwd" else "backward"
        ref = f", matching {self.op.ref_api}" if self.op.ref_api else ""
        return f"{self.op.base_name} {kind} operator{ref}."

    @property
    def class_summary(self) -> str:
        text = self.op.summary.rstrip(".")
        return f"{self.op.base_name} {'forward' if self.op.direction == 'Fwd' else 'backward'}: {text}."

    @property
    def arg_docs(self) -> List[Tuple[str, str]]:
        docs = []
        for dim in self.op.static_dims:
            docs.append((dim.name, f"Size committed at construction: {dim.text}."))
        dtypes = ", ".join(self.op.resolved_dtype_names(self.op.primary_input.name))
        docs.append(("dtype", f"Dtype of {self.op.primary_input.name} ({dtypes})."))
        for p in self.op.params:
            default = f" Default: {repr(p.default)}." if p.has_default else ""
            choices = f" One of {list(p.choices)}." if p.choices else ""
            docs.append((p.name, f"{p.description or p.type}{choices}{_bounds_doc(p)}{default}".strip()))
        docs.append(("kernel_map", "Overrides of entries of default_kernel_map."))
        docs.append(("tune", "Autotune kernel configs on first use instead of using heuristics."))
        return docs

    @property
    def input_docs(self) -> List[Tuple[str, str]]:
        return [(t.name, f"{t.dtype.text()}{', optional' if t.optional else ''}. {t.description}".strip())
                for t in self.op.inputs]

    # ---- S3 / S4 -------------------------------------------------------------------
    @property
    def kernel_imports(self) -> List[str]:
        pairs = sorted({(k.module, k.class_name) for k in self.op.kernels})
        return [f"from {module} import {cls}" for module, cls in pairs]

    @property
    def base_import(self) -> str:
        if self.op.op_base == "Op":
            return "from ..op_base import Op"
        return f"from .base import {self.op.op_base}"

    # ---- S12 / S13 -----------------------------------------------------------------
    @property
    def init_params(self) -> List[str]:
        out = [f"{d.name}: int" for d in self.op.static_dims]
        out.append("dtype: torch.dtype")
        for p in self.op.params:
            default = f" = {repr(p.default)}" if p.has_default else ""
            out.append(f"{p.name}: {param_annotation(p.type)}{default}")
        out.append("kernel_map: Optional[Dict[str, Type[Kernel]]] = None")
        out.append("tune: bool = False")
        return out

    @property
    def init_assignments(self) -> List[str]:
        names = list(self.op.static_dim_names) + ["dtype"] + list(self.op.param_names) + ["tune"]
        return [f"self.{n} = {n}" for n in names]

    @property
    def dtype_tuple(self) -> str:
        return self._dtype_tuple(self.op.resolved_dtype_names(self.op.primary_input.name))

    @property
    def static_dim_sources(self) -> str:
        """The static dims and the sizes they stand for as a dict literal (``Op._check_static_dims``)."""
        return "{" + ", ".join(f'"{d.name}": "{d.text}"' for d in self.op.static_dims) + "}" if self.op.static_dims else ""

    @property
    def param_types(self) -> str:
        """The params' manifest types as a dict literal (``Op._check_params``)."""
        return "{" + ", ".join(f'"{p.name}": "{p.type}"' for p in self.op.params) + "}" if self.op.params else ""

    @property
    def param_choices(self) -> List[Tuple[str, str]]:
        return [(p.name, repr(tuple(p.choices))) for p in self.op.params if p.choices]

    @property
    def param_bounds(self) -> List[Tuple[str, str, str]]:
        """(name, minimum, maximum) of the bounded params, as Python literals (``Op._check_bounds``)."""
        return [(p.name, repr(p.minimum), repr(p.maximum)) for p in self.op.params
                if p.minimum is not None or p.maximum is not None]

    # ---- S14 -----------------------------------------------------------------------
    @property
    def kernel_map_literal(self) -> str:
        return "{" + ", ".join(f'"{k.key}": {k.class_name}' for k in self.op.kernels) + "}"

    # ---- S15 / S16 -----------------------------------------------------------------
    @property
    def forward_params(self) -> List[str]:
        out = []
        inputs = self.op.inputs
        for index, t in enumerate(inputs):
            trailing_optional = all(u.optional for u in inputs[index:])
            if t.optional:
                out.append(f"{t.name}: Optional[torch.Tensor]" + (" = None" if trailing_optional else ""))
            else:
                out.append(f"{t.name}: torch.Tensor")
        return out

    @property
    def forward_return(self) -> str:
        return tensors_annotation(len(self.op.outputs))

    @property
    def input_args(self) -> str:
        return ", ".join(self.op.input_names)

    @property
    def require_tensors_call(self) -> str:
        """``Op._require_tensors`` on the inputs: run when a dtype or shape read failed, to say
        which input is no tensor."""
        named = ", ".join(f'"{n}": {n}' for n in self.op.input_names)
        optional = [t.name for t in self.op.inputs if t.optional]
        extra = f", optional={self.tuple_literal(tuple(optional))}" if optional else ""
        return f"_require_tensors({{{named}}}{extra})"

    @property
    def tensor_kwargs(self) -> str:
        return ", ".join(f"{n}={n}" for n in self.op.input_names)

    @property
    def shape_key(self) -> str:
        """The expression of the inputs' shapes that ``_check_inputs`` remembers passing sets by."""
        shapes = [f"None if {t.name} is None else {t.name}.shape" if t.optional else f"{t.name}.shape"
                  for t in self.op.inputs]
        return shapes[0] if len(shapes) == 1 else "(" + ", ".join(shapes) + ")"

    @property
    def rule_checks(self) -> List[RuleCheck]:
        optional = {t.name for t in self.op.inputs if t.optional}
        checks = []
        for rule in self.op.shape_rules:
            used = rules.tensors_in(rule.expr, frozenset(self.op.input_names)) & optional
            guard = " and ".join(f"{t} is not None" for t in sorted(used)) or None
            checks.append(RuleCheck(rules.render(rule.expr, self._fwd), _string_literal(rules.to_source(rule.expr)),
                                    guard, self._rule_values(rule.expr),
                                    _string_literal(rule.why) if rule.why else ""))
        return checks

    def _rule_values(self, expr: rules.Expr) -> str:
        """The params and static dims ``expr`` reads, as a dict literal of their values on the op,
        so a violation can show them beside the shapes."""
        own = set(self.op.param_names) | set(self.op.static_dim_names)
        read = [n for n in sorted(rules.names_in(expr)) if n in own]
        return "{" + ", ".join(f'"{n}": {rules.render(rules.Name(n), self._fwd)}' for n in read) + "}"

    @property
    def static_dim_checks(self) -> List[Tuple[str, str, str, Optional[str]]]:
        """(name, source text, python expression of the input's size, guard)."""
        out = []
        for dim in self.op.static_dims:
            axis = rules.render(dim.axis, self._fwd)
            tensor = self.op.tensor(dim.tensor)
            guard = f"{dim.tensor} is not None" if tensor.optional else None
            out.append((dim.name, dim.text, f"rules.axis_size({dim.tensor}.shape, {axis})", guard))
        return out

    @property
    def reference_expr(self) -> str:
        return self._method_expr(self.op.reference)

    def _method_expr(self, text: str, helpers: Tuple[str, ...] = (), helper_module: str = "") -> str:
        """A manifest expression as a method of the op reads it: params and static dims as
        ``self.<name>``, helpers as ``<helper_module>.<name>``."""
        tree = ast.parse(text, mode="eval")
        owners = {**{n: "self" for n in (*self.op.param_names, *self.op.static_dim_names)},
                  **{n: helper_module for n in helpers}}

        class ToAttributes(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.AST:
                if node.id in owners:
                    owner = ast.Name(owners[node.id], ast.Load())
                    return ast.copy_location(ast.Attribute(owner, node.id, ast.Load()), node)
                return node

        return ast.unparse(ToAttributes().visit(tree))

    # ---- gradient formulas ---------------------------------------------------------------
    @property
    def formula_params(self) -> List[str]:
        """``_formula_gradients``'s arguments after ``needs``: every input (a tensor if saved, else
        its ``ShapeOf``), the saved outputs, then the output gradients."""
        formulas = self.op.formula_backward
        assert formulas is not None
        saved_outputs = [n for n in self.op.output_names if n in formulas.saves]
        return ([f"{n}: Any" for n in self.op.input_names] + [f"{n}: torch.Tensor" for n in saved_outputs]
                + [f"grad_{n}: torch.Tensor" for n in self.op.output_names])

    @property
    def gradient_exprs(self) -> List[str]:
        """One expression per input: its formula when ``needs`` asks for it, else None."""
        formulas = self.op.formula_backward
        assert formulas is not None
        by_input = dict(formulas.gradients)
        out = []
        for index, name in enumerate(self.op.input_names):
            if name in by_input:
                formula = self._method_expr(by_input[name], tuple(sorted(FORMULA_HELPERS)), "formulas")
                out.append(f"{formula} if needs[{index}] else None")
            else:
                out.append("None")
        return out

    # ---- S17 -----------------------------------------------------------------------
    @property
    def shape_params(self) -> List[str]:
        out = []
        for t in self.op.inputs:
            annotation = "Optional[Tuple[int, ...]]" if t.optional else "Tuple[int, ...]"
            out.append(f"{t.name}_shape: {annotation}")
        return out

    @property
    def output_shapes(self) -> List[Tuple[str, str]]:
        naming = shapes_naming(self.op)
        by_output = {r.output: r for r in self.op.output_rules}
        return [(t.name, f"tuple({rules.render(by_output[t.name].shape, naming)})") for t in self.op.outputs]

    # ---- S18 -----------------------------------------------------------------------
    @property
    def dtype_checks(self) -> List[Tuple[str, str, str, Optional[str]]]:
        """(tensor, python condition that is True when the dtype is wrong, expected text, guard)."""
        out = []
        for t in self.op.inputs:
            guard = f"{t.name} is not None" if t.optional else None
            if t.dtype.same_as is not None:
                out.append((t.name, f"{t.name}.dtype != {t.dtype.same_as}.dtype",
                            f"{t.dtype.same_as}'s dtype (same_as({t.dtype.same_as}))", guard))
            elif len(t.dtype.names) == 1:
                out.append((t.name, f"{t.name}.dtype != {_TORCH_DTYPE[t.dtype.names[0]]}",
                            t.dtype.names[0], guard))
            else:
                out.append((t.name, f"{t.name}.dtype not in {self._dtype_tuple(t.dtype.names)}",
                            "one of " + ", ".join(t.dtype.names), guard))
        return out

    @property
    def combo_check(self) -> Optional[Tuple[str, str, str]]:
        """(python tuple of dtypes, set of allowed rows, description) when combos are declared."""
        if not self.op.dtype_combos:
            return None
        names = sorted({name for row in self.op.dtype_combos for name, _ in row})
        rows = []
        for row in self.op.dtype_combos:
            values = dict(row)
            rows.append("(" + ", ".join(_TORCH_DTYPE[values[n]] for n in names) + ("," if len(names) == 1 else "") + ")")
        actual = "(" + ", ".join(f"{n}.dtype" for n in names) + ("," if len(names) == 1 else "") + ")"
        described = "; ".join(", ".join(f"{n}={dict(row)[n]}" for n in names) for row in self.op.dtype_combos)
        return actual, "{" + ", ".join(rows) + "}", described

    @property
    def dtype_param_checks(self) -> List[Tuple[str, str]]:
        """(param, python tuple of the dtypes it may name) for each output's ``dtype_param``: those
        the input that the functional form's ``dtype`` keyword casts takes (a Bwd op: its
        primary input's, the dtypes of the forward's input)."""
        cast = next((t for t in self.op.inputs if t.cast_by_dtype), self.op.primary_input)
        names = self.op.resolved_dtype_names(cast.name)
        return [(t.dtype_param, self._dtype_tuple(names)) for t in self.op.outputs if t.dtype_param is not None]

    @staticmethod
    def _dtype_tuple(names: Sequence[str]) -> str:
        return "(" + ", ".join(_TORCH_DTYPE[n] for n in names) + ("," if len(names) == 1 else "") + ")"

    # ---- S19 -----------------------------------------------------------------------
    @property
    def roofline_lines(self) -> List[str]:
        roof = self.op.roofline
        local = [name for name, _, _ in roof.vars] + ["elem_bytes", "out_elem_bytes"]
        naming = shapes_naming(self.op, local)
        lines = ["elem_bytes = self.dtype.itemsize"]
        texts = [text for _, _, text in roof.vars] + [roof.flops_text, roof.bytes_text]
        if any(re.search(r"\bout_elem_bytes\b", text) for text in texts):
            lines.append(f"out_elem_bytes = {self.out_elem_bytes}")
        for name, expr, _ in roof.vars:
            lines.append(f"{name} = {rules.render(expr, naming)}")
        lines.append(f"flops = {rules.render(roof.flops, naming)}")
        lines.append(f"moved = {rules.render(roof.bytes, naming)}")
        return lines

    @property
    def out_elem_bytes(self) -> str:
        """The roofline's ``out_elem_bytes``: the itemsize of an output whose dtype a param gives
        (that dtype where given), else ``elem_bytes``."""
        param = next(iter(self.op.dtype_params), None)
        return "elem_bytes" if param is None else f"(self.{param} or self.dtype).itemsize"

    # ---- S21 -----------------------------------------------------------------------
    @property
    def static_axes_items(self) -> List[str]:
        naming = shapes_naming(self.op)
        items = []
        for dim in self.op.static_dims:
            index = self.op.input_index(dim.tensor)
            literal = dim.axis_literal
            if literal is not None and literal >= 0:
                axis = str(literal)
            else:
                # A 0-d input counts as one axis, as its static dim does (``axis_size``).
                axis = f"{rules.render(dim.axis, naming)} % max(len({dim.tensor}_shape), 1)"
            items.append(f"({index}, {axis})")
        return items

    # ---- torch integration (checks, library and registration sections) ---------------
    @property
    def library_name(self) -> str:
        return snake_case(self.op.stem)

    @property
    def library_call_args(self) -> str:
        return ", ".join(list(self.op.input_names) + [f"self.{p}" for p in self.op.param_names]
                         + ["self._graph_handle if handle is None else handle"])

    @property
    def instance_args_without_handle(self) -> str:
        return ", ".join(list(self.op.input_names) + list(self.op.param_names))

    @property
    def library_schema(self) -> str:
        """The custom op's schema: tensors, params, then the instance handle."""
        args = [f"{'Tensor?' if t.optional else 'Tensor'} {t.name}" for t in self.op.inputs]
        args += [f"{_SCHEMA_TYPES[p.type]} {p.name}" for p in self.op.params]
        args.append("int handle")
        returns = "Tensor" if len(self.op.outputs) == 1 else "(" + ", ".join("Tensor" for _ in self.op.outputs) + ")"
        return f"({', '.join(args)}) -> {returns}"

    @staticmethod
    def tuple_literal(names: Sequence[str]) -> str:
        return "(" + ", ".join(f'"{n}"' for n in names) + ("," if len(names) == 1 else "") + ")"

    @property
    def shared_config(self) -> str:
        """Keyword arguments that build the op for given inputs and params (static dims from shapes).

        A dim that names no axis of its input gives the static dim 0, a size the op accepts, so
        that the call's shape rule, not the static dim, says what is wrong."""
        local = rules.Naming(name=lambda n: f"{n}.shape" if n in self.op.input_names else n,
                             tensor_attr=lambda t, a: f"{t}.{a}", helper=_helper)
        items = [f"{d.name}=int(rules.axis_size({d.tensor}.shape, {rules.render(d.axis, local)}, missing=0))"
                 for d in self.op.static_dims]
        items.append(f"dtype={self.op.primary_input.name}.dtype")
        items += [f"{p}={p}" for p in self.op.param_names]
        return ", ".join(items)

    @property
    def fake_outputs(self) -> List[str]:
        """Expressions of empty outputs with the inferred shapes, dtypes and device."""
        device_of = self.op.primary_input.name
        out = []
        for t in self.op.outputs:
            out.append(f'{device_of}.new_empty(shapes["{t.name}"], dtype={self._dtype_expr(t.name)})')
        return out

    def _dtype_expr(self, tensor: str) -> str:
        spec = self.op.tensor(tensor)
        if spec.dtype_param is not None:
            return f"self.{spec.dtype_param} or {self._followed_dtype_expr(tensor)}"
        return self._followed_dtype_expr(tensor)

    def _followed_dtype_expr(self, tensor: str) -> str:
        spec = self.op.tensor(tensor)
        seen = {tensor}
        while spec.dtype.same_as is not None and spec.name not in self.op.input_names:
            if spec.dtype.same_as in seen:
                break
            seen.add(spec.dtype.same_as)
            spec = self.op.tensor(spec.dtype.same_as)
        if spec.name in self.op.input_names:
            return f"{spec.name}.dtype"
        if len(spec.dtype.names) == 1:
            return _TORCH_DTYPE[spec.dtype.names[0]]
        return f"{self.op.primary_input.name}.dtype"

    @property
    def shape_args(self) -> str:
        return ", ".join(f"None if {t.name} is None else tuple({t.name}.shape)" if t.optional
                         else f"tuple({t.name}.shape)" for t in self.op.inputs)

    @property
    def constant_inputs(self) -> str:
        """``((position, name), ...)`` of the inputs the op does not differentiate, or ``""``."""
        constants = tuple((index, t.name) for index, t in enumerate(self.op.inputs) if t.constant)
        return repr(constants) if constants else ""

    @property
    def typing_imports(self) -> str:
        """The ``typing`` names the op file uses: ``Sequence`` and ``Union`` only for a param
        annotated with them."""
        names = ["Dict", "Optional", "Tuple", "Type"]
        if self.op.backward_by_formulas:
            names.append("Any")
        annotations = " ".join(param_annotation(p.type) for p in self.op.params)
        names += [name for name in ("Sequence", "Union") if name in annotations]
        return ", ".join(sorted(names))

    @property
    def same_gradient_literal(self) -> str:
        """The Bwd wiring's ``same_gradient`` pairs as a tuple literal."""
        assert self.op.backward is not None
        pairs = [self.tuple_literal(pair) for pair in self.op.backward.same_gradient]
        return "(" + ", ".join(pairs) + ("," if len(pairs) == 1 else "") + ")"

    @property
    def backward_construction(self) -> str:
        link = self.op.backward
        assert link is not None
        items = [f"{d}=self.{d}" for d in link.bwd_static_dims] + [f"dtype={self._backward_dtype()}"]
        # A Bwd op's out_dtype is the gradient's: this op's input dtype, where its output has another.
        items += [f"{p}=self.dtype if self.{p} is not None else None" if p == "out_dtype" else f"{p}=self.{p}"
                  for p in link.bwd_params]
        items += ["tune=self.tune"]
        return f"{link.op}({', '.join(items)})"

    def _backward_dtype(self) -> str:
        """The Bwd op's dtype: its primary input's, a gradient or saved value of an output whose
        dtype a param gives, or else this op's."""
        primary = self.op.backward.bwd_primary
        output = primary[len("grad_"):] if primary.startswith("grad_") else primary
        if output in self.op.output_names and self.op.tensor(output).dtype_param is not None:
            return f"self.{self.op.tensor(output).dtype_param} or self.dtype"
        return "self.dtype"

    @property
    def workload_literals(self) -> List[Tuple[str, str]]:
        """(label, dict literal) per manifest workload: input shapes, first dtype, and the
        constructor arguments (static dims interpreted from the shapes, then params)."""
        out = []
        for workload in self.op.workloads:
            shapes = dict(workload.shapes)
            values = {p.name: p.default for p in self.op.params if p.has_default}
            values.update(dict(workload.params))
            ctor = {}
            for dim in self.op.static_dims:
                ctor[dim.name] = shapes[dim.tensor][rules.evaluate(dim.axis, shapes, values)]
            ctor.update(dict(workload.params))
            shape_list = ", ".join(repr(tuple(shapes[t.name])) if t.name in shapes else "None"
                                   for t in self.op.inputs)
            literal = (f'{{"shapes": [{shape_list}], "dtype": "{workload.dtypes[0]}", '
                       f'"params": {ctor!r}}}')
            out.append((workload.label, literal))
        return out

    # ---- S20 -----------------------------------------------------------------------
    @property
    def registration_import(self) -> str:
        return f"from .{self.op.module} import {self.op.name}"


class FunctionView:
    """Template-facing view of one function of ``tileops.functional``."""

    def __init__(self, op: OpSpec) -> None:
        self.op = op
        self.view = OpView(op)
        self.name = snake_case(op.base_name)

    @property
    def params(self) -> List[str]:
        out = [p.split(" = ")[0] + (" = None" if "Optional" in p else "") for p in self.view.forward_params]
        for p in self.op.params:
            if p.name in self.dtype_params:  # given by the keyword ``dtype``
                continue
            default = f" = {repr(p.default)}" if p.has_default else ""
            out.append(f"{p.name}: {param_annotation(p.type)}{default}")
        if self.cast_input is not None:
            out += ["*", "dtype: Optional[torch.dtype] = None"]
        return out

    @property
    def cast_input(self) -> Optional[TensorSpec]:
        """The input that the function's ``dtype`` keyword casts before the op runs (None: no keyword)."""
        return next((t for t in self.op.inputs if t.cast_by_dtype), None)

    @property
    def casts_first(self) -> bool:
        """Whether the function casts its input to ``dtype`` before the op runs (an op with no
        ``dtype_param`` to take it)."""
        return self.cast_input is not None and not self.dtype_params

    @property
    def dtype_params(self) -> Tuple[str, ...]:
        """The op's params that the keyword ``dtype`` gives (outputs' ``dtype_param``): the op then
        computes the cast itself, and the function casts nothing first."""
        return self.op.dtype_params

    def _argument(self, name: str) -> str:
        return "dtype" if name in self.dtype_params else name

    @property
    def instance_args(self) -> str:
        return ", ".join(list(self.op.input_names) + [self._argument(n) for n in self.op.param_names])

    @property
    def cast_dtypes(self) -> str:
        """The dtypes ``dtype`` may name: those the cast input takes, as a tuple of ``torch`` dtypes."""
        names = [f"torch.{name}" for name in self.cast_input.dtype.names]
        return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"

    @property
    def dtype_note(self) -> str:
        if self.cast_input is None:
            return ""
        counterpart = f"``{self.op.ref_api}``" if self.op.ref_api else "PyTorch's counterpart"
        if self.dtype_params:
            return (f" ``dtype``: the result's dtype, computed as if {self.cast_input.name} were cast to it first, "
                    f"as {counterpart} does (a half-precision {self.cast_input.name} to float32 in one pass).")
        return f" ``dtype``: cast {self.cast_input.name} to it first, as {counterpart} does (the result then has it)."

    @property
    def library_args(self) -> str:
        return ", ".join([self.instance_args, "SHARED_INSTANCE"])

    @property
    def returned(self) -> List[int]:
        """Positions of the outputs the function returns: all but those saved for the backward."""
        return [index for index, t in enumerate(self.op.outputs) if not t.saved]

    @property
    def return_type(self) -> str:
        return tensors_annotation(len(self.returned))

    @property
    def selection(self) -> str:
        """The expression of the returned outputs, given what the op returned as ``result``."""
        if len(self.returned) == len(self.op.outputs):
            return "result"
        picked = [f"result[{index}]" for index in self.returned]
        return picked[0] if len(picked) == 1 else "(" + ", ".join(picked) + ")"

    @property
    def saved_note(self) -> str:
        saved = [t.name for t in self.op.outputs if t.saved]
        if not saved:
            return ""
        verb = "comes" if len(saved) == 1 else "come"
        return (f" Returns {', '.join(self.op.outputs[i].name for i in self.returned)};"
                f" {' and '.join(saved)} (kept for the backward) {verb} from ``{self.op.name}`` itself.")
