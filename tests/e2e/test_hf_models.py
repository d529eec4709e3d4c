"""The PyTorch model zoo end to end: each model of ``tilecraft.models.hf_zoo`` (Hugging Face
``transformers`` models of tiny random-weight configs, and a torchvision-style segmentation
network) is exported with a dynamic batch (and sequence length), imported, built once with
``strict=True`` (every kernel must take a default schedule) and run at two sizes against
PyTorch eager.

Both import paths of ``hf_zoo.PATHS`` run: ``torch.export`` then ``from_torch``, and
``torch.onnx.export(dynamo=True)`` then ``from_onnx`` (the exporter needs ``onnxscript``; in CI
on a subset of the models, ``ONNX_DYNAMO_CI``).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install "
                                            "'tilecraft[torch]'): the torch frontend needs it")
pytest.importorskip("transformers", reason="transformers is not installed: the zoo builds its "
                                           "models from transformers configs")

from tilecraft import relax, targets                      # noqa: E402
from tilecraft.models import hf_zoo                       # noqa: E402

# LLVM's optimizations change no result, only the time to build (see the ONNX conformance
# suite): this file checks correctness
TARGET = "llvm -opt-level=0"
RTOL = 1e-4

_BUILT: dict = {}


def built(name: str, path: str):
    """(model, VirtualMachine) of a zoo model imported by ``path``, built once per module."""
    key = (name, path)
    if path == "onnx-dynamo":
        pytest.importorskip("onnxscript", reason="onnxscript is not installed (pip install "
                                                 "onnxscript): torch.onnx.export(dynamo=True) "
                                                 "needs it")
    if key not in _BUILT:
        entry = hf_zoo.ZOO[name]
        model = entry.build()
        mod = hf_zoo.PATHS[path](model, entry.inputs(0), entry.dynamic_shapes)
        exe = relax.build(mod, TARGET, strict=True)
        _BUILT[key] = (model, mod, relax.VirtualMachine(exe, targets.cpu(0)))
    return _BUILT[key]


# the ONNX path doubles the time of this file: in CI it runs on these (a decoder, an encoder
# with a position table, rotary attention with grouped KV heads, a convolutional audio encoder,
# a CNN); `python -m benchmarks.hf_import` and `pytest -m slow` run it on every model
ONNX_DYNAMO_CI = ("gpt2", "bert", "llama", "whisper-encoder", "resnet")


def _cases():
    for name in hf_zoo.ZOO:
        for path in sorted(hf_zoo.PATHS):
            slow = path == "onnx-dynamo" and name not in ONNX_DYNAMO_CI
            yield pytest.param(name, path, marks=[pytest.mark.slow] if slow else [],
                               id=f"{name}-{path}")


@pytest.mark.parametrize("name,path", list(_cases()))
def test_zoo_model_matches_pytorch(name, path):
    model, _, vm = built(name, path)
    entry = hf_zoo.ZOO[name]
    for size in (0, 1):
        args = entry.inputs(size)
        refs = hf_zoo.reference(model, args)
        out = vm["main"](*[a.numpy() for a in args])
        outs = [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
        assert len(outs) == len(refs), f"{name}: {len(outs)} outputs, PyTorch has {len(refs)}"
        for o, r in zip(outs, refs):
            assert o.shape == r.shape and o.dtype == r.dtype, (name, o.shape, r.shape)
            # no zeros alone: the weights are randomized so that outputs vary
            assert np.std(r) > 1e-3, f"{name}: a degenerate reference output"
        assert hf_zoo.max_relative_error(outs, refs) < RTOL, name


def test_sequence_past_the_exported_range_is_refused_at_run_time():
    # BERT was exported with Dim("seq", max=64): the importer proved min(seq, 128) == seq from
    # that range (the position table has 128 rows), so a longer sequence must not run
    _, mod, vm = built("bert", "torch.export")
    main = mod["main"]
    assert dict(main.attr_dict["tir_var_upper_bound"]) == {"batch": 8, "seq": 64}
    ids = np.zeros((1, 65), dtype="int64")
    with pytest.raises(relax.RuntimeCheckError, match=r"seq = 65 is outside the range"):
        vm["main"](ids)
