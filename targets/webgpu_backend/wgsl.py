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
* ``shared`` allocations are module-scope ``var<workgroup>`` arrays (their total is checked
  against the workgroup-storage limit), ``local`` ones function-scope arrays; a barrier is
  ``workgroupBarrier()``. A float32 shared array that a vectorized loop of 4 reads at
  ``base + v`` (a GEMM's register fragment) is an ``array<vec4<f32>>``: such a read, at a
  provable multiple of 4, is one ``vec4`` load stored lane by lane; other accesses index a
  component (``s[i >> 2u][i & 3i]``).
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
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import expr as E
from tilecraft.tensorir import stmt as S
from tilecraft.tensorir.arith import Analyzer
from tilecraft.tensorir.expr import TIRError
from tilecraft.tensorir.stmt import Range

from tilecraft.tensorir.functor import substitute

from . import exprjson, storage

INT32_MAX = 2 ** 31 - 1
MAX_WORKGROUPS = 65535
UNROLL_LIMIT = 64          # unrolled/vectorized loops up to this constant extent are unrolled
UNROLL_BODY_LIMIT = 8192   # ... unless the unrolled code would exceed this many statements

BARRIER_OPS = {"tvm_storage_sync", "tir.tvm_storage_sync", "storage_sync", "barrier",
               "workgroup_barrier", "syncthreads"}

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


class _Names:
    """Unique WGSL identifiers for Vars and Buffers (by identity)."""

    def __init__(self):
        self._by_id: dict[int, str] = {}
        self._used: set[str] = set()
        self._keep: list = []

    def get(self, obj, prefix: str) -> str:
        key = id(obj)
        if key in self._by_id:
            return self._by_id[key]
        base = prefix + sanitize(obj.name)
        name, k = base, 1
        while name in self._used or name in _RESERVED:
            name, k = f"{base}_{k}", k + 1
        self._used.add(name)
        self._by_id[key] = name
        self._keep.append(obj)  # ids stay valid while the table lives
        return name


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


# Helper functions, emitted only when used.
_HELPERS = {
    "tc_floordiv_i32": """fn tc_floordiv_i32(a: i32, b: i32) -> i32 {
  if (b == 0i) { return 0i; }
  let q = a / b;
  if ((a % b != 0i) && ((a < 0i) != (b < 0i))) { return q - 1i; }
  return q;
}""",
    "tc_floormod_i32": """fn tc_floormod_i32(a: i32, b: i32) -> i32 {
  if (b == 0i) { return 0i; }
  let r = a % b;
  if ((r != 0i) && ((r < 0i) != (b < 0i))) { return r + b; }
  return r;
}""",
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


def _float_literal(value: float, dtype: str, emitter: "KernelEmitter") -> str:
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


class KernelEmitter:
    """Emit one ``DeviceKernel`` (``tensorir.transform.split_host_device``). Use ``emit_kernel``."""

    def __init__(self, kernel, bindings: list[Binding], limits: dict, *,
                 supports_float16: bool, nonneg_scalars: Sequence = ()):
        self.kernel = kernel
        self.name = kernel.name
        self.body = kernel.func.body
        self.bindings = bindings
        self.limits = limits
        self.supports_float16 = supports_float16
        self.names = _Names()
        self.lines: list[str] = []
        self.indent = 1
        self.helpers: set[str] = set()
        self.private_consts: set[str] = set()
        self.uses_f16 = False
        self.ana = Analyzer()
        self.local_vars: dict[int, str] = {}       # Var id -> WGSL expression (loop/let vars)
        self.uniform_fields: dict[int, str] = {}   # Var id -> field
        self.uniform: list[dict] = []
        self.binding_of: dict[int, tuple[Binding, int]] = {}
        self.unroll_budget = UNROLL_BODY_LIMIT
        self.unrolling = 0
        self.index_depth = 0       # > 0 while emitting an index or a loop bound
        self.local_arrays: list[tuple[str, str]] = []   # (name, element type)
        for b in bindings:
            for k, buf in enumerate(b.buffers):
                self.binding_of[id(buf)] = (b, k)
        for v, host in zip(kernel.scalar_params, kernel.host_scalars):
            fld = self.names.get(v, "")
            self.uniform_fields[id(v)] = fld
            ty = self.ty(v.dtype, v)
            self.uniform.append({"field": fld, "type": "f32" if ty == "f16" else
                                 ("u32" if ty == "bool" else ty),
                                 "value": exprjson.to_json(host) if not dt.is_float(host.dtype)
                                 else ["var", host.name], "dtype": v.dtype})
        for v in nonneg_scalars:
            if dt.is_int(v.dtype):
                self.ana.update_bound(v, 0, None)
        self.offset_fields: dict[tuple[int, int], str] = {}
        for b in bindings:
            if b.packed:
                for k, buf in enumerate(b.buffers):
                    fld = f"tc_off{b.binding}_{k}"
                    self.offset_fields[(b.binding, k)] = fld
                    self.uniform.append({"field": fld, "type": "i32",
                                         "value": {"offset": [b.binding, k]}})
        self.workgroup_size = tuple(int(x) for x in kernel.block)
        self.shared = [buf for buf in kernel.shared_buffers if buf.scope == "shared"]
        # float32 workgroup arrays read as vectors somewhere (a vectorized loop of 4 copying
        # neighbouring elements: a GEMM's register fragment) are declared array<vec4<f32>>,
        # so that such a read is one 128-bit load; element accesses index a component
        self.vec4_shared = _vec4_shared(kernel.func.body, self.shared)
        tv = dict(kernel.thread_vars)
        for tag, v in tv.items():
            axis = tag[-1]
            if tag.startswith("threadIdx"):
                self.local_vars[id(v)] = f"i32(tc_lid.{axis})"
                ext = self.workgroup_size["xyz".index(axis)]
            else:
                self.local_vars[id(v)] = f"tc_bid.{axis}"
                ext = kernel.grid["xyz".index(axis)]
            if dt.is_integer(v.dtype):
                self.ana.bind(v, Range(E.IntImm(0, v.dtype), _as_dtype(ext, v.dtype)))
        self.has_blocks = any(t.startswith("blockIdx") for t in tv)

    # =========================================================================================
    # emission

    def line(self, text: str):
        self.lines.append("  " * self.indent + text)

    def run(self) -> KernelSource:
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
        self.stmt(self.body)
        return self._assemble(self.lines, grid_json)

    def _check_limits(self):
        wg = self.workgroup_size
        total = wg[0] * wg[1] * wg[2]
        lim_inv = self.limits.get("max_compute_invocations_per_workgroup",
                                  self.limits.get("max_threads_per_block"))
        if lim_inv and total > lim_inv:
            raise WebGPULimitError(
                f"kernel {self.name}: {total} invocations per workgroup "
                f"({' x '.join(map(str, wg))}), over the target's limit of {lim_inv} "
                f"(max_compute_invocations_per_workgroup)", self.body)
        for axis, w in zip("xyz", wg):
            lim = self.limits.get(f"max_compute_workgroup_size_{axis}")
            if lim and w > lim:
                raise WebGPULimitError(f"kernel {self.name}: threadIdx.{axis} extent {w} is over "
                                       f"the target's limit of {lim} "
                                       f"(max_compute_workgroup_size_{axis})", self.body)
        shared_bytes = 0
        for buf in self.shared:
            shared_bytes += self._const_size(buf) * \
                np.dtype(storage.storage_dtype(buf.dtype)).itemsize
        lim_sh = self.limits.get("max_compute_workgroup_storage_size",
                                 self.limits.get("max_shared_memory_per_block"))
        if lim_sh is not None and shared_bytes > lim_sh:
            raise WebGPULimitError(
                f"kernel {self.name}: {shared_bytes} bytes of shared (workgroup) memory "
                f"({', '.join(b.name for b in self.shared)}; 8- and 16-bit elements take 4 bytes "
                f"each), over the target's limit of {lim_sh} bytes "
                f"(max_compute_workgroup_storage_size)", self.body)
        self.shared_bytes = shared_bytes

    def _const_size(self, buf) -> int:
        n = 1
        for d in buf.shape:
            c = E.as_int(self.ana.simplify(d))
            if c is None:
                raise WebGPUBuildError(f"kernel {self.name}: {buf.scope} buffer {buf.name} has "
                                       f"the symbolic size {tuple(buf.shape)}; WGSL arrays need "
                                       f"a constant size", buf)
            n *= c
        return max(n, 1)

    def _block_prologue(self):
        """Define tc_bid: the logical workgroup index, decoded from a linearized dispatch."""
        if not self.has_blocks:
            return
        if not self.linear:
            self.line("let tc_bid = vec3<i32>(tc_wid);")
            return
        self.line(f"let tc_lin = i32(tc_wid.x) + i32(tc_wid.y) * {MAX_WORKGROUPS}i;")
        self.line("let tc_gx = tc_params.tc_grid_x;")
        self.line("let tc_gxy = tc_gx * tc_params.tc_grid_y;")
        # workgroup-uniform, so an early return keeps later barriers in uniform control flow
        self.line("if (tc_lin >= tc_gxy * tc_params.tc_grid_z) { return; }")
        self.line("let tc_bid = vec3<i32>(tc_lin % tc_gx, (tc_lin % tc_gxy) / tc_gx, "
                  "tc_lin / tc_gxy);")

    def _assemble(self, body: list[str], grid_json) -> KernelSource:
        out = []
        for b in self.bindings:
            if b.packed:
                name = f"tc_pack{b.binding}"
                elem = "u32"
            else:
                name = self.names.get(b.buffers[0], "b_")
                elem = storage.wgsl_storage(b.buffers[0].dtype)
            self.uses_f16 |= elem == "f16"
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
                out.append(f"var<workgroup> {self.names.get(buf, 's_')}: "
                           f"array<vec4<f32>, {self._const_size(buf) // 4}>;")
                continue
            out.append(f"var<workgroup> {self.names.get(buf, 's_')}: "
                       f"array<{storage.wgsl_storage(buf.dtype)}, {self._const_size(buf)}>;")
        for c in sorted(self.private_consts):
            out.append(f"var<private> {c}: u32 = {_NONFINITE_DECL[c]};")
        for h in sorted(self.helpers):
            out.append(_HELPERS[h])
        if self.uses_f16:
            if not self.supports_float16:
                raise WebGPUBuildError(
                    f"kernel {self.name} uses float16, which WGSL allows only with the "
                    f"shader-f16 feature; build for Target('webgpu -supports-float16=1') (the "
                    f"adapter must have shader-f16), or compute in float32", self.body)
            out = ["enable f16;", ""] + out
        wg = self.workgroup_size
        out.append("")
        out.append(f"@compute @workgroup_size({wg[0]}, {wg[1]}, {wg[2]})")
        out.append("fn main(@builtin(workgroup_id) tc_wid: vec3<u32>, "
                   "@builtin(local_invocation_id) tc_lid: vec3<u32>) {")
        out.extend(_scalarize_locals(body, self.local_arrays))
        out.append("}")
        wgsl = "\n".join(out) + "\n"
        return KernelSource(name=self.name, wgsl=wgsl, workgroup_size=wg, grid=grid_json,
                            linear_grid=self.linear, bindings=self.bindings,
                            uniform=self.uniform, uniform_binding=uniform_binding,
                            shared_bytes=self.shared_bytes)

    # -- statements ---------------------------------------------------------------------------
    def stmt(self, s):
        fn = getattr(self, "s_" + type(s).__name__, None)
        if fn is None:
            raise WebGPUBuildError(f"kernel {self.name}: the WGSL generator cannot emit a "
                                   f"{type(s).__name__} statement", s)
        fn(s)

    def s_SeqStmt(self, s):
        for x in s.seq:
            self.stmt(x)

    def s_Evaluate(self, s):
        v = s.value
        if isinstance(v, E.IntImm):
            return
        if isinstance(v, E.Call) and v.op in BARRIER_OPS:
            self.line("workgroupBarrier();")
            return
        raise WebGPUBuildError(f"kernel {self.name}: cannot emit the statement "
                               f"evaluate({v!r}) in WGSL", s)

    def s_BufferStore(self, s):
        buf = s.buffer
        idx = self.index(s.indices[0], buf)
        value = self.expr(s.value)
        if buf.dtype == "bool":
            value = f"select(0u, 1u, {value})"
        target = self._element_ref(buf, idx, s)
        if target[1]:  # packed: the word is u32
            value = self._to_word(value, buf.dtype)
        self.line(f"{target[0]} = {value};")

    def s_IfThenElse(self, s):
        cond = s.condition
        if self.unrolling:
            try:
                cond = self.ana.simplify(cond)
            except TIRError:
                pass
            if E.is_const_int(cond, 1):
                return self.stmt(s.then_case)
            if E.is_const_int(cond, 0):
                return self.stmt(s.else_case) if s.else_case is not None else None
        self.line(f"if ({self.expr(cond)}) {{")
        self.indent += 1
        with self.ana.with_constraint(s.condition):
            self.stmt(s.then_case)
        self.indent -= 1
        if s.else_case is not None:
            self.line("} else {")
            self.indent += 1
            self.stmt(s.else_case)
            self.indent -= 1
        self.line("}")

    def s_LetStmt(self, s):
        name = self.names.get(s.var, "v_")
        self.line(f"let {name}: {self.ty(s.var.dtype, s)} = {self.expr(s.value)};")
        self.local_vars[id(s.var)] = name
        if dt.is_integer(s.var.dtype):
            self.ana.bind(s.var, s.value)
        self.stmt(s.body)

    def s_AssertStmt(self, s):
        # Checks that depend only on host values were taken out by the host/device split; one
        # that depends on the thread's indices becomes a guard (WGSL cannot raise an error).
        self.line(f"if ({self.expr(s.condition)}) {{")
        self.indent += 1
        self.stmt(s.body)
        self.indent -= 1
        self.line("}")

    def s_Allocate(self, s):
        buf = s.buffer
        if buf.scope == "local":
            name = self.names.get(buf, 'l_')
            ty = self.ty(buf.dtype, s)
            self.local_arrays.append((name, ty))
            self.line(f"var {name}: array<{ty}, {self._const_size(buf)}>;")
        elif buf.scope != "shared":
            raise WebGPUBuildError(f"kernel {self.name}: a {buf.scope} allocation "
                                   f"({buf.name}) inside a kernel", s)
        self.stmt(s.body)

    def _vec4_element(self, buf, idx: str) -> str:
        """Element ``idx`` of a vec4 workgroup array: a component of vector ``idx / 4``."""
        name = self.names.get(buf, 's_')
        m = re.fullmatch(r"(\d+)i", idx)
        if m:
            k = int(m.group(1))
            return f"{name}[{k // 4}i][{k % 4}i]"
        return f"{name}[({idx}) >> 2u][({idx}) & 3i]"

    def _try_vec4_copy(self, s) -> bool:
        """A vectorized loop of 4 storing ``src[base + v]`` (``src`` a vec4 workgroup array,
        ``base`` a provable multiple of 4) into any float32 buffer: one vector load, four
        component stores (a register fragment stays scalars: see ``_scalarize_locals``)."""
        v = s.loop_var
        st = s.body
        if E.as_int(s.extent) != 4 or not isinstance(st, S.BufferStore) or \
                not isinstance(st.value, E.BufferLoad) or \
                id(st.value.buffer) not in self.vec4_shared or st.buffer.dtype != "float32":
            return False
        base = _unit_base(st.value.indices[0], v)
        if base is None:
            return False
        base = self.ana.simplify(E.Add(base, s.min))
        four = E.IntImm(4, base.dtype)
        if not self.ana.can_prove(E.EQ(E.FloorMod(base, four), E.IntImm(0, base.dtype))):
            return False
        ref, packed = self._element_ref(st.buffer, "0i", st)
        if packed:
            return False
        src = self.names.get(st.value.buffer, 's_')
        qidx = self.index(self.ana.simplify(E.FloorDiv(base, four)), st.value.buffer)
        self.vec4_temps = getattr(self, "vec4_temps", 0) + 1
        tmp = f"tc_v4_{self.vec4_temps}"
        self.line(f"let {tmp}: vec4<f32> = {src}[{qidx}];")
        for lane in range(4):
            at = E.Add(s.min, E.IntImm(lane, v.dtype))
            idx = self.index(self.ana.simplify(substitute(st.indices[0], {v: at})), st.buffer)
            target, _ = self._element_ref(st.buffer, idx, st)
            self.line(f"{target} = {tmp}[{lane}];")
        return True

    def s_For(self, s):
        v = s.loop_var
        if s.kind == "vectorized" and self.vec4_shared and self._try_vec4_copy(s):
            return
        if s.kind == "thread_binding":
            raise WebGPUBuildError(f"kernel {self.name}: loop {v.name} is still bound to "
                                   f"{s.thread_tag}; kernels come from "
                                   f"tensorir.transform.split_host_device", s)
        ext = E.as_int(self.ana.simplify(s.extent))
        lo = E.as_int(self.ana.simplify(s.min))
        # unrolled / vectorized loops, and short serial loops over a register tile (a local
        # array), are unrolled so that the tile's indices become constants (scalarized below)
        unroll = s.kind in ("unrolled", "vectorized") or (
            s.kind == "serial" and ext is not None and ext <= 16 and _touches_local(s.body))
        if unroll and ext is not None and lo is not None and 0 < ext <= UNROLL_LIMIT:
            size = _stmt_size(s.body) * ext
            if size <= self.unroll_budget:
                self.unroll_budget -= size
                self.unrolling += 1
                for k in range(lo, lo + ext):
                    self.local_vars[id(v)] = _int_literal(k, v.dtype, v)
                    self.ana.bind(v, E.IntImm(k, v.dtype))
                    self.line("{")
                    self.indent += 1
                    self.stmt(s.body)
                    self.indent -= 1
                    self.line("}")
                self.unrolling -= 1
                self.ana.bind(v, Range(s.min, s.extent))
                return
        name = self.names.get(v, "v_")
        ty = self.ty(v.dtype, s)
        self.local_vars[id(v)] = name
        self.index_depth += 1
        lo_c = self.expr(s.min)
        hi = self.expr(self.ana.simplify(E.Add(s.min, s.extent))) \
            if not E.is_const_int(s.min, 0) else self.expr(s.extent)
        self.index_depth -= 1
        self.ana.bind(v, Range(s.min, s.extent))
        one = "1u" if ty == "u32" else "1i"
        self.line(f"for (var {name}: {ty} = {lo_c}; {name} < {hi}; {name} = {name} + {one}) {{")
        self.indent += 1
        self.stmt(s.body)
        self.indent -= 1
        self.line("}")

    # -- buffers ----------------------------------------------------------------------------------
    def index(self, idx, buf) -> str:
        if not dt.is_integer(idx.dtype):
            raise WebGPUBuildError(f"index {idx!r} of {buf.name} is not an integer", idx)
        if self.unrolling and not isinstance(idx, (E.IntImm, E.Var)):
            # unrolled copies see their loop variables as constants: fold them
            try:
                idx = self.ana.simplify(idx)
            except TIRError:
                pass
        self.index_depth += 1
        try:
            return self._as_i32(self.expr(idx), idx.dtype)
        finally:
            self.index_depth -= 1

    @staticmethod
    def _as_i32(code: str, dtype: str) -> str:
        return code if storage.wgsl_scalar(dtype) == "i32" else f"i32({code})"

    def _element_ref(self, buf, idx: str, node) -> tuple[str, bool]:
        """(the WGSL lvalue/rvalue of buf[idx], whether it is a packed u32 word)."""
        if buf.scope == "shared":
            if id(buf) in self.vec4_shared:
                return self._vec4_element(buf, idx), False
            return f"{self.names.get(buf, 's_')}[{idx}]", False
        if buf.scope == "local":
            return f"{self.names.get(buf, 'l_')}[{idx}]", False
        hit = self.binding_of.get(id(buf))
        if hit is None:
            raise WebGPUBuildError(f"kernel {self.name}: buffer {buf.name} is not bound to the "
                                   f"kernel", node)
        b, k = hit
        if b.packed:
            off = self.offset_fields[(b.binding, k)]
            return f"tc_pack{b.binding}[tc_params.{off} + {idx}]", True
        return f"{self.names.get(buf, 'b_')}[{idx}]", False

    def _to_word(self, value: str, dtype: str) -> str:
        st = storage.wgsl_storage(dtype)
        if st == "u32":
            return value
        if st in ("i32", "f32"):
            return f"bitcast<u32>({value})"
        raise WebGPUBuildError(f"a {dtype} buffer cannot be packed with others (only 32-bit "
                               f"elements can)")

    def _from_word(self, code: str, dtype: str) -> str:
        st = storage.wgsl_storage(dtype)
        if st == "u32":
            return code
        return f"bitcast<{st}>({code})"

    # -- expressions ------------------------------------------------------------------------------
    def expr(self, e) -> str:
        fn = getattr(self, "e_" + type(e).__name__, None)
        if fn is None:
            raise WebGPUBuildError(f"kernel {self.name}: the WGSL generator cannot emit "
                                   f"{type(e).__name__} {e!r}", e)
        return fn(e)

    def e_Var(self, v):
        code = self.local_vars.get(id(v))
        if code is not None:
            return code
        fld = self.uniform_fields.get(id(v))
        if fld is not None:
            ty = self.ty(v.dtype, v)
            if ty == "f16":
                self.uses_f16 = True
                return f"f16(tc_params.{fld})"
            if ty == "bool":
                return f"(tc_params.{fld} != 0u)"
            return f"tc_params.{fld}"
        raise WebGPUBuildError(f"kernel {self.name}: variable {v.name} is not defined in the "
                               f"kernel and is not a shape variable or scalar parameter", v)

    def e_IntImm(self, e):
        if self.index_depth and e.dtype in ("int64", "uint64") and \
                not -2 ** 31 <= e.value <= INT32_MAX:
            raise WebGPUBuildError(f"kernel {self.name}: the index constant {e.value} does not "
                                   f"fit in 32 bits; WebGPU kernels index with i32 (arrays of "
                                   f"fewer than 2**31 elements)", e)
        return _int_literal(e.value, e.dtype, e)

    def e_FloatImm(self, e):
        if e.dtype == "float16":
            self.uses_f16 = True
        elif e.dtype != "float32":
            self.ty(e.dtype, e)
        return _float_literal(e.value, e.dtype, self)

    def e_StringImm(self, e):
        raise WebGPUBuildError(f"kernel {self.name}: a string {e.value!r} cannot be a WGSL "
                               f"value", e)

    def _bin(self, e, op):
        a, b = self.expr(e.a), self.expr(e.b)
        return _wrap(f"({a} {op} {b})", e.dtype)

    def e_Add(self, e):
        return self._bin(e, "+")

    def e_Sub(self, e):
        return self._bin(e, "-")

    def e_Mul(self, e):
        return self._bin(e, "*")

    def _nonzero_const(self, e) -> bool:
        c = E.as_int(e)
        return c is not None and c != 0

    def e_Div(self, e):
        if dt.is_float(e.dtype):
            self._note_f16(e.dtype)
            return f"({self.expr(e.a)} / {self.expr(e.b)})"
        a, b = self.expr(e.a), self.expr(e.b)
        if self._nonzero_const(e.b):
            return _wrap(f"({a} / {b})", e.dtype)
        zero = "0u" if storage.wgsl_scalar(e.dtype) == "u32" else "0i"
        return _wrap(f"select({a} / {b}, {zero}, {b} == {zero})", e.dtype)

    def e_Mod(self, e):
        a, b = self.expr(e.a), self.expr(e.b)
        if dt.is_float(e.dtype):
            self._note_f16(e.dtype)
            return f"({a} % {b})"
        if self._nonzero_const(e.b):
            return _wrap(f"({a} % {b})", e.dtype)
        zero = "0u" if storage.wgsl_scalar(e.dtype) == "u32" else "0i"
        return _wrap(f"select({a} % {b}, {zero}, {b} == {zero})", e.dtype)

    def _nonneg(self, e) -> bool:
        try:
            return self.ana.const_int_bound(e).min_value >= 0
        except TIRError:
            return False

    def e_FloorDiv(self, e):
        a, b = self.expr(e.a), self.expr(e.b)
        if dt.is_float(e.dtype):
            self._note_f16(e.dtype)
            return f"floor({a} / {b})"
        if storage.wgsl_scalar(e.dtype) == "u32":
            return _wrap(f"select({a} / {b}, 0u, {b} == 0u)" if not self._nonzero_const(e.b)
                         else f"({a} / {b})", e.dtype)
        c = E.as_int(e.b)
        if c is not None and c > 0 and self._nonneg(e.a):
            return _wrap(f"({a} / {b})", e.dtype)
        self.helpers.add("tc_floordiv_i32")
        return _wrap(f"tc_floordiv_i32({a}, {b})", e.dtype)

    def e_FloorMod(self, e):
        a, b = self.expr(e.a), self.expr(e.b)
        if dt.is_float(e.dtype):
            self._note_f16(e.dtype)
            return f"({a} - floor({a} / {b}) * {b})"
        if storage.wgsl_scalar(e.dtype) == "u32":
            return _wrap(f"select({a} % {b}, 0u, {b} == 0u)" if not self._nonzero_const(e.b)
                         else f"({a} % {b})", e.dtype)
        c = E.as_int(e.b)
        if c is not None and c > 0 and self._nonneg(e.a):
            return _wrap(f"({a} % {b})", e.dtype)
        self.helpers.add("tc_floormod_i32")
        return _wrap(f"tc_floormod_i32({a}, {b})", e.dtype)

    def e_Min(self, e):
        if e.dtype == "bool":
            return f"({self.expr(e.a)} && {self.expr(e.b)})"
        return f"min({self.expr(e.a)}, {self.expr(e.b)})"

    def e_Max(self, e):
        if e.dtype == "bool":
            return f"({self.expr(e.a)} || {self.expr(e.b)})"
        return f"max({self.expr(e.a)}, {self.expr(e.b)})"

    def _cmp(self, e, op):
        return f"({self.expr(e.a)} {op} {self.expr(e.b)})"

    def e_EQ(self, e):
        return self._cmp(e, "==")

    def e_NE(self, e):
        return self._cmp(e, "!=")

    def e_LT(self, e):
        return self._cmp(e, "<")

    def e_LE(self, e):
        return self._cmp(e, "<=")

    def e_GT(self, e):
        return self._cmp(e, ">")

    def e_GE(self, e):
        return self._cmp(e, ">=")

    def e_And(self, e):
        return f"({self.expr(e.a)} && {self.expr(e.b)})"

    def e_Or(self, e):
        return f"({self.expr(e.a)} || {self.expr(e.b)})"

    def e_Not(self, e):
        return f"(!{self.expr(e.a)})"

    def e_Select(self, e):
        return (f"select({self.expr(e.false_value)}, {self.expr(e.true_value)}, "
                f"{self.expr(e.condition)})")

    def e_Let(self, e):
        from tilecraft.tensorir.functor import substitute
        return self.expr(substitute(e.body, {e.var: e.value}))

    def ty(self, dtype: str, node=None) -> str:
        t = _wgsl_type(dtype, node)
        if t == "f16":
            self.uses_f16 = True
        return t

    def _note_f16(self, dtype):
        if dtype == "float16":
            self.uses_f16 = True

    def e_Cast(self, e):
        src, dst = e.value.dtype, e.dtype
        code = self.expr(e.value)
        st, dtt = self.ty(src, e), self.ty(dst, e)
        self._note_f16(src)
        self._note_f16(dst)
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

    def e_BufferLoad(self, e):
        buf = e.buffer
        idx = self.index(e.indices[0], buf)
        ref, packed = self._element_ref(buf, idx, e)
        if packed:
            ref = self._from_word(ref, buf.dtype)
        if buf.dtype == "bool":
            return f"({ref} != 0u)"
        self._note_f16(buf.dtype)
        return ref

    def e_Call(self, e):
        op = e.op
        if op == "if_then_else":
            c, t, f = e.args
            # WebGPU bounds every access (robust buffer access), so evaluating both sides is
            # memory-safe; select keeps the code branch-free.
            return f"select({self.expr(f)}, {self.expr(t)}, {self.expr(c)})"
        if op in BARRIER_OPS:
            raise WebGPUBuildError(f"kernel {self.name}: a barrier inside an expression", e)
        args = [self.expr(a) for a in e.args]
        src = e.args[0].dtype if e.args else e.dtype
        if src == "float16" or e.dtype == "float16":
            self.uses_f16 = True
            args = [f"f32({a})" for a in args]
            out = self._math(op, args, e)
            return f"f16({out})" if e.dtype == "float16" else out
        if src != "float32":
            self.ty(src, e)
        out = self._math(op, args, e)
        if e.dtype != "float32" and src == "float32":
            out = f"{self.ty(e.dtype, e)}({out})"
        return out

    _DIRECT = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "inverseSqrt",
               "fabs": "abs", "floor": "floor", "ceil": "ceil", "round": "round",
               "trunc": "trunc", "sin": "sin", "cos": "cos", "exp2": "exp2", "log2": "log2"}

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
        raise WebGPUBuildError(f"kernel {self.name}: the intrinsic {op!r} has no WGSL "
                               f"equivalent", e)


def _unit_base(index, v):
    """``index == base + v`` with ``base`` free of ``v``: ``base``; else None."""
    from tilecraft.tensorir.transform._common import linear_coeff
    r = linear_coeff(index, v)
    if r is None or r[0] != 1:
        return None
    return r[1]


def _vec4_shared(body, shared) -> set:
    """ids of the float32 shared buffers (size a multiple of 4) that some vectorized loop of 4
    reads at ``base + v``."""
    from tilecraft.tensorir.functor import post_order_visit
    cands = {id(b) for b in shared if b.dtype == "float32"}
    found = set()

    def visit(n):
        if isinstance(n, S.For) and n.kind == "vectorized" and E.as_int(n.extent) == 4 and \
                isinstance(n.body, S.BufferStore) and isinstance(n.body.value, E.BufferLoad):
            src = n.body.value
            if id(src.buffer) in cands and _unit_base(src.indices[0], n.loop_var) is not None:
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


def _touches_local(s) -> bool:
    found = False

    def visit(n):
        nonlocal found
        if isinstance(n, (E.BufferLoad, S.BufferStore)) and n.buffer.scope == "local":
            found = True

    from tilecraft.tensorir.functor import post_order_visit
    post_order_visit(s, visit)
    return found


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
        ext = E.as_int(s.extent)
        inner = _stmt_size(s.body)
        return inner * ext if (s.kind == "unrolled" and ext is not None) else inner + 1
    if isinstance(s, S.IfThenElse):
        return 1 + _stmt_size(s.then_case) + (_stmt_size(s.else_case) if s.else_case else 0)
    if isinstance(s, (S.LetStmt, S.AssertStmt, S.Allocate)):
        return 1 + _stmt_size(s.body)
    return 1


def _as_dtype(e, dtype):
    if isinstance(e, int):
        return E.IntImm(e, dtype)
    if e.dtype == dtype:
        return e
    if isinstance(e, E.IntImm):
        return E.IntImm(e.value, dtype)
    return E.Cast(dtype, e)


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
    return KernelEmitter(kernel, bindings, limits, supports_float16=supports_float16,
                         nonneg_scalars=nonneg_scalars).run()
