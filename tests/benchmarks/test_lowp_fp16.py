"""benchmarks/lowp_fp16.py's helpers: the error measures and the rows a partial run keeps (the
measurement itself runs with ``TILECRAFT_LOWP_SMOKE=1 python -m benchmarks.lowp_fp16``)."""
import json

import numpy as np

from benchmarks.lowp_fp16 import accuracy, previous_rows


def test_accuracy_of_a_classifier_and_of_hidden_states():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 10))
    got = ref.copy()
    got[0, 0] += 0.5
    got[1] = -got[1]                                   # one row's top-1 changes
    err = accuracy(got, ref, classifier=True)
    assert err["max_abs_err"] == np.abs(got - ref).max()
    assert err["max_rel_err"] == err["max_abs_err"] / np.abs(ref).max()
    assert err["top1_agreement"] == 0.75
    hid = accuracy(got, ref, classifier=False)
    assert "top1_agreement" not in hid and np.isclose(hid["cosine_min"], -1.0)


def test_a_partial_run_keeps_the_other_rows(tmp_path):
    path = tmp_path / "gpu.json"
    old = [{"model": "resnet50", "target": "opencl", "batch": 1, "speedup": 1.0},
           {"model": "resnet50", "target": "webgpu -supports-float16=1", "batch": 1,
            "speedup": 2.0},
           {"model": "bert_layer_s128", "target": "opencl", "error": "OpenCLError"}]
    path.write_text(json.dumps({"rows": old}))
    new = [{"model": "resnet50", "target": "opencl", "batch": 1, "speedup": 1.5}]
    assert previous_rows(str(path), new) == old[1:]
    assert previous_rows(str(tmp_path / "none.json"), new) == []


def test_results_are_saved_as_the_run_goes_once_a_gpu_row_names_the_file(monkeypatch, tmp_path):
    from benchmarks import lowp_fp16
    written = []
    monkeypatch.setattr(lowp_fp16, "write_results",
                        lambda name, rows, extra, gpu: written.append((gpu, len(rows))) or "x")
    monkeypatch.setattr(lowp_fp16, "results_path", lambda *a: str(tmp_path / "none.json"))
    monkeypatch.setattr(lowp_fp16, "TARGETS", ["opencl", "webgpu"])
    err = [{"model": "resnet50", "target": "opencl", "error": "OpenCLError: no device"}]
    lowp_fp16._save(err, final=False)        # no GPU named yet: not under the CPU's name
    assert written == []
    ok = err + [{"model": "resnet50", "target": "webgpu -supports-float16=1", "batch": 1,
                 "device": "NVIDIA H200", "speedup": 1.2}]
    lowp_fp16._save(ok, final=False)
    lowp_fp16._save(err, final=True)         # the end of a run writes whatever it has
    assert written == [("NVIDIA H200", 2), (None, 1)]
