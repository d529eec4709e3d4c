"""Compile TensorIR for an LLVM target: target machines, optimization, objects, JIT and export.

A module is compiled kernel by kernel (``compile_kernel``: schedule when asked, lower,
generate LLVM IR, optimize, emit a relocatable object), so that kernels compile in parallel
processes and come from the persistent kernel cache (``targets.kernel_cache``) when they were
compiled before. A small glue object (``glue_object``) defines what the kernels share: the
error buffer and ``tilecraft_get_last_error``, the thread count, the ABI version and the
metadata. For the host the objects are linked with the host linker (``toolchain.find_host_linker``:
GNU ``ld.bfd`` where installed, else ``ld.lld``) into a shared library that is
loaded with ``ctypes`` (see ``LLVMModule._load`` for why not MCJIT); for another triple they are
kept as they are. ``export_library`` links them (plus the thread-pool runtime, when parallel
loops need it) into one shared library with ``ld.lld``.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field

import llvmlite
import llvmlite.binding as llvm
from . import llvmir as ir

from tilecraft.tensorir.expr import TIRError
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.transform import lower

from .. import kernel_cache, parallel
from ..build_module import is_lowered
from ..build_stats import BuildStats
from ..runtime import abi
from ..runtime.module import Module
from ..target import Target, TargetError, arch_of_triple, host_triple
from ..toolchain import find_host_linker, link_relocatable, link_shared
from . import amx, call_sequence, dot4, threadpool
from .codegen import FMA_METADATA, CodeGenLLVM, CodegenOptions
from .irutil import I8, I32, PTR, ModuleBuilder
from .softops import hardware_division

_LOCK = threading.RLock()
_INITIALIZED = False
_RUNTIME_LIBRARY = None  # the process-wide thread pool, a shared library (never unloaded)
# dlclose from the process's own symbols (libc), to unload a host module's library with it
_dlclose = ctypes.CDLL(None).dlclose
_dlclose.argtypes = [ctypes.c_void_p]
_dlclose.restype = ctypes.c_int

_X86_F16C_CPUS = {"ivybridge", "haswell", "broadwell", "skylake", "skylake-avx512", "cascadelake",
                  "cooperlake", "icelake-client", "icelake-server", "tigerlake", "alderlake",
                  "raptorlake", "sapphirerapids", "graniterapids", "znver1", "znver2", "znver3",
                  "znver4", "znver5", "x86-64-v3", "x86-64-v4", "bdver1", "bdver2", "bdver3",
                  "bdver4", "btver2", "core-avx-i", "core-avx2"}
_X86_FMA_CPUS = {"haswell", "broadwell", "skylake", "skylake-avx512", "cascadelake", "cooperlake",
                 "icelake-client", "icelake-server", "tigerlake", "alderlake", "raptorlake",
                 "sapphirerapids", "graniterapids", "znver1", "znver2", "znver3", "znver4",
                 "znver5", "x86-64-v3", "x86-64-v4", "bdver2", "bdver3", "bdver4", "core-avx2"}
_ARM_FMA_CPUS = {"cortex-a7", "cortex-a12", "cortex-a15", "cortex-a17", "cortex-a32",
                 "cortex-a35", "cortex-a53", "cortex-a55", "cortex-a57", "cortex-a72",
                 "cortex-a73", "cortex-a75", "cortex-a76"}
_ARM_FP16_CPUS = {"cortex-a7", "cortex-a12", "cortex-a15", "cortex-a17", "cortex-a32",
                  "cortex-a35", "cortex-a53", "cortex-a55", "cortex-a57", "cortex-a72",
                  "cortex-a73", "cortex-a75", "cortex-a76"}

# AArch64 cores with half-precision arithmetic (FEAT_FP16, LLVM's +fullfp16)
_AARCH64_FULLFP16_CPUS = {"cortex-a55", "cortex-a65", "cortex-a75", "cortex-a76", "cortex-a76ae",
                          "cortex-a77", "cortex-a78", "cortex-a78ae", "cortex-a78c",
                          "cortex-a510", "cortex-a520", "cortex-a710", "cortex-a715",
                          "cortex-a720", "cortex-x1", "cortex-x2", "cortex-x3", "cortex-x4",
                          "neoverse-n1", "neoverse-n2", "neoverse-v1", "neoverse-v2",
                          "apple-a13", "apple-a14", "apple-a15", "apple-a16", "apple-m1",
                          "apple-m2", "apple-m3"}


def _init_llvm():
    global _INITIALIZED
    with _LOCK:
        if not _INITIALIZED:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _INITIALIZED = True


def normalize_triple(triple: str) -> str:
    """LLVM's canonical arch-vendor-os-env form: ``armv7a-linux-gnueabihf`` ->
    ``armv7a-unknown-linux-gnueabihf``. A TargetMachine reads its triple positionally, so
    without this the short form would lose its OS and environment (and armhf its hard-float
    ABI)."""
    try:
        p = llvm.get_triple_parts(triple)
    except Exception:  # noqa: BLE001 - leave it to LLVM to complain about the triple
        return triple
    if p.Arch == "unknown":
        return triple
    arch = triple.split("-")[0]  # keep the spelling (armv7a, armv7l, riscv64, ...)
    parts = [arch, p.Vendor, p.OS] + ([p.Env] if p.Env not in ("", "unknown") else [])
    return "-".join(parts)


class MachineConfig:
    """Everything that decides code generation for a target: triple, CPU, features, ABI."""

    def __init__(self, target: Target):
        _init_llvm()
        self.target = target
        if target.mtriple is None:
            self.triple = llvm.get_process_triple()
        else:
            self.triple = normalize_triple(target.mtriple)
        try:
            self.llvm_target = llvm.Target.from_triple(self.triple)
        except RuntimeError as err:
            raise TargetError(f"LLVM cannot generate code for the triple {self.triple!r}: "
                              f"{err}") from None
        self.is_host = target.is_host
        self.arch = arch_of_triple(self.triple)
        self.cpu, self.features = self._cpu_and_features()
        self.abi = target.mabi or self._default_abi()
        self.opt_level = max(0, min(3, target.opt_level))
        self.pointer_bits = 32 if self.arch in ("arm", "x86", "riscv32") else 64
        self.key: dict | None = None     # machine_key's result, once computed

    def _cpu_and_features(self) -> tuple[str, str]:
        t = self.target
        mattr = list(t.mattr)
        if t.mcpu:
            return t.mcpu, ",".join(mattr)
        if self.is_host:
            host = llvm.get_host_cpu_features().flatten()
            return llvm.get_host_cpu_name(), ",".join([f for f in [host] + mattr if f])
        if not mattr:
            # sensible baselines for a bare triple
            if self.arch == "arm":
                mattr = ["+vfp3", "+neon"]
            elif self.arch == "riscv64":
                mattr = ["+m", "+a", "+f", "+d", "+c"]
        return "", ",".join(mattr)

    def _default_abi(self) -> str:
        if self.arch == "riscv64" and "linux" in self.triple:
            return "lp64d" if "+d" in self.features.split(",") else "lp64"
        return ""

    @property
    def has_fma(self) -> bool:
        """Whether the CPU has fused multiply-add instructions (``llvm.fma`` is then one
        instruction; elsewhere it would be a call to libm's ``fmaf``)."""
        feats = set(self.features.split(","))
        if self.arch == "aarch64":
            return True
        if self.arch in ("x86_64", "x86"):
            if "-fma" in feats:
                return False
            return bool({"+fma", "+avx512f", "+fma4"} & feats) or self.cpu in _X86_FMA_CPUS
        if self.arch == "arm":
            return bool({"+vfp4", "+neon-vfpv4", "+vfp4d16", "+fp-armv8"} & feats) or \
                self.cpu in _ARM_FMA_CPUS
        if self.arch.startswith("riscv"):
            return "+f" in feats or "+d" in feats
        return False

    @property
    def native_f16(self) -> bool:
        feats = set(self.features.split(","))
        if self.arch == "aarch64":
            return True
        if self.arch in ("x86_64", "x86"):
            return "+f16c" in feats or self.cpu in _X86_F16C_CPUS
        if self.arch == "arm":
            return bool({"+fp16", "+vfp4", "+fullfp16"} & feats) or self.cpu in _ARM_FP16_CPUS
        if self.arch.startswith("riscv"):
            return bool({"+zfh", "+zfhmin"} & feats)
        return False

    @property
    def fp16_arith(self) -> bool:
        """Whether float16 arithmetic is native: AArch64 with half-precision arithmetic
        (``+fullfp16``, or a core that has it)."""
        feats = set(self.features.split(","))
        if self.arch != "aarch64" or "-fullfp16" in feats:
            return False
        return "+fullfp16" in feats or self.cpu in _AARCH64_FULLFP16_CPUS

    def needed_libraries(self, uses_parallel: bool) -> tuple[str, ...]:
        """DT_NEEDED entries of an exported library. glibc systems (``*-linux-gnu*``) all have
        ``libm.so.6`` and ``libpthread.so.0`` (a stub since glibc 2.34), so the library names
        them and any program can dlopen it; elsewhere (musl, Android) it names nothing and
        relies on the loading process."""
        parts = self.triple.split("-")
        if "linux" not in parts or not any(p.startswith("gnu") for p in parts):
            return ()
        return ("libm.so.6", "libpthread.so.0") if uses_parallel else ("libm.so.6",)

    def machine(self, jit: bool = False, pic: bool = True) -> llvm.TargetMachine:
        return self.llvm_target.create_target_machine(
            cpu=self.cpu, features=self.features, opt=self.opt_level,
            reloc="pic" if pic else "default",
            codemodel="jitdefault" if jit else "default", jit=jit, abiname=self.abi)

    def codegen_options(self, data_layout: str) -> CodegenOptions:
        return CodegenOptions(triple=self.triple, data_layout=data_layout,
                              pointer_bits=self.pointer_bits, native_f16=self.native_f16,
                              vector_width=self.target.vector_width,
                              num_cores=self.target.num_cores, target_str=str(self.target),
                              hw_div=hardware_division(self.arch, self.cpu, self.features),
                              fp16_arith=self.fp16_arith,
                              dot_isa=dot4.dot_isa(self.arch, self.features,
                                                   self.target.vector_width),
                              amx_int8=amx.has_amx_int8(self.arch, self.features))


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine, level: int) -> None:
    """Run LLVM's new-pass-manager pipeline at ``level`` (loop and SLP vectorizers on)."""
    if level <= 0:
        return
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def runtime_ir(config: MachineConfig, data_layout: str, visibility: str) -> str:
    mb = ModuleBuilder("tilecraft_runtime", config.triple, data_layout, config.pointer_bits)
    threadpool.emit_runtime(mb, config.arch, visibility)
    return str(mb.module)


_LIBRARY_FORMAT = 1   # of the linked host libraries in the cache; bump when the link changes


def _load_library(objects: list[bytes], config: MachineConfig, needed: tuple[str, ...],
                  mode: int = ctypes.DEFAULT_MODE, store=None) -> ctypes.CDLL:
    """Link ``objects`` into a shared library in a temporary directory and ``dlopen`` it.

    With a kernel cache ``store``, the linked library is kept there under the hash of its
    objects: a build whose objects were linked before (a warm build) copies it from the cache
    instead of running the linker again (``ld.lld`` costs about 25 ms a run, mostly its start-up;
    ``ld.bfd`` about 3 ms).
    The file is deleted once loaded (the mapping stays); each library gets a directory of its
    own, and a copy of its own, so the dynamic loader never mistakes one for another and two
    modules never share their globals (error buffer, thread count).
    """
    key = _library_key(objects, needed) if store is not None else None
    data = store.get(key) if key is not None else None
    with tempfile.TemporaryDirectory(prefix="tilecraft-jit-") as tmp:
        path = os.path.join(tmp, "kernels.so")
        if data is not None:
            with open(path, "wb") as f:
                f.write(data)
        else:
            link_shared(objects, path, needed, _empty_object(config) if needed else None,
                        linker=find_host_linker())
            if key is not None:
                with open(path, "rb") as f:
                    store.put(key, f.read())
        try:
            return ctypes.CDLL(path, mode=mode)
        except OSError as err:
            raise RuntimeError(f"cannot load the kernels just linked ({path}): {err}") from None


def _library_key(objects: list[bytes], needed: tuple[str, ...]) -> str:
    """The cache key of the host library linked from ``objects``: their contents (the objects
    name their triple), the libraries it needs, and tilecraft's code (the link's flags)."""
    digests = [hashlib.sha256(o).hexdigest() for o in objects]
    return kernel_cache.cache_key("llvm-host-library", _LIBRARY_FORMAT, list(needed), digests,
                                  kernel_cache.code_fingerprint())


def _empty_object(config: MachineConfig) -> bytes:
    """An object with nothing in it (stands in for a ``DT_NEEDED`` library when linking)."""
    tm = config.machine(jit=False, pic=True)
    mod = llvm.parse_assembly(f'target triple = "{config.triple}"\n'
                              f'target datalayout = "{tm.target_data}"\n')
    return tm.emit_object(mod)


def _ensure_runtime_library(store=None) -> None:
    """Load the thread pool once per process as a shared library whose two functions are
    global (``RTLD_GLOBAL``): the host modules' libraries leave them undefined and the dynamic
    loader binds them here, so every module of the process shares one pool. The libraries it
    names as needed (``libm.so.6``, ``libpthread.so.0`` on glibc) join the global scope with
    it, and the modules' calls into them bind there too."""
    global _RUNTIME_LIBRARY
    with _LOCK:
        if _RUNTIME_LIBRARY is not None:
            return
        config = MachineConfig(Target("llvm"))

        def make():
            tm = config.machine(jit=False, pic=True)
            return _object_from_ir(runtime_ir(config, str(tm.target_data), "default"), config)
        key = kernel_cache.cache_key("llvm-runtime-shared", _KERNEL_FORMAT,
                                     machine_key(config)) if store is not None else None
        obj = _cached_object(store, key, make)
        _RUNTIME_LIBRARY = _load_library([obj], config, config.needed_libraries(True),
                                         mode=ctypes.RTLD_GLOBAL, store=store)


_NAME = r'%(?:[-\w.$]+|"[^"]*")'
_FMA_LINE = re.compile(r"^(\s*)(" + _NAME + r") = (fmul|fadd) (.*), !" + re.escape(FMA_METADATA)
                       + r" (!\d+)\s*$")
_LLVM_TYPE_SUFFIX = {"float": "f32", "double": "f64"}


def _split_operands(text: str) -> list[str]:
    """``"<16 x float> %a, %b"`` -> ``["%a", "%b"]`` (the type prefix dropped); commas inside
    ``<...>``, ``[...]``, ``{...}`` (vector constants) do not split."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<[{(":
            depth += 1
        elif ch in ">]})":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def _fma_type(first_operand: str) -> tuple[str, str, str] | None:
    """``"<16 x float> %a"`` -> ``("<16 x float>", "%a", "v16f32")``; None for other types."""
    m = re.match(r"^(<(\d+) x (float|double)>|float|double) (.+)$", first_operand)
    if m is None:
        return None
    if m.group(2):
        return m.group(1), m.group(4), f"v{m.group(2)}{_LLVM_TYPE_SUFFIX[m.group(3)]}"
    return m.group(1), m.group(4), _LLVM_TYPE_SUFFIX[m.group(1)]


def fuse_tagged_fma(text: str) -> str:
    """Turn each multiply-add pair the code generator tagged ``!tilecraft.fma`` (a reduction's
    ``acc + x * y``, see ``CodeGenLLVM._accumulate``) into one ``llvm.fma`` call.

    ``%m = fmul T x, y`` becomes ``%m = call T @llvm.fma(x, y, acc)`` and ``%r = fadd T acc, %m``
    becomes a no-op ``bitcast`` of ``%m``. Lines that do not form a complete pair are left as
    they are. Only for targets with FMA instructions (elsewhere ``llvm.fma`` is a libm call).
    """
    lines = text.split("\n")
    pairs: dict[str, dict] = {}
    for k, line in enumerate(lines):
        m = _FMA_LINE.match(line)
        if m is not None:
            pairs.setdefault(m.group(5), {})[m.group(3)] = (k, m.group(1), m.group(2), m.group(4))
    declared: dict[str, str] = {}
    for pair in pairs.values():
        if set(pair) != {"fmul", "fadd"}:
            continue
        kmul, indent, mname, mops = pair["fmul"]
        kadd, _, rname, aops = pair["fadd"]
        mparts, aparts = _split_operands(mops), _split_operands(aops)
        if len(mparts) != 2 or len(aparts) != 2:
            continue
        t = _fma_type(mparts[0])
        ta = _fma_type(aparts[0])
        if t is None or ta is None or ta[0] != t[0] or aparts[1] != mname:
            continue
        ty, x, sfx = t
        y, acc = mparts[1], ta[1]
        lines[kmul] = (f"{indent}{mname} = call {ty} @llvm.fma.{sfx}({ty} {x}, {ty} {y}, "
                       f"{ty} {acc})")
        lines[kadd] = f"{indent}{rname} = bitcast {ty} {mname} to {ty}"
        declared[sfx] = ty
    for sfx, ty in declared.items():
        if f"@llvm.fma.{sfx}(" not in text:
            lines.append(f"declare {ty} @llvm.fma.{sfx}({ty}, {ty}, {ty})")
    return "\n".join(lines)


def _parse(text: str, fma: bool = False) -> llvm.ModuleRef:
    if fma:
        text = fuse_tagged_fma(text)
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as err:  # a code generator bug: say so, with the IR to look at
        raise RuntimeError(f"tilecraft generated invalid LLVM IR: {err}") from None
    return mod


# ---------------------------------------------------------------------------------------------
# one kernel, compiled on its own


_KERNEL_FORMAT = 1   # of the cache entries below; bump when KernelObject.to_bytes changes


@dataclass
class KernelObject:
    """One kernel compiled on its own: its object code and its metadata entry.

    The object defines the kernel's entry ``tilecraft_fn_<name>`` (and its internal compute
    and parallel-body functions); it refers to the module-wide globals (the error buffer, the
    thread count) that the module's glue object defines.
    """

    name: str
    object: bytes
    meta: dict
    uses_parallel: bool
    seconds: dict = field(default_factory=dict)   # CPU time per phase; not stored in the cache
    # False when scheduling issued a warning (a kernel left unscheduled): such a kernel is not
    # stored, so that every build issues the warning again and a strict build refuses it
    cacheable: bool = True

    def to_bytes(self) -> bytes:
        """The cache payload: a JSON header line, then the object code."""
        header = json.dumps({"format": _KERNEL_FORMAT, "name": self.name, "meta": self.meta,
                             "uses_parallel": self.uses_parallel}, sort_keys=True)
        return header.encode("utf-8") + b"\n" + self.object

    @staticmethod
    def from_bytes(data: bytes, name: str) -> "KernelObject | None":
        """The kernel stored by ``to_bytes``; None if ``data`` is not one for ``name``."""
        head, sep, obj = data.partition(b"\n")
        try:
            header = json.loads(head.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None
        if not sep or not isinstance(header, dict) or header.get("format") != _KERNEL_FORMAT \
                or header.get("name") != name or not obj:
            return None
        return KernelObject(name, obj, header["meta"], bool(header["uses_parallel"]))


class _KernelCodeGen(CodeGenLLVM):
    """``CodeGenLLVM`` for one kernel of a module compiled kernel by kernel: the module-wide
    globals are declared (the glue object defines them), not defined."""

    def _init_globals(self):
        mb = self.mb
        self.error_buffer = _external_global(self.module, "tilecraft_error_buffer",
                                             ir.ArrayType(I8, abi.ERROR_BUFFER_BYTES), "hidden")
        self.error_claimed = _external_global(self.module, "tilecraft_error_claimed", I32,
                                              "hidden")
        # default visibility, as defined: the runtime finds it in an exported library
        self.num_threads = _external_global(self.module, abi.NUM_THREADS_SYMBOL, I32, "")
        self.snprintf = mb.declare("snprintf", I32, [PTR, mb.intptr, PTR], var_arg=True)
        self.memalign = mb.declare("posix_memalign", I32, [PTR, mb.intptr, mb.intptr])
        self.free = mb.declare("free", ir.VoidType(), [PTR])


def _external_global(module, name: str, ty, visibility: str) -> ir.GlobalVariable:
    g = ir.GlobalVariable(module, ty, name=name)
    g.storage_class = visibility    # llvmlite prints it where LLVM expects the visibility
    return g


def _glue_ir(config: MachineConfig, data_layout: str, metas: list[dict], entry: str | None) -> str:
    """The module-wide part of a kernel library: the error buffer and its getter, the thread
    count, the ABI version, the sequence runner (``call_sequence``) and the metadata of every
    kernel."""
    cg = CodeGenLLVM(config.codegen_options(data_layout))
    for g in (cg.error_buffer, cg.error_claimed):
        g.linkage = ""                 # was internal: the kernel objects refer to them
        g.storage_class = "hidden"
    call_sequence.emit_call_sequence(cg.mb)
    cg.functions_meta = list(metas)
    return cg.finish(entry=entry)


def compile_kernel(name: str, func: PrimFunc, config: MachineConfig, target: Target,
                   schedule=None) -> KernelObject:
    """Schedule (``schedule(func)`` when given), lower, generate, optimize and emit one kernel.

    Examples
    --------
    >>> k = compile_kernel("main", func, MachineConfig(Target("llvm")), Target("llvm"))  # doctest: +SKIP
    >>> k.object[:4]                                                                     # doctest: +SKIP
    b'\\x7fELF'
    """
    seconds = {}
    clock = time.process_time      # CPU seconds: the work, wherever it runs
    start = clock()
    cacheable = True
    if schedule is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            func = schedule(func)
        for w in caught:     # issued again under the caller's filters
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        cacheable = not caught
        seconds["schedule"] = clock() - start
        start = clock()
    if not is_lowered(func):
        func = lower(func, target)
        seconds["lower"] = clock() - start
        start = clock()
    tm = config.machine(jit=False, pic=True)
    cg = _KernelCodeGen(config.codegen_options(str(tm.target_data)))
    meta = cg.add_function(name, func)
    text = str(cg.module)
    seconds["codegen"] = clock() - start
    start = clock()
    mod = _parse(text, config.has_fma)
    optimize(mod, tm, config.opt_level)
    seconds["llvm_optimize"] = clock() - start
    start = clock()
    obj = tm.emit_object(mod)
    seconds["llvm_emit"] = clock() - start
    return KernelObject(name, obj, meta, cg.uses_parallel, seconds, cacheable)


def machine_key(config: MachineConfig) -> dict:
    """Everything about the target and the toolchain that the object code depends on."""
    if config.key is not None:           # computed once per build (it makes a TargetMachine)
        return config.key
    options = config.codegen_options(str(config.machine(jit=False, pic=True).target_data))
    config.key = {"target": str(config.target), "triple": config.triple, "cpu": config.cpu,
                  "codegen": {k: (sorted(v.items()) if isinstance(v, dict) else v)
                              for k, v in vars(options).items()},
                  "features": config.features, "abi": config.abi, "opt_level": config.opt_level,
                  "vector_width": config.target.vector_width, "num_cores": config.target.num_cores,
                  "has_fma": config.has_fma, "native_f16": config.native_f16,
                  "llvm": ".".join(map(str, llvm.llvm_version_info)),
                  "llvmlite": llvmlite.__version__, "code": kernel_cache.code_fingerprint()}
    return config.key


def _object_from_ir(text: str, config: MachineConfig, optimized: bool = True) -> bytes:
    tm = config.machine(jit=False, pic=True)
    mod = _parse(text)
    if optimized:
        optimize(mod, tm, config.opt_level)
    return tm.emit_object(mod)


def _cached_object(store, key: str | None, make) -> bytes:
    """``make()``'s object code through the cache (small module-wide pieces)."""
    if store is not None and key is not None:
        data = store.get(key)
        if data:
            return data
    data = make()
    if store is not None and key is not None:
        store.put(key, data)
    return data


def glue_object(config: MachineConfig, metas: list[dict], entry: str | None,
                store=None) -> bytes:
    """The object of ``_glue_ir`` (through the cache ``store`` when given)."""
    def make():
        # data and a getter returning a pointer: nothing for the optimizer to do
        tm = config.machine(jit=False, pic=True)
        return _object_from_ir(_glue_ir(config, str(tm.target_data), metas, entry), config,
                               optimized=False)
    key = kernel_cache.cache_key("llvm-glue", _KERNEL_FORMAT, machine_key(config), metas,
                                 entry) if store is not None else None
    return _cached_object(store, key, make)


def runtime_object(config: MachineConfig, store=None) -> bytes:
    """The thread-pool runtime, compiled for ``config`` (hidden symbols: linked into each
    exported library that has parallel loops)."""
    def make():
        tm = config.machine(jit=False, pic=True)
        return _object_from_ir(runtime_ir(config, str(tm.target_data), "hidden"), config)
    key = kernel_cache.cache_key("llvm-runtime", _KERNEL_FORMAT, machine_key(config)) \
        if store is not None else None
    return _cached_object(store, key, make)


# ---------------------------------------------------------------------------------------------
# the module


class LLVMModule(Module):
    """A module compiled by the LLVM back end, one object per kernel plus a glue object.

    For the host target the objects are linked into a shared library and loaded (``_load``)
    and run here; for another triple
    calling a function raises ``RuntimeError`` (export it and run it on its board).
    ``export_library`` links the objects (and the thread-pool runtime, when parallel loops
    need it) into one shared library with ``ld.lld``.

    ``build_stats`` (a ``targets.BuildStats``) says where the build's time went.
    """

    def __init__(self, kernels: list[KernelObject], glue: bytes, metadata: dict,
                 config: MachineConfig, source=None, store=None):
        super().__init__(metadata)
        self._kernels = kernels
        self._glue = glue
        self._config = config
        self._uses_parallel = any(k.uses_parallel for k in kernels)
        # False when a kernel is not to be cached (its scheduling warned): nor is the module
        self.cacheable = all(k.cacheable for k in kernels)
        self._source = source          # () -> [(name, lowered PrimFunc)], for get_source
        self._store = store
        self._texts: dict[str, str] = {}
        self._lib: ctypes.CDLL | None = None
        self.build_stats = None
        if config.is_host:
            self._prepare_cpu()
            self._load()
            self._init_threads()

    # -- loading ----------------------------------------------------------------------------------
    def _load(self):
        """Link the glue and kernel objects into a shared library (``find_host_linker``) and load it
        with ``ctypes``; the thread pool's functions come from the process-wide runtime library.

        Not MCJIT: its memory manager takes code and read-only data from separate pools, which
        in a long-lived process can end up more than 2 GiB apart, out of reach of the small
        code model's 32-bit PC-relative references (LLVM then aborts the process). The dynamic
        loader maps one library's sections together. See ``docs/known-issues.md``.
        """
        _init_llvm()
        # the runtime library brings libm and libpthread into the global scope (its DT_NEEDED
        # entries), so the module's library needs none of its own: one linker run less a build
        _ensure_runtime_library(self._store)
        self._lib = _load_library([self._glue] + [k.object for k in self._kernels],
                                  self._config, (), store=self._store)

    def __del__(self):
        # unload the library with the module, as MCJIT freed its memory with the engine (every
        # Function holds its module, so no pointer into the library outlives it)
        lib = getattr(self, "_lib", None)
        if lib is not None:
            self._lib = None
            _dlclose(lib._handle)

    def objects(self) -> list[bytes]:
        """The relocatable objects a library links: glue, thread-pool runtime (when parallel
        loops need it), then one per kernel."""
        runtime = [runtime_object(self._config, self._store)] if self._uses_parallel else []
        return [self._glue] + runtime + [k.object for k in self._kernels]

    # -- Module interface -------------------------------------------------------------------------
    def _address(self, symbol: str) -> int:
        try:
            return ctypes.cast(getattr(self._lib, symbol), ctypes.c_void_p).value
        except AttributeError:
            raise KeyError(f"symbol {symbol} not found in the module's library") from None

    def _unavailable_reason(self) -> str | None:
        if self._config.is_host:
            return None
        return (f"this module is compiled for {self._config.triple} and cannot run on this "
                f"machine ({host_triple()}); export it with export_library and run it on its "
                f"board (for example through rpc)")

    @property
    def triple(self) -> str:
        return self._config.triple

    @property
    def is_runnable(self) -> bool:
        return self._config.is_host

    def get_source(self, fmt: str = "ll") -> str:
        """The module's code: ``"ll"`` optimized LLVM IR, ``"ll-raw"`` IR before optimization,
        ``"asm"`` (or ``"s"``) assembly for the target. The kernels are generated again for
        this (a cached build kept only their object code), each optimized on its own as the
        build did, and linked into one module."""
        if fmt in ("asm", "s"):
            tm = self._config.machine(jit=False, pic=True)
            return tm.emit_assembly(_parse(self.get_source("ll")))
        if fmt not in ("ll", "ll-raw"):
            raise ValueError(f"unknown source format {fmt!r}; expected 'll', 'll-raw' or 'asm'")
        if fmt not in self._texts:
            self._texts[fmt] = self._linked_ir(optimized=fmt == "ll")
        return self._texts[fmt]

    def _linked_ir(self, optimized: bool) -> str:
        if self._source is None:
            raise ValueError("this module was built without its TensorIR; build it again to "
                             "see its source")
        config = self._config
        tm = config.machine(jit=False, pic=True)
        data_layout = str(tm.target_data)
        metas = self.metadata["functions"]
        whole = _parse(_glue_ir(config, data_layout, metas, self.metadata.get("entry")))
        for name, func in self._source():
            cg = _KernelCodeGen(config.codegen_options(data_layout))
            cg.add_function(name, func)
            mod = _parse(str(cg.module), config.has_fma and optimized)
            if optimized:
                optimize(mod, tm, config.opt_level)
            whole.link_in(mod)
        return str(whole)

    def object_code(self) -> bytes:
        """One relocatable object file of the whole module (for this module's triple), merged
        with ``ld.lld -r``."""
        return link_relocatable(self.objects())

    def export_library(self, path: str) -> str:
        """Write one self-contained shared library (linked with ``ld.lld``) to ``path``.

        Raises ``targets.ToolchainError`` when ``ld.lld`` is missing.

        Examples
        --------
        >>> mod = build(func, "llvm -mtriple=aarch64-linux-gnu")   # doctest: +SKIP
        >>> mod.export_library("kernel.so")                       # doctest: +SKIP
        """
        path = os.fspath(path)
        needed = self._config.needed_libraries(self._uses_parallel)
        stub = _empty_object(self._config) if needed else None
        link_shared(self.objects(), path, needed, stub)
        return path


# ---------------------------------------------------------------------------------------------
# building


def kernel_key(spec, config: MachineConfig) -> str | None:
    """The cache key of kernel ``spec`` (a ``targets.KernelSpec``): its name, its TensorIR
    text, how it is scheduled, the machine (``machine_key``). None when it cannot be cached
    (a schedule without a ``schedule_id``, IR that does not print)."""
    if spec.schedule is not None and not spec.schedule_id:
        return None
    try:
        text = spec.func.script()
    except Exception:  # noqa: BLE001 - IR the printer does not know: compile it, uncached
        return None
    return kernel_cache.cache_key("llvm-kernel", _KERNEL_FORMAT, machine_key(config),
                                  spec.name, spec.schedule_id, text)


def build_llvm(specs, target: Target, *, jobs: int | None = None, cache=None,
               stats: BuildStats | None = None) -> LLVMModule:
    """Compile kernels for an LLVM target: each from the cache when it is there, the others
    in ``jobs`` processes; then the glue object, and the module loaded (host) or kept as
    objects (other triples).

    Parameters
    ----------
    specs : sequence of targets.KernelSpec
        The kernels, in the module's order.
    target : Target
    jobs : int, optional
        Worker processes for the kernels not in the cache (default: one per core).
    cache : None | bool | str | KernelCache
        See ``targets.kernel_cache.resolve``.
    stats : BuildStats, optional
        Filled in with the phases' times and the kernel counts.
    """
    stats = stats if stats is not None else BuildStats()
    stats.kernels = stats.kernels or len(specs)
    stats.distinct = stats.distinct or len(specs)
    config = MachineConfig(target)
    symbols: dict[str, str] = {}
    for spec in specs:
        if not isinstance(spec.func, PrimFunc):
            raise TypeError(f"targets.build compiles PrimFuncs; {spec.name!r} is a "
                            f"{type(spec.func).__name__} (build relax functions with "
                            f"relax.build)")
        symbol = abi.entry_symbol(spec.name)
        if symbol in symbols:
            raise TIRError(f"two functions map to the C symbol {symbol}; rename "
                           f"{spec.name!r} or {symbols[symbol]!r}")
        symbols[symbol] = spec.name
    store = kernel_cache.resolve(cache)
    stats.cache_dir = store.directory if store is not None else None
    objects: list[KernelObject | None] = [None] * len(specs)
    with stats.phase("cache lookup"):
        keys = [kernel_key(s, config) if store is not None else None for s in specs]
        for i, (spec, key) in enumerate(zip(specs, keys)):
            if key is not None:
                data = store.get(key)
                if data is not None:
                    objects[i] = KernelObject.from_bytes(data, spec.name)
    misses = [i for i, o in enumerate(objects) if o is None]
    stats.cache_hits += len(specs) - len(misses)
    stats.compiled += len(misses)
    jobs = parallel.resolve_jobs(jobs)
    stats.jobs = max(stats.jobs, min(jobs, len(misses)) if parallel.can_fork() else 1)
    with stats.phase("compile kernels"):
        tasks = [functools.partial(compile_kernel, specs[i].name, specs[i].func, config, target,
                                   specs[i].schedule) for i in misses]
        cost = [_size_estimate(specs[i].func) for i in misses]
        compiled = parallel.run_tasks(tasks, jobs, cost, [specs[i].name for i in misses])
    for i, k in zip(misses, compiled):
        objects[i] = k
        for phase, secs in k.seconds.items():
            stats.kernel_phases[phase] = stats.kernel_phases.get(phase, 0.0) + secs
        if store is not None and keys[i] is not None and k.cacheable:
            store.put(keys[i], k.to_bytes())
    names = [s.name for s in specs]
    entry = "main" if "main" in names else (names[0] if names else None)
    metas = [k.meta for k in objects]
    with stats.phase("link and load"):
        glue = glue_object(config, metas, entry, store)
        metadata = {"abi_version": abi.ABI_VERSION, "target": str(target),
                    "triple": config.triple, "num_cores": target.num_cores, "entry": entry,
                    "functions": metas}
        module = LLVMModule(objects, glue, metadata, config,
                            source=functools.partial(_lowered_sources, specs, target),
                            store=store)
    if store is not None and misses:
        with stats.phase("cache trim"):
            store.trim()
    module.build_stats = stats
    return module


_MODULE_FORMAT = 1   # of module_to_bytes; bump when it changes


def module_to_bytes(module: LLVMModule) -> bytes:
    """``module``'s compiled code as bytes (``module_from_bytes`` loads it back): a JSON
    header line (the format, the target, the module's metadata, the sizes of the parts), then
    the glue object and each kernel's ``KernelObject.to_bytes``. No TensorIR is kept, so a
    module loaded from these bytes has no ``get_source``.

    Examples
    --------
    >>> data = module_to_bytes(build_llvm(specs, Target("llvm")))        # doctest: +SKIP
    >>> module = module_from_bytes(data, Target("llvm"))                 # doctest: +SKIP
    """
    parts = [module._glue] + [k.to_bytes() for k in module._kernels]
    header = json.dumps({"format": _MODULE_FORMAT, "target": str(module._config.target),
                         "metadata": module.metadata,
                         "kernels": [k.name for k in module._kernels],
                         "sizes": [len(p) for p in parts]}, sort_keys=True)
    return b"".join([header.encode("utf-8"), b"\n"] + parts)


def module_from_bytes(data: bytes, target: Target, store=None) -> LLVMModule | None:
    """The module ``module_to_bytes`` wrote, loaded for ``target``; None when ``data`` is not
    such a module for ``target`` (another format, target or a truncated payload)."""
    head, sep, rest = data.partition(b"\n")
    try:
        header = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not sep or not isinstance(header, dict) or header.get("format") != _MODULE_FORMAT or \
            header.get("target") != str(target) or \
            sum(header.get("sizes", [])) != len(rest) or \
            len(header["sizes"]) != len(header.get("kernels", [])) + 1:
        return None
    parts, at = [], 0
    for size in header["sizes"]:
        parts.append(rest[at:at + size])
        at += size
    kernels = [KernelObject.from_bytes(p, name) for p, name in zip(parts[1:], header["kernels"])]
    if any(k is None for k in kernels):
        return None
    return LLVMModule(kernels, parts[0], header["metadata"], MachineConfig(target), store=store)


def target_machine_key(target: Target) -> dict:
    """``machine_key`` of ``target``: everything about the machine, the toolchain (LLVM and
    llvmlite versions) and tilecraft's code that compiled code depends on."""
    return machine_key(MachineConfig(target))


def _size_estimate(func: PrimFunc) -> float:
    """How long a kernel takes to compile, roughly: the nodes of its body."""
    count = 0

    def visit(_):
        nonlocal count
        count += 1
    post_order_visit(func.body, visit)
    return float(count)


def _lowered_sources(specs, target: Target) -> list[tuple[str, PrimFunc]]:
    out = []
    for spec in specs:
        func = spec.schedule(spec.func) if spec.schedule is not None else spec.func
        out.append((spec.name, func if is_lowered(func) else lower(func, target)))
    return out
