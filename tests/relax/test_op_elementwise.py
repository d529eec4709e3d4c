"""relax.op elementwise / broadcast operators: struct-info inference (symbolic), errors naming
the op, and the legalized kernels against numpy on random data."""
import numpy as np
import pytest

from oputil import run_op
from tilecraft.relax import RelaxError, TensorStructInfo, Var, op
from tilecraft.relax.op import OpPattern
from tilecraft.relax.op.helpers import broadcast_shapes
from tilecraft.tensorir import var as tir_var

RNG = np.random.default_rng(0)


def rand(shape, dtype="float32", lo=-2.0, hi=2.0):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def nonzero(shape, dtype="float32"):
    """Values away from zero (divisors)."""
    if np.dtype(dtype).kind in "iu":
        v = RNG.integers(1, 6, size=shape)
        return (v * RNG.choice([-1, 1], size=shape)).astype(dtype)
    v = RNG.uniform(0.5, 2.0, size=shape) * RNG.choice([-1, 1], size=shape)
    return v.astype(dtype)


def sinfo_var(name, shape, dtype="float32"):
    return Var(name, TensorStructInfo(shape, dtype))


# ---------------------------------------------------------------------------------------------
# struct info

def test_broadcast_struct_info_symbolic():
    x = sinfo_var("x", ("n", 1))
    y = sinfo_var("y", (1, "m"))
    assert repr(op.add(x, y).struct_info) == "Tensor((n, m), 'float32')"
    z = sinfo_var("z", ("n", 4))
    w = sinfo_var("w", (4,))
    assert repr(op.multiply(z, w).struct_info) == "Tensor((n, 4), 'float32')"
    # two different symbolic dims: assumed equal, the left one is kept
    a, b = sinfo_var("a", ("p",)), sinfo_var("b", ("q",))
    assert repr(op.subtract(a, b).struct_info) == "Tensor((p), 'float32')"
    # a symbolic dim against a constant: the constant is kept
    c = sinfo_var("c", ("p", 3))
    assert repr(op.add(c, sinfo_var("d", (5, 3))).struct_info) == "Tensor((5, 3), 'float32')"
    # 0-d broadcasts; comparisons give bool
    s = Var("s", TensorStructInfo((), "float32"))
    assert repr(op.less(z, s).struct_info) == "Tensor((n, 4), 'bool')"
    # the same Var in both operands: provably equal
    n = tir_var("n")
    e = Var("e", TensorStructInfo((n, 2 * n), "float32"))
    f = Var("f", TensorStructInfo((1, n + n), "float32"))
    assert repr(op.add(e, f).struct_info) == "Tensor((n, 2 * n), 'float32')"


def test_broadcast_shapes_helper():
    n = tir_var("n")
    out = broadcast_shapes("relax.add", (n, 1), (1, 4))
    assert out[0] is n and out[1].value == 4
    assert broadcast_shapes("relax.add", (), (2, 3))[1].value == 3
    with pytest.raises(RelaxError, match=r"relax\.foo: cannot broadcast"):
        broadcast_shapes("relax.foo", (3,), (4,))


def test_unknown_shapes_and_patterns():
    x = Var("x", TensorStructInfo(None, "float32", ndim=2))
    y = sinfo_var("y", (3, 1, 4))
    si = op.add(x, y).struct_info
    assert si.shape is None and si.ndim == 3
    assert op.exp(x).struct_info.ndim == 2
    assert op.get("relax.add").pattern == OpPattern.BROADCAST
    assert op.get("relax.where").pattern == OpPattern.BROADCAST
    assert op.get("relax.exp").pattern == OpPattern.ELEMWISE
    assert op.get("relax.astype").pattern == OpPattern.ELEMWISE


def test_errors_name_the_op():
    x = sinfo_var("x", ("n", 4))
    with pytest.raises(RelaxError, match=r"relax\.add: cannot broadcast.*4.*5"):
        op.add(x, sinfo_var("y", ("n", 5)))
    n = tir_var("n")
    with pytest.raises(RelaxError, match=r"relax\.maximum: cannot broadcast"):
        op.maximum(Var("a", TensorStructInfo((n,), "float32")),
                   Var("b", TensorStructInfo((n + 1,), "float32")))
    with pytest.raises(RelaxError, match=r"relax\.multiply: operand dtypes differ.*float32.*int32"):
        op.multiply(x, sinfo_var("i", ("n", 4), "int32"))
    with pytest.raises(RelaxError, match=r"relax\.exp: needs a float tensor, got int32"):
        op.exp(sinfo_var("i", (4,), "int32"))
    with pytest.raises(RelaxError, match=r"relax\.logical_and: needs a bool tensor"):
        op.logical_and(x, x)
    with pytest.raises(RelaxError, match=r"relax\.less: needs a numeric"):
        b = sinfo_var("b", (4,), "bool")
        op.less(b, b)
    with pytest.raises(RelaxError, match=r"relax\.where: the condition must be a bool"):
        op.where(x, x, x)
    with pytest.raises(RelaxError, match=r"relax\.where: operand dtypes differ"):
        op.where(sinfo_var("c", (4,), "bool"), x, sinfo_var("i", (4,), "int32"))
    with pytest.raises(RelaxError, match=r"relax\.add: cannot combine the Python float 1\.5"):
        op.add(sinfo_var("i", (4,), "int32"), 1.5)
    with pytest.raises(RelaxError, match=r"relax\.astype: unknown dtype"):
        op.astype(x, "float33")
    with pytest.raises(RelaxError, match=r"relax\.clip: min must be a Python number"):
        op.clip(x, "a", 1.0)
    with pytest.raises(RelaxError, match=r"relax\.negative: the input must be a tensor"):
        from tilecraft.relax import ShapeExpr
        op.negative(ShapeExpr((2, 3)))


def test_python_scalars_take_the_tensor_dtype():
    h = sinfo_var("h", (2, 3), "float16")
    assert op.add(h, 1.5).struct_info.dtype == "float16"
    assert op.multiply(2, sinfo_var("i", (4,), "int8")).struct_info.dtype == "int8"
    assert op.where(sinfo_var("c", (2, 1), "bool"), h, 0.0).struct_info.dtype == "float16"
    assert repr(op.add(Var("s", TensorStructInfo((), "float32")), 1.0).struct_info) == \
        "Tensor((), 'float32')"


# ---------------------------------------------------------------------------------------------
# kernels: binary float ops

FLOAT_BINARY = {
    "add": (op.add, np.add),
    "subtract": (op.subtract, np.subtract),
    "multiply": (op.multiply, np.multiply),
    "divide": (op.divide, np.divide),
    "floor_divide": (op.floor_divide, lambda a, b: np.floor(a / b)),
    "mod": (op.mod, np.fmod),
    "floor_mod": (op.floor_mod, np.mod),
    "power": (op.power, np.power),
    "maximum": (op.maximum, np.maximum),
    "minimum": (op.minimum, np.minimum),
}


@pytest.mark.parametrize("name", list(FLOAT_BINARY))
def test_float_binary_symbolic(name):
    f, ref = FLOAT_BINARY[name]
    if name == "power":
        a, b = rand((3, 5), lo=0.5, hi=2.0), rand((3, 5))
    else:
        a, b = rand((3, 5)), nonzero((3, 5))
    out, si = run_op(f, [a, b], symbolic=True)
    assert repr(si) == "Tensor((d0_0, d0_1), 'float32')"
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref(a, b), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("shapes", [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (3, 4)),
                                    ((2, 1, 4), (3, 1)), ((1,), ())])
def test_broadcast_corner_cases(shapes):
    a, b = rand(shapes[0]), rand(shapes[1])
    out, si = run_op(op.add, [a, b])
    np.testing.assert_allclose(out, a + b, rtol=1e-6)
    assert si.static_shape() == np.broadcast_shapes(*shapes)
    out, _ = run_op(op.subtract, [b, a])
    np.testing.assert_allclose(out, b - a, rtol=1e-6)


def test_broadcast_symbolic_with_static():
    a, b = rand((3, 4)), rand((1, 4))
    out, si = run_op(op.multiply, [a, b], symbolic=[True, False])
    assert repr(si) == "Tensor((d0_0, 4), 'float32')"
    np.testing.assert_allclose(out, a * b, rtol=1e-6)


def test_symbolic_dims_checked_at_run_time():
    with pytest.raises(Exception, match=r"relax\.add: dimension d0_0 and dimension d1_0 must be "
                                        r"equal"):
        run_op(op.add, [rand((3,)), rand((4,))], symbolic=True)


def test_scalar_operands():
    a = rand((2, 3))
    out, _ = run_op(lambda x: op.multiply(x, 3.0), [a])
    np.testing.assert_allclose(out, a * 3.0, rtol=1e-6)
    out, _ = run_op(lambda x: op.subtract(1.0, x), [a])
    np.testing.assert_allclose(out, 1.0 - a, rtol=1e-6)


def test_float16_and_float64():
    a, b = rand((4, 3), "float16"), rand((4, 3), "float16")
    out, si = run_op(op.add, [a, b])
    assert si.dtype == "float16" and out.dtype == np.float16
    np.testing.assert_array_equal(out, a + b)
    c, d = rand((5,), "float64"), nonzero((5,), "float64")
    out, _ = run_op(op.divide, [c, d])
    np.testing.assert_allclose(out, c / d, rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# kernels: integer arithmetic

INT_BINARY = {
    "add": (op.add, np.add),
    "subtract": (op.subtract, np.subtract),
    "multiply": (op.multiply, np.multiply),
    "divide": (op.divide, lambda a, b: np.fix(a / b).astype(a.dtype)),  # truncating
    "floor_divide": (op.floor_divide, np.floor_divide),
    "mod": (op.mod, np.fmod),
    "floor_mod": (op.floor_mod, np.mod),
    "maximum": (op.maximum, np.maximum),
    "minimum": (op.minimum, np.minimum),
}


@pytest.mark.parametrize("name", list(INT_BINARY))
def test_int_binary(name):
    f, ref = INT_BINARY[name]
    a, b = rand((4, 5), "int32", -20, 20), nonzero((1, 5), "int32")
    out, si = run_op(f, [a, b])
    assert si.dtype == "int32" and out.dtype == np.int32
    np.testing.assert_array_equal(out, ref(a, b))


def test_int_power_and_int64():
    a, b = rand((6,), "int64", -3, 3), rand((6,), "int64", 0, 4)
    out, _ = run_op(op.power, [a, b])
    np.testing.assert_array_equal(out, np.power(a, b))
    out, _ = run_op(op.add, [a, b], symbolic=True)
    np.testing.assert_array_equal(out, a + b)


# ---------------------------------------------------------------------------------------------
# kernels: comparisons and logic

COMPARE = {
    "equal": (op.equal, np.equal),
    "not_equal": (op.not_equal, np.not_equal),
    "less": (op.less, np.less),
    "less_equal": (op.less_equal, np.less_equal),
    "greater": (op.greater, np.greater),
    "greater_equal": (op.greater_equal, np.greater_equal),
}


@pytest.mark.parametrize("name", list(COMPARE))
def test_comparisons_float(name):
    f, ref = COMPARE[name]
    a = rand((3, 4), "int32", -2, 2).astype("float32")  # small integers: many ties
    b = rand((4,), "int32", -2, 2).astype("float32")
    out, si = run_op(f, [a, b])
    assert si.dtype == "bool" and out.dtype == np.bool_
    np.testing.assert_array_equal(out, ref(a, b))


@pytest.mark.parametrize("name", ["equal", "less_equal"])
def test_comparisons_int_symbolic(name):
    f, ref = COMPARE[name]
    a, b = rand((3, 4), "int32", -2, 2), rand((3, 4), "int32", -2, 2)
    out, si = run_op(f, [a, b], symbolic=True)
    assert repr(si) == "Tensor((d0_0, d0_1), 'bool')"
    np.testing.assert_array_equal(out, ref(a, b))


@pytest.mark.parametrize("name,ref", [("logical_and", np.logical_and),
                                      ("logical_or", np.logical_or),
                                      ("logical_xor", np.logical_xor)])
def test_logical_binary(name, ref):
    a, b = rand((3, 4), "bool"), rand((3, 1), "bool")
    out, si = run_op(getattr(op, name), [a, b])
    assert si.dtype == "bool"
    np.testing.assert_array_equal(out, ref(a, b))


def test_logical_not_and_bool_equal():
    a = rand((5, 2), "bool")
    out, _ = run_op(op.logical_not, [a], symbolic=True)
    np.testing.assert_array_equal(out, ~a)
    b = rand((5, 2), "bool")
    out, _ = run_op(op.equal, [a, b])
    np.testing.assert_array_equal(out, a == b)


# ---------------------------------------------------------------------------------------------
# kernels: unary

UNARY_FLOAT = {
    "negative": (op.negative, np.negative, (-2, 2)),
    "abs": (op.abs, np.abs, (-2, 2)),
    "exp": (op.exp, np.exp, (-3, 3)),
    "log": (op.log, np.log, (0.1, 5)),
    "sqrt": (op.sqrt, np.sqrt, (0.0, 5)),
    "rsqrt": (op.rsqrt, lambda x: 1 / np.sqrt(x), (0.1, 5)),
    "sin": (op.sin, np.sin, (-4, 4)),
    "cos": (op.cos, np.cos, (-4, 4)),
    "tanh": (op.tanh, np.tanh, (-3, 3)),
    "sigmoid": (op.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-5, 5)),
    "erf": (op.erf, None, (-3, 3)),
    "floor": (op.floor, np.floor, (-3, 3)),
    "ceil": (op.ceil, np.ceil, (-3, 3)),
    "round": (op.round, np.round, (-3, 3)),
    "trunc": (op.trunc, np.trunc, (-3, 3)),
    "sign": (op.sign, np.sign, (-2, 2)),
    "square": (op.square, np.square, (-2, 2)),
}


def _erf(x):
    import math
    return np.vectorize(math.erf)(x.astype(np.float64))


@pytest.mark.parametrize("name", list(UNARY_FLOAT))
def test_unary_float(name):
    f, ref, (lo, hi) = UNARY_FLOAT[name]
    ref = ref or _erf
    a = rand((3, 7), lo=lo, hi=hi)
    if name in ("round", "sign"):
        a[0, :4] = [0.5, 1.5, -2.5, 0.0]  # ties go to even; sign(0) = 0
    out, si = run_op(f, [a], symbolic=True)
    assert repr(si) == "Tensor((d0_0, d0_1), 'float32')"
    np.testing.assert_allclose(out, ref(a.astype(np.float64)).astype(np.float32), rtol=3e-6,
                               atol=1e-7)


@pytest.mark.parametrize("name,ref", [("negative", np.negative), ("abs", np.abs),
                                      ("sign", np.sign), ("square", np.square),
                                      ("floor", lambda x: x)])
def test_unary_int(name, ref):
    a = rand((2, 6), "int32", -9, 9)
    out, si = run_op(getattr(op, name), [a])
    assert si.dtype == "int32"
    np.testing.assert_array_equal(out, ref(a))


def test_unary_float16():
    a = rand((8,), "float16", -3, 3)
    out, _ = run_op(op.exp, [a])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, np.exp(a.astype(np.float32)).astype(np.float16), rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# kernels: where, clip, astype

def test_where_three_way_broadcast():
    c = rand((3, 1, 1), "bool")
    x, y = rand((1, 4, 1)), rand((5,))
    out, si = run_op(op.where, [c, x, y])
    assert si.static_shape() == (3, 4, 5)
    np.testing.assert_array_equal(out, np.where(c, x, y))
    out, _ = run_op(lambda cc, xx: op.where(cc, xx, 0.0), [c, x])
    np.testing.assert_array_equal(out, np.where(c, x, np.float32(0)))


def test_clip():
    a = rand((4, 5), lo=-3, hi=3)
    out, _ = run_op(lambda x: op.clip(x, -1.0, 1.5), [a], symbolic=True)
    np.testing.assert_array_equal(out, np.clip(a, -1.0, 1.5))
    i = rand((10,), "int32", -10, 10)
    out, _ = run_op(lambda x: op.clip(x, -2.5, 4), [i])   # fractional bound rounds inwards
    np.testing.assert_array_equal(out, np.clip(i, -2, 4))
    out, _ = run_op(lambda x: op.clip(x, max=0.0), [a])
    np.testing.assert_array_equal(out, np.minimum(a, 0))


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("float32", "float16"),
                                     ("int32", "float32"), ("float32", "bool"),
                                     ("bool", "float32"), ("int64", "int8")])
def test_astype(src, dst):
    a = rand((3, 4), src, -50, 50)
    if src == "float32":
        a[0, :3] = [0.0, -0.0, 2.7]
    out, si = run_op(lambda x: op.astype(x, dst), [a])
    assert si.dtype == dst and out.dtype == np.dtype(dst)
    np.testing.assert_array_equal(out, a.astype(dst))
    assert op.cast is op.astype


def test_run_time_checks_survive_compute_inline():
    # the checks enclose the loop nests: inlining a block (as the default schedules do after
    # FuseTIR) keeps them
    from tilecraft import targets
    from tilecraft.relax import BlockBuilder
    from tilecraft.relax.op.helpers import call_te, dim_checks
    from tilecraft.tensorir import te
    from tilecraft.tensorir.schedule import Schedule

    def add_exp(a, b):
        s = te.compute(a.shape, lambda i: a[i] + b[i], "s")
        return te.compute(a.shape, lambda i: te.exp(s[i]), "e")

    bb = BlockBuilder()
    x, y = sinfo_var("x", ("n",)), sinfo_var("y", ("m",))
    call = call_te(bb, add_exp, x, y, checks=dim_checks("relax.test", [(x.shape[0], y.shape[0])]),
                   primfunc_name_hint="add_exp")
    sch = Schedule(bb.get()[call.args[0].name_hint])
    sch.compute_inline(sch.get_block("s"))
    f = targets.build(sch.func, "llvm")[call.args[0].name_hint]
    a, b, out = rand((4,)), rand((4,)), np.zeros(4, "float32")
    f(a, b, out)
    np.testing.assert_allclose(out, np.exp(a + b), rtol=1e-6)
    with pytest.raises(Exception, match=r"relax\.test: dimension n and dimension m must be equal"):
        f(a, rand((5,)), out)


@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5])
def test_power_by_constant_exponent(exponent):
    """x ** 2 and x ** 3 of a constant exponent lower to products (no libm pow per element);
    other exponents keep pow. Both against numpy, symbolic rows."""
    from tilecraft import relax, targets
    from tilecraft.relax import BlockBuilder, const
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 37), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.power(x, const(np.array(exponent, "float32")))))
        bb.emit_func_output(gv)
    mod = relax.transform.LegalizeOps()(bb.get())
    text = "\n".join(str(f) for f in mod.functions.values())
    assert ("T.pow(" in text) == (exponent == 2.5)
    vm = relax.VirtualMachine(relax.build(bb.get(), "llvm"), targets.cpu(0))
    xv = np.random.default_rng(3).uniform(0.1, 3, (5, 37)).astype("float32")
    xv[0, :5] = [-1.5, -0.0, np.inf, -np.inf, np.nan]
    if exponent == 2.5:
        xv[0, :5] = 1.0
    np.testing.assert_allclose(vm["main"](xv).numpy(), np.power(xv, np.float32(exponent)),
                               rtol=1e-6)


@pytest.mark.parametrize("name,first,shape,dtype", [
    ("maximum", False, (), "float32"), ("minimum", False, (1, 1), "float32"),
    ("maximum", True, (1,), "float32"), ("minimum", True, (), "int32"),
    ("maximum", False, (1, 1, 1), "float32")])
def test_maximum_minimum_of_a_scalar_constant(name, first, shape, dtype):
    """max / min with a one-element constant (ONNX ``Clip``, ``Max(x, 0)``) legalize with the
    constant as a literal, not a buffer the kernel loads, unless it adds dims; either side,
    NaN propagating as numpy, against numpy, symbolic rows."""
    from tilecraft import relax, targets
    from tilecraft.relax import BlockBuilder, const
    f, ref = FLOAT_BINARY[name]
    c = np.full(shape, 0.5 if dtype == "float32" else 1, dtype)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 19), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            args = [const(c), x] if first else [x, const(c)]
            gv = bb.emit_output(bb.emit(f(*args)))
        bb.emit_func_output(gv)
    kernels = [g for g in relax.transform.LegalizeOps()(bb.get()).functions.values()
               if not isinstance(g, relax.Function)]
    assert len(kernels) == 1
    literal = len(shape) <= 2
    assert len(kernels[0].params) == (2 if literal else 3)
    vm = relax.VirtualMachine(relax.build(bb.get(), "llvm"), targets.cpu(0))
    xv = rand((6, 19), dtype)
    if dtype == "float32":
        xv[0, :3] = [np.nan, np.inf, -np.inf]
    want = ref(c, xv) if first else ref(xv, c)
    np.testing.assert_array_equal(vm["main"](xv).numpy(), want)
