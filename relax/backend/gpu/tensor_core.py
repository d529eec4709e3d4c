"""The tensor-core fp16 GEMM of NVIDIA OpenCL: float16 x float16 -> float32-accumulated dense,
matmul, batch matmul and convolution (as an implicit GEMM) kernels — what
``relax.quantize(mod, "fp16")`` makes of a model's linear layers — on ``mma.sync.m16n8k16``
through inline PTX, for ``Target("opencl -device=nvidia")`` (``Target.tensor_cores``), built
directly as a scheduled TensorIR function.

``gpu_schedules.apply`` tries it first on such a target: ``match_fp16_gemm`` reads the fused
PrimFunc — after its spatial producers (casts, paddings, transposes) are inlined, one
reduction ``C[idx] += f32(a) * f32(b)`` of two float16 expressions and at most one elementwise
epilogue block after it (bias, residual, GELU, ReLU, the cast to the output's dtype: whatever
the fused function computes from ``C[idx]``) — and ``tensor_core_kernel`` builds the kernel
with that epilogue applied to the float32 accumulators before the store. The output's dims
read by both operands are the batch (``blockIdx.z``), those read by ``a`` only the rows (M,
their product), by ``b`` only the columns (N; ``b`` is the operand that reads the output's last
dim), the reduction dims together K. Where the function is not of that form it raises
``ValueError`` with the reason, and the default GEMM schedule runs instead
(``TILECRAFT_DEBUG_SCHEDULES=1`` names it).

The kernel (``TensorCoreTile``: ``BM x BN`` outputs per work-group, ``WM x WN`` per warp):

* per step of ``BK`` (32, else 16) along k, the work-group copies a's ``BM x BK`` tile and b's
  ``BK x BN`` tile into shared memory as pairs of halves (uint32 words): with a ``cp.async``
  ring of 3 stages by default (``TensorCoreOptions.stages``; plain operands), the copy of step
  ``kt + S - 1`` in flight during step ``kt``'s mma, else staged in registers (the next
  step's tiles read from global memory before this step's mma, written to shared memory
  after them). a's tile is stored k-contiguous, rows ``BK / 2 + 4`` words long (the 4 words
  of padding put the 8 rows a fragment load touches into different banks and keep rows
  16-byte aligned), b's too, except a ``kn`` weight under ``ldmatrix``: k-major, rows of
  ``BN / 2 + 4`` words. How a tile is read from global memory (``a_mode`` / ``b_mode``):

  - ``"rows"`` (a) / ``"nk"`` (b): a plain ``(.., rows, K)`` / ``(.., N, K)`` float16 tensor,
    16-byte loads of 8 halves (``TC_LOAD_B128``); for ``a`` also a tensor whose trailing dims
    are the reduction's, fastest a multiple of 16 (an OHWI convolution weight ``W[o, kh, kw,
    c]``, as ``relax.transform.ConvWeightOHWI`` stores a constant one), k then in its order;
  - ``"kn"`` (b): a plain ``(.., K, N)`` tensor (a weight as ``matmul`` takes it): rows ``k``
    and ``k + 1`` of 8 columns as two 16-byte loads, their halves paired into 8 words;
  - ``"gather"``: anything else — a convolution's window over its padded input (an implicit
    GEMM), an input whose float32 -> float16 cast is fused in, several reduction dims, K not a
    multiple of 16 (the tail zero-filled) — one word (two halves along k) a thread per unit,
    each half read through the fused function's own expression; a's units k fastest, b's the
    columns fastest (a convolution's neighbouring pixels). Several reduction dims run with
    the one of a multiple of 16 (a convolution's input channels) fastest, so that a k-step
    is one window position (``_gather_word``);

  every copy binds what its units share once a k-step and, of that, what no k-step changes
  once a thread (``_CopyHoist``: a thread's row or pixel, a step's window position, padding
  checks and base address), leaving each unit its own constant offset;

  rows and columns past M and N are read clamped, the outermost variable of a flattened
  group at its extent - 1 (provably in bounds: no in-kernel check; their results are never
  stored);
* per k16 each warp loads its fragments from shared memory with ``ldmatrix.x4`` (``.trans``
  for the k-major tile; ``TensorCoreOptions.ldmatrix``), else as 32-bit words (the PTX
  fragment layout, ``targets.opencl_backend.tensor_core``), and issues ``WM / 16 x WN / 8``
  mma;
* the accumulators (``WM x WN / 32`` floats a thread) go through the epilogue into the output,
  rows past M and columns past N not stored; under split-K (few work-groups, a long K:
  ``split_parts``) each of ``S`` work-groups of a tile sums its part of K into float32
  partials instead, and a second kernel adds them up through the epilogue.

M, N and the batch may be symbolic; K is a constant. A symbolic M gets two kernels where their
tiles differ, the host choosing per call: one sized for few rows (BERT at batch 1) and one for
many (``TC_SMALL_ROWS``). So does a symbolic N under a constant M (a convolution's batch in
NCHW: its columns are ``(n, h, w)``; ``TILECRAFT_TC_COLUMN_DISPATCH=0``: one kernel): one
sized for the columns at batch 1 (``small_columns``: the tile of ``TC_SMALL_COLUMN_TILES``
and the split-K of those columns) below ``TC_SMALL_COLUMNS_FACTOR`` times them, and the
many-columns kernel (sized for ``TC_NOMINAL_ROWS`` columns) from there on.

Examples
--------
>>> from tilecraft.tensorir import te
>>> n = te.var("n")
>>> A = te.placeholder((n, 64), "float16", "A")
>>> W = te.placeholder((64, 128), "float16", "W")
>>> k = te.reduce_axis((0, 64), "k")
>>> C = te.compute((n, 128), lambda i, j: te.sum(A[i, k].astype("float32") *
...                W[k, j].astype("float32"), axis=k), "C")
>>> f = tensor_core_kernel(te.create_prim_func([A, W, C]), Target("opencl -device=nvidia"))
>>> f.attr_dict["tir.is_scheduled"]
True
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tilecraft.targets import Target
from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import expr as E
from tilecraft.tensorir.expr import (BufferLoad, Cast, IntImm, Select, Var, call, const,
                                     floordiv, floormod)
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import IRMutator, free_vars, post_order_visit, substitute
from tilecraft.tensorir.schedule import KernelTemplate, Schedule
from tilecraft.tensorir.structural import structural_equal
from tilecraft.tensorir.transform.device import barrier
from tilecraft.tensorir.stmt import (Allocate, AssertStmt, BlockRealize, Buffer, BufferStore,
                                     Evaluate, For, IfThenElse, LetStmt, seq)

from .schedule_utils import inline_spatial_producers, is_reduction, is_spatial, node_of

__all__ = ["TensorCoreGemm", "TensorCoreOptions", "TensorCoreTile", "TC_TILES", "TC_MIN_GROUPS",
           "TC_NOMINAL_ROWS", "TC_SMALL_ROWS", "TC_SMALL_NOMINAL_ROWS", "TC_SMALL_COLUMN_TILES",
           "TC_SMALL_COLUMN_PIXELS", "TC_SMALL_COLUMNS_FACTOR", "small_columns",
           "column_dispatch", "few_columns_tile", "TC_SPLITK_GROUPS",
           "TC_SPLITK_MIN_K", "TC_SPLITK_MIN_STEPS", "TC_SPLITK_MAX", "match_fp16_gemm",
           "tensor_core_kernel", "tile_problem", "choose_tile", "split_parts", "clamp_index",
           "load_b128", "k_step", "TC_TUNE_TILES", "TEMPLATE"]

_PAD = 4             # words added to the shared tiles' rows (banks; 16-byte alignment kept)
_OPAQUE = 8          # relax OpPattern.OPAQUE


@dataclass(frozen=True)
class TensorCoreOptions:
    """The kernel's code-generation choices, read from the environment at build time
    (``TensorCoreOptions.from_env``) so that one GPU run can time each:

    * ``ldmatrix`` (``TILECRAFT_TC_LDMATRIX=0/1``, default 1): fragments loaded with
      ``ldmatrix.x4`` (four 8 x 8 matrices a warp an instruction; ``.trans`` for a ``kn``
      weight, whose shared tile is then k-major, copied in 16-byte rows) instead of one 32-bit
      shared load a register;
    * ``stages`` (``TILECRAFT_TC_STAGES=1/2/3``, default 3): 2 or 3 copy the next k-steps'
      tiles with ``cp.async`` into a ring of that many shared tiles (for plain operands only —
      ``a_mode`` ``"rows"``, ``b_mode`` ``"nk"``, or ``"kn"`` with ``ldmatrix`` — else 1;
      where the ring of k-steps of 32 would pass the target's shared memory, k-steps of 16,
      else fewer stages); 1 stages the next k-step's tiles in registers. Every k-step has a
      barrier after its wait, so no warp reads a stage before every thread's copies into it
      have landed (the last S - 1 k-steps once lacked it: wrong results on the GPU, which the
      emulation, whose ``cp.async`` lands at the wait, now catches); on an H100 every device
      test passes under 2 and 3 stages, and 3 times as fast as register staging or faster
      (``benchmarks.gpu_tensor_core``'s variants ``all3`` / ``ldm_split``);
    * ``split_k`` (``TILECRAFT_TC_SPLITK=0/1``, default 1): a GEMM whose tiles fill few
      multiprocessors and whose K is long (``split_parts``) runs as two kernels: the
      tensor-core kernel over ``S`` parts of K writing float32 partials, then their sum with
      the epilogue.
    """
    ldmatrix: bool = True
    stages: int = 3
    split_k: bool = True

    @staticmethod
    def from_env() -> "TensorCoreOptions":
        def flag(name, default):
            v = os.environ.get(name, "")
            if v == "":
                return default
            if v not in ("0", "1", "2", "3"):
                raise ValueError(f"{name}={v!r}: expected an integer 0..3")
            return int(v)
        stages = flag("TILECRAFT_TC_STAGES", TensorCoreOptions.stages)
        if stages not in (1, 2, 3):
            raise ValueError(f"TILECRAFT_TC_STAGES={stages}: expected 1, 2 or 3")
        return TensorCoreOptions(ldmatrix=bool(flag("TILECRAFT_TC_LDMATRIX", 1)),
                                 stages=stages, split_k=bool(flag("TILECRAFT_TC_SPLITK", 1)))


@dataclass(frozen=True)
class TensorCoreTile:
    """A work-group's ``BM x BN`` output tile of warps of ``WM x WN`` (multiples of 16 x 8)."""
    BM: int
    BN: int
    WM: int
    WN: int

    @property
    def warps(self) -> int:
        return (self.BM // self.WM) * (self.BN // self.WN)

    def __str__(self):
        return f"{self.BM}x{self.BN}x{self.WM}x{self.WN}"


# From the largest: the first whose work-groups fill the GPU (``TC_MIN_GROUPS``) at the
# kernel's row count (a symbolic one counted as ``TC_NOMINAL_ROWS``) is taken.
# (128 x 128 of 8 warps of 64 x 32: 64 accumulators a thread; 4 warps of 64 x 64 would take
# 128, and with the fragments and staging registers NVIDIA's 255 a thread are close)
TC_TILES = (TensorCoreTile(128, 128, 64, 32), TensorCoreTile(64, 128, 32, 64),
            TensorCoreTile(64, 64, 32, 32), TensorCoreTile(32, 64, 32, 32))
# The few-columns kernel of a symbolic column count (a convolution at batch 1: 49 to 3136
# columns) picks from these, the same way: TC_TILES and two smaller tiles of 4 warps each
# (64 x 32 of warps 32 x 16, 32 x 32 of warps 16 x 16), which give the 7x7 and 14x14 layers of
# ResNet-50 4x to 8x the work-groups of 32 x 64 (512 x 49 columns: 32 of 32 x 32, then
# split-K; 32 x 64 gave 16)
TC_SMALL_COLUMN_TILES = TC_TILES + (TensorCoreTile(64, 32, 32, 16),
                                    TensorCoreTile(32, 32, 16, 16))
# The tiles the tuner tries (``relax.tensor_core_space``): those above and a few more shapes
# (4 warps of 64 x 64; 4 warps of 64 x 32 in a 128 x 64 tile)
TC_TUNE_TILES = TC_TILES + (TensorCoreTile(128, 128, 64, 64), TensorCoreTile(128, 64, 64, 32)) \
    + TC_SMALL_COLUMN_TILES[len(TC_TILES):]
TC_MIN_GROUPS = 132       # the H100's multiprocessors
TC_NOMINAL_ROWS = 2048    # BERT at batch 16, sequence 128
# A symbolic row count below TC_SMALL_ROWS runs a second kernel, its tile chosen for
# TC_SMALL_NOMINAL_ROWS rows (BERT at batch 1: 128 rows; a 64 x 128 tile gave 768-wide layers
# 12 work-groups)
TC_SMALL_ROWS = 512
TC_SMALL_NOMINAL_ROWS = 128
# A symbolic column count under a constant row count (column dispatch, ``small_columns``): the
# few-columns kernel is sized for the columns with every symbolic dim at 1 (a convolution at
# batch 1) where those are at least TC_SMALL_COLUMN_PIXELS (a convolution's output pixels),
# else for them times the least factor reaching TC_SMALL_NOMINAL_ROWS (a lone symbolic dim:
# as rows); it runs below TC_SMALL_COLUMNS_FACTOR times that (a 7x7 layer up to batch 3)
TC_SMALL_COLUMN_PIXELS = 16
TC_SMALL_COLUMNS_FACTOR = TC_SMALL_ROWS // TC_SMALL_NOMINAL_ROWS
# Split-K (TensorCoreOptions.split_k): where a kernel's work-groups (at its nominal row count)
# are fewer than TC_SPLITK_GROUPS and K is at least TC_SPLITK_MIN_K, K is split into the
# fewest parts (dividing its k-steps, at least TC_SPLITK_MIN_STEPS each, at most
# TC_SPLITK_MAX) whose work-groups reach TC_MIN_GROUPS. BERT-base at batch 1: the 3072 -> 768
# layer (48 work-groups of 32 x 64, 96 k-steps) in 3 parts.
TC_SPLITK_GROUPS = TC_MIN_GROUPS // 2
TC_SPLITK_MIN_K = 1024
TC_SPLITK_MIN_STEPS = 8
TC_SPLITK_MAX = 8
SUM_THREADS = 256        # threads a work-group of the partials' sum


@dataclass(frozen=True)
class TensorCoreGemm:
    """What ``match_fp16_gemm`` found in a fused function: the GEMM's float16 operand
    expressions ``a`` (rows x k) and ``b`` (k x columns) over the reduction block's iteration
    variables, grouped into batch (read by both), row (``a`` only) and column (``b`` only)
    variables, the reduction variables (K is their product, the last fastest), how each
    operand is copied, and the epilogue."""
    func: PrimFunc
    a: object           # float16 PrimExpr
    b: object
    batch_vars: tuple
    row_vars: tuple
    col_vars: tuple
    k_vars: tuple
    extents: dict       # iteration variable -> extent
    out_vars: tuple     # the output's index variables, in order
    a_mode: str         # "rows": a read as (.., i, k), k contiguous; "gather": any expression
    b_mode: str         # "kn", "nk" (plain reads of a (.., k, j) / (.., j, k) tensor), "gather"
    out: Buffer
    epilogue: object    # ``(out_indices, value) -> PrimExpr``: the stored value

    def product(self, variables):
        """The product of the variables' extents (an int where they are constants)."""
        n = 1
        for v in variables:
            n = n * self.extents[v]
        n = arith.simplify(n) if isinstance(n, E.PrimExpr) else n
        return E.as_int(n) if E.as_int(n) is not None else n

    @property
    def K(self) -> int:
        return self.product(self.k_vars)

    @property
    def N(self):
        return self.product(self.col_vars)

    @property
    def M(self):
        return self.product(self.row_vars)

    def a_at(self, bz, row, k):
        """``a``'s expression at flat batch ``bz``, flat row ``row`` and flat ``k``."""
        return substitute(self.a, self.values(bz, row, None, k))

    def b_at(self, bz, col, k):
        """``b``'s expression at flat batch ``bz``, flat column ``col`` and flat ``k``."""
        return substitute(self.b, self.values(bz, None, col, k))

    def values(self, bz, row, col, k) -> dict:
        """The iteration variables' values at flat batch ``bz``, row, column and ``k``."""
        out = {}
        for group, flat in ((self.batch_vars, bz), (self.row_vars, row),
                            (self.col_vars, col), (self.k_vars, k)):
            if flat is not None and group:
                out.update(zip(group, _unflatten(flat, [self.extents[v] for v in group])))
        return out


def _plain_vars(indices) -> bool:
    return all(isinstance(i, Var) for i in indices)


def match_fp16_gemm(func: PrimFunc, dtype: str = "float16") -> TensorCoreGemm:
    """The fp16 GEMM of ``func`` (see the module docstring), or ``ValueError`` saying why
    ``func`` is not one. ``dtype="float32"``: a float32 GEMM instead (products of float32
    values, not casts: the 3xTF32 kernel's, ``tensor_core_tf32``)."""
    sch = Schedule(func)
    inline_spatial_producers(sch)    # casts, bias adds, activations: GEMM and epilogue remain
    root = sch.get_root()
    blocks = [node_of(sch, b) for b in sch.get_child_blocks(sch.get_block(root.name))]
    if not blocks or not is_reduction(blocks[0]) or len(blocks) > 2 or \
            (len(blocks) == 2 and not is_spatial(blocks[1])):
        raise ValueError("not one reduction followed by at most one elementwise block")
    g = blocks[0]
    params = {id(b) for _, b in func.buffer_map}
    body = g.body
    if not isinstance(body, BufferStore) or g.init is None:
        raise ValueError("the reduction is not a single accumulation with an init")
    C, idx = body.buffer, body.indices
    v = body.value
    if C.dtype != "float32" or not (isinstance(v, E.Add) and isinstance(v.a, BufferLoad) and
                                    v.a.buffer is C and isinstance(v.b, E.Mul)):
        raise ValueError("not a float32 sum of products")
    ops = []
    for x in (v.b.a, v.b.b):
        if dtype == "float32" and x.dtype == "float32" and not isinstance(x, Cast):
            ops.append(x)
            continue
        if not (isinstance(x, Cast) and x.value.dtype == dtype):
            raise ValueError(f"the products are not of {dtype} values" +
                             (" cast to float32" if dtype != "float32" else ""))
        ops.append(x.value)
    init = g.init
    if not (isinstance(init, BufferStore) and isinstance(init.value, E.FloatImm) and
            init.value.value == 0.0):
        raise ValueError("the accumulator does not start at 0")
    spatial = [iv.var for iv in g.iter_vars if iv.kind == "spatial"]
    k_vars = tuple(iv.var for iv in g.iter_vars if iv.kind == "reduce")
    extents = {iv.var: iv.dom.extent for iv in g.iter_vars}
    if not _plain_vars(idx) or len(idx) < 2 or not _same(spatial, idx):
        raise ValueError("the reduction does not store at its own indices")
    for kv in k_vars:
        if E.as_int(extents[kv]) is None:
            raise ValueError("a reduction extent is not a constant")
    # reduction dims of extent 1 (a 1 x 1 convolution's window) are index 0
    unit = [kv for kv in k_vars if E.as_int(extents[kv]) == 1]
    if unit and len(unit) < len(k_vars):
        zero = {kv: IntImm(0, kv.dtype) for kv in unit}
        ops = [_SimplifyIndices().visit(substitute(op, zero)) for op in ops]
        k_vars = tuple(kv for kv in k_vars if E.as_int(extents[kv]) != 1)

    def used(e) -> set:
        found = set()
        post_order_visit(e, lambda n: found.add(n) if isinstance(n, Var) else None)
        return found
    ua, ub = used(ops[0]), used(ops[1])
    last = idx[-1]
    if (last in ua) == (last in ub):
        raise ValueError("the output's last dim is not read by exactly one operand")
    a, b = (ops[0], ops[1]) if last in ub else (ops[1], ops[0])
    ua, ub = used(a), used(b)
    batch_vars = tuple(x for x in idx if (x in ua) == (x in ub))
    row_vars = tuple(x for x in idx if x in ua and x not in ub)
    col_vars = tuple(x for x in idx if x in ub and x not in ua)
    col_set = set(col_vars)
    if not row_vars:
        raise ValueError("no output dim is read by one operand only (not an outer product)")
    _check_batch_bounds((a, b), set(idx), extents)

    K = 1
    for kv in k_vars:
        K *= E.as_int(extents[kv])
    # Several reduction dims (a convolution's c, kh, kw): the one whose extent is a multiple
    # of 16 (the channels) goes last, fastest along k. Both operands read k in the same
    # order, so any order is the same sum; in this one a k-step of 16 or 32 runs over
    # channels alone, the window position (kh, kw) uniform a step: the gathered copy then
    # computes its window's bounds and base address once a step, not once an element
    # (``_gather_plan``).
    channel = [kv for kv in k_vars if E.as_int(extents[kv]) % 16 == 0]
    if len(k_vars) > 1 and channel and channel[0] is not k_vars[-1]:
        k_vars = tuple(kv for kv in k_vars if kv is not channel[0]) + (channel[0],)
    kv = k_vars[0] if len(k_vars) == 1 else None
    a_mode = "gather"
    ai = _significant(a) if _plain_load(a, params) else None
    if ai is not None and kv is not None and K % 16 == 0 and \
            _same(ai, [x for x in idx if x in ua] + [kv]) and \
            _same(ai[-1 - len(row_vars):-1], row_vars):
        a_mode = "rows"           # (batch.., rows.., k): a row is K contiguous halves
    elif ai is not None and len(k_vars) > 1 and _rows_of_dims(ai, idx, ua, row_vars, k_vars,
                                                               extents):
        # a convolution's weight stored OHWI (``relax.transform.ConvWeightOHWI``):
        # W[o, kh, kw, c], its trailing dims the reduction's, channels fastest — a row is
        # K contiguous halves too; k runs in the tensor's order (any order is the same sum)
        a_mode = "rows"
        k_vars = tuple(ai[len(ai) - len(k_vars):])
    gm = dict(func=func, a=a, b=b, batch_vars=batch_vars, row_vars=row_vars,
              col_vars=col_vars, k_vars=k_vars, extents=extents, out_vars=tuple(idx))
    b_mode = "gather"
    bi = _significant(b) if _plain_load(b, params) else None
    if bi is not None and kv is not None and K % 16 == 0 and any(x is kv for x in bi):
        p = [q for q, x in enumerate(bi) if x is kv][0]
        inner, outer = bi[p + 1:], bi[:p]
        inner_n = 1
        for x in inner:
            inner_n *= E.as_int(extents.get(x)) or 0 if x in col_set else 0
        if inner and inner_n > 0 and inner_n % 8 == 0 and \
                _same(inner, col_vars[len(col_vars) - len(inner):]) \
                and _same(outer, [x for x in idx if x in ub and
                                  not any(x is y for y in inner)]):
            # (.., k, columns..): 8 neighbouring columns are 16 contiguous bytes (a (K, N)
            # weight; a 1 x 1 convolution's NCHW input whose H x W is a multiple of 8)
            b_mode = "kn"
        elif len(col_vars) == 1 and p == len(bi) - 1 and len(bi) >= 2 and \
                bi[-2] is last and _same(bi[:-2], [x for x in idx if x in ub and
                                                   x not in col_set]):
            b_mode = "nk"

    if len(blocks) == 1:
        if id(C) not in params:
            raise ValueError("the accumulator is neither an output nor read by an epilogue")
        out, epilogue = C, (lambda out_idx, acc: acc)
    else:
        ep = blocks[1]
        st = ep.body
        if id(C) in params or not isinstance(st, BufferStore) or id(st.buffer) not in params:
            raise ValueError("the epilogue is not one store into an output")
        evars = [iv.var for iv in ep.iter_vars]
        if not _same(st.indices, evars) or len(evars) != len(idx):
            raise ValueError("the epilogue does not store at its own indices")
        bad = []

        def check(n):
            if isinstance(n, BufferLoad) and n.buffer is C and not _same(n.indices, evars):
                bad.append(n)
        post_order_visit(st.value, check)
        if bad:
            raise ValueError("the epilogue reads the accumulator at other indices")
        out, value = st.buffer, st.value

        def epilogue(out_idx, acc, evars=evars, value=value, C=C):
            return _Epilogue(C, acc, dict(zip(evars, out_idx))).visit(value)
    return TensorCoreGemm(**gm, a_mode=a_mode, b_mode=b_mode, out=out, epilogue=epilogue)


def _rows_of_dims(ai, idx, ua, row_vars, k_vars, extents) -> bool:
    """Whether a plain read of ``a`` at ``ai`` is ``(batch.., rows.., k1, .., kn)`` with its
    trailing dims exactly the reduction variables ``k_vars`` (in any order) — contiguous
    rows of K halves, as an OHWI convolution weight's ``W[o, kh, kw, c]`` — with K a multiple
    of 16 and the fastest of them (the channels) a multiple of 16 too (a k-step of 16 or 32
    stays in one window position, as the gathered operand's copy has it:
    ``_gather_word``), so each 8-half piece is 16-byte aligned."""
    n = len(k_vars)
    if len(ai) <= n:
        return False
    tail = ai[len(ai) - n:]
    if {id(x) for x in tail} != {id(x) for x in k_vars} or len({id(x) for x in tail}) != n:
        return False
    K = 1
    for x in tail:
        K *= E.as_int(extents[x])
    return K % 16 == 0 and E.as_int(extents[tail[-1]]) % 16 == 0 and \
        _same(ai[:len(ai) - n], [x for x in idx if x in ua]) and \
        _same(ai[len(ai) - n - len(row_vars):len(ai) - n], row_vars)


def _same(xs, ys) -> bool:
    """Whether two sequences hold the same nodes (by identity: ``==`` on expressions builds
    an expression)."""
    xs, ys = list(xs), list(ys)
    return len(xs) == len(ys) and all(x is y for x, y in zip(xs, ys))


def _plain_load(e, params) -> bool:
    """Whether ``e`` reads a float16 parameter (a compact tensor) at plain variables (or 0 on
    a dim of 1)."""
    return isinstance(e, BufferLoad) and id(e.buffer) in params and \
        e.buffer.strides is None and _significant(e) is not None


def _significant(load: BufferLoad) -> list | None:
    """The index variables of ``load`` without the dims of extent 1 it reads at 0 (which do
    not change its address); None where an index is neither."""
    out = []
    for i, dim in zip(load.indices, load.buffer.shape):
        if isinstance(i, Var):
            out.append(i)
        elif not (E.as_int(i) == 0 and E.as_int(dim) == 1):
            return None
    return out


def _check_batch_bounds(operands, variables, extents) -> None:
    """``ValueError`` where an operand reads a dim at one of ``variables`` whose extent is not
    the variable's (another symbolic dim, equal by a run-time check only: the bounds of the
    reads could not be proven from the grid)."""
    bad = []

    def visit(n):
        if isinstance(n, BufferLoad):
            for d, i in enumerate(n.indices):
                if isinstance(i, Var) and i in variables and \
                        not structural_equal(n.buffer.shape[d], extents[i]):
                    bad.append((n.buffer.name, d, n.buffer.shape[d], extents[i]))
    for op in operands:
        post_order_visit(op, visit)
    if bad:
        name, d, dim, ext = bad[0]
        raise ValueError(f"{name}'s dim {d} is {dim}, not the output's {ext}")


class _SimplifyIndices(IRMutator):
    """Buffer indices simplified (``h + 0`` -> ``h``)."""

    def visit_Buffer(self, buf):
        return buf

    def visit_BufferLoad(self, e):
        return BufferLoad(e.buffer, [arith.simplify(self.visit(i)) for i in e.indices])


class _Epilogue(IRMutator):
    """The epilogue's value with the accumulator's loads replaced by ``acc`` and its index
    variables by the kernel's indices."""

    def __init__(self, C: Buffer, acc, vmap: dict):
        super().__init__()
        self.C, self.acc, self.vmap = C, acc, vmap

    def visit_Buffer(self, buf):
        return buf

    def visit_Var(self, v):
        return self.vmap.get(v, v)

    def visit_BufferLoad(self, e):
        if e.buffer is self.C:
            return self.acc
        return BufferLoad(e.buffer, [self.visit(i) for i in e.indices])


def _host_asserts(func: PrimFunc) -> list:
    """(condition, message) of the checks at the top of ``func``'s root block (a legalized
    matmul's ``assert b == b_1``)."""
    body = func.body
    if isinstance(body, BlockRealize):
        body = body.block.body
    out = []
    while isinstance(body, AssertStmt):
        out.append((body.condition, body.message))
        body = body.body
    return out


def choose_tile(m, N: int, tiles: tuple = TC_TILES) -> TensorCoreTile:
    """The first of ``tiles`` (``TILECRAFT_TC_TILE=BMxBNxWMxWN`` overrides) whose
    work-groups reach ``TC_MIN_GROUPS`` at ``m`` rows (None: ``TC_NOMINAL_ROWS``), else the
    last (the smallest).

    >>> choose_tile(512, 49, TC_SMALL_COLUMN_TILES)
    TensorCoreTile(BM=32, BN=32, WM=16, WN=16)
    """
    forced = os.environ.get("TILECRAFT_TC_TILE")
    if forced:
        return TensorCoreTile(*(int(x) for x in forced.lower().split("x")))
    m = TC_NOMINAL_ROWS if m is None else m
    for tile in tiles:
        if -(-m // tile.BM) * -(-N // tile.BN) >= TC_MIN_GROUPS:
            return tile
    return tiles[-1]


def small_columns(gm: TensorCoreGemm) -> int | None:
    """The column count the few-columns kernel of ``gm`` is sized for (None: the columns are
    a constant): ``gm.N`` with its symbolic dims at 1 (a convolution's output pixels at batch
    1) where that is at least ``TC_SMALL_COLUMN_PIXELS``, else that times the least factor
    reaching ``TC_SMALL_NOMINAL_ROWS``."""
    N = gm.N
    if isinstance(N, int):
        return None
    at1 = E.as_int(arith.simplify(substitute(N, {v: IntImm(1, v.dtype) for v in free_vars(N)})))
    if at1 is None or at1 < 1:
        return None
    if at1 >= TC_SMALL_COLUMN_PIXELS:
        return at1
    return at1 * -(-TC_SMALL_NOMINAL_ROWS // at1)


def column_dispatch(gm: TensorCoreGemm) -> int | None:
    """The few-columns kernel's column count where ``gm`` gets the column dispatch (a
    constant row count, a symbolic column count, ``TILECRAFT_TC_COLUMN_DISPATCH`` not 0),
    else None. It runs while ``N < TC_SMALL_COLUMNS_FACTOR * small_columns(gm)``."""
    if os.environ.get("TILECRAFT_TC_COLUMN_DISPATCH", "1") == "0" or not isinstance(gm.M, int):
        return None
    return small_columns(gm)


def split_parts(m, N, K: int, BK: int, tile: TensorCoreTile, nbatch=1) -> int:
    """The parts split-K cuts K into (1: none) for ``m`` rows (a constant, or the kernel's
    nominal row count), ``N`` columns (a symbolic one counted as ``TC_NOMINAL_ROWS``), a
    constant batch ``nbatch`` (a symbolic one: 1) and ``tile``, by the rule of
    ``TC_SPLITK_GROUPS``.

    >>> split_parts(128, 768, 3072, 32, TensorCoreTile(32, 64, 32, 32))
    3
    """
    N = N if isinstance(N, int) else TC_NOMINAL_ROWS
    nbatch = nbatch if isinstance(nbatch, int) else 1
    groups = -(-m // tile.BM) * -(-N // tile.BN) * nbatch
    steps = K // BK
    if K % BK or K < TC_SPLITK_MIN_K or groups >= TC_SPLITK_GROUPS:
        return 1
    allowed = [s for s in range(2, TC_SPLITK_MAX + 1)
               if steps % s == 0 and steps // s >= TC_SPLITK_MIN_STEPS]
    for s in allowed:
        if groups * s >= TC_MIN_GROUPS:
            return s
    return allowed[-1] if allowed else 1


def clamp_index(v, n):
    """``v``, or ``n - 1`` past the end: rows and columns past M and N are read clamped (their
    results are never stored)."""
    return Select(v < n, v, n - 1)


def load_b128(dst, src):
    """A 16-byte copy of ``src`` to ``dst`` (``TC_LOAD_B128``: 8 halves / 4 words)."""
    return Evaluate(call(E.TC_LOAD_B128, dst, src, dtype="int32"))


def _unflatten(flat, extents) -> list:
    """The indices of the flat index ``flat`` over dims of ``extents`` (the last fastest)."""
    out, rest = [], flat
    for ext in reversed(extents[1:]):
        out.append(floormod(rest, ext))
        rest = floordiv(rest, ext)
    return ([rest] if extents else []) + out[::-1]


def _step(k0, BK: int):
    """The k-step of a first k ``k0`` (a multiple of ``BK``)."""
    return arith.simplify(floordiv(k0, BK))


def _split_unit(e: Var, tx: Var, threads: int, m: int):
    """``(q_e, q_t, r)``: copy unit ``u = e * threads + tx`` as ``u // m = q_e + q_t`` and
    ``u % m = r``, with the part that depends on the unrolled ``e`` apart (``q_e``; a
    constant once unrolled) where ``threads`` and ``m`` allow, so that what a thread's units
    share is an expression of its own."""
    if threads % m == 0:
        return e * (threads // m), floordiv(tx, m), floormod(tx, m)
    if m % threads == 0:
        per = m // threads
        return floordiv(e, per), IntImm(0, tx.dtype), floormod(e, per) * threads + tx
    u = e * threads + tx
    return IntImm(0, tx.dtype), floordiv(u, m), floormod(u, m)


def _clamped_values(gm: TensorCoreGemm, group, flat, total) -> dict:
    """The values of the iteration variables ``group`` at flat index ``flat`` (>= 0), read
    clamped past ``total`` (their product): the outermost is at most its extent - 1, so that
    every index stays in bounds by the ranges alone (no run-time check) and an index past
    the end reads some element (never stored)."""
    exts = [gm.extents[v] for v in group]
    if len(group) == 1:
        return {group[0]: E.min_(flat, total - 1) if E.as_int(total) is not None
                else clamp_index(flat, total)}
    vals = _unflatten(flat, exts)
    vals[0] = E.min_(vals[0], exts[0] - 1)
    if E.as_int(exts[0]) is None:       # (``_nonempty`` then proves ``exts[0] - 1 >= 0``)
        vals[0] = E.max_(vals[0], 0)
    return dict(zip(group, vals))


class _Hoist(IRMutator):
    """``e`` with each maximal integer or boolean subexpression of index arithmetic (no
    load, no call) that uses variables but none of ``varying`` replaced by a let variable;
    ``lets``: ``(var, value)`` in order, equal values sharing one."""

    def __init__(self, varying, prefix: str):
        super().__init__()
        self.varying, self.prefix, self.lets = set(varying), prefix, []

    def visit_Buffer(self, buf):
        return buf

    def visit(self, node, *args):
        if isinstance(node, E.PrimExpr) and not isinstance(node, (Var, IntImm, E.FloatImm)) and \
                (dt.is_integer(node.dtype) or node.dtype == "bool"):
            found, pure = set(), [True]

            def look(n):
                if isinstance(n, Var):
                    found.add(n)
                elif isinstance(n, (BufferLoad, E.Call)):
                    pure[0] = False
            post_order_visit(node, look)
            if pure[0] and found and not (found & self.varying):
                for var, value in self.lets:
                    if structural_equal(value, node):
                        return var
                var = Var(f"{self.prefix}{len(self.lets)}", node.dtype)
                self.lets.append((var, node))
                return var
        return super().visit(node, *args)


def _lets(lets, body):
    for var, value in reversed(lets):
        body = LetStmt(var, value, body)
    return body


class _CopyHoist:
    """The copies of a kernel's k-steps with what does not change along k computed once:
    ``copy(build, k0)`` is ``build``'s copy of the k-step from ``k0`` with every index
    subexpression that its units (the unrolled ``e``) share bound once a step, and of those,
    the ones that do not depend on the step (a thread's row or pixel, its image, its base
    address) bound once a thread, around the k loop (``wrap``)."""

    # (the let variables' names sort before the units' ``e``: the simplifier orders a sum's
    # terms by name, so a unit's index is the shared sum plus its own constant last, a
    # common subexpression of all the units)
    def __init__(self, e: Var, BK: int):
        self.e, self.BK, self.copies = e, BK, 0
        self.thread = _Hoist({e}, "c_t")

    def copy(self, build, k0):
        """``build(step * BK)`` (the copy's statement at a k-step ``step``) at ``k0``."""
        step = Var(f"c_step{self.copies}", "int64")
        self.copies += 1
        self.thread.varying.add(step)
        per_step = _Hoist({self.e}, f"c_s{self.copies - 1}_")
        stmt = per_step.visit(build(step * self.BK))
        lets = [(var, self.thread.visit(value)) for var, value in per_step.lets]
        return LetStmt(step, _step(k0, self.BK), _lets(lets, stmt))

    def wrap(self, body):
        return _lets(self.thread.lets, body)


def _split_k(gm: TensorCoreGemm, k0, off, BK: int) -> dict:
    """The reduction variables' values at ``k0 + off`` (``k0`` a multiple of ``BK``, ``0 <=
    off < BK``) where the fastest one's extent (a convolution's channels) is a multiple of
    ``BK``: the others (the window position) the k-step's own, the fastest ``c0 + off`` — so
    a row piece's address is the step's base plus a constant, not a division a piece."""
    kc = gm.k_vars[-1]
    inner = E.as_int(gm.extents[kc])
    if inner is None or inner % BK:
        return gm.values(None, None, None, k0 + off)
    step = _step(k0, BK)
    per = inner // BK
    vals = {kc: (floormod(step, per) * BK if per > 1 else IntImm(0, "int64")) + off}
    outer = list(gm.k_vars[:-1])
    vals.update(zip(outer, _unflatten(floordiv(step, per) if per > 1 else step,
                                      [gm.extents[v] for v in outer])))
    return vals


def _gather_word(gm: TensorCoreGemm, operand, values: dict, k0, kp_e, kp_t, BK: int):
    """The word (two halves along k, packed) of a gathered unit of ``operand`` whose row or
    column variables are at ``values`` and whose k pair is ``kp_e + kp_t`` (``kp_e`` the part
    that depends on the unrolled unit: a constant once unrolled) in the k-step from ``k0``;
    None where a k-step does not stay within the fastest reduction dim (its extent not a
    multiple of ``BK``): the plain gather then.

    Along k the operand's fastest reduction dim ``kc`` (a convolution's input channels:
    ``match_fp16_gemm`` puts them last) runs ``c0 + r`` in a step (``c0`` the step's first,
    ``r`` the unit's k), the others (the window's ``kh``, ``kw``) are the step's own: a
    unit's halves differ from the step's values only by their ``kc``, so that every other
    subexpression (the padding's bounds checks, the pixel's row and column, the image) is the
    step's or the thread's (``_CopyHoist``), not the unit's."""
    if os.environ.get("TILECRAFT_TC_GATHER_PLAN", "1") == "0":
        return None           # the GPU A/B of the hoisting (benchmarks.gpu_tc_conv nohoist)
    kc = gm.k_vars[-1]
    inner = E.as_int(gm.extents[kc])
    if inner is None or inner % BK:
        return None
    outer = list(gm.k_vars[:-1])
    step = _step(k0, BK)
    per = inner // BK                       # k-steps along kc
    c0 = floormod(step, per) * BK if per > 1 else IntImm(0, "int64")
    vals = dict(values)
    if outer:
        vals.update(zip(outer, _unflatten(floordiv(step, per) if per > 1 else step,
                                          [gm.extents[v] for v in outer])))
    k_thread = c0 + kp_t * 2                # the unit's first k in kc, but its e part

    def half(j):
        vals[kc] = k_thread + (kp_e * 2 + j)
        return Cast("float32", _SimplifyIndices().visit(substitute(operand, vals)))
    return call(E.TC_PACK_HALF2, half(0), half(1), dtype="uint32")


def _nonempty(gm: TensorCoreGemm):
    """``extent >= 1`` of each symbolic outermost row or column variable of several (None:
    no such): always true where a work-group runs, it proves the clamped indices of
    ``_clamped_values`` in bounds (no run-time check a unit)."""
    cond = None
    for group in (gm.row_vars, gm.col_vars):
        ext0 = gm.extents[group[0]] if group else None
        if len(group) > 1 and E.as_int(ext0) is None:
            cond = ext0 >= 1 if cond is None else cond & (ext0 >= 1)
    return cond


def tensor_core_kernel(func: PrimFunc, target: Target, tile: TensorCoreTile | None = None,
                       opts: TensorCoreOptions | None = None,
                       small_tile: TensorCoreTile | None = None) -> PrimFunc:
    """``func`` (an fp16 GEMM with its epilogue, ``match_fp16_gemm``) as the tensor-core kernel
    for ``target`` (whose ``tensor_cores`` is set), with the parameters of ``func``. With a
    symbolic row count, two kernels where their tiles differ: ``small_tile`` (default: the
    tile for ``TC_SMALL_NOMINAL_ROWS`` rows) while M is below ``TC_SMALL_ROWS``, ``tile``
    (default: the tile for ``TC_NOMINAL_ROWS``) from there on (chosen per call on the host);
    a ``tile`` given without ``small_tile`` is used for every row count. A constant row count
    and a symbolic column count (``column_dispatch``) likewise: ``small_tile`` (default: of
    ``TC_SMALL_COLUMN_TILES`` for ``small_columns`` columns, split-K at those) while N is
    below ``TC_SMALL_COLUMNS_FACTOR * small_columns(gm)``, ``tile`` from there on (one
    kernel where ``few_columns_tile`` finds the latter fills the GPU already). ``opts``
    default to ``TensorCoreOptions.from_env()`` (what ``relax.build`` uses); the tuner passes
    its own (``relax.tensor_core_space``).

    Raises
    ------
    ValueError
        ``func`` is not such a GEMM, the target has no tensor cores, a tile is not made of
        warps or is over the target's threads or shared memory (``tile_problem``), or
        ``small_tile`` is given for a constant row and column count.

    Examples
    --------
    >>> f = tensor_core_kernel(dense16, Target("opencl -device=nvidia"),
    ...                        TensorCoreTile(64, 64, 32, 32),
    ...                        TensorCoreOptions(ldmatrix=False))      # doctest: +SKIP
    """
    if target.tensor_cores is None:
        raise ValueError(f"{target} has no tensor cores (Target('opencl -device=nvidia'))")
    gm = match_fp16_gemm(func)
    opts = TensorCoreOptions.from_env() if opts is None else opts
    if not isinstance(opts, TensorCoreOptions) or opts.stages not in (1, 2, 3):
        raise ValueError(f"opts must be TensorCoreOptions with stages 1, 2 or 3, got {opts!r}")
    limit = target.max_shared_memory_per_block
    M = gm.M
    m_const = M if isinstance(M, int) else None
    n_nominal = gm.N if isinstance(gm.N, int) else TC_NOMINAL_ROWS
    few_cols = column_dispatch(gm)
    if small_tile is not None and m_const is not None and few_cols is None:
        raise ValueError(f"small_tile {small_tile}: the row count {m_const} and the column "
                         f"count {gm.N} are not symbolic (one kernel, one tile)")
    for t in (tile, small_tile):
        why = tile_problem(t, gm, target) if t is not None else None
        if why:
            raise ValueError(why)
    if few_cols is not None and (tile is None or small_tile is not None):
        # the many-columns kernel as without the dispatch; the few-columns one sized for
        # the columns at batch 1 (its tile and split-K)
        tile = tile or choose_tile(m_const, n_nominal)
        body, tiles = _gemm(gm, M, tile, opts, m_const, limit)
        small = small_tile or few_columns_tile(gm, opts, tile)
        if small is None:
            small_body, small_tiles = body, tiles   # the many-columns kernel fills the GPU
        else:
            small_body, small_tiles = _gemm(gm, M, small, opts, m_const, limit, few_cols)
        if small_tiles != tiles:
            # over symbolic dims only: the host picks one of the two kernels
            bound = TC_SMALL_COLUMNS_FACTOR * few_cols
            body = IfThenElse(gm.N < bound, small_body, body)
            tiles = f"{small_tiles} below {bound} columns, else {tiles}"
    elif m_const is not None or (tile is not None and small_tile is None):
        tile = tile or choose_tile(m_const, n_nominal)
        body, tiles = _gemm(gm, M, tile, opts, m_const or TC_NOMINAL_ROWS, limit)
    else:
        large = tile or choose_tile(None, n_nominal)
        small = small_tile or choose_tile(TC_SMALL_NOMINAL_ROWS, n_nominal)
        body, tiles = _gemm(gm, M, large, opts, TC_NOMINAL_ROWS, limit)
        small_body, small_tiles = _gemm(gm, M, small, opts, TC_SMALL_NOMINAL_ROWS, limit)
        if small_tiles != tiles:
            # the condition is over symbolic dims only: the host picks one of the two kernels
            body = IfThenElse(M < TC_SMALL_ROWS, small_body, body)
            tiles = f"{small_tiles} below {TC_SMALL_ROWS} rows, else {tiles}"
    for cond, message in reversed(_host_asserts(func)):
        body = AssertStmt(cond, message, body)     # the function's own checks (equal dims)
    attrs = dict(func.attr_dict)
    attrs.update({"tir.is_scheduled": True, "tensor_core_tiles": tiles,
                  "tensor_core_options": f"ldmatrix={int(opts.ldmatrix)} stages={opts.stages} "
                                         f"split_k={int(opts.split_k)}"})
    return func.replace(body=body, attrs=attrs)


def tile_problem(tile: TensorCoreTile, gm: TensorCoreGemm, target: Target) -> str | None:
    """Why ``tile`` cannot make ``gm``'s kernel on ``target`` (None: it can): warps of
    ``WM x WN`` (multiples of 16 x 8) that do not divide ``BM x BN``, threads (32 a warp) over
    the target's limit, or shared tiles (one k-step, the register-staged kernel; the
    ``cp.async`` ring shrinks itself to fit) over its shared memory.

    >>> tile_problem(TensorCoreTile(64, 64, 24, 32), gm, target)     # doctest: +SKIP
    'tensor-core tile 64x64x24x32: warps of WM x WN (multiples of 16 x 8) must divide BM x BN'
    """
    if not isinstance(tile, TensorCoreTile):
        return f"a tensor-core tile must be a TensorCoreTile, got {tile!r}"
    BM, BN, WM, WN = tile.BM, tile.BN, tile.WM, tile.WN
    if min(BM, BN, WM, WN) <= 0 or BM % WM or BN % WN or WM % 16 or WN % 8:
        return (f"tensor-core tile {tile}: warps of WM x WN (multiples of 16 x 8) must "
                f"divide BM x BN")
    threads = 32 * tile.warps
    if threads > target.max_threads_per_block:
        return (f"tensor-core tile {tile}: {tile.warps} warps = {threads} threads per "
                f"work-group, over the target's {target.max_threads_per_block}")
    BK = k_step(gm)
    b_words = BN * (BK // 2 + _PAD)
    if gm.b_mode == "kn":        # k-major under ldmatrix: the larger of the two layouts
        b_words = max(b_words, BK * (BN // 2 + _PAD))
    words = BM * (BK // 2 + _PAD) + b_words
    if 4 * words > target.max_shared_memory_per_block:
        return (f"tensor-core tile {tile}: {4 * words} bytes of shared memory, over the "
                f"target's {target.max_shared_memory_per_block}")
    return None


def k_step(gm: TensorCoreGemm) -> int:
    """BK: 32 where K allows, else 16. With a gathered operand, a k-step within the fastest
    reduction dim (its extent a multiple of 32, else of 16: ``_gather_plan``)."""
    if "gather" in (gm.a_mode, gm.b_mode):
        inner = E.as_int(gm.extents[gm.k_vars[-1]])
        if inner % 32 == 0:
            return 32
        if inner % 16 == 0:
            return 16
    return 32 if gm.K % 32 == 0 or (gm.a_mode == gm.b_mode == "gather" and gm.K > 16) else 16


def few_columns_tile(gm: TensorCoreGemm, opts: TensorCoreOptions,
                     tile: TensorCoreTile | None = None) -> TensorCoreTile | None:
    """The default tile of ``gm``'s few-columns kernel (``column_dispatch``; of
    ``TC_SMALL_COLUMN_TILES``, ``TILECRAFT_TC_SMALL_TILE=BMxBNxWMxWN`` overrides), or None
    where there is none: no column dispatch, or the many-columns kernel of ``tile`` (default:
    its own) already has ``TC_MIN_GROUPS`` work-groups at the few columns.

    >>> few_columns_tile(tc_conv_512_7x7, TensorCoreOptions())        # doctest: +SKIP
    TensorCoreTile(BM=32, BN=32, WM=16, WN=16)
    """
    cols = column_dispatch(gm)
    if cols is None:
        return None
    tile = tile or choose_tile(gm.M, TC_NOMINAL_ROWS)
    if _groups(gm, tile, opts, gm.M, cols) >= TC_MIN_GROUPS:
        return None
    forced = os.environ.get("TILECRAFT_TC_SMALL_TILE")     # a GPU A/B of this kernel alone
    if forced:
        return TensorCoreTile(*(int(x) for x in forced.lower().split("x")))
    return choose_tile(gm.M, cols, TC_SMALL_COLUMN_TILES)


def _parts(gm: TensorCoreGemm, tile: TensorCoreTile, opts: TensorCoreOptions, rows: int,
           cols) -> int:
    """The parts split-K cuts ``gm``'s K into with ``tile`` at ``rows`` rows and ``cols``
    columns (a symbolic count: ``split_parts``'s nominal one), where ``opts`` allow it."""
    BK = k_step(gm)
    if not opts.split_k or gm.K % BK:
        return 1
    return split_parts(rows, cols, gm.K, BK, tile, gm.product(gm.batch_vars))


def _groups(gm: TensorCoreGemm, tile: TensorCoreTile, opts: TensorCoreOptions, rows: int,
            cols: int) -> int:
    """The work-groups of the kernel of ``tile`` sized for the many columns (its split-K at
    ``gm.N``) at ``cols`` columns and ``rows`` rows (a symbolic batch counted as 1)."""
    nbatch = gm.product(gm.batch_vars)
    nbatch = nbatch if isinstance(nbatch, int) else 1
    return -(-rows // tile.BM) * -(-cols // tile.BN) * nbatch * \
        _parts(gm, tile, opts, rows, gm.N)


def _gemm(gm: TensorCoreGemm, M, tile: TensorCoreTile, opts: TensorCoreOptions, rows: int,
          shared_limit: int, cols: int | None = None):
    """``(body, description)``: the kernel of ``gm`` with ``tile`` — split-K's two kernels
    and their float32 partials where ``opts`` and the rule (``split_parts`` at ``rows``
    rows and ``cols`` columns, None: ``gm.N``) split it."""
    parts = _parts(gm, tile, opts, rows, gm.N if cols is None else cols)
    if parts == 1:
        return _kernel(gm, M, tile, opts, shared_limit), str(tile)
    nbatch = gm.product(gm.batch_vars)
    partials = Buffer("tc_partials", (parts, nbatch, M, gm.N), "float32", scope="global")
    body = seq(_kernel(gm, M, tile, opts, shared_limit, parts, partials),
               _sum_kernel(gm, M, partials))
    return Allocate(partials, body), f"{tile} split-K {parts}"


def _sum_kernel(gm: TensorCoreGemm, M, partials: Buffer):
    """The second kernel of split-K: each output the sum of its ``partials`` through the
    epilogue (``SUM_THREADS`` consecutive columns a work-group, a row on ``blockIdx.y``, the
    batch on ``blockIdx.z``)."""
    parts, N = partials.shape[0], gm.N
    tx, bx, by, bz, p = Var("tx"), Var("bx"), Var("by"), Var("bz"), Var("p")
    total = Buffer("total", (1,), "float32", scope="local")
    col = bx * SUM_THREADS + tx
    vals = gm.values(bz, by, col, None)
    out_idx = [vals[v] for v in gm.out_vars]
    value = gm.epilogue(out_idx, total[0])
    if value.dtype != gm.out.dtype:
        value = Cast(gm.out.dtype, value)
    body = seq(BufferStore(total, partials[0, bz, by, col], [0]),
               For(p, 1, parts - 1, "unrolled", BufferStore(
                   total, total[0] + partials[p, bz, by, col], [0])),
               BufferStore(gm.out, value, out_idx))
    if not isinstance(N, int) or N % SUM_THREADS:
        body = IfThenElse(col < N, body)
    body = For(tx, 0, SUM_THREADS, "thread_binding", Allocate(total, body),
               thread_tag="threadIdx.x")
    body = For(bx, 0, floordiv(N + (SUM_THREADS - 1), SUM_THREADS), "thread_binding", body,
               thread_tag="blockIdx.x")
    body = For(by, 0, M, "thread_binding", body, thread_tag="blockIdx.y")
    return For(bz, 0, gm.product(gm.batch_vars), "thread_binding", body,
               thread_tag="blockIdx.z")


def _kernel(gm: TensorCoreGemm, M, tile: TensorCoreTile, opts: TensorCoreOptions,
            shared_limit: int, parts: int = 1, partials: Buffer | None = None):
    """The thread-bound loop nest of the kernel of ``gm`` with ``tile`` and ``opts`` (fresh
    variables and buffers of its own), its shared tiles within ``shared_limit`` bytes (a
    ring of ``opts.stages`` that would pass it takes k-steps of 16, else fewer stages); with
    ``parts`` > 1, work-group ``z`` of a batch
    computes part ``z % parts`` of K into ``partials`` (float32, ``(parts, batch, M, N)``)
    instead of the output."""
    BM, BN, WM, WN = tile.BM, tile.BN, tile.WM, tile.WN
    if BM % WM or BN % WN or WM % 16 or WN % 8:
        raise ValueError(f"tensor-core tile {tile}: warps of WM x WN (multiples of 16 x 8) "
                         f"must divide BM x BN")
    K, N = gm.K, gm.N
    BK = k_step(gm)
    MT, NT = WM // 16, WN // 8
    warps_n = BN // WN
    threads = 32 * tile.warps
    # a kn weight with ldmatrix: its tile k-major (rows of BN halves, copied in 16-byte
    # pieces; ldmatrix.trans makes the fragments), else column-major (k-contiguous) as a's
    b_kmajor = opts.ldmatrix and gm.b_mode == "kn"
    ldb = BN // 2 + _PAD
    plain = gm.a_mode == "rows" and (gm.b_mode == "nk" or b_kmajor)
    stages = opts.stages if plain else 1

    def stage_bytes(bk):
        return 4 * (BM * (bk // 2 + _PAD) + (bk * ldb if b_kmajor else BN * (bk // 2 + _PAD)))
    if stages > 1 and BK == 32 and stages * stage_bytes(32) > shared_limit and \
            stages * stage_bytes(16) <= shared_limit:
        BK = 16          # the ring of k-steps of 16 rather than fewer stages
    while stages > 1 and stages * stage_bytes(BK) > shared_limit:
        stages -= 1
    ring = stages > 1
    KT = -(-K // BK)
    ldw = BK // 2 + _PAD                 # words a shared row: BK halves and the padding
    u32, f32 = "uint32", "float32"
    S = stages if ring else 1
    # one buffer a ring stage (the lowering places barriers buffer by buffer: a step's copies
    # into one stage and its mma from another need none between them); explicit strides:
    # the allocation compaction keeps the padding
    names = [""] if S == 1 else [str(st) for st in range(S)]
    As_l = [Buffer(f"A_shared{n}", (BM, BK // 2), u32, strides=(ldw, 1), scope="shared")
            for n in names]
    if b_kmajor:
        Bs_l = [Buffer(f"B_shared{n}", (BK, BN // 2), u32, strides=(ldb, 1), scope="shared")
                for n in names]
    else:
        Bs_l = [Buffer(f"B_shared{n}", (BN, BK // 2), u32, strides=(ldw, 1), scope="shared")
                for n in names]
    acc = Buffer("acc", (MT * NT * 4,), f32, scope="local")
    af = Buffer("a_frag", (MT * 4,), u32, scope="local")
    bf = Buffer("b_frag", (NT * 2,), u32, scope="local")

    tx, bx, by, bzv = Var("tx"), Var("bx"), Var("by"), Var("bz")
    kt, e, x, y, i, ks = Var("kt"), Var("e"), Var("x"), Var("y"), Var("i"), Var("ks")
    nbatch = gm.product(gm.batch_vars)
    # split-K: blockIdx.z is (batch, part); a part's k-steps KTL from its own first k ``kb``
    if KT % parts:
        raise ValueError(f"split-K: {KT} k-steps do not divide into {parts} parts")
    KTL = KT // parts
    if parts > 1:
        bz, part = floordiv(bzv, parts), floormod(bzv, parts)
        kb = part * (KTL * BK)
    else:
        bz, part, kb = bzv, None, 0
    warp, lane = floordiv(tx, 32), floormod(tx, 32)
    g, t = floordiv(lane, 4), floormod(lane, 4)
    wm, wn = floordiv(warp, warps_n), floormod(warp, warps_n)
    hoist = _CopyHoist(e, BK)
    batch = gm.values(bz, None, None, None)

    def unit(m):
        """``(u // m, u % m)`` of a copy unit ``u = e * threads + tx`` (``_split_unit``)."""
        q_e, q_t, r = _split_unit(e, tx, threads, m)
        return q_e + q_t, r

    def a_read(row, k):
        """``a`` at flat row ``row`` (read clamped past M) and flat ``k``."""
        vals = {**batch, **_clamped_values(gm, gm.row_vars, row, M)}
        vals.update(gm.values(None, None, None, k))
        return substitute(gm.a, vals)

    def b_read(col, k):
        vals = {**batch, **_clamped_values(gm, gm.col_vars, col, N)}
        vals.update(gm.values(None, None, None, k))
        return substitute(gm.b, vals)

    def b_read8(n0, k):
        """``b`` at 8 columns from ``n0`` (a multiple of 8; past N: 8 columns in bounds)."""
        rest = 1
        for v in gm.col_vars[1:]:
            rest = rest * (E.as_int(gm.extents[v]) or 0)
        if len(gm.col_vars) > 1 and rest and rest % 8 == 0:
            return b_read(n0, k)     # the 8 share the outer column variable: it is clamped
        return gm.b_at(bz, Select(n0 < N, n0, N - 8), k)

    def cp_async(dst, src):
        return Evaluate(call(E.TC_CP_ASYNC, dst, src, dtype="int32"))

    def each(total, n, body_of):
        flat = e * threads + tx
        body = body_of(flat)
        if total % threads:
            body = IfThenElse(flat < total, body)
        return For(e, 0, n, "unrolled", body)

    def gathered(elem, k):
        """Two halves ``elem(k)``, ``elem(k + 1)`` (0 past K) packed into one word."""
        def half(kk):
            if K % BK == 0:
                return Cast(f32, elem(kk))
            # past K: read at K - 1 (in bounds), used as 0
            return Select(kk < K, Cast(f32, elem(Select(kk < K, kk, K - 1))), const(0.0, f32))
        return call(E.TC_PACK_HALF2, half(k), half(k + 1), dtype=u32)

    # The 16-byte pieces of the plain modes: (units, the shared element, the global element)
    # of piece ``u`` of the tiles at k0 into ring stage ``st`` (0 without a ring)
    chunks = BK // 8                     # 16-byte chunks along k a row
    cols8 = BN // 8

    def a_piece(u, k0, st):
        q, r = unit(chunks)
        if len(gm.k_vars) > 1:      # an OHWI weight: its k dims from the step (_split_k)
            vals = {**batch, **_clamped_values(gm, gm.row_vars, by * BM + q, M),
                    **_split_k(gm, k0, r * 8, BK)}
            return (As_l[st][q, r * 4], _SimplifyIndices().visit(substitute(gm.a, vals)))
        return (As_l[st][q, r * 4], a_read(by * BM + q, k0 + r * 8))

    def b_piece(u, k0, st):
        if b_kmajor:       # row k of 8 columns
            q, r = unit(cols8)
            return (Bs_l[st][q, r * 4], b_read8(bx * BN + r * 8, k0 + q))
        q, r = unit(chunks)
        return (Bs_l[st][q, r * 4], b_read(bx * BN + q, k0 + r * 8))

    # Without a ring the tiles of step kt + 1 are read from global memory into registers
    # (``fetch``) before the mma of step kt, and written into shared memory after them
    # (``stash``): the loads' latency hides behind the mma. A copy unit ``u`` of a thread is
    # ``e * threads + tx``.
    if gm.a_mode == "rows":
        na = -(-BM * chunks // threads)
        ra = Buffer("a_stage", (na * 4,), u32, scope="local")

        def fetch_a(k0):
            return hoist.copy(lambda k: each(BM * chunks, na, lambda u: load_b128(
                ra[e * 4], a_piece(u, k, 0)[1])), k0)

        def stash_a():
            return each(BM * chunks, na, lambda u: load_b128(a_piece(u, 0, 0)[0], ra[e * 4]))
    else:
        # any operand expression (an im2col window with its padding, a transposed or cast
        # read): one word (two halves along k) a unit, k fastest
        words = BM * (BK // 2)
        na = -(-words // threads)
        ra = Buffer("a_stage", (na,), u32, scope="local")

        # the row of a unit: u // (BK / 2), its k pair u % (BK / 2)
        def word_a(k0):
            q_e, q_t, r = _split_unit(e, tx, threads, BK // 2)
            values = {**batch, **_clamped_values(gm, gm.row_vars, by * BM + q_e + q_t, M)}
            word = _gather_word(gm, gm.a, values, k0, IntImm(0, "int64"), r, BK)
            if word is None:
                word = gathered(lambda kk: a_read(by * BM + q_e + q_t, kk), k0 + r * 2)
            return word

        def fetch_a(k0):
            return hoist.copy(lambda k: each(words, na, lambda u: BufferStore(
                ra, word_a(k), [e])), k0)

        def stash_a():
            return each(words, na, lambda u: BufferStore(
                As_l[0], ra[e], [floordiv(u, BK // 2), floormod(u, BK // 2)]))

    if b_kmajor or gm.b_mode == "nk":
        units_b = BK * cols8 if b_kmajor else BN * chunks
        nb = -(-units_b // threads)
        rb = Buffer("b_stage", (nb * 4,), u32, scope="local")

        def fetch_b(k0):
            return hoist.copy(lambda k: each(units_b, nb, lambda u: load_b128(
                rb[e * 4], b_piece(u, k, 0)[1])), k0)

        def stash_b():
            return each(units_b, nb, lambda u: load_b128(b_piece(u, 0, 0)[0], rb[e * 4]))
    elif gm.b_mode == "kn":
        # rows k and k + 1 of 8 columns (two 16-byte loads), their halves paired into the 8
        # columns' words of the column-major tile
        nb = -(-(BK // 2) * cols8 // threads)
        rb = Buffer("b_stage", (nb * 8,), u32, scope="local")

        def fetch_b(k0):
            def pair(k_first):
                q, r = unit(cols8)
                n0 = bx * BN + r * 8
                k = k_first + q * 2
                return seq(load_b128(rb[e * 8], b_read8(n0, k)),
                           load_b128(rb[e * 8 + 4], b_read8(n0, k + 1)))
            return hoist.copy(lambda k: each((BK // 2) * cols8, nb, lambda u: pair(k)), k0)

        def stash_b():
            def unit(u):
                kp, c = floordiv(u, cols8), floormod(u, cols8)
                return seq(*[BufferStore(Bs_l[0], call(
                    E.TC_PACK_LO if jj % 2 == 0 else E.TC_PACK_HI, rb[e * 8 + jj // 2],
                    rb[e * 8 + 4 + jj // 2], dtype=u32), [c * 8 + jj, kp]) for jj in range(8)])
            return each((BK // 2) * cols8, nb, unit)
    else:
        # one word a unit, the columns fastest (an activation's contiguous pixels)
        words = BN * (BK // 2)
        nb = -(-words // threads)
        rb = Buffer("b_stage", (nb,), u32, scope="local")

        # the column of a unit: u % BN, its k pair u // BN; where every thread has whole
        # runs of 4 words, a thread's k pairs are consecutive instead ((tx // BN) * nb + e),
        # so that its words go to shared memory as 16-byte stores
        runs = threads % BN == 0 and words % threads == 0 and nb % 4 == 0

        def unit_b():
            if runs:
                return e, floordiv(tx, BN) * nb, floormod(tx, BN)
            return _split_unit(e, tx, threads, BN)

        def word_b(k0):
            q_e, q_t, r = unit_b()
            values = {**batch, **_clamped_values(gm, gm.col_vars, bx * BN + r, N)}
            word = _gather_word(gm, gm.b, values, k0, q_e, q_t, BK)
            if word is None:
                word = gathered(lambda kk: b_read(bx * BN + r, kk), k0 + (q_e + q_t) * 2)
            return word

        def fetch_b(k0):
            return hoist.copy(lambda k: each(words, nb, lambda u: BufferStore(
                rb, word_b(k), [e])), k0)

        def stash_b():
            if runs:
                _, q_t, r = unit_b()
                return For(e, 0, nb // 4, "unrolled", load_b128(
                    Bs_l[0][r, q_t + e * 4], rb[e * 4]))
            return each(words, nb, lambda u: BufferStore(
                Bs_l[0], rb[e], [floormod(u, BN), floordiv(u, BN)]))

    def fragments(st):
        """The fragment loads of k16 step ``ks`` from ring stage ``st``."""
        if not opts.ldmatrix:
            frag_a = For(x, 0, MT, "unrolled", seq(*[
                BufferStore(af, As_l[st][wm * WM + x * 16 + g + 8 * (r % 2),
                                   ks * 8 + t + 4 * (r // 2)], [x * 4 + r]) for r in range(4)]))
            frag_b = For(y, 0, NT, "unrolled", seq(*[
                BufferStore(bf, Bs_l[st][wn * WN + y * 8 + g, ks * 8 + t + 4 * r],
                            [y * 2 + r]) for r in range(2)]))
            return seq(frag_a, frag_b)
        # ldmatrix: lane l gives row l % 8 of matrix j = l // 8. A's x4: j % 2 the row half,
        # j // 2 the k half (a0..a3); B's x4: j // 2 the column block y, y + 1, j % 2 the k
        # half (b0, b1 of y, then of y + 1)
        r8, j = floormod(lane, 8), floordiv(lane, 8)
        frag_a = For(x, 0, MT, "unrolled", Evaluate(call(
            E.TC_LDMATRIX_X4, af[x * 4], As_l[st][wm * WM + x * 16 + r8 + 8 * floormod(j, 2),
                                            ks * 8 + 4 * floordiv(j, 2)], IntImm(0, "int32"),
            dtype="int32")))

        def b_rows(y0, blk):
            if b_kmajor:       # rows k of the k-major tile, the column block's 4 words
                return Bs_l[st][ks * 16 + 8 * floormod(j, 2) + r8,
                          wn * (WN // 2) + (y0 + blk) * 4]
            return Bs_l[st][wn * WN + (y0 + blk) * 8 + r8, ks * 8 + 4 * floormod(j, 2)]
        trans = IntImm(1 if b_kmajor else 0, "int32")
        parts = [For(y, 0, NT // 2, "unrolled", Evaluate(call(
            E.TC_LDMATRIX_X4, bf[y * 4], b_rows(y * 2, floordiv(j, 2)), trans,
            dtype="int32")))] if NT >= 2 else []
        if NT % 2:
            parts.append(Evaluate(call(E.TC_LDMATRIX_X2, bf[(NT - 1) * 2],
                                       b_rows(NT - 1, 0), trans, dtype="int32")))
        return seq(frag_a, *parts)

    def compute(st):
        mma = For(x, 0, MT, "unrolled", For(y, 0, NT, "unrolled", Evaluate(call(
            E.TC_MMA, acc[(x * NT + y) * 4], af[x * 4], bf[y * 2], dtype="int32"))))
        return For(ks, 0, BK // 16, "unrolled", seq(fragments(st), mma))

    if ring:
        # cp.async ring of S stages: the tiles of step s go to stage s % S; step kt waits for
        # its own group (at most S - 2 younger ones pending), then an explicit barrier: it
        # publishes every thread's copies of stage kt before the mma read them, and orders
        # the next copies (into the stage step kt - 1 read) after every thread's mma of step
        # kt - 1. One barrier a step, and it must be there on every step: the barrier the
        # device lowering would place before the next copies is gone on the last S - 1 steps
        # (no copies left), and the lowering cannot see that a cp.async lands only at the
        # wait (that is how the ring gave wrong results on NVIDIA's driver).
        # The k-steps go S at a time, so that each step's stages are constants
        def issue(k0, st):
            return hoist.copy(lambda k: seq(
                each(BM * chunks, -(-BM * chunks // threads),
                     lambda u: cp_async(*a_piece(u, k, st))),
                each(BK * cols8 if b_kmajor else BN * chunks,
                     -(-(BK * cols8 if b_kmajor else BN * chunks) // threads),
                     lambda u: cp_async(*b_piece(u, k, st)))), k0)
        commit = Evaluate(call(E.TC_CP_COMMIT, dtype="int32"))
        prologue = []
        for p in range(S - 1):
            if p < KTL:
                prologue.append(issue(kb + p * BK, p))
            prologue.append(commit)
        steps = []
        for jj in range(S):
            step_k = kt * S + jj
            nxt = step_k + (S - 1)
            mma = compute(jj)
            if KTL % S:
                mma = IfThenElse(step_k < KTL, mma)
            steps.append(seq(
                Evaluate(call(E.TC_CP_WAIT, IntImm(S - 2, "int32"), dtype="int32")),
                barrier(),
                IfThenElse(nxt < KTL, issue(kb + nxt * BK, (jj + S - 1) % S)),
                commit, mma))
        main_loop = seq(*prologue, For(kt, 0, -(-KTL // S), "serial", seq(*steps)))
    else:
        more = kt + 1 < KTL
        nk = kb + (kt + 1) * BK
        step = seq(IfThenElse(more, seq(fetch_a(nk), fetch_b(nk))),
                   compute(0),
                   IfThenElse(more, seq(stash_a(), stash_b())))
        main_loop = seq(fetch_a(kb), fetch_b(kb), stash_a(), stash_b(),
                        For(kt, 0, KTL, "serial", step))
    main_loop = hoist.wrap(main_loop)    # what a thread's copies share over every k-step
    if _nonempty(gm) is not None:
        main_loop = IfThenElse(_nonempty(gm), main_loop)

    # the epilogue, accumulator (x, y, i = 2 ir + ic): row g (+ 8 for ir = 1), column 2t
    # (+ 1 for ic = 1). Over y and ic outside x and ir: what a column decides (a
    # convolution's image and pixel: divisions; the column's bound) is bound once a column
    # (``_Hoist``), not once an accumulator
    ir, ic = Var("ir"), Var("ic")
    i_acc = (x * NT + y) * 4 + ir * 2 + ic
    row = by * BM + wm * WM + x * 16 + g + 8 * ir
    col = bx * BN + wn * WN + y * 8 + t * 2 + ic
    if parts > 1:      # the part's float32 sums, the epilogue in the second kernel
        out_store = BufferStore(partials, acc[i_acc], [part, bz, row, col])
    else:
        vals = gm.values(bz, row, col, None)
        out_idx = [vals[v] for v in gm.out_vars]
        value = gm.epilogue(out_idx, acc[i_acc])
        if value.dtype != gm.out.dtype:
            value = Cast(gm.out.dtype, value)
        out_store = BufferStore(gm.out, value, out_idx)
    ok = row < M
    if not isinstance(N, int) or N % BN:
        ok = ok & (col < N)
    per_column = _Hoist({x, ir}, "col")
    inner = per_column.visit(IfThenElse(ok, out_store))
    store = For(y, 0, NT, "unrolled", For(ic, 0, 2, "unrolled", _lets(per_column.lets, For(
        x, 0, MT, "unrolled", For(ir, 0, 2, "unrolled", inner)))))
    thread = seq(
        For(i, 0, MT * NT * 4, "unrolled", BufferStore(acc, const(0.0, f32), [i])),
        main_loop,
        store)
    stage_bufs = () if ring else (rb, ra)
    for buf in (*stage_bufs, bf, af, acc):
        thread = Allocate(buf, thread)
    body = For(tx, 0, threads, "thread_binding", thread, thread_tag="threadIdx.x")
    for buf in (*Bs_l, *As_l):
        body = Allocate(buf, body)
    body = For(bx, 0, floordiv(N + (BN - 1), BN), "thread_binding", body,
               thread_tag="blockIdx.x")
    body = For(by, 0, floordiv(M + (BM - 1), BM), "thread_binding", body,
               thread_tag="blockIdx.y")
    if gm.batch_vars or parts > 1:
        body = For(bzv, 0, nbatch * parts, "thread_binding", body, thread_tag="blockIdx.z")
    return body


# The kernel as a template of the schedule language (``Schedule.apply_template``): what the
# tuner's points are (``relax.tensor_core_space``), so that a tuning record's trace replays
TEMPLATE = "tensor_core_fp16"


def _template_tile(value):
    return TensorCoreTile(*(int(x) for x in value)) if value else None


def _build_template(func: PrimFunc, target: str, params: dict) -> PrimFunc:
    """``tensor_core_kernel`` at a trace's parameters: ``tile`` / ``small_tile`` (``[BM, BN,
    WM, WN]``, or ``[]`` for the default), ``ldmatrix``, ``stages``, ``split_k``."""
    known = {"tile", "small_tile", "ldmatrix", "stages", "split_k"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown parameters {unknown} (known: {sorted(known)})")
    for key in ("tile", "small_tile"):
        if len(params.get(key) or []) not in (0, 4):
            raise ValueError(f"{key} must be [BM, BN, WM, WN], got {params[key]!r}")
    default = TensorCoreOptions()
    opts = TensorCoreOptions(ldmatrix=bool(params.get("ldmatrix", default.ldmatrix)),
                             stages=int(params.get("stages", default.stages)),
                             split_k=bool(params.get("split_k", default.split_k)))
    return tensor_core_kernel(func, Target(target), _template_tile(params.get("tile")), opts,
                              _template_tile(params.get("small_tile")))


KernelTemplate.register(TEMPLATE, _build_template, override=True)
