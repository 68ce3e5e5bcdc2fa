"""Conformance cases of the diffusion domain: joint laws of binned denoising paths of two rows.

Each case runs ``speculative_sample`` on one batch of 2n samples of class-conditional Gaussian
data in D = 2 whose rows alternate between label 0 (N((0.8, -0.4), 0.3^2 I)) and label 1
(N((-0.6, 0.5), 0.5^2 I)), so rows with different targets, in different states and with different
acceptance, advance side by side in every round. DDPM with T = 8 (linear betas scaled to T) at
lookahead 3, so the chain takes several rounds. The outcome of one sample is the pair of
neighbouring rows (2j, 2j+1): the bins of coordinate 0 of row 2j and coordinate 1 of row 2j+1 at
t = 6, 3 and 0 (the sample), each split at its exact mean: 64 joint cells. The exact joint law is
the product of the two rows' laws (independent chains; each coordinate of an affine-Gaussian chain
is a Gaussian Markov chain, ``marginal_law.ChainLaw.binned_path_law``, quadrature error below
1e-12): a bias of one row, a dependence between rows (shared noise, a row's eps read by its
neighbour) or between rounds shows in it.

Two cases: the frozen draft (training-free) and a deliberately poor denoiser draft (the exact
denoiser of other data: most drafts rejected, the reflection path exercised). ``conformance_cases(tv)``
sizes every case to catch any deviation of total variation ``tv`` of its joint law with probability
0.99 at ``DEFAULT_ALPHA / 2`` (``speculate.testing.chi2_sample_size``): tv = 0.02 by default (about
1 s per case), 0.01 for the slow tests.

Example:
    >>> from speculate.domains.diffusion.conformance import conformance_cases
    >>> [c.name for c in conformance_cases()]             # doctest: +NORMALIZE_WHITESPACE
    ['diffusion: two rows of class-conditional Gaussian data, frozen draft',
     'diffusion: two rows of class-conditional Gaussian data, poor denoiser draft']
"""

from __future__ import annotations

from typing import Any

import numpy as np

from speculate.testing import DEFAULT_ALPHA, ConformanceCase, chi2_sample_size

from .api import speculative_sample
from .marginal_law import ClassConditional, GaussianData, affine_chain_law
from .samplers import DDPM

__all__ = ["CHECKS", "LAWS", "LOOKAHEAD", "OBSERVE", "SAMPLER", "conformance_cases"]

SAMPLER = DDPM(timesteps=8)
LAWS = {0: GaussianData([0.8, -0.4], 0.3), 1: GaussianData([-0.6, 0.5], 0.5)}  #: the data law of each label
POOR = {0: GaussianData([-1.0, 1.0], 0.8), 1: GaussianData([1.0, -1.0], 0.8)}  #: the poor draft's
OBSERVE = (6, 3, 0)  #: the times whose bins form a row's part of the outcome
COORDINATE = (0, 1)  #: the coordinate observed in row 2j (label 0) and in row 2j+1 (label 1)
LOOKAHEAD = 3
CHECKS = 2  #: the cases, run at DEFAULT_ALPHA / CHECKS by tests/diffusion (their size assumes it)


def _row_law(label: int) -> tuple[dict, np.ndarray]:
    law = affine_chain_law(SAMPLER, LAWS[label])
    c = COORDINATE[label]
    edges = np.array([law.marginal(t)[0][c] for t in OBSERVE])  # each time split at its exact mean
    return law.binned_path_law(c, OBSERVE, [[e] for e in edges]), edges


def _case(name: str, draft: Any, tv: float) -> ConformanceCase:
    (law_a, edges_a), (law_b, edges_b) = _row_law(0), _row_law(1)
    law = {(*a, *b): pa * pb for a, pa in law_a.items() for b, pb in law_b.items()}
    target = ClassConditional(LAWS, SAMPLER)

    def sample(n: int, seed: int) -> list:
        labels = np.tile([0, 1], n)
        res = speculative_sample(SAMPLER, target, draft, (2 * n, 2), lookahead=LOOKAHEAD, labels=labels,
                                 record=OBSERVE, rng=seed)
        a = np.stack([res.path[t][0::2, COORDINATE[0]] >= e for t, e in zip(OBSERVE, edges_a, strict=True)], 1)
        b = np.stack([res.path[t][1::2, COORDINATE[1]] >= e for t, e in zip(OBSERVE, edges_b, strict=True)], 1)
        return [tuple(r) for r in np.concatenate([a, b], axis=1).astype(np.int64).tolist()]

    n = chi2_sample_size(tv, len(law), alpha=DEFAULT_ALPHA / CHECKS)
    return ConformanceCase(name=name, sample=sample, law=law, n=n)


def conformance_cases(tv: float = 0.02) -> list[ConformanceCase]:
    """Two cases (about 1 s each at tv = 0.02): the frozen draft and a poor denoiser draft, each sized
    to catch any deviation of total variation ``tv`` of its joint law w.p. 0.99 at DEFAULT_ALPHA / 2."""
    return [
        _case("diffusion: two rows of class-conditional Gaussian data, frozen draft", "frozen", tv),
        _case("diffusion: two rows of class-conditional Gaussian data, poor denoiser draft",
              ClassConditional(POOR, SAMPLER), tv),
    ]
