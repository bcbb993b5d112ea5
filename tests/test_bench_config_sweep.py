"""The config sweep: every config checked, the right ones timed in turns with torch.compile.

A fake op with one fake kernel stands in for a generated op; its output depends on the
kernel's config, so a config can be made wrong.
"""

from __future__ import annotations

import threading

import torch

from bench_fakes import FakeBackend, FakeRMSNorm, fake_resolver, identity_compiler, make_class
from benchmarks.config_sweep import render, sweep_configs
from benchmarks.runner import RunContext
from benchmarks.workloads import Case
from codegen.loader import load_manifest


class FakeKernel:
    default_config = {"threads": 256, "scale": 1.0}
    autotune_configs = [{"threads": 256, "scale": 1.0}, {"threads": 128, "scale": 1.0}, {"threads": 64, "scale": 2.0}]

    def __init__(self) -> None:
        self.config = dict(self.default_config)
        self.seen = []


class KernelRMSNorm(FakeRMSNorm):
    """Builds its kernel on the first call, as a generated op does; ``scale`` != 1 is a wrong result."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._kernel_cache = {}
        self._kernel_cache_lock = threading.Lock()

    def __call__(self, x, weight):
        kernel = self._kernel_cache.setdefault(("rms_norm", ()), FakeKernel())
        kernel.seen.append(dict(kernel.config))
        return super().__call__(x, weight) * kernel.config["scale"]


def sweep(backend, rounds=1, **kwargs):
    manifest = load_manifest()
    spec = manifest.op("RMSNormFwdOp")
    case = Case(spec, next(w for w in spec.workloads if w.label == "decode-1x4k"), "float32")
    op_class = make_class(KernelRMSNorm)
    ctx = RunContext(manifest, backend, "cpu", compiler=identity_compiler, resolve=fake_resolver(RMSNormFwdOp=op_class),
                     generator=torch.Generator().manual_seed(0), rounds=rounds)
    return sweep_configs(case, ctx, **kwargs)


def test_each_config_runs_under_its_own_settings_and_a_wrong_one_is_never_timed():
    backend = FakeBackend()
    results = sweep(backend, partial=[{"threads": 512}], candidates=True)
    assert [r.changed for r in results] == [{}, {"threads": 128}, {"threads": 64, "scale": 2.0}, {"threads": 512}, {}]
    assert [r.outcome.status for r in results] == ["ok", "ok", "wrong", "ok", "ok"]
    assert results[-1].outcome.variant == "compile"
    assert len(backend.timed) == 4  # three right configs and the baseline


def test_rounds_take_turns_and_the_table_compares_with_compile():
    backend = FakeBackend(times=[10.0, 8.0, 9.0, 12.0, 9.0, 9.0, 11.0, 13.0])
    results = sweep(backend, rounds=2, partial=[{"threads": 128}, {"threads": 64}])
    assert [r.outcome.median_us for r in results] == [9.5, 8.5, 10.0, 12.5]
    # The configs and the baseline alternate: round one times all four, then round two.
    assert backend.timed[0] is backend.timed[4] and backend.timed[3] is backend.timed[7]
    table = render(results)
    assert "| current | ok | 9.500 |" in table and "| torch.compile | ok | 12.500 |" in table
    assert '| {"threads": 128} | ok | 8.500 | 8.000-9.000 us | 1.4706x |' in table
