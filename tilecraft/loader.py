"""Loading models for the command line: ONNX files and saved ``torch.export`` programs.

``load_model(path, shapes)`` returns a ``LoadedModel``: the Relax module, what its inputs are,
and (for ``bench``) how to run the original with its own framework.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import onnx

from tilecraft.relax import TensorStructInfo
from tilecraft.relax.frontend import from_onnx, from_torch

from .errors import CLIError, require
from .inputs import InputSpec

TORCH_SUFFIXES = (".pt2", ".ep")


@dataclass
class LoadedModel:
    """An imported model: its Relax module, its inputs, and the original (``source``) for the
    peer of ``tilecraft bench``."""

    path: str
    kind: str                      # "onnx" or "torch"
    mod: object                    # relax IRModule
    inputs: list[InputSpec]
    source: object = field(repr=False, default=None)   # onnx.ModelProto / ExportedProgram


def model_kind(path: str) -> str:
    low = path.lower()
    if low.endswith(".onnx"):
        return "onnx"
    if low.endswith(TORCH_SUFFIXES):
        return "torch"
    raise CLIError(f"{path}: unknown model format (expected .onnx, or .pt2 from "
                   f"torch.export.save)")


def main_inputs(mod) -> list[InputSpec]:
    """The parameters of ``main`` as ``InputSpec``s."""
    func = mod["main"]
    n = func.attr_dict.get("num_input", len(func.params))
    out = []
    for p in func.params[:n]:
        si = p.struct_info
        if not isinstance(si, TensorStructInfo) or si.shape is None:
            out.append(InputSpec(p.name_hint, [], getattr(si, "dtype", "float32")))
            continue
        shape = []
        for d in si.shape:
            c = getattr(d, "value", None)
            shape.append(int(c) if c is not None and not hasattr(d, "name") else str(d))
        out.append(InputSpec(p.name_hint, shape, si.dtype))
    return out


def load_model(path: str, shapes: dict[str, list] | None = None) -> LoadedModel:
    """Import ``path`` (``.onnx`` or a ``torch.export.save`` file) into Relax."""
    if not os.path.exists(path):
        raise CLIError(f"{path}: no such file")
    kind = model_kind(path)
    if kind == "onnx":
        try:
            model = onnx.load(path)
        except Exception as err:  # protobuf's DecodeError and friends
            raise CLIError(f"{path}: not a valid ONNX file ({type(err).__name__}: {err})") \
                from None
        graph_inputs = [i.name for i in model.graph.input
                        if i.name not in {t.name for t in model.graph.initializer}]
        for name in shapes or {}:
            if name not in graph_inputs:
                raise CLIError(f"--shape {name}: the model has no input {name!r} (inputs: "
                               f"{', '.join(graph_inputs)})")
        mod = from_onnx(model, shape_dict=shapes or None)
        return LoadedModel(path, kind, mod, main_inputs(mod), model)
    if shapes:
        raise CLIError("--shape is for ONNX models: a torch.export program has its shapes "
                       "(declare dynamic dims with dynamic_shapes when exporting)")
    torch = require("torch", f"loading the torch.export program {path}")
    try:
        ep = torch.export.load(path)
    except Exception as err:
        raise CLIError(f"{path}: not a torch.export program ({type(err).__name__}: {err})") \
            from None
    mod = from_torch(ep)
    return LoadedModel(path, kind, mod, main_inputs(mod), ep)
