"""Run one case: build the op and inputs, check every variant, then time the right ones.

A variant whose output disagrees with the oracle is reported as ``wrong`` with its
error and is never timed; one that raises is reported as ``error``. Nothing here
prints: results are returned and the caller writes them.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from codegen.model import Manifest, OpSpec

from .checking import Verdict, as_outputs, judge, relative_error, upcast
from .timing import Backend, Call, rotation_count
from .variants import (
    Compiler, InputSet, Variant, autograd_variants, backward_inputs, forward_variants, plan_autograd,
)
from .workloads import (
    Case, build_inputs, constructor_kwargs, input_shapes, resolve_op_class, tensor_bytes,
)

__all__ = ["Outcome", "CaseResult", "RunContext", "CheckedVariant", "run_case", "run_cases", "variants_and_inputs",
           "release_memory", "torch_dtype", "float64_oracle", "check_variant", "time_in_turns", "build_input_sets",
           "build_op"]

logger = logging.getLogger(__name__)

OK, WRONG, ERROR = "ok", "wrong", "error"


@dataclass(frozen=True)
class Outcome:
    """One variant of one case."""

    variant: str
    status: str
    median_us: Optional[float] = None
    loop_us: Optional[float] = None  # per call, back to back, host included
    peak_bytes: Optional[int] = None
    error: Optional[float] = None  # relative error against the oracle
    note: str = ""
    rounds_us: Tuple[float, ...] = ()  # each round's median device time (``RunContext.rounds``)


@dataclass(frozen=True)
class CaseResult:
    case: Case
    shapes: Tuple[Optional[Tuple[int, ...]], ...]
    flops: Optional[int]
    bytes: Optional[int]
    outcomes: Tuple[Outcome, ...]
    seconds: float = 0.0

    def outcome(self, variant: str) -> Optional[Outcome]:
        return next((o for o in self.outcomes if o.variant == variant), None)


@dataclass
class RunContext:
    """Everything a case needs besides itself; tests swap in fakes."""

    manifest: Manifest
    backend: Backend
    device: Any = "cuda"
    compiler: Optional[Compiler] = None  # None: no torch.compile variant
    resolve: Callable[[OpSpec], type] = resolve_op_class
    max_input_sets: int = 64
    generator: Any = field(default=None, repr=False)  # seeds the random inputs
    rounds: int = 1  # device timings per variant, taken in turns; the median is reported


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def float64_oracle(op: Any, inputs: Sequence[Any]) -> Tuple[Any, float, List[Any]]:
    """The reference in float64, the working-dtype reference's own error, its output dtypes."""
    working = as_outputs(op.reference(*inputs))
    dtypes = [t.dtype for t in working]
    try:
        exact = as_outputs(op.reference(*upcast(inputs)))
    except Exception as exc:  # noqa: BLE001 - a reference that needs its dtype checks itself
        logger.warning("%s: reference fails on float64 inputs (%s); checking against the working dtype",
                       type(op).__name__, _short(exc))
        return working, 0.0, dtypes
    own_error = max((relative_error(w, e) for w, e in zip(working, exact)), default=0.0)
    return exact, own_error, dtypes


@dataclass
class CheckedVariant:
    """A variant whose output matched the oracle, ready to time."""

    variant: Variant
    calls: List[Call]
    error: float
    peak_bytes: int = 0
    loop_us: float = 0.0
    rounds_us: List[float] = field(default_factory=list)


def check_variant(variant: Variant, input_sets: Sequence[InputSet], oracle: Any, dtype: str, own_error: float,
                  expected_dtypes: Sequence[Any], backend: Backend) -> Union[CheckedVariant, Outcome]:
    """Bind and run ``variant`` once and judge its output: a ``CheckedVariant`` to time, or a failed ``Outcome``."""
    try:
        calls = [variant.bind(inputs) for inputs in input_sets]
        result = calls[0]()  # also compiles: kernels, inductor graphs
        backend.synchronize()
    except Exception as exc:  # noqa: BLE001 - a failing variant is a result, not a crash
        logger.error("%s failed: %s", variant.name, _short(exc))
        return Outcome(variant.name, ERROR, note=_short(exc))
    verdict: Verdict = judge(result, oracle, dtype, own_error, expected_dtypes)
    del result
    if not verdict.ok:
        logger.error("%s is wrong: %s", variant.name, verdict.reason)
        return Outcome(variant.name, WRONG, error=verdict.error, note=verdict.reason)
    return CheckedVariant(variant, calls, verdict.error)


def time_in_turns(checked: Sequence[CheckedVariant], backend: Backend, rounds: int) -> Dict[str, Outcome]:
    """``rounds`` device timings per variant, the variants taking turns; peak memory and the
    host loop once, in the first round.

    Taking turns spreads a drift of the card (clock, temperature, a neighbour's
    traffic) over every variant alike, so the ratio of two medians is steadier
    than one timing of each in a row.
    """
    failed: Dict[str, Outcome] = {}
    for round_index in range(max(1, rounds)):
        for entry in checked:
            if entry.variant.name in failed:
                continue
            try:
                if round_index == 0:
                    entry.peak_bytes = backend.peak_memory_bytes(entry.calls[0])
                entry.rounds_us.append(backend.time_us(entry.calls))
                if round_index == 0:
                    entry.loop_us = backend.loop_us(entry.calls)
            except Exception as exc:  # noqa: BLE001
                logger.error("%s failed while timed: %s", entry.variant.name, _short(exc))
                failed[entry.variant.name] = Outcome(entry.variant.name, ERROR, error=entry.error,
                                                     note=_short(exc))
    outcomes = dict(failed)
    for entry in checked:
        if entry.variant.name not in failed:
            outcomes[entry.variant.name] = Outcome(
                entry.variant.name, OK, median_us=statistics.median(entry.rounds_us), loop_us=entry.loop_us,
                peak_bytes=entry.peak_bytes, error=entry.error, note=_rounds_note(entry),
                rounds_us=tuple(entry.rounds_us))
    return outcomes


def _rounds_note(entry: CheckedVariant) -> str:
    if len(entry.rounds_us) < 2:
        return entry.variant.note
    spread = f"median of {len(entry.rounds_us)} rounds, {min(entry.rounds_us):.3f}-{max(entry.rounds_us):.3f} us"
    return "; ".join(n for n in (entry.variant.note, spread) if n)


def _case_inputs(case: Case, ctx: RunContext) -> Callable[[], InputSet]:
    """A maker of input sets from the workload (random, or the entry's ``make_inputs``)."""
    return lambda: InputSet(build_inputs(case, ctx.device, ctx.generator))


def _fallback(case: Case, op: Any, ctx: RunContext, why: str) -> Tuple[List[Variant], Callable[[], InputSet], str]:
    logger.warning("%s: %s; the baselines use its own reference", case.spec.name, why)
    return forward_variants(op, ctx.compiler), _case_inputs(case, ctx), f"baseline: {case.spec.name}.reference ({why})"


def variants_and_inputs(case: Case, op: Any, ctx: RunContext) -> Tuple[List[Variant], Callable[[], InputSet], str]:
    """The variants of a case, a maker of its input sets, and a note for every row."""
    if case.spec.direction != "Bwd":
        return forward_variants(op, ctx.compiler), _case_inputs(case, ctx), ""
    plan, why = plan_autograd(ctx.manifest, case.spec)
    if plan is None:
        return _fallback(case, op, ctx, why)
    custom = case.entry is not None and case.entry.make_inputs is not None
    if custom and not plan.carries_forward_inputs:
        return _fallback(case, op, ctx, f"{case.entry.module}.make_inputs gives no {plan.forward.name} inputs")
    try:
        fwd_workload = plan.forward_workload(case.workload)
        fwd_op = ctx.resolve(plan.forward)(**constructor_kwargs(plan.forward, fwd_workload,
                                                                torch_dtype(case.dtype)))
    except (ValueError, ImportError, AttributeError) as exc:
        return _fallback(case, op, ctx, _short(exc))
    if custom:
        make = _case_inputs(case, ctx)
    else:
        def make() -> InputSet:  # Bwd inputs from a Fwd run, so saved tensors are real
            return backward_inputs(plan, fwd_op, case.workload, case.dtype, ctx.device, ctx.generator)
    return autograd_variants(op, plan, fwd_op, ctx.compiler), make, ""


def build_op(case: Case, ctx: RunContext) -> Any:
    """``case``'s op, constructed with the workload's static dims and params."""
    return ctx.resolve(case.spec)(**constructor_kwargs(case.spec, case.workload, torch_dtype(case.dtype)))


def build_input_sets(make: Callable[[], InputSet], ctx: RunContext) -> List[InputSet]:
    first = make()
    count = rotation_count(tensor_bytes(first.args), ctx.backend.l2_bytes, ctx.max_input_sets)
    return [first] + [make() for _ in range(count - 1)]


def run_case(case: Case, ctx: RunContext) -> CaseResult:
    """Check and time every variant of ``case``; never raises for a broken op."""
    began = time.perf_counter()
    shapes = tuple(input_shapes(case.spec, case.workload))
    try:
        op = build_op(case, ctx)
        flops, moved = (int(v) for v in op.eval_roofline(*shapes))
        variants, make_inputs, case_note = variants_and_inputs(case, op, ctx)
        input_sets = build_input_sets(make_inputs, ctx)
        oracle, own_error, expected_dtypes = float64_oracle(op, input_sets[0].args)
    except Exception as exc:  # noqa: BLE001 - e.g. an op file not generated yet
        logger.error("%s: cannot set up: %s", case.label, _short(exc))
        outcome = Outcome("tileops", ERROR, note=f"setup: {_short(exc)}")
        return CaseResult(case, shapes, None, None, (outcome,), time.perf_counter() - began)
    checked = [check_variant(variant, input_sets, oracle, case.dtype, own_error, expected_dtypes, ctx.backend)
               for variant in variants]
    timings = time_in_turns([c for c in checked if isinstance(c, CheckedVariant)], ctx.backend, ctx.rounds)
    outcomes = []
    for variant, check in zip(variants, checked):
        outcome = timings[variant.name] if isinstance(check, CheckedVariant) else check
        if case_note:
            outcome = dataclasses.replace(outcome, note="; ".join(n for n in (outcome.note, case_note) if n))
        outcomes.append(outcome)
    del input_sets, oracle, variants, op, checked
    return CaseResult(case, shapes, flops, moved, tuple(outcomes), time.perf_counter() - began)


def release_memory() -> None:
    """Drop what the last case left: Python garbage and the CUDA caching allocator's free blocks."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass


def run_cases(cases: Sequence[Case], ctx: RunContext,
              on_result: Optional[Callable[[CaseResult], None]] = None) -> List[CaseResult]:
    """Every case in order; ``on_result`` sees each result as soon as it exists."""
    results = []
    for index, case in enumerate(cases, 1):
        logger.info("[%d/%d] %s", index, len(cases), case.label)
        result = run_case(case, ctx)
        for outcome in result.outcomes:
            timing = f"{outcome.median_us:.2f} us" if outcome.median_us is not None else outcome.status
            logger.info("    %-8s %s", outcome.variant, timing)
        results.append(result)
        if on_result is not None:
            on_result(result)
        release_memory()
    return results
