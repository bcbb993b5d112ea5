"""Autotuning a real kernel: one process tunes and persists, a second reuses without tuning.

Both runs are separate processes sharing one ``TILEOPS_CACHE_DIR``, as two
jobs on one machine would.  The summary line printed at the end (run with
``-s``) gives the tuning time and the second process's time to first result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROOT = Path(__file__).resolve().parents[2]

_TUNE = """
import json, time, torch
began = time.perf_counter()
from tileops.kernels.norm.rms_norm import RMSNormFwdKernel
from tileops.tuning.kernels import select_kernel_config
kernel = RMSNormFwdKernel(4096, torch.bfloat16)
selection = select_kernel_config(kernel, tune=True)
kernel.config = dict(selection.config)
tuned = time.perf_counter() - began
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
out = torch.full_like(x, float("nan"))
kernel(x, w, out)
want = torch.nn.functional.rms_norm(x.double(), (4096,), w.double(), 1e-6).to(torch.bfloat16)
ok = torch.allclose(out.float(), want.float(), rtol=1.6e-2, atol=1e-2)
print(json.dumps({"source": selection.source, "config": dict(selection.config),
                  "tuner": dict(selection.entry.tuner), "tune_s": tuned, "correct": bool(ok)}))
"""

_REUSE = """
import json, time
began = time.perf_counter()
import torch
from tileops.tuning import tuner
def refuse(self, target):
    raise AssertionError("the second process must not tune")
tuner.Tuner.tune = refuse
from tileops.kernels.norm.rms_norm import RMSNormFwdKernel
from tileops.tuning.kernels import select_kernel_config
built = time.perf_counter()
kernel = RMSNormFwdKernel(4096, torch.bfloat16)   # TILEOPS_AUTOTUNE=1: would tune on a miss
selected = time.perf_counter()
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(x)
kernel(x, w, out)
torch.cuda.synchronize()
first = time.perf_counter()
print(json.dumps({"config": kernel.config, "source": select_kernel_config(kernel).source,
                  "select_ms": (selected - built) * 1e3, "first_result_s": first - began}))
"""


def _run(code: str, cache_dir: Path, **env: str) -> dict:
    environment = {**os.environ, "TILEOPS_CACHE_DIR": str(cache_dir), **env}
    done = subprocess.run([sys.executable, "-c", code], env=environment, cwd=ROOT,
                          capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_autotune_persists_and_a_second_process_reuses_it(tmp_path: Path) -> None:
    tuned = _run(_TUNE, tmp_path)
    assert tuned["source"] == "autotune" and tuned["correct"]
    assert tuned["tuner"]["candidates"] >= 4 and tuned["tuner"]["passed"] >= 1
    files = list(tmp_path.glob("cuda-*.json"))
    assert len(files) == 1

    began = time.perf_counter()
    reused = _run(_REUSE, tmp_path, TILEOPS_AUTOTUNE="1")
    wall = time.perf_counter() - began
    assert reused["config"] == tuned["config"]
    assert reused["source"] == "memory"  # loaded from disk at construction, then held in memory

    stats = tuned["tuner"]
    print(
        f"\nTUNING rms_norm N=4096 bf16 rows=4096: {stats['candidates']} candidates, "
        f"{stats['passed']} passed, tuned in {tuned['tune_s']:.1f} s; best {tuned['config']} "
        f"{stats['best_ms'] * 1e3:.1f} us vs heuristic {stats['heuristic_ms'] * 1e3:.1f} us. "
        f"Second process: config lookup {reused['select_ms']:.2f} ms, first result "
        f"{reused['first_result_s']:.1f} s after start ({wall:.1f} s wall incl. interpreter)"
    )
