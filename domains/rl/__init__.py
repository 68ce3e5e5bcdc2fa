"""Speculative rollouts for gymnasium environments with an expensive policy (see README.md).

>>> from speculate.domains.rl import speculative_rollout, speculative_rollouts, distill_policy
"""

from .distill import DistillReport, distill_policy
from .policies import TabularPolicy
from .snapshot_check import check_snapshot
from .snapshots import EnvSnapshotter, SnapshotError, register_snapshot, snapshotter
from .speculative import (
    Rollouts,
    Trajectory,
    rollout,
    rollouts,
    speculative_rollout,
    speculative_rollouts,
)

__all__ = [
    "DistillReport",
    "EnvSnapshotter",
    "Rollouts",
    "SnapshotError",
    "TabularPolicy",
    "Trajectory",
    "check_snapshot",
    "distill_policy",
    "register_snapshot",
    "rollout",
    "rollouts",
    "snapshotter",
    "speculative_rollout",
    "speculative_rollouts",
]
