"""The PyTorch frontend: ``relax.frontend.from_torch(torch.export.export(model, args))``.

It translates the ATen graph of a ``torch.export.ExportedProgram`` (the graph ``torch.export``
gives, in-place and view operators included, or the core-ATen one after
``run_decompositions()``) into a Relax module. Dims made dynamic with ``dynamic_shapes``
(``torch.export.Dim``) become symbolic ``tensorir`` variables of the same names; their ranges
are facts the shapes are proved with, checked when the function runs, and their ``max`` the
function's ``tir_var_upper_bound``.

- ``exported_program.py``: the importer (the walk, symbols, shapes, errors);
- ``aliasing.py``: PyTorch's in-place and view semantics as pure values;
- ``ops.py``: one converter per ATen operator family.

torch is an optional dependency: importing this package does not import it; ``from_torch`` does.
``supported_ops()`` lists the ATen operators it converts (no torch needed).
"""
from .exported_program import from_torch
from .ops import supported_ops

__all__ = ["from_torch", "supported_ops"]
