"""Compile the reduction programs the GPU tests and timings launch, in parallel processes.

    python -m tests.gpu.reduction_warmup [--workers 16]

TileLang keeps compiled programs in its on-disk cache, so the tests load them
afterwards instead of compiling one after another.  The programs are found by
building each test's inputs on the CPU and asking the kernels for their launch plans.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Sequence, Set, Tuple

import torch

from tests.gpu.warmup import compile_in_parallel, dtypes_field, kernel_dtypes

logger = logging.getLogger("tests.gpu.reduction_warmup")

# The H100's SM count.
SM_COUNT = 132
# (kernel class name, dtype name, correction, program, params)
Task = Tuple[str, str, float, str, Tuple[Tuple[str, int], ...]]


def _tasks_for(op: Any, x: torch.Tensor) -> List[Task]:
    from tileops import _shape_rules as rules
    from tileops.kernels.reduction.reduce import COMBINE
    from tileops.ops.reduction.base import reduction_view

    axes = rules.normalize_dims(op.dim, x.ndim)
    if x.ndim == 0:
        x, axes = x.reshape(1), (0,)
    if x.numel() == 0:
        return []
    kernel = op._build_kernel(op.kernel_key, (0,))
    view = reduction_view(x, axes)
    name, params, segments = kernel.launch_plan(view, SM_COUNT)
    dtype = dtypes_field(kernel)
    tasks = [(type(kernel).__name__, dtype, kernel.correction, name, params)]
    if segments > 1:
        tasks.append((type(kernel).__name__, dtype, kernel.correction, COMBINE, kernel._combine_params(segments)))
    return tasks


def inventory() -> List[Task]:
    from codegen import load_manifest
    from tests.gpu import test_reduction as t
    from tests.op_checks import build_op, make_inputs

    manifest = load_manifest()
    tasks: Set[Task] = set()
    for case in t.MANIFEST_CASES:
        x = make_inputs(manifest.op(case.op), case, "cpu", torch.Generator().manual_seed(0))[0]
        tasks.update(_tasks_for(build_op(case), x))
    for name, shape, dtype, params, layout in t.EXTRA:
        x = t.make_extra_input(shape, dtype, layout, "cpu", torch.Generator().manual_seed(0))
        tasks.update(_tasks_for(t.build_extra_op(name, dtype, params), x))
    from tileops.tuning import overlay

    for name in t.OPS:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for shape, _ in t.WIDE_COLUMNS:
                with overlay({name.replace("FwdOp", "Kernel"): t.WIDE_SPLIT_CONFIG}):
                    tasks.update(_tasks_for(t.wide_column_op(name, dtype), torch.empty(shape, dtype=dtype)))
    for op_name in t.OPS:  # over 2**31 elements
        for axes in t.BIG_DIMS:
            x = torch.empty(t.BIG_SHAPE, dtype=torch.bfloat16, device="meta")
            tasks.update(_tasks_for(t.build_extra_op(op_name, torch.bfloat16, t.big_params(op_name, axes)), x))
    for op_name in t.OPS:  # the timed workloads
        for workload in manifest.op(op_name).workloads:
            params = {k: tuple(v) if isinstance(v, list) else v for k, v in workload.params}
            x = torch.empty(dict(workload.shapes)["x"], dtype=torch.bfloat16, device="meta")
            tasks.update(_tasks_for(t.build_extra_op(op_name, torch.bfloat16, params), x))
    return sorted(tasks)


def compile_one(task: Task) -> str:
    from tileops.kernels.reduction import reduce as programs

    cls_name, dtype, correction, name, params = task
    kernel = getattr(programs, cls_name)(**kernel_dtypes(dtype), correction=correction, config={})
    kernel.compile_program(name, params)
    return f"{cls_name} {dtype} {name} {params}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    return compile_in_parallel(__doc__, inventory, compile_one, argv)


if __name__ == "__main__":
    raise SystemExit(main())
