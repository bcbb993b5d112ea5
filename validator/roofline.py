"""Roofline parity: ``eval_roofline`` equals the manifest formulas on every accepted L2 case.

The formulas are interpreted with the case's shapes, params and static dims,
``elem_bytes`` set to the itemsize of the case's dtype (cases cycle through
the op's dtypes) and the roofline ``vars`` evaluated in manifest order.  The
result must be a pair of Python ``int`` (not float, bool or a tensor).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Dict, List, Tuple

from codegen.model import OpSpec

from .cases import ACCEPT, Case, describe, expected_roofline
from .context import Context, missing_method, missing_method_finding, short_error, torch_dtype, where
from .findings import Finding
from .shapes import construct, judged_cases

__all__ = ["check", "LEVEL"]

LEVEL = "roofline"


def _ratio(got: Any, expected: Any) -> str:
    try:
        if expected and got:
            ratio = Fraction(got) / Fraction(expected)
            return f" (off by a factor of {ratio})"
    except (TypeError, ValueError):
        pass
    return ""


def check_op(op: OpSpec, cls: type, cases: List[Case]) -> List[Finding]:
    groups: Dict[Tuple[str, str], List[Any]] = {}

    def add(rule: str, kind: str, message: str) -> None:
        groups.setdefault((rule, kind), [0, message])[0] += 1

    for case in cases:
        try:
            expected = expected_roofline(op, case, torch_dtype(case.dtype).itemsize)
        except Exception as exc:
            add("roofline", "unevaluable", f"the formulas do not evaluate for {describe(op, case)}: "
                                           f"{type(exc).__name__}: {exc}")
            continue
        try:
            got = construct(cls, case).eval_roofline(*case.shapes)
        except Exception as exc:
            add("eval_roofline", "raised", f"eval_roofline raised {short_error(exc)} for {describe(op, case)}")
            continue
        if not (isinstance(got, tuple) and len(got) == 2):
            add("eval_roofline", "shape", f"eval_roofline returned {got!r}; expected a (flops, bytes) tuple")
            continue
        for name, value, wanted, text in (("flops", got[0], expected[0], op.roofline.flops_text),
                                          ("bytes", got[1], expected[1], op.roofline.bytes_text)):
            rule = f"roofline.{name}"
            if type(value) is not int:
                add(rule, "type", f"eval_roofline gives {name} as {type(value).__name__} {value!r}; "
                                  f"expected a Python int")
            elif value != wanted:
                add(rule, "value", f"eval_roofline gives {name}={value}; `{text}` gives {wanted}"
                                   f"{_ratio(value, wanted)} for {describe(op, case)}")
    location = where(op.roofline.location)
    return [Finding(LEVEL, op.name, rule, location, message + (f" ({count} of {len(cases)} cases)" if count > 1 else ""))
            for (rule, _), (count, message) in groups.items()]


def check(ctx: Context) -> Tuple[List[Finding], str]:
    findings: List[Finding] = []
    ops = evaluated = 0
    for op in ctx.selected:
        cls, problems = ctx.class_or_finding(op, LEVEL)
        findings += problems
        if cls is None:
            continue
        if missing_method(cls, "eval_roofline"):
            findings.append(missing_method_finding(op, LEVEL, "eval_roofline", "eval_roofline"))
            continue
        cases = [case for case, verdict in judged_cases(ctx, op) if verdict.kind == ACCEPT]
        ops += 1
        evaluated += len(cases)
        findings += check_op(op, cls, cases)
    return findings, f"{ops} ops, {evaluated} cases"
