"""The shared command of the GPU warm-up scripts: every task compiled, failures counted."""

import pytest
import torch

from tests.gpu import warmup
from tests.gpu.warmup import compile_in_parallel
from tests.toolchain import needs_nvcc


def test_every_task_runs_in_worker_processes_and_a_failure_sets_the_status():
    # ``int`` stands in for a compile step: "x" fails in its worker, the others succeed.
    assert compile_in_parallel("demo", lambda: ["1", "2"], int, ["--workers", "2"]) == 0
    assert compile_in_parallel("demo", lambda: ["1", "x"], int, ["--workers", "2"]) == 1


def test_list_compiles_nothing():
    assert compile_in_parallel("demo", lambda: ["x"], int, ["--list"]) == 0


def test_the_combined_warmup_covers_every_family_script():
    import importlib
    from pathlib import Path

    from tests.gpu import warmup

    scripts = sorted(path.stem[: -len("_warmup")] for path in Path(warmup.__file__).parent.glob("*_warmup.py"))
    assert sorted(warmup.FAMILIES) == scripts
    for family in warmup.FAMILIES:
        module = importlib.import_module(f"tests.gpu.{family}_warmup")
        assert callable(module.inventory) and callable(module.compile_one), family


@pytest.mark.parametrize("family", warmup.FAMILIES)
def test_every_family_lists_its_programs(family: str) -> None:
    """Each inventory is built on the CPU from the GPU tests' own cases, so a case the tests
    gain (a 0-d input, say) must not break the listing that ``make test-gpu`` starts with."""
    import importlib

    tasks = importlib.import_module(f"tests.gpu.{family}_warmup").inventory()
    assert len(tasks) > 0 and len(set(map(repr, tasks))) == len(tasks)


def test_a_combined_task_is_compiled_by_its_family(monkeypatch):
    from tests.gpu import reduction_warmup, warmup

    seen = []
    monkeypatch.setattr(reduction_warmup, "compile_one", lambda task: seen.append(task) or "done")
    assert warmup.compile_family_task(("reduction", ("task",))) == "done"
    assert seen == [("task",)]


@needs_nvcc
def test_the_loss_warmup_covers_every_cross_entropy_config_and_its_tasks_compile():
    from tests.gpu import loss_warmup, test_cross_entropy as t
    from tileops.kernels.kernel_base import SM90_BUILD_TARGET

    tasks = loss_warmup.inventory()
    soft = {task for task in tasks if task[0].__name__.startswith("Soft")}
    index_configs = {(V, dtype, keywords) for _, V, dtype, keywords, _ in set(tasks) - soft}
    soft_configs = {(V, dtype, keywords) for _, V, dtype, keywords, _ in soft}
    assert len(index_configs) == len(t.CONFIGS)
    assert len(soft_configs) == len({(c[0], c[1], c[2], c[4]) for c in t.SOFT_CONFIGS + t.SOFT_CONFIGS_OF_OTHER_TESTS})
    # Every program of a soft backward: three reductions, with and without grad_lse, weighted or not.
    assert sum(1 for task in soft if task[0].__name__ == "SoftCrossEntropyBwdKernel" and task[1] == 3) == 12
    # The index-target forward's programs: main, the two totals and the two one-block ones.
    assert sum(1 for task in tasks if task[0].__name__ == "CrossEntropyFwdKernel" and task[1] == 3) == 5
    for task in (tasks[0], next(iter(soft))):
        assert loss_warmup.compile_for(task, SM90_BUILD_TARGET).startswith(task[0].__name__)


def test_a_task_names_an_output_dtype_given_at_construction() -> None:
    """A kernel built with ``out_dtype`` is compiled as such; an index output of a kernel class
    (argmax's int64) is the class's own and not named."""
    from tests.gpu.warmup import dtypes_field, kernel_dtypes
    from tileops.kernels.reduction.reduce import ArgmaxKernel
    from tileops.kernels.scan.cumsum import CumsumFwdKernel

    widened = CumsumFwdKernel(4096, torch.bfloat16, out_dtype=torch.float32, config={})
    assert dtypes_field(widened) == "bfloat16->float32"
    assert kernel_dtypes("bfloat16->float32") == {"dtype": torch.bfloat16, "out_dtype": torch.float32}
    rebuilt = CumsumFwdKernel(4096, **kernel_dtypes(dtypes_field(widened)), config={})
    assert rebuilt.result_dtype == torch.float32 and rebuilt.static_signature() == widened.static_signature()
    assert dtypes_field(ArgmaxKernel(torch.bfloat16, config={})) == "bfloat16"
    assert kernel_dtypes("float16") == {"dtype": torch.float16, "out_dtype": None}
