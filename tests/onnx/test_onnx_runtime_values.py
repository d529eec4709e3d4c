"""Axes, sizes, scales, counts and repeats given as graph inputs, computed when the model runs
(relax/frontend/onnx/ops/dynamic.py): each model is built once and run with several values,
against onnxruntime; bad values are clear errors at run time."""
import numpy as np
import pytest

from tilecraft import relax
import tilecraft.relax.frontend
from tilecraft import targets
from onnx_testutil import TARGET, one_node, rand, run_onnxruntime


def _vm(model):
    mod = relax.frontend.from_onnx(model)
    return relax.VirtualMachine(relax.build(mod, TARGET), targets.cpu(0))


def _same(vm, model, feeds, rtol=1e-5, atol=1e-5):
    out = vm["main"](*feeds)
    ours = [o.numpy() for o in (out if isinstance(out, tuple) else [out])]
    ref = run_onnxruntime(model, feeds)
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape, f"output {k}: shape {a.shape} vs onnxruntime {b.shape}"
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype} vs onnxruntime {b.dtype}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")


def _i64(*v):
    return np.array(v, dtype=np.int64)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceProd",
                                "ReduceL2", "ReduceLogSumExp"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes_at_run_time(op, keepdims):
    rng = np.random.default_rng(1)
    model = one_node(op, [("x", "float32", [3, 4, 5]), ("axes", "int64", [2])],
                     [("y", "float32", None)], {"keepdims": keepdims}, opset=18)
    vm = _vm(model)
    x = rand(rng, (3, 4, 5), lo=0.5, hi=1.5)
    for axes in ([0, 2], [-1, 1], [2, 0], [1, 0]):
        _same(vm, model, [x, _i64(*axes)], rtol=1e-4)


def test_reduce_axes_out_of_range_or_repeated():
    model = one_node("ReduceSum", [("x", "float32", [3, 4]), ("axes", "int64", [2])],
                     [("y", "float32", None)], {"keepdims": 0}, opset=18)
    vm = _vm(model)
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"ReduceSum.*axes\[1\] is out of range for a tensor "
                                         r"of rank 2"):
        vm["main"](x, _i64(0, 2))
    with pytest.raises(ValueError, match=r"axes\[0\] and axes\[1\] name the same dimension"):
        vm["main"](x, _i64(1, -1))


def test_squeeze_and_unsqueeze_axes_at_run_time():
    rng = np.random.default_rng(2)
    sq = one_node("Squeeze", [("x", "float32", [1, 3, 1, 2]), ("axes", "int64", [1])],
                  [("y", "float32", None)], opset=13)
    vm = _vm(sq)
    x = rand(rng, (1, 3, 1, 2))
    for a in (0, 2, -2):
        _same(vm, sq, [x, _i64(a)])
    with pytest.raises(ValueError):   # dim 1 has 3 elements: not squeezable
        vm["main"](x, _i64(1))
    unsq = one_node("Unsqueeze", [("x", "float32", [3, 2]), ("axes", "int64", [2])],
                    [("y", "float32", None)], opset=13)
    vm = _vm(unsq)
    x = rand(rng, (3, 2))
    for axes in ([0, 3], [1, 2], [-1, 0], [3, 1]):
        _same(vm, unsq, [x, _i64(*axes)])


def test_split_sizes_at_run_time():
    rng = np.random.default_rng(3)
    model = one_node("Split", [("x", "float32", [7, 2]), ("split", "int64", [3])],
                     [("a", "float32", None), ("b", "float32", None), ("c", "float32", None)],
                     {"axis": 0}, opset=13)
    vm = _vm(model)
    x = rand(rng, (7, 2))
    for sizes in ([2, 2, 3], [0, 7, 0], [5, 1, 1]):
        _same(vm, model, [x, _i64(*sizes)])
    with pytest.raises(ValueError, match="split"):      # 2 + 2 + 2 is not 7
        vm["main"](x, _i64(2, 2, 2))


def test_slice_axes_at_run_time():
    rng = np.random.default_rng(4)
    model = one_node("Slice", [("x", "float32", [5, 6, 4]), ("starts", "int64", [2]),
                               ("ends", "int64", [2]), ("axes", "int64", [2]),
                               ("steps", "int64", [2])], [("y", "float32", None)], opset=13)
    vm = _vm(model)
    x = rand(rng, (5, 6, 4))
    for starts, ends, axes, steps in (([0, 1], [3, 5], [0, 1], [1, 2]),
                                      ([-1, 0], [-100, 9], [2, -3], [-1, 2]),
                                      ([4, 1], [0, 3], [1, 2], [-2, 1])):
        _same(vm, model, [x, _i64(*starts), _i64(*ends), _i64(*axes), _i64(*steps)])


def test_top_k_at_run_time():
    rng = np.random.default_rng(5)
    model = one_node("TopK", [("x", "float32", [3, 6]), ("k", "int64", [1])],
                     [("v", "float32", None), ("i", "int64", None)], {"axis": 1}, opset=11)
    vm = _vm(model)
    x = rand(rng, (3, 6))
    for k in (1, 4, 6):
        _same(vm, model, [x, _i64(k)])
    with pytest.raises(ValueError, match="k is larger than dimension 1"):
        vm["main"](x, _i64(7))


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
def test_cumulative_axis_at_run_time(op):
    rng = np.random.default_rng(6)
    model = one_node(op, [("x", "float32", [3, 4]), ("axis", "int64", [])],
                     [("y", "float32", None)], {"exclusive": 1, "reverse": 1}, opset=26)
    vm = _vm(model)
    x = rand(rng, (3, 4), lo=0.5, hi=1.5)
    for a in (0, 1, -1):
        _same(vm, model, [x, np.array(a, np.int64)])
    with pytest.raises(ValueError, match="axis is out of range"):
        vm["main"](x, np.array(2, np.int64))


def test_one_hot_depth_at_run_time():
    rng = np.random.default_rng(7)
    model = one_node("OneHot", [("i", "int64", [4]), ("depth", "float32", []),
                                ("values", "float32", [2])], [("y", "float32", None)],
                     {"axis": 0}, opset=11)
    vm = _vm(model)
    idx = rng.integers(-3, 3, 4).astype(np.int64)
    for depth in (3.0, 5.7):
        _same(vm, model, [idx, np.array(depth, np.float32), np.array([0.5, 2.0], np.float32)])


def test_compress_and_nonzero_sizes_from_the_data():
    rng = np.random.default_rng(8)
    model = one_node("Compress", [("x", "float32", [4, 5]), ("c", "bool", [5])],
                     [("y", "float32", None)], {"axis": 1}, opset=11)
    vm = _vm(model)
    x = rand(rng, (4, 5))
    for _ in range(3):
        _same(vm, model, [x, rng.random(5) < 0.5])
    _same(vm, model, [x, np.zeros(5, bool)])
    model = one_node("NonZero", [("x", "int32", [3, 4, 2])], [("y", "int64", None)], opset=13)
    vm = _vm(model)
    for p in (0.2, 0.7, 0.0):
        _same(vm, model, [(rng.random((3, 4, 2)) < p).astype(np.int32) * 3])


def test_pad_axes_and_center_crop_pad_shape_at_run_time():
    rng = np.random.default_rng(9)
    model = one_node("Pad", [("x", "float32", [3, 4]), ("pads", "int64", [2]),
                             ("value", "float32", []), ("axes", "int64", [1])],
                     [("y", "float32", None)], opset=18)
    vm = _vm(model)
    x = rand(rng, (3, 4))
    for pads, axes in (([1, 2], [0]), ([0, 3], [-1]), ([-1, 1], [1])):
        _same(vm, model, [x, _i64(*pads), np.array(1.5, np.float32), _i64(*axes)])
    model = one_node("CenterCropPad", [("x", "float32", [5, 4]), ("shape", "int64", [2])],
                     [("y", "float32", None)], opset=18)
    vm = _vm(model)
    x = rand(rng, (5, 4))
    for shape in ([3, 6], [7, 1], [5, 4]):
        out = vm["main"](x, _i64(*shape)).numpy()
        ref = np.zeros(shape, np.float32)   # ONNX's reference: crop at (d - t) // 2, pad before
        src = [slice(max((d - t) // 2, 0), max((d - t) // 2, 0) + min(d, t)) for d, t in
               zip(x.shape, shape)]
        dst = [slice(max((t - d) // 2, 0), max((t - d) // 2, 0) + min(d, t)) for d, t in
               zip(x.shape, shape)]
        ref[tuple(dst)] = x[tuple(src)]
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_scales_at_run_time(mode):
    rng = np.random.default_rng(10)
    model = one_node("Resize", [("x", "float32", [1, 2, 4, 5]), ("roi", "float32", [0]),
                                ("scales", "float32", [4])], [("y", "float32", None)],
                     {"mode": mode}, opset=13)
    vm = _vm(model)
    x = rand(rng, (1, 2, 4, 5))
    for sh, sw in ((2.0, 0.6), (0.5, 1.7), (1.0, 1.0)):
        _same(vm, model, [x, np.zeros(0, np.float32), np.array([1, 1, sh, sw], np.float32)],
              rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="dimension 1"):   # resizing the channels
        vm["main"](x, np.zeros(0, np.float32), np.array([1, 2, 1, 1], np.float32))


def test_dropout_training_mode_at_run_time():
    rng = np.random.default_rng(11)
    model = one_node("Dropout", [("x", "float32", [3, 4]), ("r", "float32", []),
                                 ("t", "bool", [])], [("y", "float32", None),
                                                      ("mask", "bool", None)], opset=13)
    vm = _vm(model)
    x = rand(rng, (3, 4))
    _same(vm, model, [x, np.array(0.3, np.float32), np.array(False)])
    _same(vm, model, [x, np.array(0.0, np.float32), np.array(True)])
    with pytest.raises(ValueError, match="training mode with a ratio above 0"):
        vm["main"](x, np.array(0.3, np.float32), np.array(True))


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression_counts_from_the_data(center):
    rng = np.random.default_rng(12)
    model = one_node("NonMaxSuppression", [("boxes", "float32", [2, 30, 4]),
                                           ("scores", "float32", [2, 3, 30]),
                                           ("m", "int64", [1]), ("iou", "float32", [1]),
                                           ("thr", "float32", [1])],
                     [("y", "int64", None)], {"center_point_box": center}, opset=11)
    vm = _vm(model)
    for m, iou, thr in ((5, 0.4, 0.2), (30, 0.1, 0.0), (0, 0.5, 0.5), (3, 0.9, 0.95)):
        corner = rng.uniform(0, 10, (2, 30, 2)).astype(np.float32)
        size = rng.uniform(0.5, 4, (2, 30, 2)).astype(np.float32)
        boxes = np.concatenate([corner, corner + size], -1) if not center else \
            np.concatenate([corner, size], -1)
        scores = rng.random((2, 3, 30)).astype(np.float32)
        _same(vm, model, [boxes, scores, _i64(m), np.array([iou], np.float32),
                          np.array([thr], np.float32)])
