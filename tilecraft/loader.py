"""Loading models for the command line: ONNX files and saved ``torch.export`` programs.

``load_model(path, shapes)`` returns a ``LoadedModel``: the Relax module, what its inputs are,
and (for ``bench``) how to run the original with its own framework.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

TORCH_SUFFIXES = (".pt2", ".ep")


class CLIError(Exception):
    """A problem the command line reports in one line (exit status 1)."""


@dataclass
class InputSpec:
    """One input of a model: its name, shape (ints and symbolic dim names) and dtype."""

    name: str
    shape: list
    dtype: str

    def concrete(self, dims: dict[str, int]) -> tuple[int, ...]:
        out = []
        for d in self.shape:
            if isinstance(d, int):
                out.append(d)
            else:
                out.append(int(dims.get(str(d), 1)))
        return tuple(out)

    def shape_text(self) -> str:
        return "(" + ", ".join(str(d) for d in self.shape) + ")"


@dataclass
class LoadedModel:
    path: str
    kind: str                      # "onnx" or "torch"
    mod: object                    # relax IRModule
    inputs: list[InputSpec]
    source: object = field(repr=False, default=None)   # onnx.ModelProto / ExportedProgram


def parse_assignments(items: Sequence[str] | None, what: str) -> dict[str, str]:
    """``["a=1", "b=x,y"]`` -> ``{"a": "1", "b": "x,y"}``."""
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise CLIError(f"{what} {item!r} is not NAME=VALUE")
        out[name] = value
    return out


def parse_shapes(items: Sequence[str] | None) -> dict[str, list]:
    """``--shape input=batch,3,224,224`` -> ``{"input": ["batch", 3, 224, 224]}``."""
    out = {}
    for name, value in parse_assignments(items, "--shape").items():
        dims = []
        for d in value.split(","):
            d = d.strip()
            if not d:
                raise CLIError(f"--shape {name}={value}: an empty dim")
            dims.append(int(d) if d.lstrip("-").isdigit() else d)
        for d in dims:
            if isinstance(d, int) and d < 0:
                raise CLIError(f"--shape {name}={value}: a negative dim")
            if isinstance(d, str) and not d.replace("_", "a").isalnum():
                raise CLIError(f"--shape {name}={value}: {d!r} is neither an int nor a name")
        out[name] = dims
    return out


def parse_ints(items: Sequence[str] | None, what: str) -> dict[str, int]:
    """``--upper-bound batch=64`` -> ``{"batch": 64}``."""
    out = {}
    for name, value in parse_assignments(items, what).items():
        try:
            out[name] = int(value)
        except ValueError:
            raise CLIError(f"{what} {name}={value}: {value!r} is not an int") from None
        if out[name] < 0:
            raise CLIError(f"{what} {name}={value}: must not be negative")
    return out


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
    from tilecraft.relax import TensorStructInfo
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
        import onnx
        from tilecraft.relax.frontend import from_onnx
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
    try:
        import torch
    except ImportError:
        raise CLIError(f"{path}: loading a torch.export program needs PyTorch "
                       f"(pip install 'tilecraft[torch]')") from None
    from tilecraft.relax.frontend import from_torch
    try:
        ep = torch.export.load(path)
    except Exception as err:
        raise CLIError(f"{path}: not a torch.export program ({type(err).__name__}: {err})") \
            from None
    mod = from_torch(ep)
    return LoadedModel(path, kind, mod, main_inputs(mod), ep)


def random_inputs(inputs: list[InputSpec], dims: dict[str, int], seed: int = 0,
                  int_range: tuple[int, int] = (0, 2)) -> list[np.ndarray]:
    """Random arrays for ``inputs``: normal floats, ints in ``int_range``, random bools."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in inputs:
        shape = spec.concrete(dims)
        if spec.dtype.startswith("float"):
            out.append(rng.standard_normal(shape).astype(spec.dtype))
        elif spec.dtype == "bool":
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(rng.integers(int_range[0], int_range[1], size=shape).astype(spec.dtype))
    return out
