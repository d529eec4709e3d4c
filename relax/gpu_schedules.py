"""Default GPU schedules: what ``relax.build`` applies, for an ``opencl`` or ``webgpu`` target, to
every kernel no tuning record covers — every nest bound to work-groups and threads, so an
untuned GPU build runs at a sensible speed (``relax/default_schedules.py`` is the CPU one).

Rules, tried in order on a ``te.create_prim_func``-style kernel (a root block whose children
are loop nests of one block each):

1. **Inline** cheap spatial producers into their consumers (``compute_inline``) and
   elementwise epilogues into their producers (``reverse_compute_inline``) — except a
   convolution's padding, which is inlined after the GEMM schedule into the shared-memory
   fetch of the window tile (a plain box of the padded input, loaded from the unpadded one
   with bounds checks): no padding kernel, no padded copy of the activation; and a block
   annotated ``KEEP_STAGE`` (a Winograd input transform), which stays a kernel of its own.
2. **Dense layers of a few rows** (one token of a decoder; a static row count up to
   ``GEMV_MAX_ROWS``, or a symbolic one, which gets the GEMV while it is that small and the
   GEMM tiles from there on, chosen per call): the GEMV (``relax.backend.gpu.gemv``: many
   work-groups of a few columns, the reduction split among threads with float4 weight loads
   and met in shared memory, the epilogue in the write-back).
   **GEMM-like reductions** (two inputs read with the reduction variable: matmul, batch
   matmul, dense, convolution) as an (implicit) GEMM: the GPU GEMM family
   (``relax.backend.gpu.gemm``: a block tile of outputs per work-group accumulated in
   registers, both input tiles staged in shared memory and read through register fragments,
   the epilogues inlined into the register write-back). A symbolic batch on ``blockIdx.z``
   gets up to three tiles, sized for batch 1, for ``GEMM_NOMINAL_BATCH`` and for
   ``GEMM_LARGE_NOMINAL_BATCH``, chosen per call on the host
   (``relax.backend.gpu.batch_dispatch``). Where the output tiles fill the GPU poorly and the
   reduction is long (a BERT dense layer at batch 1): split-K (``relax.backend.gpu.split_k``),
   the GEMM tile over (parts, tiles) writing partials, then their sum with the epilogue (a
   symbolic batch: below ``GEMM_SPLITK_BATCH``). Where the tiles do not fit the target
   (WebGPU's 16 KiB of workgroup storage), a quarter-size tile, then only the inputs read at
   plain indices (a convolution's weights) in shared memory, then registers only.
   **Depthwise convolutions** (``relax.backend.gpu.depthwise``): a tile of one channel's image
   per work-group, its padded input window in shared memory, the epilogue in the register
   write-back.
3. **Row reductions** (softmax, layer / RMS norm, sums and maxima): one work-group per row,
   ``T`` threads sharing each reduction (a cross-thread reduction: partials per thread, a tree
   in shared memory), every reduction of the kernel ``compute_at`` the output's row loop with
   its result in a register, the output written by the same threads — one pass over a row that
   stays in cache. A lone reduction over a short window (max / average pooling) is one thread
   per output instead, its window (and padding) read directly.
4. **Injective** blocks (elementwise, broadcast, reshape, transpose): all loops fused, four
   consecutive elements per thread as one vector when the extent allows, 256 threads per
   work-group.
5. Anything else: one thread per output element, its reduction serial.

``Target("opencl -device=cpu")`` (a CPU driver such as PoCL) gets a smaller GEMM tile.
``Target("opencl -device=nvidia")`` (tensor cores: ``Target.tensor_cores``) tries the
tensor-core fp16 GEMM first (``relax.backend.gpu.tensor_core``: float16 x float16 -> float32
dense / matmul / batch matmul with its fused epilogue); a kernel it does not match gets the
rules below. With ``-fp32-tensor-cores=3xtf32`` (``Target.fp32_tensor_cores``) float32
GEMM-like kernels try the 3xTF32 tensor-core GEMM before that (``relax.backend.gpu.
tensor_core_tf32``: float32-level accuracy on the TF32 tensor cores).

Each rule is a sequence of checked ``Schedule`` primitives; a rule that does not apply (a
``ScheduleError``, or a kernel the device lowering rejects — over the target's limits) falls
back to the next, down to rule 5. A kernel that already has thread-bound loops (a hand
schedule or a tuning record) is left alone.

Examples
--------
>>> from tilecraft.tensorir import te
>>> A = te.placeholder((1024,), "float32", "A")
>>> B = te.compute((1024,), lambda i: A[i] * 2.0, "B")
>>> f = apply(te.create_prim_func([A, B]), Target("opencl"))
>>> sorted({l.thread_tag for l in _loops_of(f) if l.kind == "thread_binding"})
['blockIdx.x', 'threadIdx.x']
"""
from __future__ import annotations

import os
import warnings

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import Call as TCall
from tilecraft.tensorir.expr import IntImm, TIRError
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.stmt import Block, BlockRealize, For, IfThenElse
from tilecraft.tensorir.structural import structural_hash
from tilecraft.tensorir.transform import lower_device

from .backend.gpu.batch_dispatch import by_batch, symbolic_batch
from .backend.gpu.depthwise import is_depthwise, schedule_depthwise
from .backend.gpu import gemm, gemv, tensor_core, tensor_core_tf32
from .backend.gpu.gemm import (GEMM_NOMINAL_ROWS, GEMM_SMALL_BATCH, GEMM_SMALL_ROWS,
                               compact_read, is_gemm_like, reduce_inputs, schedule_gemm,
                               symbolic_rows)
from .backend.gpu.split_k import GEMM_SPLITK_BATCH, schedule_split_k, split_factor
from .backend.gpu.schedule_utils import (SYMBOLIC, inline_spatial_producers, is_reduction,
                                         is_spatial, keeps_stage, loop_extent, node_of,
                                         spatial_loops)

from .default_schedules import DefaultScheduleWarning

GPU_KINDS = ("opencl", "webgpu")
THREADS = 256          # threads per work-group of injective kernels and row reductions
VECTOR = 4             # elements per thread of injective kernels (one float4)


def _loops_of(func: PrimFunc) -> list[For]:
    out = []
    post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, For) else None)
    return out[::-1]


def is_scheduled(func: PrimFunc) -> bool:
    """Whether ``func`` already has thread-bound loops (or is marked scheduled)."""
    attrs = func.attr_dict
    if attrs.get("tir.is_scheduled") or attrs.get("is_scheduled"):
        return True
    return any(f.kind == "thread_binding" for f in _loops_of(func))


def apply(func: PrimFunc, target: Target) -> PrimFunc:
    """``func`` with the default GPU schedule for ``target`` (see the module docstring).

    Unchanged when the target is not a GPU or ``func`` is already scheduled. The result is
    checked by lowering it for ``target``; a rule whose kernel the lowering rejects falls back
    to a simpler one.
    """
    if target.kind not in GPU_KINDS or is_scheduled(func):
        return func
    name = func.attr_dict.get("global_symbol", "main")
    if target.fp32_tensor_cores is not None:
        out = _tensor_core_gemm(func, target, name, tensor_core_tf32.tf32_kernel, "TF32 ")
        if out is not None:
            return _with_simt_below(func, out, target, name)
    if target.tensor_cores is not None and not _simt_window_conv(func):
        out = _tensor_core_gemm(func, target, name)
        if out is not None:
            return out
    for i, strategy in enumerate(_STRATEGIES):
        try:
            out = _scheduled(func, strategy, target)
            out = _with_small_batch_variant(func, out, _STRATEGIES[:i + 1], target)
            return _with_gemv_variant(func, out, target)
        except (ScheduleError, ValueError, TIRError) as err:   # does not apply / over a limit
            if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
                warnings.warn(f"{_name_of(strategy)} of {name}: {type(err).__name__}: {err}")
            continue
        except Exception as err:  # a bug in a rule must not break the build
            warnings.warn(f"GPU default schedule of {name} failed ({type(err).__name__}: "
                          f"{err}); trying a simpler one")
            continue
    warnings.warn(f"no GPU default schedule applies to {name}; it runs as one thread",
                  DefaultScheduleWarning)
    return func


def _simt_window_conv(func: PrimFunc) -> bool:
    """Whether ``TILECRAFT_TC_WINDOW_CONV=0`` sends ``func``, a convolution over a window
    (several reduction dims, its input gathered), to the SIMT rules instead of the tensor
    cores (default: the tensor cores take it)."""
    if os.environ.get("TILECRAFT_TC_WINDOW_CONV", "1").strip() != "0":
        return False
    try:
        gm = tensor_core.match_fp16_gemm(func)
    except ValueError:
        return False
    return len(gm.k_vars) > 1 and "gather" in (gm.a_mode, gm.b_mode)


def _tensor_core_gemm(func: PrimFunc, target: Target, name: str,
                      kernel=tensor_core.tensor_core_kernel, kind: str = ""
                      ) -> PrimFunc | None:
    """``func`` as the tensor-core fp16 GEMM (``backend.gpu.tensor_core``; a target with
    ``tensor_cores``) — or, with ``kernel=tensor_core_tf32.tf32_kernel``, the 3xTF32 float32
    GEMM (a target with ``fp32_tensor_cores``) — or None where it is not one (the reason named
    under ``TILECRAFT_DEBUG_SCHEDULES``) and the rules below schedule it."""
    try:
        out = kernel(func, target)
        lower_device(out, target)      # over a limit -> the rules below
        return out
    except (ScheduleError, ValueError, TIRError) as err:
        if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
            warnings.warn(f"{kind}tensor-core GEMM of {name} does not apply: {err}")
        return None


def _with_simt_below(func: PrimFunc, tf32: PrimFunc, target: Target, name: str) -> PrimFunc:
    """``tf32`` (``func`` as the 3xTF32 kernel), or, below ``tensor_core_tf32.min_outputs()``
    output elements (rows x columns x batch of the GEMM), the SIMT schedule of ``func`` (the
    target without ``fp32_tensor_cores``): for static sizes the one that applies, for
    symbolic ones both, chosen per call on the host (the condition is over symbolic dims
    only)."""
    threshold = tensor_core_tf32.min_outputs()
    if not threshold:
        return tf32
    gm = tensor_core.match_fp16_gemm(func, "float32")
    outputs = gm.product(gm.batch_vars + gm.row_vars + gm.col_vars)
    if isinstance(outputs, int) and outputs >= threshold:
        return tf32
    config = target.export()
    config.pop("fp32_tensor_cores")
    simt = apply(func, Target(config))
    if isinstance(outputs, int):
        return simt
    try:
        realize = simt.body
        if not isinstance(realize, BlockRealize) or realize.block.iter_vars:
            raise ValueError("the SIMT schedule has no root block")
        root = realize.block
        block = Block(root.name, root.iter_vars, root.reads, root.writes,
                      IfThenElse(outputs < threshold, root.body, tf32.body), None,
                      root.alloc_buffers, dict(root.annotations))
        both = simt.replace(body=BlockRealize(realize.iter_values, realize.predicate, block))
        lower_device(both, target)
        return both
    except (ScheduleError, ValueError, TIRError) as err:
        if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
            warnings.warn(f"SIMT schedule of {name} below {threshold} outputs: "
                          f"{type(err).__name__}: {err}; 3xTF32 at every size")
        return tf32


def _scheduled(func: PrimFunc, strategy, target: Target, **kw) -> PrimFunc:
    """``func`` scheduled by ``strategy``, checked by lowering it for ``target``. Where the
    strategy split-K'd a kernel and that failed (a primitive refused, or over a limit), the
    same strategy without split-K (the design's fallback: the kernel as one GEMM tile)."""
    try:
        # over a limit -> the caller tries the next strategy
        return _run_strategy(func, strategy, target, **kw)[0].func
    except (ScheduleError, ValueError, TIRError) as err:
        if kw.get("split_k") is False or not _splits(func, strategy, target, kw):
            raise
        if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
            warnings.warn(f"split-K of {func.attr_dict.get('global_symbol', 'main')} "
                          f"({_name_of(strategy)}): {type(err).__name__}: {err}; without it")
    return _scheduled(func, strategy, target, **kw, split_k=False)


def _run_strategy(func: PrimFunc, strategy, target: Target, **kw):
    """``(schedule, k_step)``: ``func`` scheduled by ``strategy`` (a new ``Schedule``, its trace
    the schedule's) and checked by lowering it for ``target``, and the GEMM k-step decided
    here (None where not). A GEMM-family kernel on a WebGPU target whose k-step the tile
    decisions leave open and whose workgroup storage allows the wide one
    (``gemm.webgpu_k_step``) is tried at that step first; where it does not schedule, does not
    fit a limit, or leaves the WGSL generator's unroll budget (``gemm.wgsl_within_unroll_budget``:
    a register tile would stay a dynamically indexed array, ResNet-50's classifier at 16), it
    gets ``gemm.GEMM_BK_WEBGPU`` (8), the reason named under ``TILECRAFT_DEBUG_SCHEDULES``."""
    wide = _wide_k_step(func, strategy, target, kw)
    if wide is None:
        return _apply_strategy(func, strategy, target, kw)[0], None
    try:
        sch, split = _apply_strategy(func, strategy, target, kw, wide)
        if gemm.wgsl_within_unroll_budget(split):
            return sch, wide
        reason = "its WGSL would leave the unroll budget"
    except (ScheduleError, ValueError, TIRError) as err:
        reason = f"{type(err).__name__}: {err}"
    if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
        warnings.warn(f"{_name_of(strategy)} of {func.attr_dict.get('global_symbol', 'main')}: "
                      f"GEMM k-step {wide}: {reason}; k-step {gemm.GEMM_BK_WEBGPU}")
    sch, _ = _apply_strategy(func, strategy, target, kw, gemm.GEMM_BK_WEBGPU)
    return sch, gemm.GEMM_BK_WEBGPU


def _apply_strategy(func: PrimFunc, strategy, target: Target, kw: dict,
                    k_step: int | None = None):
    """``(schedule, split)``: ``func`` scheduled by ``strategy`` (with ``kw``; ``k_step``: the
    GEMM k-step, None: as ``kw`` says) on a new ``Schedule``, and its ``lower_device`` for
    ``target`` (over a limit: an error)."""
    if k_step is not None:
        kw = {**kw, "gemm_config": {**(kw.get("gemm_config") or {}), "k_step": k_step}}
    sch = Schedule(func)
    strategy(sch, target, **kw)
    return sch, lower_device(sch.func, target)


def _wide_k_step(func: PrimFunc, strategy, target: Target, kw: dict) -> int | None:
    """The WebGPU GEMM k-step ``_run_strategy`` tries first for ``strategy`` on ``func``: the
    target's wide one (``gemm.webgpu_k_step``) for a GEMM-family strategy on a kernel with a
    GEMM-like block, the k-step not given; else None (the strategy as it is)."""
    if target.kind != "webgpu" or not getattr(strategy, "sizes_gemm", False) or \
            "k_step" in (kw.get("gemm_config") or {}):
        return None
    step = gemm.default_config(target)["k_step"]
    if step == gemm.GEMM_BK_WEBGPU or not _has_gemm(func):
        return None
    return step


def _splits(func: PrimFunc, strategy, target: Target, kw: dict) -> bool:
    """Whether ``strategy`` (with its sizing ``kw``) split-K's a GEMM-like block of ``func``."""
    if not getattr(strategy, "sizes_gemm", False):
        return False
    options = {**strategy.options, **kw}
    sch = Schedule(func)
    _inline(sch)
    for b in _blocks(sch):
        node = node_of(sch, b)
        if is_reduction(node) and is_gemm_like(node) and _big_output(sch, b) and \
                split_factor(sch, b, target, options.get("small", False),
                             options.get("nominal_batch"), options.get("nominal_rows"),
                             **(options.get("gemm_config") or {})) > 1:
            return True
    return False


def _with_small_batch_variant(func: PrimFunc, out: PrimFunc, tried, target: Target) -> PrimFunc:
    """``out`` (scheduled by the last of the strategies ``tried``), or, for a GEMM-like kernel
    with a symbolic batch on ``blockIdx.z`` whose tile sized for batch 1 differs, both schedules
    chosen per call by the batch (``backend.gpu.batch_dispatch``): below ``GEMM_SMALL_BATCH``
    the batch-1 tile, from the first of ``tried`` that fits with it (a smaller tile may fit a
    strategy the nominal one did not: WebGPU's 16 KiB, a strided convolution's window); and
    from ``GEMM_LARGE_BATCH`` on the tile sized for ``GEMM_LARGE_NOMINAL_BATCH`` where that
    one differs (``_with_large_batch_variant``); below ``GEMM_SPLITK_BATCH`` split-K where its
    rule splits the kernel at batch 1 (``_with_split_k_variant``)."""
    if not getattr(tried[-1], "sizes_gemm", False):
        return out
    batch, threshold, sizing = symbolic_batch(out), GEMM_SMALL_BATCH, {"nominal_batch": 1}
    if batch is None:
        # a symbolic row loop (a dense layer over the batch): the tile sized for a few rows
        batch, threshold = _symbolic_rows(func), GEMM_SMALL_ROWS
        sizing = {"nominal_rows": GEMM_NOMINAL_ROWS}
    if batch is None:
        return out
    try:
        if "nominal_batch" in sizing:
            out = _with_large_batch_variant(func, out, batch, tried, target)
        small = _first_that_fits(func, tried, target, {**sizing, "split_k": False})
        if "nominal_batch" in sizing:
            small = _with_split_k_variant(func, small, batch, threshold, tried, target)
        if small is None or _launch_shape(small) == _launch_shape(out):
            return out
        both = by_batch(batch, threshold, small, out)
        lower_device(both, target)
        return both
    except (ScheduleError, ValueError, TIRError) as err:
        if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
            warnings.warn(f"batch-1 variant of {func.attr_dict.get('global_symbol')}: "
                          f"{type(err).__name__}: {err}")
        return out


def _with_split_k_variant(func: PrimFunc, small, batch, threshold: int, tried,
                          target: Target):
    """``small`` (the tile sized for batch 1, run below ``threshold``), or, where the split-K
    rule (``backend.gpu.split_k``) splits the kernel sized for batch 1, that schedule in its
    place below ``GEMM_SPLITK_BATCH`` (from there to ``threshold`` ``small`` stays)."""
    split = _first_that_fits(func, tried, target, {"nominal_batch": 1, "split_k": True})
    if split is None or small is not None and _launch_shape(split) == _launch_shape(small):
        return small       # not split: the same schedule
    if small is None or GEMM_SPLITK_BATCH >= threshold:
        return split
    both = by_batch(batch, GEMM_SPLITK_BATCH, split, small)
    lower_device(both, target)
    return both


def _with_gemv_variant(func: PrimFunc, out: PrimFunc, target: Target) -> PrimFunc:
    """``out``, or, for a dense layer whose row count is symbolic (a decoder's tokens), the
    GEMV (``backend.gpu.gemv``) while the rows are at most ``GEMV_MAX_ROWS`` and ``out`` from
    there on, chosen per call on the host (``backend.gpu.batch_dispatch``)."""
    if not gemv.GEMV_MAX_ROWS:
        return out
    sch = Schedule(func)
    _inline(sch)
    reductions = [b for b in _blocks(sch) if is_reduction(node_of(sch, b))]
    if len(reductions) != 1:
        return out
    rows = gemv.gemv_rows(sch, reductions[0])
    if rows is None or isinstance(rows, IntImm):
        return out
    try:
        small = _scheduled(func, _strategy(_schedule_best, "GEMV", gemv_rows=True), target)
        both = by_batch(rows, gemv.GEMV_MAX_ROWS + 1, small, out)
        lower_device(both, target)
        return both
    except (ScheduleError, ValueError, TIRError) as err:
        if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
            warnings.warn(f"GEMV variant of {func.attr_dict.get('global_symbol')}: "
                          f"{type(err).__name__}: {err}")
        return out


def _first_that_fits(func: PrimFunc, tried, target: Target, sizing: dict):
    """``func`` scheduled with ``sizing`` by the first of the strategies ``tried`` that
    applies and lowers, or None."""
    for strategy in tried:
        try:
            return _scheduled(func, strategy, target, **sizing)
        except (ScheduleError, ValueError, TIRError):
            continue
    return None


def _with_large_batch_variant(func: PrimFunc, out: PrimFunc, batch, tried,
                              target: Target) -> PrimFunc:
    """``out`` (the tile sized for ``GEMM_NOMINAL_BATCH``), or, where the tile sized for
    ``GEMM_LARGE_NOMINAL_BATCH`` differs, both: that one from ``GEMM_LARGE_BATCH`` on (a
    kernel whose tile was shrunk to fill the GPU at the nominal batch gets the larger, more
    efficient tile at batch 16)."""
    if not gemm.GEMM_LARGE_BATCH or gemm.GEMM_LARGE_BATCH <= GEMM_SMALL_BATCH:
        return out
    large = _first_that_fits(func, tried, target,
                             {"nominal_batch": gemm.GEMM_LARGE_NOMINAL_BATCH})
    if large is None or _launch_shape(large) == _launch_shape(out):
        return out
    both = by_batch(batch, gemm.GEMM_LARGE_BATCH, out, large)
    lower_device(both, target)
    return both


def _symbolic_rows(func: PrimFunc):
    """The symbolic row dim of ``func``'s one GEMM-like block (see ``gemm.symbolic_rows``), or
    None (none, or several)."""
    sch = Schedule(func)
    _inline(sch)
    gemms = [b for b in _blocks(sch) if is_reduction(node_of(sch, b)) and
             is_gemm_like(node_of(sch, b))]
    return symbolic_rows(sch, gemms[0]) if len(gemms) == 1 else None


def _launch_shape(func: PrimFunc) -> list:
    return [(lp.thread_tag, str(lp.extent)) for lp in _loops_of(func)
            if lp.kind == "thread_binding"]


# ---------------------------------------------------------------------------------------------
# the default schedule as one trace (tuning baselines and the tuner's GEMM space)


def default_schedule(func: PrimFunc, target: Target) -> Schedule | None:
    """The default GPU schedule of ``func`` (what ``apply`` gives it) as a ``Schedule`` whose
    trace replays to it; None where ``apply`` gives more than one trace can say (a kernel with
    a symbolic batch runs two or three schedules chosen per call), leaves ``func`` alone, or
    the target is no GPU.

    Examples
    --------
    >>> sch = default_schedule(func, Target("opencl"))          # doctest: +SKIP
    >>> sch.trace.apply(func).func                               # doctest: +SKIP
    """
    found = default_strategy(func, target)
    return found[1] if found is not None else None


def default_strategy(func: PrimFunc, target: Target):
    """``(options, schedule)`` of the strategy ``apply`` uses on ``func``: its options
    (``{"shared": ..., "small": ...}`` for the GEMM rule's, ``None`` for the others) and the
    ``Schedule`` it makes; None as for ``default_schedule``."""
    if target.kind not in GPU_KINDS or is_scheduled(func):
        return None
    built = apply(func, target)
    for strategy in _STRATEGIES:
        try:
            sch, k_step = _run_strategy(func, strategy, target)
        except (ScheduleError, ValueError, TIRError):
            continue
        except Exception:   # noqa: BLE001 - apply skipped this strategy as well (a bug in it)
            continue
        if structural_hash(sch.func) != structural_hash(built):
            return None
        if not strategy.sizes_gemm:
            return None, sch
        # (the WebGPU k-step where _run_strategy decided it for this kernel)
        return dict(strategy.options, **({} if k_step is None else {"k_step": k_step})), sch
    return None


def gemm_defaults(func: PrimFunc, target: Target) -> dict | None:
    """The GEMM tile decisions of ``func``'s default schedule: ``gemm.default_config`` with the
    quarter-size tile where the default took it, and ``shared`` (which inputs are staged in
    shared memory); None where the default is no single GEMM-family schedule (not GEMM-like,
    a symbolic batch's several schedules). ``schedule_gemm_kernel(sch, target, **defaults)``
    makes the default schedule again.

    Examples
    --------
    >>> gemm_defaults(matmul_func, Target("opencl"))["k_step"]        # doctest: +SKIP
    16
    """
    found = gemm_default_schedule(func, target)
    return found[0] if found is not None else None


def gemm_default_schedule(func: PrimFunc, target: Target):
    """``(gemm_defaults(func, target), default_schedule(func, target))`` in one pass, or
    None as for ``gemm_defaults``."""
    found = default_strategy(func, target)
    if found is None or found[0] is None:
        return None
    options, sch = found
    if not _has_gemm(func):
        return None
    config = gemm.default_config(target)
    if options.get("small"):
        config["tile_rows"] = tuple(max(1, x // 2) for x in config["tile_rows"])
        config["tile_cols"] = tuple(max(1, x // 2) for x in config["tile_cols"])
    config["shared"] = options.get("shared", "all")
    if "k_step" in options:        # decided for this kernel (WebGPU: the unroll budget)
        config["k_step"] = options["k_step"]
    return config, sch


def schedule_gemm_kernel(sch: Schedule, target: Target, shared: str = "all",
                         **config) -> None:
    """Rules 1-4 on a kernel with GEMM-like blocks, the GEMM tile decisions given
    (``schedule_gemm``'s keyword arguments: ``tile_rows``, ``tile_cols``, ``k_step``,
    ``fragments``, ``fragment_vector``, ``fetch_vector``, ``register_prefetch``,
    ``min_groups``) and ``shared`` (``"all"``, ``"compact"``, ``"none"``). ``ScheduleError``
    where it does not apply.

    Examples
    --------
    >>> sch = Schedule(func)                                          # doctest: +SKIP
    >>> schedule_gemm_kernel(sch, Target("opencl"), k_step=8, tile_rows=(8, 4))  # doctest: +SKIP
    """
    _schedule_best(sch, target, shared=shared, gemm_config=config)


def _has_gemm(func: PrimFunc) -> bool:
    sch = Schedule(func)
    _inline(sch)
    return any(is_reduction(node_of(sch, b)) and is_gemm_like(node_of(sch, b)) and
               _big_output(sch, b) for b in _blocks(sch))


# ---------------------------------------------------------------------------------------------
# analysis


def _blocks(sch: Schedule) -> list:
    root = sch.get_root()
    return sch.get_child_blocks(sch.get_block(root.name)) if root is not None else []


# ---------------------------------------------------------------------------------------------
# strategies


def _inline(sch: Schedule) -> None:
    """Inline spatial producers into consumers, then elementwise epilogues into producers.

    A padding (a producer with a conditional) read through a window by a GEMM-like block (a
    convolution) is kept here: the GEMM schedule stages a tile of the padded tensor (a
    constant-size box) in shared memory, and ``_inline_paddings`` then inlines the padding
    into that fetch."""
    keep = _paddings_of_convolutions(sch)
    inline_spatial_producers(sch, lambda node: node.name in keep or keeps_stage(node))
    if len(_blocks(sch)) <= 1:
        return
    changed = True
    while changed:
        changed = False
        for b in _blocks(sch)[1:]:
            node = node_of(sch, b)
            producers = sch.get_producers(b)
            if is_spatial(node) and producers and \
                    all(is_spatial(node_of(sch, p)) for p in producers):
                try:
                    sch.reverse_compute_inline(b)
                    changed = True
                    break
                except ScheduleError:
                    pass


def _inline_paddings(sch: Schedule, names: set) -> None:
    """Inline each convolution's padding into what now reads it — the GEMM's shared-memory
    fetch of the window tile (or the convolution itself where its input is not staged): the
    tile is loaded from the unpadded input with bounds checks (zeros outside), so the padding
    costs no kernel of its own and no pass over the activation. A padding that cannot be
    inlined stays its own kernel."""
    for name in names:
        try:
            sch.compute_inline(sch.get_block(name))
        except ScheduleError as err:
            if os.environ.get("TILECRAFT_DEBUG_SCHEDULES"):
                warnings.warn(f"padding {name} stays a kernel of its own: {err}")


def _paddings_of_convolutions(sch: Schedule) -> set:
    """Names of the spatial blocks with a conditional (``if_then_else``: a padding) whose
    output a GEMM-like block reads at computed indices (a sliding window)."""
    blocks = _blocks(sch)
    keep = set()
    for b in blocks:
        node = node_of(sch, b)
        if not (is_reduction(node) and is_gemm_like(node) or is_depthwise(node)):
            continue
        for i in reduce_inputs(node):
            if compact_read(node, i):
                continue
            buf = node.reads[i].buffer
            for p in blocks:
                pn = node_of(sch, p)
                if not is_spatial(pn) or not any(w.buffer is buf for w in pn.writes):
                    continue
                found = []
                post_order_visit(pn.body, lambda n: found.append(n) if isinstance(n, TCall)
                                 and n.op == "if_then_else" else None)
                if found:
                    keep.add(pn.name)
    return keep


def _schedule_best(sch: Schedule, target: Target, shared: str = "all",
                   small: bool = False, nominal_batch: int | None = None,
                   nominal_rows: int | None = None, gemv_rows: bool = False,
                   gemm_config: dict | None = None, split_k: bool = True) -> None:
    """Rules 1-4. ``shared``: which GEMM inputs are staged in shared memory (``"all"``,
    ``"compact"``: those read at plain indices, e.g. a convolution's weights but not its
    sliding-window input, ``"none"``); ``small``: a quarter-size GEMM block tile;
    ``nominal_batch``: what a symbolic batch counts as when the GEMM tile is sized (None:
    ``GEMM_NOMINAL_BATCH``); ``gemv_rows``: a dense layer of symbolic rows as the GEMV (the
    few-rows variant); static rows up to ``GEMV_MAX_ROWS`` always are (full-size strategy);
    ``gemm_config``: tile decisions for ``schedule_gemm`` (its keyword arguments; None:
    ``gemm.default_config``); ``split_k``: a GEMM-like block split-K where its rule says so
    (``relax.backend.gpu.split_k``, under the same sizing)."""
    paddings = _paddings_of_convolutions(sch)
    _inline(sch)
    blocks = _blocks(sch)
    reductions = [b for b in blocks if is_reduction(node_of(sch, b))]
    if len(reductions) == 1 and shared == "all" and not small and gemv.GEMV_MAX_ROWS and \
            gemv.gemv_layout(sch, reductions[0], max_rows=gemv.GEMV_MAX_ROWS) is not None and \
            (gemv_rows or gemv.gemv_layout(sch, reductions[0]).rows is not None):
        # a dense layer of a few rows: the GEMV (a GEMM tile of one row idles the GPU)
        done = gemv.schedule_gemv(sch, reductions[0], target)
        _schedule_the_rest(sch, done, paddings)
        return
    gemms = [b for b in reductions if is_gemm_like(node_of(sch, b)) and _big_output(sch, b)]
    if gemms:
        done = set()
        for g in gemms:
            parts = split_factor(sch, g, target, small, nominal_batch, nominal_rows,
                                 **(gemm_config or {})) if split_k else 1
            if parts > 1:
                done |= schedule_split_k(sch, g, target, parts, shared, small, nominal_batch,
                                         **(gemm_config or {}))
                continue
            done |= schedule_gemm(sch, g, target, shared, small, nominal_batch, nominal_rows,
                                  **(gemm_config or {}))
        _schedule_the_rest(sch, done, paddings)
        return
    depthwise = [b for b in reductions if is_depthwise(node_of(sch, b))]
    if depthwise and shared == "all" and not small:
        # (the fallback strategies run the thread-per-output rule instead)
        done = set()
        for d in depthwise:
            done |= schedule_depthwise(sch, d)
        _schedule_the_rest(sch, done, paddings)
        return
    if reductions and _schedule_rows(sch, reductions):
        return
    for b in _blocks(sch):
        _schedule_block(sch, b)


def _schedule_the_rest(sch: Schedule, done: set, paddings: set) -> None:
    """After a kernel family scheduled its blocks (``done``, by name): the convolutions'
    paddings inlined into their fetch, every other block not yet bound by the simple rules."""
    _inline_paddings(sch, paddings)
    for b in _blocks(sch):
        if node_of(sch, b).name not in done and not _bound(sch, b):
            _schedule_block(sch, b)


def _schedule_simple(sch: Schedule, target: Target, inline: bool = True) -> None:
    """One thread per output element; reductions serial (padding inlined first)."""
    if inline:
        _inline(sch)
    for b in _blocks(sch):
        _thread_per_output(sch, b, 64)


def _strategy(fn, label: str, **kw):
    def run(sch: Schedule, target: Target, **more) -> None:
        fn(sch, target, **kw, **more)
    run.label = label
    run.sizes_gemm = fn is _schedule_best     # takes nominal_batch (the GEMM tile's sizing)
    run.options = dict(kw)                    # (shared, small: the GEMM tile decisions)
    return run


def _name_of(strategy) -> str:
    return getattr(strategy, "label", getattr(strategy, "__name__", "strategy"))


# Tried in order until one schedules and lowers within the target's limits: a convolution's
# window tile may not fit shared memory (WebGPU: 16 KiB), a small one or its weights alone do.
_STRATEGIES = (
    _strategy(_schedule_best, "best"),
    _strategy(_schedule_best, "best (small GEMM tile)", small=True),
    _strategy(_schedule_best, "best (GEMM: compact inputs in shared memory)", shared="compact"),
    _strategy(_schedule_best, "best (GEMM: compact inputs, small tile)", shared="compact",
              small=True),
    _strategy(_schedule_best, "best (GEMM: registers only)", shared="none"),
    _strategy(_schedule_simple, "thread per output"),
    _strategy(_schedule_simple, "thread per output (nothing inlined)", inline=False),
)


def _bound(sch: Schedule, block) -> bool:
    return any(node_of(sch, lp).kind == "thread_binding" for lp in sch.get_loops(block))


def _schedule_block(sch: Schedule, block) -> None:
    node = node_of(sch, block)
    if is_spatial(node):
        _injective(sch, block)
        return
    spatial, reduce = spatial_loops(sch, block)
    work = 1
    for lp in reduce:
        work *= loop_extent(node_of(sch, lp))
    # threads share a reduction when it is long and there are few outputs to spread instead
    if work >= 128 and (not spatial or _output_elements(sch, block) <= 4096):
        _cross_thread(sch, block)
    else:
        _thread_per_output(sch, block, 64)


def _output_elements(sch: Schedule, block) -> int:
    n = 1
    for lp in spatial_loops(sch, block)[0]:
        n *= loop_extent(node_of(sch, lp))
    return n


def _big_output(sch: Schedule, block) -> bool:
    return _output_elements(sch, block) > 4096


def _injective(sch: Schedule, block) -> None:
    loops = sch.get_loops(block)
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    total = loop_extent(node_of(sch, fused))
    lanes = VECTOR if _vector_ok(sch, block, loops, total) else 1
    if lanes > 1:
        outer, vec = sch.split(fused, [None, lanes])
        bx, tx = sch.split(outer, [None, THREADS])
        sch.vectorize(vec)
    else:
        bx, tx = sch.split(fused, [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _vector_ok(sch: Schedule, block, loops, total: int) -> bool:
    """Four elements per thread when the fused extent is a constant multiple of 4 (so the
    vector loop has no tail) and large enough to fill the device."""
    if total == SYMBOLIC or total % VECTOR or total < VECTOR * THREADS * 4:
        return False
    node = node_of(sch, block)
    return all(dt.bits(w.buffer.dtype) == 32 for w in node.writes)


def _thread_per_output(sch: Schedule, block, threads: int) -> None:
    spatial, reduce = spatial_loops(sch, block)
    if not spatial:
        _cross_thread(sch, block)
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if reduce and not sch.get_consumers(block):
        # the thread's accumulator in a register, one store at the end (not one per step)
        local = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(local, tx)


def _threads_for(extent: int) -> int:
    t = 32
    while t < THREADS and t < extent:
        t *= 2
    return t


def _cross_thread(sch: Schedule, block, bx=None) -> None:
    """Spatial loops -> blockIdx.x (unless already under ``bx``), the reduction shared by T
    threads: fused, split [serial, T], the thread loop outside."""
    spatial, reduce = spatial_loops(sch, block)
    if bx is None and spatial:
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        sch.bind(fused, "blockIdx.x")
    elif bx is not None:
        for lp in spatial:
            if node_of(sch, lp).kind != "thread_binding" and loop_extent(node_of(sch, lp)) != 1:
                raise ScheduleError("default GPU schedule", "a spatial loop is left inside the "
                                    "row", None)
    if not reduce:
        raise ScheduleError("default GPU schedule", "no reduce loop", None)
    r = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
    t = _threads_for(loop_extent(node_of(sch, r)))
    ro, ri = sch.split(r, [None, t])
    sch.reorder(ri, ro)
    sch.bind(ri, "threadIdx.x")


def _schedule_rows(sch: Schedule, reductions) -> bool:
    """Rule 3: every reduction at the output's row loop, one work-group per row."""
    blocks = _blocks(sch)
    out = blocks[-1]
    onode = node_of(sch, out)
    if not is_spatial(onode):
        if len(blocks) == 1:
            _schedule_block(sch, out)   # a long row shared by threads, a window per thread
            return True
        return False
    # rows: the reductions' spatial dims that are not 1 (keepdims leaves unit dims)
    rank = {len([iv for iv in node_of(sch, r).iter_vars if iv.kind == "spatial" and
                 not (isinstance(iv.dom.extent, IntImm) and iv.dom.extent.value == 1)])
            for r in reductions}
    if len(rank) != 1:
        return False
    rows = rank.pop()
    loops = sch.get_loops(out)
    if rows == 0 or rows >= len(loops):
        return False
    cols = loops[rows:]
    if all(loop_extent(node_of(sch, lp)) == 1 for lp in cols):
        return False        # nothing to spread over threads: one reduction per row
    row = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
    col = sch.fuse(*cols) if len(cols) > 1 else cols[0]
    t = _threads_for(loop_extent(node_of(sch, col)))
    co, ci = sch.split(col, [None, t])
    sch.bind(row, "blockIdx.x")
    sch.bind(ci, "threadIdx.x")
    for b in reversed(_blocks(sch)[:-1]):
        node = node_of(sch, b)
        # the scope first: a global buffer would be shared by all work-groups, so compute_at
        # would compute every row in each; in a register each thread has the row's result (a
        # cross-thread reduction leaves it in every thread), in shared memory the work-group
        sch.set_scope(b, 0, "local" if is_reduction(node) else "shared")
        sch.compute_at(b, row)
        if is_reduction(node):
            _cross_thread(sch, b, bx=row)
        else:
            inner = [lp for lp in sch.get_loops(b)
                     if node_of(sch, lp).kind != "thread_binding"]
            if inner:
                f = sch.fuse(*inner) if len(inner) > 1 else inner[0]
                _, fi = sch.split(f, [None, t])
                sch.bind(fi, "threadIdx.x")
    return True


__all__ = ["apply", "is_scheduled", "GPU_KINDS", "default_schedule", "default_strategy",
           "gemm_defaults", "gemm_default_schedule", "schedule_gemm_kernel"]
