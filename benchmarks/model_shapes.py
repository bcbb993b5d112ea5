"""The ops over the sizes of published models, timed as the bench times its own workloads.

    python -m benchmarks.model_shapes [--ops OP ...] [--workloads LABEL ...] [--rounds 5] [--list]

The manifest's workloads are round sizes, chosen for the performance targets.  Models are not
round: hidden sizes of 2880, 3584 or 7168, per-head norms of 128, MLPs of 18944, vocabularies of
151936, 201088 or GPT-2's 50257 (odd, so no row after the first starts 16 bytes aligned).  Each
case here takes one of the op's manifest workloads as its template and gives its tensors a
model's shapes; the cases then run as ``python -m benchmarks`` runs the manifest's: compiled first
in worker processes, checked against the float64 reference, timed in turns with eager PyTorch and
torch.compile.  The results go to ``benchmarks/results/model_shapes/<gpu>.csv`` (and ``.md``),
apart from the files the README's tables are rendered from.  ``--workloads`` selects by the labels
below (``qwen2.5-7b``, ...), ``--ops`` and ``--dtypes`` as in the bench.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .__main__ import RESULTS_DIR, add_arguments, run
from .config_sweep import reshaped_case
from .workloads import Case, select_cases, split_names

__all__ = ["ModelShape", "MODEL_SHAPES", "model_shape_cases", "main"]

Shapes = Tuple[Tuple[str, Tuple[int, ...]], ...]


@dataclass(frozen=True)
class ModelShape:
    """One op on one model's sizes: the manifest workload it reshapes and the shapes it gives."""

    label: str
    op: str
    template: str
    shapes: Shapes
    dtype: str = "bfloat16"


# Tokens of a training step (a batch of 8 sequences of 2048) and a batch of sampled sequences.
TOKENS = 16384
SAMPLED = 256


def _norms(model: str, hidden: int, rows: int = TOKENS) -> List[ModelShape]:
    x = (rows, hidden)
    return [
        ModelShape(model, "RMSNormFwdOp", "llama-4k", (("x", x), ("weight", (hidden,)))),
        ModelShape(model, "RMSNormBwdOp", "llama-4k", (("grad_y", x), ("x", x), ("weight", (hidden,)))),
        ModelShape(model, "FusedAddRMSNormFwdOp", "llama-4k", (("x", x), ("residual", x), ("weight", (hidden,)))),
        ModelShape(model, "FusedAddRMSNormBwdOp", "llama-4k",
                   (("grad_y", x), ("grad_residual_out", x), ("residual_out", x), ("weight", (hidden,)))),
    ]


def _layer_norms(model: str, hidden: int) -> List[ModelShape]:
    x = (TOKENS, hidden)
    return [
        ModelShape(model, "LayerNormFwdOp", "llama-4k", (("x", x), ("weight", (hidden,)), ("bias", (hidden,)))),
        ModelShape(model, "LayerNormBwdOp", "llama-4k", (("grad_y", x), ("x", x), ("weight", (hidden,)))),
    ]


def _head_norms(model: str, head_dim: int, heads: int) -> List[ModelShape]:
    """The per-head RMSNorm of queries and keys (Qwen3, Gemma 3): one row per token and head."""
    x = (TOKENS * heads, head_dim)
    return [
        ModelShape(model, "RMSNormFwdOp", "llama-4k", (("x", x), ("weight", (head_dim,)))),
        ModelShape(model, "RMSNormBwdOp", "llama-4k", (("grad_y", x), ("x", x), ("weight", (head_dim,)))),
    ]


def _gated_mlp(model: str, intermediate: int, rows: int = TOKENS // 2) -> List[ModelShape]:
    gate_up, out = (rows, 2 * intermediate), (rows, intermediate)
    return [
        ModelShape(model, "SiluAndMulFwdOp", "llama-16k-11008", (("x", gate_up),)),
        ModelShape(model, "SiluAndMulBwdOp", "llama-16k-11008", (("grad_y", out), ("x", gate_up))),
    ]


def _loss(model: str, vocab: int, rows: int = TOKENS // 2) -> List[ModelShape]:
    logits, per_row = (rows, vocab), (rows,)
    return [
        ModelShape(model, "CrossEntropyFwdOp", "llama3-8k-128k", (("logits", logits), ("target", per_row))),
        ModelShape(model, "CrossEntropyBwdOp", "llama3-8k-128k",
                   (("grad_loss", ()), ("grad_lse", per_row), ("logits", logits), ("target", per_row),
                    ("lse", per_row))),
    ]


def _sampling(model: str, vocab: int) -> List[ModelShape]:
    """A decoding step over a batch: greedy argmax, softmax of the logits, top-p's cumsum of
    float32 probabilities."""
    logits = (("x", (SAMPLED, vocab)),)
    return [
        ModelShape(model, "ArgmaxFwdOp", "rows-16k-16k", logits),
        ModelShape(model, "SoftmaxFwdOp", "rows-32k-4k", logits),
        ModelShape(model, "CumsumFwdOp", "rows-32k-4k", logits, "float32"),
    ]


def _attention_scores(model: str, heads: int, sequence: int, batch: int = 8) -> List[ModelShape]:
    """Eager attention's softmax over scores ``[batch * heads * queries, keys]``."""
    scores = (batch * heads * sequence, sequence)
    return [
        ModelShape(model, "SoftmaxFwdOp", "rows-32k-4k", (("x", scores),)),
        ModelShape(model, "SoftmaxBwdOp", "rows-32k-4k", (("grad_y", scores), ("y", scores))),
    ]


MODEL_SHAPES: Tuple[ModelShape, ...] = tuple(
    _norms("llama-3.2-1b", 2048) + _norms("gpt-oss", 2880) + _norms("qwen2.5-7b", 3584)
    + _norms("qwen2.5-14b", 5120) + _norms("deepseek-v3", 7168) + _norms("llama-3.1-70b", 8192)
    + _head_norms("qwen3-qk", 128, 32)
    + _layer_norms("gpt2", 768) + _layer_norms("phi-2", 2560)
    + _gated_mlp("qwen3-moe-expert", 768, rows=8 * TOKENS) + _gated_mlp("gpt-oss", 2880)
    + _gated_mlp("llama-3.1-8b", 14336) + _gated_mlp("qwen2.5-7b", 18944) + _gated_mlp("llama-3.1-70b", 28672)
    + _loss("gpt2", 50257) + _loss("llama-3", 128256) + _loss("qwen2.5", 151936) + _loss("gpt-oss", 201088)
    + _loss("gemma-2", 256000)
    + _sampling("gpt2", 50257) + _sampling("qwen2.5", 151936)
    + _attention_scores("gpt2", 12, 1024)
)


def model_shape_cases(manifest: Any, entries: Dict[str, Any], ops: Optional[Sequence[str]] = None,
                      labels: Optional[Sequence[str]] = None, dtypes: Optional[Sequence[str]] = None,
                      table: Sequence[ModelShape] = MODEL_SHAPES) -> List[Case]:
    """The cases of ``table`` (narrowed by op, label and dtype), each its template reshaped."""
    ops, labels, dtypes = split_names(ops), split_names(labels), split_names(dtypes)
    for kind, wanted, known in (("op", ops, {row.op for row in table}), ("label", labels, {row.label for row in table})):
        unknown = sorted(set(wanted) - known)
        if unknown:
            raise ValueError(f"no model shape of {kind} {unknown} (known: {sorted(known)})")
    cases = []
    for row in table:
        if (ops and row.op not in ops) or (labels and row.label not in labels) or (dtypes and row.dtype not in dtypes):
            continue
        template = select_cases(manifest, entries, [row.op], [row.template])
        if not template:
            raise ValueError(f"{row.label}: {row.op} has no workload {row.template!r} in the manifest")
        case = reshaped_case(template[0], dict(row.shapes), {})
        cases.append(dataclasses.replace(case, workload=_relabelled(case.workload, row), dtype=row.dtype))
    return cases


def _relabelled(workload: Any, row: ModelShape) -> Any:
    """The reshaped workload named by the model and its largest tensor (``qwen2.5-7b 16384x3584``)."""
    largest = max((shape for _, shape in row.shapes), key=math.prod)
    return dataclasses.replace(workload, label=f"{row.label} {'x'.join(map(str, largest))}", dtypes=(row.dtype,))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.set_defaults(results_dir=RESULTS_DIR / "model_shapes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    return run(args, select=model_shape_cases)


if __name__ == "__main__":
    sys.exit(main())
