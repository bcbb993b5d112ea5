"""Kernel build: a real kernel compiles for sm_90 without a GPU; a broken one is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.loader import load_manifest
from validator.testing import run_validator, scratch_project

OP = "RMSNormFwdOp"
BROKEN_PROGRAM = '''


def _program_that_does_not_compile(self, *names, **config):
    import tilelang.language as T

    @T.prim_func
    def broken(A: T.Tensor((4,), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            T.copy(A[0:8], B[0:4, 0:2])

    return broken


# Every program of the kernel: ``program`` of a one-program kernel, ``build_program`` of a
# kernel of named programs.
{kernel}.program = _program_that_does_not_compile
{kernel}.build_program = _program_that_does_not_compile
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = scratch_project(tmp_path / "project")
    if load_manifest(root / "manifest", root).op(OP).status != "implemented":
        pytest.skip(f"{OP} is not implemented in this tree")
    return root


def test_a_real_kernel_builds_for_sm90(project: Path) -> None:
    kernels = load_manifest(project / "manifest", project).op(OP).kernels
    run = run_validator(project, "--levels", "kernel", "--op", OP)
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert run.findings == []
    builds = [name for name in run.report["levels"][0]["timings"] if name.startswith(f"{OP}.")]
    assert [name.split(" (")[0] for name in builds] == [f"{OP}.{k.key}" for k in kernels]


def test_a_kernel_that_does_not_compile(project: Path) -> None:
    kernel = load_manifest(project / "manifest", project).op(OP).kernels[0]
    with (project / kernel.path).open("a") as handle:
        handle.write(BROKEN_PROGRAM.format(kernel=kernel.class_name))
    run = run_validator(project, "--levels", "kernel", "--op", OP)
    rule = f"kernel_map.{kernel.key}"
    assert run.error_keys() == {("kernel", OP, rule)}
    assert "does not build for sm_90" in run.message("kernel", OP, rule)
    assert run.returncode == 1


def test_kernels_built_side_by_side_report_in_manifest_order(project: Path) -> None:
    # With two kernels or more the builds run in spawned processes (one a core): a broken one is
    # still its own finding, the other still builds, and the timings keep the manifest's order.
    other = "CumsumFwdOp"
    manifest = load_manifest(project / "manifest", project)
    kernel = manifest.op(OP).kernels[0]
    with (project / kernel.path).open("a") as handle:
        handle.write(BROKEN_PROGRAM.format(kernel=kernel.class_name))
    run = run_validator(project, "--levels", "kernel", "--op", OP, "--op", other)
    assert run.error_keys() == {("kernel", OP, f"kernel_map.{kernel.key}")}
    builds = [name.split(" (")[0] for name in run.report["levels"][0]["timings"] if "." in name.split(" (")[0]]
    expected = [f"{op.name}.{ref.key}" for op in manifest.ops if op.name in (OP, other) for ref in op.kernels]
    assert builds == expected
    assert run.returncode == 1


def test_build_jobs_follow_the_cores_or_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from validator.kernels import build_jobs

    monkeypatch.delenv("TILEOPS_BUILD_JOBS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert (build_jobs(38), build_jobs(4), build_jobs(1)) == (6, 4, 1)
    monkeypatch.setenv("TILEOPS_BUILD_JOBS", "3")
    assert build_jobs(38) == 3
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("TILEOPS_BUILD_JOBS", bad)
        with pytest.raises(ValueError, match="TILEOPS_BUILD_JOBS"):
            build_jobs(38)
