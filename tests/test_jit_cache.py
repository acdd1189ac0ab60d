"""The kernel cache is keyed by the whole package's source (streamtopics/jit_cache.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from streamtopics import jit_cache

ROOT = Path(__file__).resolve().parents[1] / "streamtopics"


def test_a_change_to_a_callee_reaches_its_cached_callers(tmp_path):
    """``state._psi_vec`` (cached) inlines ``digamma`` from ``_numeric.py``. numba alone keys the
    caller's cache by ``state.py``, so after an edit of ``_numeric.py`` only it kept running the
    old digamma. The cache directory now follows the package's source, so the edit is seen."""
    pkg = tmp_path / "pkg"  # a copy under another name: an editable install would shadow "streamtopics"
    shutil.copytree(ROOT, pkg / "st_copy", ignore=shutil.ignore_patterns("__pycache__", "*.nb[ic]"))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(pkg))
    script = ("import numpy as np, st_copy.state as s\n"
              "assert s.__file__.startswith(%r), s.__file__\n"
              "print(s._psi_vec(np.array([3.0]))[0])\n" % str(pkg))

    def psi3() -> float:
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        return float(run.stdout.strip())

    assert abs(psi3() - 0.9227843350984671) < 1e-12  # compiled and cached
    numeric = pkg / "st_copy" / "_numeric.py"
    text = numeric.read_text()
    marker = "    if x < 2.0:\n        r = 0.0\n"
    assert text.count(marker) == 1
    numeric.write_text(text.replace(marker, "    if x == 3.0:\n        return 42.0\n" + marker))
    assert psi3() == 42.0  # state.py did not change; its cached kernel must not keep the old digamma
    dirs = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(dirs) == 2 and all(d.startswith("streamtopics-") for d in dirs), dirs


def test_the_directory_names_the_source_and_respects_numba_cache_dir(tmp_path):
    digest = jit_cache.source_digest()
    assert len(digest) == 16 and digest == jit_cache.source_digest()
    got = jit_cache.cache_dir(environ={"NUMBA_CACHE_DIR": str(tmp_path)})
    assert got == str(tmp_path / f"streamtopics-{digest}") and Path(got).is_dir()
    fake = tmp_path / "src"
    fake.mkdir()
    (fake / "a.py").write_text("x = 1\n")
    before = jit_cache.source_digest(fake)
    (fake / "a.py").write_text("x = 2\n")
    assert jit_cache.source_digest(fake) != before


def test_other_versions_are_swept_once_stale(tmp_path):
    old = tmp_path / "streamtopics-0000000000000000"
    recent = tmp_path / "streamtopics-1111111111111111"
    foreign = tmp_path / "someone-else"
    for p in (old, recent, foreign):
        p.mkdir()
        (p / "k.nbi").write_bytes(b"x")
    stale = time.time() - jit_cache.STALE_AFTER_S - 60
    os.utime(old, (stale, stale))
    os.utime(foreign, (stale, stale))
    got = Path(jit_cache.cache_dir(environ={"NUMBA_CACHE_DIR": str(tmp_path)}))
    assert got.is_dir() and not old.exists()
    assert recent.exists() and foreign.exists()  # in use by another version lately / not ours


def test_the_package_kernels_cache_in_the_active_directory():
    from streamtopics._numeric import digamma

    assert abs(digamma(3.0) - 0.9227843350984671) < 1e-12
    active = jit_cache.active_dir()
    assert active is not None and Path(active).name.endswith(jit_cache.source_digest())
    assert any(Path(active).rglob("_numeric.digamma-*.nbi"))  # numba wrote its index there


def test_a_kernel_whose_cache_cannot_be_written_still_runs(tmp_path):
    """Bad-input audit: with the disk full (here RLIMIT_FSIZE, SIGXFSZ ignored as Python does) and
    a cold cache, numba's write raised OSError into the first call, and the daemon dead-lettered
    every document of its batches as model_error. The call now returns, with one WARNING."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    script = ("import logging, resource, numpy as np\n"
              "logging.basicConfig(level=logging.WARNING)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))\n"
              "from streamtopics._numeric import digamma\n"
              "from streamtopics.jit_cache import njit\n"
              "@njit(cache=True, nogil=True)\n"
              "def f(x):\n"
              "    return digamma(x)\n"
              "@njit(cache=True, nogil=True)\n"
              "def g(x):\n"
              "    return f(x[0]) + x.sum()\n"
              "print(g(np.array([3.0])))\n")
    (tmp_path / "kern.py").write_text(script)  # numba caches functions of files only
    run = subprocess.run([sys.executable, str(tmp_path / "kern.py")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert abs(float(run.stdout.strip()) - 3.9227843350984671) < 1e-12
    assert run.stderr.count("cannot write compiled kernels to the numba cache") == 1, run.stderr[-2000:]
