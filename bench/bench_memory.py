"""Memory and snapshot size of a supervised daemon over a long labelled stream (issue 14).

The daemon runs as a subprocess with the SHIPPED configuration (``config/streamtopics.toml``
unchanged) plus environment overrides for what a deployment must set anyway (broker address,
topic names, snapshot directory, metrics port) and ``model.supervision`` (default ``hinge``;
the shipped file has supervision off). Documents are 20 Newsgroups train (or the bundled
Reuters R8 without ../shared) recycled with fresh ids, each with its label (the newsgroup),
one document per message; the producer keeps the backlog under ``--max-lag`` documents.

Every ``--sample-s`` seconds one line: elapsed, documents learned, docs/s, RSS (MiB) of the
daemon and the size of its newest snapshot file (KiB). At the end: flatness after warm-up
(``--warmup`` documents): the largest deviation of a sample from the post-warm-up median, for
RSS and for snapshot size (target: within +-10 %). Results go to ``bench/results/memory.json``.

    python bench/bench_memory.py                          # 200,000 labelled documents
    python bench/bench_memory.py --docs 60000 --warmup 20000   # a quick look
    python bench/bench_memory.py --source /path/to/other/checkout   # run another checkout's daemon
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


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _newest_snapshot(d: Path) -> tuple[str, int]:
    best = ("", 0, 0.0)
    for p in d.glob("*.stsnap"):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if st.st_mtime >= best[2]:
            best = (p.name, st.st_size, st.st_mtime)
    return best[0], best[1]


def _flatness(values: list[float]) -> tuple[float, float]:
    med = statistics.median(values)
    return med, (max(abs(v - med) / med for v in values) if med else 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000, help="labelled documents to stream")
    ap.add_argument("--supervision", default="hinge", choices=("hinge", "logistic"))
    ap.add_argument("--chars", type=int, default=0, help="cut each document to this many characters (0: whole)")
    ap.add_argument("--max-lag", type=int, default=20000, help="producer waits while this many documents are unlearned")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--warmup", type=int, default=50_000, help="documents before flatness is judged")
    ap.add_argument("--max-minutes", type=float, default=60.0, help="give up after this long")
    ap.add_argument("--source", default=str(ROOT), help="checkout whose daemon runs (default: this one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "memory.json"))
    args = ap.parse_args(argv)

    source = Path(args.source).resolve()
    name, corpus = load_default_corpus("train")
    docs = [(d.text[: args.chars] if args.chars else d.text, d.label) for d in corpus]
    rng = np.random.default_rng(args.seed)
    work = Path(mkdtemp(prefix="streamtopics-memory-"))
    atexit.register(shutil.rmtree, work, True)
    broker = EmbeddedBroker()
    broker.start()
    atexit.register(broker.cleanup)
    create_topics(broker.bootstrap, {"mem-in": 1, "mem-out": 1, "mem-dlq": 1})
    port = free_port()
    snaps = work / "snaps"
    env = dict(os.environ, PYTHONPATH=str(source),
               STREAMTOPICS_KAFKA__BOOTSTRAP_SERVERS=broker.bootstrap,
               STREAMTOPICS_KAFKA__GROUP_ID="memory",
               STREAMTOPICS_TOPICS__INPUT="mem-in", STREAMTOPICS_TOPICS__OUTPUT="mem-out",
               STREAMTOPICS_TOPICS__DEAD_LETTER="mem-dlq",
               STREAMTOPICS_SNAPSHOT__DIR=str(snaps),
               STREAMTOPICS_METRICS__PORT=str(port),
               STREAMTOPICS_MODEL__SUPERVISION=args.supervision)
    log_path = work / "daemon.log"
    logf = open(log_path, "wb")
    cmd = [sys.executable, "-m", "streamtopics.cli", "run", "--config", str(source / "config" / "streamtopics.toml")]
    proc = subprocess.Popen(cmd, cwd=source, stdout=logf, stderr=subprocess.STDOUT, env=env)
    atexit.register(lambda: proc.poll() is None and proc.kill())
    url = f"http://127.0.0.1:{port}"
    print(f"memory: {args.docs:,} labelled documents ({name} train recycled with fresh ids), shipped config "
          f"{source / 'config' / 'streamtopics.toml'} + supervision={args.supervision}; daemon pid {proc.pid}",
          flush=True)

    processed = [0.0]
    produced = [0]
    stop = threading.Event()

    def produce():
        p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20, batch_size=1 << 20,
                          compression_type="zstd", acks=1, enable_idempotence=False, max_request_size=8 << 20)
        try:
            while produced[0] < args.docs and not stop.is_set():
                if produced[0] - processed[0] > args.max_lag:
                    time.sleep(0.05)
                    continue
                n = min(2000, args.docs - produced[0])
                for j in rng.integers(0, len(docs), n):
                    text, label = docs[j]
                    p.send("mem-in", msgpack.packb({"id": f"m{produced[0]}", "text": text, "label": label}))
                    produced[0] += 1
            p.flush(60)
        finally:
            p.close(10)

    samples = []
    t0 = time.monotonic()
    deadline = t0 + args.max_minutes * 60
    while not scrape_metrics(url, ("streamtopics_ready",)) and time.monotonic() < t0 + 180:
        if proc.poll() is not None:
            print(log_path.read_text()[-3000:])
            return 1
        time.sleep(0.2)
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    last_t, last_docs = time.monotonic(), 0.0
    print(f"{'t_s':>7} {'documents':>10} {'docs/s':>7} {'rss_MiB':>8} {'snap_KiB':>9}  snapshot", flush=True)
    try:
        while True:
            time.sleep(args.sample_s)
            if proc.poll() is not None:
                print("daemon died:\n" + log_path.read_text()[-3000:])
                return 1
            m = scrape_metrics(url, ("streamtopics_documents_total",))
            now = time.monotonic()
            n_docs = m.get("streamtopics_documents_total", last_docs)
            processed[0] = n_docs
            rss = _rss_mib(proc.pid)
            snap, size = _newest_snapshot(snaps)
            rate = (n_docs - last_docs) / (now - last_t)
            s = {"t": round(now - t0, 1), "documents": int(n_docs), "docs_per_s": round(rate, 1),
                 "rss_mib": round(rss, 1), "snapshot": snap, "snapshot_kib": round(size / 1024, 1)}
            samples.append(s)
            print(f"{s['t']:7.1f} {s['documents']:10,d} {rate:7.0f} {rss:8.1f} {s['snapshot_kib']:9.1f}  {snap}",
                  flush=True)
            last_t, last_docs = now, n_docs
            if n_docs >= args.docs or now > deadline:
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
    snap, size = _newest_snapshot(snaps)
    report = {"documents": int(last_docs), "target": args.docs, "seconds": round(last_t - t0, 1), "daemon_exit": rc,
              "source": str(source), "config": {k: v for k, v in vars(args).items() if k not in ("out", "source")},
              "corpus": name, "samples": samples, "final_snapshot_kib": round(size / 1024, 1)}
    post = [s for s in samples if s["documents"] >= args.warmup]
    post_snap = [s["snapshot_kib"] for s in post if s["snapshot_kib"] > 0]
    ok = False
    if len(post) >= 3 and len(post_snap) >= 2:
        rmed, rdev = _flatness([s["rss_mib"] for s in post])
        smed, sdev = _flatness(post_snap)
        ok = rdev <= 0.10 and sdev <= 0.10
        report.update({"rss_median_mib": round(rmed, 1), "rss_max_deviation": round(rdev, 4),
                       "rss_min_mib": min(s["rss_mib"] for s in post), "rss_max_mib": max(s["rss_mib"] for s in post),
                       "snapshot_median_kib": round(smed, 1), "snapshot_max_deviation": round(sdev, 4),
                       "snapshot_min_kib": min(post_snap), "snapshot_max_kib": max(post_snap),
                       "flat_within_10pct": ok})
        print(f"\nafter warm-up ({args.warmup:,} documents, {len(post)} samples): RSS median {rmed:.1f} MiB "
              f"(min {report['rss_min_mib']:.1f}, max {report['rss_max_mib']:.1f}), largest deviation {100 * rdev:.1f} %; "
              f"snapshot median {smed:.1f} KiB (min {min(post_snap):.1f}, max {max(post_snap):.1f}), largest deviation "
              f"{100 * sdev:.1f} % -> {'within' if ok else 'OUTSIDE'} +-10 %")
    else:
        print("\nnot enough samples after warm-up to judge flatness")
    print(f"documents learned {int(last_docs):,} of {args.docs:,} in {last_t - t0:.0f} s; final snapshot "
          f"{size / 1024:.1f} KiB; daemon exit code {rc}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {args.out}")
    return 0 if rc == 0 and int(last_docs) >= args.docs and ok else 1


if __name__ == "__main__":
    sys.exit(main())
