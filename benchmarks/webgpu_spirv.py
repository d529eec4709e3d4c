"""What naga makes of our WGSL: the SPIR-V wgpu hands the Vulkan driver, per kernel, with and
without naga's run-time checks (``trusted_shaders``), counted.

A diagnostic, not a timing: it builds a model of ``benchmarks/gpu_models.py`` for the first
WebGPU adapter's limits, creates every kernel's pipeline twice (checked, trusted) under a
small Vulkan layer (``benchmarks/webgpu_spirv_layer.c``, compiled here with ``cc``) that writes
each ``vkCreateShaderModule``'s SPIR-V to a file, disassembles them with ``spirv-dis`` and
counts, per kernel: lines, index clamps (``UMin`` / ``SMin`` / clamps), loops, barriers,
function calls (naga's integer division helpers) and workgroup variables with an initializer
(zero-initialized workgroup memory). Works on any Vulkan adapter, lavapipe included: the
SPIR-V is the driver-independent part (wgpu's bounds-check policy differs only by the
device's robust buffer access, which NVIDIA's and lavapipe's both have).

Needs: a C compiler, ``libvulkan-dev`` (``vk_layer.h``), ``spirv-tools`` (``spirv-dis``),
torch and onnx (the model's export). Run::

    python -m benchmarks.webgpu_spirv bert_layer_s128 [OUT_DIR]

OUT_DIR (default a temporary directory) keeps the WGSL, the ``.spv`` and ``.spvasm`` files.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LAYER = "VK_LAYER_TC_spvdump"


def build_layer(workdir: str) -> str:
    """Compile the dumping layer into ``workdir``; returns the folder of its manifest."""
    lib = os.path.join(workdir, "libspvdump.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", lib,
                    os.path.join(HERE, "webgpu_spirv_layer.c")], check=True)
    manifest = {"file_format_version": "1.0.0", "layer": {
        "name": LAYER, "type": "GLOBAL", "library_path": lib, "api_version": "1.3.0",
        "implementation_version": "1", "description": "dump SPIR-V",
        "functions": {"vkGetInstanceProcAddr": "dump_GetInstanceProcAddr",
                      "vkGetDeviceProcAddr": "dump_GetDeviceProcAddr"}}}
    with open(os.path.join(workdir, "spvdump.json"), "w") as f:
        json.dump(manifest, f)
    return workdir


def counts(asm: str) -> dict:
    """What to compare in one disassembled module."""
    return {"lines": asm.count("\n"),
            "clamps": len(re.findall(r"\b(UMin|SMin|UClamp|SClamp)\b", asm)),
            "loops": asm.count("OpLoopMerge"),
            "barriers": asm.count("OpControlBarrier"),
            "calls": asm.count("OpFunctionCall"),
            "zero_init_workgroup": len(re.findall(r"OpVariable %\w+ Workgroup %\w+", asm))}


def dump(model: str, out: str) -> None:
    """In this process (with the layer enabled): build ``model``, create each kernel's pipeline
    checked and trusted, and name the dumped files after the kernels."""
    from tilecraft import relax
    from tilecraft.relax.frontend import from_onnx
    from tilecraft.targets.webgpu_backend import runtime
    from . import gpu_models

    (_, _, onnx_model, _, bounds), = gpu_models._models([model])
    target = gpu_models._target("webgpu-adapter")
    runtime.note_target(target)
    exe = relax.build(from_onnx(onnx_model), target, upper_bounds=bounds)
    km = exe.kernel_module
    with open(os.path.join(out, "webgpu.wgsl"), "w") as f:
        f.write(km.get_source())
    ctx = runtime.context(0)
    seen = {False: set(), True: set()}
    for trusted in (False, True):
        folder = os.path.join(out, "trusted" if trusted else "checked")
        os.makedirs(folder, exist_ok=True)
        os.environ["SPV_DUMP_DIR"] = folder
        for name in km.function_names:
            fn = km.get_function(name)
            for k, rec in enumerate(fn.kernels):
                before = set(os.listdir(folder))
                ctx.pipeline(rec["wgsl"], fn._layouts[k], rec["name"], trusted=trusted)
                new = sorted(set(os.listdir(folder)) - before)
                if not new and rec["wgsl"] in seen[trusted]:
                    continue      # the same WGSL as an earlier kernel: its pipeline is cached
                seen[trusted].add(rec["wgsl"])
                if len(new) != 1:
                    raise RuntimeError(f"{rec['name']}: expected one SPIR-V module, got {new}: "
                                       f"is the layer {LAYER} enabled?")
                os.rename(os.path.join(folder, new[0]),
                          os.path.join(folder, rec["name"] + ".spv"))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("SPV_DUMP_CHILD"):
        dump(argv[0], argv[1])
        return 0
    model = argv[0] if argv else "bert_layer_s128"
    out = argv[1] if len(argv) > 1 else tempfile.mkdtemp(prefix="webgpu_spirv_")
    os.makedirs(out, exist_ok=True)
    if shutil.which("spirv-dis") is None:
        raise SystemExit("spirv-dis not found: install spirv-tools (Debian: apt-get install "
                         "spirv-tools)")
    layer_dir = build_layer(tempfile.mkdtemp(prefix="spvdump_layer_"))
    env = dict(os.environ, VK_ADD_LAYER_PATH=layer_dir, VK_INSTANCE_LAYERS=LAYER,
               SPV_DUMP_CHILD="1")
    subprocess.run([sys.executable, "-m", "benchmarks.webgpu_spirv", model, out], env=env,
                   check=True, cwd=os.path.dirname(HERE))
    rows = {}
    for which in ("checked", "trusted"):
        folder = os.path.join(out, which)
        for fname in sorted(os.listdir(folder)):
            if not fname.endswith(".spv"):
                continue
            path = os.path.join(folder, fname)
            asm = subprocess.run(["spirv-dis", "--raw-id", path], check=True,
                                 capture_output=True, text=True).stdout
            with open(path[:-4] + ".spvasm", "w") as f:
                f.write(asm)
            rows.setdefault(fname[:-4], {})[which] = counts(asm)
    keys = ("lines", "clamps", "loops", "barriers", "calls", "zero_init_workgroup")
    print(f"{'kernel':64s} " + " ".join(f"{k:>21s}" for k in keys) + "   (checked/trusted)")
    for kernel, both in rows.items():
        cells = " ".join(f"{str(both['checked'][k]) + '/' + str(both['trusted'][k]):>21s}"
                         for k in keys)
        print(f"{kernel[:64]:64s} {cells}")
    print(f"(files under {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
