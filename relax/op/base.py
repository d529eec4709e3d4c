"""The operator registry: each Relax operator has one struct-info inference function, one
legalization to ``tensorir.te``, and a fusion pattern kind.

Registering an operator::

    register_op("relax.add", infer=infer_binary_broadcast, legalize=legalize_add,
                pattern=OpPattern.BROADCAST)

``infer(call) -> StructInfo`` reads ``call.args`` (their struct infos) and ``call.attr_dict``; a
shape that is provably wrong raises ``RelaxError`` naming the op and the dims.
``legalize(bb, call) -> Expr`` emits the computation as TensorIR, normally with
``bb.call_te(te_func, *call.args, **attrs)``; None means the op is kept for the VM (a builtin).
"""
from __future__ import annotations

from typing import Callable

from tilecraft.tensorir.expr import Node

from ..expr import Call, Expr, RelaxError
from ..struct_info import StructInfo


class OpPattern:
    """Fusion pattern kinds, as in TVM (lower fuses more freely)."""
    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_EWISE_FUSABLE = 4   # matmul, conv: elementwise epilogues fuse into them
    TUPLE = 7
    OPAQUE = 8

    NAMES = {0: "elemwise", 1: "broadcast", 2: "injective", 3: "comm_reduce",
             4: "out_ewise_fusable", 7: "tuple", 8: "opaque"}


class Op(Node):
    """A registered operator; ``Op.get(name)`` returns the one instance of that name."""

    _fields = ("name",)
    __slots__ = ("name", "infer", "legalize", "pattern", "doc")
    _registry: dict[str, "Op"] = {}

    def __init__(self, name: str, infer=None, legalize=None, pattern=OpPattern.OPAQUE, doc=""):
        self._init(name=name, infer=infer, legalize=legalize, pattern=pattern, doc=doc)

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return hash(("Op", self.name))

    def replace(self, **changes):
        return self  # operators are singletons

    @staticmethod
    def get(name: str) -> "Op":
        try:
            return Op._registry[name]
        except KeyError:
            raise RelaxError(f"unknown operator {name!r}") from None

    @staticmethod
    def list_ops() -> list[str]:
        return sorted(Op._registry)

    def infer_struct_info(self, call: Call) -> StructInfo:
        if self.infer is None:
            raise RelaxError(f"operator {self.name} has no struct-info inference", call)
        try:
            return self.infer(call)
        except RelaxError:
            raise
        except Exception as err:  # surface any inference failure as a RelaxError naming the op
            raise RelaxError(f"{self.name}: {err}", call) from err

    def __repr__(self):
        return f"Op({self.name})"


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


def as_expr(x) -> Expr:
    """Python scalars and numpy arrays become constants; expressions pass through."""
    if isinstance(x, Expr):
        return x
    from ..expr import const
    return const(x)
