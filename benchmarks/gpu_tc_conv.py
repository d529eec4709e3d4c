"""ResNet-50's convolutions on the tensor-core fp16 kernel (``relax.backend.gpu.tensor_core``,
an implicit GEMM on ``mma.sync``) beside our float32 build of the same layer and PyTorch's
float16 ``conv2d`` (cuDNN) on CUDA, in one process.

Each of ResNet-50's 23 distinct convolution shapes (``LAYERS``; ``count``: how often the
model has it, 53 in all) is ``relu(conv2d(x, W) + b)`` on NCHW data, at batch 1 and 16:

- ``fp32``: the float32 Relax function built for ``Target("opencl -device=nvidia")`` with the
  default pipeline (Winograd where ``GPUWinograd`` takes the layer, else the implicit-GEMM
  schedule), as the float32 model runs it; ``vm.time_evaluator``;
- ``tc`` (and one column a variant, ``TILECRAFT_TC_CONV_VARIANTS``): the fused float16
  function a quantized model has (float16 ``x`` and ``W``, float32 bias, float16 out) through
  ``gpu_schedules.apply`` for the tensor-core target: the kernel alone,
  ``time_evaluator``;
- ``torch_fp16``: ``relu(conv2d(x, W, b))`` in float16 on CUDA, ``cudnn.benchmark`` on, CUDA
  events.

Every tensor-core result is checked before it is timed: at batch 1 against float64 numpy of
the float16 operands, at batch 16 against PyTorch's float16 output (where CUDA is there).
``<variant>_ms`` is the best of 3 repeats of 20 calls; ``tc_vs_fp32`` = fp32 time / tc time,
``tc_vs_torch`` = PyTorch's time / ours (above 1: we are faster); ``tflops`` of ``tc``. The
last rows (``layer`` = ``total``) add up ``count x ms`` per batch: the model's convolutions.

Variants (comma-separated names): ``tc`` (the default build), ``onekernel`` (no column
dispatch, ``TILECRAFT_TC_COLUMN_DISPATCH=0``: one kernel sized for many columns at every
batch, as before the few-columns kernel), ``nohoist`` (the gathered copies without their
hoisting, ``TILECRAFT_TC_GATHER_PLAN=0``: the copy as it was), ``tile:BMxBNxWMxWN`` (a forced
tile, ``TILECRAFT_TC_TILE``, both kernels), ``small:BMxBNxWMxWN`` (the few-columns kernel's
tile forced, ``TILECRAFT_TC_SMALL_TILE``; split-K decided for it), ``oihw`` (the weight
left OIHW and gathered a half at a time, ``TILECRAFT_TC_CONV_OHWI=0``; every other variant
gets the weight as ``relax.transform.ConvWeightOHWI`` stores it: OHWI where ``ohwi_rows``
takes the layer — 3 x 3 on 16k channels — read in 16-byte rows). Default ``tc,onekernel``. ``<variant>_tiles``
says which kernel the batch ran (its tile and split-K), ``tc_vs_<variant>`` = its time / tc's.

Run on the GPU machine: ``python -m benchmarks.gpu_tc_conv`` (about 3-5 minutes: the builds);
``TILECRAFT_TC_CONV_LAYERS`` picks layers by name, ``TILECRAFT_TC_CONV_BATCHES`` (``1,16``).
Here (PoCL, ``opencl -device=nvidia-emulated``): ``TILECRAFT_TC_CONV_SMOKE=1 python -m
benchmarks.gpu_tc_conv``, a check of the script on small shapes (no timing worth reading, no
results written). Results: ``benchmarks/results/gpu_tc_conv/<gpu>.json``.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

from .common import print_table, write_results
from .gpu_common import RESNET50_CONVS, gpu_device, torch_cuda_seconds, with_env

SMOKE = os.environ.get("TILECRAFT_TC_CONV_SMOKE", "") not in ("", "0")
LAYERS = RESNET50_CONVS
# the smoke run: each kind of geometry at small channel counts and image sides
SMOKE_LAYERS = (
    ("stem_7x7s2", 3, 20, 16, 7, 2, 3, 1),
    ("3x3", 32, 14, 32, 3, 1, 1, 1),
    ("3x3s2", 16, 14, 32, 3, 2, 1, 1),
    ("1x1_7", 64, 7, 32, 1, 1, 0, 1),
    ("1x1_8", 32, 8, 64, 1, 1, 0, 1),
    ("1x1s2", 32, 10, 32, 1, 2, 0, 1),
)
BATCHES = [int(b) for b in os.environ.get(
    "TILECRAFT_TC_CONV_BATCHES", "1,5" if SMOKE else "1,16").split(",")]
TC_TARGET = "opencl -device=nvidia-emulated" if SMOKE else "opencl -device=nvidia"
VARIANTS = [v for v in os.environ.get("TILECRAFT_TC_CONV_VARIANTS", "tc,onekernel").split(",")
            if v]


def variant_env(variant: str) -> dict:
    """The build environment of a variant name (see the module docstring).

    >>> variant_env("tile:64x64x32x32")
    {'TILECRAFT_TC_TILE': '64x64x32x32'}
    """
    if variant == "tc":
        return {}
    if variant == "onekernel":
        return {"TILECRAFT_TC_COLUMN_DISPATCH": "0"}
    if variant == "nohoist":
        return {"TILECRAFT_TC_GATHER_PLAN": "0"}
    if variant == "oihw":
        return {"TILECRAFT_TC_CONV_OHWI": "0"}
    if variant.startswith("tile:"):
        return {"TILECRAFT_TC_TILE": variant[len("tile:"):]}
    if variant.startswith("small:"):
        return {"TILECRAFT_TC_SMALL_TILE": variant[len("small:"):]}
    raise ValueError(f"TILECRAFT_TC_CONV_VARIANTS: unknown variant {variant!r} "
                     f"(tc, onekernel, nohoist, oihw, tile:BMxBNxWMxWN, small:BMxBNxWMxWN)")


def weight_layout(variant: str, cin: int, k: int) -> str:
    """The weight layout a variant's build gets: ``"OHWI"`` where ``ConvWeightOHWI`` would
    store the layer's constant weight so under the variant's environment, else ``"OIHW"``.

    >>> weight_layout("tc", 64, 3), weight_layout("oihw", 64, 3), weight_layout("tc", 64, 1)
    ('OHWI', 'OIHW', 'OIHW')
    """
    from tilecraft.relax.transform.conv_weight_ohwi import conv_ohwi_enabled, ohwi_rows
    on = with_env(variant_env(variant), conv_ohwi_enabled)
    return "OHWI" if on and ohwi_rows(cin, k, k) else "OIHW"


def kernel_at(tiles: str, columns: int) -> str:
    """The kernel a call of ``columns`` columns runs, from a kernel's ``tensor_core_tiles``
    (``"<few> below <n> columns, else <many>"`` under the column dispatch).

    >>> kernel_at("32x32x16x16 split-K 6 below 196 columns, else 64x64x32x32", 49)
    '32x32x16x16 split-K 6'
    """
    few, sep, rest = tiles.partition(" below ")
    if not sep or " columns, else " not in rest:
        return tiles
    bound, _, many = rest.partition(" columns, else ")
    return few if columns < int(bound) else many


def weight_loads(src: str, weight: str = "w") -> tuple[int, int]:
    r"""``(loads, halves)``: the global loads of ``weight`` a work-group's threads issue in the
    OpenCL C ``src`` (one thread's load lines, each times its unrolled ``for (int e ...)``
    loops) and the float16 values they bring — 2-byte (``ushort``) loads bring one, 16-byte
    (``uint4``) loads eight — summed over the kernels; ``loads / halves`` is the loads per
    weight half, the same for every k-step.

    >>> weight_loads("  for (int e = 0; e < 4; ++e) {\n    a[e] = ((__global const "
    ...              "ushort*)w)[e] | ((__global const ushort*)w)[e + 1];\n  }\n")
    (8, 8)
    """
    import re
    short = f"(__global const ushort*){weight})["
    wide = f"(__global const uint4*)(({weight} +"
    loops, loads, halves = [], 0, 0       # loops: (indent, extent) of the enclosing e loops
    for line in src.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while loops and indent <= loops[-1][0]:
            loops.pop()
        times = 1
        for _, n in loops:
            times *= n
        n16, n2 = line.count(wide), line.count(short)
        loads += (n16 + n2) * times
        halves += (8 * n16 + n2) * times
        m = re.match(r"\s*for \(int e = 0; e < (\d+); \+\+e\) \{", line)
        if m:
            loops.append((indent, int(m.group(1))))
    return loads, halves


def count_weight_loads(layers=None) -> list[dict]:
    """Loads per weight half of each 3 x 3 (and larger) layer's tensor-core kernels, with the
    weight OIHW (gathered) and as ``ConvWeightOHWI`` stores it, from the generated OpenCL
    (``Target("opencl -device=nvidia")``; no device needed): ``python -c "from
    benchmarks.gpu_tc_conv import count_weight_loads; count_weight_loads()"``."""
    from tilecraft import targets
    from tilecraft.relax import gpu_schedules
    from tilecraft.targets import Target
    t = Target("opencl -device=nvidia")
    rows = []
    for name, cin, size, cout, k, stride, pad, count in layers or LAYERS:
        if k == 1:
            continue
        row = {"layer": name, "count": count, "tc_layout": weight_layout("tc", cin, k)}
        for v in ("oihw", "tc"):
            func = gpu_schedules.apply(conv_func(cin, size, cout, k, stride, pad,
                                                 weight_layout(v, cin, k)), t)
            loads, halves = weight_loads(targets.build(func, t).get_source())
            row[f"{v}_loads_per_half"] = loads / halves
        rows.append(row)
    print_table(rows, ["layer", "count", "tc_layout", "oihw_loads_per_half",
                       "tc_loads_per_half"])
    return rows


def conv_func(cin: int, size: int, cout: int, k: int, stride: int, pad: int,
              layout: str = "OIHW"):
    """The fused float16 function of a quantized ResNet layer: ``relu(conv2d(x, W) + b)``
    with float16 ``x`` (a symbolic batch) and ``W`` (``layout`` ``"OIHW"``, or ``"OHWI"``
    as ``ConvWeightOHWI`` stores it), float32 bias, float16 output; the padding a producer
    inlined into the window, as a legalized Relax convolution has it."""
    from tilecraft.tensorir import te
    n = te.var("n")
    x = te.placeholder((n, cin, size, size), "float16", "x")
    ohwi = layout == "OHWI"
    w = te.placeholder((cout, k, k, cin) if ohwi else (cout, cin, k, k), "float16", "w")
    bias = te.placeholder((cout,), "float32", "bias")
    osz = (size + 2 * pad - k) // stride + 1
    xp = te.compute((n, cin, size + 2 * pad, size + 2 * pad), lambda b, c, h, v: te.if_then_else(
        te.all(h >= pad, h < size + pad, v >= pad, v < size + pad), x[b, c, h - pad, v - pad],
        te.const(0.0, "float16")), "pad") if pad else x
    c = te.reduce_axis((0, cin), "c")
    r = te.reduce_axis((0, k), "r")
    q = te.reduce_axis((0, k), "q")
    y = te.compute((n, cout, osz, osz), lambda b, o, h, v: te.sum(
        (w[o, r, q, c] if ohwi else w[o, c, r, q]).astype("float32") *
        xp[b, c, h * stride + r, v * stride + q].astype("float32"), axis=[c, r, q]), "conv")
    out = te.compute((n, cout, osz, osz), lambda b, o, h, v: te.maximum(
        y[b, o, h, v] + bias[o], te.const(0.0, "float32")).astype("float16"), "out")
    return te.create_prim_func([x, w, bias, out])


def _fp32_module(cin, size, cout, k, stride, pad, w, b):
    """``relu(conv2d(x, W) + b)`` in float32 with a symbolic batch (Relax)."""
    from tilecraft import tensorir
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
    from tilecraft.relax.op import nn
    x = Var("x", TensorStructInfo((tensorir.var("n"), cin, size, size), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(nn.conv2d(x, const(w), strides=(stride, stride), padding=(pad, pad)))
            out = bb.emit_output(bb.emit(nn.relu(op.add(y, const(b.reshape(1, -1, 1, 1))))))
        bb.emit_func_output(out)
    return bb.get()


def reference(x, w, b, stride, pad):
    """float64 ``relu(conv2d(x, w) + b)`` (NCHW)."""
    n, c, h, _ = x.shape
    o, _, k, _ = w.shape
    p = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - k) // stride + 1
    out = np.zeros((n, o, oh, oh))
    for dy in range(k):
        for dx in range(k):
            win = p[:, :, dy:dy + stride * oh:stride, dx:dx + stride * oh:stride]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, dy, dx].astype(np.float64))
    return np.maximum(out + b.reshape(1, -1, 1, 1), 0)


def _rel_err(got, ref) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / (np.abs(ref).max() + 1e-30))


def run() -> list[dict]:
    from tilecraft import relax, targets
    from tilecraft.relax import gpu_schedules
    from tilecraft.targets import Target
    dev = gpu_device("opencl")
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        torch, cuda = None, False
    if cuda:
        torch.backends.cudnn.benchmark = True
    pick = [s for s in os.environ.get("TILECRAFT_TC_CONV_LAYERS", "").split(",") if s]
    layers = SMOKE_LAYERS if SMOKE else LAYERS
    unknown = set(pick) - {layer[0] for layer in layers}
    if unknown:
        raise SystemExit(f"unknown layers {sorted(unknown)}; known: {[l[0] for l in layers]}")
    for v in VARIANTS:
        variant_env(v)
    tc_target = Target(TC_TARGET)
    rng = np.random.default_rng(0)
    rows = []
    for name, cin, size, cout, k, stride, pad, count in layers:
        if pick and name not in pick:
            continue
        osz = (size + 2 * pad - k) // stride + 1
        w = (rng.standard_normal((cout, cin, k, k)) / math.sqrt(cin * k * k)).astype(np.float32)
        b = rng.standard_normal(cout).astype(np.float32)
        w16 = w.astype(np.float16)
        mods, tiles = {}, {}
        try:
            vm32 = relax.VirtualMachine(relax.build(
                _fp32_module(cin, size, cout, k, stride, pad, w, b), "opencl -device=nvidia"
                if not SMOKE else "opencl"), dev)
        except Exception as err:       # a build failure is a row's error, the rest go on
            vm32 = err
        layouts = {v: weight_layout(v, cin, k) for v in VARIANTS}
        for v in VARIANTS:
            try:
                func = with_env(variant_env(v), lambda: gpu_schedules.apply(
                    conv_func(cin, size, cout, k, stride, pad, layouts[v]), tc_target))
                tiles[v] = str(func.attr_dict.get("tensor_core_tiles", "?"))
                mods[v] = targets.build(func, tc_target)
                src = mods[v].get_source()
                if "mma.sync" not in src and "tc_mma_emulated(" not in src:
                    mods[v] = ValueError("not on the tensor cores (a fall-back schedule)")
            except Exception as err:
                mods[v] = err
        for batch in BATCHES:
            x = rng.standard_normal((batch, cin, size, size)).astype(np.float32)
            x16 = x.astype(np.float16)
            row = {"layer": name, "batch": batch, "count": count, "C": cin, "O": cout,
                   "size": size, "kernel": k, "stride": stride}
            peer = None
            if cuda:
                F = torch.nn.functional
                xt, wt = torch.from_numpy(x16).cuda(), torch.from_numpy(w16).cuda()
                bt = torch.from_numpy(b).cuda().half()

                def conv():
                    return F.relu(F.conv2d(xt, wt, bt, stride=stride, padding=pad))
                with torch.no_grad():
                    peer = conv().float().cpu().numpy().astype(np.float64)
                    row["torch_fp16_ms"] = torch_cuda_seconds(torch, conv, 20, 3, best=True) * 1e3
            ref = reference(x16, w16, b, stride, pad) if batch == 1 or peer is None else peer
            if isinstance(vm32, Exception):
                row["fp32_error"] = f"{type(vm32).__name__}: {str(vm32)[:200]}"
            else:
                x_dev = targets.array(x, dev)
                row["fp32_err"] = _rel_err(vm32["main"](x_dev).numpy(), ref)
                row["fp32_ms"] = min(vm32.time_evaluator("main", dev, number=20, repeat=3)(
                    x_dev).results) * 1e3
            for v, mod in mods.items():
                if isinstance(mod, Exception):
                    row[f"{v}_error"] = f"{type(mod).__name__}: {str(mod)[:200]}"
                    continue
                w_v = w16 if layouts[v] == "OIHW" else np.ascontiguousarray(
                    w16.transpose(0, 2, 3, 1))
                args = [targets.array(x16, dev), targets.array(w_v, dev), targets.array(b, dev),
                        targets.empty((batch, cout, osz, osz), "float16", dev)]
                try:
                    mod["main"](*args)
                except Exception as err:     # a driver refusal: its error, the rest go on
                    row[f"{v}_error"] = f"{type(err).__name__}: {str(err)[:200]}"
                    continue
                row[f"{v}_tiles"] = kernel_at(tiles[v], batch * osz * osz)
                err = _rel_err(args[-1].numpy(), ref)
                row[f"{v}_err"] = err
                if err > 1e-2:
                    row[f"{v}_error"] = f"relative error {err:.2e}"
                    continue
                row[f"{v}_ms"] = min(mod.time_evaluator("main", dev, number=20, repeat=3)(
                    *args).results) * 1e3
            flops = 2.0 * batch * cout * osz * osz * cin * k * k
            if row.get("tc_ms"):
                row["tflops"] = flops / (row["tc_ms"] * 1e-3) / 1e12
                if row.get("fp32_ms"):
                    row["tc_vs_fp32"] = row["fp32_ms"] / row["tc_ms"]
                if row.get("torch_fp16_ms"):
                    row["tc_vs_torch"] = row["torch_fp16_ms"] / row["tc_ms"]
                row.update(_variant_ratios(row))
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()},
                  flush=True)
    rows += totals(rows)
    if SMOKE:
        print("(smoke run: no results written)")
        return rows
    gpu = torch.cuda.get_device_name(0) if cuda else None
    write_results("gpu_tc_conv", rows, {"variants": {v: variant_env(v) for v in VARIANTS},
                                        "tc_target": TC_TARGET}, gpu=gpu)
    return rows


def totals(rows: list[dict]) -> list[dict]:
    """One row a batch: ``count x ms`` summed over the layers of every timed column (a
    column missing in some layer: left out), and the ratios of the sums."""
    out = []
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        total = {"layer": "total", "batch": batch, "count": sum(r["count"] for r in mine)}
        cols = {c for r in mine for c in r if c.endswith("_ms")}
        for c in sorted(cols):
            if all(r.get(c) for r in mine):
                total[c] = sum(r["count"] * r[c] for r in mine)
        if total.get("tc_ms"):
            if total.get("fp32_ms"):
                total["tc_vs_fp32"] = total["fp32_ms"] / total["tc_ms"]
            if total.get("torch_fp16_ms"):
                total["tc_vs_torch"] = total["torch_fp16_ms"] / total["tc_ms"]
            total.update(_variant_ratios(total))
        out.append(total)
    return out


def _variant_ratios(row: dict) -> dict:
    """``tc_vs_<variant>``: each other variant's time over tc's (above 1: tc is faster)."""
    return {f"tc_vs_{c[:-3]}": row[c] / row["tc_ms"] for c in row
            if c.endswith("_ms") and c not in ("tc_ms", "fp32_ms", "torch_fp16_ms") and row[c]}


def main(argv=None) -> int:
    rows = run()
    others = [f"tc_vs_{v}" for v in VARIANTS if v != "tc"]
    print_table(rows, ["layer", "batch", "count", "fp32_ms", *[f"{v}_ms" for v in VARIANTS],
                       "torch_fp16_ms", "tc_vs_fp32", "tc_vs_torch", *others, "tflops"])
    print_table([r for r in rows if r["layer"] != "total"],
                ["layer", "batch", *[f"{v}_tiles" for v in VARIANTS]])
    print_table([r for r in rows if r["layer"] != "total"],
                ["layer", "batch", "fp32_err", *[f"{v}_err" for v in VARIANTS]])
    errors = [(r["layer"], r["batch"], k, v) for r in rows for k, v in r.items()
              if k.endswith("_error")]
    for e in errors:
        print("error:", *e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
