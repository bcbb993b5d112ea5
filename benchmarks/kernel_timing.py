"""Time the RMSNorm and cumsum kernels against the copy-bandwidth ceiling and PyTorch.

Usage (on a GPU machine)::

    python benchmarks/kernel_timing.py precompile   # fill TileLang's disk cache in parallel
    python benchmarks/kernel_timing.py time [--out DIR]

``precompile`` builds every program the GPU tests and the timing runs use, in
a process pool, so that later processes load them from TileLang's cache
instead of compiling one at a time.  ``time`` measures, with CUDA events
(``triton.testing.do_bench``: median, L2 flushed between runs, after warm-up):
the device copy bandwidth (bytes read + written), each kernel config on each
workload, ``torch`` eager and ``torch.compile``; and the host cost per call of
a tiny launch.  It prints a table and writes a CSV.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

DTYPE_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

# Workloads timed: (name, shape, dtype); cumsum shapes are (outer, N, inner) or (rows, N).
RMS_WORKLOADS = [
    ("rms 32768x4096", (32768, 4096), "bfloat16"),
    ("rms 8192x32768", (8192, 32768), "bfloat16"),
    ("rms 1024x262144", (1024, 262144), "bfloat16"),
    ("rms 65536x127", (65536, 127), "bfloat16"),
]
CUMSUM_WORKLOADS = [
    ("cumsum 64x262144", (64, 262144), "bfloat16"),
    ("cumsum 32768x4096", (32768, 4096), "bfloat16"),
    ("cumsum 8x4096x4096 dim1", (8, 4096, 4096), "bfloat16"),
    ("cumsum 4096x4096 fp32", (4096, 4096), "float32"),
]

# What the GPU tests build (tests/gpu/test_kernels_direct.py).
TEST_SIZES = (1, 3, 127, 4096, 4097, 65537, 262144)
TEST_COLUMN_CASES = (
    (1, 5), (127, 5), (127, 64), (4097, 2), (4097, 33), (3, 7), (4097, 40), (4097, 64),
    (127, 256), (1000, 264), (4097, 256), (4097, 45),
)


# ---- precompile ----------------------------------------------------------------------------------


def _compile_job(job: Tuple[str, int, str, str, Dict[str, Any]]) -> Tuple[str, float, Optional[str]]:
    family, N, dtype_name, program, config = job
    start = time.time()
    try:
        kernel = _make_kernel(family, N, DTYPE_NAMES[dtype_name], config)
        if family == "rms":
            kernel.compile()
        else:
            kernel.compile_program(program)
        return f"{family} N={N} {dtype_name} {program}", time.time() - start, None
    except Exception as error:  # noqa: BLE001 - reported, the run goes on
        return f"{family} N={N} {dtype_name} {program} {config}", time.time() - start, repr(error)


def _make_kernel(family: str, N: int, dtype: torch.dtype, config: Optional[Dict[str, Any]] = None) -> Any:
    from tileops.kernels.norm.rms_norm import RMSNormFwdKernel, rms_norm_default_config
    from tileops.kernels.scan.cumsum import CumsumFwdKernel, cumsum_default_config

    if family == "rms":
        return RMSNormFwdKernel(N, dtype, eps=1e-6, config=config or rms_norm_default_config(N, dtype))
    return CumsumFwdKernel(N, dtype, config=config or cumsum_default_config(N, dtype))


def _cumsum_jobs(N: int, dtype_name: str, config: Dict[str, Any], inners: Sequence[int] = ()) -> List[tuple]:
    kernel = _make_kernel("cumsum", N, DTYPE_NAMES[dtype_name], config)
    names = kernel.program_names()
    for inner in inners:
        names += kernel.program_names(inner)
    return [("cumsum", N, dtype_name, name, config) for name in dict.fromkeys(names)]


def precompile_jobs() -> List[tuple]:
    from tileops.kernels.norm.rms_norm import rms_norm_autotune_configs, rms_norm_default_config
    from tileops.kernels.scan.cumsum import cumsum_default_config

    jobs: List[tuple] = []
    for dtype_name, dtype in DTYPE_NAMES.items():
        for N in TEST_SIZES:
            jobs.append(("rms", N, dtype_name, "main", rms_norm_default_config(N, dtype)))
            inners = [inner for n, inner in TEST_COLUMN_CASES if n == N]
            jobs += _cumsum_jobs(N, dtype_name, cumsum_default_config(N, dtype), inners)
        for n, inner in TEST_COLUMN_CASES:
            if n not in TEST_SIZES:
                jobs += _cumsum_jobs(n, dtype_name, cumsum_default_config(n, dtype), [inner])
    jobs.append(("rms", 32768, "bfloat16", "main", rms_norm_default_config(32768, torch.bfloat16)))
    for _, shape, dtype_name in RMS_WORKLOADS:
        for config in rms_norm_autotune_configs(shape[-1], DTYPE_NAMES[dtype_name]):
            jobs.append(("rms", shape[-1], dtype_name, "main", config))
    for _, shape, dtype_name in CUMSUM_WORKLOADS:
        N = shape[1]
        inners = [shape[2]] if len(shape) == 3 else []
        for config in cumsum_candidates(shape, DTYPE_NAMES[dtype_name]):
            jobs += _cumsum_jobs(N, dtype_name, config, inners)
    for N in (65544, 262144):  # the look-back scan the GPU tests compare with
        for dtype_name, dtype in DTYPE_NAMES.items():
            jobs += _cumsum_jobs(N, dtype_name, {**cumsum_default_config(N, dtype), "lookback": 1})
    base = cumsum_default_config(262144, torch.bfloat16)
    for threads, items in ((256, 16), (512, 16), (512, 32)):
        config = {**base, "threads": threads, "items": items, "row_threads": threads, "lookback": 1}
        jobs += _cumsum_jobs(262144, "bfloat16", config)
    for threads, items in ((256, 8), (256, 16)):
        config = {**base, "threads": threads, "items": items, "row_threads": threads, "lookback": 0, "segments": 32}
        jobs += _cumsum_jobs(262144, "bfloat16", config)
    lookback_stress = {
        **cumsum_default_config(262144, torch.float32), "threads": 256, "items": 4, "row_threads": 256, "lookback": 1,
        "segments": 256,
    }
    jobs += _cumsum_jobs(262144, "float32", lookback_stress)
    unique = {}
    for job in jobs:
        unique[(job[0], job[1], job[2], job[3], tuple(sorted(job[4].items())))] = job
    return list(unique.values())


def precompile(workers: int) -> int:
    jobs = precompile_jobs()
    print(f"precompiling {len(jobs)} programs with {workers} processes", flush=True)
    start = time.time()
    failures = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for future in as_completed([pool.submit(_compile_job, job) for job in jobs]):
            name, seconds, error = future.result()
            if error:
                failures += 1
                print(f"FAILED {name}: {error}", flush=True)
    print(f"precompiled in {time.time() - start:.0f} s, {failures} failures", flush=True)
    return failures


# ---- timing --------------------------------------------------------------------------------------


def _bench(fn: Callable[[], Any]) -> float:
    """Median milliseconds of ``fn`` (CUDA events, L2 flushed before each run)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=50, rep=300, return_mode="median"))


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read and written."""
    src = torch.randn(256 * 2**20, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    ms = _bench(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def _rms_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, 1e-6)


def _compiled_or_none(fn: Callable[..., Any]) -> Optional[Callable[..., Any]]:
    try:
        return torch.compile(fn, dynamic=False)
    except Exception:  # noqa: BLE001
        return None


def _time_or_nan(fn: Optional[Callable[[], Any]]) -> float:
    if fn is None:
        return math.nan
    try:
        fn()
        torch.cuda.synchronize()
        return _bench(fn)
    except Exception as error:  # noqa: BLE001 - a baseline that fails is reported as NaN
        print(f"  baseline failed: {error!r}"[:300], flush=True)
        return math.nan


def time_rms(name: str, shape: Tuple[int, int], dtype: torch.dtype) -> Dict[str, Any]:
    rows, N = shape
    x = torch.randn(rows, N, device="cuda", dtype=dtype)
    weight = torch.randn(N, device="cuda", dtype=dtype)
    out = torch.empty_like(x)
    reference = _rms_reference(x.float(), weight.float())
    kernel = _make_kernel("rms", N, dtype)
    best = (math.inf, None)
    per_config = []
    for config in kernel.autotune_configs:
        kernel.config = dict(config)
        out.fill_(float("nan"))
        kernel(x, weight, out)
        torch.cuda.synchronize()
        error = float(((out.float() - reference).abs().max()))
        ms = _bench(lambda: kernel(x, weight, out))
        per_config.append((config, ms, error))
        if error < 0.1 and ms < best[0]:
            best = (ms, config)
    default_ms = per_config[0][1]
    compiled = _compiled_or_none(_rms_reference)
    return {
        "name": name,
        "bytes": (2 * rows * N + N) * x.element_size(),
        "default_ms": default_ms,
        "best_ms": best[0],
        "best_config": best[1],
        "eager_ms": _time_or_nan(lambda: _rms_reference(x, weight)),
        "compile_ms": _time_or_nan(None if compiled is None else (lambda: compiled(x, weight))),
        "max_error_default": per_config[0][2],
        "configs": per_config,
    }


def cumsum_candidates(shape: Tuple[int, ...], dtype: torch.dtype) -> List[Dict[str, Any]]:
    """Row-layout candidates for row workloads; column-layout variations for (outer, N, inner)."""
    from tileops.kernels.scan.cumsum import cumsum_autotune_configs, cumsum_default_config

    N = shape[1]
    if len(shape) == 2:
        candidates = cumsum_autotune_configs(N, dtype)
        if shape[0] <= candidates[0]["split_max_rows"]:
            # Few rows: compare the split and look-back scans of every layout.
            candidates = candidates + [{**config, "lookback": 1} for config in candidates]
        return candidates
    default = cumsum_default_config(N, dtype)
    candidates = [default]
    for threads in (128, 256, 512):
        for items in (4, 8, 16):
            config = {**default, "column_threads": threads, "column_items": items}
            if config not in candidates:
                candidates.append(config)
    return candidates


def time_cumsum(name: str, shape: Tuple[int, ...], dtype: torch.dtype) -> Dict[str, Any]:
    N = shape[1]
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    out = torch.empty_like(x)
    reference = torch.cumsum(x.float(), dim=1)
    kernel = _make_kernel("cumsum", N, dtype)
    best = (math.inf, None)
    per_config = []
    scale = reference.abs().max().item()
    for config in cumsum_candidates(shape, dtype):
        kernel.config = dict(config)
        out.fill_(float("nan"))
        kernel(x, out)
        torch.cuda.synchronize()
        error = float(((out.float() - reference).abs().max())) / scale
        ms = _bench(lambda: kernel(x, out))
        per_config.append((config, ms, error))
        if error < 0.05 and ms < best[0]:
            best = (ms, config)
    compiled = _compiled_or_none(lambda t: torch.cumsum(t, dim=1))
    return {
        "name": name,
        "bytes": 2 * x.numel() * x.element_size(),
        "default_ms": per_config[0][1],
        "best_ms": best[0],
        "best_config": best[1],
        "eager_ms": _time_or_nan(lambda: torch.cumsum(x, dim=1)),
        "compile_ms": _time_or_nan(None if compiled is None else (lambda: compiled(x))),
        "max_error_default": per_config[0][2],
        "configs": per_config,
    }


def long_row_breakdown(rows: int = 64, N: int = 262144, dtype: torch.dtype = torch.bfloat16) -> List[Tuple[str, float]]:
    """Milliseconds of each launch of the few-long-rows paths (L2 flushed before each)."""
    from tileops.kernels.scan.cumsum import (
        LOOKBACK_ROW_SCAN,
        SEGMENT_SUMS,
        SPLIT_ROW_SCAN,
        cumsum_default_config,
    )

    x = torch.randn(rows, N, device="cuda", dtype=dtype)
    out = torch.empty_like(x)
    results = []
    base = cumsum_default_config(N, dtype)
    for threads, items in ((256, 16), (512, 16), (512, 32)):
        config = {**base, "threads": threads, "items": items, "row_threads": threads, "lookback": 1}
        kernel = _make_kernel("cumsum", N, dtype, config)
        status, control = kernel.lookback_workspace(rows, x.device)
        blocks = kernel.lookback_blocks(rows, x.device)
        launch = kernel._launcher(LOOKBACK_ROW_SCAN)
        results.append((f"look-back scan ({threads}x{items})", _bench(lambda: launch(x, status, control, out, blocks))))
    for threads, items in ((256, 8), (256, 16)):
        config = {**base, "threads": threads, "items": items, "row_threads": threads, "lookback": 0, "segments": 32}
        kernel = _make_kernel("cumsum", N, dtype, config)
        partial = torch.empty((rows, kernel.split_segments), dtype=torch.float32, device="cuda")
        sums, scan = kernel._launcher(SEGMENT_SUMS), kernel._launcher(SPLIT_ROW_SCAN)
        results.append((f"segment sums ({threads}x{items})", _bench(lambda: sums(x, partial))))
        results.append((f"split scan alone ({threads}x{items})", _bench(lambda: scan(x, partial, out))))
        results.append((f"both ({threads}x{items})", _bench(lambda: (sums(x, partial), scan(x, partial, out)))))
    return results


def host_overhead() -> List[Tuple[str, float]]:
    """Microseconds of host time per call for a 1 x 4096 bf16 RMSNorm (GPU work is ~2 us)."""
    from tileops.kernels.launch import direct_launcher

    N = 4096
    x = torch.randn(1, N, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    kernel = _make_kernel("rms", N, torch.bfloat16)
    compiled = kernel.kernel
    launcher = direct_launcher(compiled)
    candidates: List[Tuple[str, Callable[[], Any]]] = [
        ("packed function, preallocated out", lambda: launcher(x, weight, out)),
        ("JITKernel __call__, preallocated out", lambda: compiled(x, weight, out)),
        ("RMSNormFwdKernel.forward", lambda: kernel(x, weight, out)),
        ("torch eager rms_norm", lambda: _rms_reference(x, weight)),
    ]
    try:
        from tileops.ops import RMSNormFwdOp

        op = RMSNormFwdOp(N=N, dtype=torch.bfloat16, eps=1e-6)
        candidates.insert(3, ("RMSNormFwdOp(x, w) (allocates y)", lambda: op(x, weight)))
    except Exception as error:  # noqa: BLE001
        print(f"  op unavailable: {error!r}"[:300])
    results = []
    calls = 2000
    for label, fn in candidates:
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        results.append((label, elapsed / calls * 1e6))
    return results


def run_timing(out_dir: Optional[Path], only: str = "") -> None:
    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}  copy bandwidth (read+write): {bandwidth / 1e12:.2f} TB/s")
    rows: List[Dict[str, Any]] = []
    for name, shape, dtype_name in RMS_WORKLOADS:
        if only not in name:
            continue
        try:
            rows.append(time_rms(name, shape, DTYPE_NAMES[dtype_name]))
        except Exception as error:  # noqa: BLE001
            print(f"{name} FAILED: {error!r}"[:400], flush=True)
    for name, shape, dtype_name in CUMSUM_WORKLOADS:
        if only not in name:
            continue
        try:
            rows.append(time_cumsum(name, shape, DTYPE_NAMES[dtype_name]))
        except Exception as error:  # noqa: BLE001
            print(f"{name} FAILED: {error!r}"[:400], flush=True)
    overhead = host_overhead()
    try:
        breakdown = long_row_breakdown()
    except Exception as error:  # noqa: BLE001
        print(f"breakdown FAILED: {error!r}"[:400], flush=True)
        breakdown = []

    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "kernel_timing.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["workload", "config", "ms", "GB/s", "max_error"])
            for row in rows:
                for config, ms, error in row["configs"]:
                    writer.writerow([row["name"], config, f"{ms:.5f}", f"{row['bytes'] / ms / 1e6:.1f}", f"{error:.3g}"])
    print("\nper-config timings (ms, GB/s):")
    for row in rows:
        for config, ms, error in row["configs"]:
            print(f"  {row['name']:<26} {ms:8.4f} {row['bytes'] / ms / 1e6:8.0f}  err={error:.2g}  {config}")
    print("\ncumsum 64x262144 bf16, per launch (ms):")
    for label, ms in breakdown:
        print(f"  {label:<40} {ms:8.4f}")
    print("\nhost time per call (us):")
    for label, us in overhead:
        print(f"  {label:<40} {us:7.1f}")
    print(f"\ncopy bandwidth {bandwidth / 1e12:.2f} TB/s; % = achieved / measured copy bandwidth")
    header = f"{'workload':<26}{'default ms':>11}{'best ms':>9}{'GB/s':>7}{'%copy':>7}{'eager ms':>10}{'compile ms':>11}{'vs eager':>9}{'vs compile':>11}"
    print(header)
    for row in rows:
        best = row["best_ms"]
        gbps = row["bytes"] / best / 1e6
        print(
            f"{row['name']:<26}{row['default_ms']:>11.4f}{best:>9.4f}{gbps:>7.0f}{100 * gbps * 1e9 / bandwidth:>6.1f}%"
            f"{row['eager_ms']:>10.4f}{row['compile_ms']:>11.4f}{row['eager_ms'] / best:>8.2f}x{row['compile_ms'] / best:>10.2f}x"
        )
    for row in rows:
        print(f"  best config {row['name']}: {row['best_config']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["precompile", "time"])
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", default="", help="time only workloads whose name contains this")
    args = parser.parse_args()
    if args.stage == "precompile":
        sys.exit(1 if precompile(args.workers) else 0)
    run_timing(args.out, args.only)


if __name__ == "__main__":
    main()
