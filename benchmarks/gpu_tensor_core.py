"""The tensor-core fp16 GEMM of NVIDIA OpenCL (``relax.backend.gpu.tensor_core``, inline PTX
``mma.sync``) on BERT-base's dense layers, beside our float32 GEMM and PyTorch's float16
``addmm`` on CUDA, in one process.

Each layer is one kernel ``x @ W + bias`` with ``x`` of shape ``(n, 128, K)`` (a symbolic batch
``n``, as the imported model has), at batch 1 and 16 (M = 128 and 2048), for (K, N) in BERT's
768 x 768 (query / key / value / attention output), 768 x 3072 and 3072 x 768 (the FFN):

- ``fp32``: the float32 kernel under the default GPU schedule for ``Target("opencl")``;
- ``fp16_simt``: the float16 kernel (float16 x, W; float32 bias and output) for
  ``Target("opencl")``: float16 as a storage format, float arithmetic (what the fp16 mode ran on
  NVIDIA before);
- ``fp16_tc``: the same kernel for ``Target("opencl -device=nvidia")``: the tensor cores;
- ``torch_fp16``: ``torch.addmm(bias, x, W)`` in float16 on CUDA (PyTorch's default
  ``allow_fp16_reduced_precision_reduction``), CUDA events.

Every result is checked against float64 numpy of the float16-rounded operands before it is
timed (``time_evaluator``: best of 3 repeats of 20 calls). ``tc_vs_fp32`` = fp32 time / fp16_tc
time; ``tc_vs_torch`` = PyTorch's time / ours (above 1: we are faster); ``tflops`` of fp16_tc.
``TILECRAFT_TC_TILE=BMxBNxWMxWN`` forces a tile (``tensor_core.choose_tile``);
``TILECRAFT_TC_TARGET`` replaces the tensor-core target string (``opencl -device=nvidia``).

``TILECRAFT_TC_VARIANTS`` (comma-separated) times several builds of the tensor-core kernel in
the same run, each checked against the same reference: a variant is a name of ``VARIANTS``
(``base``: 32-bit fragment loads, register staging, no split-K; ``ldm``: ``ldmatrix``;
``ldm_async2`` / ``ldm_async3``: ``ldmatrix`` and a ``cp.async`` ring of 2 / 3 stages;
``async2``: the ring without ``ldmatrix``; ``split``: ``base`` with split-K; ``ldm_split``:
``ldmatrix``, register staging and split-K, the default build; ``all`` / ``all3``:
``ldmatrix``, the ring of 2 / 3 stages and split-K),
optionally with a tile, ``ldm_async2:64x128x32x64``. Each gives the
columns ``<variant>_ms``, ``<variant>_err``, ``<variant>_tflops``; ``best`` names the fastest
correct variant of the row, and ``fp16_tc_ms`` (with ``tc_vs_fp32``, ``tc_vs_torch``,
``tflops``) is the variant of least total time over the rows (``best_variant`` in the file). Without it, one tensor-core build under the environment as it is
(``fp16_tc``; ``TILECRAFT_TC_LDMATRIX`` / ``TILECRAFT_TC_STAGES`` / ``TILECRAFT_TC_SPLITK``,
``tensor_core.TensorCoreOptions``).

``python -m benchmarks.gpu_tensor_core --env ldm_async2`` prints the ``export`` lines of a
variant (``benchmarks/tc_device.sh`` runs the BERT layer with the best one).

Run on the GPU machine: ``python -m benchmarks.gpu_tensor_core``; here (PoCL) a check of the
script: ``TILECRAFT_TC_SMOKE=1 python -m benchmarks.gpu_tensor_core`` (``benchmarks/lowp_device.sh``
runs it); results ``benchmarks/results/gpu_tensor_core/<gpu>.json``.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from .common import print_table, write_results
from .gpu_common import gpu_device, torch_cuda_seconds, with_env

# TILECRAFT_TC_SMOKE=1: small shapes, the emulated tensor cores, no timing worth reading (a
# check of the script on PoCL)
SMOKE = os.environ.get("TILECRAFT_TC_SMOKE", "") not in ("", "0")
SEQ = 16 if SMOKE else 128
SHAPES = ((64, 128),) if SMOKE else ((768, 768), (768, 3072), (3072, 768))
BATCHES = (1, 2) if SMOKE else (1, 16)
# TILECRAFT_TC_TARGET: another tensor-core target string (e.g. with
# -max-shared-memory-per-block=49152: the cp.async ring of the 128 x 128 tile at k-steps of 32)
TC_TARGET = os.environ.get("TILECRAFT_TC_TARGET") or (
    "opencl -device=nvidia-emulated" if SMOKE else "opencl -device=nvidia")
# the variants' environment (tensor_core.TensorCoreOptions)
VARIANTS = {
    name: {"TILECRAFT_TC_LDMATRIX": ldm, "TILECRAFT_TC_STAGES": stages,
           "TILECRAFT_TC_SPLITK": split}
    for name, (ldm, stages, split) in {
        "base": ("0", "1", "0"), "ldm": ("1", "1", "0"), "ldm_async2": ("1", "2", "0"),
        "ldm_async3": ("1", "3", "0"), "async2": ("0", "2", "0"), "split": ("0", "1", "1"),
        "ldm_split": ("1", "1", "1"), "all": ("1", "2", "1"), "all3": ("1", "3", "1")}.items()}
TC_VARIANTS = [v for v in os.environ.get("TILECRAFT_TC_VARIANTS", "").split(",") if v]


def variant_env(variant: str) -> dict:
    """The environment of ``variant`` (``name`` or ``name:BMxBNxWMxWN``); ``ValueError`` for
    an unknown name.

    >>> variant_env("ldm:64x64x32x32")["TILECRAFT_TC_TILE"]
    '64x64x32x32'
    """
    name, _, tile = variant.partition(":")
    if name not in VARIANTS:
        raise ValueError(f"TILECRAFT_TC_VARIANTS: unknown variant {name!r} "
                         f"(known: {', '.join(VARIANTS)})")
    env = dict(VARIANTS[name])
    if tile:
        env["TILECRAFT_TC_TILE"] = tile
    return env


def dense_func(K: int, N: int, dtype: str):
    """``(x[n, 128, K] @ W[K, N]).astype(float32) + bias`` (float32 bias and output)."""
    from tilecraft.tensorir import te
    n = te.var("n")
    x = te.placeholder((n, SEQ, K), dtype, "x")
    w = te.placeholder((K, N), dtype, "w")
    b = te.placeholder((N,), "float32", "bias")
    k = te.reduce_axis((0, K), "k")
    mm = te.compute((n, SEQ, N), lambda i, s, j: te.sum(
        x[i, s, k].astype("float32") * w[k, j].astype("float32"), axis=k), "matmul")
    out = te.compute((n, SEQ, N), lambda i, s, j: mm[i, s, j] + b[j], "out")
    return te.create_prim_func([x, w, b, out])


def _kernel(K, N, dtype, target):
    from tilecraft import targets
    from tilecraft.relax import gpu_schedules
    from tilecraft.targets import Target
    t = Target(target)
    return targets.build(gpu_schedules.apply(dense_func(K, N, dtype), t), t)


def run() -> list[dict]:
    from tilecraft import targets
    dev = gpu_device("opencl")
    rng = np.random.default_rng(0)
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        torch, cuda = None, False
    rows = []
    for K, N in SHAPES:
        mods = {"fp32": _kernel(K, N, "float32", "opencl"),
                "fp16_simt": _kernel(K, N, "float16", "opencl")}
        tc_names = TC_VARIANTS or ["fp16_tc"]
        for name in tc_names:
            env = variant_env(name) if TC_VARIANTS else {}
            try:
                mods[name] = with_env(env, lambda: _kernel(K, N, "float16", TC_TARGET))
            except Exception as err:     # a variant that does not build: its error, the rest
                print(f"{name} {K}x{N}: {type(err).__name__}: {err}", flush=True)
                mods[name] = err
                continue
            src = mods[name].get_source()
            assert "mma.sync" in src or "tc_mma_emulated(" in src, "no tensor-core kernel"
        for batch in BATCHES:
            x = rng.standard_normal((batch, SEQ, K)).astype(np.float32)
            w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
            b = rng.standard_normal(N).astype(np.float32)
            ref = x.astype(np.float16).astype(np.float64) @ \
                w.astype(np.float16).astype(np.float64) + b
            row = {"K": K, "N": N, "batch": batch, "M": batch * SEQ}
            for name, mod in mods.items():
                if isinstance(mod, Exception):
                    row[f"{name}_error"] = f"{type(mod).__name__}: {str(mod)[:200]}"
                    continue
                dt = "float32" if name == "fp32" else "float16"
                args = [targets.array(x.astype(dt), dev), targets.array(w.astype(dt), dev),
                        targets.array(b, dev), targets.empty((batch, SEQ, N), "float32", dev)]
                try:
                    mod["main"](*args)
                except Exception as err:     # a variant the driver refuses: its error, the rest
                    row[f"{name}_error"] = f"{type(err).__name__}: {str(err)[:200]}"
                    continue
                got = args[-1].numpy()
                err = float(np.abs(got - ref).max() / np.abs(ref).max())
                row[f"{name}_err"] = err
                if err > (1e-2 if name == "fp32" else 3e-3):
                    row[f"{name}_error"] = f"relative error {err:.2e}"
                    continue
                t = min(mod.time_evaluator("main", dev, number=20, repeat=3)(*args).results)
                row[f"{name}_ms"] = t * 1e3
            if cuda:
                xt = torch.from_numpy(x.reshape(-1, K)).cuda().half()
                wt = torch.from_numpy(w).cuda().half()
                bt = torch.from_numpy(b).cuda().half()
                row["torch_fp16_ms"] = torch_cuda_seconds(
                    torch, lambda: torch.addmm(bt, xt, wt), 20, 3, best=True) * 1e3
            flops = 2 * batch * SEQ * K * N
            timed = {n: row[f"{n}_ms"] for n in tc_names if row.get(f"{n}_ms")}
            for n, ms in timed.items():
                if TC_VARIANTS:
                    row[f"{n}_tflops"] = flops / (ms * 1e-3) / 1e12
            if TC_VARIANTS and timed:
                row["best"] = min(timed, key=timed.get)
            _ratios(row)
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()},
                  flush=True)
    extra = {}
    if TC_VARIANTS:
        # fp16_tc (the summary columns, benchmarks.results_table) is the variant of least
        # total time, one build for every row (``best`` names each row's fastest)
        best = best_variant(rows)
        for row in rows:
            if best and row.get(f"{best}_ms"):
                row["fp16_tc_ms"] = row[f"{best}_ms"]
                _ratios(row)
        extra = {"variants": {v: variant_env(v) for v in TC_VARIANTS}, "best_variant": best}
        print(f"best variant: {best}", flush=True)
    if SMOKE:
        print("(smoke run: no results written)")
        return rows
    gpu = torch.cuda.get_device_name(0) if cuda else None
    write_results("gpu_tensor_core", rows, extra, gpu=gpu)
    return rows


def _ratios(row: dict) -> None:
    """``tflops``, ``tc_vs_fp32`` and ``tc_vs_torch`` of the row's ``fp16_tc_ms``."""
    tc = row.get("fp16_tc_ms")
    if tc:
        row["tflops"] = 2 * row["M"] * row["K"] * row["N"] / (tc * 1e-3) / 1e12
        if row.get("fp32_ms"):
            row["tc_vs_fp32"] = row["fp32_ms"] / tc
        if row.get("torch_fp16_ms"):
            row["tc_vs_torch"] = row["torch_fp16_ms"] / tc


def best_variant(rows: list[dict]) -> str | None:
    """The variant of the least total time over the rows among those correct on every row
    (None if none is)."""
    totals = {}
    for v in TC_VARIANTS:
        if all(r.get(f"{v}_ms") for r in rows):
            totals[v] = sum(r[f"{v}_ms"] for r in rows)
    return min(totals, key=totals.get) if totals else None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--env"]:
        # the shell lines that select a variant (benchmarks/tc_device.sh)
        for k, v in variant_env(argv[1]).items():
            print(f"export {k}={v}")
        return 0
    rows = run()
    if TC_VARIANTS:
        print_table(rows, ["K", "N", "batch", "fp32_ms", "torch_fp16_ms",
                           *[f"{v}_ms" for v in TC_VARIANTS], "best", "tc_vs_fp32",
                           "tc_vs_torch", "tflops"])
        print_table(rows, ["K", "N", "batch", *[f"{v}_err" for v in TC_VARIANTS]])
    else:
        print_table(rows, ["K", "N", "batch", "fp32_ms", "fp16_simt_ms", "fp16_tc_ms",
                           "torch_fp16_ms", "tc_vs_fp32", "tc_vs_torch", "tflops",
                           "fp16_tc_err"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
