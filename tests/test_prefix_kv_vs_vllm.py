"""Sessions through vllm-v1 and through the installed vLLM's own scheduler, step by step (as
tests/test_vllm_v1_vs_vllm.py does for shared prefixes): each turn's prompt is its session's tokens so far,
the earlier turns' prompts and the tokens vLLM generated for them, plus new ones, sent a few steps after the
turn before it finished. Every step schedules the same tokens and the prefix-cache counters agree, so the twin
hashes and reuses a turn's answer blocks, evicts and re-hits as vLLM does, with KV small enough to evict.
Skipped where vLLM is not installed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytest.importorskip("vllm")

from test_vllm_v1_vs_vllm import CONFIGS, vllm_scheduler, with_prefix_stats

from simctl.policies.registry import make_policy
from simctl.policies.seq import Seq

pytestmark = pytest.mark.vllm
Turn = tuple[int, int, int, int]  # (session, steps after the previous turn finished or from 0, new, output)
Row = tuple[int, tuple[int, ...], int, int]  # (arrival step, Mooncake ids, prompt, output)


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


class Both:
    """vllm-v1 and vLLM's scheduler side by side: requests added to both, steps compared, counters kept."""

    def __init__(self, config: tuple[int, ...], blocks: int) -> None:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        block, tokens, seqs, caching, threshold = config
        self.theirs = vllm_scheduler(config, "fcfs", blocks)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(block, sha256)
        self.ours = make_policy("vllm-v1", blocks * block, 2048, {
            "block_size": block, "max_num_batched_tokens": tokens, "max_batch_size": seqs,
            "enable_prefix_caching": caching, "long_prefill_token_threshold": threshold})
        self.requests: dict[str, Any] = {}
        self.counted = [0, 0, 0, 0]  # vLLM's queries, hits, preempted queries, preempted hits

    def add(self, prompt: list[int], output: int, seq: Seq) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        assert seq.prompt_tokens == len(prompt)
        r = Request(str(seq.id), prompt, SamplingParams(max_tokens=output, ignore_eos=True), None,
                    arrival_time=seq.arrival_s, block_hasher=self.hasher)
        self.theirs.add_request(r)
        self.requests[r.request_id] = r
        self.ours.add(seq)

    def _schedule(self) -> Any:
        out = self.theirs.schedule()
        self.counted = with_prefix_stats(self.counted, self.theirs)
        return out

    def step(self, step: int) -> list[Seq]:
        """One step of both, compared; the requests that finished."""
        from vllm.v1.outputs import ModelRunnerOutput

        out = self._schedule()
        if not out.num_scheduled_tokens and out.preempted_req_ids:  # as in test_vllm_v1_vs_vllm: one call
            self.theirs.update_from_output(out, ModelRunnerOutput(req_ids=[], req_id_to_index={},
                                                                  sampled_token_ids=[]))
            out = self._schedule()
        plan = self.ours.schedule()
        assert {int(k): q for k, q in out.num_scheduled_tokens.items()} == (
            {s.id: q for s, q in zip(plan.seqs, plan.num_new)} if plan else {}), f"step {step}"
        ids = list(out.num_scheduled_tokens)
        reqs = self.requests
        sampled = [[2_000_000 + len(reqs[k].output_token_ids)]
                   if reqs[k].num_computed_tokens >= reqs[k].num_tokens else [] for k in ids]
        self.theirs.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={k: j for j, k in enumerate(ids)}, sampled_token_ids=sampled))
        done = []
        for s, q in zip(plan.seqs if plan else [], plan.num_new if plan else []):
            if s.advance(q) and s.generated == s.output_tokens:
                self.ours.finish(s)
                done.append(s)
        return done

    def check_counters(self) -> None:
        o = self.ours
        assert self.counted == [o.queries, o.hits, o.preempted_queries, o.preempted_hits]
        event(f"hits: {self.counted[1] > 0}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads())
def test_session_turns_hit_as_in_vllm(workload) -> None:
    config, blocks, turns = workload
    both = Both(config, blocks)
    context: dict[int, list[int]] = {}  # session -> its tokens so far (prompts and vLLM's answers)
    ready: dict[int, int] = {}  # turn -> the step it is sent
    for i, (session, start, _, _) in enumerate(turns):
        if session not in context:
            context[session], ready[i] = [], start
    finished = step = 0
    while finished < len(turns):
        for i in [i for i, at in ready.items() if at == step]:
            session, _, new, output = turns[i]
            prompt = context[session] + [1_000_000 + 10_000 * i + j for j in range(new)]
            both.add(prompt, output, Seq(i, float(step), len(prompt), output, session=session))
            del ready[i]
        for s in both.step(step):
            finished += 1
            session, r = turns[s.id][0], both.requests[str(s.id)]
            context[session] = list(r.prompt_token_ids) + list(r.output_token_ids)
            later = [j for j in range(s.id + 1, len(turns)) if turns[j][0] == session]
            if later:
                ready[later[0]] = step + 1 + turns[later[0]][1]
        step += 1
    both.check_counters()


@st.composite
def mooncake_rows(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int, list[Row]]:
    """Requests with Mooncake-style ids: each takes the first k full ids of an earlier one and new ids after
    them (so equal ids name equal prefixes, as Mooncake's chained ids do), its prompt within what they cover;
    a partial last block has a new id (it is its own content)."""
    config = draw(st.sampled_from([c for c in CONFIGS if c[3]]))
    hash_block = draw(st.sampled_from([3, 4, 8]))
    rows: list[Row] = []
    fresh, step = 0, 0
    for _ in range(draw(st.integers(1, 8))):
        step += draw(st.sampled_from([0, 1, 3, 10]))
        shared: tuple[int, ...] = ()
        if rows and draw(st.booleans()):
            _, ids, prompt, _ = draw(st.sampled_from(rows))
            shared = ids[:draw(st.integers(0, prompt // hash_block))]
        new = draw(st.integers(0 if shared else 1, 6))
        ids = shared + tuple(range(fresh, fresh + new))
        fresh += new
        count = len(ids)
        prompt = draw(st.integers((count - 1) * hash_block + 1, count * hash_block)) if new else \
            count * hash_block
        rows.append((step, ids, prompt, draw(st.integers(1, 20))))
    longest = max(p + o for _, _, p, o in rows)
    return config, -(-longest // config[0]) + draw(st.integers(0, 12)), hash_block, rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=mooncake_rows())
def test_mooncake_ids_hit_as_in_vllm(workload) -> None:
    """vLLM's side gets each id's tokens as `vllm bench serve --dataset-name timed_trace` makes them: the same
    tokens wherever the id appears (a partial last block its own)."""
    config, blocks, hash_block, rows = workload
    both = Both(config, blocks)
    finished = step = 0
    while finished < len(rows):
        for i, (at, ids, prompt, output) in enumerate(rows):
            if at == step:
                tokens = [3_000_000 + 1_000 * h + t for h in ids for t in range(hash_block)][:prompt]
                partial = prompt % hash_block
                if partial:  # a partial last block: its own tokens
                    tokens[-partial:] = [4_000_000 + 1_000 * i + t for t in range(partial)]
                both.add(tokens, output, Seq(i, float(step), prompt, output, hash_ids=ids,
                                             hash_block=hash_block))
        finished += len(both.step(step))
        step += 1
    both.check_counters()
