"""The software prefetch intrinsic (``tensorir.prefetch``): ``llvm.prefetch`` from the LLVM back
end with unchanged results; nothing from the interpreter and the OpenCL and WebGPU back ends
(built and run against numpy); the
``software_prefetch`` loop annotation (``tensorir.transform.InjectSoftwarePrefetch``)."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import (Call, Evaluate, For, IRMutator, SeqStmt, TIRError, is_prefetch,
                                prefetch, te, transform)
from tilecraft.tensorir.expr import PREFETCH, BufferLoad, Min
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.stmt import decl_buffer


def _row_sum(n=64, m=96):
    """``B[i] = sum_k A[i, k]``, its reduction loop ``k``, and the schedule."""
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis((0, m), "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), "B")
    sch = Schedule(te.create_prim_func([A, B]))
    _, kl = sch.get_loops(sch.get_block("B"))
    return sch, kl


class _PrefetchInLoop(IRMutator):
    """Prefetch ``A[i, min(k + 16, m - 1)]`` at the start of every step of the ``k`` loop (an
    explicit use of the intrinsic, before lowering)."""

    def visit_For(self, s):
        s = self.generic_visit(s)
        if s.loop_var.name != "k":
            return s
        return s.replace(body=SeqStmt([self.hint(s.loop_var), s.body]))


def _with_explicit_prefetch(n=64, m=96):
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis((0, m), "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), "B")
    func = transform.ConvertBlocksToLoops(te.create_prim_func([A, B]))
    buf = func.buffer_of(func.params[0])
    loops = {}

    def f(x):
        if isinstance(x, For):
            loops[x.loop_var.name] = x.loop_var
    post_order_visit(func.body, f)
    mut = _PrefetchInLoop()
    mut.hint = lambda kv: prefetch(buf, [loops["i"], Min(kv + 16, m - 1)])
    return func.replace(body=mut.visit(func.body))


def test_prefetch_builds_llvm_prefetch_and_results_unchanged(rng):
    func = _with_explicit_prefetch()
    mod = targets.build(func, "llvm")
    src = mod.get_source("ll-raw")
    assert "call void @llvm.prefetch.p0(ptr" in src and "i32 0, i32 3, i32 1)" in src
    a = rng.standard_normal((64, 96)).astype("float32")
    b = np.zeros(64, "float32")
    mod["main"](a, b)
    np.testing.assert_allclose(b, a.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_interpreter_ignores_prefetch(rng):
    func = _with_explicit_prefetch()
    a = rng.standard_normal((64, 96)).astype("float32")
    b = np.zeros(64, "float32")
    interpret(func, a, b)
    np.testing.assert_allclose(b, a.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_prefetch_checks_its_argument():
    a = decl_buffer((16,), "float32", "a")
    with pytest.raises(TIRError, match="prefetch takes one buffer element"):
        Call("int32", PREFETCH, [1])
    s = prefetch(a, [3])
    assert is_prefetch(s) and isinstance(s.value.args[0], BufferLoad)
    assert not is_prefetch(Evaluate(0))


def test_prefetch_out_of_bounds_is_rejected_like_a_load():
    A = te.placeholder((8,), "float32", "A")
    B = te.compute((8,), lambda i: A[i] + 1.0, "B")
    func = transform.ConvertBlocksToLoops(te.create_prim_func([A, B]))
    buf = func.buffer_of(func.params[0])
    bad = func.replace(body=SeqStmt([prefetch(buf, [8]), func.body]))
    with pytest.raises(transform.OutOfBoundsError):
        transform.VerifyMemoryAccess(bad)


def test_annotation_injects_clamped_prefetches(rng):
    sch, kl = _row_sum()
    sch.annotate(kl, transform.ANN_SOFTWARE_PREFETCH, ["A", 96, 2])
    lowered = transform.lower(sch.mod)["main"]
    hints = []

    def f(x):
        if is_prefetch(x):
            hints.append(x)
    post_order_visit(lowered.body, f)
    assert len(hints) == 1
    index = hints[0].value.args[0].indices[0]
    assert isinstance(index, Min)          # clamped to the buffer's last element
    mod = targets.build(sch.mod, "llvm")
    assert "@llvm.prefetch.p0" in mod.get_source("ll-raw")
    a = rng.standard_normal((64, 96)).astype("float32")
    b = np.zeros(64, "float32")
    mod["main"](a, b)
    np.testing.assert_allclose(b, a.sum(axis=1), rtol=1e-5, atol=1e-5)
    b2 = np.zeros(64, "float32")
    interpret(lowered, a, b2)
    np.testing.assert_allclose(b2, a.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_annotation_with_lines_prefetches_consecutive_lines(rng):
    # ["A", 96, 1, 2]: two prefetches a step, 16 floats apart, the next step 32 floats on
    sch, kl = _row_sum()
    sch.annotate(kl, transform.ANN_SOFTWARE_PREFETCH, ["A", 96, 1, 2])
    lowered = transform.lower(sch.mod)["main"]
    hints = []
    post_order_visit(lowered.body, lambda x: hints.append(x) if is_prefetch(x) else None)
    assert len(hints) == 2
    a = rng.standard_normal((64, 96)).astype("float32")
    b = np.zeros(64, "float32")
    targets.build(sch.mod, "llvm")["main"](a, b)
    np.testing.assert_allclose(b, a.sum(axis=1), rtol=1e-5, atol=1e-5)
    with pytest.raises(TIRError, match="software_prefetch annotation"):
        sch.annotate(kl, transform.ANN_SOFTWARE_PREFETCH, ["A", 96, 1, 0])
        transform.lower(sch.mod)


def test_annotation_on_a_loop_without_the_buffer_is_left_alone():
    sch, kl = _row_sum()
    sch.annotate(kl, transform.ANN_SOFTWARE_PREFETCH, ["nosuch", 16, 1])
    lowered = transform.lower(sch.mod)["main"]
    found = []
    post_order_visit(lowered.body, lambda x: found.append(x) if is_prefetch(x) else None)
    assert not found


def test_bad_annotation_names_the_loop():
    sch, kl = _row_sum()
    sch.annotate(kl, transform.ANN_SOFTWARE_PREFETCH, ["A", 16, 0])
    with pytest.raises(TIRError, match="loop k: the software_prefetch annotation"):
        transform.lower(sch.mod)


def _elementwise_with_prefetch(n=200):
    """``B = A * 2`` bound to GPU threads, each element's store after a prefetch of
    ``A[min(i + 16, n - 1)]`` (an explicit use of the intrinsic inside the block)."""
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 2.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    bx, tx = sch.split(sch.get_loops(sch.get_block("B"))[0], [None, 64])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    func = sch.mod["main"]
    buf = func.buffer_of(func.params[0])

    class _Hint(IRMutator):
        def visit_BufferStore(self, s):
            i = s.indices[0]
            return SeqStmt([prefetch(buf, [Min(i + 16, n - 1)]), s])
    return func.replace(body=_Hint().visit(func.body))


def _opencl_device():
    from opencl_testutil import opencl_device
    return opencl_device()


def _webgpu_device():
    from webgpu_testutil import webgpu_device
    return webgpu_device()


@pytest.mark.parametrize("kind,device", [("opencl", _opencl_device), ("webgpu", _webgpu_device)])
def test_gpu_build_with_prefetch_ignores_it(kind, device):
    dev = device()
    mod = targets.build(_elementwise_with_prefetch(), kind)
    assert "prefetch" not in mod.get_source()
    a = np.random.default_rng(3).standard_normal(200).astype("float32")
    b = targets.empty((200,), "float32", dev)
    mod["main"](targets.array(a, dev), b)
    np.testing.assert_allclose(b.numpy(), a * 2, rtol=1e-6)
