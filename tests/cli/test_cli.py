"""The ``tilecraft`` command line, run as a subprocess from a directory outside the checkout, on
a tiny ONNX model: compile, run, bench on the CPU, help, version and errors."""
from __future__ import annotations

import os

import numpy as np
import pytest

from cliutil import last_error, tilecraft, tiny_onnx

pytest.importorskip("onnx", reason="onnx is not installed")

RNG = np.random.default_rng(0)
COMMANDS = ("compile", "run", "bench", "tune", "zoo", "demo", "rpc")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A directory outside the checkout, holding tiny.onnx (and its weights as attributes)."""
    d = tmp_path_factory.mktemp("cli")
    w, b = tiny_onnx(d / "tiny.onnx")
    return d, w, b


@pytest.fixture(scope="module")
def compiled(work):
    d, w, b = work
    proc = tilecraft("compile", "tiny.onnx", "--target", "llvm", "-o", "tiny.tcx",
                     "--upper-bound", "batch=16", cwd=d)
    assert "compiled" in proc.stdout and (d / "tiny.tcx").exists()
    return d / "tiny.tcx"


def reference(x, w, b):
    return np.maximum(x @ w + b, 0)


def test_version_and_help(tmp_path):
    import tilecraft as tc
    assert tilecraft("--version", cwd=tmp_path).stdout.strip() == f"tilecraft {tc.__version__}"
    top = tilecraft("--help", cwd=tmp_path).stdout
    for cmd in COMMANDS:
        assert f"\n  {cmd} " in top
        assert f"usage: tilecraft {cmd}" in tilecraft(cmd, "--help", cwd=tmp_path).stdout
    assert "usage: tilecraft rpc server" in tilecraft("rpc", "server", "--help",
                                                      cwd=tmp_path).stdout
    assert "usage: tilecraft rpc tracker" in tilecraft("rpc", "tracker", "--help",
                                                       cwd=tmp_path).stdout


def test_compile_and_run(work, compiled, tmp_path):
    d, w, b = work
    x = RNG.standard_normal((5, 8)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npy"
    proc = tilecraft("run", compiled, "--input", tmp_path / "x.npy", "--output", out,
                     "--time", "3", cwd=tmp_path)
    assert "output 0: shape (5, 4) float32" in proc.stdout
    assert "ran on the CPU" in proc.stdout and "median of 3 runs" in proc.stdout
    np.testing.assert_allclose(np.load(out), reference(x, w, b), rtol=1e-5, atol=1e-6)
    # named inputs, another batch size through the same executable, options after the command
    x2 = RNG.standard_normal((2, 8)).astype("float32")
    np.savez(tmp_path / "in.npz", x=x2)
    tilecraft("run", compiled, "--input", tmp_path / "in.npz", "--output", out, "-q",
              cwd=tmp_path)
    np.testing.assert_allclose(np.load(out), reference(x2, w, b), rtol=1e-5, atol=1e-6)


def test_compile_with_static_shape(work, tmp_path):
    d, w, b = work
    proc = tilecraft("compile", d / "tiny.onnx", "-o", "static.tcx", "--shape", "x=3,8",
                     cwd=tmp_path)
    assert "x: (3, 8) float32" in proc.stdout
    np.save(tmp_path / "x.npy", RNG.standard_normal((4, 8)).astype("float32"))
    bad = tilecraft("run", "static.tcx", "--input", "x.npy", check=False, cwd=tmp_path)
    assert bad.returncode == 1
    assert "dimension 0 is 4, expected 3" in bad.stderr


def test_bench_against_onnxruntime(work):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    d, _, _ = work
    proc = tilecraft("bench", "tiny.onnx", "--compare", "onnxruntime", "--dim", "batch=4",
                     "--rounds", "2", cwd=d)
    assert "matches onnxruntime" in proc.stdout
    assert "ratio" in proc.stdout and "tilecraft" in proc.stdout
    assert "on this CPU" not in proc.stdout      # both on the CPU: nothing to point out


@pytest.mark.parametrize("args, message", [
    (["compile", "missing.onnx", "-o", "x.tcx"], "missing.onnx: no such file"),
    (["compile", "tiny.onnx", "-o", "{tmp}/x.tcx", "--shape", "nope=1,8"],
     "the model has no input 'nope'"),
    (["compile", "tiny.onnx", "-o", "{tmp}/x.tcx", "--upper-bound", "seq=4"],
     "no symbolic dim 'seq'"),
    (["compile", "tiny.onnx", "-o", "{tmp}/x.tcx", "--upper-bound", "batch=many"],
     "'many' is not an int"),
    (["compile", "tiny.onnx", "-o", "{tmp}/x.tcx", "--target", "nonsense"],
     "--target nonsense:"),
    (["compile", "{tmp}/bad.onnx", "-o", "{tmp}/x.tcx"], "not a valid ONNX file"),
    (["compile", "{tmp}/model.txt", "-o", "{tmp}/x.tcx"], "unknown model format"),
    (["compile", "tiny.onnx", "-o", "{tmp}/x.tcx", "--tuning-db", "{tmp}/none"],
     "--tuning-db {tmp}/none: no such directory"),
    (["run", "{tmp}/nothing.tcx", "--input", "x.npy"], "no such file"),
    (["run", "{tmp}/model.txt"], "is not a tilecraft executable"),
    (["bench", "tiny.onnx", "--dim", "seq=3"], "--dim seq: the model has no symbolic dim"),
    (["bench", "tiny.onnx", "--compare", "torch"], "--compare torch needs a torch.export"),
])
def test_errors_are_one_line_and_exit_1(work, tmp_path, args, message):
    d, _, _ = work
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage that is not protobuf" * 3)
    (tmp_path / "model.txt").write_text("hello")
    real = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = tilecraft(*real, check=False, cwd=d)
    assert proc.returncode == 1, proc.stderr
    last = last_error(proc)
    assert last.startswith("tilecraft: error:"), proc.stderr
    assert message.replace("{tmp}", str(tmp_path)) in last
    assert "Traceback" not in proc.stderr


def test_traceback_on_request(work):
    d, _, _ = work
    proc = tilecraft("--traceback", "compile", "missing.onnx", "-o", "x.tcx", check=False,
                     cwd=d)
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    assert "CLIError: missing.onnx: no such file" in proc.stderr


def test_run_input_errors(compiled, tmp_path):
    np.save(tmp_path / "x.npy", RNG.standard_normal((2, 8)).astype("float32"))
    proc = tilecraft("run", compiled, "--input", f"nope={tmp_path / 'x.npy'}", check=False,
                     cwd=tmp_path)
    assert proc.returncode == 1 and "the model has no input 'nope'" in proc.stderr
    proc = tilecraft("run", compiled, check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "no value for input x" in proc.stderr
    np.save(tmp_path / "w.npy", RNG.standard_normal((2, 7)).astype("float32"))
    proc = tilecraft("run", compiled, "--input", tmp_path / "w.npy", check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "expected 8" in proc.stderr
    proc = tilecraft("run", compiled, "--input", tmp_path / "x.npy", "--device", "1",
                     check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "run on the CPU (device 0)" in last_error(proc)


@pytest.mark.parametrize("args, message", [
    ([], "usage: tilecraft"),
    (["compile"], "the following arguments are required"),
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["--frob", "compile"], "unknown option --frob"),
    (["rpc", "nothing"], "invalid choice: 'nothing'"),
    (["tune", "tiny.onnx", "--work-dir", "w"], "--trials"),
])
def test_bad_command_line_exits_2(tmp_path, args, message):
    proc = tilecraft(*args, check=False, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not os.listdir(tmp_path)          # nothing written
