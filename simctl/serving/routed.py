"""A replica's inbox and clock when a router pushes requests to it at their arrival instants (a cluster).

Unlike `serving.inbox.Inbox`, nothing is pushed ahead: a request is pushed at the instant it is due (its
arrival, or the end of its KV transfer), so a replica cannot know when the next one comes. While nothing is
pending, `next_time` is `HELD`, a time no run reaches: an idle replica's loop yields it and its driver waits
for the next push instead; a stretch is not cut for a request it cannot know about (the driver resumes the
loop early when the push happens, and the loop cuts the stretch there).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from simctl.policies.seq import Seq
from simctl.serving.inbox import Inbox

HELD = 1e300  # "until a request is pushed": beyond any simulated time, below inf (which ends the loop)


class RoutedInbox(Inbox):
    """Requests pushed at the instant they are due, in due order (which need not be arrival order: a decode
    instance receives requests in the order their KV transfers end)."""

    __slots__ = ("_due", "prefill", "pushed")
    pushed_while_serving = True

    def __init__(self) -> None:
        super().__init__()
        self._due: deque[tuple[float, Seq]] = deque()
        self.pushed = 0
        # the prompt tokens its pending requests have to prefill (`Member.view_with_prefill`)
        self.prefill = 0

    def push_due(self, seq: Seq, due: float) -> None:
        if self._due and due < self._due[-1][0]:
            raise ValueError(f"request {seq.id} pushed out of order")
        self._due.append((due, seq))
        self.pushed += 1
        self.prefill += seq.queued_prefill

    def push(self, seq: Seq, due: float | None = None) -> None:
        self.push_due(seq, seq.arrival_s if due is None else due)

    @property
    def pending(self) -> int:
        return len(self._due)

    @property
    def next_time(self) -> float:
        return self._due[0][0] if self._due else HELD

    def due_by(self, until: float) -> Iterator[tuple[float, Seq]]:
        for due, seq in self._due:
            if due > until:
                return
            yield due, seq

    def pop_due(self, now: float) -> list[Seq]:
        due = self._due
        out = []
        while due and due[0][0] <= now:
            out.append(due.popleft()[1])
        for seq in out:
            self.prefill -= seq.queued_prefill
        return out


class RoutedTime:
    """Simulated time for a routed replica: the loop's exact time, except after an idle wait (the loop's time
    is then `HELD`), when it is the due time of the request whose push woke it."""

    def __init__(self, inbox: RoutedInbox) -> None:
        self.inbox = inbox

    def now(self, exact: float) -> float:
        return exact if exact < HELD else self.inbox.next_time
