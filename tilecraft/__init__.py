"""tilecraft: the command line and the jobs behind it (``tilecraft --help``).

``tilecraft compile model.onnx -o model.tcx`` imports a model (ONNX, or a ``torch.export``
program saved with ``torch.export.save``) and builds it with ``relax.build``; ``tilecraft run``
runs a compiled model on ``.npy`` inputs; ``tilecraft bench`` times a model beside onnxruntime
(or PyTorch); ``tilecraft zoo`` runs the model zoo; ``tilecraft demo`` is the README's main job.
See docs/cli.md.
"""
__version__ = "0.1.0"
