"""Low-precision CPU inference, int8 and int4 rows of ``python -m benchmarks.run lowp``
(the fp16 rows are ``benchmarks/lowp_fp16.py``): ours (``relax.quantize`` + ``relax.build``)
and onnxruntime's quantized model, timed side by side in one process (interleaved rounds,
``common.side_by_side``), with the error of each against the float32 model on the same inputs.

Rows:

- ``int8-dynamic``: BERT-base and GPT-2 small at 1 x 128 tokens vs onnxruntime's
  ``quantize_dynamic`` (int8 weights) of the same ONNX model;
- ``int8``: ResNet-50 (the onnx light model, random weights) vs onnxruntime's QDQ static
  quantization (per-channel int8 weights, calibrated on the same random images), top-1
  agreement with float32 on ``AGREEMENT_INPUTS`` random inputs;
- ``int8 mobilenet_v2`` (``--rows int8-mbv2``): the same for MobileNet-V2 (torchvision's
  architecture, random weights): its depthwise layers run ``backend.cpu.depthwise_int8``;
- ``int4-g128 layer``: each GPT-2 small linear shape at one token (the memory-bound GEMV of
  decoding), our int4 kernel vs our float32 kernel, the weights streaming from memory (both
  kernels on ``TILECRAFT_LOWP_LAYER_THREADS`` threads where set, else all cores): each
  call runs a sequence of layers of the shape with weights of their own (12, GPT-2's blocks,
  or more, to ``STREAM_BYTES`` of float32 weights), as a model's decoding step does;
- ``int4-g128``: the whole GPT-2 small at one token vs onnxruntime running the same model
  with ``com.microsoft.MatMulNBits`` (4 bits, blocks of 128; ``lowbit.matmul_nbits_model``
  writes its format).

GPU rows (``--rows int4-gpu-layers,int4-gpu``; not in the default set, which is the CPU's), on
each of ``TILECRAFT_LOWP_GPU_TARGETS`` (default ``opencl,webgpu``), timed with
``vm.time_evaluator`` (which synchronizes the device), the two executables interleaved round
by round, results filed under the GPU's name:

- ``int4-g128 gpu layer``: each GPT-2 small linear shape at one token, 12 layers of it in a
  call (GPT-2's blocks, each with its own weights), our int4 GEMV
  (``relax.backend.gpu.dense_int4``) against our float32 dense on the same target;
- ``int4-g128 gpu``: the whole GPT-2 small at one token, int4-g128 against our float32 build on
  the same target (the errors: against onnxruntime's float32 model);
- ``gemv gpu layer`` (``--rows gemv-gpu-layers``): each of ``GEMV_SHAPES`` (GPT-2 small's four
  and 4096 x 11008) at one row, the kernel alone (device time, each call with its own copy of
  the weight, ``GEMV_STREAM_BYTES`` in all): our float32 GEMV (``relax.backend.gpu.gemv``,
  weight ``(K, N)``; ``ours_nk_us``: ``(N, K)``), the GEMM rule it replaced
  (``gemm_rule_us``), the int4-g128 GEMV (``int4_us``; ``int4_codes_GBps``: its codes' bytes,
  ``K N / 2``, over its time; ``int4_GBps``: with the scale rows; ``int4_tile``: its launch
  shape; ``int4_vs_ours``: our float32 GEMV's time over it, the issue's 3x;
  ``int4_vs_peer``: PyTorch's float32 over it) and PyTorch's ``x @ W`` on CUDA (cuBLAS,
  float32, TF32 off, in a CUDA graph) as the peer. The int4 kernel is timed first, on its own:
  where the float32 weight does not fit the device (WebGPU at 4096 x 11008) its row still
  has the int4 time.

``TILECRAFT_LOWP_CPU_TARGET`` (default ``llvm``, this machine's CPU) is the target of our CPU
rows: ``"llvm -mattr=-amx-int8"`` runs the int8 kernels without Intel AMX (the AVX-512 VNNI
ones) on a CPU that has it, for the A/B; such rows record ``cpu_target``.
``TILECRAFT_LOWP_THREADS=1``: that many threads a side (ours ``-num-cores``, onnxruntime's
pools, its spin-waiting off), recorded as ``threads``; on a shared machine the default (every
core, onnxruntime spin-waiting) measures the load more than the kernels.

``ratio`` is the peer's time over ours (above 1: we are faster). Errors: ``max_abs``,
``rel`` (max abs over the float output's max abs), ``cosine`` (of the flattened outputs: the
hidden states / logits), ``top1`` (classifiers). ``python -m benchmarks.lowp --rows
int8-dynamic,int4-layers`` runs a subset; on the GPU machine ``python -m benchmarks.lowp --rows
int4-gpu-layers,int4-gpu`` (under 90 s), ``--rows gemv-gpu-layers`` (about a minute).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from tilecraft import relax, targets
from tilecraft.relax.frontend.onnx import from_onnx
from tilecraft.relax.frontend.onnx.lowbit import matmul_nbits_model

from .common import (ensure_clean_openblas_env, machine_name, print_table, results_path,
                     side_by_side, write_results)

AGREEMENT_INPUTS = 1000
CALIBRATION_INPUTS = 16
GPT2_LINEAR = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]   # (K, N) of one block
# float32 weight bytes the int4 layer rows stream per call: several times any L3 cache
STREAM_BYTES = 128 << 20
ROWS = ("int8-dynamic", "int8", "int8-mbv2", "int4-layers", "int4")
GPU_ROWS = ("int4-gpu-layers", "int4-gpu", "gemv-gpu-layers")
GPU_TARGETS = [t for t in os.environ.get("TILECRAFT_LOWP_GPU_TARGETS", "opencl,webgpu").split(",")
               if t]
GPU_LAYERS = 12             # GPT-2 small's blocks: layers of one shape per call
GPU_ROUNDS = 5
# the "mode" of the result rows each row of ROWS / GPU_ROWS writes
ROW_MODES = {"int8-dynamic": "int8-dynamic", "int8": "int8", "int8-mbv2": "int8 mobilenet_v2",
             "int4-layers": "int4-g128 layer", "int4": "int4-g128",
             "int4-gpu-layers": "int4-g128 gpu layer", "int4-gpu": "int4-g128 gpu",
             "gemv-gpu-layers": "gemv gpu layer"}
# the GEMV kernel rows: GPT-2 small's four linear shapes and a 7B model's MLP up-projection
GEMV_SHAPES = GPT2_LINEAR + [(4096, 11008)]
# weight bytes each GEMV kernel row cycles through (distinct copies of the weight, one per
# call), several times the H100's 50 MB / the H200's 60 MB of L2: every call reads from memory
GEMV_STREAM_BYTES = 256 << 20
GEMV_MAX_COPIES = 1024


def _errors(ours: np.ndarray, peer: np.ndarray, ref: np.ndarray) -> dict:
    out = {}
    for who, y in (("ours", ours), ("peer", peer)):
        d = np.abs(y.astype(np.float64) - ref)
        a, b = y.ravel().astype(np.float64), ref.ravel().astype(np.float64)
        out[f"{who}_max_abs"] = float(d.max())
        out[f"{who}_rel"] = float(d.max() / max(np.abs(ref).max(), 1e-30))
        out[f"{who}_cosine"] = float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))
    return out


def _threads() -> int | None:
    text = os.environ.get(THREADS_ENV, "").strip()
    return int(text) if text else None


def _ort(model_or_path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    if _threads():
        so.intra_op_num_threads = so.inter_op_num_threads = _threads()
        # no spin-waiting pool: on a shared machine it measures the load, not the kernels
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    src = model_or_path if isinstance(model_or_path, str) else model_or_path.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


CPU_TARGET_ENV = "TILECRAFT_LOWP_CPU_TARGET"
THREADS_ENV = "TILECRAFT_LOWP_THREADS"


def _cpu_target() -> str:
    target = os.environ.get(CPU_TARGET_ENV, "").strip() or "llvm"
    return f"{target} -num-cores={_threads()}" if _threads() else target


def _ours(mod, mode=None, calibration=None, upper_bounds=None, threads: int = 0):
    q = relax.quantize(mod, mode, calibration=calibration) if mode else mod
    exe = relax.build(q, _cpu_target(), upper_bounds=upper_bounds)
    if threads:
        exe.kernel_module.num_threads = threads
    return relax.VirtualMachine(exe, targets.cpu(0))


def _first(out) -> np.ndarray:
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.numpy() if hasattr(out, "numpy") else np.asarray(out)


def int8_dynamic_rows(names=("bert_base", "gpt2_small")) -> list[dict]:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from tilecraft.zoo.models import ZOO
    rows = []
    for name in names:
        z = ZOO[name]()
        d = tempfile.mkdtemp()
        fp, qp = os.path.join(d, "f.onnx"), os.path.join(d, "q.onnx")
        import onnx
        onnx.save(z.onnx_model, fp)
        quantize_dynamic(fp, qp, weight_type=QuantType.QInt8)
        feeds = z.inputs
        ref = _ort(fp).run(None, feeds)[0].astype(np.float64)
        peer = _ort(qp)
        vm = _ours(from_onnx(z.onnx_model), "int8-dynamic", upper_bounds=z.upper_bounds)
        args = list(feeds.values())
        t_ours, t_peer = side_by_side(lambda: vm["main"](*args), lambda: peer.run(None, feeds),
                                      number=3, rounds=5)
        row = {"mode": "int8-dynamic", "model": name, "peer": "onnxruntime quantize_dynamic",
               "ours_ms": t_ours * 1e3, "peer_ms": t_peer * 1e3, "ratio": t_peer / t_ours}
        row.update(_errors(_first(vm["main"](*args)), peer.run(None, feeds)[0], ref))
        rows.append(row)
    return rows


def _quantizable_float_model(model, work_dir: str):
    """The light model as onnxruntime's static quantization takes it: IR version 7 with the
    initializers no longer listed among the graph inputs (IR 3 lists them; the opset converter
    then fails on them), opset 13 or newer, and onnxruntime's quantization pre-processing (shape
    inference, the batch norms folded into the convolutions)."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process
    m = onnx.ModelProto.FromString(model.SerializeToString())
    m.ir_version = max(m.ir_version, 7)
    inits = {t.name for t in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in inits]
    del m.graph.input[:]
    m.graph.input.extend(inputs)
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset < 13:     # (a newer model, torch.onnx's, is taken as it is)
        m = onnx.version_converter.convert_version(m, 13)
    src, dst = os.path.join(work_dir, "f0.onnx"), os.path.join(work_dir, "f1.onnx")
    onnx.save(m, src)
    quant_pre_process(src, dst, skip_symbolic_shape=True)
    return onnx.load(dst)


def int8_static_rows(agreement_inputs: int = AGREEMENT_INPUTS, model: str = "resnet50",
                     mode: str = "int8") -> list[dict]:
    """Static int8 (QDQ) rows of a zoo classifier: ``resnet50`` (the ``int8`` row),
    ``mobilenet_v2`` (``int8-mbv2``: its depthwise layers run the int8 depthwise kernel)."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from tilecraft.zoo.models import ZOO
    z = ZOO[model]()
    (name, x0), = z.inputs.items()
    rng = np.random.default_rng(7)
    cal = [rng.standard_normal(x0.shape).astype(np.float32) for _ in range(CALIBRATION_INPUTS)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{name: x} for x in cal])

        def get_next(self):
            return next(self.it, None)
    d = tempfile.mkdtemp()
    fp, qp = os.path.join(d, "f.onnx"), os.path.join(d, "q.onnx")
    onnx.save(_quantizable_float_model(z.onnx_model, d), fp)
    quantize_static(fp, qp, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    fp32, peer = _ort(fp), _ort(qp)
    # ours quantizes the same float model (batch norms folded) that onnxruntime quantized
    vm = _ours(from_onnx(onnx.load(fp)), "int8", calibration=[(x,) for x in cal])
    t_ours, t_peer = side_by_side(lambda: vm["main"](x0), lambda: peer.run(None, {name: x0}),
                                  number=2, rounds=5)
    agree_ours = agree_peer = 0
    errs = []
    for i in range(agreement_inputs):
        x = rng.standard_normal(x0.shape).astype(np.float32)
        ref = fp32.run(None, {name: x})[0]
        o, p = _first(vm["main"](x)), peer.run(None, {name: x})[0]
        agree_ours += int(np.argmax(o) == np.argmax(ref))
        agree_peer += int(np.argmax(p) == np.argmax(ref))
        if i < 16:
            errs.append(_errors(o, p, ref.astype(np.float64)))
    row = {"mode": mode, "model": model, "peer": "onnxruntime QDQ static",
           "ours_ms": t_ours * 1e3, "peer_ms": t_peer * 1e3, "ratio": t_peer / t_ours,
           "inputs": agreement_inputs, "ours_top1": agree_ours / max(agreement_inputs, 1),
           "peer_top1": agree_peer / max(agreement_inputs, 1)}
    for k in errs[0] if errs else ():
        row[k] = float(np.min([e[k] for e in errs]) if k.endswith("cosine")
                       else np.max([e[k] for e in errs]))
    return [row]


def _dense_stack(k: int, n: int, weights: list):
    """``main(x)``: the tuple of ``x @ W`` for each of ``weights`` (``(k, n)`` each), the
    layers one after another as a model's blocks run them, each with its own weights."""
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Tuple, Var, const, op
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(op.matmul(x, const(w))) for w in weights]
            gv = bb.emit_output(Tuple(outs))
        bb.emit_func_output(gv)
    return bb.get()


def int4_layer_rows(stream_bytes: int = STREAM_BYTES) -> list[dict]:
    """Each GPT-2 small linear shape at one token, int4-g128 against our float32, with the
    weights streaming from memory as in the model: a call runs ``copies`` layers of the shape
    in sequence, each with its own weights, ``copies`` the most of 12 (GPT-2's blocks) and
    what makes the float32 weights ``stream_bytes`` (far more than the caches hold); the time
    per layer is the call's over ``copies``."""
    rng = np.random.default_rng(3)
    rows = []
    threads = int(os.environ.get("TILECRAFT_LOWP_LAYER_THREADS", "0") or 0)
    for k, n in GPT2_LINEAR:
        copies = max(12, -(-stream_bytes // (4 * k * n)))
        ws = [rng.normal(0, 0.02, (k, n)).astype(np.float32) for _ in range(copies)]
        mod = _dense_stack(k, n, ws)
        f32, q4 = _ours(mod, threads=threads), _ours(mod, "int4-g128", threads=threads)
        x = rng.standard_normal((1, k)).astype(np.float32)
        t_q4, t_f32 = side_by_side(lambda: q4["main"](x), lambda: f32["main"](x), number=10,
                                   rounds=7)
        row = {"mode": "int4-g128 layer", "model": f"gpt2 linear {k}x{n}, 1 token",
               "peer": "ours float32", "ours_ms": t_q4 * 1e3 / copies,
               "peer_ms": t_f32 * 1e3 / copies, "ratio": t_f32 / t_q4, "layers": copies,
               "float32_mb": copies * k * n * 4 / 1e6}
        if threads:
            row["threads"] = threads
        ref = x.astype(np.float64) @ ws[0]
        row.update(_errors(_first(q4["main"](x)), _first(f32["main"](x)), ref))
        rows.append(row)
    return rows


def int4_model_rows() -> list[dict]:
    from tilecraft.zoo.models import ZOO
    z = ZOO["gpt2_small"]()
    ids = z.inputs["input_ids"][:, :1]
    feeds = {"input_ids": ids}
    fp32 = _ort(z.onnx_model)
    peer = _ort(matmul_nbits_model(z.onnx_model, block_size=128))
    vm = _ours(from_onnx(z.onnx_model), "int4-g128", upper_bounds=z.upper_bounds)
    t_ours, t_peer = side_by_side(lambda: vm["main"](ids), lambda: peer.run(None, feeds),
                                  number=5, rounds=5)
    ref = fp32.run(None, feeds)[0].astype(np.float64)
    row = {"mode": "int4-g128", "model": "gpt2_small, 1 token", "peer":
           "onnxruntime MatMulNBits (4 bits, block 128)", "ours_ms": t_ours * 1e3,
           "peer_ms": t_peer * 1e3, "ratio": t_peer / t_ours}
    row.update(_errors(_first(vm["main"](ids)), peer.run(None, feeds)[0], ref))
    return [row]


def _gpu_device(kind: str):
    if kind == "opencl":
        try:
            return targets.opencl("NVIDIA")
        except Exception:
            return targets.opencl(0)
    return targets.webgpu(0)


def _gpu_device_name(dev) -> str:
    if dev.kind == "opencl":
        from tilecraft.targets.opencl_backend import list_devices
        return list_devices()[dev.index]["name"]
    from tilecraft.targets.webgpu_backend.runtime import list_adapters
    return list_adapters()[dev.index]["name"]


def _gpu_interleaved(vm_ours, vm_peer, dev, args, number: int) -> tuple[float, float]:
    """Median seconds per call of two executables on ``dev``, timed round by round."""
    e_ours = vm_ours.time_evaluator("main", dev, number=number, repeat=1)
    e_peer = vm_peer.time_evaluator("main", dev, number=number, repeat=1)
    t_ours, t_peer = [], []
    for _ in range(GPU_ROUNDS):
        t_ours.append(min(e_ours(*args).results))
        t_peer.append(min(e_peer(*args).results))
    return float(np.median(t_ours)), float(np.median(t_peer))


def _gpu_rows(kind: str, mode: str, measure) -> list[dict]:
    """``measure(kind, target, dev)``'s rows, or one error row naming why the target failed."""
    try:
        dev = _gpu_device(kind)
        rows = measure(kind, kind, dev)
    except Exception as err:       # a missing driver or adapter: a row, not a crash
        row = {"mode": mode, "target": kind, "error": f"{type(err).__name__}: {str(err)[:300]}"}
        print(row, file=sys.stderr, flush=True)
        return [row]
    name = _gpu_device_name(dev)
    return [dict(r, device=name) for r in rows]


def int4_gpu_layer_rows(targets_=None) -> list[dict]:
    """Each GPT-2 small linear shape at one token on each GPU target: ``GPU_LAYERS`` layers of
    the shape per call, our int4-g128 GEMV against our float32 build on the same target."""
    rng = np.random.default_rng(3)
    rows = []

    def measure(kind, target, dev):
        out = []
        for k, n in GPT2_LINEAR:
            ws = [rng.normal(0, 0.02, (k, n)).astype(np.float32) for _ in range(GPU_LAYERS)]
            mod = _dense_stack(k, n, ws)
            base = {"mode": ROW_MODES["int4-gpu-layers"], "target": target,
                    "model": f"gpt2 linear {k}x{n}, 1 token"}
            try:
                f32 = relax.VirtualMachine(relax.build(mod, target), dev)
                q4 = relax.VirtualMachine(relax.build(relax.quantize(mod, "int4-g128"), target),
                                          dev)
                x = rng.standard_normal((1, k)).astype(np.float32)
                xd = targets.array(x, dev)
                t_q4, t_f32 = _gpu_interleaved(q4, f32, dev, [xd], number=20)
                row = dict(base, peer="ours float32 (same target)",
                           ours_ms=t_q4 * 1e3 / GPU_LAYERS, peer_ms=t_f32 * 1e3 / GPU_LAYERS,
                           ratio=t_f32 / t_q4, layers=GPU_LAYERS)
                ref = x.astype(np.float64) @ ws[0]
                row.update(_errors(_first(q4["main"](x)), _first(f32["main"](x)), ref))
            except Exception as err:   # one failing shape does not hide the others
                row = dict(base, error=f"{type(err).__name__}: {str(err)[:300]}")
            print(row, file=sys.stderr, flush=True)
            out.append(row)
        return out

    for kind in targets_ or GPU_TARGETS:
        rows += _gpu_rows(kind, ROW_MODES["int4-gpu-layers"], measure)
    return rows


def _opencl_kernel_seconds(mod, argsets, dev, rounds: int) -> float:
    """Median over ``rounds`` of the mean device time of one call of ``mod``'s kernel, a call
    per argument set (the OpenCL profiling events' start to end of each kernel, summed: the
    host's enqueue time between calls is not counted)."""
    fn = mod[mod.entry_name]
    bound = [fn.bind(a) for a in argsets]
    d, bufs, env = bound[0]
    fn.run(d, bufs, dict(env), None)          # warm-up: compiles, checks
    dev.sync()
    per = []
    for _ in range(rounds):
        events: list = []
        for d, bufs, env in bound:
            fn.run(d, bufs, dict(env), events)
        dev.sync()
        per.append(sum((e.profile.end - e.profile.start) * 1e-9 for e in events) / len(bound))
    return float(np.median(per))


def _webgpu_kernel_seconds(mod, argsets, dev, rounds: int) -> float:
    """The same on WebGPU: the calls recorded into one command buffer, timed by the adapter's
    timestamps (else the wall time of its submission), over the number of calls."""
    from tilecraft.targets.webgpu_backend.module import _time_once
    fn = mod[mod.entry_name]
    commands: list = []
    ctx = None
    for a in argsets:
        ctx, cmds = fn._prepare(a)
        commands += cmds
    ctx.enqueue(commands[:len(commands) // len(argsets)])
    ctx.sync()
    return float(np.median([_time_once(ctx, commands, 1) / len(argsets)
                            for _ in range(rounds)]))


def _kernel_seconds(mod, argsets, dev, rounds: int = GPU_ROUNDS) -> float:
    if dev.kind == "opencl":
        return _opencl_kernel_seconds(mod, argsets, dev, rounds)
    return _webgpu_kernel_seconds(mod, argsets, dev, rounds)


def _copies(nbytes: int) -> int:
    return int(min(GEMV_MAX_COPIES, max(2, -(-GEMV_STREAM_BYTES // nbytes))))


def _torch_gemv_seconds(x: np.ndarray, w: np.ndarray, copies: int, rounds: int = GPU_ROUNDS):
    """PyTorch's ``x @ W`` on CUDA (float32, TF32 off), ``copies`` weights in turn, captured
    in a CUDA graph (no launch gaps), per call; None without a CUDA device."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    xt = torch.from_numpy(x).cuda()
    ws = [torch.from_numpy(w).cuda() for _ in range(copies)]
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for wt in ws[:3]:                     # warm-up: cuBLAS picks its kernel
            xt @ wt
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [xt @ wt for wt in ws]
    graph.replay()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) * 1e-3 / copies)
    del outs, ws
    return float(np.median(per))


def gemv_gpu_layer_rows(targets_=None, shapes=None) -> list[dict]:
    """Each dense shape of ``GEMV_SHAPES`` at one row, its kernel alone on each GPU target
    (device time, each call with its own copy of the weight, ``GEMV_STREAM_BYTES`` in all):
    the float32 GEMV (``relax.backend.gpu.gemv``; weight ``(K, N)`` as ONNX MatMul, and
    ``(N, K)`` as torch Linear), the GEMM rule it replaces (``gemv.GEMV_MAX_ROWS = 0``), the
    int4-g128 GEMV (``dense_int4``) and PyTorch's ``x @ W`` on CUDA (cuBLAS, float32, TF32
    off) beside. ``ratio``: PyTorch's time over our float32 GEMV's."""
    from tilecraft.relax import gpu_schedules
    from tilecraft.relax.backend.gpu import gemv
    from tilecraft.relax.backend.gpu.dense_int4 import (Q4GemvSpec, dense_q4_gemv_kernel,
                                                        kernel_operands, run_tile)
    from tilecraft.relax.transform.quantize_int4 import dequantize_int4, quantize_weight_int4
    from tilecraft.targets import Target
    from tilecraft.tensorir import IRModule, te

    def dense(k, n, layout):
        A = te.placeholder((1, k), "float32", "A")
        W = te.placeholder((k, n) if layout == "KN" else (n, k), "float32", "W")
        r = te.reduce_axis((0, k), "r")
        C = te.compute((1, n), lambda i, j: te.sum(
            A[i, r] * (W[r, j] if layout == "KN" else W[j, r]), axis=r), "C")
        return te.create_prim_func([A, W, C])

    rng = np.random.default_rng(5)
    peers, data = {}, {}

    def shape_data(k, n):
        """(x, w, reference, int4 spec, int4 operands, int4 reference) of a shape, made once
        for all targets (quantizing 4096 x 11008 takes seconds)."""
        if (k, n) not in data:
            x = rng.standard_normal((1, k), dtype=np.float32)
            w = rng.standard_normal((k, n), dtype=np.float32) * np.float32(1 / np.sqrt(k))
            codes, s, o = quantize_weight_int4(w, 128, symmetric=True)
            spec = Q4GemvSpec(lead=(1,), k=k, n=n, group_size=128, symmetric=True)
            q4_ref = x.astype(np.float64) @ dequantize_int4(codes, s, o, k, 128)
            data[(k, n)] = (x, w, x.astype(np.float64) @ w, spec,
                            kernel_operands(spec, codes, s, o), q4_ref)
        return data[(k, n)]

    def int4(row, target, dev, xd, y, spec, q4_ops, q4_ref):
        """The int4-g128 GEMV's time, error, launch shape and streams into ``row``."""
        k, n = spec.k, spec.n
        q4 = targets.build(IRModule({"dense_q4_gemv": dense_q4_gemv_kernel(
            spec, Target(target))}), target)
        q4_copies = _copies(sum(a.nbytes for a in q4_ops))
        args = [(xd, *[targets.array(a, dev) for a in q4_ops], y) for _ in range(q4_copies)]
        row["int4_us"] = _kernel_seconds(q4, args, dev) * 1e6
        q4[q4.entry_name](*args[0])
        row["int4_rel"] = float(np.abs(y.numpy() - q4_ref).max() / np.abs(q4_ref).max())
        tile = run_tile(spec)
        row["int4_tile"] = (f"{tile.cols} cols x {tile.split} threads, {tile.steps} runs a "
                            f"thread" if tile else "word kernel")
        # the codes' stream (K N / 2 bytes) and all the int4 operands' (the scales too)
        row["int4_codes_GBps"] = k * n / 2 / (row["int4_us"] * 1e-6) / 1e9
        row["int4_GBps"] = sum(a.nbytes for a in q4_ops) / (row["int4_us"] * 1e-6) / 1e9

    def measure(kind, target, dev):
        out = []
        for k, n in shapes or GEMV_SHAPES:
            row = {"mode": ROW_MODES["gemv-gpu-layers"], "target": target,
                   "model": f"dense {k}x{n}, 1 row"}
            x, w, ref, spec, q4_ops, q4_ref = shape_data(k, n)
            xd = targets.array(x, dev)
            y = targets.empty((1, n), "float32", dev)
            # the int4 GEMV first, on its own: a float32 weight over the device's buffer limit
            # (WebGPU's 128 MiB at 4096 x 11008) does not hide it
            try:
                int4(row, target, dev, xd, y, spec, q4_ops, q4_ref)
            except Exception as err:
                row["int4_error"] = f"{type(err).__name__}: {str(err)[:300]}"
            try:
                copies = _copies(4 * k * n)

                def f32(layout, rule_rows):
                    saved = gemv.GEMV_MAX_ROWS
                    gemv.GEMV_MAX_ROWS = rule_rows
                    try:
                        func = gpu_schedules.apply(dense(k, n, layout), Target(target))
                    finally:
                        gemv.GEMV_MAX_ROWS = saved
                    mod = targets.build(func, target)
                    wl = w if layout == "KN" else np.ascontiguousarray(w.T)
                    args = [(xd, targets.array(wl, dev), y) for _ in range(copies)]
                    t = _kernel_seconds(mod, args, dev)
                    mod[mod.entry_name](*args[0])
                    return t, float(np.abs(y.numpy() - ref).max() / np.abs(ref).max())

                row["ours_us"], row["ours_rel"] = (v * s for v, s in
                                                   zip(f32("KN", gemv.GEMV_MAX_ROWS), (1e6, 1)))
                t_nk, _ = f32("NK", gemv.GEMV_MAX_ROWS)
                t_rule, _ = f32("KN", 0)
                row.update(ours_nk_us=t_nk * 1e6, gemm_rule_us=t_rule * 1e6)
                if (k, n) not in peers:
                    peers[(k, n)] = _torch_gemv_seconds(x, w, copies)
                t_peer = peers[(k, n)]
                row.update(peer="PyTorch x @ W (CUDA graph, fp32, TF32 off)" if t_peer else
                           "none (no CUDA device for PyTorch)", copies=copies)
                row["ours_GBps"] = 4 * k * n / (row["ours_us"] * 1e-6) / 1e9
                row["ratio_vs_gemm_rule"] = row["gemm_rule_us"] / row["ours_us"]
                if "int4_us" in row:
                    row["int4_vs_ours"] = row["ours_us"] / row["int4_us"]
                if t_peer:
                    row.update(peer_us=t_peer * 1e6, ratio=t_peer * 1e6 / row["ours_us"],
                               peer_GBps=4 * k * n / t_peer / 1e9)
                    if "int4_us" in row:
                        row["int4_vs_peer"] = t_peer * 1e6 / row["int4_us"]
            except Exception as err:   # one failing shape does not hide the others
                row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            print(row, file=sys.stderr, flush=True)
            out.append(row)
        return out

    rows = []
    for kind in targets_ or GPU_TARGETS:
        rows += _gpu_rows(kind, ROW_MODES["gemv-gpu-layers"], measure)
    return rows


def int4_gpu_model_rows(targets_=None) -> list[dict]:
    """The whole GPT-2 small at one token on each GPU target: int4-g128 against our float32
    build on the same target; the errors against onnxruntime's float32 model."""
    from tilecraft.zoo.models import ZOO
    z = ZOO["gpt2_small"]()
    ids = z.inputs["input_ids"][:, :1]
    ref = _ort(z.onnx_model).run(None, {"input_ids": ids})[0].astype(np.float64)
    mod = from_onnx(z.onnx_model)
    qmod = relax.quantize(mod, "int4-g128")

    def measure(kind, target, dev):
        f32 = relax.VirtualMachine(relax.build(mod, target, upper_bounds=z.upper_bounds), dev)
        q4 = relax.VirtualMachine(relax.build(qmod, target, upper_bounds=z.upper_bounds), dev)
        t_q4, t_f32 = _gpu_interleaved(q4, f32, dev, [targets.array(ids, dev)], number=5)
        row = {"mode": ROW_MODES["int4-gpu"], "target": target, "model": "gpt2_small, 1 token",
               "peer": "ours float32 (same target)", "ours_ms": t_q4 * 1e3,
               "peer_ms": t_f32 * 1e3, "ratio": t_f32 / t_q4}
        row.update(_errors(_first(q4["main"](ids)), _first(f32["main"](ids)), ref))
        print(row, file=sys.stderr, flush=True)
        return [row]

    rows = []
    for kind in targets_ or GPU_TARGETS:
        rows += _gpu_rows(kind, ROW_MODES["int4-gpu"], measure)
    return rows


def run(rows=ROWS, agreement_inputs: int = AGREEMENT_INPUTS) -> list[dict]:
    """The int8 / int4 rows (``benchmarks.run``'s interface)."""
    out: list[dict] = []
    table = {"int8-dynamic": int8_dynamic_rows,
             "int8": lambda: int8_static_rows(agreement_inputs),
             "int8-mbv2": lambda: int8_static_rows(agreement_inputs, "mobilenet_v2",
                                                   ROW_MODES["int8-mbv2"]),
             "int4-layers": int4_layer_rows, "int4": int4_model_rows,
             "int4-gpu-layers": int4_gpu_layer_rows, "int4-gpu": int4_gpu_model_rows,
             "gemv-gpu-layers": gemv_gpu_layer_rows}
    for r in rows:
        try:
            out += table[r]()
        except Exception as err:            # one failing row does not hide the others
            out.append({"mode": r, "error": f"{type(err).__name__}: {err}"})
    return out


def main(argv=None) -> int:
    ensure_clean_openblas_env()
    p = argparse.ArgumentParser(prog="python -m benchmarks.lowp",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS),
                   help=f"comma-separated subset of {', '.join(ROWS)} (the default), or of "
                        f"the GPU rows {', '.join(GPU_ROWS)}")
    p.add_argument("--inputs", type=int, default=AGREEMENT_INPUTS,
                   help="random inputs for ResNet-50's top-1 agreement")
    args = p.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS + GPU_ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; known: {', '.join(ROWS + GPU_ROWS)}")
    if any(r in GPU_ROWS for r in rows) and any(r in ROWS for r in rows):
        p.error("the GPU rows are filed under the GPU's name: run them apart from the CPU rows")
    result = run(rows, args.inputs)
    if _cpu_target() != "llvm":
        result = [r if "device" in r else dict(r, cpu_target=_cpu_target()) for r in result]
    if _threads():
        result = [r if "device" in r else {"threads": _threads(), **r} for r in result]
    print_table(result, list(dict.fromkeys(k for r in result for k in r)))
    gpu = next((r["device"] for r in result if "device" in r), None)
    # a subset of the rows replaces those rows only: the machine's other rows are kept
    path = results_path("lowp", machine_name(gpu))
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            ran = {ROW_MODES[r] for r in rows}
            done = {(r.get("mode"), r.get("target")) for r in result}
            # a GPU row of a target not run this time is kept
            kept = [r for r in json.load(f).get("rows", []) if r.get("mode") not in ran or
                    ("target" in r and (r.get("mode"), r.get("target")) not in done)]
        order = {m: k for k, m in enumerate(ROW_MODES.values())}
        result = sorted(kept + result, key=lambda r: order.get(r.get("mode"), len(order)))
    print(f"(written to {write_results('lowp', result, gpu=gpu)})")
    return 0 if all("error" not in r for r in result) else 1


if __name__ == "__main__":
    sys.exit(main())
