"""``get_pipeline``: the default sequence of graph passes that ``relax.build`` runs.

Examples
--------
>>> from relax.transform import get_pipeline
>>> seq = get_pipeline()
>>> [p.name for p in seq.passes][:3]
['LegalizeOps', 'FoldConstant', 'DeadCodeElimination']
"""
from __future__ import annotations

from .base import Sequential
from .canonicalize_bindings import CanonicalizeBindings
from .dead_code_elimination import DeadCodeElimination
from .fold_constant import FoldConstant
from .fuse_ops import FuseOps
from .fuse_tir import FuseTIR
from .legalize_ops import LegalizeOps

__all__ = ["get_pipeline", "PIPELINES"]


def _default(check: bool = False) -> Sequential:
    passes = [
        LegalizeOps(),            # operators -> call_tir of TensorIR kernels (+ "op_pattern")
        FoldConstant(),           # kernels on constants run now
        DeadCodeElimination(),    # ... and what they replaced goes away
        CanonicalizeBindings(),   # copies and no-op match_casts
        FuseOps(),                # groups -> Primitive functions
        FuseTIR(),                # each Primitive function -> one PrimFunc
        DeadCodeElimination(),
        # Insertion point for the VM side: memory planning (StaticPlanBlockMemory) and layout
        # passes are appended here by relax.build / the VM engineer, after fusion so that they
        # see the final kernels.
    ]
    return Sequential(passes, name="default", check=check)


PIPELINES = {"default": _default, "default_build": _default}


def get_pipeline(name: str = "default", check: bool = False) -> Sequential:
    """The named pass pipeline (``"default"``), as a ``Sequential``.

    Parameters
    ----------
    name : str
        ``"default"``: LegalizeOps, FoldConstant, DeadCodeElimination, CanonicalizeBindings,
        FuseOps, FuseTIR, DeadCodeElimination.
    check : bool
        Check well-formedness after every pass (slower; for debugging and tests).

    Examples
    --------
    >>> mod2 = get_pipeline()(mod)   # doctest: +SKIP
    """
    try:
        make = PIPELINES[name]
    except KeyError:
        raise ValueError(f"unknown pipeline {name!r}; known: {sorted(PIPELINES)}") from None
    return make(check=check)
