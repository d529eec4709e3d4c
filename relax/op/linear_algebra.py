"""Linear algebra operators: ``matmul``, ``linear``, ``einsum``.

Shapes are symbolic: ``(n, 768) @ (768, 3072)`` infers ``(n, 3072)``; batch dims broadcast as in
numpy. Dimensions that provably disagree raise ``RelaxError`` when the call is built; dims that
cannot be proven equal (two different symbolic vars) are assumed equal and the legalized kernel
checks them at run time (its buffer accesses are verified, with a run-time assert where the
bounds are not provable).

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo, op
>>> a = Var("a", TensorStructInfo(("n", 768), "float32"))
>>> w = Var("w", TensorStructInfo((768, 3072), "float32"))
>>> op.matmul(a, w).struct_info
Tensor((n, 3072), 'float32')
"""
from __future__ import annotations

from typing import Sequence

from tilecraft.tensorir import te
from tilecraft.tensorir.arith import Analyzer
from tilecraft.tensorir.expr import NE, IntImm, PrimExpr

from ..expr import Expr, RelaxError
from ..struct_info import TensorStructInfo
from .helpers import (broadcast_assumptions, broadcast_shapes, call_te, dim_checks, fmt_dim,
                      fmt_shape, out_name, result_dtype)
from .base import OpPattern, as_expr, call, register_op

__all__ = ["matmul", "linear", "einsum"]


# ---------------------------------------------------------------------------------------------
# helpers shared by the three operators


def _tensor_sinfo(op: str, e: Expr, what: str) -> TensorStructInfo:
    si = e.struct_info
    if not isinstance(si, TensorStructInfo):
        raise RelaxError(f"{op}: {what} must be a tensor, got {si!r}", e)
    return si


def _is_one(d: PrimExpr) -> bool:
    return isinstance(d, IntImm) and d.value == 1


def _provably_ne(ana: Analyzer, a: PrimExpr, b: PrimExpr) -> bool:
    return ana.can_prove(NE(a, b))


def _assume_equal(assume: list | None, x: PrimExpr, y: PrimExpr) -> None:
    """Record that ``x == y`` was assumed (not provable at build time): the legalized kernel
    checks it at run time (``helpers.dim_checks``)."""
    if assume is not None:
        assume.append((x, y))


def _batch_broadcast(op: str, xs, ys, assume: list | None) -> tuple[PrimExpr, ...]:
    """Numpy broadcasting of the leading (batch) dims, through the shared helper."""
    what = f"{op} (batch dims)"
    out = broadcast_shapes(what, tuple(xs), tuple(ys))
    if assume is not None:
        assume.extend(broadcast_assumptions(what, tuple(xs), tuple(ys)))
    return out


def _bcast_index(dims: Sequence[PrimExpr], out_dims: Sequence[PrimExpr],
                 idx: Sequence[PrimExpr]) -> list[PrimExpr]:
    """Indices into an operand with ``dims`` (right aligned to ``out_dims``) for output ``idx``:
    a constant-1 dim that the output broadcasts is read at 0."""
    off = len(out_dims) - len(dims)
    res = []
    for k, d in enumerate(dims):
        o = out_dims[off + k]
        res.append(IntImm(0, "int64") if _is_one(d) and not _is_one(o) else idx[off + k])
    return res


def _cast(x: PrimExpr, dtype: str) -> PrimExpr:
    return x.astype(dtype)


# ---------------------------------------------------------------------------------------------
# matmul


def _matmul_shape(op: str, sa: Sequence[PrimExpr], sb: Sequence[PrimExpr],
                  assume: list | None = None):
    """Output shape of ``a @ b`` (numpy rules) plus the batch dims of the broadcast."""
    if len(sa) == 0 or len(sb) == 0:
        raise RelaxError(f"{op}: operands must have at least one dimension, got shapes "
                         f"{tuple(sa)} and {tuple(sb)}")
    ana = Analyzer()
    ka = sa[-1]
    kb = sb[0] if len(sb) == 1 else sb[-2]
    if _provably_ne(ana, ka, kb):
        raise RelaxError(f"{op}: the reduction dims differ: {fmt_dim(ka)} vs {fmt_dim(kb)} "
                         f"(shapes {fmt_shape(sa)} and {fmt_shape(sb)})")
    if not ana.can_prove_equal(ka, kb):
        _assume_equal(assume, ka, kb)
    batch = _batch_broadcast(op, sa[:-2], sb[:-2], assume)
    out = list(batch)
    if len(sa) >= 2:
        out.append(sa[-2])
    if len(sb) >= 2:
        out.append(sb[-1])
    return tuple(out), batch


def _infer_matmul(call_):
    op = "relax.matmul"
    a, b = call_.args
    sa, sb = _tensor_sinfo(op, a, "a"), _tensor_sinfo(op, b, "b")
    dtype = result_dtype(op, [sa.dtype, sb.dtype], call_.attr_dict.get("out_dtype"))
    if sa.shape is None or sb.shape is None:
        if sa.ndim < 0 or sb.ndim < 0:
            return TensorStructInfo(None, dtype)
        ndim = max(sa.ndim, sb.ndim) - (sa.ndim == 1) - (sb.ndim == 1)
        if sa.ndim == 1 and sb.ndim == 1:
            ndim = 0
        return TensorStructInfo(None, dtype, ndim)
    out, _ = _matmul_shape(op, sa.shape, sb.shape)
    return TensorStructInfo(out, dtype)


def _te_matmul(A, B, out_dtype):
    out_shape, batch = _matmul_shape("relax.matmul", A.shape, B.shape)
    nb = len(batch)
    k = te.reduce_axis((0, A.shape[-1]), "k")

    def fcompute(*idx):
        bidx = idx[:nb]
        rest = list(idx[nb:])
        ai = _bcast_index(A.shape[:-2], batch, bidx)
        if A.ndim >= 2:
            ai.append(rest.pop(0))
        ai.append(k)
        bi = _bcast_index(B.shape[:-2], batch, bidx)
        bi.append(k)
        if B.ndim >= 2:
            bi.append(rest.pop(0))
        return te.sum(_cast(A[tuple(ai)], out_dtype) * _cast(B[tuple(bi)], out_dtype), axis=k)

    return te.compute(out_shape, fcompute, out_name("matmul", A, B))


def _legalize_matmul(bb, call_):
    a, b = call_.args
    assume: list = []
    _matmul_shape("relax.matmul", a.struct_info.shape, b.struct_info.shape, assume)
    return call_te(bb, _te_matmul, a, b, out_dtype=call_.struct_info.dtype,
                   checks=dim_checks("relax.matmul", assume), primfunc_name_hint="matmul")


register_op("relax.matmul", _infer_matmul, _legalize_matmul, OpPattern.OUT_EWISE_FUSABLE,
            doc="Matrix product with numpy semantics (1-D operands, broadcast batch dims).")


def matmul(a, b, out_dtype: str | None = None) -> Expr:
    """Matrix product ``a @ b`` with numpy semantics.

    1-D operands are promoted (a vector on the left is a row, on the right a column) and the
    promoted dim removed from the result; leading (batch) dims broadcast. Symbolic dims flow
    through; provably different reduction dims raise ``RelaxError``.

    Parameters
    ----------
    a, b : Expr
        Tensors of the same dtype (or any dtypes with ``out_dtype``).
    out_dtype : str, optional
        Accumulation and result dtype; operands are cast to it. Default: the operands' dtype.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo, op
    >>> q = Var("q", TensorStructInfo(("b", 12, "s", 64), "float32"))
    >>> k = Var("k", TensorStructInfo(("b", 12, 64, "s"), "float32"))
    >>> op.matmul(q, k).struct_info
    Tensor((b, 12, s, s), 'float32')
    """
    attrs = {"out_dtype": out_dtype} if out_dtype else {}
    return call("relax.matmul", [as_expr(a), as_expr(b)], attrs)


# ---------------------------------------------------------------------------------------------
# linear


def _linear_shape(op: str, sx, sw, sbias, assume: list | None = None):
    if len(sw) != 2:
        raise RelaxError(f"{op}: weight must be 2-D (out_features, in_features), got shape "
                         f"{fmt_shape(sw)}")
    if len(sx) == 0:
        raise RelaxError(f"{op}: the input must have at least one dimension")
    ana = Analyzer()
    if _provably_ne(ana, sx[-1], sw[1]):
        raise RelaxError(f"{op}: the reduction dims differ: {fmt_dim(sx[-1])} (input features) "
                         f"vs {fmt_dim(sw[1])} (weight in_features); shapes {fmt_shape(sx)} and "
                         f"{fmt_shape(sw)}")
    if not ana.can_prove_equal(sx[-1], sw[1]):
        _assume_equal(assume, sx[-1], sw[1])
    out = tuple(sx[:-1]) + (sw[0],)
    if sbias is not None:
        if len(sbias) > len(out):
            raise RelaxError(f"{op}: bias of shape {fmt_shape(sbias)} has more dims than the "
                             f"output {fmt_shape(out)}")
        for k in range(1, len(sbias) + 1):
            d, o = sbias[-k], out[-k]
            if _is_one(d) or ana.can_prove_equal(d, o):
                continue
            if _provably_ne(ana, d, o):
                raise RelaxError(f"{op}: bias of shape {fmt_shape(sbias)} does not broadcast to "
                                 f"the output shape {fmt_shape(out)} ({fmt_dim(d)} vs "
                                 f"{fmt_dim(o)})")
            _assume_equal(assume, d, o)
    return out


def _infer_linear(call_):
    op = "relax.linear"
    sx = _tensor_sinfo(op, call_.args[0], "x")
    sw = _tensor_sinfo(op, call_.args[1], "weight")
    sb = _tensor_sinfo(op, call_.args[2], "bias") if len(call_.args) > 2 else None
    dtypes = [sx.dtype, sw.dtype] + ([sb.dtype] if sb is not None else [])
    dtype = result_dtype(op, dtypes, call_.attr_dict.get("out_dtype"))
    if sx.shape is None or sw.shape is None or (sb is not None and sb.shape is None):
        return TensorStructInfo(None, dtype, sx.ndim)
    return TensorStructInfo(_linear_shape(op, sx.shape, sw.shape,
                                          None if sb is None else sb.shape), dtype)


def _te_linear(X, W, *bias, out_dtype):
    out_shape = _linear_shape("relax.linear", X.shape, W.shape,
                              bias[0].shape if bias else None)
    k = te.reduce_axis((0, X.shape[-1]), "k")
    nx = X.ndim
    y = te.compute(out_shape, lambda *i: te.sum(
        _cast(X[tuple(i[:nx - 1]) + (k,)], out_dtype) * _cast(W[i[nx - 1], k], out_dtype),
        axis=k), out_name("linear" if not bias else "linear_mm", X, W, *bias))
    if not bias:
        return y
    B = bias[0]
    return te.compute(out_shape, lambda *i: y[i] + _cast(
        B[tuple(_bcast_index(B.shape, out_shape, i))], out_dtype), out_name("linear", X, W, B))


def _legalize_linear(bb, call_):
    args = call_.args
    assume: list = []
    _linear_shape("relax.linear", args[0].struct_info.shape, args[1].struct_info.shape,
                  args[2].struct_info.shape if len(args) > 2 else None, assume)
    return call_te(bb, _te_linear, *args, out_dtype=call_.struct_info.dtype,
                   checks=dim_checks("relax.linear", assume), primfunc_name_hint="linear")


register_op("relax.linear", _infer_linear, _legalize_linear, OpPattern.OUT_EWISE_FUSABLE,
            doc="x @ weight.T + bias (weight is (out_features, in_features)).")


def linear(x, weight, bias=None, out_dtype: str | None = None) -> Expr:
    """``x @ weight.T + bias``, as ``torch.nn.functional.linear``: ``weight`` is
    ``(out_features, in_features)``, ``bias`` (optional) broadcasts to the output, usually
    ``(out_features,)``.

    One operator (not a transpose plus a matmul), so the kernel reads the weight in place.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo, op
    >>> x = Var("x", TensorStructInfo(("n", 768), "float32"))
    >>> w = Var("w", TensorStructInfo((3072, 768), "float32"))
    >>> op.linear(x, w).struct_info
    Tensor((n, 3072), 'float32')
    """
    args = [as_expr(x), as_expr(weight)] + ([as_expr(bias)] if bias is not None else [])
    attrs = {"out_dtype": out_dtype} if out_dtype else {}
    return call("relax.linear", args, attrs)


# ---------------------------------------------------------------------------------------------
# einsum


def _parse_einsum(op: str, subscripts: str, ndims: Sequence[int]):
    """Per-operand label lists and the output labels. Ellipsis dims get labels "0", "1", ...
    (right aligned across operands, as numpy broadcasts them)."""
    s = subscripts.replace(" ", "")
    if "->" in s:
        lhs, rhs = s.split("->", 1)
        if "->" in rhs:
            raise RelaxError(f"{op}: subscripts {subscripts!r} have more than one '->'")
    else:
        lhs, rhs = s, None
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise RelaxError(f"{op}: subscripts {subscripts!r} name {len(terms)} operands but "
                         f"{len(ndims)} were given")

    def letters(term, where):
        body = term.replace("...", "")
        for ch in body:
            if not ch.isalpha():
                raise RelaxError(f"{op}: invalid character {ch!r} in the {where} of subscripts "
                                 f"{subscripts!r}")
        if term.count("...") > 1:
            raise RelaxError(f"{op}: more than one ellipsis in the {where} of {subscripts!r}")
        return body

    n_ell = 0
    counts = []
    for t, (term, nd) in enumerate(zip(terms, ndims)):
        nl = len(letters(term, f"operand {t} term"))
        if "..." in term:
            if nd < nl:
                raise RelaxError(f"{op}: operand {t} has {nd} dims but its subscripts {term!r} "
                                 f"name at least {nl}")
            counts.append(nd - nl)
            n_ell = max(n_ell, nd - nl)
        else:
            if nd != nl:
                raise RelaxError(f"{op}: operand {t} has {nd} dims but its subscripts {term!r} "
                                 f"name {nl}")
            counts.append(0)
    ell = [str(i) for i in range(n_ell)]
    labels = []
    for term, cnt in zip(terms, counts):
        if "..." in term:
            pre, post = term.split("...")
            labels.append(list(pre) + ell[n_ell - cnt:] + list(post))
        else:
            labels.append(list(term))
    if rhs is None:
        seen = {}
        for ls in labels:
            for lab in ls:
                if lab.isalpha():
                    seen[lab] = seen.get(lab, 0) + 1
        out = ell + sorted(lab for lab, c in seen.items() if c == 1)
    else:
        letters(rhs, "output")
        if "..." in rhs:
            pre, post = rhs.split("...")
            out = list(pre) + ell + list(post)
        else:
            if n_ell and any(c > 0 for c in counts):
                raise RelaxError(f"{op}: the output {rhs!r} of {subscripts!r} drops the "
                                 f"ellipsis dims; write '...' in the output")
            out = list(rhs)
        all_labels = {lab for ls in labels for lab in ls}
        for lab in out:
            if lab not in all_labels:
                raise RelaxError(f"{op}: output label {lab!r} of {subscripts!r} appears in no "
                                 f"operand")
        if len(set(out)) != len(out):
            raise RelaxError(f"{op}: the output {rhs!r} of {subscripts!r} repeats a label")
    return labels, out


def _einsum_sizes(op: str, labels, shapes, ana: Analyzer, assume: list | None = None) -> dict:
    sizes: dict[str, PrimExpr] = {}
    for t, (ls, shape) in enumerate(zip(labels, shapes)):
        for lab, d in zip(ls, shape):
            cur = sizes.get(lab)
            if cur is None or (_is_one(cur) and not _is_one(d)):
                sizes[lab] = d
            elif _is_one(d) or ana.can_prove_equal(cur, d):
                continue
            else:
                name = "an ellipsis dim" if lab.isdigit() else f"label {lab!r}"
                if _provably_ne(ana, cur, d) and _provably_ne(ana, d, IntImm(1, "int64")) and \
                        _provably_ne(ana, cur, IntImm(1, "int64")):
                    raise RelaxError(f"{op}: {name} has size {fmt_dim(cur)} in one place and "
                                     f"{fmt_dim(d)} in operand {t}")
                _assume_equal(assume, cur, d)
    return sizes


def _einsum_plan(op: str, subscripts: str, shapes, assume: list | None = None):
    labels, out = _parse_einsum(op, subscripts, [len(s) for s in shapes])
    sizes = _einsum_sizes(op, labels, shapes, Analyzer(), assume)
    reduce_labels = []
    for ls in labels:
        for lab in ls:
            if lab not in out and lab not in reduce_labels:
                reduce_labels.append(lab)
    return labels, out, sizes, reduce_labels


def _infer_einsum(call_):
    op = "relax.einsum"
    if not call_.args:
        raise RelaxError(f"{op}: needs at least one operand")
    sis = [_tensor_sinfo(op, a, f"operand {i}") for i, a in enumerate(call_.args)]
    dtype = result_dtype(op, [s.dtype for s in sis], None)
    if any(s.shape is None for s in sis):
        return TensorStructInfo(None, dtype)
    _, out, sizes, _ = _einsum_plan(op, call_.attr_dict["subscripts"], [s.shape for s in sis])
    return TensorStructInfo(tuple(sizes[lab] for lab in out), dtype)


def _te_einsum(*operands, subscripts):
    labels, out, sizes, red = _einsum_plan("relax.einsum", subscripts,
                                           [t.shape for t in operands])
    raxes = {lab: te.reduce_axis((0, sizes[lab]), f"r_{lab}" if lab.isalpha() else f"r_e{lab}")
             for lab in red}

    def fcompute(*idx):
        env = dict(zip(out, idx))
        env.update({lab: ax.var for lab, ax in raxes.items()})
        term = None
        for t, ls in zip(operands, labels):
            ind = tuple(IntImm(0, "int64") if _is_one(d) and not _is_one(sizes[lab]) else env[lab]
                        for lab, d in zip(ls, t.shape))
            load = t[ind] if ind else t[()]
            term = load if term is None else term * load
        if raxes:
            return te.sum(term, axis=list(raxes.values()))
        return term

    return te.compute(tuple(sizes[lab] for lab in out), fcompute, out_name("einsum", *operands))


def _legalize_einsum(bb, call_):
    subscripts = call_.attr_dict["subscripts"]
    assume: list = []
    _einsum_plan("relax.einsum", subscripts, [a.struct_info.shape for a in call_.args], assume)
    return call_te(bb, _te_einsum, *call_.args, subscripts=subscripts,
                   checks=dim_checks("relax.einsum", assume), primfunc_name_hint="einsum")


register_op("relax.einsum", _infer_einsum, _legalize_einsum, OpPattern.OUT_EWISE_FUSABLE,
            doc="Einstein summation (numpy.einsum semantics).")


def einsum(subscripts, *operands) -> Expr:
    """Einstein summation with ``numpy.einsum`` semantics: explicit (``"ij,jk->ik"``) or implicit
    (``"ij,jk"``: the labels seen once, sorted) output, repeated labels (``"ii->i"`` diagonal,
    ``"ii"`` trace), ``...`` for broadcast leading dims, size-1 dims broadcasting.

    Also accepts TVM's order ``einsum([a, b], "ij,jk->ik")``.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo, op
    >>> a = Var("a", TensorStructInfo(("b", 4, 8), "float32"))
    >>> c = Var("c", TensorStructInfo(("b", 8, 5), "float32"))
    >>> op.einsum("bij,bjk->bik", a, c).struct_info
    Tensor((b, 4, 5), 'float32')
    """
    if not isinstance(subscripts, str):
        # TVM style: einsum(operands, subscripts)
        if len(operands) != 1 or not isinstance(operands[0], str):
            raise RelaxError("relax.einsum: call it as einsum(subscripts, *operands) or "
                             "einsum([operands], subscripts)")
        subscripts, operands = operands[0], tuple(subscripts)
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return call("relax.einsum", [as_expr(o) for o in operands], {"subscripts": subscripts})
