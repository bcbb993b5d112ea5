"""Stable call keys: canonical JSON + sha256, never ``hash()``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tileops.tuning.keys import Invocation, TensorSpec, canonical_json, config_from_json, stable_digest

ROOT = Path(__file__).resolve().parents[1]

RMS = Invocation(
    "tileops.kernels.norm.rms_norm.RMSNormFwdKernel",
    "1",
    {"N": 4096, "dtype": "bfloat16", "eps": 1e-6},
    workload={"rows": 4096},
)
# Pinned: if this changes, every user's persistent cache silently stops matching.
RMS_KEY = "1dfde4795c2fbe84f482d62b6279ca93"

_CHILD = """
from tileops.tuning.keys import Invocation, TensorSpec
params = {name: index for index, name in enumerate(["z", "a", "m", "b", "y"])}
params.update({"N": 4096, "dtype": "bfloat16", "eps": 1e-6})
inv = Invocation("tileops.kernels.norm.rms_norm.RMSNormFwdKernel", "1",
                 {"N": 4096, "dtype": "bfloat16", "eps": 1e-6}, workload={"rows": 4096})
other = Invocation("x.Op", "2", params, args=(TensorSpec((8, 4096), "float16"), 3))
print(inv.call_key, other.call_key)
"""


def _keys_in_child(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_call_key_is_pinned() -> None:
    assert RMS.call_key == RMS_KEY


def test_call_key_stable_across_processes_and_hash_seeds() -> None:
    outputs = {_keys_in_child(seed) for seed in ("0", "1", "4242", "random")}
    assert len(outputs) == 1
    assert outputs.pop().split()[0] == RMS_KEY


def test_key_ignores_mapping_order_and_tuple_vs_list() -> None:
    a = Invocation("op", "1", {"a": 1, "b": (2, 3)})
    b = Invocation("op", "1", {"b": [2, 3], "a": 1})
    assert a.call_key == b.call_key


@pytest.mark.parametrize(
    "changed",
    [
        Invocation("other.Kernel", "1", dict(RMS.params), workload={"rows": 4096}),
        Invocation(RMS.op_id, "2", dict(RMS.params), workload={"rows": 4096}),
        Invocation(RMS.op_id, "1", {**RMS.params, "N": 8192}, workload={"rows": 4096}),
        Invocation(RMS.op_id, "1", {**RMS.params, "dtype": "float16"}, workload={"rows": 4096}),
        Invocation(RMS.op_id, "1", {**RMS.params, "eps": 1e-5}, workload={"rows": 4096}),
        Invocation(RMS.op_id, "1", dict(RMS.params), workload={"rows": 8192}),
        Invocation(RMS.op_id, "1", dict(RMS.params), args=(TensorSpec((1,), "float32"),), workload={"rows": 4096}),
    ],
)
def test_every_part_of_the_identity_changes_the_key(changed: Invocation) -> None:
    assert changed.call_key != RMS.call_key


def test_tensors_are_keyed_by_shape_and_dtype_only() -> None:
    a = Invocation.from_tensors("op", (torch.randn(4, 8), torch.zeros(8, dtype=torch.float16)))
    b = Invocation.from_tensors("op", (torch.ones(4, 8), torch.ones(8, dtype=torch.float16)))
    c = Invocation.from_tensors("op", (torch.ones(4, 9), torch.ones(8, dtype=torch.float16)))
    d = Invocation.from_tensors("op", (torch.ones(4, 8), torch.ones(8, dtype=torch.bfloat16)))
    assert a.call_key == b.call_key
    assert len({a.call_key, c.call_key, d.call_key}) == 3
    assert a.describe()["args"][1] == {"shape": [8], "dtype": "float16"}


def test_torch_dtype_spells_like_its_name() -> None:
    assert canonical_json({"dtype": torch.bfloat16}) == canonical_json({"dtype": "bfloat16"})


def test_objects_without_a_stable_spelling_are_refused() -> None:
    with pytest.raises(TypeError, match="stable tuning key"):
        canonical_json({"fn": object()})
    with pytest.raises(TypeError, match="string mapping keys"):
        canonical_json({1: "a"})


def test_non_finite_floats_key_distinctly() -> None:
    assert stable_digest(float("inf")) != stable_digest(float("-inf"))
    assert stable_digest(float("nan")) != stable_digest(0.0)


def test_configs_read_back_as_tuples() -> None:
    assert config_from_json({"tile": [128, 64], "n": 3}) == {"tile": (128, 64), "n": 3}
