"""The ONNX frontend: ``from_onnx(model, shape_dict=None, keep_params_in_input=False, opset=None)``."""
from .importer import from_onnx
