"""Verify one round: route it to the right kernel (batched Categorical proposals to the token,
block, greedy or multi-draft kernel; equal-scale Normal proposals to the Gaussian reflection kernel)
or, for any other distributions, to the one-step rule (``one_step.py``) position by position.

``RULES`` is the one list of rule names; the round loop, the domains and speculate.testing import it.
Multi-draft verification is the token rule with ``branches > 1`` (recursive rejection). A proposal
whose target is a ``DeviceCategorical`` (probabilities in a tensor on an accelerator) is verified on
that device (``device.py``; routes "token-device", "block-device", "greedy-device",
"multi-device"); the checks both routes make before a rule runs are ``round_checks.py``'s. A proposal
that carries a ``tree`` (a parent array or a ``speculate.verify.Tree``) is a token tree: the token
rule verifies it with the tree kernel (``verify_tree``; route "tree"), the greedy rule with
``verify_tree_greedy`` (route "tree_greedy"); see :func:`verify_tree_round`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..distributions import Categorical, Normal, PointMass, as_distribution
from . import block, token
from .kernels import (
    run_kernel,
    verify_block,
    verify_gaussian,
    verify_greedy,
    verify_multi,
    verify_token,
    verify_tree,
    verify_tree_greedy,
)
from .one_step import verify_one
from .round_checks import check_draft_laws, round_outcomes
from .tree import Tree, tree_depths

RULES = ("token", "block", "greedy")  #: the verification rules; multi-draft is "token" with branches > 1


def verify_round(target: Any, proposal: Any, rule: str, branches: int, k: int, R: int, rng: np.random.Generator):
    """Verify one round of ``R`` rows with ``branches`` (m) branches of up to ``k`` drafts each.

    Returns ``(n_accepted [R], next outcomes, branch [R], route)``: the next outcomes are an array
    ``[R, *event]`` on the kernel routes and a list on the general one; ``route`` names the rule
    that ran ("token", "block", "greedy", "multi", "gaussian" or "general"; "token-device" & co. for
    a DeviceCategorical target). A tree proposal
    (``proposal.tree`` set) returns the accepted path ``[R, D]`` in place of ``branch`` and the
    route "tree" or "tree_greedy" (:func:`verify_tree_round`).
    """
    m = branches
    if getattr(proposal, "tree", None) is not None:
        return verify_tree_round(target, proposal, rule, branches, R, rng)
    lengths = _lengths(proposal.lengths, R, m, k)
    if getattr(target, "on_device", False):  # a DeviceCategorical: verified where its probabilities are
        from .device import verify_device_round  # torch is needed only here: the core does not import it

        return verify_device_round(target, proposal, rule, m, k, R, lengths, rng)
    if isinstance(target, Categorical) and (proposal.dists is None or isinstance(proposal.dists, Categorical)):
        return _categorical(target, proposal, rule, m, k, R, lengths, rng)
    if isinstance(target, Normal) and isinstance(proposal.dists, Normal):
        if rule != "token" or m != 1:
            raise ValueError(
                f"verify={rule!r} with branches={m} needs Categorical distributions; Normal transitions "
                "are verified token-wise (verify='token', branches=1)"
            )
        return _normal(target, proposal, k, R, lengths, rng)
    if rule == "block" or m != 1:
        raise ValueError(
            "block and multi-draft verification need Categorical target and draft distributions, "
            f"got target {type(target).__name__} and draft {type(proposal.dists).__name__}"
        )
    return _general(target, proposal, rule, k, R, lengths, rng)


def _lengths(lengths: Any, R: int, m: int, k: int) -> np.ndarray:
    shape = (R,) if m == 1 else (R, m)
    if lengths is None:
        a = np.empty(shape, np.int64)  # empty + fill: np.full costs twice as much on a few rows
        a.fill(k)
        return a
    a = np.asarray(lengths)
    if a.size and (a.dtype.kind not in "iu"):
        raise TypeError(f"proposal lengths must be integers (drafts per row), got dtype {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if m != 1 and a.shape == (R,):
        a = np.repeat(a[:, None], m, axis=1)
    if a.shape != shape:
        raise ValueError(f"proposal lengths must have shape {shape}, got {a.shape}")
    return a  # the kernels check 0 <= lengths <= k


def _categorical(target, proposal, rule, m, k, R, lengths, rng):
    oshape, outcomes = round_outcomes(target, proposal, rule, m, k, R)
    p, V = target.probs, target.num_outcomes
    if rule == "greedy":
        n, nxt = verify_greedy(p, outcomes, lengths)
        return n, nxt, np.zeros(R, np.int64), "greedy"
    q = _draft_probs(proposal.dists, outcomes, oshape, V, p.dtype)
    u_next = rng.random(R)
    if m == 1:
        u_accept = rng.random((R, k))
        if (
            p.dtype == q.dtype
            and p.dtype.isnative
            and p.flags.c_contiguous
            and q.flags.c_contiguous
            and outcomes.dtype == np.int64
        ):
            # everything is already in kernel form (shapes checked above): skip the wrapper's checks
            mod = token if rule == "token" else block
            n, nxt = run_kernel(mod, p, q, np.ascontiguousarray(outcomes), lengths, u_accept, u_next)
            return n, nxt, np.zeros(R, np.int64), rule
        fn = verify_token if rule == "token" else verify_block
        n, nxt = fn(p, q, outcomes, lengths, u_accept, u_next, check_uniforms=False)  # fresh from rng
        return n, nxt, np.zeros(R, np.int64), rule
    n, nxt, branch = verify_multi(p, q, outcomes, lengths, rng.random((R, k, m)), u_next, check_uniforms=False)
    return n, nxt, branch, "multi"


def _draft_probs(dists, outcomes, oshape, V, dtype):
    check_draft_laws(dists, outcomes, oshape, V)
    if dists is None:  # deterministic drafts (e.g. n-gram lookup): point masses at the outcomes
        q = np.zeros((*oshape, V), dtype)
        if outcomes.size:
            np.put_along_axis(q, outcomes[..., None], 1.0, axis=-1)
        return q
    return dists.probs


def _normal(target, proposal, k, R, lengths, rng):
    draft = proposal.dists
    if target.batch_shape != (R, k + 1) or draft.batch_shape != (R, k):
        raise ValueError(
            f"target Normal must have batch shape {(R, k + 1)} and draft {(R, k)}, got "
            f"{target.batch_shape} and {draft.batch_shape}"
        )
    if target.event_shape != draft.event_shape:
        raise ValueError(f"event shapes differ: target {target.event_shape}, draft {draft.event_shape}")
    ev = target.event_shape
    D = int(np.prod(ev, dtype=np.int64))
    if target.scale.size == 1 and draft.scale.size == 1:  # one scale for everything: no O(size) work
        if float(target.scale.flat[0]) != float(draft.scale.flat[0]):
            return _general(target, proposal, "token", k, R, lengths, rng)
        sp = target.scale.reshape(())
    else:
        sp = np.broadcast_to(target.scale, target.loc.shape)
        same = sp[:, :k] == np.broadcast_to(draft.scale, draft.loc.shape)  # [R, k, *event]
        read = (np.arange(k)[None, :] < lengths[:, None]).reshape(R, k, *([1] * len(ev)))  # drafts the kernel reads
        if not np.all(same | ~read):  # padding past a row's length may hold any draft scale
            return _general(target, proposal, "token", k, R, lengths, rng)
        sp = sp.reshape(R, k + 1, D)
    x = np.asarray(proposal.outcomes, dtype=np.float64)
    if x.shape != (R, k, *ev):
        raise ValueError(f"drafted outcomes must have shape {(R, k, *ev)}, got {x.shape}")
    n, nxt = verify_gaussian(
        target.loc.reshape(R, k + 1, D),
        draft.loc.reshape(R, k, D),
        sp,
        x.reshape(R, k, D),
        lengths,
        rng.random((R, k)),
        rng.standard_normal((R, D)),
    )
    return n, nxt.reshape(R, *ev), np.zeros(R, np.int64), "gaussian"


def _at(d: Any, r: int, i: int) -> Any:
    if isinstance(d, (Categorical, Normal)):
        if len(d.batch_shape) != 2:
            raise ValueError(f"batched distributions need batch shape (rows, positions), got {d.batch_shape}")
        return d[r][i]
    return as_distribution(d[r][i])


def _general(target, proposal, rule, k, R, lengths, rng):
    """Position by position with the one-step rule (token-wise), or exact match (greedy)."""
    if lengths.size and (lengths.min() < 0 or lengths.max() > k):
        raise ValueError(f"proposal lengths must lie in 0..{k}, got {lengths}")
    n_out = np.zeros(R, np.int64)
    nxt: list[Any] = [None] * R
    for r in range(R):
        L = int(lengths[r])
        n = 0
        while n < L:
            p = _at(target, r, n)
            x = proposal.outcomes[r][n]
            if rule == "greedy":
                y = _greedy_value(p)
                kept = _equal(x, y)
            else:
                y, kept = verify_one(p, _at(proposal.dists, r, n), x, rng)
            if not kept:
                break
            n += 1
        if n == L:
            p = _at(target, r, L)
            y = _greedy_value(p) if rule == "greedy" else p.sample(rng)
        n_out[r], nxt[r] = n, y
    return n_out, nxt, np.zeros(R, np.int64), "general"


def _greedy_value(p: Any) -> Any:
    if isinstance(p, PointMass):
        return p.value
    if isinstance(p, Categorical) and not p.batch_shape:
        return int(np.argmax(p.probs))
    raise ValueError(f"verify='greedy' needs point-mass or Categorical targets (argmax), got {type(p).__name__}")


def _equal(a: Any, b: Any) -> bool:
    return PointMass(b).log_prob(a) == 0.0


def as_tree(tree: Any) -> Tree:
    """``Proposal.tree`` as a :class:`~speculate.verify.Tree` (a bare parent array: i.i.d. children)."""
    if isinstance(tree, Tree):
        return tree
    return Tree(np.asarray(tree))


def tree_within_need(proposal: Any, cap: np.ndarray) -> np.ndarray:
    """The valid-node mask ``[R, N+1]`` of a tree proposal cut to depth ``cap[r]`` per row (the
    round loop's ``need - 1``: deeper nodes could never be used)."""
    tree = as_tree(proposal.tree)
    parent = np.asarray(tree.parent)
    R = len(cap)
    N1 = parent.shape[-1]
    depth = np.broadcast_to(tree_depths(np.clip(parent, -1, N1 - 1)), (R, N1))  # verify_tree checks the shape
    keep = depth <= np.asarray(cap)[:, None]
    if proposal.lengths is None:
        return keep
    return np.asarray(proposal.lengths, dtype=bool) & keep


def verify_tree_round(target: Any, proposal: Any, rule: str, branches: int, R: int, rng: np.random.Generator):
    """Verify one round of token trees: ``proposal.outcomes`` int64 ``[R, N+1]`` (the token at each
    node; column 0, the root, is ignored), ``proposal.dists`` a Categorical with batch shape
    ``[R, N+1]`` (the draft distribution each node's children were sampled from), ``proposal.lengths``
    the valid-node mask bool ``[R, N+1]`` or None, ``proposal.tree`` the shape (parent array
    ``[N+1]`` or ``[R, N+1]``, or a :class:`~speculate.verify.Tree` saying whether the children
    were drafted with replacement); ``target`` a Categorical with batch shape ``[R, N+1]`` (p at
    every node's context, in one call). Returns ``(n_accepted [R], next [R], path [R, D], route)``.
    """
    if branches != 1:
        raise ValueError(f"a token tree is one proposal per row: pass branches=1, got {branches} (draft branches "
                         "are the tree with branching only at the root, Tree.chains(m, k))")
    tree = as_tree(proposal.tree)
    if not isinstance(target, Categorical):
        raise ValueError(f"token-tree verification needs a Categorical target, got {type(target).__name__}")
    N1 = np.shape(tree.parent)[-1]
    if target.batch_shape != (R, N1):
        raise ValueError(f"target must score the {N1} nodes of each row's tree in one call: batch shape "
                         f"{(R, N1)}, got {target.batch_shape}")
    tokens = np.asarray(proposal.outcomes)
    if tokens.shape != (R, N1):
        raise ValueError(
            f"tree proposals need outcomes [R, N+1] = {(R, N1)} (the token at each node), got {tokens.shape}"
        )
    if rule == "greedy":
        n, nxt, path = verify_tree_greedy(target.probs, tokens, tree.parent, proposal.lengths, validate=False)
        return n, nxt, path, "tree_greedy"
    if rule != "token":
        raise ValueError(
            f"token trees are verified with verify='token' (recursive rejection) or 'greedy', got {rule!r}"
        )
    dists = proposal.dists
    if not isinstance(dists, Categorical):
        raise ValueError("a token tree verified with verify='token' needs the Categorical each node's children were "
                         f"sampled from (batch shape {(R, N1)}), got {type(dists).__name__}")
    if dists.num_outcomes != target.num_outcomes:
        raise ValueError(
            f"vocabulary mismatch: target has {target.num_outcomes} outcomes, draft has {dists.num_outcomes}"
        )
    if dists.batch_shape != (R, N1):
        raise ValueError(f"draft distributions of a tree must have batch shape {(R, N1)}, got {dists.batch_shape}")
    n, nxt, path = verify_tree(target.probs, dists.probs, tokens, tree.parent, proposal.lengths,
                               rng.random((R, N1)), rng.random(R), replacement=bool(tree.replacement),
                               validate=False, check_uniforms=False)
    return n, nxt, path, "tree"
