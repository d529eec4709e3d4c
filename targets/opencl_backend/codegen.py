"""TIR -> OpenCL C: the OpenCL table over the shared C-style generator (``targets.gpu_codegen``).

One ``__kernel`` per device kernel of the device form (``docs/lowering.md``):

* ``blockIdx.x`` -> ``get_group_id(0)``, ``threadIdx.x`` -> ``get_local_id(0)`` (as ``int``);
  each kernel carries ``reqd_work_group_size`` so the compiler knows its work-group shape;
* buffers are ``__global T* restrict`` parameters (``const`` when only read), scalars ``int``;
* ``shared`` buffers are ``__local`` arrays at the top of the kernel, ``local`` ones private
  arrays; the barrier is ``barrier(CLK_LOCAL_MEM_FENCE)``;
* vectorized loops of 2, 4, 8 or 16 lanes become ``vloadN`` / ``vstoreN`` (which need only
  element alignment);
* ``float64`` enables ``cl_khr_fp64`` (the runtime refuses a device without it);
* ``float16`` has two forms. By default (``Target("opencl")``) it is a *storage* format, as
  OpenCL 1.2 itself defines it for every device: float16 buffers are ``__global half*``, read
  with ``vload_half`` / ``vload_halfN`` (to float) and written with ``vstore_half_rte`` /
  ``vstore_halfN_rte``; the arithmetic runs in float, each float16 result rounded to half
  precision (``tc_round_half``, op for op as numpy) unless it is exact (min, max, select,
  negation); shared and private float16 arrays are float arrays (converted once, when loaded
  from global memory). With ``Target("opencl -supports-float16=1")`` it is ``half`` arithmetic
  with ``half2`` / ``half4`` / ``half8`` vectors under ``cl_khr_fp16``, and the runtime refuses a
  device that does not report that extension, with a clear error.

Examples
--------
>>> from tilecraft.targets.opencl_backend.codegen import opencl_source       # doctest: +SKIP
>>> print(opencl_source(split.kernels))                            # doctest: +SKIP
"""
from __future__ import annotations

import math

from typing import Mapping, Sequence

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import expr as E
from tilecraft.tensorir import stmt as S
from tilecraft.tensorir.expr import Var
from tilecraft.tensorir.structural import structural_equal
from tilecraft.tensorir.transform.device import DeviceKernel

from ..gpu_codegen import CodegenC
from . import tensor_core as tc

_AXIS = {"x": 0, "y": 1, "z": 2}


# float16 math whose result is exact for float16 arguments (no rounding needed)
_EXACT_HALF_CALLS = {"fabs", "floor", "ceil", "round", "trunc", "if_then_else"}

# the rounding helper of storage-only float16, by vector width ("" or 2, 4, 8, 16): float ->
# half bits to nearest even (F. Giesen's method), then back to float exactly; ALU operations only
# (the same as targets.llvm.fp16 emits for CPUs without conversion instructions)
_ROUND_HALF = """inline float{n} tc_round_half{n}(float{n} x) {{
  uint{n} b = as_uint{n}(x); uint{n} sign = b & 0x80000000u; uint{n} a = b ^ sign;
  uint{n} r_big = select((uint{n})0x7c00u, (uint{n})0x7e00u, a > 0x7f800000u);
  uint{n} r_small = as_uint{n}(as_float{n}(a) + 0.5f) - 0x3f000000u;
  uint{n} r_norm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  uint{n} h = select(select(r_norm, r_small, a < 0x38800000u), r_big, a >= 0x47800000u);
  uint{n} u = (h & 0x7fffu) << 13;
  uint{n} f = select(as_uint{n}(as_float{n}(u) * 0x1p112f), u | 0x7f800000u, h >= 0x7c00u);
  return as_float{n}(f | sign);
}}"""


class OpenCLCodegen(CodegenC):
    """OpenCL C 1.2 for one kernel.

    ``native_half``: float16 computes in ``half`` (``cl_khr_fp16``); otherwise it is a storage
    format and computes in float (the module docstring). ``tensor_cores``: how the tensor-core
    intrinsics are printed (``"ptx"``, ``"emulated"``; None: a kernel using them is an error;
    ``targets.opencl_backend.tensor_core``).
    """

    def __init__(self, native_half: bool = False, tensor_cores: str | None = None):
        super().__init__()
        self.native_half = native_half
        self.tensor_cores = tensor_cores
        self.stored = None        # the value a vstore_half_rte rounds (left unrounded)
        if not native_half:       # float16 values live in float registers
            self.TYPES = {**CodegenC.TYPES, "float16": "float"}

    def _storage_half(self, buf: S.Buffer) -> bool:
        """Is ``buf`` a float16 buffer in global memory read and written as a storage format?"""
        return not self.native_half and buf.dtype == "float16" and \
            buf.scope not in ("shared", "local")

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
        ty = "half" if buf.dtype == "float16" else self.storage_type(buf.dtype)
        return f"__global {const}{ty}* restrict {name}"

    def scalar_param(self, var: Var, name: str) -> str:
        if var.dtype == "float16" and not self.native_half:
            raise self.error(f"the float16 scalar parameter {var.name} needs half arithmetic; "
                             f"build for Target('opencl -supports-float16=1') or pass it as "
                             f"float32", var)
        return super().scalar_param(var, name)

    # -- tensor cores ----------------------------------------------------------------------------
    def _tc_mode(self, node) -> str:
        if self.tensor_cores not in tc.MODES:
            raise self.error(f"intrinsic {node.op} needs tensor cores: build for "
                             f"Target('opencl -device=nvidia') (an NVIDIA GPU of compute "
                             f"capability 8.0 or more)", node)
        return self.tensor_cores

    def _tc_element(self, arg, offset: int = 0) -> E.BufferLoad:
        if not isinstance(arg, E.BufferLoad):
            raise self.error(f"a tensor-core intrinsic takes buffer elements, got {arg!r}", arg)
        index = arg.indices[0] if offset == 0 else \
            self.analyzer.simplify(E.Add(arg.indices[0], E.IntImm(offset, arg.indices[0].dtype)))
        return E.BufferLoad(arg.buffer, [index])

    def _tc_ref(self, arg, offset: int = 0) -> str:
        e = self._tc_element(arg, offset)
        return self.element_ref(e.buffer, self.buffer_index(e.indices[0], e.buffer), e)

    def _tc_address(self, arg) -> str:
        e = self._tc_element(arg)
        return f"({self.name_of(e.buffer)} + {self.buffer_index(e.indices[0], e.buffer)})"

    @staticmethod
    def _tc_space(buf: S.Buffer) -> str:
        return {"shared": "__local", "local": ""}.get(buf.scope, "__global")

    def visit_Evaluate(self, s: S.Evaluate):
        v = s.value
        if isinstance(v, E.Call) and v.op == E.TC_MMA:
            mode = self._tc_mode(v)
            c, a, b = v.args
            if mode == "ptx":
                self.needs.add("tc_ptx")
                self.emit(tc.mma_asm([self._tc_ref(c, i) for i in range(4)],
                                     [self._tc_ref(a, i) for i in range(4)],
                                     [self._tc_ref(b, i) for i in range(2)]))
            else:
                self.needs.add("tc_emulated")
                self.emit(tc.mma_emulated(self._tc_address(c), self._tc_address(a),
                                          self._tc_address(b)))
            return
        if isinstance(v, E.Call) and v.op == E.TC_MMA_TF32:
            mode = self._tc_mode(v)
            c, a, b = v.args
            if mode == "ptx":
                self.needs.add("tc_ptx")
                self.emit(tc.mma_tf32_asm([self._tc_ref(c, i) for i in range(4)],
                                          [self._tc_ref(a, i) for i in range(4)],
                                          [self._tc_ref(b, i) for i in range(2)]))
            else:
                self.needs.add("tc_tf32_emulated")
                self.emit(tc.mma_tf32_emulated(self._tc_address(c), self._tc_address(a),
                                               self._tc_address(b)))
            return
        if isinstance(v, E.Call) and v.op in (E.TC_LDMATRIX_X4, E.TC_LDMATRIX_X2):
            mode = self._tc_mode(v)
            dst, src, trans = v.args
            trans = bool(E.as_int(trans))
            n = 4 if v.op == E.TC_LDMATRIX_X4 else 2
            if src.buffer.scope != "shared" or dst.buffer.scope != "local":
                raise self.error(f"{v.op} reads a shared buffer into a local one", v)
            if mode == "ptx":
                self.needs.add("tc_ptx")
                self.emit(tc.ldmatrix_asm([self._tc_ref(dst, i) for i in range(n)],
                                          self._tc_address(src), trans))
            else:
                self.needs.add("tc_emulated")
                self.needs.add("tc_ldmatrix_emulated")
                e = self._tc_element(src)
                self.emit(tc.ldmatrix_emulated(self._tc_address(dst), self.name_of(e.buffer),
                                               self.buffer_index(e.indices[0], e.buffer), n,
                                               trans))
            return
        if isinstance(v, E.Call) and v.op == E.TC_CP_ASYNC:
            mode = self._tc_mode(v)
            dst, src = v.args
            if dst.buffer.scope != "shared" or self._tc_space(src.buffer) != "__global":
                raise self.error(f"{v.op} copies from a global buffer into a shared one", v)
            if mode == "ptx":
                self.needs.add("tc_ptx")
                self.emit(tc.cp_async_asm(self._tc_address(dst), self._tc_address(src)))
            else:                   # queued: it lands in shared memory at a wait
                self.needs.add("tc_cp_emulated")
                self.emit(tc.cp_async_emulated(self._tc_address(dst), self._tc_address(src)))
            return
        if isinstance(v, E.Call) and v.op in (E.TC_CP_COMMIT, E.TC_CP_WAIT):
            mode = self._tc_mode(v)
            n = None if v.op == E.TC_CP_COMMIT else E.as_int(v.args[0])
            if v.op == E.TC_CP_WAIT and (n is None or n < 0):
                raise self.error(f"{v.op} takes a constant number of groups >= 0, "
                                 f"got {v.args[0]!r}", v)
            if mode == "ptx":
                self.needs.add("tc_ptx")
                self.emit(tc.cp_commit_asm() if n is None else tc.cp_wait_asm(n))
            else:
                self.needs.add("tc_cp_emulated")
                self.emit(tc.cp_commit_emulated() if n is None else tc.cp_wait_emulated(n))
            return
        if isinstance(v, E.Call) and v.op == E.TC_LOAD_B128:
            self._tc_mode(v)
            dst, src = v.args
            self.emit(tc.load_b128(self._tc_address(dst), self._tc_space(dst.buffer),
                                   self._tc_address(src), self._tc_space(src.buffer)))
            return
        super().visit_Evaluate(s)

    def kernel_source(self, kernel: DeviceKernel, nonneg_scalars=()) -> str:
        text = super().kernel_source(kernel, nonneg_scalars)
        decls = []        # the emulation's own arrays (no IR buffer has them)
        if self.needs & {"tc_emulated", "tc_tf32_emulated"}:
            # the emulated mma's scratch: 6 words a lane
            words = tc.EMULATION_SCRATCH * 32 * (-(-kernel.block[0] // 32))
            decls.append(f"__local uint {tc.SCRATCH_NAME}[{words}] "
                         f"__attribute__((aligned(16)));")
        if "tc_cp_emulated" in self.needs:
            # the emulated cp.async's queue, for the most copies a work-item has pending
            try:
                capacity = tc.cp_async_queue_capacity(kernel.func.body)
            except E.TIRError as err:
                raise self.error(str(err), err.node) from None
            decls += tc.cp_queue_decls(max(capacity, 1))
        if not decls:
            return text
        head, _, rest = text.partition("\n")
        return "\n".join([head] + [self.INDENT + d for d in decls] + [rest])

    # -- float16 ---------------------------------------------------------------------------------
    def float_literal(self, value: float, dtype: str) -> str:
        if dtype == "float16":
            value = float(np.float16(value))      # the constant as float16 holds it
            if not self.native_half:
                return super().float_literal(value, "float32")
        return super().float_literal(value, dtype)

    def round_half(self, code: str, lanes: int = 1) -> str:
        """``code`` (float) rounded to the nearest float16 (storage-only float16)."""
        n = "" if lanes == 1 else str(lanes)
        self.needs.add(f"roundhalf_{n}")
        return f"tc_round_half{n}({code})"

    def _binary(self, e, op: str) -> str:
        code = f"({self.visit(e.a)} {op} {self.visit(e.b)})"
        if e.dtype == "float16" and not self.native_half:
            return code if e is self.stored else self.round_half(code)
        return self.wrap(code, e.dtype)

    def vector_result(self, code: str, dtype: str, lanes: int) -> str:
        if dtype == "float16" and not self.native_half:
            return self.round_half(code, lanes)
        return code

    def visit_Cast(self, e: E.Cast):
        if e.dtype == "float16" and e.value.dtype != "float16" and not self.native_half:
            src = self.visit(e.value)
            if not dt.is_float(e.value.dtype) or e.value.dtype == "float64":
                src = f"((float)({src}))"
            return src if e is self.stored else self.round_half(src)
        return super().visit_Cast(e)

    def visit_Call(self, e: E.Call):
        if e.op == E.TC_PACK_HALF2:
            self._tc_mode(e)
            guarded = [self._zero_or(a) for a in e.args]
            if None not in guarded and structural_equal(guarded[0][0], guarded[1][0]):
                # both halves under one condition (a convolution's padding, a k-step's
                # window): one choice for the word
                lo, hi = (self._half_bits(v) for _, v in guarded)
                if lo is not None and hi is not None:
                    return f"({self.visit(guarded[0][0])} ? {tc.pack_bits(lo, hi)} : 0u)"
            lo, hi = (self._half_bits(a) for a in e.args)
            if lo is not None and hi is not None:
                # float16 values read as they are: their bits, no round trip through float
                return tc.pack_bits(lo, hi)
            self.needs.add("tc_pack_half2")
            return f"tc_pack_half2({self.visit(e.args[0])}, {self.visit(e.args[1])})"
        if e.op in (E.TC_TF32_BIG, E.TC_TF32_SMALL):
            # the split of the 3xTF32 GEMM: cvt.rna.tf32.f32, or its emulation
            mode = self._tc_mode(e)
            self.needs |= {f"tc_tf32_split_{mode}"} | ({"tc_ptx"} if mode == "ptx" else set())
            return f"{e.op}({', '.join(self.visit(a) for a in e.args)})"
        if e.op in (E.TC_PACK_LO, E.TC_PACK_HI):
            self._tc_mode(e)
            pack = tc.pack_lo if e.op == E.TC_PACK_LO else tc.pack_hi
            return pack(self.visit(e.args[0]), self.visit(e.args[1]))
        code = super().visit_Call(e)
        if e.dtype == "float16" and not self.native_half and e.op not in _EXACT_HALF_CALLS \
                and e is not self.stored:
            return self.round_half(code)
        return code

    @staticmethod
    def _zero_or(e):
        """``(cond, value)`` where ``e`` is ``value`` under ``cond``, else 0 (a ``Select`` or
        ``if_then_else``, maybe widened to float32); None otherwise."""
        if isinstance(e, E.Cast):
            e = e.value
        if isinstance(e, E.Select):
            cond, a, b = e.condition, e.true_value, e.false_value
        elif isinstance(e, E.Call) and e.op == "if_then_else":
            cond, a, b = e.args
        else:
            return None
        if isinstance(b, E.Cast):
            b = b.value
        zero = isinstance(b, E.FloatImm) and b.value == 0.0 and math.copysign(1.0, b.value) > 0
        return (cond, a) if zero else None

    def _half_bits(self, e) -> str | None:
        """The 16 bits (a uint) of the float16 value of ``e``, a float16 load from global
        memory widened to float32, or a choice (``Select`` / ``if_then_else``) between such
        loads and zeros; None for anything else (its value is then rounded to float16)."""
        if isinstance(e, E.Cast) and e.value.dtype == "float16":
            return self._half_bits(e.value)
        if isinstance(e, E.FloatImm) and e.value == 0.0 and not math.copysign(1.0, e.value) < 0:
            return "0u"
        if isinstance(e, E.BufferLoad) and self._storage_half(e.buffer) and \
                len(e.indices) == 1 and e.dtype == "float16":
            return (f"((uint)(((__global const ushort*){self.name_of(e.buffer)})"
                    f"[{self.buffer_index(e.indices[0], e.buffer)}]))")
        if isinstance(e, E.Select) or (isinstance(e, E.Call) and e.op == "if_then_else"):
            cond, a, b = (e.condition, e.true_value, e.false_value) \
                if isinstance(e, E.Select) else e.args
            a, b = self._half_bits(a), self._half_bits(b)
            if a is not None and b is not None:
                return f"({self.visit(cond)} ? {a} : {b})"
        return None

    def visit_BufferLoad(self, e: E.BufferLoad):
        buf = e.buffer
        if self._storage_half(buf):
            return f"vload_half({self.buffer_index(e.indices[0], buf)}, {self.name_of(buf)})"
        return super().visit_BufferLoad(e)

    def visit_BufferStore(self, s: S.BufferStore):
        if not self._storage_half(s.buffer):
            return super().visit_BufferStore(s)
        # vstore_half_rte rounds: the stored value itself needs no tc_round_half
        self.stored = s.value
        try:
            value = self.visit(s.value)
        finally:
            self.stored = None
        index = self.buffer_index(s.indices[0], s.buffer)
        self.emit(self.store_stmt(s.buffer, index, value, s))

    def store_stmt(self, buf: S.Buffer, index: str, value: str, node) -> str:
        if self._storage_half(buf):
            return f"vstore_half_rte({value}, {index}, {self.name_of(buf)});"
        return super().store_stmt(buf, index, value, node)

    # a vector read lane by lane; float4 accesses at a provable multiple of 4 elements are
    # aligned pointer accesses (vloadN only assumes element alignment: NVIDIA's compiler then
    # emits four scalar loads instead of one 128-bit load)
    VECTOR_LANE_ACCESS = "{v}.s{i:x}"
    VECTOR_ALIGN = 16

    def shared_decl(self, buf: S.Buffer, name: str, size: int) -> str:
        # aligned so that a float4 access at a multiple of 4 elements is a 128-bit access
        return (f"__local {self.storage_type(buf.dtype)} {name}[{size}] "
                f"__attribute__((aligned({self.VECTOR_ALIGN})));")

    def element_bytes(self, buf: S.Buffer) -> int:
        if buf.dtype == "float16" and not self.native_half and not self._storage_half(buf):
            return 4              # a shared / private float16 array is a float array
        return super().element_bytes(buf)

    def _space(self, buf: S.Buffer) -> str:
        return "__local" if buf.scope == "shared" else "__global"

    def aligned_vector_load(self, lanes: int, ptr: str, buf: S.Buffer) -> str:
        if self._storage_half(buf):
            return f"vloada_half{lanes}(0, {ptr})"
        vt = self.type_name(dt.with_lanes(buf.dtype, lanes))
        return f"(*(({self._space(buf)} const {vt}*)({ptr})))"

    def aligned_vector_store(self, lanes: int, value: str, ptr: str, buf: S.Buffer) -> str:
        if self._storage_half(buf):
            return f"vstorea_half{lanes}_rte({value}, 0, {ptr});"
        vt = self.type_name(dt.with_lanes(buf.dtype, lanes))
        return f"*(({self._space(buf)} {vt}*)({ptr})) = {value};"

    def vector_load(self, lanes: int, ptr: str, buf: S.Buffer) -> str:
        if self._storage_half(buf):
            return f"vload_half{lanes}(0, {ptr})"
        return f"vload{lanes}(0, {ptr})"

    def vector_store(self, lanes: int, value: str, ptr: str, buf: S.Buffer) -> str:
        if self._storage_half(buf):
            return f"vstore_half{lanes}_rte({value}, 0, {ptr});"
        return f"vstore{lanes}({value}, 0, {ptr});"


def opencl_source(kernels: Sequence[DeviceKernel],
                  nonneg_scalars: Mapping[str, Sequence[Var]] | None = None,
                  native_half: bool = False,
                  tensor_cores: str | None = None) -> tuple[str, set[str]]:
    """The OpenCL C program of ``kernels`` (``DeviceKernel``s) and the extensions it needs.

    ``nonneg_scalars`` maps a kernel's name to its scalar parameters that are ``>= 0``
    (``gpu_codegen.nonneg_scalars``: the shape sizes), for cheaper integer division.
    ``native_half``: float16 computes in ``half`` under ``cl_khr_fp16`` (the target's
    ``supports_float16``); otherwise float16 is a storage format computed in float.
    ``tensor_cores``: the target's ``tensor_cores`` (``"ptx"``: the tensor-core intrinsics as
    inline PTX, and the extensions include ``tensor_core.REQUIREMENT``; ``"emulated"``).
    """
    bodies = []
    needs: set[str] = set()
    dtypes: set[str] = set()
    for k in kernels:
        gen = OpenCLCodegen(native_half, tensor_cores)
        bodies.append(gen.kernel_source(k, (nonneg_scalars or {}).get(k.name, ())))
        needs |= gen.needs
        dtypes |= gen.dtypes_used
    extensions = set()
    head = []
    if "float64" in dtypes:
        extensions.add("cl_khr_fp64")
        head.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if "float16" in dtypes and native_half:
        extensions.add("cl_khr_fp16")
        head.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    if "tc_ptx" in needs:
        extensions.add(tc.REQUIREMENT)
    if "tc_emulated" in needs:
        head.append(tc.EMULATION_SOURCE)
    if "tc_tf32_emulated" in needs:
        head.append(tc.EMULATION_TF32_SOURCE)
    if "tc_tf32_split_ptx" in needs:
        head.append(tc.TF32_SPLIT_PTX_SOURCE)
    if "tc_tf32_split_emulated" in needs:
        head.append(tc.TF32_SPLIT_EMULATED_SOURCE)
    if "tc_ldmatrix_emulated" in needs:
        head.append(tc.LDMATRIX_EMULATION_SOURCE)
    if "tc_cp_emulated" in needs:
        head.append(tc.CP_ASYNC_EMULATION_SOURCE)
    if "tc_pack_half2" in needs:
        head.append(tc.PACK_HALF2_SOURCE)
    for n in sorted(x for x in needs if x.startswith("roundhalf_")):
        head.append(_ROUND_HALF.format(n=n.split("_", 1)[1]))
    # the floor division helpers, by C type then kind (int8 and int16 share char / short's)
    helpers = {}
    for n in needs:
        if n.startswith("roundhalf_") or n.startswith("tc_"):
            continue
        kind, dtype = n.split("_", 1)
        helpers.setdefault((OpenCLCodegen.TYPES[dtype], kind), dtype)
    for (_, kind), dtype in sorted(helpers.items()):
        head.append(OpenCLCodegen().floor_helper_definition(kind, dtype))
    return "\n".join(head + ([""] if head else []) + ["\n\n".join(bodies)]) + "\n", extensions


__all__ = ["OpenCLCodegen", "opencl_source"]
