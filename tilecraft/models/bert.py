"""One BERT encoder layer (post-layer-norm, as the original BERT), symbolic batch and sequence."""
from __future__ import annotations

import math

import numpy as np

from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op

from .common import Model, erf, initializer, make_onnx_model, tensor_value_info, uniform


def bert_encoder_layer(hidden: int = 768, heads: int = 12, ffn: int = 3072,
                       epsilon: float = 1e-12, dtype: str = "float32", seed: int = 0,
                       batch: int | str = "batch", seq_len: int | str = "seq_len") -> Model:
    """One BERT-base encoder layer on ``x: (batch, seq_len, hidden)``, both dims symbolic::

        q, k, v = x @ Wq + bq, x @ Wk + bk, x @ Wv + bv           # (b, s, hidden)
        heads:   reshape (b, s, heads, hidden / heads), permute to (b, heads, s, d)
        scores = softmax(q @ k^T / sqrt(d), axis=-1)              # (b, heads, s, s)
        ctx    = (scores @ v) permuted back and reshaped to (b, s, hidden)
        h      = layer_norm(ctx @ Wo + bo + x)
        out    = layer_norm(gelu(h @ W1 + b1) @ W2 + b2 + h)      # GELU: the exact (erf) form

    Weights are ``(in, out)`` matrices (``relax.op.matmul``, ONNX ``MatMul``), uniform in
    ``+-1/sqrt(in)``; layer-norm scales near 1 and shifts near 0, all from
    ``numpy.random.default_rng(seed)``. The ONNX model (opset 20) uses ``Reshape`` with 0
    (copy the dim) for the symbolic dims, ``LayerNormalization`` and ``Gelu``. Int ``batch`` /
    ``seq_len`` make those dims static (for comparison).

    Examples
    --------
    >>> m = bert_encoder_layer(hidden=64, heads=4, ffn=256)
    >>> m.dims
    ('batch', 'seq_len')
    """
    if hidden % heads:
        raise ValueError(f"bert_encoder_layer: hidden {hidden} is not a multiple of heads {heads}")
    d = hidden // heads
    rng = np.random.default_rng(seed)
    p = {}
    for nm in ("q", "k", "v", "o"):
        p[f"W{nm}"] = uniform(rng, (hidden, hidden), hidden, dtype)
        p[f"b{nm}"] = uniform(rng, (hidden,), hidden, dtype)
    p["W1"], p["b1"] = uniform(rng, (hidden, ffn), hidden, dtype), uniform(rng, (ffn,), hidden,
                                                                            dtype)
    p["W2"], p["b2"] = uniform(rng, (ffn, hidden), ffn, dtype), uniform(rng, (hidden,), ffn,
                                                                         dtype)
    for i in (1, 2):
        p[f"ln{i}_g"] = (1.0 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
        p[f"ln{i}_b"] = (0.1 * rng.standard_normal(hidden)).astype(dtype)
    scale = math.sqrt(d)
    scale_arr = np.array([scale], dtype)

    # Relax
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, seq_len, hidden), dtype))
    b, s = x.struct_info.shape[:2]          # the symbolic dims, for the reshapes

    def dense(h, nm):
        return bb.emit(op.add(bb.emit(op.matmul(h, const(p[f"W{nm}"]))), const(p[f"b{nm}"])))

    def split_heads(h, perm):
        return bb.emit(op.permute_dims(bb.emit(op.reshape(h, (b, s, heads, d))), perm))

    with bb.function("main", [x]):
        with bb.dataflow():
            q = split_heads(dense(x, "q"), [0, 2, 1, 3])           # (b, heads, s, d)
            kt = split_heads(dense(x, "k"), [0, 2, 3, 1])          # (b, heads, d, s)
            v = split_heads(dense(x, "v"), [0, 2, 1, 3])           # (b, heads, s, d)
            # a (1,) constant, not a Python scalar: relax.Executable stores 0-d constants as
            # shape (1,) (np.ascontiguousarray), which the kernel's rank check then refuses
            scores = bb.emit(op.divide(bb.emit(op.matmul(q, kt)), const(scale_arr)))
            probs = bb.emit(op.nn.softmax(scores, axis=-1))
            ctx = bb.emit(op.permute_dims(bb.emit(op.matmul(probs, v)), [0, 2, 1, 3]))
            ctx = bb.emit(op.reshape(ctx, (b, s, hidden)))
            attn = bb.emit(op.add(dense(ctx, "o"), x))
            h = bb.emit(op.nn.layer_norm(attn, const(p["ln1_g"]), const(p["ln1_b"]), axes=-1,
                                         epsilon=epsilon))
            f = bb.emit(op.nn.gelu(dense(h, "1")))
            f = bb.emit(op.add(dense(f, "2"), h))
            out = bb.emit(op.nn.layer_norm(f, const(p["ln2_g"]), const(p["ln2_b"]), axes=-1,
                                           epsilon=epsilon))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    mod = bb.get()

    # numpy
    p64 = {k: v.astype(np.float64) for k, v in p.items()}

    def layer_norm(t, g, beta):
        mean = t.mean(-1, keepdims=True)
        var = ((t - mean) ** 2).mean(-1, keepdims=True)
        return (t - mean) / np.sqrt(var + epsilon) * g + beta

    def reference(x: np.ndarray) -> np.ndarray:
        xb, xs = x.shape[:2]
        t = x.astype(np.float64)

        def heads_of(nm):
            return (t @ p64[f"W{nm}"] + p64[f"b{nm}"]).reshape(xb, xs, heads, d).transpose(
                0, 2, 1, 3)
        q, k, v = heads_of("q"), heads_of("k"), heads_of("v")
        sc = q @ k.transpose(0, 1, 3, 2) / scale
        e = np.exp(sc - sc.max(-1, keepdims=True))
        pr = e / e.sum(-1, keepdims=True)
        ctx = (pr @ v).transpose(0, 2, 1, 3).reshape(xb, xs, hidden)
        h = layer_norm(ctx @ p64["Wo"] + p64["bo"] + t, p64["ln1_g"], p64["ln1_b"])
        f = h @ p64["W1"] + p64["b1"]
        f = 0.5 * f * (1.0 + erf(f / math.sqrt(2.0)))
        f = f @ p64["W2"] + p64["b2"] + h
        return layer_norm(f, p64["ln2_g"], p64["ln2_b"]).astype(dtype)

    # ONNX
    from onnx import helper
    n = helper.make_node
    inits = [initializer(k, v) for k, v in p.items()]
    inits += [initializer("heads_shape", np.array([0, 0, heads, d], np.int64)),
              initializer("hidden_shape", np.array([0, 0, hidden], np.int64)),
              initializer("scale", np.array(scale, dtype))]
    nodes = []

    def o_dense(src, nm, out):
        nodes.extend([n("MatMul", [src, f"W{nm}"], [f"{out}_mm"]),
                      n("Add", [f"{out}_mm", f"b{nm}"], [out])])

    for nm, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        o_dense("x", nm, nm)
        nodes.append(n("Reshape", [nm, "heads_shape"], [f"{nm}4"]))
        nodes.append(n("Transpose", [f"{nm}4"], [f"{nm}h"], perm=perm))
    nodes += [n("MatMul", ["qh", "kh"], ["qk"]),
              n("Div", ["qk", "scale"], ["scores"]),
              n("Softmax", ["scores"], ["probs"], axis=-1),
              n("MatMul", ["probs", "vh"], ["ctx4"]),
              n("Transpose", ["ctx4"], ["ctx_t"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ctx_t", "hidden_shape"], ["ctx"])]
    o_dense("ctx", "o", "attn_o")
    nodes += [n("Add", ["attn_o", "x"], ["attn"]),
              n("LayerNormalization", ["attn", "ln1_g", "ln1_b"], ["h"], axis=-1,
                epsilon=epsilon)]
    o_dense("h", "1", "f1")
    nodes.append(n("Gelu", ["f1"], ["g1"]))
    o_dense("g1", "2", "f2")
    nodes += [n("Add", ["f2", "h"], ["res2"]),
              n("LayerNormalization", ["res2", "ln2_g", "ln2_b"], ["y"], axis=-1,
                epsilon=epsilon)]
    onnx_model = make_onnx_model(
        nodes, [tensor_value_info("x", dtype, [batch, seq_len, hidden])],
        [tensor_value_info("y", dtype, [batch, seq_len, hidden])], inits, "bert_layer")

    def make_inputs(rng: np.random.Generator, batch: int, seq_len: int) -> list[np.ndarray]:
        return [rng.standard_normal((batch, seq_len, hidden)).astype(dtype)]

    dims = tuple(d for d in (batch, seq_len) if isinstance(d, str))
    return Model("bert_layer", mod, reference, onnx_model, ["x"], dims, make_inputs, p)
