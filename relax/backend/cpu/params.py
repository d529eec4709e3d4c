"""The parameters of a CPU target that the kernel families size their tiles by: vector lanes and
vector registers (``cpu_tile_params``), and cores (``num_cores``).

Examples
--------
>>> from tilecraft.targets import Target
>>> cpu_tile_params(Target("llvm -mtriple=aarch64-linux-gnu"))
(4, 32)
"""
from __future__ import annotations

import os

from tilecraft.targets import Target

__all__ = ["cpu_tile_params", "num_cores"]


def cpu_tile_params(target: Target, dtype: str = "float32") -> tuple[int, int]:
    """``(lanes, vector registers)`` of ``target`` for ``dtype``: 16 lanes and 32 registers
    with AVX-512, 8 and 16 with AVX2, 4 and 32 on AArch64 NEON.

    Examples
    --------
    >>> cpu_tile_params(Target("llvm -mtriple=x86_64-linux-gnu -mattr=+avx2"))
    (8, 16)
    """
    bits = 32 if dtype == "float32" else 64
    lanes = max(4, target.vector_width // bits)
    registers = 32 if target.vector_width >= 512 or target.arch == "aarch64" else 16
    return lanes, registers


def num_cores(target: Target) -> int:
    """The cores the target's parallel loops run on: its ``-num-cores``, else this machine's
    (what the schedules split parallel work by)."""
    return target.num_cores or os.cpu_count() or 1
