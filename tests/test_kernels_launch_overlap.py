"""CPU checks of overlapped launches: every program that reads what the launch before it wrote
waits for that launch before its first read of global memory.

Such a program is launched while the launch before it may still run (see
``tileops/kernels/kernel_base.py``); a read ahead of its wait would see stale data
only now and then on the GPU, so the order is checked here on the TIR of each
program, which needs neither nvcc nor a GPU.
"""

from __future__ import annotations

from typing import Any, List

import pytest
import torch

pytest.importorskip("tilelang")

from tileops.kernels.loss.cross_entropy import (  # noqa: E402
    cross_entropy_bwd_program,
    cross_entropy_fwd_program,
    cross_entropy_kept_rows_program,
    cross_entropy_total_program,
)
from tileops.kernels.norm.backward import COLUMN_SUM  # noqa: E402
from tileops.kernels.norm.layer_norm import LayerNormBwdKernel  # noqa: E402
from tileops.kernels.norm.rms_norm_bwd import RMSNormBwdKernel  # noqa: E402
from tileops.kernels.reduction.reduce import COMBINE, ROW, build_program as build_reduction  # noqa: E402
from tileops.kernels.scan.cumsum import (  # noqa: E402
    COLUMN_SUMS,
    SEGMENT_SUMS,
    SPLIT_COLUMN_SCAN,
    SPLIT_ROW_SCAN,
    CumsumFwdKernel,
    _build_program as build_scan,
    column_program_name,
)
from tileops.kernels.softmax.log_softmax import LogSoftmaxBwdKernel  # noqa: E402
from tileops.kernels.softmax.softmax import (  # noqa: E402
    COLUMN_APPLY,
    COLUMN_STATS,
    ROW_APPLY,
    ROW_STATS,
    SoftmaxFwdKernel,
    build_program as build_softmax,
)

WAIT = "tl.pdl_sync"
ALLOW_NEXT = "tl.pdl_trigger"


def _events(func: Any) -> List[str]:
    """The program's waits, early-start grants and global-memory reads, in program order."""
    from tilelang import tvm

    tirx = tvm.tirx
    events: List[str] = []

    def visit(node: Any) -> bool:
        if isinstance(node, tirx.Call) and getattr(node.op, "name", None) in (WAIT, ALLOW_NEXT):
            events.append(node.op.name)
        elif isinstance(node, tirx.BufferLoad) and node.buffer.scope() == "global":
            events.append(f"read {node.buffer.name}")
        return True  # and visit the node's children

    tirx.stmt_functor.pre_order_visit(func.body, visit)
    return events


def _assert_waits_before_reading(func: Any) -> None:
    events = _events(func)
    assert WAIT in events, f"{func.attrs['global_symbol']} never waits for the launch before it"
    first_wait = events.index(WAIT)
    assert events[:first_wait] == [], (
        f"{func.attrs['global_symbol']} reads global memory before waiting: {events[:first_wait]}")


def _softmax_programs(kernel: Any, inner: int, outer: int) -> dict:
    specs = kernel.program_specs(inner, outer=outer)
    return {name: build_softmax(name, kernel.N, kernel.dtype, kernel.variant, kernel.config, params)
            for name, params in specs}


def _cumsum_programs() -> dict:
    kernel = CumsumFwdKernel(262144, torch.bfloat16, config={"lookback": 0})
    assert kernel.split_segments > 1
    programs = {name: build_scan(name, kernel.N, "bfloat16", kernel.config) for name in (SEGMENT_SUMS, SPLIT_ROW_SCAN)}
    column = CumsumFwdKernel(4096, torch.bfloat16)
    for name in column.program_names(inner=128):
        if name.startswith((COLUMN_SUMS, SPLIT_COLUMN_SCAN)):
            programs[name.rpartition("_")[0]] = build_scan(name, column.N, "bfloat16", column.config)
    return programs


# (producer, consumer): the consumer reads what the producer wrote, in the launch after it.
def _pairs() -> List[tuple]:
    reduction_row = (("vector", 8), ("threads", 256), ("unroll", 4), ("fused", 0))
    combine = (("threads", 256), ("group", 8))
    # Rows of 262144 take the held program unless the config turns it off.
    softmax_rows = _softmax_programs(SoftmaxFwdKernel(262144, torch.bfloat16, config={"held_threads": 0}), 1, 1)
    softmax_columns = _softmax_programs(LogSoftmaxBwdKernel(127, torch.float16), 5, 4)
    scans = _cumsum_programs()
    pairs = [
        ("reduction rows", build_reduction(ROW, "var", torch.bfloat16, torch.bfloat16, 1.0, reduction_row),
         build_reduction(COMBINE, "var", torch.bfloat16, torch.bfloat16, 1.0, combine)),
        ("softmax rows", softmax_rows[ROW_STATS], softmax_rows[ROW_APPLY]),
        ("softmax columns", softmax_columns[COLUMN_STATS], softmax_columns[COLUMN_APPLY]),
        ("cumsum rows", scans[SEGMENT_SUMS], scans[SPLIT_ROW_SCAN]),
        ("cumsum columns", scans[COLUMN_SUMS], scans[SPLIT_COLUMN_SCAN]),
        ("cross-entropy total", cross_entropy_fwd_program(32000, "bfloat16", vector=8, threads=256, unroll=8,
                                                          ignore_index=-100, label_smoothing=0.0),
         cross_entropy_total_program("bfloat16", mean=True, ignore_index=-100)),
        ("cross-entropy mean backward", cross_entropy_kept_rows_program("bfloat16", ignore_index=-100),
         cross_entropy_bwd_program(32000, "bfloat16", vector=8, threads=256, unroll=4, ignore_index=-100,
                                   label_smoothing=0.0, per_row=False, mean=True)),
    ]
    for cls in (RMSNormBwdKernel, LayerNormBwdKernel):
        kernel = cls(4096, torch.bfloat16)
        main = kernel.build_program(kernel.main_program(), kernel.config)
        pairs.append((f"{cls.__name__} column sum", main, kernel.build_program(COLUMN_SUM, kernel.config)))
    return pairs


PAIRS = _pairs()


@pytest.mark.parametrize("producer, consumer", [pair[1:] for pair in PAIRS], ids=[pair[0] for pair in PAIRS])
def test_second_launch_waits_before_reading_and_first_lets_it_start(producer: Any, consumer: Any) -> None:
    _assert_waits_before_reading(consumer)
    # The grant comes first, so the second launch is set up while the first one's last blocks run.
    assert _events(producer)[:1] == [ALLOW_NEXT]


def test_first_launches_do_not_wait() -> None:
    """A program that starts an op reads what the caller's kernels wrote: it is launched the
    usual way, after they end, and has no wait of its own."""
    per_row_backward = cross_entropy_bwd_program(32000, "bfloat16", vector=8, threads=256, unroll=4,
                                                 ignore_index=-100, label_smoothing=0.0)
    assert WAIT not in _events(per_row_backward)
    for _, producer, _ in PAIRS:
        assert WAIT not in _events(producer)
