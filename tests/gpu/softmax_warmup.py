"""Compile every program the softmax GPU tests and timings launch, in parallel processes.

    python -m tests.gpu.softmax_warmup [--workers 16]

TileLang keeps compiled programs in its on-disk cache, so the tests that run
afterwards load them instead of compiling one after another.  The programs are
found by building each test's ops and inputs on the CPU (same shapes, strides
and alignments) and asking the kernels which programs those inputs launch.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, List, Optional, Sequence, Set, Tuple

import torch

from tests.gpu.warmup import compile_in_parallel, dtypes_field, kernel_dtypes

logger = logging.getLogger("tests.gpu.softmax_warmup")

# (kernel module, kernel class, N, dtype name, config items, program, program params)
Task = Tuple[str, str, int, str, Tuple[Tuple[str, Any], ...], str, Tuple[Tuple[str, int], ...]]


def _task(kernel: Any, name: str, params: Any) -> Task:
    cls = type(kernel)
    return (cls.__module__, cls.__name__, kernel.N, dtypes_field(kernel),
            tuple(sorted(kernel.config.items())), name, params)


def _op_programs(op: Any, inputs: List[torch.Tensor]) -> List[Task]:
    from tileops.ops.softmax.base import kernel_view

    if inputs[0].numel() == 0:
        return []
    inputs = [t.reshape(1) if t.ndim == 0 else t for t in inputs]  # a scalar is a row of one, as the op runs it
    kernel = op._build_kernel(op.kernel_key, (0,))
    dim = op.dim % inputs[0].ndim
    views = [kernel_view(t, dim) for t in inputs]
    out = torch.empty(views[0].shape, dtype=kernel.result_dtype)
    return [_task(kernel, name, params) for name, params in kernel.programs_for(*views, out)]


def inventory() -> List[Task]:
    """Every (kernel, program) the GPU tests and the timing script launch."""
    from benchmarks import softmax_timing
    from tests.gpu import test_softmax as t
    from tests.op_checks import _spec, build_op, make_inputs

    tasks: Set[Task] = set()
    generator = torch.Generator().manual_seed(0)
    for case in t.MANIFEST_CASES:
        shapes = dict(case.shapes)
        if max(math.prod(s) for s in shapes.values()) > 1 << 24:  # workloads: contiguous and aligned
            op = build_op(case)
            kernel = op._build_kernel(op.kernel_key, (0,))
            shape = next(iter(shapes.values()))
            tasks.update(_task(kernel, n, p) for n, p in kernel.program_specs_for(shape, op.dim))
            continue
        tasks.update(_op_programs(build_op(case), make_inputs(_spec(case.op), case, "cpu", generator)))
    for fwd, bwd, _ in t.PAIRS.values():
        for shape, dim, dtype in t.GRAD_CASES:
            x = torch.randn(shape, dtype=dtype)
            tasks.update(_op_programs(t._op(fwd, shape[dim], dtype, dim), [x]))
            tasks.update(_op_programs(t._op(bwd, shape[dim], dtype, dim), [x, x]))
        for shape, dim, dtype in t.MASKED_SHAPES:
            tasks.update(_op_programs(t._op(fwd, shape[dim], dtype, dim), [torch.randn(shape, dtype=dtype)]))
    for name in t.OPS:
        for N, dtype in t.LONG_ROWS:
            x = torch.randn(1, N, dtype=dtype)
            tasks.update(_op_programs(t._op(name, N, dtype, -1), [x] * (2 if name.endswith("BwdOp") else 1)))
        for N in t.HINT_SIZES:
            for dtype in (torch.float16, torch.bfloat16, torch.float32):
                for threshold in t.HINT_THRESHOLDS:
                    _, kernel, inputs = t.hint_case(name, N, dtype, threshold, 3, device="cpu")
                    out = torch.empty(3, N, dtype=dtype)
                    tasks.update(_task(kernel, n, p) for n, p in kernel.programs_for(*inputs, out))
        for N, dtype, rows, _ in t.WINDOWED_ROWS:
            for gap in t.ROW_GAPS:
                _, kernel, inputs = t.windowed_case(name, N, dtype, rows, gap, device="cpu")
                out = torch.empty(rows, N, dtype=dtype)
                tasks.update(_task(kernel, n, p) for n, p in kernel.programs_for(*inputs, out))
            shifted = torch.empty(rows, N + 8, dtype=dtype)[:, 1:N + 1]
            out = torch.empty(rows, N, dtype=dtype)
            tasks.update(_task(kernel, n, p) for n, p in kernel.programs_for(shifted, *inputs[1:], out))
        op, kernel = t._op_and_kernel(name, 4096, torch.bfloat16, **t.TWO_STEP_CONFIG)
        tasks.update(_task(kernel, n, p) for n, p in kernel.program_specs(1))
        if not name.endswith("BwdOp"):
            for N, dtype, stages in t.STAGED_ROWS:
                op, kernel = t._op_and_kernel(name, N, dtype, row_stages=stages)
                tasks.update(_task(kernel, n, p) for n, p in kernel.program_specs(1, outer=1024))
            for N, dtype, stages in t.CLUSTER_STAGED_ROWS:
                op, kernel = t._op_and_kernel(name, N, dtype, cluster_stages=stages)
                tasks.update(_task(kernel, n, p) for n, p in kernel.program_specs(1, outer=1024))
            for N, dtype, row_counts in t.HELD_ROWS:
                op, kernel = t._op_and_kernel(name, N, dtype)
                for rows in row_counts:
                    x, out = torch.empty(rows, N + 8, dtype=dtype)[:, :N], torch.empty(rows, N, dtype=dtype)
                    tasks.update(_task(kernel, n, p) for n, p in kernel.programs_for(x, out))
        for shape, dtype, _ in t.COLUMN_CLUSTERS:
            op, kernel = t._op_and_kernel(name, shape[1], dtype, 1)
            tasks.update(_task(kernel, n, p) for n, p in kernel.program_specs(shape[2], outer=shape[0]))
        for _, x, dim in t.view_cases("cpu"):
            inputs = [x, torch.randn(x.shape, dtype=x.dtype)] if name.endswith("BwdOp") else [x]
            tasks.update(_op_programs(t._op(name, x.shape[dim], x.dtype, dim), inputs))
    for name, N, dtype, rows, threads in t.cluster_cases():
        op, kernel = t._cluster_kernel(name, N, dtype, threads)
        tasks.update(_task(kernel, n, p) for n, p in kernel.program_specs(1, outer=rows))
    for shape, dim in t._big_case_shapes():
        for name in t.OPS:
            op = t._op(name, shape[dim], torch.bfloat16, dim)
            kernel = op._build_kernel(op.kernel_key, (0,))
            tasks.update(_task(kernel, n, p) for n, p in kernel.program_specs_for(shape, dim))
    for kernel, specs in softmax_timing.inventory():
        tasks.update(_task(kernel, n, p) for n, p in specs)
    return sorted(tasks, key=repr)


def compile_one(task: Task) -> float:
    import importlib

    module, cls_name, N, dtype, config, name, params = task
    began = time.perf_counter()
    cls = getattr(importlib.import_module(module), cls_name)
    cls(N, **kernel_dtypes(dtype), config=dict(config)).compile_program(name, params)
    return time.perf_counter() - began


def main(argv: Optional[Sequence[str]] = None) -> int:
    return compile_in_parallel(__doc__, inventory, compile_one, argv)


if __name__ == "__main__":
    raise SystemExit(main())
