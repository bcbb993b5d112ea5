"""Benchmark entry of CrossEntropyBwdOp: valid targets and the forward's logsumexp."""

from typing import Any, Dict, List, Tuple

import torch

from benchmarks.ops.cross_entropy_fwd import make_inputs as forward_inputs

OP = "CrossEntropyBwdOp"


def make_inputs(*, shapes: Dict[str, Tuple[int, ...]], dtype: torch.dtype, device: Any,
                params: Dict[str, Any]) -> List[torch.Tensor]:
    logits, target = forward_inputs(shapes={"logits": shapes["logits"]}, dtype=dtype, device=device, params=params)
    grad_loss = torch.randn(shapes["grad_loss"], device=device, dtype=dtype)
    lse = torch.logsumexp(logits.float(), -1)
    return [grad_loss, None, logits, target, lse]
