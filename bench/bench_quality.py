"""Topic quality benchmark (issue 19): NPMI coherence and diversity vs peers, and the cost of
the incremental quality monitor.

Corpus: 20 Newsgroups, Subject + body, lowercase alphabetic tokens of >= 3 letters, English
stop list, only words in >= 5 training documents. Every model sees the same tokens in the same
(shuffled, seed 0) order, one pass, minibatches of 256:

  streamtopics  library defaults (``TopicModel(n_topics=K)``) and with corpus_size=50000
  gensim        LdaModel, decay 0.7 / offset 10, alpha 0.1, eta 0.01
  scikit-learn  online LatentDirichletAllocation, decay 0.7 / offset 10, same priors

Score: mean over topics of the NPMI of each topic's top-10 words (streamtopics.quality:
Bouma's NPMI, boolean documents, a pair never seen together = -1, no smoothing) on the
20NG **test** split as the reference corpus; diversity = unique share of all top-25 words.

Monitor cost: streamtopics (defaults) is re-run with ``TopicExplorer.observe`` after every
batch, as the daemon calls it (quality window 5000 documents = the shipped config), and the
seconds it takes are compared with the seconds the batch itself took (``process``). The
daemon's batch time also includes decoding and publishing, so this share is an upper bound of
the share in the daemon (the daemon exports both: streamtopics_topic_monitor_duration_seconds
and streamtopics_batch_duration_seconds{stage="total"}).

    python bench/bench_quality.py                 # K = 50 and 100 (~10-15 min on 2 busy cores)
    python bench/bench_quality.py --k 50 --quick  # a smoke run on 3000 training documents
    python bench/bench_quality.py --daemon-only   # only the in-daemon monitor cost (embedded broker)

In the daemon (section "daemon"): the shipped config (K=100, batches of 256) on the 20NG train
split through the embedded broker, explorer on, paired with a run with ``metrics.explorer =
false``; reported: the monitor's seconds (streamtopics_topic_monitor_duration_seconds_sum) over
the loop's learn+predict seconds and over the batch total (stage="total": first record to
acknowledged predictions), and the paired wall-time ratio of the two runs.

Needs the bench extra (gensim, scikit-learn). Writes bench/results/quality.json.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # single core for every contender

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's streamtopics, not an installed one

from streamtopics import TopicModel  # noqa: E402
from streamtopics.batch import build_batch  # noqa: E402
from streamtopics.corpora import load_20newsgroups  # noqa: E402
from streamtopics.explore import TopicExplorer  # noqa: E402
from streamtopics.quality import npmi_reference, top_word_ids, topic_diversity  # noqa: E402
from streamtopics.text import Tokenizer, Vocabulary  # noqa: E402

BATCH = 256
ALPHA, BETA = 0.1, 0.01
MIN_DF = 5
RESULTS = Path(__file__).with_name("results")


class Corpus:
    def __init__(self, n_train: int | None = None):
        tok = Tokenizer(min_len=3)
        train = load_20newsgroups("train", order="shuffled", seed=0)[:n_train]
        test = load_20newsgroups("test", order="shuffled", seed=0)
        raw = [tok(d.text) for d in train]
        df: dict[str, int] = {}
        for t in raw:
            for w in set(t):
                df[w] = df.get(w, 0) + 1
        keep = {w for w, n in df.items() if n >= MIN_DF}
        self.train_tokens = [t for t in ([w for w in t if w in keep] for t in raw) if t]
        self.vocab = Vocabulary()
        self.train = build_batch(self.train_tokens, self.vocab)
        # the reference: test documents as sets of words (words outside the vocabulary never
        # appear among top words, so they do not matter)
        self.reference = [set(w for w in tok(d.text) if w in keep) for d in test]
        self.n_tokens = int(self.train.counts.sum())

    def score(self, top_words: list[list[str]]) -> dict:
        top10 = np.array([t[:10] for t in top_words], dtype=object)
        npmi = npmi_reference(self.reference, top10)
        return {"mean_npmi": float(np.mean(npmi)), "diversity": topic_diversity(np.array(top_words, dtype=object), 25),
                "npmi": npmi.round(4).tolist()}

    def rows(self, lo: int, hi: int):
        import scipy.sparse as sp

        b = self.train
        s, e = b.doc_ptr[lo], b.doc_ptr[hi]
        return sp.csr_matrix((b.counts[s:e], b.word_ids[s:e], b.doc_ptr[lo:hi + 1] - s),
                             shape=(hi - lo, len(self.vocab)))


def _tops(weights_vk: np.ndarray, words: list[str], n: int = 25) -> list[list[str]]:
    ids = top_word_ids(np.ascontiguousarray(weights_vk), n)
    return [[words[i] for i in row] for row in ids]


def run_streamtopics(c: Corpus, K: int, monitor: bool = False, seed: int = 0, **kw) -> dict:
    TopicModel(n_topics=K, **kw).partial_fit(c.train_tokens[:8])  # numba warm-up outside the clock
    m = TopicModel(n_topics=K, seed=seed, **kw)
    ex = TopicExplorer(window_docs=5000) if monitor else None
    if ex is not None:  # the monitor's numba kernels too (cached on disk after the first run)
        TopicExplorer().monitor.update(np.array([0, 2]), np.array([0, 1]), np.array([[0, 1], [1, 0]]))
        top_word_ids(np.ones((3, 2)), 2)
    learn = observe = 0.0
    n = len(c.train_tokens)
    shares = []
    for lo in range(0, n, BATCH):
        t0 = time.perf_counter()
        part = c.train_tokens[lo:lo + BATCH]
        batch = m.prepare(part, grow=True)
        res = m.process(batch, learn=True)
        t1 = time.perf_counter()
        learn += t1 - t0
        if ex is not None:
            theta = m.theta(res.doc_topic)
            obs = ex.observe(m, batch, theta, list(range(lo, lo + len(part))), part)
            dt = time.perf_counter() - t1
            observe += dt
            shares.append(dt / (t1 - t0))
    out = {"seconds": learn, "top_words": [m.top_words(k, 25) for k in range(K)]}
    if ex is not None:
        out.update(monitor_seconds=observe, monitor_share=observe / learn,
                   monitor_share_median_batch=float(np.median(shares)),
                   stream_window_mean_npmi=obs.quality.mean_npmi)
    return out


def run_gensim(c: Corpus, K: int, seed: int = 0) -> dict:
    from gensim.models import LdaModel

    b = c.train
    bows = [list(zip(b.word_ids[b.doc_ptr[d]:b.doc_ptr[d + 1]].tolist(),
                     b.counts[b.doc_ptr[d]:b.doc_ptr[d + 1]].tolist())) for d in range(b.n_docs)]
    t0 = time.perf_counter()
    lda = LdaModel(corpus=bows, id2word=dict(enumerate(c.vocab.words)), num_topics=K, chunksize=BATCH, passes=1,
                   update_every=1, alpha=np.full(K, ALPHA), eta=BETA, decay=0.7, offset=10.0, eval_every=None,
                   random_state=seed)
    return {"seconds": time.perf_counter() - t0, "top_words": _tops(lda.state.get_lambda().T, c.vocab.words)}


def run_sklearn(c: Corpus, K: int, seed: int = 0) -> dict:
    from sklearn.decomposition import LatentDirichletAllocation

    n = c.train.n_docs
    lda = LatentDirichletAllocation(n_components=K, learning_method="online", batch_size=BATCH, total_samples=n,
                                    doc_topic_prior=ALPHA, topic_word_prior=BETA, learning_offset=10.0,
                                    learning_decay=0.7, random_state=seed, n_jobs=1)
    t0 = time.perf_counter()
    for lo in range(0, n, BATCH):
        lda.partial_fit(c.rows(lo, min(lo + BATCH, n)))
    return {"seconds": time.perf_counter() - t0, "top_words": _tops(lda.components_.T, c.vocab.words)}


def daemon_cost(rounds: int = 2) -> dict:
    """The monitor inside the daemon: metrics sums, and wall time paired with explorer = false."""
    import shutil
    import tempfile
    import threading
    import tomllib

    import msgpack
    from kafka import KafkaProducer

    from streamtopics.config import Config
    from streamtopics.daemon import Daemon
    from streamtopics.testing.broker import EmbeddedBroker, create_topics

    root = Path(__file__).resolve().parents[1]
    docs = load_20newsgroups("train", order="shuffled", seed=0)
    docs = docs[: len(docs) - len(docs) % 256]
    out: dict = {"documents": len(docs), "runs": []}
    with EmbeddedBroker() as broker:
        topic = "q-in"
        create_topics(broker.bootstrap, {topic: 1, "q-out": 1, "q-dlq": 1})
        p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=10, batch_size=262144,
                          enable_idempotence=False)
        for d in docs:
            p.send(topic, msgpack.packb({"id": d.id, "text": d.text}, use_bin_type=True))
        p.flush(timeout=120)
        p.close(timeout=5)
        for r in range(rounds):
            for explorer in (True, False):
                data = tomllib.loads((root / "config" / "streamtopics.toml").read_text())
                data["kafka"].update(bootstrap_servers=broker.bootstrap, group_id=f"q-{time.monotonic_ns()}",
                                     session_timeout_ms=3000, heartbeat_interval_ms=1000, create_topics=False)
                data["topics"].update(input=topic, output="q-out", dead_letter="q-dlq")
                snaps = tempfile.mkdtemp(prefix="bench-quality-")  # a fresh model every run
                data["snapshot"].update(dir=snaps, every_batches=0, every_seconds=0)
                data["metrics"].update(port=0, explorer=explorer)
                d = Daemon(Config.from_dict(data, env={}), serve_metrics=False)
                t = threading.Thread(target=d.run, daemon=True)
                t.start()
                d.wait_started(120)
                while d.status().get("offsets", {}).get(f"{topic}:0", 0) < len(docs):
                    time.sleep(0.02)
                d.stop()
                t.join(120)
                shutil.rmtree(snaps, ignore_errors=True)
                st = d.status()
                sums = {}
                for fam in d.metrics.registry.collect():
                    for smp in fam.samples:
                        if smp.name == "streamtopics_batch_duration_seconds_sum":
                            sums[smp.labels["stage"]] = smp.value
                        elif smp.name == "streamtopics_topic_monitor_duration_seconds_sum":
                            sums["monitor"] = smp.value
                run = {"explorer": explorer, "wall_seconds": st["last_batch_at"] - st["first_batch_at"],
                       "stage_seconds": {k: round(v, 3) for k, v in sums.items()}}
                if explorer:
                    work = sums["predict"] + sums["learn"] + sums["decode"]
                    run.update(monitor_share_of_loop_work=sums["monitor"] / work,
                               monitor_share_of_batch_total=sums["monitor"] / sums["total"])
                out["runs"].append(run)
                print(f"  daemon round {r + 1} explorer={explorer}: wall {run['wall_seconds']:.2f} s"
                      + (f", monitor {sums['monitor']:.2f} s = {100 * run['monitor_share_of_loop_work']:.2f} % of "
                         f"decode+predict+learn, {100 * run['monitor_share_of_batch_total']:.2f} % of the batch "
                         f"total stage" if explorer else ""), flush=True)
    on = [x for x in out["runs"] if x["explorer"]]
    off = [x for x in out["runs"] if not x["explorer"]]
    out["wall_ratio_pairs"] = [a["wall_seconds"] / b["wall_seconds"] for a, b in zip(on, off)]
    out["monitor_share_of_loop_work_median"] = float(np.median([x["monitor_share_of_loop_work"] for x in on]))
    out["monitor_share_of_batch_total_median"] = float(np.median([x["monitor_share_of_batch_total"] for x in on]))
    print(f"daemon: monitor = {100 * out['monitor_share_of_loop_work_median']:.2f} % of the loop's work, "
          f"{100 * out['monitor_share_of_batch_total_median']:.2f} % of batch time; wall explorer on/off "
          f"{', '.join(f'{x:.3f}' for x in out['wall_ratio_pairs'])}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, nargs="+", default=[50, 100])
    ap.add_argument("--quick", action="store_true", help="3000 training documents")
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--daemon-only", action="store_true", help="only the in-daemon monitor cost")
    ap.add_argument("--daemon-rounds", type=int, default=2)
    ap.add_argument("--seeds", default="0", help="comma-separated seeds: every model once per seed, means compared "
                                                  "(the monitor's cost is measured on the first seed's run)")
    args = ap.parse_args(argv)
    if args.daemon_only:
        res = daemon_cost(args.daemon_rounds)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "quality-daemon.json").write_text(json.dumps(res, indent=1))
        return 0
    c = Corpus(n_train=3000 if args.quick else None)
    print(f"20NG: {len(c.train_tokens)} train docs, {c.n_tokens} tokens, V={len(c.vocab)} (df >= {MIN_DF}); "
          f"reference = {len(c.reference)} test docs", flush=True)
    results: dict = {"corpus": {"train_docs": len(c.train_tokens), "tokens": c.n_tokens, "vocabulary": len(c.vocab),
                                "reference_docs": len(c.reference)}, "runs": {}}
    seeds = [int(x) for x in args.seeds.split(",")]
    for K in args.k:
        runs = {
            "streamtopics (defaults)": lambda seed: run_streamtopics(c, K, monitor=seed == seeds[0], seed=seed),
            "streamtopics (corpus_size=50000)": lambda seed: run_streamtopics(c, K, corpus_size=50000, seed=seed),
        }
        if not args.skip_peers:
            runs["gensim (decay 0.7, offset 10)"] = lambda seed: run_gensim(c, K, seed)
            runs["scikit-learn online LDA"] = lambda seed: run_sklearn(c, K, seed)
        for name, fn in runs.items():
            per_seed = []
            for seed in seeds:
                one = fn(seed)
                one.update(c.score(one["top_words"]))
                per_seed.append(one)
            r = per_seed[0]
            r["top_words"] = [t[:10] for t in r["top_words"]]
            if len(seeds) > 1:
                r["npmi_by_seed"] = [x["mean_npmi"] for x in per_seed]
                r["diversity_by_seed"] = [x["diversity"] for x in per_seed]
                r["mean_npmi"] = float(np.mean(r["npmi_by_seed"]))
                r["diversity"] = float(np.mean(r["diversity_by_seed"]))
            results["runs"][f"K={K} {name}"] = r
            line = (f"K={K:<4} {name:<34} mean NPMI {r['mean_npmi']:+.3f}  diversity {r['diversity']:.3f}  "
                    f"{r['seconds']:7.1f} s")
            if len(seeds) > 1:
                line += "  (seeds: " + " ".join(f"{x:+.3f}" for x in r["npmi_by_seed"]) + ")"
            if "monitor_share" in r:
                line += (f"  | monitor {100 * r['monitor_share']:.2f} % of batch time "
                         f"(median batch {100 * r['monitor_share_median_batch']:.2f} %)")
            print(line, flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "quality.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
