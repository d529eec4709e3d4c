"""The int4 weight-only GEMV of the GPU targets: ``relax.dense_q4`` (plus a fused bias) for the
few rows of token-by-token decoding, as a scheduled TensorIR function. Two kernels; the
weight is repacked at build time for the one a layer gets (``kernel_operands``). No
dequantized weight is ever written: a kernel reads ``K N / 2`` bytes of codes (an eighth of
the float32 weight's, a quarter of a float16 weight's), the scales and the activation rows.

**The run kernel** (``run_tile``; ``K`` and the group size multiples of 32, a static row
count up to ``Q4_RUN_MAX_ROWS`` or a symbolic one). Figures for an H100 (132 multiprocessors,
2048 threads and 64 K registers each, 3.35 TB/s):

* the codes in *runs* ``[K/32, N, 4]`` uint32 (``pack_q4_runs``): ``runs[r, j]`` is column
  ``j``'s 32 codes ``k = 32 r .. 32 r + 31``, 16 bytes, nibble ``e`` of word ``v`` holding
  ``k = 32 r + 8 v + e``; the scales (and offsets, unless symmetric) as float32 rows
  ``[groups, N]``;
* ``threadIdx.x`` over ``cols`` output columns, ``threadIdx.y`` over ``split`` threads
  sharing each column's runs (``rfactor``), thread ``t`` taking ``steps`` consecutive runs;
  ``blockIdx.x`` over the column blocks, ``blockIdx.y`` over the rows (each row reads the
  codes again, from L2 after the first). A warp's lanes are on consecutive columns: a step's
  code loads are one ``uint4`` (``vec4<u32>``) a lane, 16 x ``cols`` contiguous bytes a
  ``threadIdx.y`` (whole 32-byte sectors), and its 32 activations 8 ``float4`` that the
  lanes of a ``threadIdx.y`` share (a broadcast; ``32 / cols`` addresses a warp load). The
  kernel this replaced put a warp's lanes on one column's consecutive runs: each activation
  ``float4`` a warp loaded then touched 32 lines 128 bytes apart, ~260 L1 wavefronts per 512
  bytes of codes, which capped it near 460 GB/s of codes (417 measured at 4096 x 11008);
* a thread loads the codes of up to ``Q4_PREFETCH_RUNS`` = 8 runs first (8 ``uint4``, 128
  bytes, in flight; 32 registers), then per run its 32 activations (L1 hits: every
  work-group of a multiprocessor reads the same ``x``) and unpacks the codes in registers
  (unsigned division and remainder by powers of two: a shift and a mask), accumulating
  ``sum (q - 8) x`` (``sum q x`` and ``sum x`` with offsets) as 4 sums of a word's 8 codes,
  times the group's scale once per run (``s * dot + o * xsum``: one multiply-add per 32
  codes);
* the thread's partial to shared memory once; after one barrier each column's thread adds
  its ``split`` partials in turn, adds the bias (the fused epilogue) and writes the column.

Per code: a shift, a mask, a subtract, an int-to-float conversion and a multiply-add. The
conversion's 16 a clock per multiprocessor is the arithmetic's limit: 132 x 16 x 1.755 GHz =
3.7 G codes/s = 1.85 TB/s of codes (the issue slots, ~5 instructions a code, allow ~2.7
TB/s). Memory: at 4096 x 11008 (``RunTile(16, 16, 8)``, 688 work-groups of 256 threads,
5.2 a multiprocessor) each work-group has 32 KB of codes in flight against the ~20 KB a
multiprocessor that 3.35 TB/s at ~0.8 us of latency needs (Little's law), so the codes
should stream at 1.5-1.85 TB/s (12-15 us; the float32 GEMV's 2.7 TB/s is 65.7 us).

**The word kernel** (``gemv_tile``; ``K`` or the group not a multiple of 32, static rows 5
to 16): words ``[N, K/8]`` (``pack_q4_words``: ``words[j, w]`` holds column ``j``'s codes
``k = 8 w .. 8 w + 7``, nibble ``e`` for ``k = 8 w + e``) and scale rows ``[N, groups]``;
one work-group per block of ``cols`` columns (``threadIdx.y``) and up to 4 rows
(``threadIdx.z``, sharing each word read), ``split`` threads a column (``threadIdx.x``)
reading words ``t, t + split, ...`` (a warp reads consecutive words), the partials meeting in
a tree in shared memory (``LowerCrossThreadReduction``); the bias added in the write-back.

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

from .gemv import GEMV_MIN_GROUPS, GEMV_UNROLL_STEPS, _divisor_near, _serial_loop_of

__all__ = ["Q4GemvSpec", "RunTile", "dense_q4_gemv_kernel", "dense_q4_gemv_compute",
           "pack_q4_words", "pack_q4_runs", "kernel_operands", "is_symmetric", "run_tile",
           "gemv_tile", "static_rows", "Q4_GEMV_THREADS", "Q4_GEMV_MAX_ROWS",
           "Q4_RUN_MAX_ROWS", "Q4_RUN_MIN_GROUPS", "Q4_PREFETCH_RUNS", "Q4_RUN_SPLIT", "prefetch_runs", "Q4_WORD_VECTOR", "RUN_CODES", "NIBBLES"]

NIBBLES = 8             # codes per 32-bit word
Q4_GEMV_THREADS = 256   # threads per work-group: rows * cols * split
Q4_GEMV_MAX_ROWS = 16   # static rows up to which the GEMV kernel is used (decoding batches)
Q4_WORD_VECTOR = 4      # words per load of the run kernel (a uint4 / vec4<u32>)
RUN_CODES = NIBBLES * Q4_WORD_VECTOR    # codes per run: 32, one 16-byte load
# static rows up to which the run kernel takes a GEMV (each row its own work-groups, reading
# the codes again: from L2 after the first row); 5..16 go to the word kernel, whose
# work-groups hold up to 4 rows sharing each word
Q4_RUN_MAX_ROWS = 4
# work-groups the run kernel aims for: 4 per H100 multiprocessor (132). Little's law: 3.35
# TB/s x ~0.8 us of memory latency = ~2.7 MB in flight, ~20 KB per multiprocessor; 4
# work-groups of up to 256 threads with a 16-byte load or more each in flight give 16 KB and
# up (the loads of a thread's unrolled steps are independent: 2-8 of them in flight)
Q4_RUN_MIN_GROUPS = 4 * 132
Q4_RUN_COLS = 32        # columns per work-group at most: a warp's 32 lanes on 32 columns
Q4_RUN_MIN_COLS = 4     # and at least: 4 x 16 = 64 contiguous bytes of codes (2 sectors)
Q4_PREFETCH_RUNS = 8    # runs of codes a thread loads ahead of their arithmetic (prefetch_runs)
Q4_RUN_SPLIT = 32       # threads a column shares its runs among, about (run_tile)


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


def pack_q4_runs(codes: np.ndarray, k: int) -> np.ndarray:
    """The codes of ``relax.dense_q4`` (``(ceil(K/2), N)`` bytes) as the run kernel's words
    ``(K/32, N, 4)`` uint32: ``runs[r, j]`` is the 16 bytes (one ``uint4``) of column ``j``'s
    codes ``k = 32 r .. 32 r + 31``, nibble ``e`` of word ``v`` holding ``k = 32 r + 8 v + e``.
    Consecutive columns' runs are adjacent, so a warp's lanes on consecutive columns load 512
    contiguous bytes. ``K`` must be a multiple of 32.

    Examples
    --------
    >>> codes = np.arange(16 * 2, dtype=np.uint8).reshape(16, 2)
    >>> runs = pack_q4_runs(codes, 32)
    >>> runs.shape, hex(runs[0, 1, 0])
    ((1, 2, 4), '0x7050301')
    """
    if k % RUN_CODES:
        raise ValueError(f"the int4 run layout needs K a multiple of {RUN_CODES}, got {k}")
    words = pack_q4_words(codes, k)                  # (N, K/8)
    n = words.shape[0]
    return np.ascontiguousarray(words.reshape(n, k // RUN_CODES, Q4_WORD_VECTOR)
                                .transpose(1, 0, 2))


def is_symmetric(scale: np.ndarray, offset: np.ndarray) -> bool:
    """Whether ``relax.dense_q4``'s offsets are the symmetric ``-8 * scale`` (in float32)."""
    s32 = np.asarray(scale).astype(np.float32)
    return bool(np.array_equal(np.asarray(offset).astype(np.float32), np.float32(-8.0) * s32))


def kernel_operands(spec: "Q4GemvSpec", codes: np.ndarray, scale: np.ndarray,
                    offset: np.ndarray) -> list[np.ndarray]:
    """The constants ``[words, scale(, offset)]`` of the kernel of ``spec`` from those of
    ``relax.dense_q4`` (codes ``(ceil(K/2), N)``, scale and offset ``(groups, N)``, float32 or
    float16: converted to float32, exactly). The run kernel (``run_tile``) takes
    ``pack_q4_runs`` and ``(groups, N)`` rows (consecutive columns adjacent: one coalesced
    load per warp); the word kernel ``pack_q4_words`` and ``(N, groups)``. Offsets only where
    ``spec`` is not symmetric.

    Examples
    --------
    >>> s = np.full((1, 2), 0.5, np.float32)
    >>> spec = Q4GemvSpec((1,), 32, 2, 32, symmetric=is_symmetric(s, -8 * s))
    >>> [a.shape for a in kernel_operands(spec, np.zeros((16, 2), np.uint8), s, -8 * s)]
    [(1, 2, 4), (1, 2)]
    """
    s32 = np.asarray(scale).astype(np.float32)
    o32 = np.asarray(offset).astype(np.float32)
    want = {"codes": ((spec.k + 1) // 2, spec.n), "scale": (spec.groups, spec.n),
            "offset": (spec.groups, spec.n)}
    for name, a in (("codes", np.asarray(codes)), ("scale", s32), ("offset", o32)):
        if a.shape != want[name]:
            raise ValueError(f"int4 GEMV of K={spec.k}, N={spec.n}, groups of "
                             f"{spec.group_size}: {name} has shape {a.shape}, expected "
                             f"{want[name]}")
    if run_tile(spec) is not None:
        out = [pack_q4_runs(codes, spec.k), np.ascontiguousarray(s32)]
        return out + ([] if spec.symmetric else [np.ascontiguousarray(o32)])
    out = [pack_q4_words(codes, spec.k), np.ascontiguousarray(s32.T)]
    return out + ([] if spec.symmetric else [np.ascontiguousarray(o32.T)])


def static_rows(spec: Q4GemvSpec) -> int | None:
    """The number of rows (the product of the lead dims) when constant, else None."""
    n = 1
    for d in spec.lead:
        if not isinstance(d, (int, IntImm)):
            return None
        n *= int(d.value if isinstance(d, IntImm) else d)
    return n


@dataclass(frozen=True)
class RunTile:
    """The run kernel's launch shape: ``cols`` output columns per work-group (``threadIdx.x``),
    ``split`` threads sharing each column's runs (``threadIdx.y``), ``steps`` runs a thread."""
    cols: int
    split: int
    steps: int

    @property
    def threads(self) -> int:
        return self.cols * self.split


def run_tile(spec: Q4GemvSpec) -> RunTile | None:
    """The launch shape of the run kernel (see the module docstring), or None where the word
    kernel takes ``spec``: ``K`` or the group size not a multiple of 32 (a run would straddle
    a group or the end), a static row count above ``Q4_RUN_MAX_ROWS``.

    ``cols`` starts at 32 (a warp on 32 columns: its 32 ``uint4`` loads are 512 contiguous
    bytes, its activation loads one address, a broadcast) and is halved, down to
    ``Q4_RUN_MIN_COLS``, until the kernel has ``Q4_RUN_MIN_GROUPS`` work-groups (rows times
    column blocks). ``split`` divides the runs (the partial sums are factored out of the
    reduction, which a tail would leave behind a guard) near ``Q4_RUN_SPLIT``, at most
    ``Q4_GEMV_THREADS / cols``: each thread's codes are loaded at once (``prefetch_runs``), so
    more threads a column means less arithmetic a thread after its loads land (GPT-2's
    layers: 1-3 runs a thread), and its column's final sum ``split`` shared loads.

    Examples
    --------
    >>> run_tile(Q4GemvSpec((1,), 4096, 11008, 128))
    RunTile(cols=16, split=16, steps=8)
    >>> run_tile(Q4GemvSpec((1,), 768, 2304, 128)), run_tile(Q4GemvSpec((1,), 3072, 768, 32))
    (RunTile(cols=4, split=24, steps=1), RunTile(cols=4, split=32, steps=3))
    >>> run_tile(Q4GemvSpec((1,), 11008, 4096, 128))      # 344 runs: 43 x 8
    RunTile(cols=4, split=43, steps=8)
    >>> run_tile(Q4GemvSpec((1,), 776, 768, 128)) is None     # K not a multiple of 32
    True
    """
    m = static_rows(spec)
    if spec.k % RUN_CODES or spec.group_size % RUN_CODES or \
            (m is not None and m > Q4_RUN_MAX_ROWS):
        return None
    runs = spec.k // RUN_CODES
    rows = m or 1
    cols = Q4_RUN_COLS
    while cols > Q4_RUN_MIN_COLS and rows * -(-spec.n // cols) < Q4_RUN_MIN_GROUPS:
        cols //= 2
    split = _divisor_near(runs, Q4_RUN_SPLIT, Q4_GEMV_THREADS // cols)
    return RunTile(cols, split, runs // split)


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


def dense_q4_gemv_compute(spec: Q4GemvSpec):
    """The tensors ``(x, words, scale[, offset][, bias], y)`` of the GEMV (``y`` float32
    ``(*lead, n)``; the reduction block is ``dense_q4_gemv``, the output ``dense_q4_out``),
    ``words`` and the scale rows in the layout of the kernel ``spec`` gets
    (``kernel_operands``)."""
    if run_tile(spec) is not None:
        return _run_compute(spec)
    return _word_compute(spec)


def _with_output(spec: Q4GemvSpec, acc, ins: list) -> list:
    """``ins + [y]``: ``y`` the GEMV's sum ``acc`` plus the bias (the fused epilogue)."""
    lead = tuple(spec.lead)
    if not spec.bias:
        return ins + [te.compute(lead + (spec.n,), lambda *i: acc[i], "dense_q4_out")]
    bias = ins[-1]
    return ins + [te.compute(lead + (spec.n,), lambda *i: acc[i] + bias[i[len(lead)]],
                             "dense_q4_out")]


def _run_compute(spec: Q4GemvSpec):
    """The run kernel's compute: a reduction over the runs of 32 codes, each term a run's
    dot product with its 32 activations times the group's scale (plus the offset times the
    activations' sum): the scale is multiplied once per 32 codes, the codes' sum per run kept
    as 4 sums of a word's 8 (a tree of 4, not a chain of 32 dependent adds)."""
    lead = tuple(spec.lead)
    nl = len(lead)
    k, n = spec.k, spec.n
    runs = k // RUN_CODES
    per_group = spec.group_size // RUN_CODES
    x = te.placeholder(lead + (k,), "float32", "x")
    words = te.placeholder((runs, n, Q4_WORD_VECTOR), "uint32", "words")
    scale = te.placeholder((spec.groups, n), "float32", "scale")
    offset = None if spec.symmetric else te.placeholder((spec.groups, n), "float32", "offset")
    bias = te.placeholder((n,), "float32", "bias") if spec.bias else None
    r = te.reduce_axis((0, runs), "r")

    def f(*i):
        idx, j = tuple(i[:nl]), i[nl]
        g = r.var // per_group if per_group > 1 else r.var
        dots, sums = [], []
        for v in range(Q4_WORD_VECTOR):
            word = words[r.var, j, v]
            dot = xsum = None
            for e in range(NIBBLES):
                # unsigned division and remainder by powers of two: a shift and a mask
                nib = word if e == 0 else word // IntImm(1 << (4 * e), "uint32")
                q = (nib % IntImm(16, "uint32")).astype("int32")
                xv = x[idx + (r.var * RUN_CODES + NIBBLES * v + e,)]
                term = (q - 8).astype("float32") * xv if spec.symmetric else \
                    q.astype("float32") * xv
                dot = term if dot is None else dot + term
                if not spec.symmetric:
                    xsum = xv if xsum is None else xsum + xv
            dots.append(dot)
            sums.append(xsum)
        value = scale[g, j] * ((dots[0] + dots[1]) + (dots[2] + dots[3]))
        if not spec.symmetric:
            value = value + offset[g, j] * ((sums[0] + sums[1]) + (sums[2] + sums[3]))
        return te.sum(value, axis=r)

    acc = te.compute(lead + (n,), f, "dense_q4_gemv")
    ins = [x, words, scale] + ([offset] if offset is not None else []) + \
        ([bias] if bias is not None else [])
    return _with_output(spec, acc, ins)


def _word_compute(spec: Q4GemvSpec):
    """The word kernel's compute: a reduction over 32-bit words ``(N, K/8)``."""
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
    ins = [x, words, scale] + ([offset] if offset is not None else []) + \
        ([bias] if bias is not None else [])
    return _with_output(spec, acc, ins)


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
    tile = run_tile(spec)
    if tile is not None:
        _schedule_runs(sch, tile)
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


def _schedule_runs(sch: Schedule, tile: RunTile) -> None:
    """The run kernel (see the module docstring): ``tile.cols`` columns a work-group on
    ``threadIdx.x``, ``tile.split`` threads a column on ``threadIdx.y`` each summing
    ``tile.steps`` consecutive runs in a register (``rfactor``), a run's 4 words loaded as one
    ``uint4`` and its 32 activations as 8 ``float4`` per step; the partials in shared memory,
    added up by a thread per column."""
    out = sch.get_block("dense_q4_out")
    gemv = sch.get_block("dense_q4_gemv")
    # the partial sums factored out first (rfactor needs the loop nest to itself); thread t
    # takes runs t * steps .. (t + 1) * steps - 1: a g128 group's 4 runs mostly in one thread
    r = sch.get_loops(gemv)[-1]
    rt, _ = sch.split(r, [tile.split, None])
    rf = sch.rfactor(rt, 0)
    *lead, j = sch.get_loops(out)
    jb, jc = sch.split(j, [None, tile.cols])
    if lead:
        row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
        sch.reorder(jb, row, jc)
        sch.bind(row, "blockIdx.y")
    sch.bind(jb, "blockIdx.x")
    sch.bind(jc, "threadIdx.x")
    # the column's sum: its thread adds the split partials in turn (split shared loads, one
    # barrier; a tree over threadIdx.y would take log2(split) barriers)
    sch.set_scope(gemv, 0, "local")
    sch.compute_at(gemv, jc)
    for lp in sch.get_loops(gemv):
        if sch.get(lp).kind == "serial" and _under(sch, lp, jc):      # (none where split = 1)
            sch.unroll(lp)
    # the partials: the work-group's in shared memory, each thread's in a register
    sch.set_scope(rf, 0, "shared")
    sch.compute_at(rf, jc, preserve_unit_loops=True)
    n = len(sch.get(rf).iter_vars)      # (thread's share, lead.., column, step)
    rt, rj, ro = (_serial_loop_of(sch, rf, 0), _serial_loop_of(sch, rf, n - 2),
                  _serial_loop_of(sch, rf, n - 1))
    sch.reorder(rt, rj, ro)
    sch.bind(rt, "threadIdx.y")
    sch.bind(rj, "threadIdx.x")
    acc = sch.cache_write(rf, 0, "local")
    sch.reverse_compute_at(acc, rj)
    # the codes of ``chunk`` runs loaded ahead of their arithmetic (``chunk`` uint4 loads in
    # flight a thread: 16 bytes x chunk x the threads, from memory), then each run's 32
    # activations (8 float4, from L1: every work-group of the multiprocessor reads the same)
    chunk = prefetch_runs(tile.steps)
    ro_o, ro_i = sch.split(ro, [None, chunk])
    for name, at in (("words", ro_o), ("x", ro_i)):
        reads = sch.get(rf).reads
        idx = next(i for i, rd in enumerate(reads) if rd.buffer.name == name)
        frag = sch.cache_read(rf, idx, "local")
        sch.compute_at(frag, at)
        loops = sch.get_loops(frag)
        inner = loops[-1]
        ext = sch.get(inner).extent
        if isinstance(ext, IntImm) and ext.value % 4 == 0:
            if ext.value > 4:
                outer, inner = sch.split(inner, [None, 4])
                sch.unroll(outer)
            sch.vectorize(inner)
        # (unrolled: the register arrays are indexed by constants, never spilled)
        for lp in loops[:-1]:
            if sch.get(lp).kind == "serial" and isinstance(sch.get(lp).extent, IntImm) and \
                    sch.get(lp).extent.value > 1 and _under(sch, lp, at):
                sch.unroll(lp)
    sch.decompose_reduction(rf, ro_o)
    sch.unroll(ro_i)
    if tile.steps // chunk <= GEMV_UNROLL_STEPS // chunk:
        sch.unroll(ro_o)


def prefetch_runs(steps: int) -> int:
    """Runs whose codes a thread of the run kernel loads before their arithmetic: the largest
    divisor of ``steps`` up to ``Q4_PREFETCH_RUNS`` (8 runs: 32 registers of codes, 128 bytes
    in flight a thread).

    Examples
    --------
    >>> prefetch_runs(8), prefetch_runs(6), prefetch_runs(24), prefetch_runs(7)
    (8, 6, 8, 7)
    """
    return max(d for d in range(1, min(steps, Q4_PREFETCH_RUNS) + 1) if steps % d == 0)


def _under(sch: Schedule, loop, anchor) -> bool:
    """Whether ``loop`` is nested inside ``anchor`` (a loop of the same nest)."""
    node = sch.get(anchor)
    found = []
    post_order_visit(node.body, lambda n: found.append(n) if n is sch.get(loop) else None)
    return bool(found)


def _thread_loops(func: PrimFunc) -> list[For]:
    out = []
    post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, For) and
                     n.kind == "thread_binding" else None)
    return out
