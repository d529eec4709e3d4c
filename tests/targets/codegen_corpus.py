"""Collect the code the generators write for a broad corpus of kernels, and diff two collections.

A refactoring of a code generator should leave its output unchanged; this script is how that is
checked. ``collect`` writes, into one folder,

* ``tests/<test id>/<n>.<ext>``: every program the generators produced while pytest ran the
  given test files (default: the GPU and CPU kernel tests), captured at the three entry points
  -- ``opencl_source`` (OpenCL C, ``.cl``), ``webgpu_backend.build.compile_function`` (the
  function's JSON record: WGSL, bindings, uniform, launch geometry; ``.json``) and
  ``CodeGenLLVM.finish`` (LLVM IR before optimization, ``.ll``);
* ``models/<model>-<target>.<ext>``: the same for a BERT-base encoder layer and ResNet-50
  (the zoo's ONNX models) through ``relax.build`` for ``llvm``, ``opencl`` and ``webgpu``.

``diff`` compares two such folders file by file and prints a unified diff of each file that
changed (whitespace-only changes are counted apart). With ``--optimize-llvm`` an LLVM IR file
that differs is compared once more after LLVM's ``-O3`` pipeline (what ``targets.build`` runs):
two programs that optimize to the same IR compute the same thing. With ``--canonical-floor``
OpenCL C and WGSL are compared without the floor division helpers' definitions, and with a
helper call and the language's truncating division written alike (``FD(a, b)`` for
``tc_floordiv_i32(a, b)`` and ``select(a / b, 0i, b == 0i)``); the calls that changed from one
to the other are listed, to check that their operands are non-negative.

Run it from the root of the checkout whose generators you want (the interpreter imports the
``tilecraft`` of the current directory)::

    python tests/targets/codegen_corpus.py collect /tmp/corpus-before
    ... change the generators ...
    python tests/targets/codegen_corpus.py collect /tmp/corpus-after
    python tests/targets/codegen_corpus.py diff /tmp/corpus-before /tmp/corpus-after

Building needs no device: OpenCL C and WGSL are generated without compiling them for one.
"""
from __future__ import annotations

import argparse
import collections
import difflib
import json
import os
import re
import sys
import time

DEFAULT_TESTS = [
    "tests/targets",
    "tests/e2e/test_te_kernels.py",
    "tests/e2e/test_gemm_schedules.py",
    "tests/relax/test_default_schedules_gpu.py",
    "tests/relax/test_relax_gpu_opencl.py",
    "tests/relax/test_relax_gpu_webgpu.py",
    "tests/relax/test_relax_gpu_kernel_errors.py",
    "tests/relax/test_compact_gpu_conv_tiles.py",
    "tests/metaschedule/test_space_gpu.py",
    "tests/metaschedule/test_tune_gpu_space.py",
]
MODELS = ["bert_layer", "resnet50"]
TARGETS = ["llvm", "opencl", "webgpu"]


class Recorder:
    """Patches the generators' entry points; writes what they return under ``folder``."""

    def __init__(self, folder: str):
        self.folder = folder
        self.where = "outside"
        self.count = 0

    def start(self, where: str):
        self.where = re.sub(r"[^A-Za-z0-9_.=/-]+", "_", where)[:150]
        self.count = 0

    def write(self, text: str, ext: str):
        path = os.path.join(self.folder, self.where, f"{self.count:03d}.{ext}")
        self.count += 1
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def install(self):
        from tilecraft.targets.llvm import codegen as llvm_codegen
        from tilecraft.targets.opencl_backend import build as ocl_build
        from tilecraft.targets.webgpu_backend import build as wgpu_build
        rec = self
        opencl_source = ocl_build.opencl_source
        compile_function = wgpu_build.compile_function
        finish = llvm_codegen.CodeGenLLVM.finish

        def opencl_source_rec(*args, **kwargs):
            out = opencl_source(*args, **kwargs)
            rec.write(out[0] + "\n// extensions: " + " ".join(sorted(out[1])) + "\n", "cl")
            return out

        def compile_function_rec(name, func, target):
            out = compile_function(name, func, target)
            text = json.dumps(out, indent=1, sort_keys=True, default=str)
            # the WGSL inline, so that a diff reads as code
            for k in out["kernels"]:
                text += f"\n// ---- kernel {k['name']}\n{k['wgsl']}"
            rec.write(text, "json")
            return out

        def finish_rec(self, entry=None):
            out = finish(self, entry)
            rec.write(out, "ll")
            return out

        ocl_build.opencl_source = opencl_source_rec
        wgpu_build.compile_function = compile_function_rec
        llvm_codegen.CodeGenLLVM.finish = finish_rec

    # pytest hooks
    def pytest_runtest_setup(self, item):
        self.start("tests/" + item.nodeid)


def collect(folder: str, tests: list[str], models: list[str]) -> int:
    os.makedirs(folder, exist_ok=True)
    rec = Recorder(folder)
    rec.install()
    status = 0
    if tests:
        import pytest
        status = pytest.main(["-q", "-p", "no:cacheprovider", "--hypothesis-seed=0",
                              "-W", "ignore"] + tests, plugins=[rec])
    for name in models:
        from benchmarks.zoo.models import ZOO
        from tilecraft import relax
        from tilecraft.relax.frontend import from_onnx
        model = ZOO[name]()
        for target in TARGETS:
            t0 = time.time()
            rec.start(f"models/{name}-{target}")
            relax.build(from_onnx(model.onnx_model), target, upper_bounds=model.upper_bounds)
            print(f"{name} {target}: {rec.count} programs, {time.time() - t0:.0f} s", flush=True)
    return int(status)


def _files(folder: str) -> dict[str, str]:
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(root, n)
            out[os.path.relpath(p, folder)] = p
    return out


def optimized_llvm(text: str) -> str:
    """LLVM IR ``text`` after the pipeline ``targets.build`` runs (for its triple, -O3)."""
    from tilecraft.targets import Target
    from tilecraft.targets.llvm.compiler import MachineConfig, _parse, optimize
    triple = re.search(r'target triple = "([^"]+)"', text).group(1)
    config = MachineConfig(Target(f"llvm -mtriple={triple}"))
    mod = _parse(text, config.has_fma)
    optimize(mod, config.machine(jit=False, pic=True), 3)
    return str(mod)


_FLOOR_HELPER = re.compile(r"(?ms)^fn tc_floor(div|mod)_i32.*?^}\n|"
                           r"^inline \w+ tc_floor(div|mod)_\w+\(.*?\n")
_FLOOR_CALL = re.compile(r"tc_floor(div|mod)_i32\(|select\(")


def _args(text: str, start: int):
    """``text[start] == "("``: the top-level arguments, and the index after the ")"."""
    depth, args, cur, i = 0, [], start + 1, start
    while True:
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(text[cur:i].strip())
                return args, i + 1
        elif c == "," and depth == 1:
            args.append(text[cur:i].strip())
            cur = i + 1
        i += 1


def _canonical_floor(text: str, calls: collections.Counter, side: str) -> str:
    """``text`` with floor helper calls and WGSL truncating division written alike."""
    out, i = [], 0
    while True:
        m = _FLOOR_CALL.search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:m.start()])
        args, i = _args(text, m.end() - 1)
        args = [_canonical_floor(x, calls, side) for x in args]
        if m.group(0).startswith("tc_"):
            kind = "FD" if m.group(1) == "div" else "FM"
            calls[(side, kind, args[0], args[1])] += 1
            out.append(f"{kind}({args[0]}, {args[1]})")
            continue
        for op, kind in ((" / ", "FD"), (" % ", "FM")):
            if len(args) == 3 and args[1] == "0i" and args[2].endswith(" == 0i"):
                b = args[2][:-len(" == 0i")]
                if args[0].endswith(op + b):
                    out.append(f"{kind}({args[0][:-len(op + b)]}, {b})")
                    break
        else:
            out.append(f"select({', '.join(args)})")


def _canonical(text: str, path: str, calls: collections.Counter, side: str) -> str:
    if path.endswith(".json") and "\n// ---- kernel" in text:
        # the WGSL as code (the record before it holds it escaped): compare the record apart
        i = text.index("\n// ---- kernel")
        record = json.loads(text[:i])
        for k in record["kernels"]:
            k.pop("wgsl")
        return json.dumps(record, sort_keys=True) + _canonical_floor(
            _FLOOR_HELPER.sub("", text[i:]), calls, side)
    return _canonical_floor(_FLOOR_HELPER.sub("", text), calls, side)


def diff(a: str, b: str, context: int = 3, optimize_llvm: bool = False,
         canonical_floor: bool = False) -> int:
    fa, fb = _files(a), _files(b)
    only_a, only_b = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
    changed, ws, same_opt, same_floor = [], [], [], []
    calls = collections.Counter()
    for k in sorted(set(fa) & set(fb)):
        ta, tb = open(fa[k]).read(), open(fb[k]).read()
        if ta == tb:
            continue
        if re.sub(r"\s+", "", ta) == re.sub(r"\s+", "", tb):
            ws.append(k)
            continue
        if canonical_floor and k.endswith((".cl", ".json")):
            ca, cb = _canonical(ta, k, calls, "a"), _canonical(tb, k, calls, "b")
            if ca == cb:
                same_floor.append(k)
                continue
            ta, tb = ca, cb
        if optimize_llvm and k.endswith(".ll"):
            oa, ob = optimized_llvm(ta), optimized_llvm(tb)
            if oa == ob:
                same_opt.append(k)
                continue
            print(f"# {k}: differs after -O3 too")
        changed.append(k)
        sys.stdout.writelines(difflib.unified_diff(ta.splitlines(True), tb.splitlines(True),
                                                   "a/" + k, "b/" + k, n=context))
    for k in same_opt:
        print(f"same after -O3: {k}")
    for k in same_floor:
        print(f"same but for floor division helpers: {k}")
    swapped = collections.Counter()
    for side, kind, x, y in list(calls):
        n = calls[("a", kind, x, y)] - calls[("b", kind, x, y)]
        if n:
            swapped[(kind, x, y)] = n
    for (kind, x, y), n in sorted(swapped.items()):
        print(f"  {n:+d} helper calls {'floordiv' if kind == 'FD' else 'floormod'}({x}, {y}) "
              f"(+: a helper in {a}, truncating division in {b})")
    for k in only_a:
        print(f"only in {a}: {k}")
    for k in only_b:
        print(f"only in {b}: {k}")
    same = len(set(fa) & set(fb)) - len(changed) - len(ws) - len(same_opt) - len(same_floor)
    print(f"\n{len(set(fa) | set(fb))} files: {same} identical, {len(ws)} differ in whitespace "
          f"only, {len(same_opt)} LLVM IR the same after -O3, {len(same_floor)} the same but "
          f"for floor division helpers, {len(changed)} differ, {len(only_a)} only in {a}, "
          f"{len(only_b)} only in {b}")
    return 1 if changed or only_a or only_b else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="write the generated code of the corpus into FOLDER")
    c.add_argument("folder")
    c.add_argument("--tests", nargs="*", default=DEFAULT_TESTS)
    c.add_argument("--models", nargs="*", default=MODELS)
    d = sub.add_parser("diff", help="compare two collections")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--optimize-llvm", action="store_true",
                   help="compare LLVM IR that differs once more after -O3")
    d.add_argument("--canonical-floor", action="store_true",
                   help="compare OpenCL C and WGSL without the floor division helpers, helper "
                        "calls and truncating division written alike")
    args = p.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    if args.cmd == "collect":
        return collect(args.folder, args.tests, args.models)
    return diff(args.a, args.b, optimize_llvm=args.optimize_llvm,
                canonical_floor=args.canonical_floor)


if __name__ == "__main__":
    sys.exit(main())
