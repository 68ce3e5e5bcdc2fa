import math

import numpy as np
import pytest
import scipy.stats as st

import speculate as sp
from speculate.distributions import as_distribution


def test_categorical_from_logits_matches_softmax():
    logits = np.array([[0.0, 1.0, -np.inf], [2.0, 2.0, 2.0]], np.float32)
    d = sp.Categorical(logits=logits)
    assert d.dtype == np.float32 and d.batch_shape == (2,)
    np.testing.assert_allclose(d.probs[0], [1 / (1 + math.e), math.e / (1 + math.e), 0.0], rtol=1e-6)
    np.testing.assert_allclose(d[1].probs, [1 / 3] * 3, rtol=1e-6)


def test_categorical_renormalises_within_tolerance():
    d = sp.Categorical(probs=[0.2, 0.3, 0.5 + 5e-7])
    assert d.probs.sum() == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"probs": [0.5, np.nan, 0.5]}, "NaN or inf at index"),
        ({"probs": [0.7, -0.1, 0.4]}, "negative at index"),
        ({"probs": [[0.5, 0.5], [0.2, 0.2]]}, r"sum to 0.4.*batch index \(1,\)"),
        ({"probs": []}, "non-empty last axis"),
        ({"logits": [0.0, np.nan]}, "NaN or \\+inf"),
        ({"logits": [-np.inf, -np.inf]}, "every logit -inf"),
        ({}, "exactly one of"),
        ({"probs": [1.0], "logits": [0.0]}, "exactly one of"),
    ],
)
def test_categorical_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sp.Categorical(**kwargs)


def test_categorical_rejects_non_numeric():
    with pytest.raises(TypeError, match="real numbers"):
        sp.Categorical(probs=["a", "b"])


def test_categorical_sample_and_log_prob():
    rng = np.random.default_rng(0)
    d = sp.Categorical(probs=[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert d.sample(rng).tolist() == [0, 2]
    np.testing.assert_array_equal(d.log_prob(np.array([0, 1])), [0.0, -np.inf])
    assert isinstance(d[0].sample(rng), int)
    with pytest.raises(ValueError, match="outside"):
        d[0].log_prob(3)
    with pytest.raises(TypeError, match="integers"):
        d[0].log_prob(1.5)


def test_normal_batch_and_log_prob():
    loc = np.zeros((2, 3))
    d = sp.Normal(loc, 2.0, batch_ndims=1)
    assert d.batch_shape == (2,) and d.event_shape == (3,)
    y = np.ones((2, 3))
    want = st.norm(0, 2).logpdf(1.0) * 3
    np.testing.assert_allclose(d.log_prob(y), [want, want])
    assert d[1].log_prob(np.ones(3)) == pytest.approx(want)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((np.zeros(3), 0.0), {}, "scale must be finite and > 0"),
        ((np.zeros(3), np.ones(4)), {}, "does not broadcast"),
        ((np.array([0.0, np.inf]), 1.0), {}, "not finite"),
        ((np.zeros(3), 1.0), {"batch_ndims": 2}, "batch_ndims"),
    ],
)
def test_normal_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sp.Normal(*args, **kwargs)


def test_point_mass_and_as_distribution():
    d = sp.PointMass(np.array([1, 2]))
    assert d.log_prob(np.array([1, 2])) == 0.0 and d.log_prob(np.array([2, 1])) == -math.inf
    assert isinstance(as_distribution(3), sp.PointMass)
    assert isinstance(as_distribution("text"), sp.PointMass)
    c = sp.Categorical(probs=[1.0])
    assert as_distribution(c) is c


def test_from_scipy_discrete_and_continuous():
    rng = np.random.default_rng(0)
    pois = sp.from_scipy(st.poisson(3.0))
    assert pois.discrete is True and pois.log_prob(2) == pytest.approx(st.poisson(3.0).logpmf(2))
    assert isinstance(pois.sample(rng), (int, np.integer))
    norm = sp.from_scipy(st.norm(1.0, 2.0))
    assert norm.discrete is False and norm.log_prob(0.5) == pytest.approx(st.norm(1, 2).logpdf(0.5))
    mvn = sp.from_scipy(st.multivariate_normal(np.zeros(2), np.eye(2)))
    assert mvn.sample(rng).shape == (2,)
    with pytest.raises(TypeError, match=r"frozen scipy\.stats"):
        sp.from_scipy(object())


def test_from_torch_maps_to_exact_kinds():
    torch = pytest.importorskip("torch")
    td = torch.distributions
    c = sp.from_torch(td.Categorical(probs=torch.tensor([0.25, 0.75])))
    assert isinstance(c, sp.Categorical) and c.probs.tolist() == [0.25, 0.75]
    n = sp.from_torch(td.Independent(td.Normal(torch.zeros(4, 3), torch.ones(4, 3)), 1))
    assert isinstance(n, sp.Normal) and n.batch_shape == (4,) and n.event_shape == (3,)
    g = sp.from_torch(td.Gamma(torch.tensor(2.0), torch.tensor(1.0)))
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    assert float(g.sample(rng1)) == float(g.sample(rng2))  # torch sampling is seeded from rng
    assert g.discrete is False
    assert as_distribution(td.Categorical(logits=torch.zeros(3))).num_outcomes == 3
    with pytest.raises(TypeError, match=r"torch\.distributions"):
        sp.from_torch(object())


@pytest.mark.parametrize("family", [st.poisson, st.norm, st.multivariate_normal, st.dirichlet])
def test_from_scipy_refuses_an_unfrozen_family(family):
    """Regression: from_scipy(st.poisson) was accepted and failed late inside scipy (rvs without mu)."""
    with pytest.raises(TypeError, match=r"frozen.*freeze it.*scipy\.stats\.poisson\(3\)"):
        sp.from_scipy(family)
    with pytest.raises(TypeError, match="freeze it"):  # also when returned where a distribution is expected
        sp.speculative_sample(family, sp.from_scipy(st.poisson(3)), rng=0)


def test_from_scipy_accepts_frozen_distributions():
    for frozen in (st.poisson(3), st.norm(), st.multivariate_normal(np.zeros(2), np.eye(2)), st.dirichlet([1, 2])):
        assert sp.from_scipy(frozen).frozen is frozen


def test_float16_probabilities_use_a_float16_tolerance():
    """Fuzzing: float16 probabilities rounded from a normalised law (sum 1.0001) were refused with
    the float64 tolerance 1e-6; the tolerance now follows the dtype given (1e-2 for float16)."""
    p16 = np.array([0.1, 0.2, 0.7], np.float16)
    assert abs(float(p16.astype(np.float64).sum()) - 1) > 1e-6
    d = sp.Categorical(probs=p16)
    assert d.dtype == np.float64 and d.probs.sum() == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ValueError, match=r"within 0\.01"):
        sp.Categorical(probs=np.array([0.1, 0.2, 0.75], np.float16))
    with pytest.raises(ValueError, match="within 1e-06"):  # integers and float64 keep 1e-6
        sp.Categorical(probs=np.array([1, 1]))


@pytest.mark.parametrize("atol", [-1.0, float("nan"), float("inf"), "1e-3"])
def test_categorical_rejects_a_bad_tolerance(atol):
    with pytest.raises(ValueError, match="atol"):
        sp.Categorical(probs=[0.5, 0.5], atol=atol)


def test_categorical_log_prob_checks_the_outcome_shape():
    """Fuzzing: an outcome array of the wrong shape raised numpy's IndexError from take_along_axis."""
    d = sp.Categorical(probs=np.full((2, 3), 1 / 3))
    with pytest.raises(ValueError, match=r"outcome of shape \(3,\) does not match .* batch shape \(2,\)"):
        d.log_prob(np.arange(3))
    with pytest.raises(ValueError, match="batch shape"):
        d[0].log_prob(np.array([1]))
    with pytest.raises(ValueError, match="batch shape"):  # through the engine: a clear error, not IndexError
        sp.speculative_sample(d, sp.PointMass(np.arange(3)), rng=0)


def test_normal_checks_batch_ndims_and_never_samples_nan():
    with pytest.raises(TypeError, match="batch_ndims must be an int"):
        sp.Normal(np.zeros((2, 3)), 1.0, batch_ndims=1.5)
    with pytest.raises(TypeError, match="batch_ndims must be an int"):
        sp.Normal(np.zeros((2, 3)), 1.0, batch_ndims=True)
    # fuzzing: an unvalidated NaN loc was sampled into NaN outcomes (a chain with lookahead 0)
    bad = sp.Normal(np.array([0.0, np.nan]), 1.0, validate=False)
    with pytest.raises(ValueError, match=r"not finite at index \(1,\).*validate=False"):
        bad.sample(np.random.default_rng(0))
    # far tails: the log density is -inf (no overflow warning, no NaN)
    with np.errstate(all="raise"):
        assert sp.Normal(0.0, 1e-300).log_prob(1.0) == -math.inf


def test_byte_swapped_probabilities_are_read_in_native_order():
    big = np.array([[0.25, 0.75], [0.5, 0.5]], dtype=">f8")
    d = sp.Categorical(probs=big)
    assert d.probs.dtype.isnative and d.probs.tolist() == big.tolist()
    assert d.sample(np.random.default_rng(0)).shape == (2,)


def test_a_kept_normal_draft_comes_back_unrounded_whatever_the_loc_dtype():
    """float32 locs with unequal scales (the general route, batch axes): the kept draft is the draft."""
    p = sp.Normal(np.zeros((64, 2), np.float32), 1.0, batch_ndims=1)
    q = sp.Normal(np.full((64, 2), 0.1, np.float32), 1.3, batch_ndims=1)
    x = q.sample(np.random.default_rng(1))
    y, kept = sp.speculative_sample(p, q, rng=2, draft=x)
    assert kept.any() and y.dtype == np.float64
    np.testing.assert_array_equal(y[kept], np.asarray(x, np.float64)[kept])


def test_half_a_distribution_is_refused_not_taken_as_a_value():
    """Regression: an object with sample but log_prob misspelt (or scipy's rvs / logpdf) was silently a
    point mass, so the law of the draw was wrong."""

    class Typo:
        def sample(self, rng):
            return int(rng.integers(3))

        def logprob(self, y):
            return -math.log(3)

    class ScipyStyle:
        def rvs(self, random_state=None):
            return 0.0

        def logpdf(self, y):
            return 0.0

    with pytest.raises(TypeError, match=r"sample, logprob but not the distribution protocol.*log_prob"):
        sp.speculative_sample(Typo(), sp.Categorical(probs=[0.5, 0.25, 0.25]), rng=0)
    with pytest.raises(TypeError, match=r"rvs, logpdf.*from_scipy"):
        as_distribution(ScipyStyle())
    assert isinstance(as_distribution(np.array([1, 2])), sp.PointMass)  # plain values stay point masses


def test_from_scipy_multivariate_outcomes_have_the_event_shape():
    """Regression: dirichlet failed with scipy's shape error, multinomial samples gained an axis."""
    rng = np.random.default_rng(0)
    for frozen, shape in ((st.dirichlet([1, 2, 3]), (3,)), (st.multinomial(5, [0.2, 0.8]), (2,)),
                          (st.multivariate_normal(np.zeros(2), np.eye(2)), (2,))):
        d = sp.from_scipy(frozen)
        y = d.sample(rng)
        assert np.shape(y) == shape and np.isfinite(d.log_prob(y))
        y2, _ = sp.speculative_sample(d, d, rng=1)
        assert np.shape(y2) == shape


def test_from_scipy_multinomial_residual_law():
    """verify_one with p = multinomial(5, [.2, .8]) and q = multinomial(5, [.5, .5]): the first count
    is Binomial(5, 0.2). 40000 draws, chi-square at ALPHA = 1e-6 over 6 cells: catches a TV of 0.03
    with probability 0.99 (chi2_sample_size(0.03, 6) = 23000)."""
    from speculate.testing import DEFAULT_ALPHA, assert_categorical_matches, chi2_sample_size

    n = 40000
    assert chi2_sample_size(0.03, 6, alpha=DEFAULT_ALPHA, power=0.99) <= n
    p, q = sp.from_scipy(st.multinomial(5, [0.2, 0.8])), sp.from_scipy(st.multinomial(5, [0.5, 0.5]))
    rng = np.random.default_rng(7)
    first = [int(sp.speculative_sample(p, q, rng=rng)[0][0]) for _ in range(n)]
    assert_categorical_matches(first, st.binom(5, 0.2).pmf(np.arange(6)))


def test_outcomes_have_one_documented_type():
    """Regression: the same kind of draw came back as a Tensor, a 0-d array, numpy scalars or an int by
    accident. Scalar draws are Python int / float; draws with batch or event axes NumPy arrays; torch
    distributions' samples NumPy / Python too; a point mass's value as given."""
    torch = pytest.importorskip("torch")
    td = torch.distributions
    scalar = {
        "categorical": (sp.Categorical(probs=[0.5, 0.5]), int),
        "normal": (sp.Normal(0.0, 1.0), float),
        "scipy norm": (sp.from_scipy(st.norm()), float),
        "scipy poisson": (sp.from_scipy(st.poisson(3)), int),
        "torch categorical": (sp.from_torch(td.Categorical(probs=torch.tensor([0.5, 0.5]))), int),
        "torch gamma": (sp.from_torch(td.Gamma(torch.tensor(2.0), torch.tensor(1.0))), float),
        "torch normal": (sp.from_torch(td.Normal(torch.tensor(0.0), torch.tensor(1.0))), float),
    }
    for name, (d, kind) in scalar.items():
        y, kept = sp.speculative_sample(d, d, rng=0)
        assert type(y) is kind and type(kept) is bool, (name, type(y), type(kept))
        res = sp.speculate(lambda x, d=d: d, lambda x, d=d: d, lambda v: type(v), None, rng=0)
        assert type(res.sample) is kind and res.value is kind, (name, res)
    arrays = [sp.Categorical(probs=[[0.5, 0.5]] * 3), sp.Normal(np.zeros(2), 1.0), sp.from_scipy(st.dirichlet([1, 2])),
              sp.from_torch(td.Dirichlet(torch.tensor([1.0, 2.0])))]
    for d in arrays:
        assert isinstance(sp.speculative_sample(d, d, rng=0)[0], np.ndarray), d
    assert sp.speculative_sample(sp.PointMass((1, 2)), sp.PointMass((1, 2)), rng=0)[0] == (1, 2)


def test_a_plain_value_with_a_sample_method_is_still_a_value():
    """A value that happens to have a ``sample`` method (a pandas DataFrame) is a point mass, as
    before; only density methods next to a sampler, ``log_prob`` alone or scipy's ``rvs`` look like
    a distribution that misses the protocol."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": [1, 2]})
    assert isinstance(as_distribution(frame), sp.PointMass)

    class OnlyLogProb:
        def log_prob(self, y):
            return 0.0

    with pytest.raises(TypeError, match="log_prob but not the distribution protocol"):
        as_distribution(OnlyLogProb())
