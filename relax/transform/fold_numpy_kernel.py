"""``FoldConstant``'s fast path for the weight packing: a kernel that is one loop nest around
one block storing ``out[i, j, ...] = value`` (every element once), where ``value`` is
float32 / float64 arithmetic (``+ - * /``, ``if_then_else`` on integer conditions) of reads
at affine indices, run as numpy on strided views of the inputs.

``AlterLayout``'s packing kernels are such kernels (ResNet-50: 54 of them on 25 M weights, 10
of them the Winograd transform ``G g G^T``, nine products summed per element). The
interpreter reads each input through index arrays, about 12 ns an element; a strided view
(``numpy.lib.stride_tricks.as_strided``) reads at memory speed. The arithmetic is the
kernel's, node by node in its dtype (IEEE operations, correctly rounded in numpy as in the
compiled kernel, which neither contracts nor reassociates), so the result has its bits.
Anything else -- integer or float16 arithmetic, intrinsics, ``min`` / ``max`` of floats, an
index that is not affine -- returns False: the caller runs the kernel another way.

Examples
--------
>>> import numpy as np
>>> from tilecraft.tensorir import te
>>> a = te.placeholder((4, 6), "float32", "a")
>>> t = te.compute((6, 4), lambda i, j: a[j, i] * 2.0, "t")
>>> f = te.create_prim_func([a, t])
>>> x = np.arange(24, dtype="float32").reshape(4, 6)
>>> out = np.empty((6, 4), "float32")
>>> run_numpy_kernel(f, [x], out)
True
>>> bool((out == 2 * x.T).all())
True
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.expr import (EQ, GE, GT, LE, LT, NE, Add, And, BinaryOp, BufferLoad,
                                     Call, Cast, Div, FloatImm, FloorDiv, FloorMod, IntImm, Max,
                                     Min, Mul, Not, Or, Sub, Var)
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.stmt import BlockRealize, BufferStore, For
from tilecraft.errors import TilecraftError

__all__ = ["run_numpy_kernel"]

_FLOATS = ("float32", "float64")


class _Unsupported(TilecraftError):
    """A kernel the numpy folder does not run (the caller compiles or interprets it instead)."""


def run_numpy_kernel(func: PrimFunc, inputs, out: np.ndarray) -> bool:
    """Run ``func`` on the numpy ``inputs`` into ``out`` if it is a kernel of the form of the
    module docstring, and say whether it was; False leaves ``out`` alone. A read that would
    leave its input raises ``IndexError``.

    Parameters
    ----------
    func : PrimFunc
        One loop nest around one block storing each element of its one output once.
    inputs : sequence of numpy.ndarray
        The arrays of its input buffers, in order.
    out : numpy.ndarray
        The array of its output buffer.

    Returns
    -------
    bool
        Whether ``out`` holds the kernel's result.
    """
    try:
        box = _box_of(func, inputs, out)
        with np.errstate(all="ignore"):     # inf / nan as the kernel computes them
            # every refusal and bounds check over the whole box first, arithmetic on 0-d
            # stand-ins: nothing is written to ``out`` unless all of it can be
            box.checking = True
            dtype = box.value(box.store.value).dtype
            box.checking = False
            if str(dtype) != str(out.dtype):
                return False
            # the pieces split the longest axis that only the reads' indices use: what
            # reads no buffer (the Winograd coefficients) is then the same in every piece
            pinned: set = set()
            _scan(box.store.value, pinned, box.load_free)
            free = [a for a in range(len(box.extents)) if a not in
                    {box.axes[v] for v in pinned if v in box.axes}]
            axis = max(free, key=lambda a: box.extents[a], default=None)
            for lows, extents in _chunks(box.extents, axis, _CHUNK_ELEMENTS):
                box.lows, box.extents = lows, extents
                value = box.value(box.store.value)
                part = tuple(slice(lows[a], lows[a] + extents[a]) for a in box.perm)
                out[part] = np.transpose(np.broadcast_to(value, extents), box.perm)
                box.release(value)
    except _Unsupported:
        return False
    return True


# Elements of one piece of the box. Evaluated piece by piece, the temporaries of the arithmetic
# are reused from piece to piece and stay near the core (a 512-channel Winograd transform's
# box is 16 MB per temporary: nine products and sums went through memory, and a fresh process
# took first-touch page faults on each new one). 4 MB of float32: 30 -> 20 ms warm, 100 -> 22
# ms in a fresh process for that transform; smaller pieces cost more in per-piece overhead.
_CHUNK_ELEMENTS = 1 << 20


def _chunks(extents: list[int], axis: int | None, size: int):
    """Split the box ``extents`` along ``axis`` into pieces of about ``size`` elements:
    (lows, extents) of each; one piece where ``axis`` is None or the box is small."""
    n = len(extents)
    total = int(np.prod(extents, dtype=np.int64)) if n else 1
    if axis is None or total <= size:
        yield [0] * n, list(extents)
        return
    step = max(1, size * extents[axis] // total)
    for start in range(0, extents[axis], step):
        lows = [0] * n
        lows[axis] = start
        piece = list(extents)
        piece[axis] = min(step, extents[axis] - start)
        yield lows, piece


def _scan(e, pinned: set, load_free: set) -> bool:
    """Whether ``e`` reads a buffer; collects the variables ``e`` uses outside the reads'
    indices (``pinned``) and the ids of its subexpressions that read no buffer
    (``load_free``: their values do not change from piece to piece of an unpinned axis)."""
    if isinstance(e, BufferLoad):
        return True
    if isinstance(e, Var):
        pinned.add(id(e))
        reads = False
    elif isinstance(e, (IntImm, FloatImm)):
        reads = False
    elif isinstance(e, BinaryOp):
        reads = _scan(e.a, pinned, load_free) | _scan(e.b, pinned, load_free)
    elif isinstance(e, Not):
        reads = _scan(e.a, pinned, load_free)
    elif isinstance(e, Cast):
        reads = _scan(e.value, pinned, load_free)
    elif isinstance(e, Call):
        reads = False
        for x in e.args:
            reads |= _scan(x, pinned, load_free)
    else:
        raise _Unsupported(f"{type(e).__name__} in a value")
    if not reads:
        load_free.add(id(e))
    return reads


def _affine(e, axes: dict[int, int]) -> tuple[dict[int, int], int]:
    """``e`` as (variable id -> coefficient, constant), over the variables in ``axes``."""
    if isinstance(e, IntImm):
        return {}, int(e.value)
    if isinstance(e, Var):
        if id(e) not in axes:
            raise _Unsupported(f"free variable {e.name}")
        return {id(e): 1}, 0
    if isinstance(e, (Add, Sub)):
        (ca, ka), (cb, kb) = _affine(e.a, axes), _affine(e.b, axes)
        sign = 1 if isinstance(e, Add) else -1
        out = dict(ca)
        for v, c in cb.items():
            out[v] = out.get(v, 0) + sign * c
        return out, ka + sign * kb
    if isinstance(e, Mul):
        (ca, ka), (cb, kb) = _affine(e.a, axes), _affine(e.b, axes)
        if ca and cb:
            raise _Unsupported("a product of variables")
        coefs, k, scale = (cb, kb, ka) if not ca else (ca, ka, kb)
        return {v: c * scale for v, c in coefs.items()}, k * scale
    raise _Unsupported(f"{type(e).__name__} in an index")


_CMP = {LT: np.less, LE: np.less_equal, GT: np.greater, GE: np.greater_equal, EQ: np.equal,
        NE: np.not_equal}
_INTEGER = {Add: np.add, Sub: np.subtract, Mul: np.multiply, FloorDiv: np.floor_divide,
            FloorMod: np.mod, Min: np.minimum, Max: np.maximum}
_ARITH = {Add: np.add, Sub: np.subtract, Mul: np.multiply, Div: np.divide}


def _contiguous(x: np.ndarray) -> np.ndarray:
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def _unsupported(e):
    raise _Unsupported(f"{e!r}")


class _Box:
    """The iteration box of the kernel's one block: its loops (axes, in loop order), their
    extents, and the block variables' axes."""

    def __init__(self, func, store, extents, axes, perm, inputs_of):
        self.func, self.store, self.extents, self.axes, self.perm = (func, store, extents,
                                                                     axes, perm)
        self.inputs_of = inputs_of
        self.lows = [0] * len(extents)  # the first index of each axis (a piece of the box)
        self.checking = False           # only the checks: values are 0-d stand-ins
        self.load_free: set[int] = set()    # subexpressions that read no buffer ...
        self.kept: dict[int, np.ndarray] = {}   # ... and their values, kept across pieces
        # the arrays evaluation made (not views), held so that their ids stay theirs
        self.made: dict[int, np.ndarray] = {}
        self.spare: list[np.ndarray] = []  # arrays it made that nothing uses any more

    def release(self, *arrays) -> None:
        """``arrays`` are used no more: those evaluation made may take another result."""
        for x in arrays:
            if id(x) in self.made and not any(x is y for y in self.spare):
                self.spare.append(x)

    # -- index expressions --------------------------------------------------------------
    def grid(self, coefs: dict[int, int], k: int) -> np.ndarray:
        """An affine value over the box, as a broadcastable int64 array."""
        n = len(self.extents)
        value = np.full([1] * n, k, dtype=np.int64)
        for v, c in coefs.items():
            a = self.axes[v]
            shape = [1] * n
            shape[a] = self.extents[a]
            value = value + c * np.arange(self.lows[a], self.lows[a] + self.extents[a],
                                          dtype=np.int64).reshape(shape)
        return value

    def bounds(self, coefs: dict[int, int], k: int) -> tuple[int, int]:
        lo = hi = k
        for v, c in coefs.items():
            a = self.axes[v]
            first, last = c * self.lows[a], c * (self.lows[a] + self.extents[a] - 1)
            lo, hi = lo + min(first, last), hi + max(first, last)
        return lo, hi

    def index(self, e) -> tuple[dict[int, int], int]:
        """An index: affine, or the min / max of an affine one and a constant that never
        binds in the box (``min(o, 127)`` of a padded channel block that has no padding)."""
        if isinstance(e, (Min, Max)):
            for x, c in ((e.a, e.b), (e.b, e.a)):
                if isinstance(c, IntImm):
                    coefs, k = self.index(x)
                    lo, hi = self.bounds(coefs, k)
                    if (isinstance(e, Min) and hi <= c.value) or \
                            (isinstance(e, Max) and lo >= c.value):
                        return coefs, k
            raise _Unsupported("a min / max that binds")
        return _affine(e, self.axes)

    def condition(self, e) -> np.ndarray:
        if isinstance(e, And):
            return self.condition(e.a) & self.condition(e.b)
        if isinstance(e, Or):
            return self.condition(e.a) | self.condition(e.b)
        if isinstance(e, Not):
            return ~self.condition(e.a)
        cmp = _CMP.get(type(e))
        if cmp is None:
            raise _Unsupported(f"{type(e).__name__} in a condition")
        return cmp(self.integer(e.a), self.integer(e.b))

    def integer(self, e) -> np.ndarray:
        """An integer expression of the block's variables over the box (int64, broadcastable;
        ``//`` and ``%`` floor as ``FloorDiv`` / ``FloorMod``)."""
        if isinstance(e, IntImm):
            return np.asarray(int(e.value), dtype=np.int64)
        if isinstance(e, Var):
            return self.grid({id(e): 1}, 0) if id(e) in self.axes else _unsupported(e)
        fn = _INTEGER.get(type(e))
        if fn is None:
            raise _Unsupported(f"{type(e).__name__} in an integer expression")
        b = self.integer(e.b)
        if isinstance(e, (FloorDiv, FloorMod)) and np.any(b == 0):
            raise _Unsupported("a division by zero")
        value = fn(self.integer(e.a), b)
        if value.size and np.abs(value).max() >= 2 ** 31:
            raise _Unsupported("an integer that may wrap around in the kernel")
        return value

    # -- values -------------------------------------------------------------------------
    def value(self, e, guard: np.ndarray | None = None) -> np.ndarray:
        """``e`` over the box, in its dtype; ``guard``: where the value is used (a read may
        leave its input elsewhere)."""
        if id(e) in self.kept:
            return self.kept[id(e)]
        value = self._value(e, guard)
        if id(e) in self.load_free and not self.checking:
            # kept, so never computed into (taken out of the arrays that may be reused)
            self.made.pop(id(value), None)
            self.kept[id(e)] = value
        return value

    def _value(self, e, guard: np.ndarray | None = None) -> np.ndarray:
        if isinstance(e, (FloatImm, IntImm)):
            if e.dtype not in _FLOATS:
                raise _Unsupported(f"{e.dtype} value")
            return np.asarray(e.value, dtype=e.dtype)
        if e.dtype not in _FLOATS:
            raise _Unsupported(f"{e.dtype} arithmetic")
        fn = _ARITH.get(type(e))
        if fn is not None:
            # a strided read gathered once, not again for each value it is combined with
            # (the Winograd transform multiplies each read by 16 coefficients)
            a = _contiguous(self.value(e.a, guard))
            b = _contiguous(self.value(e.b, guard))
            if self.checking:
                return fn(a, b)
            # the result into an operand this evaluation made (each is used once): fresh
            # arrays of millions of elements cost more in page faults than the arithmetic
            shape = np.broadcast_shapes(a.shape, b.shape)
            into = next((x for x in (a, b) if id(x) in self.made and x.shape == shape and
                         x.dtype == e.dtype), None)
            if into is None:
                # or into one that is not used any more (in a fresh process every new array
                # of the Winograd transform's box was 16 MB of first-touched pages)
                into = next((x for x in self.spare if x.shape == shape and x.dtype == e.dtype),
                            None)
                if into is not None:
                    self.spare = [x for x in self.spare if x is not into]
            result = fn(a, b, out=into) if into is not None else fn(a, b)
            self.made[id(result)] = result
            self.release(*(x for x in (a, b) if x is not result))
            return result
        if isinstance(e, Cast):
            if e.value.dtype not in _FLOATS:
                raise _Unsupported("a cast from a non-float")
            x = self.value(e.value, guard)
            result = x.astype(e.dtype)
            self.release(x)
            return result
        if isinstance(e, Call) and e.op == "if_then_else":
            cond = self.condition(e.args[0])
            t = self.value(e.args[1], cond if guard is None else cond & guard)
            f = self.value(e.args[2], ~cond if guard is None else ~cond & guard)
            result = np.where(cond, t, f)
            self.release(t, f)
            return result
        if isinstance(e, BufferLoad):
            return self.load(e, guard)
        raise _Unsupported(f"{type(e).__name__} in a value")

    def load(self, e: BufferLoad, guard) -> np.ndarray:
        src = self.inputs_of(e.buffer)
        if str(src.dtype) != e.dtype or src.ndim != len(e.indices):
            raise _Unsupported("the input")
        reads = [self.index(i) for i in e.indices]
        low = [0] * src.ndim
        for dim, ((coefs, k), n) in enumerate(zip(reads, src.shape)):
            lo, hi = self.bounds(coefs, k)
            if lo >= 0 and hi < n:
                continue
            # out of the input somewhere in the box: fine only where the value is not used
            # (the zero rows of a packed weight); pad the input so that the view stays in it
            idx = self.grid(coefs, k)
            if guard is None or np.any(guard & ((idx < 0) | (idx >= n))):
                raise IndexError(f"{self.func.attr_dict.get('global_symbol', 'kernel')} reads "
                                 f"{e.buffer.name} out of bounds in dimension {dim}")
            low[dim] = max(0, -lo)
            if self.checking:
                continue
            pad = [(0, 0)] * src.ndim
            pad[dim] = (low[dim], max(0, hi - n + 1))
            src = np.pad(src, pad)
        if self.checking:
            return np.zeros((), src.dtype)
        item = src.itemsize
        offset, strides = 0, [0] * len(self.extents)
        for dim, (coefs, k) in enumerate(reads):
            step = src.strides[dim] // item
            offset += (k + low[dim]) * step
            for v, c in coefs.items():
                strides[self.axes[v]] += c * step
                offset += c * self.lows[self.axes[v]] * step
        # an axis the read does not depend on stays 1 wide (numpy broadcasts it)
        shape = [n if s else 1 for n, s in zip(self.extents, strides)]
        return np.lib.stride_tricks.as_strided(src.reshape(-1)[offset:], shape=shape,
                                               strides=[s * item for s in strides],
                                               writeable=False)


def _box_of(func: PrimFunc, inputs, out: np.ndarray) -> _Box:
    bufs = func.buffers
    if len(bufs) != len(inputs) + 1 or func.scalar_params or \
            not isinstance(func.body, BlockRealize) or func.body.block.alloc_buffers:
        raise _Unsupported("not one output")
    stmt = func.body.block.body
    loops = []
    while isinstance(stmt, For):
        loops.append(stmt)
        stmt = stmt.body
    if not isinstance(stmt, BlockRealize):
        raise _Unsupported("not one loop nest around one block")
    block, store = stmt.block, stmt.block.body
    if block.init is not None or block.alloc_buffers or not isinstance(store, BufferStore) or \
            store.buffer is not bufs[-1] or len(stmt.iter_values) != len(loops) or \
            not (isinstance(stmt.predicate, IntImm) and stmt.predicate.value) or \
            any(iv.kind != "spatial" for iv in block.iter_vars):
        raise _Unsupported("not one store per iteration")
    if not all(isinstance(lp.min, IntImm) and lp.min.value == 0 and
               isinstance(lp.extent, IntImm) for lp in loops):
        raise _Unsupported("loop bounds")
    # the block's variables are the loops' (in some order), each over its whole loop
    loop_axis = {id(lp.loop_var): a for a, lp in enumerate(loops)}
    extents = [int(lp.extent.value) for lp in loops]
    axes: dict[int, int] = {}
    for iv, value in zip(block.iter_vars, stmt.iter_values):
        a = loop_axis.get(id(value)) if isinstance(value, Var) else None
        if a is None or a in axes.values() or not isinstance(iv.dom.min, IntImm) or \
                iv.dom.min.value != 0 or not isinstance(iv.dom.extent, IntImm) or \
                int(iv.dom.extent.value) != extents[a]:
            raise _Unsupported("iteration variables")
        axes[id(iv.var)] = a
    # the output: every element once, its dimensions the axes in some order
    perm = [axes.get(id(i)) if isinstance(i, Var) else None for i in store.indices]
    if None in perm or sorted(perm) != list(range(len(loops))) or \
            tuple(extents[a] for a in perm) != tuple(out.shape):
        raise _Unsupported("the store")
    arrays = {id(b): np.ascontiguousarray(x) for b, x in zip(bufs, inputs)}

    def inputs_of(buffer):
        if id(buffer) not in arrays:
            raise _Unsupported(f"a read of {buffer.name}, not an input")
        return arrays[id(buffer)]
    return _Box(func, store, extents, axes, perm, inputs_of)
