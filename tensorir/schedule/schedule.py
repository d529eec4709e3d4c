"""``Schedule``: transformations of a PrimFunc's blocks and loops, each checked and traced.

A schedule holds the function being transformed and hands out *random variables* that stand for
its blocks (``BlockRV``), loops (``LoopRV``) and sampled integers (``ExprRV``). Every primitive call
is recorded in ``sch.trace``; replaying the trace on the original function gives the same program.
An illegal request raises ``ScheduleError`` and leaves the schedule unchanged (primitives compute
a new function and only then install it).

Examples
--------
>>> from tilecraft.tensorir import te, Schedule
>>> A = te.placeholder((128, 128), "float32", "A")
>>> B = te.compute((128, 128), lambda i, j: A[i, j] * 2.0, "B")
>>> sch = Schedule(te.create_prim_func([A, B]))
>>> i, j = sch.get_loops(sch.get_block("B"))
>>> jo, ji = sch.split(j, [None, 16])
>>> sch.vectorize(ji)
>>> sch.parallel(i)

The trace is replayable data: ``sch.trace.to_json()`` gives plain data, and
``Trace.from_json(data).apply(func)`` replays it on the original function and returns a new
Schedule (the two classes make each other, so they share this module). Replacing a decision
(``trace.with_decision(i, d)``) replays with the new choice: this is how the tuner's mutators
explore. ``trace.with_decisions_dropped()`` makes the sampling instructions draw again when
replayed (a fresh sample of the same design space), and ``trace.without_postproc()`` cuts the
trace at the ``enter_postproc`` mark.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..expr import IntImm, PrimExpr, Var
from ..function import IRModule, PrimFunc, as_module
from ..stmt import Block, BlockRealize, For
from . import tree
from .error import ScheduleError
from .primitives_compute import ComputeLocationPrimitives
from .primitives_loop import LoopPrimitives
from .primitives_memory import MemoryPrimitives
from .primitives_reduction import ReductionPrimitives
from .primitives_tensorize import TensorizePrimitives
from .sampling import SamplingPrimitives
from .templates import TemplatePrimitives
from .index_map import IndexMap
from .rv import BlockRV, ExprRV, Instruction, LoopRV, _RV, traced

TRACE_VERSION = 1


class Schedule(LoopPrimitives, ComputeLocationPrimitives, MemoryPrimitives, ReductionPrimitives,
               TensorizePrimitives, SamplingPrimitives, TemplatePrimitives):
    """Schedule a PrimFunc (or the function ``func_name`` of an IRModule).

    Parameters
    ----------
    func_or_mod : PrimFunc | IRModule
    seed : int, optional
        Seeds the sampling primitives (``sample_perfect_tile`` ...); the same seed draws the same.
    func_name : str, optional
        Which function of a module to work on (default: ``main`` or the only one).
    """

    def __init__(self, func_or_mod: PrimFunc | IRModule, seed: int | None = None,
                 func_name: str | None = None):
        mod = as_module(func_or_mod)
        if func_name is None:
            func_name = "main" if "main" in mod else (next(iter(mod.functions)) if len(mod) == 1
                                                      else None)
        if func_name is None or func_name not in mod:
            raise ScheduleError("Schedule", f"no function {func_name!r} in the module "
                                f"(it has {sorted(mod.functions)})")
        if not isinstance(mod[func_name], PrimFunc):
            raise ScheduleError("Schedule", f"{func_name} is not a PrimFunc")
        self._mod = mod
        self._func_name = func_name
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self.trace = Trace()
        self._targets: dict[str, tuple] = {}  # RV name -> (RV, block name | loop Var | int)
        self._counter = 0
        self._depth = 0
        self._decision = None

    # -- state ----------------------------------------------------------------------------------
    @property
    def mod(self) -> IRModule:
        """The scheduled module."""
        return self._mod

    @property
    def func(self) -> PrimFunc:
        """The function being scheduled."""
        return self._mod[self._func_name]

    def _set_func(self, func: PrimFunc) -> None:
        self._mod = self._mod.with_function(self._func_name, func)

    def script(self) -> str:
        return self.func.script()

    def show(self) -> None:
        print(self.script())

    def copy(self) -> "Schedule":
        """An independent schedule in the same state (its RNG forked from this one's)."""
        other = Schedule.__new__(Schedule)
        other._mod = self._mod
        other._func_name = self._func_name
        other._seed = None
        other._rng = np.random.default_rng(self._rng.integers(0, 2**63 - 1))
        other.trace = Trace([Instruction(i.kind, list(i.inputs), dict(i.attrs), list(i.outputs),
                                         i.decision) for i in self.trace.instructions])
        other._targets = dict(self._targets)
        other._counter = self._counter
        other._depth = 0
        other._decision = None
        return other

    def seed(self, seed: int) -> None:
        """Reseed the sampling RNG."""
        self._rng = np.random.default_rng(seed)

    # -- random variables -------------------------------------------------------------------------
    def _new_rv(self, cls, target) -> _RV:
        rv = cls(f"{cls.prefix}{self._counter}")
        self._counter += 1
        self._targets[rv.name] = (rv, target)
        return rv

    def _block_rv(self, name: str) -> BlockRV:
        return self._new_rv(BlockRV, name)

    def _loop_rv(self, var: Var) -> LoopRV:
        return self._new_rv(LoopRV, var)

    def _expr_rv(self, value: int) -> ExprRV:
        return self._new_rv(ExprRV, int(value))

    def _location_rv(self, kind: str) -> LoopRV:
        """A LoopRV for a sampled compute location that is no loop: "root" or "inline"."""
        return self._new_rv(LoopRV, _Location(kind))

    def _special_location(self, rv, primitive: str) -> str | None:
        """"root" / "inline" if ``rv`` is such a location RV, else None."""
        if isinstance(rv, LoopRV):
            target = self._target_of(rv, primitive)
            if isinstance(target, _Location):
                return target.kind
        return None

    def _target_of(self, rv: _RV, primitive: str):
        # the RV object itself must be the one this schedule (or the one it was copied from) made:
        # another schedule's RV of the same name would otherwise resolve to a different loop
        entry = self._targets.get(getattr(rv, "name", None))
        if entry is None or entry[0] is not rv:
            raise ScheduleError(primitive, f"{rv!r} does not belong to this schedule")
        return entry[1]

    def get(self, rv):
        """What an RV stands for now: a Block, a For, or an int."""
        if isinstance(rv, BlockRV):
            return self._block(rv, "get")[0].block
        if isinstance(rv, LoopRV):
            return self._loop(rv, "get")[0]
        if isinstance(rv, ExprRV):
            return self._target_of(rv, "get")
        raise TypeError(f"not a random variable: {rv!r}")

    def _block(self, rv: BlockRV, primitive: str) -> tuple[BlockRealize, tuple]:
        """The BlockRealize an RV names, and its ancestors."""
        if not isinstance(rv, BlockRV):
            raise ScheduleError(primitive, f"expected a block, got {rv!r}")
        name = self._target_of(rv, primitive)
        try:
            return tree.find_block(self.func, name)
        except KeyError:
            raise ScheduleError(primitive, f"block {name!r} no longer exists (an earlier "
                                f"primitive removed or replaced it)") from None
        except ValueError as err:
            raise ScheduleError(primitive, str(err)) from None

    def _loop(self, rv: LoopRV, primitive: str) -> tuple[For, tuple]:
        """The For an RV names, and its ancestors."""
        if not isinstance(rv, LoopRV):
            raise ScheduleError(primitive, f"expected a loop, got {rv!r}")
        var = self._target_of(rv, primitive)
        if isinstance(var, _Location):
            raise ScheduleError(primitive, f"{rv.name} is the {var.kind!r} compute location, not "
                                f"a loop; only compute_at / reverse_compute_at accept it")
        try:
            return tree.find_loop(self.func, var)
        except KeyError:
            raise ScheduleError(primitive, f"loop {var.name} ({rv.name}) no longer exists (an "
                                f"earlier primitive such as split or fuse replaced it)") from None

    def _int(self, value, primitive: str):
        """An int, ExprRV or PrimExpr argument as an int or PrimExpr."""
        if isinstance(value, ExprRV):
            return self._target_of(value, primitive)
        if isinstance(value, IntImm):
            return value.value
        return value

    # -- trace encoding -----------------------------------------------------------------------------
    def _encode(self, value, primitive: str):
        if isinstance(value, _RV):
            self._target_of(value, primitive)
            return "$" + value.name
        if isinstance(value, (list, tuple)):
            return [self._encode(v, primitive) for v in value]
        if isinstance(value, IntImm):
            return value.value
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, str):
            if value.startswith("$"):
                raise ScheduleError(primitive, f"string arguments may not start with '$': {value!r}")
            return value
        if isinstance(value, dict):
            return {str(k): self._encode(v, primitive) for k, v in value.items()}
        if hasattr(value, "to_json"):
            return {"__" + type(value).__name__: value.to_json()}
        if isinstance(value, PrimExpr):
            raise ScheduleError(primitive, f"the symbolic argument {value!r} cannot be recorded "
                                f"in a trace; pass an int or None")
        raise ScheduleError(primitive, f"argument {value!r} of type {type(value).__name__} cannot "
                            f"be recorded in a trace")

    def _decode(self, value, names: dict[str, _RV]):
        if isinstance(value, str) and value.startswith("$"):
            try:
                return names[value[1:]]
            except KeyError:
                raise ValueError(f"trace refers to {value[1:]} before it is defined") from None
        if isinstance(value, list):
            return [self._decode(v, names) for v in value]
        if isinstance(value, dict):
            if len(value) == 1:
                (k, v), = value.items()
                if k.startswith("__"):
                    return _decode_object(k[2:], v)
            return {k: self._decode(v, names) for k, v in value.items()}
        return value

    def replay(self, trace: Trace) -> None:
        """Apply every instruction of ``trace`` (made on the same original function) here."""
        names: dict[str, _RV] = {}
        for idx, inst in enumerate(trace.instructions):
            method = getattr(type(self), inst.kind, None)
            if method is None or not getattr(method, "traced", False):
                raise ValueError(f"trace instruction {idx}: unknown primitive {inst.kind!r}")
            args = [self._decode(v, names) for v in inst.inputs]
            kwargs = {}
            if inst.decision is not None:
                kwargs["decision"] = inst.decision
            result = getattr(self, inst.kind)(*args, **kwargs)
            if isinstance(result, _RV):
                result = [result]
            if not isinstance(result, (list, tuple)):
                result = []
            if len(result) != len(inst.outputs):
                raise ValueError(f"trace instruction {idx} ({inst.kind}) gave {len(result)} "
                                 f"outputs, the trace recorded {len(inst.outputs)}")
            for name, rv in zip(inst.outputs, result):
                names[name] = rv

    # -- queries ------------------------------------------------------------------------------------
    @traced
    def get_block(self, name: str, func_name: str | None = None) -> BlockRV:
        """The block called ``name``.

        Examples
        --------
        >>> b = sch.get_block("C")            # doctest: +SKIP
        """
        if func_name is not None and func_name != self._func_name:
            raise ScheduleError("get_block", f"this schedule works on {self._func_name!r}, "
                                f"not {func_name!r}")
        try:
            tree.find_block(self.func, name)
        except KeyError:
            names = sorted(br.block.name for br in tree.all_blocks(self.func))
            raise ScheduleError("get_block", f"no block named {name!r}; blocks: {names}") from None
        except ValueError as err:
            raise ScheduleError("get_block", str(err)) from None
        return self._block_rv(name)

    @traced
    def get_loops(self, block: BlockRV) -> list[LoopRV]:
        """The loops around ``block`` (up to its enclosing block), outermost first."""
        _, ancestors = self._block(block, "get_loops")
        return [self._loop_rv(f.loop_var) for f in tree.loops_between(ancestors)]

    @traced
    def get_child_blocks(self, block_or_loop) -> list[BlockRV]:
        """The blocks directly inside a block or loop (not nested in another block)."""
        if isinstance(block_or_loop, BlockRV):
            node = self._block(block_or_loop, "get_child_blocks")[0]
        else:
            node = self._loop(block_or_loop, "get_child_blocks")[0]
        return [self._block_rv(br.block.name) for br in tree.child_block_realizes(node)]

    @traced
    def get_producers(self, block: BlockRV) -> list[BlockRV]:
        """Blocks of the same scope, before ``block``, that write a buffer it reads."""
        return [self._block_rv(n) for n in self._neighbours(block, "get_producers", before=True)]

    @traced
    def get_consumers(self, block: BlockRV) -> list[BlockRV]:
        """Blocks of the same scope, after ``block``, that read a buffer it writes."""
        return [self._block_rv(n) for n in self._neighbours(block, "get_consumers", before=False)]

    def _neighbours(self, block: BlockRV, primitive: str, before: bool) -> list[str]:
        br, ancestors = self._block(block, primitive)
        scope = tree.enclosing_block(ancestors)
        siblings = tree.child_block_realizes(scope) if scope is not None else [br]
        idx = next(i for i, s in enumerate(siblings) if s is br)
        me = br.block
        if before:
            mine = {id(r.buffer) for r in me.reads}
            return [s.block.name for s in siblings[:idx]
                    if any(id(w.buffer) in mine for w in s.block.writes)]
        mine = {id(w.buffer) for w in me.writes}
        return [s.block.name for s in siblings[idx + 1:]
                if any(id(r.buffer) in mine for r in s.block.reads)]

    def get_root(self) -> Block:
        return self.func.body.block if isinstance(self.func.body, BlockRealize) else None


class _Location:
    """What a location LoopRV stands for: the root (stay) or inline."""
    __slots__ = ("kind",)

    def __init__(self, kind: str):
        self.kind = kind


def _decode_object(type_name: str, data):
    if type_name == "IndexMap":
        return IndexMap.from_json(data)
    raise ValueError(f"trace holds an object of unknown type {type_name!r}")


# ---------------------------------------------------------------------------------------------
# the trace


@dataclass
class Trace:
    instructions: list[Instruction] = field(default_factory=list)

    def __len__(self):
        return len(self.instructions)

    def __iter__(self):
        return iter(self.instructions)

    def to_json(self) -> dict:
        """Plain JSON data (dicts, lists, strings, numbers)."""
        return {"version": TRACE_VERSION, "instructions": [i.to_json() for i in self.instructions]}

    @staticmethod
    def from_json(data) -> "Trace":
        if isinstance(data, dict):
            version = data.get("version")
            if version != TRACE_VERSION:
                raise ValueError(f"trace version {version!r} is not supported "
                                 f"(this tilecraft reads version {TRACE_VERSION})")
            data = data.get("instructions")
        if not isinstance(data, list):
            raise ValueError("a trace is a list of instructions")
        return Trace([Instruction.from_json(i) for i in data])

    @property
    def decisions(self) -> dict[int, Any]:
        """Index of each sampling instruction -> its decision."""
        return {i: inst.decision for i, inst in enumerate(self.instructions)
                if inst.decision is not None}

    def with_decision(self, index: int, decision) -> "Trace":
        """A copy with instruction ``index``'s decision replaced."""
        t = Trace(copy.deepcopy(self.instructions))
        if t.instructions[index].decision is None:
            raise ValueError(f"instruction {index} ({t.instructions[index].kind}) makes no decision")
        t.instructions[index].decision = copy.deepcopy(decision)
        return t

    def with_decisions_dropped(self, indices=None) -> "Trace":
        """A copy whose sampling instructions (all, or those at ``indices``) have no decision:
        replaying it draws them again from the schedule's seeded RNG.

        Examples
        --------
        >>> fresh = sch.trace.with_decisions_dropped()               # doctest: +SKIP
        >>> other = fresh.apply(func, seed=7)                        # doctest: +SKIP
        """
        t = Trace(copy.deepcopy(self.instructions))
        chosen = None if indices is None else {int(i) for i in indices}
        for i, inst in enumerate(t.instructions):
            if chosen is None or i in chosen:
                inst.decision = None
        return t

    @property
    def postproc_index(self) -> int | None:
        """Index of the first ``enter_postproc`` instruction, or None."""
        for i, inst in enumerate(self.instructions):
            if inst.kind == "enter_postproc":
                return i
        return None

    def without_postproc(self) -> "Trace":
        """A copy of the instructions before the first ``enter_postproc`` mark (all of them if
        there is none)."""
        end = self.postproc_index
        insts = self.instructions if end is None else self.instructions[:end]
        return Trace(copy.deepcopy(insts))

    def apply(self, func_or_mod, seed: int | None = None, func_name: str | None = None):
        """Replay on ``func_or_mod`` (the original, unscheduled function): a new Schedule."""
        sch = Schedule(func_or_mod, seed=seed, func_name=func_name)
        sch.replay(self)
        return sch

    def __str__(self):
        lines = []
        for inst in self.instructions:
            outs = ", ".join(inst.outputs)
            args = ", ".join(_show(x) for x in inst.inputs)
            kw = ", ".join(f"{k}={v!r}" for k, v in inst.attrs.items() if k != "ret")
            dec = f", decision={inst.decision!r}" if inst.decision is not None else ""
            call = f"sch.{inst.kind}({', '.join(x for x in (args, kw) if x)}{dec})"
            lines.append(f"{outs} = {call}" if outs else call)
        return "\n".join(lines)


def _show(x):
    if isinstance(x, str) and x.startswith("$"):
        return x[1:]
    if isinstance(x, list):
        return "[" + ", ".join(_show(v) for v in x) + "]"
    return repr(x)
