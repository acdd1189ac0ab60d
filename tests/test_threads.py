"""threads: the variational pass and transform give the same model bit for bit with 1 or N threads."""
from __future__ import annotations

import numpy as np
import pytest

from streamtopics import TopicModel
from streamtopics.corpora import load_reuters_r8
from streamtopics import parallel
from streamtopics.parallel import available_cores, cgroup_cpu_limit, resolve_threads, split_weighted


def _docs():
    return [d.text for d in load_reuters_r8("train", seed=3)[:600]]


@pytest.mark.parametrize("n_threads", [2, 3])
def test_models_identical_for_any_thread_count(n_threads):
    docs = _docs()
    models = [TopicModel(n_topics=24, seed=1, corpus_size=5000, threads=t) for t in (1, n_threads)]
    for lo in range(0, 480, 96):
        for m in models:
            m.partial_fit(docs[lo:lo + 96])
    a, b = (m.state for m in models)
    assert a.n_updates == b.n_updates == 5
    assert np.array_equal(a.mu[: a.n_words], b.mu[: b.n_words])
    assert np.array_equal(a.mu_totals, b.mu_totals) and a.scale == b.scale
    assert models[0].last_stats["restarts_tried"] == models[1].last_stats["restarts_tried"] > 0
    held = docs[480:]
    ta, tb = models[0].transform(held), models[1].transform(held)
    assert np.array_equal(ta, tb)
    assert ta.shape == (120, 24) and np.allclose(ta.sum(axis=1), 1.0)


def test_transform_pipeline_same_result_for_any_thread_count(monkeypatch):
    """transform prepares the next chunk while the kernels run on this one (threads > 1): the
    result equals one thread's."""
    from streamtopics import batch_ops

    docs = _docs()
    m = TopicModel(n_topics=12, seed=4, threads=1)
    for lo in range(0, 400, 100):
        m.partial_fit(docs[lo:lo + 100])
    held = docs[400:]
    monkeypatch.setattr(batch_ops, "TRANSFORM_CHUNK", 37)  # many chunks: the pipeline runs
    one = m.transform(held)
    m.set_threads(2)
    two = m.transform(held)
    assert np.array_equal(one, two) and one.shape == (200, 12)
    assert m.transform([]).shape == (0, 12)
    with pytest.raises(TypeError, match="document 40:"):
        m.transform(held[:40] + [3])  # a bad document in a later chunk raises, named by its index


def test_memoized_and_dense_identical_across_threads():
    docs = _docs()[:300]
    out = []
    for t in (1, 2):
        m = TopicModel(n_topics=10, sparsity=10, update="memoized", seed=2, threads=t)
        for lap in range(2):
            for lo in range(0, 300, 100):
                m.partial_fit(docs[lo:lo + 100], batch_key=lo)
        out.append((m.state.mu[: m.state.n_words].copy(), m.elbo()))
    assert np.array_equal(out[0][0], out[1][0]) and out[0][1] == out[1][1]


def test_threads_option_validated_and_defaults_to_affinity():
    assert resolve_threads(None) == available_cores() == resolve_threads(0)
    assert TopicModel(n_topics=5).local_step.runner.threads == available_cores()
    assert TopicModel(n_topics=5, threads=3).get_params()["threads"] == 3
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="threads"):
            TopicModel(n_topics=5, threads=bad)


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit_is_the_tightest_on_the_path(tmp_path):
    proc = tmp_path / "proc_cgroup"
    _write(proc, "0::/system.slice/streamtopics@a.service\n")
    root = tmp_path / "cg"
    _write(root / "system.slice" / "streamtopics@a.service" / "cpu.max", "max 100000\n")  # the unit: no limit
    assert cgroup_cpu_limit(str(root), str(proc)) is None
    _write(root / "system.slice" / "cpu.max", "250000 100000\n")  # the slice above it: 2.5 cores
    assert cgroup_cpu_limit(str(root), str(proc)) == 2.5
    _write(root / "system.slice" / "streamtopics@a.service" / "cpu.max", "50000 100000\n")
    assert cgroup_cpu_limit(str(root), str(proc)) == 0.5


def test_cgroup_v1_and_container_namespace(tmp_path):
    proc = tmp_path / "proc_cgroup"
    root = tmp_path / "cg"
    _write(proc, "4:memory:/x\n2:cpu,cpuacct:/\n")  # inside a container: its cgroup is the root
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(str(root), str(proc)) is None
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "150000\n")
    assert cgroup_cpu_limit(str(root), str(proc)) == 1.5
    assert cgroup_cpu_limit(str(root), str(tmp_path / "missing")) is None  # not Linux / no /proc


def test_available_cores_respects_the_cgroup_limit(monkeypatch):
    free = available_cores()
    monkeypatch.setattr(parallel, "cgroup_cpu_limit", lambda: 0.5)
    assert available_cores() == 1 and resolve_threads(None) == 1
    monkeypatch.setattr(parallel, "cgroup_cpu_limit", lambda: 1000.0)
    assert available_cores() == free  # a limit above the affinity does not add cores


def test_split_weighted_covers_everything_in_order():
    ptr = np.array([0, 5, 5, 40, 41, 60, 100])
    for parts in (1, 2, 3, 8):
        r = split_weighted(ptr, parts)
        assert r[0][0] == 0 and r[-1][1] == 6 and all(a[1] == b[0] for a, b in zip(r, r[1:]))
        assert len(r) <= parts


def _split_by_numpy(weights_cum, parts):
    """The reference: cuts where the cumulative weight reaches i / parts of the total (searchsorted)."""
    n = weights_cum.shape[0] - 1
    if n <= 0:
        return []
    parts = max(1, min(parts, n))
    total = weights_cum[-1] - weights_cum[0]
    if parts == 1 or total <= 0:
        return [(0, n)]
    cuts = np.searchsorted(weights_cum, weights_cum[0] + total * np.arange(1, parts) / parts, side="left")
    bounds = np.unique(np.concatenate(([0], np.clip(cuts, 0, n), [n])))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def test_split_bounds_equals_the_ranges_of_split_weighted():
    from streamtopics.parallel import split_bounds

    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(0, 60))
        w = np.arange(n + 1) if rng.random() < 0.3 else np.concatenate([[2], rng.integers(0, 6, size=n)]).cumsum()
        for parts in (1, 2, 3, 8, 32, 100):
            r = _split_by_numpy(w, parts)
            want = [lo for lo, _ in r] + [r[-1][1]] if r else [0]
            assert split_bounds(w, parts).tolist() == want
            assert split_weighted(w, parts) == r


def test_claimed_ranges_are_each_taken_exactly_once_beside_a_python_thread():
    """``run_claimed``: threads take ranges with an atomic counter inside the kernel; every range
    is run once and only once, also while another thread keeps the GIL busy with Python."""
    import threading

    from numba import njit

    from streamtopics.parallel import ThreadRunner, claim_range, split_bounds

    @njit(nogil=True)
    def mark(counter, bounds, hits, work):
        taken = 0
        while True:
            lo, hi = claim_range(counter, bounds)
            if lo < 0:
                break
            for j in range(lo, hi):
                hits[j] += 1
                x = 0.0
                for t in range(200):  # some work per item, so the threads overlap
                    x += t * 0.5
                work[j] = x
            taken += 1
        return taken

    stop = threading.Event()

    def python_bursts():
        while not stop.is_set():
            sum(i * i for i in range(2000))

    busy = threading.Thread(target=python_bursts)
    busy.start()
    try:
        for threads in (1, 2, 3):
            hits, work = np.zeros(50_000, dtype=np.int64), np.zeros(50_000)
            bounds = split_bounds(np.arange(hits.size + 1), 16 * threads)
            taken = ThreadRunner(threads).run_claimed(lambda ctr: mark(ctr, bounds, hits, work))
            assert len(taken) == threads and sum(taken) == bounds.size - 1
            assert hits.min() == hits.max() == 1 and np.all(work == 9950.0)
    finally:
        stop.set()
        busy.join()


def test_a_kernel_recompiled_beside_a_warm_cache_can_claim_ranges(tmp_path):
    """A cached kernel that claims ranges (``claim_range``) and is recompiled (its module changed, as after
    an upgrade or an edit) while the rest of the numba cache is warm still compiles. When the
    generator itself was cached, numba loaded it without registering its implementation, and the
    recompile failed with a KeyError (seen when births.py changed and parallel.py did not)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = ("import numpy as np\nfrom numba import njit\nfrom streamtopics.parallel import claim_range\n\n"
           "@njit(cache=True, nogil=True)\ndef covered(counter, bounds):\n    n = 0\n"
           "    while True:\n        lo, hi = claim_range(counter, bounds)\n        if lo < 0:\n            break\n"
           "        n += hi - lo\n    return n\n\n"
           "print(covered(np.zeros(1, np.int64), np.array([0, 3, 7, 12], np.int64)))\n")
    mod = tmp_path / "user_kernel.py"
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), root, os.environ.get("PYTHONPATH", "")]))
    for edit in ("", "\n# the module changed: this kernel recompiles, claim_range's cache is warm\n"):
        mod.write_text(src + edit)
        run = subprocess.run([sys.executable, str(mod)], env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == "12"


@pytest.mark.parametrize("vocab", [{}, {"vocab_cap": 900, "vocab_policy": "evict"}])
def test_rows_read_ahead_leave_the_model_as_one_thread_makes_it(vocab):
    """With threads, a helper computes psi(lambda) of the last batch's words while the next batch
    is built (ModelState.read_ahead) and the local step takes them: the model is the same bit for
    bit, also when evicted words' rows are reset in between (the read-ahead is dropped)."""
    docs = _docs()
    models = [TopicModel(n_topics=16, seed=3, threads=t, **vocab) for t in (1, 2)]
    for lo in range(0, 600, 100):
        for m in models:
            m.partial_fit(docs[lo:lo + 100])
    a, b = (m.state for m in models)
    assert b.rows_read_ahead > 0 and a.rows_read_ahead == 0
    assert np.array_equal(a.mu[: a.n_words], b.mu[: b.n_words]) and np.array_equal(a.mu_totals, b.mu_totals)
    if vocab:
        assert models[1].vocab.n_evicted > 0
    assert b._ahead is None  # nothing left running once partial_fit returns


def test_a_read_ahead_is_dropped_when_its_rows_change():
    from streamtopics.parallel import ThreadRunner

    m = TopicModel(n_topics=8, seed=0, threads=1)
    m.partial_fit(_docs()[:200])
    st, runner = m.state, ThreadRunner(2)
    rows = np.arange(min(st.n_words, 300))
    want = st.expected_log_phi(rows)
    st.read_ahead(rows, runner)
    assert np.array_equal(st.expected_log_phi(rows, runner), want)
    st.read_ahead(rows, runner)
    st.reset_words(rows[:5])  # evicted words' rows written: their read-ahead values are stale
    taken = st.rows_read_ahead
    assert np.array_equal(st.expected_log_phi(rows, runner), st.expected_log_phi(rows))
    assert st.rows_read_ahead - taken <= rows.size - 5
    st.read_ahead(rows, runner)
    st.add_summary(m.local_steps(m.prepare(_docs()[200:260], grow=False))[0].summary, 0.5)  # any update: all stale
    assert st._ahead is None
    runner.close()


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_supervised_models_identical_for_any_thread_count(loss):
    """Labelled batches run the label-free step, then the supervised one (the read-ahead serves the
    first); topics and classifier are the same bit for bit with 1 and 2 threads."""
    docs = load_reuters_r8("train", seed=5)[:500]
    texts, labels = [d.text for d in docs], [d.label for d in docs]
    models = [TopicModel(n_topics=12, seed=2, supervision=loss, threads=t) for t in (1, 2)]
    for lo in range(0, 500, 100):
        for m in models:
            m.partial_fit(texts[lo:lo + 100], labels=labels[lo:lo + 100])
    a, b = (m.state for m in models)
    assert np.array_equal(a.mu[: a.n_words], b.mu[: b.n_words]) and a.scale == b.scale
    assert b.rows_read_ahead > 0
    assert np.array_equal(models[0].head.eta_mean, models[1].head.eta_mean)
    assert models[0].predict(texts[:50]) == models[1].predict(texts[:50])


def test_a_failed_read_ahead_costs_the_batch_nothing(caplog, monkeypatch):
    from streamtopics import state as state_module
    from streamtopics.parallel import ThreadRunner

    m = TopicModel(n_topics=8, seed=0, threads=1)
    m.partial_fit(_docs()[:200])
    st, runner = m.state, ThreadRunner(2)
    rows = np.arange(min(st.n_words, 300))
    want = st.expected_log_phi(rows)

    def broken(*args):
        raise MemoryError("no room for the read-ahead")

    monkeypatch.setattr(state_module, "psi_lam_ahead", broken)
    st.read_ahead(rows, runner)
    with caplog.at_level("WARNING"):
        got = st.expected_log_phi(rows, runner)
    assert np.array_equal(got, want)
    assert "read-ahead of word rows failed" in caplog.text
    runner.close()


def test_work_aside_stops_when_asked_even_in_a_loop_that_stores_nothing():
    """``flag_read`` is an atomic load: a kernel polling the stop flag in a loop the compiler could
    otherwise hoist the read out of (no stores) still sees it. A plain ``stop[0]`` read hangs here."""
    import threading
    import time

    from numba import njit

    from streamtopics.parallel import ThreadRunner, flag_read

    @njit(nogil=True)
    def spin(stop):
        n = 0
        while not flag_read(stop) and n < 20_000_000_000:  # bounded: a regression fails, not hangs
            n += 1
        return n

    spin(np.ones(1, dtype=np.int64))  # compiled before the clock
    runner = ThreadRunner(2)
    aside = runner.aside(spin)
    time.sleep(0.05)
    out = []
    waiter = threading.Thread(target=lambda: out.append(aside.result()), daemon=True)
    t0 = time.perf_counter()
    waiter.start()
    waiter.join(30)
    assert out and 0 < out[0] < 20_000_000_000 and time.perf_counter() - t0 < 1.0
    runner.close()


@pytest.mark.parametrize("kernel", ["topic_rows", "scatter"])
def test_threaded_kernels_release_the_arrays_they_are_given(kernel):
    """A kernel that claims its ranges keeps no reference to its arrays once it returns. When the
    ranges came from a numba generator (``for lo, hi in claimed(counter, bounds)``), each call kept
    one to ``counter`` and ``bounds`` for good (numba #1807, #5350): ~35 small arrays leaked per
    batch, and the daemon's RSS grew ~16 bytes per document for as long as it ran."""
    import sys
    import weakref

    from streamtopics.births import _topic_rows
    from streamtopics.state import scatter_claimed

    bounds = np.array([0, 2, 5], dtype=np.int64)
    mu = np.zeros((8, 3))
    out = np.zeros((5, 3))
    before = sys.getrefcount(bounds)
    counters = []
    for _ in range(5):
        counter = np.zeros(1, dtype=np.int64)
        if kernel == "topic_rows":
            _topic_rows(counter, bounds, np.arange(5, dtype=np.int64), mu + 1.0, 2.0, 0.5, out)
        else:  # rows 0..4 get +1 in topic 1
            scatter_claimed(counter, bounds, mu, np.arange(5, dtype=np.int64), np.arange(6, dtype=np.int64),
                            np.ones(5, dtype=np.int32), np.ones(5), 1.0)
        counters.append(weakref.ref(counter))
    del counter
    assert sys.getrefcount(bounds) == before
    assert all(c() is None for c in counters)
    if kernel == "topic_rows":
        assert np.all(out == 2.5)
    else:
        assert np.all(mu[:5, 1] == 5.0) and mu.sum() == 25.0
