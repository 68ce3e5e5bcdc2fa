"""benchmarks/gpu/host_syncs.py without a GPU: the phase attribution of sync warnings, the profiler's
counts per phase (synthetic events), the verdict, and the whole script on the CPU (its plumbing:
the sync debug mode needs CUDA, so the CPU run detects nothing and says so)."""

from __future__ import annotations

import inspect
import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from speculate.domains.text.process import TextProcess  # noqa: E402

import speculate.rounds as rounds_module  # noqa: E402
import speculate.verify.one_round as one_round  # noqa: E402
from benchmarks.gpu import host_syncs as hs  # noqa: E402

THIS = str(Path(__file__).resolve().relative_to(ROOT))
SYNC = "called a synchronizing CUDA operation (Triggered internally at c10/cuda/CUDAFunctions.cpp:1.)"


def _originals():
    return (TextProcess.__dict__["propose"], TextProcess.__dict__["score"], TextProcess.__dict__["commit"],
            rounds_module.verify_round, one_round.verify_round)


def test_a_sync_warning_lands_in_the_phase_it_was_raised_in_with_its_file_and_line(monkeypatch):
    lines = {}

    def fake_propose(self):
        lines["draft"] = inspect.currentframe().f_lineno + 1
        warnings.warn(SYNC, UserWarning, stacklevel=1)
        return "proposal"

    monkeypatch.setattr(TextProcess, "propose", fake_propose)
    before = _originals()
    rec = hs.SyncRecorder()
    with hs.attributed(rec), rec.capture(debug_mode=False):
        assert TextProcess.propose is not fake_propose  # wrapped meanwhile
        assert rounds_module.verify_round is not before[3]
        assert TextProcess.propose(None) == "proposal"
        lines["outside"] = inspect.currentframe().f_lineno + 1
        warnings.warn(SYNC, UserWarning, stacklevel=1)
        warnings.warn("an unrelated warning", UserWarning, stacklevel=1)
        assert TextProcess.propose(None) == "proposal"  # "always": the same warning is not deduplicated
    assert TextProcess.propose is fake_propose and _originals() == before  # put back
    assert [e.phase for e in rec.events] == ["draft", "outside", "draft"]
    assert rec.events[0].site == f"{THIS}:{lines['draft']}" and "warnings.warn(SYNC" in rec.events[0].code
    assert rec.events[1].site == f"{THIS}:{lines['outside']}"
    assert rec.calls["draft"] == 2 and rec.other_warnings == ["UserWarning: an unrelated warning"]
    s = hs.summarize_syncs(rec.events, rounds=2)
    assert s["per_phase"] == {"draft": 2, "target": 0, "verify": 0, "commit": 0, "outside": 1}
    assert s["per_round"]["draft"] == 1.0 and s["inside_round_per_round"] == 1.0
    assert s["sites"][0]["site"] == f"{THIS}:{lines['draft']}" and s["sites"][0]["count"] == 2


def test_the_originals_come_back_after_an_exception_and_the_phase_resets():
    before = _originals()
    rec = hs.SyncRecorder()

    def boom(*args, **kwargs):
        raise RuntimeError("inside verify")

    with pytest.raises(RuntimeError, match="inside verify"):
        with hs.attributed(rec):
            rec.wrap("verify", boom)()
    assert rec.phase == hs.OUTSIDE and _originals() == before


def test_locate_skips_this_scripts_frames_and_the_warnings_module():
    f = SimpleNamespace  # a traceback.FrameSummary's fields
    stack = [f(filename=str(ROOT / "domains/text/api.py"), lineno=10, line="out = run()"),
             f(filename=str(ROOT / "speculate/verify/device.py"), lineno=92, line="x = t.cpu().numpy()"),
             f(filename="/usr/lib/python3/site-packages/torch/functional.py", lineno=5, line="return y.tolist()"),
             f(filename=str(hs.THIS), lineno=200, line="return fn(*args, **kwargs)"),
             f(filename=str(hs.WARNINGS), lineno=1, line="sw(msg)")]
    site, code, innermost = hs.locate(stack)
    assert site == "speculate/verify/device.py:92" and code == "x = t.cpu().numpy()"
    assert innermost == "/usr/lib/python3/site-packages/torch/functional.py:5"
    assert hs._guess_op(code) == "Tensor.cpu (device to host)"


def _ev(name, start, end, cuda=False, id=0, link=0):
    dev = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    return SimpleNamespace(name=name, device_type=dev, time_range=SimpleNamespace(start=start, end=end), id=id,
                           linked_correlation_id=link)


def test_profile_counts_blocking_calls_and_device_to_host_copies_per_phase():
    events = [
        _ev("phase:draft", 0, 10), _ev("aten::_to_copy", 7, 9.6, id=5),
        _ev("cudaMemcpyAsync", 8, 9, id=101, link=5), _ev("cudaStreamSynchronize", 9, 9.5, id=102, link=5),
        _ev("Memcpy DtoH (Device -> Pageable)", 50, 51, cuda=True, id=101, link=5),  # issued in draft
        _ev("phase:draft", 0, 10, cuda=True),  # the annotation's GPU copy: not a phase range
        _ev("phase:verify", 20, 30), _ev("cudaLaunchKernel", 21, 22, id=104, link=7),
        _ev("cudaStreamSynchronize", 25, 26, id=103, link=8),
        _ev("Memcpy DtoH (Device -> Pageable)", 60, 61, cuda=True, id=999, link=8),  # anchored by its op
        _ev("aten::copy_", 24, 27, id=8),
        _ev("Memcpy HtoD (Pageable -> Device)", 62, 63, cuda=True, id=105, link=0),
        _ev("cudaDeviceSynchronize", 35, 36), _ev("cudaGraphLaunch", 36, 37, id=106, link=9),
        _ev("phase:draft", 40, 45), _ev("cudaMemcpy_v3020", 41, 42, id=107, link=10),  # CUPTI's suffix
    ]
    c = hs.profile_counts(events)
    assert c["rounds"] == 2
    p = c["phases"]
    assert p["draft"]["blocking_calls"] == {"cudaStreamSynchronize": 1, "cudaMemcpy": 1}
    assert p["draft"]["dtoh_copies"] == 1 and p["draft"]["blocking_per_round"] == 1.0
    assert p["verify"]["blocking"] == 1 and p["verify"]["launches"] == 1 and p["verify"]["dtoh_copies"] == 1
    assert p["outside"]["blocking_calls"] == {"cudaDeviceSynchronize": 1} and p["outside"]["graph_launches"] == 1
    assert p["outside"]["htod_copies"] == 1  # nothing to place it by: outside
    assert p["verify"]["runtime_calls"] == {"cudaLaunchKernel": 1, "cudaStreamSynchronize": 1}
    assert c["blocking_inside_round_per_round"] == 1.5 and c["dtoh_inside_round_per_round"] == 1.0


def _events(extra=()):
    drafts = hs.SyncEvent("draft", "domains/text/drafts/model.py:200",
                          "outcomes[:, :steps] = torch.stack(xs, dim=1).cpu().numpy()"
                          "  # the round's one transfer of drafts",
                          "domains/text/drafts/model.py:200", ".cpu()")
    counts = hs.SyncEvent("verify", "speculate/verify/device.py:92",
                          "out = torch.stack([n, nxt, branch, ok.to(torch.int64)]).cpu().numpy()",
                          "speculate/verify/device.py:92", ".cpu()")
    return [drafts, counts] * 3 + list(extra)


def test_the_verdict_says_what_was_found():
    assert hs.verdict(None, cuda=False) == hs.CPU_NOTE
    clean = hs.verdict(hs.summarize_syncs(_events([hs.SyncEvent("outside", "a.py:1", "", "a.py:1", None)]), 3),
                       cuda=True)
    assert clean.startswith("syncs per round inside the round: 2.00 (expected: the drafts' transfer and the "
                            "counts' transfer)") and "only those two" in clean
    extra = hs.SyncEvent("target", "domains/text/process.py:250", "idx = torch.as_tensor(...)", "x:1", None)
    dirty = hs.verdict(hs.summarize_syncs(_events([extra] * 6), 3), cuda=True)
    assert dirty.startswith("syncs per round inside the round: 4.00") and "only those two" not in dirty
    assert "2.00 more per round at 1 other site(s): domains/text/process.py:250 (target, 2.00/round)" in dirty
    missing = hs.verdict(hs.summarize_syncs(_events()[1::2], 3), cuda=True)
    assert "not seen: the drafts' transfer" in missing


def test_the_script_on_the_cpu_runs_both_variants_and_puts_the_originals_back(tmp_path, capsys):
    before = _originals()
    code = hs.main(["--device", "cpu", "--out", str(tmp_path / "x"), "--batch", "2", "--new-tokens", "12",
                    "--profile-rounds", "2"])
    assert code == 0
    assert _originals() == before and TextProcess.propose is before[0]
    res = json.loads((tmp_path / "x.json").read_text())
    md = (tmp_path / "x.md").read_text()
    assert res["note"] == hs.CPU_NOTE and hs.CPU_NOTE in md and res["cuda"] is False
    runs = [(r["variant"], r["batch"]) for r in res["runs"]]
    assert runs == [("eager", 2), ("graphs", 2)]
    for r in res["runs"]:
        assert "error" not in r, r.get("traceback")
        assert r["rounds"] > 0 and r["propose_calls"] == r["rounds"] and r["syncs"] is None
        assert r["verdict"] == hs.CPU_NOTE
        prof = r["profiler"]
        assert set(prof["phases"]) == set(hs.ALL_PHASES) and prof["rounds"] == 2
        for phase in hs.PHASES:  # the ranges were found: the phases ran aten ops (commit: numpy only)
            assert prof["phases"][phase]["time_ms"] > 0
        assert prof["phases"]["target"]["aten_ops"] > 0 and prof["phases"]["verify"]["aten_ops"] > 0
    assert res["runs"][1]["static_models"] == ["target", "draft"]
    assert "## graphs (cuda_graphs=True), batch 2" in md
