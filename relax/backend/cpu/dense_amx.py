"""The int8 dense kernel (``dense_int8``, rule ``RULE_DENSE_U8I8``) on Intel AMX tiles.

Chosen by ``dense_int8``'s schedule where the target has ``amx-int8`` (``Target.amx_int8``:
the host when its CPU has it, ``-mattr=+amx-int8``; ``-mattr=-amx-int8`` turns it off) and
the panel width is a multiple of 16 (every AVX-512 panel). The operands keep the VNNI kernel's
layouts, padded along K to whole 64-byte tiles (``amx_words``; ``AlterOpImpl`` packs them so):
the activations' rows of words are A tiles (16 rows x 64 bytes), and each 16-word step of a
weight panel ``[K/4, NR]`` is a B tile per 16 columns (16 rows of K-quads x 64 bytes).

The schedule: panels outermost (parallel), then blocks of ``ROWS`` = 32 rows; per block, the
``32 x NR`` int32 accumulators on the stack are zeroed (the reduction's init), one
``AMX_U8I8`` call (``targets.llvm.amx``) adds the whole reduction to them — per pair of
16-column tiles, 2 x 2 C tiles in the tile registers across all of K, stored once — and the
write-back computes the fused epilogue (dequantize, bias, GELU, residual) from them,
vectorized. The last block of a symbolic or ragged row count passes its row count (1..32).
The symbolic small version of a layer (``gemv_rows``) and fewer than ``AMX_MIN_ROWS``
constant rows keep the VNNI kernels.

Examples
--------
>>> amx_words(768), amx_words(70)
(192, 32)
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir.expr import AMX_U8I8, BufferLoad, Call, IntImm, Min, PrimExpr
from tilecraft.tensorir.functor import IRMutator, post_order_visit, substitute
from tilecraft.tensorir.schedule import Schedule, tree
from tilecraft.tensorir.stmt import Evaluate, For

from .geometry import ceil_div
from .params import num_cores
from .schedule_utils import ann_int, finish_tile_block, fuse_epilogue, loop_extent, tile_tail

__all__ = ["ROWS", "AMX_MIN_ROWS", "amx_applies", "amx_words", "schedule_dense_amx", "uses_amx"]

ROWS = 32          # rows of a block: two 16-row tiles
AMX_MIN_ROWS = 16  # fewer constant rows keep the VNNI kernel (a symbolic count takes AMX)


def amx_applies(target: Target, width: int) -> bool:
    """Whether ``dense_int8``'s kernel with panels of ``width`` columns runs on AMX tiles.

    Examples
    --------
    >>> amx_applies(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids"), 64)
    True
    >>> amx_applies(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"), 64)
    False
    """
    return target.amx_int8 and width % 16 == 0


def amx_words(k: int) -> int:
    """The words (4 bytes each) of a ``k``-long reduction padded to whole 64-byte tiles."""
    return 16 * ceil_div(ceil_div(k, 4), 16)


def uses_amx(func) -> bool:
    """Whether the scheduled ``func`` calls the AMX block kernel. Such a kernel is not tuned
    (``relax.extract_tasks`` leaves it out): the call replaces a loop nest outside the
    schedule's trace, which the tuner's records could not reproduce.

    Examples
    --------
    >>> uses_amx(te.create_prim_func([te.placeholder((4,), "float32", "x")]))   # doctest: +SKIP
    False
    """
    found = []
    post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, Call) and
                     n.op == AMX_U8I8 else None)
    return bool(found)


class _ReplaceLoop(IRMutator):
    """The loop over ``var`` replaced by ``stmt``."""

    def __init__(self, var, stmt):
        super().__init__()
        self.var, self.stmt = var, stmt

    def visit_For(self, s: For):
        if s.loop_var is self.var:
            return self.stmt
        return self.generic_visit(s)


def _operands(sch: Schedule, block_rv) -> tuple:
    """The accumulator store and the activation and weight loads of the reduction block
    ``acc[..] = acc[..] + dot4_u8i8(words[..], weight[..])``, their indices in terms of the
    loops (the block's iter vars replaced by their bindings)."""
    block = sch.get(block_rv)
    realize, _ = tree.find_block(sch.func, block.name)
    binding = {iv.var: v for iv, v in zip(block.iter_vars, realize.iter_values)}
    store = block.body
    words, weight = store.value.b.args
    return [(load.buffer, [substitute(i, binding) for i in load.indices])
            for load in (store, words, weight)]


def schedule_dense_amx(sch: Schedule, name: str, target: Target) -> None:
    """Schedule the ``dense_u8i8`` block ``name`` on AMX tiles (see the module docstring)."""
    block = sch.get_block(name)
    width = ann_int(sch.get(block), "width")
    *lead, i, j, k = sch.get_loops(block)
    m = sch.get(i).extent
    k_words = loop_extent(sch.get(k))
    if k_words is None or k_words % 16 or width % 16:
        raise ValueError(f"{name}: the AMX kernel needs K in whole 16-word tiles and panels "
                         f"of whole 16 columns (K words {k_words}, panel {width})")
    jo, ji = sch.split(j, [None, width])
    io, ii = sch.split(i, [None, ROWS])
    sch.reorder(jo, *lead, io, ii, ji, k)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, io)
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, ii)
    outer = len(sch.get_loops(init)) - 2
    finish_tile_block(sch, init, outer)
    # the write-back's rows stay a loop: the accumulators are in memory (not registers) here,
    # and 32 unrolled rows of a GELU epilogue made a 200 KB kernel that ran from beyond L1i
    sch.vectorize(tile_tail(sch, acc, outer)[-1])
    panels = loop_extent(sch.get(jo)) or 1
    if panels >= 2 * num_cores(target) or (loop_extent(sch.get(io)) or 2) < 2:
        sch.parallel(jo)
    else:
        sch.parallel(io)
    # the reduction's loop nest becomes one call of the AMX block kernel; its zeroed
    # accumulators and the write-back stay as scheduled
    io_v, ii_v, ji_v, k_v = (sch.get(rv).loop_var for rv in (io, ii, ji, k))
    (acc_buf, acc_idx), (a_buf, a_idx), (w_buf, w_idx) = _operands(sch, block)
    first = {ii_v: IntImm(0, ii_v.dtype), ji_v: IntImm(0, ji_v.dtype),
             k_v: IntImm(0, k_v.dtype)}

    def at(buf, idx):
        return BufferLoad(buf, [substitute(x, first) for x in idx])

    dtype = io_v.dtype
    m = m if m.dtype == dtype else m.astype(dtype)
    rows: PrimExpr = Min(IntImm(ROWS, dtype), m - io_v * IntImm(ROWS, dtype))
    call = Call("int32", AMX_U8I8, [at(acc_buf, acc_idx), at(a_buf, a_idx), at(w_buf, w_idx),
                                    rows, k_words, width, width, k_words // 16, width // 16])
    func = sch.func
    body = _ReplaceLoop(ii_v, Evaluate(call)).visit(func.body)
    # no schedule primitive puts a call in place of a loop nest (tensorize matches a fixed
    # tile, not a ragged last block): the function is replaced outside the trace, which is
    # why relax.extract_tasks leaves these kernels out (uses_amx)
    sch._set_func(func.replace(body=body))
