"""speculate: exact speculative sampling. Make slow stochastic pipelines fast without changing what they compute.

>>> import speculate as sp
>>> y, kept = sp.speculative_sample(sp.Categorical(probs=[0.6, 0.4]), sp.Categorical(probs=[0.8, 0.2]), rng=0)
"""

from . import distributed, theory
from .chain import Trajectories, Trajectory, batched, chain, chains
from .distributions import Categorical, Distribution, Normal, PlainValueWarning, PointMass, from_scipy, from_torch
from .engine import SpeculationResult, speculate, speculative_sample
from .rounds import Process, Proposal, Verdict
from .stats import Stats
from .verify import ResidualSamplingError

__all__ = [
    "Categorical",
    "Distribution",
    "Normal",
    "PlainValueWarning",
    "PointMass",
    "Process",
    "Proposal",
    "ResidualSamplingError",
    "SpeculationResult",
    "Stats",
    "Trajectories",
    "Trajectory",
    "Verdict",
    "batched",
    "chain",
    "chains",
    "distributed",
    "from_scipy",
    "from_torch",
    "speculate",
    "speculative_sample",
    "theory",
]
__version__ = "0.1.0"
