"""speculate(f, f_star, g, x): exact law, acceptance, real concurrency, executors and the error contract."""

import os
import threading
import time
import warnings
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


def g_with_pid(y):  # module level: a ProcessPoolExecutor can pickle it
    return os.getpid(), 10 * y + 1


def _seeds_by_outcome(n_each=2):
    """Seeds whose guess is kept and seeds whose guess is rejected (the law of f vs f_star decides)."""
    kept, rejected = [], []
    for s in range(100):
        (kept if sp.speculate(f, f_star, g, None, rng=s).accepted else rejected).append(s)
    assert len(kept) >= n_each and len(rejected) >= n_each
    return kept[:n_each], rejected[:n_each]


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


def test_g_always_runs_in_the_given_executor_whatever_the_seed():
    """Regression: after a rejection g(y) ran in the calling thread, so an unpicklable g with a
    ProcessPoolExecutor failed only on seeds that kept the guess. Now g runs in the executor on the
    guess and on the replacement: a picklable g runs in a worker process for every seed, and an
    unpicklable one fails the same way for every seed."""
    kept, rejected = _seeds_by_outcome()
    unpicklable = lambda y: y  # noqa: E731 - a lambda cannot be pickled by reference
    failures = {}
    with ProcessPoolExecutor(max_workers=2) as pool:
        for s in kept + rejected:
            res = sp.speculate(f, f_star, g_with_pid, None, rng=s, executor=pool)
            assert res.accepted == (s in kept)
            pid, value = res.value
            assert pid != os.getpid(), f"seed {s} ({'kept' if res.accepted else 'rejected'}): g ran in this process"
            assert value == 10 * res.sample + 1
            assert res == sp.speculate(f, f_star, g_with_pid, None, rng=s, executor=pool)._replace(value=res.value)
            with pytest.raises(Exception) as info:
                sp.speculate(f, f_star, unpicklable, None, rng=s, executor=pool)
            failures[s] = (type(info.value), str(info.value))
            assert any("raised in g on" in n for n in info.value.__notes__), info.value.__notes__
    assert len(set(failures.values())) == 1, failures  # the same failure for kept and rejected guesses
    assert "pickle" in next(iter(failures.values()))[1].lower()


class _NotAnExecutor:
    pass


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"executor": 5}, TypeError, r"executor must be a concurrent\.futures\.Executor.*got int"),
        ({"executor": _NotAnExecutor()}, TypeError, "executor must be"),
        ({"g": "not a function"}, TypeError, "g must be callable"),
        ({"f": None}, TypeError, "f must be callable"),
        ({"max_tries": 0}, ValueError, "max_tries"),
        ({"max_tries": 2.5}, TypeError, "max_tries"),
        ({"rng": -1}, ValueError, "seed"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(kwargs, err, match):
    """Regression: executor=5 raised AttributeError after f_star had already run."""
    calls = []

    def f_(x):
        calls.append("f")
        return f(x)

    def f_star_(x):
        calls.append("f_star")
        return f_star(x)

    args = {"f": f_, "f_star": f_star_, "g": g, **kwargs}
    with pytest.raises(err, match=match):
        sp.speculate(
            args["f"],
            args["f_star"],
            args["g"],
            None,
            **{k: v for k, v in kwargs.items() if k in ("executor", "max_tries", "rng")},
        )
    assert calls == []


def test_max_tries_is_checked_whatever_the_seed():
    """max_tries=0 used to fail only on seeds that needed rejection sampling; now always, first."""
    p, q = sp.from_scipy(st.norm(0, 1)), sp.from_scipy(st.norm(0.5, 1))
    for s in range(5):
        with pytest.raises(ValueError, match="max_tries"):
            sp.speculative_sample(p, q, rng=s, max_tries=0)


def test_a_probability_vector_returned_as_a_plain_value_warns():
    """A float array summing to 1 where a distribution was expected is a point mass, as before,
    but no longer silently: the warning says to wrap it in Categorical. An explicit PointMass, and
    plain values that are not probability vectors, stay silent."""
    probs = np.array([0.5, 0.3, 0.2])
    with pytest.warns(sp.distributions.PlainValueWarning, match=r"f\(x\).*speculate\.Categorical\(probs=") as rec:
        res = sp.speculate(lambda x: probs, f_star, g, None, rng=0)
    assert np.array_equal(res.sample, probs)  # behaviour kept: a point mass at the array
    assert all(r.filename == __file__ for r in rec)  # the warning points at the caller
    with pytest.warns(sp.distributions.PlainValueWarning, match="f_star"):
        sp.speculate(lambda x: sp.PointMass(1), lambda x: [0.25, 0.75], lambda y: y, None, rng=0)
    with pytest.warns(sp.distributions.PlainValueWarning, match="Categorical"):
        sp.speculative_sample(np.full((2, 2), 0.5), sp.PointMass(np.full((2, 2), 0.5)), rng=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = sp.speculate(lambda x: sp.PointMass(probs), lambda x: sp.PointMass(probs), lambda y: y, None, rng=0)
        assert res.accepted
        for plain in (np.arange(3), np.array([0.5, 0.6]), [1.0], np.array([0.5, np.nan, 0.5]), "text", 1.0):
            sp.speculate(lambda x, v=plain: v, lambda x, v=plain: v, lambda y: y, None, rng=0)


@pytest.mark.parametrize("which", ["f", "g_kept", "g_rejected"])
def test_exceptions_after_g_started(which):
    """f raising after g started on the guess: f's exception propagates (g's result is dropped).
    g raising on a kept guess: it propagates. g raising on a rejected guess: discarded, and g runs
    again on f's sample. Each propagating exception carries a note naming the call."""
    started = threading.Event()

    def f_(x):
        assert started.wait(timeout=10)
        if which == "f":
            raise KeyError("f broke")
        return sp.PointMass(1 if which == "g_kept" else 2)

    def g_(y):
        started.set()
        if y == 1:
            raise RuntimeError("g failed on 1")
        return y

    if which == "g_rejected":
        res = sp.speculate(f_, lambda x: sp.PointMass(1), g_, None, rng=0)
        assert (res.value, res.sample, res.accepted) == (2, 2, False)
        return
    err = KeyError if which == "f" else RuntimeError
    with pytest.raises(err) as info:
        sp.speculate(f_, lambda x: sp.PointMass(1), g_, None, rng=0)
    want = "raised in f(x)" if which == "f" else "raised in g on the kept guess"
    assert any(want in n for n in info.value.__notes__), info.value.__notes__


def test_keyboard_interrupt_in_f_propagates_and_the_next_call_is_unaffected():
    def interrupted(x):
        raise KeyboardInterrupt

    undisturbed = [sp.speculate(f, f_star, g, None, rng=s) for s in range(10)]
    with pytest.raises(KeyboardInterrupt) as info:
        sp.speculate(interrupted, f_star, g, None, rng=3)
    assert any("raised in f(x)" in n for n in info.value.__notes__)
    assert [sp.speculate(f, f_star, g, None, rng=s) for s in range(10)] == undisturbed
