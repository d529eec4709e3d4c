"""The ONNX frontend: ``from_onnx(model, shape_dict=None, keep_params_in_input=False, opset=None)``."""
from tilecraft.optional import import_optional

import_optional("onnx", "the ONNX frontend (relax.frontend.from_onnx)")

from .importer import from_onnx  # noqa: E402  (after the check that names the install command)
