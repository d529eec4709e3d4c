"""``SinkReshape``: element-wise operations read the value from before a reshape that only
splits or merges leading dims, and the reshape moves after them.

Exports often wrap a dense layer in reshapes: GPT-2's ``Conv1D`` is ``x.view(-1, d)``, ``addmm``,
``.view(batch, seq, n)``, and its tanh GELU then runs on the 3-d view before the next layer's
``view(-1, n)``. ``FuseOps`` takes an element-wise epilogue into a dense layer only along
element-wise edges, and a reshape is an injective edge, so the GELU became a kernel of its own
(the reshape, the GELU, the reshape back) that wrote and read the layer's whole output once more.
A reshape that keeps the last dim and only splits or merges the dims before it changes no
element's position in memory, so an element-wise operation gives the same values before it as
after it. This pass rewrites

    v = reshape(x, S)  ...  y = op(v, c)        into        y2 = op(x, c2);  y = reshape(y2, S)

for every element-wise or broadcast operator ``op`` (``relax.op`` pattern ELEMWISE or BROADCAST)
whose other operands ``c`` broadcast along the last dim only (a scalar, a vector, or dims of 1
before the last: ``c2`` is ``c`` as a vector), or are themselves such reshapes of values of
``x``'s shape. ``reshape(reshape(x))`` becomes one reshape, and a reshape back to ``x``'s own
shape becomes ``x``: the dense layer's output goes through the GELU into the next dense layer
with no reshape left, and ``FuseOps`` fuses the GELU as the first layer's epilogue. Reshapes
nobody reads any more are removed (``DeadCodeElimination``).

Operations move as connected groups, and only a group whose results are read by the group
itself and by reshapes back (which then disappear): a result still read in the reshaped shape
would need its reshape after the group, a copy kernel of its own (a reshape after a dense
layer's epilogue does not fuse with a layer norm or a dense layer reading it), where the group
now is one kernel with the reshape before it.

Examples
--------
>>> # lv = R.matmul(x2d, W)                 lv = R.matmul(x2d, W)
>>> # v = R.reshape(lv, (b, s, n))          t = R.tanh(lv)
>>> # t = R.tanh(v)                  ->     y = R.multiply(lv, t)
>>> # y = R.multiply(v, t)                  z = R.matmul(y, W2)
>>> # u = R.reshape(y, (b * s, n))
>>> # z = R.matmul(u, W2)
>>> # new_mod = SinkReshape()(mod)
"""
from __future__ import annotations

from tilecraft.tensorir.function import IRModule
from tilecraft.tensorir.structural import structural_equal

from ..analysis import get_var2val, udchain
from ..expr import Call, Constant, DataflowVar, Function, PrimValue, Var, VarBinding
from ..op.base import Op, OpPattern
from ..op.manipulate import reshape
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass
from .dead_code_elimination import DeadCodeElimination

__all__ = ["SinkReshape", "is_leading_reshape"]


class SinkReshape(Pass):
    """Move reshapes that only split or merge leading dims after the element-wise operations
    that read them (see the module docstring).

    Examples
    --------
    >>> new_mod = SinkReshape()(mod)   # doctest: +SKIP
    """

    name = "SinkReshape"

    def transform_module(self, mod: IRModule) -> IRModule:
        plans = {name: plan(f) for name, f in mod.functions.items() if isinstance(f, Function)}
        if not any(plans.values()):
            return mod
        return DeadCodeElimination()(_Sinker(mod, plans).visit_module())


def _shape(e) -> tuple | None:
    si = getattr(e, "struct_info", None)
    if not isinstance(si, TensorStructInfo) or si.shape is None:
        return None
    return tuple(si.shape)


def _same_dims(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(structural_equal(x, y) for x, y in zip(a, b))


def _is_one(d) -> bool:
    return getattr(d, "value", d) == 1


def is_leading_reshape(src_shape: tuple | None, out_shape: tuple | None) -> bool:
    """Whether a reshape from ``src_shape`` to ``out_shape`` keeps the last dim (provably: the
    same expression) and so only splits or merges the dims before it. Every element keeps its
    row-major position, and the element counts of a reshape are equal, so the leading dims'
    products are equal too.

    Examples
    --------
    >>> is_leading_reshape((6, 4), (2, 3, 4)), is_leading_reshape((6, 4), (6, 2, 2))
    (True, False)
    """
    if not src_shape or not out_shape:
        return False
    return structural_equal(src_shape[-1], out_shape[-1])


def _op_name(e) -> str | None:
    return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None


def _vector_operand(a) -> bool | None:
    """For an operand that is no moved reshape: True if it must become a vector (dims of 1
    before its last), False if it can stay (a scalar, a vector, a PrimValue), None if it
    broadcasts along a leading dim (or is not a tensor) and so stops the move."""
    if isinstance(a, PrimValue):
        return False
    shape = _shape(a)
    if shape is None or not isinstance(a, (Var, Constant)):
        return None
    if len(shape) <= 1:
        return False
    return True if all(_is_one(d) for d in shape[:-1]) else None


def _inner_shape(value: Call, out: tuple, source_of) -> tuple | None:
    """The shape ``value`` (an element-wise call whose result has shape ``out``) has on the
    values before the reshapes (``source_of(arg)``: that value's shape, or None for an operand
    that is no such reshape), or None where it cannot move."""
    inner = None
    for a in value.args:
        src = source_of(a)
        if src is not None:
            if not _same_dims(_shape(a), out):
                return None            # broadcast up to the output: not a plain row map
            if inner is not None and not _same_dims(inner, src):
                return None
            inner = src
        elif _vector_operand(a) is None:
            return None
    return inner


def plan(func) -> set[int]:
    """The element-wise bindings of ``func`` (``id`` of their variables) that move before the
    reshapes: each connected group of them whose results are read only by one another and by
    reshapes back to the shape they move to. A group read in the reshaped shape elsewhere
    stays: its reshape after it would be a copy of its own where it now fuses with the group.
    """
    var2val = get_var2val(func)
    users = udchain(func)
    source: dict[int, tuple] = {}      # id(var) -> the shape of the value before its reshape
    moved: dict[int, Var] = {}         # id(var) -> var, for each element-wise binding that moves
    group: dict[int, int] = {}         # union-find over the moved ones

    def find(k: int) -> int:
        while group[k] != k:
            group[k] = group[group[k]]
            k = group[k]
        return k

    def source_of(a):
        return source.get(id(a)) if isinstance(a, Var) else None

    for var, value in var2val.items():
        if not isinstance(var, DataflowVar):
            continue
        name, out = _op_name(value), _shape(var)
        if name == "relax.reshape":
            x = value.args[0]
            src = source_of(x) or _shape(x)
            if is_leading_reshape(src, out):
                source[id(var)] = src
        elif name is not None and value.op.pattern <= OpPattern.BROADCAST and out is not None:
            inner = _inner_shape(value, out, source_of)
            if inner is None:
                continue
            source[id(var)] = inner
            moved[id(var)] = var
            group[id(var)] = id(var)
            for a in value.args:
                if isinstance(a, Var) and id(a) in moved:
                    group[find(id(a))] = find(id(var))
    stays: set[int] = set()
    for k, var in moved.items():
        for user in users.get(var, []):
            value = var2val.get(user)
            ok = user is not None and (id(user) in moved or (
                _op_name(value) == "relax.reshape" and _same_dims(_shape(user), source[k])))
            if not ok:
                stays.add(find(k))
    return {k for k in moved if find(k) not in stays}


class _Sinker(ExprMutator):
    def __init__(self, mod: IRModule, plans: dict[str, set[int]]):
        super().__init__(mod)
        self.plans = plans
        # id(v) -> x, for each v = reshape(x, ...) that keeps the last dim (as rebuilt)
        self.before: dict[int, Var] = {}
        self.moves: set[int] = set()

    def visit_function_root(self, name: str, func):
        self.moves = self.plans[name]
        return super().visit_function_root(name, func)

    def visit_block(self, blk):
        self.before = {}        # a dataflow variable is not seen outside its block
        return super().visit_block(blk)

    def visit_var_binding(self, b: VarBinding) -> None:
        value = self.visit_expr(b.value)
        if _op_name(value) == "relax.reshape":
            self._reshape(b, value)
        elif id(b.var) in self.moves and self._sink(b, value):
            return
        else:
            self.emit_binding(b, value)

    def _reshape(self, b: VarBinding, value: Call) -> None:
        x = value.args[0]
        src = self.before.get(id(x)) if isinstance(x, Var) else None
        out = _shape(b.var)
        if src is not None and out is not None:
            if _same_dims(_shape(src), out):
                # a reshape back: the value before the first one (a dataflow variable cannot
                # stand for one that leaves the block: that one is bound as a copy)
                if isinstance(b.var, DataflowVar) or not isinstance(src, DataflowVar):
                    self.var_remap[id(b.var)] = src
                else:
                    self.builder.append(VarBinding(b.var, src))
                return
            value = reshape(src, out)
        var = self.emit_binding(b, value)
        source = value.args[0]
        if isinstance(source, Var) and is_leading_reshape(_shape(source), _shape(var)):
            self.before[id(var)] = source

    def _sink(self, b: VarBinding, value: Call) -> bool:
        """Emit ``op`` on the values before the reshapes and the reshape after it; False (and
        nothing emitted) where an operand does not allow it."""
        out = _shape(b.var)
        if out is None:
            return False
        source_of = (lambda a: _shape(self.before[id(a)])
                     if isinstance(a, Var) and id(a) in self.before else None)
        inner_shape = _inner_shape(value, out, source_of)
        if inner_shape is None:
            return False
        args, vectors = [], {}
        for i, a in enumerate(value.args):
            if source_of(a) is not None:
                args.append(self.before[id(a)])
            elif _vector_operand(a):
                # broadcast along the last dim only: dims of 1 before it -> a vector
                vectors[i] = reshape(a, _shape(a)[-1:])
                args.append(vectors[i])
            else:
                args.append(a)
        if not _same_dims(_shape(Call(value.op, args, value.attrs, value.sinfo_args)),
                          inner_shape):
            return False
        for i, vec in vectors.items():      # only now: nothing is emitted for a refusal
            args[i] = self.builder.emit(vec, "vec")
        inner = self.builder.emit(Call(value.op, args, value.attrs, value.sinfo_args),
                                  b.var.name_hint + "_rows")
        var = self.emit_binding(b, reshape(inner, out))
        self.before[id(var)] = inner
        return True
