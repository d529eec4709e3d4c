"""A stem convolution alone, with and without its padded input rows
(``relax.backend.cpu.conv2d_nchw_cvec.reads_input_rows``), side by side.

``python -m benchmarks.stem_conv_cpu [--stems mobilenet,resnet] [--batches 1,8]`` builds each
stem as ConvertLayout's head leaves it (NCHW image, NHWC output, bias and ReLU6 fused,
symbolic batch) twice: reading a zero-padded copy of the whole image (``padded``) and reading
each output row's padded input rows (``rows``), whatever ``reads_input_rows`` would pick. Both
are checked against numpy, then timed on one thread in interleaved rounds by thread CPU time
(medians). Prints one row per stem and batch: milliseconds and GMAC/s of each, ``speedup``
(padded over rows) and ``picked`` (what the library runs). Writes nothing.

Examples
--------
>>> rows = run(stems=("mobilenet",), batches=(1,), rounds=1)   # doctest: +SKIP
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from tilecraft import relax
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.backend.cpu import conv2d_nchw_cvec as cvec
from tilecraft.relax.transform import AlterLayout
from tilecraft.tensorir.function import PrimFunc

# name -> (input channels, output channels, kernel, stride, image side)
STEMS = {"mobilenet": (3, 32, 3, 2, 224), "resnet": (3, 64, 7, 2, 224)}


def _stem(cin: int, cout: int, k: int, stride: int, side: int, rng):
    """The stem as a Relax module, its OIHW weight and bias."""
    w = (rng.standard_normal((cout, cin, k, k)) * 0.2).astype("float32")
    b = rng.standard_normal(cout).astype("float32")
    x = Var("x", TensorStructInfo(("n", cin, side, side), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), strides=stride, padding=k // 2,
                                     out_layout="NHWC"))
            y = bb.emit(op.add(y, const(b.reshape(1, 1, 1, cout))))
            gv = bb.emit_output(bb.emit(op.clip(y, 0.0, 6.0)))
        bb.emit_func_output(gv)
    return bb.get(), w, b


def _reference(x, w, b, stride):
    k = w.shape[2]
    p = k // 2
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    oh = (xp.shape[2] - k) // stride + 1
    ow = (xp.shape[3] - k) // stride + 1
    out = sum(np.einsum("nchw,oc->nhwo",
                        xp[:, :, a:a + stride * (oh - 1) + 1:stride,
                           c:c + stride * (ow - 1) + 1:stride], w[:, :, a, c])
              for a in range(k) for c in range(k)) + b
    return np.clip(out, 0, 6)


def _build(mod, rows: bool):
    """``mod`` built with the rows forced on or off (the module's choice restored after)."""
    picked = cvec.reads_input_rows
    cvec.reads_input_rows = lambda plan, layout="NCHW": \
        rows and layout == "NCHW" and not plan.across_rows and any(plan.geometry.padding)
    try:
        exe = relax.build(mod, "llvm")
    finally:
        cvec.reads_input_rows = picked
    exe.kernel_module.num_threads = 1
    return relax.VirtualMachine(exe)


def run(stems=tuple(STEMS), batches=(1, 8), rounds: int = 11) -> list[dict]:
    """One row per stem and batch (see the module docstring)."""
    rng = np.random.default_rng(0)
    out = []
    for name in stems:
        cin, cout, k, stride, side = STEMS[name]
        mod, w, b = _stem(cin, cout, k, stride, side, rng)
        vms = {"padded": _build(mod, False), "rows": _build(mod, True)}
        # what the library picks for this stem (its own head tile on this machine)
        picked = "rows" if _picks_rows(mod) else "padded"
        for n in batches:
            x = rng.standard_normal((n, cin, side, side)).astype("float32")
            want = _reference(x, w, b, stride)
            for vm in vms.values():
                np.testing.assert_allclose(vm["main"](x).numpy(), want, rtol=1e-3, atol=1e-3)
            number = max(1, 8 // n)
            times: dict[str, list[float]] = {key: [] for key in vms}
            for _ in range(rounds):
                for key, vm in vms.items():
                    t0 = time.thread_time()
                    for _ in range(number):
                        vm["main"](x)
                    times[key].append((time.thread_time() - t0) / number)
            med = {key: statistics.median(v) for key, v in times.items()}
            macs = n * want.shape[1] * want.shape[2] * cout * cin * k * k
            out.append({"stem": name, "batch": n,
                        "padded_ms": round(med["padded"] * 1e3, 3),
                        "rows_ms": round(med["rows"] * 1e3, 3),
                        "padded_gmacs": round(macs / med["padded"] / 1e9, 1),
                        "rows_gmacs": round(macs / med["rows"] / 1e9, 1),
                        "speedup": round(med["padded"] / med["rows"], 3), "picked": picked,
                        "load_avg": round(os.getloadavg()[0], 2)})
            print(out[-1], flush=True)
    return out


def _picks_rows(mod) -> bool:
    """Whether the default build of ``mod`` reads padded input rows (a ``conv2d_rows``
    block in the altered module)."""
    altered = AlterLayout("llvm")(mod)
    return any('T.block("conv2d_rows")' in f.script() for _, f in altered.functions.items()
               if isinstance(f, PrimFunc))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stems", default=",".join(STEMS))
    parser.add_argument("--batches", default="1,8")
    args = parser.parse_args(argv)
    run(tuple(args.stems.split(",")), tuple(int(v) for v in args.batches.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
