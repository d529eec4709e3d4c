"""``PrimFunc`` (a loop-level function) and ``IRModule`` (a named collection of functions)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from . import dtype as dt
from .expr import Node, TIRError, Var
from .stmt import Buffer, Stmt


class PrimFunc(Node):
    """A TensorIR function.

    ``params`` are Vars: a ``handle`` Var for each buffer argument (mapped to its Buffer in
    ``buffer_map``) and integer/float Vars for scalar arguments. Symbolic dimensions of the
    buffers' shapes are bound from the arrays a caller passes.

    Examples
    --------
    >>> from tilecraft.tensorir import te
    >>> n = te.var("n")
    >>> A = te.placeholder((n,), "float32", "A")
    >>> B = te.compute((n,), lambda i: A[i] * 2.0, "B")
    >>> f = te.create_prim_func([A, B])
    >>> [b.name for b in f.buffers]
    ['A', 'B']
    """

    _fields = ("params", "buffer_map", "body", "attrs")
    __slots__ = ("params", "buffer_map", "body", "attrs")

    def __init__(self, params: Sequence[Var], body: Stmt, buffer_map: Mapping[Var, Buffer] | None = None,
                 attrs: Mapping[str, Any] | None = None):
        params = tuple(params)
        buffer_map = dict(buffer_map or {})
        for p in params:
            if not isinstance(p, Var):
                raise TIRError(f"PrimFunc parameter {p!r} must be a Var", p)
            if p.dtype == dt.HANDLE and p not in buffer_map:
                raise TIRError(f"PrimFunc handle parameter {p.name} has no buffer in buffer_map", p)
        for v in buffer_map:
            if v not in params:
                raise TIRError(f"buffer_map entry {v.name} is not a parameter", v)
        # keep the buffer map in parameter order so printing and hashing are deterministic
        ordered = tuple((p, buffer_map[p]) for p in params if p in buffer_map)
        self._init(params=params, buffer_map=ordered, body=body,
                   attrs=tuple(sorted(dict(attrs or {}).items())))

    def replace(self, **changes):
        kwargs = dict(params=self.params, body=self.body, buffer_map=dict(self.buffer_map),
                      attrs=dict(self.attrs))
        if "buffer_map" in changes:
            changes["buffer_map"] = dict(changes["buffer_map"])
        if "attrs" in changes:
            changes["attrs"] = dict(changes["attrs"])
        kwargs.update(changes)
        return PrimFunc(**kwargs)

    @property
    def buffers(self) -> list[Buffer]:
        """The buffer parameters, in order."""
        return [b for _, b in self.buffer_map]

    @property
    def scalar_params(self) -> list[Var]:
        """The non-buffer parameters, in order."""
        return [p for p in self.params if p.dtype != dt.HANDLE]

    @property
    def attr_dict(self) -> dict:
        return dict(self.attrs)

    def with_attr(self, key: str, value) -> "PrimFunc":
        attrs = self.attr_dict
        attrs[key] = value
        return self.replace(attrs=attrs)

    def buffer_of(self, param: Var) -> Buffer:
        for p, b in self.buffer_map:
            if p is param:
                return b
        raise KeyError(param.name)


class IRModule(Node):
    """A collection of functions by name: ``mod["main"]``, ``mod.functions``.

    Examples
    --------
    >>> mod = IRModule({"main": f})          # doctest: +SKIP
    >>> mod["main"] is f                     # doctest: +SKIP
    True
    """

    _fields = ("functions",)
    __slots__ = ("functions",)

    def __init__(self, functions: Mapping[str, Any] | None = None):
        self._init(functions=dict(functions or {}))

    def __getitem__(self, name: str):
        try:
            return self.functions[name]
        except KeyError:
            raise KeyError(f"IRModule has no function {name!r}; it has {sorted(self.functions)}") \
                from None

    def __contains__(self, name: str) -> bool:
        return name in self.functions

    def __iter__(self):
        return iter(self.functions.items())

    def __len__(self):
        return len(self.functions)

    def with_function(self, name: str, func) -> "IRModule":
        """A new module with ``name`` set to ``func``."""
        funcs = dict(self.functions)
        funcs[name] = func
        return IRModule(funcs)

    def get_global_vars(self) -> list[str]:
        return sorted(self.functions)

    @staticmethod
    def from_expr(func, name: str = "main") -> "IRModule":
        return IRModule({name: func})


def as_module(func_or_mod, name: str = "main") -> IRModule:
    """Wrap a PrimFunc in an IRModule (named by its ``global_symbol`` attr or ``name``)."""
    if isinstance(func_or_mod, IRModule):
        return func_or_mod
    if isinstance(func_or_mod, PrimFunc):
        return IRModule({func_or_mod.attr_dict.get("global_symbol", name): func_or_mod})
    raise TIRError(f"expected a PrimFunc or IRModule, got {type(func_or_mod).__name__}", func_or_mod)
