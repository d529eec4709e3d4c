"""GPU kernels through the OpenCL back end, untuned (the default schedules of
``relax/gpu_schedules.py``), beside the peers on the same device.

Rows:

* ``gemm`` float32 4096^3 — ours (default GEMM schedule) vs PyTorch on the same GPU
  (``torch.backends.cuda.matmul.allow_tf32 = False``: cuBLAS fp32), as TFLOP/s and
  ``ratio_vs_peer`` (ours / cuBLAS; target >= 0.4);
* ``softmax`` and ``layer_norm`` over 4096 rows of 4096 — ours as GB/s (bytes read + written
  once) vs the device's copy bandwidth (an OpenCL buffer-to-buffer copy of the same bytes, read
  + written), ``ratio_vs_peer`` (target >= 0.7); PyTorch's own kernels beside them;
* ``gemm_pocl`` — the same GEMM kernel on PoCL (the CPU OpenCL driver of CI) beside numpy
  (OpenBLAS), at 1024^3 by default (``TILECRAFT_POCL_GEMM_N``): what the software driver costs.

The NVIDIA platform is chosen when present (``targets.opencl("NVIDIA")``), else the first GPU,
else the first device. Every kernel is checked against numpy before it is timed. Timing is the
device's own (OpenCL profiling events; CUDA events for PyTorch), median of repeats. Without
torch or CUDA the peer columns are empty. Results: ``benchmarks/results/gpu/<machine>.json``
(the machine: the GPU measured, or this CPU's name when the device is PoCL).

Run: ``python -m benchmarks.run gpu`` (or ``python -m benchmarks.gpu``; ``--sweep`` also times
GEMM tile variants, for tuning the default).
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

from tilecraft import targets

from .common import write_results
from .gpu_common import gemm_func as _gemm_func, relax_kernel as _relax_kernel, torch_cuda_seconds

N = int(os.environ.get("TILECRAFT_GPU_BENCH_N", "4096"))
POCL_N = int(os.environ.get("TILECRAFT_POCL_GEMM_N", "1024"))


def _pick_device():
    from tilecraft.targets.opencl_backend import list_devices
    devs = list_devices()
    for d in devs:
        if "nvidia" in f"{d['platform']} {d['vendor']} {d['name']}".lower():
            return targets.opencl(d["index"]), d
    return targets.opencl(0), devs[0]


def _pocl_device():
    from tilecraft.targets.opencl_backend import list_devices
    for d in list_devices():
        if "portable computing language" in d["platform"].lower():
            return targets.opencl(d["index"]), d
    return None, None


def _target_for(info: dict) -> targets.Target:
    config = {"kind": "opencl", "max_threads_per_block": min(1024, info["max_work_group_size"]),
              "max_shared_memory_per_block": info["local_mem_size"]}
    if "CPU" in info["type"].upper():
        config["device"] = "cpu"       # PoCL: the CPU variant of the default schedules
    return targets.Target(config)


def _device_seconds(mod, dev, args, number=10, repeat=5) -> float:
    res = mod.time_evaluator(mod.entry_name, dev, number=number, repeat=repeat)(*args)
    return res.median


def _torch_seconds(fn, number=10, repeat=5) -> float | None:
    import torch
    return torch_cuda_seconds(torch, fn, number, repeat)


def _torch():
    try:
        import torch
        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            return torch
    except Exception:
        pass
    return None


def _copy_bandwidth(dev, nbytes: int) -> float:
    """Bytes read + written per second by a device-to-device buffer copy."""
    from tilecraft.targets.opencl_backend import context
    ctx = context(dev.index)
    cl = ctx.cl
    a = ctx.create_buffer(nbytes, "copy source")
    b = ctx.create_buffer(nbytes, "copy destination")
    cl.enqueue_copy(ctx.queue, b, a, byte_count=nbytes).wait()
    times = []
    for _ in range(7):
        evs = [cl.enqueue_copy(ctx.queue, b, a, byte_count=nbytes) for _ in range(5)]
        evs[-1].wait()
        times.append((evs[-1].profile.end - evs[0].profile.start) * 1e-9 / 5)
    return 2 * nbytes / statistics.median(times)


def _build(func, target):
    from tilecraft.relax import gpu_schedules
    sched = gpu_schedules.apply(func, target)
    return targets.build(sched, target)


def _run_gemm(dev, target, n: int, seed: int):
    """Random ``n x n`` inputs, the default-scheduled GEMM built for ``target``, run once on
    ``dev`` (its result is left in the third array for the caller to check)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)).astype("float32")
    b = rng.standard_normal((n, n)).astype("float32")
    mod = _build(_gemm_func(n), target)
    A, B = targets.array(a, dev), targets.array(b, dev)
    C = targets.empty((n, n), "float32", dev)
    mod["main"](A, B, C)
    return a, b, mod, (A, B, C)


def _gemm_row(dev, info, target, n, torch) -> dict:
    a, b, mod, (A, B, C) = _run_gemm(dev, target, n, seed=0)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.abs(C.numpy() - ref).max() / np.abs(ref).max())
    assert err < 1e-4, f"GEMM result wrong: relative error {err}"
    t = _device_seconds(mod, dev, (A, B, C), number=5 if n >= 2048 else 20)
    flops = 2.0 * n ** 3
    row = {"kernel": "gemm", "shape": f"{n}x{n}x{n}", "device": info["name"],
           "ours_ms": t * 1e3, "ours_tflops": flops / t / 1e12}
    if torch is not None:
        ta = torch.from_numpy(a).cuda()
        tb = torch.from_numpy(b).cuda()
        tt = _torch_seconds(lambda: ta @ tb, number=5 if n >= 2048 else 20)
        row.update({"peer": "torch cuBLAS fp32 (no TF32)", "peer_ms": tt * 1e3,
                    "peer_tflops": flops / tt / 1e12, "ratio_vs_peer": tt / t})
    return row


def _row_kernel_rows(dev, info, target, n, torch) -> list[dict]:
    from tilecraft.relax.op import nn
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, n)).astype("float32")
    g = np.ones(n, "float32")
    copy_bw = _copy_bandwidth(dev, x.nbytes)
    rows = []
    X = targets.array(x, dev)
    Y = targets.empty((n, n), "float32", dev)
    cases = [("softmax", lambda v: nn.softmax(v, axis=-1)),
             ("layer_norm", None)]
    for name, make in cases:
        if name == "softmax":
            func = _relax_kernel(make, (n, n))
            e = np.exp(x - x.max(-1, keepdims=True))
            ref = e / e.sum(-1, keepdims=True)
        else:
            from tilecraft.relax import const
            func = _relax_kernel(lambda v: nn.layer_norm(v, const(g), const(np.zeros(n, "float32")),
                                                          axes=[-1]), (n, n))
            ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
        mod = _build(func, target)
        params = mod[mod.entry_name].params
        # layer norm's gamma and beta (constants, lifted to parameters): 1 and 0
        consts = [np.ones(n, "float32"), np.zeros(n, "float32")][:len(params) - 2]
        args = [X] + [targets.array(c, dev) for c in consts] + [Y]
        mod[mod.entry_name](*args)
        got = Y.numpy()
        np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-4)
        t = _device_seconds(mod, dev, args, number=10)
        bw = 2 * x.nbytes / t
        row = {"kernel": name, "shape": f"{n}x{n}", "device": info["name"], "ours_ms": t * 1e3,
               "ours_gbps": bw / 1e9, "peer": "device copy bandwidth",
               "peer_gbps": copy_bw / 1e9, "ratio_vs_peer": bw / copy_bw}
        if torch is not None:
            tx = torch.from_numpy(x).cuda()
            f = (lambda: torch.softmax(tx, -1)) if name == "softmax" else \
                (lambda: torch.nn.functional.layer_norm(tx, (n,)))
            tt = _torch_seconds(f)
            row.update({"torch_ms": tt * 1e3, "torch_gbps": 2 * x.nbytes / tt / 1e9})
        rows.append(row)
    return rows


def _pocl_row(n: int) -> dict | None:
    dev, info = _pocl_device()
    if dev is None:
        return None
    target = _target_for(info)
    a, b, mod, (A, B, C) = _run_gemm(dev, target, n, seed=2)
    np.testing.assert_allclose(C.numpy(), a @ b, rtol=1e-3, atol=1e-2)
    t = _device_seconds(mod, dev, (A, B, C), number=1, repeat=3)
    tn = statistics.median(_wall(lambda: a @ b) for _ in range(3))
    flops = 2.0 * n ** 3
    return {"kernel": "gemm_pocl", "shape": f"{n}x{n}x{n}", "device": info["name"],
            "ours_ms": t * 1e3, "ours_tflops": flops / t / 1e12, "peer": "numpy (OpenBLAS)",
            "peer_ms": tn * 1e3, "peer_tflops": flops / tn / 1e12, "ratio_vs_peer": tn / t}


def _wall(fn) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def sweep(dev, info, target, n, torch) -> list[dict]:
    """GEMM with other tile configurations of the default schedule (for tuning it)."""
    from tilecraft.relax.backend.gpu import gemm as G
    saved = (G.GEMM_TILE, G.GEMM_TILE_J, G.GEMM_BK)
    rows = []
    try:
        for ti, tj, bk in [((16, 8), (16, 8), 16), ((16, 8), (16, 8), 32),
                           ((16, 16), (16, 8), 16), ((8, 16), (16, 8), 32),
                           ((16, 8), (8, 16), 16)]:
            G.GEMM_TILE, G.GEMM_TILE_J, G.GEMM_BK = ti, tj, bk
            name = f"gemm tile_i={ti} tile_j={tj} bk={bk}"
            try:
                r = _gemm_row(dev, info, target, n, torch)
                r["kernel"] = name
            except Exception as err:   # a variant over a limit: report it, go on
                r = {"kernel": name, "error": str(err)[:200]}
            rows.append(r)
    finally:
        G.GEMM_TILE, G.GEMM_TILE_J, G.GEMM_BK = saved
    return rows


# run() writes the results itself, under the GPU's name (``benchmarks.run`` does not)
WRITES_RESULTS = True


def run(do_sweep: bool = False) -> list[dict]:
    dev, info = _pick_device()
    target = _target_for(info)
    torch = _torch() if "nvidia" in info["vendor"].lower() or "nvidia" in \
        info["platform"].lower() else None
    on_cpu = "CPU" in info["type"].upper()
    n = N if not on_cpu else min(N, POCL_N)
    rows = [_gemm_row(dev, info, target, n, torch)]
    rows += _row_kernel_rows(dev, info, target, n, torch)
    if do_sweep:
        rows += sweep(dev, info, target, n, torch)
    pocl = _pocl_row(POCL_N)
    if pocl is not None:
        rows.append(pocl)
    path = write_results("gpu", rows, {"device": info, "target": str(target)},
                         gpu=None if on_cpu else info["name"])
    print(f"(written to {path})")
    return rows


if __name__ == "__main__":
    from .common import print_table
    out = run(do_sweep="--sweep" in sys.argv)
    print_table(out, list(dict.fromkeys(k for r in out for k in r)))
