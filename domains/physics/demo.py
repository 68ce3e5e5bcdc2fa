"""``speculate demo physics``: exact speculative Langevin dynamics in under a minute.

Three parts, each printed as it finishes:
  1. exactness: 20000 double-well replicas, binned paths (x_1, x_2, x_3) of the speculative run
     against their exact law (numerical integration) and against a plain run;
  2. a Lennard-Jones fluid (N = 256): acceptance and sequential force calls per step for the
     frozen and the frozen-correction drafts;
  3. wall clock on CPU with a force that batches well: a small MLP potential trained for a few
     seconds on the Mueller-Brown surface, one trajectory, plain vs speculative.
Run ``python benchmarks/physics/bench_nn.py`` and ``bench_lj.py`` for the full measurements.

Example:
    >>> from speculate.domains.physics.demo import demo
    >>> demo(["--part", "1", "--replicas", "4000"])           # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from speculate.testing import DEFAULT_ALPHA, assert_categorical_matches, assert_same_categorical

from .api import simulate, speculative_simulate
from .checks import path_outcomes
from .drafts import frozen_correction
from .langevin import Langevin
from .lennard_jones import LennardJones, fcc_lattice
from .path_law import binned_path_law
from .potentials import DoubleWell, MuellerBrown

EDGES, STEPS, LOOKAHEAD = (-0.6, 0.4, 1.1), 3, 2  # part 1: the bins of (x_1, x_2, x_3), lookahead 2


def _exactness(replicas: int) -> None:
    well = DoubleWell(1.0)
    model = Langevin(force=well, draft_force=DoubleWell(1.0, tilt=2.0), dt=0.05)
    x0 = np.full((replicas, 1, 1), 1.4)
    law = binned_path_law(model, 1.4, EDGES, STEPS)
    spec = speculative_simulate(model, x0, STEPS, lookahead=LOOKAHEAD, rng=1)
    plain = simulate(model, x0, STEPS, rng=2)
    a = path_outcomes(spec.positions[:, 1:, 0, 0], EDGES)
    b = path_outcomes(plain.positions[:, 1:, 0, 0], EDGES)
    p_law = assert_categorical_matches(a, law, alpha=DEFAULT_ALPHA)
    p_two = assert_same_categorical(a, b, alpha=DEFAULT_ALPHA)
    print(f"1) double well, {replicas} replicas, draft = a tilted well (alpha "
          f"{spec.stats.alpha:.3f}): binned (x1, x2, x3) vs exact law p = {p_law:.3f}, "
          f"vs plain simulate p = {p_two:.3f}  (exact: both pass at alpha = {DEFAULT_ALPHA:g})")


def _lennard_jones(steps: int) -> None:
    x0, L = fcc_lattice(4, 0.8)                                   # N = 256
    exact = LennardJones(L)
    cheap = LennardJones(L, cutoff=2.0, method="cells")
    X = simulate(Langevin(force=cheap, dt=2e-4), x0, 500, rng=0, record_every=500).final
    print(f"2) Lennard-Jones fluid, N = {x0.shape[0]}, density 0.8, kT = 1, exact force all "
          f"pairs (cutoff L/2 = {L / 2:.2f}), lookahead 8:")
    for dt in (2e-5, 1e-4):
        for name, draft in (("frozen", "frozen"), ("corrected", frozen_correction(cheap))):
            model = Langevin(force=exact, draft_force=draft, dt=dt)
            s = speculative_simulate(model, X, steps, lookahead=8, rng=0, record_every=steps).stats
            print(f"   dt={dt:g} draft {name:9s}: alpha {s.alpha:.3f}, exact-force calls per "
                  f"step {s.calls_per_step:.3f} (plain: 1)")


def _neural(steps: int, train_steps: int) -> None:
    import torch

    from .neural import MLPPotential, TorchForce, fit_potential

    torch.set_num_threads(1)
    mb = MuellerBrown(0.1)
    starts = np.array(MuellerBrown.minima)[np.arange(48) % 3][:, None, :]
    X = simulate(Langevin(force=mb, dt=5e-4, kT=1.5), starts, 400, rng=0, record_every=4).positions
    X = X[:, 1:].reshape(-1, 1, 2)
    torch.manual_seed(0)
    module = MLPPotential(2, 128, 3, center=X.reshape(-1, 2).mean(0), spread=X.reshape(-1, 2).std(0),
                          energy_scale=float(mb.energy(X).std()))
    info = fit_potential(module, mb.energy, mb.force, X, steps=train_steps, batch=256, lr=5e-3)
    force = TorchForce(module)
    start = np.array([[-0.558, 1.442]])
    model = Langevin(force=force, draft_force="frozen", dt=3e-4)
    speculative_simulate(model, start, 20, rng=0)                # warm up
    t = time.perf_counter()
    simulate(model, start, steps, rng=0, record_every=steps)
    tp = time.perf_counter() - t
    t = time.perf_counter()
    s = speculative_simulate(model, start, steps, lookahead=8, rng=0, record_every=steps).stats
    ts = time.perf_counter() - t
    print(f"3) MLP potential (128x3, relative force error {info['relative_force_rmse']:.3f} after "
          f"{train_steps} training steps) on Mueller-Brown, one trajectory, frozen draft, dt 3e-4:\n"
          f"   plain {steps / tp:.0f} steps/s, speculative {steps / ts:.0f} steps/s "
          f"({tp / ts:.2f}x), alpha {s.alpha:.3f}, force calls per step "
          f"{s.calls_per_step:.3f} (CPU, 1 thread, one run: the machine may be noisy)")


def demo(argv: list[str] | None = None) -> int:
    """Run the physics demo; returns 0 (the exit status)."""
    ap = argparse.ArgumentParser(prog="speculate demo physics", description=__doc__.splitlines()[0])
    ap.add_argument("--part", type=int, choices=(1, 2, 3), action="append",
                    help="run only this part (repeatable)")
    ap.add_argument("--replicas", type=int, default=None, help="double-well replicas (default 20000, quick 4000)")
    ap.add_argument("--lj-steps", type=int, default=None, help="Lennard-Jones steps (default 100, quick 30)")
    ap.add_argument("--nn-steps", type=int, default=None, help="MLP-potential steps (default 2000, quick 500)")
    ap.add_argument("--train-steps", type=int, default=500, help="MLP training steps (fewer leave a poor fit)")
    ap.add_argument("--quick", action="store_true", help="smaller defaults for every part")
    args = ap.parse_args(argv)
    for name, full, quick in (("replicas", 20_000, 4000), ("lj_steps", 100, 30), ("nn_steps", 2000, 500)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    parts = set(args.part or (1, 2, 3))
    t = time.perf_counter()
    print("speculate demo physics: exact speculative Brownian dynamics (Euler-Maruyama chain)")
    if 1 in parts:
        _exactness(args.replicas)
    if 2 in parts:
        _lennard_jones(args.lj_steps)
    if 3 in parts:
        _neural(args.nn_steps, args.train_steps)
    print(f"done in {time.perf_counter() - t:.1f} s; full benchmarks: benchmarks/physics/")
    return 0


if __name__ == "__main__":
    raise SystemExit(demo())
