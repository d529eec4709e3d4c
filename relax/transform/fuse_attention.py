"""``FuseAttention``: one fused attention kernel for ``softmax(Q Kᵀ * scale + mask) V`` on GPU
targets.

The ONNX and ``torch.export`` imports of BERT and GPT-2 write attention out as

    s = matmul(Q, Kᵀ)                      # (*batch, L, S)
    s = divide(s, c) | multiply(s, c)      # optional: a scalar constant
    s = add(s, mask) | where(mask, s, c)   # optional: an additive float mask / a bool mask
    p = softmax(s, axis=-1)
    O = matmul(p, V)                       # (*batch, L, Dv)

(``Q``, ``Kᵀ``, ``V`` ``permute_dims`` of the reshaped projections). The pass replaces the last
``matmul`` by a ``call_tir`` of ``relax.backend.gpu.attention``'s kernel on ``Q``, ``Kᵀ``,
``V`` (and the mask): the scores never reach global memory, and three launches (the scores'
matmul with its scale, the softmax with its mask, the second matmul) become one. Where an
operand is such a view — ``permute_dims(reshape(x, (*lead, heads, head_size)), axes)`` or
``permute_dims(x, axes)`` — the kernel reads ``x`` itself through the view, so the heads'
transposes (one kernel each before) go too; and where the output goes on to
``reshape(permute_dims(O, axes), (*lead, heads * Dv))`` (the heads joined back), the kernel
writes that tensor instead. The
intermediate bindings stay where something else uses them (dead otherwise: the pass ends with
``DeadCodeElimination``).

A ``ToMixedPrecision`` model's attention matches too: Q, Kᵀ and V float16, the matmuls'
results float32 (or float16: float16 accumulation), the float32 softmax's result rounded to
float16 for the second matmul (and, with float16 accumulation, the float16 scores converted to
float32 for the softmax); a float32 result rounded to float16 next (``astype``) is written in
float16 by the kernel. The kernel converts the operands as it fetches them and computes the
scores, the softmax and the sums in float32 whatever the graph's accumulation dtype (one
launch where the graph had seven, and more accurate).

The pattern applies when: every tensor is float32 or as above (an additive mask float32, a
bool mask for ``where``); Q, Kᵀ and V have
the same leading (batch) dims, structurally; the head sizes are constants of at most
``ATTENTION_MAX_HEAD``; every symbolic dim of Q, Kᵀ and V is a plain variable (``n``, not
``2 * n``). The mask's shape, right-aligned with the scores' ``(*batch, L, S)``, broadcasts where
a dim is 1; any other dim is taken as the scores' dim, which the kernel checks when it is called
(GPT-2's causal mask is a slice ``(1, 1, min(seq, 1024), min(seq, 1024))`` of a constant: a
sequence over 1024 is an error, as it was unfused, now from the kernel's argument check).
Anything else is left as it is. Only GPU targets run the pass (``get_pipeline(target=...)``); the CPU path is
unchanged.

Examples
--------
>>> from tilecraft.targets import Target
>>> new_mod = FuseAttention(Target("opencl"))(mod)    # doctest: +SKIP
>>> # lv5 = R.call_tir(fused_attention, (lv1, lv3, lv4), out_sinfo=R.Tensor((n, 12, 128, 64)))
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tilecraft.targets import Target
from tilecraft.tensorir.expr import IntImm, Var as TirVar
from tilecraft.tensorir.function import IRModule
from tilecraft.tensorir.structural import structural_equal

from ..backend.gpu.attention import ATTENTION_MAX_HEAD, AttentionSpec, attention_kernel
from ..block_builder import call_tir
from ..expr import Call, Constant, Expr, Var
from ..op.base import Op
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass
from .dead_code_elimination import DeadCodeElimination

__all__ = ["FuseAttention", "match_attention"]


class FuseAttention(Pass):
    """Replace ``matmul(softmax(matmul(Q, Kᵀ) * scale + mask), V)`` by one fused attention
    kernel (see the module docstring for the exact pattern).

    Parameters
    ----------
    target : Target
        The GPU target the kernel is built for (its shared-memory limit sizes the tiles).

    Examples
    --------
    >>> new_mod = FuseAttention(Target("webgpu"))(mod)   # doctest: +SKIP
    """

    name = "FuseAttention"

    def __init__(self, target: Target):
        self.target = target if isinstance(target, Target) else Target(target)

    def transform_module(self, mod: IRModule) -> IRModule:
        return DeadCodeElimination()(_AttentionFuser(mod, self.target).visit_module())


def _op_name(e) -> str | None:
    return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None


def _scalar(e) -> float | None:
    """The value of a one-element float constant, else None."""
    if isinstance(e, Constant) and e.data.size == 1 and e.data.dtype.kind == "f":
        return float(e.data.reshape(-1)[0])
    return None


def _shape(e: Expr, dtype: str):
    si = e.struct_info
    if not isinstance(si, TensorStructInfo) or si.shape is None or si.dtype != dtype:
        return None
    if not all(isinstance(d, (IntImm, TirVar)) for d in si.shape):
        return None
    return tuple(si.shape)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(structural_equal(x, y) for x, y in zip(a, b))


def _const(d) -> int | None:
    return d.value if isinstance(d, IntImm) else None


def match_attention(call: Call, lookup) -> tuple[AttentionSpec, list[Expr]] | None:
    """The fused attention that ``call`` (the second ``matmul``) ends, as (spec, [Q, Kᵀ, V,
    mask?]), or None when the pattern does not apply. ``lookup(var)`` gives a variable's bound
    value (None if unknown)."""
    def bound(e):
        return lookup(e) if isinstance(e, Var) else None

    if _op_name(call) != "relax.matmul":
        return None
    probs, v = call.args
    sm = bound(probs)
    vsi = v.struct_info
    dtype = vsi.dtype if isinstance(vsi, TensorStructInfo) else None
    if dtype == "float16" and _op_name(sm) == "relax.astype" and \
            sm.args[0].struct_info.dtype == "float32":
        # ToMixedPrecision's attention: the float32 softmax rounded to float16 for the second
        # matmul (the kernel keeps the probabilities in float32: one rounding less)
        sm = bound(sm.args[0])
    elif dtype != "float32":
        return None
    # the products' dtypes: float32, or (float16 operands) float32 or float16 results; the
    # kernel accumulates in float32 either way
    results = ("float32",) if dtype == "float32" else ("float32", "float16")
    if _op_name(sm) != "relax.nn.softmax" or call.struct_info.dtype not in results:
        return None
    s = sm.args[0]
    rank = s.struct_info.ndim if isinstance(s.struct_info, TensorStructInfo) else -1
    if rank < 2 or int(sm.attr_dict["axis"]) not in (-1, rank - 1):
        return None

    def widened(s):
        """The float16 scores of float16 accumulation converted to float32 for the softmax
        (or the float32 mask): the float16 scores; else ``s``."""
        node = bound(s)
        if dtype == "float16" and _op_name(node) == "relax.astype" and \
                node.args[0].struct_info.dtype == "float16":
            return node.args[0]
        return s

    s = widened(s)
    node = bound(s)
    mask, mask_kind, fill = None, None, 0.0
    if _op_name(node) == "relax.add":
        a, b = node.args
        # the scores are the operand of the scores' shape coming from the scale or the matmul
        for x, m in ((a, b), (b, a)):
            if _op_name(bound(widened(x))) in ("relax.matmul", "relax.divide",
                                               "relax.multiply"):
                mask, mask_kind, s = m, "add", widened(x)
                break
        else:
            return None
        node = bound(s)
    elif _op_name(node) == "relax.where":
        cond, x, y = node.args
        fill_value = _scalar(y)
        if fill_value is None:
            return None
        mask, mask_kind, fill, s = cond, "select", fill_value, x
        node = bound(s)
    scale = ("mul", 1.0)
    if _op_name(node) == "relax.divide":
        c = _scalar(node.args[1])
        if c is None:
            return None
        scale, s = ("div", c), node.args[0]
        node = bound(s)
    elif _op_name(node) == "relax.multiply":
        a, b = node.args
        if _scalar(b) is not None:
            scale, s = ("mul", _scalar(b)), a
        elif _scalar(a) is not None:
            scale, s = ("mul", _scalar(a)), b
        else:
            return None
        node = bound(s)
    if _op_name(node) != "relax.matmul" or node.struct_info.dtype not in results:
        return None
    q, kt = node.args
    qs, ks, vs = _shape(q, dtype), _shape(kt, dtype), _shape(v, dtype)
    out = call.struct_info
    if None in (qs, ks, vs) or not len(qs) == len(ks) == len(vs) >= 2 or \
            out.ndim != len(qs):
        return None
    batch, L, D = qs[:-2], qs[-2], _const(qs[-1])
    S, Dv = ks[-1], _const(vs[-1])
    if D is None or Dv is None or D > ATTENTION_MAX_HEAD or Dv > ATTENTION_MAX_HEAD:
        return None
    if not (_same(ks[:-2], batch) and _same(vs[:-2], batch) and _same(ks[-2:-1], qs[-1:])
            and _same(vs[-2:-1], (S,))):
        return None
    args = [q, kt, v]
    mask_shape = ()
    if mask is not None:
        # the mask's dims broadcast against the scores' (*batch, L, S): a dim of 1 broadcasts,
        # any other is the scores' dim (an import's mask may spell it differently, as
        # ``min(seq, 1024)``: the kernel checks at run time that it is the scores' dim)
        msi = mask.struct_info
        if not isinstance(msi, TensorStructInfo) or msi.shape is None or \
                msi.dtype != ("float32" if mask_kind == "add" else "bool"):
            return None
        full = (*batch, L, S)
        if len(msi.shape) > len(full):
            return None
        tail = full[len(full) - len(msi.shape):]
        mask_shape = tuple(IntImm(1, "int64") if _const(m) == 1 else t
                           for m, t in zip(msi.shape, tail))
        if mask_kind == "select" and fill == np.inf:
            return None
        args.append(mask)
    views = []
    for i in range(3):   # each of Q, Kᵀ, V read through the view it is, where it is one
        view = _view_of(args[i], lookup, dtype)
        if view is not None:
            args[i], view = view
        views.append(view)
    spec = AttentionSpec(batch=batch, L=L, S=S, D=D, Dv=Dv, scale=scale, mask=mask_kind,
                         mask_shape=mask_shape, fill=fill, q_view=views[0], k_view=views[1],
                         v_view=views[2], dtype=dtype, out_dtype=out.dtype)
    return spec, args


def _view_of(e: Expr, lookup, dtype: str = "float32"):
    """``(x, (shape, axes, split))`` when ``e`` is ``permute_dims(reshape(x, (*lead, h,
    split)), axes)`` with ``x`` of shape ``(*lead, h * split)`` (the heads split off a
    projection, as the imports write it), or ``permute_dims(x, axes)``; else None."""
    perm = lookup(e) if isinstance(e, Var) else None
    if _op_name(perm) != "relax.permute_dims":
        return None
    src = perm.args[0]
    rank = src.struct_info.ndim if isinstance(src.struct_info, TensorStructInfo) else -1
    axes = perm.attr_dict.get("axes")
    axes = tuple(range(rank))[::-1] if axes is None else tuple(int(a) for a in axes)
    if rank != len(axes):
        return None
    reshape = lookup(src) if isinstance(src, Var) else None
    if _op_name(reshape) == "relax.reshape":
        x = reshape.args[0]
        xs, ys = _shape(x, dtype), _shape(src, dtype)
        if xs is not None and ys is not None and len(ys) == len(xs) + 1 and \
                _same(xs[:-1], ys[:-2]) and None not in (_const(xs[-1]), _const(ys[-2]),
                                                         _const(ys[-1])) and \
                _const(xs[-1]) == _const(ys[-2]) * _const(ys[-1]):
            sliced = _last_dim_slice(x, lookup, dtype)
            if sliced is not None:    # GPT-2: q, k, v split off one projection
                whole, offset = sliced
                return whole, (_shape(whole, dtype), axes, _const(ys[-1]), offset)
            return x, (xs, axes, _const(ys[-1]), 0)
    ss = _shape(src, dtype)
    if ss is None:
        return None
    return src, (ss, axes, None, 0)


def _last_dim_slice(x: Expr, lookup, dtype: str = "float32"):
    """``(y, begin)`` when ``x`` is ``strided_slice(y, axes=[last], begin=[b], end=[e])`` with a
    constant, in-bounds ``0 <= b < e <= y.shape[-1]`` and stride 1 (``Split`` of a fused QKV
    projection), ``y`` of plain dims; else None."""
    sl = lookup(x) if isinstance(x, Var) else None
    if _op_name(sl) != "relax.strided_slice":
        return None
    y = sl.args[0]
    ys = _shape(y, dtype)
    if ys is None:
        return None
    a = sl.attr_dict
    axes, begin, end = list(a.get("axes") or ()), list(a.get("begin") or ()), \
        list(a.get("end") or ())
    strides = list(a.get("strides") or [1])
    if len(axes) != 1 or int(axes[0]) not in (-1, len(ys) - 1) or len(begin) != 1 or \
            len(end) != 1 or [int(v) for v in strides] != [1]:
        return None
    b, e, c = _const(begin[0]) if not isinstance(begin[0], int) else begin[0], \
        _const(end[0]) if not isinstance(end[0], int) else end[0], _const(ys[-1])
    if None in (b, e, c) or not 0 <= b < e <= c:
        return None
    return y, b


def merged_output(call: Call, lookup, fused: dict):
    """``(spec, args)`` of a fused attention writing ``call`` — ``reshape(permute_dims(O,
    axes), shape)`` of a fused attention's output ``O`` that joins a head dim with the last
    (``(*lead, heads, Dv) -> (*lead, heads * Dv)``) — directly; else None. ``fused`` maps the
    fused kernels' names to their (spec, args)."""
    perm = lookup(call.args[0]) if isinstance(call.args[0], Var) else None
    if _op_name(perm) != "relax.permute_dims" or not isinstance(perm.args[0], Var):
        return None
    att = lookup(perm.args[0])
    if _op_name(att) != "relax.call_tir" or att.args[0].name_hint not in fused:
        return None
    spec, args = fused[att.args[0].name_hint]
    if spec.o_view is not None:
        return None
    logical = (*spec.batch, spec.L, spec.Dv)
    axes = perm.attr_dict.get("axes")
    axes = tuple(range(len(logical)))[::-1] if axes is None else tuple(int(a) for a in axes)
    ys = _shape(call, spec.out_dtype)
    if len(axes) != len(logical) or axes[-1] != len(logical) - 1 or ys is None or \
            len(ys) != len(logical) - 1:
        return None
    heads = _const(logical[axes[-2]])
    if axes[-2] >= len(spec.batch) or heads is None or _const(ys[-1]) != heads * spec.Dv:
        return None
    # the output's dims as the kernel sees them; the VM allocates ``call``'s, and the kernel
    # checks at run time that they agree
    shape = tuple(logical[a] for a in axes[:-2]) + (IntImm(heads * spec.Dv, "int64"),)
    return replace(spec, o_view=(shape, axes, spec.Dv, 0)), args


def rounded_output(call: Call, lookup, fused: dict):
    """``(spec, args)`` of a fused attention writing ``call`` — ``astype(O, "float16")`` of a
    fused attention's float32 output ``O`` (not yet written through a view) — directly; else
    None. ``fused`` maps the fused kernels' names to their (spec, args)."""
    src = call.args[0]
    if call.struct_info.dtype != "float16" or not isinstance(src, Var):
        return None
    att = lookup(src)
    if _op_name(att) != "relax.call_tir" or att.args[0].name_hint not in fused:
        return None
    spec, args = fused[att.args[0].name_hint]
    if spec.out_dtype != "float32" or spec.o_view is not None:
        return None
    return replace(spec, out_dtype="float16"), args


class _AttentionFuser(ExprMutator):
    def __init__(self, mod: IRModule, target: Target):
        super().__init__(mod)
        self.target = target
        self.fused: dict = {}      # kernel name -> (spec, args)

    def _call(self, spec, args, sinfo) -> Call:
        gvar = self.builder.add_func(attention_kernel(spec, self.target), "fused_attention")
        self.fused[gvar.name_hint] = (spec, args)
        return call_tir(gvar, args, sinfo)

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not self.builder.building:
            return call
        if _op_name(call) == "relax.astype":
            # a float16 attention's float32 output rounded to float16 (ToMixedPrecision): the
            # kernel writes float16 itself
            found = rounded_output(call, self.builder.lookup_binding, self.fused)
            return call if found is None else self._call(*found, call.struct_info)
        if _op_name(call) == "relax.reshape":
            # the heads joined back after the attention: written so by the kernel itself
            found = merged_output(call, self.builder.lookup_binding, self.fused)
            return call if found is None else self._call(*found, call.struct_info)
        if _op_name(call) != "relax.matmul":
            return call
        found = match_attention(call, self.builder.lookup_binding)
        if found is None:
            return call
        # the output keeps the matmul's struct info (its dims as the graph spells them; the
        # kernel checks at run time that they are (*batch, L, Dv))
        return self._call(*found, call.struct_info)
