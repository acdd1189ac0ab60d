"""Benchmark for the Alias-MH engine (issue: Alias-MH engine).

20 Newsgroups train split (via bench_core.Corpus: the same tokens for every contender),
single core, batch mode:

* speed   - sampling throughput (tokens/s per core) of streamtopics ``TopicModel(engine="alias")
            .fit`` vs tomotopy ``LDAModel`` (workers=1, ParallelScheme.NONE, alpha optimisation
            off) vs the plain O(K) Gibbs reference, at K = 100, 400, 1024, 4096, over the same
            sweeps from a uniform start (100 by default, 30 at K=4096: a sampler's first sweeps
            move more tokens and cost more, so a short run understates a long fit).  Only
            sampling is timed: tokenising, adding documents, initial assignment and compilation
            are not.  Runs are paired (ours, tomotopy, ours, tomotopy, ...) over ``--rounds`` and
            the median ratio is reported: this host's speed drifts 10-20% between runs.
* quality - held-out document completion (test split, the one scoring function
            ``completion_loglik``) after the *same* number of sweeps: alias vs the exact O(K)
            Gibbs reference, same tokens and uniform start; fewer documents/sweeps at large K
            where the O(K) reference would take too long (both contenders use the same ones).
* stream  - one pass in minibatches of 256, K=100: alias vs the L-sparse variational engine.
* kernels - the two batch kernels forced (``alias_dense`` dense exact Gibbs vs alias-MH), paired,
            per K: the measurement behind ``alias_dense.DENSE_MAX_K`` (where "auto" switches).

    python bench/bench_alias.py                        # everything (~60 min on one free core)
    python bench/bench_alias.py --section speed --k 100,1024
    python bench/bench_alias.py --section kernels --k 100,200,256,320,400,512 --speed-sweeps 20
    python bench/bench_alias.py --quick                # smoke run

Needs the bench extra (tomotopy): pip install -e '.[bench]'.  Take timings on a quiet machine
(the script prints the load average before each timed run).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # single core for every contender

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_core import ALPHA, BETA, BATCH, Corpus, run_streamtopics  # noqa: E402
from streamtopics import TopicModel  # noqa: E402
from streamtopics.evaluate import completion_loglik  # noqa: E402
from streamtopics.engines.alias import batch_tokens  # noqa: E402
from streamtopics.engines.gibbs_ref import gibbs_fit, topic_word_from_counts  # noqa: E402

RESULTS = Path(__file__).with_name("results")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _first_docs(batch, n: int):
    from streamtopics.batch import batch_from_arrays

    if n is None or n >= batch.n_docs:
        return batch
    e = batch.doc_ptr[n]
    return batch_from_arrays(batch.doc_ptr[: n + 1], batch.word_ids[:e], batch.counts[:e])


class Data:
    """A Corpus plus the token arrays the samplers share (optionally only the first n_docs).

    ``n_test`` scores on the first n_test documents of the completion split only: the shared
    scorer runs the dense local step, whose memory is O(entries x K) (~10 GB for the whole
    test split at K=1024), so large K are scored on a fixed subset - the same for everyone.
    """

    def __init__(self, corpus: Corpus, n_docs: int | None = None, n_test: int | None = None):
        self.corpus = corpus
        self.part_a = _first_docs(corpus.part_a, n_test)
        self.part_b = _first_docs(corpus.part_b, n_test)
        self.n_test = self.part_a.n_docs
        self.tokens = corpus.train_tokens[:n_docs]
        b = _first_docs(corpus.train, n_docs)
        self.batch = b
        self.tok_w, self.tok_ptr = batch_tokens(b)
        self.n_tokens = int(self.tok_w.size)
        self.V = int(b.uniq.size)  # vocabulary of these documents (what every sampler sees)

    def score(self, topic_word: np.ndarray) -> float:
        return completion_loglik(topic_word, self.part_a, self.part_b, ALPHA)

    def full(self, tw_uniq: np.ndarray) -> np.ndarray:
        """(K, U) topic-word rows over batch.uniq -> (K, V_corpus) for the shared scorer."""
        out = np.full((tw_uniq.shape[0], len(self.corpus.vocab)), 1e-12)
        out[:, self.batch.uniq] = tw_uniq
        return out / out.sum(axis=1, keepdims=True)


# -- contenders -----------------------------------------------------------------------------------
def fit_with_kernel(m: TopicModel, docs, sweeps: int, kernel: str) -> TopicModel:
    """``m.fit(docs, n_sweeps=sweeps)`` with the batch kernel forced ("dense" / "mh"): the steps
    of ``fitting.fit_sweeps`` through public methods, the engine's ``kernel`` set in between."""
    m.reset()
    batch = m.prepare(m.tokenize(docs), grow=True)
    m.local_step.kernel = kernel
    m.last_stats = m.local_step.fit_state(m.state, batch, int(sweeps), seed=int(m.rng.integers(1 << 62)))
    return m


def run_alias(data: Data, K: int, sweeps: int, seed: int = 0, score: bool = True, kernel: str = "auto",
              **kw) -> dict:
    m = TopicModel(n_topics=K, engine="alias", alpha=ALPHA, beta=BETA, seed=seed, **kw)
    if kernel == "auto":
        m.fit(data.tokens, n_sweeps=sweeps)  # the library's own choice
    else:
        fit_with_kernel(m, data.tokens, sweeps, kernel)
    st = m.last_stats
    assert st["tokens"] == data.n_tokens, (st["tokens"], data.n_tokens)
    out = {"kernel": st["kernel"], "seconds": st["sampling_seconds"], "tokens_per_s": st["tokens_per_s"],
           "sweeps": sweeps,
           "mh_acceptance": st["mh_acceptance"], "alias_rebuilds": st["alias_rebuilds"], "params": kw,
           "tries": st["tries"], "rows_mib": st["rows_mib"]}
    if score:
        out["heldout"] = data.score(data.corpus.align(m))
    del m
    gc.collect()
    return out


def run_gibbs(data: Data, K: int, sweeps: int, seed: int = 0, score: bool = True) -> dict:
    nwk, nk, z, sec = gibbs_fit(data.tok_w, data.tok_ptr, data.V, K, ALPHA, BETA, data.V, sweeps, seed=seed)
    out = {"seconds": sec, "tokens_per_s": data.n_tokens * sweeps / sec, "sweeps": sweeps}
    if score:
        out["heldout"] = data.score(data.full(topic_word_from_counts(nwk, BETA)))
    del nwk, z
    gc.collect()
    return out


def run_tomotopy(data: Data, K: int, sweeps: int, seed: int = 0, score: bool = True) -> dict:
    import tomotopy as tp

    mdl = tp.LDAModel(k=K, alpha=ALPHA, eta=BETA, seed=seed, min_cf=0, rm_top=0)
    for toks in data.tokens:
        if toks:
            mdl.add_doc(toks)
    mdl.optim_interval = 0  # keep alpha fixed, as for the other contenders
    mdl.burn_in = 0
    mdl.train(0, workers=1, parallel=tp.ParallelScheme.NONE)  # initial assignment, off the clock
    assert mdl.num_words == data.n_tokens, (mdl.num_words, data.n_tokens)
    c0, t0 = cpu_seconds(), time.perf_counter()
    mdl.train(sweeps, workers=1, parallel=tp.ParallelScheme.NONE)
    sec = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    out = {"seconds": sec, "cpu_seconds": cpu, "tokens_per_s": data.n_tokens * sweeps / sec, "sweeps": sweeps}
    if score:
        # tomotopy's vocabulary -> the corpus' ids
        ids = data.corpus.vocab.ids(list(mdl.used_vocabs))
        tw = np.full((K, len(data.corpus.vocab)), 1e-12)
        for k in range(K):
            tw[k, ids] = mdl.get_topic_word_dist(k, normalize=True)
        out["heldout"] = data.score(tw / tw.sum(axis=1, keepdims=True))
    del mdl
    gc.collect()
    return out


def warm_up(corpus: Corpus) -> None:
    """Compile (or load) every numba kernel outside the clocks."""
    small = Data(corpus, 50)
    for kern in ("dense", "mh"):
        run_alias(small, 8, 2, kernel=kern)
    run_gibbs(small, 8, 2, score=False)


# -- sections -------------------------------------------------------------------------------------
def _variants(args) -> list[tuple[str, dict]]:
    """(label, TopicModel kwargs) of the alias settings to run: the defaults first."""
    out = []
    for mh in args.mh:
        for tries in args.tries:
            kw = {} if mh == "auto" else {"mh_steps": int(mh)}
            if tries != "auto":  # "2" (both kinds) or "2x1" (word x doc candidates)
                kw["tries"] = tuple(int(t) for t in tries.split("x")) if "x" in tries else int(tries)
            out.append((f"mh={mh} tries={tries}", kw))
    return out


def section_speed(corpus: Corpus, ks: list[int], args) -> dict:
    data = Data(corpus)
    print(f"\n[speed] 20NG train: {len(data.tokens)} docs, {data.n_tokens:,} tokens, V={data.V:,}; single core, "
          f"batch mode; sampling time only; {args.rounds} paired rounds, median", flush=True)
    res = {}
    variants = _variants(args)
    for K in ks:
        sweeps = args.speed_sweeps if K <= 1024 else max(args.speed_sweeps * 3 // 10, 5)
        s_ref = max(2, min(sweeps, int(args.speed_sweeps * 50 / K)))  # O(K): a few sweeps give the rate
        print(f"  K={K} ({sweeps} sweeps): load {load()}", flush=True)
        runs = {label: [] for label, _ in variants}
        runs["tomotopy"] = []
        for r in range(args.rounds):
            for label, kw in variants:
                a = run_alias(data, K, sweeps, score=False, **kw)
                runs[label].append(a)
                print(f"    round {r + 1} alias {label:<16} [{a['kernel']}] {a['tokens_per_s'] / 1e6:6.2f} M tok/s  "
                      f"{1e9 / a['tokens_per_s']:6.0f} ns/token  acceptance word {a['mh_acceptance']['word']:.2f} "
                      f"doc {a['mh_acceptance']['doc']:.2f}, rows {a['rows_mib']:.0f} MiB", flush=True)
            t = run_tomotopy(data, K, sweeps, score=False)
            runs["tomotopy"].append(t)
            print(f"    round {r + 1} tomotopy{'':<10} {t['tokens_per_s'] / 1e6:6.2f} M tok/s  "
                  f"{1e9 / t['tokens_per_s']:6.0f} ns/token  (cpu/wall {t['cpu_seconds'] / t['seconds']:.2f})",
                  flush=True)
        g = run_gibbs(data, K, s_ref, score=False)
        print(f"    gibbs-ref {g['tokens_per_s'] / 1e6:6.2f} M tok/s ({s_ref} sweeps)", flush=True)
        r = {"sweeps": sweeps, "gibbs_ref": g, "runs": runs, "ratio_vs_tomotopy": {}}
        for label, _ in variants:
            ratios = [a["tokens_per_s"] / t["tokens_per_s"] for a, t in zip(runs[label], runs["tomotopy"])]
            r["ratio_vs_tomotopy"][label] = float(np.median(ratios))
            r[label] = float(np.median([a["tokens_per_s"] for a in runs[label]]))
            rounds = ", ".join(f"{x:.2f}" for x in ratios)
            print(f"    => alias {label}: {np.median(ratios):.2f}x tomotopy (rounds {rounds}), "
                  f"{r[label] / g['tokens_per_s']:.2f}x gibbs-ref", flush=True)
        r["tomotopy"] = float(np.median([t["tokens_per_s"] for t in runs["tomotopy"]]))
        res[K] = r
    print("\n  K      sweeps  " + "".join(f"alias {lb} M/s  " for lb, _ in variants)
          + "tomotopy M/s  " + "".join(f"{lb} / tomotopy  " for lb, _ in variants) + "alias ns/token")
    for K, r in res.items():
        al = [r[lb] for lb, _ in variants]
        speeds = "".join(f"{a / 1e6:{len(lb) + 10}.2f}  " for a, (lb, _) in zip(al, variants))
        ratios = "".join(f"{r['ratio_vs_tomotopy'][lb]:{len(lb) + 11}.2f}x " for lb, _ in variants)
        tomo = f"{r['tomotopy'] / 1e6:12.2f}  "
        print(f"  {K:<6} {r['sweeps']:>6}  " + speeds + tomo + ratios + f"{1e9 / al[0]:12.0f}")
    return res


def section_kernels(corpus: Corpus, ks: list[int], args) -> dict:
    """The batch kernels against each other: dense exact Gibbs vs alias-MH, forced, paired rounds,
    the same sweeps from a uniform start; where the dense kernel stops being faster is
    ``alias_dense.DENSE_MAX_K``."""
    data = Data(corpus)
    sweeps = args.speed_sweeps
    print(f"\n[kernels] 20NG train: {data.n_tokens:,} tokens, V={data.V:,}; {sweeps} sweeps, {args.rounds} paired "
          f"rounds (dense, mh), median; sampling time only", flush=True)
    res = {}
    for K in ks:
        runs = {"dense": [], "mh": []}
        for r in range(args.rounds):
            for kern in runs:
                runs[kern].append(run_alias(data, K, sweeps, score=False, kernel=kern)["tokens_per_s"])
            print(f"  K={K:<5} round {r + 1}: dense {1e9 / runs['dense'][-1]:5.0f} ns/token, mh "
                  f"{1e9 / runs['mh'][-1]:5.0f} ns/token; load {load()}", flush=True)
        ratio = float(np.median([d / m for d, m in zip(runs["dense"], runs["mh"])]))
        res[K] = {"dense_ns": 1e9 / float(np.median(runs["dense"])), "mh_ns": 1e9 / float(np.median(runs["mh"])),
                  "dense_over_mh_speed": ratio, "runs": runs}
        print(f"  K={K:<5} => dense {res[K]['dense_ns']:.0f} ns/token, mh {res[K]['mh_ns']:.0f} ns/token, "
              f"dense speed {ratio:.2f}x mh", flush=True)
    return res


def section_quality(corpus: Corpus, ks: list[int], args) -> dict:
    # K: (training docs, sweeps, test docs); the O(K) reference bounds the large-K runs
    q = args.quality_sweeps
    plan = {100: (None, q, None), 400: (None, q, 3000), 1024: (None, q, 1500), 4096: (2000, q // 2, 500)}
    if args.quick:
        plan = {k: (800, 20, 500) for k in plan}
    print("\n[quality] held-out completion after the same sweeps: alias vs exact O(K) Gibbs", flush=True)
    res = {}
    for K in ks:
        n_docs, sweeps, n_test = plan.get(K, (2000, 50, 500))
        data = Data(corpus, n_docs, n_test)
        g = run_gibbs(data, K, sweeps, seed=1)
        res[K] = {"docs": len(data.tokens), "tokens": data.n_tokens, "sweeps": sweeps, "test_docs": data.n_test,
                  "gibbs_ref": g}
        print(f"  K={K:<5} {len(data.tokens):>5} docs {sweeps:>4} sweeps, {data.n_test} test docs: "
              f"gibbs-ref {g['heldout']:.4f} ({g['tokens_per_s'] / 1e6:.2f} M tok/s)", flush=True)
        for label, kw in _variants(args):
            a = run_alias(data, K, sweeps, seed=1, **kw)
            gap = (a["heldout"] - g["heldout"]) / abs(g["heldout"])
            res[K][f"alias {label}"] = dict(a, relative_gap=gap)
            print(f"          alias {label} ({a['kernel']} kernel): {a['heldout']:.4f}  gap {100 * gap:+.2f}% (target: within 1%)  "
                  f"({a['tokens_per_s'] / 1e6:.2f} M tok/s, tries used {a['tries']})", flush=True)
    return res


def section_stream(corpus: Corpus, args) -> dict:
    K = 100
    print(f"\n[stream] one pass, minibatches of {BATCH}, K={K}: alias vs L-sparse variational", flush=True)
    v = run_streamtopics(corpus, K)
    a = run_streamtopics(corpus, K, engine="alias")
    st = a["model"].last_stats
    for r in (v, a):
        r.pop("model")
    gap = (a["heldout"] - v["heldout"]) / abs(v["heldout"])
    print(f"  lsparse L=8     heldout {v['heldout']:.4f}  {v['tokens_per_s']:>9,.0f} tok/s")
    print(f"  alias (4+4 sw.) heldout {a['heldout']:.4f}  {a['tokens_per_s']:>9,.0f} tok/s  "
          f"acceptance word {st['mh_acceptance']['word']:.2f} doc {st['mh_acceptance']['doc']:.2f}")
    print(f"  => alias vs variational held-out {100 * gap:+.2f}% (target: within 2%)")
    return {"lsparse": v, "alias": a, "relative_gap": gap}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=["speed", "quality", "stream", "kernels", "all"], default="all")
    ap.add_argument("--k", default="100,400,1024,4096", help="comma-separated topic counts")
    ap.add_argument("--speed-sweeps", type=int, default=100)
    ap.add_argument("--quality-sweeps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2, help="paired speed rounds (median ratio)")
    ap.add_argument("--mh", default="auto", help="MH steps per token to run the alias engine with: auto (the default "
                    "for K, with tries: alias_core.resolve_steps) and/or N (first: headline)")
    ap.add_argument("--tries", default="auto", help="candidates per MH step: auto (the default), N (both kinds) and/or WxD (word x doc)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    args.mh = [x if x == "auto" else int(x) for x in args.mh.split(",")]
    args.tries = args.tries.split(",")
    ks = [int(k) for k in args.k.split(",")]
    if args.quick:
        args.speed_sweeps = 4
        args.rounds = 1
    corpus = Corpus(n_train=3000 if args.quick else None, n_test=1000 if args.quick else None)
    warm_up(corpus)
    results = {"load_before": load()}
    if args.section in ("speed", "all"):
        results["speed"] = section_speed(corpus, ks, args)
    if args.section in ("kernels", "all"):
        results["kernels"] = section_kernels(corpus, ks, args)
    if args.section in ("quality", "all"):
        results["quality"] = section_quality(corpus, ks, args)
    if args.section in ("stream", "all"):
        results["stream"] = section_stream(corpus, args)
    results["load_after"] = load()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"alias-{args.section}{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps(results, indent=1, default=float))
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
