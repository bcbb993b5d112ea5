"""Compile every program the scan GPU tests and timings launch, in parallel processes.

    python -m tests.gpu.scan_warmup [--workers 16]

TileLang keeps compiled programs in its on-disk cache, so the tests that run
afterwards load them instead of compiling one after another.  The programs are
found by building each test's ops on the CPU and asking their kernels which
programs an input of the test's shape launches.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Sequence, Tuple

import torch

from tests.gpu.warmup import compile_in_parallel, dtypes_field, kernel_dtypes

logger = logging.getLogger("tests.gpu.scan_warmup")

# (kernel module, kernel class, N, dtype name, config items, program)
Task = Tuple[str, str, int, str, Tuple[Tuple[str, Any], ...], str]


def _tasks(kernel: Any, view_shape: Tuple[int, ...]) -> List[Task]:
    cls = type(kernel)
    config = tuple(sorted(kernel.config.items()))
    dtype = dtypes_field(kernel)
    return [(cls.__module__, cls.__name__, kernel.N, dtype, config, name) for name in kernel.programs_for(view_shape)]


def _op_tasks(op_name: str, shape: Tuple[int, ...], dtype: torch.dtype, dim: int,
              out_dtype: Optional[torch.dtype] = None) -> List[Task]:
    import tileops.ops
    from benchmarks.scan_timing import kernel_view_shape

    if 0 in shape:
        return []
    shape = shape or (1,)  # a scalar scans as a row of one, as the op runs it
    op = getattr(tileops.ops, op_name)(N=shape[dim], dtype=dtype, dim=dim, out_dtype=out_dtype)
    kernel = op._build_kernel(op.kernel_key, (0,))
    return _tasks(kernel, kernel_view_shape(shape, dim))


def inventory() -> List[Task]:
    """Every (kernel, program) the scan GPU tests and ``benchmarks.scan_timing`` launch."""
    from benchmarks import scan_timing
    from tests.gpu import test_scan_extra as t
    from tests.op_checks import manifest_cases

    tasks: List[Task] = []
    for op_name in ("CumsumFwdOp", "CumsumBwdOp", "CumprodFwdOp"):
        for case in manifest_cases(op_name):
            shape = dict(case.shapes)[next(iter(dict(case.shapes)))]
            params = dict(case.params)
            tasks += _op_tasks(op_name, shape, case.dtype, params.get("dim", -1), params.get("out_dtype"))
    for length in t.LENGTHS:
        for dim in (0, 1, 2):
            tasks += _op_tasks("CumsumBwdOp", t.axis_shape(length, dim), torch.float32, dim)
        for dtype in t.DTYPES:
            for rows in (1, 5, 300):
                tasks += _op_tasks("CumsumBwdOp", (rows, length), dtype, -1)
                tasks += _op_tasks("CumprodFwdOp", (rows, length), dtype, -1)
    for dim in (0, 1, 2):
        for op_name in ("CumsumFwdOp", "CumsumBwdOp"):
            tasks += _op_tasks(op_name, t.axis_shape(4097, dim), torch.float32, dim)
        for length in (3, 127, 4097, 65537):
            tasks += _op_tasks("CumprodFwdOp", t.axis_shape(length, dim), torch.float32, dim)
    for op_name in ("CumsumFwdOp", "CumsumBwdOp"):
        tasks += _op_tasks(op_name, (9, 333), torch.float32, 1)
    for op_name in ("CumsumFwdOp", "CumsumBwdOp", "CumprodFwdOp"):
        for length in (3, 4097):
            tasks += _op_tasks(op_name, (length, 1), torch.float32, 0)
    tasks += _op_tasks("CumsumBwdOp", (2**31 // 4096 + 1, 4096), torch.bfloat16, -1)
    tasks += _split_column_tasks()
    for kernel, view_shape in scan_timing.inventory():
        tasks += _tasks(kernel, view_shape)
    return list(dict.fromkeys(tasks))


def _split_column_tasks() -> List[Task]:
    """The split column scans ``test_kernels_direct`` launches on its kernels."""
    from tileops.kernels.scan.cumprod import CumprodFwdKernel
    from tileops.kernels.scan.cumsum import CumsumBwdKernel, CumsumFwdKernel
    from tests.gpu import test_kernels_direct as t

    tasks: List[Task] = []
    for outer, N, inner in t.SPLIT_COLUMN_CASES:
        for dtype in t.DTYPES:
            for cls in (CumsumFwdKernel, CumsumBwdKernel):
                tasks += _tasks(cls(N, dtype), (outer, N, inner))
    for outer, N, inner in t.SPLIT_CUMPROD_CASES:
        tasks += _tasks(CumprodFwdKernel(N, torch.float32), (outer, N, inner))
    return tasks


def compile_one(task: Task) -> None:
    import importlib

    module, class_name, N, dtype, config, program = task
    cls = getattr(importlib.import_module(module), class_name)
    cls(N, **kernel_dtypes(dtype), config=dict(config)).compile_program(program)

def main(argv: Optional[Sequence[str]] = None) -> int:
    return compile_in_parallel(__doc__, inventory, compile_one, argv)


if __name__ == "__main__":
    raise SystemExit(main())
