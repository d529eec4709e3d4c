"""ONNX ModelProto -> Relax IRModule (work in progress)."""
from __future__ import annotations


def from_onnx(model, shape_dict=None, keep_params_in_input=False, opset=None):
    """Import an ONNX model into a Relax ``IRModule`` (being written; see docs/frontends.md)."""
    raise NotImplementedError("relax.frontend.from_onnx is being written")
