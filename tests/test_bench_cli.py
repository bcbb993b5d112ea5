"""``python -m benchmarks`` and ``tileops bench`` select cases without a GPU."""

from __future__ import annotations

from benchmarks.__main__ import main as bench_main
from codegen.loader import load_manifest


def expected_labels(op: str) -> list:
    spec = load_manifest().op(op)
    return [f"{op}/{w.label}/{dtype}" for w in spec.workloads for dtype in w.dtypes]


def test_list_prints_the_selected_cases(capsys):
    assert bench_main(["--list", "--ops", "CumsumFwdOp"]) == 0
    assert capsys.readouterr().out.split() == expected_labels("CumsumFwdOp")


def test_tileops_bench_is_the_same_command(capsys):
    from tileops.cli import main as tileops_main

    assert tileops_main(["bench", "--list", "--ops", "RMSNormFwdOp"]) == 0
    assert capsys.readouterr().out.split() == expected_labels("RMSNormFwdOp")


def test_an_unknown_op_is_refused(capsys):
    assert bench_main(["--list", "--ops", "NopeFwdOp"]) == 2
    assert "no op named 'NopeFwdOp'" in capsys.readouterr().err
