"""Norm family timings: tileops vs PyTorch eager vs torch.compile, per manifest workload.

    python -m benchmarks.norm_timing [--dtypes bfloat16] [--compile-labels llama-4k wide-32k]
                                     [--compile-backward] [--sweep]

Measures the device copy bandwidth first (bytes read plus written), then for
every workload of the family's ops: the median device time (L2 flushed before
each call), the achieved bandwidth over the manifest's roofline bytes, its
share of the copy bandwidth, and the speedup over eager PyTorch and, for the
workloads with the labels named, over torch.compile (forward ops only, unless
``--compile-backward``).  Baselines: a forward's
manifest reference; for a backward, eager is autograd's backward of the
forward reference (PyTorch's own backward kernels) and torch.compile compiles
the backward's manifest reference.  Every tileops output is checked against
the float64 reference first.  ``--sweep`` also times other configs of the main
workloads' kernels.  Prints a Markdown table last.
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

logger = logging.getLogger("benchmarks.norm_timing")

OPS = ("LayerNormFwdOp", "FusedAddRMSNormFwdOp", "RMSNormBwdOp", "LayerNormBwdOp")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Kernel configs tried by --sweep: (op, label) -> partial configs (the rest is the heuristic).
SWEEPS: Dict[Tuple[str, str], List[Dict[str, int]]] = {
    ("LayerNormFwdOp", "wide-32k"): [{"per_thread": 64, "stream_threads": 512, "stream_unroll": 2}],
    ("RMSNormBwdOp", "llama-4k"): [{"per_thread": 8}],
    ("LayerNormBwdOp", "llama-4k"): [{"per_thread": 8}],
    ("LayerNormBwdOp", "wide-32k"): [{"stream_threads": 1024, "stream_unroll": 2}],
}


@dataclass(frozen=True)
class Workload:
    op: str
    label: str
    shapes: Tuple[Tuple[int, ...], ...]
    dtype: torch.dtype

    @property
    def N(self) -> int:
        return self.shapes[0][-1]


def workloads(dtypes: Sequence[str]) -> List[Workload]:
    """Every manifest workload of the family's ops in the given dtypes, in manifest order."""
    manifest = load_manifest()
    found = []
    for name in OPS:
        spec = manifest.op(name)
        for workload in spec.workloads:
            shapes = tuple(tuple(dict(workload.shapes)[t.name]) for t in spec.inputs)
            for dtype in workload.dtypes:
                if dtype in dtypes:
                    found.append(Workload(name, workload.label, shapes, DTYPES[dtype]))
    return found


def build_op(workload: Workload, **kwargs: Any) -> Any:
    import tileops.ops

    return getattr(tileops.ops, workload.op)(N=workload.N, dtype=workload.dtype, **kwargs)


def make_inputs(workload: Workload, seed: int) -> List[torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(shape, device="cuda", dtype=workload.dtype, generator=generator) for shape in workload.shapes]


def _forward_reference(op_name: str, N: int) -> Callable[..., Any]:
    F = torch.nn.functional
    if op_name.startswith("LayerNorm"):
        return lambda x, w, b=None: F.layer_norm(x, (N,), w, b, 1e-5)
    if op_name.startswith("FusedAdd"):
        return lambda x, r, w: (F.rms_norm(x + r, (N,), w, 1e-6), x + r)
    return lambda x, w: F.rms_norm(x, (N,), w, 1e-6)


def eager_fn(workload: Workload, op: Any, inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """What PyTorch runs eagerly for this op: the forward reference, or autograd's backward of it."""
    if not workload.op.endswith("BwdOp"):
        return _forward_reference(workload.op, workload.N)
    grad_y, x, weight = inputs
    leaves = [x.detach().requires_grad_(), weight.detach().requires_grad_()]
    extra = [torch.zeros_like(weight, requires_grad=True)] if workload.op.startswith("LayerNorm") else []
    y = _forward_reference(workload.op, workload.N)(*leaves, *extra)
    graph_inputs = leaves + extra
    return lambda g, *_: torch.autograd.grad(y, graph_inputs, g, retain_graph=True)


def relative_error(op: Any, inputs: Sequence[torch.Tensor], outputs: Any) -> float:
    """Largest max|out - ref| / max|ref| over the outputs, the reference in float64."""
    references = op.reference(*(t.double() for t in inputs))
    references = references if isinstance(references, tuple) else (references,)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return max(float((o.double() - r).abs().max() / r.abs().max().clamp_min(1e-30))
               for o, r in zip(outputs, references))


def time_calls(backend: CudaBackend, fn: Callable[..., Any], input_sets: Sequence[Sequence[torch.Tensor]]) -> float:
    return backend.time_us([lambda inputs=inputs: fn(*inputs) for inputs in input_sets])


def _row(workload: Workload, label: str, error: float, micros: float, moved: int, copy_gbps: float,
         **extra: Optional[float]) -> Dict[str, Any]:
    gbps = moved / (micros * 1e-6) / 1e9
    return {"op": workload.op, "workload": label, "dtype": str(workload.dtype).replace("torch.", ""), "error": error,
            "us": micros, "gbps": gbps, "copy_pct": 100 * gbps / copy_gbps, "loop_us": None, "eager_us": None,
            "compile_us": None, **extra}


def time_workload(backend: CudaBackend, workload: Workload, copy_gbps: float, compile_labels: Sequence[str],
                  compile_backward: bool) -> Dict[str, Any]:
    op = build_op(workload)
    inputs = make_inputs(workload, 0)
    error = relative_error(op, inputs, op(*inputs))
    _, moved = op.eval_roofline(*workload.shapes)
    set_bytes = sum(t.numel() * t.element_size() for t in inputs)
    input_sets = [inputs] + [make_inputs(workload, seed)
                             for seed in range(1, rotation_count(set_bytes, backend.l2_bytes, 16))]
    ours = time_calls(backend, op, input_sets)
    eager = time_calls(backend, eager_fn(workload, op, inputs), input_sets)
    compiled: Optional[float] = None
    if workload.label in compile_labels and (compile_backward or not workload.op.endswith("BwdOp")):
        torch._dynamo.reset()
        reference = op.reference if workload.op.endswith("BwdOp") else _forward_reference(workload.op, workload.N)
        compiled_fn = torch.compile(reference, dynamic=False)
        compiled_fn(*inputs)
        compiled = time_calls(backend, compiled_fn, input_sets)
    host = backend.loop_us([lambda inputs=inputs: op(*inputs) for inputs in input_sets])
    return _row(workload, workload.label, error, ours, moved, copy_gbps, loop_us=host, eager_us=eager,
                compile_us=compiled)


def sweep_configs(backend: CudaBackend, workload: Workload, configs: Sequence[Dict[str, int]],
                  copy_gbps: float) -> List[Dict[str, Any]]:
    """Time each config of the op's kernel on preallocated outputs."""
    op = build_op(workload)
    inputs = make_inputs(workload, 0)
    _, moved = op.eval_roofline(*workload.shapes)
    expected = op(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    rows = []
    for config in configs:
        kernel = op.kernel_map[op.kernel_key](workload.N, workload.dtype, eps=op.eps, config=config)
        outputs = [torch.empty_like(t) for t in expected]
        # Kernels take (rows, N) row tensors and (N,) vectors: the op's inputs, then its outputs.
        args = [t.view(-1, workload.N) if t.ndim > 1 else t for t in (*inputs, *outputs)]
        kernel.forward(*args)
        error = relative_error(op, inputs, tuple(o.view(e.shape) for o, e in zip(outputs, expected)))
        micros = time_calls(backend, kernel.forward, [args])
        rows.append(_row(workload, f"{workload.label} {config}", error, micros, moved, copy_gbps))
        logger.info("%s", rows[-1])
    return rows


def run(dtypes: Sequence[str], compile_labels: Sequence[str], compile_backward: bool,
        sweep: bool) -> List[Dict[str, Any]]:
    backend = CudaBackend("cuda", TimingSettings(warmup_ms=10.0, rep_ms=40.0))
    copy_gbps = measure_copy_gbps(backend, "cuda", 2**30)
    logger.info("copy bandwidth %.0f GB/s", copy_gbps)
    rows: List[Dict[str, Any]] = []
    for workload in workloads(dtypes):
        try:
            rows.append(time_workload(backend, workload, copy_gbps, compile_labels, compile_backward))
        except Exception:  # noqa: BLE001 - report the failure and go on with the other workloads
            logger.exception("timing %s %s failed", workload.op, workload.label)
            continue
        logger.info("%s", rows[-1])
        torch.cuda.empty_cache()
    if sweep:
        for (name, label), configs in SWEEPS.items():
            workload = next((w for w in workloads(dtypes) if w.op == name and w.label == label), None)
            if workload is not None:
                rows += sweep_configs(backend, workload, configs, copy_gbps)
                torch.cuda.empty_cache()
    print_table(rows, copy_gbps)
    return rows


def inventory(dtypes: Sequence[str] = ("bfloat16",), sweep: bool = True) -> List[Tuple[Any, Dict[str, Any]]]:
    """(kernel, program variant flags) of everything ``run`` launches, for compiling ahead (no GPU needed)."""
    found: List[Tuple[Any, Dict[str, Any]]] = []
    for workload in workloads(dtypes):
        op = build_op(workload)
        found.append((op._build_kernel(op.kernel_key, (0,)), {}))
    if sweep:
        for (name, label), configs in SWEEPS.items():
            workload = next((w for w in workloads(dtypes) if w.op == name and w.label == label), None)
            if workload is None:
                continue
            op = build_op(workload)
            for config in configs:
                found.append((op.kernel_map[op.kernel_key](workload.N, workload.dtype, eps=op.eps, config=config), {}))
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="*", default=["bfloat16"], help="workload dtypes to time")
    parser.add_argument("--compile-labels", nargs="*", default=["llama-4k", "wide-32k"],
                        help="workload labels also timed under torch.compile")
    parser.add_argument("--compile-backward", action="store_true",
                        help="also time backward ops' references under torch.compile")
    parser.add_argument("--sweep", action="store_true", help="also time other kernel configs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    run(args.dtypes, args.compile_labels, args.compile_backward, args.sweep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
