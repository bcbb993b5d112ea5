"""Launch one manifest case's op inside a profiler range, after its build and warm-up calls.

    ncu --clock-control none --profile-from-start off --set full -o REPORT \\
        python3 -m benchmarks.profile_call --op LayerNormBwdOp --workload wide-32k --dtype bfloat16 \\
        [--config '{"cluster_stage": 0}'] [--kernel LABEL] [--shape x=8192x32768 ...] [--param JSON] \\
        [--warmup 3] [--calls 1]

A profiler that follows the CUDA profiler API (``ncu --profile-from-start off``, ``nsys profile
--capture-range=cudaProfilerApi``) then sees the profiled calls alone: not TileLang's compile, the
warm-up, or the inputs' set-up.  The op and its inputs are the bench's (``find_case``, reshaped as
``config_sweep`` reshapes them); ``--config`` replaces keys of the op's kernel's config (``--kernel``
picks one where the op builds several) before the warm-up.  ``ncu -i REPORT --page source --csv
--print-source sass`` then gives each instruction's warp stall samples.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Callable, Dict, Optional, Sequence

from .config_sweep import SweepRecipe, configured_call, parse_shape
from .runner import RunContext
from .workloads import Case

__all__ = ["CudaProfilerRange", "profile_calls", "main"]

logger = logging.getLogger(__name__)


class CudaProfilerRange:
    """``cudaProfilerStart`` / ``cudaProfilerStop``: what ``--profile-from-start off`` waits for."""

    def start(self) -> None:
        import torch

        torch.cuda.cudart().cudaProfilerStart()

    def stop(self) -> None:
        import torch

        torch.cuda.cudart().cudaProfilerStop()


def profile_calls(case: Case, ctx: RunContext, profiler: Any, config: Optional[Dict[str, Any]] = None,
                  kernel_label: Optional[str] = None, warmup: int = 3, calls: int = 1,
                  synchronize: Callable[[], None] = lambda: None) -> Dict[str, Any]:
    """Build ``case``'s op, switch its kernel to ``config`` (keys to replace) if given, run it
    ``warmup`` times, then ``calls`` times between ``profiler.start()`` and ``profiler.stop()``
    (``synchronize`` waits for the device before each); returns the kernel config it ran under."""
    if warmup < 0 or calls < 1:
        raise ValueError(f"profile_call: warmup must be >= 0 and calls >= 1, got {warmup} and {calls}")
    call, kernel = configured_call(case, ctx, config, kernel_label)
    for _ in range(warmup):
        call()
    synchronize()
    profiler.start()
    try:
        for _ in range(calls):
            call()
        synchronize()
    finally:
        profiler.stop()
    return dict(kernel.config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", required=True, help="op class name")
    parser.add_argument("--workload", required=True, help="manifest workload label")
    parser.add_argument("--dtype", required=True, help="dtype name, e.g. bfloat16")
    parser.add_argument("--config", type=json.loads, default=None, metavar="JSON",
                        help="keys to replace in the kernel's config")
    parser.add_argument("--kernel", help="which of the op's kernels (its kernel key), when it builds several")
    parser.add_argument("--shape", action="append", default=[], type=parse_shape, metavar="NAME=D0xD1...",
                        help="give the workload's tensor this shape (repeatable)")
    parser.add_argument("--param", type=json.loads, default={}, metavar="JSON",
                        help="params of the workload to replace, e.g. '{\"dim\": [0]}'")
    parser.add_argument("--warmup", type=int, default=3, help="calls before the profiled ones")
    parser.add_argument("--calls", type=int, default=1, help="calls inside the profiler range")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    if not torch.cuda.is_available():
        print("python -m benchmarks.profile_call needs a CUDA device", file=sys.stderr)
        return 2
    if not isinstance(args.param, dict):
        print(f"--param wants a JSON object, got {args.param!r}", file=sys.stderr)
        return 2
    recipe = SweepRecipe(args.op, args.workload, args.dtype, tuple(args.shape), tuple(args.param.items()), args.kernel)
    try:
        manifest, case = recipe.case()
    except (LookupError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    ctx = RunContext(manifest, None, torch.device("cuda"), generator=torch.Generator("cuda").manual_seed(args.seed))
    config = profile_calls(case, ctx, CudaProfilerRange(), args.config, args.kernel, args.warmup, args.calls,
                           torch.cuda.synchronize)
    logger.info("profiled %d call(s) of %s under %s", args.calls, case.label, json.dumps(config, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
