"""The int4 weight-only GEMV of the GPU targets: ``relax.dense_q4`` (plus a fused bias) for the
few rows of token-by-token decoding, as a scheduled TensorIR function.

The weight is repacked at build time (``pack_q4_words``) as 32-bit words along the reduction:
``words[j, w]`` holds the codes of column ``j`` at ``k = 8 w .. 8 w + 7``, nibble ``e`` (bits
``4e .. 4e + 3``) for ``k = 8 w + e``; the group scales (and offsets, unless symmetric) as
``[N, ceil(K/G)]`` float32 rows. The kernel:

* one work-group per block of ``cols`` output columns (``blockIdx.x``) and row of the
  activation (``blockIdx.y``: the lead dims fused, symbolic ones included); the columns per
  work-group halved until the kernel has ``GEMV_MIN_GROUPS`` work-groups (twice an H100's
  multiprocessors: GPT-2's 768 x 768 layer had 96 of 256 threads before);
* per column (``threadIdx.y``) ``split`` threads share the reduction (``threadIdx.x``), each
  splitting a word into its 8 nibbles in registers (unsigned division and remainder by
  powers of two: a shift and a mask each) and accumulating in float32: symmetric codes as
  ``s * sum_e x[8w+e] (q_e - 8)``, codes with an offset as ``s * sum_e x q_e + o * sum_e x``
  (one multiply-add of the group's scale and offset per word, not per code);
* one row (static 1, or symbolic: decoding) with a whole number of 4-word runs per column
  (``K`` a multiple of 32) and a split dividing them: the reduction factored into per-thread
  partial sums (``rfactor``) so that each k-step loads 4 words as one 16-byte ``uint4`` (32
  codes) and the 32 activations beside them as 8 ``float4`` through register fragments (a
  thread read one 32-bit word and 8 scalar activations per step before); the partials meet
  in a tree in shared memory;
* otherwise (a static row count of 2 to 16, ragged ``K``): a word per step, thread ``t``
  reading words ``t, t + split, ...`` of its column (a warp reads consecutive words:
  coalesced), the reduction a cross-thread reduction directly; a static row count of 2 or more
  puts up to 4 rows in a work-group (``threadIdx.z``) sharing the words read;
* the ``split`` partial sums meet in a tree in shared memory (``LowerCrossThreadReduction``);
  the bias is added in the write-back.

No dequantized weight is ever written: the kernel reads ``K N / 2`` bytes of codes (an eighth
of the float32 weight's bytes, a quarter of a float16 weight's), the scales and the activation
rows.

Examples
--------
>>> from tilecraft.targets import Target
>>> from tilecraft.tensorir import Var
>>> spec = Q4GemvSpec(lead=(Var("n"),), k=768, n=2304, group_size=128, symmetric=True,
...                   bias=True)
>>> f = dense_q4_gemv_kernel(spec, Target("opencl"))
>>> sorted({lp.thread_tag for lp in _thread_loops(f)})
['blockIdx.x', 'blockIdx.y', 'threadIdx.x', 'threadIdx.y']
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.stmt import For

from .gemv import (GEMV_MIN_GROUPS, GEMV_UNROLL_STEPS, GEMV_WARP, _divisor_near, _pow2_at_most,
                   _serial_loop_of)

__all__ = ["Q4GemvSpec", "dense_q4_gemv_kernel", "dense_q4_gemv_compute", "pack_q4_words",
           "gemv_tile", "vector_tile", "static_rows", "Q4_GEMV_THREADS", "Q4_GEMV_MAX_ROWS",
           "Q4_WORD_VECTOR", "NIBBLES"]

NIBBLES = 8             # codes per 32-bit word
Q4_GEMV_THREADS = 256   # threads per work-group: rows * cols * split
Q4_GEMV_MAX_ROWS = 16   # static rows up to which the GEMV kernel is used (decoding batches)
Q4_WORD_VECTOR = 4      # words per load of the one-row kernel (a uint4: 32 codes)


@dataclass(frozen=True)
class Q4GemvSpec:
    """One int4 GEMV: ``x`` ``(*lead, k)`` float32 times the int4 weight ``(k, n)`` in groups of
    ``group_size`` along ``k``; ``symmetric``: offsets are ``-8 * scale`` (not stored);
    ``bias``: a float32 ``(n,)`` added to the output."""
    lead: tuple
    k: int
    n: int
    group_size: int
    symmetric: bool = True
    bias: bool = False

    @property
    def words(self) -> int:
        return -(-self.k // NIBBLES)

    @property
    def groups(self) -> int:
        return -(-self.k // self.group_size)


def pack_q4_words(codes: np.ndarray, k: int) -> np.ndarray:
    """The codes of ``relax.dense_q4`` (``(ceil(K/2), N)`` bytes, the even ``k`` in the low
    nibble) as words ``(N, ceil(K/8))`` uint32: nibble ``e`` of ``words[j, w]`` is the code of
    ``k = 8 w + e`` (0 beyond ``K``).

    Examples
    --------
    >>> pack_q4_words(np.array([[0x21], [0x43], [0x65], [0x87]], np.uint8), 8).tolist()
    [[2271560481]]
    >>> hex(2271560481)
    '0x87654321'
    """
    codes = np.asarray(codes, np.uint8)
    n = codes.shape[1]
    q = np.zeros((2 * codes.shape[0], n), np.uint32)
    q[0::2] = codes & 15
    q[1::2] = codes >> 4
    q = q[:k]
    words = -(-k // NIBBLES)
    padded = np.zeros((words * NIBBLES, n), np.uint32)
    padded[:k] = q
    per_word = padded.reshape(words, NIBBLES, n)
    out = np.zeros((words, n), np.uint32)
    for e in range(NIBBLES):
        out |= per_word[:, e, :] << np.uint32(4 * e)
    return np.ascontiguousarray(out.T)


def static_rows(spec: Q4GemvSpec) -> int | None:
    """The number of rows (the product of the lead dims) when constant, else None."""
    n = 1
    for d in spec.lead:
        if not isinstance(d, (int, IntImm)):
            return None
        n *= int(d.value if isinstance(d, IntImm) else d)
    return n


def gemv_tile(spec: Q4GemvSpec) -> tuple[int, int, int]:
    """``(rows, cols, split)``: activation rows and output columns per work-group, threads per
    column and row (``rows * cols * split = Q4_GEMV_THREADS``). ``split`` gives each thread
    about four words of a column (a power of two from 8 to 64): short reductions get more
    columns per work-group, long ones more threads per column. A static row count of 2 or more
    puts up to 4 rows in a work-group (``threadIdx.z``): their threads read the same words, so
    the weight comes from the cache the work-group shares rather than once per row; a symbolic
    row count (decoding: mostly 1) takes one row per work-group.

    Examples
    --------
    >>> gemv_tile(Q4GemvSpec((1,), 768, 2304, 128)), gemv_tile(Q4GemvSpec((1,), 3072, 768, 128))
    ((1, 8, 32), (1, 2, 64))
    >>> gemv_tile(Q4GemvSpec((16,), 768, 768, 128))
    (4, 2, 32)
    """
    split = 8
    while split < 64 and split * 4 < spec.words:
        split *= 2
    m = static_rows(spec)
    rows = 1
    while m is not None and rows < 4 and rows * 2 <= m:
        rows *= 2
    cols = Q4_GEMV_THREADS // (split * rows)
    while cols > 1 and -(-spec.n // cols) * -(-(m or 1) // rows) < GEMV_MIN_GROUPS:
        cols //= 2
    return rows, cols, split


def vector_tile(spec: Q4GemvSpec) -> tuple[int, int] | None:
    """``(cols, split)`` of the one-row kernel that loads ``Q4_WORD_VECTOR`` words at a time
    (see the module docstring), or None where it does not apply: a static row count above 1,
    ``K`` not a multiple of 32, no split of the 4-word runs of a column among 2 threads or
    more. ``split`` (a divisor of the runs, about 4 per thread, at most 64) threads per column,
    ``cols`` columns per work-group, halved until the kernel has ``GEMV_MIN_GROUPS``.

    Examples
    --------
    >>> vector_tile(Q4GemvSpec((1,), 768, 2304, 128)), vector_tile(Q4GemvSpec((1,), 3072, 768, 128))
    ((8, 8), (2, 16))
    >>> vector_tile(Q4GemvSpec((2,), 768, 768, 128)) is None
    True
    """
    m = static_rows(spec)
    if (m is not None and m != 1) or spec.k % (NIBBLES * Q4_WORD_VECTOR):
        return None
    runs = spec.words // Q4_WORD_VECTOR
    split = _divisor_near(runs, max(8, min(64, _pow2_at_most(max(1, runs // 4)))), 64)
    if split < 2:
        return None
    cols = _pow2_at_most(Q4_GEMV_THREADS // split)
    while cols > 1 and -(-spec.n // cols) < GEMV_MIN_GROUPS and split * cols // 2 >= GEMV_WARP:
        cols //= 2
    return cols, split


def dense_q4_gemv_compute(spec: Q4GemvSpec):
    """The tensors ``(x, words, scale[, offset][, bias], y)`` of the GEMV (``y`` float32
    ``(*lead, n)``; the reduction block is ``dense_q4_gemv``, the output ``dense_q4_out``)."""
    lead = tuple(spec.lead)
    nl = len(lead)
    k, n, gs = spec.k, spec.n, spec.group_size
    x = te.placeholder(lead + (k,), "float32", "x")
    words = te.placeholder((n, spec.words), "uint32", "words")
    scale = te.placeholder((n, spec.groups), "float32", "scale")
    offset = None if spec.symmetric else te.placeholder((n, spec.groups), "float32", "offset")
    bias = te.placeholder((n,), "float32", "bias") if spec.bias else None
    w = te.reduce_axis((0, spec.words), "w")
    zero = te.const(0.0, "float32")

    def x_at(idx, kk):
        if k % NIBBLES == 0:
            return x[idx + (kk,)]
        return te.if_then_else(kk < k, x[idx + (te.min(kk, k - 1),)], zero)

    rows, cols, _ = gemv_tile(spec)

    def f(*i):
        idx, j = tuple(i[:nl]), i[nl]
        # the tiles' threads beyond the last column or row read nothing: the cross-thread
        # reduction puts the reads under the tile's bounds test
        word = words[j, w.var]
        # the word's group: one per word when the group is a whole number of words
        g = w.var // (gs // NIBBLES) if gs % NIBBLES == 0 else None
        dot = None
        xsum = None
        per_code = []
        for e in range(NIBBLES):
            kk = w.var * NIBBLES + e
            nib = word if e == 0 else word // IntImm(1 << (4 * e), "uint32")
            q = (nib % IntImm(16, "uint32")).astype("int32")
            xv = x_at(idx, kk)
            if g is None:     # a group boundary inside the word: the scale per code
                ge = (kk if k % NIBBLES == 0 else te.min(kk, k - 1)) // gs
                wv = ((q - 8).astype("float32") * scale[j, ge] if spec.symmetric else
                      q.astype("float32") * scale[j, ge] + offset[j, ge])
                per_code.append(xv * wv)
                continue
            term = (q - 8).astype("float32") * xv if spec.symmetric else \
                q.astype("float32") * xv
            dot = term if dot is None else dot + term
            if not spec.symmetric:
                xsum = xv if xsum is None else xsum + xv
        if g is None:
            value = per_code[0]
            for t in per_code[1:]:
                value = value + t
        elif spec.symmetric:
            value = scale[j, g] * dot
        else:
            value = scale[j, g] * dot + offset[j, g] * xsum
        return te.sum(value, axis=w)

    acc = te.compute(lead + (n,), f, "dense_q4_gemv")
    if bias is None:
        y = te.compute(lead + (n,), lambda *i: acc[i], "dense_q4_out")
    else:
        y = te.compute(lead + (n,), lambda *i: acc[i] + bias[i[nl]], "dense_q4_out")
    ins = [x, words, scale] + ([offset] if offset is not None else []) + \
        ([bias] if bias is not None else [])
    return ins + [y]


def dense_q4_gemv_kernel(spec: Q4GemvSpec, target: Target,
                         name: str = "dense_q4_gemv") -> PrimFunc:
    """The scheduled GEMV of ``spec`` (see the module docstring); its parameters are
    ``(x, words, scale[, offset][, bias], y)``. ``target`` is the GPU target it is built for
    (OpenCL and WebGPU get the same tile today: 256 threads fit both).

    Examples
    --------
    >>> f = dense_q4_gemv_kernel(Q4GemvSpec((1,), 64, 8, 32), Target("webgpu"))
    >>> [b.name for b in dict(f.buffer_map).values()]
    ['x', 'words', 'scale', 'dense_q4_out']
    """
    tensors = dense_q4_gemv_compute(spec)
    func = te.create_prim_func(tensors, name)
    sch = Schedule(func)
    if vector_tile(spec) is not None:
        _schedule_vector(sch, spec, *vector_tile(spec))
        return sch.func
    rows, cols, split = gemv_tile(spec)
    out = sch.get_block("dense_q4_out")
    gemv = sch.get_block("dense_q4_gemv")
    loops = sch.get_loops(out)
    *lead, j = loops
    jb, jc = sch.split(j, [None, cols])
    if lead:
        row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
        if rows > 1:
            ro, ri = sch.split(row, [None, rows])
            sch.reorder(jb, ro, ri, jc)
            sch.bind(ro, "blockIdx.y")
            sch.bind(ri, "threadIdx.z")
        else:
            sch.reorder(jb, row, jc)
            sch.bind(row, "blockIdx.y")
    sch.bind(jb, "blockIdx.x")
    sch.bind(jc, "threadIdx.y")
    # the column's sum in a register of each of its threads (the tree leaves it in all)
    sch.set_scope(gemv, 0, "local")
    sch.compute_at(gemv, jc)
    red = sch.get_loops(gemv)[-1]
    wo, wt = sch.split(red, [None, split])
    # consecutive threads read consecutive words of the column: word = wo * split + wt
    sch.reorder(wt, wo)
    sch.bind(wt, "threadIdx.x")
    return sch.func


def _schedule_vector(sch: Schedule, spec: Q4GemvSpec, cols: int, split: int) -> None:
    """The one-row kernel (see the module docstring): ``cols`` columns a work-group, ``split``
    threads per column each summing its 4-word runs in registers (``rfactor``), the words
    loaded as one ``uint4`` and the activations as ``float4`` per run."""
    out = sch.get_block("dense_q4_out")
    gemv = sch.get_block("dense_q4_gemv")
    # the partial sums factored out first (rfactor needs the loop nest to itself)
    w = sch.get_loops(gemv)[-1]
    wo, wt, wv = sch.split(w, [None, split, Q4_WORD_VECTOR])
    sch.reorder(wt, wo, wv)
    rf = sch.rfactor(wt, 0)
    *lead, j = sch.get_loops(out)
    jb, jc = sch.split(j, [None, cols])
    if lead:
        row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
        sch.reorder(jb, row, jc)
        sch.bind(row, "blockIdx.y")
    sch.bind(jb, "blockIdx.x")
    sch.bind(jc, "threadIdx.y")
    # the column's sum: a tree over its threads, left in a register of each
    sch.set_scope(gemv, 0, "local")
    sch.compute_at(gemv, jc)
    sch.bind(sch.get_loops(gemv)[-1], "threadIdx.x")
    # the partials: the work-group's in shared memory, each thread's in a register
    sch.set_scope(rf, 0, "shared")
    sch.compute_at(rf, jc, preserve_unit_loops=True)
    n = len(sch.get(rf).iter_vars)      # (thread's share, lead.., column, run, word)
    rt, rj = _serial_loop_of(sch, rf, 0), _serial_loop_of(sch, rf, n - 3)
    ro, rv = _serial_loop_of(sch, rf, n - 2), _serial_loop_of(sch, rf, n - 1)
    sch.reorder(rj, rt, ro, rv)
    sch.bind(rj, "threadIdx.y")
    sch.bind(rt, "threadIdx.x")
    acc = sch.cache_write(rf, 0, "local")
    sch.reverse_compute_at(acc, rt)
    # the run's 4 words (one uint4) and its 32 activations (8 float4) in registers
    reads = sch.get(rf).reads
    for name in ("words", "x"):
        idx = next(i for i, r in enumerate(reads) if r.buffer.name == name)
        frag = sch.cache_read(rf, idx, "local")
        sch.compute_at(frag, ro)
        inner = sch.get_loops(frag)[-1]
        ext = sch.get(inner).extent
        if isinstance(ext, IntImm) and ext.value % 4 == 0:
            if ext.value > 4:
                _, inner = sch.split(inner, [None, 4])
            sch.vectorize(inner)
    sch.decompose_reduction(rf, ro)
    sch.unroll(rv)
    if isinstance(sch.get(ro).extent, IntImm) and sch.get(ro).extent.value <= GEMV_UNROLL_STEPS:
        sch.unroll(ro)


def _thread_loops(func: PrimFunc) -> list[For]:
    out = []
    post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, For) and
                     n.kind == "thread_binding" else None)
    return out
