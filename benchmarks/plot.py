"""SOL % per op and workload as a grouped bar chart: ours, eager, torch.compile.

Needs matplotlib; without it the plot is skipped with a logged reason (the CSV and
Markdown carry the same numbers).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .results import VARIANTS, Row

__all__ = ["plot_sol"]

logger = logging.getLogger(__name__)

COLORS = {"tileops": "#1f77b4", "eager": "#ff7f0e", "compile": "#2ca02c"}


def _series(rows: Sequence[Row]) -> "tuple[List[str], Dict[str, List[float]]]":
    labels: List[str] = []
    index: Dict[tuple, int] = {}
    for row in rows:
        key = (row["op"], row["workload"], row["dtype"])
        if key not in index:
            index[key] = len(labels)
            labels.append(f"{row['op'].removesuffix('Op')}\n{row['workload']}\n{row['dtype']}")
    values = {name: [0.0] * len(labels) for name in VARIANTS}
    for row in rows:
        if row.get("variant") in values and row.get("status") == "ok" and row.get("sol_pct"):
            values[row["variant"]][index[(row["op"], row["workload"], row["dtype"])]] = float(row["sol_pct"])
    return labels, values


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
    labels, values = _series(rows)
    width = 0.8 / len(VARIANTS)
    figure, axes = plt.subplots(figsize=(max(8.0, 1.1 * len(labels) + 2), 5.5))
    for offset, name in enumerate(VARIANTS):
        positions = [i + (offset - (len(VARIANTS) - 1) / 2) * width for i in range(len(labels))]
        axes.bar(positions, values[name], width, label=name, color=COLORS[name])
    axes.axhline(100, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xticks(range(len(labels)))
    axes.set_xticklabels(labels, fontsize=7)
    axes.set_ylabel("SOL % (roofline floor / time)")
    axes.set_title(title or f"{rows[0]['gpu']} — {rows[0]['date']}")
    axes.legend()
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
