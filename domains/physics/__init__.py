"""speculate.domains.physics: exact speculative Brownian (overdamped Langevin) dynamics.

A cheap draft force runs k Euler-Maruyama steps ahead; the expensive force scores all k+1
configurations in one batched call; reflection maximal coupling keeps a prefix of the drafted
steps. The trajectory is distributed exactly as the Euler-Maruyama chain with the exact force
(exact for the discretised chain, not the continuous SDE).

    >>> import numpy as np
    >>> from speculate.domains.physics import DoubleWell, Langevin, simulate
    >>> traj = simulate(Langevin(force=DoubleWell(), dt=1e-2), np.zeros((1, 1)), 5, seed=0)
    >>> traj.positions.shape
    (6, 1, 1)
"""

from .coulomb import DebyeHueckel, Ewald, IonicFluid, ionic_fluid, rock_salt
from .langevin import (
    FrozenCorrection,
    Langevin,
    SimulationStats,
    Trajectory,
    frozen_correction,
    simulate,
)
from .lennard_jones import LennardJones, fcc_lattice, radial_distribution
from .potentials import DoubleWell, MuellerBrown
from .speculative import LangevinProcess, speculative_simulate

__all__ = [
    "DebyeHueckel",
    "DoubleWell",
    "Ewald",
    "FrozenCorrection",
    "IonicFluid",
    "Langevin",
    "LangevinProcess",
    "LennardJones",
    "MuellerBrown",
    "SimulationStats",
    "Trajectory",
    "fcc_lattice",
    "frozen_correction",
    "ionic_fluid",
    "radial_distribution",
    "rock_salt",
    "simulate",
    "speculative_simulate",
]
