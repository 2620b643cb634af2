"""Prepacking's experiment (Zhao et al., 2024, Sections 4.3-4.7): prefill time of full batching,
length-ordered batching and prepacking on batches of prompts drawn from a dataset's length profile.

The policies decide everything: a pool of prompts (one output token each, in random arrival order) is
served by the policy itself (`hf-padded`, `length-ordered`, `prepack`, or any other) until it is empty, and
each prefill plan it makes is priced by the cost model. Random arrival order makes `hf-padded` and `prepack`
batch random samples, as the paper does; `length-ordered` sorts what waits, as its oracle does.

Length profiles: the paper's Table 2 gives each dataset's min / mean / max prompt length over a 1,000-prompt
subsample. A shifted log-normal min + exp(mu + sigma Z), clipped to [min, max], stands in for each: its
99.9th percentile (the expected maximum of 1,000 draws) is put at max and its mean at the table's mean,
which fixes sigma in closed form (`LognormalLengths.lognormal`). `simctl prefill-bench --json` reports the
sampled min / mean / max next to the table's.

Peak memory during a prefill (an estimate, not a measurement): weights, the KV of every computed row
(rows x L tokens: pads and bins included), one layer's activations for those tokens, and one layer's dense
attention scores (rows x heads x L x L: a masked SDPA that is not fused materialises them; none for causal or
varlen kernels).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from simctl.catalogue.models import ModelSpec
from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.policies.plan import BatchPlan
from simctl.policies.registry import make_policy
from simctl.policies.seq import Seq
from simctl.serving.bookkeeping import apply_iteration
from simctl.serving.records import Records

Z999 = 3.090232306167813  # standard normal 99.9th percentile


@dataclass(frozen=True)
class LognormalLengths:
    name: str
    min: int
    mean: float
    max: int
    source: str

    def lognormal(self) -> tuple[float, float]:
        """(mu, sigma) with min + exp(mu + sigma Z): P99.9 = max and mean = mean (clipping ignored, 0.1%)."""
        ratio = math.log((self.max - self.min) / (self.mean - self.min))
        sigma = Z999 - math.sqrt(Z999 * Z999 - 2 * ratio)
        return math.log(self.max - self.min) - sigma * Z999, sigma

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        mu, sigma = self.lognormal()
        x = self.min + np.exp(mu + sigma * rng.standard_normal(n))
        return np.clip(np.rint(x), self.min, self.max).astype(np.int64)


# Prepacking, Appendix Table 2 (1,000-prompt subsamples): min / mean / max prompt length
PROFILES = {p.name: p for p in [
    LognormalLengths("mmlu", 4, 64, 1102, "MMLU"),
    LognormalLengths("samsum", 21, 169, 942, "SamSum"),
    LognormalLengths("alpaca", 43, 126, 527, "Alpaca"),
    LognormalLengths("wikitext256", 1, 73, 256, "Wikitext, max length 256"),
    LognormalLengths("wikitext512", 6, 120, 512, "Wikitext, max length 512"),
    LognormalLengths("hh-rlhf", 22, 247, 1620, "Anthropic HH RLHF"),
]}


def prompt_lengths(spec: str, n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """`n` prompt lengths from a named profile or a file of one integer per line (sampled with
    replacement)."""
    rng = np.random.default_rng(seed)
    if spec in PROFILES:
        lengths = PROFILES[spec].sample(n, rng)
    else:
        try:
            with open(spec) as f:
                values = [int(v) for v in f.read().split()]
        except (OSError, ValueError) as e:
            raise InputError(f"--lengths {spec!r}: neither a profile ({', '.join(PROFILES)}) nor a file of "
                             f"integers ({e})") from None
        if not values or min(values) < 1:
            raise InputError(f"--lengths {spec!r}: needs at least one length, every length >= 1")
        lengths = rng.choice(np.asarray(values, dtype=np.int64), n)
    return np.maximum(np.rint(lengths * scale), 1).astype(np.int64)


def serve_prefills(policy_name: str, lengths: np.ndarray, batch_size: int) -> Iterator[BatchPlan]:
    """The prefill plans `policy_name` makes serving these prompts (arrived at once, in this order, one
    output token each, KV for all of them), each yielded before it is applied (a real engine may run it)."""
    longest = int(lengths.max()) + 1
    policy = make_policy(policy_name, longest * len(lengths) + 16, longest, {"max_batch_size": batch_size})
    for i, n in enumerate(lengths.tolist()):
        policy.add(Seq(i, 0.0, n, 1))
    records = Records()
    while not policy.idle:
        plan = policy.schedule()
        if plan is None or not plan.prefill_q or plan.num_new != [s.prompt_tokens for s in plan.seqs]:
            raise InputError(
                f"{policy_name}: not a policy that prefills whole prompts in batches of their own")
        yield plan
        apply_iteration(policy, records, plan, 0.0, 0.0)


def prefill_plans(policy_name: str, lengths: np.ndarray, batch_size: int) -> list[BatchPlan]:
    return list(serve_prefills(policy_name, lengths, batch_size))


def peak_bytes(plan: BatchPlan, model: ModelSpec, dtype_bytes: int = 2) -> int:
    """Peak memory of a prefill plan (module docstring): weights + KV and activations of its computed rows +
    one layer's attention scores when they are dense-masked (causal and varlen kernels are fused)."""
    length = plan.row_len or max(plan.prefill_q)
    rows = plan.linear_tokens // length
    act = (4 * model.hidden_size + 2 * model.intermediate_size) * dtype_bytes  # one layer, per token
    scores = rows * model.num_heads * length * length * dtype_bytes if plan.dense_attention else 0
    return (model.weight_bytes(dtype_bytes)
            + plan.linear_tokens * (model.kv_bytes_per_token(dtype_bytes) + act)
            + scores)


@dataclass(frozen=True)
class BenchPoint:
    policy: str
    batch_size: int
    batches: int
    prefill_s: float  # mean over the batches
    per_prompt_s: float
    batch_reduction: float  # n / k: prompts per computed row (1 for padded batches)
    max_abs_deviation: float  # mean over batches of (longest - mean length)
    peak_gib: float  # the largest batch's estimate


def bench(policy_name: str, lengths: np.ndarray, batch_size: int, cost: CostModel, model: ModelSpec
          ) -> tuple[BenchPoint, list[float]]:
    """The point, and each prefill's price in the order the policy ran them."""
    plans = prefill_plans(policy_name, lengths, batch_size)
    times = [cost.iteration_time(p) for p in plans]
    n = [len(p.seqs) for p in plans]
    mad = [max(p.num_new) - sum(p.num_new) / len(p.num_new) for p in plans]
    point = BenchPoint(policy_name, batch_size, len(plans), float(np.mean(times)), sum(times) / sum(n),
                       sum(n) / sum(len(p.prefill_q) for p in plans), float(np.mean(mad)),
                       max(peak_bytes(p, model) for p in plans) / 2**30)
    return point, times


def largest_batch(policy_name: str, lengths: np.ndarray, model: ModelSpec, memory_bytes: float) -> int:
    """The largest batch size (up to the pool) whose every prefill fits in `memory_bytes` (0: none does)."""
    fits = lambda b: max(peak_bytes(p, model) for p in prefill_plans(policy_name, lengths, b)) <= memory_bytes
    lo, hi = 0, len(lengths)
    if fits(hi):
        return hi
    while hi - lo > 1:  # lo fits (or is 0), hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
