"""Schedule primitives on buffers: cache_read, cache_write, set_scope, storage_align,
transform_layout.

Each primitive is a ``@traced`` method of ``MemoryPrimitives`` over a pure function
``(PrimFunc, ...) -> (PrimFunc, ...)`` of this module, so an illegal request raises
``ScheduleError`` before anything is installed and leaves the schedule as it was.

Buffers are identity-compared, so "changing" a buffer (its scope, strides or layout) means making
a new ``Buffer`` and substituting it for the old one everywhere it appears: loads, stores, block
regions, ``alloc_buffers`` and, for a parameter, the function's ``buffer_map``.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

from .. import arith
from ..expr import (BufferLoad, Cast, FloatImm, IntImm, PrimExpr, Var, convert)
from ..function import PrimFunc
from ..functor import IRMutator, free_vars, substitute
from ..stmt import (SCOPES, Block, BlockRealize, Buffer, BufferRegion, BufferStore, For, IterVar,
                    Range, SeqStmt, Stmt, seq)
from . import tree
from .error import ScheduleError
from .index_map import IndexMap
from .regions import relax_region, substitute_region
from .rv import BlockRV, traced


# =============================================================================================
# helpers shared with the reduction primitives


def unique_name(func: PrimFunc, base: str, taken: set[str] | None = None) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : a name no block or buffer of ``func`` has."""
    names = set(taken or ())
    for br in tree.all_blocks(func):
        names.add(br.block.name)
        names.update(b.name for b in br.block.alloc_buffers)
    names.update(b.name for b in func.buffers)
    if base not in names:
        return base
    k = 1
    while f"{base}_{k}" in names:
        k += 1
    return f"{base}_{k}"


class _BufferSubstituter(IRMutator):
    def __init__(self, mapping: dict[Buffer, Buffer]):
        super().__init__()
        self.buffer_map.update(mapping)


def replace_buffers(node, mapping: dict[Buffer, Buffer]):
    """``node`` with every reference to a key buffer of ``mapping`` replaced by its value."""
    return _BufferSubstituter(mapping).visit(node)


def replace_buffers_in_func(func: PrimFunc, mapping: dict[Buffer, Buffer]) -> PrimFunc:
    """``func`` with buffers replaced everywhere, parameters' ``buffer_map`` included."""
    sub = _BufferSubstituter(mapping)
    body = sub.visit(func.body)
    bmap = {p: sub.visit(b) for p, b in func.buffer_map}
    return func.replace(body=body, buffer_map=bmap)


def allocating_block(func: PrimFunc, buf: Buffer) -> Block | None:
    """The block whose ``alloc_buffers`` hold ``buf`` (None for a parameter)."""
    for s, _ in tree.walk(func.body):
        if isinstance(s, Block) and any(b is buf for b in s.alloc_buffers):
            return s
    return None


def is_param(func: PrimFunc, buf: Buffer) -> bool:
    return any(b is buf for b in func.buffers)


def block_buffer(block: Block, index, kind: str, primitive: str) -> Buffer:
    """The buffer of ``block.reads[index]`` (kind "read") or ``block.writes[index]`` ("write")."""
    regions = block.reads if kind == "read" else block.writes
    if isinstance(index, bool) or not isinstance(index, int):
        raise ScheduleError(primitive, f"block {block.name}: the buffer index must be an int, got "
                            f"{index!r}", block)
    if not 0 <= index < len(regions):
        names = [r.buffer.name for r in regions]
        raise ScheduleError(primitive, f"block {block.name}: {kind} buffer index {index} is out "
                            f"of range; the block {kind}s {len(regions)} buffer(s) {names}", block)
    return regions[index].buffer


def check_scope(scope, primitive: str, block: Block) -> str:
    if scope not in SCOPES:
        raise ScheduleError(primitive, f"block {block.name}: unknown storage scope {scope!r}; "
                            f"expected one of {SCOPES}", block)
    return scope


def _reads(br: BlockRealize, buf: Buffer) -> bool:
    return any(r.buffer is buf for r in br.block.reads)


def _writes(br: BlockRealize, buf: Buffer) -> bool:
    return any(w.buffer is buf for w in br.block.writes)


def _items(s: Stmt) -> list[Stmt]:
    return list(s.seq) if isinstance(s, SeqStmt) else [s]


def _blocks_in(s: Stmt) -> list[BlockRealize]:
    return [x for x, _ in tree.walk(s) if isinstance(x, BlockRealize)]


def _find_insert(body: Stmt, before: Callable[[BlockRealize], bool],
                 after: Callable[[BlockRealize], bool], prefer_after: bool,
                 primitive: str, what: str) -> tuple[list[For], int]:
    """Where a new statement goes so that it runs after every block ``before`` accepts and
    before every block ``after`` accepts: ``(loops descended into, position in the innermost
    statement list)``. It goes at the outermost level possible; ``prefer_after`` puts it right
    before the first ``after`` block rather than right after the last ``before`` one."""
    path: list[For] = []
    stmt = body
    while True:
        items = _items(stmt)
        first_after = next((k for k, s in enumerate(items) if any(after(b) for b in _blocks_in(s))),
                           None)
        last_before = max((k for k, s in enumerate(items) if any(before(b) for b in _blocks_in(s))),
                          default=None)
        if last_before is None:
            return path, (first_after if first_after is not None else 0)
        if first_after is None:
            return path, last_before + 1
        if last_before < first_after:
            return path, (first_after if prefer_after else last_before + 1)
        if last_before > first_after:
            raise ScheduleError(primitive, f"{what}: a consumer runs before the producer it needs "
                                f"in the same scope; cannot place the copy between them")
        inner = items[first_after]
        if not isinstance(inner, For):
            raise ScheduleError(primitive, f"{what}: the producer and consumer share a "
                                f"{type(inner).__name__} statement that a copy cannot be placed "
                                f"inside")
        path.append(inner)
        stmt = inner.body


def _insert(stmt: Stmt, path: Sequence[For], pos: int, new: Stmt) -> Stmt:
    items = _items(stmt)
    if not path:
        items.insert(pos, new)
        return seq(*items)
    k = next(i for i, s in enumerate(items) if s is path[0])
    items[k] = path[0].replace(body=_insert(path[0].body, path[1:], pos, new))
    return seq(*items)


def _relaxed_write_region(stmt: Stmt, buf: Buffer, pick: Callable[[BlockRealize], bool],
                          ana: arith.Analyzer) -> list[Range] | None:
    """The part of ``buf`` that the blocks ``pick`` accepts write below ``stmt``, widened over
    every loop below ``stmt``; None when it cannot be stated at ``stmt`` (several writers, or
    indices that depend on variables defined below ``stmt``)."""
    hits = [(s, p) for s, p in tree.walk(stmt) if isinstance(s, BlockRealize) and pick(s)]
    if len(hits) != 1:
        return None
    br, parents = hits[0]
    regions = [w for w in br.block.writes if w.buffer is buf]
    if len(regions) != 1:
        return None
    vmap = {iv.var: v for iv, v in zip(br.block.iter_vars, br.iter_values)}
    region = substitute_region(regions[0], vmap)
    dom = {}
    inner_defs = set()
    for p in parents:
        if isinstance(p, For):
            dom[p.loop_var] = Range(p.min, p.extent)
        elif isinstance(p, Block):
            inner_defs.update(id(iv.var) for iv in p.iter_vars)
    relaxed = relax_region(region, dom, ana)
    for r in relaxed.region:
        for v in free_vars(r.min) + free_vars(r.extent):
            if id(v) in inner_defs or v in dom:
                return None
    return [Range(ana.simplify(r.min), ana.simplify(r.extent)) for r in relaxed.region]


def _copy_nest(name: str, src: Buffer, dst: Buffer, region: Sequence[Range]) -> Stmt:
    """``for ax0, ax1, ...: block name: dst[v0, v1, ...] = src[v0, v1, ...]`` over ``region``
    (the value converted to ``dst``'s dtype where it differs: a widening cache)."""
    ana = arith.Analyzer()
    loops = [Var(f"ax{d}", "int64") for d in range(len(region))]
    ivars = [Var(f"v{d}", "int64") for d in range(len(region))]
    iter_vars = [IterVar(v, Range(IntImm(0, "int64"), s), "spatial")
                 for v, s in zip(ivars, src.shape)]
    point = [Range(v, IntImm(1, "int64")) for v in ivars]
    block = Block(name, iter_vars, [BufferRegion(src, point)], [BufferRegion(dst, point)],
                  BufferStore(dst, _converted(BufferLoad(src, ivars), dst.dtype), ivars))
    stmt: Stmt = BlockRealize([ana.simplify(r.min + ax) for r, ax in zip(region, loops)], None,
                              block)
    for ax, r in reversed(list(zip(loops, region))):
        stmt = For(ax, IntImm(0, "int64"), r.extent, "serial", stmt)
    return stmt


def _converted(value, dtype: str):
    return value if value.dtype == dtype else Cast(dtype, value)


# the conversions a cache may make as it copies (exact: every value of the first dtype is one of
# the second), so that readers which convert each value anyway read it converted once
WIDENING = {("float16", "float32")}


class _Widen(IRMutator):
    """Inside a consumer block: ``Cast(dtype, old[idx])`` -> ``new[idx]`` (``new`` holds the
    values of ``old`` converted to ``dtype``); any other read of ``old`` is an error."""

    def __init__(self, old: Buffer, new: Buffer, prim: str, block):
        super().__init__()
        self.old, self.new, self.prim, self.block = old, new, prim, block

    def visit_Cast(self, e):
        v = e.value
        if isinstance(v, BufferLoad) and v.buffer is self.old and e.dtype == self.new.dtype:
            return BufferLoad(self.new, tuple(self.visit(i) for i in v.indices))
        return self.generic_visit(e)

    def visit_BufferLoad(self, e):
        if e.buffer is self.old:
            raise ScheduleError(self.prim, f"block {self.block.name} reads {self.old.name} other "
                                f"than converted to {self.new.dtype}: a {self.new.dtype} cache "
                                f"of it would change what it computes", self.block)
        return self.generic_visit(e)


class _WidenRedirect(IRMutator):
    """``_Redirect`` for a cache of another dtype: the consumers' converting reads read it."""

    def __init__(self, names: set[str], old: Buffer, new: Buffer, prim: str):
        super().__init__()
        self.names, self.old, self.new, self.prim = names, old, new, prim

    def visit_BlockRealize(self, br: BlockRealize):
        if br.block.name in self.names:
            br = _Widen(self.old, self.new, self.prim, br.block).visit(br)
            return replace_buffers(br, {self.old: self.new})     # the read regions
        return self.generic_visit(br)

    def visit_Buffer(self, buf):
        return buf

    def visit_BufferLoad(self, e):
        return e

    def visit_BufferRegion(self, r):
        return r


class _Redirect(IRMutator):
    """Replace ``old`` by ``new`` inside the blocks named in ``names`` (whole subtrees)."""

    def __init__(self, names: set[str], old: Buffer, new: Buffer):
        super().__init__()
        self.names, self.old, self.new = names, old, new

    def visit_BlockRealize(self, br: BlockRealize):
        if br.block.name in self.names:
            return replace_buffers(br, {self.old: self.new})
        return self.generic_visit(br)

    def visit_Buffer(self, buf):
        return buf

    def visit_BufferLoad(self, e):
        return e  # outside the named blocks nothing changes

    def visit_BufferRegion(self, r):
        return r


def _scope_of(ancestors: tuple, primitive: str, block: Block) -> Block:
    scope = tree.enclosing_block(ancestors)
    if scope is None:
        raise ScheduleError(primitive, f"block {block.name} has no enclosing (root) block to "
                            f"allocate the cache in", block)
    return scope


# =============================================================================================
# pure transformations


def cache_read(func: PrimFunc, block_name: str, read_buffer_index: int, storage_scope: str,
               consumer_names: Sequence[str] | None = None,
               dtype: str | None = None) -> tuple[PrimFunc, str]:
    """See ``Schedule.cache_read``; returns the new function and the cache block's name."""
    prim = "cache_read"
    br, ancestors = tree.find_block(func, block_name)
    block = br.block
    buf = block_buffer(block, read_buffer_index, "read", prim)
    dtype = buf.dtype if dtype is None else dtype
    if dtype != buf.dtype and (buf.dtype, dtype) not in WIDENING:
        raise ScheduleError(prim, f"block {block_name}: a cache of {buf.name} cannot convert "
                            f"{buf.dtype} to {dtype} (only {sorted(WIDENING)}: conversions "
                            f"that keep every value)", block)
    check_scope(storage_scope, prim, block)
    scope = _scope_of(ancestors, prim, block)
    children = tree.child_block_realizes(scope)
    if consumer_names is None:
        consumers = [c.block.name for c in children if _reads(c, buf) and not _writes(c, buf)]
    else:
        consumers = list(dict.fromkeys(consumer_names))
        by_name = {c.block.name: c for c in children}
        for name in consumers:
            c = by_name.get(name)
            if c is None:
                raise ScheduleError(prim, f"block {block_name}: consumer block {name!r} is not in "
                                    f"the same scope (block {scope.name})", block)
            if not _reads(c, buf):
                raise ScheduleError(prim, f"block {block_name}: consumer block {name!r} does not "
                                    f"read {buf.name}", block)
    for name in consumers:
        c = next(x for x in children if x.block.name == name)
        if _writes(c, buf):
            raise ScheduleError(prim, f"block {name} both reads and writes {buf.name}; a cache of "
                                f"it would go stale", c.block)
    cset = set(consumers)
    order = [c.block.name for c in children]
    first = min(order.index(n) for n in consumers)
    writers = {c.block.name for c in children[:first] if _writes(c, buf)}
    path, pos = _find_insert(scope.body, lambda b: b.block.name in writers,
                             lambda b: b.block.name in cset, True, prim,
                             f"block {block_name}, buffer {buf.name}")
    ana = arith.Analyzer()
    region = None
    if path:  # inside loops shared with the producer: copy what the producer wrote there
        region = _relaxed_write_region(path[-1].body, buf, lambda b: b.block.name in writers, ana)
    if region is None:
        region = [Range(IntImm(0, "int64"), s) for s in buf.shape]
    name = unique_name(func, f"{buf.name}_{storage_scope}")
    cache = Buffer(name, buf.shape, dtype, scope=storage_scope, align=buf.align)
    nest = _copy_nest(name, buf, cache, region)
    body = _insert(scope.body, path, pos, nest)
    if dtype != buf.dtype:
        body = _WidenRedirect(cset, buf, cache, prim).visit(body)
    else:
        body = _Redirect(cset, buf, cache).visit(body)
    new_scope = scope.replace(body=body, alloc_buffers=scope.alloc_buffers + (cache,))
    return tree.replace(func, scope, new_scope), name


def cache_write(func: PrimFunc, block_name: str, write_buffer_index: int, storage_scope: str,
                consumer_names: Sequence[str] | None = None) -> tuple[PrimFunc, str]:
    """See ``Schedule.cache_write``; returns the new function and the write-back block's name."""
    prim = "cache_write"
    br, ancestors = tree.find_block(func, block_name)
    block = br.block
    buf = block_buffer(block, write_buffer_index, "write", prim)
    check_scope(storage_scope, prim, block)
    scope = _scope_of(ancestors, prim, block)
    children = tree.child_block_realizes(scope)
    order = [c.block.name for c in children]
    me = order.index(block_name)
    redirected = list(dict.fromkeys(consumer_names or ()))
    for name in redirected:
        if name not in order:
            raise ScheduleError(prim, f"block {block_name}: consumer block {name!r} is not in the "
                                f"same scope (block {scope.name})", block)
        c = children[order.index(name)]
        if order.index(name) < me or not _reads(c, buf):
            raise ScheduleError(prim, f"block {block_name}: block {name!r} is not a consumer of "
                                f"{buf.name} after it", block)
    readers = {c.block.name for c in children[me + 1:]
               if _reads(c, buf) and c.block.name not in redirected}
    path, pos = _find_insert(scope.body, lambda b: b.block.name == block_name,
                             lambda b: b.block.name in readers, False, prim,
                             f"block {block_name}, buffer {buf.name}")
    ana = arith.Analyzer()
    inner = path[-1].body if path else scope.body
    here = next(s for s in _items(inner) if any(b is br for b in _blocks_in(s)))
    region = _relaxed_write_region(here, buf, lambda b: b is br, ana)
    if region is None:
        raise ScheduleError(prim, f"block {block_name}: cannot state the region of {buf.name} it "
                            f"writes at the place the write-back would go", block)
    name = unique_name(func, f"{buf.name}_{storage_scope}")
    cache = Buffer(name, buf.shape, buf.dtype, scope=storage_scope, align=buf.align)
    nest = _copy_nest(name, cache, buf, region)
    body = _insert(scope.body, path, pos, nest)
    body = _Redirect({block_name, *redirected}, buf, cache).visit(body)
    new_scope = scope.replace(body=body, alloc_buffers=scope.alloc_buffers + (cache,))
    return tree.replace(func, scope, new_scope), name


def set_scope(func: PrimFunc, block_name: str, buffer_index: int, storage_scope: str) -> PrimFunc:
    """See ``Schedule.set_scope``."""
    prim = "set_scope"
    br, _ = tree.find_block(func, block_name)
    buf = block_buffer(br.block, buffer_index, "write", prim)
    check_scope(storage_scope, prim, br.block)
    if is_param(func, buf) or allocating_block(func, buf) is None:
        raise ScheduleError(prim, f"block {block_name}: cannot change the scope of an argument "
                            f"buffer ({buf.name}); cache_write it to a new buffer instead",
                            br.block)
    if buf.scope == storage_scope:
        return func
    new = Buffer(buf.name, buf.shape, buf.dtype, buf.strides, storage_scope, buf.align)
    return replace_buffers_in_func(func, {buf: new})


def aligned_strides(shape: Sequence[PrimExpr], aligns: dict[int, tuple[int, int]]) -> list:
    """Row-major strides with the stride of each axis in ``aligns`` ({axis: (factor, offset)})
    padded up to ``k * factor + offset`` (TVM's storage_align rule)."""
    ana = arith.Analyzer()
    stride: PrimExpr = IntImm(1, "int64")
    out = [None] * len(shape)
    for d in reversed(range(len(shape))):
        if d in aligns:
            factor, offset = aligns[d]
            stride = ana.simplify(stride + (factor + offset - stride % factor) % factor)
        out[d] = stride
        stride = ana.simplify(stride * convert(shape[d]).astype("int64"))
    return out


def storage_align(func: PrimFunc, block_name: str, buffer_index: int, axis: int, factor: int,
                  offset: int) -> PrimFunc:
    """See ``Schedule.storage_align``."""
    prim = "storage_align"
    br, _ = tree.find_block(func, block_name)
    block = br.block
    buf = block_buffer(block, buffer_index, "write", prim)
    if is_param(func, buf) or allocating_block(func, buf) is None:
        raise ScheduleError(prim, f"block {block_name}: cannot align {buf.name}, an argument "
                            f"buffer (its layout is the caller's); only intermediate buffers",
                            block)
    for what, v in (("axis", axis), ("factor", factor), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ScheduleError(prim, f"block {block_name}: {what} must be an int, got {v!r}", block)
    if not 0 <= axis < buf.ndim:
        raise ScheduleError(prim, f"block {block_name}: axis {axis} is out of range for "
                            f"{buf.name}, which has {buf.ndim} dimension(s)", block)
    if factor <= 0 or not 0 <= offset < factor:
        raise ScheduleError(prim, f"block {block_name}: need factor > 0 and 0 <= offset < factor, "
                            f"got factor={factor}, offset={offset}", block)
    # TVM's annotation: one list per write buffer of [axis, factor, offset] entries
    ann = dict(block.annotations)
    old = ann.get("buffer_dim_align", ())
    per_buffer = [list(old[k]) if k < len(old) else [] for k in range(len(block.writes))]
    per_buffer[buffer_index] = [e for e in per_buffer[buffer_index] if e[0] != axis]
    per_buffer[buffer_index].append((axis, factor, offset))
    per_buffer[buffer_index].sort()
    ann["buffer_dim_align"] = tuple(tuple(tuple(e) for e in entries) for entries in per_buffer)
    func = tree.replace(func, block, block.replace(annotations=ann))
    aligns = {a: (f, o) for a, f, o in per_buffer[buffer_index]}
    strides = aligned_strides(buf.shape, aligns)
    new = Buffer(buf.name, buf.shape, buf.dtype, strides, buf.scope, buf.align)
    return replace_buffers_in_func(func, {buf: new})


class _LayoutRewriter(IRMutator):
    def __init__(self, old: Buffer, new: Buffer, index_map: IndexMap):
        super().__init__()
        self.buffer_map[old] = new
        self.old, self.new, self.map = old, new, index_map
        self.ana = arith.Analyzer()

    def visit_Block(self, block: Block):
        for iv in block.iter_vars:
            self.ana.bind(iv.var, iv.dom)
        return self.generic_visit(block)

    def visit_BufferLoad(self, e: BufferLoad):
        if e.buffer is not self.old:
            return self.generic_visit(e)
        indices = [self.visit(i) for i in e.indices]
        return BufferLoad(self.new, self.map.map_indices(indices, self.ana))

    def visit_BufferStore(self, s: BufferStore):
        if s.buffer is not self.old:
            return self.generic_visit(s)
        indices = [self.visit(i) for i in s.indices]
        return BufferStore(self.new, self.visit(s.value), self.map.map_indices(indices, self.ana))

    def visit_BufferRegion(self, r: BufferRegion):
        if r.buffer is not self.old:
            return self.generic_visit(r)
        ranges = self.map.map_ranges(r.region, self.ana)
        if ranges is None:
            ranges = [Range(IntImm(0, "int64"), s) for s in self.new.shape]
        return BufferRegion(self.new, ranges)


def _resolve_free_vars(func: PrimFunc, index_map: IndexMap, prim: str, block: Block) -> IndexMap:
    """Match the map's free variables (shape dims ...) with the function's, by identity or name
    (a map read back from a trace has new Vars of the same names)."""
    known: dict[str, Var] = {}
    ids = set()
    for v in func.scalar_params:
        known.setdefault(v.name, v)
        ids.add(id(v))
    for b in func.buffers + [b for s, _ in tree.walk(func.body) if isinstance(s, Block)
                             for b in s.alloc_buffers]:
        for e in tuple(b.shape) + tuple(b.strides or ()):
            for v in free_vars(e):
                known.setdefault(v.name, v)
                ids.add(id(v))
    vmap = {}
    for v in index_map.free_vars():
        if id(v) in ids:
            continue
        if v.name in known and known[v.name].dtype == v.dtype:
            vmap[v] = known[v.name]
        else:
            raise ScheduleError(prim, f"block {block.name}: the index map {index_map} uses the "
                                f"variable {v.name}, which is not a variable of the function",
                                block)
    return index_map.substitute_free(vmap)


def transform_layout(func: PrimFunc, block_name: str, buffer_index: int, index_map: IndexMap,
                     buffer_index_type: str = "write", pad_value=None) -> PrimFunc:
    """See ``Schedule.transform_layout``."""
    prim = "transform_layout"
    br, ancestors = tree.find_block(func, block_name)
    block = br.block
    if buffer_index_type not in ("read", "write"):
        raise ScheduleError(prim, f"block {block_name}: buffer_index_type must be 'read' or "
                            f"'write', got {buffer_index_type!r}", block)
    buf = block_buffer(block, buffer_index, buffer_index_type, prim)
    if not isinstance(index_map, IndexMap):
        raise ScheduleError(prim, f"block {block_name}: expected an IndexMap or a function of the "
                            f"indices, got {index_map!r}", block)
    if index_map.ndim_in != buf.ndim:
        raise ScheduleError(prim, f"block {block_name}: the index map {index_map} takes "
                            f"{index_map.ndim_in} indices but {buf.name} has {buf.ndim} "
                            f"dimension(s)", block)
    if buf.strides is not None:
        raise ScheduleError(prim, f"block {block_name}: {buf.name} has explicit strides "
                            f"(storage_align); transform its layout before aligning it", block)
    index_map = _resolve_free_vars(func, index_map, prim, block)
    try:
        new_shape = index_map.map_shape(buf.shape)
    except Exception as err:  # TIRError from the map: unbounded or negative new indices
        raise ScheduleError(prim, f"block {block_name}, buffer {buf.name}: {err}", block) from None
    pad_nest = None
    if pad_value is not None:
        if buffer_index_type != "write":
            raise ScheduleError(prim, f"block {block_name}: pad_value needs the block that writes "
                                f"{buf.name} (buffer_index_type='write')", block)
        try:
            inv, pad = index_map.non_surjective_inverse(buf.shape)
        except Exception as err:
            raise ScheduleError(prim, f"block {block_name}: pad_value needs an invertible map: "
                                f"{err}", block) from None
        if not (isinstance(pad, IntImm) and pad.value == 0):
            pad_nest = (inv, pad)
    new = Buffer(buf.name, new_shape, buf.dtype, None, buf.scope, buf.align)
    rw = _LayoutRewriter(buf, new, index_map)
    body = rw.visit(func.body)
    bmap = {p: rw.visit(b) for p, b in func.buffer_map}
    out = func.replace(body=body, buffer_map=bmap)
    if pad_nest is not None:
        out = _add_pad_block(out, block_name, new, pad_nest[0], pad_nest[1], pad_value, prim)
    return out


def _add_pad_block(func: PrimFunc, block_name: str, buf: Buffer, inv: IndexMap, pad: PrimExpr,
                   pad_value, prim: str) -> PrimFunc:
    """After the statement holding ``block_name`` (in its scope), fill the padding of ``buf``."""
    br, ancestors = tree.find_block(func, block_name)
    scope = _scope_of(ancestors, prim, br.block)
    value = convert(pad_value)
    if isinstance(value, (IntImm, FloatImm)) and value.dtype != buf.dtype:
        value = FloatImm(float(value.value), buf.dtype) if buf.dtype.startswith(("float", "bfloat")) \
            else IntImm(int(value.value), buf.dtype)
    if value.dtype != buf.dtype:
        raise ScheduleError(prim, f"block {block_name}: pad_value {pad_value!r} does not fit "
                            f"{buf.name} ({buf.dtype})", br.block)
    name = unique_name(func, f"{buf.name}_pad")
    loops = [Var(f"ax{d}", "int64") for d in range(buf.ndim)]
    ivars = [Var(f"v{d}", "int64") for d in range(buf.ndim)]
    pred = substitute(pad, dict(zip(inv.initial_indices, loops)))
    point = [Range(v, IntImm(1, "int64")) for v in ivars]
    block = Block(name, [IterVar(v, Range(IntImm(0, "int64"), s), "spatial")
                         for v, s in zip(ivars, buf.shape)],
                  [], [BufferRegion(buf, point)], BufferStore(buf, value, ivars))
    stmt: Stmt = BlockRealize(loops, pred, block)
    for ax, s in reversed(list(zip(loops, buf.shape))):
        stmt = For(ax, IntImm(0, "int64"), s, "serial", stmt)
    path, pos = _find_insert(scope.body, lambda b: b.block.name == block_name, lambda b: False,
                             False, prim, f"block {block_name}")
    new_scope = scope.replace(body=_insert(scope.body, path, pos, stmt))
    return tree.replace(func, scope, new_scope)


def _parse_buffer_arg(block: Block, buffer, buffer_index_type: str, prim: str) -> tuple[int, str]:
    """``buffer`` as (index, "read"|"write"): an int, TVM's ("write", 0), or a buffer name."""
    if isinstance(buffer, (tuple, list)):
        if len(buffer) != 2 or buffer[0] not in ("read", "write"):
            raise ScheduleError(prim, f"block {block.name}: a buffer is ('read'|'write', index), "
                                f"got {buffer!r}", block)
        return buffer[1], buffer[0]
    if isinstance(buffer, str):
        for kind, regions in (("write", block.writes), ("read", block.reads)):
            for k, r in enumerate(regions):
                if r.buffer.name == buffer:
                    return k, kind
        raise ScheduleError(prim, f"block {block.name} does not access a buffer named "
                            f"{buffer!r}", block)
    return buffer, buffer_index_type


def _callable_index_map(method):
    """Let ``transform_layout`` take a plain function of the indices (converted to an IndexMap
    before the call is traced, so the trace stores the map as data)."""

    @functools.wraps(method)
    def wrapper(self, block, buffer_index, index_map, buffer_index_type="write", pad_value=None):
        if not isinstance(index_map, IndexMap) and callable(index_map):
            index_map = IndexMap.from_func(index_map)
        # TVM's ("read", 1) form: record it as index and kind
        if isinstance(buffer_index, (tuple, list)) and len(buffer_index) == 2 \
                and buffer_index[0] in ("read", "write"):
            buffer_index, buffer_index_type = buffer_index[1], buffer_index[0]
        return method(self, block, buffer_index, index_map, buffer_index_type, pad_value)

    return wrapper


# =============================================================================================
# the mixin


class MemoryPrimitives:
    """Mixin of ``Schedule``: cache_read, cache_write, set_scope, storage_align, transform_layout."""

    def _block_names(self, blocks, primitive: str) -> list[str] | None:
        if blocks is None:
            return None
        if isinstance(blocks, BlockRV):
            blocks = [blocks]
        return [self._block(b, primitive)[0].block.name for b in blocks]

    @traced
    def cache_read(self, block: BlockRV, read_buffer_index: int, storage_scope: str,
                   consumer_blocks: Sequence[BlockRV] | None = None,
                   dtype: str | None = None) -> BlockRV:
        """Read a buffer through a cache of scope ``storage_scope``.

        A new block ``<buffer>_<scope>`` copies ``block.reads[read_buffer_index]``'s buffer into
        a new buffer of that scope, allocated in the block's scope (the root block, usually). It
        is placed right before the first consumer (after the buffer's producer); at the root
        level it copies the whole buffer, and ``compute_at`` can then move it under the
        consumer's loops, which narrows the copy. The consumers (``consumer_blocks``; by default
        every block of the scope that reads the buffer) read the copy.

        Parameters
        ----------
        block : BlockRV
            A consumer of the buffer.
        read_buffer_index : int
            Index of the buffer in ``block``'s reads.
        storage_scope : str
            ``"global"``, ``"shared"`` or ``"local"``.
        consumer_blocks : list of BlockRV, optional
            The blocks that should read the cache (default: all consumers).
        dtype : str, optional
            The cache's dtype (default: the buffer's). Another dtype is a widening cache: only
            an exact conversion (``float16`` -> ``float32``), and only where every read of the
            buffer in the consumers converts it to that dtype (a float16 GEMM operand
            multiplied in float32: converted once as it is cached instead of at every
            multiply-add); the copy converts, the consumers read the converted values.

        Returns
        -------
        BlockRV
            The cache block.

        Raises
        ------
        ScheduleError
            A conversion that loses values, or a consumer that reads the buffer unconverted.

        Examples
        --------
        Before::

            for i, j in T.grid(128, 128):
                with T.block("B"):
                    B[vi, vj] = A[vi, vj] * 2.0

        ``sch.cache_read(sch.get_block("B"), 0, "local")``::

            A_local = T.alloc_buffer((128, 128), "float32", scope="local")
            for ax0, ax1 in T.grid(128, 128):
                with T.block("A_local"):
                    A_local[v0, v1] = A[v0, v1]
            for i, j in T.grid(128, 128):
                with T.block("B"):
                    B[vi, vj] = A_local[vi, vj] * 2.0
        """
        br, _ = self._block(block, "cache_read")
        names = self._block_names(consumer_blocks, "cache_read")
        func, name = cache_read(self.func, br.block.name, read_buffer_index, storage_scope, names,
                                dtype)
        self._set_func(func)
        return self._block_rv(name)

    @traced
    def cache_write(self, block: BlockRV, write_buffer_index: int, storage_scope: str,
                    consumer_blocks: Sequence[BlockRV] | None = None) -> BlockRV:
        """Write a buffer through a cache of scope ``storage_scope``.

        ``block`` writes (and, for a reduction, accumulates in) a new buffer
        ``<buffer>_<scope>``; a new block of that name, right after it, copies the region the
        block writes back into the original buffer. Consumers keep reading the original, except
        ``consumer_blocks``, which read the cache directly.

        Parameters
        ----------
        block : BlockRV
            The producer of the buffer.
        write_buffer_index : int
            Index of the buffer in ``block``'s writes.
        storage_scope : str
            ``"global"``, ``"shared"`` or ``"local"``.
        consumer_blocks : list of BlockRV, optional
            Consumers that should read the cache instead of the original.

        Returns
        -------
        BlockRV
            The write-back block.

        Examples
        --------
        Before::

            for i, j in T.grid(128, 128):
                with T.block("B"):
                    B[vi, vj] = A[vi, vj] * 2.0

        ``sch.cache_write(sch.get_block("B"), 0, "local")``::

            B_local = T.alloc_buffer((128, 128), "float32", scope="local")
            for i, j in T.grid(128, 128):
                with T.block("B"):
                    B_local[vi, vj] = A[vi, vj] * 2.0
            for ax0, ax1 in T.grid(128, 128):
                with T.block("B_local"):
                    B[v0, v1] = B_local[v0, v1]
        """
        br, _ = self._block(block, "cache_write")
        names = self._block_names(consumer_blocks, "cache_write")
        func, name = cache_write(self.func, br.block.name, write_buffer_index, storage_scope,
                                 names)
        self._set_func(func)
        return self._block_rv(name)

    @traced
    def set_scope(self, block: BlockRV, buffer_index: int, storage_scope: str) -> None:
        """Set the storage scope of an intermediate buffer that ``block`` writes.

        Parameters
        ----------
        block : BlockRV
            A block writing the buffer.
        buffer_index : int
            Index of the buffer in ``block``'s writes.
        storage_scope : str
            ``"global"``, ``"shared"`` or ``"local"``.

        Raises
        ------
        ScheduleError
            For a parameter buffer ("cannot change the scope of an argument buffer").

        Examples
        --------
        Before::

            B = T.alloc_buffer((128, 128), "float32")

        ``sch.set_scope(sch.get_block("B"), 0, "shared")``::

            B = T.alloc_buffer((128, 128), "float32", scope="shared")
        """
        br, _ = self._block(block, "set_scope")
        self._set_func(set_scope(self.func, br.block.name, buffer_index, storage_scope))

    @traced
    def storage_align(self, block: BlockRV, buffer_index: int, axis: int, factor: int,
                      offset: int) -> None:
        """Pad the stride of one axis of an intermediate buffer to ``k * factor + offset``.

        The usual use is avoiding shared-memory bank conflicts. The request is recorded, as in
        TVM, in the block annotation ``"buffer_dim_align"`` (one list of ``(axis, factor,
        offset)`` per write buffer), and applied at once by giving the buffer explicit
        ``strides``, which lowering (``FlattenBuffers``) uses to linearize its indices and size
        its allocation. Intermediate buffers only.

        Parameters
        ----------
        block : BlockRV
            The block writing the buffer.
        buffer_index : int
            Index of the buffer in ``block``'s writes.
        axis : int
            The dimension whose stride is padded.
        factor, offset : int
            The stride becomes the smallest ``k * factor + offset`` at least the compact one.

        Examples
        --------
        Before::

            B = T.alloc_buffer((128, 128), "float32")

        ``sch.storage_align(sch.get_block("B"), 0, axis=0, factor=128, offset=1)``::

            B = T.alloc_buffer((128, 128), "float32", strides=(129, 1))
            ...
                with T.block("B"):
                    T.block_attr({"buffer_dim_align": (((0, 128, 1),),)})
        """
        br, _ = self._block(block, "storage_align")
        self._set_func(storage_align(self.func, br.block.name, buffer_index, axis, factor, offset))

    @_callable_index_map
    @traced
    def transform_layout(self, block: BlockRV, buffer_index, index_map: IndexMap | Callable,
                         buffer_index_type: str = "write", pad_value=None) -> None:
        """Change a buffer's layout: element ``idx`` moves to ``index_map(idx)``.

        The buffer gets the shape ``index_map.map_shape(shape)`` and every access to it in the
        function (loads, stores and block regions, in every block) is rewritten through the map
        and simplified. For a *parameter* buffer this changes the function's signature, as in
        TVM: callers must pass the data in the new layout. A map that does not divide the shape
        (``i // 16`` over 40 rows) rounds the new extent up (ceildiv); the extra elements are
        padding that no access reads. With ``pad_value``, a block ``<buffer>_pad`` after the
        producer fills the padding with that value (maps with an affine inverse only).

        Parameters
        ----------
        block : BlockRV
            A block accessing the buffer.
        buffer_index : int | tuple[str, int] | str
            Index in the block's writes (or reads, see ``buffer_index_type``); TVM's
            ``("write", 0)`` / ``("read", 1)`` form, or the buffer's name.
        index_map : IndexMap | callable
            The map, e.g. ``lambda k, n: [n // 16, k, n % 16]``.
        buffer_index_type : str
            ``"write"`` or ``"read"``, when ``buffer_index`` is an int.
        pad_value : int | float, optional
            Value written into the padding.

        Examples
        --------
        Before (a matmul reading the weight ``B[k, n]``)::

            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

        ``sch.transform_layout(sch.get_block("C"), ("read", 1), lambda k, n: [n // 16, k, n % 16])``::

            def main(A: T.Buffer((64, 32)), B: T.Buffer((4, 32, 16)), C: T.Buffer((64, 64))):
                ...
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vj // 16, vk, vj % 16]
        """
        br, _ = self._block(block, "transform_layout")
        index, kind = _parse_buffer_arg(br.block, buffer_index, buffer_index_type,
                                        "transform_layout")
        self._set_func(transform_layout(self.func, br.block.name, index, index_map, kind,
                                        pad_value))
