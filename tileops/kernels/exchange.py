"""Words the blocks of one launch exchange through global memory, in a workspace no launch zeroes.

Some programs have blocks wait on results that other blocks of the same launch publish: the
scan's look-back (a tile waits on its predecessors' sums) and the softmax's held rows (a block
waits on the other blocks of its row).  Each result travels in one 64-bit status word, value and
"published" together, so a reader that sees a word also sees its value with no fence between
them; a zero word is one not published yet.

The workspace of such a program is a pair of tensors:

* status words ``(2, rows, words)`` (uint64): two sides.  A launch publishes in one side and
  zeroes the other, which the launch before it used;
* control words ``(CONTROL_WORDS,)`` (int32): the blocks that have finished (``ARRIVALS``) and
  the side the next launch publishes in (``SIDE``).  The last block to finish resets the count
  and hands the next launch the zeroed side.

So the words are ready for the next launch in the same stream with no zeroing launch (on an
H100, zeroing took 3-4 us against a 28 us scan of 64 x 262144 bf16), and CUDA graph replays
find them as the last launch left them.  ``ExchangeWorkspaces`` keeps one workspace per device
and stream: launches in one stream run in turn, in two they could overlap.
"""

import threading
from typing import Any, Callable, Dict, Tuple

import torch

__all__ = [
    "ARRIVALS",
    "BACKOFF_NS",
    "CONTROL_WORDS",
    "SIDE",
    "ExchangeWorkspaces",
    "exchange_macros",
    "new_workspace",
]

ARRIVALS, SIDE = 0, 1
CONTROL_WORDS = 2
# Pause before re-reading words not published yet: spinning at full rate steals L2 bandwidth
# from the loads being waited on.
BACKOFF_NS = 64


def new_workspace(rows: int, words: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Zeroed status words of both sides (``words`` a row) and control words."""
    return (torch.zeros((2, rows, words), dtype=torch.uint64, device=device),
            torch.zeros(CONTROL_WORDS, dtype=torch.int32, device=device))


class ExchangeWorkspaces:
    """A kernel's workspaces, one per device, stream and words a row; safe to share between threads."""

    def __init__(self) -> None:
        self._held: Dict[Tuple[Any, int, int], Tuple[torch.Tensor, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def snapshot(self) -> Dict[Tuple[Any, int, int], Tuple[torch.Tensor, torch.Tensor]]:
        """The workspaces held now, by (device index, stream, words a row)."""
        with self._lock:
            return dict(self._held)

    def get(self, rows: int, words: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """The status words (two sides of at least ``rows`` rows of ``words``) and control words of
        a launch over ``rows`` rows in the current stream.

        While a stream is captured into a graph, each call gets a fresh workspace whose zeroing is
        captured with it (a cached one might live in the graph's pool).  A workspace outgrown by a
        call is replaced by one twice as large, zeroed.
        """
        if torch.cuda.is_current_stream_capturing():
            return new_workspace(rows, words, device)
        key = (device.index, torch.cuda.current_stream(device).cuda_stream, words)
        workspace = self._held.get(key)
        if workspace is None or workspace[0].shape[1] < rows:
            with self._lock:
                workspace = self._held.get(key)
                if workspace is None or workspace[0].shape[1] < rows:
                    held = 0 if workspace is None else workspace[0].shape[1]
                    workspace = new_workspace(max(rows, 2 * held), words, device)
                    self._held[key] = workspace
        return workspace


def exchange_macros(T: Any, threads: int) -> Dict[str, Callable[..., Any]]:
    """TileLang macros of a program of ``threads``-thread blocks that takes a workspace:

    * ``clear_other_side(Status, side, block, blocks, tx)``: block ``block`` of ``blocks`` zeroes
      its share of the side the launch before used;
    * ``arrive(Control, side, sides, blocks, tx)``: the block has finished with the workspace
      (``sides[1]`` gets the blocks that finished before it); the last of ``blocks`` resets the
      count and hands the next launch the other side.  No fence: what this launch wrote is read
      by later launches only, after it has ended.
    """

    @T.macro
    def clear_other_side(Status, side, block, blocks, tx):
        words = Status.shape[1] * Status.shape[2]
        for i in T.serial(T.ceildiv(words, blocks * threads)):
            if (i * blocks + block) * threads + tx < words:
                Status[1 - side, ((i * blocks + block) * threads + tx) // Status.shape[2],
                       ((i * blocks + block) * threads + tx) % Status.shape[2]] = T.uint64(0)

    @T.macro
    def arrive(Control, side, sides, blocks, tx):
        T.sync_threads()
        if tx == 0:
            sides[1] = T.atomic_add(Control[ARRIVALS], 1, return_prev=True)
            if sides[1] == blocks - 1:
                Control[ARRIVALS] = 0
                Control[SIDE] = 1 - side

    return {"clear_other_side": clear_other_side, "arrive": arrive}
