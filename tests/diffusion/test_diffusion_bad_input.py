"""Bad input raises a clear ValueError / TypeError before any work; bad denoiser output is named.

Schedules (a beta outside (0, 1), NaN, a wrong timesteps / steps / eta / variance / prediction),
arguments (shape, labels, guidance without labels, record, lookahead, max_lookahead, cost_ratio,
draft, sampler, dtype), and denoisers returning the wrong shape, NaN or inf, complex numbers,
booleans or no array: the target at a state the chain reaches raises ValueError naming the time and
the sample; a target that is NaN only at drafted states the chain never reaches is harmless (the
draft is cut there); a draft that returns NaN or overflows only cuts that draft short.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from speculate.domains.diffusion import DDIM, DDPM, VPSDE, sample, speculative_sample
from speculate.domains.diffusion.marginal_law import GaussianData

SCHED = DDPM(timesteps=20)
DATA = GaussianData([1.0, -1.0], 0.5)


class Counting:
    """The exact denoiser, counting its calls (so we can assert that nothing ran)."""

    def __init__(self, fn=None):
        self.fn, self.calls = fn or DATA.denoiser(SCHED), 0

    def __call__(self, x, t, *labels):
        self.calls += 1
        return self.fn(x, t)


@pytest.mark.parametrize("betas, match", [([0.1, 1.0], "beta at t = 2"), ([0.0, 0.1], "beta at t = 1"),
                                          ([0.1, -0.2], "beta at t = 2"), ([0.1, np.nan], "beta at t = 2"),
                                          ([], "non-empty"), ([[0.1, 0.2]], "1-D"), (["a"], "real numbers")])
def test_a_beta_outside_0_1_is_refused(betas, match):
    for cls in (DDPM, DDIM, VPSDE):
        with pytest.raises(ValueError, match=match):
            cls(betas=betas) if cls is not DDIM else cls(betas=betas, steps=1)


@pytest.mark.parametrize("make, match", [
    (lambda: DDPM(timesteps=0), "timesteps"), (lambda: DDPM(timesteps=2.5), "timesteps"),
    (lambda: DDPM(betas=[0.1, 0.2], timesteps=3), "timesteps=3"), (lambda: DDPM(schedule="sigmoid"), "schedule"),
    (lambda: DDPM(variance="learned"), "variance"), (lambda: DDPM(prediction="score"), "prediction"),
    (lambda: DDIM(timesteps=20, steps=21), "steps"), (lambda: DDIM(timesteps=20, steps=0), "steps"),
    (lambda: DDIM(timesteps=20, steps=5, eta=-0.1), "eta"), (lambda: DDIM(timesteps=20, steps=5, eta=np.nan), "eta"),
    (lambda: VPSDE(timesteps=20, steps=30), "steps"), (lambda: DDPM(betas=np.full(200000, 0.999)), "underflows"),
])
def test_bad_schedules_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(shape=(4,)), ValueError, "at least one event axis"), (dict(shape=(4, 0)), ValueError, "event sizes"),
    (dict(shape=(4, 2.0)), ValueError, "ints"), (dict(shape="ab"), ValueError, "ints"),
    (dict(shape=None), TypeError, "shape"),
    (dict(labels=[0, 1]), ValueError, "one per sample"), (dict(labels=[0.5] * 4), TypeError, "integers"),
    (dict(guidance=2.0), ValueError, "needs labels"), (dict(guidance=2.0, labels=0), ValueError, "null_label"),
    (dict(guidance=np.inf, labels=0, null_label=1), ValueError, "guidance"),
    (dict(guidance=2.0, labels=0, null_label=1.5), TypeError, "null_label"),
    (dict(record=(7, 30)), ValueError, "not a time"), (dict(record=21), ValueError, "not a time"),
    (dict(lookahead=-1), ValueError, "lookahead"), (dict(lookahead=2.5), TypeError, "lookahead"),
    (dict(lookahead="fast"), TypeError, "lookahead"), (dict(max_lookahead=0), ValueError, "max_lookahead"),
    (dict(cost_ratio=-1.0), ValueError, "cost_ratio"), (dict(cost_ratio="x"), TypeError, "cost_ratio"),
    (dict(draft="frozen-eps"), ValueError, "draft"), (dict(draft=3), TypeError, "draft"),
    (dict(rng=-1), ValueError, "rng"), (dict(rng="seed"), TypeError, "rng"),
    (dict(dtype=np.int32), TypeError, "floating"), (dict(dtype="nope"), TypeError, "dtype"),
])
def test_bad_arguments_are_refused_before_any_work(kwargs, error, match):
    target = Counting()
    args = dict(shape=(4, 2)) | kwargs
    with pytest.raises(error, match=match):
        speculative_sample(SCHED, target, **args)
    assert target.calls == 0
    if "lookahead" in kwargs or "draft" in kwargs or "cost_ratio" in kwargs or "max_lookahead" in kwargs:
        return
    with pytest.raises(error, match=match):
        sample(SCHED, target, **{k: v for k, v in args.items()})
    assert target.calls == 0


def test_a_sampler_that_is_not_one_and_a_denoiser_that_is_not_callable():
    with pytest.raises(TypeError, match="sampler must be"):
        sample("ddpm", Counting(), (2, 2))
    with pytest.raises(TypeError, match="target denoiser must be callable"):
        speculative_sample(SCHED, "model", "frozen", (2, 2))


@pytest.mark.parametrize("bad, error, match", [
    (lambda x, t: x[:, :1], ValueError, r"returned shape \(2, 1\) for inputs of shape \(2, 2\)"),
    (lambda x, t: x.reshape(-1), ValueError, "returned shape"),
    (lambda x, t: x.to(torch.complex128), TypeError, "real numbers"),
    (lambda x, t: x > 0, TypeError, "real numbers"),
    (lambda x, t: "eps", TypeError, "real numbers"),
    (lambda x, t: [[1.0], [1.0, 2.0]], ValueError, "array of real numbers"),
])
def test_a_denoiser_returning_something_wrong(bad, error, match):
    for run in (lambda d: sample(SCHED, d, (2, 2), rng=0),
                lambda d: speculative_sample(SCHED, d, "frozen", (2, 2), rng=0),
                lambda d: speculative_sample(SCHED, DATA.denoiser(SCHED), d, (2, 2), lookahead=3, rng=0)):
        with pytest.raises(error, match=match):
            run(bad)


def nan_at(t_bad):
    """The exact denoiser, NaN for every sample at model time t_bad."""
    exact = DATA.denoiser(SCHED)

    def fn(x, t):
        out = exact(x, t)
        out[t == t_bad] = float("nan")
        return out
    return fn


@pytest.mark.parametrize("run", ["plain", "frozen", "draft"])
def test_a_nan_target_on_the_chain_names_the_time_and_the_sample(run):
    fn = nan_at(12)
    with pytest.raises(ValueError, match=r"target denoiser's output is not finite at t = 12 \(sample \d\)"):
        if run == "plain":
            sample(SCHED, fn, (3, 2), rng=0)
        else:
            draft = "frozen" if run == "frozen" else DATA.denoiser(SCHED)
            speculative_sample(SCHED, fn, draft, (3, 2), lookahead=4, rng=0)


def test_a_nan_target_only_at_drafted_states_never_reached_is_harmless():
    """The target is NaN far from the data (|x| > 30); a wild draft jumps there: those drafts are cut,
    the run completes with finite samples, as plain sampling does."""
    exact = DATA.denoiser(SCHED)

    def target(x, t):
        out = exact(x, t)
        out[(x.abs() > 30).flatten(1).any(1)] = float("nan")
        return out

    def wild(x, t):
        return torch.full_like(x, -400.0)  # pushes the drafted states far away

    res = speculative_sample(SCHED, target, wild, (16, 2), lookahead=4, rng=1)
    assert np.isfinite(res.x).all() and res.stats.draft_truncations > 0
    assert np.isfinite(sample(SCHED, target, (16, 2), rng=1).x).all()


@pytest.mark.parametrize("bad", [lambda x, t: torch.full_like(x, float("nan")), lambda x, t: torch.full_like(x, 1e308)])
def test_a_nan_or_overflowing_draft_only_cuts_the_draft(bad):
    """float64 denoisers: 1e308 is finite there, and the drafted chain overflows within a few steps."""
    res = speculative_sample(SCHED, DATA.denoiser(SCHED), bad, (8, 2), lookahead=4, rng=2, dtype=np.float64)
    assert np.isfinite(res.x).all() and res.stats.draft_truncations > 0 and res.stats.accepted == 0
