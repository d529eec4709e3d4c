"""relax.extract_tasks and relax.tune on a small MLP with a symbolic batch: identical kernels
become one weighted task, a tiny tune covers every task, and relax.build with the database
matches numpy for several batch sizes."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from mlputil import mlp_module
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.build import schedule_kernels
from tilecraft.relax.tune import _prepare
from tilecraft.metaschedule import (AutoInline, LocalRunner, MultiLevelTiling, ParallelVectorizeUnroll,
                          ReuseConfig, SpaceGenerator, TuneError, apply_best)
from tilecraft.tensorir import structural_equal

SIZES = [32, 64, 64, 64, 16]        # layers 2 and 3 are the same kernel


def small_space():
    """Short unrolling and small tiles: candidates build fast, the test takes seconds."""
    return SpaceGenerator(rules=[
        AutoInline(),
        MultiLevelTiling("SSRSRS", max_innermost_factor=16,
                         reuse_write=ReuseConfig("may", (1, 2), "local")),
        ParallelVectorizeUnroll(max_jobs_per_core=16, max_vectorize_extent=16,
                                unroll_max_steps=(0, 16)),
    ])


@pytest.fixture(scope="module")
def mlp():
    return mlp_module(SIZES)


def test_extract_tasks_dedupes_and_weights(mlp):
    mod, _ = mlp
    tasks = relax.extract_tasks(mod, "llvm", upper_bounds={"batch": 16})
    assert [t.weight for t in tasks] == [1, 2, 1]
    assert all(t.shape_hints == {"batch": 16} for t in tasks)
    assert tasks[1].flop == pytest.approx(2 * 16 * 64 * 64 + 2 * 16 * 64, rel=0.01)
    hinted = relax.extract_tasks(mod, "llvm", upper_bounds={"batch": 16},
                                 shape_hints={"batch": 4})
    assert all(t.shape_hints == {"batch": 4} for t in hinted)
    default = relax.extract_tasks(mod, "llvm")
    assert all(t.shape_hints == {"batch": 64} for t in default)
    with pytest.raises(TypeError, match="IRModule"):
        relax.extract_tasks("not a module", "llvm")


def test_tune_then_build_with_database(mlp, tmp_path):
    mod, reference = mlp
    runner = LocalRunner(number=2, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)
    db = relax.tune(mod, "llvm", max_trials=6, work_dir=tmp_path, runner=runner,
                    upper_bounds={"batch": 16}, num_trials_per_iter=2, space=small_space(),
                    search={"population_size": 8, "genetic_num_iters": 1}, seed=0,
                    progress=False)
    tasks = relax.extract_tasks(mod, "llvm", upper_bounds={"batch": 16})
    assert len(db) == 6
    for t in tasks:                       # the warm-up round gave every task its trials
        assert apply_best(db, t.func, "llvm") is not None, t.name
    # relax.build asks the database for each kernel and gets the tuned schedule
    prepared = _prepare(mod, targets.Target("llvm"), {"batch": 16}, None)
    scheduled = schedule_kernels(prepared, targets.Target("llvm"), db)
    for t in tasks:
        name = next(n for n, f in scheduled.items() if structural_equal(
            prepared[n], t.func, map_free_vars=True))
        assert structural_equal(scheduled[name], apply_best(db, t.func, "llvm").func,
                                map_free_vars=True)
    exe = relax.build(mod, "llvm", database=db, upper_bounds={"batch": 16})
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    rng = np.random.default_rng(1)
    for batch in (1, 7, 16):
        xv = rng.uniform(-1, 1, (batch, SIZES[0])).astype("float32")
        out = vm["main"](xv).numpy()
        np.testing.assert_allclose(out, reference(xv), rtol=1e-4, atol=1e-4)


def test_tune_without_kernels_is_an_error(tmp_path):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((4,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(x)
    with pytest.raises(TuneError, match="no kernel"):
        relax.tune(bb.get(), "llvm", max_trials=4, work_dir=tmp_path, progress=False)


# ---------------------------------------------------------------------------------------------
# baselines: the default schedule is measured first, and a record is used only where it beats it


class _ScaledRunner(LocalRunner):
    """A LocalRunner that reports the first ``keep`` calls' times as measured (the baselines,
    measured one per call before any search) and multiplies later ones by ``factor``, except
    the last of each call (the baseline again, the batch's control): the search's candidates
    look ``factor`` times slower (or faster) than they are."""

    def __init__(self, keep: int, factor: float):
        super().__init__(number=1, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)
        self.keep, self.factor, self.calls = keep, factor, 0

    def run(self, inputs):
        out = super().run(inputs)
        self.calls += 1
        if self.calls > self.keep:
            for r in out[:-1]:
                if r.run_secs:
                    r.run_secs = [t * self.factor for t in r.run_secs]
        return out


@pytest.fixture(scope="module")
def convnet():
    """conv2d + bias + relu, then a dense layer: static shapes, so AlterLayout packs both and
    every kernel's default schedule is one trace."""
    rng = np.random.default_rng(0)
    w = rng.uniform(-0.3, 0.3, (8, 4, 3, 3)).astype("float32")
    b = rng.uniform(-0.3, 0.3, (1, 8, 1, 1)).astype("float32")
    wd = rng.uniform(-0.3, 0.3, (8 * 8 * 8, 16)).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 4, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.relu(bb.emit(op.add(bb.emit(op.nn.conv2d(x, const(w), padding=1)),
                                                   const(b)))))
            h = bb.emit(op.reshape(h, (1, 8 * 8 * 8)))
            gv = bb.emit_output(bb.emit(op.matmul(h, const(wd))))
        bb.emit_func_output(gv)

    def reference(xv):
        xp = np.pad(xv.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = np.zeros((1, 8, 8, 8))
        for kh in range(3):
            for kw in range(3):
                out += np.einsum("nchw,oc->nohw", xp[:, :, kh:kh + 8, kw:kw + 8],
                                 w[:, :, kh, kw])
        return np.maximum(out + b, 0).reshape(1, -1) @ wd
    return bb.get(), reference


class _Recorder:
    """A database for relax.build that records the kernels it is asked about."""

    def __init__(self):
        self.funcs = []

    def query_schedule(self, func, target):
        self.funcs.append(func)
        return None


def test_extracted_tasks_are_the_kernels_built(convnet):
    from tilecraft.metaschedule import workload_hash
    from tilecraft.relax import default_schedules
    from tilecraft.relax.tune import default_schedule
    mod, _ = convnet
    rec = _Recorder()
    relax.build(mod, "llvm", database=rec)
    built = {workload_hash(f) for f in rec.funcs if not default_schedules.is_scheduled(f)}
    tasks = relax.extract_tasks(mod, "llvm")
    assert {workload_hash(t.func) for t in tasks} == built
    assert any("conv2d_nchw" in t.name for t in tasks)        # AlterLayout's packed kernel
    target = targets.Target("llvm")
    for t in tasks:          # every baseline replays to exactly what relax.build applies
        assert t.baseline is not None, t.name
        assert workload_hash(t.baseline.trace.apply(t.func).func) == \
            workload_hash(default_schedules.apply(t.func, target)), t.name
        assert workload_hash(default_schedule(t.func, target).func) == \
            workload_hash(t.baseline.func)
    assert all(t.baseline is None for t in relax.extract_tasks(mod, "llvm", baselines=False))


@pytest.mark.parametrize("factor", [1000.0, 1e-3])
def test_a_record_is_used_only_where_it_beats_the_baseline(convnet, tmp_path, factor):
    from tilecraft.metaschedule import baseline_record, workload_hash
    from tilecraft.relax import default_schedules
    mod, reference = convnet
    target = targets.Target("llvm")
    tasks = relax.extract_tasks(mod, target)
    runner = _ScaledRunner(keep=len(tasks), factor=factor)
    # the batches' controls at work (the re-measurement, which would time the scaled
    # candidates again, is tested below)
    db = relax.tune(mod, target, max_trials=len(tasks) + 4, work_dir=tmp_path,
                    runner=runner, num_trials_per_iter=2, space=small_space(),
                    search={"population_size": 8, "genetic_num_iters": 1}, seed=0,
                    progress=False, remeasure=0, layouts=False)
    prepared = _prepare(mod, target, None, None)
    scheduled = schedule_kernels(prepared, target, db)
    by_hash = {workload_hash(prepared[n]): f for n, f in scheduled.items()}
    n_tuned = 0
    for t in tasks:
        base = baseline_record(db, t, target)
        assert base is not None and base.ok, t.name
        best = db.query_tuning_record(t.func, target)
        got = by_hash[workload_hash(t.func)]
        default = default_schedules.apply(t.func, target)
        if factor > 1:       # every tuned record measured slower: the default schedule is used
            assert best.mean_secs == base.mean_secs, t.name
            assert workload_hash(got) == workload_hash(default), t.name
        elif best.mean_secs < base.mean_secs:       # a faster record: it is used
            n_tuned += 1
            assert workload_hash(got) == workload_hash(best.as_schedule(t.func).func)
            assert workload_hash(got) != workload_hash(default)
    if factor < 1:
        assert n_tuned >= 1
    vm = relax.VirtualMachine(relax.build(mod, target, database=db), targets.cpu(0))
    xv = np.random.default_rng(1).uniform(-1, 1, (1, 4, 8, 8)).astype("float32")
    np.testing.assert_allclose(vm["main"](xv).numpy(), reference(xv), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# the re-measurement: a record measured fast once by luck does not replace the default schedule


class _FakeBuilder:
    """Builds nothing: the artifact "path" names the scheduled program's structural hash."""

    def build(self, inputs):
        from tilecraft.metaschedule import workload_hash
        from tilecraft.metaschedule.builder import BuilderResult
        return [BuilderResult("fake:" + workload_hash(i.mod), None) for i in inputs]

    def close(self):
        pass


class _LuckyRunner:
    """Runs nothing: a default schedule (a program in ``defaults``) takes 1 ms, every other
    program 1.2 ms, except that its first measurement is a lucky 0.6 ms."""

    def __init__(self, defaults):
        self.defaults, self.seen = defaults, set()

    def run(self, inputs):
        from tilecraft.metaschedule.runner import RunnerResult
        out = []
        for inp in inputs:
            h = inp.artifact_path[len("fake:"):]
            t = 1e-3 if h in self.defaults else 1.2e-3 if h in self.seen else 0.6e-3
            self.seen.add(h)
            out.append(RunnerResult([t], None))
        return out

    def close(self):
        pass


def test_lucky_records_do_not_replace_the_default_schedules(convnet, tmp_path):
    from tilecraft.metaschedule import workload_hash
    from tilecraft.relax import default_schedules
    mod, reference = convnet
    target = targets.Target("llvm")
    tasks = relax.extract_tasks(mod, target)
    defaults = {workload_hash(t.baseline.func) for t in tasks}
    options = dict(num_trials_per_iter=3, space=small_space(), builder=_FakeBuilder(),
                   search={"population_size": 8, "genetic_num_iters": 1}, seed=0,
                   progress=False, cost_model="random", layouts=False)
    prepared = _prepare(mod, target, None, None)

    def kernels(db):
        return {workload_hash(prepared[n]): workload_hash(f)
                for n, f in schedule_kernels(prepared, target, db).items()}
    default = {workload_hash(t.func): workload_hash(default_schedules.apply(t.func, target))
               for t in tasks}
    trials = 3 * len(tasks) + 4
    # without the re-measurement the lucky records are used
    off = relax.tune(mod, target, trials, tmp_path / "off", runner=_LuckyRunner(defaults),
                     remeasure=0, **options)
    assert kernels(off) != default
    # with it (the default), every kernel keeps its default schedule
    db = relax.tune(mod, target, trials, tmp_path / "on", runner=_LuckyRunner(defaults),
                    **options)
    assert kernels(db) == default
    for t in tasks:
        m, = db.get_remeasurements(t.func, target)
        assert m.selected == m.baseline, t.name
        assert db.query_tuning_record(t.func, target).mean_secs == pytest.approx(1e-3)
    log = (tmp_path / "on" / "tune.log").read_text()
    assert log.count("no candidate beat the baseline by 3%: the default schedule stays") == \
        len(tasks)
    vm = relax.VirtualMachine(relax.build(mod, target, database=db), targets.cpu(0))
    xv = np.random.default_rng(1).uniform(-1, 1, (1, 4, 8, 8)).astype("float32")
    np.testing.assert_allclose(vm["main"](xv).numpy(), reference(xv), rtol=1e-4, atol=1e-4)
