"""Shape-inference helpers shared by the operator files: argument checks, axis normalization,
numpy broadcasting over symbolic shapes, and run-time dimension checks for kernels.

Broadcasting follows numpy, dimension by dimension from the right (a missing dim counts as 1):

* a dim that is the constant 1 broadcasts to the other;
* dims that are provably equal (``tensorir.arith.Analyzer``) match;
* two constants that differ, or two dims provably different, raise ``RelaxError`` naming the op;
* two dims that can be neither proven equal nor different (``n`` vs ``m``, ``n`` vs ``4``) are
  *assumed equal*: the result takes the constant one if there is one, else the left operand's.
  A symbolic dim is never broadcast at run time (it is assumed not to be 1); the legalized
  kernel checks each such assumption with an ``AssertStmt`` (``call_te_checked``), so a
  mismatch fails at run time with a message naming the op and the dims.

Examples
--------
>>> from tilecraft.tensorir import var
>>> n = var("n")
>>> broadcast_shapes("relax.add", (n, 1), (1, 4))
(n, 4)
"""
from __future__ import annotations

from typing import Callable, Sequence

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.arith import Analyzer
from tilecraft.tensorir.expr import IntImm, PrimExpr, convert
from tilecraft.tensorir.stmt import AssertStmt, Evaluate, seq

from ..expr import Call, RelaxError
from ..struct_info import TensorStructInfo

__all__ = ["tensor_sinfo", "check_nargs", "check_same_dtype", "fmt_dim", "fmt_shape",
           "normalize_axis", "normalize_axes", "dims_equal", "dims_differ", "broadcast_shapes",
           "broadcast_assumptions", "broadcast_sinfo", "broadcast_index", "call_te_checked",
           "out_name", "float_acc_dtype", "is_numeric", "has_symbolic"]


# ---------------------------------------------------------------------------------------------
# arguments

def tensor_sinfo(op_name: str, call: Call, index: int, what: str | None = None) -> TensorStructInfo:
    """The TensorStructInfo of ``call.args[index]``; raises naming the op if it is not a tensor."""
    if index >= len(call.args):
        raise RelaxError(f"{op_name}: expected at least {index + 1} argument(s), got "
                         f"{len(call.args)}", call)
    si = call.args[index].struct_info
    if not isinstance(si, TensorStructInfo):
        name = what or f"argument {index}"
        raise RelaxError(f"{op_name}: {name} must be a tensor, got {si!r}", call)
    return si


def check_nargs(op_name: str, call: Call, n: int) -> None:
    if len(call.args) != n:
        raise RelaxError(f"{op_name}: expected {n} argument(s), got {len(call.args)}", call)


def check_same_dtype(op_name: str, sinfos: Sequence[TensorStructInfo], names: Sequence[str],
                     node=None) -> str:
    """The common dtype of ``sinfos``; raises naming the op and the operands if they differ."""
    d0 = sinfos[0].dtype
    for si, nm in zip(sinfos[1:], names[1:]):
        if si.dtype != d0:
            raise RelaxError(f"{op_name}: operand dtypes differ: {names[0]} is {d0}, {nm} is "
                             f"{si.dtype}; cast one of them with relax.op.astype", node)
    return d0


def fmt_dim(d) -> str:
    return str(d.value) if isinstance(d, IntImm) else repr(d)


def fmt_shape(shape) -> str:
    if shape is None:
        return "(?)"
    return "(" + ", ".join(fmt_dim(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def normalize_axis(op_name: str, axis, ndim: int, what: str = "axis") -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int; raises naming the op otherwise."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        try:
            import numpy as np
            if isinstance(axis, np.integer):
                axis = int(axis)
            else:
                raise TypeError
        except TypeError:
            raise RelaxError(f"{op_name}: {what} must be an int, got {axis!r}") from None
    if ndim < 0:
        if axis < 0:
            raise RelaxError(f"{op_name}: a negative {what} ({axis}) needs a tensor of known rank")
        return axis
    if not -ndim <= axis < ndim:
        raise RelaxError(f"{op_name}: {what} {axis} is out of range for a tensor of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def normalize_axes(op_name: str, axes, ndim: int, what: str = "axis") -> list[int]:
    """``axes`` (None = all, an int, or a list) as a sorted list of distinct non-negative ints."""
    if axes is None:
        if ndim < 0:
            raise RelaxError(f"{op_name}: {what}=None needs a tensor of known rank")
        return list(range(ndim))
    if isinstance(axes, (list, tuple)):
        out = [normalize_axis(op_name, a, ndim, what) for a in axes]
    else:
        out = [normalize_axis(op_name, axes, ndim, what)]
    if len(set(out)) != len(out):
        raise RelaxError(f"{op_name}: {what} {list(axes) if isinstance(axes, (list, tuple)) else axes}"
                         f" repeats a dimension")
    return sorted(out)


# ---------------------------------------------------------------------------------------------
# dims

def _is_one(d: PrimExpr) -> bool:
    return isinstance(d, IntImm) and d.value == 1


def dims_equal(a: PrimExpr, b: PrimExpr, ana: Analyzer | None = None) -> bool:
    """``a == b`` provably."""
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return a.value == b.value
    return (ana or Analyzer()).can_prove_equal(a, b)


def dims_differ(a: PrimExpr, b: PrimExpr, ana: Analyzer | None = None) -> bool:
    """``a != b`` provably."""
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return a.value != b.value
    return (ana or Analyzer()).can_prove(a != b)


def _align(shapes):
    nd = max(len(s) for s in shapes)
    one = IntImm(1, "int64")
    return nd, [(one,) * (nd - len(s)) + tuple(s) for s in shapes]


def _broadcast(op_name: str, shapes, node=None):
    """(output shape, assumptions): assumptions are (dim, dim) pairs taken to be equal."""
    ana = Analyzer()
    nd, aligned = _align(shapes)
    out, assumed = [], []
    for k in range(nd):
        cur = None
        cur_from = None
        for j, s in enumerate(aligned):
            d = s[k]
            if _is_one(d):
                continue
            if cur is None:
                cur, cur_from = d, j
                continue
            if dims_equal(cur, d, ana):
                continue
            if dims_differ(cur, d, ana):
                raise RelaxError(
                    f"{op_name}: cannot broadcast shapes {', '.join(fmt_shape(x) for x in shapes)}: "
                    f"dimension {k - nd} is {fmt_dim(cur)} in operand {cur_from} and {fmt_dim(d)} "
                    f"in operand {j}", node)
            assumed.append((cur, d))
            if isinstance(d, IntImm) and not isinstance(cur, IntImm):
                cur, cur_from = d, j  # the constant is the better-known value
        out.append(cur if cur is not None else IntImm(1, "int64"))
    return tuple(out), assumed


def broadcast_shapes(op_name: str, *shapes: Sequence[PrimExpr], node=None) -> tuple:
    """The numpy broadcast of ``shapes`` (tuples of int64 exprs); see the module docstring.

    Examples
    --------
    >>> broadcast_shapes("relax.add", (IntImm(3, "int64"), IntImm(1, "int64")), (IntImm(4, "int64"),))
    (3, 4)
    """
    return _broadcast(op_name, [tuple(convert(d) for d in s) for s in shapes], node)[0]


def broadcast_assumptions(op_name: str, *shapes) -> list[tuple[PrimExpr, PrimExpr]]:
    """The pairs of dims ``broadcast_shapes`` assumed equal without proof (check them at run
    time)."""
    return _broadcast(op_name, [tuple(convert(d) for d in s) for s in shapes])[1]


def broadcast_sinfo(op_name: str, sinfos: Sequence[TensorStructInfo], dtype: str,
                    node=None) -> TensorStructInfo:
    """Struct info of the broadcast of tensors ``sinfos`` with result ``dtype`` (unknown shapes
    give an unknown shape of the larger rank, or an unknown rank)."""
    if any(si.ndim < 0 for si in sinfos):
        return TensorStructInfo(None, dtype, -1)
    if any(si.shape is None for si in sinfos):
        return TensorStructInfo(None, dtype, max(si.ndim for si in sinfos))
    return TensorStructInfo(_broadcast(op_name, [si.shape for si in sinfos], node)[0], dtype)


def broadcast_index(indices: Sequence, in_shape: Sequence[PrimExpr],
                    out_shape: Sequence[PrimExpr] | None = None) -> tuple:
    """The indices into an input of shape ``in_shape`` for output ``indices`` (right-aligned;
    index 0 where the input dim is 1 and the output's ``out_shape`` dim is not). Where both
    are 1 the output's own index is kept: ``lv[0, c]`` under an iter var ``b`` in ``[0, 1)``
    is the same point as ``lv[b, c]``, but only the latter reads as a permutation of the
    block's iter vars, which inlining an epilogue into its producer needs."""
    off = len(indices) - len(in_shape)
    out = []
    for k, d in enumerate(in_shape):
        o = out_shape[off + k] if out_shape is not None else None
        if isinstance(d, IntImm) and d.value == 1 and \
                not (isinstance(o, IntImm) and o.value == 1):
            out.append(IntImm(0, "int64"))
        else:
            out.append(indices[off + k])
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# kernels with run-time checks

def out_name(base: str, *inputs) -> str:
    """A te output name that differs from every input tensor's name (create_prim_func needs
    unique buffer names; inputs are named after the Relax variables)."""
    names = {t.name for t in inputs}
    name, k = base, 1
    while name in names:
        name = f"{base}_{k}"
        k += 1
    return name


def call_te_checked(bb, te_func: Callable, *args, checks: Sequence[tuple] = (),
                    op_name: str = "", primfunc_name_hint: str | None = None, **kwargs) -> Call:
    """``bb.call_te(te_func, *args, **kwargs)``, plus a run-time ``AssertStmt`` in the kernel for
    each ``(a, b)`` in ``checks``: dims, in terms of the arguments' symbolic shapes, that shape
    inference assumed equal (``(a, b, message)`` gives the failure message).

    The kernel is built in a scratch BlockBuilder, the checks put at the top of its root block
    (ahead of the loop nests), and the result added to ``bb`` (identical kernels are still
    shared).

    Examples
    --------
    >>> call = call_te_checked(bb, te_add, x, y, checks=[(n, m)], op_name="relax.add")  # doctest: +SKIP
    """
    if not checks:
        return bb.call_te(te_func, *args, primfunc_name_hint=primfunc_name_hint, **kwargs)
    from ..block_builder import BlockBuilder, call_tir
    scratch = BlockBuilder()
    call = scratch.call_te(te_func, *args, primfunc_name_hint=primfunc_name_hint, **kwargs)
    gvar = call.args[0]
    func = scratch.get()[gvar.name_hint]
    realize = func.body
    root = realize.block
    body = root.body
    # Each check is its own statement ahead of the loop nests (an AssertStmt over a no-op),
    # not a wrapper around them: schedule primitives that remove a loop nest (compute_inline
    # after FuseTIR) then leave the check in place instead of an AssertStmt without a body.
    asserts, seen = [], []
    for check in checks:
        a, b = check[0], check[1]
        if any(dims_equal(a, x) and dims_equal(b, y) for x, y in seen):
            continue
        seen.append((a, b))
        msg = check[2] if len(check) > 2 else (
            f"{op_name}: dimension {fmt_dim(a)} and dimension {fmt_dim(b)} must be equal "
            f"(symbolic dims are not broadcast at run time)")
        asserts.append(AssertStmt(a == b, msg, Evaluate(IntImm(0, "int32"))))
    body = seq(*asserts, body)
    func = func.replace(body=realize.replace(block=root.replace(body=body)))
    new_gvar = bb.add_func(func, gvar.name_hint)
    tir_vars = call.args[2].values if len(call.args) == 3 else None
    return call_tir(new_gvar, call.args[1], call.sinfo_args[0], tir_vars=tir_vars)


def float_acc_dtype(dtype: str) -> str:
    """The dtype reductions accumulate in: float16 -> float32, others unchanged."""
    return "float32" if dtype == "float16" else dtype


def is_numeric(dtype: str) -> bool:
    return dt.is_float(dtype) or dt.is_integer(dtype)


def has_symbolic(shape) -> bool:
    return any(not isinstance(d, IntImm) for d in shape)
