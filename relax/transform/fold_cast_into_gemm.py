"""``FoldCastIntoGEMM``: a GEMM-like call (``matmul``, ``linear``, a convolution) reads a
float32 value itself where its float16 operand would otherwise be a cast kernel of its own.

``ToMixedPrecision`` converts a value to float16 right after it is computed, so that the cast
joins the kernel that computes it (``fused_matmul_add_astype``). That cannot happen where

- the value is a parameter of the function (the model's input),
- the value is also used in float32 (a layer norm's output feeding both the next dense layer
  and the residual add; a residual block's output feeding the next convolution and the next
  residual add): a fused kernel writes one output,
- or its producer ends fusion (a reduction such as ``layer_norm``, an opaque kernel),

and the cast is then a kernel of its own: one more launch, and the value written and read once
more in float16. There the GEMM-like call reads the float32 value itself: ``matmul(astype(u,
"float16"), W, out_dtype=d)`` becomes ``matmul(u, W, out_dtype=d)``, whose kernel converts each
element to ``d`` as it loads it. With float16 accumulation (``d`` float16) that is the same
rounding the cast did; with float32 accumulation the product reads ``u`` unrounded, so the
result is, if anything, more accurate. Where a value's producer can take the cast (its only
users are casts to float16), nothing changes: the producer writes float16 (half the bytes) and
the GEMM reads that.

Only the GPU pipeline runs the pass (``get_pipeline(target=...)``): the CPU kernel library
packs float16 operands. Nor does it run for a target with tensor cores
(``Target("opencl -device=nvidia")``): the tensor-core GEMM multiplies float16 operands, so it
keeps them (the cast kernel stays there).

Examples
--------
>>> # x_f16 = R.astype(x, "float16")                       (x: a parameter)
>>> # lv = R.matmul(x_f16, W_f16, out_dtype="float32")
>>> # becomes  lv = R.matmul(x, W_f16, out_dtype="float32")
>>> # new_mod = FoldCastIntoGEMM()(mod)
"""
from __future__ import annotations

from tilecraft.tensorir.function import IRModule

from ..analysis import get_var2val, udchain
from ..expr import Call, Constant, Expr, Function, Var
from ..op.base import Op, OpPattern
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass
from .dead_code_elimination import DeadCodeElimination

__all__ = ["FoldCastIntoGEMM", "GEMM_OPERANDS"]

# operator -> the operand positions a cast may fold into (ToMixedPrecision's float16 operands)
GEMM_OPERANDS = {
    "relax.matmul": (0, 1),
    "relax.linear": (0, 1),
    "relax.nn.conv1d": (0, 1),
    "relax.nn.conv2d": (0, 1),
    "relax.nn.conv3d": (0, 1),
}


class FoldCastIntoGEMM(Pass):
    """Let GEMM-like calls read a float32 value themselves where its cast to float16 would be
    a kernel of its own (see the module docstring).

    Examples
    --------
    >>> new_mod = FoldCastIntoGEMM()(mod)   # doctest: +SKIP
    """

    name = "FoldCastIntoGEMM"

    def transform_module(self, mod: IRModule) -> IRModule:
        return DeadCodeElimination()(_CastFolder(mod).visit_module())


def _op_name(e) -> str | None:
    return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None


def _dtype(e) -> str | None:
    si = e.struct_info
    return si.dtype if isinstance(si, TensorStructInfo) else None


def _is_half_cast(e) -> bool:
    """``astype(u, "float16")`` of a float32 ``u``."""
    return _op_name(e) == "relax.astype" and _dtype(e) == "float16" and \
        _dtype(e.args[0]) == "float32"


def cast_stands_alone(u: Var, var2val: dict, users: dict) -> bool:
    """Whether a cast of ``u`` to float16 would be a kernel of its own: ``u`` is not bound in
    the function (a parameter), is used other than by casts to float16, or is computed by an
    operator after which nothing fuses (a reduction, an opaque kernel)."""
    value = var2val.get(u)
    if value is None:
        return True
    if any(w is None or not _is_half_cast(var2val.get(w)) for w in users.get(u, [])):
        return True
    if not isinstance(value, Call) or not isinstance(value.op, Op):
        return True
    pattern = value.op.pattern
    return not (pattern <= OpPattern.INJECTIVE or pattern == OpPattern.OUT_EWISE_FUSABLE)


class _CastFolder(ExprMutator):
    def __init__(self, mod: IRModule):
        super().__init__(mod)
        self.var2val: dict = {}
        self.users: dict = {}

    def visit_function_root(self, name: str, func: Function) -> Function:
        self.var2val, self.users = get_var2val(func), udchain(func)
        return super().visit_function_root(name, func)

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not self.builder.building or _op_name(call) not in GEMM_OPERANDS or \
                not call.attr_dict.get("out_dtype"):
            return call        # (mixed operand dtypes need the explicit result dtype)
        args = list(call.args)
        for i in GEMM_OPERANDS[_op_name(call)]:
            a = args[i] if i < len(args) else None
            cast = self.var2val.get(a) if isinstance(a, Var) else None
            if not _is_half_cast(cast):
                continue
            u = cast.args[0]
            if isinstance(u, Constant) or not isinstance(u, Var):
                continue      # a weight: FoldConstant makes it a float16 constant
            if cast_stands_alone(u, self.var2val, self.users):
                args[i] = u
        if all(a is b for a, b in zip(args, call.args)):
            return call
        return Call(call.op, args, call.attrs, call.sinfo_args)
