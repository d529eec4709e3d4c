"""Target: string, dict and tag forms; limits; errors."""
import pytest

from targets.target import ELF_MACHINE, TAGS, Target, TargetError, host_triple


def test_string_form_round_trips():
    t = Target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon,+fp-armv8 -num-cores=4")
    assert (t.kind, t.mtriple, t.mcpu, t.mattr, t.num_cores) == (
        "llvm", "aarch64-linux-gnu", "cortex-a72", ("+neon", "+fp-armv8"), 4)
    assert Target(str(t)) == t
    assert Target(t.export()) == t


def test_dict_form():
    t = Target({"kind": "llvm", "mtriple": "riscv64-linux-gnu", "mattr": ["+m", "+d"], "num_cores": 2})
    assert t.arch == "riscv64" and t.num_cores == 2 and t.mattr == ("+m", "+d")
    assert not t.is_host or host_triple().startswith("riscv64")


@pytest.mark.parametrize("tag", sorted(TAGS))
def test_every_tag_builds(tag):
    t = Target(tag)
    assert t.kind in ("llvm", "opencl", "webgpu")
    if t.kind == "llvm":
        assert t.arch in ELF_MACHINE


def test_tag_values():
    pi = Target("raspberry-pi/4b-aarch64")
    assert (pi.arch, pi.mcpu, pi.num_cores, pi.vector_width) == ("aarch64", "cortex-a72", 4, 128)
    assert pi.tag == "raspberry-pi/4b-aarch64"
    orin = Target("jetson-orin-cpu")
    assert orin.arch == "aarch64" and orin.num_cores == 12
    assert Target("x86-host").is_host == Target("llvm").is_host
    # options after a tag override it
    assert Target("raspberry-pi/4b-aarch64 -num-cores=2").num_cores == 2


def test_host_and_limits():
    t = Target("llvm")
    assert t.is_host and t.mtriple is None
    assert t.triple == host_triple()
    assert t.vector_width in (128, 256, 512)
    w = Target("webgpu")
    assert w.max_threads_per_block == 256
    assert w.max_shared_memory_per_block == 16384
    assert w.limits["max_storage_buffers_per_shader_stage"] == 8
    assert Target("webgpu -max-storage-buffers=16").limits["max_storage_buffers_per_shader_stage"] == 16


@pytest.mark.parametrize("bad, match", [
    ("cuda", "unknown target 'cuda'"),
    ("", "empty"),
    ("llvm -mtriple=sparc-linux-gnu", "sparc"),
    ("llvm -frobnicate=1", "unknown target option -frobnicate"),
    ("llvm -num-cores=abc", "integer"),
    ("llvm -num-cores=0", "positive"),
    ("llvm -mattr=avx2", "must start with"),
    ("llvm mtriple", "-key=value"),
])
def test_bad_targets(bad, match):
    with pytest.raises(TargetError, match=match):
        Target(bad)
    assert issubclass(TargetError, ValueError)


def test_bad_dict():
    with pytest.raises(TargetError, match="kind"):
        Target({"kind": "metal"})
    with pytest.raises(TargetError, match="unknown target field"):
        Target({"kind": "llvm", "colour": "red"})
    with pytest.raises(TargetError):
        Target(42)
