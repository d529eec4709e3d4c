"""Relax expressions: the graph-level IR.

Every expression carries ``struct_info`` (``relax.struct_info``). A ``Call`` of a registered
operator infers its struct info when it is built, through the operator's inference function, so
a shape error surfaces where the graph is written, naming the op and the dimensions.

Functions are in A-normal form: a ``Function`` body is a ``SeqExpr`` of binding blocks (plain or
dataflow) whose bindings bind ``Var``s to calls, tuples, constants...; ``relax.BlockBuilder``
builds them.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import Node, PrimExpr, TIRError, Var as _TirVar, convert
from tilecraft.tensorir.function import PrimFunc

from .struct_info import (FuncStructInfo, ObjectStructInfo, PrimStructInfo, ShapeStructInfo,
                          StructInfo, TensorStructInfo, TupleStructInfo, make_shape)


class RelaxError(TIRError):
    """An ill-formed Relax program or an operator applied to values it does not accept."""


# The text printer (relax.printer) knows every kind of node, so it sits above this module and
# registers itself here when it is imported (``import tilecraft.relax`` imports it).
_printer: Callable[[Any], str] | None = None


def register_printer(to_script: Callable[[Any], str]) -> None:
    """Make ``to_script`` what ``expr.script()`` (and ``repr``) of Relax nodes call."""
    global _printer
    _printer = to_script


def _script(node) -> str:
    if _printer is None:
        raise RuntimeError("the Relax printer is not loaded (import tilecraft.relax)")
    return _printer(node)


class Expr(Node):
    """Base of Relax expressions; ``struct_info`` says what the value is."""
    __slots__ = ("struct_info",)

    @property
    def shape(self):
        """The (symbolic) shape of a tensor-valued expression."""
        si = self.struct_info
        if isinstance(si, TensorStructInfo):
            return si.shape
        raise RelaxError(f"{self!r} is not a tensor (it is {si!r})", self)

    @property
    def dtype(self) -> str:
        si = self.struct_info
        if isinstance(si, TensorStructInfo):
            return si.dtype
        if isinstance(si, PrimStructInfo):
            return si.dtype
        raise RelaxError(f"{self!r} has no dtype (it is {si!r})", self)

    def script(self) -> str:
        return _script(self)


def _attrs(attrs: Mapping[str, Any] | None) -> tuple:
    return tuple(sorted(dict(attrs or {}).items()))


class Var(Expr):
    """A variable bound by a function parameter or a binding."""
    _fields = ("name_hint", "struct_info")
    __slots__ = ("name_hint",)
    _identity_leaf = True  # structural equality maps variables by where they are defined

    def __init__(self, name_hint: str, struct_info: StructInfo | None = None):
        if struct_info is not None and not isinstance(struct_info, StructInfo):
            raise RelaxError(f"Var {name_hint}: struct_info must be a StructInfo, got "
                             f"{struct_info!r}")
        self._init(name_hint=str(name_hint), struct_info=struct_info or ObjectStructInfo())

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    def replace(self, **changes):
        if not changes:
            return self
        return type(self)(changes.get("name_hint", self.name_hint),
                          changes.get("struct_info", self.struct_info))


class DataflowVar(Var):
    """A variable local to a dataflow block (not visible after it)."""
    __slots__ = ()


class GlobalVar(Expr):
    """A reference to a function of the IRModule by name."""
    _fields = ("name_hint",)
    __slots__ = ("name_hint",)

    def __init__(self, name_hint: str, struct_info: StructInfo | None = None):
        self._init(name_hint=str(name_hint), struct_info=struct_info or ObjectStructInfo())

    def __eq__(self, other):
        return isinstance(other, GlobalVar) and other.name_hint == self.name_hint

    def __hash__(self):
        return hash(("GlobalVar", self.name_hint))


class ExternFunc(Expr):
    """A function provided by the runtime (a VM builtin), by name."""
    _fields = ("global_symbol",)
    __slots__ = ("global_symbol",)

    def __init__(self, global_symbol: str):
        self._init(global_symbol=str(global_symbol), struct_info=ObjectStructInfo())


class Constant(Expr):
    """A constant tensor (holds a numpy array, never modified)."""
    _fields = ("data",)
    __slots__ = ("data",)

    def __init__(self, data):
        arr = np.array(data, copy=True) if not isinstance(data, np.ndarray) else data
        try:
            d = dt.from_numpy(arr.dtype)
        except TypeError as err:
            raise RelaxError(f"constant of unsupported dtype {arr.dtype}: {err}") from None
        arr = np.require(arr, requirements='C')  # keeps 0-d arrays 0-d
        if arr is data:
            arr = arr.copy()
        arr.setflags(write=False)
        self._init(data=arr, struct_info=TensorStructInfo(arr.shape, d))


def const(value, dtype: str | None = None) -> Constant:
    """A constant tensor from a numpy array or Python scalar/list: ``relax.const(np_array)``.

    Examples
    --------
    >>> c = const(np.ones((2, 3), "float32"))
    >>> c.struct_info
    Tensor((2, 3), 'float32')
    """
    arr = np.asarray(value, dtype=None if dtype is None else dt.to_numpy(dtype))
    if dtype is None and arr.dtype == np.float64 and not isinstance(value, np.ndarray):
        arr = arr.astype(np.float32)  # Python floats default to float32, as in TVM
    if dtype is None and arr.dtype == np.int64 and not isinstance(value, np.ndarray):
        arr = arr.astype(np.int64)
    return Constant(arr)


class ShapeExpr(Expr):
    """A shape value: ``ShapeExpr((n, 768))``."""
    _fields = ("values",)
    __slots__ = ("values",)

    def __init__(self, values: Sequence):
        values = make_shape(values)
        self._init(values=values, struct_info=ShapeStructInfo(values))


class PrimValue(Expr):
    """A scalar value (an int/float PrimExpr, possibly symbolic)."""
    _fields = ("value",)
    __slots__ = ("value",)

    def __init__(self, value):
        value = convert(value)
        self._init(value=value, struct_info=PrimStructInfo(value.dtype, value))


class StringImm(Expr):
    _fields = ("value",)
    __slots__ = ("value",)

    def __init__(self, value: str):
        self._init(value=str(value), struct_info=ObjectStructInfo())


class Tuple(Expr):
    _fields = ("fields",)
    __slots__ = ("fields",)

    def __init__(self, fields: Sequence[Expr]):
        fields = tuple(fields)
        for f in fields:
            if not isinstance(f, Expr):
                raise RelaxError(f"tuple field {f!r} is not a Relax expression")
        self._init(fields=fields, struct_info=TupleStructInfo([f.struct_info for f in fields]))


class TupleGetItem(Expr):
    _fields = ("tuple_value", "index")
    __slots__ = ("tuple_value", "index")

    def __init__(self, tuple_value: Expr, index: int):
        si = tuple_value.struct_info
        if isinstance(si, TupleStructInfo):
            if not -len(si.fields) <= index < len(si.fields):
                raise RelaxError(f"tuple index {index} out of range for a tuple of "
                                 f"{len(si.fields)}", tuple_value)
            field_si = si.fields[index]
        elif isinstance(si, ObjectStructInfo):
            field_si = ObjectStructInfo()
        else:
            raise RelaxError(f"TupleGetItem of a non-tuple {si!r}", tuple_value)
        self._init(tuple_value=tuple_value, index=int(index), struct_info=field_si)


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



class Call(Expr):
    """``op(*args)`` with keyword ``attrs``.

    ``op`` is a registered operator (``relax.op.get("relax.add")``), a GlobalVar, a Var of function
    type or an ExternFunc. For operators the struct info is inferred here; otherwise it is
    ``struct_info`` when given (``sinfo_args`` for call_tir-like ops say the output's).
    """
    _fields = ("op", "args", "attrs", "sinfo_args", "struct_info")
    __slots__ = ("op", "args", "attrs", "sinfo_args")

    def __init__(self, op, args: Sequence[Expr], attrs: Mapping[str, Any] | None = None,
                 sinfo_args: Sequence[StructInfo] = (), struct_info: StructInfo | None = None):
        args = tuple(args)
        for a in args:
            if not isinstance(a, Expr):
                raise RelaxError(f"argument {a!r} of {getattr(op, 'name', op)!r} is not a Relax "
                                 f"expression (wrap constants with relax.const)")
        attrs_t = attrs if isinstance(attrs, tuple) else _attrs(attrs)
        self._init(op=op, args=args, attrs=attrs_t, sinfo_args=tuple(sinfo_args),
                   struct_info=ObjectStructInfo())
        if struct_info is None and isinstance(op, Op):
            struct_info = op.infer_struct_info(self)
        if struct_info is None and isinstance(op, (Var, GlobalVar)) and \
                isinstance(op.struct_info, FuncStructInfo):
            struct_info = op.struct_info.ret
        object.__setattr__(self, "struct_info", struct_info or ObjectStructInfo())

    @property
    def attr_dict(self) -> dict:
        return dict(self.attrs)

    def replace(self, **changes):
        kw = {f: getattr(self, f) for f in self._fields}
        kw.update(changes)
        if "args" in changes and "struct_info" not in changes:
            kw["struct_info"] = None  # re-infer for the new arguments
        return Call(kw["op"], kw["args"], kw["attrs"], kw["sinfo_args"], kw["struct_info"])


class Binding(Node):
    __slots__ = ()

    def script(self) -> str:
        return _script(self)


class VarBinding(Binding):
    """``var = value``."""
    _fields = ("var", "value")
    __slots__ = ("var", "value")

    def _definitions(self):
        return [self.var]

    def __init__(self, var: Var, value: Expr):
        self._init(var=var, value=value)


class MatchCast(Binding):
    """``var = match_cast(value, struct_info)``: checks at run time that ``value`` matches
    ``struct_info`` and binds the symbolic dims it introduces."""
    _fields = ("var", "value", "struct_info")
    __slots__ = ("var", "value", "struct_info")

    def _definitions(self):
        return [self.var]

    def __init__(self, var: Var, value: Expr, struct_info: StructInfo):
        self._init(var=var, value=value, struct_info=struct_info)


class BindingBlock(Node):
    _fields = ("bindings",)
    __slots__ = ("bindings",)

    def script(self) -> str:
        return _script(self)

    def __init__(self, bindings: Sequence[Binding]):
        self._init(bindings=tuple(bindings))


class DataflowBlock(BindingBlock):
    """A block of side-effect-free bindings; its DataflowVars are local to it."""
    __slots__ = ()


class SeqExpr(Expr):
    """Evaluate ``blocks`` in order, then ``body``."""
    _fields = ("blocks", "body")
    __slots__ = ("blocks", "body")

    def __init__(self, blocks: Sequence[BindingBlock], body: Expr):
        self._init(blocks=tuple(blocks), body=body, struct_info=body.struct_info)


class If(Expr):
    _fields = ("cond", "true_branch", "false_branch")
    __slots__ = ("cond", "true_branch", "false_branch")

    def __init__(self, cond: Expr, true_branch: Expr, false_branch: Expr,
                 struct_info: StructInfo | None = None):
        si = struct_info
        if si is None:
            a, b = true_branch.struct_info, false_branch.struct_info
            si = a if a == b else ObjectStructInfo()
        self._init(cond=cond, true_branch=true_branch, false_branch=false_branch, struct_info=si)


class Function(Expr):
    """``def f(params) -> ret_struct_info: body``."""
    _fields = ("params", "body", "ret_struct_info", "attrs")
    __slots__ = ("params", "body", "ret_struct_info", "attrs")

    def __init__(self, params: Sequence[Var], body: Expr, ret_struct_info: StructInfo | None = None,
                 attrs: Mapping[str, Any] | None = None):
        params = tuple(params)
        ret = ret_struct_info or body.struct_info
        self._init(params=params, body=body, ret_struct_info=ret,
                   attrs=attrs if isinstance(attrs, tuple) else _attrs(attrs),
                   struct_info=FuncStructInfo([p.struct_info for p in params], ret))

    @property
    def attr_dict(self) -> dict:
        return dict(self.attrs)

    def _definitions(self):
        return list(self.params)

    def replace(self, **changes):
        kw = {f: getattr(self, f) for f in self._fields}
        kw.update(changes)
        return Function(kw["params"], kw["body"], kw["ret_struct_info"], kw["attrs"])


def is_prim_expr_value(x) -> bool:
    return isinstance(x, PrimExpr)


def tir_vars_in(node) -> list[_TirVar]:
    """Symbolic (TensorIR) variables used under a Relax node or struct info, in first-use order
    (through variables' struct infos; PrimFuncs are not entered)."""
    out: dict[int, _TirVar] = {}
    seen: set[int] = set()

    def visit(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
            return
        if isinstance(x, _TirVar):
            out.setdefault(id(x), x)
            return
        if isinstance(x, (Var, GlobalVar)):
            visit(x.struct_info)
            return
        if not isinstance(x, Node) or isinstance(x, PrimFunc) or id(x) in seen:
            return
        seen.add(id(x))
        for f in x._fields:
            visit(getattr(x, f))

    visit(node)
    return list(out.values())
