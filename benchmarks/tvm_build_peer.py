"""Apache TVM's side of ``benchmarks.build_time``, run with TVM's interpreter:
``python benchmarks/tvm_build_peer.py MODEL.onnx '{"input": [1, 3, 224, 224]}'``.

Imports the ONNX model with ``tvm.relax.frontend.onnx.from_onnx`` (the input shapes given, the
weights as constants) and builds it with ``tvm.compile(mod, target="llvm")``: TVM's default
Relax pipeline, whose CPU kernels are the naive, untuned ones. Prints ``RESULT {json}`` with
both times (seconds) and TVM's version. Needs only TVM and onnx (not tilecraft).
"""
import json
import sys
import time
import warnings


def main() -> int:
    path, shapes = sys.argv[1], json.loads(sys.argv[2])
    import onnx
    import tvm
    from tvm.relax.frontend.onnx import from_onnx
    model = onnx.load(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # "... in initializer but not in graph input"
        t0 = time.perf_counter()
        mod = from_onnx(model, shape_dict=shapes, keep_params_in_input=False)
        t1 = time.perf_counter()
        tvm.compile(mod, target="llvm")
        t2 = time.perf_counter()
    print("RESULT " + json.dumps({"import_s": t1 - t0, "build_s": t2 - t1,
                                  "version": tvm.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
