"""``lower``: the default lowering pipeline from TensorIR to what the code generators consume."""
from __future__ import annotations

from ..expr import TIRError
from ..function import IRModule, PrimFunc
from .convert_blocks import ConvertBlocksToLoops
from .flatten import FlattenBuffers
from .loop_partition import LoopPartition
from .simplify import Simplify
from .verify import VerifyMemoryAccess

# The passes of ``lower``, in order (names for printing and for tests).
DEFAULT_PASSES = (VerifyMemoryAccess, ConvertBlocksToLoops, LoopPartition, Simplify, FlattenBuffers,
                  Simplify)


def _lower_func(func: PrimFunc) -> PrimFunc:
    for p in DEFAULT_PASSES:
        func = p(func)
    return func


def lower(func_or_mod, target=None):
    """Lower a PrimFunc (or every PrimFunc of an IRModule) to the form code generators consume.

    Runs ``VerifyMemoryAccess -> ConvertBlocksToLoops -> Simplify -> FlattenBuffers ->
    Simplify``; see the ``tensorir.transform`` module docstring for the exact output form.
    ``target`` is accepted for target-specific passes and currently changes nothing.

    Parameters
    ----------
    func_or_mod : PrimFunc or IRModule
        Scheduled or unscheduled TensorIR. Functions of a module that are not PrimFuncs (relax
        functions) are kept as they are.
    target : optional
        The target the code is lowered for.

    Returns
    -------
    PrimFunc or IRModule
        The same kind of object as the input.

    Raises
    ------
    OutOfBoundsError
        When an access provably goes out of bounds.

    Examples
    --------
    >>> from tensorir import te, transform
    >>> n = te.var("n")
    >>> A = te.placeholder((n, 4), "float32", "A")
    >>> B = te.compute((n, 4), lambda i, j: A[i, j] * 2.0, "B")
    >>> f = transform.lower(te.create_prim_func([A, B]))
    >>> f.buffers[0].shape          # flat: (n * 4,)            # doctest: +SKIP
    >>> f.attr_dict["shape_vars"] == (n,)
    True
    """
    if isinstance(func_or_mod, IRModule):
        return IRModule({name: _lower_func(f) if isinstance(f, PrimFunc) else f
                         for name, f in func_or_mod.functions.items()})
    if isinstance(func_or_mod, PrimFunc):
        return _lower_func(func_or_mod)
    raise TIRError(f"lower: expected a PrimFunc or an IRModule, got "
                   f"{type(func_or_mod).__name__}", func_or_mod)
