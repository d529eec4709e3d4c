"""ONNX shape and data-movement operators against onnxruntime: inputs known at import time
(folded, symbolic dims kept) and computed at run time (the dynamic path), opset variants."""
import numpy as np
import pytest
from onnx import helper

from tilecraft import relax
import tilecraft.relax.frontend
from onnx_testutil import check, make_model, one_node, rand, run_tilecraft


def test_reshape_from_shape_arithmetic_keeps_symbolic_dims():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write it."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
             helper.make_node("Unsqueeze", ["t", "ax"], ["t1"]),
             helper.make_node("Concat", ["b1", "t1", "heads"], ["shp"], axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["y"])]
    model = make_model(nodes, [("x", "float32", ["batch", "seq", 8])], [("y", "float32", None)],
                       {"i0": np.array(0), "i1": np.array(1), "ax": np.array([0]),
                        "heads": np.array([2, -1])})
    mod = relax.frontend.from_onnx(model)
    text = relax.printer.to_script(mod)
    assert "R.Tensor((batch, seq, 2, 4)" in text   # folded: no shape kernels, exact dims
    assert "tensor_to_shape" not in text
    rng = np.random.default_rng(0)
    for shape in ((1, 3, 8), (2, 5, 8)):
        check(model, [rand(rng, shape)])


@pytest.mark.parametrize("allowzero", [0, 1])
def test_reshape_shape_computed_at_run_time(allowzero):
    model = one_node("Reshape", [("x", "float32", [2, 3, 4]), ("s", "int64", [3])],
                     [("y", "float32", None)], {"allowzero": allowzero}, opset=14)
    rng = np.random.default_rng(1)
    x = rand(rng, (2, 3, 4))
    for s in ([4, -1, 3], [2, 0, 4] if not allowzero else [4, 3, 2], [-1, 2, 2]):
        check(model, [x, np.array(s, dtype=np.int64)])


def test_flatten_transpose_squeeze_unsqueeze_opsets():
    rng = np.random.default_rng(2)
    x = rand(rng, (2, 1, 3, 4))
    check(one_node("Flatten", [("x", "float32", [2, 1, 3, 4])], [("y", "float32", None)],
                   {"axis": 2}), [x])
    check(one_node("Transpose", [("x", "float32", [2, 1, 3, 4])], [("y", "float32", None)],
                   {"perm": [3, 0, 2, 1]}), [x])
    # opset 11: axes attribute; opset 13: axes input (a constant)
    check(one_node("Squeeze", [("x", "float32", [2, 1, 3, 4])], [("y", "float32", None)],
                   {"axes": [-3]}, opset=11), [x])
    check(one_node("Squeeze", [("x", "float32", [2, 1, 3, 4])], [("y", "float32", None)],
                   initializers={"a": np.array([1])}, node_inputs=["x", "a"], opset=13), [x])
    check(one_node("Unsqueeze", [("x", "float32", [2, 1, 3, 4])], [("y", "float32", None)],
                   {"axes": [0, -1]}, opset=11), [x])
    check(one_node("Unsqueeze", [("x", "float32", [2, 1, 3, 4])], [("y", "float32", None)],
                   initializers={"a": np.array([4, 1])}, node_inputs=["x", "a"], opset=13), [x])


@pytest.mark.parametrize("opset,form", [(11, "attr"), (13, "input"), (18, "num_outputs"),
                                        (13, "equal")])
def test_split(opset, form):
    rng = np.random.default_rng(3)
    x = rand(rng, (3, 10))
    outs = [("a", "float32", None), ("b", "float32", None), ("c", "float32", None)]
    if form == "attr":
        model = one_node("Split", [("x", "float32", [3, 10])], outs, {"axis": 1,
                                                                    "split": [2, 3, 5]}, opset=opset)
    elif form == "input":
        model = one_node("Split", [("x", "float32", [3, 10])], outs, {"axis": -1},
                         initializers={"s": np.array([4, 4, 2])}, node_inputs=["x", "s"],
                         opset=opset)
    elif form == "num_outputs":   # 10 into 3: pieces of 4, 4, 2
        model = one_node("Split", [("x", "float32", [3, 10])], outs,
                         {"axis": 1, "num_outputs": 3}, opset=opset)
    else:
        x = rand(rng, (3, 9))
        model = one_node("Split", [("x", "float32", [3, 9])], outs, {"axis": 1}, opset=opset)
    check(model, [x])


def test_concat_symbolic_and_zero_size():
    rng = np.random.default_rng(4)
    model = one_node("Concat", [("a", "float32", ["n", 3]), ("b", "float32", ["m", 3]),
                                ("c", "float32", [0, 3])], [("y", "float32", None)], {"axis": 0})
    check(model, [rand(rng, (2, 3)), rand(rng, (5, 3)), np.zeros((0, 3), "float32")])


def test_slice_constant_bounds_opset9_and_13():
    rng = np.random.default_rng(5)
    x = rand(rng, (6, 7, 5))
    check(one_node("Slice", [("x", "float32", [6, 7, 5])], [("y", "float32", None)],
                   {"starts": [1, -4], "ends": [100, -1], "axes": [0, 1]}, opset=9), [x])
    model = one_node("Slice", [("x", "float32", [6, 7, 5])], [("y", "float32", None)],
                     initializers={"s": np.array([5, 0]), "e": np.array([-100, 5]),
                                   "a": np.array([0, 2]), "t": np.array([-2, 2])},
                     node_inputs=["x", "s", "e", "a", "t"], opset=13)
    check(model, [x])


def test_slice_bounds_computed_at_run_time():
    rng = np.random.default_rng(6)
    x = rand(rng, (6, 7))
    model = one_node("Slice", [("x", "float32", [6, 7]), ("s", "int64", [2]),
                               ("e", "int64", [2]), ("t", "int64", [2])],
                     [("y", "float32", None)], initializers={"a": np.array([0, 1])},
                     node_inputs=["x", "s", "e", "a", "t"], opset=13)
    for s, e, t in (([1, 0], [5, 7], [1, 2]), ([-1, 6], [-7, 0], [-2, -1]),
                    ([0, -3], [100, 100], [3, 1]), ([4, 2], [1, 2], [1, 1])):
        check(model, [x, np.array(s), np.array(e), np.array(t)])


def test_slice_with_symbolic_end_from_shape():
    """x[:, :shape(y)[1]]: a symbolic bound, folded at import time."""
    nodes = [helper.make_node("Shape", ["y"], ["s"]),
             helper.make_node("Slice", ["s", "one", "two"], ["len"]),
             helper.make_node("Slice", ["x", "zero", "len", "one"], ["out"])]
    model = make_model(nodes, [("x", "float32", [3, "n"]), ("y", "float32", [2, "m"])],
                       [("out", "float32", None)],
                       {"zero": np.array([0]), "one": np.array([1]), "two": np.array([2])})
    rng = np.random.default_rng(7)
    check(model, [rand(rng, (3, 9)), rand(rng, (2, 4))])


def test_expand_and_tile_constant_and_run_time():
    rng = np.random.default_rng(8)
    x = rand(rng, (3, 1))
    check(one_node("Expand", [("x", "float32", [3, 1])], [("y", "float32", None)],
                   initializers={"s": np.array([2, 1, 4])}, node_inputs=["x", "s"]), [x])
    model = one_node("Expand", [("x", "float32", [3, 1]), ("s", "int64", [3])],
                     [("y", "float32", None)])
    check(model, [x, np.array([2, 3, 5])])
    check(model, [x, np.array([1, 1, 1])])
    model = one_node("Tile", [("x", "float32", [3, 1]), ("r", "int64", [2])],
                     [("y", "float32", None)])
    check(model, [x, np.array([2, 3])])
    check(one_node("Tile", [("x", "float32", [3, 1])], [("y", "float32", None)],
                   initializers={"r": np.array([1, 4])}, node_inputs=["x", "r"]), [x])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes(mode):
    rng = np.random.default_rng(9)
    x = rand(rng, (1, 3, 4, 5))
    opset = 19 if mode == "wrap" else 13
    model = one_node("Pad", [("x", "float32", [1, 3, 4, 5])], [("y", "float32", None)],
                     {"mode": mode}, initializers={"p": np.array([0, 0, 2, 1, 0, 0, 1, 3]),
                                                   "v": np.array(0.5, "float32")},
                     node_inputs=["x", "p", "v"], opset=opset)
    check(model, [x])


def test_pad_run_time_widths_and_value_and_cropping():
    rng = np.random.default_rng(10)
    model = one_node("Pad", [("x", "float32", [3, 4]), ("p", "int64", [4]),
                             ("v", "float32", [])], [("y", "float32", None)], opset=13)
    x = rand(rng, (3, 4))
    check(model, [x, np.array([1, 2, 0, 1]), np.array(-2.0, "float32")])
    check(model, [x, np.array([0, -1, 2, -2]), np.array(3.0, "float32")])
    check(one_node("Pad", [("x", "float32", [3, 4])], [("y", "float32", None)],
                   {"pads": [1, 0, 0, 2], "value": 1.5}, opset=2), [x])


def test_range_constant_and_run_time():
    check(one_node("Range", [], [("y", "int64", None)],
                   initializers={"a": np.array(2), "b": np.array(11), "c": np.array(3)},
                   node_inputs=["a", "b", "c"], opset=11), [])
    model = one_node("Range", [("a", "float32", []), ("b", "float32", []),
                               ("c", "float32", [])], [("y", "float32", None)], opset=11)
    check(model, [np.array(1.0, "float32"), np.array(-2.5, "float32"),
                  np.array(-0.5, "float32")])


def test_trilu_constant_and_run_time_k():
    rng = np.random.default_rng(11)
    x = rand(rng, (2, 4, 5))
    for upper in (0, 1):
        check(one_node("Trilu", [("x", "float32", [2, 4, 5])], [("y", "float32", None)],
                       {"upper": upper}, opset=14), [x])
        model = one_node("Trilu", [("x", "float32", [2, 4, 5]), ("k", "int64", [])],
                         [("y", "float32", None)], {"upper": upper}, opset=14)
        for k in (-2, 0, 3):
            check(model, [x, np.array(k)])


def test_constant_of_shape_from_shape_and_at_run_time():
    from onnx import numpy_helper
    value = numpy_helper.from_array(np.array([2.5], "float32"), "value")
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["y"], value=value)]
    model = make_model(nodes, [("x", "float32", ["n", 2])], [("y", "float32", None)])
    check(model, [np.zeros((3, 2), "float32")])
    model = one_node("ConstantOfShape", [("s", "int64", [2])], [("y", "int32", None)],
                     {"value": numpy_helper.from_array(np.array([7], "int32"), "value")})
    check(model, [np.array([2, 3])])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_space_to_depth(mode):
    rng = np.random.default_rng(12)
    x = rand(rng, (1, 8, 2, 3))
    check(one_node("DepthToSpace", [("x", "float32", [1, 8, 2, 3])], [("y", "float32", None)],
                   {"blocksize": 2, "mode": mode}, opset=13), [x])
    if mode == "DCR":
        check(one_node("SpaceToDepth", [("x", "float32", [1, 2, 4, 6])],
                       [("y", "float32", None)], {"blocksize": 2}, opset=13),
              [rand(rng, (1, 2, 4, 6))])


def test_shape_start_end_and_size():
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=-1),
             helper.make_node("Size", ["x"], ["n"])]
    model = make_model(nodes, [("x", "float32", [2, "k", 3, 4])],
                       [("s", "int64", None), ("n", "int64", None)], opset=15)
    check(model, [np.zeros((2, 5, 3, 4), "float32")])


def test_resize_scales_and_sizes():
    rng = np.random.default_rng(13)
    x = rand(rng, (1, 2, 4, 5))
    for mode, coord in (("nearest", "asymmetric"), ("linear", "half_pixel"),
                        ("cubic", "align_corners"), ("linear", "pytorch_half_pixel")):
        model = one_node("Resize", [("x", "float32", [1, 2, 4, 5])], [("y", "float32", None)],
                         {"mode": mode, "coordinate_transformation_mode": coord},
                         initializers={"s": np.array([1, 1, 1.5, 0.8], "float32")},
                         node_inputs=["x", "", "s"], opset=13)
        check(model, [x], rtol=1e-4, atol=1e-5)
    # sizes computed at run time
    model = one_node("Resize", [("x", "float32", [1, 2, 4, 5]), ("z", "int64", [4])],
                     [("y", "float32", None)], {"mode": "linear"},
                     node_inputs=["x", "", "", "z"], opset=13)
    check(model, [x, np.array([1, 2, 7, 3])], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="dimension 1"):
        run_tilecraft(model, [x, np.array([1, 3, 7, 3])])
