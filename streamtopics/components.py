"""The working parts an option object stands for: the local-step engine and the global update."""
from __future__ import annotations

from .engines.alias import AliasEngine
from .engines.lsparse import LSparseEngine
from .options import AliasMH, LSparse, Memoized, Stochastic
from .updates import MemoizedUpdate, StochasticUpdate


def build_engine(opt: LSparse | AliasMH, runner, seed_source):
    """The engine of ``opt``; ``runner()`` makes the variational engine's thread runner,
    ``seed_source()`` gives the sampler the seed of each call."""
    if isinstance(opt, AliasMH):
        return AliasEngine(burn_in=int(opt.burn_in), sample_sweeps=int(opt.sample_sweeps), mh_steps=opt.mh_steps,
                           proposal=opt.proposal, table_draws=None if opt.table_draws is None else int(opt.table_draws),
                           alpha_proposal=opt.alpha_proposal, tries=opt.tries, kernel=opt.kernel,
                           seed_source=seed_source)
    return LSparseEngine(sparsity=int(opt.sparsity), max_iter=int(opt.max_iter), tol=float(opt.tol),
                         active_eps=float(opt.active_eps), restart_trials=int(opt.restart_trials) if opt.restarts else 0,
                         restart_iters=int(opt.restart_iters), runner=runner())


def build_update(opt: Stochastic | Memoized):
    if isinstance(opt, Memoized):
        return MemoizedUpdate(opt.memo_window)
    return StochasticUpdate(opt.delay, opt.forgetting_rate, opt.rho_min, opt.corpus_size)
