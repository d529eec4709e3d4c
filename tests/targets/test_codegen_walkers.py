"""The code generators walk the IR with ``tensorir.functor``'s convention (``IRFunctor``:
``visit_<ClassName>``), and a node one cannot translate is an error that names it."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets.gpu_codegen import CodegenC, CodegenError
from tilecraft.targets.llvm.codegen import CodeGenLLVM
from tilecraft.targets.opencl_backend.codegen import OpenCLCodegen
from tilecraft.targets.webgpu_backend.wgsl import WGSLCodegen
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Reduce
from tilecraft.tensorir.functor import IRFunctor


@pytest.mark.parametrize("walker", [CodegenC, OpenCLCodegen, CodeGenLLVM, WGSLCodegen])
def test_every_generator_is_an_ir_functor(walker):
    assert issubclass(walker, IRFunctor)
    # no walker keeps a private dispatch of its own (stmt_ / expr_ / s_ / e_ / _s_ / _e_)
    legacy = [n for n in dir(walker) if n.startswith(("stmt_", "expr_", "s_", "e_", "_s_", "_e_"))]
    assert legacy == []


def test_a_node_a_generator_cannot_translate_is_named():
    A = te.placeholder((4,), "float32", "A")
    k = te.reduce_axis((0, 4), "k")
    red = Reduce("sum", A[k], [k])
    with pytest.raises(CodegenError, match="cannot generate the expression Reduce"):
        OpenCLCodegen().visit(red)
    n = te.var("n")
    B = te.compute((n,), lambda i: A[0] * 2.0, "B")
    # an LLVM build of a lowered function works through the same dispatch
    mod = targets.build(te.create_prim_func([A, B]), "llvm")
    b = np.zeros(3, "float32")
    mod["main"](np.arange(4, dtype="float32") + 1, b)
    np.testing.assert_array_equal(b, [2, 2, 2])
