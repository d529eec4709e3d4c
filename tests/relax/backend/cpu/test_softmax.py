"""relax/backend/cpu/softmax.py: the one-pass softmax schedule against numpy (float64) on
random rows, and where it applies."""
import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, op
from tilecraft.relax.backend.cpu.softmax import schedule_softmax_rows
from tilecraft.relax.op.nn.activation import te_softmax
from tilecraft.tensorir import te
from tilecraft.tensorir.schedule import Schedule


def _numpy_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _build(shape, axis=-1, scale=None, upper_bounds=None):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            if scale is not None:       # BERT's scores: divided, a mask added, then softmax
                y = bb.emit(op.divide(y, relax.const(np.float32(scale))))
                y = bb.emit(op.add(y, relax.const(np.float32(-1.0))))
            gv = bb.emit_output(bb.emit(op.nn.softmax(y, axis=axis)))
        bb.emit_func_output(gv)
    exe = relax.build(bb.get(), "llvm", upper_bounds=upper_bounds)
    return relax.VirtualMachine(exe, targets.cpu(0))["main"]


@pytest.mark.parametrize("shape", [(2, 3, 16, 128), (5, 1024), (7, 48), (3, 100), (4, 5, 7),
                                   (6, 17), (3, 15), (2, 1000)])
def test_softmax_matches_numpy(shape):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 4, shape).astype("float32")
    got = _build(shape)(x).numpy()
    np.testing.assert_allclose(got, _numpy_softmax(x), rtol=3e-6, atol=1e-12)


def test_softmax_fused_with_its_producers_and_masked_rows():
    """BERT's pattern (divide, add, softmax in one kernel); rows with float32's lowest value
    in half of them, as GPT-2's causal mask."""
    rng = np.random.default_rng(1)
    x = rng.normal(0, 4, (2, 4, 32, 32)).astype("float32")
    x[..., 16:] = np.finfo(np.float32).min / 8
    got = _build(x.shape, scale=8.0)(x).numpy()
    np.testing.assert_allclose(got, _numpy_softmax(x / np.float32(8.0) - 1), rtol=3e-6,
                               atol=1e-12)


def test_softmax_symbolic_rows():
    f = _build(("n", 4, 64), upper_bounds={"n": 8})
    rng = np.random.default_rng(2)
    for n in (1, 3, 8):
        x = rng.normal(0, 4, (n, 4, 64)).astype("float32")
        np.testing.assert_allclose(f(x).numpy(), _numpy_softmax(x), rtol=3e-6, atol=1e-12)


def test_softmax_other_axis_and_symbolic_row():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 4, (3, 32, 5)).astype("float32")
    np.testing.assert_allclose(_build(x.shape, axis=1)(x).numpy(), _numpy_softmax(x, 1),
                               rtol=3e-6, atol=1e-12)
    f = _build((2, "s"), upper_bounds={"s": 64})
    for s in (1, 17, 64):
        x = rng.normal(0, 4, (2, s)).astype("float32")
        np.testing.assert_allclose(f(x).numpy(), _numpy_softmax(x), rtol=3e-6, atol=1e-12)


def _softmax_schedule(shape, axis=-1):
    x = te.placeholder(shape, "float32", "x")
    return Schedule(te.create_prim_func([x, te_softmax(x, axis)]))


def test_where_it_applies():
    llvm = targets.Target("llvm")
    sch = _softmax_schedule((te.var("n"), 4, 128))
    assert schedule_softmax_rows(sch, llvm)
    text = sch.func.script()
    # one row loop holds the four blocks; the row reductions run on vectors of partial results
    assert "T_softmax_max_rf" in text and "T_softmax_sum_rf" in text
    # a symbolic or ragged row: the same partial results, their last vector masked (T.where)
    for shape in ((4, 100), (4, te.var("s")), (te.var("n"), 4, te.var("s"), te.var("s"))):
        sch = _softmax_schedule(shape)
        assert schedule_softmax_rows(sch, llvm)
        text = sch.func.script()
        assert "T_softmax_max_rf" in text and "T_softmax_sum_rf" in text
        assert "T.where" in text and "T.unroll(4)" not in text
    # a constant row shorter than a vector: one pass over groups of rows, no partial results
    sch = _softmax_schedule((4, 7))
    assert schedule_softmax_rows(sch, llvm)
    text = sch.func.script()
    assert "T_softmax_max_rf" not in text and "T.unroll(4)" in text
    # another axis: not taken, the schedule unchanged
    sch = _softmax_schedule((4, 128, 8), 1)
    before = sch.func.script()
    assert not schedule_softmax_rows(sch, llvm)
    assert sch.func.script() == before


@pytest.mark.parametrize("threads", [1, 2])
def test_softmax_symbolic_row_threads(threads):
    """The one pass over a symbolic sequence (BERT's scores ``(n, 4, s, s)``), in parallel
    or not, at sizes that leave a partial group and a partial vector."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 4, "s", "s"), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.softmax(x, axis=-1)))
        bb.emit_func_output(gv)
    exe = relax.build(bb.get(), "llvm", upper_bounds={"n": 8, "s": 128})
    exe.kernel_module.num_threads = threads
    f = relax.VirtualMachine(exe, targets.cpu(0))["main"]
    rng = np.random.default_rng(4)
    for n, s in ((1, 1), (1, 7), (2, 33), (8, 128)):
        x = rng.normal(0, 4, (n, 4, s, s)).astype("float32")
        np.testing.assert_allclose(f(x).numpy(), _numpy_softmax(x), rtol=3e-6, atol=1e-12)


def test_softmax_symbolic_row_lengths_and_masked_rows():
    """A symbolic batch and row: the 16-lane partial results over whole vectors and a masked
    last one, at rows shorter than a vector, one vector, one past it and long; rows masked
    with float32's lowest value (a causal mask), one row wholly masked."""
    f = _build(("n", "s"), upper_bounds={"n": 8, "s": 1024})
    rng = np.random.default_rng(5)
    lowest = np.finfo(np.float32).min
    for s in (1, 7, 15, 16, 17, 33, 128, 1000):
        for n in (1, 5):
            x = rng.normal(0, 4, (n, s)).astype("float32")
            np.testing.assert_allclose(f(x).numpy(), _numpy_softmax(x), rtol=2e-6, atol=1e-12)
        x = rng.normal(0, 4, (4, s)).astype("float32")
        x[np.triu_indices(4, 1, s)] = lowest     # row i keeps its first i + 1 values
        x[3] = lowest
        np.testing.assert_allclose(f(x).numpy(), _numpy_softmax(x), rtol=2e-6, atol=1e-12)
