"""Model builders for the end-to-end tests, the Relax benchmarks and the zoo (``bert_layer``).

Each builder makes one network three times over, with the same random weights (a seeded numpy
RNG): a Relax ``IRModule`` built with ``BlockBuilder`` and ``relax.op`` (batch and sequence dims
symbolic), a numpy reference function, and an equivalent ONNX model (``onnx.helper``; the weights
as initializers, the symbolic dims as ``dim_param``) so that onnxruntime runs the same graph.

- ``mlp()``: a 4-layer perceptron, 784-1024-1024-1024-10 with relu (``mlp.py``);
- ``bert_encoder_layer()``: one BERT-base encoder layer, hidden 768, 12 heads, FFN 3072, GELU,
  post-layer-norm (``bert.py``);
- ``resnet_bottleneck()``: a ResNet-50 bottleneck block, 256 -> 64 -> 64 -> 256 channels at
  56x56, NCHW, inference batch norm (``resnet.py``).

Examples
--------
>>> import numpy as np
>>> from tilecraft import relax
>>> from tilecraft.models import mlp
>>> m = mlp(in_features=16, hidden=(32,), out_features=4)
>>> exe = relax.build(m.mod, "llvm")                                   # doctest: +SKIP
>>> x, = m.make_inputs(np.random.default_rng(0), batch=3)
>>> vm = relax.VirtualMachine(exe)                                     # doctest: +SKIP
>>> np.allclose(vm["main"](x).numpy(), m.reference(x), rtol=1e-4)     # doctest: +SKIP
True
"""
from __future__ import annotations

from .common import Model, onnx_session
from .mlp import mlp
from .bert import bert_encoder_layer
from .resnet import resnet_bottleneck

__all__ = ["Model", "onnx_session", "mlp", "bert_encoder_layer", "resnet_bottleneck"]
