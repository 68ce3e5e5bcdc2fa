"""Speculative rollouts for gymnasium environments with an expensive policy (see README.md).

Modules: :mod:`.api` (the public functions: speculative and plain rollouts, :class:`Episode`),
:mod:`.process` (the round loop's Process), :mod:`.drafts` (the draft policy), :mod:`.policies`
(the policy protocol), :mod:`.snapshots` (exact env save/restore and its checker),
:mod:`.trajectory_law` (exact laws of short toy-text episodes), :mod:`.distill`, :mod:`.models`,
:mod:`.cartpole`, :mod:`.seeding`, :mod:`.conformance`, :mod:`.demo`.

>>> from speculate.domains.rl import speculative_rollout, speculative_rollouts, distill_policy
"""

from .api import Episode, Rollouts, rollout, rollouts, speculative_rollout, speculative_rollouts
from .distill import DistillReport, distill_policy
from .drafts import PolicyDraft
from .policies import TabularPolicy
from .snapshots import EnvSnapshotter, SnapshotError, check_snapshot, register_snapshot, snapshotter

__all__ = [
    "DistillReport",
    "EnvSnapshotter",
    "Episode",
    "PolicyDraft",
    "Rollouts",
    "SnapshotError",
    "TabularPolicy",
    "check_snapshot",
    "distill_policy",
    "register_snapshot",
    "rollout",
    "rollouts",
    "snapshotter",
    "speculative_rollout",
    "speculative_rollouts",
]
