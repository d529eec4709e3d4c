"""Writing a file so that a reader never sees half of it: ``atomic_write``.

The data goes to a temporary file in the destination's folder, which is then renamed over the
destination (``os.replace``, atomic on POSIX and Windows). A crash, a full disk or a concurrent
writer leaves either the old file or the new one, never a mix. Used by everything that writes a
file another process may read while it is written: executables and kernel libraries, tuning
records, the cost model, benchmark results, the CLI's outputs. Board-side safe (standard library
only).
"""
from __future__ import annotations

import os
import tempfile

__all__ = ["atomic_write"]


def atomic_write(path: str | os.PathLike, data: bytes | str, *, mode: int = 0o644,
                 durable: bool = False) -> str:
    """Write ``data`` (bytes, or text written as UTF-8) to ``path`` atomically; return the path.

    Parameters
    ----------
    path : str or PathLike
        The destination; its folder is created if missing.
    data : bytes or str
        The whole content.
    mode : int
        The file's permission bits (a temporary file is created private, 0o600).
    durable : bool
        ``fsync`` the data before the rename, so that the new content survives a power loss
        (records, results); off for files that can be rebuilt.

    Examples
    --------
    >>> import tempfile, os
    >>> p = atomic_write(os.path.join(tempfile.mkdtemp(), "a.json"), '{"x": 1}')
    >>> open(p).read()
    '{"x": 1}'
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
