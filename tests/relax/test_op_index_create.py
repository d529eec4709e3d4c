"""Indexing, creation and misc operators (relax/op/index.py, create.py, misc.py) against numpy:
take / gather / scatter, arange / full / eye / tril / triu, cumsum, topk, shape_of."""
import numpy as np
import pytest

from tilecraft import targets
from oputil import run_op
from tilecraft.relax import (BlockBuilder, RelaxError, ShapeExpr, ShapeStructInfo, TensorStructInfo,
                   TupleStructInfo, Var, const, op)
from tilecraft.relax.op.base import Op, OpPattern
from tilecraft.tensorir import arith
from tilecraft.tensorir.expr import IntImm, Var as TirVar


@pytest.fixture
def rng():
    return np.random.default_rng(4321)


def _dims(si):
    return tuple(d.value if isinstance(d, IntImm) else d for d in si.shape)


def _equal(a, b):
    return arith.Analyzer().can_prove_equal(a, b)


# ---------------------------------------------------------------------------------------------
# take / gather_elements / gather_nd


@pytest.mark.parametrize("axis,ishape,mode,sym", [(0, (3,), "fast", False),
                                                  (1, (2, 3), "fast", True),
                                                  (-1, (4,), "wrap", False),
                                                  (None, (2, 2), "fast", False),
                                                  (1, (5,), "clip", True)])
def test_take(axis, ishape, mode, sym, rng):
    x = rng.standard_normal((4, 5, 3)).astype("float32")
    n = x.size if axis is None else x.shape[axis]
    if mode == "fast":  # in range, negatives counting from the end (ONNX Gather)
        ind = rng.integers(-n, n, ishape).astype("int32")
    else:
        ind = rng.integers(-2 * n, 2 * n, ishape).astype("int64")
    out, si = run_op(lambda a, i: op.take(a, i, axis, mode), [x, ind], symbolic=sym)
    ref = np.take(x, ind, axis, mode="raise" if mode == "fast" else mode)
    np.testing.assert_array_equal(out, ref)
    if not sym:
        assert _dims(si) == ref.shape


def test_take_struct_info_and_errors():
    x = Var("x", TensorStructInfo(("n", 16), "float32"))
    i = Var("i", TensorStructInfo(("b", "s"), "int64"))
    si = op.take(x, i, axis=0).struct_info
    assert si.shape[0] is i.shape[0] and si.shape[1] is i.shape[1] and si.shape[2].value == 16
    assert op.take(x, Var("j", TensorStructInfo((), "int64")), 1).struct_info.ndim == 1
    with pytest.raises(RelaxError, match="relax.take: indices must have an integer dtype"):
        op.take(x, Var("f", TensorStructInfo((2,), "float32")), 0)
    with pytest.raises(RelaxError, match="relax.take: axis 2 is out of range"):
        op.take(x, i, 2)
    with pytest.raises(RelaxError, match="relax.take: unknown mode"):
        op.take(x, i, 0, mode="nearest")
    # an index out of range after wrapping negatives is caught at run time
    with pytest.raises(ValueError, match="out of bounds"):
        run_op(lambda a, j: op.take(a, j, 0), [np.zeros((3, 2), "float32"),
                                               np.array([0, 3], "int64")])


def test_gather_elements(rng):
    x = rng.standard_normal((3, 4, 2)).astype("float32")
    for axis, sym in ((0, False), (1, True), (-1, False)):
        shape = list(x.shape)
        shape[axis] = 5
        ind = rng.integers(-x.shape[axis], x.shape[axis], shape)
        out, si = run_op(lambda a, i: op.gather_elements(a, i, axis), [x, ind], symbolic=sym)
        np.testing.assert_array_equal(out, np.take_along_axis(x, ind % x.shape[axis], axis))
    with pytest.raises(RelaxError, match="relax.gather_elements: indices of rank 1"):
        op.gather_elements(Var("x", TensorStructInfo((3, 4))),
                           Var("i", TensorStructInfo((3,), "int64")))


def test_gather_nd(rng):
    x = rng.standard_normal((4, 5, 6)).astype("float32")
    ind = np.stack([rng.integers(0, 4, (3, 2)), rng.integers(-5, 5, (3, 2))], -1)  # (3, 2, 2)
    out, si = run_op(lambda a, i: op.gather_nd(a, i), [x, ind])
    np.testing.assert_array_equal(out, x[ind[..., 0], ind[..., 1]])
    assert _dims(si) == (3, 2, 6)
    # batch_dims=1: indices (4, 3, 1) index dim 1 of each batch
    ind = rng.integers(0, 5, (4, 3, 1))
    out, si = run_op(lambda a, i: op.gather_nd(a, i, batch_dims=1), [x, ind],
                     symbolic=[True, False])
    ref = np.stack([x[b][ind[b, :, 0]] for b in range(4)])
    np.testing.assert_array_equal(out, ref)
    with pytest.raises(RelaxError, match="relax.gather_nd: batch_dims 0 and an index depth of 4"):
        op.gather_nd(Var("x", TensorStructInfo((4, 5, 6))),
                     Var("i", TensorStructInfo((2, 4), "int64")))


def _scatter_ref(x, ind, upd, axis, reduction):
    out = x.copy()
    fn = {"update": lambda a, b: b, "add": lambda a, b: a + b, "mul": lambda a, b: a * b,
          "min": min, "max": max}[reduction]
    for pos in np.ndindex(ind.shape):
        tgt = list(pos)
        tgt[axis] = ind[pos] % x.shape[axis]
        out[tuple(tgt)] = fn(out[tuple(tgt)], upd[pos])
    return out


@pytest.mark.parametrize("reduction", ["update", "add", "mul", "min", "max"])
def test_scatter_elements(reduction, rng):
    x = rng.standard_normal((4, 3)).astype("float32")
    for axis, sym in ((0, reduction in ("add", "update")), (-1, False)):
        shape = (6, 3) if axis == 0 else (4, 5)  # more updates than slots: duplicates
        n = x.shape[axis]
        ind = rng.integers(-n, n, shape).astype("int64")
        upd = rng.standard_normal(shape).astype("float32")
        out, si = run_op(lambda a, i, u: op.scatter_elements(a, i, u, axis, reduction),
                         [x, ind, upd], symbolic=sym)
        np.testing.assert_allclose(out, _scatter_ref(x, ind, upd, axis % 2, reduction),
                                   rtol=1e-6)
        assert si == TensorStructInfo((4, 3), "float32") or sym


def test_scatter_elements_errors():
    x = Var("x", TensorStructInfo((4, 3), "float32"))
    i = Var("i", TensorStructInfo((2, 3), "int64"))
    with pytest.raises(RelaxError, match="relax.scatter_elements: indices .* and updates .* "
                                         "differ in dimension 1"):
        op.scatter_elements(x, i, Var("u", TensorStructInfo((2, 2), "float32")))
    with pytest.raises(RelaxError, match="relax.scatter_elements: updates have dtype int32"):
        op.scatter_elements(x, i, Var("u", TensorStructInfo((2, 3), "int32")))
    with pytest.raises(RelaxError, match="relax.scatter_elements: unknown reduction"):
        op.scatter_elements(x, i, i, reduction="sum")
    assert Op.get("relax.scatter_elements").pattern == OpPattern.OPAQUE


# ---------------------------------------------------------------------------------------------
# creation


def _run_0d(make, value):
    """Legalize ``make(v)`` for a 0-d tensor Var ``v`` and run its kernel on ``value`` (run_op
    turns 0-d inputs into 1-element arrays)."""
    bb = BlockBuilder()
    v = Var("v", TensorStructInfo((), str(value.dtype)))
    with bb.function("main", [v]):
        call = make(v)
        res = bb.emit(call.op.legalize(bb, call))
        bb.emit_func_output(res)
    legal = bb.lookup_binding(res)
    name = legal.args[0].name_hint
    out = np.zeros(tuple(d.value for d in call.struct_info.shape), call.struct_info.dtype)
    targets.build(bb.get()[name], "llvm")[name](value, out)
    return out


def test_arange(rng):
    for args, dtype in (((5,), None), ((2, 11, 3), None), ((10, 0, -3), "int32"),
                        ((0.5, 2.0, 0.25), None), ((1, 1), None)):
        out, si = run_op(lambda: op.arange(*args, dtype=dtype), [])
        ref = np.arange(*args, dtype=dtype or (None if isinstance(args[0], float) else "int64"))
        np.testing.assert_allclose(out, ref.astype(si.dtype), rtol=1e-6)
        assert _dims(si) == ref.shape
    assert op.arange(0.5, 2.0, 0.25).struct_info.dtype == "float32"
    # a symbolic end: the length is ceil((n - 1) / 2) and the kernel takes n as a scalar
    x = np.zeros((7, 2), "float32")
    out, si = run_op(lambda a: op.arange(1, a.shape[0], 2), [x], symbolic=True)
    np.testing.assert_array_equal(out, np.arange(1, 7, 2))
    n = TirVar("n", "int64")
    assert _equal(op.arange(0, n, 2).struct_info.shape[0], (n + 1) // 2)
    assert op.arange(n).struct_info.shape[0] is n
    with pytest.raises(RelaxError, match="relax.arange: step cannot be 0"):
        op.arange(0, 5, 0)


def test_full_zeros_ones(rng):
    out, si = run_op(lambda: op.full((2, 3), 1.5), [])
    np.testing.assert_array_equal(out, np.full((2, 3), 1.5, "float32"))
    out, si = run_op(lambda: op.full((4,), 7, "int32"), [])
    assert out.dtype == np.int32 and (out == 7).all()
    # a fill value computed at run time (a 0-d tensor)
    out = _run_0d(lambda v: op.full((3, 4), v), np.array(2.5, "float32"))
    np.testing.assert_array_equal(out, np.full((3, 4), 2.5, "float32"))
    x = rng.standard_normal((3, 2)).astype("float32")
    out, si = run_op(lambda a: op.full((a.shape[0], 4), 2.5), [x], symbolic=True)
    np.testing.assert_array_equal(out, np.full((3, 4), 2.5, "float32"))
    out, si = run_op(lambda a: op.zeros((a.shape[1], 3), "int64"), [x], symbolic=True)
    np.testing.assert_array_equal(out, np.zeros((2, 3), "int64"))
    out, si = run_op(lambda: op.ones((2, 2)), [])
    np.testing.assert_array_equal(out, np.ones((2, 2), "float32"))
    assert op.zeros(("n", 4)).struct_info.ndim == 2
    with pytest.raises(RelaxError, match="relax.full: fill_value must be a 0-d tensor"):
        op.full((2,), const(np.ones(2, "float32")))


def test_like_ops(rng):
    x = rng.standard_normal((3, 2)).astype("float32")
    for make, ref in ((lambda a: op.full_like(a, 4), np.full_like(x, 4)),
                      (lambda a: op.zeros_like(a, "int32"), np.zeros_like(x, "int32")),
                      (lambda a: op.ones_like(a), np.ones_like(x))):
        out, si = run_op(make, [x], symbolic=True)
        assert out.dtype == ref.dtype
        np.testing.assert_array_equal(out, ref)
    v = Var("v", TensorStructInfo((), "int64"))
    call = op.full_like(Var("x", TensorStructInfo((3, 2), "float32")), v, "float32")
    assert call.struct_info == TensorStructInfo((3, 2), "float32")
    assert Op.get("relax.zeros_like").pattern == OpPattern.ELEMWISE


def test_eye_tril_triu(rng):
    out, si = run_op(lambda: op.eye(3, 4, 1), [])
    np.testing.assert_array_equal(out, np.eye(3, 4, 1, dtype="float32"))
    out, si = run_op(lambda: op.eye(4, k=-2, dtype="int32"), [])
    np.testing.assert_array_equal(out, np.eye(4, k=-2, dtype="int32"))
    x = rng.standard_normal((2, 4, 5)).astype("float32")
    for k in (0, 1, -2):
        out, _ = run_op(lambda a: op.tril(a, k), [x], symbolic=k == 1)
        np.testing.assert_array_equal(out, np.tril(x, k))
        out, _ = run_op(lambda a: op.triu(a, k), [x])
        np.testing.assert_array_equal(out, np.triu(x, k))
    # a causal mask over a KV cache: k = kv_len - q_len, symbolic
    out, _ = run_op(lambda a: op.triu(a, a.shape[2] - a.shape[1] + 1), [x], symbolic=True)
    np.testing.assert_array_equal(out, np.triu(x, 5 - 4 + 1))
    with pytest.raises(RelaxError, match="relax.tril: needs a tensor of rank >= 2"):
        op.tril(Var("v", TensorStructInfo((3,), "float32")))


# ---------------------------------------------------------------------------------------------
# cumsum


@pytest.mark.parametrize("axis,exclusive,dtype,sym", [(1, False, None, True),
                                                      (-1, True, None, False),
                                                      (0, True, "int64", True),
                                                      (None, False, None, False)])
def test_cumsum(axis, exclusive, dtype, sym, rng):
    x = rng.integers(-5, 5, (3, 4, 2)).astype("int32") if dtype else \
        rng.standard_normal((3, 4, 2)).astype("float32")
    out, si = run_op(lambda a: op.cumsum(a, axis, dtype, exclusive), [x], symbolic=sym)
    ref = np.cumsum(x, axis, dtype=dtype)
    if exclusive:
        ref = ref - x.astype(ref.dtype)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_cumsum_struct_info():
    x = Var("x", TensorStructInfo(("n", 8), "int32"))
    assert op.cumsum(x, 1, "int64").struct_info.dtype == "int64"
    assert _equal(op.cumsum(x).struct_info.shape[0], x.shape[0] * 8)
    with pytest.raises(RelaxError, match="relax.cumsum: axis 2 is out of range"):
        op.cumsum(x, 2)


# ---------------------------------------------------------------------------------------------
# topk


@pytest.mark.parametrize("k,axis,largest,sym", [(3, -1, True, False), (2, 0, False, True),
                                                (1, 1, True, False), (0, -1, False, False)])
def test_topk_vs_argsort(k, axis, largest, sym, rng):
    x = rng.standard_normal((4, 6)).astype("float32")  # unique values: indices are determined
    (vals, inds), si = run_op(lambda a: op.topk(a, k, axis, largest=largest), [x], symbolic=sym)
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    kk = x.shape[axis] if k < 1 else k
    ref_i = np.take(order, np.arange(kk), axis)
    np.testing.assert_array_equal(inds, ref_i)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, ref_i, axis))
    assert inds.dtype == np.int64 and isinstance(si, TupleStructInfo)


def test_topk_ties_and_ret_type(rng):
    x = rng.integers(0, 3, (3, 8)).astype("float32")  # many ties
    (vals, inds), _ = run_op(lambda a: op.topk(a, 5), [x])
    np.testing.assert_array_equal(vals, -np.sort(-x, axis=1)[:, :5])
    np.testing.assert_array_equal(np.take_along_axis(x, inds, 1), vals)
    # equal values come in index order
    ref_i = np.argsort(-x, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(inds, ref_i)
    vals, si = run_op(lambda a: op.topk(a, 2, ret_type="values", largest=False), [x])
    np.testing.assert_array_equal(vals, np.sort(x, axis=1)[:, :2])
    inds, si = run_op(lambda a: op.topk(a, 2, ret_type="indices", dtype="int32"), [x])
    assert inds.dtype == np.int32 and si.dtype == "int32"
    with pytest.raises(RelaxError, match=r"relax.topk: k = 9 is larger than dimension 1"):
        op.topk(Var("v", TensorStructInfo((3, 8), "float32")), 9)
    with pytest.raises(RelaxError, match="relax.topk: unknown ret_type"):
        op.topk(Var("v", TensorStructInfo((3, 8), "float32")), 2, ret_type="all")


# ---------------------------------------------------------------------------------------------
# shape_of / shape_to_tensor


def test_shape_of_is_a_builtin():
    x = Var("x", TensorStructInfo(("n", 4), "float32"))
    call = op.shape_of(x)
    si = call.struct_info
    assert isinstance(si, ShapeStructInfo) and si.values[0] is x.shape[0]
    assert si.values[1].value == 4
    assert Op.get("relax.shape_of").legalize is None  # evaluated by the VM
    u = op.shape_of(Var("u", TensorStructInfo(None, "float32", ndim=3))).struct_info
    assert u.values is None and u.ndim == 3
    with pytest.raises(RelaxError, match="relax.shape_of: data must be a tensor"):
        op.shape_of(ShapeExpr((1, 2)))
    # a shape value feeds reshape directly
    y = Var("y", TensorStructInfo(("n", 2, 2), "float32"))
    assert op.reshape(y, op.shape_of(x)).struct_info.shape[0] is x.shape[0]


def test_shape_to_tensor():
    x = np.zeros((3, 5), "float32")
    out, si = run_op(lambda a: op.shape_to_tensor(ShapeExpr((a.shape[1], 7, a.shape[0]))), [x],
                     symbolic=True)
    np.testing.assert_array_equal(out, [5, 7, 3])
    assert out.dtype == np.int64 and _dims(si) == (3,)


# ---------------------------------------------------------------------------------------------
# through relax.build and the VM


def test_compound_symbolic_dims_end_to_end(rng):
    """Kernels whose inputs have dims like ``n * 3`` or ``min(n, 2)`` take ``n`` as a scalar
    parameter (it cannot be bound from such a dim); the VM passes it."""
    from tilecraft.relax.build import build
    from tilecraft.relax.vm import VirtualMachine
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 3, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.reshape(x, (-1, 4)))                  # (n * 3, 4)
            b = bb.emit(op.cumsum(a, 0))                         # opaque: a kernel of its own
            c = bb.emit(op.strided_slice(b, [0], [1], [3]))      # (min(n * 3, 3) - 1, 4)
            t = bb.emit(op.topk(c, 2, axis=1, ret_type="indices"))
            gv = bb.emit_output([b, t])
        bb.emit_func_output(gv)
    vm = VirtualMachine(build(bb.get(), "llvm"), targets.cpu(0))
    for n in (1, 3):
        data = rng.standard_normal((n, 3, 4)).astype("float32")
        b, t = vm["main"](data)
        ref = np.cumsum(data.reshape(-1, 4), 0)
        np.testing.assert_allclose(b.numpy(), ref, rtol=1e-5)
        np.testing.assert_array_equal(t.numpy(), np.argsort(-ref[1:3], 1, kind="stable")[:, :2])
