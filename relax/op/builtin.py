"""Operators the VM handles itself: ``call_tir`` (run a PrimFunc on arguments it is given and
outputs the VM allocates)."""
from __future__ import annotations

from ..expr import GlobalVar, RelaxError, Tuple
from .base import OpPattern, register_op


def _infer_call_tir(call):
    if len(call.args) not in (2, 3) or not isinstance(call.args[0], GlobalVar) \
            or not isinstance(call.args[1], Tuple):
        raise RelaxError("call_tir takes (GlobalVar, Tuple of arguments[, ShapeExpr of tir vars])",
                         call)
    if len(call.sinfo_args) != 1:
        raise RelaxError("call_tir needs the output struct info in sinfo_args", call)
    return call.sinfo_args[0]


register_op("relax.call_tir", _infer_call_tir, None, OpPattern.OPAQUE,
            doc="Call a PrimFunc; outputs are allocated by the VM and passed last.")
