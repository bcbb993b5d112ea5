"""Benchmark entry of SoftCrossEntropyBwdOp: the forward's inputs, logsumexp and target mass."""

from typing import Any, Dict, List, Optional, Tuple

import torch

from benchmarks.ops.soft_cross_entropy_fwd import make_inputs as forward_inputs

OP = "SoftCrossEntropyBwdOp"


def make_inputs(*, shapes: Dict[str, Tuple[int, ...]], dtype: torch.dtype, device: Any,
                params: Dict[str, Any]) -> List[Optional[torch.Tensor]]:
    logits, probabilities, _ = forward_inputs(shapes={"logits": shapes["logits"]}, dtype=dtype, device=device,
                                              params=params)
    grad_loss = torch.randn(shapes["grad_loss"], device=device)
    lse = torch.logsumexp(logits.float(), -1)
    label_smoothing = params.get("label_smoothing", 0.0)
    mass = (probabilities.float() * (1 - label_smoothing) + label_smoothing / logits.shape[1]).sum(-1)
    return [grad_loss, None, logits, probabilities, None, lse, mass]
