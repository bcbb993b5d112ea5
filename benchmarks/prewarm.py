"""Fill the compile caches for a benchmark run in parallel worker processes.

Every variant's first call compiles: TileLang programs for ``tileops`` and inductor
graphs plus Triton kernels for ``compile``. One process compiles them one after
another, which dominates a cold run. Here each worker process (spawned, one CUDA
context each) sets a case up and calls every variant once; TileLang's on-disk cache
and inductor's FX-graph and Triton caches then serve the timed run, which loads
instead of compiling.

Nothing is checked or timed here, and a failure only means the timed run compiles
that case itself (and reports what went wrong there), so failures are logged, not
raised.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

__all__ = ["prewarm", "warm_case", "case_key", "find_case", "in_processes", "noted"]

logger = logging.getLogger(__name__)

# (op name, workload label, dtype): a manifest case, as ``--ops``/``--workloads`` name it.
CaseName = Tuple[str, str, str]
# (op name, dtype, workload): what a worker needs to set a case up again, whether its workload is
# the manifest's or one reshaped from it (``config_sweep --shape``, ``model_shapes``).
CaseKey = Tuple[str, str, Any]


@functools.lru_cache(maxsize=1)
def _catalogue() -> Tuple[Any, Any]:
    """The manifest and the benchmark entries, loaded once per worker process."""
    from codegen.loader import load_manifest

    from .workloads import load_entries

    return load_manifest(), load_entries()


def find_case(name: CaseName) -> Tuple[Any, Any]:
    """The manifest and the one case ``name`` names."""
    from .workloads import select_cases

    op, label, dtype = name
    manifest, entries = _catalogue()
    cases = select_cases(manifest, entries, [op], [label], [dtype])
    if len(cases) != 1:
        raise LookupError(f"{'/'.join(name)} selects {len(cases)} cases")
    return manifest, cases[0]


def case_key(case: Any) -> CaseKey:
    """What ``warm_case`` needs of ``case`` (a ``workloads.Case``) in another process."""
    return case.spec.name, case.dtype, case.workload


def _case_from_key(key: CaseKey) -> Tuple[Any, Any]:
    """The manifest and the case ``key`` describes."""
    from .workloads import Case

    op, dtype, workload = key
    manifest, entries = _catalogue()
    return manifest, Case(manifest.op(op), workload, dtype, entries.get(op))


def noted(work: Callable[[], Any], device_name: str) -> Tuple[float, str]:
    """Run ``work()`` (which launches on ``device_name``) to its end; returns the seconds it took
    and an error note ("" if none).  The memory it left is freed either way."""
    import torch

    from .runner import release_memory

    began = time.perf_counter()
    try:
        work()
        if torch.device(device_name).type == "cuda":
            torch.cuda.synchronize()
        note = ""
    except Exception as exc:  # noqa: BLE001 - the timed run reports it properly
        note = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    finally:
        release_memory()
    return time.perf_counter() - began, note


def warm_case(key: CaseKey, with_compile: bool, device_name: str = "cuda") -> Tuple[float, str]:
    """Call every variant of one case once; returns the seconds it took and an error note ("" if none)."""
    import torch

    from .runner import RunContext, build_op, variants_and_inputs
    from .variants import default_compiler

    def call_every_variant() -> None:
        manifest, case = _case_from_key(key)
        ctx = RunContext(manifest, None, torch.device(device_name),  # no timing here: no backend
                         compiler=default_compiler if with_compile else None,
                         generator=torch.Generator(device_name).manual_seed(0))
        variants, make_inputs, _ = variants_and_inputs(case, build_op(case, ctx), ctx)
        inputs = make_inputs()
        for variant in variants:
            variant.bind(inputs)()

    return noted(call_every_variant, device_name)


def in_processes(task: Callable[[Any], Tuple[float, str]], items: Sequence[Any],
                 jobs: int) -> Iterator[Tuple[Any, float, str]]:
    """``task(item)`` for every item in up to ``jobs`` spawned processes, yielded as each finishes:
    ``(item, seconds, note)``, the note being the task's error note ("" if none) or why its worker
    died (e.g. out of memory).  ``task`` must pickle: a module-level function or a partial of one."""
    # spawn: a forked child cannot use the parent's CUDA context.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=context) as pool:
        futures = {pool.submit(task, item): item for item in items}
        for future in as_completed(futures):
            try:
                seconds, note = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker that died
                seconds, note = 0.0, f"worker died: {type(exc).__name__}: {exc}"[:200]
            yield futures[future], seconds, note


def prewarm(cases: Sequence[Any], jobs: int, with_compile: bool = True,
            device_name: str = "cuda") -> List[Tuple[CaseKey, str]]:
    """Warm every case in ``jobs`` spawned processes; returns the (case, error) pairs that failed."""
    keys: List[CaseKey] = [case_key(case) for case in cases]
    if jobs <= 0 or not keys:
        return []
    began = time.perf_counter()
    failures: List[Tuple[CaseKey, str]] = []
    task = functools.partial(warm_case, with_compile=with_compile, device_name=device_name)
    for done, (key, seconds, note) in enumerate(in_processes(task, keys, jobs), 1):
        if note:
            failures.append((key, note))
            logger.warning("prewarm %s failed (the timed run compiles it): %s", _label(key), note)
        else:
            logger.debug("prewarm %s: %.1f s", _label(key), seconds)
        if done % 20 == 0:
            logger.info("prewarmed %d/%d cases", done, len(keys))
    logger.info("prewarmed %d cases with %d processes in %.0f s (%d failed)",
                len(keys), jobs, time.perf_counter() - began, len(failures))
    return failures


def _label(key: CaseKey) -> str:
    op, dtype, workload = key
    return f"{op}/{workload.label}/{dtype}"


def default_jobs(cpu_count: Optional[int] = None) -> int:
    """Half the cores, at most 8: each worker holds a CUDA context and one case's tensors."""
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, min(8, cores // 2))
