"""How far apart two runs in a results CSV are, case by case.

    python -m benchmarks.compare benchmarks/results/NVIDIA-H100-80GB-HBM3.csv [--runs A B]
                                 [--large-mib 128] [--tolerance 5]

By default the two latest runs. Prints each op x workload x dtype x variant with both
medians and their difference, and exits 1 when a large case (roofline bytes of at least
``--large-mib``: too big for L2 to blur) differs by more than ``--tolerance`` percent.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .results import Row, read_csv

__all__ = ["Difference", "compare_runs", "main"]

Key = Tuple[str, str, str, str]


@dataclass(frozen=True)
class Difference:
    key: Key  # op, workload, dtype, variant
    first_us: float
    second_us: float
    bytes: int

    @property
    def percent(self) -> float:
        """Signed change from the first run to the second, in percent of the first."""
        return 100.0 * (self.second_us - self.first_us) / self.first_us


def _timed(rows: Sequence[Row], run: str) -> Dict[Key, Row]:
    return {(r["op"], r["workload"], r["dtype"], r["variant"]): r for r in rows
            if r.get("run") == run and r.get("status") == "ok" and r.get("median_us")}


def compare_runs(rows: Sequence[Row], first: str, second: str) -> List[Difference]:
    """Cases timed in both runs, in the first run's order."""
    before, after = _timed(rows, first), _timed(rows, second)
    return [Difference(key, float(row["median_us"]), float(after[key]["median_us"]), int(row.get("bytes") or 0))
            for key, row in before.items() if key in after]


def _two_latest(rows: Sequence[Row]) -> Optional[Tuple[str, str]]:
    runs = sorted({r["run"] for r in rows if r.get("run")})
    return (runs[-2], runs[-1]) if len(runs) >= 2 else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.split("\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--runs", nargs=2, metavar=("FIRST", "SECOND"), help="run ids (default: the two latest)")
    parser.add_argument("--large-mib", type=float, default=128.0, help="roofline bytes that make a case large")
    parser.add_argument("--tolerance", type=float, default=5.0, help="allowed difference of large cases, %%")
    args = parser.parse_args(argv)
    rows = read_csv(args.csv)
    runs = tuple(args.runs) if args.runs else _two_latest(rows)
    if runs is None:
        print(f"{args.csv} holds fewer than two runs", file=sys.stderr)
        return 2
    differences = compare_runs(rows, *runs)
    print(f"{runs[0]} -> {runs[1]}")
    print(f"{'op':<18}{'workload':<14}{'dtype':<10}{'variant':<9}{'first µs':>11}{'second µs':>11}{'diff %':>8}")
    beyond = []
    for d in differences:
        large = d.bytes >= args.large_mib * 2**20
        flag = ""
        if large and abs(d.percent) > args.tolerance:
            beyond.append(d)
            flag = "  <-- over tolerance"
        print(f"{d.key[0]:<18}{d.key[1]:<14}{d.key[2]:<10}{d.key[3]:<9}{d.first_us:>11.2f}{d.second_us:>11.2f}"
              f"{d.percent:>+8.1f}{'' if large else '  (small)'}{flag}")
    large_count = sum(d.bytes >= args.large_mib * 2**20 for d in differences)
    worst = max((abs(d.percent) for d in differences if d.bytes >= args.large_mib * 2**20), default=0.0)
    print(f"{large_count} large cases, worst difference {worst:.1f}% (tolerance {args.tolerance}%); "
          f"{len(beyond)} over")
    return 1 if beyond else 0


if __name__ == "__main__":
    sys.exit(main())
