"""Elementwise family timings: tileops vs PyTorch eager vs torch.compile, per manifest workload.

    python -m benchmarks.elementwise_timing [--compile WORKLOAD ...] [--sweep] [--ops OP ...]

Measures the device copy bandwidth first (bytes read plus written), then for
every workload of the family's ops: the median device time (L2 flushed before
each call), the achieved bandwidth over the manifest's roofline bytes, its
share of the copy bandwidth, and the speedup over eager PyTorch and, for the
workloads named with ``--compile`` (``Op/label``), over torch.compile of the
same reference.  Every tileops output is checked against the float64
reference first.  ``--sweep`` also times candidate ``{threads, unroll}``
configs of the main kernels on their large workloads.  Prints a Markdown
table last.
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
from benchmarks.timing import CudaBackend, TimingSettings, rotation_count
from codegen import load_manifest

logger = logging.getLogger("benchmarks.elementwise_timing")

FAMILY = "elementwise"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Workloads also timed under torch.compile by default (inductor compiles take seconds each).
DEFAULT_COMPILE = (
    "SiluAndMulFwdOp/llama-16k-11008", "SiluAndMulBwdOp/llama-16k-11008", "SiluFwdOp/large-8k-16k",
    "AddFwdOp/bias-8k-16k",
)
# Configs tried by --sweep on the (op, workload) named; the heuristic is timed in the main table.
SWEEP_CONFIGS = [{"threads": 128, "unroll": 4}, {"threads": 256, "unroll": 4}, {"threads": 256, "unroll": 8},
                 {"threads": 512, "unroll": 2}, {"threads": 512, "unroll": 4}]
# Workloads smaller than this are correctness probes (odd sizes), not worth a timing row.
MIN_TIMED_ELEMENTS = 4096
SWEEP_WORKLOADS = (("SiluFwdOp", "large-8k-16k"), ("AddFwdOp", "large-8k-16k"),
                   ("SiluAndMulFwdOp", "llama-16k-11008"), ("SiluAndMulBwdOp", "llama-16k-11008"))


@dataclass(frozen=True)
class Workload:
    op: str
    label: str
    shapes: Tuple[Tuple[int, ...], ...]
    dtype: torch.dtype
    params: Tuple[Tuple[str, Any], ...]

    @property
    def key(self) -> str:
        return f"{self.op}/{self.label}"


def workloads(ops: Optional[Sequence[str]] = None) -> List[Workload]:
    """Every manifest workload of the family's ops, in manifest order."""
    found = []
    for spec in load_manifest().family(FAMILY):
        if ops and spec.name not in ops:
            continue
        for workload in spec.workloads:
            shapes = tuple(tuple(dict(workload.shapes)[t.name]) for t in spec.inputs)
            if max(math.prod(shape) for shape in shapes) < MIN_TIMED_ELEMENTS:
                continue
            for dtype in workload.dtypes:
                found.append(Workload(spec.name, workload.label, shapes, DTYPES[dtype], workload.params))
    return found


def build_op(workload: Workload) -> Any:
    import tileops.ops

    static = {"N": workload.shapes[-1][-1]} if "AndMul" in workload.op else {}
    return getattr(tileops.ops, workload.op)(dtype=workload.dtype, **static, **dict(workload.params))


def make_inputs(workload: Workload, seed: int, device: str = "cuda") -> List[torch.Tensor]:
    if device == "meta":
        return [torch.empty(shape, device=device, dtype=workload.dtype) for shape in workload.shapes]
    generator = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(shape, device=device, dtype=workload.dtype, generator=generator) for shape in workload.shapes]


def check(op: Any, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, the reference in float64."""
    ref = op.reference(*(t.double() for t in inputs))
    error = float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    del ref
    return error


def time_calls(backend: CudaBackend, fn: Callable[..., Any], input_sets: Sequence[Sequence[torch.Tensor]]) -> float:
    return backend.time_us([lambda inputs=inputs: fn(*inputs) for inputs in input_sets])


def _row(workload: Workload, label: str, error: float, micros: float, moved: int, copy_gbps: float,
         eager: Optional[float] = None, compiled: Optional[float] = None) -> Dict[str, Any]:
    gbps = moved / (micros * 1e-6) / 1e9
    return {"op": workload.op, "workload": label, "dtype": str(workload.dtype).replace("torch.", ""),
            "error": error, "us": micros, "gbps": gbps, "copy_pct": 100 * gbps / copy_gbps,
            "eager_us": eager, "compile_us": compiled}


def run(ops: Optional[Sequence[str]], compile_keys: Sequence[str], sweep: bool) -> List[Dict[str, Any]]:
    backend = CudaBackend("cuda", TimingSettings(warmup_ms=10.0, rep_ms=60.0))
    copy_gbps = measure_copy_gbps(backend, "cuda", 2**30)
    logger.info("copy bandwidth %.0f GB/s", copy_gbps)
    rows: List[Dict[str, Any]] = []
    for workload in workloads(ops):
        try:
            rows.append(time_workload(backend, workload, copy_gbps, workload.key in compile_keys))
        except Exception:  # noqa: BLE001 - one failing workload must not hide the others' numbers
            logger.exception("%s %s failed", workload.key, workload.dtype)
        torch.cuda.empty_cache()
    if sweep:
        rows += run_sweeps(backend, copy_gbps)
    print_table(rows, copy_gbps)
    return rows


def time_workload(backend: CudaBackend, workload: Workload, copy_gbps: float, with_compile: bool) -> Dict[str, Any]:
    op = build_op(workload)
    inputs = make_inputs(workload, 0)
    error = check(op, inputs, op(*inputs))
    _, moved = op.eval_roofline(*workload.shapes)
    set_bytes = sum(t.numel() * t.element_size() for t in inputs)
    input_sets = [inputs] + [make_inputs(workload, seed)
                             for seed in range(1, rotation_count(set_bytes, backend.l2_bytes, 16))]
    ours = time_calls(backend, op, input_sets)
    eager = time_calls(backend, op.reference, input_sets)
    compiled: Optional[float] = None
    if with_compile:
        torch._dynamo.reset()
        compiled_fn = torch.compile(op.reference, dynamic=False)
        compiled_fn(*inputs)
        compiled = time_calls(backend, compiled_fn, input_sets)
    row = _row(workload, workload.label, error, ours, moved, copy_gbps, eager, compiled)
    logger.info("%s", row)
    return row


def _sweep_workloads() -> List[Workload]:
    wanted = {f"{op}/{label}" for op, label in SWEEP_WORKLOADS}
    return [w for w in workloads() if w.key in wanted and w.dtype == torch.bfloat16]


def _kernel_call(op: Any, inputs: List[torch.Tensor]) -> Tuple[List[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The kernel-level arguments of an op call on contiguous inputs: (inputs, out), and out at the op's shape."""
    out_shape = op._infer_output_shapes(*(tuple(t.shape) for t in inputs))
    out = torch.empty(next(iter(out_shape.values())), dtype=inputs[0].dtype, device=inputs[0].device)
    if "AndMul" in type(op).__name__:
        widths = [t.shape[-1] for t in inputs]
        return [t.view(-1, w) for t, w in zip(inputs, widths)], out.view(-1, out.shape[-1]), out
    return [t.view(-1) for t in inputs], out.view(-1), out


def _sweep_kernels(workload: Workload) -> List[Any]:
    op = build_op(workload)
    kernel_cls = op.kernel_map[op.kernel_key]
    params = {name: getattr(op, name) for name in kernel_cls.op_params}
    return [kernel_cls(dtype=workload.dtype, config=config, **params) for config in SWEEP_CONFIGS]


def run_sweeps(backend: CudaBackend, copy_gbps: float) -> List[Dict[str, Any]]:
    """Time each candidate config directly on the kernel, on the large workloads."""
    rows = []
    for workload in _sweep_workloads():
        op = build_op(workload)
        inputs = make_inputs(workload, 0)
        args, out, result = _kernel_call(op, inputs)
        _, moved = op.eval_roofline(*workload.shapes)
        for kernel in _sweep_kernels(workload):
            out.fill_(float("nan"))
            kernel(*args, out)
            error = check(op, inputs, result)
            micros = time_calls(backend, kernel, [[*args, out]])
            rows.append(_row(workload, f"{workload.label} {kernel.config}", error, micros, moved, copy_gbps))
            logger.info("%s", rows[-1])
        del inputs, args, out, result
        torch.cuda.empty_cache()
    return rows


def meta_calls() -> List[Tuple[Any, List[torch.Tensor]]]:
    """(op, meta inputs) of every op call ``run`` makes, for compiling ahead (no GPU needed)."""
    return [(build_op(w), make_inputs(w, 0, "meta")) for w in workloads()]


def sweep_tasks() -> List[Tuple[Any, ...]]:
    """Warm-up tasks of the sweep's kernels (see ``tests.gpu.elementwise_warmup``)."""
    from tests.gpu.elementwise_warmup import kernel_task

    tasks = []
    for workload in _sweep_workloads():
        for kernel in _sweep_kernels(workload):
            tasks.extend(kernel_task(kernel, spec, config) for spec, config in kernel.typical_programs())
    return tasks


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="*", help="only these ops")
    parser.add_argument("--compile", nargs="*", default=list(DEFAULT_COMPILE),
                        help="Op/label workloads also timed under torch.compile")
    parser.add_argument("--sweep", action="store_true", help="also time candidate configs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    run(args.ops, args.compile, args.sweep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
