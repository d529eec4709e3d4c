"""A persistent, content-addressed cache of compiled kernels.

``targets.build`` and ``relax.build`` look every kernel up here before compiling it, by a key
that names everything the object code depends on (``cache_key``): the kernel as given to the
compiler (its exact ``script()`` text, which is structural: ``parse(f.script())`` is
structurally equal to ``f``), how it is scheduled when the compiler schedules it, the target
and the machine code settings, the LLVM and llvmlite versions and a fingerprint of tilecraft's
own source code (``code_fingerprint``: a change to any lowering or code generation module is a
new key, so a stale entry is never used). The value is what the compiler stored (for LLVM: the
object code and the kernel's metadata).

Storage: one file per entry, ``<directory>/<key[:2]>/<key>``, each holding a magic number, the
SHA-256 of its payload and the payload. Entries are written to a temporary file and renamed into
place, so concurrent builds (threads or processes) never see half an entry; a reader that finds a
short or corrupt file (bad magic or checksum) deletes it and reports a miss, and the kernel is
rebuilt. A hit refreshes the entry's modification time; ``trim`` removes the least recently used
entries until the cache fits its size bound.

Where it lives and how to turn it off:

* ``$TILECRAFT_CACHE_DIR``: the directory (default ``$XDG_CACHE_HOME/tilecraft/kernels``, else
  ``~/.cache/tilecraft/kernels``);
* ``TILECRAFT_CACHE=0`` (or ``off`` / ``false`` / ``no``): no cache at all;
* ``$TILECRAFT_CACHE_MAX_MB``: the size bound in MiB (default 1024);
* per build: ``relax.build(..., cache=False)`` / ``targets.build(..., cache=False)``, or a
  directory or ``KernelCache`` of its own.

Examples
--------
>>> import tempfile
>>> cache = KernelCache(tempfile.mkdtemp())
>>> key = cache_key("example", 1)
>>> cache.get(key) is None
True
>>> cache.put(key, b"object code")
>>> cache.get(key)
b'object code'
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass

import tilecraft

__all__ = ["KernelCache", "CacheInfo", "cache_key", "code_fingerprint", "default_cache",
           "default_directory", "resolve", "use", "ENV_DIR", "ENV_SWITCH", "ENV_MAX_MB"]

ENV_DIR = "TILECRAFT_CACHE_DIR"
ENV_SWITCH = "TILECRAFT_CACHE"
ENV_MAX_MB = "TILECRAFT_CACHE_MAX_MB"
DEFAULT_MAX_BYTES = 1024 << 20

_MAGIC = b"TCKC\x01"
_DIGEST = 32                     # bytes of SHA-256
_HEADER = len(_MAGIC) + _DIGEST
_OFF = ("0", "off", "false", "no", "")


@dataclass
class CacheInfo:
    """What ``KernelCache.info()`` reports."""

    directory: str
    entries: int
    bytes: int
    max_bytes: int


class KernelCache:
    """Compiled kernels on disk, by content key.

    Parameters
    ----------
    directory : str
        Where the entries live (created on first write).
    max_bytes : int
        ``trim()`` removes least recently used entries beyond this size.

    Examples
    --------
    >>> cache = KernelCache("/tmp/my-kernels", max_bytes=64 << 20)   # doctest: +SKIP
    >>> exe = relax.build(mod, "llvm", cache=cache)                   # doctest: +SKIP
    >>> cache.info().entries                                          # doctest: +SKIP
    29
    """

    def __init__(self, directory: "str | os.PathLike", max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes <= 0:
            raise ValueError(f"KernelCache: max_bytes must be positive, got {max_bytes}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_bytes = int(max_bytes)
        # what this object saw (all processes share the files, not these counts)
        self.hits = self.misses = self.writes = self.corrupt = 0
        self._lock = threading.Lock()

    def __repr__(self):
        return f"KernelCache({self.directory!r}, max_bytes={self.max_bytes})"

    def _path(self, key: str) -> str:
        if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"KernelCache: a key is a lowercase hex digest, got {key!r}")
        return os.path.join(self.directory, key[:2], key)

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (absent, unreadable or corrupt)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            self._count("misses")
            return None
        payload = data[_HEADER:]
        if data[:len(_MAGIC)] != _MAGIC or \
                hashlib.sha256(payload).digest() != data[len(_MAGIC):_HEADER]:
            # a truncated or damaged file (a crash after the rename, a disk error): drop it
            # and let the caller rebuild the kernel
            self._count("corrupt")
            self._count("misses")
            _unlink(path)
            return None
        try:
            os.utime(path)      # least-recently-used order for trim()
        except OSError:
            pass
        self._count("hits")
        return payload

    def put(self, key: str, payload: bytes) -> None:
        """Store ``payload`` under ``key`` (atomically; a concurrent writer of the same key
        writes the same bytes). Errors writing (a read-only or full disk) are ignored: the
        cache is an optimization."""
        path = self._path(key)
        data = _MAGIC + hashlib.sha256(payload).digest() + bytes(payload)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
        except OSError:
            return
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            self._count("writes")
        except OSError:
            _unlink(tmp)

    def _entries(self) -> list[tuple[float, int, str]]:
        """(mtime, size, path) of every entry and leftover temporary file."""
        out = []
        try:
            shards = list(os.scandir(self.directory))
        except OSError:
            return out
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                continue
            try:
                files = list(os.scandir(shard.path))
            except OSError:
                continue
            for f in files:
                try:
                    st = f.stat(follow_symlinks=False)
                except OSError:
                    continue     # removed by a concurrent trim
                out.append((st.st_mtime, st.st_size, f.path))
        return out

    def info(self) -> CacheInfo:
        """How many entries and bytes the cache holds.

        Examples
        --------
        >>> default_cache().info()          # doctest: +SKIP
        CacheInfo(directory='/home/me/.cache/tilecraft/kernels', entries=312, bytes=20500112, ...)
        """
        entries = [e for e in self._entries() if not os.path.basename(e[2]).startswith(".tmp-")]
        return CacheInfo(self.directory, len(entries), sum(e[1] for e in entries),
                         self.max_bytes)

    def trim(self, max_bytes: int | None = None) -> int:
        """Remove least recently used entries until the cache holds at most ``max_bytes``
        (default: its bound); also removes temporary files a killed writer left behind (older
        than an hour). Returns the bytes removed."""
        limit = self.max_bytes if max_bytes is None else int(max_bytes)
        entries = self._entries()
        removed = 0
        live = []
        stale = time.time() - 3600
        for mtime, size, path in entries:
            if os.path.basename(path).startswith(".tmp-"):
                if mtime < stale and _unlink(path):
                    removed += size
            else:
                live.append((mtime, size, path))
        total = sum(e[1] for e in live)
        for mtime, size, path in sorted(live):
            if total <= limit:
                break
            if _unlink(path):
                removed += size
            total -= size
        return removed

    def clear(self) -> int:
        """Remove every entry; returns the bytes removed."""
        return self.trim(0)

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# keys


def cache_key(*parts) -> str:
    """The SHA-256 (hex) of ``parts`` (JSON data: strings, numbers, lists, dicts).

    Examples
    --------
    >>> cache_key("kernel", "main", 3) == cache_key("kernel", "main", 3)
    True
    """
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_PACKAGES = ("tensorir", "targets", "rpc", "metaschedule", "relax", "tilecraft")
_FINGERPRINT: str | None = None


def code_fingerprint() -> str:
    """A hash of tilecraft's version and the source of its packages (computed once per
    process): any change to how kernels are scheduled, lowered or compiled makes new keys."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for package in _PACKAGES:
            top = os.path.join(root, package)
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(filenames):
                    if name.endswith(".py"):
                        path = os.path.join(dirpath, name)
                        h.update(os.path.relpath(path, root).encode("utf-8") + b"\0")
                        try:
                            with open(path, "rb") as f:
                                h.update(hashlib.sha256(f.read()).digest())
                        except OSError:
                            h.update(b"unreadable")
        h.update(str(tilecraft.__version__).encode("utf-8"))
        _FINGERPRINT = h.hexdigest()
    return _FINGERPRINT


# ---------------------------------------------------------------------------------------------
# the cache a build uses


def default_directory() -> str:
    """``$TILECRAFT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilecraft/kernels``, else
    ``~/.cache/tilecraft/kernels``."""
    directory = os.environ.get(ENV_DIR)
    if directory:
        return os.path.abspath(os.path.expanduser(directory))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tilecraft", "kernels")


def _max_bytes_from_env() -> int:
    text = os.environ.get(ENV_MAX_MB)
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        mb = float(text)
    except ValueError:
        raise ValueError(f"{ENV_MAX_MB}={text!r} is not a number of MiB") from None
    if mb <= 0:
        raise ValueError(f"{ENV_MAX_MB}={text!r} must be positive (set {ENV_SWITCH}=0 to turn "
                         f"the cache off)")
    return int(mb * (1 << 20))


_DEFAULTS: dict[tuple, KernelCache] = {}
_DEFAULTS_LOCK = threading.Lock()


def default_cache() -> KernelCache | None:
    """The cache the environment asks for (see the module docstring), or None when
    ``TILECRAFT_CACHE`` turns it off."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in _OFF:
        return None
    key = (default_directory(), _max_bytes_from_env())
    with _DEFAULTS_LOCK:
        cache = _DEFAULTS.get(key)
        if cache is None:
            cache = _DEFAULTS[key] = KernelCache(*key)
    return cache


_OVERRIDE: contextvars.ContextVar = contextvars.ContextVar("tilecraft_kernel_cache",
                                                           default=None)


def resolve(cache=None) -> KernelCache | None:
    """The cache a build with argument ``cache`` uses: None -> the one ``use()`` set, else the
    default; False -> none; True -> the default; a path -> a ``KernelCache`` there; a
    ``KernelCache`` -> itself."""
    if cache is None:
        override = _OVERRIDE.get()
        return default_cache() if override is None else override[0]
    if cache is True:
        return default_cache()
    if cache is False:
        return None
    if isinstance(cache, KernelCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return KernelCache(cache, _max_bytes_from_env())
    raise TypeError(f"cache must be None, True, False, a directory or a KernelCache, got "
                    f"{type(cache).__name__}")


@contextlib.contextmanager
def use(cache):
    """Within the block, builds that do not choose a cache (``cache=None``) use ``cache``
    (anything ``resolve`` takes). ``relax.build`` wraps its graph passes in it, so that kernels
    ``FoldConstant`` compiles follow the build's choice.

    Examples
    --------
    >>> with use(False):            # doctest: +SKIP
    ...     targets.build(func)     # not cached
    """
    token = _OVERRIDE.set((resolve(cache),))
    try:
        yield
    finally:
        _OVERRIDE.reset(token)
