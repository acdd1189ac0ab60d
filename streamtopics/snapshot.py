"""Snapshot file format: a msgpack header plus raw array buffers, checksummed, written atomically.

Layout (little endian)::

    b"STOPICS\\0"                      8-byte magic
    u32 format_version, u32 reserved
    u64 header_length
    header                            msgpack map (config, vocabulary, counters, offsets,
                                      and the directory of arrays: name, dtype, shape,
                                      offset, nbytes, crc32c)
    array buffers                     each starting on a 64-byte boundary
    b"STEND\\0\\0\\0" u32 crc32c u32 0   trailer: crc32c of every byte before it

Never pickle: arrays are raw bytes described by dtype/shape, everything else msgpack.
Loading validates the magic, version, trailer, checksum and every array's declared size
against the file before allocating anything (a compressed array: its stored size, and its
decompressed bytes against its shape), and names the file in every error.

Format 2 stores a large array as one zstd frame (level 1; entry ``codec = "zstd"``, ``stored`` =
its length in the file, ``crc32c`` over the stored bytes) when that is at most 90 % of its raw
bytes. The topic-word array is most of a snapshot and most of its entries are exactly the
initial smoothing (words meet few topics): 20NG, K = 100, 73k words, 58.7 MB raw, 79 % of the
entries at the smoothing, compresses 5.8x in 60 ms. Format-1 files (raw arrays) still load.
"""
from __future__ import annotations

import errno
import mmap
import os
import struct
import tempfile
from pathlib import Path

import crc32c
import msgpack
import numpy as np
import zstandard


# Callables told the named points inside an atomic write ("snapshot_write", "snapshot_mid_write",
# "snapshot_before_rename", "snapshot_after_rename"); the daemon subscribes its fault hooks here.
_write_hooks: list = []


def add_write_hook(fn) -> None:
    """Call ``fn(point)`` at each named point of ``write_snapshot`` (idempotent per callable)."""
    if fn not in _write_hooks:
        _write_hooks.append(fn)


def _point(name: str) -> None:
    for fn in _write_hooks:
        fn(name)


MAGIC = b"STOPICS\x00"
TRAILER_MAGIC = b"STEND\x00\x00\x00"
FORMAT_VERSION = 2
_PREAMBLE = struct.Struct("<8sIIQ")
_TRAILER = struct.Struct("<8sII")
_ALIGN = 64
_ALLOWED_DTYPES = {"<f8", "<f4", "<i8", "<i4", "<i2", "|i1", "|u1", "<u4", "<u8", "|b1"}
MAX_HEADER_BYTES = 1 << 31
# Arrays from this size on are stored zstd-compressed when that saves at least a tenth.
COMPRESS_MIN_BYTES = 1 << 16
COMPRESS_KEEP = 0.9
COMPRESS_LEVEL = 1  # level 3 (zstd's default): 5.74x in 94 ms against 5.79x in 61 ms (20NG topic-word array)


class SnapshotError(Exception):
    """A snapshot file is missing, corrupt, truncated or of a newer format."""


class SnapshotWriteError(OSError):
    """Writing a snapshot failed; ``reason`` is one of disk_full, permission, io_error."""

    def __init__(self, path, reason: str, cause: BaseException):
        super().__init__(f"cannot write snapshot {path}: {reason}: {cause}")
        self.path = str(path)
        self.reason = reason


def write_failure_reason(exc: BaseException) -> str:
    """The one mapping of a failed write to a reason code: disk_full (ENOSPC, EDQUOT, EFBIG:
    no room, a quota, or the file-size limit), permission (EACCES, EPERM, EROFS), io_error
    (any other OSError) or other (not an OSError).  A ``SnapshotWriteError`` keeps its reason."""
    if isinstance(exc, SnapshotWriteError):
        return exc.reason
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return "disk_full"
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) or isinstance(exc, PermissionError):
            return "permission"
        return "io_error"
    return "other"


def _plain(x):
    """msgpack's fallback for the header: numpy scalars (a parameter given as ``np.int64(100)`` or
    ``np.float32(0.1)``, accepted by the model) as the Python numbers they stand for."""
    if isinstance(x, np.generic) and x.dtype.kind in "biuf":
        return x.item()
    if isinstance(x, int):  # msgpack's integers are 64-bit
        raise TypeError(f"cannot write the integer {x} into a snapshot header: beyond 64 bits")
    raise TypeError(f"cannot write a {type(x).__name__} into a snapshot header")


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def encode(header: dict, arrays: dict[str, np.ndarray]) -> list:
    """The snapshot as a list of byte chunks (header first; array chunks are uint8 views of the
    arrays, not copies: write them out before changing the arrays)."""
    directory = []
    blobs = []
    packer = zstandard.ZstdCompressor(level=COMPRESS_LEVEL)
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        dt = a.dtype.str
        if dt not in _ALLOWED_DTYPES:
            raise TypeError(f"array {name!r}: dtype {dt} is not storable in a snapshot")
        # A byte view, not a copy (tobytes): a snapshot write would otherwise hold every array
        # twice, a resident-memory spike of the model's size at each snapshot (seen in the soak).
        # A compressed array is held once more, at its compressed size.
        raw = a.reshape(-1).view(np.uint8)
        entry = {"name": name, "dtype": dt, "shape": list(a.shape), "nbytes": len(raw)}
        stored = raw
        if len(raw) >= COMPRESS_MIN_BYTES:
            packed = packer.compress(raw)
            if len(packed) <= COMPRESS_KEEP * len(raw):
                stored = packed
                entry.update(codec="zstd", stored=len(packed))
        entry["crc32c"] = crc32c.crc32c(stored)
        directory.append(entry)
        blobs.append(stored)
    # Offsets depend on the header length, which depends on the offsets: fix the width first.
    for entry in directory:
        entry["offset"] = 2**62
    full = dict(header, arrays=directory, format_version=FORMAT_VERSION)
    head_len = len(msgpack.packb(full, use_bin_type=True, default=_plain))
    pos = _PREAMBLE.size + head_len
    for entry, raw in zip(directory, blobs):
        pos += _pad(pos)
        entry["offset"] = pos
        pos += len(raw)
    head = msgpack.packb(full, use_bin_type=True, default=_plain)
    assert len(head) <= head_len  # msgpack ints only shrink when offsets shrink
    chunks = [_PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, head_len), head, b"\x00" * (head_len - len(head))]
    # msgpack stops at the end of the map, so trailing pad bytes after it are ignored on read.
    pos = _PREAMBLE.size + head_len
    for raw in blobs:
        chunks.append(b"\x00" * _pad(pos))
        pos += _pad(pos)
        chunks.append(raw)
        pos += len(raw)
    crc = 0
    for c in chunks:
        crc = crc32c.crc32c(c, crc)
    chunks.append(_TRAILER.pack(TRAILER_MAGIC, crc, 0))
    return chunks


def process_umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status; elsewhere set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_snapshot(path: str | os.PathLike, header: dict, arrays: dict[str, np.ndarray]) -> int:
    """Write atomically: temp file in the same directory, fsync, rename, fsync the directory.

    Returns the number of bytes written.  On failure the temp file is removed, any older
    file at ``path`` is untouched, and ``SnapshotWriteError`` says why.
    """
    path = Path(path)
    chunks = encode(header, arrays)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, 0o666 & ~process_umask())  # mkstemp's 0600 ignores the umask (readers in the group)
        with os.fdopen(fd, "wb") as f:
            _point("snapshot_write")
            half = len(chunks) // 2
            for i, c in enumerate(chunks):
                if i == half:
                    f.flush()
                    _point("snapshot_mid_write")
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        _point("snapshot_before_rename")
        os.replace(tmp, path)
        tmp = None
        _point("snapshot_after_rename")
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise SnapshotWriteError(path, write_failure_reason(exc), exc) from exc
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return sum(len(c) for c in chunks)


def read_header(path: str | os.PathLike) -> dict:
    """A snapshot's header alone (no array is read, no checksum verified: for a look at what a
    file holds, e.g. ``check-config``); SnapshotError when it cannot be read."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            pre = f.read(_PREAMBLE.size)
            if len(pre) < _PREAMBLE.size:
                raise SnapshotError(f"snapshot {path} is truncated")
            magic, _version, _, head_len = _PREAMBLE.unpack(pre)
            if magic != MAGIC or head_len > MAX_HEADER_BYTES:
                raise SnapshotError(f"{path} is not a readable streamtopics snapshot")
            header = _decode_header(f.read(head_len), head_len, path)
    except OSError as exc:
        raise SnapshotError(f"cannot open snapshot {path}: {exc.strerror or exc}") from exc
    header.pop("arrays", None)
    return header


def _decode_header(raw, head_len: int, path: Path) -> dict:
    """The msgpack header of a snapshot's header region (padded: its first object is the header)."""
    try:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=head_len + 1)
        unpacker.feed(raw)
        header = next(unpacker)
    except Exception as exc:  # noqa: BLE001 - any decode failure means corruption
        raise SnapshotError(f"snapshot {path} has an unreadable header: {exc}") from exc
    if not isinstance(header, dict):
        raise SnapshotError(f"snapshot {path} has a malformed header")
    return header


def _unzstd(view, nbytes: int, path: Path, name: str) -> np.ndarray:
    """The ``nbytes`` bytes one zstd frame holds, read straight into a new array (no second copy)."""
    out = np.empty(nbytes, dtype=np.uint8)
    got, buf = 0, memoryview(out)
    try:
        with zstandard.ZstdDecompressor().stream_reader(view, closefd=False) as r:
            while got < nbytes:
                n = r.readinto(buf[got:])
                if not n:
                    break
                got += n
            extra = r.read(1)
    except zstandard.ZstdError as exc:
        raise SnapshotError(f"snapshot {path}: array {name!r} is corrupt ({exc})") from exc
    finally:
        buf.release()
    if got != nbytes or extra:
        raise SnapshotError(f"snapshot {path}: array {name!r} does not decompress to its declared size")
    return out


def read_snapshot(path: str | os.PathLike, verify: bool = True) -> tuple[dict, dict[str, np.ndarray]]:
    """Read and validate a snapshot; returns (header, arrays).  Raises SnapshotError naming the file."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise SnapshotError(f"cannot open snapshot {path}: {exc.strerror or exc}") from exc
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < _PREAMBLE.size + _TRAILER.size:
            raise SnapshotError(f"snapshot {path} is truncated ({size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            magic, version, _, head_len = _PREAMBLE.unpack_from(mm, 0)
            if magic != MAGIC:
                raise SnapshotError(f"{path} is not a streamtopics snapshot (bad magic)")
            if version > FORMAT_VERSION:
                raise SnapshotError(f"snapshot {path} has format version {version}, newer than this "
                                    f"streamtopics supports ({FORMAT_VERSION}); upgrade streamtopics")
            tmagic, crc, _ = _TRAILER.unpack_from(mm, size - _TRAILER.size)
            if tmagic != TRAILER_MAGIC:
                raise SnapshotError(f"snapshot {path} is truncated or corrupt (no trailer)")
            body_end = size - _TRAILER.size
            if head_len > min(body_end - _PREAMBLE.size, MAX_HEADER_BYTES):
                raise SnapshotError(f"snapshot {path} is corrupt (header length {head_len} exceeds the file)")
            if verify and crc32c.crc32c(memoryview(mm)[:body_end]) != crc:
                raise SnapshotError(f"snapshot {path} is corrupt (checksum mismatch)")
            header = _decode_header(mm[_PREAMBLE.size:_PREAMBLE.size + head_len], head_len, path)
            if not isinstance(header.get("arrays"), list):
                raise SnapshotError(f"snapshot {path} has a malformed header")
            arrays: dict[str, np.ndarray] = {}
            for entry in header["arrays"]:
                try:
                    name, dt, shape = entry["name"], entry["dtype"], tuple(int(x) for x in entry["shape"])
                    off, nbytes = int(entry["offset"]), int(entry["nbytes"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise SnapshotError(f"snapshot {path} has a malformed array entry: {entry!r}") from exc
                if dt not in _ALLOWED_DTYPES:
                    raise SnapshotError(f"snapshot {path}: array {name!r} has unsupported dtype {dt!r}")
                itemsize = np.dtype(dt).itemsize
                if any(s < 0 for s in shape) or int(np.prod(shape, dtype=np.int64)) * itemsize != nbytes:
                    raise SnapshotError(f"snapshot {path}: array {name!r} size does not match its shape")
                codec = entry.get("codec")
                if codec not in (None, "zstd"):
                    raise SnapshotError(f"snapshot {path}: array {name!r} has unsupported codec {codec!r}")
                stored = nbytes if codec is None else entry.get("stored")
                if not isinstance(stored, int) or stored < 0:
                    raise SnapshotError(f"snapshot {path} has a malformed array entry: {entry!r}")
                if off < _PREAMBLE.size + head_len or off + stored > body_end:
                    raise SnapshotError(f"snapshot {path}: array {name!r} lies outside the file")
                view = memoryview(mm)[off:off + stored]
                try:
                    if verify and crc32c.crc32c(view) != entry.get("crc32c"):
                        raise SnapshotError(f"snapshot {path}: array {name!r} is corrupt (checksum mismatch)")
                    if codec is None:
                        arrays[name] = np.frombuffer(view, dtype=dt).reshape(shape).copy()
                    else:
                        arrays[name] = _unzstd(view, nbytes, path, name).view(dt).reshape(shape)
                finally:
                    view.release()
    header.pop("arrays")
    return header, arrays

