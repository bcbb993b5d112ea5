"""Roofline arithmetic, ceilings (with a scripted timer) and input rotation."""

from __future__ import annotations

import math

import pytest
import torch

from bench_fakes import FakeBackend
from benchmarks.ceilings import Ceilings, measure_ceilings
from benchmarks.metrics import achieved_gbps, achieved_tflops, sol_percent, speedup
from benchmarks.timing import rotation_count


def test_achieved_rates():
    # 3 GB in 1 ms is 3000 GB/s; 2e12 flops in 1 s is 2 TFLOP/s.
    assert achieved_gbps(3e9, 1000.0) == pytest.approx(3000.0)
    assert achieved_tflops(2e12, 1e6) == pytest.approx(2.0)


def test_sol_takes_the_memory_bound_when_bytes_dominate():
    # 3 GB at 3000 GB/s is 1 ms; 1 GFLOP at 700 TFLOP/s is ~1.4 us; measured 2 ms -> 50 %.
    assert sol_percent(1e9, 3e9, 2000.0, copy_gbps=3000.0, peak_tflops=700.0) == pytest.approx(50.0)


def test_sol_takes_the_compute_bound_when_flops_dominate():
    # 2*8192^3 flops at 700 TFLOP/s floor, measured at exactly that time -> 100 %.
    flops = 2 * 8192**3
    micros = flops / 700e12 * 1e6
    assert sol_percent(flops, 3 * 8192**2 * 2, micros, 3000.0, 700.0) == pytest.approx(100.0)


def test_sol_ignores_missing_ceilings():
    assert sol_percent(1e9, 3e9, 1000.0, copy_gbps=3000.0, peak_tflops=0.0) == pytest.approx(100.0)


def test_speedup_is_baseline_over_ours():
    assert speedup(30.0, 10.0) == pytest.approx(3.0)
    assert speedup(None, 10.0) is None
    assert speedup(30.0, None) is None


def test_rotation_only_for_inputs_that_fit_in_l2():
    l2 = 50 * 2**20
    assert rotation_count(256 * 2**20, l2) == 1
    assert rotation_count(20 * 2**20, l2) == 5  # 5 x 20 MiB overflow L2 twice
    assert rotation_count(16 * 2**10, l2) == 64  # capped
    assert rotation_count(0, l2) == 1


def test_ceilings_from_scripted_times():
    backend = FakeBackend(times=[2.0, 100.0, 50.0, 400.0])
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    ceilings = measure_ceilings(backend, "cpu", copy_bytes=4096, matmul_size=16)
    # copy: 4096 read + 4096 written in 2 us.
    assert ceilings.copy_gbps == pytest.approx(8192 / 2e-6 / 1e9)
    assert ceilings.matmul_tflops["bfloat16"] == pytest.approx(2 * 16**3 / 100e-6 / 1e12)
    assert ceilings.matmul_tflops["float16"] == pytest.approx(2 * 16**3 / 50e-6 / 1e12)
    assert ceilings.matmul_tflops["float32"] == pytest.approx(2 * 16**3 / 400e-6 / 1e12)
    assert torch.backends.cuda.matmul.allow_tf32 == tf32_before  # the fp32 ceiling restores the flag


def test_peak_tflops_falls_back_to_bf16():
    ceilings = Ceilings(3000.0, {"bfloat16": 700.0, "float32": 50.0})
    assert ceilings.peak_tflops("float32") == 50.0
    assert ceilings.peak_tflops("int8") == 700.0
    assert math.isclose(Ceilings(3000.0).peak_tflops("bfloat16"), 0.0)
