"""tensorir.transform.register_prefetch on the GPU default GEMM schedule: the structure of the
pipelined k-step loop, and loops it leaves alone. (The results of such kernels against numpy:
tests/relax/test_default_schedules_gpu.py, on PoCL and lavapipe.)"""
from tilecraft.relax import gpu_schedules as gs
from tilecraft.relax.backend.gpu import gemm
from tilecraft.targets import Target
from tilecraft.tensorir import Schedule, te
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Allocate, For, IfThenElse
from tilecraft.tensorir.transform import lower
from tilecraft.tensorir.transform.register_prefetch import (ANN_REGISTER_PREFETCH, MAX_STAGING,
                                                  InjectRegisterPrefetch)


def _gemm(M, N, K):
    A = te.placeholder((M, K), "float32", "A")
    B = te.placeholder((K, N), "float32", "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def _nodes(func, kind):
    out = []
    post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, kind) else None)
    return out


def test_gemm_k_loop_is_pipelined_through_registers():
    f = lower(gs.apply(_gemm(1024, 512, 48), Target("opencl")), Target("opencl"))
    staging = [a.buffer for a in _nodes(f, Allocate) if "prefetch" in a.buffer.name]
    assert len(staging) == 2 and all(b.scope == "local" for b in staging)
    assert sum(b.shape[0].value for b in staging) <= MAX_STAGING
    k0 = next(lp for lp in _nodes(f, For) if lp.loop_var.name == "k_0")
    assert ANN_REGISTER_PREFETCH not in k0.annotation_dict
    # the body: the two stores into shared memory, the guarded load of the next step, compute
    body = k0.body
    while isinstance(body, Allocate):
        body = body.body
    guard = [s for s in body.seq if isinstance(s, IfThenElse)]
    assert len(guard) == 1 and "k_0<2" in str(guard[0].condition).replace(" ", "")  # 3 steps
    text = f.script()
    # the prologue loads step 0 (no k_0 in its indices) before the loop
    assert text.index("A_shared_prefetch0[") < text.index("for k_0")


def test_unannotated_and_unmatched_loops_are_unchanged(monkeypatch):
    monkeypatch.setattr(gemm, "GEMM_REGISTER_PREFETCH", False)
    f = lower(gs.apply(_gemm(1024, 512, 48), Target("opencl")), Target("opencl"))
    assert "prefetch" not in f.script()
    # an annotated loop whose body has no copy into shared memory first: left as it is
    A = te.placeholder((64, 64), "float32", "A")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((64,), lambda i: te.sum(A[i, k], axis=k), "C")
    sch = Schedule(te.create_prim_func([A, C]))
    i, kk = sch.get_loops(sch.get_block("C"))
    sch.bind(i, "threadIdx.x")
    sch.annotate(kk, ANN_REGISTER_PREFETCH, 1)
    low = lower(sch.mod["main"], Target("opencl"))
    assert InjectRegisterPrefetch(low).script() == low.script()
    assert "_prefetch0" not in low.script()
