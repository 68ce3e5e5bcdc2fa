"""Fuzzing the public verification entry points ``speculate.verify.verify_*`` and their NumPy twins.

Hypothesis draws arbitrary batches: B = 0..4 rows (0: an empty batch), K = 0..4 positions, m = 1..3
branches, V from 1 to 600 (and 100 000 with a sparse support), dtypes float16/32/64 (native and
byte-swapped), int8/int64/uint8 and bool (one-hot rows), complex and object arrays; then spoils
them: NaN, +inf, -inf or a negative value at a drafted entry, in a row the kernel reads or in one
it does not, unnormalised and all-zero rows, drafts outside 0..V-1 (or with q = 0, or not
integers), lengths below 0 or above K, uniforms outside [0, 1) or NaN, shapes that do not match.

Every call must either return a result that could be exact: n_accepted in 0..length, next outcomes
in 0..V-1 with positive target mass at their position (and every kept draft with positive target
mass; greedy: the first argmax), the surviving branch in 0..m-1, the Gaussian outcome finite; the
Numba kernel (serial and threaded) and its NumPy twin bit for bit the same; or raise ``ValueError``
/ ``TypeError`` whose message names the problem, the kernel and its twin alike. Never a NaN, an
out-of-range id, another exception (a crash inside a kernel) or a hang. An input with nothing
wrong must return. ``hypothesis.event`` records what each example did: run pytest with
``--hypothesis-show-statistics`` to see the counts.

These tests are not statistical (the exact laws are in test_core_kernel_laws.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as hs

from speculate import verify as V
from speculate._inverse_cdf import tiny_for

# what an error message must mention: the argument or the kind of problem
_NAMES = re.compile(
    r"lengths|outside 0\.\.|q = 0|NaN|inf|negative|no positive mass|shape|axes|must|dtype|integers|"
    r"position|branch|finite|overflow|scale|z_next",
)

_FLOATS = ["float16", "float32", "float64", ">f8", ">f4"]
_INTS = ["int8", "int64", "uint8", "bool"]
_SPOIL = [
    "none",
    "none",
    "nan",
    "inf",
    "-inf",
    "negative",
    "negative_q",
    "scaled",
    "zero_row",
    "draft_out_of_range",
    "draft_q_zero",
    "length",
    "uniform",
    "shape",
    "float_drafts",
    "complex",
    "object",
]


def _rows(rng, shape, V, kind):
    """Probability rows [*shape, V]: Dirichlet, sparse (2 or 3 outcomes), or one-hot."""
    n = int(np.prod(shape, dtype=np.int64))
    out = np.zeros((n, V))
    for r in range(n):
        if kind == "onehot" or V == 1:
            out[r, rng.integers(V)] = 1.0
        elif kind == "sparse":
            idx = rng.choice(V, size=min(V, int(rng.integers(2, 4))), replace=False)
            out[r, idx] = rng.dirichlet(np.ones(len(idx)))
        else:
            out[r] = rng.dirichlet(np.full(V, 0.5))
    return out.reshape(*shape, V)


def _sample(rng, q):
    """Drafts drawn from the rows of q (float64 copies), as int64 [*q.shape[:-1]]."""
    flat = np.asarray(q, np.float64).reshape(-1, q.shape[-1])
    out = np.zeros(len(flat), np.int64)
    for r, row in enumerate(flat):
        if np.all(np.isfinite(row)) and np.all(row >= 0) and row.sum() > 0:
            out[r] = rng.choice(len(row), p=row / row.sum())
    return out.reshape(q.shape[:-1])


@hs.composite
def categorical_inputs(draw, multi=False, huge=False):
    """Arguments of verify_token/block/greedy (multi=False) or verify_multi, and whether nothing is wrong."""
    # the sizes and the kind of spoiling come from the seed, so that every kind is tried about equally
    # often (Hypothesis's own draws favour the first choice); B = 0 and K = 0 one time in 8 each
    rng = np.random.default_rng(draw(hs.integers(0, 2**32 - 1)))
    B = int(rng.integers(1, 5)) if rng.random() > 1 / 8 else 0
    K = (int(rng.integers(1, 5 if not huge else 3))) if rng.random() > 1 / 8 else 0
    m = int(rng.integers(1, 4)) if multi else 1
    Vn = 100_000 if huge else int(rng.choice([1, 2, 3, 7, 257, 600]))
    dtype = str(rng.choice(_FLOATS)) if rng.random() < 0.75 else str(rng.choice(_INTS))
    spoil = _SPOIL[int(rng.integers(len(_SPOIL)))]
    kind = "onehot" if dtype in _INTS else ("sparse" if huge else str(rng.choice(["dirichlet", "sparse"])))
    lead = (B, m) if multi else (B,)
    p = _rows(rng, (*lead, K + 1), Vn, kind)
    q = _rows(rng, (*lead, K), Vn, kind)
    if multi:  # the branches' rows do not depend on the drafts: consistent for any drafts
        p[:] = p[:, :1]
        q[:] = q[:, :1]
    p, q = p.astype(dtype), q.astype(dtype)  # float16 may round a small q to 0: that draft is then bad
    drafts = _sample(rng, q)
    lengths = rng.integers(0, K + 1, lead) if draw(hs.booleans()) or multi else None
    ushape = (B, K, m) if multi else (B, K)
    edge = draw(hs.sampled_from(["random", "zeros", "near_one"]))
    u = {"random": rng.random(ushape), "zeros": np.zeros(ushape), "near_one": np.full(ushape, 1 - 2**-53)}[edge]
    u_next = rng.random(B) if edge == "random" else np.full(B, 0.0 if edge == "zeros" else 1 - 2**-53)
    if spoil in ("nan", "inf", "-inf", "negative") and B and dtype not in _INTS:
        value = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "negative": -0.25}[spoil]
        target = q if (K and draw(hs.booleans())) else p
        at = tuple(int(rng.integers(s)) for s in target.shape)
        if draw(hs.booleans()):  # an entry the verifier reads: the first draft's, or the first row's
            lead_at = at[: len(lead)]
            at = (*lead_at, 0, int(drafts[(*lead_at, 0)]) if K else at[-1])
        target[at] = value
    elif spoil == "negative_q" and q.size and dtype not in ("uint8", "bool"):
        at = tuple(int(rng.integers(s)) for s in q.shape)
        q[at] = -q.dtype.type(1) if dtype in _INTS else -0.5
    elif spoil == "scaled" and dtype not in _INTS:
        with np.errstate(over="ignore"):  # 1e30 overflows float16 and float32 to inf: spoiled too
            p = (p.astype(np.float64) * draw(hs.sampled_from([0.5, 3.0, 1e-30, 1e30]))).astype(dtype)
    elif spoil == "zero_row" and p.size:
        p.reshape(-1, Vn)[int(rng.integers(p.size // Vn))] = 0
    elif spoil == "draft_out_of_range" and drafts.size:
        drafts.flat[int(rng.integers(drafts.size))] = draw(hs.sampled_from([-1, Vn, Vn + 7, -(2**40), 2**62]))
    elif spoil == "draft_q_zero" and drafts.size and Vn > 1:
        at = tuple(int(rng.integers(s)) for s in drafts.shape)
        q[(*at, int(drafts[at]))] = 0
    elif spoil == "length":
        bad = draw(hs.sampled_from([-1, K + 1, K + 5, -(2**40)]))
        lengths = np.full(lead, bad) if B else rng.integers(0, K + 1, lead)
    elif spoil == "uniform" and (u.size or B):
        bad = draw(hs.sampled_from([1.0, -0.1, np.nan, 1.5]))
        if u.size and draw(hs.booleans()):
            u.flat[int(rng.integers(u.size))] = bad
        elif B:
            u_next[int(rng.integers(B))] = bad
        else:
            spoil = "none"
    elif spoil == "shape":
        which = draw(hs.sampled_from(["q", "drafts", "u", "p"]))
        if which == "q":  # one position too many
            q = np.concatenate([q, np.zeros((*lead, 1, Vn), q.dtype)], axis=-2)
        elif which == "drafts":
            drafts = drafts[..., None]
        elif which == "u":
            u = u[..., None]
        else:
            p = p[..., None]
    elif spoil == "float_drafts" and drafts.size:
        drafts = drafts.astype(np.float64) + 0.5
    elif spoil == "complex":
        p = p.astype(np.complex128)
    elif spoil == "object":
        q = q.astype(object)
    else:
        spoil = "none"
    return {"args": (p, q, drafts, lengths, u, u_next), "spoil": spoil, "multi": multi, "V": Vn, "K": K}


def _valid(args, multi) -> bool:
    """Nothing wrong: a correct call that must return."""
    p, q, drafts, lengths, u, un = args
    if p.dtype.kind not in "biuf" or q.dtype.kind not in "biuf" or np.asarray(drafts).dtype.kind not in "iu":
        return False
    p64, q64 = np.asarray(p, np.float64), np.asarray(q, np.float64)
    nd = 4 if multi else 3
    if p64.ndim != nd or q64.shape != (*p64.shape[:-2], p64.shape[-2] - 1, p64.shape[-1]):
        return False
    if drafts.shape != q64.shape[:-1] or u.shape != (
        (q64.shape[0], q64.shape[2], q64.shape[1]) if multi else q64.shape[:-1]
    ):
        return False
    for a in (p64, q64):
        if not (np.all(np.isfinite(a)) and np.all(a >= 0)):
            return False
        s = a.sum(-1)
        if a.size and not np.allclose(s, 1.0, atol=1e-2):
            return False
    if not (np.all(np.isfinite(u)) and np.all((u >= 0) & (u < 1)) and np.all((un >= 0) & (un < 1))):
        return False
    if drafts.size:
        if drafts.min() < 0 or drafts.max() >= p64.shape[-1]:
            return False
        if np.any(np.take_along_axis(q64, drafts[..., None], -1) <= 0):
            return False
    K = q64.shape[-2]
    return lengths is None or (np.asarray(lengths).min(initial=0) >= 0 and np.asarray(lengths).max(initial=0) <= K)


def _call(fn, *args, **kw):
    """('ok', outputs) or ('err', type, message); any other exception propagates (a crash)."""
    try:
        return ("ok", fn(*args, **kw))
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert msg and _NAMES.search(msg), f"{fn.__name__}: unclear message {msg!r}"
        return ("err", type(e), msg)


def _agree(results, label):
    kinds = {r[0] for r in results}
    assert len(kinds) == 1, f"{label}: the kernels disagree: {results}"
    if kinds == {"err"}:
        assert len({r[1] for r in results}) == 1, f"{label}: different exception types: {results}"
        event(f"{label}: raised {results[0][1].__name__}")
        return None
    first = results[0][1]
    for r in results[1:]:
        for a, b in zip(first, r[1], strict=True):
            np.testing.assert_array_equal(a, b)
    event(f"{label}: returned")
    return first


def _check_token_like(args, out, rule):
    p, q, drafts, lengths, _, _ = args
    p64 = np.asarray(p, np.float64)
    B, K1 = p64.shape[:2]
    L = np.full(B, K1 - 1) if lengths is None else np.asarray(lengths)
    n, nxt = out
    assert n.shape == nxt.shape == (B,)
    assert np.all((n >= 0) & (n <= L)), (n, L)
    assert np.all((nxt >= 0) & (nxt < p64.shape[-1])), nxt
    for b in range(B):
        for i in range(int(n[b])):  # a kept draft has positive target mass (u q < p needs p > 0)
            assert p64[b, i, drafts[b, i]] > 0, (rule, b, i)
        row = p64[b, n[b]]
        assert row[nxt[b]] > 0, (rule, b, "next outcome without target mass")
        if rule == "greedy":
            assert nxt[b] == int(np.argmax(row)), (b, "greedy: not the first argmax")
            assert all(drafts[b, i] == int(np.argmax(p64[b, i])) for i in range(int(n[b])))
        elif rule == "token" and n[b] < L[b]:  # the residual (p - q)+, or p when it is rounding noise
            r = row - np.asarray(q, np.float64)[b, n[b]]
            native = np.asarray(p).dtype.newbyteorder("=")
            tiny = tiny_for(native if native in (np.float32, np.float64) else np.float64)
            assert r[nxt[b]] > 0 or np.clip(r, 0, None).sum() <= 2 * tiny, b


@settings(max_examples=800)
@given(categorical_inputs())
def test_fuzz_token_block_greedy(inp):
    """800 examples: verify_token / verify_block (kernel serial, threaded, twin) and verify_greedy
    (kernel, twin) on every spoiled input: exact-looking results or a clear ValueError/TypeError."""
    args, valid = inp["args"], _valid(inp["args"], False)
    event(f"spoil: {inp['spoil']}")
    for rule, fns in [
        ("token", (V.verify_token, V.verify_token_reference)),
        ("block", (V.verify_block, V.verify_block_reference)),
    ]:
        res = [_call(fns[0], *args, parallel=False), _call(fns[0], *args, parallel=True), _call(fns[1], *args)]
        out = _agree(res, rule)
        assert out is not None or not valid, f"{rule} raised on a correct input: {res[0]}"
        if out is not None:
            _check_token_like(args, out, rule)
    p, _, drafts, lengths, _, _ = args
    out = _agree(
        [_call(V.verify_greedy, p, drafts, lengths), _call(V.verify_greedy_reference, p, drafts, lengths)], "greedy"
    )
    if out is not None:
        _check_token_like(args, out, "greedy")


@settings(max_examples=50)
@given(categorical_inputs(huge=True))
def test_fuzz_token_block_huge_vocabulary(inp):
    """50 examples at V = 100 000 with 2 or 3 outcomes of positive mass per row (far apart)."""
    args, valid = inp["args"], _valid(inp["args"], False)
    for rule, fns in [
        ("token", (V.verify_token, V.verify_token_reference)),
        ("block", (V.verify_block, V.verify_block_reference)),
    ]:
        out = _agree([_call(fns[0], *args), _call(fns[1], *args)], rule)
        assert out is not None or not valid, f"{rule} raised on a correct input"
        if out is not None:
            _check_token_like(args, out, rule)


@settings(max_examples=500)
@given(categorical_inputs(multi=True))
def test_fuzz_multi(inp):
    """500 examples: verify_multi (serial, threaded) and its twin, m = 1..3 branches."""
    args, valid = inp["args"], _valid(inp["args"], True)
    event(f"spoil: {inp['spoil']}")
    fn, ref = V.verify_multi, V.verify_multi_reference
    out = _agree([_call(fn, *args, parallel=False), _call(fn, *args, parallel=True), _call(ref, *args)], "multi")
    assert out is not None or not valid, "multi raised on a correct input"
    if out is None:
        return
    p, _, drafts, lengths, _, _ = args
    p64 = np.asarray(p, np.float64)
    n, nxt, branch = out
    B, m = p64.shape[:2]
    assert np.all((branch >= 0) & (branch < m))
    for b in range(B):
        j, nb = int(branch[b]), int(n[b])
        assert 0 <= nb <= lengths[b, j]
        assert 0 <= nxt[b] < p64.shape[-1]
        prefix = drafts[b, j, :nb]  # the kept prefix: the surviving branch's first n drafts
        for i in range(nb + 1):
            # the row read at depth i: the first branch that agrees with the prefix so far
            j0 = min(jj for jj in range(m) if lengths[b, jj] >= i and np.array_equal(drafts[b, jj, :i], prefix[:i]))
            x = prefix[i] if i < nb else nxt[b]
            assert p64[b, j0, i, x] > 0, (b, i, "an outcome without target mass")
        assert j0 == j


# ------------------------------------------------------------------------ Gaussian
@hs.composite
def gaussian_inputs(draw):
    B = draw(hs.integers(0, 4))
    K = draw(hs.integers(0, 3))
    D = draw(hs.sampled_from([0, 1, 2, 5]))
    rng = np.random.default_rng(draw(hs.integers(0, 2**32 - 1)))
    loc_q = rng.normal(size=(B, K, D)) * draw(hs.sampled_from([1.0, 1e3]))
    loc_p = np.concatenate(
        [loc_q + rng.normal(size=(B, K, D)) * draw(hs.sampled_from([0.0, 1e-9, 0.5, 8.0])), rng.normal(size=(B, 1, D))],
        1,
    )
    scale_kind = draw(hs.sampled_from(["scalar", "array", "per_dim"]))
    scale = {
        "scalar": np.float64(draw(hs.sampled_from([1.0, 1e-3, 7.0]))),
        "array": np.exp(rng.normal(size=(B, K + 1, D))),
        "per_dim": np.exp(rng.normal(size=(D,))),
    }[scale_kind]
    s_full = np.broadcast_to(scale, (B, K + 1, D))
    drafts = loc_q + s_full[:, :K] * rng.normal(size=(B, K, D))
    lengths = rng.integers(0, K + 1, B) if draw(hs.booleans()) else None
    u = rng.random((B, K)) if draw(hs.booleans()) else np.full((B, K), 1 - 2**-53)
    z = rng.normal(size=(B, D))
    kinds = ["none", "none", "nan", "inf", "huge", "scale", "z_next", "length", "uniform", "shape", "dtype"]
    spoil = kinds[int(rng.integers(len(kinds)))]  # from the seed: every kind equally often
    arrays = {"loc_p": loc_p, "loc_q": loc_q, "drafts": drafts}
    if spoil in ("nan", "inf", "huge"):
        name = draw(hs.sampled_from(sorted(arrays)))
        a = arrays[name]
        if a.size:
            a.flat[int(rng.integers(a.size))] = {"nan": np.nan, "inf": -np.inf, "huge": 1e308}[spoil]
    elif spoil == "scale":
        scale = np.array(s_full, copy=True)
        if scale.size:
            scale.flat[int(rng.integers(scale.size))] = draw(hs.sampled_from([0.0, -1.0, np.nan, np.inf]))
    elif spoil == "z_next" and z.size:
        z.flat[int(rng.integers(z.size))] = draw(hs.sampled_from([np.nan, np.inf]))
    elif spoil == "length" and B:
        lengths = np.full(B, draw(hs.sampled_from([-1, K + 1])))
    elif spoil == "uniform" and u.size:
        u.flat[0] = draw(hs.sampled_from([np.nan, 1.0, -0.5]))
    elif spoil == "shape":
        drafts = drafts[:, :, :0] if D else drafts[:, :, None, 0:0]
    elif spoil == "dtype":
        arrays["loc_q"] = loc_q.astype(np.complex128)
    else:
        spoil = "none"
    return {
        "args": (
            arrays["loc_p"],
            arrays["loc_q"],
            scale,
            arrays["drafts"] if spoil != "shape" else drafts,
            lengths,
            u,
            z,
        ),
        "spoil": spoil,
    }


@settings(max_examples=600)
@given(gaussian_inputs())
def test_fuzz_gaussian(inp):
    """600 examples: verify_gaussian (serial, threaded) and its twin, D = 0..5, scalar, per-position
    and per-coordinate scales: n in 0..length and a finite outcome of shape [B, D], or a clear
    ValueError/TypeError; a correct input returns."""
    args = inp["args"]
    event(f"spoil: {inp['spoil']}")
    fn, ref = V.verify_gaussian, V.verify_gaussian_reference
    out = _agree([_call(fn, *args, parallel=False), _call(fn, *args, parallel=True), _call(ref, *args)], "gaussian")
    loc_p, _, _, _, lengths, _, _ = args
    if out is None:
        assert inp["spoil"] != "none", "gaussian raised on a correct input"
        return
    n, y = out
    B, K1, D = np.asarray(loc_p).shape
    L = np.full(B, K1 - 1) if lengths is None else lengths
    assert n.shape == (B,) and y.shape == (B, D)
    assert np.all((n >= 0) & (n <= L))
    assert np.all(np.isfinite(y)), "a non-finite outcome was returned"


# ------------------------------------------------------------------------ the bugs it found
@pytest.mark.parametrize("fn", [V.verify_greedy, V.verify_greedy_reference])
def test_greedy_row_without_mass_is_an_error(fn):
    """Found by fuzzing: greedy returned outcome 0 (probability 0) for an all-zero row, and the
    largest of negative values; now a ValueError naming the row."""
    with pytest.raises(ValueError, match=r"row 0, position 0: a probability row has no positive mass"):
        fn(np.zeros((1, 1, 3)), np.zeros((1, 0), np.int64))
    with pytest.raises(ValueError, match=r"negative .*p\[0, 0, 0\] = -1\.0"):
        fn(np.array([[[-1.0, -0.5, -2.0]]]), np.zeros((1, 0), np.int64))


@pytest.mark.parametrize("fn", [V.verify_token, V.verify_token_reference, V.verify_block, V.verify_block_reference])
def test_negative_draft_probability_in_the_residual_is_an_error(fn):
    """Found by fuzzing: q < 0 at an outcome where p = 0 gave it residual mass, so the kernel
    emitted an outcome of target probability 0; a negative p at the drafted outcome was silently
    rejected. Both are now a ValueError naming the entry."""
    p, q = np.array([[[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]]), np.array([[[0.9, 0.6, -0.5]]])
    with pytest.raises(ValueError, match=r"negative value \(q\[0, 0, 2\] = -0\.5\)"):
        fn(p, q, np.array([[0]]), None, np.array([[0.99]]), np.array([0.99]))
    p, q = np.array([[[-0.5, 1.5, 0.0], [0.5, 0.5, 0.0]]]), np.array([[[0.5, 0.5, 0.0]]])
    with pytest.raises(ValueError, match=r"negative value"):
        fn(p, q, np.array([[0]]), None, np.array([[0.0]]), np.array([0.5]))
    p = np.array([[[0.5, 0.5], [1.5, -0.5]]])  # the bonus row, read when every draft is kept
    with pytest.raises(ValueError, match=r"p\[0, 1, 1\] = -0\.5"):
        fn(p, np.array([[[0.5, 0.5]]]), np.array([[0]]), None, np.zeros((1, 1)), np.array([0.5]))


@pytest.mark.parametrize("fn", [V.verify_gaussian, V.verify_gaussian_reference])
def test_gaussian_non_finite_outcome_coordinates_are_errors(fn):
    """Found by fuzzing: only coordinate 0 of the bonus outcome was checked, so a NaN location (or
    z_next) in coordinate 1 came back as a NaN outcome; and with D = 0 the twin crashed
    (IndexError) and the kernel read out of bounds."""
    lp = np.zeros((1, 2, 2))
    lp[0, 1, 1] = np.nan
    args = (np.zeros((1, 1, 2)), 1.0, np.zeros((1, 1, 2)), None, np.zeros((1, 1)))
    with pytest.raises(ValueError, match=r"row 0, position 1: .*NaN.*loc_p\[0, 1, 1\] = nan"):
        fn(lp, *args, np.zeros((1, 2)))
    with pytest.raises(ValueError, match="z_next"):
        fn(np.zeros((1, 2, 2)), *args, np.array([[0.0, np.nan]]))
    # finite inputs whose reflection overflows (2 z.e / |e|^2 = -inf) came back as inf
    lp, lq, x = np.array([[[1.0], [0.0]]]), np.zeros((1, 1, 1)), np.full((1, 1, 1), -1e308)
    with pytest.raises(ValueError, match=r"row 0, position 0: .*overflows"):
        fn(lp, lq, 1.0, x, None, np.full((1, 1), 0.999), np.zeros((1, 1)))
    n, y = fn(
        np.zeros((2, 2, 0)), np.zeros((2, 1, 0)), 1.0, np.zeros((2, 1, 0)), None, np.zeros((2, 1)), np.zeros((2, 0))
    )
    assert n.tolist() == [1, 1] and y.shape == (2, 0)


def test_byte_swapped_arrays_give_the_same_results():
    """Found by fuzzing: big-endian float arrays ('>f8', '>f4') passed the dtype check, then the
    Numba kernels failed to compile (TypingError) and the twins' rounding threshold lookup raised
    KeyError. They are now converted to native order: the same results as native arrays."""
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(5), (3, 3)), rng.dirichlet(np.ones(5), (3, 2))
    d, u, un = _sample(rng, q), rng.random((3, 2)), rng.random(3)
    for dt in (">f8", ">f4"):
        for fn in (V.verify_token, V.verify_block, V.verify_token_reference, V.verify_block_reference):
            want = fn(p.astype(dt.replace(">", "<")), q.astype(dt.replace(">", "<")), d, None, u, un)
            got = fn(p.astype(dt), q.astype(dt), d, None, u, un)
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)
        for fn in (V.verify_greedy, V.verify_greedy_reference):
            np.testing.assert_array_equal(fn(p.astype(dt), d)[1], fn(p.astype(dt.replace(">", "<")), d)[1])
        pm, qm = np.stack([p, p], 1).astype(dt), np.stack([q, q], 1).astype(dt)
        dm, um = np.stack([d, d], 1), np.stack([u, u], 2)
        n, nxt, _ = V.verify_multi(pm, qm, dm, np.full((3, 2), 2), um, un)
        assert np.all((n >= 0) & (n <= 2)) and np.all((nxt >= 0) & (nxt < 5))
