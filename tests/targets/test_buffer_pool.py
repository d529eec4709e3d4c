"""targets.runtime.buffer_pool without a device: buffers come back by exact byte size, the
pool's caps, and tracking (a buffer returns when its array is collected, not before)."""
import gc

from tilecraft.targets.runtime import buffer_pool
from tilecraft.targets.runtime.buffer_pool import BufferPool


class _Array:
    """Stands in for a device array (anything weak-referenceable)."""


def test_take_gives_back_by_exact_size():
    pool = BufferPool()
    pool.give(64, "a")
    assert pool.take(128) is None and pool.take(32) is None
    assert pool.take(64) == "a" and pool.take(64) is None
    assert pool.pooled_bytes == 0


def test_caps_per_size_and_in_bytes(monkeypatch):
    pool = BufferPool()
    for i in range(buffer_pool.PER_SIZE + 3):
        pool.give(16, i)
    assert pool.pooled_bytes == 16 * buffer_pool.PER_SIZE
    monkeypatch.setattr(buffer_pool, "POOL_BYTES", 100)
    pool.clear()
    pool.give(64, "x")
    pool.give(48, "y")                       # 112 bytes would be over the cap: dropped
    assert pool.take(48) is None and pool.take(64) == "x"


def test_track_returns_the_buffer_when_the_array_is_collected(monkeypatch):
    pool = BufferPool()
    arr = _Array()
    pool.track(arr, 256, "buf")
    assert pool.take(256) is None            # still owned
    del arr
    gc.collect()
    assert pool.take(256) == "buf"
    monkeypatch.setattr(buffer_pool, "POOL_BYTES", 0)   # the pool off: nothing tracked
    arr = _Array()
    pool.track(arr, 256, "buf2")
    del arr
    gc.collect()
    assert pool.take(256) is None
