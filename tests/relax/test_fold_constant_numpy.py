"""FoldConstant's numpy evaluation (``relax.transform.fold_constant_numpy``): each operator it
evaluates gives the same bits as its kernel (the path FoldConstant takes without it: the
operator legalized and run, interpreted when small, compiled at -O0 when large), on random
inputs with broadcasting, zeros and negative numbers (inf / nan); the rest goes to the kernel."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft.relax import BlockBuilder, Constant, Function, op
from tilecraft.relax.analysis import post_order_visit
from tilecraft.relax.frontend import from_onnx
from tilecraft.relax.transform import FoldConstant
from tilecraft.relax.transform import fold_constant as fold
from tilecraft.relax.transform.fold_constant_numpy import NUMPY_OPS, evaluate_op
from tilecraft.targets import kernel_cache
from tilecraft.zoo import models

RNG = np.random.default_rng(34)


def _rand(shape, dtype, special=True):
    x = RNG.standard_normal(shape).astype(dtype)
    if special and x.size > 3:
        x.flat[:3] = (0.0, -0.0, -2.5)   # division by zero, sqrt of a negative number
    return x


def _folded(call_of_constants, monkeypatch, numpy_path: bool) -> np.ndarray:
    """``call_of_constants`` folded by FoldConstant, with or without the numpy evaluation."""
    if not numpy_path:
        monkeypatch.setattr(fold, "evaluate_op", lambda call: None)
    bb = BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            out = bb.emit_output(call_of_constants)
        bb.emit_func_output(out)
    with kernel_cache.use(False):
        mod = FoldConstant()(bb.get())
    monkeypatch.undo()
    found = []
    post_order_visit(mod["main"], lambda n: found.append(n) if isinstance(n, Constant) else None)
    assert found, "the call was not folded"
    return found[-1].data


BINARY = [op.add, op.subtract, op.multiply, op.divide]
UNARY = [op.negative, op.sqrt, op.rsqrt]
# small: interpreted by the kernel path; large (> 4096 elements): compiled at -O0
SHAPES = [((7, 5), (5,)), ((3, 1, 4), (1, 6, 1)), ((64, 96), (64, 1))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("fn", BINARY, ids=lambda f: f.__name__)
def test_binary_ops_have_the_kernels_bits(fn, shapes, dtype, monkeypatch):
    a, b = (relax.const(_rand(s, dtype)) for s in shapes)
    call = fn(a, b)
    assert evaluate_op(call) is not None
    got = _folded(call, monkeypatch, numpy_path=True)
    want = _folded(call, monkeypatch, numpy_path=False)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)   # bit for bit, nan where nan


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(2048,), (40, 130)])
@pytest.mark.parametrize("fn", UNARY, ids=lambda f: f.__name__)
def test_unary_ops_have_the_kernels_bits(fn, shape, dtype, monkeypatch):
    call = fn(relax.const(np.abs(_rand(shape, dtype)) if fn is op.rsqrt else _rand(shape, dtype)))
    assert evaluate_op(call) is not None
    got = _folded(call, monkeypatch, numpy_path=True)
    want = _folded(call, monkeypatch, numpy_path=False)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("make", [
    lambda c: op.reshape(c, (6, 20)),
    lambda c: op.permute_dims(c, (2, 0, 1)),
    lambda c: op.permute_dims(c),
    lambda c: op.expand_dims(c, (0, 2)),
    lambda c: op.squeeze(op.expand_dims(c, 1), (1,)),
], ids=["reshape", "permute_dims", "permute_dims_reversed", "expand_dims", "squeeze"])
@pytest.mark.parametrize("dtype", ["float32", "int8", "int64"])
def test_data_movement_has_the_kernels_result(make, dtype, monkeypatch):
    c = relax.const((RNG.standard_normal((4, 5, 6)) * 50).astype(dtype))
    call = make(c)
    got = _folded(call, monkeypatch, numpy_path=True)
    want = _folded(call, monkeypatch, numpy_path=False)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("call", [
    op.add(relax.const(np.arange(6, dtype="int32")), relax.const(np.arange(6, dtype="int32"))),
    op.divide(relax.const(np.ones(4, "int64")), relax.const(np.full(4, 3, "int64"))),
    op.multiply(relax.const(np.ones(4, "float16")), relax.const(np.ones(4, "float16"))),
    op.exp(relax.const(np.ones(4, "float32"))),
    op.astype(relax.const(np.full(4, 2.5, "float32")), "int32"),
], ids=["int_add", "int_divide", "float16", "exp", "cast"])
def test_other_operators_take_the_kernel_path(call, monkeypatch):
    """Integer arithmetic, float16, transcendental functions and casts are not evaluated with
    numpy (their kernels' rounding and wrap-around rules decide); FoldConstant still folds
    them, with the kernel."""
    assert evaluate_op(call) is None
    got = _folded(call, monkeypatch, numpy_path=True)
    want = _folded(call, monkeypatch, numpy_path=False)
    np.testing.assert_array_equal(got, want)


def test_symbolic_or_non_constant_arguments_are_not_evaluated():
    x = relax.Var("x", relax.TensorStructInfo(("n", 4), "float32"))
    c = relax.const(np.ones(4, "float32"))
    assert evaluate_op(op.add(x, c)) is None
    assert evaluate_op(op.reshape(c, (2, 2))) is not None
    assert set(NUMPY_OPS) >= {"relax.add", "relax.rsqrt", "relax.reshape", "relax.permute_dims"}


@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_the_default_pipeline_folds_the_same_constants(name, monkeypatch):
    """The whole default pipeline on a zoo model (batch normalization folded into the
    convolutions): the same constants, bit for bit, with and without the numpy evaluation."""
    from tilecraft.relax.transform import get_pipeline
    mod = from_onnx(models.ZOO[name]().onnx_model)

    def constants(numpy_path):
        if not numpy_path:
            monkeypatch.setattr(fold, "evaluate_op", lambda call: None)
        with kernel_cache.use(False):
            out = get_pipeline(target="llvm")(mod)
        monkeypatch.undo()
        found = []
        for f in out.functions.values():
            if isinstance(f, Function):
                post_order_visit(f, lambda n: found.append(n.data)
                                 if isinstance(n, Constant) else None)
        return out, found

    fast_mod, fast = constants(True)
    slow_mod, slow = constants(False)
    assert fast_mod.script() == slow_mod.script()
    assert len(fast) == len(slow) > 0
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
