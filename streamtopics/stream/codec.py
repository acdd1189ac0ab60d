"""Wire formats of streamtopics: the one place that knows how messages look.

All three message kinds are msgpack (strings UTF-8, binary as msgpack ``bin``).
Input documents may also be JSON (``input.format``): ``"msgpack"`` (the default),
``"json"`` (UTF-8 JSON text, the same schema: an object or an array of objects) or
``"auto"`` (per message: JSON when the first byte after optional whitespace or a
UTF-8 BOM is ``{`` or ``[``, msgpack otherwise; neither byte starts a msgpack map
or array, so no valid msgpack document is mistaken for JSON).

Input documents (topic ``topics.input``)
----------------------------------------
A message value is either one *document map* or an array of document maps
(a minibatch message, at most ``limits.max_docs_per_message`` elements).
The schema is strict: keys must be strings and unknown keys are rejected.

============  ==========================  =====================================
key           type                        rules
============  ==========================  =====================================
``id``        str or int                  required; str non-empty and at most
                                          256 characters; int within int64
``text``      str                         exactly one of ``text`` / ``tokens``;
                                          at most ``limits.max_text_chars``;
                                          must not be blank
``tokens``    array of str                already tokenized text; at most
                                          ``limits.max_tokens`` tokens, each
                                          non-empty and at most
                                          ``limits.max_token_chars``; not empty
``label``     str                         optional single label (1 to
                                          ``limits.max_label_chars`` chars);
                                          null = unlabelled
``labels``    array of str                optional multi-label set (at most
                                          ``limits.max_labels`` distinct
                                          labels); not together with ``label``;
                                          null = unlabelled
``response``  float or int                optional regression target; finite,
                                          within +-1e100 (``MAX_RESPONSE``),
                                          booleans are not numbers here;
                                          null or NaN = unlabelled
``ts``        float or int                optional event time, seconds since
                                          the Unix epoch, 0 <= ts < year 3000
                                          (validated; latency is measured from
                                          the Kafka record's timestamp)
============  ==========================  =====================================

Message size is checked before decoding (``limits.max_message_bytes``).
Example: ``{"id": "doc-17", "text": "the cat sat", "label": "pets"}``.

Predictions (topic ``topics.output``; message key = document id as UTF-8,
integer ids in decimal)
-----------------------------------------------------------------------------
``{"id": str|int, "topics": [[k, p], ...], "label"?: str,
"scores"?: {label: float}, "response"?: float, "model_version": int,
"ts": float}``

``topics`` holds the document's largest topic proportions as ``[topic index,
proportion]`` pairs in descending order of proportion: at most 10, each at least
0.01 (the largest always), so they need not sum to 1 (``service.predictions``:
TOP_TOPICS, MIN_TOPIC_PROB). A document none of whose words the model knew
before its batch gets uniform proportions and no ``label``/``labels``/``scores``,
as ``TopicModel.predict`` gives None. ``label``, ``scores`` and ``response`` are
present only for supervised models. ``model_version``
counts the global updates the predicting model had seen; with replication it is
the update-log offset the model had applied instead (``replica`` names the
replica; a replica's snapshot records that offset as ``update_offset`` in its
daemon extra, beside its own count of global updates); ``ts`` is the
prediction time (seconds since the epoch).

Dead letters (topic ``topics.dead_letter``; message key and headers = those of
the source record)
-----------------------------------------------------------------------------
``{"reason": str, "detail": str, "index": int|null,
"source": {"topic": str, "partition": int, "offset": int},
"raw": bin, "ts": float}`` and, only when ``raw`` was cut to a size bound,
``"raw_truncated": true, "raw_size": <original length>``; only when the source
record had them, ``"key": bin`` (its message key) and ``"headers": [[str,
bin|null], ...]`` (its headers, in order), so a dead letter can be traced and
replayed with its routing intact. Key and headers too large to go out twice within the
message limit are in the map as ``"key_size"``/``"headers_size"`` only (``dead_letter_record``;
over half of the limit the dead letter's own record goes without them too).

``reason`` is one code from the fixed set ``REASONS``:

- ``message_too_large``  the message exceeds ``limits.max_message_bytes``
- ``malformed_msgpack``  not decodable: bad or truncated msgpack, trailing
  bytes, invalid UTF-8, non-string map keys, nesting too deep, empty value;
  with ``input.format = "msgpack"`` a payload that looks like JSON says so in
  the detail ("... looks like JSON ...")
- ``malformed_json``     (``input.format`` json or auto) not decodable as
  UTF-8 JSON text, or nested too deeply (a string field holding an unpaired
  surrogate escape such as ``\\ud800``, which has no UTF-8 form, is that
  field's ``bad_*`` reason)
- ``not_a_document``     the value (or an array element) is not a map, or
  the value is null (a tombstone)
- ``empty_batch``        an array message with no elements
- ``too_many_documents`` an array message with more than
  ``limits.max_docs_per_message`` elements
- ``missing_id`` / ``bad_id``         ``id`` absent / of the wrong type or size
- ``missing_text``       neither ``text`` nor ``tokens``
- ``bad_text``           ``text`` not a string, or both ``text`` and ``tokens``
- ``bad_tokens``         ``tokens`` not an array of non-empty short strings
- ``text_too_large``     more than ``max_text_chars`` / ``max_tokens``
- ``empty_document``     blank text, no tokens, or (set by the daemon) no
  token left after tokenization
- ``bad_label``          ``label``/``labels`` of the wrong type or size, or both; or (set by
  the daemon) several ``labels`` for a model whose classifier is multi-class, or a new label
  past the classifier's cap (``max_labels``; the detail names it)
- ``bad_response`` / ``bad_ts``       not a finite number / out of range
- ``unknown_field``      a key outside the schema (the detail names it)

and, set by the daemon only (``DAEMON_REASONS``; ``ALL_REASONS`` is the union):

- ``model_error``        the model raised on this document (tokenizer or
  kernel failure); the daemon dead-letters the documents it can pin the
  failure on (or, when it cannot narrow it down, the whole batch) and goes on
- ``corrupt_record``     the Kafka client could not parse the record (a header
  key that is not UTF-8, a failed checksum); ``raw`` is empty, and the records
  after it in its record batch, which the client cannot reach, follow alike

``detail`` is a human-readable sentence (at most 300 characters) naming the
field and the problem. ``index`` is the element's position inside an array
message (null for whole-message failures). ``raw`` holds the bytes that failed:
the whole message, or, for one bad element of an array message, that
element's exact original bytes (itself a valid single-document message), so a
batch with many bad elements does not multiply into copies of the batch.

Validation is hand-written on purpose: msgspec was measured as a replacement (x1.6-1.7 decode
throughput) and not adopted, since it cannot keep these detail texts without this code as well
(docs/codec.md, bench/bench_codec.py).
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import msgpack

from ..supervised.targets import MAX_RESPONSE  # one bound for the library and the wire

__all__ = [
    "ALL_REASONS",
    "DAEMON_REASONS",
    "REASONS",
    "DeadLetter",
    "Document",
    "Limits",
    "FORMATS",
    "decode_dead_letter",
    "decode_message",
    "decode_prediction",
    "encode_dead_letter",
    "dead_letter_record",
    "encode_document",
    "encode_documents",
    "encode_prediction",
    "encode_predictions",
    "fill_record_meta",
    "is_array_message",
    "looks_like_json",
    "prediction_key",
    "sniff_format",
]

FORMATS: tuple[str, ...] = ("msgpack", "json", "auto")

REASONS: frozenset[str] = frozenset(
    {
        "message_too_large",
        "malformed_msgpack",
        "malformed_json",
        "not_a_document",
        "empty_batch",
        "too_many_documents",
        "missing_id",
        "bad_id",
        "missing_text",
        "bad_text",
        "bad_tokens",
        "text_too_large",
        "empty_document",
        "bad_label",
        "bad_response",
        "bad_ts",
        "unknown_field",
    }
)

# Set by the daemon, never by the decoder (the decoder's contract is REASONS).
DAEMON_REASONS: frozenset[str] = frozenset({"model_error", "corrupt_record"})
ALL_REASONS: frozenset[str] = REASONS | DAEMON_REASONS

MAX_ID_CHARS = 256
MAX_DETAIL_CHARS = 300
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
# 3000-01-01T00:00:00Z: later event times are clock or unit bugs (ms, µs).
MAX_TS = 32503680000.0
_KNOWN_KEYS = frozenset({"id", "text", "tokens", "label", "labels", "response", "ts"})


@dataclass(slots=True)
class Document:
    """One validated input document."""

    id: str | int
    text: str | None
    tokens: list[str] | None
    label: str | None
    labels: list[str] | None
    response: float | None
    ts: float | None


@dataclass
class Limits:
    """Input bounds; every one is configurable (``[limits]`` in the config)."""

    max_message_bytes: int = 1_048_576
    max_text_chars: int = 200_000
    max_tokens: int = 50_000
    max_token_chars: int = 100
    max_docs_per_message: int = 10_000
    max_labels: int = 64
    max_label_chars: int = 128

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Limits.{f.name} must be an integer >= 1 (got {v!r})")


@dataclass(slots=True)
class DeadLetter:
    """A message (or one element of an array message) that was not processed."""

    reason: str
    detail: str
    index: int | None = None
    topic: str = ""
    partition: int = -1
    offset: int = -1
    raw: bytes = b""
    key: bytes | None = None  # the source record's message key
    headers: list[tuple[str, bytes | None]] | None = None  # the source record's headers

    def __post_init__(self) -> None:
        # The reason set is a contract with dead-letter consumers: refuse new codes here.
        if self.reason not in ALL_REASONS:
            raise ValueError(f"unknown dead-letter reason {self.reason!r}")
        self.detail = _clip(str(self.detail))
        self.key = None if self.key is None else bytes(self.key)
        self.headers = _norm_headers(self.headers)


def _norm_headers(headers: Any) -> list[tuple[str, bytes | None]] | None:
    """Kafka record headers as a list of (str, bytes|None); None when there are none."""
    if not headers:
        return None
    out = []
    for k, v in headers:
        if isinstance(k, bytes):
            k = k.decode("utf-8", "replace")
        out.append((str(k), None if v is None else bytes(v)))
    return out


def fill_record_meta(dead: Iterable[DeadLetter], records: Iterable[Any]) -> None:
    """Give dead letters made after decoding (by the daemon: empty_document, model_error) the
    key and headers of their source record, matched by (topic, partition, offset)."""
    by_pos = None
    for dl in dead:
        if dl.key is not None or dl.headers is not None:
            continue
        if by_pos is None:
            by_pos = {(r.topic, r.partition, r.offset): r for r in records}
        rec = by_pos.get((dl.topic, dl.partition, dl.offset))
        if rec is not None:
            k = getattr(rec, "key", None)
            dl.key = None if k is None else bytes(k)
            dl.headers = _norm_headers(getattr(rec, "headers", None))


def sniff_format(raw: bytes) -> str:
    """``"json"`` when the first byte after ASCII whitespace / a UTF-8 BOM is ``{`` or ``[``, else ``"msgpack"``."""
    i = 3 if raw[:3] == b"\xef\xbb\xbf" else 0
    n = len(raw)
    while i < n and raw[i] in b" \t\r\n":
        i += 1
    return "json" if i < n and raw[i] in b"{[" else "msgpack"


def looks_like_json(raw: bytes) -> bool:
    """A JSON object or array by its first and last non-blank bytes (for a dead-letter hint)."""
    if sniff_format(raw) != "json":
        return False
    tail = raw.rstrip(b" \t\r\n")
    return tail[-1:] in (b"}", b"]")


def is_array_message(raw: bytes, fmt: str = "msgpack") -> bool:
    """Whether a message value is an array (minibatch) message in ``fmt`` (auto: sniffed)."""
    if not raw:
        return False
    if fmt == "auto":
        fmt = sniff_format(raw)
    if fmt == "json":
        return raw.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"["
    b = raw[0]
    return 0x90 <= b <= 0x9F or b in (0xDC, 0xDD)  # fixarray, array16, array32


class _Reject(Exception):
    """Internal: one document failed validation."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail


def _clip(s: str, n: int = MAX_DETAIL_CHARS) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _show(v: Any, n: int = 40) -> str:
    """Short repr of an untrusted value for a detail message."""
    try:
        r = repr(v)
    except Exception:  # a repr can fail only for exotic ext types; never let it escape
        r = f"<{type(v).__name__}>"
    return _clip(r, n)


def _tname(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, dict):
        return "map"
    if isinstance(v, list):
        return "array"
    if isinstance(v, bytes):
        return "bin"
    return type(v).__name__


# --------------------------------------------------------------------------- decoding


def decode_message(
    raw: bytes | None,
    limits: Limits,
    *,
    topic: str = "",
    partition: int = -1,
    offset: int = -1,
    fmt: str = "msgpack",
    key: bytes | None = None,
    headers: Iterable[tuple[str, bytes | None]] | None = None,
) -> tuple[list[Document], list[DeadLetter]]:
    """Decode one Kafka message value into documents and dead letters.

    Never raises: every failure becomes a ``DeadLetter`` carrying the source
    coordinates and the record's ``key`` and ``headers``. An array message yields
    its good documents plus one dead letter per bad element (``index`` set).
    ``fmt``: "msgpack", "json" or "auto" (module docstring).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS} (got {fmt!r})")
    hdrs = _norm_headers(headers)

    def dead(reason: str, detail: str, index: int | None = None, data: bytes | None = None) -> DeadLetter:
        return DeadLetter(reason, detail, index, topic, partition, offset, raw_bytes if data is None else data,
                          key, hdrs)

    if raw is None:
        raw_bytes = b""
        return [], [dead("not_a_document", "message value is null (a tombstone); expected a msgpack document")]
    if not isinstance(raw, bytes):
        try:
            raw_bytes = bytes(raw)  # bytearray / memoryview from some clients
        except Exception:
            raw_bytes = b""
            return [], [dead("malformed_msgpack", f"message value is {type(raw).__name__}, expected bytes")]
    else:
        raw_bytes = raw

    n = len(raw_bytes)
    if n > limits.max_message_bytes:
        return [], [dead("message_too_large", f"message is {n} bytes; the limit is {limits.max_message_bytes}")]
    if n == 0:
        return [], [dead("malformed_msgpack", "message value is empty")]

    kind = sniff_format(raw_bytes) if fmt == "auto" else fmt
    if kind == "json":
        try:
            text = raw_bytes.decode("utf-8-sig")
            obj = json.loads(text)
        except UnicodeDecodeError as e:
            return [], [dead("malformed_json", f"not UTF-8 JSON text ({e.reason} at byte {e.start})")]
        except RecursionError:
            return [], [dead("malformed_json", "JSON value is nested too deeply")]
        except ValueError as e:  # json.JSONDecodeError
            return [], [dead("malformed_json", f"invalid JSON: {e}")]
    else:
        text = None
        try:
            obj = msgpack.unpackb(raw_bytes, **_unpack_kwargs(limits, n))
        except Exception as e:  # ValueError family (ExtraData, FormatError, StackError, ...), TypeError, RecursionError, MemoryError
            detail = _unpack_error_detail(e)
            if looks_like_json(raw_bytes):
                detail = (f"{detail}; the payload looks like JSON: set input.format = \"json\" (or \"auto\") "
                          "to accept JSON documents")
            return [], [dead("malformed_msgpack", detail)]
    what = "JSON" if kind == "json" else "msgpack"

    if isinstance(obj, dict):
        try:
            return [_validate(obj, limits, utf8=text is not None)], []
        except _Reject as r:
            return [], [dead(r.reason, r.detail)]
        except Exception as e:  # a validator bug must not kill the consumer loop
            return [], [dead("not_a_document", f"could not validate document: {type(e).__name__}: {e}")]

    if not isinstance(obj, list):
        return [], [dead("not_a_document", f"message is a {what} {_tname(obj)}; expected a map or an array of maps")]
    if not obj:
        return [], [dead("empty_batch", "array message has no documents")]
    if len(obj) > limits.max_docs_per_message:
        return [], [
            dead(
                "too_many_documents",
                f"array message has {len(obj)} documents; the limit is {limits.max_docs_per_message}",
            )
        ]

    docs: list[Document] = []
    bad: list[tuple[int, str, str]] = []
    for i, el in enumerate(obj):
        if not isinstance(el, dict):
            bad.append((i, "not_a_document", f"element {i} is a {what} {_tname(el)}; expected a map"))
            continue
        try:
            docs.append(_validate(el, limits, utf8=text is not None))
        except _Reject as r:
            bad.append((i, r.reason, f"element {i}: {r.detail}"))
        except Exception as e:
            bad.append((i, "not_a_document", f"element {i}: could not validate: {type(e).__name__}: {e}"))
    if not bad:
        return docs, []
    if text is not None:
        spans = _json_element_spans(text, len(obj))
        dls = [dead(reason, detail, i, text[spans[i][0]:spans[i][1]].encode("utf-8") if spans else None)
               for i, reason, detail in bad]
        return docs, dls
    spans = _element_spans(raw_bytes, limits, len(obj))
    dls = [dead(reason, detail, i, raw_bytes[spans[i][0] : spans[i][1]] if spans else None) for i, reason, detail in bad]
    return docs, dls


_JSON_WS = " \t\r\n"


def _json_element_spans(text: str, count: int) -> list[tuple[int, int]] | None:
    """Character ranges of the elements of a JSON array message (already known to decode)."""
    try:
        dec = json.JSONDecoder()
        i = 0
        n = len(text)
        while i < n and text[i] in _JSON_WS:
            i += 1
        if text[i] != "[":
            return None
        i += 1
        spans = []
        for j in range(count):
            while text[i] in _JSON_WS:
                i += 1
            _, end = dec.raw_decode(text, i)
            spans.append((i, end))
            i = end
            while text[i] in _JSON_WS:
                i += 1
            if text[i] not in (",", "]"):
                return None
            i += 1
        return spans
    except (ValueError, IndexError, RecursionError):
        return None


def _unpack_kwargs(limits: Limits, n: int) -> dict[str, Any]:
    # Claimed lengths are bounded by the bytes actually present (every element
    # costs >= 1 byte), so a 5-byte header cannot make msgpack preallocate 4 GiB.
    # They are not cut tighter on purpose: an over-long token list should be
    # reported as text_too_large, not as malformed msgpack.
    bound = min(n, limits.max_message_bytes)
    return dict(
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_str_len=bound,
        max_bin_len=bound,
        max_array_len=bound,
        max_map_len=bound // 2,
        max_ext_len=bound,
    )


def _unpack_error_detail(e: BaseException) -> str:
    if isinstance(e, msgpack.ExtraData):
        return "trailing bytes after the msgpack value"
    if isinstance(e, msgpack.StackError) or isinstance(e, RecursionError):
        return "msgpack value is nested too deeply"
    if isinstance(e, msgpack.FormatError):
        return "not msgpack: invalid type byte"
    if isinstance(e, msgpack.OutOfData):
        return "truncated msgpack: incomplete input"
    if isinstance(e, UnicodeDecodeError):
        return f"a string is not valid UTF-8 ({e.reason} at byte {e.start})"
    msg = str(e) or type(e).__name__
    if "incomplete input" in msg:
        return "truncated msgpack: incomplete input"
    if "map key" in msg:
        return f"map keys must be strings: {msg}"
    return f"invalid msgpack: {type(e).__name__}: {msg}"


def _element_spans(raw: bytes, limits: Limits, count: int) -> list[tuple[int, int]] | None:
    """Byte ranges of the elements of an array message (already known to decode)."""
    try:
        u = msgpack.Unpacker(None, max_buffer_size=max(len(raw), 1), **_unpack_kwargs(limits, len(raw)))
        u.feed(raw)
        if u.read_array_header() != count:
            return None
        spans = []
        for _ in range(count):
            start = u.tell()
            u.skip()
            spans.append((start, u.tell()))
        return spans
    except Exception:
        return None  # fall back to the whole message as raw


def _unpaired_surrogate(s: str) -> int | None:
    """Where ``s`` holds an unpaired UTF-16 surrogate (None: nowhere). JSON's ``\\ud800``-
    ``\\udfff`` escapes decode to them when unpaired; they have no UTF-8 form, so the
    predictions producer, a snapshot or a dead letter could not encode a string holding one."""
    try:
        s.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return e.start


def _check_utf8(doc_id, text, tokens, label, labels) -> None:
    """A JSON document's strings must have a UTF-8 form (``_unpaired_surrogate``)."""
    fields = [("bad_id", "'id'", doc_id), ("bad_text", "'text'", text)]
    fields += [("bad_tokens", f"'tokens'[{i}]", t) for i, t in enumerate(tokens or ())]
    fields += [("bad_label", "'label'", label)] + [("bad_label", f"'labels'[{i}]", x) for i, x in enumerate(labels or ())]
    for reason, where, v in fields:
        at = _unpaired_surrogate(v) if isinstance(v, str) else None
        if at is not None:
            raise _Reject(reason, f"{where} holds an unpaired surrogate escape ({_show(v[at])} at character {at}); "
                                  "it has no UTF-8 form")


def _validate(d: dict, limits: Limits, utf8: bool = False) -> Document:
    """``utf8``: the strings came from JSON text, so check they have a UTF-8 form (msgpack's
    strings are decoded from UTF-8 and always have one)."""
    for k in d:
        if not isinstance(k, str):
            raise _Reject("malformed_msgpack", f"map keys must be strings: map key {_show(k)} is {type(k).__name__}")
    unknown = [k for k in d if k not in _KNOWN_KEYS]
    if unknown:
        names = ", ".join(_show(k) for k in unknown[:5])
        raise _Reject(
            "unknown_field",
            f"unknown field {names}; allowed fields: id, text, tokens, label, labels, response, ts",
        )

    doc_id = _check_id(d)

    has_text = "text" in d
    has_tokens = "tokens" in d
    if not has_text and not has_tokens:
        raise _Reject("missing_text", "document has neither 'text' nor 'tokens'")
    if has_text and has_tokens:
        raise _Reject("bad_text", "document has both 'text' and 'tokens'; send exactly one")
    text = tokens = None
    if has_text:
        text = d["text"]
        if not isinstance(text, str):
            raise _Reject("bad_text", f"'text' must be a string (got {_tname(text)})")
        if len(text) > limits.max_text_chars:
            raise _Reject("text_too_large", f"'text' has {len(text)} characters; the limit is {limits.max_text_chars}")
        if not text.strip():
            raise _Reject("empty_document", "'text' is empty or blank")
    else:
        tokens = d["tokens"]
        if not isinstance(tokens, list):
            raise _Reject("bad_tokens", f"'tokens' must be an array of strings (got {_tname(tokens)})")
        if len(tokens) > limits.max_tokens:
            raise _Reject("text_too_large", f"'tokens' has {len(tokens)} tokens; the limit is {limits.max_tokens}")
        if not tokens:
            raise _Reject("empty_document", "'tokens' is an empty array")
        for i, t in enumerate(tokens):
            if not isinstance(t, str):
                raise _Reject("bad_tokens", f"'tokens'[{i}] must be a string (got {_tname(t)})")
            if not t:
                raise _Reject("bad_tokens", f"'tokens'[{i}] is an empty string")
            if len(t) > limits.max_token_chars:
                raise _Reject(
                    "bad_tokens", f"'tokens'[{i}] has {len(t)} characters; the limit is {limits.max_token_chars}"
                )

    label, labels = _check_labels(d, limits)
    response = _check_number(d, "response", "bad_response", missing_ok=True, bound=MAX_RESPONSE)
    ts = _check_number(d, "ts", "bad_ts")
    if ts is not None and not (0.0 <= ts < MAX_TS):
        raise _Reject("bad_ts", f"'ts' must be seconds since the epoch in [0, {MAX_TS:.0f}) (got {_show(d['ts'])})")
    if utf8:
        _check_utf8(doc_id, text, tokens, label, labels)
    return Document(doc_id, text, tokens, label, labels, response, ts)


def _check_id(d: dict) -> str | int:
    if "id" not in d:
        raise _Reject("missing_id", "document has no 'id'")
    v = d["id"]
    if isinstance(v, bool):  # bool is an int subclass; True as an id is a producer bug
        raise _Reject("bad_id", "'id' must be a string or an integer (got bool)")
    if isinstance(v, int):
        if not (_INT64_MIN <= v <= _INT64_MAX):
            raise _Reject("bad_id", f"'id' integer {_show(v)} is outside int64")
        return v
    if isinstance(v, str):
        if not v:
            raise _Reject("bad_id", "'id' is an empty string")
        if len(v) > MAX_ID_CHARS:
            raise _Reject("bad_id", f"'id' has {len(v)} characters; the limit is {MAX_ID_CHARS}")
        return v
    raise _Reject("bad_id", f"'id' must be a string or an integer (got {_tname(v)})")


def _check_labels(d: dict, limits: Limits) -> tuple[str | None, list[str] | None]:
    # null is "no label", as None is in the library: producers writing a column with gaps (pandas,
    # JSON) send it for every unlabelled document, which were dead-lettered as bad_label
    d = {k: d[k] for k in ("label", "labels") if k in d and d[k] is not None}
    if "label" in d and "labels" in d:
        raise _Reject("bad_label", "document has both 'label' and 'labels'; send one")

    def one(v: Any, where: str) -> str:
        if not isinstance(v, str):
            raise _Reject("bad_label", f"{where} must be a string (got {_tname(v)})")
        if not v or len(v) > limits.max_label_chars:
            raise _Reject("bad_label", f"{where} must have 1 to {limits.max_label_chars} characters (got {len(v)})")
        return v

    if "label" in d:
        return one(d["label"], "'label'"), None
    if "labels" in d:
        v = d["labels"]
        if not isinstance(v, list):
            raise _Reject("bad_label", f"'labels' must be an array of strings (got {_tname(v)})")
        if len(v) > limits.max_labels:
            raise _Reject("bad_label", f"'labels' has {len(v)} labels; the limit is {limits.max_labels}")
        out = [one(x, f"'labels'[{i}]") for i, x in enumerate(v)]
        if len(set(out)) != len(out):
            raise _Reject("bad_label", "'labels' contains duplicates")
        return None, out
    return None, None


def _check_number(d: dict, key: str, reason: str, missing_ok: bool = False, bound: float = math.inf) -> float | None:
    """The number at ``key`` (None when absent). ``missing_ok``: null and NaN mean absent too (a
    regression target's "unlabelled", as in the library); ``bound``: the largest magnitude."""
    if key not in d:
        return None
    v = d[key]
    if missing_ok and (v is None or (isinstance(v, float) and math.isnan(v))):
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Reject(reason, f"'{key}' must be a number (got {_tname(v)} {_show(v, 20)})")
    try:
        f = float(v)
    except OverflowError:  # ints beyond float range
        raise _Reject(reason, f"'{key}' is too large to be a float") from None
    if not math.isfinite(f):
        raise _Reject(reason, f"'{key}' must be finite (got {_show(v, 20)})")
    if abs(f) > bound:
        raise _Reject(reason, f"'{key}' must be within +-{bound:g} (got {_show(v, 20)})")
    return f


# --------------------------------------------------------------------------- encoding


def _document_map(doc: Document) -> dict[str, Any]:
    m: dict[str, Any] = {"id": doc.id}
    if doc.text is not None:
        m["text"] = doc.text
    if doc.tokens is not None:
        m["tokens"] = list(doc.tokens)
    if doc.label is not None:
        m["label"] = doc.label
    if doc.labels is not None:
        m["labels"] = list(doc.labels)
    if doc.response is not None:
        m["response"] = doc.response
    if doc.ts is not None:
        m["ts"] = doc.ts
    return m


def encode_document(doc: Document) -> bytes:
    """One document as a single-document message (no validation: tests use it for bad input too)."""
    return msgpack.packb(_document_map(doc), use_bin_type=True)


def encode_documents(docs: Iterable[Document]) -> bytes:
    """Several documents as one array (minibatch) message."""
    return msgpack.packb([_document_map(d) for d in docs], use_bin_type=True)


def prediction_key(doc_id: str | int) -> bytes:
    """Kafka message key of a prediction: the document id as UTF-8 (ints in decimal)."""
    v = _norm_id(doc_id)
    return (v if isinstance(v, str) else str(v)).encode("utf-8")


def _norm_id(doc_id: Any) -> str | int:
    # numpy integer ids come back from arrays; msgpack cannot pack them, so make them int.
    if isinstance(doc_id, str):
        return doc_id
    if not isinstance(doc_id, bool):
        try:
            return operator.index(doc_id)
        except TypeError:
            pass
    raise TypeError(f"document id must be str or int, got {type(doc_id).__name__}")


def encode_prediction(
    doc_id: str | int,
    topics: Iterable[tuple[int, float]],
    *,
    label: str | None = None,
    labels: Iterable[str] | None = None,
    scores: Mapping[str, float] | None = None,
    response: float | None = None,
    model_version: int,
    ts: float,
    replica: str | None = None,
    scores_omitted: int | None = None,
) -> bytes:
    """Prediction message; numpy scalars are accepted and converted (msgpack cannot pack them).
    ``replica``: the replica that made it (replication on; ``model_version`` is then the update-log
    offset of the model that predicted)."""
    pairs = [[int(k), float(p)] for k, p in topics]
    pairs.sort(key=lambda kp: (-kp[1], kp[0]))  # ties by topic index: deterministic output
    extra = {"label": label, "labels": labels, "scores": scores, "response": response, "scores_omitted": scores_omitted}
    return encode_predictions([doc_id], [pairs], [extra], model_version=model_version, ts=ts, replica=replica)[0]


def encode_predictions(ids: list, topics: list[list[list]], extras: list[dict], *, model_version: int, ts: float,
                       replica: str | None = None) -> list[bytes]:
    """Prediction messages of a whole batch (``encode_prediction`` is this for one document): ``topics[i]`` holds document i's
    ``[topic, proportion]`` pairs already as int/float lists in message order (proportion
    descending, ties by topic index); ``extras[i]`` its ``label``/``labels``/``scores``/``response``
    (``predictions.label_fields``). The per-batch fields are converted once."""
    version, ts = int(model_version), float(ts)
    rep = None if replica is None else str(replica)
    pack = msgpack.Packer(use_bin_type=True).pack
    out = []
    for doc_id, pairs, extra in zip(ids, topics, extras):
        m: dict[str, Any] = {"id": doc_id if type(doc_id) is str else _norm_id(doc_id), "topics": pairs}
        if extra:
            if extra.get("label") is not None:
                m["label"] = str(extra["label"])
            if extra.get("labels") is not None:  # multi-label models: every label predicted on
                m["labels"] = [str(x) for x in extra["labels"]]
            if extra.get("scores") is not None:
                m["scores"] = {str(k): float(v) for k, v in extra["scores"].items()}
            if extra.get("scores_omitted"):  # a "scores" map cut to the message limit: the labels left out
                m["scores_omitted"] = int(extra["scores_omitted"])
            if extra.get("response") is not None:
                m["response"] = float(extra["response"])
        m["model_version"] = version
        if rep is not None:
            m["replica"] = rep
        m["ts"] = ts
        out.append(pack(m))
    return out


def decode_prediction(raw: bytes) -> dict[str, Any]:
    """Decode a prediction message; ``topics`` comes back as a list of ``(k, p)`` tuples.

    Raises ``ValueError`` if the bytes are not a prediction message.
    """
    m = _unpack_map(raw, "prediction")
    missing = {"id", "topics", "model_version", "ts"} - m.keys()
    if missing:
        raise ValueError(f"prediction message lacks {sorted(missing)}")
    if not isinstance(m["topics"], list) or not all(isinstance(t, list) and len(t) == 2 for t in m["topics"]):
        raise ValueError("prediction 'topics' must be an array of [topic, proportion] pairs")
    m["topics"] = [(int(k), float(p)) for k, p in m["topics"]]
    return m


def encode_dead_letter(dl: DeadLetter, *, ts: float, max_raw_bytes: int | None = None,
                       meta_in_map: bool = True) -> bytes:
    """Dead-letter message. ``raw`` is kept byte for byte unless it exceeds
    ``max_raw_bytes`` (e.g. a ``message_too_large`` payload that the producer
    could not send); then a prefix is kept and ``raw_truncated``/``raw_size``
    are added. The source record's key and headers are in the map as ``key``/``headers``,
    or, without ``meta_in_map`` (too large to carry twice: ``dead_letter_record``), only
    their sizes as ``key_size``/``headers_size``."""
    raw = bytes(dl.raw)
    m: dict[str, Any] = {
        "reason": dl.reason,
        "detail": dl.detail,
        "index": dl.index,
        "source": {"topic": dl.topic, "partition": int(dl.partition), "offset": int(dl.offset)},
        "raw": raw,
        "ts": float(ts),
    }
    if max_raw_bytes is not None and len(raw) > max_raw_bytes:
        m["raw"] = raw[: max(max_raw_bytes, 0)]
        m["raw_truncated"] = True
        m["raw_size"] = len(raw)
    if not meta_in_map:
        if dl.key is not None:
            m["key_size"] = len(dl.key)
        if dl.headers:
            m["headers_size"] = _headers_size(dl.headers)
        return msgpack.packb(m, use_bin_type=True)
    if dl.key is not None:
        m["key"] = bytes(dl.key)
    if dl.headers:
        m["headers"] = [[k, v] for k, v in dl.headers]
    return msgpack.packb(m, use_bin_type=True)


# Bytes a header costs beyond its key and value: two varint lengths on the wire (at most 5 bytes
# each), and in the dead letter's map a 2-element array with a str and a bin header (1 + 5 + 5).
# Without it, 5,000 headers of 24 bytes took a dead letter 62 kB past the producer's limit, and
# it was dropped (bad-input audit, 2026-11-29).
HEADER_OVERHEAD = 21


def _headers_size(headers) -> int:
    return sum(len(k.encode("utf-8")) + len(v or b"") for k, v in headers or ())


def _headers_cost(headers) -> int:
    """What ``headers`` take of a record's bytes: ``_headers_size`` plus their framing."""
    return _headers_size(headers) + HEADER_OVERHEAD * len(headers or ())


def dead_letter_record(dl: DeadLetter, *, ts: float, max_bytes: int) -> tuple[bytes, bytes | None, list | None]:
    """The dead-letter message and the key and headers to send it with, together within
    ``max_bytes`` (the producer's and broker's limit less a margin for the map's other fields).

    The source record's key and headers go out twice, in the map and as the record's own, and
    ``raw`` is cut to what is left. Key and headers over a quarter of the budget stay on the
    record only (the map gives their sizes); over half of it, the record goes without them too,
    so that the dead letter itself is never refused for its size."""
    meta = (len(dl.key) if dl.key is not None else 0) + _headers_cost(dl.headers)
    if 4 * meta <= max_bytes:
        return encode_dead_letter(dl, ts=ts, max_raw_bytes=max_bytes - 2 * meta), dl.key, dl.headers
    if 2 * meta <= max_bytes:
        value = encode_dead_letter(dl, ts=ts, max_raw_bytes=max_bytes - meta, meta_in_map=False)
        return value, dl.key, dl.headers
    return encode_dead_letter(dl, ts=ts, max_raw_bytes=max_bytes, meta_in_map=False), None, None


def decode_dead_letter(raw: bytes) -> dict[str, Any]:
    """Decode a dead-letter message (``raw`` as bytes). Raises ``ValueError`` on bad input."""
    m = _unpack_map(raw, "dead-letter")
    missing = {"reason", "detail", "index", "source", "raw", "ts"} - m.keys()
    if missing:
        raise ValueError(f"dead-letter message lacks {sorted(missing)}")
    if not isinstance(m["raw"], bytes):
        raise ValueError("dead-letter 'raw' must be msgpack bin")
    return m


def _unpack_map(raw: bytes, what: str) -> dict[str, Any]:
    try:
        m = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:
        raise ValueError(f"not a {what} message: {_unpack_error_detail(e)}") from e
    if not isinstance(m, dict):
        raise ValueError(f"not a {what} message: top level is {_tname(m)}, expected map")
    return m
