"""Drift: 20 Newsgroups, then Reuters R8 — how fast does the model follow the switch?

The stream is the 20NG train split (shuffled) in batches of ``--batch`` documents, then the
R8 train split (shuffled, cycled ``--r8-passes`` times). After every batch from the switch on,
the held-out document-completion log-likelihood per token (``TopicModel.heldout_loglik``,
80/20 split by word type) is measured on ``--heldout`` R8 *test* documents.

Forgetting settings compared (each against its no-forgetting peer, same seed, same batches):

* stochastic update: ``rho_min = 0`` (step rho_t = (delay + t)^-kappa decays to ~0, so the
  20NG years weigh forever) vs ``rho_min = --rho-min`` (a floor: old batches fade
  geometrically, half-life ln 2 / rho_min batches);
* memoized update: ``memo_window`` larger than the whole stream (nothing forgotten) vs
  ``memo_window = --window`` batches (a sliding window: 20NG leaves the model
  ``--window`` batches after the switch).

Both runs of a pair see the same words, so their held-out figures compare directly (the
held-out measure skips out-of-vocabulary words, so a model trained on R8 alone, with a far
smaller vocabulary, is not a fair yardstick and is not used). Reported per pair: the recovery
curves; for each run the batches until it has made 90 % of its own gain from the switch to
the end; and the bounded-recovery figure: the batch at which the forgetting run first reaches
the level the no-forgetting run ends at after the whole R8 stream.

This is the library alone (the daemon calls the same ``TopicModel.process`` per batch; Kafka
adds nothing to what is learned). Run:

    python bench/bench_drift.py                   # K=20, batches of 256
    python bench/bench_drift.py --quick           # fewer 20NG batches, smaller held-out set
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamtopics.corpora import load_20newsgroups, load_reuters_r8  # noqa: E402
from streamtopics.model import TopicModel  # noqa: E402

RESULTS = Path(__file__).with_name("results")


def _batches(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i:i + size] for i in range(0, len(texts) - size + 1, size)]


def run(settings: dict, before: list[list[str]], after: list[list[str]], heldout: list[str], k: int,
        every: int, seed: int) -> dict:
    m = TopicModel(n_topics=k, seed=seed, **settings)
    t0 = time.perf_counter()
    for b in before:
        m.partial_fit(b)
    curve = [(0, m.heldout_loglik(heldout))]
    for i, b in enumerate(after, 1):
        m.partial_fit(b)
        if i % every == 0 or i == len(after):
            curve.append((i, m.heldout_loglik(heldout)))
    return {"settings": settings, "curve": curve, "seconds": round(time.perf_counter() - t0, 1)}


def first_reaching(curve: list[tuple[int, float]], level: float) -> int | None:
    for b, ll in curve:
        if ll >= level:
            return b
    return None


def own_recovery(curve: list[tuple[int, float]], frac: float = 0.9) -> int | None:
    start, end = curve[0][1], curve[-1][1]
    return first_reaching(curve, start + frac * (end - start))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--r8-passes", type=int, default=2)
    ap.add_argument("--heldout", type=int, default=600)
    ap.add_argument("--rho-min", type=float, default=0.2)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--every", type=int, default=2, help="measure every this many batches after the switch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="20 20NG batches, 300 held-out documents")
    ap.add_argument("--out", default=str(RESULTS / "drift.json"))
    args = ap.parse_args(argv)

    ng = [d.text for d in load_20newsgroups("train")]
    r8 = [d.text for d in load_reuters_r8("train")]
    heldout = [d.text for d in load_reuters_r8("test")][: (300 if args.quick else args.heldout)]
    before = _batches(ng, args.batch)[: (20 if args.quick else None)]
    after = _batches(r8, args.batch) * args.r8_passes
    n_total = len(before) + len(after)
    print(f"drift: {len(before)} batches of 20NG then {len(after)} of R8 (batch {args.batch}, K={args.topics}); "
          f"held-out: {len(heldout)} R8 test documents", flush=True)

    pairs = {
        "stochastic": ({"update": "stochastic", "rho_min": 0.0},
                       {"update": "stochastic", "rho_min": args.rho_min}),
        "memoized": ({"update": "memoized", "memo_window": n_total + 1},
                     {"update": "memoized", "memo_window": args.window}),
    }
    report = {"config": vars(args), "batches_20ng": len(before), "batches_r8": len(after), "runs": {}}
    for family, (off, on) in pairs.items():
        rows = {label: run(st, before, after, heldout, args.topics, args.every, args.seed)
                for label, st in (("off", off), ("on", on))}
        for r in rows.values():
            r["own_90pct_after_batches"] = own_recovery(r["curve"])
        off_final = rows["off"]["curve"][-1][1]
        reach = first_reaching(rows["on"]["curve"], off_final)
        report["runs"][family] = {**rows, "on_reaches_off_final_after_batches": reach}
        knob = f"rho_min={args.rho_min}" if family == "stochastic" else f"memo_window={args.window}"
        print(f"\n{family}: held-out log-likelihood per token on R8 test, forgetting off vs on ({knob})")
        print(f"{'batch':>6} {'off':>9} {'on':>9} {'on-off':>8}")
        for (b, a), (_, c) in zip(rows["off"]["curve"], rows["on"]["curve"]):
            print(f"{b:6d} {a:9.4f} {c:9.4f} {c - a:+8.4f}")
        for label in ("off", "on"):
            r = rows[label]
            print(f"  forgetting {label:3s}: 90 % of its own gain after {r['own_90pct_after_batches']} R8 batches; "
                  f"final {r['curve'][-1][1]:.4f}; {r['seconds']} s")
        print(f"  forgetting on reaches the no-forgetting run's final level ({off_final:.4f}) after "
              f"{reach if reach is not None else 'never (within ' + str(len(after)) + ')'} of {len(after)} R8 batches")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
