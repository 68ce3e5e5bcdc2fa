"""What every Categorical round checks before a rule runs, on the host (``one_round.py``) or on a
device (``device.py``): the rule's branches, the target's batch shape, the drafted outcomes' shape
and the draft's laws. Both routes import these; neither imports the other for them.

>>> import numpy as np
>>> from speculate import Categorical, Proposal
>>> target = Categorical(probs=np.full((2, 3, 4), 0.25))            # R = 2 rows, k + 1 = 3 positions
>>> oshape, outcomes = round_outcomes(target, Proposal(np.zeros((2, 2), np.int64), None), "token", 1, 2, 2)
>>> oshape, outcomes.shape
((2, 2), (2, 2))
>>> check_draft_laws(Categorical(probs=np.full((2, 3, 4), 0.25)), outcomes, oshape, 4)
Traceback (most recent call last):
ValueError: draft distributions must have batch shape (2, 2), got (2, 3)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..distributions import Categorical

__all__ = ["check_draft_laws", "round_outcomes"]


def round_outcomes(target: Any, proposal: Any, rule: str, m: int, k: int, R: int) -> tuple[tuple[int, ...], np.ndarray]:
    """What every Categorical round checks before a rule runs, on the host or on a device
    (``device.verify_device_round``): the rule takes ``m`` branches, the target scores
    ``(R, [m,] k+1)`` states, the drafted outcomes are ``(R, [m,] k)``. Returns their shape and
    the outcomes (zeros when k = 0)."""
    if rule == "greedy" and m != 1:
        raise ValueError("greedy verification takes one draft branch (branches=1)")
    if m != 1 and rule != "token" and rule != "greedy":
        raise ValueError(f"multi-draft (branches={m}) uses recursive rejection: pass verify='token'")
    shape = (R, k + 1) if m == 1 else (R, m, k + 1)
    if target.batch_shape != shape:
        raise ValueError(
            f"target must score {shape} states (rows, {'branches, ' if m > 1 else ''}k+1 positions) "
            f"in one call, got a {type(target).__name__} with batch shape {target.batch_shape}"
        )
    oshape = (*shape[:-1], k)
    outcomes = np.zeros(oshape, np.int64) if k == 0 else np.asarray(proposal.outcomes)
    if outcomes.shape != oshape:
        raise ValueError(f"drafted outcomes must have shape {oshape}, got {outcomes.shape}")
    return oshape, outcomes


def check_draft_laws(dists: Any, outcomes: np.ndarray, oshape: tuple[int, ...], V: int,
                     on_device: bool = False) -> None:
    """What every Categorical round checks of the draft's laws, on the host or on a device
    (``device.verify_device_round``, where a DeviceCategorical is a law too): point-mass drafts
    (``dists`` None) name outcomes in 0..V-1 (they index the point masses); laws are a batched
    Categorical of ``V`` outcomes and batch shape ``oshape``. A drafted outcome outside 0..V-1 with
    laws is the rules' to report, where they read it."""
    if dists is None:
        if outcomes.size and (outcomes.min() < 0 or outcomes.max() >= V):
            raise ValueError(f"drafted outcome outside 0..{V - 1}")
        return
    if not (isinstance(dists, Categorical) or (on_device and getattr(dists, "on_device", False))):
        raise ValueError(
            f"the target is Categorical but the draft distributions are {type(dists).__name__}: "
            "give a batched speculate.Categorical (or None for point-mass drafts)"
        )
    if dists.num_outcomes != V:
        raise ValueError(f"vocabulary mismatch: target has {V} outcomes, draft has {dists.num_outcomes}")
    if tuple(dists.batch_shape) != oshape:
        raise ValueError(f"draft distributions must have batch shape {oshape}, got {tuple(dists.batch_shape)}")
