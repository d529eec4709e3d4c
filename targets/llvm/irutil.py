"""Small helpers over ``llvmir`` (LLVM IR as text) shared by the LLVM code generator, entries and
runtime."""
from __future__ import annotations

from . import llvmir as ir

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F16 = ir.HalfType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
PTR = ir.PointerType()
VOID = ir.VoidType()


def gep(b: ir.IRBuilder, base, indices, etype):
    """``getelementptr etype, ptr base, indices`` typed as an opaque ``ptr`` (llvmlite would
    otherwise guess a typed pointer and reject later stores)."""
    g = b.gep(base, list(indices), source_etype=etype)
    g.type = PTR
    return g


def int_type(bits: int) -> ir.IntType:
    return ir.IntType(bits)


def is_vector(v) -> bool:
    return isinstance(v.type, ir.VectorType)


def lanes_of(v) -> int:
    return v.type.count if isinstance(v.type, ir.VectorType) else 1


def element_type(ty):
    return ty.element if isinstance(ty, ir.VectorType) else ty


def vec_type(elem, lanes: int):
    return elem if lanes == 1 else ir.VectorType(elem, lanes)


# Vector constants shared by every use: llvmlite builds a Constant per lane and formats all of
# them again for each new object, which made a third of code generation's time. A constant is
# an immutable value (no parent, no name), so one object can stand wherever the same constant
# does; the text printed is the same.
_VECTOR_CONSTANTS: dict[tuple, ir.Constant] = {}
_MAX_SHARED = 8192


def _shared_vector(key: tuple, make) -> ir.Constant:
    c = _VECTOR_CONSTANTS.get(key)
    if c is None:
        if len(_VECTOR_CONSTANTS) >= _MAX_SHARED:
            _VECTOR_CONSTANTS.clear()
        c = _VECTOR_CONSTANTS[key] = make()
    return c


def const(ty, value):
    """A constant of scalar or vector type ``ty`` (vectors get ``value`` in every lane)."""
    if isinstance(ty, ir.VectorType):
        # repr tells 0.0 from -0.0 and 1 from 1.0 and True, which compare (and hash) equal
        return _shared_vector(("const", str(ty), type(value).__name__, repr(value)),
                              lambda: ir.Constant(ty, [ir.Constant(ty.element, value)] * ty.count))
    return ir.Constant(ty, value)


def undef(ty) -> ir.Constant:
    """``undef`` of type ``ty`` (shared for vector types)."""
    if isinstance(ty, ir.VectorType):
        return _shared_vector(("undef", str(ty)), lambda: ir.Constant(ty, ir.Undefined))
    return ir.Constant(ty, ir.Undefined)


def splat(b: ir.IRBuilder, v, lanes: int):
    """Broadcast scalar ``v`` to ``lanes`` lanes (returns vectors unchanged)."""
    if lanes == 1 or is_vector(v):
        return v
    vty = ir.VectorType(v.type, lanes)
    if isinstance(v, ir.Constant):
        return _shared_vector(("splat", str(vty), v.get_reference()),
                              lambda: ir.Constant(vty, [v] * lanes))
    one = b.insert_element(undef(vty), v, I32(0))
    return b.shuffle_vector(one, undef(vty), _shared_vector(
        ("zeros", lanes), lambda: ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)))


def lane_ids(ty, lanes: int):
    """The constant vector <0, 1, ..., lanes-1> of integer type ``ty``."""
    return _shared_vector(("lane_ids", str(ty), lanes), lambda: ir.Constant(
        ir.VectorType(ty, lanes), [ir.Constant(ty, i) for i in range(lanes)]))


def type_suffix(ty) -> str:
    """LLVM's intrinsic name mangling: f32, v8f32, i64, v4i1, p0, v8p0."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{type_suffix(ty.element)}"
    if isinstance(ty, ir.HalfType):
        return "f16"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    if isinstance(ty, ir.PointerType):
        return "p0"
    raise TypeError(f"no intrinsic suffix for {ty}")


class ModuleBuilder:
    """An ``ir.Module`` plus caches of declared functions and string constants."""

    def __init__(self, name: str, triple: str, data_layout: str, pointer_bits: int):
        self.module = ir.Module(name=name)
        self.module.triple = triple
        self.module.data_layout = data_layout
        self.pointer_bits = pointer_bits
        self.intptr = ir.IntType(pointer_bits)
        self._strings: dict[str, ir.GlobalVariable] = {}

    def declare(self, name: str, ret, args, var_arg: bool = False) -> ir.Function:
        """Declare (once) an external function such as ``snprintf`` or ``llvm.exp.f32``."""
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        fn = ir.Function(self.module, ir.FunctionType(ret, list(args), var_arg=var_arg), name)
        if not name.startswith("llvm."):
            fn.attributes.add("nounwind")
        return fn

    def intrinsic(self, base: str, ret, args, overload_types=None) -> ir.Function:
        """``llvm.<base>.<suffixes>``; suffixes from ``overload_types`` (default: ``ret``)."""
        types = overload_types if overload_types is not None else [ret]
        name = "llvm." + base + "".join("." + type_suffix(t) for t in types)
        return self.declare(name, ret, args)

    def cstring(self, text: str) -> ir.GlobalVariable:
        """A private NUL-terminated string constant (cached by content)."""
        g = self._strings.get(text)
        if g is None:
            data = bytearray(text.encode("utf-8")) + b"\0"
            ty = ir.ArrayType(I8, len(data))
            g = ir.GlobalVariable(self.module, ty, name=f".str.{len(self._strings)}")
            g.initializer = ir.Constant(ty, data)
            g.global_constant = True
            g.linkage = "private"
            g.unnamed_addr = True
            self._strings[text] = g
        return g

    def global_var(self, name: str, ty, init=None, linkage: str = "", constant: bool = False,
                   align: int | None = None) -> ir.GlobalVariable:
        g = ir.GlobalVariable(self.module, ty, name=name)
        g.initializer = init if init is not None else ir.Constant(ty, None)
        if linkage:
            g.linkage = linkage
        g.global_constant = constant
        if align:
            g.align = align
        return g


def set_loop_metadata(module: ir.Module, branch, options: list[list]):
    """Attach ``!llvm.loop`` metadata (self-referential loop ID) to a loop's back-edge branch.

    ``options`` are lists such as ``["llvm.loop.vectorize.enable", True]``.
    """
    nodes = []
    for opt in options:
        ops = [ir.MetaDataString(module, opt[0])]
        for v in opt[1:]:
            if isinstance(v, bool):
                ops.append(ir.Constant(I1, int(v)))
            elif isinstance(v, int):
                ops.append(ir.Constant(I32, v))
        nodes.append(module.add_metadata(ops))
    loop_id = module.add_metadata([None] + nodes)
    loop_id.operands = (loop_id,) + tuple(loop_id.operands[1:])
    branch.set_metadata("llvm.loop", loop_id)
