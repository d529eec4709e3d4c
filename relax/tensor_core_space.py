"""The tuner's space of the tensor-core fp16 GEMM: its tile and code-generation options as knobs.

On a target with tensor cores (``Target("opencl -device=nvidia")``, ``Target.tensor_cores``)
``relax.build`` gives an fp16 GEMM (float16 x float16 -> float32 with its fused epilogue:
``relax.quantize(mod, "fp16")``'s linear layers) the tensor-core kernel of
``relax.backend.gpu.tensor_core``, built whole from a few decisions: the work-group's tile
(``TensorCoreTile``; a symbolic row count gets two, chosen per call) and ``TensorCoreOptions``.
``TensorCoreKnobs`` makes those decisions knobs of a ``metaschedule.KnobSpace``; a point's trace
is one ``sample_categorical`` per knob and then ``Schedule.apply_template("tensor_core_fp16",
target, params)`` (``tensorir.schedule.templates``), so a tuning record replays without the
space. The knobs' defaults are what ``relax.build`` gives the kernel untuned (the seed is
checked to be that kernel, structurally; where it is not — the kernel is not one for the
tensor cores, a forced option breaks it — the rule has no knobs and the SIMT GEMM space
takes the kernel).

Knobs (``TC_KNOBS``):

* ``tile``: an index into ``tile_list()`` (``TC_TUNE_TILES``: the tiles ``choose_tile`` gives
  and 128x128x64x64, 128x64x64x32), candidates those valid for the GEMM on the target (warps
  dividing the tile, threads and shared memory within the target's limits:
  ``tensor_core.tile_problem``). With a symbolic row count this is the tile of the row range
  the task's shape hint falls in (below ``TC_SMALL_ROWS`` rows the small kernel's, else the
  large one's); ``small_tile`` is the other range's tile, then fixed at its default (the
  tuner measures one row count: it cannot time the other kernel). A constant row count and
  a symbolic column count (a convolution's batch) likewise, where the untuned build has a
  few-columns kernel (``tensor_core.few_columns_tile``): ``small_tile`` is its tile, searched
  where the hint's columns are below ``TC_SMALL_COLUMNS_FACTOR`` times its columns;
* ``ldmatrix`` (0 / 1);
* ``split_k`` (0 / 1; only where some candidate tile would split K, else fixed at its
  default);
* ``stages``: 1 (registers), 2 and 3 (the ``cp.async`` ring; ``TensorCoreOptions.stages``).

A combination the target cannot run (a tile over its threads or shared memory) is rejected
before any build by ``check``, naming why; anything else over a limit when the kernel is
lowered (``lower_device``) and by ``VerifyGPUCode``.

Examples
--------
>>> from tilecraft.targets import Target
>>> from tilecraft.metaschedule import KnobSpace
>>> space = KnobSpace(TensorCoreKnobs())
>>> space.knobs_of(fp16_dense, Target("opencl -device=nvidia"))     # doctest: +SKIP
[Knob(name='tile', candidates=(0, 1, 2, 3, 4, 5), default=0), ...]
"""
from __future__ import annotations

import os

from tilecraft.targets import Target
from tilecraft.tensorir import arith
from tilecraft.tensorir import expr as E
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import substitute
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.structural import structural_equal
from tilecraft.tensorir.transform import lower_device

from tilecraft.metaschedule import Knob, KnobRule
from tilecraft.metaschedule.space_generator import DEFAULT_SHAPE_HINT, shape_vars

from . import gpu_schedules
from .backend.gpu import tensor_core as tc

__all__ = ["TC_KNOBS", "TensorCoreKnobs", "tile_list"]

TC_KNOBS = ("tile", "small_tile", "ldmatrix", "split_k", "stages")


def tile_list() -> tuple:
    """The tiles the ``tile`` knobs index: ``TC_TUNE_TILES``, and the tiles forced by
    ``TILECRAFT_TC_TILE`` and ``TILECRAFT_TC_SMALL_TILE`` (the untuned build's) where they are
    not among them."""
    tiles = tc.TC_TUNE_TILES
    for name in ("TILECRAFT_TC_TILE", "TILECRAFT_TC_SMALL_TILE"):
        value = os.environ.get(name)
        if value:
            forced = tc.TensorCoreTile(*(int(x) for x in value.lower().split("x")))
            tiles += (forced,) if forced not in tiles else ()
    return tiles


def _at_hint(count, func: PrimFunc, hints: dict) -> int:
    """A row or column count at the shape hints (missing ones ``DEFAULT_SHAPE_HINT``)."""
    if isinstance(count, int):
        return count
    vmap = {v: E.IntImm(int(hints.get(v.name, DEFAULT_SHAPE_HINT)), v.dtype)
            for v in shape_vars(func)}
    n = E.as_int(arith.simplify(substitute(count, vmap)))
    return n if n is not None else tc.TC_NOMINAL_ROWS


class TensorCoreKnobs(KnobRule):
    """The tensor-core fp16 GEMM's tile and options as knobs (see the module docstring), for
    every kernel ``relax.build`` gives the tensor-core kernel untuned.

    Examples
    --------
    >>> rule = TensorCoreKnobs()
    >>> rule.knobs(fp32_softmax, Target("opencl -device=nvidia"), {}) is None   # doctest: +SKIP
    True
    """

    def knobs(self, func: PrimFunc, target: Target, hints: dict) -> list[Knob] | None:
        if target.tensor_cores is None:
            return None
        try:
            gm = tc.match_fp16_gemm(func)
            opts = tc.TensorCoreOptions.from_env()
        except ValueError:
            return None
        tiles = tile_list()
        ok = [i for i, t in enumerate(tiles) if tc.tile_problem(t, gm, target) is None]
        n_nominal = gm.N if isinstance(gm.N, int) else tc.TC_NOMINAL_ROWS
        symbolic = not isinstance(gm.M, int)
        few_cols = tc.column_dispatch(gm)
        if symbolic:
            large = tc.choose_tile(None, n_nominal)
            small = tc.choose_tile(tc.TC_SMALL_NOMINAL_ROWS, n_nominal)
            # the hint runs the small kernel: tune its tile
            small_hinted = _at_hint(gm.M, func, hints) < tc.TC_SMALL_ROWS
            nominal = ((tc.TC_SMALL_NOMINAL_ROWS, gm.N), (tc.TC_NOMINAL_ROWS, gm.N))
        else:
            large = tc.choose_tile(gm.M, n_nominal)
            # a symbolic column count: the few-columns kernel where the untuned build has one
            small = tc.few_columns_tile(gm, opts, large)
            small_hinted = small is not None and _at_hint(gm.N, func, hints) < \
                tc.TC_SMALL_COLUMNS_FACTOR * few_cols
            nominal = ((gm.M, gm.N),) + (((gm.M, few_cols),) if small is not None else ())
        if large not in tiles or (small is not None and small not in tiles):
            return None
        li = tiles.index(large)
        knobs = [Knob("tile", sorted(set(ok) | {li}), li)]
        if small is not None:
            si = tiles.index(small)
            if small_hinted:
                knobs = [Knob("tile", (li,), li), Knob("small_tile", sorted(set(ok) | {si}), si)]
            else:
                knobs.append(Knob("small_tile", (si,), si))
        # split-K is decided per kernel at its nominal rows and columns (a symbolic count's two
        # kernels: TC_SMALL_NOMINAL_ROWS and TC_NOMINAL_ROWS rows, or the few columns and
        # TC_NOMINAL_ROWS); the knob only where some tile splits
        BK = tc.k_step(gm)
        splits = gm.K % BK == 0 and any(
            tc.split_parts(r, c, gm.K, BK, tiles[i], gm.product(gm.batch_vars)) > 1
            for i in ok for r, c in nominal)
        knobs += [
            Knob("ldmatrix", (0, 1), int(opts.ldmatrix)),
            Knob("split_k", (0, 1) if splits else (int(opts.split_k),), int(opts.split_k)),
            Knob("stages", (1, 2, 3), opts.stages),
        ]
        # the kernel at the defaults must be what relax.build gives untuned (the seed)
        sch = Schedule(func)
        try:
            self.apply(sch, target, {k.name: k.default for k in knobs})
        except Exception:  # noqa: BLE001 - no tensor-core space for this kernel; the next one
            return None
        if not structural_equal(sch.func, gpu_schedules.apply(func, target)):
            return None
        return knobs

    @staticmethod
    def _tiles(values: dict) -> tuple:
        tiles = tile_list()
        small = values.get("small_tile")
        return tiles[values["tile"]], (tiles[small] if small is not None else None)

    def check(self, func: PrimFunc, target: Target, values: dict) -> str | None:
        try:
            gm = tc.match_fp16_gemm(func)
        except ValueError as err:
            return f"not an fp16 GEMM: {err}"
        for tile in self._tiles(values):
            why = tc.tile_problem(tile, gm, target) if tile is not None else None
            if why:
                return why
        return None

    def apply(self, sch: Schedule, target: Target, values: dict) -> None:
        tile, small = self._tiles(values)
        params = {"tile": [tile.BM, tile.BN, tile.WM, tile.WN],
                  "ldmatrix": int(values["ldmatrix"]), "split_k": int(values["split_k"]),
                  "stages": int(values["stages"])}
        if small is not None:
            params["small_tile"] = [small.BM, small.BN, small.WM, small.WN]
        sch.apply_template(tc.TEMPLATE, str(target), params)
        # over a limit of the target: ValueError or TIRError naming it, before any build
        lower_device(sch.func, target)
