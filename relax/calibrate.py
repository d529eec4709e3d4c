"""Calibration for static int8 quantization: run the float model on sample inputs, observe
the input of every layer ``QuantizeInt8Static`` quantizes, and choose each one's range.

Observers (one per layer; ``update(array)`` per batch, ``range()`` at the end):

- ``MinMaxObserver``: the smallest and largest value seen (no clipping; outliers widen the
  step for everyone);
- ``PercentileObserver(percentile=99.99)``: the ``percentile``-th percentile of ``|x|``
  per side, averaged over the batches (clips rare outliers);
- ``EntropyObserver(bins=2048)``: TensorRT's KL-divergence calibration: a histogram of
  ``|x|``, then the clipping threshold whose 255-level quantization keeps the distribution
  closest (least relative entropy) to the original.

``collect_ranges(mod, calibration, observer="minmax")`` builds a copy of ``main`` that also
returns those inputs, runs it on each input tuple of ``calibration`` (an iterable of tuples of
numpy arrays, one per parameter of ``main``) and returns one ``(lo, hi)`` per layer.

Examples
--------
>>> ranges = collect_ranges(mod, [(x0,), (x1,)], observer="percentile")  # doctest: +SKIP
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from tilecraft.tensorir.expr import IntImm
from tilecraft.tensorir.function import IRModule

from tilecraft import targets as _targets

from .build import build
from .expr import (BindingBlock, DataflowVar, Function, MatchCast, SeqExpr, Tuple, Var,
                   VarBinding)
from .struct_info import TensorStructInfo
from .transform.base import ExprMutator
from .transform.quantize_int8 import quantizable_calls
from .vm import VirtualMachine

__all__ = ["MinMaxObserver", "PercentileObserver", "EntropyObserver", "OBSERVERS",
           "collect_ranges", "CalibrationError"]


class CalibrationError(ValueError):
    """The calibration set does not fit the model (count, shapes or dtypes of its inputs)."""


class MinMaxObserver:
    """The running minimum and maximum.

    Examples
    --------
    >>> o = MinMaxObserver(); o.update(np.array([-1.0, 2.0])); o.update(np.array([3.0]))
    >>> o.range()
    (-1.0, 3.0)
    """

    def __init__(self):
        self.lo, self.hi = np.inf, -np.inf

    def update(self, x: np.ndarray) -> None:
        if x.size:
            self.lo = min(self.lo, float(np.min(x)))
            self.hi = max(self.hi, float(np.max(x)))

    def range(self) -> tuple[float, float]:
        if self.lo > self.hi:
            raise CalibrationError("the observer saw no values")
        return self.lo, self.hi


class PercentileObserver:
    """The ``percentile``-th percentile of the positive and of the negative side, averaged
    over batches.

    Examples
    --------
    >>> o = PercentileObserver(50.0); o.update(np.array([-4.0, -2.0, 1.0, 3.0]))
    >>> o.range()
    (-3.0, 2.0)
    """

    def __init__(self, percentile: float = 99.99):
        if not 0 < percentile <= 100:
            raise ValueError(f"PercentileObserver: percentile must be in (0, 100], got "
                             f"{percentile}")
        self.percentile = float(percentile)
        self.los: list[float] = []
        self.his: list[float] = []

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).ravel()
        neg, pos = -x[x < 0], x[x > 0]
        self.los.append(-float(np.percentile(neg, self.percentile)) if neg.size else 0.0)
        self.his.append(float(np.percentile(pos, self.percentile)) if pos.size else 0.0)

    def range(self) -> tuple[float, float]:
        if not self.his:
            raise CalibrationError("the observer saw no values")
        return float(np.mean(self.los)), float(np.mean(self.his))


class EntropyObserver:
    """KL-divergence calibration (TensorRT's): a histogram of ``|x|`` over ``bins`` bins, then
    the threshold, from 128 bins up, whose quantization to 128 levels of each sign loses least
    information; the range is ``[-t, t]`` clipped to the values seen.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> o = EntropyObserver(); o.update(rng.normal(size=20000))
    >>> 2.0 < o.range()[1] < 5.0
    True
    """

    def __init__(self, bins: int = 2048):
        if bins < 256:
            raise ValueError(f"EntropyObserver: bins must be at least 256, got {bins}")
        self.bins = int(bins)
        self.samples: list[np.ndarray] = []
        self.minmax = MinMaxObserver()

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32).ravel()
        self.minmax.update(x)
        self.samples.append(np.abs(x))

    def range(self) -> tuple[float, float]:
        lo, hi = self.minmax.range()
        a = np.concatenate(self.samples)
        amax = float(a.max())
        if amax == 0.0:
            return lo, hi
        hist, edges = np.histogram(a, bins=self.bins, range=(0.0, amax))
        hist = hist.astype(np.float64)
        levels = 128
        best, best_t = np.inf, amax
        for i in range(levels, self.bins + 1, 16):
            p = hist[:i].copy()
            p[i - 1] += hist[i:].sum()          # the clipped tail lands in the last bin
            # q: p merged into `levels` buckets, spread back over the nonzero bins
            q = np.zeros(i)
            for chunk in np.array_split(np.arange(i), levels):
                nz = chunk[hist[chunk] > 0]
                if nz.size:
                    q[nz] = hist[chunk].sum() / nz.size
            mask = p > 0
            if not mask.any():
                continue
            ps, qs = p / p.sum(), q / max(q.sum(), 1e-30)
            kl = float(np.sum(ps[mask] * np.log(ps[mask] / np.maximum(qs[mask], 1e-30))))
            if kl < best:
                best, best_t = kl, float(edges[i])
        return max(lo, -best_t), min(hi, best_t)


OBSERVERS = {"minmax": MinMaxObserver, "percentile": PercentileObserver,
             "entropy": EntropyObserver}


class _Taps(ExprMutator):
    """``main`` without dataflow blocks, returning ``(result, *inputs of the quantized
    layers)``."""

    def __init__(self, mod: IRModule, targets: Sequence):
        super().__init__(mod)
        self.targets = {id(c) for c in targets}
        self.taps: list = []

    def visit_block(self, blk):
        self.builder.begin_block(False)
        try:
            for b in blk.bindings:
                self.visit_binding(b)
        finally:
            new = self.builder.end_block()
        return BindingBlock(new)

    def emit_binding(self, b: VarBinding, value) -> Var:
        var = b.var
        if isinstance(var, DataflowVar):
            new = Var(var.name_hint, value.struct_info)
            self.var_remap[id(var)] = new
            self._keep.append(var)
            var = new
        elif value is not b.value:
            var = self.rebind_var(var, value.struct_info)
        self.builder.append(VarBinding(var, value))
        return var

    def visit_match_cast(self, b: MatchCast) -> None:
        value = self.visit_expr(b.value)
        var = b.var
        if isinstance(var, DataflowVar):
            var = Var(var.name_hint, b.struct_info)
            self.var_remap[id(b.var)] = var
            self._keep.append(b.var)
        self.builder.append(MatchCast(var, value, b.struct_info))

    def visit_call_(self, call):
        new = super().visit_call_(call)
        if id(call) in self.targets:
            self.taps.append(new.args[0])
        return new

    def visit_seq_expr(self, seq: SeqExpr) -> SeqExpr:
        out = super().visit_seq_expr(seq)
        body = self.builder.normalize(Tuple([out.body] + list(self.taps)))
        return SeqExpr(out.blocks, body)


def _check_inputs(func: Function, inputs, index: int) -> list[np.ndarray]:
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    if len(inputs) != len(func.params):
        raise CalibrationError(f"calibration sample {index}: {len(inputs)} inputs for the "
                               f"{len(func.params)} parameters of main")
    out = []
    for p, v in zip(func.params, inputs):
        v = np.asarray(v)
        si = p.struct_info
        if isinstance(si, TensorStructInfo):
            if si.dtype != str(v.dtype):
                raise CalibrationError(f"calibration sample {index}: input {p.name_hint} is "
                                       f"{v.dtype}; main takes {si.dtype}")
            if si.shape is not None:
                ok = len(si.shape) == v.ndim and all(
                    not isinstance(d, IntImm) or d.value == n for d, n in zip(si.shape, v.shape))
                if not ok:
                    want = tuple(d.value if isinstance(d, IntImm) else str(d) for d in si.shape)
                    raise CalibrationError(f"calibration sample {index}: input "
                                           f"{p.name_hint} has shape {v.shape}; main takes "
                                           f"{want}")
        out.append(v)
    return out


def collect_ranges(mod: IRModule, calibration: Iterable, observer="minmax",
                   target="llvm") -> list[tuple[float, float]]:
    """The observed range of the input of each layer ``QuantizeInt8Static`` quantizes.

    Parameters
    ----------
    mod : IRModule
        The float model; its ``main`` is run.
    calibration : iterable of tuples of numpy arrays
        Input tuples for ``main`` (a single array stands for a 1-tuple).
    observer : str or callable
        ``"minmax"``, ``"percentile"``, ``"entropy"``, or a factory returning an object with
        ``update(array)`` and ``range()``.
    target : str
        Where the float model runs (a CPU target, this machine by default).

    Raises
    ------
    CalibrationError
        An empty calibration set, or a sample whose inputs do not match ``main``.

    Examples
    --------
    >>> collect_ranges(mod, [(x,)], observer="entropy")      # doctest: +SKIP
    [(-2.9, 3.1), (0.0, 5.2)]
    """
    if isinstance(observer, str):
        if observer not in OBSERVERS:
            raise ValueError(f"unknown observer {observer!r}; known: {sorted(OBSERVERS)}")
        factory = OBSERVERS[observer]
    elif callable(observer):
        factory = observer
    else:
        raise TypeError(f"observer must be a name or a factory, got {observer!r}")
    if "main" not in mod:
        raise CalibrationError("the module has no main function to calibrate")
    func = mod["main"]
    layers = quantizable_calls(func, convolutions=True)
    if not layers:
        return []
    taps = _Taps(mod, layers)
    new_main = taps.visit_function_root("main", func)
    tapped = Function(new_main.params, new_main.body, None, func.attrs)
    cal_mod = IRModule({"main": tapped})
    exe = build(cal_mod, target)
    vm = VirtualMachine(exe, _targets.cpu(0))
    observers = [factory() for _ in layers]
    count = 0
    for i, sample in enumerate(calibration):
        inputs = _check_inputs(func, sample, i)
        outs = vm["main"](*inputs)
        for o, t in zip(observers, outs[1:]):
            o.update(t.numpy() if hasattr(t, "numpy") else np.asarray(t))
        count += 1
    if count == 0:
        raise CalibrationError("the calibration set is empty")
    return [o.range() for o in observers]
