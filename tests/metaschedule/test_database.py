"""metaschedule.Database: JSON-lines files that survive kills, corrupt lines and concurrent use;
workload hashes stable across processes; ArgInfo and random inputs."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.metaschedule.arg_info import (ArgInfo, args_info, output_indices, random_inputs,
                                   reference_outputs)
from tilecraft.metaschedule.database import (RECORDS_FILE, SCHEMA_VERSION, WORKLOADS_FILE, Database,
                                   TuningRecord, Workload, workload_hash)
from tilecraft.tensorir import Schedule, te

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gemm(n=32, m=None, dtype="float32"):
    m = m if m is not None else n
    A = te.placeholder((n, 16), dtype, "A")
    B = te.placeholder((16, m), dtype, "B")
    k = te.reduce_axis((0, 16), "k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def split_trace(func, factor):
    sch = Schedule(func)
    i, _, _ = sch.get_loops(sch.get_block("C"))
    sch.split(i, [None, factor])
    return sch.trace


def record(wl, factor, secs, target="llvm", error=None):
    return TuningRecord(split_trace(wl.func, factor), wl, target,
                        None if secs is None else list(secs), error=error,
                        args_info=args_info(wl.func), shape_vars={})


# -- hashing -------------------------------------------------------------------------------------
def test_workload_hash_is_structural_and_stable_across_processes():
    h = workload_hash(gemm())
    assert h == workload_hash(gemm()) and len(h) == 32
    assert h != workload_hash(gemm(dtype="float16"))
    assert h != workload_hash(gemm(n=33))
    assert h != workload_hash(gemm().with_attr("tir.noalias", True))
    assert h == workload_hash(gemm().with_attr("global_symbol", "fused_matmul"))
    n = te.var("n")
    sym = workload_hash(gemm(n=n))
    assert sym == workload_hash(gemm(n=te.var("rows")))   # names of defined vars do not matter
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {REPO!r}); sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_database import gemm
        from tilecraft.metaschedule.database import workload_hash
        print(workload_hash(gemm()))
    """)
    for seed in ("0", "12345"):  # Python's own hash() differs between these processes
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONHASHSEED=seed), timeout=120, check=True)
        assert out.stdout.strip() == h


# -- the basics ----------------------------------------------------------------------------------
def test_records_round_trip_and_top_k(tmp_path):
    db = Database(tmp_path)
    wl = db.commit_workload(gemm())
    assert db.commit_workload(gemm()) is wl and db.has_workload(gemm())
    assert not db.has_workload(gemm(n=8))
    db.commit_tuning_record(record(wl, 4, [3e-3, 3e-3]))
    db.commit_tuning_record(record(wl, 8, [1e-3, 2e-3]))
    db.commit_tuning_record(record(wl, 16, None, error="the build failed: boom"))
    db.commit_tuning_record(record(wl, 2, [0.5e-3], target="raspberry-pi/4b-aarch64"))
    assert len(db) == 4
    top = db.get_top_k(wl, "llvm", 5)
    assert [r.mean_secs for r in top] == [1.5e-3, 3e-3]       # failed ones are left out
    assert db.get_top_k(wl, "llvm", 0) == []

    again = Database(tmp_path)                                 # a fresh process would see this
    assert len(again) == 4
    recs = again.get_all_tuning_records()
    assert recs[2].error == "the build failed: boom" and recs[2].run_secs is None
    assert recs[0].args_info == [ArgInfo((32, 16), "float32"), ArgInfo((16, 32), "float32"),
                                 ArgInfo((32, 32), "float32")]
    # a tag is stored as its canonical target string
    arm = again.get_top_k(wl, "raspberry-pi/4b-aarch64", 1)
    assert arm[0].target == str(targets.Target("raspberry-pi/4b-aarch64"))
    assert again.get_top_k(wl, targets.Target("raspberry-pi/4b-aarch64"), 1)[0].run_secs == [5e-4]

    # query_schedule replays the best trace (factor 8) on the given function
    func = gemm()
    sch = again.query_schedule(func, "llvm")
    assert sch is not None
    assert [i.inputs[1] for i in sch.trace if i.kind == "split"] == [[None, 8]]
    loops = sch.get_loops(sch.get_block("C"))
    assert len(loops) == 4
    assert again.query_schedule(gemm(n=8), "llvm") is None
    assert again.query_schedule(func, "llvm -mcpu=skylake") is None
    # the loaded workload parses back from its stored text
    assert workload_hash(again.workloads[0].func) == wl.shash


def test_query_schedule_builds_a_correct_kernel(tmp_path, rng):
    db = Database(tmp_path)
    wl = db.commit_workload(gemm())
    db.commit_tuning_record(record(wl, 8, [1e-3]))
    sch = Database(tmp_path).query_schedule(gemm(), "llvm")
    mod = targets.build(sch.mod, "llvm")
    a = rng.uniform(-1, 1, (32, 16)).astype("float32")
    b = rng.uniform(-1, 1, (16, 32)).astype("float32")
    c = np.empty((32, 32), "float32")
    mod["main"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_every_line_has_the_schema_version(tmp_path):
    db = Database(tmp_path)
    wl = db.commit_workload(gemm())
    db.commit_tuning_record(record(wl, 4, [1e-3]))
    for name in (WORKLOADS_FILE, RECORDS_FILE):
        lines = (tmp_path / name).read_text().splitlines()
        assert lines and all(json.loads(l)["v"] == SCHEMA_VERSION for l in lines)
    rec = json.loads((tmp_path / RECORDS_FILE).read_text().splitlines()[0])
    assert rec["workload"] == wl.shash and rec["target"] == "llvm"
    assert rec["run_secs"] == [1e-3] and rec["trace"]["instructions"][0][0] == "get_block"


def test_bad_records_are_refused(tmp_path):
    db = Database(tmp_path)
    wl = db.commit_workload(gemm())
    with pytest.raises(ValueError, match="finite"):
        db.commit_tuning_record(record(wl, 4, [float("nan")]))
    with pytest.raises(TypeError, match="TuningRecord"):
        db.commit_tuning_record({"trace": None})
    assert len(db) == 0


# -- corrupt files ------------------------------------------------------------------------------
def _fill(tmp_path, count):
    db = Database(tmp_path)
    wl = db.commit_workload(gemm())
    for i in range(count):
        db.commit_tuning_record(record(wl, 2 ** (i % 4 + 1), [(i + 1) * 1e-4]))
    return wl


def test_a_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    _fill(tmp_path, 5)
    path = tmp_path / RECORDS_FILE
    data = path.read_bytes()
    path.write_bytes(data[:-40])                  # the last write was cut short
    with pytest.warns(RuntimeWarning, match=rf"{RECORDS_FILE}:5: .*truncated last line"):
        db = Database(tmp_path)
    assert len(db) == 4
    # appending after the broken line keeps the new record whole
    db.commit_tuning_record(record(db.workloads[0], 2, [1e-5]))
    with pytest.warns(RuntimeWarning, match=rf"{RECORDS_FILE}:5: "):
        again = Database(tmp_path)
    assert len(again) == 5 and again.get_top_k(again.workloads[0], "llvm", 1)[0].run_secs == [1e-5]


def test_garbage_lines_are_skipped_and_named(tmp_path):
    _fill(tmp_path, 3)
    path = tmp_path / RECORDS_FILE
    lines = path.read_text().splitlines()
    lines.insert(1, "\x00\x00garbage{{")
    lines.insert(3, json.dumps({"v": 99, "workload": "x"}))            # a newer schema
    lines.insert(4, json.dumps({"v": 1, "workload": "0" * 32, "target": "llvm"}))  # unknown wl
    lines.insert(5, json.dumps({"v": 1, "workload": json.loads(lines[0])["workload"],
                                "target": "llvm", "trace": "not a trace", "run_secs": [1]}))
    lines.insert(6, "[1, 2, 3]")
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / WORKLOADS_FILE).open("a").write('{"v": 1, "shash": 5}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db = Database(tmp_path)
    text = "\n".join(str(w.message) for w in caught)
    assert len(db) == 3
    for lineno in (2, 4, 5, 6, 7):
        assert f"{RECORDS_FILE}:{lineno}: skipping a corrupt database line" in text
    assert "schema version 99" in text and "not JSON" in text
    assert f"{WORKLOADS_FILE}:2:" in text
    assert len(caught) == 6


# -- crashes and concurrency -----------------------------------------------------------------------
WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r}); sys.path.insert(0, {here!r})
    from test_database import gemm, record
    from tilecraft.metaschedule.database import Database
    db = Database(sys.argv[1])
    wl = db.commit_workload(gemm())
    i = 0
    while True:
        db.commit_tuning_record(record(wl, 2 ** (i % 4 + 1), [(i + 1) * 1e-6]))
        i += 1
        print(i, flush=True)
""")


def _start_writer(tmp_path, work_dir):
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(repo=REPO, here=os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen([sys.executable, str(script), str(work_dir)], stdout=subprocess.PIPE,
                            text=True)


def test_a_writer_killed_mid_run_loses_at_most_the_record_in_flight(tmp_path):
    work = tmp_path / "db"
    total = 0
    for attempt in range(3):  # kill at three different moments
        proc = _start_writer(tmp_path, work)
        acknowledged = 0
        target = 10 + 7 * attempt
        while acknowledged < target:
            line = proc.stdout.readline()
            assert line, "the writer died"
            acknowledged = int(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a kill mid-write leaves a truncated line
            db = Database(work)
        # every record the writer reported as committed is there (plus at most the one it was
        # writing when killed), and nothing is garbled
        assert total + acknowledged <= len(db) <= total + acknowledged + 1
        assert all(r.ok and r.trace.instructions for r in db.get_all_tuning_records())
        total = len(db)
    assert total >= 10 + 17 + 24
    # the database resumes: the best record is the first one ever written
    assert Database(work).get_top_k(gemm(), "llvm", 1)[0].run_secs == [1e-6]


def test_concurrent_readers_see_a_consistent_growing_log(tmp_path):
    work = tmp_path / "db"
    proc = _start_writer(tmp_path, work)
    try:
        assert proc.stdout.readline()
        readers = [Database(work) for _ in range(3)]
        seen = [0] * 3
        deadline = time.monotonic() + 2
        with warnings.catch_warnings():
            warnings.simplefilter("error")          # no reader ever sees a broken line
            while time.monotonic() < deadline:
                for k, db in enumerate(readers):
                    n = len(db)                      # picks up what the writer appended
                    assert n >= seen[k]
                    seen[k] = n
                    top = db.get_top_k(gemm(), "llvm", 1)
                    assert top and top[0].run_secs == [1e-6]
                assert len(Database(work)) >= max(seen)
                time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert min(seen) > 5


def test_two_processes_append_to_one_database(tmp_path):
    work = tmp_path / "db"
    procs = [_start_writer(tmp_path, work) for _ in range(2)]
    try:
        counts = [0, 0]
        while min(counts) < 15:
            for k, p in enumerate(procs):
                line = p.stdout.readline()
                assert line
                counts[k] = int(line)
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = Database(work)
    assert len(db) >= 30 and len(db.workloads) == 1
    assert all(r.ok for r in db.get_all_tuning_records())


_TASK_WRITER = """
import sys
sys.path.insert(0, sys.argv[1])
from tilecraft.metaschedule.database import Database
db = Database(sys.argv[2])
me = sys.argv[3]
print("ready", flush=True)
sys.stdin.readline()                      # all start together
for i in range(int(sys.argv[4])):
    db.merge_tasks([{"name": f"{me}-{i}", "shash": f"{me}-{i:04d}", "weight": 1}])
"""


def test_tuners_sharing_a_work_dir_keep_each_others_tasks(tmp_path):
    """Three processes each add tasks one by one to one tasks.json (a read-merge-write each):
    under the records' lock none is lost."""
    script = tmp_path / "task_writer.py"
    script.write_text(_TASK_WRITER)
    work = tmp_path / "db"
    Database(work)
    n = 25
    procs = [subprocess.Popen([sys.executable, str(script), REPO, str(work), f"w{k}", str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for k in range(3)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            p.kill()
    tasks = json.loads((work / "tasks.json").read_text())["tasks"]
    assert sorted(t["shash"] for t in tasks) == sorted(f"w{k}-{i:04d}" for k in range(3)
                                                       for i in range(n))
    assert not [f for f in os.listdir(work) if f.startswith(".tasks.")]   # no leftovers
    with pytest.raises(ValueError, match="shash"):
        Database(work).merge_tasks([{"name": "no hash"}])


def test_records_say_whether_their_output_was_checked(tmp_path):
    db = Database(tmp_path)
    wl = db.commit_workload(gemm())
    for factor, checked in ((4, True), (8, False), (16, None)):
        rec = record(wl, factor, [1e-3])
        rec.checked = checked
        db.commit_tuning_record(rec)
    lines = [json.loads(x) for x in (tmp_path / RECORDS_FILE).read_text().splitlines()]
    assert [x["checked"] for x in lines] == [True, False, None]
    # a line written before the field existed loads as "unknown"
    old = dict(lines[0])
    del old["checked"]
    with open(tmp_path / RECORDS_FILE, "a") as f:
        f.write(json.dumps(old) + "\n")
    assert [r.checked for r in Database(tmp_path).get_all_tuning_records()] == \
        [True, False, None, None]


# -- arguments ------------------------------------------------------------------------------------
def test_args_info_random_inputs_and_outputs():
    n = te.var("n")
    c = te.var("c", "float32")
    A = te.placeholder((n, 4), "float32", "A")
    I = te.placeholder((n,), "int32", "I")
    B = te.compute((n, 4), lambda i, j: A[i, j] * c + I[i].astype("float32"), "B")
    func = te.create_prim_func([A, I, B, c])
    infos = args_info(func, {"n": 5})
    assert infos == [ArgInfo((5, 4), "float32"), ArgInfo((5,), "int32"),
                     ArgInfo((5, 4), "float32"), ArgInfo((), "float32", scalar=True)]
    assert output_indices(func) == [2]
    with pytest.raises(ValueError, match="give a value for n"):
        args_info(func)
    a = random_inputs(infos, seed=3)
    b = random_inputs(infos, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], random_inputs(infos, seed=4)[0])
    assert a[0].dtype == np.float32 and (np.abs(a[0]) <= 1).all()
    assert a[1].dtype == np.int32 and a[1].min() >= 0 and a[1].max() < 8
    assert a[3].shape == ()
    # an argument's values do not depend on the other arguments' shapes
    assert np.array_equal(random_inputs(args_info(func, {"n": 9}), 3)[3], a[3])
    ref, = reference_outputs(func, infos, seed=3)
    np.testing.assert_allclose(ref, a[0] * a[3] + a[1][:, None], rtol=1e-6)
    assert [ArgInfo.from_json(i.to_json()) for i in infos] == infos


def test_random_inputs_start_on_the_vm_alignment():
    """Kernels are timed on buffers aligned as the VM's: numpy's own 16-byte alignment made
    the tuner time vector loads straddling cache lines that the model never does."""
    from tilecraft.targets.runtime.ndarray import ALIGNMENT
    infos = [ArgInfo((7, 3), "float32"), ArgInfo((5,), "int8"), ArgInfo((33,), "float64"),
             ArgInfo((), "float32", scalar=True)]
    for seed in range(4):
        arrays = random_inputs(infos, seed)
        for a, info in zip(arrays, infos):
            assert a.ctypes.data % ALIGNMENT == 0
            assert a.shape == info.shape and a.flags.c_contiguous and a.flags.writeable


def test_random_inputs_are_the_same_in_another_process():
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {REPO!r})
        from tilecraft.metaschedule.arg_info import ArgInfo, random_inputs
        print(random_inputs([ArgInfo((4,), "float32"), ArgInfo((3,), "int64")], 11)[0].tobytes().hex())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    here = random_inputs([ArgInfo((4,), "float32"), ArgInfo((3,), "int64")], 11)[0]
    assert out.stdout.strip() == here.tobytes().hex()


@pytest.fixture
def rng():
    return np.random.default_rng(0)
