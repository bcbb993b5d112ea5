"""``Op.autotune`` and the ``tileops`` command line (CPU fakes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

from tileops import cli
from tileops.kernels.kernel_base import Kernel
from tileops.ops.op_base import Op
from tileops.tuning.cache import CacheDirectory, CacheEntry
from tileops.tuning.selector import ConfigSelector, using_selector
from tileops.tuning.tuner import Tuner
from tuning_fakes import FINGERPRINT, KERNEL_TIMES, FakeKernel, FakeTimer

TUNED = {"block": 128, "threads": 128}


class FakeOp(Op):
    """One kernel, built for the last axis of the first input."""

    def __init__(self, dtype: torch.dtype = torch.float32, *, scale: float = 1.0) -> None:
        super().__init__()
        self.dtype = dtype
        self.scale = scale
        self.dispatch_kernel()

    @property
    def default_kernel_map(self) -> Dict[str, type]:
        return {"fake": FakeKernel}

    def _build_kernel(self, key: str, *input_shapes: Any) -> Kernel:
        return self.kernel_map[key](input_shapes[0][-1], self.dtype)


@pytest.fixture(autouse=True)
def _default_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TILEOPS_AUTOTUNE", raising=False)


@pytest.fixture
def selector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TILEOPS_CACHE_DIR", str(tmp_path))
    chosen = ConfigSelector(tmp_path, tuner=Tuner(FakeTimer(KERNEL_TIMES)), fingerprint=FINGERPRINT)
    with using_selector(chosen):
        yield chosen


def test_op_autotune_builds_and_tunes_kernels_for_example_inputs(selector: ConfigSelector) -> None:
    op = FakeOp()
    assert op.autotune(torch.empty(4, 16)) == {"fake": TUNED}
    assert op.autotune((4, 16)) == {"fake": TUNED}  # shapes work too; served from memory
    kernel = next(iter(op._kernel_cache.values()))
    assert kernel.config == TUNED
    assert len(selector.persistent().entries()) == 1


def test_op_autotune_without_inputs_tunes_built_kernels(selector: ConfigSelector) -> None:
    op = FakeOp()
    with pytest.raises(ValueError, match="pass example inputs"):
        op.autotune()
    op._kernel("fake", (2, 8))
    op._kernel("fake", (2, 32))
    tuned = op.autotune()
    assert list(tuned.values()) == [TUNED, TUNED] and len(tuned) == 2
    assert all(label.startswith("fake[") for label in tuned)


# ---- command line ------------------------------------------------------------------------


def test_cache_show_and_clear(selector: ConfigSelector, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert cli.main(["cache", "show"]) == 0
    assert "(empty)" in capsys.readouterr().out
    FakeOp().autotune((4, 16))
    assert cli.main(["cache", "show"]) == 0
    out = capsys.readouterr().out
    assert "FakeKernel(N=16, dtype=float32) [rows=64]" in out and '"block": 128' in out
    assert "Fake GPU 80GB sm90" in out and "x2.00" in out  # heuristic 2 ms vs tuned 1 ms
    assert cli.main(["cache", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["files"]) == 1 and len(shown["files"][0]["entries"]) == 1
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1 cache file(s)" in capsys.readouterr().out
    assert CacheDirectory(tmp_path).files() == []


def test_cache_clear_current_leaves_other_devices(
    selector: ConfigSelector, capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tileops.tuning import fingerprint as fingerprint_module

    directory = CacheDirectory(tmp_path)
    directory.for_fingerprint(FINGERPRINT).put("k", CacheEntry({"block": 1}, "autotune"))
    here = fingerprint_module.device_fingerprint()
    directory.for_fingerprint(here).put("k", CacheEntry({"block": 2}, "autotune"))
    assert cli.main(["cache", "clear", "--current"]) == 0
    assert [p.stem for p in directory.files()] == [FINGERPRINT.id]


def test_tune_command_tunes_an_op_given_by_path(selector: ConfigSelector, capsys: pytest.CaptureFixture) -> None:
    argv = ["tune", f"{__name__}:FakeOp", "--shape", "8x16", "--dtype", "float32", "--arg", "scale=2.0"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "FakeOp: 1 kernel(s)" in out and '"block": 128' in out and "[autotune]" in out
    assert cli.main(argv) == 0
    assert "[memory]" in capsys.readouterr().out
    assert len(selector.persistent().entries()) == 1


def test_tune_command_reports_bad_requests(selector: ConfigSelector) -> None:
    with pytest.raises(SystemExit, match="workload 'big' is not available"):
        cli.main(["tune", f"{__name__}:FakeOp", "--workload", "big"])
    with pytest.raises(SystemExit, match="--shape"):
        cli.main(["tune", f"{__name__}:FakeOp"])
    with pytest.raises(SystemExit, match="not \\['bogus'\\]"):
        cli.main(["tune", f"{__name__}:FakeOp", "--shape", "8x16", "--arg", "bogus=1"])
    with pytest.raises(SystemExit):
        cli.main(["tune", f"{__name__}:FakeOp", "--shape", "8xq"])


def test_tune_command_uses_a_declared_workload(
    selector: ConfigSelector, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeOp, "workloads", {"llama": {"shapes": [[8, 32]], "dtype": "float32"}}, raising=False)
    assert cli.main(["tune", f"{__name__}:FakeOp", "--workload", "llama"]) == 0
    stored = next(iter(selector.persistent().entries().values()))
    assert stored.invocation["params"]["N"] == 32
