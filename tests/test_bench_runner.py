"""Checking before timing: right outputs are timed, wrong ones reported and never timed.

Fake CPU ops stand in for the generated ones and a scripted backend for the GPU timer.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap

import pytest
import torch

from bench_fakes import FakeBackend, FakeRMSNorm, fake_resolver, identity_compiler, make_class
from benchmarks.checking import judge, relative_error
from benchmarks.runner import RunContext, run_case
from benchmarks.variants import gradient_of, plan_autograd
from benchmarks.workloads import Case
from codegen.loader import SCHEMA_COMMENT, load_files, load_manifest


@pytest.fixture(scope="module")
def manifest():
    return load_manifest()


def decode_case(manifest, dtype="float32"):
    spec = manifest.op("RMSNormFwdOp")
    return Case(spec, next(w for w in spec.workloads if w.label == "decode-1x4k"), dtype)


def context(manifest, backend, **classes):
    return RunContext(manifest, backend, "cpu", compiler=identity_compiler, resolve=fake_resolver(**classes),
                      generator=torch.Generator().manual_seed(0))


def test_a_right_op_is_checked_then_timed(manifest):
    op = make_class(FakeRMSNorm)
    backend = FakeBackend(times=[5.0, 20.0, 10.0])
    result = run_case(decode_case(manifest), context(manifest, backend, RMSNormFwdOp=op))
    assert [o.variant for o in result.outcomes] == ["tileops", "eager", "compile"]
    assert [o.status for o in result.outcomes] == ["ok", "ok", "ok"]
    assert [o.median_us for o in result.outcomes] == [5.0, 20.0, 10.0]
    assert [o.loop_us for o in result.outcomes] == [10.0, 40.0, 20.0]
    assert result.outcome("tileops").peak_bytes == 3 << 20
    assert result.outcome("tileops").error < 1e-6
    assert (result.flops, result.bytes) == (4 * 4096, (2 * 4096 + 4096) * 4)


def test_rounds_take_turns_and_report_the_median(manifest):
    op = make_class(FakeRMSNorm)
    backend = FakeBackend(times=[5.0, 20.0, 10.0, 9.0, 22.0, 12.0, 6.0, 21.0, 11.0])
    ctx = dataclasses.replace(context(manifest, backend, RMSNormFwdOp=op), rounds=3)
    result = run_case(decode_case(manifest), ctx)
    assert [o.median_us for o in result.outcomes] == [6.0, 21.0, 11.0]
    # Each round times every variant once, in the same order: the i-th and (i+3)-th timings are one variant.
    assert len(backend.timed) == 9
    assert all(backend.timed[i] is backend.timed[i + 3] for i in range(6))
    assert len({id(calls) for calls in backend.timed[:3]}) == 3
    assert backend.probed == 3 and backend.looped == 3  # peak memory and the host loop once each
    assert "median of 3 rounds, 5.000-9.000 us" in result.outcome("tileops").note


def test_a_wrong_op_is_reported_and_never_timed(manifest):
    op = make_class(FakeRMSNorm, offset=0.5)
    backend = FakeBackend()
    result = run_case(decode_case(manifest), context(manifest, backend, RMSNormFwdOp=op))
    ours = result.outcome("tileops")
    assert ours.status == "wrong"
    assert ours.median_us is None and ours.peak_bytes is None
    assert ours.error > 1e-2 and "over limit" in ours.note
    assert op.calls == 1  # the checking call, nothing after it
    assert len(backend.timed) == 2 and backend.looped == 2  # only eager and compile were timed
    assert result.outcome("eager").status == "ok"


def test_a_nan_output_is_wrong(manifest):
    op = make_class(FakeRMSNorm, offset=math.nan)
    result = run_case(decode_case(manifest, "bfloat16"), context(manifest, FakeBackend(), RMSNormFwdOp=op))
    assert result.outcome("tileops").status == "wrong"
    assert result.outcome("tileops").error == math.inf


def test_a_raising_op_is_an_error_row_and_baselines_still_run(manifest):
    op = make_class(FakeRMSNorm, fail=True)
    backend = FakeBackend()
    result = run_case(decode_case(manifest), context(manifest, backend, RMSNormFwdOp=op))
    assert result.outcome("tileops").status == "error"
    assert "kernel launch failed" in result.outcome("tileops").note
    assert result.outcome("compile").status == "ok"


def test_an_op_that_cannot_be_built_is_one_error_row(manifest):
    def missing(spec):
        raise ImportError("tileops.ops.norm has no RMSNormFwdOp")

    ctx = RunContext(manifest, FakeBackend(), "cpu", resolve=missing)
    result = run_case(decode_case(manifest), ctx)
    assert [(o.variant, o.status) for o in result.outcomes] == [("tileops", "error")]
    assert "setup" in result.outcomes[0].note


def test_small_inputs_are_rotated(manifest):
    backend = FakeBackend(l2_bytes=1 << 20)
    run_case(decode_case(manifest), context(manifest, backend, RMSNormFwdOp=make_class(FakeRMSNorm)))
    # x and weight are 32 KiB in float32: 64 sets (capped) overflow a 1 MiB L2.
    assert len(backend.timed[0]) == 64


def test_no_compile_variant_without_a_compiler(manifest):
    ctx = context(manifest, FakeBackend(), RMSNormFwdOp=make_class(FakeRMSNorm))
    ctx.compiler = None
    result = run_case(decode_case(manifest), ctx)
    assert [o.variant for o in result.outcomes] == ["tileops", "eager"]


# ---- checking --------------------------------------------------------------------------------
def test_relative_error_flags_shape_and_nonfinite():
    ref = torch.ones(4, dtype=torch.float64)
    assert relative_error(torch.ones(5), ref) == math.inf
    assert relative_error(torch.tensor([1.0, math.inf, 1.0, 1.0]), ref) == math.inf
    assert relative_error(ref * 1.01, ref) == pytest.approx(0.01)


def test_judge_accepts_what_the_reference_itself_misses():
    ref = torch.ones(4, dtype=torch.float64)
    out = ref * (1 + 3e-5)
    assert not judge(out, ref, "float32").ok
    assert judge(out, ref, "float32", reference_error=2e-5).ok  # torch is as far off


def test_judge_checks_output_dtype_and_count():
    ref = torch.ones(4, dtype=torch.float64)
    assert not judge(torch.ones(4), ref, "bfloat16", expected_dtypes=[torch.bfloat16]).ok
    assert not judge((torch.ones(4), torch.ones(4)), ref, "float32").ok


# ---- Bwd ops ---------------------------------------------------------------------------------
SCALE_MANIFEST = f"""{SCHEMA_COMMENT}
ScaleFwdOp:
  family: scale
  status: implemented
  summary: "y = x * weight"
  signature:
    inputs:
      x: {{dtype: "float16 | bfloat16 | float32"}}
      weight: {{dtype: "same_as(x)", shape: [N]}}
    outputs:
      y: {{dtype: "same_as(x)"}}
  static_dims:
    N: "x.shape[-1]"
  shape_rules: ["y.shape == x.shape"]
  reference: "x * weight"
  roofline: {{flops: "numel(x)", bytes: "2 * numel(x) * elem_bytes"}}
  kernel_map: {{scale_fwd: ScaleFwdKernel}}
  backward: {{op: ScaleBwdOp, saves: [x, weight]}}
  workloads:
    - {{label: small, shapes: {{x: [8, 16], weight: [16]}}, dtypes: [float32]}}
ScaleBwdOp:
  family: scale
  status: implemented
  summary: "grad_x = grad_y * weight, grad_weight = sum(grad_y * x)"
  signature:
    inputs:
      grad_y: {{dtype: "float16 | bfloat16 | float32"}}
      x: {{dtype: "same_as(grad_y)"}}
      weight: {{dtype: "same_as(grad_y)", shape: [N]}}
    outputs:
      grad_x: {{dtype: "same_as(grad_y)"}}
      grad_weight: {{dtype: "same_as(grad_y)"}}
  static_dims:
    N: "x.shape[-1]"
  shape_rules: ["grad_x.shape == x.shape", "grad_weight.shape == weight.shape"]
  reference: "(grad_y * weight, (grad_y * x).reshape(-1, N).sum(0))"
  roofline: {{flops: "2 * numel(x)", bytes: "4 * numel(x) * elem_bytes"}}
  kernel_map: {{scale_bwd: ScaleBwdKernel}}
  workloads:
    - {{label: small, shapes: {{grad_y: [8, 16], x: [8, 16], weight: [16]}}, dtypes: [float32]}}
ExpFwdOp:
  family: scale
  status: implemented
  summary: "y = exp(x)"
  signature:
    inputs:
      x: {{dtype: "float16 | bfloat16 | float32"}}
    outputs:
      y: {{dtype: "same_as(x)"}}
  shape_rules: ["y.shape == x.shape"]
  reference: "torch.exp(x)"
  roofline: {{flops: "numel(x)", bytes: "2 * numel(x) * elem_bytes"}}
  kernel_map: {{exp_fwd: ExpFwdKernel}}
  backward: {{op: ExpBwdOp, saves: [y]}}
  workloads:
    - {{label: rows, shapes: {{x: [4, 32]}}, dtypes: [float32]}}
ExpBwdOp:
  family: scale
  status: implemented
  summary: "grad_x = grad_y * y"
  signature:
    inputs:
      grad_y: {{dtype: "float16 | bfloat16 | float32"}}
      y: {{dtype: "same_as(grad_y)"}}
    outputs:
      grad_x: {{dtype: "same_as(grad_y)"}}
  shape_rules: ["grad_x.shape == y.shape"]
  reference: "grad_y * y"
  roofline: {{flops: "numel(y)", bytes: "3 * numel(y) * elem_bytes"}}
  kernel_map: {{exp_bwd: ExpBwdKernel}}
  workloads:
    - {{label: rows, shapes: {{grad_y: [4, 32], y: [4, 32]}}, dtypes: [float32]}}
"""


class FakeScaleFwd:
    def __init__(self, *, N, dtype):
        self.N, self.dtype = N, dtype

    def reference(self, x, weight):
        return x * weight


class FakeScaleBwd:
    swap = False
    calls = 0

    def __init__(self, *, N, dtype):
        self.N, self.dtype = N, dtype

    def __call__(self, grad_y, x, weight):
        type(self).calls += 1
        grad_x, grad_weight = self.reference(grad_y, x, weight)
        return (grad_x, grad_weight * 2) if self.swap else (grad_x, grad_weight)

    def reference(self, grad_y, x, weight):
        return grad_y * weight, (grad_y * x).reshape(-1, self.N).sum(0)

    def eval_roofline(self, grad_y_shape, x_shape, weight_shape):
        return 2 * 8 * 16, 4 * 8 * 16 * 4


@pytest.fixture
def scale_manifest(tmp_path):
    path = tmp_path / "scale.yaml"
    path.write_text(textwrap.dedent(SCALE_MANIFEST))
    return load_files([path], tmp_path)


def test_gradient_names_are_matched():
    assert gradient_of("grad_y", ("y",)) == "y"
    assert gradient_of("grad_weight", ("x", "weight")) == "weight"
    assert gradient_of("grad_z", ("y",)) is None
    assert gradient_of("y", ("y",)) is None


def test_a_bwd_op_maps_onto_autograd_of_its_fwd_reference(scale_manifest):
    plan, why = plan_autograd(scale_manifest, scale_manifest.op("ScaleBwdOp"))
    assert why == ""
    assert plan.fwd_inputs == (("x", "x"), ("weight", "weight"))
    assert plan.grad_outputs == (("y", "grad_y"),)
    assert plan.wrt == (("grad_x", "x"), ("grad_weight", "weight"))


def test_a_bwd_op_is_timed_against_autograd(scale_manifest):
    bwd = make_class(FakeScaleBwd)
    spec = scale_manifest.op("ScaleBwdOp")
    backend = FakeBackend(times=[1.0, 4.0, 2.0])
    ctx = context(scale_manifest, backend, ScaleFwdOp=FakeScaleFwd, ScaleBwdOp=bwd)
    result = run_case(Case(spec, spec.workloads[0], "float32"), ctx)
    assert [(o.variant, o.status) for o in result.outcomes] == [("tileops", "ok"), ("eager", "ok"), ("compile", "ok")]
    assert "autograd of ScaleFwdOp.reference" in result.outcome("eager").note
    # The autograd baseline replays its backward: grads of x and weight, in Bwd output order.
    grads = backend.timed[1][0]()
    assert [tuple(g.shape) for g in grads] == [(8, 16), (16,)]


def test_a_wrong_bwd_op_is_not_timed(scale_manifest):
    bwd = make_class(FakeScaleBwd, swap=True)
    spec = scale_manifest.op("ScaleBwdOp")
    backend = FakeBackend()
    ctx = context(scale_manifest, backend, ScaleFwdOp=FakeScaleFwd, ScaleBwdOp=bwd)
    result = run_case(Case(spec, spec.workloads[0], "float32"), ctx)
    assert result.outcome("tileops").status == "wrong"
    assert bwd.calls == 1
    assert len(backend.timed) == 2


class FakeExpFwd:
    def __init__(self, *, dtype):
        self.dtype = dtype

    def reference(self, x):
        return torch.exp(x)


class FakeExpBwd:
    def __init__(self, *, dtype):
        self.dtype = dtype

    def __call__(self, grad_y, y):
        return self.reference(grad_y, y)

    def reference(self, grad_y, y):
        return grad_y * y

    def eval_roofline(self, grad_y_shape, y_shape):
        return 128, 3 * 128 * 4


def test_a_bwd_op_on_saved_outputs_gets_them_from_the_fwd_reference(scale_manifest):
    spec = scale_manifest.op("ExpBwdOp")
    plan, _ = plan_autograd(scale_manifest, spec)
    assert plan.saved_outputs == (("y", "y"),) and plan.grad_outputs == (("y", "grad_y"),)
    assert not plan.carries_forward_inputs
    backend = FakeBackend(times=[1.0, 3.0, 2.0])
    ctx = context(scale_manifest, backend, ExpFwdOp=FakeExpFwd, ExpBwdOp=FakeExpBwd)
    result = run_case(Case(spec, spec.workloads[0], "float32"), ctx)
    assert [(o.variant, o.status) for o in result.outcomes] == [("tileops", "ok"), ("eager", "ok"), ("compile", "ok")]
    # Autograd through exp(x) on the same input set gives our op's result: y was exp(x).
    grad_y, y = backend.timed[0][0].args
    (grad_x,) = backend.timed[1][0]()
    assert torch.allclose(grad_x, grad_y * y)


def test_backward_inputs_are_consistent_with_the_forward(scale_manifest):
    from benchmarks.variants import backward_inputs

    spec = scale_manifest.op("ExpBwdOp")
    plan, _ = plan_autograd(scale_manifest, spec)
    made = backward_inputs(plan, FakeExpFwd(dtype=torch.float32), spec.workloads[0], "float32", "cpu")
    (x,) = made.forward_args
    grad_y, y = made.args
    assert torch.equal(y, torch.exp(x)) and grad_y.shape == y.shape and not torch.equal(grad_y, y)


def test_an_absent_gradient_input_is_no_root_of_the_autograd_baseline(manifest):
    # CrossEntropyBwdOp's entry passes grad_lse=None, as training does: autograd of the
    # forward's (loss, lse) then differentiates the loss alone.
    from benchmarks.workloads import load_entries

    spec = manifest.op("CrossEntropyBwdOp")
    case = Case(spec, next(w for w in spec.workloads if w.label == "tiny-3"), "float32",
                load_entries()["CrossEntropyBwdOp"])
    ctx = RunContext(manifest, FakeBackend(), "cpu", compiler=identity_compiler,
                     generator=torch.Generator().manual_seed(0))
    result = run_case(case, ctx)
    assert [(o.variant, o.status) for o in result.outcomes] == [("tileops", "ok"), ("eager", "ok"), ("compile", "ok")]


def test_a_reshaped_bwd_case_missing_a_fwd_input_it_returns_the_gradient_of_takes_its_own_reference(manifest):
    # A sweep's reshaped LayerNorm backward matches no LayerNormFwdOp workload by label, and the
    # backward takes no bias, whose gradient it returns: autograd of the forward cannot stand in,
    # so its own reference is the baseline (it computes the same three gradients).
    from benchmarks.config_sweep import reshaped_case
    from benchmarks.runner import variants_and_inputs

    spec = manifest.op("LayerNormBwdOp")
    case = reshaped_case(Case(spec, next(w for w in spec.workloads if w.label == "decode-1x4k"), "bfloat16"),
                         {"grad_y": (3, 64), "x": (3, 64), "weight": (64,)}, {})
    plan, _ = plan_autograd(manifest, spec)
    with pytest.raises(ValueError, match=r"LayerNormBwdOp returns the gradient of its \['bias'\]"):
        plan.forward_workload(case.workload)

    class Reference:
        def reference(self, *args):
            return args

    ctx = RunContext(manifest, FakeBackend(), "cpu", compiler=identity_compiler)
    variants, _, note = variants_and_inputs(case, Reference(), ctx)
    assert [v.name for v in variants] == ["tileops", "eager", "compile"]
    assert note.startswith("baseline: LayerNormBwdOp.reference (") and "'bias'" in note
    # RMSNorm's backward returns gradients of inputs it takes only: the reshaped case keeps autograd.
    rms = manifest.op("RMSNormBwdOp")
    rms_case = reshaped_case(Case(rms, next(w for w in rms.workloads if w.label == "decode-1x4k"), "bfloat16"),
                             {"grad_y": (3, 64), "x": (3, 64), "weight": (64,)}, {})
    rms_plan, _ = plan_autograd(manifest, rms)
    assert dict(rms_plan.forward_workload(rms_case.workload).shapes) == {"x": (3, 64), "weight": (64,)}
