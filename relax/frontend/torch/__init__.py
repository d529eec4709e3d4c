"""The PyTorch frontend: ``relax.frontend.from_torch(torch.export.export(model, args))``.

It translates the ATen graph of a ``torch.export.ExportedProgram`` (the graph ``torch.export``
gives, or the core-ATen one after ``run_decompositions()``) into a Relax module. Dims made
dynamic with ``dynamic_shapes`` (``torch.export.Dim``) become symbolic ``tensorir`` variables of
the same names, with their ``max`` as the function's ``tir_var_upper_bound``.

torch is an optional dependency: importing this package does not import it; ``from_torch`` does.
``supported_ops()`` lists the ATen operators it converts (no torch needed).
"""
from .exported_program import from_torch
from .ops import supported_ops

__all__ = ["from_torch", "supported_ops"]
