"""benchmarks.common's results files: machine names, paths, and writing a result."""
import json
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import common

MACHINE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*\Z")

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512dq avx512_bf16

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
"""


def _x86(vendor, family, model, flags):
    return {"vendor_id": vendor, "cpu family": str(family), "model": str(model), "flags": flags}


def test_parse_cpuinfo_reads_the_first_processor():
    info = common.parse_cpuinfo(ZEN4)
    assert info["vendor_id"] == "AuthenticAMD" and info["model"] == "17"
    assert "avx512f" in info["flags"].split()


@pytest.mark.parametrize("info, arch, want", [
    (common.parse_cpuinfo(ZEN4), "x86_64", "zen4-avx512"),
    (_x86("AuthenticAMD", 25, 1, "avx avx2 fma"), "x86_64", "zen3-avx2"),
    (_x86("AuthenticAMD", 25, 0x61, "avx2 avx512f"), "x86_64", "zen4-avx512"),
    (_x86("AuthenticAMD", 23, 49, "avx avx2"), "x86_64", "zen2-avx2"),
    (_x86("AuthenticAMD", 26, 2, "avx2 avx512f"), "x86_64", "zen5-avx512"),
    (_x86("GenuineIntel", 6, 143, "avx2 avx512f amx_tile"), "x86_64",
     "intel-sapphirerapids-avx512"),
    (_x86("GenuineIntel", 6, 85, "avx2 avx512f"), "x86_64", "intel-skylake-avx512"),
    (_x86("GenuineIntel", 6, 250, "avx2 avx512f"), "x86_64", "intel-avx512"),  # not in the table
    (_x86("GenuineIntel", 6, 60, "sse4_2"), "x86_64", "intel-sse4"),
    (_x86("HygonGenuine", 24, 1, "avx2"), "x86_64", "x86-avx2"),
    ({}, "x86_64", "x86-sse2"),                                      # no /proc/cpuinfo
    ({"CPU implementer": "0x41", "CPU part": "0xd0c", "Features": "fp asimd"}, "aarch64",
     "neoverse-n1-neon"),
    ({"CPU implementer": "0x41", "CPU part": "0xd40", "Features": "fp asimd sve"}, "aarch64",
     "neoverse-v1-sve"),
    ({"CPU implementer": "0x61", "CPU part": "0x22", "Features": "asimd"}, "arm64", "arm64-neon"),
    ({}, "riscv64", "riscv64"),
])
def test_cpu_machine_name(info, arch, want):
    assert common.cpu_machine_name(info, arch) == want


def test_this_machine_has_a_name():
    assert MACHINE.match(common.cpu_machine_name())


@pytest.mark.parametrize("device, want", [
    ("NVIDIA H200", "nvidia-h200"),
    ("NVIDIA H100 80GB HBM3", "nvidia-h100"),
    ("NVIDIA H100 PCIe", "nvidia-h100"),
    ("NVIDIA H200 (Vulkan)", "nvidia-h200"),
    ("NVIDIA GeForce RTX 4090", "nvidia-rtx-4090"),
    ("AMD Radeon RX 7900 XTX", "amd-radeon-rx-7900-xtx"),
])
def test_gpu_machine_name(device, want):
    assert common.gpu_machine_name(device) == want


def test_gpu_machine_name_without_a_chip_is_an_error():
    with pytest.raises(ValueError, match="no chip name"):
        common.gpu_machine_name("(Vulkan)")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_gpu_machine_name_is_a_machine_name_or_an_error(device):
    try:
        name = common.gpu_machine_name(device)
    except ValueError:
        return
    assert MACHINE.match(name)


def test_machine_name_override(monkeypatch):
    monkeypatch.setenv(common.MACHINE_ENV, "my-box-2")
    assert common.machine_name() == "my-box-2"
    assert common.machine_name(gpu="NVIDIA H200") == "my-box-2"
    monkeypatch.setenv(common.MACHINE_ENV, "My_Box")
    with pytest.raises(ValueError, match="TILECRAFT_MACHINE"):
        common.machine_name()


def test_machine_name_of_a_gpu(monkeypatch):
    monkeypatch.delenv(common.MACHINE_ENV, raising=False)
    assert common.machine_name(gpu="NVIDIA H100 80GB HBM3") == "nvidia-h100"
    assert common.machine_name() == common.cpu_machine_name()


@pytest.mark.parametrize("args, problem", [
    (("gemm/cpu", "zen4-avx512"), "benchmark name"),
    (("", "zen4-avx512"), "benchmark name"),
    (("gemm_cpu", "zen4.avx512"), "machine name"),
    (("gemm_cpu", "../x"), "machine name"),
    (("gemm_cpu", "zen4-avx512", "png"), "suffix"),
])
def test_results_path_rejects_bad_names(args, problem):
    with pytest.raises(ValueError, match=problem):
        common.results_path(*args)


def test_write_results(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS_DIR", str(tmp_path))
    rows = [{"kernel": "k", "ratio": 1.25}]
    path = common.write_results("bench_x", rows, {"note": "n"}, machine="box-1")
    assert path == str(tmp_path / "bench_x" / "box-1.json")
    doc = json.loads((tmp_path / "bench_x" / "box-1.json").read_text())
    assert doc["benchmark"] == "bench_x" and doc["machine_name"] == "box-1"
    assert doc["rows"] == rows and doc["note"] == "n" and doc["time"]
    assert doc["machine"]["cpus"] == os.cpu_count()
    # a second run replaces the file and leaves no temporary behind
    common.write_results("bench_x", [{"kernel": "k", "ratio": 2.0}], machine="box-1")
    assert json.loads((tmp_path / "bench_x" / "box-1.json").read_text())["rows"][0]["ratio"] == 2
    assert os.listdir(tmp_path / "bench_x") == ["box-1.json"]
    # a GPU names the file
    monkeypatch.delenv(common.MACHINE_ENV, raising=False)
    path = common.write_results("bench_x", rows, gpu="NVIDIA H200")
    assert os.path.basename(path) == "nvidia-h200.json"
    assert common.results_path("bench_x", "box-1", ".png") == str(tmp_path / "bench_x" /
                                                                 "box-1.png")
