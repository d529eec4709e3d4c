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
- ``int4-g128 layer``: each GPT-2 small linear shape at one token (the memory-bound GEMV of
  decoding), our int4 kernel vs our float32 kernel;
- ``int4-g128``: the whole GPT-2 small at one token vs onnxruntime running the same model
  with ``com.microsoft.MatMulNBits`` (4 bits, blocks of 128; ``lowbit.matmul_nbits_model``
  writes its format).

``ratio`` is the peer's time over ours (above 1: we are faster). Errors: ``max_abs``,
``rel`` (max abs over the float output's max abs), ``cosine`` (of the flattened outputs: the
hidden states / logits), ``top1`` (classifiers). ``python -m benchmarks.lowp --rows
int8-dynamic,int4-layers`` runs a subset.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

from tilecraft import relax, targets
from tilecraft.relax.frontend.onnx import from_onnx
from tilecraft.relax.frontend.onnx.lowbit import matmul_nbits_model

from .common import ensure_clean_openblas_env, print_table, side_by_side, write_results

AGREEMENT_INPUTS = 1000
CALIBRATION_INPUTS = 16
GPT2_LINEAR = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]   # (K, N) of one block
ROWS = ("int8-dynamic", "int8", "int4-layers", "int4")


def _errors(ours: np.ndarray, peer: np.ndarray, ref: np.ndarray) -> dict:
    out = {}
    for who, y in (("ours", ours), ("peer", peer)):
        d = np.abs(y.astype(np.float64) - ref)
        a, b = y.ravel().astype(np.float64), ref.ravel().astype(np.float64)
        out[f"{who}_max_abs"] = float(d.max())
        out[f"{who}_rel"] = float(d.max() / max(np.abs(ref).max(), 1e-30))
        out[f"{who}_cosine"] = float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))
    return out


def _ort(model_or_path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    src = model_or_path if isinstance(model_or_path, str) else model_or_path.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _ours(mod, mode=None, calibration=None, upper_bounds=None):
    q = relax.quantize(mod, mode, calibration=calibration) if mode else mod
    exe = relax.build(q, "llvm", upper_bounds=upper_bounds)
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


def int8_static_rows(agreement_inputs: int = AGREEMENT_INPUTS) -> list[dict]:
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from tilecraft.zoo.models import ZOO
    z = ZOO["resnet50"]()
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
    onnx.save(z.onnx_model, fp)
    quantize_static(fp, qp, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    fp32, peer = _ort(fp), _ort(qp)
    vm = _ours(from_onnx(z.onnx_model), "int8", calibration=[(x,) for x in cal])
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
    row = {"mode": "int8", "model": "resnet50", "peer": "onnxruntime QDQ static",
           "ours_ms": t_ours * 1e3, "peer_ms": t_peer * 1e3, "ratio": t_peer / t_ours,
           "inputs": agreement_inputs, "ours_top1": agree_ours / max(agreement_inputs, 1),
           "peer_top1": agree_peer / max(agreement_inputs, 1)}
    for k in errs[0] if errs else ():
        row[k] = float(np.min([e[k] for e in errs]) if k.endswith("cosine")
                       else np.max([e[k] for e in errs]))
    return [row]


def _dense_module(k: int, n: int, w: np.ndarray):
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.matmul(x, const(w))))
        bb.emit_func_output(gv)
    return bb.get()


def int4_layer_rows() -> list[dict]:
    rng = np.random.default_rng(3)
    rows = []
    for k, n in GPT2_LINEAR:
        w = rng.normal(0, 0.02, (k, n)).astype(np.float32)
        mod = _dense_module(k, n, w)
        f32, q4 = _ours(mod), _ours(mod, "int4-g128")
        x = rng.standard_normal((1, k)).astype(np.float32)
        t_q4, t_f32 = side_by_side(lambda: q4["main"](x), lambda: f32["main"](x), number=50,
                                   rounds=7)
        row = {"mode": "int4-g128 layer", "model": f"gpt2 linear {k}x{n}, 1 token",
               "peer": "ours float32", "ours_ms": t_q4 * 1e3, "peer_ms": t_f32 * 1e3,
               "ratio": t_f32 / t_q4}
        ref = (x.astype(np.float64) @ w)
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


def run(rows=ROWS, agreement_inputs: int = AGREEMENT_INPUTS) -> list[dict]:
    """The int8 / int4 rows (``benchmarks.run``'s interface)."""
    out: list[dict] = []
    table = {"int8-dynamic": int8_dynamic_rows,
             "int8": lambda: int8_static_rows(agreement_inputs),
             "int4-layers": int4_layer_rows, "int4": int4_model_rows}
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
                   help=f"comma-separated subset of {', '.join(ROWS)}")
    p.add_argument("--inputs", type=int, default=AGREEMENT_INPUTS,
                   help="random inputs for ResNet-50's top-1 agreement")
    args = p.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    result = run(rows, args.inputs)
    print_table(result, list(dict.fromkeys(k for r in result for k in r)))
    print(f"(written to {write_results('lowp', result)})")
    return 0 if all("error" not in r for r in result) else 1


if __name__ == "__main__":
    sys.exit(main())
