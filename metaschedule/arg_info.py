"""What a kernel takes: concrete argument shapes, deterministic random inputs, its outputs.

A tuned kernel is measured on arrays made from its ``ArgInfo`` list and a seed, on this machine or
on a board: ``random_inputs(args_info(func, {"n": 64}), seed=7)`` gives the same arrays
everywhere, so a board's outputs can be checked against a reference computed here.

Examples
--------
>>> from tilecraft.tensorir import te
>>> n = te.var("n")
>>> A = te.placeholder((n, 16), "float32", "A")
>>> B = te.compute((n, 16), lambda i, j: A[i, j] * 2.0, "B")
>>> func = te.create_prim_func([A, B])
>>> infos = args_info(func, {"n": 4})
>>> infos
[ArgInfo(shape=(4, 16), dtype='float32'), ArgInfo(shape=(4, 16), dtype='float32')]
>>> output_indices(func)
[1]
>>> [a.shape for a in random_inputs(infos, seed=0)]
[(4, 16), (4, 16)]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import IntImm, Var
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.functor import free_vars, post_order_visit, substitute
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.stmt import Block, BufferStore
from tilecraft.targets.runtime.ndarray import aligned_copy

__all__ = ["ArgInfo", "args_info", "random_inputs", "output_indices", "reference_outputs"]

# Integers are drawn from [0, INT_HIGH): small enough to be safe as indices into any
# non-empty axis of a gather-like kernel's table of at least that size, and to keep integer
# sums of products far from overflow.
INT_HIGH = 8


@dataclass(frozen=True)
class ArgInfo:
    """One kernel argument: a buffer of ``shape`` and ``dtype``, or a scalar (``shape == ()``)
    when ``scalar`` is set.

    Examples
    --------
    >>> ArgInfo((2, 3), "float32").to_json()
    [[2, 3], 'float32']
    >>> ArgInfo.from_json([[2, 3], "float32"])
    ArgInfo(shape=(2, 3), dtype='float32')
    """

    shape: tuple[int, ...]
    dtype: str
    scalar: bool = False

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if any(s < 0 for s in self.shape):
            raise ValueError(f"ArgInfo: negative extent in shape {self.shape}")
        if self.scalar and self.shape:
            raise ValueError(f"ArgInfo: a scalar argument has shape (), got {self.shape}")
        dt.check(self.dtype)

    def __repr__(self):
        extra = ", scalar=True" if self.scalar else ""
        return f"ArgInfo(shape={self.shape}, dtype={self.dtype!r}{extra})"

    def to_json(self) -> list:
        """``[shape, dtype]`` (``[shape, dtype, "scalar"]`` for a scalar): plain JSON."""
        out = [list(self.shape), self.dtype]
        return out + ["scalar"] if self.scalar else out

    @staticmethod
    def from_json(data) -> "ArgInfo":
        if not isinstance(data, (list, tuple)) or len(data) not in (2, 3) or \
                not isinstance(data[0], (list, tuple)) or not isinstance(data[1], str):
            raise ValueError(f"an ArgInfo is [shape, dtype] or [shape, dtype, 'scalar'], got "
                             f"{data!r}")
        if len(data) == 3 and data[2] != "scalar":
            raise ValueError(f"malformed ArgInfo {data!r}")
        return ArgInfo(tuple(data[0]), data[1], len(data) == 3)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * dt.itemsize(self.dtype)


def _main(func) -> PrimFunc:
    if isinstance(func, IRModule):
        if "main" in func:
            func = func["main"]
        elif len(func) == 1:
            func = next(iter(func.functions.values()))
        else:
            raise ValueError(f"the module has no 'main' function (it has {sorted(func.functions)})")
    if not isinstance(func, PrimFunc):
        raise TypeError(f"expected a PrimFunc, got {type(func).__name__}")
    return func


def _concrete(expr, values: dict, what: str) -> int:
    if isinstance(expr, int):
        return expr
    if isinstance(expr, IntImm):
        return int(expr.value)
    missing = sorted({v.name for v in free_vars(expr) if v not in values})
    if missing:
        raise ValueError(f"{what} is {expr!r}: give a value for {', '.join(missing)} in "
                         f"shape_vars")
    folded = arith.simplify(substitute(expr, values))
    if not isinstance(folded, IntImm):
        raise ValueError(f"{what} is {expr!r}, which does not fold to a constant ({folded!r})")
    return int(folded.value)


def args_info(func: "PrimFunc | IRModule", shape_vars: Mapping[str, int] | None = None
              ) -> list[ArgInfo]:
    """The concrete arguments of ``func``, in parameter order.

    Parameters
    ----------
    func : PrimFunc | IRModule
        The kernel (an IRModule's ``"main"``).
    shape_vars : dict[str, int], optional
        A value for each symbolic dimension (``{"n": 64}``).

    Raises
    ------
    ValueError
        A symbolic dimension has no value, or a value is negative.

    Examples
    --------
    >>> args_info(func, {"n": 8})       # doctest: +SKIP
    [ArgInfo(shape=(8, 16), dtype='float32'), ArgInfo(shape=(8, 16), dtype='float32')]
    """
    func = _main(func)
    shape_vars = dict(shape_vars or {})
    names = {}
    for buf in func.buffers:
        for dim in buf.shape:
            for v in free_vars(dim):
                names.setdefault(v.name, v)
    values: dict[Var, int] = {}
    for name, value in shape_vars.items():
        if name in names:
            if int(value) < 0:
                raise ValueError(f"shape variable {name} = {value} is negative")
            values[names[name]] = int(value)
    out = []
    for p in func.params:
        if p.dtype == dt.HANDLE:
            buf = func.buffer_of(p)
            shape = tuple(_concrete(d, values, f"dimension {i} of {buf.name}")
                          for i, d in enumerate(buf.shape))
            out.append(ArgInfo(shape, buf.dtype))
        else:
            out.append(ArgInfo((), p.dtype, scalar=True))
    return out


def random_inputs(infos: Sequence[ArgInfo], seed: int) -> list[np.ndarray]:
    """Deterministic random arrays for ``infos``: the same arrays for a seed on every machine.

    Floats are uniform in [-1, 1), integers uniform in [0, 8), booleans fair coins. Argument
    ``i`` is drawn from its own stream (``default_rng([seed, i])``), so one argument's values do
    not depend on the others' shapes. Scalars come back as 0-d arrays. The arrays start on a
    64-byte boundary, as the VM's buffers do, so kernels are timed on what they will run on.

    Examples
    --------
    >>> a, = random_inputs([ArgInfo((3,), "float32")], seed=1)
    >>> bool((abs(a) <= 1).all()), a.dtype.name
    (True, 'float32')
    """
    out = []
    for i, info in enumerate(infos):
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, i])
        np_dtype = dt.to_numpy(info.dtype)
        if dt.is_float(info.dtype):
            arr = rng.uniform(-1.0, 1.0, info.shape).astype(np_dtype)
        elif dt.is_bool(info.dtype):
            arr = rng.integers(0, 2, info.shape).astype(np_dtype)
        elif dt.is_integer(info.dtype):
            arr = rng.integers(0, INT_HIGH, info.shape).astype(np_dtype)
        else:
            raise ValueError(f"random_inputs: no random values for dtype {info.dtype}")
        # aligned as the VM's buffers: on numpy's 16-byte-aligned data vector loads straddle
        # cache lines (the default schedules up to 1.5x slower), and the tuner then picks
        # schedules that lose in the model
        out.append(aligned_copy(arr.reshape(info.shape)))
    return out


def output_indices(func: "PrimFunc | IRModule") -> list[int]:
    """The positions of the parameters ``func`` writes (its outputs), in parameter order.

    Examples
    --------
    >>> output_indices(func)            # doctest: +SKIP
    [1]
    """
    func = _main(func)
    written: set[int] = set()

    def visit(node):
        if isinstance(node, BufferStore):
            written.add(id(node.buffer))
        elif isinstance(node, Block):
            written.update(id(r.buffer) for r in node.writes)
    post_order_visit(func.body, visit)
    return [i for i, p in enumerate(func.params)
            if p.dtype == dt.HANDLE and id(func.buffer_of(p)) in written]


def reference_outputs(func: "PrimFunc | IRModule", infos: Sequence[ArgInfo], seed: int
                      ) -> list[np.ndarray]:
    """The outputs of ``func`` on ``random_inputs(infos, seed)``, computed with the numpy
    reference interpreter (``tensorir.interpret``); aligned with ``output_indices(func)``.

    This is what a runner's ``RunnerInput.reference`` expects. Use the unscheduled function: it
    is the oracle every candidate schedule must match.

    Examples
    --------
    >>> ref = reference_outputs(func, args_info(func, {"n": 4}), seed=0)   # doctest: +SKIP
    """
    func = _main(func)
    arrays = random_inputs(infos, seed)
    call_args = [a[()].item() if info.scalar else a for a, info in zip(arrays, infos)]
    interpret(func, *call_args)
    return [call_args[i] for i in output_indices(func)]
