"""Random numbers, Walker alias tables and a prefetch hint for the sampling kernels.

* SplitMix64 (Steele, Lea & Flood 2014): one uint64 of state per kernel call, advanced
  inline, so the hot loops keep it in a register and kernels stay thread-safe.
* Walker's alias method in Vose's O(K) construction (AliasLDA §3.1 GenerateAlias /
  SampleAlias): after the build every draw costs one uniform number.
* ``prefetch``: llvm.prefetch of one array element, for software-pipelined loops.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit_cache import njit

# --------------------------------------------------------------------------------------------
# Random numbers: SplitMix64 (Steele, Lea & Flood 2014), one uint64 of state per kernel call.
# numba's np.random.random() costs ~18 ns a call here against ~2 ns for this inline stream,
# which matters at ~5 uniforms per token; the state is explicit, so kernels are thread-safe.
# --------------------------------------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2^-53


@njit(cache=True, nogil=True, inline="always")
def rng_next(x):
    """Advance the SplitMix64 state x; returns (new state, uniform double in [0, 1)).

    Scalars only, inlined at the numba IR level: the hot loops keep the state in a register
    (a call taking an array would pass it as a struct on the stack each time).
    """
    x = x + _GOLDEN
    y = (x ^ (x >> np.uint64(30))) * _MIX1
    y = (y ^ (y >> np.uint64(27))) * _MIX2
    y = y ^ (y >> np.uint64(31))
    return x, (y >> np.uint64(11)) * _TO_UNIT


def rng_state(seed: int) -> np.uint64:
    # Spread the seed once through SeedSequence so nearby seeds give unrelated streams.
    return np.random.SeedSequence(int(seed) & ((1 << 64) - 1)).generate_state(1, dtype=np.uint64)[0]


# --------------------------------------------------------------------------------------------
# Walker alias tables (Vose's O(K) construction; AliasLDA §3.1 GenerateAlias / SampleAlias)
# --------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def alias_build(w, prob, alias, small, large):
    """Fill (prob, alias) so that bin j yields j w.p. prob[j], else alias[j]; O(K).

    Vose's construction; the first split into short and tall bins is branch-free (a coin
    flip for the branch predictor): indices go to both stacks, one stack pointer advances.
    """
    K = w.shape[0]
    total = 0.0
    for k in range(K):
        total += w[k]
    scale = K / total
    ns = 0
    nl = 0
    for k in range(K):
        p = w[k] * scale
        prob[k] = p
        alias[k] = k
        short = p < 1.0
        small[ns] = k
        large[nl] = k
        ns += short
        nl += 1 - short
    while ns > 0 and nl > 0:
        ns -= 1
        s = small[ns]
        l = large[nl - 1]
        alias[s] = l
        pl = prob[l] + prob[s] - 1.0  # l gives bin s the mass it lacks (Robin Hood)
        prob[l] = pl
        if pl < 1.0:
            nl -= 1
            small[ns] = l
            ns += 1
    # Leftovers are 1 up to rounding.
    for a in range(nl):
        prob[large[a]] = 1.0
    for a in range(ns):
        prob[small[a]] = 1.0


@njit(cache=True, nogil=True)
def _alias_fill(prob, alias, out, lo, n, rs):
    """out[lo:lo+n] = draws from a built table (SampleAlias): one uniform picks the bin and, by
    its fractional part, the bin's biased coin (a select, not a branch).  Returns the state."""
    K = prob.shape[0]
    for i in range(lo, lo + n):
        rs, x = rng_next(rs)
        x *= K
        j = min(int(x), K - 1)
        other = alias[j]
        out[i] = j if x - j < prob[j] else other
    return rs


@njit(cache=True, nogil=True)
def _alias_sample(weights, n, rs):
    K = weights.shape[0]
    prob = np.empty(K)
    alias = np.empty(K, dtype=np.int32)
    small = np.empty(K, dtype=np.int32)
    large = np.empty(K, dtype=np.int32)
    alias_build(weights.astype(np.float64), prob, alias, small, large)
    out = np.empty(n, dtype=np.int64)
    _alias_fill(prob, alias, out, 0, n, rs)
    return out


def alias_sample(weights, n: int, seed: int) -> np.ndarray:
    """n draws from the distribution ∝ weights through one Walker table (for tests and callers)."""
    return _alias_sample(np.asarray(weights, dtype=np.float64), int(n), rng_state(seed))


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint the cache line holding arr[idx] (1-D array) into all cache levels (llvm.prefetch)."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, idx), codegen
