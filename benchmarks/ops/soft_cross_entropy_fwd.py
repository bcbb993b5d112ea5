"""Benchmark entry of SoftCrossEntropyFwdOp: target probabilities (a softmax) in the logits' dtype, no class weights."""

from typing import Any, Dict, List, Optional, Tuple

import torch

OP = "SoftCrossEntropyFwdOp"


def make_inputs(*, shapes: Dict[str, Tuple[int, ...]], dtype: torch.dtype, device: Any,
                params: Dict[str, Any]) -> List[Optional[torch.Tensor]]:
    rows, classes = shapes["logits"]
    logits = torch.randn(rows, classes, device=device, dtype=dtype)
    probabilities = torch.softmax(torch.randn(rows, classes, device=device), dim=1).to(dtype)
    return [logits, probabilities, None]
