"""Which convolution family runs a convolution: the rules that choose between the flat and the
channel-vector NCHW kernels (``nchw_kernel_plan``) and between the NHWC pixel tile and the
channel-vector tiles on NHWC data (``nhwc_kernel_plan``), the candidates ``relax.tune_layouts``
measures instead (``nchw_plan_candidates``), and a plan's JSON form in a tuning database
(``plan_to_json`` / ``plan_from_json``). (TVM calls such a choice among an operator's
implementations its *strategy*.)

Examples
--------
>>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
>>> plan_to_json(nchw_kernel_plan(g, 16, 32))
{'kind': 'cvec', 'rows': 7, 'width': 32}
"""
from __future__ import annotations

from .conv2d_nchw import NchwPlan, plan_conv2d_nchw
from .conv2d_nchw_cvec import (ChannelVectorPlan, cvec_fits, cvec_tiles_plan, cvec_widest_rows,
                               is_narrow, plan_conv2d_nchw_cvec)
from .conv2d_nhwc import NhwcPlan, nhwc_tile_fills, plan_conv2d_nhwc
from .geometry import ConvGeometry

__all__ = ["nchw_kernel_plan", "nhwc_kernel_plan", "head_conv_plan", "nchw_plan_candidates",
           "plan_to_json", "plan_from_json"]


def nchw_kernel_plan(g: ConvGeometry, lanes: int,
                     registers: int) -> "NchwPlan | ChannelVectorPlan":
    """The NCHW kernel for ``g``: the flat kernel's plan, or the channel-vector plan where the
    flat kernel would waste lanes (an output plane that whole vectors of positions cover
    badly) and the channel-vector tile applies. With 16 registers, a long reduction (512 or
    more multiply-adds per output) takes the tiles across rows (``cvec_tiles_plan``) and a
    strided KxK layer with a short one (a stem) the row tiles with 8 accumulators.

    Examples
    --------
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> type(nchw_kernel_plan(g, 16, 32)).__name__
    'ChannelVectorPlan'
    """
    flat = plan_conv2d_nchw(g, lanes, registers)
    cvec = plan_conv2d_nchw_cvec(g, lanes, registers)
    if cvec is None:
        return flat
    # With 32 registers the flat kernel wins only on large stride-1 planes (ResNet-50's
    # 56 x 56 layers: equal or up to 10% faster); with a stride it copies the input into
    # phase planes, and on small planes it computes junk columns and half-empty vectors
    # (7 x 7: 49 of 64 lanes; 28 x 28: 30 columns for 28), where the channel-vector kernel
    # measured 1.1-1.6x faster (Zen 4). With 16 registers (AVX2) its tiles are too small
    # (12 accumulators less the weight vectors): it won only on the 7 x 7 planes (1.3x) and
    # lost 2-20% elsewhere.
    useful = g.out_h * g.out_w / flat.out_len
    if registers < 32 and g.in_per_group * g.kernel[0] * g.kernel[1] >= 512:
        # With 16 registers the row-dividing tiles are small (12 x 1 and 6 x 2 divide no
        # ResNet plane) and a long reduction streams each channel block's weights from L2
        # for every tile; the tiles across rows keep 12 accumulators and chunk the reduction.
        # Zen 3, ResNet-50's layers with 512 or more multiply-adds per output: 1.0-2.0x
        # faster than either kernel (the 7 x 7 1x1 layers 1.7-2x); with fewer, the flat
        # kernel stayed 5-10% ahead.
        tiles = cvec_tiles_plan(g, lanes, registers)
        if tiles is not None:
            return tiles
    if is_narrow(cvec, registers):
        # a narrow tile (an output width with no fitting divisor: 17, 149) is load-bound:
        # Inception's 3x3 stride-2 layer at 1 x 64 ran at 0.42x onnxruntime, the phased flat
        # kernel at 0.83x (Zen 4)
        return flat
    if registers >= 32:
        return cvec if flat.phased or useful < 0.95 else flat
    if flat.phased and g.kernel != (1, 1):
        # a strided KxK layer (a stem): the flat kernel copies the input into phase planes;
        # the row tiles read it in place. ResNet-50's 7x7 stride-2 stem ran 1.25x faster as
        # 4 x 16 than the flat 4 x 3 (2 x 32, the same 8 accumulators with more weight
        # vectors in registers, ran no faster than flat; Zen 3)
        rows = [(m * (w // lanes), -abs(w // lanes - 2), m, w)
                for m, w in cvec_widest_rows(g, lanes, registers, 12)]
        if rows and max(rows)[0] >= 8:
            _, _, m, w = max(rows)
            return ChannelVectorPlan(g, m, w, lanes)
    return cvec if useful < 0.8 else flat


def nhwc_kernel_plan(g: ConvGeometry, lanes: int,
                     registers: int) -> "NhwcPlan | ChannelVectorPlan | None":
    """The NHWC kernel for ``g``: the pixels x channels tile (``plan_conv2d_nhwc``) when it
    fills the row (or the plane) with 8 or more accumulators (``nhwc_tile_fills``); else,
    with 16 registers and a long reduction (512 or more multiply-adds per output, as in
    ``nchw_kernel_plan``), the channel-vector tiles across rows (``cvec_tiles_plan``, run by
    ``conv2d_nchw_cvec(..., layout="NHWC")``): 3 pixels of the flattened plane, the reduction
    in chunks whose weights stay in L1. On Zen 3 they ran ResNet-50's strided 1x1 layers
    1.09-1.20x faster than the NCHW kernels, where the ragged pixel tile (6 + 1 on a 7-wide
    row) ran 0.73-0.84x; its 3x3 layers on 14- and 7-wide rows 1.1-1.3x faster than that
    tile. None for a grouped convolution whose tile would span groups.

    Examples
    --------
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> type(nhwc_kernel_plan(g, 8, 16)).__name__
    'ChannelVectorPlan'
    >>> g = ConvGeometry(64, 56, 56, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> type(nhwc_kernel_plan(g, 8, 16)).__name__
    'NhwcPlan'
    """
    plan = plan_conv2d_nhwc(g, lanes, registers)
    if plan is None or nhwc_tile_fills(plan):
        return plan
    if registers < 32 and g.in_per_group * g.kernel[0] * g.kernel[1] >= 512 and \
            not g.is_depthwise:
        tiles = cvec_tiles_plan(g, lanes, registers)
        if tiles is not None:
            return tiles
    return plan


def head_conv_plan(g: ConvGeometry, lanes: int, registers: int) -> "ChannelVectorPlan | None":
    """The kernel for ``g`` with NCHW data and an NHWC output (the head of an NHWC chain:
    a stem on the image's few channels, which no NHWC tile runs well), or None: with 32
    registers, ``nchw_kernel_plan``'s choice when it is the channel-vector tile of one row,
    whose accumulators hold each position's channels, so writing NHWC drops the transpose
    of its NCHW write-back and the permutation after it.

    MobileNet-V2's stem (3 -> 32, 3x3 stride 2, 224 x 224; Zen 4, one thread, batch 8):
    the NCHW tile and the permutation to NHWC took 3.6 + 1.2 ms, the NHWC pixel tile on
    the permuted image 6.2 + 0.4 ms.

    Examples
    --------
    >>> g = ConvGeometry(3, 224, 224, 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    >>> p = head_conv_plan(g, 16, 32)
    >>> (p.rows, p.width)
    (8, 32)
    """
    if registers < 32:
        return None     # unmeasured with 16 registers
    plan = nchw_kernel_plan(g, lanes, registers)
    if isinstance(plan, ChannelVectorPlan) and not plan.across_rows:
        return plan
    return None


def nchw_plan_candidates(g: ConvGeometry, lanes: int,
                         registers: int) -> list["NchwPlan | ChannelVectorPlan"]:
    """The NCHW kernels ``relax.tune_layouts`` measures for ``g``: ``nchw_kernel_plan``'s
    choice first, then the flat kernel's best tile for each channel block ``R`` of 2, 4, 8
    and 16 (``plan_conv2d_nchw(..., oc_block=R)``), then the channel-vector tile with the
    most accumulators for each width of one to four vectors; no plan twice.

    Examples
    --------
    >>> g = ConvGeometry(64, 56, 56, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> [plan_to_json(p)["kind"] for p in nchw_plan_candidates(g, 16, 32)][:3]
    ['flat', 'flat', 'flat']
    """
    plans = [nchw_kernel_plan(g, lanes, registers)]
    budget = 24 if registers >= 32 else 12
    for r in (2, 4, 8, 16):
        if r <= budget and g.out_channels % r == 0:
            try:
                plans.append(plan_conv2d_nchw(g, lanes, registers, oc_block=r))
            except ValueError:
                pass     # no tile of that block fits
    acc = 16 if registers >= 32 else 12
    for m, width in cvec_widest_rows(g, lanes, registers, acc):
        if m * (width // lanes) * 2 >= acc:   # half the accumulators or more
            plans.append(ChannelVectorPlan(g, m, width, lanes))
    for v in (4, 2):
        tiles = cvec_tiles_plan(g, lanes, registers, vectors=v)
        if tiles is not None:
            plans.append(tiles)
    out, seen = [], set()
    for p in plans:
        key = tuple(sorted(plan_to_json(p).items()))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def plan_to_json(plan: "NchwPlan | ChannelVectorPlan") -> dict:
    """The tile of an NCHW plan as a JSON object (what a layout decision stores):
    ``{"kind": "flat", "oc_block": R, "vectors": V}`` or
    ``{"kind": "cvec", "rows": M, "width": W}``.

    Examples
    --------
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> plan_to_json(nchw_kernel_plan(g, 16, 32))
    {'kind': 'cvec', 'rows': 7, 'width': 32}
    """
    if isinstance(plan, ChannelVectorPlan):
        out = {"kind": "cvec", "rows": plan.rows, "width": plan.width}
        if plan.across_rows:
            out.update(across_rows=True, k_chunk=plan.k_chunk)
        return out
    return {"kind": "flat", "oc_block": plan.oc_block, "vectors": plan.vectors}


def plan_from_json(g: ConvGeometry, data: dict, lanes: int,
                   registers: int) -> "NchwPlan | ChannelVectorPlan":
    """The plan ``plan_to_json`` wrote, for ``g``; ``ValueError`` naming the problem when it
    does not fit ``g`` (a tile that does not divide the channels or the row, more
    accumulators than registers, an unknown kind).

    Examples
    --------
    >>> g = ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    >>> plan_from_json(g, {"kind": "cvec", "rows": 7, "width": 16}, 16, 32).width
    16
    """
    def pos_int(name):
        v = data.get(name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"conv2d plan {data}: {name!r} must be a positive integer")
        return v
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "cvec":
        rows, width = pos_int("rows"), pos_int("width")
        across = data.get("across_rows", False)
        k_chunk = data.get("k_chunk", 0)
        if not isinstance(across, bool) or not isinstance(k_chunk, int) or \
                isinstance(k_chunk, bool) or k_chunk < 0 or \
                (k_chunk and (not across or g.in_per_group % k_chunk)):
            raise ValueError(f"conv2d plan {data}: 'across_rows' must be a boolean and "
                             f"'k_chunk' 0 or a divisor of the {g.in_per_group} input "
                             f"channels per group (with across_rows)")
        if not cvec_fits(g, rows, width, lanes, registers, across_rows=across):
            raise ValueError(f"conv2d plan {data} does not fit {g} with {lanes} lanes and "
                             f"{registers} registers")
        return ChannelVectorPlan(g, rows, width, lanes, across, k_chunk)
    if kind == "flat":
        r, v = pos_int("oc_block"), pos_int("vectors")
        if g.out_channels % r or r * v > registers:
            raise ValueError(f"conv2d plan {data} does not fit {g} with {registers} registers")
        return plan_conv2d_nchw(g, lanes, registers, oc_block=r, vectors=v)
    raise ValueError(f"conv2d plan {data!r}: kind must be 'flat' or 'cvec'")
