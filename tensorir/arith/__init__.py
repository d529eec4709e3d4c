"""tensorir.arith: integer analysis for index expressions.

- ``Analyzer``: ``simplify``, ``const_int_bound``, ``int_set``, ``can_prove``, ``can_prove_equal``,
  ``union`` / ``intersect`` / ``to_range`` of interval sets, with a context of facts (``bind``,
  ``update_bound``, ``with_constraint``); ``assume(*conds)``: a context in which every new
  ``Analyzer`` starts from those facts (how a frontend's knowledge of its shape variables
  reaches the shape inference of every operator).
- ``simplify``, ``can_prove``, ``const_int_bound``, ``int_set``: one-shot versions taking a
  ``{var: Range}`` map.
- ``ConstIntBound`` (constant bounds, ``POS_INF`` / ``NEG_INF`` sentinels) and ``IntervalSet``
  (symbolic bounds).

The simplifier puts integer expressions into a canonical linear form (see ``linear``), which
folds the index patterns that loop splitting and fusion produce::

    >>> from tilecraft.tensorir import var, Range
    >>> from tilecraft.tensorir import arith
    >>> i = var("i")
    >>> arith.simplify((i // 4) * 4 + i % 4)
    i
"""
from .analyzer import Analyzer, assume, can_prove, const_int_bound, int_set, simplify
from .bound import ConstIntBound
from .const_fold import fold_binary, fold_cast
from .interval import IntervalSet

__all__ = ["Analyzer", "ConstIntBound", "assume", "IntervalSet", "can_prove", "const_int_bound", "int_set",
           "simplify", "fold_binary", "fold_cast"]
