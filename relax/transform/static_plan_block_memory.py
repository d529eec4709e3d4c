"""``StaticPlanBlockMemory``: intermediate tensors whose lifetimes do not overlap share storage.

The pass rewrites every ``call_tir`` of a Relax function whose output is an intermediate (it does
not flow into the function's result) into explicit memory operations::

    s0 = relax.memory.alloc_storage(ShapeExpr([nbytes]))                  # raw bytes
    t0 = relax.memory.alloc_tensor(s0, PrimValue(0), ShapeExpr(shape), dtype="float32")
    lv = relax.call_tir_dps(kernel, Tuple(args), t0[, ShapeExpr(tir_vars)])

Storage tokens are assigned greedily in binding order: when a tensor's last use has passed, its
storage goes back to a free list; the next allocation takes the best-fitting free storage (the
smallest one large enough, else the largest one, grown). Storage is untyped bytes, so a
``float32`` tensor may reuse an ``int64`` tensor's storage.

Symbolic shapes
---------------
* With an upper bound for every symbolic variable of a size (``upper_bounds={"n": 64}``, or the
  function attribute ``tir_var_upper_bound``), the storage is planned at the bound: a constant
  size, allocated once per ``VirtualMachine``. A call whose sizes exceed the bound still runs:
  that tensor then comes from the run-time pool instead (correct, only not planned).
* Otherwise the size stays symbolic: the storage is taken at run time from the VM's pool of
  buffers keyed by byte size and returned when the call ends, so a second call with the same
  sizes allocates nothing. Two such tensors share a storage only when their sizes are provably
  equal.

Device limits
-------------
With a ``target`` (``relax.build`` passes its own), sizes are the bytes each dtype takes *on that
device* — WebGPU keeps 8/16-bit integers and bool in 32-bit words and 64-bit integers narrowed
to 32 (``targets.webgpu_backend.storage``) — and a storage never grows past the device's
largest buffer: WebGPU's ``max-storage-buffer-binding-size`` (128 MiB by the spec, the
target's ``-max-storage-buffer-binding-size`` where it declares more; a kernel binds each
storage whole) and ``max-buffer-size``, or ``max_storage_bytes`` when given. A
tensor that would not fit such a storage shares with nothing larger than the limit allows; a
tensor of constant size over the limit on its own is a build-time ``RelaxError`` naming the
tensor, its size and the limit. A symbolic size whose upper bound is over the limit is not
planned at the bound: it comes from the run-time pool at its actual size (a run-time error
names the array when that is over the limit too).

Outputs of the function (and anything aliasing them: tuple fields, views) are never planned:
they are allocated fresh on every call, because the caller keeps them. ``call_tir`` inside ``If``
branches is left to the VM (fresh allocation).

Examples
--------
>>> mod = StaticPlanBlockMemory()(mod)                       # doctest: +SKIP
>>> plan_summary(mod)["main"]                                # doctest: +SKIP
{'tensors': 4, 'storages': 2, 'planned_bytes': 65536, 'unplanned_bytes': 131072}
"""
from __future__ import annotations

from typing import Mapping

from tilecraft.targets.webgpu_backend.storage import storage_dtype
from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import IntImm, PrimExpr, Var as TirVar
from tilecraft.tensorir.function import IRModule
from tilecraft.tensorir.functor import children, post_order_visit

from ..expr import (BindingBlock, Call, Constant, DataflowBlock, DataflowVar, Expr, Function,
                    GlobalVar, MatchCast, PrimValue, RelaxError, SeqExpr, ShapeExpr, Tuple, Var, VarBinding)
from ..op.base import Op, OpPattern, register_op
from ..struct_info import ObjectStructInfo, TensorStructInfo, TupleStructInfo

# ---------------------------------------------------------------------------------------------
# The memory operators (handled by the VM directly; no legalization).


def _infer_alloc_storage(call: Call):
    if len(call.args) != 1 or not isinstance(call.args[0], ShapeExpr) or \
            len(call.args[0].values) != 1:
        raise RelaxError("relax.memory.alloc_storage takes (ShapeExpr([nbytes]),)", call)
    return ObjectStructInfo()


def _infer_alloc_tensor(call: Call):
    if len(call.args) != 3 or not isinstance(call.args[2], ShapeExpr):
        raise RelaxError("relax.memory.alloc_tensor takes (storage, PrimValue(offset), "
                         "ShapeExpr(shape)) and attrs dtype", call)
    return TensorStructInfo(call.args[2].values, call.attr_dict["dtype"])


def _infer_call_tir_dps(call: Call):
    if len(call.args) not in (3, 4) or not isinstance(call.args[0], GlobalVar) \
            or not isinstance(call.args[1], Tuple):
        raise RelaxError("relax.call_tir_dps takes (GlobalVar, Tuple of arguments, output or "
                         "Tuple of outputs[, ShapeExpr of tir vars])", call)
    return call.args[2].struct_info


ALLOC_STORAGE = register_op(
    "relax.memory.alloc_storage", _infer_alloc_storage, None, OpPattern.OPAQUE,
    doc="Raw storage of nbytes (a constant: allocated once per VM; symbolic: from the pool).")
ALLOC_TENSOR = register_op(
    "relax.memory.alloc_tensor", _infer_alloc_tensor, None, OpPattern.OPAQUE,
    doc="A tensor view of a storage at a byte offset.")
CALL_TIR_DPS = register_op(
    "relax.call_tir_dps", _infer_call_tir_dps, None, OpPattern.OPAQUE,
    doc="Call a PrimFunc writing into the given output tensors (destination passing style); "
        "the value is the output(s).")

ALIGNMENT = 64


def _nbytes(sinfo: TensorStructInfo, itemsize=None) -> PrimExpr:
    size: PrimExpr = IntImm((itemsize or dt.itemsize)(sinfo.dtype), "int64")
    for d in sinfo.shape:
        size = size * d
    return arith.simplify(size)


def _free_tir_vars(e) -> list[TirVar]:
    found: list[TirVar] = []
    post_order_visit(e, lambda n: found.append(n) if isinstance(n, TirVar) and n not in found
                     else None)
    return found


# ---------------------------------------------------------------------------------------------
# Analysis


def _used_vars(e, out: list):
    """Relax Vars referenced by ``e`` (recursively, also inside If branches)."""
    if isinstance(e, Var):
        out.append(e)
        return
    if isinstance(e, Function):
        return
    if isinstance(e, (VarBinding, MatchCast)):
        _used_vars(e.value, out)
        return
    for c in children(e):
        if isinstance(c, (Expr, BindingBlock, VarBinding, MatchCast)):
            _used_vars(c, out)


class _Token:
    __slots__ = ("index", "sinfo", "size", "static_size", "escapes", "last_use", "storage",
                 "shape_only")

    def __init__(self, index, sinfo, size, static_size):
        self.index, self.sinfo, self.size, self.static_size = index, sinfo, size, static_size
        self.escapes = False
        self.shape_only = False
        self.last_use = -1
        self.storage = None


class _Storage:
    __slots__ = ("index", "size", "static", "var", "first_token")

    def __init__(self, index, size, static):
        self.index, self.size, self.static = index, size, static
        self.var = None
        self.first_token = None


def _shape_only_call(call: Call, shape_only: set) -> bool:
    """Whether the ``call_tir`` ``call`` reads only constants and values of ``shape_only`` (ids
    of vars computed from the shapes alone): position ids, causal masks."""
    args = call.args[1]
    fields = args.fields if isinstance(args, Tuple) else [args]
    return all(isinstance(a, Constant) or (isinstance(a, Var) and id(a) in shape_only)
               for a in fields)


def _is_op(e, name: str) -> bool:
    return isinstance(e, Call) and isinstance(e.op, Op) and e.op.name == name


def device_storage(target) -> tuple:
    """``(itemsize, max_storage_bytes)`` for ``target``: the bytes one element of a dtype
    takes in the device's buffers (a function of the dtype name) and the largest storage the
    device binds (None: no limit known at build time).

    Examples
    --------
    >>> itemsize, limit = device_storage(Target("webgpu"))      # doctest: +SKIP
    >>> itemsize("int8"), limit
    (4, 134217728)
    """
    if target is None or getattr(target, "kind", None) != "webgpu":
        return dt.itemsize, None

    def itemsize(dtype: str) -> int:
        return dt.itemsize(storage_dtype(dtype))
    # the target's limits: the spec's defaults unless it declares more (an adapter's own,
    # ``targets.webgpu(0).target()``), what the runtime then opens the device with
    limit = min(target.max_buffer_size, target.max_storage_buffer_binding_size)
    return itemsize, limit


class _FunctionPlanner:
    def __init__(self, func: Function, name: str, upper_bounds: Mapping[str, int],
                 itemsize=None, limit: int | None = None):
        self.func, self.name = func, name
        self.itemsize, self.limit = itemsize or dt.itemsize, limit
        self.bounds = dict(upper_bounds)
        self.analyzer = arith.Analyzer()
        self.bounded: set = set()
        for v in self._symbolic_vars():
            if v.name in self.bounds:
                self.analyzer.update_bound(v, 0, int(self.bounds[v.name]))
                self.bounded.add(v)
            else:
                self.analyzer.update_bound(v, 0, None)

    def _symbolic_vars(self):
        found = []

        def visit(n):
            if isinstance(n, TirVar) and n not in found:
                found.append(n)
        post_order_visit(self.func, visit)
        return found

    def _size_of(self, sinfo: TensorStructInfo, var=None):
        size = _nbytes(sinfo, self.itemsize)
        if isinstance(size, IntImm):
            if self.limit is not None and size.value > self.limit:
                what = f"tensor {var.name_hint}" if var is not None else "a tensor"
                raise RelaxError(
                    f"{self.name}: {what} of shape {tuple(d.value for d in sinfo.shape)} "
                    f"{sinfo.dtype} needs {size.value} bytes, over the device's buffer limit "
                    f"of {self.limit} bytes (max-storage-buffer-binding-size / "
                    f"max-buffer-size): split the computation or use a smaller batch", var)
            return size, size.value
        free = _free_tir_vars(size)
        if free and all(v in self.bounded for v in free):
            hi = self.analyzer.const_int_bound(size).max_value
            # over the device's limit at the bound: planned at run time at the actual size
            if hi < arith.ConstIntBound.POS_INF and (self.limit is None or hi <= self.limit):
                return size, hi
        return size, None

    def plan(self) -> Function:
        body = self.func.body
        if not isinstance(body, SeqExpr):
            return self.func
        bindings = [b for blk in body.blocks for b in blk.bindings]
        tokens_of: dict[int, set] = {}       # id(var) -> tokens its value may reference
        token_of_binding: dict[int, list] = {}
        tokens: list[_Token] = []

        def refs(e) -> set:
            used: list = []
            _used_vars(e, used)
            out = set()
            for v in used:
                out |= tokens_of.get(id(v), set())
            return out

        shape_only: set[int] = set()     # id(var) of values computed from shapes and constants
        for pos, b in enumerate(bindings):
            value = b.value
            if isinstance(b, VarBinding) and _is_op(value, "relax.call_tir"):
                outs = _leaves(value.sinfo_args[0])
                toks = []
                for si in outs:
                    if not isinstance(si, TensorStructInfo) or si.shape is None:
                        toks = None
                        break
                    size, static = self._size_of(si, b.var)
                    toks.append(_Token(len(tokens) + len(toks), si, size, static))
                if toks:
                    tokens.extend(toks)
                    token_of_binding[pos] = toks
                    tokens_of[id(b.var)] = {t.index for t in toks}
                    if _shape_only_call(value, shape_only):
                        shape_only.add(id(b.var))
                        for t in toks:
                            t.shape_only = True
                    continue
            # anything else may return (a view of) what it uses: conservative aliasing
            tokens_of[id(b.var)] = refs(value)
        for t in refs(body.body):
            tokens[t].escapes = True
        # last uses (a token read by binding ``pos``, directly or through an alias)
        for pos, b in enumerate(bindings):
            for t in refs(b.value):
                tokens[t].last_use = max(tokens[t].last_use, pos)
        # greedy storage assignment in binding order
        storages: list[_Storage] = []
        free: list[_Storage] = []
        for pos, b in enumerate(bindings):
            for tok in token_of_binding.get(pos, []):
                if tok.escapes:
                    continue
                # a value of the shapes alone has a storage of its own, never shared: the VM
                # computes it once per shape key (relax.vm) and later kernels read it
                tok.storage = self._take(tok, [] if tok.shape_only else free, storages)
            # storages whose last user is this binding are free for the next allocations;
            # a kernel's inputs and outputs never share (they are freed only after it)
            for tok in tokens:
                if tok.storage is not None and tok.last_use == pos and not tok.shape_only:
                    free.append(tok.storage)
            for tok in token_of_binding.get(pos, []):
                if tok.storage is not None and tok.last_use < 0 and not tok.shape_only:
                    free.append(tok.storage)   # never read: free at once
        if not any(t.storage is not None for t in tokens):
            return self.func
        return self._rewrite(body, bindings, token_of_binding, storages)

    def _take(self, tok: _Token, free: list, storages: list) -> _Storage:
        if tok.static_size is not None:
            # a storage is as large as its largest tensor; that must stay within the limit
            static_free = [s for s in free if s.static and
                           (self.limit is None or max(s.size, tok.static_size) <= self.limit)]
            fits = [s for s in static_free if s.size >= tok.static_size]
            if fits:
                best = min(fits, key=lambda s: s.size)
            elif static_free:
                best = max(static_free, key=lambda s: s.size)
                best.size = tok.static_size
            else:
                best = _Storage(len(storages), tok.static_size, True)
                storages.append(best)
            if best in free:
                free.remove(best)
            return best
        for s in free:
            if not s.static and self.analyzer.can_prove_equal(s.size, tok.size):
                free.remove(s)
                return s
        s = _Storage(len(storages), tok.size, False)
        storages.append(s)
        return s

    def _rewrite(self, body: SeqExpr, bindings, token_of_binding, storages) -> Function:
        new_blocks = []
        pos = 0
        prefix = f"{self.name}_storage"
        for blk in body.blocks:
            dataflow = isinstance(blk, DataflowBlock)
            var_cls = DataflowVar if dataflow else Var
            out = []
            for b in blk.bindings:
                toks = token_of_binding.get(pos, [])
                if toks and any(t.storage is not None for t in toks):
                    call = b.value
                    outs = []
                    for tok in toks:
                        if tok.storage is None:  # one output of several escapes: fresh tensor
                            alloc = Call(ALLOC_TENSOR_FRESH, [ShapeExpr(tok.sinfo.shape)],
                                         {"dtype": tok.sinfo.dtype})
                        else:
                            st = tok.storage
                            if st.var is None:
                                size = st.size if isinstance(st.size, PrimExpr) else \
                                    IntImm(_round_up(st.size), "int64")
                                st.var = var_cls(f"{prefix}{st.index}", ObjectStructInfo())
                                out.append(VarBinding(st.var, Call(ALLOC_STORAGE,
                                                                   [ShapeExpr([size])])))
                            alloc = Call(ALLOC_TENSOR, [st.var, PrimValue(IntImm(0, "int64")),
                                                        ShapeExpr(tok.sinfo.shape)],
                                         {"dtype": tok.sinfo.dtype})
                        av = var_cls(f"{b.var.name_hint}_buf{len(outs)}" if len(toks) > 1
                                     else f"{b.var.name_hint}_buf", alloc.struct_info)
                        out.append(VarBinding(av, alloc))
                        outs.append(av)
                    out_expr = _nest(call.sinfo_args[0], iter(outs))
                    args = [call.args[0], call.args[1], out_expr] + list(call.args[2:])
                    out.append(VarBinding(b.var, Call(CALL_TIR_DPS, args)))
                else:
                    out.append(b)
                pos += 1
            new_blocks.append(type(blk)(out))
        new_body = SeqExpr(new_blocks, body.body)
        return self.func.replace(body=new_body)


def _infer_alloc_tensor_fresh(call: Call):
    if len(call.args) != 1 or not isinstance(call.args[0], ShapeExpr):
        raise RelaxError("relax.builtin.alloc_tensor takes (ShapeExpr(shape),) and attrs dtype",
                         call)
    return TensorStructInfo(call.args[0].values, call.attr_dict["dtype"])


ALLOC_TENSOR_FRESH = register_op(
    "relax.builtin.alloc_tensor", _infer_alloc_tensor_fresh, None, OpPattern.OPAQUE,
    doc="A freshly allocated tensor (not planned).")


def _leaves(sinfo) -> list:
    """The tensors of a (nested) tuple struct info, in order: a kernel's flat outputs."""
    if isinstance(sinfo, TupleStructInfo):
        return [x for f in sinfo.fields for x in _leaves(f)]
    return [sinfo]


def _nest(sinfo, outs):
    if isinstance(sinfo, TupleStructInfo):
        return Tuple([_nest(f, outs) for f in sinfo.fields])
    return next(outs)


def _round_up(n: int) -> int:
    return max(ALIGNMENT, (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)


class StaticPlanBlockMemory:
    """The memory planning pass; ``StaticPlanBlockMemory(upper_bounds)(mod) -> mod``.

    Parameters
    ----------
    upper_bounds : dict[str, int], optional
        Upper bounds of symbolic shape variables by name (``{"n": 64}``); a function's
        ``tir_var_upper_bound`` attribute adds to them. Sizes bounded by them are planned
        statically at the bound.
    target : Target, optional
        The device the plan is for: its dtype sizes and buffer limit (see Device limits).
    max_storage_bytes : int, optional
        The largest storage, overriding the target's.

    Examples
    --------
    >>> planned = StaticPlanBlockMemory({"n": 64})(mod)      # doctest: +SKIP
    """

    def __init__(self, upper_bounds: Mapping[str, int] | None = None, target=None,
                 max_storage_bytes: int | None = None):
        self.upper_bounds = {str(k): int(v) for k, v in (upper_bounds or {}).items()}
        self.itemsize, self.limit = device_storage(target)
        if max_storage_bytes is not None:
            if int(max_storage_bytes) <= 0:
                raise ValueError(f"StaticPlanBlockMemory: max_storage_bytes must be positive, "
                                 f"got {max_storage_bytes}")
            self.limit = int(max_storage_bytes)
        for k, v in self.upper_bounds.items():
            if v < 0:
                raise ValueError(f"StaticPlanBlockMemory: upper bound of {k} is negative ({v})")

    def __call__(self, mod: IRModule) -> IRModule:
        funcs = {}
        for name, func in mod.functions.items():
            if isinstance(func, Function):
                bounds = dict(self.upper_bounds)
                attr = func.attr_dict.get("tir_var_upper_bound")
                if attr:
                    bounds.update({str(k): int(v) for k, v in dict(attr).items()})
                func = _FunctionPlanner(func, name, bounds, self.itemsize, self.limit).plan()
            funcs[name] = func
        return IRModule(funcs)

    transform_module = __call__


def plan_summary(mod: IRModule) -> dict:
    """Per Relax function of a planned module: ``tensors`` (planned tensors), ``storages``,
    ``planned_bytes`` (total storage, constant sizes only) and ``unplanned_bytes`` (what the
    planned tensors would take each on its own); sizes that are symbolic are counted in
    ``dynamic_storages``."""
    out = {}
    for name, func in mod.functions.items():
        if not isinstance(func, Function) or not isinstance(func.body, SeqExpr):
            continue
        storage_size = {}
        tensors = planned = unplanned = dynamic = 0
        for blk in func.body.blocks:
            for b in blk.bindings:
                v = b.value
                if _is_op(v, "relax.memory.alloc_storage"):
                    size = v.args[0].values[0]
                    if isinstance(size, IntImm):
                        storage_size[id(b.var)] = size.value
                        planned += size.value
                    else:
                        dynamic += 1
                elif _is_op(v, "relax.memory.alloc_tensor"):
                    tensors += 1
                    size = _nbytes(v.struct_info)
                    if isinstance(size, IntImm):
                        unplanned += size.value
        out[name] = {"tensors": tensors, "storages": len(storage_size) + dynamic,
                     "planned_bytes": planned, "unplanned_bytes": unplanned,
                     "dynamic_storages": dynamic}
    return out


__all__ = ["StaticPlanBlockMemory", "device_storage", "plan_summary"]
