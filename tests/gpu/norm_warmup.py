"""Compile every program the norm-family GPU tests and timings launch, in parallel processes.

    python -m tests.gpu.norm_warmup [--workers 16] [--list]

TileLang keeps compiled programs in its on-disk cache, so the tests that run
afterwards load them instead of compiling one after another.  The programs
are found by building each test's ops and kernels on the CPU (same sizes,
dtypes and configs) and asking the kernels which programs a call with the
test's inputs launches.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch

from tests.gpu.warmup import compile_in_parallel

logger = logging.getLogger("tests.gpu.norm_warmup")

# (kernel module, kernel class, N, dtype name, eps, config items, program name or None, program shape)
Task = Tuple[str, str, int, str, float, Tuple[Tuple[str, Any], ...], Optional[str], Tuple[Tuple[str, Any], ...]]


def kernel_tasks(kernel: Any, flags: Optional[Dict[str, bool]] = None) -> List[Task]:
    """The programs a call launches: every program of a multi-program kernel (variant ``flags``
    overriding the default shape), or the single program of a plain kernel."""
    cls = type(kernel)
    head = (cls.__module__, cls.__name__, kernel.N, str(kernel.dtype).replace("torch.", ""),
            float(getattr(kernel, "eps", 0.0)), tuple(sorted(kernel.config.items())))
    if not hasattr(kernel, "program_keys"):
        return [head + (None, ())]
    tasks = []
    for name, shape in kernel.program_keys():
        merged = dict(shape)
        merged.update({k: v for k, v in (flags or {}).items() if k in merged})
        tasks.append(head + (name, tuple(sorted(merged.items()))))
    return tasks


def _op_kernel(name: str, N: int, dtype: torch.dtype, eps: float) -> Any:
    import tileops.ops

    op = getattr(tileops.ops, name)(N=N, dtype=dtype, eps=eps)
    return op._build_kernel(op.kernel_key, (0,))


def inventory() -> List[Task]:
    """Every (kernel, program) the GPU tests and the timing script launch."""
    from benchmarks import norm_timing
    from tests.gpu import test_norm_family as t
    from tests.gpu import test_row_slices as row_slices
    from tests.op_checks import build_op

    tasks: Set[Task] = set()

    def add(found: Iterable[Task]) -> None:
        tasks.update(found)

    for case in t.MANIFEST_CASES:
        if case.label == "empty":
            continue
        op = build_op(case)
        add(kernel_tasks(op._build_kernel(op.kernel_key, (0,))))
    for rows, N, dtype in t.GRAD_CASES + t.RAGGED_GRAD_CASES:
        add(kernel_tasks(_op_kernel("RMSNormFwdOp", N, dtype, 1e-6)))
        add(kernel_tasks(_op_kernel("RMSNormBwdOp", N, dtype, 1e-6)))
    for rows, N, dtype, (weight, bias) in t.LAYER_GRAD_CASES:
        add(kernel_tasks(_op_kernel("LayerNormFwdOp", N, dtype, 1e-5), {"has_weight": weight, "has_bias": bias}))
        # Autograd gets the identity for an absent affine; the direct call passes the weight as it is.
        add(kernel_tasks(_op_kernel("LayerNormFwdOp", N, dtype, 1e-5)))
        add(kernel_tasks(_op_kernel("LayerNormBwdOp", N, dtype, 1e-5), {"has_weight": weight}))
        add(kernel_tasks(_op_kernel("LayerNormBwdOp", N, dtype, 1e-5)))
    for rows, N, dtype, config in t.STAGE_CASES:
        for layer in (True, False):
            for kernel in t.stage_kernels(layer, N, dtype, config):
                add(kernel_tasks(kernel))
                add(kernel_tasks(kernel, {"strided": True}))
    for rows, N, dtype, mean, spread in t.FAR_ROWS:
        add(kernel_tasks(_op_kernel("LayerNormFwdOp", N, dtype, 1e-5)))
    for rows, N, dtype in t.SCHEDULE_CASES:
        for kernel in t.schedule_kernels(N, dtype):
            add(kernel_tasks(kernel))
    for rows, N, dtype in t.FUSED_GRAD_CASES:
        add(kernel_tasks(_op_kernel("FusedAddRMSNormFwdOp", N, dtype, 1e-6)))
        add(kernel_tasks(_op_kernel("FusedAddRMSNormBwdOp", N, dtype, 1e-6)))
        add(kernel_tasks(_op_kernel("FusedAddRMSNormBwdOp", N, dtype, 1e-6), {"strided": True}))
    for N in t.FUSED_SIZES:
        for dtype in t.FUSED_DTYPES:
            add(kernel_tasks(_op_kernel("FusedAddRMSNormFwdOp", N, dtype, 1e-6)))
    for weight, bias in ((False, False), (False, True), (True, False)):
        add(kernel_tasks(_op_kernel("LayerNormFwdOp", 4097, torch.bfloat16, 1e-5),
                         {"has_weight": weight, "has_bias": bias}))
    for N in t.HINTED_SIZES:
        for dtype in t.HINTED_DTYPES:
            layer, fused = t.hinted_kernels(N, dtype)
            add(kernel_tasks(layer))
            add(kernel_tasks(layer, {"has_weight": False, "has_bias": False}))
            add(kernel_tasks(fused))
    add(kernel_tasks(_op_kernel("LayerNormFwdOp", t.BIG_N, torch.bfloat16, 1e-5), {"has_bias": False}))
    add(kernel_tasks(_op_kernel("RMSNormBwdOp", t.BIG_N, torch.bfloat16, 1e-6)))
    for N in t.BIG_LAYER_BWD_SIZES:
        add(kernel_tasks(_op_kernel("LayerNormBwdOp", N, torch.bfloat16, 1e-5)))
    add(kernel_tasks(_op_kernel("LayerNormFwdOp", 1024, torch.bfloat16, 1e-5)))
    add(kernel_tasks(_op_kernel("LayerNormBwdOp", 1024, torch.bfloat16, 1e-5)))
    for kernel, flags in norm_timing.inventory():
        add(kernel_tasks(kernel, flags))
    for _, N, dtype in row_slices.NORM_CASES:  # row slices: the backward programs' strided variants
        for name in ("RMSNormFwdOp", "LayerNormFwdOp", "FusedAddRMSNormFwdOp"):
            add(kernel_tasks(_op_kernel(name, N, dtype, 1e-5)))
        for name in ("RMSNormBwdOp", "LayerNormBwdOp"):
            add(kernel_tasks(_op_kernel(name, N, dtype, 1e-5), {"strided": True}))
    return sorted(tasks, key=repr)


def compile_one(task: Task) -> float:
    import importlib

    module, cls_name, N, dtype, eps, config, name, shape = task
    began = time.perf_counter()
    cls = getattr(importlib.import_module(module), cls_name)
    kernel = cls(N, getattr(torch, dtype), eps=eps, config=dict(config))
    if name is None:
        kernel.compile()
    else:
        kernel.compile_program(name, shape)
    return time.perf_counter() - began


def main(argv: Optional[Sequence[str]] = None) -> int:
    return compile_in_parallel(__doc__, inventory, compile_one, argv)


if __name__ == "__main__":
    raise SystemExit(main())
