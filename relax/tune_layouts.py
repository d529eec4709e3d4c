"""Measured kernel layouts: ``relax.tune_layouts`` picks each convolution's packed kernel by
timing the candidates, where ``AlterLayout`` alone goes by rules of thumb.

A CPU convolution's kernel is fixed before any schedule is tuned: ``AlterLayout`` packs its
weight for one register tile (``backend.cpu.conv2d_strategy.nchw_kernel_plan``: the flat
kernel with ``R`` output channels x ``V`` vectors of positions, or the channel-vector kernel
with ``M`` positions x ``W`` channels) and the tuner then searches schedules of that kernel
only. The rules behind that choice were measured on some layers of some machines; ``tune_layouts``
measures instead, the way AutoTVM tunes a convolution template's tile knobs:

1. the model runs through the graph pipeline up to ``AlterLayout``, which reports every NCHW
   convolution it packs (``backend.cpu.ConvGeometry``; identical ones once);
2. each convolution's candidates (``conv2d_strategy.nchw_plan_candidates``: the rule's choice,
   the flat kernel's best tile for each channel block, the channel-vector tile for each
   width) are built as standalone kernels with their default schedules, at batch 1, and
   measured with ``metaschedule.LocalRunner`` in isolated processes: each checked once against
   a numpy convolution on random inputs (a wrong or crashing candidate is logged and left
   out), then timed ``rounds`` times, interleaved; a candidate's least time counts (a busy
   machine only slows a kernel down);
3. the fastest then runs against the rule's choice back to back, ``confirm`` (5) pairs, and
   replaces it only when the median of the pairs' ratios is ``margin`` (3%) or more in its
   favour: a ratio of two timings a moment apart hardly moves with the machine's load, so a
   noisy machine does not trade the rule for luck. The decision goes to the database
   (``Database.commit_layout``: ``layouts.json``, one fsync'd line per convolution, with
   every candidate's time) under a key naming the convolution (``conv_layout_key``).

``relax.tune`` runs it first on CPU targets (its tasks are then the chosen kernels), and
``relax.build(mod, target, database=db)`` builds with the database's choices
(``conv_plans_from``); a convolution the database does not name gets the rule's kernel. A
rerun on the same ``work_dir`` measures only the convolutions not yet decided.

Examples
--------
>>> db = metaschedule.Database("tune/")                                 # doctest: +SKIP
>>> choices = relax.tune_layouts(mod, "llvm", db)                       # doctest: +SKIP
>>> exe = relax.build(mod, "llvm", database=db)                         # doctest: +SKIP
"""
from __future__ import annotations

import os
import statistics
import time
import warnings
from typing import Callable

import numpy as np

from tilecraft.targets import Target
from tilecraft.tensorir import te

from tilecraft import metaschedule
from tilecraft.metaschedule.arg_info import args_info, random_inputs
from tilecraft.metaschedule.builder import BuilderInput, LocalBuilder, remove_artifact
from tilecraft.metaschedule.runner import LocalRunner, RunnerInput

from . import default_schedules
from .backend.cpu import ConvGeometry, cpu_tile_params
from .backend.cpu.conv2d_nchw import conv2d_nchw_packed
from .backend.cpu.conv2d_nchw_cvec import ChannelVectorPlan, conv2d_nchw_cvec
from .backend.cpu.conv2d_strategy import nchw_plan_candidates, plan_from_json, plan_to_json
from .transform.alter_layout import AlterLayout
from .transform.pipeline import get_pipeline

__all__ = ["tune_layouts", "conv_layout_key", "conv_plans_from", "collect_convs"]

DEFAULT_MARGIN = 0.03
DEFAULT_ROUNDS = 3
DEFAULT_CONFIRM = 5


def conv_layout_key(g: ConvGeometry) -> str:
    """The database key of an NCHW float32 convolution's layout decision.

    Examples
    --------
    >>> g = ConvGeometry(64, 56, 56, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> conv_layout_key(g)
    'conv2d_nchw float32 c=64 h=56 w=56 o=256 k=1x1 s=1x1 p=0,0,0,0 d=1x1 g=1'
    """
    def pair(t):
        return "x".join(map(str, t))
    return (f"conv2d_nchw float32 c={g.in_channels} h={g.height} w={g.width} "
            f"o={g.out_channels} k={pair(g.kernel)} s={pair(g.strides)} "
            f"p={','.join(map(str, g.padding))} d={pair(g.dilation)} g={g.groups}")


def conv_plans_from(database, target) -> Callable | None:
    """``AlterLayout``'s ``conv_plans`` hook for the layout decisions ``database`` holds for
    ``target``, or None when it holds none (or is not a ``metaschedule.Database``). A
    decision that no longer fits (a database edited by hand) is reported with a warning and
    the rule's kernel is used.

    Examples
    --------
    >>> hook = conv_plans_from(db, "llvm")                                  # doctest: +SKIP
    >>> mod = relax.get_pipeline(target="llvm", conv_plans=hook)(mod)       # doctest: +SKIP
    """
    if not hasattr(database, "get_layouts"):
        return None
    target = target if isinstance(target, Target) else Target(target)
    if target.kind != "llvm":
        return None
    layouts = database.get_layouts(target)
    if not layouts:
        return None
    lanes, registers = cpu_tile_params(target)

    def choose(g: ConvGeometry, plan):
        line = layouts.get(conv_layout_key(g))
        if line is None:
            return plan
        try:
            return plan_from_json(g, line["choice"], lanes, registers)
        except ValueError as err:
            warnings.warn(f"{os.path.join(database.work_dir, 'layouts.json')}: the decision "
                          f"for {conv_layout_key(g)} does not apply ({err}); using the "
                          f"default kernel", RuntimeWarning, stacklevel=2)
            return plan
    return choose


def collect_convs(mod, target) -> list[ConvGeometry]:
    """The NCHW convolutions ``AlterLayout`` packs in ``mod`` for ``target`` (each distinct
    one once, in program order): the default pipeline is run up to ``AlterLayout``.

    Examples
    --------
    >>> [conv_layout_key(g) for g in collect_convs(mod, "llvm")][:1]        # doctest: +SKIP
    ['conv2d_nchw float32 c=3 h=224 w=224 o=64 k=7x7 s=2x2 p=3,3,3,3 d=1x1 g=1']
    """
    target = target if isinstance(target, Target) else Target(target)
    seen: dict[str, ConvGeometry] = {}

    def record(g, plan):
        seen.setdefault(conv_layout_key(g), g)
        return plan
    for p in get_pipeline(target=target, conv_plans=record).passes:
        mod = p(mod)
        if isinstance(p, AlterLayout):
            break
    return list(seen.values())


# -- one convolution's candidates ---------------------------------------------------------------
def _kernel(g: ConvGeometry, plan, target: Target):
    """The standalone kernel of ``plan`` at batch 1, with its default schedule."""
    cvec = isinstance(plan, ChannelVectorPlan)
    r = plan.width if cvec else plan.oc_block
    data = te.placeholder((1, g.in_channels, g.height, g.width), "float32", "data")
    weight = te.placeholder((g.out_channels // r, g.in_per_group, g.kernel[0], g.kernel[1], r),
                            "float32", "weight")
    out = (conv2d_nchw_cvec if cvec else conv2d_nchw_packed)(data, weight, plan,
                                                                   "float32")
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    return default_schedules.apply(func, target)


def _reference(g: ConvGeometry, data: np.ndarray, packed: np.ndarray) -> np.ndarray:
    """The convolution of ``data`` with the packed weight ``[O/R, I, KH, KW, R]``, in numpy."""
    kh, kw = g.kernel
    w = packed.transpose(0, 4, 1, 2, 3).reshape(g.out_channels, g.in_per_group, kh, kw)
    pt, pl, pb, pr = g.padding
    xp = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow = g.out_h, g.out_w
    (sh, sw), (dh, dw) = g.strides, g.dilation
    n, groups, ipg, opg = data.shape[0], g.groups, g.in_per_group, g.out_per_group
    wg = w.reshape(groups, opg, ipg, kh, kw).astype(np.float64)
    out = np.zeros((n, groups, opg, oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky * dh: ky * dh + sh * (oh - 1) + 1: sh,
                       kx * dw: kx * dw + sw * (ow - 1) + 1: sw]
            out += np.einsum("ngihw,goi->ngohw", patch.reshape(n, groups, ipg, oh, ow),
                             wg[:, :, :, ky, kx], optimize=True)
    return out.reshape(n, g.out_channels, oh, ow).astype(np.float32)


def _describe(data: dict) -> str:
    if data["kind"] == "cvec":
        return f"cvec {data['rows']}x{data['width']}"
    return f"flat {data['oc_block']}x{data['vectors']}"


def _time(runner: LocalRunner, path: str, target: Target, infos, seed: int, reference=None):
    """(seconds per call, None) or (None, why)."""
    res, = runner.run([RunnerInput(path, target, infos, seed=seed, reference=reference)])
    if res.error_msg is not None:
        return None, res.error_msg
    return sum(res.run_secs) / len(res.run_secs), None


def _measure(g: ConvGeometry, plans: list, target: Target, builder, runner: LocalRunner,
             rounds: int, confirm: int, margin: float, seed: int) -> tuple[list[dict], int | None]:
    """Per plan ``{"plan", "secs", "rounds_secs", "error"}`` (``secs`` the least of the
    rounds, None when it failed), and the index of the plan to use (None: none ran)."""
    rows = [{"plan": plan_to_json(p), "secs": None, "rounds_secs": [], "error": None}
            for p in plans]
    funcs, infos = [], []
    for row, plan in zip(rows, plans):
        try:
            f = _kernel(g, plan, target)
            funcs.append(f)
            infos.append(args_info(f))
        except Exception as err:     # a plan this geometry cannot build: left out, logged
            row["error"] = f"{type(err).__name__}: {err}"
            funcs.append(None)
            infos.append(None)
    live = [i for i, f in enumerate(funcs) if f is not None]
    built = builder.build([BuilderInput(funcs[i], target) for i in live])
    paths: dict[int, str] = {}
    for i, res in zip(live, built):
        if res.error_msg is not None:
            rows[i]["error"] = f"build failed: {res.error_msg}"
        else:
            paths[i] = res.artifact_path
    try:
        order = list(paths)
        for r in range(rounds):
            k = r % len(order) if order else 0
            for i in order[k:] + order[:k]:
                if rows[i]["error"] is not None:
                    continue
                ref = None
                if r == 0:      # every candidate checked once, on the inputs it is timed on
                    data, packed = random_inputs(infos[i][:2], seed)
                    ref = [_reference(g, data, packed)]
                t, err = _time(runner, paths[i], target, infos[i], seed, ref)
                if err is not None:
                    rows[i]["error"] = err
                    continue
                rows[i]["rounds_secs"].append(t)
        ok = [i for i in paths if rows[i]["error"] is None and rows[i]["rounds_secs"]]
        for i in ok:
            # a busy machine only slows a kernel down: its least time is its own
            rows[i]["secs"] = min(rows[i]["rounds_secs"])
        if not ok:
            return rows, None
        best = min(ok, key=lambda i: rows[i]["secs"])
        if 0 not in ok or best == 0:
            return rows, best
        # the fastest against the rule's kernel, back to back: a ratio of two timings taken
        # a moment apart does not move with the machine's load the way either timing does
        ratios = []
        for k in range(confirm):
            pair = (0, best) if k % 2 == 0 else (best, 0)
            got = {i: _time(runner, paths[i], target, infos[i], seed)[0] for i in pair}
            if None in got.values():
                break
            ratios.append(got[best] / got[0])
        rows[best]["paired_ratios"] = ratios
        won = len(ratios) == confirm and statistics.median(ratios) < 1 - margin
        return rows, best if won else 0
    finally:
        for p in paths.values():
            remove_artifact(p)


def _log(work_dir: str | None, line: str, progress: bool) -> None:
    if progress:
        print(line, flush=True)
    if work_dir is not None:
        with open(os.path.join(work_dir, "tune.log"), "a") as f:
            f.write(line + "\n")


def tune_layouts(mod, target="llvm", database=None, *, work_dir=None, pipeline=None,
                 rounds: int = DEFAULT_ROUNDS, confirm: int = DEFAULT_CONFIRM,
                 margin: float = DEFAULT_MARGIN,
                 builder=None, progress: bool = True, seed: int = 0) -> dict[str, dict]:
    """Measure each NCHW convolution's candidate kernels and record the choices in the
    database (see the module docstring).

    Parameters
    ----------
    mod : IRModule
        The Relax module, as given to ``relax.build``.
    target : Target | str
        A CPU (``llvm``) target of this machine (the candidates are timed here); other kinds
        have no packed kernels and a cross-compiled target (a board) keeps the rules'
        kernels: nothing is done for either.
    database : metaschedule.Database, optional
        Where the decisions go; default ``Database(work_dir)``.
    work_dir : str, optional
        The database's directory when ``database`` is not given; ``tune.log`` there gets
        one line per convolution.
    pipeline : optional
        As for ``relax.build``: only the default pipeline has ``AlterLayout``; with any
        other, nothing is done.
    rounds : int
        Timings per candidate, interleaved; the least counts (a busy machine only slows a
        kernel down).
    confirm : int
        Back-to-back timings of the fastest candidate and the rule's kernel before the one
        replaces the other.
    margin : float
        How much faster than the rule's kernel the fastest candidate must be (the median of
        its ``confirm`` back-to-back ratios) to replace it.
    builder : metaschedule.LocalBuilder, optional
    progress : bool
        Print a line per convolution.
    seed : int
        The random inputs' seed.

    Returns
    -------
    dict[str, dict]
        Every decision in force for the model's convolutions: ``{key: choice}``, ``choice``
        as ``conv2d_strategy.plan_to_json`` writes it.

    Raises
    ------
    ValueError
        ``rounds`` or ``confirm`` below 1, a negative ``margin``, neither ``database`` nor
        ``work_dir``.

    Examples
    --------
    >>> choices = tune_layouts(mod, "llvm", work_dir="tune/")               # doctest: +SKIP
    >>> choices["conv2d_nchw float32 c=64 h=56 w=56 o=256 k=1x1 ..."]       # doctest: +SKIP
    {'kind': 'cvec', 'rows': 8, 'width': 32}
    """
    if rounds < 1 or confirm < 1:
        raise ValueError(f"tune_layouts: rounds and confirm must be >= 1, got {rounds} and "
                         f"{confirm}")
    if margin < 0:
        raise ValueError(f"tune_layouts: margin must be >= 0, got {margin}")
    target = target if isinstance(target, Target) else Target(target)
    if database is None:
        if work_dir is None:
            raise ValueError("tune_layouts: give a database or a work_dir")
        database = metaschedule.Database(work_dir)
    work_dir = database.work_dir
    if target.kind != "llvm" or (pipeline is not None and pipeline != "default"):
        return {}
    if not target.is_host:
        # the candidates are timed here; a board's convolutions keep the rules' kernels
        _log(work_dir, f"layouts: {target} is not this machine's; the rules' kernels stay",
             progress)
        return {}
    lanes, registers = cpu_tile_params(target)
    convs = collect_convs(mod, target)
    own_builder = builder is None
    builder = builder or LocalBuilder()
    # warm caches, as in the model (relax.tune's runner); the runner keeps the artifacts,
    # which are timed once per round and removed here
    runner = LocalRunner(enable_cpu_cache_flush=False, cleanup=False)
    out: dict[str, dict] = {}
    try:
        for g in convs:
            key = conv_layout_key(g)
            done = database.query_layout(key, target)
            if done is not None:
                out[key] = done
                continue
            plans = nchw_plan_candidates(g, lanes, registers)
            start = time.perf_counter()
            rows, pick = _measure(g, plans, target, builder, runner, rounds, confirm,
                                  margin, seed)
            for r in rows:
                if r["error"] is not None:
                    _log(work_dir, f"layout {key}: {_describe(r['plan'])} failed: "
                                   f"{r['error']}", progress)
            if pick is None:
                _log(work_dir, f"layout {key}: no candidate ran; keeping the default kernel",
                     progress)
                continue
            chosen, default = rows[pick], rows[0]
            best = min((r for r in rows if r["secs"] is not None), key=lambda r: r["secs"])
            database.commit_layout(key, target, chosen["plan"], rows)
            out[key] = chosen["plan"]
            if pick != 0 and default["secs"] is not None:
                ratio = statistics.median(chosen["paired_ratios"])
                what = (f"{_describe(chosen['plan'])} {chosen['secs'] * 1e3:.3f} ms (default "
                        f"{_describe(default['plan'])} {default['secs'] * 1e3:.3f} ms; back to "
                        f"back {1 / ratio:.2f}x)")
            elif best is not chosen and "paired_ratios" in best:
                ratio = statistics.median(best["paired_ratios"]) if best["paired_ratios"] \
                    else float("nan")
                what = (f"{_describe(chosen['plan'])} {chosen['secs'] * 1e3:.3f} ms, the "
                        f"default ({_describe(best['plan'])} timed {best['secs'] * 1e3:.3f} ms "
                        f"but back to back only {1 / ratio:.2f}x)")
            else:
                what = f"{_describe(chosen['plan'])} {chosen['secs'] * 1e3:.3f} ms (the default)"
            _log(work_dir, f"layout {key}: {what}; {len(rows)} candidates, "
                           f"{time.perf_counter() - start:.0f} s", progress)
    finally:
        runner.close()
        if own_builder:
            builder.close()
    return out
