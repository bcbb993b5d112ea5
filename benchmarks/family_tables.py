"""The markdown table the per-family timing scripts print (``python -m benchmarks.<family>_timing``)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

__all__ = ["print_table"]

HEADER = ("| op | workload | dtype | rel err | us | loop us | GB/s | % copy | eager us | x eager | compile us "
          "| x compile |")


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(baseline: Optional[float], ours: float) -> Optional[float]:
    return None if baseline is None else baseline / ours


def table_row(r: Dict[str, Any]) -> str:
    """One row: ``loop_us``, ``eager_us`` and ``compile_us`` may be absent or None (printed as ``-``)."""
    eager, compiled = r.get("eager_us"), r.get("compile_us")
    return (f"| {r['op']} | {r['workload']} | {r['dtype']} | {r['error']:.1e} | {r['us']:.1f} | "
            f"{_fmt(r.get('loop_us'), '.1f')} | {r['gbps']:.0f} | {r['copy_pct']:.1f} | {_fmt(eager, '.1f')} | "
            f"{_fmt(_ratio(eager, r['us']), '.2f')} | {_fmt(compiled, '.1f')} | {_fmt(_ratio(compiled, r['us']), '.2f')} |")


def print_table(rows: Sequence[Dict[str, Any]], copy_gbps: float) -> None:
    """Print the copy bandwidth, then one row per timed case."""
    print(f"\ncopy bandwidth: {copy_gbps:.0f} GB/s (read + written)\n")
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    for r in rows:
        print(table_row(r))
