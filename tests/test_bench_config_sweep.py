"""The config sweep: every config checked, the right ones timed in turns with torch.compile.

A fake op with one fake kernel stands in for a generated op; its output depends on the
kernel's config, so a config can be made wrong.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from bench_fakes import FakeBackend, KernelRMSNorm, fake_resolver, identity_compiler, make_class
from benchmarks.config_sweep import (
    SweepRecipe, compile_config, compile_configs, parse_shape, render, reshaped_case, sweep_configs,
)
from benchmarks.runner import RunContext
from benchmarks.workloads import Case
from codegen.loader import load_manifest


def decode_case():
    spec = load_manifest().op("RMSNormFwdOp")
    return Case(spec, next(w for w in spec.workloads if w.label == "decode-1x4k"), "float32")


def sweep(backend, rounds=1, case=None, op_class=None, **kwargs):
    manifest = load_manifest()
    op_class = op_class or make_class(KernelRMSNorm, shapes=[])
    ctx = RunContext(manifest, backend, "cpu", compiler=identity_compiler, resolve=fake_resolver(RMSNormFwdOp=op_class),
                     generator=torch.Generator().manual_seed(0), rounds=rounds)
    return sweep_configs(case or decode_case(), ctx, **kwargs)


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


def test_a_shape_off_the_manifest_is_swept_with_the_op_built_for_it():
    case = reshaped_case(decode_case(), {"x": (3, 2048), "weight": (2048,)}, {})
    assert case.workload.label == "decode-1x4k with x=3x2048 weight=2048"
    assert dict(case.workload.shapes) == {"x": (3, 2048), "weight": (2048,)}
    op_class = make_class(KernelRMSNorm, shapes=[])
    results = sweep(FakeBackend(), case=case, op_class=op_class, partial=[{"threads": 128}])
    assert [r.outcome.status for r in results] == ["ok", "ok", "ok"]
    # Every call, checked or timed, had the new x, on an op built for rows of 2048.
    assert op_class.shapes and set(op_class.shapes) == {((3, 2048), 2048)}


def test_reshaping_keeps_the_other_tensors_and_merges_params():
    case = reshaped_case(decode_case(), {"x": (5, 4096)}, {"eps": 1e-5})
    assert dict(case.workload.shapes) == {"x": (5, 4096), "weight": (4096,)}
    assert dict(case.workload.params)["eps"] == 1e-5
    assert "x=5x4096" in case.label and 'eps=1e-05' in case.label
    assert reshaped_case(decode_case(), {}, {}) == decode_case()


def test_reshaping_an_unknown_tensor_names_the_workload_tensors():
    with pytest.raises(ValueError, match=r"no tensor \['y'\].*\['x', 'weight'\]"):
        reshaped_case(decode_case(), {"y": (3,)}, {})


@pytest.mark.parametrize("text, expected", [("x=8192x32768", ("x", (8192, 32768))), ("weight=4096", ("weight", (4096,))),
                                            ("x=", ("x", ())), ("grad_y=0x7", ("grad_y", (0, 7)))])
def test_parse_shape(text, expected):
    assert parse_shape(text) == expected


@pytest.mark.parametrize("text", ["x", "=4", "x=4xb", "x=4x-1", "x=4,5"])
def test_parse_shape_refuses_what_is_not_name_and_dims(text):
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=D0xD1"):
        parse_shape(text)


def test_every_config_but_the_current_one_is_compiled_ahead_before_any_is_checked():
    op_class = make_class(KernelRMSNorm, shapes=[])
    ahead = []
    results = sweep(FakeBackend(), op_class=op_class, candidates=True,
                    compile_ahead=lambda configs: ahead.append((configs, list(op_class.kernel.seen))))
    (configs, seen_then), = ahead
    assert configs == [{"threads": 128, "scale": 1.0}, {"threads": 64, "scale": 2.0}]
    assert seen_then == [{"threads": 256, "scale": 1.0}]  # only the call that built the kernel
    assert [r.config for r in results[:-1]] == [{"threads": 256, "scale": 1.0}] + configs


def test_a_config_whose_case_cannot_be_set_up_is_a_note_not_an_exception():
    recipe = SweepRecipe("RMSNormFwdOp", "no-such-workload", "bfloat16")
    seconds, note = compile_config({"per_thread": 64}, recipe, "cpu")
    assert "selects 0 cases" in note and seconds >= 0
    # In worker processes, the failures come back with their configs.
    assert compile_configs([{"per_thread": 64}], recipe, jobs=1, device_name="cpu") == [({"per_thread": 64}, note)]
    assert compile_configs([{"per_thread": 64}], recipe, jobs=0) == []


def test_a_recipe_sets_the_reshaped_case_up_again():
    recipe = SweepRecipe("RMSNormFwdOp", "wide-32k", "bfloat16", (("x", (16384, 16384)), ("weight", (16384,))))
    _, case = recipe.case()
    assert dict(case.workload.shapes)["x"] == (16384, 16384) and "x=16384x16384" in case.workload.label
