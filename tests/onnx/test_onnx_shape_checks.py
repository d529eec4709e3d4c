"""A shape relation ``from_onnx`` cannot prove at import becomes a run-time check, not a refusal.

HF encoders exported with ``torch.onnx.export`` and dynamic batch and sequence slice their
position table (``max_position_embeddings`` rows) with the sequence length and expand the
result to ``(batch, seq)``: the slice has ``max(min(seq, 256), 0)`` rows, equal to ``seq`` only
when ``seq <= 256``. The importer checks ``seq <= 256`` when the model runs and imports it.
"""
from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilecraft import relax, targets
from tilecraft.relax.frontend import from_onnx

TABLE = 16


def _position_model() -> onnx.ModelProto:
    """input_ids + positions[:, :seq] expanded to (batch, seq), as BERT's embeddings do."""
    table = numpy_helper.from_array(np.arange(TABLE, dtype=np.int64)[None] * 10, "table")
    consts = [numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in
              (("one", [1]), ("zero", [0]), ("idx1", 1))]
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "idx1"], ["seq"], axis=0),
        helper.make_node("Unsqueeze", ["seq", "zero"], ["seq1"]),
        helper.make_node("Slice", ["table", "zero", "seq1", "one"], ["sliced"]),
        helper.make_node("Expand", ["sliced", "shape"], ["positions"]),
        helper.make_node("Add", ["input_ids", "positions"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "positions",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("out", TensorProto.INT64, ["batch", "seq"])],
        initializer=[table] + consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unprovable_expand_is_checked_at_run_time():
    mod = from_onnx(_position_model())
    text = mod["main"].script()
    assert "R.assert_op" in text
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    rng = np.random.default_rng(0)
    for shape in ((2, 5), (3, TABLE)):
        ids = rng.integers(0, 100, shape).astype("int64")
        np.testing.assert_array_equal(vm["main"](ids).numpy(),
                                      ids + np.arange(shape[1]) * 10)
    with pytest.raises(relax.RuntimeCheckError,
                       match=rf"^seq = {TABLE + 1} exceeds {TABLE}, the most this model "
                             rf"supports \(node .*Expand"):
        vm["main"](np.zeros((2, TABLE + 1), "int64"))


@pytest.mark.filterwarnings("ignore::DeprecationWarning",
                            "ignore:Converting a tensor to a Python boolean")
def test_hf_bert_exported_by_torch_onnx_export_imports_and_matches():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

    class Encoder(torch.nn.Module):
        # transformers' forward wrappers take the tracer's arguments twice: call it by keyword
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).last_hidden_state

    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=24)
    torch.manual_seed(0)
    model = Encoder(transformers.BertModel(cfg)).eval()
    f = io.BytesIO()
    torch.onnx.export(model, (torch.randint(0, 50, (2, 8)),), f, input_names=["input_ids"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}}, dynamo=False)
    proto = onnx.load_from_string(f.getvalue())
    vm = relax.VirtualMachine(relax.build(from_onnx(proto), "llvm -opt-level=0", strict=True),
                              targets.cpu(0))
    sess = ort.InferenceSession(proto.SerializeToString())
    rng = np.random.default_rng(1)
    for shape in ((2, 8), (1, 24), (3, 5)):
        ids = rng.integers(0, 50, shape).astype("int64")
        ref = sess.run(None, {"input_ids": ids})[0]
        np.testing.assert_allclose(vm["main"](ids).numpy(), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(relax.RuntimeCheckError, match="seq = 25 exceeds 24"):
        vm["main"](np.zeros((1, 25), "int64"))
