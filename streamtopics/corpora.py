"""Real corpora for demos, tests and benchmarks: 20 Newsgroups (bydate) and Reuters R8.

20NG is read from ``../shared/data/20news-bydate.tar.gz`` (or ``$STREAMTOPICS_DATA_DIR``);
Reuters R8 ships inside the package so the demo works on a machine without ``../shared``.
"""
from __future__ import annotations

import os
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
            out[split].append(LabelledDoc(f"{split}/{parts[1]}/{parts[2]}", parts[1], strip_newsgroup_headers(raw)))
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
    """20 Newsgroups bydate split ('train': 11,314 docs, 'test': 7,532), headers stripped but Subject."""
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
