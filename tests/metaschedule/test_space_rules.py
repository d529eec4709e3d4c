"""Each schedule rule on small functions: what it builds, and that every accepted sample of the
spaces it makes computes the right thing (tensorir.interpret against numpy)."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import Schedule
from tilecraft.tensorir.schedule import tree

from tilecraft import metaschedule as ms
from tilecraft.metaschedule.schedule_rule.base import (ANN_PACK, ANN_PARALLEL, ANN_TENSORIZE, ANN_TILED,
                                             ANN_UNROLL, ANN_VECTORIZE, SpaceContext)
from space_workloads import (WORKLOADS, check_interpret, conv2d_nhwc, elementwise_chain, gemm,
                             inputs_of, row_sum, softmax)

LLVM = targets.Target("llvm")
OPENCL = targets.Target("opencl")
WEBGPU = targets.Target("webgpu")


def only(rule, target=LLVM, hints=None):
    rule.initialize(SpaceContext(target, hints or {}))
    return ms.SpaceGenerator(rules=[rule], postprocs=[], mutator_probs={})


def blocks_of(sch):
    return {br.block.name: br for br in tree.all_blocks(sch.func)}


def loops_of(sch, name):
    br, anc = tree.find_block(sch.func, name)
    return tree.loops_between(anc)


def sampled_correct(space, func, target, workload, seeds=range(3), need=1):
    ins = inputs_of(workload)
    expected = WORKLOADS[workload][2](*ins)
    ok = 0
    for design in space.generate(func, target):
        for seed in seeds:
            sch = space.sample(design, func, target, seed)
            if sch is None:
                continue
            check_interpret(sch.mod["main"], ins, expected)
            ok += 1
    assert ok >= need, space.last_rejection
    return ok


def test_auto_inline_cpu_keeps_exp_and_outputs():
    f = elementwise_chain()
    [sch] = only(ms.AutoInline(disallow_op=("exp",))).generate(f, LLVM)
    assert set(blocks_of(sch)) == {"root", "D"}          # B, C inlined; D is the output
    gpu = only(ms.AutoInline(into_producer=True, disallow_op=()), WEBGPU)
    [sch] = gpu.generate(softmax(), WEBGPU)
    assert "E" not in blocks_of(sch)                      # the exp is inlined on GPUs
    [sch] = only(ms.AutoInline(disallow_op=("exp",))).generate(softmax(), LLVM)
    assert "E" in blocks_of(sch)                          # ... but kept on CPUs
    # padding (a conditional) stays a block for RandomComputeLocation
    [sch] = only(ms.AutoInline()).generate(conv2d_nhwc(), LLVM)
    assert "pad" in blocks_of(sch)


def test_multi_level_tiling_cpu_structure_caches_and_packing():
    rule = ms.MultiLevelTiling("SSRSRS", reuse_write=ms.ReuseConfig("may", (1, 2), "local"),
                               pack="may")
    space = only(rule)
    designs = space.generate(gemm(), LLVM)
    assert len(designs) == 6                              # {no pack, pack} x {no cache, @1, @2}
    kinds = set()
    for d in designs:
        names = blocks_of(d)
        assert dict(names["C"].block.annotations)[ANN_TILED] == "SSRSRS"
        assert len(loops_of(d, "C")) == 10                # 2 x 4 spatial + 2 reduce levels
        kinds.add(("B_global" in names, "C_local" in names))
        if "B_global" in names:
            assert dict(names["B_global"].block.annotations)[ANN_PACK] == ["C", 1]
    assert kinds == {(False, False), (False, True), (True, False), (True, True)}
    sampled_correct(space, gemm(), LLVM, "gemm", seeds=range(2), need=12)


def test_multi_level_tiling_fuses_an_elementwise_consumer():
    rule = ms.MultiLevelTiling("SSRSRS", reuse_write=ms.ReuseConfig("must", (2,), "local"))
    space = only(rule)
    from space_workloads import gemm_bias_relu
    [d] = space.generate(gemm_bias_relu(), LLVM)
    names = blocks_of(d)
    assert "C_local" not in names and "C" in names        # the write-back is the epilogue
    br, anc = tree.find_block(d.func, "D")
    assert len(tree.loops_between(anc)) > 2               # D moved into the tile loops
    sampled_correct(space, gemm_bias_relu(), LLVM, "gemm_bias_relu", need=3)


def test_multi_level_tiling_gpu_binds_and_caches():
    rule = ms.default_space(OPENCL).rules[0]
    space = only(rule, OPENCL)
    f = gemm(16, 32, 8)
    [d] = space.generate(f, OPENCL)
    tags = [l.thread_tag for l in loops_of(d, "C") if l.kind == "thread_binding"]
    assert tags == ["blockIdx.x", "vthread.x", "threadIdx.x"]
    scopes = {br.block.name: br.block.writes[0].buffer.scope for br in tree.all_blocks(d.func)
              if br.block.writes}
    assert scopes["A_shared"] == "shared" and scopes["B_shared"] == "shared"
    assert scopes["C"] == "local"                          # accumulates in a local cache
    space = ms.SpaceGenerator(rules=[rule], postprocs=ms.default_space(OPENCL).postprocs,
                              mutator_probs={})
    sampled_correct(space, f, OPENCL, "gemm_small", seeds=range(3), need=2)


def test_micro_kernel_rule_samples_register_tiles():
    space = only(ms.MultiLevelTilingWithIntrin())
    designs = space.generate(gemm(), LLVM)
    assert len(designs) == 2                              # the micro-kernel space + untouched
    mk = designs[0]
    c = blocks_of(mk)["C"].block
    assert dict(c.annotations)[ANN_TENSORIZE] == "outer_product"
    assert "B_global" in blocks_of(mk) and "C_local" in blocks_of(mk)
    cats = [i for i in mk.trace.instructions if i.kind == "sample_categorical"]
    lanes = SpaceContext(LLVM).lanes()
    assert cats[0].inputs[0] == list(range(1, 9))                       # MR
    assert all(nr % lanes == 0 for nr in cats[1].inputs[0])            # NR: whole vectors
    # the NHWC conv is an outer product too (w x co), the NCHW one is not
    assert len(space.generate(conv2d_nhwc(), LLVM)) == 2
    # a row sum has no data reuse: not tiled
    assert len(space.generate(row_sum(), LLVM)) == 1


def test_parallel_vectorize_unroll_annotates_the_root():
    [d] = only(ms.ParallelVectorizeUnroll(16, 64, (0, 16, 64, 512))).generate(gemm(), LLVM)
    ann = dict(d.func.body.block.annotations)
    cores = SpaceContext(LLVM).num_cores
    assert ann[ANN_PARALLEL] == 16 * cores and ann[ANN_VECTORIZE] == 64
    assert ann[ANN_UNROLL] in (0, 16, 64, 512)
    [d] = only(ms.ParallelVectorizeUnroll(-1, -1, (0, 16)), WEBGPU).generate(gemm(), WEBGPU)
    assert set(dict(d.func.body.block.annotations)) == {ANN_UNROLL}


def test_random_compute_location_places_the_padding():
    space = ms.SpaceGenerator(rules=[ms.AutoInline(), ms.RandomComputeLocation()],
                              postprocs=[], mutator_probs={})
    [d] = space.generate(conv2d_nhwc(), LLVM)
    assert any(i.kind == "sample_compute_location" for i in d.trace.instructions)
    places = set()
    for seed in range(8):
        s = space.sample(d, conv2d_nhwc(), LLVM, seed)
        places.add(s.trace.instructions[[i.kind for i in s.trace.instructions].index(
            "sample_compute_location")].decision)
    assert len(places) >= 3                                 # root, inline and some loops
    sampled_correct(space, conv2d_nhwc(), LLVM, "conv2d", seeds=range(2), need=2)


def test_add_rfactor_branches_long_reductions():
    space = only(ms.AddRFactor(16, 64))
    designs = space.generate(row_sum(), LLVM)
    assert len(designs) == 3
    assert sum("B_rf" in blocks_of(d) for d in designs) == 2
    assert len(space.generate(gemm(), LLVM)) == 1           # data reuse: not rfactor'ed
    sampled_correct(space, row_sum(), LLVM, "row_sum", need=6)


def test_cross_thread_reduction_and_auto_bind_on_gpu():
    rules = [ms.AutoInline(into_producer=True, disallow_op=()),
             ms.CrossThreadReduction((32, 64, 128)), ms.AutoBind(256, (32, 64, 128))]
    space = ms.SpaceGenerator(rules=rules, postprocs=ms.default_space(WEBGPU).postprocs,
                              mutator_probs={})
    designs = space.generate(softmax(), WEBGPU)
    assert len(designs) == 4                                 # {plain, cross-thread} x 2 sums
    def rf_blocks(d):
        return [br for br in tree.all_blocks(d.func) if br.block.name.endswith("_rf")]
    both = max(designs, key=lambda d: len(rf_blocks(d)))
    rf = rf_blocks(both)
    assert len(rf) == 2 and all(b.block.writes[0].buffer.scope == "shared" for b in rf)
    for br in tree.all_blocks(both.func):
        if br is not both.func.body:
            _, anc = tree.find_block(both.func, br.block.name)
            assert any(getattr(a, "kind", None) == "thread_binding" for a in anc), br.block.name
    sampled_correct(space, softmax(), WEBGPU, "softmax", seeds=range(3), need=8)
    [d] = ms.SpaceGenerator(rules=[ms.AutoBind(256, (32, 64))], postprocs=[],
                            mutator_probs={}).generate(elementwise_chain(), OPENCL)
    tags = {l.thread_tag for name in ("B", "C", "D") for l in loops_of(d, name)
            if l.kind == "thread_binding"}
    assert tags == {"blockIdx.x", "threadIdx.x"}


def test_micro_kernel_on_weights_packed_at_build_time():
    """relax's AlterLayout hands kernels weights already in panels, W[j // 32, k, j % 32]:
    the micro-kernel rule uses them as they are, with tiles that stay inside a panel."""
    from tilecraft.tensorir import te
    M, N, K = 16, 64, 24
    X = te.placeholder((M, K), "float32", "X")
    W = te.placeholder((N // 32, K, 32), "float32", "W")
    k = te.reduce_axis((0, K), "k")
    Y = te.compute((M, N), lambda i, j: te.sum(X[i, k] * W[j // 32, k, j % 32], axis=k), "Y")
    f = te.create_prim_func([X, W, Y])
    space = ms.default_space(LLVM)
    designs = space.generate(f, LLVM)
    assert len(designs) == 4                              # micro-kernel + 3 plain (no packing)
    mk = next(d for d in designs if dict(blocks_of(d)["Y"].block.annotations).get(ANN_TENSORIZE))
    assert "W_global" not in blocks_of(mk)
    cats = [i for i in mk.trace.instructions if i.kind == "sample_categorical"]
    assert cats[1].inputs[0] and all(32 % nr == 0 for nr in cats[1].inputs[0])
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (M, K)).astype("float32")
    w = rng.uniform(-1, 1, (K, N)).astype("float32")
    packed = np.ascontiguousarray(w.reshape(K, N // 32, 32).transpose(1, 0, 2))
    for seed in range(3):
        sch = space.sample(mk, f, LLVM, seed)
        assert sch is not None, space.last_rejection
        check_interpret(sch.mod["main"], [x, packed], x @ w)
