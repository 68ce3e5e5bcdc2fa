"""The tensor verification rules (speculate/verify/device.py) beside the Numba kernels.

Their exact laws are tested with the Numba kernels' enumerator in test_core_kernel_laws.py. Here:
on random (non-dyadic) batches they give the Numba kernels' outcomes (they differ only in the
floating-point order of a sum, which moves a threshold by a rounding error: no disagreement is
expected in a few thousand rows); bad rows are flagged where, and only where, the Numba kernels
raise; half-precision inputs give the Numba kernels' outcomes on the same values; a round through
``verify_round`` with a ``DeviceCategorical`` target is the CPU route's round, uniform for uniform.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speculate import Categorical, Proposal
from speculate._inverse_cdf import tiny_for
from speculate.verify import multi, verify_block, verify_greedy, verify_multi, verify_round, verify_token
from speculate.verify.device import (
    DeviceCategorical,
    block_device,
    draw,
    greedy_device,
    multi_device,
    token_device,
    verify_block_device,
    verify_greedy_device,
    verify_multi_device,
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_tensor_rules_on_cuda_give_the_numba_kernels_outcomes(dtype):
    """The same random batches as above with every tensor on the GPU: in float64 token, block and
    multi-draft give the kernels' outcomes row for row (the rules' arithmetic on the device that runs
    them); in float32 (reductions in another order than the kernels') every row is still valid."""
    dev = torch.device("cuda")
    for rule, fn in (("token", token_device), ("block", block_device)):
        p, q, drafts, lengths, ua, un = _batch(seed=1 if rule == "token" else 2)
        want = NUMBA[rule](p.astype(np.float64), q.astype(np.float64), drafts, lengths, ua, un)
        t = [torch.as_tensor(a, device=dev) for a in (p, q)]
        n, nxt, ok = fn(t[0].to(dtype), t[1].to(dtype), torch.as_tensor(drafts, device=dev),
                        torch.as_tensor(lengths, device=dev), torch.as_tensor(ua, device=dev),
                        torch.as_tensor(un, device=dev))
        if dtype == torch.float64:
            assert np.array_equal(n.cpu().numpy(), want[0]) and np.array_equal(nxt.cpu().numpy(), want[1]), rule
        assert bool(ok.all())
    p, q, drafts, lengths, ua, un = _multi_batch(seed=24, m=2, K=4)
    want = verify_multi(p, q, drafts, lengths, ua, un)
    pt, qt = (torch.as_tensor(a, device=dev).to(dtype) for a in (p, q))
    got = multi_device(pt, qt, *(torch.as_tensor(a, device=dev) for a in (drafts, lengths, ua, un)))
    if dtype == torch.float64:
        assert all(np.array_equal(g.cpu().numpy(), w) for g, w in zip(got[:3], want, strict=True))
    assert bool(got[3].all())


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
    """NaN in a row the rule reads, a drafted outcome with q = 0, a row without mass, +inf q or -inf p
    in a residual the rule draws from: both paths refuse; NaN in a position the rule never reads
    (token: past the first rejection): neither."""
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
    f = q.copy()
    f[0, 0, 3] = np.inf  # draft 0 rejected: the residual max(p - q, 0) at 3 is max(-inf, 0), not finite
    cases.append(((p, f, [[0, 1]], None, [[0.99, 0.99]], [0.5]), "read"))
    g = p.copy()
    g[0, 0, 3] = -np.inf  # the same through p
    cases.append(((g, q, [[0, 1]], None, [[0.99, 0.99]], [0.5]), "read"))
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


# ------------------------------------------------------------------------ multi-draft
def _multi_batch(seed: int, B: int = 3000, m: int = 2, K: int = 4, V: int = 40, sharp: float = 3.0):
    """Random multi-draft rows: per row a base law, per branch a target near it and a draft near
    that; branch j > 0 shares branch 0's first drafts (and their p and q rows) up to a random depth
    (branches that agree, then diverge), random lengths 0..K per branch (branches that run out);
    some entries zero (sparse rows). Drafts drawn from q."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(B, 1, K + 1, V)) * sharp
    p = np.exp(base + rng.normal(size=(B, m, K + 1, V)) * 0.3)
    q = np.exp(base[:, :, :K] + rng.normal(size=(B, m, K, V)) * 0.7)
    p[rng.random(p.shape) < 0.2] = 0.0
    q[rng.random(q.shape) < 0.2] = 0.0
    q[..., 0] += 1e-3  # every q row has mass
    p[..., 1] += 1e-3
    p /= p.sum(-1, keepdims=True)
    q /= q.sum(-1, keepdims=True)
    c = np.cumsum(q, -1)
    drafts = np.argmax(c > rng.random((B, m, K, 1)) * c[..., -1:], axis=-1)  # [B, m, K], q(x) > 0
    share = rng.integers(0, K + 1, (B, m, 1))
    share[:, 0] = 0
    drafts = np.where(np.arange(K) < share, drafts[:, :1], drafts)
    q = np.where((np.arange(K) < share)[..., None], q[:, :1], q)
    p = np.where((np.arange(K + 1) <= share)[..., None], p[:, :1], p)  # the same context: the same target
    lengths = np.where(rng.random((B, m)) < 0.5, K, rng.integers(0, K + 1, (B, m)))
    return p, q, drafts.astype(np.int64), lengths, rng.random((B, K, m)), rng.random(B)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("m", "K"), [(2, 4), (3, 4), (3, 2)])
def test_multi_draft_random_batches_agree_with_the_numba_kernel(m, K, dtype):
    """(n, next, branch) of the Numba kernel on every row, with every depth 0..K and every branch
    reached (a later branch is returned only where branch 0 diverged or ran out)."""
    p, q, drafts, lengths, ua, un = _multi_batch(seed=10 * m + K, m=m, K=K)
    p, q = p.astype(dtype), q.astype(dtype)
    want = verify_multi(p, q, drafts, lengths, ua, un)
    got = verify_multi_device(p, q, drafts, lengths, ua, un)
    for g, w, what in zip(got, want, ("n", "next", "branch"), strict=True):
        assert np.array_equal(g, w), (what, int(np.flatnonzero(g != w)[0]))
    assert set(want[0].tolist()) == set(range(K + 1)) and set(want[2].tolist()) == set(range(m))


def test_multi_draft_one_branch_is_token_verification():
    """m = 1 is token-wise verification: the tensor token rule's outcomes, branch 0."""
    p, q, drafts, lengths, ua, un = _multi_batch(seed=7, m=1, K=3)
    n, nxt, branch = verify_multi_device(p, q, drafts, lengths, ua, un)
    want = verify_token_device(p[:, 0], q[:, 0], drafts[:, 0], lengths[:, 0], ua[:, :, 0], un)
    assert np.array_equal(n, want[0]) and np.array_equal(nxt, want[1]) and not branch.any()


def test_multi_draft_no_drafts_k0():
    """K = 0: the bonus draw from p at branch 0, as the kernel."""
    p, q, drafts, lengths, ua, un = _multi_batch(seed=8, B=200, m=2, K=0)
    want = verify_multi(p, q, drafts, lengths, ua, un)
    got = verify_multi_device(p, q, drafts, lengths, ua, un)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_multi_draft_half_precision_inputs_give_the_numba_kernels_outcomes(dtype):
    """Multi-draft on half-precision p and q: the Numba kernel's outcomes on the same values."""
    p, q, drafts, lengths, ua, un = _multi_batch(seed=12, B=2000, m=2, K=3)
    ph, qh = torch.from_numpy(p).to(dtype), torch.from_numpy(q).to(dtype)
    n, nxt, branch, ok = multi_device(ph, qh, *(torch.from_numpy(a) for a in (drafts, lengths, ua, un)))
    want = verify_multi(ph.double().numpy(), qh.double().numpy(), drafts, lengths, ua, un)
    assert ok.all()
    assert all(np.array_equal(g.numpy(), w) for g, w in zip((n, nxt, branch), want, strict=True))


def _kernel(p, q, drafts, lengths, ua, un, tiny):
    """The raw Numba kernel (no checks): (n, next, branch, status)."""
    return multi.kernel(p, q, drafts, lengths, ua, un, tiny, False)[:4]


def _tensor(p, q, drafts, lengths, ua, un, tiny=None):
    out = multi_device(*(torch.from_numpy(a) for a in (p, q, drafts, lengths, ua, un)), tiny)
    return tuple(x.numpy() for x in out)


def test_multi_draft_residual_below_tiny_is_not_taken():
    """A residual whose total is <= tiny is rounding (p == q): the residual stays as it was, the
    next candidate is tried against it and the draw is from it. With tiny = 0.3 that path decides
    many rows; the outcomes are the kernel's (which differ from those with the default tiny)."""
    p, q, drafts, lengths, ua, un = _multi_batch(seed=11, m=3, K=3)
    want = _kernel(p, q, drafts, lengths, ua, un, 0.3)
    got = _tensor(p, q, drafts, lengths, ua, un, 0.3)
    assert not want[3].any() and got[3].all()
    assert all(np.array_equal(g, w) for g, w in zip(got[:3], want[:3], strict=True))
    usual = _kernel(p, q, drafts, lengths, ua, un, tiny_for(np.float64))
    assert (usual[1] != want[1]).sum() > 50  # the path is taken


_CORRUPTIONS = ("nan_p", "inf_p", "neg_p", "empty_p", "nan_q", "inf_q", "neg_q", "q_zero", "index", "length")


def _corrupt(seed: int, B: int = 4000, m: int = 2, K: int = 3):
    """``_multi_batch`` rows, each with one bad input of a kind in ``_CORRUPTIONS`` at a random
    branch and position (half the time at the drafted outcome): read by the rule in some rows,
    never read in others."""
    p, q, drafts, lengths, ua, un = _multi_batch(seed, B=B, m=m, K=K)
    rng = np.random.default_rng(seed + 1)
    kinds = rng.integers(0, len(_CORRUPTIONS), B)
    for b, kind in enumerate(kinds):
        name, j, i = _CORRUPTIONS[kind], rng.integers(m), rng.integers(K)
        v = drafts[b, j, i] if rng.random() < 0.5 else rng.integers(p.shape[-1])
        if name.endswith("_p"):
            i = rng.integers(K + 1)
            v = drafts[b, j, i] if i < K and rng.random() < 0.5 else v
        if name == "empty_p":
            p[b, j, i] = 0.0
        elif name.endswith("_p") or name.endswith("_q"):
            a = p if name.endswith("_p") else q
            a[b, j, i, v] = {"nan": np.nan, "inf": np.inf, "neg": -0.2}[name[:3]]
        elif name == "q_zero":
            q[b, j, i, drafts[b, j, i]] = 0.0
        elif name == "index":
            drafts[b, j, i] = rng.choice([-1, p.shape[-1]])
        else:
            lengths[b, j] = rng.choice([-1, K + 1])
    return (p, q, drafts, lengths, ua, un), kinds


def test_multi_draft_bad_rows_are_flagged_where_the_numba_kernel_reports_them():
    """NaN, inf or negative p or q, a row of p without mass, q = 0 at a drafted outcome, a drafted
    outcome outside 0..V-1, a length outside 0..K: ``ok`` is False on exactly the rows where the
    kernel reports a bad status, and each kind is both read (flagged) and not read (not flagged)
    in some rows (bad lengths: always flagged)."""
    args, kinds = _corrupt(seed=20)
    status = _kernel(*args, tiny_for(np.float64))[3]
    n, nxt, branch, ok = _tensor(*args)
    assert np.array_equal(ok, status == 0), int(np.flatnonzero(ok != (status == 0))[0])
    good = status == 0
    for kind, name in enumerate(_CORRUPTIONS):
        rows = kinds == kind
        assert (~good[rows]).any() and (name == "length" or good[rows].any()), name
    want = _kernel(*args, tiny_for(np.float64))
    for g, w in zip((n, nxt, branch), want[:3], strict=True):  # the rows without a bad read: the same outcomes
        assert np.array_equal(g[good], w[good])


def test_multi_draft_bad_rows_raise_where_verify_multi_raises():
    """Row by row (one flagged and one unflagged row of each kind): verify_multi_device raises a
    ValueError exactly where verify_multi does."""
    args, kinds = _corrupt(seed=21, B=1000)
    status = _kernel(*args, tiny_for(np.float64))[3]
    pick = [(kinds == kind) & ((status != 0) == bad) for kind in range(len(_CORRUPTIONS)) for bad in (True, False)]
    rows = [int(np.flatnonzero(rows)[0]) for rows in pick if rows.any()]
    assert len(rows) == 2 * len(_CORRUPTIONS) - 1  # bad lengths are always flagged
    for b in rows:
        one = [a[b : b + 1] for a in args]
        assert _raises(verify_multi_device, *one) == _raises(verify_multi, *one) == (status[b] != 0), b


def _round(target, dists, drafts, lengths, rule, m, k, seed):
    """``verify_round`` on a fresh ``default_rng(seed)``; and the generator's next uniform (so
    that two routes are seen to draw the same number of uniforms)."""
    rng = np.random.default_rng(seed)
    out = verify_round(target, Proposal(drafts, dists, lengths), rule, m, k, len(drafts), rng)
    return out, rng.random()


@pytest.mark.parametrize("dists", ["host", "device", "points"])
@pytest.mark.parametrize("m", [2, 3])
def test_multi_draft_round_on_the_device_is_the_cpu_round(m, dists):
    """A round with m branches and a DeviceCategorical target (route "multi-device") gives the
    CPU route's (n, next, branch) from the same seeded generator, drawing the same uniforms; the
    draft laws as a host Categorical, a DeviceCategorical or point masses (None)."""
    k = 3
    p, q, drafts, lengths, _, _ = _multi_batch(seed=30 + m, B=600, m=m, K=k)
    P, Q = Categorical(p), Categorical(q)
    cpu_q = {"host": Q, "device": Q, "points": None}[dists]
    dev_q = {"host": Q, "device": DeviceCategorical(torch.from_numpy(Q.probs)), "points": None}[dists]
    (cn, cnxt, cbr, croute), cu = _round(P, cpu_q, drafts, lengths, "token", m, k, seed=5)
    (dn, dnxt, dbr, droute), du = _round(DeviceCategorical(torch.from_numpy(P.probs)), dev_q, drafts, lengths,
                                         "token", m, k, seed=5)
    assert (croute, droute) == ("multi", "multi-device") and cu == du
    assert np.array_equal(dn, cn) and np.array_equal(dnxt, cnxt) and np.array_equal(dbr, cbr)
    assert set(cbr.tolist()) == set(range(m)) and set(cn.tolist()) == set(range(k + 1))


@pytest.mark.parametrize("rule", ["token", "block"])
def test_one_branch_round_on_the_device_is_the_cpu_round(rule):
    """m = 1: the device route draws u_next and u_accept in one call, the CPU route in two; the
    same uniforms, so the same (n, next) and the generator left in the same state."""
    k = 4
    p, q, drafts, lengths, _, _ = _batch(seed=40, B=600, K=k)
    P, Q = Categorical(p), Categorical(q)
    (cn, cnxt, _, _), cu = _round(P, Q, drafts, lengths, rule, 1, k, seed=6)
    (dn, dnxt, dbr, route), du = _round(DeviceCategorical(torch.from_numpy(P.probs)), Q, drafts, lengths,
                                        rule, 1, k, seed=6)
    assert route == f"{rule}-device" and cu == du and not dbr.any()
    assert np.array_equal(dn, cn) and np.array_equal(dnxt, cnxt)


@pytest.mark.parametrize("rule", ["block", "greedy"])
def test_multi_draft_round_on_the_device_takes_the_token_rule(rule):
    """block or greedy with branches = 2: the CPU route's error, word for word."""
    p, q, drafts, lengths, _, _ = _multi_batch(seed=50, B=10, m=2, K=2)
    P, Q = Categorical(p), Categorical(q)
    with pytest.raises(ValueError) as cpu:
        _round(P, Q, drafts, lengths, rule, 2, 2, seed=0)
    with pytest.raises(ValueError) as dev:
        _round(DeviceCategorical(torch.from_numpy(P.probs)), Q, drafts, lengths, rule, 2, 2, seed=0)
    assert str(dev.value) == str(cpu.value)


@pytest.mark.parametrize("m", [1, 2])
def test_a_bad_drafted_outcome_the_rule_never_reads_is_the_cpu_routes_to_judge(m):
    """A drafted outcome outside 0..V-1 after a certain rejection (q puts all its mass on a token p
    gives none): the CPU route never reads it and returns, so the device route returns the same
    (n, next, branch) from the same generator; with point-mass drafts both refuse it first."""
    k = 2  # V = 4 outcomes
    p = np.tile(np.array([0.0, 0.5, 0.5, 0.0]), (1, m, k + 1, 1))  # [1, m, k+1, V]
    q = np.tile(np.array([1.0, 0.0, 0.0, 0.0]), (1, m, k, 1))  # draft 0 at depth 0: p/q = 0, rejected
    q[..., 1, :] = 0.25
    drafts = np.tile(np.array([0, 7]), (1, m, 1))
    lengths = np.full((1, m), k)
    if m == 1:
        p, q, drafts, lengths = p[:, 0], q[:, 0], drafts[:, 0], lengths[:, 0]
    P, Q = Categorical(p), Categorical(q)
    dev_p = DeviceCategorical(torch.from_numpy(p))
    for seed in range(4):
        (cn, cnxt, cbr, _), cu = _round(P, Q, drafts, lengths, "token", m, k, seed)
        for dists in (Q, DeviceCategorical(torch.from_numpy(q))):
            (dn, dnxt, dbr, _), du = _round(dev_p, dists, drafts, lengths, "token", m, k, seed)
            assert (dn.tolist(), dnxt.tolist(), dbr.tolist(), du) == (cn.tolist(), cnxt.tolist(), cbr.tolist(), cu)
        assert cn.tolist() == [0] and cnxt[0] in (1, 2)
    for target in (P, dev_p):
        with pytest.raises(ValueError, match=r"drafted outcome outside 0\.\.3"):
            _round(target, None, drafts, lengths, "token", m, k, seed=0)
