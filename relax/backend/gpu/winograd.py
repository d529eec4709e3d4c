"""Winograd F(2x2, 3x3) for GPU targets: an NCHW 3x3 stride-1 convolution as an input
transform, 16 GEMMs on the GEMM rule, and an output transform with the epilogue fused.

Lavin and Gray's minimal filtering (*Fast Algorithms for Convolutional Neural Networks*, 2016;
the CPU family ``relax.backend.cpu.winograd`` has the derivation): each 2 x 2 tile of output
pixels is ``A^T [(G g G^T) * (B^T d B)] A`` for the 4 x 4 input patch ``d`` at twice the tile's
position; summed over the input channels, the elementwise product becomes 16 independent matrix
products, one per position ``ab`` of the 4 x 4 transformed patch. They take 16 * C * O
multiply-adds per tile against 36 * C * O for the direct convolution of its four pixels (2.25x
fewer; on a 7 x 7 image, whose 4 x 4 tiles cover 8 x 8, 1.7x).

Stages of ``conv2d_nchw_winograd`` (one ``PrimFunc``, three kernels after the default GPU
schedules, ``relax.gpu_schedules``):

1. ``winograd_input``: ``V[n, ab, c, t] = (B^T d B)[a, b]`` for tile ``t`` of image ``n``,
   the tiles of an image padded up to a multiple of ``TILE_PAD`` (the padded tiles are zeros).
   The padding of the convolution is read as guarded zeros (no padded copy of the image); each
   term is one of four taps with a sign. An elementwise kernel (the block carries
   ``KEEP_STAGE``, so the default schedule does not inline it into the GEMM's fetch, where it
   would be recomputed for every tile of output channels).
2. ``winograd_gemm``: ``M[n, ab, o, t] = sum_c U[ab, o, c] * V[n, ab, c, t]``, a batch matmul
   (``(O x C) @ (C x T)`` per image and position) that the GEMM rule (``gemm.schedule_gemm``)
   tiles like any other: rows the output channels, columns the tiles, ``ab`` fused with the
   row tiles on ``blockIdx.y``, the symbolic batch on ``blockIdx.z`` (up to three tiles by
   batch: ``batch_dispatch``). ``U = G g G^T`` (``[16, O, C]``) is computed once at build
   time: in numpy for a constant weight (``winograd_weight_numpy``), else by the kernel
   ``pack_winograd_weight`` (which ``FoldConstant`` runs where it can).
3. ``conv2d_nchw``: ``Y = A^T M A``: each output pixel is the sum of the 9 ``M`` values its
   position in the tile takes (coefficients +-1); the elementwise epilogue (bias, residual,
   activation) that ``FuseOps`` fused after the convolution is inlined into it.

F(2x2, 3x3)'s transforms have coefficients 0, 1/2 and 1, so the float32 results differ from
the direct convolution by rounding only (about 1e-6 relative). F(4x4, 3x3) (4x fewer
multiply-adds) loses about three decimal digits and is not used.

float16 (a ``ToMixedPrecision`` model): float16 weights (``U`` computed in float64 and rounded
once), float16 or float32 data, the input transform summed in float32 and ``V`` stored in
float16, the GEMM accumulating in the convolution's result dtype (float32 or float16).

Where it is used (``winograd_applies``, the rule ``GPUWinograd`` checks): float32 (or float16
as above), 3x3, stride
1, no dilation, one group, at least ``MIN_CHANNELS`` (64) input and output channels, and an
output image of ``MIN_IMAGE`` (7) to ``MAX_IMAGE`` (14) pixels a side. Fewer channels leave the GEMMs too
small for the tile and the transforms' memory traffic (which scales with ``C + O``) too large
next to the saved multiply-adds (which scale with ``C * O``).

Examples
--------
>>> from tilecraft.relax.backend.cpu.geometry import ConvGeometry
>>> g = ConvGeometry(256, 14, 14, 256, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
>>> winograd_applies(g), winograd_tiles(g)
(True, (7, 7, 64))
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir import te

from ..cpu.geometry import ConvGeometry, ceil_div
from .schedule_utils import KEEP_STAGE

__all__ = ["MIN_CHANNELS", "MIN_IMAGE", "MAX_IMAGE", "TILE_PAD", "winograd_applies", "winograd_tiles",
           "pack_winograd_weight", "winograd_weight_numpy", "conv2d_nchw_winograd"]

# F(2, 3): B^T (4 x 4), G (4 x 3), A^T (2 x 4)
B_T = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))
A_T = ((1, 1, 1, 0), (0, 1, -1, -1))
ALPHA = 4      # the transformed patch is ALPHA x ALPHA
TILE = 2       # output pixels per tile side

# The fewest input and output channels that take it. ResNet-50's stride-1 3x3 layers have
# 64-512; below 64 the per-position GEMMs are too thin for the GEMM tile (64 rows of output
# channels fill half of one) and the transforms, which move (16/4) * C + 16 * O words per
# tile, cost more next to the 20 * C * O multiply-adds saved.
MIN_CHANNELS = 64
# The smallest output image side: below 7 x 7 an image has at most 9 tiles, too few columns
# for the GEMM tile.
MIN_IMAGE = 7
# The largest output image side. Measured on the H100 (OpenCL, `benchmarks/gpu_convs.py`,
# ResNet-50's stride-1 3x3 layers, ms direct / Winograd): 56 x 56 (64 ch) b1 0.058 / 0.152,
# b16 0.153 / 0.693; 28 x 28 (128 ch) b1 0.085 / 0.125, b16 0.141 / 0.940; 14 x 14 (256 ch)
# b1 0.320 / 0.096, b16 0.397 / 0.144; 7 x 7 (512 ch) b1 0.145 / 0.114, b16 0.182 / 0.177.
# On the large images the direct implicit GEMM already has enough work-groups and its window
# reuse, while the transforms' traffic over V and M (16/4 x the activation) dominates.
MAX_IMAGE = 14
# An image's tiles are padded to a multiple of this (the GEMM's columns): 49 tiles of a 14 x 14
# image become 64 = 16 threads x 4 registers, whose column tile reads its fragments as float4
# and has no bounds checks.
TILE_PAD = 16


def winograd_applies(g: ConvGeometry, min_channels: int = MIN_CHANNELS) -> bool:
    """Whether the convolution ``g`` runs as Winograd F(2x2, 3x3) on a GPU: 3x3, stride 1, no
    dilation, one group, ``min_channels`` (default ``MIN_CHANNELS``) or more input and output
    channels, an output of ``MIN_IMAGE`` to ``MAX_IMAGE`` pixels a side.

    Examples
    --------
    >>> from tilecraft.relax.backend.cpu.geometry import ConvGeometry
    >>> winograd_applies(ConvGeometry(64, 56, 56, 64, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1))
    False
    """
    return (g.kernel == (3, 3) and g.strides == (1, 1) and g.dilation == (1, 1) and
            g.groups == 1 and min(g.in_channels, g.out_channels) >= min_channels and
            min(g.out_h, g.out_w) >= MIN_IMAGE and max(g.out_h, g.out_w) <= MAX_IMAGE)


def winograd_tiles(g: ConvGeometry) -> tuple[int, int, int]:
    """``(tiles down, tiles across, padded tile count)`` of one image of ``g`` (an odd output
    size takes a last tile half outside, whose outside pixels are computed and not written).
    """
    th, tw = ceil_div(g.out_h, TILE), ceil_div(g.out_w, TILE)
    return th, tw, ceil_div(th * tw, TILE_PAD) * TILE_PAD


def _pick(i, values, dtype: str):
    """``values[i]`` for an index expression ``i``: a chain of selects (folded where ``i`` is a
    constant)."""
    expr = te.const(values[-1], dtype)
    for k in range(len(values) - 2, -1, -1):
        expr = te.if_then_else(i == k, te.const(values[k], dtype), expr)
    return expr


def pack_winograd_weight(weight: te.Tensor, kernel_layout: str = "OIHW") -> te.Tensor:
    """The transformed filter ``U[a * 4 + b, o, i] = (G g G^T)[a, b]`` of a 3 x 3 ``weight``
    (letters ``OIHW`` in any order): the row input of the 16 GEMMs, ``[16, O, I]``.

    Examples
    --------
    >>> w = te.placeholder((64, 32, 3, 3), "float32", "w")
    >>> [d.value for d in pack_winograd_weight(w).shape]
    [16, 64, 32]
    """
    dims = {c: weight.shape[kernel_layout.index(c)] for c in "OIHW"}
    dtype = weight.dtype

    def f(ab, o, i):
        a, b = ab // ALPHA, ab % ALPHA
        total = te.const(0, dtype)
        for kh in range(3):
            for kw in range(3):
                at = {"O": o, "I": i, "H": kh, "W": kw}
                coef = _pick(a, [G[k][kh] for k in range(ALPHA)], dtype) * \
                    _pick(b, [G[k][kw] for k in range(ALPHA)], dtype)
                total = total + coef * weight[tuple(at[c] for c in kernel_layout)]
        return total

    return te.compute((ALPHA * ALPHA, dims["O"], dims["I"]), f, "winograd_weight")


def winograd_weight_numpy(weight: np.ndarray, kernel_layout: str = "OIHW") -> np.ndarray:
    """``pack_winograd_weight`` of a constant weight, in numpy (``GPUWinograd`` uses it for
    constant weights: no kernel to compile and run at build time). Computed in float64 and
    rounded once to the weight's dtype.

    Examples
    --------
    >>> w = np.ones((2, 3, 3, 3), "float32")
    >>> u = winograd_weight_numpy(w)
    >>> u.shape, float(u[5, 0, 0])          # (G 1 1^T)[1, 1] = 1.5 * 1.5
    ((16, 2, 3), 2.25)
    """
    w = np.transpose(weight, [kernel_layout.index(c) for c in "OIHW"]).astype("float64")
    g = np.array(G, dtype="float64")
    u = np.einsum("ak,oikl,bl->aboi", g, w, g)     # (4, 4, O, I)
    return u.reshape(ALPHA * ALPHA, *u.shape[2:]).astype(weight.dtype)


def conv2d_nchw_winograd(data: te.Tensor, weight: te.Tensor, g: ConvGeometry,
                         out_dtype: str = "float32") -> te.Tensor:
    """The NCHW convolution ``g`` of ``data`` ``(N, C, H, W)`` by Winograd F(2x2, 3x3), the
    weight transformed by ``pack_winograd_weight`` (``[16, O, C]``). Blocks
    ``winograd_input``, ``winograd_gemm``, ``conv2d_nchw`` (see the module docstring).

    Examples
    --------
    >>> from tilecraft.relax.backend.cpu.geometry import ConvGeometry
    >>> g = ConvGeometry(64, 8, 8, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> x = te.placeholder((te.var("n"), 64, 8, 8), "float32", "x")
    >>> u = te.placeholder((16, 64, 64), "float32", "u")
    >>> [str(d) for d in conv2d_nchw_winograd(x, u, g).shape]
    ['n', '64', '8', '8']
    """
    if not (g.kernel == (3, 3) and g.strides == (1, 1) and g.dilation == (1, 1) and
            g.groups == 1):
        raise ValueError(f"conv2d_nchw_winograd: F(2x2, 3x3) does not compute {g}")
    n = data.shape[0]
    pt, pl = g.padding[0], g.padding[1]
    th, tw, tiles_pad = winograd_tiles(g)
    tiles = th * tw
    # the input transform sums in float32 (float16 data: converted as read) and is stored in
    # the transformed weight's dtype (float16 weights: V in float16, rounded once)
    dtype = "float32" if data.dtype == "float16" else data.dtype
    v_dtype = weight.dtype
    zero = te.const(0, dtype)

    # 1. V = B^T d B: each row of B^T has two nonzero entries, +1 and +-1, at these taps
    nonzero = [[k for k, v in enumerate(row) if v] for row in B_T]
    taps = [[r[0] for r in nonzero], [r[1] for r in nonzero]]
    signs = [[float(B_T[a][taps[u][a]]) for a in range(ALPHA)] for u in range(2)]

    def v_at(b_, ab, c, t):
        a, b = ab // ALPHA, ab % ALPHA
        y0, x0 = (t // tw) * TILE - pt, (t % tw) * TILE - pl
        total = zero
        for u in range(2):
            ia, sa = _pick(a, taps[u], a.dtype), _pick(a, signs[u], dtype)
            for v in range(2):
                ib, sb = _pick(b, taps[v], b.dtype), _pick(b, signs[v], dtype)
                yy, xx = y0 + ia, x0 + ib
                # the convolution's padding (and the part of a last tile past the image) read
                # as guarded zeros; the padded tiles (t >= tiles) are zeros
                inside = te.all(t < tiles, yy >= 0, yy < g.height, xx >= 0, xx < g.width)
                x = data[b_, c, yy, xx]
                x = x if x.dtype == dtype else x.astype(dtype)
                total = total + sa * sb * te.if_then_else(inside, x, zero)
        return total if v_dtype == dtype else total.astype(v_dtype)

    v = te.compute((n, ALPHA * ALPHA, g.in_channels, tiles_pad), v_at, "winograd_input",
                   attrs={KEEP_STAGE: 1})

    # 2. M[ab] = U[ab] @ V[ab], per image
    k = te.reduce_axis((0, g.in_channels), "rc")
    m = te.compute((n, ALPHA * ALPHA, g.out_channels, tiles_pad),
                   lambda b_, ab, o, t: te.sum(weight[ab, o, k].astype(out_dtype) *
                                               v[b_, ab, k, t].astype(out_dtype), axis=k),
                   "winograd_gemm")

    # 3. Y = A^T M A: output row ry of a tile takes rows a = ry .. ry + 2 of M with the
    # coefficients A^T[ry, a] (row 0: 1, 1, 1; row 1: 1, -1, -1), and the same across
    def y_at(b_, o, y, x):
        t = (y // TILE) * tw + x // TILE
        ry, rx = y % TILE, x % TILE
        total = te.const(0, out_dtype)
        for u in range(3):
            cu = te.const(1, out_dtype) if u == 0 else \
                te.if_then_else(ry == 0, te.const(1, out_dtype), te.const(-1, out_dtype))
            for w in range(3):
                cw = te.const(1, out_dtype) if w == 0 else \
                    te.if_then_else(rx == 0, te.const(1, out_dtype), te.const(-1, out_dtype))
                total = total + cu * cw * m[b_, (ry + u) * ALPHA + rx + w, o, t]
        return total

    return te.compute((n, g.out_channels, g.out_h, g.out_w), y_at, "conv2d_nchw")
