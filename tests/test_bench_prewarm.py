"""The compile pre-pass of ``make bench``: every case set up and called once, failures kept."""

from benchmarks.prewarm import default_jobs, prewarm, warm_case


def test_a_case_is_set_up_and_every_variant_called():
    seconds, note = warm_case(("RMSNormFwdOp", "llama-4k", "bfloat16"), False, "cpu")
    assert note == "" and seconds >= 0


def test_a_backward_case_warms_through_its_forward():
    _, note = warm_case(("SoftmaxBwdOp", "decode-1x4k", "bfloat16"), False, "cpu")
    assert note == ""


def test_an_unknown_case_is_a_note_not_an_exception():
    _, note = warm_case(("RMSNormFwdOp", "no-such-workload", "bfloat16"), False, "cpu")
    assert "selects 0 cases" in note


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
