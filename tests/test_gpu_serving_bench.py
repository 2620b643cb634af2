"""bench/gpu_serving.py: guidellm's phases sent as they were, saturation, MAPE, the CI cases read back (no
GPU, no reference files needed)."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import bench_module

pytestmark = pytest.mark.unit

bench = bench_module("gpu_serving")
COLUMNS = ["arrived_at", "num_prefill_tokens", "num_decode_tokens", "prefix_group", "prefix_tokens", "phase",
           "measured_ttft_s", "measured_e2e_s"]


def frame(phases: dict[str, int], ttft: dict[str, float]) -> pd.DataFrame:
    """`n` identical requests (1000 prompt, 50 output tokens) per phase, all measured arriving at the phase's
    start 100 s apart, each with the phase's TTFT and that + 0.5 s E2E."""
    rows = [(100.0 * k, 1000, 50, -1, 0, p, ttft[p], ttft[p] + 0.5)
            for k, (p, n) in enumerate(phases.items()) for _ in range(n)]
    return pd.DataFrame(rows, columns=COLUMNS)


def test_synchronous_is_one_closed_loop_client_and_other_phases_arrive_as_measured():
    f = frame({"synchronous": 3, "constant@1.0": 2}, {"synchronous": 0.1, "constant@1.0": 0.1})
    requests, clients = bench.sent("synchronous", f[f["phase"] == "synchronous"])
    assert clients == 1 and [r.arrival_s for r in requests] == [0.0, 0.0, 0.0]
    requests, clients = bench.sent("constant@1.0", f[f["phase"] == "constant@1.0"])
    assert clients is None and [r.arrival_s for r in requests] == [0.0, 0.0]  # relative to the phase's first


def test_a_closed_loop_phase_serves_one_request_at_a_time():
    # the same 4 requests measured at one instant: one client sends them one after another, each alone, so
    # every TTFT is a lone prefill's; open loop (throughput) they queue behind one another
    f = frame({"synchronous": 4, "throughput": 4}, {"synchronous": 0.1, "throughput": 0.1})
    case = bench.Case("x.csv", bench.get_model("llama-2-7b"), 4096, 256, 4096)
    alone = bench.predicted(case, "synchronous", f[f["phase"] == "synchronous"].head(1))
    sync = bench.predicted(case, "synchronous", f[f["phase"] == "synchronous"])
    burst = bench.predicted(case, "throughput", f[f["phase"] == "throughput"])
    assert sync["ttft"] == pytest.approx(alone["ttft"], rel=1e-12)
    assert burst["ttft"] > sync["ttft"]


def test_saturated_phases_are_throughput_and_those_queued_past_twice_the_synchronous_ttft(monkeypatch):
    monkeypatch.setattr(bench, "predicted", lambda case, phase, rows: {"ttft": 0.2, "tpot": 0.01, "e2e": 1.0})
    ttft = {"synchronous": 0.1, "throughput": 0.1, "constant@1": 0.2, "constant@2": 0.21}
    rows = bench.phase_rows(bench.CASES[0], frame(dict.fromkeys(ttft, 1), ttft))
    assert [r["saturated"] for r in rows] == [False, True, False, True]
    assert rows[0]["ttft_error_pct"] == pytest.approx(100.0)  # 0.2 predicted / 0.1 measured - 1
    # TPOT (0.6 - 0.1) / 49 measured, 0.01 predicted
    assert rows[0]["tpot_error_pct"] == pytest.approx(100 * (0.01 / (0.5 / 49) - 1))
    m = bench.mape(rows)
    assert m["not_saturated"]["phases"] == 2 and m["saturated"]["phases"] == 2
    assert m["not_saturated"]["ttft"] == pytest.approx((100.0 + 0.0) / 2)  # constant@1 exact
    assert m["saturated"]["ttft"] == pytest.approx((100.0 + 100 * abs(0.2 / 0.21 - 1)) / 2)


def test_ci_cases_are_read_back_from_the_readme_sentence():
    text = ("median batch latency; vLLM version not stated): Llama-3.1-8B TP1 0.997 s (H100), 1.585 s "
            "(A100-80GB); Llama-3-70B TP4 2.444 s (H100).")
    assert bench.ci_cases(text) == [("llama-3.1-8b", "h100", 1, 0.997),
                                    ("llama-3.1-8b", "a100-80gb", 1, 1.585),
                                    ("llama-3.1-70b", "h100", 4, 2.444)]


def test_no_reference_folder_is_skipped_and_nothing_written(tmp_path, capsys):
    assert bench.main(["--root", str(tmp_path / "absent"), "--out", str(tmp_path / "o")]) == 0
    assert "skipped" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_kv_sizes_are_read_back_and_each_file_compared_to_its_models_nearest():
    text = ("- engine: ...; the KV cache vLLM reported: 30,000 or 50,000 tokens for CodeLlama-34B,\n"
            "  90,000 for Llama-2-7B;\n- GPU: 12 for nothing")
    rows = bench.kv_rows(text)
    assert [r["file"] for r in rows] == [c.file for c in bench.CASES]
    for r in rows:
        choices = {"codellama-34b": (30_000, 50_000), "llama-2-7b": (90_000,)}[r["model"]]
        assert r["reported"] == min(choices, key=lambda s: abs(s - r["predicted"]))
        assert r["error_pct"] == pytest.approx(100 * (r["predicted"] / r["reported"] - 1))
    small, big = (next(r["predicted"] for r in rows if r["max_num_batched_tokens"] == n and
                       r["model"] == "codellama-34b") for n in (64, 4096))
    assert small > big  # vLLM's profile of a 64-token step holds back less than a 4096-token one
