"""speculate.domains.diffusion: exact speculative sampling for diffusion models.

A cheap draft (a smaller denoiser, the target's frozen last output, or a frozen correction) runs
k denoising steps ahead; the target denoiser scores all k+1 states in one batched call; the
shared Gaussian kernel (reflection maximal coupling, per-step scales) keeps a prefix of the drafted
steps. Every state of the chain has exactly the law of plain sampling with the target
(ancestral DDPM, stochastic DDIM, VP-SDE Euler-Maruyama).

    >>> from speculate.domains.diffusion import DDPM, speculative_sample
    >>> from speculate.domains.diffusion.marginal_law import GaussianData
    >>> sched = DDPM(timesteps=100)
    >>> x, stats = speculative_sample(sched, GaussianData([0.0, 1.0], 0.5).denoiser(sched), "frozen",
    ...                               shape=(2, 2), rng=0)
    >>> x.shape, stats.steps
    ((2, 2), 100)
"""

from .api import DiffusionStats, Sampling, sample, speculative_sample
from .drafts import DenoiserDraft, Draft, FrozenCorrection, FrozenDraft, frozen_correction
from .process import DiffusionProcess
from .samplers import DDIM, DDPM, VPSDE, Plan, Sampler, cosine_betas, linear_betas

__all__ = [
    "DDIM",
    "DDPM",
    "VPSDE",
    "DenoiserDraft",
    "DiffusionProcess",
    "DiffusionStats",
    "Draft",
    "FrozenCorrection",
    "FrozenDraft",
    "Plan",
    "Sampler",
    "Sampling",
    "cosine_betas",
    "frozen_correction",
    "linear_betas",
    "sample",
    "speculative_sample",
]
