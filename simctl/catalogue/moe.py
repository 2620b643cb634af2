"""The mixture-of-experts MLP of a model's sparse layers, and which experts a batch of tokens routes to.

A sparse layer's MLP is a router (a hidden x E linear layer, softmax and top-k), E routed experts of which
each token goes through k, and optionally shared experts every token goes through (Qwen2-MoE). A batch of B
tokens runs the k experts of each of its tokens, so its FLOPs grow with B x k, but it reads the weights of the
union of the experts its tokens chose: a decode batch reads k experts at B = 1 and all E once B is large.

Routing skew. The expected number of distinct experts B tokens touch is sum_i (1 - (1 - p_i)^B), where p_i is
the probability that a token routes to expert i (sum_i p_i = k; tokens are routed independently of each
other). `routing_skew` s >= 0 sets p_i: experts ranked by popularity, p_i proportional to (i + 1)^-s (a Zipf
law of exponent s), capped at 1 (a token picks k distinct experts, so no expert is chosen by more than every
token) with the excess spread over the others in proportion. s = 0 is uniform routing, p_i = k / E, and the
expected count is E (1 - (1 - k / E)^B); as s grows the same k experts take every token and the count falls to
k.

Expert parallelism (`--ep`, equal to `--tp`: vLLM's --enable-expert-parallel without data parallelism): each
GPU holds E / ep whole experts and the step waits for the busiest one (`busiest_gpu`); hidden states are on
every GPU after attention, so the communication is TP's. EP then costs small batches more than TP and
converges to TP's price as the batch grows. Not modelled: data-parallel attention and its all-to-all.

A fitted cost model needs no MoE term: the union of experts depends on the token count alone, which its
linear curve is a function of, and an MoE's profile grid times the counts over which the union grows
(`profiler.workloads.expert_union_tokens`). A fit prices the routing its profiled router did on one device,
so `--routing-skew` and `--ep` are the roofline's only (`sim.run.cost_model` refuses them with a fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simctl.common.errors import InputError


@dataclass(frozen=True, slots=True)
class MoE:
    """The sparse layers' MLP of a `catalogue.models.ModelSpec` (its other layers, `dense_layers` of them,
    have the dense MLP of the model's `intermediate_size`)."""

    experts: int  # routed experts per sparse layer (E)
    experts_per_token: int  # k: routed experts each token goes through (top-k)
    expert_size: int  # intermediate size of one routed expert (same MLP kind as the model's)
    # intermediate size of the shared expert(s) every token goes through, summed; 0: none
    shared_size: int = 0
    dense_layers: int = 0  # layers with a dense MLP instead (DeepSeek's first layers, Qwen's mlp_only_layers)

    def __post_init__(self) -> None:
        for f in ("experts", "experts_per_token", "expert_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise InputError(f"moe: {f} must be a positive integer, got {v!r}")
        for f in ("shared_size", "dense_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InputError(f"moe: {f} must be an integer >= 0, got {v!r}")
        if self.experts_per_token > self.experts:
            raise InputError(f"moe: experts_per_token ({self.experts_per_token}) exceeds the {self.experts} "
                             "experts")


def check_routing_skew(skew: float) -> float:
    """The skew as a float; InputError unless it is a finite number >= 0."""
    if (isinstance(skew, bool) or not isinstance(skew, (int, float))
            or not (math.isfinite(skew) and skew >= 0)):
        raise InputError(f"--routing-skew must be a finite number >= 0 (0: uniform routing), got {skew!r}")
    return float(skew)


def routing_probabilities(experts: int, k: int, skew: float = 0.0) -> np.ndarray:
    """p_i, the probability that one token routes to expert i (most popular first; they sum to k): Zipf
    weights (i + 1)^-skew scaled to sum to k, each capped at 1 (see the module docstring)."""
    weights = np.arange(1, experts + 1, dtype=np.float64) ** -check_routing_skew(skew)
    p = np.zeros(experts)
    capped = 0  # the most popular experts come first, so the capped ones are a prefix
    while capped < experts:
        rest = weights[capped:]
        p[capped:] = (k - capped) * rest / rest.sum()
        over = int(np.count_nonzero(p[capped:] > 1.0))
        if not over:
            return p
        p[capped:capped + over] = 1.0
        capped += over
    return p


def expected_distinct_experts(experts: int, k: int, tokens: int, skew: float = 0.0) -> float:
    """Expected number of distinct experts `tokens` tokens route to: E (1 - (1 - k/E)^B) when uniform (skew
    0), sum_i (1 - (1 - p_i)^B) otherwise; 0 for no tokens."""
    if tokens <= 0:
        return 0.0
    if skew == 0:
        return experts * (1.0 - (1.0 - k / experts) ** tokens)
    p = routing_probabilities(experts, k, skew)
    return float(np.sum(1.0 - (1.0 - p) ** tokens))


@dataclass(frozen=True, slots=True)
class BusiestGPU:
    """Expert parallelism: what the busiest of `ep` GPUs does in one sparse layer, each GPU holding E / ep
    whole experts. `passes`: token-expert pairs it computes; `experts`: the distinct experts of its own it
    reads."""

    passes: float
    experts: float


EP_SAMPLES = 256  # routings drawn per token count: the standard error of the maxima is a few percent


def busiest_gpu(experts: int, k: int, tokens: int, ep: int, skew: float = 0.0) -> BusiestGPU:
    """Expected maxima over `ep` GPUs (`ep` divides `experts`) of their routed work for `tokens` tokens, by
    Monte Carlo (the maximum of dependent binomial loads has no closed form; seeded by the token count, so the
    same inputs give the same price). Experts go to GPUs round-robin by popularity (expert i on GPU i mod ep:
    the popular ones spread, as a load balancer places them); a routing draws the T x k picks from p_i / k,
    i.e. a token may pick an expert twice, which matters only when E is close to k. The mean work per GPU is
    the tensor-parallel share (T k / ep passes, distinct experts / ep), so the maxima are what expert
    parallelism adds."""
    if tokens <= 0:
        return BusiestGPU(0.0, 0.0)
    p = routing_probabilities(experts, k, skew) / k
    counts = np.random.default_rng(tokens).multinomial(tokens * k, p, size=EP_SAMPLES)
    by_gpu = counts.reshape(EP_SAMPLES, experts // ep, ep)  # [:, j, g]: expert j * ep + g, on GPU g
    passes = by_gpu.sum(axis=1).max(axis=1).mean()
    read = (by_gpu > 0).sum(axis=1).max(axis=1).mean()
    return BusiestGPU(float(passes), float(read))
