"""Baselines in tune_tasks: a task's baseline schedule (the schedule its compiler uses without a
record) is measured first as one trial, its record replays to it, a resumed run does not
measure it again, and a baseline that is not a schedule of the task's function is refused."""
import numpy as np
import pytest

from tilecraft import metaschedule
from tilecraft.metaschedule import Task, apply_best, baseline_record, tune_tasks, workload_hash
from tilecraft.metaschedule.runner import LocalRunner
from tilecraft.metaschedule.search import trace_key
from tilecraft.tensorir.schedule import Schedule

from search_testutil import gemm_func, small_space

SEARCH = {"population_size": 8, "genetic_num_iters": 1}


def fast_runner():
    return LocalRunner(number=2, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)


def hand_schedule(func) -> Schedule:
    """A plain schedule outside the design space: rows in parallel, columns vectorized."""
    sch = Schedule(func)
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.reorder(i, k, j)
    sch.parallel(i)
    return sch


def _baseline_count(db, func, sch):
    key = trace_key(sch.trace)
    return sum(1 for r in db.get_all_tuning_records()
               if r.workload.shash == workload_hash(func) and trace_key(r.trace) == key)


def test_baseline_is_measured_first_and_not_again_on_resume(tmp_path):
    func = gemm_func(32, 32, 32)
    base = hand_schedule(func)
    task = Task("gemm", func, baseline=base)
    db = tune_tasks([task], "llvm", 4, work_dir=tmp_path, num_trials_per_iter=3,
                    space=small_space(), runner=fast_runner(), seed=0, progress=False,
                    search=SEARCH)
    assert len(db) == 4               # the baseline, 2 candidates and the baseline as control
    assert _baseline_count(db, func, base) == 2
    rec = baseline_record(db, task, "llvm")
    assert rec is not None and rec.ok
    assert db.get_all_tuning_records()[0].trace.to_json() == base.trace.to_json()
    assert workload_hash(rec.as_schedule(func).func) == workload_hash(base.func)
    best = db.query_tuning_record(func, "llvm")
    assert best.mean_secs <= rec.mean_secs           # the best record is never worse
    sch = apply_best(db, func, "llvm")
    assert sch is not None
    log = (tmp_path / metaschedule.tune.LOG_FILE).read_text()
    assert "baseline (default schedule)" in log and "baseline " in log.split("done:")[-1]
    # resumed: the baseline is known, all new trials are the search's
    db2 = tune_tasks([Task("gemm", func, baseline=hand_schedule(func))], "llvm", 3,
                     work_dir=tmp_path, num_trials_per_iter=3, space=small_space(),
                     runner=fast_runner(), seed=1, progress=False, search=SEARCH)
    assert len(db2) == 7
    # measured once up front, then again as the control of each batch (one per run here)
    assert _baseline_count(db2, func, base) == 3
    second_run = log_text = (tmp_path / metaschedule.tune.LOG_FILE).read_text()
    second_run = log_text[log_text.rindex("tuning 1 task(s)"):]
    assert "baseline (default schedule)" not in second_run


def test_baseline_of_another_function_is_not_measured(tmp_path):
    func = gemm_func(32, 32, 32)
    other = hand_schedule(gemm_func(16, 16, 16))
    db = tune_tasks([Task("gemm", func, baseline=other)], "llvm", 2, work_dir=tmp_path,
                    num_trials_per_iter=2, space=small_space(), runner=fast_runner(), seed=0,
                    progress=False, search=SEARCH)
    assert len(db) == 2
    assert _baseline_count(db, func, other) == 0
    assert "does not replay" in (tmp_path / metaschedule.tune.LOG_FILE).read_text() or \
        "replays to another program" in (tmp_path / metaschedule.tune.LOG_FILE).read_text()


def test_baseline_must_be_a_schedule():
    with pytest.raises(TypeError, match="baseline must be a tensorir Schedule"):
        Task("gemm", gemm_func(8, 8, 8), baseline="default")


def test_lift_tiles_makes_constant_splits_mutable():
    from tilecraft.metaschedule import default_space
    from tilecraft.metaschedule.search import lift_tiles
    func = gemm_func(64, 64, 64)
    sch = Schedule(func)
    i, j, k = sch.get_loops(sch.get_block("C"))
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(i, jo, k, ji)
    sch.vectorize(ji)
    sch.parallel(i)
    lifted = lift_tiles(func, sch)
    kinds = [inst.kind for inst in lifted.trace.instructions]
    assert "sample_perfect_tile" in kinds
    tile = next(inst for inst in lifted.trace.instructions if inst.kind == "sample_perfect_tile")
    assert tile.decision == [4, 16]
    assert workload_hash(lifted.trace.apply(func).func) == workload_hash(sch.func)
    space = default_space("llvm")
    rng = np.random.default_rng(0)
    mutated = [space.mutate(lifted.trace, func, "llvm", rng) for _ in range(4)]
    assert any(m is not None and workload_hash(m.func) != workload_hash(sch.func)
               for m in mutated)
    # a split with a tail (no perfect tiling) stays as it is
    odd = Schedule(gemm_func(30, 30, 30))
    i, j, k = odd.get_loops(odd.get_block("C"))
    odd.split(j, [None, 16])
    assert lift_tiles(gemm_func(30, 30, 30), odd) is odd


def test_candidates_too_large_to_build_are_dropped():
    from tilecraft.metaschedule import Database, TuneContext, XGBModel
    from tilecraft.metaschedule.search import EvolutionarySearch, unrolled_size
    from tilecraft.tensorir.transform import lower
    func = gemm_func(64, 64, 64)
    sch = Schedule(func)
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.unroll(j)
    assert unrolled_size(lower(sch.func)) >= 64
    assert unrolled_size(lower(func)) < 8
    import tempfile
    ctx = TuneContext(func, "llvm", small_space(), XGBModel(seed=0),
                      Database(tempfile.mkdtemp()), name="gemm")
    search = EvolutionarySearch(population_size=4, max_unrolled_stmts=16)
    search.initialize(ctx)
    assert search._candidate(sch, "random") is None
    assert search.stats["too_large"] == 1
    assert search._candidate(Schedule(func), "random") is not None


def test_a_record_replays_on_the_same_workload_under_other_names(tmp_path):
    """Fused kernels of different call sites have the same structure but buffers named after
    their Relax variables, and blocks a schedule makes are named after buffers: a record made
    on one call site's kernel applies to all."""
    from tilecraft.metaschedule import Database, TuningRecord
    from tilecraft.tensorir import te

    def gemm(a_name, symbol):
        A = te.placeholder((16, 16), "float32", a_name)
        B = te.placeholder((16, 16), "float32", "B")
        k = te.reduce_axis((0, 16), "k")
        C = te.compute((16, 16), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
        return te.create_prim_func([A, B, C]).with_attr("global_symbol", symbol)
    f1, f2 = gemm("A", "site1"), gemm("lv7", "site2")
    assert workload_hash(f1) == workload_hash(f2)
    sch = Schedule(f1)
    sch.cache_read(sch.get_block("C"), 0, "local")
    sch.get_block("A_local")                    # a block named after site 1's buffer
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.parallel(i)
    with pytest.raises(Exception):
        sch.trace.apply(f2)
    db = Database(tmp_path)
    db.commit_tuning_record(TuningRecord(sch.trace, db.commit_workload(f1), "llvm", [1e-3]))
    got = db.query_schedule(f2, "llvm")
    assert got is not None
    assert got.func.attr_dict["global_symbol"] == "site2"
    assert workload_hash(got.func) == workload_hash(sch.func)
