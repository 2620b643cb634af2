"""Sessions through vllm-v1 and through the installed vLLM's own scheduler, step by step (as
tests/test_vllm_v1_vs_vllm.py does for shared prefixes): each turn's prompt is its session's tokens so far,
the earlier turns' prompts and the tokens vLLM generated for them, plus new ones, sent a few steps after the
turn before it finished. Every step schedules the same tokens and the prefix-cache counters agree, so the twin
hashes and reuses a turn's answer blocks, evicts and re-hits as vLLM does, with KV small enough to evict.
Skipped where vLLM is not installed."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytest.importorskip("vllm")

from test_vllm_v1_vs_vllm import CONFIGS, vllm_scheduler, with_prefix_stats

from simctl.policies.registry import make_policy
from simctl.policies.seq import Seq

pytestmark = pytest.mark.vllm
Turn = tuple[int, int, int, int]  # (session, steps after the previous turn finished or from 0, new, output)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[tuple[int, ...], int, list[Turn]]:
    config = draw(st.sampled_from([c for c in CONFIGS if c[3]]))  # caching on
    turns: list[Turn] = []
    for session in range(draw(st.integers(1, 4))):
        for k in range(draw(st.integers(1, 3))):
            turns.append((session, draw(st.integers(0, 6) if k == 0 else st.sampled_from([0, 1, 3])),
                          draw(st.integers(1, 30)), draw(st.integers(1, 20))))
    longest = max(sum(n + o for s, _, n, o in turns if s == session) for session, *_ in turns)
    blocks = -(-longest // config[0]) + draw(st.integers(0, 12))  # from the longest turn alone to a few more
    return config, blocks, turns


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads())
def test_session_turns_hit_as_in_vllm(workload) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    config, blocks, turns = workload
    block, tokens, seqs, caching, threshold = config
    theirs = vllm_scheduler(config, "fcfs", blocks)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(block, sha256)
    ours = make_policy("vllm-v1", blocks * block, 2048, {
        "block_size": block, "max_num_batched_tokens": tokens, "max_batch_size": seqs,
        "enable_prefix_caching": caching, "long_prefill_token_threshold": threshold})
    context: dict[int, list[int]] = {}  # session -> its tokens so far (prompts and vLLM's answers)
    ready: dict[int, int] = {}  # turn -> the step it is sent
    for i, (session, start, _, _) in enumerate(turns):
        if session not in context:
            context[session], ready[i] = [], start
    requests: dict[str, Request] = {}
    counted = [0, 0, 0, 0]
    finished = step = 0
    while finished < len(turns):
        for i in [i for i, at in ready.items() if at == step]:
            session, _, new, output = turns[i]
            prompt = context[session] + [1_000_000 + 10_000 * i + j for j in range(new)]
            r = Request(str(i), prompt, SamplingParams(max_tokens=output, ignore_eos=True), None,
                        arrival_time=float(step), block_hasher=hasher)
            theirs.add_request(r)
            requests[r.request_id] = r
            ours.add(Seq(i, float(step), len(prompt), output, session=session))
            del ready[i]
        out = theirs.schedule()
        counted = with_prefix_stats(counted, theirs)
        if not out.num_scheduled_tokens and out.preempted_req_ids:  # as in test_vllm_v1_vs_vllm: one call
            theirs.update_from_output(out, ModelRunnerOutput(req_ids=[], req_id_to_index={},
                                                             sampled_token_ids=[]))
            out = theirs.schedule()
            counted = with_prefix_stats(counted, theirs)
        plan = ours.schedule()
        assert {int(k): q for k, q in out.num_scheduled_tokens.items()} == (
            {s.id: q for s, q in zip(plan.seqs, plan.num_new)} if plan else {}), f"step {step}"
        ids = list(out.num_scheduled_tokens)
        sampled = [[2_000_000 + len(requests[k].output_token_ids)]
                   if requests[k].num_computed_tokens >= requests[k].num_tokens else [] for k in ids]
        theirs.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={k: j for j, k in
                                                                                       enumerate(ids)},
                                                         sampled_token_ids=sampled))
        for s, q in zip(plan.seqs if plan else [], plan.num_new if plan else []):
            if s.advance(q) and s.generated == s.output_tokens:
                ours.finish(s)
                finished += 1
                session, r = turns[s.id][0], requests[str(s.id)]
                context[session] = list(r.prompt_token_ids) + list(r.output_token_ids)
                later = [j for j in range(s.id + 1, len(turns)) if turns[j][0] == session]
                if later:
                    ready[later[0]] = step + 1 + turns[later[0]][1]
        step += 1
    assert counted == [ours.queries, ours.hits, ours.preempted_queries, ours.preempted_hits]
    event(f"answer blocks hit: {counted[1] > 0}")
