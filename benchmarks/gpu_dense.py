"""The dense layers of BERT-base and GPT-2 small (sequence 128) alone on the GPU, under the GEMM
rule before and after its dense-layer changes, beside ``torch.addmm`` on CUDA in the same
process (fp32, TF32 off).

Each layer is a Relax function ``epilogue(x @ W + b)`` on ``x`` of shape ``(n, 128, K)`` with a
symbolic batch ``n`` (upper bound 16), as ``relax.frontend.from_onnx`` imports the models'
MatMul + Add (``benchmarks.gpu_models`` builds the same kernels): one fused kernel with up to
three tiles chosen per call by the batch (``relax.backend.gpu.batch_dispatch``). Layers
(``LAYERS``; BERT's attention output and GPT-2's attention projection are one shape, as are the
two models' second FFN layers):

- ``qkv_768``: BERT's query, key and value (768 -> 768 + bias, 3 a layer);
- ``out_768_res``: attention output, 768 -> 768 + bias + residual (BERT, GPT-2);
- ``ffn1_3072_gelu``: BERT's 768 -> 3072 + bias, GELU (erf) in the epilogue;
- ``ffn2_768_res``: 3072 -> 768 + bias + residual (BERT, GPT-2);
- ``gpt2_qkv_2304``: GPT-2's fused query / key / value, 768 -> 2304 + bias;
- ``gpt2_fc_3072_gelu``: GPT-2's 768 -> 3072 + bias, GELU (tanh) in the epilogue.

Variants (``VARIANTS``), each built from the same module: ``nosplitk`` — the defaults with
split-K off (``TILECRAFT_GPU_SPLITK=0`` while it builds: the rule before split-K);
``old`` — the rule before the dense-layer changes: no
work-group balancing (``gemm.GEMM_BALANCE_MPS = 0``) and the row tile's padding dropped under a
symbolic batch (``tensorir.transform.compact`` as it was: a padded tile whose outermost dim is
symbolic was compacted without its padding); ``pad`` — the padding kept, no balancing;
``new`` — the defaults (balanced over 132 multiprocessors: one work-group each a wave);
``new264`` — balanced over 264 slots (two resident work-groups a multiprocessor a wave: the
other reading of the same occupancy; it keeps 64 x 128 for the 768-wide layers at batch 16 and
halves the FFN's 128 x 128 there instead). Every result is checked against float64 numpy at
each batch before it is timed (``vm.time_evaluator``: best of 3 repeats of 20 calls, the input
on the device).
PyTorch: CUDA events around 20 calls of ``addmm`` (bias) plus the epilogue in eager ops (the
residual add, the GELU), best of 3; ``addmm_ms`` is ``addmm`` alone. ``vs_torch`` = PyTorch's
time / ours (above 1: we are faster); ``tflops`` counts 2 per multiply-add; ``accumulators``
lists each kernel's register tile a thread (OpenCL; the kernels in the order batch 1, from
``GEMM_SMALL_BATCH``, from ``GEMM_LARGE_BATCH``: ``[2, 16, 32]`` is 1 x 2, 4 x 4, 4 x 8; with
split-K the two kernels below ``GEMM_SPLITK_BATCH`` come first, the partials' tile and the
sum's 4 outputs a thread: ``[16, 4, 2, 16]``); ``split_k_parts`` the parts ``S`` of the
schedule the batch runs (1: not split; ``relax.backend.gpu.split_k``).

Run: ``python -m benchmarks.gpu_dense`` on the GPU machine (about a minute on OpenCL). Split-K
before / after in one run, both targets:
``TILECRAFT_GPU_DENSE_VARIANTS=nosplitk,new TILECRAFT_GPU_DENSE_BATCHES=1,2,3,16
TILECRAFT_GPU_DENSE_TARGETS=opencl,webgpu python -m benchmarks.gpu_dense``.
``TILECRAFT_GPU_DENSE_LAYERS`` (comma-separated names of ``LAYERS``, default all),
``TILECRAFT_GPU_DENSE_TARGETS`` (``opencl``; ``opencl,webgpu`` for both),
``TILECRAFT_GPU_DENSE_BATCHES`` (``1,8,16``), ``TILECRAFT_GPU_DENSE_VARIANTS``
(``nosplitk,old,pad,new,new264``), ``TILECRAFT_GPU_DENSE_SECONDS`` (90: no new layer starts after this many
seconds). Results: ``benchmarks/results/gpu_dense/<machine>.json`` (the machine: the CUDA GPU
PyTorch ran on, else this CPU's name).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import time

import numpy as np

from .common import print_table, write_results
from .gpu_common import gpu_device, torch_cuda_seconds

SEQ = 128
UPPER_BATCH = 16
# (name, K, N, epilogue, count a layer, models)
LAYERS = (
    ("qkv_768", 768, 768, "bias", 3, "bert"),
    ("out_768_res", 768, 768, "residual", 1, "bert,gpt2"),
    ("ffn1_3072_gelu", 768, 3072, "gelu_erf", 1, "bert"),
    ("ffn2_768_res", 3072, 768, "residual", 1, "bert,gpt2"),
    ("gpt2_qkv_2304", 768, 2304, "bias", 1, "gpt2"),
    ("gpt2_fc_3072_gelu", 768, 3072, "gelu_tanh", 1, "gpt2"),
)
# variant -> (gemm.GEMM_BALANCE_MPS, whether the row tile's padding is dropped as before)
VARIANTS = {"nosplitk": (None, False), "old": (0, True), "pad": (0, False),
            "new": (None, False), "new264": (264, False)}
BATCHES = [int(b) for b in os.environ.get("TILECRAFT_GPU_DENSE_BATCHES", "1,8,16").split(",")]

WRITES_RESULTS = True


def _module(K: int, N: int, epilogue: str, rng):
    """``epilogue(x @ W + b)`` over ``x: (n, SEQ, K)`` (and the residual ``r: (n, SEQ, N)``),
    written as the ONNX importer emits it; returns (module, W, b)."""
    from tilecraft import tensorir
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
    w = (rng.standard_normal((K, N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal((N,)).astype("float32")
    n = tensorir.var("n")
    x = Var("x", TensorStructInfo((n, SEQ, K), "float32"))
    params = [x]
    if epilogue == "residual":
        params.append(Var("r", TensorStructInfo((n, SEQ, N), "float32")))
    f32 = lambda v: const(np.float32(v))    # noqa: E731
    bb = BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(op.add(bb.emit(op.matmul(x, const(w))), const(b)))
            if epilogue == "residual":
                y = bb.emit(op.add(y, params[1]))
            elif epilogue == "gelu_erf":     # y * 0.5 * (1 + erf(y / sqrt(2)))
                e = bb.emit(op.add(bb.emit(op.erf(bb.emit(op.divide(y, f32(math.sqrt(2)))))),
                                   f32(1.0)))
                y = bb.emit(op.multiply(bb.emit(op.multiply(y, e)), f32(0.5)))
            elif epilogue == "gelu_tanh":    # 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3)))
                cube = bb.emit(op.multiply(bb.emit(op.multiply(y, y)), y))
                inner = bb.emit(op.multiply(bb.emit(op.add(y, bb.emit(
                    op.multiply(cube, f32(0.044715))))), f32(math.sqrt(2 / math.pi))))
                t = bb.emit(op.add(bb.emit(op.tanh(inner)), f32(1.0)))
                y = bb.emit(op.multiply(bb.emit(op.multiply(y, f32(0.5))), t))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), w, b


def _reference(x, r, w, b, epilogue: str) -> np.ndarray:
    y = x.astype("float64") @ w.astype("float64") + b
    if epilogue == "residual":
        return y + r
    if epilogue == "gelu_erf":      # numpy has no erf: PyTorch's on the CPU, in float64
        import torch
        return y * 0.5 * (1 + torch.erf(torch.from_numpy(y / math.sqrt(2))).numpy())
    if epilogue == "gelu_tanh":
        return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    return y


def _torch_seconds(torch, x, r, w, b, epilogue: str, number=20, repeat=3):
    """(full layer, addmm alone) seconds per call on CUDA."""
    import torch.nn.functional as F
    K, N = w.shape
    xt = torch.from_numpy(x.reshape(-1, K)).cuda()
    wt, bt = torch.from_numpy(w).cuda(), torch.from_numpy(b).cuda()
    rt = torch.from_numpy(r.reshape(-1, N)).cuda() if r is not None else None

    def addmm():
        return torch.addmm(bt, xt, wt)

    def layer():
        y = torch.addmm(bt, xt, wt)
        if epilogue == "residual":
            return y + rt
        if epilogue == "gelu_erf":
            return F.gelu(y)
        if epilogue == "gelu_tanh":
            return F.gelu(y, approximate="tanh")
        return y

    with torch.no_grad():
        return (torch_cuda_seconds(torch, layer, number, repeat, best=True),
                torch_cuda_seconds(torch, addmm, number, repeat, best=True))


@contextlib.contextmanager
def rule(variant: str):
    """The GEMM rule of ``variant`` (see the module docstring) while a module builds."""
    from tilecraft.relax.backend.gpu import gemm
    from tilecraft.tensorir.transform import compact
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    balance, unpadded = VARIANTS[variant]
    saved = gemm.GEMM_BALANCE_MPS, compact._compact_strides
    saved_env = os.environ.get("TILECRAFT_GPU_SPLITK")
    if variant == "nosplitk":
        os.environ["TILECRAFT_GPU_SPLITK"] = "0"
    if balance is not None:
        gemm.GEMM_BALANCE_MPS = balance
    if unpadded:
        fixed = compact._compact_strides

        def dropped_under_symbolic_outer(buf, shape):
            # before: a symbolic outermost extent made compaction drop the padded strides
            if buf.strides is not None and buf.shape and not hasattr(buf.shape[0], "value"):
                return None
            return fixed(buf, shape)
        compact._compact_strides = dropped_under_symbolic_outer
    try:
        yield
    finally:
        gemm.GEMM_BALANCE_MPS, compact._compact_strides = saved
        if variant == "nosplitk":
            if saved_env is None:
                os.environ.pop("TILECRAFT_GPU_SPLITK", None)
            else:
                os.environ["TILECRAFT_GPU_SPLITK"] = saved_env


def accumulators(exe) -> list[int]:
    """Per kernel of an OpenCL build (in the order batch 1, nominal, large), the register tile
    a thread accumulates (the first private array a kernel declares); [] for other targets."""
    try:
        src = exe.kernel_module.get_source()
    except Exception:   # a module without one OpenCL source text
        return []
    out = []
    for kernel in src.split("__kernel ")[1:]:
        found = re.search(r"\n  float \w+_local\[(\d+)\];", kernel)
        out.append(int(found.group(1)) if found else 0)
    return out


def split_k_parts(K: int, N: int, batch: int, kind: str, variant: str) -> int:
    """The parts ``S`` of the schedule a build of ``variant`` runs at ``batch`` (1: not
    split): the split-K rule at the batch that schedule is sized for (``relax.gpu_schedules``:
    1 below ``GEMM_SPLITK_BATCH``, none up to ``GEMM_SMALL_BATCH``, then
    ``GEMM_NOMINAL_BATCH`` and ``GEMM_LARGE_NOMINAL_BATCH``)."""
    from tilecraft import tensorir
    from tilecraft.relax.backend.gpu import gemm, split_k
    from tilecraft.targets import Target
    from tilecraft.tensorir import te
    from tilecraft.tensorir.schedule import Schedule
    if batch < split_k.GEMM_SPLITK_BATCH:
        nominal = 1
    elif batch < gemm.GEMM_SMALL_BATCH:
        return 1
    elif gemm.GEMM_LARGE_BATCH and batch >= gemm.GEMM_LARGE_BATCH:
        nominal = gemm.GEMM_LARGE_NOMINAL_BATCH
    else:
        nominal = gemm.GEMM_NOMINAL_BATCH
    n = tensorir.var("n")
    x = te.placeholder((n, SEQ, K), "float32", "x")
    w = te.placeholder((K, N), "float32", "w")
    k = te.reduce_axis((0, K), "k")
    y = te.compute((n, SEQ, N), lambda b, i, j: te.sum(x[b, i, k] * w[k, j], axis=k), "y")
    sch = Schedule(te.create_prim_func([x, w, y]))
    with rule(variant):
        return split_k.split_factor(sch, sch.get_block("y"), Target(kind),
                                    nominal_batch=nominal)


def build(mod, kind: str, variant: str):
    """``relax.build`` of ``mod`` for ``kind`` under the rule of ``variant``."""
    from tilecraft import relax
    with rule(variant):
        return relax.build(mod, kind, upper_bounds={"n": UPPER_BATCH})


def run() -> list[dict]:
    """The rows, also written to ``benchmarks/results/gpu_dense/<machine>.json``."""
    import torch
    from tilecraft import relax, targets
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = torch.cuda.is_available()
    gpu_name = torch.cuda.get_device_name(0) if cuda else "no-cuda"
    pick = [s for s in os.environ.get("TILECRAFT_GPU_DENSE_LAYERS", "").split(",") if s]
    kinds = os.environ.get("TILECRAFT_GPU_DENSE_TARGETS", "opencl").split(",")
    variants = os.environ.get("TILECRAFT_GPU_DENSE_VARIANTS", ",".join(VARIANTS)).split(",")
    budget = float(os.environ.get("TILECRAFT_GPU_DENSE_SECONDS", "90"))
    unknown = set(pick) - {layer[0] for layer in LAYERS}
    if unknown:
        raise SystemExit(f"unknown layers {sorted(unknown)}; known: {[l[0] for l in LAYERS]}")
    rng = np.random.default_rng(0)
    rows, start = [], time.perf_counter()
    for name, K, N, epilogue, count, models in LAYERS:
        if pick and name not in pick:
            continue
        if time.perf_counter() - start > budget:
            rows.append({"layer": name, "error": f"skipped: past the {budget:.0f} s budget"})
            continue
        mod, w, b = _module(K, N, epilogue, rng)
        inputs = {}
        for bsz in BATCHES:
            x = rng.standard_normal((bsz, SEQ, K)).astype("float32")
            r = (rng.standard_normal((bsz, SEQ, N)).astype("float32")
                 if epilogue == "residual" else None)
            peer = _torch_seconds(torch, x, r, w, b, epilogue) if cuda else None
            inputs[bsz] = (x, r, _reference(x, r, w, b, epilogue), peer)
        for kind in kinds:
            for variant in variants:
                try:
                    dev = gpu_device(kind)
                    t0 = time.perf_counter()
                    exe = build(mod, kind, variant)
                    build_s = time.perf_counter() - t0
                    vm = relax.VirtualMachine(exe, dev)
                except Exception as err:  # a missing driver or a build failure is a row
                    rows.append({"layer": name, "target": kind, "variant": variant,
                                 "error": f"{type(err).__name__}: {str(err)[:300]}"})
                    print(f"{name} {kind} {variant}: {rows[-1]['error']}", file=sys.stderr)
                    continue
                for bsz in BATCHES:
                    x, r, ref, peer = inputs[bsz]
                    try:
                        args = [targets.array(x, dev)]
                        if r is not None:
                            args.append(targets.array(r, dev))
                        got = vm["main"](*args).numpy()
                        err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
                        if not err < 1e-4:
                            raise AssertionError(f"wrong result: max rel err {err:.2e}")
                        ours = min(vm.time_evaluator("main", dev, number=20, repeat=3)(
                            *args).results)
                    except Exception as e:  # keep the other rows
                        rows.append({"layer": name, "target": kind, "variant": variant,
                                     "batch": bsz, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                        print(f"{name} {kind} {variant} b{bsz}: {rows[-1]['error']}",
                              file=sys.stderr)
                        continue
                    flops = 2.0 * bsz * SEQ * K * N
                    row = {"layer": name, "models": models, "count": count, "target": kind,
                           "variant": variant, "batch": bsz, "M": bsz * SEQ, "K": K, "N": N,
                           "epilogue": epilogue, "build_s": round(build_s, 2),
                           "accumulators": accumulators(exe),
                           "split_k_parts": split_k_parts(K, N, bsz, kind, variant),
                           "tilecraft_ms": ours * 1e3, "tflops": flops / ours * 1e-12,
                           "max_rel_err": err}
                    if peer is not None:
                        full, addmm = peer
                        row.update(torch_ms=full * 1e3, addmm_ms=addmm * 1e3,
                                   torch_tflops=flops / full * 1e-12, vs_torch=full / ours)
                    rows.append(row)
                    print(f"{name} {kind} {variant} b{bsz}: {ours * 1e3:.3f} ms "
                          f"{row['tflops']:.1f} TFLOP/s" +
                          (f", torch {peer[0] * 1e3:.3f} ms, ratio {peer[0] / ours:.2f}"
                           if peer else ""), flush=True)
        # written after every layer, so a run cut short keeps its rows
        write_results("gpu_dense", rows, {"gpu": gpu_name, "seq": SEQ},
                      gpu=gpu_name if cuda else None)
    path = write_results("gpu_dense", rows, {"gpu": gpu_name, "seq": SEQ},
                         gpu=gpu_name if cuda else None)
    print(f"(written to {path})")
    return rows


def main() -> int:
    rows = run()
    print_table([r for r in rows if "error" not in r],
                ["layer", "target", "variant", "batch", "split_k_parts", "tilecraft_ms", "tflops",
                 "torch_ms", "vs_torch"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
