"""Helpers for the WebGPU tests: the adapter check and small hand schedules."""
from __future__ import annotations

from capabilities import webgpu_device  # noqa: F401  (targets.webgpu(0), or requires fails)
from tilecraft.tensorir import Schedule, te


def bind_1d(func, block: str, threads: int = 64):
    """Fuse the loops of ``block`` and bind them to blockIdx.x / threadIdx.x."""
    sch = Schedule(func)
    b = sch.get_block(block)
    loops = sch.get_loops(b)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return sch


def bind_all(func, threads: int = 64):
    """Bind every block of ``func`` (each its own kernel) with ``bind_1d``."""
    sch = Schedule(func)
    for blk in sch.get_child_blocks(sch.get_block("root")):
        loops = sch.get_loops(blk)
        spatial = loops
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        bx, tx = sch.split(fused, [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return sch


def gemm_shared(M, N, K, tile: int = 32, tk: int = 8, reg: int = 4, dtype="float32"):
    """C = A @ B with a tile x tile block, shared A/B tiles of tk columns/rows, reg x reg
    accumulators per thread (threads: (tile/reg)^2)."""
    A = te.placeholder((M, K), dtype, "A")
    B = te.placeholder((K, N), dtype, "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    sch = Schedule(te.create_prim_func([A, B, C]))
    c = sch.get_block("C")
    i, j, kk = sch.get_loops(c)
    t = tile // reg
    bi, ti, ii = sch.split(i, [None, t, reg])
    bj, tj, jj = sch.split(j, [None, t, reg])
    ko, ki = sch.split(kk, [None, tk])
    sch.reorder(bi, bj, ti, tj, ko, ki, ii, jj)
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    for idx in (0, 1):
        sh = sch.cache_read(c, idx, "shared")
        sch.compute_at(sh, ko)
        fused = sch.fuse(*sch.get_loops(sh)[-2:])
        _, fy, fx = sch.split(fused, [None, t, t])
        sch.bind(fy, "threadIdx.y")
        sch.bind(fx, "threadIdx.x")
    loc = sch.cache_write(c, 0, "local")
    sch.reverse_compute_at(loc, tj)
    sch.unroll(ii)
    sch.unroll(jj)
    return sch.mod["main"]
