"""How large a KV cache does the Sarathi-Serve artifact give Orca and vLLM in the paper's capacity runs
(Mistral-7B, one A100-80GB, sharegpt, strict SLO), and what capacity does simctl give each with it?

    python research/sarathi_orca_kv.py [--requests N] [--workers W] [--seeds K]

The artifact (github.com/microsoft/sarathi-serve, branch osdi-sarathi-serve) sizes its KV cache as
(total GPU memory x gpu_memory_utilization - peak of one profiling forward) // bytes per 16-token block,
where the peak (torch's max_memory_allocated) holds the weights and the activations of a forward over the
scheduler's max_num_batched_tokens: vLLM's max_tokens_in_batch (the trace's 8,192), Orca's max_num_seqs x
max_model_len, Sarathi's one chunk (sarathi/model_executor/model_runner.py: profile_num_available_blocks;
sarathi/config.py: OrcaSchedulerConfig.max_num_batched_tokens). The activation peak is estimated with
simctl's `activation_peak_bytes` (a Llama layer's MLP, 4 hidden + 3 intermediate values a token), the
weights with `ReplicaMemory`; the memory is the catalogue's 80 GiB (what CUDA reports is ~1% less).
Part 1 prints the resulting KV per scheduler and, for Orca, per batch limit; part 2 the capacity (the
study's bisection) of Orca (batch 16, the artifact's figure-5-6 setting) and vLLM (batch 128) with those KV
sizes beside simctl's own sizing.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from math import nan

from simctl.catalogue.gpus import GiB, get_gpu
from simctl.catalogue.models import get_model
from simctl.costs.kv_capacity import KVSizing, ReplicaMemory, activation_peak_bytes
from simctl.results.slo import parse_slo
from simctl.sim.run import RunConfig
from simctl.studies.capacity import CapacityConfig, search_capacities
from simctl.traces.workload import Workload

MODEL, GPU = "mistral-7b", "a100-80gb"
GPU_MEMORY_UTILIZATION = 0.85  # the artifact's benchmark default (sarathi/benchmark/config/default.yml)
BLOCK = 16  # the artifact's block size (sarathi/engine/arg_utils.py)
MAX_LEN = 8192  # the chat trace's max_seq_len, passed as max_model_len and vLLM's max_tokens_in_batch
ORCA_BATCH, VLLM_BATCH = 16, 128  # osdi-experiments/figure-5-6/mistral7b_strict.yml
SLO_TBT = 0.1


def artifact_kv_tokens(profiled_tokens: int) -> int:
    """KV tokens the artifact's engine allocates after a profiling forward over `profiled_tokens`."""
    model, gpu = get_model(MODEL), get_gpu(GPU)
    mem = ReplicaMemory.of(model, 1, 2)
    peak = mem.weight_bytes + activation_peak_bytes(model, 1, profiled_tokens, 2)
    blocks = int((gpu.memory_bytes * GPU_MEMORY_UTILIZATION - peak) // (mem.kv_bytes_per_token * BLOCK))
    return max(blocks, 0) * BLOCK


def sizing_table() -> list[str]:
    model = get_model(MODEL)
    lines = ["### KV cache as the artifact sizes it (Mistral-7B, A100-80GB, utilization 0.85, block 16)", "",
             ("| scheduler | max_num_seqs | tokens profiled | activation peak GiB | KV tokens | "
              "max-length (8,192) reservations | batch Orca can run |"),
             "|---|---:|---:|---:|---:|---:|---:|"]
    rows = [("vllm", VLLM_BATCH, MAX_LEN), ("sarathi chunk 512", VLLM_BATCH, 512)]
    rows += [("orca", b, b * MAX_LEN) for b in (8, 16, 24, 28, 32, 48, 64, 128)]
    for name, seqs, tokens in rows:
        kv = artifact_kv_tokens(tokens)
        act = activation_peak_bytes(model, 1, tokens, 2) / GiB
        runs = str(min(seqs, kv // MAX_LEN)) if name == "orca" else "-"
        lines.append(f"| {name} | {seqs} | {tokens} | {act:.2f} | {kv} | {kv // MAX_LEN} | {runs} |")
    return lines


def base(policy: str, requests: int, **options: int) -> RunConfig:
    return RunConfig(policy=policy, model=MODEL, gpu=GPU, execution="cuda-graph", options=options,
                     workload=Workload(trace="sharegpt", qps=1.0, num_requests=requests))


def capacities(requests: int, workers: int, seeds: int) -> list[str]:
    orca_kv, vllm_kv = artifact_kv_tokens(ORCA_BATCH * MAX_LEN), artifact_kv_tokens(MAX_LEN)
    configs = {
        "orca max_batch_size=16 (simctl's KV)": base("orca", requests, max_batch_size=ORCA_BATCH),
        f"orca max_batch_size=16 kv_cache_tokens={orca_kv} (artifact's)": replace(
            base("orca", requests, max_batch_size=ORCA_BATCH), kv_sizing=KVSizing(kv_cache_tokens=orca_kv)),
        "vllm max_batch_size=128 (simctl's KV)": base("vllm", requests, max_batch_size=VLLM_BATCH),
        f"vllm max_batch_size=128 kv_cache_tokens={vllm_kv} (artifact's)": replace(
            base("vllm", requests, max_batch_size=VLLM_BATCH), kv_sizing=KVSizing(kv_cache_tokens=vllm_kv)),
    }
    slo = replace(parse_slo([f"p99_tbt={SLO_TBT}"]), definition="paper")
    found = search_capacities(CapacityConfig(list(configs.values()), {"strict": slo}, workers=workers,
                                             labels=list(configs), seeds=seeds))
    lines = [f"### capacity (cuda-graph, {requests} requests a probe, median of {seeds} seeds)", "",
             ("| configuration | capacity QPS | bound by | P99 TBT at capacity | median sched delay at "
              "capacity | KV capacity |"), "|---|---:|---|---:|---:|---:|"]
    for c in found:
        m = c.median_search
        at = m.at_capacity or {}
        lines.append(f"| {c.label} | {c.qps:.3g} | {', '.join(m.bound_by) or '-'} | "
                     f"{at.get('tbt_p99', nan):.3f} | {at.get('sched_delay_p50', nan):.3f} | "
                     f"{at.get('kv_capacity_tokens', nan):.0f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=1)
    args = ap.parse_args()
    print("\n".join(sizing_table() + [""] + capacities(args.requests, args.workers, args.seeds)))


if __name__ == "__main__":
    main()
