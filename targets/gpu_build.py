"""Building for GPU targets: lower, split host from device, and describe the host program as JSON.

``targets.build(func, "opencl")`` (and the WebGPU back end, if it likes) goes through
``split_module``: every PrimFunc is lowered for the GPU (``tensorir.transform.lower_device``:
``GPU_PASSES`` then ``split_host_device``, limits from the target) and its host program
(``HostDeviceSplit.host``) is written as plain JSON data, which
``targets.runtime.device_module`` interprets at call time without tensorir. The kernels go to
the back end's code generator.

Host program JSON (``"body"``)::

    ["seq", [stmt, ...]]
    ["let", name, expr, body]                    ["assert", cond, message, body]
    ["if", cond, then, else_or_null]             ["for", name, min, extent, body]
    ["alloc", buffer_index, body]                (a device temporary; "buffers"[index])
    ["launch", kernel, [buffer_index, ...], [scalar expr, ...], [grid x, y, z], [block x, y, z]]

Buffers are indices into the function's buffer table: its parameters' buffers first (in
parameter order), then the temporaries. Expressions: an int, ``["var", name]``, ``[op, a, b]``
(``add sub mul floordiv floormod div mod min max eq ne lt le gt ge and or``), ``["not", a]``,
``["select", c, t, f]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilecraft.tensorir import expr as E
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.stmt import Allocate, AssertStmt, Buffer, For, IfThenElse, LetStmt, SeqStmt
from tilecraft.tensorir.transform import lower_device, split_host_device
from tilecraft.tensorir.transform.device import HostDeviceSplit, LaunchKernel
from tilecraft.tensorir.transform._common import is_no_op

from .build_module import is_lowered
from .gpu_codegen import written_buffers
from .target import Target

_BINARY = {E.Add: "add", E.Sub: "sub", E.Mul: "mul", E.FloorDiv: "floordiv",
           E.FloorMod: "floormod", E.Div: "div", E.Mod: "mod", E.Min: "min", E.Max: "max",
           E.EQ: "eq", E.NE: "ne", E.LT: "lt", E.LE: "le", E.GT: "gt", E.GE: "ge",
           E.And: "and", E.Or: "or"}


class HostProgramError(E.TIRError, ValueError):
    """Host code that cannot be written as a host program (a float, a load)."""


@dataclass
class GPUFunction:
    """One function of a GPU module: its split and its host program."""
    name: str
    split: HostDeviceSplit
    program: dict


class _Names:
    def __init__(self):
        self.names: dict[E.Var, str] = {}
        self.used: set[str] = set()

    def __call__(self, v: E.Var) -> str:
        n = self.names.get(v)
        if n is None:
            n, k = v.name, 0
            while n in self.used:
                k += 1
                n = f"{v.name}_{k}"
            self.used.add(n)
            self.names[v] = n
        return n


def expr_json(e, names: _Names) -> Any:
    """A host integer expression as JSON."""
    if isinstance(e, bool):
        return int(e)
    if isinstance(e, int):
        return e
    if isinstance(e, E.IntImm):
        return int(e.value)
    if isinstance(e, E.Var):
        return ["var", names(e)]
    if isinstance(e, E.Cast):
        if not (e.dtype == "bool" or e.dtype.startswith("int") or e.dtype.startswith("uint")):
            raise HostProgramError(f"the host cannot evaluate the cast {e!r}", e)
        return expr_json(e.value, names)
    op = _BINARY.get(type(e))
    if op is not None:
        return [op, expr_json(e.a, names), expr_json(e.b, names)]
    if isinstance(e, E.Not):
        return ["not", expr_json(e.a, names)]
    if isinstance(e, E.Select):
        return ["select", expr_json(e.condition, names), expr_json(e.true_value, names),
                expr_json(e.false_value, names)]
    if isinstance(e, E.Call) and e.op == "if_then_else":
        return ["select", *(expr_json(a, names) for a in e.args)]
    raise HostProgramError(f"the host cannot evaluate {e!r}: only integer arithmetic of shape "
                           f"variables and scalar parameters", e)


def _shape_text(d) -> Any:
    if isinstance(d, E.IntImm):
        return int(d.value)
    return str(d)


def host_program(split: HostDeviceSplit) -> dict:
    """The JSON form of ``split.host`` plus the function's parameter metadata."""
    host = split.host
    attrs = host.attr_dict
    names = _Names()
    arg_buffers = list(attrs["arg_buffers"])
    flat_buffers = host.buffers
    # shape vars first: they are named as the caller sees them
    shape_vars = [names(v) for v in attrs.get("shape_vars", ())]
    buffers: list[Buffer] = list(flat_buffers)
    table: dict[Buffer, int] = {b: i for i, b in enumerate(buffers)}
    temps: list[dict] = []
    written: set[int] = set()
    kernels_meta = {k.name: k for k in split.kernels}

    def buffer_index(b: Buffer) -> int:
        if b not in table:
            raise HostProgramError(f"kernel argument {b.name} is neither a parameter nor a "
                                   f"temporary of the host program", b)
        return table[b]

    def stmt(s):
        if s is None or is_no_op(s):
            return ["seq", []]
        if isinstance(s, SeqStmt):
            return ["seq", [stmt(c) for c in s.seq]]
        if isinstance(s, LetStmt):
            return ["let", names(s.var), expr_json(s.value, names), stmt(s.body)]
        if isinstance(s, AssertStmt):
            return ["assert", expr_json(s.condition, names), s.message, stmt(s.body)]
        if isinstance(s, IfThenElse):
            return ["if", expr_json(s.condition, names), stmt(s.then_case),
                    None if s.else_case is None else stmt(s.else_case)]
        if isinstance(s, For):
            return ["for", names(s.loop_var), expr_json(s.min, names),
                    expr_json(s.extent, names), stmt(s.body)]
        if isinstance(s, Allocate):
            b = s.buffer
            table[b] = len(buffers)
            buffers.append(b)
            temps.append({"index": table[b], "name": b.name, "dtype": b.dtype,
                          "size": expr_json(b.shape[0], names)})
            return ["alloc", table[b], stmt(s.body)]
        if isinstance(s, LaunchKernel):
            k = kernels_meta[s.kernel]
            for b in s.buffers:
                if b in set(_stored(k)):
                    written.add(buffer_index(b))
            return ["launch", s.kernel, [buffer_index(b) for b in s.buffers],
                    [expr_json(x, names) for x in s.scalars],
                    [expr_json(g, names) for g in s.grid],
                    [int(b.value) for b in s.block]]
        raise HostProgramError(f"unexpected host statement {type(s).__name__}", s)

    body = stmt(host.body)
    params = []
    bi = 0
    for p in host.params:
        if p.dtype == "handle":
            orig = arg_buffers[bi]
            params.append({"name": orig.name, "kind": "buffer", "dtype": orig.dtype,
                           "shape": [_shape_text(d) for d in orig.shape],
                           "shape_json": [expr_json(d, names) for d in orig.shape],
                           "written": bi in written, "buffer_index": bi})
            bi += 1
        else:
            params.append({"name": names(p), "kind": "scalar", "dtype": p.dtype})
    kernels = {}
    for k in split.kernels:
        kernels[k.name] = {"block": list(k.block), "shared_bytes": k.shared_bytes,
                           "error_messages": list(k.error_messages),
                           "buffer_dtypes": [b.dtype for b in k.func.buffers]}
    return {"name": attrs.get("global_symbol", "main"), "params": params,
            "shape_vars": shape_vars, "temporaries": temps, "body": body, "kernels": kernels}


def _stored(kernel) -> list:
    return list(written_buffers(kernel.func.body))


def split_module(mod: IRModule, target: Target) -> list[GPUFunction]:
    """Lower and split every PrimFunc of ``mod`` for ``target``; non-PrimFuncs are skipped."""
    out = []
    for name, func in mod.functions.items():
        if not isinstance(func, PrimFunc):
            continue
        if "global_symbol" not in func.attr_dict or func.attr_dict["global_symbol"] != name:
            func = func.replace(attrs={**func.attr_dict, "global_symbol": name})
        if is_lowered(func):
            split = split_host_device(func, target)
        else:
            split = lower_device(func, target)
        out.append(GPUFunction(name, split, host_program(split)))
    if not out:
        raise ValueError("targets.build: the module has no PrimFunc to compile")
    return out


__all__ = ["GPUFunction", "HostProgramError", "expr_json", "host_program", "split_module"]
