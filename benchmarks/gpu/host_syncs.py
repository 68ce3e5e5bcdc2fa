"""Where a round of speculative decoding waits for the GPU: host syncs by round phase.

The issue's goal on an H100: no host sync inside a round but the transfers it cannot do without.
With drafting and verification on the device (``verify_on_device=True``), a round should read back
twice: the drafts (``drafts.py::ModelDraft._on_device``, one transfer) and the counts
(``speculate/verify/device.py::verify_device_round``, one transfer). This script checks that on
the embedded pair (bf16), batch 1 and 8, ``cuda_graphs`` False and True, two ways:

1. ``torch.cuda.set_sync_debug_mode("warn")``: torch warns ("called a synchronizing CUDA
   operation") at every op that goes through c10's ``memcpy_and_sync`` / ``stream_synchronize``
   (``.cpu()``, ``.item()``, ``.tolist()``, ``bool(t)``, copies between host and device with
   ``non_blocking=False`` in either direction, ``nonzero`` ...). Each warning is caught with the
   Python stack at that moment and attributed to the round phase it came from: ``draft``
   (``TextProcess.propose``), ``target`` (``TextProcess.score``), ``verify`` (the loop's
   ``verify_round``) or ``commit`` (``TextProcess.commit``), ``outside`` otherwise (prefill, setup,
   the loop's bookkeeping). The site is the innermost frame inside the repository.
   Not seen this way: ``torch.cuda.synchronize()``, ``Event.synchronize()``, syncs inside
   libraries that call CUDA directly.
2. ``torch.profiler`` (CPU + CUDA) of the same generation, with a ``record_function`` range per
   phase: the CUDA runtime calls that block the host (cudaStreamSynchronize,
   cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy) and the device-to-host copies, per
   phase (what 1. cannot see shows here).

The phases are found by wrapping ``TextProcess.propose / score / commit`` and the round loop's
``verify_round`` (``speculate.rounds.verify_round`` and ``speculate.verify.one_round.verify_round``)
in this process only; the originals are put back afterwards.

Run on a GPU machine: ``python benchmarks/gpu/host_syncs.py`` (CUDA by default; budgeted at 90 s on
an H100, not yet run on one). Writes ``$OUT/gpu_host_syncs.{json,md}`` (``OUT`` defaults to
benchmarks/results; ``--out PREFIX`` writes ``PREFIX.json`` / ``PREFIX.md``). ``--device cpu`` runs
the same plumbing on a CPU for a smoke test: the sync debug mode needs CUDA, so nothing is detected
there (the output says so). Exit code 0, or 1 when a variant failed (its error is in the output);
with no CUDA device and no ``--device``, it says so and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py
sys.path.insert(0, str(ROOT / "benchmarks" / "text"))  # bench_generate.py: prompts and batches

import torch  # noqa: E402
from report import describe, machine, write  # noqa: E402

#: the round's phases (the function each one is) and the label of everything else
PHASES = {"draft": "TextProcess.propose", "target": "TextProcess.score",
          "verify": "verify_round (speculate.rounds / speculate.verify.one_round)",
          "commit": "TextProcess.commit"}
OUTSIDE = "outside"
ALL_PHASES = (*PHASES, OUTSIDE)
#: what torch's warning says (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync: TORCH_WARN(
#: "called a synchronizing CUDA operation"); Python sees it with " (Triggered internally at ...)")
SYNC_TEXT = "called a synchronizing CUDA operation"
#: CUDA runtime calls that block the host until the device (or a stream, or an event) catches up
BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
#: the two transfers a round is expected to make: (file, a piece of the source line)
EXPECTED = {
    "the drafts' transfer": ("domains/text/drafts/model.py", "torch.stack(xs, dim=1).cpu()"),
    "the counts' transfer": ("speculate/verify/device.py", "torch.stack([n, nxt, branch, ok.to(torch.int64)]).cpu()"),
}
#: source-line patterns -> the synchronising op they most likely are ("op" in the output)
OPS = ((".cpu()", "Tensor.cpu (device to host)"), (".item()", "Tensor.item"), (".tolist()", "Tensor.tolist"),
       (".numpy()", "Tensor.numpy"), ("nonzero", "nonzero"), ("torch.as_tensor(", "torch.as_tensor (a copy)"),
       ("torch.tensor(", "torch.tensor (a copy)"), (".copy_(", "Tensor.copy_"),
       (".to(", "Tensor.to (a copy between devices)"), ("bool(", "bool(tensor)"), ("int(", "int(tensor)"),
       ("float(", "float(tensor)"), ("synchronize", "synchronize"))
THIS = Path(__file__).resolve()
WARNINGS = Path(warnings.__file__).resolve()
CPU_NOTE = ("CPU: sync detection not available (torch.cuda.set_sync_debug_mode needs CUDA, and the profiler "
            "sees no CUDA runtime calls): this run checks the plumbing only")


# ------------------------------------------------------------------------------------------------
# attribution: which phase of the round is running, and where a synchronising op was called


@dataclass(frozen=True)
class SyncEvent:
    """One synchronising op: the phase it ran in and where it was called."""

    phase: str
    site: str  #: "path:line" of the innermost frame inside the repository (relative to it)
    code: str  #: that frame's source line
    innermost: str  #: "path:line" of the innermost Python frame (may be in torch or transformers)
    op: str | None  #: the op, guessed from the source lines (OPS); None when no pattern matches


@functools.lru_cache(maxsize=4096)
def _resolved(filename: str) -> Path:
    return Path(filename).resolve()


def _in_repo(filename: str) -> bool:
    p = _resolved(filename)
    if p == THIS or "site-packages" in p.parts or ".venv" in p.parts:
        return False
    return p.is_relative_to(ROOT)


def _where(frame: traceback.FrameSummary) -> str:
    p = _resolved(frame.filename)
    name = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else frame.filename
    return f"{name}:{frame.lineno}"


def _guess_op(*lines: str) -> str | None:
    for line in lines:
        for pattern, op in OPS:
            if pattern in (line or ""):
                return op
    return None


def locate(stack: Sequence[traceback.FrameSummary], filename: str = "?", lineno: int = 0) -> tuple[str, str, str]:
    """``(site, code, innermost)`` of a synchronising op called at the bottom of ``stack``: frames of
    the warnings module and of this script (the phase wrappers) are skipped; the site is the innermost
    remaining frame inside the repository (this script's own frames when there is none; the
    warning's ``filename:lineno`` when the stack is empty)."""
    frames = [f for f in stack if _resolved(f.filename) != WARNINGS]
    frames = [f for f in frames if _resolved(f.filename) != THIS] or frames
    if not frames:
        return f"{filename}:{lineno}", "", f"{filename}:{lineno}"
    inner = frames[-1]
    repo = [f for f in frames if _in_repo(f.filename)]
    site = repo[-1] if repo else inner
    return _where(site), (site.line or "").strip(), _where(inner)


class SyncRecorder:
    """Keeps the current phase (set by :meth:`wrap`) and the synchronising ops seen in each.

    ``ranges``: the wrappers also open a ``torch.profiler.record_function("phase:<name>")`` range.
    ``calls`` counts the wrapped calls per phase (``calls["draft"]`` = rounds).
    """

    def __init__(self, ranges: bool = False, on_round: Callable[[int], None] | None = None) -> None:
        self.phase = OUTSIDE
        self.ranges = ranges
        self.on_round = on_round  # called with the round's index (from 0) before each draft phase
        self.events: list[SyncEvent] = []
        self.calls: Counter = Counter()
        self.other_warnings: list[str] = []

    def wrap(self, phase: str, fn: Callable) -> Callable:
        """``fn`` with the current phase set to ``phase`` while it runs."""
        recorder = self

        @functools.wraps(fn)
        def in_phase(*args: Any, **kwargs: Any) -> Any:
            if phase == "draft" and recorder.on_round is not None:
                recorder.on_round(recorder.calls["draft"])
            prev, recorder.phase = recorder.phase, phase
            recorder.calls[phase] += 1
            try:
                if recorder.ranges:
                    with torch.profiler.record_function(f"phase:{phase}"):
                        return fn(*args, **kwargs)
                return fn(*args, **kwargs)
            finally:
                recorder.phase = prev

        return in_phase

    def showwarning(self, message: Any, category: type, filename: str, lineno: int, file: Any = None,
                    line: str | None = None) -> None:
        """A ``warnings.showwarning`` that records torch's sync warnings with the stack at that moment."""
        text = str(message)
        if SYNC_TEXT not in text:
            self.other_warnings.append(f"{category.__name__}: {text[:200]}")
            return
        stack = traceback.extract_stack()[:-1]
        site, code, innermost = locate(stack, filename, lineno)
        inner_line = next((f.line or "" for f in reversed(stack) if _where(f) == innermost), "")
        self.events.append(SyncEvent(self.phase, site, code, innermost, _guess_op(code, inner_line)))

    @contextlib.contextmanager
    def capture(self, debug_mode: bool) -> Iterator[None]:
        """Record every warning (``simplefilter("always")``: none is deduplicated) through
        :meth:`showwarning`; with ``debug_mode``, torch's CUDA sync debug mode is "warn" meanwhile."""
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = self.showwarning
            prev = None
            if debug_mode:
                prev = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                if debug_mode:
                    torch.cuda.set_sync_debug_mode(prev)


def _targets() -> list[tuple[Any, str, str]]:
    """``(owner, attribute, phase)`` of each function wrapped for the attribution."""
    from speculate.domains.text.process import TextProcess

    import speculate.rounds as rounds_module
    import speculate.verify.one_round as one_round

    return [(TextProcess, "propose", "draft"), (TextProcess, "score", "target"), (TextProcess, "commit", "commit"),
            (rounds_module, "verify_round", "verify"), (one_round, "verify_round", "verify")]


@contextlib.contextmanager
def attributed(recorder: SyncRecorder) -> Iterator[None]:
    """The round's phase functions wrapped by ``recorder.wrap`` meanwhile; the originals put back
    afterwards (also on an exception)."""
    saved = []
    try:
        for owner, name, phase in _targets():
            orig = owner.__dict__[name]
            saved.append((owner, name, orig))
            setattr(owner, name, recorder.wrap(phase, orig))
        yield
    finally:
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)


def summarize_syncs(events: Sequence[SyncEvent], rounds: int) -> dict[str, Any]:
    """Counts per phase (total and per round) and per site, the expected transfers labelled."""
    per = max(rounds, 1)
    by_phase = Counter(e.phase for e in events)
    sites = Counter((e.phase, e.site, e.code, e.op, e.innermost) for e in events)
    rows = []
    for (phase, site, code, op, innermost), n in sorted(sites.items(), key=lambda kv: (-kv[1], kv[0][1])):
        expected = next((label for label, (path, piece) in EXPECTED.items()
                         if site.split(":")[0].endswith(path) and piece in code), None)
        rows.append({"phase": phase, "site": site, "code": code[:200], "op": op, "innermost": innermost,
                     "count": n, "per_round": n / per if phase != OUTSIDE else None, "expected": expected})
    inside = sum(by_phase[p] for p in PHASES)
    return {"total": len(events), "per_phase": {p: by_phase[p] for p in ALL_PHASES},
            "per_round": {p: by_phase[p] / per for p in PHASES}, "inside_round_per_round": inside / per,
            "sites": rows}


# ------------------------------------------------------------------------------------------------
# the profiler's view: blocking runtime calls and device-to-host copies per phase


def _is_cpu(e: Any) -> bool:
    return e.device_type == torch.autograd.DeviceType.CPU


def _api_name(name: str) -> str:
    """A CUDA API's name without the version suffix CUPTI may give it (``cudaMemcpy_v3020``)."""
    return re.sub(r"_v\d+$", "", name)


def _phase_of(t: float, ranges: Sequence[tuple[float, float, str]]) -> str:
    """The innermost phase range that holds time ``t`` (``outside`` when none does)."""
    best = None
    for start, end, phase in ranges:
        if start <= t <= end and (best is None or start >= best[0]):
            best = (start, end, phase)
    return best[2] if best else OUTSIDE


def profile_counts(events: Sequence[Any], rounds: int | None = None) -> dict[str, Any]:
    """Per phase, from a profiler's events (``prof.events()``: FunctionEvents with ``name``,
    ``device_type``, ``time_range``, ``id`` and ``linked_correlation_id``): the blocking runtime
    calls by name, every CUDA API call by name, the kernel and graph launches, the ``aten::`` ops
    (nested ones included), the time in the phase ranges, and the device-to-host and host-to-device copies
    (GPU memcpy events, placed on the host timeline by the runtime call that issued them: same
    correlation id; else the op it is linked to). ``rounds``: the phase ranges named
    ``phase:draft`` when None."""
    ranges = [(e.time_range.start, e.time_range.end, e.name.split(":", 1)[1]) for e in events
              if _is_cpu(e) and e.name.startswith("phase:") and e.name.split(":", 1)[1] in PHASES]
    if rounds is None:
        rounds = sum(1 for r in ranges if r[2] == "draft")
    out = {p: {"blocking": Counter(), "launches": 0, "graph_launches": 0, "dtoh_copies": 0, "htod_copies": 0,
               "cpu_ops": 0, "time_ms": 0.0, "runtime": Counter()} for p in ALL_PHASES}
    for start, end, phase in ranges:
        out[phase]["time_ms"] += (end - start) / 1000.0
    runtime: dict[int, Any] = {}  # CUDA runtime / driver calls by correlation id (their GPU work has the same)
    ops: dict[int, Any] = {}  # the other host events by id (what a GPU event's linked_correlation_id names)
    for e in events:
        if not _is_cpu(e):
            continue
        name = _api_name(e.name)
        if name.startswith("cu"):
            runtime[e.id] = e
            out[_phase_of(e.time_range.start, ranges)]["runtime"][name] += 1
        elif not getattr(e, "linked_correlation_id", 0) and e.id > 0:
            ops.setdefault(e.id, e)
        if name in BLOCKING:
            out[_phase_of(e.time_range.start, ranges)]["blocking"][name] += 1
        elif name in LAUNCHES:
            out[_phase_of(e.time_range.start, ranges)]["launches"] += 1
        elif name == "cudaGraphLaunch":
            out[_phase_of(e.time_range.start, ranges)]["graph_launches"] += 1
        elif name.startswith("aten::"):
            out[_phase_of(e.time_range.start, ranges)]["cpu_ops"] += 1
    for e in events:
        if _is_cpu(e) or "memcpy" not in e.name.lower():
            continue
        kind = "dtoh_copies" if "DtoH" in e.name else "htod_copies" if "HtoD" in e.name else None
        if kind is None:
            continue
        link = getattr(e, "linked_correlation_id", 0)
        anchor = runtime.get(e.id) or (ops.get(link) if link > 0 else None)
        phase = _phase_of(anchor.time_range.start, ranges) if anchor is not None else OUTSIDE
        out[phase][kind] += 1
    per = max(rounds, 1)
    phases = {}
    for p, c in out.items():
        blocking = sum(c["blocking"].values())
        phases[p] = {"blocking_calls": dict(c["blocking"]), "blocking": blocking, "launches": c["launches"],
                     "graph_launches": c["graph_launches"], "dtoh_copies": c["dtoh_copies"],
                     "htod_copies": c["htod_copies"], "aten_ops": c["cpu_ops"],
                     "runtime_calls": dict(sorted(c["runtime"].items()))}
        if p != OUTSIDE:
            phases[p]["time_ms"] = c["time_ms"]
        if p != OUTSIDE:
            phases[p].update(blocking_per_round=blocking / per, dtoh_per_round=c["dtoh_copies"] / per)
    inside = sum(phases[p]["blocking"] for p in PHASES)
    return {"rounds": rounds, "phases": phases, "blocking_inside_round_per_round": inside / per,
            "dtoh_inside_round_per_round": sum(phases[p]["dtoh_copies"] for p in PHASES) / per}


# ------------------------------------------------------------------------------------------------
# the runs


def verdict(syncs: dict[str, Any] | None, cuda: bool) -> str:
    """The line that says what was found inside the round (no claim the data does not show)."""
    if not cuda or syncs is None:
        return CPU_NOTE
    n = syncs["inside_round_per_round"]
    line = f"syncs per round inside the round: {n:.2f} (expected: the drafts' transfer and the counts' transfer)"
    inside = [s for s in syncs["sites"] if s["phase"] in PHASES]
    other = [s for s in inside if s["expected"] is None]
    found = {s["expected"]: s["per_round"] for s in inside if s["expected"]}
    missing = [label for label in EXPECTED if label not in found]
    if not other and not missing and all(abs(v - 1.0) < 1e-9 for v in found.values()):
        return line + ": only those two, once each per round"
    parts = []
    if other:
        extra = sum(s["per_round"] for s in other)
        top = "; ".join(f"{s['site']} ({s['phase']}, {s['per_round']:.2f}/round)" for s in other[:4])
        parts.append(f"{extra:.2f} more per round at {len(other)} other site(s): {top}"
                     + (" ..." if len(other) > 4 else ""))
    for label, v in found.items():
        if abs(v - 1.0) >= 1e-9:
            parts.append(f"{label} {v:.2f} per round")
    if missing:
        parts.append("not seen: " + ", ".join(missing))
    return line + "; " + "; ".join(parts)


def _captures(gen: Any) -> int:
    """CUDA graphs recorded so far by the generator's static models."""
    models = [getattr(gen, "_target_lm", None), getattr(getattr(gen, "draft", None), "lm", None)]
    return sum(getattr(getattr(m, "graphs", None), "captures", 0) or 0 for m in models)


def run_one(gen: Any, ids: Any, mask: Any, args: argparse.Namespace, cuda: bool,
            trace: Path | None = None) -> dict[str, Any]:
    """Warm up, then one generation under the sync debug mode and one under the profiler."""
    kw = dict(attention_mask=mask, max_new_tokens=args.new_tokens, eos_token_id=[], rng=args.seed)
    gen.generate(ids, **kw)  # warm-up: the same generation (graphs recorded for its shapes)
    if cuda:
        torch.cuda.synchronize()
    rec = SyncRecorder()
    graphs_before = _captures(gen)
    t0 = time.perf_counter()
    with attributed(rec), rec.capture(debug_mode=cuda):
        out = gen.generate(ids, **kw)
    wall = time.perf_counter() - t0
    rounds = int(out.stats.rounds)
    res: dict[str, Any] = {
        "rounds": rounds, "propose_calls": rec.calls["draft"], "new_tokens": sum(len(t) for t in out.new_tokens),
        "routes": dict(getattr(out.stats, "routes", {}) or {}), "wall_s_debug_mode": wall,
        "graph_captures_in_measured_run": _captures(gen) - graphs_before,
        "sync_detection": "torch.cuda.set_sync_debug_mode('warn')" if cuda else "not available (CPU)",
        "syncs": summarize_syncs(rec.events, rounds) if cuda else None,
        "other_warnings": sorted(set(rec.other_warnings))[:10],
    }
    # the profiler: rounds first .. first + m - 1 of the same generation (from the start of the first's
    # draft phase to the start of the next one's), so that the trace stays small
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    prof = torch.profiler.profile(activities=acts)
    first = 2 if rounds > 2 + args.profile_rounds else 0
    state = {"on": False, "done": False}

    def window(i: int) -> None:
        if i == first and not state["done"]:
            prof.start()
            state["on"] = True
        elif i == first + args.profile_rounds and state["on"]:
            prof.stop()
            state["on"], state["done"] = False, True

    prof_rec = SyncRecorder(ranges=True, on_round=window)
    try:
        with attributed(prof_rec):
            gen.generate(ids, **kw)
    finally:
        if state["on"]:  # the generation ended inside the window
            prof.stop()
            state["on"], state["done"] = False, True
    res["profiler"] = profile_counts(prof.events() if state["done"] else [])
    res["profiler"].update(activities=[a.name for a in acts], first_round=first + 1)
    if trace is not None and state["done"]:
        prof.export_chrome_trace(str(trace))
        res["profiler"]["trace"] = str(trace)
    res["verdict"] = verdict(res["syncs"], cuda)
    return res


def markdown(res: dict[str, Any]) -> str:
    lines = ["# Host syncs inside a round (text domain, drafts and verification on the device)", "",
             f"Command: `{res['command']}`", "",
             f"Machine: {describe(res['machine'])}; device {res['device']} ({res.get('device_name') or 'CPU'}), "
             f"{res['dtype']}; torch {res['versions']['torch']} (CUDA {res['versions']['cuda']}), "
             f"transformers {res['versions']['transformers']}.", "",
             f"Embedded pair, lookahead {res['lookahead']}, verify='block', verify_on_device=True, "
             f"{res['new_tokens']} new tokens per row (EOS off), seed {res['seed']}. Phases: "
             + ", ".join(f"{p} = {f}" for p, f in PHASES.items()) + f"; {OUTSIDE} = everything else "
             "(prefill, setup, the loop's bookkeeping).", ""]
    if not res["cuda"]:
        lines += [f"**{CPU_NOTE}.**", ""]
    else:
        lines += ["Sync warnings: `torch.cuda.set_sync_debug_mode('warn')` (ops through c10's "
                  "memcpy_and_sync / stream_synchronize: .cpu(), .item(), .tolist(), host<->device copies "
                  "with non_blocking=False ...; not torch.cuda.synchronize() nor Event.synchronize()). "
                  "Profiler: blocking CUDA runtime calls (" + ", ".join(BLOCKING) + ") and device-to-host "
                  "copies, per phase range.", ""]
    lines += ["## Verdicts", ""]
    for r in res["runs"]:
        lines.append(f"- {r['variant']}, batch {r['batch']}: "
                     + (f"failed: `{r['error']}`" if r.get("error") else r["verdict"]))
    lines.append("")
    for r in res["runs"]:
        head = f"## {r['variant']} (cuda_graphs={r['cuda_graphs']}), batch {r['batch']}"
        if r.get("error"):
            lines += [head, "", f"**failed**: `{r['error']}`", ""]
            continue
        lines += [head, "", f"**{r['verdict']}**", "",
                  f"Rounds {r['rounds']}, routes {r['routes']}, static models {r['static_models'] or 'none'}, "
                  f"graph captures in the measured run {r['graph_captures_in_measured_run']}.", ""]
        s, pr = r["syncs"], r["profiler"]
        lines += ["| phase | sync warnings | per round | blocking runtime calls (profiler) | per round | "
                  "DtoH copies | per round | kernel launches | graph launches | aten ops | time (ms) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in ALL_PHASES:
            q = pr["phases"][p]
            w = "n/a" if s is None else str(s["per_phase"][p])
            wr = "" if s is None or p == OUTSIDE else f"{s['per_round'][p]:.2f}"
            br = "" if p == OUTSIDE else f"{q['blocking_per_round']:.2f}"
            dr = "" if p == OUTSIDE else f"{q['dtoh_per_round']:.2f}"
            calls = ", ".join(f"{k} {v}" for k, v in sorted(q["blocking_calls"].items())) or "0"
            lines.append(f"| {p} | {w} | {wr} | {calls} | {br} | {q['dtoh_copies']} | {dr} | "
                         f"{q['launches']} | {q['graph_launches']} | {q['aten_ops']} | "
                         f"{'' if p == OUTSIDE else format(q['time_ms'], '.1f')} |")
        lines += ["", f"Profiled: {pr['rounds']} rounds from round {pr['first_round']} of the same "
                  "generation; blocking calls per round inside the round "
                  f"{pr['blocking_inside_round_per_round']:.2f}, DtoH copies per round "
                  f"{pr['dtoh_inside_round_per_round']:.2f}.", ""]
        if s is not None and s["sites"]:
            lines += ["| phase | site | op | code | count | per round | expected |", "|---|---|---|---|---|---|---|"]
            for x in s["sites"]:
                per = "" if x["per_round"] is None else f"{x['per_round']:.2f}"
                code = x["code"].replace("|", "\\|")
                lines.append(f"| {x['phase']} | `{x['site']}` | {x['op'] or '?'} | `{code}` | {x['count']} | {per} | "
                             f"{x['expected'] or ''} |")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="cuda (default when there is one) or cpu (smoke test)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--variants", nargs="+", default=["eager", "graphs"], choices=["eager", "graphs"],
                    help="eager: cuda_graphs=False; graphs: cuda_graphs=True")
    ap.add_argument("--prompt-bytes", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile-rounds", type=int, default=6, help="rounds in each profile (from the third)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--trace", action="store_true",
                    help="also write each profile as a Chrome trace next to the results")
    ap.add_argument("--out", default=None, help="path of the results without suffix (default: $OUT/gpu_host_syncs)")
    args = ap.parse_args(argv)
    if args.device is None:
        if not torch.cuda.is_available():
            print("no CUDA device: nothing to check (pass --device cpu for a smoke test of the plumbing)")
            return 0
        args.device = "cuda"
    cuda = torch.device(args.device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        print(f"--device {args.device}: no CUDA device: nothing to check")
        return 0
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    folder = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out = Path(args.out) if args.out else folder / "gpu_host_syncs"
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)

    import transformers
    from bench_generate import batch, prompts
    from speculate.domains.text import SpeculativeGenerator
    from speculate.domains.text.examples.pair import load_pair

    t_start = time.perf_counter()
    env = machine(args.device)
    target, draft, tok = load_pair(device=args.device, dtype=dtype)
    rows = prompts(tok, max(args.batch), args.prompt_bytes, args.seed)
    res: dict[str, Any] = {
        "device": args.device, "cuda": cuda, "dtype": str(dtype).removeprefix("torch."),
        "device_name": torch.cuda.get_device_name(torch.device(args.device)) if cuda else None,
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__},
        "command": env["command"], "machine": env, "lookahead": args.lookahead, "new_tokens": args.new_tokens,
        "seed": args.seed, "prompt_bytes": args.prompt_bytes, "phases": PHASES, "blocking_runtime_calls": BLOCKING,
        "note": None if cuda else CPU_NOTE, "runs": [],
    }
    failed = False
    for variant in args.variants:
        graphs = variant == "graphs"
        try:
            gen = SpeculativeGenerator(target, draft, lookahead=args.lookahead, verify="block",
                                       verify_on_device=True, cuda_graphs=graphs)
        except Exception as e:  # reported, not fatal
            failed = True
            for b in args.batch:
                res["runs"].append({"variant": variant, "cuda_graphs": graphs, "batch": b,
                                    "error": f"{type(e).__name__}: {e}"})
            continue
        for b in args.batch:
            entry: dict[str, Any] = {"variant": variant, "cuda_graphs": graphs, "batch": b,
                                     "static_models": list(gen.static_models)}
            try:
                ids, mask = batch(rows[:b], tok.pad_token_id, args.device)
                trace = out.parent / f"{out.name}_{variant}_b{b}.trace.json" if args.trace else None
                entry.update(run_one(gen, ids, mask, args, cuda, trace))
            except Exception as e:  # reported, not fatal
                failed = True
                entry["error"] = f"{type(e).__name__}: {e}"
                entry["traceback"] = traceback.format_exc()[-4000:]
            res["runs"].append(entry)
            print(f"{variant} batch {b}: " + (entry.get("verdict") or f"failed: {entry['error']}"), flush=True)
    res["wall_s"] = time.perf_counter() - t_start
    md = markdown(res)
    write(out.name, res, md, folder=out.parent)
    print(md)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
