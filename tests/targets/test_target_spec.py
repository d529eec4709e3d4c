"""Target: string, dict and tag forms; limits; errors."""
import pytest

from tilecraft.targets.target import ELF_MACHINE, TAGS, Target, TargetError, host_triple


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


# ------------------------------------------------------------------------------------------
# str(Target(s)) round-trips for every kind, tag and option combination

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.", min_size=1, max_size=8)
_OPTIONS = {
    "mcpu": st.sampled_from(["cortex-a72", "haswell", "sifive-u74", "generic"]),
    "mabi": st.sampled_from(["lp64d", "lp64", "aapcs"]),
    "mattr": st.lists(st.sampled_from(["+neon", "+avx2", "-sse4.2", "+fp16", "+m", "+v"]),
                      min_size=1, max_size=3, unique=True).map(",".join),
    "device": st.one_of(st.sampled_from(["cpu", "gpu", "pocl", "mali"]),
                        _WORD.map(lambda w: w + " gpu")),       # a value with a space
    "keys": st.lists(_WORD, min_size=1, max_size=3).map(",".join),
    "num-cores": st.integers(1, 128).map(str),
    "opt-level": st.integers(0, 3).map(str),
    "max-threads-per-block": st.sampled_from(["64", "256", "1024"]),
    "max-shared-memory-per-block": st.sampled_from(["16384", "49152"]),
    "vector-width": st.sampled_from(["64", "128", "256", "512"]),
    "max-storage-buffers": st.integers(1, 32).map(str),
    "supports-float16": st.sampled_from(["0", "1", "true", "false"]),
}
_TRIPLES = ["aarch64-linux-gnu", "x86_64-linux-gnu", "riscv64-linux-gnu",
            "armv7a-linux-gnueabihf"]


@st.composite
def _target_strings(draw):
    import shlex
    head = draw(st.sampled_from(sorted(KINDS_AND_TAGS)))
    names = draw(st.lists(st.sampled_from(sorted(_OPTIONS)), unique=True, max_size=6))
    words = [head]
    kind = TAGS[head]["kind"] if head in TAGS else head
    if kind == "llvm" and draw(st.booleans()):
        words.append(f"-mtriple={draw(st.sampled_from(_TRIPLES))}")
    words += [shlex.quote(f"-{n}={draw(_OPTIONS[n])}") for n in names]
    return " ".join(words)


KINDS_AND_TAGS = {"llvm", "opencl", "webgpu", *TAGS}


def _content(t: Target) -> dict:
    return {k: v for k, v in t.export().items() if k not in ("tag", "description")}


@settings(max_examples=300, deadline=None)
@given(_target_strings())
def test_str_round_trips_every_option(text):
    t = Target(text)
    back = Target(str(t))
    assert back == t and hash(back) == hash(t), (text, str(t))
    assert _content(back) == _content(t), (text, str(t))
    assert str(back) == str(t)
    assert Target(t.export()) == t and repr(t) == f"Target({str(t)!r})"


@pytest.mark.parametrize("tag", sorted(TAGS))
def test_every_tag_round_trips(tag):
    t = Target(tag)
    assert Target(str(t)) == t and _content(Target(str(t))) == _content(t)
    assert Target(str(t)).limits == t.limits


@pytest.mark.parametrize("a, b", [
    ("opencl -device=cpu", "opencl"),
    ("opencl -device=cpu", "opencl -device=gpu"),
    ("webgpu -supports-float16=1", "webgpu"),
    ("llvm -supports-float16=0", "llvm"),
    ("llvm -keys=arm_cpu", "llvm"),
])
def test_targets_that_differ_compare_unequal(a, b):
    assert Target(a) != Target(b)
    assert str(Target(a)) != str(Target(b))


def test_device_survives_the_string_form():
    t = Target("opencl -device=cpu")
    assert str(t) == "opencl -device=cpu"
    assert Target(str(t)).export()["device"] == "cpu"
    assert Target("opencl -device='Intel UHD 630'").export()["device"] == "Intel UHD 630"
    with pytest.raises(TargetError, match="supports_float16"):
        Target("webgpu -supports-float16=maybe")
