"""``Target``: what to compile for — kind, triple, CPU, features, and the limits code must respect.

A target is written as a string (``"llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -num-cores=4"``),
a dict (``{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}``) or a tag (``"raspberry-pi/4b-aarch64"``).
This module needs no LLVM: a board-side process can describe targets too.

Examples
--------
>>> t = Target("raspberry-pi/4b-aarch64")
>>> t.kind, t.arch, t.num_cores, t.vector_width
('llvm', 'aarch64', 4, 128)
>>> Target("llvm").is_host
True
"""
from __future__ import annotations

import functools

import os
import platform
import shlex
from typing import Any, Mapping

from tilecraft.errors import TilecraftError

KINDS = ("llvm", "opencl", "webgpu")

# Architectures the LLVM back end handles, by the first component of a triple.
_ARCH_ALIASES = {
    "x86_64": "x86_64", "amd64": "x86_64", "x86-64": "x86_64",
    "i386": "x86", "i686": "x86",
    "aarch64": "aarch64", "arm64": "aarch64",
    "arm": "arm", "armv7": "arm", "armv7a": "arm", "armv7l": "arm", "armv7hl": "arm",
    "armv8l": "arm", "thumbv7": "arm",
    "riscv64": "riscv64", "riscv32": "riscv32",
}

# Which ELF e_machine each architecture produces (checked by tests of cross-compiled objects).
ELF_MACHINE = {"x86_64": 62, "x86": 3, "aarch64": 183, "arm": 40, "riscv64": 243, "riscv32": 243}

# WebGPU's spec defaults (what every browser grants without asking).
WEBGPU_SPEC_LIMITS = {
    "max_storage_buffers_per_shader_stage": 8,
    "max_compute_invocations_per_workgroup": 256,
    "max_compute_workgroup_size_x": 256,
    "max_compute_workgroup_size_y": 256,
    "max_compute_workgroup_size_z": 64,
    "max_compute_workgroup_storage_size": 16384,
    "max_compute_workgroups_per_dimension": 65535,
    "max_uniform_buffers_per_shader_stage": 12,
    "max_storage_buffer_binding_size": 134217728,
    "max_buffer_size": 268435456,
}

TAGS: dict[str, dict[str, Any]] = {
    "raspberry-pi/4b-aarch64": {
        "kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72", "mattr": ["+neon"],
        "num_cores": 4, "description": "Raspberry Pi 4 Model B, 64-bit OS (4x Cortex-A72)"},
    "raspberry-pi/4b-armv7": {
        "kind": "llvm", "mtriple": "armv7a-linux-gnueabihf", "mcpu": "cortex-a72",
        "mattr": ["+neon", "+vfp4"], "num_cores": 4,
        "description": "Raspberry Pi 4 Model B, 32-bit Raspberry Pi OS (armhf)"},
    "raspberry-pi/5": {
        "kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76", "mattr": ["+neon"],
        "num_cores": 4, "description": "Raspberry Pi 5 (4x Cortex-A76)"},
    "jetson-orin-cpu": {
        "kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a78ae", "mattr": ["+neon"],
        "num_cores": 12, "description": "NVIDIA Jetson AGX Orin, its Arm CPU (12x Cortex-A78AE)"},
    "visionfive2": {
        "kind": "llvm", "mtriple": "riscv64-linux-gnu", "mcpu": "sifive-u74",
        "mattr": ["+m", "+a", "+f", "+d", "+c"], "num_cores": 4,
        "description": "StarFive VisionFive 2 (4x SiFive U74, RV64GC)"},
    "x86-host": {"kind": "llvm", "description": "this machine's x86-64 CPU, all its features"},
    "x86-64-v3": {
        "kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell",
        "description": "any x86-64 with AVX2 and FMA (x86-64-v3)"},
    "opencl-gpu": {"kind": "opencl", "description": "the first OpenCL GPU found"},
    "webgpu-browser": {"kind": "webgpu", "description": "WebGPU with the spec's default limits"},
    # What Chrome grants on a desktop NVIDIA / AMD GPU when a page asks for the adapter's limits
    # (``requestDevice({requiredLimits: adapter.limits})``); native wgpu on such a GPU grants at
    # least this. ``targets.webgpu(0).target()`` reads the actual adapter instead.
    "webgpu-desktop": {
        "kind": "webgpu", "max_threads_per_block": 1024, "max_shared_memory_per_block": 32768,
        "max_storage_buffers": 10, "max_storage_buffer_binding_size": 2147483644,
        "max_buffer_size": 2147483648,
        "description": "WebGPU on a desktop GPU with the adapter's limits requested (Chrome on "
                       "NVIDIA: 1024 invocations, 32 KiB workgroup storage, 2 GiB bindings)"},
}

_OPTION_KEYS = {"mtriple", "mcpu", "mattr", "num-cores", "mabi", "opt-level", "device", "keys",
                "max-threads-per-block", "max-shared-memory-per-block", "vector-width", "tag",
                "max-storage-buffers", "supports-float16", "max-storage-buffer-binding-size",
                "max-buffer-size", "trusted-shaders", "fp32-tensor-cores"}

# The options of the string form in the order ``str(Target)`` writes them (every field of a
# target but ``kind``, ``tag`` and ``description``).
_STR_ORDER = ("mtriple", "mcpu", "mabi", "mattr", "device", "keys", "num_cores", "opt_level",
              "max_threads_per_block", "max_shared_memory_per_block", "vector_width",
              "max_storage_buffers", "max_storage_buffer_binding_size", "max_buffer_size",
              "supports_float16", "trusted_shaders", "fp32_tensor_cores")


def _canonical_options(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, value text) of every option set in ``config``, in ``_STR_ORDER``."""
    out = []
    for key in _STR_ORDER:
        value = config.get(key)
        if value is None or value == "" or value == ():
            continue
        if isinstance(value, bool):
            text = str(int(value))
        elif isinstance(value, (tuple, list)):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        out.append((key, text))
    return out


class TargetError(TilecraftError, ValueError):
    """An unknown target kind, option, tag or triple."""


def host_triple() -> str:
    """The triple of the machine we run on, without needing LLVM."""
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    system = platform.system().lower()
    if system == "linux":
        if arch.startswith("arm"):
            return "armv7a-linux-gnueabihf"
        return f"{arch}-linux-gnu"
    if system == "darwin":
        return f"{arch}-apple-darwin"
    if system == "windows":
        return f"{arch}-pc-windows-msvc"
    return f"{arch}-unknown-{system}"


def arch_of_triple(triple: str) -> str:
    """``aarch64-linux-gnu -> aarch64``; raises TargetError for an architecture we do not know."""
    first = triple.split("-")[0].lower()
    if first in _ARCH_ALIASES:
        return _ARCH_ALIASES[first]
    if first.startswith("armv"):
        return "arm"
    raise TargetError(f"unknown target triple {triple!r}: architecture {first!r} is not one of "
                      f"{sorted(set(_ARCH_ALIASES.values()))}")


class Target:
    """A compilation target.

    Parameters
    ----------
    target : str | dict | Target
        ``"llvm"``, ``"llvm -mtriple=... -mcpu=... -mattr=+neon,+fp16 -num-cores=4"``,
        ``"opencl"``, ``"webgpu"``, a tag name, or the dict form with the same keys
        (``mattr`` a list, ``num_cores`` an int).

    Attributes
    ----------
    kind : "llvm" | "opencl" | "webgpu"
    mtriple, mcpu : str | None   (None: the host's)
    mattr : tuple[str, ...]     LLVM feature flags such as ``+avx2``
    num_cores : int | None       threads for parallel loops (None: all cores at run time)
    tag : str | None
    """

    def __init__(self, target: "str | Mapping[str, Any] | Target"):
        if isinstance(target, Target):
            self._config = dict(target._config)
            return
        if isinstance(target, str):
            config = self._parse_string(target)
        elif isinstance(target, Mapping):
            config = self._normalize_dict(dict(target))
        else:
            raise TargetError(f"a target is a string, dict or Target, not {type(target).__name__}")
        self._config = config
        self._validate()

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def _parse_string(text: str) -> dict:
        words = shlex.split(text.strip())
        if not words:
            raise TargetError("empty target string")
        head, rest = words[0], words[1:]
        if head in TAGS:
            config = dict(TAGS[head])
            config["tag"] = head
        elif head in KINDS:
            config = {"kind": head}
        else:
            raise TargetError(f"unknown target {head!r}: expected a kind ({', '.join(KINDS)}) or a "
                              f"tag ({', '.join(sorted(TAGS))})")
        for w in rest:
            if not w.startswith("-"):
                raise TargetError(f"target option {w!r} must look like -key=value")
            key, _, value = w.lstrip("-").partition("=")
            if key not in _OPTION_KEYS:
                raise TargetError(f"unknown target option -{key} (known: "
                                  f"{', '.join('-' + k for k in sorted(_OPTION_KEYS))})")
            config[key.replace("-", "_")] = value
        return Target._normalize_dict(config)

    @staticmethod
    def _normalize_dict(config: dict) -> dict:
        if "tag" in config and config.get("tag") in TAGS and "kind" not in config:
            config = {**TAGS[config["tag"]], **config}
        config = {k.replace("-", "_"): v for k, v in config.items()}
        kind = config.get("kind")
        if kind not in KINDS:
            raise TargetError(f"unknown target kind {kind!r}; expected one of {', '.join(KINDS)}")
        known = {k.replace("-", "_") for k in _OPTION_KEYS} | {"kind", "description", "keys"}
        unknown = set(config) - known
        if unknown:
            raise TargetError(f"unknown target field(s) {sorted(unknown)}")
        mattr = config.get("mattr") or ()
        if isinstance(mattr, str):
            mattr = [m for m in mattr.split(",") if m]
        for m in mattr:
            if not (m.startswith("+") or m.startswith("-")):
                raise TargetError(f"target feature {m!r} must start with + or -")
        config["mattr"] = tuple(mattr)
        if config.get("keys") is not None:
            keys = config["keys"]
            if isinstance(keys, str):
                keys = [k for k in keys.split(",") if k]
            config["keys"] = tuple(str(k) for k in keys)
        for key in ("mtriple", "mcpu", "mabi", "device"):
            if config.get(key) is not None and not isinstance(config[key], str):
                raise TargetError(f"target option {key} must be a string, got {config[key]!r}")
        for key in ("num_cores", "opt_level", "max_threads_per_block",
                    "max_shared_memory_per_block", "vector_width", "max_storage_buffers",
                    "max_storage_buffer_binding_size", "max_buffer_size"):
            if config.get(key) is not None:
                try:
                    config[key] = int(config[key])
                except (TypeError, ValueError):
                    raise TargetError(f"target option {key} must be an integer, got "
                                      f"{config[key]!r}") from None
                if config[key] <= 0 and key != "opt_level":
                    raise TargetError(f"target option {key} must be positive, got {config[key]}")
        for key in ("supports_float16", "trusted_shaders"):
            flag = config.get(key)
            if isinstance(flag, str):
                word = flag.strip().lower()
                if word not in ("1", "true", "yes", "0", "false", "no"):
                    raise TargetError(f"target option {key} must be 1/0 or true/false, "
                                      f"got {flag!r}")
                config[key] = word in ("1", "true", "yes")
            elif flag is not None:
                config[key] = bool(flag)
        fp32_tc = config.get("fp32_tensor_cores")
        if fp32_tc is not None:
            word = str(fp32_tc).strip().lower()
            if word in ("", "none", "0", "off"):
                config.pop("fp32_tensor_cores")
            elif word not in FP32_TENSOR_CORE_MODES:
                raise TargetError(f"target option fp32_tensor_cores must be one of "
                                  f"{', '.join(FP32_TENSOR_CORE_MODES)} or none, got {fp32_tc!r}")
            elif config.get("kind") != "opencl" or str(config.get("device") or "").lower() \
                    not in _TENSOR_CORE_DEVICES:
                devices = " or ".join(f"-device={d}" for d in _TENSOR_CORE_DEVICES)
                raise TargetError(f"target option fp32_tensor_cores needs an OpenCL target with "
                                  f"tensor cores ({devices})")
            else:
                config["fp32_tensor_cores"] = word
        if config.get("trusted_shaders") and config.get("kind") != "webgpu":
            raise TargetError(f"target option trusted_shaders is for WebGPU targets only, not "
                              f"{config.get('kind')!r}")
        return config

    def _validate(self):
        if self.kind == "llvm" and self._config.get("mtriple"):
            arch_of_triple(self._config["mtriple"])  # raises on an unknown architecture
            parts = self._config["mtriple"].split("-")
            if len(parts) < 2:
                raise TargetError(f"target triple {self._config['mtriple']!r} needs at least "
                                  f"arch-os, e.g. aarch64-linux-gnu")

    # -- properties ---------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self._config["kind"]

    @property
    def tag(self) -> str | None:
        return self._config.get("tag")

    @property
    def mtriple(self) -> str | None:
        return self._config.get("mtriple")

    @property
    def triple(self) -> str:
        """The triple to compile for (the host's when none was given)."""
        return self.mtriple or host_triple()

    @property
    def mcpu(self) -> str | None:
        return self._config.get("mcpu")

    @property
    def mattr(self) -> tuple[str, ...]:
        return self._config.get("mattr", ())

    @property
    def mabi(self) -> str | None:
        return self._config.get("mabi")

    @property
    def num_cores(self) -> int | None:
        return self._config.get("num_cores")

    @property
    def opt_level(self) -> int:
        return self._config.get("opt_level", 3)

    @property
    def arch(self) -> str:
        return arch_of_triple(self.triple)

    @property
    def is_host(self) -> bool:
        """True when code for this target runs in this process (an LLVM target for our machine)."""
        if self.kind != "llvm":
            return False
        if self.mtriple is None:
            return True
        return (arch_of_triple(self.mtriple) == arch_of_triple(host_triple())
                and ("linux" in self.mtriple) == ("linux" in host_triple()))

    @property
    def description(self) -> str:
        return self._config.get("description", str(self))

    @property
    def vector_width(self) -> int:
        """Vector register width in bits that vectorized loops should fill."""
        if self._config.get("vector_width"):
            return self._config["vector_width"]
        if self.kind != "llvm":
            return 128
        features = set(self.mattr)
        arch = self.arch
        if arch in ("x86_64", "x86"):
            if self.mcpu is None and self.mtriple is None:
                return _host_x86_vector_width()
            if "+avx512f" in features or (self.mcpu or "") in _AVX512_CPUS:
                return 512
            if "+avx2" in features or "+avx" in features or (self.mcpu or "") in _AVX2_CPUS:
                return 256
            return 128
        if arch in ("aarch64", "arm"):
            return 128
        if arch.startswith("riscv"):
            return 128 if "+v" in features else 64
        return 128

    @property
    def amx_int8(self) -> bool:
        """Whether code for this target may use Intel AMX int8 tiles (``tdpbusd``): an x86-64
        LLVM target whose ``-mattr`` enables ``amx-int8`` (the last mention wins), or, with no
        ``-mattr`` mention, the host when its CPU has ``amx_int8`` and ``amx_tile``, or an
        ``-mcpu`` with AMX. ``-mattr=-amx-int8`` turns it off.

        Examples
        --------
        >>> Target("llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids").amx_int8
        True
        >>> Target("llvm -mcpu=sapphirerapids -mattr=-amx-int8").amx_int8
        False
        """
        if self.kind != "llvm" or self.arch != "x86_64":
            return False
        said = [m[0] == "+" for m in self.mattr if m[1:] == "amx-int8"]
        if said:
            return said[-1]
        if self.mcpu is not None:
            return self.mcpu in _AMX_CPUS
        if self.mtriple is None:
            return host_cpu_flags() >= {"amx_int8", "amx_tile"}
        return False

    @property
    def max_threads_per_block(self) -> int:
        if self._config.get("max_threads_per_block"):
            return self._config["max_threads_per_block"]
        if self.kind == "webgpu":
            return WEBGPU_SPEC_LIMITS["max_compute_invocations_per_workgroup"]
        if self.kind == "opencl":
            return 256
        return 1

    @property
    def max_shared_memory_per_block(self) -> int:
        if self._config.get("max_shared_memory_per_block"):
            return self._config["max_shared_memory_per_block"]
        if self.kind == "webgpu":
            return WEBGPU_SPEC_LIMITS["max_compute_workgroup_storage_size"]
        if self.kind == "opencl":
            return 32768
        return 0

    @property
    def max_storage_buffers(self) -> int | None:
        if self._config.get("max_storage_buffers"):
            return self._config["max_storage_buffers"]
        if self.kind == "webgpu":
            return WEBGPU_SPEC_LIMITS["max_storage_buffers_per_shader_stage"]
        return None

    @property
    def max_storage_buffer_binding_size(self) -> int | None:
        """The most bytes one storage binding may span (WebGPU; None for other kinds). Every
        kernel binds each buffer whole, so this is also the largest array a kernel can take."""
        if self._config.get("max_storage_buffer_binding_size"):
            return self._config["max_storage_buffer_binding_size"]
        if self.kind == "webgpu":
            return WEBGPU_SPEC_LIMITS["max_storage_buffer_binding_size"]
        return None

    @property
    def max_buffer_size(self) -> int | None:
        """The most bytes one buffer may have (WebGPU; None for other kinds)."""
        if self._config.get("max_buffer_size"):
            return self._config["max_buffer_size"]
        if self.kind == "webgpu":
            return WEBGPU_SPEC_LIMITS["max_buffer_size"]
        return None

    @property
    def supports_float16(self) -> bool:
        return bool(self._config.get("supports_float16", self.kind == "llvm"))

    @property
    def tensor_cores(self) -> str | None:
        """How OpenCL kernels may use NVIDIA's tensor cores: ``"ptx"`` for
        ``Target("opencl -device=nvidia")`` (NVIDIA's OpenCL driver on a GPU of compute
        capability 8.0 or more: inline-PTX ``mma.sync``; ``targets.opencl(0).target()`` gives it
        on such a device), ``"emulated"`` for ``-device=nvidia-emulated`` (the same kernels with
        the mma computed by portable OpenCL C: for testing them on a CPU driver such as PoCL),
        None otherwise. See docs/gpu.md, "Tensor cores on NVIDIA OpenCL".

        >>> Target("opencl -device=nvidia").tensor_cores
        'ptx'
        >>> Target("opencl").tensor_cores is None
        True
        """
        if self.kind != "opencl":
            return None
        return _TENSOR_CORE_DEVICES.get(str(self._config.get("device") or "").lower())

    @property
    def fp32_tensor_cores(self) -> str | None:
        """How float32 GEMM-like kernels may use the tensor cores (``tensor_cores``): ``"3xtf32"``
        for ``Target("opencl -device=nvidia -fp32-tensor-cores=3xtf32")`` (each float32 operand
        split into two tf32 parts, three tf32 mma: float32-level accuracy,
        ``relax.backend.gpu.tensor_core_tf32``), None (the default: the float32 SIMT GEMM). See
        docs/gpu.md, "3xTF32: float32 GEMMs on the tensor cores".

        >>> Target("opencl -device=nvidia -fp32-tensor-cores=3xtf32").fp32_tensor_cores
        '3xtf32'
        >>> Target("opencl -device=nvidia").fp32_tensor_cores is None
        True
        """
        return self._config.get("fp32_tensor_cores")

    @property
    def trusted_shaders(self) -> bool:
        """WebGPU only: create this target's shader modules without naga's run-time checks
        (index clamps, loop bounding) — native wgpu only, never in a browser; default False.
        See docs/gpu-webgpu.md, "Trusted shaders"."""
        return bool(self._config.get("trusted_shaders", False))

    @property
    def limits(self) -> dict[str, Any]:
        """All limits a schedule or code generator must respect, by name."""
        out = {"vector_width": self.vector_width,
               "max_threads_per_block": self.max_threads_per_block,
               "max_shared_memory_per_block": self.max_shared_memory_per_block,
               "num_cores": self.num_cores or (os.cpu_count() if self.is_host else None)}
        if self.kind == "webgpu":
            out.update(WEBGPU_SPEC_LIMITS)
            # a target that declares more threads or workgroup storage raises the WebGPU
            # names of those limits too (what the device is then opened with)
            threads = self.max_threads_per_block
            out["max_compute_invocations_per_workgroup"] = threads
            for axis in "xy":
                key = f"max_compute_workgroup_size_{axis}"
                out[key] = max(out[key], threads)
            out["max_compute_workgroup_storage_size"] = self.max_shared_memory_per_block
            if self.max_storage_buffers:
                out["max_storage_buffers_per_shader_stage"] = self.max_storage_buffers
            out["max_storage_buffer_binding_size"] = self.max_storage_buffer_binding_size
            out["max_buffer_size"] = self.max_buffer_size
        return out

    # -- forms --------------------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        """The dict form (round-trips through ``Target(d)``)."""
        d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self._config.items()
             if k != "description"}
        return d

    def with_host_defaults(self) -> "Target":
        return Target(self)

    def __str__(self):
        """The canonical string form: every option the target carries (its tag and description
        excepted: a tag is a name for its options), in a fixed order, so that
        ``Target(str(t)) == t`` for every target and equal targets print alike."""
        parts = [self.kind]
        for key, value in _canonical_options(self._config):
            parts.append(shlex.quote(f"-{key.replace('_', '-')}={value}"))
        return " ".join(parts)

    def __repr__(self):
        return f"Target({str(self)!r})"

    def __eq__(self, other):
        if not isinstance(other, Target):
            return NotImplemented
        return str(self) == str(other)

    def __hash__(self):
        return hash(str(self))

    @staticmethod
    def list_tags() -> dict[str, str]:
        """Tag name -> description."""
        return {name: cfg.get("description", "") for name, cfg in TAGS.items()}


# the values of ``-fp32-tensor-cores`` (``Target.fp32_tensor_cores``)
FP32_TENSOR_CORE_MODES = ("3xtf32",)

# ``-device`` values of OpenCL targets whose kernels may use tensor cores (``Target.tensor_cores``)
_TENSOR_CORE_DEVICES = {"nvidia": "ptx", "nvidia-emulated": "emulated"}

_AVX2_CPUS = {"haswell", "broadwell", "skylake", "alderlake", "raptorlake", "znver1", "znver2",
              "znver3", "x86-64-v3"}
_AVX512_CPUS = {"skylake-avx512", "cascadelake", "icelake-server", "icelake-client",
                "sapphirerapids", "znver4", "znver5", "x86-64-v4", "tigerlake", "cooperlake"}


_AMX_CPUS = {"sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
             "diamondrapids"}


@functools.lru_cache(maxsize=None)
def host_cpu_flags() -> frozenset:
    """The host CPU's flags from /proc/cpuinfo (empty where there is none), read once per
    process: schedules ask for them per kernel."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return frozenset(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return frozenset()


def _host_x86_vector_width() -> int:
    """The host's vector width from /proc/cpuinfo (no LLVM needed)."""
    words = host_cpu_flags()
    if "avx512f" in words:
        return 512
    if "avx2" in words:
        return 256
    return 128
