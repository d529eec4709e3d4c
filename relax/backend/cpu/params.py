"""The parameters of a CPU target that the kernel families size their tiles by: vector lanes and
vector registers (``cpu_tile_params``), and cores (``num_cores``); and the rule for the outputs
the kernels write with non-temporal (streaming) stores (``nontemporal_output``).

Examples
--------
>>> from tilecraft.targets import Target
>>> cpu_tile_params(Target("llvm -mtriple=aarch64-linux-gnu"))
(4, 32)
"""
from __future__ import annotations

import os

from tilecraft.targets import Target
from tilecraft.tensorir.expr import IntImm, PrimExpr

__all__ = ["cpu_tile_params", "num_cores", "NONTEMPORAL_MIN_BYTES", "NONTEMPORAL_MIN_IMAGE_BYTES",
           "nontemporal_output"]

# a kernel writes an output of at least this many bytes (the whole tensor: every image of the
# call) with non-temporal stores (``nontemporal_output``)
NONTEMPORAL_MIN_BYTES = 32 << 20
# ... and a kernel with a symbolic batch carries that test (made at run time) when one image's
# output is at least this many bytes (32 images reach NONTEMPORAL_MIN_BYTES)
NONTEMPORAL_MIN_IMAGE_BYTES = 1 << 20


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


def nontemporal_output(image_bytes: int, batch: "int | PrimExpr") -> bool:
    """Whether a kernel whose output takes ``image_bytes`` an image, ``batch`` images (a
    symbolic batch: an expression), writes it with non-temporal stores: the write-back's
    vector loop annotated ``ANN_NONTEMPORAL_STORE`` with ``NONTEMPORAL_MIN_BYTES``, so that
    the LLVM back end streams the output when the whole of it (every image of the call) is
    at least that large, a test made at run time for a symbolic batch. True for a static
    batch whose output reaches ``NONTEMPORAL_MIN_BYTES``, and for a symbolic batch whose
    output is at least ``NONTEMPORAL_MIN_IMAGE_BYTES`` an image.

    A plain store reads its line in first (a read for ownership) and leaves it in the
    caches; a non-temporal one does neither. It pays only when the next kernel would not find
    the output in the caches anyway: its bytes far beyond the cache a core can count on. On
    the Intel Xeon guest of ``docs/zoo.md`` (2 MB L2 a core, 480 MB of L3 reported but shared
    with the host's other guests), MobileNet-V2 side by side (symbolic builds, one thread,
    thread CPU time), the former per-image rule (1x1 outputs from 4 MB an image, depthwise
    ones from 1 MB, always streamed) against no streaming: batch 1 (the 16 -> 96 expansion's
    output 4.8 MB) 7.57 against 6.71 ms, batch 8 (38 MB) 57.4 / 57.7 ms, batch 16 (77 MB)
    119.0 / 132.4 ms, batch 32 254 / 280 ms. On Zen 4 (32 MB of L3 for 8 cores) that
    expansion's stores gained at batch 8 (61.5 -> 57.9 ms), and so did the 1 MB-an-image
    depthwise outputs (56.9 -> 54.4 ms). 32 MB is the break-even of the first machine and
    the L3 of the second; not the L3 size a machine reports (a guest's is shared). The rule
    is on the whole output, not one image, so that one kernel built for a symbolic batch
    keeps a small batch's output in the caches and streams a large one's.

    Examples
    --------
    >>> nontemporal_output(112 * 112 * 96 * 4, 1), nontemporal_output(112 * 112 * 96 * 4, 8)
    (False, True)
    >>> from tilecraft.tensorir import te
    >>> nontemporal_output(112 * 112 * 96 * 4, te.var("n")), nontemporal_output(14 * 14 * 576 * 4, te.var("n"))
    (True, False)
    """
    if isinstance(batch, IntImm):
        batch = batch.value
    if isinstance(batch, int):
        return batch * image_bytes >= NONTEMPORAL_MIN_BYTES
    return image_bytes >= NONTEMPORAL_MIN_IMAGE_BYTES
