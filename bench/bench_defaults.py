"""Defaults only: streamtopics as a new user gets it, against peers with their documented settings.

    python bench/bench_defaults.py                        # every setting, K=100, one pass
    python bench/bench_defaults.py --settings 20ng-df5,r8-df5 --k 100 --json out.json

No streamtopics constant is set here: ``TopicModel(n_topics=K)`` and ``partial_fit`` in
minibatches of 256, nothing else.  The stream's length is never told to it.  Peers get their
best documented settings, and scikit-learn and Vowpal Wabbit are TOLD the corpus size
(``total_samples``, ``--lda_D``), which streamtopics is not:

* gensim ``LdaModel`` with its defaults (decay 0.5, offset 1) and with decay 0.7 / offset 10,
  chunksize 256, one pass (gensim's ``update`` learns the corpus length from the corpus it is
  handed, so it knows D too);
* scikit-learn ``LatentDirichletAllocation(learning_method="online", total_samples=N)``;
* Vowpal Wabbit ``--lda K --lda_D N --minibatch 256`` (bench-only PyPI ``vowpalwabbit``).

All contenders see the same token lists (``bench/corpora_prep.py``) and are scored by the same
code: held-out document completion (``streamtopics.evaluate``: 80/20 split of each test
document's word types, topics fixed, each model's own alpha), mean nats per held-out token.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpora_prep import SETTINGS, Setting  # noqa: E402

from streamtopics import TopicModel  # noqa: E402

BATCH = 256


def _result(s: Setting, seconds: float, heldout: float, **extra) -> dict:
    return {"seconds": seconds, "tokens_per_s": s.n_tokens / seconds, "heldout": heldout, **extra}


def run_streamtopics(s: Setting, K: int) -> dict:
    TopicModel(n_topics=K).partial_fit(s.train[:16])  # numba cache warm-up outside the clock
    m = TopicModel(n_topics=K)
    t0 = time.perf_counter()
    for lo in range(0, s.n_docs, BATCH):
        m.partial_fit(s.train[lo:lo + BATCH])
    el = time.perf_counter() - t0
    return _result(s, el, s.score(s.align(m), m.state.alpha), alpha=float(m.state.alpha), beta=float(m.state.beta))


def run_gensim(s: Setting, K: int, decay: float, offset: float) -> dict:
    from gensim.models import LdaModel

    bows = s.bows()
    t0 = time.perf_counter()
    lda = LdaModel(corpus=bows, id2word=dict(enumerate(s.vocab.words)), num_topics=K, chunksize=BATCH, passes=1,
                   update_every=1, decay=decay, offset=offset, eval_every=None, random_state=0)
    el = time.perf_counter() - t0
    lam = lda.state.get_lambda()
    return _result(s, el, s.score(lam / lam.sum(axis=1, keepdims=True), float(np.mean(lda.alpha))))


def run_sklearn(s: Setting, K: int) -> dict:
    from sklearn.decomposition import LatentDirichletAllocation

    X = s.csr()
    lda = LatentDirichletAllocation(n_components=K, learning_method="online", batch_size=BATCH,
                                    total_samples=s.n_docs, random_state=0, n_jobs=1)
    t0 = time.perf_counter()
    for lo in range(0, s.n_docs, BATCH):
        lda.partial_fit(X[lo:lo + BATCH])
    el = time.perf_counter() - t0
    comp = lda.components_
    return _result(s, el, s.score(comp / comp.sum(axis=1, keepdims=True), 1.0 / K))


def run_vw(s: Setting, K: int) -> dict:
    import vowpalwabbit

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.vw")
        with open(path, "w") as fh:
            for d in s.train:
                counts: dict[str, int] = {}
                for w in d:
                    counts[w] = counts.get(w, 0) + 1
                fh.write("| " + " ".join(f"{w}:{c}" for w, c in counts.items()) + "\n")
        t0 = time.perf_counter()
        vw = vowpalwabbit.Workspace(f"--lda {K} --lda_D {s.n_docs} --minibatch {BATCH} -b 20 --quiet -d {path}")
        vw.run_parser()
        el = time.perf_counter() - t0
        ns = vw.hash_space("")
        lam = np.empty((K, len(s.vocab)))
        for j, w in enumerate(s.vocab.words):
            h = vw.hash_feature(w, ns)
            lam[:, j] = [vw.get_weight(h, k) for k in range(K)]
        vw.finish()
    return _result(s, el, s.score(lam / lam.sum(axis=1, keepdims=True), 0.1))


CONTENDERS = {
    "streamtopics (defaults)": run_streamtopics,
    "gensim (defaults: decay 0.5, offset 1)": lambda s, K: run_gensim(s, K, 0.5, 1.0),
    "gensim (decay 0.7, offset 10)": lambda s, K: run_gensim(s, K, 0.7, 10.0),
    "scikit-learn online (told N)": run_sklearn,
    "Vowpal Wabbit --lda (told N)": run_vw,
}


def unsupervised(settings: list[str], K: int, skip: set[str]) -> dict:
    out: dict = {}
    for name in settings:
        s = Setting(name)
        print(f"\n== {name}: {s.n_docs} train docs, {s.n_tokens:,} tokens, V={len(s.vocab):,}, "
              f"{len(s.test)} test docs, K={K}, one pass, batches of {BATCH}", flush=True)
        rows = {}
        for label, fn in CONTENDERS.items():
            if any(x in label for x in skip):
                continue
            try:
                r = fn(s, K)
            except ImportError as e:
                print(f"  {label:<42} skipped ({e.name} not installed)")
                continue
            rows[label] = r
            print(f"  {label:<42} held-out {r['heldout']:8.4f}  {r['tokens_per_s']:>10,.0f} tok/s  "
                  f"{r['seconds']:6.1f}s", flush=True)
        ours = rows.get("streamtopics (defaults)")
        peers = {k: v for k, v in rows.items() if k != "streamtopics (defaults)"}
        if ours and peers:
            best = max(peers, key=lambda k: peers[k]["heldout"])
            margin = ours["heldout"] - peers[best]["heldout"]
            print(f"  => streamtopics {margin:+.4f} nats/token vs the best peer ({best})"
                  f"{'  BEST' if margin > 0 else '  NOT BEST'}", flush=True)
            rows["margin_vs_best_peer"] = margin
        out[name] = rows
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: " + ", ".join(SETTINGS))
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--skip", default="", help="comma-separated substrings of contenders to skip")
    ap.add_argument("--supervised", action="store_true", help="also run the supervised table")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args(argv)
    res = {"unsupervised": unsupervised(args.settings.split(","), args.k, {x for x in args.skip.split(",") if x})}
    if args.supervised:
        import bench_defaults_supervised
        res["supervised"] = bench_defaults_supervised.run()
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
