"""The elementwise program builder: one TileLang program shape per layout, any per-element function.

Every program reads its inputs in their storage dtype with ``vector``-wide
accesses (16 bytes when the caller's alignment allows), widens to float32,
applies a ``PointwiseFn`` and rounds once on the store.  A block of
``threads`` threads covers ``threads * vector * unroll`` elements: each
thread first issues its ``unroll`` loads, then computes and stores, so every
thread keeps several 16-byte loads in flight.  The grid has one block per
such tile ("enough blocks"): on an H100 that is thousands of blocks for any
tensor worth a kernel.

Layouts:

* **flat**: inputs and output are 1-D of symbolic length ``L`` (contiguous
  tensors of any rank, flattened).  A partial last vector is written element
  by element.
* **gated**: ``x`` is ``(R, N)`` with ``N = 2H`` static and a symbolic row
  stride; the forward writes ``y (R, H) = f(x[:, :H], x[:, H:])``, the
  backward reads ``grad_y (R, H)`` and ``x`` and writes both halves of
  ``grad_x (R, N)``.  ``vector`` divides ``H``, so no vector straddles rows
  or halves; the row of a vector is a division by a constant.
* **broadcast**: two operands viewed as ``(D0, D1, D2)`` with symbolic
  extents and outer strides (0 for a broadcast axis).  The innermost axis of
  an operand has unit stride, or stride 0 (``inner=False``: the operand is
  passed as ``(D0, D1)`` and read once per vector).  ``vector`` divides
  ``D2``; rows come from two divisions by symbolic extents per vector, or,
  when every row is a whole number of block tiles (``rows``), from the grid:
  ``(tiles per row, D1, D0)`` blocks, no divisions and no bounds checks.

``hinted``: the inputs' 16-byte loads carry L2's ``evict_last`` hint (see ``cache_hints``); the
kernels take it on large calls only (``ElementwiseKernel``).

Extents are int32: the kernels launch at most ``MAX_LAUNCH_ELEMENTS``
elements at a time (the launching code splits larger tensors), while
addresses are computed in 64-bit by TileLang and strides are int64, so
tensors over 2**31 elements are addressed correctly.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
from typing import Any

from tileops.kernels.cache_hints import CACHE_HINT_PRELUDE, EVICT_LAST, vector_load
from tileops.kernels.elementwise.functions import PointwiseFn
from tileops.kernels.kernel_base import strided_rows
from tileops.kernels.sizes import ACCUM

__all__ = ["flat_program", "gated_program", "broadcast_program", "MAX_LAUNCH_ELEMENTS", "MAX_GRID_YZ"]

# Elements one launch may cover: int32 index arithmetic stays far from overflow.
MAX_LAUNCH_ELEMENTS = 1 << 30
# The most blocks a grid may have along its second and third axes.
MAX_GRID_YZ = 65535


def _check_shape_params(vector: int, threads: int, unroll: int) -> None:
    if vector < 1 or vector & (vector - 1):
        raise ValueError(f"elementwise programs: vector must be a power of two, got {vector}")
    if not (32 <= threads <= 1024 and threads % 32 == 0):
        raise ValueError(f"elementwise programs: threads must be a multiple of 32 in [32, 1024], got {threads}")
    if unroll < 1:
        raise ValueError(f"elementwise programs: unroll must be positive, got {unroll}")


def _input_loads(T: Any, fn: PointwiseFn, hinted: bool, vector: int, dtype: str) -> Any:
    """The load macro of the inputs' vectors (``cache_hints.vector_load``) and the prelude the
    program's kernel needs for them and for ``fn`` (None: nothing)."""
    prelude = (CACHE_HINT_PRELUDE if hinted else "") + fn.prelude
    return vector_load(T, EVICT_LAST if hinted else None, vector, dtype), prelude or None


def _rounded(T: Any, fn: PointwiseFn, dtype: str, output: int, *loaded: Any) -> Any:
    """Output ``output`` of ``fn`` on loaded storage-dtype values, computed in float32, in ``dtype``."""
    return T.cast(fn.apply(T, *(T.cast(value, ACCUM) for value in loaded))[output], dtype)


def _results_macro(T: Any, fn: PointwiseFn, dtype: str, vector: int, output: int = 0) -> Any:
    """Macro ``(out, u, *buffers)``: output ``output`` of ``fn`` on vector ``u`` of the loaded
    ``buffers``, into ``out[:vector]``.

    Results go through registers so that the store after is one wide access: a vectorized loop
    whose body holds the math (``__expf``, ``fast_rcp``) is lowered to scalar stores for float32
    (four 4-byte stores a 16-byte vector), where half-precision outputs happened to get a cast
    buffer and one wide store."""

    def value(u, k, *loaded):
        return _rounded(T, fn, dtype, output, *(buf[u * vector + k] for buf in loaded))

    # One macro per arity: a TileLang macro's parameters are a fixed list.
    if fn.arity == 1:

        @T.macro
        def results(out, u, a):
            for k in T.unroll(vector):
                out[k] = value(u, k, a)

    elif fn.arity == 2:

        @T.macro
        def results(out, u, a, b):
            for k in T.unroll(vector):
                out[k] = value(u, k, a, b)

    else:

        @T.macro
        def results(out, u, a, b, c):
            for k in T.unroll(vector):
                out[k] = value(u, k, a, b, c)

    return results


# ---- flat ---------------------------------------------------------------------------------------


def flat_program(fn: PointwiseFn, dtype: str, *, vector: int, threads: int, unroll: int,
                 min_blocks: int = 1, hinted: bool = False) -> Any:
    """``Y[i] = fn(X[i])`` or ``fn(A[i], B[i])`` over a symbolic length ``L``."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    _check_shape_params(vector, threads, unroll)
    if fn.outputs != 1 or fn.arity not in (1, 2):
        raise ValueError(f"flat programs take one- or two-input functions with one output, got {fn.name}")
    L = T.dynamic("L")
    step = threads * vector  # elements of one unrolled step of the block
    tile = step * unroll  # elements of one block
    partial_vectors = vector > 1  # a last vector may be cut by the end of the tensor
    results = _results_macro(T, fn, dtype, vector)
    load_vector, prelude = _input_loads(T, fn, hinted, vector, dtype)

    @T.macro
    def load(src, buf, start):
        for u in T.unroll(unroll):
            if start + u * step + vector <= L:
                load_vector(buf, u * vector, src, start + u * step)

    if fn.arity == 1:

        @T.prim_func
        def elementwise_flat_unary(X: T.Tensor((L,), dtype), Y: T.Tensor((L,), dtype)):
            with T.Kernel(T.ceildiv(L, tile), threads=threads, prelude=prelude) as bx:
                if min_blocks > 1:
                    T.annotate_min_blocks_per_sm(min_blocks)
                tx = T.get_thread_binding()
                a = T.alloc_local((unroll * vector,), dtype)
                y = T.alloc_local((vector,), dtype)
                start = bx * tile + tx * vector
                load(X, a, start)
                for u in T.unroll(unroll):
                    if start + u * step + vector <= L:
                        results(y, u, a)
                        for k in T.vectorized(vector):
                            Y[start + u * step + k] = y[k]
                    if partial_vectors:
                        if start + u * step < L and start + u * step + vector > L:
                            for k in T.serial(vector):
                                if start + u * step + k < L:
                                    Y[start + u * step + k] = _rounded(T, fn, dtype, 0, X[start + u * step + k])

        return elementwise_flat_unary

    @T.prim_func
    def elementwise_flat_binary(
        A: T.Tensor((L,), dtype),
        B: T.Tensor((L,), dtype),
        Y: T.Tensor((L,), dtype),
    ):
        with T.Kernel(T.ceildiv(L, tile), threads=threads, prelude=prelude) as bx:
            if min_blocks > 1:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            a = T.alloc_local((unroll * vector,), dtype)
            b = T.alloc_local((unroll * vector,), dtype)
            y = T.alloc_local((vector,), dtype)
            start = bx * tile + tx * vector
            load(A, a, start)
            load(B, b, start)
            for u in T.unroll(unroll):
                if start + u * step + vector <= L:
                    results(y, u, a, b)
                    for k in T.vectorized(vector):
                        Y[start + u * step + k] = y[k]
                if partial_vectors:
                    if start + u * step < L and start + u * step + vector > L:
                        for k in T.serial(vector):
                            if start + u * step + k < L:
                                Y[start + u * step + k] = _rounded(
                                    T, fn, dtype, 0, A[start + u * step + k], B[start + u * step + k]
                                )

    return elementwise_flat_binary


# ---- gated --------------------------------------------------------------------------------------


def gated_program(fn: PointwiseFn, N: int, dtype: str, *, vector: int, threads: int, unroll: int,
                  min_blocks: int = 1, hinted: bool = False) -> Any:
    """Rows of ``x (R, N)`` split into gate ``x[:, :H]`` and up ``x[:, H:]`` halves.

    ``fn`` with two inputs is a forward, ``(gate, up) -> y``; with three a
    backward, ``(grad_y, gate, up) -> (grad_gate, grad_up)``.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    _check_shape_params(vector, threads, unroll)
    if N < 2 or N % 2:
        raise ValueError(f"gated programs: N must be even and positive, got {N}")
    H = N // 2
    if H % vector:
        raise ValueError(f"gated programs: vector {vector} must divide H = {H}")
    backward = fn.arity == 3
    if (fn.arity, fn.outputs) not in ((2, 1), (3, 2)):
        raise ValueError(f"gated programs take (gate, up) -> y or (grad_y, gate, up) -> (grad_gate, grad_up), "
                         f"got {fn.name}")
    per_row = H // vector  # vectors in one half row
    tile = threads * unroll  # vectors of one block
    R = T.dynamic("R")
    XT, LDX = strided_rows(T, R, N, dtype, "LDX")
    results = _results_macro(T, fn, dtype, vector)  # a forward's y; a backward's grad_gate
    load_vector, prelude = _input_loads(T, fn, hinted, vector, dtype)

    @T.macro
    def load_halves(X, gate, up, first):
        for u in T.unroll(unroll):
            if first + u * threads < R * per_row:
                load_vector(gate, u * vector, X, (first + u * threads) // per_row,
                            (first + u * threads) % per_row * vector)
                load_vector(up, u * vector, X, (first + u * threads) // per_row,
                            H + (first + u * threads) % per_row * vector)

    if not backward:

        @T.prim_func
        def elementwise_gated_fwd(
            X: XT,
            Y: T.Tensor((R, H), dtype),
        ):
            with T.Kernel(T.ceildiv(R * per_row, tile), threads=threads, prelude=prelude) as bx:
                if min_blocks > 1:
                    T.annotate_min_blocks_per_sm(min_blocks)
                tx = T.get_thread_binding()
                gate = T.alloc_local((unroll * vector,), dtype)
                up = T.alloc_local((unroll * vector,), dtype)
                y = T.alloc_local((vector,), dtype)
                T.assume(LDX % vector == 0)
                first = bx * tile + tx
                load_halves(X, gate, up, first)
                for u in T.unroll(unroll):
                    if first + u * threads < R * per_row:
                        results(y, u, gate, up)
                        for k in T.vectorized(vector):
                            Y[(first + u * threads) // per_row, (first + u * threads) % per_row * vector + k] = y[k]

        return elementwise_gated_fwd

    GT, LDG = strided_rows(T, R, H, dtype, "LDG")
    grad_up = _results_macro(T, fn, dtype, vector, output=1)

    @T.prim_func
    def elementwise_gated_bwd(
        G: GT,
        X: XT,
        DX: T.Tensor((R, N), dtype),
    ):
        with T.Kernel(T.ceildiv(R * per_row, tile), threads=threads, prelude=prelude) as bx:
            if min_blocks > 1:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            g = T.alloc_local((unroll * vector,), dtype)
            gate = T.alloc_local((unroll * vector,), dtype)
            up = T.alloc_local((unroll * vector,), dtype)
            dx = T.alloc_local((vector,), dtype)
            T.assume(LDX % vector == 0)
            T.assume(LDG % vector == 0)
            first = bx * tile + tx
            for u in T.unroll(unroll):
                if first + u * threads < R * per_row:
                    load_vector(g, u * vector, G, (first + u * threads) // per_row,
                                (first + u * threads) % per_row * vector)
            load_halves(X, gate, up, first)
            for u in T.unroll(unroll):
                if first + u * threads < R * per_row:
                    results(dx, u, g, gate, up)
                    for k in T.vectorized(vector):
                        DX[(first + u * threads) // per_row, (first + u * threads) % per_row * vector + k] = dx[k]
                    grad_up(dx, u, g, gate, up)
                    for k in T.vectorized(vector):
                        DX[(first + u * threads) // per_row, H + (first + u * threads) % per_row * vector + k] = dx[k]

    return elementwise_gated_bwd


# ---- broadcast ----------------------------------------------------------------------------------


def _check_broadcast_params(fn: PointwiseFn, vector: int, threads: int, unroll: int, a_inner: bool,
                            b_inner: bool) -> None:
    _check_shape_params(vector, threads, unroll)
    if fn.arity != 2 or fn.outputs != 1:
        raise ValueError(f"broadcast programs take two-input functions with one output, got {fn.name}")
    if not (a_inner or b_inner):
        raise ValueError("broadcast programs: at least one operand varies along the innermost axis")


def _broadcast_operands(T: Any, vector: int, a_inner: bool, b_inner: bool) -> Any:
    """The symbolic extents ``(D0, D1, D2)``, the (shape, strides) of ``A``, ``B`` (``(D0, D1)``
    faces where an operand is constant along the innermost axis) and ``Y``, and a macro stating
    that every outer stride is a multiple of ``vector``."""
    D0, D1, D2 = T.dynamic("D0"), T.dynamic("D1"), T.dynamic("D2")
    SA0, SA1, SB0, SB1, SY0, SY1 = (T.dynamic(name, "int64") for name in ("SA0", "SA1", "SB0", "SB1", "SY0", "SY1"))
    a = ((D0, D1, D2), (SA0, SA1, 1)) if a_inner else ((D0, D1), (SA0, SA1))
    b = ((D0, D1, D2), (SB0, SB1, 1)) if b_inner else ((D0, D1), (SB0, SB1))

    @T.macro
    def assume_aligned():
        if a_inner:
            T.assume(SA0 % vector == 0)
            T.assume(SA1 % vector == 0)
        if b_inner:
            T.assume(SB0 % vector == 0)
            T.assume(SB1 % vector == 0)
        T.assume(SY0 % vector == 0)
        T.assume(SY1 % vector == 0)

    return (D0, D1, D2), a, b, ((D0, D1, D2), (SY0, SY1, 1)), assume_aligned


def broadcast_program(fn: PointwiseFn, dtype: str, *, vector: int, threads: int, unroll: int,
                      a_inner: bool, b_inner: bool, rows: bool = False, min_blocks: int = 1,
                      hinted: bool = False) -> Any:
    """``Y[i, j, k] = fn(A[i, j, k], B[i, j, k])`` over strided ``(D0, D1, D2)`` views.

    ``a_inner``/``b_inner``: whether the operand varies along the innermost
    axis (unit stride) or is constant along it (passed as ``(D0, D1)``).
    ``rows``: the caller guarantees ``D2`` is a multiple of a block's tile
    (``threads * unroll * vector``) and ``D0, D1 <= MAX_GRID_YZ``; blocks then
    take their row from the grid.  The two divisions by symbolic extents that
    otherwise locate each vector precede its loads: small calls, where that
    latency is not hidden, gain about 0.13 us (H100, bf16 8 x 4096 plus a
    4096 bias: 4.86 -> 4.74 us, torch.compile 4.70-4.74).
    """
    if rows:
        return _broadcast_rows_program(fn, dtype, vector=vector, threads=threads, unroll=unroll, a_inner=a_inner,
                                       b_inner=b_inner, min_blocks=min_blocks, hinted=hinted)
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    _check_broadcast_params(fn, vector, threads, unroll, a_inner, b_inner)
    (D0, D1, D2), (a_shape, a_strides), (b_shape, b_strides), (y_shape, y_strides), assume_aligned = (
        _broadcast_operands(T, vector, a_inner, b_inner))
    tile = threads * unroll  # vectors of one block
    results = _results_macro(T, fn, dtype, vector)
    load_vector, prelude = _input_loads(T, fn, hinted, vector, dtype)

    def position(u, bx, tx):
        """(i0, i1, first column) of vector ``u`` of this thread; columns are a multiple of ``vector``."""
        index = bx * tile + u * threads + tx  # in vectors
        row = T.truncdiv(index, T.truncdiv(D2, vector))
        column = (index - row * T.truncdiv(D2, vector)) * vector
        return T.truncdiv(row, D1), T.truncmod(row, D1), column

    def valid(u, bx, tx):
        return bx * tile + u * threads + tx < D0 * D1 * T.truncdiv(D2, vector)

    def tile_macro(guarded: bool) -> Any:
        """Macro: load both operands' vectors of this thread, apply ``fn`` and store.

        Only a grid's last block (``guarded``) checks each vector against the
        end: without checks the loads and the store share one block of code, so
        the two divisions locating a vector are done once instead of per access.
        """

        def in_range(u, bx, tx):
            return valid(u, bx, tx) if guarded else True

        @T.macro
        def load(src, buf, inner, bx, tx):
            for u in T.unroll(unroll):
                if in_range(u, bx, tx):
                    if inner:
                        load_vector(buf, u * vector, src, *position(u, bx, tx))
                    else:
                        for k in T.vectorized(vector):
                            buf[u * vector + k] = src[position(u, bx, tx)[0], position(u, bx, tx)[1]]

        @T.macro
        def apply(A, B, Y, a, b, y, bx, tx):
            load(A, a, a_inner, bx, tx)
            load(B, b, b_inner, bx, tx)
            for u in T.unroll(unroll):
                if in_range(u, bx, tx):
                    results(y, u, a, b)
                    for k in T.vectorized(vector):
                        Y[position(u, bx, tx)[0], position(u, bx, tx)[1], position(u, bx, tx)[2] + k] = y[k]

        return apply

    full_tile, last_tile = tile_macro(False), tile_macro(True)

    @T.prim_func
    def elementwise_broadcast(
        A: T.StridedTensor(a_shape, a_strides, dtype),
        B: T.StridedTensor(b_shape, b_strides, dtype),
        Y: T.StridedTensor(y_shape, y_strides, dtype),
    ):
        with T.Kernel(T.ceildiv(D0 * D1 * T.truncdiv(D2, vector), tile), threads=threads, prelude=prelude) as bx:
            if min_blocks > 1:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            a = T.alloc_local((unroll * vector,), dtype)
            b = T.alloc_local((unroll * vector,), dtype)
            y = T.alloc_local((vector,), dtype)
            T.assume(D2 % vector == 0)
            assume_aligned()
            if (bx + 1) * tile <= D0 * D1 * T.truncdiv(D2, vector):
                full_tile(A, B, Y, a, b, y, bx, tx)
            else:
                last_tile(A, B, Y, a, b, y, bx, tx)

    return elementwise_broadcast


def _broadcast_rows_program(fn: PointwiseFn, dtype: str, *, vector: int, threads: int, unroll: int, a_inner: bool,
                            b_inner: bool, min_blocks: int = 1, hinted: bool = False) -> Any:
    """``broadcast_program`` with ``rows``: block ``(tile, i1, i0)`` covers one tile of row ``(i0, i1)``."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    _check_broadcast_params(fn, vector, threads, unroll, a_inner, b_inner)
    (D0, D1, D2), (a_shape, a_strides), (b_shape, b_strides), (y_shape, y_strides), assume_aligned = (
        _broadcast_operands(T, vector, a_inner, b_inner))
    tile = threads * unroll  # vectors of one block
    results = _results_macro(T, fn, dtype, vector)
    load_vector, prelude = _input_loads(T, fn, hinted, vector, dtype)

    def column(u, bx, tx):
        return (bx * tile + u * threads + tx) * vector

    @T.macro
    def load(src, buf, inner, i0, i1, bx, tx):
        for u in T.unroll(unroll):
            if inner:
                load_vector(buf, u * vector, src, i0, i1, column(u, bx, tx))
            else:
                for k in T.vectorized(vector):
                    buf[u * vector + k] = src[i0, i1]

    @T.prim_func
    def elementwise_broadcast_rows(
        A: T.StridedTensor(a_shape, a_strides, dtype),
        B: T.StridedTensor(b_shape, b_strides, dtype),
        Y: T.StridedTensor(y_shape, y_strides, dtype),
    ):
        with T.Kernel(T.truncdiv(D2, tile * vector), D1, D0, threads=threads, prelude=prelude) as (bx, i1, i0):
            if min_blocks > 1:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            a = T.alloc_local((unroll * vector,), dtype)
            b = T.alloc_local((unroll * vector,), dtype)
            y = T.alloc_local((vector,), dtype)
            T.assume(D2 % (tile * vector) == 0)
            assume_aligned()
            load(A, a, a_inner, i0, i1, bx, tx)
            load(B, b, b_inner, i0, i1, bx, tx)
            for u in T.unroll(unroll):
                results(y, u, a, b)
                for k in T.vectorized(vector):
                    Y[i0, i1, column(u, bx, tx) + k] = y[k]

    return elementwise_broadcast_rows
