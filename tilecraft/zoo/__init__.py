"""The model zoo: ``models.py`` defines the models (ONNX, seeded random weights), ``run.py``
measures them through tilecraft, onnxruntime and PyTorch. ``tilecraft zoo`` runs it (and
``python -m benchmarks.run zoo`` for the project's results); see docs/zoo.md."""
