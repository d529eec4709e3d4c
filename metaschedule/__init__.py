"""metaschedule: the tuner — design spaces, evolutionary search, cost models, database, builders
and runners (in the spirit of Apache TVM's MetaSchedule).

It sits between ``rpc`` and ``relax`` in the layering: it imports ``tensorir``, ``targets`` and
``rpc``, never ``relax`` (``relax.tune`` is the graph-level entry). See ``docs/tuning.md``.
"""
from .errors import TuneError

__all__ = ["TuneError"]

# --- SPACE: design space (schedule rules, postprocessors, mutators, space generator) ---------

# --- MEASURE: database, builder, runners ------------------------------------------------------

# --- SEARCH: cost model, search, task scheduler, tuning drivers -------------------------------
