"""The functional forms' ``dtype`` keyword over CUDA tensors: the input cast first, then the kernel."""

import pytest
import torch

import tileops.functional as F
from tests.test_functional_dtype import CASTS, FUNCTIONS, check_cast_then_op, check_compiled_training

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("source, target", CASTS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_dtype_casts_the_input_before_the_kernel(name: str, source: torch.dtype, target: torch.dtype) -> None:
    check_cast_then_op(name, source, target, "cuda")


def test_dtype_compiles_with_inductor() -> None:
    torch._dynamo.reset()

    def attention_weights(scores: torch.Tensor) -> torch.Tensor:
        return F.softmax(scores, -1, dtype=torch.float32).to(scores.dtype)

    compiled = torch.compile(attention_weights, fullgraph=True, dynamic=True)
    for rows in (4, 7):
        scores = torch.randn(rows, 4096, dtype=torch.bfloat16, device="cuda")
        got = compiled(scores)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, torch.softmax(scores, -1, dtype=torch.float32).to(torch.bfloat16))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_a_float32_output_trains_through_inductor(name: str) -> None:
    check_compiled_training(name, "cuda", "inductor")
