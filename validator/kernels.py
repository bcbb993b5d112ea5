"""Kernel build: every implemented op's kernels compile for sm_90, no GPU needed.

Each kernel is built through its op, as a call would build it: the op is
constructed for the first workload (its shapes, first dtype and params) and
``op._build_kernel(key, *shapes)`` returns the kernel, which is compiled with
``build_all_for_sm90()`` when the kernel offers it (kernels with several
programs) or the ``Kernel`` base's ``build_for_sm90()``.  nvcc is enough:
TileLang accepts an explicit ``sm_90`` target.  Spec-only ops are skipped
with a warning (their kernel may still be a skeleton).  Kernels build in one
spawned process a core (``build_jobs``): the builds are independent, and one
after another they took most of CI's time.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from codegen.model import KernelRef, Manifest, OpSpec

from .cases import ACCEPT, Case, workload_case
from .context import SPEC_ONLY, Context, missing_method, short_error, where
from .findings import WARNING, Finding, counted
from .shapes import construct, judged_cases

__all__ = ["check", "LEVEL"]

LEVEL = "kernel"
MAX_MESSAGE = 400


def build_case(ctx: Context, op: OpSpec) -> Optional[Case]:
    """The first workload as a case (first dtype), else the first accepted generated case."""
    if op.workloads:
        workload = op.workloads[0]
        return workload_case(op, workload, workload.dtypes[0])
    return next((case for case, verdict in judged_cases(ctx, op) if verdict.kind == ACCEPT), None)


def _compile(kernel: Any) -> int:
    """Compile every program of ``kernel`` for sm_90; returns how many programs were built."""
    build_all = getattr(kernel, "build_all_for_sm90", None)
    if callable(build_all):
        return len(build_all())
    kernel.build_for_sm90()
    return 1


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """TileLang and the CUDA compiler may print; stdout carries the report (JSON must stay parseable)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def build_one(op: OpSpec, cls: type, case: Case, ref: KernelRef) -> Tuple[Optional[Finding], float, int]:
    """Build one kernel through its op; (finding or None, seconds, programs built)."""
    started = time.perf_counter()
    try:
        with _stdout_to_stderr():
            kernel = construct(cls, case)._build_kernel(ref.key, *case.shapes)
            programs = _compile(kernel)
    except Exception as exc:
        message = short_error(exc)
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + " ..."
        return (Finding(LEVEL, op.name, f"kernel_map.{ref.key}", where(ref.location),
                        f"{ref.class_name} does not build for sm_90: {message}"),
                time.perf_counter() - started, 0)
    return None, time.perf_counter() - started, programs


def _build_in_worker(manifest: Manifest, op: OpSpec, ref: KernelRef, root: Path) -> Tuple[Optional[Finding], float, int]:
    """``build_one`` in a spawned process, which imports the op's class and makes its case itself."""
    ctx = Context(manifest, (op,), root)
    cls, problems = ctx.class_or_finding(op, LEVEL)
    case = build_case(ctx, op)
    if cls is None or case is None:  # the parent found both; a worker that does not is a finding
        return (problems[0] if problems else Finding(LEVEL, op.name, f"kernel_map.{ref.key}", where(ref.location),
                                                     "the build process found no class or case"), 0.0, 0)
    return build_one(op, cls, case, ref)


def build_jobs(kernels: int) -> int:
    """Processes the kernel builds take: one a core (``TILEOPS_BUILD_JOBS`` overrides), at most one a kernel."""
    setting = os.environ.get("TILEOPS_BUILD_JOBS", "").strip()
    if setting and not (setting.isdigit() and int(setting) > 0):
        raise ValueError(f"TILEOPS_BUILD_JOBS must be a positive whole number of processes, got {setting!r}")
    wanted = int(setting) if setting else os.cpu_count() or 1
    return max(1, min(wanted, kernels))


def _build_all(ctx: Context, builds: Sequence[Tuple[OpSpec, type, Case, KernelRef]], jobs: int
               ) -> List[Tuple[Optional[Finding], float, int]]:
    """``build_one`` of every build, in order; in ``jobs`` spawned processes where there are several."""
    if jobs == 1:
        return [build_one(*build) for build in builds]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_build_in_worker, ctx.manifest, op, ref, ctx.root) for op, _, _, ref in builds]
        results = []
        for (op, _, _, ref), future in zip(builds, futures):
            try:
                results.append(future.result())
            except Exception as exc:  # the worker itself failed (killed, or a result it could not send)
                results.append((Finding(LEVEL, op.name, f"kernel_map.{ref.key}", where(ref.location),
                                        f"{ref.class_name}: its build process failed: {short_error(exc)}"), 0.0, 0))
        return results


def _import_tilelang() -> float:
    """Import TileLang up front, so that the first kernel's time is its build alone."""
    started = time.perf_counter()
    with _stdout_to_stderr():
        importlib.import_module("tilelang")

    return time.perf_counter() - started


def check(ctx: Context) -> Tuple[List[Finding], str, Dict[str, float]]:
    findings: List[Finding] = []
    timings: Dict[str, float] = {}
    built = programs = 0
    builds: List[Tuple[OpSpec, type, Case, KernelRef]] = []
    for op in ctx.selected:
        if op.status == SPEC_ONLY:
            findings.append(Finding(LEVEL, op.name, "status", where(op.location),
                                    "spec-only: its kernels are not built", WARNING))
            continue
        cls, problems = ctx.class_or_finding(op, LEVEL)
        findings += problems
        if cls is None:
            continue
        if missing_method(cls, "_build_kernel"):
            findings.append(Finding(LEVEL, op.name, "_build_kernel", where(op.location),
                                    f"{op.op_base} does not implement _build_kernel, so no kernel can be built"))
            continue
        case = build_case(ctx, op)
        if case is None:
            findings.append(Finding(LEVEL, op.name, "workloads", where(op.location),
                                    "no workload and no accepted case to build the kernels for"))
            continue
        builds += [(op, cls, case, ref) for ref in op.kernels]
    jobs = build_jobs(len(builds))
    if builds and jobs == 1:  # spawned builders import TileLang themselves
        timings["import tilelang (once)"] = _import_tilelang()
    for (op, _, _, ref), (finding, seconds, count) in zip(builds, _build_all(ctx, builds, jobs)):
        timings[f"{op.name}.{ref.key} ({ref.class_name}, {counted(count, 'program')})"] = seconds
        if finding is not None:
            findings.append(finding)
        else:
            built += 1
            programs += count
    return findings, f"{counted(built, 'kernel')}, {counted(programs, 'program')} for sm_90", timings
