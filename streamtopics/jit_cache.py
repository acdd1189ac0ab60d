"""Where numba keeps the package's compiled kernels: one directory per version of its source.

numba keys a cached kernel by the source of its own file only. A kernel inlines the njit
functions it calls from other modules (``digamma`` from ``_numeric.py`` into ``lsparse.py``,
``claim_range`` from ``parallel.py`` into every threaded kernel), so when only the callee's module
changes - a ``git pull``, an edit, a partial reinstall - numba still finds the caller's cache
valid and runs the old inlined code, silently. (It happened here: a digamma change was first
timed partly on the old digamma.)

``njit`` below is numba's, except that a cached function is given a cache directory named by
a digest of every ``.py`` file of the package: any change to the package starts from fresh
kernels, and kernels of one version are never mixed with another's. The directory is

* ``$NUMBA_CACHE_DIR/streamtopics-<digest>`` when the user set ``NUMBA_CACHE_DIR``;
* else ``<package>/__pycache__/numba-<digest>`` when the package directory is writable
  (a checkout, a virtualenv), next to where numba would have put them;
* else ``$XDG_CACHE_HOME/streamtopics/numba-<digest>`` (default ``~/.cache``).

Directories of other digests that have not been used for ``STALE_AFTER_S`` are removed when a
new one is created, so edits do not pile up copies (~30 MB each). Only the package's own
dispatchers are affected: numba's global configuration is set for the moment of decoration
and restored (``numba.config.CACHE_DIR`` is read when a dispatcher is created).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import numba
from numba.core import config as numba_config

PACKAGE_ROOT = Path(__file__).resolve().parent
STALE_AFTER_S = 3600.0   # other versions' kernels unused this long are removed
_cache_dir: str | None = None
_lock = threading.Lock()


def source_digest(root: Path = PACKAGE_ROOT) -> str:
    """sha256 over the relative path and bytes of every ``.py`` file under ``root`` (16 hex digits)."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def _sweep(parent: Path, prefix: str, keep: Path) -> None:
    """Remove other versions' cache directories under ``parent`` unused for ``STALE_AFTER_S``."""
    now = time.time()
    try:
        siblings = [p for p in parent.iterdir() if p.is_dir() and p.name.startswith(prefix) and p != keep]
    except OSError:
        return
    for p in siblings:
        try:
            if now - p.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def cache_dir(root: Path = PACKAGE_ROOT, environ=os.environ) -> str:
    """The kernel cache directory of this version of the package (created; see the module doc)."""
    digest = source_digest(root)
    user = environ.get("NUMBA_CACHE_DIR")
    if user:
        parent, prefix = Path(user), "streamtopics-"
    elif _writable(root / "__pycache__"):
        parent, prefix = root / "__pycache__", "numba-"
    else:
        parent = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamtopics"
        prefix = "numba-"
    path = parent / f"{prefix}{digest}"
    if not path.exists():
        if _writable(path):
            _sweep(parent, prefix, path)
    else:
        try:
            os.utime(path)  # in use: not stale for the sweeps of other versions
        except OSError:
            pass
    return str(path)


def njit(*args, **kwargs):
    """``numba.njit`` whose ``cache=True`` caches in ``cache_dir()`` (one directory per source version)."""
    if not kwargs.get("cache"):
        return numba.njit(*args, **kwargs)
    decorator = numba.njit(*args, **kwargs)
    return lambda func: _decorate(decorator, func)


def active_dir() -> str | None:
    """The cache directory this process's kernels use (None before the first cached kernel was defined)."""
    return _cache_dir


def _decorate(decorator, func):
    global _cache_dir
    # numba reads its global CACHE_DIR when a dispatcher creates its cache locator. The lock keeps
    # two threads importing kernel modules at once from restoring it under each other (a dispatcher
    # would then fall back to numba's in-tree cache, the one keyed by its own file only).
    with _lock:
        if _cache_dir is None:
            _cache_dir = cache_dir()
        before = numba_config.CACHE_DIR
        numba_config.CACHE_DIR = _cache_dir
        try:
            return _saving_may_fail(decorator(func))
        finally:
            numba_config.CACHE_DIR = before


def _saving_may_fail(dispatcher):
    """``dispatcher`` whose cache writes may fail without failing the call: the kernel compiled
    in memory runs, a WARNING says so once, and the next process compiles again. numba (0.68)
    lets an OSError of the write through to the caller (on POSIX), and the daemon took a full disk
    at the first batch after an upgrade (a cold cache) for a failure of the documents: every one
    of them dead-lettered as model_error (bad-input audit, 2026-11-29). numba internals
    (``_cache.save_overload``): left as it is where they differ."""
    cache = getattr(dispatcher, "_cache", None)
    save = getattr(cache, "save_overload", None)
    if save is None:
        return dispatcher

    def save_overload(sig, data):
        try:
            save(sig, data)
        except OSError as exc:
            _unsaved(exc)

    cache.save_overload = save_overload
    return dispatcher


_warned_unsaved = False


def _unsaved(exc: OSError) -> None:
    global _warned_unsaved
    if not _warned_unsaved:
        _warned_unsaved = True
        logging.getLogger(__name__).warning(
            "cannot write compiled kernels to the numba cache; they run from memory and the next start "
            "compiles them again", extra={"cache_dir": _cache_dir, "error": repr(exc)})
