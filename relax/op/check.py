"""Run-time checks: ``assert_op(condition, format_args, format)``.

A frontend that cannot prove a fact about the symbolic dims a model needs (``seq <= 256``
where a position table has 256 rows) checks it when the function runs instead of refusing the
model: ``assert_op(seq <= 256, [seq], "seq = {} exceeds 256")``. The condition and the
arguments are ``tensorir`` expressions over the function's symbolic variables (or
``PrimValue``s of them); the VM evaluates them and raises ``RuntimeCheckError`` (a
``RuntimeError``, as PyTorch's ``_assert_scalar`` raises) with the formatted message when the
condition is false.

The call has no result (an empty tuple) and is impure: ``DeadCodeElimination`` keeps it. It
belongs outside dataflow blocks (a dataflow block is side-effect free, so an unused binding
there may be removed).

Examples
--------
>>> from tilecraft import tensorir
>>> seq = tensorir.var("seq")
>>> assert_op(seq <= 256, [seq], "seq = {} exceeds 256").struct_info
Tuple()
"""
from __future__ import annotations

from typing import Sequence

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import PrimExpr, convert

from ..expr import Call, Expr, PrimValue, RelaxError
from ..struct_info import PrimStructInfo, StructInfo, TupleStructInfo
from .base import OpPattern, call as _make_call, register_op

__all__ = ["assert_op"]


def _prim(x, what: str) -> Expr:
    if isinstance(x, Expr):
        if not isinstance(x.struct_info, PrimStructInfo):
            raise RelaxError(f"relax.assert_op: {what} must be a scalar (PrimValue), got "
                             f"{x.struct_info!r}", x)
        return x
    if isinstance(x, (PrimExpr, int, bool)):
        return PrimValue(convert(x))
    raise RelaxError(f"relax.assert_op: {what} must be a tensorir expression or a PrimValue, "
                     f"got {type(x).__name__}")


def assert_op(condition, format_args: Sequence = (), format: str = "") -> Call:
    """Check ``condition`` (a bool expression of symbolic dims) when the function runs; when it
    is false the VM raises ``RuntimeCheckError(format.format(*format_args))``.

    Examples
    --------
    >>> from tilecraft import tensorir
    >>> n = tensorir.var("n")
    >>> assert_op(n % 8 == 0, [n], "n = {} is not a multiple of 8").attr_dict["format"]
    'n = {} is not a multiple of 8'
    """
    args = [_prim(condition, "the condition")]
    args += [_prim(a, f"format argument {i}") for i, a in enumerate(format_args)]
    return _make_call("relax.assert_op", args, {"format": str(format)})


def _infer_assert(call: Call) -> StructInfo:
    if not call.args:
        raise RelaxError("relax.assert_op: expected a condition", call)
    cond = call.args[0].struct_info
    if not isinstance(cond, PrimStructInfo) or not dt.is_bool(cond.dtype):
        raise RelaxError(f"relax.assert_op: the condition must be a bool scalar, got {cond!r}",
                         call)
    fmt = call.attr_dict.get("format", "")
    try:
        fmt.format(*range(len(call.args) - 1))
    except (IndexError, KeyError, ValueError) as err:
        raise RelaxError(f"relax.assert_op: the format {fmt!r} does not fit "
                         f"{len(call.args) - 1} argument(s): {err}", call) from None
    return TupleStructInfo([])


# legalize=None: the VM runs it as the builtin vm.builtin.assert_op (relax.vm_builtins)
register_op("relax.assert_op", _infer_assert, None, OpPattern.OPAQUE,
            doc="Check a condition of symbolic dims at run time; raise with a message if false.")
