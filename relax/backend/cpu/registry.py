"""The kernel families' record (``KernelFamily``) and the table that finds one by the rule name
its kernels carry (``KernelRegistry``).

A kernel family's TE compute marks its main block with the annotation ``"schedule_rule"``
(``SCHEDULE_RULE``, TVM's name for a block-level schedule hint) set to the family's rule name;
``relax.default_schedules`` reads it off each block (``block_rule``) and gives the block the
schedule the table holds for that rule. A family's other blocks may carry rules of their own
(its *stages*): a padding copy scheduled on its own, or input rows that the main block's
schedule computes in place.

Examples
--------
>>> def compute(x):
...     return x
>>> def schedule(sch, block, target, gemv_rows=None):
...     return None
>>> fam = KernelFamily(name="copy", rule="example.copy", plan=lambda *a: None,
...                    compute=compute, pack=None, schedule=schedule)
>>> table = KernelRegistry([fam])
>>> table.family("example.copy").name
'copy'
>>> table.schedule_of("example.copy") is schedule
True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

from tilecraft.tensorir.stmt import Block

__all__ = ["SCHEDULE_RULE", "ScheduleFn", "KernelFamily", "KernelRegistry", "block_rule"]

SCHEDULE_RULE = "schedule_rule"

# ``schedule(sch, block_name, target, gemv_rows=None)``: schedule the block ``block_name`` of
# ``sch`` (a ``tensorir.schedule.Schedule``) for ``target``. ``gemv_rows`` is the symbolic row
# count that matmul-like blocks get a row-vector version for (``default_schedules.apply``);
# the schedule returns True when it gave the block that version, else None or False. It raises
# ``ScheduleError`` where it does not apply (the primitives applied so far stay).
ScheduleFn = Callable[..., Optional[bool]]


@dataclass(frozen=True)
class KernelFamily:
    """One kernel family: how it plans a tile, computes, packs its weight and is scheduled.

    Attributes
    ----------
    name : str
        A short name (``"dense"``, ``"conv2d_nchw_flat"``).
    rule : str
        The ``"schedule_rule"`` of its main block (``"tilecraft.dense_packed"``).
    plan : callable
        Chooses the kernel's tile (or whether it applies) for an operator and a target; each
        family documents its arguments (``dense_panel_width(n, lanes, registers)``).
    compute : callable
        The TE compute of the kernel.
    pack : callable or None
        The TE compute of its packed weight (``FoldConstant`` runs it at build time); None for
        a kernel that reads its weight as it is, or has none.
    schedule : ScheduleFn
        The schedule of its main block.
    tile : bool
        Whether the main block is a register tile: a cheap producer it reads is not inlined
        into it (it would be recomputed in the tile's inner loop).
    stages : Mapping[str, ScheduleFn | None]
        The rules of its kernels' other blocks and the schedule each takes on its own; None
        for a stage that the main block's schedule places and schedules.
    """

    name: str
    rule: str
    plan: Callable[..., Any]
    compute: Callable[..., Any]
    pack: Optional[Callable[..., Any]]
    schedule: ScheduleFn
    tile: bool = False
    stages: Mapping[str, Optional[ScheduleFn]] = field(default_factory=dict)


class KernelRegistry:
    """The kernel families by rule name, and the schedule of every rule they use.

    Parameters
    ----------
    families : iterable of KernelFamily

    Raises
    ------
    ValueError
        Two families with one rule or one name, a stage rule that is another family's main
        rule, or one stage rule given two different schedules.

    Examples
    --------
    >>> from tilecraft.relax.backend import cpu
    >>> cpu.KERNELS.family("tilecraft.dense_packed").name
    'dense'
    """

    def __init__(self, families: Iterable[KernelFamily]):
        self._families: dict[str, KernelFamily] = {}
        names = set()
        for fam in families:
            if fam.rule in self._families or fam.name in names:
                raise ValueError(f"kernel family {fam.name} ({fam.rule}): that rule or name is "
                                 f"registered already")
            self._families[fam.rule] = fam
            names.add(fam.name)
        self._stages: dict[str, Optional[ScheduleFn]] = {}
        for fam in self._families.values():
            for rule, schedule in fam.stages.items():
                if rule in self._families:
                    raise ValueError(f"kernel family {fam.name}: its stage {rule} is the main "
                                     f"rule of {self._families[rule].name}")
                if rule in self._stages and self._stages[rule] is not schedule:
                    raise ValueError(f"kernel family {fam.name}: its stage {rule} has another "
                                     f"schedule in another family")
                self._stages[rule] = schedule

    def families(self) -> list[KernelFamily]:
        """Every family, in registration order."""
        return list(self._families.values())

    def family(self, rule: str | None) -> KernelFamily | None:
        """The family whose main rule is ``rule``, or None."""
        return self._families.get(rule) if rule is not None else None

    def rules(self) -> set[str]:
        """Every rule the families' kernels carry: the main rules and the stages'."""
        return set(self._families) | set(self._stages)

    def knows(self, rule: str | None) -> bool:
        """Whether ``rule`` is a family's main rule or one of its stages'."""
        return rule in self._families or rule in self._stages

    def schedule_of(self, rule: str) -> ScheduleFn | None:
        """The schedule of a block carrying ``rule``: its family's, or its stage's; None for a
        stage its family's main block places (``KeyError`` for an unknown rule)."""
        if rule in self._families:
            return self._families[rule].schedule
        return self._stages[rule]

    def is_tile(self, rule: str | None) -> bool:
        """Whether ``rule`` is the main rule of a register-tile family (``KernelFamily.tile``)."""
        fam = self.family(rule)
        return fam is not None and fam.tile


def block_rule(block: Block) -> str | None:
    """The ``"schedule_rule"`` annotation of ``block`` (set by the kernel families' computes),
    or None.

    Examples
    --------
    >>> from tilecraft.tensorir import te
    >>> A = te.placeholder((4,), "float32", "A")
    >>> B = te.compute((4,), lambda i: A[i], "B", attrs={SCHEDULE_RULE: "example.copy"})
    >>> from tilecraft.tensorir.schedule import Schedule
    >>> sch = Schedule(te.create_prim_func([A, B]))
    >>> block_rule(sch.get(sch.get_block("B")))
    'example.copy'
    """
    value = dict(block.annotations or {}).get(SCHEDULE_RULE)
    return getattr(value, "value", value)
