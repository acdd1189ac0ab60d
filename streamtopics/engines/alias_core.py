"""The Alias-MH core: one sweep kernel (LDA and, with the supervised term passed in, LightMedLDA),
its statistics slots and modes, the sampler arrays and the one driver; amortized O(1) per token.

References: Li, Ahmed, Ravi, Smola, "Reducing the sampling complexity of topic models"
(AliasLDA, KDD'14, §3-4); Zheng/Chen/Zhu, "Linear time samplers for supervised topic
models" (Light-MedLDA, §2.3, §3.3), whose doc/word proposal split is LightLDA's; Liu, Liang
& Wong 2000 (multiple-try Metropolis with independent proposals); Christen & Fox 2005
(delayed acceptance).

Target (one token i of document d, word w; every count excludes the token itself, "¬i"):

    p(z_i = k | rest) ∝ (n_dk + alpha) (g_wk + n_wk) / (G_k + n_k)          (AliasLDA Eq. 5)

* batch mode (``fit``): g_wk = beta, G_k = V beta, n = the corpus' integer counts:
  exactly the collapsed Gibbs conditional (Light-MedLDA Eq. 11).
* streaming (``alias.AliasEngine.infer``): g_wk = lambda_kw and G_k = sum_v lambda_kv, the
  global variational parameter (lambda = beta + expected counts, fixed during the
  minibatch), and n = the minibatch's own integer counts, maintained incrementally.
  This is the collapsed conditional of LDA whose topics have the prior
  phi_k ~ Dir(lambda_k) ("what we knew before this batch"); the Dirichlet-multinomial
  integrates phi out for the batch tokens exactly as in the batch sampler, so the same
  kernel runs both modes.  The averaged batch counts are the sufficient statistics the
  stochastic / memoized updates blend into lambda, as for the variational engine.

Proposals.  LightLDA's two O(1) proposals are

* the word proposal q_w(k) ∝ (g_wk + n~_wk)/(G_k + n~_k), a stale Walker table per word type
  (``word_rows``: how tables are stored, built, drawn, and how token i's own contribution
  is removed so the proposal never depends on the token's state), and
* the doc proposal q_d(k) ∝ n_dk + K alpha q_i(k)/Z_i: with probability (N_d-1)/(N_d-1+K alpha)
  the topic of a uniformly random *other* token of the document, else a draw from the word's
  table (``alpha_proposal="word"``, the alpha term of the target) or a uniform topic
  (``"uniform"``, LightLDA's choice).

Each proposal alone matches one factor of the target and is blind to the other; at large K
a document's topics and a word's topics rarely meet in one draw, and a plain MH step wastes
most proposals (acceptance ~0.35 at K=1024; on 20 Newsgroups the plain chain needed ~3.5x
the sweeps of exact Gibbs).  So every step draws several candidates and lets the other
factor choose among them, with exact corrections:

* word step = independent multiple-try MH (I-MTM) on pi1(k) = (n_dk + alpha) q_i(k):
  ``word_tries`` draws y_1..y_m from the word table, y_J picked ∝ w(y) = n_dy + alpha (the
  document counts, in L1 cache), accepted with min(1, W / (W - w(y_J) + w(x))), W = sum w;
  then delayed acceptance (stage 2) corrects pi1 to the target with
  min(1, [b(y) q_i(x)] / [b(x) q_i(y)]), b(k) = (g_wk + n_wk)/(G_k + n_k) the current word
  factor.  Stage 2 only ever costs when the table is stale (accepts ~97%).
* doc step = I-MTM on the target itself: ``doc_tries`` draws from q_d, picked ∝ p/q_d.

As tries grow, the word step tends to AliasLDA's proposal (n_dk + alpha) q_w(k) and the
doc step to a draw from p itself.  With tries = 1 both are plain LightLDA MH steps.
Defaults (``resolve_steps``): below K = 256, 2 steps of each kind with (1, 1) candidates; from
K = 256 on, 1 step of each kind with (word, doc) = (2, 3) candidates, or more doc candidates
where K alpha outweighs the documents' other tokens (see below).  Supervised runs take the
same default; their step adds the exp proposal (supervised fit at K = 256 on 20NG, three
runs: test accuracy +0.005 to +0.014 over 2 steps of (2, 1), 7-9 % faster).  On 20
Newsgroups after 200 sweeps, held-out completion vs exact Gibbs at K=100: (1, 1) 0.7% short.
K=1024 (steps x word x doc: gap to exact Gibbs; speed vs tomotopy, paired): 1x2x1 1.97%, 4.0x;
1x2x2 1.05%, 3.2x; 2x1x1 1.0%, 2.9x; 1x3x2 0.97%, 2.9x; 2x2x1 (the former default) 0.84%, 2.5x;
**1x2x3 0.82%, 2.8x**; 1x3x3 0.70%, 2.6x; 2x2x2 0.45%.  K=4096 (2,000 documents, 100 sweeps):
2x2x1 1.46%, 1x2x3 1.20%, at equal speed (7.6x / 7.7x tomotopy).  Streaming, one pass, K=400
/ 1024: 1x2x3 is 0.014 / 0.015 nats/token better than 2x2x1 (docs/architecture.md).  A word
candidate costs a table draw and an L1 read (only the chosen one is looked up); a doc
candidate costs a row lookup; a step's fixed cost (the token's own row entry, the counts)
is paid once however many candidates it draws, so one step with more candidates mixes more
per nanosecond than two steps with fewer.

``mh_steps`` steps of each kind per token and sweep: "cycle" alternates word and
doc steps, "mixture" picks each step's kind with probability 1/2 (Light-MedLDA Theorem 1:
both compositions keep p stationary).

How many doc candidates (``default_tries``).  q_d draws the topic of one of the document's
N_d - 1 other tokens, or (mass K alpha) an alpha-part draw from the word's table; only the
first kind brings the document factor into the step, the second is one more word-table draw.
The share of the first kind, averaged over tokens, is ``own_share`` = sum_d N_d (N_d - 1) /
(N_d - 1 + K alpha) / N.  The default keeps the expected number of own-token candidates at
DOC_OWN_TRIES = 2, as many as the word step draws from its table: doc tries = round(2 /
share), at least 3 (the measured default at K = 1024, where the rule gives 3 too: 20NG, alpha
= 0.1, share 0.645) and at most 16 (a cost bound for very short documents).  With alpha =
1/K (the library's default start) share ~ 1 at any K and the default stays (2, 3); with a
fixed alpha = 0.1 at K = 4096 (20NG, share 0.378) it gives (2, 5).  Measured there (2,000
documents, 100 sweeps, gap to exact Gibbs, M tokens/s on one core beside another job):
doc tries 3 1.20% 3.7; 4 1.00% 2.7; 5 0.76% 2.4; 7 0.57% 2.0; and 2 steps of (2, 3) 0.58% 2.2.

Exactness: I-MTM with independent proposals and delayed acceptance are both p-reversible
for any proposal fixed in advance, so staleness never changes what the chain samples
(tests: a deliberately wrong, never rebuilt table reproduces the exact conditional; whole
chains reproduce the enumerated joint posterior of tiny models, with hash and dense rows).

Speed: everything a token's steps draw is independent of its state, so all candidates are
drawn first and their rows looked up together (the cache misses overlap) before the
accept/reject chain; the uniforms of the next token's doc candidates are drawn one token
ahead so their row entries can be prefetched, as are the metadata line 4 tokens ahead and
the current-topic entry and sample buffer 2 tokens ahead.  A token whose topic does not
change is never removed and re-added (its ¬i counts are formed on the fly).

Randomness: each call draws one seed (from the model's ``numpy.random.Generator`` via
``seed_source``) and seeds the kernel's own generator with it (an explicit SplitMix64 state
rather than numba's global np.random, which costs ~9x more per draw), so a run is a function
of the model seed and the call sequence, and snapshots (which save the Generator) resume it.

Small K: a batch fit without labels runs the dense exact Gibbs kernel of ``alias_dense``
instead wherever that is faster (K <= ``alias_dense.DENSE_MAX_K``, measured; the table is in
its docstring); its state comes back as these SamplerArrays (``alias_dense.choose_kernel``).

The supervised term (LightMedLDA: the factor exp(g_d(k)) of the target, the exp proposal) is
derived in ``alias_supervised``'s docstring; that module builds the term and passes it to the
same kernel (``sup``), whose LDA variant numba compiles without it.  ``alias`` is the engine
(``AliasEngine``: streaming and batch) on top of this module.
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..jit_cache import njit
from .walker import alias_build, prefetch, rng_next, rng_state
from .word_rows import (MAX_LOAD_DEN, MAX_LOAD_NUM, M_CAP, M_OCC, M_OFF, M_PTR, M_SOFF, M_T, M_VER, M_ZT, WordRows,
                        build_shared_prior, draw_table, row_delete, row_find, row_find_or_insert, row_rebuild, row_slot)

# -- slots of the statistics vector the kernel fills (the first six: every run; then supervised) --
S_WORD_PROP, S_WORD_ACC, S_DOC_PROP, S_DOC_ACC, S_REBUILDS, S_CHANGED = range(6)
S_EXP_PROP, S_EXP_ACC, S_EXP_DOCS, S_EXP_REJ = range(6, 10)
N_LDA_STATS = 6   # what an unsupervised run reports
N_STATS = 10

# -- how a run starts (``init``) and how the proposals compose (``compose``) --
INIT_GIVEN, INIT_UNIFORM, INIT_TABLE = 0, 1, 2       # z counted already / uniform z / z from each word's table
COMPOSE_CYCLE, COMPOSE_MIXTURE, COMPOSE_EXP_ONLY = 0, 1, 2  # exp-only: supervised runs, for the tests

# kinds of a supervised step
STEP_WORD, STEP_DOC, STEP_EXP = 0, 1, 2

# a document's exp proposal is used only while its supervised term is this weak (alias_supervised)
EXP_GATE = 2.0


MULTI_TRY_K = 256   # from here on, steps draw several candidates (module docstring)
_EXPLICIT_TRIES_STEPS = 2   # steps when the user picks ``tries`` but not ``mh_steps``
DOC_OWN_TRIES = 2      # doc-step candidates wanted from the document's own tokens (as the word step's 2)
MIN_DOC_TRIES = 3      # the measured default at K = 1024, where the rule below also gives 3
MAX_DOC_TRIES = 16     # a cost bound for very short documents under a large fixed alpha


def own_share(tok_ptr, Ka: float) -> float:
    """Token-averaged share of doc-proposal draws that come from the document's other tokens:
    sum_d N_d (N_d - 1) / (N_d - 1 + K alpha) / N (the rest come from the alpha part)."""
    n = np.diff(np.asarray(tok_ptr, dtype=np.int64)).astype(np.float64)
    total = n.sum()
    if total <= 0.0:
        return 1.0
    return float((n * (n - 1.0) / np.maximum(n - 1.0 + Ka, 1e-300)).sum() / total)


def default_tries(K: int, share: float = 1.0) -> tuple[int, int]:
    """(word, doc) candidates per MH step when ``tries`` is None (module docstring).  ``share``
    (``own_share``): from ``MULTI_TRY_K`` topics on, the doc step draws about DOC_OWN_TRIES
    candidates from the document's own tokens, floor(DOC_OWN_TRIES / share + 1/2) in
    [MIN_DOC_TRIES, MAX_DOC_TRIES]."""
    if K < MULTI_TRY_K:
        return (1, 1)
    doc = math.floor(DOC_OWN_TRIES / share + 0.5) if share > 0.0 else MIN_DOC_TRIES  # no other tokens: no rule
    return (2, int(min(max(doc, MIN_DOC_TRIES), MAX_DOC_TRIES)))


def default_mh_steps(K: int) -> int:
    """MH steps of each kind per token and sweep when ``mh_steps`` is None: one step with more
    candidates (2 word, 3 doc) from ``MULTI_TRY_K`` topics on, else 2."""
    return 1 if K >= MULTI_TRY_K else 2


def check_mh_steps(mh_steps) -> int | None:
    """Validate ``mh_steps`` (None = the default for K, or an int >= 1); return it normalised."""
    if mh_steps is None:
        return None
    if isinstance(mh_steps, bool) or not isinstance(mh_steps, (int, np.integer)) or mh_steps < 1:
        raise ValueError(f"mh_steps must be None or an integer >= 1 (got {mh_steps!r})")
    return int(mh_steps)


def resolve_steps(mh_steps, tries, K: int, tok_ptr=None, alpha: float = 0.0) -> tuple[int, tuple[int, int]]:
    """(MH steps, (word, doc) candidates) of a run over the documents ``tok_ptr`` (None: no
    documents known, share 1).  None picks the default pair for K and the documents'
    ``own_share`` (computed only when the rule needs it); the two were measured together, so
    ``tries`` given without ``mh_steps`` keeps 2 steps."""
    steps = check_mh_steps(mh_steps)
    pair = check_tries(tries)
    if steps is None:
        steps = default_mh_steps(K) if pair is None else _EXPLICIT_TRIES_STEPS
    if pair is None or None in pair:
        doc_by_rule = (pair is None or pair[1] is None) and tok_ptr is not None and K >= MULTI_TRY_K
        share = own_share(tok_ptr, K * float(alpha)) if doc_by_rule else 1.0  # only the doc kind reads it
        pair = _filled(pair, default_tries(K, share))
    return steps, pair


def check_tries(tries) -> tuple | None:
    """Validate ``tries`` (None, an int >= 1 for both kinds, or a (word, doc) pair whose parts
    are such ints or None, "the default for that kind"); return it normalised (None or a pair)."""
    if tries is None:
        return None
    pair = tuple(tries) if isinstance(tries, (tuple, list)) else (tries, tries)
    if len(pair) != 2 or not all(t is None or (isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                               and 1 <= t <= 64) for t in pair):
        raise ValueError(f"tries must be None, an integer in [1, 64] or a (word, doc) pair of them, "
                         f"None in a pair keeping that kind's default (got {tries!r})")
    if pair == (None, None):
        return None
    return tuple(None if t is None else int(t) for t in pair)


def _filled(pair, default: tuple[int, int]) -> tuple[int, int]:
    """``pair`` (None or a checked pair) with its None parts taken from ``default``."""
    if pair is None:
        return default
    return tuple(d if t is None else t for t, d in zip(pair, default))


def resolve_tries(tries, K: int) -> tuple[int, int]:
    """The (word, doc) candidates a run uses: ``tries`` validated, its unset parts the default
    for K (no documents known: share 1; runs resolve theirs with ``resolve_steps``)."""
    return resolve_steps(None, tries, K)[1]


@njit(cache=True, nogil=True, inline="always")
def accept(rs, num, den, delta):
    """MH test for the ratio (num/den) exp(delta), num, den > 0; returns (state, accepted)."""
    if delta >= 0.0 and num >= den:
        return rs, True
    rs, x = rng_next(rs)
    return rs, x * den < num * math.exp(delta)


@njit(cache=True, nogil=True)
def mh_sweeps(rs, tokens, rows, prior, opts, record, sup):
    """``n_sweeps`` sweeps of Alias-MH over the documents; returns the statistics vector (N_STATS).

    rs: uint64 random state (SplitMix64).
    tokens = (tok_w, tok_ptr, z, tver, tb): tok_w (N,) int32 batch-local word of each token,
        documents contiguous (tok_ptr (D+1,)); z (N,) int32 assignments; tver/tb (N,): per token,
        the version of its word's table it last saw and its topic when that table was built
        (-1: not counted in it).
    rows = (ent, entf, meta, metaf, samples, nk): the ``word_rows.WordRows`` arrays and the (K,)
        int64 topic counts.
    prior = (Gk, G, dense_prior, beta, alpha): Gk (K,) prior totals; G (U K,) prior pseudo-counts
        if ``dense_prior`` (streaming) else unused (g = beta and the shared prior table).
    opts = (n_sweeps, mh_steps, word_tries, doc_tries, compose, word_prior, init): ``compose`` one
        of COMPOSE_*, ``init`` one of INIT_*; ``word_prior``: the doc proposal's alpha part is
        drawn from the word's table (else uniform).
    record = (record_from, z_rec, doc_acc): sweeps >= record_from store z in
        z_rec[sweep - record_from] (while it has rows) and add the document counts to doc_acc
        (D, K) when doc_acc has D rows.
    sup: None (LDA), or the supervised term (etaT, rho, kappa, sup_doc, exp_gate, use_exp)
        built by ``alias_supervised.supervised_term``: etaT (K, L) the classifier sample
        transposed, rho/kappa (D, L) the augmentation, sup_doc (D,) bool.

    One kernel, two compiled variants: every ``sup is None`` test is resolved when numba
    specialises on the type of ``sup`` (its dead-branch pruning), so the LDA variant carries
    none of the supervised code (issue 16: paired timings in bench/bench_alias_core.py).
    LDA: ``mh_steps`` x (word step, doc step) per token, module docstring.  Supervised
    (LightMedLDA, ``alias_supervised`` docstring): ``mh_steps`` x (word, doc, exp step) per
    token against the regularised target; ``compose`` COMPOSE_EXP_ONLY uses exp steps only.

    The helpers of ``word_rows`` are written out here where they sit in the token loop:
    numba's IR inlining of array-taking helpers cost this loop 20-40% (measured).
    """
    tok_w, tok_ptr, z, tver, tb = tokens
    ent, entf, meta, metaf, samples, nk = rows
    Gk, G, dense_prior, beta, alpha = prior
    n_sweeps, mh_steps, word_tries, doc_tries, compose, word_prior, init = opts
    record_from, z_rec, doc_acc = record
    K = nk.shape[0]
    D = tok_ptr.shape[0] - 1
    N = tok_w.shape[0]
    stats = np.zeros(N_STATS, dtype=np.int64)
    rk = np.empty(K)
    wbuf = np.empty(K)
    widx = np.empty(K, dtype=np.int64)
    prob = np.empty(K)
    alias = np.empty(K, dtype=np.int32)
    small = np.empty(K, dtype=np.int32)
    large = np.empty(K, dtype=np.int32)
    keys = np.empty(K, dtype=np.int64)
    vals = np.empty(K, dtype=np.int64)
    scratch = (wbuf, widx, prob, alias, small, large, keys, vals)  # K-long work arrays of the row helpers
    Bw = np.zeros(K)  # shared prior table (batch mode); all zero in streaming
    BR = np.ones(K)
    Bprob = np.ones(K)
    Balias = np.zeros(K, dtype=np.int32)
    use_B = not dense_prior
    B_tot = 0.0
    nd = np.zeros(K, dtype=np.int32)
    MT = max(word_tries, doc_tries, 1)  # candidate slots per step
    Ka = K * alpha
    mixture = compose == COMPOSE_MIXTURE
    record_docs = doc_acc.shape[0] == D and D > 0
    if sup is None:
        P = 2 * mh_steps
        cand = np.empty(MT, dtype=np.int64)
        cw = np.empty(MT)
        cb = np.empty(MT)
        cq = np.empty(MT)
        # per step: kind, chosen topic, W, w(chosen), and a, b, q at the chosen topic
        st_word = np.empty(P, dtype=np.bool_)
        nx_word = np.empty(P, dtype=np.bool_)
        st_y = np.empty(P, dtype=np.int64)
        st_W = np.empty(P)
        st_w = np.empty(P)
        st_b = np.empty(P)
        st_q = np.empty(P)
        st_a = np.empty(P)
        LK = P * (MT + 1)
        lk_t = np.empty(LK, dtype=np.int64)
        lk_n = np.empty(LK, dtype=np.int64)
        lk_A = np.empty(LK)
        # the doc-candidate uniforms (and, for "mixture", the step kinds) of a token are drawn one
        # token ahead, so the row entries its candidates need can be prefetched
        du = np.empty(max(P * doc_tries, 1))
        nx_du = np.empty(max(P * doc_tries, 1))
        nx_nd = 0
        for p in range(P):
            if mixture:
                rs, x = rng_next(rs)
                nx_word[p] = x < 0.5
            else:
                nx_word[p] = (p & 1) == 0  # cycle: word, doc, word, doc, ...
            if not nx_word[p]:
                for j in range(doc_tries):
                    rs, nx_du[nx_nd] = rng_next(rs)
                    nx_nd += 1
    else:
        etaT, rho, kappa, sup_doc, exp_gate, use_exp = sup
        L = etaT.shape[1]
        # exp-proposal table of the current document
        eprob = np.empty(K)
        ealias = np.empty(K, dtype=np.int32)
        ew = np.empty(K)
        gt = np.empty(K)   # log-weights g~_d(k) of the table (stale M~)
        G1 = np.empty(K)   # kappa/N eta - rho/(2N^2) eta^2 summed over labels
        Ml = np.zeros(L)   # eta_y^T n_d (current, all tokens)
        Mt = np.zeros(L)   # Ml at the table's build
        cy = np.zeros(L)
        vi = np.zeros(L)
        emax = np.zeros(L)
        for l in range(L):
            mx = 0.0
            for k in range(K):
                a = abs(etaT[k, l])
                if a > mx:
                    mx = a
            emax[l] = mx
        P = 3 * mh_steps
        p_t = np.zeros(P * MT, dtype=np.int64)
        p_kind = np.zeros(P, dtype=np.int64)
        p_m = np.ones(P, dtype=np.int64)
        p_b = np.zeros(P * MT)
        p_a = np.zeros(P * MT)
        p_g = np.zeros(P * MT)
        p_q = np.zeros(P * MT)
        p_w = np.zeros(MT)
        inv_alpha = 1.0 / alpha
        n_wp = n_wa = n_dp = n_da = n_ep = n_ea = n_changed = 0
    for k in range(K):
        rk[k] = 1.0 / (Gk[k] + nk[k])

    if init != INIT_GIVEN:
        for i in range(N):
            u = tok_w[i]
            mu = 8 * u
            if init == INIT_UNIFORM:
                rs, x = rng_next(rs)
                t = min(int(x * K), K - 1)
            else:
                if meta[mu + M_PTR] >= meta[mu + M_T]:
                    rs = row_rebuild(u, -1, rows, prior, rk, scratch, rs)
                    stats[S_REBUILDS] += 1
                t = np.int64(samples[meta[mu + M_SOFF] + meta[mu + M_PTR]])
                meta[mu + M_PTR] += 1
            z[i] = t
            e = row_find_or_insert(ent, meta, u, meta[mu + M_OFF], meta[mu + M_CAP], K, t)
            ent[4 * e + 1] += 1
            nk[t] += 1
            rk[t] = 1.0 / (Gk[t] + nk[t])
            tver[i] = meta[mu + M_VER]  # counted after the current table was built: not part of it
            tb[i] = -1

    for sweep in range(n_sweeps):
        if use_B:
            B_tot = build_shared_prior(Gk, nk, beta, Bw, BR, Bprob, Balias, small, large)
        for d in range(D):
            s0 = tok_ptr[d]
            e0 = tok_ptr[d + 1]
            if e0 == s0:
                continue
            Nd = e0 - s0
            others = Nd - 1  # tokens of d other than the current one
            d_mass = others + Ka
            for i in range(s0, e0):
                nd[z[i]] += 1
            if sup is not None:
                # ---- supervised per-document quantities (O(L K) per visit, LightMedLDA §3.3) ----
                sup_on = False
                inv_n = 1.0 / Nd
                if sup_doc[d]:
                    n2 = inv_n * inv_n
                    for l in range(L):
                        cy[l] = rho[d, l] * n2
                        if rho[d, l] != 0.0 or kappa[d, l] != 0.0:
                            sup_on = True
                exp_on = False
                if sup_on:
                    for k in range(K):
                        acc = 0.0
                        for l in range(L):
                            ev = etaT[k, l]
                            acc += (kappa[d, l] * inv_n - 0.5 * cy[l] * ev) * ev
                        G1[k] = acc
                    for l in range(L):
                        Ml[l] = 0.0
                    for k in range(K):
                        c = nd[k]
                        if c != 0:
                            for l in range(L):
                                Ml[l] += c * etaT[k, l]
                    if use_exp:
                        bmax = 0.0
                        for l in range(L):
                            bmax += cy[l] * emax[l] * emax[l]
                        exp_on = bmax <= exp_gate
                    if exp_on:
                        stats[S_EXP_DOCS] += 1
                        gmax = -np.inf
                        for k in range(K):
                            acc = G1[k]
                            for l in range(L):
                                acc -= cy[l] * Ml[l] * etaT[k, l]
                            gt[k] = acc
                            if acc > gmax:
                                gmax = acc
                        for k in range(K):
                            ew[k] = math.exp(gt[k] - gmax)
                        alias_build(ew, eprob, ealias, small, large)
                        for l in range(L):
                            Mt[l] = Ml[l]
            for i in range(s0, e0):
                # -- software pipeline: metadata 4 tokens ahead, entry + samples 2 ahead --
                if i + 4 < N:
                    prefetch(meta, 8 * tok_w[i + 4])
                if i + 2 < N:
                    m2 = 8 * tok_w[i + 2]
                    prefetch(ent, 4 * (meta[m2 + M_OFF] + row_slot(z[i + 2], meta[m2 + M_CAP], K)))
                    prefetch(samples, meta[m2 + M_SOFF] + min(meta[m2 + M_PTR], meta[m2 + M_T] - 1))
                if sup is None:
                    # this token's kinds and doc uniforms; draw the next token's and prefetch its candidates
                    n_du = nx_nd
                    for j in range(n_du):
                        du[j] = nx_du[j]
                    for p in range(P):
                        st_word[p] = nx_word[p]
                    nx_nd = 0
                    n_word_draws = 0
                    for p in range(P):
                        if mixture:
                            rs, x = rng_next(rs)
                            nx_word[p] = x < 0.5
                        if not nx_word[p]:
                            for j in range(doc_tries):
                                rs, nx_du[nx_nd] = rng_next(rs)
                                nx_nd += 1
                        else:
                            n_word_draws += word_tries
                    if i + 1 < e0:
                        m1 = 8 * tok_w[i + 1]
                        b1 = meta[m1 + M_OFF]
                        c1 = meta[m1 + M_CAP]
                        for j in range(nx_nd):
                            x = nx_du[j] * d_mass
                            if x < others:
                                jj = s0 + int(x)
                                if jj >= i + 1:
                                    jj += 1
                                prefetch(ent, 4 * (b1 + row_slot(z[jj], c1, K)))
                        # and the entries of the word-step candidates it will read from its table
                        p1 = meta[m1 + M_PTR]
                        n1 = min(meta[m1 + M_T] - p1, n_word_draws)
                        lo1 = meta[m1 + M_SOFF] + p1
                        for j in range(n1):
                            prefetch(ent, 4 * (b1 + row_slot(np.int64(samples[lo1 + j]), c1, K)))
                    n_draw = n_du if word_prior else 0  # table draws this token may need
                    for p in range(P):
                        if st_word[p]:
                            n_draw += word_tries
                else:
                    # kinds of this token's proposals
                    n_word = 0
                    n_doc = 0
                    for p in range(P):
                        if compose == COMPOSE_MIXTURE:
                            rs, x = rng_next(rs)
                            kind = min(int(x * 3.0), 2)
                        elif compose == COMPOSE_EXP_ONLY:
                            kind = STEP_EXP
                        else:
                            kind = p % 3
                        if kind == STEP_EXP and not exp_on:
                            kind = STEP_DOC
                        p_kind[p] = kind
                        if kind == STEP_WORD:
                            n_word += 1
                            p_m[p] = word_tries
                        elif kind == STEP_DOC:
                            n_doc += 1
                            p_m[p] = doc_tries
                        else:
                            p_m[p] = 1
                    n_draw = n_word * word_tries + n_doc * doc_tries if word_prior else n_word * word_tries

                u = tok_w[i]
                s = np.int64(z[i])
                ub = u * K
                mu = 8 * u
                base = meta[mu + M_OFF]
                cu = meta[mu + M_CAP]
                T_u = meta[mu + M_T]
                lo = meta[mu + M_SOFF]
                if tver[i] != meta[mu + M_VER]:
                    # rebuilt after this token's last update, so it was counted there at s
                    tver[i] = meta[mu + M_VER]
                    tb[i] = s
                # token i's proposal q_i without its own contributions (word_rows docstring):
                # the count part at b scaled by fb, an extra prior-part mass Bx at s
                b = np.int64(-1)
                fb = 1.0
                S_i = 0.0
                Bx = 0.0
                Z_i = 1.0
                if sup is None or n_draw > 0:  # (LDA: always, as the word steps draw every time)
                    if meta[mu + M_PTR] + n_draw > T_u:
                        # the samples left cannot serve this token: rebuild from fresh counts
                        rs = row_rebuild(u, s, rows, prior, rk, scratch, rs)
                        stats[S_REBUILDS] += 1
                        tver[i] = meta[mu + M_VER]
                        tb[i] = -1  # built from ¬i counts
                    b = np.int64(tb[i])
                    S_i = metaf[mu + M_ZT]
                    if b >= 0:
                        eb = row_find(ent, base, cu, K, b)
                        fb = np.float64(entf[4 * eb + 2])  # A_i(b) / A~_b, stored at the build
                        S_i -= np.float64(entf[4 * eb + 3]) * (1.0 - fb)
                        if S_i <= 1e-9 * metaf[mu + M_ZT]:
                            S_i = 0.0
                    if use_B:
                        Bx = beta / (BR[s] * (BR[s] - 1.0))
                    Z_i = S_i + B_tot + Bx
                ka_z = Ka / Z_i  # alpha part of the doc proposal: K alpha q_i(k) / Z_i
                ptr = meta[mu + M_PTR]
                if sup is None:
                    # ¬i factors at s (AliasLDA Eq. 5): the word factor b and the proposal q_i
                    es = row_find(ent, base, cu, K, s)
                    b_s = ((G[ub + s] if dense_prior else beta) + ent[4 * es + 1] - 1) / (Gk[s] + nk[s] - 1)
                    q_s = np.float64(entf[4 * es + 3]) * (fb if s == b else 1.0) + Bw[s] + Bx
                if sup is None:
                    # -- A: every step's candidates (state-independent); word steps choose now --
                    nl = 0
                    jd = 0
                    for p in range(P):
                        word = st_word[p]
                        mm = word_tries if word else doc_tries
                        W = 0.0
                        for j in range(mm):
                            from_q = word
                            if not word:
                                x = du[jd] * d_mass
                                jd += 1
                                if x < others:
                                    jj = s0 + int(x)
                                    if jj >= i:
                                        jj += 1
                                    t = np.int64(z[jj])
                                elif word_prior:
                                    from_q = True
                                else:
                                    t = min(int((x - others) / alpha), K - 1)
                            if from_q:
                                # a draw from q_i: count part w.p. S_i / Z_i, else the shared prior part
                                rs, x = rng_next(rs)
                                x *= Z_i
                                if x < S_i:
                                    while True:
                                        if ptr >= T_u:  # rejections ran past the buffer: same table, more draws
                                            rs = draw_table(u, rows, scratch, rs)
                                            ptr = 0
                                        t = np.int64(samples[lo + ptr])
                                        ptr += 1
                                        if t != b:
                                            break
                                        rs, y = rng_next(rs)
                                        if y < fb:
                                            break
                                else:
                                    y = x - S_i
                                    if y < Bx:
                                        t = s
                                    else:
                                        y = (y - Bx) / B_tot * K  # the residual is a fresh uniform
                                        bb = min(int(y), K - 1)
                                        t = np.int64(bb if y - bb < Bprob[bb] else Balias[bb])
                            if word:
                                a_t = nd[t] - (1 if t == s else 0) + alpha  # w(y) = pi1 / q_i = n_dy + alpha
                                cand[j] = t
                                cw[j] = a_t
                                W += a_t
                            else:
                                lk_t[nl] = t
                                nl += 1
                        if word:
                            J = 0
                            if mm > 1:
                                rs, x = rng_next(rs)
                                x *= W
                                acc = cw[0]
                                while acc <= x and J < mm - 1:
                                    J += 1
                                    acc += cw[J]
                            t = cand[J]
                            st_y[p] = t
                            st_W[p] = W
                            st_w[p] = cw[J]
                            lk_t[nl] = t
                            nl += 1
                    meta[mu + M_PTR] = ptr
                    # -- B: counts and stale weights of the looked-up topics (independent loads overlap) --
                    for l in range(nl):
                        e = row_find(ent, base, cu, K, lk_t[l])
                        if e >= 0:
                            lk_n[l] = ent[4 * e + 1]
                            lk_A[l] = entf[4 * e + 3]
                        else:
                            lk_n[l] = 0
                            lk_A[l] = 0.0
                    # -- C: factors; doc steps choose (I-MTM on the target, weights p / q_d) --
                    l = 0
                    for p in range(P):
                        if st_word[p] or doc_tries == 1:  # one looked-up topic: the word step's choice or the doc draw
                            t = lk_t[l]
                            if t == s:
                                st_b[p] = b_s
                                st_q[p] = q_s
                            else:
                                st_b[p] = ((G[ub + t] if dense_prior else beta) + lk_n[l]) * rk[t]
                                st_q[p] = lk_A[l] * (fb if t == b else 1.0) + Bw[t]
                            if st_word[p]:
                                st_a[p] = st_w[p]
                            else:  # a plain MH step: the chain compares p q_d cross-multiplied
                                st_y[p] = t
                                st_a[p] = nd[t] - (1 if t == s else 0) + alpha
                            l += 1
                            continue
                        W = 0.0
                        for j in range(doc_tries):
                            t = lk_t[l + j]
                            a_t = nd[t] - (1 if t == s else 0) + alpha
                            if t == s:
                                b_t = b_s
                                q_t = q_s
                            else:
                                b_t = ((G[ub + t] if dense_prior else beta) + lk_n[l + j]) * rk[t]
                                q_t = lk_A[l + j] * (fb if t == b else 1.0) + Bw[t]
                            if word_prior:
                                wj = a_t * b_t / (a_t - alpha + ka_z * q_t)
                            else:
                                wj = b_t
                            cw[j] = wj
                            cb[j] = b_t
                            cq[j] = q_t
                            W += wj
                        J = 0
                        if doc_tries > 1:
                            rs, x = rng_next(rs)
                            x *= W
                            acc = cw[0]
                            while acc <= x and J < doc_tries - 1:
                                J += 1
                                acc += cw[J]
                        t = lk_t[l + J]
                        st_y[p] = t
                        st_W[p] = W
                        st_w[p] = cw[J]
                        st_a[p] = nd[t] - (1 if t == s else 0) + alpha
                        st_b[p] = cb[J]
                        st_q[p] = cq[J]
                        l += doc_tries
                    # -- the chain: the token stays counted at s until it moves --
                    cur = s
                    a_cur = nd[s] - 1 + alpha
                    b_cur = b_s
                    q_cur = q_s
                    for p in range(P):
                        y = st_y[p]
                        W = st_W[p]
                        if st_word[p]:
                            stats[S_WORD_PROP] += 1
                            if y != cur:
                                # stage 1 (I-MTM on pi1): min(1, W / (W - w(y) + w(cur)))
                                den = W - st_w[p] + a_cur
                                if W < den:
                                    rs, x = rng_next(rs)
                                    if x * den >= W:
                                        continue
                                # stage 2 (delayed acceptance): pi / pi1 = b / q
                                num = st_b[p] * q_cur
                                den = b_cur * st_q[p]
                                if num < den:
                                    rs, x = rng_next(rs)
                                    if x * den >= num:
                                        continue
                            stats[S_WORD_ACC] += 1
                        elif doc_tries == 1:
                            stats[S_DOC_PROP] += 1
                            if y != cur:
                                # A_d = p(y) q_d(cur) / (p(cur) q_d(y)), q_d(k) ∝ n_dk + K alpha q_i(k) / Z_i
                                if word_prior:
                                    num = st_a[p] * st_b[p] * (a_cur - alpha + ka_z * q_cur)
                                    den = a_cur * b_cur * (st_a[p] - alpha + ka_z * st_q[p])
                                else:  # q_d ∝ n_dk + alpha: the document factor cancels
                                    num = st_b[p]
                                    den = b_cur
                                if num < den:
                                    rs, x = rng_next(rs)
                                    if x * den >= num:
                                        continue
                            stats[S_DOC_ACC] += 1
                        else:
                            stats[S_DOC_PROP] += 1
                            if y != cur:
                                if word_prior:
                                    w_c = a_cur * b_cur / (a_cur - alpha + ka_z * q_cur)
                                else:
                                    w_c = b_cur
                                den = W - st_w[p] + w_c
                                if W < den:
                                    rs, x = rng_next(rs)
                                    if x * den >= W:
                                        continue
                            stats[S_DOC_ACC] += 1
                        cur = y
                        a_cur = st_a[p]
                        b_cur = st_b[p]
                        q_cur = st_q[p]
                else:
                    # exp proposal of token i: the table without its own build-time topic (= s)
                    bs = 0.0
                    if exp_on:
                        for l in range(L):
                            bs += cy[l] * abs(etaT[s, l]) * emax[l]
                    for pj in range(P * MT):
                        p = pj // MT
                        if pj - p * MT >= p_m[p]:
                            continue
                        kind = p_kind[p]
                        from_table = kind == STEP_WORD
                        if kind == STEP_EXP:
                            while True:
                                rs, x = rng_next(rs)
                                x *= K
                                j = min(int(x), K - 1)
                                t = np.int64(j if x - j < eprob[j] else ealias[j])
                                lf = 0.0
                                for l in range(L):
                                    lf += cy[l] * etaT[s, l] * etaT[t, l]
                                if lf >= bs:
                                    break
                                rs, x = rng_next(rs)
                                if x < math.exp(lf - bs):
                                    break
                                stats[S_EXP_REJ] += 1
                        elif kind == STEP_DOC:
                            rs, x = rng_next(rs)
                            x *= d_mass
                            if x < others:
                                j = s0 + int(x)
                                if j >= i:
                                    j += 1
                                t = np.int64(z[j])
                            elif word_prior:
                                from_table = True
                            else:
                                t = int((x - others) * inv_alpha)
                                if t >= K:
                                    t = K - 1
                        if from_table:
                            # a draw from q_i: count part w.p. S_i / Z_i, else the shared prior part
                            rs, x = rng_next(rs)
                            x *= Z_i
                            if x < S_i:
                                while True:
                                    if ptr >= T_u:  # rejections ran past the buffer: same table, more draws
                                        rs = draw_table(u, rows, scratch, rs)
                                        ptr = 0
                                    t = np.int64(samples[lo + ptr])
                                    ptr += 1
                                    if t != b:
                                        break
                                    rs, y = rng_next(rs)
                                    if y < fb:
                                        break
                            else:
                                y = x - S_i
                                if y < Bx:
                                    t = s
                                else:
                                    y = (y - Bx) / B_tot * K
                                    bb = min(int(y), K - 1)
                                    t = np.int64(bb if y - bb < Bprob[bb] else Balias[bb])
                        p_t[pj] = t
                    meta[mu + M_PTR] = ptr
                    # ¬i factors at s (the supervised one below): after the draws, fewer live values
                    es = row_find(ent, base, cu, K, s)
                    b_s = ((G[ub + s] if dense_prior else beta) + ent[4 * es + 1] - 1) / (Gk[s] + nk[s] - 1)
                    q_s = np.float64(entf[4 * es + 3]) * (fb if s == b else 1.0) + Bw[s] + Bx
                    a_s = nd[s] - 1 + alpha
                    sg_s = 0.0
                    if sup_on:
                        # v = c (M - eta_s): the token's ¬i re-weighted count times c
                        for l in range(L):
                            vi[l] = cy[l] * (Ml[l] - etaT[s, l])
                        acc = G1[s]
                        for l in range(L):
                            acc -= vi[l] * etaT[s, l]
                        sg_s = acc
                    for p in range(P * MT):
                        if p - (p // MT) * MT >= p_m[p // MT]:
                            continue
                        t = p_t[p]
                        if t == s:
                            p_b[p] = b_s
                            p_a[p] = a_s
                            p_g[p] = sg_s
                            p_q[p] = q_s
                        else:
                            e = row_find(ent, base, cu, K, t)
                            n_t = ent[4 * e + 1] if e >= 0 else 0
                            A_t = np.float64(entf[4 * e + 3]) if e >= 0 else 0.0
                            p_b[p] = ((G[ub + t] if dense_prior else beta) + n_t) * rk[t]
                            p_q[p] = A_t * (fb if t == b else 1.0) + Bw[t]
                            p_a[p] = nd[t] + alpha
                            if sup_on:
                                acc = G1[t]
                                for l in range(L):
                                    acc -= vi[l] * etaT[t, l]
                                p_g[p] = acc
                            else:
                                p_g[p] = 0.0
                    cur = s
                    b_cur = b_s
                    a_cur = a_s
                    g_cur = sg_s
                    q_c = q_s
                    for p in range(P):
                        kind = p_kind[p]
                        m = p_m[p]
                        o = p * MT
                        if m > 1:  # multiple-try word / doc step (alias_supervised docstring); picks o + J
                            if kind == STEP_WORD:
                                n_wp += 1
                                W = 0.0
                                for j in range(m):
                                    p_w[j] = p_a[o + j]  # pi1 / q_i = n_dk + alpha
                                    W += p_w[j]
                                w_cur = a_cur
                            else:
                                n_dp += 1
                                gref = g_cur
                                for j in range(m):
                                    if p_g[o + j] > gref:
                                        gref = p_g[o + j]
                                W = 0.0
                                for j in range(m):
                                    k = o + j
                                    qd = p_a[k] - alpha + ka_z * p_q[k] if word_prior else p_a[k]
                                    p_w[j] = p_a[k] * p_b[k] * math.exp(p_g[k] - gref) / qd  # p / q_d
                                    W += p_w[j]
                                qd = a_cur - alpha + ka_z * q_c if word_prior else a_cur
                                w_cur = a_cur * b_cur * math.exp(g_cur - gref) / qd if qd > 0.0 else np.inf
                            rs, x = rng_next(rs)
                            x *= W
                            J = 0
                            acc = p_w[0]
                            while acc <= x and J < m - 1:
                                J += 1
                                acc += p_w[J]
                            k = o + J
                            t = p_t[k]
                            if t != cur:
                                den = W - p_w[J] + w_cur
                                if not den < np.inf:
                                    continue
                                rs, ok = accept(rs, W, den, 0.0)  # I-MTM: min(1, W / (W - w(y_J) + w(x)))
                                if not ok:
                                    continue
                                if kind == STEP_WORD:  # stage 2: pi1 -> the regularised target
                                    rs, ok = accept(rs, p_b[k] * q_c, b_cur * p_q[k], p_g[k] - g_cur)
                                    if not ok:
                                        continue
                            if kind == STEP_WORD:
                                n_wa += 1
                            else:
                                n_da += 1
                            if t == cur:
                                continue
                            cur = t
                            b_cur = p_b[k]
                            a_cur = p_a[k]
                            g_cur = p_g[k]
                            q_c = p_q[k]
                            continue
                        t = p_t[o]
                        b_t = p_b[o]
                        a_t = p_a[o]
                        g_t = p_g[o]
                        q_t = p_q[o]
                        if kind == STEP_WORD:
                            n_wp += 1
                            if t == cur:
                                n_wa += 1
                                continue
                            rs, ok = accept(rs, a_t * b_t * q_c, a_cur * b_cur * q_t, g_t - g_cur)
                            if not ok:
                                continue
                            n_wa += 1
                        elif kind == STEP_DOC:
                            n_dp += 1
                            if t == cur:
                                n_da += 1
                                continue
                            if word_prior:
                                qd_t = a_t - alpha + ka_z * q_t
                                qd_c = a_cur - alpha + ka_z * q_c
                                rs, ok = accept(rs, a_t * b_t * qd_c, a_cur * b_cur * qd_t, g_t - g_cur)
                            else:
                                rs, ok = accept(rs, b_t, b_cur, g_t - g_cur)
                            if not ok:
                                continue
                            n_da += 1
                        else:
                            n_ep += 1
                            if t == cur:
                                n_ea += 1
                                continue
                            # A_e: exp(g) / q_i differs from the target only through M - M~
                            dlt = 0.0
                            for l in range(L):
                                dlt -= cy[l] * (Ml[l] - Mt[l]) * (etaT[t, l] - etaT[cur, l])
                            rs, ok = accept(rs, a_t * b_t, a_cur * b_cur, dlt)
                            if not ok:
                                continue
                            n_ea += 1
                        cur = t
                        b_cur = b_t
                        a_cur = a_t
                        g_cur = g_t
                        q_c = q_t
                # -- the move: the token leaves s for cur (counts, rows, the supervised count M) --
                if cur != s:
                    z[i] = cur
                    nd[s] -= 1
                    ent[4 * es + 1] -= 1
                    if cu < K and ent[4 * es + 1] == 0 and ent[4 * es + 3] == 0:
                        row_delete(ent, meta, u, base, cu, es)  # not in the live table: free the slot
                    nk[s] -= 1
                    rk[s] = 1.0 / (Gk[s] + nk[s])
                    nd[cur] += 1
                    e = row_find_or_insert(ent, meta, u, base, cu, K, cur)
                    ent[4 * e + 1] += 1
                    nk[cur] += 1
                    rk[cur] = 1.0 / (Gk[cur] + nk[cur])
                    if sup is None:
                        stats[S_CHANGED] += 1
                    else:
                        if sup_on:
                            for l in range(L):
                                Ml[l] += etaT[cur, l] - etaT[s, l]
                        n_changed += 1
                    if cu < K and MAX_LOAD_DEN * meta[mu + M_OCC] > MAX_LOAD_NUM * cu:
                        # compact the row: a fresh table, which holds token i at cur
                        rs = row_rebuild(u, -1, rows, prior, rk, scratch, rs)
                        stats[S_REBUILDS] += 1
                        tver[i] = meta[mu + M_VER]
                        tb[i] = cur
            if sweep >= record_from and record_docs:
                for i in range(s0, e0):
                    doc_acc[d, z[i]] += 1.0
            for i in range(s0, e0):
                nd[z[i]] = 0
        if sweep >= record_from and z_rec.shape[0] > sweep - record_from:
            z_rec[sweep - record_from, :] = z
    if sup is not None:  # counted in registers there; the LDA loop counts in memory (fewer live values)
        stats[S_WORD_PROP] = n_wp
        stats[S_WORD_ACC] = n_wa
        stats[S_DOC_PROP] = n_dp
        stats[S_DOC_ACC] = n_da
        stats[S_EXP_PROP] = n_ep
        stats[S_EXP_ACC] = n_ea
        stats[S_CHANGED] = n_changed
    return stats


@njit(cache=True, nogil=True)
def word_loglik_kernel(tok_w, z, ent, meta, nk, Gk, G, dense_prior, beta):
    """sum_i log phi_hat(w_i | z_i) at the current counts (a cheap per-batch fit score)."""
    K = nk.shape[0]
    total = 0.0
    for i in range(tok_w.shape[0]):
        u = tok_w[i]
        k = z[i]
        e = row_find(ent, meta[8 * u + M_OFF], meta[8 * u + M_CAP], K, k)
        g = G[u * K + k] if dense_prior else beta
        total += math.log((g + ent[4 * e + 1]) / (Gk[k] + nk[k]))
    return total


# --------------------------------------------------------------------------------------------
# Host side: the arrays of one run, the kernel's one host wrapper, the one driver
# --------------------------------------------------------------------------------------------
class SamplerArrays(WordRows):
    """Everything one sampler run keeps between kernel calls: the word rows and tables
    (``word_rows.WordRows``) plus per token z (N,) int32 and tver/tb (N,), the table version
    it last saw and its topic in that table (-1: not counted in it)."""

    def __init__(self, U: int, N: int, K: int, table_draws: int | None = None, freq=None):
        super().__init__(U, N, K, table_draws, freq)
        self.z = np.zeros(N, dtype=np.int32)
        self.tver = np.zeros(N, dtype=np.int64)
        self.tb = np.full(N, -1, dtype=np.int32)

    @classmethod
    def allocate(cls, U: int, N: int, K: int, table_draws: int | None = None, freq=None) -> "SamplerArrays":
        return cls(U, N, K, table_draws, freq)

    def run(self, seed, tok_w, tok_ptr, Gk, G, dense_prior, beta, alpha, n_sweeps, mh_steps, mixture, init,
            record_from=None, z_rec=None, doc_acc=None, word_prior=True, tries=1, sup=None) -> np.ndarray:
        """``n_sweeps`` sweeps of :func:`mh_sweeps` seeded by ``seed``; returns the statistics
        (N_LDA_STATS slots without ``sup``, N_STATS with it).  ``mixture``: a COMPOSE_* value
        (a bool for LDA runs); ``init``: an INIT_* value; ``sup``: None or the tuple
        ``alias_supervised.supervised_term`` builds."""
        K = self.K
        word_tries, doc_tries = resolve_tries(tries, K)
        compose = int(mixture) if sup is not None else (COMPOSE_MIXTURE if mixture else COMPOSE_CYCLE)
        n_sweeps = int(n_sweeps)
        stats = mh_sweeps(
            rng_state(seed),
            (tok_w, tok_ptr, self.z, self.tver, self.tb),
            (self.ent, self.entf, self.meta, self.metaf, self.samples, self.nk),
            (Gk, np.ascontiguousarray(G).reshape(-1), bool(dense_prior), float(beta), float(alpha)),
            (n_sweeps, int(mh_steps), int(word_tries), int(doc_tries), compose, bool(word_prior), int(init)),
            (n_sweeps if record_from is None else int(record_from),
             np.zeros((0, 0), dtype=np.int32) if z_rec is None else z_rec,
             np.zeros((0, K)) if doc_acc is None else doc_acc),
            sup)
        return stats if sup is not None else stats[:N_LDA_STATS]

    def word_loglik(self, tok_w, Gk, G, dense_prior, beta) -> float:
        if tok_w.shape[0] == 0:
            return 0.0
        return float(word_loglik_kernel(tok_w, self.z, self.ent, self.meta, self.nk, Gk,
                                        np.ascontiguousarray(G).reshape(-1), bool(dense_prior), float(beta)))


class SweepHook:
    """What the driver calls around the kernel: ``before(done, arrays)`` ahead of each call that
    sweeps, ``after(done, arrays)`` once it returned (``done``: sweeps finished by then).  The
    supervised runs redraw their augmentation and eta here (``alias_supervised``); batch fits
    call the user's progress callback."""

    def before(self, done: int, arr: SamplerArrays) -> None:
        pass

    def after(self, done: int, arr: SamplerArrays) -> None:
        pass


def run_chain(arr: SamplerArrays, call, n_sweeps: int, seeds, *, chunk: int, init: int, init_alone: bool = False,
              hook: SweepHook | None = None, n_burn: int | None = None, z_rec=None, doc_acc=None):
    """The one driver of a sampler run: ``n_sweeps`` sweeps in kernel calls of ``chunk`` sweeps.

    ``call(seed, n, init, record_from, z_rec, doc_acc)`` runs the kernel (``SamplerArrays.run``
    with the run's fixed arguments bound).  The call starting at sweep ``done`` is seeded by
    ``seeds[done]`` (``seeds[done + 1]`` when ``init_alone``: the start state is then drawn
    by a call of its own with ``seeds[0]``).  Sweeps >= ``n_burn`` are recorded into
    ``z_rec`` / ``doc_acc`` (None: none are).  Returns (statistics (N_STATS,), kernel seconds).
    """
    hook = hook or SweepHook()
    total = np.zeros(N_STATS, dtype=np.int64)
    rec = n_sweeps if n_burn is None else n_burn
    seconds = 0.0

    def go(seed, n, ini, done):
        nonlocal seconds
        t0 = time.perf_counter()
        st = call(seed, n, ini, max(rec - done, 0), None if z_rec is None else z_rec[max(done - rec, 0):], doc_acc)
        seconds += time.perf_counter() - t0
        total[:st.shape[0]] += st

    off = 0
    if init_alone:
        go(seeds[0], 0, init, 0)
        off = 1
    done = 0
    first = not init_alone
    while done < n_sweeps or first:
        n = min(chunk, n_sweeps - done)
        if n > 0:
            hook.before(done, arr)
        go(seeds[done + off], n, init if first else INIT_GIVEN, done)
        done += n
        first = False
        if n > 0:
            hook.after(done, arr)
    return total, seconds


def acceptance(stats: np.ndarray, exp: bool = False) -> dict:
    """MH acceptance rates by proposal kind from a statistics vector."""
    out = {
        "word": float(stats[S_WORD_ACC] / stats[S_WORD_PROP]) if stats[S_WORD_PROP] else float("nan"),
        "doc": float(stats[S_DOC_ACC] / stats[S_DOC_PROP]) if stats[S_DOC_PROP] else float("nan"),
    }
    if exp:
        out["exp"] = float(stats[S_EXP_ACC] / stats[S_EXP_PROP]) if stats[S_EXP_PROP] else float("nan")
    return out
