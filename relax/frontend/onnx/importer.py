"""ONNX ``ModelProto`` -> Relax ``IRModule``.

The importer walks the graph in order and converts each node with its converter
(``registry.CONVERTERS``), emitting Relax operator calls into one dataflow block of a function
``main``. What it knows at import time travels beside the Relax expressions: initializers and
``Constant`` outputs are numpy arrays, ``Shape`` of a tensor is a vector of its (symbolic) dims, and
small integer computations on them (``Gather``, ``Concat``, ``Unsqueeze``, arithmetic...) are
evaluated as the graph is read (``known.py``), so that ``Reshape``'s shape or ``Slice``'s ends
computed from shapes stay exact, symbolic dims included. Values computed at run time take the
dynamic forms (``tensor_to_shape`` with ``match_cast`` of fresh dims).

Before converting anything, the importer checks every node (subgraphs too) and raises
``UnsupportedError`` listing all the operators, versions and attributes it cannot import.
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Sequence

import numpy as np
import onnx

from tilecraft.errors import TilecraftError
from tilecraft import tensorir
from tilecraft.tensorir.expr import IntImm, PrimExpr, TIRError, Var as TirVar
from tilecraft.tensorir.function import IRModule

from ... import boundary_dtypes, op as _op
from ...block_builder import BlockBuilder
from ...expr import Call, Constant, Expr, Op, RelaxError, ShapeExpr, Tuple, Var, const
from ...struct_info import ShapeStructInfo, TensorStructInfo
from ..common import UnsupportedError
from ..shape_facts import ShapeFacts
from .registry import (CONTRIB_CONVERTERS, CONVERTERS, ConversionError, NeedsConstant, OnnxNode,
                       onnx_dtype_name,
                       supported_elem_type, to_dtype, to_numpy, ONNX_DTYPES)
from .values import Known, Tensors, Value
from . import lowbit
from . import known as _known
from . import ops  # noqa: F401  (the converters register themselves when imported)

MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()
_DEFAULT_DOMAINS = ("", "ai.onnx")
_RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
               "Multinomial", "Bernoulli"}


# ---------------------------------------------------------------------------------------------
# loading and validating


def load_model(model) -> onnx.ModelProto:
    """A ModelProto from a ModelProto, serialized bytes or a file path; ``ValueError`` when the
    bytes are not a (complete) ONNX model."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        with open(path, "rb") as f:
            data = f.read()
        where = f"{path!r}"
    elif isinstance(model, (bytes, bytearray, memoryview)):
        data, where = bytes(model), "the bytes given"
    else:
        raise TypeError(f"from_onnx takes an onnx.ModelProto, serialized bytes or a file path, "
                        f"got {type(model).__name__}")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as err:
        raise ValueError(f"from_onnx: {where} is not a valid ONNX model ({len(data)} bytes): the "
                         f"protobuf is truncated or corrupt ({type(err).__name__}: {err})") from None
    if not proto.HasField("graph"):
        raise ValueError(f"from_onnx: {where} is not a valid ONNX model ({len(data)} bytes): it "
                         f"has no graph (a truncated or non-ONNX file)")
    return proto


def _graph_problems(graph: onnx.GraphProto, outer: set, where: str) -> list[str]:
    """Structural problems of a graph: values used before they are defined, outputs no node
    makes, nameless values."""
    problems = []
    defined = set(outer)
    defined |= {i.name for i in graph.initializer}
    defined |= {i.name for i in graph.input}
    for k, node in enumerate(graph.node):
        label = f"{where}node {node.name or k!r} ({node.op_type or '?'})"
        if not node.op_type:
            problems.append(f"{label} has no op_type")
        for name in node.input:
            if name and name not in defined:
                problems.append(f"{label} uses {name!r}, which no earlier node, initializer or "
                                f"graph input defines")
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                problems += _graph_problems(a.g, defined, f"{label}: subgraph {a.name}: ")
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    problems += _graph_problems(g, defined, f"{label}: subgraph {a.name}: ")
        defined |= {o for o in node.output if o}
    for out in graph.output:
        if not out.name:
            problems.append(f"{where}a graph output has no name")
        elif out.name not in defined:
            problems.append(f"{where}graph output {out.name!r} is not produced by any node, "
                            f"initializer or input")
    return problems


def _outer_names(node: onnx.NodeProto) -> list:
    """Values of the enclosing graphs that a node's subgraphs use."""
    out = []
    for a in node.attribute:
        gs = [a.g] if a.type == onnx.AttributeProto.GRAPH else \
            list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []
        for g in gs:
            inner = {i.name for i in g.initializer} | {i.name for i in g.input}
            for n in g.node:
                inner |= set(n.output)
            for n in g.node:
                out += [i for i in n.input if i and i not in inner]
                out += [i for i in _outer_names(n) if i not in inner]
    return out


def _toposort(graph: onnx.GraphProto, outer: set) -> list[onnx.NodeProto]:
    """The nodes in an order where every input is defined first (exporters sometimes write them
    out of order); unresolvable nodes keep their place (the validation names them)."""
    nodes = list(graph.node)
    defined = set(outer) | {i.name for i in graph.initializer} | {i.name for i in graph.input}

    def needs(node):
        out = set(i for i in node.input if i)
        for a in node.attribute:   # subgraphs may use outer values: they count too
            gs = [a.g] if a.type == onnx.AttributeProto.GRAPH else \
                list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []
            for g in gs:
                inner = {i.name for i in g.initializer} | {i.name for i in g.input}
                for n in g.node:
                    inner |= set(n.output)
                for n in g.node:
                    out |= {i for i in n.input if i and i not in inner}
        return out
    if all(needs(n) <= (defined | {o for m in nodes[:k] for o in m.output})
           for k, n in enumerate(nodes)):
        return nodes
    order, pending = [], list(nodes)
    while pending:
        progress = False
        for n in list(pending):
            if needs(n) <= defined:
                order.append(n)
                defined |= set(n.output)
                pending.remove(n)
                progress = True
        if not progress:
            return order + pending
    return order


def _sanitize(name: str) -> str:
    name = re.sub(r"[^0-9A-Za-z_]", "_", name or "v")
    return name if name and not name[0].isdigit() else "v" + name


class GraphContext:
    """The state converters see: the BlockBuilder, the ONNX values in scope, the opset."""

    def __init__(self, importer: "GraphImporter", bb: BlockBuilder, opset: int):
        self.importer = importer
        self.bb = bb
        self.opset = opset
        self.scopes: list[dict[str, Value]] = [{}]
        self.node: OnnxNode | None = None

    # -- scopes ------------------------------------------------------------------------------
    def lookup(self, name: str) -> Value:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise ConversionError(f"the value {name!r} is not defined")

    def define(self, name: str, value: Value) -> None:
        self.scopes[-1][name] = value

    # -- inputs --------------------------------------------------------------------------------
    def value(self, node: OnnxNode, i: int) -> Value | None:
        if not node.has_input(i):
            return None
        return self.lookup(node.inputs[i])

    def input(self, node: OnnxNode, i: int) -> Expr | None:
        """Input ``i`` as a Relax expression (None when the optional input is absent)."""
        v = self.value(node, i)
        return None if v is None else self.expr(v)

    def inputs(self, node: OnnxNode) -> list:
        return [self.input(node, i) for i in range(len(node.inputs))]

    def known(self, node: OnnxNode, i: int):
        """Input ``i``'s import-time value (numpy; object array when symbolic) or None."""
        v = self.value(node, i)
        return None if v is None else v.known

    def const(self, node: OnnxNode, i: int, what: str) -> np.ndarray:
        """Input ``i`` as a numeric numpy array, which it must be at import time."""
        v = self.value(node, i)
        if v is None:
            raise ConversionError(f"{node.describe()}: the input {what} is required")
        if v.known is None or v.known.dtype == object:
            raise NeedsConstant(f"input {i} ({what}) must be a constant", node.inputs[i])
        return v.known

    def known_ints(self, node: OnnxNode, i: int, what: str) -> list | None:
        """Input ``i`` as a list of ints / int64 PrimExprs (symbolic dims) known at import time;
        None when the input is absent; ``NeedsConstant`` when it is computed at run time."""
        v = self.value(node, i)
        if v is None:
            return None
        if v.known is None:
            raise NeedsConstant(f"input {i} ({what}) must be known when the model is imported "
                                f"(a constant or computed from shapes)", node.inputs[i])
        return [_known.as_int(x) for x in v.known.reshape(-1)]

    def maybe_ints(self, node: OnnxNode, i: int) -> list | None:
        """Input ``i`` as a list of ints / PrimExprs if it is known at import time, else None."""
        v = self.value(node, i)
        if v is None or v.known is None or v.known.dtype.kind not in "iuO":
            return None
        return [_known.as_int(x) for x in v.known.reshape(-1)]

    def expr(self, v: Value) -> Expr:
        """The Relax expression of a value (a constant or a shape tensor made on first use)."""
        if v.expr is None:
            e = self.materialize(v.known, v.dtype)
            if self.importer.branch_depth and not isinstance(e, Constant):
                return e    # bound inside a branch of an If: not visible after it
            v.expr = e
        return v.expr

    def materialize(self, arr: np.ndarray, dtype: str) -> Expr:
        if arr.dtype != object:
            return const(arr)
        flat = [x if isinstance(x, PrimExpr) else IntImm(int(x), "int64") for x in arr.reshape(-1)]
        e: Expr = self.emit(_op.shape_to_tensor(ShapeExpr(flat)), "shape")
        if arr.ndim != 1:
            e = self.emit(_op.reshape(e, arr.shape))
        if dtype != "int64":
            e = self.emit(_op.astype(e, dtype))
        return e

    # -- emitting ------------------------------------------------------------------------------
    def emit(self, expr: Expr, name: str = "lv") -> Expr:
        if isinstance(expr, (Var, Constant)):
            return expr
        folded = _fold_constant_call(expr)
        if folded is not None:
            return folded
        return self.bb.emit(expr, _sanitize(name))

    def shape(self, e: Expr, what: str = "input") -> tuple:
        si = e.struct_info
        if not isinstance(si, TensorStructInfo) or si.shape is None:
            raise ConversionError(f"{what}: expected a tensor of known rank, got {si!r}")
        return si.shape

    def dtype(self, e: Expr) -> str:
        return e.struct_info.dtype

    def runtime_dims(self, ints: Expr, what: str, expected=None) -> tuple:
        """The values of a 1-D integer tensor computed at run time, as fresh symbolic dims
        (``tensor_to_shape`` + ``match_cast``); they must be non-negative at run time.
        ``expected``: per entry, None for a fresh dim or a dim expression the value must equal
        (checked at run time by the match_cast)."""
        n = self.shape(ints, what)
        if len(n) != 1 or not isinstance(n[0], IntImm):
            raise ConversionError(f"{what}: needs a 1-D tensor of static length, got "
                                  f"{ints.struct_info!r}")
        if self.dtype(ints) != "int64":
            ints = self.emit(_op.astype(ints, "int64"))
        shp = self.emit(_op.tensor_to_shape(ints), "shape")
        expected = expected or [None] * n[0].value
        dims = [self.importer.fresh_var(what) if e is None else e for e in expected]
        self.importer.runtime_vars.update(id(d) for d in dims if isinstance(d, TirVar))
        self.bb.match_cast(shp, ShapeStructInfo(dims), _sanitize(what))
        return tuple(dims)

    def fresh_var(self, hint: str) -> TirVar:
        return self.importer.fresh_var(hint)


# ---------------------------------------------------------------------------------------------
# the importer


def _symbolic_name(s: str) -> str:
    name = re.sub(r"[^0-9A-Za-z_]", "_", s.strip()) or "d"
    return name if not name[0].isdigit() else "d" + name


class GraphImporter:
    """Imports one ONNX model into a function of a BlockBuilder (``from_onnx`` uses it with a
    fresh BlockBuilder and the function name ``main``; the conformance harness puts many models
    into one module)."""

    def __init__(self, shape_dict: Mapping[str, Sequence] | None = None,
                 keep_params_in_input: bool = False, opset: int | None = None):
        self.shape_dict = dict(shape_dict or {})
        self.keep_params_in_input = bool(keep_params_in_input)
        self.opset_override = opset
        self.domain_opsets: dict[str, int] = {}   # versions of the other domains imported
        self.sym_vars: dict[str, TirVar] = {}
        self._fresh_count: dict[str, int] = {}
        self.problems: list[str] = []
        self.constant_inputs: list[str] = []
        self.producers: dict[str, list] = {}   # value name -> the inputs of its node
        # ids of the dims bound in the middle of the function (sizes computed at run time):
        # the checks made at its start cannot name them
        self.runtime_vars: set[int] = set()
        # > 0 while converting the branches of an If on a run-time condition: checks hoisted to
        # the function's start would run whichever branch is taken
        self.branch_depth = 0
        # facts about the symbolic dims (sizes are >= 0) and the run-time checks behind the
        # ones a converter needed but could not prove (see Expand)
        self.facts = ShapeFacts()

    # -- symbolic variables ----------------------------------------------------------------------
    def named_var(self, name: str) -> TirVar:
        key = _symbolic_name(name)
        if key not in self.sym_vars:
            self.sym_vars[key] = tensorir.var(key)
            self.facts.assume(self.sym_vars[key] >= 0)
        return self.sym_vars[key]

    def fresh_var(self, hint: str) -> TirVar:
        base = _symbolic_name(hint)
        n = self._fresh_count.get(base, 0)
        self._fresh_count[base] = n + 1
        name = base if n == 0 and base not in self.sym_vars else f"{base}_{n}"
        v = tensorir.var(name)
        self.sym_vars[name] = v
        self.facts.assume(v >= 0)
        return v

    # -- entry ---------------------------------------------------------------------------------
    def import_model(self, model: onnx.ModelProto, bb: BlockBuilder | None = None,
                     func_name: str = "main") -> IRModule:
        model = load_model(model)
        if len(model.functions):
            try:
                from onnx import inliner
                model = inliner.inline_local_functions(model)
            except Exception as err:
                raise ValueError(f"from_onnx: the model's local functions cannot be inlined: "
                                 f"{err}") from None
        self.opset = self._resolve_opset(model)
        self.domain_opsets = {imp.domain: int(imp.version) for imp in model.opset_import
                              if imp.domain not in _DEFAULT_DOMAINS}
        graph = model.graph
        problems = _graph_problems(graph, set(), "")
        if not graph.output:
            problems.append("the graph has no outputs")
        if problems:
            raise ValueError("from_onnx: the model is invalid:\n  " + "\n  ".join(problems))
        self._check_supported(graph, self.opset)
        bb = bb or BlockBuilder()
        self._build(graph, bb, func_name)
        return bb.get()

    def _resolve_opset(self, model: onnx.ModelProto) -> int:
        model_opset = None
        for imp in model.opset_import:
            if imp.domain in _DEFAULT_DOMAINS:
                model_opset = int(imp.version)
        if self.opset_override is not None:
            opset = int(self.opset_override)
        elif model_opset is None:
            if len(model.opset_import) == 0 and model.ir_version < 3:
                opset = 1
            else:
                raise ValueError("from_onnx: the model imports no opset of the standard ONNX "
                                 "domain (opset_import lists "
                                 f"{[imp.domain for imp in model.opset_import]})")
        else:
            opset = model_opset
        if opset < MIN_OPSET and self._same_at(model.graph, opset, MIN_OPSET):
            opset = MIN_OPSET   # every operator the model uses is defined the same way at 7
        if opset < MIN_OPSET or opset > MAX_OPSET:
            raise UnsupportedError("from_onnx", [
                f"the model uses opset {opset} of the standard domain; supported: {MIN_OPSET} to "
                f"{MAX_OPSET} (onnx {onnx.__version__})"
                + ("; upgrade it with onnx.version_converter.convert_version(model, "
                   f"{MIN_OPSET})" if opset < MIN_OPSET else "")])
        return opset

    @staticmethod
    def _same_at(graph, old: int, new: int) -> bool:
        for node in graph.node:
            try:
                a = onnx.defs.get_schema(node.op_type, old, "").since_version
                b = onnx.defs.get_schema(node.op_type, new, "").since_version
            except Exception:
                return False
            if a != b or node.domain not in _DEFAULT_DOMAINS:
                return False
            for attr in node.attribute:
                if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    return False
        return True

    # -- the support check (before anything is converted) ----------------------------------------
    def _check_supported(self, graph: onnx.GraphProto, opset: int) -> None:
        problems: list[str] = []
        seen: set = set()

        def value_types(g, where):
            values = [(vi, False) for vi in g.input] + [(vi, True) for vi in g.output]
            for vi, is_output in values:
                kind = vi.type.WhichOneof("value")
                if kind is None:
                    continue
                if kind == "sequence_type" and is_output and \
                        vi.type.sequence_type.elem_type.WhichOneof("value") == "tensor_type":
                    continue   # a result made in the graph: a tuple of its tensors
                if kind == "sequence_type" and not is_output:
                    problems.append(f"{where}value {vi.name!r} is a sequence input (not "
                                    f"supported: its length is not known when the model is "
                                    f"imported)")
                elif kind != "tensor_type":
                    problems.append(f"{where}value {vi.name!r} is a {kind.replace('_type', '')}, "
                                    f"not a tensor (not supported)")
                elif not supported_elem_type(vi.type.tensor_type.elem_type) and \
                        vi.type.tensor_type.elem_type != 0:
                    problems.append(f"{where}value {vi.name!r} has the element type "
                                    f"{onnx_dtype_name(vi.type.tensor_type.elem_type)}, which has "
                                    f"no tilecraft dtype")
            for init in g.initializer:
                if not supported_elem_type(init.data_type):
                    problems.append(f"{where}initializer {init.name!r} has the element type "
                                    f"{onnx_dtype_name(init.data_type)}, which has no tilecraft "
                                    f"dtype")

        def walk(g, where):
            value_types(g, where)
            for k, proto in enumerate(g.node):
                name = proto.name or f"{proto.op_type}_{k}"
                label = f"{where}node {name!r} ({proto.op_type}, opset {opset})"
                for p in self._node_problems(proto, opset, label, name):
                    if p not in seen:
                        seen.add(p)
                        problems.append(p)
                for a in proto.attribute:
                    if a.type == onnx.AttributeProto.GRAPH:
                        walk(a.g, f"{label} {a.name}: ")
                    elif a.type == onnx.AttributeProto.GRAPHS:
                        for sub in a.graphs:
                            walk(sub, f"{label} {a.name}: ")

        walk(graph, "")
        if problems:
            raise UnsupportedError("from_onnx", problems)

    def _function_schema(self, proto: onnx.NodeProto):
        """The schema of an operator of another domain the model imports that ONNX defines as
        a function (imported through its body), or None."""
        version = self.domain_opsets.get(proto.domain)
        if version is None:
            return None
        try:
            schema = onnx.defs.get_schema(proto.op_type, version, proto.domain)
        except Exception:
            return None
        if not (getattr(schema, "function_opset_versions", None) or
                getattr(schema, "context_dependent_function_opset_versions", None)):
            return None
        return schema

    def _node_problems(self, proto: onnx.NodeProto, opset: int, label: str, name: str,
                       depth: int = 0) -> list[str]:
        domain_version = None
        if proto.domain not in _DEFAULT_DOMAINS:
            contrib = CONTRIB_CONVERTERS.get((proto.domain, proto.op_type))
            if contrib is not None:
                if contrib.check is None:
                    return []
                return [f"{label}: {p}" for p in contrib.check(OnnxNode(proto, opset, 1, name))]
            schema = self._function_schema(proto)
            if schema is None:
                known = sorted(f"{d}.{o}" for d, o in CONTRIB_CONVERTERS)
                return [f"{label}: the operator {proto.domain}.{proto.op_type} is not supported "
                        f"(operator domain {proto.domain!r}: of other domains than the standard "
                        f"one, {known} and the operators ONNX defines as functions are)"]
            domain_version = self.domain_opsets[proto.domain]
        else:
            try:
                schema = onnx.defs.get_schema(proto.op_type, opset, "")
            except Exception:
                return [f"{label}: {proto.op_type} is not an operator of the standard domain "
                        f"at opset {opset}"]
        conv = CONVERTERS.get(proto.op_type) if domain_version is None else None
        if conv is None:
            try:
                body = _function_body(proto, schema, opset, None, domain_version) \
                    if depth < 6 else None
            except _NeedsTypes:
                return []   # a body that depends on the input types: checked when converting
            if body is None:
                return [f"{label}: the operator {proto.op_type} (version "
                        f"{schema.since_version}) is not supported"]
            nodes, fn_opset = body
            out = []
            for k, inner in enumerate(nodes):
                out += self._node_problems(inner, fn_opset, f"{label} -> {inner.op_type}",
                                           f"{name}/{k}", depth + 1)
                for a in inner.attribute:
                    if a.type == onnx.AttributeProto.GRAPH:
                        for sub in a.g.node:
                            out += self._node_problems(sub, fn_opset,
                                                       f"{label} -> {sub.op_type}",
                                                       f"{name}/{k}", depth + 1)
            return out
        if schema.since_version < conv.since:
            return [f"{label}: version {schema.since_version} of {proto.op_type} is not supported "
                    f"(from version {conv.since})"]
        try:
            node = OnnxNode(proto, opset, schema.since_version, name)
        except ConversionError as err:
            return [str(err)]
        except ValueError as err:
            raise ValueError(f"from_onnx: {label}: {err}") from None
        if conv.check is not None:
            return [f"{label}: {p}" for p in conv.check(node)]
        return []

    # -- conversion --------------------------------------------------------------------------------
    def _input_shape(self, vi: onnx.ValueInfoProto) -> tuple:
        name = vi.name
        tt = vi.type.tensor_type
        model_dims = None
        if tt.HasField("shape"):
            model_dims = []
            for k, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value > 0:
                    model_dims.append(int(d.dim_value))
                elif d.HasField("dim_value") and d.dim_value == 0 and not d.dim_param:
                    model_dims.append(0)
                elif d.dim_param:
                    model_dims.append(self.named_var(d.dim_param))
                else:
                    model_dims.append(None)
        if name in self.shape_dict:
            given = list(self.shape_dict[name])
            if model_dims is not None and len(given) != len(model_dims):
                raise ValueError(f"from_onnx: shape_dict gives input {name!r} the shape {given} of "
                                 f"rank {len(given)}, but the model declares rank "
                                 f"{len(model_dims)}")
            dims = []
            for k, d in enumerate(given):
                if isinstance(d, str):
                    dims.append(self.named_var(d))
                elif isinstance(d, PrimExpr):
                    dims.append(d)
                elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
                    dims.append(int(d))
                elif d is None or (isinstance(d, (int, np.integer)) and d < 0):
                    dims.append(self.fresh_var(f"{name}_d{k}"))
                else:
                    raise ValueError(f"from_onnx: shape_dict[{name!r}][{k}] must be an int, a "
                                     f"name or None, got {d!r}")
            return tuple(dims)
        if model_dims is None:
            raise ValueError(f"from_onnx: the model does not give the shape of input {name!r}; "
                             f"give it in shape_dict")
        return tuple(self.fresh_var(f"{name}_d{k}") if d is None else d
                     for k, d in enumerate(model_dims))

    def _build(self, graph: onnx.GraphProto, bb: BlockBuilder, func_name: str) -> None:
        inits = {t.name: t for t in graph.initializer}
        unknown = set(self.shape_dict) - {vi.name for vi in graph.input if vi.name not in inits}
        if unknown:
            raise ValueError(f"from_onnx: shape_dict names {sorted(unknown)}, which are not inputs "
                             f"of the model (inputs: "
                             f"{[vi.name for vi in graph.input if vi.name not in inits]})")
        ctx = GraphContext(self, bb, self.opset)
        params: list[Var] = []
        for vi in graph.input:
            if vi.name in inits:
                continue   # old exporters list initializers as inputs too
            if vi.type.WhichOneof("value") != "tensor_type":
                raise UnsupportedError("from_onnx", [f"input {vi.name!r} is not a tensor"])
            elem = vi.type.tensor_type.elem_type
            dtype = to_dtype(elem, f"input {vi.name!r}")
            var = Var(_sanitize(vi.name), TensorStructInfo(self._input_shape(vi), dtype))
            params.append(var)
            fmt = lowbit.format_of(elem)
            ctx.define(vi.name, Value(var, logical=fmt.name if fmt else None))
        weights: list[np.ndarray] = []
        for name, t in inits.items():
            arr = to_numpy(t, f"initializer {name!r}")
            fmt = lowbit.format_of(t.data_type)
            if fmt is not None:
                ctx.define(name, Value(known=arr, logical=fmt.name))
                continue
            if self.keep_params_in_input and arr.dtype.kind == "f":
                var = Var(_sanitize(name), TensorStructInfo(arr.shape, str(arr.dtype)))
                params.append(var)
                weights.append(arr)
                ctx.define(name, Value(var))
            else:
                ctx.define(name, Value(known=arr))
        num_input = len(params) - len(weights)
        attrs = {"num_input": num_input}
        if weights:
            attrs["params"] = tuple(const(w) for w in weights)
        in_types = tuple(_ml_name(ctx.lookup(vi.name)) for vi in graph.input
                         if vi.name not in inits)
        with bb.function(func_name, params, attrs=attrs):
            with bb.dataflow():
                self.convert_graph(ctx, graph)
                if self.problems:
                    raise UnsupportedError("from_onnx", self.problems,
                                           constant_inputs=self.constant_inputs)
                out_values = [ctx.lookup(o.name) for o in graph.output]
                outs = [ctx.expr(v) for v in out_values]
                result = outs[0] if len(outs) == 1 else Tuple(outs)
                gv = bb.emit_output(result)
            bb.emit_func_output(gv)
        func = self.facts.attach(bb.get()[func_name])
        out_types = tuple(_ml_name(v) for v in out_values)
        if any(in_types) or any(out_types):
            # bfloat16, float8, int4... values: the VM takes and returns them as ml_dtypes
            # arrays (relax.boundary_dtypes)
            attrs = func.attr_dict
            attrs[boundary_dtypes.ATTR] = {
                "params": in_types, "ret": out_types[0] if len(out_types) == 1 else out_types}
            func = func.replace(attrs=attrs)
        bb.update_func(func_name, func)

    def convert_graph(self, ctx: GraphContext, graph: onnx.GraphProto) -> None:
        """Convert the nodes of ``graph`` (its initializers are defined by the caller for the
        main graph; subgraph initializers are defined here)."""
        outer = set()
        for scope in ctx.scopes:
            outer |= set(scope)
        for t in graph.initializer:
            if t.name not in ctx.scopes[-1] or ctx.scopes[-1][t.name].expr is None:
                fmt = lowbit.format_of(t.data_type)
                ctx.define(t.name, Value(known=to_numpy(t, f"initializer {t.name!r}"),
                                         logical=fmt.name if fmt else None))
        for k, proto in enumerate(_toposort(graph, outer)):
            self.convert_node(ctx, proto, proto.name or f"{proto.op_type}_{k}")

    def convert_node(self, ctx: GraphContext, proto: onnx.NodeProto, name: str) -> None:
        other_domain = proto.domain not in _DEFAULT_DOMAINS
        # checked by _node_problems: a registered operator of another domain, or one ONNX
        # defines as a function
        contrib = CONTRIB_CONVERTERS.get((proto.domain, proto.op_type)) if other_domain else None
        if contrib is not None:
            schema = None
            node = OnnxNode(proto, ctx.opset, 1, name)
        else:
            schema = self._function_schema(proto) if other_domain else \
                onnx.defs.get_schema(proto.op_type, ctx.opset, "")
            node = OnnxNode(proto, ctx.opset, schema.since_version, name)
        # a value that could not be made (an earlier problem): skip what depends on it
        missing = [i for i in node.inputs if i and _is_poisoned(ctx, i)]
        if missing:
            self._poison(ctx, node)
            return
        conv = contrib if other_domain else CONVERTERS.get(node.op_type)
        if conv is None:
            self._expand(ctx, node, proto, schema, name,
                         self.domain_opsets[proto.domain] if other_domain else None)
            return
        if conv.check is not None:
            issues = conv.check(node)
            if issues:
                self.problems += [f"{node.describe()}: {p}" for p in issues]
                self._poison(ctx, node)
                return
        ctx.node = node
        emulated = [ctx.lookup(i).logical for i in node.inputs if i]
        emulated = [x for x in emulated if x is not None]
        try:
            result = None
            if emulated and node.op_type in _LOWBIT_MOVE:
                # pure data movement: the storage moves as it is, the type goes along
                result = _known.fold(ctx, node) or conv.fn(ctx, node)
                result = _with_logical(ctx, result, ctx.lookup(node.inputs[0]).logical)
            elif emulated and node.op_type not in _LOWBIT_AWARE:
                result = self._convert_decoded(ctx, node, conv, emulated)
            else:
                if node.op_type not in _RANDOM_OPS and not emulated and contrib is None:
                    result = _known.fold(ctx, node)
                if result is None:
                    result = conv.fn(ctx, node)
        except NeedsConstant as err:
            self.problems.append(f"{node.describe()}: {err.what}")
            for source in self._graph_inputs_behind(ctx, err.value_name):
                if source not in self.constant_inputs:
                    self.constant_inputs.append(source)
            self._poison(ctx, node)
            return
        except UnsupportedError as err:
            self.problems += [f"{node.describe()}: {p}" for p in err.problems]
            self._poison(ctx, node)
            return
        except (ConversionError, RelaxError, TIRError) as err:
            raise ValueError(f"from_onnx: {node.describe()}: {err}") from err
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            # a node the converter could not make sense of (a required input or attribute
            # missing, values of the wrong kind): name it rather than leak the Python error
            raise ValueError(f"from_onnx: {node.describe()}: the node is malformed (inputs "
                             f"{node.inputs}, attributes {sorted(node.attrs)}): "
                             f"{type(err).__name__}: {err}") from err
        self._define_outputs(ctx, node, result)
        for o in node.outputs:
            if o:
                self.producers[o] = [i for i in node.inputs if i] + _outer_names(proto)

    def _graph_inputs_behind(self, ctx, name: str) -> list:
        """The graph inputs a value is computed from (those that, as constants, would make it
        known when the model is imported)."""
        out, seen, todo = [], set(), [name]
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in self.producers:
                todo += self.producers[n]
                continue
            try:
                v = ctx.lookup(n)
            except ConversionError:
                continue
            if isinstance(v.expr, Var) and v.known is None:
                out.append(n)
        return out

    def _convert_decoded(self, ctx, node, conv, logicals):
        """Convert a node on ``lowbit`` values: float formats decoded to float32 (integer
        formats are their values already), the converter run, and its float32 results rounded
        back to the (first) input float format."""
        scope = {}
        for i in node.inputs:
            if not i or i in scope:
                continue
            v = ctx.lookup(i)
            if v.logical is None:
                continue
            fmt = lowbit.BY_NAME[v.logical]
            if isinstance(fmt, lowbit.FloatFormat):
                scope[i] = Value(lowbit.decode(ctx, ctx.expr(v), fmt))
            else:
                scope[i] = Value(ctx.expr(v))
        ctx.scopes.append(scope)
        try:
            result = conv.fn(ctx, node)
        finally:
            ctx.scopes.pop()
        fmts = [lowbit.BY_NAME[x] for x in logicals if lowbit.is_float_format(x)]
        if not fmts:
            return result
        fmt = fmts[0]
        out = []
        for r in (result if isinstance(result, (list, tuple)) else [result]):
            if isinstance(r, Value) and r.expr is None and r.known is not None:
                r = Value(ctx.materialize(r.known, r.dtype))
            if isinstance(r, Known):
                r = Value(ctx.materialize(r.array, r.dtype))
            e = r.expr if isinstance(r, Value) else r
            if isinstance(e, Expr) and not isinstance(e, Tuple) and \
                    isinstance(e.struct_info, TensorStructInfo) and \
                    e.struct_info.dtype == "float32":
                e = ctx.emit(e)
                out.append(Value(lowbit.encode(ctx, e, fmt), logical=fmt.name))
            else:
                out.append(r)
        return out

    def _expand(self, ctx, node, proto, schema, name, domain_version=None) -> None:
        """Convert an operator without a converter through its ONNX function body."""
        types = [_type_proto(ctx.lookup(i)) if i else onnx.TypeProto() for i in node.inputs]
        try:
            body = _function_body(proto, schema, ctx.opset, types, domain_version)
        except _NeedsTypes:
            body = None
        if body is None:
            self.problems.append(f"{node.describe()}: the operator {node.op_type} (version "
                                 f"{node.version}) is not supported")
            self._poison(ctx, node)
            return
        nodes, fn_opset = body
        outer_opset = ctx.opset
        ctx.opset = fn_opset
        try:
            for k, inner in enumerate(nodes):
                try:
                    inner_schema = onnx.defs.get_schema(inner.op_type, fn_opset, "")
                except Exception:
                    self.problems.append(f"{node.describe()}: its function body uses "
                                         f"{inner.op_type}, unknown at opset {fn_opset}")
                    self._poison(ctx, node)
                    return
                if inner.op_type not in CONVERTERS and not (
                        getattr(inner_schema, "function_opset_versions", None) or
                        getattr(inner_schema, "context_dependent_function_opset_versions",
                                None)):
                    self.problems.append(f"{node.describe()} -> {inner.op_type}: the operator "
                                         f"{inner.op_type} (version "
                                         f"{inner_schema.since_version}) is not supported")
                    self._poison(ctx, node)
                    return
                self.convert_node(ctx, inner, f"{name}/{inner.op_type}_{k}")
        finally:
            ctx.opset = outer_opset

    def _poison(self, ctx: GraphContext, node: OnnxNode) -> None:
        for o in node.outputs:
            if o:
                ctx.define(o, _POISON)

    def _define_outputs(self, ctx: GraphContext, node: OnnxNode, result) -> None:
        outs = [o for o in node.outputs]
        if not isinstance(result, (list, tuple)):
            result = [result]
        for k, name in enumerate(outs):
            if not name:
                continue
            r = result[k] if k < len(result) else None
            if r is None:
                raise ConversionError(f"{node.describe()}: output {k} ({name!r}) is not supported")
            if isinstance(r, Value):
                ctx.define(name, r)
            elif isinstance(r, Known):
                ctx.define(name, Value(known=r.array, dtype=r.dtype))
            elif isinstance(r, Tensors):
                items = [ctx.emit(x, name) if isinstance(x, Expr) else x for x in r.items]
                ctx.define(name, Value(ctx.emit(Tuple(items), name)))
            elif isinstance(r, Expr):
                ctx.define(name, Value(ctx.emit(r, name)))
            else:
                raise TypeError(f"converter of {node.op_type} returned {type(r).__name__}")


_POISON = Value()


def _ml_name(v: Value) -> str:
    """The ml_dtypes name of a value held in a storage dtype, else ""."""
    return lowbit.BY_NAME[v.logical].ml_name if v.logical else ""

# converters that handle lowbit values themselves
_LOWBIT_AWARE = {"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Identity",
                 "Constant", "Shape", "Size"}
# operators that only move elements: they run on the storage and keep the type
_LOWBIT_MOVE = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split",
                "Slice", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Compress",
                "ReverseSequence", "DepthToSpace", "SpaceToDepth"}


def _with_logical(ctx, result, logical):
    """``result`` (a converter's) with the values of the storage dtype marked ``logical``."""
    storage = lowbit.BY_NAME[logical].storage
    out = []
    for r in (result if isinstance(result, (list, tuple)) else [result]):
        if isinstance(r, Known):
            r = Value(known=r.array, dtype=r.dtype, logical=logical if r.dtype == storage
                      else None)
        elif isinstance(r, Expr):
            e = ctx.emit(r)
            r = Value(e, logical=logical if isinstance(e.struct_info, TensorStructInfo) and
                      e.struct_info.dtype == storage else None)
        out.append(r)
    return out

# data-movement operators on constants, done in numpy as the graph is read (each would otherwise
# be one kernel that FoldConstant compiles and runs at build time: a reshaped bias per Conv)
_NUMPY_FOLDS = {
    "relax.reshape": lambda a, attrs, call: a.reshape(call.struct_info.static_shape()),
    "relax.permute_dims": lambda a, attrs, call: np.transpose(a, attrs.get("axes")),
    "relax.expand_dims": lambda a, attrs, call: a.reshape(call.struct_info.static_shape()),
    "relax.squeeze": lambda a, attrs, call: a.reshape(call.struct_info.static_shape()),
}


def _fold_constant_call(expr: Expr) -> Constant | None:
    if not isinstance(expr, Call) or not isinstance(expr.op, Op):
        return None
    fn = _NUMPY_FOLDS.get(expr.op.name)
    if fn is None or not expr.args or not isinstance(expr.args[0], Constant):
        return None
    si = expr.struct_info
    if not isinstance(si, TensorStructInfo) or not si.is_static:
        return None
    try:
        out = fn(expr.args[0].data, expr.attr_dict, expr)
    except Exception:
        return None
    out = np.require(out, requirements="C")
    if tuple(out.shape) != si.static_shape() or str(out.dtype) != si.dtype:
        return None
    return Constant(out)


def _is_poisoned(ctx: GraphContext, name: str) -> bool:
    try:
        return ctx.lookup(name) is _POISON
    except ConversionError:
        return False


class _NeedsTypes(TilecraftError):
    """The operator's function body depends on its input types (known only when converting)."""


_EXPANSIONS = [0]


def _function_body(proto: onnx.NodeProto, schema, opset: int, input_types=None,
                   domain_version: int | None = None):
    """``(nodes, opset)``: the body of an ONNX function operator for this node (inputs and
    outputs renamed to the node's, internal values made unique) and the standard-domain opset
    the body is written in; None when the operator has no function body. A context-dependent
    body needs ``input_types`` (TypeProtos); without them ``_NeedsTypes`` is raised.
    ``domain_version``: the model's version of the operator's domain when it is not the
    standard one (``ai.onnx.preview``'s FlexAttention)."""
    version = opset if domain_version is None else domain_version
    plain = [v for v in getattr(schema, "function_opset_versions", []) if v <= version]
    typed = [v for v in getattr(schema, "context_dependent_function_opset_versions", [])
             if v <= version]
    if not plain and not typed:
        return None
    node = onnx.NodeProto()
    node.CopyFrom(proto)
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value and attr.default_value.name:
            node.attribute.append(attr.default_value)
    try:
        if plain and (not typed or max(plain) >= max(typed)):
            data = schema.get_function_with_opset_version(max(plain))
        else:
            if input_types is None:
                raise _NeedsTypes()
            data = schema.get_context_dependent_function_with_opset_version(
                max(typed), node.SerializeToString(),
                [t.SerializeToString() for t in input_types])
    except _NeedsTypes:
        raise
    except Exception:
        return None
    fn = onnx.FunctionProto()
    fn.ParseFromString(data if isinstance(data, bytes) else bytes(data))
    if not fn.node:
        return None
    fn_opset = opset
    for imp in fn.opset_import:
        if imp.domain in _DEFAULT_DOMAINS:
            fn_opset = int(imp.version)
    _EXPANSIONS[0] += 1
    prefix = f"__{_sanitize(node.name or node.op_type)}_f{_EXPANSIONS[0]}_"
    return _expand_function(node, fn, prefix), fn_opset


def _expand_function(node: onnx.NodeProto, fn: onnx.FunctionProto, prefix: str) -> list:
    """The function's nodes with the node's inputs, outputs and attributes substituted (as ONNX's
    own test expansion does)."""
    io = {}
    for k, formal in enumerate(fn.input):
        io[formal] = node.input[k] if k < len(node.input) else ""
    for k, formal in enumerate(fn.output):
        if k < len(node.output) and node.output[k]:
            io[formal] = node.output[k]
    attrs = {a.name: a for a in node.attribute}

    def rename(name):
        if name in io:
            return io[name]
        return "" if name == "" else prefix + name
    return [_rename_node(inner, rename, attrs, prefix) for inner in fn.node]


def _rename_node(inner, rename, attrs, prefix):
    n = onnx.NodeProto()
    n.CopyFrom(inner)
    n.ClearField("input")
    n.ClearField("output")
    n.ClearField("attribute")
    n.input.extend(rename(i) for i in inner.input)
    n.output.extend(rename(o) for o in inner.output)
    n.name = prefix + (inner.name or inner.op_type)
    for a in inner.attribute:
        if a.ref_attr_name:
            if a.ref_attr_name in attrs:
                b = onnx.AttributeProto()
                b.CopyFrom(attrs[a.ref_attr_name])
                b.name = a.name
                n.attribute.append(b)
            continue
        b = onnx.AttributeProto()
        b.CopyFrom(a)
        if a.type == onnx.AttributeProto.GRAPH:
            g = b.g
            local = {}
            for vi in list(g.input) + list(g.output):
                local[vi.name] = vi.name = prefix + vi.name
            for t in g.initializer:
                local[t.name] = t.name = prefix + t.name
            for sub in g.node:
                for o in sub.output:
                    local.setdefault(o, prefix + o)

            def sub_rename(name, local=local):
                return local.get(name) or rename(name)
            nodes = [_rename_node(x, sub_rename, attrs, prefix) for x in g.node]
            g.ClearField("node")
            g.node.extend(nodes)
        n.attribute.append(b)
    return n


def _type_proto(v: "Value") -> onnx.TypeProto:
    """A TypeProto of an imported value (for context-dependent function bodies)."""
    inv = {d: k for k, d in ONNX_DTYPES.items()}
    tp = onnx.TypeProto()
    tp.tensor_type.elem_type = lowbit.ONNX_OF[v.logical] if v.logical else \
        inv.get(v.dtype, onnx.TensorProto.FLOAT)
    shape = v.shape
    if shape is not None:
        for k, d in enumerate(shape):
            dim = tp.tensor_type.shape.dim.add()
            if isinstance(d, IntImm):
                dim.dim_value = int(d.value)
            else:
                dim.dim_param = f"d{k}"
    return tp


def from_onnx(model, shape_dict: Mapping[str, Sequence] | None = None,
              keep_params_in_input: bool = False, opset: int | None = None) -> IRModule:
    """Import an ONNX model into a Relax ``IRModule`` whose function ``main`` takes the graph
    inputs and returns the graph outputs (a tuple when there are several).

    Parameters
    ----------
    model : onnx.ModelProto | bytes | str | os.PathLike
        The model, its serialized bytes or a path to a ``.onnx`` file.
    shape_dict : dict[str, sequence], optional
        Input shapes by input name, overriding the model's: ints for static dims, names for
        symbolic dims (``{"input": ["batch", 3, 224, 224]}``; one name is one variable across all
        inputs), None for a fresh symbolic dim. Dims the model declares with ``dim_param`` stay
        symbolic under that name; dims it leaves unknown become fresh symbolic dims.
    keep_params_in_input : bool
        Float initializers (the weights) become parameters of ``main`` after the graph inputs
        instead of constants; their values are the function attribute ``"params"`` (take them out
        with ``relax.frontend.detach_params``). Integer initializers (shapes, axes, indices) stay
        constants.
    opset : int, optional
        Use this opset of the standard domain instead of the model's.

    Returns
    -------
    IRModule
        Build it with ``relax.build(mod, "llvm")``.

    Raises
    ------
    relax.frontend.UnsupportedError
        Listing every operator, operator version, attribute or value type of the model that
        cannot be imported (with node names and the opset), all at once.
    ValueError
        The model is malformed: truncated or corrupt bytes, undefined values, inconsistent
        shapes or attributes.

    Examples
    --------
    >>> import onnx
    >>> from tilecraft import relax, targets
    >>> import tilecraft.relax.frontend
    >>> mod = relax.frontend.from_onnx(onnx.load("resnet50.onnx"),
    ...                                shape_dict={"data": ["batch", 3, 224, 224]})  # doctest: +SKIP
    >>> vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))       # doctest: +SKIP
    >>> logits = vm["main"](images)                                               # doctest: +SKIP
    """
    return GraphImporter(shape_dict, keep_params_in_input, opset).import_model(model)
