"""What every model builder returns (``Model``), and small helpers shared by the builders."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from tilecraft.tensorir.function import IRModule


@dataclass
class Model:
    """One network in its three forms, with the same weights.

    Attributes
    ----------
    name : str
        A short label (``"mlp"``, ``"bert_layer"``, ``"resnet_bottleneck"``).
    mod : IRModule
        The Relax module: ``main`` takes ``input_names`` with the symbolic dims in ``dims``.
    reference : callable
        ``reference(*inputs) -> np.ndarray``: the same computation in numpy (float64 inside,
        the input dtype out).
    onnx_model : onnx.ModelProto
        The same graph for onnxruntime; symbolic dims are ``dim_param`` of the same names.
    input_names : list[str]
        The names of ``main``'s parameters and of the ONNX graph inputs, in order.
    dims : tuple[str, ...]
        The symbolic dims of the inputs (``("batch",)``, ``("batch", "seq_len")``).
    make_inputs : callable
        ``make_inputs(rng, **sizes) -> list[np.ndarray]``: random inputs for the given sizes
        of ``dims`` (``make_inputs(rng, batch=2, seq_len=7)``).
    """

    name: str
    mod: IRModule
    reference: Callable[..., np.ndarray]
    onnx_model: object
    input_names: list[str]
    dims: tuple[str, ...]
    make_inputs: Callable[..., list[np.ndarray]]
    params: dict[str, np.ndarray] = field(default_factory=dict, repr=False)


def onnx_session(model: Model, threads: int = 2):
    """An onnxruntime ``InferenceSession`` of ``model.onnx_model`` on ``threads`` intra-op threads
    (graph optimizations on: onnxruntime fuses and pre-packs as it normally would)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.onnx_model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def uniform(rng: np.random.Generator, shape: Sequence[int], fan_in: int,
            dtype: str = "float32") -> np.ndarray:
    """Weights uniform in ``+-1/sqrt(fan_in)`` (PyTorch's default init), so that activations
    keep their scale through the layers."""
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=tuple(shape)).astype(dtype)


_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function elementwise (scipy's when installed, else ``math.erf``), float64."""
    try:
        from scipy.special import erf as sp_erf
        return sp_erf(np.asarray(x, np.float64))
    except ImportError:  # pragma: no cover - scipy is optional
        return _ERF(np.asarray(x, np.float64)).astype(np.float64)


def tensor_value_info(name: str, dtype: str, shape: Sequence) -> object:
    """An ONNX ValueInfo; str dims become ``dim_param``."""
    from onnx import helper
    from onnx.helper import np_dtype_to_tensor_dtype
    return helper.make_tensor_value_info(name, np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                         list(shape))


def initializer(name: str, array: np.ndarray) -> object:
    from onnx import numpy_helper
    return numpy_helper.from_array(np.ascontiguousarray(array), name)


def make_onnx_model(nodes, inputs, outputs, initializers, name: str, opset: int = 20):
    """A checked ONNX model of one graph."""
    import onnx
    from onnx import helper
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="tilecraft-benchmarks")
    model.ir_version = min(model.ir_version, 10)   # what current onnxruntime releases read
    onnx.checker.check_model(model)
    return model
