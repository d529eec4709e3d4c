"""Symbolic dims through a whole imported transformer: a 2-layer BERT-style encoder written as
PyTorch's exporter writes it (shape arithmetic with Shape / Gather / Concat for the attention
reshapes, Range for the positions, decomposed layer norm and GELU, an additive attention mask).
One build serves every batch size and sequence length."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilecraft import relax
from tilecraft import relax
import tilecraft.relax.frontend
from tilecraft import targets
from onnx_testutil import run_onnxruntime

HIDDEN, HEADS, FFN, VOCAB, MAX_POS = 32, 4, 64, 50, 256


def _encoder(rng, layers=2):
    inits, nodes = {}, []
    k = [0]

    def w(shape, scale=0.2):
        k[0] += 1
        name = f"w{k[0]}"
        inits[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
        return name

    def const(value, dtype=np.int64):
        k[0] += 1
        name = f"c{k[0]}"
        inits[name] = np.array(value, dtype=dtype)
        return name

    def node(op, ins, **attrs):
        k[0] += 1
        out = f"t{k[0]}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def layer_norm(x):
        mean = node("ReduceMean", [x], axes=[-1])
        d = node("Sub", [x, mean])
        var = node("ReduceMean", [node("Pow", [d, const(2.0, np.float32)])], axes=[-1])
        den = node("Sqrt", [node("Add", [var, const(1e-5, np.float32)])])
        return node("Add", [node("Mul", [node("Div", [d, den]), w((HIDDEN,), 1.0)]),
                            w((HIDDEN,))])

    def dense(x, n_in, n_out):
        return node("Add", [node("MatMul", [x, w((n_in, n_out), n_in ** -0.5)]), w((n_out,))])

    # the shapes the exporter computes: batch and sequence length from the input
    shape = node("Shape", ["input_ids"])
    batch = node("Unsqueeze", [node("Gather", [shape, const(0)], axis=0)], axes=[0])
    seq = node("Gather", [shape, const(1)], axis=0)
    seq1 = node("Unsqueeze", [seq], axes=[0])
    heads_shape = node("Concat", [batch, seq1, const([HEADS]), const([HIDDEN // HEADS])], axis=0)
    merged_shape = node("Concat", [batch, seq1, const([HIDDEN])], axis=0)

    positions = node("Range", [const(0), seq, const(1)])
    x = node("Add", [node("Gather", [w((VOCAB, HIDDEN), 1.0), "input_ids"], axis=0),
                     node("Gather", [w((MAX_POS, HIDDEN), 1.0), positions], axis=0)])
    x = layer_norm(x)
    # (batch, seq) 1/0 mask -> (batch, 1, 1, seq) additive
    m = node("Cast", [node("Unsqueeze", [node("Unsqueeze", ["mask"], axes=[1])], axes=[2])],
             to=TensorProto.FLOAT)
    bias = node("Mul", [node("Sub", [const(1.0, np.float32), m]), const(-10000.0, np.float32)])
    for _ in range(layers):
        def heads(t):
            return node("Transpose", [node("Reshape", [t, heads_shape])], perm=[0, 2, 1, 3])
        q, kk, v = (heads(dense(x, HIDDEN, HIDDEN)) for _ in range(3))
        scores = node("Div", [node("MatMul", [q, node("Transpose", [kk], perm=[0, 1, 3, 2])]),
                              const(np.sqrt(HIDDEN // HEADS), np.float32)])
        probs = node("Softmax", [node("Add", [scores, bias])], axis=-1)
        ctx = node("Reshape", [node("Transpose", [node("MatMul", [probs, v])], perm=[0, 2, 1, 3]),
                               merged_shape])
        x = layer_norm(node("Add", [x, dense(ctx, HIDDEN, HIDDEN)]))
        h = dense(x, HIDDEN, FFN)
        gelu = node("Mul", [node("Mul", [h, node("Add", [node("Erf", [node(
            "Div", [h, const(np.sqrt(2.0), np.float32)])]), const(1.0, np.float32)])]),
            const(0.5, np.float32)])
        x = layer_norm(node("Add", [x, dense(gelu, FFN, HIDDEN)]))
    nodes.append(helper.make_node("Identity", [x], ["hidden"]))
    g = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])


def test_encoder_with_symbolic_batch_and_sequence_one_build():
    rng = np.random.default_rng(0)
    model = _encoder(rng)
    mod = relax.frontend.from_onnx(model)
    text = relax.printer.to_script(mod)
    # the dims stay symbolic through the whole graph: no run-time shape computation
    assert 'input_ids: R.Tensor((batch, seq), "int64")' in text
    assert "R.Tensor((batch, seq, 4, 8)" in text and "R.Tensor((batch, 4, seq, seq)" in text
    assert "tensor_to_shape" not in text and "match_cast" not in text
    exe = relax.build(mod, "llvm")
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    for batch, seq in ((2, 7), (1, 128), (3, 1)):
        ids = rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), np.int64)
        mask[0, seq // 2:] = 0
        out = vm["main"](ids, mask).numpy()
        (ref,) = run_onnxruntime(model, [ids, mask])
        assert out.shape == (batch, seq, HIDDEN)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_shape_dict_renames_and_fixes_dims():
    rng = np.random.default_rng(1)
    model = _encoder(rng, layers=1)
    mod = relax.frontend.from_onnx(model, shape_dict={"input_ids": [1, "n"], "mask": [1, "n"]})
    text = relax.printer.to_script(mod)
    assert 'R.Tensor((1, n), "int64")' in text and "R.Tensor((1, n, 32)" in text
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    ids = rng.integers(0, VOCAB, (1, 9)).astype(np.int64)
    mask = np.ones((1, 9), np.int64)
    np.testing.assert_allclose(vm["main"](ids, mask).numpy(),
                               run_onnxruntime(model, [ids, mask])[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="dimension 0"):
        vm["main"](np.zeros((2, 9), np.int64), np.ones((2, 9), np.int64))
