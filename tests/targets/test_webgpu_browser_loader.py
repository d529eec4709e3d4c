"""The browser loader (docs/webgpu_browser/tilecraft-webgpu.js) launches an exported module as
the Python runtime does: same uniform bytes, workgroup counts and shape checks (run with node;
the browser's WebGPU itself is not available here)."""
import json
import os
import shutil
import subprocess

from tilecraft import targets
from tilecraft.tensorir import te
from capabilities import needs_node
from webgpu_testutil import bind_1d

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOADER = os.path.join(ROOT, "docs", "webgpu_browser", "tilecraft-webgpu.js")


def _module():
    n, c = te.var("n"), te.var("c", "float32")
    A = te.placeholder((n, 7), "float32", "A")
    B = te.compute((n, 7), lambda i, j: A[i, j] * c, "B")
    return targets.build(bind_1d(te.create_prim_func([A, B, c]), "B", 1).mod, "webgpu")


@needs_node
def test_js_loader_computes_the_same_launch(tmp_path):
    mod = _module()
    fn = mod["main"]
    kernel = fn.kernels[0]
    assert kernel["linear_grid"]            # n * 7 workgroups: symbolic, may exceed 65535
    cases = [{"n": 3, "c": 2.5}, {"n": 20000, "c": -1.0}]
    def padded(data: bytes) -> list:       # the runtime pads the uniform buffer to 16 bytes
        return list(data) + [0] * (max(16, -(-len(data) // 16) * 16) - len(data))

    want = [{"uniform": padded(fn._uniform_bytes(kernel, env, {})),
             "counts": list(fn._counts(kernel, env))} for env in cases]
    shutil.copy(LOADER, tmp_path / "loader.mjs")
    (tmp_path / "kernel.json").write_text(json.dumps(kernel))
    script = f"""
import {{ uniformBytes, dispatchCounts, evaluate }} from "{(tmp_path / 'loader.mjs').as_uri()}";
import {{ readFileSync }} from "fs";
const k = JSON.parse(readFileSync("{tmp_path / 'kernel.json'}", "utf8"));
const out = {json.dumps(cases)}.map((env) => ({{
  uniform: Array.from(uniformBytes(k, env, {{}})), counts: dispatchCounts(k, env) }}));
if (evaluate(["floordiv", ["sub", 0, 7], 2], {{}}) !== -4) throw new Error("floordiv");
console.log(JSON.stringify(out));
"""
    proc = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == want
