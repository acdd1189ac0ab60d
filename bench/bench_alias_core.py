"""Paired timing of the one alias sweep kernel against the two kernels it replaced (issue 16).

``alias_core.mh_sweeps`` is one kernel for LDA and supervised (LightMedLDA) runs: the supervised
term is an argument, and every ``sup is None`` test is resolved when numba specialises on its
type (dead-branch pruning), so each variant should compile to what its former separate kernel
was.  This script checks that on the kernel calls of the batch mode (g = beta, hash rows, the
shared prior table, uniform start) and of streaming (dense lambda prior, start from the word
tables), LDA and supervised (4 labels): the draws are bit-identical (the statistics are compared
every round; tests/test_alias_fingerprint.py for the chains), so both sides do exactly the same
work and only the code differs.  Time is this thread's CPU time (the kernels run in the calling
thread), which a busy machine disturbs less than wall time.  Rounds alternate (new, old / old,
new) and the median per-round ratio new/old is reported with the ratio of the fastest runs;
absolute seconds are noisy on a shared machine, the paired ratios much less.

The baseline is the package as it was before the change, imported under another name:

    git archive 056f653 streamtopics | tar -x -C /tmp/alias_base
    mv /tmp/alias_base/streamtopics /tmp/alias_base/streamtopics_base
    python bench/bench_alias_core.py --baseline /tmp/alias_base [--docs 1000 --rounds 11 --k 100,1024]

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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench_core import ALPHA, BETA, Corpus  # noqa: E402


def _packages(baseline: str):
    new = (importlib.import_module("streamtopics.engines.alias"),
           importlib.import_module("streamtopics.engines.alias_supervised"))
    sys.path.insert(0, baseline)
    old = (importlib.import_module("streamtopics_base.engines.alias"),
           importlib.import_module("streamtopics_base.engines.alias_supervised"))
    return {"new": new, "old": old}


class Case:
    """The inputs of one kernel call: 6 sweeps over the tokens, mh_steps 2, default tries."""

    def __init__(self, tok_w, tok_ptr, U: int, K: int, path: str, supervised: bool):
        rng = np.random.default_rng(0)
        self.tok_w, self.tok_ptr, self.U, self.K = tok_w, tok_ptr, U, K
        self.supervised = supervised
        if path == "stream":  # a dense prior lambda, as after some updates
            self.G = BETA + rng.gamma(0.1, 1.0, size=(U, K))
            self.Gk, self.dense, self.init, self.freq = self.G.sum(0) + 100.0, True, 2, None
        else:
            self.G, self.Gk, self.dense, self.init = np.zeros((1, 1)), np.full(K, U * BETA), False, 1
            self.freq = np.bincount(tok_w, minlength=U)
        D = tok_ptr.size - 1
        self.eta = rng.normal(size=(4, K))
        self.rho = np.abs(rng.normal(size=(D, 4))) * 0.2
        self.kappa = rng.normal(size=(D, 4))

    def run(self, mods) -> tuple[float, np.ndarray]:
        alias, sup = mods
        arr = alias.SamplerArrays(self.U, self.tok_w.size, self.K, None, self.freq)
        args = (5, self.tok_w, self.tok_ptr, self.Gk, self.G, self.dense, BETA, ALPHA, 6, 2)
        t0 = time.thread_time()
        if self.supervised:
            st = sup.run_sweeps(arr, *args, 0, self.init, self.eta, self.rho, self.kappa,
                                np.ones(self.tok_ptr.size - 1, bool), tries=(2, 1) if self.K >= 256 else (1, 1))
        else:
            st = arr.run(*args, False, self.init, tries=None)
        return time.thread_time() - t0, st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="directory holding the former package as streamtopics_base")
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--k", default="100,1024")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--paths", default="batch,stream", help="which calls: batch,stream")
    ap.add_argument("--kinds", default="lda,supervised", help="which runs: lda,supervised")
    args = ap.parse_args(argv)
    pkgs = _packages(args.baseline)
    b = Corpus(n_train=args.docs, n_test=10).train
    tok_w, tok_ptr = pkgs["new"][0].batch_tokens(b)
    print(f"{b.n_docs} documents, {tok_w.size} tokens, load {os.getloadavg()[0]:.2f}", flush=True)
    for K in [int(k) for k in args.k.split(",")]:
        for path in args.paths.split(","):
            for kind in args.kinds.split(","):
                case = Case(tok_w, tok_ptr, b.uniq.size, K, path, kind == "supervised")
                for name in pkgs:  # compile / load from the cache
                    case.run(pkgs[name])
                ratios, secs = [], {"new": [], "old": []}
                for r in range(args.rounds):
                    got = {}
                    for name in (("new", "old") if r % 2 == 0 else ("old", "new")):
                        got[name] = case.run(pkgs[name])
                        secs[name].append(got[name][0])
                    assert np.array_equal(got["new"][1], got["old"][1]), "the draws differ"
                    ratios.append(got["new"][0] / got["old"][0])
                print(f"K={K:5d} {path:6s} {kind:10s}  new/old median {statistics.median(ratios):.3f}, fastest "
                      f"{min(secs['new']) / min(secs['old']):.3f} ({min(secs['new']):.3f} s vs {min(secs['old']):.3f} s)"
                      f"; rounds {' '.join(f'{x:.2f}' for x in ratios)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
