"""Child processes: stopping one within a bounded wait, and one line saying why one failed.

A child killed while it holds many GB (a real run's model) can spend minutes in the kernel's exit path, so no
wait on a child is unbounded once the user has interrupted: terminate, wait, kill, wait, then go on without
it (it has been sent SIGKILL and ends on its own; `simctl.cli.main` exits without joining children).
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess
    from multiprocessing.pool import Pool
    from multiprocessing.process import BaseProcess

STOP_GRACE_S = 2.0  # per step: after SIGTERM, then after SIGKILL
TAIL_CHARS = 300  # the most of a child's own error message shown


def _ended(child: subprocess.Popen | BaseProcess, timeout: float) -> bool:
    """Wait up to `timeout` s for a `subprocess.Popen` or a `multiprocessing.Process`; whether it ended."""
    if hasattr(child, "poll"):
        try:
            child.wait(timeout=timeout)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: still running
            return False
        return True
    child.join(timeout)
    return child.exitcode is not None


def stop(child: subprocess.Popen | BaseProcess, grace_s: float = STOP_GRACE_S) -> bool:
    """Terminate `child` (a `subprocess.Popen` or `multiprocessing.Process`), wait up to `grace_s`, kill it,
    wait up to `grace_s` again; whether it ended. Never waits longer."""
    if _ended(child, 0):
        return True
    child.terminate()
    if _ended(child, grace_s):
        return True
    child.kill()
    return _ended(child, grace_s)


def stop_pool(pool: Pool, grace_s: float = STOP_GRACE_S) -> None:
    """`pool.terminate()` (a `multiprocessing.Pool`: SIGTERM to its workers, then joined), bounded: a worker
    still there after `grace_s` is killed, and after `grace_s` more the pool is left to the kernel."""
    import multiprocessing

    stopping = threading.Thread(target=pool.terminate, daemon=True)
    stopping.start()
    stopping.join(grace_s)
    if stopping.is_alive():
        for worker in multiprocessing.active_children():
            worker.kill()
        stopping.join(grace_s)


def exit_cause(returncode: int) -> str:
    """Why a child ended, from its exit status (negative: the signal that killed it)."""
    if returncode == -signal.SIGKILL:
        return "killed by the kernel (SIGKILL), most likely out of memory"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def failure_line(what: str, returncode: int | None, message: str | None = None, output: str = "") -> str:
    """One line saying why child `what` failed: the error it reported (`message`, its first line), else the
    signal that killed it, else the last line of a Python traceback in its `output`, else its exit code."""
    cause = _first_line(message)
    if cause is None and returncode is not None and returncode < 0:
        cause = exit_cause(returncode)
    if cause is None:
        cause = _error_line(output)
    if cause is None:
        cause = exit_cause(returncode) if returncode is not None else "it ended without a result"
    return f"{what}: {cause}"


def _first_line(text: str | None) -> str | None:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return _short(lines[0]) if lines else None


def _error_line(output: str) -> str | None:
    """The exception line that ends a traceback in `output` (the last line after the last "Traceback")."""
    at = output.rfind("Traceback (most recent call last)")
    if at < 0:
        return None
    lines = [line.strip() for line in output[at:].splitlines() if line.strip()]
    return _short(lines[-1]) if len(lines) > 1 else None


def _short(line: str) -> str:
    return line if len(line) <= TAIL_CHARS else line[:TAIL_CHARS - 3] + "..."
