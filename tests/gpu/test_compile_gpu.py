"""torch.compile(fullgraph=True) with inductor over tileops ops on the GPU."""

import pytest
import torch

import tileops.functional as F
from tileops.ops import CumsumFwdOp, RMSNormFwdOp

pytestmark = pytest.mark.gpu


class Block(torch.nn.Module):
    def __init__(self, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden, dtype=dtype))
        self.norm = RMSNormFwdOp(N=hidden, dtype=dtype)
        self.scan = CumsumFwdOp(N=hidden, dtype=dtype, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x, self.weight)
        return x + self.scan(h) * 0.5 + F.cumsum(h, 1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_block_compiles_without_graph_breaks_and_matches_eager(dynamic):
    torch._dynamo.reset()
    block = Block(256, torch.float32).cuda()
    compiled = torch.compile(block, fullgraph=True, dynamic=dynamic)
    with torch.no_grad():
        for rows in (4, 9):
            x = torch.randn(3, rows, 256, device="cuda")
            torch.testing.assert_close(compiled(x), block(x), rtol=1e-4, atol=1e-4)
    explanation = torch._dynamo.explain(block)(torch.randn(3, 4, 256, device="cuda"))
    assert explanation.graph_break_count == 0
