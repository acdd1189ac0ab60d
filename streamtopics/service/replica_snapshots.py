"""Snapshots through Kafka, so a replica on a new machine needs no shared disk (docs/scale-out.md).

After a replica writes a snapshot file, ``SnapshotShipper.ship`` sends its bytes in chunks to the
chunk topic (``[replication] snapshots_topic``) on a background thread, then a manifest to
``<snapshots_topic>-manifests``: the snapshot's update offset, size, sha256 and the chunks'
offsets. A replica that starts with an empty snapshot directory calls ``fetch_newest``: it reads
the manifests, takes the one with the highest update offset, reads its chunks by offset, checks
the sha256 and writes the file into its snapshot directory, where the normal loading takes it
(then the update log is replayed from the snapshot's offset). A manifest whose chunks are gone
or damaged is skipped for the next newest one; with none usable the replica replays the log
from its beginning, as before.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import msgpack
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from .checkpoint import parse_snapshot_name, snapshot_name
from .session import log_reader_kwargs, log_writer_kwargs

__all__ = ["SnapshotShipper", "manifest_topic"]

log = logging.getLogger("streamtopics.daemon")


def manifest_topic(chunks_topic: str) -> str:
    return f"{chunks_topic}-manifests"


class SnapshotShipper:
    """Ships snapshot files to Kafka and fetches the newest one; see the module docstring."""

    def __init__(self, cfg, replica_id: str) -> None:
        self.cfg = cfg
        self.topic = cfg.replication.snapshots_topic
        self.manifests = manifest_topic(self.topic)
        self.replica_id = replica_id
        self.chunk_bytes = max(65536, cfg.replication.max_record_bytes - 4096)
        self._thread: threading.Thread | None = None
        self.shipped = 0

    # -- shipping ---------------------------------------------------------------------------

    def ship(self, path: Path, update_offset: int) -> None:
        """Send ``path`` in the background (a shipment still running is not interrupted: this one is skipped)."""
        if self._thread is not None and self._thread.is_alive():
            log.info("snapshot shipping still running; this snapshot is not shipped", extra={"path": str(path)})
            return
        try:
            fd = os.open(path, os.O_RDONLY)  # held open: pruning may delete the name meanwhile
        except OSError as exc:
            log.warning("snapshot not shipped: cannot open it", extra={"path": str(path), "error": repr(exc)})
            return
        self._thread = threading.Thread(target=self._ship, args=(fd, path.name, update_offset),
                                        name="streamtopics-snapshot-ship", daemon=True)
        self._thread.start()

    def _producer(self) -> KafkaProducer:
        return KafkaProducer(**log_writer_kwargs(self.cfg.kafka, self.chunk_bytes + 65536))

    def _ship(self, fd: int, name: str, update_offset: int) -> None:
        producer = None
        try:
            producer = self._producer()
            sha = hashlib.sha256()
            offsets, size = [], 0
            sid = f"{self.replica_id}:{update_offset}:{name}"
            with os.fdopen(fd, "rb") as f:
                while True:
                    chunk = f.read(self.chunk_bytes)
                    if not chunk:
                        break
                    sha.update(chunk)
                    size += len(chunk)
                    md = producer.send(self.topic, value=chunk, key=f"{sid}:{len(offsets)}".encode(),
                                       partition=0).get(timeout=60)
                    offsets.append(md.offset)
            manifest = {"id": sid, "replica": self.replica_id, "update_offset": int(update_offset), "name": name,
                        "size": size, "sha256": sha.hexdigest(), "offsets": offsets}
            producer.send(self.manifests, value=msgpack.packb(manifest), key=b"manifest", partition=0).get(timeout=60)
            self.shipped += 1
            log.info("snapshot shipped to Kafka", extra={"id": sid, "bytes": size, "chunks": len(offsets)})
        except Exception as exc:  # noqa: BLE001 - the next snapshot tries again
            log.warning("snapshot shipping failed", extra={"error": repr(exc)})
        finally:
            if producer is not None:
                producer.close(timeout=10)

    def wait(self, timeout_s: float = 60.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- fetching ---------------------------------------------------------------------------

    def fetch_newest(self, into: Path) -> Path | None:
        """The newest shipped snapshot as a file in ``into`` (None: none usable)."""
        c = KafkaConsumer(**log_reader_kwargs(self.cfg.kafka, self.chunk_bytes + 65536))
        try:
            manifests = self._read_all(c, TopicPartition(self.manifests, 0))
            found = sorted((msgpack.unpackb(m.value) for m in manifests), key=lambda m: m["update_offset"],
                           reverse=True)
            for man in found:
                data = self._chunks(c, man)
                if data is None:
                    continue
                into.mkdir(parents=True, exist_ok=True)
                name = str(man.get("name", ""))
                path = into / (name if parse_snapshot_name(name) is not None and "/" not in name else snapshot_name(0))
                tmp = path.with_suffix(".part")
                tmp.write_bytes(data)
                os.replace(tmp, path)
                log.info("snapshot fetched from Kafka", extra={"id": man["id"], "update_offset": man["update_offset"],
                                                                "bytes": len(data), "path": str(path)})
                return path
            return None
        finally:
            c.close()

    @staticmethod
    def _read_all(c: KafkaConsumer, tp: TopicPartition) -> list:
        c.assign([tp])
        # A broker may answer with the last batch's base offset + 1 (tansu); polls return whole
        # batches, so reading until the position passes it still reads that batch entire.
        end = c.end_offsets([tp])[tp]
        c.seek_to_beginning(tp)
        out = []
        while c.position(tp) < end:
            out.extend(c.poll(timeout_ms=500).get(tp, []))
        return out

    def _chunks(self, c: KafkaConsumer, man: dict) -> bytes | None:
        tp = TopicPartition(self.topic, 0)
        c.assign([tp])
        parts = []
        for i, off in enumerate(man["offsets"]):
            c.seek(tp, off)
            recs = []
            while not recs:
                got = c.poll(timeout_ms=2000, max_records=1).get(tp, [])
                if not got:
                    log.warning("shipped snapshot incomplete (its chunks are gone)", extra={"id": man["id"]})
                    return None
                recs = [r for r in got if r.offset == off]
            if recs[0].key != f"{man['id']}:{i}".encode():
                return None
            parts.append(recs[0].value)
        data = b"".join(parts)
        if len(data) != man["size"] or hashlib.sha256(data).hexdigest() != man["sha256"]:
            log.warning("shipped snapshot damaged (size or sha256 differ); trying an older one", extra={"id": man["id"]})
            return None
        return data
