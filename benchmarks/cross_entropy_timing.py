"""Cross-entropy forward + backward: tileops vs eager PyTorch vs torch.compile (time and peak memory).

``python -m benchmarks.cross_entropy_timing [--rows 8192] [--classes 131072] [--hidden 0]
[--targets indices|weighted|probabilities] [--probability-dtype bfloat16|float32]`` prints a
Markdown table: median milliseconds of one training step's loss (forward and backward, timed
as ``make bench`` times) and the peak memory allocated during it beyond the inputs.

By default the logits are a leaf tensor that each step gives a gradient.  With ``--hidden H``
each step is a language-model head's: ``logits = hidden @ weight.T`` (``weight`` is
``[classes, H]``), the loss, and the backward into ``hidden`` and ``weight``, so the logits'
gradient is an intermediate as in training.  The ``inplace_backward`` variant writes the
gradient over the logits: the leaf's ``.grad`` is then the logits' own memory, and the lm
head's backward reads it from there.  ``--targets`` picks the loss: class indices (a seventh
of them ignored), the same with class weights, or class probabilities (soft labels, in the
logits' dtype or float32); tileops runs them through ``tileops.nn.CrossEntropyLoss``.  The
GB/s column counts three passes of the logits (and, for probabilities, two of the targets).
"""

import argparse
import functools
import logging
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from benchmarks.timing import CudaBackend, TimingSettings
from tileops.nn import CrossEntropyLoss

logger = logging.getLogger(__name__)

MIB = 1 << 20
TARGETS = ("indices", "weighted", "probabilities")

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def measure(backend: Any, step: Callable[[], None], leaves: Tuple[torch.Tensor, ...]) -> Dict[str, float]:
    """Median ms of ``step`` (the harness's timing) and its peak memory beyond what was allocated before it."""

    def call() -> None:
        step()
        for leaf in leaves:
            leaf.grad = None  # every step starts without gradients, as in training

    return {"ms": backend.time_us([call]) / 1e3, "extra_mib": backend.peak_memory_bytes(call) / MIB}


def losses(classes: int, dtype: torch.dtype, compiler: Callable[[Loss], Loss] = torch.compile,
           weight: Optional[torch.Tensor] = None) -> Dict[str, Loss]:
    """Each variant's loss of ``(logits, target)``: the mean (over kept rows, by their class
    weights where ``weight`` is given)."""
    ours = {inplace: CrossEntropyLoss(weight, inplace_backward=inplace) for inplace in (False, True)}
    reference = functools.partial(F.cross_entropy, weight=weight)
    return {
        "tileops": ours[False],
        "tileops, inplace_backward": ours[True],
        "eager": reference,
        "torch.compile": compiler(reference),
    }


def run(backend: Any, rows: int, classes: int, hidden: int = 0, device: str = "cuda",
        compiler: Callable[[Loss], Loss] = torch.compile, targets: str = "indices",
        probability_dtype: torch.dtype = torch.bfloat16) -> Dict[str, Dict[str, float]]:
    """Every variant's ``measure`` of a bf16 loss step (see the module docstring for ``hidden`` and ``targets``)."""
    if targets not in TARGETS:
        raise ValueError(f"cross_entropy_timing: targets must be one of {TARGETS}, got {targets!r}")
    dtype = torch.bfloat16
    if targets == "probabilities":
        target = torch.softmax(torch.randn(rows, classes, device=device), dim=1).to(probability_dtype)
    else:
        target = torch.randint(0, classes, (rows,), device=device)
        target[::7] = -100
    # PyTorch takes class weights in the logits' dtype.
    weight = torch.rand(classes, device=device, dtype=dtype) + 0.5 if targets == "weighted" else None
    if hidden:
        features = torch.randn(rows, hidden, device=device, dtype=dtype).requires_grad_()
        projection = (torch.randn(classes, hidden, device=device, dtype=dtype) / hidden ** 0.5).requires_grad_()
        leaves: Tuple[torch.Tensor, ...] = (features, projection)

        def logits() -> torch.Tensor:
            return features @ projection.T
    else:
        leaf = torch.randn(rows, classes, device=device, dtype=dtype).requires_grad_()
        leaves = (leaf,)

        def logits() -> torch.Tensor:
            return leaf

    return {name: measure(backend, lambda loss=loss: loss(logits(), target).backward(), leaves)
            for name, loss in losses(classes, dtype, compiler, weight).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--classes", type=int, default=131072)
    parser.add_argument("--hidden", type=int, default=0, help="H > 0: logits = hidden [rows, H] @ weight [classes, H].T")
    parser.add_argument("--targets", choices=TARGETS, default="indices",
                        help="class indices, the same with class weights, or class probabilities")
    parser.add_argument("--probability-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="dtype of the targets of --targets probabilities")
    parser.add_argument("--rep-ms", type=float, default=150.0, help="timed repetitions per variant, in ms")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    backend = CudaBackend(settings=TimingSettings(rep_ms=args.rep_ms))
    probability_dtype = getattr(torch, args.probability_dtype)
    results = run(backend, args.rows, args.classes, args.hidden, targets=args.targets,
                  probability_dtype=probability_dtype)
    # The logits read twice and the gradient written once; probability targets read twice.
    moved = 3 * args.rows * args.classes * torch.bfloat16.itemsize
    if args.targets == "probabilities":
        moved += 2 * args.rows * args.classes * probability_dtype.itemsize
    what = (f"lm head H={args.hidden}" if args.hidden else "fwd+bwd") + f", {args.targets} targets"
    if args.targets == "probabilities":
        what += f" ({args.probability_dtype})"
    logger.info("| %d x %d bfloat16, %s | ms | GB/s | peak beyond inputs MiB | "
                "tileops speedup |", args.rows, args.classes, what)
    logger.info("|---|---|---|---|---|")
    for name, r in results.items():
        speedup = r["ms"] / results["tileops"]["ms"]
        logger.info("| %s | %.3f | %.0f | %.0f | %.2fx |", name, r["ms"], moved / r["ms"] / 1e6, r["extra_mib"], speedup)


if __name__ == "__main__":
    main()
