"""One case's op launched inside a profiler range: built and warmed up outside it, under the
config asked for."""

from __future__ import annotations

import pytest
import torch

from bench_fakes import KernelRMSNorm, fake_resolver, make_class
from benchmarks.profile_call import build_parser, profile_calls
from benchmarks.runner import RunContext
from benchmarks.workloads import Case
from codegen.loader import load_manifest


class RecordingRange:
    """Marks where the profiler range opens and closes among the op's calls."""

    def __init__(self, op_class: type) -> None:
        self.op_class = op_class
        self.marks = []

    def start(self) -> None:
        self.marks.append(("start", self.op_class.calls))

    def stop(self) -> None:
        self.marks.append(("stop", self.op_class.calls))


def profiled(profiler: RecordingRange, **kwargs):
    manifest = load_manifest()
    spec = manifest.op("RMSNormFwdOp")
    case = Case(spec, next(w for w in spec.workloads if w.label == "decode-1x4k"), "float32")
    ctx = RunContext(manifest, None, "cpu", resolve=fake_resolver(RMSNormFwdOp=profiler.op_class),
                     generator=torch.Generator().manual_seed(0))
    return profile_calls(case, ctx, profiler, **kwargs)


def test_only_the_profiled_calls_are_inside_the_range_and_they_run_under_the_config():
    op_class = make_class(KernelRMSNorm, shapes=[])
    profiler = RecordingRange(op_class)
    config = profiled(profiler, config={"threads": 128}, warmup=2, calls=3)
    # The building call and two warm-up calls before the range, three inside it.
    assert profiler.marks == [("start", 3), ("stop", 6)]
    assert config == {"threads": 128, "scale": 1.0}
    assert op_class.kernel.seen == [{"threads": 256, "scale": 1.0}] + [config] * 5
    assert op_class.shapes[-1] == ((1, 4096), 4096)


def test_the_range_closes_when_a_profiled_call_fails():
    class FailsOnceWarm(KernelRMSNorm):
        def __call__(self, x, weight):
            if type(self).calls == 1:  # the first call after the build
                type(self).calls += 1
                raise RuntimeError("launch failed")
            return super().__call__(x, weight)

    profiler = RecordingRange(make_class(FailsOnceWarm, shapes=[]))
    with pytest.raises(RuntimeError, match="launch failed"):
        profiled(profiler, warmup=0, calls=1)
    # The failing call was the profiled one: the range opened, and closed all the same.
    assert profiler.marks == [("start", 1), ("stop", 2)]


def test_warmup_and_calls_are_checked():
    with pytest.raises(ValueError, match="calls >= 1"):
        profiled(RecordingRange(make_class(KernelRMSNorm, shapes=[])), calls=0)
    args = build_parser().parse_args(["--op", "RMSNormFwdOp", "--workload", "decode-1x4k", "--dtype", "float32",
                                      "--config", '{"threads": 64}', "--shape", "x=2x4096", "--calls", "2"])
    assert args.config == {"threads": 64} and args.shape == [("x", (2, 4096))] and args.calls == 2
