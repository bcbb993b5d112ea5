"""Compile the programs of the GPU tests and timings in parallel processes, before the tests run.

    python -m tests.gpu.warmup [--workers 16] [--list]      # every family (``make test-gpu``)
    python -m tests.gpu.<family>_warmup [--workers 16]       # one family

Each family's script lists the programs its GPU tests and timings launch
(``inventory``) and how to compile one (``compile_one``, raising on failure);
TileLang keeps the results in its on-disk cache, so the tests load them
afterwards instead of compiling one after another.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger("tests.gpu.warmup")


def dtypes_field(kernel: Any) -> str:
    """A kernel's dtypes as a task names them: ``bfloat16``, or ``bfloat16->float32`` for an output
    dtype given at construction (``out_dtype``)."""
    given = vars(kernel).get("out_dtype")
    name = str(kernel.dtype).replace("torch.", "")
    return name if given is None or given == kernel.dtype else f"{name}->{str(given).replace('torch.', '')}"


def kernel_dtypes(field: str) -> Dict[str, Any]:
    """The ``dtype`` and ``out_dtype`` keywords a kernel of ``dtypes_field`` is built with."""
    import torch

    dtype, _, out_dtype = field.partition("->")
    return {"dtype": getattr(torch, dtype), "out_dtype": getattr(torch, out_dtype) if out_dtype else None}


def compile_in_parallel(description: str, inventory: Callable[[], Sequence[Any]],
                        compile_one: Callable[[Any], Any], argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``--workers``/``--list``, then compile every task; exit status 1 if any failed."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--list", action="store_true", help="only list the programs (no GPU needed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    began = time.perf_counter()
    tasks = list(inventory())
    logger.info("%d programs to compile (inventory took %.1f s)", len(tasks), time.perf_counter() - began)
    if args.list:
        for task in tasks:
            logger.info("%s", task)
        return 0
    failures: Dict[Any, str] = {}
    # spawn: building the inventory may have initialised CUDA, which a forked child cannot reuse.
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(compile_one, task): task for task in tasks}
        for future in as_completed(futures):
            try:
                future.result()
            except Exception as error:  # noqa: BLE001 - report every failure, keep compiling the rest
                failures[futures[future]] = repr(error)[-800:]
    for task, error in failures.items():
        logger.error("failed %s: %s", task, error)
    logger.info("compiled %d programs in %.0f s, %d failures", len(tasks), time.perf_counter() - began, len(failures))
    return 1 if failures else 0


# Every family's warm-up module, ``tests.gpu.<family>_warmup``.
FAMILIES = ("elementwise", "loss", "norm", "reduction", "scan", "softmax")


def _family_module(family: str) -> Any:
    import importlib

    return importlib.import_module(f"tests.gpu.{family}_warmup")


def every_family_inventory() -> List[Tuple[str, Any]]:
    """``(family, task)`` for the programs of every family, so that one pool compiles them all."""
    return [(family, task) for family in FAMILIES for task in _family_module(family).inventory()]


def compile_family_task(item: Tuple[str, Any]) -> Any:
    """Compile one ``(family, task)`` with its family's ``compile_one`` (in a worker process)."""
    family, task = item
    return _family_module(family).compile_one(task)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return compile_in_parallel(__doc__, every_family_inventory, compile_family_task, argv)


if __name__ == "__main__":
    raise SystemExit(main())
