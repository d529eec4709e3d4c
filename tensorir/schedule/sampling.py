"""Sampling primitives: seeded random choices recorded as trace decisions.

The decision a sampler draws is stored in its trace instruction; replaying a trace with a changed
decision (``trace.with_decision``) is how the tuner's mutators move through the design space, and
replaying it with its decisions dropped (``trace.with_decisions_dropped()``) draws a fresh point
of the same design space.

``sample_perfect_tile`` needs a constant extent. ``sample_tile`` works on any loop, symbolic
extents included: it draws the *inner* factors of a tiling (for ``split(loop, [None, *inner])``)
at a representative value of the extent (``shape_hints``), and its decisions stay valid for every
value (the outer loop is ``ceildiv(extent, product)`` and the split's predicate guards the tail).
``enter_postproc`` marks where a tuner's postprocessing starts in a trace.
"""
from __future__ import annotations

from typing import Sequence

from .. import arith
from ..expr import IntImm, PrimExpr, Var
from ..functor import free_vars, substitute
from .error import ScheduleError
from .rv import ExprRV, LoopRV, traced


def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def perfect_tilings(extent: int, n: int, max_innermost_factor: int) -> int:
    """How many ways ``extent`` splits into ``n`` ordered factors with a bounded innermost one."""
    count = 0

    def rec(rest, k):
        nonlocal count
        if k == 1:
            count += 1
            return
        for d in range(1, rest + 1):
            if rest % d == 0:
                rec(rest // d, k - 1)

    for inner in range(1, min(extent, max_innermost_factor) + 1):
        if extent % inner == 0:
            rec(extent // inner, n - 1)
    return count


def representative_extent(extent: PrimExpr | int, shape_hints: dict | None) -> int | None:
    """The value of a loop extent with the symbolic shape variables named in ``shape_hints``
    replaced by their hinted values; None if it stays symbolic.

    Examples
    --------
    >>> from tilecraft.tensorir import var
    >>> n = var("n")
    >>> representative_extent((n + 15) // 16, {"n": 64})
    4
    """
    if isinstance(extent, int):
        return extent
    if isinstance(extent, IntImm):
        return extent.value
    hints = shape_hints or {}
    vmap = {v: IntImm(int(hints[v.name]), v.dtype) for v in free_vars(extent)
            if isinstance(v, Var) and v.name in hints}
    value = arith.simplify(substitute(extent, vmap)) if vmap else extent
    return value.value if isinstance(value, IntImm) else None


class SamplingPrimitives:
    """``sample_perfect_tile``, ``sample_tile``, ``sample_categorical`` and the trace marker
    ``enter_postproc`` (``sample_compute_location`` lives with the compute-location primitives,
    which know where a block may go)."""

    @traced
    def sample_perfect_tile(self, loop: LoopRV, n: int, max_innermost_factor: int = 16,
                            decision: Sequence[int] | None = None) -> list[ExprRV]:
        """Draw ``n`` factors whose product is the loop's (constant) extent, the innermost at most
        ``max_innermost_factor``; returns them as ExprRVs for ``split``.

        Examples
        --------
        >>> i, = sch.get_loops(sch.get_block("B"))           # doctest: +SKIP
        >>> factors = sch.sample_perfect_tile(i, n=3, max_innermost_factor=8)
        >>> sch.split(i, factors)
        """
        prim = "sample_perfect_tile"
        for_node, _ = self._loop(loop, prim)
        if not isinstance(for_node.extent, IntImm):
            raise ScheduleError(prim, f"loop {for_node.loop_var.name} has the symbolic extent "
                                f"{for_node.extent!r}; perfect tiles need a constant extent", for_node)
        extent = for_node.extent.value
        if n < 1:
            raise ScheduleError(prim, f"n must be >= 1, got {n}")
        if max_innermost_factor < 1:
            raise ScheduleError(prim, f"max_innermost_factor must be >= 1, got {max_innermost_factor}")
        if decision is not None:
            factors = [int(f) for f in decision]
            prod = 1
            for f in factors:
                prod *= f
            if len(factors) != n or prod != extent or factors[-1] > max_innermost_factor \
                    or min(factors) < 1:
                raise ScheduleError(prim, f"decision {factors} is not a perfect {n}-tiling of "
                                    f"{extent} with innermost <= {max_innermost_factor}", for_node)
        else:
            factors = self._draw_perfect_tile(extent, n, max_innermost_factor)
        self._decision = list(factors)
        return [self._expr_rv(f) for f in factors]

    def _draw_perfect_tile(self, extent: int, n: int, max_inner: int) -> list[int]:
        # distribute each prime factor to a random position, retrying while the innermost is too
        # big; uniform over prime assignments, which favours balanced tiles like TVM's sampler
        primes = prime_factors(extent)
        for _ in range(64):
            factors = [1] * n
            for p in primes:
                factors[int(self._rng.integers(0, n))] *= p
            if factors[-1] <= max_inner:
                return factors
        # fall back: the largest admissible innermost divisor, the rest outermost
        inner = max(d for d in range(1, min(extent, max_inner) + 1) if extent % d == 0)
        return [extent // inner] + [1] * (n - 2) + [inner] if n > 1 else [extent]

    @traced
    def sample_tile(self, loop: LoopRV, n: int, max_innermost_factor: int = 16,
                    shape_hints: dict | None = None, max_factors: Sequence | None = None,
                    decision: Sequence[int] | None = None) -> list[ExprRV]:
        """Draw an ``n``-level tiling of ``loop`` and return its ``n - 1`` inner factors, for
        ``split(loop, [None, *factors])``; the extent may be symbolic.

        The factors are a perfect tiling of the loop's extent at a representative value: the
        constant extent, or the symbolic one with ``shape_hints`` (``{"n": 64}``) substituted.
        The decision records all ``n`` factors, the outermost one at that representative value
        (so a mutator can move factors between levels), but only the inner ones are returned:
        the outer loop is left to ``split`` (``ceildiv(extent, product)``), so every decision
        (any positive factors, the innermost at most ``max_innermost_factor``) replays on the
        function for any value of the shape variables; where the product does not divide the
        extent, the split's predicate guards the tail.

        Parameters
        ----------
        loop : LoopRV
        n : int
            The number of tile levels (>= 2).
        max_innermost_factor : int
            Upper bound of the innermost factor.
        shape_hints : dict[str, int], optional
            Representative values of the symbolic shape variables in the extent. Only used to
            draw; a replayed decision does not need them.
        max_factors : list of (int or None), optional
            A bound per level (``n`` entries, None: unbounded; the outermost's is ignored).
            With it, the inner levels are drawn one at a time, in a random order, each
            uniformly among the divisors of what is left that its bound admits, and the outer
            level takes the rest: a prior for GPU tiles (threads and register tiles of a few
            sizes) instead of the uniform assignment of prime factors, which at 4096 puts most
            of the extent in the inner levels. Drawing only; a replayed decision is not
            checked against it.
        decision : list of int, optional
            Replay these ``n`` factors instead of drawing (the first is informational).

        Examples
        --------
        >>> n = te.var("n")                                          # doctest: +SKIP
        >>> i, = sch.get_loops(sch.get_block("B"))                  # doctest: +SKIP
        >>> inner = sch.sample_tile(i, n=3, max_innermost_factor=16, shape_hints={"n": 64})
        >>> i0, i1, i2 = sch.split(i, [None, *inner])              # doctest: +SKIP
        """
        prim = "sample_tile"
        for_node, _ = self._loop(loop, prim)
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ScheduleError(prim, f"n must be an int >= 2, got {n!r}", for_node)
        if max_innermost_factor < 1:
            raise ScheduleError(prim, f"max_innermost_factor must be >= 1, got "
                                f"{max_innermost_factor}", for_node)
        if decision is not None:
            factors = [int(f) for f in decision]
            if len(factors) != n or min(factors) < 1 or factors[-1] > max_innermost_factor:
                raise ScheduleError(prim, f"decision {factors} is not {n} positive factors "
                                    f"with the innermost <= {max_innermost_factor}", for_node)
        else:
            extent = representative_extent(for_node.extent, shape_hints)
            if extent is None:
                raise ScheduleError(prim, f"loop {for_node.loop_var.name} has the symbolic extent "
                                    f"{for_node.extent!r} and shape_hints {shape_hints!r} do not "
                                    f"give all of its variables a value", for_node)
            if max_factors is not None:
                if len(max_factors) != n:
                    raise ScheduleError(prim, f"max_factors needs {n} entries (one per level), "
                                        f"got {list(max_factors)}", for_node)
                factors = self._draw_bounded_tile(max(extent, 1), n, max_innermost_factor,
                                                  list(max_factors))
            else:
                factors = self._draw_perfect_tile(max(extent, 1), n, max_innermost_factor)
        self._decision = list(factors)
        return [self._expr_rv(f) for f in factors[1:]]

    def _draw_bounded_tile(self, extent: int, n: int, max_inner: int, caps: list) -> list[int]:
        factors = [1] * n
        rest = extent
        for level in [int(x) + 1 for x in self._rng.permutation(n - 1)]:
            cap = caps[level]
            cap = rest if cap is None else min(int(cap), rest)
            if level == n - 1:
                cap = min(cap, max_inner)
            divs = [d for d in range(1, max(cap, 1) + 1) if rest % d == 0]
            factors[level] = divs[int(self._rng.integers(0, len(divs)))]
            rest //= factors[level]
        factors[0] = rest
        return factors

    @traced
    def enter_postproc(self) -> None:
        """Mark the start of postprocessing in the trace (TVM's ``EnterPostproc``); changes
        nothing. ``trace.without_postproc()`` gives the instructions before the mark, which a
        tuner replays with new decisions before running its postprocessors again.

        Examples
        --------
        >>> sch.enter_postproc()                                     # doctest: +SKIP
        """

    @traced
    def sample_categorical(self, candidates: Sequence[int], probs: Sequence[float],
                           decision: int | None = None) -> ExprRV:
        """Draw one of ``candidates`` with probabilities ``probs``; the decision is its index.

        Examples
        --------
        >>> unroll = sch.sample_categorical([0, 16, 64, 512], [0.25] * 4)   # doctest: +SKIP
        """
        prim = "sample_categorical"
        candidates = [int(c) for c in candidates]
        probs = [float(p) for p in probs]
        if not candidates or len(candidates) != len(probs):
            raise ScheduleError(prim, f"{len(candidates)} candidates but {len(probs)} probabilities")
        if any(p < 0 for p in probs) or sum(probs) <= 0:
            raise ScheduleError(prim, f"probabilities must be >= 0 with a positive sum, got {probs}")
        if decision is None:
            total = sum(probs)
            decision = int(self._rng.choice(len(candidates), p=[p / total for p in probs]))
        elif not 0 <= int(decision) < len(candidates):
            raise ScheduleError(prim, f"decision {decision} is not an index into {candidates}")
        self._decision = int(decision)
        return self._expr_rv(candidates[int(decision)])
