"""Command line: ``python -m codegen gen|check|new-op``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional

from .errors import ManifestErrors
from .generate import check, plan, write
from .loader import ROOT, load_manifest
from .newop import add_manifest_stub


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__)
    parser.add_argument("--root", type=Path, default=ROOT, help="project root (default: this checkout)")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("gen", help="render the manifest into op files, registrations and scaffolds")
    gen.add_argument("--op", action="append", help="only this op (repeatable)")
    gen.add_argument("--family", action="append", help="only this family (repeatable)")
    sub.add_parser("check", help="exit 1 with a diff when generated files are stale or missing")
    new = sub.add_parser("new-op", help="append a manifest stub for a new op")
    new.add_argument("name", help="op class name, e.g. SoftplusFwdOp")
    new.add_argument("--family", required=True, help="family, e.g. elementwise")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    root = args.root.resolve()
    try:
        if args.command == "new-op":
            path = add_manifest_stub(args.name, args.family, root / "manifest")
            print(f"added {args.name} to {path.relative_to(root)}; fill it in, then run `make gen`")
            return 0
        manifest = load_manifest(root / "manifest", root)
        if args.command == "gen":
            changed = write(plan(manifest, root, args.op, args.family), root)
            for rel in changed:
                print(f"wrote {rel}")
            elapsed = time.perf_counter() - started
            print(f"{len(manifest.ops)} ops, {len(changed)} files changed in {elapsed:.2f} s")
            return 0
        diffs = check(plan(manifest, root), root)
        for diff in diffs:
            sys.stdout.write(diff)
        if diffs:
            print(f"{len(diffs)} generated files are stale or missing: run `make gen`", file=sys.stderr)
            return 1
        print(f"generated files match the manifest ({len(manifest.ops)} ops)")
        return 0
    except ManifestErrors as exc:
        for error in exc.errors:
            print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
