"""TIR -> OpenCL C: the OpenCL table over the shared C-style generator (``targets.gpu_codegen``).

One ``__kernel`` per device kernel of the device form (``docs/lowering.md``):

* ``blockIdx.x`` -> ``get_group_id(0)``, ``threadIdx.x`` -> ``get_local_id(0)`` (as ``int``);
  each kernel carries ``reqd_work_group_size`` so the compiler knows its work-group shape;
* buffers are ``__global T* restrict`` parameters (``const`` when only read), scalars ``int``;
* ``shared`` buffers are ``__local`` arrays at the top of the kernel, ``local`` ones private
  arrays; the barrier is ``barrier(CLK_LOCAL_MEM_FENCE)``;
* vectorized loops of 2, 4, 8 or 16 lanes become ``vloadN`` / ``vstoreN`` (which need only
  element alignment);
* ``float64`` enables ``cl_khr_fp64``, ``float16`` ``cl_khr_fp16`` — the runtime refuses to
  build for a device that does not report the extension, with a clear error.

Examples
--------
>>> from tilecraft.targets.opencl_backend.codegen import opencl_source       # doctest: +SKIP
>>> print(opencl_source(split.kernels))                            # doctest: +SKIP
"""
from __future__ import annotations

from typing import Mapping, Sequence

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import stmt as S
from tilecraft.tensorir.expr import Var
from tilecraft.tensorir.transform.device import DeviceKernel

from ..gpu_codegen import CodegenC

_AXIS = {"x": 0, "y": 1, "z": 2}


class OpenCLCodegen(CodegenC):
    """OpenCL C 1.2 for one kernel."""

    def thread_index(self, tag: str) -> str:
        kind, axis = tag.split(".")
        fn = "get_group_id" if kind == "blockIdx" else "get_local_id"
        return f"((int){fn}({_AXIS[axis]}))"

    def barrier_stmt(self) -> str:
        return "barrier(CLK_LOCAL_MEM_FENCE);"

    def kernel_signature(self, kernel: DeviceKernel, params: list[str]) -> str:
        x, y, z = kernel.block
        return (f"__kernel __attribute__((reqd_work_group_size({x}, {y}, {z}))) void "
                f"{kernel.name}({', '.join(params)})")

    def buffer_param(self, buf: S.Buffer, name: str, written: bool) -> str:
        const = "" if written else "const "
        return f"__global {const}{self.storage_type(buf.dtype)}* restrict {name}"

    # a vector read lane by lane; float4 accesses at a provable multiple of 4 elements are
    # aligned pointer accesses (vloadN only assumes element alignment: NVIDIA's compiler then
    # emits four scalar loads instead of one 128-bit load)
    VECTOR_LANE_ACCESS = "{v}.s{i:x}"
    VECTOR_ALIGN = 16

    def shared_decl(self, buf: S.Buffer, name: str, size: int) -> str:
        # aligned so that a float4 access at a multiple of 4 elements is a 128-bit access
        return (f"__local {self.storage_type(buf.dtype)} {name}[{size}] "
                f"__attribute__((aligned({self.VECTOR_ALIGN})));")

    def _space(self, buf: S.Buffer) -> str:
        return "__local" if buf.scope == "shared" else "__global"

    def aligned_vector_load(self, lanes: int, ptr: str, buf: S.Buffer) -> str:
        vt = self.type_name(dt.with_lanes(buf.dtype, lanes))
        return f"(*(({self._space(buf)} const {vt}*)({ptr})))"

    def aligned_vector_store(self, lanes: int, value: str, ptr: str, buf: S.Buffer) -> str:
        vt = self.type_name(dt.with_lanes(buf.dtype, lanes))
        return f"*(({self._space(buf)} {vt}*)({ptr})) = {value};"

    def vector_load(self, lanes: int, ptr: str) -> str:
        return f"vload{lanes}(0, {ptr})"

    def vector_store(self, lanes: int, value: str, ptr: str) -> str:
        return f"vstore{lanes}({value}, 0, {ptr});"


def opencl_source(kernels: Sequence[DeviceKernel],
                  nonneg_scalars: Mapping[str, Sequence[Var]] | None = None
                  ) -> tuple[str, set[str]]:
    """The OpenCL C program of ``kernels`` (``DeviceKernel``s) and the extensions it needs.

    ``nonneg_scalars`` maps a kernel's name to its scalar parameters that are ``>= 0``
    (``gpu_codegen.nonneg_scalars``: the shape sizes), for cheaper integer division.
    """
    bodies = []
    needs: set[str] = set()
    dtypes: set[str] = set()
    for k in kernels:
        gen = OpenCLCodegen()
        bodies.append(gen.kernel_source(k, (nonneg_scalars or {}).get(k.name, ())))
        needs |= gen.needs
        dtypes |= gen.dtypes_used
    extensions = set()
    head = []
    if "float64" in dtypes:
        extensions.add("cl_khr_fp64")
        head.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if "float16" in dtypes:
        extensions.add("cl_khr_fp16")
        head.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    # the floor division helpers, by C type then kind (int8 and int16 share char / short's)
    helpers = {}
    for n in needs:
        kind, dtype = n.split("_", 1)
        helpers.setdefault((OpenCLCodegen.TYPES[dtype], kind), dtype)
    for (_, kind), dtype in sorted(helpers.items()):
        head.append(OpenCLCodegen().floor_helper_definition(kind, dtype))
    return "\n".join(head + ([""] if head else []) + ["\n\n".join(bodies)]) + "\n", extensions


__all__ = ["OpenCLCodegen", "opencl_source"]
