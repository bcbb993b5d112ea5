"""``python -m benchmarks.model_shapes``: the bench's cases over models' sizes."""

import math

import pytest
import torch

from benchmarks.model_shapes import MODEL_SHAPES, ModelShape, main, model_shape_cases
from benchmarks.prewarm import prewarm
from benchmarks.workloads import constructor_kwargs, input_shapes, load_entries, resolve_op_class
from codegen.loader import load_manifest


@pytest.fixture(scope="module")
def catalogue():
    return load_manifest(), load_entries()


def test_every_model_shape_builds_its_op_and_roofline(catalogue):
    cases = model_shape_cases(*catalogue)
    assert len(cases) == len(MODEL_SHAPES)
    assert len({case.label for case in cases}) == len(cases)
    for row, case in zip(MODEL_SHAPES, cases):
        shapes = dict(row.shapes)
        assert shapes.items() <= dict(case.workload.shapes).items()
        assert case.dtype == row.dtype and case.workload.dtypes == (row.dtype,)
        op = resolve_op_class(case.spec)(**constructor_kwargs(case.spec, case.workload, getattr(torch, row.dtype)))
        flops, moved = op.eval_roofline(*input_shapes(case.spec, case.workload))
        largest = max(math.prod(shape) for shape in shapes.values())
        # Every case reads its largest tensor at least once.
        assert moved >= largest * getattr(torch, row.dtype).itemsize, case.label


def test_the_label_names_the_model_and_its_largest_tensor(catalogue):
    labels = [case.label for case in model_shape_cases(*catalogue, ops=["CrossEntropyBwdOp"], labels=["gpt2"])]
    assert labels == ["CrossEntropyBwdOp/gpt2 8192x50257/bfloat16"]


def test_filters_narrow_by_op_label_and_dtype(catalogue):
    scans = model_shape_cases(*catalogue, ops=["CumsumFwdOp"])
    assert {case.dtype for case in scans} == {"float32"}
    assert model_shape_cases(*catalogue, ops=["CumsumFwdOp"], dtypes=["bfloat16"]) == []
    qwen = model_shape_cases(*catalogue, labels=["qwen2.5-7b"])
    assert {case.spec.name for case in qwen} >= {"RMSNormFwdOp", "SiluAndMulBwdOp"}


def test_an_op_or_label_the_table_lacks_is_refused_by_name(catalogue):
    with pytest.raises(ValueError, match=r"no model shape of op \['NoSuchOp'\]"):
        model_shape_cases(*catalogue, ops=["NoSuchOp"])
    with pytest.raises(ValueError, match=r"no model shape of label \['gpt3'\]"):
        model_shape_cases(*catalogue, labels=["gpt2,gpt3"])
    assert main(["--list", "--workloads", "gpt3"]) == 2


def test_a_template_the_manifest_lacks_is_refused_by_name(catalogue):
    table = [ModelShape("some-model", "RMSNormFwdOp", "no-such-workload", (("x", (3, 96)),))]
    with pytest.raises(ValueError, match="some-model: RMSNormFwdOp has no workload 'no-such-workload'"):
        model_shape_cases(*catalogue, table=table)


def test_a_reshaped_case_warms_in_a_worker_process(catalogue):
    table = [ModelShape("tiny", "RMSNormFwdOp", "llama-4k", (("x", (3, 96)), ("weight", (96,))))]
    assert prewarm(model_shape_cases(*catalogue, table=table), jobs=1, with_compile=False, device_name="cpu") == []


def test_list_prints_the_cases_without_a_gpu(capsys):
    assert main(["--list", "--ops", "ArgmaxFwdOp"]) == 0
    assert capsys.readouterr().out.split("\n")[:2] == ["ArgmaxFwdOp/gpt2 256x50257/bfloat16",
                                                      "ArgmaxFwdOp/qwen2.5 256x151936/bfloat16"]
