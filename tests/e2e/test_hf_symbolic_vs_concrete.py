"""One artifact for every shape: a Hugging Face model of ``tilecraft.models.hf_zoo`` (GPT-2 and
BERT, tiny random-weight configs) exported once with a dynamic batch and sequence length and
built with its symbolic dims gives the results of the same model exported and built for each
concrete shape, on random token ids, at shapes around the kernels' tile heights (rows
``batch * seq`` of 1, 8, 10, 13) -- the kernels that specialize on the symbolic extents at run
time (exact row tiles, unmasked accumulator tiles: ``relax.default_schedules``) compute what
the concrete kernels compute."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install "
                                            "'tilecraft[torch]'): the torch frontend needs it")
pytest.importorskip("transformers", reason="transformers is not installed: the zoo builds its "
                                           "models from transformers configs")

from tilecraft import relax, targets                      # noqa: E402
from tilecraft.models import hf_zoo                       # noqa: E402
from tilecraft.relax.frontend import from_torch           # noqa: E402

# the schedules decide what is compared; LLVM's optimizations change no result
TARGET = "llvm -opt-level=0"
SHAPES = [(1, 1), (1, 8), (2, 5), (1, 13)]


def _export(model, ids, dynamic_shapes=None):
    with torch.no_grad():
        ep = torch.export.export(model, (ids,), dynamic_shapes=dynamic_shapes)
    return from_torch(ep)


def _outputs(vm, ids: np.ndarray) -> list[np.ndarray]:
    out = vm["main"](ids)
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_symbolic_build_matches_concrete_builds(name):
    entry = hf_zoo.ZOO[name]
    model = entry.build()
    sym_vm = relax.VirtualMachine(relax.build(_export(model, *entry.inputs(0),
                                                      entry.dynamic_shapes), TARGET),
                                  targets.cpu(0))
    rng = np.random.default_rng(7)
    for batch, seq in SHAPES:
        ids = torch.from_numpy(rng.integers(0, hf_zoo.VOCAB, (batch, seq)).astype(np.int64))
        con_vm = relax.VirtualMachine(relax.build(_export(model, ids), TARGET), targets.cpu(0))
        sym, con = _outputs(sym_vm, ids.numpy()), _outputs(con_vm, ids.numpy())
        assert len(sym) == len(con)
        for s, c in zip(sym, con):
            assert s.shape == c.shape, (name, batch, seq, s.shape, c.shape)
            np.testing.assert_allclose(s, c, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name} at {batch} x {seq}")


@pytest.mark.parametrize("fuse_all", [False, True], ids=["as-built", "every-expansion-fused"])
def test_mobilenet_v2_symbolic_batch_through_torch_export(fuse_all, monkeypatch):
    """The image rows of ``benchmarks.hf_models_cpu`` through ``torch.export``: MobileNet-V2 at
    width 1.0 (every channel count of the 224 model: the 24-channel projections on their
    three-half-vector tile, the 144-channel depthwise layers, TF-style padding folded) on 64 x
    64 images, exported with a dynamic batch and built once, against PyTorch eager at batches
    1 and 3 and against the build for batch 3. ``every-expansion-fused``: each block's
    expansion fused into its depthwise layer (``FuseExpandDepthwise``, whatever the size: at
    64 x 64 none reaches ``FUSE_MIN_IMAGE_BYTES``), every stride and plane of the model."""
    from tilecraft.models.hf_zoo import randomize
    from tilecraft.relax.backend.cpu import expand_depthwise
    if fuse_all:
        monkeypatch.setattr(expand_depthwise, "FUSE_MIN_IMAGE_BYTES", 0)
    import transformers
    model = randomize(transformers.MobileNetV2Model(
        transformers.MobileNetV2Config(image_size=64)).eval())

    class Hidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(pixel_values=x)[0]

    net = Hidden(model).eval()
    rng = np.random.default_rng(8)
    example = torch.from_numpy(rng.standard_normal((2, 3, 64, 64)).astype(np.float32))
    sym_exe = relax.build(_export(net, example, ({0: torch.export.Dim("batch", max=8)},)),
                          TARGET)
    # 16 of its 17 blocks expand (the first one does not): 9 kernels, the same block
    # shapes sharing one
    fused = [name for name in sym_exe.kernel_names if "expand" in name]
    assert len(fused) == (9 if fuse_all else 0), fused
    sym_vm = relax.VirtualMachine(sym_exe, targets.cpu(0))
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)
        with torch.no_grad():
            want = net(torch.from_numpy(x)).numpy()
        got = _outputs(sym_vm, x)[0]
        scale = np.abs(want).max()
        np.testing.assert_allclose(got / scale, want / scale, rtol=1e-4, atol=1e-4,
                                   err_msg=f"mobilenet-v2 at batch {batch}")
    con_vm = relax.VirtualMachine(relax.build(_export(net, torch.from_numpy(x)), TARGET),
                                  targets.cpu(0))
    np.testing.assert_allclose(got, _outputs(con_vm, x)[0], rtol=1e-4, atol=1e-5 * scale)
