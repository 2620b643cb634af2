"""simctl.executor.vllm_pinning: which process goes on which core, on a fake /proc (no vLLM needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from simctl.executor import vllm_pinning as vp


def _proc(tmp_path: Path, procs: dict[int, tuple[int, str, list[int]]]) -> Path:
    """A fake /proc: pid -> (parent pid, command line, thread ids)."""
    for pid, (ppid, cmd, tids) in procs.items():
        d = tmp_path / str(pid)
        (d / "task").mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (py thon) S {ppid} 1 1 0")  # a name with a space, as comm may have
        (d / "cmdline").write_bytes(cmd.encode() + b"\0\0")
        for t in tids:
            (d / "task" / str(t)).mkdir()
    return tmp_path


TREE = {10: (1, "python bench.py", [10, 11]), 12: (10, "VLLM::EngineCore", [12, 13]),
        14: (12, "VLLM::Worker_TP0", [14, 15, 16]), 20: (1, "someone else", [20]),
        17: (12, "python -c", [17])}


def test_split_cpus_reserves_the_last_core_as_vllm_auto_does() -> None:
    assert vp.split_cpus({0, 1}) == ({0}, {1})
    assert vp.split_cpus({3, 1, 2}) == ({1, 2}, {3})
    assert vp.split_cpus({0}) is None


def test_descendants_and_worker_title(tmp_path: Path) -> None:
    proc = _proc(tmp_path, TREE)
    assert sorted(vp.descendants(10, proc)) == [10, 12, 14, 17]
    assert vp.is_worker(14, proc) and not vp.is_worker(12, proc) and not vp.is_worker(99, proc)


def test_pin_tree_puts_the_worker_on_the_model_cores_and_the_rest_on_the_host_core(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _proc(tmp_path, TREE)
    calls: dict[int, set[int]] = {}
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: calls.__setitem__(tid, set(cpus)))
    roles = vp.pin_tree(10, {0}, {1}, proc)
    assert roles == {10: "host", 12: "host", 14: "worker", 17: "host"}
    assert calls == {10: {1}, 11: {1}, 12: {1}, 13: {1}, 14: {0}, 15: {0}, 16: {0}, 17: {1}}  # not pid 20


def test_pinned_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(vp, "pin_tree", lambda *a: calls.append(a) or {1: "host"})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(vp, "_set", lambda pid, cpus, proc=vp.PROC: calls.append(("restore", pid, cpus)))
    monkeypatch.delenv(vp.PIN_ENV, raising=False)
    with vp.pinned(5) as roles:
        assert roles == {}
    assert calls == []
    monkeypatch.setenv(vp.PIN_ENV, "1")
    with vp.pinned(5) as roles:
        assert roles == {1: "host"}
    assert calls == [(5, {0}, {1}), ("restore", 5, {0, 1})]
