"""L2: ``_infer_output_shapes`` and ``forward`` agree with the interpreted shape rules.

For every generated case the manifest is interpreted (``cases.expect``) and
the op is constructed with the static dims the case commits.  Accepted cases
must give the interpreted output shapes from ``_infer_output_shapes`` and
from ``forward`` on meta tensors (which run the reference path without
storage) and must not raise.  Rejected cases must make ``forward`` raise a
``ValueError`` that quotes the first rule the manifest says is violated, or
names the mismatching static dim.  Disagreements are grouped per rule, with
a count and the first counter-example.  Building the op must refuse each param
value the manifest's ``choices`` or ``minimum``/``maximum`` exclude, and a
negative static dim (a ``ValueError`` naming the param or dim), and accept the
bounds themselves.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, List, Optional, Tuple

import torch

from codegen import rules
from codegen.model import OpSpec, ParamSpec

from .cases import ACCEPT, RULE, UNEVALUABLE, Case, Expectation, describe, expect, generate_cases, meta_inputs
from .context import Context, missing_method, missing_method_finding, short_error, torch_dtype, where
from .findings import Finding, Tally, counted

__all__ = ["check", "construct", "judged_cases", "LEVEL", "MIN_CASES"]

LEVEL = "L2"
MIN_CASES = 200


def judged_cases(ctx: Context, op: OpSpec) -> List[Tuple[Case, Expectation]]:
    """The op's generated cases with the manifest's verdict on each (computed once per run)."""
    return ctx.cases(op, lambda spec: [(case, expect(spec, case)) for case in generate_cases(spec, MIN_CASES)])


def construct(cls: type, case: Case, dtype: Optional[torch.dtype] = None) -> Any:
    """The op for a case: its committed static dims, its params and its dtype (or ``dtype``)."""
    return cls(**dict(case.committed), dtype=dtype or torch_dtype(case.dtype), **dict(case.params))


def _is_shape(value: Any) -> bool:
    return type(value) is tuple and all(type(v) is int for v in value)


def _check_inferred(op: OpSpec, instance: Any, case: Case, verdict: Expectation, tally: Tally) -> None:
    rules_by_output = {r.output: r for r in op.output_rules}
    try:
        inferred = instance._infer_output_shapes(*case.shapes)
    except Exception as exc:
        tally.add("_infer_output_shapes", where(op.location), "raised",
                  f"_infer_output_shapes raised {short_error(exc)} for {describe(op, case)}")
        return
    if not isinstance(inferred, dict) or set(inferred) != set(verdict.outputs):
        keys = sorted(inferred) if isinstance(inferred, dict) else type(inferred).__name__
        tally.add("_infer_output_shapes", where(op.location), "keys",
                  f"_infer_output_shapes returned {keys}; expected the outputs {sorted(verdict.outputs)}")
        return
    for output, shape in verdict.outputs.items():
        got = inferred[output]
        rule = rules_by_output[output]
        if got != shape:
            tally.add(rule.text, where(rule.location), "infer",
                      f"_infer_output_shapes gives {output}={got}; the rule gives {shape} for {describe(op, case)}")
        elif not _is_shape(got):
            tally.add(rule.text, where(rule.location), "type",
                      f"_infer_output_shapes gives {output} as {type(got).__name__} "
                      f"{[type(v).__name__ for v in got]}; expected a tuple of int")


def _forward_outputs(result: Any) -> List[Any]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _check_forward_accepts(op: OpSpec, instance: Any, case: Case, verdict: Expectation, tally: Tally) -> None:
    try:
        result = instance.forward(*meta_inputs(op, case))
    except Exception as exc:
        tally.add("forward", where(op.location), "raised",
                  f"forward raised {short_error(exc)} for {describe(op, case)}, which the manifest accepts")
        return
    outputs = _forward_outputs(result)
    if len(outputs) != len(op.outputs):
        tally.add("forward", where(op.location), "count", f"forward returned {len(outputs)} tensors; "
                                                   f"the manifest declares {len(op.outputs)} outputs")
        return
    for rule in op.output_rules:
        tensor = outputs[op.output_names.index(rule.output)]
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else tensor
        if got != verdict.outputs[rule.output]:
            tally.add(rule.text, where(rule.location), "forward",
                      f"forward (reference path) returns {rule.output} of shape {got}; the rule gives "
                      f"{verdict.outputs[rule.output]} for {describe(op, case)}")


def _check_forward_rejects(op: OpSpec, instance: Any, case: Case, verdict: Expectation, tally: Tally) -> None:
    if verdict.kind == RULE:
        rule, location = verdict.rule.text, verdict.rule.location
        quotes = {verdict.rule.text, rules.to_source(verdict.rule.expr)}
        wanted = f"a ValueError quoting `{verdict.rule.text}`"
    else:
        dim = verdict.static_dim
        rule, location = f"static_dims.{dim.name}", dim.location
        quotes = {f"static dim {dim.name}"}
        wanted = f"a ValueError naming static dim {dim.name} = {dim.text}"
    try:
        instance.forward(*meta_inputs(op, case))
    except ValueError as exc:
        if not any(q in str(exc) for q in quotes):
            tally.add(rule, where(location), "message",
                      f"forward raised ValueError({str(exc)!r}) for {describe(op, case)}; expected {wanted}")
        return
    except Exception as exc:
        tally.add(rule, where(location), "type", f"forward raised {short_error(exc)} for {describe(op, case)}; "
                                          f"expected {wanted}")
        return
    tally.add(rule, where(location), "accepted", f"forward accepted {describe(op, case)}; expected {wanted}")


def check_op(ctx: Context, op: OpSpec, cls: type) -> Tuple[List[Finding], int, int]:
    findings: List[Finding] = []
    tally = Tally(LEVEL, op.name)
    infer_missing = missing_method(cls, "_infer_output_shapes")
    if infer_missing:
        findings.append(missing_method_finding(op, LEVEL, "_infer_output_shapes", "_infer_output_shapes"))
    judged = judged_cases(ctx, op)
    accepted = 0
    for case, verdict in judged:
        if verdict.kind == UNEVALUABLE:
            location = (verdict.rule or verdict.static_dim or op).location
            tally.add(verdict.rule.text if verdict.rule else "manifest", where(location), "unevaluable",
                      f"the manifest cannot judge {describe(op, case)}: {verdict.problem}")
            continue
        try:
            instance = construct(cls, case)
        except Exception as exc:
            tally.add("__init__", where(op.location), "raised", f"{op.name}(...) raised {short_error(exc)} for "
                                                         f"{describe(op, case)}")
            continue
        if verdict.kind == ACCEPT:
            accepted += 1
            if not infer_missing:
                _check_inferred(op, instance, case, verdict, tally)
            _check_forward_accepts(op, instance, case, verdict, tally)
        else:
            _check_forward_rejects(op, instance, case, verdict, tally)
    first_accepted = next((case for case, verdict in judged if verdict.kind == ACCEPT), None)
    if first_accepted is not None:
        findings += _check_param_limits(op, cls, first_accepted)
    return findings + tally.findings(len(judged)), len(judged), accepted


def _outside_values(param: ParamSpec) -> List[Any]:
    """Values of ``param``'s type that its manifest ``choices`` or bounds exclude."""
    number = int if param.type in ("int", "Optional[int]") else float
    outside: List[Any] = []
    if param.choices:
        outside.append("<not a choice>" if param.type in ("str", "Optional[str]")
                       else number(max(param.choices)) + number(1))
    if param.minimum is not None:
        outside.append(number(param.minimum) - number(1))
    if param.maximum is not None:
        outside.append(number(param.maximum) + number(1))
    return outside


def _with_param(case: Case, name: str, value: Any) -> Case:
    """``case`` with param ``name`` set to ``value``."""
    return replace(case, params=tuple((n, v) for n, v in case.params if n != name) + ((name, value),))


def _with_static_dim(case: Case, name: str, value: int) -> Case:
    """``case`` with static dim ``name`` committed as ``value``."""
    return replace(case, committed=tuple((n, value if n == name else v) for n, v in case.committed))


def _check_param_limits(op: OpSpec, cls: type, case: Case) -> List[Finding]:
    """Building the op (with ``case``'s other values) refuses each param value the manifest's
    choices or bounds exclude, and a negative static dim (no size), with a ValueError naming
    the param or dim; and accepts the bounds themselves."""
    tally = Tally(LEVEL, op.name)
    tried = 0
    refusals = [(param.name, param.location, value, _with_param(case, param.name, value))
                for param in op.params for value in _outside_values(param)]
    refusals += [(dim.name, dim.location, -1, _with_static_dim(case, dim.name, -1)) for dim in op.static_dims]
    for name, location, value, changed in refusals:
        tried += 1
        try:
            construct(cls, changed)
        except ValueError as exc:
            if name not in str(exc):
                tally.add(name, where(location), "limit message",
                          f"{op.name}({name}={value!r}) raised ValueError({str(exc)!r}), which does not name {name}")
            continue
        except Exception as exc:
            tally.add(name, where(location), "limit type",
                      f"{op.name}({name}={value!r}) raised {short_error(exc)}; expected a ValueError")
            continue
        tally.add(name, where(location), "limit accepted",
                  f"{op.name}({name}={value!r}) was built; the manifest allows no such value")
    for param in op.params:
        for value in (param.minimum, param.maximum):
            if value is None:
                continue
            tried += 1
            try:
                construct(cls, _with_param(case, param.name, value))
            except Exception as exc:
                tally.add(param.name, where(param.location), "bound refused",
                          f"{op.name}({param.name}={value!r}) raised {short_error(exc)}; the manifest allows it")
    return tally.findings(tried)


def check(ctx: Context) -> Tuple[List[Finding], str]:
    findings: List[Finding] = []
    total = accepted = ops = 0
    for op in ctx.selected:
        cls, problems = ctx.class_or_finding(op, LEVEL)
        findings += problems
        if cls is None:
            continue
        op_findings, op_total, op_accepted = check_op(ctx, op, cls)
        findings += op_findings
        ops += 1
        total += op_total
        accepted += op_accepted
    return findings, f"{counted(ops, 'op')}, {counted(total, 'case')} ({accepted} accepted, {total - accepted} rejected)"
