"""Values of the Relax VM, shared by the VM and its CPU and GPU tensor operations.

* **Arguments.** ``to_vm_value`` converts a caller's argument (numpy array, ``NDArray``, int,
  tuple...) to a VM value, checking its kind against the parameter's spec;
  ``VMArgumentError`` is what a wrong argument raises.
* **Shape expressions.** A program's shape expressions are ints, ``["r", reg]`` (a symbolic
  variable's register) or ``[op, operands...]`` with op one of ``add sub mul floordiv floormod
  div mod min max lt le eq ne gt ge and or not select cast``. ``compile_expr`` and
  ``compile_shape`` turn them into constants or closures over the register file, once, when
  an instruction is decoded.
* **Storage.** ``StoragePool`` keeps free buffers by byte size for dynamic storages.

This module needs only numpy and the ``targets`` runtime: it runs on the board.

Examples
--------
>>> compile_expr(["mul", ["r", 1], 4])[1]([None, 3])
12
>>> compile_shape([2, ["add", ["r", 1], 1]])[1]([None, 3])
(2, 4)
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tilecraft.errors import TilecraftError
from tilecraft.targets.runtime.ndarray import NDArray

from .vm_builtins import ALIGNMENT, aligned_bytes, as_ndarray

__all__ = ["VMArgumentError", "to_vm_value", "describe", "compile_expr", "compile_shape",
           "as_closure", "StoragePool"]


class VMArgumentError(TilecraftError, ValueError, TypeError):
    """Arguments that do not match a function's signature: count, kind, rank, dtype or a
    dimension. A ``ValueError`` (and a ``TypeError`` for a wrong count or kind)."""


# ---------------------------------------------------------------------------------------------
# arguments


def to_vm_value(x, spec: dict, fname: str, what: str):
    """A caller's argument ``x`` as a VM value (numpy arrays become CPU ``NDArray``s), its kind
    checked against ``spec`` (``{"kind": "tensor" | "tuple" | "shape" | "prim" | ...}``).

    Raises ``VMArgumentError`` naming the function ``fname`` and the argument ``what``.
    """
    kind = spec["kind"]
    if kind == "tensor":
        if type(x) is NDArray:
            if x.device.kind != "cpu":
                raise VMArgumentError(f"{fname}: {what} lives on {x.device}; this VM runs on the "
                                      f"CPU")
            return x
        if isinstance(x, np.ndarray):
            if not x.flags.c_contiguous or not x.flags.aligned or not x.dtype.isnative:
                x = np.require(x.astype(x.dtype.newbyteorder("="), copy=False), requirements=["C", "A"])
            return as_ndarray(x)
        if isinstance(x, NDArray):
            return x
        raise VMArgumentError(f"{fname}: {what} must be a tensor (numpy array or NDArray), got "
                              f"{type(x).__name__}")
    if kind == "tuple":
        if not isinstance(x, (tuple, list)):
            raise VMArgumentError(f"{fname}: {what} must be a tuple of {len(spec['fields'])}, "
                                  f"got {type(x).__name__}")
        if len(x) != len(spec["fields"]):
            raise VMArgumentError(f"{fname}: {what} must be a tuple of {len(spec['fields'])}, "
                                  f"got one of {len(x)}")
        return tuple(to_vm_value(v, s, fname, f"{what}[{i}]")
                     for i, (v, s) in enumerate(zip(x, spec["fields"])))
    if kind == "shape":
        if not isinstance(x, (tuple, list)) or not all(isinstance(v, (int, np.integer))
                                                        for v in x):
            raise VMArgumentError(f"{fname}: {what} must be a shape (a tuple of ints), got "
                                  f"{x!r}")
        return tuple(int(v) for v in x)
    if kind == "prim":
        if isinstance(x, np.ndarray) and x.ndim == 0:
            x = x[()]
        if isinstance(x, NDArray) and x.ndim == 0:
            x = x.numpy()[()]
        if not isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)):
            raise VMArgumentError(f"{fname}: {what} must be a scalar ({spec.get('dtype')}), got "
                                  f"{type(x).__name__}")
        return x.item() if isinstance(x, np.generic) else x
    # no static information: arrays become tensors, sequences tuples
    if isinstance(x, np.ndarray):
        return to_vm_value(x, {"kind": "tensor"}, fname, what)
    if isinstance(x, (tuple, list)):
        return tuple(to_vm_value(v, spec, fname, f"{what}[{i}]") for i, v in enumerate(x))
    return x


def describe(v) -> str:
    """A short description of a VM value for error messages: ``a tensor of shape (2, 3)``."""
    if isinstance(v, NDArray):
        return f"a tensor of shape {v.shape}"
    if isinstance(v, tuple):
        return f"a tuple of {len(v)}"
    return type(v).__name__


# ---------------------------------------------------------------------------------------------
# shape expressions


def _truncdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _truncmod(a, b):
    return a - _truncdiv(a, b) * b


_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
    "div": _truncdiv, "mod": _truncmod, "min": min, "max": max,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "and": lambda a, b: bool(a) and bool(b), "or": lambda a, b: bool(a) or bool(b),
}


def _cast(dtype: str, v):
    if dtype == "bool":
        return bool(v)
    if dtype.startswith("float"):
        return float(v)
    return int(v)


def compile_expr(e) -> tuple[bool, Any]:
    """``(is_constant, value or closure(regs))`` for a shape expression of the program.

    Examples
    --------
    >>> compile_expr(["add", 2, 3])
    (True, 5)
    """
    if isinstance(e, (bool, int, float)):
        return True, e
    if not isinstance(e, list) or not e:
        raise ValueError(f"malformed shape expression {e!r} in the VM program")
    op = e[0]
    if op == "r":
        reg = e[1]
        return False, lambda regs: regs[reg]
    if op == "cast":
        c, a = compile_expr(e[2])
        dtype = e[1]
        if c:
            return True, _cast(dtype, a)
        return False, lambda regs: _cast(dtype, a(regs))
    if op == "not":
        c, a = compile_expr(e[1])
        return (True, not a) if c else (False, lambda regs: not a(regs))
    if op == "select":
        parts = [compile_expr(x) for x in e[1:4]]
        fs = [(lambda regs, v=v: v) if c else v for c, v in parts]
        cond, t, f = fs
        return False, lambda regs: t(regs) if cond(regs) else f(regs)
    fn = _BINARY.get(op)
    if fn is None or len(e) != 3:
        raise ValueError(f"unknown shape expression operator {op!r} in the VM program")
    (ca, a), (cb, b) = compile_expr(e[1]), compile_expr(e[2])
    if ca and cb:
        return True, fn(a, b)
    if op in ("floordiv", "floormod", "div", "mod"):
        fa = (lambda regs: a) if ca else a
        fb = (lambda regs: b) if cb else b

        def divide(regs):
            d = fb(regs)
            if d == 0:
                raise ValueError(f"division by zero in the shape expression {e!r}")
            return fn(fa(regs), d)
        return False, divide
    if ca:
        return False, lambda regs: fn(a, b(regs))
    if cb:
        return False, lambda regs: fn(a(regs), b)
    return False, lambda regs: fn(a(regs), b(regs))


def compile_shape(exprs) -> tuple[bool, Any]:
    """``(is_constant, tuple or closure(regs) -> tuple of ints)``."""
    parts = [compile_expr(e) for e in exprs]
    if all(c for c, _ in parts):
        return True, tuple(int(v) for _, v in parts)
    fs = tuple((lambda regs, v=v: v) if c else v for c, v in parts)
    if len(fs) == 1:
        f0 = fs[0]
        return False, lambda regs: (f0(regs),)
    if len(fs) == 2:
        f0, f1 = fs
        return False, lambda regs: (f0(regs), f1(regs))
    return False, lambda regs: tuple(f(regs) for f in fs)


def as_closure(compiled: tuple[bool, Any]) -> Callable:
    """A closure ``regs -> value`` of ``compile_expr``'s result, constant or not."""
    c, v = compiled
    return (lambda regs: v) if c else v


# ---------------------------------------------------------------------------------------------
# storage


class StoragePool:
    """Free buffers keyed by byte size: dynamic storages come from here and go back at the end
    of the call that took them.

    ``allocate(nbytes)`` makes a new buffer of ``nbytes`` bytes (by default 64-byte aligned host
    memory; the GPU VM's are device arrays); sizes are rounded up to a multiple of ``align``,
    so that a buffer given back (keyed by its ``nbytes``) serves every request of its rounded
    size.
    """

    def __init__(self, allocate: Callable[[int], Any] | None = None, align: int = ALIGNMENT):
        if allocate is None:
            def allocate(nbytes: int) -> np.ndarray:
                return aligned_bytes(nbytes)[0]
        self.allocate, self.align = allocate, align
        self.free: dict[int, list] = {}
        self.allocated_bytes = 0

    def take(self, nbytes: int):
        align = self.align
        nbytes = max(align, (int(nbytes) + align - 1) // align * align)
        lst = self.free.get(nbytes)
        if lst:
            return lst.pop()
        self.allocated_bytes += nbytes
        return self.allocate(nbytes)

    def give(self, buf) -> None:
        self.free.setdefault(buf.nbytes, []).append(buf)
