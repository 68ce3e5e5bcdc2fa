"""Served throughput and latency: `speculate serve` with speculation on and off, and transformers'
own server (`transformers serve`, with and without its continuous batching), on the embedded pair,
under 1, 4 and 16 concurrent clients.

Each system runs as its own process on 127.0.0.1 (one torch thread each: the load generator gets the
other core). A client sends streamed completions back to back (``stream: true``, greedy, a Python
prompt from the standard library's sources, ``max_tokens`` new tokens); for every request it records
the time to the first token, and the time per output token after it. The systems are measured in
turns (system after system at each concurrency, then again), bounded in requests and seconds.

Goal (issue #34): at every concurrency our served speculative throughput >= 1.3x our served plain
throughput (`--lookahead 0`: the same server and loop, no drafts), and a lower median time per
output token than transformers' serve on the same model.

    python benchmarks/serve/bench_serve.py            # writes benchmarks/results/serve.{json,md}
    python benchmarks/serve/bench_serve.py --quick    # fewer requests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prompts(n: int, seed: int = 0) -> list[str]:
    """Lines that open a function or class in the standard library's sources (what the pair learned)."""
    import inspect
    import json as js
    import textwrap

    src = inspect.getsource(textwrap) + inspect.getsource(js.decoder) + inspect.getsource(argparse)
    lines = [ln for ln in src.splitlines() if ln.strip().startswith(("def ", "class ", "if ", "for ", "return "))]
    rng = random.Random(seed)
    return [rng.choice(lines).rstrip() + "\n" for _ in range(n)]


SYSTEMS = {
    "speculate (speculative)": lambda port: [sys.executable, "-m", "speculate", "serve", "--port", str(port),
                                             "--lookahead", "4", "--threads", "1", "--log-level", "error",
                                             "--max-batch", "32"],
    "speculate (plain)": lambda port: [sys.executable, "-m", "speculate", "serve", "--port", str(port),
                                       "--lookahead", "0", "--threads", "1", "--log-level", "error",
                                       "--max-batch", "32"],
    "transformers serve": lambda port: [str(Path(sys.executable).with_name("transformers")), "serve",
                                        str(ROOT / "domains/text/examples/weights/target"), "--port", str(port),
                                        "--device", "cpu", "--log-level", "error"],
    "transformers serve --continuous-batching": lambda port: [
        str(Path(sys.executable).with_name("transformers")), "serve",
        str(ROOT / "domains/text/examples/weights/target"), "--port", str(port), "--device", "cpu",
        "--log-level", "error", "--continuous-batching"],
}


def _start(name: str, port: int) -> subprocess.Popen | None:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen(SYSTEMS[name](port), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=ROOT)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            print(f"{name}: exited ({proc.returncode}): {proc.stderr.read().decode()[-800:]}", file=sys.stderr)
            return None
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    return None


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    n_tok = 0
    chunks = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("text"):
                chunks += 1
                if first is None:
                    first = time.perf_counter()
            if ev.get("usage"):
                n_tok = ev["usage"]["completion_tokens"]
    t1 = time.perf_counter()
    return {"ttft": (first or t1) - t0, "total": t1 - t0, "tokens": n_tok or chunks, "first": first, "end": t1}


async def _load(url: str, model: str, clients: int, per_client: int, max_tokens: int, budget: float,
                prompts: list[str]) -> dict:
    stop = time.perf_counter() + budget
    out: list[dict] = []
    async with httpx.AsyncClient(timeout=600) as client:
        await _one(client, url, model, prompts[0], 8)  # warm up the path (first calls, allocations)

        async def worker(w: int) -> None:
            for i in range(per_client):
                if time.perf_counter() > stop:
                    return
                out.append(await _one(client, url, model, prompts[(w * per_client + i) % len(prompts)], max_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(clients)))
        wall = time.perf_counter() - t0
    toks = sum(r["tokens"] for r in out)
    tpot = [(r["end"] - r["first"]) / (r["tokens"] - 1) for r in out if r["first"] and r["tokens"] > 1]
    ttft = [r["ttft"] for r in out]
    q = lambda a, p: float(np.percentile(a, p)) if a else float("nan")  # noqa: E731
    return {"requests": len(out), "tokens": toks, "seconds": wall, "throughput": toks / wall,
            "ttft_p50": q(ttft, 50), "ttft_p99": q(ttft, 99), "tpot_p50": q(tpot, 50), "tpot_p99": q(tpot, 99)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--turns", type=int, default=2, help="measurements of each (system, concurrency), in turns")
    ap.add_argument("--budget", type=float, default=40.0, help="seconds per measurement at most")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    names = [n for n in args.systems.split(",") if n]
    cmd = "python benchmarks/serve/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:])
    prompts = _prompts(256)
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    notes: list[str] = []
    try:
        for name in names:
            port = _free_port()
            proc = _start(name, port)
            if proc is None:
                notes.append(f"{name}: did not start (see stderr); not measured")
                continue
            servers[name] = (proc, f"http://127.0.0.1:{port}")
        runs: dict[tuple[str, int], list[dict]] = {}
        for turn in range(args.turns):
            for c in levels:
                per = max(2, (8 if args.quick else 24) // c) if c > 1 else (4 if args.quick else 12)
                for name in (list(servers) if turn % 2 == 0 else list(servers)[::-1]):
                    proc, url = servers[name]
                    model = "speculate" if name.startswith("speculate") else \
                        str(ROOT / "domains/text/examples/weights/target")
                    try:
                        r = asyncio.run(_load(url, model, c, per, args.max_tokens, args.budget, prompts))
                    except Exception as err:  # a system that fails is reported, not fatal
                        notes.append(f"{name} at {c} clients: {type(err).__name__}: {str(err)[:200]}")
                        continue
                    runs.setdefault((name, c), []).append(r)
                    print(f"turn {turn} {name:26s} c={c:2d}: {r['throughput']:7.1f} tok/s  "
                          f"ttft p50 {r['ttft_p50'] * 1e3:6.1f} ms  tpot p50 {r['tpot_p50'] * 1e3:6.2f} ms",
                          flush=True)
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGINT)
        for proc, _ in servers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    rows = []
    for (name, c), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        med = {k: float(np.median([r[k] for r in rs])) for k in rs[0]}
        rows.append({"system": name, "clients": c, "turns": len(rs), **med})
    ratios = {}
    for c in levels:
        by = {r["system"]: r for r in rows if r["clients"] == c}
        spec, plain, hf, _ = (by.get(k) for k in SYSTEMS)
        if spec and plain:
            ratios.setdefault(c, {})["spec_over_plain_throughput"] = spec["throughput"] / plain["throughput"]
        if spec and hf:
            ratios.setdefault(c, {})["tpot_p50_ours_over_transformers"] = spec["tpot_p50"] / hf["tpot_p50"]
    import torch
    import transformers

    meta = {"command": cmd, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "max_tokens": args.max_tokens, "notes": notes}
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "serve_quick" if args.quick else "serve"
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows, "ratios": ratios}, indent=2))
    md = [f"# Served throughput and latency ({'quick' if args.quick else 'full'} run)", "",
          f"Command: `{cmd}`", "",
          f"Embedded pair, greedy, {args.max_tokens} new tokens per request, streamed; one torch thread per "
          f"server; medians of {args.turns} turns (systems alternated). torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {meta['machine']}.", "",
          "| clients | system | requests | tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p99 (ms) |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['clients']} | {r['system']} | {r['requests']:.0f} | {r['throughput']:.1f} | "
                  f"{r['ttft_p50'] * 1e3:.1f} | {r['ttft_p99'] * 1e3:.1f} | {r['tpot_p50'] * 1e3:.2f} | "
                  f"{r['tpot_p99'] * 1e3:.2f} |")
    md += ["", "| clients | speculative / plain throughput (goal >= 1.3) | TPOT p50 ours / transformers serve "
           "(goal < 1) |", "|---|---|---|"]
    for c, r in ratios.items():
        a, b = r.get("spec_over_plain_throughput"), r.get("tpot_p50_ours_over_transformers")
        md.append(f"| {c} | {'n/a' if a is None else f'{a:.2f}x'} | {'n/a' if b is None else f'{b:.2f}'} |")
    if notes:
        md += ["", "Notes:", *[f"- {n}" for n in notes]]
    (RESULTS / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
