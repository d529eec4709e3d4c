"""What the tests need from this machine, and the one rule for when it is missing.

A test that needs a driver, a tool or an optional library says so with
``requires(what, available, how_to_install)`` (in a test, a fixture or at module level) or with
the same as a mark, ``@needs(what, available, how_to_install)``. On a developer's machine a
missing one is a skip naming it; under ``CI=true`` it is a failure naming it, so a green CI run
means every capability ran (``make test`` installs them all: Makefile, ``system-deps``). A skip
that is no capability CI could install (an AVX-512 test on an AVX2 host, a feature the adapter
lacks) stays a plain ``pytest.skip`` with its reason.

Examples
--------
>>> from capabilities import needs_lld, requires, have                     # doctest: +SKIP
>>> @needs_lld
... def test_export(tmp_path): ...
>>> requires("node", have("node"), "Debian: apt-get install nodejs")
"""
from __future__ import annotations

import importlib
import os
import shutil
import sys

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def requires(what: str, available, how_to_install: str) -> None:
    """Go on when ``available`` is true; else skip the test (or the module) saying what it
    needs and how to install it, and under ``CI=true`` fail saying so instead."""
    if available:
        return
    reason = f"needs {what} ({how_to_install})"
    if IN_CI:
        pytest.fail(f"CI=true and this test cannot run: it {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def needs(what: str, available, how_to_install: str) -> pytest.MarkDecorator:
    """``requires`` as a mark on a test, a class or a module (``pytestmark``); tests/conftest.py
    applies it before the test's fixtures run."""
    return pytest.mark.requires(what=what, available=bool(available),
                                how_to_install=how_to_install)


def have(tool: str) -> bool:
    """Whether the program ``tool`` is on PATH."""
    return shutil.which(tool) is not None


def apt(*packages: str) -> str:
    return "Debian: apt-get install " + " ".join(packages)


# -- tools ------------------------------------------------------------------------------------
LLD = ("ld.lld", have("ld.lld"), apt("lld"))
needs_lld = needs(*LLD)
GCC = ("a C compiler (gcc)", have("gcc") or have("cc"), apt("gcc", "libc6-dev"))
needs_gcc = needs(*GCC)
needs_node = needs("node (to run the browser loader)", have("node"), apt("nodejs"))

# cross compilers: (gcc, its Debian packages, qemu, sysroot) per triple
CROSS = {
    "aarch64-linux-gnu": ("gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-aarch64-static"),
    "arm-linux-gnueabihf": ("gcc-arm-linux-gnueabihf", "libc6-dev-armhf-cross", "qemu-arm-static"),
    "riscv64-linux-gnu": ("gcc-riscv64-linux-gnu", "libc6-dev-riscv64-cross",
                          "qemu-riscv64-static"),
}


def requires_cross_toolchain(triple: str, with_qemu: bool = True) -> tuple[str, str, str]:
    """``(cc, qemu, sysroot)`` of ``triple``'s cross gcc and qemu-user, or ``requires`` fails."""
    gcc_pkg, libc_pkg, qemu = CROSS[triple]
    cc, sysroot = f"{triple}-gcc", f"/usr/{triple}"
    requires(f"{cc} and its C library in {sysroot}", have(cc) and os.path.isdir(sysroot),
             apt(gcc_pkg, libc_pkg))
    if with_qemu:
        requires(qemu, have(qemu), apt("qemu-user-static"))
    return cc, qemu, sysroot


# -- optional Python libraries ------------------------------------------------------------------

def import_or_require(module: str, how_to_install: str):
    """``import module`` (returns it), or ``requires`` fails naming the pip command; for module
    level too (``torch = import_or_require("torch", "pip install 'tilecraft[torch]'")``)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module.split(".")[0]:
            raise                      # installed but broken: that is a failure everywhere
        requires(f"the Python package {module}", False, how_to_install)


# -- GPU drivers -------------------------------------------------------------------------------

def opencl_device() -> tuple:
    """``(targets.opencl(0), target string)``: ``"opencl -device=cpu"`` when the device is a CPU
    (PoCL: the CPU variant of the GPU schedules), else ``"opencl"``; or ``requires`` fails."""
    from tilecraft import targets
    from tilecraft.targets.opencl_backend import OpenCLError, list_devices
    from tilecraft.optional import MissingDependencyError
    try:
        devices = list_devices()
    except (OpenCLError, MissingDependencyError) as err:
        requires(f"an OpenCL device ({err})", False,
                 apt("pocl-opencl-icd") + "; pip install 'tilecraft[opencl]'")
    target = "opencl -device=cpu" if "CPU" in devices[0]["type"].upper() else "opencl"
    return targets.opencl(0), target


def webgpu_device():
    """``targets.webgpu(0)``, or ``requires`` fails naming why there is no adapter."""
    from tilecraft import targets
    from tilecraft.targets.webgpu_backend import runtime
    from tilecraft.optional import MissingDependencyError
    how = apt("mesa-vulkan-drivers") + " (lavapipe); pip install 'tilecraft[webgpu]'"
    try:
        n = len(runtime._adapter_list())
    except (runtime.WebGPUError, MissingDependencyError) as err:
        requires(f"a WebGPU adapter ({err})", False, how)
    requires("a WebGPU adapter (wgpu found none)", n > 0, how)
    return targets.webgpu(0)


def gpu_device(kind: str):
    """``(device, target string)`` of ``"opencl"`` or ``"webgpu"``."""
    return opencl_device() if kind == "opencl" else (webgpu_device(), "webgpu")


# -- the emulated arm64 board -------------------------------------------------------------------

def arm64_board_root() -> str:
    """The emulated arm64 board's root file system (``rpc/board/emulated_board.py``), built
    and cached in ``~/.cache/tilecraft/arm64-root`` when it is not there yet (under a minute with
    mmdebstrap, as root, from a Debian mirror); or ``requires`` fails naming what is missing."""
    from tilecraft.rpc.board import emulated_board as eb
    root = eb.default_root()
    missing = eb.missing_tools(build=not eb.root_ready(root))
    requires("the emulated arm64 board: " + "; ".join(missing), not missing,
             apt("qemu-user-static", "mmdebstrap") + ", and root to build its file system")
    try:
        eb.ensure_root(root, log=lambda line: print(line, file=sys.stderr))
    except RuntimeError as err:
        requires(f"the emulated arm64 board's root file system, which could not be built: {err}",
                 False, "a Debian mirror mmdebstrap can reach; or build it once with "
                        "`python -m tilecraft.rpc.board.emulated_board --build-only`")
    return root
