"""relax.op.nn convolutions and pooling: struct-info inference (symbolic), errors, and the
legalized kernels against numpy references (and onnxruntime for the transposed convolution and
pooling) on random data."""
import itertools

import numpy as np
import pytest

from capabilities import import_or_require
from oputil import run_op
from tilecraft.relax import RelaxError, TensorStructInfo, Var
from tilecraft.relax.op import OpPattern, get, nn

rng = np.random.default_rng(0)


def rand(*shape, dtype="float32"):
    return rng.standard_normal(shape).astype(dtype)


def tvar(name, shape, dtype="float32"):
    return Var(name, TensorStructInfo(shape, dtype))


def pads_of(padding, n):
    if isinstance(padding, int):
        return (padding,) * (2 * n)
    padding = tuple(padding)
    return padding * 2 if len(padding) == n else padding


def tup(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


# ---------------------------------------------------------------------------------------------
# numpy references (NC... data, OI... / IO... kernels)


def ref_conv(x, w, strides, padding, dilation, groups):
    n = x.ndim - 2
    s, d, p = tup(strides, n), tup(dilation, n), pads_of(padding, n)
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(p[i], p[i + n]) for i in range(n)])
    k = w.shape[2:]
    o = [(xp.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(n)]
    O, I = w.shape[:2]
    opg = O // groups
    out = np.zeros((x.shape[0], O, *o))
    for g in range(groups):
        for kk in itertools.product(*[range(v) for v in k]):
            sl = tuple(slice(kk[i] * d[i], kk[i] * d[i] + s[i] * (o[i] - 1) + 1, s[i])
                       for i in range(n))
            patch = xp[(slice(None), slice(g * I, (g + 1) * I)) + sl]
            wk = w[(slice(g * opg, (g + 1) * opg), slice(None)) + kk].astype(np.float64)
            out[:, g * opg:(g + 1) * opg] += np.einsum("ni...,oi->no...", patch, wk)
    return out


def ref_conv_transpose(x, w, strides, padding, output_padding, dilation, groups):
    n = x.ndim - 2
    s, d, p = tup(strides, n), tup(dilation, n), pads_of(padding, n)
    op_ = tup(output_padding, n)
    H, k = x.shape[2:], w.shape[2:]
    C, opg = w.shape[:2]
    cpg = C // groups
    full = [(H[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 + op_[i] for i in range(n)]
    out = np.zeros((x.shape[0], opg * groups, *full))
    for g in range(groups):
        xg = x[:, g * cpg:(g + 1) * cpg].astype(np.float64)
        for kk in itertools.product(*[range(v) for v in k]):
            sl = tuple(slice(kk[i] * d[i], kk[i] * d[i] + s[i] * (H[i] - 1) + 1, s[i])
                       for i in range(n))
            wk = w[(slice(g * cpg, (g + 1) * cpg), slice(None)) + kk].astype(np.float64)
            out[(slice(None), slice(g * opg, (g + 1) * opg)) + sl] += \
                np.einsum("nc...,co->no...", xg, wk)
    crop = tuple(slice(p[i], full[i] - p[i + n]) for i in range(n))
    return out[(slice(None), slice(None)) + crop]


def pool_out_size(H, k, s, d, pb, pe, ceil_mode):
    num = H + pb + pe - d * (k - 1) - 1
    if not ceil_mode:
        return num // s + 1
    o = -(-num // s) + 1
    if (o - 1) * s >= H + pb:  # PyTorch: the last window starts inside the data or begin pad
        o -= 1
    return o


def ref_pool(x, kind, pool_size, strides, padding, dilation, ceil_mode, count_include_pad):
    n = x.ndim - 2
    k, s, d, p = tup(pool_size, n), tup(strides, n), tup(dilation, n), pads_of(padding, n)
    H = x.shape[2:]
    o = [pool_out_size(H[i], k[i], s[i], d[i], p[i], p[i + n], ceil_mode) for i in range(n)]
    out = np.zeros(x.shape[:2] + tuple(o))
    for pos in itertools.product(*[range(v) for v in o]):
        taps, cnt_incl = [], 1
        for i in range(n):
            t = [pos[i] * s[i] - p[i] + j * d[i] for j in range(k[i])]
            cnt_incl *= sum(1 for v in t if -p[i] <= v < H[i] + p[i + n])
            taps.append([v for v in t if 0 <= v < H[i]])
        win = x[(slice(None), slice(None)) + np.ix_(*taps)].reshape(x.shape[:2] + (-1,))
        if kind == "max":
            out[(slice(None), slice(None)) + pos] = win.max(axis=-1)
        else:
            div = cnt_incl if count_include_pad else win.shape[-1]
            out[(slice(None), slice(None)) + pos] = win.sum(axis=-1) / div
    return out


def ref_adaptive(x, kind, out_size):
    n = x.ndim - 2
    H = x.shape[2:]
    out = np.zeros(x.shape[:2] + tuple(out_size))
    for pos in itertools.product(*[range(v) for v in out_size]):
        sl = tuple(slice(pos[i] * H[i] // out_size[i], -(-(pos[i] + 1) * H[i] // out_size[i]))
                   for i in range(n))
        win = x[(slice(None), slice(None)) + sl].reshape(x.shape[:2] + (-1,))
        out[(slice(None), slice(None)) + pos] = win.max(-1) if kind == "max" else win.mean(-1)
    return out


# ---------------------------------------------------------------------------------------------
# onnxruntime oracle


def run_onnx(op_type, inputs, **attrs):
    ort = import_or_require("onnxruntime", "pip install 'tilecraft[bench]'")
    from onnx import TensorProto, helper
    names = [f"in{i}" for i in range(len(inputs))]
    node = helper.make_node(op_type, names, ["out"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(nm, TensorProto.FLOAT, a.shape)
         for nm, a in zip(names, inputs)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))[0]


# ---------------------------------------------------------------------------------------------
# conv


CONV2D_CASES = [
    # strides, padding, dilation, groups, in_c, out_c, kernel
    (1, 0, 1, 1, 3, 4, (3, 3)),
    (2, 1, 1, 1, 3, 4, (3, 3)),
    ((2, 1), (1, 0, 2, 1), (1, 2), 2, 4, 6, (3, 2)),   # asymmetric everything, groups
    (1, (2, 1), 2, 1, 2, 3, (3, 3)),                   # dilation, (pad_h, pad_w)
    (2, 1, 1, 4, 4, 4, (3, 3)),                        # depthwise
    (3, 2, 1, 2, 4, 8, (1, 5)),                        # depthwise multiplier 2 ... odd sizes
]


@pytest.mark.parametrize("strides,padding,dilation,groups,ic,oc,k", CONV2D_CASES)
def test_conv2d_nchw(strides, padding, dilation, groups, ic, oc, k):
    x, w = rand(2, ic, 7, 6), rand(oc, ic // groups, *k)
    out, si = run_op(lambda a, b: nn.conv2d(a, b, strides, padding, dilation, groups), [x, w])
    ref = ref_conv(x, w, strides, padding, dilation, groups)
    assert si.static_shape() == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_conv2d_nhwc_hwio_and_out_layout():
    x, w = rand(2, 4, 7, 6), rand(6, 2, 3, 2)
    ref = ref_conv(x, w, (2, 1), (1, 0, 2, 1), (1, 2), 2)
    xh, wh = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)
    out, si = run_op(lambda a, b: nn.conv2d(a, b, (2, 1), (1, 0, 2, 1), (1, 2), 2,
                                            data_layout="NHWC", kernel_layout="HWIO"), [xh, wh])
    np.testing.assert_allclose(out, ref.transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-4)
    # NCHW data, HWIO kernel, NHWC result
    out, _ = run_op(lambda a, b: nn.conv2d(a, b, (2, 1), (1, 0, 2, 1), (1, 2), 2,
                                           kernel_layout="HWIO", out_layout="NHWC"), [x, wh])
    np.testing.assert_allclose(out, ref.transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-4)


def test_conv2d_symbolic_batch_and_spatial():
    x, w = rand(2, 3, 9, 8), rand(5, 3, 3, 3)
    out, si = run_op(lambda a, b: nn.conv2d(a, b, strides=2, padding=1), [x, w],
                     symbolic=[True, False])
    np.testing.assert_allclose(out, ref_conv(x, w, 2, 1, 1, 1), rtol=1e-4, atol=1e-4)
    xv = tvar("x", ("n", 3, "h", "w"))
    wv = tvar("w", (16, 3, 3, 3))
    si = nn.conv2d(xv, wv, strides=2, padding=1).struct_info
    assert repr(si) == "Tensor((n, 16, (h + 1) // 2, (w + 1) // 2), 'float32')"
    si = nn.conv2d(xv, wv, padding=1).struct_info
    assert repr(si) == "Tensor((n, 16, h, w), 'float32')"
    si = nn.conv2d(xv, wv, dilation=2).struct_info
    assert repr(si) == "Tensor((n, 16, h - 4, w - 4), 'float32')"
    assert get("relax.nn.conv2d").pattern == OpPattern.OUT_EWISE_FUSABLE


def test_conv1d_conv3d():
    x, w = rand(2, 4, 11), rand(6, 2, 3)
    out, _ = run_op(lambda a, b: nn.conv1d(a, b, strides=2, padding=(2, 1), dilation=2, groups=2),
                    [x, w], symbolic=[True, False])
    np.testing.assert_allclose(out, ref_conv(x, w, 2, (2, 1), 2, 2), rtol=1e-4, atol=1e-4)
    out, _ = run_op(lambda a, b: nn.conv1d(a, b, data_layout="NWC", kernel_layout="WIO"),
                    [x.transpose(0, 2, 1), rand(3, 4, 5)])
    assert out.shape == (2, 9, 5)
    x, w = rand(1, 2, 5, 6, 4), rand(3, 2, 3, 2, 3)
    out, _ = run_op(lambda a, b: nn.conv3d(a, b, strides=(1, 2, 1), padding=1), [x, w])
    np.testing.assert_allclose(out, ref_conv(x, w, (1, 2, 1), 1, 1, 1), rtol=1e-4, atol=1e-4)


def test_conv2d_out_dtype():
    x = rng.integers(-5, 5, (1, 2, 5, 5)).astype("int8")
    w = rng.integers(-5, 5, (3, 2, 3, 3)).astype("int8")
    out, si = run_op(lambda a, b: nn.conv2d(a, b, padding=1, out_dtype="int32"), [x, w])
    assert si.dtype == "int32"
    np.testing.assert_array_equal(out, ref_conv(x, w, 1, 1, 1, 1).astype(np.int32))


def test_conv_errors():
    x = tvar("x", ("n", 16, 32, 32))
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d: the data channels .* differ: 16 vs 8"):
        nn.conv2d(x, tvar("w", (4, 8, 3, 3)))
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d: groups 3 does not divide the input "
                                         r"channels 16"):
        nn.conv2d(x, tvar("w", (6, 5, 3, 3)), groups=3)
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d: groups 4 does not divide the output "
                                         r"channels 6"):
        nn.conv2d(x, tvar("w", (6, 4, 3, 3)), groups=4)
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d: unsupported data_layout 'NCWH3'"):
        nn.conv2d(x, tvar("w", (4, 16, 3, 3)), data_layout="NCWH3")
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d: unsupported kernel_layout 'OIHH'"):
        nn.conv2d(x, tvar("w", (4, 16, 3, 3)), kernel_layout="OIHH")
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d: the output height would be -1"):
        nn.conv2d(tvar("y", (1, 3, 2, 8)), tvar("w", (4, 3, 4, 3)))
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d: padding must be"):
        nn.conv2d(x, tvar("w", (4, 16, 3, 3)), padding=(1, 2, 3))
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d: strides must be >= 1"):
        nn.conv2d(x, tvar("w", (4, 16, 3, 3)), strides=0)
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d: data must be 4-D"):
        nn.conv2d(tvar("z", (16, 32, 32)), tvar("w", (4, 16, 3, 3)))
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d_transpose: the data channels"):
        nn.conv2d_transpose(x, tvar("w", (8, 4, 3, 3)))
    with pytest.raises(RelaxError, match=r"relax.nn.conv2d_transpose: output_padding"):
        nn.conv2d_transpose(x, tvar("w", (16, 4, 3, 3)), strides=2, output_padding=2)


def test_conv_symbolic_channels_checked_at_run_time():
    # data channels and weight in-channels are different symbolic vars: checked by the kernel
    x, w = rand(1, 3, 5, 5), rand(2, 4, 3, 3)
    with pytest.raises(Exception, match=r"conv2d"):  # our check or the bounds verifier's
        run_op(lambda a, b: nn.conv2d(a, b), [x, w], symbolic=True, check_interpret=False)


# ---------------------------------------------------------------------------------------------
# conv transpose

CONVT_CASES = [
    # strides, padding, output_padding, dilation, groups, in_c, out_c/groups, kernel
    (1, 0, 0, 1, 1, 3, 2, (3, 3)),
    (2, 1, 1, 1, 1, 3, 2, (3, 3)),
    ((2, 3), (1, 0, 0, 2), (1, 0), (1, 2), 1, 2, 3, (3, 2)),
    (2, 2, 0, 1, 2, 4, 3, (4, 4)),      # groups; padding larger than k - 1 on one side
    (3, (0, 3), 2, 1, 1, 2, 2, (2, 3)),
]


@pytest.mark.parametrize("strides,padding,output_padding,dilation,groups,ic,ocg,k", CONVT_CASES)
def test_conv2d_transpose(strides, padding, output_padding, dilation, groups, ic, ocg, k):
    x, w = rand(2, ic, 4, 5), rand(ic, ocg, *k)
    out, si = run_op(lambda a, b: nn.conv2d_transpose(a, b, strides, padding, output_padding,
                                                      dilation, groups), [x, w])
    ref = ref_conv_transpose(x, w, strides, padding, output_padding, dilation, groups)
    assert si.static_shape() == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    p = pads_of(padding, 2)
    onnx_ref = run_onnx("ConvTranspose", [x, w], strides=list(tup(strides, 2)), pads=list(p),
                        output_padding=list(tup(output_padding, 2)),
                        dilations=list(tup(dilation, 2)), group=groups)
    np.testing.assert_allclose(out, onnx_ref, rtol=1e-4, atol=1e-4)


def test_strided_conv_transpose_skips_the_inserted_zeros():
    """With a stride and no dilation the legalized kernel works by output phase: a 4x4
    stride-2 kernel sums 2 x 2 taps per output (and a 3x3 one, zero-padded to 4x4, too), not
    the 16 / 9 of the zero-dilated input; the values match numpy and onnxruntime above."""
    from tilecraft.relax import BlockBuilder
    from tilecraft.relax.build import legalize
    from tilecraft.tensorir.function import PrimFunc
    from tilecraft.tensorir.functor import post_order_visit
    from tilecraft.tensorir.stmt import Block
    for k, taps in ((4, 4), (3, 4)):
        bb = BlockBuilder()
        x, w = tvar("x", (1, 8, 5, 5)), tvar("w", (8, 6, k, k))
        with bb.function("main", [x, w]):
            with bb.dataflow():
                gv = bb.emit_output(bb.emit(nn.conv2d_transpose(x, w, strides=2, padding=1)))
            bb.emit_func_output(gv)
        (f,) = [f for f in legalize(bb.get()).functions.values() if isinstance(f, PrimFunc)]
        blocks = []
        post_order_visit(f.body, lambda n: blocks.append(n) if isinstance(n, Block) else None)
        (conv,) = [b for b in blocks if b.name == "conv2d_transpose"]
        reduce = [iv.dom.extent.value for iv in conv.iter_vars if iv.kind == "reduce"]
        assert int(np.prod(reduce)) == 8 * taps, (k, reduce)
        xs, ws = rand(1, 8, 5, 5), rand(8, 6, k, k)
        out, _ = run_op(lambda a, b: nn.conv2d_transpose(a, b, strides=2, padding=1), [xs, ws])
        np.testing.assert_allclose(out, ref_conv_transpose(xs, ws, 2, 1, 0, 1, 1), rtol=1e-4,
                                   atol=1e-4)


def test_conv_transpose_symbolic_and_1d():
    x, w = rand(2, 4, 5, 3), rand(4, 3, 3, 3)
    out, si = run_op(lambda a, b: nn.conv2d_transpose(a, b, strides=2, padding=1,
                                                      output_padding=1), [x, w],
                     symbolic=[True, False])
    np.testing.assert_allclose(out, ref_conv_transpose(x, w, 2, 1, 1, 1, 1), rtol=1e-4,
                               atol=1e-4)
    xv = tvar("x", ("n", 4, "h", "w"))
    si = nn.conv2d_transpose(xv, tvar("w", (4, 3, 3, 3)), strides=2, padding=1,
                             output_padding=1).struct_info
    assert repr(si) == "Tensor((n, 3, h * 2, w * 2), 'float32')"
    x, w = rand(1, 4, 6), rand(4, 1, 3)
    out, _ = run_op(lambda a, b: nn.conv1d_transpose(a, b, strides=2, padding=(1, 0), groups=2),
                    [x, w])
    ref = ref_conv_transpose(x, w, 2, (1, 0), 0, 1, 2)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, run_onnx("ConvTranspose", [x, w], strides=[2], pads=[1, 0],
                                             group=2), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# pooling

POOL_CASES = [
    # kind, pool_size, strides, padding, dilation, ceil_mode, count_include_pad
    ("max", 2, 2, 0, 1, False, False),
    ("max", 3, 2, 1, 1, True, False),
    ("max", (3, 2), (2, 3), (1, 0, 0, 1), 1, True, False),
    ("max", 3, 1, 1, 2, False, False),          # dilation
    ("avg", 3, 2, 1, 1, False, False),
    ("avg", 3, 2, 1, 1, False, True),
    ("avg", 3, 2, 1, 1, True, False),
    ("avg", 3, 2, 1, 1, True, True),
    ("avg", (3, 2), (2, 3), (1, 0, 0, 1), 1, True, True),
    ("avg", (2, 3), 2, (0, 1), (2, 1), True, False),
]


@pytest.mark.parametrize("kind,k,s,p,d,ceil_mode,cip", POOL_CASES)
def test_pool2d(kind, k, s, p, d, ceil_mode, cip):
    x = rand(2, 3, 7, 8)
    f = nn.max_pool2d if kind == "max" else nn.avg_pool2d
    kw = dict(pool_size=k, strides=s, padding=p, dilation=d, ceil_mode=ceil_mode)
    if kind == "avg":
        kw["count_include_pad"] = cip
    out, si = run_op(lambda a: f(a, **kw), [x])
    ref = ref_pool(x, kind, k, s, p, d, ceil_mode, cip)
    assert si.static_shape() == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,ceil_mode,cip", [("max", False, False), ("max", True, False),
                                                ("avg", False, True), ("avg", False, False),
                                                ("avg", True, False)])
def test_pool2d_against_onnxruntime(kind, ceil_mode, cip):
    x = rand(1, 2, 7, 8)
    f = nn.max_pool2d if kind == "max" else nn.avg_pool2d
    kw = dict(count_include_pad=cip) if kind == "avg" else {}
    out, _ = run_op(lambda a: f(a, 3, 2, (1, 0, 1, 1), ceil_mode=ceil_mode, **kw), [x],
                    check_interpret=False)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=int(ceil_mode))
    if kind == "avg":
        attrs["count_include_pad"] = int(cip)
    ref = run_onnx("MaxPool" if kind == "max" else "AveragePool", [x], **attrs)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_pool_nhwc_symbolic_and_1d_3d():
    x = rand(2, 3, 9, 7)
    ref = ref_pool(x, "max", 3, 2, 1, 1, True, False)
    out, si = run_op(lambda a: nn.max_pool2d(a, 3, 2, 1, ceil_mode=True, layout="NHWC"),
                     [x.transpose(0, 2, 3, 1)], symbolic=True)
    np.testing.assert_allclose(out, ref.transpose(0, 2, 3, 1), rtol=1e-6)
    ref = ref_pool(x, "avg", 3, 2, 1, 1, False, True)
    out, _ = run_op(lambda a: nn.avg_pool2d(a, 3, 2, 1, count_include_pad=True), [x],
                    symbolic=True)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    x1 = rand(2, 3, 10)
    out, _ = run_op(lambda a: nn.avg_pool1d(a, 3, 2, 1), [x1])
    np.testing.assert_allclose(out, ref_pool(x1, "avg", 3, 2, 1, 1, False, False), rtol=1e-5)
    x3 = rand(1, 2, 4, 5, 6)
    out, _ = run_op(lambda a: nn.max_pool3d(a, 2, 2, ceil_mode=True), [x3])
    np.testing.assert_allclose(out, ref_pool(x3, "max", 2, 2, 0, 1, True, False), rtol=1e-6)


def test_pool_struct_info_and_errors():
    x = tvar("x", ("n", 64, 112, 112))
    assert repr(nn.max_pool2d(x, 3, 2, 1).struct_info) == "Tensor((n, 64, 56, 56), 'float32')"
    y = tvar("y", ("n", 3, "h", "w"))
    assert repr(nn.avg_pool2d(y, 2, 2).struct_info) == "Tensor((n, 3, h // 2, w // 2), 'float32')"
    assert repr(nn.max_pool2d(y, 3, 1, 1).struct_info) == "Tensor((n, 3, h, w), 'float32')"
    assert get("relax.nn.max_pool2d").pattern == OpPattern.OUT_EWISE_FUSABLE
    with pytest.raises(RelaxError, match=r"relax.nn.max_pool2d: unsupported layout 'NCH'"):
        nn.max_pool2d(x, 2, layout="NCH")
    with pytest.raises(RelaxError, match=r"relax.nn.avg_pool2d: the output height would be"):
        nn.avg_pool2d(tvar("z", (1, 1, 2, 8)), 4)
    with pytest.raises(RelaxError, match=r"relax.nn.max_pool2d: pool_size must be >= 1"):
        nn.max_pool2d(x, 0)
    with pytest.raises(RelaxError, match=r"relax.nn.max_pool2d: data must be 4-D"):
        nn.max_pool2d(tvar("z", (3, 4)), 2)
    with pytest.raises(RelaxError, match=r"relax.nn.adaptive_avg_pool2d: output_size"):
        nn.adaptive_avg_pool2d(x, (1, 2, 3))


@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize("size", [(3, 4), (1, 1), (2, 5)])
def test_adaptive_pool2d(kind, size):
    x = rand(2, 3, 7, 8)
    f = nn.adaptive_avg_pool2d if kind == "avg" else nn.adaptive_max_pool2d
    out, si = run_op(lambda a: f(a, size), [x])
    np.testing.assert_allclose(out, ref_adaptive(x, kind, size), rtol=1e-5, atol=1e-6)


def test_adaptive_and_global_pool_symbolic():
    x = rand(2, 3, 7, 8)
    out, si = run_op(lambda a: nn.adaptive_avg_pool2d(a, (3, None)), [x], symbolic=True)
    np.testing.assert_allclose(out, ref_adaptive(x, "avg", (3, 8)), rtol=1e-5, atol=1e-6)
    assert repr(si) == "Tensor((d0_0, d0_1, 3, d0_3), 'float32')"
    out, si = run_op(lambda a: nn.global_avg_pool2d(a), [x], symbolic=True)
    np.testing.assert_allclose(out, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    out, _ = run_op(lambda a: nn.global_max_pool2d(a, layout="NHWC"), [x.transpose(0, 2, 3, 1)])
    np.testing.assert_allclose(out, x.max(axis=(2, 3), keepdims=True).transpose(0, 2, 3, 1))
    x1 = rand(2, 3, 10)
    out, _ = run_op(lambda a: nn.adaptive_avg_pool1d(a, 4), [x1])
    np.testing.assert_allclose(out, ref_adaptive(x1, "avg", (4,)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run_op(lambda a: nn.global_avg_pool1d(a), [x1])[0],
                               x1.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_avg_pool_float16_accumulates_in_float32():
    x = (rng.standard_normal((1, 2, 6, 6)) * 100).astype("float16")
    out, si = run_op(lambda a: nn.avg_pool2d(a, 3, 1, 1), [x])
    assert si.dtype == "float16" and out.dtype == np.float16
    ref = ref_pool(x.astype(np.float64), "avg", 3, 1, 1, 1, False, False)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-3, atol=0.1)
    out, _ = run_op(lambda a: nn.global_avg_pool2d(a), [x])
    np.testing.assert_allclose(out.astype(np.float64),
                               x.astype(np.float64).mean((2, 3), keepdims=True), rtol=2e-3,
                               atol=0.1)


def test_kernel_buffer_names_do_not_clash_with_argument_names():
    # Relax variables named like the kernels' internal stages still give valid PrimFuncs
    from tilecraft import targets
    from tilecraft.relax import BlockBuilder
    x = tvar("pad", (1, 2, 5, 5))
    w = tvar("conv2d", (3, 2, 3, 3))
    bb = BlockBuilder()
    with bb.function("main", [x, w]):
        outs = []
        for call in (nn.conv2d(x, w, padding=1), nn.avg_pool2d(x, 3, padding=1),
                     nn.conv2d_transpose(x, tvar("dilate_pad", (2, 3, 3, 3)), strides=2)):
            outs.append(bb.emit(call.op.legalize(bb, call)))
        bb.emit_func_output(outs)
    for name, func in bb.get().functions.items():
        if name != "main":
            targets.build(func, "llvm")
