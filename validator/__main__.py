"""Command line: ``python -m validator [--levels ...] [--op NAME] [--format text|json]``.

Prints one line per finding (``LEVEL  op  slot-or-rule  manifest/file.yaml:line
message``), then a summary with counts and time per level; ``--format json``
prints the same as one JSON object.  Exit status: 0 when no level found an
error (warnings do not fail), 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m validator", description="Prove that the manifest and the generated ops agree.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="levels, in order: L0 (schema), L1 (signature), L2 (shape), L3 (dtype), roofline,\n"
               "slots, registration, kernel (build for sm_90; slow)\n\n"
               "examples:\n"
               "  python -m validator --levels L0,L1\n"
               "  python -m validator --levels -kernel --op RMSNormFwdOp --format json")
    parser.add_argument("--levels", action="append", default=[], metavar="LIST",
                        help="levels to run, comma-separated and repeatable; -NAME leaves one out (default: all)")
    parser.add_argument("--op", action="append", default=[], metavar="NAME", help="only this op (repeatable)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="report format (default: text)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    return parser


def _attach_level_removals(argv: List[str]) -> List[str]:
    """``--levels -kernel`` -> ``--levels=-kernel`` (argparse would read ``-kernel`` as an option)."""
    out: List[str] = []
    for token in argv:
        if out and out[-1] == "--levels" and token.startswith("-"):
            out[-1] = f"--levels={token}"
        else:
            out.append(token)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(_attach_level_removals(list(sys.argv[1:] if argv is None else argv)))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    from .run import UsageError, parse_levels, validate  # deferred: loads torch and the ops

    try:
        report = validate(parse_levels(args.levels), args.op)
    except UsageError as exc:
        parser.error(str(exc))
    sys.stdout.write(report.json() if args.format == "json" else report.text())
    sys.stdout.flush()
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
