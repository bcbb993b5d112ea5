"""The ``tileops`` command.

    tileops cache show [--json]          list tuned configs per device fingerprint
    tileops cache clear [--current]      delete the persistent tuning cache
    tileops tune OP --shape 4096x4096 --shape 4096 --dtype bfloat16 --arg N=4096
    tileops bench [--ops OP ...] [--workloads LABEL ...]   `make bench` (source checkout only)

Each subcommand is registered by one ``_add_*`` function in ``_SUBCOMMANDS``;
adding a command means adding one such function.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import logging
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["build_parser", "main"]


# ---- cache ---------------------------------------------------------------------------


def _current_fingerprint_id() -> Optional[str]:
    from tileops.tuning.fingerprint import device_fingerprint

    try:
        return device_fingerprint().id
    except Exception:  # noqa: BLE001 - a broken CUDA setup must not stop `cache show`
        return None


def _describe_fingerprint(fingerprint: Optional[dict]) -> str:
    if not fingerprint:
        return "unknown device"
    sm = f" sm{fingerprint['sm']}" if fingerprint.get("sm") else ""
    cuda = f" cuda {fingerprint['cuda']}" if fingerprint.get("cuda") else ""
    return (
        f"{fingerprint.get('name')}{sm}{cuda}, torch {fingerprint.get('torch')}, "
        f"tilelang {fingerprint.get('tilelang')}, tileops {fingerprint.get('tileops')}"
    )


def _describe_entry(entry: Dict[str, Any]) -> str:
    invocation = entry.get("invocation") or {}
    op = str(invocation.get("op", "?")).rsplit(".", 1)[-1]
    params = ", ".join(f"{k}={v}" for k, v in sorted((invocation.get("params") or {}).items()))
    workload = ", ".join(f"{k}={v}" for k, v in sorted((invocation.get("workload") or {}).items()))
    tuner = entry.get("tuner") or {}
    timing = ""
    if tuner.get("best_ms") is not None:
        timing = f"  {tuner['best_ms']:.4f} ms"
        if tuner.get("heuristic_ms"):
            timing += f" (heuristic {tuner['heuristic_ms']:.4f} ms, x{tuner['heuristic_ms'] / tuner['best_ms']:.2f})"
    return (
        f"{op}({params}) [{workload}] -> {json.dumps(entry.get('config'), sort_keys=True)}"
        f"{timing}  {entry.get('source', '?')} {entry.get('created', '')}"
    )


def _cache_show(args: argparse.Namespace) -> int:
    from tileops.tuning.cache import CacheDirectory

    directory = CacheDirectory()
    summaries = directory.summaries()
    if args.json:
        payload = [
            {"path": str(s.path), "fingerprint": s.fingerprint, "problem": s.problem, "entries": s.entries}
            for s in summaries
        ]
        print(json.dumps({"cache_dir": str(directory.path), "files": payload}, indent=1, sort_keys=True))
        return 0
    current = _current_fingerprint_id()
    print(f"tuning cache: {directory.path}")
    if not summaries:
        print("  (empty)")
    for summary in summaries:
        mark = "  <- this device" if summary.path.stem == current else ""
        print(f"\n{summary.path.name}{mark}")
        print(f"  {_describe_fingerprint(summary.fingerprint)}")
        if summary.problem:
            print(f"  unusable: {summary.problem}")
        print(f"  {len(summary.entries)} entries")
        for key in sorted(summary.entries, key=lambda k: _describe_entry(summary.entries[k])):
            print(f"  {key[:12]}  {_describe_entry(summary.entries[key])}")
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    from tileops.tuning.cache import CacheDirectory
    from tileops.tuning.fingerprint import device_fingerprint

    directory = CacheDirectory()
    if args.current:
        cache = directory.for_fingerprint(device_fingerprint())
        existed = cache.path.exists()
        cache.clear()
        print(f"removed {cache.path}" if existed else f"nothing to remove at {cache.path}")
        return 0
    removed = directory.clear()
    print(f"removed {removed} cache file(s) from {directory.path}")
    return 0


def _add_cache(subparsers: Any) -> None:
    cache = subparsers.add_parser("cache", help="inspect or clear the persistent tuning cache")
    actions = cache.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="list tuned configs per device fingerprint")
    show.add_argument("--json", action="store_true", help="print the raw cache contents as JSON")
    show.set_defaults(handler=_cache_show)
    clear = actions.add_parser("clear", help="delete cache files (all fingerprints unless --current)")
    clear.add_argument("--current", action="store_true", help="only this device's file")
    clear.set_defaults(handler=_cache_clear)


# ---- tune ----------------------------------------------------------------------------


def _parse_shape(text: str) -> Optional[Tuple[int, ...]]:
    """``4096x4096`` or ``4096,4096`` -> (4096, 4096); ``none`` -> None; ``""`` -> ()."""
    cleaned = text.strip().lower()
    if cleaned == "none":
        return None
    parts = [p for p in cleaned.replace(",", "x").split("x") if p]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}; write e.g. 8192x4096") from None


def _parse_assignment(text: str) -> Tuple[str, Any]:
    name, sep, raw = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # a bare word stays a string
    return name, value


def resolve_op_class(name: str) -> type:
    """An op class by name from ``tileops.ops``, or by ``module:Class`` / ``module.Class``."""
    if ":" in name or "." in name:
        module_name, _, attr = name.replace(":", ".").rpartition(".")
        return getattr(importlib.import_module(module_name), attr)
    ops = importlib.import_module("tileops.ops")
    found = getattr(ops, name, None)
    if not isinstance(found, type):
        raise SystemExit(f"tileops: no op named {name!r} in tileops.ops")
    return found


def _workload(op_cls: type, label: str) -> Dict[str, Any]:
    workloads = getattr(op_cls, "workloads", None)
    if not isinstance(workloads, dict) or label not in workloads:
        known = sorted(workloads) if isinstance(workloads, dict) else []
        raise SystemExit(
            f"tileops: workload {label!r} is not available for {op_cls.__name__} "
            f"(known: {known or 'none'}); pass --shape/--dtype/--arg instead"
        )
    return dict(workloads[label])


def _construct_op(op_cls: type, dtype: Optional[str], assignments: Dict[str, Any]) -> Any:
    import torch

    kwargs = dict(assignments)
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype)
    for name, value in list(kwargs.items()):
        if name == "dtype" and isinstance(value, str):
            kwargs[name] = getattr(torch, value.replace("torch.", ""))
    accepted = inspect.signature(op_cls).parameters
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        raise SystemExit(f"tileops: {op_cls.__name__} takes {list(accepted)}, not {unknown}")
    return op_cls(**kwargs)


def _tune(args: argparse.Namespace) -> int:
    from tileops.tuning.ops import tune_op_kernels

    op_cls = resolve_op_class(args.op)
    shapes: List[Any] = list(args.shape or [])
    dtype, assignments = args.dtype, dict(args.arg or [])
    if args.workload:
        spec = _workload(op_cls, args.workload)
        shapes = shapes or [tuple(s) if s is not None else None for s in spec.get("shapes", [])]
        dtype = dtype or spec.get("dtype")
        assignments = {**(spec.get("params") or {}), **assignments}
    if not shapes:
        raise SystemExit("tileops tune: give the op's input shapes with --shape (once per input)")
    op = _construct_op(op_cls, dtype, assignments)
    began = time.perf_counter()
    results = tune_op_kernels(op, *shapes, force=args.force)
    seconds = time.perf_counter() - began
    print(f"{op_cls.__name__}: {len(results)} kernel(s) in {seconds:.1f} s")
    for label, kernel, selection in results:
        tuner = (selection.entry.tuner if selection.entry is not None else {}) or {}
        timing = f"  {tuner['best_ms']:.4f} ms" if tuner.get("best_ms") is not None else ""
        print(f"  {label}: {type(kernel).__name__} {json.dumps(dict(selection.config), sort_keys=True)}"
              f"  [{selection.source}]{timing}")
    return 0


def _add_tune(subparsers: Any) -> None:
    tune = subparsers.add_parser("tune", help="autotune an op's kernels on this GPU and save the winners")
    tune.add_argument("op", help="op class name in tileops.ops (or module:Class)")
    tune.add_argument("--workload", metavar="LABEL", help="a workload the op class declares")
    tune.add_argument("--shape", action="append", type=_parse_shape, metavar="AxB",
                      help="shape of one forward input, in order (repeat per input; 'none' for an absent one)")
    tune.add_argument("--dtype", help="dtype passed to the op's constructor, e.g. bfloat16")
    tune.add_argument("--arg", action="append", type=_parse_assignment, metavar="NAME=VALUE",
                      help="another constructor argument (repeatable), e.g. N=4096 or eps=1e-5")
    tune.add_argument("--force", action="store_true", help="retune even if a tuned config is cached")
    tune.set_defaults(handler=_tune)


# ---- bench ---------------------------------------------------------------------------


def _benchmarks_main() -> Optional[Any]:
    """``benchmarks.__main__`` of the source checkout (the wheel does not ship it), or None."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__main__.py").is_file():
        return None
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module("benchmarks.__main__")


def _no_benchmarks(args: argparse.Namespace) -> int:
    print("tileops bench: benchmarks/ is part of the source checkout; run it there", file=sys.stderr)
    return 2


def _add_bench(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="time ops against torch eager and torch.compile (make bench)")
    benchmarks = _benchmarks_main()
    if benchmarks is None:
        bench.set_defaults(handler=_no_benchmarks)
        return
    benchmarks.add_arguments(bench)
    bench.set_defaults(handler=benchmarks.run)


# ---- entry point -----------------------------------------------------------------------

_SUBCOMMANDS: Sequence[Callable[[Any], None]] = (_add_cache, _add_tune, _add_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tileops", description="tileops command-line tools")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for register in _SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
