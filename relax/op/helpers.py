"""Helpers shared by the operator files: argument checks, axis normalization, shape arithmetic,
numpy broadcasting over symbolic shapes, and kernels with run-time checks.

Broadcasting follows numpy, dimension by dimension from the right (a missing dim counts as 1):

* a dim that is the constant 1 broadcasts to the other;
* dims that are provably equal (``tensorir.arith.Analyzer``) match;
* two constants that differ, or two dims provably different, raise ``RelaxError`` naming the op;
* two dims that can be neither proven equal nor different (``n`` vs ``m``, ``n`` vs ``4``) are
  *assumed equal*: the result takes the constant one if there is one, else the left operand's.
  A symbolic dim is never broadcast at run time (it is assumed not to be 1); the legalized
  kernel checks each such assumption (``dim_checks`` and ``call_te``), so a mismatch fails at
  run time with a message naming the op and the dims.

``call_te`` is how a legalization emits a kernel: ``bb.call_te`` plus run-time checks (an
``AssertStmt`` around the kernel's loop nests) and scalar parameters for symbolic values no
buffer shape binds.

Examples
--------
>>> from tilecraft.tensorir import var
>>> n = var("n")
>>> broadcast_shapes("relax.add", (n, 1), (1, 4))
(n, 4)
"""
from __future__ import annotations

from typing import Callable, Sequence

from tilecraft.tensorir import arith, te
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.arith import Analyzer
from tilecraft.tensorir.expr import FloatImm, IntImm, Max, Min, PrimExpr, Var as TirVar, convert
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import AssertStmt, Block, BlockRealize, Buffer
from tilecraft.tensorir.structural import structural_equal

from ..block_builder import BlockBuilder, call_tir
from ..expr import Call, Expr, RelaxError, ShapeExpr
from ..struct_info import ShapeStructInfo, TensorStructInfo, TupleStructInfo

__all__ = [
    # arguments
    "tensor_sinfo", "check_nargs", "check_same_dtype", "result_dtype", "normalize_axis",
    "normalize_axes", "shape_expr", "shape_values",
    # dims and shapes
    "fmt_dim", "fmt_shape", "int64_expr", "imm", "shape_analyzer", "product", "min_expr",
    "max_expr", "dims_equal", "dims_differ", "check_equal_dims", "has_symbolic",
    "ravel_index", "unravel_index",
    # broadcasting
    "broadcast_shapes", "broadcast_assumptions", "broadcast_sinfo", "broadcast_index",
    # dtypes
    "DTYPE_FLOAT", "DTYPE_NUMERIC", "DTYPE_BOOL", "DTYPE_ANY", "dtype_accepts",
    "check_dtype_class", "float_acc_dtype", "is_numeric",
    # kernels
    "call_te", "dim_checks", "with_checks", "call_prim", "make_prim_func", "te_reshape",
    "out_name",
]


# ---------------------------------------------------------------------------------------------
# arguments

def tensor_sinfo(op_name: str, call: Call, index: int, what: str | None = None) -> TensorStructInfo:
    """The TensorStructInfo of ``call.args[index]``; raises naming the op if it is not a tensor."""
    if index >= len(call.args):
        raise RelaxError(f"{op_name}: expected at least {index + 1} argument(s), got "
                         f"{len(call.args)}", call)
    si = call.args[index].struct_info
    if not isinstance(si, TensorStructInfo):
        name = what or f"argument {index}"
        raise RelaxError(f"{op_name}: {name} must be a tensor, got {si!r}", call)
    return si


def check_nargs(op_name: str, call: Call, n: int) -> None:
    if len(call.args) != n:
        raise RelaxError(f"{op_name}: expected {n} argument(s), got {len(call.args)}", call)


def check_same_dtype(op_name: str, sinfos: Sequence[TensorStructInfo], names: Sequence[str],
                     node=None) -> str:
    """The common dtype of ``sinfos``; raises naming the op and the operands if they differ."""
    d0 = sinfos[0].dtype
    for si, nm in zip(sinfos[1:], names[1:]):
        if si.dtype != d0:
            raise RelaxError(f"{op_name}: operand dtypes differ: {names[0]} is {d0}, {nm} is "
                             f"{si.dtype}; cast one of them with relax.op.astype", node)
    return d0


def result_dtype(op_name: str, dtypes: Sequence[str], out_dtype: str | None) -> str:
    """``out_dtype`` if given, else the operands' common dtype (raises if they differ)."""
    if out_dtype:
        return out_dtype
    if len(set(dtypes)) > 1:
        raise RelaxError(f"{op_name}: the operand dtypes differ ({', '.join(dtypes)}); cast them "
                         f"or give out_dtype")
    return dtypes[0]


def normalize_axis(op_name: str, axis, ndim: int, what: str = "axis", node=None) -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int; raises ``RelaxError`` naming the op
    (and carrying ``node``) otherwise. ``ndim < 0`` (an unknown rank) accepts any axis >= 0.

    Examples
    --------
    >>> normalize_axis("relax.sum", -1, 3)
    2
    """
    if isinstance(axis, bool) or not isinstance(axis, int):
        if not hasattr(axis, "__index__"):   # numpy integers have it
            raise RelaxError(f"{op_name}: {what} must be an int, got {axis!r}", node)
        axis = int(axis)
    if ndim < 0:
        if axis < 0:
            raise RelaxError(f"{op_name}: a negative {what} ({axis}) needs a tensor of known "
                             f"rank", node)
        return axis
    if not -ndim <= axis < ndim:
        raise RelaxError(f"{op_name}: {what} {axis} is out of range for a tensor of rank {ndim} "
                         f"(valid: [{-ndim}, {ndim}))", node)
    return axis + ndim if axis < 0 else axis


def normalize_axes(op_name: str, axes, ndim: int, what: str = "axis") -> list[int]:
    """``axes`` (None = all, an int, or a list) as a sorted list of distinct non-negative ints."""
    if axes is None:
        if ndim < 0:
            raise RelaxError(f"{op_name}: {what}=None needs a tensor of known rank")
        return list(range(ndim))
    if isinstance(axes, (list, tuple)):
        out = [normalize_axis(op_name, a, ndim, what) for a in axes]
    else:
        out = [normalize_axis(op_name, axes, ndim, what)]
    if len(set(out)) != len(out):
        raise RelaxError(f"{op_name}: {what} {list(axes) if isinstance(axes, (list, tuple)) else axes}"
                         f" repeats a dimension")
    return sorted(out)


def shape_expr(op_name: str, shape) -> Expr:
    """A shape argument: a ShapeExpr / Var of ShapeStructInfo, or a tuple of ints and PrimExprs."""
    if isinstance(shape, Expr):
        if not isinstance(shape.struct_info, ShapeStructInfo):
            raise RelaxError(f"{op_name}: the shape must be a shape value, got "
                             f"{shape.struct_info!r}", shape)
        return shape
    if isinstance(shape, (int, PrimExpr)):
        shape = (shape,)
    try:
        return ShapeExpr([d if isinstance(d, (str, PrimExpr)) else int64_expr(d) for d in shape])
    except RelaxError:
        raise
    except Exception as err:
        raise RelaxError(f"{op_name}: bad shape {shape!r}: {err}") from None


def shape_values(call: Call, index: int) -> tuple[PrimExpr, ...] | None:
    """The values of the shape argument ``call.args[index]`` (None when unknown)."""
    si = call.args[index].struct_info
    if not isinstance(si, ShapeStructInfo):
        raise RelaxError(f"{call.op.name}: argument {index} must be a shape, got {si!r}", call)
    return si.values


# ---------------------------------------------------------------------------------------------
# dims and shapes

def fmt_dim(d) -> str:
    """A dim as text: ``4``, ``n * 2``."""
    return str(d.value) if isinstance(d, IntImm) else str(d)


def fmt_shape(shape) -> str:
    """A shape as text: ``(2, n * 4)``, ``(4,)``; ``(?)`` for an unknown shape."""
    if shape is None:
        return "(?)"
    return "(" + ", ".join(fmt_dim(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def int64_expr(x) -> PrimExpr:
    """An int64 expression of a Python int or an integer PrimExpr."""
    if isinstance(x, bool):
        raise RelaxError(f"expected an integer, got the bool {x!r}")
    if isinstance(x, int):
        return IntImm(x, "int64")
    if isinstance(x, PrimExpr):
        if not dt.is_integer(x.dtype):
            raise RelaxError(f"expected an integer expression, got {x!r} of {x.dtype}", x)
        return x.astype("int64")
    if hasattr(x, "__index__"):  # numpy integers
        return IntImm(int(x), "int64")
    raise RelaxError(f"expected an integer or an integer PrimExpr, got {x!r}")


def imm(value, dtype: str) -> PrimExpr:
    """A Python number as an immediate of ``dtype``."""
    if dt.is_float(dtype):
        return FloatImm(float(value), dtype)
    if dt.is_bool(dtype):
        return IntImm(1 if value else 0, dtype)
    return IntImm(int(value), dtype)


def shape_analyzer(*shapes) -> arith.Analyzer:
    """An analyzer that knows every variable in ``shapes`` (dims / expressions) is >= 0."""
    ana = arith.Analyzer()
    seen: set[int] = set()

    def visit(n):
        if isinstance(n, TirVar) and id(n) not in seen and dt.is_integer(n.dtype):
            seen.add(id(n))
            ana.update_bound(n, 0, None)

    def walk(x):
        if isinstance(x, PrimExpr):
            post_order_visit(x, visit)
        elif isinstance(x, (list, tuple)):
            for e in x:
                walk(e)

    walk(shapes)
    return ana


def product(dims, ana: arith.Analyzer | None = None) -> PrimExpr:
    """The simplified product of ``dims`` (1 for none)."""
    out: PrimExpr = IntImm(1, "int64")
    for d in dims:
        out = out * d
    return (ana or shape_analyzer(dims)).simplify(out)


def _extreme(ana, a, b, cls, le) -> PrimExpr:
    """``min`` / ``max`` of ``a`` and ``b`` over their flattened operands, dropping every operand
    that provably cannot be the result (the simplifier leaves ``max(max(n - 2, -1), 0)``)."""
    def terms(e):
        e = int64_expr(e)
        return terms(e.a) + terms(e.b) if isinstance(e, cls) else [ana.simplify(e)]
    keep: list[PrimExpr] = []
    for t in terms(a) + terms(b):
        if any(ana.can_prove(le(u, t)) for u in keep):
            continue  # an operand already kept is at least as extreme
        keep = [u for u in keep if not ana.can_prove(le(t, u))]
        keep.append(t)
    out = keep[0]
    for u in keep[1:]:
        out = cls(out, u)
    return ana.simplify(out)


def min_expr(ana, a, b) -> PrimExpr:
    """``min(a, b)``, decided by the analyzer where it can be."""
    return _extreme(ana, a, b, Min, lambda u, t: u <= t)


def max_expr(ana, a, b) -> PrimExpr:
    """``max(a, b)``, decided by the analyzer where it can be."""
    return _extreme(ana, a, b, Max, lambda u, t: u >= t)


def _is_one(d: PrimExpr) -> bool:
    return isinstance(d, IntImm) and d.value == 1


def dims_equal(a: PrimExpr, b: PrimExpr, ana: Analyzer | None = None) -> bool:
    """``a == b`` provably."""
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return a.value == b.value
    return (ana or Analyzer()).can_prove_equal(a, b)


def dims_differ(a: PrimExpr, b: PrimExpr, ana: Analyzer | None = None) -> bool:
    """``a != b`` provably."""
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return a.value != b.value
    return (ana or Analyzer()).can_prove(a != b)


def check_equal_dims(op_name: str, ana: Analyzer, x: PrimExpr, y: PrimExpr, what: str,
                     assume: list | None = None) -> None:
    """``RelaxError`` if ``x != y`` is provable; if ``x == y`` is not provable either, record the
    pair in ``assume`` for a run-time check (``dim_checks``)."""
    if ana.can_prove_equal(x, y):
        return
    if ana.can_prove(x != y):
        raise RelaxError(f"{op_name}: {what} differ: {fmt_dim(x)} vs {fmt_dim(y)}")
    if assume is not None:
        assume.append((x, y))


def has_symbolic(shape) -> bool:
    return any(not isinstance(d, IntImm) for d in shape)


def ravel_index(idx, shape) -> PrimExpr:
    """The row-major flat index of ``idx`` in ``shape``."""
    flat: PrimExpr = IntImm(0, "int64")
    for i, d in zip(idx, shape):
        flat = flat * d + i
    return flat


def unravel_index(flat, shape) -> tuple:
    """Row-major indices of ``flat`` in ``shape`` (the first index is not reduced modulo its dim,
    so an out-of-range flat index stays out of range and is caught by the bounds checks)."""
    out = []
    for d in reversed(shape[1:]):
        out.append(flat % d)
        flat = flat // d
    if shape:
        out.append(flat)
    return tuple(reversed(out))


# ---------------------------------------------------------------------------------------------
# broadcasting

def _align(shapes):
    nd = max(len(s) for s in shapes)
    one = IntImm(1, "int64")
    return nd, [(one,) * (nd - len(s)) + tuple(s) for s in shapes]


def _broadcast(op_name: str, shapes, node=None):
    """(output shape, assumptions): assumptions are (dim, dim) pairs taken to be equal."""
    ana = Analyzer()
    nd, aligned = _align(shapes)
    out, assumed = [], []
    for k in range(nd):
        cur = None
        cur_from = None
        for j, s in enumerate(aligned):
            d = s[k]
            if _is_one(d):
                continue
            if cur is None:
                cur, cur_from = d, j
                continue
            if dims_equal(cur, d, ana):
                continue
            if dims_differ(cur, d, ana):
                raise RelaxError(
                    f"{op_name}: cannot broadcast shapes {', '.join(fmt_shape(x) for x in shapes)}: "
                    f"dimension {k - nd} is {fmt_dim(cur)} in operand {cur_from} and {fmt_dim(d)} "
                    f"in operand {j}", node)
            assumed.append((cur, d))
            if isinstance(d, IntImm) and not isinstance(cur, IntImm):
                cur, cur_from = d, j  # the constant is the better-known value
        out.append(cur if cur is not None else IntImm(1, "int64"))
    return tuple(out), assumed


def broadcast_shapes(op_name: str, *shapes: Sequence[PrimExpr], node=None) -> tuple:
    """The numpy broadcast of ``shapes`` (tuples of int64 exprs); see the module docstring.

    Examples
    --------
    >>> broadcast_shapes("relax.add", (IntImm(3, "int64"), IntImm(1, "int64")), (IntImm(4, "int64"),))
    (3, 4)
    """
    return _broadcast(op_name, [tuple(convert(d) for d in s) for s in shapes], node)[0]


def broadcast_assumptions(op_name: str, *shapes) -> list[tuple[PrimExpr, PrimExpr]]:
    """The pairs of dims ``broadcast_shapes`` assumed equal without proof (check them at run
    time with ``dim_checks``)."""
    return _broadcast(op_name, [tuple(convert(d) for d in s) for s in shapes])[1]


def broadcast_sinfo(op_name: str, sinfos: Sequence[TensorStructInfo], dtype: str,
                    node=None) -> TensorStructInfo:
    """Struct info of the broadcast of tensors ``sinfos`` with result ``dtype`` (unknown shapes
    give an unknown shape of the larger rank, or an unknown rank)."""
    if any(si.ndim < 0 for si in sinfos):
        return TensorStructInfo(None, dtype, -1)
    if any(si.shape is None for si in sinfos):
        return TensorStructInfo(None, dtype, max(si.ndim for si in sinfos))
    return TensorStructInfo(_broadcast(op_name, [si.shape for si in sinfos], node)[0], dtype)


def broadcast_index(indices: Sequence, in_shape: Sequence[PrimExpr],
                    out_shape: Sequence[PrimExpr] | None = None) -> tuple:
    """The indices into an input of shape ``in_shape`` for output ``indices`` (right-aligned;
    index 0 where the input dim is 1 and the output's ``out_shape`` dim is not). Where both
    are 1 the output's own index is kept: ``lv[0, c]`` under an iter var ``b`` in ``[0, 1)``
    is the same point as ``lv[b, c]``, but only the latter reads as a permutation of the
    block's iter vars, which inlining an epilogue into its producer needs."""
    off = len(indices) - len(in_shape)
    out = []
    for k, d in enumerate(in_shape):
        o = out_shape[off + k] if out_shape is not None else None
        if isinstance(d, IntImm) and d.value == 1 and \
                not (isinstance(o, IntImm) and o.value == 1):
            out.append(IntImm(0, "int64"))
        else:
            out.append(indices[off + k])
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# kernels with run-time checks

def out_name(base: str, *inputs) -> str:
    """A te output name that differs from every input tensor's name (create_prim_func needs
    unique buffer names; inputs are named after the Relax variables)."""
    names = {t.name for t in inputs}
    name, k = base, 1
    while name in names:
        name = f"{base}_{k}"
        k += 1
    return name


def dim_checks(op_name: str, pairs: Sequence[tuple]) -> list[tuple[PrimExpr, str]]:
    """Run-time checks (for ``call_te``) that the dims of each ``(a, b)`` pair, assumed equal
    by shape inference, are equal; ``(a, b, message)`` gives the failure message.

    Examples
    --------
    >>> n, m = var("n"), var("m")                                     # doctest: +SKIP
    >>> dim_checks("relax.add", [(n, m)])[0][1]                       # doctest: +SKIP
    'relax.add: dimension n and dimension m must be equal (symbolic dims are not broadcast at run time)'
    """
    out = []
    for pair in pairs:
        a, b = pair[0], pair[1]
        msg = pair[2] if len(pair) > 2 else (
            f"{op_name}: dimension {fmt_dim(a)} and dimension {fmt_dim(b)} must be equal "
            f"(symbolic dims are not broadcast at run time)")
        out.append((a == b, msg))
    return out


def _unbindable_vars(func: PrimFunc, also=()) -> list[TirVar]:
    """Symbolic variables of ``func``'s buffer shapes (and ``also``) that a caller cannot bind
    from the arguments: those that are not a whole dimension of some buffer (``n`` in a buffer of
    shape ``(n * 12, 64)`` only) and are not scalar parameters already."""
    direct = {id(d) for b in func.buffers for d in b.shape if isinstance(d, TirVar)}
    direct |= {id(v) for v in func.scalar_params}
    out: list[TirVar] = []

    def visit(n):
        if isinstance(n, TirVar) and id(n) not in direct and all(n is not o for o in out):
            out.append(n)
    for b in func.buffers:
        for d in b.shape:
            post_order_visit(d, visit)
    for e in also:
        post_order_visit(e, visit)
    return out


def with_checks(func: PrimFunc, checks: Sequence[tuple[PrimExpr, str]]) -> PrimFunc:
    """``func`` with an ``AssertStmt`` per check around the loop nests of its root block.

    Around, not ahead of them: ``split_host_device`` then keeps each check on the host, where a
    failure raises before any launch (a check ahead of the nests becomes a kernel of its own,
    with an error word read back). Schedule primitives that remove the nest a check encloses
    (``compute_inline`` after FuseTIR) keep the check over an empty body.
    """
    root_realize = func.body
    root = root_realize.block
    body = root.body
    for cond, msg in reversed(list(checks)):
        body = AssertStmt(cond, msg, body)
    return func.replace(body=root_realize.replace(block=root.replace(body=body)))


def call_te(bb, te_func: Callable, *args, checks: Sequence = (), scalars: Sequence = (),
            primfunc_name_hint: str | None = None, attrs: dict | None = None,
            **kwargs) -> Call:
    """``bb.call_te(te_func, *args, **kwargs)`` with run-time checks and extra scalar parameters.

    Parameters
    ----------
    checks : sequence of (bool PrimExpr, message) or None
        Conditions over the argument / output dims that shape inference could not prove (None
        entries are skipped, repeated conditions kept once), each asserted around the kernel's
        loop nests; ``dim_checks`` makes them from pairs of dims assumed equal.
    scalars : sequence of PrimExpr
        Symbolic values the body uses that no buffer shape binds: their variables become scalar
        parameters of the kernel, as does every shape variable it could not bind from its
        arguments (``n`` of an input of shape ``(n * 12, 64)``). The VM passes their values.
    primfunc_name_hint : str, optional
        The kernel's name (made unique in ``bb``).
    attrs : dict, optional
        Attributes of the kernel's PrimFunc (``RESHAPE_VIEW``: the kernel copies its input
        unchanged into another shape, so a call of it alone may be a view instead).

    The kernel is built by ``call_te`` in a scratch BlockBuilder, amended, and added to ``bb``
    (identical kernels are still shared). Without checks or scalars, a kernel ``bb`` made before
    for the same te function on tensors of the same static shapes and dtypes, with the same
    other arguments, is called again without being made (``BlockBuilder.reuse_te_kernel``).

    Examples
    --------
    >>> call = call_te(bb, te_add, x, y, checks=dim_checks("relax.add", [(n, m)]),
    ...                primfunc_name_hint="add")                  # doctest: +SKIP
    """
    unique: list[tuple[PrimExpr, str]] = []
    for check in checks:
        if check is not None and not any(structural_equal(check[0], c) for c, _ in unique):
            unique.append((check[0], check[1]))
    # without checks or scalars the kernel is bb.call_te's: one made before for the same te
    # function on tensors of the same static shapes and dtypes, with the same other arguments
    keyed = None
    if not unique and not scalars:
        keyed, reused = bb.reuse_te_kernel(te_func, args, kwargs)
        if reused is not None:
            return reused
    scratch = BlockBuilder()
    call = scratch.call_te(te_func, *args, primfunc_name_hint=primfunc_name_hint, **kwargs)
    gvar = call.args[0]
    func = scratch.get()[gvar.name_hint]
    tir_vars = list(call.args[2].values) if len(call.args) == 3 else []
    extra = _unbindable_vars(func, scalars)
    if extra:
        func = func.replace(params=list(func.params) + extra)
    if unique:
        func = with_checks(func, unique)
    for key, value in (attrs or {}).items():
        func = func.with_attr(key, value)
    new_gvar = bb.add_func(func, gvar.name_hint)
    if not tir_vars and not extra:
        bb.remember_te_kernel(keyed, new_gvar.name_hint, list(call.sinfo_args[0].fields)
                              if isinstance(call.sinfo_args[0], TupleStructInfo)
                              else [call.sinfo_args[0]], func)
    return call_tir(new_gvar, call.args[1], call.sinfo_args[0],
                    tir_vars=(tir_vars + extra) or None)


def make_prim_func(buffers: Sequence[Buffer], body, name: str) -> PrimFunc:
    """A PrimFunc over ``buffers`` (in parameter order) whose root block runs ``body``."""
    params, buffer_map = [], {}
    for b in buffers:
        h = TirVar(b.name + "_handle", "handle")
        params.append(h)
        buffer_map[h] = b
    root = Block("root", [], [], [], body)
    return PrimFunc(params, BlockRealize([], None, root), buffer_map,
                    attrs={"global_symbol": name})


def call_prim(bb, func: PrimFunc, name: str, args, out_sinfo, tir_vars=None) -> Call:
    """Add the hand-written kernel ``func`` and call it; shape variables it cannot bind from its
    arguments become extra scalar parameters."""
    tir_vars = list(tir_vars or [])
    extra = _unbindable_vars(func)
    if extra:
        func = func.replace(params=list(func.params) + extra)
    gvar = bb.add_func(func, name)
    return call_tir(gvar, list(args), out_sinfo, tir_vars=(tir_vars + extra) or None)


# The attribute of a kernel that only copies its one input, row-major, into another shape
# (reshape, flatten, expand_dims, a squeeze of static unit dims): where such a call is not fused
# with anything, ``relax.transform.RewriteReshapeView`` makes it a view of its input.
RESHAPE_VIEW = "relax.reshape_view"


def te_reshape(a: te.Tensor, new_shape) -> te.Tensor:
    """``a`` reshaped (row-major) to ``new_shape``."""
    new_shape = tuple(new_shape)
    return te.compute(new_shape,
                      lambda *i: a[unravel_index(ravel_index(i, new_shape), a.shape)],
                      "T_reshape")


# ---------------------------------------------------------------------------------------------
# dtypes

# dtype classes an operator accepts
DTYPE_FLOAT = "float"       # float16/32/64
DTYPE_NUMERIC = "numeric"   # ints, uints and floats
DTYPE_BOOL = "bool"
DTYPE_ANY = "any"           # numeric and bool

_CLASS_TEXT = {DTYPE_FLOAT: "a float", DTYPE_NUMERIC: "a numeric (int, uint or float)",
               DTYPE_BOOL: "a bool", DTYPE_ANY: "a numeric or bool"}


def dtype_accepts(cls: str, dtype: str) -> bool:
    """Whether ``dtype`` is in the dtype class ``cls`` (``DTYPE_FLOAT`` ...)."""
    if cls == DTYPE_FLOAT:
        return dt.is_float(dtype)
    if cls == DTYPE_NUMERIC:
        return dt.is_float(dtype) or dt.is_integer(dtype)
    if cls == DTYPE_BOOL:
        return dt.is_bool(dtype)
    return True


def check_dtype_class(op_name: str, cls: str, dtype: str, node=None) -> None:
    """``RelaxError`` naming the op unless ``dtype`` is in the class ``cls``."""
    if not dtype_accepts(cls, dtype):
        raise RelaxError(f"{op_name}: needs {_CLASS_TEXT[cls]} tensor, got {dtype}", node)


def float_acc_dtype(dtype: str) -> str:
    """The dtype reductions accumulate in: float16 -> float32, others unchanged."""
    return "float32" if dtype == "float16" else dtype


def is_numeric(dtype: str) -> bool:
    return dt.is_float(dtype) or dt.is_integer(dtype)
