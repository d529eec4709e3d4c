"""docs/frontends.md lists the ONNX operators the converter table holds."""
import os

from benchmarks import gen_onnx_docs
from tilecraft.relax.frontend.onnx.registry import supported_ops


def test_onnx_operator_list_is_up_to_date():
    with open(gen_onnx_docs.DOC_PATH, encoding="utf-8") as f:
        text = f.read()
    assert gen_onnx_docs.updated(text) == text, (
        "docs/frontends.md's ONNX operator list is out of date: run "
        "python -m benchmarks.gen_onnx_docs")
    section = text[text.index("## ONNX"):text.index("## PyTorch")]
    missing = [op for op in supported_ops() if f"`{op}`" not in section]
    assert not missing
