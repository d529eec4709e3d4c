"""The one walker convention: ``IRFunctor.visit`` dispatches on the node's class to
``visit_<ClassName>``; passes, the code generators and the interpreter all walk the IR this
way, and a node a walker has no method for is a clear error naming it (the generators:
``tests/targets/test_codegen_walkers.py``)."""
import pytest

from tilecraft.tensorir import var
from tilecraft.tensorir.expr import TIRError
from tilecraft.tensorir.functor import IRFunctor, IRMutator, IRVisitor
from tilecraft.tensorir.interpret import _Compiler


class Depth(IRFunctor):
    """Extra arguments travel with the node (the interpreter passes its lane mask this way)."""

    def visit_Var(self, v, depth):
        return [(v.name, depth)]

    def visit_Add(self, e, depth):
        return self.visit(e.a, depth + 1) + self.visit(e.b, depth + 1)


def test_dispatch_by_class_name_with_arguments():
    i, j, k = var("i"), var("j"), var("k")
    assert Depth().visit(i + (j + k), 0) == [("i", 1), ("j", 2), ("k", 2)]
    with pytest.raises(TIRError, match="Depth has no visit_Mul"):
        Depth().visit(i * j, 0)


def test_visitor_and_mutator_recurse_by_default():
    i, j = var("i"), var("j")
    seen = []

    class Names(IRVisitor):
        def visit_Var(self, v):
            seen.append(v.name)

    Names().visit((i + j) * i)
    assert seen == ["i", "j", "i"]

    class Swap(IRMutator):
        def visit_Var(self, v):
            return j if v is i else v

    e = i * 2 + j
    assert str(Swap().visit(e)) == str(j * 2 + j)
    assert Swap().visit(j + 1) is not None


def test_the_interpreter_is_an_ir_functor():
    assert issubclass(_Compiler, IRFunctor)
    assert not [n for n in dir(_Compiler) if n.startswith(("s_", "stmt_", "_expr"))]


def _free_vars_reference(node):
    """``free_vars`` as it was: every node walked through ``children``, buffers every time."""
    from tilecraft.tensorir.expr import Let, Var
    from tilecraft.tensorir.functor import children
    from tilecraft.tensorir.stmt import Block, For, LetStmt
    defined, out = set(), {}

    def rec(n):
        if isinstance(n, For):
            defined.add(n.loop_var)
        elif isinstance(n, Block):
            for iv in n.iter_vars:
                defined.add(iv.var)
        elif isinstance(n, (LetStmt, Let)):
            defined.add(n.var)
        if isinstance(n, Var):
            if n not in defined:
                out.setdefault(n, None)
            return
        for c in children(n):
            rec(c)
    rec(node)
    return [v for v in out if v not in defined]


def test_free_vars_walks_each_buffer_once_and_finds_what_it_did():
    """Symbolic shapes, scalar parameters, let-bound values, a buffer named by many loads."""
    from tilecraft.tensorir import te
    from tilecraft.tensorir.expr import Let, var
    from tilecraft.tensorir.functor import free_vars
    n, m, s = var("n"), var("m"), te.var("s", "float32")
    a = te.placeholder((n, m), "float32", "a")
    b = te.compute((n, m), lambda i, j: a[i, j] * s + a[i, m - 1 - j] + a[n - 1 - i, j], "b")
    k = te.reduce_axis((0, m), "k")
    c = te.compute((n,), lambda i: te.sum(b[i, k] * a[i, k], axis=k), "c")
    f = te.create_prim_func([a, c, s])
    t = var("t")
    let = Let(t, n * 2, t + m + n)
    for node in (f, f.body, f.body.block.body, let, a[n - 1, 0] + m.astype("float32")):
        got, want = free_vars(node), _free_vars_reference(node)
        assert [id(v) for v in got] == [id(v) for v in want]
    names = {v.name for v in free_vars(f.body)}
    assert {"n", "m", "s"} <= names and not names & {"i", "j", "k", "vi", "vj", "vk"}
