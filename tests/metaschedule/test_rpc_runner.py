"""RPCRunner on loopback trackers and servers (and on two emulated arm64 boards): candidates
measured on every board of a key, checked against the reference, and the faults of remote
tuning — a kernel that crashes or hangs on the board, a board killed mid-run, no board at all,
an unreachable tracker — each costing at most the trial in flight; ``tune_tir`` through the
runner on two loopback servers and on two emulated boards.

The emulated boards (``rpc/board/emulated_board.py``) run the wheel installed the board's way;
the ``arm64_board`` fixture (tests/conftest.py) builds their root file system when it is
missing, and without qemu / mmdebstrap the tests are skipped (under ``CI=true``: fail)."""
import os
import sys
import threading
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "rpc"))   # the rpc tests' process helpers

from tilecraft import rpc  # noqa: E402
from tilecraft.metaschedule import TuneError  # noqa: E402
from tilecraft.metaschedule.arg_info import ArgInfo, args_info, reference_outputs  # noqa: E402
from tilecraft.metaschedule.builder import BuilderInput, LocalBuilder, remove_artifact  # noqa: E402
from tilecraft.metaschedule.rpc_runner import RPCRunner  # noqa: E402
from tilecraft.metaschedule.runner import RunnerInput  # noqa: E402
from rpc_testutil import HOST, Proc, start_server, start_tracker, wait_until  # noqa: E402
from tilecraft.tensorir import Schedule, te  # noqa: E402

from capabilities import LLD, requires  # noqa: E402
from measure_testutil import ELEMWISE_INFOS, build_faulty_libraries  # noqa: E402

KEY = "ms-test"


def gemm(n=64, k=32):
    A = te.placeholder((n, k), "float32", "A")
    B = te.placeholder((k, n), "float32", "B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), "C")
    return te.create_prim_func([A, B, C])


def split_gemms(factors, n=64, k=32):
    mods = []
    for f in factors:
        sch = Schedule(gemm(n, k))
        i, j, _ = sch.get_loops(sch.get_block("C"))
        io, ii = sch.split(i, [None, f])
        jo, ji = sch.split(j, [None, 8])
        sch.vectorize(ji)
        mods.append(sch.mod)
    return mods


@pytest.fixture(scope="module")
def builder():
    b = LocalBuilder(timeout_sec=120)
    yield b
    b.close()


@pytest.fixture
def cluster():
    """A loopback tracker and ``cluster.add(n)`` servers of KEY registered with it."""
    procs = []

    class Cluster:
        def __init__(self):
            self.tracker = start_tracker("--ping-interval", "1", "--ping-timeout", "2")
            procs.append(self.tracker)
            self.client = rpc.connect_tracker(HOST, self.tracker.port)
            self.servers = []

        def add(self, n, *args):
            new = [start_server(*args, key=KEY, tracker=self.tracker.port) for _ in range(n)]
            procs.extend(new)
            self.servers.extend(new)
            want = len(self.servers)
            wait_until(lambda: self.client.summary()["queue_info"].get(KEY, {}).get("free")
                       == want, 30, f"{want} servers to register")
            return new

        def runner(self, **kw):
            kw.setdefault("timeout_sec", 10)
            kw.setdefault("min_repeat_ms", 0)
            kw.setdefault("cleanup", False)
            return RPCRunner((HOST, self.tracker.port), KEY, **kw)

    yield Cluster()
    for p in procs:
        p.stop()


def _inputs(built, func, seed=0, target="llvm"):
    infos = args_info(func)
    ref = reference_outputs(func, infos, seed)
    return [RunnerInput(b.artifact_path, target, infos, {}, seed, ref) for b in built]


def _sessions(server) -> int:
    return server.stderr().count(" from 127.0.0.1:")


def test_two_servers_measure_a_batch_and_check_it(cluster, builder):
    a, b = cluster.add(2)
    built = builder.build([BuilderInput(m, "llvm") for m in split_gemms([1, 4, 16])])
    assert all(r.error_msg is None for r in built)
    runner = cluster.runner(number=2, repeat=2, min_repeat_ms=20)
    ins = _inputs(built * 2, gemm())   # cleanup=False: an artifact may be measured twice
    ins.append(RunnerInput(built[0].artifact_path, "llvm", ins[0].args_info, {}, 1,
                           ins[0].reference))            # checked against another seed's result
    res = runner.run(ins)
    assert runner.last_num_workers == 2
    for r in res[:6]:
        assert r.error_msg is None, r.error_msg
        assert len(r.run_secs) == 2 and all(t > 0 for t in r.run_secs)
    assert res[6].wrong and "output C differs from the reference" in res[6].error_msg
    # both boards did work, and both are back in the pool
    assert _sessions(a) >= 1 and _sessions(b) >= 1
    wait_until(lambda: cluster.client.summary()["queue_info"][KEY]["free"] == 2, 30,
               "the boards back in the pool")
    for r in built:
        remove_artifact(r.artifact_path)


def test_a_crashing_or_hanging_kernel_on_the_board_fails_only_its_trial(cluster, builder,
                                                                       tmp_path):
    libs = build_faulty_libraries(tmp_path)
    junk = tmp_path / "junk.so"
    junk.write_bytes(os.urandom(2048))
    (server,) = cluster.add(1)
    good, = builder.build([BuilderInput(split_gemms([4])[0], "llvm")])
    ok = _inputs([good], gemm())[0]
    runner = cluster.runner(timeout_sec=2)
    res = runner.run([RunnerInput(libs["crash"], "llvm", ELEMWISE_INFOS), ok,
                      RunnerInput(libs["spin"], "llvm", ELEMWISE_INFOS), ok,
                      RunnerInput(str(junk), "llvm", ok.args_info), ok,
                      RunnerInput(None, "llvm", ok.args_info),
                      RunnerInput(good.artifact_path, "llvm", ok.args_info[:2])])
    assert "ended during the measurement" in res[0].error_msg and "SIGSEGV" in res[0].error_msg
    assert "time limit" in res[2].error_msg
    assert "cannot load" in res[4].error_msg
    assert "the build failed" in res[6].error_msg
    assert "takes 3 arguments" in res[7].error_msg
    for r in (res[1], res[3], res[5]):
        assert r.error_msg is None and r.run_secs
    assert server.alive()
    remove_artifact(good.artifact_path)


def test_a_board_killed_mid_run_costs_at_most_the_trial_in_flight(cluster, builder):
    a, b = cluster.add(2)
    mods = split_gemms([4, 16], n=128, k=64)
    built = builder.build([BuilderInput(m, "llvm") for m in mods])
    runner = cluster.runner(number=1, repeat=2, min_repeat_ms=60, request_timeout=20)
    killer = threading.Timer(0.6, b.stop)
    killer.start()
    start = time.monotonic()
    res = runner.run(_inputs(built * 4, gemm(128, 64)))
    elapsed = time.monotonic() - start
    killer.join()
    assert not b.alive()
    failed = [r for r in res if r.error_msg is not None]
    assert len(failed) <= 1, [r.error_msg for r in failed]
    for r in failed:
        assert "during the measurement" in r.error_msg and not r.wrong
    assert len(res) - len(failed) >= 7 and all(r.run_secs for r in res if r.error_msg is None)
    assert elapsed < 60
    # the tracker dropped the dead board; the survivor is free again, and a new run uses it
    wait_until(lambda: cluster.client.summary()["queue_info"][KEY] == {"free": 1, "pending": 0,
                                                                        "total": 1},
               30, "the tracker to drop the dead board")
    r, = runner.run(_inputs(built[:1], gemm(128, 64)))
    assert r.error_msg is None and runner.last_num_workers == 1
    for x in built:
        remove_artifact(x.artifact_path)


def test_when_every_board_is_gone_the_rest_fail_with_the_reason(cluster, builder):
    (a,) = cluster.add(1)
    built = builder.build([BuilderInput(m, "llvm") for m in split_gemms([4], n=128, k=64)])
    runner = cluster.runner(number=1, repeat=1, min_repeat_ms=200, request_timeout=3)
    killer = threading.Timer(0.5, a.stop)
    killer.start()
    start = time.monotonic()
    res = runner.run(_inputs(built * 4, gemm(128, 64)))
    killer.join()
    assert time.monotonic() - start < 40
    assert sum(r.error_msg is not None for r in res) >= 2
    assert any("no board of key" in (r.error_msg or "") for r in res)
    for x in built:
        remove_artifact(x.artifact_path)


def test_no_tracker_or_no_board_is_a_clear_error(cluster):
    closed = RPCRunner((HOST, 1), KEY, request_timeout=1)
    dummy = [RunnerInput("/nonexistent.so", "llvm", [ArgInfo((1,), "float32")])]
    with pytest.raises(TuneError, match="cannot reach the tracker at 127.0.0.1:1"):
        closed.run(dummy)
    with pytest.raises(TuneError, match=f"no server of key '{KEY}' registered"):
        cluster.runner(request_timeout=0.5).run(dummy)
    assert cluster.runner().run([RunnerInput(None, "llvm", [])])[0].error_msg.startswith("no art")
    with pytest.raises(ValueError, match="HOST:PORT"):
        RPCRunner("localhost", KEY)


def test_remote_time_evaluator_flushes_the_board_caches(cluster, builder, rng):
    cluster.add(1)
    built, = builder.build([BuilderInput(split_gemms([8])[0], "llvm")])
    with cluster.client.request(KEY, timeout=30) as sess:
        mod = sess.load_module(sess.upload(built.artifact_path))
        a = sess.array(rng.uniform(-1, 1, (64, 32)).astype("float32"))
        b = sess.array(rng.uniform(-1, 1, (32, 64)).astype("float32"))
        c = sess.empty((64, 64), "float32")
        warm = mod.time_evaluator("main", sess.cpu(0), number=1, repeat=5)(a, b, c)
        cold = mod.time_evaluator("main", sess.cpu(0), number=1, repeat=5,
                                  cache_flush_bytes=16 << 20)(a, b, c)
        assert len(cold.results) == 5 and all(t > 0 for t in cold.results + warm.results)
        with pytest.raises(ValueError, match="cache_flush_bytes"):
            mod.time_evaluator("main", sess.cpu(0), cache_flush_bytes=-1)(a, b, c)
        assert sess.info()["machine"]          # the session goes on
    remove_artifact(built.artifact_path)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# -- two emulated arm64 boards ------------------------------------------------------------------------
BOARD_KEY = "ms-emulated-arm64"


@pytest.fixture(scope="module")
def two_boards(arm64_board):
    requires(*LLD)   # links the aarch64 kernels
    tracker = start_tracker("--ping-interval", "2", "--ping-timeout", "10")
    boards = []
    try:
        for _ in range(2):
            cmd = arm64_board.server_command("--host", HOST, "--port", "0", "--key", BOARD_KEY,
                                             "--tracker", f"{HOST}:{tracker.port}",
                                             "--tracker-retry", "0.5", "--insecure-local", "-v")
            boards.append(Proc(cmd, env=arm64_board.env(), cwd=arm64_board.path,
                               ready_timeout=180, wait=False))
        for p in boards:
            p.ready()
        client = rpc.connect_tracker(HOST, tracker.port)
        wait_until(lambda: client.summary()["queue_info"].get(BOARD_KEY, {}).get("free") == 2,
                   120, "two emulated boards to register")
        yield tracker, boards
    finally:
        for p in boards:
            p.stop()
        tracker.stop()


def test_aarch64_candidates_measured_on_two_emulated_boards(two_boards, builder):
    """Emulated-board timings are not performance figures: qemu translates every instruction."""
    tracker, boards = two_boards
    target = "raspberry-pi/4b-aarch64"
    built = builder.build([BuilderInput(m, target) for m in split_gemms([1, 4, 16, 64])])
    assert all(r.error_msg is None for r in built), [r.error_msg for r in built]
    runner = RPCRunner((HOST, tracker.port), BOARD_KEY, timeout_sec=60, number=2, repeat=1,
                       min_repeat_ms=0, cache_flush_bytes=1 << 20, request_timeout=120,
                       session_timeout=120)
    res = runner.run(_inputs(built, gemm(), seed=3, target=target))
    assert runner.last_num_workers == 2
    for r in res:
        assert r.error_msg is None, r.error_msg
        assert r.run_secs and r.run_secs[0] > 0
    assert all(_sessions(p) >= 1 for p in boards)    # both boards measured


# -- tune_tir through the RPCRunner ----------------------------------------------------------------
TUNE_SEARCH = {"population_size": 8, "genetic_num_iters": 1}


def _check_tuned(db, func, target, trials, rng):
    """Every trial is in the database; the ones that ran were checked against the reference on
    the board; the best schedule computes A @ B."""
    from tilecraft import targets
    from tilecraft.metaschedule import apply_best
    recs = db.get_all_tuning_records()
    assert len(recs) == trials
    ok = [r for r in recs if r.ok]
    assert len(ok) >= trials // 2, [r.error for r in recs]
    assert all(r.target == str(targets.Target(target)) for r in recs)
    sch = apply_best(db, func, target)
    assert sch is not None
    mod = targets.build(sch.mod, "llvm")     # the same schedule, for this machine
    a = rng.uniform(-1, 1, (64, 32)).astype("float32")
    b = rng.uniform(-1, 1, (32, 64)).astype("float32")
    c = np.empty((64, 64), "float32")
    mod["main"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_tune_tir_over_two_loopback_servers(cluster, tmp_path, rng):
    from tilecraft.metaschedule import tune_tir
    from search_testutil import small_space
    a, b = cluster.add(2)
    runner = cluster.runner(number=2, repeat=1, min_repeat_ms=0, cache_flush_bytes=1 << 20,
                            cleanup=True)
    func = gemm()
    db = tune_tir(func, "llvm", max_trials=8, work_dir=tmp_path, num_trials_per_iter=4,
                  space=small_space(), runner=runner, seed=0, progress=False,
                  search=TUNE_SEARCH)
    assert runner.last_num_workers == 2
    assert _sessions(a) >= 1 and _sessions(b) >= 1
    _check_tuned(db, func, "llvm", 8, rng)


def test_tune_tir_on_two_emulated_boards(two_boards, tmp_path, rng):
    """The short remote tune of the RPC issue: candidates cross-compiled for a Raspberry Pi 4
    here, measured and checked on two emulated arm64 boards (about 20 s; the boards start in
    seconds from their precompiled root)."""
    from tilecraft.metaschedule import tune_tir
    from search_testutil import small_space
    tracker, boards = two_boards
    target = "raspberry-pi/4b-aarch64"
    runner = RPCRunner((HOST, tracker.port), BOARD_KEY, timeout_sec=60, number=2, repeat=1,
                       min_repeat_ms=0, cache_flush_bytes=1 << 20, request_timeout=120,
                       session_timeout=120)
    func = gemm()
    db = tune_tir(func, target, max_trials=8, work_dir=tmp_path, num_trials_per_iter=4,
                  space=small_space(), runner=runner, seed=0, progress=False,
                  search=TUNE_SEARCH)
    assert runner.last_num_workers == 2
    _check_tuned(db, func, target, 8, rng)
