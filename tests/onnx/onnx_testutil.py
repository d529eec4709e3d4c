"""Helpers of the ONNX frontend tests: build small models, run them through tilecraft and
onnxruntime, compare."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tilecraft import relax
from tilecraft import relax
import tilecraft.relax.frontend
from tilecraft import targets

# the tests build many tiny models: LLVM's optimizations change no result, only build time
TARGET = "llvm -opt-level=0"

NP_TO_ONNX = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("float64"): TensorProto.DOUBLE,
              np.dtype("float16"): TensorProto.FLOAT16, np.dtype("int64"): TensorProto.INT64,
              np.dtype("int32"): TensorProto.INT32, np.dtype("int8"): TensorProto.INT8,
              np.dtype("uint8"): TensorProto.UINT8, np.dtype("bool"): TensorProto.BOOL,
              np.dtype("int16"): TensorProto.INT16, np.dtype("uint16"): TensorProto.UINT16,
              np.dtype("uint32"): TensorProto.UINT32, np.dtype("uint64"): TensorProto.UINT64}


def value_info(name, dtype, shape):
    return helper.make_tensor_value_info(name, NP_TO_ONNX[np.dtype(dtype)], shape)


def make_model(nodes, inputs, outputs, initializers=None, opset=17):
    """``inputs`` / ``outputs``: (name, dtype, shape) triples (shape entries may be names);
    ``initializers``: name -> numpy array."""
    g = helper.make_graph(
        nodes, "test",
        [value_info(*i) for i in inputs],
        [value_info(*o) if len(o) == 3 else helper.make_tensor_value_info(o[0], 0, None)
         for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def run_tilecraft(model, feeds: list, shape_dict=None, target=TARGET, **kwargs):
    mod = relax.frontend.from_onnx(model, shape_dict=shape_dict, **kwargs)
    vm = relax.VirtualMachine(relax.build(mod, target), targets.cpu(0))
    out = vm["main"](*feeds)
    outs = list(out) if isinstance(out, tuple) else [out]
    return [o.numpy() for o in outs]


def run_onnxruntime(model, feeds: list):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    return sess.run(None, dict(zip(names, feeds)))


def check(model, feeds: list, rtol=1e-5, atol=1e-5, shape_dict=None, **kwargs):
    """tilecraft's outputs equal onnxruntime's (same shapes and dtypes)."""
    ours = run_tilecraft(model, feeds, shape_dict=shape_dict, **kwargs)
    ref = run_onnxruntime(model, feeds)
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape, f"output {k}: shape {a.shape} vs onnxruntime {b.shape}"
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype} vs onnxruntime {b.dtype}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")
    return ours


def rand(rng, shape, dtype="float32", lo=-1.0, hi=1.0):
    if np.dtype(dtype).kind == "f":
        return rng.uniform(lo, hi, shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    return rng.integers(int(lo), int(hi), shape).astype(dtype)


def one_node(op, inputs, outputs, attrs=None, initializers=None, opset=17, node_inputs=None,
             node_outputs=None):
    """A model of one node: ``inputs`` are (name, dtype, shape); initializers feed the node too
    (list their names in ``node_inputs`` in order)."""
    node = helper.make_node(op, node_inputs or [i[0] for i in inputs],
                            node_outputs or [o[0] for o in outputs], **(attrs or {}))
    return make_model([node], inputs, outputs, initializers, opset)
