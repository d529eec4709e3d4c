"""Hand schedules for WebGPU within the spec's default limits (256 invocations, 16 KiB of
workgroup storage): a shared-memory GEMM with register blocking, and one-kernel row softmax and
layer norm with cross-thread (tree) reductions. ``benchmarks/gpu_webgpu.py`` times them beside
the default schedules."""
from __future__ import annotations

from tilecraft.tensorir import Schedule, te


def gemm(M, N, K, bm: int = 128, bn: int = 128, bk: int = 8, tm: int = 8, tn: int = 8,
         dtype: str = "float32"):
    """C = A @ B: a bm x bn tile per workgroup of (bm/tm) x (bn/tn) threads, each thread a
    tm x tn block of accumulators; A and B tiles of bk in shared memory (2 x 4 KiB). B's tile
    is stored permuted so that the threads of a warp read consecutive words."""
    A = te.placeholder((M, K), dtype, "A")
    B = te.placeholder((K, N), dtype, "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    sch = Schedule(te.create_prim_func([A, B, C]))
    c = sch.get_block("C")
    i, j, kk = sch.get_loops(c)
    ty, tx = bm // tm, bn // tn
    bi, ti, ii = sch.split(i, [None, ty, tm])
    bj, tj, jj = sch.split(j, [None, tx, tn])
    ko, ki = sch.split(kk, [None, bk])
    sch.reorder(bi, bj, ti, tj, ko, ki, ii, jj)
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    tiles = []
    for idx in (0, 1):
        sh = sch.cache_read(c, idx, "shared")
        sch.compute_at(sh, ko)
        fused = sch.fuse(*sch.get_loops(sh)[-2:])
        f0, fy, fx = sch.split(fused, [None, ty, tx])
        sch.bind(fy, "threadIdx.y")
        sch.bind(fx, "threadIdx.x")
        sch.unroll(f0)
        tiles.append(sh)
    sch.transform_layout(tiles[1], 0, lambda r, col: (r, col % tn, col // tn), "write")
    loc = sch.cache_write(c, 0, "local")
    sch.reverse_compute_at(loc, tj)
    sch.decompose_reduction(c, ko)
    sch.unroll(ki)
    sch.unroll(ii)
    sch.unroll(jj)
    return sch.mod["main"]


def _row_kernel(sch: Schedule, out: str, reductions, threads: int):
    """One workgroup per row of ``out``; each reduction computed in shared memory under it."""
    o = sch.get_block(out)
    i, j = sch.get_loops(o)
    _, ji = sch.split(j, [None, threads])
    sch.bind(i, "blockIdx.x")
    sch.bind(ji, "threadIdx.x")
    for name in reductions:
        b = sch.get_block(name)
        sch.set_scope(b, 0, "shared")   # first: compute_at relaxes a global buffer over blockIdx
        sch.compute_at(b, i)
        _, ki = sch.split(sch.get_loops(b)[-1], [None, threads])
        sch.bind(ki, "threadIdx.x")     # a cross-thread reduction
    return sch


def softmax(n, m, threads: int = 256):
    """Row softmax in one kernel: max and sum as cross-thread reductions, exp recomputed."""
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis((0, m), "k")
    M = te.compute((n,), lambda i: te.max(A[i, k], axis=k), "M")
    E = te.compute((n, m), lambda i, j: te.exp(A[i, j] - M[i]), "E")
    k2 = te.reduce_axis((0, m), "k2")
    S = te.compute((n,), lambda i: te.sum(E[i, k2], axis=k2), "S")
    O = te.compute((n, m), lambda i, j: E[i, j] / S[i], "O")
    sch = Schedule(te.create_prim_func([A, O]))
    sch.compute_inline(sch.get_block("E"))
    return _row_kernel(sch, "O", ("S", "M"), threads).mod["main"]


def layer_norm(n, m, threads: int = 256, eps: float = 1e-5):
    """Row layer norm in one kernel: sum and sum of squares as cross-thread reductions."""
    A = te.placeholder((n, m), "float32", "A")
    G = te.placeholder((m,), "float32", "G")
    Bt = te.placeholder((m,), "float32", "Bt")
    k = te.reduce_axis((0, m), "k")
    S1 = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), "S1")
    k2 = te.reduce_axis((0, m), "k2")
    S2 = te.compute((n,), lambda i: te.sum(A[i, k2] * A[i, k2], axis=k2), "S2")
    inv = 1.0 / m
    O = te.compute((n, m), lambda i, j: (A[i, j] - S1[i] * inv) * te.rsqrt(
        S2[i] * inv - S1[i] * inv * (S1[i] * inv) + eps) * G[j] + Bt[j], "O")
    sch = Schedule(te.create_prim_func([A, G, Bt, O]))
    return _row_kernel(sch, "O", ("S2", "S1"), threads).mod["main"]


def copy(n, threads: int = 256, per_thread: int = 4):
    """B = A, ``per_thread`` elements per thread (strided by the workgroup for coalescing)."""
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i], "B")
    sch = Schedule(te.create_prim_func([A, B]))
    i, = sch.get_loops(sch.get_block("B"))
    bx, v, tx = sch.split(i, [None, per_thread, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.unroll(v)
    return sch.mod["main"]
