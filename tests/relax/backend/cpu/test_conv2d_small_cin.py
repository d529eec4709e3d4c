"""A small-Cin convolution's padded input rows (relax.backend.cpu.conv2d_nchw_cvec,
``reads_input_rows``): the channel-vector kernel of a stem (1-4 input channels, padding) fills
each output row's padded input rows into a small buffer instead of padding the whole image,
where the rows and the weights fit L1 (else the padded image, as before: the 7x7 case).
Against numpy on random data: odd sizes, strides 1 and 2, asymmetric (TF-style) padding, 3x3
to 7x7 windows, a symbolic batch, the NCHW output and the NHWC one (ConvertLayout's head),
with the bias and ReLU6 fused."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.backend.cpu import ConvGeometry, conv2d_strategy, cpu_tile_params
from tilecraft.relax.backend.cpu import conv2d_nchw_cvec as cvec
from tilecraft.relax.transform import AlterLayout
from tilecraft.targets import Target
from tilecraft.tensorir.function import PrimFunc

RNG = np.random.default_rng(30)

CASES = [  # (cin, h, w, cout, k, stride, padding (top, left, bottom, right))
    (3, 37, 29, 32, 3, 2, (1, 1, 1, 1)),       # MobileNet-V2's stem, odd sizes
    (3, 21, 22, 32, 3, 2, (0, 0, 1, 1)),       # TF-style "same": pad bottom / right only
    (1, 19, 23, 16, 3, 1, (1, 1, 1, 1)),       # one channel, stride 1
    (2, 20, 17, 32, 5, 2, (2, 1, 2, 3)),       # asymmetric
    (4, 15, 15, 64, 7, 2, (3, 3, 3, 3)),       # ResNet's 7x7 stem: its weights fill L1
    (3, 12, 40, 16, 3, 1, (1, 1, 1, 1)),       # a wide row: several tiles
]


def _layer(cin, h, w, cout, k, stride, padding, out_layout):
    wt = (RNG.standard_normal((cout, cin, k, k)) * 0.5).astype("float32")
    b = RNG.standard_normal(cout).astype("float32")
    x = Var("x", TensorStructInfo(("n", cin, h, w), "float32"))
    bias = b.reshape((1, 1, 1, cout) if out_layout == "NHWC" else (1, cout, 1, 1))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(wt), strides=stride, padding=padding,
                                     out_layout=out_layout))
            y = bb.emit(op.add(y, const(bias)))
            gv = bb.emit_output(bb.emit(op.clip(y, 0.0, 6.0)))
        bb.emit_func_output(gv)
    return bb.get(), wt, b


def _reference(x, wt, b, stride, padding, out_layout):
    """``clip(conv2d(x, wt) + b, 0, 6)`` in float64 numpy, NCHW data."""
    pt, pl, pb, pr = padding
    k = wt.shape[2]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (xp.shape[2] - k) // stride + 1
    ow = (xp.shape[3] - k) // stride + 1
    out = sum(np.einsum("nchw,oc->nohw",
                        xp[:, :, a:a + stride * (oh - 1) + 1:stride,
                           c:c + stride * (ow - 1) + 1:stride], wt[:, :, a, c])
              for a in range(k) for c in range(k)) + b[None, :, None, None]
    out = np.clip(out, 0, 6)
    return out.transpose(0, 2, 3, 1) if out_layout == "NHWC" else out


def _force_cvec(monkeypatch):
    """The channel-vector kernel for every NCHW convolution and head, whatever the host's
    registers (with 16, ``head_conv_plan`` gives none and the strategy may pick the flat
    kernel)."""
    def plan(g, lanes, registers):
        return cvec.plan_conv2d_nchw_cvec(g, lanes, registers)
    monkeypatch.setattr(conv2d_strategy, "nchw_kernel_plan", plan)
    monkeypatch.setattr(conv2d_strategy, "head_conv_plan", plan)


@pytest.mark.parametrize("out_layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", CASES, ids=[f"cin{c[0]}_{c[4]}x{c[4]}s{c[5]}" for c in CASES])
def test_small_cin_rows_match_numpy(case, out_layout, monkeypatch):
    _force_cvec(monkeypatch)
    cin, h, w, cout, k, stride, padding = case
    mod, wt, b = _layer(cin, h, w, cout, k, stride, padding, out_layout)
    lanes, registers = cpu_tile_params(Target("llvm"))
    g = ConvGeometry(cin, h, w, cout, (k, k), (stride, stride), padding, (1, 1), 1)
    rows = cvec.reads_input_rows(cvec.plan_conv2d_nchw_cvec(g, lanes, registers))
    assert rows == (k < 7)
    altered = AlterLayout("llvm")(mod)
    kernels = [f.script() for _, f in altered.functions.items() if isinstance(f, PrimFunc)]
    assert sum('T.block("conv2d_rows")' in s for s in kernels) == int(rows)
    assert sum('T.block("data_pad")' in s for s in kernels) == int(not rows)
    vm = relax.VirtualMachine(relax.build(mod, "llvm"))
    for n in (1, 3):
        x = RNG.standard_normal((n, cin, h, w)).astype("float32")
        np.testing.assert_allclose(vm["main"](x).numpy(),
                                   _reference(x, wt, b, stride, padding, out_layout),
                                   rtol=1e-4, atol=1e-4)


def test_rows_only_for_small_padded_layers():
    def applies(cin, padding, groups=1):
        g = ConvGeometry(cin, 20, 20, 32, (3, 3), (2, 2), padding, (1, 1), groups)
        return cvec.reads_input_rows(cvec.ChannelVectorPlan(g, 2, 32, 16))
    assert applies(3, (1, 1, 1, 1)) and applies(4, (0, 0, 1, 1))
    assert not applies(cvec.SMALL_CIN + 1, (1, 1, 1, 1))     # the image-sized padded copy
    assert not applies(3, (0, 0, 0, 0))                        # nothing to pad: read in place
    assert not applies(4, (1, 1, 1, 1), groups=2)
    wide = ConvGeometry(3, 224, 224, 64, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1)
    assert not cvec.reads_input_rows(cvec.ChannelVectorPlan(wide, 4, 64, 16))  # past L1
    g = ConvGeometry(3, 20, 20, 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    plan = cvec.ChannelVectorPlan(g, 2, 32, 16)
    assert not cvec.reads_input_rows(plan, "NHWC")                   # NHWC data
    assert not cvec.reads_input_rows(cvec.ChannelVectorPlan(g, 2, 32, 16, across_rows=True))
