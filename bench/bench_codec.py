"""Decode throughput of the input codec, and a msgspec prototype against it (issue 16, item 5).

A realistic mix of input messages (documents of ~200 words of Zipf-distributed text, token
lists, array messages of 32 documents, labels, label sets, event times, responses, and 1% bad
documents), in msgpack and in JSON, is decoded by

* ``codec.decode_message`` as it is (decode with msgpack / json, then validate by hand), and
* a prototype on msgspec 0.22: typed decoding into a ``msgspec.Struct`` whose constraints carry
  the ``Limits`` (one Struct type per Limits, built with ``msgspec.defstruct``), plus the checks
  a schema cannot say (text xor tokens, blank text, duplicate labels, finite numbers).  Its
  validation errors do not carry the codec's dead-letter details ("'tokens'[3] has 120
  characters; the limit is 100"), so any message that fails the typed decode is decoded again
  by the current code, which writes the dead letters: the reasons and details stay exactly as
  they are, the prototype only speeds up the valid messages.

Both must give equal documents and dead letters on the whole mix (checked before timing).
Reported: documents per second (CPU time), median of ``--rounds`` paired rounds, and the
ratio; for context, the rate at which ``text.Tokenizer`` (the next step) handles the same texts.

    pip install msgspec          # only for this measurement
    python bench/bench_codec.py [--messages 4000 --rounds 5]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamtopics.stream import codec  # noqa: E402
from streamtopics.stream.codec import Document, Limits, decode_message  # noqa: E402


# -- the mix ------------------------------------------------------------------------------------
def _words(rng, n_vocab=20000):
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    lengths = rng.integers(2, 10, size=n_vocab)
    return ["".join(rng.choice(letters, size=int(k))) for k in lengths]


def make_mix(n_messages: int, seed: int = 0) -> list[dict | list]:
    rng = np.random.default_rng(seed)
    vocab = _words(rng)
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    labels = [f"topic-{i}" for i in range(20)]

    def text(n):
        return " ".join(vocab[i] for i in rng.choice(len(vocab), size=n, p=p))

    def document(i):
        r = rng.random()
        d: dict = {"id": f"doc-{i}" if i % 3 else i}
        if r < 0.7:
            d["text"] = text(int(rng.integers(50, 400)))
        else:
            d["tokens"] = text(int(rng.integers(50, 300))).split()
        if rng.random() < 0.5:
            d["label"] = labels[int(rng.integers(20))]
        elif rng.random() < 0.2:
            d["labels"] = [str(x) for x in rng.choice(labels, size=3, replace=False)]
        if rng.random() < 0.3:
            d["ts"] = 1.7e9 + float(rng.random()) * 1e7
        if rng.random() < 0.1:
            d["response"] = float(rng.normal())
        if rng.random() < 0.01:  # a bad document now and then
            d[["colour", "text"][int(rng.integers(2))]] = "  " if "text" not in d else "red"
        return d

    out: list = []
    i = 0
    for _ in range(n_messages):
        if rng.random() < 0.3:
            out.append([document(i + j) for j in range(32)])
            i += 32
        else:
            out.append(document(i))
            i += 1
    return out


# -- the msgspec prototype ----------------------------------------------------------------------
def msgspec_decoder(limits: Limits):
    import msgspec
    from typing import Annotated, Union

    M = msgspec.Meta
    unset = msgspec.UNSET
    U = msgspec.UnsetType
    Text = Annotated[str, M(max_length=limits.max_text_chars)]
    Token = Annotated[str, M(min_length=1, max_length=limits.max_token_chars)]
    Label = Annotated[str, M(min_length=1, max_length=limits.max_label_chars)]
    Id = Union[Annotated[str, M(min_length=1, max_length=codec.MAX_ID_CHARS)],
               Annotated[int, M(ge=-(2**63), le=2**63 - 1)]]
    Doc = msgspec.defstruct("Doc", [
        ("id", Id),
        ("text", Union[Text, U], unset),
        ("tokens", Union[Annotated[list[Token], M(min_length=1, max_length=limits.max_tokens)], U], unset),
        ("label", Union[Label, U], unset),
        ("labels", Union[Annotated[list[Label], M(max_length=limits.max_labels)], U], unset),
        ("response", Union[float, U], unset),
        ("ts", Union[Annotated[float, M(ge=0.0, lt=codec.MAX_TS)], U], unset),
    ], forbid_unknown_fields=True)
    Msg = Union[Doc, Annotated[list[Doc], M(min_length=1, max_length=limits.max_docs_per_message)]]
    decoders = {"msgpack": msgspec.msgpack.Decoder(Msg), "json": msgspec.json.Decoder(Msg)}

    def to_document(s) -> Document | None:
        """The checks a schema cannot say; None sends the message to the exact (current) path."""
        text = None if s.text is unset else s.text
        tokens = None if s.tokens is unset else s.tokens
        if (text is None) == (tokens is None) or (text is not None and not text.strip()):
            return None
        label = None if s.label is unset else s.label
        labels = None if s.labels is unset else s.labels
        if label is not None and labels is not None or labels is not None and len(set(labels)) != len(labels):
            return None
        response = None if s.response is unset else s.response
        ts = None if s.ts is unset else s.ts
        if response is not None and not math.isfinite(response) or ts is not None and not math.isfinite(ts):
            return None
        if isinstance(s.id, bool):
            return None
        return Document(s.id, text, tokens, label, labels, response, ts)

    def decode(raw: bytes, fmt: str = "msgpack"):
        if len(raw) <= limits.max_message_bytes and raw:
            kind = codec.sniff_format(raw) if fmt == "auto" else fmt
            try:
                obj = decoders[kind].decode(raw)
            except (msgspec.ValidationError, msgspec.DecodeError):
                obj = None
            if obj is not None:
                docs = [to_document(s) for s in (obj if isinstance(obj, list) else [obj])]
                if all(d is not None for d in docs):
                    return docs, []
        return decode_message(raw, limits, fmt=fmt)  # the exact reasons and details

    return decode


# -- measurement --------------------------------------------------------------------------------
def _encode(mix, fmt):
    if fmt == "json":
        return [json.dumps(m).encode() for m in mix]
    return [msgpack.packb(m, use_bin_type=True) for m in mix]


def _rate(fn, raws, fmt) -> tuple[float, int]:
    t0 = time.process_time()  # CPU time: a busy machine disturbs it less than wall time
    n = 0
    for r in raws:
        n += len(fn(r, fmt)[0])
    return n / (time.process_time() - t0), n


def _same(a, b) -> bool:
    (da, la), (db, lb) = a, b
    key = lambda dl: (dl.reason, dl.detail, dl.index, dl.raw)  # noqa: E731
    return da == db and [key(x) for x in la] == [key(x) for x in lb]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    limits = Limits()
    mix = make_mix(args.messages)
    current = lambda raw, fmt: decode_message(raw, limits, fmt=fmt)  # noqa: E731
    try:
        proto = msgspec_decoder(limits)
    except ImportError:
        proto = None
        print("msgspec is not installed: current codec only")
    for fmt in ("msgpack", "json"):
        raws = _encode(mix, fmt)
        mib = sum(map(len, raws)) / 2**20
        if proto is not None:
            bad = [i for i, r in enumerate(raws) if not _same(current(r, fmt), proto(r, fmt))]
            assert not bad, f"prototype differs on messages {bad[:5]}"
        cur, new = [], []
        for r in range(args.rounds):
            order = [("cur", current), ("new", proto)] if r % 2 == 0 else [("new", proto), ("cur", current)]
            for name, fn in order:
                if fn is None:
                    continue
                rate, n = _rate(fn, raws, fmt)
                (cur if name == "cur" else new).append(rate)
        line = (f"{fmt:7s} {len(raws)} messages, {n} documents, {mib:.1f} MiB: "
                f"current {statistics.median(cur):,.0f} docs/s")
        if new:
            ratios = [b / a for a, b in zip(cur, new)]
            line += (f", msgspec prototype {statistics.median(new):,.0f} docs/s "
                     f"(x{statistics.median(ratios):.2f}; rounds {' '.join(f'{x:.2f}' for x in ratios)})")
        print(line, flush=True)
    # context: what the daemon does next with each text document (text.Tokenizer)
    from streamtopics.text import Tokenizer

    tok = Tokenizer()
    texts = [d["text"] for m in mix for d in (m if isinstance(m, list) else [m]) if "text" in d]
    t0 = time.process_time()
    for t in texts:
        tok(t)
    print(f"context: tokenizing the {len(texts)} text documents runs at "
          f"{len(texts) / (time.process_time() - t0):,.0f} docs/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
