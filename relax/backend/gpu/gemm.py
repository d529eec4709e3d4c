"""The GPU GEMM family: GEMM-like reductions (two inputs read with the reduction variable:
matmul, batch matmul, dense, convolution as an implicit GEMM) tiled for work-groups and
threads.

The output loops are grouped by the input that reads them: rows (the largest loop of the first
input's group: a matmul's ``i``, a convolution's output channels), columns (the innermost loop's
group: a matmul's ``j``, a convolution's output image as a 2-D ``h x w`` tile) and batch (loops
both inputs read, the other loops of a group, a symbolic outer loop such as a convolution's
batch: ``blockIdx.z``). A block tile of ``BM x BN`` outputs per work-group — 128 x 128 from
16 x 16 threads of 8 x 8 registers — accumulated in registers (``cache_write`` local); the
reduction split by ``BK`` (16; WebGPU 16 where the target's workgroup storage holds the padded
tiles and the kernel's WGSL stays within the unroll budget, else 8: ``webgpu_k_step``; a
convolution steps over whole input channels times its window) with both input tiles staged in
shared memory (``cache_read`` shared + a cooperative fetch over all threads, OpenCL's as float4
loads). Each step of the inner reduction reads a
thread's rows of the row tile and columns of the column tile into register fragments
(``cache_read`` local at the inner reduction loop) as 4-element vector reads: the row tile
stored transposed (rows padded by 4 words where the tiles fit), the column tile in runs of 4
columns per thread. The k-step loop is annotated ``register_prefetch``
(``tensorir.transform.register_prefetch``). Init decomposed out of the reduction, the register
tile unrolled; epilogues (bias, activation, residual add) inlined into the register write-back.

- which blocks: ``is_gemm_like``;
- WebGPU's k-step: ``webgpu_k_step(target)`` (16 where the target's workgroup storage holds the
  two padded tiles, else 8), per kernel back to 8 where its WGSL would leave the unroll budget
  (``wgsl_within_unroll_budget``: ``relax.gpu_schedules`` tries the kernel at 16 first);
- schedule: ``schedule_gemm(sch, block, target, shared, small)``, ``shared`` naming the inputs
  staged in shared memory (``"all"``, ``"compact"``: those read at plain indices, a
  convolution's weights; ``"none"``) and ``small`` a quarter-size tile: the fallbacks where a
  tile does not fit the target (WebGPU's 16 KiB of workgroup storage);
- tiles: the ``GEMM_*`` constants below (``benchmarks/gpu_gemm_variants.py`` sweeps them), the
  defaults of ``schedule_gemm``'s tile decisions (``default_config``), which the tuner's GPU
  space searches (``relax.gpu_space``); the register tile halved for small outputs
  (``GEMM_MIN_GROUPS``) and, for a dense layer, balanced over the multiprocessors
  (``GEMM_BALANCE_MPS``; ``benchmarks/gpu_dense.py`` measures it at BERT's and GPT-2's shapes).

Examples
--------
>>> from tilecraft.tensorir import te
>>> A = te.placeholder((256, 64), "float32", "A")
>>> B = te.placeholder((64, 256), "float32", "B")
>>> k = te.reduce_axis((0, 64), "k")
>>> C = te.compute((256, 256), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
>>> from tilecraft.tensorir.schedule import Schedule
>>> sch = Schedule(te.create_prim_func([A, B, C]))
>>> is_gemm_like(sch.get(sch.get_block("C")))
True
"""
from __future__ import annotations

import os

from tilecraft.targets import Target
from tilecraft.targets.webgpu_backend.wgsl import unroll_budget_fits
from tilecraft.tensorir.expr import IntImm, Var
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.schedule.index_map import IndexMap
from tilecraft.tensorir.stmt import Block
from tilecraft.tensorir.transform import HostDeviceSplit
from tilecraft.tensorir.transform._common import uses_any
from tilecraft.tensorir.transform.register_prefetch import ANN_REGISTER_PREFETCH

from .schedule_utils import (SYMBOLIC, is_reduction, is_under, iter_values, loop_extent,
                             node_of, spatial_loops)

__all__ = ["GEMM_TILE", "GEMM_TILE_J", "GEMM_TILE_CPU", "GEMM_BK_CPU", "GEMM_BK",
           "GEMM_TILE_WEBGPU", "GEMM_BK_WEBGPU", "GEMM_BK_WEBGPU_WIDE", "GEMM_MIN_GROUPS",
           "GEMM_BALANCE_MPS", "GEMM_BALANCE_MIN_REGS", "GEMM_BALANCE_GAIN", "GEMM_NOMINAL_BATCH",
           "GEMM_SMALL_BATCH", "GEMM_LARGE_BATCH", "GEMM_LARGE_NOMINAL_BATCH",
           "reduce_inputs", "padded_tiles_bytes", "webgpu_k_step", "wgsl_within_unroll_budget",
           "is_gemm_like", "compact_read", "for_cpu", "default_config", "schedule_gemm"]


# threads x register elements per GEMM output dimension: a 128 x 128 block tile of 16 x 16
# threads, each 8 rows x 8 columns in registers, k-step 16. On the H200 (OpenCL, 4096^3 fp32,
# benchmarks/gpu_gemm_variants.py) with the register fragments and the register prefetch below:
# 45 TFLOP/s, 0.88x cuBLAS (8 x 16 threads of 16 x 8: 0.82x; without the prefetch 0.82x,
# without the fragments 0.78x; before the shared tiles were declared 16-byte aligned 0.55x).
GEMM_TILE = (16, 8)    # rows
GEMM_TILE_J = (16, 8)  # columns
# For a CPU OpenCL driver (``Target("opencl -device=cpu")``, e.g. PoCL): a small tile with the
# reduction step not unrolled. PoCL compiles the GPU tile's 2048 unrolled multiply-adds per
# work-item for minutes. 8 x 8 work-items: with 16 x 16 and this serial step, PoCL computed a
# (n, 2, 24, 16) x (n, 2, 16, 24) batch matmul wrong (garbage in the second column tile) where
# the interpreter, lavapipe and PoCL with 8 x 8 or with the GPU tile agree with numpy.
GEMM_TILE_CPU = (8, 4)
GEMM_BK_CPU = 8
GEMM_BK = 16           # reduction step staged in shared memory (H200: 16 beats 8 by 3%, 32 by 20%)
# WebGPU (within the spec's 256 invocations and 16 KiB of workgroup storage): 16 x 16 threads of
# 8 x 8, k-step 8 (so that the transposed A tile's rows can be padded: two 128 x 16 tiles fill
# the 16 KiB exactly). On the H200 through Vulkan (4096^3 fp32) with fragments and prefetch:
# 0.62x cuBLAS (k-step 16 unpadded: 0.55x; the former scalar schedule with B stored
# ``(k, j % 8, j // 8)``: 0.48x).
GEMM_TILE_WEBGPU = (16, 8)
GEMM_BK_WEBGPU = 8
# The k-step a WebGPU target gets where its workgroup storage holds the two padded tiles of
# that step (``webgpu_k_step``: 4 * 16 * (128 + 4 + 128) bytes, over the spec's 16 KiB, within
# the 32-48 KiB a desktop adapter grants) and the kernel's WGSL stays within the generator's
# unroll budget (``wgsl_within_unroll_budget``; else GEMM_BK_WEBGPU). OpenCL's GEMM_BK: on the
# H100 with the adapter's 48 KiB, 2048 x 768 x 3072 in 0.336 ms (0.362 ms at k-step 8).
# 8 turns it off (the rule before: benchmarks.gpu_models' ``webgpu-adapter-k8`` kind).
GEMM_BK_WEBGPU_WIDE = 16
GEMM_FETCH_VECTOR = 1  # elements per thread and step of the shared-memory fetch without fragments
# GPU GEMM tiles read through register fragments: each reduction step's slice of the shared
# tiles a thread multiplies (its rows of A, its columns of B) copied into registers first, as
# 4-element vector reads — A's tile stored transposed ``(k, i)`` (rows padded by 4 words where
# the tiles still fit), B's in runs of 4 columns per thread ``(k, (j % rj) // 4, j // rj,
# j % 4)``. OpenCL C reads them as aligned float4, WGSL from array<vec4<f32>> workgroup arrays.
GEMM_FRAGMENTS = True
GEMM_FRAGMENT_VECTOR = 4
GEMM_FRAGMENTS_WEBGPU = True
GEMM_FETCH_VECTOR_FRAGMENTS = 4   # OpenCL's global -> shared fetch with fragments: float4 loads
# the k-step loop annotated for tensorir.transform.register_prefetch: the next step's tiles
# are loaded into registers during this step's multiply-adds (OpenCL 0.82x -> 0.88x cuBLAS)
GEMM_REGISTER_PREFETCH = True
# Work-groups a GEMM-like kernel should have at least: smaller register tiles until it does
# (the H200 has 132 multiprocessors).
GEMM_MIN_GROUPS = 128
# Multiprocessors a dense layer's work-groups are balanced over (the H100's 132), 0: not
# balanced (the rule before). Past GEMM_MIN_GROUPS, a dense layer's register tile is halved
# once more (down to GEMM_BALANCE_MIN_REGS accumulators a thread) where that raises the share
# of multiprocessors busy to the end by GEMM_BALANCE_GAIN: busy share = groups / (waves *
# multiprocessors), a wave being one work-group on every multiprocessor. A BERT dense layer
# 768 -> 768 at batch 16 (2048 x 768) got 64 x 128 tiles: 192 work-groups, 1.45 a
# multiprocessor, so 60 of them ran two and 72 one (busy share 0.73); 64 x 64 tiles make 384,
# 2.9 a multiprocessor (0.97). The 4096^3 GEMM (1024 work-groups, 0.97) keeps its tile.
GEMM_BALANCE_MPS = 132
GEMM_BALANCE_MIN_REGS = 16
GEMM_BALANCE_GAIN = 1.15
# What a symbolic batch (blockIdx.z: the ``batch`` of an ONNX export) counts as when the tile is
# sized for GEMM_MIN_GROUPS. One build serves every batch, so the tile is a compromise: sized
# for batch 1, a BERT dense layer (128 x 768 per sequence) got 16 x 32 tiles of two
# accumulators per thread, which ran the whole layer at 6 TFLOP/s at batch 16; sized for 8, it
# gets 64 x 64 tiles of 4 x 4 (24 work-groups at batch 1, 384 at batch 16).
GEMM_NOMINAL_BATCH = 8
# Below this batch a kernel with a symbolic batch runs a second schedule, its tile sized for
# batch 1 (``relax.backend.gpu.batch_dispatch``: the host picks one of the two per call).
GEMM_SMALL_BATCH = 4
# From this batch on, a third schedule: the tile sized for GEMM_LARGE_NOMINAL_BATCH. Sized for
# 8, a layer whose tile is shrunk to reach GEMM_MIN_GROUPS keeps that small tile at batch 16,
# with twice the work-groups it needs there: ResNet-50's 1024 -> 256 1x1 layers at 14 x 14 get
# 2 x 7 outputs per thread (4 x 7 sized for 16), its 512 -> 512 3x3 stride-2 layer 1 x 7 (2 x
# 7), BERT's 768-wide dense layers 4 x 4 (4 x 8). 0 turns the third schedule off.
GEMM_LARGE_BATCH = 12
GEMM_LARGE_NOMINAL_BATCH = 16
# A GEMM-like kernel whose row loop is a symbolic dim (a classifier ``(n, 2048) x (2048, 1000)``
# over the model's batch) gets a second schedule too, used while the rows are fewer than
# GEMM_SMALL_ROWS: its tile sized for GEMM_NOMINAL_ROWS rows. The full 128-row tile gave
# ResNet-50's classifier 8 work-groups at batch 16 (a third of the model's time on the H200).
GEMM_SMALL_ROWS = 64
GEMM_NOMINAL_ROWS = 16


def reduce_inputs(block: Block) -> list[int]:
    """Indices (in ``block.reads``) of the buffers read with a reduce iter var."""
    rvars = [iv.var for iv in block.iter_vars if iv.kind == "reduce"]
    out = []
    for i, r in enumerate(block.reads):
        if any(uses_any(rng.min, rvars) or uses_any(rng.extent, rvars) for rng in r.region):
            out.append(i)
    return out


def is_gemm_like(block: Block) -> bool:
    """Whether ``block`` is a reduction over an outer product of two inputs (each reads a
    spatial var the other does not: matmul, dense, convolution)."""
    if not is_reduction(block):
        return False
    inputs = reduce_inputs(block)
    if len(inputs) < 2:
        return False
    svars = [iv.var for iv in block.iter_vars if iv.kind == "spatial"]
    # each of two inputs misses a spatial var the other has: an outer product of tiles
    uses = []
    for i in inputs:
        r = block.reads[i]
        uses.append({v for v in svars if any(uses_any(x.min, [v]) for x in r.region)})
    return any(a - b and b - a for a in uses for b in uses)


def compact_read(block: Block, idx: int) -> bool:
    """Whether ``block`` reads input ``idx`` at plain indices (each a single iter var or a
    constant): its tile is a dense box, e.g. a weight, not a sliding window."""
    for rng in block.reads[idx].region:
        m = rng.min
        if not isinstance(m, (Var, IntImm)):
            return False
    return True


def symbolic_rows(sch: Schedule, block):
    """The symbolic dim (a Var) that is the GEMM-like ``block``'s row loop — a dense layer
    ``(n, K) x (K, N)`` whose rows are the model's symbolic batch — else None."""
    spatial, reduce = spatial_loops(sch, block)
    if len(spatial) < 2 or not reduce:
        return None
    _, rows, _, _, _ = _gemm_groups(sch, block, spatial)
    ext = node_of(sch, rows[0]).extent
    return ext if isinstance(ext, Var) else None


def default_config(target: Target) -> dict:
    """The tile decisions ``schedule_gemm`` takes for ``target`` when not given: the ``GEMM_*``
    constants above, as its keyword arguments (``tile_rows`` / ``tile_cols``: (threads,
    registers) per output dimension; ``k_step``; ``fragments`` and ``fragment_vector``;
    ``fetch_vector``: elements per thread of the shared-memory fetch; ``register_prefetch``;
    ``min_groups``). The tuner's GPU space searches these (``relax.gpu_space``).

    Examples
    --------
    >>> default_config(Target("opencl"))["tile_rows"]
    (16, 8)
    """
    cpu = for_cpu(target)
    webgpu = target.kind == "webgpu" and not cpu
    fragments = GEMM_FRAGMENTS and not cpu and (target.kind == "opencl" or
                                                (webgpu and GEMM_FRAGMENTS_WEBGPU))
    return {
        "tile_rows": GEMM_TILE_CPU if cpu else GEMM_TILE_WEBGPU if webgpu else GEMM_TILE,
        "tile_cols": GEMM_TILE_CPU if cpu else GEMM_TILE_WEBGPU if webgpu else GEMM_TILE_J,
        "k_step": GEMM_BK_CPU if cpu else webgpu_k_step(target) if webgpu else GEMM_BK,
        "fragments": fragments,
        "fragment_vector": GEMM_FRAGMENT_VECTOR,
        "fetch_vector": GEMM_FETCH_VECTOR_FRAGMENTS if fragments else GEMM_FETCH_VECTOR,
        "register_prefetch": GEMM_REGISTER_PREFETCH,
        "min_groups": GEMM_MIN_GROUPS,
    }


def padded_tiles_bytes(step: int, tile_rows: tuple, tile_cols: tuple) -> int:
    """Bytes of shared memory the two float32 input tiles of one k-step ``step`` take, the row
    tile stored transposed with its rows padded by 4 words: ``4 * step * (ti * ri + 4 + tj *
    rj)`` for ``tile_rows = (ti, ri)`` and ``tile_cols = (tj, rj)`` (threads, registers).

    Examples
    --------
    >>> padded_tiles_bytes(16, (16, 8), (16, 8))     # over the WebGPU spec's 16 KiB
    16640
    """
    (ti, ri), (tj, rj) = tile_rows, tile_cols
    return 4 * step * (ti * ri + 4 + tj * rj)


def webgpu_k_step(target: Target) -> int:
    """The GEMM k-step of a WebGPU ``target``: ``GEMM_BK_WEBGPU_WIDE`` (16) where its workgroup
    storage (``target.max_shared_memory_per_block``) holds the two padded tiles of the full
    block tile (``GEMM_TILE_WEBGPU``) at that step, else ``GEMM_BK_WEBGPU`` (8). A kernel
    whose WGSL at the wide step would not fit the generator's unroll budget gets 8 too
    (``relax.gpu_schedules`` checks each with ``wgsl_within_unroll_budget``). The full tile
    decides, not the kernel's (a smaller tile would fit at 16 under the spec's limits too):
    under the spec's limits every kernel keeps the k-step 8 it had.

    Examples
    --------
    >>> webgpu_k_step(Target("webgpu"))                                     # 16 KiB
    8
    >>> webgpu_k_step(Target("webgpu -max-shared-memory-per-block=49152"))  # an adapter's
    16
    """
    wide = GEMM_BK_WEBGPU_WIDE
    if wide > GEMM_BK_WEBGPU and padded_tiles_bytes(wide, GEMM_TILE_WEBGPU, GEMM_TILE_WEBGPU) \
            <= target.max_shared_memory_per_block:
        return wide
    return GEMM_BK_WEBGPU


def wgsl_within_unroll_budget(split: HostDeviceSplit) -> bool:
    """Whether every kernel of ``split`` (``tensorir.transform.lower_device`` of a scheduled
    function for a WebGPU target) generates WGSL within the generator's unroll budget, so that
    no register tile stays a dynamically indexed array (``UnrollBudgetWarning``: function-scope
    memory, slow on a GPU). Asked without generating (``wgsl.unroll_budget_fits``, which errs
    towards False).

    Examples
    --------
    >>> split = lower_device(scheduled_func, target)             # doctest: +SKIP
    >>> wgsl_within_unroll_budget(split)                          # doctest: +SKIP
    True
    """
    return all(unroll_budget_fits(k) for k in split.kernels)


def schedule_gemm(sch: Schedule, block, target: Target, shared: str = "all",
                  small: bool = False, nominal_batch: int | None = None,
                  nominal_rows: int | None = None, *, tile_rows: tuple | None = None,
                  tile_cols: tuple | None = None, k_step: int | None = None,
                  fragments: bool | None = None, fragment_vector: int | None = None,
                  fetch_vector: int | None = None, register_prefetch: bool | None = None,
                  min_groups: int | None = None, min_regs: int = 1) -> set:
    """The GEMM tile on the GEMM-like block ``block`` (see the module docstring); the names of
    the blocks it scheduled (the block, its caches, init and write-back). ``shared``: which
    inputs are staged in shared memory (``"all"``, ``"compact"``, ``"none"``); ``small``: a
    quarter-size block tile; ``nominal_batch``: what a symbolic batch counts as when the tile
    is sized (None: ``GEMM_NOMINAL_BATCH``); ``nominal_rows``: what a symbolic row loop counts
    as (None: as large as any: the full tile). The keyword-only tile decisions default to
    ``default_config(target)``; ``min_regs``: the register tile is halved to reach
    ``min_groups`` only down to this many accumulators a thread (split-K keeps 16).
    ``ScheduleError`` where it does not apply."""
    config = default_config(target)
    given = {"tile_rows": tile_rows, "tile_cols": tile_cols, "k_step": k_step,
             "fragments": fragments, "fragment_vector": fragment_vector,
             "fetch_vector": fetch_vector, "register_prefetch": register_prefetch,
             "min_groups": min_groups}
    if fragments is not None and fetch_vector is None:
        # the fetch vector follows the fragments unless given (as in the defaults)
        config["fetch_vector"] = GEMM_FETCH_VECTOR_FRAGMENTS if fragments else GEMM_FETCH_VECTOR
    config.update({k: v for k, v in given.items() if v is not None})
    node = node_of(sch, block)
    spatial, reduce = spatial_loops(sch, block)
    if len(spatial) < 2 or not reduce:
        raise ScheduleError("default GPU schedule", "not a 2-D tiled reduction", None)
    batch, rows, cols, row_input, col_input = _gemm_groups(sch, block, spatial)
    # the block's iter var of a single column loop (the dim of the column input to permute)
    col_var = None
    if len(cols) == 1:
        cvar = node_of(sch, cols[0]).loop_var
        found = [iv.var for iv, v in zip(node.iter_vars, iter_values(sch, block))
                 if iv.kind == "spatial" and uses_any(v, [cvar])]
        col_var = found[0] if len(found) == 1 else None
    row_var = None
    rvar = node_of(sch, rows[0]).loop_var
    found = [iv.var for iv, v in zip(node.iter_vars, iter_values(sch, block))
             if iv.kind == "spatial" and uses_any(v, [rvar])]
    row_var = found[0] if len(found) == 1 else None
    sch.reorder(*batch, *rows, *cols)
    il = rows[0]
    cpu = for_cpu(target)
    webgpu = target.kind == "webgpu" and not cpu
    # register fragments read as float4 from shared tiles laid out for it (OpenCL on a GPU)
    fragments = bool(config["fragments"])
    frag_vec = int(config["fragment_vector"])
    ti, ri, tj, rj, th, tw, _ = _size_tile(sch, batch, rows, cols, cpu, config, small,
                                           nominal_batch, nominal_rows, min_regs)
    J = loop_extent(node_of(sch, cols[0])) if len(cols) == 1 else SYMBOLIC
    i0, i1, i2 = sch.split(il, [None, ti, ri])
    if len(cols) == 2:
        j0, j1, j2 = _split_image(sch, cols, th, tw, rj)
    else:
        j0, j1, j2 = sch.split(cols[0], [None, tj, rj])
    step = int(config["k_step"])
    k0, k1 = _split_reduction(sch, reduce, step)
    # a symbolic batch alone on blockIdx.z; constant batch loops (attention heads) fused
    # with the row tiles on blockIdx.y: fused with a symbolic loop, their index (b // 12)
    # could not be proven in bounds and every tile would get a guard
    sym = [lp for lp in batch if loop_extent(node_of(sch, lp)) == SYMBOLIC]
    const = [lp for lp in batch if lp not in sym]
    sch.reorder(*sym, *const, i0, j0, i1, j1, k0, k1, i2, j2)
    if sym:
        b = sch.fuse(*sym) if len(sym) > 1 else sym[0]
        sch.bind(b, "blockIdx.z")
        if const:
            i0 = sch.fuse(*const, i0)
    elif const:
        b = sch.fuse(*const) if len(const) > 1 else const[0]
        sch.bind(b, "blockIdx.z")
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    sch.bind(i1, "threadIdx.y")
    sch.bind(j1, "threadIdx.x")
    names = {node.name}
    consumers = sch.get_consumers(block)
    local = sch.cache_write(block, 0, "local")
    names.add(node_of(sch, local).name)
    sch.reverse_compute_at(local, j1)
    for c in consumers:            # bias / activation into the register write-back
        try:
            sch.reverse_compute_inline(c)
        except ScheduleError:
            pass
    cached = [i for i in (row_input, col_input)
              if shared == "all" or (shared == "compact" and compact_read(node, i))]
    # cache_read shifts nothing in ``block.reads`` (the cache replaces the buffer in place)
    for idx in cached:
        sh = None
        if widen_half(node, idx):
            try:        # the tile in float32, each float16 element converted once as it is
                sh = sch.cache_read(block, idx, "shared", dtype="float32")    # fetched
            except ScheduleError:
                sh = None   # a read other than a conversion (a padded window): as it is
        if sh is None:
            sh = sch.cache_read(block, idx, "shared")
        names.add(node_of(sch, sh).name)
        sch.compute_at(sh, k0)
        inner = [lp for lp in sch.get_loops(sh) if node_of(sch, lp).kind == "serial" and
                 is_under(sch, lp, k0)]
        last = loop_extent(node_of(sch, inner[-1]))
        # (WGSL binds a buffer read in aligned runs of 4 as array<vec4<f32>>: WebGPU's fetch is
        # one 16-byte load as OpenCL's float4)
        vec = int(config["fetch_vector"])
        fv = None
        if vec > 1 and last % vec == 0 and last != SYMBOLIC:
            # each thread copies `vec` consecutive elements of a row: one vector load / store
            lo, fv = sch.split(inner[-1], [None, vec])
            inner = inner[:-1] + [lo]
        f = sch.fuse(*inner) if len(inner) > 1 else inner[0]
        f0, fy, fx = sch.split(f, [None, ti, tj])
        if fv is not None:
            sch.vectorize(fv)
        sch.bind(fy, "threadIdx.y")
        sch.bind(fx, "threadIdx.x")
        if webgpu and loop_extent(node_of(sch, f0)) <= 16:
            sch.unroll(f0)
        if idx == col_input and col_var is not None and (fragments or webgpu and rj > 1):
            _permute_columns(sch, sh, node, idx, col_var, rj, frag_vec if fragments else 1)
        if fragments and idx == row_input and row_var is not None:
            # padded rows where the tiles still fit the target's workgroup storage (the
            # WebGPU spec's 16 KiB hold two 128 x 16 tiles exactly)
            pad = not webgpu or padded_tiles_bytes(step, (ti, ri), (tj, rj)) <= \
                target.max_shared_memory_per_block
            _transpose_rows(sch, sh, node, idx, row_var, pad=pad)
    if fragments and cached:
        _register_fragments(sch, block, cached, k1, frag_vec)
    if fragments and config["register_prefetch"] and cached:
        # the next step's tiles loaded into registers during this step's multiply-adds
        sch.annotate(k0, ANN_REGISTER_PREFETCH, 1)
    init = sch.decompose_reduction(block, k0)
    names.add(node_of(sch, init).name)
    pair = None
    # (only where the columns fill whole tiles: a column guard would differ between the lanes)
    if half_pairs(target, node, rj) and len(cols) == 1 and J != SYMBOLIC and J % (tj * rj) == 0:
        # float16 accumulation where the target computes in half: the register tile's
        # columns in pairs, one vec2<f16> multiply-add each (twice the ALU rate of scalar half
        # on GPUs with packed half arithmetic)
        j2, pair = sch.split(j2, [None, 2])
    for lp in ((i2, j2) if cpu else (k1, i2, j2)):
        sch.unroll(lp)
    if pair is not None:
        sch.vectorize(pair)
    # the register tile's init and write-back unrolled too: indexed by constants only, the
    # accumulators stay in registers
    for b in (init, local):
        for lp in sch.get_loops(b):
            if node_of(sch, lp).kind == "serial" and is_under(sch, lp, j1) and \
                    loop_extent(node_of(sch, lp)) <= 64:
                sch.unroll(lp)
    return names


def _gemm_groups(sch: Schedule, block, spatial):
    """Split a GEMM-like block's spatial loops into (batch, rows, columns): loops read by both
    tiled inputs (or by neither) are batch; the others belong to the input that reads them.
    The columns are the group of the innermost loop (the output's contiguous dim): that loop,
    or the innermost two when both are constant (a convolution's output image); the rows one
    loop of the other group (the largest constant one of at least 16, else the largest). All
    other loops are batch, so a tile never spans two images or sequences."""
    node = node_of(sch, block)
    values = iter_values(sch, block)
    inputs = reduce_inputs(node)
    users = []
    for lp in spatial:
        var = node_of(sch, lp).loop_var
        ivs = [iv.var for iv, v in zip(node.iter_vars, values)
               if iv.kind == "spatial" and uses_any(v, [var])]
        users.append({i for i in inputs
                      if any(uses_any(r.min, ivs) for r in node.reads[i].region)})
    last = users[-1]
    if len(last) != 1:
        raise ScheduleError("default GPU schedule", "the innermost output loop is read by "
                            "both GEMM inputs", None)
    col_input = next(iter(last))
    batch, rows, cols = [], [], []
    for lp, u in zip(spatial, users):
        if len(u) != 1:
            batch.append(lp)
        elif u == last:
            cols.append(lp)
        else:
            rows.append(lp)
    if not rows:
        raise ScheduleError("default GPU schedule", "no row loop (not an outer product)", None)
    # rows: one loop, the largest constant one when it fills a tile's threads (a sequence of
    # 128 beside a symbolic batch: at batch 1 a symbolic row loop would leave the tile
    # empty), else the largest (a symbolic one counts as large); the others are batch
    consts = [lp for lp in rows if loop_extent(node_of(sch, lp)) < SYMBOLIC]
    big = [lp for lp in consts if loop_extent(node_of(sch, lp)) >= 16]
    row = max(big or rows, key=lambda lp: loop_extent(node_of(sch, lp)))
    batch += [lp for lp in rows if lp is not row]
    rows = [row]
    # columns: the innermost loop, or the innermost two when both are constant (a convolution's
    # output rows and columns: a 2-D tile of the image); the others are batch
    if len(cols) > 1 and all(loop_extent(node_of(sch, lp)) != SYMBOLIC for lp in cols[-2:]):
        batch += cols[:-2]
        cols = cols[-2:]
    else:
        batch += cols[:-1]
        cols = cols[-1:]
    batch.sort(key=spatial.index)
    row_input = next(i for i in inputs if i != col_input)
    return batch, rows, cols, row_input, col_input


def _size_tile(sch: Schedule, batch, rows, cols, cpu: bool, config: dict, small: bool,
               nominal_batch: int | None, nominal_rows: int | None, min_regs: int = 1):
    """The block tile of a GEMM-like block whose loops ``_gemm_groups`` grouped: ``(ti, ri,
    tj, rj, th, tw, groups)`` — threads and registers per row and per column (``th x tw``
    threads over a convolution's output image, else None), and the work-groups it makes, a
    symbolic batch counted as ``nominal_batch``. ``min_regs``: ``_fill`` halves the register
    tile to reach ``min_groups`` only down to this many accumulators a thread. Reads the
    schedule, changes nothing."""
    cfg_i = tuple(config["tile_rows"])
    cfg_j = tuple(config["tile_cols"])
    if small:      # half the threads and half the registers per dimension
        cfg_i = (max(1, cfg_i[0] // 2), max(1, cfg_i[1] // 2))
        cfg_j = (max(1, cfg_j[0] // 2), max(1, cfg_j[1] // 2))
    I = loop_extent(node_of(sch, rows[0]))
    if I == SYMBOLIC and nominal_rows is not None:
        I = nominal_rows       # sized as if the symbolic rows were this many (guarded)
    th = tw = None
    if len(cols) == 2:
        H, W = (loop_extent(node_of(sch, lp)) for lp in cols)
        th, tw, rw = _image_tile(H, W, cfg_j)
        tj, rj, jcols = th * tw, rw, -(-H // th)
        jgroups = lambda r: jcols * -(-W // (tw * r))   # noqa: E731
    else:
        J = loop_extent(node_of(sch, cols[0]))
        tj, rj = _tile(J, cfg_j)
        jgroups = lambda r: -(-J // (tj * r))           # noqa: E731
    # threads the columns leave unused (a 7 x 7 image) go to the rows
    ti_cfg = cfg_i[0]
    while ti_cfg * 2 * tj <= cfg_i[0] * cfg_j[0]:
        ti_cfg *= 2
    ti, ri = _tile(I, (ti_cfg, cfg_i[1]))
    batch_groups = _const_groups(sch, batch, nominal_batch)
    if not cpu:
        ri, rj = _fill(I, ti, ri, jgroups, rj, batch_groups=batch_groups,
                       shrink_cols=len(cols) == 1, min_groups=int(config["min_groups"]),
                       multiprocessors=GEMM_BALANCE_MPS, min_regs=min_regs)
    groups = -(-I // (ti * ri)) * jgroups(rj) * batch_groups
    return ti, ri, tj, rj, th, tw, groups


def output_groups(sch: Schedule, block, target: Target, small: bool = False,
                  nominal_batch: int | None = None, nominal_rows: int | None = None,
                  min_regs: int = 1, **config) -> int:
    """The work-groups ``schedule_gemm`` would give the GEMM-like ``block`` (a symbolic batch
    counted as ``nominal_batch``, as there), its register tile halved to reach
    ``min_groups`` only down to ``min_regs`` accumulators a thread: with ``min_regs`` 16, how
    well output tiles of an efficient size fill the GPU (``relax.backend.gpu.split_k``).
    ``config``: ``schedule_gemm``'s tile decisions (default ``default_config(target)``).

    Examples
    --------
    >>> from tilecraft.tensorir import te
    >>> A = te.placeholder((128, 3072), "float32", "A")
    >>> W = te.placeholder((3072, 768), "float32", "W")
    >>> k = te.reduce_axis((0, 3072), "k")
    >>> C = te.compute((128, 768), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    >>> sch = Schedule(te.create_prim_func([A, W, C]))
    >>> output_groups(sch, sch.get_block("C"), Target("opencl"), min_regs=16)   # 64 x 64 tiles
    24
    """
    full = default_config(target)
    full.update({k: v for k, v in config.items() if v is not None})
    spatial, reduce = spatial_loops(sch, block)
    if len(spatial) < 2 or not reduce:
        raise ScheduleError("default GPU schedule", "not a 2-D tiled reduction", None)
    batch, rows, cols, _, _ = _gemm_groups(sch, block, spatial)
    return _size_tile(sch, batch, rows, cols, for_cpu(target), full, small, nominal_batch,
                      nominal_rows, min_regs)[-1]


def _split_reduction(sch: Schedule, reduce, step: int):
    """(outer, inner) reduction loops, about ``step`` iterations inside. Several loops (a
    convolution's channels x window): the outer loop steps over whole channels — the inner
    loop covers ``c`` channels times the window — so each step's input tiles have a constant
    size (a fused loop split by 16 would cross channel boundaries at varying points)."""
    window = 1
    for lp in reduce[1:]:
        window *= loop_extent(node_of(sch, lp))
    if len(reduce) > 1 and window < SYMBOLIC and loop_extent(node_of(sch, reduce[0])) < SYMBOLIC:
        channels = loop_extent(node_of(sch, reduce[0]))
        c = max(1, min(channels, step // window))
        while channels % c:
            c -= 1
        k0, c1 = sch.split(reduce[0], [None, c])
        return k0, sch.fuse(c1, *reduce[1:])
    k = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
    bk = step if loop_extent(node_of(sch, k)) >= step else loop_extent(node_of(sch, k))
    return sch.split(k, [None, bk])


def _image_tile(H: int, W: int, config: tuple[int, int]) -> tuple[int, int, int]:
    """A 2-D tile over a convolution's output rows ``H`` and columns ``W``: ``(th, tw, rw)``
    with ``rw`` columns per thread in registers (a divisor of ``W`` when one is close to the
    register count, so the tile has no tail), ``tw`` threads across a row and ``th`` down the
    image, ``th * tw`` at most the column threads of ``config``."""
    threads, regs = config
    divisors = [d for d in range(1, min(regs, W) + 1) if W % d == 0]
    rw = divisors[-1] if divisors[-1] * 2 > min(regs, W) else min(regs, W)
    tw = min(threads, -(-W // rw))
    th = max(1, min(threads // tw, H))
    return th, tw, rw


def _split_image(sch: Schedule, cols, th: int, tw: int, rw: int):
    """The image tile's fused (work-group, thread, register) loops."""
    hl, wl = cols
    h0, h1 = sch.split(hl, [None, th])
    w0, w1, w2 = sch.split(wl, [None, tw, rw])
    sch.reorder(h0, w0, h1, w1, w2)
    return sch.fuse(h0, w0), sch.fuse(h1, w1), w2


def _const_groups(sch: Schedule, batch, nominal: int | None = None) -> int:
    """Work-groups the batch loops multiply the tile count by, a symbolic loop counted as
    ``nominal`` (None: ``GEMM_NOMINAL_BATCH``)."""
    nominal = GEMM_NOMINAL_BATCH if nominal is None else nominal
    n = 1
    for lp in batch:
        e = loop_extent(node_of(sch, lp))
        n *= nominal if e == SYMBOLIC else e
    return n


def _fill(I: int, ti: int, ri: int, jgroups, rj: int, batch_groups: int,
          shrink_cols: bool, min_groups: int = GEMM_MIN_GROUPS,
          multiprocessors: int = 0, min_regs: int = 1) -> tuple[int, int]:
    """Register counts ``(ri, rj)``, halved (the larger first) until the kernel has at least
    ``GEMM_MIN_GROUPS`` work-groups: a BERT dense layer at batch 1 (128 x 768) or a 7 x 7
    convolution with 512 channels has only 4-6 full-size tiles, which leaves most of a GPU's
    multiprocessors idle; a smaller tile per thread is slower per work-group but fills them.

    ``multiprocessors`` > 0 and ``shrink_cols`` (a dense layer, not a convolution's image
    tile): then halved further while that raises the share of the multiprocessors busy to the
    end (``_busy_share``) by ``GEMM_BALANCE_GAIN``, down to ``GEMM_BALANCE_MIN_REGS``
    accumulators a thread. ``min_regs``: the first halving stops above this many
    accumulators a thread (1: down to one)."""
    def groups(a, b):
        return -(-I // (ti * a)) * jgroups(b) * batch_groups

    def halved(a, b):
        if a >= b and a > 1 or (a > 1 and not shrink_cols):
            return a // 2, b
        if shrink_cols and b > 1:
            return a, b // 2
        return None
    while groups(ri, rj) < min_groups:
        smaller = halved(ri, rj)
        if smaller is None or smaller[0] * smaller[1] < min_regs:
            break
        ri, rj = smaller
    if multiprocessors > 0 and shrink_cols:
        while True:
            smaller = halved(ri, rj)
            if smaller is None or smaller[0] * smaller[1] < GEMM_BALANCE_MIN_REGS:
                break
            if _busy_share(groups(*smaller), multiprocessors) < \
                    GEMM_BALANCE_GAIN * _busy_share(groups(ri, rj), multiprocessors):
                break
            ri, rj = smaller
    return ri, rj


def _busy_share(groups: int, multiprocessors: int) -> float:
    """The share of ``multiprocessors`` x waves work-group slots that ``groups`` work-groups
    fill, a wave being one work-group on each multiprocessor: 1.0 where they divide evenly;
    192 groups on 132 multiprocessors 0.73 (two waves, the second 60 of 132 busy)."""
    waves = -(-groups // multiprocessors)
    return groups / (waves * multiprocessors)


def _permute_columns(sch: Schedule, shared_block, node: Block, idx: int, col_var,
                     rj: int, vector: int = 1) -> None:
    """Store the column input's shared tile as ``(.., c % rj, c // rj, ..)`` along its column
    dim: thread ``t`` reads columns ``t*rj .. t*rj+rj-1``, so without it neighbouring threads
    read words ``rj`` apart (bank conflicts, no vector reads); with it neighbouring words. Only
    when exactly one dim of the input is indexed by the column iter var alone and its extent
    divides by ``rj``.

    ``vector > 1`` (dividing ``rj``): ``(.., (c % rj) // vector, c // rj, c % vector, ..)`` —
    each thread's ``rj`` columns are ``rj / vector`` runs of ``vector`` neighbouring words, the
    runs of neighbouring threads side by side: one aligned vector read per run, the threads of
    a warp reading consecutive vectors (no bank conflicts)."""
    if vector > 1 and rj % vector:
        return
    read = node.reads[idx]
    dims = [d for d, r in enumerate(read.region) if r.min is col_var]
    if len(dims) != 1:
        return
    d = dims[0]
    ext = read.buffer.shape[d]
    if not isinstance(ext, IntImm) or ext.value % rj:
        return

    def permute(*ix):
        if vector > 1:
            c = ix[d]
            return tuple(ix[:d]) + ((c % rj) // vector, c // rj, c % vector) + tuple(ix[d + 1:])
        return tuple(ix[:d]) + (ix[d] % rj, ix[d] // rj) + tuple(ix[d + 1:])
    sch.transform_layout(shared_block, 0, IndexMap.from_func(permute, ndim=len(read.buffer.shape)),
                         "write")


def _transpose_rows(sch: Schedule, shared_block, node: Block, idx: int, row_var,
                    pad: bool = True) -> None:
    """Store the row input's shared tile with its row dim innermost (``A[i, k]`` as
    ``(k, i)``): a thread's register rows at one ``k`` are then neighbouring words, read as
    vectors (``_register_fragments``). Only when exactly one dim is indexed by the row iter var
    alone."""
    read = node.reads[idx]
    dims = [d for d, r in enumerate(read.region) if r.min is row_var]
    nd = len(read.buffer.shape)
    if len(dims) != 1 or dims[0] == nd - 1:
        return
    d = dims[0]

    def move_last(*ix):
        return tuple(ix[:d]) + tuple(ix[d + 1:]) + (ix[d],)
    sch.transform_layout(shared_block, 0, IndexMap.from_func(move_last, ndim=nd), "write")
    # the fetch writes a column of the transposed tile per warp: rows 4 words (one float4)
    # longer than a multiple of the 32 banks spread its stores over the banks (2-way conflicts
    # instead of 4- to 16-way) and keep every row 16-byte aligned
    if pad:
        sch.storage_align(shared_block, 0, nd - 2, 32, 4)


def _register_fragments(sch: Schedule, block, cached, k1, vec: int) -> None:
    """Per reduction step ``k1``, copy each thread's slice of the shared tiles (its register
    rows of the row input, its register columns of the column input) into registers first
    (``cache_read`` local at ``k1``), the innermost copy loop vectorized by
    ``vec``: the multiply-adds then read registers, and the shared memory is read once per
    element, as 128-bit loads (with the tiles laid out by ``_transpose_rows`` /
    ``_permute_columns``), instead of once per multiply-add."""
    for idx in cached:
        frag = sch.cache_read(block, idx, "local")
        sch.compute_at(frag, k1)
        loops = [lp for lp in sch.get_loops(frag) if is_under(sch, lp, k1)]
        if not loops:
            continue
        inner = loops[-1]
        ext = loop_extent(node_of(sch, inner))
        if vec > 1 and ext % vec == 0 and ext != SYMBOLIC:
            lo, vi = sch.split(inner, [None, vec])
            sch.vectorize(vi)
            loops = loops[:-1] + [lo]
        for lp in loops:
            if loop_extent(node_of(sch, lp)) <= 64:
                sch.unroll(lp)


GEMM_HALF_PAIRS = True    # float16 accumulation in vec2<f16> pairs on WebGPU (half_pairs)
# The shared tiles of a float16 operand accumulated in float32: "float32" (the tile converted as
# it is fetched, once per element and work-group: the register fragments and multiply-adds are
# the float32 kernel's) or "float16" (half the shared memory; each thread converts its
# fragments, once per element it reads: 16 conversions per 64 multiply-adds of an 8 x 8
# register tile, and GPUs convert at a fraction of their FMA rate). TILECRAFT_GEMM_HALF_SHARED
# overrides it (the device A/B: benchmarks.lowp_fp16).
GEMM_HALF_SHARED = "float32"


def widen_half(block: Block, idx: int) -> bool:
    """Whether the GEMM-like ``block``'s input ``idx`` gets a float32 shared tile (see
    ``GEMM_HALF_SHARED``): a float16 input of a block that accumulates in float32."""
    choice = os.environ.get("TILECRAFT_GEMM_HALF_SHARED", "").strip() or GEMM_HALF_SHARED
    if choice not in ("float32", "float16"):
        raise ValueError(f"TILECRAFT_GEMM_HALF_SHARED must be 'float32' or 'float16', got "
                         f"{choice!r}")
    return choice == "float32" and block.reads[idx].buffer.dtype == "float16" and \
        all(w.buffer.dtype == "float32" for w in block.writes)


def half_pairs(target: Target, block: Block, rj: int) -> bool:
    """Whether the GEMM-like ``block`` (with ``rj`` register columns a thread) accumulates its
    register tile's columns in pairs of float16 lanes: float16 accumulation on WebGPU (whose
    float16 is the ``shader-f16`` feature: half arithmetic), ``rj`` even, ``GEMM_HALF_PAIRS``.
    (OpenCL's half2 would need cl_khr_fp16, which neither NVIDIA's driver nor PoCL reports.)"""
    return GEMM_HALF_PAIRS and target.kind == "webgpu" and not for_cpu(target) and \
        rj % 2 == 0 and rj > 1 and all(w.buffer.dtype == "float16" for w in block.writes)


def for_cpu(target: Target) -> bool:
    """Whether the target names a CPU OpenCL device (``-device=cpu``; ``-device=nvidia-emulated``,
    the tensor-core kernels' test target, runs on one too)."""
    return str(target.export().get("device", "")).lower() in ("cpu", "pocl", "nvidia-emulated")


def _tile(extent: int, config: tuple[int, int]) -> tuple[int, int]:
    """(threads, elements per thread) of one GEMM output dimension: the configured threads
    and as many registers (a power of two, at most the configured) as the extent fills."""
    threads, regs = config
    if extent >= threads:
        r = regs
        while r > 1 and threads * r > extent:
            r //= 2
        return threads, r
    t = 1
    while t * 2 <= extent:
        t *= 2
    return t, 1
