"""L3: ``_validate_dtypes`` accepts exactly the declared dtypes, and ``__init__`` its ``dtype``.

Every input is probed with every torch dtype a tensor can have in practice
(floating incl. float64 and the fp8/fp4 formats, signed and unsigned
integers, bool, complex): all combinations when the op has at most two inputs,
otherwise every allowed row with one input changed at a time.  Each row is a
real call with small meta tensors.  A row is allowed when each input's dtype
is in its union (or equals its ``same_as`` target) and, when declared, the
row is one of ``dtype_combos``.  The constructor's ``dtype`` must accept
exactly the primary input's union.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch

from codegen.errors import Location
from codegen.model import OpSpec

from .cases import ACCEPT, Case
from .context import Context, missing_method, missing_method_finding, short_error, where
from .findings import Finding, counted
from .shapes import construct, judged_cases

__all__ = ["check", "PROBE_DTYPES", "LEVEL"]

LEVEL = "L3"

_PROBE_NAMES = (
    "float16", "bfloat16", "float32", "float64",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "bool", "complex32", "complex64", "complex128",
)
# Every dtype this torch build has, of those above.
PROBE_DTYPES: Dict[str, torch.dtype] = {n: getattr(torch, n) for n in _PROBE_NAMES if hasattr(torch, n)}
FULL_PRODUCT_LIMIT = 4096
Row = Tuple[Tuple[str, Optional[str]], ...]  # (input, dtype name or None for a left-out optional)


def forbidding_rule(op: OpSpec, row: Dict[str, Optional[str]]) -> Optional[Tuple[str, Location]]:
    """The manifest entry that forbids ``row``, or None when the row is allowed."""
    for tensor in op.inputs:
        dtype = row[tensor.name]
        if dtype is None:
            continue
        spec = tensor.dtype
        if spec.same_as is not None:
            target = row.get(spec.same_as)
            if target is not None and dtype != target:
                return f"{tensor.name}.dtype same_as({spec.same_as})", tensor.location
        elif dtype not in spec.names:
            return f"{tensor.name}.dtype {spec.text()}", tensor.location
    if op.dtype_combos:
        names = sorted({name for combo in op.dtype_combos for name, _ in combo})
        if all(row.get(n) is not None for n in names):
            projected = tuple((n, row[n]) for n in names)
            if projected not in {tuple(sorted(combo)) for combo in op.dtype_combos}:
                return "dtype_combos", op.location.child("dtype_combos")
    return None


def _allowed_names(op: OpSpec, tensor: str) -> Tuple[str, ...]:
    return op.resolved_dtype_names(tensor)


def allowed_rows(op: OpSpec) -> List[Row]:
    """Every row the manifest allows with all inputs present."""
    candidates = [_allowed_names(op, t.name) for t in op.inputs]
    rows = []
    for values in itertools.product(*candidates):
        row = dict(zip(op.input_names, values))
        if forbidding_rule(op, row) is None:
            rows.append(tuple(row.items()))
    return rows


def probe_rows(op: OpSpec) -> List[Row]:
    """Allowed rows, every row one input away from them, optional inputs left out, and (when
    small enough) every combination of probe dtypes."""
    names = list(PROBE_DTYPES)
    base = allowed_rows(op)
    rows: Dict[Row, None] = dict.fromkeys(base)
    if len(names) ** len(op.inputs) <= FULL_PRODUCT_LIMIT:
        rows.update(dict.fromkeys(tuple(zip(op.input_names, v))
                                  for v in itertools.product(names, repeat=len(op.inputs))))
    for row in base:
        for index in range(len(op.inputs)):
            for dtype in names:
                changed = list(row)
                changed[index] = (changed[index][0], dtype)
                rows[tuple(changed)] = None
            if op.inputs[index].optional:
                left_out = list(row)
                left_out[index] = (left_out[index][0], None)
                rows[tuple(left_out)] = None
    return list(rows)


def _probe_case(ctx: Context, op: OpSpec) -> Optional[Case]:
    """An accepted L2 case: shapes for the tensors and static dims for the constructor."""
    for case, verdict in judged_cases(ctx, op):
        if verdict.kind == ACCEPT:
            return case
    return None


def _tensors(op: OpSpec, case: Case, row: Row) -> List[Optional[torch.Tensor]]:
    out = []
    for (name, dtype), shape in zip(row, case.shapes):
        if dtype is None:
            out.append(None)
            continue
        small = tuple(min(size, 2) for size in (shape or ()))
        with warnings.catch_warnings():  # complex32 warns that it is experimental
            warnings.simplefilter("ignore")
            out.append(torch.empty(small, dtype=PROBE_DTYPES[dtype], device="meta"))
    return out


def _show(row: Row) -> str:
    return ", ".join(f"{n}={d}" for n, d in row if d is not None) or "(no tensors)"


class _Groups:
    def __init__(self, op: OpSpec) -> None:
        self.op = op
        self.groups: Dict[Tuple[str, str], List[Any]] = {}

    def add(self, rule: str, location: Location, kind: str, example: str, detail: str) -> None:
        group = self.groups.setdefault((rule, kind), [location, [], detail])
        group[1].append(example)

    def findings(self) -> List[Finding]:
        out = []
        for (rule, kind), (location, examples, detail) in self.groups.items():
            shown = "; ".join(examples[:4]) + (f"; and {len(examples) - 4} more" if len(examples) > 4 else "")
            out.append(Finding(LEVEL, self.op.name, rule, where(location), f"{kind} {shown}{detail}"))
        return out


def check_validate_dtypes(op: OpSpec, instance: Any, case: Case) -> Tuple[List[Finding], int]:
    groups = _Groups(op)
    rows = probe_rows(op)
    for row in rows:
        verdict = forbidding_rule(op, dict(row))
        try:
            instance._validate_dtypes(*_tensors(op, case, row))
        except (ValueError, TypeError) as exc:
            if verdict is None:
                groups.add("_validate_dtypes", op.location.child("signature"), "rejects allowed rows:",
                           f"{_show(row)} ({short_error(exc)})", "")
            continue
        except Exception as exc:
            rule, location = verdict or ("_validate_dtypes", op.location)
            groups.add(rule, location, "raises neither ValueError nor TypeError for", f"{_show(row)} "
                                                                                   f"({short_error(exc)})", "")
            continue
        if verdict is not None:
            rule, location = verdict
            groups.add(rule, location, "accepts", _show(row), f" (the manifest allows {rule.split(' ', 1)[-1]})")
    return groups.findings(), len(rows)


def check_init_dtype(op: OpSpec, cls: type, case: Case) -> List[Finding]:
    """``__init__(dtype=...)`` accepts exactly the primary input's union."""
    allowed = set(op.resolved_dtype_names(op.primary_input.name))
    wrongly_accepted, wrongly_rejected = [], []
    for name, dtype in PROBE_DTYPES.items():
        try:
            construct(cls, case, dtype=dtype)
        except (ValueError, TypeError):
            if name in allowed:
                wrongly_rejected.append(name)
            continue
        if name not in allowed:
            wrongly_accepted.append(name)
    findings = []
    location = where(op.primary_input.location)
    if wrongly_accepted:
        findings.append(Finding(LEVEL, op.name, "__init__ dtype", location,
                                f"{op.name}(dtype=...) accepts {', '.join(wrongly_accepted)}; "
                                f"the manifest allows {', '.join(sorted(allowed))}"))
    if wrongly_rejected:
        findings.append(Finding(LEVEL, op.name, "__init__ dtype", location,
                                f"{op.name}(dtype=...) rejects {', '.join(wrongly_rejected)}, which the manifest allows"))
    return findings


def check(ctx: Context) -> Tuple[List[Finding], str]:
    findings: List[Finding] = []
    ops = calls = 0
    for op in ctx.selected:
        cls, problems = ctx.class_or_finding(op, LEVEL)
        findings += problems
        if cls is None:
            continue
        case = _probe_case(ctx, op)
        if case is None:
            findings.append(Finding(LEVEL, op.name, "shape_rules", where(op.location),
                                    "no generated case satisfies the shape rules, so dtypes cannot be probed"))
            continue
        ops += 1
        findings += check_init_dtype(op, cls, case)
        calls += len(PROBE_DTYPES)
        if missing_method(cls, "_validate_dtypes"):
            findings.append(missing_method_finding(op, LEVEL, "_validate_dtypes", "_validate_dtypes"))
            continue
        try:
            instance = construct(cls, case)
        except Exception as exc:
            findings.append(Finding(LEVEL, op.name, "__init__", where(op.location),
                                    f"{op.name}(...) raised {short_error(exc)}"))
            continue
        op_findings, rows = check_validate_dtypes(op, instance, case)
        findings += op_findings
        calls += rows
    return findings, f"{counted(ops, 'op')}, {counted(calls, 'call')} over {len(PROBE_DTYPES)} dtypes"
