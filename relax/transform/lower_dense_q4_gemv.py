"""``LowerDenseQ4GEMV``: ``relax.dense_q4`` (int4 weight-only dense) on GPU targets as the
int4 GEMV kernel of ``relax.backend.gpu.dense_int4``, with a following bias add fused.

A ``dense_q4(x, codes, scale, offset, G)`` with constant codes, scales and offsets, a float32
``x`` ``(*lead, K)`` whose rows are few (a static row count up to ``Q4_GEMV_MAX_ROWS``) or
symbolic (a decoder's tokens), becomes a ``call_tir`` of the GEMV kernel on the codes repacked
now (``kernel_operands``): for the run kernel (``K`` and the group a multiple of 32, at most 4
static rows) as 16-byte runs of 32 codes, ``[K/32, N, 4]`` uint32 words, and the scales (and
offsets, unless they are the symmetric ``-8 * scale``) as float32 rows ``[groups, N]``; for the
word kernel as words ``[N, K/8]`` and rows ``[N, groups]``. Both importers' weights take
this path: ``relax.quantize``'s and ``com.microsoft.MatMulNBits``' (zero points as offsets,
float16 scales converted exactly). An ``add`` of a float32 bias
of ``N`` values (a constant, or any ``(N,)`` tensor) to its result is computed in the kernel's
write-back. The kernel is already scheduled (work-groups of output columns, the reduction
shared by threads), so the default GPU schedules leave it as it is.

Left to the generic path: a static row count above ``Q4_GEMV_MAX_ROWS`` (a prefill's GEMM),
non-constant weights, non-float32 activations.

A symbolic row count is taken as decoding: a prefill of many tokens through the same build
runs one work-group row per token (correct; the weight is read once per token from cache).

Examples
--------
>>> qmod = relax.quantize(mod, "int4-g128")                          # doctest: +SKIP
>>> gpu_mod = LowerDenseQ4GEMV(Target("opencl"))(qmod)                # doctest: +SKIP
>>> # lv = R.dense_q4(x, ...); y = R.add(lv, b)  ->  y = R.call_tir(dense_q4_gemv, (x, ..., b))
"""
from __future__ import annotations

import numpy as np

from tilecraft.targets import Target
from tilecraft.tensorir.expr import IntImm
from tilecraft.tensorir.function import IRModule

from ..backend.gpu.dense_int4 import (Q4_GEMV_MAX_ROWS, Q4GemvSpec, dense_q4_gemv_kernel,
                                      is_symmetric, kernel_operands)
from ..block_builder import call_tir
from ..expr import Call, Constant, Expr, Var, const
from ..op.base import Op
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass
from .dead_code_elimination import DeadCodeElimination

__all__ = ["LowerDenseQ4GEMV"]

_OPAQUE = 8     # relax OpPattern.OPAQUE: the scheduled kernel never fuses with its neighbours


def _op_name(e) -> str | None:
    return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None


class _GemvRewriter(ExprMutator):
    def __init__(self, mod: IRModule, target: Target):
        super().__init__(mod)
        self.target = target
        self.lowered: dict = {}     # kernel name -> (spec, x, operand constants) without bias

    def _gemv(self, call: Call):
        """``(spec, x, [words, scale(, offset)])`` of a ``dense_q4`` call the kernel takes, or
        None."""
        x, codes, scale, offset = call.args
        group_size = int(call.attr_dict["group_size"])
        xsi = x.struct_info
        if not all(isinstance(a, Constant) for a in (codes, scale, offset)) or \
                not isinstance(xsi, TensorStructInfo) or xsi.dtype != "float32" or \
                xsi.shape is None or len(xsi.shape) < 1:
            return None
        k = xsi.shape[-1]
        if not isinstance(k, IntImm):
            return None
        lead = tuple(xsi.shape[:-1])
        if all(isinstance(d, IntImm) for d in lead) and \
                int(np.prod([d.value for d in lead])) > Q4_GEMV_MAX_ROWS:
            return None
        n = codes.data.shape[1]
        spec = Q4GemvSpec(lead=lead, k=k.value, n=n, group_size=group_size,
                          symmetric=is_symmetric(scale.data, offset.data))
        consts = [const(a) for a in kernel_operands(spec, codes.data, scale.data, offset.data)]
        return spec, x, consts

    def _call(self, spec: Q4GemvSpec, args, sinfo) -> Call:
        kernel = dense_q4_gemv_kernel(spec, self.target).with_attr("op_pattern", _OPAQUE)
        gvar = self.builder.add_func(kernel, "dense_q4_gemv")
        return call_tir(gvar, args, sinfo)

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not self.builder.building:
            return call
        name = _op_name(call)
        if name == "relax.dense_q4":
            found = self._gemv(call)
            if found is None:
                return call
            spec, x, consts = found
            out = self._call(spec, [x] + consts, call.struct_info)
            gvar = out.args[0]
            self.lowered[gvar.name_hint] = (spec, x, consts)
            return out
        if name == "relax.add":
            return self._with_bias(call) or call
        return call

    def _with_bias(self, call: Call) -> Call | None:
        """``add(gemv, bias)`` (either order) -> the GEMV with the bias in its write-back."""
        for y, b in (call.args, call.args[::-1]):
            if not isinstance(y, Var):
                continue
            bound = self.builder.lookup_binding(y)
            if _op_name(bound) != "relax.call_tir" or \
                    bound.args[0].name_hint not in self.lowered:
                continue
            spec, x, consts = self.lowered[bound.args[0].name_hint]
            bias = _bias_vector(b, spec.n)
            if bias is None or not _same_sinfo(call, bound):
                continue
            return self._call(Q4GemvSpec(spec.lead, spec.k, spec.n, spec.group_size,
                                         spec.symmetric, bias=True),
                              [x] + consts + [bias], call.struct_info)
        return None


def _bias_vector(b: Expr, n: int) -> Expr | None:
    """``b`` as an ``(n,)`` float32 tensor when it broadcasts along the last dim only: a
    constant of ``n`` values (any leading unit dims), or an ``(n,)`` tensor; else None."""
    if isinstance(b, Constant):
        d = b.data
        if d.dtype == np.float32 and d.size == n and d.ndim >= 1 and d.shape[-1] == n:
            return const(np.ascontiguousarray(d.reshape(n)))
        return None
    si = b.struct_info
    if isinstance(si, TensorStructInfo) and si.dtype == "float32" and si.shape is not None \
            and len(si.shape) == 1 and isinstance(si.shape[0], IntImm) and \
            si.shape[0].value == n:
        return b
    return None


def _same_sinfo(add: Call, gemv: Call) -> bool:
    """Whether the add's output is the GEMV's (dtype and rank: no broadcast widens it)."""
    a, g = add.struct_info, gemv.struct_info
    return isinstance(a, TensorStructInfo) and isinstance(g, TensorStructInfo) and \
        a.dtype == g.dtype and a.ndim == g.ndim


class LowerDenseQ4GEMV(Pass):
    """``relax.dense_q4`` (and a bias add after it) -> the GPU int4 GEMV kernel (see the
    module docstring). Runs in ``relax.build``'s pipeline for ``opencl`` and ``webgpu``
    targets, before ``LegalizeOps``.

    Parameters
    ----------
    target : Target
        The GPU target the kernel is built for.

    Examples
    --------
    >>> new_mod = LowerDenseQ4GEMV(Target("webgpu"))(qmod)     # doctest: +SKIP
    """

    name = "LowerDenseQ4GEMV"

    def __init__(self, target: Target | str):
        self.target = target if isinstance(target, Target) else Target(target)

    def transform_module(self, mod: IRModule) -> IRModule:
        return DeadCodeElimination()(_GemvRewriter(mod, self.target).visit_module())
