"""Roofline parity: ``eval_roofline`` equals the manifest formulas on every accepted L2 case.

The formulas are interpreted with the case's shapes, params and static dims,
``elem_bytes`` set to the itemsize of the case's dtype (cases cycle through
the op's dtypes) and the roofline ``vars`` evaluated in manifest order.  The
result must be a pair of Python ``int`` (not float, bool or a tensor).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable, List, Optional, Tuple

from codegen.model import OpSpec

from .cases import ACCEPT, Case, describe, expected_roofline
from .context import Context, missing_method, missing_method_finding, short_error, torch_dtype, where
from .findings import WARNING, Finding, Tally, counted
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


def _attempt(compute: Callable[[], Any]) -> Tuple[Any, Optional[Exception]]:
    try:
        return compute(), None
    except Exception as exc:  # reported by the caller, with the case
        return None, exc


def _formulas_fail(op: OpSpec, case: Case, tally: Tally, location: str, formula_error: Exception,
                   got: Any, op_error: Optional[Exception]) -> None:
    """The manifest formulas do not evaluate for an accepted case (e.g. ``// N`` with N = 0).

    When ``eval_roofline`` fails the same way, the two agree and the formula
    is what needs a guard: a warning.  Anything else is a disagreement.
    """
    failure = f"{type(formula_error).__name__}: {formula_error}"
    if op_error is not None and type(op_error) is type(formula_error):
        tally.add("roofline", location, "undefined",
                  f"the formulas raise {failure} for {describe(op, case)}, which the shape rules accept, "
                  f"and so does eval_roofline; guard them (e.g. `... if N else 0`)", WARNING)
    elif op_error is not None:
        tally.add("eval_roofline", location, "raised", f"eval_roofline raised {short_error(op_error)} where the "
                                                       f"formulas raise {failure}, for {describe(op, case)}")
    else:
        tally.add("eval_roofline", location, "defined", f"eval_roofline returns {got!r} where the formulas raise "
                                                        f"{failure}, for {describe(op, case)}")


def check_op(op: OpSpec, cls: type, cases: List[Case]) -> List[Finding]:
    tally = Tally(LEVEL, op.name)
    location = where(op.roofline.location)
    for case in cases:
        expected, formula_error = _attempt(lambda: expected_roofline(op, case, torch_dtype(case.dtype).itemsize))
        got, op_error = _attempt(lambda: construct(cls, case).eval_roofline(*case.shapes))
        if formula_error is not None:
            _formulas_fail(op, case, tally, location, formula_error, got, op_error)
            continue
        if op_error is not None:
            tally.add("eval_roofline", location, "raised",
                      f"eval_roofline raised {short_error(op_error)} for {describe(op, case)}")
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
