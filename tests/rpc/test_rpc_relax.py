"""Relax executables on a board through RPC: the ``relax.rpc_plugin`` plugin.

A loopback server started with ``--plugin tilecraft.relax.rpc_plugin`` loads an exported MLP (a
symbolic batch) and runs it; results are checked against numpy and the host's own VM. The last test
runs a model cross-compiled for ``raspberry-pi/4b-aarch64`` on the emulated arm64 board
(``rpc/board/emulated_board.py``, running the wheel installed the board's way; the
``arm64_board`` fixture of tests/conftest.py builds its root when it is missing).
"""
import gc
import sys

import numpy as np
import pytest

from tilecraft import relax
from tilecraft import rpc
from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const
from tilecraft.relax.executable import Executable
from tilecraft.relax.rpc_plugin import RemoteVirtualMachine, RemoteVMArgumentError
from tilecraft.targets import Target

from capabilities import LLD, requires
from rpc_testutil import (HOST, REPO, Proc, needs_lld, repo_env, start_server, start_tracker,
                          wait_until)

IN, HIDDEN, OUT = 16, 32, 8


def mlp_weights(seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal((IN, HIDDEN)).astype("float32") / 4,
            r.standard_normal(HIDDEN).astype("float32"),
            r.standard_normal((HIDDEN, OUT)).astype("float32") / 4,
            r.standard_normal(OUT).astype("float32"))


def mlp_module(weights):
    """relu(x @ w1 + b1) @ w2 + b2 over x: (n, 16), n symbolic."""
    w1, b1, w2, b2 = weights
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", IN), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, const(w1)))
            h = bb.emit(relax.op.nn.relu(relax.op.add(h, const(b1))))
            y = bb.emit(relax.op.add(relax.op.matmul(h, const(w2)), const(b2)))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get()


def mlp_numpy(x, weights):
    w1, b1, w2, b2 = weights
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


@pytest.fixture(scope="module")
def weights():
    return mlp_weights()


@pytest.fixture(scope="module")
def host_exe(weights, tmp_path_factory):
    requires(*LLD)   # relax executables are linked with it
    exe = relax.build(mlp_module(weights), "llvm")
    path = tmp_path_factory.mktemp("rpc-relax") / "mlp.tcx"
    exe.export_library(str(path))
    return exe, str(path)


@pytest.fixture(scope="module")
def server():
    p = start_server("--plugin", "tilecraft.relax.rpc_plugin", "--max-sessions", "4", key="relax-test")
    yield p
    p.stop()


@pytest.fixture
def sess(server):
    with rpc.connect(HOST, server.port, timeout=10, call_timeout=30) as s:
        yield s


def test_an_exported_mlp_runs_on_the_board_like_on_the_host(sess, host_exe, weights, rng):
    exe, path = host_exe
    assert "relax.vm_call" in sess.plugins and "relax.vm_call" in sess.info()["plugins"]
    vm = RemoteVirtualMachine(sess, sess.upload(path))
    assert vm.function_names == ["main"] and vm["main"].params == ["x"]
    assert vm.target == exe.target
    local = relax.VirtualMachine(relax.load_executable(path), targets.cpu(0))
    for n in (1, 5, 13):
        x = rng.standard_normal((n, IN)).astype("float32")
        y = vm["main"](x)
        assert isinstance(y, np.ndarray) and y.shape == (n, OUT) and y.dtype == np.float32
        np.testing.assert_array_equal(y, local["main"](x).numpy())
        np.testing.assert_allclose(y, mlp_numpy(x, weights), rtol=1e-5, atol=1e-5)
    # inputs already on the board, outputs kept there, fed to the next call by handle
    x = rng.standard_normal((5, IN)).astype("float32")
    a = sess.array(x)
    r = vm["main"](a, outputs="remote")
    assert isinstance(r, rpc.RemoteNDArray) and r.shape == (5, OUT) and r.dtype == "float32"
    np.testing.assert_allclose(r.numpy(), mlp_numpy(x, weights), rtol=1e-5, atol=1e-5)
    remote_vm = RemoteVirtualMachine(sess, "mlp.tcx", outputs="remote")
    assert isinstance(remote_vm["main"](x), rpc.RemoteNDArray)
    np.testing.assert_allclose(remote_vm["main"](x, outputs="numpy"), mlp_numpy(x, weights),
                               rtol=1e-5, atol=1e-5)


def test_timing_and_profiling_run_on_the_board(sess, host_exe, rng):
    vm = RemoteVirtualMachine(sess, sess.upload(host_exe[1]))
    x = rng.standard_normal((5, IN)).astype("float32")
    res = vm.time_evaluator("main", number=5, repeat=3)(x)
    assert isinstance(res, targets.BenchmarkResult)
    assert len(res.results) == 3 and all(0 < t < 0.1 for t in res.results)
    res = vm.time_evaluator("main", sess.cpu(0), number=1, repeat=1, min_repeat_ms=2)(
        sess.array(x))
    assert res.mean > 0
    report = vm.profile(x, number=3)
    assert report.runs == 3 and report.rows[-1]["name"] == "(vm)"
    assert {r["name"] for r in report.rows[:-1]} <= set(host_exe[0].kernel_names)
    assert "profile of main" in str(report)
    with pytest.raises(ValueError, match="number and repeat"):
        vm.time_evaluator("main", number=0)
    with pytest.raises(KeyError, match="no function 'nope'"):
        vm.time_evaluator("nope")


def test_bad_inputs_are_value_errors_naming_the_argument_and_the_session_goes_on(
        sess, host_exe, weights, rng):
    vm = RemoteVirtualMachine(sess, sess.upload(host_exe[1]))
    local = relax.VirtualMachine(host_exe[0], targets.cpu(0))
    bad = rng.standard_normal((3, IN - 1)).astype("float32")
    with pytest.raises(ValueError) as remote_err:
        vm["main"](bad)
    with pytest.raises(ValueError) as local_err:
        local["main"](bad)
    assert str(remote_err.value) == str(local_err.value)  # the host's wording
    assert "argument x: dimension 1 is 15, expected 16" in str(remote_err.value)
    assert isinstance(remote_err.value, (relax.VMArgumentError, rpc.RemoteError))
    assert isinstance(remote_err.value, RemoteVMArgumentError)
    with pytest.raises(ValueError, match="argument x has dtype float64, expected float32"):
        vm["main"](rng.standard_normal((3, IN)))
    with pytest.raises(ValueError, match="argument x has rank 1"):
        vm["main"](np.ones(IN, "float32"))
    with pytest.raises(TypeError, match="takes 1 argument"):
        vm["main"](bad, bad)
    with pytest.raises(ValueError, match="argument x must be a tensor"):
        vm["main"](3)
    with pytest.raises(TypeError, match="argument 0 must be an array"):
        vm["main"]("not an array")
    with pytest.raises(KeyError, match="no function 'nope'"):
        vm["nope"]
    with pytest.raises(FileNotFoundError, match="no uploaded file 'missing.tcx'"):
        RemoteVirtualMachine(sess, "missing.tcx")
    with pytest.raises(ValueError, match="plain file name"):
        RemoteVirtualMachine(sess, "../mlp.tcx")
    sess.upload(b"not a zip at all", "junk.tcx")
    with pytest.raises(ValueError, match="not a tilecraft executable"):
        RemoteVirtualMachine(sess, "junk.tcx")
    # the session and the VM are still good
    x = rng.standard_normal((5, IN)).astype("float32")
    np.testing.assert_allclose(vm["main"](x), mlp_numpy(x, weights), rtol=1e-5, atol=1e-5)


@needs_lld
def test_a_cross_compiled_executable_is_refused_with_the_reason(sess, weights, tmp_path):
    exe = relax.build(mlp_module(weights), "llvm -mtriple=aarch64-linux-gnu")
    path = exe.export_library(str(tmp_path / "mlp-a64.tcx"))
    with pytest.raises(RuntimeError, match="holds kernels for a 64-bit aarch64 machine"):
        RemoteVirtualMachine(sess, sess.upload(path))
    assert sess.info()["machine"]


def test_dropped_vms_and_results_are_freed_on_the_board(sess, host_exe, rng):
    name = sess.upload(host_exe[1])
    x = rng.standard_normal((4, IN)).astype("float32")
    vm = RemoteVirtualMachine(sess, name, outputs="remote")
    out = vm["main"](x)
    vm_handle, out_handle = vm.handle, out.handle
    del vm, out
    gc.collect()
    sess.info()  # carries the frees
    with pytest.raises(ValueError, match=f"no Relax virtual machine with handle {vm_handle}"):
        sess.call_plugin("relax.vm_call", vm=vm_handle, function="main", inputs=[])
    with pytest.raises(ValueError, match=f"no array with handle {out_handle}"):
        sess._request("get", {"handle": out_handle})


def test_malformed_plugin_requests_are_errors_not_crashes(sess, host_exe):
    vm = RemoteVirtualMachine(sess, sess.upload(host_exe[1]))
    arr = sess.array(np.ones((2, IN), "float32"))
    for args, message in [({"vm": arr.handle, "function": "main"}, "is not a Relax virtual"),
                          ({"vm": vm.handle, "function": 7}, "function name must be a string"),
                          ({"vm": vm.handle, "function": "main", "inputs": [["t", 3]]},
                           "no array 3"),
                          ({"vm": vm.handle, "function": "main", "inputs": [["zz", 1]]},
                           "malformed value"),
                          ({"vm": vm.handle, "function": "main", "inputs": "x"}, "must be a list"),
                          ({"vm": vm.handle, "function": "main", "outputs": "gpu"},
                           "'numpy' or 'remote'")]:
        with pytest.raises(ValueError, match=message):
            sess.call_plugin("relax.vm_call", **args)
    with pytest.raises(rpc.RPCError, match="'args' must be a JSON object"):
        sess._request("relax.vm_call", {"args": [1, 2]})
    with pytest.raises(rpc.RPCError, match="has no blob"):
        sess._request("relax.vm_call", {"args": {}, "arrays": [{"dtype": "float32",
                                                                 "shape": [2]}]})
    with pytest.raises(ValueError, match="number and repeat"):
        sess.call_plugin("relax.vm_time", vm=vm.handle, function="main", number=0, inputs=[])
    assert vm["main"](arr).shape == (2, OUT)  # still serving


def test_a_server_without_the_plugin_says_how_to_start_one(host_exe):
    plain = start_server(key="no-plugin")
    try:
        with rpc.connect(HOST, plain.port, timeout=10) as s:
            assert s.plugins == [] and s.info()["plugins"] == []
            with pytest.raises(ValueError, match="--plugin tilecraft.relax.rpc_plugin"):
                RemoteVirtualMachine(s, s.upload(host_exe[1]))
            with pytest.raises(ValueError, match="has no operation 'relax.vm_call'"):
                s.call_plugin("relax.vm_call")
            with pytest.raises(rpc.RemoteError, match="start the server with --plugin"):
                s._request("relax.vm_call", {"args": {}})
            assert s.info()["machine"]
    finally:
        plain.stop()


def test_a_plugin_that_does_not_import_stops_the_server_at_start():
    bad = start_server("--plugin", "no_such_plugin_module", wait=False)
    try:
        bad.popen.wait(timeout=30)
        assert bad.popen.returncode == 2
        assert "plugin 'no_such_plugin_module' could not be imported" in bad.stderr()
    finally:
        bad.stop()


# -- the plugin hook itself ---------------------------------------------------------------------
TOY_PLUGIN = """
import numpy as np
from tilecraft.rpc.worker import register_op

class Counter:
    def __init__(self, start):
        self.value = start

def scale(ctx, args, arrays):
    out = np.asarray(arrays[0]) * args["factor"]
    return {"sum": float(out.sum())}, [out]

def keep(ctx, args, arrays):
    return {"array": ctx.put_array(np.asarray(arrays[0]) + 1), "counter": ctx.put(Counter(3))}

def bump(ctx, args, arrays):
    c = ctx.get(args["counter"], Counter, "counter")
    c.value += 1
    return {"value": c.value, "file": open(ctx.file_path(args["file"])).read()}

def fail(ctx, args, arrays):
    raise FileNotFoundError("toy: nothing here")

for name, fn in [("toy.scale", scale), ("toy.keep", keep), ("toy.bump", bump),
                 ("toy.fail", fail)]:
    register_op(name, fn)
"""


def test_the_plugin_hook_with_a_toy_plugin(tmp_path, rng):
    from tilecraft.rpc import worker
    (tmp_path / "toy_plugin.py").write_text(TOY_PLUGIN)
    env = repo_env(PYTHONPATH=f"{REPO}:{tmp_path}")
    p = Proc([sys.executable, "-m", "tilecraft.rpc.server", "--host", HOST, "--port", "0",
              "--key", "toy", "--insecure-local", "--plugin", "toy_plugin",
              "--plugin", "tilecraft.relax.rpc_plugin"], env=env)
    try:
        with rpc.connect(HOST, p.port, timeout=10) as s:
            assert {"toy.scale", "relax.vm_call"} <= set(s.plugins)
            x = rng.standard_normal((3, 4)).astype("float32")
            reply = s.call_plugin("toy.scale", factor=2.0, arrays=[x])
            np.testing.assert_array_equal(reply.arrays[0], x * 2)
            assert reply.meta["sum"] == pytest.approx(float((x * 2).sum()), rel=1e-5)
            a = s.array(x)
            np.testing.assert_array_equal(s.call_plugin("toy.scale", factor=-1.0,
                                                        arrays=[a]).arrays[0], -x)
            kept = s.call_plugin("toy.keep", arrays=[x]).meta
            arr = s.remote_array(kept["array"])
            np.testing.assert_array_equal(arr.numpy(), x + 1)
            s.upload(b"hello", "note.txt")
            assert s.call_plugin("toy.bump", counter=kept["counter"], file="note.txt").meta == \
                {"value": 4, "file": "hello"}
            with pytest.raises(ValueError, match="is not a counter"):
                s.call_plugin("toy.bump", counter=arr.handle, file="note.txt")
            with pytest.raises(ValueError, match="plain file name"):
                s.call_plugin("toy.bump", counter=kept["counter"], file="../x")
            with pytest.raises(FileNotFoundError, match="toy: nothing here"):
                s.call_plugin("toy.fail")
            s.release(kept["counter"])
            with pytest.raises(ValueError, match="no counter with handle"):
                s.call_plugin("toy.bump", counter=kept["counter"], file="note.txt")
            with pytest.raises(ValueError, match="has no operation 'toy.nope'"):
                s.call_plugin("toy.nope")
    finally:
        p.stop()
    # registration rules, in this process
    with pytest.raises(ValueError, match="dotted"):
        worker.register_op("plain", lambda ctx, args, arrays: {})
    with pytest.raises(ValueError, match="already registered"):
        worker.register_op("relax.vm_call", lambda ctx, args, arrays: {})
    with pytest.raises(ValueError, match="could not be imported"):
        worker.load_plugins(["no_such_plugin_module"])
    with pytest.raises(ValueError, match="registered no operation"):
        worker.load_plugins(["json"])


def faulty_executable(faulty_lib: str, path: str) -> str:
    """An executable whose functions call the faulting test library's kernels: ``ok`` returns,
    ``crash`` dereferences NULL, ``spin`` never returns."""
    def calls(kernel):
        return {"params": [], "param_regs": [], "param_specs": [], "num_regs": 2,
                "code": [["call_kernel", kernel, [], []], ["prim", 1, 0]], "ret": 1}
    program = {"functions": {k: calls(k) for k in ("ok", "crash", "spin")},
               "kernels": ["ok", "crash", "spin"]}
    with open(faulty_lib, "rb") as f:
        lib = f.read()
    return Executable(program, [], None, "llvm", library_bytes=lib).export_library(path)


def test_a_crashing_kernel_ends_only_the_session(server, faulty_lib, host_exe, tmp_path, rng):
    path = faulty_executable(faulty_lib, str(tmp_path / "faulty.tcx"))
    with rpc.connect(HOST, server.port, timeout=10) as s:
        vm = RemoteVirtualMachine(s, s.upload(path))
        assert vm["ok"]() == 0
        with pytest.raises(rpc.SessionLost, match="segmentation fault"):
            vm["crash"]()
        assert s.closed
    with rpc.connect(HOST, server.port, timeout=10) as s:
        vm = RemoteVirtualMachine(s, s.upload(path))
        with pytest.raises(rpc.SessionLost, match="time limit"):
            vm["spin"](timeout=0.5)
    assert server.alive()
    with rpc.connect(HOST, server.port, timeout=10) as s:  # the server serves on
        vm = RemoteVirtualMachine(s, s.upload(host_exe[1]))
        assert vm["main"](rng.standard_normal((2, IN)).astype("float32")).shape == (2, OUT)


# -- the emulated arm64 board ---------------------------------------------------------------------
KEY = "emulated-arm64-relax"


@pytest.fixture(scope="module")
def board(arm64_board):
    tracker = start_tracker("--ping-interval", "2", "--ping-timeout", "10")
    cmd = arm64_board.server_command("--host", HOST, "--port", "0", "--key", KEY, "--tracker",
                                     f"{HOST}:{tracker.port}", "--tracker-retry", "0.5",
                                     "--plugin", "tilecraft.relax.rpc_plugin", "--insecure-local", "-v")
    server = Proc(cmd, env=arm64_board.env(), cwd=arm64_board.path, ready_timeout=180)
    try:
        client = rpc.connect_tracker(HOST, tracker.port)
        wait_until(lambda: client.summary()["queue_info"].get(KEY, {}).get("free"), 60,
                   "the emulated board to register")
        yield client, server
    finally:
        server.stop()
        tracker.stop()


@needs_lld
def test_a_relax_model_for_the_pi_runs_on_the_emulated_board(board, weights, host_exe, tmp_path,
                                                              rng):
    client, server = board
    exe = relax.build(mlp_module(weights), Target("raspberry-pi/4b-aarch64"))
    path = exe.export_library(str(tmp_path / "mlp-rpi4.tcx"))
    local = relax.VirtualMachine(host_exe[0], targets.cpu(0))
    with client.request(KEY, timeout=60, session_timeout=60) as sess:
        assert sess.platform["machine"] == "aarch64"
        vm = RemoteVirtualMachine(sess, sess.upload(path))
        assert "aarch64" in vm.triple
        for n in (1, 5):
            x = rng.standard_normal((n, IN)).astype("float32")
            y = vm["main"](x)
            assert y.shape == (n, OUT)
            np.testing.assert_allclose(y, local["main"](x).numpy(), rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(y, mlp_numpy(x, weights), rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError, match="argument x: dimension 1 is 15, expected 16"):
            vm["main"](np.ones((2, IN - 1), "float32"))
        res = vm.time_evaluator("main", number=3, repeat=2)(x)
        assert len(res.results) == 2 and all(t > 0 for t in res.results)
    wait_until(lambda: client.summary()["queue_info"][KEY]["free"] == 1, 30, "the board free")
    assert server.alive()
