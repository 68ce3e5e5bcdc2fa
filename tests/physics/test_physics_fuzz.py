"""Fuzzing simulate and speculative_simulate.

Hypothesis draws x0 of any shape (empty batches, particles or coordinates included) and dtype
(float16/32/64, ints, bool, complex, strings) with NaN / inf / negative / huge values, as arrays,
nested lists or torch tensors; n_steps, lookahead (0..17, "auto" and bad values), max_lookahead,
record_every, cost_ratio and rng at and beyond their bounds; dt, kT and gamma at edge values (0,
negative, inf, NaN, 1e-300, 1e300, float16, bool, strings); forces and draft forces that return
the wrong shape, NaN or inf (at one call or beyond a wall), huge values, ints, float16/32, torch
tensors (float64/32, bfloat16), lists, read-only arrays, complex numbers, booleans, strings, None,
or that write into their input; every kind of draft (a function, "frozen", frozen_correction) and
a perfect draft. Every call must either return a valid simulation or raise a ValueError/TypeError
with a message; never a NaN, a wrong shape, another exception type from inside numpy or a kernel,
a numpy RuntimeWarning, or a hang.

A valid simulation is checked with what holds for every draw: float64 positions of the right
shape, all finite, step 0 equal to x0, the recorded steps, ``final``, the counters (every replica
made n_steps steps, kept drafts <= drafted ones, the histogram sums to the row-rounds, a perfect
draft always kept), every recorded step a finite standardised innovation of the exact force, and
the same result again for the same int seed. Where every input is valid an oracle written here
says that the call must succeed. The law itself is tested statistically in
test_physics_exactness.py and test_physics_conformance.py.

Each test counts its cases in ``CASES`` (printed by test_fuzz_case_counts_are_reported); the
default run makes the examples given in each ``settings``, the ``slow`` variants ten times as many.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from speculate.domains.physics import DoubleWell, Langevin, frozen_correction, simulate, speculative_simulate

CASES: Counter = Counter()  # cases run per test and outcome (read by test_fuzz_case_counts_are_reported)
CLEAR = (ValueError, TypeError)
NAMES = ("x0", "n_steps", "lookahead", "max_lookahead", "record_every", "cost_ratio", "rng", "dt", "kT",
         "gamma", "noise scale", "force", "draft_force", "Langevin", "model", "mean", "positions")
WELL = DoubleWell(1.0)
SAFE = 1e60  # |x| below this: DoubleWell's force is finite (it overflows past 1e102)


def _clear(err: BaseException) -> str:
    """A clear error: ValueError/TypeError with a message that names what is wrong."""
    assert isinstance(err, CLEAR), f"{type(err).__name__}: {err}"
    msg = str(err)
    assert len(msg) >= 15 and any(n in msg for n in NAMES), f"unclear message: {err!r}"
    return type(err).__name__


class _Strict:
    """numpy RuntimeWarnings (overflow, NaN arithmetic, a complex cast) become errors in a case."""

    def __enter__(self):
        self.w = warnings.catch_warnings()
        self.w.__enter__()
        warnings.simplefilter("error", RuntimeWarning)

    def __exit__(self, *exc):
        self.w.__exit__(*exc)


# ----------------------------------------------------------------------------------------------
# forces that misbehave on purpose

GOOD = ("ok", "int", "float32", "torch64", "torch32", "list", "readonly", "mutate", "huge")  # must work
LOSSY = ("float16", "bf16")  # fine, but may overflow to inf: an exact force may then raise
NONFINITE = ("nan_call", "inf_call", "nan_wall")  # an exact force raises iff the chain reaches it
BAD = ("shape_extra", "shape_flat", "scalar", "complex", "bool", "none", "str", "ragged")  # raise when called


class Force:
    """DoubleWell forces delivered in the way ``mode`` says (a fresh object per run: it counts calls)."""

    def __init__(self, mode: str, base=WELL, at: int = 2, wall: float = 1.0):
        self.mode, self.base, self.at, self.wall, self.calls = mode, base, at, wall, 0

    def __call__(self, X):
        import torch

        self.calls += 1
        with np.errstate(all="ignore"):
            F = np.asarray(self.base(X), np.float64)
        m = self.mode
        if m == "ok":
            return F
        if m == "int":
            return np.clip(np.nan_to_num(F), -1e9, 1e9).astype(np.int64)
        if m in ("float32", "float16"):
            with np.errstate(over="ignore"):
                return F.astype(m)
        if m == "torch64":
            return torch.from_numpy(F)
        if m == "torch32":
            return torch.from_numpy(F).float()
        if m == "bf16":
            return torch.from_numpy(F).to(torch.bfloat16)
        if m == "list":
            return F.tolist()
        if m == "readonly":
            F.flags.writeable = False
            return F
        if m == "mutate":  # writes into its input: must not change the chain
            X += 1.0
            return F
        if m == "huge":  # finite everywhere, 1e198 per step at dt = 0.01: drafts and targets far apart
            return np.full(X.shape, 1e200)
        if m in ("nan_call", "inf_call"):
            if self.calls == self.at:
                F[:] = np.nan if m == "nan_call" else np.inf
            return F
        if m == "nan_wall":
            F[X[..., 0] > self.wall] = np.nan
            return F
        return {"shape_extra": lambda: F[None], "shape_flat": lambda: F.reshape(-1), "scalar": lambda: 0.0,
                "complex": lambda: F + 0j, "bool": lambda: F > 0, "none": lambda: None, "str": lambda: "F",
                "ragged": lambda: [[1.0], [1.0, 2.0]]}[m]()


# ----------------------------------------------------------------------------------------------
# strategies

X_DTYPES = ("float16", "float32", "float64", "int8", "int64", "uint8", "bool", "complex128", "str")


@hs.composite
def initial_configurations(draw):
    """(x0 as given, float64 [B, N, d] or None when x0 is invalid, batched, all |x| < SAFE).

    Half the cases are valid configurations of a real dtype; the others any shape, dtype and values."""
    valid_case = draw(hs.booleans())
    if valid_case:
        dtype = draw(hs.sampled_from(["float16", "float32", "float64", "float64", "int8", "int64", "uint8"]))
        ndim = draw(hs.sampled_from([2, 3]))
        shape = tuple(draw(hs.lists(hs.integers(1, 3), min_size=ndim, max_size=ndim)))
    else:
        dtype = draw(hs.sampled_from(X_DTYPES))
        ndim = draw(hs.sampled_from([0, 1, 2, 2, 3, 3, 3, 4]))
        shape = tuple(draw(hs.lists(hs.sampled_from([0, 1, 1, 2, 3]), min_size=ndim, max_size=ndim)))
    size = int(np.prod(shape, dtype=np.int64))
    if dtype in ("float16", "float32", "float64", "complex128"):
        special = [0.0, -0.0, 1.5, -2.0, 1e3, 6e4] + ([] if valid_case else [np.nan, np.inf, -np.inf, 1e300, -1e200])
        vals = draw(hs.lists(hs.one_of(hs.floats(-3, 3), hs.sampled_from(special)), min_size=size, max_size=size))
        with np.errstate(over="ignore"):
            x = np.array(vals, dtype=np.float64).astype(dtype).reshape(shape)
        if dtype == "complex128" and size and draw(hs.booleans()):
            x = x + 1j
    elif dtype == "str":
        x = np.array(draw(hs.lists(hs.sampled_from(["1.0", "a", ""]), min_size=size, max_size=size)),
                     dtype=str).reshape(shape)
    elif dtype == "bool":
        x = np.array(draw(hs.lists(hs.booleans(), min_size=size, max_size=size)), bool).reshape(shape)
    else:
        info = np.iinfo(dtype)
        vals = draw(hs.lists(hs.integers(max(info.min, -5), min(info.max, 5)), min_size=size, max_size=size))
        x = np.array(vals, dtype=dtype).reshape(shape)
    valid = ndim in (2, 3) and size > 0 and dtype not in ("bool", "complex128", "str")
    X = None
    if valid:
        X = x.astype(np.float64)
        if not np.isfinite(X).all():
            X = None
    assert X is not None or not valid_case
    container = draw(hs.sampled_from(["numpy", "numpy", "list", "torch"]))
    if container == "list":
        x = x.tolist()
    elif container == "torch" and dtype not in ("str", "uint8") and size:
        import torch

        x = torch.from_numpy(np.ascontiguousarray(x))
    batched = ndim == 3
    safe = X is not None and bool(np.all(np.abs(X) < SAFE))
    return x, (None if X is None else (X if batched else X[None])), batched, safe


ARGS = {  # name -> (valid values, invalid values)
    "dt": ([0.05, 0.05, 0.05, 1e-3, 0.2, np.float16(0.05), np.float32(0.01), 1, 1e300, 1e-300],
           [0.0, -0.01, math.inf, math.nan, True, "0.1"]),
    "kT": ([1.0, 1.0, 1.0, 0.3, 1e-12, np.float16(300.0), 1e300, 1e-300], [0.0, -1.0, math.inf, None]),
    "gamma": ([1.0, 1.0, 1.0, 2.5, 1e-300], [0.0, -2.0, math.nan]),
    "n_steps": ([0, 1, 2, 5, 9, np.int64(4), np.uint8(3)], [-1, True, 2.0, 2**62 + 1, "3", None]),
    "record_every": ([1, 1, 2, 3, 10**9], [0, -2, False, 1.5]),
    "rng": ([0, 7, "generator"], [-1, "seed", 1.5]),
    "lookahead": ([*range(18), "auto", "auto"], [-1, 2.5, "AUTO", True, None]),
    "max_lookahead": ([16, 1, 3, 17], [0, 2.5, True, "16", math.inf]),
    "cost_ratio": ([None, 0.0, 0.3, 5], [math.nan, -0.1, math.inf, "0.1", True]),
}


def _model_ok(dt, kT, gamma) -> bool:
    """The oracle for Langevin's own checks: positive finite reals whose derived scales are too."""
    for v in (dt, kT, gamma):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not (0 < float(v) < math.inf):
            return False
    dt, kT, gamma = float(dt), float(kT), float(gamma)
    s = math.sqrt(2 * kT * dt / gamma)
    return 0 < dt / gamma < math.inf and 0 < s < math.inf


def _drafts(kind: str, mode: str):
    if kind == "frozen":
        return "frozen"
    if kind == "perfect":
        return Force("ok")
    cheap = Force(mode, base=DoubleWell(1.5, tilt=0.5))
    return cheap if kind == "function" else frozen_correction(cheap)


def _check_simulation(sim, X, batched, n, every, model, speculative, perfect, force=WELL):
    """What holds for every draw of a valid simulation (``force``: the exact force, to check steps)."""
    B, N, d = X.shape
    T = n // every + 1
    pos = sim.positions if batched else sim.positions[None]
    fin = sim.final if batched else sim.final[None]
    assert pos.dtype == np.float64 and pos.shape == (B, T, N, d), pos.shape
    assert fin.shape == (B, N, d) and np.isfinite(pos).all() and np.isfinite(fin).all()
    np.testing.assert_array_equal(pos[:, 0], X)
    np.testing.assert_array_equal(sim.steps, np.arange(T) * every)
    if n % every == 0:
        np.testing.assert_array_equal(fin, pos[:, -1])
    st = sim.stats
    assert st.steps == n and st.emitted == B * n and st.verified == st.emitted
    assert 0 <= st.accepted <= st.proposed and int(st.accepted_per_position.sum()) == st.row_rounds
    assert st.rounds == st.target_calls <= n and (st.target_calls >= 1) == (n >= 1)
    if speculative:
        assert st.target_configurations >= st.proposed + st.row_rounds
        if perfect:
            assert st.accepted == st.proposed  # the coupling keeps a draft equal to the target
    else:
        assert st.target_calls == n and st.proposed == 0
    if every == 1 and n:  # each step: x' = x + dt F(x) / gamma + noise with a finite standardised noise
        x = pos[:, :-1].reshape(-1, N, d)
        with np.errstate(all="ignore"):
            z = (pos[:, 1:].reshape(x.shape) - model.mean(x, force(x))) / model.noise_scale
        assert np.isfinite(z).all()


def _run(fn, model, x0, n, **kw):
    """('ok', simulation) or ('error', exception) for ValueError/TypeError; anything else propagates."""
    try:
        return "ok", fn(model, x0, n, **kw)
    except CLEAR as err:
        return "error", err


# ----------------------------------------------------------------------------------------------
# the cases


def _x0_case(data) -> str:
    """Arbitrary x0 through both samplers, with a sound model and arguments."""
    x0, X, batched, safe = data.draw(initial_configurations())
    fn = data.draw(hs.sampled_from([simulate, speculative_simulate]))
    n = data.draw(hs.sampled_from([0, 1, 3]))
    kind = data.draw(hs.sampled_from(["function", "frozen", "corrected", "perfect"]))
    model = Langevin(force=Force("ok"), draft_force=_drafts(kind, "ok"), dt=0.05)
    kw = {} if fn is simulate else {"lookahead": data.draw(hs.sampled_from([0, 1, 2, "auto"])), "cost_ratio": 0.1}
    outcome, res = _run(fn, model, x0, n, rng=3, **kw)
    if outcome == "error":
        assert not safe, f"valid x0 rejected: {res!r}"
        return "error " + _clear(res)
    assert X is not None, "an invalid x0 was accepted"
    _check_simulation(res, X, batched, n, 1, model, fn is speculative_simulate, kind == "perfect")
    return "ok"


def _arguments_case(data) -> str:
    """n_steps, lookahead, max_lookahead, record_every, cost_ratio, rng, dt/kT/gamma at and beyond bounds.

    Half the cases are all valid; the others make one or two arguments invalid."""
    fn = data.draw(hs.sampled_from([simulate, speculative_simulate]))
    names = [k for k in ARGS if fn is speculative_simulate or k not in ("lookahead", "max_lookahead", "cost_ratio")]
    bad = data.draw(hs.one_of(hs.just(frozenset()), hs.frozensets(hs.sampled_from(names), min_size=1, max_size=2)))
    v = {k: data.draw(hs.sampled_from(ARGS[k][k in bad])) for k in names}
    if v["rng"] == "generator":
        v["rng"] = np.random.default_rng(1)
    dt, kT, gamma = v["dt"], v["kT"], v["gamma"]
    kind = data.draw(hs.sampled_from(["function", "frozen", "corrected", "perfect"]))
    model_ok = not bad & {"dt", "kT", "gamma"} and _model_ok(dt, kT, gamma)
    try:
        model = Langevin(force=Force("ok"), draft_force=_drafts(kind, "ok"), dt=dt, kT=kT, gamma=gamma)
    except CLEAR as err:
        assert not model_ok, f"valid parameters rejected: {err!r}"
        return "model error " + _clear(err)
    assert model_ok, f"invalid parameters accepted: dt={dt!r}, kT={kT!r}, gamma={gamma!r}"
    assert math.isfinite(model.noise_scale) and model.noise_scale > 0
    n = v.pop("n_steps")
    for k in ("dt", "kT", "gamma"):
        v.pop(k)
    X = np.array([[[0.3], [-1.1]], [[1.2], [0.1]]])  # 2 replicas, 2 particles, d = 1
    outcome, res = _run(fn, model, X, n, **v)
    ok = not bad
    if outcome == "error":
        # a wild chain (big noise or an unstable Euler step in the quartic well) may leave the region
        # where the force is finite, or float64: the domain's own error, naming the step
        wild = model.noise_scale > 0.5 or model.dt / model.gamma > 0.1
        left = wild and re.search(r"(not finite|overflows) at step [1-9]", str(res))
        assert not ok or left, f"valid arguments rejected: {res!r}"
        return "error " + _clear(res)
    assert ok, f"invalid arguments accepted: {v}, n_steps={n!r}"
    _check_simulation(res, X, True, int(n), int(v["record_every"]), model, fn is speculative_simulate,
                      kind == "perfect")
    if isinstance(v["rng"], int) and not (v.get("lookahead") == "auto" and v.get("cost_ratio") is None):
        again = fn(Langevin(force=Force("ok"), draft_force=_drafts(kind, "ok"), dt=dt, kT=kT, gamma=gamma),
                   X, n, **v)  # the same int seed: the same simulation
        np.testing.assert_array_equal(again.positions, res.positions)
    return "ok"


def _forces_case(data) -> str:
    """Exact and draft forces that misbehave, every kind of draft, both samplers."""
    fn = data.draw(hs.sampled_from([simulate, speculative_simulate]))
    exact_mode = data.draw(hs.sampled_from(["ok"] * 6 + list(GOOD + LOSSY + NONFINITE + BAD)))
    draft_mode = data.draw(hs.sampled_from(["ok"] * 6 + list(GOOD + LOSSY + NONFINITE + BAD)))
    kind = data.draw(hs.sampled_from(["function", "frozen", "corrected", "perfect"]))
    at, wall = data.draw(hs.integers(1, 6)), data.draw(hs.sampled_from([0.5, 1.0, 1.3]))
    dt = data.draw(hs.sampled_from([0.01, 0.05, 0.2]))
    exact = Force(exact_mode, at=at, wall=wall)
    model = Langevin(force=exact, draft_force=_drafts(kind, draft_mode), dt=dt)
    B, N, d = data.draw(hs.integers(1, 3)), data.draw(hs.integers(1, 3)), data.draw(hs.integers(1, 2))
    X = np.random.default_rng(data.draw(hs.integers(0, 9))).uniform(-1.2, 1.2, (B, N, d))
    n = data.draw(hs.sampled_from([1, 2, 4, 8]))
    kw = {} if fn is simulate else {"lookahead": data.draw(hs.sampled_from([1, 2, 3, 5, "auto"])), "cost_ratio": 0.2}
    outcome, res = _run(fn, model, X, n, rng=5, **kw)
    draft_used = fn is speculative_simulate and kind in ("function", "corrected")
    if outcome == "error":
        name = _clear(res)
        exact_may = exact_mode not in GOOD
        draft_may = draft_used and draft_mode in BAD
        left = dt >= 0.2 and re.search(r"(not finite|overflows) at step [1-9]", str(res))  # unstable Euler step
        assert exact_may or draft_may or left, f"valid forces rejected ({exact_mode}, {draft_mode}, {kind}): {res!r}"
        if exact_mode in NONFINITE and not draft_may:
            assert "not finite at step" in str(res) or "overflows at step" in str(res), res
        return f"error {name}"
    assert exact_mode not in BAD, f"a force returning {exact_mode} was accepted"
    force = Force("huge") if exact_mode == "huge" else WELL
    _check_simulation(res, X, True, n, 1, model, fn is speculative_simulate, kind == "perfect", force)
    if exact_mode == "mutate" or (draft_used and draft_mode == "mutate"):  # the input's copy was written to
        clean = Langevin(force=Force("ok" if exact_mode == "mutate" else exact_mode, at=at, wall=wall),
                         draft_force=_drafts(kind, "ok" if draft_mode == "mutate" else draft_mode), dt=dt)
        np.testing.assert_array_equal(fn(clean, X, n, rng=5, **kw).positions, res.positions)
    return "ok"


def _case(name, runner, data):
    with _Strict():
        CASES[f"{name}: {runner(data)}"] += 1


@settings(max_examples=250)
@given(hs.data())
def test_fuzz_initial_configurations(data):
    _case("x0", _x0_case, data)


@settings(max_examples=300)
@given(hs.data())
def test_fuzz_arguments_and_parameters(data):
    _case("arguments", _arguments_case, data)


@settings(max_examples=400)
@given(hs.data())
def test_fuzz_forces_and_drafts(data):
    _case("forces", _forces_case, data)


@pytest.mark.slow
@settings(max_examples=2500)
@given(hs.data())
def test_fuzz_initial_configurations_slow(data):
    _case("x0 (slow)", _x0_case, data)


@pytest.mark.slow
@settings(max_examples=3000)
@given(hs.data())
def test_fuzz_arguments_and_parameters_slow(data):
    _case("arguments (slow)", _arguments_case, data)


@pytest.mark.slow
@settings(max_examples=4000)
@given(hs.data())
def test_fuzz_forces_and_drafts_slow(data):
    _case("forces (slow)", _forces_case, data)


def test_fuzz_case_counts_are_reported():
    """The fuzz tests above ran (when they ran in this process): print their case counts."""
    if CASES:
        totals = Counter()
        for key, v in CASES.items():
            totals[key.split(":")[0]] += v
        print("\nphysics fuzz cases:", dict(sorted(CASES.items())), "per test", dict(totals))
    assert all(v > 0 for v in CASES.values())
