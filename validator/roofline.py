"""Roofline parity: ``eval_roofline`` equals the manifest formulas on every accepted L2 case.

The formulas are interpreted with the case's shapes, params and static dims,
``elem_bytes`` set to the itemsize of the case's dtype (cases cycle through
the op's dtypes) and the roofline ``vars`` evaluated in manifest order.  The
result must be a pair of Python ``int`` (not float, bool or a tensor).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, List, Tuple

from codegen.model import OpSpec

from .cases import ACCEPT, Case, describe, expected_roofline
from .context import Context, missing_method, missing_method_finding, short_error, torch_dtype, where
from .findings import Finding, Tally, counted
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
    tally = Tally(LEVEL, op.name)
    location = where(op.roofline.location)
    for case in cases:
        try:
            expected = expected_roofline(op, case, torch_dtype(case.dtype).itemsize)
        except Exception as exc:
            tally.add("roofline", location, "unevaluable", f"the formulas do not evaluate for {describe(op, case)}: "
                                                           f"{type(exc).__name__}: {exc}")
            continue
        try:
            got = construct(cls, case).eval_roofline(*case.shapes)
        except Exception as exc:
            tally.add("eval_roofline", location, "raised",
                      f"eval_roofline raised {short_error(exc)} for {describe(op, case)}")
            continue
        if not (isinstance(got, tuple) and len(got) == 2):
            tally.add("eval_roofline", location, "shape", f"eval_roofline returned {got!r}; expected (flops, bytes)")
            continue
        for name, value, wanted, text in (("flops", got[0], expected[0], op.roofline.flops_text),
                                          ("bytes", got[1], expected[1], op.roofline.bytes_text)):
            rule = f"roofline.{name}"
            if type(value) is not int:
                tally.add(rule, location, "type", f"eval_roofline gives {name} as {type(value).__name__} "
                                                  f"{value!r}; expected a Python int")
            elif value != wanted:
                tally.add(rule, location, "value", f"eval_roofline gives {name}={value}; `{text}` gives {wanted}"
                                                   f"{_ratio(value, wanted)} for {describe(op, case)}")
    return tally.findings(len(cases))


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
    return findings, f"{counted(ops, 'op')}, {counted(evaluated, 'case')}"
