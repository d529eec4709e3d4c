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

PyTorch's memory semantics (in-place operators, views that share memory with their input) are
turned into pure values as the walk goes (``aliasing.py``): a write through a view scatters the
new values into the base tensor, and later reads of any view of it see them.

Shapes are reconciled with torch's too: torch's recorded shapes are exact under its guards, so
where a converted shape differs from torch's and is not provably the same (``min(seq, 128)``
where torch knows ``seq <= 64`` and recorded ``seq``), the importer proves them equal from the
facts it has (the ranges of the ``Dim`` s, torch's run-time assertions), or checks at run time
what makes them equal, and continues with torch's shape (``match_cast``). The module is then
consistent without any fact (``relax.build`` re-infers every shape as it is), and the function
checks the facts first when it runs (``frontend.shape_facts``).

Before anything is converted, every node is checked for a converter, and converters that refuse
an argument (``Unsupported``) are collected while the walk goes on, so ``UnsupportedError``
lists all the problems of the model at once, each with the line of the model's Python source
torch recorded for the node.
"""
from __future__ import annotations

import os
import re

import numpy as np

from tilecraft import tensorir
from tilecraft.tensorir import arith
from tilecraft.optional import import_optional
from tilecraft.tensorir import expr as tir
from tilecraft.tensorir.structural import structural_equal

from ... import op as rop
from ...block_builder import BlockBuilder
from ...expr import Expr, RelaxError, Tuple, Var, const
from ...struct_info import TensorStructInfo
from .. import common
from ..shape_facts import ShapeFactError, ShapeFacts
from . import aliasing
from . import ops as _ops
from .aliasing import Alias, ViewStep
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

_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def source_line(node) -> str:
    """Where the model's Python source made ``node``: ``modeling_bert.py:123: x = a + b``, from
    the stack trace torch recorded (its last frame); empty when torch recorded none."""
    trace = node.meta.get("stack_trace") or ""
    lines = trace.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _FILE_LINE.search(lines[i])
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            where = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            return f"{where}: {code}" if code else where
    return ""


def at_source(node) -> str:
    """``, at model.py:12: y = x + 1`` (where ``node`` comes from), or nothing."""
    src = source_line(node)
    return f", at {src}" if src else ""


def describe_node(node) -> str:
    """``node add_1, at model.py:12: y = x + 1``."""
    return f"node {node.name}{at_source(node)}"


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
        self.aliases: dict = {}                # fx node -> Alias (a list for several results)
        self.sym_vars: dict[str, tir.Var] = {}  # sympy symbol name -> tensorir var
        self.upper_bounds: dict[str, int] = {}
        self.lower_bounds: dict[str, int] = {}
        self.problems: list[str] = []
        self.facts = ShapeFacts()
        # proves what holds without the facts: a shape it proves equal to torch's needs no
        # match_cast (relax.build, which knows no facts, proves it too)
        self.plain = arith.Analyzer()
        self._const_cache: dict[int, Expr] = {}
        self.node = None                        # the node being converted (for messages)
        self.op_name = ""                       # its ATen operator (``add`` for ``add_``)

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
        origin: dict[str, str] = {}
        for node in user_inputs:
            val = node.meta.get("val")
            for i, d in enumerate(getattr(val, "shape", ())):
                if isinstance(d, self.torch.SymInt):
                    expr = d.node.expr
                    if expr.is_Symbol:          # where the dim is the symbol itself
                        origin.setdefault(str(expr), f"{node.name}.shape[{i}]")
                    for sym in expr.free_symbols:
                        key = str(sym)
                        if key in self.sym_vars:
                            continue
                        nm = names.get(key, key)
                        if nm in used:
                            nm = f"{nm}_{key}"
                        used.add(nm)
                        self.sym_vars[key] = tensorir.var(nm)
        for key, v in self.sym_vars.items():
            self.facts.assume(v >= 0)          # a size
        for sym, vr in (self.ep.range_constraints or {}).items():
            v = self.sym_vars.get(str(sym))
            if v is None:
                continue
            lower = _finite(vr.lower)
            upper = _finite(vr.upper)
            self._range_check(v, lower, upper, origin.get(str(sym), ""))

    def _range_check(self, v: tir.Var, lower, upper, origin: str) -> None:
        """The range torch exported the dim for: a fact, checked when the function runs (torch's
        exported program checks it too), and the function's bounds for memory planning."""
        lower = lower if lower is not None and lower > 0 else None
        if upper is not None and upper >= _NO_BOUND:
            upper = None
        if lower is None and upper is None:
            return
        if upper is not None and self.use_range_upper_bounds:
            self.upper_bounds[v.name] = upper
        if lower is not None:
            self.lower_bounds[v.name] = lower
        shown = f"[{lower if lower is not None else 0}, {upper if upper is not None else 'inf'}]"
        dim = f"torch.export.Dim('{v.name}'" + (f", min={lower}" if lower is not None else "") + \
            (f", max={upper}" if upper is not None else "") + ")"
        fmt = (f"{origin + ' = ' if origin else ''}{v.name} = {{}} is outside the range "
               f"{shown} the model was exported for ({dim})")
        cond = None
        if lower is not None:
            cond = v >= lower
        if upper is not None:
            cond = v <= upper if cond is None else tir.And(cond, v <= upper)
        self.facts.require(cond, fmt, [v])

    def require(self, cond) -> None:
        """Check ``cond`` (a bool expression of the dims) when the function runs, unless it is
        proved; the message names the current node and its source line."""
        try:
            self.facts.require_condition(cond, describe_node(self.node))
        except ShapeFactError as err:
            raise Unsupported(str(err)) from None

    def sym_to_prim(self, e) -> tir.PrimExpr:
        """A sympy expression of torch's shape symbols as an int64 (or bool) ``tensorir``
        expression."""
        import sympy
        if isinstance(e, (bool, sympy.logic.boolalg.BooleanAtom)):
            return tir.const(bool(e), "bool")
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
        compare = {"Equality": tir.EQ, "Unequality": tir.NE, "StrictLessThan": tir.LT,
                   "LessThan": tir.LE, "StrictGreaterThan": tir.GT, "GreaterThan": tir.GE}
        if kind in compare:
            return compare[kind](args[0], args[1])
        if kind in ("And", "Or"):
            out = args[0]
            for a in args[1:]:
                out = (tir.And if kind == "And" else tir.Or)(out, a)
            return out
        if kind == "Not":
            return tir.Not(args[0])
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
        """A SymInt / SymBool / int / bool value as a Python value or a PrimExpr."""
        torch = self.torch
        if isinstance(val, (bool, int, float)):
            return val
        if isinstance(val, (torch.SymInt, torch.SymBool)):
            prim = self.sym_to_prim(val.node.expr)
            c = tir.as_int(prim)
            if c is not None:
                return bool(c) if isinstance(val, torch.SymBool) else c
            return prim
        if isinstance(val, torch.SymFloat):
            raise Unsupported(f"a symbolic float ({val}) is not supported")
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
        # np.array, not np.ascontiguousarray: that makes a 0-d tensor 1-d
        return np.array(tensor.detach().cpu().resolve_conj().resolve_neg().numpy(), order="C")

    def emit(self, e: Expr, name_hint: str | None = None) -> Expr:
        """Bind ``e`` (a Relax call) to a new variable; constants and vars are kept as they are."""
        if isinstance(e, (Var,)) or not isinstance(e, Expr):
            return e
        if type(e).__name__ == "Constant":
            return e
        hint = name_hint or (self.node.name if self.node is not None else "lv")
        return self.bb.emit(e, name_hint=hint)

    def read(self, node):
        """The value of ``node`` now: a view of memory written since it was computed is
        computed again from the memory's current value."""
        alias = self.aliases.get(node)
        if alias is None:
            return self.env.get(node, FAILED)
        if isinstance(alias, list):
            vals = self.env.get(node, FAILED)
            if vals is FAILED:
                return FAILED
            return [self._read_alias(al) if al is not None else v
                    for al, v in zip(alias, vals)]
        return self._read_alias(alias)

    def _read_alias(self, alias: Alias) -> Expr:
        if alias.version != alias.storage.version:
            value = alias.storage.value
            for step in alias.steps:
                value = self._apply_step(step, value)
            alias.value, alias.version = value, alias.storage.version
        return alias.value

    def _apply_step(self, step: ViewStep, parent: Expr) -> Expr:
        """The view ``step`` of ``parent``, by the view operator's converter."""
        saved = self.node, self.op_name
        self.node, self.op_name = step.node, step.op
        try:
            a = dict(step.args)
            a["self"] = parent
            value = self._finish(step.node, _ops.CONVERTERS[step.op](self, a))
        finally:
            self.node, self.op_name = saved
        return value[step.index] if step.index is not None else value

    def _write(self, alias: Alias, value: Expr) -> None:
        """Write ``value`` into the memory ``alias`` views: scatter it into each parent of the
        chain, innermost first."""
        parents = [alias.storage.value]
        for step in alias.steps[:-1]:
            parents.append(self._apply_step(step, parents[-1]))
        for step, parent in zip(reversed(alias.steps), reversed(parents)):
            saved = self.node
            self.node = step.node
            try:
                value = aliasing.scatter_step(self, step, parent, value)
            finally:
                self.node = saved
        alias.storage.value = value
        alias.storage.version += 1

    def _convert_arg(self, a):
        fx = self.torch.fx
        if isinstance(a, fx.Node):
            return self.read(a)
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

    def _converter_key(self, node) -> str | None:
        """The converter of ``node``: its operator's, the functional one's for an in-place
        operator (``add`` for ``add_``)."""
        key = self._op_key(node)
        if key in _ops.CONVERTERS:
            return key
        if aliasing.is_inplace(node):
            return aliasing.functional_name(key)
        return key

    def _is_sym_scalar(self, node) -> bool:
        val = node.meta.get("val")
        torch = self.torch
        return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)) \
            and not isinstance(val, torch.Tensor)

    def _precheck(self, nodes) -> None:
        missing: dict[str, list] = {}
        for node in nodes:
            if node.op == "get_attr":
                missing.setdefault(f"get_attr {node.target}", []).append(node)
            if node.op != "call_function":
                continue
            key = self._converter_key(node)
            if self._is_sym_scalar(node) and key not in _ops.CONVERTERS:
                continue
            if key not in _ops.CONVERTERS:
                missing.setdefault(self._op_key(node), []).append(node)
        for key, nodes_ in missing.items():
            for node in nodes_:
                self.problems.append(f"operator {key} is not supported: {describe_node(node)}")

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
        for node, value in self.env.items():   # inputs and weights: memory of their own
            self.aliases[node] = Alias.fresh(value)

        all_params = params + [v for v, _ in param_values]
        attrs = {}
        if self.upper_bounds:
            attrs["tir_var_upper_bound"] = dict(self.upper_bounds)
        if self.lower_bounds:
            attrs["tir_var_lower_bound"] = dict(self.lower_bounds)
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
        mod = bb.get()
        funcs = dict(mod.functions)
        funcs[self.func_name] = self.facts.attach(funcs[self.func_name])
        return type(mod)(funcs)

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
                    v = self._output_value(i, r)
                    if v is not None:
                        outputs.append(v)
                continue
            if node.op != "call_function":
                continue
            self.env[node] = self._convert_node(node)
        return outputs

    def _output_value(self, i: int, r):
        """Output ``i`` as a Relax tensor (a Python or symbolic int: a 0-d int64 tensor)."""
        v = self._convert_arg(r)
        if v is FAILED:
            return None
        if isinstance(v, (bool, int)) or isinstance(v, tir.PrimExpr):
            return self.emit(_ops._tensor(self, v, "bool" if isinstance(v, bool) else "int64"))
        if not isinstance(v, Expr):
            self.problems.append(f"output {i}: a non-tensor output ({v!r}) is not supported")
            return None
        return v

    def _convert_node(self, node):
        key = self._op_key(node)
        ckey = self._converter_key(node)
        fn = _ops.CONVERTERS.get(ckey)
        if fn is None and self._is_sym_scalar(node):
            try:
                return self._sym_value(node.meta["val"])
            except Unsupported as err:
                self.problems.append(f"node {node.name} ({key}): {err}{at_source(node)}")
                return FAILED
        if fn is None:
            return FAILED                      # reported by _precheck
        self.op_name = ckey
        aten = hasattr(node.target, "_schema")
        inplace = aten and ckey != key
        try:
            if aten:
                a = self._normalize(node)
            else:
                a = {"args": self._convert_arg(node.args), "kwargs": self._convert_arg(node.kwargs)}
            if self._has_failed(a):
                return FAILED
            value = self._finish(node, fn(self, a))
            if inplace:
                self._record_write(node, value)
            else:
                self._record_alias(node, a, value, ckey, aten)
            return value
        except Unsupported as err:
            if node.users or inplace:          # a result nobody uses does not matter
                self.problems.append(f"node {node.name} ({key}): {err}{at_source(node)}")
            return FAILED
        except RelaxError as err:
            raise RelaxError(f"{FRONTEND}: node {node.name} ({key}): {err}{at_source(node)}") \
                from err

    def _record_write(self, node, value) -> None:
        """An in-place operator: its result is the new value of its first argument's memory."""
        target = node.args[0]
        alias = self.aliases.get(target)
        if not isinstance(alias, Alias) or not isinstance(value, Expr):
            raise Unsupported(f"an in-place operator on {getattr(target, 'name', target)}, "
                              f"which is not a tensor")
        self._write(alias, value)
        self.aliases[node] = Alias(alias.storage, alias.steps, value)

    def _record_alias(self, node, a: dict, value, op: str, aten: bool) -> None:
        """Record what memory ``node``'s result is: a view of its input's, or its own."""
        if op == "operator.getitem":
            src, i = node.args
            parent = self.aliases.get(src)
            if isinstance(parent, list) and isinstance(value, Expr):
                self.aliases[node] = parent[i]
            elif isinstance(value, Expr):
                self.aliases[node] = Alias.fresh(value)
            return
        parent = self.aliases.get(node.args[0]) if node.args else None
        view = aten and isinstance(parent, Alias) and aliasing.is_view(self.torch, node, op)
        args = {k: v for k, v in a.items() if k != "self"}
        if isinstance(value, list):
            self.aliases[node] = [
                (parent.view(ViewStep(node, i, args, op), v) if view else Alias.fresh(v))
                if isinstance(v, Expr) else None for i, v in enumerate(value)]
        elif isinstance(value, Expr):
            self.aliases[node] = parent.view(ViewStep(node, None, args, op), value) if view \
                else Alias.fresh(value)

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
                             f"(shape {tuple(val.shape)}){at_source(node)}")
        want = relax_dtype(val.dtype, f" of {node.name}")
        if si.dtype != want:
            value = self.emit(rop.astype(value, want))
        return self._conform_shape(node, value, val)

    def _conform_shape(self, node, value: Expr, val) -> Expr:
        """``value`` with torch's recorded shape: where a dim differs from torch's and is not
        provably the same without the facts, it is proved from the facts or checked at run time
        (``ShapeFacts.require_equal``), and the value is cast to torch's shape."""
        si = value.struct_info
        want = [tir.const(d, "int64") if isinstance(d, int) else d
                for d in (self._sym_value(d) for d in val.shape)]
        have = si.shape
        if have is not None and all(structural_equal(h, w) for h, w in zip(have, want)):
            return value
        differ = have is None
        for h, w in zip(have or (), want):
            if structural_equal(h, w):
                continue
            if isinstance(h, tir.IntImm) and isinstance(w, tir.IntImm):
                raise RelaxError(f"{FRONTEND}: node {node.name} ({self._op_key(node)}): "
                                 f"the converted result has shape {tuple(have)}, torch's has "
                                 f"{tuple(val.shape)}{at_source(node)}")
            if self.plain.can_prove_equal(h, w):
                continue
            differ = True
            try:
                self.facts.require_equal(h, w, describe_node(node))
            except ShapeFactError as err:
                raise Unsupported(str(err)) from None
        if not differ:
            return value
        return self.bb.match_cast(value, TensorStructInfo(want, si.dtype), name_hint=node.name)


def _finite(v) -> int | None:
    """An int of a torch range bound; None for infinity (``int_oo``)."""
    try:
        out = int(v)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return out if abs(out) < _NO_BOUND else None


def from_torch(exported_program, *, keep_params_in_input: bool = False,
               use_range_upper_bounds: bool = True, func_name: str = "main"):
    """Import a ``torch.export.ExportedProgram`` as a Relax ``IRModule``.

    Parameters
    ----------
    exported_program : torch.export.ExportedProgram
        ``torch.export.export(model.eval(), args, dynamic_shapes=...)`` (under
        ``torch.no_grad()`` or not), as exported, with its in-place and view operators, or
        after ``run_decompositions()`` (core ATen).
    keep_params_in_input : bool
        False (default): parameters and buffers become constants in the module. True: they
        become parameters of ``main`` after the model's inputs, in the program's order; the
        function attribute ``params`` holds their values (Relax constants, as ``from_onnx``;
        ``relax.frontend.detach_params(mod)`` takes them out as numpy arrays) and
        ``num_input`` the number of real inputs.
    use_range_upper_bounds : bool
        Record each dynamic dim's ``max`` (from ``torch.export.Dim(..., max=...)``) as the
        function's ``tir_var_upper_bound``, so ``relax.build`` plans memory statically at it.
        Either way the range (``min`` too, as ``tir_var_lower_bound``) is a fact shapes are
        proved with, and the function checks it first when it runs.
    func_name : str
        The name of the Relax function.

    Returns
    -------
    IRModule
        ``main`` takes the program's user inputs (named as the model's ``forward`` arguments);
        dynamic dims are ``tensorir`` variables named as their ``Dim``. It returns the
        model's outputs flattened in order as ``torch.utils._pytree.tree_leaves`` flattens
        them (a tuple, dict, dataclass or ``ModelOutput`` as its tensors; an int as a 0-d
        int64 tensor); ``torch.utils._pytree.tree_unflatten(list(outs),
        exported_program.call_spec.out_spec)`` rebuilds the structure. A call whose inputs
        break a fact the import relied on (a ``Dim``'s range, one of torch's run-time
        assertions, a shape relation the importer could not prove) raises
        ``relax.RuntimeCheckError`` saying which.

    Raises
    ------
    relax.frontend.UnsupportedError
        Listing every ATen operator of the program without a converter and every argument a
        converter cannot express, at once, each with the line of the model's source torch
        recorded for the node.

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
    torch = import_optional("torch", FRONTEND)
    import torch.export  # noqa: F401  (a submodule torch itself does not import)
    if not isinstance(exported_program, torch.export.ExportedProgram):
        raise TypeError(f"{FRONTEND} takes a torch.export.ExportedProgram (from "
                        f"torch.export.export(model, args)), got "
                        f"{type(exported_program).__name__}")
    return ExportedProgramImporter(torch, exported_program, keep_params_in_input,
                                   use_range_upper_bounds, func_name).run()
