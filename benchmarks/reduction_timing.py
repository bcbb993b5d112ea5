"""Time the reduction ops on their large bf16 workloads against torch eager and torch.compile.

    python -m benchmarks.reduction_timing

Prints one Markdown row per op and workload: microseconds, GB/s (input read once plus the output
written once), percent of the measured copy bandwidth, and the eager and compiled references.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

logger = logging.getLogger("benchmarks.reduction_timing")

OPS = ["SumFwdOp", "MeanFwdOp", "AmaxFwdOp", "AminFwdOp", "VarFwdOp", "LogSumExpFwdOp", "ArgmaxFwdOp", "L2NormFwdOp"]
LABELS = ("rows-16k-16k", "cols-16k-16k", "all-16k-16k")


def time_us(fn: Callable[[], object], iters: int = 20) -> float:
    """Median microseconds of ``fn`` over ``iters`` runs, after a warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return sorted(times)[len(times) // 2]


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (read plus write)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / time_us(lambda: dst.copy_(src)) / 1e3


def main() -> None:
    import tileops.ops
    from codegen import load_manifest

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifest = load_manifest()
    copy = copy_bandwidth()
    logger.info("copy bandwidth %.1f GB/s", copy)
    logger.info("| op | workload | us | GB/s | %% copy | eager us | compile us | vs eager | vs compile |")
    logger.info("|---|---|---|---|---|---|---|---|---|")
    for name in OPS:
        for workload in manifest.op(name).workloads:
            if workload.label not in LABELS:
                continue
            params = {k: tuple(v) if isinstance(v, list) else v for k, v in workload.params}
            x = torch.randn(dict(workload.shapes)["x"], device="cuda", dtype=torch.bfloat16)
            op = getattr(tileops.ops, name)(dtype=torch.bfloat16, **params)
            ours = time_us(lambda: op(x))
            eager = time_us(lambda: op.reference(x))
            compiled_fn = torch.compile(op.reference)
            compiled = time_us(lambda: compiled_fn(x))
            _, moved = op.eval_roofline(tuple(x.shape))
            gbs = moved / ours / 1e3
            logger.info("| %s | %s | %.1f | %.0f | %.1f | %.1f | %.1f | %.2fx | %.2fx |", name, workload.label, ours,
                        gbs, 100 * gbs / copy, eager, compiled, eager / ours, compiled / ours)


if __name__ == "__main__":
    main()
