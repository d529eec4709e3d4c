"""Each postprocessor: what it rewrites, and what it rejects."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import Schedule, te
from tilecraft.tensorir.schedule import tree
from tilecraft.tensorir.stmt import For

from tilecraft import metaschedule as ms
from tilecraft.metaschedule.schedule_rule.base import ANN_PARALLEL, ANN_UNROLL, ANN_VECTORIZE, SpaceContext
from space_workloads import (WORKLOADS, check_interpret, elementwise_chain, gemm, inputs_of,
                             softmax, symbolic_matmul)

LLVM = targets.Target("llvm")


def run(post, sch, target=LLVM, hints=None):
    post.initialize(SpaceContext(target, hints or {}))
    return post.apply(sch)


def loops(sch, name):
    _, anc = tree.find_block(sch.func, name)
    return tree.loops_between(anc)


def annotated_root(func, par=8, vec=64, unroll=16):
    sch = Schedule(func)
    root = sch.get_block("root")
    for key, value in ((ANN_PARALLEL, par), (ANN_VECTORIZE, vec), (ANN_UNROLL, unroll)):
        if value:
            sch.annotate(root, key, value)
    return sch


def test_parallel_vectorize_unroll_rewrite():
    sch = annotated_root(elementwise_chain(256), par=8, vec=8, unroll=0)
    assert run(ms.RewriteParallelVectorizeUnroll(), sch)
    for name in ("B", "C", "D"):
        ls = loops(sch, name)
        assert ls[0].kind == "parallel" and ls[-1].kind == "vectorized"
        assert ls[-1].extent.value == 8                    # 16 columns split to the limit
    ins = inputs_of("elementwise")
    check_interpret(sch.mod["main"], ins, WORKLOADS["elementwise"][2](*ins))


def test_unroll_counts_steps():
    f = gemm(8, 8, 4)
    sch = annotated_root(f, par=0, vec=0, unroll=64)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    sch.reorder(i, k, j)
    assert run(ms.RewriteParallelVectorizeUnroll(), sch)
    # j, k: 32 steps <= 64 are unrolled; with i (256 steps) no longer
    assert [l.kind for l in loops(sch, "C")] == ["serial", "unrolled", "unrolled"]


def test_parallel_stops_at_symbolic_loops_and_never_vectorizes_them():
    f = symbolic_matmul()
    sch = annotated_root(f, par=4, vec=64, unroll=0)
    assert run(ms.RewriteParallelVectorizeUnroll(), sch, hints={"n": 64})
    kinds = [l.kind for l in loops(sch, "C")]
    assert kinds[0] == "parallel" and kinds[-1] == "serial"   # innermost is the reduction


def test_rewrite_reduction_block_decomposes_at_the_first_reduce_loop():
    sch = Schedule(gemm(16, 16, 8))
    assert run(ms.RewriteReductionBlock(), sch)
    names = [br.block.name for br in tree.all_blocks(sch.func)]
    assert "C_init" in names
    assert [l.loop_var.name for l in loops(sch, "C_init")] == ["i", "j"]


def test_rewrite_reduction_block_under_a_compute_at_loop():
    """A reduction computed inside an unrelated consumer loop must be re-initialised in every
    iteration of it: the init goes below that loop."""
    f = softmax(4, 16)
    sch = Schedule(f)
    o = sch.get_block("O")
    i, j = sch.get_loops(o)
    sch.compute_at(sch.get_block("S"), j)
    assert run(ms.RewriteReductionBlock(), sch)
    ins = [np.random.default_rng(1).uniform(-1, 1, (4, 16)).astype("float32")]
    check_interpret(sch.mod["main"], ins, WORKLOADS["softmax"][2](*ins))


def test_packed_layout_follows_the_inner_tile():
    rule = ms.MultiLevelTiling("SSRSRS", pack="must")
    space = ms.SpaceGenerator(rules=[rule], postprocs=[], mutator_probs={})
    f = gemm(32, 48, 16)
    [d] = space.generate(f, LLVM)
    trace = d.trace
    tiles = [n for n, i in enumerate(trace.instructions) if i.kind == "sample_tile"]
    trace = trace.with_decision(tiles[1], [2, 2, 3, 4])     # j: inner tile 4
    sch = trace.apply(f)
    assert run(ms.RewritePackedLayout(), sch)
    packed = next(br.block.writes[0].buffer for br in tree.all_blocks(sch.func)
                  if br.block.name == "B_global")
    assert [s.value for s in packed.shape] == [12, 16, 4]   # B_global[j // 4, k, j % 4]
    assert loops(sch, "B_global")[-1].kind == "vectorized"
    ins = [np.random.default_rng(2).uniform(-1, 1, s).astype("float32")
           for s in ((32, 16), (16, 48))]
    check_interpret(sch.mod["main"], ins, ins[0] @ ins[1])
    # an inner tile of 1 column: packing is pointless, the copy is inlined back
    sch = d.trace.with_decision(tiles[1], [4, 3, 4, 1]).apply(f)
    assert run(ms.RewritePackedLayout(), sch)
    assert "B_global" not in [br.block.name for br in tree.all_blocks(sch.func)]
    check_interpret(sch.mod["main"], ins, ins[0] @ ins[1])


def _micro_kernel(f, mr, nr):
    space = ms.SpaceGenerator(rules=[ms.MultiLevelTilingWithIntrin()], postprocs=[],
                              mutator_probs={})
    design = space.generate(f, LLVM)[0]
    trace = design.trace
    cats = [n for n, i in enumerate(trace.instructions) if i.kind == "sample_categorical"]
    mrs, nrs = trace.instructions[cats[0]].inputs[0], trace.instructions[cats[1]].inputs[0]
    trace = trace.with_decision(cats[0], mrs.index(mr)).with_decision(cats[1], nrs.index(nr))
    sch = trace.apply(f)
    for p in (ms.RewritePackedLayout(), ms.RewriteReductionBlock(), ms.RewriteTensorize()):
        assert run(p, sch)
    return sch


def test_rewrite_tensorize_full_and_partial_tiles():
    from tilecraft.tensorir.schedule.intrinsics import target_isas
    lanes = SpaceContext(LLVM).lanes()
    ins = [np.random.default_rng(3).uniform(-1, 1, s).astype("float32") for s in ((64, 32),
                                                                                  (32, 64))]
    full = _micro_kernel(gemm(64, 64, 32), 4, 2 * lanes if 2 * lanes <= 64 else lanes)
    kinds = [i.kind for i in full.trace.instructions]
    if target_isas(LLVM):
        assert kinds.count("tensorize") == 2              # the update and the init
    check_interpret(full.mod["main"], ins, ins[0] @ ins[1])
    # 6 rows do not divide 64: the partial tile is computed by unrolled/vectorized loops
    part = _micro_kernel(gemm(64, 64, 32), 6, lanes)
    assert "tensorize" not in [i.kind for i in part.trace.instructions]
    assert [l.kind for l in loops(part, "C")][-2:] == ["unrolled", "vectorized"]
    check_interpret(part.mod["main"], ins, ins[0] @ ins[1])


def _bound(extent_tx, tag="threadIdx.x", n=1024):
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] + 1.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    i, = sch.get_loops(sch.get_block("B"))
    bx, tx = sch.split(i, [None, extent_tx])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, tag)
    return sch


def test_verify_gpu_code_limits():
    v = ms.VerifyGPUCode()
    assert run(v, _bound(256), targets.Target("webgpu"))
    assert not run(v, _bound(512), targets.Target("webgpu"))
    assert "512 threads per block > 256" in v.reason
    assert run(v, _bound(512), targets.Target("opencl -max-threads-per-block=1024"))
    # WebGPU: 65535 workgroups per dimension
    assert not run(v, _bound(1, n=70000), targets.Target("webgpu"))
    assert "workgroups" in v.reason
    # a block outside any kernel
    A = te.placeholder((8,), "float32", "A")
    B = te.compute((8,), lambda i: A[i] * 2.0, "B")
    assert not run(v, Schedule(te.create_prim_func([A, B])), targets.Target("opencl"))
    assert "not inside a GPU kernel" in v.reason


def test_verify_gpu_code_shared_memory():
    f = gemm(64, 64, 64)
    rule = ms.default_space("webgpu").rules[0]
    space = ms.SpaceGenerator(rules=[rule], postprocs=[], mutator_probs={})
    [d] = space.generate(f, "webgpu")
    trace = d.trace
    tiles = [n for n, i in enumerate(trace.instructions) if i.kind == "sample_tile"]
    # blocks of 64 x 64 with the whole k (64) in shared memory: 2 x 16 KiB > 16 KiB
    for t in tiles[:2]:
        trace = trace.with_decision(t, [1, 1, 16, 2, 2])
    trace = trace.with_decision(tiles[2], [1, 64, 1])
    sch = trace.apply(f)
    assert run(ms.RewriteCooperativeFetch(), sch, "webgpu")
    v = ms.VerifyGPUCode()
    assert not run(v, sch, targets.Target("webgpu"))
    assert "bytes of shared memory" in v.reason
    assert run(v, sch, targets.Target("opencl -max-shared-memory-per-block=65536"))


def test_cooperative_fetch_and_unbound_blocks():
    target = targets.Target("opencl")
    space = ms.default_space(target)
    f = gemm(16, 32, 8)
    sch = space.sample(space.generate(f, target)[0], f, target, seed=3)
    assert sch is not None, space.last_rejection
    for name in ("A_shared", "B_shared"):
        tags = [l.thread_tag for l in loops(sch, name) if l.kind == "thread_binding"]
        assert tags[0] == "blockIdx.x" and "threadIdx.x" in tags
    # a plain elementwise function: every block gets bound
    sch = Schedule(elementwise_chain(64))
    assert run(ms.RewriteUnboundBlock(), sch, target)
    assert run(ms.VerifyGPUCode(), sch, target)


def test_disallow_dynamic_loop():
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 2.0, "B")
    f = te.create_prim_func([A, B])
    sch = Schedule(f)
    sch.parallel(sch.get_loops(sch.get_block("B"))[0])
    assert run(ms.DisallowDynamicLoop(), sch)               # parallel over n is fine
    sch = Schedule(f)
    sch.vectorize(sch.get_loops(sch.get_block("B"))[0])
    assert not run(ms.DisallowDynamicLoop(), sch)          # a vector of n lanes is not
