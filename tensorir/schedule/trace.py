"""The trace: every schedule call, in order, as replayable data.

An ``Instruction`` is ``(kind, inputs, attrs, outputs, decision)``. Inputs and outputs refer to
random variables by name (``"b0"``, ``"l3"``, ``"v5"``); attrs are plain JSON values; a sampling
instruction's ``decision`` is what it drew. ``Trace.to_json()`` gives plain data;
``Trace.from_json(data).apply(func)`` replays it on the original function and returns a new
Schedule. Replacing a decision (``trace.with_decision(i, d)``) replays with the new choice: this is
how the tuner's mutators explore. ``trace.with_decisions_dropped()`` makes the sampling
instructions draw again when replayed (a fresh sample of the same design space), and
``trace.without_postproc()`` cuts the trace at the ``enter_postproc`` mark.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

TRACE_VERSION = 1


@dataclass
class Instruction:
    kind: str
    inputs: list            # RV names (str starting with "$"), literals, nested lists
    attrs: dict
    outputs: list[str]      # RV names
    decision: Any = None

    def to_json(self) -> list:
        return [self.kind, self.inputs, self.attrs, self.outputs, self.decision]

    @staticmethod
    def from_json(data) -> "Instruction":
        if not isinstance(data, (list, tuple)) or len(data) != 5:
            raise ValueError(f"a trace instruction is [kind, inputs, attrs, outputs, decision], "
                             f"got {data!r}")
        kind, inputs, attrs, outputs, decision = data
        if not isinstance(kind, str) or not isinstance(outputs, list) or not isinstance(attrs, dict):
            raise ValueError(f"malformed trace instruction {data!r}")
        return Instruction(kind, list(inputs), dict(attrs), list(outputs), decision)


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
        from .schedule import Schedule
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
