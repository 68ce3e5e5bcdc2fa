"""speculate(f, f_star, g, x): exact law, acceptance, real concurrency, executors and the error contract."""

import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest
import scipy.stats as st

import speculate as sp
from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_categorical_matches, chi2_sample_size

P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.2, 0.5, 0.3])


def f(x):
    return sp.Categorical(probs=P)


def f_star(x):
    return sp.Categorical(probs=Q)


def g(y):
    return 10 * y + 1


def test_law_and_acceptance():
    # 3 outcomes: 20,000 draws catch TV 0.05 with >= 99% power at ALPHA (chi2_sample_size(0.05, 3) ~ 7k);
    # the categorical rule itself is tested at TV 0.01 in test_speculative_sample.py
    n = 20_000
    assert chi2_sample_size(0.05, 3, alpha=ALPHA) <= n
    rng = np.random.default_rng(0)
    pool = ThreadPoolExecutor(2)
    res = [sp.speculate(f, f_star, g, None, rng=rng, executor=pool) for _ in range(n)]
    assert all(r.value == g(r.sample) for r in res)
    assert_categorical_matches([r.sample for r in res], P, alpha=ALPHA)
    kept = sum(r.accepted for r in res)
    assert st.binomtest(kept, n, float(np.minimum(P, Q).sum())).pvalue >= ALPHA


def test_g_really_runs_while_f_runs():
    started = threading.Event()

    def slow_f(x):  # returns only once g has started on the guess: deadlocks if they ran in sequence
        assert started.wait(timeout=10), "g(guess) did not start while f was running"
        return sp.PointMass(1)

    def g_(y):
        started.set()
        return y

    res = sp.speculate(slow_f, lambda x: sp.PointMass(1), g_, None, rng=0)
    assert res.accepted and res.value == 1


def test_wall_time_overlaps_f_and_g():
    def slow(x):
        time.sleep(0.2)
        return sp.PointMass(7)

    def slow_g(y):
        time.sleep(0.2)
        return y

    t0 = time.perf_counter()
    res = sp.speculate(slow, lambda x: 7, slow_g, None)
    # sequential would take >= 0.4 s; overlapped takes ~0.2 s (generous bound for a loaded machine)
    assert res.accepted and time.perf_counter() - t0 < 0.39


def test_point_mass_is_speculative_execution_and_plain_values_are_point_masses():
    calls = []

    def g_(y):
        calls.append(y)
        return y * 2

    hit = sp.speculate(lambda x: x + 1, lambda x: x + 1, g_, 3, rng=0)
    assert (hit.value, hit.sample, hit.accepted, calls) == (8, 4, True, [4])
    calls.clear()
    miss = sp.speculate(lambda x: x + 1, lambda x: x, g_, 3, rng=0)
    assert (miss.value, miss.sample, miss.accepted) == (8, 4, False)
    assert calls[-1] == 4  # g recomputed on the real value


def test_rejected_guess_exception_is_discarded_and_final_exception_propagates():
    def picky_g(y):
        if y == 0:
            raise RuntimeError("g failed on 0")
        return y

    res = sp.speculate(lambda x: sp.PointMass(1), lambda x: sp.PointMass(0), picky_g, None)
    assert (res.value, res.accepted) == (1, False)
    with pytest.raises(RuntimeError, match="g failed on 0"):
        sp.speculate(lambda x: sp.PointMass(0), lambda x: sp.PointMass(0), picky_g, None)
    with pytest.raises(RuntimeError, match="g failed on 0"):
        sp.speculate(lambda x: sp.PointMass(0), lambda x: sp.PointMass(1), picky_g, None)


def test_exception_from_f_propagates():
    def bad_f(x):
        raise KeyError("f broke")

    with pytest.raises(KeyError, match="f broke"):
        sp.speculate(bad_f, f_star, g, None, rng=0)


def test_bad_distribution_from_f_is_a_clear_error():
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        sp.speculate(lambda x: sp.Categorical(probs=[0.5, 0.5]), f_star, g, None, rng=0)


def test_same_seed_same_result():
    a = [sp.speculate(f, f_star, g, None, rng=s) for s in range(30)]
    b = [sp.speculate(f, f_star, g, None, rng=s) for s in range(30)]
    assert a == b


def test_process_pool_executor():
    with ProcessPoolExecutor(max_workers=1) as pool:
        res = [sp.speculate(f, f_star, g, None, rng=s, executor=pool) for s in range(20)]
    assert all(r.value == g(r.sample) for r in res)


def test_batched_categorical_pipeline():
    B = 64
    pb = sp.Categorical(probs=np.broadcast_to(P, (B, 3)))
    qb = sp.Categorical(probs=np.broadcast_to(Q, (B, 3)))
    res = sp.speculate(lambda x: pb, lambda x: qb, lambda y: y.sum(), None, rng=1)
    assert res.sample.shape == (B,) and res.value == res.sample.sum() and isinstance(res.accepted, bool)
