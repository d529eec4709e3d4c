"""``targets.build(func, "webgpu")``: device lowering, WGSL for every kernel, and the host program.

Each PrimFunc is lowered for the device (``tensorir.transform.lower_device``: host program plus
kernels, checked against the target's limits), each kernel becomes one WGSL compute shader
(``wgsl.emit_kernel``), and the host program becomes a small JSON tree that the runtime walks at
each call (``module``). The result is plain JSON data — what ``export_library`` writes and a
browser can load (``docs/gpu.md``, "Running the WGSL in a browser").

Nothing here needs ``wgpu``: building works on a machine without a GPU.
"""
from __future__ import annotations

from typing import Any

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import expr as E
from tilecraft.tensorir import stmt as S
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.transform import DeviceLimitError, LaunchKernel, lower_device

from ..gpu_codegen import nonneg_scalars, written_buffers
from . import exprjson, storage
from .module import FORMAT, FORMAT_VERSION, WebGPUModule
from .runtime import note_target, target_features, target_limits
from .wgsl import Binding, WebGPUBuildError, WebGPULimitError, emit_kernel


class _VarNames:
    """Unique names for the host program's variables (two Vars may share a name)."""

    def __init__(self):
        self._by_id: dict[int, str] = {}
        self._used: set[str] = set()
        self._keep: list = []

    def __call__(self, v: E.Var) -> str:
        name = self._by_id.get(id(v))
        if name is None:
            name, k = v.name, 1
            while name in self._used:
                name, k = f"{v.name}#{k}", k + 1
            self._used.add(name)
            self._by_id[id(v)] = name
            self._keep.append(v)
        return name


def _to_json_named(e, names):
    if isinstance(e, E.Var):
        return ["var", names(e)]
    if isinstance(e, (E.IntImm,)) or isinstance(e, int):
        return exprjson.to_json(e)
    if isinstance(e, E.FloatImm):
        return float(e.value)
    if isinstance(e, E.Cast):
        return _to_json_named(e.value, names)
    op = exprjson._BINARY.get(type(e))
    if op is not None:
        return [op, _to_json_named(e.a, names), _to_json_named(e.b, names)]
    if isinstance(e, E.Not):
        return ["not", _to_json_named(e.a, names)]
    if isinstance(e, E.Select):
        return ["select", _to_json_named(e.condition, names), _to_json_named(e.true_value, names),
                _to_json_named(e.false_value, names)]
    if isinstance(e, E.Call) and e.op == "if_then_else":
        return ["select", *(_to_json_named(a, names) for a in e.args)]
    raise exprjson.ExprJSONError(f"cannot evaluate {e!r} on the host")


def _kernel_limits(target) -> dict:
    """The limits split_host_device checks. The grid limit is left out: the WGSL generator
    linearizes any grid over 65535 workgroups per dimension."""
    # Target.limits raises the WebGPU names of the thread and workgroup-storage limits where
    # the target declares more (as the device request does, runtime.target_limits)
    lim = dict(target.limits)
    lim.pop("max_compute_workgroups_per_dimension", None)
    lim["kind"] = "webgpu"
    return lim


def _plan_bindings(kernel, written: set, max_buffers: int) -> list[Binding]:
    """One binding per buffer, or — when the kernel needs more than ``max_buffers`` — the
    fewest packable (32-bit) buffers packed into one, read-only ones first."""
    bufs = list(kernel.buffer_params)
    if len(bufs) <= max_buffers:
        return [Binding(i, [b], "read_write" if b in written else "read")
                for i, b in enumerate(bufs)]
    need = len(bufs) - max_buffers + 1
    packable = [b for b in bufs if storage.storage_dtype(b.dtype) != "float16"]
    order = [b for b in reversed(packable) if b not in written] + \
        [b for b in reversed(packable) if b in written]
    if len(order) < need:
        raise WebGPULimitError(
            f"kernel {kernel.name} needs {len(bufs)} storage buffers, over the target's limit of "
            f"{max_buffers} (max_storage_buffers_per_shader_stage), and too few of them have "
            f"32-bit elements to pack into one binding", kernel.func)
    packed = set(order[:need])
    out, k = [], 0
    for b in bufs:
        if b not in packed:
            out.append(Binding(k, [b], "read_write" if b in written else "read"))
            k += 1
    members = [b for b in bufs if b in packed]
    out.append(Binding(k, members, "read_write" if any(b in written for b in members)
                       else "read", packed=True))
    return out


class _HostProgram:
    """The host part of one function as JSON, and its kernels' records."""

    def __init__(self, func: PrimFunc, split, target, names: _VarNames):
        self.func = func
        self.target = target
        self.names = names
        self.refs: dict[int, str] = {}
        self.keep = []
        for i, (p, buf) in enumerate(func.buffer_map):
            self._ref(buf, f"p{func.params.index(p)}")
        self.kernels = {k.name: k for k in split.kernels}
        self.kernel_index = {k.name: i for i, k in enumerate(split.kernels)}
        self.records: list[dict] = [None] * len(split.kernels)
        self.ntemp = 0
        self.host_vars = set(func.scalar_params) | set(func.attr_dict.get("shape_vars", ()))

    def _ref(self, buf, ref):
        self.refs[id(buf)] = ref
        self.keep.append(buf)

    def ref_of(self, buf) -> str:
        ref = self.refs.get(id(buf))
        if ref is None:
            raise WebGPUBuildError(f"{self.func.attr_dict.get('global_symbol')}: buffer "
                                   f"{buf.name} is used by a kernel but is neither a parameter "
                                   f"nor a device temporary", buf)
        return ref

    def j(self, e):
        return _to_json_named(e, self.names)

    def stmt(self, s) -> Any:
        if isinstance(s, S.SeqStmt):
            return ["seq", [self.stmt(x) for x in s.seq]]
        if isinstance(s, S.LetStmt):
            return ["let", self.names(s.var), self.j(s.value), self.stmt(s.body)]
        if isinstance(s, S.AssertStmt):
            return ["assert", self.j(s.condition), s.message, self.stmt(s.body)]
        if isinstance(s, S.IfThenElse):
            return ["if", self.j(s.condition), self.stmt(s.then_case),
                    None if s.else_case is None else self.stmt(s.else_case)]
        if isinstance(s, S.For):
            return ["for", self.names(s.loop_var), self.j(s.min), self.j(s.extent),
                    self.stmt(s.body)]
        if isinstance(s, S.Allocate):
            ref = f"t{self.ntemp}"
            self.ntemp += 1
            self._ref(s.buffer, ref)
            size = s.buffer.shape[0]
            for d in s.buffer.shape[1:]:
                size = size * d
            return ["alloc", ref, s.buffer.dtype, self.j(size), self.stmt(s.body)]
        if isinstance(s, LaunchKernel):
            k = self.kernel_index[s.kernel]
            self.records[k] = self.kernel_record(self.kernels[s.kernel], k)
            return ["launch", k]
        if isinstance(s, S.Evaluate) and isinstance(s.value, E.IntImm):
            return ["nop"]
        raise WebGPUBuildError(f"unexpected host statement {type(s).__name__}", s)

    def kernel_record(self, kernel, k: int) -> dict:
        written = written_buffers(kernel.func.body)
        max_buffers = self.target.max_storage_buffers or 8
        bindings = _plan_bindings(kernel, written, max_buffers)
        err_buf = None
        if kernel.error_messages:
            err_buf = kernel.buffer_params[-1]
            self._ref(err_buf, f"e{k}")
        src = emit_kernel(kernel, bindings, _kernel_limits(self.target),
                          supports_float16=self.target.supports_float16,
                          nonneg_scalars=nonneg_scalars(kernel, self.func))
        # the uniform's first fields are the scalar parameters, in order: re-express their
        # values with the host program's unique names
        uniform = [dict(u) for u in src.uniform]
        for u, h in zip(uniform, kernel.host_scalars):
            u["value"] = self.j(h)
        for u in uniform:
            if u["field"].startswith("tc_grid_"):
                u["value"] = self.j(kernel.grid["xyz".index(u["field"][-1])])
        return {
            "name": kernel.name,
            "wgsl": src.wgsl,
            "workgroup_size": list(src.workgroup_size),
            "grid": [self.j(g) for g in kernel.grid],
            "linear_grid": src.linear_grid,
            "bindings": [{"binding": b.binding, "access": b.access, "packed": b.packed,
                          "buffers": [self.ref_of(x) for x in b.buffers],
                          "dtypes": [x.dtype for x in b.buffers]} for b in src.bindings],
            "uniform": [{"field": u["field"], "type": u["type"], "value": u["value"]}
                        for u in uniform],
            "uniform_binding": src.uniform_binding,
            "shared_bytes": src.shared_bytes,
            "error_messages": list(kernel.error_messages),
            "error_buffer": f"e{k}" if err_buf is not None else None,
        }


def _param_meta(func: PrimFunc, names: _VarNames, written: set) -> list[dict]:
    arg_buffers = list(func.attr_dict.get("arg_buffers", func.buffers))
    flat = dict(func.buffer_map)
    out, bi = [], 0
    for p in func.params:
        if p.dtype == "handle":
            buf = arg_buffers[bi]
            bi += 1
            out.append({"name": buf.name, "kind": "buffer", "dtype": buf.dtype,
                        "shape": [_to_json_named(s, names) for s in buf.shape],
                        "written": flat[p] in written})
        else:
            out.append({"name": names(p), "kind": "scalar", "dtype": p.dtype})
    return out


def compile_function(name: str, func: PrimFunc, target) -> dict:
    """The JSON record of one function: parameters, host program, kernels."""
    try:
        split = lower_device(func, _kernel_limits(target))
    except DeviceLimitError as err:
        raise WebGPULimitError(f"{name}: {err}", getattr(err, "node", None)) from None
    names = _VarNames()
    host_func = split.host
    written = set()   # outputs: the buffers some kernel stores to
    for k in split.kernels:
        written |= written_buffers(k.func.body)
    params = _param_meta(host_func, names, written)
    for p in params:
        if p["kind"] == "buffer":
            storage.storage_dtype(p["dtype"])  # refuses float64 at build time
            if all(isinstance(d, int) for d in p["shape"]):
                size = 1
                for d in p["shape"]:
                    size *= d
                if size > 2 ** 31 - 1:
                    raise WebGPULimitError(
                        f"{name}: argument {p['name']} has {size} elements; WebGPU kernels "
                        f"index with 32-bit integers (fewer than 2**31 elements)", func)
    prog = _HostProgram(host_func, split, target, names)
    host = prog.stmt(host_func.body)
    shape_vars = [names(v) for v in host_func.attr_dict.get("shape_vars", ())]
    # every shape var must be bound from a dimension that is exactly it, or be a scalar
    scalars = {p["name"] for p in params if p["kind"] == "scalar"}
    for v in shape_vars:
        if v in scalars:
            continue
        if not any(p["kind"] == "buffer" and ["var", v] in p["shape"] for p in params):
            raise WebGPUBuildError(f"{name}: the shape variable {v} is not a dimension of any "
                                   f"argument, so a call cannot bind it; pass it as a scalar "
                                   f"parameter", func)
    return {"name": name, "params": params, "shape_vars": shape_vars, "host": host,
            "kernels": prog.records}


def build_module(mod: IRModule, target) -> "Any":
    """Build every PrimFunc of ``mod`` for a WebGPU ``target``; returns a ``WebGPUModule``.

    Examples
    --------
    >>> mod = targets.build(sch.mod, "webgpu")          # doctest: +SKIP
    >>> print(mod.get_source())                          # doctest: +SKIP
    """
    if target.kind != "webgpu":
        raise WebGPUBuildError(f"the WebGPU back end builds for webgpu targets, not {target}")
    functions = []
    for name, func in mod.functions.items():
        if not isinstance(func, PrimFunc):
            continue
        symbol = func.attr_dict.get("global_symbol", name)
        functions.append(compile_function(symbol, func, target))
    if not functions:
        raise ValueError("targets.build: the module has no PrimFunc to build")
    note_target(target)
    meta = {"format": FORMAT, "version": FORMAT_VERSION, "target": str(target),
            "target_config": target.export(),
            "required_limits": _required(target), "required_features": _features(target),
            # native wgpu only: create the shader modules without naga's run-time checks
            "trusted_shaders": target.trusted_shaders,
            "functions": functions}
    return WebGPUModule(meta)


def _required(target) -> dict:
    return target_limits(target)


def _features(target) -> list:
    return sorted(target_features(target))
