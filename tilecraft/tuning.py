"""What a tuning database holds for a model: trials so far, and which schedule each kernel gets.

``relax.tune`` writes its records to a work directory (``metaschedule.Database``); running it
again on the same directory adds to them. ``tilecraft tune`` counts the trials already there
(``trials_done``) to continue a run instead of starting over, and ``tilecraft tune`` /
``tilecraft compile --tuning-db`` / the zoo report per kernel what ``relax.build(...,
database=db)`` takes (``kernel_choices``).

Examples
--------
>>> tasks = relax.extract_tasks(mod, "llvm", database=db)              # doctest: +SKIP
>>> trials_done(tasks, db, "llvm")                                     # doctest: +SKIP
64
>>> [k["uses"] for k in kernel_choices(tasks, db, "llvm")]             # doctest: +SKIP
['tuned', 'default (fastest)']
"""
from __future__ import annotations

from tilecraft import metaschedule
from tilecraft.metaschedule.database import target_key

# what a kernel gets from the database in relax.build
TUNED = "tuned"                      # a record faster than the default schedule
DEFAULT_FASTEST = "default (fastest)"  # tuned, but nothing beat the default schedule
NOT_TUNED = "default (no records)"   # the database has nothing for it


def records_of(tasks, db, target) -> list:
    """The records ``db`` holds for ``tasks`` on ``target``."""
    hashes = {metaschedule.workload_hash(t.func) for t in tasks}
    key = target_key(target)
    return [r for r in db.get_all_tuning_records()
            if r.workload.shash in hashes and r.target == key]


def trials_done(tasks, db, target) -> int:
    """How many trials (measured candidates, baselines included) ``db`` holds for ``tasks``
    on ``target``."""
    return len(records_of(tasks, db, target))


def tuning_minutes(records) -> float:
    """Tuning time from the records' timestamps: the sum of the gaps between consecutive
    records, leaving out gaps over 10 minutes (a killed run resumed later)."""
    times = sorted(r.timestamp for r in records if r.timestamp is not None)
    return sum(b - a for a, b in zip(times, times[1:]) if b - a < 600) / 60


def kernel_choices(tasks, db, target) -> list[dict]:
    """Per task: ``task``, ``weight``, ``trials``, ``baseline_ms`` (the default schedule, where
    it was measured), ``best_ms`` (what the database selects) and ``uses``: ``TUNED``,
    ``DEFAULT_FASTEST`` or ``NOT_TUNED``."""
    out = []
    records = records_of(tasks, db, target)
    for t in tasks:
        shash = metaschedule.workload_hash(t.func)
        base = metaschedule.baseline_record(db, t, target)
        best = db.query_tuning_record(t.func, target)
        if best is None:
            uses = NOT_TUNED
        elif t.baseline is not None and metaschedule.workload_hash(
                best.as_schedule(t.func).func) == metaschedule.workload_hash(t.baseline.func):
            # by program, not trace: a record of the default schedule by another trace is it too
            uses = DEFAULT_FASTEST
        else:
            uses = TUNED
        out.append({"task": t.name, "weight": t.weight,
                    "trials": sum(r.workload.shash == shash for r in records),
                    "baseline_ms": base.mean_secs * 1e3 if base is not None and base.ok
                    else None,
                    "best_ms": best.mean_secs * 1e3 if best is not None else None,
                    "uses": uses})
    return out


def summary_line(choices: list[dict]) -> str:
    """``"3 of 5 distinct kernels use a tuned schedule; 1 keeps the default schedule (no
    record was faster); 1 has no records (default schedule)"``."""
    n = len(choices)
    tuned = sum(c["uses"] == TUNED for c in choices)
    fastest = sum(c["uses"] == DEFAULT_FASTEST for c in choices)
    none = sum(c["uses"] == NOT_TUNED for c in choices)
    parts = [f"{tuned} of {n} distinct kernel{'s' if n != 1 else ''} "
             f"use{'s' if tuned == 1 else ''} a tuned schedule"]
    if fastest:
        parts.append(f"{fastest} keep{'s' if fastest == 1 else ''} the default schedule "
                     f"(no record was faster)")
    if none:
        parts.append(f"{none} {'has' if none == 1 else 'have'} no records (default schedule)")
    return "; ".join(parts)


def choices_table(choices: list[dict]) -> str:
    """The per-kernel table ``tilecraft tune`` prints."""
    def ms(v):
        return "-" if v is None else f"{v:.4f}"
    width = max([len("kernel")] + [len(c["task"]) for c in choices])
    lines = [f"{'kernel'.ljust(width)}  calls  trials  default ms     best ms  uses",
             f"{'-' * width}  -----  ------  ----------  ----------  ----"]
    for c in choices:
        lines.append(f"{c['task'].ljust(width)}  {c['weight']:5d}  {c['trials']:6d}  "
                     f"{ms(c['baseline_ms']):>10}  {ms(c['best_ms']):>10}  {c['uses']}")
    return "\n".join(lines)
