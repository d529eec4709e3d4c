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
- For code generators: ``is_nonneg`` (the one non-negativity test), ``lower_floor_divmod`` /
  ``floor_is_trunc`` / ``floor_divmod_general`` (floor division as truncating division,
  ``division``), and ``lane_stride`` / ``ramp_base`` / ``lane_index`` / ``is_aligned`` (how an
  index moves across the lanes of a vectorized loop, ``ramp``).

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
from .const_fold import fold_add, fold_binary, fold_cast, fold_mul
from .division import floor_divmod_general, floor_is_trunc, is_nonneg, lower_floor_divmod
from .interval import IntervalSet
from .ramp import is_aligned, lane_index, lane_stride, linear_coeff, ramp_base

__all__ = ["Analyzer", "ConstIntBound", "assume", "IntervalSet", "can_prove", "const_int_bound", "int_set",
           "simplify", "fold_add", "fold_binary", "fold_cast", "fold_mul", "is_nonneg",
           "floor_is_trunc", "lower_floor_divmod", "floor_divmod_general", "lane_stride",
           "ramp_base", "lane_index", "is_aligned", "linear_coeff"]
