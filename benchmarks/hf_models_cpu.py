"""Hugging Face exports on the CPU, untuned, as a new user runs them: tilecraft beside
onnxruntime and PyTorch eager in one process, and a symbolic-shape build beside a build for the
concrete shape.

``python -m benchmarks.run hf_models_cpu`` (or ``python -m benchmarks.hf_models_cpu
[--models gpt2,mobilenet-v2] [--sizes small,large]``). Each model of ``MODELS`` (random-weight
``transformers`` configs of realistic width, nothing downloaded) is exported to ONNX with
``torch.onnx.export`` (dynamic batch, and for text a dynamic sequence length) and imported with
``relax.frontend.from_onnx`` (``path`` ``onnx``), and exported with ``torch.export.export`` (the
same dynamic dims) and imported with ``relax.frontend.from_torch`` (``path`` ``torch.export``,
``--paths``); each is built once with the symbolic dims (``symbolic``) and once per measured
size with the dims fixed (``concrete``: the ONNX model's input dims set, or a ``torch.export``
without dynamic dims). Sizes: batch 1 with a short input (8 tokens) and batch 8 with 128
tokens (images: batch 1 and 8). onnxruntime runs the ONNX export on both paths' rows.

Rows: ``model``, ``path``, ``size``, ``symbolic_ms``, ``concrete_ms``, ``onnxruntime_ms``, ``torch_ms``,
``vs_ort`` (onnxruntime / symbolic: above 1 we are faster), ``vs_torch``, ``sym_cost``
(symbolic / concrete: the price of one artifact for every shape), ``top_kernel`` and
``top_share`` (the kernel of the symbolic build that takes the largest share of its time, from
``vm.profile``), ``over_share`` and ``offenders`` (the kernels of the concrete build whose share
of its kernel time is more than ``SHARE_SLACK`` = 2 times their share of its work and at least
``SHARE_FLOOR`` = 2% of the time: issue 30's "no kernel takes more than its share"; a kernel's
work is its multiply-adds, or ``byte_macs`` per byte it reads and writes where that is
more, since a depthwise layer is bound by its bytes: the machine's roofline ridge,
``machine_byte_macs``, measured at the start and kept in each row; each printed as it is
found), ``max_rel_err`` (against onnxruntime), ``measured`` and
``load_avg`` (the machine's one-minute load average after the row: other processes' work).

Timing: every side on one thread (``TILECRAFT_HF_THREADS``, default 1: tilecraft's
``num_threads``, onnxruntime's ``intra_op_num_threads``, ``torch.set_num_threads``), so each
runs on the calling thread, and the clock is that thread's CPU time (``time.thread_time``),
interleaved round by round, the median of the rounds. On a machine shared with other work a
wall clock measures the other work's scheduling more than ours; the CPU time of the one thread
that does the work does not (``TILECRAFT_HF_CLOCK=wall`` for wall time, with more threads).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import torch

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.frontend import from_onnx
from tilecraft.timing import calls_per_round
from tilecraft.zoo.run import ort_session

from .common import results_path
from .layer_profile import kernel_work, share_offenders

WRITES_RESULTS = False   # benchmarks.run writes the rows (hf_models_cpu/<machine>.json)

# issue 30's "no kernel takes more than its share": a kernel whose share of the time is above
# SHARE_SLACK x its share of the work, and at least SHARE_FLOOR of the time. A kernel's work
# is its multiply-adds, or "byte MACs" per byte it reads and writes where that is more: the
# roofline's ridge point, this machine's one-thread multiply-add rate over its one-thread copy
# bandwidth (``machine_byte_macs``), since a depthwise layer (9 multiply-adds per output) is
# bound by its bytes. Zen 4 ran the 1x1 layers at 51-58 GMAC/s and copied at 22-27 GB/s, about
# 2 per byte (BYTE_MACS, the value where the measurement is off); the Intel AVX-512 guest
# 65-72 GMAC/s against 13.6-14 GB/s, about 5 (docs/zoo.md)
SHARE_SLACK = 2.0
SHARE_FLOOR = 0.02
BYTE_MACS = 2.0

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
    name = "input_ids" if kind == "text" else "pixel_values"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(model, (torch.from_numpy(example_input(kind)),),
                                 input_names=[name], output_names=["out"],
                                 dynamic_shapes=(dynamic_dims(kind),), dynamo=True,
                                 verbose=False)
    return onnx.load_from_string(prog.model_proto.SerializeToString())


def dynamic_dims(kind: str) -> dict[int, "torch.export.Dim"]:
    """The exported dynamic dims: batch (at most 8), and for text the sequence (at most 128)."""
    dims = {0: torch.export.Dim("batch", max=8)}
    if kind == "text":
        dims[1] = torch.export.Dim("seq", max=128)
    return dims


def example_input(kind: str) -> np.ndarray:
    """The export's example input: a batch of 2 (``torch.export`` specializes a dim that is 1
    in the example)."""
    sample = next(iter(inputs_of(kind, "small").values()))
    return np.concatenate([sample] * 2)


def import_torch_export(model, kind: str, feed: dict[str, np.ndarray] | None = None):
    """The model through ``torch.export.export`` and ``relax.frontend.from_torch``: with the
    dynamic dims of ``dynamic_dims`` (their ``max`` become the build's upper bounds), or, with
    ``feed``, exported at ``feed``'s shape with no dynamic dim (the concrete build)."""
    from tilecraft.relax.frontend import from_torch
    x = torch.from_numpy(next(iter(feed.values())) if feed else example_input(kind))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, (x,), dynamic_shapes=None if feed else
                                 ({k: v for k, v in dynamic_dims(kind).items()},))
    return from_torch(ep)


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


_RIDGE: dict[int, float] = {}


def machine_byte_macs(threads: int = 1) -> float:
    """Multiply-adds per byte at this machine's roofline ridge on ``threads`` threads: the
    rate of our float32 GEMM (1024 x 1024 x 1024, weights packed at build time) over the
    bytes a numpy copy of 64 MB reads and writes per second (one thread; the best of 5 each,
    thread CPU time). Measured once per process; ``TILECRAFT_HF_BYTE_MACS`` overrides it.

    Examples
    --------
    >>> 0.5 < machine_byte_macs() < 50          # doctest: +SKIP
    True
    """
    forced = os.environ.get("TILECRAFT_HF_BYTE_MACS")
    if forced:
        return float(forced)
    if threads in _RIDGE:
        return _RIDGE[threads]
    n = 1024
    rng = np.random.default_rng(0)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((n, n), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(op.matmul(x, const(rng.standard_normal((n, n))
                                                             .astype("float32")))))
        bb.emit_func_output(y)
    exe = relax.build(bb.get(), "llvm")
    exe.kernel_module.num_threads = threads
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    a = targets.array(rng.standard_normal((n, n)).astype("float32"))
    vm["main"](a)
    gemm = []
    for _ in range(5):
        t = time.thread_time()
        vm["main"](a)
        gemm.append(time.thread_time() - t)
    src = np.ones(16 << 20, "float32")
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copy = []
    for _ in range(5):
        t = time.thread_time()
        np.copyto(dst, src)
        copy.append(time.thread_time() - t)
    macs_per_s = n ** 3 / min(gemm)
    bytes_per_s = 2 * src.nbytes / min(copy)
    _RIDGE[threads] = macs_per_s / bytes_per_s
    return _RIDGE[threads]


def share_check(mod, vm, args, byte_macs: float = BYTE_MACS) -> list[dict]:
    """The kernels of the concrete build ``vm`` (of ``mod``) that take more than their share
    of its time: more than ``SHARE_SLACK`` times their share of the work (multiply-adds, or
    ``byte_macs`` per byte moved where that is more: ``layer_profile.kernel_work``;
    ``measure`` passes ``machine_byte_macs()``) and at least ``SHARE_FLOOR`` of the time
    (``layer_profile.share_offenders``). The profile is the fastest of three, kernel by
    kernel, so another process's burst does not make an offender."""
    reports = [vm.profile(*args, number=3) for _ in range(3)]
    best = {}
    for rep in reports:
        for r in rep.rows:
            if r["name"] not in best or r["total_ms"] < best[r["name"]]["total_ms"]:
                best[r["name"]] = r
    report = SimpleNamespace(rows=list(best.values()))
    return share_offenders(report, kernel_work(mod, byte_macs), SHARE_SLACK, SHARE_FLOOR,
                           macs=kernel_work(mod))


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


PATHS = ("onnx", "torch.export")


def symbolic_module(path: str, model, kind: str, onnx_model):
    """The model with its symbolic dims, imported by ``path``."""
    return from_onnx(onnx_model) if path == "onnx" else import_torch_export(model, kind)


def concrete_module(path: str, model, kind: str, onnx_model, feed: dict[str, np.ndarray]):
    """The model with its dims fixed to ``feed``'s shape, imported by ``path``."""
    if path == "onnx":
        return from_onnx(fixed_shape(onnx_model, feed))
    return import_torch_export(model, kind, feed)


def _first(out) -> np.ndarray:
    return (out[0] if isinstance(out, (tuple, list)) else out).numpy()


def measure(name: str, sizes=("small", "large"), threads: int | None = None,
            rounds: int = 5, paths=PATHS) -> list[dict]:
    threads = threads or int(os.environ.get("TILECRAFT_HF_THREADS", "1"))
    wall = os.environ.get("TILECRAFT_HF_CLOCK") == "wall"
    torch.set_num_threads(threads)
    model, kind = build_model(name)
    onnx_model = export_onnx(model, kind)
    sess = ort_session(onnx_model, threads)
    byte_macs = machine_byte_macs(threads)
    sym_vms = {}
    for path in paths:
        sym_exe = relax.build(symbolic_module(path, model, kind, onnx_model), "llvm",
                              upper_bounds=upper_bounds(kind))
        sym_exe.kernel_module.num_threads = threads
        sym_vms[path] = relax.VirtualMachine(sym_exe, targets.cpu(0))
    rows = []
    for size in sizes:
        feed = {onnx_model.graph.input[0].name: v for v in inputs_of(kind, size).values()}
        args = [targets.array(v) for v in feed.values()]
        ref = sess.run(None, feed)[0]
        tin = [torch.from_numpy(v) for v in feed.values()]

        def eager():
            with torch.no_grad():
                model(*tin)
        for path in paths:
            sym_vm = sym_vms[path]
            con_mod = concrete_module(path, model, kind, onnx_model, feed)
            con_exe = relax.build(con_mod, "llvm")
            con_exe.kernel_module.num_threads = threads
            con_vm = relax.VirtualMachine(con_exe, targets.cpu(0))
            out = _first(sym_vm["main"](*args))
            err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
            fns = [lambda: sym_vm["main"](*args), lambda: con_vm["main"](*args),
                   lambda: sess.run(None, feed), eager]
            number = calls_per_round(fns[0])
            sym, con, ort_s, eager_s = interleaved_clock(
                fns, number, rounds, time.perf_counter if wall else time.thread_time)
            top, share = profile_top(sym_vm, args)
            offenders = share_check(con_mod, con_vm, args, byte_macs)
            for o in offenders:
                print(f"  {name} {path} {size}: {o['name']} takes {o['time_share']:.1%} of the "
                      f"kernel time for {o['work_share']:.1%} of the work "
                      f"({o['gmacs']:.1f} GMAC/s)", flush=True)
            rows.append({"model": name, "path": path, "size": size, "shape": "x".join(
                str(d) for d in next(iter(feed.values())).shape),
                "symbolic_ms": sym * 1e3, "concrete_ms": con * 1e3,
                "onnxruntime_ms": ort_s * 1e3, "torch_ms": eager_s * 1e3,
                "vs_ort": ort_s / sym, "vs_torch": eager_s / sym,
                "sym_cost": sym / con, "top_kernel": top, "top_share": share,
                "over_share": len(offenders), "offenders": [
                    {k: (round(v, 4) if isinstance(v, float) else v) for k, v in o.items()}
                    for o in offenders],
                "max_rel_err": err, "threads": threads, "byte_macs": round(byte_macs, 2),
                "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "load_avg": round(os.getloadavg()[0], 2),   # the machine's other work, 1 min
                "clock": "wall" if wall else "thread CPU time"})
            print(rows[-1], flush=True)
    return rows


def run(names=None, sizes=("small", "large"), paths=PATHS) -> list[dict]:
    rows = []
    for name in names or MODELS:
        rows += measure(name, sizes, paths=paths)
    return rows


def previous_rows() -> list[dict]:
    """The rows of this machine's results file, [] when there is none."""
    try:
        with open(results_path("hf_models_cpu")) as f:
            return json.load(f)["rows"]
    except (OSError, ValueError, KeyError):
        return []


def _key(row: dict) -> tuple:
    # rows written before the torch.export rows have no path: they are ONNX rows
    return row.get("model"), row.get("path", "onnx"), row.get("size")


def merged_rows(new: list[dict], old: list[dict]) -> list[dict]:
    """``new`` in ``MODELS`` and ``PATHS`` order with the rows of ``old`` whose (model, path,
    size) this run did not measure (``--models mobilenet-v2`` keeps the text rows of an
    earlier run; each row carries its ``measured`` time; a row without ``path`` is an ONNX
    row).

    Examples
    --------
    >>> merged_rows([{"model": "bert", "path": "onnx", "size": "small", "v": 2}],
    ...             [{"model": "bert", "path": "torch.export", "size": "small", "v": 0},
    ...              {"model": "bert", "size": "small", "v": 1}])    # doctest: +NORMALIZE_WHITESPACE
    [{'model': 'bert', 'path': 'onnx', 'size': 'small', 'v': 2},
     {'model': 'bert', 'path': 'torch.export', 'size': 'small', 'v': 0}]
    """
    fresh = {_key(r) for r in new}
    rows = [r for r in old if _key(r) not in fresh] + new
    order = {m: k for k, m in enumerate(MODELS)}
    paths = {p: k for k, p in enumerate(PATHS)}
    sizes = {"small": 0, "large": 1}
    return sorted(rows, key=lambda r: (order.get(r["model"], len(order)),
                                       sizes.get(r["size"], 2),
                                       paths.get(r.get("path", "onnx"), len(paths))))


def main(argv=None) -> int:
    from .common import ensure_clean_openblas_env, print_table, write_results
    ensure_clean_openblas_env()
    p = argparse.ArgumentParser(prog="python -m benchmarks.hf_models_cpu")
    p.add_argument("--models", help="comma-separated names (default: all)")
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--paths", default=",".join(PATHS),
                   help="import paths: onnx, torch.export (default: both)")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    paths = tuple(a.paths.split(","))
    unknown = [x for x in paths if x not in PATHS]
    if unknown:
        p.error(f"unknown path(s) {unknown}: choose from {list(PATHS)}")
    rows = []
    for name in (a.models.split(",") if a.models else MODELS):
        rows += measure(name, tuple(a.sizes.split(",")), paths=paths)
        if not a.no_write:       # after each model: a long run keeps what it measured
            write_results("hf_models_cpu", merged_rows(rows, previous_rows()))
    print_table(rows, ["model", "path", "size", "shape", "symbolic_ms", "concrete_ms", "onnxruntime_ms",
                       "torch_ms", "vs_ort", "vs_torch", "sym_cost", "top_kernel", "top_share",
                       "over_share"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
