"""The shared command of the GPU warm-up scripts: every task compiled, failures counted."""

from tests.gpu.warmup import compile_in_parallel


def test_every_task_runs_in_worker_processes_and_a_failure_sets_the_status():
    # ``int`` stands in for a compile step: "x" fails in its worker, the others succeed.
    assert compile_in_parallel("demo", lambda: ["1", "2"], int, ["--workers", "2"]) == 0
    assert compile_in_parallel("demo", lambda: ["1", "x"], int, ["--workers", "2"]) == 1


def test_list_compiles_nothing():
    assert compile_in_parallel("demo", lambda: ["x"], int, ["--list"]) == 0
