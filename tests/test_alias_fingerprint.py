"""The alias engine's draws are a function of the seed: fingerprints of small unsupervised and
supervised runs (batch mode, streaming, the raw kernel wrappers), captured on main before the
two sweep kernels became one (issue 16).  A change that alters any draw fails here; a change
that is meant to alter the chain must say so and re-capture them (``python -m`` this file).
Unsupervised batch fits force ``kernel="mh"``: at small K "auto" runs the dense kernel
(``alias_dense``, issue 18), whose chains these MH fingerprints do not describe."""
from __future__ import annotations

import hashlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from streamtopics.batch import batch_from_arrays  # noqa: E402
from streamtopics.engines import alias_supervised as sup  # noqa: E402
from streamtopics.engines.alias import AliasEngine, SamplerArrays, batch_tokens  # noqa: E402
from streamtopics.state import ModelState  # noqa: E402
from streamtopics.supervised.classifier import SupervisedHead  # noqa: E402

V, D = 40, 36


def _corpus(seed: int = 0):
    """D documents over V words drawn from 4 topics; label = the dominant topic is even."""
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(V, 0.1), size=4)
    ptr, ids, cnt, labels = [0], [], [], []
    for _ in range(D):
        th = rng.dirichlet(np.full(4, 0.3))
        c = np.bincount(rng.choice(V, size=int(rng.integers(8, 30)), p=th @ phi), minlength=V)
        nz = np.flatnonzero(c)
        ids += nz.tolist()
        cnt += c[nz].tolist()
        ptr.append(len(ids))
        labels.append("even" if int(np.argmax(th)) % 2 == 0 else "odd")
    return batch_from_arrays(np.array(ptr), np.array(ids), np.array(cnt, dtype=np.float64)), labels


def _h(*arrays) -> str:
    m = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        m.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return m.hexdigest()[:16]


def _state(K: int) -> ModelState:
    st = ModelState(K, 0.1, 0.01)
    st.ensure_words(V)
    st.n_words = V
    return st


def _head(K: int, loss: str):
    return SupervisedHead(K, loss, seed=3)


def fingerprints() -> dict:
    batch, labels = _corpus()
    out = {}
    # batch mode, unsupervised: default options, then mixture + uniform alpha part + tries (2, 2)
    for name, K, kw in [("fit", 5, {}), ("fit_mix", 5, dict(proposal="mixture", alpha_proposal="uniform", tries=(2, 2))),
                        ("fit_k300", 300, dict(mh_steps=2, tries=(2, 1)))]:  # the large-K default when captured
        st = _state(K)
        seen = []
        stats = AliasEngine(kernel="mh", **kw).fit_state(st, batch, 7, seed=11,
                                                         callback=lambda s, a: seen.append(_h(a.z)), callback_every=3)
        out[name] = (_h(st.mu[:V]), stats["alias_rebuilds"], round(stats["mh_acceptance"]["word"], 12), seen)
    # batch mode, supervised (hinge and logistic)
    for loss in ("hinge", "logistic"):
        st = _state(4)
        head = _head(4, loss)
        targets = head.encode_targets(labels)
        stats = AliasEngine(tries=(2, 1)).fit_state(st, batch, 6, seed=5, head=head, targets=targets)
        out[f"fit_sup_{loss}"] = (_h(st.mu[:V]), _h(head.eta_mean), stats["alias_rebuilds"],
                                  round(stats["mh_acceptance"]["exp"], 12))
    # streaming: a fitted state, then unsupervised and supervised local steps
    st = _state(5)
    AliasEngine(kernel="mh").fit_state(st, batch, 4, seed=1)
    st.scale = 0.5
    for name, kw in [("infer", {}), ("infer_mix", dict(proposal="mixture", tries=(1, 2)))]:
        r = AliasEngine(seed=9, **kw).infer(st, batch, summarize=True)
        out[name] = (_h(r.doc_topic), _h(r.summary.values, r.summary.topics), round(r.objective, 9))
    head = _head(5, "hinge")
    targets = head.encode_targets([y if i % 3 else None for i, y in enumerate(labels)])
    head.sample_augmentation  # noqa: B018  (the interface the engine uses)
    r = AliasEngine(seed=9, tries=(2, 2)).infer(st, batch, summarize=True, head=head, targets=targets)
    out["infer_sup"] = (_h(r.doc_topic), _h(r.summary.values, r.summary.topics), r.stats["exp_proposal_docs"])
    # the raw kernel wrappers: hash rows, exp-only and mixture compositions
    tok_w, tok_ptr = batch_tokens(batch)
    K = 16
    freq = np.bincount(tok_w, minlength=batch.uniq.size)
    arr = SamplerArrays(batch.uniq.size, tok_w.size, K, 8, freq)
    s = arr.run(3, tok_w, tok_ptr, np.full(K, V * 0.01), np.zeros((1, 1)), False, 0.01, 0.1, 9, 2, True, 1, tries=2)
    out["run_hash"] = (_h(arr.z, arr.nk), s.tolist())
    eta = np.random.default_rng(2).normal(size=(2, K))
    rho = np.abs(np.random.default_rng(3).normal(size=(D, 2)))
    kappa = np.random.default_rng(4).normal(size=(D, 2))
    for mixture in (0, 1, 2):
        arr = SamplerArrays(batch.uniq.size, tok_w.size, K, 8, freq)
        s = sup.run_sweeps(arr, 4, tok_w, tok_ptr, np.full(K, V * 0.01), np.zeros((1, 1)), False, 0.01, 0.1, 9, 2,
                           mixture, 1, eta, rho, kappa, np.arange(D) % 4 != 0, exp_gate=1e9, tries=(1, 2))
        out[f"sup_run_{mixture}"] = (_h(arr.z, arr.nk), s.tolist())
    return out


EXPECTED = {'fit': ('df8860a6be9d15d4', 58, 0.49219858156, ['94c8264c2bf58a87', '67f2929cce5cca76', '1df4e9768e19e159']),
 'fit_k300': ('cc23701391dd99a0',
              110,
              0.436778115502,
              ['592104d6a1f5e071', 'babb10471d6a23b5', '7de6db17541bb80d']),
 'fit_mix': ('67bb2727141dafe2', 94, 0.663254965545, ['837db0e037eab4c7', '417e2f94c70146af', '00a278841fdad435']),
 'fit_sup_hinge': ('838c00d1f88701f7', '1bc50d48d955c375', 86, 0.623758865248),
 'fit_sup_logistic': ('4413bd15e6c35d19', 'c34ee8302784a2b3', 86, 0.515987683562),
 'infer': ('c96c788a10b25433', '051be8fcc60821d6', -1547.108039946),
 'infer_mix': ('577b34347886fb26', 'a3cde5940f40c42d', -1561.962449006),
 'infer_sup': ('2e6c0f5eba0fafa8', '42897fa22539f5a7', 192),
 'run_hash': ('9b24a95d3785d830', [12671, 7591, 12709, 8684, 6126, 2771]),
 'sup_run_0': ('94f620b8326201e7', [12690, 5924, 15750, 10270, 4258, 2844, 9630, 1435, 243, 70]),
 'sup_run_1': ('26e343276a3eda46', [12679, 5883, 15676, 10395, 4323, 2963, 9715, 1653, 243, 77]),
 'sup_run_2': ('4a1790b53f286d51', [0, 0, 9180, 6194, 1530, 2748, 28890, 5657, 243, 229])}


def test_alias_draws_match_the_fingerprints_captured_before_the_single_kernel():
    got = fingerprints()
    assert got == EXPECTED


if __name__ == "__main__":
    import pprint

    pprint.pprint(fingerprints(), width=120)
