"""A Select evaluates both operands in generated code (LLVM ``select``, vector lanes, WGSL
``select()``): a load clamped into bounds inside a Select branch must stay clamped through
lowering. On the CPU the input sits right before an unreadable page, so an out-of-bounds
read crashes the (child) process instead of passing silently."""
import os
import subprocess
import sys
import textwrap

import pytest

from tilecraft import targets
from tilecraft import tensorir as T
from tilecraft.tensorir import Schedule, te

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _clamped_select(n_in: int, n_out: int):
    A = te.placeholder((n_in,), "float32", "A")
    B = te.compute((n_out,), lambda i: T.Select(i < n_in, A[T.Min(i, n_in - 1)],
                                                T.const(0.0, "float32")), "B")
    return te.create_prim_func([A, B])


_GUARD_PAGE_SCRIPT = textwrap.dedent("""
    import ctypes, mmap, sys
    import numpy as np
    from tilecraft import targets
    from tilecraft import tensorir as T
    from tilecraft.tensorir import Schedule, te

    n_in, n_out, vector = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    A = te.placeholder((n_in,), "float32", "A")
    B = te.compute((n_out,), lambda i: T.Select(i < n_in, A[T.Min(i, n_in - 1)],
                                                T.const(0.0, "float32")), "B")
    sch = Schedule(te.create_prim_func([A, B]))
    if vector:
        (loop,) = sch.get_loops(sch.get_block("B"))
        sch.vectorize(sch.split(loop, [None, 8])[1])
    mod = targets.build(sch.mod["main"], "llvm")
    page = mmap.PAGESIZE
    mem = mmap.mmap(-1, 2 * page)
    libc = ctypes.CDLL(None, use_errno=True)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    assert libc.mprotect(ctypes.c_void_p(base + page), ctypes.c_size_t(page), 0) == 0
    a = np.frombuffer(mem, "float32", n_in, page - 4 * n_in)   # ends where the guard begins
    a[:] = np.random.default_rng(n_in).standard_normal(n_in)
    b = np.full(n_out, np.nan, "float32")
    mod["main"](a, b)
    idx = np.arange(n_out)
    want = np.where(idx < n_in, a[np.minimum(idx, n_in - 1)], 0).astype("float32")
    np.testing.assert_array_equal(b, want)
    print("ok")
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect guard page: Linux only")
@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vectorized"])
def test_llvm_clamped_load_in_select_stays_in_bounds(vector):
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _GUARD_PAGE_SCRIPT, "13", "40",
                        "1" if vector else "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, \
        f"rc={r.returncode} (-11: read past the end of A)\n{r.stdout}\n{r.stderr[-2000:]}"


def _gpu_source(kind: str) -> str:
    sch = Schedule(_clamped_select(8, 64))
    (loop,) = sch.get_loops(sch.get_block("B"))
    bx, tx = sch.split(loop, [None, 32])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return targets.build(sch.mod["main"], kind).get_source()


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_gpu_source_keeps_the_clamp(kind):
    src = _gpu_source(kind)
    load = "b_A[min(" if kind == "webgpu" else "A[min("
    assert load in src, src
