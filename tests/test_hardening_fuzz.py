"""Bad input of every kind: property tests over the decoder, a mutation fuzz run, and a fuzzed
stream through the live daemon (real broker on loopback).

The decoder's contract (``streamtopics.stream.codec.decode_message``): it never raises; every
message yields at least one document or one dead letter; every dead letter carries a reason
from the fixed set ``REASONS``, a detail of at most 300 characters and its source
coordinates; an array message accounts for each element exactly once.
"""
from __future__ import annotations

import copy
import math
import random
import struct
import time
from collections import Counter

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtopics.config import Config
from streamtopics.corpora import load_reuters_r8
from streamtopics.stream.codec import REASONS, Limits, decode_dead_letter, decode_message, decode_prediction

from test_daemon import _cfg_dict, _consumed, _produce, _read_all, _running, _samples, _topics, _wait  # noqa: E402

LIMITS = Limits(max_message_bytes=65536, max_text_chars=2000, max_tokens=200, max_token_chars=30,
                max_docs_per_message=20, max_labels=5, max_label_chars=16)
FIELDS = ("id", "text", "tokens", "label", "labels", "response", "ts")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_contract(raw, limits: Limits = LIMITS) -> tuple[list, list]:
    docs, dead = decode_message(raw, limits, topic="t", partition=3, offset=77)
    assert docs or dead, "a message must yield a document or a dead letter"
    for dl in dead:
        assert dl.reason in REASONS, dl.reason
        assert dl.detail and len(dl.detail) <= 300
        assert (dl.topic, dl.partition, dl.offset) == ("t", 3, 77)
        assert isinstance(dl.raw, bytes)
    return docs, dead


# --------------------------------------------------------------------------- strategies

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40), st.binary(max_size=40))
_values = st.recursive(
    _scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=6), st.dictionaries(st.text(max_size=8), kids, max_size=6)),
    max_leaves=30)
_ids = st.one_of(st.text(min_size=1, max_size=20), st.integers(min_value=-(2**63), max_value=2**63 - 1))
_good_doc = st.fixed_dictionaries(
    {"id": _ids, "text": st.text(alphabet="abcdefghij klmnop", min_size=1, max_size=60).filter(str.strip)},
    optional={"label": st.text(min_size=1, max_size=16), "response": st.floats(min_value=-1e100, max_value=1e100),
              "ts": st.floats(min_value=0, max_value=4e9)})
# A value of a type the field never accepts.
_int = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what msgpack can carry
_WRONG = {
    "id": st.one_of(st.none(), st.booleans(), st.floats(), st.binary(), st.lists(_int, max_size=2),
                    st.dictionaries(st.text(max_size=3), _int, max_size=2)),
    "text": st.one_of(st.none(), st.booleans(), _int, st.floats(), st.binary(), st.lists(st.text(), max_size=2)),
    "tokens": st.one_of(st.none(), st.booleans(), _int, st.text(), st.binary(),
                        st.lists(st.one_of(_int, st.none(), st.binary()), min_size=1, max_size=3)),
    # (null label / labels / response, and a NaN response, mean "unlabelled": not wrong)
    "label": st.one_of(st.booleans(), _int, st.floats(), st.binary(), st.lists(st.text(), max_size=2)),
    "labels": st.one_of(st.booleans(), _int, st.text(), st.binary(),
                        st.lists(st.one_of(_int, st.none()), min_size=1, max_size=3)),
    "response": st.one_of(st.booleans(), st.text(), st.binary(), st.lists(st.floats(), max_size=2),
                          st.sampled_from([math.inf, -math.inf, 1e101, -1e300])),
    "ts": st.one_of(st.none(), st.booleans(), st.text(), st.binary(), st.sampled_from([math.nan, math.inf, -1.0, 1e12])),
}
_REASON_OF = {"id": "bad_id", "text": "bad_text", "tokens": "bad_tokens", "label": "bad_label", "labels": "bad_label",
              "response": "bad_response", "ts": "bad_ts"}


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes_never_raise(raw):
    _check_contract(raw)


@SETTINGS
@given(_values)
def test_any_msgpack_value_never_raises(value):
    _check_contract(msgpack.packb(value, use_bin_type=True))


@FEW
@given(st.lists(_values, min_size=1, max_size=LIMITS.max_docs_per_message))
def test_array_message_accounts_for_every_element_once(values):
    docs, dead = _check_contract(msgpack.packb(values, use_bin_type=True))
    assert len(docs) + len(dead) == len(values)
    assert len({dl.index for dl in dead}) == len(dead)
    for dl in dead:  # the element's own bytes, itself a single-element message
        assert dl.raw == msgpack.packb(values[dl.index], use_bin_type=True)


@SETTINGS
@given(_good_doc, st.sampled_from(FIELDS), st.data())
def test_a_wrong_type_in_any_field_names_that_field(doc, field, data):
    doc = dict(doc)
    if field == "tokens":
        doc.pop("text")
    if field == "labels":
        doc.pop("label", None)
    if field == "label":
        doc.pop("labels", None)
    doc[field] = data.draw(_WRONG[field])
    docs, dead = _check_contract(msgpack.packb(doc, use_bin_type=True))
    assert not docs and len(dead) == 1
    assert dead[0].reason == _REASON_OF[field], (field, doc[field], dead[0])


@SETTINGS
@given(_good_doc, st.integers(min_value=0))
def test_truncated_messages_are_malformed(doc, cut):
    raw = msgpack.packb(doc, use_bin_type=True)
    cut = cut % len(raw)  # a strict prefix
    docs, dead = _check_contract(raw[:cut])
    assert not docs and dead[0].reason == "malformed_msgpack"


@SETTINGS
@given(st.binary(min_size=1, max_size=20).filter(lambda b: _invalid_utf8(b)), st.sampled_from(["id", "text", "label"]))
def test_non_utf8_strings_are_malformed(bad, field):
    body = {"id": "x", "text": "fine words", "label": "y"}
    # msgpack str (not bin) holding invalid UTF-8, written by hand: no library would produce it.
    parts = [b"\x83"]
    for k, v in body.items():
        parts.append(msgpack.packb(k))
        parts.append((b"\xd9" + bytes([len(bad)]) + bad) if k == field else msgpack.packb(v))
    docs, dead = _check_contract(b"".join(parts))
    assert not docs and dead[0].reason == "malformed_msgpack" and "UTF-8" in dead[0].detail


def _invalid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@SETTINGS
@given(st.integers(min_value=1, max_value=200_000), st.sampled_from([b"\x91", b"\x81\xa1k"]))
def test_deep_nesting_is_bounded(depth, opener):
    t0 = time.perf_counter()
    docs, dead = _check_contract(opener * depth + b"\xc0", Limits(max_message_bytes=1 << 22))
    assert not docs and dead[0].reason in {"malformed_msgpack", "not_a_document", "unknown_field"}
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("header", [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                                    b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01"])
def test_huge_claimed_lengths_do_not_allocate(header):
    t0 = time.perf_counter()
    docs, dead = _check_contract(header + b"\x00" * 16)
    assert dead[0].reason == "malformed_msgpack" and time.perf_counter() - t0 < 0.1


@SETTINGS
@given(st.integers(min_value=1, max_value=3))
def test_oversized_fields_and_messages(extra):
    lim = LIMITS
    cases = [
        ({"id": "a", "text": "w" * (lim.max_text_chars + extra)}, "text_too_large"),
        ({"id": "a", "tokens": ["w"] * (lim.max_tokens + extra)}, "text_too_large"),
        ({"id": "a", "tokens": ["w" * (lim.max_token_chars + extra)]}, "bad_tokens"),
        ({"id": "a" * (256 + extra), "text": "w"}, "bad_id"),
        ({"id": "a", "text": "w", "labels": [str(i) for i in range(lim.max_labels + extra)]}, "bad_label"),
        ([{"id": i, "text": "w"} for i in range(lim.max_docs_per_message + extra)], "too_many_documents"),
    ]
    for obj, reason in cases:
        docs, dead = _check_contract(msgpack.packb(obj))
        assert not docs and [d.reason for d in dead] == [reason]
    big = msgpack.packb({"id": "a", "text": "w " * lim.max_message_bytes})
    assert _check_contract(big)[1][0].reason == "message_too_large"


@SETTINGS
@given(st.lists(_good_doc, min_size=2, max_size=5), st.text(min_size=1, max_size=16))
def test_duplicate_ids_and_unknown_labels_are_accepted(docs_in, label):
    # Ids are the producer's business (predictions are keyed by id, downstream deduplicates);
    # any label is accepted (the label vocabulary grows).
    same = [dict(d, id="dup", label=label) for d in docs_in]
    docs, dead = _check_contract(msgpack.packb(same))
    assert not dead and [d.id for d in docs] == ["dup"] * len(same) and all(d.label == label for d in docs)


@SETTINGS
@given(_good_doc, st.text(min_size=1, max_size=10).filter(lambda k: k not in FIELDS))
def test_unknown_fields_are_rejected(doc, key):
    docs, dead = _check_contract(msgpack.packb(dict(doc, **{key: 1})))
    assert not docs and dead[0].reason == "unknown_field"


@SETTINGS
@given(st.sampled_from([math.nan, math.inf, -math.inf]), st.sampled_from(["response", "ts"]))
def test_nan_and_inf_numbers(x, field):
    docs, dead = _check_contract(msgpack.packb({"id": 1, "text": "w", field: x}))
    if field == "response" and math.isnan(x):  # NaN is "unlabelled", as in the library
        assert docs and docs[0].response is None and not dead
    else:
        assert not docs and dead[0].reason == ("bad_response" if field == "response" else "bad_ts")


# --------------------------------------------------------------------------- mutation fuzz run


def _seeds(n: int = 200) -> list[bytes]:
    corpus = load_reuters_r8("train")[:n]
    out = [msgpack.packb({"id": d.id, "text": d.text[:300], "label": d.label}) for d in corpus]
    out += [msgpack.packb([{"id": d.id, "tokens": d.text.split()[:20]} for d in corpus[i:i + 4]])
            for i in range(0, n, 4)]
    return out


_TYPE_BYTES = bytes([0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC9, 0xCA, 0xCB, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF,
                     0x90, 0x9F, 0x80, 0x8F, 0xA0, 0xBF, 0xFF, 0x7F, 0x00])


_ODD = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, math.nan, math.inf, -math.inf, -1e300,
        "", " ", "\x00", "\u200b" * 3, "ünïcödé", "x" * 3000, b"", b"\xff\xfe", [], [1, "a"], [""], {}, {"a": 1},
        [[[[]]]], ["w"] * 300, {"id": 1}, 1e12, -5]


def _mutate_value(rng: random.Random, raw: bytes) -> bytes:
    """Structure-aware: decode a seed, damage its documents' fields, re-encode."""
    obj = msgpack.unpackb(raw, raw=False)
    docs = obj if isinstance(obj, list) else [obj]
    for _ in range(rng.randint(1, 3)):
        d = rng.choice([x for x in docs if isinstance(x, dict)] or [{}])
        op = rng.randrange(5)
        key = rng.choice(FIELDS)
        if op == 0:
            d[key] = copy.deepcopy(rng.choice(_ODD))
        elif op == 1:
            d.pop(rng.choice(list(d) or ["id"]), None)
        elif op == 2:
            d[rng.choice(["colour", "Text", "", "id ", "tokens\x00"])] = copy.deepcopy(rng.choice(_ODD))
        elif op == 3:
            docs.append(copy.deepcopy(rng.choice(_ODD)))
        else:
            docs.append(dict(d))  # a duplicate id
    value = docs if isinstance(obj, list) or rng.random() < 0.3 else docs[0]
    return msgpack.packb(value, use_bin_type=rng.random() < 0.5)


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    if rng.random() < 0.5:
        return _mutate_value(rng, rng.choice(seeds))
    b = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        if not b:
            b = bytearray(rng.choice(seeds))
        i = rng.randrange(len(b))
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.choice(_TYPE_BYTES)
        elif op == 2:
            del b[i:i + rng.randint(1, 8)]
        elif op == 3:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 4:
            b = b[:i]
        elif op == 5:
            other = rng.choice(seeds)
            b = b[:i] + other[rng.randrange(len(other)):]
        elif op == 6:
            j = rng.randrange(len(b))
            b[i:i] = b[min(i, j):max(i, j)][:64]
        else:
            b[i:i + 4] = struct.pack(">I", rng.choice([0, 1, 255, 65535, 2**31, 2**32 - 1]))
    return bytes(b)


def fuzz_decoder(n: int, seed: int = 0) -> Counter:
    rng = random.Random(seed)
    seeds = _seeds()
    outcomes: Counter = Counter()
    for _ in range(n):
        docs, dead = _check_contract(mutate(rng, seeds))
        outcomes["documents"] += len(docs)
        for dl in dead:
            outcomes[dl.reason] += 1
        outcomes["messages"] += 1
    return outcomes


def _report(outcomes: Counter, seconds: float) -> None:
    print(f"\ndecoder fuzz: {outcomes['messages']:,} messages in {seconds:.1f} s, 0 exceptions; "
          f"documents {outcomes['documents']:,}; dead letters by reason: "
          + ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items()) if k in REASONS))


def test_decoder_fuzz_run_reduced():
    t0 = time.perf_counter()
    out = fuzz_decoder(20_000, seed=1)
    _report(out, time.perf_counter() - t0)
    assert out["messages"] == 20_000 and out["documents"] > 0 and out["malformed_msgpack"] > 0


@pytest.mark.slow
def test_decoder_fuzz_run_full():
    t0 = time.perf_counter()
    out = fuzz_decoder(200_000, seed=2)
    _report(out, time.perf_counter() - t0)
    assert out["messages"] == 200_000


# --------------------------------------------------------------------------- through the live daemon


def _fuzzed_stream(n_bad: int, n_good: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    seeds = _seeds(100)
    good = [msgpack.packb({"id": f"good-{i}", "text": d.text[:400]})
            for i, d in enumerate(load_reuters_r8("train")[200:200 + n_good])]
    bad = [mutate(rng, seeds) for _ in range(n_bad)]
    bad += [b"", msgpack.packb(None), b"\x91" * 50_000 + b"\xc0", b"\xdd\xff\xff\xff\xff",
            msgpack.packb({"id": "huge", "text": "w " * 700_000}),
            msgpack.packb([{"id": "d", "text": "oil"}, {"id": "d", "text": "oil"}])]
    values = good + bad
    rng.shuffle(values)
    return values


def test_fuzzed_stream_through_the_daemon_every_bad_message_is_dead_lettered(broker, fresh_topic, tmp_path):
    topics = _topics(fresh_topic)
    values = _fuzzed_stream(300, 100, seed=5)
    offsets = _produce(broker.bootstrap, topics["input"], values, max_request_size=4 << 20)
    cfg = Config.from_dict(_cfg_dict(broker.bootstrap, topics, tmp_path / "snaps"), env={})
    limits = cfg.limits()
    expect_dead = Counter()
    expect_docs = 0
    for off, v in zip(offsets, values):
        docs, dead = decode_message(v, limits)
        expect_docs += len(docs)
        for dl in dead:
            expect_dead[(off, dl.index, dl.reason)] += 1
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(values)), 60, "the fuzzed stream consumed")
        s = _samples(d.metrics_url)
        assert d.status()["ready"] and d.health()[0]
    dls = [decode_dead_letter(r.value) for r in _read_all(broker.bootstrap, topics["dead_letter"],
                                                          want=sum(expect_dead.values()))]
    got = Counter((dl["source"]["offset"], dl["index"], dl["reason"]) for dl in dls)
    empties = Counter(k for k in got.elements() if k[2] == "empty_document") - expect_dead
    assert got - empties == expect_dead  # every codec dead letter, with its reason, exactly once
    preds = [decode_prediction(r.value) for r in _read_all(broker.bootstrap, topics["output"], want=1, timeout_s=5)]
    assert len(preds) + sum(empties.values()) == expect_docs  # every document predicted or found empty
    assert s[("streamtopics_documents_total", ())] == len(preds)
    print(f"\nlive fuzz: {len(values)} messages, {expect_docs} documents decoded, {len(preds)} predicted, "
          f"{len(dls)} dead letters: " + ", ".join(f"{k} {v}" for k, v in
                                                   sorted(Counter(dl['reason'] for dl in dls).items())))
