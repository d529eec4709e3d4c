"""``InjectSoftwarePrefetch``: a serial loop annotated ``software_prefetch`` issues, every
``every`` steps, a software prefetch (``tensorir.stmt.prefetch``) of the next cache line of a
region ``ahead`` elements past where its first step reads a buffer.

The annotation's value is ``[buffer_name, ahead, every]``. On the flat form (after
``FlattenBuffers``) the pass takes the first load of the buffer named ``buffer_name`` in the
loop's body, its index ``base`` with the loop's variable and those of the loops inside it at
their first values (where the step reads first), and rewrites::

    for k in range(n):
        body(k)

into::

    for k in range(n):
        if k % every == 0:
            prefetch(buf[min(base + ahead + (k // every) * line, size - 1)])
        body(k)

where ``line`` is a cache line's elements (64 bytes) and ``size`` the buffer's. The loop's
``n / every`` prefetches thus touch ``n / every`` consecutive lines starting ``ahead``
elements on, e.g. the next tile's input of a convolution tile whose reduction loop reads it.
The address is clamped to the buffer's last element rather than guarded (one ``min``, no
branch on the next tile's existence): a prefetch there is a wasted hint, never a fault, and
no address outside the buffer is formed.

An optional fourth element ``lines`` (default 1) makes each prefetch step touch that many
consecutive lines: ``base + ahead + (k // every) * line * lines + j * line`` for ``j`` below
``lines``, so a loop that reads two lines a step can prefetch a whole region at its own pace.

A loop whose body does not read the buffer, or reads it through a variable bound inside the
body other than a loop's, is left unchanged: the annotation is a hint, never an error.

Examples
--------
>>> from tilecraft.tensorir.transform.software_prefetch import InjectSoftwarePrefetch  # doctest: +SKIP
>>> lowered = InjectSoftwarePrefetch(FlattenBuffers(func))                             # doctest: +SKIP
"""
from __future__ import annotations

from .. import dtype as dt
from ..expr import Add, BufferLoad, Cast, EQ, FloorDiv, FloorMod, IntImm, Min, Mul, Sub, TIRError
from ..function import PrimFunc
from ..functor import IRMutator, free_vars, post_order_visit
from ..stmt import For, IfThenElse, LetStmt, SeqStmt, prefetch
from ._common import prim_func_pass, subst

ANN_SOFTWARE_PREFETCH = "software_prefetch"
CACHE_LINE_BYTES = 64


def _first_load(body, name: str):
    found = []

    def f(n):
        if isinstance(n, BufferLoad) and n.buffer.name == name and not found:
            found.append(n)
    post_order_visit(body, f)
    return found[0] if found else None


def _bound_inside(body) -> tuple[dict, set]:
    """The loops' first values (loop var -> min) and the other variables bound in ``body``."""
    loops, others = {}, set()

    def f(n):
        if isinstance(n, For):
            loops[n.loop_var] = n.min
        elif isinstance(n, LetStmt):
            others.add(n.var)
    post_order_visit(body, f)
    return loops, others


def _inject(loop: For, spec) -> For:
    name, ahead, every = spec[:3]
    lines = spec[3] if len(spec) > 3 else 1
    load = _first_load(loop.body, name)
    if load is None or len(load.indices) != 1 or loop.kind != "serial":
        return loop
    loops, others = _bound_inside(loop.body)
    index = load.indices[0]
    if set(free_vars(index)) & others:
        return loop
    k = loop.loop_var
    dtype = index.dtype
    base = subst(index, {**loops, k: loop.min})
    step = Sub(k, loop.min) if not (isinstance(loop.min, IntImm) and loop.min.value == 0) else k
    step = step if step.dtype == dtype else Cast(dtype, step)
    buf = load.buffer
    line = max(1, CACHE_LINE_BYTES // dt.itemsize(buf.dtype))
    c = lambda v: IntImm(int(v), dtype)  # noqa: E731
    at = Add(Add(base, c(ahead)), Mul(FloorDiv(step, c(every)), c(line * lines)))
    size = buf.shape[0] if buf.shape[0].dtype == dtype else Cast(dtype, buf.shape[0])
    last = Sub(size, c(1))
    hints = [prefetch(buf, [Min(Add(at, c(j * line)) if j else at, last)]) for j in range(lines)]
    hint = hints[0] if lines == 1 else SeqStmt(hints)
    if every > 1:
        hint = IfThenElse(EQ(FloorMod(step, c(every)), c(0)), hint, None)
    return loop.replace(body=SeqStmt([hint, loop.body]))


class _Injector(IRMutator):
    def visit_For(self, s: For):
        new = self.generic_visit(s)
        spec = s.annotation_dict.get(ANN_SOFTWARE_PREFETCH)
        if spec is None:
            return new
        return _inject(new, _check_spec(spec, s))


def _check_spec(spec, loop):
    spec = list(spec) if isinstance(spec, (list, tuple)) else None
    if spec is None or len(spec) not in (3, 4) or not isinstance(spec[0], str) or \
            not all(isinstance(v, int) for v in spec[1:]) or spec[2] < 1 or spec[1] < 0 or \
            (len(spec) == 4 and spec[3] < 1):
        raise TIRError(f"loop {loop.loop_var.name}: the {ANN_SOFTWARE_PREFETCH} annotation is "
                       f"[buffer name, elements ahead >= 0, every >= 1 steps(, lines >= 1)], "
                       f"got {spec!r}",
                       loop)
    return spec


@prim_func_pass
def InjectSoftwarePrefetch(func: PrimFunc) -> PrimFunc:
    """Insert the software prefetches of the loops annotated ``software_prefetch`` (on the
    flat form; see the module's docstring)."""
    body = _Injector().visit(func.body)
    return func if body is func.body else func.replace(body=body)


__all__ = ["ANN_SOFTWARE_PREFETCH", "CACHE_LINE_BYTES", "InjectSoftwarePrefetch"]
