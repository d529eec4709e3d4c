"""TIR -> WGSL: one device kernel (a nest of thread-bound loops) to one WGSL compute shader.

The input is a kernel of the lowered device form (see ``docs/lowering.md``): flat buffers, loops
bound to ``blockIdx.*`` / ``threadIdx.*``, ``shared`` and ``local`` allocations, barriers.
What WGSL changes, and how the generator handles it:

* **Integers are 32-bit.** ``int64`` index arithmetic becomes ``i32``; the build checks that
  constant extents fit and the runtime checks symbolic ones before a launch. 8- and 16-bit
  integers compute in ``i32`` / ``u32`` and wrap to their range after each operation; their
  buffers hold one 32-bit word per element (``storage``).
* **Scalars of the host** (shape variables, scalar parameters) come in one uniform buffer
  (``struct TCParams``), bound after the storage buffers.
* **Buffers** are ``var<storage, read>`` or ``var<storage, read_write>`` bindings of group 0,
  in the order of ``KernelSource.bindings``; when a kernel needs more storage buffers than the
  target allows, several are *packed* into one ``array<u32>`` binding (their element offsets in
  the uniform, floats through ``bitcast``); the runtime copies them in and out around the launch.
* **16-byte storage accesses.** A float32 (float16, uint32) buffer with a binding of its own
  that a vectorized loop of 4 loads or stores at ``base + v``, ``base`` a provable multiple of
  4 (the proof the OpenCL back end uses for ``float4``: ``CodegenC._aligned``,
  ``arith.is_aligned``), is bound as ``array<vec4<f32>>`` (``array<vec4<f16>>``,
  ``array<vec4<u32>>``: the int4 GEMV's packed codes). Such a load is one ``vec4`` read
  before the lanes, such a store one ``vec4`` write — one vector expression where WGSL has it
  (``max(x, vec4<f32>(0.0f))``), else the four lanes' values; every other access of the buffer
  indexes a component (``b[i >> 2u][i & 3i]``). A buffer the generation proves no aligned access
  for stays ``array<f32>`` (``emit_kernel`` generates once more). A tail test the four lanes
  share (``4 t + v < 4 n`` reads ``t < n`` for each) stays outside the vector. Storage buffers
  are allocated in multiples of 16 bytes (``storage.buffer_bytes``), so the ``vec4`` array
  covers every element, symbolic sizes included.
* ``shared`` allocations are module-scope ``var<workgroup>`` arrays (their total is checked
  against the workgroup-storage limit), ``local`` ones function-scope arrays; a barrier is
  ``workgroupBarrier()``. A float32 (float16) shared array that a vectorized loop of 4 reads
  at ``base + v`` (a GEMM's register fragment) is an ``array<vec4<f32>>``
  (``array<vec4<f16>>``): such a read, at a provable multiple of 4, is one ``vec4`` load
  stored lane by lane; other accesses index a component, by a constant where the lane is
  provably constant (``s[q][2i]``), else ``s[i >> 2u][i & 3i]``. An array with no provably
  aligned vector read stays ``array<f32>`` (``emit_kernel`` generates once more): browsers'
  WebGPU clamps every dynamic index into a workgroup array and into a vector, so a component
  at a lane of the thread's costs two clamps, a flat element one; for the same reason a
  workgroup element read several times between barriers is read once into a variable
  (``_cached_load``).
* **Launch geometry**: ``@workgroup_size`` is the constant ``threadIdx`` extents (checked against
  the invocation and per-dimension limits); the workgroup counts are expressions of the shape
  variables evaluated at launch. A grid that may exceed 65535 workgroups in a dimension is
  linearized over a 2-D dispatch and decoded in the shader.
* **Math**: ``exp``, ``log``, ``sqrt``, ``tanh`` (argument clamped to +-15, where it is 1 in
  float32, so drivers that evaluate it through ``exp`` never overflow), ``sin``, ``cos``, ...
  are WGSL builtins; ``erf`` (no builtin) is a polynomial (|error| < 2e-7), ``pow`` handles
  negative bases with integral exponents as libm does, ``round`` rounds half to even (WGSL's,
  and numpy's). float16 math runs in f32 and rounds once.
* Floats that are not finite cannot be WGSL constants: they come from ``var<private>`` bit
  patterns.
* ``float16`` needs the ``shader-f16`` feature (``enable f16;``); float64 is refused.
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import expr as E
from tilecraft.tensorir import stmt as S
from tilecraft.tensorir.expr import TIRError
from tilecraft.tensorir.functor import post_order_visit, substitute
from tilecraft.tensorir.structural import structural_equal
from tilecraft.tensorir.stmt import Range
from tilecraft.tensorir.transform._common import uses_any

from ..gpu_codegen import BARRIER_OPS, CodegenC, kernel_body, written_buffers
from . import exprjson, storage

INT32_MAX = 2 ** 31 - 1
MAX_WORKGROUPS = 65535
UNROLL_LIMIT = 64          # unrolled/vectorized loops up to this constant extent are unrolled
UNROLL_BODY_LIMIT = 8192   # ... unless the unrolled code would exceed this many statements
# A workgroup element read once into a variable and reused (``WGSLCodegen._cached_load``): naga
# clamps every read. False: every read its own access, as before (a GPU A/B: the reused values
# live longer in registers; ``benchmarks.gpu_models`` kind ``webgpu-adapter-noreuse``).
WORKGROUP_READ_REUSE = True

_RESERVED = set("""
alias break case const const_assert continue continuing default diagnostic discard else enable
false fn for if let loop override requires return struct switch true var while array atomic bool
f16 f32 i32 u32 mat2x2 mat3x3 mat4x4 ptr sampler texture vec2 vec3 vec4 main
""".split())


class WebGPUBuildError(TIRError, ValueError):
    """A kernel WGSL cannot express, or that is over one of the target's limits."""


class WebGPULimitError(WebGPUBuildError):
    """A kernel over a WebGPU limit (invocations, workgroup storage, storage buffers, ...)."""


@dataclass
class Binding:
    """A storage binding of a kernel: one buffer, or several packed into one ``array<u32>``."""
    binding: int
    buffers: list            # tensorir Buffers (one unless packed)
    access: str              # "read" or "read_write"
    packed: bool = False


@dataclass
class KernelSource:
    """A generated WGSL kernel and what launching it needs."""
    name: str
    wgsl: str
    workgroup_size: tuple[int, int, int]
    grid: tuple            # workgroups per dimension: three JSON expressions (exprjson)
    linear_grid: bool      # dispatched as (min(total, 65535), ceil(total / 65535), 1)
    bindings: list[Binding]
    uniform: list[dict]    # {"field", "type", "value": JSON expr | {"offset": [binding, member]}}
    uniform_binding: int | None
    shared_bytes: int
    index_checks: list = field(default_factory=list)  # JSON exprs that must be < 2**31


def sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not s or s[0].isdigit():
        s = "v" + s
    s = re.sub(r"__+", "_", s)
    return s.rstrip("_") or "v"


def _wgsl_type(dtype: str, node=None) -> str:
    if dt.lanes(dtype) != 1:
        raise WebGPUBuildError(f"vector dtype {dtype} is not supported by the WGSL generator; "
                               f"vectorized loops are emitted as scalar code", node)
    try:
        return storage.wgsl_scalar(dtype)
    except storage.UnsupportedDTypeError as err:
        raise WebGPUBuildError(str(err), node) from None


_NARROW_WRAP = {"int8": 24, "int16": 16}
_NARROW_MASK = {"uint8": "255u", "uint16": "65535u"}


def _wrap(code: str, dtype: str) -> str:
    """Wrap an i32/u32 value to the range of a narrow integer dtype."""
    if dtype in _NARROW_WRAP:
        s = _NARROW_WRAP[dtype]
        return f"(({code} << {s}u) >> {s}u)"
    if dtype in _NARROW_MASK:
        return f"({code} & {_NARROW_MASK[dtype]})"
    return code


# Helper functions, emitted only when used (the floor division ones are generated:
# ``WGSLCodegen.floor_helper_definition``).
_HELPERS = {
    "tc_erf": """fn tc_erf(x: f32) -> f32 {
  let a = abs(x);
  if (a < 0.5) {
    let z = x * x;
    return x * (1.1283791671 + z * (-0.3761263890 + z * (0.1128379167 + z * (-0.0268661706
        + z * (0.0052239776 + z * -0.0008548327)))));
  }
  // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7) for |x| >= 0.5
  let t = 1.0 / (1.0 + 0.3275911 * a);
  let p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
      + t * 1.061405429))));
  return sign(x) * (1.0 - p * exp(-a * a));
}""",
    "tc_pow": """fn tc_pow(x: f32, y: f32) -> f32 {
  if (y == 0.0) { return 1.0; }
  if (x >= 0.0) { return pow(x, y); }
  if (trunc(y) != y) { return bitcast<f32>(tc_nan_bits); }
  let r = pow(-x, y);
  if (trunc(y * 0.5) != y * 0.5) { return -r; }
  return r;
}""",
}
_NONFINITE = {"inf": "tc_inf_bits", "-inf": "tc_ninf_bits", "nan": "tc_nan_bits"}
_NONFINITE_DECL = {"tc_inf_bits": "0x7f800000u", "tc_ninf_bits": "0xff800000u",
                   "tc_nan_bits": "0x7fc00000u"}


def _float_literal(value: float, dtype: str, emitter: "WGSLCodegen") -> str:
    if dtype == "float16":
        v = float(np.float16(value))
    else:
        v = float(np.float32(value))
    if not math.isfinite(v):
        key = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        bits = _NONFINITE[key]
        emitter.private_consts.add(bits)
        code = f"bitcast<f32>({bits})"
        return f"f16({code})" if dtype == "float16" else code
    text = repr(v) if dtype != "float16" else f"{v:.6g}"
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    if text.startswith("-"):
        return f"({text}{'h' if dtype == 'float16' else 'f'})"
    return text + ("h" if dtype == "float16" else "f")


def _int_literal(value: int, dtype: str, node=None) -> str:
    if dtype == "bool":
        return "true" if value else "false"
    if dt.is_uint(dtype):
        if dtype == "uint64":
            value = min(value, 2 ** 32 - 1)
        if not 0 <= value <= 2 ** 32 - 1:
            raise WebGPUBuildError(f"the constant {value} ({dtype}) does not fit the 32-bit "
                                   f"unsigned integers of WGSL", node)
        return f"{value}u"
    if dtype == "int64" and not -2 ** 31 <= value <= INT32_MAX:
        # int64 data is held in 32 bits (storage policy): its extremes (reduction identities)
        # saturate to int32's
        value = max(-2 ** 31, min(INT32_MAX, value))
    if not -2 ** 31 <= value <= INT32_MAX:
        raise WebGPUBuildError(f"the constant {value} ({dtype}) does not fit the 32-bit integers "
                               f"of WGSL (WebGPU has no 64-bit integers)", node)
    if value == -2 ** 31:
        return "(-2147483647i - 1i)"
    return f"({value}i)" if value < 0 else f"{value}i"


class WGSLCodegen(CodegenC):
    """WGSL for one ``DeviceKernel`` (``tensorir.transform.split_host_device``): the WGSL table
    over the C-style generator. Use ``emit_kernel``.

    WGSL spells like C the statements (``if``, blocks, assignments), the arithmetic, comparison
    and logic operators, floor division (the base's ``arith`` decision; the general form is a
    helper printed from ``arith.floor_divmod_general``), loads and stores, ``Let``; it spells
    differently (the overrides below) the types and literals (``5i``, ``2.0f``, 32-bit integers
    only, narrow ones wrapped), the declarations (``let x: i32 = ...;``, ``var l: array<f32, 4>;``,
    ``for (var i: i32 = ...; ...; i = i + 1i)``), casts (``f32(x)``), ``select(f, t, c)``,
    integer division by zero (0), the builtins (``workgroupBarrier()``, the thread indices,
    the math functions, f16 math computed in f32), storage bindings (packed buffers, bool as
    ``u32``, ``vec4`` arrays for aligned runs of 4), workgroup memory (``vec4`` arrays) and the
    launch (limits, linearized grids);
    it unrolls short loops and guards the checks the device form leaves in the kernel.
    """

    TYPES = {}                 # type_name is overridden (``storage.wgsl_scalar``)
    VECTOR_LANES = ()          # the base's vector emission is not used (``_try_vec4_loop``)
    # a vec4<f32> of an array<vec4<f32>> is 16-byte aligned: ``_aligned`` (the proof the OpenCL
    # back end uses for float4) decides which accesses are whole vectors
    VECTOR_ALIGN = 16
    FLOAT_MIN_MAX = ("min", "max")
    ERROR = WebGPUBuildError

    def __init__(self, kernel, bindings: list[Binding], limits: dict, *,
                 supports_float16: bool, nonneg_scalars: Sequence = (),
                 vec4_storage: Sequence | None = None, vec4_shared: Sequence | None = None):
        super().__init__()
        self.kernel = kernel
        self.kernel_name = kernel.name
        self.bindings = bindings
        self.limits = limits
        self.supports_float16 = supports_float16
        self.depth = 1
        self.helpers: set[str] = set()
        self.private_consts: set[str] = set()
        self.uses_f16 = False
        self.uniform: list[dict] = []
        self.binding_of: dict[int, tuple[Binding, int]] = {}
        self.unroll_budget = UNROLL_BODY_LIMIT
        self.unrolling = 0
        self.over_budget: list[str] = []   # loops left rolled for the budget (the warning)
        self.index_depth = 0       # > 0 while emitting an index or a loop bound
        self.local_arrays: list[tuple[str, str]] = []   # (name, element type)
        self.vec4_temps = 0
        for b in bindings:
            for k, buf in enumerate(b.buffers):
                self.binding_of[id(buf)] = (b, k)
        # scalars are fields of the uniform (named without a prefix)
        self.uniform_vars = set(kernel.scalar_params)
        for v, host in zip(kernel.scalar_params, kernel.host_scalars):
            fld = self.name_of(v)
            ty = self.type_name(v.dtype, v)
            self.uniform.append({"field": fld, "type": "f32" if ty == "f16" else
                                 ("u32" if ty == "bool" else ty),
                                 "value": exprjson.to_json(host) if not dt.is_float(host.dtype)
                                 else ["var", host.name], "dtype": v.dtype})
            self.var_code[v] = (f"f16(tc_params.{fld})" if ty == "f16" else
                                f"(tc_params.{fld} != 0u)" if ty == "bool" else
                                f"tc_params.{fld}")
        self.offset_fields: dict[tuple[int, int], str] = {}
        for b in bindings:
            if b.packed:
                for k, buf in enumerate(b.buffers):
                    fld = f"tc_off{b.binding}_{k}"
                    self.offset_fields[(b.binding, k)] = fld
                    self.uniform.append({"field": fld, "type": "i32",
                                         "value": {"offset": [b.binding, k]}})
        self.workgroup_size = tuple(int(x) for x in kernel.block)
        self.shared, self.body = kernel_body(kernel)
        # float32 / float16 workgroup arrays read as vectors somewhere (a vectorized loop of 4
        # copying neighbouring elements: a GEMM's register fragment) are declared
        # array<vec4<f32>> / array<vec4<f16>>,
        # so that such a read is one 128-bit load; element accesses index a component. By
        # default the candidates; ``emit_kernel`` keeps those with a provably aligned vector
        # access (in a vec4 array, an element whose lane is not constant costs two clamps)
        self.vec4_shared = (_vec4_shared(self.body, self.shared) if vec4_shared is None
                            else set(vec4_shared))
        # float32 storage buffers bound as array<vec4<f32>> (ids): by default the candidates,
        # those some vectorized loop of 4 accesses at ``base + v`` (``emit_kernel`` keeps those
        # for which the generation proved at least one such access aligned)
        if vec4_storage is None:
            vec4_storage = _vec4_storage_candidates(self.body, bindings)
        self.vec4_storage = set(vec4_storage)
        self.vec4_proven: set = set()        # ids of buffers with an aligned vec4 access
        self.vec4_loads: dict = {}           # id(BufferLoad) -> its vec4 temporary's name
        self.vec4_lane: int | None = None
        # workgroup elements already read into a variable (``_cached_load``): (branch path,
        # buffer id, reference) -> variable, the path the conditions under which the read ran
        # (``_enter_branch``); the variables' declarations; > 0 where a read must stay where
        # it is (an index, a loop bound, an operand of && / ||)
        self.loaded: dict[tuple, str] = {}
        self.path: list = []
        self.branches = 0
        self.load_vars: list[str] = []
        self.no_reuse = 0
        self.invariant_vars = set(kernel.thread_vars.values()) | set(kernel.scalar_params)
        self.has_blocks = any(t.startswith("blockIdx") for t in kernel.thread_vars)
        self.begin_kernel(kernel, nonneg_scalars)

    # =========================================================================================
    # the kernel

    def generate(self) -> KernelSource:
        """The WGSL module of the kernel and what launching it needs."""
        grid = list(self.kernel.grid)
        grid_json = tuple(exprjson.to_json(g) for g in grid)
        self.linear = False
        for g in grid:
            c = E.as_int(g)
            if c is None or c > MAX_WORKGROUPS:
                self.linear = True
        if self.linear:
            for axis, g in zip("xyz", grid_json):
                self.uniform.append({"field": f"tc_grid_{axis}", "type": "i32", "value": g})
        self._check_limits()
        self._block_prologue()
        self.visit(self.body)
        return self._assemble(self.lines, grid_json)

    def _check_limits(self):
        wg = self.workgroup_size
        total = wg[0] * wg[1] * wg[2]
        lim_inv = self.limits.get("max_compute_invocations_per_workgroup",
                                  self.limits.get("max_threads_per_block"))
        if lim_inv and total > lim_inv:
            raise WebGPULimitError(
                f"kernel {self.kernel_name}: {total} invocations per workgroup "
                f"({' x '.join(map(str, wg))}), over the target's limit of {lim_inv} "
                f"(max_compute_invocations_per_workgroup)", self.body)
        for axis, w in zip("xyz", wg):
            lim = self.limits.get(f"max_compute_workgroup_size_{axis}")
            if lim and w > lim:
                raise WebGPULimitError(f"kernel {self.kernel_name}: threadIdx.{axis} extent {w} "
                                       f"is over the target's limit of {lim} "
                                       f"(max_compute_workgroup_size_{axis})", self.body)
        shared_bytes = 0
        for buf in self.shared:
            shared_bytes += self.const_size(buf) * \
                np.dtype(storage.storage_dtype(buf.dtype)).itemsize
        lim_sh = self.limits.get("max_compute_workgroup_storage_size",
                                 self.limits.get("max_shared_memory_per_block"))
        if lim_sh is not None and shared_bytes > lim_sh:
            raise WebGPULimitError(
                f"kernel {self.kernel_name}: {shared_bytes} bytes of shared (workgroup) memory "
                f"({', '.join(b.name for b in self.shared)}; 8- and 16-bit elements take 4 bytes "
                f"each), over the target's limit of {lim_sh} bytes "
                f"(max_compute_workgroup_storage_size)", self.body)
        self.shared_bytes = shared_bytes

    def _block_prologue(self):
        """Define tc_bid: the logical workgroup index, decoded from a linearized dispatch."""
        if not self.has_blocks:
            return
        if not self.linear:
            self.emit("let tc_bid = vec3<i32>(tc_wid);")
            return
        self.emit(f"let tc_lin = i32(tc_wid.x) + i32(tc_wid.y) * {MAX_WORKGROUPS}i;")
        self.emit("let tc_gx = tc_params.tc_grid_x;")
        self.emit("let tc_gxy = tc_gx * tc_params.tc_grid_y;")
        # workgroup-uniform, so an early return keeps later barriers in uniform control flow
        self.emit("if (tc_lin >= tc_gxy * tc_params.tc_grid_z) { return; }")
        self.emit("let tc_bid = vec3<i32>(tc_lin % tc_gx, (tc_lin % tc_gxy) / tc_gx, "
                  "tc_lin / tc_gxy);")

    def _assemble(self, body: list[str], grid_json) -> KernelSource:
        out = []
        for b in self.bindings:
            if b.packed:
                name = f"tc_pack{b.binding}"
                elem = "u32"
            else:
                name = self.name_of(b.buffers[0])
                elem = storage.wgsl_storage(b.buffers[0].dtype)
            self.uses_f16 |= elem == "f16"
            if not b.packed and id(b.buffers[0]) in self.vec4_storage:
                elem = f"vec4<{elem}>"
            out.append(f"@group(0) @binding({b.binding}) var<storage, {b.access}> {name}: "
                       f"array<{elem}>;")
        uniform_binding = None
        if self.uniform:
            uniform_binding = len(self.bindings)
            out.append("struct TCParams {")
            for u in self.uniform:
                out.append(f"  {u['field']}: {u['type']},")
            out.append("}")
            out.append(f"@group(0) @binding({uniform_binding}) var<uniform> tc_params: TCParams;")
        for buf in self.shared:
            self.uses_f16 |= buf.dtype == "float16"
            if id(buf) in self.vec4_shared:
                out.append(f"var<workgroup> {self.name_of(buf)}: "
                           f"array<vec4<{storage.wgsl_scalar(buf.dtype)}>, "
                           f"{self.const_size(buf) // 4}>;")
                continue
            out.append(f"var<workgroup> {self.name_of(buf)}: "
                       f"array<{storage.wgsl_storage(buf.dtype)}, {self.const_size(buf)}>;")
        for c in sorted(self.private_consts):
            out.append(f"var<private> {c}: u32 = {_NONFINITE_DECL[c]};")
        for h in sorted(self.helpers):
            kind = h[len("tc_"):-len("_i32")]
            out.append(self.floor_helper_definition(kind, "int32")
                       if kind in ("floordiv", "floormod") else _HELPERS[h])
        if self.uses_f16:
            if not self.supports_float16:
                raise WebGPUBuildError(
                    f"kernel {self.kernel_name} uses float16, which WGSL allows only with the "
                    f"shader-f16 feature; build for Target('webgpu -supports-float16=1') (the "
                    f"adapter must have shader-f16), or compute in float32", self.body)
            out = ["enable f16;", ""] + out
        wg = self.workgroup_size
        out.append("")
        out.append(f"@compute @workgroup_size({wg[0]}, {wg[1]}, {wg[2]})")
        out.append("fn main(@builtin(workgroup_id) tc_wid: vec3<u32>, "
                   "@builtin(local_invocation_id) tc_lid: vec3<u32>) {")
        out.extend(f"{self.INDENT}{d}" for d in self.load_vars)
        out.extend(_scalarize_locals(body, self.local_arrays))
        out.append("}")
        wgsl = "\n".join(out) + "\n"
        return KernelSource(name=self.kernel_name, wgsl=wgsl, workgroup_size=wg,
                            grid=grid_json, linear_grid=self.linear, bindings=self.bindings,
                            uniform=self.uniform, uniform_binding=uniform_binding,
                            shared_bytes=self.shared_bytes)

    # =========================================================================================
    # the table: names, types, declarations

    def identifier(self, node, hint: str) -> str:
        if isinstance(node, S.Buffer):
            prefix = {"shared": "s_", "local": "l_"}.get(node.scope, "b_")
        else:
            prefix = "" if node in self.uniform_vars else "v_"
        return prefix + sanitize(hint)

    def reserved(self, name: str) -> bool:
        return name in _RESERVED

    def type_name(self, dtype: str, node=None) -> str:
        t = _wgsl_type(dtype, node)
        if t == "f16":
            self.uses_f16 = True
        return t

    def _note_f16(self, dtype):
        if dtype == "float16":
            self.uses_f16 = True

    def thread_index(self, tag: str) -> str:
        kind, axis = tag.split(".")
        return f"i32(tc_lid.{axis})" if kind == "threadIdx" else f"tc_bid.{axis}"

    def barrier_stmt(self) -> str:
        return "workgroupBarrier();"

    def local_decl(self, buf: S.Buffer, name: str, size: int) -> str:
        ty = self.type_name(buf.dtype, buf)
        self.local_arrays.append((name, ty))
        return f"var {name}: array<{ty}, {size}>;"

    def let_decl(self, name: str, type_name: str, value: str) -> str:
        return f"let {name}: {type_name} = {value};"

    def for_header(self, name: str, type_name: str, lo: str, hi: str) -> str:
        one = "1u" if type_name == "u32" else "1i"
        return f"for (var {name}: {type_name} = {lo}; {name} < {hi}; {name} = {name} + {one}) {{"

    def unroll_pragma(self, f: S.For) -> str:
        return ""

    def float_literal(self, value: float, dtype: str) -> str:
        if dtype == "float16":
            self.uses_f16 = True
        elif dtype != "float32":
            self.type_name(dtype)      # float64: refused
        return _float_literal(value, dtype, self)

    def wrap(self, code: str, dtype: str) -> str:
        return _wrap(code, dtype)

    def floor_helper(self, kind: str, dtype: str) -> str:
        name = f"tc_{kind}_i32"         # narrow and 64-bit integers compute in i32
        self.helpers.add(name)
        return name

    def floor_helper_definition(self, kind: str, dtype: str) -> str:
        body = "".join(f"  {line}\n" for line in self.floor_helper_body(kind, "int32"))
        return f"fn tc_{kind}_i32(a: i32, b: i32) -> i32 {{\n{body}}}"

    # =========================================================================================
    # statements

    def visit_Evaluate(self, s):
        v = s.value
        if isinstance(v, E.Call) and v.op == E.PREFETCH:
            return      # a CPU cache hint: emitted as nothing
        if not isinstance(v, E.IntImm) and not (isinstance(v, E.Call) and v.op in BARRIER_OPS):
            raise self.error(f"cannot emit the statement evaluate({v!r}) in WGSL", s)
        super().visit_Evaluate(s)
        if isinstance(v, E.Call) and v.op in BARRIER_OPS:
            self.loaded.clear()          # other invocations' stores are visible from here

    def visit_IfThenElse(self, s):
        if self.unrolling:
            # unrolled copies see their loop variables as constants: decide what is decided
            try:
                cond = self.analyzer.simplify(s.condition)
            except TIRError:
                cond = s.condition
            if E.is_const_int(cond, 1):
                return self.visit(s.then_case)
            if E.is_const_int(cond, 0):
                return self.visit(s.else_case) if s.else_case is not None else None
            if cond is not s.condition:
                s = S.IfThenElse(cond, s.then_case, s.else_case)
        code = self.visit(s.condition)
        self.emit(f"if ({code}) {{")
        self._enter_branch(s.condition, code)
        self.depth += 1
        with self.analyzer.with_constraint(s.condition):
            self.visit(s.then_case)
        self.depth -= 1
        self.path.pop()
        if s.else_case is not None:
            self.emit("} else {")
            self._enter_branch(s.condition, code, negated=True)
            self.depth += 1
            with self.analyzer.with_constraint(E.Not(s.condition)):
                self.visit(s.else_case)
            self.depth -= 1
            self.path.pop()
        self.emit("}")

    def visit_AssertStmt(self, s):
        # Checks that depend only on host values were taken out by the host/device split; one
        # that depends on the thread's indices becomes a guard (WGSL cannot raise an error).
        code = self.visit(s.condition)
        self.emit(f"if ({code}) {{")
        self._enter_branch(s.condition, code)
        self.depth += 1
        self.visit(s.body)
        self.depth -= 1
        self.path.pop()
        self.emit("}")

    # Reads of workgroup elements reused (``_cached_load``). A read may be reused where it
    # ran for certain: after it in the same branch, or in a later branch under the same
    # conditions (each a condition of thread indices and scalars only, the same value every
    # time: a convolution's row guard around each window read), never past a barrier or a
    # store to its array, nor out of a loop body into the next iteration or after the loop.

    def _enter_branch(self, cond, code: str, negated: bool = False) -> None:
        """Push the branch under ``cond`` (its WGSL ``code``) on the path: the condition itself
        where it reads only thread indices, scalars and constants, else a key of its own."""
        if self._invariant(cond):
            self.path.append(("!" if negated else "") + code)
        else:
            self._enter_body()

    def _enter_body(self) -> None:
        """Push a key no later branch matches (a loop body, a branch of another condition)."""
        self.branches += 1
        self.path.append(self.branches)

    def _invariant(self, e) -> bool:
        """Whether ``e`` reads only thread indices, scalar parameters and constants."""
        ok = True

        def visit(n):
            nonlocal ok
            if isinstance(n, E.BufferLoad) or \
                    (isinstance(n, E.Var) and n not in self.invariant_vars):
                ok = False
        post_order_visit(e, visit)
        return ok

    def _forget_changed_in(self, s) -> None:
        """Before a rolled loop of body ``s``: a later iteration may see its stores and its
        barriers' effects."""
        if _has_barrier(s):
            self.loaded.clear()
            return
        stored = {id(b) for b in written_buffers(s)}
        self.loaded = {k: v for k, v in self.loaded.items() if k[1] not in stored}

    def visit_For(self, s):
        v = s.loop_var
        if s.kind == "vectorized" and self._try_half_pair(s):
            return
        if s.kind == "vectorized" and (self.vec4_shared or self.vec4_storage) and \
                self._try_vec4_loop(s):
            return
        if s.kind == "thread_binding":
            raise self.error(f"loop {v.name} is still bound to {s.thread_tag}; kernels come "
                             f"from tensorir.transform.split_host_device", s)
        ext = E.as_int(self.analyzer.simplify(s.extent))
        lo = E.as_int(self.analyzer.simplify(s.min))
        # unrolled / vectorized loops, and short serial loops indexing a register tile (a
        # local array), are unrolled so that the tile's indices become constants (scalarized
        # below); the size counts what the loops inside will unroll to
        if _unroll_wanted(s, ext) and lo is not None:
            size = _stmt_size(s.body) * ext
            if size <= self.unroll_budget:
                self.unroll_budget -= size
                self.unrolling += 1
                for k in range(lo, lo + ext):
                    self.var_code[v] = _int_literal(k, v.dtype, v)
                    self.analyzer.bind(v, E.IntImm(k, v.dtype))
                    self.emit("{")
                    self.depth += 1
                    self.visit(s.body)
                    self.depth -= 1
                    self.emit("}")
                self.unrolling -= 1
                self.analyzer.bind(v, Range(s.min, s.extent))
                return
            self.over_budget.append(f"{v.name} ({ext} x {size // ext} statements)")
        # a rolled loop: an iteration may see the stores and barriers of the one before
        self._forget_changed_in(s.body)
        self._enter_body()
        super().visit_For(s)
        self.path.pop()

    def loop_bound(self, e) -> str:
        self.index_depth += 1
        try:
            return self.visit(e)
        finally:
            self.index_depth -= 1

    def _is_vec4(self, buf) -> bool:
        """Whether ``buf`` is declared an array of ``vec4<f32>`` (workgroup or storage)."""
        return id(buf) in self.vec4_shared or id(buf) in self.vec4_storage

    def _vec4_base(self, buf, index, v, lo):
        """The element offset of lane 0 of an access of ``buf`` at ``index`` in a vectorized
        loop of ``v`` (from ``lo``) when it is ``base + v`` with ``base`` a provable multiple
        of 4 (the proof of OpenCL's ``float4`` accesses, ``CodegenC._aligned``); else None."""
        base = arith.ramp_base(index, v)
        if base is None:
            return None
        base = self.analyzer.simplify(E.Add(base, lo)) if not E.is_const_int(lo, 0) else base
        return base if self._aligned(buf, base, 4) else None

    def _vec4_ref(self, base, buf) -> str:
        """The reference of the vector whose lane 0 is element ``base`` (a multiple of 4)."""
        q = self.analyzer.simplify(E.FloorDiv(base, E.IntImm(4, base.dtype)))
        return self._vector_ref(buf, q)

    def _lane_invariant(self, cond, v, lo: int):
        """``cond`` when it has one value for the four lanes ``v = lo .. lo+3``: the same
        expression once simplified for each (a split's tail test ``4 * t + v < 4 * n``, whose
        lanes all read ``t < n``); else None."""
        if not _uses_var(cond, v):
            return cond
        lanes = []
        for lane in range(4):
            try:
                lanes.append(self.analyzer.simplify(
                    substitute(cond, {v: E.IntImm(lo + lane, v.dtype)})))
            except TIRError:
                return None
        if _uses_var(lanes[0], v) or \
                not all(structural_equal(lanes[0], c) for c in lanes[1:]):
            return None
        return lanes[0]

    def _try_vec4_loop(self, s) -> bool:
        """A vectorized loop of 4 whose body (maybe under a guard that does not depend on the
        lane) is stores of expressions: every load of a vec4 array (``_is_vec4``) at an aligned
        ``base + v`` becomes one ``vec4`` load before the lanes, every such store one ``vec4``
        store of the four lanes' values; the rest is computed lane by lane, other accesses
        index a component. False (nothing emitted) when no access is a whole vector, or when
        a store could feed a load of the loop (the lanes' order would change)."""
        v = s.loop_var
        if E.as_int(s.extent) != 4 or E.as_int(s.min) is None:
            return False
        body, guard = s.body, None
        if isinstance(body, S.IfThenElse) and body.else_case is None:
            guard = self._lane_invariant(body.condition, v, E.as_int(s.min))
            if guard is None:
                return False
            body = body.then_case
        stores = body.seq if isinstance(body, S.SeqStmt) else (body,)
        if not all(isinstance(st, S.BufferStore) for st in stores):
            return False
        stored = [id(st.buffer) for st in stores]
        if len(set(stored)) != len(stored):
            return False
        loads = []
        for st in stores:
            post_order_visit(st.value, lambda n: loads.append(n)
                             if isinstance(n, E.BufferLoad) else None)
        if any(id(ld.buffer) in stored for ld in loads):
            return False
        vec_loads = {}
        for ld in loads:
            if id(ld) not in vec_loads and self._is_vec4(ld.buffer) and \
                    not self._packed(ld.buffer) and ld.buffer.dtype in _VEC4_DTYPES:
                base = self._vec4_base(ld.buffer, ld.indices[0], v, s.min)
                if base is not None:
                    vec_loads[id(ld)] = (ld, base)
        vec_stores = {}
        for st in stores:
            if self._is_vec4(st.buffer) and not self._packed(st.buffer) and \
                    st.buffer.dtype in _VEC4_DTYPES and _uses_var(st.indices[0], v):
                base = self._vec4_base(st.buffer, st.indices[0], v, s.min)
                if base is not None:
                    vec_stores[id(st)] = base
        if not vec_loads and not vec_stores:
            return False
        if guard is not None:
            code = self.visit(guard)
            self.emit(f"if ({code}) {{")
            self._enter_branch(guard, code)
            self.depth += 1
        temps = {}                  # (buffer id, vector reference) -> temporary
        for key, (ld, base) in vec_loads.items():
            ref = self._vec4_ref(base, ld.buffer)
            tkey = (id(ld.buffer), ref)
            if tkey not in temps:
                self.vec4_temps += 1
                temps[tkey] = f"tc_v4_{self.vec4_temps}"
                self.emit(self.let_decl(temps[tkey], _vec4_type(ld.buffer.dtype), ref))
                self._note_f16(ld.buffer.dtype)
            self.vec4_loads[key] = temps[tkey]
            self.vec4_proven.add(id(ld.buffer))
        lo = E.as_int(s.min)
        self.unrolling += 1
        for st in stores:
            if id(st) in vec_stores:
                # the value as one vector expression where WGSL has it (a ReLU: max(x, 0))
                code = self._vec4_expr(st.value, v, st.buffer.dtype)
                if code is not None:
                    ref = self._vec4_ref(vec_stores[id(st)], st.buffer)
                    self.vec4_proven.add(id(st.buffer))
                    self.emit(f"{ref} = {code};")
                    self._forget(st.buffer)
                    continue
            values, refs = [], []
            for lane in range(4):
                self.var_code[v] = _int_literal(lo + lane, v.dtype, v)
                self.analyzer.bind(v, E.IntImm(lo + lane, v.dtype))
                self.vec4_lane = lane
                values.append(self.store_value(st.buffer, self.visit(st.value)))
                if id(st) not in vec_stores:
                    refs.append(self._element(st.buffer, st.indices[0], st))
            if id(st) in vec_stores:
                ref = self._vec4_ref(vec_stores[id(st)], st.buffer)
                self.vec4_proven.add(id(st.buffer))
                self.emit(f"{ref} = {_vec4_type(st.buffer.dtype)}({', '.join(values)});")
            else:
                for ref, val in zip(refs, values):
                    self.emit(f"{ref} = {val};")
            self._forget(st.buffer)
        self.unrolling -= 1
        self.vec4_lane = None
        for key in vec_loads:
            del self.vec4_loads[key]
        self.analyzer.bind(v, Range(s.min, s.extent))
        if guard is not None:
            self.depth -= 1
            self.emit("}")
            self.path.pop()
        return True

    def _try_half_pair(self, s) -> bool:
        """A vectorized loop of 2 whose body is one float16 store into a register array (the
        GEMM's float16 accumulators in pairs, ``gemm.half_pairs``): the value computed as one
        ``vec2<f16>`` expression — arithmetic and float casts as vector operations, every other
        part's two lanes gathered (``vec2<f16>(a0, a1)``), a lane-invariant part broadcast — so
        that the driver can issue one packed half multiply-add for the two lanes; then stored
        lane by lane (register arrays are scalarized). False (nothing emitted) otherwise, or
        when the value reads the stored array anywhere but at the lane's own element."""
        v, lo = s.loop_var, E.as_int(s.min)
        st, guard = s.body, None
        if isinstance(st, S.IfThenElse) and st.else_case is None and \
                not _uses_var(st.condition, v):
            guard, st = st.condition, st.then_case     # a row guard, the same for both lanes
        if E.as_int(s.extent) != 2 or lo is None or not isinstance(st, S.BufferStore) or \
                st.buffer.scope != "local" or st.buffer.dtype != "float16" or \
                st.value.dtype != "float16":
            return False
        loads = []
        post_order_visit(st.value, lambda n: loads.append(n)
                         if isinstance(n, E.BufferLoad) else None)
        if any(ld.buffer is st.buffer and not structural_equal(ld.indices, st.indices)
               for ld in loads):
            return False
        if guard is not None:
            code = self.visit(guard)
            self.emit(f"if ({code}) {{")
            self._enter_branch(guard, code)
            self.depth += 1
        self.unrolling += 1
        try:
            code = self._pair_expr(st.value, v, lo)
            self.vec4_temps += 1
            tmp = f"tc_h2_{self.vec4_temps}"
            self.emit(self.let_decl(tmp, "vec2<f16>", code))
            for lane in range(2):
                self._bind_lane(v, lo + lane)
                index = self.buffer_index(st.indices[0], st.buffer)
                self.emit(self.store_stmt(st.buffer, index, f"{tmp}[{lane}]", st))
        finally:
            self.unrolling -= 1
            self.analyzer.bind(v, Range(s.min, s.extent))
        if guard is not None:
            self.depth -= 1
            self.emit("}")
            self.path.pop()
        self._note_f16("float16")
        return True

    def _bind_lane(self, v, k: int) -> None:
        self.var_code[v] = _int_literal(k, v.dtype, v)
        self.analyzer.bind(v, E.IntImm(k, v.dtype))

    def _pair_expr(self, e, v, lo: int) -> str:
        """``e`` over the two lanes ``v = lo, lo + 1`` as a ``vec2`` of its float dtype."""
        vt = f"vec2<{self.type_name(e.dtype, e)}>"
        if not _uses_var(e, v):
            return f"{vt}({self.visit(e)})"
        if isinstance(e, (E.Add, E.Sub, E.Mul, E.Div)) and dt.is_float(e.dtype):
            op = {E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/"}[type(e)]
            return f"({self._pair_expr(e.a, v, lo)} {op} {self._pair_expr(e.b, v, lo)})"
        if isinstance(e, E.Cast) and dt.is_float(e.dtype) and dt.is_float(e.value.dtype):
            return f"{vt}({self._pair_expr(e.value, v, lo)})"
        lanes = []
        for lane in range(2):
            self._bind_lane(v, lo + lane)
            lanes.append(self.visit(e))
        return f"{vt}({', '.join(lanes)})"

    _VEC4_MATH = ("exp", "log", "sqrt", "rsqrt", "fabs", "floor", "ceil", "round", "trunc",
                  "sin", "cos", "exp2", "log2", "tanh", "sigmoid")

    def _vec4_expr(self, e, v, dtype: str) -> str | None:
        """``e`` (the value of a vectorized float32 store) as one ``vec4<f32>`` expression: the
        vec4 loads, lane-invariant values broadcast, arithmetic, min / max and the builtins
        that take vectors; None when some part has no vector form (it is then computed lane
        by lane)."""
        if e.dtype != dtype or dtype != "float32":
            return None
        tmp = self.vec4_loads.get(id(e))
        if tmp is not None:
            return tmp
        if not _uses_var(e, v) and not any(
                id(n) in self.vec4_loads for n in _loads_of(e)):
            return f"vec4<f32>({self.visit(e)})"
        sub = (lambda x: self._vec4_expr(x, v, dtype))
        if isinstance(e, (E.Add, E.Sub, E.Mul, E.Div, E.Min, E.Max)):
            a, b = sub(e.a), sub(e.b)
            if a is None or b is None:
                return None
            if isinstance(e, (E.Min, E.Max)):
                return f"{'max' if isinstance(e, E.Max) else 'min'}({a}, {b})"
            op = {E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/"}[type(e)]
            return f"({a} {op} {b})"
        if isinstance(e, E.Call) and e.op in self._VEC4_MATH and len(e.args) == 1:
            a = sub(e.args[0])
            if a is None:
                return None
            if e.op == "tanh":
                return f"tanh(clamp({a}, vec4<f32>(-15.0f), vec4<f32>(15.0f)))"
            if e.op == "sigmoid":
                return f"(vec4<f32>(1.0f) / (vec4<f32>(1.0f) + exp(-{a})))"
            return f"{self._DIRECT[e.op]}({a})"
        return None

    def visit_BufferLoad(self, e):
        tmp = self.vec4_loads.get(id(e))
        if tmp is not None:          # lane of a vec4 loaded before the lanes
            return f"{tmp}[{self.vec4_lane}]"
        ref = self._element(e.buffer, e.indices[0], e)
        if WORKGROUP_READ_REUSE and e.buffer.scope == "shared" and not self.index_depth and \
                not self.no_reuse and e.buffer.dtype in ("float32", "float16", "int32"):
            return self._cached_load(e.buffer, ref)
        return self.load_value(e.buffer, ref)

    def _cached_load(self, buf, ref: str) -> str:
        """A workgroup element read once into a function-scope variable, and reused where the
        read certainly ran and the element cannot have changed (above): naga clamps the index
        of every read (a 7x7 convolution's tile: 833 reads of 245 elements), a variable
        not at all."""
        for depth in range(len(self.path), -1, -1):     # read here or under a prefix
            name = self.loaded.get((tuple(self.path[:depth]), id(buf), ref))
            if name is not None:
                return name
        name = f"tc_w{len(self.load_vars) + 1}"
        self.load_vars.append(f"var {name}: {self.type_name(buf.dtype, buf)};")
        self.emit(f"{name} = {self.load_value(buf, ref)};")
        self.loaded[(tuple(self.path), id(buf), ref)] = name
        return name

    def _forget(self, buf) -> None:
        """A store to ``buf``: its elements read before may have changed."""
        if buf.scope == "shared":
            self.loaded = {k: v for k, v in self.loaded.items() if k[1] != id(buf)}

    def visit_BufferStore(self, s):
        ref = self._element(s.buffer, s.indices[0], s)
        self.emit(f"{ref} = {self.store_value(s.buffer, self.visit(s.value))};")
        self._forget(s.buffer)

    def visit_And(self, e):
        self.no_reuse += 1           # WGSL's && and || skip their second operand
        try:
            return super().visit_And(e)
        finally:
            self.no_reuse -= 1

    def visit_Or(self, e):
        self.no_reuse += 1
        try:
            return super().visit_Or(e)
        finally:
            self.no_reuse -= 1

    # =========================================================================================
    # buffers

    def buffer_index(self, idx, buf) -> str:
        if not dt.is_integer(idx.dtype):
            raise self.error(f"index {idx!r} of {buf.name} is not an integer", idx)
        if self.unrolling and not isinstance(idx, (E.IntImm, E.Var)):
            # unrolled copies see their loop variables as constants: fold them
            try:
                idx = self.analyzer.simplify(idx)
            except TIRError:
                pass
        self.index_depth += 1
        try:
            code = self.visit(idx)
        finally:
            self.index_depth -= 1
        return code if storage.wgsl_scalar(idx.dtype) == "i32" else f"i32({code})"

    def _packed(self, buf) -> bool:
        hit = self.binding_of.get(id(buf))
        return hit is not None and hit[0].packed

    # naga (and Tint) clamp every index into a workgroup or function array, and every index
    # into a vector, that is not a constant (``BoundsCheckPolicy::Restrict``: one ``UMin``
    # each; storage buffers are left to the driver's robust buffer access). An element of a
    # vec4 array whose lane is provably constant is therefore a constant component of a
    # dynamically indexed vector (``s[q][2i]``: one clamp), not ``s[i >> 2u][i & 3i]`` (two);
    # and a workgroup array that no access reads or writes as whole vectors stays a flat
    # ``array<f32>`` (``emit_kernel``). The trusted build (``-trusted-shaders=1``) compiles the
    # same WGSL without the clamps.

    def _element(self, buf, idx, node) -> str:
        """The WGSL reference of element ``idx`` (an IR index) of ``buf``."""
        if self.unrolling and not isinstance(idx, (E.IntImm, E.Var)):
            try:                 # as ``buffer_index`` folds it: the loop variables are constants
                idx = self.analyzer.simplify(idx)
            except TIRError:
                pass
        if self._is_vec4(buf) and not isinstance(idx, E.IntImm):
            lane = self._const_lane(idx)
            if lane is not None:
                q, c = lane
                return f"{self._vector_ref(buf, q)}[{c}i]"
        return self.element_ref(buf, self.buffer_index(idx, buf), node)

    def _vector_ref(self, buf, q) -> str:
        """The reference of vector ``q`` (an IR index) of the vec4 array ``buf``."""
        return f"{self.name_of(buf)}[{self.buffer_index(q, buf)}]"

    def _const_lane(self, idx):
        """``(q, c)`` with ``idx == 4 q + c`` and ``c`` a constant lane, where the analyzer
        proves ``idx`` non-negative and ``idx % 4`` constant (a register fragment's element
        ``4 k + 2``); else None."""
        four = E.IntImm(4, idx.dtype)
        try:
            if not self.analyzer.can_prove(idx >= 0):
                return None
            c = E.as_int(self.analyzer.simplify(E.FloorMod(idx, four)))
            if c is None:
                return None
            q = self.analyzer.simplify(E.FloorDiv(idx, four))
        except TIRError:
            return None
        return q, c

    def element_ref(self, buf, index: str, node) -> str:
        if self._is_vec4(buf):
            return self._vec4_element(buf, index)
        if buf.scope == "shared":
            return f"{self.name_of(buf)}[{index}]"
        if buf.scope == "local":
            return f"{self.name_of(buf)}[{index}]"
        hit = self.binding_of.get(id(buf))
        if hit is None:
            raise self.error(f"buffer {buf.name} is not bound to the kernel", node)
        b, k = hit
        if b.packed:
            off = self.offset_fields[(b.binding, k)]
            return f"tc_pack{b.binding}[tc_params.{off} + {index}]"
        return f"{self.name_of(buf)}[{index}]"

    def _vec4_element(self, buf, idx: str) -> str:
        """Element ``idx`` of a vec4 array (workgroup or storage): a component of vector
        ``idx / 4``."""
        name = self.name_of(buf)
        m = re.fullmatch(r"(\d+)i", idx)
        if m:
            k = int(m.group(1))
            return f"{name}[{k // 4}i][{k % 4}i]"
        return f"{name}[({idx}) >> 2u][({idx}) & 3i]"

    def load_value(self, buf, ref: str) -> str:
        if self._packed(buf):
            st = storage.wgsl_storage(buf.dtype)
            ref = ref if st == "u32" else f"bitcast<{st}>({ref})"
        if buf.dtype == "bool":
            return f"({ref} != 0u)"
        self._note_f16(buf.dtype)
        return ref

    def store_value(self, buf, value: str) -> str:
        if buf.dtype == "bool":
            value = f"select(0u, 1u, {value})"
        if self._packed(buf):   # the word is u32
            st = storage.wgsl_storage(buf.dtype)
            if st in ("i32", "f32"):
                return f"bitcast<u32>({value})"
            if st != "u32":
                raise self.error(f"a {buf.dtype} buffer cannot be packed with others (only "
                                 f"32-bit elements can)", buf)
        return value

    # =========================================================================================
    # expressions WGSL spells differently

    def visit_Var(self, v):
        code = self.var_code.get(v)
        if code is None:
            raise self.error(f"variable {v.name} is not defined in the kernel and is not a "
                             f"shape variable or scalar parameter", v)
        return code

    def visit_IntImm(self, e):
        if self.index_depth and e.dtype in ("int64", "uint64") and \
                not -2 ** 31 <= e.value <= INT32_MAX:
            raise self.error(f"the index constant {e.value} does not fit in 32 bits; WebGPU "
                             f"kernels index with i32 (arrays of fewer than 2**31 elements)", e)
        return _int_literal(e.value, e.dtype, e)

    def _power_of_two_shift(self, e) -> int | None:
        """k where ``e`` (an integer / or %) divides a provably non-negative value by the
        constant 2**k (k >= 1), else None."""
        c = E.as_int(e.b)
        if c is None or c < 2 or c & (c - 1):
            return None
        if not self.analyzer.can_prove(e.a >= 0):
            return None
        return c.bit_length() - 1

    def _nonzero_const(self, e) -> bool:
        c = E.as_int(e)
        return c is not None and c != 0

    def _int_division(self, e, op: str) -> str:
        # WGSL defines x / 0 as x and x % 0 as 0; TensorIR's generators give 0 for both
        a, b = self.visit(e.a), self.visit(e.b)
        shift = self._power_of_two_shift(e)
        if shift is not None:
            # naga turns every integer / and % into a call of a helper that guards the divisor
            # (zero, or -1 with INT_MIN) and a signed division the driver must fix up for
            # negative values; of a provably non-negative value by 2**k, a shift or a mask
            # is exact, and what OpenCL compilers emit for the same index arithmetic
            if op == "/":
                return _wrap(f"({a} >> {shift}u)", e.dtype)
            return _wrap(f"({a} & {_int_literal(E.as_int(e.b) - 1, e.dtype, e)})", e.dtype)
        if self._nonzero_const(e.b):
            return _wrap(f"({a} {op} {b})", e.dtype)
        zero = "0u" if storage.wgsl_scalar(e.dtype) == "u32" else "0i"
        return _wrap(f"select({a} {op} {b}, {zero}, {b} == {zero})", e.dtype)

    def visit_Div(self, e):
        if dt.is_float(e.dtype):
            self._note_f16(e.dtype)
            return f"({self.visit(e.a)} / {self.visit(e.b)})"
        return self._int_division(e, "/")

    def visit_Mod(self, e):
        if dt.is_float(e.dtype):
            a, b = self.visit(e.a), self.visit(e.b)
            self._note_f16(e.dtype)
            return f"({a} % {b})"
        return self._int_division(e, "%")

    def visit_Select(self, e):
        f, t = self.visit(e.false_value), self.visit(e.true_value)
        return f"select({f}, {t}, {self.visit(e.condition)})"

    def visit_Cast(self, e):
        src, dst = e.value.dtype, e.dtype
        code = self.visit(e.value)
        st, dtt = self.type_name(src, e), self.type_name(dst, e)
        if dst == "bool":
            zero = {"f32": "0.0f", "f16": "0.0h", "i32": "0i", "u32": "0u"}.get(st)
            return code if st == "bool" else f"({code} != {zero})"
        if dt.is_float(src) and dt.is_integer(dst):
            if dtt == "u32" and dst != "uint32" and dst != "uint64":
                return _wrap(f"u32(i32({code}))", dst)
            return _wrap(f"{dtt}({code})", dst)
        if st == dtt:
            if dst in _NARROW_WRAP or dst in _NARROW_MASK:
                if src == dst or (dt.bits(src) < dt.bits(dst) and dt.code(src) == dt.code(dst)):
                    return code
                return _wrap(code, dst)
            return code
        return _wrap(f"{dtt}({code})", dst)

    _DIRECT = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "inverseSqrt",
               "fabs": "abs", "floor": "floor", "ceil": "ceil", "round": "round",
               "trunc": "trunc", "sin": "sin", "cos": "cos", "exp2": "exp2", "log2": "log2"}

    def visit_Call(self, e):
        op = e.op
        if op == "if_then_else":
            c, t, f = e.args
            # WebGPU bounds every access (robust buffer access), so evaluating both sides is
            # memory-safe; select keeps the code branch-free.
            f, t = self.visit(f), self.visit(t)
            return f"select({f}, {t}, {self.visit(c)})"
        if op in BARRIER_OPS:
            raise self.error("a barrier inside an expression", e)
        args = [self.visit(a) for a in e.args]
        src = e.args[0].dtype if e.args else e.dtype
        if src == "float16" or e.dtype == "float16":
            # float16 math runs in f32 and rounds once
            self.uses_f16 = True
            args = [f"f32({a})" for a in args]
            out = self._math(op, args, e)
            return f"f16({out})" if e.dtype == "float16" else out
        if src != "float32":
            self.type_name(src, e)
        out = self._math(op, args, e)
        if e.dtype != "float32" and src == "float32":
            out = f"{self.type_name(e.dtype, e)}({out})"
        return out

    def _math(self, op, args, e) -> str:
        if op in self._DIRECT:
            return f"{self._DIRECT[op]}({args[0]})"
        if op == "tanh":
            return f"tanh(clamp({args[0]}, -15.0f, 15.0f))"
        if op == "sigmoid":
            return f"(1.0f / (1.0f + exp(-{args[0]})))"
        if op == "erf":
            self.helpers.add("tc_erf")
            return f"tc_erf({args[0]})"
        if op == "pow":
            self.helpers.add("tc_pow")
            self.private_consts.add("tc_nan_bits")
            return f"tc_pow({args[0]}, {args[1]})"
        raise self.error(f"the intrinsic {op!r} has no WGSL equivalent", e)


def _vec4_shared(body, shared) -> set:
    """ids of the float32 / float16 shared buffers (size a multiple of 4) that some vectorized
    loop of 4 reads at ``base + v``."""
    cands = {id(b) for b in shared if b.dtype in ("float32", "float16")}
    found = set()

    def visit(n):
        if isinstance(n, S.For) and n.kind == "vectorized" and E.as_int(n.extent) == 4 and \
                isinstance(n.body, S.BufferStore) and isinstance(n.body.value, E.BufferLoad):
            src = n.body.value
            if id(src.buffer) in cands and arith.ramp_base(src.indices[0], n.loop_var) is not None:
                found.add(id(src.buffer))
    post_order_visit(body, visit)
    sizes = {id(b): b for b in shared}
    out = set()
    for k in found:
        try:
            n = 1
            for d in sizes[k].shape:
                n *= E.as_int(d)
            if n % 4 == 0:
                out.add(k)
        except TypeError:
            pass
    return out


# element types of storage buffers that may be bound as arrays of vec4 (a vec4<f16> is 8 bytes:
# allocations are multiples of 16); uint32: the int4 GEMV's packed codes, 16 bytes a load
_VEC4_DTYPES = ("float32", "float16", "uint32")


def _vec4_storage_candidates(body, bindings: list[Binding]) -> set:
    """ids of the float storage buffers with a binding of their own that some vectorized
    loop of 4 loads or stores at ``base + v`` (whether ``base`` is a provable multiple of 4 is
    decided during generation, where the loop and thread ranges are known)."""
    own = {id(b.buffers[0]) for b in bindings if not b.packed and
           b.buffers[0].dtype in _VEC4_DTYPES}
    found = set()

    def visit(n):
        if not (isinstance(n, S.For) and n.kind == "vectorized" and E.as_int(n.extent) == 4):
            return
        v = n.loop_var

        def access(m):
            if isinstance(m, (E.BufferLoad, S.BufferStore)) and id(m.buffer) in own and \
                    arith.ramp_base(m.indices[0], v) is not None and _uses_var(m.indices[0], v):
                found.add(id(m.buffer))
        post_order_visit(n.body, access)
    post_order_visit(body, visit)
    return found


def _has_barrier(s) -> bool:
    found = False

    def visit(n):
        nonlocal found
        if isinstance(n, E.Call) and n.op in BARRIER_OPS:
            found = True
    post_order_visit(s, visit)
    return found


def _vec4_type(dtype: str) -> str:
    return f"vec4<{storage.wgsl_storage(dtype)}>"


def _loads_of(e) -> list:
    out = []
    post_order_visit(e, lambda n: out.append(n) if isinstance(n, E.BufferLoad) else None)
    return out


def _uses_var(e, v) -> bool:
    return uses_any(e, [v])


def _indexes_local(s, v) -> bool:
    """Whether ``s`` indexes a local (register) array with the loop variable ``v``."""
    found = False

    def visit(n):
        nonlocal found
        if isinstance(n, (E.BufferLoad, S.BufferStore)) and n.buffer.scope == "local" and \
                any(_uses_var(i, v) for i in n.indices):
            found = True

    post_order_visit(s, visit)
    return found


def _unroll_wanted(s: S.For, ext: int | None) -> bool:
    """Whether the loop ``s`` of constant extent ``ext`` is to be unrolled (within the budget):
    ``unrolled`` and ``vectorized`` loops up to ``UNROLL_LIMIT``, and serial loops of at most
    16 iterations whose variable indexes a register tile — unrolled, its indices are constants
    and the tile becomes scalars (``_scalarize_locals``). A serial loop that merely contains
    register accesses (a GEMM's k-step loop around its barriers, indexing only shared tiles and
    global buffers) stays a loop, as in the OpenCL C: unrolled, it multiplied the kernel by its
    trip count and spent the budget before the register loops inside it, whose accumulator tile
    then stayed a dynamically indexed array (local memory on a GPU: ResNet-50's 56 x 56 1x1
    convolutions and its stem ran 7-10x slower than OpenCL's on the H100)."""
    if ext is None or not 0 < ext <= UNROLL_LIMIT:
        return False
    if s.kind in ("unrolled", "vectorized"):
        return True
    return s.kind == "serial" and ext <= 16 and _indexes_local(s.body, s.loop_var)


def unroll_budget_fits(kernel) -> bool:
    """Whether generating ``kernel`` (a ``DeviceKernel`` of ``split_host_device``) unrolls every
    loop it wants unrolled within ``UNROLL_BODY_LIMIT`` statements: then no loop is left rolled
    for the budget and ``emit_kernel`` gives no ``UnrollBudgetWarning``. Walks the body as
    ``visit_For`` spends the budget, without generating (far cheaper than ``emit_kernel``),
    and errs towards False: both branches of every ``if`` count (generation may fold one
    away), every vectorized loop counts as unrolled (a ``vec4`` one is not), and a loop it may
    unroll whose bounds are not constants without the generator's bindings does not fit.
    (The GEMM rule's WebGPU k-step asks this of its kernels: ``relax.backend.gpu.gemm``.)

    Examples
    --------
    >>> split = lower_device(scheduled_func, Target("webgpu"))            # doctest: +SKIP
    >>> all(unroll_budget_fits(k) for k in split.kernels)                # doctest: +SKIP
    True
    """
    analyzer = arith.Analyzer()
    budget = UNROLL_BODY_LIMIT

    def fits(s) -> bool:
        nonlocal budget
        if isinstance(s, S.SeqStmt):
            return all(fits(x) for x in s.seq)
        if isinstance(s, S.IfThenElse):
            return fits(s.then_case) and (s.else_case is None or fits(s.else_case))
        if isinstance(s, (S.LetStmt, S.AssertStmt, S.Allocate)):
            return fits(s.body)
        if not isinstance(s, S.For):
            return True
        ext = E.as_int(analyzer.simplify(s.extent))
        lo = E.as_int(analyzer.simplify(s.min))
        candidate = s.kind in ("unrolled", "vectorized") or \
            (s.kind == "serial" and _indexes_local(s.body, s.loop_var))
        if candidate and (ext is None or lo is None):
            return False        # the generator might know them (its bindings): unknown
        if not _unroll_wanted(s, ext):
            return fits(s.body)
        size = _stmt_size(s.body) * ext
        if size > budget:
            return False
        budget -= size
        return all(fits(s.body) for _ in range(ext))

    return fits(kernel_body(kernel)[1])


def _scalarize_locals(body: list[str], arrays: list[tuple[str, str]]) -> list[str]:
    """Local arrays indexed only by constants (register tiles after unrolling) become one
    variable per element: ``acc[5i]`` -> ``acc_5``. Drivers keep scalars in registers, while a
    function-scope array may stay in (slow) local memory."""
    text = "\n".join(body)
    for name, ty in arrays:
        pattern = re.compile(re.escape(name) + r"\[")
        const = re.compile(re.escape(name) + r"\[(\d+)i\]")
        decl = re.compile(r"^(\s*)var " + re.escape(name) + r": array<[^>]+>;$", re.M)
        uses = len(pattern.findall(text))
        consts = const.findall(text)
        if uses != len(consts):
            continue                    # some index is not a constant: keep the array
        used = sorted({int(k) for k in consts})
        text = decl.sub(lambda m: "\n".join(f"{m.group(1)}var {name}_{k}: {ty};" for k in used)
                        if used else "", text)
        text = const.sub(lambda m: f"{name}_{m.group(1)}", text)
    return text.split("\n")


def _stmt_size(s) -> int:
    if isinstance(s, S.SeqStmt):
        return sum(_stmt_size(x) for x in s.seq)
    if isinstance(s, S.For):
        # as visit_For emits it: the loops it unrolls count their body once per iteration
        ext = E.as_int(s.extent)
        inner = _stmt_size(s.body)
        return inner * ext if _unroll_wanted(s, ext) else inner + 1
    if isinstance(s, S.IfThenElse):
        return 1 + _stmt_size(s.then_case) + (_stmt_size(s.else_case) if s.else_case else 0)
    if isinstance(s, (S.LetStmt, S.AssertStmt, S.Allocate)):
        return 1 + _stmt_size(s.body)
    return 1


def emit_kernel(kernel, bindings: list[Binding], limits: dict, *, supports_float16: bool = False,
                nonneg_scalars: Sequence = ()) -> KernelSource:
    """Generate the WGSL of one ``DeviceKernel``.

    Parameters
    ----------
    kernel : tensorir.transform.DeviceKernel
        A kernel of ``split_host_device``: device-form body, thread vars, launch geometry.
    bindings : list[Binding]
        Its global buffers in binding order (``kernel.buffer_params``, some maybe packed).
    limits : dict
        ``Target.limits`` of a WebGPU target.
    supports_float16 : bool
        Whether float16 code may be emitted (``enable f16;``).
    nonneg_scalars : list[Var]
        Scalar parameters known to be >= 0 (shape dims), for cheaper integer division.
    """
    gen = WGSLCodegen(kernel, bindings, limits, supports_float16=supports_float16,
                      nonneg_scalars=nonneg_scalars)
    src = gen.generate()
    if (gen.vec4_storage | gen.vec4_shared) - gen.vec4_proven:
        # a candidate with no provably aligned vector access gains nothing from vec4: its
        # accesses would only index components (a workgroup array's, at a lane the thread
        # decides, clamped twice by naga: the array index and the lane). Generate again
        # with array<f32> for those.
        gen = WGSLCodegen(kernel, bindings, limits, supports_float16=supports_float16,
                          nonneg_scalars=nonneg_scalars,
                          vec4_storage=gen.vec4_storage & gen.vec4_proven,
                          vec4_shared=gen.vec4_shared & gen.vec4_proven)
        src = gen.generate()
    _warn_register_arrays(gen, src)
    return src


class UnrollBudgetWarning(UserWarning):
    """A kernel's register tile stays a dynamically indexed array because the loops indexing
    it did not fit the WGSL generator's unroll budget (``UNROLL_BODY_LIMIT``)."""


def _warn_register_arrays(gen: WGSLCodegen, src: KernelSource) -> None:
    """Warn when a loop was left rolled for the budget and a register array stayed an array:
    the kernel runs, but its tile lives in function-scope memory (local memory on a GPU;
    ResNet-50's convolutions ran 7-10x slower that way, issue 32)."""
    if not gen.over_budget:
        return
    kept = sorted({name for name, _ in gen.local_arrays
                   if re.search(r"var " + re.escape(name) + r": array<", src.wgsl)})
    if kept:
        warnings.warn(UnrollBudgetWarning(
            f"kernel {gen.kernel_name}: loops {', '.join(gen.over_budget[:3])} do not fit the "
            f"WGSL unroll budget of {UNROLL_BODY_LIMIT} statements, so the register arrays "
            f"{', '.join(kept)} stay dynamically indexed (function-scope memory: slow on a "
            f"GPU); a schedule with a smaller register tile or fewer unrolled loops keeps them "
            f"in registers"), stacklevel=3)
