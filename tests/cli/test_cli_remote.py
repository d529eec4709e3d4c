"""``tilecraft rpc``, and ``tilecraft run / bench / tune`` on a board, over loopback.

The board is a real ``tilecraft rpc server`` started as a board runs it: with llvmlite, xgboost,
onnx, onnxruntime, pyopencl, wgpu and torch unimportable (``pip install --no-deps tilecraft
numpy``), the Relax plugin, a token, registered with a ``tilecraft rpc tracker``. The last test
runs on the emulated arm64 board (Debian's aarch64 Python and numpy under qemu; slow).
"""
from __future__ import annotations

import platform
import secrets
import shutil

import numpy as np
import pytest

from cliutil import BOARD_BLOCKED, HOST, Background, command, last_error, tilecraft, tiny_onnx

pytest.importorskip("onnx", reason="onnx is not installed")
pytestmark = pytest.mark.skipif(shutil.which("ld.lld") is None,
                                reason="ld.lld not installed (executables are linked with it)")

KEY = "cli-board"
PLUGIN = "tilecraft.relax.rpc_plugin"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A directory outside the checkout with tiny.onnx, x.npy, a token file; the weights."""
    d = tmp_path_factory.mktemp("cli-remote")
    w, b = tiny_onnx(d / "tiny.onnx")
    (d / "token").write_text(secrets.token_hex(32))
    x = np.random.default_rng(5).standard_normal((5, 8)).astype("float32")
    np.save(d / "x.npy", x)
    return d, w, b, x


@pytest.fixture(scope="module")
def tracker(site):
    d = site[0]
    t = Background(command("rpc", "tracker", "--host", HOST, "--port", "0", "--insecure-local"),
                   cwd=d)
    yield t
    t.stop()


@pytest.fixture(scope="module")
def board(site, tracker):
    """``tilecraft rpc server`` with the board's packages only, the Relax plugin and a token."""
    d = site[0]
    s = Background(command("rpc", "server", "--host", HOST, "--port", "0", "--key", KEY,
                           "--tracker", f"{HOST}:{tracker.port}", "--tracker-retry", "0.2",
                           "--token-file", "token", "--plugin", PLUGIN, block=BOARD_BLOCKED),
                   cwd=d)
    yield s
    s.stop()


def remote(tracker, *more):
    return ["--rpc-tracker", f"{HOST}:{tracker.port}", "--rpc-key", KEY,
            "--rpc-token-file", "token", *more]


@pytest.fixture(scope="module")
def host_exe(site):
    d = site[0]
    tilecraft("compile", "tiny.onnx", "-o", "host.tcx", cwd=d)
    return "host.tcx"


def test_the_board_profile_runs_the_rpc_commands_only(tmp_path):
    proc = tilecraft("--version", cwd=tmp_path, block=BOARD_BLOCKED)
    assert proc.stdout.startswith("tilecraft ")
    assert "rpc" in tilecraft("--help", cwd=tmp_path, block=BOARD_BLOCKED).stdout
    for role in ("server", "tracker"):
        out = tilecraft("rpc", role, "--help", cwd=tmp_path, block=BOARD_BLOCKED).stdout
        assert f"usage: tilecraft rpc {role}" in out
    proc = tilecraft("compile", "m.onnx", "-o", "m.tcx", check=False, cwd=tmp_path,
                     block=BOARD_BLOCKED)
    assert proc.returncode == 1
    assert "which is not installed: pip install tilecraft" in last_error(proc)


def test_run_on_the_board_through_the_tracker_and_directly(site, tracker, board, host_exe):
    d, w, b, x = site
    want = np.maximum(x @ w + b, 0)
    proc = tilecraft("run", host_exe, "-i", "x.npy", "-o", "y.npy", "--time", "3",
                     *remote(tracker), cwd=d)
    assert f"ran on board '{KEY}' at the tracker" in proc.stdout
    assert "median of 3 runs" in proc.stdout and "the board's clock" in proc.stdout
    np.testing.assert_allclose(np.load(d / "y.npy"), want, rtol=1e-5, atol=1e-6)
    # the same server without the tracker
    proc = tilecraft("run", host_exe, "-i", "x.npy", "-o", "y2.npy", "--rpc-host", HOST,
                     "--rpc-port", board.port, "--rpc-token-file", "token", cwd=d)
    assert f"ran on the server {HOST}:{board.port}" in proc.stdout
    np.testing.assert_allclose(np.load(d / "y2.npy"), want, rtol=1e-5, atol=1e-6)
    assert board.alive()


def test_board_errors(site, tracker, board, host_exe):
    d = site[0]
    tilecraft("compile", "tiny.onnx", "--target", "raspberry-pi/4b-aarch64", "-o", "pi.tcx",
              cwd=d)
    cases = [
        (["run", "pi.tcx", "-i", "x.npy", *remote(tracker)],
         "pi.tcx is for aarch64, but board 'cli-board'"),
        (["bench", "tiny.onnx", "--target", "raspberry-pi/4b-aarch64", *remote(tracker)],
         "--target raspberry-pi/4b-aarch64 is for aarch64, but board 'cli-board'"),
        (["run", "pi.tcx", "-i", "x.npy"], "pi.tcx cannot run here"),
        (["run", host_exe, "-i", "x.npy", "--rpc-host", HOST, "--rpc-port", str(board.port)],
         "requires a token"),
        (["run", host_exe, "-i", "x.npy", "--rpc-tracker", f"{HOST}:{tracker.port}",
          "--rpc-key", "nobody", "--rpc-timeout", "1"], "no server with key 'nobody'"),
        (["run", host_exe, "-i", "x.npy", "--rpc-tracker", f"{HOST}:{tracker.port}"],
         "--rpc-tracker needs --rpc-key"),
        (["run", host_exe, "-i", "x.npy", "--rpc-host", HOST], "--rpc-host and --rpc-port go"),
    ]
    for args, message in cases:
        proc = tilecraft(*args, check=False, cwd=d)
        assert proc.returncode == 1, (args, proc.stderr)
        assert message in last_error(proc), (args, proc.stderr)


def test_a_server_without_the_plugin_is_named(site, host_exe):
    d = site[0]
    bare = Background(command("rpc", "server", "--host", HOST, "--port", "0",
                              "--insecure-local"), cwd=d)
    try:
        proc = tilecraft("run", host_exe, "-i", "x.npy", "--rpc-host", HOST, "--rpc-port",
                         bare.port, check=False, cwd=d)
        assert proc.returncode == 1
        assert f"start its server with --plugin {PLUGIN}" in last_error(proc)
    finally:
        bare.stop()


def test_bench_on_the_board(site, tracker, board):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    d = site[0]
    proc = tilecraft("bench", "tiny.onnx", "--dim", "batch=3", "--rounds", "2",
                     *remote(tracker), cwd=d)
    assert "board output matches onnxruntime" in proc.stdout
    assert f"on board '{KEY}'" in proc.stdout and "the board's clock" in proc.stdout
    assert "\nratio " not in proc.stdout and "not timed against the board" in proc.stdout


def test_tune_on_the_board(site, tracker, board):
    d, w, b, x = site
    proc = tilecraft("tune", "tiny.onnx", "--trials", "2", "--work-dir", "tune-board",
                     "--per-batch", "2", "--population", "8", "--remeasure", "0",
                     *remote(tracker), cwd=d)
    assert f"measured on board '{KEY}'" in proc.stdout
    assert "2 trials in tune-board" in proc.stdout
    tilecraft("compile", "tiny.onnx", "--tuning-db", "tune-board", "-o", "tuned.tcx", cwd=d)
    tilecraft("run", "tuned.tcx", "-i", "x.npy", "-o", "yt.npy", *remote(tracker), cwd=d)
    np.testing.assert_allclose(np.load(d / "yt.npy"), np.maximum(x @ w + b, 0), rtol=1e-5,
                               atol=1e-6)


# -- the emulated arm64 board ---------------------------------------------------------------------
from tilecraft.rpc.board import emulated_board as eb  # noqa: E402

ARM_READY = eb.root_ready(eb.default_root())
ARM_MISSING = eb.missing_tools(build=not ARM_READY)
# as tests/rpc/test_rpc_board.py: it runs whenever the board's root is built; building it takes
# minutes (and root), so without it the test is slow
ARM_MARKS = [pytest.mark.skipif(bool(ARM_MISSING),
                                reason="emulated board needs: " + "; ".join(ARM_MISSING))]
if not ARM_READY:
    ARM_MARKS.append(pytest.mark.slow)


def on_the_arm_board(test):
    for mark in ARM_MARKS:
        test = mark(test)
    return test


@on_the_arm_board
def test_run_and_bench_on_the_emulated_arm64_board(site, tracker, host_exe):
    """``python3 -m tilecraft rpc server`` on Debian's aarch64 Python with numpy and nothing
    else (no LLVM, ONNX or XGBoost): run and bench an executable built here for the Pi."""
    d, w, b, x = site
    root = eb.ensure_root(eb.default_root())
    key = "cli-arm64"
    cmd = eb.board_command(root, "tilecraft", ["rpc", "server", "--host", HOST, "--port", "0",
                                               "--key", key, "--tracker",
                                               f"{HOST}:{tracker.port}", "--tracker-retry",
                                               "0.5", "--plugin", PLUGIN,
                                               "--insecure-local"])
    server = Background(cmd, cwd=d, env_=eb.board_env(), ready_timeout=300)
    try:
        tilecraft("compile", "tiny.onnx", "--target", "raspberry-pi/4b-aarch64", "-o",
                  "pi.tcx", cwd=d)
        arm = ["--rpc-tracker", f"{HOST}:{tracker.port}", "--rpc-key", key]
        proc = tilecraft("run", "pi.tcx", "-i", "x.npy", "-o", "ya.npy", *arm, cwd=d)
        assert "aarch64 (Linux" in proc.stdout
        np.testing.assert_allclose(np.load(d / "ya.npy"), np.maximum(x @ w + b, 0),
                                   rtol=1e-5, atol=1e-5)
        if platform.machine() == "x86_64":
            proc = tilecraft("run", host_exe, "-i", "x.npy", *arm, check=False, cwd=d)
            assert "host.tcx is for x86_64, but board 'cli-arm64'" in last_error(proc)
        pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
        proc = tilecraft("bench", "tiny.onnx", "--target", "raspberry-pi/4b-aarch64",
                         "--rounds", "1", *arm, cwd=d)
        assert "board output matches onnxruntime" in proc.stdout
    finally:
        server.stop()
