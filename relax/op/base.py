"""The operator registry: each Relax operator has one struct-info inference function, one
legalization to ``tensorir.te``, and a fusion pattern kind.

Registering an operator::

    register_op("relax.add", infer=infer_binary_broadcast, legalize=legalize_add,
                pattern=OpPattern.BROADCAST)

``infer(call) -> StructInfo`` reads ``call.args`` (their struct infos) and ``call.attr_dict``; a
shape that is provably wrong raises ``RelaxError`` naming the op and the dims.
``legalize(bb, call) -> Expr`` emits the computation as TensorIR, normally with
``bb.call_te(te_func, *call.args, **attrs)``; None means the op is kept for the VM (a builtin).

``Op`` itself (one instance per name, ``Op.get(name)``) and ``OpPattern`` are defined in
``relax.expr`` beside ``Call``, whose struct info they infer; this module re-exports them.
"""
from __future__ import annotations

from typing import Callable

# Op and OpPattern are IR (the callee of a Call, and what fusion reads): relax.expr defines them
from ..expr import Call, Expr, Op, OpPattern, RelaxError, const

__all__ = ["Op", "OpPattern", "register_op", "call", "get", "as_expr"]


def register_op(name: str, infer: Callable, legalize: Callable | None = None,
                pattern: int = OpPattern.OPAQUE, doc: str = "") -> Op:
    """Register (or re-register) an operator."""
    op = Op(name, infer, legalize, pattern, doc)
    Op._registry[name] = op
    return op


def call(name: str, args, attrs=None, sinfo_args=()) -> Call:
    """Build a call of the registered operator ``name``."""
    return Call(Op.get(name), list(args), attrs, sinfo_args)


def get(name: str) -> Op:
    return Op.get(name)


def as_expr(x, op_name: str | None = None) -> Expr:
    """Python scalars and numpy arrays become constants; expressions pass through.

    With ``op_name``, a value that cannot be a constant raises ``RelaxError`` naming the op.

    Examples
    --------
    >>> as_expr(1.5).struct_info
    Tensor((), 'float32')
    """
    if isinstance(x, Expr) or op_name is None:
        return x if isinstance(x, Expr) else const(x)
    try:
        return const(x)
    except Exception as err:
        raise RelaxError(f"{op_name}: cannot use {x!r} as an argument: {err}") from None
