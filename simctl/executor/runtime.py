"""The torch runtime's process settings, shared by the profiler and the real engine: thread counts, the
environment of a timing/serving child process, and the CPU's name for the records."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The folder holding simctl's packages (the checkout, or site-packages when installed): a child started with
# `python -m engine.worker` imports the simctl of this process wherever it runs, never the user's folder's.
_PACKAGES = Path(__file__).resolve().parents[2]


def default_threads() -> int:
    """CPU threads of profiles and real runs unless told otherwise: every core this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false", TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1")
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(_PACKAGES) + (os.pathsep + path if path else "")
    return env


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
