"""A model's inputs on the command line: their specs, the ``NAME=VALUE`` options that shape them,
random arrays for them, and ``.npy`` / ``.npz`` files in and out.

Examples
--------
>>> parse_shapes(["input=batch,3,224,224"])
{'input': ['batch', 3, 224, 224]}
>>> InputSpec("x", ["batch", 8], "float32").concrete({"batch": 4})
(4, 8)
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tilecraft.targets.fileio import atomic_write

from .errors import CLIError


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


def exe_inputs(program: dict) -> list[InputSpec]:
    """The inputs of ``main`` in a VM program (``Executable.program``)."""
    fn = program["functions"].get("main")
    if fn is None:
        raise CLIError(f"the executable has no main function (functions: "
                       f"{', '.join(program['functions'])})")
    specs = []
    for name, spec in zip(fn["params"], fn.get("param_specs", [{}] * len(fn["params"]))):
        specs.append(InputSpec(name, [spec.get("shape_text", "?")], spec.get("dtype", "?")))
    return specs


def read_inputs(items: list[str], specs: list[InputSpec]) -> list[np.ndarray]:
    """Arrays for ``specs`` from ``--input`` items: ``FILE.npy`` (in order), ``NAME=FILE.npy``,
    or a ``.npz`` of arrays by input name."""
    names = [s.name for s in specs]
    arrays: dict[str, np.ndarray] = {}
    positional: list[np.ndarray] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = None, item
        if not os.path.exists(path):
            raise CLIError(f"--input {item}: no such file")
        try:
            data = np.load(path, allow_pickle=False)
        except Exception as err:
            raise CLIError(f"--input {item}: not a .npy / .npz file ({err})") from None
        if isinstance(data, np.lib.npyio.NpzFile):
            for k in data.files:
                if k not in names:
                    raise CLIError(f"--input {path}: the model has no input {k!r} (inputs: "
                                   f"{', '.join(names)})")
                arrays[k] = data[k]
        elif name is not None:
            if name not in names:
                raise CLIError(f"--input {item}: the model has no input {name!r} (inputs: "
                               f"{', '.join(names)})")
            arrays[name] = data
        else:
            positional.append(data)
    out = []
    for spec in specs:
        if spec.name in arrays:
            out.append(arrays[spec.name])
        elif positional:
            out.append(positional.pop(0))
        else:
            raise CLIError(f"no value for input {spec.name} {spec.shape[0]} {spec.dtype} "
                           f"(give --input {spec.name}=FILE.npy)")
    if positional:
        raise CLIError(f"{len(items)} inputs given, the model takes {len(specs)} "
                       f"({', '.join(names)})")
    return out


def write_outputs(path: str, arrays: list[np.ndarray]) -> None:
    """Write one output as ``.npy`` (several: a ``.npz`` of ``output_0``, ``output_1``, ...),
    atomically: a temporary file beside ``path``, then a rename."""
    buf = io.BytesIO()
    if len(arrays) == 1 and not path.endswith(".npz"):
        np.save(buf, arrays[0])
    else:
        if not path.endswith(".npz"):
            raise CLIError(f"--output {path}: the model has {len(arrays)} outputs; give a .npz "
                           f"file")
        np.savez(buf, **{f"output_{i}": a for i, a in enumerate(arrays)})
    atomic_write(path, buf.getvalue())


def describe_output(i: int, a: np.ndarray) -> str:
    """``"output 0: shape (5, 4) float32: [0, 2.02, ...] min 0 max 2.9 mean 0.67"``."""
    flat = a.reshape(-1)
    head = ", ".join(f"{v:.6g}" if a.dtype.kind == "f" else str(v) for v in flat[:6])
    more = ", ..." if flat.size > 6 else ""
    stats = (f" min {a.min():.6g} max {a.max():.6g} mean {a.mean():.6g}"
             if a.dtype.kind == "f" and a.size else "")
    return f"output {i}: shape {a.shape} {a.dtype}: [{head}{more}]{stats}"
