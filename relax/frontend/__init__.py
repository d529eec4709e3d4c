"""Frontends: import models from other frameworks into Relax.

``relax.frontend.from_onnx(onnx_model, shape_dict=None)`` imports an ONNX ``ModelProto``;
``relax.frontend.from_torch(exported_program)`` a ``torch.export`` program (torch is imported only
when it is called); every
frontend raises ``relax.frontend.UnsupportedError`` listing all the operators and attributes of
the model it cannot import, and ``ValueError`` for a malformed model. See docs/frontends.md.
"""
from .common import UnsupportedError, detach_params
from .onnx import from_onnx
from .torch import from_torch
