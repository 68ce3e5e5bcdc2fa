"""Exactness of speculative rollouts against the exact joint law (slippery FrozenLake).

Rows of one batch alternate between two configurations (two maps, two policy/draft pairs; see
speculate.domains.rl.conformance): the policies take one or two of the four actions per state, the
drafts propose the others (always rejected) and miss some of the policies' (only the residual
produces them), alpha is about 0.6, and the environment is random (each move slips with
probability 2/3). The outcome of an episode is its configuration and its first three (action,
observation) pairs ``(c, o_0, a_1, o_1, a_2, o_2, a_3, o_3)`` (shorter when it ends), over several
rounds; its law is computed exactly from the policies and ``env.unwrapped.P`` and compared with a
chi-square test (``speculate.testing``).

The token (k=1) and block (k=2) cases run in the default suite through the shared conformance suite
(tests/core/test_core_conformance.py); this file states their power and adds automatic lookahead
(default) and longer lookaheads on 4x4 and 8x8 maps (slow).

Calibration: each test has level ``speculate.testing.DEFAULT_ALPHA`` (1e-6) (one check per test).
Power: every test asserts, with ``ConformanceCase.detectable_tv`` (``chi2_sample_size`` over all the
cells of the law), the total-variation deviation it catches with probability 0.99: 0.02 in the
default run, 0.01 under the ``slow`` marker.
"""

from __future__ import annotations

import numpy as np
import pytest
from speculate.domains.rl.conformance import (
    N_CASE,
    Config,
    conformance_cases,
    default_configs,
    mixed_law,
    sample_mixed,
    sparse_pair,
)
from speculate.domains.rl.trajectory_law import trajectory_law

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import ConformanceCase, check_conformance


def _case(name: str, configs, n: int, tv: float, **kw) -> ConformanceCase:
    law = mixed_law(configs, steps=3)
    case = ConformanceCase(name, lambda n, seed: sample_mixed(configs, n, steps=3, rng=seed, **kw), law, n=n)
    assert case.detectable_tv(alpha=ALPHA) <= tv, f"{name}: {n} samples cannot detect TV {tv}"
    return case


def test_conformance_cases_catch_tv_002() -> None:
    """The shared suite's RL cases (token k=1, block k=2) catch TV 0.02 with power 0.99 at ALPHA."""
    cases = conformance_cases()
    assert len(cases) == 2 and all(c.n == N_CASE for c in cases)
    for c in cases:
        assert c.detectable_tv(alpha=ALPHA) <= 0.02, c.name
        assert abs(sum(c.law.values()) - 1) < 1e-12


def test_inputs_matter() -> None:
    """The configurations exercise what can go wrong: their laws differ (TV > 0.1, so mixing up rows
    would be caught), drafts are rejected often, propose actions the policy never takes and miss
    actions it takes, and some episodes end within the three steps (inside a drafted block)."""
    a, b = default_configs()
    la = trajectory_law(a.make(), a.P, steps=3)
    lb = trajectory_law(b.make(), b.P, steps=3)
    tv = 0.5 * sum(abs(la.get(k, 0) - lb.get(k, 0)) for k in set(la) | set(lb))
    assert tv > 0.1
    for cfg, law in ((a, la), (b, lb)):
        alpha = np.minimum(cfg.P, cfg.Q).sum(axis=1).mean()
        assert 0.5 < alpha < 0.7
        assert ((cfg.Q > 0) & (cfg.P == 0)).any() and ((cfg.P > 0) & (cfg.Q == 0)).any()
        ended = sum(p for k, p in law.items() if len(k) < 7)  # fell in a hole before step 3
        assert 0.02 < ended < 0.5


def test_auto_lookahead_two_configurations_in_one_batch() -> None:
    """Block verification with lookahead="auto" (cost_ratio fixed, so seeded runs are reproducible):
    the first round drafts 3 steps (max_steps=4), later rounds a k chosen from the acceptance of all
    rows so far, ragged rows ending at different times. TV 0.02."""
    case = _case("auto lookahead", default_configs(), N_CASE, 0.02, max_steps=4, lookahead="auto",
                 cost_ratio=0.05, verify="block")
    check_conformance(case, seed=11, alpha=ALPHA)


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["token", "block"])
def test_lookahead_3_slow(verify: str) -> None:
    """lookahead 3, max_steps 4: the first round drafts 3 steps, so block verification's decision
    depends on drafted states beyond the kept prefix. TV 0.01."""
    case = _case(f"k=3 {verify}", default_configs(), 400_000, 0.01, max_steps=4, lookahead=3, verify=verify)
    check_conformance(case, seed=12, alpha=ALPHA)


# the standard 8x8 map with holes added next to the start (episodes end within three steps)
MAP_B8 = ["SFHFFFFF", "FFFFFFFF", "HFFHFFFF", "FFFFFHFF", "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG"]


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["token", "block"])
def test_8x8_long_lookahead_slow(verify: str) -> None:
    """Two 8x8 maps and policy pairs in one batch, lookahead 5 (the first round drafts 5 steps). TV 0.01."""
    configs = [Config(None, *sparse_pair(6, n_states=64), name="8x8"), Config(MAP_B8, *sparse_pair(9, n_states=64))]
    case = _case(f"8x8 k=5 {verify}", configs, 400_000, 0.01, max_steps=6, lookahead=5, verify=verify)
    check_conformance(case, seed=13, alpha=ALPHA)
