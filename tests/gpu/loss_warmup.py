"""Compile the cross-entropy programs the GPU tests launch, in parallel processes.

    python -m tests.gpu.loss_warmup [--workers 16]

TileLang keeps compiled programs in its on-disk cache, so the tests load them
afterwards instead of each test process compiling them one after another.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Set, Tuple

import torch

from tests.gpu.warmup import compile_in_parallel

# (kernel class, V, dtype, constructor keywords, program name): one program of ``program_builds``.
Task = Tuple[type, int, torch.dtype, Tuple[Tuple[str, Any], ...], str]


def _kernel_tasks(cls: type, V: int, dtype: torch.dtype, **kwargs: Any) -> List[Task]:
    keywords = tuple(sorted(kwargs.items()))
    return [(cls, V, dtype, keywords, name) for name in cls(V, dtype, config={}, **kwargs).program_builds()]


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
    cls, V, dtype, keywords, name = task
    cls(V, dtype, config={}, **dict(keywords)).program_builds(target)[name]()
    return f"{cls.__name__} V={V} {dtype} {keywords} {name}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    return compile_in_parallel(__doc__, inventory, compile_one, argv)


if __name__ == "__main__":
    raise SystemExit(main())
