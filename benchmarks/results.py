"""Results as CSV rows (one per op x workload x dtype x variant) and Markdown tables.

The CSV is the record: appended run after run, each row carrying its run's date,
device, software versions and the ceilings it was measured against, so SOL % can be
recomputed from the file alone. The Markdown summary and the README block are both
rendered from rows read back from it, never typed.
"""

from __future__ import annotations

import csv
import logging
import os
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .ceilings import Ceilings
from .metrics import achieved_gbps, achieved_tflops, sol_percent, speedup
from .runner import CaseResult

__all__ = [
    "CSV_COLUMNS", "RunInfo", "gpu_slug", "result_rows", "append_csv", "read_csv", "latest_run", "latest_by_case",
    "render_table", "render_markdown", "render_compile_standing", "VARIANTS",
]

logger = logging.getLogger(__name__)

CSV_COLUMNS: Tuple[str, ...] = (
    "run", "date", "gpu", "tileops", "torch", "tilelang", "triton",
    "op", "workload", "dtype", "shapes", "params", "variant", "status",
    "median_us", "loop_us", "gbps", "tflops", "sol_pct", "speedup_vs_eager", "speedup_vs_compile",
    "peak_mem_mib", "rel_err", "flops", "bytes", "copy_gbps", "peak_tflops", "note",
)
VARIANTS = ("tileops", "eager", "compile")
VERSION_KEYS = ("tileops", "torch", "tilelang", "triton")

Row = Dict[str, str]


@dataclass(frozen=True)
class RunInfo:
    """What every row of one run shares."""

    run: str  # UTC timestamp, e.g. 2026-11-22T05:01:02Z; identifies the run in the CSV
    gpu: str
    ceilings: Ceilings
    versions: Mapping[str, str] = field(default_factory=dict)

    @property
    def date(self) -> str:
        return self.run[:10]


def gpu_slug(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3`` (the results file stem)."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "unknown-gpu"


def _number(value: Optional[float], digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _shape_text(shapes: Sequence[Optional[Tuple[int, ...]]]) -> str:
    return " ".join("-" if s is None else "x".join(str(d) for d in s) or "scalar" for s in shapes)


def result_rows(result: CaseResult, info: RunInfo) -> List[Row]:
    """CSV rows of one case: metrics from ``eval_roofline`` against this run's ceilings."""
    case = result.case
    peak = info.ceilings.peak_tflops(case.dtype)
    timed = {o.variant: o.median_us for o in result.outcomes if o.median_us is not None}
    rows = []
    for outcome in result.outcomes:
        micros = outcome.median_us
        row: Row = {
            "run": info.run, "date": info.date, "gpu": info.gpu,
            **{key: str(info.versions.get(key, "")) for key in VERSION_KEYS},
            "op": case.spec.name, "workload": case.workload.label, "dtype": case.dtype,
            "shapes": _shape_text(result.shapes),
            "params": " ".join(f"{k}={v}" for k, v in case.workload.params),
            "variant": outcome.variant, "status": outcome.status,
            "median_us": _number(micros, 3),
            "loop_us": _number(outcome.loop_us, 3),
            "flops": "" if result.flops is None else str(result.flops),
            "bytes": "" if result.bytes is None else str(result.bytes),
            "copy_gbps": _number(info.ceilings.copy_gbps, 1), "peak_tflops": _number(peak, 1),
            "peak_mem_mib": _number(None if outcome.peak_bytes is None else outcome.peak_bytes / 2**20, 2),
            "rel_err": "" if outcome.error is None else f"{outcome.error:.2e}",
            "note": outcome.note,
        }
        if micros is not None and result.flops is not None and result.bytes is not None:
            row["gbps"] = _number(achieved_gbps(result.bytes, micros), 1)
            row["tflops"] = _number(achieved_tflops(result.flops, micros), 3)
            row["sol_pct"] = _number(sol_percent(result.flops, result.bytes, micros,
                                                 info.ceilings.copy_gbps, peak), 1)
        row["speedup_vs_eager"] = _number(speedup(timed.get("eager"), micros), 3)
        row["speedup_vs_compile"] = _number(speedup(timed.get("compile"), micros), 3)
        rows.append({column: row.get(column, "") for column in CSV_COLUMNS})
    return rows


# ---- CSV ------------------------------------------------------------------------------------
def read_csv(path: Path) -> List[Row]:
    """Every row of a results CSV (empty when the file does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return [dict(row) for row in csv.DictReader(handle)]


def _header(path: Path) -> Optional[List[str]]:
    with path.open(newline="") as handle:
        return next(csv.reader(handle), None)


def append_csv(path: Path, rows: Iterable[Row]) -> None:
    """Append rows; a file written with other columns is rewritten once with the current ones.

    Old columns that no longer exist are kept at the end, so no recorded number is lost.
    """
    path = Path(path)
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = _header(path) if path.exists() and path.stat().st_size else None
    if header is not None and header != list(CSV_COLUMNS):
        old = read_csv(path)
        columns = list(CSV_COLUMNS) + [c for c in header if c not in CSV_COLUMNS]
        logger.warning("%s has other columns; rewriting it with the current header", path)
        temporary = path.with_suffix(path.suffix + ".tmp")
        with temporary.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(old)
            writer.writerows(rows)
        os.replace(temporary, path)
        return
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_COLUMNS), restval="", extrasaction="ignore")
        if header is None:
            writer.writeheader()
        writer.writerows(rows)


def latest_run(rows: Sequence[Row]) -> List[Row]:
    """The rows of the most recent run (runs are ISO timestamps, so they sort by time)."""
    if not rows:
        return []
    last = max(row.get("run", "") for row in rows)
    return [row for row in rows if row.get("run", "") == last]


def latest_by_case(rows: Sequence[Row]) -> List[Row]:
    """Each case's rows from the most recent run that measured it.

    A run over a subset of ops (``make bench OPS=...``) then updates its cases in place
    and leaves the others as last measured: cases keep the order in which they first
    appear among the runs shown.  Every row keeps its own run's ceilings and baselines,
    so its percentages and speedups stay those of one run.
    """
    def case(row: Row) -> Tuple[str, str, str]:
        return row["op"], row["workload"], row["dtype"]

    newest: Dict[Tuple[str, str, str], str] = {}
    for row in rows:
        newest[case(row)] = max(newest.get(case(row), ""), row.get("run", ""))
    shown = set(newest.values())
    order: "OrderedDict[Tuple[str, str, str], List[Row]]" = OrderedDict()
    for row in rows:
        if row.get("run", "") in shown:
            order.setdefault(case(row), [])
    for row in rows:
        if row.get("run", "") == newest[case(row)]:
            order[case(row)].append(row)
    return [row for case_rows in order.values() for row in case_rows]


# ---- Markdown -------------------------------------------------------------------------------
def _cases(rows: Sequence[Row]) -> "OrderedDict[Tuple[str, str, str], Dict[str, Row]]":
    grouped: "OrderedDict[Tuple[str, str, str], Dict[str, Row]]" = OrderedDict()
    for row in rows:
        grouped.setdefault((row["op"], row["workload"], row["dtype"]), {})[row["variant"]] = row
    return grouped


def _time_cell(row: Optional[Row]) -> str:
    if row is None:
        return "—"
    if row.get("status") != "ok":
        err = f" ({row['rel_err']})" if row.get("rel_err") and row.get("status") == "wrong" else ""
        return f"**{row.get('status', '?')}**{err}"
    return f"{float(row['median_us']):.2f}"


def _cell(row: Optional[Row], column: str, suffix: str = "") -> str:
    value = (row or {}).get(column, "")
    return f"{value}{suffix}" if value and (row or {}).get("status") == "ok" else "—"


def _per_variant_cell(variants: Mapping[str, Row], column: str, digits: int) -> str:
    """``ours / eager / compile`` values of one column."""
    values = []
    for name in VARIANTS:
        if name in variants:
            value = variants[name].get(column, "")
            values.append(f"{float(value):.{digits}f}" if value else "—")
    return " / ".join(values) or "—"


TABLE_HEADER = ("| op | workload | dtype | µs | GB/s | TFLOP/s | SOL % | eager µs | eager SOL % "
                "| compile µs | compile SOL % | vs eager | vs compile | loop µs (ours / eager / compile) "
                "| peak MiB (ours / eager / compile) |")


def render_table(rows: Sequence[Row]) -> str:
    """One line per op x workload x dtype: ours, then the eager and compiled baselines."""
    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    for (op, workload, dtype), variants in _cases(rows).items():
        ours, eager, compiled = (variants.get(name) for name in VARIANTS)
        lines.append("| " + " | ".join([
            op, workload, dtype, _time_cell(ours), _cell(ours, "gbps"), _cell(ours, "tflops"),
            _cell(ours, "sol_pct"), _time_cell(eager), _cell(eager, "sol_pct"),
            _time_cell(compiled), _cell(compiled, "sol_pct"),
            _cell(ours, "speedup_vs_eager", "×"), _cell(ours, "speedup_vs_compile", "×"),
            _per_variant_cell(variants, "loop_us", 1), _per_variant_cell(variants, "peak_mem_mib", 1),
        ]) + " |")
    return "\n".join(lines)


def render_compile_standing(rows: Sequence[Row]) -> str:
    """How many cases run at least as fast as torch.compile, and a table of the others.

    A case counts when both its timings are ``ok`` in one run (``rows`` hold each case's
    rows of a single run, as ``latest_by_case`` gives them); the ratio is compile's median
    over ours, so below 1 means slower than torch.compile.
    """
    cases = _cases(rows)
    timed, behind = 0, []
    for (op, workload, dtype), variants in cases.items():
        ours, compiled = variants.get("tileops"), variants.get("compile")
        if not (ours and compiled and ours.get("status") == compiled.get("status") == "ok"):
            continue
        timed += 1
        ratio = float(compiled["median_us"]) / float(ours["median_us"])
        if ratio < 1.0:
            behind.append((ratio, op, workload, dtype, ours["median_us"], compiled["median_us"]))
    untimed = len(cases) - timed
    text = (f"Against torch.compile: {timed - len(behind)} of the {timed} cases timed both ways are at least "
            "as fast (the median of ours at most compile's, in one run).")
    if untimed:
        text += f" Cases not timed both ways: {untimed}."
    if not behind:
        return text
    lines = [f"{text} Slower, {len(behind)}:", "",
             "| op | workload | dtype | µs | compile µs | vs compile |", "|---|---|---|---|---|---|"]
    for ratio, op, workload, dtype, ours_us, compiled_us in sorted(behind):
        lines.append(f"| {op} | {workload} | {dtype} | {float(ours_us):.2f} | {float(compiled_us):.2f} "
                     f"| {ratio:.3f}× |")
    return "\n".join(lines)


AUTOGRAD_NOTE = "baseline: autograd of "
BASELINES_TEXT = ("Bwd ops are compared with autograd through their Fwd op's reference "
                  "(eager and compiled), timing the backward alone.")


def _notes(rows: Sequence[Row]) -> List[str]:
    """Failures, and notes other than the usual autograd baseline (which the page explains)."""
    return [f"- {row['op']} {row['workload']} {row['dtype']} {row['variant']}: "
            f"{row['status']}{(' — ' + row['note']) if row.get('note') else ''}"
            for row in rows if row.get("status") != "ok"
            or (row.get("note") and not row["note"].startswith(AUTOGRAD_NOTE))]


def describe_runs(rows: Sequence[Row]) -> str:
    """A Markdown list: ``describe_run`` of every run among ``rows``, oldest first."""
    runs = sorted({row.get("run", "") for row in rows})
    return "\n".join(f"- Run {run}: {describe_run([r for r in rows if r.get('run', '') == run])}" for run in runs)


def describe_run(rows: Sequence[Row]) -> str:
    """One line: device, date, versions and ceilings of a run's rows."""
    first = rows[0]
    versions = ", ".join(f"{key} {first[key]}" for key in VERSION_KEYS if first.get(key))
    peaks = sorted({(row["dtype"], row["peak_tflops"]) for row in rows if row.get("peak_tflops")})
    rates = ", ".join(f"{dtype} {rate} TFLOP/s" for dtype, rate in peaks)
    return (f"{first['gpu']}, {first['date']} ({versions}). Ceilings measured in the run: "
            f"copy {first['copy_gbps']} GB/s; matmul {rates}.")


def render_markdown(rows: Sequence[Row], source: str = "") -> str:
    """The summary page of one run: what was measured, the table, and every failure."""
    if not rows:
        return "No benchmark results.\n"
    parts = [f"# Benchmarks: {rows[0]['gpu']}", "", describe_run(rows), "",
             "Times are medians of CUDA-event timings with L2 flushed before each call (a call whose "
             "host cost exceeds the flush, ~35 µs on an H100, shows part of it); loop µs is the "
             "wall time per call of back-to-back calls, host included (what an eager model pays "
             "for a tiny call). SOL % is the "
             "roofline floor (max of bytes / copy bandwidth and flops / matmul rate, from the op's "
             "`eval_roofline`) over the time; speedups are baseline time over ours; peak memory is "
             f"what one call allocates above its inputs. {BASELINES_TEXT}", "", render_table(rows), "",
             render_compile_standing(rows), ""]
    notes = _notes(rows)
    if notes:
        parts += ["Notes:", "", *notes, ""]
    if source:
        parts += [f"Source: `{source}` (run {rows[0]['run']}).", ""]
    return "\n".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m benchmarks.results CSV [--run RUN]``: re-render ``<csv>.md`` from the CSV."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.results", description=main.__doc__)
    parser.add_argument("csv", type=Path)
    parser.add_argument("--run", help="run id (default: the latest)")
    args = parser.parse_args(argv)
    rows = read_csv(args.csv)
    rows = [r for r in rows if r.get("run") == args.run] if args.run else latest_run(rows)
    if not rows:
        print(f"{args.csv}: no such run", file=sys.stderr)
        return 2
    target = args.csv.with_suffix(".md")
    target.write_text(render_markdown(rows, source=args.csv.name))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
