"""``VerifyGPUCode``: reject GPU schedules that exceed the target's limits.

Per kernel (a top-level loop nest bound to ``blockIdx``): the threads per block (the product
of the ``threadIdx`` extents) against ``max_threads_per_block`` and, for WebGPU, the per-axis
workgroup sizes; the blocks per grid dimension against WebGPU's 65535 (at the representative
shape values); the shared memory the kernel's ``shared`` buffers need (what each copy block
writes per iteration of the loop it is computed at) against ``max_shared_memory_per_block``;
vector lengths against what the language has (4 lanes in WGSL, 16 in OpenCL C). Every block must
be inside a kernel.
"""
from __future__ import annotations

from tilecraft.targets.target import WEBGPU_SPEC_LIMITS
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.schedule import Schedule, tree
from tilecraft.tensorir.stmt import BlockRealize, For

from ..schedule_rule import analysis as A
from .base import Postproc

MAX_VECTOR = {"webgpu": 4, "opencl": 16}


class VerifyGPUCode(Postproc):
    """Check a GPU schedule against the target's limits (TVM's ``VerifyGPUCode``).

    ``reason`` holds why the last schedule was rejected.

    Examples
    --------
    >>> VerifyGPUCode().apply(sch)                      # doctest: +SKIP
    True
    """

    reason: str | None = None

    def apply(self, sch: Schedule) -> bool:
        self.reason = self.check(sch)
        return self.reason is None

    def check(self, sch: Schedule) -> str | None:
        """Why the schedule breaks a limit, or None."""
        target = self.context.target
        hints = self.shape_hints
        func = sch.func
        for br in A.all_blocks(func):
            info = A.find_block_info(func, br.block.name)
            if A.is_subroot(info) and not A.is_thread_bound(info):
                return f"block {br.block.name!r} is not inside a GPU kernel"
        body = func.body.block.body if isinstance(func.body, BlockRealize) else func.body
        for kernel in _kernels(body):
            threads: dict[str, int] = {}
            for node, _ in tree.walk(kernel):
                if not isinstance(node, For):
                    continue
                ext = A.extent_value(node, hints)
                if node.kind == "thread_binding":
                    tag = node.thread_tag
                    if tag.startswith("threadIdx"):
                        if A.const_extent(node) is None:
                            return f"{tag} loop {node.loop_var.name} has a symbolic extent"
                        threads[tag] = max(threads.get(tag, 1), A.const_extent(node))
                    elif tag.startswith("blockIdx") and target.kind == "webgpu" and \
                            ext is not None and ext > WEBGPU_SPEC_LIMITS[
                                "max_compute_workgroups_per_dimension"]:
                        return f"{ext} workgroups along {tag} (WebGPU allows 65535)"
                elif node.kind == "vectorized":
                    lanes = A.const_extent(node)
                    limit = MAX_VECTOR.get(target.kind, 16)
                    if lanes is None or lanes > limit:
                        return f"vectorized loop {node.loop_var.name} of {lanes} lanes " \
                               f"(at most {limit} on {target.kind})"
            total = 1
            for v in threads.values():
                total *= v
            if total > target.max_threads_per_block:
                return f"{total} threads per block > {target.max_threads_per_block}"
            if target.kind == "webgpu":
                for axis, key in (("x", "max_compute_workgroup_size_x"),
                                  ("y", "max_compute_workgroup_size_y"),
                                  ("z", "max_compute_workgroup_size_z")):
                    if threads.get("threadIdx." + axis, 1) > WEBGPU_SPEC_LIMITS[key]:
                        return f"threadIdx.{axis} extent {threads['threadIdx.' + axis]} > " \
                               f"{WEBGPU_SPEC_LIMITS[key]}"
            shared = _shared_bytes(kernel, hints)
            if shared is None:
                return "a shared-memory buffer of symbolic size"
            if shared > target.max_shared_memory_per_block:
                return f"{shared} bytes of shared memory > {target.max_shared_memory_per_block}"
        return None


def _kernels(body) -> list[For]:
    """The outermost blockIdx-bound loop of each top-level nest."""
    out = []
    for node, anc in tree.walk(body):
        if isinstance(node, For) and node.kind == "thread_binding" and \
                node.thread_tag.startswith("blockIdx") and not any(
                    isinstance(a, For) and a.kind == "thread_binding" and
                    a.thread_tag.startswith("blockIdx") for a in anc):
            out.append(node)
    return out


def _shared_bytes(kernel: For, hints: dict) -> int | None:
    """Bytes of the shared buffers written in the kernel: for each writing block, the elements
    it writes per iteration of the loop it is computed at (the product of the extents of its
    own loops that feed spatial iter vars)."""
    sizes: dict[int, int] = {}
    for node, anc in tree.walk(kernel):
        if not isinstance(node, BlockRealize):
            continue
        for w in node.block.writes:
            if w.buffer.scope != "shared":
                continue
            loops = [a for a in anc if isinstance(a, For)]
            own = []
            for loop in reversed(loops):
                inner = tree.child_block_realizes(loop)
                if len(inner) != 1 or inner[0] is not node:
                    break
                own.append(loop)
            elems = 1
            for loop in own:
                used = [iv for iv, v in zip(node.block.iter_vars, node.iter_values)
                        if A.uses_var(v, loop.loop_var)]
                if used and all(iv.kind == "spatial" for iv in used):
                    e = A.extent_value(loop, hints)
                    if e is None:
                        return None
                    elems *= e
            nbytes = elems * dt.itemsize(w.buffer.dtype)
            sizes[id(w.buffer)] = max(sizes.get(id(w.buffer), 0), nbytes)
    return sum(sizes.values())
