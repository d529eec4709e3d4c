"""WebGPU kernels on the first adapter, beside the platform's peer.

On a GPU adapter (the device machine: the H200 through Vulkan) beside PyTorch on CUDA: float32
GEMM 4096^3 against cuBLAS with TF32 off (default-schedule and hand-scheduled WebGPU columns),
and softmax / layer norm over 4096 x 4096 rows as a fraction of the device's copy bandwidth
(PyTorch's device-to-device copy) and of a WebGPU copy kernel's. On a CPU adapter (lavapipe
here) the same kernels at smaller sizes beside numpy, which shows what the software driver costs.

WebGPU times are the GPU's (timestamp queries; ``time_evaluator``), PyTorch's from CUDA events,
numpy's wall clock. ``python -m benchmarks.run gpu_webgpu``.

``python -m benchmarks.gpu_webgpu probe`` (``probe()``, under a minute on a GPU): a BERT FFN
GEMM (2048 x 768 x 3072) and a ResNet-50 3x3 convolution (16 x 256 x 14 x 14) on WebGPU with
the spec's limits, with the adapter's limits (``targets.webgpu(0).target()``: the GEMM k-step
of 16 those allow), with them and the k-step 8 of the spec's limits (the rule before it read
the target), and without naga's run-time checks (native only), beside OpenCL and
PyTorch on the same GPU, in one process.

``python -m benchmarks.gpu_webgpu probe resnet`` (under two minutes on a GPU): the ResNet-50
convolutions of issue 32's profile at batch 16 — the 56 x 56 1x1 64 -> 256 layer, the 7x7
stem, a 14 x 14 1x1 1024 -> 256 layer — on WebGPU with the adapter's limits as the WGSL
generator emits them now and with its unroll rule from before the fix (the k-step loop
unrolled, the register tile left a dynamically indexed array), beside OpenCL and PyTorch; its
rows replace those workloads' rows in the same results file.
"""
from __future__ import annotations

import contextlib
import copy
import os
import re
import sys
import time

import numpy as np

from tilecraft import targets
from benchmarks.common import print_table, side_by_side, write_results
from benchmarks.gpu_common import gemm_func as _gemm_func, relax_kernel as _relax_kernel
from benchmarks.gpu_common import torch_cuda_seconds
from benchmarks.schedules import webgpu as sched
from tilecraft.targets.webgpu_backend import WebGPUModule, list_adapters, num_adapters


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _torch_time(fn, number=20, repeat=5) -> float:
    return float(torch_cuda_seconds(_torch_cuda(), fn, number, repeat))


def _wg_time(mod, dev, args, number) -> float:
    return mod.time_evaluator(mod.entry_name, dev, number=number, repeat=5)(*args).median


def _default(func):
    """``func`` with the GPU default schedule relax.build gives it for ``webgpu``."""
    from tilecraft.relax import gpu_schedules
    return gpu_schedules.apply(func, targets.Target("webgpu"))


def _progress(row: dict) -> None:
    """Each row as soon as it is measured (a device run may be cut short)."""
    print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), file=sys.stderr, flush=True)


def _check(name, got, ref, tol):
    err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
    if err > tol:
        raise AssertionError(f"{name}: WebGPU result differs from the reference (rel {err:.2e})")


# run() writes the results itself, under the GPU's name (``benchmarks.run`` does not)
WRITES_RESULTS = True


def run() -> list[dict]:
    """The rows, also written to ``benchmarks/results/gpu_webgpu/<machine>.json`` (the machine:
    the adapter's GPU, or this CPU's name on a CPU adapter such as lavapipe)."""
    if num_adapters() == 0:
        return [{"bench": "webgpu", "note": "no WebGPU adapter (nothing measured or written)"}]
    info = list_adapters()[0]
    gpu = info["type"] != "CPU"
    torch = _torch_cuda() if gpu else None
    dev = targets.webgpu(0)
    rng = np.random.default_rng(0)
    rows = []
    size = int(os.environ.get("GEMM_SIZE", 4096 if gpu else 512))
    number = 10 if gpu else 2

    # -- GEMM ---------------------------------------------------------------------------------
    a_np = rng.standard_normal((size, size)).astype("float32")
    b_np = rng.standard_normal((size, size)).astype("float32")
    a, b = targets.array(a_np, dev), targets.array(b_np, dev)
    c = targets.empty((size, size), "float32", dev)
    flops = 2.0 * size ** 3
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        ta, tb = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
        peer_name, peer_t = "torch cuBLAS fp32 (TF32 off)", _torch_time(lambda: ta @ tb)
        ref = (ta.double() @ tb.double()).float().cpu().numpy() if size <= 4096 else None
    else:
        peer_name = "numpy (OpenBLAS)"
        peer_t = side_by_side(lambda: a_np @ b_np, lambda: None, number=1, rounds=3)[0]
        ref = a_np @ b_np
    schedules = [("default schedule", _default(_gemm_func(size))),
                 ("hand (128x128 tile, 8x8 per thread)", sched.gemm(size, size, size))]
    if os.environ.get("WEBGPU_GEMM_VARIANTS"):   # other tilings, for choosing the hand schedule
        for bm, bn, bk, tm, tn in ((128, 128, 16, 8, 8), (64, 64, 16, 4, 4), (128, 64, 8, 8, 4),
                                   (64, 128, 16, 4, 8)):
            schedules.append((f"hand {bm}x{bn}x{bk}, {tm}x{tn} per thread",
                              sched.gemm(size, size, size, bm, bn, bk, tm, tn)))
    for label, func in schedules:
        t0 = time.perf_counter()
        mod = targets.build(func, "webgpu")
        build_s = time.perf_counter() - t0
        mod[mod.entry_name](a, b, c)
        got = c.numpy()             # waits: includes the driver's pipeline compile
        first_s = time.perf_counter() - t0 - build_s
        if ref is not None:
            _check(f"gemm {label}", got, ref, 1e-4)
        t = _wg_time(mod, dev, (a, b, c), number)
        rows.append({"bench": f"gemm {size}^3", "schedule": label, "adapter": info["name"],
                     "webgpu_ms": t * 1e3, "webgpu_tflops": flops / t / 1e12, "peer": peer_name,
                     "peer_ms": peer_t * 1e3, "peer_tflops": flops / peer_t / 1e12,
                     "ratio": peer_t / t, "build_s": build_s, "first_call_s": first_s})
        _progress(rows[-1])

    # -- row softmax / layer norm vs copy bandwidth --------------------------------------------
    n = int(os.environ.get("ROWS_SIZE", 4096 if gpu else 1024))
    x_np = rng.standard_normal((n, n)).astype("float32")
    g_np = rng.standard_normal(n).astype("float32")
    bt_np = rng.standard_normal(n).astype("float32")
    x, out = targets.array(x_np, dev), targets.empty((n, n), "float32", dev)
    nbytes = 2 * x_np.nbytes     # read once, write once
    copy_mod = targets.build(sched.copy(n * n), "webgpu")
    flat_in = targets.array(x_np.reshape(-1), dev)
    flat_out = targets.empty((n * n,), "float32", dev)
    t_copy = _wg_time(copy_mod, dev, (flat_in, flat_out), number * 5)
    if torch is not None:
        tx_, ty_ = torch.from_numpy(x_np).cuda(), torch.empty((n, n), device="cuda")
        t_dev_copy = _torch_time(lambda: ty_.copy_(tx_))
    else:
        y_np = np.empty_like(x_np)
        t_dev_copy = side_by_side(lambda: np.copyto(y_np, x_np), lambda: None, number=3)[0]
    rows.append({"bench": f"copy {n}x{n}", "adapter": info["name"], "webgpu_ms": t_copy * 1e3,
                 "webgpu_GBps": nbytes / t_copy / 1e9,
                 "peer": "torch copy_" if torch is not None else "numpy copyto",
                 "peer_ms": t_dev_copy * 1e3, "peer_GBps": nbytes / t_dev_copy / 1e9,
                 "ratio": t_dev_copy / t_copy})
    _progress(rows[-1])
    e = np.exp(x_np - x_np.max(1, keepdims=True))
    soft_ref = e / e.sum(1, keepdims=True)
    mu, var = x_np.mean(1, keepdims=True), x_np.var(1, keepdims=True)
    ln_ref = (x_np - mu) / np.sqrt(var + 1e-5) * g_np + bt_np
    g, bt = targets.array(g_np, dev), targets.array(bt_np, dev)
    from tilecraft.relax import const
    from tilecraft.relax.op import nn
    d_soft = _default(_relax_kernel(lambda v: nn.softmax(v, axis=-1), (n, n)))
    d_ln = _default(_relax_kernel(lambda v: nn.layer_norm(v, const(g_np), const(bt_np),
                                                          axes=[-1]), (n, n)))
    for name, schedule, func, args, ref_v in (
            ("softmax", "default schedule", d_soft, (x, out), soft_ref),
            ("softmax", "hand (one kernel)", sched.softmax(n, n), (x, out), soft_ref),
            ("layer_norm", "default schedule", d_ln, (x, g, bt, out), ln_ref),
            ("layer_norm", "hand (one kernel)", sched.layer_norm(n, n), (x, g, bt, out), ln_ref)):
        mod = targets.build(func, "webgpu")
        mod[mod.entry_name](*args)
        _check(name, out.numpy(), ref_v, 1e-4)
        t = mod.time_evaluator(mod.entry_name, dev, number=number * 5, repeat=5)(*args).median
        if torch is not None:
            if name == "softmax":
                peer_t = _torch_time(lambda: torch.softmax(tx_, dim=1))
            else:
                tg, tbt = torch.from_numpy(g_np).cuda(), torch.from_numpy(bt_np).cuda()
                peer_t = _torch_time(lambda: torch.nn.functional.layer_norm(tx_, (n,), tg, tbt))
            peer = f"torch {name}"
        else:
            fn = (lambda: np.exp(x_np - x_np.max(1, keepdims=True))) if name == "softmax" else \
                (lambda: (x_np - x_np.mean(1, keepdims=True)) / np.sqrt(
                    x_np.var(1, keepdims=True) + 1e-5) * g_np + bt_np)
            peer_t = side_by_side(fn, lambda: None, number=3)[0]
            peer = f"numpy {name}"
        rows.append({"bench": f"{name} {n}x{n}", "schedule": schedule, "adapter": info["name"],
                     "webgpu_ms": t * 1e3, "webgpu_GBps": nbytes / t / 1e9,
                     "vs_device_copy": t_dev_copy / t, "vs_webgpu_copy": t_copy / t,
                     "peer": peer, "peer_ms": peer_t * 1e3, "ratio": peer_t / t})
        _progress(rows[-1])
    print(f"(written to {write_results('gpu_webgpu', rows, gpu=info['name'] if gpu else None)})")
    return rows




# ---------------------------------------------------------------------------------------------
# The limits probe: what the WebGPU target's limits and naga's checks cost, beside OpenCL and
# PyTorch on the same GPU (``python -m benchmarks.gpu_webgpu probe``; under a minute on a GPU)


def _probe_workloads(gpu: bool, adapter_target) -> list[dict]:
    """The probe's workloads: a BERT FFN GEMM (16 x 128 tokens) and a ResNet-50 stage-3 3x3
    convolution at batch 16 (NCHW, as the ONNX import gives it) under the limit variants
    (``_limit_variants``), and a ReLU over a ResNet-50 stage-1 activation, generated and
    written by hand (both 16-byte storage accesses); small on a CPU adapter (lavapipe). Each: name, the unscheduled
    PrimFunc, its work (``("tflops", flops)`` or ``("GBps", bytes)``), numpy inputs, the output
    shape, a float64 reference maker, a torch maker and the WebGPU variants."""
    from tilecraft.relax import const
    from tilecraft.relax.op import nn
    m, k, n = (2048, 768, 3072) if gpu else (256, 128, 384)
    b, c, hw = (16, 256, 14) if gpu else (2, 32, 14)
    rb, rc, rhw = (16, 256, 56) if gpu else (2, 32, 28)
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((m, k)).astype("float32")
    w_np = rng.standard_normal((k, n)).astype("float32")
    x_np = rng.standard_normal((b, c, hw, hw)).astype("float32")
    f_np = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype("float32")
    r_np = rng.standard_normal((rb, rc, rhw, rhw)).astype("float32")

    def conv_ref():
        import torch
        with torch.no_grad():
            return torch.nn.functional.conv2d(torch.from_numpy(x_np).double(),
                                              torch.from_numpy(f_np).double(), padding=1).numpy()

    def torch_gemm(torch):
        ta, tw = torch.from_numpy(a_np).cuda(), torch.from_numpy(w_np).cuda()
        return lambda: ta @ tw

    def torch_conv(torch):
        tx, tf = torch.from_numpy(x_np).cuda(), torch.from_numpy(f_np).cuda()
        return lambda: torch.nn.functional.conv2d(tx, tf, padding=1)

    def torch_relu(torch):
        tx = torch.from_numpy(r_np).cuda()
        return lambda: torch.relu(tx)
    portable = targets.Target("webgpu")
    return [
        {"name": f"gemm {m}x{k}x{n}", "func": _gemm_mkn(m, k, n),
         "work": ("tflops", 2.0 * m * k * n), "inputs": [a_np, w_np], "out": (m, n),
         "ref": lambda: a_np.astype("float64") @ w_np, "torch": torch_gemm,
         "variants": _limit_variants(adapter_target)},
        # the legalized kernel takes the constant weight as its second parameter
        {"name": f"conv3x3 {b}x{c}x{hw}x{hw} -> {c}",
         "func": _relax_kernel(lambda v: nn.conv2d(v, const(f_np), padding=1), (b, c, hw, hw)),
         "work": ("tflops", 2.0 * b * c * c * 9 * hw * hw), "inputs": [x_np, f_np],
         "out": (b, c, hw, hw), "ref": conv_ref, "torch": torch_conv,
         "variants": _limit_variants(adapter_target)},
        {"name": f"relu {rb}x{rc}x{rhw}x{rhw}", "func": _relax_kernel(nn.relu, r_np.shape),
         "work": ("GBps", 2.0 * r_np.nbytes), "inputs": [r_np], "out": r_np.shape,
         "ref": lambda: np.maximum(r_np, 0), "torch": torch_relu,
         "variants": [("webgpu portable (generated: array<vec4<f32>> bindings)", portable,
                       False, True, None),
                      ("webgpu portable, the same kernel's WGSL written by hand "
                       "(array<vec4<f32>>)", portable, False, True, _vec4_relu)]},
    ]


def _resnet_workloads(gpu: bool, adapter_target) -> list[dict]:
    """ResNet-50 convolutions at batch 16 (NCHW, weights as the second parameter, as the ONNX
    import gives them; the fused bias / residual / ReLU epilogue left out): the 56 x 56 1x1
    64 -> 256 layer (``fused_conv2d3_*``: 10x slower than OpenCL in issue 32's profile), the
    7x7 stride-2 stem (7x) and a 14 x 14 1x1 1024 -> 256 layer (``fused_conv2d15_*``: 2.5x).
    Small on a CPU adapter. Variants: the adapter's limits as generated now, with the WGSL
    unroll rule from before issue 32's fix (``_unroll_rule_before_fix``), and with the k-step 8
    of the spec's limits (8 input channels per step of a 1x1 layer instead of the adapter's
    16)."""
    from tilecraft.relax import const
    from tilecraft.relax.op import nn
    rng = np.random.default_rng(1)
    b = 16 if gpu else 2
    shapes = [  # (ResNet-50's kernel, cin, cout, image, kernel, stride, padding)
        ("fused_conv2d3", 64, 256, 56 if gpu else 28, 1, 1, 0),
        ("stem", 3, 64, 224 if gpu else 56, 7, 2, 3),
        ("fused_conv2d15", 1024 if gpu else 128, 256 if gpu else 64, 14, 1, 1, 0)]
    out = []
    for layer, cin, cout, hw, k, stride, pad in shapes:
        name = f"conv{k}x{k}/{stride} {b}x{cin}x{hw}x{hw} -> {cout} ({layer})"
        x_np = rng.standard_normal((b, cin, hw, hw)).astype("float32")
        f_np = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(k * k * cin)).astype("float32")
        oh = (hw + 2 * pad - k) // stride + 1

        def ref(x_np=x_np, f_np=f_np, stride=stride, pad=pad):
            import torch
            with torch.no_grad():
                return torch.nn.functional.conv2d(torch.from_numpy(x_np).double(),
                                                  torch.from_numpy(f_np).double(),
                                                  stride=stride, padding=pad).numpy()

        def torch_conv(torch, x_np=x_np, f_np=f_np, stride=stride, pad=pad):
            tx, tf = torch.from_numpy(x_np).cuda(), torch.from_numpy(f_np).cuda()
            return lambda: torch.nn.functional.conv2d(tx, tf, stride=stride, padding=pad)

        def make(v, f_np=f_np, stride=stride, pad=pad):
            return nn.conv2d(v, const(f_np), strides=stride, padding=pad)
        out.append({
            "name": name, "func": _relax_kernel(make, x_np.shape),
            "work": ("tflops", 2.0 * b * cout * cin * k * k * oh * oh),
            "inputs": [x_np, f_np], "out": (b, cout, oh, oh), "ref": ref, "torch": torch_conv,
            "variants": [
                ("webgpu adapter limits", adapter_target, False, True, None),
                ("webgpu, the WGSL unroll rule before issue 32's fix", adapter_target, False,
                 True, "unroll-before-fix"),
                ("webgpu adapter limits, GEMM k-step 8", adapter_target, True, True, None)]})
    return out


@contextlib.contextmanager
def _unroll_rule_before_fix():
    """The WGSL generator's loop unrolling as it was before issue 32's fix, for the
    before/after rows: a serial loop of at most 16 iterations was unrolled when its body
    touched a register array at all (a GEMM's k-step loop around its barriers), and the budget
    counted only ``unrolled`` loops as multiplied — the k-step loop was unrolled, spent the
    budget, and the register loops after it stayed loops over a dynamically indexed array.
    Patched for the measurement and restored."""
    from tilecraft.targets.webgpu_backend import wgsl
    from tilecraft.tensorir import expr as E, stmt as S
    from tilecraft.tensorir.functor import post_order_visit

    def touches_local(body):
        found = []
        post_order_visit(body, lambda n: found.append(n) if isinstance(
            n, (E.BufferLoad, S.BufferStore)) and n.buffer.scope == "local" else None)
        return bool(found)

    def unroll_wanted(loop, ext):
        unroll = loop.kind in ("unrolled", "vectorized") or (
            loop.kind == "serial" and ext is not None and ext <= 16 and touches_local(loop.body))
        return unroll and ext is not None and 0 < ext <= wgsl.UNROLL_LIMIT

    def stmt_size(st):
        if isinstance(st, S.SeqStmt):
            return sum(stmt_size(x) for x in st.seq)
        if isinstance(st, S.For):
            ext, inner = E.as_int(st.extent), stmt_size(st.body)
            return inner * ext if (st.kind == "unrolled" and ext is not None) else inner + 1
        if isinstance(st, S.IfThenElse):
            return 1 + stmt_size(st.then_case) + (stmt_size(st.else_case) if st.else_case
                                                  else 0)
        if isinstance(st, (S.LetStmt, S.AssertStmt, S.Allocate)):
            return 1 + stmt_size(st.body)
        return 1
    saved = wgsl._unroll_wanted, wgsl._stmt_size
    wgsl._unroll_wanted, wgsl._stmt_size = unroll_wanted, stmt_size
    try:
        yield
    finally:
        wgsl._unroll_wanted, wgsl._stmt_size = saved


_REGISTER_ARRAY = re.compile(r"var l_\w+: array<")


def _wall_sync_ms(call, dev, number: int) -> float:
    """Median wall-clock ms of one call followed by ``dev.sync()`` — what ``vm.profile``
    counts per kernel (it synchronizes after each): the GPU time plus the submission and the
    wait, which on WebGPU (a command buffer, a queue submit and a buffer read-back per sync)
    cost far more than on OpenCL."""
    times = []
    for _ in range(number):
        start = time.perf_counter()
        call()
        dev.sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def _wgsl_shape(mod) -> dict:
    """What the WGSL says about the register tiles: register arrays left dynamically indexed
    (function-scope ``array``s: local memory on a GPU) and the source size."""
    return {"register_arrays": sum(len(_REGISTER_ARRAY.findall(k["wgsl"])) for k in mod.kernels),
            "wgsl_kb": round(sum(len(k["wgsl"]) for k in mod.kernels) / 1024, 1)}


def _vec4_relu(meta: dict) -> dict:
    """The default-schedule ReLU module's metadata with its kernel's WGSL rewritten by hand to
    read and write through ``array<vec4<f32>>`` bindings (one 16-byte load and store per
    thread, as OpenCL's ``float4``). WGSL generation emits the same shape since issue 32
    (``tests/targets/test_webgpu_vec4.py`` checks it), so this row is the control: it should
    measure the same as the generated one. Same bindings, grid and workgroup size."""
    meta = copy.deepcopy(meta)
    (kernel,) = meta["functions"][0]["kernels"]
    threads = kernel["workgroup_size"][0]
    shape = meta["functions"][0]["params"][0]["shape"]
    if kernel["grid"][0] * threads * 4 != int(np.prod(shape)) or kernel["uniform"]:
        raise ValueError("the ReLU kernel is not one vec4 per thread over an exact grid")
    x, y = (f"b_{p['name']}" for p in meta["functions"][0]["params"])
    kernel["wgsl"] = (
        f"@group(0) @binding(0) var<storage, read> {x}: array<vec4<f32>>;\n"
        f"@group(0) @binding(1) var<storage, read_write> {y}: array<vec4<f32>>;\n\n"
        f"@compute @workgroup_size({threads}, 1, 1)\n"
        f"fn main(@builtin(workgroup_id) tc_wid: vec3<u32>, "
        f"@builtin(local_invocation_id) tc_lid: vec3<u32>) {{\n"
        f"  let i = i32(tc_wid.x) * {threads}i + i32(tc_lid.x);\n"
        f"  {y}[i] = max({x}[i], vec4<f32>(0.0f));\n}}\n")
    return meta


def _gemm_mkn(m: int, k: int, n: int):
    from tilecraft.tensorir import te
    A = te.placeholder((m, k), "float32", "A")
    B = te.placeholder((k, n), "float32", "B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), "C")
    return te.create_prim_func([A, B, C])


def _limit_variants(adapter_target) -> list[tuple]:
    """(label, target, k-step 8, naga's checks, WGSL rewrite) of the GEMM-like workloads'
    WebGPU rows; the rows without naga's checks last, left out with
    ``WEBGPU_PROBE_UNCHECKED=0``."""
    out = [("webgpu portable (spec limits)", targets.Target("webgpu"), False, True, None),
           ("webgpu adapter limits", adapter_target, False, True, None),
           ("webgpu adapter limits, GEMM k-step 8", adapter_target, True, True, None)]
    if os.environ.get("WEBGPU_PROBE_UNCHECKED", "1") != "0":
        out += [("webgpu adapter limits, no naga checks (native only)", adapter_target, False,
                 False, None),
                ("webgpu adapter limits, k-step 8, no naga checks", adapter_target, True, False,
                 None)]
    return out


def _scheduled_for(func, target, kstep8: bool):
    """``func`` with the default GPU schedule for ``target``; ``kstep8``: the GEMM family's
    WebGPU k-step held at 8 whatever the target's workgroup storage (the rule before it read
    the target; patched here for the measurement and restored)."""
    from tilecraft.relax import gpu_schedules
    from tilecraft.relax.backend.gpu import gemm
    saved = gemm.GEMM_BK_WEBGPU_WIDE
    if kstep8:
        gemm.GEMM_BK_WEBGPU_WIDE = gemm.GEMM_BK_WEBGPU
    try:
        return gpu_schedules.apply(func, target)
    finally:
        gemm.GEMM_BK_WEBGPU_WIDE = saved


def _kernel_shape(mod) -> str:
    """Workgroup size and workgroup bytes of the module's kernels, for the row."""
    return "; ".join(f"{k['workgroup_size'][0]}x{k['workgroup_size'][1]}x"
                     f"{k['workgroup_size'][2]} {k['shared_bytes']} B"
                     for k in mod.kernels)


def _opencl_gpu():
    """The NVIDIA OpenCL GPU when there is one, else None (a CPU driver is not a peer here)."""
    try:
        from tilecraft.targets.opencl_backend import list_devices
        for d in list_devices():
            if "GPU" in d["type"].upper():
                return targets.opencl(d["index"])
    except Exception:
        return None
    return None


def probe(workloads: str = "limits") -> list[dict]:
    """The probe's rows: each workload on WebGPU (spec limits; the adapter's limits, the GEMM
    k-step of 16 they allow; with them and the k-step 8; without naga's run-time checks), on OpenCL (NVIDIA) and in
    PyTorch (CUDA, TF32 off), GPU times (timestamps / CUDA events), every result checked.
    Written to ``benchmarks/results/gpu_webgpu_limits/<gpu>.json`` on a GPU adapter.
    ``workloads="resnet"``: ResNet-50's convolutions before and after issue 32's unroll fix
    (``_resnet_workloads``) instead, their rows replacing theirs in that file."""
    if workloads not in ("limits", "resnet"):
        raise ValueError(f"probe workloads {workloads!r}: 'limits' or 'resnet'")
    from tilecraft.targets.webgpu_backend import runtime
    if num_adapters() == 0:
        return [{"bench": "webgpu", "note": "no WebGPU adapter (nothing measured or written)"}]
    info = list_adapters()[0]
    gpu = info["type"] != "CPU"
    torch = _torch_cuda() if gpu else None
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dev = targets.webgpu(0)
    adapter_target = dev.target()
    # the device is opened once, with the adapter target's limits: both kinds of module run on it
    runtime.note_target(adapter_target)
    ctx = runtime.context(dev.index)
    ocl = _opencl_gpu() if gpu else None
    number = 10 if gpu else 2
    rows = []
    make = _resnet_workloads if workloads == "resnet" else _probe_workloads
    for w in make(gpu, adapter_target):
        name, func, inputs, out_shape = w["name"], w["func"], w["inputs"], w["out"]
        unit, work = w["work"]
        ref = w["ref"]()
        tol = 1e-3
        measured = []

        def row(variant, t, **more):
            scale = 1e12 if unit == "tflops" else 1e9
            return {"bench": name, "variant": variant, **more, "ms": t * 1e3,
                    unit: work / t / scale}
        for label, target, kstep8, checks, rewrite in w["variants"]:
            t0 = time.perf_counter()
            ctx.bounds_checks = checks
            try:
                before = rewrite == "unroll-before-fix"
                with _unroll_rule_before_fix() if before else contextlib.nullcontext():
                    mod = targets.build(_scheduled_for(func, target, kstep8), target)
                if rewrite is not None and not before:
                    mod = WebGPUModule(rewrite(mod.metadata))
                build_s = time.perf_counter() - t0
                args = [targets.array(x, dev) for x in inputs] + \
                    [targets.empty(out_shape, "float32", dev)]
                mod[mod.entry_name](*args)
                _check(f"{name} {label}", args[-1].numpy(), ref, tol)
                t = _wg_time(mod, dev, args, number)
            except Exception as err:   # a row, not the end of the probe
                measured.append({"bench": name, "variant": label,
                                 "error": f"{type(err).__name__}: {str(err)[:300]}"})
                _progress(measured[-1])
                continue
            finally:
                ctx.bounds_checks = True
            fn = mod[mod.entry_name]
            measured.append(row(label, t, device=info["name"], target=str(target),
                                kernels=_kernel_shape(mod), build_s=round(build_s, 2),
                                wall_sync_ms=_wall_sync_ms(lambda: fn(*args), dev, number),
                                **_wgsl_shape(mod)))
            _progress(measured[-1])
        if ocl is not None:
            try:
                mod = targets.build(_scheduled_for(func, targets.Target("opencl"), False),
                                    "opencl")
                args = [targets.array(x, ocl) for x in inputs] + \
                    [targets.empty(out_shape, "float32", ocl)]
                mod[mod.entry_name](*args)
                _check(f"{name} opencl", args[-1].numpy(), ref, tol)
                t = mod.time_evaluator(mod.entry_name, ocl, number=number, repeat=5)(*args).median
                fn = mod[mod.entry_name]
                measured.append(row("opencl (default schedule)", t, device="OpenCL GPU",
                                    target="opencl", wall_sync_ms=_wall_sync_ms(
                                        lambda: fn(*args), ocl, number)))
            except Exception as err:
                measured.append({"bench": name, "variant": "opencl (default schedule)",
                                 "error": f"{type(err).__name__}: {str(err)[:300]}"})
            _progress(measured[-1])
        if torch is not None:
            t = _torch_time(w["torch"](torch))
            measured.append(row("torch cuda fp32 (TF32 off)", t,
                                device=torch.cuda.get_device_name(0)))
            _progress(measured[-1])
        base = measured[0].get("ms") if workloads == "limits" else None
        peer = measured[-1]["ms"] if torch is not None else None
        opencl = [r["ms"] for r in measured if r["variant"].startswith("opencl") and "ms" in r]
        for r in measured:
            if "ms" not in r:
                continue
            if base:
                r["vs_portable"] = base / r["ms"]
            if opencl:
                r["vs_opencl"] = opencl[0] / r["ms"]
            if peer is not None:
                r["vs_torch"] = peer / r["ms"]
        rows.extend(measured)
    if gpu:
        kept = []
        if workloads == "resnet":     # the other workloads' rows of the last full probe stay
            kept = [r for r in _previous_rows("gpu_webgpu_limits", info["name"])
                    if r.get("bench") not in {r2.get("bench") for r2 in rows}]
        path = write_results("gpu_webgpu_limits", kept + rows, gpu=info["name"])
        print(f"(written to {path})")
    return rows


def _previous_rows(name: str, gpu: str) -> list[dict]:
    """The rows of this GPU's results file of ``name``, or none."""
    import json
    from benchmarks.common import machine_name, results_path
    try:
        with open(results_path(name, machine_name(gpu))) as f:
            return json.load(f).get("rows", [])
    except (OSError, ValueError):
        return []


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        result = probe(*sys.argv[2:3])
        print_table(result, ["bench", "variant", "ms", "tflops", "GBps", "vs_portable",
                             "vs_opencl", "vs_torch", "wall_sync_ms", "register_arrays",
                             "wgsl_kb"])
    else:
        result = run()
        print_table(result, list(dict.fromkeys(k for r in result for k in r)))
