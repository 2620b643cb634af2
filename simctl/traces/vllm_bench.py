"""A `vllm bench serve --save-result --save-detailed` result file: the requests it sent, what it measured for
each, and how it sent them.

The file (vllm/benchmarks/serve.py, `main_async` and `benchmark`) is one JSON object. Its per-request lists,
one entry per request sent, in send order, are kept only with `--save-detailed`: `input_lens` (prompt tokens),
`output_lens` (tokens generated; 0 for a failed request), `ttfts` (s), `itls` (s, one list per request: the
gaps between streamed chunks, and a chunk may carry several tokens), `start_times` (s, the client's
`time.perf_counter()` when the request was sent), `errors` ("" unless it failed) and `generated_texts`;
`latencies` (s, send to last chunk) is kept without it too. Beside them: `duration` (s, from the benchmark's
start, before the first request's delay, to the last response), `completed`, `failed`, the traffic it was
asked for (`request_rate`, a number or "inf"; `burstiness`; `max_concurrency`; optional `ramp_up_strategy`)
and the aggregates it printed (`mean_ttft_ms`, `p99_itl_ms`, `request_throughput`, `request_goodput`, ...).
The `--goodput` limits themselves are not written.

Replaying the load: the requests are replayed at their send times (`start_times` less the first, plus the
benchmark's lead-in before it, `duration` less the span from the first send to the last response). A file
without `start_times` (older vLLM) is replayed from what it says was asked: all at t=0 for rate "inf",
else Gamma gaps of shape `burstiness` at `request_rate` (Poisson for 1, evenly spaced for Infinity), seeded
here, scaled as vLLM scales them so that the last is sent at n / rate. With `max_concurrency` (the client's
semaphore, `limited_request_func`) the replay is closed loop with that bound (`serving.clients.Clients`):
`arrival_s` is when each request was ready, its send time less its wait for a slot (`queue_times`, vLLM's
`client_queue_time`), or without queue_times as drawn above, and the simulated client sends it when a slot
is free. `VLLMBench.assumptions` says which, in words. A failed request is excluded (its output length is
unknown) and counted.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simctl.common.checks import is_int, is_number
from simctl.common.errors import InputError
from simctl.common.files import read_text
from simctl.traces.arrivals import gamma_arrivals

DETAILED = ("input_lens", "output_lens", "ttfts", "itls")  # the lists only --save-detailed keeps
REQUIRED = ("duration", "completed", "latencies")  # every generation result has them
REPORTED = re.compile(r"^((mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms|request_throughput|"
                      r"output_throughput|total_token_throughput|request_goodput)$")
GENERATED_SEED = 0  # the seed of arrivals generated for a file without send times


@dataclass(frozen=True)
class Traffic:
    """How the benchmark was asked to send its requests (the file's traffic keys)."""

    request_rate: float  # requests/s; math.inf: all at once
    burstiness: float  # Gamma shape of the gaps: 1 Poisson, math.inf evenly spaced
    max_concurrency: int | None  # the client's limit of requests in flight
    ramp_up: str | None  # vLLM's --ramp-up-strategy, when the rate was ramped


@dataclass(frozen=True)
class VLLMBench:
    """The successful requests of a bench result, sorted by send time, and the file's other facts."""

    path: Path
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    # float64, non-decreasing, from the benchmark's start: when each was sent (with a client bound, when it
    # was ready to be sent)
    arrival_s: np.ndarray
    ttft_s: np.ndarray
    latency_s: np.ndarray  # vLLM's E2EL: send to last chunk
    max_itl_s: np.ndarray  # each request's largest chunk gap (0 with one chunk)
    itl_s: np.ndarray  # every successful request's chunk gaps, pooled (vLLM's ITL)
    sent: int  # requests sent, failed ones included
    failed: int
    duration_s: float
    traffic: Traffic
    send_times_measured: bool  # the file has start_times (else the arrivals were generated)
    ready_times_measured: bool = False  # with a client bound: start_times and queue_times give ready times
    model_id: str | None = None
    reported: dict[str, float] = field(default_factory=dict)  # the file's aggregates (REPORTED keys)

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def assumptions(self) -> list[str]:
        """What the prediction assumes about the load, in plain words."""
        t = self.traffic
        out = []
        if t.max_concurrency is not None:
            ready = ("when the client had it ready (start_times less queue_times, its wait for a slot)"
                     if self.ready_times_measured
                     else f"as asked (the file has no queue_times): {self._drawn()}")
            out.append(f"the client kept at most {t.max_concurrency} requests in flight: the prediction is "
                       f"closed loop with that bound, each request ready {ready}, sent when a slot is free")
        elif self.send_times_measured:
            out.append("requests arrive when the client sent them (the file's start_times), from the "
                       f"benchmark's start ({self.arrival_s[0]:.3f} s before the first send)")
        else:
            out.append(f"the file has no send times: {self._drawn()}")
        if self.failed:
            out.append(f"{self.failed} failed request(s) of {self.sent} excluded (their output lengths are "
                       "unknown)")
        tokens = int((self.output_tokens - 1).sum())
        if len(self.itl_s) < tokens:
            out.append(f"the file holds {len(self.itl_s)} chunk gaps for {tokens} tokens after the first "
                       "(a streamed chunk carried several tokens): its ITL pools chunk gaps, the "
                       "prediction's pools token gaps")
        return out


    def _drawn(self) -> str:
        """How arrivals are drawn from what the file says was asked."""
        t = self.traffic
        if math.isinf(t.request_rate):
            return "every request arrives at t=0 (request rate inf)"
        shape = ("evenly spaced gaps" if math.isinf(t.burstiness) else "Poisson gaps" if t.burstiness == 1
                 else f"Gamma gaps of shape {t.burstiness:g} (burstiness)")
        return (f"arrivals generated at {t.request_rate:g} req/s with {shape}, seed {GENERATED_SEED}, "
                "scaled as vLLM does so that the last arrives at n / rate")


def read_vllm_bench(path: str | Path) -> VLLMBench:
    """The bench result at `path`; InputError (one line) for a file that is not one, or is truncated or
    malformed, or was saved without --save-detailed."""
    path = Path(path)
    what = f"vLLM bench result {path}"
    data = _parse(read_text(path, what), what)
    if "total_input_sequences" in data:
        raise InputError(f"{what}: a pooling (embedding) benchmark: it generated no tokens to predict")
    missing = [k for k in (*REQUIRED, *DETAILED) if k not in data]
    if any(k in data for k in REQUIRED) and set(missing) <= set(DETAILED) and missing:
        raise InputError(f"{what}: has no per-request lists ({', '.join(missing)}); run `vllm bench serve` "
                         "with --save-result --save-detailed")
    if missing:
        raise InputError(f"{what}: not a `vllm bench serve --save-result` file (no {', '.join(missing)})")
    n = _length(data, what)
    prompts = _ints(data, "input_lens", n, what)
    outputs = _ints(data, "output_lens", n, what)
    ttft = _numbers(data, "ttfts", n, what)
    latency = _numbers(data, "latencies", n, what)
    itls = _itl_lists(data, n, what)
    errors = data.get("errors") or [""] * n
    if not isinstance(errors, list) or len(errors) != n:
        raise InputError(f"{what}: errors must be a list of {n} strings")
    ok = np.array([not e and o > 0 for e, o in zip(errors, outputs)], dtype=bool)
    completed = data["completed"]
    if not is_int(completed) or completed != ok.sum():
        raise InputError(f"{what}: says {completed!r} requests completed, but its lists hold {int(ok.sum())} "
                         "successful ones (no error, output_lens > 0)")
    if not ok.any():
        raise InputError(f"{what}: every request failed; there is nothing to predict")
    bad = ok & ((prompts < 1) | (latency < ttft))
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(f"{what}: request {i} completed with input_lens {prompts[i]} and latency "
                         f"{latency[i]} < ttft {ttft[i]}; expected input_lens >= 1 and latency >= ttft")
    duration = data["duration"]
    if not is_number(duration) or not (duration > 0 and math.isfinite(duration)):
        raise InputError(f"{what}: duration must be a positive number of seconds, got {duration!r}")
    traffic = _traffic(data, what)
    arrivals, measured, ready = _arrivals(data, n, ok, latency, float(duration), traffic, what)
    keep = np.flatnonzero(ok)
    keep = keep[np.argsort(arrivals[keep], kind="stable")]
    model_id = data.get("model_id")
    return VLLMBench(
        path=path, prompt_tokens=prompts[keep], output_tokens=outputs[keep], arrival_s=arrivals[keep],
        ttft_s=ttft[keep], latency_s=latency[keep],
        max_itl_s=np.array([max(itls[i], default=0.0) for i in keep], dtype=np.float64),
        itl_s=np.array([g for i in keep for g in itls[i]], dtype=np.float64),
        sent=n, failed=n - len(keep), duration_s=float(duration), traffic=traffic,
        send_times_measured=measured, ready_times_measured=ready,
        model_id=model_id if isinstance(model_id, str) else None,
        reported={k: float(v) for k, v in data.items() if REPORTED.match(k) and is_number(v)},
    )


def _arrivals(data: dict[str, Any], n: int, ok: np.ndarray, latency: np.ndarray, duration: float,
              traffic: Traffic, what: str) -> tuple[np.ndarray, bool, bool]:
    """When each request arrived (the first at 0), whether the file measured when each was sent, and whether
    it measured when each was ready (a client bound's `queue_times`); generated from the traffic asked for
    when it measured neither."""
    measured = data.get("start_times") is not None
    closed = traffic.max_concurrency is not None
    ready = measured and closed and data.get("queue_times") is not None
    if not (measured and (ready or not closed)):
        return _generated_arrivals(n, traffic, what), measured, ready
    sent = _numbers(data, "start_times", n, what, minimum=-math.inf)
    # when each was ready: sent, less its wait for one of the client's slots
    starts = sent - _numbers(data, "queue_times", n, what) if ready else sent
    span = float((sent[ok] + latency[ok]).max() - starts.min())
    return starts - starts.min() + max(0.0, duration - span), measured, ready


def measured_concurrency(trace: str | Path) -> int | None:
    """The client bound (`max_concurrency`) of the `vllm bench serve` result at `trace`, replayed closed loop;
    None for another trace, or a result measured without one."""
    if Path(trace).suffix.lower() != ".json":
        return None
    return read_vllm_bench(trace).traffic.max_concurrency


def _parse(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # --append-result writes one result per line
            raise InputError(f"{what}: holds more than one result (line {e.lineno}; written with "
                             "--append-result?); keep the one to compare in a file of its own") from None
        raise InputError(f"{what}: not valid JSON (truncated?): {e.msg} at line {e.lineno} column {e.colno}"
                         ) from None
    if not isinstance(data, dict):
        raise InputError(f"{what}: not a `vllm bench serve --save-result` file (a JSON "
                         f"{type(data).__name__}, not an object)")
    return data


def _length(data: dict[str, Any], what: str) -> int:
    lists = {k: data[k] for k in (*DETAILED, "latencies")}
    bad = [k for k, v in lists.items() if not isinstance(v, list)]
    if bad:
        raise InputError(f"{what}: {bad[0]} is not a list")
    lengths = {len(v) for v in lists.values()}
    if len(lengths) != 1:
        raise InputError(f"{what}: its per-request lists differ in length "
                         f"({', '.join(f'{k} {len(v)}' for k, v in lists.items())})")
    n = lengths.pop()
    if n == 0:
        raise InputError(f"{what}: holds no requests")
    return n


def _numbers(data: dict[str, Any], key: str, n: int, what: str, minimum: float = 0.0) -> np.ndarray:
    values = data[key]
    if not isinstance(values, list) or len(values) != n:
        raise InputError(f"{what}: {key} must be a list of {n} numbers")
    for i, v in enumerate(values):
        if not is_number(v) or not math.isfinite(v) or v < minimum:
            raise InputError(f"{what}: {key}[{i}] is {v!r}, expected a finite number"
                             + (f" >= {minimum:g}" if math.isfinite(minimum) else ""))
    return np.asarray(values, dtype=np.float64)


def _ints(data: dict[str, Any], key: str, n: int, what: str) -> np.ndarray:
    values = data[key]
    for i, v in enumerate(values):
        if not is_int(v) or v < 0:
            raise InputError(f"{what}: {key}[{i}] is {v!r}, expected a token count (an integer >= 0)")
    return np.asarray(values, dtype=np.int64)


def _itl_lists(data: dict[str, Any], n: int, what: str) -> list[list[float]]:
    itls = data["itls"]
    for i, gaps in enumerate(itls):
        if not isinstance(gaps, list) or not all(is_number(g) and math.isfinite(g) and g >= 0 for g in gaps):
            raise InputError(f"{what}: itls[{i}] must be a list of gaps (finite numbers of seconds >= 0)")
    return itls


def _traffic(data: dict[str, Any], what: str) -> Traffic:
    rate = data.get("request_rate", "inf")
    rate = math.inf if rate == "inf" else rate
    burstiness = data.get("burstiness", 1.0)
    concurrency = data.get("max_concurrency")
    ramp = data.get("ramp_up_strategy")
    if not is_number(rate) or not rate > 0:
        raise InputError(f"{what}: request_rate must be a positive number or \"inf\", got {rate!r}")
    if not is_number(burstiness) or not burstiness > 0:
        raise InputError(f"{what}: burstiness must be a positive number, got {burstiness!r}")
    if concurrency is not None and (not is_int(concurrency) or concurrency < 1):
        raise InputError(f"{what}: max_concurrency must be null or an integer >= 1, got {concurrency!r}")
    return Traffic(float(rate), float(burstiness), concurrency, ramp if isinstance(ramp, str) else None)


def _generated_arrivals(n: int, traffic: Traffic, what: str) -> np.ndarray:
    """Send times as vLLM's `get_request` draws them, for a file that does not record them."""
    if traffic.ramp_up is not None:
        raise InputError(f"{what}: the rate was ramped up ({traffic.ramp_up}) and the file has no "
                         "start_times to replay; rerun with a vLLM that saves them")
    rate, burstiness = traffic.request_rate, traffic.burstiness
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.arange(1, n + 1) / rate
    else:
        gaps = gamma_arrivals(n, rate, 1 / math.sqrt(burstiness), np.random.default_rng(GENERATED_SEED))
    return gaps * (n / rate / gaps[-1])
