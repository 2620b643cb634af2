"""Pinning vLLM's CPU processes to cores of their own (opt-in: SIMCTL_VLLM_PIN=1, the same for the profile and
served runs).

vLLM's CPU build binds only its model worker's OpenMP threads (to the cores left after one reserved for the
engine core, `VLLM_CPU_OMP_THREADS_BIND=auto`); the reserved core is not enforced: the engine core, the
front end (this process) and the worker's other threads run wherever the kernel puts them, the model's core
included.
`pin_tree` enforces it: every thread of the model worker (the process vLLM titles `VLLM::Worker...`) on the
model's cores, every other thread of this process and its descendants on the reserved core.

    with pinned(os.getpid()):      # after the engine started; on leaving, this process's cores are restored
        ...
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PIN_ENV = "SIMCTL_VLLM_PIN"
WORKER_TITLE = "::Worker"  # vLLM's process title of a model worker (`VLLM::Worker`, `VLLM::Worker_TP0`, ...)
PROC = Path("/proc")


def pin_wanted() -> bool:
    """Whether SIMCTL_VLLM_PIN asks for pinning (1, true, yes)."""
    return os.environ.get(PIN_ENV, "").strip().lower() in ("1", "true", "yes")


def split_cpus(allowed: set[int]) -> tuple[set[int], set[int]] | None:
    """(model cores, host core) as vLLM's auto binding splits `allowed`: the last core reserved for the host
    processes, the others the model's; None for a single core (nothing to split)."""
    cpus = sorted(allowed)
    if len(cpus) < 2:
        return None
    return set(cpus[:-1]), {cpus[-1]}


def descendants(root: int, proc: Path = PROC) -> list[int]:
    """`root` and every process below it, from /proc/*/stat's parent ids (processes that ended meanwhile are
    skipped)."""
    parent: dict[int, int] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(text[text.rindex(")") + 2:].split()[1])
    found, frontier = [root], [root]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        found += frontier
    return found


def is_worker(pid: int, proc: Path = PROC) -> bool:
    """Whether `pid` is a vLLM model worker, by its process title (its command line)."""
    try:
        return WORKER_TITLE in (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _set(pid: int, cpus: set[int], proc: Path = PROC) -> int:
    """Every thread of `pid` onto `cpus`; the number of threads set."""
    n = 0
    for task in (proc / str(pid) / "task").glob("[0-9]*"):
        try:
            os.sched_setaffinity(int(task.name), cpus)
            n += 1
        except OSError:  # the thread ended
            continue
    return n


def pin_tree(root: int, model: set[int], host: set[int], proc: Path = PROC) -> dict[int, str]:
    """Every thread below `root` (included) onto `model` (a model worker's) or `host` (any other's); the role
    of each process pinned, by pid."""
    roles = {}
    for pid in descendants(root, proc):
        role = "worker" if is_worker(pid, proc) else "host"
        if _set(pid, model if role == "worker" else host, proc):
            roles[pid] = role
    return roles


@contextmanager
def pinned(root: int) -> Iterator[dict[int, str]]:
    """`pin_tree(root)` on the cores this process may use, if SIMCTL_VLLM_PIN asks for it and there are two or
    more; yields the roles pinned ({} when not pinned). On leaving, `root`'s own threads get back the cores it
    had."""
    allowed = os.sched_getaffinity(root)
    split = split_cpus(allowed) if pin_wanted() else None
    if split is None:
        yield {}
        return
    try:
        yield pin_tree(root, *split)
    finally:
        _set(root, allowed)
