"""The contract between a scheduling policy and whatever executes its plans (simulator or real engine).

The replica loop (`simctl.serving.loop`), the same for the simulator, the real engine and the replay:

    policy.add(seq)                      # for every arrival, in arrival order
    plan = policy.schedule()             # None: nothing can run until something arrives
    extra = policy.extend(plan, limit)   # optional: repeat it `extra` more times
                                         # (decode-only, or `chunk_repeats`)
    ... execute; advance each seq by its new tokens (Seq.advance) ...
    policy.finish(seq)                   # for every sequence that sampled its last output token
    policy.release(seq)                  # a sequence leaves unfinished (hand-off to another instance)

A policy owns its queues and its KV manager; it never reads a clock and never touches SimPy or torch.

A policy describes itself: its `name`, a one-line `summary`, its `Settings` (a frozen dataclass whose fields
are its options, with defaults, help and bounds: the CLI renders them as options and `summary.json` records
them), the KV manager it assumes (`reserves_kv`) and what an executor must support (`padded_batches`). The
registry, the run/real/validate code and the CLI read these; adding a policy is one file here plus its tests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from simctl.common.checks import is_int
from simctl.common.errors import InputError
from simctl.common.option_fields import option_field
from simctl.policies.admission import ADMISSION_ORDERS, FCFS, ArrivalOrder, WaitingQueue, waiting_queue
from simctl.policies.kv import KVManager, PagedKV, ReservedKV
from simctl.policies.plan import BatchPlan
from simctl.policies.seq import Phase, Seq

# no setting counts past a million (requests, tokens, blocks, percents): a larger one is a typo
MAX_SETTING = 1 << 20


# orca's and sarathi's shared option: one help text, as the command line shows one for both
MAX_PREFILLS_HELP = ("most prompts an iteration prefills, whole or a chunk (0: as many as fit; 1: the "
                     "SARATHI paper's settings, its decode-maximal batching and its best-case Orca)")


def option(default: int | None, help: str, minimum: int = 1, maximum: int = MAX_SETTING) -> Any:
    """A policy setting: an integer option with its default, its `--help` text and its bounds."""
    return option_field(default, help, min=minimum, max=maximum)


def choice(default: str, help: str, choices: tuple[str, ...]) -> Any:
    """A policy setting that names one of `choices`."""
    return option_field(default, help, choices=choices)


def admission_setting(default: str = FCFS) -> Any:
    """The admission order setting (`simctl.policies.admission`), which every policy takes."""
    return choice(default, "admission order of the waiting requests: fcfs (arrival), shortest (fewest prompt "
                  "tokens first) or priority (highest request priority first)", ADMISSION_ORDERS)


@dataclass(frozen=True)
class Settings:
    """The options every policy has; a policy subclasses this to add its own or change a default."""

    max_batch_size: int = option(128, "most requests in a batch")
    admission: str = admission_setting()

    def validate(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            name = f"--{f.name.replace('_', '-')}"
            if "choices" in f.metadata:
                if v not in f.metadata["choices"]:
                    raise InputError(f"{name} must be one of {', '.join(f.metadata['choices'])}, got {v!r}")
                continue
            if v is None and f.default is None:
                continue  # "not set": the policy derives it (see its Settings)
            lo, hi = f.metadata["min"], f.metadata["max"]
            if not is_int(v) or not lo <= v <= hi:
                raise InputError(f"{name} must be an integer from {lo} to {hi}, got {v!r}")

    def as_dict(self) -> dict[str, Any]:
        """Every setting, given or default, as a summary records it; arrival-order admission goes unsaid, as
        in the summaries written before admission order was a setting."""
        out = asdict(self)
        if out["admission"] == FCFS:
            del out["admission"]
        return out


class Policy(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `simctl list`
    Settings: ClassVar[type[Settings]] = Settings
    reserves_kv: ClassVar[bool] = False  # KV for the max sequence length is set aside at admission
    padded_batches: ClassVar[bool] = False  # runs padded B x L batches that keep finished rows computed
    widening_kv: ClassVar[bool] = False  # a batch KV tensor whose rows widen past any one request (Baton)

    def __init__(self, kv: KVManager, **options: Any) -> None:
        self.settings = self.Settings(**options)
        self.settings.validate()
        self.kv = kv
        self.max_batch_size = self.settings.max_batch_size
        self.waiting: WaitingQueue = waiting_queue(self.admission_order)
        self.running: list[Seq] = []  # admitted, oldest first
        self.arrived_with_kv = ArrivalOrder()  # prefilled elsewhere: admitted straight as decodes, in order
        self.preempted = False  # whether the last schedule() preempted

    @property
    def admission_order(self) -> str:
        """The order of the waiting queue: the `admission` setting, unless the policy's algorithm fixes it."""
        return self.settings.admission

    # --- what the registry builds a policy from ---

    @classmethod
    def kv_manager(cls, capacity_tokens: int, max_seq_len: int) -> KVManager:
        """The KV manager this policy assumes: paged blocks, or the max sequence length reserved per
        request."""
        return ReservedKV(capacity_tokens, max_seq_len) if cls.reserves_kv else PagedKV(capacity_tokens)

    @classmethod
    def build(cls, kv_capacity_tokens: int, max_seq_len: int, options: Mapping[str, Any],
              gpu: str | None = None) -> Policy:
        """The policy on a deployment: `max_seq_len` is its max model length (what a reserving policy sets
        aside per request); `options` are settings the user gave (None: the default); `gpu` the device's
        catalogue name (`catalogue.gpus`, None: not known), for a policy whose defaults depend on it."""
        given = {k: v for k, v in options.items() if v is not None}
        return cls(cls.kv_manager(kv_capacity_tokens, max_seq_len), **given)

    @classmethod
    def memory_profile(cls, options: Mapping[str, Any], gpu: str) -> tuple[int, int] | None:
        """(tokens per step, KV block size) of vLLM's memory profile, for a policy that is vLLM's twin: its KV
        cache is then sized as vLLM sizes it (`costs.kv_capacity`); None: simctl's reserve."""
        return None

    @classmethod
    def max_admissible_tokens(cls, kv_capacity_tokens: int, max_seq_len: int,
                              options: Mapping[str, Any] | None = None) -> int:
        """The longest request (prompt + output) this policy, with the settings `options` given (None: its
        defaults), can ever run on this KV capacity."""
        if cls.reserves_kv:
            return max_seq_len if max_seq_len <= kv_capacity_tokens else 0
        return PagedKV(kv_capacity_tokens).max_request_tokens

    @property
    def concurrent_streams(self) -> bool:
        """Whether its plans may run work on two streams at once (`BatchPlan.streams`)."""
        return False

    def prefilling_apart(self) -> list[Seq]:
        """Sequences being prefilled outside the batch's rows, their KV held apart until they join it (a
        policy with `concurrent_streams`: beside the batch on a second stream, or alone once it ran out)."""
        return []

    @property
    def shares_prefixes(self) -> bool:
        """Whether a request may start from KV another request computed (prefix caching)."""
        return False

    def stats(self) -> dict[str, int]:
        """What the policy counted during the run, additive over replicas (most policies: nothing)."""
        return {}

    @classmethod
    def summarise_stats(cls, totals: dict[str, int]) -> dict[str, Any]:
        """The summary's entries for `stats()` summed over a run's replicas (e.g. rates derived from them)."""
        return totals

    def add(self, seq: Seq) -> None:
        """A new request; one whose prompt was prefilled elsewhere (a disaggregated prefill instance, a KV
        embedding) arrives with its KV cached (`computed` = its prompt, first token sampled) and only
        decodes."""
        if seq.in_prefill:
            self.waiting.add(seq)
        else:
            self.arrived_with_kv.append(seq)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and not self.arrived_with_kv

    @abstractmethod
    def schedule(self) -> BatchPlan | None:
        """Decide the next iteration, allocating the KV it needs."""

    def extend(self, plan: BatchPlan, limit: int) -> int:
        """Allow a decode-only plan, or one `chunk_repeats` allows, to repeat up to `limit` more times,
        allocating KV for its decodes.

        Valid only while nothing arrives or finishes: the policy would then schedule the very same batch
        again (its waiting queue stays blocked and KV only gets scarcer). Returns how many extra repeats the
        KV allows; the default suits policies whose only repeat-breaking events are KV running out and a
        queue that a preemption may have moved (`_queue_may_move`).
        """
        return 0 if self._queue_may_move() else max(
            self.kv.grow_common(self._repeating(plan), limit + 1) - 1, 0)

    def repeats_allowed(self, plan: BatchPlan, limit: int) -> int:
        """What `extend(plan, limit)` would return now, allocating nothing: the loop asks before a stretch it
        may cut short (a cluster's replica), and extends by the repeats that ran."""
        if self._queue_may_move():
            return 0
        return max(self.kv.max_common_growth(self._repeating(plan), limit + 1) - 1, 0)

    def _queue_may_move(self) -> bool:
        """Whether the next step may admit the head of a queue, so that the plan would not repeat. Only after
        a step that preempted: otherwise the head was refused on the same state (or the policy admits nobody
        now) and stays refused while decodes only grow. A preemption frees blocks the head may fit in: the
        victim's own (vllm-v1: its prefix hits can take fewer than it freed) or, in an order other than
        arrival, those of a victim queued behind the head."""
        if not self.preempted:  # the common case, asked every stretch
            return False
        queue = self.arrived_with_kv or self.waiting
        return bool(queue) and len(self.running) < self.max_batch_size and self.kv.can_admit(queue.head())

    @staticmethod
    def _repeating(plan: BatchPlan) -> list[Seq]:
        """The sequences whose KV a repeat of the plan grows: its decodes."""
        return plan.seqs if plan.decode_only else plan.seqs[:plan.decode_tokens]

    def chunk_repeats(self, plan: BatchPlan) -> int:
        """How many more times the policy would schedule this plan with prefill chunks again, each chunk one
        chunk further into its prompt, if nothing finished, KV sufficed and no request arrived but fresh ones,
        which must only wait meanwhile (0: it would not)."""
        return 0

    def finish(self, seq: Seq) -> None:
        """The sequence sampled its last token: release it."""
        seq.phase = Phase.FINISHED
        self.running.remove(seq)
        self.kv.free(seq)

    def release(self, seq: Seq) -> None:
        """The sequence leaves this policy unfinished (handed to another instance, or its KV moved off the
        device): its KV is freed and it is forgotten here; its progress (`computed`, `generated`) stays with
        it."""
        if seq in self.running:
            self.running.remove(seq)
            self.kv.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        else:
            self.arrived_with_kv.remove(seq)
        seq.phase = Phase.WAITING

    # --- helpers shared by the iteration-level policies ---

    def _admit(self, seq: Seq) -> None:
        """Admit `seq`, the head of the queue or any other waiting sequence (a policy that picks)."""
        self.waiting.take(seq)
        self._run(seq)

    def _run(self, seq: Seq) -> None:
        """A sequence taken off a queue gets its KV and joins the running ones."""
        self.kv.admit(seq)
        seq.phase = Phase.RUNNING
        self.running.append(seq)

    def _admit_arrived_with_kv(self) -> None:
        """Admit, in arrival order, the sequences that came with their KV, while the batch and KV have room:
        they join the running decodes without a prefill."""
        queue = self.arrived_with_kv
        while queue and len(self.running) < self.max_batch_size and self.kv.can_admit(queue[0]):
            self._run(queue.popleft())

    def _preempt(self, victim: Seq) -> None:
        """Preemption by recompute (vLLM's default for single-sequence requests): drop the KV, requeue (first,
        in arrival order)."""
        self.running.remove(victim)
        self.kv.free(victim)
        victim.reset_for_recompute()
        self.waiting.requeue(victim)

    def _grow_decodes(self) -> list[Seq]:
        """Reserve one more KV slot for every running decode, oldest first; when memory runs out, preempt the
        newest running request (possibly the one asking) until the slot fits. Returns the decodes to run."""
        if self.arrived_with_kv:
            self._admit_arrived_with_kv()
        decodes = [s for s in self.running if s.computed >= s.prefill_end]
        self.preempted = False
        if self.kv.grow_each(decodes):  # the common case: memory suffices, nobody is preempted
            return decodes
        decodes = []
        queue = list(self.running)
        i = 0
        while i < len(queue):
            s = queue[i]
            if s.in_prefill:
                i += 1
                continue
            while not self.kv.can_grow(s):
                victim = queue.pop()
                self._preempt(victim)
                self.preempted = True
                if victim is s:
                    break
            else:
                self.kv.grow(s)
                decodes.append(s)
                i += 1
        return decodes


def run_stats(policies: Sequence[Policy]) -> dict[str, Any]:
    """What the policies of one run (one per replica, all of a kind) counted, for the run's summary."""
    totals: Counter[str] = Counter()
    for p in policies:
        totals.update(p.stats())
    return type(policies[0]).summarise_stats(dict(totals))
