"""What every elementwise kernel shares: configs, program compilation and launch helpers.

An elementwise kernel wraps one ``PointwiseFn`` and the program layouts of
``tileops.kernels.elementwise.programs`` that apply it.  Its config is
``{"threads", "unroll", "sm_threads", "hinted_min_mib"}``; the access width is not part of the
config but of each call: the widest power of two (up to 16 bytes) that the call's
addresses, strides and extents keep aligned.  A call that one access a thread
covers with at most a block per SM runs so, whatever the config's ``unroll``, in
``SMALL_CALL_THREADS``-thread blocks where the configured size is a multiple of
that, and with narrower accesses while it still does (``is_small_call``,
``small_call_vector``).  A call whose inputs take ``hinted_min_mib`` MiB or more loads them with
L2's ``evict_last`` hint (``hinted_config``).  Compiled programs are cached per (layout, width,
config), so a kernel compiles each program it actually launches once.
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

import torch

from tileops.kernels.cache_hints import EVICT_LAST, HINTED_MIN_MIB, hinted_min_bytes, takes_hint
from tileops.kernels.device_traits import has_fast_memory
from tileops.kernels.elementwise.functions import PointwiseFn
from tileops.kernels.elementwise.programs import MAX_LAUNCH_ELEMENTS
from tileops.kernels.kernel_base import SM90_BUILD_TARGET, Kernel, torch_dtype_to_tl
from tileops.kernels.launch import access_alignment, direct_launcher, widest_access
from tileops.kernels.sizes import SUPPORTED_DTYPES, THREADS_PER_SM, check_kernel_args, max_vector

__all__ = [
    "ElementwiseKernel", "ProgramSpec", "SUPPORTED_DTYPES", "elementwise_default_config",
    "elementwise_autotune_configs", "is_small_call", "one_access_config", "small_call_vector", "max_vector",
    "launch_slices", "SMALL_CALL_ACCESS_BYTES", "FLAT", "program_shape", "hinted_config",
]

# The program over 1-D contiguous tensors (``programs.flat_program``): its spec is ``(FLAT, vector)``.
FLAT = "flat"
# The narrowest access of a small call (see ``small_call_vector``).
SMALL_CALL_ACCESS_BYTES = 4
# Threads of a wide block (``elementwise_default_config``).
WIDE_BLOCK_THREADS = 512
# Threads of a small call's blocks, where the configured size is a multiple (``one_access_config``).
SMALL_CALL_THREADS = 128


# (layout name, shape parameters...): identifies one program of a kernel besides its config.
ProgramSpec = Tuple[Hashable, ...]


def launch_slices(length: int, limit: int = MAX_LAUNCH_ELEMENTS) -> Iterator[slice]:
    """``[0, length)`` cut into pieces of at most ``limit`` (a multiple of 16, so cuts keep alignment)."""
    for start in range(0, length, limit):
        yield slice(start, min(length, start + limit))


def elementwise_default_config(dtype: torch.dtype, sm_threads: int = 0, wide_blocks: bool = False) -> Dict[str, int]:
    """128 threads, each with two 16-byte loads per input in flight (one for 4-byte elements);
    ``sm_threads``: threads per SM the registers must allow (0: the compiler's choice);
    ``wide_blocks`` (kernels of light math, see ``ElementwiseKernel.wide_blocks``): half-precision
    calls take ``WIDE_BLOCK_THREADS`` threads with one 16-byte load per input each.

    Measured on an H100 (bf16, 0.5-1 GB moved): 97.8 % of copy bandwidth for
    silu, 99.6 % for add, 96.5 % for silu-and-mul with 256 threads; four loads
    per thread was as good for one input but lost 3-25 % on two-input and
    gated kernels (more registers, fewer resident blocks), eight lost up to
    half.  One load a thread loses up to 13 % in bf16 (gelu backward 8192 x
    16384: 273 -> 310 us) but wins or ties on every float32 kernel (µs, two
    loads / one: silu-and-mul 4 x 2048 x 8192 129.8 / 128.7, its backward
    219.3 / 218.9, gelu-and-mul 128.6 / 128.5, silu 8192 x 16384 353.1 /
    353.2, gelu backward 521.6 / 517.1, add 524.2 / 522.4).

    128 threads rather than 256: H100 cards differ here.  On some, 256-thread
    blocks ran 1-5 % behind torch.compile where 128 matched it (µs, 256 / 128
    / compile, median of 5 rounds taken in turns: silu 8192 x 16384 180.4 /
    176.9 / 176.3, bias add 180.2 / 176.4 / 176.1, gelu-and-mul 16384 x
    11008 353.3 / 349.4 / 349.9, its backward 656.4 / 625.8 / 1207.8); on
    others both ran within 0.15 % of each other and of torch.compile (relu
    176.7 / 177.0 / 176.5, silu float32 352.9 / 353.1 / 354.1).

    Wide blocks: with light math per element, 512 threads of one load each beat 128 of two on
    H100 (µs, bf16 8192 x 16384, median of 7 rounds in turns, 128 x 2 / 256 x 1
    / 512 x 1 / torch.compile: silu 176.7 / 176.2 / 175.8 / 176.3, its float16 176.6 / 176.2 /
    175.8 / 176.4, relu 176.6 / 176.1 / 175.8 / 176.2, exp 176.7 / 176.3 / 175.9 / 176.4,
    sigmoid 176.7 / 176.1 / 175.8 / 176.2, add 260.2 / 259.9 / 259.6 / 259.8; 1 x 4096 silu
    4.58 / 4.54 / 4.58 / 4.58).
    """
    if wide_blocks and dtype.itemsize == 2:
        return {"threads": WIDE_BLOCK_THREADS, "unroll": 1, "sm_threads": sm_threads, "hinted_min_mib": HINTED_MIN_MIB}
    return {"threads": 128, "unroll": 1 if dtype.itemsize == 4 else 2, "sm_threads": sm_threads,
            "hinted_min_mib": HINTED_MIN_MIB}


def program_shape(config: Dict[str, Any]) -> Dict[str, Any]:
    """The program builders' keywords for ``config``: threads, unroll, the blocks per SM the
    compiler must fit (``sm_threads`` over ``threads``, at least one) and whether the loads are
    hinted (``hinted_config``)."""
    threads = config["threads"]
    return {"threads": threads, "unroll": config["unroll"],
            "min_blocks": max(1, min(config.get("sm_threads", 0), THREADS_PER_SM) // threads),
            "hinted": bool(config.get("hinted", False))}


def hinted_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """The config a call whose inputs take ``hinted_min_mib`` MiB or more runs under: its
    16-byte loads carry L2's ``evict_last`` hint (see ``cache_hints``)."""
    return {**config, "hinted": True}


def is_small_call(config: Dict[str, Any], accesses: int, sm_count: int) -> bool:
    """Whether a call of ``accesses`` vector accesses runs with one access a thread
    (``one_access_config``): when even that fills no more than a block per SM.

    Such calls are latency-bound: each thread's loads, math and stores run in turn, so half the
    work a thread finishes sooner, and the extra blocks land on idle SMs.  (Measured on H100,
    fp32, kernel time: 8 x 8192 gated GELU backward 2.25 us with two accesses a thread, 1.68 with
    one, torch.compile's 2.02; 3 x 254 gated SiLU backward 1.64 against 1.39; 8 x 8192 gated
    SiLU forward 1.73 against 1.58.)
    """
    return accesses <= sm_count * config["threads"]


def small_call_vector(vector: int, accesses: int, capacity: int, itemsize: int) -> int:
    """The access width (elements) of a small call of ``accesses`` accesses ``vector`` wide: halved
    while the call still fits ``capacity`` accesses (a block per SM) and its accesses stay at least
    ``SMALL_CALL_ACCESS_BYTES`` wide.

    A thread's elements are a chain of math that narrower accesses spread over more threads.
    (Measured on H100, bf16, device time at 16 / 8 / 4 / 2 bytes an access: 8 x 8192 gated GELU
    backward 5.18 / 4.83 / 4.70 / 4.70 us, torch.compile 4.80; 1 x 4096 GELU backward 4.86 / 4.61
    / 4.61 / 4.58; fp16 2 x 5 x 96 gated GELU backward 5.09 / 4.64 / 4.67 / 4.61; SiLU and add
    within 0.1 us at every width.)
    """
    while vector * itemsize > SMALL_CALL_ACCESS_BYTES and 2 * accesses <= capacity:
        vector //= 2
        accesses *= 2
    return vector


def one_access_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """The config a small call runs under: one access a thread, in blocks of
    ``SMALL_CALL_THREADS`` where the configured blocks are a multiple of that (so a small
    call's block tile still divides the configured one, see ``BroadcastKernel``).

    Smaller blocks spread a small call's few accesses over more SMs.  (Measured on H100,
    bf16, median of 9 rounds in turns, 512-thread / 128-thread blocks / torch.compile, µs:
    1 x 4096 add 4.45 / 4.42 / 4.42, multiply 4.58 / 4.54 / 4.54, exp 4.51 / 4.54 / 4.54;
    fp16 2 x 5 x 96 gated SiLU 4.45 / 4.42 / 4.35.)
    """
    threads = config["threads"]
    return {**config, "unroll": 1, "threads": SMALL_CALL_THREADS if threads % SMALL_CALL_THREADS == 0 else threads}


def elementwise_autotune_configs(dtype: torch.dtype, sm_threads: int = 0,
                                 wide_blocks: bool = False) -> List[Dict[str, int]]:
    """The heuristic first, then block sizes and loads in flight around it."""
    candidates = [elementwise_default_config(dtype, sm_threads, wide_blocks)]
    for threads in (128, 256, 512):
        for unroll in (1, 2, 4, 8):
            config = {"threads": threads, "unroll": unroll, "sm_threads": sm_threads, "hinted_min_mib": HINTED_MIN_MIB}
            if config not in candidates:
                candidates.append(config)
    return candidates


class ElementwiseKernel(Kernel):
    """Base of the elementwise kernels: one per-element function, several program layouts.

    Subclasses set ``function`` (or override ``pointwise``), implement
    ``build_program(spec, config)`` and ``typical_specs()`` (the programs a
    contiguous, aligned call launches, built by ``build_all_for_sm90``), and
    ``forward``.  ``op_params`` names the op attributes the constructor takes
    beyond the dtype (e.g. ``("N", "approximate")``).
    """

    function: Optional[PointwiseFn] = None
    op_params: Tuple[str, ...] = ()
    # Threads per SM the compiler must leave registers for (0: its own choice).  Functions heavy in
    # special-function math keep many values live, and the compiler then trades occupancy for
    # registers that a memory-bound kernel needs less than resident threads (see the GELU kernels).
    sm_threads: int = 0
    # Kernels whose math per element is light enough that half-precision calls take wide blocks of
    # one load a thread (see ``elementwise_default_config``).
    wide_blocks: bool = False
    # The block size and the loads of each input a half-precision thread keeps in flight on
    # devices with fast memory (``device_traits``), where they differ from
    # ``elementwise_default_config``'s (0: they do not).
    fast_memory_threads: int = 0
    fast_memory_unroll: int = 0
    # "2": the hinted_min_mib config key.
    version = "2"
    # Whether large calls load with the L2 hint (``hints_call``); False where the hint's registers
    # would spill under the kernel's ``sm_threads`` cap.
    hinted_loads: bool = True

    def __init__(self, dtype: torch.dtype, *, config: Optional[Dict[str, Any]] = None, tune: bool = False) -> None:
        check_kernel_args(type(self).__name__, dtype)
        super().__init__(dtype, config=config, tune=tune)

    # ---- what subclasses supply ----------------------------------------------------------------
    @property
    def pointwise(self) -> PointwiseFn:
        """The per-element function this kernel applies."""
        if self.function is None:
            raise NotImplementedError(f"{type(self).__name__} names no function")
        return self.function

    def build_program(self, spec: ProgramSpec, config: Dict[str, Any]) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.build_program")

    def typical_specs(self) -> List[ProgramSpec]:
        """The programs launched on contiguous, 16-byte aligned tensors."""
        raise NotImplementedError(f"{type(self).__name__}.typical_specs")

    # ---- configs -------------------------------------------------------------------------------
    @property
    def default_config(self) -> Dict[str, Any]:
        config = elementwise_default_config(self.dtype, self.sm_threads, self.wide_blocks)
        if self.fast_memory_threads and self.dtype.itemsize == 2 and has_fast_memory():
            config.update(threads=self.fast_memory_threads, unroll=self.fast_memory_unroll)
        return config

    @property
    def autotune_configs(self) -> List[Dict[str, Any]]:
        return elementwise_autotune_configs(self.dtype, self.sm_threads, self.wide_blocks)

    # ---- programs ------------------------------------------------------------------------------
    def program(self, **config: Any) -> Any:
        """The first typical program (what ``Kernel.compile`` and ``build_for_sm90`` build)."""
        return self.build_program(self.typical_specs()[0], {**self.default_config, **config})

    def compile_program(self, spec: ProgramSpec, config: Optional[Dict[str, Any]] = None,
                        target: Any = "auto") -> Any:
        """The compiled program ``spec`` for ``config`` (default: the current one), cached."""
        config = dict(self.config if config is None else config)
        key = (spec, repr(target)) + tuple(sorted(config.items()))
        return self.compile_once(key, lambda: self.build_program(spec, config), target, (spec, config))

    def small_call_spec(self, spec: ProgramSpec, accesses: int, sm_count: int) -> ProgramSpec:
        """Program ``spec`` (whose second item is the access width) at the width of a small call
        (``small_call_vector``); it runs under ``one_access_config``."""
        vector = small_call_vector(spec[1], accesses, sm_count * self.config["threads"], self.dtype.itemsize)
        return (spec[0], vector, *spec[2:])

    def call_programs(self, spec: ProgramSpec, accesses: int, sm_count: int,
                      input_bytes: Optional[int] = None) -> List[Tuple[ProgramSpec, Dict[str, Any]]]:
        """The (program, config) pairs a call of program ``spec`` may run: the current config
        (hinted where the call's ``input_bytes``, by default ``streamed_bytes``, reach
        ``hinted_min_mib``), and the small-call program of ``accesses`` accesses on ``sm_count`` SMs."""
        return [(spec, self.large_call_config(spec, accesses, input_bytes)),
                (self.small_call_spec(spec, accesses, sm_count), one_access_config(self.config))]

    def large_call_config(self, spec: ProgramSpec, accesses: int, input_bytes: Optional[int] = None) -> Dict[str, Any]:
        """The config a call of program ``spec`` runs under when it is not small: the current one
        (not a copy: the launcher asks on every plan lookup), or ``hinted_config`` of it where the
        call's ``input_bytes`` (default ``streamed_bytes``) reach ``hinted_min_mib``."""
        input_bytes = self.streamed_bytes(spec, accesses) if input_bytes is None else input_bytes
        return hinted_config(self.config) if self.hints_call(spec, input_bytes) else self.config

    def typical_programs(self) -> List[Tuple[ProgramSpec, Dict[str, Any]]]:
        """The typical programs under the current config, as the smallest calls run them (one
        access a thread, the narrowest width) and, where their loads take the hint, as the largest
        calls run them."""
        programs = [program for spec in self.typical_specs() for program in self.call_programs(spec, 1, 1 << 20)]
        return programs + [(spec, hinted_config(self.config)) for spec in self.typical_specs()
                           if self.hints_vector(spec[1])]

    def build_all_for_sm90(self) -> Dict[Tuple[ProgramSpec, int, bool], Any]:
        """Compile ``typical_programs`` for sm_90, without a GPU; keyed by (spec, unroll, hinted)."""
        return {(spec, config["unroll"], config.get("hinted", False)):
                self.compile_program(spec, config, target=SM90_BUILD_TARGET)
                for spec, config in self.typical_programs()}

    def streamed_bytes(self, spec: ProgramSpec, accesses: int) -> int:
        """The input bytes a call of ``accesses`` accesses of program ``spec`` reads when every
        access loads one vector of each input (the flat and gated programs)."""
        return accesses * spec[1] * self.dtype.itemsize * self.pointwise.arity

    def hints_call(self, spec: ProgramSpec, input_bytes: int) -> bool:
        """Whether a call of program ``spec`` whose inputs take ``input_bytes`` loads with
        ``evict_last``: they take ``hinted_min_mib`` MiB or more and its loads move 16 bytes."""
        return input_bytes >= hinted_min_bytes(self.config["hinted_min_mib"]) and self.hints_vector(spec[1])

    def hints_vector(self, vector: int) -> bool:
        """Whether accesses of ``vector`` elements may carry the hint (16 bytes, and ``hinted_loads``)."""
        return self.hinted_loads and takes_hint(EVICT_LAST, vector, torch_dtype_to_tl(self.dtype))

    def launcher(self, spec: ProgramSpec, accesses: int, device: torch.device,
                 input_bytes: Optional[int] = None) -> Any:
        """The fastest callable of program ``spec`` for a call of ``accesses`` vector accesses
        (the program's work items) whose inputs take ``input_bytes`` (default ``streamed_bytes``)
        on ``device``, under the current config."""
        sm_count = self.sm_count(device)
        small = is_small_call(self.config, accesses, sm_count)
        if small:
            spec = self.small_call_spec(spec, accesses, sm_count)
            config = one_access_config(self.config)
        else:
            config = self.large_call_config(spec, accesses, input_bytes)
        # Remembered per config (assigning one forgets them): a compile key per call costs microseconds.
        return self._launch_plans.get((spec, small, config.get("hinted", False)),
                                      lambda: direct_launcher(self.compile_program(spec, config)))

    def flat_vector(self, tensors: Sequence[torch.Tensor]) -> int:
        """The access width that every (1-D, contiguous) tensor's address allows."""
        vector = max_vector(self.dtype)
        for tensor in tensors:
            vector = widest_access(tensor, 0, vector)
        return vector

    def flat_launcher(self, tensors: Sequence[torch.Tensor]) -> Any:
        """The launcher of the flat program ``FLAT`` over 1-D contiguous ``tensors`` of one length.

        Remembered per (length, address alignment, device): an eager call of a small tensor
        would otherwise spend more time choosing its program than launching it.
        """
        out = tensors[-1]
        length = out.numel()
        key = (FLAT, length, access_alignment(tensors), out.get_device())
        return self._launch_plans.get(key, lambda: self._flat_launcher(tensors, length))

    def _flat_launcher(self, tensors: Sequence[torch.Tensor], length: int) -> Any:
        vector = self.flat_vector(tensors)
        return self.launcher((FLAT, vector), -(-length // vector), tensors[-1].device)

    def _check_count(self, tensors: Sequence[torch.Tensor], expected: int) -> None:
        if len(tensors) != expected:
            raise TypeError(f"{type(self).__name__}: expected {expected - 1} inputs and out, got {len(tensors)} tensors")
