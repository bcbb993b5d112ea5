"""Scan family timings: tileops vs PyTorch eager vs torch.compile, per manifest workload.

    python -m benchmarks.scan_timing [--ops CumsumBwdOp ...] [--compile-ops ...] [--compile-labels ...]

Measures the device copy bandwidth first (bytes read plus written), then for every
workload of the family's ops: the median device time (L2 flushed before each call),
the achieved bandwidth over the manifest's roofline bytes, its share of the copy
bandwidth, and the speedup over eager PyTorch and, for the bfloat16 workloads of
the ops and labels named, over torch.compile of the same reference.  The reference of
``CumsumBwdOp`` is what autograd of ``torch.cumsum`` computes (flip, cumsum, flip),
so its torch.compile column is the compiled backward of cumsum.  Every tileops
output is checked against the float64 reference first.  Prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks.ceilings import measure_copy_gbps
from benchmarks.family_tables import print_table
from benchmarks.ops import cumprod_fwd as cumprod_entry
from benchmarks.timing import CudaBackend, TimingSettings, rotation_count
from codegen import load_manifest

logger = logging.getLogger("benchmarks.scan_timing")

OPS = ("CumsumFwdOp", "CumsumBwdOp", "CumprodFwdOp")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class Workload:
    op: str
    label: str
    shape: Tuple[int, ...]
    dtype: torch.dtype
    dim: int
    out_dtype: Optional[torch.dtype] = None  # a forward's ``out_dtype`` (the workload's param)


def workloads(ops: Sequence[str] = OPS) -> List[Workload]:
    """Every manifest workload of ``ops``, in manifest order (each scan op has one input)."""
    manifest = load_manifest()
    found = []
    for name in ops:
        spec = manifest.op(name)
        for workload in spec.workloads:
            params = dict(workload.params)
            shape = tuple(dict(workload.shapes)[spec.inputs[0].name])
            out_dtype = DTYPES[params["out_dtype"]] if params.get("out_dtype") else None
            for dtype in workload.dtypes:
                found.append(Workload(name, workload.label, shape, DTYPES[dtype], params.get("dim", -1), out_dtype))
    return found


def build_op(workload: Workload) -> Any:
    import tileops.ops

    return getattr(tileops.ops, workload.op)(N=workload.shape[workload.dim], dtype=workload.dtype, dim=workload.dim,
                                             out_dtype=workload.out_dtype)


def make_input(workload: Workload, seed: int) -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(workload.shape, device="cuda", dtype=torch.float32, generator=generator)
    if workload.op == "CumprodFwdOp":
        # Products of many random normals underflow to zero: inputs stay close to 1.
        x = 1 + cumprod_entry.SPREAD * x
    return x.to(workload.dtype)


def reference_fn(workload: Workload) -> Callable[[torch.Tensor], torch.Tensor]:
    """The manifest reference as a plain function (what eager and torch.compile run)."""
    dim, out_dtype = workload.dim, workload.out_dtype
    if workload.op == "CumsumFwdOp":
        return lambda x: torch.cumsum(x, dim, dtype=out_dtype)
    if workload.op == "CumprodFwdOp":
        return lambda x: torch.cumprod(x, dim, dtype=out_dtype)
    return lambda g: torch.flip(torch.cumsum(torch.flip(g, (dim,)), dim), (dim,))


def relative_error(op: Any, x: torch.Tensor, out: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, the reference in float64."""
    ref = op.reference(x.double())
    return float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def time_workload(backend: CudaBackend, workload: Workload, copy_gbps: float, compiled: bool) -> Dict[str, Any]:
    op = build_op(workload)
    x = make_input(workload, 0)
    error = relative_error(op, x, op(x))
    _, moved = op.eval_roofline(workload.shape)
    sets = [x] + [make_input(workload, seed) for seed in range(1, rotation_count(
        x.numel() * x.element_size(), backend.l2_bytes, 16))]
    reference = reference_fn(workload)
    ours = backend.time_us([lambda t=t: op(t) for t in sets])
    eager = backend.time_us([lambda t=t: reference(t) for t in sets])
    compile_us: Optional[float] = None
    if compiled:
        torch._dynamo.reset()
        compiled_fn = torch.compile(reference, dynamic=False)
        compiled_fn(x)
        compile_us = backend.time_us([lambda t=t: compiled_fn(t) for t in sets])
    gbps = moved / (ours * 1e-6) / 1e9
    return {
        "op": workload.op, "workload": workload.label, "dtype": str(workload.dtype).replace("torch.", ""),
        "error": error, "us": ours, "gbps": gbps, "copy_pct": 100 * gbps / copy_gbps,
        "eager_us": eager, "compile_us": compile_us,
    }


def run(ops: Sequence[str], compile_ops: Sequence[str], compile_labels: Sequence[str]) -> List[Dict[str, Any]]:
    backend = CudaBackend("cuda", TimingSettings(warmup_ms=10.0, rep_ms=60.0))
    copy_gbps = measure_copy_gbps(backend, "cuda", 2**30)
    logger.info("copy bandwidth %.0f GB/s", copy_gbps)
    rows = []
    for workload in workloads(ops):
        compiled = (workload.op in compile_ops and workload.label in compile_labels
                    and workload.dtype == torch.bfloat16)
        rows.append(time_workload(backend, workload, copy_gbps, compiled))
        logger.info("%s", rows[-1])
        torch.cuda.empty_cache()
    print_table(rows, copy_gbps)
    return rows


def inventory(ops: Sequence[str] = OPS) -> List[Tuple[Any, Tuple[int, ...]]]:
    """(kernel, kernel-view shape) of everything ``run`` launches, for compiling ahead (no GPU needed)."""
    found = []
    for workload in workloads(ops):
        op = build_op(workload)
        kernel = op._build_kernel(op.kernel_key, (0,))
        found.append((kernel, kernel_view_shape(workload.shape, workload.dim)))
    return found


def kernel_view_shape(shape: Sequence[int], dim: int) -> Tuple[int, ...]:
    """The ``(rows, N)`` or ``(outer, N, inner)`` view the scan family base hands its kernel."""
    dim = dim % len(shape)
    outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    return (outer, shape[dim]) if inner == 1 else (outer, shape[dim], inner)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS, help="ops to time")
    parser.add_argument("--compile-ops", nargs="*", default=["CumsumBwdOp", "CumprodFwdOp"], choices=OPS,
                        help="ops also timed under torch.compile")
    parser.add_argument("--compile-labels", nargs="*", default=["rows-32k-4k", "long-64x256k"],
                        help="workload labels also timed under torch.compile (bfloat16 only)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    run(args.ops, args.compile_ops, args.compile_labels)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
