"""Compile every program the elementwise GPU tests and timings launch, in parallel processes.

    python -m tests.gpu.elementwise_warmup [--workers 16] [--list]

TileLang keeps compiled programs in its on-disk cache, so the tests that run
afterwards load them instead of compiling one after another.  The programs
are found by replaying each test's op calls on ``meta`` tensors (same shapes,
strides and alignments, no memory) through the ops' kernel path, with the
kernels recording which program each launch would use instead of launching.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch

from tests.gpu.warmup import compile_in_parallel

logger = logging.getLogger("tests.gpu.elementwise_warmup")

META = "meta"
# (kernel module, kernel class, dtype name, constructor params, config items, program spec)
Task = Tuple[str, str, str, Tuple[Tuple[str, Any], ...], Tuple[Tuple[str, Any], ...], Tuple[Any, ...]]


def kernel_task(kernel: Any, spec: Tuple[Any, ...], config: Optional[Dict[str, Any]] = None) -> Task:
    cls = type(kernel)
    params = tuple((name, getattr(kernel, name)) for name in cls.op_params)
    config = kernel.config if config is None else config
    return (cls.__module__, cls.__name__, str(kernel.dtype).replace("torch.", ""), params,
            tuple(sorted(config.items())), spec)


@contextlib.contextmanager
def recording(tasks: Set[Task]) -> Iterator[None]:
    """Kernels record the program of each launch instead of launching it: both programs a call
    may take (``call_programs``), since whether a call of few accesses is small depends on the
    GPU's SM count (this GPU's, or an H100's)."""
    from tileops.kernels.elementwise.base import ElementwiseKernel

    original = ElementwiseKernel.launcher
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132

    def record(kernel: Any, spec: Tuple[Any, ...], accesses: int, device: torch.device,
               input_bytes: Optional[int] = None) -> Any:
        tasks.update(kernel_task(kernel, program, config)
                     for program, config in kernel.call_programs(spec, accesses, sm_count, input_bytes))
        return lambda *tensors: None

    ElementwiseKernel.launcher = record  # type: ignore[method-assign]
    try:
        yield
    finally:
        ElementwiseKernel.launcher = original  # type: ignore[method-assign]


def _case_inputs(spec: Any, case: Any) -> List[torch.Tensor]:
    """``make_inputs``'s layouts on meta tensors."""
    shapes = dict(case.shapes)
    inputs = []
    for tensor in spec.inputs:
        shape = shapes[tensor.name]
        if case.layout == "strided" and len(shape) >= 1:
            inputs.append(torch.empty(*shape[:-1], 2 * shape[-1], device=META, dtype=case.dtype)[..., ::2])
        else:
            inputs.append(torch.empty(shape, device=META, dtype=case.dtype))
    return inputs


def inventory() -> List[Task]:
    """Every (kernel, program) the GPU tests and the timing script launch."""
    from benchmarks import elementwise_timing
    from tests.gpu import test_elementwise as t
    from tests.op_checks import _spec

    calls: List[Tuple[Any, List[torch.Tensor]]] = []
    for case in t.MANIFEST_CASES:
        spec = _spec(case.op)
        shapes = dict(case.shapes)
        static = t.static_params(case.op, shapes[spec.inputs[-1].name])
        calls.append((t.build(case.op, case.dtype, **static, **dict(case.params)), _case_inputs(spec, case)))
    for fwd, params, shape, dtype in t.GRAD_CASES:
        static = t.static_params(fwd, shape)
        x = torch.empty(shape, device=META, dtype=dtype)
        grad = torch.empty(t.grad_shape(fwd, shape), device=META, dtype=dtype)
        calls.append((t.build(fwd, dtype, **static, **params), [x]))
        calls.append((t.build(t.bwd_name(fwd), dtype, **static, **params), [grad, x]))
    for name in ("AddFwdOp", "MulFwdOp"):
        for a_shape, b_shape, dtype in t.BROADCASTS:
            a = torch.empty(a_shape, device=META, dtype=dtype)
            b = torch.empty(b_shape, device=META, dtype=dtype)
            calls.append((t.build(name, dtype), [a, b]))
    for _, name, params, make in t.VIEW_CASES:
        inputs = make(META)
        calls.append((t.build(name, inputs[0].dtype, **params), inputs))
    for _, name, params, shapes in t.BIG_CASES:
        calls.append((t.build(name, torch.bfloat16, **params), t.big_inputs(shapes, META)))
    for _, name, params, make in t.HINTED_CASES:
        inputs = make(META)
        op = t.build(name, inputs[0].dtype, **params)
        kernel = op._kernel(op.kernel_key, (None,))  # a meta tensor's device index
        kernel.config = {**kernel.config, "hinted_min_mib": 0}
        calls.append((op, inputs))
    calls.append((t.build("SiluAndMulFwdOp", torch.float32, N=2 * 688), [torch.empty(4, 64, 1376, device=META)]))
    calls.append((t.build("SiluAndMulBwdOp", torch.float32, N=2 * 688),
                  [torch.empty(4, 64, 688, device=META), torch.empty(4, 64, 1376, device=META)]))
    tasks: Set[Task] = set()
    with recording(tasks):
        for op, inputs in calls:
            op._run_kernel(*inputs)
        for op, inputs in elementwise_timing.meta_calls():
            op._run_kernel(*inputs)
    tasks.update(elementwise_timing.sweep_tasks())
    return sorted(tasks, key=repr)


def compile_one(task: Task) -> float:
    module, cls_name, dtype, params, config, spec = task
    began = time.perf_counter()
    cls = getattr(importlib.import_module(module), cls_name)
    # A large call's config carries "hinted" (``hinted_config``), which is no key a kernel is built with.
    kernel = cls(dtype=getattr(torch, dtype), config={}, **dict(params))
    kernel.compile_program(spec, dict(config))
    return time.perf_counter() - began


def main(argv: Optional[Sequence[str]] = None) -> int:
    return compile_in_parallel(__doc__, inventory, compile_one, argv)


if __name__ == "__main__":
    raise SystemExit(main())
