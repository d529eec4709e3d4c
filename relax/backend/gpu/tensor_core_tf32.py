"""3xTF32: float32 GEMMs on NVIDIA's TF32 tensor cores at float32-level accuracy, for
``Target("opencl -device=nvidia -fp32-tensor-cores=3xtf32")`` (``Target.fp32_tensor_cores``):
float32 dense, matmul, batch matmul and convolution (as an implicit GEMM) kernels with their
fused epilogue, on ``mma.sync.m16n8k8`` tf32 through inline PTX.

Each float32 operand ``x`` is split into ``big = tf32(x)`` (``cvt.rna.tf32.f32``: 10 mantissa
bits, to nearest, ties away) and ``small = tf32(x - big)``, and ``a * b`` is computed as
``small_a * big_b + big_a * small_b + big_a * big_b`` (three mma into the same float32
accumulators, the small terms first, as CUTLASS's "3xTF32" does). The dropped
``small_a * small_b`` is about ``2^-22`` of the product: the result is as accurate as a float32
GEMM's (``docs/gpu.md``, "3xTF32"), unlike TF32 itself (``split="1xtf32"``, one mma of the
big parts: about ``2^-11`` relative, kept for the accuracy comparison only).

``gpu_schedules.apply`` tries it on such a target for float32 kernels the fp16 tensor-core
kernel does not take: ``tensor_core.match_fp16_gemm(func, "float32")`` reads the GEMM and its
epilogue (the same rules as the fp16 kernel: batch, rows, columns, reduction; ``ValueError``
with the reason where it is not one, and the float32 SIMT GEMM runs, named under
``TILECRAFT_DEBUG_SCHEDULES=1``).

The kernel (``TensorCoreTile``s of the fp16 kernel, ``tensor_core.choose_tile``):

* per step of ``BK = 16`` along k the work-group copies a's ``BM x BK`` and b's ``BK x BN``
  tile into shared memory as float32 words, staged in registers (the next step's tiles are
  read before this step's mma and stored after them). ``A_shared`` is ``[row][k]``, rows
  ``BK + 4`` words (the fragment loads of a warp's 8 rows x 4 k fall into 32 banks; rows stay
  16-byte aligned); ``B_shared`` is ``[k][column]``, rows ``BN + 8`` words (a b-fragment load:
  4 k x 8 columns in 32 banks) — or ``[column][k]`` like A for a ``(N, K)`` weight
  (``b_mode == "nk"``). Plain operands (``"rows"``, ``"kn"``, ``"nk"``) are read 16 bytes
  (4 floats) at a time, anything else (``"gather"``: a convolution's window, a fused
  transpose) one float a thread, k tails zero-filled;
* per k8 each warp reads its fragments from shared memory and splits each float once into
  ``big`` and ``small`` words, reused by all of the warp's ``WM / 16 x WN / 8`` mma tiles;
  then three passes of mma over the tiles (small x big, big x small, big x big: consecutive
  mma are independent);
* the accumulators go through the epilogue into the output (rows past M, columns past N not
  stored). ``TILECRAFT_TF32_SMALL_ACC=1`` (``small_acc``) sums the small terms in
  accumulators of their own, joined once at the end.

M, N and the batch may be symbolic; K is a constant. A symbolic M gets two kernels where their
tiles differ, chosen per call (as the fp16 kernel). ``gpu_schedules`` keeps the SIMT schedule
for GEMMs of fewer than ``TF32_MIN_OUTPUTS`` outputs (``TILECRAFT_TF32_MIN_OUTPUTS``; for
symbolic sizes both kernels, chosen per call).

Examples
--------
>>> from tilecraft.tensorir import te
>>> n = te.var("n")
>>> A = te.placeholder((n, 64), "float32", "A")
>>> W = te.placeholder((64, 128), "float32", "W")
>>> k = te.reduce_axis((0, 64), "k")
>>> C = te.compute((n, 128), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
>>> t = Target("opencl -device=nvidia -fp32-tensor-cores=3xtf32")
>>> f = tf32_kernel(te.create_prim_func([A, W, C]), t)
>>> f.attr_dict["tensor_core_split"]
'3xtf32'
"""
from __future__ import annotations

import os

from tilecraft.targets import Target
from tilecraft.tensorir import expr as E
from tilecraft.tensorir.expr import Select, Var, call, const, floordiv, floormod
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.stmt import (Allocate, AssertStmt, Buffer, BufferStore, Evaluate, For,
                                     IfThenElse, seq)

from .tensor_core import (TC_NOMINAL_ROWS, TC_SMALL_NOMINAL_ROWS, TC_SMALL_ROWS,
                          TensorCoreGemm, TensorCoreTile, _host_asserts, choose_tile,
                          clamp_index, load_b128, match_fp16_gemm)

__all__ = ["SPLITS", "TF32_BK", "TF32_MIN_OUTPUTS", "min_outputs", "small_acc_default",
           "tf32_kernel"]

SPLITS = ("3xtf32", "1xtf32")   # 1xtf32: TF32 precision (for the accuracy comparison only)
TF32_BK = 16                    # k per shared-memory step (4 KB of A and B a 64 x 64 tile)
# Below this many output elements (rows x columns x batch) the SIMT schedule, with its split-K,
# runs instead (``min_outputs``): few outputs are few tensor-core work-groups. On the H100 the
# fp16 tensor-core kernel, with a sixth of 3xTF32's tensor work, was already slower than our
# SIMT float32 at M = 128, N = 768, K = 3072 (0.054 against 0.045 ms). 2^19: BERT's dense
# layers at batch 1 (128 x 768, 128 x 3072) SIMT, at batch 16 3xTF32.
TF32_MIN_OUTPUTS = 1 << 19
_PAD_K = 4       # words added to a [row][k] tile's rows (BK + 4: conflict-free fragment reads)
_PAD_N = 8       # words added to a [k][column] tile's rows (BN + 8, BN a multiple of 32)


def min_outputs() -> int:
    """``TILECRAFT_TF32_MIN_OUTPUTS``: the output size (rows x columns x batch of the GEMM)
    below which ``gpu_schedules`` runs the SIMT float32 schedule instead of 3xTF32 (static
    sizes decided at build time, symbolic ones per call on the host); default
    ``TF32_MIN_OUTPUTS``, 0: 3xTF32 at every size."""
    text = os.environ.get("TILECRAFT_TF32_MIN_OUTPUTS", "").strip() or str(TF32_MIN_OUTPUTS)
    try:
        return max(int(text), 0)
    except ValueError:
        raise ValueError(f"TILECRAFT_TF32_MIN_OUTPUTS must be an integer, got {text!r}") \
            from None


def small_acc_default() -> bool:
    """``TILECRAFT_TF32_SMALL_ACC=1``: the small terms in accumulators of their own (see
    ``tf32_kernel``); off by default."""
    return os.environ.get("TILECRAFT_TF32_SMALL_ACC", "") not in ("", "0")


def tf32_kernel(func: PrimFunc, target: Target, tile: TensorCoreTile | None = None,
                split: str | None = None, small_acc: bool | None = None) -> PrimFunc:
    """``func`` (a float32 GEMM with its epilogue, ``match_fp16_gemm(func, "float32")``) as
    the TF32 tensor-core kernel for ``target`` (whose ``tensor_cores`` is set), with the
    parameters of ``func``. ``split``: ``"3xtf32"`` (default: the target's
    ``fp32_tensor_cores``, else 3xtf32) or ``"1xtf32"`` (plain TF32, less accurate: for
    comparisons). ``tile``: as ``tensor_core.tensor_core_kernel`` (None: chosen by the rows,
    two kernels for a symbolic row count where their tiles differ). ``small_acc`` (3xtf32
    only; default ``small_acc_default()``): the two small-term mma into accumulators of their
    own, added to the big terms' at the end — each float32 addition into the large sums is
    then one of ``K``, not ``3K`` (for a tensor core whose summation loses more than float32's
    rounding), at twice the accumulator registers.

    Raises
    ------
    ValueError
        ``func`` is not such a GEMM, the target has no tensor cores, or ``split`` is unknown.
    """
    if target.tensor_cores is None:
        raise ValueError(f"{target} has no tensor cores (Target('opencl -device=nvidia'))")
    split = split or target.fp32_tensor_cores or "3xtf32"
    if split not in SPLITS:
        raise ValueError(f"unknown TF32 split {split!r}: one of {', '.join(SPLITS)}")
    gm = match_fp16_gemm(func, "float32")
    small_acc = (small_acc_default() if small_acc is None else small_acc) and split == "3xtf32"
    M = gm.M
    m_const = M if isinstance(M, int) else None
    n_nominal = gm.N if isinstance(gm.N, int) else TC_NOMINAL_ROWS
    if tile is not None or m_const is not None:
        tile = tile or choose_tile(m_const, n_nominal)
        body, tiles = _kernel(gm, M, tile, split, small_acc), str(tile)
    else:
        large = choose_tile(None, n_nominal)
        small = choose_tile(TC_SMALL_NOMINAL_ROWS, n_nominal)
        body, tiles = _kernel(gm, M, large, split, small_acc), str(large)
        if small != large:
            # the condition is over symbolic dims only: the host picks one of the two kernels
            body = IfThenElse(M < TC_SMALL_ROWS, _kernel(gm, M, small, split, small_acc), body)
            tiles = f"{small} below {TC_SMALL_ROWS} rows, else {large}"
    for cond, message in reversed(_host_asserts(func)):
        body = AssertStmt(cond, message, body)     # the function's own checks (equal dims)
    attrs = dict(func.attr_dict)
    attrs.update({"tir.is_scheduled": True, "tensor_core_tiles": tiles,
                  "tensor_core_split": split + ("-small-acc" if small_acc else "")})
    return func.replace(body=body, attrs=attrs)


def _kernel(gm: TensorCoreGemm, M, tile: TensorCoreTile, split: str, small_acc: bool = False):
    """The thread-bound loop nest of the kernel of ``gm`` with ``tile`` (fresh variables and
    buffers of its own)."""
    BM, BN, WM, WN = tile.BM, tile.BN, tile.WM, tile.WN
    if BM % WM or BN % WN or WM % 16 or WN % 8 or BN % 8:
        raise ValueError(f"tensor-core tile {tile}: warps of WM x WN (multiples of 16 x 8) "
                         f"must divide BM x BN")
    K, N = gm.K, gm.N
    BK = TF32_BK
    KT = -(-K // BK)
    MT, NT = WM // 16, WN // 8
    warps_n = BN // WN
    threads = 32 * tile.warps
    three = split == "3xtf32"
    u32, f32 = "uint32", "float32"
    b_nk = gm.b_mode == "nk"       # B_shared as [column][k]; else [k][column]
    ldk = BK + _PAD_K
    ldn = BN + _PAD_N
    # explicit strides: the allocation compaction keeps the padding
    As = Buffer("A_shared", (BM, BK), f32, strides=(ldk, 1), scope="shared")
    Bs = (Buffer("B_shared", (BN, BK), f32, strides=(ldk, 1), scope="shared") if b_nk else
          Buffer("B_shared", (BK, BN), f32, strides=(ldn, 1), scope="shared"))
    acc = Buffer("acc", (MT * NT * 4,), f32, scope="local")
    acc_s = Buffer("acc_small", (MT * NT * 4,), f32, scope="local") if small_acc else acc
    a_val = Buffer("a_val", (MT * 4,), f32, scope="local")
    b_val = Buffer("b_val", (NT * 2,), f32, scope="local")
    a_big = Buffer("a_big", (MT * 4,), u32, scope="local")
    b_big = Buffer("b_big", (NT * 2,), u32, scope="local")
    a_small = Buffer("a_small", (MT * 4,), u32, scope="local")
    b_small = Buffer("b_small", (NT * 2,), u32, scope="local")

    tx, bx, by, bz = Var("tx"), Var("bx"), Var("by"), Var("bz")
    kt, e, x, y, i, ks = Var("kt"), Var("e"), Var("x"), Var("y"), Var("i"), Var("ks")
    nbatch = gm.product(gm.batch_vars)
    warp, lane = floordiv(tx, 32), floormod(tx, 32)
    g, t = floordiv(lane, 4), floormod(lane, 4)
    wm, wn = floordiv(warp, warps_n), floormod(warp, warps_n)

    def each(total, n, body_of):
        flat = e * threads + tx
        body = body_of(flat)
        if total % threads:
            body = IfThenElse(flat < total, body)
        return For(e, 0, n, "unrolled", body)

    def tail(value_at, k):
        """``value_at(k)``, 0 past K (read at K - 1, in bounds, where K is not a multiple of
        BK)."""
        if K % BK == 0:
            return value_at(k)
        return Select(k < K, value_at(Select(k < K, k, K - 1)), const(0.0, f32))

    # A copy unit ``u`` of a thread is ``e * threads + tx``; plain operands 4 floats a unit
    # (16 bytes, staged as uint32 words), gathered ones one float
    chunks = BK // 4
    if gm.a_mode == "rows":
        na = -(-BM * chunks // threads)
        ra = Buffer("a_stage", (na * 4,), u32, scope="local")

        def fetch_a(k0):
            return each(BM * chunks, na, lambda u: load_b128(ra[e * 4], gm.a_at(bz,
                clamp_index(by * BM + floordiv(u, chunks), M), k0 + floormod(u, chunks) * 4)))

        def stash_a():
            return each(BM * chunks, na, lambda u: load_b128(
                As[floordiv(u, chunks), floormod(u, chunks) * 4], ra[e * 4]))
    else:
        na = -(-BM * BK // threads)
        ra = Buffer("a_stage", (na,), f32, scope="local")

        def fetch_a(k0):
            return each(BM * BK, na, lambda u: BufferStore(ra, tail(
                lambda kk: gm.a_at(bz, clamp_index(by * BM + floordiv(u, BK), M), kk),
                k0 + floormod(u, BK)), [e]))

        def stash_a():
            return each(BM * BK, na, lambda u: BufferStore(
                As, ra[e], [floordiv(u, BK), floormod(u, BK)]))

    if gm.b_mode == "kn":
        # rows of k, 4 neighbouring columns (16 bytes) a unit
        cols4 = BN // 4
        nb = -(-BK * cols4 // threads)
        rb = Buffer("b_stage", (nb * 4,), u32, scope="local")

        def fetch_b(k0):
            def unit(u):
                n0 = bx * BN + floormod(u, cols4) * 4
                n0 = Select(n0 < N, n0, N - 4)        # N is a multiple of 8 in this mode
                return load_b128(rb[e * 4], gm.b_at(bz, n0, k0 + floordiv(u, cols4)))
            return each(BK * cols4, nb, unit)

        def stash_b():
            return each(BK * cols4, nb, lambda u: load_b128(
                Bs[floordiv(u, cols4), floormod(u, cols4) * 4], rb[e * 4]))
    elif b_nk:
        nb = -(-BN * chunks // threads)
        rb = Buffer("b_stage", (nb * 4,), u32, scope="local")

        def fetch_b(k0):
            return each(BN * chunks, nb, lambda u: load_b128(rb[e * 4], gm.b_at(bz,
                clamp_index(bx * BN + floordiv(u, chunks), N), k0 + floormod(u, chunks) * 4)))

        def stash_b():
            return each(BN * chunks, nb, lambda u: load_b128(
                Bs[floordiv(u, chunks), floormod(u, chunks) * 4], rb[e * 4]))
    else:
        # one float a unit, the columns fastest (a convolution's neighbouring pixels)
        nb = -(-BN * BK // threads)
        rb = Buffer("b_stage", (nb,), f32, scope="local")

        def fetch_b(k0):
            return each(BN * BK, nb, lambda u: BufferStore(rb, tail(
                lambda kk: gm.b_at(bz, clamp_index(bx * BN + floormod(u, BN), N), kk),
                k0 + floordiv(u, BN)), [e]))

        def stash_b():
            return each(BN * BK, nb, lambda u: BufferStore(
                Bs, rb[e], [floordiv(u, BN), floormod(u, BN)]))

    def split_into(val, big, small, n):
        """``big[j]``, ``small[j]`` of the floats ``val[j]``, j < n (once a k8: every mma
        tile of the warp reuses them)."""
        stores = [BufferStore(big, call(E.TC_TF32_BIG, val[j], dtype=u32), [j])
                  for j in range(n)]
        if three:
            stores += [BufferStore(small, call(E.TC_TF32_SMALL, val[j], big[j], dtype=u32),
                                   [j]) for j in range(n)]
        return seq(*stores)

    # fragments of k8 step ks (the PTX ISA's m16n8k8 tf32 layout)
    frag_a = For(x, 0, MT, "unrolled", seq(*[
        BufferStore(a_val, As[wm * WM + x * 16 + g + 8 * (r % 2), ks * 8 + t + 4 * (r // 2)],
                    [x * 4 + r]) for r in range(4)]))

    def b_elem(col, k):
        return Bs[col, k] if b_nk else Bs[k, col]
    frag_b = For(y, 0, NT, "unrolled", seq(*[
        BufferStore(b_val, b_elem(wn * WN + y * 8 + g, ks * 8 + t + 4 * r), [y * 2 + r])
        for r in range(2)]))

    def mma_pass(af, bf, c=acc):
        return For(x, 0, MT, "unrolled", For(y, 0, NT, "unrolled", Evaluate(call(
            E.TC_MMA_TF32, c[(x * NT + y) * 4], af[x * 4], bf[y * 2], dtype="int32"))))
    passes = ([mma_pass(a_small, b_big, acc_s), mma_pass(a_big, b_small, acc_s)]
              if three else []) + [mma_pass(a_big, b_big)]
    compute = For(ks, 0, BK // 8, "unrolled", seq(
        frag_a, frag_b, split_into(a_val, a_big, a_small, MT * 4),
        split_into(b_val, b_big, b_small, NT * 2), *passes))
    more = kt + 1 < KT
    step = seq(IfThenElse(more, seq(fetch_a((kt + 1) * BK), fetch_b((kt + 1) * BK))),
               compute,
               IfThenElse(more, seq(stash_a(), stash_b())))

    # the epilogue, accumulator (x, y, i): row g (+ 8 for i >= 2), column 2t (+ 1 for odd i)
    row = by * BM + wm * WM + x * 16 + g + 8 * floordiv(i, 2)
    col = bx * BN + wn * WN + y * 8 + t * 2 + floormod(i, 2)
    vals = gm.values(bz, row, col, None)
    out_idx = [vals[v] for v in gm.out_vars]
    value = gm.epilogue(out_idx, acc[(x * NT + y) * 4 + i])
    if value.dtype != gm.out.dtype:
        value = E.Cast(gm.out.dtype, value)
    ok = row < M
    if not isinstance(N, int) or N % BN:
        ok = ok & (col < N)
    store = For(x, 0, MT, "unrolled", For(y, 0, NT, "unrolled", For(
        i, 0, 4, "unrolled", IfThenElse(ok, BufferStore(gm.out, value, out_idx)))))
    zero = [For(i, 0, MT * NT * 4, "unrolled", BufferStore(buf, const(0.0, f32), [i]))
            for buf in ([acc, acc_s] if small_acc else [acc])]
    # the small terms' sums joined to the big terms' once, at the end
    join = [For(i, 0, MT * NT * 4, "unrolled", BufferStore(acc, acc[i] + acc_s[i], [i]))] \
        if small_acc else []
    thread = seq(
        *zero,
        fetch_a(0), fetch_b(0), stash_a(), stash_b(),
        For(kt, 0, KT, "serial", step),
        *join,
        store)
    locals_ = [rb, ra, b_val, a_val, b_big, a_big] + ([b_small, a_small] if three else [])
    for buf in locals_ + ([acc_s] if small_acc else []) + [acc]:
        thread = Allocate(buf, thread)
    body = For(tx, 0, threads, "thread_binding", thread, thread_tag="threadIdx.x")
    body = Allocate(Bs, Allocate(As, body))
    body = For(bx, 0, floordiv(N + (BN - 1), BN), "thread_binding", body,
               thread_tag="blockIdx.x")
    body = For(by, 0, floordiv(M + (BM - 1), BM), "thread_binding", body,
               thread_tag="blockIdx.y")
    if gm.batch_vars:
        body = For(bz, 0, nbatch, "thread_binding", body, thread_tag="blockIdx.z")
    return body
