"""Device lowering: host/device split, launch geometry, limits, shared memory, barriers, int32.

Correctness of the generated kernels on a device is tested through the OpenCL back end
(tests/targets/test_opencl_*.py); here the structure of the split is checked.
"""
import pytest

from tilecraft.tensorir import Schedule, te, transform
from tilecraft.tensorir.expr import IntImm, Var
from tilecraft.tensorir.functor import IRMutator, IRVisitor
from tilecraft.tensorir.stmt import Allocate, BufferStore, For, seq
from tilecraft.tensorir.transform import DeviceLimitError, LaunchKernel, lower_device
from tilecraft.tensorir.transform.device import barrier, is_barrier

LIMITS = {"max_threads_per_block": 256, "max_shared_memory_per_block": 16384}


def _elementwise(n=1024):
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 2.0, "B")
    return te.create_prim_func([A, B])


def _bound(func, factor=128):
    sch = Schedule(func)
    blk = sch.get_block("B")
    i, = sch.get_loops(blk)
    bx, tx = sch.split(i, [None, factor])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return sch.mod["main"]


def _stmts(node, cls):
    out = []

    class V(IRVisitor):
        def generic_visit(self, n):
            if isinstance(n, cls):
                out.append(n)
            super().generic_visit(n)

    V().visit(node)
    return out


def _launches(split):
    return _stmts(split.host.body, LaunchKernel)


def test_elementwise_geometry_and_int32():
    split = lower_device(_bound(_elementwise()), LIMITS)
    assert len(split.kernels) == 1
    k = split.kernels[0]
    assert k.name == "main_kernel0"
    assert [g.value for g in k.grid] == [8, 1, 1]
    assert k.block == (128, 1, 1)
    assert set(k.thread_vars) == {"blockIdx.x", "threadIdx.x"}
    assert all(v.dtype == "int32" for v in k.thread_vars.values())
    assert not _stmts(k.func.body, For)           # the thread loops are gone
    store, = _stmts(k.func.body, BufferStore)
    assert store.indices[0].dtype == "int32"
    launch, = _launches(split)
    assert launch.kernel == "main_kernel0"
    assert [b.name for b in launch.buffers] == ["A", "B"]


def test_symbolic_grid_and_scalar_params():
    n = te.var("n")
    split = lower_device(_bound(_elementwise(n), 64), LIMITS)
    k = split.kernels[0]
    grid0 = k.grid[0]
    assert not isinstance(grid0, IntImm) and n in _stmts(grid0, Var) or "n" in str(grid0)
    assert [v.name for v in k.scalar_params] == ["n"]
    assert k.scalar_params[0].dtype == "int32"
    assert k.host_scalars == (n,)


def test_unbound_code_becomes_a_single_thread_kernel():
    split = lower_device(_elementwise(16), LIMITS)
    k, = split.kernels
    assert k.block == (1, 1, 1) and [g.value for g in k.grid] == [1, 1, 1]
    assert len(_stmts(k.func.body, For)) == 1


def test_thread_limit():
    with pytest.raises(DeviceLimitError, match=r"512 threads per block .* limit of 256"):
        lower_device(_bound(_elementwise(), 512), LIMITS)


def test_block_dim_limit():
    with pytest.raises(DeviceLimitError, match=r"threadIdx.x extent 512 exceeds .* 256"):
        lower_device(_bound(_elementwise(), 512), {"max_block_dims": (256, 256, 64)})


def test_grid_limit():
    with pytest.raises(DeviceLimitError, match=r"blockIdx.x extent 1024 exceeds .* 100"):
        lower_device(_bound(_elementwise(1024), 1), {"max_grid_dims": (100, 100, 100)})


def test_symbolic_thread_extent_is_rejected():
    n = te.var("n")
    sch = Schedule(_elementwise(n))
    i, = sch.get_loops(sch.get_block("B"))
    sch.bind(i, "threadIdx.x")
    with pytest.raises(DeviceLimitError, match=r"non-constant extent n"):
        lower_device(sch.mod["main"], LIMITS)


def _tiled_matmul(n):
    A = te.placeholder((n, 64), "float32", "A")
    W = te.placeholder((64, 32), "float32", "W")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((n, 32), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    sch = Schedule(te.create_prim_func([A, W, C]))
    b = sch.get_block("C")
    i, j, kk = sch.get_loops(b)
    io, ii = sch.split(i, [None, 4])
    ko, ki = sch.split(kk, [None, 8])
    sch.reorder(io, j, ko, ii, ki)
    sch.bind(io, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    sh = sch.cache_read(b, 0, "shared")
    sch.compute_at(sh, ko)
    fused = sch.fuse(*sch.get_loops(sh)[-2:])
    _, fi = sch.split(fused, [None, 32])
    sch.bind(fi, "threadIdx.x")          # cooperative fetch: nested in the compute's threadIdx
    loc = sch.cache_write(b, 0, "local")
    sch.reverse_compute_at(loc, j)
    return sch.mod["main"]


def test_shared_tile_compacted_hoisted_and_synchronized():
    split = lower_device(_tiled_matmul(te.var("n")), LIMITS)
    k, = split.kernels
    assert k.block == (32, 1, 1)
    assert [b.name for b in k.shared_buffers] == ["A_shared"]
    assert k.shared_bytes == 4 * 8 * 4           # a 4 x 8 float tile
    assert isinstance(k.func.body, Allocate) and k.func.body.buffer.scope == "shared"
    locals_ = [a.buffer for a in _stmts(k.func.body, Allocate) if a.buffer.scope == "local"]
    assert [tuple(s.value for s in b.shape) for b in locals_] == [(4,)]
    ko = [f for f in _stmts(k.func.body, For) if f.loop_var.name == "k_0"][0]
    # one barrier before the cooperative fetch (loop-carried read -> write) and one after it
    barriers = [s for s in ko.body.seq if is_barrier(s)]
    assert len(barriers) == 2
    assert is_barrier(ko.body.seq[0])


def test_a_barrier_in_the_kernel_counts():
    """A barrier the kernel already has (a cp.async ring's) publishes the accesses before it:
    the lowering adds none right after it."""
    func = _tiled_matmul(te.var("n"))
    with_barrier = func.replace(body=_prepend_barrier_to_k_loop(func.body))
    k, = lower_device(with_barrier, LIMITS).kernels
    ko = [f for f in _stmts(k.func.body, For) if f.loop_var.name == "k_0"][0]
    seq_ = ko.body.seq
    assert is_barrier(seq_[0]) and not is_barrier(seq_[1])
    assert sum(is_barrier(s) for s in seq_) == 2     # ours, and the one after the fetch


def _prepend_barrier_to_k_loop(body):
    class M(IRMutator):
        def visit_For(self, f):
            f = self.visit_default(f)
            if f.loop_var.name == "k_0":
                return f.replace(body=seq(barrier(), f.body))
            return f
    return M().visit(body)


def test_shared_memory_limit():
    with pytest.raises(DeviceLimitError, match=r"128 bytes of shared memory exceed .* 64"):
        lower_device(_tiled_matmul(te.var("n")), {"max_shared_memory_per_block": 64})


def test_run_time_checks_in_kernels_report_through_an_error_buffer():
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n,), "float32", "A")
    idx = te.placeholder((m,), "int64", "idx")
    B = te.compute((m,), lambda i: A[idx[i]], "B")
    sch = Schedule(te.create_prim_func([A, idx, B]))
    i, = sch.get_loops(sch.get_block("B"))
    bx, tx = sch.split(i, [None, 64])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    split = lower_device(sch.mod["main"], LIMITS)
    k, = split.kernels
    assert k.error_messages and "out of bounds" in k.error_messages[0]
    assert k.func.buffers[-1].name == "kernel_error"
    # the data-dependent index keeps its int64 load, cast to an int32 index
    assert any(s.buffer.name == "kernel_error" for s in _stmts(k.func.body, BufferStore))


def test_shared_buffer_used_by_two_kernels_is_rejected():
    A = te.placeholder((64,), "float32", "A")
    B = te.compute((64,), lambda i: A[i] + 1.0, "B")
    C = te.compute((64,), lambda i: B[i] * 2.0, "C")
    sch = Schedule(te.create_prim_func([A, C]))
    for name in ("B", "C"):
        i, = sch.get_loops(sch.get_block(name))
        bx, tx = sch.split(i, [None, 32])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    sch.set_scope(sch.get_block("B"), 0, "shared")
    with pytest.raises(Exception, match=r"used by kernels main_kernel0 and main_kernel1"):
        lower_device(sch.mod["main"], LIMITS)


def test_global_intermediate_is_a_host_allocation_between_two_kernels():
    A = te.placeholder((64,), "float32", "A")
    B = te.compute((64,), lambda i: A[i] + 1.0, "B")
    C = te.compute((64,), lambda i: B[63 - i] * 2.0, "C")
    sch = Schedule(te.create_prim_func([A, C]))
    for name in ("B", "C"):
        i, = sch.get_loops(sch.get_block(name))
        bx, tx = sch.split(i, [None, 32])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    split = lower_device(sch.mod["main"], LIMITS)
    assert len(split.kernels) == 2
    allocs = _stmts(split.host.body, Allocate)
    assert [a.buffer.name for a in allocs] == ["B"]
    l0, l1 = _launches(split)
    assert [b.name for b in l0.buffers] == ["A", "B"]
    assert [b.name for b in l1.buffers] == ["C", "B"]   # parameters first, then temporaries


def test_cross_thread_reduction_lowers_to_a_tree_with_barriers():
    n = te.var("n")
    A = te.placeholder((n, 100), "float32", "A")
    k = te.reduce_axis((0, 100), "k")
    B = te.compute((n,), lambda i: te.max(A[i, k], axis=k), "B")
    sch = Schedule(te.create_prim_func([A, B]))
    i, kk = sch.get_loops(sch.get_block("B"))
    ko, ki = sch.split(kk, [None, 24])          # 24 threads: not a power of two
    sch.reorder(i, ki, ko)
    sch.bind(i, "blockIdx.x")
    sch.bind(ki, "threadIdx.x")
    k0, = lower_device(sch.mod["main"], LIMITS).kernels
    assert k0.block == (24, 1, 1)
    assert [b.name for b in k0.shared_buffers] == ["B_red"]
    stores = _stmts(k0.func.body, BufferStore)
    # partial init + update, the slot write, 5 tree steps (16, 8, 4, 2, 1), the result
    assert [s.buffer.name for s in stores] == ["B_in_thread"] * 2 + ["B_red"] * 6 + ["B"]
    top = k0.func.body
    while isinstance(top, Allocate):
        top = top.body
    assert sum(is_barrier(s) for s in top.seq) == 6


def test_cross_thread_reduction_threads_past_a_tail_read_nothing():
    # 70 columns in blocks of 24 on threadIdx.x: the last block's 2 spare threads must not
    # load W (out of bounds); they still take part in the tree, and only the store skips them
    A = te.placeholder((4, 100), "float32", "A")
    W = te.placeholder((100, 70), "float32", "W")
    k = te.reduce_axis((0, 100), "k")
    C = te.compute((4, 70), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    sch = Schedule(te.create_prim_func([A, W, C]))
    i, j, kk = sch.get_loops(sch.get_block("C"))
    jo, ji = sch.split(j, [None, 24])
    ko, ki = sch.split(kk, [4, None])
    sch.reorder(i, jo, ji, ko, ki)
    sch.bind(i, "blockIdx.y")
    sch.bind(jo, "blockIdx.x")
    sch.bind(ji, "threadIdx.x")
    sch.bind(ko, "threadIdx.y")
    k0, = lower_device(sch.mod["main"], LIMITS).kernels

    class Guarded(IRVisitor):
        """The stores to C_in_thread and how many IfThenElse enclose each."""
        def __init__(self):
            super().__init__()
            self.depth, self.found = 0, []

        def visit_IfThenElse(self, s):
            self.depth += 1
            self.generic_visit(s)
            self.depth -= 1

        def visit_BufferStore(self, s):
            if s.buffer.name == "C_in_thread" and "W" in repr(s.value):
                self.found.append(self.depth)
            self.generic_visit(s)

    v = Guarded()
    v.visit(k0.func.body)
    assert v.found and all(d >= 1 for d in v.found)
