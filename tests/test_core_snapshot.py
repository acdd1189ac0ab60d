"""Snapshots: bit-exact round trips, rng continuity, corruption detection, atomic writes."""
from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import crc32c
import msgpack
import numpy as np
import pytest

import streamtopics.snapshot as snapmod
from streamtopics.corpora import load_reuters_r8
from streamtopics.model import TopicModel, load_snapshot
from streamtopics.snapshot import FORMAT_VERSION, SnapshotError, SnapshotWriteError, read_snapshot


def _texts(lo, hi):
    return [d.text for d in load_reuters_r8("train", seed=0)[lo:hi]]


@pytest.fixture(scope="module")
def r8():
    return _texts(0, 240)


def trained(update: str, r8, **kw) -> TopicModel:
    m = TopicModel(n_topics=6, sparsity=3, update=update, seed=3, **kw)
    for i, b in enumerate(range(0, 160, 40)):
        m.partial_fit(r8[b:b + 40], batch_key=f"b{i}" if update == "memoized" else None)
    m.partial_fit(r8[0:40], batch_key="b0" if update == "memoized" else None)  # a memoized revisit
    return m


def assert_models_identical(a: TopicModel, b: TopicModel) -> None:
    assert a.get_params() == b.get_params()
    assert a.state.header() == b.state.header()
    n = a.state.n_words
    for name in ("mu", "mu_totals"):
        x, y = getattr(a.state, name), getattr(b.state, name)
        if name == "mu":
            x, y = x[:n], y[:n]
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes(), name
    assert a.vocabulary == b.vocabulary
    assert a.vocab.counts.tobytes() == b.vocab.counts.tobytes()
    assert a.vocab.state() == b.vocab.state()
    assert a.rng.bit_generator.state == b.rng.bit_generator.state
    assert a.auto_key == b.auto_key
    ca, cb = a.updater.cache_items(), b.updater.cache_items()
    assert [k for k, _ in ca] == [k for k, _ in cb]
    for (_, s), (_, t) in zip(ca, cb):
        for f in ("word_ids", "indptr", "topics", "values", "topic_totals"):
            x, y = getattr(s, f), getattr(t, f)
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f
        assert (s.n_docs, s.n_tokens, s.entropy, s.alloc) == (t.n_docs, t.n_tokens, t.entropy, t.alloc)


@pytest.mark.parametrize("update", ["stochastic", "memoized"])
def test_round_trip_is_bit_exact(tmp_path, r8, update):
    m = trained(update, r8)
    if update == "memoized":
        assert len(m.updater.cache_items()) == 4
    path = tmp_path / "m.stsnap"
    nbytes = m.save(path, offsets={"topic-a": {"0": 17, "3": 5}}, extra={"note": "x"})
    assert nbytes == path.stat().st_size
    m2 = load_snapshot(path)
    assert_models_identical(m, m2)
    assert m2.snapshot_info["offsets"] == {"topic-a": {"0": 17, "3": 5}}
    assert m2.snapshot_info["extra"] == {"note": "x"}
    assert m2.snapshot_info["path"] == str(path)
    assert m2.version == m.version == 5
    # Identical predictions and identical topics.
    test = _texts(300, 360)
    assert m.transform(test).tobytes() == m2.transform(test).tobytes()
    assert m.topic_word().tobytes() == m2.topic_word().tobytes()
    if update == "memoized":
        assert m.elbo() == m2.elbo()
    # Saving the loaded model again gives the same arrays.
    m2.save(tmp_path / "again.stsnap")
    _, a1 = read_snapshot(path)
    _, a2 = read_snapshot(tmp_path / "again.stsnap")
    assert a1.keys() == a2.keys()
    for k in a1:
        assert a1[k].tobytes() == a2[k].tobytes(), k


@pytest.mark.parametrize("update", ["stochastic", "memoized"])
def test_loaded_model_continues_identically(tmp_path, r8, update):
    m = trained(update, r8)
    m.save(tmp_path / "m.stsnap")
    m2 = load_snapshot(tmp_path / "m.stsnap")
    nxt = r8[160:200]
    m.partial_fit(nxt, batch_key="b9" if update == "memoized" else None)
    m2.partial_fit(nxt, batch_key="b9" if update == "memoized" else None)
    assert_models_identical(m, m2)


def test_memoized_auto_keys_continue_after_load(tmp_path, r8):
    """Batches without a key get auto keys; a loaded model must not reuse (and so overwrite) one."""
    m = TopicModel(n_topics=4, sparsity=2, update="memoized", seed=1)
    m.partial_fit(r8[:40])
    m.partial_fit(r8[40:80])
    m.save(tmp_path / "auto.stsnap")
    m2 = load_snapshot(tmp_path / "auto.stsnap")
    for model in (m, m2):
        model.partial_fit(r8[80:120])
        assert len(model.updater.cache_items()) == 3
        assert model.last_stats["revisit"] is False
    assert_models_identical(m, m2)


def test_rng_state_round_trips(tmp_path, r8):
    """A model saved before initialisation must draw the same random init after loading."""
    m = TopicModel(n_topics=5, sparsity=2, seed=11)
    m.prepare(m.tokenize(r8[:40]))  # vocabulary only, not initialised
    m.rng.random(7)  # advance the generator away from the seed
    m.save(tmp_path / "pre.stsnap")
    m2 = load_snapshot(tmp_path / "pre.stsnap")
    assert not m2.state.initialized
    assert m.rng.bit_generator.state == m2.rng.bit_generator.state
    m.partial_fit(r8[40:80])
    m2.partial_fit(r8[40:80])
    assert m.state.mu.tobytes() == m2.state.mu.tobytes()
    # Control: a model built fresh from the same seed has a different generator state now.
    m3 = TopicModel(n_topics=5, sparsity=2, seed=11)
    m3.prepare(m3.tokenize(r8[:40]))
    m3.partial_fit(r8[40:80])
    assert m3.state.mu.tobytes() != m.state.mu.tobytes()


def test_empty_model_round_trips(tmp_path):
    m = TopicModel(n_topics=3)
    m.save(tmp_path / "empty.stsnap")
    m2 = load_snapshot(tmp_path / "empty.stsnap")
    assert_models_identical(m, m2)
    assert m2.state.n_words == 0 and m2.vocabulary == []


# -- corruption -------------------------------------------------------------------------------

@pytest.fixture
def snap(tmp_path, r8) -> Path:
    m = trained("memoized", r8)
    path = tmp_path / "model.stsnap"
    m.save(path)
    load_snapshot(path)  # valid before we damage it
    return path


def _head_len(data: bytes) -> int:
    return struct.unpack_from("<Q", data, 16)[0]


def _expect_error(path: Path, *fragments: str) -> str:
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(path)
    msg = str(ei.value)
    assert str(path) in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


@pytest.mark.parametrize("region", ["header", "arrays"])
def test_corrupt_byte_is_detected(snap, region):
    data = bytearray(snap.read_bytes())
    head = _head_len(data)
    body_end = len(data) - 16
    pos = 24 + head // 2 if region == "header" else (24 + head + body_end) // 2
    assert 24 <= pos < body_end
    data[pos] ^= 0x5A
    snap.write_bytes(bytes(data))
    _expect_error(snap, "corrupt")


@pytest.mark.parametrize("keep", [0.5, 0.999, 30, 0])
def test_truncated_file_is_detected(snap, keep):
    data = snap.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else keep
    snap.write_bytes(data[:n])
    _expect_error(snap, "truncated")


def test_bad_magic_is_detected(snap):
    data = bytearray(snap.read_bytes())
    data[0:8] = b"NOTSNAP\x00"
    snap.write_bytes(bytes(data))
    _expect_error(snap, "not a streamtopics snapshot")


def test_newer_format_version_is_refused(snap):
    data = bytearray(snap.read_bytes())
    struct.pack_into("<I", data, 8, FORMAT_VERSION + 1)
    snap.write_bytes(bytes(data))
    _expect_error(snap, f"format version {FORMAT_VERSION + 1}", "newer")


def test_missing_file_is_a_snapshot_error(tmp_path):
    _expect_error(tmp_path / "nope.stsnap", "cannot open")


def test_appended_garbage_is_detected(snap):
    with open(snap, "ab") as f:
        f.write(b"\x00" * 100)
    _expect_error(snap)


# -- compression (format 2) ---------------------------------------------------------------------

def _reseal(data: bytearray) -> bytes:
    """``data`` with its trailer's checksum recomputed (a file edited consistently)."""
    struct.pack_into("<8sII", data, len(data) - 16, snapmod.TRAILER_MAGIC, crc32c.crc32c(bytes(data[:-16])), 0)
    return bytes(data)


def _directory(path: Path) -> dict:
    data = path.read_bytes()
    head = msgpack.Unpacker(raw=False, strict_map_key=False)
    head.feed(data[24:24 + _head_len(data)])
    return {e["name"]: e for e in next(head)["arrays"]}


def test_large_compressible_arrays_are_stored_compressed_and_load_bit_exact(tmp_path):
    """The topic-word array is mostly the smoothing value: stored as a zstd frame, a fraction of
    its raw size; an incompressible array stays raw; both load bit for bit."""
    rng = np.random.default_rng(0)
    mostly_flat = np.ones((4096, 50))
    mostly_flat[rng.integers(0, 4096, 3000), rng.integers(0, 50, 3000)] = rng.random(3000) * 40
    noise = rng.random(20_000)
    small = np.arange(10, dtype=np.int64)
    path = tmp_path / "x.stsnap"
    n = snapmod.write_snapshot(path, {"kind": "x"}, {"mu": mostly_flat, "noise": noise, "small": small})
    assert n == path.stat().st_size < mostly_flat.nbytes // 4 + noise.nbytes + 4096
    entries = _directory(path)
    assert entries["mu"]["codec"] == "zstd" and entries["mu"]["stored"] < mostly_flat.nbytes // 4
    assert "codec" not in entries["noise"] and "codec" not in entries["small"]
    _, arrays = read_snapshot(path)
    for name, a in (("mu", mostly_flat), ("noise", noise), ("small", small)):
        assert arrays[name].dtype == a.dtype and arrays[name].tobytes() == a.tobytes(), name
        assert arrays[name].flags.writeable


def test_a_format_1_snapshot_still_loads(tmp_path, r8, monkeypatch):
    """Snapshots written before compression (raw arrays, format version 1) load unchanged."""
    m = trained("stochastic", r8)
    monkeypatch.setattr(snapmod, "COMPRESS_MIN_BYTES", 1 << 62)  # every array raw, as format 1 wrote them
    path = tmp_path / "old.stsnap"
    m.save(path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, 1)
    path.write_bytes(_reseal(data))
    assert all("codec" not in e for e in _directory(path).values())
    assert_models_identical(m, load_snapshot(path))


def test_a_damaged_compressed_array_is_refused_by_name(tmp_path):
    rng = np.random.default_rng(1)
    a = np.zeros(200_000)
    a[rng.integers(0, a.size, 500)] = 1.0
    path = tmp_path / "x.stsnap"
    snapmod.write_snapshot(path, {"kind": "x"}, {"mu": a})
    e = _directory(path)["mu"]
    assert e["codec"] == "zstd"
    data = bytearray(path.read_bytes())
    data[e["offset"] + e["stored"] // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="corrupt"):
        read_snapshot(path)  # the file's checksum
    path.write_bytes(_reseal(data))
    with pytest.raises(SnapshotError, match="'mu' is corrupt"):
        read_snapshot(path)  # the array's own checksum, over its stored bytes


# -- atomic writes -------------------------------------------------------------------------------

def _temp_files(d: Path, name: str):
    return [p for p in d.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".tmp")]


def test_write_to_read_only_directory_fails_cleanly(tmp_path, r8):
    m = trained("stochastic", r8)
    d = tmp_path / "ro"
    d.mkdir()
    m.save(d / "m.stsnap")  # an older good snapshot at the same path
    old = (d / "m.stsnap").read_bytes()
    d.chmod(0o555)
    try:
        if os.access(d, os.W_OK):
            pytest.skip("running with privileges that bypass directory permissions (root)")
        m.partial_fit(r8[160:200])
        with pytest.raises(SnapshotWriteError) as ei:
            m.save(d / "m.stsnap")
        assert ei.value.reason == "permission"
        assert str(d / "m.stsnap") in str(ei.value)
        assert _temp_files(d, "m.stsnap") == []
        assert (d / "m.stsnap").read_bytes() == old
        assert load_snapshot(d / "m.stsnap").version == 5
    finally:
        d.chmod(0o755)


def test_write_into_a_directory_that_refuses_files(r8):
    """Works as root too: sysfs refuses new files regardless of privileges."""
    target = Path("/sys/streamtopics-test.stsnap")
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs mounted")
    m = TopicModel(n_topics=2)
    with pytest.raises(SnapshotWriteError) as ei:
        m.save(target)
    assert ei.value.reason == "permission"
    assert str(target) in str(ei.value)
    assert not target.exists()


def test_target_path_is_a_directory(tmp_path):
    target = tmp_path / "m.stsnap"
    target.mkdir()
    m = TopicModel(n_topics=2)
    with pytest.raises(SnapshotWriteError) as ei:
        m.save(target)
    assert ei.value.reason == "io_error"
    assert isinstance(ei.value, OSError)
    assert str(target) in str(ei.value)
    assert _temp_files(tmp_path, "m.stsnap") == []
    assert target.is_dir() and list(target.iterdir()) == []


@pytest.mark.parametrize("code,reason", [(errno.ENOSPC, "disk_full"), (errno.EDQUOT, "disk_full"),
                                         (errno.EACCES, "permission"), (errno.EROFS, "permission"),
                                         (errno.EIO, "io_error")])
@pytest.mark.parametrize("stage", ["fsync", "replace"])
def test_failed_write_keeps_the_older_snapshot(tmp_path, r8, monkeypatch, code, reason, stage):
    m = trained("stochastic", r8)
    path = tmp_path / "m.stsnap"
    m.save(path)
    old = path.read_bytes()
    m.partial_fit(r8[160:200])

    def fail(*a, **k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(snapmod.os, stage, fail)
    with pytest.raises(SnapshotWriteError) as ei:
        m.save(path)
    monkeypatch.undo()
    assert ei.value.reason == reason
    assert str(path) in str(ei.value)
    assert _temp_files(tmp_path, "m.stsnap") == []
    assert path.read_bytes() == old
    assert load_snapshot(path).version == 5
    # And a later save succeeds and replaces it.
    m.save(path)
    assert load_snapshot(path).version == 6


# --------------------------------------------------------------------------- issue 14: one errno mapping
def test_snapshot_write_over_the_file_size_limit_is_disk_full(tmp_path):
    """A snapshot write that hits RLIMIT_FSIZE fails with EFBIG: the writer and the metrics
    must both call it disk_full (snapshot.py used to say io_error, metrics.py disk_full)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import resource, signal
        import numpy as np
        from streamtopics.snapshot import SnapshotWriteError, write_snapshot
        from streamtopics.metrics import snapshot_failure_reason
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            write_snapshot({str(tmp_path / 'big.snap')!r}, {{"kind": "x"}}, {{"a": np.random.default_rng(0).random(100_000)}})  # incompressible
        except SnapshotWriteError as exc:
            print(exc.reason, snapshot_failure_reason(exc), snapshot_failure_reason(exc.__cause__))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.stdout.split() == ["disk_full", "disk_full", "disk_full"], (out.stdout, out.stderr)
    assert not list(tmp_path.glob("*.tmp"))


def test_one_errno_mapping_for_writer_and_metrics():
    import errno

    from streamtopics import metrics, snapshot
    assert metrics.snapshot_failure_reason is snapshot.write_failure_reason
    for e, want in [(errno.ENOSPC, "disk_full"), (errno.EDQUOT, "disk_full"), (errno.EFBIG, "disk_full"),
                    (errno.EACCES, "permission"), (errno.EROFS, "permission"), (errno.EIO, "io_error")]:
        assert snapshot.write_failure_reason(OSError(e, "x")) == want


def test_a_snapshot_with_values_out_of_range_is_refused_by_name(tmp_path):
    """Checksummed files can still have been written wrong (found on the user's path): alpha < 0
    loaded and every theta came out -inf/inf; a NaN in mu loaded and failed only in an export;
    the rng's bit generator name was looked up in numpy.random and called, whatever it was."""
    import copy

    from streamtopics.model_io import restore_model, snapshot_parts

    m = TopicModel(n_topics=4, seed=0)
    m.partial_fit(["oil prices rose", "bank rates fell", "wheat exports rose", "oil and wheat"] * 5)
    header, arrays = snapshot_parts(m)
    restore_model(TopicModel, copy.deepcopy(header), dict(arrays))  # the parts as written load

    def refused(match, edit_header=None, edit_arrays=None):
        h, a = copy.deepcopy(header), {k: np.array(v) for k, v in arrays.items()}
        (edit_header or (lambda h: None))(h)
        (edit_arrays or (lambda a: None))(a)
        with pytest.raises(ValueError, match=match):
            restore_model(TopicModel, h, a)

    refused("alpha must be a finite number > 0", lambda h: h["state"].update(alpha=-1.0))
    refused("beta must be a finite number > 0", lambda h: h["state"].update(beta=float("inf")))
    refused("NaN or infinite", edit_arrays=lambda a: a["mu"].__setitem__((0, 0), np.nan))
    refused("mu_totals has shape", edit_arrays=lambda a: a.update(mu_totals=np.zeros(3)))
    refused("unknown random bit generator 'Nope'", lambda h: h["rng"].update(bit_generator="Nope"))
    refused("unknown random bit generator 'default_rng'", lambda h: h["rng"].update(bit_generator="default_rng"))
    # a kind this version does not know (a newer writer): refused by name, not loaded as lsparse
    refused("describes engine 'neural' but its params build 'lsparse'",
            lambda h: h["options"]["engine"].update(kind="neural"))
    refused("describes update 'federated'", lambda h: h["options"]["update"].update(kind="federated"))
    refused("its params build 'neural'", lambda h: h["params"].update(engine="neural"))


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_snapshot_file_mode_follows_the_umask(tmp_path, umask, mode):
    """Downstream jobs in the daemon's group read its snapshots (deploy/streamtopics.service: UMask=0027);
    mkstemp alone made every snapshot 0600."""
    old = os.umask(umask)
    try:
        assert snapmod.process_umask() == umask
        TopicModel(n_topics=3, seed=0).partial_fit([["a", "b"], ["b", "c"]] * 4).save(tmp_path / "m.stsnap")
    finally:
        os.umask(old)
    assert (tmp_path / "m.stsnap").stat().st_mode & 0o777 == mode


def test_parameters_given_as_numpy_numbers_save_and_load(tmp_path):
    """A hyperparameter sweep over np.arange / a DataFrame column hands the model numpy numbers; the
    model accepts them, and ``save`` used to fail after training (msgpack: "can not serialize
    'numpy.int64'"), leaving the trained model unsaved (library audit, 2026-11-29)."""
    from streamtopics.options import Hinge, LSparse, Vocabulary

    docs = [d.text for d in load_reuters_r8("train")[:300]]
    labels = [d.label for d in load_reuters_r8("train")[:300]]
    m = TopicModel(n_topics=np.int64(8), alpha=np.float32(0.1), beta=np.float32(0.02), seed=np.int64(3),
                   threads=np.int64(1), engine=LSparse(sparsity=np.int64(4)), supervision=Hinge(c=np.float32(2)),
                   vocabulary=Vocabulary(cap=np.int64(5000)))
    m.partial_fit(docs, labels=labels)
    path = tmp_path / "m.stsnap"
    m.save(path)
    back = load_snapshot(path)
    assert back.n_topics == 8 and back.get_params()["seed"] == 3
    np.testing.assert_array_equal(back.transform(docs[:50]), m.transform(docs[:50]))
    assert back.predict(docs[:50]) == m.predict(docs[:50])
    with pytest.raises(TypeError, match="beyond 64 bits"):
        TopicModel(n_topics=4, seed=2**70).partial_fit(docs[:20]).save(tmp_path / "big.stsnap")
