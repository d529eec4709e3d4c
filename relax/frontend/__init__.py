"""Frontends: import models from other frameworks into Relax.

``relax.frontend.from_onnx(onnx_model, shape_dict=None)`` imports an ONNX ``ModelProto``; every
frontend raises ``relax.frontend.UnsupportedError`` listing all the operators and attributes of
the model it cannot import, and ``ValueError`` for a malformed model. See docs/frontends.md.
"""
from .common import UnsupportedError
from .onnx import from_onnx
