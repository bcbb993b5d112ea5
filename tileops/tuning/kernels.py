"""Config selection for ``tileops.kernels.Kernel`` objects.

A kernel is built for static sizes (e.g. hidden size N) and a dtype, with the
row count symbolic, so one config serves every row count.  Its tuning identity
is therefore its class, ``version``, ``static_signature()`` (which includes the
dtype) and the representative workload it is timed on, ``{"rows": tuning_rows}``.
The kernel supplies that workload through ``tuning_inputs(rows)``.
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from tileops.tuning.keys import Config, Invocation
from tileops.tuning.selector import ConfigSelector, Selection, active_selector
from tileops.tuning.tuner import TuningUnavailable

if TYPE_CHECKING:
    from tileops.kernels.kernel_base import Kernel

__all__ = ["KernelTunable", "KernelWorkbench", "autotune_kernel", "kernel_invocation", "select_kernel_config"]

logger = logging.getLogger(__name__)


def kernel_op_id(kernel: "Kernel") -> str:
    cls = type(kernel)
    return f"{cls.__module__}.{cls.__qualname__}"


def kernel_invocation(kernel: "Kernel", rows: Optional[int] = None) -> Invocation:
    """The tuning identity of ``kernel`` on its representative workload."""
    return Invocation(
        op_id=kernel_op_id(kernel),
        version=str(getattr(kernel, "version", "1")),
        params=kernel.static_signature(),
        workload={"rows": int(kernel.tuning_rows if rows is None else rows)},
    )


def _nan_aware_equal(a: Any, b: Any) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        return bool(torch.all((a == b) | (torch.isnan(a) & torch.isnan(b))))
    return bool(torch.equal(a, b))


def _poison(tensor: Any) -> None:
    """Fill an output buffer with values no correct kernel leaves behind."""
    import torch

    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    elif tensor.dtype != torch.bool:
        tensor.fill_(torch.iinfo(tensor.dtype).min)


def _as_tensors(value: Any) -> List[Any]:
    import torch

    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


class KernelWorkbench:
    """Runs candidates of one kernel on the tensors from its ``tuning_inputs``.

    Candidates run on a shallow copy of the kernel (sharing its compiled-program
    cache), so a kernel already serving calls never sees a candidate config.
    Which tensors are outputs is learnt from the first (heuristic) run: those it
    wrote or returned.  Every later check run starts from pristine inputs with
    those outputs poisoned, so a candidate that writes nothing cannot pass by
    leaving an earlier candidate's result in place.
    """

    def __init__(self, kernel: "Kernel", tensors: Sequence[Any]) -> None:
        self.kernel = kernel
        self.pristine = tuple(tensors)
        self._output_indices: Optional[List[int]] = None
        self._timing_tensors: Optional[tuple] = None

    def _probe(self, config: Config) -> "Kernel":
        probe = copy.copy(self.kernel)
        probe.config = dict(config)
        return probe

    def compile(self, config: Config) -> None:
        self.kernel.compile(dict(config))

    def check_run(self, config: Config) -> List[Any]:
        args = [t.clone() for t in self.pristine]
        for index in self._output_indices or ():
            _poison(args[index])
        returned = _as_tensors(self._probe(config).forward(*args))
        pointers = {a.data_ptr(): i for i, a in enumerate(args) if a.numel()}
        if self._output_indices is None:
            written = {i for i, (a, p) in enumerate(zip(args, self.pristine)) if not _nan_aware_equal(a, p)}
            aliased = {pointers[r.data_ptr()] for r in returned if r.numel() and r.data_ptr() in pointers}
            self._output_indices = sorted(written | aliased)
        fresh = [r for r in returned if not (r.numel() and r.data_ptr() in pointers)]
        # Inputs are compared too: a candidate that corrupts an input is wrong.
        return args + fresh

    def launcher(self, config: Config) -> "KernelLaunch":
        if self._timing_tensors is None:
            # Own copies, so a misbehaving candidate cannot corrupt the check inputs.
            self._timing_tensors = tuple(t.clone() for t in self.pristine)
        return KernelLaunch(self._probe(config), self._timing_tensors)


class KernelLaunch:
    """One timed launch: ``forward(*args)`` of a kernel copy set to one config."""

    __slots__ = ("kernel", "args")

    def __init__(self, kernel: "Kernel", args: Sequence[Any]) -> None:
        self.kernel, self.args = kernel, tuple(args)

    @property
    def config(self) -> Config:
        return self.kernel.config

    def __call__(self) -> Any:
        return self.kernel.forward(*self.args)


class KernelTunable:
    """Adapter from a ``Kernel`` to what the selector and tuner need."""

    def __init__(self, kernel: "Kernel", rows: Optional[int] = None) -> None:
        self.kernel = kernel
        self.rows = int(kernel.tuning_rows if rows is None else rows)
        self.invocation = kernel_invocation(kernel, self.rows)

    def heuristic_config(self) -> Config:
        return dict(self.kernel.default_config)

    def candidate_configs(self) -> Sequence[Config]:
        return list(self.kernel.autotune_configs)

    def check_config(self, config: Config) -> Config:
        return self.kernel._checked_config(dict(config))

    def workbench(self) -> KernelWorkbench:
        try:
            tensors = self.kernel.tuning_inputs(self.rows)
        except NotImplementedError as error:
            raise TuningUnavailable(str(error)) from error
        return KernelWorkbench(self.kernel, tensors)


def select_kernel_config(
    kernel: "Kernel",
    *,
    override: Optional[Config] = None,
    tune: Optional[bool] = None,
    force: bool = False,
    selector: Optional[ConfigSelector] = None,
) -> Selection:
    """Choose ``kernel``'s config through the active selector (see ``ConfigSelector.choose``)."""
    chooser = selector if selector is not None else active_selector()
    selection = chooser.choose(KernelTunable(kernel), override=override, autotune=tune, force=force)
    logger.debug("%s config %s from %s", type(kernel).__name__, dict(selection.config), selection.source)
    return selection


def autotune_kernel(kernel: "Kernel", *, force: bool = False) -> Dict[str, Any]:
    """Tune ``kernel`` unless a tuned config is cached (or ``force``); return the config.

    An explicit config the kernel was built with is honoured: it is returned untouched.
    """
    selection = select_kernel_config(kernel, override=kernel.config_override, tune=True, force=force)
    if selection.source == "override":
        logger.info("%s was given an explicit config; not autotuning it", type(kernel).__name__)
    return dict(selection.config)
