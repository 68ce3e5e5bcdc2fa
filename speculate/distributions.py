"""Distributions the engine verifies: Categorical, Normal, PointMass, and adapters for scipy and torch.

Every distribution follows a small protocol (see :class:`Distribution`): ``sample(rng)`` and
``log_prob(y)``, plus an optional ``discrete`` flag. The engine recognises the built-in kinds and
uses the exact residual for each: normalised ``(p - q)+`` for Categorical, reflection maximal
coupling for two Normals with equal scale, rejection from ``p`` for anything else.

>>> import numpy as np, speculate as sp
>>> p = sp.Categorical(probs=[0.5, 0.25, 0.25])
>>> p.sample(np.random.default_rng(0)) in (0, 1, 2)
True
>>> float(np.exp(p.log_prob(1)))
0.25
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._inverse_cdf import check_probs, draw_rows

__all__ = [
    "Categorical",
    "Distribution",
    "Normal",
    "PlainValueWarning",
    "PointMass",
    "as_distribution",
    "from_scipy",
    "from_torch",
]

# how far a row's sum may stray from 1 (then renormalised exactly), by the dtype the caller gave:
# float16 rounds each probability to 2^-11 relative (a correctly rounded law sums within 5e-4 of 1)
_SUM_TOLERANCE = {np.dtype(np.float16): 1e-2, np.dtype(np.float32): 1e-4}
_DEFAULT_SUM_TOLERANCE = 1e-6  # float64, integers, booleans


def _sum_tolerance(dtype: np.dtype) -> float:
    return _SUM_TOLERANCE.get(np.dtype(dtype), _DEFAULT_SUM_TOLERANCE)


@runtime_checkable
class Distribution(Protocol):
    """The protocol a user's distribution follows.

    Required: ``sample(rng)`` returns one outcome using the numpy Generator ``rng`` (and no other
    source of randomness, so that seeds reproduce); ``log_prob(y)`` returns the log density (continuous)
    or log mass (discrete) of ``y`` as a float, ``-inf`` outside the support.

    Optional: ``discrete`` (bool): True for a mass function, False for a density. Draft and target
    must agree; when absent, they are assumed to be of the same kind.
    """

    def sample(self, rng: np.random.Generator) -> Any: ...

    def log_prob(self, y: Any) -> float: ...


def _as_array(x: Any, what: str) -> np.ndarray:
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{what} must be real numbers (a float or int array), got dtype {arr.dtype}")
    return arr


def _as_float_array(x: Any, what: str) -> np.ndarray:
    """float32 and float64 as given; other real dtypes (float16, ints, bools) as float64."""
    arr = _as_array(x, what)
    if arr.dtype.kind == "f" and arr.dtype.itemsize in (4, 8):
        return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))  # kernels read native order
    return arr.astype(np.float64)


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _explain_bad_probs(pr: np.ndarray, sums: np.ndarray, tol: float) -> None:
    bad = ~np.isfinite(pr)
    if bad.any():
        raise ValueError(f"Categorical probs contain NaN or inf at index {_first_index(bad)}")
    neg = pr < 0
    if neg.any():
        i = _first_index(neg)
        raise ValueError(f"Categorical probs are negative at index {i}: {pr[i]}")
    off = np.atleast_1d(np.abs(sums - 1.0) > tol)
    i = _first_index(off)
    where = f" (batch index {i})" if pr.ndim > 1 else ""
    raise ValueError(
        f"Categorical probs sum to {float(np.atleast_1d(sums)[i])!r}{where}, not 1 within {tol}: "
        "pass normalised probabilities, or logits="
    )


class Categorical:
    """A categorical distribution over outcomes ``0..V-1`` (last axis), with optional batch axes.

    Give exactly one of ``probs`` (non-negative, each row summing to 1 within a tolerance of 1e-2 for
    float16, 1e-4 for float32 and 1e-6 for float64, then renormalised exactly) or ``logits`` (finite
    or -inf; softmax taken in float64). float32 and float64 are kept as given; other real types
    (float16, integers) become float64.
    ``validate=False`` skips the checks (for probabilities straight from a softmax on a hot path).

    >>> import numpy as np, speculate as sp
    >>> d = sp.Categorical(logits=np.zeros((2, 3)))   # a batch of two uniform rows
    >>> d.batch_shape, d.num_outcomes
    ((2,), 3)
    >>> d[1].probs.tolist()
    [0.3333333333333333, 0.3333333333333333, 0.3333333333333333]
    """

    discrete = True

    def __init__(
        self,
        probs: Any = None,
        logits: Any = None,
        *,
        validate: bool = True,
        atol: float | None = None,
    ) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Categorical takes exactly one of probs= or logits=")
        if atol is not None and not (isinstance(atol, (int, float, np.integer, np.floating)) and 0 <= atol < math.inf):
            raise ValueError(f"Categorical atol (tolerance on a row's sum) must be a finite number >= 0, got {atol!r}")
        if logits is not None:
            lg = _as_float_array(logits, "Categorical logits")
            if lg.ndim == 0 or lg.shape[-1] == 0:
                raise ValueError(f"Categorical logits need a non-empty last axis, got shape {lg.shape}")
            if validate:
                bad = np.isnan(lg) | (lg == np.inf)
                if bad.any():
                    raise ValueError(f"Categorical logits contain NaN or +inf at index {_first_index(bad)}")
            l64 = lg.astype(np.float64)
            top = np.max(l64, axis=-1, keepdims=True)
            if validate and np.any(top == -np.inf):
                raise ValueError("Categorical logits: a row has every logit -inf (no outcome possible)")
            e = np.exp(l64 - top)
            self.probs = (e / e.sum(axis=-1, keepdims=True)).astype(lg.dtype)
            return
        given = _as_array(probs, "Categorical probs")
        pr = _as_float_array(given, "Categorical probs")
        if pr.ndim == 0 or pr.shape[-1] == 0:
            raise ValueError(f"Categorical probs need a non-empty last axis, got shape {pr.shape}")
        if validate:
            tol = _sum_tolerance(given.dtype) if atol is None else float(atol)
            flat = np.ascontiguousarray(pr.reshape(-1, pr.shape[-1]))
            status, _, _, sums = check_probs(flat, tol)
            if status:
                _explain_bad_probs(pr, pr.sum(axis=-1, dtype=np.float64), tol)
            if not np.all(sums == 1.0):
                pr = (flat / sums[:, None]).astype(pr.dtype, copy=False).reshape(pr.shape)
        self.probs = pr

    @classmethod
    def _of(cls, probs: np.ndarray) -> Categorical:
        """Wrap a float32/float64 array already known to be valid probabilities (no copy, no checks)."""
        out = cls.__new__(cls)
        out.probs = probs
        return out

    @property
    def probs(self) -> np.ndarray:
        """Probabilities [*batch_shape, num_outcomes]."""
        return self._probs

    @probs.setter
    def probs(self, value: np.ndarray) -> None:
        self._probs = value
        self.batch_shape: tuple[int, ...] = value.shape[:-1]
        self.num_outcomes: int = value.shape[-1]

    @property
    def dtype(self) -> np.dtype:
        return self.probs.dtype

    def __len__(self) -> int:
        if not self.batch_shape:
            raise TypeError("len() of an unbatched Categorical")
        return self.batch_shape[0]

    def __getitem__(self, idx: Any) -> Categorical:
        if not self.batch_shape:
            raise TypeError("cannot index an unbatched Categorical")
        out = self.probs[idx]
        if out.ndim == 0:
            raise IndexError("index selects a single probability, not a distribution")
        return Categorical._of(out)

    def reshape(self, *batch_shape: int) -> Categorical:
        return Categorical._of(self.probs.reshape(*batch_shape, self.num_outcomes))

    def sample(self, rng: np.random.Generator) -> Any:
        """One outcome per batch element (a Python int when unbatched)."""
        pr = self.probs
        flat = pr if pr.ndim == 2 else pr.reshape(-1, pr.shape[-1])
        idx, status = draw_rows(flat, rng.random(flat.shape[0]))
        if status:
            raise ValueError("Categorical has a row with NaN, inf, a negative value or no positive mass")
        if pr.ndim == 2:
            return idx
        return int(idx[0]) if pr.ndim == 1 else idx.reshape(pr.shape[:-1])

    def log_prob(self, y: Any) -> Any:
        y = np.asarray(y)
        if not np.issubdtype(y.dtype, np.integer):
            raise TypeError(f"Categorical outcomes are integers, got dtype {y.dtype}")
        if y.shape != self.batch_shape:
            raise ValueError(
                f"outcome of shape {y.shape} does not match the Categorical's batch shape {self.batch_shape}: "
                "give one outcome id per batch element"
            )
        if np.any((y < 0) | (y >= self.num_outcomes)):
            raise ValueError(f"outcome outside 0..{self.num_outcomes - 1}: {y}")
        pr = np.take_along_axis(self.probs, y[..., None], axis=-1)[..., 0] if self.batch_shape else (self.probs[int(y)])
        with np.errstate(divide="ignore"):
            lp = np.log(pr.astype(np.float64))
        return float(lp) if np.ndim(lp) == 0 else lp

    def __repr__(self) -> str:
        return f"Categorical(batch_shape={self.batch_shape}, num_outcomes={self.num_outcomes}, dtype={self.dtype})"


class Normal:
    """Independent Gaussian; the whole array (past ``batch_ndims`` leading axes) is one event.

    ``loc`` is the mean array; ``scale`` a positive scalar or an array broadcastable to ``loc``.
    Two Normals of equal scale are verified by reflection maximal coupling (constant time, acceptance
    ``2 Phi(-delta/2)`` with ``delta`` the scale-whitened distance of the means).

    >>> import numpy as np, speculate as sp
    >>> d = sp.Normal(np.zeros((4, 3)), 0.5, batch_ndims=1)   # 4 rows, each a 3-vector event
    >>> d.batch_shape, d.event_shape, d.sample(np.random.default_rng(0)).shape
    ((4,), (3,), (4, 3))
    """

    discrete = False

    def __init__(self, loc: Any, scale: Any, *, batch_ndims: int = 0, validate: bool = True) -> None:
        loc = _as_float_array(loc, "Normal loc")
        scale = _as_float_array(scale, "Normal scale")
        if isinstance(batch_ndims, bool) or not isinstance(batch_ndims, (int, np.integer)):
            raise TypeError(f"Normal batch_ndims must be an int, got {type(batch_ndims).__name__}")
        batch_ndims = int(batch_ndims)
        if batch_ndims < 0 or batch_ndims > loc.ndim:
            raise ValueError(f"batch_ndims={batch_ndims} does not fit loc of shape {loc.shape}")
        try:
            np.broadcast_shapes(scale.shape, loc.shape)
        except ValueError:
            raise ValueError(
                f"Normal scale of shape {scale.shape} does not broadcast to loc of shape {loc.shape}"
            ) from None
        if np.broadcast_shapes(scale.shape, loc.shape) != loc.shape:
            raise ValueError(f"Normal scale of shape {scale.shape} is larger than loc {loc.shape}")
        if validate:
            if not np.all(np.isfinite(loc)):
                raise ValueError(f"Normal loc is not finite at index {_first_index(~np.isfinite(loc))}")
            if not np.all(np.isfinite(scale) & (scale > 0)):
                raise ValueError("Normal scale must be finite and > 0")
        self.loc = loc
        self.scale = scale
        self.batch_ndims = batch_ndims

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.loc.shape[: self.batch_ndims])

    @property
    def event_shape(self) -> tuple[int, ...]:
        return tuple(self.loc.shape[self.batch_ndims :])

    def __len__(self) -> int:
        if not self.batch_shape:
            raise TypeError("len() of an unbatched Normal")
        return self.batch_shape[0]

    def __getitem__(self, idx: Any) -> Normal:
        if not self.batch_shape:
            raise TypeError("cannot index an unbatched Normal")
        scale = np.broadcast_to(self.scale, self.loc.shape)
        loc = self.loc[idx]
        dropped = self.loc.ndim - loc.ndim
        return Normal(loc, scale[idx], batch_ndims=self.batch_ndims - dropped, validate=False)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            y = self.loc + self.scale * rng.standard_normal(self.loc.shape)
        if not np.all(np.isfinite(y)):  # only possible when built with validate=False, or on overflow
            i = _first_index(~np.isfinite(np.atleast_1d(y)))
            raise ValueError(
                f"Normal sample is not finite at index {i}: loc or scale is NaN or inf there "
                "(built with validate=False?), or loc + scale * z overflows"
            )
        return y

    def log_prob(self, y: Any) -> Any:
        y = np.asarray(y, dtype=np.float64)
        if y.shape != self.loc.shape:
            raise ValueError(f"Normal outcome of shape {y.shape} does not match loc {self.loc.shape}")
        scale = np.broadcast_to(self.scale, self.loc.shape).astype(np.float64)
        with np.errstate(over="ignore"):  # a point ~1e154 scales away has log density -inf in floats
            z = (y - self.loc) / scale
            lp = -0.5 * z * z - np.log(scale) - 0.5 * math.log(2 * math.pi)
        axes = tuple(range(self.batch_ndims, self.loc.ndim))
        out = lp.sum(axis=axes)
        return float(out) if np.ndim(out) == 0 else out

    def __repr__(self) -> str:
        return f"Normal(batch_shape={self.batch_shape}, event_shape={self.event_shape})"


def _equal_values(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    try:
        eq = a == b
    except Exception:
        return False
    if isinstance(eq, (bool, np.bool_)):
        return bool(eq)
    try:
        return bool(np.all(eq))
    except Exception:
        return False


class PointMass:
    """A deterministic result: all mass on ``value``. Verifying against it is speculative execution.

    >>> import speculate as sp
    >>> d = sp.PointMass((1, 2))
    >>> d.sample(None), d.log_prob((1, 2)), d.log_prob((2, 1))
    ((1, 2), 0.0, -inf)
    """

    discrete = None  # compatible with either kind: it is a mass on one point

    def __init__(self, value: Any) -> None:
        self.value = value

    def sample(self, rng: Any) -> Any:
        return self.value

    def log_prob(self, y: Any) -> float:
        return 0.0 if _equal_values(y, self.value) else -math.inf

    def __repr__(self) -> str:
        return f"PointMass({self.value!r})"


def _is_multivariate(frozen: Any) -> bool:
    try:
        from scipy.stats._multivariate import multi_rv_frozen
    except ImportError:  # pragma: no cover - a scipy that moved it: recognise it by its lack of .dist
        return not hasattr(frozen, "dist")
    return isinstance(frozen, multi_rv_frozen)


class _Scipy:
    """Adapter for a frozen scipy.stats distribution (discrete, continuous or multivariate).

    A multivariate one's outcome is an array of the shape of its ``mean()`` (``dirichlet([1, 2, 3])``:
    ``(3,)``; ``multinomial(5, [.2, .8])``: ``(2,)``), whatever shape its ``rvs()`` returns."""

    def __init__(self, frozen: Any) -> None:
        import scipy.stats as st

        self.frozen = frozen
        dist = getattr(frozen, "dist", None)
        self.discrete = isinstance(dist, st.rv_discrete)
        if self.discrete:
            self._logp = frozen.logpmf
        elif hasattr(frozen, "logpdf"):
            self._logp = frozen.logpdf
        elif hasattr(frozen, "logpmf"):
            self.discrete = True
            self._logp = frozen.logpmf
        else:
            raise TypeError(f"scipy distribution {frozen!r} has neither logpdf nor logpmf")
        self.event_shape: tuple[int, ...] | None = None  # multivariate: the shape of one outcome
        if _is_multivariate(frozen):
            mean = getattr(frozen, "mean", None)
            try:
                self.event_shape = tuple(np.shape(mean() if callable(mean) else mean))
            except Exception as e:
                raise TypeError(f"from_scipy cannot tell the shape of one outcome of {frozen!r} (its mean() "
                                f"failed: {e!r}); wrap it in your own speculate.Distribution") from e
            if mean is None or not self.event_shape:
                raise TypeError(f"from_scipy cannot tell the shape of one outcome of {frozen!r} (no mean()); "
                                "wrap it in your own speculate.Distribution")

    def sample(self, rng: np.random.Generator) -> Any:
        y = self.frozen.rvs(random_state=rng)
        if self.event_shape is not None:  # scipy returns (1, d) for some families, (d,) for others
            y = np.asarray(y)
            if y.size != int(np.prod(self.event_shape)):
                raise ValueError(f"{self.frozen!r}.rvs() gave shape {y.shape}, not one outcome of shape "
                                 f"{self.event_shape}")
            return y.reshape(self.event_shape)
        return plain_outcome(y)

    def log_prob(self, y: Any) -> float:
        return float(np.sum(self._logp(y)))

    def __repr__(self) -> str:
        return f"from_scipy({self.frozen!r})"


def from_scipy(frozen: Any) -> Any:
    """Wrap a frozen ``scipy.stats`` distribution (e.g. ``scipy.stats.poisson(3)``).

    >>> import numpy as np, scipy.stats as st, speculate as sp
    >>> y, kept = sp.speculative_sample(sp.from_scipy(st.norm(0, 1)), sp.from_scipy(st.norm(0.1, 1)), rng=0)
    >>> isinstance(y, float)
    True
    """
    if not hasattr(frozen, "rvs"):
        raise TypeError(f"from_scipy expects a frozen scipy.stats distribution, got {type(frozen).__name__}")
    family = _unfrozen_family(frozen)
    if family is not None:
        raise TypeError(
            f"from_scipy needs a frozen distribution (a family with its parameters), got the family "
            f"scipy.stats.{family} itself: freeze it by calling it with its parameters, e.g. "
            "scipy.stats.poisson(3) or scipy.stats.norm(0, 1)"
        )
    return _Scipy(frozen)


def _unfrozen_family(obj: Any) -> str | None:
    """The family's name when ``obj`` is a scipy.stats family (not frozen), else None."""
    import scipy.stats as st

    if isinstance(obj, (st.rv_continuous, st.rv_discrete)):
        return str(getattr(obj, "name", None) or type(obj).__name__)
    try:
        from scipy.stats._multivariate import multi_rv_generic
    except ImportError:  # pragma: no cover - a scipy that moved it: recognise the families by name
        name = type(obj).__name__
        return name[: -len("_gen")] if name.endswith("_gen") else None
    if isinstance(obj, multi_rv_generic):
        name = type(obj).__name__
        return name[: -len("_gen")] if name.endswith("_gen") else name
    return None


class _Torch:
    """Adapter for a torch.distributions.Distribution without a dedicated numpy equivalent."""

    def __init__(self, dist: Any) -> None:
        self.dist = dist
        support = getattr(dist, "support", None)
        self.discrete = bool(getattr(support, "is_discrete", False))

    def sample(self, rng: np.random.Generator) -> Any:
        import torch

        from .rng import child_seed

        devices = [self.dist.mean.device] if self.dist.mean.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(child_seed(rng))
            y = self.dist.sample()
        return plain_outcome(y)  # NumPy / Python, as every distribution's outcomes

    def log_prob(self, y: Any) -> float:
        import torch

        y = torch.as_tensor(y)
        return float(self.dist.log_prob(y).sum())

    def __repr__(self) -> str:
        return f"from_torch({self.dist!r})"


def from_torch(dist: Any) -> Any:
    """Wrap a ``torch.distributions.Distribution``.

    Categorical (and OneHotCategorical's probabilities) become :class:`Categorical`; Normal and
    Independent(Normal) become :class:`Normal` (the whole tensor one event, Independent's batch axes
    kept as batch axes), so they get the exact closed-form residuals; anything else is sampled by
    torch with a generator seeded from the engine's ``rng`` and verified by the general rule.
    """
    import torch.distributions as td

    if not isinstance(dist, td.Distribution):
        raise TypeError(f"from_torch expects a torch.distributions.Distribution, got {type(dist).__name__}")
    if isinstance(dist, td.Categorical):
        return Categorical(probs=dist.probs.detach().double().cpu().numpy())
    base, batch_ndims = dist, 0
    if isinstance(dist, td.Independent):
        base, batch_ndims = dist.base_dist, len(dist.batch_shape)
    if isinstance(base, td.Normal) and type(base) is td.Normal:
        loc = base.loc.detach().double().cpu().numpy()
        scale = base.scale.detach().double().cpu().numpy()
        return Normal(loc, np.broadcast_to(scale, loc.shape).copy(), batch_ndims=batch_ndims)
    return _Torch(dist)


def plain_outcome(y: Any) -> Any:
    """An outcome in the one documented form: a Python ``int`` / ``float`` for a scalar draw, a NumPy
    array for a draw with batch or event axes (torch tensors come back as NumPy), a point mass's value
    as it was given.

    >>> plain_outcome(np.float64(1.5)), plain_outcome(np.array(2)), plain_outcome(np.zeros(2)).shape
    (1.5, 2, (2,))
    """
    if (type(y).__module__ or "") == "torch" and hasattr(y, "detach"):
        y = y.detach().cpu().numpy()
    if isinstance(y, np.ndarray) and y.ndim == 0:
        return y.item()
    if isinstance(y, np.generic):
        return y.item()
    return y


class PlainValueWarning(UserWarning):
    """A plain value that looks like a probability vector was taken as a point mass."""


def _looks_like_probs(x: Any) -> bool:
    """A float array (or list of floats) of at least two entries per row, non-negative, rows summing to 1."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind != "f" or x.ndim == 0 or x.shape[-1] < 2:
            return False
        arr = x
    elif isinstance(x, (list, tuple)):
        if len(x) < 2 or not all(isinstance(v, (float, np.floating)) for v in x):
            return False
        arr = np.asarray(x, dtype=np.float64)
    else:
        mod = type(x).__module__ or ""
        if not (mod == "torch" and getattr(x, "is_floating_point", lambda: False)() and x.device.type == "cpu"):
            return False
        if x.dim() == 0 or x.shape[-1] < 2:
            return False
        arr = x.detach().numpy()
    with np.errstate(all="ignore"):
        if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
            return False
        sums = arr.sum(axis=-1, dtype=np.float64)
        return bool(np.all(np.abs(sums - 1.0) <= _sum_tolerance(arr.dtype)))


#: a distribution-like object's density methods: with a sampler (``sample`` or scipy's ``rvs``), or
#: ``log_prob`` alone, an object is refused rather than taken as a point mass (a typo, scipy's names).
#: ``sample`` alone is not enough: plain values have it too (a pandas DataFrame)
_DENSITY_LIKE = ("log_prob", "logprob", "log_pdf", "logpdf", "logpmf", "pdf", "pmf", "prob")


def _half_distribution(x: Any) -> list[str]:
    """The distribution-like methods of ``x`` when it looks like a distribution that misses the
    protocol (see :data:`_DENSITY_LIKE`), else []."""
    has = [a for a in ("sample", "rvs", *_DENSITY_LIKE) if callable(getattr(x, a, None))]
    density = [a for a in has if a in _DENSITY_LIKE]
    sampler = [a for a in has if a in ("sample", "rvs")]
    return has if (sampler and density) or "rvs" in has or "log_prob" in has else []


def as_distribution(x: Any, who: str = "a value") -> Any:
    """A distribution as given; a torch or scipy distribution adapted; anything else a :class:`PointMass`.

    An object with some of a distribution's methods (``sample``, ``log_prob``, ``logprob``, ``rvs``,
    ``logpdf``, ...) but not both ``sample`` and ``log_prob`` raises ``TypeError`` naming the protocol.
    A plain float array (or list of floats) whose rows are non-negative and sum to 1 is still a point
    mass, but it warns (:class:`PlainValueWarning`): it was probably meant as probabilities. Wrap it
    in ``Categorical(probs=...)``, or in ``PointMass(...)`` to say it is a value (no warning).
    ``who`` names where the value came from, for the warning.
    """
    if isinstance(x, (Categorical, Normal, PointMass, _Scipy, _Torch)):
        return x
    mod = type(x).__module__ or ""
    if mod.startswith("torch.distributions"):
        return from_torch(x)
    if mod.startswith("scipy.stats") and hasattr(x, "rvs"):
        return from_scipy(x)
    if callable(getattr(x, "sample", None)) and callable(getattr(x, "log_prob", None)):
        return x
    half = _half_distribution(x)
    if half:
        scipy_like = "rvs" in half or "logpdf" in half or "logpmf" in half
        raise TypeError(
            f"{who} is a {type(x).__name__} with {', '.join(half)} but not the distribution protocol "
            "speculate.Distribution: sample(rng) and log_prob(y)"
            + ("; for a scipy.stats-style object wrap it with speculate.from_scipy(...)" if scipy_like else "")
            + ". A plain value is taken as a point mass: wrap it in speculate.PointMass(...) if that is meant")
    if _looks_like_probs(x):
        import warnings

        warnings.warn(
            f"{who} is a plain {type(x).__name__} of non-negative floats summing to 1, not a distribution: "
            "it is taken as a point mass (a fixed value). If it holds probabilities, wrap it: "
            "speculate.Categorical(probs=...); if it is a value, wrap it in speculate.PointMass(...) "
            "to say so (and silence this warning)",
            PlainValueWarning,
            stacklevel=3,
        )
    return PointMass(x)
