"""The overhead of chunked prefill (Sarathi-Serve, Figure 11), measured and predicted:
prefill time of one prompt of P tokens cut into chunks of C (batch size 1), divided by its time in one piece,
per operator class.

Measured: Vidur's operator times on an A100 at TP 2 (`../shared/reference/gpu_profiles/`, read through
`profiler.operator_profiles`): the Llama-2-70B layer (64 query / 8 KV heads, d = 8192, the only shape whose
attention kernel was profiled with chunks on cached context), its all-reduce, and the FlashAttention prefill
kernel at chunk q on kv cached tokens. A chunked prompt pays P / C times a C-token linear layer and
all-reduce, and its chunks' attention Σ_i t(q = C, kv = i C) (each re-reads the KV cached before it).
Predicted: the roofline's terms (`Roofline.breakdown`) for the same plans, on the same model and GPU, and on
Yi-34B (TP 2), the paper's model, for which nothing was measured. `gpu` sums the operators both sides have;
`with host` adds the roofline's per-step host overhead, which every chunk pays once.

The paper gives its bar heights only in the figure; its text says (section 5.2): smaller chunks cost more for
every operator and prompt size, attention and all-reduce have the highest overhead, linear operators almost
none at chunk 2048, and the whole prefill's overhead is close to the linear operators'. Those four claims are
checked on both sides.

    .venv/bin/python research/chunk_overhead.py [--root ../shared/reference/gpu_profiles]

Writes research/results/chunk_overhead.md and chunk_overhead.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from simctl.catalogue.models import get_model
from simctl.costs.roofline import Roofline
from simctl.policies.plan import hybrid
from simctl.policies.seq import Seq
from simctl.profiler.operator_profiles import LAYER_OPERATORS, OperatorProfile, load_operator_profile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "research" / "results"
GPU, TP = "a100-80gb", 2
PROMPTS = (1024, 2048, 4096)
CHUNKS = (256, 512, 1024, 2048)
LINEARS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
CLASSES = ("linear", "attention", "allreduce", "gpu")
NEAR_ZERO = 0.05  # "close to zero": the linear layers' overhead at chunk 2048


def _chunks(prompt: int, chunk: int) -> list[tuple[int, int]]:
    """(q, cached) of each chunk of a prompt."""
    return [(min(chunk, prompt - c), c) for c in range(0, prompt, chunk)]


def measured_times(p: OperatorProfile, layers: int, prompt: int, chunk: int) -> dict[str, float]:
    """Seconds of the whole model's prefill of `prompt` tokens in chunks of `chunk`, per operator class, from
    the measured operator medians (linear interpolation between measured token counts and KV lengths)."""
    att = p.attention[(p.attention["kind"] == "prefill") & (p.attention["batch"] == 1)]
    hidden_bytes = get_model("llama-2-70b").hidden_size * 2  # fp16 activations all-reduced
    out = dict.fromkeys(CLASSES, 0.0)
    for q, cached in _chunks(prompt, chunk):
        op = {name: float(np.interp(q, p.tokens, t)) for name, t in p.operators.items()}
        out["linear"] += layers * sum(op[n] for n in LINEARS)
        out["other"] = out.get("other", 0.0) + layers * sum(op[n] * k for n, k in LAYER_OPERATORS.items()
                                                            if n not in LINEARS)
        at_q = att[att["q"] == q].sort_values("kv")
        if at_q.empty:
            raise SystemExit(f"no measured attention at chunk {q}")
        out["attention"] += layers * float(np.interp(cached, at_q["kv"], at_q["time_s"]))
        sizes, secs = p.allreduce
        out["allreduce"] += layers * 2 * float(np.interp(q * hidden_bytes, sizes, secs))
    out["gpu"] = out["linear"] + out["attention"] + out["allreduce"]
    return out


def predicted_times(rf: Roofline, prompt: int, chunk: int) -> dict[str, float]:
    """The roofline's terms of the same chunks (the last one samples the first token)."""
    out = dict.fromkeys((*CLASSES, "host"), 0.0)
    for q, cached in _chunks(prompt, chunk):
        seq = Seq(0, 0.0, prompt, 1)
        seq.computed = cached
        terms = rf.breakdown(hybrid([], [seq], [q]))
        out["linear"] += terms["linear"]
        out["attention"] += terms["prefill_attention"]
        out["allreduce"] += terms["allreduce"]
        out["host"] += terms["overhead"]
    out["gpu"] = out["linear"] + out["attention"] + out["allreduce"]
    return out


def overheads(times_of, prompt: int, chunk: int) -> dict[str, float]:
    chunked, whole = times_of(prompt, chunk), times_of(prompt, prompt)
    ratios = {k: chunked[k] / whole[k] for k in CLASSES if whole[k] > 0}
    if "host" in chunked:
        ratios["with host"] = (chunked["gpu"] + chunked["host"]) / (whole["gpu"] + whole["host"])
    return ratios


def table(root: Path) -> pd.DataFrame:
    llama = get_model("llama-2-70b")
    profile = load_operator_profile(root, llama, GPU, TP)
    sides = {
        ("llama-2-70b", "measured"): lambda P, C: measured_times(profile, llama.num_layers, P, C),
        ("llama-2-70b", "roofline"): lambda P, C: predicted_times(Roofline(llama, GPU, tp=TP), P, C),
        ("yi-34b", "roofline"): lambda P, C: predicted_times(Roofline(get_model("yi-34b"), GPU, tp=TP), P, C),
    }
    rows = []
    for (model, side), times_of in sides.items():
        for prompt in PROMPTS:
            for chunk in (c for c in CHUNKS if c < prompt):
                rows.append({"model": model, "side": side, "prompt": prompt, "chunk": chunk,
                             **overheads(times_of, prompt, chunk)})
    return pd.DataFrame(rows)


def claims(df: pd.DataFrame) -> list[tuple[str, str, bool]]:
    """The paper's four claims, on each side."""
    out = []
    for (model, side), g in df.groupby(["model", "side"], sort=False):
        name = f"{model} {side}"
        falls = all((s.sort_values("chunk")[list(CLASSES)].diff().dropna() <= 1e-9).all().all()
                    for _, s in g.groupby("prompt"))
        top = g[list(CLASSES[:3])].mean().sort_values(ascending=False).index[:2]
        lin_2048 = g[g["chunk"] == 2048]["linear"]
        near = bool(len(lin_2048)) and bool((lin_2048 - 1 <= NEAR_ZERO).all())
        close = float((g["gpu"] - g["linear"]).abs().max())
        out += [(name, "smaller chunks cost more, every class and prompt", falls),
                (name, f"attention and all-reduce the highest (here: {', '.join(top)})",
                 set(top) == {"attention", "allreduce"}),
                (name, (f"linear overhead at chunk 2048 within {NEAR_ZERO:.0%} "
                       f"(here: {', '.join(f'{v - 1:+.1%}' for v in lin_2048)})"), near),
                (name, f"the whole prefill's overhead close to the linears' (largest gap {close:.1%})",
                 close <= 0.05)]
    return out


def markdown(df: pd.DataFrame) -> str:
    lines = ["# Chunked-prefill overhead: measured (A100, TP 2) vs the roofline", "",
             ("Prefill time in chunks / in one piece, batch size 1 (Sarathi-Serve Figure 11's measure). Made "
             "by `research/chunk_overhead.py` (its docstring says what is measured and how)."), "",
             "| model | side | prompt | chunk | linear | attention | all-reduce | gpu | with host |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in df.to_dict("records"):
        host = r.get("with host", float("nan"))
        lines.append(f"| {r['model']} | {r['side']} | {r['prompt']} | {r['chunk']} | {r['linear']:.3f} | "
                     f"{r['attention']:.3f} | {r['allreduce']:.3f} | {r['gpu']:.3f} | "
                     f"{'' if np.isnan(host) else f'{host:.3f}'} |")
    meas = df[df["side"] == "measured"].set_index(["prompt", "chunk"])
    pred = df[(df["side"] == "roofline") & (df["model"] == "llama-2-70b")].set_index(["prompt", "chunk"])
    err = ((pred[list(CLASSES)] - 1) - (meas[list(CLASSES)] - 1)).abs().max()
    lo, hi = meas["attention"].min(), meas["attention"].max()
    lines += ["", ("What the roofline prices for a chunk: its linear layers over C rows (tile-rounded, each "
              "GEMM's fixed time), its attention over the KV cached before it (the memory term reads c + q "
              "tokens), two all-reduces a layer with their fixed latency, and the step's host overhead; the "
              "fitted features carry the same re-read (`attn_kv_tokens`) and the per-step intercept."),
              "", (f"The measured FlashAttention kernel runs a chunked prompt in {lo:.2f}-{hi:.2f} of the "
              "time it takes the whole prompt at kv = 0 (Vidur's profile), so the attention overhead the "
              "paper measured with its 2023 kernels does not appear on these; the roofline's attention stays "
              "at 1.00 (the re-read is small beside the chunk's compute).")]
    lines += ["",
              "Largest difference between the roofline's and the measured overhead (Llama-2-70B, points of "
              "the unchunked time): " + ", ".join(f"{k} {v:.1%}" for k, v in err.items()) + ".", "",
              "## The paper's claims (section 5.2)", "", "| where | claim | holds |", "|---|---|---|"]
    lines += [f"| {w} | {c} | {'yes' if ok else 'NO'} |" for w, c, ok in claims(df)]
    return "\n".join(lines) + "\n"


def figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    l70 = df[df["model"] == "llama-2-70b"]
    fig, axes = plt.subplots(1, len(PROMPTS), figsize=(5 * len(PROMPTS), 4), sharey=True)
    for ax, prompt in zip(axes, PROMPTS):
        g = l70[l70["prompt"] == prompt]
        chunks = sorted(g["chunk"].unique())
        width = 0.8 / len(CLASSES)
        for i, cls in enumerate(CLASSES):
            x = np.arange(len(chunks)) + i * width
            m = g[g["side"] == "measured"].set_index("chunk").loc[chunks, cls]
            r = g[g["side"] == "roofline"].set_index("chunk").loc[chunks, cls]
            ax.bar(x, m, width, label=f"{cls} measured", color=f"C{i}")
            ax.scatter(x, r, marker="_", s=300, color="black", label="roofline" if i == 0 else None, zorder=3)
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xticks(np.arange(len(chunks)) + 0.4 - width / 2, [str(c) for c in chunks])
        ax.set_title(f"prompt {prompt}")
        ax.set_xlabel("chunk size (tokens)")
    axes[0].set_ylabel("chunked / unchunked prefill time")
    axes[0].legend(fontsize=7)
    fig.suptitle("Chunked-prefill overhead, Llama-2-70B on A100 TP2: bars measured (Vidur), dashes roofline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT.parent / "shared" / "reference" / "gpu_profiles"))
    args = ap.parse_args()
    result = table(Path(args.root))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "chunk_overhead.md").write_text(markdown(result), encoding="utf-8")
    figure(result, RESULTS / "chunk_overhead.png")
    print(markdown(result))
