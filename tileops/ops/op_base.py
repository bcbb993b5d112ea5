"""L1 ``Op``: the contract every generated operator implements.

Generated L3 ops (one file per manifest entry) fill in the manifest-driven
methods: ``_validate_dtypes``, ``_infer_output_shapes``, ``eval_roofline``,
``_static_axes`` and ``forward``.  L2 family bases supply the kernel launch
(``_run_kernel``) and how a kernel is built for the op's static sizes
(``_build_kernel``).  This module owns what all of them share: kernel-map
dispatch, the kernel cache, device routing and the wording of errors.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import secrets
import threading
import weakref
from typing import (Any, Callable, Dict, Hashable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Type,
                    TypeVar, Union)

import torch

from tileops import _params
from tileops.ops import gradient_formulas as formulas
from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import LayoutMemo

__all__ = ["Op", "STRICT_DEVICE_ENV", "SHARED_INSTANCE", "BackwardWiring", "ReferenceBackward", "FormulaBackward",
           "cast_to_dtype", "register_library_op"]

logger = logging.getLogger(__name__)

STRICT_DEVICE_ENV = "TILEOPS_STRICT_DEVICE"

# Backends a call can take; ``last_backend`` reports the most recent one.
KERNEL = "kernel"
REFERENCE = "reference"

# Custom ops find the instance that called them through an integer handle: the
# dispatcher passes only tensors and plain values.  Handles are random 62-bit numbers, so
# a graph saved or cached by another process (torch.export, torch.compile's caches) never
# names an instance of this one by accident, and the table holds instances weakly, so it
# never keeps an op alive.
_HANDLE_BITS = 62
_LIVE_OPS: "weakref.WeakValueDictionary[int, Op]" = weakref.WeakValueDictionary()
# A custom op called with this handle uses the shared instance for its static configuration:
# the functional API, and every op whose instance that shared one would equal (see
# ``Op._graph_handle``), so that graphs naming them run in any process.
SHARED_INSTANCE = -1
# Dtypes the reference path widens to float32 (see ``Op._reference_in_float32``).
_HALF_DTYPES = (torch.float16, torch.bfloat16)
_SHARED_CAPACITY = 256

OpT = TypeVar("OpT", bound="Op")


class _SharedInstances:
    """Bounded, thread-safe cache of op instances keyed by class and static configuration,
    evicting the least recently used.

    Every functional call and every custom-op call of a compiled graph looks its instance up
    here, so a hit takes no lock: a dict read and a use stamp, each one atomic operation in
    CPython (with a lock and an ordered dict's reordering a hit took 1.16-1.44 us on a CPU
    host, now 0.39-0.78).  Inserting and evicting hold the lock.  An instance evicted while a
    caller holds it keeps working; the next lookup of its key builds another."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: Dict[Hashable, Op] = {}  # changed under the lock only
        self._last_used: Dict[Hashable, int] = {}
        self._clock = itertools.count()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], OpT]) -> OpT:
        op = self._entries.get(key)
        if op is None:
            return self._insert(key, build)
        self._last_used[key] = next(self._clock)
        return op  # type: ignore[return-value]

    def _insert(self, key: Hashable, build: Callable[[], OpT]) -> OpT:
        op = build()  # outside the lock: construction may be slow, and a duplicate is harmless
        with self._lock:
            op = self._entries.setdefault(key, op)
            # Stamped before the eviction below, which must not take the entry just added.
            self._last_used[key] = next(self._clock)
            while len(self._entries) > self._capacity:
                # Only ``_entries`` is iterated: hits write stamps concurrently.
                oldest = min(self._entries, key=lambda k: self._last_used.get(k, -1))
                del self._entries[oldest]
                self._last_used.pop(oldest, None)
            if len(self._last_used) > 2 * self._capacity:
                # Stamps a hit wrote just after its key was evicted.
                self._last_used = {k: self._last_used.get(k, -1) for k in self._entries}
        return op  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._entries)


_SHARED = _SharedInstances(_SHARED_CAPACITY)
# Sets of input shapes an op remembers as passing its shape rules (emptied when full).
_PASSED_SHAPES_CAPACITY = 512


def _hashable(value: Any) -> Hashable:
    return tuple(value) if isinstance(value, list) else value


def _configuration_key(cls: type, config: Dict[str, Any]) -> Optional[Hashable]:
    """``cls`` and its keyword arguments as a key, whatever their order; None where a value
    cannot be part of one.

    Every functional call looks its instance up by this key, so the usual case (hashable
    values) is one C-level set construction; a list (``dim=[0, 1]``) becomes a tuple.  Other
    unhashable values (an array, a dict) are no param's type: the op's constructor names
    the argument and what it expected."""
    try:
        return cls, frozenset(config.items())
    except TypeError:
        pass
    try:
        return cls, frozenset((name, _hashable(value)) for name, value in config.items())
    except TypeError:
        return None


class Op(torch.nn.Module):
    """Base of every tileops operator.

    An op is constructed for the sizes it commits to (static dims), a dtype and
    its parameters; ``forward`` takes tensors.  CUDA tensors run TileLang
    kernels; CPU (and meta) tensors run the manifest's PyTorch reference, unless
    ``TILEOPS_STRICT_DEVICE=1`` makes CPU input an error.

    Calls are reentrant: everything a call derives from its inputs stays local
    to that call, so one instance may serve many threads and shapes.
    """

    kernel_map: Dict[str, Type[Kernel]]
    dtype: torch.dtype
    # The output dtype of ops with the manifest param ``out_dtype`` (None: the input's).  Declared
    # here so that every call of the others reads None: nn.Module answers a missing attribute by
    # raising, about 2.6 us a call (CPU host) where ``getattr`` catches it.
    out_dtype: Optional[torch.dtype] = None
    # Set by ``register_library_op``: the custom op's params (op attributes of those names),
    # and the eager autograd of a differentiable op.
    _library_params: Tuple[str, ...] = ()
    _autograd_function: Optional[Type[torch.autograd.Function]] = None
    # ``((position, name), ...)`` of the inputs the manifest marks ``constant`` (set by the L3 class).
    _constant_inputs: Tuple[Tuple[int, str], ...] = ()
    # Set by families whose kernels take every free extent (and stride) as a TileLang symbolic
    # value: their launches pass a key of their own, ``(device index, ...)``, as the only
    # "shape", so one kernel (and one tuned config) serves every shape on a device.
    kernels_keyed_by_launch: bool = False
    # Whether this op's kernels may differ from its configuration's shared instance's (a kernel
    # map or tuning of its own; see ``_graph_handle``); ``dispatch_kernel`` decides.
    _customized: bool = True

    def __init__(self) -> None:
        super().__init__()
        self._start_runtime_state()

    def _start_runtime_state(self) -> None:
        """What a live instance builds for itself as it runs (``_RUNTIME_STATE``)."""
        self._kernel_cache: Dict[Hashable, Kernel] = {}
        self._kernel_cache_lock = threading.Lock()
        # Host-side decisions per input geometry, for the families that use it (see LayoutMemo).
        self._layouts: LayoutMemo[Any] = LayoutMemo()
        # Input shapes that passed the manifest's shape rules (see ``_shapes_known``).
        self._valid_shapes: set = set()
        # Diagnostics only: which path the latest call took ("kernel" or "reference").
        self.last_backend: Optional[str] = None
        self._handle = _new_handle()
        _LIVE_OPS[self._handle] = self
        self._backward_op: Optional[Op] = None

    # ---- copies (copy.deepcopy, pickle, torch.save) ----------------------------------
    # A copy keeps the op's configuration (static dims, dtype, params, kernel map, tuning) and
    # starts its own runtime state: compiled kernels and locks cannot be pickled, and a handle
    # names one live instance.
    _RUNTIME_STATE = ("_kernel_cache", "_kernel_cache_lock", "_layouts", "_valid_shapes", "last_backend",
                      "_handle", "_backward_op")

    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()
        for name in self._RUNTIME_STATE:
            state.pop(name, None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        self._start_runtime_state()

    # ---- instances ------------------------------------------------------------------
    @classmethod
    def shared(cls: Type[OpT], **config: Any) -> OpT:
        """The process-wide instance for this static configuration (used by ``tileops.functional``)."""
        key = _configuration_key(cls, config)
        if key is None:
            return cls(**config)  # unshared; its constructor refuses such a value, naming it
        return _SHARED.get(key, lambda: cls(**config))

    @property
    def _graph_handle(self) -> int:
        """The handle this op's calls put in traced graphs (torch.compile, torch.export,
        torch.jit.trace).

        An op built as the shared instance of its configuration would be (default kernel map,
        no tuning of its own) puts ``SHARED_INSTANCE``: the graph then runs in any process, as
        the functional API's do.  Any other op puts its own handle, which only this process's
        instance answers."""
        return self._handle if self._customized else SHARED_INSTANCE

    @classmethod
    def from_handle(cls: Type[OpT], handle: int) -> OpT:
        """The live instance with ``handle``; for a Bwd class, the handle may be its Fwd op's.

        A Fwd op's autograd calls its Bwd op with the handle the forward was called with:
        that handle is in the forward graph, so a compiled backward that torch's caches give
        to another process (which numbers its instances differently) finds the right op.
        """
        op = _LIVE_OPS.get(handle)
        if not isinstance(op, cls) and op is not None and hasattr(op, "backward_op"):
            op = op.backward_op()
        if not isinstance(op, cls):
            raise RuntimeError(f"{cls.__name__}: no live instance has handle {handle} (was the op deleted while "
                               "a compiled graph still uses it, or is the graph from another process? Graphs "
                               "name ops with a kernel_map or tuning of their own by their instance)")
        return op

    # ---- manifest-driven contract (generated in every L3 op) ----------------------
    @property
    def default_kernel_map(self) -> Dict[str, Type[Kernel]]:
        raise NotImplementedError(f"{type(self).__name__}.default_kernel_map")

    def _validate_dtypes(self, *tensors: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__}._validate_dtypes")

    def _infer_output_shapes(self, *input_shapes: Tuple[int, ...]) -> Dict[str, Tuple[int, ...]]:
        raise NotImplementedError(f"{type(self).__name__}._infer_output_shapes")

    def eval_roofline(self, *input_shapes: Tuple[int, ...]) -> Tuple[int, int]:
        raise NotImplementedError(f"{type(self).__name__}.eval_roofline")

    def _static_axes(self, *input_shapes: Tuple[int, ...]) -> frozenset:
        """(input index, axis) pairs fixed at construction; axes are non-negative."""
        return frozenset()

    # ---- family contract (L2 bases) -------------------------------------------------
    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        """Construct ``self.kernel_map[key]`` for this op's static sizes and params."""
        raise NotImplementedError(f"{type(self).__name__}._build_kernel")

    def _run_kernel(self, *inputs: Optional[torch.Tensor]) -> Any:
        """The CUDA path of ``forward``, after every check has passed."""
        raise NotImplementedError(f"{type(self).__name__} has no kernel path")

    # ---- dispatch ------------------------------------------------------------------
    def dispatch_kernel(self, kernel_map: Optional[Mapping[str, Type[Kernel]]] = None) -> None:
        """Merge user overrides into ``default_kernel_map`` after checking them."""
        merged = dict(self.default_kernel_map)
        for key, kernel_cls in (kernel_map or {}).items():
            if key not in merged:
                raise ValueError(
                    f"{type(self).__name__}: unknown kernel_map key {key!r}; "
                    f"expected one of {sorted(merged)}"
                )
            if not (isinstance(kernel_cls, type) and issubclass(kernel_cls, Kernel)):
                raise TypeError(
                    f"{type(self).__name__}: kernel_map[{key!r}] must be a Kernel subclass, "
                    f"got {kernel_cls!r}"
                )
            merged[key] = kernel_cls
        self.kernel_map = merged
        # Graphs name an op with kernels of its own choosing by its instance (``_graph_handle``).
        self._customized = bool(kernel_map) or bool(getattr(self, "tune", False))

    def _cache_key(self, *input_shapes: Tuple[int, ...]) -> Hashable:
        """Key of the kernel cache: the launch's own key where ``kernels_keyed_by_launch``,
        else the sizes of every axis not fixed at construction."""
        if self.kernels_keyed_by_launch:
            return input_shapes[0]
        static = self._static_axes(*input_shapes)
        return tuple(
            tuple(size for axis, size in enumerate(shape) if (index, axis) not in static)
            for index, shape in enumerate(input_shapes)
        )

    def _kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        """The kernel for ``key`` and these shapes, built once per cache key."""
        cache_key = (key, self._cache_key(*input_shapes))
        kernel = self._kernel_cache.get(cache_key)
        if kernel is None:
            with self._kernel_cache_lock:
                kernel = self._kernel_cache.get(cache_key)
                if kernel is None:
                    kernel = self._build_kernel(key, *input_shapes)
                    self._kernel_cache[cache_key] = kernel
        return kernel

    def autotune(self, *examples: Any, force: bool = False) -> Dict[str, Dict[str, Any]]:
        """Autotune this op's kernels on the current GPU; return ``{kernel key: config}``.

        ``examples`` are forward inputs (tensors or shapes; ``None`` for an absent
        optional input) whose kernels are built first; with none, the kernels
        already built are tuned.  Winners are saved per device, so later processes
        reuse them without tuning; ``force`` retunes cached ones.
        """
        from tileops.tuning.ops import autotune_op  # deferred: only tuning needs it

        self._customized = True  # tuned here: the shared instance may hold other configs

        return autotune_op(self, *examples, force=force)

    # ---- calling -------------------------------------------------------------------
    def _dispatch(self, *inputs: Optional[torch.Tensor]) -> Any:
        """Run a validated call.

        Traced graphs (torch.compile, torch.jit.trace) go through the registered custom op
        (``_library_call``); torch.func transforms see the reference.  An eager call that
        autograd must record goes through the op's ``torch.autograd.Function``, which shares
        the custom op's autograd functions without its dispatch (about 100 us of host time a
        call); a plain eager call runs the computation directly.
        """
        if self._constant_inputs:
            self._refuse_constant_gradients(inputs)
        if torch.compiler.is_compiling() or torch._C._is_tracing():
            # A graph being traced (torch.compile, torch.jit.trace) records the custom op: a kernel
            # launched directly would leave the graph without the computation.
            return self._library_call(*inputs)
        if torch._C._are_functorch_transforms_active():
            # torch.func transforms (grad, vmap, jacrev, jvp, ...) wrap tensors the kernels cannot
            # read, and custom ops' autograd does not run under them: they see the PyTorch
            # reference, which every transform supports.
            return self.reference(*inputs)
        if _needs_grad(inputs):
            function = self._autograd_function
            if function is None:
                return self._library_call(*inputs)
            return function.apply(*inputs, *(getattr(self, name) for name in self._library_params), self._handle)
        return self._eager(*inputs)

    def _refuse_constant_gradients(self, inputs: Tuple[Optional[torch.Tensor], ...]) -> None:
        """Raise where an input the op does not differentiate would need a gradient: the Bwd op
        gives it none, and autograd would take that for a zero."""
        if not torch.is_grad_enabled():
            return
        for index, name in self._constant_inputs:
            tensor = inputs[index]
            if tensor is not None and tensor.requires_grad:
                raise ValueError(f"{type(self).__name__}: {name} requires grad, but the op does not differentiate "
                                 f"it (no gradient is computed for {name}); pass {name}.detach()")

    def _eager(self, *inputs: Optional[torch.Tensor]) -> Any:
        """The computation itself: the kernel for CUDA tensors, else the reference."""
        if self._route(*inputs) == REFERENCE:
            return self._reference_in_float32(*inputs)
        return self._run_kernel(*inputs)

    def _reference_in_float32(self, *inputs: Optional[torch.Tensor]) -> Any:
        """The reference computed as the kernels compute: half-precision inputs widened to
        float32, each output rounded once to the dtype the op gives it.

        Evaluated in half precision, a formula can lose every digit to rounding: RMSNorm's
        gradient of a one-element row is ``g * w * (1 - x**2 * r**2)``, a difference of two
        nearly equal halves.

        Outputs are contiguous, as the kernels' and the fake function's are: PyTorch's ops keep
        a transposed input's layout, and a compiled graph checks the strides its fake function
        promised."""
        if self.out_dtype is not None:
            return self._reference_in_out_dtype(*inputs)
        if not any(t is not None and t.dtype in _HALF_DTYPES for t in inputs):
            return _contiguous(self.reference(*inputs))
        result = self.reference(*(t.float() if t is not None and t.dtype in _HALF_DTYPES else t for t in inputs))
        promised = self._fake_outputs(*(None if t is None else t.to("meta") for t in inputs))
        if not isinstance(result, tuple):
            return _contiguous(result.to(promised.dtype))
        return _contiguous(tuple(out.to(like.dtype) for out, like in zip(result, promised)))

    def _kernel_dtypes(self) -> Tuple[Optional[torch.dtype], torch.dtype]:
        """(the dtype the inputs are cast to before the kernel runs, or None; the output's dtype),
        from the op's ``out_dtype`` param where it has one (a manifest ``dtype_param``).

        A forward's half-precision input to a float32 output is read as it is (the kernels
        compute in float32): one pass.  Any other change of dtype casts the inputs first, as
        PyTorch's ``dtype`` arguments are documented to, and runs the kernel of that dtype.  A
        backward's output is its result rounded to ``out_dtype`` (a gradient in its input's dtype),
        which its kernel writes as it is."""
        out_dtype = self.out_dtype
        if out_dtype is None or out_dtype == self.dtype:
            return None, self.dtype
        if self._is_backward or (out_dtype == torch.float32 and self.dtype in _HALF_DTYPES):
            return None, out_dtype
        return out_dtype, out_dtype

    @property
    def _is_backward(self) -> bool:
        return type(self).__name__.endswith("BwdOp")

    def _kernel_dtype_args(self) -> Dict[str, Any]:
        """The kernel's ``dtype`` and, where it writes another, ``out_dtype`` (see ``_kernel_dtypes``)."""
        cast, out_dtype = self._kernel_dtypes()
        dtype = cast or self.dtype
        return {"dtype": dtype} if out_dtype == dtype else {"dtype": dtype, "out_dtype": out_dtype}

    def _reference_in_out_dtype(self, *inputs: Optional[torch.Tensor]) -> Any:
        """``_reference_in_float32`` of an op given ``out_dtype``: a forward's inputs cast to it,
        then the reference of the op of that dtype without one; a backward's result, rounded to it.

        A forward's reference passes ``dtype=out_dtype`` to PyTorch, which then computes in that
        dtype (bfloat16 on the CPU), while the kernels compute in float32 and round once."""
        out_dtype = self.out_dtype
        # A wider dtype holds the inputs exactly: a backward then computes in it, as its kernel does.
        if not self._is_backward or out_dtype.itemsize > self.dtype.itemsize:
            inputs = tuple(t.to(out_dtype) if t is not None and t.is_floating_point() else t for t in inputs)
        plain = self._shared_for(*inputs, *(None if name == "out_dtype" else getattr(self, name)
                                            for name in self._library_params))
        result = plain._reference_in_float32(*inputs)
        return tuple(t.to(out_dtype) for t in result) if isinstance(result, tuple) else result.to(out_dtype)

    def _library_call(self, *inputs: Optional[torch.Tensor]) -> Any:
        raise NotImplementedError(f"{type(self).__name__}._library_call")

    @classmethod
    def _shared_for(cls: Type[OpT], *inputs_and_params: Any) -> OpT:
        """The shared instance for the configuration these inputs and params imply."""
        raise NotImplementedError(f"{cls.__name__}._shared_for")

    def reference(self, *inputs: Optional[torch.Tensor]) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.reference")

    def _plain_backward(self, *tensors: Optional[torch.Tensor]) -> Any:
        """The Bwd op on the tensors of an eager backward that records no graph and is not
        traced (a family whose backward may reuse a saved tensor's memory overrides this)."""
        return self.backward_op()._eager(*tensors)

    def _cached_backward_op(self, build: Callable[[], "Op"]) -> "Op":
        # A benign race: two threads may both build; either instance is equivalent.
        if self._backward_op is None:
            self._backward_op = build()
        return self._backward_op

    # ---- routing -------------------------------------------------------------------
    def _route(self, *tensors: Optional[torch.Tensor]) -> str:
        """Choose the kernel or the reference path from the inputs' device.

        Runs on every eager call, so it avoids building sets and reading the
        environment unless the inputs are on the CPU.
        """
        device = None
        for tensor in tensors:
            if tensor is None:
                continue
            if device is None:
                device = tensor.device
            elif tensor.device != device:
                found = ", ".join(sorted({str(t.device) for t in tensors if t is not None}))
                raise ValueError(f"{type(self).__name__}: inputs must share one device, got {found}")
        kind = "cpu" if device is None else device.type
        if kind == "cuda":
            backend = KERNEL
        elif kind != "meta" and os.environ.get(STRICT_DEVICE_ENV, "") not in ("", "0"):
            raise ValueError(
                f"{type(self).__name__}: inputs are on {device}, but {STRICT_DEVICE_ENV} is set; "
                "expected CUDA tensors"
            )
        else:
            backend = REFERENCE
        if backend != self.last_backend:
            logger.debug("%s runs the %s path on %s", type(self).__name__, backend, device)
            self.last_backend = backend
        return backend

    # ---- shape checks ---------------------------------------------------------------
    def _shapes_known(self, shapes: Hashable) -> bool:
        """Whether inputs of these shapes passed the shape rules before (the generated
        ``_check_inputs`` then skips them: rules read only shapes and the op's own values).

        Never while tracing, whose shapes may be symbolic (and unhashable), and whose graph
        must not depend on what eager calls have seen.  No lock: testing, adding to and
        clearing a set are atomic in CPython, and shapes a concurrent clear drops are
        only checked again.
        """
        if torch.compiler.is_compiling():
            return False
        try:
            return shapes in self._valid_shapes
        except TypeError:  # symbolic sizes
            return False

    def _remember_shapes(self, shapes: Hashable) -> None:
        """Remember shapes that passed the shape rules (see ``_shapes_known``)."""
        if torch.compiler.is_compiling():
            return
        try:
            if len(self._valid_shapes) >= _PASSED_SHAPES_CAPACITY:
                self._valid_shapes.clear()
            self._valid_shapes.add(shapes)
        except TypeError:  # symbolic sizes
            pass

    # ---- error wording ---------------------------------------------------------------
    def _rule_violation(self, rule: str, values: Mapping[str, Any], why: str = "", /,
                        **tensors: Optional[torch.Tensor]) -> ValueError:
        """The error of a shape rule that does not hold: the manifest's words on what it asks
        (``why``, where the rule has them), the rule, then the inputs' shapes and the params and
        static dims the rule reads (``values``)."""
        seen = [f"{name}.shape={tuple(t.shape)}" for name, t in tensors.items() if t is not None]
        seen += [f"{name}={value!r}" for name, value in values.items()]
        broken = f"shape rule `{rule}` does not hold for {', '.join(seen)}"
        if why:
            return ValueError(f"{type(self).__name__}: {why} ({broken})")
        return ValueError(f"{type(self).__name__}: {broken}")

    def _static_dim_mismatch(self, name: str, source: str, committed: int, got: int) -> ValueError:
        return ValueError(
            f"{type(self).__name__}: static dim {name} = {source} was committed as {committed} "
            f"at construction, but the input has {got}"
        )

    def _dtype_mismatch(self, argument: str, expected: str, got: torch.dtype) -> ValueError:
        return ValueError(f"{type(self).__name__}: {argument}.dtype must be {expected}, got {got}")

    def _check_init_dtype(self, dtype: torch.dtype, allowed: Tuple[torch.dtype, ...]) -> None:
        _check_dtype(type(self).__name__, dtype, allowed)

    def _check_dtype_param(self, name: str, allowed: Tuple[torch.dtype, ...]) -> None:
        """A param that names an output's dtype (``dtype_param``): None, or one of ``allowed``."""
        value = getattr(self, name)
        if value is not None:
            argument = name if self._is_backward else f"{name} (the functional form's dtype)"
            _check_dtype(type(self).__name__, value, allowed, " (the dtypes its input takes)", argument=argument)

    @classmethod
    def _require_tensors(cls, inputs: Dict[str, Any], optional: Tuple[str, ...] = ()) -> None:
        """A ``TypeError`` naming the first of ``inputs`` that is no tensor (``None`` is allowed for
        the ``optional`` ones)."""
        for name, value in inputs.items():
            if not isinstance(value, torch.Tensor) and not (value is None and name in optional):
                raise TypeError(f"{cls.__name__}: {name} must be a torch.Tensor, got {type(value).__name__}")

    def _check_params(self, types: Dict[str, str]) -> None:
        """Check each param attribute against its manifest type and keep its normalized value
        (``tileops._params``: sequences as tuples, a single axis as a one-element tuple)."""
        for name, type_name in types.items():
            try:
                value = _params.normalized(type_name, getattr(self, name))
            except _params.ParamTypeError as error:
                raise TypeError(f"{type(self).__name__}: {name} {error}") from None
            if isinstance(value, str) and type_name == "Optional[dtype]":  # a dtype by name
                value = getattr(torch, value)
            setattr(self, name, value)

    def _check_static_dims(self, sources: Dict[str, str]) -> None:
        """Each static dim (name -> the size it stands for, ``x.shape[dim]``) a size: an integer
        of at least 0, kept as a Python int (the kernels compile for it)."""
        for name, source in sources.items():
            value = getattr(self, name)
            if not _params.is_int(value):
                raise TypeError(f"{type(self).__name__}: {name} ({source}) must be an int, "
                                f"got {_params.described(value)}")
            if value < 0:
                raise ValueError(f"{type(self).__name__}: {name} ({source}) must be at least 0, got {value}")
            setattr(self, name, int(value))

    def _check_choice(self, name: str, value: Any, choices: Tuple[Any, ...]) -> None:
        if value not in choices:
            raise ValueError(f"{type(self).__name__}: {name} must be one of {list(choices)}, got {value!r}")

    def _check_bounds(self, name: str, value: Optional[float], minimum: Optional[float],
                      maximum: Optional[float]) -> None:
        """A number param within its manifest's inclusive bounds (None: unbounded, or an
        Optional param left unset)."""
        if value is None:
            return
        if (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
            return
        if minimum is not None and maximum is not None:
            expected = f"between {minimum!r} and {maximum!r}"
        else:
            expected = f"at least {minimum!r}" if minimum is not None else f"at most {maximum!r}"
        raise ValueError(f"{type(self).__name__}: {name} must be {expected}, got {value!r}")

    def _check_committed_dtype(self, argument: str, tensor: torch.Tensor) -> None:
        if tensor.dtype != self.dtype:
            raise ValueError(
                f"{type(self).__name__}: {argument}.dtype must be {self.dtype} "
                f"(the dtype given at construction), got {tensor.dtype}"
            )

    def _reference_gradients(self, needs_input_grad: Sequence[bool], inputs: Sequence[Optional[torch.Tensor]],
                             grads: Sequence[Optional[torch.Tensor]]) -> Tuple[Optional[torch.Tensor], ...]:
        """Gradients of ``reference`` at ``inputs`` (``backward: reference``): its vector-Jacobian
        product with ``grads``, for the inputs that need one.

        An eager backward (the usual one: real tensors, no graph of the gradient itself) runs
        the reference's own autograd.  Anything else (a compiled backward being traced, a
        ``create_graph`` backward, functorch transforms, tensor subclasses) takes
        ``torch.func.vjp``: it works in any grad mode and traces into a compiled backward
        graph, where inductor fuses the reference's backward; in eager mode its
        transform machinery costs most of a millisecond per call (H100 host, 1 x 4096 add).
        """
        wanted = [index for index, (tensor, needed) in enumerate(zip(inputs, needs_input_grad))
                  if needed and tensor is not None]
        gradients: List[Optional[torch.Tensor]] = [None] * len(inputs)
        if not wanted:
            return tuple(gradients)
        differentiate = _autograd_vjp if _plain_eager_backward(inputs, grads) else _functional_vjp

        def reference_of(*differentiated: torch.Tensor) -> Tuple[torch.Tensor, ...]:
            arguments = list(inputs)
            for index, tensor in zip(wanted, differentiated):
                arguments[index] = tensor
            result = self.reference(*arguments)
            return result if isinstance(result, tuple) else (result,)

        for index, gradient in zip(wanted, differentiate(reference_of, [inputs[i] for i in wanted], grads)):
            gradients[index] = gradient
        return tuple(gradients)

    def extra_repr(self) -> str:
        fields = {k: v for k, v in vars(self).items() if not k.startswith("_") and k not in (
            "training", "kernel_map", "last_backend")}
        return ", ".join(f"{k}={v}" for k, v in fields.items())


class BackwardWiring(NamedTuple):
    """How a Fwd op's custom op is differentiated: what it saves and how its Bwd op is called.

    Names follow the manifest: Bwd inputs are ``grad_<output>`` or saved tensors, and
    Bwd outputs are ``grad_<input>``.  ``same_gradient`` pairs an input with the input whose
    gradient it takes (the addends of a fused residual add): the Bwd op returns it once.
    """

    saves: Tuple[str, ...]
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    same_gradient: Tuple[Tuple[str, str], ...] = ()


class ReferenceBackward(NamedTuple):
    """An op the manifest differentiates by its reference (``backward: reference``): the backward
    recomputes the reference from the saved inputs and differentiates it."""


class FormulaBackward(NamedTuple):
    """An op the manifest differentiates by gradient formulas (``backward: {gradients: ...}``):
    the generated ``_formula_gradients`` reads the tensors named in ``saves`` (inputs or outputs)
    and the output gradients; every other input is kept as its ``ShapeOf`` only."""

    saves: Tuple[str, ...]


Differentiation = Union[BackwardWiring, ReferenceBackward, FormulaBackward]


def register_library_op(cls: Type[Op], name: str, schema: str, *, inputs: Sequence[str],
                        params: Sequence[str], outputs: Sequence[str],
                        backward: Optional[Differentiation] = None) -> Any:
    """Register ``cls`` as the custom op ``name``: its kernel, fake function and autograd.

    The custom op takes the op's tensors, its params and an instance handle
    (``SHARED_INSTANCE`` for the shared instance of the configuration the inputs
    imply), so compiled graphs and autograd reach the same instance, kernel map
    and tuned configs as the eager call.  ``backward`` wires its Bwd op, or the
    manifest's gradient formulas, or differentiates the reference, or is ``None`` for an
    op with no floating-point output (which autograd never differentiates).
    """
    input_names, output_names = tuple(inputs), tuple(outputs)
    n_inputs, n_params = len(input_names), len(params)
    no_grads = (None,) * (n_params + 1)

    def instance(args: Tuple[Any, ...]) -> Op:
        handle = args[-1]
        if handle != SHARED_INSTANCE:
            return cls.from_handle(handle)
        return cls._shared_for(*args[:-1])

    def kernel(*args: Any) -> Any:
        return instance(args)._eager(*args[:n_inputs])

    def fake(*args: Any) -> Any:
        op = instance(args)
        op._check_inputs(*args[:n_inputs])
        return op._fake_outputs(*args[:n_inputs])

    # Where each saved tensor is among (inputs..., outputs...), and for formulas which inputs are
    # seen by shape only: worked out once, not on every call.
    saves = getattr(backward, "saves", ())
    saved_positions = tuple((input_names + output_names).index(n) for n in saves)
    shape_only = tuple(i for i, n in enumerate(input_names) if n not in saves)
    # The Bwd output that is each input's gradient.
    taken_from = dict(getattr(backward, "same_gradient", ()))
    gradient_names = tuple(f"grad_{taken_from.get(n, n)}" for n in input_names)

    def remember(ctx: Any, op: Op, inputs: Tuple[Any, ...], output: Any) -> None:
        ctx.op = op
        ctx.handle = inputs[-1]
        tensors = inputs[:n_inputs]
        # Autograd refuses a gradient for an optional input that was None.
        ctx.present = tuple(t is not None for t in tensors)
        # An output of another dtype (``out_dtype``) gives gradients of its dtype: each goes back in its input's.
        ctx.dtypes = tuple(None if t is None else t.dtype for t in tensors)
        if isinstance(backward, ReferenceBackward):  # the reference is recomputed from the inputs
            ctx.save_for_backward(*tensors)
            return
        every = tensors + (output if isinstance(output, tuple) else (output,))
        ctx.save_for_backward(*(every[i] for i in saved_positions))
        if isinstance(backward, FormulaBackward):
            ctx.shapes_of = tuple(None if tensors[i] is None else formulas.ShapeOf.of(tensors[i])
                                  for i in shape_only)

    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:  # names fixed by torch
        remember(ctx, instance(inputs), inputs, output)

    def forward(ctx: Any, *args: Any) -> Any:
        # The eager Function's forward takes ``ctx`` first: a Function that defines
        # ``setup_context`` instead binds its arguments through ``inspect.signature`` on every
        # call (tens of microseconds).
        op = instance(args)
        output = op._eager(*args[:n_inputs])
        remember(ctx, op, args, output)
        return output

    def differentiate(ctx: Any, *grads: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        gradients = input_gradients(ctx, *grads)
        if any(g is not None and g.dtype != dtype for g, dtype in zip(gradients, ctx.dtypes)):
            gradients = tuple(g if g is None or g.dtype == dtype else g.to(dtype)
                              for g, dtype in zip(gradients, ctx.dtypes))
        return gradients + no_grads

    def input_gradients(ctx: Any, *grads: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        if isinstance(backward, ReferenceBackward):
            return ctx.op._reference_gradients(ctx.needs_input_grad[:n_inputs], ctx.saved_tensors, grads)
        if isinstance(backward, FormulaBackward):
            return formula_gradients(ctx, grads)
        named = {**dict(zip(backward.saves, ctx.saved_tensors)),
                 **{f"grad_{o}": g for o, g in zip(output_names, grads)}}
        tensors = [named[n] for n in backward.inputs]
        if _plain_eager_backward(tensors):
            result = ctx.op._plain_backward(*tensors)
        else:
            # The Bwd op is named by the forward's handle, never its own (see ``Op.from_handle``).
            result = ctx.op.backward_op()._library_call(*tensors, handle=ctx.handle)
        by_name = dict(zip(backward.outputs, result if isinstance(result, tuple) else (result,)))
        return tuple(by_name.get(n) if present else None for n, present in zip(gradient_names, ctx.present))

    # ``_formula_gradients`` takes every input (saved, or its shape), the saved outputs, then grads.
    formula_plan = tuple(("saved", saves.index(n)) if n in saves else ("shape", shape_only.index(i))
                         for i, n in enumerate(input_names))
    formula_plan += tuple(("saved", saves.index(n)) for n in output_names if n in saves)

    def formula_gradients(ctx: Any, grads: Tuple[Optional[torch.Tensor], ...]) -> Tuple[Optional[torch.Tensor], ...]:
        # Formulas serve one-output ops: a None gradient means nothing needs the output's.
        if grads[0] is None:
            return (None,) * n_inputs
        sources = {"saved": ctx.saved_tensors, "shape": ctx.shapes_of}
        arguments = [sources[kind][index] for kind, index in formula_plan]
        return ctx.op._formula_gradients(ctx.needs_input_grad[:n_inputs], *arguments, *grads)

    if backward is not None and not isinstance(backward, (BackwardWiring, ReferenceBackward, FormulaBackward)):
        raise ValueError(f"{cls.__name__}: backward must be a BackwardWiring, a ReferenceBackward, a "
                         f"FormulaBackward or None, got {backward!r}")
    library_op = _define_library_op(name, schema, kernel)
    torch.library.register_fake(name, fake, lib=_LIBRARY)
    cls._library_params = tuple(params)
    if backward is not None:
        _register_autograd(library_op, kernel, differentiate, setup_context)
        cls._autograd_function = type(f"{cls.__name__}Autograd", (torch.autograd.Function,), {
            "forward": staticmethod(forward),
            "backward": staticmethod(differentiate),
        })
    return library_op


# The custom ops' library.  Registered through ``torch.library.Library`` rather than
# ``torch.library.custom_op``, whose Python wrapper around the kernel cost about 5 us a call on
# an H200 host (docs/performance.md), which every op in a compiled graph pays.  What that
# wrapper checked, that no output aliases an input, the tests check with ``torch.library.opcheck``.
_LIBRARY = torch.library.Library("tileops", "FRAGMENT")


def _define_library_op(name: str, schema: str, kernel: Callable[..., Any]) -> Any:
    """Define ``name`` (``tileops::...``) with ``schema`` and ``kernel`` for every device; return its overload."""
    namespace, short_name = name.split("::")
    if namespace != _LIBRARY.ns:
        raise ValueError(f"custom op {name}: its namespace must be {_LIBRARY.ns}")
    _LIBRARY.define(short_name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    _LIBRARY.impl(short_name, kernel, "CompositeExplicitAutograd")
    return getattr(getattr(torch.ops, namespace), short_name).default


def _register_autograd(library_op: Any, kernel: Callable[..., Any], backward: Callable[..., Any],
                       setup_context: Callable[..., None]) -> None:
    """Register the autograd kernel ``torch.library.register_autograd`` would, with a shortcut.

    That kernel hands a call no gradient follows back to the dispatcher below autograd, from
    Python: about 10 us of host time a call (of 32, CPU host), which every tileops op in a
    compiled graph pays at run time.  A call on plain CPU or CUDA tensors with no gradient to
    record would reach ``kernel`` itself, so it calls it directly.  Everything else (an input
    requiring a gradient, fake or functional tensors while a graph is traced, dispatch modes,
    conjugate views) takes torch's own kernel, unchanged.
    """
    from torch._library.autograd import Info, make_autograd_impl  # what register_autograd builds

    recording = make_autograd_impl(library_op, Info(backward, setup_context))

    def autograd_kernel(keyset: Any, *args: Any, **keyword_only: Any) -> Any:
        if (not keyword_only and _reaches_backend_directly(keyset.raw_repr())
                and not (torch.is_grad_enabled() and torch._C._any_requires_grad(*args))):
            return kernel(*args)
        return recording(keyset, *args, **keyword_only)

    _LIBRARY.impl(library_op, autograd_kernel, "Autograd", with_keyset=True)


@functools.lru_cache(maxsize=None)  # a handful of keysets: one per backend and tensor kind seen
def _reaches_backend_directly(raw_keyset: int) -> bool:
    """Whether a call dispatched with this keyset goes from autograd straight to the CPU or CUDA
    kernel: nothing between them but the view/in-place tracking, which a functional op skips."""
    below = torch._C.DispatchKeySet.from_raw_repr(raw_keyset) & torch._C._after_autograd_keyset
    below = below.remove(torch._C.DispatchKey.ADInplaceOrView)
    return below.highestPriorityTypeId() in (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)


def cast_to_dtype(tensor: Any, dtype: Optional[torch.dtype], accepted: Tuple[torch.dtype, ...], op_name: str,
                  input_name: str) -> Any:
    """``tensor`` cast to ``dtype`` (as it is where ``dtype`` is None or already its dtype): the
    functional forms' ``dtype`` keyword, which PyTorch documents as casting the input before the
    operation.  A non-tensor passes through, for the op to refuse by name."""
    if dtype is None or not isinstance(tensor, torch.Tensor):
        return tensor
    _check_dtype(op_name, dtype, accepted, f" (the dtypes {input_name} takes)")
    return tensor.to(dtype)


def _check_dtype(op_name: str, dtype: Any, allowed: Tuple[torch.dtype, ...], note: str = "",
                 argument: str = "dtype") -> None:
    """A ``TypeError`` for a ``dtype`` that is no ``torch.dtype``, a ``ValueError`` for one outside ``allowed``."""
    names = ", ".join(str(d).replace("torch.", "") for d in allowed)
    if not isinstance(dtype, torch.dtype):  # e.g. "float32": "must be one of ..., float32, got float32" misled
        raise TypeError(f"{op_name}: {argument} must be a torch.dtype ({names}), got {dtype!r} "
                        f"({type(dtype).__name__})")
    if dtype not in allowed:
        raise ValueError(f"{op_name}: {argument} must be one of {names}{note}, got {dtype}")


def _new_handle() -> int:
    while True:
        handle = secrets.randbits(_HANDLE_BITS) + 1
        if handle not in _LIVE_OPS:
            return handle


def _contiguous(result: Any) -> Any:
    """An output, or a tuple of outputs, in contiguous memory (without a copy where it is)."""
    return tuple(out.contiguous() for out in result) if isinstance(result, tuple) else result.contiguous()


def _plain_eager_backward(*tensor_groups: Sequence[Optional[torch.Tensor]]) -> bool:
    """Whether a backward runs eagerly on plain tensors without recording a graph of itself."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return False
    return all(type(t) in _PLAIN_TENSOR_TYPES for group in tensor_groups for t in group if t is not None)


_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
ReferenceFn = Callable[..., Tuple[torch.Tensor, ...]]


def _cotangents(outputs: Sequence[torch.Tensor], grads: Sequence[Optional[torch.Tensor]]) -> Tuple[torch.Tensor, ...]:
    # Autograd passes None for an output nothing depends on.
    return tuple(torch.zeros_like(out) if grad is None else grad for out, grad in zip(outputs, grads))


def _functional_vjp(reference: ReferenceFn, primals: Sequence[torch.Tensor],
                    grads: Sequence[Optional[torch.Tensor]]) -> Tuple[torch.Tensor, ...]:
    outputs, pullback = torch.func.vjp(reference, *primals)
    return tuple(pullback(_cotangents(outputs, grads)))


def _autograd_vjp(reference: ReferenceFn, primals: Sequence[torch.Tensor],
                  grads: Sequence[Optional[torch.Tensor]]) -> Tuple[torch.Tensor, ...]:
    leaves = [primal.detach().requires_grad_() for primal in primals]
    with torch.enable_grad():
        outputs = reference(*leaves)
    pairs = [(out, grad) for out, grad in zip(outputs, _cotangents(outputs, grads)) if out.requires_grad]
    found = torch.autograd.grad([out for out, _ in pairs], leaves, [grad for _, grad in pairs],
                                allow_unused=True) if pairs else (None,) * len(leaves)
    # An input the outputs do not depend on has a zero gradient, as ``torch.func.vjp`` gives.
    return tuple(torch.zeros_like(leaf) if grad is None else grad for leaf, grad in zip(leaves, found))


def _needs_grad(inputs: Tuple[Optional[torch.Tensor], ...]) -> bool:
    if not torch.is_grad_enabled():
        return False
    for tensor in inputs:  # a plain loop: this runs on every eager call
        if tensor is not None and tensor.requires_grad:
            return True
    return False
