"""The alias engine's supervised ``fit()`` with the library DEFAULTS only (issue 15).

``TopicModel(n_topics=100, supervision=loss, engine="alias").fit(train, labels=...)``, nothing else
set, on 20NG (bydate, the package's tokenizer, as ``bench_defaults_supervised.py``) and Reuters R8:
test accuracy, wall and CPU seconds of ``fit`` and where they go (kernel sweeps, the per-sweep
supervised hook, the classifier's refit on label-free features), the sweeps the stopping rule
chose and the learned alpha.  Target on 20NG: >= 0.82 in <= 34 s (half of LightMedLDA's C++
68 s at K=100, a figure stated for this machine type, not run here).

    python bench/bench_alias_fit.py                              # 20ng and r8, hinge and logistic
    python bench/bench_alias_fit.py --corpora 20ng --losses hinge
    python bench/bench_alias_fit.py --corpora 20ng --seeds 0,1,2,3,4     # model seeds, and their mean
    python bench/bench_alias_fit.py --corpora 20ng --sweeps 10,20,40 --vb
        # fixed chains (tol=0) of those lengths instead of the rule; --vb also scores the fitted
        # topics with the variational engine's label-free local step (prediction-path check)

Timings are wall-clock with NUMBA/BLAS threads = 1 on a shared machine (load printed); CPU
seconds of the process are printed too.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_defaults_supervised import _acc, _load, _load_avg  # noqa: E402
from streamtopics import TopicModel  # noqa: E402
from streamtopics.batch_ops import chunks, doc_lengths, normalise_rows, slice_batch  # noqa: E402
from streamtopics.components import build_engine  # noqa: E402
from streamtopics.options import LSparse  # noqa: E402
from streamtopics.parallel import ThreadRunner  # noqa: E402

K = 100
TARGET_ACC, TARGET_SECONDS = 0.82, 34.0


def _warm_up(losses) -> None:
    docs = [["alpha", "beta", "gamma", "delta"] * 5, ["beta", "eps", "zeta"] * 4, ["gamma", "zeta", "eta"] * 3] * 4
    for loss in losses:
        TopicModel(n_topics=3, supervision=loss, engine="alias").fit(docs, labels=["a", "b", "a"] * 4).predict(docs)


def vb_accuracy(m: TopicModel, trX, trY, teX, teY) -> float:
    """The fitted topics scored through the variational label-free local step: features of the
    training documents -> a fresh head (as fit's refit), then test accuracy."""
    eng = build_engine(LSparse(), runner=lambda: ThreadRunner(1), seed_source=None)

    def feats(docs):
        b = m.prepare(m.tokenize(docs), grow=False)
        Z = np.empty((b.n_docs, K))
        for lo, hi in chunks(b.n_docs):
            Z[lo:hi] = normalise_rows(eng.infer(m.state, slice_batch(b, lo, hi), summarize=False).doc_topic)
        return b, Z

    btr, Ztr = feats(trX)
    _, Zte = feats(teX)
    h = m.new_head()
    h.calibrate(doc_lengths(btr), h.encode_targets(trY, grow=True))
    h.eta[:] = m.head.eta
    h.update(Ztr, trY, n_sweeps=20)
    return _acc(h.predict(Zte), teY)


def run(corpus: str, loss: str, n_iter: int | None, vb: bool, seed: int | None = None) -> dict:
    trX, trY, teX, teY = _load(corpus, False)
    m = TopicModel(n_topics=K, supervision=loss, engine="alias", **({} if seed is None else {"seed": seed}))
    kw = {} if n_iter is None else {"n_iter": n_iter, "tol": 0}
    t0, c0 = time.perf_counter(), time.process_time()
    m.fit(trX, labels=trY, **kw)
    sec, cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    acc = _acc(m.predict(teX), teY)
    st = m.last_stats
    rule = "defaults" if n_iter is None else f"n_iter={n_iter}, tol=0"
    row = dict(corpus=corpus, loss=loss, rule=rule if seed is None else f"{rule}, seed {seed}",
               accuracy=acc, fit_seconds=sec, fit_cpu_seconds=cpu, sweeps=st["sweeps"],
               kernel_seconds=st["kernel_seconds"], hook_seconds=st["supervised_seconds"],
               refit_seconds=st.get("refit_seconds", 0.0), predict_seconds=time.perf_counter() - t1,
               alpha=m.state.alpha, load=_load_avg())
    if vb:
        row["vb_path_accuracy"] = vb_accuracy(m, trX, trY, teX, teY)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpora", default="20ng,r8")
    ap.add_argument("--losses", default="hinge,logistic")
    ap.add_argument("--sweeps", default="", help="comma list of fixed chain lengths (tol=0) instead of the rule")
    ap.add_argument("--vb", action="store_true", help="also score the topics through the variational local step")
    ap.add_argument("--seeds", default="", help="comma list of model seeds (default: the library's); prints their mean")
    a = ap.parse_args(argv)
    losses = a.losses.split(",")
    _warm_up(losses)
    lengths = [int(x) for x in a.sweeps.split(",")] if a.sweeps else [None]
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else [None]
    print(f"alias fit, K={K}, defaults; target on 20ng >= {TARGET_ACC} in <= {TARGET_SECONDS:.0f} s; "
          f"load {_load_avg()}", flush=True)
    for corpus in a.corpora.split(","):
        for loss in losses:
            for n in lengths:
                accs = []
                for seed in seeds:
                    r = run(corpus, loss, n, a.vb, seed)
                    accs.append(r["accuracy"])
                    _print_row(r, corpus == "20ng" and n is None)
                if len(seeds) > 1:
                    print(f"{corpus:5s} {loss:8s} mean of seeds {seeds}: acc {np.mean(accs):.4f} (sd {np.std(accs):.4f})"
                          + (f"  {'MET' if np.mean(accs) >= TARGET_ACC else 'not met'} on accuracy"
                             if corpus == "20ng" and n is None else ""), flush=True)


def _print_row(r: dict, target: bool) -> None:
    met = ""
    if target:
        met = "  MET" if r["accuracy"] >= TARGET_ACC and r["fit_seconds"] <= TARGET_SECONDS else "  not met"
    print(f"{r['corpus']:5s} {r['loss']:8s} {r['rule']:16s} acc {r['accuracy']:.4f}"
          + (f" (vb path {r['vb_path_accuracy']:.4f})" if vb_key(r) else "")
          + f"  fit {r['fit_seconds']:.1f} s (cpu {r['fit_cpu_seconds']:.1f}; {r['sweeps']} sweeps:"
          f" kernel {r['kernel_seconds']:.1f}, hook {r['hook_seconds']:.1f}, refit "
          f"{r['refit_seconds']:.1f})  predict {r['predict_seconds']:.1f} s  alpha {r['alpha']:.4f}"
          f"  load {r['load']}{met}", flush=True)


def vb_key(r: dict) -> bool:
    return "vb_path_accuracy" in r


if __name__ == "__main__":
    main()
