"""``tilecraft tune`` (few trials, a small search) and resuming it, then ``tilecraft compile
--tuning-db`` and the tuned executable run against numpy (and PyTorch, for a ``.pt2`` program)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cliutil import last_error, tilecraft, tiny_onnx

pytest.importorskip("onnx", reason="onnx is not installed")

# a small search: seconds per batch instead of minutes
FAST = ["--per-batch", "2", "--population", "8", "--remeasure", "0", "--seed", "0",
        "--upper-bound", "batch=16"]


def records(work_dir) -> list[dict]:
    with open(work_dir / "records.json", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_tune_resumes_and_compile_uses_the_records(tmp_path):
    w, b = tiny_onnx(tmp_path / "tiny.onnx")
    proc = tilecraft("tune", "tiny.onnx", "--trials", "2", "--work-dir", "tune", *FAST,
                     cwd=tmp_path)
    assert "holds 0 trials" in proc.stdout and "measured here" in proc.stdout
    assert "2 trials in tune" in proc.stdout
    assert len(records(tmp_path / "tune")) == 2
    # the same command with a larger budget continues from the 2 records: 2 more, not 4
    proc = tilecraft("tune", "tiny.onnx", "--trials", "4", "--work-dir", "tune", *FAST,
                     cwd=tmp_path)
    assert "holds 2 trials of them (resuming)" in proc.stdout
    assert "4 trials in tune" in proc.stdout
    assert len(records(tmp_path / "tune")) == 4
    # the budget is spent: nothing to do
    proc = tilecraft("tune", "tiny.onnx", "--trials", "4", "--work-dir", "tune", *FAST,
                     cwd=tmp_path)
    assert "nothing to tune" in proc.stdout
    assert len(records(tmp_path / "tune")) == 4
    assert "tilecraft compile tiny.onnx --target llvm --upper-bound batch=16 --tuning-db tune" \
        in proc.stdout

    proc = tilecraft("compile", "tiny.onnx", "--upper-bound", "batch=16", "--tuning-db",
                     "tune", "-o", "tuned.tcx", cwd=tmp_path)
    line = next(s for s in proc.stdout.splitlines() if s.startswith("tuning records from"))
    assert "of 1 distinct kernel" in line and "a tuned schedule" in line
    x = np.random.default_rng(3).standard_normal((6, 8)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    tilecraft("run", "tuned.tcx", "-i", "x.npy", "-o", "y.npy", cwd=tmp_path)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), np.maximum(x @ w + b, 0),
                               rtol=1e-5, atol=1e-5)


def test_tune_errors(tmp_path):
    tiny_onnx(tmp_path / "tiny.onnx")
    (tmp_path / "file").write_text("x")
    for args, message in [
            (["--trials", "0", "--work-dir", "t"], "--trials 0: must be >= 1"),
            (["--trials", "4", "--work-dir", "file"], "--work-dir file: not a directory"),
            (["--trials", "4", "--work-dir", "t", "--rpc-key", "rasp4"],
             "--rpc-key needs --rpc-tracker"),
            (["--trials", "4", "--work-dir", "t", "--rpc-tracker", "127.0.0.1:1",
              "--rpc-key", "k"], "cannot reach board 'k' at the tracker 127.0.0.1:1")]:
        proc = tilecraft("tune", "tiny.onnx", *args, check=False, cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert message in last_error(proc)
    (tmp_path / "empty").mkdir()
    proc = tilecraft("compile", "tiny.onnx", "-o", "m.tcx", "--tuning-db", "empty",
                     check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "no tuning records there" in last_error(proc)


def test_a_torch_export_program_tunes_and_compiles(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU()).eval()
    ep = torch.export.export(module, (torch.randn(3, 8),))
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    proc = tilecraft("tune", "m.pt2", "--trials", "2", "--work-dir", "tune", *FAST[:-2],
                     cwd=tmp_path)
    assert "2 trials in tune" in proc.stdout
    tilecraft("compile", "m.pt2", "--tuning-db", "tune", "-o", "m.tcx", cwd=tmp_path)
    x = np.random.default_rng(4).standard_normal((3, 8)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    tilecraft("run", "m.tcx", "-i", "x.npy", "-o", "y.npy", cwd=tmp_path)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-5)
