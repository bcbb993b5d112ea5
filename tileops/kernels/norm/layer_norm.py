"""LayerNorm forward and backward over the last axis of an ``(M, N)`` tensor.

Forward: ``y = (x - mean) * rsqrt(var + eps) * weight + bias`` with the
biased variance; ``weight`` and ``bias`` may each be absent (a separate
program per combination, so an absent one costs nothing).  Rows that fit in
registers take the resident program: each lane's mean and squared deviations
from it, merged over the row's lanes in one reduction (Chan's pairwise merge,
no cancellation; rows whose lanes hold unequal shares take the mean, then the
variance around it, in two), then the output.  Longer
rows take the streamed program: one pass accumulates sums of ``x - x[0]`` and
their squares (shifting by the row's first element keeps the variance
accurate when the mean is large), a second pass writes.

The backward (``LayerNormBwdKernel``) shares its programs with RMSNorm's,
in ``tileops.kernels.norm.backward``.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
from typing import Any, Dict, List, Optional, Tuple

import torch

from tileops.kernels.cache_hints import EVICT_LAST, HINTED_MIN_MIB
from tileops.kernels.device_traits import has_fast_memory
from tileops.kernels.kernel_base import strided_rows, torch_dtype_to_tl
from tileops.kernels.norm.backward import NormBwdKernel
from tileops.kernels.norm.rows import (
    MAX_EXTENT,
    RowLayout,
    RowNormFwdKernel,
    StreamLayout,
    resident_layout,
    resident_macros,
    row_moments_macro,
    row_sum_macro,
    row_slices,
    scratch_shape,
    stream_macros,
)
from tileops.kernels.sizes import ACCUM, MAX_THREADS, REGISTERS_PER_SM, THREADS_PER_SM, max_vector, next_pow2

__all__ = ["LayerNormFwdKernel", "LayerNormBwdKernel", "layer_norm_fwd_default_config"]

# Bytes of a row one thread may hold in registers in the resident program: two 16-byte
# vectors.  (H100, bf16, 8192 x 32768: resident with 32 elements a thread 396 us,
# streamed with 1024 threads 380 us.)
RESIDENT_BYTES = 32
# Rows of at least this many bytes (1024 threads' two vectors) are streamed on devices with fast
# memory, in chunks of a quarter row, each thread with two vectors in flight.
FAST_MEMORY_STREAMED_BYTES = MAX_THREADS * RESIDENT_BYTES
FAST_MEMORY_CHUNKS_A_ROW = 4
FAST_MEMORY_STREAM_UNROLL = 2
# Registers a thread of the resident program may take on devices with fast memory, by element
# size: what its two vectors of x (and x in float32) need without spilling, so that more blocks
# share an SM (see ``layer_norm_fwd_default_config``).
FAST_MEMORY_RESIDENT_REGISTERS = {2: 40, 4: 32}

RESIDENT = "layer_norm_fwd_resident"
RESIDENT_HINTED = "layer_norm_fwd_resident_hinted"
# The resident program held to ``resident_blocks_per_sm``, taken by calls of ``HELD_MIN_MIB`` or more.
RESIDENT_HELD = "layer_norm_fwd_resident_held"
# Calls whose input takes this many MiB or more fill the GPU many times over: only they gain from
# more blocks an SM, while a call of a few rows waits longer on each held block (see
# ``layer_norm_fwd_default_config``).
HELD_MIN_MIB = 16
STREAMED = "layer_norm_fwd_streamed"


def layer_norm_fwd_default_config(N: int, dtype: torch.dtype, fast_memory: bool = False) -> Dict[str, int]:
    """Two 16-byte vectors per thread (more for long rows, a row gets at most 1024 threads, and
    rows that need more than two vectors a thread are streamed); streamed rows: 1024 threads
    with one vector in flight each (H100, bf16, 8192 x 32768: 380 us against 399 us with 512
    threads and two vectors).

    ``fast_memory`` (``device_traits.has_fast_memory``): rows of ``FAST_MEMORY_STREAMED_BYTES``
    or more, which would take 1024 threads a block and one block an SM, are streamed instead,
    in chunks of a quarter row with two vectors in flight a thread.  H200, bf16, median of 7
    rounds in turns, µs, threads / vectors in flight: 16384 x 16384 resident on 1024 threads
    467.4, streamed 256/2 277.3, 512/2 313.1, 256/4 281.6, 512/4 442.6, 1024/1 418.2
    (torch.compile 257.1); 8192 x 32768 512/2 276.6, 1024/1 326.6, 1024/2 351.9, 512/1 283.8,
    512/4 377.7, 256/2 338.6 (torch.compile 338.6); 4096 x 65536 1024/2 292.1, 1024/1 304.5,
    512/2 345.0, 256/2 375.2 (torch.compile 442.7).  Resident rows there are held to
    ``FAST_MEMORY_RESIDENT_REGISTERS`` a thread (``resident_blocks_per_sm``; 0: the compiler
    chooses): the compiler took 48 (bf16, 16 elements a thread) and 40 (float32, 8), five and
    three blocks an SM.  H200, median of 7 rounds in turns, µs, compiler's / held: bf16 32768 x
    4096 137.4 / 129.2 (six 256-thread blocks, 40 registers; 32 spilled 20 bytes), float32 8 x
    2048 x 4096 128.1 / 124.9 (four 512-thread blocks, 32 registers); torch.compile 187.3 and
    127.2.  A single row of 4096 bf16 ran slower held (bench: 5.54 µs against 4.90 before,
    torch.compile 5.31), so only calls of ``HELD_MIN_MIB`` or more take the held program
    (``RESIDENT_HELD``, and the hinted one).

    ``hinted_min_mib``: resident calls whose input takes at least this many MiB load it with L2's
    ``evict_last`` (the ``RESIDENT_HINTED`` program; 0: every call whose loads can take it), as
    ``RMSNormFwdKernel`` does.  H100, rows of 4096, median of 7 rounds in turns, µs without /
    with the hint: bf16 8192 rows 42.94 / 44.86, 16384 rows 86.18 / 87.81, 24576 rows
    131.30 / 131.26, 32768 rows 176.99 / 175.18 (torch.compile 203.90); fp32 8192 rows
    84.93 / 87.68, 16384 rows 176.30 / 174.88 (torch.compile 175.62)."""
    vector_elems = max_vector(dtype)
    per_thread = max(2 * vector_elems, -(-N // MAX_THREADS))
    threads, unroll, blocks_per_sm = 1024, 1, 0
    if fast_memory and N * dtype.itemsize >= FAST_MEMORY_STREAMED_BYTES:
        per_thread = 4 * vector_elems  # more than a thread holds: the rows are streamed
        unroll = FAST_MEMORY_STREAM_UNROLL
        threads = min(MAX_THREADS, next_pow2(-(-N // (FAST_MEMORY_CHUNKS_A_ROW * unroll * vector_elems))))
    elif fast_memory:  # rows held in registers
        block_threads = resident_layout(N, dtype, per_thread).block_threads
        blocks_per_sm = min(THREADS_PER_SM // block_threads,
                            REGISTERS_PER_SM // (FAST_MEMORY_RESIDENT_REGISTERS[dtype.itemsize] * block_threads))
    return {"per_thread": per_thread, "stream_threads": threads, "stream_unroll": unroll,
            "hinted_min_mib": HINTED_MIN_MIB, "resident_blocks_per_sm": blocks_per_sm}


def _resident_fwd_program(N: int, dtype: str, eps: float, layout: RowLayout, has_weight: bool, has_bias: bool,
                          policy: Optional[str] = None, blocks_per_sm: int = 0) -> Any:
    """``policy``: the L2 eviction hint of the row's loads (``cache_hints``; None: plain loads);
    ``blocks_per_sm``: blocks an SM must hold at once, which caps a thread's registers (0: none)."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    M = T.dynamic("M")
    XT, LDX = strided_rows(T, M, N, dtype, "LDX")
    per_thread, vector, row_threads = layout.per_thread, layout.vector, layout.row_threads
    rows_per_block = layout.rows_per_block
    loads = resident_macros(T, layout, M, policy, dtype)
    prelude = loads["prelude"]
    column, each_vector = loads["column"], loads["each_vector"]
    # Lanes holding equal shares of a row merge their own moments in one reduction; rows with a
    # tail (lanes of unequal shares) take the mean, then the centred squares, in two: a merge of
    # unequal counts divides at every step, which more than doubled the sm_90 instructions of
    # rows of 3072 or 5120.
    merged = not layout.has_tail
    if merged:
        row_moments = row_moments_macro(T, layout)
    else:
        row_sum = row_sum_macro(T, row_threads, 1)
    inv_n = 1.0 / N

    def output(xc, W, B, col, st):
        # The affine is read at the store (an L1 hit after the first row), not held in registers.
        # Merged rows keep x in ``xc`` and the row's [mean, rstd] in ``st``; the others keep
        # x - mean and [mean, rstd].
        value = (xc - st[0]) * st[1] if merged else xc * st[1]
        if has_weight:
            value = value * T.cast(W[col], ACCUM)
        if has_bias:
            value = value + T.cast(B[col], ACCUM)
        return T.cast(value, dtype)

    @T.macro
    def add_squares(st, xc, j):
        """Centre the vector's elements (``xc`` holds ``x - mean`` from then on) and add their squares."""
        for k in T.unroll(vector):
            xc[j * vector + k] = xc[j * vector + k] - st[0]
            st[1] = st[1] + xc[j * vector + k] * xc[j * vector + k]

    @T.macro
    def add_deviations(st, xc, j):
        """Add the vector's squared deviations from the lane's mean (``xc`` keeps ``x``)."""
        for k in T.unroll(vector):
            st[1] = st[1] + (xc[j * vector + k] - st[0]) * (xc[j * vector + k] - st[0])

    @T.macro
    def store_output(Y, W, B, xc, st, row, lane, j):
        for k in T.vectorized(vector):
            Y[row, column(j, lane) + k] = output(xc[j * vector + k], W, B, column(j, lane) + k, st)

    @T.macro
    def body(X, W, B, Y):
        with T.Kernel(T.ceildiv(M, rows_per_block), threads=layout.block_threads, prelude=prelude) as bx:
            if blocks_per_sm:
                T.annotate_min_blocks_per_sm(blocks_per_sm)
            T.assume(LDX % vector == 0)
            tx = T.get_thread_binding()
            xb = T.alloc_local((per_thread,), dtype)
            # The row in float32, converted once for its three uses (the sum, the squares and the
            # output): a bf16 element's conversion is one or two instructions each time.
            xc = T.alloc_local((per_thread,), ACCUM)
            # [mean, sum of squared deviations] (of the lane's elements, then of the row's), the
            # last then the reciprocal standard deviation.
            st = T.alloc_local((2,), ACCUM)
            if merged:
                other = T.alloc_local((3,), ACCUM)
                scratch = T.alloc_shared(scratch_shape(layout.block_threads, 2), ACCUM)
            else:
                scratch = T.alloc_shared(scratch_shape(layout.block_threads, 1), ACCUM)
            row = bx * rows_per_block + tx // row_threads
            lane = tx % row_threads
            loads["load_row"](X, xb, row, lane)
            st[0] = T.cast(0, ACCUM)
            for i in T.unroll(per_thread):  # missing elements are zeros
                xc[i] = T.cast(xb[i], ACCUM)
                st[0] = st[0] + xc[i]
            if merged:
                st[0] = st[0] * T.cast(1.0 / per_thread, ACCUM)
                st[1] = T.cast(0, ACCUM)
                each_vector(lane, add_deviations, st, xc)
                row_moments(st, other, scratch, tx)
            else:
                row_sum(st, 0, scratch, 0, tx)
                st[0] = st[0] * inv_n
                st[1] = T.cast(0, ACCUM)
                each_vector(lane, add_squares, st, xc)
                row_sum(st, 1, scratch, 1, tx)
            st[1] = T.rsqrt(st[1] * inv_n + eps)
            if row < M:
                each_vector(lane, store_output, Y, W, B, xc, st, row, lane)

    return _affine_variants(T, M, N, dtype, XT, has_weight, has_bias, body)


def _streamed_fwd_program(N: int, dtype: str, eps: float, layout: StreamLayout, has_weight: bool,
                          has_bias: bool) -> Any:
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    M = T.dynamic("M")
    XT, LDX = strided_rows(T, M, N, dtype, "LDX")
    vector, unroll, threads, steps = layout.vector, layout.unroll, layout.threads, layout.steps
    walk = stream_macros(T, layout)
    column, valid = walk["column"], walk["valid"]
    row_sum = row_sum_macro(T, threads, 2)
    inv_n = 1.0 / N

    def output(x, w, b, st):
        value = (T.cast(x, ACCUM) - st[2]) * st[3]
        if has_weight:
            value = value * T.cast(w, ACCUM)
        if has_bias:
            value = value + T.cast(b, ACCUM)
        return T.cast(value, dtype)

    @T.macro
    def body(X, W, B, Y):
        with T.Kernel(M, threads=threads) as row:
            T.assume(LDX % vector == 0)
            tx = T.get_thread_binding()
            xb = T.alloc_local((unroll * vector,), dtype)
            wb = T.alloc_local((unroll * vector,), dtype)
            bb = T.alloc_local((unroll * vector,), dtype)
            first = T.alloc_local((vector,), dtype)
            st = T.alloc_local((5,), ACCUM)
            scratch = T.alloc_shared(scratch_shape(threads, 2), ACCUM)
            # Sums of x - shift and its square: the first element is close enough to the mean
            # to keep the variance from cancelling.
            # (A vector load: a scalar access at a row start trips TileLang's pointer-type rewrite for N = 2**15.)
            for k in T.vectorized(vector):
                first[k] = X[row, k]
            st[4] = T.cast(first[0], ACCUM)
            st[0] = T.cast(0, ACCUM)
            st[1] = T.cast(0, ACCUM)
            for step in T.serial(steps):
                walk["load_step"](X, xb, row, step, tx)
                for u in T.unroll(unroll):
                    if valid(step, u, tx):
                        for k in T.unroll(vector):
                            st[0] = st[0] + (T.cast(xb[u * vector + k], ACCUM) - st[4])
                            st[1] = st[1] + (T.cast(xb[u * vector + k], ACCUM) - st[4]) * (
                                T.cast(xb[u * vector + k], ACCUM) - st[4])
            row_sum(st, 0, scratch, 0, tx)
            st[2] = st[4] + st[0] * inv_n
            st[3] = T.rsqrt(T.max(st[1] * inv_n - st[0] * inv_n * st[0] * inv_n, T.cast(0, ACCUM)) + eps)
            # Reverse order: the chunks read last are the likeliest L2 hits.
            for back in T.serial(steps):
                walk["load_step"](X, xb, row, steps - 1 - back, tx)
                if has_weight:
                    walk["load_step_vector"](W, wb, steps - 1 - back, tx)
                if has_bias:
                    walk["load_step_vector"](B, bb, steps - 1 - back, tx)
                for u in T.unroll(unroll):
                    if valid(steps - 1 - back, u, tx):
                        for k in T.vectorized(vector):
                            Y[row, column(steps - 1 - back, u, tx) + k] = output(
                                xb[u * vector + k], wb[u * vector + k], bb[u * vector + k], st)

    return _affine_variants(T, M, N, dtype, XT, has_weight, has_bias, body)


def _affine_variants(T: Any, M: Any, N: int, dtype: str, XT: Any, has_weight: bool, has_bias: bool,
                     body: Any) -> Any:
    """The program whose signature takes exactly the affine tensors that are present (``x`` of type ``XT``)."""
    if has_weight and has_bias:

        @T.prim_func
        def layer_norm_fwd(X: XT, W: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype),
                           Y: T.Tensor((M, N), dtype)):
            body(X, W, B, Y)

        return layer_norm_fwd
    if has_weight:

        @T.prim_func
        def layer_norm_fwd_weight(X: XT, W: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
            body(X, W, None, Y)

        return layer_norm_fwd_weight
    if has_bias:

        @T.prim_func
        def layer_norm_fwd_bias(X: XT, B: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
            body(X, None, B, Y)

        return layer_norm_fwd_bias

    @T.prim_func
    def layer_norm_fwd_plain(X: XT, Y: T.Tensor((M, N), dtype)):
        body(X, None, None, Y)

    return layer_norm_fwd_plain


class LayerNormFwdKernel(RowNormFwdKernel):
    """LayerNorm forward; ``forward(x, weight, bias, y)`` with ``weight``/``bias`` possibly ``None``.

    ``x`` and ``y`` are ``(rows, N)`` with unit-stride rows, ``y`` contiguous and ``x``'s rows a
    multiple of ``row_vector(N)`` elements apart; ``weight`` and ``bias`` contiguous ``(N,)``;
    all 16-byte aligned on one GPU.
    """

    # "2": large resident calls take the hinted program (``hinted_min_mib``); "3":
    # ``resident_blocks_per_sm``.
    version = "3"
    resident_name, streamed_name, hinted_name = RESIDENT, STREAMED, RESIDENT_HINTED

    @property
    def default_config(self) -> Dict[str, Any]:
        return layer_norm_fwd_default_config(self.N, self.dtype, has_fast_memory())

    def resident_fits(self, layout: RowLayout) -> bool:
        return layout.per_thread * self.dtype.itemsize <= RESIDENT_BYTES

    def build_program(self, name: str, config: Dict[str, Any], *, has_weight: bool = True,
                      has_bias: bool = True) -> Any:
        layout = self.layout(config)
        dtype = torch_dtype_to_tl(self.dtype)
        if isinstance(layout, RowLayout):
            policy = EVICT_LAST if name == RESIDENT_HINTED else None
            blocks_per_sm = 0 if name == RESIDENT else config["resident_blocks_per_sm"]
            return _resident_fwd_program(self.N, dtype, self.eps, layout, has_weight, has_bias, policy, blocks_per_sm)
        return _streamed_fwd_program(self.N, dtype, self.eps, layout, has_weight, has_bias)

    def row_program(self, input_bytes: int) -> str:
        """``RowNormKernel.row_program``; under a ``resident_blocks_per_sm``, resident calls of
        ``HELD_MIN_MIB`` or more take the program held to it (the hinted program always is)."""
        name = super().row_program(input_bytes)
        if name == RESIDENT and self.config["resident_blocks_per_sm"] and input_bytes >= HELD_MIN_MIB << 20:
            return RESIDENT_HELD
        return name

    def row_program_names(self) -> List[str]:
        names = super().row_program_names()
        if RESIDENT in names and self.config["resident_blocks_per_sm"]:
            names.append(RESIDENT_HELD)
        return names

    def program_keys(self) -> List[Tuple[str, Tuple[Tuple[str, Any], ...]]]:
        return [(name, (("has_bias", True), ("has_weight", True))) for name in self.row_program_names()]

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        x = torch.randn(self.tuning_rows if rows is None else rows, self.N, device="cuda", dtype=self.dtype)
        weight = torch.randn(self.N, device="cuda", dtype=self.dtype)
        bias = torch.randn(self.N, device="cuda", dtype=self.dtype)
        return x, weight, bias, torch.empty_like(x)

    def forward(self, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                y: torch.Tensor) -> torch.Tensor:
        """Write ``layer_norm(x) * weight + bias`` into ``y`` and return it."""
        variant = (("has_bias", bias is not None), ("has_weight", weight is not None))
        launch = self.launcher(self.row_program(x.nbytes), variant)
        affine = [t for t in (weight, bias) if t is not None]
        if x.shape[0] <= MAX_EXTENT:
            launch(x, *affine, y)
            return y
        for start, stop in row_slices(x.shape[0]):
            launch(x[start:stop], *affine, y[start:stop])
        return y


class LayerNormBwdKernel(NormBwdKernel):
    """LayerNorm backward; ``forward(grad_y, x, weight, grad_x, grad_weight, grad_bias)``.

    ``weight`` may be ``None`` (a forward without one: the identity scale);
    ``grad_weight`` and ``grad_bias`` are what an affine of that value would
    receive.  The mean and reciprocal standard deviation are recomputed from ``x``.
    """

    layer = True
    accumulators = 2
