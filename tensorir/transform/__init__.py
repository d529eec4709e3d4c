"""Lowering: from TensorIR (blocks, multi-dimensional buffers) to what code generators consume.

Passes (each takes a ``PrimFunc`` or an ``IRModule`` and returns a new one of the same kind;
the input is never modified):

* ``VerifyMemoryAccess`` — prove every access in bounds; ``OutOfBoundsError`` for one that
  provably is not; a run-time ``AssertStmt`` for one it cannot decide.
* ``LowerInitBlock`` — a reduction block's ``init`` becomes a guarded statement in its body.
* ``ConvertBlocksToLoops`` — remove blocks (init lowered and, where possible, hoisted out of the
  reduce loops; predicates to ``IfThenElse``; ``alloc_buffers`` to ``Allocate``).
* ``FlattenBuffers`` — every buffer one-dimensional, indices linearized.
* ``Simplify`` — arithmetic simplification with loop ranges and conditions known.
* ``LowerCrossThreadReduction`` — reductions over threadIdx-bound loops: partial results per
  thread, then a tree over the threads in shared memory.
* ``CompactBufferAllocation`` — shared / local intermediates shrunk to the tile they touch.
* ``CompactLocalAllocations`` — on flat code: each local buffer allocated in the innermost loop
  holding its accesses, at the size one iteration touches (register tiles).
* ``lower(func_or_mod, target=None)`` — the default pipeline: ``VerifyMemoryAccess ->
  ConvertBlocksToLoops -> CompactBufferAllocation -> LoopPartition -> Simplify ->
  FlattenBuffers -> CompactLocalAllocations -> Simplify`` (GPU targets: ``GPU_PASSES``).
* ``split_host_device`` / ``lower_device(func, target)`` — device lowering: host program and
  GPU kernels (``HostDeviceSplit``), checked against the target's limits; see
  ``tensorir.transform.device`` and ``docs/lowering.md``.

The lowered form
----------------
``lower`` returns functions in exactly this form, which the LLVM, OpenCL and WGSL code
generators (and ``tensorir.interpret``) consume:

* **No ``Block`` / ``BlockRealize``.** Block iter vars are replaced by their values.
* **Statements**: ``For``, ``SeqStmt``, ``BufferStore``, ``IfThenElse``, ``LetStmt``,
  ``AssertStmt`` (condition, message, body: fail with the message when the condition is false),
  ``Evaluate`` and ``Allocate``. ``Evaluate(0)`` is the empty statement.
* **Loops** keep their kind (``serial`` / ``parallel`` / ``vectorized`` / ``unrolled`` /
  ``thread_binding`` with its ``thread_tag``) and annotations. Loops of extent 1 are gone (their
  variable replaced by the min), except thread-bound ones. A ``vectorized`` loop may have a
  non-constant extent: code generators run such a loop serially.
* **Buffers are 1-D**: every ``BufferLoad`` / ``BufferStore`` has exactly one int64 index,
  row-major over the original shape (or the buffer's explicit strides). A 0-d buffer becomes
  shape ``(1,)`` indexed at 0.
* **Intermediates** (the root block's and any block's ``alloc_buffers``) are ``Allocate(buffer,
  body)`` with a flat buffer of the buffer's scope (``global`` / ``shared`` / ``local``), placed
  where the allocating block was (the root block's at the top of the body).
* **Parameters** are unchanged: one ``handle`` Var per buffer argument and the scalar params,
  in order. ``buffer_map`` maps each handle to its *flat* buffer (shape ``(product,)``, the
  original name, dtype and scope).
* **Attributes**: ``"global_symbol"`` is kept; ``"arg_buffers"`` is a tuple of the *original*
  multi-dimensional parameter buffers in parameter order (to check callers' shapes);
  ``"shape_vars"`` is a tuple of the symbolic dims — the free Vars of the ``arg_buffers``'
  shapes and strides in first-appearance order, scalar params excluded. They appear free in the
  body; the callee binds each from the first argument dimension that is exactly that Var and
  checks every other dimension against its expression.
* **Expressions** are those of ``tensorir.expr``; index arithmetic is int64. ``if_then_else``
  evaluates only the branch taken; a ``Select`` whose branch loads memory only under its
  condition has been turned into ``if_then_else`` by ``VerifyMemoryAccess``, so every
  remaining ``Select`` may evaluate both sides.

Examples
--------
>>> from tilecraft.tensorir import te, transform
>>> A = te.placeholder((4, 8), "float32", "A")
>>> k = te.reduce_axis((0, 8), "k")
>>> B = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), "B")
>>> f = transform.lower(te.create_prim_func([A, B]))
>>> # for i in range(4): { B[i] = 0.0; for k in range(8): B[i] = B[i] + A[i * 8 + k] }
"""
from .compact import CompactBufferAllocation
from .compact_local import CompactLocalAllocations
from .convert_blocks import ConvertBlocksToLoops, LowerInitBlock
from .cross_thread_reduction import LowerCrossThreadReduction
from .device import (DeviceKernel, DeviceLimitError, HostDeviceSplit, LaunchKernel,
                     split_host_device)
from .flatten import FlattenBuffers, flat_buffer, linear_index
from .loop_partition import LoopPartition
from .pipeline import DEFAULT_PASSES, GPU_PASSES, lower, lower_device
from .simplify import Simplify
from .software_prefetch import ANN_SOFTWARE_PREFETCH, InjectSoftwarePrefetch
from .verify import OutOfBoundsError, VerifyMemoryAccess

__all__ = ["ANN_SOFTWARE_PREFETCH", "CompactBufferAllocation", "CompactLocalAllocations", "ConvertBlocksToLoops", "DEFAULT_PASSES", "DeviceKernel",
           "DeviceLimitError", "FlattenBuffers", "GPU_PASSES", "HostDeviceSplit", "LaunchKernel",
           "InjectSoftwarePrefetch", "LoopPartition", "LowerCrossThreadReduction", "LowerInitBlock", "lower_device", "split_host_device",
           "OutOfBoundsError", "Simplify", "VerifyMemoryAccess", "flat_buffer", "linear_index",
           "lower"]
