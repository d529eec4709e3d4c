"""``lower``: the default lowering pipeline from TensorIR to what the code generators consume."""
from __future__ import annotations

from ..expr import TIRError
from ..function import IRModule, PrimFunc
from .compact import CompactBufferAllocation
from .compact_local import CompactLocalAllocations
from .convert_blocks import ConvertBlocksToLoops
from .cross_thread_reduction import LowerCrossThreadReduction
from .device import GPU_KINDS, HostDeviceSplit, split_host_device
from .flatten import FlattenBuffers
from .loop_partition import LoopPartition
from .register_prefetch import InjectRegisterPrefetch
from .software_prefetch import InjectSoftwarePrefetch
from .simplify import Simplify
from .verify import VerifyMemoryAccess

# The passes of ``lower``, in order (names for printing and for tests).
# CompactBufferAllocation before LoopPartition: a local tile (register accumulators) gets its
# constant shape while each of its accesses still sits in one loop nest; the partition then
# copies the tile's allocation into the main part and the tail. CompactLocalAllocations, on the
# flat code, places each local buffer in its loop and shrinks tiles clipped by their buffer.
# InjectSoftwarePrefetch: loops annotated ``software_prefetch`` issue prefetches of a region
# ahead (tensorir.transform.software_prefetch), on the flat form.
DEFAULT_PASSES = (VerifyMemoryAccess, ConvertBlocksToLoops, CompactBufferAllocation, LoopPartition,
                  Simplify, FlattenBuffers, CompactLocalAllocations, InjectSoftwarePrefetch,
                  Simplify)
# For GPU targets (``opencl``, ``webgpu``): reductions over threadIdx-bound loops lowered to
# a tree over the threads, shared / local tiles compacted to constant sizes,
# no loop partitioning (a partitioned thread-bound nest would become two kernels).
# InjectRegisterPrefetch: loops annotated ``register_prefetch`` load their next shared tiles
# into registers a step ahead (tensorir.transform.register_prefetch).
GPU_PASSES = (VerifyMemoryAccess, LowerCrossThreadReduction, ConvertBlocksToLoops, Simplify,
              CompactBufferAllocation, FlattenBuffers, InjectRegisterPrefetch, Simplify)


def target_kind(target) -> str | None:
    """The kind of a target given as a ``targets.Target``, a dict or a string (tensorir does
    not import ``targets``)."""
    if target is None:
        return None
    if isinstance(target, str):
        return target.split()[0] if target.strip() else None
    if isinstance(target, dict):
        return target.get("kind")
    return getattr(target, "kind", None)


def _lower_func(func: PrimFunc, target=None) -> PrimFunc:
    passes = GPU_PASSES if target_kind(target) in GPU_KINDS else DEFAULT_PASSES
    for p in passes:
        func = p(func)
    return func


def lower(func_or_mod, target=None):
    """Lower a PrimFunc (or every PrimFunc of an IRModule) to the form code generators consume.

    Runs ``VerifyMemoryAccess -> ConvertBlocksToLoops -> CompactBufferAllocation ->
    LoopPartition -> Simplify -> FlattenBuffers -> CompactLocalAllocations -> Simplify``; see the
    ``tensorir.transform`` module docstring for the exact output form. For a GPU target (kind ``opencl`` / ``webgpu``) the pipeline is
    ``GPU_PASSES``: ``CompactBufferAllocation`` shrinks shared / local tiles and loops are not
    partitioned; ``lower_device`` then splits host and kernels.

    Parameters
    ----------
    func_or_mod : PrimFunc or IRModule
        Scheduled or unscheduled TensorIR. Functions of a module that are not PrimFuncs (relax
        functions) are kept as they are.
    target : optional
        The target the code is lowered for.

    Returns
    -------
    PrimFunc or IRModule
        The same kind of object as the input.

    Raises
    ------
    OutOfBoundsError
        When an access provably goes out of bounds.

    Examples
    --------
    >>> from tilecraft.tensorir import te, transform
    >>> n = te.var("n")
    >>> A = te.placeholder((n, 4), "float32", "A")
    >>> B = te.compute((n, 4), lambda i, j: A[i, j] * 2.0, "B")
    >>> f = transform.lower(te.create_prim_func([A, B]))
    >>> f.buffers[0].shape          # flat: (n * 4,)            # doctest: +SKIP
    >>> f.attr_dict["shape_vars"] == (n,)
    True
    """
    if isinstance(func_or_mod, IRModule):
        return IRModule({name: _lower_func(f, target) if isinstance(f, PrimFunc) else f
                         for name, f in func_or_mod.functions.items()})
    if isinstance(func_or_mod, PrimFunc):
        return _lower_func(func_or_mod, target)
    raise TIRError(f"lower: expected a PrimFunc or an IRModule, got "
                   f"{type(func_or_mod).__name__}", func_or_mod)


def lower_device(func: PrimFunc, target=None) -> HostDeviceSplit:
    """Lower ``func`` for a GPU and split it into host program and kernels.

    ``lower(func, target)`` (skipped when ``func`` is already lowered), then
    ``split_host_device(func, target)``, which checks the kernels against ``target``'s limits.
    See ``docs/lowering.md``, "Device lowering".

    Examples
    --------
    >>> split = lower_device(scheduled_func, targets.Target("opencl"))     # doctest: +SKIP
    >>> [k.name for k in split.kernels]                                  # doctest: +SKIP
    ['main_kernel0']
    """
    if not isinstance(func, PrimFunc):
        raise TIRError(f"lower_device takes a PrimFunc, got {type(func).__name__}", func)
    if "arg_buffers" not in func.attr_dict:
        kind = target_kind(target)
        func = _lower_func(func, target if kind in GPU_KINDS else "opencl")
    return split_host_device(func, target)
