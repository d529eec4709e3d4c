"""The Relax GPU tests both GPU back ends run (test_relax_gpu_opencl.py, test_relax_gpu_webgpu.py):
every operator family and the end-to-end models on the GPU VM, with the default GPU schedules,
against numpy. Each family is one Relax function with many operators, so one module (one
device program) covers it; every function runs at two values of its symbolic batch dim.

The test files keep the device fixture, the target string and the target-specific asserts.
"""
import math
import os
import warnings
from unittest import mock

import numpy as np
import pytest

from capabilities import opencl_device
from tilecraft import relax
from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Tuple, Var, const
from tilecraft.relax import op
from tilecraft.relax.op import nn
from tilecraft.relax.vm import VirtualMachine
from tilecraft.tensorir import te


def module(params, body):
    """``main(*params)`` returning the tuple of ``body(*vars)``'s outputs."""
    bb = BlockBuilder()
    vs = [Var(name, TensorStructInfo(shape, dtype)) for name, shape, dtype in params]
    with bb.function("main", vs):
        with bb.dataflow():
            outs = [bb.emit(e) for e in body(*vs)]
            gv = bb.emit_output(Tuple(outs))
        bb.emit_func_output(gv)
    return bb.get()


def dense_func(rows, K, N, epilogue="bias"):
    """A TE ``epilogue(A @ W + bias)`` PrimFunc over ``A: rows + (K,)`` (``rows`` a tuple of
    ints or symbolic dims); ``epilogue`` one of ``bias``, ``residual`` (``+ R``), ``gelu`` (erf
    form). The dense layer the GPU GEMM-rule tests schedule."""
    A = te.placeholder(rows + (K,), "float32", "A")
    W = te.placeholder((K, N), "float32", "W")
    bias = te.placeholder((N,), "float32", "bias")
    k = te.reduce_axis((0, K), "k")
    C = te.compute(rows + (N,), lambda *ix: te.sum(A[ix[:-1] + (k,)] * W[k, ix[-1]], axis=k),
                   "C")
    D = te.compute(rows + (N,), lambda *ix: C[ix] + bias[ix[-1]], "D")
    params = [A, W, bias]
    if epilogue == "residual":
        R = te.placeholder(rows + (N,), "float32", "R")
        out = te.compute(rows + (N,), lambda *ix: D[ix] + R[ix], "E")
        params.append(R)
    elif epilogue == "gelu":
        out = te.compute(rows + (N,), lambda *ix: D[ix] * (te.erf(D[ix] * 0.70710677) + 1.0)
                         * 0.5, "E")
    else:
        out = D
    return te.create_prim_func(params + [out])


def check(dev, target, mod, make_inputs, reference, sizes=(1, 5), rtol=1e-4, atol=1e-4):
    """Build ``mod`` for ``target``, run it on ``dev`` at each batch size, compare to numpy."""
    exe = relax.build(mod, target)
    vm = VirtualMachine(exe, dev)
    for n in sizes:
        inputs = make_inputs(n)
        outs = vm["main"](*inputs)
        want = reference(*inputs)
        assert len(outs) == len(want)
        for k, (o, w) in enumerate(zip(outs, want)):
            assert o.device == dev
            got = o.numpy()
            assert got.shape == np.shape(w), f"output {k}: {got.shape} vs {np.shape(w)}"
            np.testing.assert_allclose(got, w, rtol=rtol, atol=atol, err_msg=f"output {k}, n={n}")
    return exe


_erf = np.vectorize(math.erf)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def elementwise_broadcast_and_reductions(dev, target, rng):
    """The family's module checked on ``dev``; returns the executable."""
    y = rng.standard_normal(16).astype("float32")

    def body(x):
        return [op.exp(x), op.tanh(x), op.sigmoid(x), op.sqrt(op.abs(x)), op.erf(x),
                op.add(x, const(y)), op.multiply(x, const(y)), op.subtract(const(y), x),
                op.divide(x, op.add(op.abs(const(y)), const(np.float32(1.0)))),
                op.maximum(x, const(y)),
                op.where(op.greater(x, const(np.float32(0.0))), x, op.negative(x)),
                op.astype(op.astype(op.multiply(x, const(np.float32(10.0))), "int32"),
                          "float32"),
                op.sum(x, axis=1), op.max(x, axis=0), op.mean(x, axis=1, keepdims=True),
                op.sum(x)]

    def ref(x):
        return [np.exp(x), np.tanh(x), 1 / (1 + np.exp(-x)), np.sqrt(np.abs(x)), _erf(x),
                x + y, x * y, y - x, x / (np.abs(y) + 1), np.maximum(x, y),
                np.where(x > 0, x, -x), (x * 10).astype("int32").astype("float32"),
                x.sum(1), x.max(0), x.mean(1, keepdims=True), x.sum()]

    return check(dev, target, module([("x", ("n", 16), "float32")], body),
                 lambda n: [rng.standard_normal((n, 16)).astype("float32")], ref)


def nn_activations_and_norms(dev, target, rng):
    """The family's module checked on ``dev``; returns the executable."""
    g = rng.standard_normal(48).astype("float32")
    b = rng.standard_normal(48).astype("float32")

    def body(x):
        return [nn.relu(x), nn.gelu(x), nn.silu(x), nn.softmax(x, axis=-1),
                nn.log_softmax(x, axis=-1), nn.layer_norm(x, const(g), const(b), axes=[-1]),
                nn.rms_norm(x, const(g), axes=[-1])]

    def ref(x):
        ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
        rms = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g
        return [np.maximum(x, 0), 0.5 * x * (1 + _erf(x / np.sqrt(2))), x / (1 + np.exp(-x)),
                _softmax(x), np.log(_softmax(x)), ln, rms]

    return check(dev, target, module([("x", ("n", 48), "float32")], body),
                 lambda n: [rng.standard_normal((n, 48)).astype("float32")], ref)


def linear_conv_and_pooling(dev, target, rng):
    """The family's module checked on ``dev``; returns the executable."""
    w = rng.standard_normal((16, 24)).astype("float32")
    bw = rng.standard_normal((3, 16, 24)).astype("float32")
    cw = rng.standard_normal((4, 3, 3, 3)).astype("float32")

    def body(x, img):
        return [op.matmul(x, const(w)),
                op.matmul(op.reshape(op.tile(x, (3, 1)), (3, -1, 16)), const(bw)),
                nn.conv2d(img, const(cw), padding=(1, 1)),
                nn.max_pool2d(img, pool_size=2, strides=2),
                nn.avg_pool2d(img, pool_size=3, strides=1, padding=1),
                nn.adaptive_avg_pool2d(img, output_size=(1, 1))]

    def conv(img, k):
        n, c, h, wd = img.shape
        p = np.pad(img, ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = np.zeros((n, k.shape[0], h, wd), "float64")
        for dy in range(3):
            for dx in range(3):
                out += np.einsum("nchw,oc->nohw", p[:, :, dy:dy + h, dx:dx + wd],
                                 k[:, :, dy, dx])
        return out

    def avg3(img):
        p = np.pad(img, ((0, 0), (0, 0), (1, 1), (1, 1)))
        s = sum(p[:, :, dy:dy + 8, dx:dx + 8] for dy in range(3) for dx in range(3))
        ones = np.pad(np.ones((8, 8)), 1)
        count = sum(ones[dy:dy + 8, dx:dx + 8] for dy in range(3) for dx in range(3))
        return s / count     # padding not counted

    def ref(x, img):
        xb = np.tile(x, (3, 1)).reshape(3, -1, 16)
        return [x @ w, xb @ bw, conv(img, cw),
                img.reshape(img.shape[0], 3, 4, 2, 4, 2).max((3, 5)), avg3(img),
                img.mean((2, 3), keepdims=True)]

    mod = module([("x", ("n", 16), "float32"), ("img", ("m", 3, 8, 8), "float32")], body)
    return check(dev, target, mod,
                 lambda n: [rng.standard_normal((n, 16)).astype("float32"),
                            rng.standard_normal((n, 3, 8, 8)).astype("float32")], ref,
                 atol=2e-4)


def manipulation_indexing_and_image(dev, target, rng):
    """The family's module checked on ``dev``; returns the executable."""
    idx = np.array([3, 0, 7, 7, 1], "int64")

    def body(x, img):
        return [op.reshape(x, (-1, 2, 4)), op.permute_dims(x, (1, 0)),
                op.concat([x, op.negative(x)], axis=1),
                op.strided_slice(x, axes=[1], begin=[1], end=[7], strides=[2]),
                op.take(x, const(idx), axis=1), op.expand_dims(x, 1), op.flip(x, axis=1),
                relax.op.image.resize2d(img, (6, 6), method="nearest_neighbor",
                                        coordinate_transformation_mode="asymmetric",
                                        rounding_method="floor")]

    def ref(x, img):
        rows = np.floor(np.arange(6) * 3 / 6).astype(int)
        return [x.reshape(-1, 2, 4), x.T, np.concatenate([x, -x], 1), x[:, 1:7:2],
                np.take(x, idx, axis=1), x[:, None], x[:, ::-1],
                img[:, :, rows][:, :, :, rows]]

    mod = module([("x", ("n", 8), "float32"), ("img", ("n", 2, 3, 3), "float32")], body)
    return check(dev, target, mod,
                 lambda n: [rng.standard_normal((n, 8)).astype("float32"),
                            rng.standard_normal((n, 2, 3, 3)).astype("float32")], ref)


def mlp_symbolic_batch(dev, target):
    """The MLP at three batch sizes, then device arrays in and out and timing; returns
    ``(exe, model, rng)`` for target-specific follow-ups."""
    from tilecraft.models import mlp
    model = mlp(in_features=64, hidden=(128, 96), out_features=10, seed=4)
    exe = relax.build(model.mod, target)
    vm = VirtualMachine(exe, dev)
    rng = np.random.default_rng(0)
    for batch in (1, 7, 33):
        x, = model.make_inputs(rng, batch=batch)
        y = vm["main"](x)
        np.testing.assert_allclose(y.numpy(), model.reference(x), rtol=1e-4, atol=1e-4)
    # device arrays in, device arrays out: no copy back between calls
    xd = targets.array(model.make_inputs(rng, batch=3)[0], dev)
    assert vm["main"](xd).device == dev
    t = vm.time_evaluator("main", dev, number=2, repeat=1)(xd)
    assert t.mean > 0
    return exe, model, rng


def transformer_block(dev, target):
    """One BERT encoder layer at two (batch, seq) shapes."""
    from tilecraft.models import bert_encoder_layer
    model = bert_encoder_layer(hidden=32, heads=2, ffn=64, seed=5)
    exe = relax.build(model.mod, target)
    vm = VirtualMachine(exe, dev)
    rng = np.random.default_rng(1)
    for batch, seq in ((1, 5), (2, 9)):
        x, = model.make_inputs(rng, batch=batch, seq_len=seq)
        y = vm["main"](x)
        ref = model.reference(x)
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


def vm_errors(dev, target, wrong_device_match):
    """The GPU VM's errors: a CPU device, a host array of the wrong rank, a CPU executable."""
    mod = module([("x", ("n", 4), "float32")], lambda x: [op.exp(x)])
    exe = relax.build(mod, target)
    with pytest.raises(ValueError, match=wrong_device_match):
        VirtualMachine(exe, targets.cpu(0))
    vm = VirtualMachine(exe, dev)
    with pytest.raises(ValueError, match="rank 1"):
        vm["main"](np.ones(4, "float32"))
    cpu_exe = relax.build(mod, "llvm")
    with pytest.raises(ValueError, match="run on the CPU"):
        VirtualMachine(cpu_exe, dev)


def tensor_core_device(real: bool):
    """The OpenCL device of the tensor-core tests: NVIDIA's (``real``: the inline PTX on the
    GPU machine, ``TILECRAFT_TC_DEVICE=nvidia``), else the local one (PoCL, the emulation)."""
    return targets.opencl("NVIDIA") if real else opencl_device()[0]


def build_logging_misses(mod, target, upper, marker: str):
    """``relax.build(mod, target)`` under ``TILECRAFT_DEBUG_SCHEDULES=1``, and the schedule
    warnings that name ``marker`` (the kernels a rule did not take, and why)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mock.patch.dict(os.environ, {"TILECRAFT_DEBUG_SCHEDULES": "1"}):
            exe = relax.build(mod, target, upper_bounds=upper)
    return exe, [str(w.message) for w in caught if marker in str(w.message)]


def emitted_module(params, body):
    """``main(*params)`` whose dataflow block is ``body(bb.emit, *vars)`` — one binding per
    operator, as the importers make — returning its tensor or tuple."""
    bb = BlockBuilder()
    vs = [Var(name, TensorStructInfo(shape, dtype)) for name, shape, dtype in params]
    with bb.function("main", vs):
        with bb.dataflow():
            out = body(bb.emit, *vs)
            gv = bb.emit_output(Tuple(list(out)) if isinstance(out, tuple) else out)
        bb.emit_func_output(gv)
    return bb.get()


def conv2d_nchw_reference(x, w, stride, pad):
    """NCHW convolution in float64 numpy (no bias), the GPU convolution tests' oracle."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for r in range(kh):
        for q in range(kw):
            win = xp[:, :, r:r + stride * oh:stride, q:q + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, r, q])
    return out
