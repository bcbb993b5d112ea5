"""Softmax family timings: tileops vs PyTorch eager vs torch.compile, per manifest workload.

    python -m benchmarks.softmax_timing [--compile-labels rows-32k-4k rows-8k-32k] [--sweep]

Measures the device copy bandwidth first (bytes read plus written), then for every
workload of the four ops: the median device time (L2 flushed before each call), the
achieved bandwidth over the manifest's roofline bytes, its share of the copy
bandwidth, and the speedup over eager PyTorch and, for the bfloat16 workloads with
the labels named, over torch.compile of the same reference.  Every tileops output is checked against the
float64 reference first.  ``--sweep`` also times candidate row configs of the main
workloads (to pick the heuristics).  Prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks.ceilings import measure_copy_gbps
from benchmarks.family_tables import print_table
from benchmarks.timing import CudaBackend, TimingSettings, rotation_count
from codegen import load_manifest

logger = logging.getLogger("benchmarks.softmax_timing")

OPS = ("SoftmaxFwdOp", "LogSoftmaxFwdOp", "SoftmaxBwdOp", "LogSoftmaxBwdOp")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Row configs tried by --sweep: (op, N, dtype) -> configs (partial; the rest is the heuristic).
SWEEPS: Dict[Tuple[str, int, torch.dtype], List[Dict[str, int]]] = {
    ("SoftmaxFwdOp", 4096, torch.bfloat16): [
        {"row_threads": 128, "block_threads": 128},
        {"row_threads": 256, "block_threads": 256},
        {"row_threads": 512, "block_threads": 512},
        {"row_threads": 256, "block_threads": 256, "cache_exp": 0},
    ],
    ("SoftmaxFwdOp", 32768, torch.bfloat16): [
        {"row_threads": 1024, "block_threads": 1024, "cache_exp": 1},
        {"row_threads": 1024, "block_threads": 1024, "cache_exp": 0},
    ],
    ("SoftmaxBwdOp", 4096, torch.bfloat16): [
        {"row_threads": 128, "block_threads": 128},
        {"row_threads": 256, "block_threads": 256},
        {"row_threads": 512, "block_threads": 512},
    ],
}


@dataclass(frozen=True)
class Workload:
    op: str
    label: str
    shapes: Tuple[Tuple[int, ...], ...]
    dtype: torch.dtype
    dim: int
    out_dtype: Optional[torch.dtype] = None  # a forward's ``out_dtype`` (the workload's param)


def workloads() -> List[Workload]:
    """Every manifest workload of the family's ops, in manifest order."""
    manifest = load_manifest()
    found = []
    for name in OPS:
        spec = manifest.op(name)
        for workload in spec.workloads:
            params = dict(workload.params)
            shapes = tuple(tuple(dict(workload.shapes)[t.name]) for t in spec.inputs)
            out_dtype = DTYPES[params["out_dtype"]] if params.get("out_dtype") else None
            for dtype in workload.dtypes:
                found.append(Workload(name, workload.label, shapes, DTYPES[dtype], params.get("dim", -1), out_dtype))
    return found


def build_op(workload: Workload):
    import tileops.ops

    shape = workload.shapes[0]
    return getattr(tileops.ops, workload.op)(N=shape[workload.dim], dtype=workload.dtype, dim=workload.dim,
                                             out_dtype=workload.out_dtype)


def make_inputs(workload: Workload, seed: int) -> List[torch.Tensor]:
    """Random inputs; a backward op gets a real forward output as ``y``."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    shape = workload.shapes[0]
    x = torch.randn(shape, device="cuda", dtype=workload.dtype, generator=generator)
    if not workload.op.endswith("BwdOp"):
        return [x]
    fn = torch.log_softmax if workload.op.startswith("Log") else torch.softmax
    y = fn(torch.randn(shape, device="cuda", dtype=torch.float32, generator=generator), workload.dim)
    return [x, y.to(workload.dtype)]


def reference_fn(workload: Workload) -> Callable[..., torch.Tensor]:
    """The manifest reference as a plain function (what eager and torch.compile run)."""
    dim, out_dtype = workload.dim, workload.out_dtype
    if workload.op == "SoftmaxFwdOp":
        return lambda x: torch.softmax(x, dim, dtype=out_dtype)
    if workload.op == "LogSoftmaxFwdOp":
        return lambda x: torch.log_softmax(x, dim, dtype=out_dtype)
    if workload.op == "SoftmaxBwdOp":
        return lambda g, y: torch._softmax_backward_data(g, y, dim, y.dtype)
    return lambda g, y: torch._log_softmax_backward_data(g, y, dim, y.dtype)


def check(op: Any, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, the reference in float64."""
    ref = op.reference(*(t.double() for t in inputs))
    return float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def time_calls(backend: CudaBackend, fn: Callable[..., Any], input_sets: Sequence[Sequence[torch.Tensor]]) -> float:
    return backend.time_us([lambda inputs=inputs: fn(*inputs) for inputs in input_sets])


def run(compile_labels: Sequence[str], sweep: bool) -> List[Dict[str, Any]]:
    backend = CudaBackend("cuda", TimingSettings(warmup_ms=10.0, rep_ms=60.0))
    copy_gbps = measure_copy_gbps(backend, "cuda", 2**30)
    logger.info("copy bandwidth %.0f GB/s", copy_gbps)
    rows: List[Dict[str, Any]] = []
    for workload in workloads():
        op = build_op(workload)
        inputs = make_inputs(workload, 0)
        error = check(op, inputs, op(*inputs))
        flops, moved = op.eval_roofline(*(tuple(s) for s in workload.shapes))
        set_bytes = sum(t.numel() * t.element_size() for t in inputs)
        input_sets = [inputs] + [make_inputs(workload, seed)
                                 for seed in range(1, rotation_count(set_bytes, backend.l2_bytes, 16))]
        reference = reference_fn(workload)
        ours = time_calls(backend, op, input_sets)
        eager = time_calls(backend, reference, input_sets)
        compiled: Optional[float] = None
        if workload.label in compile_labels and workload.dtype == torch.bfloat16:
            torch._dynamo.reset()
            compiled_fn = torch.compile(reference, dynamic=False)
            compiled_fn(*inputs)
            compiled = time_calls(backend, compiled_fn, input_sets)
        host = backend.loop_us([lambda inputs=inputs: op(*inputs) for inputs in input_sets])
        row = {
            "op": workload.op, "workload": workload.label, "dtype": str(workload.dtype).replace("torch.", ""),
            "error": error, "us": ours, "loop_us": host, "gbps": moved / (ours * 1e-6) / 1e9,
            "copy_pct": 100 * moved / (ours * 1e-6) / 1e9 / copy_gbps, "eager_us": eager, "compile_us": compiled,
        }
        rows.append(row)
        logger.info("%s", row)
        del inputs, input_sets
        torch.cuda.empty_cache()
    if sweep:
        rows += run_sweeps(backend, copy_gbps)
    print_table(rows, copy_gbps)
    return rows


def run_sweeps(backend: CudaBackend, copy_gbps: float) -> List[Dict[str, Any]]:
    """Time each swept row config on the (rows, N) workload with the same N."""
    rows = []
    for (name, N, dtype), configs in SWEEPS.items():
        workload = next(w for w in workloads() if w.op == name and w.shapes[0][-1] == N and w.dtype == dtype)
        op = build_op(workload)
        inputs = make_inputs(workload, 0)
        out = torch.empty_like(inputs[0])
        _, moved = op.eval_roofline(*(tuple(s) for s in workload.shapes))
        for config in configs:
            kernel = op.kernel_map[op.kernel_key](N, dtype, config=config)
            kernel(*inputs, out)
            error = check(op, inputs, out)
            micros = time_calls(backend, kernel, [[*inputs, out]])
            rows.append({
                "op": name, "workload": f"{workload.label} {config}", "dtype": str(dtype).replace("torch.", ""),
                "error": error, "us": micros, "loop_us": None, "gbps": moved / (micros * 1e-6) / 1e9,
                "copy_pct": 100 * moved / (micros * 1e-6) / 1e9 / copy_gbps, "eager_us": None, "compile_us": None,
            })
            logger.info("%s", rows[-1])
        del inputs, out
        torch.cuda.empty_cache()
    return rows


def inventory() -> List[Tuple[Any, List[Tuple[str, Any]]]]:
    """(kernel, programs) of everything ``run`` launches, for compiling ahead (no GPU needed)."""
    found = []
    for workload in workloads():
        op = build_op(workload)
        kernel = op._build_kernel(op.kernel_key, (0,))
        found.append((kernel, kernel.program_specs_for(workload.shapes[0], workload.dim)))
    for (name, N, dtype), configs in SWEEPS.items():
        for config in configs:
            op = build_op(Workload(name, "", ((1, N),), dtype, -1))
            kernel = op.kernel_map[op.kernel_key](N, dtype, config=config)
            found.append((kernel, kernel.program_specs(1)))
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-labels", nargs="*", default=["rows-32k-4k", "rows-8k-32k"],
                        help="workload labels also timed under torch.compile")
    parser.add_argument("--sweep", action="store_true", help="also time candidate row configs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    run(args.compile_labels, args.sweep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
