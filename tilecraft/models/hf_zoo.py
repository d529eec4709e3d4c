"""A zoo of small PyTorch models as people export them: Hugging Face ``transformers`` models of
common architectures, built from a tiny ``*Config(...)`` with random weights (nothing is
downloaded), and a torchvision-style segmentation network written here.

``ZOO`` maps a name to a ``ZooEntry``: ``entry.build()`` makes the model (``eval()``, random
weights at a scale that keeps activations of order 1), ``entry.inputs(i)`` random inputs of
size ``i`` (0 and 1: two batch sizes and, for text, two sequence lengths), and
``entry.dynamic_shapes`` the ``torch.export`` dims (dynamic batch; text models a dynamic
sequence length too). ``PATHS`` maps an import path to ``path(model, args, dynamic_shapes) ->
IRModule``: ``"torch.export"`` is ``torch.export.export`` then ``relax.frontend.from_torch``;
``"onnx-dynamo"`` is ``torch.onnx.export(..., dynamo=True)`` (the current exporter: opset 18+,
through ``onnxscript``) with the same dynamic dims, then ``relax.frontend.from_onnx``.

Used by ``tests/e2e/test_hf_models.py`` (correctness, both sizes against PyTorch eager) and
``benchmarks/hf_import.py`` (the table in docs/frontends.md).

Examples
--------
>>> from benchmarks.models.hf_zoo import ZOO, PATHS, reference
>>> entry = ZOO["bert"]                                         # doctest: +SKIP
>>> model = entry.build()                                       # doctest: +SKIP
>>> mod = PATHS["torch.export"](model, entry.inputs(0), entry.dynamic_shapes)  # doctest: +SKIP
"""
from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree

Dim = torch.export.Dim

MAX_BATCH = 8
MAX_SEQ = 64
# sizes 0 and 1 of every model: (batch, sequence length)
TEXT_SIZES = ((2, 16), (3, 9))
BATCHES = (2, 3)


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give ``model`` random weights at a scale that keeps activations of order 1.

    ``transformers`` initializes many layers to tiny or zero values (MobileNet's output is
    about 1e-26 with them), which would make any comparison pass. Convolutions and linear layers
    get He-normal weights, normalization layers scales near 1, shifts near 0 and running
    statistics near (0, 1).
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Linear)):
                fan_in = mod.weight[0].numel()
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g)
                                 * math.sqrt(2.0 / fan_in))
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
            elif isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
                c = mod.num_features
                mod.weight.copy_(torch.rand(c, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(c, generator=g) * 0.1)
                mod.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            elif isinstance(mod, nn.LayerNorm) and mod.weight is not None:
                mod.weight.copy_(torch.rand(mod.weight.shape, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
    return model


# ---------------------------------------------------------------------------------------------
# a torchvision-style segmentation network (torchvision is not a dependency)


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, stride: int = 1, dilation: int = 1):
        super().__init__(nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation,
                                   bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class ASPPHead(nn.Module):
    """DeepLabV3's head, small: parallel dilated convolutions and image pooling, concatenated
    and projected to the classes."""

    def __init__(self, cin: int, classes: int, width: int = 16):
        super().__init__()
        self.branches = nn.ModuleList([ConvBNReLU(cin, width, dilation=d) for d in (1, 2)])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, width, 1),
                                  nn.ReLU(inplace=True))
        self.project = ConvBNReLU(3 * width, width)
        self.classify = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        size = x.shape[-2:]
        pooled = F.interpolate(self.pool(x), size=size, mode="bilinear", align_corners=False)
        y = torch.cat([b(x) for b in self.branches] + [pooled], dim=1)
        return self.classify(self.project(y))


class TinySegmentation(nn.Module):
    """``torchvision.models.segmentation``-like: a strided backbone, an ASPP head and an
    auxiliary FCN head, logits upsampled to the input size; returns ``{"out", "aux"}`` as
    torchvision's models do."""

    def __init__(self, classes: int = 5):
        super().__init__()
        self.stem = ConvBNReLU(3, 16, stride=2)
        self.layer1 = ConvBNReLU(16, 24, stride=2)
        self.layer2 = ConvBNReLU(24, 32, dilation=2)
        self.head = ASPPHead(32, classes)
        self.aux = nn.Sequential(ConvBNReLU(24, 16), nn.Dropout(0.1), nn.Conv2d(16, classes, 1))

    def forward(self, x):
        size = x.shape[-2:]
        f1 = self.layer1(self.stem(x))
        f2 = self.layer2(f1)
        out = F.interpolate(self.head(f2), size=size, mode="bilinear", align_corners=False)
        aux = F.interpolate(self.aux(f1), size=size, mode="bilinear", align_corners=False)
        return {"out": out, "aux": aux}


# ---------------------------------------------------------------------------------------------
# the zoo


@dataclass
class ZooEntry:
    """One model of the zoo: ``build()``, ``inputs(size)`` (random, seeded) and the dims to
    export dynamic."""
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple]
    dynamic_shapes: tuple
    kind: str        # "text", "vision", "audio"


def _text_inputs(vocab: int):
    def inputs(size: int) -> tuple:
        batch, seq = TEXT_SIZES[size]
        g = torch.Generator().manual_seed(100 + size)
        return (torch.randint(0, vocab, (batch, seq), generator=g),)
    return inputs


def _image_inputs(channels: int, side: int):
    def inputs(size: int) -> tuple:
        g = torch.Generator().manual_seed(200 + size)
        return (torch.randn(BATCHES[size], channels, side, side, generator=g),)
    return inputs


def _text_dims():
    return ({0: Dim("batch", max=MAX_BATCH), 1: Dim("seq", max=MAX_SEQ)},)


def _batch_dim():
    return ({0: Dim("batch", max=MAX_BATCH)},)


def _hf(config_name: str, model_name: str, **config):
    def build() -> nn.Module:
        import transformers
        cfg = getattr(transformers, config_name)(**config)
        model = getattr(transformers, model_name)(cfg)
        return randomize(model.eval())
    return build


def _whisper_encoder() -> nn.Module:
    import transformers
    cfg = transformers.WhisperConfig(
        encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
        num_mel_bins=16, max_source_positions=32, decoder_layers=1, decoder_attention_heads=2,
        decoder_ffn_dim=64, vocab_size=100, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=0)
    return randomize(transformers.WhisperModel(cfg).get_encoder().eval())


def _whisper_inputs(size: int) -> tuple:
    g = torch.Generator().manual_seed(300 + size)
    # the encoder takes exactly 2 * max_source_positions frames
    return (torch.randn(BATCHES[size], 16, 64, generator=g),)


VOCAB = 100
_TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64)

ZOO: dict[str, ZooEntry] = {e.name: e for e in [
    ZooEntry("gpt2", _hf("GPT2Config", "GPT2Model", vocab_size=VOCAB, n_embd=32, n_layer=2,
                         n_head=2, n_positions=128, use_cache=False,
                         bos_token_id=0, eos_token_id=0),
             _text_inputs(VOCAB), _text_dims(), "text"),
    ZooEntry("bert", _hf("BertConfig", "BertModel", max_position_embeddings=128, **_TEXT),
             _text_inputs(VOCAB), _text_dims(), "text"),
    ZooEntry("distilbert", _hf("DistilBertConfig", "DistilBertModel", vocab_size=VOCAB, dim=32,
                               n_layers=2, n_heads=2, hidden_dim=64,
                               max_position_embeddings=128),
             _text_inputs(VOCAB), _text_dims(), "text"),
    ZooEntry("roberta", _hf("RobertaConfig", "RobertaModel", max_position_embeddings=130,
                            **_TEXT),
             _text_inputs(VOCAB), _text_dims(), "text"),
    ZooEntry("llama", _hf("LlamaConfig", "LlamaModel", num_key_value_heads=1,
                          max_position_embeddings=128, use_cache=False, **_TEXT),
             _text_inputs(VOCAB), _text_dims(), "text"),
    ZooEntry("whisper-encoder", _whisper_encoder, _whisper_inputs, _batch_dim(), "audio"),
    ZooEntry("vit", _hf("ViTConfig", "ViTModel", image_size=32, patch_size=8, hidden_size=32,
                        num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
             _image_inputs(3, 32), _batch_dim(), "vision"),
    ZooEntry("convnext", _hf("ConvNextConfig", "ConvNextModel", num_stages=2, depths=[1, 1],
                             hidden_sizes=[16, 32]),
             _image_inputs(3, 32), _batch_dim(), "vision"),
    ZooEntry("resnet", _hf("ResNetConfig", "ResNetModel", embedding_size=16, depths=[1, 1],
                           hidden_sizes=[16, 32], layer_type="basic"),
             _image_inputs(3, 32), _batch_dim(), "vision"),
    ZooEntry("mobilenet-v2", _hf("MobileNetV2Config", "MobileNetV2Model", image_size=32,
                                 depth_multiplier=0.25),
             _image_inputs(3, 32), _batch_dim(), "vision"),
    ZooEntry("segmentation", lambda: randomize(TinySegmentation().eval()),
             _image_inputs(3, 32), _batch_dim(), "vision"),
]}


# ---------------------------------------------------------------------------------------------
# import paths


def via_torch_export(model: nn.Module, args: tuple, dynamic_shapes):
    """``torch.export.export`` (as exported, no decompositions) then ``from_torch``."""
    from tilecraft.relax.frontend import from_torch
    with torch.no_grad():
        ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    return from_torch(ep)


def via_onnx_dynamo(model: nn.Module, args: tuple, dynamic_shapes):
    """``torch.onnx.export(dynamo=True)`` (in memory, the exporter's default graph
    optimizations on) then ``from_onnx``. The ``torch.export.Dim`` names become the ONNX
    model's dim names (``batch``, ``seq``)."""
    from tilecraft.relax.frontend import from_onnx
    # the exporter logs its progress and warns about torchvision's missing ops
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=dynamic_shapes,
                                    verbose=False)
    return from_onnx(program.model_proto)


PATHS: dict[str, Callable] = {"torch.export": via_torch_export, "onnx-dynamo": via_onnx_dynamo}


def reference(model: nn.Module, args: tuple) -> list[np.ndarray]:
    """PyTorch eager's outputs, flattened in order (a ``ModelOutput`` or dict as its
    tensors), as numpy arrays."""
    with torch.no_grad():
        out = model(*args)
    return [t.detach().numpy() for t in pytree.tree_leaves(out)]


def max_relative_error(outs, refs) -> float:
    """The largest ``|out - ref|`` over all outputs, relative to each output's largest
    ``|ref|``."""
    worst = 0.0
    for o, r in zip(outs, refs):
        scale = float(np.abs(r).max()) if r.size else 1.0
        err = float(np.abs(o.astype(np.float64) - r).max()) if r.size else 0.0
        worst = max(worst, err / max(scale, 1e-30))
    return worst
