"""Throughput of the verification kernels next to a NumPy copy of the same bytes, in one run.

B=64 rows, K=8 drafts, V=32000, float32 (the issue's setting). The token kernel reads, per row, the
drafted entries and then ONE pair of rows (p, q) at the first rejection (the residual) or the
target's bonus row: the bytes it touches are measured against np.copy of exactly those rows
(gathered into a buffer). Block verification reads more (its R_i sums); it is measured against a
copy of the rows it scans and against a copy of all of p and q. The tree kernel is timed on a tree
of 2 x 2 x 1 candidates (10 nodes, depth 3) per row, children drafted i.i.d. and without replacement.

Run:  .venv/bin/python benchmarks/bench_kernels.py   (writes benchmarks/results/kernels.{json,md})
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from report import describe, machine, write

from speculate.verify import Tree, verify_block, verify_greedy, verify_token, verify_tree

B, K, V = 64, 8, 32000


def best_of(fn, repeat: int = 30) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.min(times))


def problem(rng):
    p = rng.dirichlet(np.full(V, 0.3), (B, K + 1)).astype(np.float32)
    q = (0.6 * p[:, :K] + 0.4 * rng.dirichlet(np.full(V, 0.3), (B, K))).astype(np.float32)
    q /= q.sum(-1, keepdims=True)
    return p, q


def tree_timing(rng, B: int = B, V: int = V, branching=(2, 2, 1), repeat: int = 30) -> dict:
    """Serial and parallel times of verify_tree on B rows of one tree shape, both drafting modes."""
    tree = Tree.from_branching(list(branching))
    N1 = len(tree.parent)
    p = rng.dirichlet(np.full(V, 0.3), (B, N1)).astype(np.float32)
    q = (0.6 * p + 0.4 * rng.dirichlet(np.full(V, 0.3), (B, N1))).astype(np.float32)
    q /= q.sum(-1, keepdims=True)
    out = {"nodes": N1 - 1, "depth": int(tree.depth.max())}
    for repl in (True, False):
        tokens = np.zeros((B, N1), np.int64)
        for i in range(1, N1):  # the argmax of a perturbed q at the parent: distinct siblings
            w = q[:, tree.parent[i]] * (0.5 + rng.random((B, V)))
            for c in range(1, i):
                if tree.parent[c] == tree.parent[i]:
                    w[np.arange(B), tokens[:, c]] = 0.0
            tokens[:, i] = np.argmax(w, -1)
        u, u_next = rng.random((B, N1)), rng.random(B)
        n, _, _ = verify_tree(p, q, tokens, tree.parent, None, u, u_next, replacement=repl, validate=False)
        key = "iid" if repl else "without_replacement"
        out[key] = {"mean_depth": float(n.mean())}
        for par in (False, True):
            out[key]["parallel_s" if par else "serial_s"] = best_of(
                lambda par=par, tokens=tokens, u=u, u_next=u_next, repl=repl: verify_tree(
                    p, q, tokens, tree.parent, None, u, u_next, replacement=repl, validate=False, parallel=par),
                repeat)
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    p, q = problem(rng)
    rows = np.arange(B)
    # regimes: reject at the first draft (residual at position 0), all kept (bonus row), typical
    worst = np.argmax(q[:, 0] - p[:, 0], axis=-1)  # p/q < 1 there: rejected when u ~ 1
    drafts_mixed = np.stack([np.argmax(q[:, i] * (0.5 + rng.random((B, V))), -1) for i in range(K)], 1)
    drafts_reject = drafts_mixed.copy()
    drafts_reject[:, 0] = worst
    regimes = {
        "reject_first": (drafts_reject, np.full((B, K), 1 - 1e-9)),
        "accept_all": (drafts_mixed, np.zeros((B, K))),
        "typical": (drafts_mixed, rng.random((B, K))),
    }
    u_next = rng.random(B)
    results = {}
    for name, (d, u) in regimes.items():
        n, _ = verify_token(p, q, d, None, u, u_next)
        # bytes the token kernel touches: the residual rows (p, q at position n) or the bonus row of p
        rej = n < K
        touched = (rej.sum() * 2 + (~rej).sum()) * V * 4
        gp, gq = np.empty((B, V), np.float32), np.empty((int(rej.sum()), V), np.float32)

        def copy_same(n=n, rej=rej, gp=gp, gq=gq):
            np.copyto(gp, p[rows, n])
            np.copyto(gq, q[rows[rej], n[rej]])

        t_tok = {
            par: best_of(lambda par=par, d=d, u=u: verify_token(p, q, d, None, u, u_next, parallel=par))
            for par in (False, True)
        }
        t_copy = best_of(copy_same)
        nb, _ = verify_block(p, q, d, None, u, u_next)
        t_blk = {
            par: best_of(lambda par=par, d=d, u=u: verify_block(p, q, d, None, u, u_next, parallel=par))
            for par in (False, True)
        }
        results[name] = {
            "mean_accepted_token": float(n.mean()),
            "mean_accepted_block": float(nb.mean()),
            "token_bytes_touched": int(touched),
            "token_serial_s": t_tok[False],
            "token_parallel_s": t_tok[True],
            "copy_same_bytes_s": t_copy,
            "token_GBps": touched / min(t_tok.values()) / 1e9,
            "copy_GBps": touched / t_copy / 1e9,
            "token_over_copy": min(t_tok.values()) / t_copy,
            "block_serial_s": t_blk[False],
            "block_parallel_s": t_blk[True],
        }
    full = np.empty_like(p), np.empty_like(q)
    t_full = best_of(lambda: (np.copyto(full[0], p), np.copyto(full[1], q)), repeat=10)
    t_greedy = best_of(lambda: verify_greedy(p, drafts_mixed, None))
    trees = tree_timing(rng)
    env = machine()
    meta = {
        "command": env["command"],
        "setting": {"B": B, "K": K, "V": V, "dtype": "float32"},
        "full_copy_p_and_q_s": t_full,
        "full_copy_GBps": (p.nbytes + q.nbytes) / t_full / 1e9,
        "greedy_s": t_greedy,
        "tree": trees,
        "machine": env,
        "regimes": results,
    }
    lines = [
        "# Verification kernels vs a NumPy copy of the same bytes",
        "",
        f"Command: `{meta['command']}`. Setting: B={B}, K={K}, V={V}, float32; best of 30 runs; {describe(env)}.",
        "",
        "Token kernel: bytes touched = the residual rows (p and q at the first rejection) or the target's bonus row.",
        "",
        "| regime | mean kept (token) | bytes touched | token serial | token parallel | copy of same bytes "
        "| token GB/s | copy GB/s | token / copy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['mean_accepted_token']:.2f} | {r['token_bytes_touched'] / 1e6:.1f} MB | "
            f"{r['token_serial_s'] * 1e3:.2f} ms | {r['token_parallel_s'] * 1e3:.2f} ms | "
            f"{r['copy_same_bytes_s'] * 1e3:.2f} ms | "
            f"{r['token_GBps']:.1f} | {r['copy_GBps']:.1f} | {r['token_over_copy']:.2f} |"
        )
    lines += [
        "",
        "Block kernel (scans positions from the last down and stops at the first success; each scanned "
        "position reads one p and one q row):",
        "",
        "| regime | mean kept (block) | block serial | block parallel | full copy of p and q |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['mean_accepted_block']:.2f} | {r['block_serial_s'] * 1e3:.2f} ms | "
            f"{r['block_parallel_s'] * 1e3:.2f} ms | {t_full * 1e3:.2f} ms |"
        )
    lines += ["", f"Greedy kernel (argmax rows until the first mismatch): {t_greedy * 1e3:.2f} ms.", ""]
    lines += [
        f"Tree kernel ({trees['nodes']} nodes of depth {trees['depth']} per row, 2 x 2 x 1 candidates; random "
        "uniforms; each candidate tried reads q at its parent, each rejection one residual pass):",
        "",
        "| children | mean accepted depth | tree serial | tree parallel |",
        "|---|---|---|---|",
    ]
    for key in ("iid", "without_replacement"):
        t = trees[key]
        lines.append(
            f"| {key} | {t['mean_depth']:.2f} | {t['serial_s'] * 1e3:.2f} ms | {t['parallel_s'] * 1e3:.2f} ms |"
        )
    lines.append("")
    write("kernels", meta, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__).parse_args()  # no options: --help, and unknown ones fail
    main()
