"""Compile the cross-entropy programs the GPU tests launch, in parallel processes.

    python -m tests.gpu.loss_warmup [--workers 16]

TileLang keeps compiled programs in its on-disk cache, so the tests load them
afterwards instead of each test process compiling them one after another.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Set, Tuple

import torch

from tests.gpu.warmup import compile_in_parallel

# (kernel class name, V, dtype name, constructor keywords, program): the program is
# ("main", flags), ("batch", flags) or ("small", mean), as the kernels name them.
Task = Tuple[str, int, str, Tuple[Tuple[str, Any], ...], Tuple[Any, ...]]


def _kernel_tasks(cls: Any, V: int, dtype: torch.dtype, **kwargs: Any) -> List[Task]:
    from tileops.kernels.loss.cross_entropy import CrossEntropyFwdKernel

    programs: List[Tuple[Any, ...]] = [("main", flags) for flags in cls.main_flags]
    programs += [("batch", flags) for flags in cls.batch_flags]
    if cls is CrossEntropyFwdKernel:
        programs += [("small", mean) for mean in (False, True)]
    keywords = tuple(sorted((k, str(v).replace("torch.", "") if isinstance(v, torch.dtype) else v)
                            for k, v in kwargs.items()))
    return [(cls.__name__, V, str(dtype).replace("torch.", ""), keywords, program) for program in programs]


def inventory() -> List[Task]:
    from tests.gpu import test_cross_entropy as t
    from tileops.kernels.loss.cross_entropy import CrossEntropyBwdKernel, CrossEntropyFwdKernel
    from tileops.kernels.loss.soft_cross_entropy import SoftCrossEntropyBwdKernel, SoftCrossEntropyFwdKernel

    tasks: Set[Task] = set()
    for V, dtype, ignore_index, label_smoothing in t.CONFIGS:
        for cls in (CrossEntropyFwdKernel, CrossEntropyBwdKernel):
            tasks.update(_kernel_tasks(cls, V, dtype, ignore_index=ignore_index, label_smoothing=label_smoothing))
    for V, dtype, target_dtype, _, label_smoothing in t.SOFT_CONFIGS + t.SOFT_CONFIGS_OF_OTHER_TESTS:
        for cls in (SoftCrossEntropyFwdKernel, SoftCrossEntropyBwdKernel):
            tasks.update(_kernel_tasks(cls, V, dtype, target_dtype=target_dtype, label_smoothing=label_smoothing))
    return sorted(tasks, key=repr)


def compile_one(task: Task) -> str:
    return compile_for(task, "auto")


def compile_for(task: Task, target: Any) -> str:
    """Compile ``task``'s program for ``target`` (``"auto"``: the GPU present)."""
    from tileops.kernels.loss import cross_entropy, soft_cross_entropy

    cls_name, V, dtype, keywords, program = task
    module = soft_cross_entropy if cls_name.startswith("Soft") else cross_entropy
    kwargs = {k: getattr(torch, v) if k == "target_dtype" else v for k, v in keywords}
    kernel = getattr(module, cls_name)(V, getattr(torch, dtype), config={}, **kwargs)
    kind, which = program
    if kind == "main":
        kernel._compile_main(which, target)
    elif kind == "batch":
        kernel._compile_batch(which, target)
    else:
        kernel._compile_small(which, target)
    return f"{cls_name} V={V} {dtype} {keywords} {program}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    return compile_in_parallel(__doc__, inventory, compile_one, argv)


if __name__ == "__main__":
    raise SystemExit(main())
