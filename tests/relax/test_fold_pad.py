"""FoldPad: which explicit pads fold into the conv2d / pooling reading them (and which must not),
and the built model's results against PyTorch on random inputs, static and symbolic batch."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.printer import to_script
from tilecraft.relax.transform import FoldPad, get_pipeline

RNG = np.random.default_rng(30)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def module(batch, c, hw, consumer, pad_width, pad_value=0.0, pad_mode="constant"):
    """``consumer(pad(x))`` as a Relax module over ``x`` ``(batch, c, hw, hw)``."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, c, hw, hw), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(op.pad(x, pad_width, pad_value=pad_value, pad_mode=pad_mode))
            gv = bb.emit_output(bb.emit(consumer(p)))
        bb.emit_func_output(gv)
    return bb.get()


def pads_left(mod) -> int:
    return to_script(mod).count("R.pad(")


def torch_pad(x, pad_width, value, mode):
    pairs = [pad_width[i:i + 2] for i in range(0, len(pad_width), 2)]
    widths = tuple(w for pair in reversed(pairs) for w in pair)   # last dim first, as torch
    if mode == "constant":
        return F.pad(x, widths, value=value)
    return F.pad(x, widths[:4], mode=mode)


W_DW = rand(8, 1, 3, 3)
W_FULL = rand(6, 8, 3, 3)

# (name, consumer, torch reference of consumer, pad_width, pad_value, mode, folds)
CASES = [
    ("tf_same_depthwise_s2",
     lambda p: op.nn.conv2d(p, const(W_DW), strides=2, groups=8),
     lambda t: F.conv2d(t, torch.from_numpy(W_DW), stride=2, groups=8),
     [0, 0, 0, 0, 0, 1, 0, 1], 0.0, "constant", True),
    ("onto_own_padding",
     lambda p: op.nn.conv2d(p, const(W_FULL), padding=1),
     lambda t: F.conv2d(t, torch.from_numpy(W_FULL), padding=1),
     [0, 0, 0, 0, 1, 2, 0, 1], 0.0, "constant", True),
    ("nonzero_value_into_conv",
     lambda p: op.nn.conv2d(p, const(W_FULL)),
     lambda t: F.conv2d(t, torch.from_numpy(W_FULL)),
     [0, 0, 0, 0, 1, 1, 1, 1], 0.5, "constant", False),
    ("reflect_into_conv",
     lambda p: op.nn.conv2d(p, const(W_FULL)),
     lambda t: F.conv2d(t, torch.from_numpy(W_FULL)),
     [0, 0, 0, 0, 1, 1, 1, 1], 0.0, "reflect", False),
    ("channels_padded",
     lambda p: op.nn.max_pool2d(p, pool_size=2, strides=2),
     lambda t: F.max_pool2d(t, 2, 2),
     [0, 0, 1, 1, 0, 0, 0, 0], -math.inf, "constant", False),
    ("neg_inf_into_max_pool",
     lambda p: op.nn.max_pool2d(p, pool_size=3, strides=2, padding=1),
     lambda t: F.max_pool2d(t, 3, 2, padding=1),
     [0, 0, 0, 0, 0, 1, 0, 1], -math.inf, "constant", True),
    ("lowest_float32_into_max_pool",
     lambda p: op.nn.max_pool2d(p, pool_size=2, strides=2),
     lambda t: F.max_pool2d(t, 2, 2),
     [0, 0, 0, 0, 1, 0, 1, 0], -3.4028234663852886e38, "constant", True),
    ("zero_into_max_pool",
     lambda p: op.nn.max_pool2d(p, pool_size=3, strides=2),
     lambda t: F.max_pool2d(t, 3, 2),
     [0, 0, 0, 0, 1, 1, 1, 1], 0.0, "constant", False),
    ("zero_into_avg_pool",
     lambda p: op.nn.avg_pool2d(p, pool_size=3, strides=2),
     lambda t: F.avg_pool2d(t, 3, 2),
     [0, 0, 0, 0, 1, 1, 1, 1], 0.0, "constant", True),
    ("zero_into_avg_pool_excluding_its_padding",
     lambda p: op.nn.avg_pool2d(p, pool_size=3, strides=2, padding=1),
     lambda t: F.avg_pool2d(t, 3, 2, padding=1, count_include_pad=False),
     [0, 0, 0, 0, 1, 0, 1, 0], 0.0, "constant", False),
    ("ceil_mode_max_pool",
     lambda p: op.nn.max_pool2d(p, pool_size=2, strides=2, ceil_mode=True),
     lambda t: F.max_pool2d(t, 2, 2, ceil_mode=True),
     [0, 0, 0, 0, 1, 0, 1, 0], -math.inf, "constant", False),
    ("crop_is_not_padding",
     lambda p: op.nn.conv2d(p, const(W_FULL), padding=1),
     lambda t: F.conv2d(t, torch.from_numpy(W_FULL), padding=1),
     [0, 0, 0, 0, -1, 1, 0, 0], 0.0, "constant", False),
    ("zero_widths",
     lambda p: op.nn.conv2d(p, const(W_FULL), padding=1),
     lambda t: F.conv2d(t, torch.from_numpy(W_FULL), padding=1),
     [0, 0, 0, 0, 0, 0, 0, 0], 0.0, "reflect", True),
]


def torch_ref(x, pad_width, value, mode, ref):
    t = torch.from_numpy(x)
    if min(pad_width) < 0:        # a crop: slice, then pad the rest
        (t0, b0), (l0, r0) = (pad_width[4], pad_width[5]), (pad_width[6], pad_width[7])
        h, w = t.shape[2:]
        t = t[:, :, max(-t0, 0):h - max(-b0, 0), max(-l0, 0):w - max(-r0, 0)]
        t = F.pad(t, (max(l0, 0), max(r0, 0), max(t0, 0), max(b0, 0)), value=value)
    else:
        t = torch_pad(t, pad_width, value, mode)
    return ref(t).numpy()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fold_pad_structure(case):
    _, consumer, _, pad_width, value, mode, folds = case
    mod = module(1, 8, 9, consumer, pad_width, value, mode)
    assert pads_left(mod) == 1
    assert pads_left(FoldPad()(mod)) == (0 if folds else 1)
    assert pads_left(mod) == 1         # the input module is unchanged


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fold_pad_built_matches_torch(case):
    _, consumer, ref, pad_width, value, mode, _ = case
    mod = module("n", 8, 9, consumer, pad_width, value, mode)
    exe = relax.build(mod, "llvm", upper_bounds={"n": 4})
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    for batch in (1, 3):
        x = rand(batch, 8, 9, 9)
        got = vm["main"](x).numpy()
        np.testing.assert_allclose(got, torch_ref(x, pad_width, value, mode, ref),
                                   rtol=1e-4, atol=1e-4)


def test_fold_pad_in_default_pipeline():
    names = [p.name for p in get_pipeline(target="llvm").passes]
    assert names.index("FoldPad") < names.index("AlterLayout")


def test_fold_pad_keeps_a_pad_with_other_uses():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 8, 9, 9), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(op.pad(x, [0, 0, 0, 0, 0, 1, 0, 1]))
            c = bb.emit(op.nn.conv2d(p, const(W_DW), strides=2, groups=8))
            gv = bb.emit_output(bb.emit(op.sum(p)))
            gv2 = bb.emit_output(c)
        bb.emit_func_output(relax.Tuple([gv, gv2]))
    text = to_script(FoldPad()(bb.get()))
    assert text.count("R.pad(") == 1                 # still feeds the sum
    assert "padding=[0, 0, 1, 1]" in text.replace("(", "[").replace(")", "]")
