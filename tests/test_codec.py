"""Wire-format tests: every dead-letter reason from a concrete bad input, round trips,
and a bounded fuzz that decode_message never raises."""

from __future__ import annotations

import json
import math

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtopics.stream.codec import (
    REASONS,
    DeadLetter,
    Document,
    Limits,
    decode_dead_letter,
    decode_message,
    decode_prediction,
    dead_letter_record,
    encode_dead_letter,
    encode_document,
    encode_documents,
    encode_prediction,
    fill_record_meta,
    is_array_message,
    prediction_key,
    sniff_format,
)

LIMITS = Limits()


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def one_dead(obj_or_raw, limits: Limits = LIMITS) -> DeadLetter:
    raw = obj_or_raw if isinstance(obj_or_raw, (bytes, type(None))) else pack(obj_or_raw)
    docs, dls = decode_message(raw, limits, topic="in", partition=2, offset=41)
    assert docs == [] and len(dls) == 1, (docs, dls)
    dl = dls[0]
    assert dl.reason in REASONS
    assert (dl.topic, dl.partition, dl.offset) == ("in", 2, 41)
    assert len(dl.detail) <= 300
    return dl


def doc(**kw) -> dict:
    return {"id": "d1", "text": "the cat sat on the mat"} | kw


# --------------------------------------------------------------------------- round trips


def test_round_trip_full_document():
    d = Document("x-1", None, ["alpha", "beta"], None, ["a", "b"], 2.5, 1_700_000_000.25)
    docs, dls = decode_message(encode_document(d), LIMITS)
    assert dls == [] and docs == [d]


def test_round_trip_batch_and_int_ids():
    ds = [
        Document(i, f"text number {i}", None, "pos" if i % 2 else None, None, None, float(i))
        for i in range(5)
    ]
    docs, dls = decode_message(encode_documents(ds), LIMITS)
    assert dls == [] and docs == ds


def test_int_response_and_ts_become_float():
    docs, _ = decode_message(pack(doc(response=3, ts=10)), LIMITS)
    assert docs[0].response == 3.0 and isinstance(docs[0].response, float)
    assert docs[0].ts == 10.0 and isinstance(docs[0].ts, float)


def test_int64_bounds_for_ids():
    assert decode_message(pack(doc(id=2**63 - 1)), LIMITS)[0][0].id == 2**63 - 1
    assert decode_message(pack(doc(id=-(2**63))), LIMITS)[0][0].id == -(2**63)
    assert one_dead(doc(id=2**63)).reason == "bad_id"


def test_prediction_round_trip_sorted_and_optional_keys():
    raw = encode_prediction("d1", [(3, 0.1), (7, 0.6), (1, 0.3)], model_version=12, ts=5.0)
    m = decode_prediction(raw)
    assert m == {"id": "d1", "topics": [(7, 0.6), (1, 0.3), (3, 0.1)], "model_version": 12, "ts": 5.0}
    assert set(msgpack.unpackb(raw)) == {"id", "topics", "model_version", "ts"}

    raw = encode_prediction(9, [(0, 1.0)], label="pos", scores={"pos": 0.9, "neg": 0.1}, response=1.5,
                            model_version=1, ts=1.0)
    m = decode_prediction(raw)
    assert m["label"] == "pos" and m["scores"] == {"pos": 0.9, "neg": 0.1} and m["response"] == 1.5
    assert m["id"] == 9


def test_prediction_accepts_numpy_scalars():
    np = pytest.importorskip("numpy")
    raw = encode_prediction(np.int64(4), [(np.int64(2), np.float32(0.5))], model_version=np.int64(3), ts=np.float64(1))
    m = decode_prediction(raw)
    assert m["id"] == 4 and m["topics"] == [(2, 0.5)] and m["model_version"] == 3


def test_prediction_key():
    assert prediction_key("döc") == "döc".encode()
    assert prediction_key(-17) == b"-17"
    with pytest.raises(TypeError):
        prediction_key(True)


def test_decode_prediction_rejects_garbage():
    with pytest.raises(ValueError):
        decode_prediction(b"\xc1")
    with pytest.raises(ValueError):
        decode_prediction(pack([1, 2]))
    with pytest.raises(ValueError):
        decode_prediction(pack({"id": 1}))


def test_dead_letter_round_trip_keeps_raw_exactly():
    raw = bytes(range(256)) * 3
    dl = DeadLetter("malformed_msgpack", "bad", None, "documents", 3, 99, raw)
    m = decode_dead_letter(encode_dead_letter(dl, ts=12.5))
    assert m == {
        "reason": "malformed_msgpack",
        "detail": "bad",
        "index": None,
        "source": {"topic": "documents", "partition": 3, "offset": 99},
        "raw": raw,
        "ts": 12.5,
    }
    assert type(m["raw"]) is bytes


def test_dead_letter_from_decoder_round_trips():
    raw = b"\x92\x81\xa2id\x01\xc1"  # array whose second element is an invalid byte
    (dl,) = decode_message(raw, LIMITS, topic="t", partition=0, offset=7)[1]
    m = decode_dead_letter(encode_dead_letter(dl, ts=0.0))
    assert m["raw"] == raw and m["reason"] == "malformed_msgpack"


def test_dead_letter_raw_truncation_is_explicit():
    dl = DeadLetter("message_too_large", "big", raw=b"x" * 100)
    m = decode_dead_letter(encode_dead_letter(dl, ts=0.0, max_raw_bytes=10))
    assert m["raw"] == b"x" * 10 and m["raw_truncated"] is True and m["raw_size"] == 100
    m = decode_dead_letter(encode_dead_letter(dl, ts=0.0, max_raw_bytes=100))
    assert "raw_truncated" not in m and m["raw"] == b"x" * 100


def test_dead_letter_record_fits_key_and_headers_into_the_budget():
    dl = DeadLetter("bad_id", "x", raw=b"r" * 5000, key=b"k" * 100, headers=[("h", b"v" * 99)])
    value, key, headers = dead_letter_record(dl, ts=0.0, max_bytes=2000)   # 221 B (a header's framing: 21) twice + raw
    m = decode_dead_letter(value)
    assert key == b"k" * 100 and headers == [("h", b"v" * 99)] and m["key"] == key
    assert len(m["raw"]) == 2000 - 442 and m["raw_size"] == 5000
    value, key, headers = dead_letter_record(dl, ts=0.0, max_bytes=600)    # on the record only
    m = decode_dead_letter(value)
    assert key == b"k" * 100 and "key" not in m and m["key_size"] == 100 and m["headers_size"] == 100
    assert len(m["raw"]) == 600 - 221
    value, key, headers = dead_letter_record(dl, ts=0.0, max_bytes=300)    # neither
    m = decode_dead_letter(value)
    assert key is None and headers is None and m["key_size"] == 100 and len(m["raw"]) == 300
    plain = DeadLetter("bad_id", "x", raw=b"r" * 10)
    value, key, headers = dead_letter_record(plain, ts=0.0, max_bytes=300)
    assert key is None and headers is None and decode_dead_letter(value)["raw"] == b"r" * 10


def test_a_dead_letter_of_a_record_with_many_headers_stays_within_the_budget():
    """Bad-input audit: the budget counted a header's key and value but not its framing (two
    varints on the wire, an array with str and bin headers in the map), so a 2 MB bad value with
    5,000 trace headers gave a dead letter 62 kB over the producer's limit, and it was dropped."""
    for n, raw in ((5000, b"x" * 2_000_000), (3000, b"y" * 1_000_000), (300_000, b"z")):
        hs = [("trace-id", b"0123456789abcdef")] * n if n < 10_000 else [("", b"")] * n
        dl = DeadLetter("malformed_msgpack", "x", raw=raw, key=b"k" * 36, headers=hs)
        value, key, headers = dead_letter_record(dl, ts=0.0, max_bytes=1_000_000)
        on_wire = len(value) + len(key or b"") + sum(len(k) + len(v) + 10 for k, v in headers or ())
        assert on_wire <= 1_000_000 + 200, (n, on_wire)  # the map's other fields: the caller's margin


def test_dead_letter_rejects_unknown_reason_and_clips_detail():
    with pytest.raises(ValueError):
        DeadLetter("oops", "x")
    assert len(DeadLetter("bad_id", "y" * 1000).detail) == 300
    # the daemon builds this one itself after tokenization
    assert DeadLetter("empty_document", "no token left after tokenization", raw=b"r").reason == "empty_document"


def test_limits_validate():
    with pytest.raises(ValueError):
        Limits(max_tokens=0)


# --------------------------------------------------------------------------- each reason code


@pytest.mark.parametrize(
    "raw, detail_part",
    [
        (b"\xc1", "invalid type byte"),  # never-used msgpack byte
        (b"\xff\xfe\x00garbage", ""),
        (pack(doc())[:-3], "truncated"),
        (pack(doc()) + b"\x00", "trailing"),
        (b"\xa2\xff\xfe", "UTF-8"),
        (pack({1: "x"}), "map keys must be strings"),
        (pack({b"id": "a", "text": "x"}), "map keys must be strings"),  # bin keys too (was unknown_field)
        (b"\x91" * 5000 + b"\x01", "nested too deeply"),
        (b"", "empty"),
    ],
)
def test_malformed_msgpack(raw, detail_part):
    dl = one_dead(raw)
    assert dl.reason == "malformed_msgpack" and dl.index is None and dl.raw == raw
    assert detail_part in dl.detail


def test_none_value_is_not_a_document():
    dl = one_dead(None)
    assert dl.reason == "not_a_document" and "null" in dl.detail and dl.raw == b""


@pytest.mark.parametrize("obj", [5, "text", 1.5, None, True, b"bin"])
def test_top_level_scalar_is_not_a_document(obj):
    dl = one_dead(pack(obj))
    assert dl.reason == "not_a_document"


def test_message_too_large_vs_text_too_large():
    limits = Limits()
    big = pack(doc(text="x" * 10_000_000))  # 10 MB > 1 MiB: rejected before decoding
    assert len(big) > limits.max_message_bytes
    dl = one_dead(big, limits)
    assert dl.reason == "message_too_large" and str(limits.max_message_bytes) in dl.detail

    fits = pack(doc(text="x" * 300_000))  # under 1 MiB but more than 200k chars
    assert len(fits) <= limits.max_message_bytes
    dl = one_dead(fits, limits)
    assert dl.reason == "text_too_large" and "'text'" in dl.detail

    too_many_tokens = pack({"id": 1, "tokens": ["ab"] * 50_001})
    assert len(too_many_tokens) <= limits.max_message_bytes
    assert one_dead(too_many_tokens, limits).reason == "text_too_large"


def test_array_keeps_good_docs_and_dead_letters_bad_element():
    good1, bad, good2 = doc(id="a"), doc(id=True), doc(id="c")
    raw = pack([good1, bad, good2])
    docs, dls = decode_message(raw, LIMITS, topic="in", partition=0, offset=5)
    assert [d.id for d in docs] == ["a", "c"]
    (dl,) = dls
    assert dl.reason == "bad_id" and dl.index == 1 and "element 1" in dl.detail
    assert (dl.topic, dl.partition, dl.offset) == ("in", 0, 5)
    # raw is the bad element's own original bytes: replayable as a single message
    assert dl.raw == pack(bad) and dl.raw in raw


def test_array_element_not_a_map():
    docs, dls = decode_message(pack([doc(), [1, 2], 3]), LIMITS)
    assert len(docs) == 1
    assert [(d.reason, d.index) for d in dls] == [("not_a_document", 1), ("not_a_document", 2)]


def test_empty_batch_and_too_many_documents():
    assert one_dead([]).reason == "empty_batch"
    limits = Limits(max_docs_per_message=3)
    dl = one_dead([doc()] * 4, limits)
    assert dl.reason == "too_many_documents" and dl.index is None


@pytest.mark.parametrize(
    "obj, reason, detail_part",
    [
        ({"text": "hello"}, "missing_id", "'id'"),
        (doc(id=True), "bad_id", "bool"),
        (doc(id=1.5), "bad_id", "float"),
        (doc(id=""), "bad_id", "empty"),
        (doc(id="x" * 257), "bad_id", "257"),
        (doc(id=[1]), "bad_id", "array"),
        ({"id": 1}, "missing_text", "neither"),
        ({"id": 1, "text": "a", "tokens": ["a"]}, "bad_text", "both"),
        (doc(text=5), "bad_text", "'text'"),
        ({"id": 1, "tokens": "a b c"}, "bad_tokens", "'tokens'"),
        ({"id": 1, "tokens": ["a", 3]}, "bad_tokens", "'tokens'[1]"),
        ({"id": 1, "tokens": ["a", ""]}, "bad_tokens", "empty"),
        ({"id": 1, "tokens": ["a", "x" * 101]}, "bad_tokens", "101"),
        (doc(text="   \n\t "), "empty_document", "'text'"),
        (doc(text=""), "empty_document", "'text'"),
        ({"id": 1, "tokens": []}, "empty_document", "'tokens'"),
        (doc(label=3), "bad_label", "'label'"),
        (doc(label=""), "bad_label", "'label'"),
        (doc(labels=["a", 2]), "bad_label", "'labels'[1]"),
        (doc(labels="a"), "bad_label", "'labels'"),
        (doc(labels=["a", "a"]), "bad_label", "duplicates"),
        (doc(labels=[str(i) for i in range(65)]), "bad_label", "65"),
        (doc(label="a", labels=["b"]), "bad_label", "both"),
        (doc(response=1e101), "bad_response", "within +-1e+100"),
        (doc(response=math.inf), "bad_response", "finite"),
        (doc(response=-math.inf), "bad_response", "finite"),
        (doc(response="3"), "bad_response", "'response'"),
        (doc(response=True), "bad_response", "bool"),
        (doc(ts=-1), "bad_ts", "'ts'"),
        (doc(ts=math.nan), "bad_ts", "'ts'"),
        (doc(ts=4e10), "bad_ts", "'ts'"),
        (doc(ts="2024-01-01"), "bad_ts", "'ts'"),
        (doc(ts=False), "bad_ts", "bool"),
        (doc(colour="red"), "unknown_field", "'colour'"),
        (doc(**{"Text": "x"}), "unknown_field", "'Text'"),
        ({b"id": 1, "text": "x"}, "malformed_msgpack", "b'id'"),  # a bin key: non-string (audit)
    ],
)
def test_reason_codes(obj, reason, detail_part):
    dl = one_dead(obj)
    assert dl.reason == reason, dl
    assert detail_part in dl.detail, dl.detail
    assert dl.index is None and dl.raw == pack(obj)


def test_null_label_and_null_or_nan_response_are_unlabelled():
    """A producer writing a column with gaps (pandas, JSON) sends null for every unlabelled
    document; they were dead-lettered as bad_label / bad_response, so a mostly unlabelled stream
    lost most of its documents. The library takes None and NaN as unlabelled; so does the wire."""
    for extra in ({"label": None}, {"labels": None}, {"response": None}, {"response": math.nan},
                  {"label": None, "response": math.nan}):
        docs, dead = decode_message(pack(doc(**extra)), LIMITS)
        assert dead == [] and len(docs) == 1, extra
        assert (docs[0].label, docs[0].labels, docs[0].response) == (None, None, None)
    docs, dead = decode_message(pack(doc(label=None, labels=["x"])), LIMITS)
    assert dead == [] and docs[0].labels == ["x"]
    docs, dead = decode_message(b'{"id": "j", "text": "hi there", "label": null, "response": NaN}', LIMITS, fmt="json")
    assert dead == [] and docs[0].label is None and docs[0].response is None


def test_every_reason_is_reachable_from_the_tests():
    # keeps REASONS and this file honest together
    produced = {
        one_dead(x).reason
        for x in [b"\xc1", pack(5), pack([]), {"text": "a"}, doc(id=1.5), {"id": 1}, doc(text=1),
                  {"id": 1, "tokens": [1]}, doc(text=" "), doc(label=1), doc(response="x"), doc(ts=-1),
                  doc(zz=1), doc(text="x" * 300_000), pack(doc(text="x" * 2_000_000))]
    }
    produced.add(one_dead([doc()] * 3, Limits(max_docs_per_message=2)).reason)
    produced.add(decode_message(b'{"id": 1, "text": ', LIMITS, fmt="json")[1][0].reason)
    assert produced == REASONS


def test_valid_edge_values():
    docs, dls = decode_message(pack(doc(id="x" * 256, ts=0, response=-1e100, labels=[])), LIMITS)
    assert dls == [] and docs[0].labels == [] and docs[0].ts == 0.0


# --------------------------------------------------------------------------- properties

_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_nested = st.recursive(
    _leaf,
    lambda ch: st.lists(ch, max_size=5) | st.dictionaries(st.text(max_size=8) | st.binary(max_size=4), ch, max_size=5),
    max_leaves=30,
)
_keys = st.sampled_from(["id", "text", "tokens", "label", "labels", "response", "ts", "x"])
_docish = st.dictionaries(_keys, _nested, max_size=7)
_values = _nested | _docish | st.lists(_docish | _nested, max_size=6)


def _check_outcome(raw: bytes, docs, dls) -> None:
    for d in docs:
        assert isinstance(d, Document)
        assert isinstance(d.id, (str, int)) and not isinstance(d.id, bool)
        assert (d.text is None) != (d.tokens is None)
        if d.text is not None:
            assert d.text.strip()
        else:
            assert d.tokens and all(isinstance(t, str) and t for t in d.tokens)
        assert d.label is None or d.labels is None
        for f in (d.response, d.ts):
            assert f is None or (isinstance(f, float) and math.isfinite(f))
    for dl in dls:
        assert isinstance(dl, DeadLetter) and dl.reason in REASONS and len(dl.detail) <= 300
        assert dl.raw in raw
        decode_dead_letter(encode_dead_letter(dl, ts=0.0))  # always encodable


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_decode_never_raises_on_arbitrary_bytes(raw):
    docs, dls = decode_message(raw, Limits(max_message_bytes=200))
    _check_outcome(raw, docs, dls)
    assert docs or dls


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_decode_never_raises_on_arbitrary_msgpack(value):
    raw = pack(value)
    docs, dls = decode_message(raw, LIMITS)
    _check_outcome(raw, docs, dls)
    assert docs or dls
    if isinstance(value, list) and value:
        assert len(docs) + len(dls) == len(value)  # one outcome per element


@settings(max_examples=300, deadline=None)
@given(
    st.builds(
        Document,
        id=st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(min_size=1, max_size=256),
        text=st.text(min_size=1, max_size=50).filter(str.strip),
        tokens=st.none(),
        label=st.none() | st.text(min_size=1, max_size=128),
        labels=st.none(),
        response=st.none() | st.floats(min_value=-1e100, max_value=1e100),
        ts=st.none() | st.floats(min_value=0, max_value=32503679999),
    )
)
def test_valid_documents_round_trip(d):
    docs, dls = decode_message(encode_document(d), LIMITS)
    assert dls == [] and docs == [d]



# --------------------------------------------------------------------------- issue 14: JSON input, key/headers
JSON_DOC = b'{"id": "j1", "text": "the cat sat on the mat", "label": "pets", "ts": 1700000000.5}'


def test_json_payload_under_msgpack_format_says_it_looks_like_json():
    """Before issue 14 a JSON document was dead-lettered as 'trailing bytes after the msgpack
    value' with no hint of what was wrong."""
    for raw in (JSON_DOC, b"  [" + JSON_DOC + b"]\n"):
        (dl,) = decode_message(raw, LIMITS, topic="in", partition=0, offset=3)[1]
        assert dl.reason == "malformed_msgpack" and "looks like JSON" in dl.detail, dl.detail
        assert 'input.format = "json"' in dl.detail
    (dl,) = decode_message(b"\xc1\x00", LIMITS)[1]  # plain garbage: no JSON hint
    assert "JSON" not in dl.detail


@pytest.mark.parametrize("fmt", ["json", "auto"])
def test_json_documents_decode_with_the_same_schema(fmt):
    (d,), dls = decode_message(JSON_DOC, LIMITS, fmt=fmt)
    assert dls == [] and (d.id, d.text, d.label, d.ts) == ("j1", "the cat sat on the mat", "pets", 1700000000.5)
    raw = ('\ufeff[{"id": 1, "tokens": ["a", "b"]}, {"id": 2, "text": "x", "colour": "red"},'
           ' {"id": 3, "labels": ["a", "b"], "text": "\u732b\u304c\u3044\u308b"}]').encode("utf-8")
    docs, dls = decode_message(raw, LIMITS, fmt=fmt, topic="in", partition=1, offset=9)
    assert [d.id for d in docs] == [1, 3] and docs[1].text == "\u732b\u304c\u3044\u308b"
    (dl,) = dls
    assert dl.reason == "unknown_field" and dl.index == 1 and "'colour'" in dl.detail
    assert json.loads(dl.raw) == {"id": 2, "text": "x", "colour": "red"}  # the element's own text
    assert is_array_message(raw, fmt) and not is_array_message(JSON_DOC, fmt)


def test_auto_format_sniffs_each_message_and_msgpack_still_works():
    raw = pack(doc(id="m1"))
    assert sniff_format(raw) == "msgpack" and sniff_format(b" \n{") == "json"
    (d,), _ = decode_message(raw, LIMITS, fmt="auto")
    assert d.id == "m1"
    assert is_array_message(pack([doc()]), "auto")
    with pytest.raises(ValueError):
        decode_message(raw, LIMITS, fmt="xml")


@pytest.mark.parametrize("raw,part", [
    (b'{"id": 1, "text": ', "invalid JSON"),
    (b'{"id": 1, "text": "\xff"}', "not UTF-8"),
    (b"[" * 100_000, "nested too deeply"),
])
def test_malformed_json(raw, part):
    (dl,) = decode_message(raw, LIMITS, fmt="json")[1]
    assert dl.reason == "malformed_json" and part in dl.detail, dl.detail


def test_json_values_of_the_wrong_type_get_the_usual_reasons():
    for raw, reason in [(b'"just a string"', "not_a_document"), (b"[]", "empty_batch"),
                        (b'{"id": 1, "text": "x", "response": Infinity}', "bad_response"),
                        (b'{"id": true, "text": "x"}', "bad_id")]:
        (dl,) = decode_message(raw, LIMITS, fmt="json")[1]
        assert dl.reason == reason, (raw, dl)


@pytest.mark.parametrize("raw, reason, where", [
    (b'{"id": "sur\\ud800id", "text": "space shuttle"}', "bad_id", "'id'"),
    (b'{"id": 1, "text": "lone \\udfff here"}', "bad_text", "'text'"),
    (b'{"id": 1, "tokens": ["a", "\\ud800"]}', "bad_tokens", "'tokens'[1]"),
    (b'{"id": 1, "text": "x", "label": "b\\udfff"}', "bad_label", "'label'"),
    (b'{"id": 1, "text": "x", "labels": ["a", "b\\ud800"]}', "bad_label", "'labels'[1]"),
])
def test_json_strings_without_a_utf8_form_are_dead_letters(raw, reason, where):
    """JSON's unpaired surrogate escapes decode to strings with no UTF-8 form. Accepted, one in an
    id stopped the publisher (a crash loop: the record came back after every restart) and one in
    a label made every snapshot fail; now the field's reason, with a dead letter that encodes."""
    docs, (dl,) = decode_message(raw, LIMITS, fmt="json")
    assert docs == [] and dl.reason == reason and dl.detail.startswith(f"{where} holds an unpaired surrogate")
    assert decode_dead_letter(encode_dead_letter(dl, ts=1.0))["reason"] == reason
    # a surrogate pair is one character with a UTF-8 form: accepted
    (doc,), dead = decode_message(b'{"id": 1, "text": "smile \\ud83d\\ude00", "label": "\\ud83d\\ude00"}', LIMITS,
                                  fmt="json")
    assert dead == [] and doc.text == "smile \U0001F600" and doc.label == "\U0001F600"


def test_dead_letters_keep_the_record_key_and_headers():
    """Before issue 14 a dead letter dropped the source record's key and headers."""
    hdrs = [("trace-id", b"abc"), ("tenant", None)]
    (dl,) = decode_message(pack({"id": 1}), LIMITS, topic="in", partition=0, offset=5, key=b"k-1", headers=hdrs)[1]
    assert dl.key == b"k-1" and dl.headers == hdrs
    m = decode_dead_letter(encode_dead_letter(dl, ts=1.0))
    assert m["key"] == b"k-1" and m["headers"] == [["trace-id", b"abc"], ["tenant", None]]
    # dead letters made later (the daemon's empty_document / model_error) get them from the record
    class Rec:
        topic, partition, offset, key, headers = "in", 0, 6, b"k-2", [("h", b"v")]
    late = DeadLetter("empty_document", "no token left", None, "in", 0, 6, b"x")
    other = DeadLetter("empty_document", "no token left", None, "in", 0, 7, b"y")
    fill_record_meta([late, other], [Rec()])
    assert late.key == b"k-2" and late.headers == [("h", b"v")]
    assert other.key is None and other.headers is None
    m = decode_dead_letter(encode_dead_letter(other, ts=1.0))
    assert "key" not in m and "headers" not in m
