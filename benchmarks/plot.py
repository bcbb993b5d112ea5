"""SOL % per op and workload: ours, eager and torch.compile side by side, one panel per op.

    python -m benchmarks.plot RESULTS.csv [--out FILE.png] [--run RUN]

Needs matplotlib; without it the plot is skipped with a logged reason (the CSV and
Markdown carry the same numbers). The command re-renders a plot from a CSV, by
default its latest run.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .results import VARIANTS, Row, latest_run, read_csv

__all__ = ["plot_sol", "main"]

logger = logging.getLogger(__name__)

COLORS = {"tileops": "#1f77b4", "eager": "#ff7f0e", "compile": "#2ca02c"}
PANEL_COLUMNS = 3


def _panels(rows: Sequence[Row]) -> "OrderedDict[str, tuple[List[str], Dict[str, List[float]]]]":
    """Per op: case labels (workload, dtype) and each variant's SOL % (0 when not timed)."""
    panels: "OrderedDict[str, tuple[List[str], Dict[str, List[float]]]]" = OrderedDict()
    index: Dict[tuple, int] = {}
    for row in rows:
        labels, values = panels.setdefault(row["op"], ([], {name: [] for name in VARIANTS}))
        key = (row["op"], row["workload"], row["dtype"])
        if key not in index:
            index[key] = len(labels)
            labels.append(f"{row['workload']}\n{row['dtype']}")
            for series in values.values():
                series.append(0.0)
        if row.get("variant") in values and row.get("status") == "ok" and row.get("sol_pct"):
            values[row["variant"]][index[key]] = float(row["sol_pct"])
    return panels


def plot_sol(rows: Sequence[Row], path: Path, title: str = "") -> Optional[Path]:
    """Write the chart to ``path``; None (and a log line saying why) when it cannot."""
    if not rows:
        logger.warning("no rows to plot")
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        logger.warning("plot skipped: matplotlib is not installed (%s)", exc)
        return None
    panels = _panels(rows)
    columns = min(PANEL_COLUMNS, len(panels))
    panel_rows = math.ceil(len(panels) / columns)
    widest = max(len(labels) for labels, _ in panels.values())
    figure, axes = plt.subplots(panel_rows, columns, squeeze=False, sharey=True,
                                figsize=(columns * max(4.0, 0.9 * widest + 1.5), 3.4 * panel_rows + 0.8))
    width = 0.8 / len(VARIANTS)
    for axis, (op, (labels, values)) in zip(axes.flat, panels.items()):
        for offset, name in enumerate(VARIANTS):
            positions = [i + (offset - (len(VARIANTS) - 1) / 2) * width for i in range(len(labels))]
            axis.bar(positions, values[name], width, label=name, color=COLORS[name])
        axis.axhline(100, color="grey", linewidth=0.8, linestyle="--")
        axis.set_xticks(range(len(labels)))
        axis.set_xticklabels(labels, fontsize=7)
        axis.set_title(op, fontsize=10)
        axis.set_ylim(0, 110)
    for axis in axes.flat[len(panels):]:
        axis.set_visible(False)
    for axis in axes[:, 0]:
        axis.set_ylabel("SOL % (roofline floor / time)", fontsize=8)
    handles, names = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, names, loc="upper right", ncol=len(VARIANTS))
    figure.suptitle(title or f"{rows[0]['gpu']} — {rows[0]['date']} (run {rows[0]['run']})", x=0.01,
                    ha="left", fontsize=11)
    figure.tight_layout(rect=(0, 0, 1, 0.96))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot", description=__doc__.split("\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--out", type=Path, help="PNG path (default: the CSV's, with .png)")
    parser.add_argument("--run", help="run id (default: the latest)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    rows = read_csv(args.csv)
    rows = [r for r in rows if r.get("run") == args.run] if args.run else latest_run(rows)
    written = plot_sol(rows, args.out or args.csv.with_suffix(".png"))
    if written is None:
        return 1
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
