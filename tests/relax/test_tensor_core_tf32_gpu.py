"""The 3xTF32 float32 GEMM of NVIDIA OpenCL (``relax.backend.gpu.tensor_core_tf32``): whole
kernels — indexing, fragment layouts, the split, epilogues, symbolic rows, edges — against
float64 numpy on random data, and its accuracy beside our SIMT float32 GEMM and plain TF32.

Without an NVIDIA GPU (PoCL in CI) the kernels are built for ``Target("opencl
-device=nvidia-emulated -fp32-tensor-cores=3xtf32")``: the mma and the ``cvt.rna.tf32`` split
computed by portable OpenCL C (``targets.opencl_backend.tensor_core``), exactly as the model
of ``tests/targets/test_opencl_tensor_core_tf32.py``; ``TILECRAFT_TC_DEVICE=nvidia`` runs this
file on NVIDIA's driver (inline PTX; ``benchmarks/tf32_device.sh``), where the accuracy test
measures the tensor cores' own summation.
"""
import math
import os

import numpy as np
import pytest

from capabilities import opencl_device
from gpu_testutil import (build_logging_misses, conv2d_nchw_reference, emitted_module,
                          tensor_core_device)
from tilecraft import relax, targets
from tilecraft.relax import const, op
from tilecraft.relax import gpu_schedules
from tilecraft.relax.op import nn
from tilecraft.relax.backend.gpu import tensor_core_tf32 as tf32
from tilecraft.targets import Target
from tilecraft.tensorir import te

REAL = os.environ.get("TILECRAFT_TC_DEVICE", "") == "nvidia"
DEVICE = "nvidia" if REAL else "nvidia-emulated"
TARGET = f"opencl -device={DEVICE} -fp32-tensor-cores=3xtf32"
_erf = np.vectorize(math.erf)
# a float32 GEMM's error is a few 2^-24 of sum |a||b| (K of a few hundred); TF32's is 2^-11
TOL = 2e-6


@pytest.fixture(scope="module")
def dev():
    return tensor_core_device(REAL)


@pytest.fixture(autouse=True)
def tf32_at_every_size(monkeypatch):
    """The kernels below at any size (the default keeps SIMT below
    ``tensor_core_tf32.TF32_MIN_OUTPUTS`` outputs: ``test_simt_below_min_outputs``)."""
    monkeypatch.setenv("TILECRAFT_TF32_MIN_OUTPUTS", "0")


def _build(params, body, upper, target=TARGET):
    return build_logging_misses(emitted_module(params, body), target, upper,
                                "TF32 tensor-core GEMM")


def _tf32_kernels(exe) -> int:
    src = exe.kernel_module.get_source()
    return src.count("mma.sync.aligned.m16n8k8") if REAL else src.count("tc_mma_tf32_emulated(")


def _check(got, ref, scale, tol=TOL):
    """``got`` against the float64 ``ref``, the error relative to ``scale`` (the sum of the
    products' magnitudes, ``|a| @ |b|``, or a bound of it)."""
    err = (np.abs(got.astype(np.float64) - ref) / scale).max()
    assert err < tol, f"relative error {err:.2e}"


def _f64(*xs):
    return [np.asarray(x, np.float64) for x in xs]


# -- accuracy: SIMT float32, 3xTF32, TF32 against float64 -----------------------------------------

def _dense(K, N):
    n = te.var("n")
    A = te.placeholder((n, K), "float32", "A")
    W = te.placeholder((K, N), "float32", "W")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((n, N), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    return te.create_prim_func([A, W, C])


def gemm_errors(got, A, B) -> tuple:
    """(normwise, componentwise) error of ``got`` against ``A @ B`` in float64:
    ``max|got - ref| / max|ref|`` and ``max(|got - ref| / (|A| @ |B|))``."""
    Ad, Bd = _f64(A, B)
    ref = Ad @ Bd
    diff = np.abs(got.astype(np.float64) - ref)
    return diff.max() / np.abs(ref).max(), (diff / (np.abs(Ad) @ np.abs(Bd))).max()


@pytest.mark.parametrize("K", [768, 3072])
@pytest.mark.parametrize("spread", [0, 16])
def test_accuracy_against_simt(request, dev, K, spread):
    """Random operands (``spread``: each element also scaled by ``2^U(-spread, spread)``, values
    over many exponents): 3xTF32's error within 4x of our SIMT float32 GEMM's, plain TF32's
    far larger. True of the emulation (float32 sums in k order); on an H200's tensor cores
    3xTF32 measured 8.6x SIMT's error at K = 768 (the small-term accumulators 3x): why the
    option is off by default — there the case runs as a known failure."""
    if os.environ.get("TILECRAFT_TC_DEVICE") == "nvidia":
        request.node.add_marker(pytest.mark.xfail(
            reason="3xTF32 on NVIDIA tensor cores: 3-12x SIMT float32's error (H200)",
            strict=False))
    M, N = 64, 64
    rng = np.random.default_rng(K + spread)

    def values(shape):
        x = rng.standard_normal(shape)
        if spread:
            x = x * np.exp2(rng.integers(-spread, spread + 1, shape))
        return x.astype(np.float32)
    A, B = values((M, K)), values((K, N))
    func = _dense(K, N)
    simt_target = Target(opencl_device()[1] if not REAL else "opencl")
    tc_target = Target(TARGET)
    mods = {"simt": targets.build(gpu_schedules.apply(func, simt_target), simt_target)}
    for split in tf32.SPLITS:
        mods[split] = targets.build(tf32.tf32_kernel(func, tc_target, split=split), tc_target)
    mods["small_acc"] = targets.build(tf32.tf32_kernel(func, tc_target, small_acc=True),
                                      tc_target)
    errs = {}
    for name, mod in mods.items():
        out = targets.empty((M, N), "float32", dev)
        mod["main"](targets.array(A, dev), targets.array(B, dev), out)
        errs[name] = gemm_errors(out.numpy(), A, B)
    # (the figures in the log: pytest -rP shows them)
    print(f"K={K} spread={spread} (normwise, componentwise): " +
          ", ".join(f"{n} {a:.2e} {c:.2e}" for n, (a, c) in errs.items()))
    for metric in (0, 1):
        simt, three, one, sep = (errs[n][metric] for n in ("simt", "3xtf32", "1xtf32",
                                                           "small_acc"))
        assert max(three, sep) <= 4 * max(simt, 2.0 ** -24), errs
        assert one > 30 * three, errs


# -- whole kernels and models on the TF32 tensor cores -------------------------------------------

def test_dense_bias_gelu_symbolic_rows(dev):
    """A BERT feed-forward pair: (batch, seq, K) x (K, N) + bias, GELU, then a second dense
    layer; beside a third dense of the same input."""
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
    assert _tf32_kernels(exe) >= 3, misses
    vm = relax.VirtualMachine(exe, dev)
    for b, s in ((1, 5), (2, 37), (1, 80)):
        x = rng.standard_normal((b, s, K)).astype(np.float32)
        xd, wd, w2d, w3d = _f64(x, w, w2, w3)
        y = xd @ wd + bias
        hidden = 0.5 * y * (1 + _erf(y / np.sqrt(2)))
        got = vm["main"](x)
        _check(got[0].numpy(), hidden @ w2d, np.abs(hidden) @ np.abs(w2d) + 1e-3, 1e-5)
        _check(got[1].numpy(), xd @ w3d, np.abs(xd) @ np.abs(w3d))


def test_dense_residual_and_transposed_weight(dev):
    """``x @ Wᵀ + bias + residual`` with W a (N, K) parameter (B read as ``(j, k)``: the
    ``[column][k]`` shared tile), N not a multiple of the work-group tile (72)."""
    K, N = 48, 72
    rng = np.random.default_rng(1)
    bias = rng.standard_normal(N).astype(np.float32)
    exe, misses = _build(
        [("x", ("n", K), "float32"), ("w", (N, K), "float32"), ("r", ("n", N), "float32")],
        lambda e, x, w, r: e(op.add(e(op.add(e(op.matmul(x, e(op.permute_dims(w, (1, 0))))),
                                             const(bias))), r)),
        {"n": 140})
    assert _tf32_kernels(exe) >= 1, misses
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 33, 140):
        x = rng.standard_normal((n, K)).astype(np.float32)
        w = rng.standard_normal((N, K)).astype(np.float32)
        r = rng.standard_normal((n, N)).astype(np.float32)
        xd, wd = _f64(x, w)
        _check(vm["main"](x, w, r).numpy(), xd @ wd.T + bias + r,
               np.abs(xd) @ np.abs(wd).T + np.abs(bias) + np.abs(r))


def test_batch_matmul(dev):
    """(2, 3, s, 64) x (2, 3, 64, 32): batch dims both inputs read (blockIdx.z)."""
    rng = np.random.default_rng(2)
    exe, misses = _build([("q", (2, 3, "s", 64), "float32"), ("k", (2, 3, 64, 32), "float32")],
                         lambda e, q, k: e(op.matmul(q, k)), {"s": 24})
    assert _tf32_kernels(exe) >= 1, misses
    vm = relax.VirtualMachine(exe, dev)
    for s in (7, 24):
        q = rng.standard_normal((2, 3, s, 64)).astype(np.float32)
        k = rng.standard_normal((2, 3, 64, 32)).astype(np.float32)
        qd, kd = _f64(q, k)
        _check(vm["main"](q, k).numpy(), qd @ kd, np.abs(qd) @ np.abs(kd))


@pytest.mark.parametrize("tile", ["128x128x64x32", "64x128x32x64", "64x64x32x32",
                                  "32x64x32x32"])
def test_tiles(dev, tile, monkeypatch):
    """Each work-group / warp tile on one GEMM, rows 1 to past two tiles."""
    monkeypatch.setenv("TILECRAFT_TC_TILE", tile)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((32, 128)).astype(np.float32)
    exe, misses = _build([("x", ("n", 32), "float32")], lambda e, x: e(op.matmul(x, const(w))),
                         {"n": 300})
    assert _tf32_kernels(exe) >= 1, misses
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 129, 300):
        x = rng.standard_normal((n, 32)).astype(np.float32)
        xd, wd = _f64(x, w)
        _check(vm["main"](x).numpy(), xd @ wd, np.abs(xd) @ np.abs(wd))


def test_small_terms_in_their_own_accumulators(dev, monkeypatch):
    """``TILECRAFT_TF32_SMALL_ACC=1``: the small-term mma into accumulators of their own,
    joined before the epilogue (bias, GELU)."""
    monkeypatch.setenv("TILECRAFT_TF32_SMALL_ACC", "1")
    rng = np.random.default_rng(11)
    w = rng.standard_normal((48, 64)).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    exe, misses = _build([("x", ("n", 48), "float32")], lambda e, x: e(nn.gelu(e(op.add(
        e(op.matmul(x, const(w))), const(bias))))), {"n": 40})
    assert _tf32_kernels(exe) >= 1, misses
    assert "acc_small" in exe.kernel_module.get_source()
    x = rng.standard_normal((37, 48)).astype(np.float32)
    xd, wd = _f64(x, w)
    y = xd @ wd + bias
    gelu = 0.5 * y * (1 + _erf(y / np.sqrt(2)))
    _check(relax.VirtualMachine(exe, dev)["main"](x).numpy(), gelu,
           np.abs(xd) @ np.abs(wd) + np.abs(bias))


def test_simt_below_min_outputs(dev, monkeypatch):
    """``TILECRAFT_TF32_MIN_OUTPUTS=4096`` (64 rows of 64 columns): a symbolic row count gets
    the SIMT schedule below 64 rows and 3xTF32 from there on (chosen per call); a static size
    below it SIMT only."""
    monkeypatch.setenv("TILECRAFT_TF32_MIN_OUTPUTS", "4096")
    rng = np.random.default_rng(12)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    exe, misses = _build([("x", ("n", 32), "float32")], lambda e, x: e(op.add(
        e(op.matmul(x, const(w))), const(bias))), {"n": 200})
    src = exe.kernel_module.get_source()
    assert _tf32_kernels(exe) >= 1 and src.count("__kernel") >= 2, misses
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 63, 64, 200):
        x = rng.standard_normal((n, 32)).astype(np.float32)
        xd, wd = _f64(x, w)
        _check(vm["main"](x).numpy(), xd @ wd + bias, np.abs(xd) @ np.abs(wd) + np.abs(bias))
    exe, _ = _build([("x", (48, 32), "float32")], lambda e, x: e(op.matmul(x, const(w))), {})
    assert _tf32_kernels(exe) == 0
    x = rng.standard_normal((48, 32)).astype(np.float32)
    xd, wd = _f64(x, w)
    _check(relax.VirtualMachine(exe, dev)["main"](x).numpy(), xd @ wd, np.abs(xd) @ np.abs(wd))


def test_k_not_a_multiple_of_16(dev):
    """K = 20: both operands gathered float by float, the k tail zero-filled."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((20, 64)).astype(np.float32)
    exe, misses = _build([("x", ("n", 20), "float32")], lambda e, x: e(op.matmul(x, const(w))),
                         {"n": 16})
    assert _tf32_kernels(exe) >= 1, misses
    x = rng.standard_normal((9, 20)).astype(np.float32)
    xd, wd = _f64(x, w)
    _check(relax.VirtualMachine(exe, dev)["main"](x).numpy(), xd @ wd, np.abs(xd) @ np.abs(wd))


def test_not_a_gemm_falls_back(dev):
    """A matrix-vector product (no outer product): the default schedule, the reason named
    under TILECRAFT_DEBUG_SCHEDULES, the same results."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal(32).astype(np.float32)
    exe, misses = _build([("x", ("n", 32), "float32")], lambda e, x: e(op.matmul(x, const(w))),
                         {"n": 16})
    assert _tf32_kernels(exe) == 0
    assert any("does not apply" in m and "matmul" in m for m in misses), misses
    x = rng.standard_normal((9, 32)).astype(np.float32)
    xd, wd = _f64(x, w)
    _check(relax.VirtualMachine(exe, dev)["main"](x).numpy(), xd @ wd, np.abs(xd) @ np.abs(wd))


def test_off_by_default(dev):
    """``Target("opencl -device=nvidia")`` without the option: float32 GEMMs stay SIMT."""
    w = np.ones((32, 64), np.float32)
    exe, _ = _build([("x", ("n", 32), "float32")], lambda e, x: e(op.matmul(x, const(w))),
                    {"n": 16}, target=f"opencl -device={DEVICE}")
    assert _tf32_kernels(exe) == 0


_conv_ref = conv2d_nchw_reference


@pytest.mark.parametrize("kernel,stride,pad,size", [(1, 1, 0, 8), (1, 1, 0, 10), (3, 2, 1, 10),
                                                   (3, 1, 1, 10)])
def test_convolution_implicit_gemm(dev, kernel, stride, pad, size):
    """NCHW convolutions + bias + ReLU as implicit GEMMs (the weights as A, the input as B):
    1 x 1 on 8 x 8 (16-byte runs of pixels) and 10 x 10 (gathered), 3 x 3 stride 2 (the padded
    window gathered), 3 x 3 stride 1 (may go to Winograd: then only the results are checked)."""
    rng = np.random.default_rng(9)
    C, O = 16, 32
    w = (rng.standard_normal((O, C, kernel, kernel)) / kernel).astype(np.float32)
    bias = rng.standard_normal((1, O, 1, 1)).astype(np.float32)
    exe, misses = _build(
        [("x", ("n", C, size, size), "float32")],
        lambda e, x: e(nn.relu(e(op.add(e(nn.conv2d(x, const(w), strides=stride,
                                                     padding=pad)), const(bias))))),
        {"n": 2})
    if (kernel, stride) != (3, 1):
        assert _tf32_kernels(exe) >= 1, misses
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 2):
        x = rng.standard_normal((n, C, size, size)).astype(np.float32)
        got = vm["main"](x).numpy()
        xd, wd = _f64(x, w)
        ref = np.maximum(_conv_ref(xd, wd, stride, pad) + bias, 0)
        _check(got, ref, _conv_ref(np.abs(xd), np.abs(wd), stride, pad) + np.abs(bias))


def test_bert_layer_end_to_end(dev):
    """A (narrow) float32 BERT encoder layer: its dense layers and attention's batch matmuls
    on the TF32 tensor cores, against the model's float64 reference."""
    from tilecraft.models import bert_encoder_layer
    model = bert_encoder_layer(hidden=64, heads=2, ffn=128, seed=6)
    exe = relax.build(model.mod, TARGET, upper_bounds={"batch": 2, "seq_len": 40})
    assert _tf32_kernels(exe) >= 4
    vm = relax.VirtualMachine(exe, dev)
    rng = np.random.default_rng(7)
    for batch, seq in ((1, 16), (2, 37)):
        x, = model.make_inputs(rng, batch=batch, seq_len=seq)
        ref = model.reference(x)
        got = vm["main"](x).numpy()
        assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


def test_resnet_bottleneck_end_to_end(dev):
    """A ResNet-50 bottleneck (128 -> 64 -> 128 channels, 8 x 8): its 1 x 1 convolutions with
    batch norm, ReLU and the residual fused on the TF32 tensor cores (the 3 x 3 goes to
    Winograd, SIMT), against the model's float64 reference."""
    from tilecraft.models import resnet_bottleneck
    model = resnet_bottleneck(channels=128, width=64, height=8, image_width=8)
    exe = relax.build(model.mod, TARGET, upper_bounds={"batch": 2})
    assert _tf32_kernels(exe) >= 2
    vm = relax.VirtualMachine(exe, dev)
    x, = model.make_inputs(np.random.default_rng(8), batch=2)
    ref = model.reference(x)
    assert np.abs(vm["main"](x).numpy() - ref).max() / np.abs(ref).max() < 1e-5


def test_target_option():
    t = Target("opencl -device=nvidia -fp32-tensor-cores=3xtf32")
    assert t.fp32_tensor_cores == "3xtf32" and Target(str(t)) == t
    assert Target(t.export()) == t
    assert Target("opencl -device=nvidia").fp32_tensor_cores is None
    assert Target("opencl -device=nvidia -fp32-tensor-cores=none").fp32_tensor_cores is None
    for bad, match in (("opencl -fp32-tensor-cores=3xtf32", "-device=nvidia"),
                       ("webgpu -fp32-tensor-cores=3xtf32", "-device=nvidia"),
                       ("opencl -device=nvidia -fp32-tensor-cores=2xtf32", "3xtf32")):
        with pytest.raises(ValueError, match=match):
            Target(bad)
    with pytest.raises(ValueError, match="unknown TF32 split"):
        tf32.tf32_kernel(_dense(32, 64), t, split="2xtf32")
    with pytest.raises(ValueError, match="no tensor cores"):
        tf32.tf32_kernel(_dense(32, 64), Target("opencl"))
