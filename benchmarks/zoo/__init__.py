"""The model zoo (``benchmarks/zoo``): ``models.py`` defines the models (ONNX, random weights),
``run.py`` measures them through tilecraft, onnxruntime and PyTorch. ``tilecraft zoo`` or
``python -m benchmarks.zoo.run``; see docs/zoo.md."""
