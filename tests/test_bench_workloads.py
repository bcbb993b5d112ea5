"""From manifest workloads to constructor arguments and inputs; entries; case selection."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from benchmarks.workloads import (
    BenchEntry, Case, build_inputs, constructor_kwargs, input_dtype_names, input_shapes,
    load_entries, param_values, select_cases, static_dim_values,
)
from codegen.loader import load_manifest


@pytest.fixture(scope="module")
def manifest():
    return load_manifest()


def workload(spec, label):
    return next(w for w in spec.workloads if w.label == label)


def test_static_dim_follows_a_param_axis(manifest):
    spec = manifest.op("CumsumFwdOp")
    mid = workload(spec, "mid-dim")  # x: [64, 4096, 64], dim=1
    params = param_values(spec, mid)
    assert params == {"dim": 1, "out_dtype": None}
    assert static_dim_values(spec, mid, params) == {"N": 4096}
    assert constructor_kwargs(spec, mid, torch.bfloat16) == {"N": 4096, "dtype": torch.bfloat16, "dim": 1,
                                                             "out_dtype": None}


def test_defaults_fill_params_the_workload_leaves_out(manifest):
    spec = manifest.op("RMSNormFwdOp")
    wide = workload(spec, "wide-32k")
    assert constructor_kwargs(spec, wide, torch.float16) == {"N": 32768, "dtype": torch.float16, "eps": 1e-6}
    assert input_shapes(spec, wide) == [(8192, 32768), (32768,)]


def test_same_as_inputs_take_the_workload_dtype(manifest):
    spec = manifest.op("RMSNormFwdOp")
    assert input_dtype_names(spec, "float16") == {"x": "float16", "weight": "float16"}


def test_random_inputs_have_the_workload_shapes_and_no_zeros(manifest):
    spec = manifest.op("RMSNormFwdOp")
    decode = workload(spec, "decode-1x4k")
    x, weight = build_inputs(Case(spec, decode, "bfloat16"), "cpu", torch.Generator().manual_seed(1))
    assert x.shape == (1, 4096) and weight.shape == (4096,)
    assert x.dtype == weight.dtype == torch.bfloat16
    assert bool((x != 0).any()) and bool((weight != 0).any())
    assert float(x.float().std()) > 0.5  # normal data, not a constant


def test_a_custom_input_factory_is_honoured(manifest):
    spec = manifest.op("CumsumFwdOp")
    seen = {}

    def make_inputs(*, shapes, dtype, device, params):
        seen.update(shapes=shapes, dtype=dtype, device=device, params=params)
        return [torch.full(shapes["x"], 2.0, dtype=dtype)]

    entry = BenchEntry("CumsumFwdOp", "bench_entry", make_inputs)
    (x,) = build_inputs(Case(spec, workload(spec, "mid-dim"), "float32", entry), "cpu")
    assert seen == {"shapes": {"x": (64, 4096, 64)}, "dtype": torch.float32, "device": "cpu",
                    "params": {"dim": 1, "out_dtype": None}}
    assert bool((x == 2.0).all())


def test_a_factory_returning_the_wrong_count_is_an_error(manifest):
    spec = manifest.op("RMSNormFwdOp")
    entry = BenchEntry("RMSNormFwdOp", "bench_entry", lambda **_: [torch.ones(1)])
    with pytest.raises(ValueError, match="returned 1 tensors"):
        build_inputs(Case(spec, workload(spec, "decode-1x4k"), "float32", entry), "cpu")


def test_select_cases_expands_workloads_and_dtypes(manifest):
    labels = [c.label for c in select_cases(manifest, {}, ops=["RMSNormFwdOp"])]
    assert labels[:3] == ["RMSNormFwdOp/llama-4k/bfloat16", "RMSNormFwdOp/llama-4k/float16",
                          "RMSNormFwdOp/wide-32k/bfloat16"]
    assert len(labels) == sum(len(w.dtypes) for w in manifest.op("RMSNormFwdOp").workloads)


def test_select_cases_filters_accept_commas(manifest):
    cases = select_cases(manifest, {}, ops=["CumsumFwdOp,RMSNormFwdOp"], workloads=["mid-dim", "decode-1x4k"],
                         dtypes=["bfloat16"])
    assert [c.label for c in cases] == ["RMSNormFwdOp/decode-1x4k/bfloat16", "CumsumFwdOp/mid-dim/bfloat16"]


def test_select_cases_rejects_unknown_ops(manifest):
    with pytest.raises(ValueError, match="no op named 'NopeFwdOp'"):
        select_cases(manifest, {}, ops=["NopeFwdOp"])


def test_entries_are_found_by_op_name(tmp_path, monkeypatch):
    package = tmp_path / "fake_bench_entries"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "foo_fwd.py").write_text('OP = "FooFwdOp"\nmake_inputs = None\n')
    (package / "bar_fwd.py").write_text(textwrap.dedent("""
        OP = "BarFwdOp"
        def make_inputs(*, shapes, dtype, device, params):
            return []
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = load_entries("fake_bench_entries")
    assert entries["FooFwdOp"].make_inputs is None
    assert callable(entries["BarFwdOp"].make_inputs)
    assert entries["BarFwdOp"].module == "fake_bench_entries.bar_fwd"
    for name in [m for m in sys.modules if m.startswith("fake_bench_entries")]:
        del sys.modules[name]


def test_the_committed_entries_name_manifest_ops(manifest):
    names = {op.name for op in manifest.ops}
    for op in load_entries():
        assert op in names
