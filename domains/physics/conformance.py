"""Conformance cases of the physics domain: joint laws of binned Langevin paths of two rows.

Each case runs ``speculative_simulate`` on one batch of 2n replicas of a 1-D double well (one
particle each) whose rows alternate between two different starting points, x = 1.4 (near a
minimum) and x = -0.3 (near the barrier), so rows in different states, with different acceptance,
advance side by side in every round. The outcome of one sample is the pair of neighbouring rows
(2j, 2j+1): the bins of (x_1, x_2, x_4) of each, 2 bins per step and row, 64 joint cells. With
lookahead 2 the four steps take at least two rounds, so an outcome covers kept drafts,
reflections and bonus draws of several rounds. The exact joint law is the product of the two
rows' laws (independent chains), each from numerical integration of the Gaussian transitions
(``path_law.binned_path_law``, error below 1e-12): a bias of one row, a dependence between rows
(shared uniforms, a row's state or force read by its neighbour) or between rounds shows in it.

One case per kind of draft (a wrong force function, "frozen", a frozen correction), each tuned to
keep 75-80% of drafts. ``conformance_cases(tv)`` sizes every case to catch any deviation of
total variation ``tv`` of its joint law with probability 0.99 at ``DEFAULT_ALPHA / 3``
(``speculate.testing.chi2_sample_size``): tv = 0.02 by default (about 1 s per case), 0.01 for the
slow tests.

Example:
    >>> from speculate.domains.physics.conformance import conformance_cases
    >>> [c.name for c in conformance_cases()]             # doctest: +NORMALIZE_WHITESPACE
    ['physics: double well, two rows, function draft', 'physics: double well, two rows, frozen draft',
     'physics: double well, two rows, frozen-correction draft']
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from speculate.testing import DEFAULT_ALPHA, ConformanceCase, chi2_sample_size

from .api import speculative_simulate
from .drafts import frozen_correction
from .langevin import Langevin
from .path_law import binned_path_law
from .potentials import DoubleWell

__all__ = ["EDGES", "LOOKAHEAD", "OBSERVE", "STARTS", "STEPS", "conformance_cases"]

STEPS = 4  #: steps per replica
OBSERVE = (1, 2, 4)  #: the steps whose bins form a row's part of the outcome
LOOKAHEAD = 2  #: drafted steps per round: the four steps take at least two rounds
STARTS = (1.4, -0.3)  #: the starting points of rows 2j and 2j+1
EDGES = (1.05, -0.4)  #: the one bin edge of each (its cells as even as can be)
CHECKS = 3  #: the cases, run at DEFAULT_ALPHA / CHECKS by tests/physics (their size assumes it)


def _case(name: str, model: Langevin, tv: float, edges: Sequence[float] = EDGES) -> ConformanceCase:
    """``edges[r]``: the one bin edge of the row started at STARTS[r]."""
    laws = [binned_path_law(model, x, (e,), STEPS, observe=OBSERVE) for x, e in zip(STARTS, edges, strict=True)]
    law = {(*a, *b): pa * pb for a, pa in laws[0].items() for b, pb in laws[1].items()}
    cut = np.repeat(np.asarray(edges, np.float64), len(OBSERVE))  # [6]: each row's edge per step

    def sample(n: int, seed: int) -> list:
        x0 = np.tile(np.asarray(STARTS, np.float64), n).reshape(2 * n, 1, 1)  # rows a, b, a, b, ...
        sim = speculative_simulate(model, x0, STEPS, lookahead=LOOKAHEAD, rng=seed)
        paths = sim.positions[:, list(OBSERVE), 0, 0].reshape(n, 2 * len(OBSERVE))  # [n, 6]: row a, row b
        return [tuple(r) for r in (paths >= cut).astype(np.int64).tolist()]

    n = chi2_sample_size(tv, len(law), alpha=DEFAULT_ALPHA / CHECKS)
    return ConformanceCase(name=name, sample=sample, law=law, n=n)


def conformance_cases(tv: float = 0.02) -> list[ConformanceCase]:
    """Three cases (about 1 s each at tv = 0.02): one per kind of draft force, each sized to catch
    any deviation of total variation ``tv`` of its joint law w.p. 0.99 at DEFAULT_ALPHA / 3."""
    well = DoubleWell(1.0)
    return [
        _case("physics: double well, two rows, function draft",
              Langevin(force=well, draft_force=DoubleWell(1.0, tilt=4.0), dt=0.05), tv),
        _case("physics: double well, two rows, frozen draft",
              Langevin(force=well, draft_force="frozen", dt=0.05, kT=0.5), tv),
        _case("physics: double well, two rows, frozen-correction draft",
              Langevin(force=well, draft_force=frozen_correction(DoubleWell(3.0)), dt=0.05), tv),
    ]
