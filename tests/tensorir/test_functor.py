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
