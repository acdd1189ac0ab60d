"""Benchmark for the core learner (issue: core library).

One pass over the 20 Newsgroups train split in minibatches of 256, K topics, single
core, held-out document completion on the test split — streamtopics vs gensim LdaModel
and scikit-learn's online LatentDirichletAllocation, all fed the same tokens and all
scored by the same function (streamtopics.evaluate.completion_loglik on each model's
topic-word matrix).  Also: L-sparse vs dense time-to-quality at K=400, memoized laps,
and a stream grouped by label.

    python bench/bench_core.py                    # everything (~15 min on 2 cores)
    python bench/bench_core.py --section peers    # one section: peers|sparsity|memoized|grouped
    python bench/bench_core.py --quick            # smaller, for a smoke run
    python bench/bench_core.py --section peers --rounds 5   # more paired rounds for the ratio

Needs the bench extra: pip install -e '.[bench]'.
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

from streamtopics import TopicModel
from streamtopics.batch import build_batch
from streamtopics.corpora import load_20newsgroups
from streamtopics.evaluate import completion_loglik, split_completion
from streamtopics.text import Tokenizer, Vocabulary

from corpora_prep import align_topics  # noqa: E402 - bench/ is the script directory

BATCH = 256
ALPHA = 0.1
BETA = 0.01
RESULTS = Path(__file__).with_name("results")


class Corpus:
    """Train tokens, a fixed train vocabulary for the peers, and the test completion split."""

    def __init__(self, order: str = "shuffled", n_train: int | None = None, n_test: int | None = None, seed: int = 0):
        tok = Tokenizer()
        train = load_20newsgroups("train", order=order, seed=seed)[:n_train]
        test = load_20newsgroups("test", order="shuffled", seed=seed)[:n_test]
        self.train_tokens = [tok(d.text) for d in train]
        self.labels = [d.label for d in train]
        self.vocab = Vocabulary()
        self.train = build_batch(self.train_tokens, self.vocab)
        test_batch = build_batch([tok(d.text) for d in test], self.vocab, grow=False)
        self.part_a, self.part_b = split_completion(test_batch, frac=0.8, seed=seed)
        self.n_tokens = int(self.train.counts.sum())

    def score(self, topic_word: np.ndarray) -> float:
        return completion_loglik(topic_word, self.part_a, self.part_b, ALPHA)

    def align(self, model: TopicModel) -> np.ndarray:
        """streamtopics' topic-word matrix with columns in this corpus' vocabulary order."""
        return align_topics(model, self.vocab)

    def rows(self, lo: int, hi: int):
        import scipy.sparse as sp

        b = self.train
        s, e = b.doc_ptr[lo], b.doc_ptr[hi]
        return sp.csr_matrix((b.counts[s:e], b.word_ids[s:e], b.doc_ptr[lo:hi + 1] - s),
                             shape=(hi - lo, len(self.vocab)))


def run_streamtopics(corpus: Corpus, K: int, checkpoints: int = 0, **kw) -> dict:
    params = dict(n_topics=K, alpha=ALPHA, beta=BETA, seed=0, corpus_size=len(corpus.train_tokens))
    params.update(kw)
    TopicModel(**params).partial_fit(corpus.train_tokens[:8])  # numba cache warm-up outside the clock
    m = TopicModel(**params)
    curve = []
    n = len(corpus.train_tokens)
    every = max(1, (n // BATCH) // checkpoints) if checkpoints else 0
    elapsed = 0.0
    for i, lo in enumerate(range(0, n, BATCH)):
        t0 = time.perf_counter()
        m.partial_fit(corpus.train_tokens[lo:lo + BATCH])
        elapsed += time.perf_counter() - t0
        if every and (i + 1) % every == 0:
            curve.append((elapsed, corpus.score(corpus.align(m))))
    score = corpus.score(corpus.align(m))
    if checkpoints:
        curve.append((elapsed, score))
    return {"seconds": elapsed, "tokens_per_s": corpus.n_tokens / elapsed, "heldout": score, "curve": curve,
            "model": m}


def run_gensim(corpus: Corpus, K: int, decay: float, offset: float) -> dict:
    from gensim.models import LdaModel

    b = corpus.train
    bows = [list(zip(b.word_ids[b.doc_ptr[d]:b.doc_ptr[d + 1]].tolist(),
                     b.counts[b.doc_ptr[d]:b.doc_ptr[d + 1]].tolist())) for d in range(b.n_docs)]
    id2word = dict(enumerate(corpus.vocab.words))
    t0 = time.perf_counter()
    lda = LdaModel(corpus=bows, id2word=id2word, num_topics=K, chunksize=BATCH, passes=1, update_every=1,
                   alpha=np.full(K, ALPHA), eta=BETA, decay=decay, offset=offset, eval_every=None,
                   random_state=0)
    elapsed = time.perf_counter() - t0
    lam = lda.state.get_lambda()
    return {"seconds": elapsed, "tokens_per_s": corpus.n_tokens / elapsed,
            "heldout": corpus.score(lam / lam.sum(axis=1, keepdims=True))}


def run_sklearn(corpus: Corpus, K: int) -> dict:
    from sklearn.decomposition import LatentDirichletAllocation

    n = corpus.train.n_docs
    lda = LatentDirichletAllocation(n_components=K, learning_method="online", batch_size=BATCH, total_samples=n,
                                    doc_topic_prior=ALPHA, topic_word_prior=BETA, learning_offset=10.0,
                                    learning_decay=0.7, random_state=0, n_jobs=1)
    blocks = [corpus.rows(lo, min(lo + BATCH, n)) for lo in range(0, n, BATCH)]
    t0 = time.perf_counter()
    for X in blocks:
        lda.partial_fit(X)
    elapsed = time.perf_counter() - t0
    comp = lda.components_
    return {"seconds": elapsed, "tokens_per_s": corpus.n_tokens / elapsed,
            "heldout": corpus.score(comp / comp.sum(axis=1, keepdims=True))}


def _row(name: str, r: dict, ref: dict | None = None) -> str:
    ratio = f"{r['tokens_per_s'] / ref['tokens_per_s']:6.2f}x" if ref else "      "
    return f"  {name:<44} heldout {r['heldout']:8.4f}  {r['tokens_per_s']:>11,.0f} tok/s  {r['seconds']:7.1f}s {ratio}"


def section_peers(args, order: str = "shuffled") -> dict:
    c = Corpus(order=order, n_train=args.n_train, n_test=args.n_test)
    print(f"\n[{'peers' if order == 'shuffled' else 'grouped'}] 20NG train ({order}): {c.train.n_docs} docs, "
          f"{c.n_tokens:,} tokens, V={len(c.vocab):,}; K={args.k}, one pass, batches of {BATCH}", flush=True)
    res = {}
    res["gensim (defaults 0.5, 1)"] = run_gensim(c, args.k, 0.5, 1.0)
    print(_row("gensim LdaModel (defaults: decay 0.5, offset 1)", res["gensim (defaults 0.5, 1)"]), flush=True)
    res["sklearn"] = run_sklearn(c, args.k)
    print(_row("scikit-learn online LDA (decay 0.7, offset 10)", res["sklearn"]), flush=True)
    # The headline ratio pairs gensim and streamtopics back to back, round after round: the
    # host's speed drifts by 10-20 % over minutes, which a single run of each would fold in.
    rounds = []
    for i in range(args.rounds):
        g = run_gensim(c, args.k, 0.7, 10.0)
        st = run_streamtopics(c, args.k, sparsity=8, update="stochastic")
        st.pop("model")
        rounds.append({"gensim": g, "streamtopics": st, "ratio": st["tokens_per_s"] / g["tokens_per_s"]})
        print(_row(f"gensim LdaModel (decay 0.7, offset 10) [{i + 1}]", g), flush=True)
        print(_row(f"streamtopics lsparse L=8 stochastic [{i + 1}]", st, g), flush=True)
    mid = sorted(rounds, key=lambda r: r["ratio"])[len(rounds) // 2]
    res["gensim (decay 0.7, offset 10)"] = mid["gensim"]
    res["streamtopics"] = st = mid["streamtopics"]
    res["rounds"] = [{"gensim_tok_s": r["gensim"]["tokens_per_s"], "streamtopics_tok_s": r["streamtopics"]["tokens_per_s"],
                      "ratio": r["ratio"]} for r in rounds]
    best_peer = max(r["heldout"] for k, r in res.items() if k not in ("streamtopics", "rounds"))
    ratios = ", ".join(f"{r['ratio']:.2f}" for r in rounds)
    print(f"  => streamtopics held-out {st['heldout'] - best_peer:+.4f} nats/token vs best peer; "
          f"speed {mid['ratio']:.2f}x gensim (median of {len(rounds)} paired rounds: "
          f"{ratios}), "
          f"{st['tokens_per_s'] / res['sklearn']['tokens_per_s']:.2f}x scikit-learn")
    return res


def section_sparsity(args) -> dict:
    K = 400 if not args.quick else 100
    c = Corpus(n_train=args.n_train, n_test=min(args.n_test or 2000, 2000))
    print(f"\n[sparsity] K={K}, one pass: L=8 vs dense L=K (time to the dense run's final score)", flush=True)
    dense = run_streamtopics(c, K, checkpoints=10, sparsity=K, active_eps=0.0)
    sparse = run_streamtopics(c, K, checkpoints=10, sparsity=8)
    target = dense["heldout"]
    tol = abs(target) * 0.005
    hit = next((t for t, s in sparse["curve"] if s >= target - tol), None)
    print(f"  dense  L=K: final {target:.4f} after {dense['seconds']:.1f}s")
    print(f"  sparse L=8: final {sparse['heldout']:.4f} after {sparse['seconds']:.1f}s; "
          f"within 0.5% of dense final at {hit if hit is None else round(hit, 1)}s")
    if hit:
        print(f"  => L=8 reaches the dense final score {dense['seconds'] / hit:.1f}x sooner")
    for r in (dense, sparse):
        r.pop("model")
    return {"K": K, "dense": dense, "sparse": sparse, "speedup": dense["seconds"] / hit if hit else None}


def section_memoized(args) -> dict:
    laps = 5 if not args.quick else 2
    c = Corpus(n_train=args.n_train, n_test=args.n_test)
    print(f"\n[memoized] {laps} laps over 20NG train, K={args.k}", flush=True)
    m = TopicModel(n_topics=args.k, alpha=ALPHA, beta=BETA, seed=0, update="memoized")
    n = len(c.train_tokens)
    out = []
    for lap in range(laps):
        t0 = time.perf_counter()
        for lo in range(0, n, BATCH):
            m.partial_fit(c.train_tokens[lo:lo + BATCH], batch_key=lo)
        el = time.perf_counter() - t0
        out.append({"lap": lap + 1, "seconds": el, "heldout": c.score(c.align(m)), "elbo": m.elbo(),
                    "rejected": m.updater.rejected})
        print(f"  lap {lap + 1}: heldout {out[-1]['heldout']:.4f}  ELBO {out[-1]['elbo']:.6e}  "
              f"({el:.1f}s, {out[-1]['rejected']} revisits kept their cached solution)", flush=True)
    mono = all(b["elbo"] >= a["elbo"] - 1e-9 * abs(a["elbo"]) for a, b in zip(out, out[1:]))
    print(f"  => ELBO non-decreasing across laps: {mono}")
    return {"laps": out, "elbo_monotone": mono}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=["peers", "sparsity", "memoized", "grouped", "all"], default="all")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="paired gensim/streamtopics runs (median ratio)")
    args = ap.parse_args(argv)
    args.n_train = 3000 if args.quick else None
    args.n_test = 1000 if args.quick else None
    results = {}
    if args.section in ("peers", "all"):
        results["peers"] = section_peers(args)
    if args.section in ("grouped", "all"):
        results["grouped"] = section_peers(args, order="grouped")
    if args.section in ("sparsity", "all"):
        results["sparsity"] = section_sparsity(args)
    if args.section in ("memoized", "all"):
        results["memoized"] = section_memoized(args)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"core-{args.section}{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps(results, indent=1, default=float))
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
