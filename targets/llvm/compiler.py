"""Compile lowered TensorIR for an LLVM target: target machines, optimization, JIT and export.

For the host the module is JIT-compiled with MCJIT (no linker needed); for another triple it is
compiled to an object file at build time. ``export_library`` links the object (plus the
thread-pool runtime, when parallel loops need it) into one shared library with ``ld.lld``.
"""
from __future__ import annotations

import os
import re
import threading

import llvmlite.binding as llvm

from tilecraft.tensorir.function import IRModule, PrimFunc

from ..runtime import abi
from ..runtime.module import Module
from ..target import Target, TargetError, arch_of_triple, host_triple
from ..toolchain import link_shared
from . import dot4, threadpool
from .codegen import FMA_METADATA, CodeGenLLVM, CodegenOptions
from .irutil import ModuleBuilder
from .softops import hardware_division

_LOCK = threading.RLock()
_INITIALIZED = False
_RUNTIME_ENGINE = None   # the process-wide JIT copy of the thread pool (never freed)

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
                                                   self.target.vector_width))


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


def _ensure_runtime_engine():
    """JIT the thread pool once per process and make its symbols visible to JIT modules."""
    global _RUNTIME_ENGINE
    with _LOCK:
        if _RUNTIME_ENGINE is not None:
            return
        config = MachineConfig(Target("llvm"))
        tm = config.machine(jit=True, pic=False)
        mod = llvm.parse_assembly(runtime_ir(config, str(tm.target_data), "default"))
        mod.verify()
        optimize(mod, tm, 2)
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.finalize_object()
        for name in (threadpool.LAUNCH, threadpool.NUM_CORES):
            llvm.add_symbol(name, engine.get_function_address(name))
        _RUNTIME_ENGINE = (engine, mod, tm)


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


class LLVMModule(Module):
    """A module compiled by the LLVM back end.

    For the host target it runs here (JIT); for another triple it holds an object file, and
    calling a function raises ``RuntimeError`` (export it and run it on its board).
    """

    def __init__(self, ir_text: str, metadata: dict, config: MachineConfig, uses_parallel: bool):
        super().__init__(metadata)
        self._raw_ir = ir_text
        self._config = config
        self._uses_parallel = uses_parallel
        self._object: bytes | None = None
        self._engine = None
        if config.is_host:
            self._jit()
            self._init_threads()
        else:
            self._object, self._opt_ir = self._compile_object()

    # -- compilation ------------------------------------------------------------------------------
    def _jit(self):
        if self._uses_parallel:
            _ensure_runtime_engine()
        tm = self._config.machine(jit=True, pic=False)
        mod = _parse(self._raw_ir, self._config.has_fma)
        optimize(mod, tm, self._config.opt_level)
        self._opt_ir = str(mod)
        self._tm = tm
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.finalize_object()
        self._engine = engine
        self._jit_module = mod

    def _compile_object(self) -> tuple[bytes, str]:
        """An object file (PIC) with the thread-pool runtime linked in when it is needed."""
        tm = self._config.machine(jit=False, pic=True)
        mod = _parse(self._raw_ir, self._config.has_fma)
        if self._uses_parallel:
            rt = _parse(runtime_ir(self._config, str(tm.target_data), "hidden"))
            mod.link_in(rt)
        optimize(mod, tm, self._config.opt_level)
        return tm.emit_object(mod), str(mod)

    # -- Module interface -------------------------------------------------------------------------
    def _address(self, symbol: str) -> int:
        if symbol in (abi.NUM_THREADS_SYMBOL, abi.METADATA_SYMBOL, abi.ABI_VERSION_SYMBOL):
            addr = self._engine.get_global_value_address(symbol)
        else:
            addr = self._engine.get_function_address(symbol)
        if not addr:
            raise KeyError(f"symbol {symbol} not found in the JIT module")
        return addr

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
        ``"asm"`` (or ``"s"``) assembly for the target."""
        if fmt == "ll":
            return self._opt_ir
        if fmt == "ll-raw":
            return self._raw_ir
        if fmt in ("asm", "s"):
            tm = self._config.machine(jit=False, pic=True)
            mod = _parse(self._opt_ir)
            return tm.emit_assembly(mod)
        raise ValueError(f"unknown source format {fmt!r}; expected 'll', 'll-raw' or 'asm'")

    def object_code(self) -> bytes:
        """The relocatable object file (for this module's triple)."""
        if self._object is None:
            self._object, _ = self._compile_object()
        return self._object

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
        stub = self._empty_object() if needed else None
        link_shared([self.object_code()], path, needed, stub)
        return path

    def _empty_object(self) -> bytes:
        tm = self._config.machine(jit=False, pic=True)
        mod = llvm.parse_assembly(f'target triple = "{self._config.triple}"\n'
                                  f'target datalayout = "{tm.target_data}"\n')
        return tm.emit_object(mod)


def build_llvm(mod: IRModule, target: Target) -> LLVMModule:
    """Generate, optimize and compile (JIT or object) every lowered PrimFunc of ``mod``."""
    config = MachineConfig(target)
    data_layout = str(config.machine(jit=False, pic=True).target_data)
    cg = CodeGenLLVM(config.codegen_options(data_layout))
    for name, func in mod.functions.items():
        if not isinstance(func, PrimFunc):
            raise TypeError(f"targets.build compiles PrimFuncs; {name!r} is a "
                            f"{type(func).__name__} (build relax functions with relax.build)")
        cg.add_function(name, func)
    text = cg.finish(entry="main" if "main" in mod.functions else next(iter(mod.functions)))
    return LLVMModule(text, cg.meta, config, cg.uses_parallel)
