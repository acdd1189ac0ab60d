"""Probe the stochastic update's effective corpus size D_t (docs/defaults.md §1): one pass in
batches of 256 on a ``corpora_prep`` setting under a forced D schedule, held-out score
(bench_defaults' scorer), and the state of lambda after chosen batches.

    python bench/probe_corpus_size.py r8-df5 20 "seen;old;new;fixed(0.5);fixed(1);early_then_seen(2,10)" --trace 10
    python bench/probe_corpus_size.py 20ng-df5 100 "zipf(10);zipf(20);zipf(40)"
    python bench/probe_corpus_size.py 20ng-df5 100 "new|init_smoothing=0.3"      # model keywords after |

Schedules (N = the setting's training documents, told to the probe only): "seen" (D = n_t),
"old" (max(n_t, K V_t / Lbar_t), the rule before the per-word floor), "new" (the library's
default), fixed(m) (m N), early_then_seen(m, b) (m N for the first b batches, then n_t),
vocab_rule(c) (max(n_t, c V_t / Lbar_t)), zipf(c) (max(n_t, c H(V_t) V_t / Lbar_t)), chao(c)
(zipf with V_t replaced by Chao1's estimate of the full vocabulary).

Trace (after batch b and at the end): effective topics = exp of the entropy of the topics'
data mass (init pseudo-counts removed); duplicates = pairs of topics with cosine > 0.5;
word_topics = median over words of exp(entropy) of the word's topic row; bias = the
mean-field penalty sum data (log lambda - psi(lambda)) / sum data, nats per token.
The schedule is forced by replacing ``StochasticUpdate.effective_corpus_size`` for the run.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpora_prep import Setting  # noqa: E402
from scipy.special import digamma  # noqa: E402

from streamtopics import TopicModel  # noqa: E402
from streamtopics.updates import StochasticUpdate  # noqa: E402

_LIBRARY_RULE = StochasticUpdate.effective_corpus_size


def _seen(st, sm):
    return st.docs_seen + sm.n_docs


def _lbar(st, sm):
    return (st.tokens_seen + sm.n_tokens) / max(st.docs_seen + sm.n_docs, 1)


def fixed(m):
    return lambda st, sm, rho, N: m * N


def early_then_seen(m, b):
    return lambda st, sm, rho, N: m * N if st.n_updates < b else _seen(st, sm)


def vocab_rule(c):
    return lambda st, sm, rho, N: max(_seen(st, sm), c * st.n_words / max(_lbar(st, sm), 1.0))


def zipf(c):
    return lambda st, sm, rho, N: max(_seen(st, sm), c * (math.log(max(st.n_words, 1)) + 0.5772156649)
                                      * st.n_words / max(_lbar(st, sm), 1.0))


def chao(c):
    """zipf(c) with V_t replaced by Chao1's estimate of the full vocabulary, V_t + f1^2 / (2 f2)
    (f1, f2: words seen once, twice so far; token counts accumulated from the batch summaries)."""
    counts = {}

    def schedule(st, sm, rho, N):
        V = st.n_words
        cnt = counts.get(id(st), np.zeros(0))
        cnt = np.concatenate([cnt, np.zeros(max(V - cnt.size, 0))])
        if sm.values.size:
            np.add.at(cnt, sm.word_ids, np.add.reduceat(sm.values, sm.indptr[:-1]))
        counts[id(st)] = cnt
        r = np.rint(cnt[:V])
        f1, f2 = float((r == 1).sum()), float((r == 2).sum())
        Vh = V + (f1 * f1 / (2 * f2) if f2 > 0 else f1 * (f1 - 1) / 2)
        return max(_seen(st, sm), c * (math.log(max(Vh, 1.0)) + 0.5772156649) * Vh / max(_lbar(st, sm), 1.0))
    return schedule


SCHEDULES = {
    "seen": lambda st, sm, rho, N: _seen(st, sm),
    "old": lambda st, sm, rho, N: max(_seen(st, sm), st.n_topics * st.n_words / max(_lbar(st, sm), 1.0)),
    "new": lambda st, sm, rho, N: _LIBRARY_RULE(StochasticUpdate(), st, sm, rho),
}


def trace(m) -> dict:
    st = m.state
    V = st.n_words
    lam = st.beta + st.scale * st.mu[:V]
    data = np.maximum(lam - st.beta - st.scale * st.smoothing, 0.0)
    tot = data.sum(axis=0)
    p = tot[tot > 0] / tot.sum()
    tw = lam / lam.sum(axis=0, keepdims=True)
    X = tw.T / np.linalg.norm(tw.T, axis=1, keepdims=True)
    C = X @ X.T
    np.fill_diagonal(C, 0.0)
    rows = data.sum(axis=1)
    q = data / np.maximum(rows[:, None], 1e-300)
    ent = -np.where(q > 0, q * np.log(np.maximum(q, 1e-300)), 0.0).sum(axis=1)
    return {"effective_topics": float(np.exp(-(p * np.log(p)).sum())), "duplicates": int((C > 0.5).sum() // 2),
            "max_cosine": float(C.max()), "word_topics": float(np.median(np.exp(ent))),
            "bias": float((data * (np.log(lam) - digamma(lam))).sum() / data.sum()),
            "init_per_entry": float(st.scale * st.smoothing), "alpha": float(st.alpha)}


def run(s: Setting, K: int, schedule, trace_at=(), **kw) -> dict:
    N = s.n_docs
    StochasticUpdate.effective_corpus_size = lambda self, st, sm, rho: float(schedule(st, sm, rho, N))
    try:
        m = TopicModel(n_topics=K, **kw)
        Ds, traces = [], {}
        for b, lo in enumerate(range(0, N, 256), start=1):
            m.partial_fit(s.train[lo:lo + 256])
            Ds.append(m.last_stats["corpus_size"])
            if b in trace_at:
                traces[b] = trace(m)
        traces["end"] = trace(m)
    finally:
        StochasticUpdate.effective_corpus_size = _LIBRARY_RULE
    return {"heldout": s.score(s.align(m), m.state.alpha), "D_first_over_N": Ds[0] / N,
            "D_end_over_N": Ds[-1] / N, "trace": traces}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("setting")
    ap.add_argument("k", type=int)
    ap.add_argument("schedules", help="';'-separated schedules, each optionally followed by |model keywords")
    ap.add_argument("--trace", default="", help="comma-separated batch numbers to trace")
    a = ap.parse_args(argv)
    s = Setting(a.setting)
    print(f"{a.setting}: N={s.n_docs} tokens={s.n_tokens} V={len(s.vocab)} Lbar={s.n_tokens / s.n_docs:.1f} K={a.k}",
          flush=True)
    TopicModel(n_topics=a.k).partial_fit(s.train[:16])  # numba warm-up
    env = {"fixed": fixed, "early_then_seen": early_then_seen, "vocab_rule": vocab_rule, "zipf": zipf, "chao": chao}
    for spec in a.schedules.split(";"):
        name, _, kws = spec.partition("|")
        schedule = SCHEDULES.get(name) or eval(name, env)  # a bench-only command line, not user input
        kw = eval(f"dict({kws})", {})
        t0 = time.time()
        r = run(s, a.k, schedule, tuple(int(x) for x in a.trace.split(",") if x), **kw)
        print(f"  {spec:<30} held-out {r['heldout']:.4f}  D_1/N {r['D_first_over_N']:.2f}  D_end/N "
              f"{r['D_end_over_N']:.2f}  {time.time() - t0:.0f}s", flush=True)
        for b, t in r["trace"].items():
            print(f"      after {b}: " + ", ".join(f"{k} {v:.3g}" for k, v in t.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
