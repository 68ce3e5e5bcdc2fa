"""The tensor verification rules (speculate/verify/device.py) beside the Numba kernels.

Their exact laws are tested with the Numba kernels' enumerator in test_core_kernel_laws.py. Here:
on random (non-dyadic) batches they give the Numba kernels' outcomes (they differ only in the
floating-point order of a draw's running sum, which moves a threshold by a rounding error: no
disagreement is expected in a few thousand rows); bad rows are flagged where, and only where, the
Numba kernels raise; half-precision inputs give the Numba kernels' outcomes on the same values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speculate.verify import verify_block, verify_greedy, verify_token
from speculate.verify.device import (
    block_device,
    draw,
    greedy_device,
    token_device,
    verify_block_device,
    verify_greedy_device,
    verify_token_device,
)

NUMBA = {"token": verify_token, "block": verify_block}
TENSOR = {"token": verify_token_device, "block": verify_block_device}


def _batch(seed: int, B: int = 3000, K: int = 4, V: int = 50, sharp: float = 3.0):
    """Random rows whose draft is close to the target (so that every depth is reached), drafts drawn
    from q, random lengths and uniforms; some rows sparse (zeros in p and q)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(B, K + 1, V)) * sharp
    p = np.exp(logits)
    q = np.exp(logits[:, :K] + rng.normal(size=(B, K, V)) * 0.7)
    p[rng.random(p.shape) < 0.2] = 0.0
    q[rng.random(q.shape) < 0.2] = 0.0
    q[:, :, 0] += 1e-3  # every q row has mass
    p[:, :, 1] += 1e-3
    p /= p.sum(-1, keepdims=True)
    q /= q.sum(-1, keepdims=True)
    drafts = np.stack([[rng.choice(V, p=q[b, i]) for i in range(K)] for b in range(B)])
    lengths = rng.integers(0, K + 1, B)
    return p, q, drafts, lengths, rng.random((B, K)), rng.random(B)


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_random_batches_agree_with_the_numba_kernels(rule, dtype):
    p, q, drafts, lengths, ua, un = _batch(seed=1 if rule == "token" else 2)
    p, q = p.astype(dtype), q.astype(dtype)
    want = NUMBA[rule](p, q, drafts, lengths, ua, un)
    got = TENSOR[rule](p, q, drafts, lengths, ua, un)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert set(want[0].tolist()) == set(range(5))  # every depth, so every path is compared


@pytest.mark.parametrize("rule", ["token", "block"])
def test_no_drafts_k0(rule):
    """K = 0 (a round that only draws the next outcome): the bonus draw from p, as the kernels."""
    p, _, _, _, _, un = _batch(seed=6, B=100, K=0)
    args = (p, np.zeros((100, 0, p.shape[-1])), np.zeros((100, 0), np.int64), None, np.zeros((100, 0)), un)
    want, got = NUMBA[rule](*args), TENSOR[rule](*args)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_greedy_agrees_with_the_numba_kernel():
    p, _, _, lengths, _, _ = _batch(seed=3)
    top = p.argmax(-1)
    rng = np.random.default_rng(4)
    drafts = np.where(rng.random(top[:, :4].shape) < 0.7, top[:, :4], rng.integers(0, 50, top[:, :4].shape))
    want = verify_greedy(p, drafts, lengths)
    got = verify_greedy_device(p, drafts, lengths)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def _raises(fn, *args) -> bool:
    try:
        fn(*args)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("rule", ["token", "block", "greedy"])
def test_bad_rows_are_flagged_where_the_numba_kernels_raise(rule):
    """NaN in a row the rule reads, a drafted outcome with q = 0, a row without mass: both paths
    refuse; NaN in a position the rule never reads (token: past the first rejection): neither."""
    p = np.full((1, 3, 4), 0.25)
    q = np.full((1, 2, 4), 0.25)
    q[0, 0] = [0.7, 0.1, 0.1, 0.1]
    cases = []
    a = p.copy()
    a[0, 1, 1] = np.nan  # the drafted entry at position 1, read once draft 0 is kept (0.1 * 0.7 < 0.25)
    cases.append(((a, q, [[0, 1]], None, [[0.1, 0.1]], [0.5]), "read"))
    b = q.copy()
    b[0, 0] = [0.0, 0.5, 0.25, 0.25]  # draft 0 has q = 0
    cases.append(((p, b, [[0, 1]], None, [[0.1, 0.1]], [0.5]), "read"))
    c = p.copy()
    c[0, 2] = np.nan  # the bonus row: token never reads it after a rejection at position 0
    cases.append(((c, q, [[0, 1]], None, [[0.99, 0.1]], [0.5]), "token-unread"))
    d = q.copy()
    d[0, 1, 3] = np.nan  # q at position 1 (not drafted): with L = 1 the bonus is drawn from p, q unread
    cases.append(((p, d, [[0, 1]], [1], [[0.1, 0.1]], [0.5]), "unread"))
    e = q.copy()
    e[0, 0] = [1.2, -0.2, 0.0, 0.0]  # residual (0, .45, .25, .25): u = 0.1 lands on 1, where q < 0
    cases.append(((p, e, [[0, 1]], None, [[0.99, 0.99]], [0.1]), "read"))
    for args, what in cases:
        if rule == "greedy":  # argmax of every row is 0: draft 0 kept, so row 1 is read; draft 3 is not
            gp = args[0]
            for gd, read in ((np.array([[0, 1]]), True), (np.array([[3, 1]]), False)):
                want = _raises(verify_greedy, gp, gd)
                assert _raises(verify_greedy_device, gp, gd) == want, (what, gd.tolist())
                if what == "read" and read and np.isnan(gp).any():
                    assert want  # NaN in a row greedy reads (q is not read by greedy): both refuse
            continue
        want = _raises(NUMBA[rule], *args)
        assert _raises(TENSOR[rule], *args) == want, (rule, what)
        if what == "read":
            assert want
        if (what == "token-unread" and rule == "token") or what == "unread":
            assert not want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_give_the_numba_kernels_outcomes(dtype):
    """Half-precision p and q: the outcomes of the Numba kernels on the same values (which compute in
    float64, with float64's rounding threshold: a half type's own would be 2^-5 for bfloat16 and
    treat that much residual mass as rounding)."""
    p, q, drafts, lengths, ua, un = _batch(seed=5, B=2000)
    ph, qh = torch.from_numpy(p).to(dtype), torch.from_numpy(q).to(dtype)
    t = [torch.from_numpy(x) for x in (drafts, lengths, ua, un)]
    for rule, fn in (("token", token_device), ("block", block_device)):
        n, nxt, ok = fn(ph, qh, *t)
        want = NUMBA[rule](ph.double().numpy(), qh.double().numpy(), drafts, lengths, ua, un)
        assert ok.all() and np.array_equal(n.numpy(), want[0]) and np.array_equal(nxt.numpy(), want[1]), rule
    n, nxt, ok = greedy_device(ph, t[0], t[1])
    want = verify_greedy(ph.double().numpy(), drafts, lengths)
    assert ok.all() and np.array_equal(n.numpy(), want[0]) and np.array_equal(nxt.numpy(), want[1])


def test_residual_mass_of_a_few_percent_is_not_rounding():
    """bfloat16 p = (.5, .5), q = (.52, .48): the residual (0, .02) after a rejection of outcome 0
    must give outcome 1 (the Numba kernels' answer), not a draw from p."""
    p = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]], dtype=torch.bfloat16)
    q = torch.tensor([[[0.52, 0.48]]], dtype=torch.bfloat16)
    args = (torch.tensor([[0]]), None, torch.tensor([[0.99]]), torch.tensor([0.1]))
    for fn in (token_device, block_device):
        assert fn(p, q, *args)[1].tolist() == [1]


def test_draw_never_returns_an_outcome_without_mass():
    w = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 4, dtype=torch.float64)
    u = torch.tensor([0.0, 0.5 - 1e-12, 0.5, 1.0 - 1e-16], dtype=torch.float64)
    assert draw(w, u).tolist() == [1, 1, 3, 3]
