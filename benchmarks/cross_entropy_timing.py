"""Cross-entropy forward + backward: tileops vs eager PyTorch vs torch.compile (time and peak memory).

``python -m benchmarks.cross_entropy_timing [--rows 8192] [--classes 131072]`` prints a
Markdown table: median milliseconds of one training step's loss (forward and backward,
CUDA events, L2 flushed) and the peak memory allocated during it beyond the inputs.
"""

import argparse
import logging
import statistics
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from tileops.ops import CrossEntropyFwdOp

logger = logging.getLogger(__name__)

MIB = 1 << 20


def _flush_l2(buffer: torch.Tensor) -> None:
    buffer.zero_()


def measure(step: Callable[[torch.Tensor], None], logits: torch.Tensor, repeats: int) -> Dict[str, float]:
    """Median ms of ``step`` and its peak memory beyond what was allocated before it."""
    flush = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    for _ in range(3):  # warm-up: compilation, allocator growth
        step(logits)
        logits.grad = None
    times: List[float] = []
    for _ in range(repeats):
        _flush_l2(flush)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(logits)
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
        logits.grad = None
    del flush
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step(logits)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    logits.grad = None
    return {"ms": statistics.median(times), "peak_mib": peak / MIB, "extra_mib": (peak - before) / MIB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--classes", type=int, default=131072)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows, classes, dtype = args.rows, args.classes, torch.bfloat16
    logits = torch.randn(rows, classes, device="cuda", dtype=dtype).requires_grad_()
    target = torch.randint(0, classes, (rows,), device="cuda")
    target[::7] = -100
    op = CrossEntropyFwdOp(V=classes, dtype=dtype)
    compiled = torch.compile(lambda x, t: F.cross_entropy(x, t))

    def ours(x: torch.Tensor) -> None:
        op(x, target)[0].backward()

    def eager(x: torch.Tensor) -> None:
        F.cross_entropy(x, target).backward()

    def inductor(x: torch.Tensor) -> None:
        compiled(x, target).backward()

    results = {name: measure(fn, logits, args.repeats) for name, fn in
               (("tileops", ours), ("eager", eager), ("torch.compile", inductor))}
    moved = 3 * rows * classes * logits.element_size()  # logits read twice, gradient written once
    logger.info("| %d x %d bfloat16, fwd+bwd | ms | GB/s (3 passes) | peak MiB | peak beyond inputs MiB | tileops speedup |",
                rows, classes)
    logger.info("|---|---|---|---|---|---|")
    for name, r in results.items():
        speedup = r["ms"] / results["tileops"]["ms"]
        logger.info("| %s | %.3f | %.0f | %.3f | %.3f | %.2fx |", name, r["ms"], moved / r["ms"] / 1e6,
                    r["peak_mib"], r["extra_mib"], speedup)


if __name__ == "__main__":
    main()
