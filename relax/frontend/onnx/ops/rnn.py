"""Recurrent layers: RNN, GRU and LSTM, unrolled over a sequence of static length.

The input projection of every step is one matmul over the whole sequence; each step then adds
the recurrent matmul and applies the gate activations. Supported: forward / reverse /
bidirectional, the ``activations`` list (with alpha / beta), ``clip``, LSTM peepholes (``P``) and
``input_forget``, GRU ``linear_before_reset``, ``sequence_lens`` (steps past a sequence's length
leave its state unchanged and output zeros; the reverse direction starts at each sequence's
last step), ``initial_h`` / ``initial_c``, and ``layout`` 0 (sequence-major) or 1 (batch-major).
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import Select

from .... import op as _op
from ..registry import ConversionError, converter
from ..emit import emit_kernel
from .common import scalar, static_int

MAX_STEPS = 1024

_ACTS = {"sigmoid", "tanh", "relu", "affine", "leakyrelu", "thresholdedrelu", "scaledtanh",
         "hardsigmoid", "elu", "softsign", "softplus"}


def _act(ctx, name, x, alpha, beta):
    e = ctx.emit
    d = ctx.dtype(x)
    n = name.lower()
    if n == "sigmoid":
        return e(_op.sigmoid(x))
    if n == "tanh":
        return e(_op.tanh(x))
    if n == "relu":
        return e(_op.nn.relu(x))
    if n == "affine":
        return e(_op.add(e(_op.multiply(x, scalar(alpha, d))), scalar(beta, d)))
    if n == "leakyrelu":
        return e(_op.nn.leaky_relu(x, alpha if alpha is not None else 0.01))
    if n == "thresholdedrelu":
        return e(_op.where(e(_op.greater(x, scalar(alpha, d))), x, scalar(0, d)))
    if n == "scaledtanh":
        return e(_op.multiply(e(_op.tanh(e(_op.multiply(x, scalar(beta, d))))), scalar(alpha, d)))
    if n == "hardsigmoid":
        return e(_op.nn.hard_sigmoid(x, alpha, beta))
    if n == "elu":
        return e(_op.nn.elu(x, alpha if alpha is not None else 1.0))
    if n == "softsign":
        return e(_op.divide(x, e(_op.add(e(_op.abs(x)), scalar(1, d)))))
    if n == "softplus":
        return e(_op.log(e(_op.add(e(_op.exp(x)), scalar(1, d)))))
    raise ConversionError(f"activation {name!r} is not supported")


_DEFAULT_ALPHA = {"leakyrelu": 0.01, "thresholdedrelu": 1.0, "elu": 1.0, "hardsigmoid": 0.2,
                  "affine": 1.0, "scaledtanh": 1.0}
_DEFAULT_BETA = {"hardsigmoid": 0.5, "affine": 0.0, "scaledtanh": 1.0}


def _rnn_check(node):
    out = []
    for a in node.attr("activations", []) or []:
        if a.lower() not in _ACTS:
            out.append(f"activation {a!r} is not supported")
    return out


def _activations(node, per_dir, defaults):
    acts = node.attr("activations")
    n_dirs = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    if not acts:
        acts = defaults * n_dirs
    alphas = list(node.attr("activation_alpha", []) or [])
    betas = list(node.attr("activation_beta", []) or [])
    out = []
    ai = bi = 0
    for name in acts:
        n = name.lower()
        alpha = beta = None
        if n in _DEFAULT_ALPHA:
            alpha = alphas[ai] if ai < len(alphas) else _DEFAULT_ALPHA[n]
            ai += 1 if ai < len(alphas) else 0
        if n in _DEFAULT_BETA:
            beta = betas[bi] if bi < len(betas) else _DEFAULT_BETA[n]
            bi += 1 if bi < len(betas) else 0
        out.append((name, alpha, beta))
    return [out[k * per_dir:(k + 1) * per_dir] for k in range(n_dirs)]


def _slice0(ctx, x, k):
    """``x[k]`` (first dim)."""
    s = ctx.emit(_op.strided_slice(x, [0], [k], [k + 1]))
    return ctx.emit(_op.squeeze(s, [0]))


def _reverse_by_lengths(ctx, x, lens):
    """Reverse the first lens[b] steps of x (seq, batch, ...) per batch entry."""
    xs = ctx.shape(x)

    def k(data, ln):
        def f(*i):
            L = ln[i[1]].astype("int64")
            t = i[0]
            return data[(Select(t < L, L - 1 - t, t),) + tuple(i[1:])]
        return te.compute(xs, f, "T_reverse_steps")
    return emit_kernel(ctx, k, x, lens, name="reverse_steps")


def _prepare(ctx, node, gates):
    """Common inputs: X (seq, batch, in), W, R, B, sequence_lens, initial_h, and sizes."""
    x = ctx.input(node, 0)
    layout = node.attr("layout", 0)
    if layout:
        x = ctx.emit(_op.permute_dims(x, [1, 0, 2]))
    seq, batch, _ = ctx.shape(x)
    steps = static_int(seq)
    if steps is None:
        raise ConversionError(f"{node.op_type} needs a static sequence length (it is unrolled)")
    if steps > MAX_STEPS:
        raise ConversionError(f"{node.op_type} over more than {MAX_STEPS} steps")
    w, r = ctx.input(node, 1), ctx.input(node, 2)
    hidden = node.attr("hidden_size") or static_int(ctx.shape(r)[-1])
    b = ctx.input(node, 3)
    lens = ctx.input(node, 4)
    if lens is not None:
        known = ctx.known(node, 4)
        if known is not None and known.dtype != object and np.all(known == steps):
            lens = None
    h0 = ctx.input(node, 5)
    if h0 is not None and layout:
        h0 = ctx.emit(_op.permute_dims(h0, [1, 0, 2]))
    return x, steps, batch, w, r, b, lens, h0, hidden, layout


def _finish(ctx, node, ys, finals, layout):
    """Y (seq, dirs, batch, hidden) and the final states (dirs, batch, hidden)."""
    e = ctx.emit
    y = e(_op.concat([e(_op.expand_dims(v, 1)) for v in ys], 1)) if len(ys) > 1 else \
        e(_op.expand_dims(ys[0], 1))
    if layout:
        y = e(_op.permute_dims(y, [2, 0, 1, 3]))
    outs = [y]
    for per_dir in finals:
        f = e(_op.concat([e(_op.expand_dims(v, 0)) for v in per_dir], 0)) if len(per_dir) > 1 \
            else e(_op.expand_dims(per_dir[0], 0))
        if layout:
            f = e(_op.permute_dims(f, [1, 0, 2]))
        outs.append(f)
    return outs


def _run(ctx, node, n_gates, defaults, cell):
    """The shared unrolling: cell(ctx, gx_t, states, params, acts) -> (h, new states)."""
    e = ctx.emit
    x, steps, batch, w, r, b, lens, h0, hidden, layout = _prepare(ctx, node, n_gates)
    direction = node.attr("direction", "forward")
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    acts = _activations(node, len(defaults), defaults)
    d = ctx.dtype(x)
    clip = node.attr("clip")
    ys, finals = [], None
    lens64 = None
    if lens is not None:
        lens64 = e(_op.astype(lens, "int64")) if ctx.dtype(lens) != "int64" else lens
    for k, dname in enumerate(dirs):
        wk, rk = _slice0(ctx, w, k), _slice0(ctx, r, k)
        bk = _slice0(ctx, b, k) if b is not None else None
        xs = x
        if dname == "reverse" and lens64 is not None:
            xs = _reverse_by_lengths(ctx, x, lens64)
        # the input projection of every step at once: (seq, batch, gates * hidden)
        gx = e(_op.matmul(xs, e(_op.permute_dims(wk, [1, 0]))))
        if bk is not None:
            wb = e(_op.strided_slice(bk, [0], [0], [n_gates * hidden]))
            gx = e(_op.add(gx, wb))
        params = dict(r=rk, b=bk, hidden=hidden, clip=clip, dtype=d, k=k)
        states = cell.init(ctx, node, batch, hidden, d, k, h0)
        outs = [None] * steps
        order = range(steps - 1, -1, -1) if dname == "reverse" and lens64 is None else \
            range(steps)
        for t in order:
            gxt = _slice0(ctx, gx, t)
            h, new_states = cell.step(ctx, node, gxt, states, params, acts[k])
            if lens64 is not None:
                mask = e(_op.less(scalar(t, "int64"), lens64))
                mask = e(_op.reshape(mask, (batch, 1)))
                new_states = [e(_op.where(mask, ns, os)) for ns, os in zip(new_states, states)]
                h = e(_op.where(mask, h, scalar(0, d)))
            states = new_states
            outs[t] = h
        y = e(_op.concat([e(_op.expand_dims(v, 0)) for v in outs], 0)) if steps > 1 else \
            e(_op.expand_dims(outs[0], 0))
        if dname == "reverse" and lens64 is not None:
            y = _reverse_by_lengths(ctx, y, lens64)
        ys.append(y)
        if finals is None:
            finals = [[] for _ in states]
        for j, s in enumerate(states):
            finals[j].append(s)
    return _finish(ctx, node, ys, finals, layout)


def _init_state(ctx, h0, batch, hidden, d, k):
    if h0 is not None:
        return _slice0(ctx, h0, k)
    return ctx.emit(_op.zeros((batch, hidden), d))


def _rec(ctx, h, rk, lo, hi):
    """h @ R[lo:hi].T"""
    rs = ctx.emit(_op.strided_slice(rk, [0], [lo], [hi]))
    return ctx.emit(_op.matmul(h, ctx.emit(_op.permute_dims(rs, [1, 0]))))


def _gate_slice(ctx, g, j, hidden):
    return ctx.emit(_op.strided_slice(g, [1], [j * hidden], [(j + 1) * hidden]))


def _rbias(ctx, params, n_gates, j):
    b = params["b"]
    if b is None:
        return None
    hd = params["hidden"]
    return ctx.emit(_op.strided_slice(b, [0], [(n_gates + j) * hd], [(n_gates + j + 1) * hd]))


def _clip(ctx, x, clip, d):
    if clip is None:
        return x
    return ctx.emit(_op.minimum(ctx.emit(_op.maximum(x, scalar(-clip, d))), scalar(clip, d)))


class _RNNCell:
    @staticmethod
    def init(ctx, node, batch, hidden, d, k, h0):
        return [_init_state(ctx, h0, batch, hidden, d, k)]

    @staticmethod
    def step(ctx, node, gxt, states, p, acts):
        e = ctx.emit
        (h,) = states
        g = e(_op.add(gxt, _rec(ctx, h, p["r"], 0, p["hidden"])))
        rb = _rbias(ctx, p, 1, 0)
        if rb is not None:
            g = e(_op.add(g, rb))
        g = _clip(ctx, g, p["clip"], p["dtype"])
        name, a, b = acts[0]
        h = _act(ctx, name, g, a, b)
        return h, [h]


class _GRUCell:
    @staticmethod
    def init(ctx, node, batch, hidden, d, k, h0):
        return [_init_state(ctx, h0, batch, hidden, d, k)]

    @staticmethod
    def step(ctx, node, gxt, states, p, acts):
        e = ctx.emit
        (h,) = states
        hd, d = p["hidden"], p["dtype"]
        lbr = node.attr("linear_before_reset", 0)
        gz, gr, gh = (_gate_slice(ctx, gxt, j, hd) for j in range(3))
        rz = _rec(ctx, h, p["r"], 0, hd)
        rr = _rec(ctx, h, p["r"], hd, 2 * hd)
        bz, br, bh = (_rbias(ctx, p, 3, j) for j in range(3))
        z = e(_op.add(gz, rz))
        rgate = e(_op.add(gr, rr))
        if bz is not None:
            z = e(_op.add(z, bz))
            rgate = e(_op.add(rgate, br))
        (fz, fa, fb), (gname, ga, gb) = acts[0], acts[1]
        z = _act(ctx, fz, _clip(ctx, z, p["clip"], d), fa, fb)
        rgate = _act(ctx, fz, _clip(ctx, rgate, p["clip"], d), fa, fb)
        rh = p["r"]
        if lbr:
            hh = _rec(ctx, h, rh, 2 * hd, 3 * hd)
            if bh is not None:
                hh = e(_op.add(hh, bh))
            cand = e(_op.add(gh, e(_op.multiply(rgate, hh))))
        else:
            hh = _rec(ctx, e(_op.multiply(rgate, h)), rh, 2 * hd, 3 * hd)
            cand = e(_op.add(gh, hh))
            if bh is not None:
                cand = e(_op.add(cand, bh))
        cand = _act(ctx, gname, _clip(ctx, cand, p["clip"], d), ga, gb)
        one_m = e(_op.subtract(scalar(1, d), z))
        h_new = e(_op.add(e(_op.multiply(one_m, cand)), e(_op.multiply(z, h))))
        return h_new, [h_new]


class _LSTMCell:
    @staticmethod
    def init(ctx, node, batch, hidden, d, k, h0):
        c0 = ctx.input(node, 6)
        if c0 is not None and node.attr("layout", 0):
            c0 = ctx.emit(_op.permute_dims(c0, [1, 0, 2]))
        return [_init_state(ctx, h0, batch, hidden, d, k),
                _init_state(ctx, c0, batch, hidden, d, k)]

    @staticmethod
    def step(ctx, node, gxt, states, p, acts):
        e = ctx.emit
        h, c = states
        hd, d = p["hidden"], p["dtype"]
        g = e(_op.add(gxt, _rec(ctx, h, p["r"], 0, 4 * hd)))
        if p["b"] is not None:
            g = e(_op.add(g, e(_op.strided_slice(p["b"], [0], [4 * hd], [8 * hd]))))
        gi, go, gf, gc = (_gate_slice(ctx, g, j, hd) for j in range(4))
        peep = ctx.input(node, 7)
        if peep is not None:
            pk = _slice0(ctx, peep, p["k"])
            pi, po, pf = (e(_op.strided_slice(pk, [0], [j * hd], [(j + 1) * hd]))
                          for j in range(3))
            gi = e(_op.add(gi, e(_op.multiply(pi, c))))
            gf = e(_op.add(gf, e(_op.multiply(pf, c))))
        (fn, fa, fb), (gn, ga, gb), (hn, ha, hb) = acts
        clip = p["clip"]
        i = _act(ctx, fn, _clip(ctx, gi, clip, d), fa, fb)
        if node.attr("input_forget", 0):
            f = e(_op.subtract(scalar(1, d), i))
        else:
            f = _act(ctx, fn, _clip(ctx, gf, clip, d), fa, fb)
        cc = _act(ctx, gn, _clip(ctx, gc, clip, d), ga, gb)
        c_new = e(_op.add(e(_op.multiply(f, c)), e(_op.multiply(i, cc))))
        if peep is not None:
            go = e(_op.add(go, e(_op.multiply(po, c_new))))
        o = _act(ctx, fn, _clip(ctx, go, clip, d), fa, fb)
        h_new = e(_op.multiply(o, _act(ctx, hn, c_new, ha, hb)))
        return h_new, [h_new, c_new]


@converter("RNN", family="rnn", check=_rnn_check, doc="simple RNN (unrolled)")
def _rnn(ctx, node):
    return _run(ctx, node, 1, ["Tanh"], _RNNCell)


@converter("GRU", family="rnn", check=_rnn_check,
           doc="GRU (unrolled; linear_before_reset, sequence_lens, bidirectional)")
def _gru(ctx, node):
    return _run(ctx, node, 3, ["Sigmoid", "Tanh"], _GRUCell)


@converter("LSTM", family="rnn", check=_rnn_check,
           doc="LSTM (unrolled; peepholes, input_forget, sequence_lens, bidirectional)")
def _lstm(ctx, node):
    return _run(ctx, node, 4, ["Sigmoid", "Tanh", "Tanh"], _LSTMCell)
