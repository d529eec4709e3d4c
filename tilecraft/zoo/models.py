"""The zoo's models, each as an ONNX model with seeded random weights (and, for the ones written
here in PyTorch, the torch module for the eager column).

- the nine "light" model-zoo graphs shipped inside the onnx package
  (``onnx/backend/test/data/light/*.onnx``: ResNet-50, DenseNet-121, Inception v1/v2,
  ShuffleNet, SqueezeNet, VGG-19, AlexNet, ZFNet-512). Their weights are made by
  ``ConstantOfShape`` nodes, all 0.02; ``randomize_light`` swaps in seeded random initializers
  (He-scaled convolutions, batch-norm statistics near 0 / 1) so that the outputs differ from
  input to input and a wrong kernel shows; ``calibrate_logits`` then scales the last layer so
  that the final softmax is not saturated;
- models defined here in PyTorch with random weights and exported with
  ``torch.onnx.export(..., dynamo=False)`` (the TorchScript exporter: it works offline, without
  onnxscript): ``mobilenet_v2``, ``resnet18`` (torchvision's architectures), ``bert_base``
  (embeddings and 12 post-LN encoder layers as Hugging Face writes them, ``seq_len``
  symbolic), ``gpt2_small`` (12 pre-LN decoder blocks with a causal mask sliced from a buffer,
  tanh GELU, ``seq_len`` symbolic), ``mlp_mixer`` (Mixer-S/16 at 224x224);
- ``bert_layer``: the single BERT-base encoder layer of ``tilecraft.models`` (built with
  onnx.helper; ``batch`` and ``seq_len`` symbolic);
- ``mlp``: the 4-layer perceptron of ``tilecraft.models`` (784-1024-1024-1024-10, ``batch``
  symbolic): the zoo's small model, built in seconds (``tilecraft demo --model mlp``).

``ZOO`` maps each name to a builder returning a ``ZooModel``; ``NEEDS_TORCH`` names the models
written in PyTorch (they need the ``[torch]`` extra).

Examples
--------
>>> from tilecraft.zoo.models import ZOO
>>> z = ZOO["mlp"]()                                                  # doctest: +SKIP
>>> z.name, [a.shape for a in z.inputs.values()]                      # doctest: +SKIP
('mlp', [(1, 784)])
"""
from __future__ import annotations

import glob
import io
import math
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..models import bert_encoder_layer, mlp as mlp_builder


@dataclass
class ZooModel:
    """One zoo entry.

    Attributes
    ----------
    name, description : str
    onnx_model : onnx.ModelProto
    inputs : dict[str, np.ndarray]
        The batch-1 inputs the zoo times (and checks).
    upper_bounds : dict[str, int]
        For ``relax.build`` (symbolic dims).
    extra_inputs : list[dict]
        More input sets checked against onnxruntime with the same build (other sequence
        lengths: the symbolic dims at work).
    torch_module : torch.nn.Module | None
        The same model for the PyTorch eager column (None for the light models).
    """

    name: str
    description: str
    onnx_model: object
    inputs: dict
    upper_bounds: dict = field(default_factory=dict)
    extra_inputs: list = field(default_factory=list)
    torch_module: object = None
    family: str = ""


def light_dir() -> str:
    import onnx
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def light_models() -> list[str]:
    """The light models' names (``resnet50``, ``densenet121``, ...)."""
    return sorted(os.path.basename(p)[len("light_"):-len(".onnx")]
                  for p in glob.glob(os.path.join(light_dir(), "light_*.onnx")))


def randomize_light(model, seed: int = 0):
    """Replace the ``ConstantOfShape`` weights of a light model by seeded random initializers."""
    import onnx
    from onnx import numpy_helper
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    users: dict[str, list] = {}
    for n in g.node:
        for i, x in enumerate(n.input):
            users.setdefault(x, []).append((n, i))
    rng = np.random.default_rng(seed)
    keep, new_inits = [], []
    used_shapes = set()
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in inits:
            keep.append(n)
            continue
        shape = tuple(int(d) for d in inits[n.input[0]])
        used_shapes.add(n.input[0])
        roles = users.get(n.output[0], [])
        op, idx = (roles[0][0].op_type, roles[0][1]) if roles else ("", -1)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in roles[0][0].attribute} \
            if roles else {}
        if op == "Conv" and idx == 1:
            fan_in = int(np.prod(shape[1:]))
            arr = rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)
        elif op == "Gemm" and idx == 1:
            fan_in = shape[1] if attrs.get("transB", 0) else shape[0]
            arr = rng.standard_normal(shape) * math.sqrt(1.0 / fan_in)
        elif op == "BatchNormalization" and idx in (1, 4):     # scale, variance
            arr = rng.uniform(0.5, 1.5, shape)
        else:                                                   # biases, means, shifts
            arr = 0.1 * rng.standard_normal(shape)
        new_inits.append(numpy_helper.from_array(arr.astype(np.float32), n.output[0]))
    del g.node[:]
    g.node.extend(keep)
    # drop the shape initializers nobody reads any more
    still_used = {x for n in keep for x in n.input}
    remaining = [t for t in g.initializer if t.name in still_used or t.name not in used_shapes]
    del g.initializer[:]
    g.initializer.extend(remaining + new_inits)
    # old models list initializers among the graph inputs too: drop the removed ones there, and
    # list the new weights as initializers only
    removed = used_shapes - {t.name for t in remaining}
    inputs = [i for i in g.input if i.name not in removed]
    del g.input[:]
    g.input.extend(inputs)
    return model


def calibrate_logits(model, feed: dict, target_std: float = 2.0):
    """Scale the last layer before the final Softmax so that its logits have a standard
    deviation near ``target_std`` on ``feed``: random deep networks grow their activations
    layer by layer, and a saturated softmax (one 1.0, the rest 0) would compare equal however
    wrong the logits were. Uses onnxruntime once; returns a new model (or the same one when
    there is nothing to calibrate)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
    g = model.graph
    soft = [n for n in g.node if n.op_type == "Softmax" and n.output[0] in
            {o.name for o in g.output}]
    if not soft:
        return model
    producers = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}
    node = producers.get(soft[0].input[0])
    # back through positively homogeneous ops to the last Gemm / Conv with constant weights
    while node is not None and node.op_type in ("Relu", "GlobalAveragePool", "AveragePool",
                                                "Reshape", "Flatten", "MaxPool", "Dropout"):
        node = producers.get(node.input[0])
    if node is None or node.op_type not in ("Gemm", "Conv") or node.input[1] not in inits:
        return model
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    probe.graph.output.extend([onnx.helper.make_empty_tensor_value_info(soft[0].input[0])])
    opts = ort.SessionOptions()
    opts.log_severity_level = 3          # not the warning about the light models' unused input
    sess = ort.InferenceSession(probe.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    logits = sess.run([soft[0].input[0]], feed)[0]
    std = float(np.std(logits))
    if not np.isfinite(std) or std == 0:
        return model
    scale = target_std / std
    out = onnx.ModelProto.FromString(model.SerializeToString())
    names = [node.input[1]] + ([node.input[2]] if len(node.input) > 2 and node.input[2] else [])
    for t in out.graph.initializer:
        if t.name in names:
            t.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(t) * scale)
                                               .astype(np.float32), t.name))
    return out


def light(name: str, seed: int = 0) -> ZooModel:
    import onnx
    path = os.path.join(light_dir(), f"light_{name}.onnx")
    model = randomize_light(onnx.load(path), seed)
    g = model.graph
    init_names = {t.name for t in g.initializer}
    inp = next(i for i in g.input if i.name not in init_names)
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(seed + 1).standard_normal(shape).astype(np.float32)
    model = calibrate_logits(model, {inp.name: x})
    return ZooModel(name, f"onnx light model {name} (random weights), input {tuple(shape)}",
                    model, {inp.name: x}, family="light")


# ---------------------------------------------------------------------------------------------
# models written in PyTorch


def _export(module, args, input_names, dynamic_axes=None, opset: int = 17):
    """``torch.onnx.export`` with the TorchScript exporter into an in-memory ModelProto."""
    import warnings
    import onnx
    import torch
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(args), buf, dynamo=False, opset_version=opset,
                          input_names=input_names, output_names=["output"],
                          dynamic_axes=dynamic_axes, do_constant_folding=True)
    return onnx.load_model_from_string(buf.getvalue())


def _torch_modules():
    """The PyTorch model classes (defined on first use: torch is optional)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class ConvBNAct(nn.Sequential):
        def __init__(self, cin, cout, k=3, stride=1, groups=1, act=True):
            layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                      nn.BatchNorm2d(cout)]
            if act:
                layers.append(nn.ReLU6())
            super().__init__(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hidden = cin * expand
            layers = [] if expand == 1 else [ConvBNAct(cin, hidden, 1)]
            layers += [ConvBNAct(hidden, hidden, 3, stride, groups=hidden),
                       ConvBNAct(hidden, cout, 1, act=False)]
            self.conv = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.conv(x) if self.residual else self.conv(x)

    class MobileNetV2(nn.Module):
        """torchvision's MobileNetV2 (width 1.0)."""

        def __init__(self, classes=1000):
            super().__init__()
            cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                   (6, 160, 3, 2), (6, 320, 1, 1)]
            layers, cin = [ConvBNAct(3, 32, 3, 2)], 32
            for t, c, n, s in cfg:
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers.append(ConvBNAct(cin, 1280, 1))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

        def forward(self, x):
            x = F.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(x, 1))

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        """torchvision's ResNet-18."""

        def __init__(self, classes=1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class BertLayer(nn.Module):
        """Hugging Face's BertLayer (post-LN), attention written out as BertSelfAttention."""

        def __init__(self, d=768, heads=12, ffn=3072):
            super().__init__()
            self.heads, self.dh = heads, d // heads
            self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
            self.attn_out, self.ln1 = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
            self.inter, self.out, self.ln2 = nn.Linear(d, ffn), nn.Linear(ffn, d), \
                nn.LayerNorm(d, eps=1e-12)

        def split(self, x):
            b, s, _ = x.shape
            return x.view(b, s, self.heads, self.dh).permute(0, 2, 1, 3)

        def forward(self, h):
            q, k, v = self.split(self.query(h)), self.split(self.key(h)), self.split(self.value(h))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3)
            ctx = ctx.reshape(h.shape)
            h = self.ln1(self.attn_out(ctx) + h)
            return self.ln2(self.out(F.gelu(self.inter(h))) + h)

    class BertBase(nn.Module):
        """BERT-base: word and position embeddings, layer norm, 12 encoder layers."""

        def __init__(self, vocab=30522, d=768, layers=12, max_len=512):
            super().__init__()
            self.word, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.layers = nn.ModuleList(BertLayer(d) for _ in range(layers))

        def forward(self, input_ids):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            h = self.ln(self.word(input_ids) + self.pos(pos))
            for layer in self.layers:
                h = layer(h)
            return h

    class GPT2Block(nn.Module):
        """Hugging Face's GPT2Block: pre-LN, fused QKV, causal mask from a buffer, gelu_new."""

        def __init__(self, d=768, heads=12, max_len=1024):
            super().__init__()
            self.heads, self.dh = heads, d // heads
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
                                 .view(1, 1, max_len, max_len), persistent=False)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
            q, k, v = (t.view(b, s, self.heads, self.dh).transpose(1, 2) for t in (q, k, v))
            w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
            mask = self.bias[:, :, :s, :s]
            w = torch.where(mask, w, torch.tensor(torch.finfo(w.dtype).min))
            a = torch.matmul(torch.softmax(w, dim=-1), v).transpose(1, 2).reshape(b, s, d)
            x = x + self.c_proj(a)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT2Small(nn.Module):
        """GPT-2 small's decoder: token and position embeddings, 12 blocks, the final norm."""

        def __init__(self, vocab=50257, d=768, layers=12, max_len=1024):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
            self.h = nn.ModuleList(GPT2Block(d) for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)

        def forward(self, input_ids):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            x = self.wte(input_ids) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            return self.ln_f(x)

    class MixerBlock(nn.Module):
        def __init__(self, tokens, d, tok_hidden, ch_hidden):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
            self.tok = nn.Sequential(nn.Linear(tokens, tok_hidden), nn.GELU(),
                                     nn.Linear(tok_hidden, tokens))
            self.ch = nn.Sequential(nn.Linear(d, ch_hidden), nn.GELU(), nn.Linear(ch_hidden, d))

        def forward(self, x):
            x = x + self.tok(self.ln1(x).transpose(1, 2)).transpose(1, 2)
            return x + self.ch(self.ln2(x))

    class MLPMixer(nn.Module):
        """Mixer-S/16: 16x16 patches of a 224x224 image (196 tokens), 8 blocks, hidden 512."""

        def __init__(self, d=512, layers=8, tok_hidden=256, ch_hidden=2048, classes=1000):
            super().__init__()
            self.stem = nn.Conv2d(3, d, 16, 16)
            self.blocks = nn.Sequential(*(MixerBlock(196, d, tok_hidden, ch_hidden)
                                          for _ in range(layers)))
            self.ln = nn.LayerNorm(d, eps=1e-6)
            self.head = nn.Linear(d, classes)

        def forward(self, x):
            x = self.stem(x).flatten(2).transpose(1, 2)
            return self.head(self.ln(self.blocks(x)).mean(dim=1))

    return dict(MobileNetV2=MobileNetV2, ResNet18=ResNet18, BertBase=BertBase,
                GPT2Small=GPT2Small, MLPMixer=MLPMixer)


def _randomize_bn(module, seed: int):
    """Random but sane batch-norm statistics and affine parameters (a fresh BatchNorm is the
    identity, which would hide a wrong folding)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(0.1 * torch.randn(c, generator=g))
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            m.bias.data.copy_(0.1 * torch.randn(c, generator=g))
        if isinstance(m, torch.nn.LayerNorm):
            m.weight.data.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=g))
            m.bias.data.copy_(0.1 * torch.randn(m.bias.shape, generator=g))


def _torch_model(cls_name: str, seed: int):
    import torch
    torch.manual_seed(seed)
    module = _torch_modules()[cls_name]()
    _randomize_bn(module, seed)
    return module.eval()


def _image_model(name, cls_name, description, seed=0) -> ZooModel:
    import torch
    module = _torch_model(cls_name, seed)
    x = torch.from_numpy(np.random.default_rng(seed + 1).standard_normal((1, 3, 224, 224))
                         .astype(np.float32))
    model = _export(module, [x], ["input"])
    return ZooModel(name, description, model, {"input": x.numpy()}, torch_module=module,
                    family="cnn" if name != "mlp_mixer" else "mixer")


def mobilenet_v2(seed: int = 0) -> ZooModel:
    return _image_model("mobilenet_v2", "MobileNetV2", "MobileNet-V2 (torchvision's), "
                        "1x3x224x224, random weights", seed)


def resnet18(seed: int = 0) -> ZooModel:
    return _image_model("resnet18", "ResNet18", "ResNet-18 (torchvision's), 1x3x224x224, "
                        "random weights", seed)


def mlp_mixer(seed: int = 0) -> ZooModel:
    return _image_model("mlp_mixer", "MLPMixer", "MLP-Mixer S/16, 1x3x224x224, random weights",
                        seed)


def _text_model(name, cls_name, description, vocab, seq=128, extra_seq=(7,), seed=0):
    import torch
    module = _torch_model(cls_name, seed)
    rng = np.random.default_rng(seed + 1)
    ids = rng.integers(0, vocab, (1, seq)).astype(np.int64)
    model = _export(module, [torch.from_numpy(ids)], ["input_ids"],
                    dynamic_axes={"input_ids": {1: "seq_len"}, "output": {1: "seq_len"}})
    extra = [{"input_ids": rng.integers(0, vocab, (1, s)).astype(np.int64)} for s in extra_seq]
    return ZooModel(name, description, model, {"input_ids": ids}, {"seq_len": 128}, extra,
                    torch_module=module, family="transformer")


def bert_base(seed: int = 0) -> ZooModel:
    return _text_model("bert_base", "BertBase", "BERT-base encoder (12 layers, 768, 12 heads), "
                       "seq_len symbolic, timed at 1x128", 30522, seed=seed)


def gpt2_small(seed: int = 0) -> ZooModel:
    return _text_model("gpt2_small", "GPT2Small", "GPT-2 small decoder stack (12 blocks, "
                       "causal), seq_len symbolic, timed at 1x128", 50257, seed=seed)


def bert_layer(seed: int = 0) -> ZooModel:
    m = bert_encoder_layer(seed=seed)
    rng = np.random.default_rng(seed + 1)
    (x,) = m.make_inputs(rng, batch=1, seq_len=128)
    (x7,) = m.make_inputs(rng, batch=1, seq_len=7)
    return ZooModel("bert_layer", "one BERT-base encoder layer (tilecraft.models), batch and "
                    "seq_len symbolic, timed at 1x128x768", m.onnx_model, {"x": x},
                    {"batch": 1, "seq_len": 128}, [{"x": x7}], family="transformer")


def mlp(seed: int = 0) -> ZooModel:
    m = mlp_builder(seed=seed)
    rng = np.random.default_rng(seed + 1)
    (x,) = m.make_inputs(rng, batch=1)
    (x5,) = m.make_inputs(rng, batch=5)
    return ZooModel("mlp", "4-layer perceptron 784-1024-1024-1024-10 (tilecraft.models), batch "
                    "symbolic, timed at 1x784", m.onnx_model, {"x": x}, {"batch": 8}, [{"x": x5}],
                    family="mlp")


def _light_builder(name):
    return lambda seed=0: light(name, seed)


ZOO: dict[str, Callable[..., ZooModel]] = {n: _light_builder(n) for n in light_models()}
ZOO.update({"mobilenet_v2": mobilenet_v2, "resnet18": resnet18, "bert_layer": bert_layer,
            "bert_base": bert_base, "gpt2_small": gpt2_small, "mlp_mixer": mlp_mixer, "mlp": mlp})

# the models written in PyTorch here: without torch (the [torch] extra) their rows are skipped
NEEDS_TORCH = frozenset({"mobilenet_v2", "resnet18", "bert_base", "gpt2_small", "mlp_mixer"})
