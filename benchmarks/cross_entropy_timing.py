"""Cross-entropy forward + backward: tileops vs eager PyTorch vs torch.compile (time and peak memory).

``python -m benchmarks.cross_entropy_timing [--rows 8192] [--classes 131072]`` prints a
Markdown table: median milliseconds of one training step's loss (forward and backward,
timed as ``make bench`` times) and the peak memory allocated during it beyond the inputs.
"""

import argparse
import logging
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from benchmarks.timing import CudaBackend, TimingSettings
from tileops.ops import CrossEntropyFwdOp

logger = logging.getLogger(__name__)

MIB = 1 << 20


def measure(backend: CudaBackend, step: Callable[[torch.Tensor], None], logits: torch.Tensor) -> Dict[str, float]:
    """Median ms of ``step`` (the harness's timing) and its peak memory beyond what was allocated before it."""

    def call() -> None:
        step(logits)
        logits.grad = None  # every step starts without a gradient, as in training

    return {"ms": backend.time_us([call]) / 1e3, "extra_mib": backend.peak_memory_bytes(call) / MIB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--classes", type=int, default=131072)
    parser.add_argument("--rep-ms", type=float, default=150.0, help="timed repetitions per variant, in ms")
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

    backend = CudaBackend(settings=TimingSettings(rep_ms=args.rep_ms))
    results = {name: measure(backend, fn, logits) for name, fn in
               (("tileops", ours), ("eager", eager), ("torch.compile", inductor))}
    moved = 3 * rows * classes * logits.element_size()  # logits read twice, gradient written once
    logger.info("| %d x %d bfloat16, fwd+bwd | ms | GB/s (3 passes) | peak beyond inputs MiB | tileops speedup |",
                rows, classes)
    logger.info("|---|---|---|---|---|")
    for name, r in results.items():
        speedup = r["ms"] / results["tileops"]["ms"]
        logger.info("| %s | %.3f | %.0f | %.0f | %.2fx |", name, r["ms"], moved / r["ms"] / 1e6, r["extra_mib"], speedup)


if __name__ == "__main__":
    main()
