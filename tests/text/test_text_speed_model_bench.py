"""benchmarks/gpu/bench_speed_model.py (the real-size speed model) at its tiny CPU preset: it runs end
to end (drafting and verifying on the device, as on a GPU), stores c, r(k), the per-round overhead
and speedups that follow from them, and refuses bad arguments before any work. (Its timings are
not asserted: they are noisy on a shared CPU.)"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from speculate import theory

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "bench_speed_model.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_speed_model", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def result(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("speed") / "tiny"
    assert bench.main(["--preset", "tiny", "--device", "cpu", "--batch", "1", "--repeats", "1", "--iters", "2",
                       "--warmup", "1", "--overhead-k", "1", "4", "--on-device", "on", "--max-seconds", "1e6",
                       "--out", str(out)]) == 0  # no time budget: what is skipped must not depend on speed
    return json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".md").read_text()


def test_the_tiny_run_stores_c_r_overhead_and_speedups(result):
    res, md = result
    assert res["device"] == "cpu" and res["ks"] == list(range(1, 9)) and res["skipped"] == []
    assert res["on_device"] is True  # drafting and verification where the logits are, as on a GPU
    assert res["command"].startswith("python benchmarks/gpu/bench_speed_model.py --preset tiny")
    assert res["models"]["tiny"]["target"]["parameters"] == res["models"]["tiny"]["target"]["parameters_formula"]
    (run,) = res["runs"]
    (b,) = run["batches"]
    assert b["batch"] == 1 and set(b["configs"]) == {"default", "cuda_graphs"}
    for name, rec in b["configs"].items():
        assert "error" not in rec, rec.get("traceback")
        assert rec["c"] > 0 and len(rec["r"]) == 8 and all(r > 0 for r in rec["r"])
        assert [p["k"] for p in rec["overhead"]] == [1, 4]
        for p in rec["overhead"]:
            assert p["on_device"] and p["rounds"] >= 1 and p["target_call_s"] > 0 and p["forward_s"] > 0
            assert math.isclose(p["overhead_s"], p["round_s"] - p["forward_s"])
            assert math.isclose(p["overhead_fraction_of_verify"], p["overhead_s"] / p["target_call_s"])
        assert rec["static_models"] == (["target", "draft"] if name == "cuda_graphs" else [])
        # the speedups follow from the stored c, r(k) and o(k) / T1
        for alpha, sp in rec["speedup"].items():
            assert len(sp) == 8
            for i, k in enumerate(res["ks"]):
                want = theory.expected_tokens(float(alpha), k) / (k * rec["c"] + rec["r"][i] + rec["overhead_ratio"][i])
                assert math.isclose(sp[i], want, rel_tol=1e-9)
            best = rec["best_k"][alpha]
            assert best["speedup"] == max(sp) and sp[best["k"] - 1] == max(sp)
        fit = rec["overhead_fit"]
        assert math.isclose(rec["overhead_ratio"][2], (fit["a_s"] + 3 * fit["b_s_per_draft"]) / rec["T1_s"])
        assert math.isclose(rec["c"], rec["draft_step_s"] / rec["T1_s"])
        assert math.isclose(rec["r"][3], rec["scoring_s"][3] / rec["T1_s"])
    assert md.startswith("# Real-size speed model (tiny)") and "Predicted speedup, `default`" in md
    assert "## Goals" in md and "How the overhead is measured" in md


@pytest.mark.parametrize("argv, message", [
    (["--preset", "70b"], "invalid choice"),
    (["--batch", "0"], "must be an integer >= 1"),
    (["--batch", "eight"], "must be an integer >= 1"),
    (["--overhead-k", "9"], "lookaheads must lie in 1..8"),
    (["--alphas", "1.5"], "alpha must lie in [0, 1)"),
    (["--device", "tpu"], "--device must be cpu or cuda"),
])
def test_bad_arguments_are_refused_before_any_work(bench, tmp_path, capsys, argv, message):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as err:
        bench.main(["--device", "cpu", "--preset", "tiny", *argv, "--out", str(out)])
    assert err.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
