"""A roofline cost model from published specs: what one iteration's `BatchPlan` costs on a GPU.

Per iteration (per GPU of a tensor-parallel group; all GPUs of the group run in lock step):

- Linear layers (QKV, O, MLP): FLOPs = 2 x params/tp x T_eff, weights/tp read once.
  t = sqrt(t_compute^2 + t_memory^2), t_compute = FLOPs / (peak x mfu), t_memory = bytes / (bw x mbu).
  The sqrt blend is the soft knee real GEMMs show: design.md reads off a published per-operator profile of
  Llama-2-7B's linears on an A100 that max(t_c, t_m) is up to ~25% low near T = 128 while the sqrt blend with
  mfu 0.70 / mbu 0.75 stays within ~5% from T = 1 to 4096.
- Mixture of experts (`catalogue.moe`): a sparse layer's MLP is its router (hidden x E, replicated over tp),
  its shared experts and its routed experts. FLOPs count the router, the shared experts and the k experts of
  every token (the active parameters); the weights read are the router's, the shared experts' and those of the
  distinct experts the iteration's T tokens route to, E (1 - (1 - k/E)^T) expected under uniform routing
  (`routing_skew` > 0: fewer, `catalogue.moe`): one blend as above. So a one-token decode prices as a dense
  model of the active parameters plus the router, and a large batch reads every expert. Tile rounding stays on
  T (the experts' grouped GEMMs split T x k rows among the experts: not modelled), all experts' weights are
  resident (memory), and the router's softmax and top-k are not priced (elementwise, as norms are not).
  Expert parallelism (`ep` = tp: vLLM's --enable-expert-parallel without data parallelism): each GPU holds
  E / ep whole experts, and the step waits for the busiest GPU's passes and reads (`moe.busiest_gpu`); the
  communication is TP's (hidden states are on every GPU after attention; the all-reduce sums the experts').
- Each GEMM also pays a fixed time (`gemm_latency_s`, 4 per layer (a sparse layer's 5, 7 with shared
  experts) and the LM head's: kernel ramp-up and tail), which the GPU's catalogue entry holds where measured
  (bench/roofline_vs_measured.py).
- Tile quantization: a GEMM over T rows runs ceil(T / tile) row tiles, so above one tile T is rounded up to a
  multiple of the tile (Sarathi-Serve measured chunk 257 up to 32% slower than 256). At T <= tile the kernels
  pick smaller row tiles (or GEMV) and the layer is weight-streaming bound, so T is used as is (rounding
  T = 1 up to 128 would price a batch-1 decode ~35% too slow on an A100).
- LM head: only on the `sampled_tokens` rows (2 x vocab x hidden FLOPs per row, vocab-parallel over tp),
  its weights read once; same blend and tiling. No rows sampled (a mid-prompt chunk only): no LM head.
- Prefill / chunk attention, per segment of q new tokens on c cached ones: FLOPs = 4 x layers x heads/tp x
  head_dim x q x (c + q/2) at `attn_mfu`, reading (c + q) tokens of KV (this GPU's share), blended per
  segment like the linears. Padded rows come as segments of the padded length, so pads are paid.
- Decode attention: memory-bound: decode_kv x KV bytes per token (this GPU's share) / (bw x attn_mbu).
- Step overheads (`costs/overheads.py`): per step, per scheduled request and per sampled token on the host,
  and in eager execution a launch floor under the GPU time: t = max(GPU terms, floor) + host terms.
- Concurrent streams (`BatchPlan.streams`, Baton-PD's overlapped prefill and decode): one combined roofline:
  per kind of kernel (linears, LM head, attention) the streams' compute and memory demands add before the
  blend, each stream reads the weights, a GEMM's fixed time is paid once; host terms and launch floors add.
- TP > 1: two all-reduces per layer of T x hidden x dtype bytes, NCCL's ring: 2 (tp-1)/tp x bytes / link
  bandwidth, plus a fixed latency per all-reduce; `allreduce="vllm"`: as vLLM runs them (costs/allreduce.py).

Terms are added (no overlap between them is assumed). Defaults and where they come from:
- mfu = 0.70, mbu = 0.75, no GEMM latency: the published Llama-2-7B/A100 per-operator profile summarised in
  design.md; the catalogue's per-GPU values replace them where measured (A100, H100, A40:
  `catalogue/gpus.py`).
- attn_mfu = 0.50: FlashAttention-2 (Dao, 2023) reports its forward pass at 50-73% of A100 peak; serving
  chunks are short and causal, so the low end is taken.
- attn_mbu = mbu: decode attention streams KV like the linears stream weights (an assumption).
- overhead_s = 18.1 us per layer per step, request_s = 0.118 ms per scheduled request, sampled_token_s = 0,
  and eager's launch floor: the execution mode's defaults, fitted to vLLM served on H100s
  (`costs/overheads.py` gives the fit and what it was checked on).
- allreduce_latency_s = 10 us and the link at its peak: an ASSUMPTION (the order of a small-message NCCL
  all-reduce within a node), replaced by the catalogue's measured values, per TP degree, where it has them
  (A100, H100: `GPUSpec.allreduce`; the nearest measured degree for another).
- allreduce = "vllm": the all-reduces as vLLM (since 2024) runs them; "nccl" prices NCCL's ring throughout,
  as the 2023 engines the papers ran (no custom all-reduce) did.

The KV cache's size is the deployment's, not the roofline's (`costs/kv_capacity.py`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from simctl.catalogue.gpus import GPUSpec, get_gpu
from simctl.catalogue.models import ModelSpec, get_model
from simctl.catalogue.moe import busiest_gpu, check_routing_skew, expected_distinct_experts
from simctl.common.errors import InputError
from simctl.costs.allreduce import VLLMAllReduce, check_allreduce, ring_terms, uses_custom
from simctl.costs.base import CostModel, tiled
from simctl.costs.gpu_share import GPUShare, check_expert_parallel, check_split, gpu_share
from simctl.costs.overheads import StepOverheads
from simctl.policies.plan import BatchPlan

DEFAULT_MFU = 0.70
DEFAULT_MBU = 0.75
DEFAULT_ATTN_MFU = 0.50


def _fraction(name: str, v: float) -> float:
    if not (isinstance(v, (int, float)) and 0.0 < v <= 1.0):
        raise InputError(f"{name} must be in (0, 1], got {v!r}")
    return float(v)


class Roofline(CostModel):
    def __init__(
        self,
        model: ModelSpec | str,
        gpu: GPUSpec | str,
        tp: int = 1,
        dtype_bytes: int = 2,
        mfu: float | None = None,
        mbu: float | None = None,
        overhead_s: float | None = None,
        attn_mfu: float = DEFAULT_ATTN_MFU,
        attn_mbu: float | None = None,
        tile: int | None = None,
        allreduce_latency_s: float | None = None,
        allreduce_efficiency: float | None = None,
        request_s: float | None = None,
        sampled_token_s: float = 0.0,
        execution: str = "cuda-graph",
        gemm_latency_s: float | None = None,
        routing_skew: float = 0.0,
        ep: int = 1,
        allreduce: str = "vllm",
        weight_dtype_bytes: int | None = None,
        kv_dtype_bytes: int | None = None,
    ) -> None:
        m = get_model(model) if isinstance(model, str) else model
        g = get_gpu(gpu) if isinstance(gpu, str) else gpu
        tile = g.tile if tile is None else tile
        check_split(m, tp, dtype_bytes, tile)
        self.allreduce_latency_s, self.allreduce_efficiency = ring_terms(g, tp, allreduce_latency_s,
                                                                         allreduce_efficiency)
        self.allreduce = check_allreduce(allreduce)
        if overhead_s is not None and not overhead_s >= 0:
            raise InputError(f"overhead_s must be >= 0, got {overhead_s!r}")
        self.model, self.gpu, self.tp = m, g, tp
        self.dtype_bytes = dtype_bytes  # activations, the embedding and LM head, all-reduces
        # the linear layers' weights and the KV cache: 1 byte in FP8 (costs/kv_capacity.py), else dtype_bytes
        self.weight_dtype_bytes = dtype_bytes if weight_dtype_bytes is None else weight_dtype_bytes
        self.kv_dtype_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        # the GPU's measured efficiencies where the catalogue has them, else the defaults
        self.mfu = _fraction("mfu", mfu if mfu is not None else g.mfu or DEFAULT_MFU)
        self.mbu = _fraction("mbu", mbu if mbu is not None else g.mbu or DEFAULT_MBU)
        self.gemm_latency_s = float(gemm_latency_s if gemm_latency_s is not None else g.gemm_latency_s or 0.0)
        if not self.gemm_latency_s >= 0:
            raise InputError(f"gemm_latency_s must be >= 0, got {gemm_latency_s!r}")
        self.attn_mfu = _fraction("attn_mfu", attn_mfu)
        self.attn_mbu = self.mbu if attn_mbu is None else _fraction("attn_mbu", attn_mbu)
        d = StepOverheads.defaults(execution, m.num_layers)  # what a term not given takes
        src = "roofline defaults" if (overhead_s, request_s, sampled_token_s) == (None, None, 0) else "given"
        self.overhead_s = float(d.iteration_s if overhead_s is None else overhead_s)
        rs = d.request_s if request_s is None else request_s
        self.steps = StepOverheads(execution, self.overhead_s, rs, sampled_token_s, d.launch_floor_s, src)
        self._floor, self._host_const = d.launch_floor_s, self.steps.per_request_only
        self.tile, self.routing_skew = tile, check_routing_skew(routing_skew)
        self.ep = check_expert_parallel(ep, m, tp)
        share = gpu_share(m, tp)
        self._hold(m, g, share)
        # under EP the routed experts' FLOPs are the busiest GPU's, priced apart (`_experts`)
        active = share.active_params - (m.moe.experts_per_token * share.expert_params if self.ep > 1 else 0)
        self._rates(m, g, tp, active, share.read_params, share.gemms)

    def _hold(self, m: ModelSpec, g: GPUSpec, share: GPUShare) -> None:
        """What one GPU of the group holds (`costs.gpu_share`), in bytes where the pricing reads bytes."""
        dtype_bytes = self.weight_dtype_bytes
        self.kv_heads_per_gpu = share.kv_heads
        self.linear_params_per_gpu = share.linear_params
        self.lm_head_params_per_gpu = share.lm_head_params
        self.kv_bytes_per_token_per_gpu = 2 * m.num_layers * share.kv_heads * m.head_dim * self.kv_dtype_bytes
        # MoE: the weights of one routed expert in every sparse layer, read per distinct expert routed to
        # (under EP whole experts: this GPU's share times tp, and their FLOPs per token-expert pass)
        self._expert_m = share.expert_params * dtype_bytes / (g.mem_bandwidth * self.mbu) if m.moe else 0.0
        if self.ep > 1:
            self._expert_m *= self.tp
            self._expert_c = 2.0 * share.expert_params * self.tp / (self._linear_peak(g) * self.mfu)
        self._experts_cm: dict[int, tuple[float, float]] = {}

    def _rates(self, m: ModelSpec, g: GPUSpec, tp: int, active: float, read: float, gemms: int) -> None:
        """Each term's seconds per unit of its feature, from the shapes and the efficiencies."""
        L, h, d = m.num_layers, m.hidden_size, m.head_dim
        heads_gpu = m.num_heads // tp
        dtype_bytes = self.dtype_bytes
        flops = g.peak_flops * self.mfu
        self._bw = bw = g.mem_bandwidth * self.mbu
        # linears: t_c = _lin_c x T_eff, t_m = _lin_m (+ the routed experts' `_experts`, MoE)
        self._lin_flops = self._linear_peak(g) * self.mfu
        self._lin_c = 2.0 * active / self._lin_flops
        self._lin_m = read * self.weight_dtype_bytes / bw
        # LM head (16-bit under FP8 too: vLLM's Fp8Config quantizes LinearBase layers only): t_c = _lm_c x
        # rows_eff, t_m = _lm_m
        self._lm_c = 2.0 * self.lm_head_params_per_gpu / flops
        self._lm_m = self.lm_head_params_per_gpu * dtype_bytes / bw
        self._lin_lat = gemms * self.gemm_latency_s  # each GEMM's fixed time, every layer
        # prefill attention per segment: t_c = _pa_c x q (c + q/2), t_m = _pa_m x (c + q)
        self._pa_c = 4.0 * L * heads_gpu * d / (g.peak_flops * self.attn_mfu)
        self._pa_m = self.kv_bytes_per_token_per_gpu / (g.mem_bandwidth * self.attn_mbu)
        # decode attention: t = _dkv x decode_kv
        self._dkv = self.kv_bytes_per_token_per_gpu / (g.mem_bandwidth * self.attn_mbu)
        # all-reduce (tp > 1): t = _ar_tok x T + _ar_fixed, or as vLLM runs it (`_custom`: costs/allreduce.py)
        n_ar = 2 * L if tp > 1 else 0
        self._ar_tok = n_ar * self.allreduce_time(h * dtype_bytes, latency=False)
        self._ar_fixed = n_ar * self.allreduce_latency_s
        link = g.interconnect_bandwidth * self.allreduce_efficiency
        self._custom = (VLLMAllReduce(tp, n_ar, h * dtype_bytes, link, g.architecture == "hopper",
                                      self._ar_tok, self._ar_fixed)
                        if self.allreduce == "vllm" and uses_custom(tp, g.fully_connected) else None)

    def _linear_peak(self, g: GPUSpec) -> float:
        """FLOP/s of the linear layers' GEMMs: FP8 tensor cores for FP8 weights where the GPU has them (vLLM's
        W8A8 on Hopper and later; the 16-bit GEMMs' measured efficiency is assumed to carry over), else the
        16-bit peak (an A100 dequantizes FP8 weights into 16-bit math)."""
        return g.fp8_flops if self.weight_dtype_bytes == 1 and g.fp8_flops else g.peak_flops

    def __repr__(self) -> str:
        return (f"Roofline({self.model.name}, {self.gpu.name}, tp={self.tp}, mfu={self.mfu}, mbu={self.mbu}, "
                f"attn_mfu={self.attn_mfu}, overhead_s={self.overhead_s}, tile={self.tile}, "
                f"execution={self.steps.execution})")

    def assumptions(self) -> dict[str, Any]:
        return {"kind": "roofline", "gpu": self.gpu.name, "tp": self.tp, "mfu": self.mfu, "mbu": self.mbu,
                "gemm_latency_s": self.gemm_latency_s,
                **({"routing_skew": self.routing_skew, "ep": self.ep} if self.model.moe else {}),
                **({"allreduce": self.allreduce} if self.tp > 1 else {}),
                **({"weight_dtype_bytes": self.weight_dtype_bytes, "kv_dtype_bytes": self.kv_dtype_bytes}
                   if (self.weight_dtype_bytes, self.kv_dtype_bytes) != (self.dtype_bytes,) * 2 else {}),
                "attn_mfu": self.attn_mfu, "attn_mbu": self.attn_mbu, "tile": self.tile,
                "step_overheads": self.steps.to_json()}

    # ---- pricing ---------------------------------------------------------------------------------------
    def tiled(self, n: int) -> int:
        """Rows a GEMM over `n` rows pays for: n up to one tile, else n rounded up to the tile."""
        return tiled(n, self.tile)

    def gemm(self, params: float, rows: int) -> float:
        """Seconds of a linear layer of `params` weights (this GPU's share) over `rows` token rows: the blend
        of its compute and weight-read times (the linears and LM head are priced so, from constants cached in
        the same order of operations)."""
        c = 2.0 * params / self._lin_flops * tiled(rows, self.tile)
        m = params * self.weight_dtype_bytes / self._bw
        return math.sqrt(c * c + m * m) + self.gemm_latency_s

    def _experts(self, tokens: int) -> tuple[float, float]:
        """(compute, weight-read) seconds of the routed experts in an iteration of `tokens` tokens, beyond
        `_lin_c`'s per-token FLOPs: under TP the expected distinct experts' reads
        (`simctl.catalogue.moe.expected_distinct_experts`); under EP the busiest GPU's passes and reads."""
        cm = self._experts_cm.get(tokens)
        if cm is None:
            moe = self.model.moe
            if self.ep == 1:
                cm = (0.0, self._expert_m * expected_distinct_experts(
                    moe.experts, moe.experts_per_token, tokens, self.routing_skew))
            else:
                b = busiest_gpu(moe.experts, moe.experts_per_token, tokens, self.ep, self.routing_skew)
                cm = (self._expert_c * b.passes, self._expert_m * b.experts)
            self._experts_cm[tokens] = cm
        return cm

    def allreduce_time(self, nbytes: float, latency: bool = True) -> float:
        """Seconds of one ring all-reduce of `nbytes` over the group: 2 (tp - 1) / tp x bytes over the link at
        its measured efficiency, plus the fixed latency."""
        t = (2.0 * (self.tp - 1) / self.tp * nbytes
             / (self.gpu.interconnect_bandwidth * self.allreduce_efficiency))
        return t + self.allreduce_latency_s if latency else t

    def attention_rates(self) -> tuple[float, float, float]:
        """(s per prefill attention unit q (c + q/2) at full compute, s per prefill KV token read, s per
        decode KV token read): the roofline's attention terms before their per-segment blend."""
        return self._pa_c, self._pa_m, self._dkv

    def _fixed(self, plan: BatchPlan, terms: dict[str, float] | None = None) -> float:
        """The formula, written once: everything but decode attention (`decode_kv * _dkv`), summed in one
        fixed order so a stretch prices as stepping does. `terms`, if given, receives each term (`breakdown`);
        the hot path passes none."""
        t = self._dense(plan, terms)
        attention = 0.0
        if plan.prefill_q:
            t, attention = self._prefill_attention(plan, t)
        if terms is not None:
            terms["prefill_attention"] = attention
        return t

    def _host(self, plan: BatchPlan) -> float:
        """The host's additive step overheads (`overhead_s` is their per-step term)."""
        if self._host_const is not None:
            step, request = self._host_const
            return step + request * len(plan.seqs)
        return self.steps.of(plan)

    def _dense(self, plan: BatchPlan, terms: dict[str, float] | None = None) -> float:
        """The host overheads, the linear layers (and their all-reduces) and the LM head, in that order."""
        hc = self._host_const
        t = host = hc[0] + hc[1] * len(plan.seqs) if hc is not None else self.steps.of(plan)  # _host, inline
        linear = allreduce = lm_head = 0.0
        T, r = plan.linear_tokens, plan.sampled_tokens
        if T > 0:
            c = self._lin_c * tiled(T, self.tile)
            m = self._lin_m
            if self._expert_m:
                ec, em = self._experts(T)
                c += ec
                m += em
            linear = math.sqrt(c * c + m * m) + self._lin_lat
            t += linear
            if self._ar_tok:
                allreduce = self._ar_tok * T + self._ar_fixed if self._custom is None else self._custom.of(T)
                t += allreduce
        if r > 0:
            c = self._lm_c * tiled(r, self.tile)
            lm_head = math.sqrt(c * c + self._lm_m * self._lm_m) + self.gemm_latency_s
            t += lm_head
        if terms is not None:
            terms.update(overhead=host, linear=linear, allreduce=allreduce, lm_head=lm_head)
        return t

    def _prefill_attention(self, plan: BatchPlan, t: float, repeat: int = 0) -> tuple[float, float]:
        """`t` plus each prefill segment's attention, added one by one, and their sum; `repeat` j prices a
        stretch's repeat j, each segment j chunks further into its prompt."""
        pc, pm = self._pa_c, self._pa_m
        half = 1.0 if plan.dense_attention else 0.5  # a dense block computes the upper triangle too
        attention = 0.0
        for q, ctx in zip(plan.prefill_q, plan.prefill_c):
            ctx += repeat * q
            c = pc * q * (ctx + half * q)
            m = pm * (ctx + q)
            a = math.sqrt(c * c + m * m)
            t += a
            attention += a
        return t, attention

    def _concurrent(self, plan: BatchPlan) -> float:
        """Streams sharing the GPU (`plan.streams`): kernels of a kind run side by side, so their compute and
        memory demands add before the blend (a memory-bound decode beside a compute-bound prefill costs about
        the longer of the two, two of a kind about their sum); each stream reads the weights itself, and a
        GEMM's fixed ramp is paid once (the other stream's kernels fill it). One host prepares and launches
        every stream: its terms and eager's launch floors add."""
        lin_c = lin_m = lm_c = lm_m = att_c = att_m = allreduce = host = 0.0
        sampled = False
        for p in plan.streams:
            host += self._host(p)
            T, r = p.linear_tokens, p.sampled_tokens
            lin_c += self._lin_c * tiled(T, self.tile)
            lin_m += self._lin_m
            if self._expert_m:
                ec, em = self._experts(T)
                lin_c += ec
                lin_m += em
            if self._ar_tok:
                allreduce += self._ar_tok * T + self._ar_fixed if self._custom is None else self._custom.of(T)
            if r > 0:
                lm_c += self._lm_c * tiled(r, self.tile)
                lm_m += self._lm_m
                sampled = True
            half = 1.0 if p.dense_attention else 0.5
            for q, ctx in zip(p.prefill_q, p.prefill_c):
                att_c += self._pa_c * q * (ctx + half * q)
                att_m += self._pa_m * (ctx + q)
            att_m += p.decode_kv * self._dkv
        gpu = math.hypot(lin_c, lin_m) + self._lin_lat + allreduce + math.hypot(att_c, att_m)
        if sampled:
            gpu += math.hypot(lm_c, lm_m) + self.gemm_latency_s
        return max(gpu, len(plan.streams) * self._floor) + host

    def iteration_time(self, plan: BatchPlan) -> float:
        if plan.streams:
            return self._concurrent(plan)
        t = self._fixed(plan) + plan.decode_kv * self._dkv
        if self._floor:  # eager: the GPU terms (t minus the host's) cannot take less than the launches
            return max(t, self._host(plan) + self._floor)
        return t

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        if plan.streams:
            raise ValueError("concurrent streams are priced an iteration at a time (they never repeat)")
        if k <= 0:
            return np.empty(0)
        rows, dkv, kv0 = plan.decode_rows, self._dkv, plan.decode_kv
        if plan.prefill_q:  # a prompt's chunks: each repeat priced as its iteration, the dense terms once
            dense = self._dense(plan)
            times = np.array([self._prefill_attention(plan, dense, j)[0] + (kv0 + j * rows) * dkv
                              for j in range(k)])
            if first := self.steps.first_time(plan):  # only its first repeat schedules a request first
                times[1:] -= first
            return np.maximum(times, self._host(plan) + self._floor) if self._floor else times
        # decodes alone: only their KV term grows, by `rows` tokens a repeat
        kv = np.arange(kv0, kv0 + k * rows, rows, dtype=np.int64) if rows else np.full(k, kv0, dtype=np.int64)
        times = kv * dkv
        times += self._fixed(plan)  # fixed + kv x dkv, as iteration_time sums them
        return np.maximum(times, self._host(plan) + self._floor) if self._floor else times

    def breakdown(self, plan: BatchPlan) -> dict[str, float]:
        """The terms of `iteration_time(plan)` in seconds (for reports and tests; not on the hot path)."""
        terms: dict[str, float] = {}
        self._fixed(plan, terms)
        terms["decode_attention"] = plan.decode_kv * self._dkv
        gpu = sum(terms.values()) - terms["overhead"]
        terms["launch_floor"] = max(self._floor - gpu, 0.0)  # what the floor adds above the GPU terms
        return terms
