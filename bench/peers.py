"""The peers every benchmark compares streamtopics with, run one way, on a ``corpora_prep.Setting``.

Each runner fits one pass in minibatches of ``BATCH`` on the setting's token lists, times the fit
(wall and process CPU), and scores the topics with the setting's completion scorer and the
model's own alpha.  scikit-learn and Vowpal Wabbit are told the corpus size; gensim's ``update``
reads it from the corpus it is handed.
"""
from __future__ import annotations

import os
import resource
import tempfile
import time

import numpy as np

BATCH = 256


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def result(s, wall: float, cpu: float, heldout: float | None, **extra) -> dict:
    return {"seconds": wall, "cpu_seconds": cpu, "tokens_per_s": s.n_tokens / wall,
            "tokens_per_cpu_s": s.n_tokens / max(cpu, 1e-9), "heldout": heldout, **extra}


def run_gensim(s, K: int, decay: float = 0.7, offset: float = 10.0, seed: int = 0) -> dict:
    from gensim.models import LdaModel

    bows = s.bows()
    c0, t0 = cpu_seconds(), time.perf_counter()
    lda = LdaModel(corpus=bows, id2word=dict(enumerate(s.vocab.words)), num_topics=K, chunksize=BATCH, passes=1,
                   update_every=1, decay=decay, offset=offset, eval_every=None, random_state=seed)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    lam = lda.state.get_lambda()
    return result(s, wall, cpu, s.score(lam / lam.sum(axis=1, keepdims=True), float(np.mean(lda.alpha))))


def run_sklearn(s, K: int, seed: int = 0) -> dict:
    """scikit-learn's online LDA with its defaults (decay 0.7, offset 10, priors 1/K), told N."""
    from sklearn.decomposition import LatentDirichletAllocation

    X = s.csr()
    lda = LatentDirichletAllocation(n_components=K, learning_method="online", batch_size=BATCH,
                                    total_samples=s.n_docs, learning_decay=0.7, learning_offset=10.0,
                                    random_state=seed, n_jobs=1)
    c0, t0 = cpu_seconds(), time.perf_counter()
    for lo in range(0, s.n_docs, BATCH):
        lda.partial_fit(X[lo:lo + BATCH])
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    comp = lda.components_
    return result(s, wall, cpu, s.score(comp / comp.sum(axis=1, keepdims=True), 1.0 / K))


def run_vw(s, K: int, seed: int = 0) -> dict:
    """Vowpal Wabbit's C++ online VB (``--lda``), fed a text file of word:count lines (the parse is
    inside the clock, as tokens-to-topics is for everyone else), told N (``--lda_D``)."""
    import vowpalwabbit

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.vw")
        with open(path, "w") as fh:
            for d in s.train:
                counts: dict[str, int] = {}
                for w in d:
                    counts[w] = counts.get(w, 0) + 1
                fh.write("| " + " ".join(f"{w}:{c}" for w, c in counts.items()) + "\n")
        c0, t0 = cpu_seconds(), time.perf_counter()
        vw = vowpalwabbit.Workspace(f"--lda {K} --lda_D {s.n_docs} --minibatch {BATCH} -b 20 --quiet "
                                    f"--random_seed {seed} -d {path}")
        vw.run_parser()
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        ns = vw.hash_space("")
        lam = np.empty((K, len(s.vocab)))
        for j, w in enumerate(s.vocab.words):
            h = vw.hash_feature(w, ns)
            lam[:, j] = [vw.get_weight(h, k) for k in range(K)]
        vw.finish()
    return result(s, wall, cpu, s.score(lam / lam.sum(axis=1, keepdims=True), 0.1))
