"""``IndexMap``: a function from the indices of a buffer to the indices of its new layout.

``transform_layout`` rewrites a buffer through an index map; the map also computes the new
buffer's shape (``map_shape``), and, for the affine splits, fuses and permutations that layout
changes are made of, its inverse. An index map is plain data: ``to_json`` stores its expressions
as a small JSON tree, so it travels in schedule traces.

Examples
--------
>>> from tilecraft.tensorir.schedule.index_map import IndexMap
>>> m = IndexMap.from_func(lambda i, j: [i // 16, j, i % 16])
>>> m
IndexMap(lambda i, j: (i // 16, j, i % 16))
>>> [int(s.value) for s in m.map_shape([40, 8])]     # 40 rows pad to 3 blocks of 16
[3, 8, 16]
"""
from __future__ import annotations

import inspect
from typing import Callable, Sequence

from .. import arith
from .. import dtype as dt
from ..expr import (Add, And, BinaryOp, BufferLoad, Call, Cast, Div, EQ, FloatImm, FloorDiv,
                    FloorMod, GE, GT, IntImm, LE, LT, Max, Min, Mod, Mul, NE, Not, Or, PrimExpr,
                    Select, Sub, TIRError, Var, convert)
from ..functor import free_vars, post_order_visit, substitute
from ..stmt import Range
from ..structural import structural_equal


class IndexMap:
    """A map ``(i0, ..., i{n-1}) -> (e0, ..., e{m-1})`` of buffer indices.

    Parameters
    ----------
    initial_indices : sequence of Var
        The variables standing for the old indices.
    final_indices : sequence of PrimExpr
        The new indices, as integer expressions of ``initial_indices`` (and possibly of free
        symbolic variables such as shape dims).

    Examples
    --------
    >>> m = IndexMap.from_func(lambda k, n: [n // 16, k, n % 16])   # pack a [k, n] weight
    >>> m.map_indices([3, 37])
    [2, 3, 5]
    """

    __slots__ = ("initial_indices", "final_indices")

    def __init__(self, initial_indices: Sequence[Var], final_indices: Sequence):
        initial = tuple(initial_indices)
        for v in initial:
            if not isinstance(v, Var):
                raise TIRError(f"IndexMap: initial index {v!r} must be a Var", v)
        if len({id(v) for v in initial}) != len(initial):
            raise TIRError("IndexMap: the initial indices must be distinct variables")
        final = []
        for e in final_indices:
            e = convert(e) if not isinstance(e, PrimExpr) else e
            if isinstance(e, IntImm) and e.dtype != "int64" and dt.is_integer(e.dtype):
                e = IntImm(e.value, "int64")
            if not dt.is_integer(e.dtype):
                raise TIRError(f"IndexMap: final index {e!r} must be an integer expression", e)
            loads = []
            post_order_visit(e, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
            if loads:
                raise TIRError(f"IndexMap: final index {e!r} reads a buffer; index maps are pure "
                               f"index arithmetic", e)
            final.append(e)
        object.__setattr__(self, "initial_indices", initial)
        object.__setattr__(self, "final_indices", tuple(final))

    def __setattr__(self, name, value):
        raise AttributeError("IndexMap is immutable")

    # -- construction -----------------------------------------------------------------------------

    @staticmethod
    def from_func(func: Callable, ndim: int | None = None, index_dtype: str = "int64") -> "IndexMap":
        """Build a map from a Python function of the old indices.

        Parameters
        ----------
        func : callable
            Takes one Var per old index and returns the new indices (a list or tuple of
            expressions/ints, or a single expression).
        ndim : int, optional
            The number of old indices, when ``func`` takes ``*args``.
        index_dtype : str
            The dtype of the index variables (int64, as all index arithmetic here).

        Examples
        --------
        >>> IndexMap.from_func(lambda i, j: [j, i])
        IndexMap(lambda i, j: (j, i))
        """
        if isinstance(func, IndexMap):
            return func
        if not callable(func):
            raise TIRError(f"IndexMap.from_func: expected a callable, got {func!r}")
        names: list[str]
        try:
            params = list(inspect.signature(func).parameters.values())
        except (TypeError, ValueError):
            params = []
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
        if ndim is None:
            if varargs:
                raise TIRError("IndexMap.from_func: the function takes *args; pass ndim")
            names = [p.name for p in positional]
        else:
            names = [p.name for p in positional[:ndim]] + [f"i{d}" for d in
                                                            range(len(positional), ndim)]
        ivars = [Var(n, index_dtype) for n in names]
        out = func(*ivars)
        if isinstance(out, (PrimExpr, int)):
            out = [out]
        try:
            out = list(out)
        except TypeError:
            raise TIRError(f"IndexMap.from_func: the function returned {out!r}; return a list of "
                           f"index expressions") from None
        return IndexMap(ivars, out)

    # -- queries ----------------------------------------------------------------------------------

    @property
    def ndim_in(self) -> int:
        return len(self.initial_indices)

    @property
    def ndim_out(self) -> int:
        return len(self.final_indices)

    def free_vars(self) -> list[Var]:
        """Variables of the final indices other than the initial indices (e.g. shape dims)."""
        own = {id(v) for v in self.initial_indices}
        out: dict[int, Var] = {}
        for e in self.final_indices:
            for v in free_vars(e):
                if id(v) not in own:
                    out.setdefault(id(v), v)
        return list(out.values())

    def substitute_free(self, vmap: dict) -> "IndexMap":
        """This map with free variables replaced (``{Var: expr}``)."""
        if not vmap:
            return self
        return IndexMap(self.initial_indices, [substitute(e, vmap) for e in self.final_indices])

    def map_indices(self, indices: Sequence, analyzer: arith.Analyzer | None = None) -> list:
        """The new indices of the element at ``indices`` (simplified).

        Examples
        --------
        >>> from tilecraft.tensorir import var
        >>> i = var("i")
        >>> IndexMap.from_func(lambda a, b: [a // 16, b, a % 16]).map_indices([i * 16 + 3, 7])
        [i, 7, 3]
        """
        indices = [convert(i) for i in indices]
        if len(indices) != self.ndim_in:
            raise TIRError(f"IndexMap {self}: {len(indices)} indices given for a map of "
                           f"{self.ndim_in}")
        ana = analyzer or arith.Analyzer()
        vmap = {v: (i if i.dtype == v.dtype else i.astype(v.dtype))
                for v, i in zip(self.initial_indices, indices)}
        return [ana.simplify(substitute(e, vmap)) for e in self.final_indices]

    def map_ranges(self, ranges: Sequence[Range],
                   analyzer: arith.Analyzer | None = None) -> list[Range] | None:
        """The smallest box holding the image of the box ``ranges``; None where unbounded."""
        ana = analyzer or arith.Analyzer()
        if all(isinstance(r.extent, IntImm) and r.extent.value == 1 for r in ranges):
            return [Range(p, IntImm(1, "int64")) for p in self.map_indices([r.min for r in ranges],
                                                                            ana)]
        dom = {v: r for v, r in zip(self.initial_indices, ranges)}
        out = []
        for e in self.final_indices:
            s = ana.int_set(e, dom)
            if not s.is_bounded():
                return None
            out.append(ana.to_range(s))
        return out

    def map_shape(self, shape: Sequence, analyzer: arith.Analyzer | None = None) -> list[PrimExpr]:
        """The shape of the new layout of a buffer of ``shape``: one past the largest value of
        each new index over the old index space. A map that does not divide the shape gets the
        rounded-up extent (``i // 16`` over ``n`` rows gives ``ceildiv(n, 16)``); the extra
        elements are padding.

        Examples
        --------
        >>> from tilecraft.tensorir import var
        >>> n = var("n")
        >>> IndexMap.from_func(lambda i, j: [i // 16, j, i % 16]).map_shape([n, 8])
        [(n + 15) // 16, 8, 16]
        """
        shape = [convert(s) for s in shape]
        if len(shape) != self.ndim_in:
            raise TIRError(f"IndexMap {self}: a shape of {len(shape)} dimensions given for a map "
                           f"of {self.ndim_in}")
        ana = analyzer or arith.Analyzer()
        dom = {v: Range(IntImm(0, v.dtype), s.astype(v.dtype))
               for v, s in zip(self.initial_indices, shape)}
        out = []
        for d, e in enumerate(self.final_indices):
            s = ana.int_set(e, dom)
            if not s.is_bounded():
                raise TIRError(f"IndexMap {self}: new index {d} ({e!r}) is unbounded over the "
                               f"shape {shape}", e)
            if not ana.can_prove(s.min_value >= 0):
                raise TIRError(f"IndexMap {self}: new index {d} ({e!r}) may be negative (its "
                               f"smallest value is {s.min_value!r})", e)
            out.append(ana.simplify(s.max_value + 1))
        return out

    # -- inverse ----------------------------------------------------------------------------------

    def inverse(self, shape: Sequence) -> "IndexMap":
        """The inverse map, for a map that is a bijection from ``shape`` onto ``map_shape(shape)``.

        Works for the affine maps layouts are made of: splits (``i // c``, ``i % c``), fuses
        (``i * c + j``) and permutations, with constant factors. Raises ``TIRError`` when the map
        is not of that kind or pads (use ``non_surjective_inverse``).

        Examples
        --------
        >>> m = IndexMap.from_func(lambda i, j: [i // 16, j, i % 16])
        >>> m.inverse([64, 8])
        IndexMap(lambda i0, i1, i2: (i0 * 16 + i2, i1))
        """
        inv, shape, new_shape, ana = self._inverse(shape)
        old = 1
        new = 1
        for s in shape:
            old = old * s
        for s in new_shape:
            new = new * s
        if not ana.can_prove_equal(convert(old), convert(new)):
            raise TIRError(f"IndexMap {self}: not a bijection over {list(shape)} (the new shape "
                           f"{list(new_shape)} has padding); use non_surjective_inverse")
        return inv

    def non_surjective_inverse(self, shape: Sequence) -> tuple["IndexMap", PrimExpr]:
        """The inverse on the image, and the predicate (over the new indices) that is true exactly
        on padding: the elements of the new layout no old index maps to.

        Examples
        --------
        >>> m = IndexMap.from_func(lambda i: [i // 16, i % 16])
        >>> inv, pad = m.non_surjective_inverse([40])
        >>> pad
        40 <= i0 * 16 + i1
        """
        inv, shape, new_shape, ana = self._inverse(shape)
        conds = []
        for e, s in zip(inv.final_indices, shape):
            c = ana.simplify(e >= s)
            if not (isinstance(c, IntImm) and c.value == 0):
                conds.append(c)
        if not conds:
            return inv, IntImm(0, "bool")
        pred = conds[0]
        for c in conds[1:]:
            pred = Or(pred, c)
        return inv, pred

    def _inverse(self, shape):
        shape = [convert(s) for s in shape]
        new_shape = self.map_shape(shape)
        ana = arith.Analyzer()
        new_vars = [Var(f"i{k}", "int64") for k in range(self.ndim_out)]
        for v, s in zip(self.initial_indices, shape):
            ana.bind(v, Range(IntImm(0, v.dtype), s.astype(v.dtype)))
        for v, s in zip(new_vars, new_shape):
            ana.bind(v, Range(IntImm(0, "int64"), s))
        extent = {id(v): s for v, s in zip(self.initial_indices, shape)}

        # Each new index is a mixed-radix number whose digits are digits (x // div) % mod of the
        # old indices; decode the digits from the new index, then re-assemble each old index.
        digits: dict[int, list] = {id(v): [] for v in self.initial_indices}
        for k, e in enumerate(self.final_indices):
            terms = _terms(ana.simplify(e), {id(v): v for v in self.initial_indices})
            if terms is None:
                raise TIRError(f"IndexMap {self}: new index {k} ({e!r}) is not a sum of splits of "
                               f"the old indices; cannot invert it")
            offset, terms = terms
            y = new_vars[k] - offset if offset else new_vars[k]
            terms.sort(key=lambda t: t[0])
            expected = 1
            for t, (coef, x, div, mod) in enumerate(terms):
                if coef != expected:
                    raise TIRError(f"IndexMap {self}: new index {k} ({e!r}) is not a mixed-radix "
                                   f"combination; cannot invert it")
                radix = mod
                if radix is None:
                    top = ana.simplify((extent[id(x)] + div - 1) // div)
                    radix = top.value if isinstance(top, IntImm) else None
                last = t == len(terms) - 1
                if last:
                    value = y // coef if coef != 1 else y
                else:
                    if radix is None:
                        raise TIRError(f"IndexMap {self}: new index {k} ({e!r}) combines a "
                                       f"symbolic-extent digit below another; cannot invert it")
                    value = (y // coef) % radix if coef != 1 else y % radix
                    expected = coef * radix
                digits[id(x)].append((div, mod, value))
        final = []
        for x in self.initial_indices:
            ds = sorted(digits[id(x)], key=lambda d: d[0])
            if not ds:
                if ana.can_prove_equal(extent[id(x)], IntImm(1, "int64")):
                    final.append(IntImm(0, x.dtype))
                    continue
                raise TIRError(f"IndexMap {self}: old index {x.name} does not appear in the new "
                               f"indices; cannot invert it")
            expected = 1
            value = None
            for t, (div, mod, dv) in enumerate(ds):
                if div != expected:
                    raise TIRError(f"IndexMap {self}: the digits of {x.name} do not cover it; "
                                   f"cannot invert it")
                part = dv * div if div != 1 else dv
                value = part if value is None else value + part
                if t < len(ds) - 1:
                    if mod is None:
                        raise TIRError(f"IndexMap {self}: {x.name} appears in overlapping "
                                       f"digits; cannot invert it")
                    expected = div * mod
                elif mod is not None and not ana.can_prove(extent[id(x)] <= div * mod):
                    raise TIRError(f"IndexMap {self}: the highest digit of {x.name} is cut by "
                                   f"% {mod}; cannot invert it")
            final.append(ana.simplify(value))
        inv = IndexMap(new_vars, final)
        # the decoding is exact by construction; check it anyway, as the cheap guard it is
        for x, back in zip(self.initial_indices, inv.map_indices(self.map_indices(
                self.initial_indices, ana), ana)):
            if not ana.can_prove_equal(back, x):
                raise TIRError(f"IndexMap {self}: could not prove the inverse {inv} exact")
        return inv, shape, new_shape, ana

    # -- JSON ---------------------------------------------------------------------------------------

    def to_json(self) -> dict:
        """Plain JSON data: the initial indices (names and dtypes) and the final indices as
        expression trees (``["FloorDiv", a, b]``, ``["idx", k]`` for initial index k,
        ``["var", name, dtype]`` for a free variable, ints for int64 constants).

        Examples
        --------
        >>> IndexMap.from_func(lambda i: [i // 4, i % 4]).to_json()["final"]
        [['FloorDiv', ['idx', 0], 4], ['FloorMod', ['idx', 0], 4]]
        """
        pos = {id(v): k for k, v in enumerate(self.initial_indices)}
        return {"initial": [[v.name, v.dtype] for v in self.initial_indices],
                "final": [_expr_to_json(e, pos) for e in self.final_indices]}

    @staticmethod
    def from_json(data) -> "IndexMap":
        """Read ``to_json`` data back. Free variables come back as new Vars with their names
        (``transform_layout`` matches them by name with the function's variables)."""
        if not isinstance(data, dict) or "initial" not in data or "final" not in data:
            raise ValueError(f"IndexMap.from_json: expected {{'initial': ..., 'final': ...}}, "
                             f"got {data!r}")
        initial = [Var(n, d) for n, d in data["initial"]]
        free: dict[tuple, Var] = {}
        return IndexMap(initial, [_expr_from_json(e, initial, free) for e in data["final"]])

    # -- printing / comparison ------------------------------------------------------------------------

    def __repr__(self):
        names = ", ".join(v.name for v in self.initial_indices)
        outs = [repr(e) for e in self.final_indices]
        body = f"({outs[0]},)" if len(outs) == 1 else f"({', '.join(outs)})"
        return f"IndexMap(lambda {names}: {body})"

    def is_equivalent_to(self, other: "IndexMap") -> bool:
        """Same number of indices and the same final expressions up to renaming the inputs."""
        if not isinstance(other, IndexMap) or self.ndim_in != other.ndim_in \
                or self.ndim_out != other.ndim_out:
            return False
        got = other.map_indices(self.initial_indices)
        return all(structural_equal(arith.simplify(a), b) for a, b in zip(self.final_indices, got))


# -- inverse helpers --------------------------------------------------------------------------------

def _terms(e: PrimExpr, own: dict):
    """``e`` as ``(offset, [(coef, x, div, mod)])`` meaning ``offset + sum coef * ((x // div) %
    mod)`` (mod None: no modulo), with int coefficients; None if it is not of that form."""
    if isinstance(e, IntImm):
        return e.value, []
    if isinstance(e, Var):
        if id(e) not in own:
            return None
        return 0, [(1, e, 1, None)]
    if isinstance(e, Add):
        a, b = _terms(e.a, own), _terms(e.b, own)
        if a is None or b is None:
            return None
        return a[0] + b[0], a[1] + b[1]
    if isinstance(e, Sub) and isinstance(e.b, IntImm):
        a = _terms(e.a, own)
        return None if a is None else (a[0] - e.b.value, a[1])
    if isinstance(e, Mul):
        x, c = (e.a, e.b) if isinstance(e.b, IntImm) else (e.b, e.a)
        if not isinstance(c, IntImm) or c.value <= 0:
            return None
        a = _terms(x, own)
        if a is None:
            return None
        return a[0] * c.value, [(coef * c.value, v, d, m) for coef, v, d, m in a[1]]
    if isinstance(e, (FloorDiv, FloorMod)) and isinstance(e.b, IntImm) and e.b.value > 0:
        a = _terms(e.a, own)
        if a is None or a[0] != 0 or len(a[1]) != 1 or a[1][0][0] != 1:
            return None
        _, x, div, mod = a[1][0]
        c = e.b.value
        if isinstance(e, FloorDiv):
            if mod is not None and mod % c != 0:
                return None
            return 0, [(1, x, div * c, None if mod is None else mod // c)]
        if mod is not None and mod % c != 0:
            return None
        return 0, [(1, x, div, c)]
    return None


# -- JSON expression trees -----------------------------------------------------------------------------

_BINARY = {cls.__name__: cls for cls in (Add, Sub, Mul, Div, Mod, FloorDiv, FloorMod, Min, Max, EQ,
                                         NE, LT, LE, GT, GE, And, Or)}


def _expr_to_json(e: PrimExpr, pos: dict):
    if isinstance(e, Var):
        if id(e) in pos:
            return ["idx", pos[id(e)]]
        return ["var", e.name, e.dtype]
    if isinstance(e, IntImm):
        return e.value if e.dtype == "int64" else ["int", e.value, e.dtype]
    if isinstance(e, FloatImm):
        return ["float", e.value, e.dtype]
    if isinstance(e, BinaryOp) and type(e).__name__ in _BINARY:
        return [type(e).__name__, _expr_to_json(e.a, pos), _expr_to_json(e.b, pos)]
    if isinstance(e, Not):
        return ["Not", _expr_to_json(e.a, pos)]
    if isinstance(e, Select):
        return ["Select", _expr_to_json(e.condition, pos), _expr_to_json(e.true_value, pos),
                _expr_to_json(e.false_value, pos)]
    if isinstance(e, Cast):
        return ["Cast", e.dtype, _expr_to_json(e.value, pos)]
    if isinstance(e, Call):
        return ["Call", e.dtype, e.op] + [_expr_to_json(a, pos) for a in e.args]
    raise TIRError(f"IndexMap.to_json: cannot store the expression {e!r} "
                   f"({type(e).__name__}) of an index map", e)


def _expr_from_json(d, initial: list, free: dict):
    if isinstance(d, bool) or not isinstance(d, (int, list)):
        raise ValueError(f"IndexMap.from_json: bad expression {d!r}")
    if isinstance(d, int):
        return IntImm(d, "int64")
    if not d or not isinstance(d[0], str):
        raise ValueError(f"IndexMap.from_json: bad expression {d!r}")
    op, args = d[0], d[1:]
    rec = lambda x: _expr_from_json(x, initial, free)   # noqa: E731
    try:
        if op == "idx":
            return initial[args[0]]
        if op == "var":
            key = (args[0], args[1])
            if key not in free:
                free[key] = Var(args[0], args[1])
            return free[key]
        if op == "int":
            return IntImm(args[0], args[1])
        if op == "float":
            return FloatImm(args[0], args[1])
        if op in _BINARY:
            return _BINARY[op](rec(args[0]), rec(args[1]))
        if op == "Not":
            return Not(rec(args[0]))
        if op == "Select":
            return Select(rec(args[0]), rec(args[1]), rec(args[2]))
        if op == "Cast":
            return Cast(args[0], rec(args[1]))
        if op == "Call":
            return Call(args[0], args[1], [rec(a) for a in args[2:]])
    except (IndexError, TypeError) as err:
        raise ValueError(f"IndexMap.from_json: bad expression {d!r}: {err}") from None
    raise ValueError(f"IndexMap.from_json: unknown expression kind {op!r} in {d!r}")
