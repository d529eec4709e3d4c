"""Tensor intrinsics: what a micro-kernel computes (``desc``) and the code that replaces it
(``impl``), for ``Schedule.tensorize``; the registry and the built-in CPU micro-kernels.

A ``TensorIntrin`` is a pair of PrimFuncs with the same buffer parameters (shapes and dtypes):

* ``desc`` describes the computation in block form: a loop nest around one block, e.g. the
  fp32 outer-product update ``C[i, j] += A[i, 0] * B[0, j]`` over ``i < MR, j < NR``. Tensorize
  matches a block of the scheduled function against it structurally.
* ``impl`` is the code that replaces the matched block's body: plain TIR whose ``vectorized``
  and ``unrolled`` loops our LLVM back end turns into vector instructions (``<16 x float>``
  loads, broadcasts, ``fmul`` / ``fadd``). Writing micro-kernels as TIR keeps them portable:
  the same intrinsic compiles for x86 and ARM and runs in the interpreter.

Matched buffer regions
----------------------
The desc/impl buffers are small compact buffers (``A (MR, 1)``, ``B (1, NR)``, ``C (MR, NR)``).
Where TVM declares them with ``T.match_buffer(..., offset_factor=..., strides=...)`` and binds
the real buffer's data pointer, offset and strides, here tensorize *instantiates* the impl: every
access ``A_impl[p, q]`` becomes an access of the real buffer at the matched region's base,
``A[base_0 + p, base_1 + q]``. A desc buffer may have fewer dimensions than the real one; the
real region's other dimensions must then have extent 1 (``A[vi, k0*16 : k0*16 + 16]`` matches a
1-d desc buffer of 16). Strides and layouts are the real buffer's, so no copy is made.

Built-in families (``TensorIntrin.get`` builds a member on first use; ``available(target)``
lists the default sizes):

* ``outer_product_f32_{isa}_{MR}x{NR}``: ``C[i, j] += A[i, 0] * B[0, j]`` (one k step of a
  GEMM micro-kernel), ``NR`` a multiple of the isa's fp32 lanes.
* ``fill_zero_f32_{isa}_{MR}x{NR}``: ``C[i, j] = 0`` (the init of that micro-kernel, after
  ``decompose_reduction``).
* ``dot_product_f32_{isa}_{L}``: ``C[0] += sum_k A[k] * B[k]`` over ``L`` (a multiple of the
  lanes) with a vector multiply-accumulate and a horizontal add by halving.
* ``dot_product_i8i32_{isa}_{L}``: the same on int8 inputs accumulating in int32.
* ``dot4_u8i8_{L}`` / ``dot4_i8u8_{L}``: ``C[j] += sum_k A[k] * B[k, j]`` over ``k < 4``,
  ``j < L`` of 8-bit inputs into int32 (``A`` uint8 and ``B`` int8, or the reverse): one
  ``dot4_u8i8`` per lane on words of four bytes, ``A``'s word broadcast (the int8 kernels'
  step: ``vpdpbusd`` with AVX-512 VNNI, ``sdot`` with ``+dotprod``, an exact widening sequence
  elsewhere; ``targets.llvm.dot4``). Portable: no isa.
* ``amx_u8s8s32_{M}x{N}x{K}``: ``C[i, j] += sum_kw dot4_u8i8(A[i, kw], B[kw, j])`` over
  ``M x N`` int32 results and ``K`` bytes (``K / 4`` words) of the reduction, on Intel AMX
  tiles (``amx_funcs``; isa ``amx``, where ``Target.amx_int8``): a whole block of
  ``relax.backend.cpu.dense_amx`` in one call, its last rows possibly ragged (a *partial*
  tile, ``TensorIntrin.partial``).

``isa`` is ``avx2`` (256-bit, 8 fp32 lanes), ``avx512`` (16 lanes) or ``neon`` (4 lanes).

Examples
--------
>>> from tilecraft.tensorir.schedule.intrinsics import TensorIntrin
>>> intrin = TensorIntrin.get("outer_product_f32_avx512_4x16")
>>> [b.shape for b in intrin.desc.buffers]          # doctest: +SKIP
[(4, 1), (1, 16), (4, 16)]
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

from .. import dtype as dt
from ..expr import (AMX_U8I8, DOT4_U8I8, Call, Cast, FloatImm, IntImm, PrimExpr, TIRError,
                    Var, call)
from ..function import PrimFunc
from ..stmt import (Block, BlockRealize, Buffer, BufferStore, Evaluate, For, IterVar, Range,
                    Stmt, seq)
from ..structural import structural_equal
from .regions import with_regions
from .tree import walk as _walk

# fp32 lanes of one vector register, per instruction set
ISA_LANES = {"avx2": 8, "avx512": 16, "neon": 4}

# the sizes ``available`` lists for each family (any other size can still be asked for by name)
DEFAULT_MR = tuple(range(1, 9))
DEFAULT_NR_VECTORS = (1, 2, 3, 4)
DEFAULT_DOT_VECTORS = (1, 2, 4)


class TensorIntrin:
    """A tensor intrinsic: ``desc`` (what it computes) and ``impl`` (the code replacing it).

    Parameters
    ----------
    desc : PrimFunc
        Block-form description: buffer parameters only, a loop nest around one block (under an
        optional root block with no iteration variables).
    impl : PrimFunc
        The implementation, with buffer parameters of the same shapes and dtypes as ``desc``,
        in the same order. Its root block (if any) may allocate scratch buffers.
    isa : str, optional
        The instruction set the impl is tuned for (``avx2``, ``avx512``, ``neon``, ``amx``);
        None for a portable intrinsic. ``available(target)`` uses it.
    partial : dict[int, Var | None], optional
        The loops of ``desc`` (by depth, 0 the outermost) along which the impl can compute a
        *partial tile*: a block whose predicate bounds that loop (``base + i < bound``, as
        ``split`` leaves at a ragged edge) still matches. A ``Var`` (used in the impl) is then
        bound to the count of valid iterations, ``min(extent, bound - base)`` (the extent on
        a whole tile); ``None`` means the impl computes the whole tile along that loop anyway,
        which tensorize allows only where the block writes no parameter buffer (the extra
        results land in scratch the block's iteration domain never reaches, e.g. padding).
        Without it a predicated block does not match.

    Examples
    --------
    >>> desc, impl = outer_product_funcs(4, 16, lanes=16)
    >>> TensorIntrin.register("my_op_4x16", desc, impl)     # doctest: +SKIP
    >>> sch.tensorize(sch.get_loops(block)[3], "my_op_4x16")   # doctest: +SKIP
    """

    _registry: dict[str, "TensorIntrin"] = {}
    # (pattern of names, factory from a match to a TensorIntrin, default names)
    _families: list[tuple[re.Pattern, Callable[[re.Match], "TensorIntrin"],
                          Callable[[], list[str]], str]] = []

    def __init__(self, name: str, desc: PrimFunc, impl: PrimFunc, isa: str | None = None,
                 partial: dict[int, Var | None] | None = None):
        _check_pair(name, desc, impl)
        self.name = name
        self.desc = desc
        self.impl = impl
        self.isa = isa
        self.partial = _check_partial(name, desc, partial)

    def __repr__(self):
        return f"TensorIntrin({self.name!r})"

    @staticmethod
    def register(name: str, desc: PrimFunc, impl: PrimFunc, override: bool = False,
                 isa: str | None = None, partial: dict[int, Var | None] | None = None
                 ) -> "TensorIntrin":
        """Register an intrinsic under ``name`` (``override=True`` to replace an existing one).

        Examples
        --------
        >>> TensorIntrin.register("dot_16", *dot_product_funcs(16, lanes=16))  # doctest: +SKIP
        """
        if not isinstance(name, str) or not name:
            raise TIRError(f"TensorIntrin.register: the name must be a non-empty string, got "
                           f"{name!r}")
        if name in TensorIntrin._registry and not override:
            raise TIRError(f"TensorIntrin.register: an intrinsic named {name!r} is already "
                           f"registered; pass override=True to replace it")
        intrin = TensorIntrin(name, desc, impl, isa, partial)
        TensorIntrin._registry[name] = intrin
        return intrin

    @staticmethod
    def get(name: str, allow_missing: bool = False) -> "TensorIntrin | None":
        """The intrinsic registered as ``name`` (built-in family members are built on first use).

        Raises ``TIRError`` for an unknown name unless ``allow_missing``.

        Examples
        --------
        >>> TensorIntrin.get("dot_product_f32_avx2_8").name
        'dot_product_f32_avx2_8'
        """
        intrin = TensorIntrin._registry.get(name)
        if intrin is not None:
            return intrin
        for pattern, factory, _, _ in TensorIntrin._families:
            m = pattern.fullmatch(name) if isinstance(name, str) else None
            if m is None:
                continue
            intrin = factory(m)
            TensorIntrin._registry[name] = intrin
            return intrin
        if allow_missing:
            return None
        families = ", ".join(f[3] for f in TensorIntrin._families)
        raise TIRError(f"no tensor intrinsic named {name!r}; registered: "
                       f"{sorted(TensorIntrin._registry)[:20]}, families: {families}")

    @staticmethod
    def _register_family(pattern: str, factory, defaults, doc: str) -> None:
        TensorIntrin._families.append((re.compile(pattern), factory, defaults, doc))


def _check_pair(name: str, desc: PrimFunc, impl: PrimFunc) -> None:
    for what, f in (("desc", desc), ("impl", impl)):
        if not isinstance(f, PrimFunc):
            raise TIRError(f"tensor intrinsic {name!r}: {what} must be a PrimFunc, got "
                           f"{type(f).__name__}")
        if f.scalar_params:
            raise TIRError(f"tensor intrinsic {name!r}: {what} has scalar parameters "
                           f"{[p.name for p in f.scalar_params]}; only buffer parameters are "
                           f"supported")
    impl_body, _ = strip_root(impl)
    for node, _ in _walk(impl_body):
        if isinstance(node, BlockRealize):
            raise TIRError(f"tensor intrinsic {name!r}: the impl holds block "
                           f"{node.block.name!r}; below its root block it must be plain TIR "
                           f"(loops, stores, allocations)")
    db, ib = desc.buffers, impl.buffers
    if len(db) != len(ib):
        raise TIRError(f"tensor intrinsic {name!r}: desc has {len(db)} buffer parameters, impl "
                       f"has {len(ib)}")
    for d, i in zip(db, ib):
        if d.dtype != i.dtype or len(d.shape) != len(i.shape) or \
                not structural_equal(tuple(d.shape), tuple(i.shape)):
            raise TIRError(f"tensor intrinsic {name!r}: desc buffer {d.name} {d.dtype}"
                           f"{_shape(d)} and impl buffer {i.name} {i.dtype}{_shape(i)} differ; "
                           f"they must have one shape and dtype")


def _check_partial(name: str, desc: PrimFunc, partial) -> dict[int, Var | None]:
    if not partial:
        return {}
    depth = 0
    s, _ = strip_root(desc)
    while isinstance(s, For):
        depth += 1
        s = s.body
    out = {}
    for k, v in dict(partial).items():
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < depth:
            raise TIRError(f"tensor intrinsic {name!r}: partial names loop {k!r}, but desc has "
                           f"loops 0..{depth - 1}")
        if v is not None and not (isinstance(v, Var) and v.dtype.startswith("int")):
            raise TIRError(f"tensor intrinsic {name!r}: partial[{k}] must be an integer Var "
                           f"of the impl or None, got {v!r}")
        out[k] = v
    return out


def _shape(b: Buffer) -> str:
    return "(" + ", ".join(str(s.value) if isinstance(s, IntImm) else repr(s)
                           for s in b.shape) + ")"


def strip_root(func: PrimFunc) -> tuple[Stmt, tuple[Buffer, ...]]:
    """The body of ``func`` below its root block (a block with no iter vars), and the buffers
    that root block allocates."""
    body = func.body
    if isinstance(body, BlockRealize) and not body.block.iter_vars:
        return body.block.body, body.block.alloc_buffers
    return body, ()


# =============================================================================================
# building desc / impl functions


def _func(buffers: Sequence[Buffer], body: Stmt, alloc: Sequence[Buffer] = ()) -> PrimFunc:
    """A PrimFunc over ``buffers`` whose root block (allocating ``alloc``) holds ``body``."""
    root = with_regions(Block("root", [], [], [], body, None, tuple(alloc)))
    handles = [Var(b.name.lower(), "handle") for b in buffers]
    return PrimFunc(handles, BlockRealize([], None, root), dict(zip(handles, buffers)))


def _block_nest(name: str, axes: Sequence[tuple[str, int, str]],
                body_fn: Callable[..., Stmt]) -> Stmt:
    """``for a in range(e): ... block name (iter vars va of kind k bound to a): body_fn(va...)``."""
    loops = [Var(a, "int64") for a, _, _ in axes]
    ivs = [IterVar(Var("v" + a, "int64"), Range(0, e), k) for a, e, k in axes]
    block = with_regions(Block(name, ivs, [], [], body_fn(*[iv.var for iv in ivs])))
    stmt: Stmt = BlockRealize(loops, None, block)
    for lv, (_, e, _) in reversed(list(zip(loops, axes))):
        stmt = For(lv, 0, e, "serial", stmt)
    return stmt


def _loop(name: str, extent: int, kind: str, body_fn: Callable[[Var], Stmt]) -> Stmt:
    v = Var(name, "int64")
    return For(v, 0, extent, kind, body_fn(v))


def _zero(dtype: str) -> PrimExpr:
    return FloatImm(0.0, dtype) if dt.is_float(dtype) else IntImm(0, dtype)


def _check_tile(what: str, MR: int, NR: int, lanes: int) -> None:
    for n, v in (("MR", MR), ("NR", NR), ("lanes", lanes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TIRError(f"{what}: {n} must be a positive int, got {v!r}")
    if NR % lanes:
        raise TIRError(f"{what}: NR={NR} must be a multiple of the {lanes} vector lanes")


def outer_product_funcs(MR: int, NR: int, lanes: int, dtype: str = "float32"
                        ) -> tuple[PrimFunc, PrimFunc]:
    """``(desc, impl)`` of the outer-product update ``C[i, j] += A[i, 0] * B[0, j]``,
    ``i < MR``, ``j < NR`` (one k step of a GEMM micro-kernel).

    The impl unrolls the ``MR`` rows and the ``NR / lanes`` vectors of a row and vectorizes
    each vector: a broadcast of ``A[i, 0]``, a vector load of ``B``, a vector multiply-add into
    ``C``.

    Examples
    --------
    >>> desc, impl = outer_product_funcs(4, 16, lanes=16)
    >>> print(impl.script())                                   # doctest: +SKIP
    for i in T.unroll(4):
        for jo in T.unroll(1):
            for ji in T.vectorized(16):
                C[i, jo * 16 + ji] = C[i, jo * 16 + ji] + A[i, 0] * B[0, jo * 16 + ji]
    """
    _check_tile("outer_product_funcs", MR, NR, lanes)
    A = Buffer("A", (MR, 1), dtype)
    B = Buffer("B", (1, NR), dtype)
    C = Buffer("C", (MR, NR), dtype)
    desc = _func([A, B, C], _block_nest(
        "update", [("i", MR, "spatial"), ("j", NR, "spatial")],
        lambda vi, vj: BufferStore(C, C[vi, vj] + A[vi, 0] * B[0, vj], [vi, vj])))
    A, B, C = (Buffer(b.name, b.shape, dtype) for b in (A, B, C))

    def row(i):
        def vec(jo):
            def lane(ji):
                j = jo * lanes + ji
                return BufferStore(C, C[i, j] + A[i, 0] * B[0, j], [i, j])
            return _loop("ji", lanes, "vectorized", lane)
        return _loop("jo", NR // lanes, "unrolled", vec)

    impl = _func([A, B, C], _loop("i", MR, "unrolled", row))
    return desc, impl


def fill_funcs(MR: int, NR: int, lanes: int, dtype: str = "float32", value: float = 0.0
               ) -> tuple[PrimFunc, PrimFunc]:
    """``(desc, impl)`` of ``C[i, j] = value`` over an ``MR x NR`` tile (a reduction's init):
    unrolled rows of vector stores.

    Examples
    --------
    >>> desc, impl = fill_funcs(4, 16, lanes=16)
    """
    _check_tile("fill_funcs", MR, NR, lanes)
    const = FloatImm(float(value), dtype) if dt.is_float(dtype) else IntImm(int(value), dtype)
    C = Buffer("C", (MR, NR), dtype)
    desc = _func([C], _block_nest(
        "init", [("i", MR, "spatial"), ("j", NR, "spatial")],
        lambda vi, vj: BufferStore(C, const, [vi, vj])))
    C = Buffer("C", (MR, NR), dtype)
    impl = _func([C], _loop("i", MR, "unrolled", lambda i: _loop(
        "jo", NR // lanes, "unrolled", lambda jo: _loop(
            "ji", lanes, "vectorized",
            lambda ji: BufferStore(C, const, [i, jo * lanes + ji])))))
    return desc, impl


def dot_product_funcs(L: int, lanes: int, in_dtype: str = "float32",
                      acc_dtype: str | None = None) -> tuple[PrimFunc, PrimFunc]:
    """``(desc, impl)`` of ``C[0] += sum_k A[k] * B[k]`` over ``k < L``.

    With ``acc_dtype`` different from ``in_dtype`` (``int8`` -> ``int32``) the products are of
    the inputs cast to ``acc_dtype``. The impl keeps ``lanes`` partial sums in a local vector
    (vector multiply, then one vector multiply-add per further chunk of ``lanes``), adds its
    halves together until one lane is left (the horizontal add) and adds that to ``C[0]``.
    ``L`` must be a multiple of ``lanes``, ``lanes`` a power of two.

    Examples
    --------
    >>> desc, impl = dot_product_funcs(16, lanes=8)
    >>> desc, impl = dot_product_funcs(32, lanes=8, in_dtype="int8", acc_dtype="int32")
    """
    acc_dtype = acc_dtype or in_dtype
    _check_tile("dot_product_funcs", 1, L, lanes)
    if lanes & (lanes - 1):
        raise TIRError(f"dot_product_funcs: lanes={lanes} must be a power of two (the "
                       f"horizontal add halves the vector)")

    def prod(A, B, k):
        a, b = A[k], B[k]
        if acc_dtype != in_dtype:
            a, b = Cast(acc_dtype, a), Cast(acc_dtype, b)
        return a * b

    A, B, C = Buffer("A", (L,), in_dtype), Buffer("B", (L,), in_dtype), Buffer("C", (1,), acc_dtype)
    desc = _func([A, B, C], _block_nest(
        "update", [("k", L, "reduce")],
        lambda vk: BufferStore(C, C[0] + prod(A, B, vk), [0])))

    A, B, C = Buffer("A", (L,), in_dtype), Buffer("B", (L,), in_dtype), Buffer("C", (1,), acc_dtype)
    acc = Buffer("acc", (lanes,), acc_dtype, scope="local")
    steps: list[Stmt] = [_loop("v", lanes, "vectorized",
                               lambda v: BufferStore(acc, prod(A, B, v), [v]))]
    if L > lanes:
        steps.append(_loop("c", L // lanes - 1, "unrolled", lambda c: _loop(
            "v", lanes, "vectorized",
            lambda v: BufferStore(acc, acc[v] + prod(A, B, (c + 1) * lanes + v), [v]))))
    half = lanes // 2
    while half >= 1:
        steps.append(_loop("v", half, "vectorized",
                           lambda v, h=half: BufferStore(acc, acc[v] + acc[v + h], [v])))
        half //= 2
    steps.append(BufferStore(C, C[0] + acc[0], [0]))
    impl = _func([A, B, C], seq(*steps), alloc=[acc])
    return desc, impl


def _byte_word(get: Callable[[int], PrimExpr]) -> PrimExpr:
    """The int32 word of the four 8-bit values ``get(0..3)`` (byte ``p`` = ``get(p)``'s two's
    complement byte, byte 0 the least significant), assembled in uint32 (no sign bit to
    overflow into), then reinterpreted as int32."""
    total = None
    for p in range(4):
        v = get(p)
        if v.dtype == "int8":
            v = Cast("uint8", v)              # -1 -> 255
        v = Cast("uint32", v) * IntImm(1 << (8 * p), "uint32")
        total = v if total is None else total + v
    return Cast("int32", total)


DOT4_DTYPES = {"u8i8": ("uint8", "int8"), "i8u8": ("int8", "uint8")}


def dot4_funcs(L: int, order: str = "u8i8") -> tuple[PrimFunc, PrimFunc]:
    """``(desc, impl)`` of ``C[j] += sum_k int32(A[k]) * int32(B[k, j])``, ``k < 4``,
    ``j < L``: ``A`` (4,) uint8 and ``B`` (4, L) int8 with ``order="u8i8"``, the reverse with
    ``"i8u8"``; ``C`` (L,) int32.

    The impl assembles ``A``'s four bytes into one int32 word (broadcast) and ``B``'s four
    bytes of each lane into a vector of words, and adds ``dot4_u8i8(u8 word, i8 word)`` to
    ``C`` (the LLVM back end emits ``vpdpbusd`` / ``sdot`` / the widening sequence). Exact:
    at most ``4 * 255 * 128`` per step.

    Examples
    --------
    >>> desc, impl = dot4_funcs(16)
    >>> [b.dtype for b in desc.buffers]
    ['uint8', 'int8', 'int32']
    """
    if order not in DOT4_DTYPES:
        raise TIRError(f"dot4_funcs: order must be one of {sorted(DOT4_DTYPES)}, got {order!r}")
    if isinstance(L, bool) or not isinstance(L, int) or L < 1:
        raise TIRError(f"dot4_funcs: L must be a positive int, got {L!r}")
    a_dt, b_dt = DOT4_DTYPES[order]

    def buffers():
        return (Buffer("A", (4,), a_dt), Buffer("B", (4, L), b_dt), Buffer("C", (L,), "int32"))

    A, B, C = buffers()
    kl, jl = Var("k", "int64"), Var("j", "int64")
    vk, vj = IterVar(Var("vk", "int64"), Range(0, 4), "reduce"), \
        IterVar(Var("vj", "int64"), Range(0, L), "spatial")
    # iter vars spatial first (a te.compute block's order), loops k outside j (the tile's)
    update = BufferStore(C, C[vj.var] + Cast("int32", A[vk.var]) * Cast("int32", B[vk.var, vj.var]),
                         [vj.var])
    block = with_regions(Block("update", [vj, vk], [], [], update))
    desc = _func([A, B, C], For(kl, 0, 4, "serial", For(jl, 0, L, "serial",
                                                          BlockRealize([jl, kl], None, block))))

    A, B, C = buffers()

    def lane(j):
        a = _byte_word(lambda p: A[p])
        b = _byte_word(lambda p: B[p, j])
        u8, i8 = (a, b) if order == "u8i8" else (b, a)
        return BufferStore(C, C[j] + call(DOT4_U8I8, u8, i8, dtype="int32"), [j])

    impl = _func([A, B, C], _loop("j", L, "vectorized", lane))
    return desc, impl


def dot4_name(order: str, L: int) -> str:
    """The registered name of the 8-bit dot-product step over ``L`` lanes (built if needed).

    Examples
    --------
    >>> dot4_name("u8i8", 16)
    'dot4_u8i8_16'
    """
    name = f"dot4_{order}_{L}"
    TensorIntrin.get(name)
    return name


AMX_MAX_ROWS = 32   # two 16-row A tiles (targets.llvm.amx)


def amx_funcs(M: int, N: int, K: int) -> tuple[PrimFunc, PrimFunc, Var]:
    """``(desc, impl, rows)`` of the Intel AMX int8 block product
    ``C[i, j] += sum_kw dot4_u8i8(A[i, kw], B[kw, j])``, ``i < M``, ``j < N``, ``kw < K / 4``:
    ``A`` (M, K/4) the uint8 activations as int32 words (four bytes of a row each), ``B``
    (K/4, N) the int8 weight in the VNNI layout (word ``[kw, j]`` holding ``W[4 kw + p, j]`` in
    byte ``p``), ``C`` (M, N) int32 (the operand layouts of ``relax.backend.cpu.dense_int8``).

    The impl is one ``AMX_U8I8`` call (``tensorir.expr``; ``targets.llvm.amx`` emits the tile
    configuration, ``tileloadd`` / ``tdpbusd`` / ``tilestored``): the C tiles stay in tile
    registers across the whole ``K``. ``rows`` (a Var of the impl, ``partial[0]``) is the
    count of valid rows, so a ragged last block of rows is one call too; along ``j`` the call
    computes whole tiles (``partial[1] = None``). ``M`` is 1..32, ``N`` a multiple of 16 (C
    tiles of 16 int32 columns), ``K`` (bytes) a multiple of 64 (one ``tdpbusd`` step).

    Examples
    --------
    >>> desc, impl, rows = amx_funcs(32, 64, 256)
    >>> [b.shape for b in desc.buffers]                       # doctest: +SKIP
    [(32, 64), (64, 64), (32, 64)]
    """
    for n, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TIRError(f"amx_funcs: {n} must be a positive int, got {v!r}")
    if M > AMX_MAX_ROWS or N % 16 or K % 64:
        raise TIRError(f"amx_funcs: the AMX tile is up to {AMX_MAX_ROWS} rows (M={M}), whole C "
                       f"tiles of 16 int32 columns (N={N}) and whole steps of 64 bytes of K "
                       f"(K={K})")
    KW = K // 4

    def buffers():
        return (Buffer("A", (M, KW), "int32"), Buffer("B", (KW, N), "int32"),
                Buffer("C", (M, N), "int32"))

    A, B, C = buffers()
    desc = _func([A, B, C], _block_nest(
        "update", [("i", M, "spatial"), ("j", N, "spatial"), ("kw", KW, "reduce")],
        lambda vi, vj, vk: BufferStore(
            C, C[vi, vj] + call(DOT4_U8I8, A[vi, vk], B[vk, vj], dtype="int32"), [vi, vj])))
    A, B, C = buffers()
    rows = Var("rows", "int64")
    nxt = min(1, M - 1)     # the next row's first element: the row stride in any layout
    impl = _func([A, B, C], Evaluate(Call("int32", AMX_U8I8, [
        C[0, 0], A[0, 0], B[0, 0], C[nxt, 0], A[nxt, 0], B[1, 0], rows, KW // 16, N // 16])))
    return desc, impl, rows


def amx_name(M: int, N: int, K: int) -> str:
    """The registered name of the AMX int8 block product of ``M x N`` int32 results over
    ``K`` bytes (built if needed).

    Examples
    --------
    >>> amx_name(32, 64, 768)
    'amx_u8s8s32_32x64x768'
    """
    name = f"amx_u8s8s32_{M}x{N}x{K}"
    TensorIntrin.get(name)
    return name


# =============================================================================================
# the built-in families


def _isa_alt() -> str:
    return "|".join(ISA_LANES)


def _outer_product(m: re.Match) -> TensorIntrin:
    isa, MR, NR = m.group(1), int(m.group(2)), int(m.group(3))
    return TensorIntrin(m.group(0), *outer_product_funcs(MR, NR, ISA_LANES[isa]), isa=isa)


def _fill_zero(m: re.Match) -> TensorIntrin:
    isa, MR, NR = m.group(1), int(m.group(2)), int(m.group(3))
    return TensorIntrin(m.group(0), *fill_funcs(MR, NR, ISA_LANES[isa]), isa=isa)


def _dot_f32(m: re.Match) -> TensorIntrin:
    isa, L = m.group(1), int(m.group(2))
    return TensorIntrin(m.group(0), *dot_product_funcs(L, ISA_LANES[isa]), isa=isa)


def _dot_i8(m: re.Match) -> TensorIntrin:
    isa, L = m.group(1), int(m.group(2))
    # int32 accumulators: as many lanes as fp32
    return TensorIntrin(m.group(0), *dot_product_funcs(L, ISA_LANES[isa], "int8", "int32"),
                        isa=isa)


def _dot4(m: re.Match) -> TensorIntrin:
    return TensorIntrin(m.group(0), *dot4_funcs(int(m.group(2)), m.group(1)))


def _amx(m: re.Match) -> TensorIntrin:
    desc, impl, rows = amx_funcs(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return TensorIntrin(m.group(0), desc, impl, isa="amx", partial={0: rows, 1: None})


def _tile_names(prefix: str) -> Callable[[], list[str]]:
    def names():
        return [f"{prefix}_{isa}_{mr}x{lanes * nv}" for isa, lanes in ISA_LANES.items()
                for mr in DEFAULT_MR for nv in DEFAULT_NR_VECTORS]
    return names


def _dot_names(prefix: str) -> Callable[[], list[str]]:
    def names():
        return [f"{prefix}_{isa}_{lanes * nv}" for isa, lanes in ISA_LANES.items()
                for nv in DEFAULT_DOT_VECTORS]
    return names


_N = r"([1-9][0-9]*)"  # a positive size


TensorIntrin._register_family(rf"outer_product_f32_({_isa_alt()})_{_N}x"
                              rf"{_N}", _outer_product,
                              _tile_names("outer_product_f32"),
                              "outer_product_f32_{isa}_{MR}x{NR}")
TensorIntrin._register_family(rf"fill_zero_f32_({_isa_alt()})_{_N}x{_N}",
                              _fill_zero, _tile_names("fill_zero_f32"),
                              "fill_zero_f32_{isa}_{MR}x{NR}")
TensorIntrin._register_family(rf"dot_product_f32_({_isa_alt()})_{_N}", _dot_f32,
                              _dot_names("dot_product_f32"), "dot_product_f32_{isa}_{L}")
TensorIntrin._register_family(rf"dot_product_i8i32_({_isa_alt()})_{_N}", _dot_i8,
                              _dot_names("dot_product_i8i32"), "dot_product_i8i32_{isa}_{L}")

TensorIntrin._register_family(rf"dot4_(u8i8|i8u8)_{_N}", _dot4,
                              lambda: [f"dot4_{o}_{L}" for o in DOT4_DTYPES for L in (4, 8, 16)],
                              "dot4_{u8i8|i8u8}_{L}")
TensorIntrin._register_family(rf"amx_u8s8s32_{_N}x{_N}x{_N}", _amx,
                              lambda: [f"amx_u8s8s32_{m}x{n}x64" for m in (16, 32)
                                       for n in (16, 32, 64)],
                              "amx_u8s8s32_{M}x{N}x{K}")


def outer_product_name(isa: str, MR: int, NR: int) -> str:
    """The registered name of the fp32 outer-product micro-kernel for ``isa`` and an
    ``MR x NR`` tile (built and registered if needed).

    Examples
    --------
    >>> outer_product_name("avx512", 6, 32)
    'outer_product_f32_avx512_6x32'
    """
    if isa not in ISA_LANES:
        raise TIRError(f"outer_product_name: unknown isa {isa!r}; expected one of "
                       f"{sorted(ISA_LANES)}")
    name = f"outer_product_f32_{isa}_{MR}x{NR}"
    TensorIntrin.get(name)
    return name


# =============================================================================================
# which intrinsics a target can use


def target_isas(target) -> list[str]:
    """The instruction sets of ``ISA_LANES`` that ``target`` has, widest first.

    ``target`` is anything with ``.arch``, ``.mattr`` and ``.vector_width`` (a
    ``targets.Target``; tensorir does not import ``targets``). On x86, AVX-512 needs
    ``+avx512f`` or a 512-bit vector width and AVX2 ``+avx2`` / ``+fma`` or 256 bits; every
    aarch64 CPU has NEON, a 32-bit ARM one needs ``+neon``.

    Examples
    --------
    >>> class T: arch, mattr, vector_width = "aarch64", ("+neon",), 128
    >>> target_isas(T())
    ['neon']
    """
    for attr in ("arch", "mattr", "vector_width"):
        if not hasattr(target, attr):
            raise TIRError(f"intrinsics.available: target {target!r} has no attribute "
                           f"{attr!r}; pass a targets.Target (or an object with .arch, .mattr, "
                           f".vector_width)")
    arch = str(target.arch)
    mattr = {str(m) for m in (target.mattr or ())}
    width = int(target.vector_width or 0)
    out = []
    if arch in ("x86_64", "x86"):
        if "-avx512f" not in mattr and ("+avx512f" in mattr or width >= 512):
            out.append("avx512")
        if "-avx2" not in mattr and ({"+avx2", "+avx512f"} & mattr or width >= 256):
            out.append("avx2")
    elif arch == "aarch64" or (arch == "arm" and "+neon" in mattr):
        if "-neon" not in mattr:
            out.append("neon")
    return out


def available(target) -> list[str]:
    """Names of the tensor intrinsics ``target`` can use: the default sizes of the built-in
    families for the target's instruction sets, plus every registered intrinsic whose isa the
    target has (or that has no isa: portable TIR).

    Examples
    --------
    >>> class AVX512: arch, mattr, vector_width = "x86_64", ("+avx512f",), 512
    >>> "outer_product_f32_avx512_4x16" in available(AVX512())
    True
    """
    isas = set(target_isas(target))
    if getattr(target, "amx_int8", False):
        isas.add("amx")       # Intel AMX int8 tiles (targets.Target.amx_int8)
    names: dict[str, None] = {}
    for _, _, defaults, _ in TensorIntrin._families:
        for n in defaults():
            if any(f"_{isa}_" in n or n.startswith(f"{isa}_") for isa in isas):
                names[n] = None
    for n, intrin in TensorIntrin._registry.items():
        if intrin.isa is None or intrin.isa in isas:
            names[n] = None
    return sorted(names)


__all__ = ["TensorIntrin", "ISA_LANES", "outer_product_funcs", "fill_funcs", "dot_product_funcs",
           "dot4_funcs", "dot4_name", "amx_funcs", "amx_name", "outer_product_name", "target_isas", "available",
           "strip_root"]
