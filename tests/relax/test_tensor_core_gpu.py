"""The tensor-core fp16 GEMM of NVIDIA OpenCL (``relax.backend.gpu.tensor_core``): whole
kernels — indexing, fragment layouts, epilogues, symbolic rows, edges — against numpy on random
data.

Without an NVIDIA GPU (PoCL in CI) the kernels are built for ``Target("opencl
-device=nvidia-emulated")``: the same kernels with the mma computed by portable OpenCL C
(``targets.opencl_backend.tensor_core``), so only the PTX text itself is left to the GPU
machine, where ``TILECRAFT_TC_DEVICE=nvidia`` runs this file on the real driver
(``Target("opencl -device=nvidia")``, inline ``mma.sync``; ``benchmarks/lowp_device.sh``);
``tests/targets/test_opencl_tensor_core.py`` checks one mma and the pack intrinsics alone.
"""
import math
import os

import numpy as np
import pytest

from gpu_testutil import (build_logging_misses, conv2d_nchw_reference, emitted_module,
                          tensor_core_device)
from tilecraft import relax, targets
from tilecraft.relax import const, op
from tilecraft.relax.op import nn
from tilecraft.targets import Target
from tilecraft.targets.opencl_backend import tensor_core as tc_text
from tilecraft.tensorir import expr as E
from tilecraft.tensorir import te
from tilecraft.tensorir.functor import IRMutator
from tilecraft.tensorir.stmt import Evaluate, SeqStmt
from tilecraft.tensorir.transform.device import is_barrier
from tilecraft.relax.backend.gpu import tensor_core as tc

REAL = os.environ.get("TILECRAFT_TC_DEVICE", "") == "nvidia"
TARGET = "opencl -device=nvidia" if REAL else "opencl -device=nvidia-emulated"
_erf = np.vectorize(math.erf)


@pytest.fixture(scope="module")
def dev():
    return tensor_core_device(REAL)


def _h(x):
    """``x`` rounded to float16, as float64 (the kernel's operands)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)


def _build(params, body, upper):
    mod16 = relax.quantize(emitted_module(params, body), "fp16")
    return build_logging_misses(mod16, TARGET, upper, "tensor-core GEMM")


def _uses_tensor_cores(exe) -> int:
    src = exe.kernel_module.get_source()
    return src.count(tc_text.MMA_PTX.split(" ")[0]) if REAL else src.count("tc_mma_emulated(")


def _check(got, ref, tol):
    err = np.abs(got.astype(np.float64) - ref).max() / (np.abs(ref).max() + 1e-30)
    assert err < tol, f"relative error {err}"


def test_dense_bias_gelu_cast_symbolic_rows(dev):
    """A BERT feed-forward layer: (batch, seq, K) x (K, N) + bias, GELU, float16 out (into the
    next dense layer), beside a second dense layer of the same input (so that the input's cast
    to float16 is a kernel of its own, as in BERT; fused into the GEMM it is a fall-back)."""
    K, N = 64, 128
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, N)).astype(np.float32) / 8
    w2 = rng.standard_normal((N, 32)).astype(np.float32) / 8
    w3 = rng.standard_normal((K, 64)).astype(np.float32) / 8
    bias = rng.standard_normal(N).astype(np.float32)

    def body(e, x):
        hidden = e(nn.gelu(e(op.add(e(op.matmul(x, const(w))), const(bias)))))
        return e(op.matmul(hidden, const(w2))), e(op.matmul(x, const(w3)))
    exe, misses = _build([("x", ("b", "s", K), "float32")], body, {"b": 2, "s": 80})
    assert _uses_tensor_cores(exe) >= 3, misses
    vm = relax.VirtualMachine(exe, dev)
    for b, s in ((1, 5), (2, 37), (1, 80)):
        x = rng.standard_normal((b, s, K)).astype(np.float32)
        y = _h(x) @ _h(w) + bias
        hidden = _h(0.5 * y * (1 + _erf(y / np.sqrt(2))))    # stored as float16
        got = vm["main"](x)
        _check(got[0].numpy(), hidden @ _h(w2), 3e-3)
        _check(got[1].numpy(), _h(x) @ _h(w3), 3e-3)


def test_dense_residual_and_transposed_weight(dev):
    """``x @ Wᵀ + bias + residual`` with W a (N, K) parameter (B read as ``(j, k)``), N not a
    multiple of the work-group tile (72), K a multiple of 16 only (48: k-step 16)."""
    K, N = 48, 72
    rng = np.random.default_rng(1)
    bias = rng.standard_normal(N).astype(np.float32)
    exe, misses = _build(
        [("x", ("n", K), "float32"), ("w", (N, K), "float32"), ("r", ("n", N), "float32")],
        lambda e, x, w, r: e(op.add(e(op.add(e(op.matmul(x, e(op.permute_dims(w, (1, 0))))),
                                             const(bias))), r)),
        {"n": 140})
    assert _uses_tensor_cores(exe) >= 1, misses
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 33, 140):
        x = rng.standard_normal((n, K)).astype(np.float32)
        w = rng.standard_normal((N, K)).astype(np.float32)
        r = rng.standard_normal((n, N)).astype(np.float32)
        ref = _h(x) @ _h(w).T + bias + r
        _check(vm["main"](x, w, r).numpy(), ref, 3e-3)


def test_batch_matmul(dev):
    """(2, 3, s, 64) x (2, 3, 64, 32): batch dims both inputs read (blockIdx.z). (A symbolic
    batch of two parameters is two symbolic dims checked equal at run time: a fall-back.)"""
    rng = np.random.default_rng(2)
    exe, misses = _build([("q", (2, 3, "s", 64), "float32"), ("k", (2, 3, 64, 32), "float32")],
                         lambda e, q, k: e(op.matmul(q, k)), {"s": 24})
    assert _uses_tensor_cores(exe) >= 1, misses
    vm = relax.VirtualMachine(exe, dev)
    for s in (7, 24):
        q = rng.standard_normal((2, 3, s, 64)).astype(np.float32)
        k = rng.standard_normal((2, 3, 64, 32)).astype(np.float32)
        _check(vm["main"](q, k).numpy(), _h(q) @ _h(k), 2e-3)


def _check_matmul(dev, K, N, rng, rows, min_kernels):
    """``x @ W`` over a symbolic row count (up to ``max(rows)``) on the tensor-core target:
    at least ``min_kernels`` tensor-core kernels, each row count against numpy."""
    w = rng.standard_normal((K, N)).astype(np.float32)
    exe, misses = _build([("x", ("n", K), "float32")], lambda e, x: e(op.matmul(x, const(w))),
                         {"n": max(rows)})
    assert _uses_tensor_cores(exe) >= min_kernels, misses
    vm = relax.VirtualMachine(exe, dev)
    for n in rows:
        x = rng.standard_normal((n, K)).astype(np.float32)
        _check(vm["main"](x).numpy(), _h(x) @ _h(w), 2e-3)


@pytest.mark.parametrize("tile", ["128x128x64x32", "128x128x64x64", "64x128x32x64",
                                  "32x64x32x32"])
def test_tiles(dev, tile, monkeypatch):
    """Each work-group / warp tile on one GEMM, rows 1 to past two tiles."""
    monkeypatch.setenv("TILECRAFT_TC_TILE", tile)
    _check_matmul(dev, 32, 128, np.random.default_rng(3), (1, 129, 300), min_kernels=1)


def test_small_and_large_row_kernels(dev):
    """A symbolic row count gets two kernels chosen per call where their tiles differ (768
    columns: 32 x 64 below TC_SMALL_ROWS rows, 64 x 128 from there on)."""
    _check_matmul(dev, 32, 768, np.random.default_rng(5),
                  (3, tc.TC_SMALL_ROWS - 1, tc.TC_SMALL_ROWS, 600), min_kernels=2)


def test_bert_layer_end_to_end(dev):
    """A (narrow) BERT encoder layer through relax.quantize(mod, "fp16"): its dense layers and
    its attention's batch matmuls on the tensor cores, against the model's float64 reference."""
    from tilecraft.models import bert_encoder_layer
    model = bert_encoder_layer(hidden=64, heads=2, ffn=128, seed=6)
    exe = relax.build(relax.quantize(model.mod, "fp16"), TARGET,
                      upper_bounds={"batch": 2, "seq_len": 40})
    assert _uses_tensor_cores(exe) >= 4
    vm = relax.VirtualMachine(exe, dev)
    rng = np.random.default_rng(7)
    for batch, seq in ((1, 16), (2, 37)):
        x, = model.make_inputs(rng, batch=batch, seq_len=seq)
        _check(vm["main"](x).numpy(), model.reference(x), 2e-3)


def test_k_not_a_multiple_of_16(dev):
    """K = 20: both operands gathered half by half, the k tail zero-filled."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((20, 64)).astype(np.float32)
    exe, misses = _build([("x", ("n", 20), "float32")], lambda e, x: e(op.matmul(x, const(w))),
                         {"n": 16})
    assert _uses_tensor_cores(exe) >= 1, misses
    x = rng.standard_normal((9, 20)).astype(np.float32)
    _check(relax.VirtualMachine(exe, dev)["main"](x).numpy(), _h(x) @ _h(w), 2e-3)


def test_not_a_tensor_core_gemm_falls_back(dev):
    """A matrix-vector product (a 1-D output: no outer product): the default schedule, named
    under TILECRAFT_DEBUG_SCHEDULES, and the same results."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal(32).astype(np.float32)
    exe, misses = _build([("x", ("n", 32), "float32")], lambda e, x: e(op.matmul(x, const(w))),
                         {"n": 16})
    assert _uses_tensor_cores(exe) == 0
    assert any("does not apply" in m and "matmul" in m for m in misses), misses
    x = rng.standard_normal((9, 32)).astype(np.float32)
    _check(relax.VirtualMachine(exe, dev)["main"](x).numpy(), _h(x) @ _h(w), 2e-3)


def test_dense_with_its_input_cast_fused(dev):
    """The input's float32 -> float16 cast fused into the GEMM (its only consumer): A gathered
    (converted half by half), B as a (K, N) weight."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    exe, misses = _build([("x", ("n", 64), "float32")], lambda e, x: e(op.matmul(x, const(w))),
                         {"n": 70})
    assert _uses_tensor_cores(exe) >= 1, misses
    vm = relax.VirtualMachine(exe, dev)
    for n in (5, 70):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        _check(vm["main"](x).numpy(), _h(x) @ _h(w), 2e-3)


_conv_ref = conv2d_nchw_reference


@pytest.mark.parametrize("kernel,stride,pad,size", [(1, 1, 0, 8), (1, 1, 0, 10), (3, 2, 1, 10),
                                                   (3, 1, 1, 10)])
def test_convolution_implicit_gemm(dev, kernel, stride, pad, size):
    """NCHW convolutions + bias + ReLU as implicit GEMMs (the weights as A, the input as B)
    through ``relax.build`` at batch 1, 2 (the few-columns kernel) and 5 (the many-columns
    one): 1 x 1 on an 8 x 8 and a 10 x 10 image,
    3 x 3 stride 2 and 3 x 3 stride 1 (the padded window gathered; stride 1 may go to Winograd
    in the GPU pipeline instead: then only the results are checked)."""
    rng = np.random.default_rng(9)
    C, O = 16, 32
    w = (rng.standard_normal((O, C, kernel, kernel)) / kernel).astype(np.float32)
    bias = rng.standard_normal((1, O, 1, 1)).astype(np.float32)
    exe, misses = _build(
        [("x", ("n", C, size, size), "float32"), ("y", ("n", C, size, size), "float32")],
        # (the input also feeds a second use, so that its cast is a kernel of its own, as in
        # a network where each activation is float16 already)
        lambda e, x, y: (e(nn.relu(e(op.add(e(nn.conv2d(e(op.add(x, y)), const(w),
                                                       strides=stride, padding=pad)),
                                            const(bias))))), e(op.add(x, y))),
        {"n": 5})
    if (kernel, stride) != (3, 1):
        assert _uses_tensor_cores(exe) >= 2, misses      # the few- and many-columns kernels
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 2, 5):
        x = rng.standard_normal((n, C, size, size)).astype(np.float32)
        y = rng.standard_normal((n, C, size, size)).astype(np.float32)
        got = vm["main"](x, y)[0].numpy()
        x = x + y
        ref = np.maximum(_conv_ref(_h(x), _h(w), stride, pad) + bias, 0)
        _check(got, ref, 3e-3)


def conv_func(C, O, size, kernel, stride, pad, out_dtype="float32", residual=True,
              weight_layout="OIHW"):
    """``relu(conv2d(x, w) + bias (+ residual))`` on NCHW float16 ``x`` (a symbolic batch),
    the padding a producer inlined into the window (as a legalized Relax convolution has it),
    float32 bias and residual, ``out_dtype`` output: the fused function the tensor-core
    kernel takes. ``weight_layout="OHWI"``: ``w`` is ``(O, KH, KW, C)``, as
    ``ConvWeightOHWI`` stores a constant weight."""
    n = te.var("n")
    x = te.placeholder((n, C, size, size), "float16", "x")
    ohwi = weight_layout == "OHWI"
    w = te.placeholder((O, kernel, kernel, C) if ohwi else (O, C, kernel, kernel), "float16",
                       "w")
    bias = te.placeholder((O,), "float32", "bias")
    osz = (size + 2 * pad - kernel) // stride + 1
    res = te.placeholder((n, O, osz, osz), "float32", "res")
    xp = te.compute((n, C, size + 2 * pad, size + 2 * pad), lambda b, c, h, v: te.if_then_else(
        te.all(h >= pad, h < size + pad, v >= pad, v < size + pad), x[b, c, h - pad, v - pad],
        te.const(0.0, "float16")), "pad") if pad else x
    c = te.reduce_axis((0, C), "c")
    r = te.reduce_axis((0, kernel), "r")
    q = te.reduce_axis((0, kernel), "q")
    y = te.compute((n, O, osz, osz), lambda b, o, h, v: te.sum(
        (w[o, r, q, c] if ohwi else w[o, c, r, q]).astype("float32") *
        xp[b, c, h * stride + r, v * stride + q].astype("float32"), axis=[c, r, q]), "conv")

    def epilogue(b, o, h, v):
        val = y[b, o, h, v] + bias[o]
        if residual:
            val = val + res[b, o, h, v]
        val = te.maximum(val, te.const(0.0, "float32"))
        return val.astype(out_dtype) if out_dtype != "float32" else val
    out = te.compute((n, O, osz, osz), epilogue, "out")
    return te.create_prim_func([x, w, bias, res, out] if residual else [x, w, bias, out])


# ResNet-50's convolution geometries at small channel counts: 3 x 3 pad 1 stride 1 and 2,
# 1 x 1 stride 1 (16-byte runs where H x W is a multiple of 8, else gathered) and 2, the 7 x 7
# stride 2 pad 3 stem (3 channels: K = 147, the tail zero-filled); odd image sizes; channels
# 16 (k-steps of 16), 32 and 48 (k-steps of 32, 16)
CONV_CASES = [
    # C, O, size, kernel, stride, pad, out dtype
    (32, 64, 14, 3, 1, 1, "float16"),
    (16, 32, 7, 3, 1, 1, "float32"),
    (48, 32, 10, 3, 2, 1, "float16"),
    (32, 32, 7, 3, 2, 1, "float32"),
    (64, 96, 7, 1, 1, 0, "float16"),
    (32, 64, 14, 1, 1, 0, "float32"),
    (16, 32, 8, 1, 1, 0, "float32"),
    (32, 64, 10, 1, 2, 0, "float16"),
    (3, 16, 10, 7, 2, 3, "float32"),
]


@pytest.mark.parametrize("C,O,size,kernel,stride,pad,out_dtype", CONV_CASES)
def test_convolution_geometries(dev, C, O, size, kernel, stride, pad, out_dtype):
    """Each geometry's tensor-core kernel (bias, residual, ReLU; float16 or float32 out) at
    batch 1, 3 (the few-columns kernel, where the column dispatch gives one) and 5 (the
    many-columns kernel) against numpy of the float16 operands."""
    t = Target(TARGET)
    func = conv_func(C, O, size, kernel, stride, pad, out_dtype)
    mod = targets.build(tc.tensor_core_kernel(func, t), t)
    rng = np.random.default_rng(C * 1000 + size * 10 + kernel)
    for n in (1, 3, 5):
        _run_conv(dev, mod, C, O, size, kernel, stride, pad, out_dtype, n, rng)


@pytest.mark.parametrize("tile", ["64x48x32x24", "128x128x64x64", "128x64x64x32"])
def test_convolution_tiles(dev, monkeypatch, tile):
    """A 3 x 3 convolution under tiles whose threads do not divide into the columns (64 x 48:
    a unit's column and k pair both vary with it) and that do (each thread's k pairs one run,
    stored 16 bytes at a time), at batch 1 and 3."""
    monkeypatch.setenv("TILECRAFT_TC_TILE", tile)
    test_convolution_geometries(dev, 32, 64, 10, 3, 1, 1, "float32")


@pytest.mark.parametrize("C,O,size,kernel,stride,pad,out_dtype", [
    (32, 64, 14, 3, 1, 1, "float16"), (48, 32, 10, 3, 2, 1, "float16"),
    (16, 32, 7, 3, 1, 1, "float32"), (64, 32, 9, 5, 2, 2, "float32")])
def test_convolution_ohwi_weight(dev, C, O, size, kernel, stride, pad, out_dtype):
    """An OHWI weight (``ConvWeightOHWI``'s) read as rows of K = KH * KW * C halves in 16-byte
    pieces (channels 16: k-steps of 16; 48: of 16 over 3 channel steps; 64: of 32 over 2),
    3 x 3 stride 1 and 2 and a 5 x 5, at batch 1 and 3 against numpy."""
    t = Target(TARGET)
    func = conv_func(C, O, size, kernel, stride, pad, out_dtype, weight_layout="OHWI")
    assert tc.match_fp16_gemm(func).a_mode == "rows"
    mod = targets.build(tc.tensor_core_kernel(func, t), t)
    rng = np.random.default_rng(C * 1000 + size * 10 + kernel + 1)
    for n in (1, 3):
        _run_conv(dev, mod, C, O, size, kernel, stride, pad, out_dtype, n, rng, "OHWI")


def _run_conv(dev, mod, C, O, size, kernel, stride, pad, out_dtype, n, rng,
              weight_layout="OIHW"):
    """``mod`` (a ``conv_func`` build) at batch ``n`` against numpy."""
    osz = (size + 2 * pad - kernel) // stride + 1
    x = rng.standard_normal((n, C, size, size)).astype(np.float16)
    w = (rng.standard_normal((O, C, kernel, kernel)) / kernel).astype(np.float16)
    bias = rng.standard_normal(O).astype(np.float32)
    res = rng.standard_normal((n, O, osz, osz)).astype(np.float32)
    y = targets.empty((n, O, osz, osz), out_dtype, dev)
    w_arg = np.ascontiguousarray(w.transpose(0, 2, 3, 1)) if weight_layout == "OHWI" else w
    mod["main"](targets.array(x, dev), targets.array(w_arg, dev), targets.array(bias, dev),
                targets.array(res, dev), y)
    ref = np.maximum(_conv_ref(x.astype(np.float64), w.astype(np.float64), stride, pad) +
                     bias[None, :, None, None] + res, 0)
    _check(y.numpy(), ref, 3e-3 if out_dtype == "float32" else 2e-3)


@pytest.fixture
def launches(monkeypatch):
    """The work-group sizes (threads) of the OpenCL kernels launched, in order."""
    from tilecraft.targets.opencl_backend import runtime
    seen = []
    original = runtime.LoadedProgram.launcher

    def launcher(self, name):
        launch = original(self, name)
        threads = math.prod(int(b) for b in self.blocks.get(name, (1, 1, 1)))

        def logged(*args, **kwargs):
            seen.append(threads)
            return launch(*args, **kwargs)
        return logged
    monkeypatch.setattr(runtime.LoadedProgram, "launcher", launcher)
    return seen


# (C, O, size, kernel, stride, pad, out dtype): a 3 x 3 layer (few columns: 32 x 32 tiles), a
# 3 x 3 with K = 1152 (both kernels split K: the partials' sum through the epilogue and the
# cast to float16), a 1 x 1
COLUMN_CASES = [(32, 64, 8, 3, 1, 1, "float32"), (128, 32, 7, 3, 1, 1, "float16"),
                (64, 128, 7, 1, 1, 0, "float16")]


@pytest.mark.parametrize("C,O,size,kernel,stride,pad,out_dtype", COLUMN_CASES)
def test_column_dispatch(dev, launches, C, O, size, kernel, stride, pad, out_dtype):
    """A convolution's symbolic batch (its columns) gets two kernels in one build: below
    ``TC_SMALL_COLUMNS_FACTOR`` x the columns at batch 1 the few-columns one (its tile of
    ``TC_SMALL_COLUMN_TILES``), from there on today's; the host launches the one of the call's
    batch (checked by the launched work-group's size), each against numpy."""
    t = Target(TARGET)
    func = conv_func(C, O, size, kernel, stride, pad, out_dtype)
    gm = tc.match_fp16_gemm(func)
    osz = (size + 2 * pad - kernel) // stride + 1
    assert tc.column_dispatch(gm) == osz * osz
    kernel_fn = tc.tensor_core_kernel(func, t)
    tiles = kernel_fn.attr_dict["tensor_core_tiles"]
    bound = tc.TC_SMALL_COLUMNS_FACTOR * osz * osz
    assert f"below {bound} columns" in tiles, tiles
    small = tc.choose_tile(O, osz * osz, tc.TC_SMALL_COLUMN_TILES)
    large = tc.choose_tile(O, tc.TC_NOMINAL_ROWS)
    assert small.warps != large.warps          # the launches tell the two apart
    splits = "split-K" in tiles
    mod = targets.build(kernel_fn, t)
    rng = np.random.default_rng(C + O + size)
    for n, tile in ((1, small), (3, small), (tc.TC_SMALL_COLUMNS_FACTOR, large), (5, large)):
        launches.clear()
        _run_conv(dev, mod, C, O, size, kernel, stride, pad, out_dtype, n, rng)
        assert launches[0] == 32 * tile.warps, (n, launches, tiles)
        assert len(launches) == (2 if splits else 1), (n, launches, tiles)


def test_column_dispatch_off(monkeypatch):
    """``TILECRAFT_TC_COLUMN_DISPATCH=0``: one kernel, today's; a conv whose many-columns kernel
    fills the GPU at batch 1 gets one kernel too."""
    t = Target("opencl -device=nvidia")
    func = conv_func(128, 512, 14, 3, 1, 1)
    assert "below" in tc.tensor_core_kernel(func, t).attr_dict["tensor_core_tiles"]
    monkeypatch.setenv("TILECRAFT_TC_COLUMN_DISPATCH", "0")
    assert tc.column_dispatch(tc.match_fp16_gemm(func)) is None
    assert "below" not in tc.tensor_core_kernel(func, t).attr_dict["tensor_core_tiles"]
    monkeypatch.delenv("TILECRAFT_TC_COLUMN_DISPATCH")
    # 256 x 3136 columns at batch 1: 392 work-groups of 32 x 64 already
    wide = tc.tensor_core_kernel(conv_func(64, 256, 56, 1, 1, 0), t)
    assert "below" not in wide.attr_dict["tensor_core_tiles"]


def test_symbolic_columns_matmul(dev, launches):
    """``W @ X`` with X of a symbolic column count: the few-columns kernel (sized for
    ``TC_SMALL_NOMINAL_ROWS`` columns, a lone symbolic dim) below
    ``TC_SMALL_COLUMNS_FACTOR`` times that, the many-columns one from there, with a bias and
    a float16 cast."""
    M, K = 64, 96
    n = te.var("n")
    W = te.placeholder((M, K), "float16", "W")
    X = te.placeholder((K, n), "float16", "X")
    bias = te.placeholder((M,), "float32", "bias")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, n), lambda i, j: te.sum(W[i, k].astype("float32") *
                                                X[k, j].astype("float32"), axis=k), "C")
    out = te.compute((M, n), lambda i, j: (C[i, j] + bias[i]).astype("float16"), "out")
    t = Target(TARGET)
    func = tc.tensor_core_kernel(te.create_prim_func([W, X, bias, out]), t)
    bound = tc.TC_SMALL_COLUMNS_FACTOR * tc.TC_SMALL_NOMINAL_ROWS
    assert f"below {bound} columns" in func.attr_dict["tensor_core_tiles"]
    small = tc.choose_tile(M, tc.TC_SMALL_NOMINAL_ROWS, tc.TC_SMALL_COLUMN_TILES)
    large = tc.choose_tile(M, tc.TC_NOMINAL_ROWS)
    mod = targets.build(func, t)
    rng = np.random.default_rng(11)
    w = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal(M).astype(np.float32)
    for cols in (1, 77, bound - 1, bound, bound + 45):
        x = rng.standard_normal((K, cols)).astype(np.float16)
        y = targets.empty((M, cols), "float16", dev)
        launches.clear()
        mod["main"](targets.array(w, dev), targets.array(x, dev), targets.array(b, dev), y)
        assert launches == [32 * (small if cols < bound else large).warps], (cols, launches)
        _check(y.numpy(), w.astype(np.float64) @ x.astype(np.float64) + b[:, None], 2e-3)


def _copy_section(src: str) -> str:
    """The k loop's copies of the next k-step (from the loop's head to its first barrier)."""
    loop = src[src.index("for (int kt = 0"):]
    return loop[:loop.index("barrier(")]


@pytest.mark.parametrize("kernel,stride,pad,size", [(3, 1, 1, 14), (3, 2, 1, 14),
                                                   (1, 1, 0, 7), (1, 2, 0, 14)])
def test_conv_copy_hoisted(kernel, stride, pad, size):
    """The gathered copies of a convolution (symbolic batch) divide nothing an element: a
    thread's pixel and a k-step's window position, its padding checks and base addresses are
    bound outside the units' loops, every index proven in bounds (no in-kernel check), and
    each word is two 16-bit loads packed (no float round trip)."""
    t = Target("opencl -device=nvidia")
    gm = tc.match_fp16_gemm(conv_func(64, 64, size, kernel, stride, pad))
    assert gm.b_mode == "gather"
    assert E.as_int(gm.extents[gm.k_vars[-1]]) == 64             # the channels fastest
    mod = targets.build(tc.tensor_core_kernel(conv_func(64, 64, size, kernel, stride, pad),
                                              t), t)
    src = mod.get_source()
    assert "kernel_error" not in src and "tc_pack_half2" not in src
    copy = _copy_section(src)
    units = [block.split("}")[0] for block in copy.split("for (int e = 0;")[1:]]
    gathered = [u for u in units if "b_stage[e] =" in u or ("a_stage[e] =" in u and
                                                            kernel > 1)]
    assert len(gathered) == (2 if kernel > 1 else 1), copy
    for unit in gathered:
        assert "/" not in unit and "%" not in unit, unit
        assert "ushort*" in unit


# -- without a device ----------------------------------------------------------------------------

def _dense_func(K=64, N=128):
    n = te.var("n")
    A = te.placeholder((n, K), "float16", "A")
    W = te.placeholder((K, N), "float16", "W")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((n, N), lambda i, j: te.sum(A[i, k].astype("float32") *
                                                W[k, j].astype("float32"), axis=k), "C")
    return te.create_prim_func([A, W, C])


def test_target_option():
    assert Target("opencl -device=nvidia").tensor_cores == "ptx"
    assert Target("opencl -device=nvidia-emulated").tensor_cores == "emulated"
    assert Target("opencl").tensor_cores is None
    assert Target("opencl -device=cpu").tensor_cores is None
    t = Target("opencl -device=nvidia")
    assert Target(str(t)) == t


def test_nvidia_source_has_the_ptx():
    t = Target("opencl -device=nvidia")
    mod = targets.build(tc.tensor_core_kernel(_dense_func(), t), t)
    src = mod.get_source()
    assert 'asm volatile("' + tc_text.MMA_PTX in src
    assert '"+f"(acc[' in src and "tc_mma_emulated" not in src
    # 16-byte global loads, or cp.async copies (TILECRAFT_TC_STAGES >= 2)
    assert "__global const uint4*" in src or tc_text.CP_ASYNC_PTX in src
    assert tc_text.REQUIREMENT in mod.extensions


def test_plain_opencl_refuses_the_intrinsics():
    kernel = tc.tensor_core_kernel(_dense_func(), Target("opencl -device=nvidia"))
    with pytest.raises(Exception, match="-device=nvidia"):
        targets.build(kernel, Target("opencl"))
    with pytest.raises(ValueError, match="no tensor cores"):
        tc.tensor_core_kernel(_dense_func(), Target("opencl"))


def _conv1x1_func(size):
    n = te.var("n")
    x = te.placeholder((n, 16, size, size), "float16", "x")
    w = te.placeholder((32, 16, 1, 1), "float16", "w")
    c = te.reduce_axis((0, 16), "c")
    r = te.reduce_axis((0, 1), "r")
    q = te.reduce_axis((0, 1), "q")
    y = te.compute((n, 32, size, size), lambda b, o, h, v: te.sum(
        w[o, c, r, q].astype("float32") * x[b, c, h + r, v + q].astype("float32"),
        axis=[c, r, q]), "y")
    return te.create_prim_func([x, w, y])


def test_operand_modes():
    """How each operand is copied: 16-byte runs where the tensor allows, else gathered."""
    gm = tc.match_fp16_gemm(_dense_func())
    assert (gm.a_mode, gm.b_mode) == ("rows", "kn")
    assert tc.match_fp16_gemm(_dense_func(K=24)).a_mode == "gather"   # k not in 16-runs
    # a 1 x 1 convolution: weights (O, C, 1, 1) as rows of C; the input's H x W pixels in
    # 16-byte runs where H x W is a multiple of 8
    assert (tc.match_fp16_gemm(_conv1x1_func(8)).a_mode,
            tc.match_fp16_gemm(_conv1x1_func(8)).b_mode) == ("rows", "kn")
    assert tc.match_fp16_gemm(_conv1x1_func(10)).b_mode == "gather"
    # a 3 x 3 weight: OIHW gathered (k = (kh, kw, c) at a stride of 9); OHWI rows of
    # K = 9 C where the channels are a multiple of 16, else gathered too
    assert tc.match_fp16_gemm(conv_func(32, 64, 14, 3, 1, 1)).a_mode == "gather"
    assert tc.match_fp16_gemm(conv_func(32, 64, 14, 3, 1, 1, weight_layout="OHWI")).a_mode \
        == "rows"
    assert tc.match_fp16_gemm(conv_func(24, 64, 14, 3, 1, 1, weight_layout="OHWI")).a_mode \
        == "gather"


def test_conv1x1_16_byte_runs(dev):
    """The 1 x 1 convolution with its input in 16-byte runs (``kn``), against numpy."""
    t = Target(TARGET)
    mod = targets.build(tc.tensor_core_kernel(_conv1x1_func(8), t), t)
    rng = np.random.default_rng(10)
    for n in (1, 3):
        x = rng.standard_normal((n, 16, 8, 8)).astype(np.float16)
        w = rng.standard_normal((32, 16, 1, 1)).astype(np.float16)
        y = targets.empty((n, 32, 8, 8), "float32", dev)
        mod["main"](targets.array(x, dev), targets.array(w, dev), y)
        ref = np.einsum("nchw,oc->nohw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64))
        _check(y.numpy(), ref, 2e-3)


def test_match_reasons():
    n = te.var("n")
    A = te.placeholder((n, 64), "float32", "A")
    W = te.placeholder((64, 64), "float32", "W")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((n, 64), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    with pytest.raises(ValueError, match="float16"):
        tc.match_fp16_gemm(te.create_prim_func([A, W, C]))


def test_device_target_and_refusal(dev):
    """``opencl(i).target()``: ``-device=nvidia`` on an NVIDIA GPU of compute capability >= 8.0,
    plain ``opencl`` elsewhere; a ``-device=nvidia`` module on another device is a clear
    error, before the driver sees the PTX."""
    from tilecraft.targets.opencl_backend.runtime import OpenCLError, context
    ctx = context(dev.index)
    target = dev.target()
    assert target.tensor_cores == ("ptx" if ctx.has_tensor_cores else None)
    if ctx.has_tensor_cores:
        pytest.skip(f"{ctx.name} runs the PTX: no device here to refuse it")
    t = Target("opencl -device=nvidia")
    mod = targets.build(tc.tensor_core_kernel(_dense_func(), t), t)
    a = targets.array(np.zeros((16, 64), np.float16), dev)
    w = targets.array(np.zeros((64, 128), np.float16), dev)
    c = targets.empty((16, 128), "float32", dev)
    with pytest.raises(OpenCLError, match="compute capability 8.0"):
        mod["main"](a, w, c)


def _gemm_func(K, N, weight):
    """``A (n, K) @ W`` with W ``(K, N)`` (``weight="kn"``) or ``(N, K)`` used transposed
    (``"nk"``), float32 out."""
    n = te.var("n")
    A = te.placeholder((n, K), "float16", "A")
    k = te.reduce_axis((0, K), "k")
    if weight == "kn":
        W = te.placeholder((K, N), "float16", "W")
        C = te.compute((n, N), lambda i, j: te.sum(A[i, k].astype("float32") *
                                                    W[k, j].astype("float32"), axis=k), "C")
    else:
        W = te.placeholder((N, K), "float16", "W")
        C = te.compute((n, N), lambda i, j: te.sum(A[i, k].astype("float32") *
                                                    W[j, k].astype("float32"), axis=k), "C")
    return te.create_prim_func([A, W, C])


# (ldmatrix, stages): the shipped default, the 32-bit fragment loads, the cp.async rings
OPTIONS = [(1, 1), (0, 1), (1, 2), (1, 3), (0, 2)]


@pytest.mark.parametrize("ldm,stages", OPTIONS)
@pytest.mark.parametrize("weight", ["kn", "nk"])
@pytest.mark.parametrize("K,tile", [(96, "64x48x32x24"), (48, "32x64x32x32"),
                                    (32, "64x128x32x64")])
def test_fragment_loads_and_stages(dev, monkeypatch, ldm, stages, weight, K, tile):
    """Each ``TensorCoreOptions`` (``ldmatrix`` x4 and, for an odd number of 8-column blocks
    a warp (WN = 24), x2; ``.trans`` for the ``kn`` weight's k-major tile; a ``cp.async`` ring
    of 2 or 3 stages, with fewer k-steps than stages for K = 32) on both plain weight layouts,
    rows 1 to past two tiles, against numpy."""
    if not ldm and weight == "kn" and tile == "64x48x32x24":
        pytest.skip("the register-staged kn copy (pairing rows k, k + 1) needs its units to "
                    "fill the work-group evenly, which no tile of an odd WN / 8 does")
    monkeypatch.setenv("TILECRAFT_TC_LDMATRIX", str(ldm))
    monkeypatch.setenv("TILECRAFT_TC_STAGES", str(stages))
    monkeypatch.setenv("TILECRAFT_TC_TILE", tile)
    N = 96
    t = Target(TARGET)
    func = tc.tensor_core_kernel(_gemm_func(K, N, weight), t)
    assert func.attr_dict["tensor_core_options"].startswith(f"ldmatrix={ldm} stages={stages} ")
    mod = targets.build(func, t)
    src = mod.get_source()
    ring = stages > 1 and (ldm or weight == "nk")
    assert ("tc_ldmatrix_emulated(" in src or "ldmatrix.sync" in src) == bool(ldm)
    assert (tc_text.CP_ASYNC_PTX in src) == (ring and REAL)
    assert ("tc_cp_async_emulated(" in src) == (ring and not REAL)
    rng = np.random.default_rng(11)
    w = rng.standard_normal((K, N) if weight == "kn" else (N, K)).astype(np.float16)
    wd = targets.array(w, dev)
    for n in (1, 70, 150):
        a = rng.standard_normal((n, K)).astype(np.float16)
        c = targets.empty((n, N), "float32", dev)
        mod["main"](targets.array(a, dev), wd, c)
        wk = w.astype(np.float64) if weight == "kn" else w.astype(np.float64).T
        _check(c.numpy(), a.astype(np.float64) @ wk, 2e-3)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("K", [32, 96, 128, 512])
def test_ring_has_a_barrier_after_every_wait(monkeypatch, stages, K):
    """The cp.async ring's NVIDIA source: every ``cp.async.wait_group`` is followed at once by
    a barrier, on every k-step — also the last S - 1 steps, which issue no copies (whose
    missing barrier let the mma read other threads' copies before they landed), and with
    fewer k-steps than stages."""
    monkeypatch.setenv("TILECRAFT_TC_STAGES", str(stages))
    monkeypatch.setenv("TILECRAFT_TC_TILE", "64x48x32x24")
    t = Target("opencl -device=nvidia")
    func = tc.tensor_core_kernel(_gemm_func(K, 96, "nk"), t)
    lines = [ln.strip() for ln in targets.build(func, t).get_source().splitlines()]
    waits = [i for i, ln in enumerate(lines) if ln.startswith('asm volatile("cp.async.wait')]
    assert waits and lines.count('asm volatile("cp.async.commit_group;");') >= len(waits)
    for i in waits:
        assert lines[i + 1] == "barrier(CLK_LOCAL_MEM_FENCE);", lines[i:i + 3]


class _DropBarrierAfterWait(IRMutator):
    """The ring as it was before its fix: no explicit barrier after a ``cp.async`` wait
    (the lowering's barriers stay, placed as if a copy landed when issued)."""

    def visit_SeqStmt(self, s):
        s = self.generic_visit(s)
        kept = [x for i, x in enumerate(s.seq) if not (
            i > 0 and is_barrier(x) and isinstance(s.seq[i - 1], Evaluate) and
            getattr(s.seq[i - 1].value, "op", None) == E.TC_CP_WAIT)]
        return s if len(kept) == len(s.seq) else SeqStmt(kept)


@pytest.mark.parametrize("stages", [2, 3])
def test_emulation_catches_a_ring_without_its_barrier(dev, monkeypatch, stages):
    """The emulated ``cp.async`` lands a copy only at its work-item's wait, so the ring without
    the barrier after each wait (which on NVIDIA's driver gave wrong results) computes wrong
    numbers on a CPU driver (work-items run in turn: an mma reads the copies of the items
    after it before they land), and the ring as built computes right ones. K = 64: two
    k-steps, the loop unrolled, no step of copies after the first."""
    if REAL:
        pytest.skip("on the hardware the ring without its barrier is a race, not a "
                    "determined wrong result")
    if "CPU" not in targets.opencl_backend.list_devices()[0]["type"].upper():
        pytest.skip("the OpenCL device is not a CPU driver: the order in which work-items "
                    "run, which makes the result wrong, is not defined")
    monkeypatch.setenv("TILECRAFT_TC_STAGES", str(stages))
    monkeypatch.setenv("TILECRAFT_TC_TILE", "64x48x32x24")
    K, N = 64, 96
    t = Target(TARGET)
    func = tc.tensor_core_kernel(_gemm_func(K, N, "nk"), t)
    racy = func.replace(body=_DropBarrierAfterWait().visit(func.body))
    assert racy.body is not func.body
    # each kernel on inputs of its own: PoCL may hand the racy kernel's work-group the local
    # memory the correct kernel's just filled, whose stale tiles would be the right values
    rng = np.random.default_rng(13)
    errors = {}
    for name, f in (("racy", racy), ("as built", func)):
        a = rng.standard_normal((70, K)).astype(np.float16)
        w = rng.standard_normal((N, K)).astype(np.float16)
        ref = a.astype(np.float64) @ w.astype(np.float64).T
        c = targets.empty((70, N), "float32", dev)
        targets.build(f, t)["main"](targets.array(a, dev), targets.array(w, dev), c)
        errors[name] = np.abs(c.numpy() - ref).max() / np.abs(ref).max()
    errors = [errors["as built"], errors["racy"]]
    assert errors[0] < 2e-3 and errors[1] > 0.1, errors


def test_options_from_env(monkeypatch):
    """The defaults, and a bad value named."""
    monkeypatch.delenv("TILECRAFT_TC_LDMATRIX", raising=False)
    monkeypatch.delenv("TILECRAFT_TC_STAGES", raising=False)
    assert tc.TensorCoreOptions.from_env() == tc.TensorCoreOptions()
    monkeypatch.setenv("TILECRAFT_TC_STAGES", "4")
    with pytest.raises(ValueError, match="TILECRAFT_TC_STAGES"):
        tc.TensorCoreOptions.from_env()
    monkeypatch.setenv("TILECRAFT_TC_STAGES", "x")
    with pytest.raises(ValueError, match="TILECRAFT_TC_STAGES"):
        tc.TensorCoreOptions.from_env()


@pytest.mark.parametrize("stages", [1, 2])
def test_split_k_dense_epilogue(dev, monkeypatch, stages):
    """Few output tiles and a long K (1024 -> 64 at up to 130 rows): split-K's two kernels
    (float32 partials, then their sum with the bias and GELU), against numpy; and the same
    built unsplit (``TILECRAFT_TC_SPLITK=0``) has one kernel."""
    monkeypatch.setenv("TILECRAFT_TC_STAGES", str(stages))
    K, N = 1024, 64
    rng = np.random.default_rng(12)
    w = rng.standard_normal((K, N)).astype(np.float32) / 32
    bias = rng.standard_normal(N).astype(np.float32)

    def body(e, x):
        return e(nn.gelu(e(op.add(e(op.matmul(x, const(w))), const(bias)))))
    exe, misses = _build([("x", ("n", K), "float32")], body, {"n": 130})
    assert _uses_tensor_cores(exe) >= 1, misses
    src = exe.kernel_module.get_source()
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 37, 130):
        x = rng.standard_normal((n, K)).astype(np.float32)
        y = _h(x) @ _h(w) + bias
        _check(vm["main"](x).numpy(), 0.5 * y * (1 + _erf(y / np.sqrt(2))), 3e-3)
    monkeypatch.setenv("TILECRAFT_TC_SPLITK", "0")
    plain = _build([("x", ("n", K), "float32")], body, {"n": 130})[0]
    assert src.count("__kernel") > plain.kernel_module.get_source().count("__kernel")


def test_split_k_batch_matmul(dev):
    """Split-K over a batch: (3, s, 1024) x (3, 1024, 32), parts and batch on blockIdx.z."""
    t = Target(TARGET)
    s = te.var("s")
    A = te.placeholder((3, s, 1024), "float16", "A")
    B = te.placeholder((3, 1024, 32), "float16", "B")
    k = te.reduce_axis((0, 1024), "k")
    C = te.compute((3, s, 32), lambda b, i, j: te.sum(
        A[b, i, k].astype("float32") * B[b, k, j].astype("float32"), axis=k), "C")
    func = tc.tensor_core_kernel(te.create_prim_func([A, B, C]), t)
    assert "split-K" in func.attr_dict["tensor_core_tiles"]
    mod = targets.build(func, t)
    rng = np.random.default_rng(13)
    for rows in (5, 70):
        a = rng.standard_normal((3, rows, 1024)).astype(np.float16)
        b = rng.standard_normal((3, 1024, 32)).astype(np.float16)
        c = targets.empty((3, rows, 32), "float32", dev)
        mod["main"](targets.array(a, dev), targets.array(b, dev), c)
        _check(c.numpy(), a.astype(np.float64) @ b.astype(np.float64), 2e-3)


def test_split_parts_rule():
    """BERT-base at batch 1: the 3072 -> 768 layer split in 3, the 768-deep ones not; at
    batch 16 none."""
    small = tc.choose_tile(tc.TC_SMALL_NOMINAL_ROWS, 768)
    assert tc.split_parts(128, 768, 3072, 32, small) == 3
    assert tc.split_parts(128, 768, 768, 32, small) == 1
    assert tc.split_parts(2048, 768, 3072, 32, tc.choose_tile(2048, 768)) == 1
