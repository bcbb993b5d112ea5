"""How each reduction folds, merges and finishes, as TileLang macros over a float32 state.

A reducer's state is ``slots`` float32 values (and, for argmax, one int64
index), stored slot-major: slot ``j`` of the ``k``-th of ``W`` slices a thread
serves is ``st[j * W + k]``.  Programs call

* ``init(st, sti, k)``: the identity state,
* ``tally(st, k, n)``, only for reducers that count their elements: ``n``
  more elements folded (once per chunk, or once for all of a thread's
  elements where the program knows that count up front),
* per chunk (the values a thread loaded in one step), for reducers with
  ``chunk_slots``: ``chunk_init(cm, k)``, ``chunk_fold(cm, k, v)`` over the
  chunk, then ``rebase(st, k, cm)`` once,
* ``fold(st, sti, k, v, idx, shift, cm)``: one float32 element ``v`` at position ``idx``,
* for reducers with an exact fold (argmax): ``exact_init(cm)`` before a
  segment; where ``needs_exact(cm)`` after it, the segment is folded again
  from ``init`` with ``exact_fold`` (same arguments as ``fold``),
* ``prepare(st, sti, k, shift)``: turn what ``fold`` built into a mergeable state,
* ``merge(st, sti, k, ot, oti)``: fold another mergeable state (``ot[j]``, ``oti[0]``) in,
* ``merge_same_shift(st, sti, k, ot, oti)``, only for shifted reducers: fold in another
  state built by ``fold`` about the same shift, before ``prepare`` (programs whose threads
  share a shift merge these and prepare once),
* ``finish(st, sti, k)``: the output value (an expression).

``shift`` is a value of the slice (its segment's first element), read only by
the variance: sums of ``x - shift`` keep the second moment accurate when the
mean is large next to the spread.

The chunk pass keeps per-element work to a few instructions: log-sum-exp
rescales its sum once per chunk instead of branching on every new maximum
(16384 x 16384 bf16 rows: 274 -> 184 us on an H100), and counts grow by ``n``
per chunk instead of by one per element.  Argmax folds element by element
with one ordered comparison and a NaN flag; only a segment that holds a NaN is
folded again with the NaN-aware comparison (16384 x 16384 bf16 rows were bound
by its instructions: 212 -> 175 us on an H100; rescanning each chunk with a NaN
instead cost columns 294 -> 323 us).  A chunk pass that finds the chunk
maximum first, then searches only winning chunks, measured slower.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict
from tileops.kernels.fast_math import FAST_EXP2_PRELUDE, fast_exp2
from tileops.kernels.sizes import ACCUM

__all__ = ["ReducerSpec", "REDUCERS", "reducer_macros", "ACCUM"]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass(frozen=True)
class ReducerSpec:
    """The static description of one reduction."""

    name: str
    slots: int  # float32 state values
    index: bool = False  # carries an int64 position (argmax)
    shifted: bool = False  # folds need the slice's shift value (variance)
    chunk_slots: int = 0  # float32 values of the chunk pass (``cm[j * W + k]``); 0: no chunk pass
    flags: int = 0  # float32 flags of a thread (``cm[j]``), e.g. argmax's NaN flag
    prelude: str = ""  # CUDA source of the device functions its macros call, for the kernels

    def chunk_locals(self, W: int) -> int:
        """float32 locals (``cm``) of a thread serving ``W`` slices: its chunk pass or its flags, if any."""
        return max(1, self.chunk_slots * W, self.flags)

    @property
    def partial_width(self) -> int:
        """float64 values of one stored partial: the slots, then the index if any."""
        return self.slots + int(self.index)


REDUCERS: Dict[str, ReducerSpec] = {
    "sum": ReducerSpec("sum", 1),
    "mean": ReducerSpec("mean", 2),
    "amax": ReducerSpec("amax", 1),
    "amin": ReducerSpec("amin", 1),
    "var": ReducerSpec("var", 3, shifted=True),
    "logsumexp": ReducerSpec("logsumexp", 2, chunk_slots=2, prelude=FAST_EXP2_PRELUDE),
    "argmax": ReducerSpec("argmax", 1, index=True, flags=1),
    "l2_norm": ReducerSpec("l2_norm", 1),
}

# The largest int64: the index of an argmax state that has seen nothing.
_NO_INDEX = 2**63 - 1


def reducer_macros(T: Any, name: str, W: int, correction: float = 0.0) -> Dict[str, Callable[..., Any]]:
    """The macros of reducer ``name`` for threads serving ``W`` slices each."""
    if name not in REDUCERS:
        raise ValueError(f"reduction kernels: unknown reducer {name!r}; expected one of {sorted(REDUCERS)}")
    builders = {
        "sum": _additive,
        "mean": _additive,
        "l2_norm": _additive,
        "amax": _extremum,
        "amin": _extremum,
        "var": _variance,
        "logsumexp": _log_sum_exp,
        "argmax": _argmax,
    }
    return builders[name](T, name, W, correction)


def _no_prepare(T: Any) -> Callable[..., Any]:
    @T.macro
    def prepare(st, sti, k, shift):
        T.evaluate(0)

    return prepare


def _additive(T: Any, name: str, W: int, correction: float) -> Dict[str, Callable[..., Any]]:
    """Sum (of x, or of x * x for the 2-norm); the mean also counts its elements."""
    counted = name == "mean"

    @T.macro
    def init(st, sti, k):
        st[k] = T.cast(0, ACCUM)
        if counted:
            st[W + k] = T.cast(0, ACCUM)

    @T.macro
    def fold(st, sti, k, v, idx, shift, cm):
        if name == "l2_norm":
            st[k] = st[k] + v * v
        else:
            st[k] = st[k] + v

    @T.macro
    def tally(st, k, n):
        st[W + k] = st[W + k] + T.cast(n, ACCUM)

    @T.macro
    def merge(st, sti, k, ot, oti):
        st[k] = st[k] + ot[0]
        if counted:
            st[W + k] = st[W + k] + ot[1]

    def finish(st, sti, k):
        if name == "l2_norm":
            return T.sqrt(st[k])
        if counted:
            return st[k] / st[W + k]
        return st[k]

    hooks = {"init": init, "fold": fold, "prepare": _no_prepare(T), "merge": merge, "finish": finish}
    if counted:
        hooks["tally"] = tally
    return hooks


def _extremum(T: Any, name: str, W: int, correction: float) -> Dict[str, Callable[..., Any]]:
    """Maximum or minimum; a NaN anywhere makes the result NaN, as in PyTorch."""
    largest = name == "amax"

    def pick(a, b):
        # fmaxf/fminf drop NaN; a + b keeps it.
        return T.if_then_else(T.Or(T.isnan(a), T.isnan(b)), a + b, T.max(a, b) if largest else T.min(a, b))

    @T.macro
    def init(st, sti, k):
        st[k] = -T.infinity(ACCUM) if largest else T.infinity(ACCUM)

    @T.macro
    def fold(st, sti, k, v, idx, shift, cm):
        st[k] = pick(st[k], v)

    @T.macro
    def merge(st, sti, k, ot, oti):
        st[k] = pick(st[k], ot[0])

    def finish(st, sti, k):
        return st[k]

    return {"init": init, "fold": fold, "prepare": _no_prepare(T), "merge": merge, "finish": finish}


def _variance(T: Any, name: str, W: int, correction: float) -> Dict[str, Callable[..., Any]]:
    """Slots (n, mean, M2) once prepared; while folding, (n, sum of d, sum of d * d) with d = x - shift.

    Merging is Chan et al.'s pairwise update; the result is ``M2 / max(n - correction, 0)``.
    States folded about the same shift merge by adding their sums, with no division: a block
    whose threads share its row's first element as the shift adds its threads' sums and
    prepares once (see ``row_program``).
    """

    @T.macro
    def init(st, sti, k):
        for j in T.unroll(3):
            st[j * W + k] = T.cast(0, ACCUM)

    @T.macro
    def fold(st, sti, k, v, idx, shift, cm):
        st[W + k] = st[W + k] + (v - shift)
        st[2 * W + k] = st[2 * W + k] + (v - shift) * (v - shift)

    @T.macro
    def tally(st, k, n):
        st[k] = st[k] + T.cast(n, ACCUM)

    @T.macro
    def prepare(st, sti, k, shift):
        if st[k] > T.cast(0, ACCUM):
            st[2 * W + k] = T.max(st[2 * W + k] - st[W + k] * st[W + k] / st[k], T.cast(0, ACCUM))
            st[W + k] = shift + st[W + k] / st[k]

    @T.macro
    def merge(st, sti, k, ot, oti):
        if st[k] + ot[0] > T.cast(0, ACCUM):
            weight = ot[0] / (st[k] + ot[0])
            delta = ot[1] - st[W + k]
            st[2 * W + k] = st[2 * W + k] + ot[2] + delta * delta * st[k] * weight
            st[W + k] = st[W + k] + delta * weight
            st[k] = st[k] + ot[0]

    @T.macro
    def merge_same_shift(st, sti, k, ot, oti):
        for j in T.unroll(3):
            st[j * W + k] = st[j * W + k] + ot[j]

    def finish(st, sti, k):
        return st[2 * W + k] / T.max(st[k] - T.cast(correction, ACCUM), T.cast(0, ACCUM))

    return {"init": init, "fold": fold, "prepare": prepare, "merge": merge, "finish": finish, "tally": tally,
            "merge_same_shift": merge_same_shift}


def _log_sum_exp(T: Any, name: str, W: int, correction: float) -> Dict[str, Callable[..., Any]]:
    """Slots (m, s): a running maximum and the sum of ``exp(x - m)``.

    Each chunk first finds its maximum, rescales ``s`` to the new running
    maximum once, then adds one ``exp2`` per element; the chunk slots are the
    chunk's maximum and the running maximum's offset times log2(e).  Every
    ``exp2`` is ``fast_exp2``: a term or a rescaling below 2^-126 is one that
    the sum, which holds the maximum's term of 1, loses in rounding anyway.
    """

    def offset(m):
        # The maximum, or 0 while it is infinite: an all -inf slice then sums
        # zeros instead of NaN, and a +inf one sums to +inf.
        return T.if_then_else(T.abs(m) == T.infinity(ACCUM), T.cast(0, ACCUM), m)

    @T.macro
    def init(st, sti, k):
        st[k] = -T.infinity(ACCUM)
        st[W + k] = T.cast(0, ACCUM)

    @T.macro
    def chunk_init(cm, k):
        cm[k] = -T.infinity(ACCUM)

    @T.macro
    def chunk_fold(cm, k, v):
        # fmaxf skips NaN; a NaN still reaches the sum through its exp2.
        cm[k] = T.max(cm[k], v)

    @T.macro
    def rebase(st, k, cm):
        largest = T.max(st[k], cm[k])
        st[W + k] = st[W + k] * fast_exp2(T, (st[k] - offset(largest)) * LOG2E)
        st[k] = largest
        cm[W + k] = offset(largest) * LOG2E

    @T.macro
    def fold(st, sti, k, v, idx, shift, cm):
        st[W + k] = st[W + k] + fast_exp2(T, v * LOG2E - cm[W + k])

    @T.macro
    def merge(st, sti, k, ot, oti):
        largest = T.max(st[k], ot[0])
        st[W + k] = (st[W + k] * fast_exp2(T, (st[k] - offset(largest)) * LOG2E)
                     + ot[1] * fast_exp2(T, (ot[0] - offset(largest)) * LOG2E))
        st[k] = largest

    def finish(st, sti, k):
        return offset(st[k]) + T.log2(st[W + k]) * LN2

    return {"init": init, "chunk_init": chunk_init, "chunk_fold": chunk_fold, "rebase": rebase, "fold": fold,
            "prepare": _no_prepare(T), "merge": merge, "finish": finish}


def _argmax(T: Any, name: str, W: int, correction: float) -> Dict[str, Callable[..., Any]]:
    """Slot (best value) and index: the first position of the maximum; NaN counts as the largest.

    A thread folds its positions in increasing order, so a later element wins
    only by being larger: ``v > best``, which no NaN passes.  The fold also
    raises a flag (``cm[0]``) on a NaN; a segment that raised it is walked
    again with the exact fold, where a NaN beats everything but an earlier NaN.
    A state that never took an element keeps ``_NO_INDEX``, which loses every
    tie in a merge; a slice of ``-inf`` only ends with it and reports 0.
    """

    def better(v, i, best, best_i):
        return T.Or(
            T.Or(v > best, T.And(T.isnan(v), T.Not(T.isnan(best)))),
            T.And(T.Or(v == best, T.And(T.isnan(v), T.isnan(best))), i < best_i),
        )

    @T.macro
    def init(st, sti, k):
        st[k] = -T.infinity(ACCUM)
        sti[k] = T.int64(_NO_INDEX)

    @T.macro
    def exact_init(cm):
        cm[0] = T.cast(0, ACCUM)

    def needs_exact(cm):
        return cm[0] != T.cast(0, ACCUM)

    @T.macro
    def fold(st, sti, k, v, idx, shift, cm):
        cm[0] = T.if_then_else(T.isnan(v), T.cast(1, ACCUM), cm[0])
        if v > st[k]:
            st[k] = v
            sti[k] = idx

    def follows(v, best, best_i):
        # The first element is taken whatever it is; then a larger one, or the first NaN.
        # (Not ``not (v <= best)``: the simplifier rewrites it to ``best < v``, which drops the NaN.)
        return T.Or(T.And(T.Or(v > best, T.isnan(v)), T.Not(T.isnan(best))), best_i == T.int64(_NO_INDEX))

    @T.macro
    def exact_fold(st, sti, k, v, idx, shift, cm):
        if follows(v, st[k], sti[k]):
            st[k] = v
            sti[k] = idx

    @T.macro
    def merge(st, sti, k, ot, oti):
        if better(ot[0], oti[0], st[k], sti[k]):
            st[k] = ot[0]
            sti[k] = oti[0]

    def finish(st, sti, k):
        return T.if_then_else(sti[k] == T.int64(_NO_INDEX), T.int64(0), sti[k])

    return {"init": init, "exact_init": exact_init, "needs_exact": needs_exact, "fold": fold,
            "exact_fold": exact_fold, "prepare": _no_prepare(T), "merge": merge, "finish": finish}
