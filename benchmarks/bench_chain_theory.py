"""Outcomes per target call against theory, for token, block and multi-draft verification, k = 1..10.

Regimes: context-free target p and draft q over V = 16 outcomes with sum(min(p, q)) = alpha for
alpha in {0.5, 0.8, 0.9}. Token-wise theory is (1 - a^(k+1)) / (1 - a) (i.i.d. acceptance). Block
verification has no closed form here; it must be >= token (Sun et al.). For m-draft recursive
rejection, alpha_m = 1 - prod(1 - alpha_i) is the first-depth acceptance (exact); deeper positions
have fewer live branches, so expected_tokens(alpha_m, k) is an upper bound.

Run:  .venv/bin/python benchmarks/bench_chain_theory.py   (writes benchmarks/results/chain_theory.{json,md,png})
"""

from __future__ import annotations

import argparse

import numpy as np
from report import describe, machine, write

import speculate as sp
from speculate import theory

V, ROWS, KS = 16, 4000, range(1, 11)


def pair(alpha: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """p, q with sum(min(p, q)) = alpha exactly: q = alpha p + (1 - alpha) r, r on p's smallest half."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(V))
    r = np.zeros(V)
    r[np.argsort(p)[: V // 2]] = 1.0
    # move mass to where p is small; choose the mix so that sum(min(p, q)) == alpha (bisection)
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mix = (lo + hi) / 2
        q = (1 - mix) * p + mix * r / r.sum()
        lo, hi = (mix, hi) if theory.acceptance_rate(p, q) > alpha else (lo, mix)
    return p, q


def stage_alphas(p: np.ndarray, q: np.ndarray, m: int) -> list[float]:
    out, r = [], p.copy()
    for _ in range(m):
        a = theory.acceptance_rate(r, q)
        out.append(a)
        w = np.maximum(r - q, 0)
        if w.sum() <= 0:
            break
        r = w / w.sum()
    return out


def measure(p, q, k: int, verify: str, m: int) -> float:
    tgt = lambda states: sp.Categorical(probs=np.broadcast_to(p, (len(states), V)), validate=False)  # noqa: E731
    drf = sp.batched(lambda states: sp.Categorical(probs=np.broadcast_to(q, (len(states), V)), validate=False))
    res = sp.chains(tgt, drf, lambda s, x: s, [0] * ROWS, k + 1, lookahead=k, verify=verify, branches=m, rng=k)
    return res.stats.tokens_per_call


def main() -> None:
    rows = []
    for alpha in (0.5, 0.8, 0.9):
        p, q = pair(alpha)
        a = theory.acceptance_rate(p, q)
        for m in (2, 4):
            am = theory.multi_draft_acceptance(stage_alphas(p, q, m))
            for k in KS:
                rows.append(
                    {
                        "alpha": a,
                        "k": k,
                        "rule": f"multi m={m}",
                        "measured": measure(p, q, k, "token", m),
                        "theory": theory.expected_tokens(am, k),
                        "theory_kind": "upper bound",
                    }
                )
        for k in KS:
            for rule in ("token", "block"):
                rows.append(
                    {
                        "alpha": a,
                        "k": k,
                        "rule": rule,
                        "measured": measure(p, q, k, rule, 1),
                        "theory": theory.expected_tokens(a, k),
                        "theory_kind": "exact" if rule == "token" else "token theory (block >= it)",
                    }
                )
    env = machine()
    cmd = env["command"]
    lines = [
        "# Outcomes per target call vs theory",
        "",
        f"Command: `{cmd}` on {describe(env)}.",
        f"{ROWS} chains per point, each running one round of k drafts (V = {V}, context-free p, q).",
        "Token theory: (1 - a^(k+1)) / (1 - a). "
        "Multi-draft: expected_tokens(1 - prod(1 - alpha_i), k) is an upper bound.",
        "",
        "| alpha | k | token | theory | block | block / token | multi m=2 | bound | multi m=4 | bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(round(r["alpha"], 3), r["k"], r["rule"]): r for r in rows}
    for alpha in sorted({round(r["alpha"], 3) for r in rows}):
        for k in KS:
            t, b = by[(alpha, k, "token")], by[(alpha, k, "block")]
            m2, m4 = by[(alpha, k, "multi m=2")], by[(alpha, k, "multi m=4")]
            lines.append(
                f"| {alpha:.2f} | {k} | {t['measured']:.3f} | {t['theory']:.3f} | {b['measured']:.3f} | "
                f"{b['measured'] / t['measured']:.3f} | {m2['measured']:.3f} | {m2['theory']:.3f} | "
                f"{m4['measured']:.3f} | {m4['theory']:.3f} |"
            )
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), sharey=True)
    for ax, alpha in zip(axes, sorted({round(r["alpha"], 3) for r in rows}), strict=True):
        ks = list(KS)
        for rule, style in (("token", "o-"), ("block", "s-"), ("multi m=2", "^-"), ("multi m=4", "v-")):
            ax.plot(ks, [by[(alpha, k, rule)]["measured"] for k in ks], style, label=f"{rule} (measured)")
        ax.plot(ks, [by[(alpha, k, "token")]["theory"] for k in ks], "k--", label="token theory")
        ax.set_title(f"alpha = {alpha:.2f}")
        ax.set_xlabel("lookahead k")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("outcomes per target call")
    axes[0].legend(fontsize=8)
    fig.suptitle("Outcomes per target call: measured vs theory")
    fig.tight_layout()
    payload = {"command": cmd, "rows_per_point": ROWS, "V": V, "rows": rows, "machine": env}
    write("chain_theory", payload, "\n".join(lines), figure=fig)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__).parse_args()  # no options: --help, and unknown ones fail
    main()
