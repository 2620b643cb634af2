"""TTFT by turn of generated conversations (`--trace sessions`), vLLM v1's prefix caching on and off: each
turn resends its whole context, so without the cache a turn's prefill grows with its index, and with it only
the new tokens (and the last block) are computed.

    PYTHONPATH=. python bench/sessions_ttft.py     # prints the table, writes bench/results/sessions_ttft.png

Mistral-7B on an A100 roofline, 2,000 turns, sessions arriving at 0.5 per second (closed loop: a turn is sent
its think time after the previous answer), 4 shared system prompts of 500 tokens, seed 0.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

from simctl.sim.run import RunConfig, run
from simctl.traces.workload import Workload

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUT = Path(__file__).resolve().parent / "results" / "sessions_ttft.png"
TURNS = 8  # turn indices shown (later ones are few: sessions have 2 turns on average)


def ttft_by_turn(caching: int) -> tuple[list[float], list[int], dict]:
    """Median TTFT (s) and request count per turn index, and the run's summary."""
    workload = Workload(trace="sessions", qps=0.5, num_requests=2000, system_prompt_tokens=500,
                        system_prompts=4)
    r = run(RunConfig(policy="vllm-v1", workload=workload, options={"enable_prefix_caching": caching}))
    frame = r.result.requests
    ttft = frame["first_token_s"] - frame["arrival_s"]
    by_turn = ttft.groupby(frame["turn"])
    return ([float(by_turn.median().get(t, float("nan"))) for t in range(TURNS)],
            [int(by_turn.size().get(t, 0)) for t in range(TURNS)], r.summary)


def main() -> None:
    rows = {caching: ttft_by_turn(caching) for caching in (1, 0)}
    print("| turn | requests | P50 TTFT, caching on (ms) | P50 TTFT, caching off (ms) |")
    print("|---:|---:|---:|---:|")
    for t in range(TURNS):
        print(f"| {t} | {rows[1][1][t]} | {rows[1][0][t] * 1e3:.1f} | {rows[0][0][t] * 1e3:.1f} |")
    s = rows[1][2]
    print(f"\nhit rate with caching {s['prefix_cache_hit_rate']:.1%} ({s['prefix_cache_hits']:,} of "
          f"{s['prefix_cache_queries']:,} prompt tokens); P50 TTFT {s['ttft_p50'] * 1e3:.1f} ms on, "
          f"{rows[0][2]['ttft_p50'] * 1e3:.1f} ms off")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for caching, label in ((1, "prefix caching on"), (0, "prefix caching off")):
        ax.plot(range(TURNS), [v * 1e3 for v in rows[caching][0]], marker="o", label=label)
    ax.set_xlabel("turn of its session (0: the first)")
    ax.set_ylabel("P50 TTFT (ms)")
    ax.set_title("vllm-v1, Mistral-7B on A100 (roofline), generated sessions")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT, dpi=120)
    print(f"figure: {OUT}")


if __name__ == "__main__":
    main()
