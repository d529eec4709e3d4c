"""``metaschedule.KnobSpace`` with a toy recipe on the CPU (the GPU GEMM rule's tests are in
tests/relax/test_gpu_space.py): the knobs are ``sample_categorical`` decisions at the head of
every trace, the defaults are the seed, ``sample`` / ``mutate`` / ``finish`` re-apply the
recipe so a trace always says what its program is, ``check`` rejects before the recipe runs,
other functions get the fallback space, and a tuned record replays from the database."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.metaschedule import (Knob, KnobRule, KnobSpace, LocalRunner, Task, TuneError,
                                    apply_best, knob_values, tune_tasks)
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.structural import structural_hash

N = 256


def _scale():
    A = te.placeholder((N,), "float32", "A")
    B = te.compute((N,), lambda i: A[i] * 2.0, "B")
    return te.create_prim_func([A, B])


def _sum():
    A = te.placeholder((N,), "float32", "A")
    k = te.reduce_axis((0, N), "k")
    S = te.compute((1,), lambda _: te.sum(A[k], axis=k), "S")
    return te.create_prim_func([A, S])


class SplitVectorize(KnobRule):
    """Split the elementwise loop by ``inner``, vectorize it or not; only for ``B``."""

    def knobs(self, func, target, hints):
        if "B" not in {b.name for b in func.buffers}:
            return None
        return [Knob("inner", (1, 4, 8, 16, 512), 8), Knob("vectorize", (0, 1), 1)]

    def check(self, func, target, values):
        if values["inner"] > N:
            return f"inner {values['inner']} is over the extent {N}"
        return None

    def apply(self, sch, target, values):
        b = sch.get_block("B")
        i, = sch.get_loops(b)
        _, vi = sch.split(i, [None, values["inner"]])
        if values["vectorize"]:
            sch.vectorize(vi)


def test_knob_validation():
    with pytest.raises(TuneError, match="default 3 is not one of"):
        Knob("x", (1, 2), 3)
    with pytest.raises(TuneError, match="distinct"):
        Knob("x", (1, 1), 1)
    with pytest.raises(TuneError, match="KnobRule"):
        KnobSpace(object())


def test_seed_sample_mutate_finish():
    space = KnobSpace(SplitVectorize())
    func = _scale()
    knobs = space.knobs_of(func, "llvm")
    seed, = space.seeds(func, "llvm")
    assert knob_values(seed.trace, knobs) == {"inner": 8, "vectorize": 1}
    assert [i.kind for i in seed.trace.instructions[:2]] == ["sample_categorical"] * 2
    drawn = [space.sample(None, func, "llvm", s) for s in range(20)]
    assert any(d is None for d in drawn)          # inner 512, rejected by check
    assert space.point(func, "llvm", {"inner": 512}) is None
    assert "inner 512 is over the extent 256" in space.last_rejection
    values = {tuple(knob_values(d.trace, knobs).values()) for d in drawn if d is not None}
    assert len(values) > 2
    rng = np.random.default_rng(0)
    for _ in range(10):
        m = space.mutate(seed.trace, func, "llvm", rng)
        if m is None:
            continue
        after = knob_values(m.trace, knobs)
        assert sum(after[k] != v for k, v in {"inner": 8, "vectorize": 1}.items()) == 1
        # the program is the recipe at the new values, not the seed's replayed
        again = space.point(func, "llvm", after)
        assert structural_hash(again.func) == structural_hash(m.func)
        assert structural_hash(space.finish(m.trace, func, "llvm").func) == \
            structural_hash(m.func)


def test_functions_without_knobs_get_the_fallback():
    space = KnobSpace(SplitVectorize())
    func = _sum()
    assert space.knobs_of(func, "llvm") is None
    designs = space.generate(func, "llvm")
    assert designs and knob_values(designs[0].trace, [Knob("inner", (1, 4, 8, 16, 512), 8)]) \
        is None


def test_tune_with_a_knob_space_replays_from_the_database(tmp_path):
    space = KnobSpace(SplitVectorize())
    func = _scale()
    runner = LocalRunner(number=2, repeat=1, min_repeat_ms=0)
    db = tune_tasks([Task("scale", func)], "llvm", 6, work_dir=tmp_path, space=space,
                    num_trials_per_iter=3, search={"population_size": 8,
                                                   "genetic_num_iters": 1},
                    runner=runner, seed=0, progress=False, remeasure=0)
    sch = apply_best(db, func, "llvm")
    assert knob_values(sch.trace, space.knobs_of(func, "llvm")) is not None
    mod = targets.build(sch.mod, Target("llvm"))
    a = np.random.default_rng(0).standard_normal(N).astype("float32")
    out = targets.empty((N,), "float32", targets.cpu())
    mod[mod.entry_name](targets.array(a), out)
    np.testing.assert_allclose(out.numpy(), a * 2)
