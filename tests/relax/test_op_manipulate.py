"""Shape-manipulation operators (relax/op/manipulate.py) against numpy: struct-info inference
(static and symbolic), legalized kernels on random data, run-time checks and errors."""
import numpy as np
import pytest

from oputil import run_op
from tilecraft.relax import RelaxError, ShapeExpr, TensorStructInfo, Var, op
from tilecraft.relax.op.base import Op, OpPattern
from tilecraft.tensorir import arith
from tilecraft.tensorir.expr import IntImm, Var as TirVar


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def _dims(si):
    return tuple(d.value if isinstance(d, IntImm) else d for d in si.shape)


def _equal(a, b):
    ana = arith.Analyzer()
    return ana.can_prove_equal(a, b)


def _check_shape(si, expected):
    """``si`` (symbolic) has dims provably equal to ``expected`` (ints / exprs)."""
    assert si.ndim == len(expected), si
    for d, e in zip(si.shape, expected):
        assert _equal(d, e), (si, expected)


# ---------------------------------------------------------------------------------------------
# reshape / flatten


@pytest.mark.parametrize("new", [(-1, 4), (6, -1), (2, -1, 2), (24,), (-1,), (4, 3, 2)])
def test_reshape_static_and_minus_one(new, rng):
    x = rng.standard_normal((2, 3, 4)).astype("float32")
    out, si = run_op(lambda a: op.reshape(a, new), [x])
    np.testing.assert_array_equal(out, x.reshape(new))
    assert _dims(si) == x.reshape(new).shape


def test_reshape_symbolic_minus_one(rng):
    x = Var("x", TensorStructInfo(("n", 12, 64), "float32"))
    n = x.shape[0]
    si = op.reshape(x, (-1, 64)).struct_info
    _check_shape(si, (n * 12, 64))
    assert not isinstance(si.shape[0], IntImm)
    _check_shape(op.reshape(x, (n * 12, 64)).struct_info, (n * 12, 64))
    _check_shape(op.reshape(x, (n, -1)).struct_info, (n, 768))
    # on data: dims symbolic, the -1 is n * 12 * 64 // 64
    data = rng.standard_normal((3, 12, 64)).astype("float32")
    out, si = run_op(lambda a: op.reshape(a, (-1, a.shape[2])), [data], symbolic=True)
    np.testing.assert_array_equal(out, data.reshape(-1, 64))
    out, _ = run_op(lambda a: op.reshape(a, (a.shape[0] * a.shape[1], 8, -1)), [data],
                    symbolic=True)
    np.testing.assert_array_equal(out, data.reshape(36, 8, 8))


def test_reshape_shape_expr_and_runtime_check(rng):
    x = rng.standard_normal((2, 3)).astype("float32")
    out, _ = run_op(lambda a: op.reshape(a, ShapeExpr((3, 2))), [x])
    np.testing.assert_array_equal(out, x.reshape(3, 2))
    # the target dim comes from another tensor: equal counts are only known at run time
    out, si = run_op(lambda a, b: op.reshape(a, (b.shape[0],)), [x, np.zeros(6, "float32")],
                     symbolic=True)
    np.testing.assert_array_equal(out, x.reshape(6))
    with pytest.raises(ValueError, match="element count"):
        run_op(lambda a, b: op.reshape(a, (b.shape[0],)), [x, np.zeros(8, "float32")],
               symbolic=True)


def test_reshape_errors():
    x = Var("x", TensorStructInfo((2, 3), "float32"))
    with pytest.raises(RelaxError, match=r"relax.reshape: .*6 elements into 8"):
        op.reshape(x, (2, 4))
    with pytest.raises(RelaxError, match="relax.reshape: at most one"):
        op.reshape(x, (-1, -1))
    with pytest.raises(RelaxError, match="relax.reshape: .*not a multiple of 4"):
        op.reshape(x, (-1, 4))
    with pytest.raises(RelaxError, match="relax.reshape: bad dimension -2"):
        op.reshape(x, (-2, 3))
    y = Var("y", TensorStructInfo(("n", 4), "float32"))
    with pytest.raises(RelaxError, match="relax.reshape"):
        op.reshape(y, (y.shape[0] + 1, 4))  # n * 4 vs n * 4 + 4: provably different
    op.reshape(y, (y.shape[0], 8))  # n * 4 vs n * 8: equal for n = 0, so checked at run time
    with pytest.raises(RelaxError, match="relax.reshape: cannot infer"):
        op.reshape(Var("z", TensorStructInfo(None, "float32", ndim=2)), (-1,))


def test_flatten(rng):
    x = rng.standard_normal((2, 3, 4, 5)).astype("float32")
    out, si = run_op(lambda a: op.flatten(a), [x], symbolic=True)
    np.testing.assert_array_equal(out, x.reshape(-1))
    out, si = run_op(lambda a: op.flatten(a, 1, 2), [x])
    assert _dims(si) == (2, 12, 5)
    np.testing.assert_array_equal(out, x.reshape(2, 12, 5))
    out, si = run_op(lambda a: op.flatten(a, 0, -2), [x], symbolic=True)
    np.testing.assert_array_equal(out, x.reshape(24, 5))
    # ONNX Flatten(axis=2) is 2-D: flatten(flatten(x, 2), 0, 1)
    two_d = op.flatten(Var("x", TensorStructInfo((2, 3, 4, 5), "float32")), 2)
    assert _dims(op.flatten(Var("y", two_d.struct_info), 0, 1).struct_info) == (6, 20)
    s = Var("s", TensorStructInfo(("n", 3, 4, 5), "float32"))
    _check_shape(op.flatten(s, 1).struct_info, (s.shape[0], 60))
    _check_shape(op.flatten(s, -2).struct_info, (s.shape[0], 3, 20))
    assert _dims(op.flatten(Var("c", TensorStructInfo((), "float32"))).struct_info) == (1,)
    with pytest.raises(RelaxError, match="relax.flatten: end_dim"):
        op.flatten(s, 2, 1)
    with pytest.raises(RelaxError, match="relax.flatten: start_dim 4 is out of range"):
        op.flatten(s, 4)


# ---------------------------------------------------------------------------------------------
# permute_dims / expand_dims / squeeze


@pytest.mark.parametrize("axes", [None, (1, 0, 2), (2, 0, 1), (-1, -3, -2)])
def test_permute_dims(axes, rng):
    x = rng.standard_normal((2, 3, 4)).astype("float32")
    out, si = run_op(lambda a: op.permute_dims(a, axes), [x], symbolic=axes == (2, 0, 1))
    np.testing.assert_array_equal(out, np.transpose(x, axes))


def test_permute_dims_struct_info_and_errors():
    x = Var("x", TensorStructInfo(("n", 3, 4), "float32"))
    assert op.transpose is op.permute_dims
    si = op.permute_dims(x, (2, 0, 1)).struct_info
    assert si.shape[1] is x.shape[0] and _dims(si)[::2] == (4, 3)
    with pytest.raises(RelaxError, match="relax.permute_dims: axes .* not a permutation"):
        op.permute_dims(x, (0, 0, 1))
    with pytest.raises(RelaxError, match="relax.permute_dims: axes .* 2 entries"):
        op.permute_dims(x, (0, 1))
    with pytest.raises(RelaxError, match="relax.permute_dims: .*3 is out of range"):
        op.permute_dims(x, (0, 1, 3))


def test_expand_dims(rng):
    x = rng.standard_normal((2, 3)).astype("float32")
    for axis in (-1, (0, 3), (-1, 0)):
        out, si = run_op(lambda a: op.expand_dims(a, axis), [x], symbolic=axis == (0, 3))
        np.testing.assert_array_equal(out, np.expand_dims(x, axis))
    with pytest.raises(RelaxError, match="relax.expand_dims: axis 3 is out of range"):
        op.expand_dims(Var("x", TensorStructInfo((2, 3))), 3)
    with pytest.raises(RelaxError, match="relax.expand_dims: repeated axis"):
        op.expand_dims(Var("x", TensorStructInfo((2, 3))), (0, -4))


def test_squeeze(rng):
    x = rng.standard_normal((1, 3, 1, 2)).astype("float32")
    for axis in (None, 0, -2, (0, 2)):
        out, si = run_op(lambda a: op.squeeze(a, axis), [x])
        np.testing.assert_array_equal(out, np.squeeze(x, axis))
    # symbolic dims: squeeze(axis=None) keeps them; an explicit axis is checked at run time
    s = Var("s", TensorStructInfo((1, "n", 1), "float32"))
    assert s.shape[1] is op.squeeze(s).struct_info.shape[0]
    out, si = run_op(lambda a: op.squeeze(a, [0, 2]), [x], symbolic=True)
    np.testing.assert_array_equal(out, np.squeeze(x, (0, 2)))
    with pytest.raises(ValueError, match="dimension 1 .* must be 1"):
        run_op(lambda a: op.squeeze(a, 1), [x], symbolic=True)
    with pytest.raises(RelaxError, match=r"relax.squeeze: dimension 1 of \(1, 3, 1, 2\) is 3"):
        op.squeeze(Var("x", TensorStructInfo((1, 3, 1, 2))), 1)


# ---------------------------------------------------------------------------------------------
# concat / split


def test_concat_symbolic_extents_add():
    a = Var("a", TensorStructInfo(("n", 4), "float32"))
    b = Var("b", TensorStructInfo(("m", 4), "float32"))
    n, m = a.shape[0], b.shape[0]
    si = op.concat([a, b], axis=0).struct_info
    assert _equal(si.shape[0], n + m) and repr(si.shape[0]) == "n + m"
    assert si.shape[1].value == 4
    si = op.concat([a, Var("c", TensorStructInfo((3, 4), "float32")), b], axis=-2).struct_info
    assert _equal(si.shape[0], n + m + 3)
    # a symbolic dim off the axis against a static one: the static one wins
    d = Var("d", TensorStructInfo((2, "k"), "float32"))
    assert op.concat([d, Var("e", TensorStructInfo((5, 4)))], 0).struct_info.shape[1].value == 4


def test_concat_numeric(rng):
    xs = [rng.standard_normal((2, k, 3)).astype("float32") for k in (1, 4, 2)]
    for axis, sym in ((1, False), (-2, True)):
        out, si = run_op(lambda *t: op.concat(list(t), axis), xs, symbolic=sym)
        np.testing.assert_array_equal(out, np.concatenate(xs, axis))
    ys = [rng.standard_normal((k, 3)).astype("int32") for k in (2, 3)]
    out, _ = run_op(lambda a, b: op.concat([a, b]), ys, symbolic=True)
    np.testing.assert_array_equal(out, np.concatenate(ys))
    out, _ = run_op(lambda a: op.concat([a]), ys[:1])
    np.testing.assert_array_equal(out, ys[0])
    # the other dims of symbolic inputs are checked at run time
    with pytest.raises(ValueError, match="relax.concat: dimension 1 of input 1"):
        run_op(lambda a, b: op.concat([a, b]), [ys[0], np.zeros((2, 4), "int32")], symbolic=True)


def test_concat_errors():
    a = Var("a", TensorStructInfo(("n", 4), "float32"))
    with pytest.raises(RelaxError, match=r"relax.concat: dimension 1 differs: 4 .* vs 5"):
        op.concat([a, Var("b", TensorStructInfo(("n", 5), "float32"))])
    with pytest.raises(RelaxError, match="relax.concat: input 1 has dtype int32"):
        op.concat([a, Var("b", TensorStructInfo(("n", 4), "int32"))])
    with pytest.raises(RelaxError, match="relax.concat: the inputs have different ranks"):
        op.concat([a, Var("b", TensorStructInfo((4,), "float32"))])
    with pytest.raises(RelaxError, match="relax.concat: axis 2 is out of range"):
        op.concat([a, a], axis=2)


@pytest.mark.parametrize("ios,axis", [(3, 1), (2, -1), ([2, 5], 1), ([-4], 1), ([1, 10], 1),
                                      ([4, 2], 1), (1, 0)])
def test_split(ios, axis, rng):
    x = rng.standard_normal((2, 6, 4)).astype("float32")
    out, si = run_op(lambda a: op.split(a, ios, axis), [x])
    ref = np.split(x, ios, axis)
    assert len(out if isinstance(out, list) else [out]) == len(ref) == len(si.fields)
    for o, r, s in zip(out if isinstance(out, list) else [out], ref, si.fields):
        np.testing.assert_array_equal(o, r)
        assert _dims(s) == r.shape


def test_split_symbolic(rng):
    x = Var("x", TensorStructInfo(("n", 12), "float32"))
    n = x.shape[0]
    si = op.split(x, 3, 1).struct_info
    assert [_dims(f)[1] for f in si.fields] == [4, 4, 4] and si.fields[0].shape[0] is n
    si = op.split(x, 2, 0).struct_info
    _check_shape(si.fields[1], (n // 2, 12))
    data = rng.standard_normal((6, 5)).astype("float32")
    out, si = run_op(lambda a: op.split(a, 3, 0), [data], symbolic=True)
    for o, r in zip(out, np.split(data, 3, 0)):
        np.testing.assert_array_equal(o, r)
    out, si = run_op(lambda a: op.split(a, [1, 3], 1), [data], symbolic=True)
    for o, r in zip(out, np.split(data, [1, 3], 1)):
        np.testing.assert_array_equal(o, r)
    with pytest.raises(ValueError, match="relax.split: 4 sections do not divide"):
        run_op(lambda a: op.split(a, 4, 0), [data], symbolic=True)


def test_split_errors():
    x = Var("x", TensorStructInfo((2, 10), "float32"))
    with pytest.raises(RelaxError, match="relax.split: 3 sections do not divide dimension 1"):
        op.split(x, 3, 1)
    with pytest.raises(RelaxError, match="relax.split: axis 2 is out of range"):
        op.split(x, 2, 2)
    with pytest.raises(RelaxError, match="relax.split: the number of sections"):
        op.split(x, 0, 1)


# ---------------------------------------------------------------------------------------------
# strided_slice

_SLICES = [
    # (axes, begin, end, strides)
    ([0], [1], [3], None),
    ([1], [-3], [100], None),
    ([0, 1], [0, 1], [2**63 - 1, -1], [2, 2]),
    ([1], [-1], [-2**63], [-1]),                 # reverse
    ([1], [10], [0], [-3]),                      # begin past the end, negative stride
    ([0, 2], [-100, 1], [100, 2**31 - 1], [1, 2]),
    ([2], [3], [1], [1]),                        # empty
    ([-1], [0], [-1], [1]),
    ([0], [4], [-6], [-1]),
]


@pytest.mark.parametrize("axes,begin,end,strides", _SLICES)
def test_strided_slice_vs_numpy(axes, begin, end, strides, rng):
    x = rng.standard_normal((4, 7, 5)).astype("float32")
    sl = [slice(None)] * 3
    for ax, b, e, s in zip(axes, begin, end, strides or [1] * len(axes)):
        sl[ax] = slice(b, e, s)
    ref = x[tuple(sl)]
    # every case static; every other one with all dims symbolic too (extents with min / max)
    for sym in (False, True) if _SLICES.index((axes, begin, end, strides)) % 2 == 0 else (False,):
        out, si = run_op(lambda a: op.strided_slice(a, axes, begin, end, strides), [x],
                         symbolic=sym)
        np.testing.assert_array_equal(out, ref)
        if not sym:
            assert _dims(si) == ref.shape


def test_strided_slice_symbolic_extents():
    x = Var("x", TensorStructInfo((10, "n"), "float32"))
    n = x.shape[1]
    ana = arith.Analyzer()
    ana.update_bound(n, 0, None)
    # to the end: the extent is n, and n - 1 for [1:] when n >= 1
    si = op.strided_slice(x, [1], [0], [2**63 - 1]).struct_info
    assert si.shape[1] is n and si.shape[0].value == 10
    si = op.strided_slice(x, [1], [1], [2**63 - 1]).struct_info
    with ana.with_constraint(n >= 1):
        assert ana.can_prove_equal(si.shape[1], n - 1)
    si = op.strided_slice(x, [1], [-1], [-2**63], [-1]).struct_info
    assert si.shape[1] is n
    si = op.strided_slice(x, [1], [1], [-1], assume_inbound=True).struct_info
    assert _equal(si.shape[1], n - 2)
    # the static dim stays static
    assert _dims(op.strided_slice(x, [0, 1], [-3, 0], [100, 2]).struct_info)[0] == 3


def test_strided_slice_errors():
    x = Var("x", TensorStructInfo((4, 5), "float32"))
    with pytest.raises(RelaxError, match="relax.strided_slice: a stride cannot be 0"):
        op.strided_slice(x, [0], [0], [2], [0])
    with pytest.raises(RelaxError, match="relax.strided_slice: axes entry 2 is out of range"):
        op.strided_slice(x, [2], [0], [2])
    with pytest.raises(RelaxError, match="same length"):
        op.strided_slice(x, [0, 1], [0], [2])


# ---------------------------------------------------------------------------------------------
# tile / broadcast_to / repeat / flip / pad


@pytest.mark.parametrize("reps", [(2,), (2, 3), (2, 1, 2), (0, 1)])
def test_tile(reps, rng):
    x = rng.standard_normal((2, 3)).astype("float32")
    out, si = run_op(lambda a: op.tile(a, reps), [x], symbolic=reps == (2, 3))
    np.testing.assert_array_equal(out, np.tile(x, reps))


def test_broadcast_to(rng):
    x = rng.standard_normal((3, 1)).astype("float32")
    out, si = run_op(lambda a: op.broadcast_to(a, (2, 3, 4)), [x])
    np.testing.assert_array_equal(out, np.broadcast_to(x, (2, 3, 4)))
    assert _dims(si) == (2, 3, 4)
    # symbolic: (d0, d1) to (d1_0, d0, 4) with d1 assumed to be 4 and checked at run time
    # (a symbolic dim is never broadcast at run time, as for the elementwise ops)
    y = rng.standard_normal((3, 4)).astype("float32")
    out, si = run_op(lambda a, b: op.broadcast_to(a, (b.shape[0], a.shape[0], 4)),
                     [y, np.zeros(2, "float32")], symbolic=True)
    np.testing.assert_array_equal(out, np.broadcast_to(y, (2, 3, 4)))
    with pytest.raises(ValueError, match="relax.broadcast_to: dimension d0_1 and dimension 4"):
        run_op(lambda a, b: op.broadcast_to(a, (b.shape[0], a.shape[0], 4)),
               [x, np.zeros(2, "float32")], symbolic=True)
    s = Var("s", TensorStructInfo((1, 4), "float32"))
    si = op.broadcast_to(s, ("n", 3, 4)).struct_info
    assert isinstance(si.shape[0], TirVar) and _dims(si)[1:] == (3, 4)
    with pytest.raises(RelaxError, match="relax.broadcast_to"):
        op.broadcast_to(s, (3, 5))
    with pytest.raises(RelaxError, match="relax.broadcast_to: cannot broadcast .* lower rank"):
        op.broadcast_to(s, (4,))
    with pytest.raises(RelaxError, match="relax.broadcast_to: cannot broadcast"):
        op.broadcast_to(Var("t", TensorStructInfo((3,), "float32")), (1,))


def test_repeat_and_flip(rng):
    x = rng.standard_normal((2, 3)).astype("float32")
    for axis in (None, 0, -1):
        out, _ = run_op(lambda a: op.repeat(a, 3, axis), [x], symbolic=axis == -1)
        np.testing.assert_array_equal(out, np.repeat(x, 3, axis))
    for axis in (-1, (0, 1)):
        out, _ = run_op(lambda a: op.flip(a, axis), [x], symbolic=axis == -1)
        np.testing.assert_array_equal(out, np.flip(x, axis))
    with pytest.raises(RelaxError, match="relax.flip: axis 2 is out of range"):
        op.flip(Var("x", TensorStructInfo((2, 3))), 2)


@pytest.mark.parametrize("mode,width", [("constant", [(1, 2), (0, 1)]),
                                        ("constant", [(-1, 1), (2, -1)]),
                                        ("edge", [(2, 1), (1, 3)]),
                                        ("reflect", [(1, 1), (2, 0)])])
def test_pad(mode, width, rng):
    x = rng.standard_normal((3, 4)).astype("float32")
    kw = {"constant_values": 1.5} if mode == "constant" else {}
    if mode == "constant" and min(min(w) for w in width) < 0:
        # negative widths crop (ONNX Pad): pad the positive part, then slice
        pos = [(max(b, 0), max(a, 0)) for b, a in width]
        ref = np.pad(x, pos, mode, **kw)
        ref = ref[tuple(slice(-min(b, 0), ref.shape[d] + min(a, 0))
                        for d, (b, a) in enumerate(width))]
    else:
        ref = np.pad(x, width, mode, **kw)
    out, si = run_op(lambda a: op.pad(a, width, 1.5, mode), [x], symbolic=mode != "constant")
    np.testing.assert_array_equal(out, ref)
    flat = [w for p in width for w in p]
    assert op.pad(Var("v", TensorStructInfo((3, 4))), flat, 1.5, mode).struct_info.shape == \
        si.shape or mode != "constant"  # TVM's flat form is the same op


def test_pad_struct_info_and_errors():
    x = Var("x", TensorStructInfo(("n", 3), "int32"))
    _check_shape(op.pad(x, [(1, 2), (0, 1)]).struct_info, (x.shape[0] + 3, 4))
    with pytest.raises(RelaxError, match="relax.pad: pad_width needs 4 entries"):
        op.pad(x, [1, 2])
    with pytest.raises(RelaxError, match="relax.pad: reflect padding"):
        op.pad(Var("y", TensorStructInfo((2, 3))), [(0, 0), (3, 0)], pad_mode="reflect")
    with pytest.raises(RelaxError, match="relax.pad: unknown pad_mode"):
        op.pad(x, [(0, 0), (0, 0)], pad_mode="wrap")
    with pytest.raises(RelaxError, match="relax.pad: negative pad widths"):
        op.pad(x, [(0, 0), (-1, 0)], pad_mode="edge")


# ---------------------------------------------------------------------------------------------


def test_patterns_and_unknown_shapes():
    for name in ("reshape", "flatten", "permute_dims", "expand_dims", "squeeze", "concat",
                 "split", "strided_slice", "tile", "pad", "flip", "repeat"):
        assert Op.get(f"relax.{name}").pattern == OpPattern.INJECTIVE, name
    assert Op.get("relax.broadcast_to").pattern == OpPattern.BROADCAST
    u = Var("u", TensorStructInfo(None, "float32", ndim=3))
    assert op.permute_dims(u).struct_info.ndim == 3
    assert op.expand_dims(u, 0).struct_info.ndim == 4
    assert op.flatten(u, 1).struct_info.ndim == 2
    assert op.reshape(u, (2, 3)).struct_info.shape[1].value == 3
    with pytest.raises(RelaxError, match="relax.permute_dims: .* not a tensor|must be a tensor"):
        op.permute_dims(ShapeExpr((2, 3)))
