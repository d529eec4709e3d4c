"""Immutable expression nodes of TensorIR.

Every node is a ``PrimExpr`` with a ``dtype`` string. Python operators build new nodes::

    >>> from tilecraft.tensorir import var
    >>> n = var("n")
    >>> e = (n * 8 + 3) // 8
    >>> e.dtype
    'int64'

``a == b`` builds an ``EQ`` node; its truth value (``bool(a == b)``) is structural equality, so
expressions work as dict keys and in ``in`` tests. Variables compare by identity: two ``Var("n")``
are different variables.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from tilecraft.errors import TilecraftError

from . import dtype as dt


class TIRError(TilecraftError):
    """An error about a particular IR node; ``.node`` is that node."""

    def __init__(self, message: str, node: Any = None):
        super().__init__(message)
        self.node = node


# Printing (tensorir.script) and structural equality and hashing (tensorir.structural) cover
# every kind of node, statements and functions too, so they sit above this module: each
# registers itself here when it is imported (``import tilecraft.tensorir`` imports both).

def _not_loaded(*args):
    raise RuntimeError("tensorir.script / tensorir.structural is not loaded yet (they register "
                       "themselves when tilecraft.tensorir is imported)")


_to_script: Callable[[Any], str] = _not_loaded
_structural_equal: Callable[[Any, Any], bool] = _not_loaded
_structural_hash: Callable[[Any], int] = _not_loaded


def register_printer(to_script: Callable[[Any], str]) -> None:
    """Make ``to_script`` what ``node.script()`` (and ``repr``) call."""
    global _to_script
    _to_script = to_script


def register_structural(equal: Callable[[Any, Any], bool], hash_: Callable[[Any], int]) -> None:
    """Make ``equal`` and ``hash_`` what ``bool(a == b)`` and ``hash(expr)`` use."""
    global _structural_equal, _structural_hash
    _structural_equal, _structural_hash = equal, hash_


_set_field = object.__setattr__   # how a node's constructor sets its (immutable) fields


class Node:
    """Base of every IR node: fields are fixed at construction (immutable)."""

    _fields: tuple[str, ...] = ()
    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; build a new node instead")

    def _init(self, **kwargs):
        for k, v in kwargs.items():
            object.__setattr__(self, k, v)

    def replace(self, **changes):
        """A copy of this node with some fields changed."""
        kwargs = {f: getattr(self, f) for f in self._fields}
        kwargs.update(changes)
        return type(self)(**kwargs)

    def script(self) -> str:
        return _to_script(self)

    def __repr__(self):
        try:
            return self.script()
        except Exception:  # printing must never hide the real error
            return f"<{type(self).__name__}>"


def _python_const(value, like: "PrimExpr | None" = None) -> "PrimExpr":
    """Turn a Python scalar into an immediate, taking the dtype of the other operand."""
    if isinstance(value, PrimExpr):
        return value
    if hasattr(value, "_as_expr"):  # an IterVar (te axis) stands for its variable
        return value._as_expr()
    if isinstance(value, bool):
        return IntImm(int(value), "bool")
    if isinstance(value, int):
        if like is not None and (dt.is_integer(like.dtype) or dt.is_float(like.dtype)):
            target = dt.element_of(like.dtype)
            return FloatImm(float(value), target) if dt.is_float(target) else IntImm(value, target)
        return IntImm(value, "int64")
    if isinstance(value, float):
        if like is not None and dt.is_float(like.dtype):
            return FloatImm(value, dt.element_of(like.dtype))
        if like is not None:
            raise TIRError(f"cannot combine the Python float {value} with the {like.dtype} expression "
                           f"{like!r}; cast one side with .astype()", like)
        return FloatImm(value, "float32")
    # numpy scalars
    try:
        import numpy as np
        if isinstance(value, np.generic):
            d = dt.from_numpy(value.dtype)
            return FloatImm(float(value), d) if dt.is_float(d) else IntImm(int(value), d)
    except ImportError:  # pragma: no cover
        pass
    raise TIRError(f"cannot use {type(value).__name__} {value!r} as an expression")


def convert(value, like: "PrimExpr | None" = None) -> "PrimExpr":
    """Convert a Python int/float/bool (or an expression) to a ``PrimExpr``."""
    return _python_const(value, like)


def _binary(cls, a, b):
    if not isinstance(a, PrimExpr):
        a = _python_const(a, b if isinstance(b, PrimExpr) else None)
    if not isinstance(b, PrimExpr):
        b = _python_const(b, a)
    return cls(a, b)


class PrimExpr(Node):
    """Base of all expressions."""

    __slots__ = ("dtype",)

    # arithmetic
    def __add__(self, other): return _binary(Add, self, other)
    def __radd__(self, other): return _binary(Add, other, self)
    def __sub__(self, other): return _binary(Sub, self, other)
    def __rsub__(self, other): return _binary(Sub, other, self)
    def __mul__(self, other): return _binary(Mul, self, other)
    def __rmul__(self, other): return _binary(Mul, other, self)
    def __truediv__(self, other): return _binary(Div, self, other)
    def __rtruediv__(self, other): return _binary(Div, other, self)
    def __floordiv__(self, other): return _binary(FloorDiv, self, other)
    def __rfloordiv__(self, other): return _binary(FloorDiv, other, self)
    def __mod__(self, other): return _binary(FloorMod, self, other)
    def __rmod__(self, other): return _binary(FloorMod, other, self)

    def __neg__(self):
        zero = FloatImm(0.0, self.dtype) if dt.is_float(self.dtype) else IntImm(0, self.dtype)
        return Sub(zero, self)

    # comparisons
    def __lt__(self, other): return _binary(LT, self, other)
    def __le__(self, other): return _binary(LE, self, other)
    def __gt__(self, other): return _binary(GT, self, other)
    def __ge__(self, other): return _binary(GE, self, other)
    def __eq__(self, other): return _binary(EQ, self, other)  # type: ignore[override]
    def __ne__(self, other): return _binary(NE, self, other)  # type: ignore[override]

    # logic (bool expressions)
    def __and__(self, other): return _binary(And, self, other)
    def __rand__(self, other): return _binary(And, other, self)
    def __or__(self, other): return _binary(Or, self, other)
    def __ror__(self, other): return _binary(Or, other, self)
    def __invert__(self): return Not(self)

    def __hash__(self):
        return _structural_hash(self)

    def __bool__(self):
        raise TIRError(f"the truth value of the symbolic expression {self!r} is unknown; "
                       "use tensorir.arith.can_prove() or structural_equal()", self)

    def astype(self, dtype: str) -> "PrimExpr":
        """Cast to ``dtype`` (no-op if it already has it)."""
        dt.check(dtype)
        return self if dtype == self.dtype else Cast(dtype, self)


class Var(PrimExpr):
    """A variable: a symbolic shape dimension, loop variable, or block iteration variable."""

    _fields = ("name", "dtype")
    __slots__ = ("name",)

    def __init__(self, name: str, dtype: str = "int64"):
        self._init(name=str(name), dtype=dt.check(dtype))

    def __hash__(self):
        return id(self)

    def replace(self, **changes):  # a Var is defined by its identity; never copy it implicitly
        if not changes:
            return self
        return Var(changes.get("name", self.name), changes.get("dtype", self.dtype))


class IntImm(PrimExpr):
    """An integer (or bool) constant."""

    _fields = ("value", "dtype")
    __slots__ = ("value",)

    def __init__(self, value: int, dtype: str = "int64"):
        dt.check(dtype)
        if not (dt.is_integer(dtype) or dt.is_bool(dtype)):
            raise TIRError(f"IntImm needs an integer or bool dtype, got {dtype}")
        value = int(value)
        if dt.is_bool(dtype):
            value = 1 if value else 0
        self._init(value=value, dtype=dtype)


class FloatImm(PrimExpr):
    """A floating-point constant."""

    _fields = ("value", "dtype")
    __slots__ = ("value",)

    def __init__(self, value: float, dtype: str = "float32"):
        dt.check(dtype)
        if not dt.is_float(dtype):
            raise TIRError(f"FloatImm needs a float dtype, got {dtype}")
        self._init(value=float(value), dtype=dtype)


class StringImm(PrimExpr):
    """A string constant (messages of run-time checks)."""

    _fields = ("value",)
    __slots__ = ("value",)

    def __init__(self, value: str):
        self._init(value=str(value), dtype="handle")


class BinaryOp(PrimExpr):
    """Base of two-operand nodes; both operands must have the same dtype."""

    _fields = ("a", "b")
    __slots__ = ("a", "b")
    symbol = "?"

    def __init__(self, a: PrimExpr, b: PrimExpr):
        if not (isinstance(a, PrimExpr) and isinstance(b, PrimExpr)):
            a = convert(a, b if isinstance(b, PrimExpr) else None)
            b = convert(b, a)
        if a.dtype != b.dtype:
            raise TIRError(f"{type(self).__name__}: operand dtypes differ: {a!r} is {a.dtype}, "
                           f"{b!r} is {b.dtype}; cast one side with .astype()", a)
        # the fields set directly (the passes build these by the hundred thousand)
        _set_field(self, "a", a)
        _set_field(self, "b", b)
        _set_field(self, "dtype", self._result_dtype(a.dtype))

    def _result_dtype(self, operand_dtype: str) -> str:
        return operand_dtype


class Add(BinaryOp):
    __slots__ = ()
    symbol = "+"


class Sub(BinaryOp):
    __slots__ = ()
    symbol = "-"


class Mul(BinaryOp):
    __slots__ = ()
    symbol = "*"


class Div(BinaryOp):
    """True division for floats; truncating division for integers (C semantics)."""
    __slots__ = ()
    symbol = "/"


class Mod(BinaryOp):
    """Truncating remainder (C ``%``)."""
    __slots__ = ()
    symbol = "truncmod"


class FloorDiv(BinaryOp):
    """Integer division rounding towards minus infinity (Python ``//``)."""
    __slots__ = ()
    symbol = "//"

    def _result_dtype(self, d):
        return d


class FloorMod(BinaryOp):
    """Remainder of FloorDiv, with the sign of the divisor (Python ``%``)."""
    __slots__ = ()
    symbol = "%"


class Min(BinaryOp):
    __slots__ = ()
    symbol = "min"


class Max(BinaryOp):
    __slots__ = ()
    symbol = "max"


class CmpOp(BinaryOp):
    __slots__ = ()

    def _result_dtype(self, d):
        return dt.with_lanes("bool", dt.lanes(d))


class EQ(CmpOp):
    __slots__ = ()
    symbol = "=="

    def __bool__(self):
        return _structural_equal(self.a, self.b)


class NE(CmpOp):
    __slots__ = ()
    symbol = "!="

    def __bool__(self):
        return not _structural_equal(self.a, self.b)


class LT(CmpOp):
    __slots__ = ()
    symbol = "<"


class LE(CmpOp):
    __slots__ = ()
    symbol = "<="


class GT(CmpOp):
    __slots__ = ()
    symbol = ">"


class GE(CmpOp):
    __slots__ = ()
    symbol = ">="


class And(BinaryOp):
    __slots__ = ()
    symbol = "and"

    def __init__(self, a, b):
        super().__init__(a, b)
        if not dt.is_bool(self.a.dtype):
            raise TIRError(f"And needs bool operands, got {self.a.dtype}", self)


class Or(BinaryOp):
    __slots__ = ()
    symbol = "or"

    def __init__(self, a, b):
        super().__init__(a, b)
        if not dt.is_bool(self.a.dtype):
            raise TIRError(f"Or needs bool operands, got {self.a.dtype}", self)


class Not(PrimExpr):
    _fields = ("a",)
    __slots__ = ("a",)

    def __init__(self, a: PrimExpr):
        a = convert(a)
        if not dt.is_bool(a.dtype):
            raise TIRError(f"Not needs a bool operand, got {a.dtype}", a)
        self._init(a=a, dtype=a.dtype)


class Select(PrimExpr):
    """``true_value if condition else false_value``; both sides are evaluated."""

    _fields = ("condition", "true_value", "false_value")
    __slots__ = ("condition", "true_value", "false_value")

    def __init__(self, condition: PrimExpr, true_value, false_value):
        condition = convert(condition)
        t = convert(true_value, false_value if isinstance(false_value, PrimExpr) else None)
        f = convert(false_value, t)
        if not dt.is_bool(condition.dtype):
            raise TIRError(f"Select condition must be bool, got {condition.dtype}", condition)
        if t.dtype != f.dtype:
            raise TIRError(f"Select branches differ in dtype: {t.dtype} vs {f.dtype}", t)
        self._init(condition=condition, true_value=t, false_value=f, dtype=t.dtype)


class Cast(PrimExpr):
    _fields = ("dtype", "value")
    __slots__ = ("value",)

    def __init__(self, dtype: str, value: PrimExpr):
        self._init(dtype=dt.check(dtype), value=convert(value))


# Intrinsics known to every back end; name -> number of arguments.
INTRINSICS = {
    "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1, "sigmoid": 1, "erf": 1, "pow": 2,
    "fabs": 1, "floor": 1, "ceil": 1, "round": 1, "sin": 1, "cos": 1, "exp2": 1, "log2": 1,
    "trunc": 1, "if_then_else": 3,
}
FLOAT_INTRINSICS = {k for k in INTRINSICS if k != "if_then_else"}

# The packed 8-bit dot product of the int8 kernels (int32 operands, four bytes each): only the
# LLVM back end emits it (``targets.llvm.dot4``); ``tensorir.interpret`` evaluates it. Named here
# so that kernels (relax) and the back end (targets) share the name without relax importing the
# LLVM back end, which needs llvmlite (a board has none).
DOT4_U8I8 = "dot4_u8i8"

# ``nibble_f32(w, s)``: the float32 value of bits ``s .. s+3`` of an int32 ``w``
# (``float((w >> s) & 15)``, ``0 <= s <= 28``): the int4 kernel's unpacking step. The LLVM back end emits one ``vpermps`` from a 16-entry table on AVX-512
# (it reads only the low 4 bits of each index lane, so no mask is needed) and a mask and a
# convert elsewhere; ``tensorir.interpret`` evaluates it.
NIBBLE_F32 = "nibble_f32"

# The tensor-core intrinsics of the fp16 GEMM kernel for NVIDIA OpenCL
# (``relax.backend.gpu.tensor_core``); only the OpenCL back end emits them
# (``targets.opencl_backend.tensor_core``: inline PTX for ``-device=nvidia``, a portable
# emulation for ``-device=nvidia-emulated``). Each is ``Evaluate(Call("int32", op, [...]))``
# over buffer elements (BufferLoads naming the first of consecutive elements):
# * ``TC_MMA``: ``[acc[i], a[j], b[k]]``, a warp's ``mma.sync.aligned.m16n8k16.row.col.f32.
#   f16.f16.f32``: ``acc[i..i+3]`` (float32, local) += A (16 x 16, ``a[j..j+3]``: uint32, two
#   halves each) x B (16 x 8, ``b[k..k+1]``), in the PTX ISA's fragment layout;
# * ``TC_LOAD_B128``: ``[dst[i], src[j]]``, the 16 bytes at ``src[j]`` into ``dst[i..i+3]``
#   (uint32): from a global buffer into registers (local), from registers into a shared tile
#   (global and shared addresses multiples of 16 bytes).
# * ``TC_LDMATRIX_X4`` / ``TC_LDMATRIX_X2``: ``[dst[i], src[j], trans]``, a warp's ``ldmatrix.
#   sync.aligned.m8n8.x4`` / ``.x2 .shared.b16`` (``.trans`` where the integer constant
#   ``trans`` is 1): this lane gives the address of ``src[j]`` (a shared uint32 buffer,
#   16-byte aligned: a row of 8 halves) as row ``lane % 8`` of matrix ``lane // 8`` (lanes
#   0..15 only for x2), and receives in ``dst[i + r]`` (local uint32) the word ``lane % 4`` of
#   row ``lane // 4`` of matrix ``r`` (r < 4, resp. 2); with ``trans``, the halves of column
#   ``lane // 4`` in rows ``2 (lane % 4)`` (low half) and ``2 (lane % 4) + 1``;
# * ``TC_CP_ASYNC``: ``[dst[i], src[j]]``, an asynchronous 16-byte copy of ``src[j..j+3]``
#   (global) into ``dst[i..i+3]`` (shared uint32), both 16-byte aligned (``cp.async.cg``);
#   ``TC_CP_COMMIT`` (no arguments) closes this thread's group of copies issued since the last,
#   ``TC_CP_WAIT`` ``[n]`` (an integer constant) waits until at most ``n`` of its groups are
#   pending (a work-group barrier must follow before other threads read the copied words).
# ``TC_PACK_LO`` / ``TC_PACK_HI`` (uint32 expressions of two uint32 ``a``, ``b``): the low
# halves of both as one word (``a & 0xffff | b << 16``), the high halves (``a >> 16 | b &
# 0xffff0000``). ``TC_PACK_HALF2`` (uint32 of two float32 ``lo``, ``hi``): both rounded to
# float16 (to nearest even), ``lo`` in the low half.
TC_MMA = "tc_mma_m16n8k16"
TC_LOAD_B128 = "tc_load_b128"
TC_PACK_LO = "tc_pack_lo"
TC_PACK_HI = "tc_pack_hi"
TC_PACK_HALF2 = "tc_pack_half2"
TC_LDMATRIX_X4 = "tc_ldmatrix_x4"
TC_LDMATRIX_X2 = "tc_ldmatrix_x2"
TC_CP_ASYNC = "tc_cp_async"
TC_CP_COMMIT = "tc_cp_commit"
TC_CP_WAIT = "tc_cp_wait"
# The 3xTF32 float32 GEMM's (``relax.backend.gpu.tensor_core_tf32``):
# * ``TC_MMA_TF32``: ``[acc[i], a[j], b[k]]`` as ``TC_MMA``, one ``mma.sync.aligned.m16n8k8.
#   row.col.f32.tf32.tf32.f32``: A 16 x 8 (``a[j..j+3]``: uint32, one tf32 each), B 8 x 8
#   (``b[k..k+1]``);
# * ``TC_TF32_BIG`` (uint32 of a float32 ``x``): ``x`` rounded to tf32 (to nearest, ties away
#   from zero, 10 mantissa bits: ``cvt.rna.tf32.f32``), as float32 bits with the low 13 zero;
#   ``TC_TF32_SMALL`` (uint32 of float32 ``x`` and its ``TC_TF32_BIG`` word ``big``): the
#   remainder ``x - big`` (exact in float32) rounded to tf32 likewise.
TC_MMA_TF32 = "tc_mma_m16n8k8_tf32"
TC_TF32_BIG = "tc_tf32_big"
TC_TF32_SMALL = "tc_tf32_small"
# the intrinsics that write the elements their first argument names (the device lowering's
# barrier placement counts them as writes of that buffer)
WRITES_FIRST_ARG = (TC_MMA, TC_LOAD_B128, TC_LDMATRIX_X4, TC_LDMATRIX_X2, TC_CP_ASYNC,
                    TC_MMA_TF32)
# how many consecutive elements (along the last dim) each buffer-element argument of an
# intrinsic names (the allocation compaction keeps them all)
INTRINSIC_ELEMENTS = {TC_MMA: (4, 4, 2), TC_LOAD_B128: (4, 4), TC_LDMATRIX_X4: (4, 4),
                      TC_LDMATRIX_X2: (2, 4), TC_CP_ASYNC: (4, 4), TC_MMA_TF32: (4, 4, 2)}

# An Intel AMX int8 block product (the tensor intrinsic ``amx_u8s8s32_{M}x{N}x{K}``,
# ``tensorir.schedule.intrinsics``; only the LLVM back end emits it, ``targets.llvm.amx``):
# ``Evaluate(Call("int32", AMX_U8I8, [c[..], a[..], b[..], c_next[..], a_next[..], b_next[..],
# rows, ksteps, col_tiles]))`` adds to the int32 block at ``c`` (``rows`` x ``16 col_tiles``)
# the product of the uint8 rows at ``a`` (``64 ksteps`` bytes each, as int32 words) and the
# int8 weight words at ``b`` in the VNNI layout (``16 ksteps`` rows of words, word ``[kw, n]``
# holding ``W[4 kw + p, n]`` in byte ``p``). The first six arguments are BufferLoads naming
# elements (never loaded): each operand's first element and the first element of its next
# row, so that a row stride is the distance between the two in whatever layout the buffer
# has by then (compacted, flattened). ``rows`` (1..32) may vary; ``ksteps`` and ``col_tiles``
# are integer constants.
AMX_U8I8 = "amx_u8i8"
AMX_U8I8_ARGS = 9

# A software prefetch, ``Evaluate(Call("int32", PREFETCH, [buffer[indices]]))``: a hint that the
# cache line holding ``buffer[indices]`` is read soon (read, high locality, data cache). Its
# one argument is a BufferLoad naming the element, never loaded: the LLVM back end emits
# ``llvm.prefetch`` of its address; ``tensorir.interpret`` and the GPU back ends emit nothing.
# Build it with ``tensorir.stmt.prefetch``.
PREFETCH = "prefetch"


class Call(PrimExpr):
    """A call to an intrinsic such as ``exp`` or ``if_then_else`` (which evaluates lazily)."""

    _fields = ("dtype", "op", "args")
    __slots__ = ("op", "args")

    def __init__(self, dtype: str, op: str, args: Sequence):
        args = tuple(convert(a) for a in args)
        dt.check(dtype)
        if op in INTRINSICS and len(args) != INTRINSICS[op]:
            raise TIRError(f"intrinsic {op} takes {INTRINSICS[op]} argument(s), got {len(args)}")
        if op == PREFETCH and (len(args) != 1 or not isinstance(args[0], BufferLoad)):
            raise TIRError(f"intrinsic {PREFETCH} takes one buffer element (a BufferLoad), got "
                           f"{list(args)!r}", args[0] if args else None)
        if op == AMX_U8I8 and (len(args) != AMX_U8I8_ARGS or
                               not all(isinstance(a, BufferLoad) for a in args[:6])):
            raise TIRError(f"intrinsic {AMX_U8I8} takes six buffer elements (BufferLoads: "
                           f"each operand's first element and that of its next row) and three "
                           f"integers, got {list(args)!r}", args[0] if args else None)
        if op in FLOAT_INTRINSICS:
            for a in args:
                if not dt.is_float(a.dtype):
                    raise TIRError(f"intrinsic {op} needs float arguments, got {a!r} of {a.dtype}", a)
        self._init(dtype=dtype, op=str(op), args=args)


class BufferLoad(PrimExpr):
    """``buffer[indices]``."""

    _fields = ("buffer", "indices")
    __slots__ = ("buffer", "indices")

    def __init__(self, buffer, indices: Sequence):
        indices = tuple(convert(i) for i in indices)
        if len(indices) != len(buffer.shape):
            raise TIRError(f"buffer {buffer.name} has {len(buffer.shape)} dimension(s) but is "
                           f"indexed with {len(indices)}", buffer)
        for i in indices:
            if not dt.is_integer(i.dtype):
                raise TIRError(f"index {i!r} of buffer {buffer.name} must be an integer, "
                               f"got {i.dtype}", i)
        self._init(buffer=buffer, indices=indices, dtype=buffer.dtype)


class Let(PrimExpr):
    """``body`` with ``var`` bound to ``value``."""

    _fields = ("var", "value", "body")
    __slots__ = ("var", "value", "body")

    def __init__(self, var: Var, value: PrimExpr, body: PrimExpr):
        value = convert(value)
        if var.dtype != value.dtype:
            raise TIRError(f"Let {var.name}: value dtype {value.dtype} differs from {var.dtype}", var)
        self._init(var=var, value=value, body=convert(body), dtype=convert(body).dtype)


class Reduce(PrimExpr):
    """A commutative reduction, only legal as the whole body of a ``te.compute``.

    ``combiner`` is one of ``sum``, ``prod``, ``max``, ``min``; ``axis`` a tuple of reduce IterVars.
    """

    _fields = ("combiner", "source", "axis", "condition", "init")
    __slots__ = ("combiner", "source", "axis", "condition", "init")

    def __init__(self, combiner: str, source: PrimExpr, axis: Sequence, condition=None, init=None):
        if combiner not in ("sum", "prod", "max", "min"):
            raise TIRError(f"unknown reduction combiner {combiner!r}")
        source = convert(source)
        init = None if init is None else convert(init, source)
        cond = IntImm(1, "bool") if condition is None else convert(condition)
        self._init(combiner=combiner, source=source, axis=tuple(axis), condition=cond, init=init,
                   dtype=source.dtype)


# ---------------------------------------------------------------------------------------------
# Constructors used across the code base


def const(value, dtype: str | None = None) -> PrimExpr:
    """An immediate of the given dtype: ``const(3, "int64")``, ``const(0.5, "float32")``."""
    if dtype is None:
        return convert(value)
    if dt.is_float(dtype):
        return FloatImm(float(value), dtype)
    return IntImm(int(value), dtype)


def var(name: str, dtype: str = "int64") -> Var:
    """A symbolic variable, e.g. a shape dimension: ``n = tensorir.var("n")``."""
    return Var(name, dtype)


def min_value(dtype: str) -> PrimExpr:
    """The smallest value of a dtype (``-inf`` for floats): the identity of ``max``."""
    import numpy as np
    if dt.is_float(dtype):
        return FloatImm(float("-inf"), dtype)
    if dt.is_bool(dtype):
        return IntImm(0, dtype)
    return IntImm(int(np.iinfo(dt.to_numpy(dtype)).min), dtype)


def max_value(dtype: str) -> PrimExpr:
    """The largest value of a dtype (``+inf`` for floats): the identity of ``min``."""
    import numpy as np
    if dt.is_float(dtype):
        return FloatImm(float("inf"), dtype)
    if dt.is_bool(dtype):
        return IntImm(1, dtype)
    return IntImm(int(np.iinfo(dt.to_numpy(dtype)).max), dtype)


def identity_of(combiner: str, dtype: str) -> PrimExpr:
    """The identity element of a combiner (0 for sum, 1 for prod, -inf / min for max, ...)."""
    if combiner == "sum":
        return FloatImm(0.0, dtype) if dt.is_float(dtype) else IntImm(0, dtype)
    if combiner == "prod":
        return FloatImm(1.0, dtype) if dt.is_float(dtype) else IntImm(1, dtype)
    if combiner == "max":
        return min_value(dtype)
    if combiner == "min":
        return max_value(dtype)
    raise TIRError(f"unknown combiner {combiner}")


def combine(combiner: str, acc: PrimExpr, value: PrimExpr) -> PrimExpr:
    """``acc (+|*|max|min) value``."""
    if combiner == "sum":
        return acc + value
    if combiner == "prod":
        return acc * value
    if combiner == "max":
        return Max(acc, value)
    return Min(acc, value)


def is_const_int(e, value: int | None = None) -> bool:
    """True if ``e`` is an IntImm (with ``value``, if given)."""
    return isinstance(e, IntImm) and (value is None or e.value == value)


def as_int(e) -> int | None:
    """The Python int of an IntImm (or int), else None."""
    if isinstance(e, int):
        return e
    if isinstance(e, IntImm):
        return e.value
    return None


def true() -> IntImm:
    return IntImm(1, "bool")


def false() -> IntImm:
    return IntImm(0, "bool")


def min_(a, b) -> PrimExpr:
    return _binary(Min, a, b)


def max_(a, b) -> PrimExpr:
    return _binary(Max, a, b)


def truncdiv(a, b) -> PrimExpr:
    return _binary(Div, a, b)


def truncmod(a, b) -> PrimExpr:
    return _binary(Mod, a, b)


def floordiv(a, b) -> PrimExpr:
    return _binary(FloorDiv, a, b)


def floormod(a, b) -> PrimExpr:
    return _binary(FloorMod, a, b)


def select(cond, t, f) -> PrimExpr:
    return Select(cond, t, f)


def call(op: str, *args, dtype: str | None = None) -> Call:
    """Call an intrinsic; the result dtype defaults to the first argument's."""
    args = [convert(a) for a in args]
    if dtype is None:
        dtype = args[1].dtype if op == "if_then_else" else args[0].dtype
    return Call(dtype, op, args)
