"""Conformance cases of the physics domain: binned speculative Langevin paths vs their exact law.

Each case runs ``speculative_simulate`` on n independent replicas of a 1-D double well (one
particle each) with lookahead 2, and makes the outcome of a replica hashable by binning
(x_1, x_2, x_3): kept drafts, reflections and bonus draws, over one or two rounds. The exact law of the
bins comes from numerical integration of the Gaussian transitions (``path_law``, error below
1e-12). One case per kind of draft: a wrong force function, "frozen", and a frozen correction.

Example:
    >>> from speculate.domains.physics.conformance import conformance_cases
    >>> [c.name for c in conformance_cases()]             # doctest: +NORMALIZE_WHITESPACE
    ['physics: double well, function draft', 'physics: double well, frozen draft',
     'physics: double well, frozen-correction draft']
"""

from __future__ import annotations

import numpy as np

from speculate.testing import ConformanceCase

from .api import speculative_simulate
from .drafts import frozen_correction
from .langevin import Langevin
from .path_law import binned_path_law
from .potentials import DoubleWell

EDGES = (-0.6, 0.4, 1.1)
STEPS = 3
LOOKAHEAD = 2


def _case(name: str, model: Langevin, x0: float, n: int) -> ConformanceCase:
    law = binned_path_law(model, x0, EDGES, STEPS)

    def sample(n: int, seed: int) -> list:
        sim = speculative_simulate(model, np.full((n, 1, 1), x0), STEPS, lookahead=LOOKAHEAD, rng=seed)
        paths = sim.positions[:, 1:, 0, 0]                                # [n, 3]
        lab = np.searchsorted(np.asarray(EDGES), paths, side="right")
        return [tuple(r) for r in lab.tolist()]

    return ConformanceCase(name=name, sample=sample, law=law, n=n)


def conformance_cases() -> list[ConformanceCase]:
    """Three cases (about 3 s together): one per kind of draft force."""
    well = DoubleWell(1.0)
    return [
        _case("physics: double well, function draft",
              Langevin(force=well, draft_force=DoubleWell(1.0, tilt=2.0), dt=0.05), 1.4, 20_000),
        _case("physics: double well, frozen draft",
              Langevin(force=well, draft_force="frozen", dt=0.02, kT=0.5), -0.2, 20_000),
        _case("physics: double well, frozen-correction draft",
              Langevin(force=well, draft_force=frozen_correction(DoubleWell(0.7)), dt=0.05),
              0.8, 20_000),
    ]
