"""Speed per core and across cores (issue 18): the variational pass against its peers, threads,
the cost of each stage, and the alias engine against tomotopy.

Settings (bench/corpora_prep.py, the same token lists for everyone): 20NG with the common
df-filtered vocabulary (Subject + body, lowercase alphabetic tokens of >= 3 letters,
scikit-learn's stop list, words in >= 5 training documents) and a long-document setting
(20NG training documents joined in fours).  K=100, one pass, minibatches of 256; held-out
= document completion on the test split (``streamtopics.evaluate.completion_loglik``, the
same code for every contender, each with its own alpha).

* variational - streamtopics with its defaults and with ``corpus_size=50000`` (threads=1),
  gensim LdaModel (decay 0.7 / offset 10, chunksize 256), scikit-learn online LDA
  (batch_size 256, total_samples told), Vowpal Wabbit ``--lda 100`` (python package
  ``vowpalwabbit``, minibatch 256, lda_D told).  Wall and CPU seconds, tokens/s, held-out,
  and the ratio to the fastest peer in the same run, by wall clock and by CPU time (on a
  loaded machine the CPU-time ratio is the steadier one for single-threaded contenders).
* threads - streamtopics threads=1 vs threads=2, paired back to back, for the pass and for
  ``transform`` of the test split; the models are checked to be bit-identical.  Wall-clock ratios
  need two idle cores (with other work on the machine, cpu/wall of the 2-thread run falls below 2
  and the ratio measures the scheduler); the section also prints a load-proof estimate from CPU
  times (``RunClock``: serial CPU of the calling thread + the greedy makespan of every parallel
  run's ranges on 2 workers).
* stages - CPU cost per token of batch building, E[log phi], the local step (with the
  summary) and the update, in the threads=1 runs of the variational section.
* stages (``--section stages``) - wall ns/token of every stage (type checks, token -> position,
  pair counting, vocabulary, E[log phi], kernel, summary, update, ...) of a pass and of
  ``transform`` with threads 1 and 2: the stages whose time does not halve cap the threads ratio.
* alias - batch mode ``TopicModel(engine="alias").fit`` with its defaults vs tomotopy (workers=1
  and 2) at K = 100, 400, 1024, 4096 (bench_alias machinery; the alias engine's batch mode runs
  on one thread), ``--rounds`` paired rounds, median ratios; prints the kernel the engine chose
  (``alias_dense.choose_kernel``: dense exact Gibbs at small K, alias-MH above) and, where it
  chose the dense one, the MH kernel alone for its cost curve over K.

    python bench/bench_speed.py                                 # everything
    python bench/bench_speed.py --section variational --setting 20ng-df5
    python bench/bench_speed.py --section threads --n-train 4000
    python bench/bench_speed.py --section stages --setting 20ng-df5   # wall ns/token per stage, threads 1 and 2
    python bench/bench_speed.py --section alias --k 100,1024 --sweeps 30 --rounds 3

On a shared machine wall-clock speeds drift with the load: ratios are taken within one run
(paired), the load average is printed, and CPU seconds are reported beside wall seconds.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # peers single core; streamtopics threads are explicit

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corpora_prep import Setting  # noqa: E402
from peers import BATCH, cpu_seconds, run_gensim, run_sklearn, run_vw  # noqa: E402
from peers import result as _result  # noqa: E402

from streamtopics import TopicModel  # noqa: E402

K_DEFAULT = 100
RESULTS = Path(__file__).with_name("results")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# -- contenders -------------------------------------------------------------------------------
def st_params(variant: str, K: int, threads: int) -> dict:
    p = {"n_topics": K, "threads": threads}
    if variant == "cs50000":
        p["corpus_size"] = 50000
    return p


def run_streamtopics(s: Setting, K: int, variant: str, threads: int, score: bool = True, stages: bool = False):
    params = st_params(variant, K, threads)
    TopicModel(**params).partial_fit(s.train[:16])  # numba cache warm-up outside the clock
    m = TopicModel(**params)
    st = {"batch building": 0.0, "E[log phi]": 0.0, "local step": 0.0, "update": 0.0}
    if stages:
        elp = m.state.expected_log_phi

        def timed(rows, runner=None):
            t = time.process_time()
            out = elp(rows, runner=runner)
            st["E[log phi]"] += time.process_time() - t
            return out
        m.state.expected_log_phi = timed  # an instance attribute: this model only
    c0, t0 = cpu_seconds(), time.perf_counter()
    for lo in range(0, s.n_docs, BATCH):
        if stages:  # CPU time per stage (threads=1: the process's CPU time is this thread's)
            a = time.process_time()
            batch = m.prepare(m.tokenize(s.train[lo:lo + BATCH]))
            b = time.process_time()
            m.process(batch)
            c = time.process_time()
            st["batch building"] += b - a
            st["update"] += min(m.last_stats["update_seconds"], c - b)
            st["local step"] += c - b - min(m.last_stats["update_seconds"], c - b)
        else:
            m.partial_fit(s.train[lo:lo + BATCH])
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    out = _result(s, wall, cpu, s.score(s.align(m), m.state.alpha) if score else None)
    if stages:
        st["local step"] -= st["E[log phi]"]
        out["stages_cpu_ns_per_token"] = {k: 1e9 * v / s.n_tokens for k, v in st.items()}
        out["stages_cpu_ns_per_token"]["other"] = 1e9 * (cpu - sum(st.values())) / s.n_tokens
    out["model"] = m
    return out


PEERS = {
    "gensim LdaModel (decay 0.7, offset 10)": run_gensim,
    "scikit-learn online LDA (told N)": run_sklearn,
    "Vowpal Wabbit --lda (told N)": run_vw,
}


def _row(name: str, r: dict, ref: dict | None = None) -> str:
    ratio = (f"{r['tokens_per_s'] / ref['wall']:5.2f}x / {r['tokens_per_cpu_s'] / ref['cpu']:5.2f}x fastest peer"
             if ref else "")
    h = f"{r['heldout']:8.4f}" if r.get("heldout") is not None else "       -"
    return (f"  {name:<44} held-out {h}  {r['tokens_per_s']:>10,.0f} tok/s (wall)  {r['tokens_per_cpu_s']:>10,.0f} "
            f"tok/cpu-s  wall {r['seconds']:6.1f}s cpu {r['cpu_seconds']:6.1f}s {ratio}")


# -- sections ---------------------------------------------------------------------------------
def section_variational(args, name: str) -> dict:
    s = Setting(name, args.n_train, args.n_test)
    K = args.k_var
    print(f"\n[variational] {name}: {s.n_docs} train docs, {s.n_tokens:,} tokens, V={len(s.vocab):,}, "
          f"{s.part_a.n_docs} test docs; K={K}, one pass, batches of {BATCH}; load {load()}", flush=True)
    res = {}
    for pname, fn in PEERS.items():
        if pname.split()[0].lower() in args.skip:
            continue
        try:
            res[pname] = fn(s, K)
        except ImportError as e:
            print(f"  {pname}: skipped ({e})")
            continue
        print(_row(pname, res[pname]), flush=True)
    fastest = {"wall": max((r["tokens_per_s"] for r in res.values()), default=None),
               "cpu": max((r["tokens_per_cpu_s"] for r in res.values()), default=None)} if res else None
    best = max((r["heldout"] for r in res.values()), default=None)
    for variant in ("cs50000", "defaults"):
        label = f"streamtopics {'corpus_size=50000' if variant == 'cs50000' else 'defaults'} threads=1"
        r = run_streamtopics(s, K, variant, 1, stages=True)
        r.pop("model")
        res[label] = r
        print(_row(label, r, fastest), flush=True)
        print("      stages (CPU ns/token): " + ", ".join(f"{k} {v:.0f}" for k, v in r["stages_cpu_ns_per_token"].items()))
        if best is not None:
            print(f"      held-out vs best peer {r['heldout'] - best:+.4f} nats/token; speed "
                  f"{r['tokens_per_s'] / fastest['wall']:.2f}x (wall) / {r['tokens_per_cpu_s'] / fastest['cpu']:.2f}x "
                  f"(CPU time) the fastest peer (target >= 3x, held-out >= best peer)")
    return {"setting": name, "n_docs": s.n_docs, "n_tokens": s.n_tokens, "V": len(s.vocab), "load": load(),
            "rows": res}


def section_threads(args, name: str) -> dict:
    s = Setting(name, args.n_train, args.n_test)
    K = args.k_var
    print(f"\n[threads] {name}: {s.n_docs} docs, K={K}; threads=1 vs 2, paired, {args.rounds} round(s); "
          f"load {load()}", flush=True)
    out = {}
    for variant in ("cs50000", "defaults"):
        rounds = []
        for r in range(args.rounds):
            runs = {}
            for t in (1, 2):
                runs[t] = run_streamtopics(s, K, variant, t, score=False)
                m = runs[t]["model"]
                c0, t0 = cpu_seconds(), time.perf_counter()
                runs[t]["theta"] = m.transform(s.test)
                runs[t]["transform_seconds"] = time.perf_counter() - t0
                runs[t]["transform_cpu"] = cpu_seconds() - c0
            m1, m2 = runs[1]["model"].state, runs[2]["model"].state
            same = (np.array_equal(m1.mu[: m1.n_words], m2.mu[: m2.n_words]) and m1.scale == m2.scale
                    and np.array_equal(runs[1]["theta"], runs[2]["theta"]))
            fit = runs[1]["seconds"] / runs[2]["seconds"]
            tr = runs[1]["transform_seconds"] / runs[2]["transform_seconds"]
            rounds.append({"fit_ratio": fit, "transform_ratio": tr, "identical": bool(same),
                           "tok_s": {t: runs[t]["tokens_per_s"] for t in (1, 2)},
                           "cpu_over_wall_2": runs[2]["cpu_seconds"] / runs[2]["seconds"]})
            print(f"  {variant:<9} round {r + 1}: pass {runs[1]['tokens_per_s']:,.0f} -> {runs[2]['tokens_per_s']:,.0f} "
                  f"tok/s = {fit:.2f}x; transform {tr:.2f}x; bit-identical model and theta: {same}; "
                  f"cpu/wall with 2 threads {rounds[-1]['cpu_over_wall_2']:.2f}; load {load()}", flush=True)
        out[variant] = rounds
    # wall-clock ratios need two idle cores; CPU times give what they would show (RunClock)
    cp = {t: critical_path(s, K, t) for t in (1, 2)}
    print_critical_path(cp, s.n_tokens, sum(map(len, s.test)))
    out["critical_path"] = cp
    out["hardware_ceiling"] = hardware_ceiling(s, K)
    return out


def hardware_ceiling(s: Setting, K: int, rounds: int = 5, reps: int = 4) -> dict:
    """What two threads can gain on this machine at most: two single-threaded local steps (each
    its own model, threads=1, nothing shared, no hand-overs) running side by side, against one
    alone. Below 2x when the cores slow down together (a shared clock budget, L3 and memory
    bandwidth, a hypervisor), which no threading scheme can win back."""
    import copy
    import threading

    m = TopicModel(n_topics=K, threads=1)
    for lo in range(0, min(s.n_docs, 10 * BATCH), BATCH):
        m.partial_fit(s.train[lo:lo + BATCH])
    twin = copy.deepcopy(m)
    batch = m.prepare(m.tokenize(s.test[:2 * BATCH]), grow=False)
    m.infer_counts(batch)

    def work(model):
        for _ in range(reps):
            model.infer_counts(batch)

    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        work(m)
        one = time.perf_counter() - t0
        ts = [threading.Thread(target=work, args=(x,)) for x in (m, twin)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        ratios.append(2 * one / (time.perf_counter() - t0))
    med = float(np.median(ratios))
    print(f"  hardware ceiling: two independent single-threaded local steps side by side do "
          f"{', '.join(f'{r:.2f}' for r in ratios)}x the work of one (median {med:.2f}x): the most threads=2 "
          f"can reach here; load {load()}", flush=True)
    return {"ratios": ratios, "median": med}


STAGES = [  # (label, module, attribute): module functions timed by wrapping them where they are called from
    ("tokenize (type checks)", "streamtopics.model", "tokenize_docs"),
    ("token -> position (first sight)", "streamtopics.batch", "first_sight"),
    ("pair counting", "streamtopics.batch", "count_pairs"),
    ("batch building, all", "streamtopics.model", "build_batch"),
    ("kernel (local step)", "streamtopics.engines.lsparse", "run_lsparse"),
    ("summary", "streamtopics.engines.lsparse", "summarize_sparse"),
    ("alpha step", "streamtopics.model", "alpha_step"),
]
METHODS = [  # (label, path from the model, method): bound methods timed per model instance
    ("vocabulary ids", "vocab", "ids"),
    ("vocabulary growth", "vocab", "add_rows"),
    ("state rows (ensure_words)", "state", "ensure_words"),
    ("E[log phi]", "state", "expected_log_phi"),
    ("global update", "updater", "apply"),
    ("process, all", None, "process"),
]


def _timed(fn, label, acc):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[label] = acc.get(label, 0.0) + time.perf_counter() - t
    return wrapper


class RunClock:
    """Patches ``ThreadRunner.run_claimed`` to account, per calling thread, the caller's CPU inside
    runs, the CPU of all ranges, and the makespan on idle cores: the threads' mean CPU (they claim
    ranges as they come free, so on idle cores they finish within one range of each other)."""

    def __init__(self):
        import threading

        from streamtopics import parallel
        self.parallel, self.ident, self.acc = parallel, threading.get_ident, {}
        self.orig_claimed = parallel.ThreadRunner.run_claimed

    def get(self) -> list:
        return list(self.acc.get(self.ident(), [0.0, 0.0, 0.0]))

    def __enter__(self):
        clock = self

        def run_claimed(runner, fn):
            # ranges claimed inside the kernel: each thread's CPU in its one call; on idle cores the
            # claiming balances them to within one range, so the makespan is their mean
            times = []

            def timed(counter):
                t = time.thread_time()
                try:
                    return fn(counter)
                finally:
                    times.append(time.thread_time() - t)
            t0 = time.thread_time()
            try:
                return clock.orig_claimed(runner, timed)
            finally:
                a = clock.acc.setdefault(clock.ident(), [0.0, 0.0, 0.0])
                a[0] += time.thread_time() - t0
                a[1] += sum(times)
                a[2] += sum(times) / runner.threads
        self.parallel.ThreadRunner.run_claimed = run_claimed
        return self

    def __exit__(self, *exc):
        self.parallel.ThreadRunner.run_claimed = self.orig_claimed


def critical_path(s: Setting, K: int, threads: int) -> dict:
    """A pass and ``transform`` with ``threads``, timed by CPU time, for a machine whose other load
    makes wall-clock ratios meaningless.  Pass: the calling thread's CPU outside the parallel runs
    (serial work) plus the runs' makespans (``RunClock``).  Transform (chunks prepared on the calling
    thread while a pipeline thread infers the previous one): the first chunk's preparation, then
    per chunk the longest of its inference (serial + makespans), the next chunk's preparation, and
    both of them shared by two cores.  ``idle_estimate``: seconds on otherwise idle cores."""
    TopicModel(n_topics=K, threads=threads).partial_fit(s.train[:16])
    m = TopicModel(n_topics=K, threads=threads)
    out = {}
    with RunClock() as clock:
        t0, c0 = time.thread_time(), time.process_time()
        for lo in range(0, s.n_docs, BATCH):
            m.partial_fit(s.train[lo:lo + BATCH])
        main, cpu = time.thread_time() - t0, time.process_time() - c0
        in_runs, _, makespan = clock.get()
        serial = main - in_runs
        out["pass"] = {"cpu": cpu, "serial": serial, "parallel_makespan": makespan,
                       "idle_estimate": serial + makespan if threads > 1 else cpu}
        prep, infer = [], []
        tokenize, prepare, infer_counts = m.tokenize, m.prepare, m.infer_counts

        def timed_prep(fn):
            def wrapper(*a, **k):
                t = time.thread_time()
                try:
                    return fn(*a, **k)
                finally:
                    prep.append(time.thread_time() - t)
            return wrapper

        def timed_infer(*a, **k):
            t, (r0, c0_, m0) = time.thread_time(), clock.get()
            try:
                return infer_counts(*a, **k)
            finally:
                r1, c1, m1 = clock.get()
                own = time.thread_time() - t - (r1 - r0)  # this thread's CPU outside runs
                infer.append((own + m1 - m0, own + c1 - c0_))  # (idle-core time, CPU)
        m.tokenize, m.prepare, m.infer_counts = timed_prep(tokenize), timed_prep(prepare), timed_infer
        c0 = time.process_time()
        m.transform(s.test)
        cpu = time.process_time() - c0
    per_chunk = [a + b for a, b in zip(prep[0::2], prep[1::2])]  # tokenize + prepare of each chunk
    est = per_chunk[0] if per_chunk else 0.0
    for i, (t_idle, t_cpu) in enumerate(infer):
        nxt = per_chunk[i + 1] if i + 1 < len(per_chunk) else 0.0
        est += max(t_idle, nxt, (t_cpu + nxt) / 2)
    out["transform"] = {"cpu": cpu, "serial": per_chunk[0] if per_chunk else 0.0, "idle_estimate": est if threads > 1 else cpu}
    return out


def section_stages(args, name: str) -> dict:
    """Wall ns/token of every stage of a pass and of ``transform``, threads 1 and 2 (stages of
    threads=2 that run on one thread are what caps its ratio)."""
    import importlib

    s = Setting(name, args.n_train, args.n_test)
    n_test = sum(map(len, s.test))
    print(f"\n[stages] {name}: {s.n_docs} docs, {s.n_tokens:,} tokens; transform {len(s.test)} docs, {n_test:,} "
          f"tokens; K={args.k_var}; wall ns/token; load {load()}", flush=True)
    acc: dict = {}
    saved = []
    for label, mod, attr in STAGES:
        m_ = importlib.import_module(mod)
        if not hasattr(m_, attr):  # an older checkout without this stage
            continue
        saved.append((m_, attr, getattr(m_, attr)))
        setattr(m_, attr, _timed(getattr(m_, attr), label, acc))
    out = {}
    try:
        for t in (1, 2):
            TopicModel(n_topics=args.k_var, threads=t).partial_fit(s.train[:16])
            m = TopicModel(n_topics=args.k_var, threads=t)
            for label, path, meth in METHODS:
                obj = m if path is None else getattr(m, path)
                setattr(obj, meth, _timed(getattr(obj, meth), label, acc))
            for phase, n_tok in (("pass", s.n_tokens), ("transform", n_test)):
                acc.clear()
                t0 = time.perf_counter()
                if phase == "pass":
                    for lo in range(0, s.n_docs, BATCH):
                        m.partial_fit(s.train[lo:lo + BATCH])
                else:
                    m.transform(s.test)
                acc["total"] = time.perf_counter() - t0
                out[f"{phase} threads={t}"] = {k: 1e9 * v / n_tok for k, v in acc.items()}
    finally:
        for m_, attr, fn in saved:
            setattr(m_, attr, fn)
    labels = list(dict.fromkeys(k for v in out.values() for k in v))
    cols = list(out)
    print("  " + f"{'stage':<34}" + "".join(f"{c:>22}" for c in cols))
    for lab in labels:
        print("  " + f"{lab:<34}" + "".join(f"{out[c].get(lab, 0.0):>22.0f}" for c in cols))
    for phase in ("pass", "transform"):
        a, b = out[f"{phase} threads=1"]["total"], out[f"{phase} threads=2"]["total"]
        print(f"  {phase}: threads 2/1 = {a / b:.2f}x (one run, wall)")
    cp = {t: critical_path(s, args.k_var, t) for t in (1, 2)}
    print_critical_path(cp, s.n_tokens, n_test)
    out["critical_path"] = cp
    return out


def print_critical_path(cp: dict, n_tokens: int, n_test: int) -> None:
    c1, c2 = cp[1]["pass"], cp[2]["pass"]
    print(f"  pass by CPU time (load-proof): threads=1 {1e9 * c1['cpu'] / n_tokens:.0f} ns/token; threads=2 serial "
          f"{1e9 * c2['serial'] / n_tokens:.0f} + parallel makespan {1e9 * c2['parallel_makespan'] / n_tokens:.0f} "
          f"= {1e9 * c2['idle_estimate'] / n_tokens:.0f} ns/token => {c1['cpu'] / c2['idle_estimate']:.2f}x on idle cores "
          f"(serial share of threads=1: {c2['serial'] / c1['cpu']:.1%}); load {load()}", flush=True)
    t1, t2 = cp[1]["transform"], cp[2]["transform"]
    print(f"  transform by CPU time: threads=1 {1e9 * t1['cpu'] / n_test:.0f} ns/token; threads=2 "
          f"{1e9 * t2['idle_estimate'] / n_test:.0f} on idle cores (first chunk's preparation "
          f"{1e9 * t2['serial'] / n_test:.0f}) => {t1['cpu'] / t2['idle_estimate']:.2f}x", flush=True)


def section_alias(args) -> dict:
    import gc

    import tomotopy as tp
    from bench_alias import Data, run_alias
    from bench_core import ALPHA, BETA, Corpus

    corpus = Corpus(n_train=args.n_train, n_test=1000)
    data = Data(corpus)
    for kern in ("dense", "mh"):  # compile or load both kernels outside the clocks
        run_alias(Data(corpus, 50), 8, 2, score=False, kernel=kern)
    print(f"\n[alias] 20NG train: {len(data.tokens)} docs, {data.n_tokens:,} tokens; batch mode, "
          f"{args.sweeps} sweeps (a third at K=4096); sampling time only; load {load()}", flush=True)

    def tomotopy(K, sweeps, workers):
        mdl = tp.LDAModel(k=K, alpha=ALPHA, eta=BETA, seed=0, min_cf=0, rm_top=0)
        for toks in data.tokens:
            if toks:
                mdl.add_doc(toks)
        mdl.optim_interval = 0
        mdl.burn_in = 0
        scheme = tp.ParallelScheme.NONE if workers == 1 else tp.ParallelScheme.PARTITION
        mdl.train(0, workers=workers, parallel=scheme)
        t0 = time.perf_counter()
        mdl.train(sweeps, workers=workers, parallel=scheme)
        sec = time.perf_counter() - t0
        del mdl
        gc.collect()
        return data.n_tokens * sweeps / sec

    res = {}
    for K in args.k_alias:
        sweeps = args.sweeps if K <= 1024 else max(args.sweeps // 3, 5)
        runs = {"alias": [], "mh": [], "w1": [], "w2": []}
        kernel = None
        for r in range(args.rounds):
            a = run_alias(data, K, sweeps, score=False)  # the defaults: the engine picks its kernel
            kernel = a["kernel"]
            runs["alias"].append(a["tokens_per_s"])
            # the MH kernel alone where "auto" chose another (its cost curve over K, for the record)
            runs["mh"].append(a["tokens_per_s"] if kernel == "mh" else
                              run_alias(data, K, sweeps, score=False, kernel="mh")["tokens_per_s"])
            runs["w1"].append(tomotopy(K, sweeps, 1))
            runs["w2"].append(tomotopy(K, sweeps, 2))
            print(f"  K={K:<5} round {r + 1}: alias [{kernel}] {1e9 / runs['alias'][-1]:4.0f} ns/token, mh alone "
                  f"{1e9 / runs['mh'][-1]:4.0f}, tomotopy w1 {1e9 / runs['w1'][-1]:4.0f}, w2 {1e9 / runs['w2'][-1]:4.0f}; "
                  f"load {load()}", flush=True)
        med = {k: float(np.median(v)) for k, v in runs.items()}
        r1 = float(np.median([x / y for x, y in zip(runs["alias"], runs["w1"])]))
        r2 = float(np.median([x / y for x, y in zip(runs["alias"], runs["w2"])]))
        rm = float(np.median([x / y for x, y in zip(runs["mh"], runs["w1"])]))
        res[K] = {"kernel": kernel, "sweeps": sweeps, "alias": med["alias"], "mh": med["mh"], "tomotopy_w1": med["w1"],
                  "tomotopy_w2": med["w2"], "ratio_w1": r1, "ratio_w2": r2, "mh_ratio_w1": rm,
                  "ns_per_token": 1e9 / med["alias"], "mh_ns_per_token": 1e9 / med["mh"], "runs": runs}
        print(f"  K={K:<5} alias [{kernel}] {med['alias'] / 1e6:5.2f} M tok/s ({1e9 / med['alias']:4.0f} ns/token)  "
              f"tomotopy w1 {med['w1'] / 1e6:5.2f}  w2 {med['w2'] / 1e6:5.2f}  => {r1:.2f}x tomotopy w1, {r2:.2f}x w2 "
              f"(median of {args.rounds} paired rounds); mh alone {rm:.2f}x w1", flush=True)
    if res:
        ks = sorted(res)
        lo, hi = res[ks[0]], res[ks[-1]]
        print(f"  cost per token K={ks[-1]} / K={ks[0]}: {hi['ns_per_token'] / lo['ns_per_token']:.2f}x with the chosen "
              f"kernels ({lo['kernel']} -> {hi['kernel']}), {hi['mh_ns_per_token'] / lo['mh_ns_per_token']:.2f}x "
              f"for the MH kernel alone (target <= 1.5x)")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=["variational", "threads", "stages", "alias", "all"], default="all")
    ap.add_argument("--setting", default="20ng-df5,20ng-long4-df5", help="comma-separated corpora_prep SETTINGS")
    ap.add_argument("--n-train", type=int, default=None, help="first N training documents only")
    ap.add_argument("--n-test", type=int, default=3000, help="test documents scored (completion split)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--k-var", type=int, default=K_DEFAULT)
    ap.add_argument("--k", default="100,400,1024,4096", help="alias section: topic counts")
    ap.add_argument("--sweeps", type=int, default=30, help="alias section: sweeps (a third at K > 1024)")
    ap.add_argument("--skip", default="", help="comma-separated peers to skip: gensim,scikit-learn,vowpal")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.skip = {x.strip().lower() for x in args.skip.split(",") if x.strip()}
    args.k_alias = [int(k) for k in args.k.split(",")]
    settings = args.setting.split(",")
    results: dict = {"load_before": load()}
    if args.section in ("variational", "all"):
        results["variational"] = {n: section_variational(args, n) for n in settings}
    if args.section in ("threads", "all"):
        results["threads"] = {n: section_threads(args, n) for n in settings}
    if args.section in ("stages", "all"):
        results["stages"] = {n: section_stages(args, n) for n in settings}
    if args.section in ("alias", "all"):
        results["alias"] = section_alias(args)
    results["load_after"] = load()
    out = Path(args.json) if args.json else RESULTS / f"speed-{args.section}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=float))
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
