"""Host cost per call and recompiles: ``python -m benchmarks.host_overhead`` (needs a GPU).

For small inputs the GPU finishes a launch faster than the host issues the next
one, so a long loop of calls measures host time per call. Each op is timed
four ways on the same tensors:

* ``kernel``: the compiled TileLang program launched directly on prepared tensors,
* ``op``: an eager call of the op (checks, routing, cache lookup, launch),
* ``custom op``: the same call through ``torch.ops.tileops`` (the dispatcher path
  that torch.compile and autograd use),
* ``torch``: the PyTorch eager reference.

Then it calls each op at row counts it has not seen and reports whether any new
program was compiled and how long the first call took.

``--ops``/``--workloads`` instead take manifest cases (as ``make bench`` does) and
report, for each, the eager op and the PyTorch baseline per call, and with
``--profile`` the functions that own the op's host time.  With ``--backward``, each
call of a Fwd case is an eager training step: the call with every floating-point input
requiring a gradient, then its backward, against the same step of the PyTorch reference.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable, Dict, List, Tuple

import torch

CALLS = 20000
# The calls are timed in rounds and the fastest round is reported: on a shared host one long
# loop absorbs every interruption, and repeated loops of the same call varied by 30%.
ROUNDS = 10
# A training step costs tens of calls: fewer of them make each round as long.
TRAINING_CALLS = 2000


def per_call_us(fn: Callable[[], object], calls: int = CALLS, rounds: int = ROUNDS) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    per_round = max(1, calls // rounds)
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(per_round):
            fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - began)
    return best / per_round * 1e6


def compiled_programs(op: torch.nn.Module) -> int:
    return sum(len(kernel._compiled) for kernel in op._kernel_cache.values())


def rms_norm_case(hidden: int, dtype: torch.dtype):
    from tileops.ops import RMSNormFwdOp

    op = RMSNormFwdOp(N=hidden, dtype=dtype)
    x = torch.randn(1, hidden, device="cuda", dtype=dtype)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    op(x, w)
    kernel = next(iter(op._kernel_cache.values()))
    y = torch.empty_like(x)
    return {
        "name": f"RMSNormFwdOp 1x{hidden}",
        "op": op,
        "kernel": lambda: kernel(x, w, y),
        "eager": lambda: op(x, w),
        "custom": lambda: op._library_call(x, w),
        "torch": lambda: torch.nn.functional.rms_norm(x, (hidden,), w, 1e-6),
        "call_rows": lambda rows: op(torch.randn(rows, hidden, device="cuda", dtype=dtype), w),
    }


def cumsum_case(length: int, dtype: torch.dtype):
    from tileops.ops import CumsumFwdOp

    op = CumsumFwdOp(N=length, dtype=dtype)
    x = torch.randn(1, length, device="cuda", dtype=dtype)
    op(x)
    kernel = next(iter(op._kernel_cache.values()))
    y = torch.empty_like(x)
    return {
        "name": f"CumsumFwdOp 1x{length}",
        "op": op,
        "kernel": lambda: kernel(x, y),
        "eager": lambda: op(x),
        "custom": lambda: op._library_call(x),
        "torch": lambda: torch.cumsum(x, -1),
        "call_rows": lambda rows: op(torch.randn(rows, length, device="cuda", dtype=dtype)),
    }


def measure(case: Dict) -> Tuple[Dict[str, float], List[Tuple[int, float, int]]]:
    times = {way: per_call_us(case[way]) for way in ("kernel", "eager", "custom", "torch")}
    recompiles = []
    case["call_rows"](4096)  # warm-up at one row count
    torch.cuda.synchronize()
    for rows in (1, 3, 777, 4097, 65536):
        before = compiled_programs(case["op"])
        began = time.perf_counter()
        case["call_rows"](rows)
        torch.cuda.synchronize()
        recompiles.append((rows, (time.perf_counter() - began) * 1e3, compiled_programs(case["op"]) - before))
    return times, recompiles


def profile(case: Dict) -> None:
    """cProfile of many eager calls: the functions that own the host time."""
    import cProfile
    import pstats

    for _ in range(200):  # compile and load first: the profile is of warm calls
        case["eager"]()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5000):
        case["eager"]()
    profiler.disable()
    torch.cuda.synchronize()
    print(f"== {case['name']}: eager call profile (5000 calls)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(24)


def manifest_cases(ops: List[str], workloads: List[str]) -> List[Dict]:
    """Cases of ``make bench`` (our op and its eager baseline), bound to one input set each."""
    from codegen.loader import load_manifest

    from .runner import RunContext, variants_and_inputs
    from .timing import CudaBackend
    from .workloads import constructor_kwargs, load_entries, resolve_op_class, select_cases

    manifest = load_manifest()
    context = RunContext(manifest, CudaBackend())
    cases = []
    for case in select_cases(manifest, load_entries(), ops, workloads or None):
        op = resolve_op_class(case.spec)(**constructor_kwargs(case.spec, case.workload, getattr(torch, case.dtype)))
        variants, make_inputs, _ = variants_and_inputs(case, op, context)
        inputs = make_inputs()
        calls = {variant.name: variant.bind(inputs) for variant in variants}
        cases.append({"name": case.label, "eager": calls["tileops"], "torch": calls["eager"]})
    return cases


def training_step(call: Callable[..., Any], inputs: List[Any]) -> Callable[[], None]:
    """A forward of ``call`` on ``inputs`` with every floating-point tensor a leaf that requires a
    gradient, then a backward of every floating-point output with a fixed random gradient."""
    leaves = [t.detach().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in inputs]
    outputs = call(*leaves)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    seeds = [torch.randn_like(out) if out.is_floating_point() else None for out in outputs]

    def step() -> None:
        results = call(*leaves)
        results = results if isinstance(results, tuple) else (results,)
        pairs = [(out, seed) for out, seed in zip(results, seeds) if seed is not None and out.requires_grad]
        torch.autograd.backward([out for out, _ in pairs], [seed for _, seed in pairs])
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                leaf.grad = None

    return step


def training_cases(ops: List[str], workloads: List[str]) -> List[Dict]:
    """Eager training steps of manifest Fwd cases: our op against its PyTorch reference."""
    from codegen.loader import load_manifest

    from .workloads import constructor_kwargs, load_entries, random_inputs, resolve_op_class, select_cases

    cases = []
    for case in select_cases(load_manifest(), load_entries(), ops, workloads or None):
        if case.spec.direction != "Fwd":
            continue
        op = resolve_op_class(case.spec)(**constructor_kwargs(case.spec, case.workload, getattr(torch, case.dtype)))
        inputs = random_inputs(case.spec, case.workload, case.dtype, "cuda")
        cases.append({"name": f"{case.label} fwd+bwd", "eager": training_step(op, inputs),
                      "torch": training_step(op.reference, inputs), "calls": TRAINING_CALLS})
    return cases


def report_manifest_cases(cases: List[Dict], profile_calls: bool) -> None:
    if profile_calls:
        for case in cases:
            profile(case)
    print(f"device: {torch.cuda.get_device_name()}  per figure: the fastest of {ROUNDS} rounds of {CALLS // ROUNDS} calls")
    print("| case | eager op µs | torch eager µs |")
    print("|---|---|---|")
    for case in cases:
        calls = case.get("calls", CALLS)
        print(f"| {case['name']} | {per_call_us(case['eager'], calls):.1f} | {per_call_us(case['torch'], calls):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--profile", action="store_true", help="also print where an eager call spends its host time")
    parser.add_argument("--ops", nargs="+", default=[], help="manifest ops to time instead of the built-in cases")
    parser.add_argument("--workloads", nargs="+", default=[], help="workload labels of those ops (default: all)")
    parser.add_argument("--backward", action="store_true",
                        help="time eager training steps (forward and backward) of the --ops Fwd cases")
    args = parser.parse_args()
    if args.ops:
        make = training_cases if args.backward else manifest_cases
        report_manifest_cases(make(args.ops, args.workloads), args.profile)
        return
    cases = [rms_norm_case(args.hidden, torch.bfloat16), cumsum_case(args.hidden, torch.bfloat16)]
    if args.profile:
        for case in cases:
            profile(case)
    print(f"device: {torch.cuda.get_device_name()}  per figure: the fastest of {ROUNDS} rounds of {CALLS // ROUNDS} calls")
    print("| op | kernel launch µs | eager op µs | op - kernel µs | custom op µs | torch eager µs |")
    print("|---|---|---|---|---|---|")
    rows_report = []
    for case in cases:
        times, recompiles = measure(case)
        print(f"| {case['name']} | {times['kernel']:.1f} | {times['eager']:.1f} | "
              f"{times['eager'] - times['kernel']:.1f} | {times['custom']:.1f} | {times['torch']:.1f} |")
        rows_report.append((case["name"], recompiles))
    print()
    print("| op | new row count | first call ms | programs compiled |")
    print("|---|---|---|---|")
    for name, recompiles in rows_report:
        for rows, ms, compiled in recompiles:
            print(f"| {name} | {rows} | {ms:.2f} | {compiled} |")


if __name__ == "__main__":
    main()
