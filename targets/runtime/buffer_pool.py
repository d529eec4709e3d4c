"""Reuse of freed device buffers: a GPU array's buffer goes back to its device's pool when the
array (and every view of it) is gone, and the next allocation of the same size takes it.

Why: the GPU VM allocates a function's results afresh at every call (its intermediates live in
planned storage). A fresh buffer is not free on a GPU: NVIDIA's OpenCL driver maps device memory
at a buffer's first use and unmaps it at its release, and WebGPU creates a new bind group for
every new buffer a kernel is given. Taking the buffer of the last call's result instead keeps a
VM call's host cost to its launches.

Reuse is safe because each device has one in-order queue: commands that used the buffer before
it came back run before those of its next owner. The pool keeps at most ``PER_SIZE`` buffers
of a size and ``POOL_BYTES`` bytes in all; beyond that a buffer is released as before.

Examples
--------
>>> pool = BufferPool()
>>> pool.take(64) is None
True
>>> pool.give(64, "buf")
>>> pool.take(64)
'buf'
"""
from __future__ import annotations

import weakref
from typing import Any

__all__ = ["BufferPool", "POOL_BYTES", "PER_SIZE"]

POOL_BYTES = 1 << 30   # at most this many bytes of freed buffers kept per device (0: no pool)
PER_SIZE = 4           # at most this many freed buffers of one byte size


class BufferPool:
    """Freed device buffers by byte size (see the module docstring)."""

    def __init__(self):
        self._free: dict[int, list] = {}
        self.pooled_bytes = 0

    def take(self, nbytes: int) -> Any | None:
        """A freed buffer of exactly ``nbytes`` bytes, or None."""
        free = self._free.get(nbytes)
        if not free:
            return None
        self.pooled_bytes -= nbytes
        return free.pop()

    def give(self, nbytes: int, buffer) -> None:
        """Keep ``buffer`` (``nbytes`` bytes, no longer referenced by any array) for reuse,
        unless the pool is full (then it is dropped and the driver releases it)."""
        free = self._free.setdefault(nbytes, [])
        if len(free) >= PER_SIZE or self.pooled_bytes + nbytes > POOL_BYTES:
            return
        free.append(buffer)
        self.pooled_bytes += nbytes

    def clear(self) -> None:
        """Drop every pooled buffer."""
        self._free.clear()
        self.pooled_bytes = 0

    def track(self, array, nbytes: int, buffer) -> None:
        """Give ``buffer`` back to this pool when ``array`` is garbage-collected (its views
        keep it alive)."""
        if POOL_BYTES > 0:
            weakref.finalize(array, self.give, nbytes, buffer).atexit = False
