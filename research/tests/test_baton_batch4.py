"""research/baton_batch4.py's recording backend: its per-kind totals account for the whole run."""

from __future__ import annotations

import pytest
from research_scripts import research_module

from simctl.studies.query_set import query_set

bb = research_module("baton_batch4")


@pytest.mark.parametrize("policy", bb.POLICIES)
def test_kinds_add_up_to_the_run(policy: str) -> None:
    """Every query is there at t = 0 and the device never idles, so the steps' seconds sum to the completion
    time; the real tokens are every prompt and every output token but the one each prefill samples."""
    requests = query_set("short", 0)[:12]
    cost, kv = bb.setting(4, 27.3)
    total, rec = bb.run(policy, requests, 4, cost, kv)
    assert sum(k.seconds for k in rec.kinds.values()) == pytest.approx(total, rel=1e-9)
    assert sum(k.real_tokens for k in rec.kinds.values()) == sum(
        r.prompt_tokens + r.output_tokens - 1 for r in requests)
