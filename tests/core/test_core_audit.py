"""speculate.testing.audit calls its verdicts right: checked by simulation on pure-numpy samplers.

Calibration and power are measured, not assumed: each claim is checked on many seeded audits of
cheap numpy samplers, and the observed rate is compared with the stated one by a one-sided binomial
test at level ``ALPHA`` = 1e-6 (speculate.testing.DEFAULT_ALPHA) divided by the number of such
comparisons in this file (``N_RATE_CHECKS``, Bonferroni): a correct audit fails this file with
probability below 1e-6 (the simulations are seeded, so in practice the verdicts are fixed).

The audits simulated run at a large level (0.05: false alarms are then frequent enough to count)
and are sized for power 0.9 against the WORST deviation of a given TV, the one the chi-square
bound assumes (deviation proportional to the law: each outcome (a, 1) gains ``2 tv`` of its mass,
its twin (a, 2) loses as much; TV = tv and chi-square divergence 4 tv^2 exactly). Any other
deviation of the same TV is caught at least as often.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import audit, chi2_sample_size
from speculate.testing.audit import SUM_TOL, check_law, detectable_tv, planned_sample_size

N_RATE_CHECKS = 9  # binomial comparisons of a simulated rate with a stated one in this file
LEVEL = ALPHA / N_RATE_CHECKS
SIM_ALPHA = 0.05

_q = np.random.default_rng(1).dirichlet(np.full(6, 3.0))  # first token's law (6 values, none tiny)
LAW = {(a, b): _q[a] / 2 for a in range(6) for b in (1, 2)}  # second token 1 or 2 with probability 1/2
OUTCOMES = list(LAW)
P = np.array([LAW[o] for o in OUTCOMES])
SIGN = np.array([1.0 if o[1] == 1 else -1.0 for o in OUTCOMES])


def numpy_sampler(probs: np.ndarray, outcomes=OUTCOMES):
    arr = np.array(outcomes)

    def sample(n, seed):
        return arr[np.random.default_rng(seed).choice(len(probs), n, p=probs)]

    return sample


def planted(tv: float) -> np.ndarray:
    """The law with a worst-case deviation of total variation ``tv`` (at the second position)."""
    out = P * (1 + 2 * tv * SIGN)
    assert math.isclose(0.5 * np.abs(out - P).sum(), tv) and math.isclose(np.sum((out - P) ** 2 / P), 4 * tv * tv)
    return out


def rate_at_most(k: int, n: int, rate: float) -> bool:
    """k successes in n are consistent (one-sided, level LEVEL) with a probability <= rate."""
    return stats.binom.sf(k - 1, n, rate) > LEVEL


def rate_at_least(k: int, n: int, rate: float) -> bool:
    return stats.binom.cdf(k, n, rate) > LEVEL


# ----------------------------------------------------------------------------- calibration, power


def test_false_alarms_at_the_stated_rate():
    """400 audits of an exact sampler at level 0.05 (fixed-sample test alone): the false-alarm rate
    is at most 0.05 and not far below it (the test is calibrated, not merely conservative)."""
    sims = 400
    rej = sum(audit(numpy_sampler(P), LAW, tv=0.1, alpha=SIM_ALPHA, power=0.9, seed=s, sequential=False,
                    progress=False).biased for s in range(sims))
    assert rate_at_most(rej, sims, SIM_ALPHA), f"{rej}/{sims} false alarms at level {SIM_ALPHA}"
    assert rate_at_least(rej, sims, SIM_ALPHA / 3), f"only {rej}/{sims} rejections: far too conservative"


def test_false_alarms_with_the_sequential_test_too():
    """The default audit (sequential e-process at alpha/10 + fixed test at 0.9 alpha): at most alpha."""
    sims = 300
    rej = sum(audit(numpy_sampler(P), LAW, tv=0.1, alpha=SIM_ALPHA, power=0.9, seed=1000 + s,
                    progress=False).biased for s in range(sims))
    assert rate_at_most(rej, sims, SIM_ALPHA), f"{rej}/{sims} false alarms at level {SIM_ALPHA}"


def test_sequential_type_one_error_is_controlled():
    """Ville's inequality: an exact sampler pushes the e-process over 1/alpha_seq with probability
    <= alpha_seq, however long it runs (here 5000 samples, 5-10x the planned n)."""
    sims, alpha = 300, 0.5  # the sequential test gets alpha / 10 = 0.05
    stops = 0
    for s in range(sims):
        r = audit(numpy_sampler(P), LAW, tv=0.1, alpha=alpha, power=0.9, n=5000, seed=2000 + s, progress=False)
        stops += r.sequential["stopped_at"] is not None
    assert rate_at_most(stops, sims, alpha / 10), f"{stops}/{sims} sequential stops at level {alpha / 10}"


@pytest.mark.parametrize("tv", [0.02, 0.05, 0.1])
def test_power_as_stated_on_planted_biases(tv):
    """Audits sized for power 0.9 against TV tv catch the worst deviation of that TV at least 90% of
    the time (120 seeded audits each)."""
    sims, power = 120, 0.9
    hits = sum(audit(numpy_sampler(planted(tv)), LAW, tv=tv, alpha=SIM_ALPHA, power=power, seed=3000 + s,
                     progress=False).biased for s in range(sims))
    assert rate_at_least(hits, sims, power), f"TV {tv}: caught {hits}/{sims}, stated power {power}"


def test_sequential_test_stops_early_on_a_gross_bias():
    r = audit(numpy_sampler(planted(0.25)), LAW, tv=0.02, alpha=1e-3, progress=False)
    assert r.biased and r.sequential["stopped_at"] is not None and r.n < r.n_planned / 10, r
    assert r.pvalue <= 1e-4  # the anytime-valid p-value of the e-process (1 / max e)


# --------------------------------------------------------------------------- two-sample mode


def test_two_sample_false_alarms_and_power():
    """Two-sample mode against a reference sampler: false alarms at most 0.05 (200 audits of the
    exact sampler against itself), power at least 0.9 at TV 0.1 (100 audits of the planted bias)."""
    ref = numpy_sampler(P)
    sims = 200
    rej = sum(audit(numpy_sampler(P), reference=ref, horizon=2, tv=0.1, alpha=SIM_ALPHA, power=0.9,
                    seed=4000 + 2 * s, progress=False).biased for s in range(sims))
    assert rate_at_most(rej, sims, SIM_ALPHA), f"{rej}/{sims} false alarms"
    sims = 100
    hits = sum(audit(numpy_sampler(planted(0.1)), reference=ref, horizon=2, tv=0.1, alpha=SIM_ALPHA, power=0.9,
                     seed=5000 + 2 * s, progress=False).biased for s in range(sims))
    assert rate_at_least(hits, sims, 0.9), f"caught {hits}/{sims}"


def test_two_sample_sequential_type_one_error_is_controlled():
    """The two-sample e-process (label-swap bets on pairs) is valid whatever the common law: two
    identical samplers push it over 1 / alpha_seq with probability <= alpha_seq (200 audits of 5000
    pairs each, alpha_seq = 0.05)."""
    sims, alpha = 200, 0.5
    stops = 0
    for s in range(sims):
        r = audit(numpy_sampler(P), reference=numpy_sampler(P), horizon=2, tv=0.1, alpha=alpha, power=0.9, n=5000,
                  seed=6000 + 2 * s, progress=False)
        stops += r.sequential["stopped_at"] is not None
    assert rate_at_most(stops, sims, alpha / 10), f"{stops}/{sims} sequential stops at level {alpha / 10}"


def test_two_sample_sequential_test_stops_early_on_a_gross_bias():
    r = audit(numpy_sampler(planted(0.25)), reference=numpy_sampler(P), horizon=2, tv=0.02, alpha=1e-3,
              progress=False)
    assert r.biased and r.sequential["stopped_at"] is not None and r.n < r.n_planned / 10, r
    assert r.pvalue <= 1e-4 and "stopped after" in r.reason
    off = audit(numpy_sampler(P), reference=numpy_sampler(P), horizon=2, tv=0.1, sequential=False, progress=False)
    assert off.sequential == {} and "no sequential test" in off.notes[-1]


def test_a_sampler_that_raises_is_reported_not_raised():
    """A sampler's own exception (here a NaN guard) ends the audit with the verdict "error", naming it;
    in two-sample mode too, and after a good probe (malformed output mid-run as well)."""
    def nan_guard(n, seed):
        raise ValueError("probabilities contain NaN")

    r = audit(nan_guard, LAW, progress=False)
    assert r.verdict == "error" and r.failed and not r.biased and "NaN" in r.error and "probe" in r.reason
    assert "ERROR" in str(r) and json.loads(json.dumps(r.as_dict()))["verdict"] == "error"
    r = audit(numpy_sampler(P), reference=nan_guard, horizon=2, progress=False)
    assert r.verdict == "error" and r.reason.startswith("the reference sampler raised ValueError")
    calls = []

    def later(n, seed):
        calls.append(n)
        if len(calls) > 3:
            return np.full((n, 2), np.nan)  # NaN-derived garbage after a good probe
        return numpy_sampler(P)(n, seed)

    r = audit(later, LAW, batch=100, progress=False)
    assert r.verdict == "error" and r.n == 200 and "float64" in r.error and "call 4" in r.reason


def test_two_sample_report():
    r = audit(numpy_sampler(planted(0.2)), reference=numpy_sampler(P), horizon=2, tv=0.1, sequential=False,
              progress=False)
    assert r.mode == "two-sample" and r.biased and r.n == r.n_planned
    assert r.tv_ci[0] <= 0.2 <= r.tv_ci[1] + 0.02
    assert r.over[0]["outcome"][1] == 1 and r.under[0]["outcome"][1] == 2
    assert any(p["flag"] and p["position"] == 1 for p in r.positions)
    with pytest.raises(ValueError, match="horizon"):
        audit(numpy_sampler(P), reference=numpy_sampler(P))


# -------------------------------------------------------------------------------- the report


def test_report_of_a_biased_sampler():
    r = audit(numpy_sampler(planted(0.1)), LAW, tv=0.05, alpha=1e-3, sequential=False, progress=False)
    assert r.biased and r.n == r.n_planned and r.pvalue < 1e-3
    assert r.tv_ci[0] <= 0.1 <= r.tv_ci[1], r.tv_ci
    assert r.tv_exact_mean < r.tv_exact_q95 < 0.05 < r.tv_hat
    assert math.isclose(r.tv_detectable, 0.05, rel_tol=0.02)
    assert all(o["outcome"][1] == 1 for o in r.over) and all(o["outcome"][1] == 2 for o in r.under)
    flagged = {(p["position"], p["test"]) for p in r.positions if p["flag"]}
    assert (1, "conditional") in flagged and (0, "conditional") not in flagged, r.positions
    assert r.samples_per_second > 0
    text = str(r)
    assert "BIASED" in text and "most over-produced" in text
    json.dumps(r.as_dict())


def test_report_of_an_exact_sampler():
    r = audit(numpy_sampler(P), LAW, progress=False)
    assert r.verdict == "consistent" and r.n == r.n_planned and r.tv_hat < r.tv_exact_q95 * 1.5
    assert not any(p["flag"] for p in r.positions)


def test_budget_gives_inconclusive():
    slow = numpy_sampler(P)

    def one(seed):  # one sequence per call
        return slow(1, seed)[0]

    r = audit(one, LAW, tv=0.01, budget=0.2, progress=False)
    assert r.verdict == "inconclusive" and 0 < r.n < r.n_planned and r.tv_detectable > 0.01


def test_impossible_outcomes_reject_at_once_whatever_the_law():
    """Probability 0 (listed or not) but sampled: biased, p = 0, the outcome named."""
    def sampler(n, seed):
        out = numpy_sampler(P)(n, seed).tolist()
        if n > 3:  # not in the two-sequence probe: caught among the samples
            out[3] = [5, 9]
        return out

    for law in (LAW, {**LAW, (5, 9): 0.0}):
        r = audit(sampler, law, progress=False)
        assert r.biased and r.pvalue == 0.0 and r.impossible == (5, 9) and "(5, 9)" in r.reason

    def short(n, seed):  # a sequence shorter than the horizon that is no outcome (stopped early)
        out = numpy_sampler(P)(n, seed).tolist()
        out[0] = [2]  # in the probe: caught before the sampling run
        return out

    r = audit(short, LAW, progress=False)
    assert r.impossible == (2,) and "shorter than the horizon" in r.reason


def test_sequences_are_cut_to_the_horizon_and_int_keys_accepted():
    law = {0: 0.5, 1: 0.5}

    def long(n, seed):
        rng = np.random.default_rng(seed)
        return np.c_[rng.integers(0, 2, n), np.full(n, 7)]  # a second token the law does not look at

    assert audit(long, law, tv=0.1, progress=False).verdict == "consistent"


def test_point_mass_law():
    r = audit(lambda n, seed: [[3]] * n, {(3,): 1.0}, tv=0.05, progress=False)
    assert r.verdict == "consistent" and r.n == math.ceil(math.log(1 - 0.99) / math.log(1 - 0.05))


# --------------------------------------------------------------------- bad input, before sampling


class Counting:
    def __init__(self, out):
        self.out, self.calls = out, 0

    def __call__(self, n, seed):
        self.calls += 1
        return self.out(n) if callable(self.out) else self.out


@pytest.mark.parametrize("law, match", [
    ({(0,): 0.5, (1,): 0.4}, "sum to 0.9"),
    ({(0,): 1.2, (1,): -0.2}, ">= 0"),
    ({(0,): float("nan"), (1,): 1.0}, "finite"),
    ({("a",): 1.0}, "tuples of non-negative int"),
    ({(0,): 0.5, (0, 1): 0.5}, "prefix"),
    ({}, "empty"),
    ([0.5, 0.5], "dict"),
])
def test_bad_oracles_refused_before_sampling(law, match):
    s = Counting(lambda n: [[0]] * n)
    with pytest.raises((ValueError, TypeError), match=match):
        audit(s, law, progress=False)
    assert s.calls == 0


def test_sum_tolerance_is_stated():
    check_law({(0,): 0.5, (1,): 0.5 + SUM_TOL / 2})
    with pytest.raises(ValueError, match="tolerance"):
        check_law({(0,): 0.5, (1,): 0.5 + 2 * SUM_TOL})


@pytest.mark.parametrize("out, match", [
    (lambda n: [[0]] * (n + 1), "asked for 2 sequences and returned 3"),
    (lambda n: np.zeros((n, 2), np.float32), "not integer token ids"),
    (lambda n: [[0, -1]] * n, "negative"),
    (lambda n: np.zeros((n, 2, 2), np.int64), "shape"),
    (lambda n: "00", "list of 2 token-id sequences"),
    (lambda n: [[[0]]] * n, "1-D"),
])
def test_bad_samplers_refused_before_sampling(out, match):
    s = Counting(out)
    with pytest.raises((ValueError, TypeError), match=match):
        audit(s, {(0, 0): 1.0}, progress=False)
    assert s.calls == 1  # the two-sequence probe, nothing more


def test_bad_arguments():
    for kw, match in [({"tv": 0}, "tv"), ({"alpha": 1}, "alpha"), ({"power": 1.5}, "power"),
                      ({"budget": 0}, "budget"), ({"n": 0}, "n must")]:
        with pytest.raises(ValueError, match=match):
            audit(numpy_sampler(P), LAW, **kw)
    with pytest.raises(ValueError, match="one of them"):
        audit(numpy_sampler(P))


# -------------------------------------------------------------------------------- planning


def test_planning_agrees_with_gof():
    """Without pooling the planned n is speculate.testing.chi2_sample_size's; detectable_tv inverts it."""
    n, bins = planned_sample_size(P, 0.05, alpha=1e-3, power=0.99)
    assert bins == len(P) and n == chi2_sample_size(0.05, len(P), alpha=1e-3, power=0.99)
    assert math.isclose(detectable_tv(n, bins, alpha=1e-3, power=0.99), 0.05, rel_tol=1e-3)
    n2, _ = planned_sample_size(P, 0.05, alpha=1e-3, power=0.99, two_sample=True)
    assert abs(n2 - 2 * n) <= 2
