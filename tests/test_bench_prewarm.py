"""The compile pre-pass of ``make bench``: every case set up and called once, failures kept."""

import dataclasses

import pytest

from benchmarks.prewarm import case_key, default_jobs, find_case, prewarm, warm_case


def key_of(op: str, label: str, dtype: str):
    return case_key(find_case((op, label, dtype))[1])


def test_a_case_is_set_up_and_every_variant_called():
    seconds, note = warm_case(key_of("RMSNormFwdOp", "llama-4k", "bfloat16"), False, "cpu")
    assert note == "" and seconds >= 0


def test_a_backward_case_warms_through_its_forward():
    _, note = warm_case(key_of("SoftmaxBwdOp", "decode-1x4k", "bfloat16"), False, "cpu")
    assert note == ""


def test_a_case_that_cannot_be_set_up_is_a_note_not_an_exception():
    op, dtype, workload = key_of("RMSNormFwdOp", "decode-1x4k", "bfloat16")
    _, note = warm_case(("NoSuchOp", dtype, workload), False, "cpu")
    assert "no op named 'NoSuchOp'" in note
    broken = dataclasses.replace(workload, shapes=(("x", (3, 4096)), ("weight", (5,))))
    _, note = warm_case((op, dtype, broken), False, "cpu")
    assert "weight" in note


def test_an_unknown_manifest_case_is_refused_by_name():
    with pytest.raises(LookupError, match="RMSNormFwdOp/no-such-workload/bfloat16 selects 0 cases"):
        find_case(("RMSNormFwdOp", "no-such-workload", "bfloat16"))


def test_worker_processes_report_failures_per_case():
    from codegen.loader import load_manifest

    from benchmarks.workloads import load_entries, select_cases

    cases = select_cases(load_manifest(), load_entries(), ["SoftmaxFwdOp"], ["decode-1x4k"], ["bfloat16"])
    assert len(cases) == 1
    assert prewarm(cases, jobs=1, with_compile=False, device_name="cpu") == []
    assert prewarm(cases, jobs=0) == []


def test_default_jobs_leaves_cores_for_the_compilers():
    assert default_jobs(16) == 8
    assert default_jobs(64) == 8
    assert default_jobs(2) == 1
    assert default_jobs(1) == 1
