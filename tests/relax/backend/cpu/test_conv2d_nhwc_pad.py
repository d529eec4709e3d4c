"""The NHWC convolution's padded copy of its input (relax.backend.cpu.padding.pad_nhwc): its
channel loop vectorizes (the channel read unclamped, the guard keeping it inside), with and
without the extra cache line of channels of a 1 KiB pixel; the layers against numpy."""
import numpy as np
import pytest

from nhwc_testutil import check_nhwc_layer, nhwc_conv_layer
from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax import default_schedules as ds
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import BufferStore, For
from tilecraft.tensorir.transform import lower

RNG = np.random.default_rng(53)


def _pad_loop_kinds(cin, hw, stride):
    x = Var("x", TensorStructInfo((1, hw, hw, cin), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.conv2d(
                x, const(np.zeros((3, 3, cin, 32), "float32")), strides=stride, padding=1,
                data_layout="NHWC", kernel_layout="HWIO")))
        bb.emit_func_output(gv)
    target = targets.Target("llvm")
    kinds = []
    for task in relax.extract_tasks(bb.get(), target, baselines=False):
        func = lower(ds.apply(task.func, target))

        def visit(node):
            # the innermost loop whose body stores the padded copy
            if isinstance(node, For) and isinstance(node.body, BufferStore) and \
                    node.body.buffer.name == "data_pad":
                kinds.append(node.kind)
        post_order_visit(func.body, visit)
    return kinds


@pytest.mark.parametrize("cin", [64, 256])      # 256: a 1 KiB pixel, 16 more channels
def test_pad_channel_loop_is_vectorized(cin):
    assert _pad_loop_kinds(cin, 9, 2) == ["vectorized"]


@pytest.mark.parametrize("cin,hw,cout,stride", [(256, 9, 32, 2), (40, 11, 32, 1),
                                                 (64, 12, 48, 2)])
def test_padded_layers_match_numpy(cin, hw, cout, stride):
    exe, wt, b = nhwc_conv_layer(cin, hw, hw, cout, 3, RNG, stride=stride)
    check_nhwc_layer(exe, wt, b, RNG, hw, hw, stride, batches=(1, 2))
