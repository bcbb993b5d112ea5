"""Sizes every kernel family shares: the H100's thread and access limits, and power-of-two helpers."""

from typing import Optional

import torch

__all__ = [
    "SUPPORTED_DTYPES", "ACCUM", "WARP", "MAX_THREADS", "THREADS_PER_SM", "REGISTERS_PER_SM", "MIN_BLOCK_THREADS",
    "VECTOR_BYTES", "MAX_EXTENT",
    "is_pow2", "next_pow2", "prev_pow2", "largest_pow2_divisor", "max_vector", "row_vector", "check_kernel_args",
    "check_out_dtype",
]

# Input dtypes of every kernel; they accumulate in ``ACCUM``.
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ACCUM = "float32"
WARP = 32
MAX_THREADS = 1024
# Threads an SM holds at once (sm_80 and sm_90).
THREADS_PER_SM = 2048
# 32-bit registers of an SM (sm_80 to sm_90).
REGISTERS_PER_SM = 65536
# Short rows share a block: never launch fewer threads than this per block.
MIN_BLOCK_THREADS = 128
# The widest global-memory access of one thread (one 128-bit load or store).
VECTOR_BYTES = 16
# The memory sector: an access narrower than it still moves the whole sector.
SECTOR_BYTES = 32
# Programs take row counts, outer and inner extents and grid sizes as int32: larger
# inputs are launched in slices of at most this many.
MAX_EXTENT = 2**31 - 1


def is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
    """The smallest power of two at least ``n`` (1 for ``n <= 1``)."""
    return 1 << max(0, (n - 1).bit_length())


def prev_pow2(n: int) -> int:
    """The largest power of two at most ``n`` (``n`` >= 1)."""
    return 1 << (n.bit_length() - 1)


def largest_pow2_divisor(n: int, cap: int) -> int:
    """The largest power of two that divides ``n`` (0 counts as divisible) and is at most ``cap``."""
    width = 1
    while width * 2 <= cap and n % (width * 2) == 0:
        width *= 2
    return width


def max_vector(dtype: torch.dtype) -> int:
    """Elements of one 16-byte access."""
    return VECTOR_BYTES // dtype.itemsize


def row_vector(N: int, dtype: torch.dtype) -> int:
    """Elements per access along rows of ``N``: at most 16 bytes, and dividing ``N`` so every row start stays aligned."""
    return largest_pow2_divisor(N, max_vector(dtype))


def check_kernel_args(kernel: str, dtype: torch.dtype, **extents: int) -> None:
    """Refuse a dtype outside ``SUPPORTED_DTYPES`` (TypeError) or an extent below 1 (ValueError), naming ``kernel``."""
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{kernel}: dtype must be one of {SUPPORTED_DTYPES}, got {dtype}")
    for name, value in extents.items():
        if value < 1:
            raise ValueError(f"{kernel}: {name} must be positive, got {value}")


def check_out_dtype(kernel: str, dtype: torch.dtype, out_dtype: Optional[torch.dtype], rounds: bool = False) -> None:
    """Refuse an output dtype other than ``dtype`` or, from half precision, float32 (TypeError):
    the only widening the kernels fuse (they compute in float32).  A kernel that ``rounds`` (a
    gradient, which goes back in its input's dtype) writes any of ``SUPPORTED_DTYPES``."""
    if out_dtype is None or out_dtype == dtype or (rounds and out_dtype in SUPPORTED_DTYPES):
        return
    if out_dtype != torch.float32 or dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"{kernel}: out_dtype must be {dtype} or, for float16 and bfloat16 inputs, float32; "
                        f"got {out_dtype}")
