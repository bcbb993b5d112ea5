"""Time one op's kernel under several configs against torch.compile, all taking turns.

    python -m benchmarks.config_sweep --op SoftmaxBwdOp --workload rows-32k-4k --dtype bfloat16 \
        [--config '{"row_threads": 512, "block_threads": 512}' ...] [--candidates] [--rounds 5] \
        [--shape x=8192x32768 ...] [--param '{"dim": -1}'] [--jobs 8]

Between configs of a memory-bound kernel the differences worth having are a
percent or less, about what moves from one card to the next or between two
timings in a row.  Here every config and the torch.compile baseline are timed
once a round, in turns, so drift reaches them alike, and each gets the median of
its rounds.  A config is its kernel's current one with the given keys replaced
(``--candidates`` adds the kernel's ``autotune_configs``); each is checked
against the float64 reference before it is timed, and a wrong one is never
timed.  The table goes to stdout, to choose a kernel's heuristic; nothing is
written to the results CSV.

Compiling is most of a sweep's time: every config but the current one is
compiled first in ``--jobs`` spawned processes, each setting the case up and
launching the op once under its config, so that TileLang's disk cache serves
the sweep (a config whose worker fails is compiled by the sweep itself).

A heuristic should hold beyond the manifest's workloads: ``--shape x=8192x32768``
gives the workload's tensor ``x`` that shape and ``--param`` replaces its params,
so the same sweep runs on shapes the bench does not list (the op's own checks
still apply to them).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .prewarm import default_jobs, find_case, in_processes, noted
from .runner import (
    OK, CheckedVariant, Outcome, RunContext, build_input_sets, build_op, check_variant, float64_oracle,
    time_in_turns, variants_and_inputs,
)
from .variants import COMPILE, OURS, InputSet, Variant
from .workloads import Case

__all__ = ["ConfigResult", "SweepRecipe", "compile_config", "compile_configs", "configured_call", "parse_shape",
           "pick_kernel", "reshaped_case", "sweep_configs", "main"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConfigResult:
    """One config of the swept kernel (``changed``: the keys that differ from the kernel's own)."""

    config: Dict[str, Any]
    changed: Dict[str, Any]
    outcome: Outcome


@dataclass(frozen=True)
class SweepRecipe:
    """What a worker process needs to set the swept case up again: the manifest case, the
    tensor shapes and params that replace its own, and which of the op's kernels is swept."""

    op: str
    workload: str
    dtype: str
    shapes: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()
    params: Tuple[Tuple[str, Any], ...] = ()
    kernel: Optional[str] = None

    def case(self) -> Tuple[Any, Case]:
        """The manifest and the reshaped case."""
        manifest, case = find_case((self.op, self.workload, self.dtype))
        return manifest, reshaped_case(case, dict(self.shapes), dict(self.params))


def parse_shape(text: str) -> Tuple[str, Tuple[int, ...]]:
    """``"x=8192x32768"`` -> ``("x", (8192, 32768))``; ``"x="``: a 0-d tensor."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(dim) for dim in dims.split("x")) if dims else ()
    except ValueError:
        shape = None
    if not sep or not name or shape is None or any(dim < 0 for dim in shape):
        raise argparse.ArgumentTypeError(f"--shape wants NAME=D0xD1x..., e.g. x=8192x32768; got {text!r}")
    return name, shape


def reshaped_case(case: Case, shapes: Mapping[str, Tuple[int, ...]], params: Mapping[str, Any]) -> Case:
    """``case`` with some of its tensors' shapes and params replaced (its label says which)."""
    known = [name for name, _ in case.workload.shapes]
    unknown = sorted(set(shapes) - set(known))
    if unknown:
        raise ValueError(f"{case.label}: no tensor {unknown} in the workload (its tensors: {known})")
    if not shapes and not params:
        return case
    changes = [f"{name}={'x'.join(map(str, shape))}" for name, shape in shapes.items()]
    changes += [f"{name}={json.dumps(value)}" for name, value in params.items()]
    workload = dataclasses.replace(
        case.workload, label=f"{case.workload.label} with {' '.join(changes)}",
        shapes=tuple((name, tuple(shapes.get(name, shape))) for name, shape in case.workload.shapes),
        params=tuple({**dict(case.workload.params), **params}.items()))
    return dataclasses.replace(case, workload=workload)


def _with_config(variant: Variant, kernel: Any, config: Dict[str, Any], name: str) -> Variant:
    """``variant``'s call with ``kernel`` switched to ``config`` first (a host step, before the launch)."""
    def bind(inputs: InputSet) -> Any:
        call = variant.bind(inputs)

        def configured() -> Any:
            if kernel.config != config:
                kernel.config = dict(config)
            return call()

        return configured

    return Variant(name, bind, json.dumps(config, sort_keys=True))


def pick_kernel(op: Any, label: Optional[str]) -> Any:
    """The kernel of ``op`` that ``label`` (its kernel key) names; the only one where ``label`` is None."""
    from tileops.tuning.ops import built_kernels  # deferred: the package imports no torch at start

    kernels = dict(built_kernels(op))
    if label is None and len(kernels) == 1:
        return next(iter(kernels.values()))
    if label not in kernels:
        raise ValueError(f"{type(op).__name__}: pick a kernel with --kernel, one of {sorted(kernels)}")
    return kernels[label]


def configured_call(case: Case, ctx: RunContext, config: Optional[Dict[str, Any]] = None,
                    kernel_label: Optional[str] = None) -> Tuple[Callable[[], Any], Any]:
    """``case``'s op on a set of its inputs, as a call without arguments, run once to build its
    kernels, and its kernel (``pick_kernel``) with the keys of ``config`` (if any) replaced."""
    op = build_op(case, ctx)
    variants, make_inputs, _ = variants_and_inputs(case, op, ctx)
    call = next(v for v in variants if v.name == OURS).bind(make_inputs())
    call()  # builds the kernels
    kernel = pick_kernel(op, kernel_label)
    if config:
        kernel.config = {**kernel.config, **config}
    return call, kernel


def _swept_configs(kernel: Any, partial: Sequence[Dict[str, Any]], candidates: bool) -> List[Dict[str, Any]]:
    configs = [dict(kernel.config)]
    extra = list(kernel.autotune_configs) if candidates else []
    for config in extra + [{**kernel.config, **changes} for changes in partial]:
        if config not in configs:
            configs.append(dict(config))
    return configs


def compile_config(config: Dict[str, Any], recipe: SweepRecipe, device_name: str = "cuda") -> Tuple[float, str]:
    """Set ``recipe``'s case up and launch its op once with the swept kernel under ``config``, which
    compiles what that launch needs into TileLang's disk cache; returns the seconds it took and an
    error note ("" if none)."""
    import torch

    def launch_under_config() -> None:
        manifest, case = recipe.case()
        ctx = RunContext(manifest, None, torch.device(device_name),  # nothing timed: no backend
                         generator=torch.Generator(device_name).manual_seed(0))
        call, _ = configured_call(case, ctx, config, recipe.kernel)
        call()

    return noted(launch_under_config, device_name)


def compile_configs(configs: Sequence[Dict[str, Any]], recipe: SweepRecipe, jobs: int,
                    device_name: str = "cuda") -> List[Tuple[Dict[str, Any], str]]:
    """``compile_config`` of every config in ``jobs`` spawned processes; returns the (config, note)
    pairs that failed."""
    if jobs <= 0 or not configs:
        return []
    task = functools.partial(compile_config, recipe=recipe, device_name=device_name)
    failures = []
    for config, seconds, note in in_processes(task, list(configs), jobs):
        if note:
            failures.append((config, note))
            logger.warning("compiling %s failed (the sweep compiles it): %s", json.dumps(config), note)
        else:
            logger.info("compiled %s in %.1f s", json.dumps(config), seconds)
    return failures


def sweep_configs(case: Case, ctx: RunContext, partial: Sequence[Dict[str, Any]] = (), candidates: bool = False,
                  kernel_label: Optional[str] = None,
                  compile_ahead: Optional[Callable[[List[Dict[str, Any]]], Any]] = None) -> List[ConfigResult]:
    """Check and time ``case``'s op with its kernel under each config, in turns with torch.compile.

    ``compile_ahead`` is given every config but the kernel's own (which the first call compiled)
    before any is checked.  The last result is the compile baseline (``changed`` empty, config
    empty) when ``ctx`` has a compiler.
    """
    op = build_op(case, ctx)
    variants, make_inputs, _ = variants_and_inputs(case, op, ctx)
    input_sets = build_input_sets(make_inputs, ctx)
    oracle, own_error, expected_dtypes = float64_oracle(op, input_sets[0].args)
    ours = next(v for v in variants if v.name == OURS)
    ours.bind(input_sets[0])()  # builds the kernels
    kernel = pick_kernel(op, kernel_label)
    own = dict(kernel.config)
    configs = _swept_configs(kernel, partial, candidates)
    if compile_ahead is not None:
        compile_ahead(configs[1:])
    timed = [_with_config(ours, kernel, config, f"config {index}") for index, config in enumerate(configs)]
    timed += [v for v in variants if v.name == COMPILE]
    checked = [check_variant(v, input_sets, oracle, case.dtype, own_error, expected_dtypes, ctx.backend) for v in timed]
    timings = time_in_turns([c for c in checked if isinstance(c, CheckedVariant)], ctx.backend, ctx.rounds)
    kernel.config = own
    results = []
    for variant, check, config in zip(timed, checked, configs + [{}]):
        outcome = timings[variant.name] if isinstance(check, CheckedVariant) else check
        changed = {key: value for key, value in config.items() if own.get(key) != value}
        results.append(ConfigResult(config, changed, outcome))
    return results


def render(results: Sequence[ConfigResult]) -> str:
    """A Markdown table: each config's changed keys, median and range, and speed against the baseline."""
    baseline = next((r.outcome.median_us for r in results if r.outcome.variant == COMPILE and r.outcome.status == OK),
                    None)
    lines = ["| config | status | µs | rounds | vs compile | rel err |", "|---|---|---|---|---|---|"]
    for result in results:
        outcome = result.outcome
        name = "torch.compile" if outcome.variant == COMPILE else (json.dumps(result.changed) if result.changed
                                                                     else "current")
        micros = f"{outcome.median_us:.3f}" if outcome.median_us is not None else ""
        spread = f"{min(outcome.rounds_us):.3f}-{max(outcome.rounds_us):.3f} us" if outcome.rounds_us else ""
        ratio = f"{baseline / outcome.median_us:.4f}x" if baseline and outcome.median_us else ""
        error = f"{outcome.error:.2e}" if outcome.error is not None else ""
        lines.append(f"| {name} | {outcome.status} | {micros} | {spread} | {ratio} | {error} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", required=True, help="op class name")
    parser.add_argument("--workload", required=True, help="manifest workload label")
    parser.add_argument("--dtype", required=True, help="dtype name, e.g. bfloat16")
    parser.add_argument("--config", action="append", default=[], type=json.loads, metavar="JSON",
                        help="keys to replace in the kernel's config (repeatable)")
    parser.add_argument("--candidates", action="store_true", help="also every config of the kernel's autotune list")
    parser.add_argument("--kernel", help="which of the op's kernels (its kernel key), when it builds several")
    parser.add_argument("--rounds", type=int, default=5, help="timings per config, in turns")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", action="append", default=[], type=parse_shape, metavar="NAME=D0xD1...",
                        help="time the workload with this tensor's shape replaced (repeatable)")
    parser.add_argument("--param", type=json.loads, default={}, metavar="JSON",
                        help="params of the workload to replace, e.g. '{\"dim\": [0]}'")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes compiling the configs first (default: half the cores, at most 8; 0: none)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    import torch

    from codegen.loader import load_manifest

    from .timing import CudaBackend
    from .variants import default_compiler
    from .workloads import load_entries, select_cases

    if not torch.cuda.is_available():
        print("python -m benchmarks.config_sweep needs a CUDA device", file=sys.stderr)
        return 2
    manifest = load_manifest()
    cases = select_cases(manifest, load_entries(), [args.op], [args.workload], [args.dtype])
    if len(cases) != 1:
        print(f"no single case {args.op}/{args.workload}/{args.dtype} in the manifest", file=sys.stderr)
        return 2
    if not isinstance(args.param, dict):
        print(f"--param wants a JSON object, got {args.param!r}", file=sys.stderr)
        return 2
    try:
        case = reshaped_case(cases[0], dict(args.shape), args.param)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    ctx = RunContext(manifest, CudaBackend("cuda"), "cuda", compiler=default_compiler,
                     generator=torch.Generator("cuda").manual_seed(args.seed), rounds=args.rounds)
    recipe = SweepRecipe(args.op, args.workload, args.dtype, tuple(args.shape), tuple(args.param.items()), args.kernel)
    jobs = default_jobs() if args.jobs is None else args.jobs
    results = sweep_configs(case, ctx, args.config, args.candidates, args.kernel,
                            compile_ahead=lambda configs: compile_configs(configs, recipe, jobs))
    print(f"\n{case.label} on {torch.cuda.get_device_name()}, median of {args.rounds} rounds in turns\n")
    print(render(results))
    return 0 if all(r.outcome.status == OK for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
