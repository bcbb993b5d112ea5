"""CSV rows and their numbers, append and read-back, Markdown, the README block."""

from __future__ import annotations

import csv

import pytest

from benchmarks import readme
from benchmarks.ceilings import Ceilings
from benchmarks.readme import BEGIN, END, MarkersMissing, render_block, rewrite_block
from benchmarks.results import (
    CSV_COLUMNS, RunInfo, append_csv, gpu_slug, latest_by_case, latest_run, read_csv, render_compile_standing,
    render_markdown, render_table, result_rows,
)
from benchmarks.runner import CaseResult, Outcome
from benchmarks.workloads import Case
from codegen.loader import load_manifest

CEILINGS = Ceilings(copy_gbps=3000.0, matmul_tflops={"bfloat16": 700.0, "float16": 700.0, "float32": 50.0})
VERSIONS = {"tileops": "0.1.0", "torch": "2.11.0", "tilelang": "0.1.15", "triton": "3.5.0"}


@pytest.fixture(scope="module")
def manifest():
    return load_manifest()


def ok(variant, micros, mib, error):
    return Outcome(variant, "ok", median_us=micros, loop_us=micros + 5, peak_bytes=mib << 20, error=error)


def llama_result(manifest, ours=ok("tileops", 100.0, 2, 1e-3), eager=ok("eager", 200.0, 4, 0.0),
                 compiled=ok("compile", 125.0, 2, 1e-3)):
    spec = manifest.op("RMSNormFwdOp")
    workload = spec.workloads[0]  # llama-4k: x [32768, 4096] bf16
    flops, moved = 4 * 32768 * 4096, (2 * 32768 * 4096 + 4096) * 2
    return CaseResult(Case(spec, workload, "bfloat16"), ((32768, 4096), (4096,)), flops, moved,
                      (ours, eager, compiled))


def info(run="2026-11-22T05:00:00Z"):
    return RunInfo(run, "NVIDIA H100 80GB HBM3", CEILINGS, VERSIONS)


def test_rows_carry_metrics_against_the_run_ceilings(manifest):
    rows = {r["variant"]: r for r in result_rows(llama_result(manifest), info())}
    ours = rows["tileops"]
    moved = (2 * 32768 * 4096 + 4096) * 2
    assert ours["median_us"] == "100.000" and ours["loop_us"] == "105.000"
    assert float(ours["gbps"]) == pytest.approx(moved / 100e-6 / 1e9, abs=0.05)
    assert float(ours["sol_pct"]) == pytest.approx(100 * moved / 3000e9 / 100e-6, abs=0.05)
    assert ours["speedup_vs_eager"] == "2.000" and ours["speedup_vs_compile"] == "1.250"
    assert rows["eager"]["speedup_vs_eager"] == "1.000"
    assert ours["peak_mem_mib"] == "2.00" and ours["rel_err"] == "1.00e-03"
    assert ours["copy_gbps"] == "3000.0" and ours["peak_tflops"] == "700.0"
    assert ours["shapes"] == "32768x4096 4096" and ours["date"] == "2026-11-22"
    assert ours["torch"] == "2.11.0" and ours["tilelang"] == "0.1.15"
    assert list(ours) == list(CSV_COLUMNS)


def test_a_wrong_row_has_no_time_and_no_rates(manifest):
    wrong = Outcome("tileops", "wrong", error=0.5, note="relative error 0.5 over limit 0.01")
    rows = {r["variant"]: r for r in result_rows(llama_result(manifest, ours=wrong), info())}
    assert rows["tileops"]["status"] == "wrong"
    assert rows["tileops"]["median_us"] == rows["tileops"]["gbps"] == rows["tileops"]["sol_pct"] == ""
    assert rows["tileops"]["speedup_vs_eager"] == ""
    assert rows["compile"]["speedup_vs_eager"] == "1.600"


def test_csv_appends_and_reads_back(manifest, tmp_path):
    path = tmp_path / "results" / "gpu.csv"
    append_csv(path, result_rows(llama_result(manifest), info("2026-11-22T05:00:00Z")))
    append_csv(path, result_rows(llama_result(manifest), info("2026-11-23T05:00:00Z")))
    rows = read_csv(path)
    assert len(rows) == 6
    assert path.read_text().count("run,date,gpu") == 1  # one header
    latest = latest_run(rows)
    assert {r["run"] for r in latest} == {"2026-11-23T05:00:00Z"} and len(latest) == 3
    assert rows[0] == result_rows(llama_result(manifest), info("2026-11-22T05:00:00Z"))[0]


def test_csv_with_old_columns_is_rewritten_without_losing_them(manifest, tmp_path):
    path = tmp_path / "gpu.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "op", "median_us", "retired_column"])
        writer.writerow(["2026-01-01T00:00:00Z", "RMSNormFwdOp", "9.0", "kept"])
    append_csv(path, result_rows(llama_result(manifest), info()))
    rows = read_csv(path)
    assert rows[0]["retired_column"] == "kept" and rows[0]["median_us"] == "9.0"
    assert rows[1]["variant"] == "tileops" and len(rows) == 4
    assert not path.with_suffix(".csv.tmp").exists()


def test_markdown_table_has_one_line_per_case(manifest):
    rows = result_rows(llama_result(manifest), info())
    table = render_table(rows)
    lines = table.splitlines()
    assert len(lines) == 3
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:4] == ["RMSNormFwdOp", "llama-4k", "bfloat16", "100.00"]
    assert cells[11:13] == ["2.000×", "1.250×"]
    assert cells[-2:] == ["105.0 / 205.0 / 130.0", "2.0 / 4.0 / 2.0"]


def test_markdown_reports_wrong_results_and_notes(manifest):
    wrong = Outcome("tileops", "wrong", error=0.5, note="relative error 0.5 over limit 0.01")
    rows = result_rows(llama_result(manifest, ours=wrong), info())
    page = render_markdown(rows, source="gpu.csv")
    assert "**wrong** (5.00e-01)" in page
    assert "RMSNormFwdOp llama-4k bfloat16 tileops: wrong — relative error 0.5" in page
    assert "copy 3000.0 GB/s" in page and "tilelang 0.1.15" in page


def test_gpu_names_become_file_names():
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert gpu_slug("  ") == "unknown-gpu"


def test_compile_standing_counts_the_cases_and_lists_the_slower_ones(manifest):
    faster = result_rows(llama_result(manifest), info())  # 100 us against compile's 125
    slower = [dict(row, workload="slow") for row in result_rows(
        llama_result(manifest, ours=ok("tileops", 130.0, 2, 1e-3)), info())]
    failed = [dict(row, workload="failed") for row in result_rows(
        llama_result(manifest, compiled=Outcome("compile", "error", note="boom")), info())]
    text = render_compile_standing(faster + slower + failed)
    assert text.startswith("Against torch.compile: 1 of the 2 cases timed both ways are at least as fast")
    assert "Cases not timed both ways: 1. Slower, 1:" in text
    assert "| RMSNormFwdOp | slow | bfloat16 | 130.00 | 125.00 | 0.962× |" in text
    assert "llama-4k" not in text and "| failed |" not in text
    assert render_compile_standing(faster) == ("Against torch.compile: 1 of the 1 cases timed both ways are at "
                                               "least as fast (the median of ours at most compile's, in one run).")
    assert render_compile_standing(slower) in render_markdown(slower)


# ---- README block ----------------------------------------------------------------------------
def test_only_the_marked_block_is_rewritten():
    text = f"# Title\n\nintro\n\n{BEGIN}\nold table\n{END}\n\nafter\n"
    updated = rewrite_block(text, "new table")
    assert updated == f"# Title\n\nintro\n\n{BEGIN}\nnew table\n{END}\n\nafter\n"
    assert rewrite_block(updated, "new table") == updated


@pytest.mark.parametrize("text", ["no markers", f"{END}\n{BEGIN}", f"{BEGIN}\n{BEGIN}\n{END}"])
def test_bad_markers_are_refused(text):
    with pytest.raises(MarkersMissing):
        rewrite_block(text, "x")


def test_readme_block_is_the_csv_content(manifest, tmp_path):
    csv_path = tmp_path / "gpu.csv"
    append_csv(csv_path, result_rows(llama_result(manifest), info("2026-11-22T05:00:00Z")))
    append_csv(csv_path, result_rows(llama_result(manifest, ours=ok("tileops", 50.0, 1, 0.0)),
                                     info("2026-11-23T05:00:00Z")))
    readme_path = tmp_path / "README.md"
    readme_path.write_text(f"intro\n{BEGIN}\n{END}\nrest\n")
    assert readme.main(["--readme", str(readme_path), "--csv", str(csv_path)]) == 0
    text = readme_path.read_text()
    assert render_table(latest_run(read_csv(csv_path))) in text  # the case's latest run only
    assert "| 50.00 |" in text and "| 100.00 |" not in text
    assert text.startswith("intro\n") and text.endswith("rest\n")
    assert readme.main(["--readme", str(readme_path), "--csv", str(csv_path), "--check"]) == 0


def test_a_stale_block_fails_the_check(manifest, tmp_path):
    csv_path = tmp_path / "gpu.csv"
    append_csv(csv_path, result_rows(llama_result(manifest), info()))
    readme_path = tmp_path / "README.md"
    readme_path.write_text(f"{BEGIN}\nhand-typed\n{END}\n")
    assert readme.main(["--readme", str(readme_path), "--csv", str(csv_path), "--check"]) == 1
    assert "hand-typed" in readme_path.read_text()


def test_a_readme_without_markers_is_left_alone(manifest, tmp_path, capsys):
    csv_path = tmp_path / "gpu.csv"
    append_csv(csv_path, result_rows(llama_result(manifest), info()))
    readme_path = tmp_path / "README.md"
    readme_path.write_text("# A README without the block\n")
    assert readme.main(["--readme", str(readme_path), "--csv", str(csv_path)]) == 2
    assert readme_path.read_text() == "# A README without the block\n"
    assert BEGIN in capsys.readouterr().err


def test_render_block_without_results():
    assert "No benchmark results yet." in render_block([])


def test_the_plot_is_skipped_with_a_reason_without_matplotlib(manifest, tmp_path, monkeypatch, caplog):
    from benchmarks.plot import plot_sol

    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    rows = result_rows(llama_result(manifest), info())
    assert plot_sol(rows, tmp_path / "gpu.png") is None
    assert "matplotlib is not installed" in caplog.text
    assert not (tmp_path / "gpu.png").exists()


def test_compare_flags_large_cases_beyond_tolerance(manifest, tmp_path, capsys):
    from benchmarks import compare

    csv_path = tmp_path / "gpu.csv"
    append_csv(csv_path, result_rows(llama_result(manifest), info("2026-11-22T05:00:00Z")))
    append_csv(csv_path, result_rows(llama_result(manifest, ours=ok("tileops", 103.0, 2, 1e-3)),
                                     info("2026-11-22T06:00:00Z")))
    rows = read_csv(csv_path)
    differences = compare.compare_runs(rows, "2026-11-22T05:00:00Z", "2026-11-22T06:00:00Z")
    assert [round(d.percent, 3) for d in differences] == [3.0, 0.0, 0.0]
    assert compare.main([str(csv_path)]) == 0  # 3 % is within 5 %
    assert compare.main([str(csv_path), "--tolerance", "2"]) == 1
    assert compare.main([str(csv_path), "--tolerance", "2", "--large-mib", "1024"]) == 0  # 256 MiB is small then
    assert "over tolerance" in capsys.readouterr().out


def test_the_plot_is_written_with_matplotlib(manifest, tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.plot import main as plot_main

    csv_path = tmp_path / "gpu.csv"
    append_csv(csv_path, result_rows(llama_result(manifest), info()))
    assert plot_main([str(csv_path)]) == 0
    assert (tmp_path / "gpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_usual_autograd_note_is_explained_once_not_listed(manifest, tmp_path):
    from benchmarks import results

    noted = Outcome("eager", "ok", median_us=200.0, error=0.0, note="baseline: autograd of XFwdOp.reference")
    rows = result_rows(llama_result(manifest, eager=noted), info())
    page = render_markdown(rows)
    assert "baseline: autograd of XFwdOp" not in page and "Notes:" not in page
    assert results.BASELINES_TEXT in page
    csv_path = tmp_path / "gpu.csv"
    append_csv(csv_path, rows)
    assert results.main([str(csv_path)]) == 0
    assert (tmp_path / "gpu.md").read_text() == render_markdown(read_csv(csv_path), source="gpu.csv")


def decode_result(manifest, micros):
    spec = manifest.op("RMSNormFwdOp")
    workload = next(w for w in spec.workloads if w.label == "decode-1x4k")
    return CaseResult(Case(spec, workload, "bfloat16"), ((1, 4096), (4096,)), 4 * 4096, 2 * 3 * 4096,
                      (ok("tileops", micros, 1, 0.0), ok("eager", 9.0, 1, 0.0), ok("compile", 6.0, 1, 0.0)))


def test_a_run_over_some_cases_updates_only_those(manifest, tmp_path):
    """``make bench OPS=...`` appends a run of a few cases: the README updates those rows in
    place and keeps the other cases' rows."""
    csv_path = tmp_path / "gpu.csv"
    first = info("2026-11-22T05:00:00Z")
    append_csv(csv_path, result_rows(llama_result(manifest), first) + result_rows(decode_result(manifest, 5.0), first))
    append_csv(csv_path, result_rows(llama_result(manifest, ours=ok("tileops", 50.0, 1, 0.0)),
                                     info("2026-11-23T05:00:00Z")))
    rows = latest_by_case(read_csv(csv_path))
    assert [(r["workload"], r["run"]) for r in rows] == (
        [("llama-4k", "2026-11-23T05:00:00Z")] * 3 + [("decode-1x4k", "2026-11-22T05:00:00Z")] * 3)
    readme_path = tmp_path / "README.md"
    readme_path.write_text(f"{BEGIN}\n{END}\n")
    assert readme.main(["--readme", str(readme_path), "--csv", str(csv_path)]) == 0
    text = readme_path.read_text()
    assert "| 50.00 |" in text and "| 5.00 |" in text and "| 100.00 |" not in text
    assert text.index("| 50.00 |") < text.index("| 5.00 |")  # the re-measured case keeps its place
    assert "Run 2026-11-22T05:00:00Z" in text and "Run 2026-11-23T05:00:00Z" in text
