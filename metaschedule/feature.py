"""``PerStoreFeature``: a fixed-width feature vector for every buffer store of a lowered function.

The cost model (``metaschedule.cost_model``) learns the speed of a scheduled function from what
its loop nests do. Each candidate is lowered (``tensorir.transform.lower``: no blocks, 1-D
buffers, loop kinds kept) and every ``BufferStore`` becomes one row of ``NUM_FEATURES`` numbers
describing the store in its context: how much arithmetic of which kind it does, which loops run
it (kinds, extents, thread bindings), how it touches memory (per buffer: bytes, cache lines,
strides, reuse), the working set at each loop level, the allocation it writes, and a few
whole-function numbers repeated on every row. A function's score is the sum of its rows' scores
(TVM's *pack sum*), so a function of any size gets a prediction.

Every column is named in ``FEATURE_NAMES`` and explained in ``FEATURE_DOCS``
(``describe_features()`` prints the table). Counts, extents, bytes and cycles are given as
``log2(1 + x)``, so the trees split on orders of magnitude; flags and ratios are given as they
are. Symbolic extents are evaluated at ``shape_vars`` (the representative values the task is
tuned at), unknown ones at ``DEFAULT_SYMBOLIC_EXTENT``.

The ``est_*`` columns are an analytic machine model of the store (cycles of arithmetic, of a
reduction's dependence chain, of L1 accesses, of traffic from L2 / L3 / DRAM, of loop and
parallel-launch overhead; ``est_cycles`` their combination). ``analytic_cost(features)`` sums
``est_cycles`` over a function's rows: it is the cost model's prior, which ranks candidates
before a single one has been measured.

Examples
--------
>>> from tilecraft.tensorir import te, Schedule
>>> A = te.placeholder((64, 64), "float32", "A")
>>> B = te.compute((64, 64), lambda i, j: A[i, j] * 2.0, "B")
>>> feats = PerStoreFeature().extract([te.create_prim_func([A, B])])
>>> feats[0].shape == (1, NUM_FEATURES)
True
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import (Add, And, BinaryOp, BufferLoad, Call, Cast, CmpOp, Div, FloatImm,
                           FloorDiv, FloorMod, GE, GT, IntImm, LE, LT, Let, Max, Min, Mod, Mul,
                           Not, Or, PrimExpr, Select, Sub, Var)
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.stmt import (Allocate, AssertStmt, Block, BlockRealize, Buffer, BufferStore,
                           Evaluate, For, IfThenElse, LetStmt, SeqStmt)
from tilecraft.tensorir.transform import lower

DEFAULT_SYMBOLIC_EXTENT = 64   # a symbolic extent with no representative value counts as this
NUM_BUFFER_SLOTS = 5           # buffers described per store (the most-touched first)
CACHE_LINE = 64                # bytes
INTENSITY_POINTS = 10          # samples of the arithmetic-intensity curve

_MATH_FUNCS = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "pow", "sin", "cos",
               "exp2", "log2"}
# cycles per vector of a math function in the analytic model (polynomial approximations)
_MATH_COST = 12.0

# ---------------------------------------------------------------------------------------------
# the columns


def _columns() -> list[tuple[str, str]]:
    cols: list[tuple[str, str]] = []

    def add(name, doc):
        cols.append((name, doc))

    # 1. arithmetic: dynamic counts (per execution of the function), log2(1 + x)
    for kind, what in (("float", "floating-point"), ("int", "integer")):
        add(f"{kind}_mad", f"{what} multiply-adds (an add of a product) executed")
        add(f"{kind}_addsub", f"{what} additions and subtractions executed (not in a mad)")
        add(f"{kind}_mul", f"{what} multiplications executed (not in a mad)")
        add(f"{kind}_divmod", f"{what} divisions and modulos executed")
        add(f"{kind}_cmp", f"{what} comparisons executed")
        add(f"{kind}_minmax", f"{what} min / max executed")
    add("float_math_func", "transcendental intrinsics executed (exp, log, tanh, sqrt, erf, ...)")
    add("float_other_func", "other float intrinsics executed (fabs, floor, ceil, round, trunc)")
    add("bool_op", "logical and / or / not executed")
    add("select_op", "selects and if_then_else executed")
    add("cast_op", "casts executed")
    add("store_bits", "bits of the stored element type (raw)")
    add("is_float_store", "1 if the stored value is floating point")
    # 2. loops around the store
    for kind in ("vectorized", "unrolled", "parallel", "serial"):
        add(f"{kind}_len", f"extent of the innermost {kind} loop around the store (0: none)")
        add(f"{kind}_prod", f"product of the extents of the {kind} loops around the store")
        add(f"{kind}_num", f"number of {kind} loops around the store (raw)")
        add(f"{kind}_innermost", f"1 if the innermost loop around the store is {kind}")
    for tag in ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y",
                "threadIdx.z", "vthread"):
        add(f"bind_{tag}", f"extent of the loop bound to {tag} (0: none)")
    add("num_loops", "loops around the store (raw)")
    add("trip_count", "times the store executes (product of all extents, times guard fractions)")
    add("innermost_extent", "extent of the innermost loop around the store")
    add("register_block", "iterations of the innermost run of unrolled / vectorized loops")
    add("auto_unroll", "the largest 'pragma_auto_unroll_max_step' annotation around the store")
    add("num_guards", "IfThenElse conditions around the store (raw)")
    add("guard_fraction", "estimated fraction of iterations the guards let through (raw)")
    add("is_accumulate", "1 if the store reads the element it writes (a reduction update)")
    add("reduce_extent", "product of the extents of loops the written index does not depend on")
    # 3. buffers: NUM_BUFFER_SLOTS slots, most bytes first, zeros when fewer buffers
    for s in range(NUM_BUFFER_SLOTS):
        p = f"buf{s}_"
        add(p + "read", f"slot {s}: 1 if the buffer is only read")
        add(p + "write", f"slot {s}: 1 if the buffer is only written")
        add(p + "readwrite", f"slot {s}: 1 if the buffer is read and written")
        add(p + "bytes", f"slot {s}: bytes accessed (dynamic)")
        add(p + "unique_bytes", f"slot {s}: distinct bytes accessed (footprint of the nest)")
        add(p + "lines", f"slot {s}: cache lines accessed (dynamic, {CACHE_LINE}-byte lines)")
        add(p + "unique_lines", f"slot {s}: distinct cache lines accessed")
        add(p + "reuse_loop", f"slot {s}: 1 if an enclosing loop re-reads the same elements")
        add(p + "reuse_serial", f"slot {s}: 1 if the store accesses the buffer more than once")
        add(p + "reuse_none", f"slot {s}: 1 if nothing is reused")
        add(p + "reuse_dis_iter", f"slot {s}: iterations between two uses of an element")
        add(p + "reuse_dis_bytes", f"slot {s}: bytes touched between two uses of an element")
        add(p + "reuse_ct", f"slot {s}: times an element is reused")
        add(p + "bytes_d_reuse", f"slot {s}: bytes / reuse count")
        add(p + "unique_bytes_d_reuse", f"slot {s}: distinct bytes / reuse count")
        add(p + "lines_d_reuse", f"slot {s}: lines / reuse count")
        add(p + "inner_stride", f"slot {s}: elements between accesses of consecutive iterations "
            f"of the innermost loop (0: invariant)")
        add(p + "min_stride", f"slot {s}: the smallest non-zero stride over the loops")
        add(p + "vector_contig", f"slot {s}: 1 if the innermost vectorized loop walks it "
            f"contiguously or not at all (a plain vector load or a broadcast)")
        add(p + "irregular", f"slot {s}: 1 if an index is not affine in the loops (gather)")
        add(p + "scope_local", f"slot {s}: 1 if it is a local (register / stack) buffer")
    # 4. arithmetic intensity: flop / distinct bytes at INTENSITY_POINTS loop levels
    for k in range(INTENSITY_POINTS):
        add(f"intensity_{k}", f"float ops per distinct byte of the loops from the innermost to "
            f"level {k}/{INTENSITY_POINTS - 1} of the nest (raw, log2(1 + x))")
    # 5. the allocation the store writes into
    add("alloc_bytes", "bytes of the allocation the store writes (0: a parameter)")
    add("alloc_local", "1 if that allocation is local scope")
    add("alloc_shared", "1 if that allocation is shared scope")
    add("alloc_outer_prod", "iterations of the loops outside the allocation")
    add("alloc_inner_prod", "store executions inside one life of the allocation")
    # 6. working set
    add("ws_innermost", "distinct bytes touched by one run of the innermost loop")
    add("ws_register_block", "distinct bytes touched by one run of the register block")
    add("ws_level_l1", "loop levels (from the innermost) whose working set fits in L1 (raw)")
    add("ws_level_l2", "loop levels whose working set fits in L2 (raw)")
    add("ws_total", "distinct bytes touched by the whole nest")
    # 7. the analytic model
    add("est_compute", "analytic model: cycles of arithmetic (vector units, all cores)")
    add("est_latency", "analytic model: cycles of a reduction's dependence chains")
    add("est_l1", "analytic model: cycles of load / store instructions")
    add("est_l2", "analytic model: cycles of traffic from L2")
    add("est_l3", "analytic model: cycles of traffic from L3")
    add("est_dram", "analytic model: cycles of DRAM traffic")
    add("est_overhead", "analytic model: cycles of loop and parallel-launch overhead")
    add("est_lanes", "analytic model: vector lanes of the store (explicit or LLVM's own "
        "vectorization of the loop around the register block)")
    add("est_register_block", "analytic model: iterations of the register block as LLVM runs "
        "it (small constant serial loops inside it are fully unrolled)")
    add("est_cycles", "analytic model: estimated cycles of the store (max of the above + overhead)")
    # 8. the whole function (the same on every row)
    add("func_float_ops", "function: float ops executed by all stores")
    add("func_num_stores", "function: buffer stores (raw)")
    add("func_num_loops", "function: loops (raw)")
    add("func_num_nests", "function: top-level statements (loop nests) (raw)")
    add("func_alloc_bytes", "function: bytes of all allocations")
    add("func_max_parallel", "function: the largest parallel extent")
    add("func_est_cycles", "function: est_cycles summed over all stores")
    return cols


_COLUMNS = _columns()
FEATURE_NAMES: list[str] = [c[0] for c in _COLUMNS]
FEATURE_DOCS: dict[str, str] = dict(_COLUMNS)
NUM_FEATURES = len(FEATURE_NAMES)
_INDEX = {n: i for i, n in enumerate(FEATURE_NAMES)}
# columns given raw (flags, ratios, small counts); the rest are log2(1 + x)
_RAW = {n for n in FEATURE_NAMES if n.endswith(("_num", "_innermost", "_read", "_write",
                                                "_readwrite", "reuse_loop", "reuse_serial",
                                                "reuse_none", "_contig", "_irregular",
                                                "_local", "_shared", "vector_contig"))}
_RAW |= {"store_bits", "is_float_store", "num_loops", "num_guards", "guard_fraction",
         "is_accumulate", "ws_level_l1", "ws_level_l2", "func_num_stores", "func_num_loops",
         "func_num_nests"}


def describe_features() -> str:
    """The columns of a feature row, one per line: index, name, meaning."""
    return "\n".join(f"{i:3d}  {n:28s} {FEATURE_DOCS[n]}{'' if n in _RAW else '  [log2(1+x)]'}"
                     for i, n in enumerate(FEATURE_NAMES))


# ---------------------------------------------------------------------------------------------
# the machine the analytic model describes


@dataclass(frozen=True)
class MachineModel:
    """What the analytic columns assume about the CPU (per core unless noted)."""

    cores: int = 1
    vector_bits: int = 256
    fma_units: int = 2          # vector FMAs issued per cycle
    fma_latency: float = 4.0    # cycles
    loads_per_cycle: float = 2.0
    vector_registers: int = 16
    l1_bytes: int = 32 << 10
    l2_bytes: int = 512 << 10
    l3_bytes: int = 8 << 20     # shared by all cores
    l2_bw: float = 32.0         # bytes per cycle into L1
    l3_bw: float = 16.0
    dram_bw: float = 8.0        # bytes per cycle for the whole chip
    parallel_launch: float = 8000.0   # cycles per parallel region entered
    gpu: bool = False           # thread-bound loops run in parallel on up to ``cores`` threads

    @staticmethod
    def for_target(target: Target | None) -> "MachineModel":
        if target is None:
            target = Target("llvm")
        if target.kind in ("opencl", "webgpu"):
            # a GPU, roughly: thousands of scalar threads, shared memory as the "L1"
            return MachineModel(cores=8192, vector_bits=32, vector_registers=64,
                                l1_bytes=int(target.max_shared_memory_per_block or 48 << 10),
                                l2_bytes=4 << 20, l3_bytes=4 << 20, l2_bw=64.0, l3_bw=64.0,
                                dram_bw=256.0, parallel_launch=5000.0, gpu=True)
        cores = target.num_cores or (os.cpu_count() or 1) if target.is_host else \
            (target.num_cores or 4)
        width = int(target.vector_width or 128)
        arch = str(target.arch)
        regs = 32 if arch == "aarch64" or width >= 512 else 16
        l1, l2, l3 = 32 << 10, 512 << 10, 8 << 20
        if target.is_host:
            l1, l2, l3 = _host_cache_sizes(l1, l2, l3)
        return MachineModel(cores=max(1, int(cores)), vector_bits=width, vector_registers=regs,
                            l1_bytes=l1, l2_bytes=l2, l3_bytes=l3)


def _host_cache_sizes(l1: int, l2: int, l3: int) -> tuple[int, int, int]:
    base = "/sys/devices/system/cpu/cpu0/cache"
    sizes = {}
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            d = os.path.join(base, entry)
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                text = f.read().strip().upper()
            if kind == "Instruction":
                continue
            mult = 1 << 20 if text.endswith("M") else 1 << 10 if text.endswith("K") else 1
            sizes[level] = int(text.rstrip("KMB")) * mult
    except (OSError, ValueError):
        return l1, l2, l3
    return sizes.get(1, l1), sizes.get(2, l2), sizes.get(3, l3)


# ---------------------------------------------------------------------------------------------
# evaluation of extents and indices


class _Env:
    """Integer values of symbolic shape vars (by name) and loop vars (at their min)."""

    def __init__(self, shape_vars: Mapping[str, int]):
        self.by_name = dict(shape_vars)
        self.loops: dict[int, int] = {}

    def value(self, e: PrimExpr, default: int = DEFAULT_SYMBOLIC_EXTENT) -> float:
        v = self._eval(e)
        return float(default) if v is None else float(v)

    def _eval(self, e):
        t = type(e)
        if t is IntImm:
            return e.value
        if t is FloatImm:
            return e.value
        if t is Var:
            if id(e) in self.loops:
                return self.loops[id(e)]
            return self.by_name.get(e.name, DEFAULT_SYMBOLIC_EXTENT)
        if t is Cast:
            return self._eval(e.value)
        if isinstance(e, BinaryOp) and not isinstance(e, (CmpOp, And, Or)):
            a, b = self._eval(e.a), self._eval(e.b)
            if a is None or b is None:
                return None
            try:
                if t is Add:
                    return a + b
                if t is Sub:
                    return a - b
                if t is Mul:
                    return a * b
                if t in (FloorDiv, Div):
                    return a // b if b else None
                if t in (FloorMod, Mod):
                    return a % b if b else None
                if t is Min:
                    return min(a, b)
                if t is Max:
                    return max(a, b)
            except (ZeroDivisionError, OverflowError):
                return None
        if t is Select:
            return self._eval(e.true_value)
        return None


def _affine(e: PrimExpr, loop_ids: set[int]) -> tuple[dict[int, float], dict[int, float], bool]:
    """Coefficients of the loop vars in ``e`` (by id), a cap on each var's span from modulos,
    and whether ``e`` is irregular (a load or a non-affine use of a loop var)."""
    coeffs: dict[int, float] = {}
    caps: dict[int, float] = {}
    irregular = False

    def rec(x, scale: float):
        nonlocal irregular
        t = type(x)
        if t is IntImm or t is FloatImm:
            return
        if t is Var:
            if id(x) in loop_ids:
                coeffs[id(x)] = coeffs.get(id(x), 0.0) + scale
            return
        if t is Add:
            rec(x.a, scale)
            rec(x.b, scale)
        elif t is Sub:
            rec(x.a, scale)
            rec(x.b, -scale)
        elif t is Mul:
            if isinstance(x.a, IntImm):
                rec(x.b, scale * x.a.value)
            elif isinstance(x.b, IntImm):
                rec(x.a, scale * x.b.value)
            else:
                irregular = True
        elif t in (FloorDiv, Div) and isinstance(x.b, IntImm) and x.b.value > 0:
            rec(x.a, scale / x.b.value)
        elif t in (FloorMod, Mod) and isinstance(x.b, IntImm) and x.b.value > 0:
            before = dict(coeffs)
            rec(x.a, scale)
            for k, v in coeffs.items():
                if v != before.get(k, 0.0):
                    caps[k] = min(caps.get(k, math.inf), float(x.b.value))
        elif t is Cast:
            rec(x.value, scale)
        elif t in (Min, Max):
            rec(x.a, scale)
        elif t is Select:
            rec(x.true_value, scale)
        elif t is Call and x.op == "if_then_else":
            rec(x.args[1], scale)
        elif t is BufferLoad:
            irregular = True
        else:
            irregular = True

    rec(e, 1.0)
    return {k: v for k, v in coeffs.items() if v != 0.0}, caps, irregular


# ---------------------------------------------------------------------------------------------
# the walk


@dataclass
class _Loop:
    var: Var
    extent: float
    kind: str
    thread_tag: str | None
    auto_unroll: float


@dataclass
class _Access:
    buffer: Buffer
    coeffs: dict
    caps: dict
    irregular: bool
    is_write: bool


@dataclass
class _Counts:
    values: dict = field(default_factory=dict)

    def add(self, name: str, n: float = 1.0):
        self.values[name] = self.values.get(name, 0.0) + n


def _count_expr(e: PrimExpr, counts: _Counts, loads: list, loop_ids: set[int]) -> None:
    """Static op counts of one evaluation of ``e``; the loads it makes go to ``loads``."""
    stack = [e]
    while stack:
        x = stack.pop()
        t = type(x)
        if t in (IntImm, FloatImm, Var):
            continue
        if t is BufferLoad:
            coeffs, caps, irr = _affine(x.indices[0], loop_ids) if len(x.indices) == 1 else \
                ({}, {}, True)
            loads.append(_Access(x.buffer, coeffs, caps, irr, False))
            for i in x.indices:
                stack.append(i)
            continue
        kind = "float" if dt.is_float(x.dtype) else "int"
        if isinstance(x, CmpOp):
            kind = "float" if dt.is_float(x.a.dtype) else "int"
            counts.add(f"{kind}_cmp")
        elif t is Add or t is Sub:
            prod = next((o for o in (x.a, x.b) if type(o) is Mul), None)
            if prod is not None:
                counts.add(f"{kind}_mad")
                other = x.b if prod is x.a else x.a
                stack.extend((prod.a, prod.b, other))
                continue
            counts.add(f"{kind}_addsub")
        elif t is Mul:
            counts.add(f"{kind}_mul")
        elif t in (Div, FloorDiv, Mod, FloorMod):
            counts.add(f"{kind}_divmod")
        elif t in (Min, Max):
            counts.add(f"{kind}_minmax")
        elif t in (And, Or, Not):
            counts.add("bool_op")
        elif t is Select:
            counts.add("select_op")
        elif t is Cast:
            counts.add("cast_op")
        elif t is Call:
            if x.op == "if_then_else":
                counts.add("select_op")
            elif x.op in _MATH_FUNCS:
                counts.add("float_math_func")
            else:
                counts.add("float_other_func")
        elif t is Let:
            pass
        for f in x._fields:
            v = getattr(x, f)
            if isinstance(v, PrimExpr):
                stack.append(v)
            elif isinstance(v, tuple):
                stack.extend(a for a in v if isinstance(a, PrimExpr))


def _conjuncts(cond: PrimExpr) -> list:
    if isinstance(cond, And):
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


_GUARD_RNG = np.random.default_rng(0)
_GUARD_SAMPLES = 512


def _guard_fraction(cond: PrimExpr, loops: list[_Loop], env: _Env) -> tuple[float, set]:
    """The fraction of iterations a guard lets through, and the loop vars (by id) it tests.

    Conjunctions of comparisons ``a < b`` (``<=``, ``>``, ``>=``) with ``a - b`` affine in the
    loops are evaluated exactly over one loop's range, or on random points of several loops'
    ranges; other terms count as always true."""
    by_id = {id(l.var): l for l in loops}
    terms = []
    for c in _conjuncts(cond):
        if not isinstance(c, (LT, LE, GT, GE)):
            continue
        diff = Sub(c.a, c.b)
        coeffs, caps, irr = _affine(diff, set(by_id))
        if irr or caps or not coeffs:
            continue
        saved = {v: env.loops.get(v) for v in coeffs}
        for v in coeffs:
            env.loops[v] = 0
        r = env._eval(diff)
        for v, old in saved.items():
            if old is not None:
                env.loops[v] = old
        if r is None:
            continue
        terms.append((coeffs, float(r), type(c)))
    if not terms:
        return 1.0, set()
    vids = sorted({v for coeffs, _, _ in terms for v in coeffs})
    extents = [max(int(by_id[v].extent), 1) for v in vids]
    if len(vids) == 1 and extents[0] <= 4096:
        points = np.arange(extents[0], dtype=np.float64)[:, None]
    else:
        points = np.stack([_GUARD_RNG.integers(0, e, _GUARD_SAMPLES) for e in extents],
                          axis=1).astype(np.float64)
    ok = np.ones(len(points), dtype=bool)
    col = {v: i for i, v in enumerate(vids)}
    for coeffs, r, kind in terms:
        x = r + sum(points[:, col[v]] * c for v, c in coeffs.items())
        ok &= (x < 0) if kind is LT else (x <= 0) if kind is LE else (x > 0) if kind is GT \
            else (x >= 0)
    frac = max(float(ok.sum()), 0.5) / len(points)
    return min(frac, 1.0), set(vids)


@dataclass
class _StoreInfo:
    store: BufferStore
    loops: list           # outermost first
    guards: list          # (loops around the guard, its fraction, loop var ids it tests)
    guard_fraction: float
    counts: _Counts
    accesses: list
    alloc: tuple | None   # (buffer, loops outside it)
    par_fraction: float = 1.0   # share of the parallel iterations that reach the store


class _Collector:
    def __init__(self, env: _Env):
        self.env = env
        self.loops: list[_Loop] = []
        self.guard_stack: list[tuple[int, float, set]] = []  # (depth, fraction, vars tested)
        self.fraction = 1.0
        self.par_fraction = 1.0
        self.allocs: dict[int, tuple] = {}   # buffer id -> (buffer, depth)
        self.stores: list[_StoreInfo] = []
        self.num_loops = 0
        self.max_parallel = 0.0

    def visit(self, s) -> None:
        t = type(s)
        if t is SeqStmt:
            for x in s.seq:
                self.visit(x)
        elif t is For:
            self.num_loops += 1
            ext = max(self.env.value(s.extent), 0.0)
            ann = s.annotation_dict
            au = float(ann.get("pragma_auto_unroll_max_step", 0) or 0) if isinstance(
                ann.get("pragma_auto_unroll_max_step", 0), (int, float)) else 0.0
            kind = s.kind if s.kind != "thread_binding" else "thread_binding"
            if kind == "parallel":
                self.max_parallel = max(self.max_parallel, ext)
            self.loops.append(_Loop(s.loop_var, ext, kind, s.thread_tag, au))
            self.env.loops[id(s.loop_var)] = int(self.env.value(s.min, 0))
            self.visit(s.body)
            self.loops.pop()
            self.env.loops.pop(id(s.loop_var), None)
        elif t is IfThenElse:
            frac, vids = _guard_fraction(s.condition, self.loops, self.env)
            # a guard on parallel loops alone splits the parallel iterations between its
            # branches: the stores under each run on that share of the cores
            on_par = bool(vids) and all(l.kind == "parallel" for l in self.loops
                                        if id(l.var) in vids)
            self.guard_stack.append((len(self.loops), frac, vids))
            saved, saved_par = self.fraction, self.par_fraction
            self.fraction = saved * frac
            if on_par:
                self.par_fraction = saved_par * frac
            self.visit(s.then_case)
            if s.else_case is not None:
                rest = max(0.0, 1.0 - frac) if frac < 1.0 else 1.0
                self.fraction = saved * rest
                if on_par:
                    self.par_fraction = saved_par * rest
                self.guard_stack[-1] = (len(self.loops), rest, vids)
                self.visit(s.else_case)
            self.fraction, self.par_fraction = saved, saved_par
            self.guard_stack.pop()
        elif t is Allocate:
            self.allocs[id(s.buffer)] = (s.buffer, len(self.loops))
            self.visit(s.body)
        elif t in (LetStmt, AssertStmt):
            self.visit(s.body)
        elif t is BufferStore:
            self.store(s)
        elif t in (Block, BlockRealize):  # not lowered: walk through the block's body
            body = s.block.body if t is BlockRealize else s.body
            self.visit(body)
        # Evaluate: no store

    def store(self, s: BufferStore) -> None:
        loop_ids = {id(l.var) for l in self.loops}
        counts = _Counts()
        loads: list[_Access] = []
        _count_expr(s.value, counts, loads, loop_ids)
        for i in s.indices:
            _count_expr(i, counts, loads, loop_ids)
        if len(s.indices) == 1:
            coeffs, caps, irr = _affine(s.indices[0], loop_ids)
        else:
            coeffs, caps, irr = {}, {}, True
        accesses = [_Access(s.buffer, coeffs, caps, irr, True)] + loads
        alloc = self.allocs.get(id(s.buffer))
        self.stores.append(_StoreInfo(s, list(self.loops), list(self.guard_stack), self.fraction,
                                      counts,
                                      accesses, None if alloc is None else alloc,
                                      self.par_fraction))


# ---------------------------------------------------------------------------------------------
# per-store features


def _log(x: float) -> float:
    return math.log2(1.0 + max(0.0, float(x)))


def _footprint(acc_coeffs: dict, caps: dict, loops: Sequence[_Loop], elems_total: float,
               itemsize: int) -> tuple[float, float]:
    """Distinct elements and distinct cache lines an access touches over ``loops``."""
    span = 1.0
    prod = 1.0
    lines = 1.0
    per_line = max(1.0, CACHE_LINE / itemsize)
    for l in loops:
        c = abs(acc_coeffs.get(id(l.var), 0.0))
        if c == 0.0 or l.extent <= 1:
            continue
        e = l.extent
        reach = min(c * (e - 1), caps.get(id(l.var), math.inf))
        span += reach
        prod *= e
        if c * itemsize >= CACHE_LINE:
            lines *= e
        else:
            lines *= max(1.0, math.ceil(e * c / per_line))
    uniq = max(1.0, min(span, prod, elems_total))
    lines = max(1.0, min(lines, math.ceil(uniq / per_line) + (1 if uniq > 1 else 0), uniq))
    return uniq, lines


def _buffer_elems(buf: Buffer, env: _Env) -> float:
    n = 1.0
    for s in buf.shape:
        n *= max(1.0, env.value(s))
    return n


class _StoreFeatures:
    """Computes one row from a ``_StoreInfo``."""

    def __init__(self, info: _StoreInfo, env: _Env, machine: MachineModel):
        self.info, self.env, self.m = info, env, machine
        self.row = np.zeros(NUM_FEATURES, dtype=np.float64)

    def set(self, name: str, value: float):
        self.row[_INDEX[name]] = value

    def compute(self) -> tuple[np.ndarray, float]:
        info, m = self.info, self.m
        loops = info.loops
        store = info.store
        trip = info.guard_fraction
        for l in loops:
            trip *= max(l.extent, 0.0)
        trip = max(trip, 0.0)
        # -- arithmetic
        for name, n in info.counts.values.items():
            self.set(name, _log(n * trip))
        sdtype = store.buffer.dtype
        is_float = dt.is_float(sdtype)
        self.set("store_bits", dt.bits(sdtype))
        self.set("is_float_store", float(is_float))
        cv = info.counts.values
        float_ops = (2 * cv.get("float_mad", 0) + cv.get("float_addsub", 0) +
                     cv.get("float_mul", 0) + cv.get("float_divmod", 0) +
                     cv.get("float_cmp", 0) + cv.get("float_minmax", 0) +
                     cv.get("float_math_func", 0) + cv.get("float_other_func", 0))
        # -- loops
        for kind in ("vectorized", "unrolled", "parallel", "serial"):
            ls = [l for l in loops if l.kind == kind]
            self.set(f"{kind}_len", _log(ls[-1].extent) if ls else 0.0)
            self.set(f"{kind}_prod", _log(math.prod(l.extent for l in ls)) if ls else 0.0)
            self.set(f"{kind}_num", len(ls))
            self.set(f"{kind}_innermost", float(bool(loops) and loops[-1].kind == kind))
        for l in loops:
            if l.kind == "thread_binding" and l.thread_tag:
                tag = "vthread" if l.thread_tag.startswith("vthread") else l.thread_tag
                if f"bind_{tag}" in _INDEX:
                    self.set(f"bind_{tag}", _log(l.extent))
        self.set("num_loops", len(loops))
        self.set("trip_count", _log(trip))
        self.set("innermost_extent", _log(loops[-1].extent) if loops else 0.0)
        block = []   # the register block: the innermost run of unrolled / vectorized loops
        for l in reversed(loops):
            if l.kind in ("unrolled", "vectorized"):
                block.append(l)
            else:
                break
        block.reverse()
        block_trip = math.prod(l.extent for l in block) if block else 1.0
        self.set("register_block", _log(block_trip))
        self.set("auto_unroll", _log(max((l.auto_unroll for l in loops), default=0.0)))
        self.set("num_guards", len(info.guards))
        self.set("guard_fraction", info.guard_fraction)

        # -- buffers: merge the accesses of each buffer
        write = info.accesses[0]
        by_buf: dict[int, list[_Access]] = {}
        for a in info.accesses:
            by_buf.setdefault(id(a.buffer), []).append(a)
        wid = id(write.buffer)
        is_acc = any(not a.is_write and a.coeffs == write.coeffs and not a.irregular
                     for a in by_buf[wid])
        self.set("is_accumulate", float(is_acc))
        reduce_loops = [l for l in loops if id(l.var) not in write.coeffs and
                        l.kind not in ("thread_binding",) and l.extent > 1]
        self.set("reduce_extent", _log(math.prod(l.extent for l in reduce_loops))
                 if reduce_loops else 0.0)

        vec = next((l for l in reversed(loops) if l.kind == "vectorized"), None)
        vec_inner = vec is not None and loops[-1] is vec
        bufs = []
        for accs in by_buf.values():
            a0 = accs[0]
            buf = a0.buffer
            item = max(1, dt.itemsize(buf.dtype))
            elems = _buffer_elems(buf, self.env)
            irregular = any(a.irregular for a in accs)
            coeffs, caps = a0.coeffs, a0.caps
            uniq, ulines = _footprint(coeffs, caps, loops, elems, item)
            inner = loops[-1] if loops else None
            inner_stride = abs(coeffs.get(id(inner.var), 0.0)) if inner else 0.0
            nz = [abs(c) for c in coeffs.values() if c]
            # dynamic lines: one pass of the innermost loop touches few lines when contiguous
            if inner is not None and inner.extent > 1 and inner_stride > 0:
                per_pass = (inner.extent if inner_stride * item >= CACHE_LINE else
                            max(1.0, math.ceil(inner.extent * inner_stride * item / CACHE_LINE)))
                lines = trip / inner.extent * per_pass
            else:
                lines = trip
            n_acc = len(accs)
            reads = any(not a.is_write for a in accs)
            writes = any(a.is_write for a in accs)
            # reuse: the innermost loop whose var the index does not use
            reuse_kind, dis_iter, dis_bytes_loops, reuse_ct = "none", 0.0, None, 0.0
            if not irregular:
                for k in range(len(loops) - 1, -1, -1):
                    l = loops[k]
                    if id(l.var) not in coeffs and l.extent > 1:
                        reuse_kind = "loop"
                        inner_loops = loops[k + 1:]
                        dis_iter = math.prod(x.extent for x in inner_loops) if inner_loops \
                            else 1.0
                        dis_bytes_loops = inner_loops
                        reuse_ct = l.extent
                        break
            if reuse_kind == "none" and n_acc > 1:
                reuse_kind, dis_iter, dis_bytes_loops, reuse_ct = "serial", 1.0, [], n_acc - 1
            contig = True
            if vec is not None:
                cvec = abs(coeffs.get(id(vec.var), 0.0))
                contig = not irregular and cvec in (0.0, 1.0)
            bufs.append(dict(buf=buf, item=item, reads=reads, writes=writes,
                             bytes=trip * item * n_acc, uniq=uniq * item, lines=lines * n_acc,
                             ulines=ulines, reuse=reuse_kind, dis_iter=dis_iter,
                             dis_loops=dis_bytes_loops, reuse_ct=reuse_ct,
                             inner_stride=inner_stride, min_stride=min(nz) if nz else 0.0,
                             contig=contig, irregular=irregular, coeffs=coeffs, caps=caps,
                             elems=elems, n_acc=n_acc, local=buf.scope == "local"))

        def footprint_bytes(sub_loops):
            return sum(_footprint(b["coeffs"], b["caps"], sub_loops, b["elems"], b["item"])[0]
                       * b["item"] for b in bufs)

        bufs.sort(key=lambda b: (-b["bytes"], b["buf"].name))
        for s, b in enumerate(bufs[:NUM_BUFFER_SLOTS]):
            p = f"buf{s}_"
            self.set(p + "read", float(b["reads"] and not b["writes"]))
            self.set(p + "write", float(b["writes"] and not b["reads"]))
            self.set(p + "readwrite", float(b["reads"] and b["writes"]))
            self.set(p + "bytes", _log(b["bytes"]))
            self.set(p + "unique_bytes", _log(b["uniq"]))
            self.set(p + "lines", _log(b["lines"]))
            self.set(p + "unique_lines", _log(b["ulines"]))
            self.set(p + "reuse_loop", float(b["reuse"] == "loop"))
            self.set(p + "reuse_serial", float(b["reuse"] == "serial"))
            self.set(p + "reuse_none", float(b["reuse"] == "none"))
            if b["reuse"] != "none":
                self.set(p + "reuse_dis_iter", _log(b["dis_iter"]))
                self.set(p + "reuse_dis_bytes", _log(footprint_bytes(b["dis_loops"])))
                self.set(p + "reuse_ct", _log(b["reuse_ct"]))
            ct = max(b["reuse_ct"], 1.0)
            self.set(p + "bytes_d_reuse", _log(b["bytes"] / ct))
            self.set(p + "unique_bytes_d_reuse", _log(b["uniq"] / ct))
            self.set(p + "lines_d_reuse", _log(b["lines"] / ct))
            self.set(p + "inner_stride", _log(b["inner_stride"]))
            self.set(p + "min_stride", _log(b["min_stride"]))
            self.set(p + "vector_contig", float(b["contig"]))
            self.set(p + "irregular", float(b["irregular"]))
            self.set(p + "scope_local", float(b["local"]))

        # -- arithmetic intensity and working sets per loop level (level 0: inside all loops)
        n = len(loops)
        ws = [footprint_bytes(loops[n - k:]) if k else footprint_bytes([])
              for k in range(n + 1)]
        inner_trips = [math.prod(l.extent for l in loops[n - k:]) if k else 1.0
                       for k in range(n + 1)]
        intensity = [float_ops * it / max(w, 1.0) for it, w in zip(inner_trips, ws)]
        for k in range(INTENSITY_POINTS):
            pos = k * n / (INTENSITY_POINTS - 1) if INTENSITY_POINTS > 1 else n
            lo = int(math.floor(pos))
            hi = min(lo + 1, n)
            frac = pos - lo
            val = intensity[lo] * (1 - frac) + intensity[hi] * frac
            self.set(f"intensity_{k}", _log(val))
        self.set("ws_innermost", _log(ws[1] if n else ws[0]))
        self.set("ws_register_block", _log(ws[len(block)]))
        self.set("ws_level_l1", float(sum(1 for w in ws[1:] if w <= m.l1_bytes)))
        self.set("ws_level_l2", float(sum(1 for w in ws[1:] if w <= m.l2_bytes)))
        self.set("ws_total", _log(ws[n]))

        # -- the allocation written
        if info.alloc is not None:
            abuf, depth = info.alloc
            abytes = _buffer_elems(abuf, self.env) * dt.itemsize(abuf.dtype)
            self.set("alloc_bytes", _log(abytes))
            self.set("alloc_local", float(abuf.scope == "local"))
            self.set("alloc_shared", float(abuf.scope == "shared"))
            self.set("alloc_outer_prod", _log(math.prod(l.extent for l in loops[:depth])))
            self.set("alloc_inner_prod", _log(math.prod(l.extent for l in loops[depth:])))

        # -- the analytic model
        est = self._analytic(trip, float_ops, loops, block, block_trip, bufs, ws, inner_trips,
                             vec, vec_inner, is_acc, write)
        return self.row, est

    def _analytic(self, trip, float_ops, loops, block, block_trip, bufs, ws, inner_trips, vec,
                  vec_inner, is_acc, write) -> float:
        """Cycles of the store on ``self.m``; also sets the ``est_*`` columns."""
        m = self.m
        info = self.info
        cv = info.counts.values
        n = len(loops)
        # cores: parallel loops around the store, balanced over the cores
        par_kinds = ("parallel", "thread_binding") if m.gpu else ("parallel",)
        par = max(math.prod(l.extent for l in loops if l.kind in par_kinds) *
                  info.par_fraction, 1.0)
        cores = min(par / math.ceil(par / m.cores) if par > 1 else 1.0, float(m.cores))
        bits = dt.bits(info.store.buffer.dtype) or 32
        hw_lanes = max(1.0, m.vector_bits / bits)
        instr = (cv.get("float_mad", 0) + cv.get("float_addsub", 0) + cv.get("float_mul", 0) +
                 cv.get("float_cmp", 0) + cv.get("float_minmax", 0) +
                 cv.get("float_other_func", 0) + 0.25 * cv.get("select_op", 0) +
                 8.0 * cv.get("float_divmod", 0) + _MATH_COST * cv.get("float_math_func", 0) +
                 0.5 * cv.get("cast_op", 0))
        if not dt.is_float(info.store.buffer.dtype):
            instr += 0.5 * (cv.get("int_mad", 0) + cv.get("int_addsub", 0) +
                            cv.get("int_mul", 0) + cv.get("int_minmax", 0))
        instr = max(instr, 0.25)
        # the register block as LLVM runs it: small constant serial loops inside it are fully
        # unrolled, and with no explicit vector loop the next loop out is vectorized by LLVM
        # when every access walks it contiguously or not at all and it is not a reduction
        body_cost = instr + len(info.accesses) + 1.0
        k = n - 1
        eff: list[tuple[_Loop, float]] = []   # (loop, extent inside the block)
        while k >= 0:
            l = loops[k]
            if l.kind in ("unrolled", "vectorized") or \
                    (l.kind == "serial" and l.extent * body_cost <= 256 and l.extent <= 32):
                eff.append((l, l.extent))
                body_cost *= max(l.extent, 1.0) / (hw_lanes if l.kind == "vectorized" else 1.0)
                k -= 1
                continue
            break
        vloop = next((l for l, _ in eff if l.kind == "vectorized"), None)
        lanes = 1.0
        if vloop is not None:
            contig = all(not b["irregular"] and abs(b["coeffs"].get(id(vloop.var), 0.0))
                         in (0.0, 1.0) for b in bufs)
            lanes = min(vloop.extent, hw_lanes) / (1.0 if contig else 2.0)
        elif k >= 0 and loops[k].kind == "serial" and loops[k].extent >= 2:
            l = loops[k]
            walks = [abs(b["coeffs"].get(id(l.var), 0.0)) for b in bufs]
            if all(not b["irregular"] for b in bufs) and all(w in (0.0, 1.0) for w in walks) \
                    and write.coeffs.get(id(l.var), 0.0) == 1.0:
                lanes = min(l.extent, hw_lanes)
                vloop = l
                eff.append((l, lanes))
        lanes = max(lanes, 1.0)
        block_loops = [_Loop(l.var, e, l.kind, l.thread_tag, 0.0) for l, e in eff]
        block_trip = math.prod(e for _, e in eff) if eff else 1.0
        runs = trip / max(block_trip, 1.0)
        compute = trip * instr / lanes / m.fma_units / cores
        # a reduction's dependence chains: independent accumulators inside the reduce loop
        latency = 0.0
        red = next((j for j in range(n - 1, -1, -1)
                    if id(loops[j].var) not in write.coeffs and loops[j].extent > 1), None)
        if is_acc and dt.is_float(info.store.buffer.dtype) and red is not None:
            inside = math.prod(l.extent for l in loops[red + 1:])
            indep = min(max(inside / lanes, 1.0), 16.0)
            latency = trip / (indep * lanes) * max(indep / m.fma_units, m.fma_latency) / cores
        # load / store instructions: per run of the register block, its distinct vectors
        mem_instr = 0.0
        acc_vectors = 0.0
        for b in bufs:
            uniq, _ = _footprint(b["coeffs"], b["caps"], block_loops, b["elems"], b["item"])
            walk = abs(b["coeffs"].get(id(vloop.var), 0.0)) if vloop is not None else None
            per_block = uniq / lanes if walk == 1.0 else uniq
            if b["irregular"]:
                per_block = block_trip
            # rows a power-of-two stride apart share few L1 sets: conflict misses
            rows, stride = 1.0, 0
            for l in block_loops:
                c = abs(b["coeffs"].get(id(l.var), 0.0)) * b["item"]
                if c >= 512 and float(c).is_integer():
                    rows *= l.extent
                    stride = math.gcd(stride, int(c))
            if rows > 1 and stride:
                sets = 4096 // math.gcd(stride, 4096)
                if rows > 8 * sets:
                    per_block *= 4.0
            b["per_block"] = per_block * b["n_acc"]
            if b["buf"] is write.buffer and is_acc:
                acc_vectors += per_block
            mem_instr += b["per_block"]
        outside = loops[n - len(eff) - 1] if n > len(eff) else None
        # the accumulators share the register file with the operands of the update (a
        # broadcast, a vector of the other input, an address or two)
        acc_regs = max(m.vector_registers - 4, 1)
        if is_acc and outside is not None and id(outside.var) not in write.coeffs and \
                acc_vectors <= acc_regs:
            # accumulators invariant in the loop around the register block stay in registers
            # (fully for a local buffer, which the code generator promotes; half otherwise)
            wb = next(b for b in bufs if b["buf"] is write.buffer)
            mem_instr -= wb["per_block"] * (1.0 if wb["local"] else 0.5)
        if acc_vectors > acc_regs:   # the tile does not fit in registers: spills
            mem_instr *= 1.0 + 0.5 * math.log2(acc_vectors / acc_regs)
        l1 = runs * mem_instr / m.loads_per_cycle / cores

        # cache traffic: the outermost loop level whose working set fits is loaded once per
        # iteration of the loops outside it, except that a buffer the next loop out does not
        # index stays cached across that loop
        def traffic(cache: float) -> float:
            kstar = next((k for k in range(n, -1, -1) if ws[k] <= cache), None)
            if kstar is None:
                return sum(b["bytes"] for b in bufs)
            if kstar == n:
                return ws[n] * min(1.0, info.guard_fraction * 2)
            inner = loops[n - kstar:]
            total = 0.0
            for b in bufs:
                fb = _footprint(b["coeffs"], b["caps"], inner, b["elems"], b["item"])[0]
                mult = 1.0
                for j in range(kstar + 1, n + 1):
                    l = loops[n - j]
                    if j > kstar + 1 or id(l.var) in b["coeffs"]:
                        mult *= max(l.extent, 1.0)
                total += fb * b["item"] * mult
            return total * info.guard_fraction

        l2 = traffic(m.l1_bytes) / m.l2_bw / cores
        l3 = traffic(m.l2_bytes) / m.l3_bw / cores
        dram = traffic(m.l3_bytes) / m.dram_bw
        # a guard is tested once per iteration of the loops down to the innermost one it
        # depends on (LLVM hoists it out of the others; in unrolled loops it folds away); a
        # guard on the vector loop masks lanes, so the vector instructions are issued anyway
        overhead = runs * 1.0 / cores
        outer = 1.0
        for depth, frac, vids in info.guards:
            last = max((j for j in range(depth) if id(loops[j].var) in vids), default=-1)
            tests = math.prod(math.ceil(l.extent / hw_lanes) if l.kind == "vectorized"
                              else l.extent for l in loops[:last + 1] if l.kind != "unrolled")
            overhead += 2.0 * tests * outer / cores
            outer *= frac
        vid = id(vloop.var) if vloop is not None else None
        inside = math.prod(f for d, f, vids in info.guards if vid in vids)
        if inside < 1.0:
            issued = 1.0 / max(inside, 1e-9)
            compute *= issued
            latency *= issued
            l1 *= issued
        launches = 0.0
        for j, l in enumerate(loops):
            if l.kind == "parallel":
                launches = max(1.0, math.prod(x.extent for x in loops[:j]))
                break
        overhead += launches * m.parallel_launch
        est = max(compute, latency, l1, l2, l3, dram) + overhead
        if m.gpu:
            est *= _gpu_factor(loops, acc_vectors if is_acc else 0.0)
        for name, v in (("est_compute", compute), ("est_latency", latency), ("est_l1", l1),
                        ("est_l2", l2), ("est_l3", l3), ("est_dram", dram),
                        ("est_overhead", overhead), ("est_cycles", est),
                        ("est_lanes", lanes), ("est_register_block", block_trip)):
            self.set(name, _log(v))
        return est


# GPU terms of the analytic model: accumulators a thread keeps in registers before they spill
# to local memory (255 32-bit registers on NVIDIA, some for addresses and operands), and the
# threads per block below which a block cannot hide the latency of its shared-memory loads
GPU_ACC_REGISTERS = 128
GPU_MIN_THREADS = 64


def _gpu_factor(loops, accumulators: float) -> float:
    """How much slower than the CPU-style estimate a GPU store runs: spilled accumulators
    (every update then goes through local memory: the fourth power puts a 16 x 16 register tile
    at the 3.6x of the 16 x 8 one measured on the H200, where the CPU-style terms alone rank
    it faster) and small blocks."""
    factor = 1.0
    if accumulators > GPU_ACC_REGISTERS:
        factor *= (accumulators / GPU_ACC_REGISTERS) ** 4
    threads = math.prod(l.extent for l in loops if l.kind == "thread_binding" and
                        l.thread_tag and l.thread_tag.startswith("threadIdx"))
    if 0 < threads < GPU_MIN_THREADS:
        factor *= GPU_MIN_THREADS / threads
    return factor


# ---------------------------------------------------------------------------------------------


class PerStoreFeature:
    """Per-store features of lowered functions (see the module docstring for the columns).

    Parameters
    ----------
    target : Target | str, optional
        The machine the analytic columns model (cores, vector width, caches); the host when
        None.
    shape_vars : dict[str, int], optional
        Values of symbolic dims (by name) the features are computed at; others count as
        ``DEFAULT_SYMBOLIC_EXTENT``.

    Examples
    --------
    >>> from tilecraft.tensorir import te
    >>> A = te.placeholder((128,), "float32", "A")
    >>> B = te.compute((128,), lambda i: te.exp(A[i]), "B")
    >>> row = PerStoreFeature().extract([te.create_prim_func([A, B])])[0][0]
    >>> row[FEATURE_NAMES.index("float_math_func")]   # log2(1 + 128)
    7.0112...
    """

    feature_names = FEATURE_NAMES

    def __init__(self, target: Target | str | None = None,
                 shape_vars: Mapping[str, int] | None = None):
        self.target = target if isinstance(target, Target) or target is None else Target(target)
        self.machine = MachineModel.for_target(self.target)
        self.shape_vars = dict(shape_vars or {})

    @property
    def num_features(self) -> int:
        return NUM_FEATURES

    def extract(self, funcs: Sequence[PrimFunc | IRModule],
                shape_vars: Mapping[str, int] | None = None) -> list[np.ndarray]:
        """One ``(n_stores, NUM_FEATURES)`` float32 array per function (unlowered functions
        are lowered first; a function without stores gives one all-zero row)."""
        sv = dict(self.shape_vars)
        sv.update(shape_vars or {})
        return [self.extract_one(f, sv) for f in funcs]

    def extract_one(self, func: PrimFunc | IRModule,
                    shape_vars: Mapping[str, int] | None = None) -> np.ndarray:
        if isinstance(func, IRModule):
            prims = [f for f in func.functions.values() if isinstance(f, PrimFunc)]
            if len(prims) != 1:
                raise ValueError(f"PerStoreFeature: expected a module of one PrimFunc, got "
                                 f"{len(prims)}")
            func = prims[0]
        if not isinstance(func, PrimFunc):
            raise TypeError(f"PerStoreFeature.extract takes PrimFuncs, got "
                            f"{type(func).__name__}")
        if "arg_buffers" not in func.attr_dict:
            func = lower(func)
        env = _Env(shape_vars if shape_vars is not None else self.shape_vars)
        col = _Collector(env)
        col.visit(func.body)
        if not col.stores:
            return np.zeros((1, NUM_FEATURES), dtype=np.float32)
        rows, ests = [], []
        func_ops = 0.0
        for info in col.stores:
            row, est = _StoreFeatures(info, env, self.machine).compute()
            rows.append(row)
            ests.append(est)
            cv = info.counts.values
            trip = info.guard_fraction * math.prod(max(l.extent, 0.0) for l in info.loops)
            func_ops += trip * (2 * cv.get("float_mad", 0) + cv.get("float_addsub", 0) +
                                cv.get("float_mul", 0) + cv.get("float_divmod", 0) +
                                cv.get("float_math_func", 0))
        out = np.stack(rows)
        allocs = 0.0
        for buf, _ in col.allocs.values():
            allocs += _buffer_elems(buf, env) * dt.itemsize(buf.dtype)
        nests = len(func.body.seq) if isinstance(func.body, SeqStmt) else 1
        out[:, _INDEX["func_float_ops"]] = _log(func_ops)
        out[:, _INDEX["func_num_stores"]] = len(col.stores)
        out[:, _INDEX["func_num_loops"]] = col.num_loops
        out[:, _INDEX["func_num_nests"]] = nests
        out[:, _INDEX["func_alloc_bytes"]] = _log(allocs)
        out[:, _INDEX["func_max_parallel"]] = _log(col.max_parallel)
        out[:, _INDEX["func_est_cycles"]] = _log(sum(ests))
        return out.astype(np.float32)


def count_flop(func: PrimFunc | IRModule, shape_vars: Mapping[str, int] | None = None) -> float:
    """Floating-point operations of one call of ``func`` (a multiply-add counts 2, an
    intrinsic 1), its symbolic dims at ``shape_vars``; integer operations when it has no float
    ones (so that a GFLOP/s figure of an integer kernel reads as GOP/s).

    Examples
    --------
    >>> from tilecraft.tensorir import te
    >>> A = te.placeholder((8, 4), "float32", "A")
    >>> k = te.reduce_axis((0, 4), "k")
    >>> B = te.compute((8,), lambda i: te.sum(A[i, k] * A[i, k], axis=k), "B")
    >>> count_flop(te.create_prim_func([A, B]))
    64.0
    """
    if isinstance(func, IRModule):
        prims = [f for f in func.functions.values() if isinstance(f, PrimFunc)]
        if len(prims) != 1:
            raise ValueError(f"count_flop: expected a module of one PrimFunc, got {len(prims)}")
        func = prims[0]
    if "arg_buffers" not in func.attr_dict:
        func = lower(func)
    env = _Env(shape_vars or {})
    col = _Collector(env)
    col.visit(func.body)
    flops = ints = 0.0
    for info in col.stores:
        cv = info.counts.values
        trip = info.guard_fraction * math.prod(max(l.extent, 0.0) for l in info.loops)
        flops += trip * (2 * cv.get("float_mad", 0) + cv.get("float_addsub", 0) +
                         cv.get("float_mul", 0) + cv.get("float_divmod", 0) +
                         cv.get("float_math_func", 0) + cv.get("float_minmax", 0) +
                         cv.get("float_other_func", 0))
        if not dt.is_float(info.store.buffer.dtype):
            ints += trip * (2 * cv.get("int_mad", 0) + cv.get("int_addsub", 0) +
                            cv.get("int_mul", 0) + cv.get("int_minmax", 0))
    return float(round(flops if flops > 0 else ints))


def analytic_cost(features: np.ndarray) -> float:
    """The analytic model's estimated cycles of one function from its feature rows (the sum of
    the stores' ``est_cycles``): lower is faster."""
    col = features[:, _INDEX["est_cycles"]].astype(np.float64)
    return float(np.sum(np.exp2(col) - 1.0))


__all__ = ["PerStoreFeature", "FEATURE_NAMES", "FEATURE_DOCS", "NUM_FEATURES", "MachineModel",
           "analytic_cost", "count_flop", "describe_features", "DEFAULT_SYMBOLIC_EXTENT"]
