"""Base class of every TileLang kernel wrapper.

A ``Kernel`` is built for the sizes an op commits at construction (its static
dims) and a dtype; the remaining axes are TileLang symbolic dimensions, so one
compiled program serves every row count.  Subclasses supply ``program`` (the
TileLang ``prim_func`` for one config), ``default_config`` (the heuristic
choice), optionally ``autotune_configs``, and ``forward`` (the launch).

**Overlapped launches.**  An op of two launches (partial results, then a
program that combines them) hides the second one's launch latency behind the
first one's last blocks (programmatic dependent launch, sm_90):

* the first program calls ``T.pdl_trigger()`` as its first statement: once
  every block has started, the GPU may set up the next launch;
* the second calls ``T.pdl_sync()`` before it reads global memory (TileLang
  then launches it with programmatic stream serialization).  The wait returns
  once the launch before it has ended and its writes are visible, so nothing
  is read early; a program that starts an op has no wait.

Measured on an H100 against the same programs without it: the cross-entropy
forward's mean over 4096 rows of 32000 bf16 logits 95.3 -> 94.2 us, over 1024
rows of 262144 188.4 -> 185.5; the softmax forward over 64 rows of 262144
37.7 -> 36.9.
``tests/test_kernels_launch_overlap.py`` checks the order in every such pair.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import torch

from tileops.kernels.launch import LayoutMemo

__all__ = ["Kernel", "UnsupportedArchError", "SM90_BUILD_TARGET", "PASS_CONFIGS", "column_locator", "column_placement", "strided_rows",
           "torch_dtype_to_tl", "with_pass_configs"]

logger = logging.getLogger(__name__)

# The target used to build kernels on a machine without a GPU (nvcc suffices).
SM90_BUILD_TARGET: Dict[str, str] = {"kind": "cuda", "arch": "sm_90"}
# Programs index arrays under conditions they check themselves; TileLang's extra
# bounds checks would only block their 16-byte accesses.
PASS_CONFIGS: Dict[str, bool] = {"tl.disable_safe_memory_legalize": True}


def with_pass_configs(program: Any) -> Any:
    """``program`` set to compile under ``PASS_CONFIGS``, unless it names pass configs of its own
    (which then include them): every kernel compiles its programs through this."""
    if "tilelang_pass_configs" in program.attrs:
        return program
    return program.with_attr("tilelang_pass_configs", PASS_CONFIGS)


_TL_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
}


def torch_dtype_to_tl(dtype: torch.dtype) -> str:
    """The TileLang spelling of a torch dtype."""
    try:
        return _TL_DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"no TileLang dtype for {dtype}") from None


def column_locator(T: Any, tile: int, col_threads: int) -> Any:
    """Macro ``locate(place, bx, tx, I)`` of the middle-axis (column) programs: sets the int32
    locals ``place[0]`` to the outer index of column block ``bx`` and ``place[1]`` to the first
    column of its thread ``tx``, where blocks cover ``tile`` of the ``I`` columns and
    ``col_threads`` threads span a block's columns.  Columns are counted in the program's own
    unit: vectors (``place[1] * cvec`` is then the first element) or elements.

    Worked out once into locals: left as expressions, the division by the symbolic column count
    was folded into every load and store, in 64-bit arithmetic (H100, 64 x 4096 x 64 bf16 over
    the middle axis: the scan took 44 us, twice a copy with its access pattern, each load behind
    a software division).  Truncating division: block indices are non-negative.  (The macro
    names the symbolic extent it is given in the program's signature: callers pass their ``I``.)
    """

    @T.macro
    def locate(place, bx, tx, I):  # noqa: N803 - the extent's name in the generated signature
        place[0] = T.truncdiv(bx, T.ceildiv(I, tile))
        place[1] = (bx - place[0] * T.ceildiv(I, tile)) * col_threads + tx % col_threads

    return locate


def column_placement(T: Any, tile: int, col_threads: int, cvec: int) -> Any:
    """Macro ``place_thread(bx, tx, I) -> (o, i0)`` of the column programs whose columns are counted
    in ``cvec``-element vectors: ``column_locator``'s outer index ``o`` of block ``bx`` and the first
    inner element ``i0`` of thread ``tx``, stated to be a multiple of ``cvec`` (the vectorizer needs
    that to keep 16-byte accesses, and does not look into a local)."""
    locate = column_locator(T, tile, col_threads)

    @T.macro
    def place_thread(bx, tx, I):  # noqa: N803 - the extent's name in the generated signature
        place = T.alloc_local((2,), "int32")
        locate(place, bx, tx, I)
        o, i0 = place[0], place[1] * cvec
        T.assume(i0 % cvec == 0)
        return o, i0

    return place_thread


def strided_rows(T: Any, M: Any, N: Any, dtype: str, stride_name: str, strided: bool = True) -> Tuple[Any, Any]:
    """The TileLang type of an input ``(M, N)`` whose rows lie ``stride`` elements apart, and that
    symbolic (int64) stride (``M`` and ``N`` may be symbolic too).  The host hands such a tensor
    in place only when the stride is a multiple of the program's access width, so a program
    may ``T.assume(stride % vector == 0)``.

    ``strided=False`` gives a contiguous ``(M, N)`` type and no stride (``None``), for programs
    whose row walks are cheaper with the stride a constant."""
    if not strided:
        return T.Tensor((M, N), dtype), None
    stride = T.dynamic(stride_name, "int64")
    return T.StridedTensor((M, N), (stride, 1), dtype), stride


class UnsupportedArchError(RuntimeError):
    """Raised when a kernel is launched on a GPU architecture it was not written for."""


class Kernel:
    """A TileLang program with a tunable config.

    Attributes:
        dtype: element type of the kernel's main tensors.
        out_dtype: element type of its output where it differs from ``dtype`` (None: ``dtype``).
        config: the tile configuration in use (block sizes, threads, ...).
        supported_archs: SM versions (e.g. ``(90,)``) the program is written for.
    """

    supported_archs: Tuple[int, ...] = (90,)
    # Part of every tuning key: bump it when the meaning of a config changes, so
    # configs tuned for the old meaning are never reused.
    version: str = "1"
    # The output's dtype where the kernel writes another than ``dtype`` (None: ``dtype``): a
    # class's own (an index), or one given at construction (a float32 forward of half precision,
    # a gradient in its input's dtype).
    out_dtype: Optional[torch.dtype] = None
    # The row count of the representative workload the tuner times on (the row
    # axis is symbolic, so one config serves all row counts; this picks which
    # problem size that config is best for).
    tuning_rows: int = 4096

    def __init__(
        self,
        dtype: torch.dtype,
        *,
        config: Optional[Dict[str, Any]] = None,
        tune: bool = False,
        out_dtype: Optional[torch.dtype] = None,
    ) -> None:
        self.dtype = dtype
        if out_dtype is not None:
            self.out_dtype = out_dtype
        self._compiled: Dict[Tuple[Hashable, ...], Any] = {}
        self._compile_lock = threading.Lock()
        self._sm_counts: Dict[int, int] = {}
        self._sm_lock = threading.Lock()
        self._config_override: Optional[Dict[str, Any]] = None
        self.config = {}
        self.init_config(config, tune)

    @property
    def config(self) -> Dict[str, Any]:
        """The config this kernel launches with.

        Assigning one (tuning does) forgets the launch plans derived from the previous one.
        """
        return self._config

    @config.setter
    def config(self, value: Dict[str, Any]) -> None:
        self._config = value
        # Per input geometry: what ``forward`` launches (kernels that plan their launches use it).
        self._launch_plans: LayoutMemo[Any] = LayoutMemo()

    # ---- what subclasses supply -------------------------------------------------
    @property
    def default_config(self) -> Dict[str, Any]:
        """The heuristic config for this kernel's static sizes."""
        raise NotImplementedError(f"{type(self).__name__}.default_config")

    @property
    def autotune_configs(self) -> List[Dict[str, Any]]:
        """The candidate configs an autotuner may try (the default alone unless overridden)."""
        return [self.default_config]

    def program(self, **config: Any) -> Any:
        """The TileLang ``prim_func`` for one config."""
        raise NotImplementedError(f"{type(self).__name__}.program")

    def forward(self, *args: Any) -> Any:
        """Launch the kernel compiled for ``self.config`` on ``args``."""
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        """CUDA tensors to time a candidate config on: the inputs, then preallocated outputs.

        ``rows`` defaults to ``self.tuning_rows``.  The tuner calls
        ``forward(*tensors)`` with each candidate as ``self.config`` (after
        ``self.compile(candidate)``) and compares everything ``forward`` wrote or
        returned with what the heuristic config produced.  Use random inputs,
        never zeros, so that a wrong candidate cannot match by accident.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot be autotuned: it does not implement "
            "tuning_inputs(rows), which must return the CUDA tensors (inputs plus preallocated "
            "outputs) that forward(*tensors) is timed on"
        )

    def static_signature(self) -> Dict[str, Any]:
        """The construction-time values that identify this kernel (for tuning keys)."""
        return {
            k: v for k, v in vars(self).items()
            if not k.startswith("_") and k not in ("config",) and isinstance(v, (int, float, str, bool))
        } | {"dtype": str(self.dtype).replace("torch.", "")} | self._out_dtype_signature()

    @property
    def result_dtype(self) -> torch.dtype:
        """The dtype the kernel writes its output in."""
        return self.out_dtype or self.dtype

    def _out_dtype_signature(self) -> Dict[str, str]:
        # Only an output dtype given at construction names itself (a class's own is the class's):
        # the tuning keys of every other kernel stay as they were.
        given = vars(self).get("out_dtype")
        if given is None or given == self.dtype:
            return {}
        return {"out_dtype": str(given).replace("torch.", "")}

    # ---- config handling --------------------------------------------------------
    def init_config(self, config: Optional[Dict[str, Any]] = None, tune: bool = False) -> None:
        """Choose the config.

        An explicit ``config`` wins (and is kept as this kernel's override, which
        ``autotune`` honours too).  Otherwise the tuning layer picks: a config
        pinned by an ``overlay``, a tuned one cached for this device, a fresh
        tuning run if ``tune`` is true or the policy (``TILEOPS_AUTOTUNE``,
        ``policy_override``) allows it, else ``default_config``.  ``tune=False``
        means "no request", not "forbid": use ``policy_override(autotune=False)``
        for that.
        """
        if config is not None:
            # Fast path: no key, no cache, no import of the tuning layer.
            self._config_override = self._checked_config(config)
            self.config = dict(self._config_override)
            return
        self._config_override = None
        from tileops.tuning.kernels import select_kernel_config  # deferred: keeps kernel import light

        self.config = dict(select_kernel_config(self, tune=True if tune else None).config)

    @property
    def config_override(self) -> Optional[Dict[str, Any]]:
        """The explicit config this kernel was built with, if any."""
        return None if self._config_override is None else dict(self._config_override)

    def _checked_config(self, config: Dict[str, Any]) -> Dict[str, Any]:
        known = set(self.default_config)
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: unknown config keys {unknown}; expected a subset of {sorted(known)}"
            )
        return {**self.default_config, **config}

    def autotune(self, *, force: bool = False) -> Dict[str, Any]:
        """Tune this kernel on its ``tuning_inputs`` (needs CUDA), adopt and return the winner.

        A tuned config already cached for this device is reused unless ``force``.
        The result is saved to the persistent cache; an explicit config given at
        construction is kept as is.
        """
        from tileops.tuning.kernels import autotune_kernel  # deferred: tuning pulls in timing tools

        self.config = autotune_kernel(self, force=force)
        return dict(self.config)

    def sm_count(self, device: torch.device) -> int:
        """The SM count of CUDA ``device`` (its index, or the current device), looked up once."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        count = self._sm_counts.get(index)
        if count is None:
            with self._sm_lock:
                count = self._sm_counts.setdefault(index, torch.cuda.get_device_properties(index).multi_processor_count)
        return count

    # ---- compilation ------------------------------------------------------------
    def compile_once(self, key: Tuple[Hashable, ...], build: Callable[[], Any], target: Any, what: Any) -> Any:
        """The program ``build()`` returns, compiled for ``target`` once per ``key`` (thread-safe).

        ``key`` tells apart everything the program depends on, ``target``
        included; ``what`` names the program in the log (formatted only when logged).
        """
        compiled = self._compiled.get(key)
        if compiled is None:
            with self._compile_lock:
                compiled = self._compiled.get(key)
                if compiled is None:
                    import tilelang  # deferred: importing tilelang costs seconds

                    logger.info("compiling %s %s target=%s", type(self).__name__, what, target)
                    compiled = tilelang.compile(with_pass_configs(build()), target=target)
                    self._compiled[key] = compiled
        return compiled

    def compile(self, config: Optional[Dict[str, Any]] = None, target: Any = "auto") -> Any:
        """The compiled TileLang kernel for ``config`` (default: ``self.config``), cached."""
        config = dict(self.config if config is None else config)
        key = (repr(target),) + tuple(sorted(config.items()))
        return self.compile_once(key, lambda: self.program(**config), target, ("config", config))

    @property
    def kernel(self) -> Callable[..., Any]:
        """The compiled program for the current config."""
        return self.compile()

    def build_for_sm90(self) -> Any:
        """Compile for sm_90 without needing a GPU (used by the kernel-build check)."""
        return self.compile(target=SM90_BUILD_TARGET)

    def build_all_for_sm90(self) -> Dict[str, Any]:
        """Every program a call may launch, compiled for sm_90 (one, unless a kernel has several)."""
        return {"main": self.build_for_sm90()}

    # ---- device checks ----------------------------------------------------------
    def check_device(self, device: torch.device) -> None:
        """Raise ``UnsupportedArchError`` unless ``device`` is a GPU this kernel supports."""
        major, minor = torch.cuda.get_device_capability(device)
        sm = major * 10 + minor
        if sm not in self.supported_archs:
            raise UnsupportedArchError(
                f"{type(self).__name__} supports SM {list(self.supported_archs)}, "
                f"but {torch.cuda.get_device_name(device)} is SM {sm}"
            )

    def __call__(self, *args: Any) -> Any:
        return self.forward(*args)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.static_signature()}, config={self.config})"
