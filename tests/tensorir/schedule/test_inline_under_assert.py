"""compute_inline of a block that sits under a run-time ``AssertStmt`` (what relax puts ahead of a
kernel whose shapes it could not prove compatible, e.g. a fused concat or squeeze): the block
goes, the check stays with an empty body and still fires."""
import numpy as np
import pytest

from tilecraft.tensorir import te, var
from tilecraft.tensorir.expr import Select
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.stmt import AssertStmt, Evaluate, SeqStmt, seq
from tilecraft.tensorir.functor import post_order_visit


def _checked_two_stage():
    """B = A * 2 under ``assert n == m``, then C = where(B > 0, B, A)."""
    n, m = var("n"), var("m")
    A = te.placeholder((n,), "float32", "A")
    A2 = te.placeholder((m,), "float32", "A2")
    B = te.compute((n,), lambda i: A[i] * 2.0, "B")
    C = te.compute((n,), lambda i: Select(B[i] > 0.0, B[i], A2[i]), "C")
    f = te.create_prim_func([A, A2, C])
    root = f.body.block
    first, rest = root.body.seq[0], root.body.seq[1:]
    body = seq(AssertStmt(n == m, "n and m must agree", first), *rest)
    return f.replace(body=f.body.replace(block=root.replace(body=body)))


def test_inline_keeps_the_assert_with_an_empty_body():
    f = _checked_two_stage()
    sch = Schedule(f)
    sch.compute_inline(sch.get_block("B"))
    g = sch.func
    asserts = []
    post_order_visit(g.body, lambda x: asserts.append(x) if isinstance(x, AssertStmt) else None)
    assert len(asserts) == 1 and isinstance(asserts[0].body, Evaluate), g.script()
    rng = np.random.default_rng(3)
    a, a2 = (rng.standard_normal(9).astype("float32") for _ in range(2))
    c = np.zeros(9, "float32")
    interpret(g, a, a2, c)
    np.testing.assert_array_equal(c, np.where(a * 2 > 0, a * 2, a2))
    with pytest.raises(RuntimeError, match="n and m must agree"):
        interpret(g, a, a2[:8], np.zeros(9, "float32"))
