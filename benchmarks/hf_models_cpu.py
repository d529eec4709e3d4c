"""Hugging Face exports on the CPU, untuned, as a new user runs them: tilecraft beside
onnxruntime and PyTorch eager in one process, and a symbolic-shape build beside a build for the
concrete shape.

``python -m benchmarks.run hf_models_cpu`` (or ``python -m benchmarks.hf_models_cpu
[--models gpt2,mobilenet-v2] [--sizes small,large]``). Each model of ``MODELS`` (random-weight
``transformers`` configs of realistic width, nothing downloaded) is exported to ONNX with
``torch.onnx.export`` (dynamic batch, and for text a dynamic sequence length) and imported with
``relax.frontend.from_onnx``; it is built once with the symbolic dims (``symbolic``) and once
per measured size with the dims fixed (``concrete``). Sizes: batch 1 with a short input (8
tokens) and batch 8 with 128 tokens (images: batch 1 and 8).

Rows: ``model``, ``size``, ``symbolic_ms``, ``concrete_ms``, ``onnxruntime_ms``, ``torch_ms``,
``vs_ort`` (onnxruntime / symbolic: above 1 we are faster), ``vs_torch``, ``sym_cost``
(symbolic / concrete: the price of one artifact for every shape), ``top_kernel`` and
``top_share`` (the kernel of the symbolic build that takes the largest share of its time, from
``vm.profile``), ``max_rel_err`` (against onnxruntime).

Timing: every side on one thread (``TILECRAFT_HF_THREADS``, default 1: tilecraft's
``num_threads``, onnxruntime's ``intra_op_num_threads``, ``torch.set_num_threads``), so each
runs on the calling thread, and the clock is that thread's CPU time (``time.thread_time``),
interleaved round by round, the median of the rounds. On a machine shared with other work a
wall clock measures the other work's scheduling more than ours; the CPU time of the one thread
that does the work does not (``TILECRAFT_HF_CLOCK=wall`` for wall time, with more threads).
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import time
import sys
import warnings

import numpy as np
import torch

from tilecraft import relax, targets
from tilecraft.relax.frontend import from_onnx
from tilecraft.timing import calls_per_round
from tilecraft.zoo.run import ort_session

WRITES_RESULTS = False   # benchmarks.run writes the rows (hf_models_cpu/<machine>.json)

# (batch, tokens) for text, batch for images
TEXT_SIZES = {"small": (1, 8), "large": (8, 128)}
IMAGE_SIZES = {"small": 1, "large": 8}


def _gpt2():
    import transformers
    cfg = transformers.GPT2Config(vocab_size=1000, n_embd=256, n_layer=4, n_head=4,
                                  n_positions=256, use_cache=False)
    return transformers.GPT2Model(cfg)


def _bert():
    import transformers
    cfg = transformers.BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4,
                                  num_attention_heads=4, intermediate_size=1024,
                                  max_position_embeddings=256)
    return transformers.BertModel(cfg)


def _mobilenet_v2():
    import transformers
    cfg = transformers.MobileNetV2Config(image_size=224)
    return transformers.MobileNetV2Model(cfg)


def _resnet18():
    import transformers
    cfg = transformers.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512],
                                    depths=[2, 2, 2, 2], layer_type="basic")
    return transformers.ResNetModel(cfg)


class LastHidden(torch.nn.Module):
    """A ``transformers`` model as the exports take it: one tensor in (keyword ``input_ids`` or
    ``pixel_values``), the last hidden state out."""

    def __init__(self, model, kind: str):
        super().__init__()
        self.model, self.key = model, "input_ids" if kind == "text" else "pixel_values"

    def forward(self, x):
        return self.model(**{self.key: x})[0]


MODELS = {"gpt2": (_gpt2, "text"), "bert": (_bert, "text"),
          "mobilenet-v2": (_mobilenet_v2, "image"), "resnet18": (_resnet18, "image")}


def build_model(name: str):
    from tilecraft.models.hf_zoo import randomize
    make, kind = MODELS[name]
    return LastHidden(randomize(make().eval()), kind).eval(), kind


def inputs_of(kind: str, size: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "text":
        b, t = TEXT_SIZES[size]
        return {"input_ids": rng.integers(0, 1000, (b, t)).astype(np.int64)}
    return {"pixel_values": rng.standard_normal((IMAGE_SIZES[size], 3, 224, 224))
            .astype(np.float32)}


def export_onnx(model, kind: str):
    """The model as ONNX with a dynamic batch (and sequence length): ``torch.onnx.export`` with
    ``dynamo=True`` (the TorchScript exporter cannot export ``transformers``' mask code)."""
    import onnx
    # an example batch of 2: torch.export specializes a dim that is 1 in the example
    sample = inputs_of(kind, "small")
    name = next(iter(sample))
    sample = {name: np.concatenate([sample[name]] * 2)}
    dims = {0: torch.export.Dim("batch", max=8)}
    if kind == "text":
        dims[1] = torch.export.Dim("seq", max=128)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(model, (torch.from_numpy(sample[name]),), input_names=[name],
                                 output_names=["out"], dynamic_shapes=({0: dims[0]} if
                                 kind != "text" else dims,), dynamo=True, verbose=False)
    return onnx.load_from_string(prog.model_proto.SerializeToString())


def fixed_shape(model, feed: dict[str, np.ndarray]):
    """``model`` with its inputs' dims fixed to ``feed``'s shapes."""
    import onnx
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for inp in m.graph.input:
        if inp.name in feed:
            dims = inp.type.tensor_type.shape.dim
            for d, n in zip(dims, feed[inp.name].shape):
                d.ClearField("dim_param")
                d.dim_value = int(n)
    return m


def upper_bounds(kind: str) -> dict[str, int]:
    return {"batch": 8, "seq": 128} if kind == "text" else {"batch": 8}


def profile_top(vm, args) -> tuple[str, float]:
    report = vm.profile(*args, number=3)
    rows = [r for r in report.rows if r["name"] != "(vm)"]
    top = max(rows, key=lambda r: r["total_ms"])
    return top["name"], top["percent"] / 100.0


def interleaved_clock(fns, number: int, rounds: int, clock=time.thread_time) -> list[float]:
    """Median seconds per call of each of ``fns`` by ``clock``, round by round in turn."""
    for f in fns:
        f()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for f, out in zip(fns, samples):
            t0 = clock()
            for _ in range(number):
                f()
            out.append((clock() - t0) / number)
    return [statistics.median(s) for s in samples]


def measure(name: str, sizes=("small", "large"), threads: int | None = None,
            rounds: int = 5) -> list[dict]:
    threads = threads or int(os.environ.get("TILECRAFT_HF_THREADS", "1"))
    wall = os.environ.get("TILECRAFT_HF_CLOCK") == "wall"
    torch.set_num_threads(threads)
    model, kind = build_model(name)
    onnx_model = export_onnx(model, kind)
    sym_exe = relax.build(from_onnx(onnx_model), "llvm", upper_bounds=upper_bounds(kind))
    sym_exe.kernel_module.num_threads = threads
    sym_vm = relax.VirtualMachine(sym_exe, targets.cpu(0))
    sess = ort_session(onnx_model, threads)
    rows = []
    for size in sizes:
        feed = {onnx_model.graph.input[0].name: v for v in inputs_of(kind, size).values()}
        args = [targets.array(v) for v in feed.values()]
        con_exe = relax.build(from_onnx(fixed_shape(onnx_model, feed)), "llvm")
        con_exe.kernel_module.num_threads = threads
        con_vm = relax.VirtualMachine(con_exe, targets.cpu(0))
        ref = sess.run(None, feed)[0]
        out = sym_vm["main"](*args)
        out = (out[0] if isinstance(out, tuple) else out).numpy()
        err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
        tin = [torch.from_numpy(v) for v in feed.values()]

        def eager():
            with torch.no_grad():
                model(*tin)
        fns = [lambda: sym_vm["main"](*args), lambda: con_vm["main"](*args),
               lambda: sess.run(None, feed), eager]
        number = calls_per_round(fns[0])
        sym, con, ort_s, eager_s = interleaved_clock(
            fns, number, rounds, time.perf_counter if wall else time.thread_time)
        top, share = profile_top(sym_vm, args)
        rows.append({"model": name, "size": size, "shape": "x".join(
            str(d) for d in next(iter(feed.values())).shape),
            "symbolic_ms": sym * 1e3, "concrete_ms": con * 1e3, "onnxruntime_ms": ort_s * 1e3,
            "torch_ms": eager_s * 1e3, "vs_ort": ort_s / sym, "vs_torch": eager_s / sym,
            "sym_cost": sym / con, "top_kernel": top, "top_share": share,
            "max_rel_err": err, "threads": threads,
            "clock": "wall" if wall else "thread CPU time"})
        print(rows[-1], flush=True)
    return rows


def run(names=None, sizes=("small", "large")) -> list[dict]:
    rows = []
    for name in names or MODELS:
        rows += measure(name, sizes)
    return rows


def main(argv=None) -> int:
    from .common import ensure_clean_openblas_env, print_table, write_results
    ensure_clean_openblas_env()
    p = argparse.ArgumentParser(prog="python -m benchmarks.hf_models_cpu")
    p.add_argument("--models", help="comma-separated names (default: all)")
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    rows = []
    for name in (a.models.split(",") if a.models else MODELS):
        rows += measure(name, tuple(a.sizes.split(",")))
        if not a.no_write:       # after each model: a long run keeps what it measured
            write_results("hf_models_cpu", rows)
    print_table(rows, ["model", "size", "shape", "symbolic_ms", "concrete_ms", "onnxruntime_ms",
                       "torch_ms", "vs_ort", "vs_torch", "sym_cost", "top_kernel", "top_share"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
