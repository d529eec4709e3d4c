"""relax.op.image.resize2d: struct-info inference (symbolic sizes), errors, and the legalized
kernel against a numpy reference of the ONNX Resize formulas and against onnxruntime."""
import numpy as np
import pytest

from capabilities import import_or_require
from oputil import run_op
from tilecraft.relax import RelaxError, TensorStructInfo, Var
from tilecraft.relax.op import OpPattern, get, image

rng = np.random.default_rng(0)
f32 = np.float32


def rand(*shape):
    return rng.standard_normal(shape).astype("float32")


# ---------------------------------------------------------------------------------------------
# numpy reference (float32 arithmetic in onnxruntime's order)


def ref_coord(out_size, in_size, mode):
    x = np.arange(out_size, dtype=f32)
    sc = f32(out_size) / f32(in_size)
    if mode == "half_pixel":
        return (x + f32(0.5)) / sc - f32(0.5)
    if mode == "pytorch_half_pixel":
        return (x + f32(0.5)) / sc - f32(0.5) if out_size > 1 else np.zeros(1, f32)
    if mode == "tf_half_pixel_for_nn":
        return (x + f32(0.5)) / sc
    if mode == "asymmetric":
        return x / sc
    if out_size == 1:
        return np.zeros(1, f32)
    return x * f32(in_size - 1) / f32(out_size - 1)


def ref_round(v, method):
    if method == "floor":
        return np.floor(v)
    if method == "ceil":
        return np.ceil(v)
    if method == "round_prefer_ceil":
        return np.floor(v + f32(0.5))
    if method == "round_prefer_floor":
        return np.ceil(v - f32(0.5))
    return np.where(v >= 0, np.floor(v + f32(0.5)), np.ceil(v - f32(0.5)))


def ref_taps(out_size, in_size, method, mode, rounding, alpha, exclude):
    """[(indices, weights)] per tap along one axis."""
    v = ref_coord(out_size, in_size, mode)
    if method == "nearest":
        i = np.clip(ref_round(v, rounding).astype(np.int64), 0, in_size - 1)
        return [(i, np.ones(out_size, f32))]
    if method == "linear":
        v = np.clip(v, f32(0), f32(in_size - 1))
        i0 = np.floor(v).astype(np.int64)
        i1 = np.minimum(i0 + 1, in_size - 1)
        w = v - i0.astype(f32)
        return [(i0, f32(1) - w), (i1, w)]
    fl = np.floor(v)
    s = v - fl
    A = alpha
    ws = [((A * (s + 1) - 5 * A) * (s + 1) + 8 * A) * (s + 1) - 4 * A,
          ((A + 2) * s - (A + 3)) * s * s + 1,
          ((A + 2) * (1 - s) - (A + 3)) * (1 - s) * (1 - s) + 1,
          ((A * (2 - s) - 5 * A) * (2 - s) + 8 * A) * (2 - s) - 4 * A]
    ids = [fl.astype(np.int64) + k for k in (-1, 0, 1, 2)]
    if exclude:
        ws = [np.where((i >= 0) & (i < in_size), w, 0) for i, w in zip(ids, ws)]
        tot = sum(ws)
        ws = [w / tot for w in ws]
    return [(np.clip(i, 0, in_size - 1), w.astype(f32)) for i, w in zip(ids, ws)]


def ref_resize(x, size, method, mode, rounding="round", alpha=-0.75, exclude=0):
    H, W = x.shape[2:]
    out = np.zeros(x.shape[:2] + tuple(size), np.float64)
    for iy, wy in ref_taps(size[0], H, method, mode, rounding, alpha, exclude):
        for ix, wx in ref_taps(size[1], W, method, mode, rounding, alpha, exclude):
            out += x[:, :, iy][:, :, :, ix] * (wy[:, None] * wx[None, :])
    return out


def ort_resize(x, size, method, mode, rounding="round_prefer_floor", alpha=-0.75, exclude=0):
    ort = import_or_require("onnxruntime", "pip install 'tilecraft[bench]'")
    from onnx import TensorProto, helper
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=method,
                            coordinate_transformation_mode=mode, nearest_mode=rounding,
                            cubic_coeff_a=alpha, exclude_outside=exclude)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("sizes", TensorProto.INT64, [4],
                                        list(x.shape[:2]) + list(size))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]


LINEAR_CASES = [("linear", mode, (9, 4), 0) for mode in MODES] + [
    ("cubic", mode, (9, 4), 0) for mode in ("half_pixel", "asymmetric")] + [
    ("linear", "half_pixel", (1, 12), 0),     # a 1-pixel output dim
    ("cubic", "half_pixel", (3, 12), 1),      # exclude_outside
    ("cubic", "align_corners", (1, 5), 1),
]


@pytest.mark.parametrize("method,mode,size,exclude", LINEAR_CASES)
def test_resize_linear_cubic(method, mode, size, exclude):
    x = rand(1, 2, 5, 7)
    out, si = run_op(lambda a: image.resize2d(a, size, method=method,
                                              coordinate_transformation_mode=mode,
                                              cubic_exclude=exclude), [x])
    assert si.static_shape() == (1, 2) + size
    np.testing.assert_allclose(out, ref_resize(x, size, method, mode, exclude=exclude),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, ort_resize(x, size, method, mode, exclude=exclude),
                               rtol=1e-4, atol=1e-5)


NEAREST_CASES = [(mode, "round_prefer_floor") for mode in MODES + ["tf_half_pixel_for_nn"]] + [
    (mode, r) for mode in ("half_pixel", "asymmetric")
    for r in ("round_prefer_ceil", "floor", "ceil", "round")]


@pytest.mark.parametrize("mode,rounding", NEAREST_CASES)
def test_resize_nearest(mode, rounding):
    x = rand(1, 2, 5, 7)
    size = (10, 3)
    out, _ = run_op(lambda a: image.resize2d(a, size, method="nearest",
                                             coordinate_transformation_mode=mode,
                                             rounding_method=rounding), [x])
    np.testing.assert_array_equal(out, ref_resize(x, size, "nearest", mode, rounding))
    if rounding != "round":  # ONNX has no half-away-from-zero mode
        np.testing.assert_array_equal(out, ort_resize(x, size, "nearest", mode, rounding))


def test_resize_symbolic_and_nhwc():
    x = rand(2, 3, 4, 5)
    # output size an expression of the (symbolic) input dims
    out, si = run_op(lambda a: image.resize2d(a, (a.shape[2] * 2, a.shape[3] + 3),
                                              method="linear"), [x], symbolic=True)
    assert repr(si) == "Tensor((d0_0, d0_1, d0_2 * 2, d0_3 + 3), 'float32')"
    np.testing.assert_allclose(out, ref_resize(x, (8, 8), "linear", "half_pixel"), rtol=1e-5,
                               atol=1e-5)
    out, _ = run_op(lambda a: image.resize2d(a, (6, 3), method="cubic", layout="NHWC",
                                             coordinate_transformation_mode="align_corners"),
                    [x.transpose(0, 2, 3, 1)])
    ref = ref_resize(x, (6, 3), "cubic", "align_corners")
    np.testing.assert_allclose(out, ref.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


def test_resize_struct_info_and_errors():
    x = Var("x", TensorStructInfo(("n", 3, "h", "w"), "float32"))
    assert repr(image.resize2d(x, (64, 48)).struct_info) == "Tensor((n, 3, 64, 48), 'float32')"
    si = image.resize2d(x, ("h2", "w2"), method="nearest").struct_info
    assert repr(si) == "Tensor((n, 3, h2, w2), 'float32')"
    assert repr(image.resize2d(x, 7, out_dtype="float16").struct_info) == \
        "Tensor((n, 3, 7, 7), 'float16')"
    assert get("relax.image.resize2d").pattern == OpPattern.INJECTIVE
    with pytest.raises(RelaxError, match=r"relax.image.resize2d: unsupported method 'area'"):
        image.resize2d(x, (4, 4), method="area")
    with pytest.raises(RelaxError, match=r"relax.image.resize2d: unsupported "
                                         r"coordinate_transformation_mode 'tf_crop_and_resize'"):
        image.resize2d(x, (4, 4), coordinate_transformation_mode="tf_crop_and_resize")
    with pytest.raises(RelaxError, match=r"relax.image.resize2d: unsupported rounding_method"):
        image.resize2d(x, (4, 4), method="nearest", rounding_method="nearest")
    with pytest.raises(RelaxError, match=r"relax.image.resize2d: unsupported layout 'NCWX'"):
        image.resize2d(x, (4, 4), layout="NCWX")
    with pytest.raises(RelaxError, match=r"relax.image.resize2d: data must be 4-D"):
        image.resize2d(Var("y", TensorStructInfo((3, 4), "float32")), (4, 4))
    with pytest.raises(RelaxError, match=r"relax.image.resize2d: size must have 2 values"):
        image.resize2d(x, (4, 4, 4))


def test_resize_with_scales_matches_onnx_scales_input():
    # ONNX Resize given scales (not sizes): the transform uses the scale, not out / in
    ort = import_or_require("onnxruntime", "pip install 'tilecraft[bench]'")
    from onnx import TensorProto, helper
    x = rand(1, 2, 5, 4)
    scales = (1.5, 1.7)
    size = (int(5 * 1.5), int(4 * 1.7))
    for method in ("linear", "nearest"):
        out, _ = run_op(lambda a: image.resize2d(a, size, method=method, scales=scales,
                                                 rounding_method="round_prefer_floor"), [x])
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=method,
                                coordinate_transformation_mode="half_pixel")
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            initializer=[helper.make_tensor("scales", TensorProto.FLOAT, [4],
                                            [1.0, 1.0, *scales])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        ref = sess.run(None, {"x": x})[0]
        assert ref.shape == out.shape
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
