"""Design spaces end to end on the CPU: sampled schedules built with targets.build and run
against numpy; symbolic extents; the GEMM space contains the hand-written BLAS recipe."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import Schedule, arith
from tilecraft.tensorir.functor import substitute
from tilecraft.tensorir.schedule import tree
from tilecraft.tensorir.stmt import (Allocate, BufferStore, For, IfThenElse, SeqStmt)
from tilecraft.tensorir.transform import lower
from tilecraft.tensorir.expr import BufferLoad, PrimExpr

from tilecraft.tensorir.schedule.intrinsics import target_isas

from tilecraft import metaschedule as ms
from tilecraft.metaschedule.schedule_rule.base import ANN_TENSORIZE
from space_workloads import (WORKLOADS, check_build, gemm, inputs_of, symbolic_matmul)

LLVM = targets.Target("llvm")


def light(space, design, func, seed):
    """A sample with at most 16 unrolled steps (compiles in a fraction of a second)."""
    sch = space.sample(design, func, LLVM, seed)
    assert sch is not None, space.last_rejection
    trace = sch.trace.without_postproc()
    for n, inst in enumerate(trace.instructions):
        if inst.kind == "sample_categorical" and inst.inputs[0][:2] == [0, 16]:
            trace = trace.with_decision(n, min(inst.decision, 1))
    return space.finish(trace, func, LLVM)


@pytest.mark.parametrize("workload", ["gemm_small", "gemm_bias_relu", "conv2d", "softmax"])
def test_sampled_schedules_build_and_run(workload):
    space = ms.default_space(LLVM)
    func = WORKLOADS[workload][0]()
    ins = inputs_of(workload)
    expected = WORKLOADS[workload][2](*ins)
    designs = space.generate(func, LLVM)
    for n, design in enumerate([designs[0], designs[-1]]):
        sch = light(space, design, func, seed=10 + n)
        check_build(sch.mod, LLVM, ins, expected)


def test_symbolic_rows_tuned_at_64_serve_every_n():
    space = ms.default_space(LLVM)
    f = symbolic_matmul()
    designs = space.generate(f, LLVM, shape_hints={"n": 64})
    rng = np.random.default_rng(0)
    for design, seed in ((designs[0], 1), (designs[-1], 2)):
        sch = light(space, design, f, seed)
        lib = targets.build(sch.mod, LLVM)
        for n in (1, 7, 64, 100):
            a = rng.uniform(-1, 1, (n, 24)).astype("float32")
            b = rng.uniform(-1, 1, (24, 32)).astype("float32")
            c = np.zeros((n, 32), "float32")
            lib["main"](a, b, c)
            np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


# -- the hand recipe is a point of the space -------------------------------------------------

def same_program(f, g) -> bool:
    """Two lowered functions have the same loop nests (kinds, extents), allocations and
    accesses, with index expressions equal as integer functions (sums may be ordered
    differently)."""
    vmap = {}
    ana = arith.Analyzer()

    def same_expr(a, b):
        if isinstance(a, PrimExpr) and a.dtype.startswith("int"):
            d = ana.simplify(substitute(a, vmap) - b)
            return getattr(d, "value", None) == 0
        return walk(a, b)

    def walk(a, b):
        if type(a) is not type(b):
            return False
        if isinstance(a, For):
            vmap[a.loop_var] = b.loop_var
            return (a.kind == b.kind and same_expr(a.extent, b.extent)
                    and same_expr(a.min, b.min) and walk(a.body, b.body))
        if isinstance(a, SeqStmt):
            return len(a.seq) == len(b.seq) and all(walk(x, y) for x, y in zip(a.seq, b.seq))
        if isinstance(a, Allocate):
            return a.buffer.name == b.buffer.name and a.buffer.scope == b.buffer.scope and \
                walk(a.body, b.body)
        if isinstance(a, IfThenElse):
            return same_expr(a.condition, b.condition) and walk(a.then_case, b.then_case) and \
                ((a.else_case is None and b.else_case is None) or walk(a.else_case, b.else_case))
        if isinstance(a, BufferStore):
            return a.buffer.name == b.buffer.name and all(
                same_expr(x, y) for x, y in zip(a.indices, b.indices)) and walk(a.value, b.value)
        if isinstance(a, BufferLoad):
            return a.buffer.name == b.buffer.name and all(
                same_expr(x, y) for x, y in zip(a.indices, b.indices))
        if isinstance(a, PrimExpr):
            kids_a = [getattr(a, x) for x in a._fields]
            kids_b = [getattr(b, x) for x in b._fields]
            return all(same_expr(x, y) if isinstance(x, PrimExpr) else x == y
                       for x, y in zip(kids_a, kids_b))
        return a == b

    return walk(f.body, g.body)


def micro_kernel_design(space, func):
    return next(d for d in space.generate(func, LLVM)
                if any(i.kind == "annotate" and i.inputs[1] == ANN_TENSORIZE
                       for i in d.trace.instructions))


def recipe_trace(design, M, N, K, mr, nr):
    """The decisions of benchmarks/schedules/gemm.py's schedule_gemm in the micro-kernel
    space: an MR x NR register tile, panels of B outermost (j0 = N / NR), all row tiles in
    level 1, the whole k in level 0, unit tiles elsewhere, no extra unrolling."""
    trace = design.trace
    cats = [n for n, i in enumerate(trace.instructions) if i.kind == "sample_categorical"]
    tiles = [n for n, i in enumerate(trace.instructions) if i.kind == "sample_tile"]
    mrs, nrs = (trace.instructions[c].inputs[0] for c in cats[:2])
    trace = trace.with_decision(cats[0], mrs.index(mr)).with_decision(cats[1], nrs.index(nr))
    trace = trace.with_decision(tiles[0], [1, -(-M // mr), 1])     # i: io in level 1
    trace = trace.with_decision(tiles[1], [N // nr, 1, 1])         # j: panels in level 0
    trace = trace.with_decision(tiles[2], [K, 1])                  # k
    return trace.with_decision(cats[2], 0)                         # unroll: none


def test_gemm_space_contains_the_hand_recipe():
    from benchmarks.schedules.gemm import GemmConfig, schedule_gemm
    M = N = K = 256
    f = gemm(M, N, K)
    space = ms.default_space(LLVM)
    lanes = ms.SpaceContext(LLVM).lanes()
    nr = 4 * lanes if 4 * lanes <= 64 else 2 * lanes
    sch = space.finish(recipe_trace(micro_kernel_design(space, f), M, N, K, 6, nr), f, LLVM)
    assert sch is not None, space.last_rejection
    hand = Schedule(f)
    schedule_gemm(hand, "C", LLVM, GemmConfig(mr=6, nr=nr))
    assert same_program(lower(hand.mod["main"]), lower(sch.mod["main"]))
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, (256, 256)).astype("float32") for _ in range(2))
    check_build(sch.mod, LLVM, [a, b], a @ b)


def test_random_micro_kernel_samples_pack_and_block_registers():
    """Every sample of the micro-kernel space packs B into panels of its register tile's
    width and computes the tile with the micro-kernel (or, on partial tiles, the same
    unrolled / vectorized loops)."""
    M, N, K = 96, 64, 32
    f = gemm(M, N, K)
    space = ms.default_space(LLVM)
    design = micro_kernel_design(space, f)
    lanes = ms.SpaceContext(LLVM).lanes()
    tensorized = 0
    for seed in range(6):
        sch = space.sample(design, f, LLVM, seed)
        assert sch is not None, space.last_rejection
        blocks = {br.block.name: br for br in tree.all_blocks(sch.func)}
        packed = blocks["B_global"].block.writes[0].buffer
        # the register tile's width: the rule's NR draw (candidates lanes, 2 lanes, ...)
        nr_draw, = [i for i in sch.trace.instructions if i.kind == "sample_categorical"
                    and i.inputs[0][0] == lanes and all(c % lanes == 0 for c in i.inputs[0])]
        nr = nr_draw.inputs[0][nr_draw.decision]
        assert len(packed.shape) == 3 and packed.shape[2].value == nr
        assert blocks["C_local"].block.reads[0].buffer.scope == "local"
        kinds = [i.kind for i in sch.trace.instructions]
        if "tensorize" in kinds:
            tensorized += 1
        else:
            c_loops = tree.loops_between(tree.find_block(sch.func, "C")[1])
            assert [l.kind for l in c_loops[-2:]] == ["unrolled", "vectorized"]
    if target_isas(LLVM):
        assert tensorized >= 1


# -- seeds: the recipe points the search starts from ----------------------------------------


def test_seeds_are_the_hand_recipe_and_compute_the_gemm():
    """``SpaceGenerator.seeds`` gives the hand recipe at a few register tiles: the 6 x NR seed
    is the same program as ``schedule_gemm``'s (M leaves a row tail, so neither is
    tensorized), every seed is correct, and a seed's trace is a trace of the micro-kernel
    design (mutators can move it)."""
    from benchmarks.schedules.gemm import GemmConfig, default_config, schedule_gemm
    M, N, K = 100, 64, 40
    f = gemm(M, N, K)
    space = ms.default_space(LLVM)
    seeds = space.seeds(f, LLVM)
    assert 1 <= len(seeds) <= 6
    design = micro_kernel_design(space, f)
    kinds = [i.kind for i in design.trace.without_postproc().instructions]
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (M, K)).astype("float32")
    b = rng.uniform(-1, 1, (K, N)).astype("float32")
    for sch in seeds:
        assert [i.kind for i in sch.trace.without_postproc().instructions] == kinds
        check_build(sch.mod, LLVM, [a, b], a @ b)
        moved = space.mutate(sch.trace, f, LLVM, np.random.default_rng(0))
        assert moved is not None, space.last_rejection
        check_build(moved.mod, LLVM, [a, b], a @ b)
    cfg = default_config(LLVM)       # 6 x 64 on AVX-512, 6 x 16 on AVX2
    if N % cfg.nr == 0:
        hand = Schedule(f)
        schedule_gemm(hand, "C", LLVM, GemmConfig(mr=cfg.mr, nr=cfg.nr))
        want = lower(hand.mod["main"])
        assert any(same_program(want, lower(s.mod["main"])) for s in seeds)


def test_no_seeds_without_a_block_the_recipe_fits():
    space = ms.default_space(LLVM)
    func = WORKLOADS["softmax"][0]()
    assert space.seeds(func, LLVM) == []
