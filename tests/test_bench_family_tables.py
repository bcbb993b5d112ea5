"""The per-family timing scripts' table: one shape of row, absent baselines printed as ``-``."""

from benchmarks.family_tables import HEADER, table_row


def test_rows_have_the_header_columns_and_dashes_for_absent_baselines() -> None:
    timed = {"op": "SoftmaxFwdOp", "workload": "rows", "dtype": "bfloat16", "error": 1e-3, "us": 10.0,
             "loop_us": 12.0, "gbps": 2900.0, "copy_pct": 96.2, "eager_us": 20.0, "compile_us": 15.0}
    sweep = {k: v for k, v in timed.items() if k not in ("loop_us", "eager_us", "compile_us")}
    assert table_row(timed).count("|") == HEADER.count("|")
    assert "| 12.0 | 2900 | 96.2 | 20.0 | 2.00 | 15.0 | 1.50 |" in table_row(timed)
    assert table_row(sweep).endswith("| - | 2900 | 96.2 | - | - | - | - |")
