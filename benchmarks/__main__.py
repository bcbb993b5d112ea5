"""``python -m benchmarks`` (``make bench``): ceilings, then every case, then the reports.

    python -m benchmarks [--ops RMSNormFwdOp ...] [--workloads llama-4k ...] [--dtypes bfloat16]
                         [--results-dir DIR] [--no-compile] [--no-plot] [--list] [--jobs N]

Writes ``<results-dir>/<gpu>.csv`` (rows appended as each case finishes), ``<gpu>.md``
(this run's summary) and ``<gpu>.png``, and prints the summary table. Exit status 1
when any variant was wrong or failed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

__all__ = ["main", "run", "build_parser", "add_arguments"]

logger = logging.getLogger("benchmarks")

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark options, on any parser (``python -m benchmarks`` and ``tileops bench``)."""
    parser.add_argument("--ops", nargs="+", metavar="OP", help="op class names (default: every implemented op)")
    parser.add_argument("--workloads", nargs="+", metavar="LABEL", help="workload labels (default: all)")
    parser.add_argument("--dtypes", nargs="+", metavar="DTYPE", help="dtypes (default: each workload's)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the CSV, MD and PNG go")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--list", action="store_true", help="list the selected cases and exit (no GPU needed)")
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="warm-up per variant")
    parser.add_argument("--rep-ms", type=float, default=150.0, help="timed repetitions per variant, in ms")
    parser.add_argument("--rounds", type=int, default=1,
                        help="device timings per variant, the variants taking turns; the median is reported")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes that compile every case ahead of the timed run "
                             "(default: half the cores, at most 8; 0: compile while timing)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description="Time tileops ops against PyTorch eager and torch.compile.")
    add_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def software_versions() -> Dict[str, str]:
    """Versions recorded with every row: the module's own when loaded, else the installed one."""
    versions = {}
    for name in ("tileops", "torch", "tilelang", "triton"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if not version:
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                version = ""
        versions[name] = str(version)
    return versions


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    return run(args)


def run(args: argparse.Namespace, select: Optional[Callable[..., List[Any]]] = None) -> int:
    """Select the cases and, unless only listing them, benchmark them on the GPU.

    ``select(manifest, entries, ops, workloads, dtypes)`` picks them (default: the manifest's
    workloads, ``workloads.select_cases``)."""
    from codegen.loader import load_manifest

    from .workloads import load_entries, select_cases

    manifest = load_manifest()
    try:
        cases = (select or select_cases)(manifest, load_entries(), args.ops, args.workloads, args.dtypes)
    except ValueError as exc:
        print(f"benchmarks: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for case in cases:
            print(case.label)
        return 0
    if not cases:
        print("no cases selected (is any op `implemented`?)", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("python -m benchmarks needs a CUDA device (run `make bench` on the GPU machine)", file=sys.stderr)
        return 2
    return _run(args, manifest, cases)


def _run(args: argparse.Namespace, manifest, cases) -> int:
    import torch

    from .ceilings import measure_ceilings
    from .plot import plot_sol
    from .prewarm import default_jobs, prewarm
    from .results import RunInfo, append_csv, gpu_slug, read_csv, render_markdown, render_table, result_rows
    from .runner import RunContext, run_cases
    from .timing import CudaBackend, TimingSettings
    from .variants import default_compiler

    began = time.perf_counter()
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name(device)
    # Compiling is most of a cold run; workers fill the on-disk caches first, in parallel.
    prewarm(cases, default_jobs() if args.jobs is None else args.jobs, with_compile=not args.no_compile)
    backend = CudaBackend(device, TimingSettings(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms))
    logger.info("%s: %d cases; measuring ceilings", gpu, len(cases))
    ceilings = measure_ceilings(backend, device)
    info = RunInfo(_utc_now(), gpu, ceilings, software_versions())
    csv_path = args.results_dir / f"{gpu_slug(gpu)}.csv"
    ctx = RunContext(manifest, backend, device,
                     compiler=None if args.no_compile else default_compiler,
                     generator=torch.Generator(device).manual_seed(args.seed), rounds=args.rounds)
    results = run_cases(cases, ctx, on_result=lambda r: append_csv(csv_path, result_rows(r, info)))
    rows = [row for row in read_csv(csv_path) if row.get("run") == info.run]
    md_path = csv_path.with_suffix(".md")
    md_path.write_text(render_markdown(rows, source=csv_path.name))
    written: List[Path] = [csv_path, md_path]
    if not args.no_plot:
        png = plot_sol(rows, csv_path.with_suffix(".png"))
        written += [png] if png is not None else []
    print(f"\n{gpu}: {ceilings.describe()}\n")
    print(render_table(rows))
    failed = [r for r in results for o in r.outcomes if o.status != "ok"]
    print(f"\n{len(results)} cases in {time.perf_counter() - began:.0f} s; "
          f"{len(failed)} variant(s) wrong or failed; wrote {', '.join(str(p) for p in written)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
