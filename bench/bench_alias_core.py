"""Paired timing of the one alias sweep kernel against the two kernels it replaced (issue 16).

``alias_core.mh_sweeps`` is one kernel for LDA and supervised (LightMedLDA) runs: the supervised
term is an argument, and every ``sup is None`` test is resolved when numba specialises on its
type (dead-branch pruning), so each variant should compile to what its former separate kernel
was.  This script checks that on the library's batch and streaming paths: the draws are
bit-identical (tests/test_alias_fingerprint.py), so both sides do exactly the same work and only
kernel time differs.  Rounds alternate (new, old, new, old, ... with the order flipped every
round) and the median per-round ratio new/old is reported; absolute seconds are noisy on a
shared machine, the paired ratio much less.

The baseline is the package as it was before the change, imported under another name:

    git archive 056f653 streamtopics | tar -x -C /tmp/alias_base
    mv /tmp/alias_base/streamtopics /tmp/alias_base/streamtopics_base
    python bench/bench_alias_core.py --baseline /tmp/alias_base [--docs 2000 --rounds 5 --k 100,1024]

20 Newsgroups train split (first ``--docs`` documents, bench_core.Corpus tokens); single core.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import importlib
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_core import ALPHA, BETA, Corpus  # noqa: E402


def _packages(baseline: str):
    new = {"alias": importlib.import_module("streamtopics.engines.alias"),
           "head": importlib.import_module("streamtopics.supervised.classifier"),
           "state": importlib.import_module("streamtopics.state")}
    sys.path.insert(0, baseline)
    old = {"alias": importlib.import_module("streamtopics_base.engines.alias"),
           "head": importlib.import_module("streamtopics_base.supervised.classifier"),
           "state": importlib.import_module("streamtopics_base.state")}
    return new, old


def batch_seconds(pkg, batch, labels, K, sweeps, supervised):
    """Kernel seconds of a batch-mode fit (fit_state; the head's time excluded)."""
    st = pkg["state"].ModelState(K, ALPHA, BETA)
    st.ensure_words(int(batch.uniq.max()) + 1)
    st.n_words = int(batch.uniq.max()) + 1
    eng = pkg["alias"].AliasEngine()
    if not supervised:
        return eng.fit_state(st, batch, sweeps, seed=1)["sampling_seconds"]
    head = pkg["head"].SupervisedHead(K, "hinge", seed=0)
    targets = head.encode_targets(labels)
    return eng.fit_state(st, batch, sweeps, seed=1, head=head, targets=targets)["kernel_seconds"]


def stream_seconds(pkg, batch, labels, K, supervised, fitted):
    """Wall seconds of one streaming local step over the batch (8 sweeps; head time excluded)."""
    import time

    eng = pkg["alias"].AliasEngine(seed=3)
    kw = {}
    if supervised:
        head = pkg["head"].SupervisedHead(K, "hinge", seed=0)
        kw = dict(head=head, targets=head.encode_targets(labels))
    t0 = time.perf_counter()
    r = eng.infer(fitted, batch, summarize=True, **kw)
    return time.perf_counter() - t0 - r.stats.get("augment_seconds", 0.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="directory holding the former package as streamtopics_base")
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--k", default="100,1024")
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    new, old = _packages(args.baseline)
    corpus = Corpus(n_train=args.docs, n_test=10)
    batch, labels = corpus.train, corpus.labels
    print(f"{batch.n_docs} documents, {int(batch.counts.sum())} tokens, load {os.getloadavg()[0]:.2f}", flush=True)
    for K in [int(k) for k in args.k.split(",")]:
        fitted = {}
        for name, pkg in (("new", new), ("old", old)):  # a fitted state for the streaming path (and compile)
            st = pkg["state"].ModelState(K, ALPHA, BETA)
            st.ensure_words(int(batch.uniq.max()) + 1)
            st.n_words = int(batch.uniq.max()) + 1
            pkg["alias"].AliasEngine().fit_state(st, batch, 2, seed=0)
            fitted[name] = st
            for sup in (False, True):
                batch_seconds(pkg, batch, labels, K, 1, sup)
                stream_seconds(pkg, batch, labels, K, sup, st)
        for path in ("batch", "stream"):
            for sup in (False, True):
                ratios, secs = [], {"new": [], "old": []}
                for r in range(args.rounds):
                    order = (("new", new), ("old", old)) if r % 2 == 0 else (("old", old), ("new", new))
                    got = {}
                    for name, pkg in order:
                        if path == "batch":
                            got[name] = batch_seconds(pkg, batch, labels, K, args.sweeps, sup)
                        else:
                            got[name] = stream_seconds(pkg, batch, labels, K, sup, fitted[name])
                        secs[name].append(got[name])
                    ratios.append(got["new"] / got["old"])
                print(f"K={K:5d} {path:6s} {'supervised' if sup else 'LDA':10s}  new/old median "
                      f"{statistics.median(ratios):.3f} (rounds {' '.join(f'{x:.3f}' for x in ratios)}); "
                      f"seconds new {statistics.median(secs['new']):.3f} old {statistics.median(secs['old']):.3f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
