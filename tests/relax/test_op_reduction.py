"""relax.op reductions (sum, mean, max, min, prod, variance, std, argmax, argmin): struct info,
errors naming the op, and the kernels against numpy."""
import numpy as np
import pytest

from oputil import run_op
from tilecraft.relax import RelaxError, TensorStructInfo, Var, op
from tilecraft.relax.op import OpPattern

RNG = np.random.default_rng(1)


def rand(shape, dtype="float32", lo=-2.0, hi=2.0):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def _np_axis(axis):
    return tuple(axis) if isinstance(axis, list) else axis


# ---------------------------------------------------------------------------------------------
# struct info and errors

def test_struct_info():
    x = Var("x", TensorStructInfo(("n", 8, 4), "float32"))
    assert repr(op.sum(x, axis=[1, -1]).struct_info) == "Tensor((n), 'float32')"
    assert repr(op.mean(x, axis=1, keepdims=True).struct_info) == "Tensor((n, 1, 4), 'float32')"
    assert repr(op.max(x).struct_info) == "Tensor((), 'float32')"
    assert repr(op.prod(x, keepdims=True).struct_info) == "Tensor((1, 1, 1), 'float32')"
    assert repr(op.argmax(x, axis=0).struct_info) == "Tensor((8, 4), 'int64')"
    assert repr(op.argmin(x, keepdims=True).struct_info) == "Tensor((1, 1, 1), 'int64')"
    assert repr(op.variance(x, axis=[]).struct_info) == "Tensor((n, 8, 4), 'float32')"
    u = Var("u", TensorStructInfo(None, "float32", ndim=3))
    assert op.sum(u, axis=1).struct_info.ndim == 2
    assert op.sum(u, axis=1, keepdims=True).struct_info.ndim == 3
    for name in ("sum", "mean", "max", "min", "prod", "variance", "std", "argmax", "argmin"):
        assert op.get("relax." + name).pattern == OpPattern.COMM_REDUCE


def test_errors_name_the_op():
    x = Var("x", TensorStructInfo(("n", 8), "float32"))
    with pytest.raises(RelaxError, match=r"relax\.sum: axis 2 is out of range for a tensor of "
                                         r"rank 2"):
        op.sum(x, axis=2)
    with pytest.raises(RelaxError, match=r"relax\.max: axis -3 is out of range"):
        op.max(x, axis=[0, -3])
    with pytest.raises(RelaxError, match=r"relax\.prod: axis \[1, -1\] repeats a dimension"):
        op.prod(x, axis=[1, -1])
    with pytest.raises(RelaxError, match=r"relax\.mean: needs a float tensor, got int32"):
        op.mean(Var("i", TensorStructInfo((4,), "int32")))
    with pytest.raises(RelaxError, match=r"relax\.sum: needs a numeric"):
        op.sum(Var("b", TensorStructInfo((4,), "bool")))
    with pytest.raises(RelaxError, match=r"relax\.argmax: axis must be None or an int"):
        op.argmax(x, axis=[0, 1])
    with pytest.raises(RelaxError, match=r"relax\.argmin: axis 5 is out of range"):
        op.argmin(x, axis=5)
    with pytest.raises(RelaxError, match=r"relax\.sum: axis must be None, an int or a list"):
        op.sum(x, axis="a")


# ---------------------------------------------------------------------------------------------
# kernels

REDUCE = {
    "sum": (op.sum, np.sum),
    "mean": (op.mean, np.mean),
    "max": (op.max, np.max),
    "min": (op.min, np.min),
    "prod": (op.prod, np.prod),
}

AXES = [(None, False), (-1, True), ([0, 2], False)]


@pytest.mark.parametrize("name", list(REDUCE))
@pytest.mark.parametrize("axis,keepdims", AXES)
def test_float_reductions(name, axis, keepdims):
    f, ref = REDUCE[name]
    a = rand((2, 3, 4), lo=0.5, hi=1.5) if name == "prod" else rand((2, 3, 4))
    out, si = run_op(lambda x: f(x, axis=axis, keepdims=keepdims), [a])
    expect = ref(a.astype(np.float64), axis=_np_axis(axis), keepdims=keepdims)
    assert si.static_shape() == np.shape(expect)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(REDUCE))
def test_reductions_symbolic(name):
    f, ref = REDUCE[name]
    a = rand((3, 5), lo=0.5, hi=1.5)
    out, si = run_op(lambda x: f(x, axis=0), [a], symbolic=True)
    assert repr(si) == "Tensor((d0_1), 'float32')"
    np.testing.assert_allclose(out, ref(a.astype(np.float64), axis=0), rtol=1e-5)


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
def test_int_reductions(name):
    f, ref = REDUCE[name]
    a = rand((3, 4), "int32", -5, 5)
    out, si = run_op(lambda x: f(x, axis=1), [a])
    assert si.dtype == "int32" and out.dtype == np.int32
    np.testing.assert_array_equal(out, ref(a, axis=1).astype(np.int32))


def test_empty_axis_list_and_zero_dim_input():
    a = rand((2, 3))
    out, si = run_op(lambda x: op.sum(x, axis=[]), [a])
    np.testing.assert_array_equal(out, a)
    s = np.array(1.25, dtype="float32")
    out, si = run_op(lambda x: op.sum(x), [s])
    assert si.ndim == 0 and float(out) == 1.25


def test_float16_accumulates_in_float32():
    a = rand((4, 300), "float16", 0.0, 1.0)
    out, si = run_op(lambda x: op.sum(x, axis=1), [a])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, a.astype(np.float32).sum(1).astype(np.float16), rtol=1e-3)
    out, _ = run_op(lambda x: op.mean(x, axis=-1), [a])
    np.testing.assert_allclose(out, a.astype(np.float32).mean(1).astype(np.float16), rtol=1e-3)


@pytest.mark.parametrize("name,ref", [("argmax", np.argmax), ("argmin", np.argmin)])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (1, True), (-1, False)])
def test_argmax_argmin(name, ref, axis, keepdims):
    a = rand((3, 4, 5), "int32", -3, 3).astype("float32")  # many ties: the first one wins
    out, si = run_op(lambda x: getattr(op, name)(x, axis=axis, keepdims=keepdims), [a])
    expect = ref(a, axis=axis, keepdims=keepdims)
    assert si.dtype == "int64" and out.dtype == np.int64
    np.testing.assert_array_equal(out, expect)


def test_argmax_symbolic_int_and_nan():
    a = rand((4, 6), "int32", -10, 10)
    out, si = run_op(lambda x: op.argmax(x, axis=1), [a], symbolic=True)
    assert repr(si) == "Tensor((d0_0), 'int64')"
    np.testing.assert_array_equal(out, np.argmax(a, axis=1))
    f = rand((2, 5))
    f[0, 3] = np.nan
    out, _ = run_op(lambda x: op.argmax(x, axis=1), [f])
    np.testing.assert_array_equal(out, np.argmax(f, axis=1))


@pytest.mark.parametrize("name,ref", [("variance", np.var), ("std", np.std)])
@pytest.mark.parametrize("axis,keepdims", [(None, False), ([0, 2], True), (-1, False)])
def test_variance_std(name, ref, axis, keepdims):
    a = rand((3, 4, 5)) + 10.0  # an offset: a one-pass formula would lose digits
    out, si = run_op(lambda x: getattr(op, name)(x, axis=axis, keepdims=keepdims), [a])
    expect = ref(a.astype(np.float64), axis=_np_axis(axis), keepdims=keepdims)
    assert si.static_shape() == np.shape(expect)
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-6)


def test_variance_symbolic():
    a = rand((6, 4))
    out, si = run_op(lambda x: op.variance(x, axis=0, keepdims=True), [a], symbolic=True)
    assert repr(si) == "Tensor((1, d0_1), 'float32')"
    np.testing.assert_allclose(out, np.var(a.astype(np.float64), axis=0, keepdims=True),
                               rtol=1e-5)
