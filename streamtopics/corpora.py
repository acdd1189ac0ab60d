"""Real corpora for demos, tests and benchmarks: 20 Newsgroups (bydate) and Reuters R8.

20NG is read from ``../shared/data/20news-bydate.tar.gz`` (or ``$STREAMTOPICS_DATA_DIR``);
Reuters R8 ships inside the package so the demo works on a machine without ``../shared``.
20NG posts carry binaries as uuencoded, base64 or BinHex text; ``strip_encoded_blocks``
removes them (otherwise the demo learns topics made of their letter fragments).
"""
from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

NEWSGROUPS_ARCHIVE = "20news-bydate.tar.gz"
R8_ARCHIVE = "reuters-r8.tar.gz"
_PACKAGE_DATA = Path(__file__).with_name("data")


@dataclass(frozen=True)
class LabelledDoc:
    id: str
    label: str
    text: str


def data_dirs() -> list[Path]:
    """Where corpora are looked for, in order."""
    dirs = []
    env = os.environ.get("STREAMTOPICS_DATA_DIR")
    if env:
        dirs.append(Path(env))
    repo = Path(__file__).resolve().parent.parent
    dirs += [Path.cwd() / ".." / "shared" / "data", repo / ".." / "shared" / "data", Path.cwd() / "data",
             _PACKAGE_DATA]
    return dirs


def find_archive(name: str) -> Path | None:
    for d in data_dirs():
        p = d / name
        if p.is_file():
            return p.resolve()
    return None


def strip_newsgroup_headers(raw: str) -> str:
    """Drop mail headers except Subject (the 20NG convention used by the benchmarks)."""
    head, sep, body = raw.partition("\n\n")
    if not sep:
        return raw
    subject = ""
    for line in head.splitlines():
        if line.lower().startswith("subject:"):
            subject = line[8:].strip()
            break
    return f"{subject}\n{body}" if subject else body


_UU_BEGIN = re.compile(r"^begin [0-7]{3,4} \S")
_B64_LINE = re.compile(r"^[A-Za-z0-9+/]{40,}={0,2}$")
_B64_TAIL = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")
_B64_HEADER = re.compile(r"^content-transfer-encoding:\s*base64\s*$", re.I)


def is_uu_line(line: str) -> bool:
    """A uuencoded data line: its first character encodes n bytes and the line holds the
    4 * ceil(n / 3) characters that carry them (+ up to 2 for a checksum or spaces lost at
    the end), every character in uuencode's range (space to backquote: no lowercase)."""
    if len(line) < 2:
        return line == "`"
    if any(not 32 <= ord(c) <= 96 for c in line):
        return False
    n = (ord(line[0]) - 32) & 63
    want = ((n + 2) // 3) * 4
    return n > 0 and want - 8 <= len(line) - 1 <= want + 2


def strip_encoded_blocks(text: str) -> str:
    """Remove binaries carried as text: uuencoded blocks (``begin 644 name`` .. ``end``, and
    runs of 3+ full uuencoded lines - "M" + 60 characters - from multi-part posts without
    the begin line), base64 parts
    (runs of 2+ base64 lines, or any after a ``Content-Transfer-Encoding: base64`` header)
    and runs of 3+ lines of 50+ characters without a space (BinHex, hex dumps). Prose,
    addresses and single long tokens (one URL, one message id) are left alone."""
    lines = text.split("\n")
    n = len(lines)
    drop = [False] * n
    i = 0
    while i < n:
        s = lines[i].rstrip("\r")
        if _UU_BEGIN.match(s):  # a whole uuencoded block, through its "end" line
            j = i + 1
            while j < n and lines[j].rstrip("\r").strip() != "end" and (
                    is_uu_line(lines[j].rstrip("\r")) or not lines[j].strip()):
                j += 1
            if j < n and lines[j].strip() == "end":
                j += 1
            for k in range(i, j):
                drop[k] = True
            i = j
            continue
        if _B64_HEADER.match(s):
            j = i + 1
            while j < n and not lines[j].strip():  # the part's blank line
                j += 1
            while j < n and _B64_TAIL.match(lines[j].strip()):
                drop[j] = True
                j += 1
            i = j
            continue
        i += 1
    for test, min_run in ((lambda s: s[:1] == "M" and is_uu_line(s), 3),  # full 45-byte lines of a uu part
                          (lambda s: bool(_B64_LINE.match(s)), 2),
                          (lambda s: len(s) >= 50 and not any(c.isspace() for c in s), 3)):
        i = 0
        while i < n:
            j = i
            while j < n and not drop[j] and test(lines[j].rstrip("\r")):
                j += 1
            if j - i >= min_run:
                # a base64 part ends with one shorter line
                if min_run == 2 and j < n and _B64_TAIL.match(lines[j].strip() or "-"):
                    j += 1
                for k in range(i, j):
                    drop[k] = True
            i = max(j, i + 1)
    return "\n".join(line for line, d in zip(lines, drop) if not d)


@lru_cache(maxsize=2)
def _read_20ng(path: str) -> dict[str, tuple[LabelledDoc, ...]]:
    out: dict[str, list[LabelledDoc]] = {"train": [], "test": []}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            parts = member.name.split("/")
            if len(parts) != 3:
                continue
            split = "train" if parts[0].endswith("train") else "test"
            raw = tar.extractfile(member).read().decode("latin-1")
            text = strip_encoded_blocks(strip_newsgroup_headers(raw))
            out[split].append(LabelledDoc(f"{split}/{parts[1]}/{parts[2]}", parts[1], text))
    return {k: tuple(sorted(v, key=lambda d: d.id)) for k, v in out.items()}


@lru_cache(maxsize=2)
def _read_r8(path: str) -> dict[str, tuple[LabelledDoc, ...]]:
    out: dict[str, tuple[LabelledDoc, ...]] = {}
    with tarfile.open(path, "r:gz") as tar:
        for split in ("train", "test"):
            f = tar.extractfile(f"R8/{split}.txt")
            docs = []
            for i, line in enumerate(f.read().decode("utf-8", "replace").splitlines()):
                label, _, text = line.partition("\t")
                if text:
                    docs.append(LabelledDoc(f"r8-{split}/{i}", label, text))
            out[split] = tuple(docs)
    return out


def _order(docs: tuple[LabelledDoc, ...], order: str, seed: int) -> list[LabelledDoc]:
    if order == "shuffled":
        idx = np.random.default_rng(seed).permutation(len(docs))
        return [docs[i] for i in idx]
    if order == "grouped":
        return sorted(docs, key=lambda d: (d.label, d.id))
    raise ValueError(f"order must be 'shuffled' or 'grouped' (got {order!r})")


def load_20newsgroups(split: str = "train", order: str = "shuffled", seed: int = 0,
                      path: str | os.PathLike | None = None) -> list[LabelledDoc]:
    """20 Newsgroups bydate split ('train': 11,314 docs, 'test': 7,532), headers stripped but Subject,
    uuencoded / base64 / BinHex blocks removed (``strip_encoded_blocks``)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test' (got {split!r})")
    p = Path(path) if path else find_archive(NEWSGROUPS_ARCHIVE)
    if p is None:
        raise FileNotFoundError(f"{NEWSGROUPS_ARCHIVE} not found in any of: " + ", ".join(map(str, data_dirs())))
    return _order(_read_20ng(str(p))[split], order, seed)


def load_reuters_r8(split: str = "train", order: str = "shuffled", seed: int = 0,
                    path: str | os.PathLike | None = None) -> list[LabelledDoc]:
    """Reuters R8 ('train': 5,485 docs, 'test': 2,189), lowercased text, 8 labels; bundled with the package."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test' (got {split!r})")
    p = Path(path) if path else find_archive(R8_ARCHIVE)
    if p is None:
        raise FileNotFoundError(f"{R8_ARCHIVE} not found in any of: " + ", ".join(map(str, data_dirs())))
    return _order(_read_r8(str(p))[split], order, seed)


def load_default_corpus(split: str = "train", order: str = "shuffled", seed: int = 0) -> tuple[str, list[LabelledDoc]]:
    """20NG when ``../shared/data`` (or $STREAMTOPICS_DATA_DIR) has it, else the bundled Reuters R8."""
    if find_archive(NEWSGROUPS_ARCHIVE) is not None:
        return "20newsgroups", load_20newsgroups(split, order, seed)
    return "reuters-r8", load_reuters_r8(split, order, seed)
