"""Export the example kernel that ``index.html`` runs: row softmax over (n, 1000), n symbolic.

    python docs/webgpu_browser/export_example.py      # writes docs/webgpu_browser/softmax.json
    python -m http.server -d docs/webgpu_browser 8000  # then open http://localhost:8000

The kernel gets relax.build's default GPU schedule for ``webgpu`` (one workgroup per row,
cross-thread reductions in workgroup memory) and stays within the spec's default limits, so
any browser with WebGPU runs it.
"""
import os

from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, gpu_schedules
from tilecraft.relax.op import nn
from tilecraft.relax.transform import LegalizeOps


def softmax_kernel():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 1000), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(nn.softmax(x, axis=-1)))
        bb.emit_func_output(out)
    mod = LegalizeOps()(bb.get())
    func = mod[[name for name in mod.functions if name != "main"][0]]
    return gpu_schedules.apply(func.with_attr("global_symbol", "main"), targets.Target("webgpu"))


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "softmax.json")
    targets.build(softmax_kernel(), "webgpu").export_library(path)
    print(f"wrote {path}")
