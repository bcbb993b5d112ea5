"""Benchmark entry of CrossEntropyFwdOp: targets are class indices in [0, V), every 16th ignored."""

from typing import Any, Dict, List, Tuple

import torch

OP = "CrossEntropyFwdOp"


def make_inputs(*, shapes: Dict[str, Tuple[int, ...]], dtype: torch.dtype, device: Any,
                params: Dict[str, Any]) -> List[torch.Tensor]:
    rows, classes = shapes["logits"]
    logits = torch.randn(rows, classes, device=device, dtype=dtype)
    target = torch.randint(0, classes, (rows,), device=device)
    target[::16] = params.get("ignore_index", -100)
    return [logits, target]
