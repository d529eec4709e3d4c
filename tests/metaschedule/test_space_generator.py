"""SpaceGenerator / default_space: defaults per target, design spaces, sampling, errors."""
import warnings

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import Schedule
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.stmt import Block, BlockRealize, Evaluate

from tilecraft import metaschedule as ms
from space_workloads import (WORKLOADS, check_interpret, gemm, inputs_of, symbolic_matmul)

LLVM = targets.Target("llvm")


def test_default_components_per_target():
    cpu = ms.default_space("llvm -mtriple=x86_64-linux-gnu -mcpu=x86-64")
    assert [type(r).__name__ for r in cpu.rules] == [
        "AutoInline", "AddRFactor", "MultiLevelTilingWithIntrin", "MultiLevelTiling",
        "ParallelVectorizeUnroll", "RandomComputeLocation"]
    # with a dot-product instruction (AVX2's vpmaddwd at least), the 8-bit rule first
    dot = ms.default_space("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell")
    assert [type(r).__name__ for r in dot.rules][2:4] == ["MultiLevelTilingDot4",
                                                          "MultiLevelTilingWithIntrin"]
    assert [type(p).__name__ for p in cpu.postprocs] == [
        "DisallowDynamicLoop", "RewritePackedLayout", "RewriteReductionBlock", "RewriteTensorize",
        "RewriteParallelVectorizeUnroll"]
    assert {type(m).__name__: p for m, p in cpu.mutator_probs.items()} == {
        "MutateTileSize": 0.9, "MutateComputeLocation": 0.05, "MutateUnroll": 0.03,
        "MutateParallel": 0.02}
    for kind in ("opencl", "webgpu"):
        gpu = ms.default_space(kind)
        assert {type(m).__name__: p for m, p in gpu.mutator_probs.items()} == {
            "MutateTileSize": 0.9, "MutateUnroll": 0.08, "MutateThreadBinding": 0.02}
        assert "VerifyGPUCode" in [type(p).__name__ for p in gpu.postprocs]
        mlt = gpu.rules[0]
        assert mlt.structure == "SSSRRSRS"
        assert mlt.tile_binds == ("blockIdx.x", "vthread.x", "threadIdx.x")
    # a SpaceGenerator without explicit components takes the defaults of the call's target
    lazy = ms.SpaceGenerator()
    with pytest.raises(ms.TuneError, match="call generate"):
        lazy.postprocs
    lazy.generate(gemm(), "webgpu")
    assert "VerifyGPUCode" in [type(p).__name__ for p in lazy.postprocs]


def test_unsupported_target_is_a_tune_error():
    with pytest.raises(ms.TuneError, match="no schedule rules for target 'cuda'"):
        ms.default_space("cuda")

    class Fake:
        kind = "metal"
    with pytest.raises(ms.TuneError, match="kind 'metal'"):
        ms.SpaceGenerator().generate(gemm(), Fake())


def test_function_without_blocks_is_its_own_space():
    f = PrimFunc([], BlockRealize([], None, Block("root", [], [], [], Evaluate(0))))
    designs = ms.default_space(LLVM).generate(f, LLVM)
    assert len(designs) == 1 and isinstance(designs[0], Schedule)


def test_generate_is_deterministic_and_samples_differ_by_seed():
    space = ms.default_space(LLVM)
    f = gemm()
    a = [d.trace.to_json() for d in space.generate(f, LLVM)]
    b = [d.trace.to_json() for d in space.generate(f, LLVM)]
    assert a == b and len(a) == 7
    design = space.generate(f, LLVM)[0]
    s1, s1b, s2 = (space.sample(design, f, LLVM, seed) for seed in (1, 1, 2))
    assert s1.trace.to_json() == s1b.trace.to_json()
    draws = {str(space.sample(design, f, LLVM, seed).trace.decisions) for seed in range(6)}
    assert len(draws) > 1


def test_shape_hints_are_checked():
    space = ms.default_space(LLVM)
    f = symbolic_matmul()
    with pytest.raises(ms.TuneError, match=r"\['m'\].*not symbolic dims"):
        space.generate(f, LLVM, shape_hints={"m": 4})
    with pytest.raises(ms.TuneError, match="positive"):
        space.generate(f, LLVM, shape_hints={"n": 0})
    with pytest.warns(UserWarning, match=r"no shape_hints for the symbolic dims \['n'\]"):
        space.generate(f, LLVM)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        designs = space.generate(f, LLVM, shape_hints={"n": 64})
    # the hints travel in the traces: sampling needs no hints again
    assert ms.space_generator.hints_from_trace(designs[0].trace) == {"n": 64}


def test_rejections_say_why():
    class Reject(ms.Postproc):
        reason = "too slow anyway"

        def apply(self, sch):
            return False

    f = gemm()
    space = ms.SpaceGenerator(postprocs=[Reject()])
    design = space.generate(f, LLVM)[0]
    assert space.sample(design, f, LLVM, 0) is None
    assert space.last_rejection == "Reject: too slow anyway"
    bad = design.trace.without_postproc()
    bad.instructions[0].inputs[0] = "nope"
    assert ms.default_space(LLVM).finish(bad, f, LLVM) is None


def test_sample_mutate_finish_round_trip():
    space = ms.default_space(LLVM)
    f = gemm()
    ins = inputs_of("gemm")
    expected = WORKLOADS["gemm"][2](*ins)
    design = space.generate(f, LLVM)[1]
    sch = space.sample(design, f, LLVM, seed=5)
    # a finished trace replays to the same program, and finish() gives it again
    from tilecraft.tensorir.structural import structural_equal
    again = ms.default_space(LLVM).finish(sch.trace, f, LLVM)
    assert structural_equal(again.mod["main"], sch.mod["main"])
    assert structural_equal(sch.trace.apply(f).mod["main"], sch.mod["main"])
    rng = np.random.default_rng(0)
    got = 0
    for _ in range(6):
        m = space.mutate(sch.trace, f, LLVM, rng)
        if m is not None:
            got += 1
            check_interpret(m.mod["main"], ins, expected)
    assert got >= 4


def test_space_pickles_for_worker_processes():
    import pickle
    space = ms.default_space(LLVM)
    f = gemm()
    design = space.generate(f, LLVM)[0]
    again = pickle.loads(pickle.dumps(space))
    assert again.sample(pickle.loads(pickle.dumps(design.trace)), f, LLVM, 0) is not None
