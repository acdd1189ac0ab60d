"""Probe what the size of the *first* batch does to one pass (docs/defaults.md §6): defaults,
K topics, a first batch of n documents and batches of ``--batch`` after it, held-out score
(bench_defaults' scorer), one line per first-batch size with every seed and their mean.

    python bench/probe_first_batch.py 20ng-df5 --first 1,4,16,64,256 --seeds 0,1
    python bench/probe_first_batch.py r8-df5 --first 1,256 --seeds 0,1,2,3,4 --topics 50
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpora_prep import SETTINGS, Setting  # noqa: E402

from streamtopics import TopicModel  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("setting", choices=sorted(SETTINGS))
    ap.add_argument("--first", default="1,4,16,64,256", help="first-batch sizes, comma-separated")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--batch", type=int, default=256, help="documents per batch after the first")
    a = ap.parse_args(argv)
    s = Setting(a.setting)
    TopicModel(n_topics=a.topics).partial_fit(s.train[:16])  # numba cache warm-up
    for f in (int(x) for x in a.first.split(",")):
        scores = []
        for seed in (int(x) for x in a.seeds.split(",")):
            m = TopicModel(n_topics=a.topics, seed=seed)
            m.partial_fit(s.train[:f])
            for lo in range(f, s.n_docs, a.batch):
                m.partial_fit(s.train[lo:lo + a.batch])
            scores.append(s.score(s.align(m), m.state.alpha))
        print(f"{a.setting} K={a.topics} first {f} then {a.batch}: " + " ".join(f"{x:.4f}" for x in scores)
              + f"  mean {np.mean(scores):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
