"""benchmarks/hf_models_cpu: the rows of a partial run merge with the results file by model,
import path and size (a row written before the torch.export rows is an ONNX row), and the
README's headlines name each row's path."""
import pytest

pytest.importorskip("torch", reason="PyTorch is not installed: the benchmark exports with it")

from benchmarks import hf_models_cpu as hf           # noqa: E402
from benchmarks.results_table import _hf_models_cpu  # noqa: E402


def _row(model, size, path=None, **kw):
    r = {"model": model, "size": size, "vs_ort": 1.1, "vs_torch": 3.0, "sym_cost": 1.0}
    if path:
        r["path"] = path
    r.update(kw)
    return r


def test_merge_keeps_rows_of_other_paths_and_models():
    old = [_row("gpt2", "small"), _row("gpt2", "small", "torch.export", v=0),
           _row("resnet18", "large", v=9)]
    new = [_row("gpt2", "small", "onnx", v=2)]
    rows = hf.merged_rows(new, old)
    # the old path-less gpt2 row is the ONNX row the new one replaces
    assert [(r["model"], r.get("path"), r["size"], r.get("v")) for r in rows] == [
        ("gpt2", "onnx", "small", 2), ("gpt2", "torch.export", "small", 0),
        ("resnet18", None, "large", 9)]


def test_headlines_name_the_path_of_the_worst_row():
    rows = [_row("gpt2", "small", "onnx", sym_cost=1.02),
            _row("gpt2", "small", "torch.export", sym_cost=1.2), _row("bert", "large")]
    heads = _hf_models_cpu({"rows": rows})
    assert any("gpt2 torch.export small: 1.20x" in h.figure for h in heads)


def test_unknown_path_is_refused():
    with pytest.raises(SystemExit):
        hf.main(["--paths", "tflite", "--no-write", "--models", "gpt2"])
