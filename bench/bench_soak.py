"""Soak: a long stream through the daemon against the real broker; memory, fds, threads, docs/s.

The daemon runs as a subprocess (``python -m streamtopics.cli run``) so its resident memory,
open file descriptors and threads can be read from ``/proc/<pid>``; its counters come from
its own ``/metrics``. A producer thread streams 20 Newsgroups train documents resampled with
replacement (cut to ``--chars`` characters), each with ``--new-words`` never-seen synthetic
words appended, so the vocabulary grows without bound and the vocabulary cap (policy
``evict``) and the memoized window (``update = "memoized"``, ``memo_window``) must keep the
model's size bounded. Array messages of ``--per-message`` documents; the producer keeps the
backlog under ``--max-lag`` documents (the broker keeps everything in memory).

Every ``--sample-s`` seconds one line: elapsed, documents, docs/s since the last sample,
RSS (MiB), open fds, threads, vocabulary size. At the end: flatness of RSS after warm-up
(``--warmup`` documents), i.e. the largest deviation of a sample from the post-warm-up
median (target: within +-10 %), docs/s steadiness (last quarter vs first quarter after
warm-up) and fd/thread growth.

    python bench/bench_soak.py                          # 1,000,000 documents
    python bench/bench_soak.py --docs 100000 --sample-s 5   # a quick look
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import atexit
import json
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from tempfile import mkdtemp

import msgpack
import numpy as np
from kafka import KafkaProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_probe import free_port, scrape_metrics  # noqa: E402

from streamtopics.corpora import load_default_corpus  # noqa: E402
from streamtopics.testing.broker import EmbeddedBroker, create_topics  # noqa: E402

RESULTS = Path(__file__).with_name("results")


def _toml(d: dict) -> str:
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)
    return "\n".join(f"[{s}]\n" + "\n".join(f"{k} = {val(v)}" for k, v in kv.items()) for s, kv in d.items()) + "\n"


def _letters(n: int) -> str:
    """n in base 26 as letters (the tokenizer keeps letters only)."""
    out = []
    while True:
        n, r = divmod(n, 26)
        out.append(chr(97 + r))
        if n == 0:
            return "".join(out)


def _proc_stats(pid: int) -> tuple[float, int, int]:
    rss_kb, threads = 0, 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss_kb / 1024.0, fds, threads


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--topics", type=int, default=20, help="K")
    ap.add_argument("--chars", type=int, default=600, help="each 20NG document cut to this many characters")
    ap.add_argument("--new-words", type=int, default=2, help="never-seen synthetic words per document")
    ap.add_argument("--vocab-cap", type=int, default=30000)
    ap.add_argument("--memo-window", type=int, default=64)
    ap.add_argument("--max-docs", type=int, default=256, help="batch.max_docs")
    ap.add_argument("--per-message", type=int, default=16, help="documents per array message")
    ap.add_argument("--max-lag", type=int, default=60000, help="producer waits while this many documents are unprocessed")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--warmup", type=int, default=200_000, help="documents before flatness is judged")
    ap.add_argument("--max-minutes", type=float, default=90.0, help="give up after this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "soak.json"))
    args = ap.parse_args(argv)

    name, corpus = load_default_corpus("train")
    texts = [d.text[: args.chars] for d in corpus]
    rng = np.random.default_rng(args.seed)
    work = Path(mkdtemp(prefix="streamtopics-soak-"))
    atexit.register(shutil.rmtree, work, True)
    broker = EmbeddedBroker()
    broker.start()
    atexit.register(broker.cleanup)
    create_topics(broker.bootstrap, {"soak-in": 1, "soak-out": 1, "soak-dlq": 1})
    port = free_port()
    cfg = {
        "kafka": {"bootstrap_servers": broker.bootstrap, "group_id": "soak", "create_topics": False},
        "topics": {"input": "soak-in", "output": "soak-out", "dead_letter": "soak-dlq"},
        "model": {"n_topics": args.topics, "update": "memoized", "memo_window": args.memo_window,
                  "vocab_cap": args.vocab_cap, "vocab_policy": "evict", "seed": args.seed},
        "batch": {"max_docs": args.max_docs, "max_wait_ms": 500},
        "snapshot": {"dir": str(work / "snaps"), "every_batches": 0, "every_seconds": 60.0, "keep": 2},
        "metrics": {"host": "127.0.0.1", "port": port},
        "logging": {"level": "INFO", "format": "json"},
    }
    (work / "soak.toml").write_text(_toml(cfg))
    log_path = work / "daemon.log"
    logf = open(log_path, "wb")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "streamtopics.cli", "run", "--config", str(work / "soak.toml")],
                            cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, env=env)
    atexit.register(lambda: proc.poll() is None and proc.kill())
    url = f"http://127.0.0.1:{port}"
    print(f"soak: {args.docs:,} documents ({name} train resampled, <= {args.chars} chars, "
          f"+{args.new_words} new words each), K={args.topics}, memoized window {args.memo_window}, "
          f"vocab cap {args.vocab_cap} (evict); daemon pid {proc.pid}", flush=True)

    processed = [0.0]
    produced = [0]
    stop = threading.Event()

    def produce():
        p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20, batch_size=1 << 20,
                          compression_type="zstd", acks=1, enable_idempotence=False, max_request_size=8 << 20)
        word = 0
        try:
            while produced[0] < args.docs and not stop.is_set():
                if produced[0] - processed[0] > args.max_lag:
                    time.sleep(0.05)
                    continue
                n = min(args.per_message * 256, args.docs - produced[0])
                idx = rng.integers(0, len(texts), n)
                for s in range(0, n, args.per_message):
                    msg = []
                    for j in idx[s:s + args.per_message]:
                        extra = " ".join("zq" + _letters(word + i) for i in range(args.new_words))
                        word += args.new_words
                        msg.append({"id": produced[0], "text": texts[j] + " " + extra})
                        produced[0] += 1
                    p.send("soak-in", msgpack.packb(msg))
            p.flush(60)
        finally:
            p.close(10)

    samples = []
    t0 = time.monotonic()
    deadline = t0 + args.max_minutes * 60
    # Wait for the daemon's endpoint, then stream.
    while not scrape_metrics(url, ("streamtopics_ready",)) and time.monotonic() < t0 + 120:
        if proc.poll() is not None:
            print(log_path.read_text()[-3000:])
            return 1
        time.sleep(0.2)
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    last_t, last_docs = time.monotonic(), 0.0
    print(f"{'t_s':>7} {'documents':>10} {'docs/s':>8} {'rss_MiB':>8} {'fds':>4} {'thr':>4} {'vocab':>7}", flush=True)
    try:
        while True:
            time.sleep(args.sample_s)
            if proc.poll() is not None:
                print("daemon died:\n" + log_path.read_text()[-3000:])
                return 1
            m = scrape_metrics(url, ("streamtopics_documents_total", "streamtopics_vocabulary_size",
                              "streamtopics_dead_letters_total"))
            now = time.monotonic()
            docs = m.get("streamtopics_documents_total", last_docs)
            processed[0] = docs
            rss, fds, thr = _proc_stats(proc.pid)
            rate = (docs - last_docs) / (now - last_t)
            s = {"t": round(now - t0, 1), "documents": int(docs), "docs_per_s": round(rate, 1),
                 "rss_mib": round(rss, 1), "fds": fds, "threads": thr,
                 "vocab": int(m.get("streamtopics_vocabulary_size", 0))}
            samples.append(s)
            print(f"{s['t']:7.1f} {s['documents']:10,d} {rate:8.0f} {rss:8.1f} {fds:4d} {thr:4d} {s['vocab']:7d}",
                  flush=True)
            last_t, last_docs = now, docs
            if docs >= args.docs or now > deadline:
                break
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        logf.close()

    post = [s for s in samples if s["documents"] >= args.warmup]
    report = {"documents": int(last_docs), "target": args.docs, "seconds": round(last_t - t0, 1),
              "daemon_exit": rc, "config": {k: v for k, v in vars(args).items() if k != "out"},
              "corpus": name, "samples": samples}
    if len(post) >= 3:
        rss = [s["rss_mib"] for s in post]
        med = statistics.median(rss)
        dev = max(abs(r - med) / med for r in rss)
        # The first sample spans the warm-up boundary, the last one the end of the stream.
        rates = [s["docs_per_s"] for s in post[1:-1]] or [s["docs_per_s"] for s in post]
        q = max(1, len(rates) // 4)
        report.update({
            "rss_median_mib": round(med, 1), "rss_min_mib": min(rss), "rss_max_mib": max(rss),
            "rss_max_deviation": round(dev, 4), "rss_flat_within_10pct": dev <= 0.10,
            "docs_per_s_mean": round(statistics.mean(rates), 1), "docs_per_s_min": min(rates),
            "docs_per_s_max": max(rates),
            "docs_per_s_last_vs_first_quarter": round(statistics.mean(rates[-q:]) / max(1e-9, statistics.mean(rates[:q])), 3),
            "fds_first_last": [post[0]["fds"], post[-1]["fds"]], "fds_max": max(s["fds"] for s in post),
            "threads_first_last": [post[0]["threads"], post[-1]["threads"]],
            "threads_max": max(s["threads"] for s in post),
        })
        print(f"\nafter warm-up ({args.warmup:,} documents, {len(post)} samples): RSS median {med:.1f} MiB, "
              f"min {min(rss):.1f}, max {max(rss):.1f}, largest deviation {100 * dev:.1f} % "
              f"({'within' if dev <= 0.10 else 'OUTSIDE'} +-10 %)")
        print(f"docs/s mean {report['docs_per_s_mean']:.0f} (min {min(rates):.0f}, max {max(rates):.0f}); "
              f"last quarter / first quarter = {report['docs_per_s_last_vs_first_quarter']:.2f}")
        print(f"fds {post[0]['fds']} -> {post[-1]['fds']} (max {report['fds_max']}), "
              f"threads {post[0]['threads']} -> {post[-1]['threads']} (max {report['threads_max']})")
    else:
        print("\nnot enough samples after warm-up to judge flatness")
    print(f"documents processed {int(last_docs):,} of {args.docs:,} in {last_t - t0:.0f} s; daemon exit code {rc}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {args.out}")
    return 0 if rc == 0 and int(last_docs) >= args.docs else 1


if __name__ == "__main__":
    sys.exit(main())
