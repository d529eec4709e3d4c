"""benchmarks/results: the layout of the files, the README's table, and the paths the docs name."""
import glob
import json
import math
import os
import re

import pytest

from benchmarks import results_table
from benchmarks.common import RESULTS_DIR

REPO = os.path.dirname(os.path.dirname(RESULTS_DIR))
MACHINE = r"[a-z0-9]+(?:-[a-z0-9]+)*"
CURRENT = re.compile(rf"({MACHINE})(\.[a-z0-9_]+)*\.(json|png|md)\Z")
HISTORY = re.compile(rf"{MACHINE}-\d{{4}}-\d\d-\d\d(-[a-z0-9]+)*(\.[a-z0-9_]+)*\.(json|png|md)\Z")


def test_readme_table_is_up_to_date():
    with open(results_table.README, encoding="utf-8") as f:
        text = f.read()
    assert results_table.updated(text) == text, (
        "benchmarks/results/README.md's table is out of date: run "
        "python -m benchmarks.results_table")


def test_results_layout():
    """Only <benchmark>/<machine>.json, its companions, and history/ files; nothing at the top
    but the README."""
    assert [f for f in os.listdir(RESULTS_DIR)
            if os.path.isfile(os.path.join(RESULTS_DIR, f))] == ["README.md"]
    for bench in os.listdir(RESULTS_DIR):
        folder = os.path.join(RESULTS_DIR, bench)
        if not os.path.isdir(folder):
            continue
        names = os.listdir(folder)
        machines = {n[:-len(".json")] for n in names if re.fullmatch(rf"{MACHINE}\.json", n)}
        assert machines, f"{bench}/ holds no <machine>.json"
        for name in names:
            if name == "history":
                for old in os.listdir(os.path.join(folder, name)):
                    assert HISTORY.match(old), f"{bench}/history/{old}: not <machine>-<date>..."
                continue
            m = CURRENT.match(name)
            assert m and m.group(1) in machines, f"{bench}/{name}: not beside a <machine>.json"


def test_every_result_has_a_headline():
    results = results_table.latest_results()
    assert len(results) > 20
    for bench, machine, doc in results:
        assert doc.get("time"), f"{bench}/{machine}.json has no time"
        heads = results_table.headlines(bench, doc)
        assert heads, f"{bench}/{machine}.json: no headline"
        for h in heads:
            assert h.figure
            assert h.ratio is None or (math.isfinite(h.ratio) and h.ratio > 0 and h.peer)


def test_headline_errors_name_the_file():
    with pytest.raises(KeyError, match="no_such_bench.*HEADLINES"):
        results_table.headlines("no_such_bench", {"rows": []})
    with pytest.raises(ValueError, match="gemm_cpu/box-1: the headline cannot be read"):
        results_table.headlines("gemm_cpu", {"machine_name": "box-1", "rows": [{"x": 1}]})


def test_lowp_fp16_headline_per_target():
    rows = [{"model": "resnet50", "target": "opencl", "batch": 1, "speedup": 2.0,
             "max_rel_err": 1e-3},
            {"model": "resnet50", "target": "opencl", "batch": 16, "speedup": 0.5,
             "max_rel_err": 2e-3},
            {"model": "resnet50", "target": "opencl -supports-float16=1",
             "error": "OpenCLError: ... cl_khr_fp16"},
            {"model": "resnet50", "target": "llvm", "batch": 1, "speedup": 0.75,
             "max_rel_err": 4e-4},
            {"model": "mlp_4096x3", "target": "llvm", "batch": 1, "speedup": 2.0,
             "max_rel_err": 5e-4}]
    heads = results_table.headlines("lowp_fp16", {"rows": rows})
    assert [h.figure.split(",")[0] for h in heads] == ["fp16 (ToMixedPrecision) on opencl",
                                                       "fp16 (ToMixedPrecision) on llvm"]
    assert heads[0].ratio == pytest.approx(1.0) and "b16 0.50x" in heads[0].figure
    assert "error rel <= 0.002" in heads[0].figure and heads[0].peer
    # the MLP is listed, outside the mean of the ResNet-50 / BERT rows
    assert heads[1].ratio == pytest.approx(0.75) and "(also mlp_4096x3 b1 2.00x)" in heads[1].figure
    with pytest.raises(ValueError, match="lowp_fp16/box-1: the headline cannot be read"):
        results_table.headlines("lowp_fp16", {"machine_name": "box-1", "rows": rows[2:3]})


def test_table_of_a_results_folder(tmp_path):
    os.makedirs(tmp_path / "gemm_cpu" / "history")
    doc = {"benchmark": "gemm_cpu", "time": "2030-01-02T03:04:05",
           "rows": [{"kernel": "GEMM 1024x1024x1024 f32", "ratio": 1.234}]}
    (tmp_path / "gemm_cpu" / "box-1.json").write_text(json.dumps(doc))
    (tmp_path / "gemm_cpu" / "box-1.png").write_bytes(b"")               # a companion: not read
    (tmp_path / "gemm_cpu" / "history" / "box-1-2029-12-31.json").write_text("not read")
    text = f"intro\n{results_table.BEGIN}\nold\n{results_table.END}\nend\n"
    new = results_table.updated(text, str(tmp_path))
    assert new.startswith("intro\n") and new.endswith(f"{results_table.END}\nend\n")
    assert ("| [gemm_cpu](gemm_cpu/box-1.json) | box-1 | GEMM 1024³ f32, hand schedule | 1.23x | "
            "numpy (OpenBLAS) | 2030-01-02 |") in new
    assert "old" not in new
    with pytest.raises(ValueError, match="markers"):
        results_table.updated("no markers", str(tmp_path))


def test_paths_in_the_docs_exist():
    """Every benchmarks/results/... path the docs name (placeholders aside) is in the tree."""
    docs = glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
    docs += [os.path.join(REPO, f) for f in ("README.md", "CONTRIBUTING.md")
             if os.path.exists(os.path.join(REPO, f))]
    missing = []
    for doc in docs:
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        for path in re.findall(r"benchmarks/results/[A-Za-z0-9_./-]*[A-Za-z0-9_/]", text):
            if not os.path.exists(os.path.join(REPO, path)):
                missing.append(f"{os.path.relpath(doc, REPO)}: {path}")
    assert not missing, missing


def test_lowp_headline_has_the_gpu_model_rows_and_skips_error_rows():
    rows = [{"mode": "int4-g128 gpu layer", "target": "opencl", "model": "gpt2 linear 768x768",
             "peer": "ours float32 (same target)", "ratio": 4.0, "ours_rel": 0.1},
            {"mode": "int4-g128 gpu", "target": "webgpu", "model": "gpt2_small, 1 token",
             "peer": "ours float32 (same target)", "ratio": 3.0, "ours_rel": 0.07},
            {"mode": "int4-g128 gpu", "target": "opencl", "error": "OpenCLError: no device"}]
    heads = results_table.headlines("lowp", {"rows": rows})
    assert [(h.ratio, h.peer) for h in heads] == [(3.0, "ours float32 (same target)")]
    assert "on webgpu" in heads[0].figure
