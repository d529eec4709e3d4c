"""Each mutator: it changes one decision (or annotation value) of a trace, and the mutated
trace replays to a program that still computes the right thing."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir.schedule.primitives_compute import compute_location_candidates

from tilecraft import metaschedule as ms
from tilecraft.metaschedule.schedule_rule.base import ANN_PARALLEL, SpaceContext
from space_workloads import WORKLOADS, check_interpret, conv2d_nhwc, gemm, inputs_of, softmax

LLVM = targets.Target("llvm")
OPENCL = targets.Target("opencl")


def micro_kernel_index(space, func, target):
    from tilecraft.metaschedule.schedule_rule.base import ANN_TENSORIZE
    return next(n for n, d in enumerate(space.generate(func, target))
                if any(i.kind == "annotate" and i.inputs[1] == ANN_TENSORIZE
                       for i in d.trace.instructions))


def finished(space, func, target, design=0, seed=0):
    sch = space.sample(space.generate(func, target)[design], func, target, seed)
    assert sch is not None, space.last_rejection
    return sch


def diff(a, b):
    """Indices where two traces differ (decision or inputs)."""
    return [i for i, (x, y) in enumerate(zip(a.instructions, b.instructions))
            if x.decision != y.decision or x.inputs != y.inputs]


def mutate_and_check(mutator, space, func, target, workload, trace, tries=8):
    mutator.initialize(SpaceContext(target, {}, func))
    ins = inputs_of(workload)
    expected = WORKLOADS[workload][2](*ins)
    rng = np.random.default_rng(0)
    base = trace.without_postproc()
    out = []
    for _ in range(tries):
        new = mutator.apply(base, rng)
        if new is None:
            continue
        assert len(diff(base, new)) == 1
        sch = space.finish(new, func, target)
        assert sch is not None, space.last_rejection
        check_interpret(sch.mod["main"], ins, expected)
        out.append(new)
    return out


def test_mutate_tile_size_moves_prime_factors():
    space = ms.default_space(LLVM)
    f = gemm()
    sch = finished(space, f, LLVM, design=3)
    new = mutate_and_check(ms.MutateTileSize(), space, f, LLVM, "gemm", sch.trace)
    assert new
    base = sch.trace.without_postproc()
    for t in new:
        (i,) = diff(base, t)
        old, cur = base.instructions[i].decision, t.instructions[i].decision
        if t.instructions[i].kind == "sample_tile":
            assert np.prod(old) == np.prod(cur) and cur[-1] <= t.instructions[i].inputs[2]
        else:                                            # a register-tile size
            assert t.instructions[i].kind == "sample_categorical" and cur != old


def test_mutate_tile_size_reaches_register_tiles():
    space = ms.default_space(LLVM)
    f = gemm()
    sch = finished(space, f, LLVM, design=micro_kernel_index(space, f, LLVM))
    kinds = set()
    m = ms.MutateTileSize()
    m.initialize(SpaceContext(LLVM, {}, f))
    rng = np.random.default_rng(1)
    base = sch.trace.without_postproc()
    for _ in range(30):
        t = m.apply(base, rng)
        kinds.add(t.instructions[diff(base, t)[0]].kind)
    assert kinds == {"sample_tile", "sample_categorical"}


def test_mutate_unroll_and_parallel():
    space = ms.default_space(LLVM)
    f = gemm()
    sch = finished(space, f, LLVM, design=2)
    for t in mutate_and_check(ms.MutateUnroll(), space, f, LLVM, "gemm", sch.trace, tries=3):
        (i,) = diff(sch.trace.without_postproc(), t)
        assert t.instructions[i].kind == "sample_categorical"
    par = mutate_and_check(ms.MutateParallel(16), space, f, LLVM, "gemm", sch.trace, tries=3)
    cores = SpaceContext(LLVM).num_cores
    for t in par:
        (i,) = diff(sch.trace.without_postproc(), t)
        inst = t.instructions[i]
        assert inst.inputs[1] == ANN_PARALLEL and inst.inputs[2] % cores == 0


def test_mutate_compute_location_picks_another_legal_place():
    space = ms.SpaceGenerator(rules=[ms.AutoInline(), ms.RandomComputeLocation()],
                              postprocs=[], mutator_probs={})
    f = conv2d_nhwc()
    sch = finished(space, f, LLVM)
    new = mutate_and_check(ms.MutateComputeLocation(), space, f, LLVM, "conv2d", sch.trace,
                           tries=3)
    assert new
    idx = [i.kind for i in sch.trace.instructions].index("sample_compute_location")
    from tilecraft.tensorir import Schedule
    from tilecraft.tensorir.schedule import Trace
    prefix = Schedule(f)
    prefix.replay(Trace(sch.trace.instructions[:idx]))
    legal = {d for d, _ in compute_location_candidates(prefix.func, "pad")}
    for t in new:
        assert t.instructions[idx].decision in legal
        assert t.instructions[idx].decision != sch.trace.instructions[idx].decision
    # no sampled location: nothing to mutate
    m = ms.MutateComputeLocation()
    m.initialize(SpaceContext(LLVM, {}, gemm()))
    plain = ms.SpaceGenerator(rules=[], postprocs=[], mutator_probs={})
    assert m.apply(plain.generate(gemm(), LLVM)[0].trace, np.random.default_rng(0)) is None


def test_mutate_thread_binding_on_gpu():
    space = ms.default_space(OPENCL)
    f = softmax()
    designs = space.generate(f, OPENCL)
    ok = 0
    for d in range(len(designs)):
        sch = space.sample(designs[d], f, OPENCL, 1)
        if sch is None:
            continue
        ok += len(mutate_and_check(ms.MutateThreadBinding(), space, f, OPENCL, "softmax",
                                   sch.trace, tries=2))
    assert ok >= 2


def test_space_mutate_follows_the_probabilities():
    """With one mutator at probability 1 only that kind of change happens."""
    f = gemm()
    only_unroll = ms.SpaceGenerator(
        rules=ms.default_space(LLVM).rules, postprocs=ms.default_space(LLVM).postprocs,
        mutator_probs={ms.MutateUnroll(): 1.0, ms.MutateTileSize(): 0.0})
    sch = finished(only_unroll, f, LLVM, design=2)
    rng = np.random.default_rng(0)
    for _ in range(3):
        m = only_unroll.mutate(sch.trace, f, LLVM, rng)
        (i,) = diff(sch.trace.without_postproc(), m.trace.without_postproc())
        assert m.trace.instructions[i].kind == "sample_categorical"
