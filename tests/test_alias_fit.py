"""The alias engine's supervised fit(): the stopping rule on the chain's log-likelihood and the
eta average over the rule's window (docs/supervised.md §5.4)."""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from streamtopics.fitting import FIT_TOL, FIT_WINDOW, fit_stop_rule  # noqa: E402
from streamtopics.model import TopicModel  # noqa: E402
from test_alias_supervised import make_binary  # noqa: E402


def _first_stop(trace, tol, w):
    """Where the rule must fire: the first t > w with L_t - L_{t-w} <= tol (L_t - L_1)."""
    for t in range(w + 1, len(trace) + 1):
        if trace[t - 1] - trace[t - 1 - w] <= tol * max(trace[t - 1] - trace[0], 0.0):
            return t
    return None


def test_stop_rule_fires_exactly_where_the_window_gain_falls_below_tol():
    t = np.arange(1, 400)
    for a in (0.3, 1.0, 2.0):                        # power-law approach L_t = -t^-a, any scale
        for scale in (1.0, 1e3):
            trace = list(-scale * t ** -a - 7.0)
            rule = fit_stop_rule(FIT_TOL)
            fired = next(i for i in range(1, len(trace) + 1) if rule(trace[:i]))
            assert fired == _first_stop(trace, FIT_TOL, FIT_WINDOW) and fired > FIT_WINDOW + 1
    # scale-free: the same trace stretched and shifted stops at the same sweep
    base = list(-np.log1p(t) * 0.3)
    moved = [5.0 * x - 123.0 for x in base]
    stop_at = lambda tr: next(i for i in range(1, len(tr) + 1) if fit_stop_rule(FIT_TOL)(tr[:i]))  # noqa: E731
    assert stop_at(base) == stop_at(moved)
    # a chain that made no progress stops as soon as the window is full; a window of data is required
    assert not fit_stop_rule(FIT_TOL)([-7.0] * FIT_WINDOW) and fit_stop_rule(FIT_TOL)([-7.0] * (FIT_WINDOW + 1))


def _acc(model, te, yte):
    return float(np.mean([a == b for a, b in zip(model.predict(te), yte)]))


def test_default_fit_stops_by_the_rule_without_losing_accuracy():
    (tr, ytr), (te, yte) = make_binary(300, 1), make_binary(300, 2)
    long = TopicModel(n_topics=3, engine="alias", supervision="hinge", seed=0).fit(tr, labels=ytr, n_iter=80, tol=0)
    assert long.last_stats["sweeps"] == 80 and not long.last_stats["converged"]
    m = TopicModel(n_topics=3, engine="alias", supervision="hinge", seed=0).fit(tr, labels=ytr, n_iter=80)
    st = m.last_stats
    trace = st["loglik_trace"]
    # it stopped where the rule says, early, and kept the window's eta samples
    assert st["converged"] and len(trace) == st["sweeps"] == _first_stop(trace, FIT_TOL, FIT_WINDOW) < 80
    assert st["eta_retained"] == FIT_WINDOW
    acc, acc_long = _acc(m, te, yte), _acc(long, te, yte)
    assert acc > 0.85 and acc >= acc_long - 0.03, (acc, acc_long, st["sweeps"])


def test_count_loglik_equals_the_token_sum():
    from streamtopics.engines.alias import batch_tokens, run_batch_sampler
    from streamtopics.engines.alias_supervised import count_loglik
    m = TopicModel(n_topics=5, engine="alias")
    m.reset()
    tr, _ = make_binary(80, 4)
    batch = m.prepare(m.tokenize(tr), grow=True)
    tok_w, tok_ptr = batch_tokens(batch)
    arr, _ = run_batch_sampler(tok_w, tok_ptr, batch.uniq.shape[0], 5, 0.1, 0.05, m.state.n_words, 3, seed=2)
    Gk = np.full(5, m.state.n_words * 0.05)
    want = arr.word_loglik(tok_w, Gk, np.zeros((1, 1)), False, 0.05)
    assert np.isclose(count_loglik(arr.counts(), arr.nk, 0.05, Gk), want, rtol=1e-12)
