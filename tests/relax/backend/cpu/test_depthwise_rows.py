"""The depthwise row kernel's vector length (relax.backend.cpu.depthwise); its results against
numpy are in tests/relax/test_alter_layout.py."""
from tilecraft.relax.backend.cpu import ConvGeometry, depthwise
from tilecraft.targets import Target


def test_row_vector_avoids_a_tail():
    assert depthwise._row_vector(56, 16) == 14          # 4 x 14, not 3 x 16 + a masked 8
    assert depthwise._row_vector(112, 16) == 16
    assert depthwise._row_vector(7, 16) == 7
    assert depthwise._row_vector(25, 16) == 16          # no divisor from 8 to 16: the tail stays
    assert depthwise._row_vector(None, 8) == 8


def test_rows_kernel_is_for_strided_depthwise_layers_on_x86():
    x86, arm = Target("llvm -mtriple=x86_64-linux-gnu"), Target("llvm -mtriple=aarch64-linux-gnu")
    strided = ConvGeometry(8, 11, 11, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8)
    unit = ConvGeometry(8, 11, 11, 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 8)
    dense = ConvGeometry(8, 11, 11, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    assert depthwise.depthwise_rows_applies(strided, x86)
    assert not depthwise.depthwise_rows_applies(strided, arm)
    assert not depthwise.depthwise_rows_applies(unit, x86)
    assert not depthwise.depthwise_rows_applies(dense, x86)
