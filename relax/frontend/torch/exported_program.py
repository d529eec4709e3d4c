"""``from_torch``: a ``torch.export.ExportedProgram`` to a Relax ``IRModule``.

The graph is walked once, in order. Each ``call_function`` node of an ATen operator goes to its
converter in ``ops.py`` with its arguments normalized by the operator's schema (names and
defaults), so a converter reads ``a["stride"]`` whatever the call spelled out. Values:

- a tensor node is a Relax expression (emitted, so it is a ``relax.Var``);
- a node of a symbolic int (``aten.sym_size``, ``operator.mul`` of sizes, ...) is the
  ``tensorir`` expression of its sympy value, translated over the program's shape symbols:
  shape arithmetic needs no converter of its own;
- an operator with several results is a Python list, indexed by ``operator.getitem``.

Every result is checked against the node's recorded value (``node.meta["val"]``): the rank must
agree, a different dtype is cast to torch's (so type promotion ends where torch ends).

Before anything is converted, every node is checked for a converter, and converters that refuse
an argument (``Unsupported``) are collected while the walk goes on, so ``UnsupportedError``
lists all the problems of the model at once.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from tilecraft import tensorir
from tilecraft.tensorir import expr as tir

from ... import op as rop
from ...block_builder import BlockBuilder
from ...expr import Expr, RelaxError, Tuple, TupleGetItem, Var, const
from ...struct_info import TensorStructInfo
from .. import common
from . import ops as _ops
from .ops import Unsupported

FRONTEND = "relax.frontend.from_torch"

# torch dtype name (``str(torch.float32)`` without "torch.") -> Relax dtype
DTYPES = {"float32": "float32", "float64": "float64", "float16": "float16", "int64": "int64",
          "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool"}

# torch marks "no upper bound" with int_oo or sys.maxsize - 1; bounds past this are ignored
_NO_BOUND = 1 << 62


def torch_dtype_name(dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).rsplit(".", 1)[-1]


def relax_dtype(dtype, where: str = "") -> str:
    """The Relax dtype of a torch dtype; ``Unsupported`` for one Relax has no kernels for."""
    name = torch_dtype_name(dtype)
    if name not in DTYPES:
        raise Unsupported(f"dtype {name}{where} is not supported (supported: "
                          f"{', '.join(DTYPES)})")
    return DTYPES[name]


class _Failed:
    """The value of a node that could not be converted (its consumers are skipped)."""


FAILED = _Failed()


class ExportedProgramImporter:
    """Translate one ``ExportedProgram``; use ``from_torch``."""

    def __init__(self, torch_module, ep, keep_params_in_input: bool,
                 use_range_upper_bounds: bool, func_name: str):
        self.torch = torch_module
        self.ep = ep
        self.keep_params_in_input = keep_params_in_input
        self.use_range_upper_bounds = use_range_upper_bounds
        self.func_name = func_name
        self.bb = BlockBuilder()
        self.env: dict = {}                    # fx node -> value
        self.sym_vars: dict[str, tir.Var] = {}  # sympy symbol name -> tensorir var
        self.upper_bounds: dict[str, int] = {}
        self.problems: list[str] = []
        self._const_cache: dict[int, Expr] = {}
        self.node = None                        # the node being converted (for messages)

    # -- symbols ------------------------------------------------------------------------------
    def _symbol_names(self) -> dict[str, str]:
        """sympy symbol name -> the ``torch.export.Dim`` name the user gave it (when known)."""
        names: dict[str, str] = {}
        env = None
        for node in self.ep.graph.nodes:
            val = node.meta.get("val") if node.op == "placeholder" else None
            if isinstance(val, self.torch.Tensor) and getattr(val, "fake_mode", None) is not None:
                env = val.fake_mode.shape_env
                if env is not None:
                    break
        if env is None:
            return names
        # private torch attributes: without them the symbols keep torch's names (s0, s17)
        debug = getattr(env, "source_name_to_debug_name", None) or {}
        for sym, sources in (getattr(env, "var_to_sources", None) or {}).items():
            for src in sources:
                try:
                    nm = debug.get(src.name)
                except Exception:  # pragma: no cover - a source kind without .name
                    nm = None
                if nm:
                    names[str(sym)] = str(nm)
                    break
        return names

    def _make_symbols(self, user_inputs) -> None:
        names = self._symbol_names()
        used = set()
        for node in user_inputs:
            val = node.meta.get("val")
            for d in getattr(val, "shape", ()):
                if isinstance(d, self.torch.SymInt):
                    for sym in d.node.expr.free_symbols:
                        key = str(sym)
                        if key in self.sym_vars:
                            continue
                        nm = names.get(key, key)
                        if nm in used:
                            nm = f"{nm}_{key}"
                        used.add(nm)
                        self.sym_vars[key] = tensorir.var(nm)
        if not self.use_range_upper_bounds:
            return
        for sym, vr in (self.ep.range_constraints or {}).items():
            v = self.sym_vars.get(str(sym))
            if v is None:
                continue
            try:
                upper = int(vr.upper)
            except (TypeError, ValueError, OverflowError, AttributeError):
                continue                       # int_oo (a Dim without max): unbounded
            if 0 <= upper < _NO_BOUND:
                self.upper_bounds[v.name] = upper

    def sym_to_prim(self, e) -> tir.PrimExpr:
        """A sympy expression of torch's shape symbols as an int64 ``tensorir`` expression."""
        import sympy
        if isinstance(e, (bool, sympy.logic.boolalg.BooleanAtom)):
            return tir.const(int(bool(e)), "int64")
        if isinstance(e, int):
            return tir.const(e, "int64")
        if e.is_Integer:
            return tir.const(int(e), "int64")
        if e.is_Symbol:
            v = self.sym_vars.get(str(e))
            if v is None:
                raise Unsupported(f"the symbol {e} is not a dim of an input (a data-dependent "
                                  f"size)")
            return v
        args = [self.sym_to_prim(a) for a in e.args] if not e.is_Rational else []
        kind = type(e).__name__
        if e.is_Add:
            out = args[0]
            for a in args[1:]:
                out = out + a
            return out
        if e.is_Mul:
            out = args[0]
            for a in args[1:]:
                out = out * a
            return out
        if e.is_Pow and e.args[1].is_Integer and int(e.args[1]) >= 0:
            out = tir.const(1, "int64")
            for _ in range(int(e.args[1])):
                out = out * args[0]
            return out
        if kind in ("FloorDiv", "CleanDiv"):
            return tir.floordiv(args[0], args[1])
        if kind in ("Mod", "PythonMod"):
            return tir.floormod(args[0], args[1])
        if kind == "CeilDiv":
            return tir.floordiv(args[0] + args[1] - 1, args[1])
        if kind in ("Max",):
            out = args[0]
            for a in args[1:]:
                out = tir.max_(out, a)
            return out
        if kind in ("Min",):
            out = args[0]
            for a in args[1:]:
                out = tir.min_(out, a)
            return out
        raise Unsupported(f"the symbolic size expression {e} ({kind}) is not supported")

    def _sym_value(self, val):
        """A SymInt / int / SymBool value as an int or a PrimExpr."""
        torch = self.torch
        if isinstance(val, (bool, int, float)):
            return val
        if isinstance(val, torch.SymInt):
            prim = self.sym_to_prim(val.node.expr)
            c = tir.as_int(prim)
            return c if c is not None else prim
        if isinstance(val, (torch.SymFloat, torch.SymBool)):
            raise Unsupported(f"a symbolic {type(val).__name__} ({val}) is not supported")
        raise Unsupported(f"the value {val!r} is not supported")

    # -- values -------------------------------------------------------------------------------
    def constant(self, tensor, name: str = "") -> Expr:
        """A torch tensor as a Relax constant (shared by identity)."""
        key = id(tensor)
        if key not in self._const_cache:
            self._const_cache[key] = const(self.to_numpy(tensor, name))
        return self._const_cache[key]

    def to_numpy(self, tensor, name: str = "") -> np.ndarray:
        relax_dtype(tensor.dtype, f" of {name}" if name else "")
        return np.ascontiguousarray(tensor.detach().cpu().resolve_conj().resolve_neg().numpy())

    def emit(self, e: Expr, name_hint: str | None = None) -> Expr:
        """Bind ``e`` (a Relax call) to a new variable; constants and vars are kept as they are."""
        if isinstance(e, (Var,)) or not isinstance(e, Expr):
            return e
        if type(e).__name__ == "Constant":
            return e
        hint = name_hint or (self.node.name if self.node is not None else "lv")
        return self.bb.emit(e, name_hint=hint)

    def _convert_arg(self, a):
        fx = self.torch.fx
        if isinstance(a, fx.Node):
            v = self.env.get(a, FAILED)
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(self._convert_arg(x) for x in a)
        if isinstance(a, dict):
            return {k: self._convert_arg(x) for k, x in a.items()}
        return a

    @staticmethod
    def _has_failed(v) -> bool:
        if v is FAILED:
            return True
        if isinstance(v, (list, tuple)):
            return any(ExportedProgramImporter._has_failed(x) for x in v)
        if isinstance(v, dict):
            return any(ExportedProgramImporter._has_failed(x) for x in v.values())
        return False

    def _normalize(self, node) -> dict:
        """The call's arguments by schema name, defaults filled in, nodes converted."""
        schema = node.target._schema
        args, kwargs = node.args, node.kwargs
        out = {}
        for i, arg in enumerate(schema.arguments):
            if i < len(args) and not arg.kwarg_only:
                out[arg.name] = self._convert_arg(args[i])
            elif arg.name in kwargs:
                out[arg.name] = self._convert_arg(kwargs[arg.name])
            elif arg.has_default_value():
                out[arg.name] = arg.default_value
            else:
                out[arg.name] = None
        return out

    def out_dtype(self) -> str:
        """The Relax dtype of the current node's (first) result, as torch recorded it."""
        val = self.node.meta.get("val")
        if isinstance(val, (list, tuple)):
            val = val[0]
        if not isinstance(val, self.torch.Tensor):
            raise Unsupported(f"the result of {self.node.name} is not a tensor")
        return relax_dtype(val.dtype, f" of {self.node.name}")

    def promote(self, *operands) -> str:
        """torch's result dtype for ``operands`` (tensors, Python numbers, PrimExprs)."""
        torch = self.torch
        vals = []
        for x in operands:
            if isinstance(x, Expr):
                si = x.struct_info
                shape = () if si.ndim == 0 else (1,)
                vals.append(torch.empty(shape, dtype=getattr(torch, si.dtype)))
            elif isinstance(x, tir.PrimExpr):
                vals.append(1)
            else:
                vals.append(x)
        out = vals[0]
        for v in vals[1:]:
            dt = torch.result_type(out, v)
            out = torch.empty((1,), dtype=dt)
        if not isinstance(out, torch.Tensor):
            out = torch.tensor(out)
        return relax_dtype(out.dtype)

    # -- the walk -----------------------------------------------------------------------------
    def _op_key(self, node) -> str | None:
        t = node.target
        if hasattr(t, "_schema") and hasattr(t, "_overloadpacket"):
            ns, _, name = t._schema.name.partition("::")
            return name if ns == "aten" else f"{ns}::{name}"
        mod = getattr(t, "__module__", "") or ""
        return f"{mod.replace('_operator', 'operator')}.{getattr(t, '__name__', str(t))}"

    def _is_sym_scalar(self, node) -> bool:
        val = node.meta.get("val")
        torch = self.torch
        return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)) \
            and not isinstance(val, torch.Tensor)

    def _precheck(self, nodes) -> None:
        missing: dict[str, list[str]] = {}
        for node in nodes:
            if node.op == "get_attr":
                missing.setdefault(f"get_attr {node.target}", []).append(node.name)
            if node.op != "call_function":
                continue
            key = self._op_key(node)
            if self._is_sym_scalar(node) and key not in _ops.CONVERTERS:
                continue
            if key not in _ops.CONVERTERS:
                missing.setdefault(key, []).append(node.name)
        for key, names in missing.items():
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                           else "")
            self.problems.append(f"operator {key} is not supported (node{'s' if len(names) > 1 else ''} "
                                 f"{shown})")

    def run(self):
        torch = self.torch
        ep = self.ep
        sig = ep.graph_signature
        graph = ep.graph
        nodes = list(graph.nodes)
        specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
        kinds = torch.export.graph_signature.InputKind
        user_inputs, param_nodes = [], []
        for node in nodes:
            if node.op != "placeholder":
                continue
            spec = specs.get(node.name)
            kind = spec.kind if spec is not None else kinds.USER_INPUT
            if kind == kinds.USER_INPUT:
                user_inputs.append(node)
            else:
                param_nodes.append((node, spec))
        self._precheck(nodes)
        self._make_symbols(user_inputs)

        params = []
        for node in user_inputs:
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                self.problems.append(f"input {node.name}: a non-tensor input ({type(val).__name__})"
                                     f" is not supported")
                continue
            try:
                shape = [self._sym_value(d) for d in val.shape]
                dtype = relax_dtype(val.dtype, f" of input {node.name}")
            except Unsupported as err:
                self.problems.append(f"input {node.name}: {err}")
                continue
            v = Var(node.name, TensorStructInfo(shape, dtype))
            self.env[node] = v
            params.append(v)

        param_values = []
        for node, spec in param_nodes:
            target = spec.target
            if spec.kind in (kinds.PARAMETER, kinds.BUFFER):
                tensor = ep.state_dict.get(target)
                if tensor is None:
                    tensor = ep.constants.get(target)
            elif spec.kind == kinds.CONSTANT_TENSOR:
                tensor = ep.constants.get(target)
            else:
                self.problems.append(f"input {node.name}: a {spec.kind.name} input is not "
                                     f"supported")
                continue
            if tensor is None or not isinstance(tensor, torch.Tensor):
                self.problems.append(f"input {node.name}: no tensor for {target}")
                continue
            try:
                if self.keep_params_in_input and spec.kind != kinds.CONSTANT_TENSOR:
                    arr = self.to_numpy(tensor, target)
                    v = Var(node.name, TensorStructInfo(arr.shape, relax_dtype(tensor.dtype)))
                    self.env[node] = v
                    param_values.append((v, arr))
                else:
                    self.env[node] = self.constant(tensor, target)
            except Unsupported as err:
                self.problems.append(f"input {node.name} ({target}): {err}")

        all_params = params + [v for v, _ in param_values]
        attrs = {}
        if self.upper_bounds:
            attrs["tir_var_upper_bound"] = dict(self.upper_bounds)
        if param_values:
            attrs["num_input"] = len(params)
            # relax Constants, as from_onnx: relax.frontend.detach_params takes them out
            attrs["params"] = [const(arr) for _, arr in param_values]
        bb = self.bb
        with bb.function(self.func_name, all_params, attrs=attrs):
            with bb.dataflow():
                outputs = self._walk(nodes)
                if self.problems:
                    raise common.UnsupportedError(FRONTEND, self.problems)
                out = outputs[0] if len(outputs) == 1 else Tuple(outputs)
                gv = bb.emit_output(out)
            bb.emit_func_output(gv)
        return bb.get()

    def _walk(self, nodes) -> list:
        torch = self.torch
        outputs = []
        kinds = torch.export.graph_signature.OutputKind
        out_specs = list(self.ep.graph_signature.output_specs)
        for node in nodes:
            self.node = node
            if node.op == "placeholder":
                continue
            if node.op == "output":
                results = node.args[0]
                results = list(results) if isinstance(results, (list, tuple)) else [results]
                for i, r in enumerate(results):
                    if i < len(out_specs) and out_specs[i].kind != kinds.USER_OUTPUT:
                        continue               # buffer mutations (training batch norm) are dropped
                    v = self._convert_arg(r)
                    if v is FAILED:
                        continue
                    if not isinstance(v, Expr):
                        self.problems.append(f"output {i}: a non-tensor output ({v!r}) is not "
                                             f"supported")
                        continue
                    outputs.append(v)
                continue
            if node.op != "call_function":
                continue
            self.env[node] = self._convert_node(node)
        return outputs

    def _convert_node(self, node):
        key = self._op_key(node)
        fn = _ops.CONVERTERS.get(key)
        if fn is None and self._is_sym_scalar(node):
            try:
                return self._sym_value(node.meta["val"])
            except Unsupported as err:
                self.problems.append(f"node {node.name} ({key}): {err}")
                return FAILED
        if fn is None:
            return FAILED                      # reported by _precheck
        try:
            if hasattr(node.target, "_schema"):
                a = self._normalize(node)
            else:
                a = {"args": self._convert_arg(node.args), "kwargs": self._convert_arg(node.kwargs)}
            if self._has_failed(a):
                return FAILED
            value = fn(self, a)
            return self._finish(node, value)
        except Unsupported as err:
            if node.users:                     # a result nobody uses does not matter
                self.problems.append(f"node {node.name} ({key}): {err}")
            return FAILED
        except RelaxError as err:
            raise RelaxError(f"{FRONTEND}: node {node.name} ({key}): {err}") from err

    def _finish(self, node, value):
        """Emit the result and check it against torch's recorded value."""
        val = node.meta.get("val")
        torch = self.torch
        if isinstance(value, Expr):
            value = self.emit(value)
            if isinstance(val, torch.Tensor):
                value = self._conform(node, value, val)
            return value
        if isinstance(value, (list, tuple)) and isinstance(val, (list, tuple)):
            out = []
            for v, t in zip(value, val):
                if isinstance(v, Expr):
                    v = self.emit(v)
                    if isinstance(t, torch.Tensor):
                        v = self._conform(node, v, t)
                out.append(v)
            return out
        return value

    def _conform(self, node, value: Expr, val) -> Expr:
        si = value.struct_info
        if not isinstance(si, TensorStructInfo):
            return value
        if si.ndim >= 0 and si.ndim != val.dim():
            raise RelaxError(f"{FRONTEND}: node {node.name} ({self._op_key(node)}): the "
                             f"converted result has rank {si.ndim}, torch's has {val.dim()} "
                             f"(shape {tuple(val.shape)})")
        want = relax_dtype(val.dtype, f" of {node.name}")
        if si.dtype != want:
            value = self.emit(rop.astype(value, want))
        return value


def from_torch(exported_program, *, keep_params_in_input: bool = False,
               use_range_upper_bounds: bool = True, func_name: str = "main"):
    """Import a ``torch.export.ExportedProgram`` as a Relax ``IRModule``.

    Parameters
    ----------
    exported_program : torch.export.ExportedProgram
        ``torch.export.export(model.eval(), args, dynamic_shapes=...)``, as exported or after
        ``run_decompositions()`` (core ATen).
    keep_params_in_input : bool
        False (default): parameters and buffers become constants in the module. True: they
        become parameters of ``main`` after the model's inputs, in the program's order; the
        function attribute ``params`` holds their values (Relax constants, as ``from_onnx``;
        ``relax.frontend.detach_params(mod)`` takes them out as numpy arrays) and
        ``num_input`` the number of real inputs.
    use_range_upper_bounds : bool
        Record each dynamic dim's ``max`` (from ``torch.export.Dim(..., max=...)``) as the
        function's ``tir_var_upper_bound``, so ``relax.build`` plans memory statically at it.
    func_name : str
        The name of the Relax function.

    Returns
    -------
    IRModule
        ``main`` takes the program's user inputs (named as the model's ``forward`` arguments);
        dynamic dims are ``tensorir`` variables named as their ``Dim``.

    Raises
    ------
    relax.frontend.UnsupportedError
        Listing every ATen operator of the program without a converter and every argument a
        converter cannot express, at once.

    Examples
    --------
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    >>> batch = torch.export.Dim("batch", max=64)
    >>> ep = torch.export.export(model, (torch.randn(2, 16),), dynamic_shapes=({0: batch},))
    >>> mod = from_torch(ep)
    >>> mod["main"].params[0].struct_info
    Tensor((batch, 16), 'float32')
    """
    try:
        import torch
        import torch.export  # noqa: F401
    except ImportError as err:   # pragma: no cover - depends on the environment
        raise ImportError(f"{FRONTEND} needs PyTorch: pip install 'tilecraft[torch]' "
                          f"(torch==2.13.0): {err}") from None
    if not isinstance(exported_program, torch.export.ExportedProgram):
        raise TypeError(f"{FRONTEND} takes a torch.export.ExportedProgram (from "
                        f"torch.export.export(model, args)), got "
                        f"{type(exported_program).__name__}")
    return ExportedProgramImporter(torch, exported_program, keep_params_in_input,
                                   use_range_upper_bounds, func_name).run()
