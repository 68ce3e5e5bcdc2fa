"""speculate.domains.physics: exact speculative Brownian (overdamped Langevin) dynamics.

A cheap draft force runs k Euler-Maruyama steps ahead; the expensive force scores all k+1
configurations in one batched call; reflection maximal coupling keeps a prefix of the drafted
steps. The trajectory is distributed exactly as the Euler-Maruyama chain with the exact force
(exact for the discretised chain, not the continuous SDE).

    >>> import numpy as np
    >>> from speculate.domains.physics import DoubleWell, Langevin, simulate
    >>> sim = simulate(Langevin(force=DoubleWell(), dt=1e-2), np.zeros((1, 1)), 5, rng=0)
    >>> sim.positions.shape
    (6, 1, 1)
"""

from .api import Simulation, SimulationStats, simulate, speculative_simulate
from .coulomb import DebyeHueckel, Ewald, IonicFluid, ionic_fluid, rock_salt
from .drafts import Draft, ForceDraft, FrozenCorrection, FrozenDraft, frozen_correction
from .langevin import Langevin
from .lennard_jones import LennardJones, fcc_lattice, radial_distribution
from .potentials import DoubleWell, MuellerBrown
from .process import LangevinProcess

__all__ = [
    "DebyeHueckel",
    "DoubleWell",
    "Draft",
    "Ewald",
    "ForceDraft",
    "FrozenCorrection",
    "FrozenDraft",
    "IonicFluid",
    "Langevin",
    "LangevinProcess",
    "LennardJones",
    "MuellerBrown",
    "Simulation",
    "SimulationStats",
    "fcc_lattice",
    "frozen_correction",
    "ionic_fluid",
    "radial_distribution",
    "rock_salt",
    "simulate",
    "speculative_simulate",
]
