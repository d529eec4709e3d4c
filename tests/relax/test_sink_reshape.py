"""SinkReshape: element-wise operations after a reshape of leading dims run on the value before
it, so a dense layer takes them as its fused epilogue (GPT-2's tanh GELU between two ``view``s);
the rewritten module computes what the original does (numpy, onnxruntime), and reshapes that
change the last dim, or operands broadcast along leading dims, stay as they are."""
import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.analysis import get_var2val
from tilecraft.relax.op.base import Op
from tilecraft.relax.transform import SinkReshape, get_pipeline
from tilecraft.relax.transform.sink_reshape import is_leading_reshape
from tilecraft.tensorir import te

D, F = 37, 70          # odd widths: ragged vector tails in the dense kernels


def _op_names(mod) -> list[str]:
    return [v.op.name for v in get_var2val(mod["main"]).values()
            if isinstance(getattr(v, "op", None), Op)]


def _kernels(mod) -> list[str]:
    """The kernels ``main`` calls once the default CPU pipeline has run."""
    built = get_pipeline(target="llvm", check=True)(mod)
    return [v.args[0].name_hint for v in get_var2val(built["main"]).values()
            if getattr(getattr(v, "op", None), "name", None) == "relax.call_tir"]


def _gelu_tanh(bb, v):
    """GPT-2's ``0.5 * v * (1 + tanh(sqrt(2 / pi) * (v + 0.044715 * v ** 3)))``, op by op."""
    half = bb.emit(op.multiply(v, const(np.float32(0.5))))
    cube = bb.emit(op.power(v, const(np.float32(3.0))))
    inner = bb.emit(op.add(v, bb.emit(op.multiply(cube, const(np.float32(0.044715))))))
    t = bb.emit(op.tanh(bb.emit(op.multiply(inner, const(np.float32(np.sqrt(2 / np.pi)))))))
    return bb.emit(op.multiply(half, bb.emit(op.add(t, const(np.float32(1.0))))))


def _ffn(rng, residual_3d: bool = False):
    """GPT-2's MLP as its export has it: ``view(-1, D)``, dense + bias, ``view(b, s, F)``, GELU,
    ``view(-1, F)``, dense, ``view(b, s, D)`` (symbolic b and s). With ``residual_3d`` the GELU's
    result is also multiplied by a (b, s, F) input: that operand is broadcast along no dim but
    is not a reshape, so that multiply cannot move, nor can the GELU it reads."""
    b, s = te.var("b"), te.var("s")
    w1 = const((rng.standard_normal((D, F)) / np.sqrt(D)).astype("float32"))
    bias = const(rng.standard_normal((1, 1, F)).astype("float32"))
    w2 = const((rng.standard_normal((F, D)) / np.sqrt(F)).astype("float32"))
    x = Var("x", TensorStructInfo((b, s, D), "float32"))
    params = [x]
    if residual_3d:
        r = Var("r", TensorStructInfo((b, s, F), "float32"))
        params.append(r)
    bb = BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            h = bb.emit(op.matmul(bb.emit(op.reshape(x, (b * s, D))), w1))
            h = bb.emit(op.add(bb.emit(op.reshape(h, (b, s, F))), bias))
            g = _gelu_tanh(bb, h)
            if residual_3d:
                g = bb.emit(op.multiply(g, r))
            y = bb.emit(op.matmul(bb.emit(op.reshape(g, (b * s, F))), w2))
            out = bb.emit_output(bb.emit(op.reshape(y, (b, s, D))))
        bb.emit_func_output(out)
    return bb.get(), (w1.data, bias.data, w2.data)


def _ffn_numpy(x, w1, bias, w2, r=None):
    h = (x.reshape(-1, D).astype("float64") @ w1).reshape(x.shape[:2] + (F,)) + bias
    g = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    if r is not None:
        g = g * r
    return (g.reshape(-1, F) @ w2).reshape(x.shape[:2] + (D,))


def test_leading_reshape():
    n = te.var("n")
    assert is_leading_reshape((n * 3, 8), (n, 3, 8))
    assert is_leading_reshape((n, 3, 8), (n * 3, 8))
    assert not is_leading_reshape((n, 3, 8), (n, 24))
    assert not is_leading_reshape((), (1,))


def test_gelu_moves_before_the_reshapes():
    mod, _ = _ffn(np.random.default_rng(0))
    names = _op_names(mod)
    assert names.count("relax.reshape") == 4
    new = SinkReshape()(mod)
    names = _op_names(new)
    # left: the input's view, the output's view and the bias as a vector; the two views
    # around the GELU cancel
    assert names.count("relax.reshape") == 3, names
    assert names.count("relax.tanh") == 1


def test_gelu_is_the_dense_layers_epilogue_and_matches_numpy():
    rng = np.random.default_rng(1)
    mod, (w1, bias, w2) = _ffn(rng)
    kernels = _kernels(mod)
    gelu = [k for k in kernels if "tanh" in k]
    assert len(gelu) == 1 and "dense" in gelu[0], kernels
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    for shape in ((1, 1), (3, 5), (2, 17)):
        x = rng.standard_normal(shape + (D,)).astype("float32")
        got = vm["main"](x).numpy()
        np.testing.assert_allclose(got, _ffn_numpy(x, w1, bias, w2), rtol=2e-4, atol=2e-4)


def test_operand_broadcast_along_leading_dims_stays():
    rng = np.random.default_rng(2)
    mod, (w1, bias, w2) = _ffn(rng, residual_3d=True)
    # the multiply by the 3-d input cannot move, so the GELU's result is read in the 3-d
    # shape: moved, the GELU would need a reshape copy after it; nothing moves
    assert SinkReshape()(mod) is mod
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    x = rng.standard_normal((3, 5, D)).astype("float32")
    r = rng.standard_normal((3, 5, F)).astype("float32")
    np.testing.assert_allclose(vm["main"](x, r).numpy(), _ffn_numpy(x, w1, bias, w2, r),
                               rtol=2e-4, atol=2e-4)


def test_reshape_of_the_last_dim_stays():
    x = Var("x", TensorStructInfo((6, 8), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            v = bb.emit(op.reshape(x, (6, 2, 4)))
            out = bb.emit_output(bb.emit(op.tanh(v)))
        bb.emit_func_output(out)
    mod = bb.get()
    assert SinkReshape()(mod) is mod


def test_onnx_gpt2_mlp_matches_onnxruntime():
    pytest.importorskip("onnx", reason="the ONNX test needs the onnx package")
    ort = pytest.importorskip("onnxruntime", reason="the ONNX test needs onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    from tilecraft.relax.frontend import from_onnx
    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((D, F)) / np.sqrt(D)).astype("float32")
    b1 = rng.standard_normal(F).astype("float32")
    w2 = (rng.standard_normal((F, D)) / np.sqrt(F)).astype("float32")
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (w1, "w1"), (b1, "b1"), (w2, "w2"), (np.array([-1, D], "int64"), "flat_d"),
        (np.array([-1, F], "int64"), "flat_f"), (np.array([0, 0, F], "int64"), "shape_f"),
        (np.array([0, 0, D], "int64"), "shape_d"), (np.array(0.5, "float32"), "half"),
        (np.array(3.0, "float32"), "three"), (np.array(0.044715, "float32"), "c"),
        (np.array(np.sqrt(2 / np.pi), "float32"), "k"), (np.array(1.0, "float32"), "one"))]
    N = helper.make_node
    nodes = [N("Reshape", ["x", "flat_d"], ["x2"]), N("MatMul", ["x2", "w1"], ["h0"]),
             N("Add", ["h0", "b1"], ["h1"]), N("Shape", ["x"], ["xs"]),
             # (b, s, F) from x's shape: as the export computes it
             N("Slice", ["xs", "zero", "two"], ["bs"]),
             N("Concat", ["bs", "f1"], ["shape3"], axis=0),
             N("Reshape", ["h1", "shape3"], ["h"]),
             N("Mul", ["h", "half"], ["m0"]), N("Pow", ["h", "three"], ["p"]),
             N("Mul", ["p", "c"], ["m1"]), N("Add", ["h", "m1"], ["a0"]),
             N("Mul", ["a0", "k"], ["m2"]), N("Tanh", ["m2"], ["t"]),
             N("Add", ["t", "one"], ["a1"]), N("Mul", ["m0", "a1"], ["g"]),
             N("Reshape", ["g", "flat_f"], ["g2"]), N("MatMul", ["g2", "w2"], ["y2"]),
             N("Concat", ["bs", "d1"], ["shape_out"], axis=0),
             N("Reshape", ["y2", "shape_out"], ["y"])]
    inits += [numpy_helper.from_array(np.array(v, "int64"), n) for v, n in (
        ([0], "zero"), ([2], "two"), ([F], "f1"), ([D], "d1"))]
    graph = helper.make_graph(
        nodes, "gpt2_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    mod = from_onnx(model)
    kernels = _kernels(mod)
    assert not [k for k in kernels if "tanh" in k and "dense" not in k], kernels
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    for shape in ((1, 7), (3, 11)):
        x = rng.standard_normal(shape + (D,)).astype("float32")
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(vm["main"](x).numpy(), want, rtol=2e-4, atol=2e-4)
