"""L1: each op's ``__init__`` and ``forward`` match the manifest exactly; Fwd/Bwd pairs agree.

The expected signatures follow slot rules S12 and S15: ``__init__`` is
keyword-only and takes the static dims (no defaults), ``dtype``, the params
in manifest order with their defaults, then ``kernel_map`` and ``tune``;
``forward`` takes the inputs, positionally, in manifest order.  Extra
parameters (``**kwargs`` included) are errors: an unknown keyword must fail
loudly, never pass silently.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch

from codegen.errors import Location
from codegen.model import Manifest, OpSpec
from tileops._params import annotation

from .cases import primary_dtypes
from .context import Context, where
from .findings import Finding, counted

__all__ = ["check", "LEVEL"]

LEVEL = "L1"

POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY
EMPTY = inspect.Parameter.empty


@dataclass(frozen=True)
class Expected:
    """One parameter as the manifest says it must be."""

    name: str
    kind: Any
    default: Any
    annotation: str  # as written in source; evaluated for comparison
    rule: str
    location: Location


def _annotation(text: str) -> Any:
    """The typing object a generated annotation written as ``text`` evaluates to."""
    from tileops.kernels.kernel_base import Kernel

    fixed = {
        "int": int, "float": float, "bool": bool, "str": str,
        "Optional[int]": Optional[int], "Optional[float]": Optional[float], "Optional[str]": Optional[str],
        "Union[int, Sequence[int]]": Union[int, Sequence[int]],
        "Optional[Union[int, Sequence[int]]]": Optional[Union[int, Sequence[int]]],
        "torch.dtype": torch.dtype, "Optional[torch.dtype]": Optional[torch.dtype], "torch.Tensor": torch.Tensor, "Optional[torch.Tensor]": Optional[torch.Tensor],
        "Optional[Dict[str, Type[Kernel]]]": Optional[Dict[str, Type[Kernel]]],
    }
    if text in fixed:
        return fixed[text]
    if text.startswith("Tuple["):  # the return of a multi-output forward
        return Tuple[tuple(torch.Tensor for _ in range(text.count("torch.Tensor")))]
    raise KeyError(f"no annotation known for {text!r}")


def expected_init(op: OpSpec) -> List[Expected]:
    out = [Expected(d.name, KEYWORD_ONLY, EMPTY, "int", f"static_dims.{d.name}", d.location) for d in op.static_dims]
    primary = op.primary_input
    out.append(Expected("dtype", KEYWORD_ONLY, EMPTY, "torch.dtype", "dtype", primary.location))
    for p in op.params:
        out.append(Expected(p.name, KEYWORD_ONLY, p.default if p.has_default else EMPTY, annotation(p.type),
                            f"signature.params.{p.name}", p.location))
    out.append(Expected("kernel_map", KEYWORD_ONLY, None, "Optional[Dict[str, Type[Kernel]]]", "kernel_map",
                        op.location.child("kernel_map")))
    out.append(Expected("tune", KEYWORD_ONLY, False, "bool", "tune", op.location))
    return out


def expected_forward(op: OpSpec) -> List[Expected]:
    out = []
    for index, t in enumerate(op.inputs):
        trailing_optional = all(u.optional for u in op.inputs[index:])
        default = None if t.optional and trailing_optional else EMPTY
        annotation = "Optional[torch.Tensor]" if t.optional else "torch.Tensor"
        out.append(Expected(t.name, POSITIONAL, default, annotation, f"signature.inputs.{t.name}", t.location))
    return out


def expected_return(op: OpSpec) -> str:
    if len(op.outputs) == 1:
        return "torch.Tensor"
    return "Tuple[" + ", ".join("torch.Tensor" for _ in op.outputs) + "]"


def _same_value(a: Any, b: Any) -> bool:
    """Equal and of the same type (``True`` is not ``1``, ``1`` is not ``1.0``)."""
    return type(a) is type(b) and a == b


def _same_annotation(actual: Any, expected_text: str) -> bool:
    if isinstance(actual, str):  # postponed annotations: compare the source text
        return actual.replace(" ", "") == expected_text.replace(" ", "")
    try:
        return actual == _annotation(expected_text)
    except Exception:
        return False


def _show(annotation: Any) -> str:
    if annotation is EMPTY:
        return "no annotation"
    return inspect.formatannotation(annotation)


def compare_parameters(op: OpSpec, method: str, signature: inspect.Signature,
                       expected: Sequence[Expected]) -> List[Finding]:
    """Findings for every way ``signature`` (self excluded) departs from ``expected``."""
    findings: List[Finding] = []
    actual = list(signature.parameters.values())[1:]
    by_name = {p.name: p for p in actual}
    wanted = {e.name: e for e in expected}

    def add(rule: str, location: Location, message: str) -> None:
        findings.append(Finding(LEVEL, op.name, rule, where(location), f"{op.name}.{method}: {message}"))

    for p in actual:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            stars = "*" if p.kind is inspect.Parameter.VAR_POSITIONAL else "**"
            add(f"{method} extra", op.location, f"takes {stars}{p.name}: undeclared arguments would pass silently")
        elif p.name not in wanted:
            add(f"{method} extra", op.location, f"takes `{p.name}`, which the manifest does not declare")
    for e in expected:
        if e.name not in by_name:
            add(e.rule, e.location, f"is missing `{e.name}`")
    common_actual = [p.name for p in actual if p.name in wanted]
    common_expected = [e.name for e in expected if e.name in by_name]
    if common_actual != common_expected:
        add(f"{method} order", op.location, f"takes ({', '.join(common_actual)}); "
                                             f"the manifest order is ({', '.join(common_expected)})")
    wrong_kind = [p.name for p in actual if p.name in wanted and p.kind is not wanted[p.name].kind]
    if wrong_kind:
        kind = "keyword-only (after `*`)" if wanted[wrong_kind[0]].kind is KEYWORD_ONLY else "positional"
        add(f"{method} kinds", op.location, f"({', '.join(wrong_kind)}) must be {kind}")
    for e in expected:
        p = by_name.get(e.name)
        if p is None:
            continue
        if e.default is EMPTY and p.default is not EMPTY:
            add(e.rule, e.location, f"`{e.name}` has a default ({p.default!r}); the manifest gives none")
        elif e.default is not EMPTY and p.default is EMPTY:
            add(e.rule, e.location, f"`{e.name}` has no default; the manifest's is {e.default!r}")
        elif e.default is not EMPTY and not _same_value(p.default, e.default):
            add(e.rule, e.location, f"`{e.name}` defaults to {p.default!r}; the manifest's default is {e.default!r}")
        if not _same_annotation(p.annotation, e.annotation):
            add(e.rule, e.location, f"`{e.name}` is annotated {_show(p.annotation)}; expected {e.annotation}")
    return findings


def check_class(op: OpSpec, cls: type) -> List[Finding]:
    from tileops.ops.op_base import Op

    findings = []
    if cls.__name__ != op.name:
        findings.append(Finding(LEVEL, op.name, "class name", where(op.location),
                                f"the class is named {cls.__name__}; the manifest key is {op.name}"))
    bases = [base.__name__ for base in inspect.getmro(cls)]
    if not issubclass(cls, Op) or op.op_base not in bases:
        findings.append(Finding(LEVEL, op.name, "op_base", where(op.location.child("op_base")),
                                f"{op.name} must derive from {op.op_base} (an L1 Op); its bases are {bases[1:]}"))
    findings += compare_parameters(op, "__init__", inspect.signature(cls.__init__), expected_init(op))
    forward = inspect.signature(cls.forward)
    findings += compare_parameters(op, "forward", forward, expected_forward(op))
    if not _same_annotation(forward.return_annotation, expected_return(op)):
        findings.append(Finding(LEVEL, op.name, "forward return", where(op.location.child("signature")),
                                f"{op.name}.forward returns {_show(forward.return_annotation)}; "
                                f"expected {expected_return(op)}"))
    return findings


def _init_defaults(cls: type) -> Dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not EMPTY}


def check_pair(ctx: Context, fwd: OpSpec, manifest: Manifest) -> List[Finding]:
    """A Fwd op and the Bwd op its ``backward`` names: the Bwd exists, same dtypes, same defaults."""
    assert fwd.backward is not None
    findings: List[Finding] = []
    rule = "backward.op"
    at = where(fwd.backward.location)
    name = fwd.backward.op
    if not name.endswith("BwdOp"):
        findings.append(Finding(LEVEL, fwd.name, rule, at, f"backward op {name} is not a Bwd op"))
    try:
        bwd = manifest.op(name)
    except KeyError:
        return findings + [Finding(LEVEL, fwd.name, rule, at, f"backward op {name} is not in the manifest")]
    bwd_cls = ctx.op_class(bwd)
    if bwd_cls is None:
        findings.append(Finding(LEVEL, fwd.name, rule, at, f"backward op {name} does not import"))
    fwd_dtypes, bwd_dtypes = set(primary_dtypes(fwd)), set(primary_dtypes(bwd))
    if fwd_dtypes != bwd_dtypes:
        findings.append(Finding(LEVEL, fwd.name, "backward dtype", where(bwd.primary_input.location),
                                f"{name} takes dtypes {sorted(bwd_dtypes)}; {fwd.name} takes {sorted(fwd_dtypes)}"))
    bwd_params = {p.name: p for p in bwd.params}
    disagreeing = set()
    for p in fwd.params:
        other = bwd_params.get(p.name)
        if other is None:
            continue
        if p.has_default != other.has_default or (p.has_default and not _same_value(p.default, other.default)):
            disagreeing.add(p.name)
            mine = repr(p.default) if p.has_default else "no default"
            theirs = repr(other.default) if other.has_default else "no default"
            findings.append(Finding(LEVEL, fwd.name, f"backward params.{p.name}", where(other.location),
                                    f"{name}.{p.name} has {theirs}; {fwd.name}.{p.name} has {mine}"))
    fwd_cls = ctx.op_class(fwd)
    if fwd_cls is not None and bwd_cls is not None:
        fwd_defaults, bwd_defaults = _init_defaults(fwd_cls), _init_defaults(bwd_cls)
        for param in sorted((set(fwd_defaults) & set(bwd_defaults)) - disagreeing - {"kernel_map", "tune"}):
            if not _same_value(fwd_defaults[param], bwd_defaults[param]):
                findings.append(Finding(LEVEL, fwd.name, f"backward params.{param}", at,
                                        f"{name}.__init__ defaults {param}={bwd_defaults[param]!r}; "
                                        f"{fwd.name}.__init__ defaults it to {fwd_defaults[param]!r}"))
    return findings


def check(ctx: Context) -> Tuple[List[Finding], str]:
    findings: List[Finding] = []
    checked = 0
    pairs = 0
    for op in ctx.selected:
        cls, problems = ctx.class_or_finding(op, LEVEL)
        findings += problems
        if cls is not None:
            checked += 1
            findings += check_class(op, cls)
        if op.backward is not None:
            pairs += 1
            findings += check_pair(ctx, op, ctx.manifest)
    return findings, f"{counted(checked, 'op')}, {counted(pairs, 'Fwd/Bwd pair')}"
