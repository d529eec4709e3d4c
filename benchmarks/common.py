"""Shared helpers of the benchmarks: timing, side-by-side ratios, JSON results, a printed table.

This machine is shared and noisy, so every figure is a median over repeats, and each kernel is
compared with its peer measured in the same process, interleaved, and reported as a ratio.
"""
from __future__ import annotations

import json
import os
import platform
import re
import statistics
import sys
import time
from typing import Callable

from tilecraft.targets.fileio import atomic_write

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MACHINE_ENV = "TILECRAFT_MACHINE"

# a machine or benchmark name is one path component; machine names hold no dot, so a result's
# companions (``zen4-avx512.curves.json``, ``zen4-avx512.png``) never read as another machine
_MACHINE_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*\Z")
_BENCHMARK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")
_SUFFIX = re.compile(r"(\.[A-Za-z0-9_-]+)+\Z")

# AMD family 0x19 models that are Zen 4 (the rest of the family is Zen 3)
_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))
# Intel family 6 server and recent client models; others are named by their vector ISA alone
_INTEL_MODELS = {0x3F: "haswell", 0x4F: "broadwell", 0x55: "skylake", 0x6A: "icelake",
                 0x6C: "icelake", 0x7E: "icelake", 0x8C: "tigerlake", 0x8D: "tigerlake",
                 0x8F: "sapphirerapids", 0x97: "alderlake", 0x9A: "alderlake",
                 0xAD: "graniterapids", 0xAE: "graniterapids", 0xB7: "raptorlake",
                 0xBA: "raptorlake", 0xBF: "raptorlake", 0xCF: "emeraldrapids"}
# Arm Ltd. (implementer 0x41) core parts
_ARM_PARTS = {0xD03: "cortex-a53", 0xD07: "cortex-a57", 0xD08: "cortex-a72",
              0xD0B: "cortex-a76", 0xD0C: "neoverse-n1", 0xD40: "neoverse-v1",
              0xD49: "neoverse-n2", 0xD4F: "neoverse-v2"}
# words of a GPU's name that say nothing about the chip
_GPU_NOISE = {"corporation", "geforce", "tesla", "pcie", "nvl"}


def ensure_clean_openblas_env() -> None:
    """Re-exec without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE so numpy runs its best kernel.

    Those variables are set on some machines to work around old OpenBLAS bugs; they slow a current
    numpy, and comparing against a handicapped peer would flatter us.
    """
    if any(k in os.environ for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")):
        env = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        os.execvpe(sys.executable, [sys.executable] + sys.argv, env)


def median_time(fn: Callable[[], object], number: int = 5, repeat: int = 7,
                warmup: int = 2) -> float:
    """Median over ``repeat`` runs of the mean time of ``number`` calls, in seconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def side_by_side(ours: Callable[[], object], peer: Callable[[], object], number: int = 5,
                 rounds: int = 5) -> tuple[float, float]:
    """Time ``ours`` and ``peer`` interleaved round by round; return their median seconds per call.

    Interleaving spreads the machine's noise over both sides instead of favouring one.
    """
    for f in (ours, peer):
        f(); f()
    a, b = [], []
    for _ in range(rounds):
        for fn, out in ((ours, a), (peer, b)):
            # let the other side's worker threads go idle first: onnxruntime's pool spin-waits
            # after each run and would otherwise steal a core from whatever runs next
            time.sleep(0.05)
            fn()
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            out.append((time.perf_counter() - t0) / number)
    return statistics.median(a), statistics.median(b)


def _cpuinfo() -> dict:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    return parse_cpuinfo(text)


def parse_cpuinfo(text: str) -> dict:
    """The ``key: value`` fields of the first processor block of a ``/proc/cpuinfo`` text."""
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_machine_name(cpuinfo: dict | None = None, arch: str | None = None) -> str:
    """A short stable name for a CPU: its micro-architecture and widest vector instruction set.

    Parameters
    ----------
    cpuinfo : dict, optional
        Fields of ``/proc/cpuinfo`` (``parse_cpuinfo``); default: this machine's.
    arch : str, optional
        ``platform.machine()``; default: this machine's.

    Returns
    -------
    str
        ``zen3-avx2``, ``zen4-avx512``, ``intel-sapphirerapids-avx512``, ``intel-avx512`` (an
        Intel model not in the table), ``neoverse-v1-sve``, ``arm64-neon``, ...

    Examples
    --------
    >>> cpu_machine_name({"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17",
    ...                   "flags": "fma avx avx2 avx512f"}, "x86_64")
    'zen4-avx512'
    """
    info = _cpuinfo() if cpuinfo is None else cpuinfo
    arch = (platform.machine() if arch is None else arch).lower()
    if arch in ("x86_64", "amd64", "i686", "i386"):
        return _x86_name(info)
    if arch in ("aarch64", "arm64"):
        features = set(info.get("Features", "").split())
        isa = "sve" if "sve" in features else "neon"
        part = _ARM_PARTS.get(_int(info.get("CPU part"))) \
            if _int(info.get("CPU implementer")) == 0x41 else None
        return f"{part or 'arm64'}-{isa}"
    return _slug(arch) or "unknown"


def _x86_name(info: dict) -> str:
    flags = set(info.get("flags", "").split())
    isa = next((name for flag, name in (("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"),
                                        ("sse4_2", "sse4")) if flag in flags), "sse2")
    vendor, family, model = info.get("vendor_id"), _int(info.get("cpu family")), \
        _int(info.get("model"))
    if vendor == "AuthenticAMD":
        if family == 0x17:
            return f"{'zen' if model is not None and model < 0x30 else 'zen2'}-{isa}"
        if family == 0x19:
            zen4 = model is not None and any(model in r for r in _ZEN4_MODELS)
            return f"{'zen4' if zen4 else 'zen3'}-{isa}"
        if family == 0x1A:
            return f"zen5-{isa}"
        return f"amd-{isa}"
    if vendor == "GenuineIntel":
        uarch = _INTEL_MODELS.get(model) if family == 6 else None
        return f"intel-{uarch}-{isa}" if uarch else f"intel-{isa}"
    return f"x86-{isa}"


def gpu_machine_name(device: str) -> str:
    """A short stable name for a GPU from its device name.

    The vendor and the chip: memory sizes, form factors and a back end in parentheses are
    dropped, so an H100 is ``nvidia-h100`` whichever board and driver reported it.

    Examples
    --------
    >>> gpu_machine_name("NVIDIA H100 80GB HBM3")
    'nvidia-h100'
    >>> gpu_machine_name("NVIDIA H200 (Vulkan)")
    'nvidia-h200'
    """
    text = re.sub(r"\([^)]*\)", " ", device)
    words = [w for w in re.split(r"[^0-9a-z]+", text.lower())
             if w and w not in _GPU_NOISE and not re.fullmatch(r"\d+gb|hbm\d*e?|sxm\d*", w)]
    if not words:
        raise ValueError(f"gpu_machine_name: no chip name in the device name {device!r}")
    return "-".join(words)


def machine_name(gpu: str | None = None) -> str:
    """The name results are filed under: ``$TILECRAFT_MACHINE`` if set, else the GPU's name
    (``gpu``: the device name of a benchmark that measured a GPU), else the CPU's.

    Examples
    --------
    >>> machine_name("NVIDIA H200")                                  # doctest: +SKIP
    'nvidia-h200'
    """
    env = os.environ.get(MACHINE_ENV)
    if env:
        if not _MACHINE_NAME.match(env):
            raise ValueError(f"${MACHINE_ENV}={env!r} is not a machine name: lower-case letters "
                             "and digits in words joined by '-' (such as zen4-avx512)")
        return env
    return gpu_machine_name(gpu) if gpu else cpu_machine_name()


def machine_info() -> dict:
    """What a result records about the machine: Python, numpy, the CPU and its identity."""
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count()}
    try:
        import numpy as np
        info["numpy"] = np.__version__
    except ImportError:  # pragma: no cover
        pass
    cpu = _cpuinfo()
    if cpu.get("model name"):
        info["cpu"] = cpu["model name"]
    if cpu.get("vendor_id"):
        info["cpu_id"] = (f"{cpu['vendor_id']} family {cpu.get('cpu family')} "
                          f"model {cpu.get('model')}")
    return info


def results_path(benchmark: str, machine: str | None = None, suffix: str = ".json") -> str:
    """Where ``benchmark``'s result for ``machine`` lives: ``benchmarks/results/<benchmark>/
    <machine><suffix>``; a plot or table beside it takes another suffix (``.png``, ``.md``,
    ``.curves.json``).

    Examples
    --------
    >>> os.path.relpath(results_path("gemm_cpu", "zen4-avx512"), RESULTS_DIR)
    'gemm_cpu/zen4-avx512.json'
    """
    machine = machine_name() if machine is None else machine
    if not _BENCHMARK_NAME.match(benchmark):
        raise ValueError(f"results_path: {benchmark!r} is not a benchmark name (letters, digits, "
                         "'_' and '-')")
    if not _MACHINE_NAME.match(machine):
        raise ValueError(f"results_path: {machine!r} is not a machine name (lower-case letters "
                         "and digits in words joined by '-')")
    if not _SUFFIX.match(suffix):
        raise ValueError(f"results_path: {suffix!r} is not a file suffix such as '.json'")
    return os.path.join(RESULTS_DIR, benchmark, machine + suffix)


def write_json(path: str, doc) -> str:
    """Write ``doc`` as indented JSON to ``path`` atomically (a temporary file renamed over it,
    so a reader never sees half a file); return ``path``."""
    return atomic_write(path, json.dumps(doc, indent=2, default=_json_default) + "\n",
                        durable=True)


def write_results(name: str, rows: list[dict], extra: dict | None = None, *,
                  machine: str | None = None, gpu: str | None = None) -> str:
    """Write a benchmark's rows to ``benchmarks/results/<name>/<machine>.json``; return its path.

    One file per benchmark and machine: a run replaces that machine's previous result (git
    keeps the older ones). The machine is ``machine`` if given, else ``machine_name(gpu)``.

    Parameters
    ----------
    name : str
        The benchmark (``gemm_cpu``, ``tune_resnet50``, ``zoo-llvm``, ...).
    rows : list of dict
        The measurements; ratios are peer time / our time (above 1: faster than the peer).
    extra : dict, optional
        More top-level fields (settings, notes, per-task tables).
    machine, gpu : str, optional
        The machine name, or the device name of the GPU the benchmark measured.

    Examples
    --------
    >>> write_results("gemm_cpu", [{"kernel": "GEMM 1024^3", "ratio": 1.13}])  # doctest: +SKIP
    '.../benchmarks/results/gemm_cpu/zen4-avx512.json'
    """
    machine = machine_name(gpu) if machine is None else machine
    path = results_path(name, machine)
    doc = {"benchmark": name, "machine_name": machine,
           "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine_info(), "rows": rows}
    if extra:
        doc.update(extra)
    return write_json(path, doc)


def _json_default(x):
    if hasattr(x, "item"):                     # numpy scalars
        return x.item()
    return str(x)


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip().lower()
    try:
        return int(text, 16) if text.startswith("0x") else int(text)
    except ValueError:
        return None


def _slug(text: str) -> str:
    return "-".join(w for w in re.split(r"[^0-9a-z]+", text.lower()) if w)


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A plain aligned table on stdout."""
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.3f}"
    return str(v)
