"""tune_tir / tune_tasks end to end: a small tune beats the untuned kernel, the database resumes,
a symbolic-n kernel tuned at one n is correct for every n, the log / curve / progress, and the
bad inputs (nothing to tune, unsupported target, unreachable runner)."""
import json
import os
import shutil
import socket

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft import metaschedule
from tilecraft.metaschedule import (AutoInline, Database, SpaceGenerator, Task, TuneError, apply_best,
                          plot_tuning_curve, tune_tasks, tune_tir, tuning_curve)
from tilecraft.metaschedule.progress import format_eta, format_line
from tilecraft.metaschedule.runner import LocalRunner
from tilecraft.metaschedule.task_scheduler import GradientTaskScheduler, RoundRobin

from capabilities import import_or_require
from search_testutil import gemm_func, small_space

SEARCH = {"population_size": 12, "genetic_num_iters": 1}


def fast_runner():
    return LocalRunner(number=2, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)


def seconds(func_or_mod, args, number=20):
    mod = targets.build(func_or_mod, "llvm")
    return min(mod.time_evaluator("main", targets.cpu(0), number=number, repeat=3)(*args).results)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    work = tmp_path_factory.mktemp("tune_gemm")
    func = gemm_func(64, 64, 64)
    db = tune_tir(func, "llvm", max_trials=12, work_dir=work, num_trials_per_iter=6,
                  space=small_space(), runner=fast_runner(), seed=0, progress=False,
                  search=SEARCH)
    return func, work, db


def test_tune_improves_on_untuned(tuned):
    func, work, db = tuned
    assert len(db) == 12
    # every candidate that ran was checked against the unscheduled function's outputs
    assert all(r.checked for r in db.get_all_tuning_records() if r.ok)
    assert "WITHOUT a correctness check" not in (work / "tune.log").read_text()
    sch = apply_best(db, func, "llvm")
    assert sch is not None
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, (64, 64)).astype("float32") for _ in range(2))
    c = np.zeros((64, 64), "float32")
    mod = targets.build(sch.mod, "llvm")
    mod["main"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert seconds(sch.mod, (a, b, c)) < seconds(func, (a, b, c))


def test_log_tasks_file_curve_and_plot(tuned):
    func, work, db = tuned
    log = (work / "tune.log").read_text()
    assert "tuning 1 task(s)" in log and "12/12 trials" in log and "trials/min" in log
    # no baseline: the best records were re-measured among themselves, and one selected
    assert "main: re-measured top 4 among themselves (no baseline, 5 rounds)" in log
    m, = db.get_remeasurements(func, "llvm")
    assert m.baseline is None and len(m.traces) == 4
    assert metaschedule.workload_hash(apply_best(db, func, "llvm").func) == \
        metaschedule.workload_hash(m.traces[m.selected].apply(func).func)
    tasks = json.loads((work / "tasks.json").read_text())["tasks"]
    assert tasks[0]["flop"] == 2 * 64 ** 3 and tasks[0]["name"] == "main"
    curve = tuning_curve(work)["main"]
    assert curve["trials"] == list(range(1, 13))
    best = curve["best_secs"]
    assert all(x >= y for x, y in zip(best, best[1:]))
    assert curve["best_gflops"][-1] == pytest.approx(2 * 64 ** 3 / best[-1] / 1e9)
    import_or_require("matplotlib", "pip install 'tilecraft[bench]'")   # plot_tuning_curve
    path = plot_tuning_curve(work)
    assert os.path.getsize(path) > 1000 and path.endswith("tuning_curve.png")
    assert (work / "cost_model.npz").exists()


def test_resume_from_database(tuned, tmp_path):
    func, work, _ = tuned
    again = tmp_path / "again"
    shutil.copytree(work, again)
    before = Database(again).get_top_k(Database(again).workloads[0], "llvm", 1)[0].mean_secs
    db = tune_tir(func, "llvm", max_trials=6, work_dir=again, num_trials_per_iter=6,
                  space=small_space(), runner=fast_runner(), seed=1, progress=False,
                  search=SEARCH)
    assert len(db) == 18
    assert "resuming; the database's best" in (again / "tune.log").read_text()
    assert db.get_top_k(db.workloads[0], "llvm", 1)[0].mean_secs <= before
    # the new trials are new schedules
    traces = [json.dumps(r.trace.to_json(), sort_keys=True) for r in db.get_all_tuning_records()]
    assert len(set(traces)) == len(traces)


def test_symbolic_n_serves_every_n(tmp_path):
    n = te.var("n")
    func = gemm_func(n, 48, 32)
    db = tune_tir(func, "llvm", max_trials=6, work_dir=tmp_path, num_trials_per_iter=6,
                  space=small_space(), runner=fast_runner(), shape_hints={"n": 64}, seed=2,
                  progress=False, search=SEARCH)
    rec = db.get_top_k(db.workloads[0], "llvm", 1)[0]
    assert rec.shape_vars == {"n": 64}
    sch = apply_best(db, func, "llvm")
    mod = targets.build(sch.mod, "llvm")
    rng = np.random.default_rng(1)
    for rows in (1, 5, 64, 300):
        a = rng.uniform(-1, 1, (rows, 32)).astype("float32")
        b = rng.uniform(-1, 1, (32, 48)).astype("float32")
        c = np.zeros((rows, 48), "float32")
        mod["main"](a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4, err_msg=f"n={rows}")


def test_nothing_to_tune_warns_and_records(tmp_path):
    A = te.placeholder((16,), "float32", "A")
    B = te.compute((16,), lambda i: A[i] + 1.0, "B")
    func = te.create_prim_func([A, B])
    with pytest.warns(RuntimeWarning, match="nothing to tune"):
        db = tune_tir(func, "llvm", max_trials=8, work_dir=tmp_path,
                      space=SpaceGenerator(rules=[AutoInline()]), runner=fast_runner(),
                      progress=False)
    assert len(db) == 1 and db.get_all_tuning_records()[0].ok
    assert "design space is exhausted after 1 trials" in (tmp_path / "tune.log").read_text()
    assert apply_best(db, func, "llvm") is not None


def test_candidates_measured_without_a_check_say_so(tmp_path, monkeypatch):
    """No reference output: the candidates are still measured, every record says
    checked=false, and tune.log warns once for the task."""
    from tilecraft.metaschedule import tune as tune_module
    monkeypatch.setattr(tune_module, "compute_reference", lambda *args, **kw: None)
    db = tune_tir(gemm_func(32, 32, 32), "llvm", max_trials=4, work_dir=tmp_path,
                  num_trials_per_iter=2, space=small_space(), runner=fast_runner(), seed=1,
                  progress=False, search=SEARCH, remeasure=0)
    recs = db.get_all_tuning_records()
    assert len(recs) == 4 and any(r.ok for r in recs)
    assert all(r.checked is False for r in recs)
    log = (tmp_path / "tune.log").read_text()
    assert log.count("main: candidates are measured WITHOUT a correctness check (no reference "
                     "output could be computed for it)") == 1


def test_unsupported_target(tmp_path):
    func = gemm_func(16, 16, 16)
    with pytest.raises((TuneError, targets.TargetError), match="cuda"):
        tune_tir(func, "cuda", max_trials=4, work_dir=tmp_path, progress=False)


def test_unreachable_runner(tmp_path):
    from tilecraft.metaschedule.rpc_runner import RPCRunner
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runner = RPCRunner(("127.0.0.1", port), key="nobody", request_timeout=2,
                       session_timeout=2, timeout_sec=2)
    with pytest.raises(TuneError, match="cannot reach the tracker"):
        tune_tir(gemm_func(16, 16, 16), "llvm", max_trials=2, work_dir=tmp_path,
                 num_trials_per_iter=2, space=small_space(), runner=runner, progress=False,
                 search={"population_size": 4, "genetic_num_iters": 0})


def test_bad_arguments(tmp_path):
    func = gemm_func(16, 16, 16)
    with pytest.raises(ValueError, match="max_trials"):
        tune_tir(func, "llvm", max_trials=0, work_dir=tmp_path)
    with pytest.raises(TuneError, match="no tasks"):
        tune_tasks([], "llvm", 4, work_dir=tmp_path)
    with pytest.raises(ValueError, match="weight"):
        Task("t", func, weight=0)
    with pytest.raises(TuneError, match="shape_hints"):
        Task("t", func, shape_hints={"m": 3})
    with pytest.raises(ValueError, match="cost_model"):
        tune_tir(func, "llvm", 2, work_dir=tmp_path, cost_model="svm", progress=False)
    with pytest.raises(TypeError, match="Database"):
        apply_best("tune/", func, "llvm")


def test_gradient_task_scheduler():
    s = GradientTaskScheduler(seed=0)
    # warm-up: every task once
    assert s.next_task([[], []], [1, 1], [False, False]) == 0
    assert s.next_task([[3.0], []], [1, 1], [False, False]) == 1
    # the task whose latency still falls (and weighs more) gets the trials
    hist = [[4.0, 2.0, 1.0, 0.5], [1.0, 1.0, 1.0, 1.0]]
    assert s.next_task(hist, [1, 1], [False, False]) == 0
    assert s.next_task(hist, [1, 100], [False, False]) == 1
    assert s.next_task(hist, [1, 1], [True, False]) == 1
    assert s.next_task(hist, [1, 1], [True, True]) is None
    rr = RoundRobin()
    assert [rr.next_task([], [1] * 3, [False, True, False]) for _ in range(3)] == [0, 2, 0]


def test_progress_line():
    line = format_line("gemm", 64, 256, 1e-3, 2e9, 75)
    assert line == "gemm: 64/256 trials  best 1 ms  2000 GFLOP/s  ETA 1m15s"
    assert format_line("x", 0, 8, None, 0, None) == "x: 0/8 trials  best -  ETA ?"
    assert format_eta(7300) == "2h01m"


def test_progress_bar_and_plain_line():
    import io
    from tilecraft.metaschedule.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    import_or_require("tqdm", "pip install tilecraft")   # the live bar
    term = Terminal()
    p = Progress(["gemm"], [64], [2e9], stream=term)
    assert p.bars is not None
    p.update(0, 32, 1e-3, 32, 64)
    p.close()
    assert "32/64" in term.getvalue() and "2000 GFLOP/s" in term.getvalue()
    plain = io.StringIO()                       # not a terminal: one plain line per update
    p = Progress(["gemm"], [64], [2e9], stream=plain)
    assert p.bars is None
    p.update(0, 32, 1e-3, 32, 64)
    assert plain.getvalue().startswith("gemm: 32/64 trials  best 1 ms  2000 GFLOP/s  ETA")
    quiet = io.StringIO()
    Progress(["gemm"], [64], [2e9], enabled=False, stream=quiet).update(0, 1, None, 1, 64)
    assert quiet.getvalue() == ""


def test_plot_without_matplotlib_is_a_clear_error(tuned, monkeypatch):
    import sys
    _, work, _ = tuned
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=r"plot_tuning_curve needs matplotlib, which is not "
                                          r"installed: pip install 'tilecraft\[bench\]'"):
        plot_tuning_curve(work)
    with pytest.raises(FileNotFoundError, match="no work_dir"):
        tuning_curve(work / "missing")
