"""Control flow: ``If``, ``Loop`` and ``Scan`` with a trip count known at import time.

The subgraphs are converted inline: the branch ``If`` takes, or the loop body once per iteration
(unrolled), in a scope that sees the enclosing graph's values. An ``If`` whose condition is
computed at run time becomes a Relax ``If`` whose branches hold the converted subgraphs (the
branches must agree on each result's dtype and rank; a dim they do not share is a fresh dim
after it). A ``Loop``'s iteration number is an import-time value in each copy of the body, so shape arithmetic on it stays exact; its condition
must stay known at import time (a loop that exits on a value computed at run time is refused).
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.structural import structural_equal

from .... import op as _op
from ....expr import BindingBlock, If, SeqExpr, Tuple, TupleGetItem
from ....struct_info import TensorStructInfo, TupleStructInfo
from ...common import UnsupportedError
from ..registry import ConversionError, NeedsConstant, converter
from ..values import Value
from .common import norm_axis, static_int

MAX_UNROLL = 1024


def _convert_subgraph(ctx, graph, bindings: dict) -> list:
    """Convert ``graph`` with its inputs bound to ``bindings`` (name -> Value); return its
    outputs as Values."""
    before = len(ctx.importer.problems)
    ctx.scopes.append({})
    try:
        for name, v in bindings.items():
            ctx.define(name, v)
        ctx.importer.convert_graph(ctx, graph)
        if len(ctx.importer.problems) > before:
            # recorded already (with the graph inputs they need as constants): this node fails
            raise UnsupportedError("from_onnx", [])
        return [ctx.lookup(o.name) for o in graph.output]
    finally:
        ctx.scopes.pop()


@converter("If", family="control",
           doc="the branch a condition known at import time chooses, inlined; a relax If "
               "when it is computed at run time")
def _if(ctx, node):
    cond = ctx.known(node, 0)
    if cond is None or cond.dtype == object:
        return _runtime_if(ctx, node)
    branch = node.attr("then_branch") if bool(np.asarray(cond).reshape(-1)[0]) else \
        node.attr("else_branch")
    outs = _convert_subgraph(ctx, branch, {})
    return outs


def _runtime_if(ctx, node):
    """A relax ``If``: each branch converted into a block of its own. A result dim that the
    branches do not share (or that a branch computes at run time) becomes a fresh dim after
    the ``If`` (``match_cast``)."""
    cond = ctx.input(node, 0)
    if len(ctx.shape(cond)) != 0:
        cond = ctx.emit(_op.reshape(cond, ()))
    before = set(ctx.importer.runtime_vars)
    ctx.importer.branch_depth += 1
    bodies, results = [], []
    try:
        for attr in ("then_branch", "else_branch"):
            with ctx.bb.branch() as br:
                exprs = [ctx.expr(v) for v in _convert_subgraph(ctx, node.attr(attr), {})]
                out = exprs[0] if len(exprs) == 1 else ctx.bb.emit(Tuple(exprs))
            bodies.append(SeqExpr([BindingBlock(br.bindings)] if br.bindings else [], out))
            results.append([e.struct_info for e in exprs])
    finally:
        ctx.importer.branch_depth -= 1
    local = ctx.importer.runtime_vars - before     # dims bound inside a branch
    joined = [_join(k, a, b, local) for k, (a, b) in enumerate(zip(*results))]
    # the If's own struct info: a result dim the branches do not share is unknown there
    loose = [j if not isinstance(j, list) else
             TensorStructInfo(None, results[0][k].dtype, ndim=len(j))
             if any(d is None for d in j) else TensorStructInfo(tuple(j), results[0][k].dtype)
             for k, j in enumerate(joined)]
    sinfo = loose[0] if len(loose) == 1 else TupleStructInfo(loose)
    res = ctx.emit(If(cond, bodies[0], bodies[1], sinfo), "if")
    outs = [res] if len(loose) == 1 else [ctx.emit(TupleGetItem(res, k))
                                          for k in range(len(loose))]
    return [_refine(ctx, o, j) for o, j in zip(outs, joined)]


def _join(k: int, a, b, local: set):
    """What both branches say of result ``k``: for tensors (of one dtype and rank) the list of
    dims, a dim the branches share (and do not bind inside) kept, the others ``None``; for
    anything else the struct info itself, which must be the same in both."""
    if not isinstance(a, TensorStructInfo) or not isinstance(b, TensorStructInfo):
        if a == b:
            return a
        raise ConversionError(f"If: output {k} differs between the branches ({a!r} and "
                              f"{b!r})")
    if a.dtype != b.dtype or a.ndim != b.ndim or a.shape is None or b.shape is None:
        raise UnsupportedError("from_onnx", [
            f"If on a condition computed at run time: output {k} has {a!r} in one branch and "
            f"{b!r} in the other (not supported: the branches must agree on dtype and rank)"])
    return [x if structural_equal(x, y) and not _uses_ids(x, local) else None
            for x, y in zip(a.shape, b.shape)]


def _uses_ids(e, ids: set) -> bool:
    found = []
    post_order_visit(e, lambda n: found.append(n) if id(n) in ids else None)
    return bool(found)


def _refine(ctx, e, dims):
    """A result whose dims the branches do not share cast to fresh dims there (checked when
    the model runs); the shared dims kept."""
    if not isinstance(dims, list) or all(d is not None for d in dims):
        return e
    fresh = [ctx.fresh_var("if_dim") if d is None else d for d in dims]
    ctx.importer.runtime_vars.update(id(d) for d, old in zip(fresh, dims) if old is None)
    return ctx.bb.match_cast(e, TensorStructInfo(tuple(fresh), e.struct_info.dtype), "if_out")


def _known_bool(v: Value):
    if v is None or v.known is None or v.known.dtype == object:
        return None
    return bool(np.asarray(v.known).reshape(-1)[0])


def _stack(ctx, items, axis=0):
    exprs = [ctx.emit(_op.expand_dims(ctx.expr(v) if isinstance(v, Value) else v, axis))
             for v in items]
    if len(exprs) == 1:
        return exprs[0]
    return _op.concat(exprs, axis)


@converter("Loop", family="control", const_inputs={0: "M"},
           doc="a loop with a trip count known at import time, unrolled")
def _loop(ctx, node):
    body = node.attr("body")
    m = ctx.known(node, 0) if node.has_input(0) else None
    if node.has_input(0) and (m is None or m.dtype == object):
        raise NeedsConstant("input 0 (M, the trip count) must be known when the model is "
                            "imported", node.inputs[0])
    trips = int(np.asarray(m).reshape(-1)[0]) if m is not None else None
    cond = ctx.value(node, 1)
    keep_going = True if cond is None else _known_bool(cond)
    if cond is not None and keep_going is None:
        raise NeedsConstant("input 1 (cond) must be known when the model is imported",
                            node.inputs[1])
    if trips is None:
        trips = MAX_UNROLL + 1   # bounded by the condition alone
    carried = [ctx.value(node, i) for i in range(2, len(node.inputs))]
    n_carried = len(carried)
    in_names = [i.name for i in body.input]
    scans: list[list] = [[] for _ in range(len(body.output) - 1 - n_carried)]
    it = 0
    while keep_going and it < trips:
        if it >= MAX_UNROLL:
            raise ConversionError(f"Loop of more than {MAX_UNROLL} iterations (unrolled at "
                                  f"import time)")
        bind = {in_names[0]: Value(known=np.array(it, dtype=np.int64))}
        if len(in_names) > 1:
            bind[in_names[1]] = Value(known=np.array(True))
        for name, v in zip(in_names[2:], carried):
            bind[name] = v
        outs = _convert_subgraph(ctx, body, bind)
        new_cond = _known_bool(outs[0])
        if new_cond is None:
            raise ConversionError("Loop whose condition is computed at run time (only loops "
                                  "with a condition known at import time are supported)")
        carried = outs[1:1 + n_carried]
        for k, v in enumerate(outs[1 + n_carried:]):
            scans[k].append(v)
        keep_going = new_cond
        it += 1
    results = list(carried)
    for k, items in enumerate(scans):
        if not items:
            raise ConversionError("Loop with zero iterations and scan outputs (their shape is "
                                  "unknown)")
        results.append(_stack(ctx, items))
    return results


@converter("Scan", family="control", doc="a scan over a sequence of static length, unrolled")
def _scan(ctx, node):
    body = node.attr("body")
    n_scan = node.attr("num_scan_inputs")
    if node.version < 9:
        return _scan8(ctx, node, body, n_scan)
    ins = [ctx.value(node, i) for i in range(len(node.inputs))]
    n_state = len(ins) - n_scan
    states, xs = ins[:n_state], ins[n_state:]
    in_axes = node.attr("scan_input_axes", [0] * n_scan)
    in_dirs = node.attr("scan_input_directions", [0] * n_scan)
    n_out = len(body.output) - n_state
    out_axes = node.attr("scan_output_axes", [0] * n_out)
    out_dirs = node.attr("scan_output_directions", [0] * n_out)
    exprs = [ctx.expr(v) for v in xs]
    axes = [norm_axis(a, len(ctx.shape(e))) for a, e in zip(in_axes, exprs)]
    lens = {static_int(ctx.shape(e)[a]) for e, a in zip(exprs, axes)}
    if None in lens or len(lens) != 1:
        raise ConversionError("Scan needs scan inputs of one static length")
    steps = lens.pop()
    if steps > MAX_UNROLL:
        raise ConversionError(f"Scan of more than {MAX_UNROLL} steps (unrolled at import time)")
    in_names = [i.name for i in body.input]
    outs_per_step: list[list] = [[] for _ in range(n_out)]
    for t in range(steps):
        bind = dict(zip(in_names[:n_state], states))
        for k, (e, a, d) in enumerate(zip(exprs, axes, in_dirs)):
            idx = steps - 1 - t if d else t
            sl = ctx.emit(_op.strided_slice(e, [a], [idx], [idx + 1]))
            bind[in_names[n_state + k]] = Value(ctx.emit(_op.squeeze(sl, [a])))
        outs = _convert_subgraph(ctx, body, bind)
        states = outs[:n_state]
        for k, v in enumerate(outs[n_state:]):
            outs_per_step[k].append(v)
    results = list(states)
    for k, items in enumerate(outs_per_step):
        if out_dirs[k]:
            items = items[::-1]
        rank = len(ctx.expr(items[0]).struct_info.shape) + 1
        results.append(_stack(ctx, items, norm_axis(out_axes[k], rank)))
    return results


def _scan8(ctx, node, body, n_scan):
    """Scan-8: a leading batch dim on every input and an optional sequence_lens (unsupported
    when given)."""
    if node.has_input(0):
        raise ConversionError("Scan-8 with sequence_lens is not supported")
    ins = [ctx.value(node, i) for i in range(1, len(node.inputs))]
    n_state = len(ins) - n_scan
    exprs = [ctx.expr(v) for v in ins]
    batch = static_int(ctx.shape(exprs[0])[0])
    dirs = node.attr("directions", [0] * n_scan)
    if batch is None:
        raise ConversionError("Scan-8 needs a static batch size")
    in_names = [i.name for i in body.input]
    per_batch = []
    for b in range(batch):
        def row(e):
            sl = ctx.emit(_op.strided_slice(e, [0], [b], [b + 1]))
            return ctx.emit(_op.squeeze(sl, [0]))
        states = [Value(row(e)) for e in exprs[:n_state]]
        xs = [row(e) for e in exprs[n_state:]]
        steps = static_int(ctx.shape(xs[0])[0])
        outs_per_step: list[list] = [[] for _ in range(len(body.output) - n_state)]
        for t in range(steps):
            bind = dict(zip(in_names[:n_state], states))
            for k, e in enumerate(xs):
                idx = steps - 1 - t if dirs[k] else t
                sl = ctx.emit(_op.strided_slice(e, [0], [idx], [idx + 1]))
                bind[in_names[n_state + k]] = Value(ctx.emit(_op.squeeze(sl, [0])))
            outs = _convert_subgraph(ctx, body, bind)
            states = outs[:n_state]
            for k, v in enumerate(outs[n_state:]):
                outs_per_step[k].append(v)
        per_batch.append([ctx.expr(s) for s in states] +
                         [ctx.emit(_stack(ctx, items)) for items in outs_per_step])
    return [_stack(ctx, [pb[k] for pb in per_batch]) for k in range(len(per_batch[0]))]
