"""vLLM's bench in simctl: reading a `vllm bench serve --save-result --save-detailed` file
(traces.vllm_bench), `simctl validate --from-vllm-bench` (validation.vllm_bench_compare), the `vllm_bench`
block of every summary and `simctl run --goodput` (results.vllm_bench). The bench files are made by hand, in
the format vllm/benchmarks/serve.py writes, with values whose vLLM metrics are worked out below."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simctl.cli import main
from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.policies.registry import make_policy
from simctl.results.metrics import summarise_result
from simctl.results.vllm_bench import parse_goodput
from simctl.sim.simulate import simulate
from simctl.traces import build_trace
from simctl.traces.request import Request
from simctl.traces.vllm_bench import read_vllm_bench
from simctl.validation.vllm_bench_compare import compare, measured


def bench(**changes: Any) -> dict[str, Any]:
    """Four requests sent at 100.0, 100.5, 101.0 and 101.2 s (client clock); the last failed. Duration 1.5 s:
    the benchmark started 0.25 s before the first send (the last response came at 101.25 s)."""
    data: dict[str, Any] = {
        "date": "20261124-060000", "endpoint_type": "openai", "backend": "openai", "label": None,
        "model_id": "tiny", "tokenizer_id": "tiny", "num_prompts": 4, "request_rate": 2.0, "burstiness": 1.0,
        "max_concurrency": None, "duration": 1.5, "completed": 3, "failed": 1, "total_input_tokens": 60,
        "total_output_tokens": 8, "request_throughput": 2.0, "request_goodput": None,
        "output_throughput": 8 / 1.5, "total_token_throughput": 68 / 1.5,
        "input_lens": [10, 20, 30, 5], "output_lens": [4, 1, 3, 0], "ttfts": [0.1, 0.2, 0.15, 0.0],
        "itls": [[0.02, 0.03, 0.05], [], [0.04, 0.06], []], "latencies": [0.2, 0.2, 0.25, 0.0],
        "start_times": [100.0, 100.5, 101.0, 101.2], "queue_times": [0.0, 0.0, 0.0, 0.0],
        "generated_texts": ["a b c d", "a", "a b c", ""], "errors": ["", "", "", "Bad Gateway"],
        "max_output_tokens_per_s": 8.0, "max_concurrent_requests": 2, "rtfx": 0.0,
        "mean_ttft_ms": 150.0, "median_ttft_ms": 150.0, "std_ttft_ms": 40.8248290463863, "p99_ttft_ms": 199.0,
        "mean_tpot_ms": 125 / 3, "median_tpot_ms": 125 / 3, "p99_tpot_ms": 49.833333333333336,
        "mean_itl_ms": 40.0, "median_itl_ms": 40.0, "p99_itl_ms": 59.6,
    }
    data.update(changes)
    return data


def write(tmp_path: Path, data: Any, name: str = "bench.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


# Hand-computed from the lists above, with vLLM's definitions (np.percentile interpolates linearly):
# TTFT [0.1, 0.2, 0.15]: mean 150, median 150, P99 0.15 + 0.98 * 0.05 = 199 ms.
# TPOT (E2EL - TTFT) / (output - 1) of the multi-token requests: 0.1/3 and 0.1/2: mean 41.667, median 41.667,
#   P99 33.333 + 0.99 * 16.667 = 49.833 ms.
# ITL pooled [0.02, 0.03, 0.05, 0.04, 0.06]: mean 40, median 40, P99 0.05 + 0.96 * 0.01 = 59.6 ms.
# E2EL [0.2, 0.2, 0.25]: mean 216.667, median 200, P99 0.2 + 0.98 * 0.05 = 249 ms.
# Throughputs over 1.5 s: 3 requests, 8 output tokens, 68 tokens in all.
MEASURED = {
    "mean_ttft_ms": 150.0, "median_ttft_ms": 150.0, "p99_ttft_ms": 199.0,
    "mean_tpot_ms": 125 / 3, "median_tpot_ms": 125 / 3, "p99_tpot_ms": 49.833333333333336,
    "mean_itl_ms": 40.0, "median_itl_ms": 40.0, "p99_itl_ms": 59.6,
    "mean_e2el_ms": 650 / 3, "median_e2el_ms": 200.0, "p99_e2el_ms": 249.0,
    "request_throughput": 2.0, "output_throughput": 8 / 1.5, "total_token_throughput": 68 / 1.5,
}


def test_reads_the_successful_requests_at_their_send_times(tmp_path: Path) -> None:
    b = read_vllm_bench(write(tmp_path, bench()))
    assert (b.sent, b.failed, len(b)) == (4, 1, 3)
    assert b.prompt_tokens.tolist() == [10, 20, 30] and b.output_tokens.tolist() == [4, 1, 3]
    np.testing.assert_allclose(b.arrival_s, [0.25, 0.75, 1.25])  # lead-in 1.5 - (101.25 - 100.0)
    assert b.max_itl_s.tolist() == [0.05, 0.0, 0.06]
    assert b.send_times_measured and b.traffic.request_rate == 2.0
    assert any("1 failed request(s) of 4 excluded" in a for a in b.assumptions())


def test_the_measured_side_is_vllms_definitions(tmp_path: Path) -> None:
    got = measured(read_vllm_bench(write(tmp_path, bench())), None)
    assert got.keys() == MEASURED.keys()
    for k, v in MEASURED.items():
        assert got[k] == pytest.approx(v, rel=1e-12), k


def test_goodput_against_a_hand_count(tmp_path: Path) -> None:
    b = read_vllm_bench(write(tmp_path, bench()))
    # ttft <= 160 ms and tpot <= 45 ms: request 0 only (1: TTFT 200; 2: TPOT 50)
    assert measured(b, parse_goodput(["ttft:160,tpot:45"]))["request_goodput"] == pytest.approx(1 / 1.5)
    # e2el <= 210 ms: requests 0 and 1; a one-token request's TPOT is 0 (request 1 meets any TPOT limit)
    assert measured(b, parse_goodput(["e2el:210"]))["request_goodput"] == pytest.approx(2 / 1.5)
    assert measured(b, parse_goodput(["tpot:34 ttft:250"]))["request_goodput"] == pytest.approx(2 / 1.5)


def test_a_file_without_send_times_replays_what_it_asked_for(tmp_path: Path) -> None:
    b = read_vllm_bench(write(tmp_path, bench(start_times=None)))
    assert not b.send_times_measured
    # Poisson at 2 req/s, scaled as vLLM does: the 4th (failed) send lands at n / rate = 2 s
    assert np.all(np.diff(b.arrival_s) >= 0) and b.arrival_s[-1] < 2.0
    everything_at_once = read_vllm_bench(write(tmp_path, bench(start_times=None, request_rate="inf")))
    assert everything_at_once.arrival_s.tolist() == [0.0, 0.0, 0.0]
    assert "no send times" in everything_at_once.assumptions()[0]
    even = read_vllm_bench(write(tmp_path, bench(start_times=None, burstiness=math.inf)))
    np.testing.assert_allclose(even.arrival_s, [0.5, 1.0, 1.5])


def test_comparison_predicts_the_same_requests(tmp_path: Path) -> None:
    path = write(tmp_path, bench())
    c = compare(path, "tiny", "cpu", "vllm-v1", goodput=parse_goodput(["ttft:160", "tpot:45"]))
    rows = {r["metric"]: r for r in c.rows}
    assert list(rows) == [*MEASURED, "request_goodput"]
    assert c.prediction["completed"] == 3 and c.prediction["policy"] == "vllm-v1"
    for k, r in rows.items():
        assert r["predicted"] is not None and r["measured"] is not None, k
        assert r["error_pct"] == pytest.approx(100 * (r["predicted"] - r["measured"]) / r["measured"]), k
    # the prediction's duration runs from the benchmark's start, 0.25 s before the first send, as vLLM's does
    assert rows["request_throughput"]["predicted"] == pytest.approx(3 / (c.prediction["makespan_s"] + 0.25))
    assert not c.warnings  # the file's aggregates agree with its lists


def test_the_files_own_aggregates_are_checked(tmp_path: Path) -> None:
    c = compare(write(tmp_path, bench(mean_ttft_ms=999.0)), "tiny", "cpu", "vllm")
    assert any("mean_ttft_ms is 999" in w for w in c.warnings)


def _cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return int(e.value.code or 0), captured.out, captured.err


def test_validate_from_vllm_bench_writes_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    out = tmp_path / "cmp"
    code, stdout, err = _cli(capsys, "validate", "--from-vllm-bench", write(tmp_path, bench()),
                             "--model", "tiny", "--gpu", "cpu", "--goodput", "ttft:160",
                             "--goodput", "tpot:45", "--out", out)
    assert code == 0, err
    record = json.loads((out / "vllm_bench_comparison.json").read_text())
    assert record["prediction"]["policy"] == "vllm-v1" and record["failed"] == 1
    assert record["goodput"] == "ttft:160 tpot:45"
    assert {r["metric"]: r["measured"] for r in record["metrics"]}["p99_itl_ms"] == pytest.approx(59.6)
    assert "| p99_itl_ms | 59.6 |" in (out / "vllm_bench_comparison.md").read_text()
    assert "mean_ttft_ms" in stdout and "assumed:" in stdout


MALFORMED = {
    "truncated": (lambda: json.dumps(bench())[:200], "not valid json"),
    "not-json": (lambda: "hello", "not valid json"),
    "appended": (lambda: json.dumps(bench()) + "\n" + json.dumps(bench()), "more than one result"),
    "a-list": (lambda: [bench()], "not an object"),
    "foreign": (lambda: {"prompt_tokens": 3, "output_tokens": 2}, "not a `vllm bench serve"),
    "not-detailed": (lambda: {k: v for k, v in bench().items()
                              if k not in ("input_lens", "output_lens", "ttfts", "itls", "start_times",
                                           "errors", "generated_texts")}, "--save-detailed"),
    "pooling": (lambda: {"duration": 1.0, "completed": 1, "total_input_sequences": 1, "latencies": [0.1],
                         "input_lens": [3]}, "pooling"),
    "lengths-differ": (lambda: bench(ttfts=[0.1, 0.2]), "differ in length"),
    "bad-length": (lambda: bench(input_lens=[10, "20", 30, 5]), "input_lens[1]"),
    "bad-itl": (lambda: bench(itls=[[0.02, None], [], [], []]), "itls[0]"),
    "completed-mismatch": (lambda: bench(completed=4), "completed"),
    "all-failed": (lambda: bench(output_lens=[0, 0, 0, 0], completed=0), "every request failed"),
    "bad-duration": (lambda: bench(duration=-1), "duration"),
    "bad-rate": (lambda: bench(start_times=None, request_rate="fast"), "request_rate"),
    "ramp-without-times": (lambda: bench(start_times=None, ramp_up_strategy="linear"), "ramped"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_a_bad_file_is_one_line_exit_2(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make, expected = MALFORMED[case]
    out = tmp_path / "cmp"
    code, stdout, err = _cli(capsys, "validate", "--from-vllm-bench", write(tmp_path, make()),
                             "--model", "tiny", "--gpu", "cpu", "--out", out)
    assert code == 2 and stdout == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("simctl: error: ") and expected.lower() in err.lower(), err
    assert not out.exists()


@pytest.mark.parametrize("args, expected", [
    (("--gpu", "cpu"), "needs --model"),
    (("--model", "tiny"), "needs --gpu"),
    (("--model", "tiny", "--gpu", "cpu", "--loads", "0.5"), "--loads applies to real runs"),
    (("--model", "tiny", "--gpu", "cpu", "--goodput", "itl:5"), "--goodput 'itl:5'"),
    (("--model", "tiny", "--gpu", "cpu", "--goodput", "ttft:0"), "positive"),
])
def test_bad_options_are_one_line(args: tuple[str, ...], expected: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "validate", "--from-vllm-bench", write(tmp_path, bench()), *args,
                        "--out", tmp_path / "cmp")
    assert code == 2 and len(err.splitlines()) == 1 and expected.lower() in err.lower(), err


def test_bench_options_need_the_bench_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "validate", "--gpu", "h100")
    assert code == 2 and "--gpu applies to --from-vllm-bench" in err


class Flat(CostModel):
    """Every iteration takes 10 ms."""

    def iteration_time(self, plan: Any) -> float:
        return 0.01

    def stretch_times(self, plan: Any, k: int) -> np.ndarray:
        return np.full(k, 0.01)


def _tiny_run() -> dict[str, Any]:
    # two requests alone on the replica: A (prompt 4, 3 tokens) at t=0.5, B (prompt 6, 1 token) at t=2
    requests = [Request(0, 0.5, 4, 3), Request(1, 2.0, 6, 1)]
    result = simulate(requests, make_policy("vllm", 10_000, 64, {}), Flat())
    return {"summary": summarise_result(result), "requests": result.requests}


def test_summary_block_by_hand() -> None:
    s = _tiny_run()["summary"]
    v = s["vllm_bench"]
    # A: prefill 0.5-0.51 (first token), decodes end 0.52, 0.53: TTFT 10, E2EL 30, TPOT 10 ms, gaps 10, 10
    # B: prefill 2.0-2.01: TTFT 10 ms, E2EL 10 ms, one token (no TPOT, no gap)
    assert v["mean_ttft_ms"] == pytest.approx(10) and v["median_ttft_ms"] == pytest.approx(10)
    assert v["mean_e2el_ms"] == pytest.approx(20) and v["median_e2el_ms"] == pytest.approx(20)
    assert v["p99_e2el_ms"] == pytest.approx(10 + 0.99 * 20)
    assert v["mean_tpot_ms"] == pytest.approx(10) and v["p99_tpot_ms"] == pytest.approx(10)
    assert v["mean_itl_ms"] == pytest.approx(10)
    assert v["median_itl_ms"] == pytest.approx(10, rel=1e-4)  # the histogram's bin centre, within 0.006%
    assert v["p99_itl_ms"] == pytest.approx(10, rel=1e-4)
    # vLLM's duration runs from t=0 to the last completion (2.01 s), not from the first arrival
    assert v["request_throughput"] == pytest.approx(2 / 2.01)
    assert v["output_throughput"] == pytest.approx(4 / 2.01)
    assert v["total_token_throughput"] == pytest.approx(14 / 2.01)
    assert v["median_ttft_ms"] == pytest.approx(s["ttft_p50"] * 1000)  # reused, not recomputed


def test_run_goodput_against_a_hand_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"prompt_tokens": p, "output_tokens": o, "arrival_s": a}) + "\n"
                             for p, o, a in ((40, 8, 0.1), (60, 1, 0.2), (30, 20, 0.3))))
    out = tmp_path / "run"
    code, _, err = _cli(capsys, "run", "--policy", "vllm", "--trace", trace, "--model", "tiny",
                        "--gpu", "cpu", "--goodput", "ttft:100000,e2el:100000", "--out", out)
    assert code == 0, err
    v = json.loads((out / "summary.json").read_text())["vllm_bench"]
    assert v["goodput"] == "ttft:100000 e2el:100000"
    assert v["request_goodput"] == pytest.approx(v["request_throughput"])  # every request meets loose limits
    req = pd.read_parquet(out / "requests.parquet")
    ttft = req["first_token_s"] - req["arrival_s"]
    limit = float(np.sort(ttft)[1])  # a TTFT limit that exactly two requests meet
    code, _, err = _cli(capsys, "run", "--policy", "vllm", "--trace", trace, "--model", "tiny",
                        "--gpu", "cpu", "--goodput", f"ttft:{limit * 1000!r}", "--out", out)
    v = json.loads((out / "summary.json").read_text())["vllm_bench"]
    assert code == 0 and v["request_goodput"] == pytest.approx(2 / req["completion_s"].max())


def test_a_bench_file_is_a_trace(tmp_path: Path) -> None:
    requests = build_trace(write(tmp_path, bench()), None, None, 0)
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(10, 4), (20, 1), (30, 3)]
    assert [r.arrival_s for r in requests] == pytest.approx([0.25, 0.75, 1.25])


def test_reader_refuses_without_traceback(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_vllm_bench(tmp_path / "missing.json")


def test_what_the_replay_assumes_is_said(tmp_path: Path) -> None:
    limited = read_vllm_bench(write(tmp_path, bench(max_concurrency=2))).assumptions()
    assert any("at most 2 requests in flight" in a and "closed loop" in a and "queue_times" in a
               for a in limited)
    # request 0's 4 tokens came in 2 chunks: 1 gap where 3 tokens followed the first
    bundled = read_vllm_bench(write(tmp_path, bench(itls=[[0.1], [], [0.04, 0.06], []]))).assumptions()
    assert any("3 chunk gaps for 5 tokens" in a for a in bundled)


def test_a_bench_with_a_client_bound_is_replayed_closed_loop(tmp_path: Path) -> None:
    """`--max-concurrency 1 --request-rate inf`: every request was ready at 100.0 s (its send time less its
    wait for a slot, queue_times), 0.25 s after the start (the lead-in). The replay is closed loop with one
    client: each request is sent when the one before it completed, and the summary says the bound."""
    from simctl.sim.run import RunConfig, run
    from simctl.traces.workload import Workload

    path = write(tmp_path, bench(max_concurrency=1, request_rate="inf", queue_times=[0.0, 0.5, 1.0, 1.2]))
    b = read_vllm_bench(path)
    assert b.ready_times_measured
    np.testing.assert_allclose(b.arrival_s, [0.25, 0.25, 0.25])
    workload = Workload(trace=str(path), qps=None, num_requests=None).resolved(0.5, 1000)
    assert workload.concurrency == 1
    r = run(RunConfig(policy="vllm", workload=workload, model="tiny", gpu="cpu"))
    req = r.result.request_columns
    assert r.summary["concurrency"] == 1 and req["arrival_s"][0] == pytest.approx(0.25)
    assert (req["arrival_s"][1:] == req["completion_s"][:-1]).all()  # sent as the one before completed
    assert compare(path, "tiny", "cpu", "vllm").prediction["concurrency"] == 1


def test_a_file_not_named_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "validate", "--from-vllm-bench", write(tmp_path, bench(), "bench.txt"),
                        "--model", "tiny", "--gpu", "cpu", "--out", tmp_path / "cmp")
    assert code == 2 and len(err.splitlines()) == 1 and "expected a .json file" in err, err


@pytest.mark.vllm  # imports the installed vLLM (about 10 s): the vllm tier, whose process has it loaded
def test_the_measured_side_is_what_vllm_itself_computes(tmp_path: Path) -> None:
    """The bench file's requests through the installed vLLM's own `calculate_metrics`."""
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    d = bench()
    outputs = [RequestFuncOutput(success=not d["errors"][i], latency=d["latencies"][i], ttft=d["ttfts"][i],
                                 output_tokens=d["output_lens"][i], itl=d["itls"][i],
                                 prompt_len=d["input_lens"][i], error=d["errors"][i],
                                 start_time=d["start_times"][i]) for i in range(4)]
    m, _ = serve.calculate_metrics([], outputs, d["duration"], None, [99.0], {"ttft": 160.0, "tpot": 45.0})
    theirs = {"request_throughput": m.request_throughput, "output_throughput": m.output_throughput,
              "total_token_throughput": m.total_token_throughput, "request_goodput": m.request_goodput}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        theirs.update({f"mean_{metric}_ms": getattr(m, f"mean_{metric}_ms"),
                       f"median_{metric}_ms": getattr(m, f"median_{metric}_ms"),
                       f"p99_{metric}_ms": dict(getattr(m, f"percentiles_{metric}_ms"))[99.0]})
    ours = measured(read_vllm_bench(write(tmp_path, d)), parse_goodput(["ttft:160,tpot:45"]))
    assert ours.keys() == theirs.keys()
    for k, v in theirs.items():
        assert ours[k] == pytest.approx(float(v), rel=1e-12), k


def test_run_goodput_of_a_cluster_counts_the_whole_deployment(capsys: pytest.CaptureFixture[str]) -> None:
    """Every run is a deployment: vLLM bench's goodput is over every request, whichever replica served it."""
    code, out, err = _cli(capsys, "run", "--replicas", "2", "--num-requests", "4", "--goodput", "ttft:100000",
                          "--json")
    assert code == 0, err
    v = json.loads(out)["vllm_bench"]
    assert v["request_goodput"] == pytest.approx(v["request_throughput"])  # every request meets a loose limit


@pytest.mark.vllm
def test_a_file_written_by_vllms_own_benchmark(tmp_path: Path) -> None:
    """The installed vLLM's `benchmark()` run against a fake endpoint (answers in 4 ms, then a chunk per token
    every 2 ms; prompts of 7 tokens fail), its result saved as `main_async` saves it with --save-detailed."""
    serve = pytest.importorskip("vllm.benchmarks.serve")
    import asyncio
    import time

    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    async def fake(request_func_input: Any, session: Any, pbar: Any = None) -> Any:
        out = RequestFuncOutput(prompt_len=request_func_input.prompt_len)
        out.start_time = last = time.perf_counter()
        if request_func_input.prompt_len == 7:
            out.error = "Bad Request"
            return out
        await asyncio.sleep(0.004)
        out.ttft = time.perf_counter() - out.start_time
        last += out.ttft
        for _ in range(request_func_input.output_len - 1):
            await asyncio.sleep(0.002)
            now = time.perf_counter()
            out.itl.append(now - last)
            last = now
        out.latency, out.output_tokens = last - out.start_time, request_func_input.output_len
        out.success = True
        return out

    requests = [SampleRequest(prompt="x", prompt_len=p, expected_output_len=o)
                for p, o in ((5, 3), (7, 4), (9, 1), (11, 6))]
    funcs = serve.ASYNC_REQUEST_FUNCS
    funcs["simctl-test"] = fake
    try:
        result = asyncio.run(serve.benchmark(
            task_type=serve.TaskType.GENERATION, endpoint_type="simctl-test", api_url="http://127.0.0.1:9/v1",
            base_url="http://127.0.0.1:9", model_id="m", model_name="m", tokenizer=object(),
            input_requests=requests, logprobs=None, request_rate=50.0, burstiness=1.0, disable_tqdm=True,
            num_warmups=0, profile=False,
            selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"], selected_percentiles=[99.0],
            ignore_eos=False, goodput_config_dict={"ttft": 50.0, "tpot": 3.0}, max_concurrency=None,
            lora_modules=None, extra_headers=None, extra_body=None, ready_check_timeout_sec=0))
    finally:
        del funcs["simctl-test"]
    path = write(tmp_path, {"model_id": "tiny", "num_prompts": 4, "request_rate": 50.0, "burstiness": 1.0,
                            "max_concurrency": None, **result})
    b = read_vllm_bench(path)
    assert (b.sent, b.failed, b.prompt_tokens.tolist()) == (4, 1, [5, 9, 11])
    assert np.all(np.diff(b.arrival_s) >= 0) and b.arrival_s[0] >= 0
    ours = measured(b, parse_goodput(["ttft:50,tpot:3"]))
    for key in (*MEASURED, "request_goodput"):
        assert ours[key] == pytest.approx(result[key], rel=1e-9), key
    assert not compare(path, "tiny", "cpu", "vllm-v1", goodput=parse_goodput(["ttft:50,tpot:3"])).warnings


def test_a_bench_of_another_model_is_warned_of(tmp_path: Path) -> None:
    """Issue 35: a file whose model_id is another model than --model was compared without a word."""
    from simctl.validation.vllm_bench_compare import _other_model

    c = compare(write(tmp_path, bench(model_id="meta-llama/Llama-2-7b-hf")), "tiny", "cpu", "vllm")
    assert any("model_id 'meta-llama/Llama-2-7b-hf' does not name --model tiny" in w for w in c.warnings)
    assert _other_model("meta-llama/Llama-2-7b-hf", "llama-2-7b") == []
    assert _other_model("mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b") == []
    assert _other_model("/models/Qwen3-8B/", str(tmp_path / "Qwen3-8B" / "config.json")) == []
    assert _other_model(None, "tiny") == []
