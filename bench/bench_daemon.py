"""Benchmark of the whole path: Kafka -> daemon -> Kafka, against the library alone.

1. Throughput. All documents are produced first; then the daemon (in-process, the
   repository's config/streamtopics.toml with the bootstrap overridden and periodic
   snapshots off) consumes them. Timed from the start of its first batch to the end of
   its last. The library alone runs the same work on the same batches (tokenize,
   prepare, local step + global update, theta) from memory, with a fresh model of the
   same settings. Overhead = daemon time / library time - 1 (target <= 15 %).
2. Latency. A producer thread sends documents at a fixed rate (default 300 docs/s for
   30 s), each stamped with ``ts`` at send time; the daemon's own end-to-end latency
   (document ``ts`` -> prediction acknowledged by the broker) is recorded per document.
   Reported for the default batching (max_docs 256, max_wait 1000 ms) and a
   low-latency setting (max_docs 32, max_wait 50 ms, fetch_max_wait 10 ms).

    python bench/bench_daemon.py                  # 20NG train (or R8), K from the config (100)
    python bench/bench_daemon.py --quick          # 3,072 documents, 10 s of latency
    python bench/bench_daemon.py --topics 20 --rate 500 --seconds 20
    python bench/bench_daemon.py --threads-scaling --skip-latency   # + the daemon at threads 1 vs 2

3. Threads (``--threads-scaling``): the daemon's sustained docs/s with ``[model] threads = 1``
   and ``= 2`` on the same produced topic, alternating rounds (a new group each), the ratio of
   each round's pair and their median (issue 18's target: >= 1.7x on two cores).
4. Where the time goes (``--profile``, only this): at threads 1 and 2, every thread's CPU from
   the first batch to the last, and per thread the wall and CPU time between the daemon's hook
   points (wall minus CPU: waiting for the GIL, the other core, I/O). ``--gil-probe`` (only
   this): what a GIL-holding Python thread costs the model's threads (docs/architecture.md,
   "Threads: where the daemon's time goes").

numba kernels are compiled (or loaded from cache) before anything is timed.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import logging
import sys
import threading
import time
import tomllib
from pathlib import Path
import atexit
import shutil
from tempfile import mkdtemp as _mkdtemp

import msgpack
import numpy as np
from kafka import KafkaProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamtopics.config import Config  # noqa: E402
from streamtopics.corpora import load_default_corpus  # noqa: E402
from streamtopics.config import model_from_config
from streamtopics.daemon import Daemon  # noqa: E402
from streamtopics.service.hooks import Hooks  # noqa: E402
from streamtopics.logs import setup_logging  # noqa: E402
from streamtopics.testing.broker import EmbeddedBroker, create_topics  # noqa: E402
from daemon_probe import StageClock, thread_cpu, thread_cpu_delta  # noqa: E402

RESULTS = Path(__file__).with_name("results")


def mkdtemp(prefix: str) -> str:
    """A private scratch directory, removed at exit (final snapshots of K=100 models are ~70 MB)."""
    d = _mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, True)
    return d


def config(bootstrap: str, snap_dir: str, topics: dict, **sections) -> Config:
    data = tomllib.loads((ROOT / "config" / "streamtopics.toml").read_text())
    data["kafka"].update(bootstrap_servers=bootstrap, session_timeout_ms=3000, heartbeat_interval_ms=1000,
                         group_id=f"bench-{time.monotonic_ns()}", create_topics=False)
    data["topics"].update(topics)
    data["snapshot"].update(dir=snap_dir, every_batches=0, every_seconds=0)
    data["metrics"].update(port=0)
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.from_dict(data, env={})


def produce_all(bootstrap: str, topic: str, docs) -> float:
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10, batch_size=262144,
                      compression_type="zstd", enable_idempotence=False)
    t0 = time.perf_counter()
    for d in docs:
        p.send(topic, msgpack.packb({"id": d.id, "text": d.text, "label": d.label}, use_bin_type=True))
    p.flush(timeout=120)
    dt = time.perf_counter() - t0
    p.close(timeout=5)
    return dt


class LoopCpu:
    """CPU seconds of the daemon's loop thread from its first batch to the end of its last,
    measured through the daemon's hook points (no patching of its methods)."""

    def __init__(self) -> None:
        self.cpu0: float | None = None
        self.cpu1: float | None = None

    def __call__(self, point: str) -> None:
        if point == "batch_received" and self.cpu0 is None:
            self.cpu0 = time.thread_time()
        elif point == "submitted":
            self.cpu1 = time.thread_time()


def run_daemon_until(cfg: Config, done, timeout_s: float = 600, clock: StageClock | None = None):
    """Run a daemon until ``done(d)``. ``clock``: also book the wall and CPU time between its
    hook points per thread, and every thread's CPU from the first batch on (``d.thread_cpu``)."""
    hooks = Hooks.default()
    cpu = LoopCpu()
    hooks.add(cpu)
    start: dict = {}
    if clock is not None:
        def first_batch(point: str) -> None:
            if point == "batch_received" and not start:
                start.update(thread_cpu())
                clock.active = True
        hooks.add(first_batch)
        hooks.add(clock)
    d = Daemon(cfg, hooks=hooks)
    d.loop_cpu = cpu
    t = threading.Thread(target=d.run, daemon=True, name="daemon-loop")
    t.start()
    d.wait_started(60)
    deadline = time.monotonic() + timeout_s
    try:
        while not done(d) and time.monotonic() < deadline:
            time.sleep(0.01)
        if clock is not None:
            clock.active = False
            d.thread_cpu = thread_cpu_delta(start, thread_cpu())
    finally:
        d.stop()
        t.join(120)
    return d


def warm_up(cfg: Config, texts) -> None:
    m = model_from_config(cfg.model)
    for i in range(0, 512, 256):
        b = m.prepare(m.tokenize(texts[i:i + 256]))
        m.theta(m.process(b, learn=True, batch_key=str(i)).doc_topic)


def library_alone(cfg: Config, texts, batch: int) -> tuple[float, int]:
    m = model_from_config(cfg.model)
    tokens = 0
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        b = m.prepare(m.tokenize(texts[i:i + batch]), grow=True)
        tokens += b.n_tokens
        m.theta(m.process(b, learn=True, batch_key=f"lib:{i}").doc_topic)
    return time.perf_counter() - t0, tokens


def throughput(broker, corpus, args) -> dict:
    topics = {"input": "tp-in", "output": "tp-out", "dead_letter": "tp-dlq"}
    create_topics(broker.bootstrap, {v: 1 for v in topics.values()})
    extra = {"model": {"n_topics": args.topics}} if args.topics else {}
    cfg = config(broker.bootstrap, mkdtemp(prefix="bench-snaps-"), topics, **extra)
    # Whole batches only: a partial last batch would add a max_wait_ms pause to the daemon's time.
    corpus = corpus[: len(corpus) - len(corpus) % cfg.batch.max_docs]
    texts = [d.text for d in corpus]
    warm_up(cfg, texts)
    produce_s = produce_all(broker.bootstrap, topics["input"], corpus)
    n = len(corpus)
    runs = []
    for r in range(args.repeats):  # alternate, so machine noise hits both sides alike
        cfg = config(broker.bootstrap, mkdtemp(prefix="bench-snaps-"), topics, **extra)  # a new group
        c0 = time.process_time()
        d = run_daemon_until(cfg, lambda d: d.status().get("offsets", {}).get("tp-in:0", 0) >= n)
        daemon_cpu = time.process_time() - c0  # every thread of this process: start-up, Kafka I/O, shutdown
        st = d.status()
        daemon_s = st["last_batch_at"] - st["first_batch_at"]
        loop_cpu = d.loop_cpu.cpu1 - d.loop_cpu.cpu0
        c0 = time.process_time()
        lib_s, lib_tokens = library_alone(cfg, texts, cfg.batch.max_docs)
        lib_cpu = time.process_time() - c0
        assert st["documents"] == n and st["tokens"] == lib_tokens, (st["documents"], st["tokens"], lib_tokens)
        stages = {}
        for fam in d.metrics.registry.collect():
            if fam.name == "streamtopics_batch_duration_seconds":
                for s in fam.samples:
                    if s.name.endswith("_sum"):
                        stages[s.labels["stage"]] = round(s.value, 3)
        runs.append({"daemon_seconds": round(daemon_s, 3), "library_seconds": round(lib_s, 3),
                     "overhead": round(daemon_s / lib_s - 1, 4), "daemon_cpu_seconds": round(daemon_cpu, 3),
                     "loop_thread_cpu_seconds": round(loop_cpu, 3), "cpu_overhead": round(loop_cpu / lib_cpu - 1, 4),
                     "library_cpu_seconds": round(lib_cpu, 3), "stage_seconds": stages})
        print(f"  run {r + 1}: wall: daemon {daemon_s:.2f} s, library {lib_s:.2f} s, overhead "
              f"{daemon_s / lib_s - 1:+.1%} | CPU: daemon loop thread {loop_cpu:.2f} s vs library {lib_cpu:.2f} s "
              f"({loop_cpu / lib_cpu - 1:+.1%}); whole daemon process incl. start-up, Kafka I/O threads, "
              f"publisher, shutdown {daemon_cpu:.2f} s", flush=True)
    daemon_s = min(x["daemon_seconds"] for x in runs)
    lib_s = min(x["library_seconds"] for x in runs)
    return {
        "documents": n, "tokens": lib_tokens, "n_topics": cfg.model.n_topics, "max_docs": cfg.batch.max_docs,
        "produce_docs_per_s": round(n / produce_s),
        "daemon_seconds": daemon_s, "daemon_docs_per_s": round(n / daemon_s, 1),
        "daemon_tokens_per_s": round(lib_tokens / daemon_s),
        "library_seconds": lib_s, "library_docs_per_s": round(n / lib_s, 1),
        "library_tokens_per_s": round(lib_tokens / lib_s),
        "overhead": round(daemon_s / lib_s - 1, 4),
        "overhead_median_of_pairs": round(float(np.median([x["overhead"] for x in runs])), 4),
        "cpu_overhead_median": round(float(np.median([x["cpu_overhead"] for x in runs])), 4),
        "runs": runs,
    }


def _threads_topics(broker, corpus, args, prefix: str):
    """(topics, model settings, config, corpus cut to whole batches) of a threads run on fresh topics."""
    topics = {"input": f"{prefix}-in", "output": f"{prefix}-out", "dead_letter": f"{prefix}-dlq"}
    create_topics(broker.bootstrap, {v: 1 for v in topics.values()})
    extra = {"n_topics": args.topics} if args.topics else {}
    cfg = config(broker.bootstrap, mkdtemp(prefix="bench-snaps-"), topics, model=extra)
    return topics, extra, cfg, corpus[: len(corpus) - len(corpus) % cfg.batch.max_docs]


def threads_scaling(broker, corpus, args) -> dict:
    """Daemon docs/s at [model] threads = 1 and 2 on one produced topic, alternating rounds."""
    topics, extra, cfg, corpus = _threads_topics(broker, corpus, args, "th")
    n = len(corpus)
    produce_all(broker.bootstrap, topics["input"], corpus)
    rounds = []
    for r in range(args.repeats):
        rate = {}
        for threads in (1, 2):
            cfg = config(broker.bootstrap, mkdtemp(prefix="bench-snaps-"), topics, model={**extra, "threads": threads})
            d = run_daemon_until(cfg, lambda d: d.status().get("offsets", {}).get("th-in:0", 0) >= n)
            st = d.status()
            rate[threads] = n / (st["last_batch_at"] - st["first_batch_at"])
        rounds.append({"threads_1_docs_per_s": round(rate[1], 1), "threads_2_docs_per_s": round(rate[2], 1),
                       "ratio": round(rate[2] / rate[1], 3), "load_average": round(os.getloadavg()[0], 2)})
        print(f"  round {r + 1}: threads=1 {rate[1]:,.0f} docs/s, threads=2 {rate[2]:,.0f} docs/s, "
              f"ratio {rate[2] / rate[1]:.2f}x (load {os.getloadavg()[0]:.2f})", flush=True)
    return {"documents": n, "rounds": rounds, "ratio_median": round(float(np.median([x["ratio"] for x in rounds])), 3)}


def profile(broker, corpus, args) -> dict:
    """Where the daemon's time goes at threads 1 and 2: each thread's CPU from the first batch to
    the last, and per thread the wall and CPU time between consecutive hook points."""
    topics, extra, cfg, corpus = _threads_topics(broker, corpus, args, "pr")
    n = len(corpus)
    warm_up(cfg, [d.text for d in corpus])
    produce_all(broker.bootstrap, topics["input"], corpus)
    out = {}
    for threads in (1, 2):
        cfg = config(broker.bootstrap, mkdtemp(prefix="bench-snaps-"), topics, model={**extra, "threads": threads})
        clock = StageClock()
        d = run_daemon_until(cfg, lambda d: d.status().get("offsets", {}).get("pr-in:0", 0) >= n, clock=clock)
        st = d.status()
        wall = st["last_batch_at"] - st["first_batch_at"]
        cpu = {k: round(v, 3) for k, v in sorted(d.thread_cpu.items(), key=lambda x: -x[1])}
        out[threads] = {"docs_per_s": round(n / wall, 1), "seconds": round(wall, 3), "thread_cpu": cpu,
                        "cpu_total": round(sum(cpu.values()), 3), "load_average": round(os.getloadavg()[0], 2),
                        "segments": {f"{t} {seg}": [round(clock.wall[(t, seg)], 3), round(clock.cpu[(t, seg)], 3)]
                                     for t, seg in clock.wall}}
        print(f"  threads={threads}: {n / wall:,.0f} docs/s, {wall:.2f} s wall, CPU {sum(cpu.values()):.2f} s "
              f"(load {os.getloadavg()[0]:.2f})")
        for name, v in cpu.items():
            print(f"    cpu {name:30s} {v:6.2f} s")
        print("\n".join(clock.table()))
    return out


def gil_probe(corpus, args, rounds: int = 3) -> dict:
    """What a GIL-holding Python thread costs the model's threads: 30 batches learned at
    ``threads = 2`` alone, beside a thread that runs ~6 ms of pure Python every 30 ms (the
    publisher's sends, the read-ahead's decoding) holding the GIL throughout, and beside the same
    thread releasing it every 0.75 ms (``time.sleep(0)``, as the publisher does every
    ``producer.YIELD_EVERY`` messages). Paired rounds, wall seconds."""
    base = config("127.0.0.1:9", mkdtemp(prefix="bench-snaps-"), {}, model={"threads": 2})
    texts = [d.text for d in corpus]
    tok = model_from_config(base.model)
    batches = [tok.tokenize(texts[i:i + 256]) for i in range(0, min(len(texts), 30 * 256), 256)]
    stop = threading.Event()

    def python_bursts(release: bool) -> None:
        while not stop.is_set():
            for _ in range(8):
                x = 0
                for i in range(8000):
                    x += i * i % 7
                if release:
                    time.sleep(0)
            time.sleep(0.024)

    def one(mode: str) -> float:
        m = model_from_config(base.model)
        stop.clear()
        th = threading.Thread(target=python_bursts, args=(mode == "releasing",)) if mode != "alone" else None
        if th is not None:
            th.start()
        t0 = time.perf_counter()
        for i, toks in enumerate(batches):
            m.process(m.prepare(toks, grow=True), learn=True, batch_key=str(i))
        dt = time.perf_counter() - t0
        stop.set()
        if th is not None:
            th.join()
        return dt

    one("alone")
    out = []
    for r in range(rounds):
        row = {mode: round(one(mode), 3) for mode in ("alone", "holding", "releasing")}
        row["load_average"] = round(os.getloadavg()[0], 2)
        out.append(row)
        print(f"  round {r + 1}: alone {row['alone']:.2f} s, beside a GIL-holding thread {row['holding']:.2f} s "
              f"({row['holding'] / row['alone'] - 1:+.1%}), beside a releasing one {row['releasing']:.2f} s "
              f"({row['releasing'] / row['alone'] - 1:+.1%})  (load {row['load_average']:.2f})", flush=True)
    return {"rounds": out}


class _Recorder:
    """Stands in for the end-to-end histogram: keeps every observation, forwards to the real one."""

    def __init__(self, hist) -> None:
        self.hist = hist
        self.values: list[float] = []

    def observe(self, v: float) -> None:
        self.values.append(v)
        self.hist.observe(v)


def latency(broker, corpus, args, name: str, kafka: dict | None = None, **batch) -> dict:
    topics = {"input": f"lat-{name}-in", "output": f"lat-{name}-out", "dead_letter": f"lat-{name}-dlq"}
    create_topics(broker.bootstrap, {v: 1 for v in topics.values()})
    extra = {"model": {"n_topics": args.topics}} if args.topics else {}
    cfg = config(broker.bootstrap, mkdtemp(prefix="bench-snaps-"), topics, batch=batch, kafka=kafka or {}, **extra)
    total = int(args.rate * args.seconds)
    docs = [corpus[i % len(corpus)] for i in range(total)]
    d = Daemon(cfg)
    rec = _Recorder(d.metrics.end_to_end_latency)
    d.metrics.end_to_end_latency = rec
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    d.wait_started(60)
    while not d.status().get("ready"):
        time.sleep(0.05)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=1, linger_ms=0, enable_idempotence=False)
    t0 = time.perf_counter()
    for i, doc in enumerate(docs):  # a fixed rate, not bursts
        wait = t0 + i / args.rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        p.send(topics["input"], msgpack.packb({"id": f"{i}", "text": doc.text, "ts": time.time()}, use_bin_type=True))
    p.flush(timeout=60)
    sent_s = time.perf_counter() - t0
    deadline = time.monotonic() + 60
    while d.status().get("offsets", {}).get(f"{topics['input']}:0", 0) < total and time.monotonic() < deadline:
        time.sleep(0.05)
    d.stop()
    t.join(120)
    p.close(timeout=5)
    v = np.array(rec.values)
    return {"setting": name, **batch, **(kafka or {}), "rate_docs_per_s": args.rate, "seconds": args.seconds, "documents": total,
            "achieved_rate": round(total / sent_s, 1), "observed": int(v.size),
            "p50_ms": round(1000 * float(np.percentile(v, 50)), 1),
            "p90_ms": round(1000 * float(np.percentile(v, 90)), 1),
            "p99_ms": round(1000 * float(np.percentile(v, 99)), 1),
            "max_ms": round(1000 * float(v.max()), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=None, help="documents for the throughput run (default all)")
    ap.add_argument("--topics", type=int, default=None, help="K (default: the config's n_topics)")
    ap.add_argument("--rate", type=float, default=300.0, help="docs/s of the latency run")
    ap.add_argument("--seconds", type=float, default=30.0, help="duration of each latency run")
    ap.add_argument("--quick", action="store_true", help="3,000 documents, 10 s latency runs")
    ap.add_argument("--repeats", type=int, default=3, help="throughput runs (daemon and library alternate)")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--threads-scaling", action="store_true", help="also the daemon at threads 1 vs 2")
    ap.add_argument("--profile", action="store_true",
                    help="only: each thread's CPU and the time between hook points, at threads 1 and 2")
    ap.add_argument("--gil-probe", action="store_true",
                    help="only: threads=2 learning beside a GIL-holding vs a GIL-releasing Python thread")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval for the run (experiments on GIL hand-over; default 0.005)")
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if args.quick:
        args.docs = args.docs or 3072
        args.seconds = min(args.seconds, 10.0)
    setup_logging("WARNING", "text")
    name, corpus = load_default_corpus("train")
    corpus = corpus[: args.docs]
    results = {"corpus": name, "cores": os.cpu_count()}
    if args.gil_probe:
        results["gil_probe"] = gil_probe(corpus, args)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "daemon_gil_probe.json").write_text(json.dumps(results, indent=2))
        return 0
    with EmbeddedBroker() as broker:
        if args.profile:
            results["profile"] = profile(broker, corpus, args)
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / "daemon_profile.json").write_text(json.dumps(results, indent=2))
            return 0
        tp = throughput(broker, corpus, args)
        results["throughput"] = tp
        print(f"\nthroughput ({name}, {tp['documents']:,} documents, K={tp['n_topics']}, "
              f"batches of {tp['max_docs']})")
        print(f"  through Kafka (daemon)  {tp['daemon_docs_per_s']:>9,.0f} docs/s  "
              f"{tp['daemon_tokens_per_s']:>10,} tokens/s  {tp['daemon_seconds']:7.2f} s")
        print(f"  library alone           {tp['library_docs_per_s']:>9,.0f} docs/s  "
              f"{tp['library_tokens_per_s']:>10,} tokens/s  {tp['library_seconds']:7.2f} s")
        print(f"  overhead ratio          {tp['overhead']:+.1%} wall (best of each), "
              f"{tp['overhead_median_of_pairs']:+.1%} (median of pairs); "
              f"{tp['cpu_overhead_median']:+.1%} CPU of the loop thread (median)   (target <= +15%)")
        print(f"  daemon stage seconds    {tp['runs'][-1]['stage_seconds']}")
        print(f"  producer (input)        {tp['produce_docs_per_s']:,} docs/s")
        if args.threads_scaling:
            print("\nthreads (the daemon's sustained docs/s; target >= 1.7x)")
            results["threads"] = th = threads_scaling(broker, corpus, args)
            print(f"  threads=2 / threads=1: {th['ratio_median']:.2f}x (median of {len(th['rounds'])} rounds)")
        if not args.skip_latency:
            results["latency"] = []
            for setting, batch, kafka in (
                    ("default", {"max_docs": 256, "max_wait_ms": 1000}, {}),
                    # tansu does not wake a waiting fetch on new data: a short fetch wait matters
                    ("low-latency", {"max_docs": 32, "max_wait_ms": 50}, {"fetch_max_wait_ms": 10})):
                r = latency(broker, corpus, args, setting, kafka=kafka, **batch)
                results["latency"].append(r)
                print(f"\nlatency at {r['achieved_rate']:.0f} docs/s for {r['seconds']:.0f} s, {setting} "
                      f"(max_docs {r['max_docs']}, max_wait {r['max_wait_ms']} ms"
                      + (f", fetch_max_wait {kafka['fetch_max_wait_ms']} ms" if kafka else "") + "): "
                      f"p50 {r['p50_ms']:.0f} ms  p90 {r['p90_ms']:.0f} ms  p99 {r['p99_ms']:.0f} ms  "
                      f"max {r['max_ms']:.0f} ms  ({r['observed']:,} documents)")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "daemon.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    logging.captureWarnings(True)
    sys.exit(main())
