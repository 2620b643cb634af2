"""vllm-v1 against the installed vLLM's own scheduler (vllm.v1.core.sched.scheduler.Scheduler over a block
pool of the same size, no model): on random workloads with shared prefixes, preemptions and long-prefill
thresholds, every step schedules the same requests with the same token counts, and the prefix-cache counters
agree, under FCFS and under priority scheduling. Skipped where vLLM is not installed (`make vllm`)."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simctl.policies.registry import make_policy
from simctl.policies.seq import Seq
from simctl.policies.vllm_v1 import VLLMV1

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm")

# (block_size, max_num_batched_tokens, max_num_seqs, enable_prefix_caching, long_prefill_token_threshold)
CONFIGS = [(4, 16, 4, 1, 0), (16, 64, 64, 1, 0), (4, 16, 2, 1, 3), (16, 16, 4, 0, 0), (4, 64, 4, 1, 0)]


@functools.cache
def vllm_config(block: int, tokens: int, seqs: int, caching: int, threshold: int, admission: str) -> Any:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    from simctl.catalogue.models import get_model
    from simctl.executor.vllm_runtime import VLLMEngineArgs, engine_args, vllm_model_dir

    with vllm_model_dir(get_model("tiny")) as d:
        kw = engine_args(d, VLLMEngineArgs(max_model_len=2048, block_size=block,
                                           max_num_batched_tokens=tokens, max_num_seqs=seqs,
                                           enable_prefix_caching=bool(caching)))
        return EngineArgs(**kw, long_prefill_token_threshold=threshold,
                          scheduling_policy=admission).create_engine_config(UsageContext.LLM_CLASS)


def vllm_scheduler(config: tuple[int, ...], admission: str, blocks: int) -> Any:
    import torch
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    cfg = vllm_config(*config, admission)
    spec = FullAttentionSpec(block_size=config[0], num_kv_heads=1, head_size=8, dtype=torch.float32)
    # vLLM sets one block aside (the null block): one more for the same usable blocks
    kv = KVCacheConfig(num_blocks=blocks + 1, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    cfg.cache_config.num_gpu_blocks = blocks + 1
    return Scheduler(cfg, kv, StructuredOutputManager(cfg), block_size=config[0], log_stats=True)


def token_ids(i: int, prompt: int, group: int, shared: int) -> list[int]:
    """Prompt ids as `traces.request.Request` defines them: the first `shared` the group's, the rest its
    own."""
    return [10_000 + 1_000 * group + j for j in range(shared)] + [1_000_000 + 10_000 * i + j
                                                                   for j in range(prompt - shared)]


def with_prefix_stats(counted: list[int], scheduler: Any) -> list[int]:
    """vLLM's prefix-cache counters of its last step added: queries, hits, preempted queries and hits."""
    stats = scheduler.kv_cache_manager.make_prefix_cache_stats()
    return [c + d for c, d in zip(counted, (stats.queries, stats.hits, stats.preempted_queries,
                                            stats.preempted_hits))]


@st.composite
def workloads(draw: st.DrawFn) -> tuple[tuple[int, ...], str, int, list[tuple[int, ...]]]:
    config = draw(st.sampled_from(CONFIGS))
    admission = draw(st.sampled_from(["fcfs", "priority"]))
    n = draw(st.integers(1, 10))
    reqs = []  # (arrival step, prompt, output, group, shared, priority)
    step = 0
    for _ in range(n):
        step += draw(st.sampled_from([0, 0, 1, 3, 10]))
        prompt, group = draw(st.integers(1, 80)), draw(st.integers(-1, 1))
        reqs.append((step, prompt, draw(st.integers(1, 40)), group, draw(st.integers(0, prompt)) if group >= 0
                     else 0, draw(st.integers(0, 2)) if admission == "priority" else 0))
    longest = max(r[1] + r[2] - 1 for r in reqs)
    # from just the longest request to a few more
    blocks = -(-longest // config[0]) + draw(st.integers(0, 10))
    return config, admission, blocks, reqs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads())
def test_every_step_is_vllm_s(workload) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    config, admission, blocks, reqs = workload
    block, tokens, seqs, caching, threshold = config
    theirs = vllm_scheduler(config, admission, blocks)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(block, sha256)
    ours = make_policy("vllm-v1", blocks * block, 2048, {
        "block_size": block, "max_num_batched_tokens": tokens, "max_batch_size": seqs,
        "enable_prefix_caching": caching, "long_prefill_token_threshold": threshold, "admission": admission})
    assert isinstance(ours, VLLMV1)
    requests: dict[str, Request] = {}
    counted = [0, 0, 0, 0]  # vLLM's prefix-cache stats: queries, hits, preempted queries, preempted hits
    finished = step = 0
    while finished < len(reqs):
        for i, (at, prompt, output, group, shared, priority) in enumerate(reqs):
            if at == step:
                r = Request(str(i), token_ids(i, prompt, group, shared), SamplingParams(max_tokens=output,
                            ignore_eos=True), None, arrival_time=float(at), block_hasher=hasher,
                            priority=-priority)  # vLLM runs the lowest value first, simctl the highest
                theirs.add_request(r)
                requests[r.request_id] = r
                ours.add(Seq(i, float(at), prompt, output, priority, prefix_group=group,
                             prefix_tokens=shared))
        out = theirs.schedule()
        counted = with_prefix_stats(counted, theirs)
        if not out.num_scheduled_tokens and out.preempted_req_ids:
            # every running request preempted or passed over (priority): vLLM's step runs nothing and its next
            # one, at once, schedules; vllm-v1 makes both one call
            theirs.update_from_output(out, ModelRunnerOutput(req_ids=[], req_id_to_index={},
                                                             sampled_token_ids=[]))
            out = theirs.schedule()
            counted = with_prefix_stats(counted, theirs)
        plan = ours.schedule()
        assert {int(k): q for k, q in out.num_scheduled_tokens.items()} == (
            {s.id: q for s, q in zip(plan.seqs, plan.num_new)} if plan else {}), f"step {step}"
        ids = list(out.num_scheduled_tokens)  # a request that reached its last known token samples one
        sampled = [[2_000_000 + len(requests[k].output_token_ids)]
                   if requests[k].num_computed_tokens >= requests[k].num_tokens else [] for k in ids]
        theirs.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={k: j for j, k in
                                                                                       enumerate(ids)},
                                                         sampled_token_ids=sampled))
        for s, q in zip(plan.seqs if plan else [], plan.num_new if plan else []):
            if s.advance(q) and s.generated == s.output_tokens:
                ours.finish(s)
                finished += 1
        step += 1
    if caching:
        assert counted == [ours.queries, ours.hits, ours.preempted_queries, ours.preempted_hits]
