"""``RewriteReshapeView``: a reshape that no fusion took becomes a view of its input.

``LegalizeOps`` makes every ``reshape``, ``flatten``, ``expand_dims`` and squeeze of static
unit dims a kernel that copies its input, row-major, into the new shape (marked with the
PrimFunc attribute ``RESHAPE_VIEW``), so that ``FuseOps`` can fold it into the kernels around
it. Where no fusion took it — the reshape between two dense layers, the head split before
attention in a symbolic build, the ``view`` a model returns — the call still copies every
element: 0.16-0.63 ms a call on GPT-2's and BERT's 8 x 128 activations. A row-major reshape of a
contiguous tensor moves nothing, so this pass (after ``FuseTIR``) replaces each remaining call
of such a kernel by the VM builtin ``vm.builtin.reshape``: an array over the same memory with
the new shape (``np.ndarray.reshape`` on the CPU, the device arrays' ``_view`` on OpenCL and
WebGPU). Its run-time check is the element count, the only one those kernels assert.

Memory planning treats the builtin's result as an alias of its input (``StaticPlanBlockMemory``:
anything that is not an allocation or a kernel output may be a view), so the input's storage
lives as long as the view is used. A view a function returns shares memory with the function's
argument or another output, as TVM's and numpy's reshapes do.

Examples
--------
>>> # lv1 = R.call_tir(reshape, (lv,), R.Tensor((n * 8, 64)))
>>> #   -> lv1 = R.ExternFunc("vm.builtin.reshape")(lv, R.shape([n * 8, 64]))
>>> new_mod = RewriteReshapeView()(mod)   # doctest: +SKIP
"""
from __future__ import annotations

from tilecraft.tensorir.function import IRModule, PrimFunc

from ..analysis import is_call_tir
from ..expr import Call, Expr, ExternFunc, GlobalVar, ShapeExpr, Tuple
from ..op.helpers import RESHAPE_VIEW
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass

__all__ = ["RewriteReshapeView", "RESHAPE_BUILTIN"]

RESHAPE_BUILTIN = "vm.builtin.reshape"


class RewriteReshapeView(Pass):
    """Calls of unfused reshape kernels (``RESHAPE_VIEW``) -> ``vm.builtin.reshape`` views.

    Examples
    --------
    >>> new_mod = RewriteReshapeView()(mod)   # doctest: +SKIP
    """

    name = "RewriteReshapeView"

    def transform_module(self, mod: IRModule) -> IRModule:
        return _Rewriter(mod).visit_module()


def reshape_view_of(call: Expr, mod: IRModule) -> tuple[Expr, TensorStructInfo] | None:
    """``(input, output struct info)`` when ``call`` is a ``call_tir`` of a kernel marked
    ``RESHAPE_VIEW`` on one tensor with a known output shape, else None."""
    if not is_call_tir(call):
        return None
    gvar = call.args[0]
    func = mod.functions.get(gvar.name_hint) if isinstance(gvar, GlobalVar) else None
    if not isinstance(func, PrimFunc) or not func.attr_dict.get(RESHAPE_VIEW):
        return None
    args = call.args[1]
    out = call.sinfo_args[0] if call.sinfo_args else None
    if not isinstance(args, Tuple) or len(args.fields) != 1 or \
            not isinstance(out, TensorStructInfo) or out.shape is None:
        return None
    x = args.fields[0]
    si = x.struct_info
    if not isinstance(si, TensorStructInfo) or si.dtype != out.dtype:
        return None
    return x, out


class _Rewriter(ExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        found = reshape_view_of(call, self.mod)
        if found is None:
            return call
        x, out = found
        return Call(ExternFunc(RESHAPE_BUILTIN), [x, ShapeExpr(list(out.shape))],
                    struct_info=out)
