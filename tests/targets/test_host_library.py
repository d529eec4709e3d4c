"""Host modules are linked into a shared library and loaded with ctypes (not MCJIT): one
library's code and constant pools lie together, within reach of the small code model's
32-bit PC-relative references, however fragmented the process's address space is
(docs/known-issues.md had the MCJIT abort this replaces)."""
import gc
import mmap
import shutil
import sys

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets import toolchain
from tilecraft.targets.llvm import compiler
from tilecraft.tensorir import Schedule, te

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self/maps and maps PROT_NONE regions (Linux)")


def _kernel(j: int):
    """Kernels of different code and constant-pool sizes: a polynomial in ``exp(a)`` with
    ``1 + j % 9`` distinct coefficients (each a constant-pool entry); odd ``j`` have a parallel
    loop (they call the process-wide thread pool)."""
    n = 16 + j
    coefs = [0.25 + j / 64 + t / 7 for t in range(1 + j % 9)]
    a = te.placeholder((n, 64), "float32", "a")

    def body(i, k):
        acc = te.exp(a[i, k])
        for c in coefs:
            acc = acc * a[i, k] + c
        return acc

    func = te.create_prim_func([a, te.compute((n, 64), body, "b")])
    if j % 2:
        sch = Schedule(func)
        i, _ = sch.get_loops(sch.get_block("b"))
        sch.parallel(i)
        func = sch.func
    return func, coefs


def _oracle(a, coefs):
    acc = np.exp(a.astype("float64"))
    for c in coefs:
        acc = acc * a + c
    return acc


def _mappings(path: str) -> list[tuple[int, int]]:
    """The address ranges /proc/self/maps lists for the file ``path`` (deleted or not)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip().startswith(path):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi))
    return out


def test_host_module_is_one_library_within_reach():
    func, coefs = _kernel(3)
    mod = targets.build(func, "llvm", cache=False)
    spans = _mappings(mod._lib._name)
    assert spans, "the module's library is not mapped"
    assert max(hi for _, hi in spans) - min(lo for lo, _ in spans) < 1 << 31
    entry = mod._address("tilecraft_fn_main")
    assert any(lo <= entry < hi for lo, hi in spans)
    # the thread pool is the process-wide library's, not a copy in the module
    assert compiler._RUNTIME_LIBRARY is not None
    a = np.random.default_rng(0).standard_normal((19, 64)).astype("float32")
    b = np.empty_like(a)
    mod["main"](a, b)
    np.testing.assert_allclose(b, _oracle(a, coefs), rtol=1e-4, atol=1e-4)


def test_many_builds_in_a_fragmented_address_space():
    """Build 24 modules in one process, mapping 3 GiB of PROT_NONE address space after each
    (so that memory taken later lies far from memory taken earlier), then run them all."""
    rng = np.random.default_rng(1)
    holes, mods = [], []
    try:
        for j in range(24):
            func, coefs = _kernel(j)
            mods.append((targets.build(func, "llvm", cache=False), coefs))
            for _ in range(2):
                holes.append(mmap.mmap(-1, 3 << 29, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                                       prot=0))
        for j, (mod, coefs) in enumerate(mods):
            a = rng.standard_normal((16 + j, 64)).astype("float32")
            b = np.empty_like(a)
            mod["main"](a, b)
            np.testing.assert_allclose(b, _oracle(a, coefs), rtol=1e-4, atol=1e-4)
    finally:
        for h in holes:
            h.close()


def test_a_freed_module_unloads_its_library():
    func, _ = _kernel(2)
    mod = targets.build(func, "llvm", cache=False)
    path = mod._lib._name
    assert _mappings(path)
    del mod
    gc.collect()
    assert not _mappings(path)


def test_host_build_without_lld_is_a_toolchain_error(monkeypatch, tmp_path):
    func, _ = _kernel(0)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(targets.ToolchainError, match="ld.lld was not found on PATH.*Install lld"):
        targets.build(func, "llvm", cache=False)


def test_host_library_with_either_linker(monkeypatch):
    """GNU ld.bfd (preferred where installed: it starts faster) and ld.lld link host libraries
    that give the same results."""
    rng = np.random.default_rng(2)
    func, coefs = _kernel(5)
    a = rng.standard_normal((21, 64)).astype("float32")
    outs = {}
    linkers = [p for p in (shutil.which("ld.bfd"), toolchain.find_lld()) if p]
    for linker in linkers:
        monkeypatch.setattr(compiler, "find_host_linker", lambda linker=linker: linker)
        mod = targets.build(func, "llvm", cache=False)
        outs[linker] = np.empty_like(a)
        mod["main"](a, outs[linker])
        np.testing.assert_allclose(outs[linker], _oracle(a, coefs), rtol=1e-4, atol=1e-4)
    for b in outs.values():
        np.testing.assert_array_equal(b, outs[linkers[0]])


def test_warm_build_loads_the_library_from_the_cache(tmp_path, monkeypatch):
    """A build whose objects were linked before copies the library from the kernel cache (no
    linker run); each module gets its own copy, so their globals (thread count, last error)
    stay apart."""
    func, coefs = _kernel(4)
    first = targets.build(func, "llvm", cache=str(tmp_path))
    runs = []

    def no_link(cmd):
        runs.append(cmd)
        raise AssertionError(f"a warm build ran the linker: {cmd}")
    monkeypatch.setattr(toolchain, "_run", no_link)
    second = targets.build(func, "llvm", cache=str(tmp_path))
    assert not runs
    assert second._lib._name != first._lib._name
    assert second._address("tilecraft_fn_main") != first._address("tilecraft_fn_main")
    first.num_threads, second.num_threads = 1, 2
    assert (first.num_threads, second.num_threads) == (1, 2)
    a = np.random.default_rng(3).standard_normal((20, 64)).astype("float32")
    for mod in (first, second):
        b = np.empty_like(a)
        mod["main"](a, b)
        np.testing.assert_allclose(b, _oracle(a, coefs), rtol=1e-4, atol=1e-4)
