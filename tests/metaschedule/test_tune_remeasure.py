"""The re-measurement at the end of tune_tasks (issue 6, the tuner's selection bias): a task's
best records are timed again with its baseline, interleaved over several rounds, and a record
is selected only if its median beats the baseline's by the margin. A deterministic runner (no
kernel runs: each program's time comes from a table, and a chosen program's first measurement
is a lucky draw) makes a slower candidate look best; the tests check which schedule
``apply_best`` then gives. Also: the ``Remeasurement`` round trip through the database, and
resuming after a run killed in the middle of its re-measurement."""
import json
import math
import os

import pytest

from tilecraft import metaschedule
from tilecraft.metaschedule import Database, Task, apply_best, baseline_record, tune_tasks, tune_tir
from tilecraft.metaschedule.builder import BuilderResult
from tilecraft.metaschedule.database import REMEASURED_FILE, Remeasurement, TuningRecord
from tilecraft.metaschedule.runner import RunnerResult
from tilecraft.metaschedule.search import trace_key
from tilecraft.tensorir.schedule import Schedule

from search_testutil import gemm_func, small_space

SEARCH = {"population_size": 8, "genetic_num_iters": 1}
MS = 1e-3


class FakeBuilder:
    """Builds nothing: the artifact "path" names the scheduled program's structural hash."""

    def build(self, inputs):
        return [BuilderResult("fake:" + metaschedule.workload_hash(inp.mod), None)
                for inp in inputs]

    def close(self):
        pass


class FakeRunner:
    """Times from a table, nothing run. The baseline program takes ``base`` seconds; the
    k-th distinct other program it is asked to run (in the order first seen) takes
    ``cands(k)``; program k's first measurement is ``lucky[k]`` times its time (a lucky draw);
    every later one wobbles by +-0.2%. ``kill_in_remeasure``: a call of programs all measured
    before (only the re-measurement rounds make one) raises KeyboardInterrupt, like a kill.
    ``fail``: {k: n} -- program k's n-th measurement fails."""

    def __init__(self, base_hash, base, cands, lucky=None, kill_in_remeasure=False, fail=None):
        self.base_hash, self.base, self.cands = base_hash, base, cands
        self.lucky = lucky or {}
        self.fail = fail or {}
        self.kill_in_remeasure = kill_in_remeasure
        self.order: dict[str, int] = {}
        self.count: dict[str, int] = {}

    def index(self, h):
        """The k of program ``h`` (None for the baseline)."""
        if h == self.base_hash:
            return None
        return self.order.setdefault(h, len(self.order))

    def run(self, inputs):
        hashes = [inp.artifact_path[len("fake:"):] for inp in inputs]
        if self.kill_in_remeasure and all(h in self.count for h in hashes):
            raise KeyboardInterrupt
        out = []
        for h in hashes:
            k = self.index(h)
            n = self.count[h] = self.count.get(h, 0) + 1
            t = self.base if k is None else self.cands(k)
            if k is not None and self.fail.get(k) == n:
                out.append(RunnerResult(None, "the board went away"))
                continue
            if n == 1:
                t *= self.lucky.get(k, 1.0)
            else:
                t *= 1 + 0.002 * (n % 3 - 1)
            out.append(RunnerResult([t], None))
        return out

    def close(self):
        pass


def hand_schedule(func) -> Schedule:
    sch = Schedule(func)
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.reorder(i, k, j)
    sch.parallel(i)
    return sch


def program(sch_or_func):
    f = sch_or_func.func if isinstance(sch_or_func, Schedule) else sch_or_func
    return metaschedule.workload_hash(f)


def gemm_task():
    func = gemm_func(32, 32, 32)
    return Task("gemm", func, baseline=hand_schedule(func))


def tune(task, work, runner, trials=9, **kw):
    return tune_tasks([task], "llvm", trials, work_dir=work, num_trials_per_iter=4,
                      space=small_space(), builder=FakeBuilder(), runner=runner, seed=0,
                      progress=False, search=SEARCH, cost_model="random", **kw)


def log_of(work):
    return (work / metaschedule.tune.LOG_FILE).read_text()


def test_a_lucky_slower_candidate_does_not_replace_the_baseline(tmp_path):
    task = gemm_task()
    base_hash = program(task.baseline)

    def runner():     # every candidate truly 1.2 ms (slower), the first one's draw lucky
        return FakeRunner(base_hash, 1.0 * MS, lambda k: 1.2 * MS, lucky={0: 0.5})
    # without the re-measurement the lucky draw wins: the bias of issue 6
    biased = tune(task, tmp_path / "off", runner(), remeasure=0)
    assert biased.query_tuning_record(task.func, "llvm").mean_secs == pytest.approx(0.6 * MS)
    assert program(apply_best(biased, task.func, "llvm")) != base_hash
    assert not (tmp_path / "off" / REMEASURED_FILE).exists()
    # with it the default schedule stays
    work = tmp_path / "on"
    db = tune(task, work, runner())
    assert len(db) == len(biased)                  # the rounds are not trials
    sch = apply_best(db, task.func, "llvm")
    assert program(sch) == base_hash
    m, = db.get_remeasurements(task.func, "llvm")
    assert m.selected == m.baseline == 0 and len(m.traces) == 5      # top 4 and the baseline
    assert all(len(t) == 5 for t in m.run_secs)                      # 5 rounds each
    assert m.median_secs(0) == pytest.approx(1.0 * MS, rel=0.01)
    assert all(m.median_secs(i) == pytest.approx(1.2 * MS, rel=0.01) for i in range(1, 5))
    best = db.query_tuning_record(task.func, "llvm")
    assert trace_key(best.trace) == trace_key(task.baseline.trace)
    assert best.mean_secs == baseline_record(db, task, "llvm").mean_secs
    log = log_of(work)
    assert "re-measured top 4 vs baseline (5 rounds): best x0.833" in log
    assert "no candidate beat the baseline by 3%: the default schedule stays" in log
    assert "(re-measured)" in log.split("done:")[-1]


def test_the_truly_faster_candidate_is_kept_not_the_lucky_one(tmp_path):
    task = gemm_task()
    base_hash = program(task.baseline)
    # program 1 truly 0.8 ms; the others 1.1 ms, program 0 measured 0.44 ms once
    runner = FakeRunner(base_hash, 1.0 * MS, lambda k: 0.8 * MS if k == 1 else 1.1 * MS,
                        lucky={0: 0.4})
    work = tmp_path / "w"
    db = tune(task, work, runner)
    fastest_raw = db.get_top_k(db.workloads[0], "llvm", 1)[0]
    assert runner.index(program(fastest_raw.as_schedule(task.func))) == 0   # the lucky one
    sch = apply_best(db, task.func, "llvm")
    assert runner.index(program(sch)) == 1
    best = db.query_tuning_record(task.func, "llvm")
    assert best.mean_secs == pytest.approx(0.8 * MS, rel=0.01)
    assert "best x1.25 (0.8 vs 1 ms), kept" in log_of(work)


@pytest.mark.parametrize("margin, kept", [(0.03, False), (0.01, True)])
def test_the_margin(tmp_path, margin, kept):
    task = gemm_task()
    base_hash = program(task.baseline)
    # program 0 truly 2% faster than the baseline, the rest slower
    runner = FakeRunner(base_hash, 1.0 * MS, lambda k: 0.98 * MS if k == 0 else 1.3 * MS)
    db = tune(task, tmp_path, runner, remeasure=2, remeasure_rounds=3, remeasure_margin=margin)
    m, = db.get_remeasurements(task.func, "llvm")
    assert len(m.traces) == 3 and all(len(t) == 3 for t in m.run_secs)
    assert m.margin == margin
    got = runner.index(program(apply_best(db, task.func, "llvm")))
    assert got == (0 if kept else None)
    pct = f"{margin * 100:g}%"
    assert ("kept" in log_of(tmp_path)) == kept
    assert (f"no candidate beat the baseline by {pct}" in log_of(tmp_path)) == (not kept)


def test_without_a_baseline_the_median_fastest_is_selected(tmp_path):
    func = gemm_func(32, 32, 32)
    runner = FakeRunner(None, math.nan, lambda k: 0.9 * MS if k == 1 else 1.0 * MS,
                        lucky={0: 0.3})
    db = tune_tir(func, "llvm", 8, work_dir=tmp_path, num_trials_per_iter=4,
                  space=small_space(), builder=FakeBuilder(), runner=runner, seed=0,
                  progress=False, search=SEARCH, cost_model="random", remeasure=3,
                  remeasure_rounds=3)
    assert runner.index(program(apply_best(db, func, "llvm"))) == 1
    m, = db.get_remeasurements(func, "llvm")
    assert m.baseline is None and len(m.traces) == 3
    assert "re-measured top 3 among themselves (no baseline, 3 rounds): selected 0.9 ms" \
        in log_of(tmp_path)


def test_a_candidate_that_fails_in_a_round_is_not_selected(tmp_path):
    task = gemm_task()
    base_hash = program(task.baseline)
    # program 1 is the fastest but its 3rd measurement (a round of the re-measurement) fails
    runner = FakeRunner(base_hash, 1.0 * MS, lambda k: {1: 0.5, 2: 0.7}.get(k, 1.2) * MS,
                        fail={1: 3})
    db = tune(task, tmp_path, runner)
    m, = db.get_remeasurements(task.func, "llvm")
    assert runner.index(program(apply_best(db, task.func, "llvm"))) == 2
    failed = [i for i, e in enumerate(m.errors) if e]
    assert len(failed) == 1 and m.run_secs[failed[0]] is None
    assert m.errors[failed[0]] == "the board went away"
    assert math.isinf(m.median_secs(failed[0]))


def test_resume_after_a_run_killed_in_the_remeasurement(tmp_path):
    task = gemm_task()
    base_hash = program(task.baseline)

    def runner(kill=False):
        return FakeRunner(base_hash, 1.0 * MS, lambda k: 0.8 * MS if k == 1 else 1.1 * MS,
                          lucky={0: 0.4}, kill_in_remeasure=kill)
    with pytest.raises(KeyboardInterrupt):
        tune(task, tmp_path, runner(kill=True))
    db = Database(tmp_path)
    assert len(db) == 9 and db.get_remeasurements(task.func, "llvm") == []
    # until a re-measurement completes, the fastest record is used, as before
    assert db.query_tuning_record(task.func, "llvm").mean_secs == pytest.approx(0.44 * MS)
    db = tune(task, tmp_path, runner(), trials=4)
    assert len(db) == 13
    assert len(db.get_remeasurements(task.func, "llvm")) == 1
    assert db.query_tuning_record(task.func, "llvm").mean_secs == pytest.approx(0.8 * MS,
                                                                              rel=0.01)
    # killed again in a later run's re-measurement: the last completed selection holds
    with pytest.raises(KeyboardInterrupt):
        tune(task, tmp_path, runner(kill=True), trials=4)
    again = Database(tmp_path)
    assert len(again.get_remeasurements(task.func, "llvm")) == 1
    assert again.query_tuning_record(task.func, "llvm").mean_secs == pytest.approx(0.8 * MS,
                                                                                 rel=0.01)


def test_bad_remeasure_arguments(tmp_path):
    task = gemm_task()
    for kw, match in [({"remeasure": -1}, "remeasure must"),
                      ({"remeasure": 2.5}, "remeasure must"),
                      ({"remeasure_rounds": 0}, "remeasure_rounds"),
                      ({"remeasure_margin": 1.5}, "remeasure_margin"),
                      ({"remeasure_margin": -0.1}, "remeasure_margin")]:
        with pytest.raises(ValueError, match=match):
            tune_tasks([task], "llvm", 2, work_dir=tmp_path, progress=False, **kw)


# -- the database ---------------------------------------------------------------------------------


def _two_schedules(func):
    fast = Schedule(func)
    i, j, k = fast.get_loops(fast.get_block("C"))
    fast.parallel(i)
    return hand_schedule(func), fast


def test_remeasurement_round_trip_and_selection(tmp_path):
    func = gemm_func(16, 16, 16)
    base, other = _two_schedules(func)
    db = Database(tmp_path)
    wl = db.commit_workload(func)
    # the raw records: the other schedule's lucky 1 ms is the fastest
    db.commit_tuning_record(TuningRecord(base.trace, wl, "llvm", [2e-3]))
    db.commit_tuning_record(TuningRecord(other.trace, wl, "llvm", [1e-3]))
    assert program(db.query_schedule(func, "llvm")) == program(other)
    m = Remeasurement(wl, "llvm", [base.trace, other.trace],
                      [[2.0e-3, 2.2e-3, 2.1e-3], [2.5e-3, 2.4e-3, 2.6e-3]], selected=0,
                      baseline=0, margin=0.03, timestamp=123.0)
    db.commit_remeasurement(m)
    assert len(db) == 2                                  # records only
    again = Database(tmp_path)
    got, = again.get_remeasurements(func, "llvm")
    assert got == m
    assert [t.to_json() for t in got.traces] == [t.to_json() for t in m.traces]
    assert got.median_secs(0) == pytest.approx(2.1e-3) and got.median_secs(1) == \
        pytest.approx(2.5e-3)
    rec = again.query_tuning_record(func, "llvm")
    assert rec.run_secs == [pytest.approx(2.1e-3)] and rec.ok
    assert program(again.query_schedule(func, "llvm")) == program(base)
    assert program(apply_best(again, func, "llvm")) == program(base)
    # a later re-measurement is in force
    again.commit_remeasurement(Remeasurement(wl, "llvm", [other.trace], [[1.9e-3]], 0))
    assert program(Database(tmp_path).query_schedule(func, "llvm")) == program(other)
    assert "2 re-measurements" in repr(Database(tmp_path))


def test_a_truncated_remeasurement_line_is_skipped(tmp_path):
    func = gemm_func(16, 16, 16)
    base, other = _two_schedules(func)
    db = Database(tmp_path)
    wl = db.commit_workload(func)
    db.commit_tuning_record(TuningRecord(other.trace, wl, "llvm", [1e-3]))
    db.commit_remeasurement(Remeasurement(wl, "llvm", [base.trace], [[2e-3]], 0))
    line = json.dumps(Remeasurement(wl, "llvm", [other.trace], [[1e-3]], 0).to_json())
    with open(tmp_path / REMEASURED_FILE, "a") as f:
        f.write(line[:len(line) // 2])                 # a kill in the middle of the write
    with pytest.warns(RuntimeWarning, match="truncated last line"):
        again = Database(tmp_path)
        assert len(again.get_remeasurements(func, "llvm")) == 1
    assert program(again.query_schedule(func, "llvm")) == program(base)


def test_a_database_without_remeasurements_loads_as_before(tmp_path):
    """A work_dir written before re-measurements existed: no remeasured.json."""
    func = gemm_func(16, 16, 16)
    base, other = _two_schedules(func)
    db = Database(tmp_path)
    wl = db.commit_workload(func)
    db.commit_tuning_record(TuningRecord(base.trace, wl, "llvm", [2e-3]))
    db.commit_tuning_record(TuningRecord(other.trace, wl, "llvm", [1e-3]))
    assert sorted(os.listdir(tmp_path)) == ["records.json", "workloads.json"]
    again = Database(tmp_path)
    assert again.get_remeasurements(func, "llvm") == []
    assert again.query_tuning_record(func, "llvm").run_secs == [1e-3]
    assert program(again.query_schedule(func, "llvm")) == program(other)


def test_bad_remeasurements(tmp_path):
    func = gemm_func(16, 16, 16)
    base, other = _two_schedules(func)
    wl = Database(tmp_path).commit_workload(func)
    with pytest.raises(ValueError, match="2 traces but 1 run_secs"):
        Remeasurement(wl, "llvm", [base.trace, other.trace], [[1e-3]], 0)
    with pytest.raises(ValueError, match="selected must be an index below 1"):
        Remeasurement(wl, "llvm", [base.trace], [[1e-3]], 1)
    with pytest.raises(ValueError, match="baseline must be an index"):
        Remeasurement(wl, "llvm", [base.trace], [[1e-3]], 0, baseline=3)
    with pytest.raises(ValueError, match="no run time"):
        Remeasurement(wl, "llvm", [base.trace, other.trace], [None, [1e-3]], 0)
    with pytest.raises(TypeError, match="Remeasurement"):
        Database(tmp_path).commit_remeasurement("selection")
