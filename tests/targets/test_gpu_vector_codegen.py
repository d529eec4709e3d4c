"""Vector code of the C-style GPU generator (targets.gpu_codegen) on OpenCL (PoCL in CI): a
vectorized loop whose store is strided (a transpose) loads one vector and stores its lanes; a
load at a provable multiple of 4 elements is an aligned float4 access; shared arrays are
declared 16-byte aligned. Results against numpy."""
import numpy as np

from tilecraft import targets
from opencl_testutil import opencl_device
from tilecraft.tensorir import Schedule, te


def test_transpose_loads_vectors_and_stores_lanes():
    dev = opencl_device()
    A = te.placeholder((64, 64), "float32", "A")
    B = te.compute((64, 64), lambda j, i: A[i, j], "B")
    sch = Schedule(te.create_prim_func([A, B]))
    j, i = sch.get_loops(sch.get_block("B"))
    sch.reorder(i, j)
    jo, jv = sch.split(j, [None, 4])
    sch.bind(i, "blockIdx.x")
    sch.bind(jo, "threadIdx.x")
    sch.vectorize(jv)
    mod = targets.build(sch.mod["main"], "opencl")
    assert "(__global const float4*)" in mod.source     # A[i, 4 t .. 4 t + 3]: aligned
    assert ".s3;" in mod.source                           # B[4 t + 3, i] from lane 3
    a = np.random.default_rng(0).standard_normal((64, 64)).astype("float32")
    b = targets.empty((64, 64), "float32", dev)
    mod["main"](targets.array(a, dev), b)
    np.testing.assert_array_equal(b.numpy(), a.T)


def test_unaligned_vector_load_keeps_vload():
    dev = opencl_device()
    A = te.placeholder((260,), "float32", "A")
    B = te.compute((256,), lambda i: A[i + 1] * 2.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    (i,) = sch.get_loops(sch.get_block("B"))
    io, t, v = sch.split(i, [None, 16, 4])
    sch.bind(io, "blockIdx.x")
    sch.bind(t, "threadIdx.x")
    sch.vectorize(v)
    mod = targets.build(sch.mod["main"], "opencl")
    assert "vload4" in mod.source and "(__global const float4*)" not in mod.source
    a = np.arange(260, dtype="float32")
    b = targets.empty((256,), "float32", dev)
    mod["main"](targets.array(a, dev), b)
    np.testing.assert_array_equal(b.numpy(), a[1:257] * 2)
