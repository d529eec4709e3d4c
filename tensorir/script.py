"""Print TensorIR as TVMScript-like text; ``tensorir.parser.parse`` reads it back.

``func.script()`` (and ``repr`` of any node) goes through ``to_script``::

    @T.prim_func
    def main(A: T.Buffer((n, 64), "float32"), W: T.Buffer((64, 32), "float32"), C: T.Buffer((n, 32), "float32")):
        T.func_attr({"global_symbol": "main"})
        n = T.int64()
        with T.block("root"):
            for i, j, k in T.grid(n, 32, 64):
                with T.block("C"):
                    vi = T.axis.spatial(n, i)
                    vj = T.axis.spatial(32, j)
                    vk = T.axis.reduce(64, k)
                    T.reads(A[vi, vk], W[vk, vj])
                    T.writes(C[vi, vj])
                    with T.init():
                        C[vi, vj] = T.float32(0)
                    C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vk, vj]

The text is exact: ``parse(f.script())`` is structurally equal to ``f`` and prints the same text.
The rules that make it exact, and that the parser mirrors:

- Names are made unique among the names visible at each point (``i``, ``i_1``); sibling scopes
  reuse names, as TVMScript does. Symbolic dims (free variables) are declared at the top of the
  function (``n = T.int64()``).
- Immediates carry their dtype (``T.int32(3)``, ``T.float16(0.5)``, ``T.float32("inf")``), except
  int64 and bool ones, which print bare (``3``, ``True``), and an immediate operand of a binary
  operator whose other operand has the same dtype (``x * 2.0``, ``i + 1``): the parser gives a bare
  literal the dtype of the other operand.
- A range prints as its extent when it starts at 0 (``range(n)``, ``T.axis.spatial(n, i)``,
  ``A[0:n]``), else as ``start, start + extent`` (constants folded), which the parser splits back
  into (min, extent); ``T.min_extent(m, e)`` covers the ill-typed rest.
- ``LetStmt`` / ``AssertStmt`` / ``Allocate`` print flat (``x: T.int64 = v`` followed by the body)
  when they end their statement list, else as ``with T.LetStmt(v) as x:`` / ``with T.Assert(c,
  msg):`` / ``with T.allocate(...) as A:``.
"""
from __future__ import annotations

import json
import keyword
import math
import re
import sys
from contextlib import contextmanager
from typing import Any

from . import dtype as dt
from .expr import (INTRINSICS, Add, And, BufferLoad, Call, Cast, Div, EQ, FloatImm,
                   FloorDiv, FloorMod, GE, GT, IntImm, LE, LT, Let, Max, Min, Mod, Mul, NE, Node,
                   Not, Or, PrimExpr, Reduce, Select, StringImm, Sub, Var, register_printer)
from .function import IRModule, PrimFunc
from .stmt import (Allocate, AssertStmt, Block, BlockRealize, Buffer, BufferRegion, BufferStore,
                   Evaluate, For, IfThenElse, IterVar, LetStmt, Range, SeqStmt, Stmt, is_true)

__all__ = ["to_script", "RESERVED_NAMES", "sanitize"]

INDENT = "    "

# Names the text uses for itself; a variable with one of them is renamed (``T`` -> ``T_1``).
RESERVED_NAMES = frozenset(keyword.kwlist) | {"T", "I", "range", "float"}

FOR_FUNCS = {"serial": "T.serial", "parallel": "T.parallel", "vectorized": "T.vectorized",
             "unrolled": "T.unroll", "thread_binding": "T.thread_binding"}

# Python operator precedence, low to high (only the levels the printer uses).
P_OR, P_AND, P_NOT, P_CMP, P_ADD, P_MUL, P_UNARY, P_ATOM = 2, 3, 4, 5, 10, 11, 12, 14

_BINARY_SYMBOLS = {Add: ("+", P_ADD), Sub: ("-", P_ADD), Mul: ("*", P_MUL),
                   FloorDiv: ("//", P_MUL), FloorMod: ("%", P_MUL)}
_CMP_SYMBOLS = {EQ: "==", NE: "!=", LT: "<", LE: "<=", GT: ">", GE: ">="}
_CALL_LIKE = {Min: "T.min", Max: "T.max", Mod: "T.truncmod"}

# Immediates of these dtypes print bare wherever no other operand fixes their dtype.
_FREE_BARE = ("int64", "bool")


def to_script(node) -> str:
    """The TVMScript-like text of any IR node: PrimExpr, Stmt, Buffer, PrimFunc or IRModule.

    Parameters
    ----------
    node : Node
        What to print.

    Returns
    -------
    str
        Deterministic text; for a PrimFunc, IRModule or PrimExpr, ``tensorir.parser.parse`` reads
        it back into a structurally equal node.

    Examples
    --------
    >>> from tilecraft.tensorir import var
    >>> n = var("n")
    >>> to_script((n + 1) * 4)
    '(n + 1) * 4'
    """
    with recursion_room():
        return _to_script(node)


@contextmanager
def recursion_room(limit: int = 20000):
    """Deep IR (a sum of thousands of terms) recurses deeply; allow it while printing/parsing."""
    old = sys.getrecursionlimit()
    if old < limit:
        sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        if old < limit:
            sys.setrecursionlimit(old)


def _to_script(node) -> str:
    p = _Printer()
    if isinstance(node, IRModule):
        return p.module(node)
    if isinstance(node, PrimFunc):
        symbol = node.attr_dict.get("global_symbol", "main")
        name = sanitize(symbol) if isinstance(symbol, str) else "main"
        p.func(node, name if name not in RESERVED_NAMES else name + "_1")
        return p.text()
    if not isinstance(node, Node):
        raise TypeError(f"to_script expects an IR node, got {type(node).__name__} {node!r}")
    p.name_free(node)
    if isinstance(node, PrimExpr):
        return p.expr(node)
    if isinstance(node, Buffer):
        return f"{p.namer.get(node)}: T.Buffer({p.buffer_args(node)})"
    if isinstance(node, Range):
        return f"T.min_extent({p.expr(node.min)}, {p.expr(node.extent)})"
    if isinstance(node, IterVar):
        return f"{p.namer.get(node.var)} = T.axis.{node.kind}({p.dom(node)})"
    if isinstance(node, BufferRegion):
        return p.region(node)
    if isinstance(node, Block):
        p.block(None, node)
        return p.text()
    if isinstance(node, Stmt):
        p.stmt(node)
        return p.text()
    return p.generic(node)


# ---------------------------------------------------------------------------------------------
# names


def unique_name(base: str, used: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``... whichever is not in ``used``; records it there."""
    name, k = base, 0
    while name in used:
        k += 1
        name = f"{base}_{k}"
    used.add(name)
    return name


def sanitize(name: str) -> str:
    """A Python identifier close to ``name`` (ASCII letters, digits and ``_``)."""
    s = re.sub(r"[^0-9A-Za-z_]", "_", str(name))
    if not s or s[0].isdigit():
        s = "v" + s
    return s


class _Namer:
    """Unique names among the names visible at each point; a scope frees its names at its end."""

    def __init__(self):
        self.names: dict[int, str] = {}
        self.taken: set[str] = set(RESERVED_NAMES)
        self.scopes: list[list[int]] = [[]]
        self._alive: list[Any] = []  # keep named objects alive so their ids stay unique

    def define(self, obj, hint: str, root: bool = False) -> str:
        base = sanitize(hint)
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.names[id(obj)] = name
        self.taken.add(name)
        self.scopes[0 if root else -1].append(id(obj))
        self._alive.append(obj)
        return name

    def get(self, obj) -> str:
        name = self.names.get(id(obj))
        if name is None:  # used outside any definition (free, or ill-formed IR): name it for good
            hint = obj.name if hasattr(obj, "name") else "v"
            name = self.define(obj, hint, root=True)
        return name

    def push(self):
        self.scopes.append([])

    def pop(self):
        for key in self.scopes.pop():
            name = self.names.pop(key, None)
            if name is not None:
                self.taken.discard(name)


def collect_free(roots, defined: set[int]) -> tuple[list[Var], list[Buffer]]:
    """Variables and buffers used under ``roots`` but defined nowhere in them, in first-use order.

    ``defined`` holds the ids of what the caller defines (function parameters and buffers).
    """
    free_vars: dict[int, Var] = {}
    free_bufs: dict[int, Buffer] = {}
    seen_bufs: set[int] = set()
    defined = set(defined)

    def visit(x):
        if isinstance(x, (tuple, list)):
            for y in x:
                visit(y)
            return
        if isinstance(x, dict):
            for k, v in x.items():
                visit(k)
                visit(v)
            return
        if not isinstance(x, Node):
            return
        if isinstance(x, Var):
            if id(x) not in defined and id(x) not in free_vars:
                free_vars[id(x)] = x
            return
        if isinstance(x, Buffer):
            if id(x) in seen_bufs:
                return
            seen_bufs.add(id(x))
            visit(x.shape)
            visit(x.strides)
            if id(x) not in defined:
                free_bufs[id(x)] = x
            return
        if isinstance(x, For):
            defined.add(id(x.loop_var))
        elif isinstance(x, IterVar):
            defined.add(id(x.var))
        elif isinstance(x, (Let, LetStmt)):
            defined.add(id(x.var))
        elif isinstance(x, Block):
            defined.update(id(b) for b in x.alloc_buffers)
        elif isinstance(x, Allocate):
            defined.add(id(x.buffer))
        for f in x._fields:
            visit(getattr(x, f))

    for r in roots:
        visit(r)
    return list(free_vars.values()), list(free_bufs.values())


def used_var_ids(node) -> set[int]:
    """Ids of every Var under ``node`` (through tuples, dicts and buffer shapes)."""
    out: set[int] = set()
    seen_bufs: set[int] = set()

    def visit(x):
        if isinstance(x, (tuple, list)):
            for y in x:
                visit(y)
        elif isinstance(x, dict):
            for k, y in x.items():
                visit(k)
                visit(y)
        elif isinstance(x, Var):
            out.add(id(x))
        elif isinstance(x, Node):
            if isinstance(x, Buffer):
                if id(x) in seen_bufs:
                    return
                seen_bufs.add(id(x))
            for f in x._fields:
                visit(getattr(x, f))

    visit(node)
    return out


# ---------------------------------------------------------------------------------------------
# immediates and literals


def string_literal(s: str) -> str:
    """A double-quoted Python string literal of ``s``."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in s):  # lone surrogates: keep the text encodable
        return json.dumps(s)
    return json.dumps(s, ensure_ascii=False)


def _is_imm(x) -> bool:
    return isinstance(x, (IntImm, FloatImm))


def _literal(x) -> str | None:
    """The bare Python literal of an immediate, or None if it has none (inf, nan)."""
    if isinstance(x, IntImm):
        if dt.is_bool(x.dtype):
            return "True" if x.value else "False"
        return str(x.value)
    if isinstance(x, FloatImm):
        return repr(x.value) if math.isfinite(x.value) else None
    return None


def _typed_value(x) -> str:
    """The argument of ``T.<dtype>(...)`` for an immediate."""
    if isinstance(x, IntImm):
        if dt.is_bool(x.dtype):
            return "True" if x.value else "False"
        return str(x.value)
    v = x.value
    if math.isnan(v):
        return '"nan"'
    if math.isinf(v):
        return '"inf"' if v > 0 else '"-inf"'
    negative_zero = v == 0.0 and math.copysign(1.0, v) < 0
    if v.is_integer() and abs(v) < 2.0 ** 53 and not negative_zero:
        return str(int(v))  # T.float32(0), as TVMScript writes it
    return repr(v)


def _pair_modes(a, b) -> tuple[str, str]:
    """How the operands of a binary operator print their immediates ("free"/"bare"/"typed").

    The parser gives a bare literal the dtype of the other operand, and two bare literals their
    default dtypes (int64, float32, bool); these modes make the printed text say exactly that.
    """
    ai, bi = _is_imm(a), _is_imm(b)
    if ai and bi:
        a_bare = _literal(a) is not None and a.dtype in _FREE_BARE
        if a_bare:
            return "free", "free"
        return "typed", ("bare" if b.dtype == a.dtype else "typed")
    if ai:
        return ("bare" if a.dtype == b.dtype else "typed"), "free"
    if bi:
        return "free", ("bare" if a.dtype == b.dtype else "typed")
    return "free", "free"


def _is_zero(x) -> bool:
    if isinstance(x, IntImm):
        return x.value == 0
    if isinstance(x, FloatImm):
        return x.value == 0.0 and math.copysign(1.0, x.value) > 0
    return False


def range_form(rmin, extent) -> tuple:
    """How a (min, extent) range prints: ("extent", e) | ("start_stop", start, stop) |
    ("min_extent", m, e); the parser's ``make_range`` inverts the first two exactly."""
    if isinstance(rmin, IntImm) and rmin.value == 0 and rmin.dtype == extent.dtype:
        return ("extent", extent)
    if rmin.dtype == extent.dtype and dt.is_integer(rmin.dtype):
        if isinstance(rmin, IntImm) and isinstance(extent, IntImm):
            return ("start_stop", rmin, IntImm(rmin.value + extent.value, rmin.dtype))
        return ("start_stop", rmin, Add(rmin, extent))
    return ("min_extent", rmin, extent)


# ---------------------------------------------------------------------------------------------
# the printer


class _Printer:
    def __init__(self, depth: int = 0):
        self.namer = _Namer()
        self.lines: list[str] = []
        self.depth = depth

    def text(self) -> str:
        return "\n".join(self.lines)

    def emit(self, line: str):
        self.lines.append(INDENT * self.depth + line)

    def name_free(self, node):
        free_vars, free_bufs = collect_free([node], set())
        for v in free_vars:
            self.namer.define(v, v.name)
        for b in free_bufs:
            self.namer.define(b, b.name)

    # -- expressions ------------------------------------------------------------------------

    def expr(self, x, mode: str = "free") -> str:
        return self._e(x, mode)[0]

    def _imm(self, x, mode: str) -> tuple[str, int]:
        lit = _literal(x)
        if lit is not None and (mode == "bare" or (mode == "free" and x.dtype in _FREE_BARE)):
            return lit, (P_UNARY if lit.startswith("-") else P_ATOM)
        return f"T.{x.dtype}({_typed_value(x)})", P_ATOM

    def _e(self, x, mode: str = "free") -> tuple[str, int]:
        if isinstance(x, (IntImm, FloatImm)):
            return self._imm(x, mode)
        if isinstance(x, Var):
            return self.namer.get(x), P_ATOM
        if isinstance(x, StringImm):
            return string_literal(x.value), P_ATOM
        if isinstance(x, Sub) and _is_zero(x.a) and not _is_imm(x.b):
            t, p = self._e(x.b)
            return "-" + (t if p >= P_UNARY else f"({t})"), P_UNARY
        if type(x) in _BINARY_SYMBOLS or (isinstance(x, Div) and dt.is_float(x.dtype)):
            sym, prec = _BINARY_SYMBOLS.get(type(x), ("/", P_MUL))
            ma, mb = _pair_modes(x.a, x.b)
            ta, pa = self._e(x.a, ma)
            tb, pb = self._e(x.b, mb)
            if pa < prec:
                ta = f"({ta})"
            if pb <= prec:
                tb = f"({tb})"
            return f"{ta} {sym} {tb}", prec
        if type(x) in _CMP_SYMBOLS:
            ma, mb = _pair_modes(x.a, x.b)
            ta, pa = self._e(x.a, ma)
            tb, pb = self._e(x.b, mb)
            # comparisons chain in Python (a < b < c), so a nested one always needs parentheses
            if pa <= P_CMP:
                ta = f"({ta})"
            if pb <= P_CMP:
                tb = f"({tb})"
            return f"{ta} {_CMP_SYMBOLS[type(x)]} {tb}", P_CMP
        if isinstance(x, (And, Or)):
            sym, prec = ("and", P_AND) if isinstance(x, And) else ("or", P_OR)
            ma, mb = _pair_modes(x.a, x.b)
            ta, pa = self._e(x.a, ma)
            tb, pb = self._e(x.b, mb)
            if pa < prec:
                ta = f"({ta})"
            if pb <= prec:
                tb = f"({tb})"
            return f"{ta} {sym} {tb}", prec
        if isinstance(x, Not):
            t, p = self._e(x.a)
            # `not a < b` is legal but reads wrong; parenthesize comparisons too
            return "not " + (t if p > P_CMP else f"({t})"), P_NOT
        if isinstance(x, Div):  # integer (truncating) division
            return self._pair_call("T.truncdiv", x.a, x.b), P_ATOM
        if type(x) in _CALL_LIKE:
            return self._pair_call(_CALL_LIKE[type(x)], x.a, x.b), P_ATOM
        if isinstance(x, Select):
            return f"T.Select({self.expr(x.condition)}, {self._pair_args(x.true_value, x.false_value)})", P_ATOM
        if isinstance(x, Cast):
            return f"T.Cast({string_literal(x.dtype)}, {self.expr(x.value)})", P_ATOM
        if isinstance(x, Call):
            return self._call(x), P_ATOM
        if isinstance(x, BufferLoad):
            return self.access(x.buffer, x.indices), P_ATOM
        if isinstance(x, Let):
            return self._let(x), P_ATOM
        if isinstance(x, Reduce):
            return self._reduce(x), P_ATOM
        return self.generic(x), P_ATOM

    def _pair_args(self, a, b) -> str:
        ma, mb = _pair_modes(a, b)
        return f"{self._e(a, ma)[0]}, {self._e(b, mb)[0]}"

    def _pair_call(self, fn: str, a, b) -> str:
        return f"{fn}({self._pair_args(a, b)})"

    def _call(self, x: Call) -> str:
        op, args = x.op, x.args
        if op in INTRINSICS and len(args) == INTRINSICS[op] and args:
            default = args[1].dtype if op == "if_then_else" else args[0].dtype
            if x.dtype == default:
                if op == "if_then_else":
                    return f"T.if_then_else({self.expr(args[0])}, {self._pair_args(args[1], args[2])})"
                if op == "pow":
                    return self._pair_call("T.pow", args[0], args[1])
                return f"T.{op}({', '.join(self.expr(a) for a in args)})"
        parts = [string_literal(x.dtype), string_literal(op)] + [self.expr(a) for a in args]
        return f"T.call_intrin({', '.join(parts)})"

    def _let(self, x: Let) -> str:
        self.namer.push()
        where = []
        while isinstance(x, Let):
            value = self.expr(x.value)
            where.append(f"{self.namer.define(x.var, x.var.name)}: {value}")
            x = x.body
        body = self.expr(x)
        self.namer.pop()
        return f"T.Let({body}, where={{{', '.join(where)}}})"

    def _reduce(self, x: Reduce) -> str:
        # te-only node: readable, not parseable
        parts = [self.expr(x.source), f"axis=[{', '.join(self.namer.get(a.var) for a in x.axis)}]"]
        if not is_true(x.condition):
            parts.append(f"where={self.expr(x.condition)}")
        if x.init is not None:
            parts.append(f"init={self.expr(x.init)}")
        return f"T.{x.combiner}({', '.join(parts)})"

    def access(self, buf: Buffer, indices) -> str:
        name = self.namer.get(buf)
        if not indices:
            return f"{name}[()]"
        return f"{name}[{', '.join(self.expr(i) for i in indices)}]"

    def generic(self, x) -> str:
        """Fallback for nodes this printer does not know: ``Type(field=..., ...)``."""
        parts = []
        for f in getattr(x, "_fields", ()):
            parts.append(f"{f}={self.value(getattr(x, f))}")
        return f"{type(x).__name__}({', '.join(parts)})"

    # -- attribute values (JSON-like Python data, or IR) -----------------------------------

    def value(self, v) -> str:
        if v is None or isinstance(v, bool):
            return repr(v)
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            if math.isfinite(v):
                return repr(v)
            return f'float("{v}")'
        if isinstance(v, str):
            return string_literal(v)
        if isinstance(v, list):
            return "[" + ", ".join(self.value(y) for y in v) + "]"
        if isinstance(v, tuple):
            if len(v) == 1:
                return f"({self.value(v[0])},)"
            return "(" + ", ".join(self.value(y) for y in v) + ")"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{self.value(k)}: {self.value(y)}" for k, y in v.items()) + "}"
        if isinstance(v, PrimExpr):
            # bare numbers are Python values here, so immediates always carry their dtype
            return self.expr(v, "typed")
        if isinstance(v, Buffer):
            return self.namer.get(v)
        if isinstance(v, Node):
            return self.generic(v)
        return f"T.opaque({string_literal(repr(v))})"

    def attr_dict(self, items) -> str:
        return self.value(dict(items))

    # -- buffers, ranges, regions -----------------------------------------------------------

    def shape(self, dims) -> str:
        if len(dims) == 1:
            return f"({self.expr(dims[0])},)"
        return "(" + ", ".join(self.expr(d) for d in dims) + ")"

    def buffer_args(self, buf: Buffer, scope_kw: bool = True) -> str:
        parts = [self.shape(buf.shape), string_literal(buf.dtype)]
        if buf.strides is not None:
            parts.append(f"strides={self.shape(buf.strides)}")
        if buf.scope != "global":
            parts.append(f"scope={string_literal(buf.scope)}")
        if buf.align != 64:
            parts.append(f"align={buf.align}")
        return ", ".join(parts)

    def range_args(self, rmin, extent) -> str:
        form = range_form(rmin, extent)
        if form[0] == "extent":
            return self.expr(form[1])
        if form[0] == "start_stop":
            return f"{self.expr(form[1])}, {self.expr(form[2])}"
        return f"T.min_extent({self.expr(form[1])}, {self.expr(form[2])})"

    def dom(self, iv: IterVar) -> str:
        form = range_form(iv.dom.min, iv.dom.extent)
        if form[0] == "start_stop":
            return f"({self.expr(form[1])}, {self.expr(form[2])})"
        return self.range_args(iv.dom.min, iv.dom.extent)

    def region(self, r: BufferRegion) -> str:
        name = self.namer.get(r.buffer)
        if not r.region:
            return f"{name}[()]"
        parts = []
        for rng in r.region:
            if isinstance(rng.extent, IntImm) and rng.extent.value == 1 \
                    and rng.extent.dtype == rng.min.dtype:
                parts.append(self.expr(rng.min))
                continue
            form = range_form(rng.min, rng.extent)
            if form[0] == "extent":
                parts.append(f"{self.expr(rng.min)}:{self.expr(rng.extent)}")
            elif form[0] == "start_stop":
                parts.append(f"{self.expr(form[1])}:{self.expr(form[2])}")
            else:
                parts.append(f"T.min_extent({self.expr(form[1])}, {self.expr(form[2])})")
        return f"{name}[{', '.join(parts)}]"

    # -- statements -------------------------------------------------------------------------

    def body(self, s):
        """A statement list one level deeper."""
        self.depth += 1
        self.stmt(s, tail=True)
        self.depth -= 1

    def stmt(self, s, tail: bool = True):
        """Print ``s``; ``tail`` says whether it ends its statement list (see the module doc)."""
        if isinstance(s, SeqStmt):
            if not s.seq:
                self.emit("pass")
            for k, c in enumerate(s.seq):
                self.stmt(c, tail and k == len(s.seq) - 1)
        elif isinstance(s, BufferStore):
            self.emit(f"{self.access(s.buffer, s.indices)} = {self.expr(s.value)}")
        elif isinstance(s, Evaluate):
            self.emit(f"T.evaluate({self.expr(s.value)})")
        elif isinstance(s, IfThenElse):
            self._if(s, "if")
        elif isinstance(s, LetStmt):
            value = self.expr(s.value)
            self.namer.push()
            name = self.namer.define(s.var, s.var.name)
            if tail:
                self.emit(f"{name}: T.{s.var.dtype} = {value}")
                self.stmt(s.body, tail=True)
            else:
                self.emit(f"with T.LetStmt({value}) as {name}:")
                self.body(s.body)
            self.namer.pop()
        elif isinstance(s, AssertStmt):
            cond, msg = self.expr(s.condition), string_literal(s.message)
            if tail:
                self.emit(f"assert {cond}, {msg}")
                self.stmt(s.body, tail=True)
            else:
                self.emit(f"with T.Assert({cond}, {msg}):")
                self.body(s.body)
        elif isinstance(s, Allocate):
            self.namer.push()
            args = self.buffer_args(s.buffer)
            name = self.namer.define(s.buffer, s.buffer.name)
            if tail:
                self.emit(f"{name} = T.allocate({args})")
                self.stmt(s.body, tail=True)
            else:
                self.emit(f"with T.allocate({args}) as {name}:")
                self.body(s.body)
            self.namer.pop()
        elif isinstance(s, For):
            self._for(s)
        elif isinstance(s, BlockRealize):
            self.block(s, s.block)
        elif isinstance(s, Block):
            self.block(None, s)
        else:
            self.emit(self.generic(s))

    def _if(self, s: IfThenElse, keyword_: str):
        self.emit(f"{keyword_} {self.expr(s.condition)}:")
        self.namer.push()
        self.body(s.then_case)
        self.namer.pop()
        e = s.else_case
        if e is None:
            return
        if isinstance(e, IfThenElse):
            self._if(e, "elif")
            return
        self.emit("else:")
        self.namer.push()
        self.body(e)
        self.namer.pop()

    @staticmethod
    def _grid_ok(f: For) -> bool:
        return (f.kind == "serial" and f.thread_tag is None and not f.annotations
                and isinstance(f.min, IntImm) and f.min.value == 0 and f.min.dtype == f.extent.dtype
                and f.loop_var.dtype == f.extent.dtype)

    def _for(self, s: For):
        chain = [s]
        if self._grid_ok(s):
            while isinstance(chain[-1].body, For) and self._grid_ok(chain[-1].body):
                nxt = chain[-1].body
                # T.grid evaluates every extent before the loops start
                if used_var_ids(nxt.extent) & {id(c.loop_var) for c in chain}:
                    break
                chain.append(nxt)
        self.namer.push()
        if len(chain) > 1:
            extents = ", ".join(self.expr(c.extent) for c in chain)
            names = ", ".join(self.namer.define(c.loop_var, c.loop_var.name) for c in chain)
            self.emit(f"for {names} in T.grid({extents}):")
        else:
            args = [self.range_args(s.min, s.extent)]
            if s.thread_tag is not None:
                args.append(f"thread={string_literal(s.thread_tag)}")
            if s.annotations:
                args.append(f"annotations={self.attr_dict(s.annotations)}")
            if s.loop_var.dtype != s.extent.dtype:
                args.append(f"dtype={string_literal(s.loop_var.dtype)}")
            fn = FOR_FUNCS[s.kind]
            if s.kind == "serial" and len(args) == 1 and not args[0].startswith("T.min_extent"):
                fn = "range"
            name = self.namer.define(s.loop_var, s.loop_var.name)
            self.emit(f"for {name} in {fn}({', '.join(args)}):")
        self.body(chain[-1].body)
        self.namer.pop()

    def block(self, realize: BlockRealize | None, b: Block):
        self.emit(f"with T.block({string_literal(b.name)}):")
        self.depth += 1
        self.namer.push()
        for k, iv in enumerate(b.iter_vars):
            args = [self.dom(iv)]
            if realize is not None:
                args.append(self.expr(realize.iter_values[k]))
            if iv.var.dtype != iv.dom.extent.dtype:
                args.append(f"dtype={string_literal(iv.var.dtype)}")
            name = self.namer.define(iv.var, iv.var.name)
            self.emit(f"{name} = T.axis.{iv.kind}({', '.join(args)})")
        if realize is not None and not is_true(realize.predicate):
            self.emit(f"T.where({self.expr(realize.predicate)})")
        if b.reads:
            self.emit(f"T.reads({', '.join(self.region(r) for r in b.reads)})")
        if b.writes:
            self.emit(f"T.writes({', '.join(self.region(r) for r in b.writes)})")
        if b.annotations:
            self.emit(f"T.block_attr({self.attr_dict(b.annotations)})")
        for buf in b.alloc_buffers:
            args = self.buffer_args(buf)
            self.emit(f"{self.namer.define(buf, buf.name)} = T.alloc_buffer({args})")
        if b.init is not None:
            self.emit("with T.init():")
            self.body(b.init)
        self.stmt(b.body, tail=True)
        self.namer.pop()
        self.depth -= 1

    # -- functions and modules --------------------------------------------------------------

    def func(self, f: PrimFunc, name: str, decorator_args: str = ""):
        """Print a PrimFunc as ``@T.prim_func def name(...):``."""
        bmap = dict((id(p), b) for p, b in f.buffer_map)
        used = used_var_ids([f.body, f.attrs, list(bmap.values())])
        # a buffer parameter prints in the signature (A: T.Buffer(...)) when its handle is named
        # after it and nothing refers to the handle; else as ``A = T.match_buffer(handle, ...)``
        in_sig = {}
        for p in f.params:
            b = bmap.get(id(p))
            if b is not None:
                in_sig[id(p)] = p.name == b.name + "_handle" and id(p) not in used
        sig = []
        for p in f.params:
            b = bmap.get(id(p))
            if b is not None and in_sig[id(p)]:
                sig.append((self.namer.define(b, b.name), b))
            else:
                sig.append((self.namer.define(p, p.name), p))
        defined = {id(p) for p in f.params} | {id(b) for b in bmap.values()}
        free_vars, free_bufs = collect_free([[b.shape, b.strides] for b in bmap.values()]
                                            + [f.attrs, f.body], defined)
        for v in free_vars:
            self.namer.define(v, v.name)
        matched = [(p, bmap[id(p)]) for p in f.params if id(p) in bmap and not in_sig[id(p)]]
        for _, b in matched:
            self.namer.define(b, b.name)
        for b in free_bufs:
            self.namer.define(b, b.name)

        params = []
        for pname, obj in sig:
            if isinstance(obj, Buffer):
                params.append(f"{pname}: T.Buffer({self.buffer_args(obj)})")
            else:
                params.append(f"{pname}: T.{obj.dtype}")
        self.emit(f"@T.prim_func{decorator_args}")
        self.emit(f"def {name}({', '.join(params)}):")
        self.depth += 1
        if f.attrs:
            self.emit(f"T.func_attr({self.attr_dict(f.attrs)})")
        for v in free_vars:
            self.emit(f"{self.namer.get(v)} = T.{v.dtype}()")
        for p, b in matched:
            self.emit(f"{self.namer.get(b)} = T.match_buffer({self.namer.get(p)}, "
                      f"{self.buffer_args(b)})")
        for b in free_bufs:
            self.emit(f"{self.namer.get(b)} = T.Buffer({self.buffer_args(b)})")
        self.stmt(f.body, tail=True)
        self.depth -= 1

    def module(self, mod: IRModule) -> str:
        """Print an IRModule as ``@I.ir_module class Module:``, functions in insertion order."""
        out = ["@I.ir_module", "class Module:"]
        used: set[str] = set(RESERVED_NAMES)
        chunks = []
        for key, fn in mod.functions.items():
            def_name = unique_name(sanitize(key), used)
            if isinstance(fn, PrimFunc):
                p = _Printer(depth=1)
                extra = "" if def_name == key else f"(name={string_literal(key)})"
                p.func(fn, def_name, extra)
                chunks.append(p.text())
            else:
                # relax (or other) functions print themselves
                text = fn.script() if hasattr(fn, "script") else repr(fn)
                chunks.append("\n".join(INDENT + line if line else line
                                        for line in text.splitlines()))
        if not chunks:
            chunks.append(INDENT + "pass")
        return "\n".join(out) + "\n" + "\n\n".join(chunks)


# node.script() and repr() of TensorIR nodes print through this module
register_printer(to_script)
