"""``tilecraft zoo`` and ``tilecraft demo`` run from the package (the zoo's small model, ``mlp``),
their results written where the user says; what they say without onnxruntime or PyTorch; the
benchmarks importing the package and never the reverse."""
from __future__ import annotations

import ast
import json
import os

import pytest

from cliutil import ROOT, last_error, tilecraft, tiny_onnx

pytest.importorskip("onnx", reason="onnx is not installed")


def test_zoo_list_and_unknown_models(tmp_path):
    out = tilecraft("zoo", "--list", cwd=tmp_path).stdout.split("\n")
    assert "mlp" in out and "resnet50" in out and "resnet18  (needs PyTorch)" in out
    proc = tilecraft("zoo", "--models", "mlp,nope", check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "unknown zoo model 'nope'" in last_error(proc)
    proc = tilecraft("zoo", "--show", check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "no zoo results for llvm in tilecraft-zoo" in \
        last_error(proc)
    proc = tilecraft("demo", "--model", "nope", check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "--model nope: not a zoo model" in last_error(proc)
    assert not os.listdir(tmp_path)


def test_zoo_writes_to_out_and_skips_pytorch_models_without_torch(tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    results = os.path.join(ROOT, "benchmarks", "results")
    before = {f: os.path.getmtime(os.path.join(results, f)) for f in os.listdir(results)}
    proc = tilecraft("zoo", "--models", "mlp,resnet18", "--out", "res", cwd=tmp_path,
                     block=("torch",), TILECRAFT_ZOO_ROUNDS="1")
    assert "| mlp | (1, 784) |" in proc.stdout
    assert "resnet18 | " in proc.stdout and "skipped" in proc.stdout
    with open(tmp_path / "res" / "zoo-llvm.json", encoding="utf-8") as f:
        rows = {r["model"]: r for r in json.load(f)["rows"]}
    assert rows["mlp"]["tilecraft_ms"] > 0 and rows["mlp"]["check"].startswith("allclose")
    assert rows["resnet18"]["skipped"] == \
        "zoo model resnet18 needs torch, which is not installed: pip install 'tilecraft[torch]'"
    assert (tmp_path / "res" / "zoo-llvm.md").exists()
    # nothing went into the checkout (an installed package would be site-packages)
    after = {f: os.path.getmtime(os.path.join(results, f)) for f in os.listdir(results)}
    assert after == before
    shown = tilecraft("zoo", "--show", "--out", "res", cwd=tmp_path).stdout
    assert "| mlp | (1, 784) |" in shown


def test_demo_with_the_small_model(tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    proc = tilecraft("demo", "--model", "mlp", "--rounds", "1", cwd=tmp_path)
    first, ours, ort, ratio = proc.stdout.strip().splitlines()
    assert first.startswith("mlp (1x784) compiled for this CPU") and "matches onnxruntime" in first
    assert ours.split()[0] == "tilecraft" and ort.split()[0] == "onnxruntime"
    assert ratio.strip().startswith("ratio ")
    assert not os.listdir(tmp_path)


def test_without_onnxruntime_the_extra_is_named(tmp_path):
    tiny_onnx(tmp_path / "tiny.onnx")
    want = "needs onnxruntime, which is not installed: pip install 'tilecraft[bench]'"
    for args in (["zoo", "--models", "mlp"], ["demo"], ["bench", "tiny.onnx"]):
        proc = tilecraft(*args, check=False, cwd=tmp_path, block=("onnxruntime",))
        assert proc.returncode == 1, proc.stderr
        assert want in last_error(proc) and "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["tiny.onnx"]


def test_the_benchmarks_import_the_package_never_the_reverse():
    offenders = []
    for top in ("tilecraft", "tensorir", "targets", "rpc", "metaschedule", "relax"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                for node in ast.walk(tree):
                    mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                        [node.module or ""] if isinstance(node, ast.ImportFrom) and \
                        node.level == 0 else []
                    if any(m.split(".")[0] == "benchmarks" for m in mods):
                        offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert not offenders


def test_benchmarks_zoo_writes_through_write_results(tmp_path, monkeypatch):
    from benchmarks import run as bench_run
    from benchmarks import zoo as bench_zoo
    assert bench_run.REGISTRY["zoo"] == "benchmarks.zoo"
    assert bench_run.REGISTRY["demo"] == "tilecraft.demo"
    written = []

    def fake_write_results(name, rows, extra=None):
        path = str(tmp_path / f"{name}.json")
        written.append((name, rows, extra))
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"rows": rows}, f)
        return path
    monkeypatch.setattr(bench_zoo, "write_results", fake_write_results)
    rows = [{"model": "resnet18", "skipped": "zoo model resnet18 needs torch"}]
    out = bench_zoo.save(rows, "llvm")
    assert written[0][0] == "zoo-llvm" and written[0][2]["target"] == "llvm"
    assert out["md"] == str(tmp_path / "zoo-llvm.md")
    assert "| resnet18 |" in open(out["md"], encoding="utf-8").read()
