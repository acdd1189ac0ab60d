"""Defaults only: streamtopics as a new user gets it, against peers with their documented settings.

    python bench/bench_defaults.py                        # every setting, K=100, one pass
    python bench/bench_defaults.py --settings 20ng-df5,r8-df5 --k 100 --json out.json
    python bench/bench_defaults.py --k 20 --reference    # also streamtopics told D = N, 2N (not peers)

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
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from corpora_prep import SETTINGS, Setting  # noqa: E402
from peers import BATCH, cpu_seconds, result, run_gensim, run_sklearn, run_vw  # noqa: E402

from streamtopics import TopicModel  # noqa: E402

def run_streamtopics(s: Setting, K: int, seed: int = 0, **told) -> dict:
    TopicModel(n_topics=K).partial_fit(s.train[:16])  # numba cache warm-up outside the clock
    m = TopicModel(n_topics=K, seed=seed, **told)
    c0, t0 = cpu_seconds(), time.perf_counter()
    for lo in range(0, s.n_docs, BATCH):
        m.partial_fit(s.train[lo:lo + BATCH])
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return result(s, wall, cpu, s.score(s.align(m), m.state.alpha), alpha=float(m.state.alpha),
                  beta=float(m.state.beta))


CONTENDERS = {
    "streamtopics (defaults)": run_streamtopics,
    "gensim (defaults: decay 0.5, offset 1)": lambda s, K, seed=0: run_gensim(s, K, 0.5, 1.0, seed=seed),
    "gensim (decay 0.7, offset 10)": lambda s, K, seed=0: run_gensim(s, K, 0.7, 10.0, seed=seed),
    "scikit-learn online (told N)": run_sklearn,
    "Vowpal Wabbit --lda (told N)": run_vw,
}

# --reference: streamtopics TOLD the corpus size (D = N, 2N): where the default's D stands
# against the fixed-D optimum.  Not peers: never counted in the margin.
REFERENCES = {
    "ref: streamtopics corpus_size=N (told)": lambda s, K, seed=0: run_streamtopics(s, K, seed, corpus_size=s.n_docs),
    "ref: streamtopics corpus_size=2N (told)": lambda s, K, seed=0: run_streamtopics(s, K, seed,
                                                                                   corpus_size=2 * s.n_docs),
}


def unsupervised(settings: list[str], K: int, skip: set[str], reference: bool = False, seeds=(0,)) -> dict:
    """Every contender once per seed (its own random start: streamtopics ``seed``, gensim and
    scikit-learn ``random_state``, VW ``--random_seed``); rows hold the mean over seeds, and the
    margin compares means (one seed's margin is within the seed-to-seed spread)."""
    out: dict = {}
    for name in settings:
        s = Setting(name)
        print(f"\n== {name}: {s.n_docs} train docs, {s.n_tokens:,} tokens, V={len(s.vocab):,}, "
              f"{len(s.test)} test docs, K={K}, one pass, batches of {BATCH}", flush=True)
        rows = {}
        for label, fn in {**CONTENDERS, **(REFERENCES if reference else {})}.items():
            if any(x in label for x in skip):
                continue
            try:
                runs = [fn(s, K, seed=seed) for seed in seeds]
            except ImportError as e:
                print(f"  {label:<42} skipped ({e.name} not installed)")
                continue
            held = [r["heldout"] for r in runs]
            r = {**runs[0], "heldout": float(np.mean(held)), "heldout_by_seed": held,
                 "heldout_sd": float(np.std(held, ddof=1)) if len(held) > 1 else 0.0,
                 "seconds": float(np.median([x["seconds"] for x in runs])),
                 "tokens_per_s": float(np.median([x["tokens_per_s"] for x in runs]))}
            rows[label] = r
            spread = (f" (sd {r['heldout_sd']:.4f} over seeds {','.join(map(str, seeds))}: "
                      f"{' '.join(f'{h:.4f}' for h in held)})" if len(held) > 1 else "")
            print(f"  {label:<42} held-out {r['heldout']:8.4f}  {r['tokens_per_s']:>10,.0f} tok/s  "
                  f"{r['seconds']:6.1f}s{spread}", flush=True)
        ours = rows.get("streamtopics (defaults)")
        peers = {k: v for k, v in rows.items() if k != "streamtopics (defaults)" and k not in REFERENCES}
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
    ap.add_argument("--reference", action="store_true", help="also streamtopics told D = N and 2N (not peers)")
    ap.add_argument("--supervised", action="store_true", help="also run the supervised table")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds; every contender runs once per seed, means compared")
    args = ap.parse_args(argv)
    res = {"unsupervised": unsupervised(args.settings.split(","), args.k, {x for x in args.skip.split(",") if x},
                                    args.reference, [int(x) for x in args.seeds.split(",")])}
    if args.supervised:
        import bench_defaults_supervised
        res["supervised"] = bench_defaults_supervised.run()
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
