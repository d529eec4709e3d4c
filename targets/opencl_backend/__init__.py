"""The OpenCL back end: TIR -> OpenCL C (``codegen``) and a runtime on ``pyopencl``
(``runtime``). Importing this package registers the ``opencl`` device runtime but does not
import ``pyopencl``: that happens when a device is first used. See ``docs/gpu.md``."""
from .runtime import (DeviceContext, OpenCLBuildError, OpenCLError, OpenCLNDArray, context,
                      find_device, list_devices)
from .module import OpenCLModule, is_opencl_module_file
from .build import build_module
from ..runtime.module import register_module_loader as _register_module_loader

_register_module_loader(is_opencl_module_file, OpenCLModule.load)

__all__ = ["DeviceContext", "OpenCLBuildError", "OpenCLError", "OpenCLNDArray", "OpenCLModule",
           "build_module", "context", "find_device", "list_devices"]
