"""LLVM IR as text: the part of ``llvmlite.ir``'s API that tilecraft's code generator uses,
built for speed.

``llvmlite.ir`` builds an object per instruction and per constant lane, uniquifies every
name through a scope and formats the module through generic ``str.format`` machinery; for
ResNet-50's kernels that was about 60 % of LLVM IR generation. This module keeps the same
names and call signatures (``IntType``, ``Constant``, ``Function``, ``IRBuilder.add`` ...), so
the code generator reads as it did, but an instruction's text is formatted once, when it is
built, from types and operand references that are themselves strings computed once. The text
goes to ``llvmlite.binding.parse_assembly`` as before, which checks it (``verify``).

What differs from ``llvmlite.ir``:

* pointers are opaque (``ptr``) everywhere; ``as_pointer()`` keeps the pointee only so that a
  call through a function pointer knows the function's type;
* values are numbered per function (``%".7"``) and named ones are made unique as llvmlite
  does (``%"i"``, ``%"i.1"``); the names in the text may differ from llvmlite's;
* operand types are not checked here (the LLVM verifier checks the parsed module);
* only the instructions, attributes and global forms the code generator uses exist.

Examples
--------
>>> from tilecraft.targets.llvm import llvmir as ir                       # doctest: +SKIP
>>> m = ir.Module("demo")                                                  # doctest: +SKIP
>>> i32 = ir.IntType(32)                                                   # doctest: +SKIP
>>> fn = ir.Function(m, ir.FunctionType(i32, [i32, i32]), "add")          # doctest: +SKIP
>>> b = ir.IRBuilder(fn.append_basic_block("entry"))                       # doctest: +SKIP
>>> b.ret(b.add(*fn.args))                                                 # doctest: +SKIP
>>> "add i32" in str(m)                                                    # doctest: +SKIP
True
"""
from __future__ import annotations

import re
import struct

# ---------------------------------------------------------------------------------------------
# types


class Type:
    """An LLVM type; ``_s`` is its text. Types are equal when their texts are."""

    __slots__ = ("_s",)
    null = "zeroinitializer"

    def __str__(self) -> str:
        return self._s

    def __repr__(self) -> str:
        return f"<llvmir type {self._s}>"

    def __eq__(self, other) -> bool:
        return isinstance(other, Type) and other._s == self._s

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self._s)

    def __call__(self, value) -> "Constant":
        return Constant(self, value)

    def as_pointer(self, addrspace: int = 0) -> "PointerType":
        return PointerType(self)

    def format_constant(self, value) -> str:
        return str(value)


class VoidType(Type):
    __slots__ = ()

    def __init__(self):
        self._s = "void"


class LabelType(Type):
    __slots__ = ()

    def __init__(self):
        self._s = "label"


class MetaDataType(Type):
    __slots__ = ()

    def __init__(self):
        self._s = "metadata"


class IntType(Type):
    __slots__ = ("width", "_constants")
    null = "0"
    _cache: dict = {}

    def __new__(cls, width: int):
        t = cls._cache.get(width)
        if t is None:
            t = object.__new__(cls)
            t.width = width
            t._s = f"i{width}"
            t._constants = {}
            cls._cache[width] = t
        return t

    def __init__(self, width: int):
        pass

    def __call__(self, value) -> "Constant":
        # constants are immutable: one object per plain int value (not bool: True and 1 are
        # equal keys but print differently)
        if type(value) is not int:
            return Constant(self, value)
        c = self._constants.get(value)
        if c is None:
            if len(self._constants) >= 4096:
                self._constants.clear()
            c = self._constants[value] = Constant(self, value)
        return c

    def __getnewargs__(self):
        return (self.width,)

    def format_constant(self, value) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(int(value))


def _hex_double(value: float) -> str:
    return "0x%016x" % struct.unpack("Q", struct.pack("d", value))[0]


class HalfType(Type):
    __slots__ = ()
    null = "0.0"

    def __init__(self):
        self._s = "half"

    def format_constant(self, value) -> str:
        return _hex_double(struct.unpack("e", struct.pack("e", float(value)))[0])


class FloatType(Type):
    __slots__ = ()
    null = "0.0"

    def __init__(self):
        self._s = "float"

    def format_constant(self, value) -> str:
        return _hex_double(struct.unpack("f", struct.pack("f", float(value)))[0])


class DoubleType(Type):
    __slots__ = ()
    null = "0.0"

    def __init__(self):
        self._s = "double"

    def format_constant(self, value) -> str:
        return _hex_double(float(value))


class PointerType(Type):
    """``ptr``; ``pointee`` is kept (when known) for calls through a function pointer."""

    __slots__ = ("pointee",)
    null = "null"

    def __init__(self, pointee: Type | None = None, addrspace: int = 0):
        if addrspace:
            raise ValueError("llvmir: only address space 0 is supported")
        self._s = "ptr"
        self.pointee = pointee

    @property
    def is_opaque(self) -> bool:
        return self.pointee is None


class VectorType(Type):
    __slots__ = ("element", "count")
    _cache: dict = {}

    def __new__(cls, element: Type, count: int):
        key = (element._s, count)
        t = cls._cache.get(key)
        if t is None:
            t = object.__new__(cls)
            t.element, t.count = element, count
            t._s = f"<{count} x {element._s}>"
            cls._cache[key] = t
        return t

    def __init__(self, element: Type, count: int):
        pass

    def __getnewargs__(self):
        return (self.element, self.count)

    def __len__(self) -> int:
        return self.count

    def format_constant(self, values) -> str:
        return "<" + ", ".join(f"{v.type._s} {v.ref}" for v in values) + ">"


class ArrayType(Type):
    __slots__ = ("element", "count")

    def __init__(self, element: Type, count: int):
        self.element, self.count = element, count
        self._s = f"[{count} x {element._s}]"

    def __len__(self) -> int:
        return self.count

    def format_constant(self, values) -> str:
        return "[" + ", ".join(f"{v.type._s} {v.ref}" for v in values) + "]"


class LiteralStructType(Type):
    __slots__ = ("elements",)

    def __init__(self, elements, packed: bool = False):
        if packed:
            raise ValueError("llvmir: packed structs are not supported")
        self.elements = tuple(elements)
        self._s = "{" + ", ".join(e._s for e in self.elements) + "}"

    def __len__(self) -> int:
        return len(self.elements)

    def format_constant(self, values) -> str:
        return "{" + ", ".join(f"{v.type._s} {v.ref}" for v in values) + "}"


class FunctionType(Type):
    __slots__ = ("return_type", "args", "var_arg")

    def __init__(self, return_type: Type, args, var_arg: bool = False):
        self.return_type, self.args, self.var_arg = return_type, tuple(args), var_arg
        inner = ", ".join(a._s for a in self.args)
        if var_arg:
            inner = inner + ", ..." if inner else "..."
        self._s = f"{return_type._s} ({inner})"


_VOID = VoidType()
_LABEL = LabelType()
_I1 = IntType(1)
_PTR = PointerType()

# ---------------------------------------------------------------------------------------------
# values


class _Undefined:
    """The ``undef`` marker (``Constant(ty, Undefined)``)."""

    def __repr__(self) -> str:
        return "Undefined"


Undefined = _Undefined()


class Value:
    """A value: its type and its reference text (``%"x"``, ``@"f"``, ``42``)."""

    __slots__ = ("type", "ref")

    def get_reference(self) -> str:
        return self.ref

    def __str__(self) -> str:
        return f"{self.type._s} {self.ref}"


def _escape_bytes(data: bytes) -> str:
    return "".join(_BYTE_TEXT[c] for c in data)


_PRINTABLE = set(range(0x20, 0x7f)) - {ord('"'), ord("\\")}
_BYTE_TEXT = [chr(c) if c in _PRINTABLE else "\\%02x" % c for c in range(256)]


class Constant(Value):
    """A constant of type ``typ``: a Python number, ``None`` (zero), ``Undefined``, a
    ``bytearray`` (an ``[n x i8]`` string) or, for aggregates, one value per element (or one
    value for every lane of a vector)."""

    __slots__ = ("constant",)

    def __init__(self, typ: Type, constant):
        self.type = typ
        if constant is None:
            ref = typ.null
        elif constant is Undefined:
            ref = "undef"
        elif isinstance(constant, bytearray):
            ref = f'c"{_escape_bytes(constant)}"'
        elif isinstance(typ, (VectorType, ArrayType)):
            if not isinstance(constant, (list, tuple)):
                one = constant if isinstance(constant, Value) else Constant(typ.element, constant)
                constant = (one,) * typ.count
            else:
                if len(constant) != typ.count:
                    raise ValueError(f"wrong constant size for {typ._s}: got {len(constant)} "
                                     f"elements")
                constant = [c if isinstance(c, Value) else Constant(typ.element, c)
                            for c in constant]
            ref = typ.format_constant(constant)
        elif isinstance(typ, LiteralStructType):
            constant = [c if isinstance(c, Value) else Constant(t, c)
                        for t, c in zip(typ.elements, constant)]
            ref = typ.format_constant(constant)
        else:
            ref = typ.format_constant(constant)
        self.constant = constant
        self.ref = ref

    def __eq__(self, other) -> bool:
        return isinstance(other, Constant) and str(self) == str(other)

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __repr__(self) -> str:
        return f"<llvmir.Constant {self.type._s} {self.ref}>"


def _quote(prefix: str, name: str) -> str:
    if "\\" in name or '"' in name:
        name = name.replace("\\", "\\5c").replace('"', "\\22")
    return f'{prefix}"{name}"'


class _Scope:
    """The names used in one function (values and blocks share LLVM's local namespace).

    Unnamed values are ``.1``, ``.2``, ...; a given name is used as it is the first time and
    gets ``.1``, ``.2``, ... appended after (a name of the unnamed form gets a suffix too, so
    it never clashes with one of those).
    """

    __slots__ = ("used", "counter", "suffix")

    def __init__(self):
        self.used: set[str] = set()
        self.counter = 0
        self.suffix: dict[str, int] = {}   # name -> the last suffix given to it

    def unnamed(self) -> str:
        self.counter += 1
        return f".{self.counter}"

    def register(self, name: str) -> str:
        if not name:
            return self.unnamed()
        used = self.used
        if name in used or (name[0] == "." and name[1:].isdigit()):
            base = name
            k = self.suffix.get(base, 0)
            while True:
                k += 1
                name = f"{base}.{k}"
                if name not in used:
                    break
            self.suffix[base] = k
        used.add(name)
        return name


class _HasMetadata:
    __slots__ = ()

    def set_metadata(self, name: str, node: "MDValue") -> None:
        md = self.metadata
        if md is None:
            self.metadata = md = {}
        md[name] = node

    def _md_text(self) -> str:
        md = self.metadata
        if not md:
            return ""
        return "".join(f", !{k} {v.ref}" for k, v in md.items())


class Instruction(_HasMetadata, Value):
    """One instruction: ``text`` is what follows ``%name = `` (all of it for a void one)."""

    __slots__ = ("text", "metadata", "parent")

    def __init__(self, typ: Type, ref: str | None, text: str, parent: "Block"):
        self.type = typ
        self.ref = ref
        self.text = text
        self.metadata = None
        self.parent = parent

    @property
    def function(self) -> "Function":
        return self.parent.function

    @property
    def module(self) -> "Module":
        return self.parent.function.module

    def line(self) -> str:
        body = self.body()
        md = self._md_text() if self.metadata else ""
        if self.ref is None:
            return f"  {body}{md}\n"
        return f"  {self.ref} = {body}{md}\n"

    def body(self) -> str:
        return self.text

    def set_weights(self, weights) -> None:
        """Branch weights (``!prof``) of a conditional branch."""
        m = self.module
        ops = [MetaDataString(m, "branch_weights")]
        for w in weights:
            if w < 0:
                raise ValueError("branch weight must be a positive integer")
            ops.append(Constant(IntType(32), w))
        self.set_metadata("prof", m.add_metadata(ops))


class AllocaInstr(Instruction):
    __slots__ = ("align",)

    def body(self) -> str:
        return self.text if self.align is None else f"{self.text}, align {self.align}"


class PhiInstr(Instruction):
    __slots__ = ("incomings",)

    def add_incoming(self, value: Value, block: "Block") -> None:
        self.incomings.append((value, block))

    def body(self) -> str:
        inc = ", ".join(f"[{v.ref}, {b.ref}]" for v, b in self.incomings)
        return f"{self.text} {inc}"


class Argument(Value):
    """A function argument; its name may be set after the function is made."""

    __slots__ = ("function", "_name", "attributes")

    def __init__(self, function: "Function", typ: Type, name: str):
        self.function = function
        self.type = typ
        self.attributes: list[str] = []
        self._name = ""
        self.name = name

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        scope = self.function.scope
        scope.used.discard(self._name)
        self._name = scope.register(name)
        self.ref = _quote("%", self._name)

    def add_attribute(self, attr: str) -> None:
        if attr not in self.attributes:
            self.attributes.append(attr)

    def __str__(self) -> str:
        attrs = "".join(a + " " for a in self.attributes)
        return f"{self.type._s} {attrs}{self.ref}"


class Block(Value):
    """A basic block: its label and its instructions, in order."""

    __slots__ = ("function", "name", "instructions", "terminator")

    def __init__(self, function: "Function", name: str):
        self.function = function
        self.type = _LABEL
        self.name = function.scope.register(name)
        self.ref = _quote("%", self.name)
        self.instructions: list[Instruction] = []
        self.terminator: Instruction | None = None

    @property
    def is_terminated(self) -> bool:
        return self.terminator is not None

    @property
    def module(self) -> "Module":
        return self.function.module

    def lines(self, out: list) -> None:
        name = self.name
        out.append(f"{name}:\n" if _SIMPLE_LABEL(name) else f"{self.ref[1:]}:\n")
        for i in self.instructions:
            # the common case inline: a plain instruction without metadata
            if type(i) is Instruction and i.metadata is None:
                out.append(f"  {i.ref} = {i.text}\n" if i.ref is not None else f"  {i.text}\n")
            else:
                out.append(i.line())


# a label printed without quotes (LLVM's identifier syntax); others are quoted
_SIMPLE_LABEL = re.compile(r"[-a-zA-Z$._][-a-zA-Z$._0-9]*\Z").match


class AttributeSet(list):
    """Attributes printed in the order added (``add`` ignores repeats)."""

    def add(self, attr: str) -> None:
        if attr not in self:
            self.append(attr)


class GlobalValue(Value):
    __slots__ = ("module", "name", "linkage", "storage_class", "metadata")

    def _init_global(self, module: "Module", typ: Type, name: str):
        self.module = module
        self.type = typ
        self.name = name
        self.ref = _quote("@", name)
        self.linkage = ""
        self.storage_class = ""
        self.metadata = None
        module._add_global(self)


class GlobalVariable(GlobalValue):
    __slots__ = ("value_type", "initializer", "unnamed_addr", "global_constant", "align",
                 "section")

    def __init__(self, module: "Module", typ: Type, name: str, addrspace: int = 0):
        if addrspace:
            raise ValueError("llvmir: only address space 0 is supported")
        self._init_global(module, PointerType(typ), name)
        self.value_type = typ
        self.initializer = None
        self.unnamed_addr = False
        self.global_constant = False
        self.align = None
        self.section = ""

    def lines(self, out: list) -> None:
        linkage = self.linkage or ("external" if self.initializer is None else "")
        parts = [self.ref, "="]
        if linkage:
            parts.append(linkage)
        if self.storage_class:
            parts.append(self.storage_class)
        if self.unnamed_addr:
            parts.append("unnamed_addr")
        parts.append("constant" if self.global_constant else "global")
        parts.append(self.value_type._s)
        if self.initializer is not None:
            parts.append(self.initializer.ref)
        elif linkage not in ("external", "extern_weak"):
            parts.append("undef")
        text = " ".join(parts)
        if self.section:
            text += f', section "{self.section}"'
        if self.align is not None:
            text += f", align {self.align}"
        out.append(text + "\n")


class Function(GlobalValue):
    """A function; ``blocks`` empty makes it a declaration."""

    __slots__ = ("function_type", "ftype", "args", "blocks", "attributes", "scope",
                 "calling_convention", "section", "visibility")

    def __init__(self, module: "Module", ftype: FunctionType, name: str):
        self._init_global(module, PointerType(ftype), name)
        self.function_type = self.ftype = ftype
        self.scope = _Scope()
        self.args = tuple(Argument(self, t, "") for t in ftype.args)
        self.blocks: list[Block] = []
        self.attributes = AttributeSet()
        self.calling_convention = ""
        self.section = ""
        # kept and not printed, as llvmlite.ir does: the thread-pool runtime sets it, and
        # printing it would change the symbols' visibility in the objects built so far
        self.visibility = ""

    @property
    def return_value(self) -> Type:
        return self.ftype.return_type

    @property
    def is_declaration(self) -> bool:
        return not self.blocks

    def append_basic_block(self, name: str = "") -> Block:
        blk = Block(self, name)
        self.blocks.append(blk)
        return blk

    def lines(self, out: list) -> None:
        state = "define" if self.blocks else "declare"
        args = ", ".join(str(a) for a in self.args)
        if self.ftype.var_arg:
            args = args + ", ..." if args else "..."
        prefix = " ".join(x for x in (state, self.linkage, self.calling_convention,
                                      self.ftype.return_type._s) if x)
        attrs = "".join(" " + a for a in self.attributes)
        section = f' section "{self.section}"' if self.section else ""
        out.append(f"{prefix} {self.ref}({args}){attrs}{section}\n")
        if self.blocks:
            out.append("{\n")
            for blk in self.blocks:
                blk.lines(out)
            out.append("}\n")
        out.append("\n")


class MetaDataString(Value):
    """A metadata string ``!"text"``."""

    __slots__ = ("string",)

    def __init__(self, module: "Module", string: str):
        self.type = _METADATA
        self.string = string
        ref = _MD_STRINGS.get(string)
        if ref is None:
            if len(_MD_STRINGS) >= 4096:
                _MD_STRINGS.clear()
            ref = _MD_STRINGS[string] = f'!"{_escape_bytes(string.encode("utf-8"))}"'
        self.ref = ref

    def __eq__(self, other) -> bool:
        return isinstance(other, MetaDataString) and other.string == self.string

    def __hash__(self) -> int:
        return hash(("mdstring", self.string))


_METADATA = MetaDataType()
_MD_STRINGS: dict[str, str] = {}   # string -> its escaped text (branch weights recur a lot)


class MDValue(Value):
    """An unnamed metadata node ``!N = !{ ... }`` (``Module.add_metadata``)."""

    __slots__ = ("operands", "index")

    def __init__(self, operands, index: int):
        self.type = _METADATA
        self.operands = tuple(operands)
        self.index = index
        self.ref = f"!{index}"

    def text(self) -> str:
        ops = []
        for op in self.operands:
            if op is None:
                ops.append("null")
            elif isinstance(op.type, MetaDataType):
                ops.append(op.ref)
            else:
                ops.append(f"{op.type._s} {op.ref}")
        return f"{self.ref} = !{{ {', '.join(ops)} }}\n"


def _md_key(op):
    """A metadata operand as a dictionary key: equal when its text is (a node by identity)."""
    if op is None:
        return None
    if isinstance(op, MDValue):
        return ("node", op.index)
    return ("value", op.type._s, op.ref)


class Module:
    """A module: globals and functions in the order added, then the metadata nodes."""

    def __init__(self, name: str = ""):
        self.name = name
        self.triple = ""
        self.data_layout = ""
        self.globals: dict[str, GlobalValue] = {}
        self.metadata: list[MDValue] = []
        self._metadata_cache: dict = {}

    def _add_global(self, g: GlobalValue) -> None:
        if g.name in self.globals:
            raise KeyError(f"duplicate global name {g.name!r}")
        self.globals[g.name] = g

    def get_global(self, name: str):
        return self.globals[name]

    def add_metadata(self, operands) -> MDValue:
        """The metadata node of ``operands`` (values, nodes or None); the same node for the
        same operands, as llvmlite does."""
        if not isinstance(operands, (list, tuple)):
            raise TypeError(f"expected a list or tuple of metadata values, got {operands!r}")
        key = tuple(_md_key(op) for op in operands)
        md = self._metadata_cache.get(key)
        if md is None:
            md = MDValue(operands, len(self.metadata))
            self.metadata.append(md)
            self._metadata_cache[key] = md
        return md

    def __str__(self) -> str:
        out = [f'; ModuleID = "{self.name}"\n']
        out.append(f'target triple = "{self.triple}"\n')
        out.append(f'target datalayout = "{self.data_layout}"\n\n')
        for g in self.globals.values():
            g.lines(out)
        for md in self.metadata:
            out.append(md.text())
        return "".join(out)

    __repr__ = __str__


# ---------------------------------------------------------------------------------------------
# the builder

_ICMP = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
_ICMP_SIGNED = {k: ("s" + v if v not in ("eq", "ne") else v) for k, v in _ICMP.items()}
_ICMP_UNSIGNED = {k: ("u" + v if v not in ("eq", "ne") else v) for k, v in _ICMP.items()}


def _bool_type(like: Type) -> Type:
    if isinstance(like, VectorType):
        return VectorType(_I1, like.count)
    return _I1


class IRBuilder:
    """Appends instructions at the end of a block (``position_at_end``)."""

    __slots__ = ("block", "_insts", "_scope")

    def __init__(self, block: Block | None = None):
        self.block = None
        if block is not None:
            self.position_at_end(block)

    @property
    def function(self) -> Function:
        return self.block.function

    @property
    def module(self) -> Module:
        return self.block.function.module

    def position_at_end(self, block: Block) -> None:
        self.block = block
        self._insts = block.instructions
        self._scope = block.function.scope

    # -- emission helpers -----------------------------------------------------------------------
    def _named(self, typ: Type, text: str, name: str) -> Instruction:
        scope = self._scope
        if name:
            ref = _quote("%", scope.register(name))
        else:                          # scope.unnamed(), inline: most values have no name
            scope.counter += 1
            ref = f'%".{scope.counter}"'
        ins = Instruction(typ, ref, text, self.block)
        self._insts.append(ins)
        return ins

    def _void(self, text: str) -> Instruction:
        ins = Instruction(_VOID, None, text, self.block)
        self._insts.append(ins)
        return ins

    def _terminate(self, text: str) -> Instruction:
        ins = self._void(text)
        self.block.terminator = ins
        return ins

    def _binop(self, op: str, lhs: Value, rhs: Value, name: str, flags) -> Instruction:
        if flags:
            op = op + " " + " ".join(flags)
        return self._named(lhs.type, f"{op} {lhs.type._s} {lhs.ref}, {rhs.ref}", name)

    # -- arithmetic -----------------------------------------------------------------------------
    def add(self, lhs, rhs, name="", flags=()):
        return self._binop("add", lhs, rhs, name, flags)

    def sub(self, lhs, rhs, name="", flags=()):
        return self._binop("sub", lhs, rhs, name, flags)

    def mul(self, lhs, rhs, name="", flags=()):
        return self._binop("mul", lhs, rhs, name, flags)

    def sdiv(self, lhs, rhs, name="", flags=()):
        return self._binop("sdiv", lhs, rhs, name, flags)

    def udiv(self, lhs, rhs, name="", flags=()):
        return self._binop("udiv", lhs, rhs, name, flags)

    def srem(self, lhs, rhs, name="", flags=()):
        return self._binop("srem", lhs, rhs, name, flags)

    def urem(self, lhs, rhs, name="", flags=()):
        return self._binop("urem", lhs, rhs, name, flags)

    def fadd(self, lhs, rhs, name="", flags=()):
        return self._binop("fadd", lhs, rhs, name, flags)

    def fsub(self, lhs, rhs, name="", flags=()):
        return self._binop("fsub", lhs, rhs, name, flags)

    def fmul(self, lhs, rhs, name="", flags=()):
        return self._binop("fmul", lhs, rhs, name, flags)

    def fdiv(self, lhs, rhs, name="", flags=()):
        return self._binop("fdiv", lhs, rhs, name, flags)

    def frem(self, lhs, rhs, name="", flags=()):
        return self._binop("frem", lhs, rhs, name, flags)

    def shl(self, lhs, rhs, name="", flags=()):
        return self._binop("shl", lhs, rhs, name, flags)

    def lshr(self, lhs, rhs, name="", flags=()):
        return self._binop("lshr", lhs, rhs, name, flags)

    def ashr(self, lhs, rhs, name="", flags=()):
        return self._binop("ashr", lhs, rhs, name, flags)

    def and_(self, lhs, rhs, name="", flags=()):
        return self._binop("and", lhs, rhs, name, flags)

    def or_(self, lhs, rhs, name="", flags=()):
        return self._binop("or", lhs, rhs, name, flags)

    def xor(self, lhs, rhs, name="", flags=()):
        return self._binop("xor", lhs, rhs, name, flags)

    def neg(self, value, name=""):
        return self.sub(Constant(value.type, 0), value, name=name)

    def not_(self, value, name=""):
        return self.xor(value, Constant(value.type, -1), name=name)

    def fneg(self, value, name="", flags=()):
        op = "fneg" + "".join(" " + f for f in flags)
        return self._named(value.type, f"{op} {value.type._s} {value.ref}", name)

    # -- comparisons and select -----------------------------------------------------------------
    def icmp_signed(self, cmpop, lhs, rhs, name=""):
        return self._named(_bool_type(lhs.type),
                           f"icmp {_ICMP_SIGNED[cmpop]} {lhs.type._s} {lhs.ref}, {rhs.ref}",
                           name)

    def icmp_unsigned(self, cmpop, lhs, rhs, name=""):
        return self._named(_bool_type(lhs.type),
                           f"icmp {_ICMP_UNSIGNED[cmpop]} {lhs.type._s} {lhs.ref}, {rhs.ref}",
                           name)

    def _fcmp(self, prefix, cmpop, lhs, rhs, name, flags):
        op = prefix + _ICMP[cmpop] if cmpop in _ICMP else cmpop
        fl = "".join(" " + f for f in flags)
        return self._named(_bool_type(lhs.type),
                           f"fcmp{fl} {op} {lhs.type._s} {lhs.ref}, {rhs.ref}", name)

    def fcmp_ordered(self, cmpop, lhs, rhs, name="", flags=()):
        return self._fcmp("o", cmpop, lhs, rhs, name, flags)

    def fcmp_unordered(self, cmpop, lhs, rhs, name="", flags=()):
        return self._fcmp("u", cmpop, lhs, rhs, name, flags)

    def select(self, cond, lhs, rhs, name="", flags=()):
        fl = "".join(" " + f for f in flags)
        return self._named(lhs.type, f"select{fl} {cond.type._s} {cond.ref}, {lhs.type._s} "
                                     f"{lhs.ref}, {rhs.type._s} {rhs.ref}", name)

    # -- casts ----------------------------------------------------------------------------------
    def _cast(self, op, value, typ, name):
        return self._named(typ, f"{op} {value.type._s} {value.ref} to {typ._s}", name)

    def trunc(self, value, typ, name=""):
        return self._cast("trunc", value, typ, name)

    def zext(self, value, typ, name=""):
        return self._cast("zext", value, typ, name)

    def sext(self, value, typ, name=""):
        return self._cast("sext", value, typ, name)

    def fptrunc(self, value, typ, name=""):
        return self._cast("fptrunc", value, typ, name)

    def fpext(self, value, typ, name=""):
        return self._cast("fpext", value, typ, name)

    def bitcast(self, value, typ, name=""):
        return self._cast("bitcast", value, typ, name)

    def fptoui(self, value, typ, name=""):
        return self._cast("fptoui", value, typ, name)

    def uitofp(self, value, typ, name=""):
        return self._cast("uitofp", value, typ, name)

    def fptosi(self, value, typ, name=""):
        return self._cast("fptosi", value, typ, name)

    def sitofp(self, value, typ, name=""):
        return self._cast("sitofp", value, typ, name)

    def ptrtoint(self, value, typ, name=""):
        return self._cast("ptrtoint", value, typ, name)

    def inttoptr(self, value, typ, name=""):
        return self._cast("inttoptr", value, typ, name)

    # -- memory ---------------------------------------------------------------------------------
    def alloca(self, typ, size=None, name=""):
        text = f"alloca {typ._s}" if size is None else \
            f"alloca {typ._s}, {size.type._s} {size.ref}"
        scope = self._scope
        ref = _quote("%", scope.register(name)) if name else f'%"{scope.unnamed()}"'
        ins = AllocaInstr(PointerType(typ), ref, text, self.block)
        ins.align = None
        self._insts.append(ins)
        return ins

    def load(self, ptr, name="", align=None, typ=None):
        if typ is None:
            typ = ptr.type.pointee
            if typ is None:
                raise TypeError("load from an opaque pointer needs typ=")
        text = f"load {typ._s}, ptr {ptr.ref}"
        if align:
            text += f", align {align}"
        return self._named(typ, text, name)

    def store(self, value, ptr, align=None):
        text = f"store {value.type._s} {value.ref}, ptr {ptr.ref}"
        if align:
            text += f", align {align}"
        return self._void(text)

    def load_atomic(self, ptr, ordering, align, name="", typ=None):
        typ = typ if typ is not None else ptr.type.pointee
        return self._named(typ, f"load atomic {typ._s}, ptr {ptr.ref} {ordering}, align {align}",
                           name)

    def store_atomic(self, value, ptr, ordering, align):
        return self._void(f"store atomic {value.type._s} {value.ref}, ptr {ptr.ref} {ordering}, "
                          f"align {align}")

    def gep(self, ptr, indices, inbounds=False, name="", source_etype=None):
        if source_etype is None:
            source_etype = ptr.value_type if isinstance(ptr, GlobalVariable) else \
                ptr.type.pointee
            if source_etype is None:
                raise TypeError("getelementptr on an opaque pointer needs source_etype=")
        idx = "".join(f", {i.type._s} {i.ref}" for i in indices)
        ib = "inbounds " if inbounds else ""
        pty = ptr.type
        lanes = pty.count if isinstance(pty, VectorType) else 0
        for i in indices:
            if isinstance(i.type, VectorType):
                lanes = i.type.count
        rtype = VectorType(_PTR, lanes) if lanes else _PTR
        return self._named(rtype, f"getelementptr {ib}{source_etype._s}, {pty._s} {ptr.ref}{idx}",
                           name)

    def fence(self, ordering):
        return self._void(f"fence {ordering}")

    def cmpxchg(self, ptr, cmp, val, ordering, failordering=None, name=""):
        failordering = failordering or ordering
        ty = LiteralStructType([val.type, _I1])
        return self._named(ty, f"cmpxchg ptr {ptr.ref}, {cmp.type._s} {cmp.ref}, {val.type._s} "
                               f"{val.ref} {ordering} {failordering}", name)

    def atomic_rmw(self, op, ptr, val, ordering, name=""):
        return self._named(val.type, f"atomicrmw {op} ptr {ptr.ref}, {val.type._s} {val.ref} "
                                     f"{ordering}", name)

    # -- vectors and aggregates -----------------------------------------------------------------
    def extract_element(self, vector, idx, name=""):
        return self._named(vector.type.element, f"extractelement {vector.type._s} {vector.ref}, "
                                                f"{idx.type._s} {idx.ref}", name)

    def insert_element(self, vector, value, idx, name=""):
        return self._named(vector.type, f"insertelement {vector.type._s} {vector.ref}, "
                                        f"{value.type._s} {value.ref}, {idx.type._s} {idx.ref}",
                           name)

    def shuffle_vector(self, vector1, vector2, mask, name=""):
        ty = VectorType(vector1.type.element, mask.type.count)
        return self._named(ty, f"shufflevector {vector1.type._s} {vector1.ref}, "
                               f"{vector2.type._s} {vector2.ref}, {mask.type._s} {mask.ref}",
                           name)

    def extract_value(self, agg, idx, name=""):
        idxs = idx if isinstance(idx, (list, tuple)) else [idx]
        ty = agg.type
        for i in idxs:
            ty = ty.elements[i] if isinstance(ty, LiteralStructType) else ty.element
        return self._named(ty, f"extractvalue {agg.type._s} {agg.ref}, "
                               f"{', '.join(str(i) for i in idxs)}", name)

    def insert_value(self, agg, value, idx, name=""):
        idxs = idx if isinstance(idx, (list, tuple)) else [idx]
        return self._named(agg.type, f"insertvalue {agg.type._s} {agg.ref}, {value.type._s} "
                                     f"{value.ref}, {', '.join(str(i) for i in idxs)}", name)

    # -- control flow ---------------------------------------------------------------------------
    def phi(self, typ, name="", flags=()):
        scope = self._scope
        ref = _quote("%", scope.register(name)) if name else f'%"{scope.unnamed()}"'
        fl = "".join(" " + f for f in flags)
        ins = PhiInstr(typ, ref, f"phi{fl} {typ._s}", self.block)
        ins.incomings = []
        self._insts.append(ins)
        return ins

    def call(self, fn, args, name="", cconv=None, tail=False, fastmath=(), attrs=()):
        if isinstance(fn, Function):
            fty = fn.ftype
        else:
            fty = fn.type.pointee
            if not isinstance(fty, FunctionType):
                raise TypeError("call through a pointer needs a pointer from "
                                "FunctionType.as_pointer()")
        shown = fty._s if fty.var_arg else fty.return_type._s
        args_text = ", ".join(f"{a.type._s} {a.ref}" for a in args)
        parts = []
        if tail:
            parts.append(tail if isinstance(tail, str) else "tail")
        parts.append("call")
        parts.extend(fastmath)
        if cconv:
            parts.append(cconv)
        text = f"{' '.join(parts)} {shown} {fn.ref}({args_text})"
        if attrs:
            text += "".join(" " + a for a in ([attrs] if isinstance(attrs, str) else attrs))
        if isinstance(fty.return_type, VoidType):
            return self._void(text)
        return self._named(fty.return_type, text, name)

    def branch(self, target):
        return self._terminate(f"br label {target.ref}")

    def cbranch(self, cond, truebr, falsebr):
        return self._terminate(f"br i1 {cond.ref}, label {truebr.ref}, label {falsebr.ref}")

    def ret(self, value):
        return self._terminate(f"ret {value.type._s} {value.ref}")

    def ret_void(self):
        return self._terminate("ret void")

    def unreachable(self):
        return self._terminate("unreachable")
