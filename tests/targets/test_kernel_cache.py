"""The persistent kernel cache (targets.kernel_cache): storage, keys, corruption, size bound,
concurrency, the environment, and targets.build through it."""
import multiprocessing
import os
import threading

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets import kernel_cache
from tilecraft.targets.kernel_cache import KernelCache, cache_key
from tilecraft.tensorir import te


def _kernel(scale: float = 2.0, name: str = "main", n=None):
    n = te.var("n") if n is None else n
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: te.exp(A[i]) * scale, "B")
    return te.create_prim_func([A, B]).with_attr("global_symbol", name)


def _run(mod, name="main", scale=2.0, seed=0):
    a = np.random.default_rng(seed).standard_normal(37).astype("float32")
    b = np.empty_like(a)
    mod[name](a, b)
    np.testing.assert_allclose(b, np.exp(a) * scale, rtol=1e-6)
    return b


def _files(directory):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs)


# -- storage --------------------------------------------------------------------------------------

def test_put_get_round_trip_and_miss(tmp_path):
    cache = KernelCache(tmp_path)
    rng = np.random.default_rng(1)
    payloads = {cache_key("k", i): rng.bytes(int(rng.integers(1, 5000))) for i in range(20)}
    for key, data in payloads.items():
        assert cache.get(key) is None
        cache.put(key, data)
    for key, data in payloads.items():
        assert cache.get(key) == data
    assert cache.hits == 20 and cache.misses == 20 and cache.writes == 20
    info = cache.info()
    assert info.entries == 20 and info.bytes > sum(map(len, payloads.values()))


def test_keys_are_hex_digests(tmp_path):
    with pytest.raises(ValueError, match="hex digest"):
        KernelCache(tmp_path).get("../../etc/passwd")
    with pytest.raises(ValueError, match="positive"):
        KernelCache(tmp_path, max_bytes=0)


def test_key_depends_on_every_part():
    base = cache_key("llvm-kernel", {"target": "llvm"}, "main", "text")
    assert base == cache_key("llvm-kernel", {"target": "llvm"}, "main", "text")
    assert len({base, cache_key("llvm-kernel", {"target": "llvm -mcpu=znver3"}, "main", "text"),
                cache_key("llvm-kernel", {"target": "llvm"}, "main2", "text"),
                cache_key("llvm-kernel", {"target": "llvm"}, "main", "text2")}) == 4


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "magic"])
def test_a_corrupt_entry_is_a_miss_and_removed(tmp_path, damage):
    cache = KernelCache(tmp_path)
    key = cache_key("entry")
    payload = np.random.default_rng(2).bytes(3000)
    cache.put(key, payload)
    (path,) = _files(tmp_path)
    data = bytearray(open(path, "rb").read())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[:len(data) - 100]
    elif damage == "empty":
        data = bytearray()
    else:
        data[0:4] = b"XXXX"
    with open(path, "wb") as f:
        f.write(data)
    assert cache.get(key) is None
    assert cache.corrupt == 1 and not os.path.exists(path)
    cache.put(key, payload)
    assert cache.get(key) == payload


def test_trim_removes_least_recently_used(tmp_path):
    cache = KernelCache(tmp_path, max_bytes=10_000)
    keys = [cache_key("lru", i) for i in range(8)]
    for i, key in enumerate(keys):
        cache.put(key, bytes([i]) * 2000)
        path = os.path.join(tmp_path, key[:2], key)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))      # put in order 0..7
    assert cache.get(keys[0]) is not None                   # a hit: now the most recent
    removed = cache.trim()
    assert removed > 0 and cache.info().bytes <= 10_000
    present = [k for k in keys if cache.get(k) is not None]
    assert keys[0] in present and keys[1] not in present and keys[7] in present
    assert cache.clear() > 0 and cache.info().entries == 0


def test_concurrent_threads_read_and_write(tmp_path):
    cache = KernelCache(tmp_path)
    keys = [cache_key("threads", i % 5) for i in range(200)]
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for key in rng.permutation(keys)[:60]:
            data = key.encode() * 50        # every writer of a key writes the same bytes
            got = cache.get(key)
            if got is not None and got != data:
                errors.append(key)
            cache.put(key, data)
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.corrupt == 0
    assert not [f for f in _files(tmp_path) if os.path.basename(f).startswith(".tmp-")]


def _build_in_process(directory, queue):
    try:
        mod = targets.build(_kernel(3.0), "llvm", cache=directory, jobs=1)
        queue.put(_run(mod, scale=3.0).tobytes())
    except BaseException as err:  # noqa: BLE001 - reported to the test
        queue.put(repr(err))


def test_concurrent_builds_in_processes_share_the_cache(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build_in_process, args=(str(tmp_path), queue))
             for _ in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(isinstance(r, bytes) for r in results), results
    assert len(set(results)) == 1
    mod = targets.build(_kernel(3.0), "llvm", cache=str(tmp_path))
    assert mod.build_stats.cache_hits == 1 and mod.build_stats.compiled == 0
    _run(mod, scale=3.0)


# -- targets.build through the cache --------------------------------------------------------------

def test_build_hits_the_cache_and_runs_the_same(tmp_path):
    cold = targets.build(_kernel(), "llvm", cache=str(tmp_path))
    assert (cold.build_stats.cache_hits, cold.build_stats.compiled) == (0, 1)
    warm = targets.build(_kernel(), "llvm", cache=str(tmp_path))
    assert (warm.build_stats.cache_hits, warm.build_stats.compiled) == (1, 0)
    assert warm.objects() == cold.objects()
    np.testing.assert_array_equal(_run(cold), _run(warm))
    # the same kernel text under another name, or for another target, is another kernel
    other = targets.build(_kernel(name="other"), "llvm", cache=str(tmp_path))
    assert other.build_stats.compiled == 1
    _run(other, "other")
    cross = targets.build(_kernel(), "llvm -mtriple=aarch64-linux-gnu", cache=str(tmp_path))
    assert cross.build_stats.compiled == 1
    # a warm module shows its source (generated again) as a cold one does
    assert warm.get_source("ll-raw") == cold.get_source("ll-raw")
    assert "tilecraft_fn_main" in warm.get_source("ll") and warm.get_source("asm")


def test_corrupt_entries_are_rebuilt(tmp_path):
    targets.build(_kernel(), "llvm", cache=str(tmp_path))
    for path in _files(tmp_path):
        with open(path, "r+b") as f:
            f.seek(40)
            f.write(b"\xff\x00\xff")
    mod = targets.build(_kernel(), "llvm", cache=str(tmp_path))
    assert mod.build_stats.compiled == 1
    _run(mod)
    assert targets.build(_kernel(), "llvm", cache=str(tmp_path)).build_stats.compiled == 0


def test_a_well_formed_entry_of_another_kernel_is_not_used(tmp_path):
    """An entry whose checksum is right but whose payload is not this kernel's (a key
    collision, a bug) is rebuilt, not loaded."""
    cache = KernelCache(tmp_path)
    targets.build(_kernel(), "llvm", cache=cache)
    (path,) = [p for p in _files(tmp_path) if _is_kernel_entry(p)]
    key = os.path.basename(path)
    cache.put(key, b'{"format": 1, "name": "someone_else", "meta": {}, '
                   b'"uses_parallel": false}\nnot an object')
    mod = targets.build(_kernel(), "llvm", cache=cache)
    assert mod.build_stats.compiled == 1
    _run(mod)


def _is_kernel_entry(path):
    """A kernel's entry (JSON header, then the object) rather than a glue object's."""
    with open(path, "rb") as f:
        return f.read()[37:].startswith(b'{"format"')


def test_no_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_cache.ENV_DIR, str(tmp_path))
    mod = targets.build(_kernel(), "llvm", cache=False)
    assert mod.build_stats.cache_dir is None
    monkeypatch.setenv(kernel_cache.ENV_SWITCH, "0")
    assert kernel_cache.default_cache() is None
    mod = targets.build(_kernel(), "llvm")
    assert mod.build_stats.cache_dir is None
    with kernel_cache.use(False):
        monkeypatch.setenv(kernel_cache.ENV_SWITCH, "1")
        assert targets.build(_kernel(), "llvm").build_stats.cache_dir is None
    assert _files(tmp_path) == []
    _run(mod)


def test_environment_chooses_the_directory_and_bound(tmp_path, monkeypatch):
    monkeypatch.delenv(kernel_cache.ENV_SWITCH, raising=False)
    monkeypatch.setenv(kernel_cache.ENV_DIR, str(tmp_path / "kc"))
    monkeypatch.setenv(kernel_cache.ENV_MAX_MB, "3")
    cache = kernel_cache.default_cache()
    assert cache.directory == str(tmp_path / "kc") and cache.max_bytes == 3 << 20
    mod = targets.build(_kernel(), "llvm")
    assert mod.build_stats.cache_dir == str(tmp_path / "kc") and _files(tmp_path / "kc")
    monkeypatch.setenv(kernel_cache.ENV_MAX_MB, "lots")
    with pytest.raises(ValueError, match="TILECRAFT_CACHE_MAX_MB"):
        kernel_cache.default_cache()
    monkeypatch.delenv(kernel_cache.ENV_DIR)
    monkeypatch.delenv(kernel_cache.ENV_MAX_MB)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.default_directory() == str(tmp_path / "xdg" / "tilecraft" / "kernels")
    with pytest.raises(TypeError, match="cache must be"):
        targets.build(_kernel(), "llvm", cache=3)
