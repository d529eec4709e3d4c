"""``ConvWeightOHWI`` (``relax/transform/conv_weight_ohwi.py``): the constant float16 weights of
the convolutions the tensor cores take stored OHWI, read in 16-byte rows (``a_mode``
``"rows"``), through ``relax.build`` of small quantized models against numpy on PoCL
(``opencl -device=nvidia-emulated``; ``TILECRAFT_TC_DEVICE=nvidia``: the GPU's driver)."""
import os

import numpy as np
import pytest

from gpu_testutil import (build_logging_misses, conv2d_nchw_reference, emitted_module,
                          tensor_core_device)
from tilecraft import relax
from tilecraft.relax import const, op
from tilecraft.relax.analysis import get_var2val
from tilecraft.relax.backend.gpu import tensor_core as tc
from tilecraft.relax.op import nn
from tilecraft.relax.transform import ConvWeightOHWI, get_pipeline
from tilecraft.relax.transform.conv_weight_ohwi import ohwi_rows
from tilecraft.tensorir.expr import as_int
from tilecraft.tensorir.function import PrimFunc

REAL = os.environ.get("TILECRAFT_TC_DEVICE", "") == "nvidia"
TARGET = "opencl -device=nvidia" if REAL else "opencl -device=nvidia-emulated"


@pytest.fixture(scope="module")
def dev():
    return tensor_core_device(REAL)


def _h(x):
    """``x`` rounded to float16, as float64 (a quantized model's operands)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)


# A ResNet-like chain: the 7 x 7 stride-2 stem (3 channels: K = 147, gathered), a 3 x 3
# stride-1 block with bias, residual and ReLU (32 channels: OHWI rows), a 3 x 3 stride-2
# (32 -> 24: OHWI rows) and a 3 x 3 on 24 channels (not a multiple of 16: left OIHW, gathered)
def _weights(rng):
    def w(o, c, k):
        return (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)

    def b(o):
        return rng.standard_normal((1, o, 1, 1)).astype(np.float32) * 0.1
    return dict(w0=w(32, 3, 7), b0=b(32), w1=w(32, 32, 3), b1=b(32), w2=w(24, 32, 3),
                b2=b(24), w3=w(32, 24, 3), b3=b(32))


def _model(p):
    def body(e, x):
        h0 = e(nn.relu(e(op.add(e(nn.conv2d(x, const(p["w0"]), strides=2, padding=3)),
                                const(p["b0"])))))
        h1 = e(nn.relu(e(op.add(e(op.add(e(nn.conv2d(h0, const(p["w1"]), padding=1)),
                                         const(p["b1"]))), h0))))
        h2 = e(nn.relu(e(op.add(e(nn.conv2d(h1, const(p["w2"]), strides=2, padding=1)),
                                const(p["b2"])))))
        return e(op.add(e(nn.conv2d(h2, const(p["w3"]), padding=1)), const(p["b3"])))
    return emitted_module([("x", ("n", 3, 20, 20), "float32")], body)


def _reference(p, x):
    """The model in float64 numpy, each layer's operands rounded to float16 as the quantized
    model has them."""
    def conv(v, w, s, pad):
        return conv2d_nchw_reference(_h(v), _h(w), s, pad)
    h0 = np.maximum(conv(x, p["w0"], 2, 3) + p["b0"], 0)
    h1 = np.maximum(conv(h0, p["w1"], 1, 1) + p["b1"] + _h(h0), 0)
    h2 = np.maximum(conv(h1, p["w2"], 2, 1) + p["b2"], 0)
    return conv(h2, p["w3"], 1, 1) + p["b3"]


def _weight_modes(mod) -> dict:
    """``{weight shape: a_mode}`` of the tensor-core convolutions after the pipeline."""
    lowered = get_pipeline(target=TARGET)(mod)
    modes = {}
    for _, f in lowered:
        if isinstance(f, PrimFunc):
            try:
                gm = tc.match_fp16_gemm(f)
            except ValueError:
                continue
            modes[tuple(as_int(s) for s in gm.a.buffer.shape)] = gm.a_mode
    return modes


def test_ohwi_rows_rule():
    assert ohwi_rows(32, 3, 3) and ohwi_rows(512, 3, 3) and ohwi_rows(16, 5, 5)
    assert not ohwi_rows(3, 7, 7) and not ohwi_rows(24, 3, 3) and not ohwi_rows(64, 1, 1)


def test_pass_rewrites_only_what_the_tensor_cores_take():
    """On a tensor-core target the 3 x 3 weights of 32 channels become OHWI constants (the
    values transposed), the stem and the 24-channel layer stay OIHW; other targets and the
    switch off leave every convolution as it is."""
    p = _weights(np.random.default_rng(0))
    mod16 = relax.quantize(_model(p), "fp16")

    def convs(m):
        return [(e.attr_dict["kernel_layout"], np.asarray(e.args[1].data))
                for e in get_var2val(m["main"]).values()
                if getattr(getattr(e, "op", None), "name", None) == "relax.nn.conv2d"]
    before = convs(mod16)
    after = convs(ConvWeightOHWI(TARGET, enabled=True)(mod16))
    assert [k for k, _ in before] == ["OIHW"] * 4
    assert [k for k, _ in after] == ["OIHW", "OHWI", "OHWI", "OIHW"]
    for (_, w0), (k, w1) in zip(before, after):
        np.testing.assert_array_equal(w1, w0.transpose(0, 2, 3, 1) if k == "OHWI" else w0)
    for m in (ConvWeightOHWI(TARGET, enabled=False)(mod16), ConvWeightOHWI("opencl")(mod16)):
        assert [k for k, _ in convs(m)] == ["OIHW"] * 4


@pytest.mark.parametrize("switch", ["1", "0"])
def test_quantized_chain(dev, monkeypatch, switch):
    """The chain through ``relax.build`` at batch 1 and 3 against numpy; the 3 x 3 weights of
    32 channels read as rows with ``TILECRAFT_TC_CONV_OHWI`` on, gathered with it off; the
    stem and the 24-channel layer gathered either way."""
    monkeypatch.setenv("TILECRAFT_TC_CONV_OHWI", switch)
    rng = np.random.default_rng(1)
    p = _weights(rng)
    mod16 = relax.quantize(_model(p), "fp16")
    on = switch == "1"
    modes = _weight_modes(mod16)
    assert modes == {(32, 3, 7, 7): "gather",
                     (32, 3, 3, 32) if on else (32, 32, 3, 3): "rows" if on else "gather",
                     (24, 3, 3, 32) if on else (24, 32, 3, 3): "rows" if on else "gather",
                     (32, 24, 3, 3): "gather"}, modes
    exe, misses = build_logging_misses(mod16, TARGET, {"n": 3}, "tensor-core GEMM")
    src = exe.kernel_module.get_source()
    assert src.count("mma.sync" if REAL else "tc_mma_emulated(") >= 4, misses
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 3):
        x = rng.standard_normal((n, 3, 20, 20)).astype(np.float32)
        got = vm["main"](x).numpy().astype(np.float64)
        ref = _reference(p, x)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < 1e-2, (n, err, misses)


def test_weight_parameter_left_oihw(dev):
    """A weight that is a function parameter (not a constant) stays OIHW, gathered, and the
    result is still right."""
    rng = np.random.default_rng(2)
    mod = emitted_module([("x", ("n", 32, 10, 10), "float32"), ("w", (32, 32, 3, 3), "float32")],
                         lambda e, x, w: e(nn.relu(e(nn.conv2d(x, w, padding=1)))))
    mod16 = relax.quantize(mod, "fp16")
    assert set(_weight_modes(mod16).items()) <= {((32, 32, 3, 3), "gather")}
    exe, misses = build_logging_misses(mod16, TARGET, {"n": 3}, "tensor-core GEMM")
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 3):
        x = rng.standard_normal((n, 32, 10, 10)).astype(np.float32)
        w = (rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
        got = vm["main"](x, w).numpy().astype(np.float64)
        ref = np.maximum(conv2d_nchw_reference(_h(x), _h(w), 1, 1), 0)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < 1e-2, (n, err, misses)


def test_simt_window_conv_reads_ohwi(dev, monkeypatch):
    """``TILECRAFT_TC_WINDOW_CONV=0`` (the 3 x 3 convolutions on the SIMT schedule) with the
    OHWI weights: still right at batch 1 and 3."""
    monkeypatch.setenv("TILECRAFT_TC_WINDOW_CONV", "0")
    rng = np.random.default_rng(5)
    p = _weights(rng)
    exe = relax.build(relax.quantize(_model(p), "fp16"), TARGET, upper_bounds={"n": 3})
    vm = relax.VirtualMachine(exe, dev)
    for n in (1, 3):
        x = rng.standard_normal((n, 3, 20, 20)).astype(np.float32)
        got = vm["main"](x).numpy().astype(np.float64)
        ref = _reference(p, x)
        assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-2, n
