"""The alias engine's small-K kernel: exact collapsed Gibbs over dense, SIMD-friendly counts.

Each token i (document d, word w, current topic s) is drawn from the exact conditional

    p(z_i = k | rest) ∝ (n_dk + alpha) (n_wk + beta) / (n_k + V beta)       (counts ¬i; AliasLDA Eq. 5)

by computing all K masses and inverting their CDF with one uniform number, as the O(K)
reference ``gibbs_ref`` does, but laid out for the vector units:

* word-topic counts are one contiguous int32 row per word type, K padded to a multiple of
  ``LANES`` (padding topics carry zero mass);
* the document factor and the topic factor are folded into one float32 vector per document,
  c_k = (n_dk + alpha) / (n_k + V beta), kept current (two entries change when a token moves),
  so a token's masses are one fused loop p_k = c_k (n_wk + beta) (float32, vectorised);
* the loop also leaves the sum of each block of ``LANES`` masses, so the draw scans the
  K / LANES block sums, then one block, instead of a K-long sequential CDF;
* the counts include token i itself; only entry s is patched to its ¬i value (and its block
  sum recomputed), so a token whose topic does not change costs no count updates at all;
* the next token's word row is prefetched; uniforms come from ``walker``'s SplitMix64 stream.

Exactness: every mass is the exact conditional up to float32 rounding (relative ~1e-7),
the same order as the peers' float kernels; the tests compare whole chains with enumerated
posteriors of tiny models (chi-square), as for the MH kernel.

Which kernel (``choose_kernel``, ``kernel="auto"``).  Per token the dense kernel costs O(K)
vector work, the alias-MH kernel amortized O(1) with larger constants (table builds, row
lookups, rejected proposals), so the dense kernel wins below some K.  Measured with
``python bench/bench_alias.py --section kernels`` (20NG train, 1.44M tokens, V = 73,397,
alpha 0.1, beta 0.01, both forced from a uniform start, sampling time, median of 2 paired
rounds; a shared 2-core machine at load 2-5, so single figures drift 20-40 %):

    K      sweeps  dense ns/token  MH ns/token  dense speed / MH
    100    30      84              226          2.76x   (3 rounds, load ~2; at load ~5: 167 / 691)
    192    20      309             542          1.79x
    256    20      246             534          2.13x
    320    20      239             517          2.16x
    400    20      245             371          1.51x
    512    20/30   199/239         394/411      1.98x/1.76x
    768    20/30   571/393         705/419      1.24x/1.12x
    1024   20/30   378/379         484/364      1.40x/0.96x
    1536   20      693             373          0.54x

so ``DENSE_MAX_K = 768``: the largest K at which the dense kernel was the faster in every
median (at 1024 the two tie, at 1536 MH is ~2x faster).  The dense rows take U x K x 4 bytes
(225 MB at K = 768 on 20NG, against the MH rows' O(tokens) ~65 MB), so "auto" also falls back
to MH past ``DENSE_MAX_BYTES``.  Both kernels sample the same exact target; per sweep the
dense one is the exact Gibbs chain itself (MH with default tries trails it by 0.6-0.9 % of
held-out after 200 sweeps, ``alias_core``).

State: ``DenseArrays`` holds z, n_wk, n_k during a run and converts into the engine's own
``alias_core.SamplerArrays`` at the end (``to_sampler_arrays``), so the model's topics,
snapshots, ``transform`` and later ``partial_fit`` see one form whichever kernel ran.  Which
kernel runs is decided by ``choose_kernel`` below.
"""
from __future__ import annotations

import time

import numpy as np

from .alias_core import INIT_UNIFORM, N_LDA_STATS, S_CHANGED, SamplerArrays, SweepHook, run_chain
from ..jit_cache import njit
from .walker import prefetch, rng_next, rng_state
from .word_rows import M_CAP, M_OFF, row_find_or_insert

AHEAD = 4   # tokens ahead whose word row is prefetched
LANES = 16  # float32 lanes of one AVX-512 register (two AVX2 registers); one 64-byte line of int32 counts


@njit(cache=True, nogil=True, fastmath=True)
def _masses(c, row, base, beta, p, Kp):
    """p_k = c_k (n_wk + beta) over the padded K (one vector loop); returns their sum."""
    r = row[base:base + Kp]
    tot = np.float32(0.0)
    for k in range(Kp):
        v = c[k] * (np.float32(r[k]) + beta)
        p[k] = v
        tot += v
    return tot


@njit(cache=True, nogil=True, fastmath=True)
def _block_sum(p, o):
    """Sum of p[o:o+LANES] (a horizontal vector sum)."""
    acc = np.float32(0.0)
    for l in range(LANES):
        acc += p[o + l]
    return acc


@njit(cache=True, nogil=True)
def dense_sweeps(rs, tok_w, tok_ptr, z, nwk, nk, alpha, beta, vbeta, n_sweeps, init):
    """``n_sweeps`` exact Gibbs sweeps (module docstring); returns (state, tokens moved).

    nwk: (U Kp,) int32 word rows, Kp = K rounded up to LANES; nk (K,) int64; z (N,) int32.
    ``init``: draw z uniformly first and count it.  fastmath is confined to ``_masses`` (the
    reductions it reorders are sums of positive float32 masses); the draw itself is plain.
    """
    K = nk.shape[0]
    N = tok_w.shape[0]
    D = tok_ptr.shape[0] - 1
    nb = (K + LANES - 1) // LANES
    Kp = nb * LANES
    if init:
        for i in range(N):
            rs, x = rng_next(rs)
            t = min(int(x * K), K - 1)
            z[i] = t
            nwk[tok_w[i] * Kp + t] += 1
            nk[t] += 1
    rk = np.empty(K)
    for k in range(K):
        rk[k] = 1.0 / (nk[k] + vbeta)
    nd = np.zeros(K, dtype=np.int64)
    c = np.zeros(Kp, dtype=np.float32)
    p = np.zeros(Kp, dtype=np.float32)
    b32 = np.float32(beta)
    moved = 0
    for _ in range(n_sweeps):
        for d in range(D):
            s0 = tok_ptr[d]
            e0 = tok_ptr[d + 1]
            for i in range(s0, e0):
                nd[z[i]] += 1
            for k in range(K):
                c[k] = np.float32((nd[k] + alpha) * rk[k])
            for i in range(s0, e0):
                w = tok_w[i]
                base = w * Kp
                if i + AHEAD < N:  # a later token's row (measured: 4 ahead ~15% faster than 1 at K=100)
                    nb_ = tok_w[i + AHEAD] * Kp
                    for j in range(nb):
                        prefetch(nwk, nb_ + j * LANES)
                s = z[i]
                total = _masses(c, nwk, base, b32, p, Kp)
                # entry s at its ¬i value: the token leaves its own counts
                ns = nd[s] - 1
                ps = np.float32((ns + alpha) * (nwk[base + s] - 1 + beta) / (nk[s] - 1 + vbeta))
                total += ps - p[s]
                p[s] = ps
                rs, u = rng_next(rs)
                x = np.float32(u) * total
                # inverse CDF by blocks: skip whole blocks by their sums, then walk one block
                o = 0
                while o < Kp - LANES:
                    b_ = _block_sum(p, o)
                    if x < b_:
                        break
                    x -= b_
                    o += LANES
                t = o
                last = o + LANES - 1
                while t < last and x >= p[t]:
                    x -= p[t]
                    t += 1
                while p[t] <= 0.0:  # rounding ran past the block's mass (padding): the last topic with mass
                    t -= 1
                if t != s:
                    z[i] = t
                    nd[s] = ns
                    nd[t] += 1
                    nwk[base + s] -= 1
                    nwk[base + t] += 1
                    nk[s] -= 1
                    nk[t] += 1
                    rk[s] = 1.0 / (nk[s] + vbeta)
                    rk[t] = 1.0 / (nk[t] + vbeta)
                    c[s] = np.float32((ns + alpha) * rk[s])
                    c[t] = np.float32((nd[t] + alpha) * rk[t])
                    moved += 1
            for i in range(s0, e0):
                nd[z[i]] = 0
    return rs, moved


@njit(cache=True, nogil=True)
def _fill_rows(tok_w, z, ent, meta, nk, K):
    """Count every token (word tok_w[i], topic z[i]) into SamplerArrays rows (INIT_GIVEN form)."""
    for i in range(tok_w.shape[0]):
        u = tok_w[i]
        t = z[i]
        e = row_find_or_insert(ent, meta, u, meta[8 * u + M_OFF], meta[8 * u + M_CAP], K, t)
        ent[4 * e + 1] += 1
        nk[t] += 1


class DenseArrays:
    """State of one dense-kernel run: z (N,) int32, word rows n_wk (U, Kp) int32 (flat), n_k (K,).

    Reads like ``SamplerArrays`` for progress callbacks (``z``, ``nk``, ``counts()``,
    ``nbytes``); ``to_sampler_arrays`` hands the final state over in the engine's own form.
    """

    def __init__(self, U: int, N: int, K: int):
        self.U, self.N, self.K = int(U), int(N), int(K)
        self.Kp = -(-self.K // LANES) * LANES
        self.z = np.zeros(self.N, dtype=np.int32)
        self.nwk = np.zeros(self.U * self.Kp, dtype=np.int32)
        self.nk = np.zeros(self.K, dtype=np.int64)

    @staticmethod
    def nbytes_for(U: int, K: int) -> int:
        """Bytes of the word rows a run at (U, K) allocates."""
        return int(U) * (-(-int(K) // LANES) * LANES) * 4

    @property
    def nbytes(self) -> int:
        return self.nwk.nbytes + self.z.nbytes

    def run(self, seed, tok_w, tok_ptr, alpha: float, beta: float, n_vocab: int, n_sweeps: int, init: bool):
        """``n_sweeps`` sweeps seeded by ``seed``; returns the statistics vector (N_LDA_STATS slots)."""
        _, moved = dense_sweeps(rng_state(seed), tok_w, tok_ptr, self.z, self.nwk, self.nk, float(alpha),
                                float(beta), float(n_vocab) * float(beta), int(n_sweeps), bool(init))
        stats = np.zeros(N_LDA_STATS, dtype=np.int64)
        stats[S_CHANGED] = moved
        return stats

    def counts(self) -> np.ndarray:
        """n_wk as a dense (U, K) int32 array."""
        return np.ascontiguousarray(self.nwk.reshape(self.U, self.Kp)[:, :self.K])

    def release_tables(self) -> None:
        pass

    def to_sampler_arrays(self, tok_w, table_draws: int | None = None, freq=None) -> SamplerArrays:
        """The same state as ``SamplerArrays`` (rows sized by ``freq``, z counted, tables unbuilt)."""
        arr = SamplerArrays(self.U, self.N, self.K, table_draws, freq)
        arr.z[:] = self.z
        _fill_rows(tok_w, arr.z, arr.ent, arr.meta, arr.nk, self.K)
        return arr


# --------------------------------------------------------------------------------------------
# Which kernel a batch fit runs, and the dense run in the engine's form
# --------------------------------------------------------------------------------------------
KERNELS = ("auto", "dense", "mh")
DENSE_MAX_K = 768  # the dense kernel was faster than alias-MH up to here on 20NG (module docstring table)
DENSE_MAX_BYTES = 512 * 2**20  # dense word rows beyond this: the MH kernel's O(tokens) rows instead


def check_kernel(kernel: str) -> None:
    """Raise ValueError unless ``kernel`` is one of KERNELS."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} (got {kernel!r})")


def choose_kernel(kernel: str, K: int, U: int, supervised: bool = False) -> str:
    """"dense" or "mh" for a batch fit of K topics over U word types.

    "auto": the dense kernel for K <= DENSE_MAX_K (where it is the faster exact kernel,
    module docstring) while its rows stay under DENSE_MAX_BYTES, else the alias-MH kernel.
    Supervised fits always run the MH kernel (the dense kernel has no supervised term).
    """
    check_kernel(kernel)
    if supervised:
        if kernel == "dense":
            raise ValueError("kernel='dense' runs unsupervised batch fits only (labels need kernel 'mh' or 'auto')")
        return "mh"
    if kernel != "auto":
        return kernel
    return "dense" if int(K) <= DENSE_MAX_K and DenseArrays.nbytes_for(U, K) <= DENSE_MAX_BYTES else "mh"


def run_dense_sampler(tok_w, tok_ptr, U: int, K: int, alpha: float, beta: float, n_vocab: int, n_sweeps: int,
                      seed: int, table_draws: int | None = None, chunk: int | None = None,
                      hook: SweepHook | None = None) -> tuple[SamplerArrays, dict]:
    """Batch mode on the dense kernel, uniform start; returns (SamplerArrays, stats) as the MH
    driver does (``alias.run_batch_sampler``).  ``hook.after(done, arrays)`` runs every ``chunk``
    sweeps with the ``DenseArrays`` (z, nk, counts()); ``sampling_seconds`` covers the sweeps
    and the hand-over into SamplerArrays."""
    n_sweeps = int(n_sweeps)
    dense = DenseArrays(U, tok_w.shape[0], K)

    def call(seed_, n, init, record_from, z_rec, doc_acc):
        return dense.run(seed_, tok_w, tok_ptr, alpha, beta, n_vocab, n, init == INIT_UNIFORM)

    seeds = np.random.SeedSequence(seed).generate_state(max(n_sweeps, 1) + 1, dtype=np.uint32)
    total, elapsed = run_chain(dense, call, n_sweeps, seeds, chunk=chunk or n_sweeps, init=INIT_UNIFORM, hook=hook)
    rows_mib = dense.nbytes / 2**20
    t0 = time.perf_counter()
    arr = dense.to_sampler_arrays(tok_w, table_draws, np.bincount(tok_w, minlength=U))
    elapsed += time.perf_counter() - t0
    return arr, {"kernel": "dense", "mh_acceptance": {"word": float("nan"), "doc": float("nan")}, "alias_rebuilds": 0,
                 "sweeps": n_sweeps, "sampling_seconds": elapsed,
                 "changed_per_sweep": float(total[S_CHANGED]) / max(n_sweeps, 1), "tries": None, "rows_mib": rows_mib}
