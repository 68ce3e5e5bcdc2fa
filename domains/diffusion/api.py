"""The public functions of the diffusion domain: plain and speculative sampling, their result.

- :func:`sample`: plain sampling with the target denoiser, one call per step (ancestral DDPM,
  stochastic DDIM or VP-SDE Euler-Maruyama: the sampler object says which);
- :func:`speculative_sample`: the same chain, exactly, with fewer sequential target calls (the
  :class:`~speculate.domains.diffusion.process.DiffusionProcess` on the core round loop);
- :class:`Sampling`: the samples, the :class:`DiffusionStats` of the run and the recorded states;
  it unpacks as ``x, stats = ...``.

Example:
    >>> import numpy as np
    >>> from speculate.domains.diffusion import DDPM, sample, speculative_sample
    >>> from speculate.domains.diffusion.marginal_law import GaussianData
    >>> sched = DDPM(timesteps=100)
    >>> target = GaussianData(mean=[2.0, 0.0, -2.0], std=0.3).denoiser(sched)
    >>> x, stats = sample(sched, target, shape=(4, 3), rng=0)
    >>> y, fast = speculative_sample(sched, target, "frozen", shape=(4, 3), lookahead=8, rng=0)
    >>> x.shape, y.shape == x.shape, stats.calls_per_step, fast.calls_per_step < 0.5
    ((4, 3), True, 1.0, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from speculate.domains.shared.gaussian_drift import check_cost_ratio, check_lookahead, is_int

from speculate.errors import add_note
from speculate.rng import as_rng
from speculate.rounds import run

from .denoisers import Denoiser
from .drafts import as_draft, step_means
from .process import DiffusionProcess, DiffusionStats, nonfinite_error
from .samplers import Sampler

__all__ = ["DiffusionStats", "Sampling", "sample", "speculative_sample"]


@dataclass
class Sampling:
    """The result of a run: ``x`` [B, *shape] (the samples, x_0), ``stats`` (a
    :class:`DiffusionStats`) and ``path`` ({time label: states [B, *shape]} for the times in
    ``record``; label T (or the sampler's first time) is the initial noise, 0 the samples).
    ``x, stats = result`` unpacks the first two."""

    x: np.ndarray
    stats: DiffusionStats
    path: dict = field(default_factory=dict)

    def __iter__(self):
        return iter((self.x, self.stats))


def _check_shape(shape: Any) -> tuple[int, ...]:
    if is_int(shape):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a tuple of ints (B, *event), got {shape!r}") from None
    if len(shape) < 2 or not all(is_int(s) for s in shape):
        raise ValueError(f"shape must be (B, *event) with at least one event axis, ints, got {shape!r}")
    if shape[0] < 0 or any(s < 1 for s in shape[1:]) or int(np.prod(shape, dtype=np.float64)) > 2**31:
        raise ValueError(f"shape must have B >= 0 and event sizes >= 1 (at most 2**31 numbers), got {shape!r}")
    return tuple(int(s) for s in shape)


def _check_labels(labels: Any, B: int, guidance: Any, null_label: Any) -> np.ndarray | None:
    if guidance is not None:
        if isinstance(guidance, bool) or not isinstance(guidance, (int, float, np.integer, np.floating)) \
                or not np.isfinite(guidance):
            raise ValueError(f"guidance must be None or a finite real number (the scale w), got {guidance!r}")
        if labels is None or null_label is None:
            raise ValueError("classifier-free guidance needs labels= (the classes) and null_label= (the label that "
                             "stands for 'no class')")
        if not is_int(null_label):
            raise TypeError(f"null_label must be an int, got {null_label!r}")
    if labels is None:
        return None
    a = np.asarray(labels)
    if a.dtype.kind not in "iu":
        raise TypeError(f"labels must be integers (class indices), got dtype {a.dtype}")
    if a.ndim == 0:
        a = np.full(B, a)
    if a.shape != (B,):
        raise ValueError(f"labels must be one int or one per sample ({B}), got shape {a.shape}")
    return a.astype(np.int64)


def _check_record(record: Any, labels_of_states: np.ndarray) -> np.ndarray:
    """Time labels -> state indices (0..S); ValueError for a time that is not a state of the chain."""
    wanted = [record] if is_int(record) else list(record)
    where = {int(t): s for s, t in enumerate(labels_of_states)}
    out = []
    for t in wanted:
        if not is_int(t) or int(t) not in where:
            raise ValueError(f"record: {t!r} is not a time of this sampler's chain (its states are at t = "
                             f"{labels_of_states[0]}, ..., {labels_of_states[-2]} and 0)")
        out.append(where[int(t)])
    return np.array(sorted(set(out)), np.int64)


def _check_lookahead(lookahead: Any, max_lookahead: Any, cost_ratio: Any) -> None:
    check_lookahead(lookahead)
    if not is_int(max_lookahead) or max_lookahead < 1:
        raise ValueError(f"max_lookahead must be an int >= 1, got {max_lookahead!r}")
    check_cost_ratio(cost_ratio)


def _setup(sampler, denoiser, shape, labels, guidance, null_label, record, dtype, device):
    if not isinstance(sampler, Sampler):
        raise TypeError(f"sampler must be a DDPM, DDIM or VPSDE, got {type(sampler).__name__}")
    shape = _check_shape(shape)
    labels = _check_labels(labels, shape[0], guidance, null_label)
    plan = sampler.plan()
    rec = _check_record(record, plan.labels)
    w = None if guidance is None else float(guidance)
    target = Denoiser(denoiser, who="target denoiser", guidance=w, null_label=null_label, dtype=dtype, device=device)
    stats = DiffusionStats(steps=len(plan.times), samples=shape[0], step_times=plan.times.copy(),
                           proposed_by_step=np.zeros(len(plan.times), np.int64),
                           accepted_by_step=np.zeros(len(plan.times), np.int64),
                           rejected_by_step=np.zeros(len(plan.times), np.int64),
                           rounds_by_step=np.zeros(len(plan.times), np.int64),
                           lookahead_by_step=np.zeros(len(plan.times), np.int64))
    return shape, labels, plan, rec, w, target, stats


def sample(
    sampler: Sampler,
    denoiser: Any,
    shape: Any,
    *,
    labels: Any = None,
    guidance: float | None = None,
    null_label: int | None = None,
    record: Any = (),
    rng: int | np.random.Generator | None = None,
    dtype: Any = None,
    device: Any = None,
) -> Sampling:
    """Plain sampling: x_T ~ N(0, I), then every step of ``sampler`` with the target, one call each.

    Args:
        sampler: ``DDPM(...)``, ``DDIM(...)`` or ``VPSDE(...)`` (the schedule, the steps, what the
            denoiser predicts).
        denoiser: ``denoiser(x[N, *event], t[N])`` -> ``[N, *event]`` (torch; with ``labels``:
            ``denoiser(x, t, labels[N])``).
        shape: ``(B, *event)``: B samples of the event shape (an image: ``(B, C, H, W)``).
        labels: class labels, one int or one per sample (class-conditional denoisers).
        guidance: classifier-free guidance scale w (the target is ``out_u + w (out_c - out_u)``,
            two evaluations per state in one call); needs ``labels`` and ``null_label``.
        record: time labels whose states to keep in ``path`` (the sampler's times and 0).
        rng: int seed, numpy Generator or None (unpredictable).
        dtype, device: what the denoiser receives (default: its first parameter's; float32 on CPU).

    Raises ValueError naming the time and the sample when the denoiser's output is not finite or has
    the wrong shape (TypeError when it is not real numbers) and for bad arguments (before any work);
    an exception raised inside (the denoiser's own, KeyboardInterrupt) carries a note naming the step.

    Example:
        >>> from speculate.domains.diffusion import DDIM, sample
        >>> from speculate.domains.diffusion.marginal_law import GaussianData
        >>> sched = DDIM(timesteps=100, steps=10, eta=1.0)
        >>> out = sample(sched, GaussianData([0.0], 1.0).denoiser(sched), (5, 1), record=(100, 0), rng=1)
        >>> out.x.shape, sorted(out.path), out.stats.target_calls
        ((5, 1), [0, 100], 10)
    """
    shape, labels, plan, rec, _, target, stats = _setup(sampler, denoiser, shape, labels, guidance, null_label,
                                                        record, dtype, device)
    rng = as_rng(rng)
    t0 = time.perf_counter()
    X = rng.standard_normal(shape)
    B = shape[0]
    path = {int(s): None for s in rec}
    if 0 in path:
        path[0] = X.copy()
    S = len(plan.times)
    i = 0
    try:
        for i in range(S if B else 0):
            t1 = time.perf_counter()
            idx = np.full(B, i)
            out, finite = target(X, np.full(B, plan.times[i]), labels)
            stats.target_time += time.perf_counter() - t1
            mean, _ = step_means(plan, idx, X, out)
            ok = finite & np.isfinite(mean.reshape(B, -1)).all(axis=1)
            if not ok.all():
                b = int(np.argmin(ok))
                raise nonfinite_error("the target denoiser's output", out[b], int(plan.times[i]), b)
            X = mean + plan.sigma[i] * rng.standard_normal(shape) if plan.sigma[i] > 0 else mean
            if i + 1 in path:
                path[i + 1] = X.copy()
    except BaseException as err:  # KeyboardInterrupt too: say where it stopped, then let it go
        add_note(err, f"speculate.domains.diffusion.sample: raised in step {i} of {S} (t = {plan.times[i]}, the "
                      f"denoiser call on all {B} samples)")
        raise
    steps = S if B else 0
    stats.rounds = stats.target_calls = steps  # a round without drafts per step
    stats.row_rounds = stats.emitted = steps * B
    stats.accepted_per_position[0] = steps * B
    stats.rounds_by_step[:steps] = B
    if steps:
        stats.lookahead_counts[0] = steps
    stats.target_evaluations = target.evaluations
    stats.wall_time = time.perf_counter() - t0
    labels_of_states = plan.labels
    return Sampling(X, stats, {int(labels_of_states[s]): v for s, v in path.items()})


def speculative_sample(
    sampler: Sampler,
    denoiser: Any,
    draft: Any = "frozen",
    shape: Any = None,
    *,
    lookahead: int | str = 8,
    labels: Any = None,
    guidance: float | None = None,
    null_label: int | None = None,
    record: Any = (),
    rng: int | np.random.Generator | None = None,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
    dtype: Any = None,
    device: Any = None,
) -> Sampling:
    """Sample the chain of ``sampler`` with the target ``denoiser`` exactly, drafting ``lookahead`` steps ahead.

    The samples (and every recorded state) have the law of ``sample(sampler, denoiser, shape, ...)``,
    with ``stats.target_calls`` sequential target calls instead of S; each call scores up to
    B (lookahead + 1) states at their own times.

    Args:
        draft: a smaller denoiser (the target's signature), ``"frozen"`` (the target's last eps, free),
            ``"frozen-x0"`` (its last x_0 prediction), ``frozen_correction(cheap)`` or a ``Draft``.
            With guidance the draft denoiser is guided too (same scale and labels).
        lookahead: drafted steps per round, or "auto" (chosen online from the measured acceptance and
            cost ratio, up to ``max_lookahead``; ``cost_ratio=`` fixes the ratio and makes "auto"
            depend on the seed alone).
        The other arguments are those of :func:`sample`.

    Deterministic steps (sigma = 0: the last step of every sampler, every step of DDIM with eta = 0)
    are never drafted: they end a row's block and take the target's mean. So DDIM with eta = 0 runs
    step by step (one target call per step, like ``sample``): a point-mass step can only be kept
    when the draft is exact.

    Raises like :func:`sample`; a non-finite target output at a drafted state the chain never
    reaches is harmless (the draft is cut there), a non-finite draft output only cuts that draft
    short (``stats.draft_truncations``). An exception raised inside carries the round loop's note
    naming the phase (the draft runs in propose, the target in score) and the round.

    Example:
        >>> from speculate.domains.diffusion import DDPM, speculative_sample
        >>> from speculate.domains.diffusion.marginal_law import GaussianData
        >>> sched = DDPM(timesteps=200, schedule="cosine")
        >>> data = GaussianData([1.0, 1.0], 0.2)
        >>> poor = GaussianData([0.0, 0.0], 0.5).denoiser(sched)     # a deliberately poor draft
        >>> x, stats = speculative_sample(sched, data.denoiser(sched), poor, (16, 2), lookahead=4, rng=0)
        >>> x.shape, stats.rejections > 0, stats.calls_per_step < 1
        ((16, 2), True, True)
    """
    if shape is None:
        raise TypeError("speculative_sample needs shape=(B, *event)")
    shape, labels, plan, rec, w, target, stats = _setup(sampler, denoiser, shape, labels, guidance, null_label,
                                                        record, dtype, device)
    _check_lookahead(lookahead, max_lookahead, cost_ratio)
    d = as_draft(draft)
    draft_fn = None
    if d.denoiser is not None:
        draft_fn = Denoiser(d.denoiser, who="draft denoiser", guidance=w, null_label=null_label, dtype=dtype,
                            device=device)
    rng = as_rng(rng)
    t0 = time.perf_counter()
    X = rng.standard_normal(shape)
    process = DiffusionProcess(plan, target, d, draft_fn, X, labels, rec, stats)
    run(process, shape[0], len(plan.times), lookahead=lookahead, verify="token", rng=rng,
        max_lookahead=max_lookahead, cost_ratio=cost_ratio, keep_samples=False, stats=stats)
    stats.wall_time = time.perf_counter() - t0
    labels_of_states = plan.labels
    return Sampling(process.X, stats, {int(labels_of_states[s]): v for s, v in process.path.items()})
