"""``FuseTIR``: turn each ``Primitive`` Relax function (made by ``FuseOps``) into one PrimFunc.

The kernels the function calls are inlined, in order, into one TensorIR function:

- its parameters are a buffer per tensor parameter of the Relax function (per tensor of a tuple
  parameter: a ``split``'s outputs passed whole, whose items the call then passes), a buffer
  per constant the calls use (the constant is then passed by the caller), the output buffers,
  and scalars for symbolic dims that no buffer shape gives as a plain dimension;
- values passed between the kernels become ``alloc_buffers`` of the root block;
- each kernel's buffers are replaced by those, its symbolic dims by the dims they meet (so the
  ``n`` of one kernel and the ``m`` of the next unify when they describe the same value), its
  loop and block variables and own allocations are made fresh, and block names are made unique
  (``add``, ``add_1``);
- the new PrimFunc takes the Relax function's name and gets ``"op_pattern"``, the highest
  pattern kind of the kernels.

Each call of the Relax function becomes one ``R.call_tir`` of the new PrimFunc. The fused Relax
functions are removed, and so are kernels nothing calls any more. A primitive function that
calls anything but ``call_tir`` (an operator that was not legalized) is left as it is.

Examples
--------
>>> # gv = cls.fused_matmul_add_relu(x, w, b)
>>> # becomes  gv = R.call_tir(cls.fused_matmul_add_relu, (x, w, b), out_sinfo=R.Tensor(...))
>>> # new_mod = FuseTIR()(FuseOps()(LegalizeOps()(mod)))
"""
from __future__ import annotations

from tilecraft.errors import TilecraftError
from tilecraft.tensorir import arith
from tilecraft.tensorir.expr import Let, Var as TirVar
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.functor import IRMutator, free_vars as tir_free_vars, substitute
from tilecraft.tensorir.stmt import Block, BlockRealize, Buffer, For, IterVar, LetStmt, seq

from ..analysis import (_match_sinfo, _substitute_sinfo, all_global_vars, infer_op_pattern,
                        is_call_tir, is_primitive, tir_vars_in)
from ..block_builder import call_tir
from ..expr import (Call, Constant, Expr, Function, GlobalVar, RelaxError, SeqExpr, Tuple,
                    TupleGetItem, Var)
from ..op.base import OpPattern
from ..struct_info import TensorStructInfo, TupleStructInfo
from .base import ExprMutator, Pass

__all__ = ["FuseTIR"]


class FuseTIR(Pass):
    """Fuse the kernels of each ``Primitive`` Relax function into one PrimFunc.

    Examples
    --------
    >>> new_mod = FuseTIR()(FuseOps()(LegalizeOps()(mod)))   # doctest: +SKIP
    """

    name = "FuseTIR"

    def transform_module(self, mod: IRModule) -> IRModule:
        fused: dict[str, _Fused] = {}
        for name, f in mod.functions.items():
            if is_primitive(f):
                result = _fuse_primitive(mod, name, f)
                if result is not None:
                    fused[name] = result
        if not fused:
            return mod
        rewriter = _CallRewriter(mod, fused)
        funcs = {}
        for name, f in mod.functions.items():
            if name in fused:
                funcs[name] = fused[name].prim_func   # the PrimFunc takes the function's name
            elif isinstance(f, Function):
                rewriter.builder.begin_names(f)
                funcs[name] = rewriter.visit_function(f)
            else:
                funcs[name] = f
        # kernels that only the fused functions called are not needed any more
        called_before = set()
        for name in fused:
            called_before |= {g.name_hint for g in all_global_vars(mod[name])}
        called_now = set()
        for f in funcs.values():
            if isinstance(f, Function):
                called_now |= {g.name_hint for g in all_global_vars(f)}
        for name in called_before - called_now - set(fused):
            if isinstance(funcs.get(name), PrimFunc):
                del funcs[name]
        return IRModule(funcs)


class _Fused:
    def __init__(self, prim_func: PrimFunc, func: Function, constants: list[Constant],
                 scalars: list[TirVar]):
        self.prim_func = prim_func
        self.func = func              # the Relax primitive function
        self.constants = constants    # extra arguments, after the function's own
        self.scalars = scalars        # the PrimFunc's scalar parameters (Relax-level dims)


class _CallRewriter(ExprMutator):
    def __init__(self, mod, fused):
        super().__init__(mod)
        self.fused = fused

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, GlobalVar) or call.op.name_hint not in self.fused:
            return call
        info = self.fused[call.op.name_hint]
        f = info.func
        # the function's symbolic dims, as this call site's arguments give them
        vmap: dict = {}
        for p, a in zip(f.params, call.args):
            _match_sinfo(p.struct_info, a.struct_info, vmap)
        ana = arith.Analyzer()
        out = _substitute_sinfo(f.ret_struct_info, vmap, set(), ana)
        outs = list(out.fields) if isinstance(out, TupleStructInfo) else [out]
        tir_vars = [ana.simplify(substitute(v, vmap)) for v in info.scalars]
        args = []
        for p, a in zip(f.params, call.args):
            args += self._tuple_fields(a, p.struct_info)
        return call_tir(GlobalVar(call.op.name_hint), args + list(info.constants),
                        outs, tir_vars=tir_vars or None)

    def _tuple_fields(self, a: Expr, si) -> list[Expr]:
        """The argument ``a`` of a parameter of struct info ``si`` as the fused PrimFunc takes
        it: a tensor as it is, a tuple as its tensors in order (items bound to variables)."""
        if not isinstance(si, TupleStructInfo):
            return [a]
        out = []
        for k, field in enumerate(si.fields):
            item = a.fields[k] if isinstance(a, Tuple) else \
                self.builder.emit(TupleGetItem(a, k), "lv")
            out += self._tuple_fields(item, field)
        return out


# ---------------------------------------------------------------------------------------------
# building the fused PrimFunc


class _Unsupported(TilecraftError):
    pass


def _fuse_primitive(mod: IRModule, name: str, f: Function) -> _Fused | None:
    try:
        return _FusedBuilder(mod, name, f).build()
    except _Unsupported:
        return None


class _FusedBuilder:
    def __init__(self, mod: IRModule, name: str, f: Function):
        self.mod, self.name, self.f = mod, name, f
        self.buf_names: set[str] = set()
        self.block_names: set[str] = set()
        self.slots: dict[int, object] = {}      # id(relax var) -> Buffer or tuple of them
        self.param_bufs: list[Buffer] = []
        self.const_bufs: list[Buffer] = []
        self.constants: list[Constant] = []
        self.intermediates: list[Buffer] = []
        self.allocs: list[Buffer] = []          # the kernels' own alloc_buffers
        self.stmts: list = []
        self.pattern = OpPattern.ELEMWISE
        self._keep: list = []

    def unique(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.buf_names:
            k += 1
            name = f"{hint}_{k}"
        self.buf_names.add(name)
        return name

    def new_buffer(self, hint: str, si) -> Buffer:
        if not isinstance(si, TensorStructInfo) or si.shape is None:
            raise _Unsupported(f"{hint} is not a tensor of known rank: {si!r}")
        return Buffer(self.unique(hint), si.shape, si.dtype)

    def build(self) -> _Fused:
        f = self.f
        if not isinstance(f.body, SeqExpr):
            raise _Unsupported("body is not a SeqExpr")
        for p in f.params:
            self.slots[id(p)] = self.param_slot(p.name_hint, p.struct_info)
        for blk in f.body.blocks:
            for b in blk.bindings:
                self.binding(b)
        outputs = self.flatten(self.value_slot(f.body.body))
        param_ids = {id(b) for b in self.param_bufs + self.const_bufs}
        if len({id(o) for o in outputs}) != len(outputs) or any(id(o) in param_ids
                                                                 for o in outputs):
            raise _Unsupported("an output is a parameter or appears twice")
        out_ids = {id(o) for o in outputs}
        allocs = [b for b in self.intermediates if id(b) not in out_ids] + self.allocs
        body = seq(*self.stmts)
        root = Block("root", [], [], [], body, alloc_buffers=allocs)
        buffers = self.param_bufs + self.const_bufs + outputs
        # symbolic dims: bound from a buffer when some parameter has it as a plain dimension
        plain = {id(d) for b in buffers for d in b.shape if isinstance(d, TirVar)}
        free: dict[int, TirVar] = {}
        for v in tir_free_vars(root) + [v for b in buffers for v in tir_free_vars_of_shape(b)]:
            free.setdefault(id(v), v)
        allowed = {id(v) for v in tir_vars_in(f)}
        for v in free.values():
            if id(v) not in allowed:
                raise _Unsupported(f"symbolic dim {v.name} of a kernel could not be unified")
        scalars = [v for k, v in free.items() if k not in plain]
        params, bmap = [], {}
        for b in buffers:
            h = TirVar(b.name + "_handle", "handle")
            params.append(h)
            bmap[h] = b
        params += scalars
        prim = PrimFunc(params, BlockRealize([], None, root), bmap,
                        attrs={"global_symbol": self.name, "op_pattern": int(self.pattern)})
        return _Fused(prim, f, self.constants, scalars)

    def param_slot(self, hint: str, si):
        """A parameter's buffer, or for a tuple of tensors (a ``split``'s result passed whole)
        a tuple of buffers, one parameter each (``_tuple_fields`` passes them)."""
        if isinstance(si, TupleStructInfo):
            return tuple(self.param_slot(f"{hint}_{k}", f) for k, f in enumerate(si.fields))
        buf = self.new_buffer(hint, si)
        self.param_bufs.append(buf)
        return buf

    # -- values ---------------------------------------------------------------------------------
    @staticmethod
    def flatten(slot) -> list[Buffer]:
        if isinstance(slot, tuple):
            out = []
            for s in slot:
                out.extend(_FusedBuilder.flatten(s))
            return out
        return [slot]

    def value_slot(self, e: Expr):
        if isinstance(e, Var):
            slot = self.slots.get(id(e))
            if slot is None:
                raise _Unsupported(f"{e.name_hint} is not a tensor computed here")
            return slot
        if isinstance(e, Constant):
            for c, b in zip(self.constants, self.const_bufs):
                if c is e:
                    return b
            buf = self.new_buffer("const", e.struct_info)
            self.constants.append(e)
            self.const_bufs.append(buf)
            return buf
        if isinstance(e, Tuple):
            return tuple(self.value_slot(x) for x in e.fields)
        if isinstance(e, TupleGetItem):
            t = self.value_slot(e.tuple_value)
            if not isinstance(t, tuple):
                raise _Unsupported("tuple item of a tensor")
            return t[e.index]
        raise _Unsupported(f"{type(e).__name__} value")

    def binding(self, b):
        v = b.value
        if is_call_tir(v):
            self.slots[id(b.var)] = self.call(b.var, v)
        elif isinstance(v, (Var, Tuple, TupleGetItem, Constant)):
            self.slots[id(b.var)] = self.value_slot(v)
        else:
            raise _Unsupported(f"binding of {b.var.name_hint} is not a call_tir")
        self._keep.append(b.var)

    def call(self, var: Var, c: Call):
        gv, args = c.args[0], c.args[1]
        callee = self.mod.functions.get(gv.name_hint)
        if not isinstance(callee, PrimFunc):
            raise RelaxError(f"FuseTIR: {self.name} calls {gv.name_hint} with call_tir but it is "
                             f"not a PrimFunc of the module", c)
        in_bufs = [self.value_slot(a) for a in args.fields]
        if any(isinstance(x, tuple) for x in in_bufs):
            raise _Unsupported("tuple argument of call_tir")
        out_si = c.sinfo_args[0]
        outs_si = list(out_si.fields) if isinstance(out_si, TupleStructInfo) else [out_si]
        out_bufs = []
        for k, si in enumerate(outs_si):
            hint = var.name_hint if len(outs_si) == 1 else f"{var.name_hint}_{k}"
            buf = self.new_buffer(hint, si)
            self.intermediates.append(buf)
            out_bufs.append(buf)
        cbufs = callee.buffers
        if len(cbufs) != len(in_bufs) + len(out_bufs):
            raise RelaxError(f"FuseTIR: {gv.name_hint} takes {len(cbufs)} buffers but {self.name}"
                             f" passes {len(in_bufs)} arguments and {len(out_bufs)} outputs", c)
        tir_values = list(c.args[2].values) if len(c.args) == 3 else []
        if len(tir_values) != len(callee.scalar_params):
            raise RelaxError(f"FuseTIR: {gv.name_hint} takes {len(callee.scalar_params)} scalars "
                             f"but {self.name} passes {len(tir_values)} tir_vars", c)
        vmap: dict = {}
        for p, val in zip(callee.scalar_params, tir_values):
            vmap[p] = val
        bmap: dict = {}
        for cb, ours in zip(cbufs, in_bufs + out_bufs):
            if len(cb.shape) != len(ours.shape) or cb.dtype != ours.dtype:
                raise RelaxError(f"FuseTIR: buffer {cb.name} of {gv.name_hint} is "
                                 f"{len(cb.shape)}-d {cb.dtype} but gets {ours.name} of "
                                 f"{len(ours.shape)}-d {ours.dtype}", c)
            bmap[cb] = ours
            for d, target in zip(cb.shape, ours.shape):
                if isinstance(d, TirVar) and d not in vmap:
                    vmap[d] = target
        attrs = callee.attr_dict
        # (the analysis only where the kernel does not say: as get's default it ran every time)
        pattern = int(attrs["op_pattern"]) if "op_pattern" in attrs else infer_op_pattern(callee)
        self.pattern = _combine_fused(self.pattern, pattern)
        body = callee.body
        inliner = _Inliner(vmap, bmap, self)
        if isinstance(body, BlockRealize) and body.block.name == "root" and \
                not body.block.iter_vars and body.block.init is None:
            for ab in body.block.alloc_buffers:
                self.allocs.append(inliner.fresh_buffer(ab))
            self.stmts.append(inliner.visit(body.block.body))
        else:
            self.stmts.append(inliner.visit(body))
        return out_bufs[0] if len(out_bufs) == 1 else tuple(out_bufs)


def _combine_fused(a: int, b: int) -> int:
    return max(a, b)


def tir_free_vars_of_shape(buf: Buffer) -> list[TirVar]:
    out = []
    for d in list(buf.shape) + list(buf.strides or ()):
        out.extend(tir_free_vars(d))
    return out


class _Inliner(IRMutator):
    """Copy a kernel body into the fused function: buffers and symbolic dims substituted, loop /
    block / let variables and allocations made fresh, block names made unique."""

    def __init__(self, vmap: dict, bmap: dict, owner: _FusedBuilder):
        super().__init__()
        self.vmap = dict(vmap)
        self.buffer_map.update(bmap)
        self.owner = owner

    def visit_Var(self, v):
        return self.vmap.get(v, v)

    def fresh_var(self, v: TirVar) -> TirVar:
        nv = TirVar(v.name, v.dtype)
        self.vmap[v] = nv
        return nv

    def fresh_buffer(self, b: Buffer) -> Buffer:
        shape = [self.visit(d) for d in b.shape]
        strides = None if b.strides is None else [self.visit(s) for s in b.strides]
        nb = Buffer(self.owner.unique(b.name), shape, b.dtype, strides=strides, scope=b.scope,
                    align=b.align)
        self.buffer_map[b] = nb
        return nb

    def visit_For(self, f: For):
        self.fresh_var(f.loop_var)
        return self.generic_visit(f)

    def visit_IterVar(self, iv: IterVar):
        self.fresh_var(iv.var)
        return self.generic_visit(iv)

    def visit_LetStmt(self, s: LetStmt):
        value = self.visit(s.value)
        nv = self.fresh_var(s.var)
        return LetStmt(nv, value, self.visit(s.body))

    def visit_Let(self, e: Let):
        value = self.visit(e.value)
        nv = self.fresh_var(e.var)
        return Let(nv, value, self.visit(e.body))

    def visit_Block(self, b: Block):
        allocs = [self.fresh_buffer(ab) for ab in b.alloc_buffers]
        name, k = b.name, 0
        while name in self.owner.block_names:
            k += 1
            name = f"{b.name}_{k}"
        self.owner.block_names.add(name)
        new = self.generic_visit(b)
        changes = {}
        if name != b.name:
            changes["name"] = name
        if allocs or b.alloc_buffers:
            changes["alloc_buffers"] = allocs
        return new.replace(**changes) if changes else new
