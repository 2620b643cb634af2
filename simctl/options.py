"""Options shared by the commands that simulate (typer annotations) and the parsing of list options, in one
place for every command module."""

from __future__ import annotations

from typing import Annotated

import typer

from common.errors import InputError
from executor.config import ATTENTION
from policies.registry import POLICIES

Policy = Annotated[str, typer.Option(help=f"Scheduler: {', '.join(POLICIES)} (see `simctl list`).")]
Trace = Annotated[str, typer.Option(help="Length profile (sharegpt, arxiv) or a trace file: CSV with "
                                    "num_prefill_tokens, num_decode_tokens[, arrived_at], JSONL, or a `vllm "
                                    "bench serve --save-detailed` result (.json: its requests, sent when it "
                                    "sent them).")]
Model = Annotated[str, typer.Option(help="Model shape from the catalogue, or a path to a transformers "
                                    "config.json of a dense Llama, Mistral, Qwen2 or Yi model, or a "
                                    "mixture-of-experts Mixtral, Qwen2-MoE or Qwen3-MoE one.")]
Gpu = Annotated[str, typer.Option(help="GPU from the catalogue.")]
Tp = Annotated[int, typer.Option(help="Tensor-parallel degree (GPUs per replica).")]
# capacity and run compare the values of a comma list (simctl.option_grid)
Models = Annotated[str, typer.Option(help=Model.__metadata__[0].help + " A comma list compares them.")]
Gpus = Annotated[str, typer.Option(help="GPU from the catalogue; a comma list compares them.")]
Tps = Annotated[str, typer.Option(help="Tensor-parallel degree (GPUs per replica); a comma list compares "
                                  "them.", metavar="INTEGER[,...]")]
MaxModelLen = Annotated[int | None, typer.Option(help=(
    "Positions a request may need, prompt + output, as vLLM's --max-model-len [default: the model's "
    "context]; a longer request is handled as --on-too-long says."))]
OnTooLong = Annotated[str, typer.Option(help=(
    "A request longer than --max-model-len: refuse (a server answers it with an error: counted as "
    "`rejected`, out of the latency percentiles, against SLO attainment), error (the whole run stops), or "
    "truncate (its prompt is cut to fit)."), metavar="refuse|error|truncate")]
RoutingSkew = Annotated[float, typer.Option(help=(
    "Mixture-of-experts models, roofline: how unevenly tokens route to experts. Expert i (by popularity) "
    "takes a share of tokens proportional to (i+1)^-skew (Zipf), so a batch reads fewer distinct experts' "
    "weights; 0 is uniform routing."))]
Ep = Annotated[int, typer.Option(help=(
    "Mixture-of-experts models, roofline: expert parallelism. 1 splits every expert over the --tp GPUs; "
    "--ep equal to --tp gives each GPU whole experts (vLLM's --enable-expert-parallel), and an iteration "
    "waits for the GPU its tokens routed most work to."))]
Seed = Annotated[int, typer.Option(help="Seed for lengths and arrivals: same seed, same results.")]
Arrival = Annotated[str, typer.Option(help="Arrival process: poisson, or gamma (bursty, see --cv).")]
Cv = Annotated[float, typer.Option(help="Coefficient of variation of gamma inter-arrivals.")]
Scale = Annotated[float, typer.Option(help="Multiply prompt and output lengths (e.g. 0.05 makes sharegpt "
                                      "CPU-sized); recorded in the summary.")]
Cost = Annotated[str | None, typer.Option(help="A fitted cost_model.json (from `simctl fit`) instead of the "
                                          "roofline, or a roofline_calibration.json (`simctl fit "
                                          "--roofline-gpu`) to apply measured efficiencies to --gpu's specs; "
                                          "--gpu cpu uses the shipped CPU fit by default.")]
ATTENTION_HELP = ("SDPA kernels of the attention: " + "; ".join(f"{k}: {v}" for k, v in ATTENTION.items())
                  + ". cuDNN re-plans for every new KV length, which serving meets every step. A fit prices "
                  "only runs made with the kernels it was profiled with.")
Attention = Annotated[str, typer.Option(help=ATTENTION_HELP)]


def comma_list(text: str, what: str) -> list[str]:
    """The items of a comma-separated option value (`--policy a,b`); InputError if there are none."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError(f"--{what}: give at least one value")
    return items


def batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(t) for t in comma_list(text, "batch-size")]
    except ValueError:
        raise InputError(f"--batch-size {text!r}: comma-separated integers, e.g. 8,16,32") from None
    if min(sizes) < 1:
        raise InputError(f"--batch-size {text!r}: every batch size must be >= 1")
    return sizes
