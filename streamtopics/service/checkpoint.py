"""Checkpoints: the snapshot directory, its naming, its single writer, and what may be committed.

* ``snapshot_name`` / ``parse_snapshot_name``: the one place snapshot files are named.
* ``SnapshotStore``: newest-valid loading, atomic writes, keep the last R.
* ``DirectoryLock``: one writer per snapshot directory (an advisory ``fcntl`` lock on a
  file that names its owner - host, pid, instance, start time - and whose modification
  time is a heartbeat). A second daemon is refused at start; a lock whose owner is gone
  (same host, no ``fcntl`` lock held) is taken over at once, one on another host only
  after ``stale_s`` without a heartbeat (shared file systems where ``fcntl`` locks do not
  reach). Released on exit.
* ``Lineage``: every snapshot carries the writer's instance id, a lineage id (a model's
  history: created with a fresh model, inherited by whoever loads a snapshot) and a
  sequence number that grows by one per snapshot. ``may_adopt`` decides whether a
  snapshot found later may replace the model in memory: same lineage, higher sequence
  and no fewer documents - never by file names alone.
* ``CommitGate``: the consumer group's committed offsets follow durable state. Only the
  offsets of the newest snapshot written (or loaded) are ever committed, so the group
  never points past what a snapshot holds.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..model import TopicModel, load_snapshot

__all__ = ["CommitGate", "DirectoryLock", "Lineage", "LockHeld", "SnapshotDirUnusable", "SnapshotStore",
           "StartRefused", "parse_snapshot_name", "snapshot_name"]

log = logging.getLogger(__name__)

LOCK_NAME = ".streamtopics.lock"
LOCK_STALE_S = 60.0       # another host's lock without a heartbeat for this long may be taken over
HEARTBEAT_S = 5.0         # the owner touches the lock file this often
_SNAPSHOT_RE = re.compile(r"^model-(\d{12,})-(\d{8}T\d{6}Z)\.stsnap$")
_TEMP_GLOB = ".model-*.stsnap.*.tmp"


# --------------------------------------------------------------------------- naming


def snapshot_name(version: int, now: float | None = None) -> str:
    """``model-<version, 12 digits>-<UTC time>.stsnap``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    return f"model-{version:012d}-{stamp}.stsnap"


def parse_snapshot_name(name: str) -> int | None:
    """The model version in a snapshot file name, None for other files."""
    m = _SNAPSHOT_RE.match(name)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- lineage


@dataclass
class Lineage:
    """A model's history: ``id`` (new with a fresh model), ``seq`` (snapshots written in it)."""

    id: str
    seq: int = 0

    @classmethod
    def new(cls) -> Lineage:
        return cls(uuid.uuid4().hex, 0)

    @classmethod
    def of(cls, info: dict) -> Lineage | None:
        """The lineage a loaded snapshot carries (None: written before lineages existed)."""
        d = ((info.get("extra") or {}).get("daemon") or {})
        if not d.get("lineage"):
            return None
        return cls(str(d["lineage"]), int(d.get("seq", 0)))

    def may_adopt(self, other: Lineage | None, other_docs: int, own_docs: int) -> tuple[bool, str]:
        """Whether a snapshot of lineage ``other`` may replace a model of this lineage."""
        if other is None:
            return False, "the snapshot carries no lineage (written by an older streamtopics)"
        if other.id != self.id:
            return False, f"it belongs to another lineage ({other.id[:12]}, ours {self.id[:12]})"
        if other.seq <= self.seq:
            return False, f"it is not newer (sequence {other.seq}, ours {self.seq})"
        if other_docs < own_docs:
            return False, f"it holds fewer documents ({other_docs} < {own_docs})"
        return True, "newer snapshot of our lineage"


# --------------------------------------------------------------------------- the store


class SnapshotStore:
    """The snapshot directory: newest-valid loading, atomic writes, keep the last R."""

    def __init__(self, directory: str | os.PathLike, keep: int, on_load_failed=None) -> None:
        self.dir = Path(directory)
        self.keep = max(1, int(keep))
        self._on_load_failed = on_load_failed  # called per unusable file (telemetry counts them)
        # Files that failed to load: never pruned, and not counted among the ``keep`` newest (a
        # corrupt file newer than the rest had pushed out the good ones; with keep = 1, the one
        # snapshot just written, while the group's offsets were committed up to it).
        self.unusable: set[str] = set()

    def files(self) -> list[Path]:
        """Snapshot files, newest first (by model version, then modification time)."""
        try:
            entries = list(self.dir.iterdir())
        except FileNotFoundError:
            return []
        found = []
        for p in entries:
            version = parse_snapshot_name(p.name)
            if version is None:
                continue
            try:
                mtime = p.stat().st_mtime_ns
            except OSError:
                continue
            found.append((version, mtime, p.name, p))
        found.sort(reverse=True)
        return [f[3] for f in found]

    def load_newest(self, skip: set[str] | None = None) -> tuple[TopicModel, Path] | None:
        """The newest snapshot that loads; corrupt ones are logged, counted and skipped."""
        for path in self.files():
            if skip is not None and path.name in skip:
                continue
            try:
                model = load_snapshot(path)
            except Exception as exc:  # noqa: BLE001 - SnapshotError, or a header from another program
                if self._on_load_failed is not None:
                    self._on_load_failed()
                if path.name not in self.unusable:
                    log.warning("skipping unusable snapshot; it is kept, outside the snapshot rotation, "
                                "until an operator removes it", extra={"path": str(path), "error": str(exc)})
                self.unusable.add(path.name)
                if skip is not None:
                    skip.add(path.name)
                continue
            return model, path
        return None

    def write(self, model: TopicModel, offsets: dict[str, int], extra: dict) -> tuple[Path, int]:
        """Write atomically; raises SnapshotWriteError. Returns (path, bytes)."""
        path = self.dir / snapshot_name(model.version)
        nbytes = model.save(path, offsets=offsets, extra=extra)
        return path, nbytes

    def prune(self) -> list[Path]:
        removed = []
        for p in [p for p in self.files() if p.name not in self.unusable][self.keep:]:
            try:
                p.unlink()
                removed.append(p)
            except OSError as exc:
                log.warning("could not delete an old snapshot", extra={"path": str(p), "error": str(exc)})
        return removed

    def clean_temp(self) -> None:
        """Remove temp files left by a write that a crash interrupted."""
        try:
            for p in self.dir.glob(_TEMP_GLOB):
                p.unlink(missing_ok=True)
        except OSError:
            pass


# --------------------------------------------------------------------------- one writer


class StartRefused(RuntimeError):
    """The daemon cannot start on this snapshot directory (it exits 2 with this message)."""

    owner: dict = {}


class SnapshotDirUnusable(StartRefused):
    """The snapshot directory cannot be made, or its lock file cannot be written."""

    def __init__(self, directory: Path, exc: OSError) -> None:
        self.owner = {}
        what = ("a file stands where it should be" if isinstance(exc, (FileExistsError, NotADirectoryError))
                else "it is on a read-only file system" if exc.errno == errno.EROFS
                else "its file system is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                else "no permission" if isinstance(exc, PermissionError)
                else exc.strerror or repr(exc))
        super().__init__(f"snapshot directory {directory} cannot be used: {what} ({type(exc).__name__}: {exc}). "
                         f"Set snapshot.dir to a writable directory (the daemon creates it if missing).")


class LockHeld(StartRefused):
    """Another live daemon owns the snapshot directory."""

    def __init__(self, directory: Path, owner: dict, why: str) -> None:
        self.owner = owner
        super().__init__(
            f"snapshot directory {directory} is in use by another streamtopics daemon "
            f"(host {owner.get('host')}, pid {owner.get('pid')}, instance {owner.get('instance')}, "
            f"started {owner.get('started_iso')}; {why}). One daemon writes one snapshot lineage: "
            f"give this one its own snapshot.dir, or stop the other one. A lock whose owner died is "
            f"taken over at once on the same host, after {LOCK_STALE_S:g} s without heartbeat from "
            f"another host.")


class DirectoryLock:
    """An advisory lock on ``<dir>/.streamtopics.lock`` naming its owner; see the module docstring."""

    def __init__(self, directory: str | os.PathLike, instance: str, stale_s: float = LOCK_STALE_S) -> None:
        self.dir = Path(directory)
        self.path = self.dir / LOCK_NAME
        self.instance = instance
        self.stale_s = float(stale_s)
        self._fd: int | None = None
        self._beat = 0.0
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "instance": instance,
                      "started": time.time(),
                      "started_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise ``LockHeld`` (``SnapshotDirUnusable`` when the directory cannot
        be made or the lock file written)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SnapshotDirUnusable(self.dir, exc) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise LockHeld(self.dir, self._read(fd), "it holds the lock now") from None
            prev = self._read(fd)
            if prev.get("instance") and prev.get("host") != self.owner["host"]:
                age = time.time() - os.fstat(fd).st_mtime
                if age < self.stale_s:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    raise LockHeld(self.dir, prev, f"its heartbeat is {age:.0f} s old, stale after {self.stale_s:g} s")
                log.warning("taking over a stale snapshot directory lock",
                            extra={"previous_owner": prev, "heartbeat_age_s": round(age, 1)})
            elif prev.get("instance"):
                log.info("previous owner of the snapshot directory is gone; taking its lock over",
                         extra={"previous_owner": prev})
            data = json.dumps(self.owner).encode()
            try:
                # Over the old record, then cut to length: a full disk leaves the previous owner's
                # record readable (ftruncate first had erased it) and refuses the start cleanly.
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
                os.fsync(fd)
            except OSError as exc:
                raise SnapshotDirUnusable(self.dir, exc) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._beat = time.monotonic()

    @staticmethod
    def _read(fd: int) -> dict:
        try:
            raw = os.pread(fd, 65536, 0)
            d = json.loads(raw.decode() or "{}")
            return d if isinstance(d, dict) else {}
        except (OSError, ValueError):
            return {}

    def heartbeat(self, force: bool = False) -> None:
        """Touch the lock file (at most every HEARTBEAT_S unless ``force``)."""
        if self._fd is None:
            return
        now = time.monotonic()
        if not force and now - self._beat < HEARTBEAT_S:
            return
        self._beat = now
        try:
            os.utime(self._fd)
        except OSError as exc:
            log.debug("lock heartbeat failed: %r", exc)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- commits


class CommitGate:
    """Offsets the group may be told: those of the newest durable snapshot, nothing newer.

    ``durable(offsets)`` after a snapshot is written (or loaded); ``pending(assigned)`` gives
    the offsets not committed yet for the assigned partitions; ``committed(offsets)`` after
    the broker took them.
    """

    def __init__(self) -> None:
        self.snapshot_offsets: dict[str, int] = {}
        self._sent: dict[str, int] = {}

    def durable(self, offsets: dict[str, int]) -> None:
        self.snapshot_offsets = {str(k): int(v) for k, v in offsets.items()}

    def pending(self, assigned: list[str] | None = None) -> dict[str, int]:
        keys = self.snapshot_offsets if assigned is None else [k for k in assigned if k in self.snapshot_offsets]
        return {k: self.snapshot_offsets[k] for k in keys if self._sent.get(k) != self.snapshot_offsets[k]}

    def committed(self, offsets: dict[str, int]) -> None:
        self._sent.update(offsets)

    def forget(self) -> None:
        """After a rebalance, a commit may need repeating."""
        self._sent.clear()
