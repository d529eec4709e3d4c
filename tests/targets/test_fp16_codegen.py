"""float16 code generation on the GPU back ends, against numpy's float16 arithmetic.

OpenCL ``Target("opencl")`` keeps float16 as a storage format (``vload_half`` /
``vstore_half_rte``, core OpenCL 1.2, so it runs on PoCL and on NVIDIA's driver, neither of which
reports ``cl_khr_fp16``) and computes in float, rounding every float16 result as numpy does:
the results must be bit-identical. ``Target("opencl -supports-float16=1")`` computes in ``half``
(``half4`` vectors) and needs ``cl_khr_fp16``: where the device lacks it, the clear error.
WebGPU computes in ``f16`` with ``shader-f16`` (lavapipe has it). The LLVM side (F16C and
software conversions on x86, ``+fullfp16`` on AArch64) is in ``test_llvm_codegen.py`` and
``tests/rpc/test_rpc_board_fp16.py``.
"""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import Schedule, te

from opencl_testutil import opencl_device
from webgpu_testutil import bind_1d, webgpu_device


def special_halves(rng, n):
    """Random float16 values with the hard cases among them: subnormals, the largest finite
    values, ties of float32 -> float16 rounding, signed zeros, infinities and NaN."""
    x = rng.standard_normal(n).astype("float32") * 8
    x[:12] = [0.0, -0.0, 6e-8, -3e-6, 65504.0, 65519.0, 65520.0, -70000.0,
              np.inf, -np.inf, np.nan, 1.0 + 2.0 ** -11]   # 65520 and beyond -> inf; a tie
    return x


def elementwise(vector_lanes=None, offset=0):
    """F = A * B + A / (|B| + 1) on float16 (vectorized by ``vector_lanes``, reading A from
    ``offset``), D = float32(F - float16(C)) and E = float16(C) with C float32: every float16
    operation, the conversions and their rounding."""
    n = 256
    A = te.placeholder((n + offset,), "float16", "A")
    B = te.placeholder((n,), "float16", "B")
    C = te.placeholder((n,), "float32", "C")
    F = te.compute((n,), lambda i: A[i + offset] * B[i] + A[i + offset] /
                   (te.abs(B[i]) + te.const(1.0, "float16")), "F")
    D = te.compute((n,), lambda i: (F[i] - C[i].astype("float16")).astype("float32"), "D")
    E = te.compute((n,), lambda i: C[i].astype("float16"), "E")
    sch = Schedule(te.create_prim_func([A, B, C, F, D, E]))
    for name in ("F", "D", "E"):
        (i,) = sch.get_loops(sch.get_block(name))
        if vector_lanes and name == "F":
            bx, tx, v = sch.split(i, [None, 16, vector_lanes])
            sch.vectorize(v)
        else:
            bx, tx = sch.split(i, [None, 16])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return sch.mod["main"], n


def reference(a, b, c, offset=0):
    a = a[offset:]
    with np.errstate(all="ignore"):
        f = a * b + a / (np.abs(b) + np.float16(1))
        return f, (f - c.astype("float16")).astype("float32"), c.astype("float16")


def assert_same_halves(got, want):
    """Bit-identical float16 (any NaN for a NaN: drivers differ in the payload)."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view("uint16")[~nan], want.view("uint16")[~nan])


def run(mod, dev, a, b, c, n):
    f, d = targets.empty((n,), "float16", dev), targets.empty((n,), "float32", dev)
    e = targets.empty((n,), "float16", dev)
    mod["main"](targets.array(a, dev), targets.array(b, dev), targets.array(c, dev), f, d, e)
    return f.numpy(), d.numpy(), e.numpy()


@pytest.mark.parametrize("lanes,offset", [(None, 0), (4, 0), (4, 1), (8, 0)],
                         ids=["scalar", "vec4-aligned", "vec4-unaligned", "vec8"])
def test_opencl_float16_storage_matches_numpy_bit_for_bit(lanes, offset, rng):
    dev = opencl_device()
    func, n = elementwise(lanes, offset)
    mod = targets.build(func, "opencl")
    src = mod.get_source()
    assert "cl_khr_fp16" not in src and "half*" in src and "vstore_half" in src
    if lanes:
        assert f"vload{'a' if offset == 0 else ''}_half{lanes}" in src
    a = rng.standard_normal(n + offset).astype("float16") * np.float16(4)
    b = rng.standard_normal(n).astype("float16")
    c = special_halves(rng, n)
    got = run(mod, dev, a, b, c, n)
    want = reference(a, b, c, offset)
    assert_same_halves(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert_same_halves(got[2], want[2])


def test_opencl_float16_math_rounds_once(rng):
    dev = opencl_device()
    A = te.placeholder((128,), "float16", "A")
    B = te.compute((128,), lambda i: te.exp(A[i]) + te.sqrt(te.abs(A[i])), "B")
    func = bind_1d(te.create_prim_func([A, B]), "B").mod["main"]
    mod = targets.build(func, "opencl")
    x = rng.uniform(-3, 3, 128).astype("float16")
    b = targets.empty((128,), "float16", dev)
    mod["main"](targets.array(x, dev), b)
    xf = x.astype("float32")
    want = (np.exp(xf).astype("float16") + np.sqrt(np.abs(xf)).astype("float16"))
    # exp and sqrt in float then rounded: within one float16 ulp of numpy's
    ulp = np.spacing(np.abs(want)).astype("float32")
    assert np.all(np.abs(b.numpy().astype("float32") - want.astype("float32")) <= ulp)


def test_opencl_native_half_uses_half_vectors_and_needs_the_extension(rng):
    from tilecraft.targets.opencl_backend.runtime import OpenCLError, context
    dev = opencl_device()
    func, n = elementwise(4)
    mod = targets.build(func, "opencl -supports-float16=1")
    src = mod.get_source()
    assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in src
    assert "half4" in src and "tc_round_half" not in src and "vload_half" not in src
    a = rng.standard_normal(n).astype("float16")
    b = rng.standard_normal(n).astype("float16")
    c = special_halves(rng, n)
    if "cl_khr_fp16" in context(dev.index).extensions:
        got = run(mod, dev, a, b, c, n)
        want = reference(a, b, c)
        assert_same_halves(got[2], want[2])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-3, atol=1e-3)
    else:
        with pytest.raises(OpenCLError, match="needs the cl_khr_fp16 extension.*"
                                              "Target\\('opencl'\\)"):
            run(mod, dev, a, b, c, n)


def test_webgpu_f16_arithmetic_matches_numpy(rng):
    from tilecraft.targets.webgpu_backend import runtime
    from tilecraft.targets.webgpu_backend.wgsl import WebGPUBuildError
    dev = webgpu_device()
    func, n = elementwise()
    with pytest.raises(WebGPUBuildError, match="shader-f16 feature; build for "
                                               "Target\\('webgpu -supports-float16=1'\\)"):
        targets.build(func, "webgpu")
    if "shader-f16" not in runtime.adapter_features(dev.index):
        pytest.skip("the adapter has no shader-f16")
    mod = targets.build(func, "webgpu -supports-float16=1")
    runtime.close_device(dev.index)   # reopen: the device now asks for shader-f16
    a = rng.standard_normal(n).astype("float16") * np.float16(4)
    b = rng.standard_normal(n).astype("float16")
    c = rng.standard_normal(n).astype("float32") * 8      # finite: WGSL may flush the rest
    got = run(mod, dev, a, b, c, n)
    want = reference(a, b, c)
    # WGSL lets a GPU contract a * b + c into one fma and divide within 2.5 ULP (NVIDIA's
    # Vulkan driver does both; lavapipe rounds each operation as numpy does): the arithmetic is
    # checked to a few float16 ULPs, the conversion bit for bit
    np.testing.assert_allclose(got[0], want[0], rtol=4 * 2.0 ** -10, atol=2.0 ** -14)
    assert_same_halves(got[2], want[2])
    # D reads F back from memory: one float16 subtraction of the kernel's own F, exact
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got[1], (got[0] - c.astype("float16")).astype("float32"))
