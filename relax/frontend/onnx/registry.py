"""The table of ONNX operator converters.

Each standard-domain operator the frontend imports has one converter, registered with
``@converter("Relu")``. A converter is ``fn(ctx, node) -> outputs``: ``ctx`` is the importer's
``GraphContext`` (inputs as Relax expressions or import-time values, the BlockBuilder), ``node``
an ``OnnxNode`` (attributes decoded, ``node.version`` the operator version in effect at the
model's opset). It returns one Relax expression, or a list of them (one per output, None for
outputs it does not make), or ``Known`` values computed at import time.

A converter may declare:

* ``const_inputs``: input positions that must be known when the model is imported (an initializer,
  a ``Constant``, or computed from them and from shapes), because they decide the rank or the
  structure of the result (``ReduceSum``'s ``axes``, ``Split``'s ``split``);
* ``check(node) -> list[str]``: attribute values it cannot import, found before conversion so that
  ``UnsupportedError`` lists every problem of the model at once;
* ``since``: the first opset it supports (default 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

from tilecraft.tensorir import dtype as dt


class ConversionError(ValueError):
    """A node that cannot be converted although its operator is supported: a bad attribute value
    or incompatible input shapes. The importer adds the node name, op type and opset."""


class NeedsConstant(Exception):
    """Raised by ``GraphContext.known_ints`` when an input that must be known at import time is
    computed at run time; the importer reports it as an unsupported use."""

    def __init__(self, what: str, value_name: str):
        super().__init__(what)
        self.what = what
        self.value_name = value_name


# ONNX TensorProto.DataType -> tilecraft dtype; the others (strings, bfloat16, float8, 4-bit and
# 2-bit types, complex) have no tilecraft dtype.
ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.INT8: "int8", onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32", onnx.TensorProto.UINT64: "uint64",
}


def onnx_dtype_name(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"data type {elem_type}"


def supported_elem_type(elem_type: int) -> bool:
    """A tilecraft dtype, or a type carried in a storage dtype (``lowbit.py``)."""
    from . import lowbit
    return elem_type in ONNX_DTYPES or lowbit.format_of(elem_type) is not None


def to_dtype(elem_type: int, where: str) -> str:
    """The tilecraft dtype (the storage dtype for the ``lowbit`` types) of an ONNX element
    type; ``ConversionError`` for those we lack."""
    from . import lowbit
    fmt = lowbit.format_of(elem_type)
    if fmt is not None:
        return fmt.storage
    try:
        return ONNX_DTYPES[elem_type]
    except KeyError:
        raise ConversionError(f"{where}: the element type {onnx_dtype_name(elem_type)} has no "
                              f"tilecraft dtype (supported: float16/32/64, bool, int8-64, "
                              f"uint8-64)") from None


def to_numpy(tensor: onnx.TensorProto, where: str) -> np.ndarray:
    """A TensorProto's data (raw, typed or external); ``ValueError`` when it is malformed.
    Types without a tilecraft dtype (bfloat16, float8, 4- and 2-bit) come in their storage
    dtype (``lowbit.py``)."""
    from . import lowbit
    fmt = lowbit.format_of(tensor.data_type)
    if tensor.data_type not in ONNX_DTYPES and fmt is None:
        raise ConversionError(f"{where}: the element type {onnx_dtype_name(tensor.data_type)} "
                              f"has no tilecraft dtype")
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise ValueError(f"{where}: the tensor's data is stored in an external file that was not "
                         f"loaded; load the model with onnx.load(path, load_external_data=True)")
    try:
        arr = numpy_helper.to_array(tensor)
    except Exception as err:
        raise ValueError(f"{where}: the tensor data is invalid or truncated "
                         f"(dims {list(tensor.dims)}): {err}") from None
    expected = int(np.prod(tensor.dims, dtype=np.int64)) if len(tensor.dims) else 1
    if arr.size != expected:
        raise ValueError(f"{where}: the tensor holds {arr.size} values but its dims "
                         f"{list(tensor.dims)} need {expected} (truncated data)")
    if fmt is not None:
        return lowbit.to_storage(arr, fmt)
    want = np.dtype(dt.to_numpy(ONNX_DTYPES[tensor.data_type]))
    if arr.dtype != want:
        arr = arr.astype(want)
    return np.require(arr, requirements="C")


def decode_attribute(attr: AttributeProto, where: str) -> Any:
    """An attribute's Python value (ints, floats, strings as str, tensors as numpy, graphs)."""
    t = attr.type
    if t == AttributeProto.FLOAT:
        return float(attr.f)
    if t == AttributeProto.INT:
        return int(attr.i)
    if t == AttributeProto.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if t == AttributeProto.TENSOR:
        return to_numpy(attr.t, f"{where}: attribute {attr.name}")
    if t == AttributeProto.GRAPH:
        return attr.g
    if t == AttributeProto.FLOATS:
        return [float(v) for v in attr.floats]
    if t == AttributeProto.INTS:
        return [int(v) for v in attr.ints]
    if t == AttributeProto.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in attr.strings]
    if t == AttributeProto.TENSORS:
        return [to_numpy(x, f"{where}: attribute {attr.name}") for x in attr.tensors]
    if t == AttributeProto.GRAPHS:
        return list(attr.graphs)
    if t == AttributeProto.SPARSE_TENSOR:
        raise ConversionError(f"{where}: sparse tensor attribute {attr.name} is not supported")
    raise ConversionError(f"{where}: attribute {attr.name} has no value type set")


class OnnxNode:
    """A NodeProto with its attributes decoded and its operator version resolved."""

    __slots__ = ("proto", "op_type", "domain", "name", "inputs", "outputs", "attrs", "version",
                 "opset")

    def __init__(self, proto: onnx.NodeProto, opset: int, version: int, name: str):
        self.proto = proto
        self.op_type = proto.op_type
        self.domain = proto.domain
        self.name = name
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        self.opset = opset
        self.version = version
        self.attrs = {}
        for a in proto.attribute:
            if a.ref_attr_name:
                raise ConversionError(f"{self.describe()}: attribute {a.name} refers to a function "
                                      f"attribute ({a.ref_attr_name}), only valid inside ONNX "
                                      f"functions")
            self.attrs[a.name] = decode_attribute(a, self.describe())

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type}, opset {self.opset})"

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def has_input(self, i: int) -> bool:
        """Optional inputs are missing or named ''."""
        return i < len(self.inputs) and self.inputs[i] != ""

    def has_output(self, i: int) -> bool:
        return i < len(self.outputs) and self.outputs[i] != ""

    def __repr__(self):
        return f"OnnxNode({self.describe()})"


@dataclass
class Converter:
    op_type: str
    fn: Callable
    const_inputs: dict = field(default_factory=dict)   # position -> what it is ("axes")
    check: Callable | None = None
    since: int = 1
    family: str = ""
    doc: str = ""


CONVERTERS: dict[str, Converter] = {}


def converter(*op_types: str, const_inputs: dict | None = None, check: Callable | None = None,
              since: int = 1, family: str = "", doc: str = ""):
    """Register ``fn`` as the converter of the ONNX operators ``op_types`` (standard domain)."""
    def wrap(fn):
        for op_type in op_types:
            CONVERTERS[op_type] = Converter(op_type, fn, dict(const_inputs or {}), check, since,
                                            family or fn.__module__.rsplit(".", 1)[-1],
                                            doc or (fn.__doc__ or "").strip().split("\n")[0])
        return fn
    return wrap


# operators of other domains (onnxruntime's com.microsoft): (domain, op_type) -> Converter
CONTRIB_CONVERTERS: dict[tuple[str, str], Converter] = {}


def contrib_converter(domain: str, op_type: str, check: Callable | None = None,
                      family: str = "", doc: str = ""):
    """Register ``fn`` as the converter of ``op_type`` of the operator domain ``domain``
    (``"com.microsoft"``); such nodes have no ONNX schema, their version is 1."""
    def wrap(fn):
        CONTRIB_CONVERTERS[(domain, op_type)] = Converter(
            op_type, fn, {}, check, 1, family or fn.__module__.rsplit(".", 1)[-1],
            doc or (fn.__doc__ or "").strip().split("\n")[0])
        return fn
    return wrap


def supported_ops() -> dict[str, Converter]:
    """The standard-domain operators the frontend imports, by op type."""
    return dict(sorted(CONVERTERS.items()))
