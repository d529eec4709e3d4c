"""The exported entry of each kernel: unpack the packed arguments and check them.

``int32_t tilecraft_fn_<name>(TCValue *args, int32_t *type_codes, int32_t num_args)`` checks, in
order: the argument count; each argument's kind (tensor / int / float); for tensors a non-NULL
``DLTensor``, its rank, dtype, device and data pointer; then it binds every shape dimension that
is a plain variable from the first tensor where it appears (after scalar parameters, which bind
first) and checks every other dimension (``n * 2``, constants) against the bound values; then
strides (NULL, or compact row-major). Any failure writes a message for
``tilecraft_get_last_error()`` and returns -1; the kernel itself never sees a bad argument.

The entry is ``optnone`` (compiled as at ``-O0``) and calls the kernel's body, which is
optimized at the target's level: a few compares a call cost less than optimizing them in
every kernel.
"""
from __future__ import annotations

from . import llvmir as ir

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import (Add, Cast, FloorDiv, FloorMod, IntImm, Max, Min, Mul, Sub, Var, Div,
                           Mod)

from ..runtime import abi
from .irutil import F64, I8, I16, I32, I64, PTR


def fmt_escape(text: str) -> str:
    """Make ``text`` safe inside a printf format."""
    return text.replace("%", "%%")


def expr_str(e) -> str:
    """A short readable form of a shape expression, for messages and metadata."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, IntImm):
        return str(e.value)
    if isinstance(e, Cast):
        return expr_str(e.value)

    def wrap(x):
        s = expr_str(x)
        return s if isinstance(x, (Var, IntImm, Cast, Min, Max)) else f"({s})"

    if isinstance(e, Add):
        return f"{expr_str(e.a)} + {expr_str(e.b)}"
    if isinstance(e, Sub):
        return f"{expr_str(e.a)} - {wrap(e.b)}"
    ops = {Mul: "*", FloorDiv: "//", FloorMod: "%", Div: "/", Mod: "truncmod"}
    for cls, sym in ops.items():
        if isinstance(e, cls):
            return f"{wrap(e.a)} {sym} {wrap(e.b)}"
    if isinstance(e, (Min, Max)):
        return f"{type(e).__name__.lower()}({expr_str(e.a)}, {expr_str(e.b)})"
    return type(e).__name__


class EntryEmitter:
    """Mixin of ``CodeGenLLVM`` that emits the checking entry of each function."""

    def emit_entry(self, name, symbol, func, bparams, sparams, bound, compute):
        fn = ir.Function(self.module, ir.FunctionType(I32, [PTR, PTR, I32]), symbol)
        fn.attributes.add("nounwind")
        # not optimized: the checks are a chain of compares run once a call, and LLVM's -O3 over
        # them (with their error paths) was a third of the optimization and code generation of
        # ResNet-50's kernels; the kernel itself (``compute``) is optimized as before
        fn.attributes.add("noinline")
        fn.attributes.add("optnone")
        args, codes, nargs = fn.args
        args.name, codes.name, nargs.name = "args", "type_codes", "num_args"
        self.ctx = self._make_ctx(fn, name)
        b = self.b
        b.store(I32(0), self.error_claimed)  # a new call: the next failure writes its message
        off = abi.dltensor_offsets(self.mb.pointer_bits)
        qname = fmt_escape(name)
        names = ", ".join(fmt_escape(p.name) for p in sorted(bparams + sparams,
                                                              key=lambda p: p.index))
        n = len(func.params)
        self._check(b.icmp_signed("==", nargs, I32(n)),
                    f"{qname}: expected {n} argument(s) ({names}), got %d", [nargs])

        def field(ptr, key, ty):
            return b.load(b.gep(ptr, [I32(off[key])], source_etype=I8), typ=ty)

        tensors = {}
        for p in sorted(bparams + sparams, key=lambda p: p.index):
            i = p.index
            pname = fmt_escape(p.name)
            code = b.load(b.gep(codes, [I32(i)], source_etype=I32), typ=I32)
            slot = b.gep(args, [I32(8 * i)], source_etype=I8)
            if p in bparams:
                self._check(b.icmp_signed("==", code, I32(abi.TYPE_DLTENSOR)),
                            f"{qname}: argument {pname} (#{i}) must be a tensor (type code "
                            f"{abi.TYPE_DLTENSOR}), got type code %d", [code])
                dl = b.load(slot, typ=PTR)
                self._check(b.icmp_unsigned("!=", dl, ir.Constant(PTR, None)),
                            f"{qname}: argument {pname} is a NULL DLTensor pointer")
                rank = len(p.orig.shape)
                ndim = field(dl, "ndim", I32)
                self._check(b.icmp_signed("==", ndim, I32(rank)),
                            f"{qname}: argument {pname} must have {rank} dimension(s), got %d",
                            [ndim])
                want_code, want_bits, _ = abi.dl_dtype(p.orig.dtype)
                tcode, tbits, tlanes = (field(dl, "dtype_code", I8), field(dl, "dtype_bits", I8),
                                        field(dl, "dtype_lanes", I16))
                ok = b.and_(b.and_(b.icmp_unsigned("==", tcode, I8(want_code)),
                                   b.icmp_unsigned("==", tbits, I8(want_bits))),
                            b.icmp_unsigned("==", tlanes, I16(1)))
                self._check(ok, f"{qname}: argument {pname} must have dtype {p.orig.dtype} "
                                f"(DLPack code {want_code}, {want_bits} bits, 1 lane), got code %d, "
                                f"%d bits, %d lane(s)",
                            [b.zext(tcode, I32), b.zext(tbits, I32), b.zext(tlanes, I32)])
                dev = field(dl, "device_type", I32)
                self._check(b.icmp_signed("==", dev, I32(abi.DL_CPU)),
                            f"{qname}: argument {pname} must be in CPU memory (device type "
                            f"{abi.DL_CPU}), got device type %d", [dev])
                data = field(dl, "data", PTR)
                self._check(b.icmp_unsigned("!=", data, ir.Constant(PTR, None)),
                            f"{qname}: argument {pname} has a NULL data pointer")
                shape_ptr = field(dl, "shape", PTR)
                dims = []
                for d in range(rank):
                    ext = b.load(b.gep(shape_ptr, [I32(d)], source_etype=I64), typ=I64)
                    self._check(b.icmp_signed(">=", ext, I64(0)),
                                f"{qname}: argument {pname}: dimension {d} has negative extent "
                                f"%lld", [ext])
                    dims.append(ext)
                tensors[id(p)] = (dl, data, dims)
            else:
                self.ctx.env[p.var] = self._entry_scalar(qname, pname, i, p.dtype, code, slot)
        # bind plain-variable dims from their first appearance, then check all the others
        binders = set()
        for p in bparams:
            _, _, dims = tensors[id(p)]
            for d, dim in enumerate(p.orig.shape):
                if isinstance(dim, Var) and dim not in self.ctx.env:
                    self.ctx.env[dim] = self._narrow_dim(qname, dim, dims[d])
                    binders.add((id(p), d))
        for p in bparams:
            _, _, dims = tensors[id(p)]
            pname = fmt_escape(p.name)
            for d, dim in enumerate(p.orig.shape):
                if (id(p), d) in binders:
                    continue
                want = self._to_i64(self.visit(dim), dim.dtype)
                text = fmt_escape(expr_str(dim))
                shown = text if isinstance(dim, IntImm) else f"{text} = %lld"
                extra = [] if isinstance(dim, IntImm) else [want]
                self._check(b.icmp_signed("==", dims[d], want),
                            f"{qname}: argument {pname}: dimension {d} has extent %lld, expected "
                            f"{shown}", [dims[d]] + extra)
        flat_data = []
        for p in bparams:
            dl, data, dims = tensors[id(p)]
            self._entry_strides(qname, fmt_escape(p.name), dl, dims, field)
            offset = field(dl, "byte_offset", I64)
            flat_data.append(b.gep(data, [offset], source_etype=I8))
        values = [self.ctx.env[v] for v in bound]
        rc = b.call(compute, flat_data + values)
        b.ret(rc)
        self.ctx.finish()
        self.ctx = None
        return fn

    def _entry_scalar(self, qname, pname, i, dtype, code, slot):
        b = self.b
        if dt.is_float(dtype):
            is_f = b.icmp_signed("==", code, I32(abi.TYPE_FLOAT))
            is_i = b.icmp_signed("==", code, I32(abi.TYPE_INT))
            self._check(b.or_(is_f, is_i),
                        f"{qname}: argument {pname} (#{i}) must be a number (type code "
                        f"{abi.TYPE_FLOAT} or {abi.TYPE_INT}), got type code %d", [code])
            as_f = b.load(slot, typ=F64)
            as_i = self._cast(b.load(slot, typ=I64), "int64", "float64")
            v = b.select(is_f, as_f, as_i)
            return self._cast(v, "float64", dtype)
        self._check(b.icmp_signed("==", code, I32(abi.TYPE_INT)),
                    f"{qname}: argument {pname} (#{i}) must be an integer (type code "
                    f"{abi.TYPE_INT}), got type code %d", [code])
        v = b.load(slot, typ=I64)
        if dtype == "bool":
            return b.icmp_unsigned("!=", v, I64(0))
        bits = dt.bits(dtype)
        if bits < 64:
            if dt.is_uint(dtype):
                lo, hi = 0, (1 << bits) - 1
            else:
                lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            ok = b.and_(b.icmp_signed(">=", v, I64(lo)), b.icmp_signed("<=", v, I64(hi)))
            self._check(ok, f"{qname}: argument {pname} = %lld does not fit in {dtype}", [v])
            return b.trunc(v, ir.IntType(bits))
        return v

    def _narrow_dim(self, qname, var: Var, ext):
        """A dimension (i64) as the value of shape variable ``var`` (its dtype)."""
        if var.dtype == "int64" or not dt.is_integer(var.dtype):
            return ext
        bits = dt.bits(var.dtype)
        hi = (1 << (bits - 1)) - 1 if dt.is_int(var.dtype) else (1 << bits) - 1
        self._check(self.b.icmp_signed("<=", ext, I64(hi)),
                    f"{qname}: dimension {fmt_escape(var.name)} = %lld does not fit in "
                    f"{var.dtype}", [ext])
        return self.b.trunc(ext, ir.IntType(bits))

    def _entry_strides(self, qname, pname, dl, dims, field):
        """NULL strides mean compact; given strides must describe the compact layout."""
        if not dims:
            return
        b = self.b
        strides = field(dl, "strides", PTR)
        check_bb, done_bb = self._new_block("strides.check"), self._new_block("strides.done")
        b.cbranch(b.icmp_unsigned("==", strides, ir.Constant(PTR, None)), done_bb, check_bb)
        b.position_at_end(check_bb)
        expected = I64(1)
        for d in reversed(range(len(dims))):
            got = b.load(b.gep(strides, [I32(d)], source_etype=I64), typ=I64)
            ok = b.or_(b.icmp_signed("==", got, expected), b.icmp_signed("<=", dims[d], I64(1)))
            self._check(ok, f"{qname}: argument {pname} is not compact row-major: dimension "
                            f"{d} has stride %lld, expected %lld", [got, expected])
            expected = b.mul(expected, dims[d])
        b.branch(done_bb)
        b.position_at_end(done_bb)
