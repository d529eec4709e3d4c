"""Simplify and Select: a Select evaluates both operands, so its condition must not rewrite a
branch into something that faults (an unclamped load, a division by zero) where the condition
is false. Lazy contexts (``if_then_else``, ``IfThenElse``) still use their condition."""
import numpy as np
import pytest

from tilecraft import tensorir as T
from tilecraft.tensorir import te, transform


def _loads(func):
    out = []

    class V(T.functor.IRMutator):
        def visit_BufferLoad(self, e):
            out.append(e)
            return self.generic_visit(e)

        def visit_Buffer(self, b):
            return b
    V().visit(func.body)
    return out


def _clamped_select_func(n_in=8, n_out=16, lazy=False):
    A = te.placeholder((n_in,), "float32", "A")

    def body(i):
        load = A[T.Min(i, n_in - 1)]
        zero = T.const(0.0, "float32")
        return te.if_then_else(i < n_in, load, zero) if lazy else T.Select(i < n_in, load, zero)
    B = te.compute((n_out,), body, "B")
    return te.create_prim_func([A, B])


@pytest.mark.parametrize("n_in,n_out", [(8, 16), (5, 13), (1, 4)])
def test_select_keeps_the_clamp_of_its_load(n_in, n_out):
    low = transform.lower(_clamped_select_func(n_in, n_out))
    (load,) = _loads(low)
    assert not isinstance(load.indices[0], T.Var), low.script()   # min(i, n - 1), or 0
    # the interpreter evaluates both sides of a Select and raises on an out-of-bounds read
    rng = np.random.default_rng(n_in)
    a = rng.standard_normal(n_in).astype("float32")
    b = np.full(n_out, np.nan, "float32")
    T.interpret(low, a, b)
    want = np.where(np.arange(n_out) < n_in, a[np.minimum(np.arange(n_out), n_in - 1)], 0)
    np.testing.assert_array_equal(b, want)


def test_if_then_else_still_drops_the_clamp():
    # if_then_else evaluates only the branch taken: the condition may simplify the load
    low = transform.lower(_clamped_select_func(lazy=True))
    (load,) = _loads(low)
    assert isinstance(load.indices[0], T.Var), low.script()
    a = np.random.default_rng(1).standard_normal(8).astype("float32")
    b = np.full(16, np.nan, "float32")
    T.interpret(low, a, b)
    np.testing.assert_array_equal(b, np.concatenate([a, np.zeros(8, "float32")]))


def test_pure_index_branches_still_use_the_condition():
    # Select(i < 8, min(i, 7), 7) cannot fault: the branch may use i < 8
    B = te.compute((16,), lambda i: T.Select(i < 8, T.Min(i, 7), T.IntImm(7)), "B")
    low = transform.lower(te.create_prim_func([B]))
    sel = low.body.body.value
    assert isinstance(sel, T.Select) and isinstance(sel.true_value, T.Var), low.script()
    b = np.zeros(16, "int64")
    T.interpret(low, b)
    np.testing.assert_array_equal(b, np.minimum(np.arange(16), 7))


def test_division_by_a_variable_keeps_its_guard():
    # Select(d > 0, i // max(d, 1), 0): rewriting max(d, 1) to d would divide by zero at d = 0
    d = te.var("d")
    B = te.compute((16,), lambda i: T.Select(d > 0, T.FloorDiv(i, T.Max(d, T.IntImm(1))),
                                             T.IntImm(0)), "B")
    low = transform.lower(te.create_prim_func([B, d]))
    sel = low.body.body.value
    assert isinstance(sel.true_value.b, T.Max), low.script()
    for dv in (0, 3):
        b = np.zeros(16, "int64")
        T.interpret(low, b, d=dv)
        np.testing.assert_array_equal(b, np.arange(16) // dv if dv else np.zeros(16))
