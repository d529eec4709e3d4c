"""targets.fileio.atomic_write: the whole new content or the old file, never half of it."""
import os
import stat

import pytest

from tilecraft.targets.fileio import atomic_write


def test_writes_bytes_and_text_with_the_mode(tmp_path):
    p = tmp_path / "sub" / "a.bin"
    assert atomic_write(p, b"\x00\x01") == str(p)
    assert p.read_bytes() == b"\x00\x01"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o644
    atomic_write(p, "é\n", mode=0o755, durable=True)
    assert p.read_bytes() == "é\n".encode("utf-8")
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o755
    assert os.listdir(p.parent) == ["a.bin"]          # no temporary file left behind


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "records.json"
    atomic_write(p, "old")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space"):
        atomic_write(p, "new content")
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["records.json"]


def test_bad_data_is_refused_before_touching_the_file(tmp_path):
    p = tmp_path / "x"
    atomic_write(p, b"keep")
    with pytest.raises(TypeError):
        atomic_write(p, 123)
    assert p.read_bytes() == b"keep"
    assert os.listdir(tmp_path) == ["x"]
