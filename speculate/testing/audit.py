"""One call that says whether a sampler follows an exact law: :func:`audit`.

``audit(sampler, oracle)`` draws token sequences from ``sampler`` and tests them against ``oracle``,
the exact law of the first ``m`` tokens (a dict ``{(t1, ..., tm): probability}``; a sequence may end
early, at EOS). It plans the sample size for a stated power, samples in batches within a time
budget, pools rare cells, and returns an :class:`AuditReport`: the verdict, a p-value, the total
variation (TV) estimated with a confidence interval next to the TV an exact sampler shows at that
sample size, the smallest TV that sample size detects, the most over- and under-produced outcomes,
a per-position breakdown and the samples per second. Without an exact law, ``audit(sampler,
reference=other_sampler, horizon=m)`` compares two samplers (two-sample mode).

>>> import numpy as np
>>> law = {(0, 0): 0.25, (0, 1): 0.25, (1,): 0.5}           # token 1 ends a sequence (EOS)
>>> def exact(n, seed):
...     rng = np.random.default_rng(seed)
...     first = rng.integers(0, 2, n)
...     return [[1] if f else [0, int(rng.integers(0, 2))] for f in first]
>>> r = audit(exact, law, tv=0.1, alpha=1e-3, progress=False)
>>> r.verdict, r.n == r.n_planned
('consistent', True)
>>> def biased(n, seed):                                    # (0, 1) twice as likely as (0, 0)
...     rng = np.random.default_rng(seed)
...     return [[1] if rng.random() < 0.5 else [0, int(rng.random() < 2 / 3)] for _ in range(n)]
>>> r = audit(biased, law, tv=0.1, alpha=1e-3, progress=False)
>>> r.verdict, r.over[0]["outcome"]
('biased', (0, 1))

**The sampler** is any callable: ``sampler(n, seed)`` returning ``n`` token-id sequences (a list of
lists, a 2-D integer array, ...), or ``sampler(seed)`` returning one sequence (two required
parameters, or one named ``n``, mean the batched form). Each call gets its own seed, derived from
``seed`` (``numpy.random.SeedSequence``); a ``batch_size`` attribute on the sampler (the text
adapters set it) or the ``batch`` argument sets how many sequences one call draws. Sequences are
cut to the oracle's horizon ``m`` (its longest outcome) before they are compared.

**Bad input is refused before sampling** (``ValueError`` / ``TypeError`` naming the problem): an
oracle that is not a dict of token-id tuples (or ints), with negative, NaN or infinite
probabilities, that does not sum to 1 within :data:`SUM_TOL` (1e-6, absolute), or in which an
outcome is a proper prefix of another (then a sample could not be assigned to one outcome); a
sampler that does not return the number of sequences asked, or sequences of anything but
non-negative integers (checked on a probe call of two sequences). Settings an oracle builder cannot
reproduce are its own refusal (``speculate.domains.text.audit``).

**A sampler that raises** during the audit (its probe call included), or that returns malformed
output after a good probe, ends it with the verdict ``"error"``: the report names the exception,
the call and where it was raised (``report.error``, ``report.notes``), ``report.failed`` is true, and
nothing is tested (a NaN guard that refuses a broken law shows up here: nothing silently wrong).

**Impossible outcomes** (probability 0 under the oracle, or not listed in it, but sampled) reject
at once, with the outcome named, whatever the law: no sample size makes them consistent.

**The tests and their guarantees.** The level ``alpha`` is split: ``alpha / 10`` for the
sequential test, the rest for the fixed-sample test (a union bound: an exact sampler is called
biased with probability at most ``alpha``).

- *Fixed-sample test*: a chi-square goodness-of-fit test on the cells of the oracle, cells whose
  expected count is below ``min_expected`` pooled (``speculate.testing.gof``). The planned sample
  size ``n_planned`` is the smallest that catches ANY deviation of total variation ``tv`` (measured
  on the pooled cells) with probability ``power`` (:func:`~speculate.testing.gof.chi2_sample_size`,
  iterated with the pooling it implies). If ``budget`` seconds run out first, the verdict is
  ``"inconclusive"`` unless the samples drawn already reject, and ``tv_detectable`` says what they
  could catch.
- *Sequential test* (``sequential=True``): a likelihood-ratio e-process against the plug-in
  alternative: before each sample, the alternative is the law of the samples so far shrunk towards
  the oracle (``(counts + k0 p) / (t + k0)``, ``k0`` = the number of pooled cells); the running
  product of ``alternative(x) / p(x)`` is a nonnegative martingale of mean 1 under exactness, so by
  Ville's inequality it ever exceeds ``10 / alpha`` with probability at most ``alpha / 10``. It
  stops sampling as soon as it does: a gross bias is called after a few hundred samples.
- *Two-sample mode* (``reference=``): the sampler's and the reference's outcomes are cut to
  ``horizon`` tokens and compared by a chi-square test of homogeneity on cells fixed by a pilot
  sample of the reference (not reused in the test, so the cells do not depend on the tested data;
  outcomes the pilot did not see are pooled). Any deviation of TV ``tv`` between the two laws
  (on those cells) is caught with probability ``power``: the noncentrality is at least
  ``2 n tv^2`` for ``n`` draws from each. Its sequential test (``sequential=True``, at ``alpha /
  10`` too) pairs the two samplers' draws in drawing order and bets on which of each pair's two
  values came from which sampler: under one law either labelling has probability 1/2 given the
  unordered pair and the past, whatever that law is, so the product of ``2 pi`` over pairs (``pi``:
  the observed labelling's probability under the laws estimated from past pairs, add-0.5 smoothed)
  is a nonnegative martingale of mean 1, and by Ville's inequality it ever exceeds ``10 / alpha``
  with probability at most ``alpha / 10``; it stops as soon as it does.

The per-position breakdown (``report.positions``) tests, for each position ``j``, the marginal law
of token ``j`` ("end" when the sequence has ended) and its conditional law given the ``j`` tokens
before it (chi-square statistics of the prefixes summed), Bonferroni-corrected over the ``2 m``
tests: it says where a bias starts. It is a diagnosis, not part of the verdict.
"""

from __future__ import annotations

import inspect
import math
import sys
import time
import traceback
import types
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats as st

from .gof import _merge, chi2_noncentrality

__all__ = ["DEFAULT_AUDIT_ALPHA", "DEFAULT_POWER", "DEFAULT_TV", "SUM_TOL", "AuditReport", "SamplerFailed",
           "audit", "check_law", "detectable_tv", "planned_sample_size"]

DEFAULT_TV = 0.05  #: the total variation an audit is sized to catch by default
DEFAULT_AUDIT_ALPHA = 1e-3  #: an audit's default level (the test suite uses speculate.testing.DEFAULT_ALPHA)
DEFAULT_POWER = 0.99
SUM_TOL = 1e-6  #: how far from 1 an oracle's probabilities may sum (absolute)
END = "end"  #: the symbol of a position after a sequence has ended, in the per-position breakdown
SEQ_SHARE = 0.1  #: the share of alpha the sequential test spends


# ----------------------------------------------------------------------------------- the law


@dataclass(frozen=True)
class _Law:
    outcomes: list[tuple[int, ...]]
    probs: np.ndarray  # float64, sums to 1
    index: dict[tuple[int, ...], int]
    horizon: int


def check_law(oracle: Any) -> _Law:
    """The oracle as a validated law (see the module docstring for what is refused)."""
    table = getattr(oracle, "table", oracle)
    if not isinstance(table, Mapping):
        raise TypeError(f"the oracle must be a dict {{(token ids...): probability}}, got {type(oracle).__name__}")
    if not table:
        raise ValueError("the oracle is empty: it must list the outcomes of positive probability")
    outcomes, probs = [], []
    for k, v in table.items():
        key = (k,) if _is_id(k) else k
        if not isinstance(key, tuple) or not all(_is_id(t) for t in key):
            raise TypeError(f"oracle outcomes must be tuples of non-negative int token ids (or ints), got {k!r}; "
                            "for other outcomes use speculate.testing.assert_categorical_matches")
        try:
            pv = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"oracle probability of {k!r} is not a number: {v!r}") from None
        if not math.isfinite(pv) or pv < 0:
            raise ValueError(f"oracle probability of {k!r} is {v!r}: probabilities must be finite and >= 0")
        outcomes.append(tuple(int(t) for t in key))
        probs.append(pv)
    p = np.asarray(probs, np.float64)
    if abs(p.sum() - 1.0) > SUM_TOL:
        raise ValueError(f"the oracle's probabilities sum to {p.sum():.10g}, not 1 (tolerance {SUM_TOL:g}): "
                         "an exact law must list every outcome of positive probability")
    index = {o: i for i, o in enumerate(outcomes)}
    if len(index) != len(outcomes):
        raise ValueError("the oracle lists an outcome twice (after converting ids to int)")
    for o in outcomes:
        for j in range(len(o)):
            if o[:j] in index:
                raise ValueError(f"oracle outcome {o[:j]!r} is a prefix of {o!r}: outcomes must be prefix-free "
                                 "(a sequence ends at its outcome, e.g. at EOS)")
    horizon = int(getattr(oracle, "horizon", 0) or max(len(o) for o in outcomes))
    return _Law(outcomes, p / p.sum(), index, horizon)


def _is_id(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x >= 0


# ------------------------------------------------------------------------------- the sampler


class _Sampler:
    """A user's sampler as ``draw(n, seed) -> list of tuples`` (validated, cut to ``horizon``)."""

    def __init__(self, fn: Any, batch: int | None, name: str) -> None:
        if hasattr(fn, "sample") and not callable(fn):
            fn = fn.sample
        if not callable(fn):
            raise TypeError(f"{name} must be a callable sampler(n, seed) or sampler(seed), got {type(fn).__name__}")
        self.fn, self.name = fn, name
        self.calls, self.rows, self.probed = 0, 0, False
        self.batched = _batched(fn)
        own = getattr(fn, "batch_size", None)
        size = batch if batch is not None else own if own is not None else (1024 if self.batched else 1)
        if not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"batch must be an int >= 1, got {size!r}")
        self.batch = int(size) if self.batched else 1

    def draw(self, n: int, seed: int, horizon: int | None) -> list[tuple[int, ...]]:
        """``n`` sequences; what the sampler raises, or malformed output after the probe, ends the
        audit as a :class:`SamplerFailed` (malformed output on the probe is refused: bad input)."""
        self.calls += 1
        try:
            out = self.fn(n, seed) if self.batched else [self.fn(seed)]
        except Exception as e:
            raise SamplerFailed(self, e) from e
        try:
            rows = _rows(out, n, self.name, horizon)
        except (TypeError, ValueError) as e:
            if not self.probed:
                raise
            raise SamplerFailed(self, e) from e
        if self.probed:  # sequences drawn after the probe
            self.rows += len(rows)
        self.probed = True
        return rows


class SamplerFailed(Exception):
    """A sampler raised (or returned malformed output after its probe) during an audit: reported
    as the verdict ``"error"``, not raised from :func:`audit`."""

    def __init__(self, sampler: _Sampler, error: Exception) -> None:
        super().__init__(f"{sampler.name} raised {type(error).__name__}: {error}")
        self.sampler, self.error = sampler.name, error
        self.call, self.rows = sampler.calls, sampler.rows
        tb = traceback.extract_tb(error.__traceback__)
        self.where = f"{tb[-1].filename}:{tb[-1].lineno} in {tb[-1].name}" if tb else ""


def _batched(fn: Callable) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    params = list(sig.parameters.values())
    if any(p.name in ("n", "batch_size", "num") for p in params):
        return True
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) >= 2


def _rows(out: Any, n: int, name: str, horizon: int | None) -> list[tuple[int, ...]]:
    if hasattr(out, "detach"):  # a torch tensor
        out = out.detach().cpu().numpy()
    if isinstance(out, np.ndarray):
        if out.ndim != 2 and not (out.ndim == 1 and out.dtype == object):
            raise ValueError(f"{name} returned an array of shape {out.shape}: expected {n} sequences "
                             f"(a 2-D array [n, length] or a list of n token-id lists)")
        out = list(out)
    if not isinstance(out, Sequence) or isinstance(out, (str, bytes)):
        raise TypeError(f"{name} must return a list of {n} token-id sequences, got {type(out).__name__}")
    if len(out) != n:
        raise ValueError(f"{name} was asked for {n} sequences and returned {len(out)}")
    rows = []
    for i, s in enumerate(out):
        if hasattr(s, "detach"):
            s = s.detach().cpu().numpy()
        a = np.asarray(s)
        if a.ndim != 1:
            raise ValueError(f"{name}: sequence {i} has shape {a.shape}, expected a 1-D list of token ids")
        if a.size and (a.dtype.kind not in "iu" or a.dtype == np.bool_):
            raise TypeError(f"{name}: sequence {i} holds {a.dtype} values ({a[:5].tolist()}...), not integer token ids")
        if a.size and a.min() < 0:
            raise ValueError(f"{name}: sequence {i} holds negative token ids: {a[a < 0][:5].tolist()}")
        rows.append(tuple(a[:horizon].tolist() if horizon is not None else a.tolist()))
    return rows


def _seed(seed: int, i: int) -> int:
    return int(np.random.SeedSequence(seed, spawn_key=(i,)).generate_state(1)[0])


# --------------------------------------------------------------------------------- the report


@dataclass
class AuditReport:
    """What :func:`audit` found. ``verdict``: ``"biased"`` (rejected at level ``alpha``),
    ``"consistent"`` (the planned sample drawn and not rejected: no deviation of TV ``tv`` or more,
    with probability ``power``), ``"inconclusive"`` (the budget ran out first) or ``"error"`` (the
    sampler raised: ``error`` says what)."""

    verdict: str
    reason: str
    pvalue: float
    alpha: float
    tv: float  #: the TV the audit was sized to catch
    power: float
    n_planned: int
    n: int  #: samples tested (per sampler in two-sample mode)
    mode: str  #: "law" or "two-sample"
    cells: int  #: outcomes of positive probability (or seen, in two-sample mode)
    bins: int  #: cells after pooling
    statistic: float
    df: int
    tv_hat: float  #: TV between the sampled frequencies and the law (on the pooled cells)
    tv_ci: tuple[float, float]  #: 95% interval of the TV (basic bootstrap: bias-corrected, clipped at 0)
    tv_exact_mean: float  #: tv_hat's mean for an exact sampler at this n
    tv_exact_q95: float  #: ... and its 95th percentile
    tv_detectable: float  #: the smallest TV this n catches with probability ``power``
    over: list[dict] = field(default_factory=list)  #: most over-produced outcomes
    under: list[dict] = field(default_factory=list)  #: most under-produced outcomes
    positions: list[dict] = field(default_factory=list)  #: per-position marginal / conditional tests
    sequential: dict = field(default_factory=dict)  #: the e-process: e_value, threshold, stopped_at
    impossible: tuple | None = None  #: an outcome the law gives probability 0, if one was sampled
    seconds: float = 0.0
    samples_per_second: float = 0.0
    horizon: int = 0
    notes: list[str] = field(default_factory=list)
    error: str | None = None  #: with the verdict "error": what the sampler raised ("ValueError: ...")

    @property
    def biased(self) -> bool:
        return self.verdict == "biased"

    @property
    def failed(self) -> bool:
        """Biased, or the sampler raised (verdict ``"error"``): either way not shown to keep the law."""
        return self.verdict in ("biased", "error")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able dict (outcomes as lists)."""
        d = asdict(self)
        d["impossible"] = list(self.impossible) if self.impossible is not None else None
        for side in ("over", "under"):
            for row in d[side]:
                row["outcome"] = list(row["outcome"])
        return d

    def __str__(self) -> str:
        if self.verdict == "error":
            return "\n".join([f"verdict: ERROR: {self.reason}", f"  {self.mode} test, alpha {self.alpha:g}, "
                              f"{self.n} sequences drawn before the error"] + [f"  note: {n}" for n in self.notes])
        lines = [f"verdict: {self.verdict.upper()}: {self.reason}",
                 f"  {self.mode} test, alpha {self.alpha:g}, sized for TV {self.tv:g} at power {self.power:g}: "
                 f"n = {self.n} of {self.n_planned} planned, {self.cells} cells in {self.bins} bins, "
                 f"chi-square {self.statistic:.1f} on {self.df} df, p = {self.pvalue:.3g}",
                 f"  TV estimate {self.tv_hat:.4f} (95% CI {self.tv_ci[0]:.4f}-{self.tv_ci[1]:.4f}); an exact "
                 f"sampler shows {self.tv_exact_mean:.4f} at this n (95% below {self.tv_exact_q95:.4f}); "
                 f"this n detects TV >= {self.tv_detectable:.4f}"]
        if self.sequential:
            s = self.sequential
            unit = "pair" if self.mode == "two-sample" else "sample"
            stop = f", stopped at {unit} {s['stopped_at']}" if s.get("stopped_at") else ""
            lines.append(f"  sequential e-process: e = {s['e_value']:.3g} (rejects at {s['threshold']:g}){stop}")
        ref = "reference" if self.mode == "two-sample" else "expected"
        for side, rows in (("over", self.over), ("under", self.under)):
            if rows:
                lines.append(f"  most {side}-produced: " + "; ".join(
                    f"{r['outcome']}: {r['observed']} vs {r[ref]:.1f} ({r['z']:+.1f} sd)" for r in rows[:3]))
        flagged = [p for p in self.positions if p["flag"]]
        if flagged:
            lines.append("  positions that deviate (Bonferroni): " + "; ".join(
                f"{p['position']} {p['test']} p={p['pvalue_adjusted']:.2g}" for p in flagged))
        lines.append(f"  {self.samples_per_second:.1f} samples/s ({self.seconds:.1f} s)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# ----------------------------------------------------------------------------------- planning


def planned_sample_size(probs: Any, tv: float = DEFAULT_TV, *, alpha: float = DEFAULT_AUDIT_ALPHA,
                        power: float = DEFAULT_POWER, min_expected: float = 5.0, two_sample: bool = False
                        ) -> tuple[int, int]:
    """``(n, bins)``: the sample size whose chi-square test (cells with expected count below
    ``min_expected`` pooled, as at that n) catches any deviation of TV ``tv`` with probability
    ``power`` at level ``alpha``, and the number of pooled cells. One sample: noncentrality >=
    ``4 n tv^2``; two samples of ``n`` each: ``>= 2 n tv^2``. A point mass (one cell): the n for
    which an off-support sample shows up with probability ``power``.

    >>> planned_sample_size([0.25] * 4, 0.1, alpha=1e-3, power=0.99)
    (949, 4)
    """
    if not 0 < tv <= 1:
        raise ValueError(f"tv must be in (0, 1], got {tv!r}")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha!r}, {power!r}")
    p = np.asarray(probs, np.float64)
    p = p[p > 0]
    per = 2.0 if two_sample else 4.0
    if p.size < 2:
        return max(1, math.ceil(math.log(1 - power) / math.log(1 - tv))) if tv < 1 else 1, 1
    bins, n = p.size, 0
    for _ in range(30):
        n_new = math.ceil(chi2_noncentrality(bins - 1, alpha, power) / (per * tv * tv)) if bins >= 2 else n
        b_new = int(_merge(p * n_new, min_expected).max()) + 1
        if n_new == n and b_new == bins:
            break
        n, bins = n_new, max(b_new, 2)
    return n, bins


def detectable_tv(n: int, bins: int, *, alpha: float = DEFAULT_AUDIT_ALPHA, power: float = DEFAULT_POWER,
                  two_sample: bool = False) -> float:
    """The smallest TV (on ``bins`` pooled cells) that ``n`` samples catch with probability ``power``.

    >>> round(detectable_tv(949, 4, alpha=1e-3, power=0.99), 3)
    0.1
    """
    if n < 1:
        return 1.0
    if bins < 2:
        return 1.0 - (1.0 - power) ** (1.0 / n)
    return min(1.0, math.sqrt(chi2_noncentrality(bins - 1, alpha, power) / ((2.0 if two_sample else 4.0) * n)))


# ------------------------------------------------------------------------------ the statistics


def _chi2(obs: np.ndarray, probs: np.ndarray, min_expected: float) -> tuple[float, int, float]:
    """Chi-square goodness of fit of counts ``obs`` to ``probs`` (both over the same cells, probs > 0),
    cells pooled as ``speculate.testing.gof`` pools them."""
    n = obs.sum()
    if n == 0 or probs.size < 2:
        return 0.0, 0, 1.0
    exp = probs * n
    bins = _merge(exp, min_expected)
    k = int(bins.max()) + 1
    if k < 2:
        return 0.0, 0, 1.0
    ob, eb = np.bincount(bins, obs, k), np.bincount(bins, exp, k)
    stat = float(np.sum((ob - eb) ** 2 / eb))
    return stat, k - 1, float(st.chi2.sf(stat, k - 1))


def _homogeneity(a: np.ndarray, b: np.ndarray, min_expected: float) -> tuple[float, int, float]:
    """Chi-square test that counts ``a`` and ``b`` (same cells) come from one law; cells pooled by the
    pooled counts."""
    na, nb = a.sum(), b.sum()
    if na == 0 or nb == 0:
        return 0.0, 0, 1.0
    pooled = (a + b) / (na + nb)
    keep = pooled > 0
    a, b, pooled = a[keep], b[keep], pooled[keep]
    if pooled.size < 2:
        return 0.0, 0, 1.0
    bins = _merge(pooled * min(na, nb), min_expected)
    k = int(bins.max()) + 1
    if k < 2:
        return 0.0, 0, 1.0
    ta, tb = np.bincount(bins, a, k), np.bincount(bins, b, k)
    tot = ta + tb
    ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
    stat = float(np.sum((ta - ea) ** 2 / ea + (tb - eb) ** 2 / eb))
    return stat, k - 1, float(st.chi2.sf(stat, k - 1))


def _tv_summary(obs: np.ndarray, probs: np.ndarray, rng: np.random.Generator, reps: int = 400
                ) -> tuple[float, tuple[float, float], float, float]:
    """TV between frequencies and ``probs`` (pooled cells), its bootstrap interval, and its mean and
    95th percentile for an exact sampler at the same n."""
    n = int(obs.sum())
    if n == 0:
        return 1.0, (0.0, 1.0), 0.0, 0.0
    f = obs / n
    tv = 0.5 * float(np.abs(f - probs).sum())
    boot = 0.5 * np.abs(rng.multinomial(n, f, size=reps) / n - probs).sum(axis=1)
    null = 0.5 * np.abs(rng.multinomial(n, probs, size=reps) / n - probs).sum(axis=1)
    return tv, _basic(tv, boot), float(null.mean()), float(np.quantile(null, 0.95))


def _basic(est: float, boot: np.ndarray) -> tuple[float, float]:
    """The basic (bias-corrected) bootstrap 95% interval, clipped at 0: the plug-in TV is biased
    upwards (noise adds to it), and resampling from the sample adds that bias once more, so the
    percentile interval would sit above the estimate; near TV 0 the interval is approximate."""
    lo, hi = 2 * est - float(np.quantile(boot, 0.975)), 2 * est - float(np.quantile(boot, 0.025))
    return max(0.0, lo), max(0.0, hi)


def _extremes(outcomes: list, obs: np.ndarray, probs: np.ndarray, k: int = 5, ref: str = "expected"
              ) -> tuple[list[dict], list[dict]]:
    n = obs.sum()
    exp = probs * n
    z = (obs - exp) / np.sqrt(np.maximum(exp * (1 - probs), 1e-12))
    order = np.argsort(-z, kind="stable")
    def row(i: int) -> dict:
        return {"outcome": outcomes[i], "observed": int(obs[i]), ref: float(exp[i]),
                "frequency": float(obs[i] / n) if n else 0.0, "probability": float(probs[i]), "z": float(z[i])}
    over = [row(i) for i in order[:k] if z[i] > 0]
    under = [row(i) for i in order[::-1][:k] if z[i] < 0]
    return over, under


class _Betting:
    """What both e-processes share: the running log wealth, its maximum, the threshold (Ville: a
    nonnegative martingale ever exceeds ``threshold`` with probability at most ``1 / threshold``) and
    where it was crossed. A subclass turns observations into log factors and calls :meth:`_walk`."""

    def __init__(self, threshold: float) -> None:
        self.t = 0
        self.log_e, self.max_log_e = 0.0, 0.0
        self.threshold, self.log_threshold = threshold, math.log(threshold)
        self.stopped_at: int | None = None

    def _walk(self, steps: np.ndarray) -> tuple[int, bool]:
        """Multiply in the factors ``exp(steps)`` in order up to the first crossing: (how many were
        used, whether the threshold was crossed)."""
        path = self.log_e + np.cumsum(steps)
        hit = np.flatnonzero(path >= self.log_threshold)
        used = int(hit[0]) + 1 if hit.size else steps.size
        self.t += used
        self.log_e = float(path[used - 1])
        self.max_log_e = max(self.max_log_e, float(path[:used].max()))
        if hit.size:
            self.stopped_at = self.t
        return used, bool(hit.size)

    def summary(self) -> dict:
        return {"e_value": math.exp(min(self.log_e, 700.0)), "max_e_value": math.exp(min(self.max_log_e, 700.0)),
                "threshold": self.threshold, "stopped_at": self.stopped_at,
                "pvalue": min(1.0, math.exp(-self.max_log_e))}


class _EProcess(_Betting):
    """The likelihood-ratio e-process against the plug-in alternative (see the module docstring)."""

    def __init__(self, bin_probs: np.ndarray, threshold: float) -> None:
        super().__init__(threshold)
        self.p = bin_probs
        self.counts = np.zeros(bin_probs.size, np.float64)
        self.k0 = float(max(bin_probs.size, 2))

    def update(self, b: np.ndarray) -> int | None:
        """Feed bin indices in order; the number of them consumed when the threshold is crossed, else None."""
        if self.stopped_at is not None or b.size == 0:
            return None
        order = np.argsort(b, kind="stable")
        sb = b[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sb)) + 1]
        rank = np.arange(b.size) - np.repeat(starts, np.diff(np.r_[starts, b.size]))
        before = np.empty(b.size)
        before[order] = rank  # earlier samples of the same bin within this batch
        c = self.counts[b] + before
        t = self.t + np.arange(b.size)
        alt = (c + self.k0 * self.p[b]) / (t + self.k0)
        used, crossed = self._walk(np.log(alt) - np.log(self.p[b]))
        np.add.at(self.counts, b[:used], 1.0)
        return used if crossed else None


class _PairEProcess(_Betting):
    """The two-sample e-process (see the module docstring): pairs (a, b), the sampler's and the
    reference's draws in drawing order, bet on which of the two unordered values came from which
    sampler. Under one law the labelling is a fair coin given the pair and the past, so each factor
    ``2 pi`` (``pi``: the plug-in probability of the observed labelling, from past pairs only) has
    conditional mean 1 and the product is a nonnegative martingale. Pairs with a == b leave it unchanged."""

    SMOOTH = 0.5  #: pseudo-count of each cell in the plug-in laws

    def __init__(self, cells: int, threshold: float) -> None:
        super().__init__(threshold)
        self.ca, self.cb = np.zeros(cells), np.zeros(cells)

    def update(self, a: np.ndarray, b: np.ndarray) -> int | None:
        """Feed pairs in order; the number consumed when the threshold is crossed, else None."""
        if self.stopped_at is not None:
            return None
        K = self.ca.size
        chunk = max(1, 2**22 // K)
        for lo in range(0, a.size, chunk):
            used = self._chunk(a[lo : lo + chunk], b[lo : lo + chunk])
            if used is not None:
                return lo + used
        return None

    def _chunk(self, a: np.ndarray, b: np.ndarray) -> int | None:
        m, K = a.size, self.ca.size
        rows = np.arange(m)
        oa, ob = np.zeros((m, K)), np.zeros((m, K))
        oa[rows, a] = 1.0
        ob[rows, b] = 1.0
        ca = self.ca + np.cumsum(oa, axis=0) - oa  # counts before each pair
        cb = self.cb + np.cumsum(ob, axis=0) - ob
        tot = (self.t + rows + self.SMOOTH * K)[:, None]
        fa, fb = (ca + self.SMOOTH) / tot, (cb + self.SMOOTH) / tot  # plug-in laws of the sampler, the reference
        seen = fa[rows, a] * fb[rows, b]  # the labelling observed: the sampler drew a, the reference b
        swap = fa[rows, b] * fb[rows, a]
        used, crossed = self._walk(np.where(a == b, 0.0, np.log(2.0 * seen / (seen + swap))))
        self.ca += oa[:used].sum(axis=0)
        self.cb += ob[:used].sum(axis=0)
        return used if crossed else None


def _symbol(o: tuple, j: int) -> Any:
    return o[j] if len(o) > j else END


def _positions(samples: Counter, law: _Law | None, ref: Counter | None, horizon: int, alpha: float,
               min_expected: float) -> list[dict]:
    """Per-position marginal and conditional tests, Bonferroni over 2 * horizon tests."""
    out = []
    tests = 2 * max(horizon, 1)
    for j in range(horizon):
        for test in ("marginal", "conditional"):
            stat, df = 0.0, 0
            cond = test == "conditional"
            groups: dict[Any, tuple[Counter, Counter]] = {}
            for o, c in samples.items():
                if not (cond and len(o) <= j):
                    groups.setdefault(o[:j] if cond else (), (Counter(), Counter()))[0][_symbol(o, j)] += c
            pairs = (zip(law.outcomes, law.probs, strict=True) if law is not None else ref.items())
            for o, w in pairs:
                g = groups.get(o[:j] if cond else ())
                if w > 0 and not (cond and len(o) <= j) and g is not None:
                    g[1][_symbol(o, j)] += w
            for got, want in groups.values():
                cells = sorted(set(got) | set(want), key=repr)
                a = np.array([got.get(c, 0) for c in cells], np.float64)
                b = np.array([want.get(c, 0) for c in cells], np.float64)
                if law is not None:
                    if b.sum() <= 0 or np.any((b == 0) & (a > 0)):
                        continue  # impossible outcomes are reported on their own
                    s, d, _ = _chi2(a[b > 0], b[b > 0] / b.sum(), min_expected)
                else:
                    s, d, _ = _homogeneity(a, b, min_expected)
                stat, df = stat + s, df + d
            p = float(st.chi2.sf(stat, df)) if df > 0 else 1.0
            adj = min(1.0, p * tests)
            out.append({"position": j, "test": test, "statistic": stat, "df": df, "pvalue": p,
                        "pvalue_adjusted": adj, "flag": adj < alpha})
    return out


# ------------------------------------------------------------------------------------ sampling


class _Progress:
    def __init__(self, total: int, desc: str, enabled: bool | None) -> None:
        self.bar = None
        if sys.stderr.isatty() if enabled is None else enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, leave=False, unit="seq")
            except ImportError:
                self.bar = None

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def audit(sampler: Any, oracle: Any = None, *, reference: Any = None, horizon: int | None = None,
          tv: float = DEFAULT_TV, alpha: float = DEFAULT_AUDIT_ALPHA, power: float = DEFAULT_POWER,
          n: int | None = None, budget: float | None = None, batch: int | None = None, seed: int = 0,
          sequential: bool = True, min_expected: float = 5.0, pilot: int | None = None,
          progress: bool | None = None) -> AuditReport:
    """Test whether ``sampler`` follows ``oracle`` (or, with ``reference=``, the same law as another
    sampler); see the module docstring for the protocol, the tests and their guarantees.

    ``tv``, ``alpha``, ``power``: the deviation to catch, the level, the probability of catching it
    (they set the planned sample size; ``n`` overrides it). ``budget``: seconds of sampling at most.
    ``batch``: sequences per sampler call. ``seed``: the seed every call's seed derives from.
    ``horizon``: tokens compared (default: the oracle's longest outcome; required in two-sample
    mode). ``pilot``: reference draws that fix the cells in two-sample mode (default ``n // 4``, at
    least 1000). ``progress``: a tqdm bar (None: when stderr is a terminal).
    """
    if (oracle is None) == (reference is None):
        raise ValueError("give an oracle (the exact law) or reference= (a second sampler), one of them")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    if not 0 < tv <= 1:
        raise ValueError(f"tv must be in (0, 1], got {tv!r}")
    if budget is not None and not budget > 0:
        raise ValueError(f"budget must be a number of seconds > 0, got {budget!r}")
    if n is not None and (not isinstance(n, (int, np.integer)) or n < 1):
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    s = _Sampler(sampler, batch, "the sampler")
    if reference is not None:
        if horizon is None or not isinstance(horizon, (int, np.integer)) or horizon < 1:
            raise ValueError("two-sample mode needs horizon= (the number of tokens compared), an int >= 1")
        try:
            return _two_sample(s, _Sampler(reference, batch, "the reference sampler"), int(horizon), tv, alpha,
                               power, n, budget, seed, sequential, min_expected, pilot, progress)
        except SamplerFailed as e:
            return _error_report(e, "two-sample", tv, alpha, power, int(horizon))
    law = check_law(oracle)
    if horizon is not None:
        if any(len(o) > horizon for o in law.outcomes):
            raise ValueError(f"horizon={horizon} is shorter than the oracle's outcomes ({law.horizon} tokens)")
        law = _Law(law.outcomes, law.probs, law.index, int(horizon))
    try:
        return _one_sample(s, law, tv, alpha, power, n, budget, seed, sequential, min_expected, progress)
    except SamplerFailed as e:
        return _error_report(e, "law", tv, alpha, power, law.horizon)


def _error_report(e: SamplerFailed, mode: str, tv: float, alpha: float, power: float, horizon: int) -> AuditReport:
    """The report of an audit a sampler's error ended: nothing tested, the error named."""
    nan = float("nan")
    err = f"{type(e.error).__name__}: {e.error}"
    probe = " (its probe call, before sampling)" if e.call == 1 else ""
    reason = (f"{e.sampler} raised {err} on call {e.call}{probe}, after {e.rows} sequences: nothing can be said "
              "about its law; a sampler that keeps the law returns token ids, and one that cannot must refuse "
              "its input before sampling")
    return AuditReport(
        verdict="error", reason=reason, pvalue=nan, alpha=alpha, tv=tv, power=power, n_planned=0, n=e.rows,
        mode=mode, cells=0, bins=0, statistic=nan, df=0, tv_hat=nan, tv_ci=(nan, nan), tv_exact_mean=nan,
        tv_exact_q95=nan, tv_detectable=1.0, horizon=horizon, error=err,
        notes=[f"raised at {e.where}"] if e.where else [])


def _one_sample(s: _Sampler, law: _Law, tv, alpha, power, n, budget, seed, sequential, min_expected,
                progress) -> AuditReport:
    a_seq = alpha * SEQ_SHARE if sequential else 0.0
    a_fix = alpha - a_seq
    pos = law.probs > 0
    n_plan, _ = planned_sample_size(law.probs[pos], tv, alpha=a_fix, power=power, min_expected=min_expected)
    n_target = int(n) if n is not None else n_plan
    probe = s.draw(2, _seed(seed, 2**31 - 1), law.horizon) if s.batched else s.draw(1, _seed(seed, 2**31 - 1),
                                                                                         law.horizon)
    # the e-process's cells: pooled as planned (fixed before sampling)
    cell_bin = np.full(len(law.outcomes), -1, np.int64)
    cell_bin[pos] = _merge(law.probs[pos] * n_plan, min_expected)
    nb = int(cell_bin.max()) + 1
    eproc = _EProcess(np.bincount(cell_bin[pos], law.probs[pos], nb), 1.0 / a_seq) if sequential and nb >= 2 else None
    counts = np.zeros(len(law.outcomes), np.float64)
    impossible = next((o for o in probe if law.index.get(o) is None or law.probs[law.index[o]] == 0), None)
    drawn, calls, t0 = 0, 0, time.perf_counter()
    bar = _Progress(n_target, "audit", progress)
    stopped = False
    try:
        while impossible is None and drawn < n_target:
            if budget is not None and time.perf_counter() - t0 > budget:
                break
            k = min(s.batch, n_target - drawn)
            rows = s.draw(k, _seed(seed, calls), law.horizon)
            calls += 1
            idx = np.fromiter((law.index.get(o, -1) for o in rows), np.int64, len(rows))
            bad = np.flatnonzero((idx < 0) | (law.probs[np.maximum(idx, 0)] == 0))
            if bad.size:
                impossible = rows[int(bad[0])]
                idx = idx[: int(bad[0])]
            used = eproc.update(cell_bin[idx]) if eproc is not None else None
            if used is not None:
                idx, stopped = idx[:used], True
            np.add.at(counts, idx, 1.0)
            drawn += idx.size
            bar.update(idx.size)
            if stopped:
                break
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    rng = np.random.default_rng(_seed(seed, 2**31 - 2))
    obs, pr = counts[pos], law.probs[pos]
    outs = [o for o, k in zip(law.outcomes, pos, strict=True) if k]
    stat, df, pval = _chi2(obs, pr, min_expected) if drawn else (0.0, 0, 1.0)
    fb = _merge(pr * max(drawn, 1), min_expected)
    kb = int(fb.max()) + 1
    tv_hat, ci, null_mean, null_q = _tv_summary(np.bincount(fb, obs, kb), np.bincount(fb, pr, kb), rng)
    over, under = _extremes(outs, obs, pr)
    seq = eproc.summary() if eproc is not None else {}
    notes = [f"the level {alpha:g} is split: {a_seq:g} for the sequential test, {a_fix:g} for the fixed-sample "
             "test; TV is measured on the pooled cells"] if sequential else []
    if impossible is not None:
        verdict, pval = "biased", 0.0
        short = (" (shorter than the horizon of "
                 f"{law.horizon} tokens: does the sampler stop where the oracle does (max_new_tokens, EOS)?)"
                 if len(impossible) < law.horizon else "")
        reason = f"sampled outcome {impossible!r}, which the law gives probability 0{short}"
    elif stopped:
        verdict, pval = "biased", seq["pvalue"]  # the chi-square p is not valid at a data-chosen n
        reason = (f"the sequential test stopped after {drawn} samples: likelihood ratio {seq['e_value']:.3g} "
                  f">= {seq['threshold']:g} (anytime-valid p <= {seq['pvalue']:.2g})")
    elif drawn and pval < a_fix:
        verdict = "biased"
        reason = f"chi-square p = {pval:.3g} < {a_fix:g} on {drawn} samples"
    elif drawn >= n_target:
        verdict = "consistent"
        reason = (f"no deviation found in {drawn} samples: a TV of {tv:g} or more would have been caught with "
                  f"probability {power:g}" if n is None else
                  f"no deviation found in {drawn} samples (n given: they catch TV >= "
                  f"{detectable_tv(drawn, kb, alpha=a_fix, power=power):.3g} with probability {power:g})")
    else:
        verdict = "inconclusive"
        reason = (f"the budget ran out after {drawn} of {n_target} samples; they catch TV >= "
                  f"{detectable_tv(drawn, kb, alpha=a_fix, power=power):.3g} with probability {power:g}")
    counter = Counter({o: int(c) for o, c in zip(outs, obs, strict=True) if c})
    positions = _positions(counter, law, None, law.horizon, alpha, min_expected) if drawn else []
    return AuditReport(
        verdict=verdict, reason=reason, pvalue=float(pval), alpha=alpha, tv=tv, power=power, n_planned=n_target,
        n=drawn, mode="law", cells=int(pos.sum()), bins=kb, statistic=stat, df=df, tv_hat=tv_hat, tv_ci=ci,
        tv_exact_mean=null_mean, tv_exact_q95=null_q,
        tv_detectable=detectable_tv(drawn, kb, alpha=a_fix, power=power), over=over, under=under,
        positions=positions, sequential=seq, impossible=impossible, seconds=seconds,
        samples_per_second=drawn / seconds if seconds > 0 else 0.0, horizon=law.horizon, notes=notes)


def _two_sample(s: _Sampler, r: _Sampler, horizon, tv, alpha, power, n, budget, seed, sequential, min_expected,
                pilot, progress) -> AuditReport:
    a_seq = alpha * SEQ_SHARE if sequential else 0.0
    a_fix = alpha - a_seq
    s.draw(2 if s.batched else 1, _seed(seed, 2**31 - 1), horizon)  # probes: bad output refused before sampling
    r.draw(2 if r.batched else 1, _seed(seed + 1, 2**31 - 1), horizon)
    t0 = time.perf_counter()
    n_pilot = int(pilot) if pilot is not None else max(1000, (n or 4000) // 4)
    pil: Counter = Counter()
    calls = 0
    while sum(pil.values()) < n_pilot:
        k = min(r.batch, n_pilot - sum(pil.values()))
        pil.update(r.draw(k, _seed(seed, 2**30 + calls), horizon))
        calls += 1
    cells = sorted(pil, key=repr)
    freq = np.array([pil[c] for c in cells], np.float64) / n_pilot
    # cells fixed by the pilot; everything the pilot did not see goes to one extra cell of mass ~0
    n_plan, _ = planned_sample_size(freq, tv, alpha=a_fix, power=power, min_expected=min_expected, two_sample=True)
    n_target = int(n) if n is not None else n_plan
    bins = _merge(freq * n_target, min_expected)
    kb = int(bins.max()) + 1
    cell_bin = {c: int(b) for c, b in zip(cells, bins, strict=True)}
    other = kb  # unseen outcomes
    ca, cb = np.zeros(kb + 1), np.zeros(kb + 1)
    eproc = _PairEProcess(kb + 1, 1.0 / a_seq) if sequential else None
    pend_a: list[int] = []  # bins drawn but not yet paired (the samplers' batches may differ)
    pend_b: list[int] = []
    stopped = False
    seen_a: Counter = Counter()
    seen_b: Counter = Counter()
    drawn_a = drawn_b = 0
    bar = _Progress(n_target, "audit (two-sample)", progress)
    t1 = time.perf_counter()
    i = 0
    try:
        while min(drawn_a, drawn_b) < n_target:
            if budget is not None and time.perf_counter() - t0 > budget:
                break
            for smp, cnt, seen, which in ((s, ca, seen_a, "a"), (r, cb, seen_b, "b")):
                done = drawn_a if which == "a" else drawn_b
                k = min(smp.batch, n_target - done)
                if k <= 0:
                    continue
                rows = smp.draw(k, _seed(seed + (which == "b"), i), horizon)
                seen.update(rows)
                got = [cell_bin.get(o, other) for o in rows]
                for c in got:
                    cnt[c] += 1
                if which == "a":
                    drawn_a += k
                    pend_a += got
                    bar.update(k)
                else:
                    drawn_b += k
                    pend_b += got
            i += 1
            if eproc is not None:  # pairs in drawing order: the sampler's j-th draw with the reference's j-th
                m = min(len(pend_a), len(pend_b))
                if m and eproc.update(np.array(pend_a[:m], np.int64), np.array(pend_b[:m], np.int64)) is not None:
                    stopped = True
                    break
                del pend_a[:m], pend_b[:m]
    finally:
        bar.close()
    seconds = time.perf_counter() - t1
    stat, df, pval = _homogeneity(ca, cb, min_expected)
    seq = eproc.summary() if eproc is not None else {}
    na, nb_ = max(ca.sum(), 1), max(cb.sum(), 1)
    tv_hat = 0.5 * float(np.abs(ca / na - cb / nb_).sum())
    rng = np.random.default_rng(_seed(seed, 2**31 - 2))
    fa, fb = ca / na, cb / nb_
    boot = 0.5 * np.abs(rng.multinomial(int(na), fa, 400) / na - rng.multinomial(int(nb_), fb, 400) / nb_).sum(1)
    pooled = (ca + cb) / (na + nb_)
    null = 0.5 * np.abs(rng.multinomial(int(na), pooled, 400) / na - rng.multinomial(int(nb_), pooled, 400) / nb_
                        ).sum(1)
    outs = sorted(set(seen_a) | set(seen_b), key=repr)
    oa = np.array([seen_a.get(o, 0) for o in outs], np.float64)
    ob = np.array([seen_b.get(o, 0) for o in outs], np.float64)
    over, under = _extremes(outs, oa, ob / nb_, ref="reference")
    n_done = int(min(drawn_a, drawn_b))
    if stopped:
        verdict, pval = "biased", seq["pvalue"]  # the chi-square p is not valid at a data-chosen n
        reason = (f"the two samplers differ: the sequential test stopped after {seq['stopped_at']} pairs: "
                  f"e-value {seq['e_value']:.3g} >= {seq['threshold']:g} (anytime-valid p <= {seq['pvalue']:.2g})")
    elif pval < a_fix:
        verdict, reason = "biased", f"the two samplers differ: chi-square p = {pval:.3g} < {a_fix:g}"
    elif n_done >= n_target:
        verdict = "consistent"
        reason = (f"no difference found in {n_done} samples each: a TV of {tv:g} or more between the two laws "
                  f"would have been caught with probability {power:g}")
    else:
        verdict = "inconclusive"
        reason = (f"the budget ran out after {n_done} of {n_target} samples each; they catch TV >= "
                  f"{detectable_tv(n_done, kb, alpha=a_fix, power=power, two_sample=True):.3g}")
    notes = [f"cells fixed by {n_pilot} pilot draws of the reference (not tested); outcomes the pilot did not "
             "see are pooled in one cell"]
    notes.append(f"the level {alpha:g} is split: {a_seq:g} for the sequential test (pairs, label-swap "
                 f"e-process), {a_fix:g} for the fixed-sample test" if sequential else "no sequential test")
    return AuditReport(
        verdict=verdict, reason=reason, pvalue=pval, alpha=alpha, tv=tv, power=power, n_planned=n_target, n=n_done,
        mode="two-sample", cells=len(outs), bins=kb + int(ca[other] + cb[other] > 0), statistic=stat, df=df,
        tv_hat=tv_hat,
        tv_ci=_basic(tv_hat, boot), tv_exact_mean=float(null.mean()),
        tv_exact_q95=float(np.quantile(null, 0.95)),
        tv_detectable=detectable_tv(n_done, kb, alpha=a_fix, power=power, two_sample=True), over=over, under=under,
        positions=_positions(seen_a, None, seen_b, horizon, alpha, min_expected) if n_done else [],
        sequential=seq, seconds=seconds, samples_per_second=(drawn_a + drawn_b) / seconds if seconds > 0 else 0.0,
        horizon=horizon, notes=notes)


class _CallableModule(types.ModuleType):
    """``import speculate.testing.audit`` binds the package's ``audit`` to this module (Python sets a
    package's attribute to a submodule it imports): calling it calls :func:`audit`, so
    ``from speculate.testing import audit; audit(...)`` works in either import order."""

    def __call__(self, *args: Any, **kwargs: Any) -> AuditReport:
        return audit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
