"""The Ansor single-operator suite (Zheng et al., OSDI 2020) at batch 1, in ``tensorir.te``, with a
peer for each: onnxruntime where ONNX has the operator, numpy otherwise.

The shapes are the first configuration of each operator in TVM's
``meta_schedule/testing/te_workload.py`` (the suite Ansor and MetaSchedule report):

====  ==========================================  ==========================================
name  operator                                    shape (batch 1)
====  ==========================================  ==========================================
C1D   conv1d, NLC                                 L=256, CI=64, CO=128, k=3, stride 2, pad 1
C2D   conv2d, NHWC                                224x224, CI=3, CO=64, k=7, stride 2, pad 3
C3D   conv3d, NDHWC                               16x224x224, CI=3, CO=64, k=7, s 2, pad 3
GMM   batch matmul                                B=1, N=M=K=128
GRP   group conv2d, NHWC, 4 groups                56x56, CI=64, CO=128, k=3, s 2, pad 1
DIL   dilated conv2d, NHWC, dilation 2            224x224, CI=3, CO=64, k=7, s 2, pad 3
DEP   depthwise conv2d, NHWC                      112x112, C=32, k=3, s 1, pad 1
T2D   transposed conv2d, NHWC                     4x4, CI=512, CO=256, k=4, s 2, pad 1
CAP   capsule conv2d, NHWIJC (4x4 capsules)       16x16, CI=32, CO=32, k=3, s 2, pad 1
NRM   matrix 2-norm                               256x256
====  ==========================================  ==========================================

``suite()`` gives, per operator, the kernel, its inputs, a reference of the outputs and the peer
(a callable doing the same work in its own layout, which is prepared outside the timed call).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tilecraft.tensorir import te

__all__ = ["Op", "suite", "NAMES"]

NAMES = ("C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM")


@dataclass
class Op:
    name: str
    func: object                      # PrimFunc
    inputs: list                      # numpy arrays, the kernel's inputs in order
    out_shape: tuple
    reference: Callable[[], np.ndarray]   # the expected output (our layout)
    peer: Callable[[], object]        # the timed peer call
    peer_name: str
    flop: float


def _pad(x, pads, name="pad"):
    """Zero padding of ``x`` by ``pads[d] = (before, after)`` per dim."""
    shape = [s + a + b for s, (a, b) in zip(x.shape, pads)]

    def f(*idx):
        conds, src = [], []
        for i, (a, _), s in zip(idx, pads, x.shape):
            if a:
                conds += [i >= a, i < s + a]
                src.append(i - a)
            else:
                src.append(i)
        return te.if_then_else(te.all(*conds), x[tuple(src)], 0.0) if conds else x[tuple(src)]
    return te.compute(shape, f, name)


def _ort(node: str, x_shape, w: np.ndarray, y_shape, **attrs):
    """An onnxruntime session of one node ``node(x, w)`` (the weight an initializer)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))
    init = helper.make_tensor("w", TensorProto.FLOAT, list(w.shape),
                              w.astype(np.float32).ravel().tolist())
    graph = helper.make_graph([helper.make_node(node, ["x", "w"], ["y"], **attrs)], node,
                              [x], [y], initializer=[init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _have_ort() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None and \
        importlib.util.find_spec("onnx") is not None


def _conv_nd(name, spatial, ci, co, k, stride, pad, dilation=1, groups=1, rng=None):
    """N-d convolution, channels last: x (1, *spatial, ci), w (k, ..., ci // groups, co)."""
    nd = len(spatial)
    X = te.placeholder((1, *spatial, ci), "float32", "inputs")
    W = te.placeholder((k,) * nd + (ci // groups, co), "float32", "weight")
    out_sp = [(s + 2 * pad - dilation * (k - 1) - 1) // stride + 1 for s in spatial]
    P = _pad(X, [(0, 0)] + [(pad, pad)] * nd + [(0, 0)])
    rs = [te.reduce_axis((0, k), f"r{d}") for d in range(nd)]
    rc = te.reduce_axis((0, ci // groups), "rc")
    cpg, opg = ci // groups, co // groups

    def body(n, *rest):
        sp, c = rest[:-1], rest[-1]
        idx = [s * stride + r * dilation for s, r in zip(sp, rs)]
        return te.sum(P[(n, *idx, c // opg * cpg + rc)] * W[(*rs, rc, c)], axis=[*rs, rc])
    Y = te.compute((1, *out_sp, co), body, name)
    func = te.create_prim_func([X, W, Y])
    x = rng.uniform(-1, 1, (1, *spatial, ci)).astype("float32")
    w = (rng.uniform(-1, 1, (k,) * nd + (ci // groups, co)) / np.sqrt(k ** nd * cpg)
         ).astype("float32")
    # onnxruntime: channels first, weight (co, ci // groups, k...)
    perm_x = (0, nd + 1) + tuple(range(1, nd + 1))
    xc = np.ascontiguousarray(x.transpose(perm_x))
    wc = np.ascontiguousarray(w.transpose((nd + 1, nd) + tuple(range(nd))))
    y_shape = (1, co, *out_sp)
    flop = 2.0 * np.prod(out_sp) * co * cpg * k ** nd
    if _have_ort():
        sess = _ort("Conv", xc.shape, wc, y_shape, kernel_shape=[k] * nd, strides=[stride] * nd,
                    pads=[pad] * (2 * nd), dilations=[dilation] * nd, group=groups)
        feeds = {"x": xc}
        back = (0,) + tuple(range(2, nd + 2)) + (1,)

        def reference():
            return sess.run(None, feeds)[0].transpose(back)
        peer, peer_name = (lambda: sess.run(None, feeds)), "onnxruntime Conv (2 threads)"
    else:  # pragma: no cover - onnxruntime is a dev dependency
        reference, peer, peer_name = None, None, "none"
    return func, [x, w], (1, *out_sp, co), reference, peer, peer_name, flop


def suite(names=NAMES, seed: int = 0) -> list[Op]:
    """The operators ``names`` (default all ten)."""
    rng = np.random.default_rng(seed)
    out = []
    for name in names:
        if name == "C1D":
            r = _conv_nd("conv1d_nlc", (256,), 64, 128, 3, 2, 1, rng=rng)
        elif name == "C2D":
            r = _conv_nd("conv2d_nhwc", (224, 224), 3, 64, 7, 2, 3, rng=rng)
        elif name == "C3D":
            r = _conv_nd("conv3d_ndhwc", (16, 224, 224), 3, 64, 7, 2, 3, rng=rng)
        elif name == "GRP":
            r = _conv_nd("conv2d_nhwc_group", (56, 56), 64, 128, 3, 2, 1, groups=4, rng=rng)
        elif name == "DIL":
            r = _conv_nd("conv2d_nhwc_dilated", (224, 224), 3, 64, 7, 2, 3, dilation=2, rng=rng)
        elif name == "DEP":
            r = _conv_nd("depthwise_conv2d_nhwc", (112, 112), 32, 32, 3, 1, 1, groups=32,
                         rng=rng)
        elif name == "GMM":
            r = _gmm(rng)
        elif name == "T2D":
            r = _t2d(rng)
        elif name == "CAP":
            r = _cap(rng)
        elif name == "NRM":
            r = _nrm(rng)
        else:
            raise ValueError(f"unknown operator {name!r}; the suite has {NAMES}")
        func, inputs, out_shape, reference, peer, peer_name, flop = r
        out.append(Op(name, func, inputs, tuple(out_shape), reference, peer, peer_name, flop))
    return out


def _gmm(rng, b=1, n=128, m=128, k=128):
    X = te.placeholder((b, n, k), "float32", "X")
    Y = te.placeholder((b, k, m), "float32", "Y")
    r = te.reduce_axis((0, k), "k")
    Z = te.compute((b, n, m), lambda bb, i, j: te.sum(X[bb, i, r] * Y[bb, r, j], axis=r), "Z")
    x = rng.uniform(-1, 1, (b, n, k)).astype("float32")
    y = rng.uniform(-1, 1, (b, k, m)).astype("float32")
    return (te.create_prim_func([X, Y, Z]), [x, y], (b, n, m), lambda: np.matmul(x, y),
            lambda: np.matmul(x, y), "numpy matmul (OpenBLAS)", 2.0 * b * n * m * k)


def _t2d(rng, h=4, ci=512, co=256, k=4, stride=2, pad=1):
    """Transposed conv2d as ``relax.nn.conv2d_transpose`` legalizes it: by output phase
    (``relax/op/nn/conv.py``, ``_te_conv_transpose_phased``), each output summing the
    ``(k / stride)^2`` taps that meet an input pixel. TVM's ``conv2d_transpose_nhwc`` (which
    Ansor tunes) convolves the zero-dilated input instead: ``stride^2`` times the multiply-adds,
    three quarters of them by inserted zeros."""
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, op
    from tilecraft.relax.build import legalize
    from tilecraft.tensorir.function import PrimFunc
    out_h = (h - 1) * stride - 2 * pad + k
    bb = BlockBuilder()
    xv = Var("inputs", TensorStructInfo((1, h, h, ci), "float32"))
    wv = Var("weight", TensorStructInfo((k, k, ci, co), "float32"))
    with bb.function("main", [xv, wv]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.conv2d_transpose(
                xv, wv, strides=stride, padding=pad, data_layout="NHWC", kernel_layout="HWIO")))
        bb.emit_func_output(gv)
    (func,) = [f for f in legalize(bb.get()).functions.values() if isinstance(f, PrimFunc)]
    x = rng.uniform(-1, 1, (1, h, h, ci)).astype("float32")
    w = (rng.uniform(-1, 1, (k, k, ci, co)) / np.sqrt(ci * k * k / 4)).astype("float32")
    xc = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    wc = np.ascontiguousarray(w.transpose(2, 3, 0, 1))          # (ci, co, kh, kw)
    flop = 2.0 * h * h * ci * co * k * k    # every input pixel meets the whole kernel
    sess = _ort("ConvTranspose", xc.shape, wc, (1, co, out_h, out_h), kernel_shape=[k, k],
                strides=[stride, stride], pads=[pad] * 4)
    feeds = {"x": xc}
    return (func.with_attr("global_symbol", "main"), [x, w], (1, out_h, out_h, co),
            lambda: sess.run(None, feeds)[0].transpose(0, 2, 3, 1),
            lambda: sess.run(None, feeds), "onnxruntime ConvTranspose (2 threads)", flop)


def _cap(rng, h=16, ci=32, co=32, k=3, stride=2, pad=1, cap=4):
    X = te.placeholder((1, h, h, cap, cap, ci), "float32", "inputs")
    W = te.placeholder((k, k, cap, cap, ci, co), "float32", "weight")
    out_h = (h + 2 * pad - k) // stride + 1
    P = _pad(X, [(0, 0), (pad, pad), (pad, pad), (0, 0), (0, 0), (0, 0)])
    rh, rw = te.reduce_axis((0, k), "rh"), te.reduce_axis((0, k), "rw")
    rk, rc = te.reduce_axis((0, cap), "cap_k"), te.reduce_axis((0, ci), "rc")
    Y = te.compute((1, out_h, out_h, cap, cap, co), lambda n, y, x, i, j, c: te.sum(
        P[n, y * stride + rh, x * stride + rw, i, rk, rc] * W[rh, rw, rk, j, rc, c],
        axis=[rh, rw, rk, rc]), "conv2d_capsule_nhwijc")
    x = rng.uniform(-1, 1, (1, h, h, cap, cap, ci)).astype("float32")
    w = (rng.uniform(-1, 1, (k, k, cap, cap, ci, co)) / np.sqrt(k * k * cap * ci)
         ).astype("float32")
    xp = np.pad(x, [(0, 0), (pad, pad), (pad, pad), (0, 0), (0, 0), (0, 0)])

    def peer():
        win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(1, 2))
        win = win[:, ::stride, ::stride][:, :out_h, :out_h]     # (1, oh, ow, i, k, c, a, b)
        return np.einsum("nyxikcab,abkjcd->nyxijd", win, w, optimize=True)
    flop = 2.0 * out_h * out_h * cap * cap * co * k * k * cap * ci
    return (te.create_prim_func([X, W, Y]), [x, w], (1, out_h, out_h, cap, cap, co), peer,
            peer, "numpy einsum", flop)


def _nrm(rng, b=1, m=256, n=256):
    A = te.placeholder((b, m, n), "float32", "A")
    i, j = te.reduce_axis((0, m), "i"), te.reduce_axis((0, n), "j")
    C = te.compute((b,), lambda bb: te.sum(A[bb, i, j] * A[bb, i, j], axis=[i, j]), "C")
    D = te.compute((b,), lambda bb: te.sqrt(C[bb]), "D")
    a = rng.uniform(-1, 1, (b, m, n)).astype("float32")

    def peer():
        return np.sqrt(np.einsum("bij,bij->b", a, a))
    return (te.create_prim_func([A, D]), [a], (b,), peer, peer, "numpy einsum + sqrt",
            2.0 * b * m * n)
