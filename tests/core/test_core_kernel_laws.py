"""Exact output laws of every verification kernel, and of Categorical.sample, at vocabularies that
span several blocks of the blocked inverse-CDF search (``speculate._inverse_cdf.BLOCK`` = 256).

Each kernel is evaluated on every piece of its uniforms' space, cut at the rule's rational
breakpoints (the centre of each piece and 1e-9 inside both ends of each coordinate's piece, as
``speculate.testing.exact.kernel_law`` does; a kernel that is not constant on a piece fails), and
the law it produces is compared, in Fractions, with the MATHEMATICS of its rule: written out below
per fixed draft (token, block, multi-draft, greedy) or taken from ``speculate.testing.exact.rules``
(whole rounds and chains of rounds, through ``kernel_round_law``). Never with the kernels' NumPy
twins, which walk the same blocks and would pass a shared mistake; the twins are held to the same
exact laws. Every probability is dyadic (a multiple of 1/64), so the float64 and float32 values
the kernels see are the Fractions exactly; rows are kept sparse here so that V = 600 is cheap.

The mass sits on the first and last index of every block (0, 255, 256, 511, 512) and on the last
index V - 1, in the bonus rows, in the residual rows, and in the rows Categorical.sample draws
from; the tests assert this coverage, so they cannot silently stop looking at a boundary. The
rarely taken paths are stressed: the residual after deep acceptance, block verification's every
tau, greedy ties across blocks, multi-draft branches that agree, diverge or run out of drafts, and
rows with different models and lengths in one batched call. Equal-scale Gaussian verification,
whose law is continuous, is checked by quadrature to 1e-9.

These checks are exact, not statistical: no significance level applies.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from fractions import Fraction as F

import numpy as np
import pytest
from scipy import stats
from scipy.special import roots_hermitenorm, roots_legendre

from speculate import Categorical
from speculate._inverse_cdf import BLOCK, draw_row_np, draw_rows
from speculate.testing.exact import (
    assert_exact_law,
    block_quantities,
    chain_joint_law,
    kernel_law,
    kernel_round_law,
    round_law,
    target_joint_law,
)
from speculate.verify import (
    verify_block,
    verify_block_reference,
    verify_gaussian,
    verify_gaussian_reference,
    verify_greedy,
    verify_greedy_reference,
    verify_multi,
    verify_multi_reference,
    verify_token,
    verify_token_reference,
)
from speculate.verify.device import (
    verify_block_device,
    verify_greedy_device,
    verify_multi_device,
    verify_token_device,
)

V = 600  # blocks [0, 256), [256, 512), [512, 600): two full blocks and a partial one
EDGES = (0, BLOCK - 1, BLOCK, 2 * BLOCK - 1, 2 * BLOCK, V - 1)  # 0, 255, 256, 511, 512, 599
NEAR = (1, 254, 257, 300, 510, 513, 598)  # neighbours, and one index inside a block
ZERO, ONE = F(0), F(1)
_EPS = 1e-9  # how far inside a piece's ends the kernels are probed (as kernel_law)

Row = dict  # a sparse law {index: Fraction > 0}


def row(pairs, denom: int = 64) -> Row:
    """A sparse law with mass w / denom at j for each (j, w) (repeated indices add up)."""
    out: Row = defaultdict(F)
    for j, w in pairs:
        out[j] += F(w, denom)
    assert sum(out.values()) == 1
    return dict(sorted(out.items()))


def random_row(rng: np.random.Generator, support, size: int | None = None) -> Row:
    """A dyadic law (multiples of 1/64) on a random subset of ``support``."""
    size = min(size or int(rng.integers(2, 6)), len(support))
    idx = rng.choice(np.array(support), size=size, replace=False)
    cuts = np.sort(rng.choice(np.arange(1, 64), size=size - 1, replace=False))
    w = np.diff(np.concatenate(([0], cuts, [64])))
    return row(zip(idx.tolist(), w.tolist(), strict=True))


def dense(r: Row, n: int = V) -> list[F]:
    out = [ZERO] * n
    for j, x in r.items():
        out[j] = x
    return out


def residual(p: Row, q: Row, scale: F = ONE) -> Row:
    """norm((scale p - q)_+), sparse."""
    w = {j: scale * x - q.get(j, ZERO) for j, x in p.items()}
    w = {j: x for j, x in w.items() if x > 0}
    total = sum(w.values(), ZERO)
    assert total > 0
    return {j: x / total for j, x in w.items()}


def cdf_breaks(r: Row) -> set[F]:
    return set(itertools.accumulate(r[j] for j in sorted(r)))


# ------------------------------------------------------------------------ the rules' laws, per draft
# Each returns (law, coords): the law of the kernel's output and, per uniform coordinate in the
# kernel's order (u_accept then u_next), the rational breakpoints where the output may change.
def token_law(p_rows, q_rows, drafts, L):
    """Token verification of the FIXED drafts x_1..x_L: {(n_accepted, next): probability}."""
    K = len(q_rows)
    law: dict = defaultdict(F)
    coords = [set() for _ in range(K + 1)]
    w = ONE
    for i in range(L):
        x = drafts[i]
        a = min(ONE, p_rows[i].get(x, ZERO) / q_rows[i][x])
        coords[i].add(a)
        if a < 1:
            r = residual(p_rows[i], q_rows[i])
            coords[K] |= cdf_breaks(r)
            for y, ry in r.items():
                law[(i, y)] += w * (1 - a) * ry
        w *= a
        if not w:
            return dict(law), coords
    coords[K] |= cdf_breaks(p_rows[L])
    for y, py in p_rows[L].items():
        law[(L, y)] += w * py
    return dict(law), coords


def sparse_block_quantities(p_rows, q_rows, drafts):
    """(P, h) of block verification (proofs/07), on sparse rows."""
    g = len(drafts)
    P = [ONE]
    for i, x in enumerate(drafts):
        P.append(min(P[-1] * p_rows[i].get(x, ZERO) / q_rows[i][x], ONE))
    h = []
    for i in range(1, g + 1):
        if i == g:
            h.append(P[g])
        elif P[i] == 1:
            h.append(ONE)
        else:
            R = sum((max(P[i] * a - q_rows[i].get(j, ZERO), ZERO) for j, a in p_rows[i].items()), ZERO)
            h.append(R / (R + 1 - P[i]))
    return P, h


def block_law(p_rows, q_rows, drafts, L):
    """Block verification (Sun et al.) of the FIXED drafts: tau = the last i with U_i < h_i."""
    K = len(q_rows)
    P, h = sparse_block_quantities(p_rows, q_rows, drafts[:L])
    law: dict = defaultdict(F)
    coords = [({h[i]} if i < L else set()) for i in range(K)] + [set()]
    for tau in range(L + 1):
        w = ONE if tau == 0 else h[tau - 1]
        for j in range(tau + 1, L + 1):
            w *= 1 - h[j - 1]
        if not w:
            continue
        nxt = p_rows[L] if tau == L else residual(p_rows[tau], q_rows[tau], P[tau])
        coords[K] |= cdf_breaks(nxt)
        for y, py in nxt.items():
            law[(tau, y)] += w * py
    return dict(law), coords


def multi_law(p, q, drafts, lengths):
    """Recursive rejection over m branches with FIXED drafts: {(n, next, branch): probability},
    branch = the first branch that agrees with the kept prefix (p [m][K+1] rows, q [m][K])."""
    m, K = len(drafts), len(q[0])
    law: dict = defaultdict(F)
    coords = [set() for _ in range(K * m + 1)]

    def depth(acc, alive, w):
        d = len(acc)
        j0 = alive[0]
        cur = p[j0][d]
        for j in alive:
            if lengths[j] <= d:
                continue
            x, qq = drafts[j][d], q[j][d]
            a = min(ONE, cur.get(x, ZERO) / qq[x])
            coords[d * m + j].add(a)
            if a:
                depth((*acc, x), [jj for jj in alive if lengths[jj] > d and drafts[jj][d] == x], w * a)
            w *= 1 - a
            if not w:
                return
            cur = residual(cur, qq)
        coords[K * m] |= cdf_breaks(cur)
        for y, py in cur.items():
            law[(d, y, j0)] += w * py

    depth((), list(range(m)), ONE)
    return dict(law), coords


# ------------------------------------------------------------------------ the kernels' laws, enumerated
_DENSE: dict = {}


def _dense_float(r: Row, dtype) -> np.ndarray:
    key = (id(r), np.dtype(dtype).str)
    if key not in _DENSE:
        a = np.zeros(V, dtype)
        a[list(r)] = [float(x) for x in r.values()]
        _DENSE[key] = (r, a)  # keep r alive: its id stays unique
    return _DENSE[key][1]


def _probes(coords):
    """(cell index tuples, piece lengths, probe matrix [cells * E, n_coords]) for one case."""
    pieces = [list(itertools.pairwise(sorted({ZERO, ONE} | {b for b in c if 0 < b < 1}))) for c in coords]
    cells = list(itertools.product(*[range(len(pc)) for pc in pieces]))
    mid = np.array([[float((pieces[c][k][0] + pieces[c][k][1]) / 2) for c, k in enumerate(cell)] for cell in cells])
    evals = [mid]
    for c in range(len(coords)):
        for end in (0, 1):
            u = mid.copy()
            for ci, cell in enumerate(cells):
                lo, hi = (float(x) for x in pieces[c][cell[c]])
                u[ci, c] = lo + _EPS * (hi - lo) if end == 0 else hi - _EPS * (hi - lo)
            evals.append(u)
    lengths = [[b - a for a, b in pc] for pc in pieces]
    return cells, lengths, np.stack(evals, axis=1).reshape(-1, len(coords))


def enumerated_laws(kernel, kind, cases, dtype=np.float64, max_rows=4096):
    """[(kernel's exact law, rule's exact law)] per case; kind "token", "block" or "multi".

    Cases: (p rows, q rows, drafts, lengths) with sparse rows (multi: [m][K+1], [m][K], [m][K], [m]).
    All cases run through ONE sequence of batched kernel calls: rows with different models in a batch."""
    rule = {"token": token_law, "block": block_law, "multi": multi_law}[kind]
    wants, metas, arrays, U_parts, owner = [], [], [], [], []
    for ci, (p, q, drafts, lengths) in enumerate(cases):
        want, coords = rule(p, q, drafts, lengths)
        cells, lens, U = _probes(coords)
        wants.append(want)
        metas.append((cells, lens, len(U) // len(cells)))
        U_parts.append(U)
        owner.append(np.full(len(U), ci))
        if kind == "multi":
            arrays.append(
                (
                    np.stack([[_dense_float(r, dtype) for r in br] for br in p]),
                    np.stack([[_dense_float(r, dtype) for r in br] for br in q]),
                    np.array(drafts, np.int64),
                    np.array(lengths, np.int64),
                )
            )
        else:
            arrays.append(
                (
                    np.stack([_dense_float(r, dtype) for r in p]),
                    np.stack([_dense_float(r, dtype) for r in q]),
                    np.array(drafts, np.int64),
                    np.int64(lengths),
                )
            )
    P, Q, D, L = (np.stack([a[i] for a in arrays]) for i in range(4))
    U, who = np.concatenate(U_parts), np.concatenate(owner)
    outs = []
    for s in range(0, len(U), max_rows):
        w, u = who[s : s + max_rows], U[s : s + max_rows]
        if kind == "multi":
            K, m = D.shape[2], D.shape[1]
            u_acc = np.ascontiguousarray(u[:, :-1].reshape(-1, K, m))
            n, y, br = kernel(P[w], Q[w], D[w], L[w], u_acc, u[:, -1].copy())
            outs.append(np.stack([n, y, br], 1))
        else:
            n, y = kernel(P[w], Q[w], D[w], L[w], np.ascontiguousarray(u[:, :-1]), u[:, -1].copy())
            outs.append(np.stack([n, y], 1))
    out = np.concatenate(outs)
    results, pos = [], 0
    for ci, ((cells, lens, E), want) in enumerate(zip(metas, wants, strict=True)):
        block = out[pos : pos + len(cells) * E].reshape(len(cells), E, -1)
        pos += len(cells) * E
        bad = np.flatnonzero((block != block[:, :1]).any(axis=(1, 2)))
        assert not len(bad), f"case {ci}: the kernel's output changes inside a piece of its uniforms' space"
        law: dict = defaultdict(F)
        for cell, res in zip(cells, block[:, 0].tolist(), strict=True):
            w = ONE
            for c, k in enumerate(cell):
                w *= lens[c][k]
            law[tuple(res)] += w
        results.append(({k: v for k, v in law.items() if v}, want))
    return results


def _assert_laws(results, label):
    for ci, (got, want) in enumerate(results):
        assert_exact_law(got, want, f"{label}, case {ci}")


# ------------------------------------------------------------------------ token and block
def _token_cases(seed: int, K: int, n_models: int):
    """Every draft sequence each model's q can propose and every length 0..K, for random models
    with mass on the block edges; a padding draft V - 1 past the length, which must not be read."""
    rng = np.random.default_rng(seed)
    support = EDGES + NEAR
    cases = []
    for _ in range(n_models):
        p_rows = [random_row(rng, support) for _ in range(K + 1)]
        q_rows = [random_row(rng, support) for _ in range(K)]
        for L in range(K + 1):
            for xs in itertools.product(*[sorted(q_rows[i]) for i in range(L)]):
                cases.append((p_rows, q_rows, [*xs] + [V - 1] * (K - L), L))
    return cases


def _coverage(cases, rule):
    """Indices with positive mass in some reachable bonus row / residual row."""
    bonus, resid = set(), set()
    for p_rows, q_rows, drafts, L in cases:
        bonus |= set(p_rows[L])
        if rule == "token":
            P = [ONE] * (L + 1)
        else:
            P = sparse_block_quantities(p_rows, q_rows, drafts[:L])[0]
        for i in range(L):
            if rule == "token" and p_rows[i].get(drafts[i], ZERO) >= q_rows[i][drafts[i]]:
                continue  # never rejected at i
            resid |= {j for j, a in p_rows[i].items() if P[i] * a > q_rows[i].get(j, ZERO)}
    return bonus, resid


def test_sparse_block_quantities_are_the_rules():
    """The sparse (P, h) used below are speculate.testing.exact.block_quantities, on 20 cases."""
    for p_rows, q_rows, drafts, L in _token_cases(seed=1, K=2, n_models=2)[:20]:
        want = block_quantities([dense(r) for r in p_rows], [dense(r) for r in q_rows], drafts[:L])
        assert sparse_block_quantities(p_rows, q_rows, drafts[:L]) == want


@pytest.mark.parametrize(
    ("kernel", "rule"),
    [
        (verify_token, "token"),
        (verify_token_reference, "token"),
        (verify_block, "block"),
        (verify_block_reference, "block"),
        (verify_token_device, "token"),  # the tensor rules for accelerators, run on the CPU
        (verify_block_device, "block"),
    ],
)
def test_token_and_block_kernels_exact_per_draft_across_blocks(kernel, rule):
    """K = 2, V = 600, 12 random models with mass on the block edges, every draft sequence and
    every length 0..2, all ~200 cases in the same batched calls: the kernel's law of
    (n_accepted, next) over its uniforms equals the rule's exactly. Catches an inverse-CDF search
    that skips or repeats a boundary index (255, 256, 511, 512, 599) in the bonus or the residual
    draw, and any wrong threshold, tau, scale P_tau or position."""
    cases = _token_cases(seed=1, K=2, n_models=12)
    bonus, resid = _coverage(cases, rule)
    assert set(EDGES) <= bonus and set(EDGES) <= resid  # every boundary is looked at, both ways
    _assert_laws(enumerated_laws(kernel, rule, cases), rule)


@pytest.mark.parametrize("device", [False, True], ids=["numba", "tensor"])
@pytest.mark.parametrize("rule", ["token", "block"])
def test_float32_rows_exact_across_blocks(rule, device):
    """The same laws with float32 probabilities (dyadic: exact in float32), 4 models."""
    kernel = {(False, "token"): verify_token, (False, "block"): verify_block,
              (True, "token"): verify_token_device, (True, "block"): verify_block_device}[device, rule]
    _assert_laws(enumerated_laws(kernel, rule, _token_cases(seed=2, K=2, n_models=4), np.float32), rule)


@pytest.mark.parametrize("device", [False, True], ids=["numba", "tensor"])
@pytest.mark.parametrize("rule", ["token", "block"])
def test_residual_after_deep_acceptance_and_every_tau(rule, device):
    """K = 4 drafts kept with probability 1/2 each (token): the residual at the LAST position
    (reached with probability 1/16) and the bonus are drawn exactly, with the deep residual's mass
    on the block edges; block verification's every tau 0..4 has positive mass. Also through
    speculate.testing.exact.kernel_law (the library's own enumerator)."""
    K = 4
    half = row([(3, 32), (V - 1, 32)])  # q: the drafted outcome 3 has q = 1/2 ...
    p_keep = row([(3, 16), (255, 16), (256, 8), (511, 8), (512, 8), (599, 8)])  # ... and p = 1/4
    p_bonus = row([(255, 8), (256, 8), (511, 16), (512, 16), (599, 16)])
    p_rows, q_rows, drafts = [p_keep] * K + [p_bonus], [half] * K, [3] * K
    kernel = {(False, "token"): verify_token, (False, "block"): verify_block,
              (True, "token"): verify_token_device, (True, "block"): verify_block_device}[device, rule]
    cases = [(p_rows, q_rows, drafts, L) for L in range(K + 1)]
    _assert_laws(enumerated_laws(kernel, rule, cases), rule)
    want = (token_law if rule == "token" else block_law)(p_rows, q_rows, drafts, K)[0]
    assert {n for n, _ in want} == set(range(K + 1))  # every depth reachable
    assert {y for n, y in want if n == K - 1} >= {255, 256, 511, 512}  # deep residual on the edges
    got = kernel_law(kernel, [dense(r) for r in p_rows], [dense(r) for r in q_rows], drafts, rule)
    assert_exact_law(got, want, f"{rule} through kernel_law")


def _edge_chain(V_: int):
    """A target and a draft over V_ outcomes that depend on the last outcome, with mass on the
    block edges and the last index; every position rejects with positive probability."""
    last = V_ - 1
    tables = {
        None: (row([(0, 16), (255, 16), (256, 16), (last, 16)]), row([(0, 32), (256, 16), (300, 16)])),
        0: (row([(255, 24), (511, 24), (last, 16)]), row([(255, 48), (last, 16)])),
        255: (row([(256, 32), (last - 88, 16), (last, 16)]), row([(256, 16), (last, 48)])),
        256: (row([(0, 8), (255, 40), (last, 16)]), row([(0, 32), (255, 32)])),
    }

    def key(s):
        x = s[-1] if s else None
        return x if x in tables else 256  # any other outcome: the last table

    return (lambda s: dense(tables[key(s)][0], V_)), (lambda s: dense(tables[key(s)][1], V_))


@pytest.mark.parametrize(("kernel", "rule"), [(verify_token, "token"), (verify_block, "block"),
                                             (verify_token_device, "token"), (verify_block_device, "block")])
@pytest.mark.parametrize("V_", [V, 2 * BLOCK, V - 1])
def test_joint_law_of_three_outcomes_over_several_rounds(kernel, rule, V_):
    """chain_joint_law chained over rounds of the ACTUAL kernel (kernel_round_law, k = 2, every
    draft enumerated) equals step-by-step target sampling for the first 3 outcomes, at V = 600,
    at V = 512 (the last index is then the end of a full block) and at V = 599 (the last block
    ends in a partial group of 7 of the LANES = 8 accumulators, the last index in lane 6)."""
    T, D = _edge_chain(V_)
    by_last: dict = {}

    def round_fn(s):  # the chains depend on the last outcome only: one kernel law per last outcome
        if s[-1:] not in by_last:
            by_last[s[-1:]] = kernel_round_law(kernel, T, D, V_, 2, rule, prefix=s)
        return by_last[s[-1:]]

    assert_exact_law(chain_joint_law(T, D, V_, 3, 2, rule=round_fn), target_joint_law(T, V_, 3), f"{rule} V={V_}")
    assert_exact_law(by_last[()], round_law(T, D, V_, 2, rule), "one round against the rule")


# ------------------------------------------------------------------------ multi-draft
def _multi_cases(seed: int, m: int, K: int, n_models: int):
    """Drafts on a tree of node laws (branches that share a prefix share rows), every combination
    of first drafts (agreeing and diverging branches), and ragged lengths (odd branches one short)."""
    rng = np.random.default_rng(seed)
    support = EDGES + NEAR
    cases = []
    for _ in range(n_models):
        nodes: dict = {}

        def law(kind, prefix, nodes=nodes):
            if (kind, prefix) not in nodes:
                nodes[(kind, prefix)] = random_row(rng, support if kind == "p" else support[:6], size=3)
            return nodes[(kind, prefix)]

        for xs in itertools.product(sorted(law("q", ())), repeat=m):
            drafts, p, q = [], [], []
            for j in range(m):
                d = [xs[j]]
                while len(d) < K:
                    d.append(min(law("q", tuple(d))))
                drafts.append(d)
                p.append([law("p", tuple(d[:i])) for i in range(K + 1)])
                q.append([law("q", tuple(d[:i])) for i in range(K)])
            for lengths in ([K] * m, [K - (j % 2) for j in range(m)], [0] + [K] * (m - 1)):
                cases.append((p, q, drafts, lengths))
    return cases


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kernel", [verify_multi, verify_multi_reference, verify_multi_device])
def test_multi_draft_exact_per_draft_across_blocks(kernel, dtype):
    """m = 2 branches, K = 2, V = 600, ragged branch lengths (a branch one draft short draws its
    bonus at depth 1; a branch with no drafts): the law of (n, next, branch) equals recursive
    rejection's, the branch naming the first branch that agrees with the kept prefix; float64 and
    float32 rows (dyadic: the same values)."""
    cases = _multi_cases(seed=3, m=2, K=2, n_models=2)
    _assert_laws(enumerated_laws(kernel, "multi", cases, dtype), "multi")


@pytest.mark.parametrize("kernel", [verify_multi, verify_multi_device])
def test_multi_draft_three_branches_across_blocks(kernel):
    """m = 3 branches, K = 1 (the third candidate is tried against a residual of a residual)."""
    _assert_laws(enumerated_laws(kernel, "multi", _multi_cases(seed=4, m=3, K=1, n_models=2)), "multi m=3")


@pytest.mark.parametrize("kernel", [verify_multi, verify_multi_reference, verify_multi_device])
def test_multi_draft_candidate_against_a_residual_of_less_mass(kernel):
    """The second candidate meets a residual whose weights w total Z = 1/8 (kept unnormalised, as
    the kernels keep them): it is kept with probability min(1, w(x) / (Z q(x))) = 4/5, where a rule
    that forgets Z would keep it with probability 1/10; rejected, the residual of that residual
    (mass on 255 and 512). Every pair of drafts from q, with branch 0 full or without drafts."""
    q = row([(3, 24), (599, 40)])
    p = row([(3, 16), (599, 44), (255, 2), (512, 2)])  # rejecting 3: w = (599: 4, 255: 2, 512: 2) / 64
    bonus = row([(0, 32), (511, 32)])
    cases = [([[p, bonus]] * 2, [[q]] * 2, [[a], [b]], L) for a in (3, 599) for b in (3, 599) for L in ([1, 1], [0, 1])]
    _assert_laws(enumerated_laws(kernel, "multi", cases), "multi against a residual")
    law = multi_law(*cases[2])[0]  # drafts (3, 599): 3 rejected (1/3), then 599 kept (4/5)
    assert sum(w for (n, _, br), w in law.items() if (n, br) == (1, 1)) == F(1, 3) * F(4, 5)
    assert {y for (n, y, _) in law if n == 0} == {255, 512}


@pytest.mark.parametrize("kernel", [verify_multi, verify_multi_device])
def test_multi_draft_round_law_across_blocks(kernel):
    """One round of 2 i.i.d. branches (k = 1), every pair of drafts enumerated (kernel_round_law)."""
    T, D = _edge_chain(V)
    assert_exact_law(
        kernel_round_law(kernel, T, D, V, 1, "token", branches=2),
        round_law(T, D, V, 1, "token", branches=2),
        "multi round",
    )


# ------------------------------------------------------------------------ greedy
@pytest.mark.parametrize("kernel", [verify_greedy, verify_greedy_reference, verify_greedy_device])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_greedy_ties_across_blocks(kernel, dtype):
    """Greedy keeps a draft iff it is the FIRST argmax (numpy.argmax) and emits the first argmax:
    ties between 255 and 256, 511 and 599, 0 and 599, a three-way tie, and a lone maximum at the
    last index, with drafts on every index of positive mass (so on each tied index), K = 2, every
    length, all in one batched call."""
    rows = [
        row([(255, 24), (256, 24), (599, 16)]),
        row([(511, 24), (599, 24), (0, 16)]),
        row([(0, 20), (599, 20), (300, 8), (256, 16)]),
        row([(256, 16), (512, 16), (599, 16), (1, 16)]),
        row([(599, 64)]),
    ]
    first_max = [min(j for j, x in r.items() if x == max(r.values())) for r in rows]
    assert first_max == [255, 511, 0, 1, 599]
    cases, want = [], []
    for a, b in itertools.product(range(len(rows)), repeat=2):
        c = (a + b) % len(rows)
        for d0, d1 in itertools.product(sorted(rows[a]), sorted(rows[b])):
            for L in range(3):
                cases.append(([a, b, c], [d0, d1], L))
                best = [first_max[a], first_max[b], first_max[c]]
                n = 0
                while n < L and [d0, d1][n] == best[n]:
                    n += 1
                want.append((n, best[n]))
    p = np.stack([np.stack([_dense_float(rows[i], dtype) for i in idx]) for idx, _, _ in cases])
    n, y = kernel(p, np.array([d for _, d, _ in cases]), np.array([L for _, _, L in cases]))
    assert list(zip(n.tolist(), y.tolist(), strict=True)) == want
    assert {w for w in want if w[0] < 2} and {w for w in want if w[0] == 2}  # rejections and bonuses


# ------------------------------------------------------------------------ Categorical.sample's draw
class _FixedUniforms:
    """A stand-in generator whose random(n) returns given uniforms (Categorical.sample's one call)."""

    def __init__(self, u):
        self.u = np.asarray(u, np.float64)

    def random(self, n):
        assert n == len(self.u)
        return self.u


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n_outcomes", [V, 2 * BLOCK, V + 1, BLOCK + 7, 100_000])
def test_categorical_sample_inverse_cdf_exact(dtype, n_outcomes):
    """Categorical.sample on a batch of rows with different laws, V = 600, 512, 601 and 263 (the
    last block ends in a partial group of lanes) and 100 000 (sparse, with mass on block edges and
    far out): every piece of u, [F(j-) , F(j)) for each outcome j,
    maps to j at its centre and 1e-9 inside both ends, so each outcome has exactly its probability
    (rows with the last index as the only mass, and ties of piece lengths, included). The NumPy
    twin of the draw obeys the same law."""
    Vn = n_outcomes
    ends = sorted({j for j in (0, 255, 256, 511, 512, 599, Vn - 257, Vn - 256, Vn - 1) if 0 <= j < Vn})
    rng = np.random.default_rng(Vn)
    laws = [row([(j, 64 // len(ends)) for j in ends] + [(ends[0], 64 % len(ends))])]
    laws += [random_row(rng, tuple(ends)) for _ in range(5)]
    laws += [row([(Vn - 1, 64)]), row([(255, 32), (Vn - 1, 32)])]
    laws += [row([(255, 63), (256, 1)]), row([(Vn - 2, 1), (Vn - 1, 63)])]
    rows_idx, us, want = [], [], []
    for r, law in enumerate(laws):
        c = ZERO
        for j in sorted(law):
            lo, hi = c, c + law[j]
            c = hi
            for u in (float(lo) + _EPS * float(hi - lo), float((lo + hi) / 2), float(hi) - _EPS * float(hi - lo)):
                rows_idx.append(r)
                us.append(u)
                want.append(j)
    table = np.zeros((len(laws), Vn), dtype)
    for r, law in enumerate(laws):
        table[r, list(law)] = [float(x) for x in law.values()]
    probs = table[rows_idx]
    np.testing.assert_array_equal(Categorical(probs=probs).sample(_FixedUniforms(us)), want)
    idx, status = draw_rows(probs, np.array(us))
    assert status == 0
    np.testing.assert_array_equal(idx, want)
    if Vn <= V:
        np.testing.assert_array_equal([draw_row_np(probs[i], u)[0] for i, u in enumerate(us)], want)


# ------------------------------------------------------------------------ Gaussian reflection by quadrature
def _legendre_normal(cut: float, n: int = 40, lo: float = -13.0, hi: float = 13.0):
    """Nodes and weights (Gauss-Legendre times the standard normal density) on [lo, hi], split at cut."""
    x, w = roots_legendre(n)
    ts, ws = [], []
    for a, b in ((lo, cut), (cut, hi)):
        ts.append((b - a) / 2 * x + (a + b) / 2)
        ws.append((b - a) / 2 * w * stats.norm.pdf(ts[-1]))
    return np.concatenate(ts), np.concatenate(ws)


_FREQS = np.array([[1.0, 0.0], [0.0, 1.0], [0.7, -0.4], [-1.5, 0.3], [2.0, 2.0], [0.1, 0.0], [3.0, -1.0], [0, 2.5]])


@pytest.mark.parametrize("kernel", [verify_gaussian, verify_gaussian_reference])
def test_gaussian_kernel_law_by_quadrature_per_position(kernel):
    """K = 2 positions and D = 2, with a DIFFERENT loc and per-coordinate scale at every position
    (and a third for the bonus), in one call per check: at each position i the kernel keeps x iff
    u < p_i(x)/q_i(x) (probed 1e-9 either side), and E exp(i w.(Y - m_p)/s) of the outcome the
    round emits there (x if kept, else the kernel's reflection) over x ~ q_i and u equals the
    target's characteristic function exp(-|w|^2/2) within 1e-9 at 8 frequencies w (quadrature in
    the frame of e = (m_p - m_q)/s, split at the kink t = |e|/2; the quadrature itself is exact to
    1e-11 on these integrands). The bonus after L = 1 and 2 kept drafts likewise. Deltas 1e-3
    (reflection almost never) to 6 (almost always). A kernel that used another position's loc or
    scale, or reflected wrongly, is off by far more than 1e-9."""
    K, D = 2, 2
    r, wr = roots_hermitenorm(24)
    wr = wr / np.sqrt(2 * np.pi)
    for delta in (1e-3, 0.4, 1.7, 6.0):
        rng = np.random.default_rng(int(delta * 1000))
        loc_q = rng.normal(size=(K, D))
        scale = rng.uniform(0.3, 3.0, size=(K + 1, D))
        dirs = rng.normal(size=(K, D))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        loc_p = np.concatenate([loc_q + delta * dirs * scale[:K], rng.normal(size=(1, D))])
        for i in range(K):
            e = (loc_p[i] - loc_q[i]) / scale[i]
            d = float(np.linalg.norm(e))
            eh, ep = e / d, np.array([-e[1], e[0]]) / d
            t, wt = _legendre_normal(d / 2)
            T, R = (a.ravel() for a in np.meshgrid(t, r, indexing="ij"))
            W = np.outer(wt, wr).ravel()
            zz = T[:, None] * eh + R[:, None] * ep  # whitened drafts, N(0, I) under q_i
            acc = np.minimum(1.0, np.exp(T * d - d * d / 2))  # p_i / q_i
            N = len(zz)
            x = np.tile(loc_q[None], (N, 1, 1))  # earlier positions: drafts at the draft mean, kept (u = 0)
            x[:, i] = loc_q[i] + scale[i] * zz
            lp, lq, sc = (np.broadcast_to(a, (N, *a.shape)) for a in (loc_p, loc_q, scale))
            u = np.zeros((N, K))
            inner = acc < 1 - 1e-6
            for factor, want_n in ((1 - 1e-9, i + 1), (1 + 1e-9, i)):
                u[:, i] = np.minimum(acc * factor, 1 - 1e-16)
                n, _ = kernel(lp, lq, sc, x, np.full(N, i + 1), u, np.zeros((N, D)))
                assert np.all(n[inner if want_n == i else slice(None)] == want_n), (delta, i, want_n)
            u[:, i] = 1 - 1e-16  # rejected wherever acc < 1: the output is the reflection
            n, y = kernel(lp, lq, sc, x, np.full(N, i + 1), u, np.zeros((N, D)))
            assert np.all(n[inner] == i)
            wy = (y - loc_p[i]) / scale[i]
            wx = zz - e  # the kept draft, whitened around the target mean
            for w in _FREQS:
                got = np.sum(W * (acc * np.exp(1j * wx @ w) + (1 - acc) * np.exp(1j * wy @ w)))
                assert abs(got - np.exp(-w @ w / 2)) < 1e-9, (delta, i, w)
        z, wz = roots_hermitenorm(30)
        wz = wz / np.sqrt(2 * np.pi)
        Z = np.stack(np.meshgrid(z, z, indexing="ij"), -1).reshape(-1, D)
        WZ = np.outer(wz, wz).ravel()
        N = len(Z)
        lp, lq, sc = (np.broadcast_to(a, (N, *a.shape)) for a in (loc_p, loc_q, scale))
        for L in (1, 2):  # the bonus m_p[L] + s[L] z after L kept drafts (drafts at the target means)
            n, y = kernel(lp, lq, sc, np.broadcast_to(loc_p[:K], (N, K, D)), np.full(N, L), np.zeros((N, K)), Z)
            assert np.all(n == L)
            wy = (y - loc_p[L]) / scale[L]
            for w in _FREQS:
                assert abs(np.sum(WZ * np.exp(1j * wy @ w)) - np.exp(-w @ w / 2)) < 1e-9, (L, w)
