"""``Op.autotune``: tune the kernels an op has built, or would build for given inputs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from tileops.kernels.kernel_base import Kernel
    from tileops.ops.op_base import Op

__all__ = ["autotune_op", "tune_op_kernels", "built_kernels"]

logger = logging.getLogger(__name__)


def _shape_of(example: Any) -> Optional[Tuple[int, ...]]:
    if example is None:
        return None
    shape = getattr(example, "shape", example)
    try:
        return tuple(int(size) for size in shape)
    except TypeError:
        raise TypeError(f"expected a tensor, a shape or None as example input, got {example!r}") from None


def built_kernels(op: "Op") -> List[Tuple[str, "Kernel"]]:
    """``(label, kernel)`` for each kernel ``op`` has built: its kernel key, with the cache key
    appended where one key has several kernels (one per input geometry)."""
    with op._kernel_cache_lock:
        items = list(op._kernel_cache.items())
    keys = [key for (key, _), _ in items]
    labelled = []
    for (key, cache_key), kernel in items:
        label = key if keys.count(key) == 1 else f"{key}{list(cache_key)}"
        labelled.append((label, kernel))
    return labelled


def tune_op_kernels(op: "Op", *examples: Any, force: bool = False) -> List[Tuple[str, "Kernel", Any]]:
    """Tune ``op``'s kernels; return ``(kernel key, kernel, Selection)`` for each.

    ``examples`` are the op's forward inputs as tensors or shapes (``None`` for an
    absent optional input): with them, the kernels those inputs need are built
    first.  Without them, the kernels already built by earlier calls are tuned.
    Each kernel adopts its selected config.
    """
    from tileops.tuning.kernels import select_kernel_config

    if examples:
        shapes = [_shape_of(example) for example in examples]
        kernel_map = getattr(op, "kernel_map", None) or op.default_kernel_map
        for key in kernel_map:
            op._kernel(key, *shapes)
    kernels = built_kernels(op)
    if not kernels:
        raise ValueError(
            f"{type(op).__name__}.autotune(): no kernels are built yet; pass example inputs "
            "(tensors or shapes) so the op can build the kernels it needs"
        )
    results = []
    for label, kernel in kernels:
        selection = select_kernel_config(kernel, override=kernel.config_override, tune=True, force=force)
        kernel.config = dict(selection.config)
        logger.info("%s.%s uses %s (%s)", type(op).__name__, label, kernel.config, selection.source)
        results.append((label, kernel, selection))
    return results


def autotune_op(op: "Op", *examples: Any, force: bool = False) -> Dict[str, Dict[str, Any]]:
    """Tune ``op``'s kernels on the current GPU; return ``{kernel key: config}``.

    See ``tune_op_kernels`` for ``examples``.  Tuned configs are persisted, so
    later processes on this device reuse them without tuning.
    """
    return {label: dict(selection.config) for label, _, selection in tune_op_kernels(op, *examples, force=force)}
