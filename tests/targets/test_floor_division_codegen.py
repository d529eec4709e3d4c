"""Integer floor division through the three generators (LLVM, OpenCL C, WGSL) vs numpy.

Every generator asks ``tensorir.arith`` whether a ``floordiv`` / ``floormod`` may be its
truncating division (both operands provably >= 0) and otherwise emits the general form. The
cases are the ones where the generators' former tests disagreed:

* negative operands: data of both signs, negative constant divisors;
* a scalar parameter as the divisor, which may be negative (OpenCL C took every scalar for a
  size >= 0 and divided truncating: wrong for ``d < 0``);
* symbolic extents: a shape size as the divisor, a dividend that goes negative with it;
* a narrowing cast (LLVM called ``int8(i)`` non-negative because ``i`` is: wrong for
  ``i >= 128``);
* vector lanes: the same expressions in a vectorized loop.
"""
import numpy as np
import pytest

from opencl_testutil import opencl_device_and_target
from tilecraft import targets
from tilecraft.tensorir import Schedule, te
from webgpu_testutil import webgpu_device

N = 300


def _func(kind: str):
    n = te.var("n")
    d = te.var("d", "int32")
    A = te.placeholder((n,), "int32", "A")
    outs = [
        te.compute((n,), lambda i: (A[i] - 50) // 7 + (A[i] - 50) % 7 * 1000, "data"),
        te.compute((n,), lambda i: (A[i] // -3) * 1000 + A[i] % -3, "neg_divisor"),
        te.compute((n,), lambda i: (i.astype("int32") // d) * 1000 + i.astype("int32") % d,
                   "scalar_divisor"),
        te.compute((n,), lambda i: ((i * 5 - n * 2) // n).astype("int32") * 1000 +
                   ((i * 5) // n).astype("int32"), "shape_divisor"),
        te.compute((n,), lambda i: (i.astype("int8") // te.const(2, "int8")).astype("int32") +
                   (i.astype("int8") % te.const(3, "int8")).astype("int32") * 1000, "narrow"),
        te.compute((n,), lambda i: ((i - 37) // 4).astype("int32") * 1000 +
                   ((i - 37) % -3).astype("int32"), "lanes"),
    ]
    sch = Schedule(te.create_prim_func([A] + outs + [d]))
    for o in outs:
        (i,) = sch.get_loops(sch.get_block(o.name))
        io, ii = sch.split(i, [None, 8])
        if o.name == "lanes" or kind == "llvm":
            sch.vectorize(ii)
        if kind != "llvm":
            bx, tx = sch.split(io, [None, 16])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
    return sch.mod["main"], [o.name for o in outs]


def _expected(name: str, a: np.ndarray, d: int) -> np.ndarray:
    i = np.arange(N, dtype=np.int64)
    a = a.astype(np.int64)
    return {
        "data": (a - 50) // 7 + (a - 50) % 7 * 1000,
        "neg_divisor": (a // -3) * 1000 + a % -3,
        "scalar_divisor": (i // d) * 1000 + i % d,
        "shape_divisor": ((i * 5 - N * 2) // N) * 1000 + (i * 5) // N,
        "narrow": (i.astype(np.int8) // np.int8(2)).astype(np.int64) +
        (i.astype(np.int8) % np.int8(3)).astype(np.int64) * 1000,
        "lanes": ((i - 37) // 4) * 1000 + (i - 37) % -3,
    }[name]


def _device(kind):
    if kind == "opencl":
        return opencl_device_and_target()
    if kind == "webgpu":
        return webgpu_device(), "webgpu"
    return targets.cpu(0), "llvm"


@pytest.mark.parametrize("kind", ["llvm", "opencl", "webgpu"])
def test_floor_division_matches_numpy(kind):
    dev, target = _device(kind)
    func, names = _func(kind)
    mod = targets.build(func, target)
    a = np.random.default_rng(0).integers(-100, 100, N).astype("int32")
    for d in (-3, 5, -1):
        outs = [targets.array(np.zeros(N, "int32"), dev) for _ in names]
        mod["main"](targets.array(a, dev), *outs, d)
        for name, o in zip(names, outs):
            np.testing.assert_array_equal(o.numpy(), _expected(name, a, d),
                                          err_msg=f"{kind}: {name}, d = {d}")


def _source(kind, compute):
    n = te.var("n")
    A = te.placeholder((n,), "int32", "A")
    B = te.compute((n,), lambda i: compute(A, i, n), "B")
    sch = Schedule(te.create_prim_func([A, B]))
    (i,) = sch.get_loops(sch.get_block("B"))
    bx, tx = sch.split(i, [None, 32])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return targets.build(sch.mod["main"], kind).get_source()


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_gpu_source_divides_truncating_only_where_operands_are_nonneg(kind):
    # indices and sizes are >= 0: the language's division, no helper
    src = _source(kind, lambda A, i, n: A[(i * 7) // n] + A[(i * 3) % n])
    assert "tc_floordiv" not in src and "tc_floormod" not in src
    # data may be negative: the helper, printed from arith.floor_divmod_general
    src = _source(kind, lambda A, i, n: A[i] // 4 + A[i] % n.astype("int32"))
    assert "tc_floordiv" in src and "tc_floormod" in src
    decl = "int r = (a % b);" if kind == "opencl" else "let r: i32 = select(a % b, 0i, b == 0i);"
    assert decl in src
