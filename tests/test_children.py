"""Child processes (issue 35, items 1 and 7): a child's failure is one line with its cause (killed for
memory, a Python error's last line), never an empty reason or a flattened traceback; a child is stopped within
a bounded wait, even one that ignores SIGTERM (after Ctrl-C simctl waited 90-150 s on a dying worker)."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import threading
import time

import pytest

from simctl.common.children import TAIL_CHARS, failure_line, stop, stop_pool

pytestmark = pytest.mark.unit

GENEROUS_S = 60.0  # a bound no working stop comes near (it waits at most twice its grace)
STUBBORN = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")


def test_killed_by_the_kernel_says_out_of_memory() -> None:
    assert failure_line("worker", -9) == "worker: killed by the kernel (SIGKILL), most likely out of memory"
    assert failure_line("worker", -15) == "worker: killed by SIGTERM"
    assert failure_line("worker", 3) == "worker: exit code 3"


def test_a_python_error_is_its_last_line() -> None:
    traceback = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    f()\n"
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.12 GiB\n")
    assert failure_line("worker", 1, None, "noise\n" + traceback) == (
        "worker: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.12 GiB")
    # the child's own report wins, first line only, and a long one is cut
    assert failure_line("worker", 1, "RuntimeError: boom\nmore", traceback) == "worker: RuntimeError: boom"
    long = failure_line("worker", 1, "E: " + "x" * 5000)
    assert len(long) <= len("worker: ") + TAIL_CHARS and long.endswith("...")


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_real_run_killed_for_memory_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import simctl.engine.real

    monkeypatch.setattr(simctl.engine.real, "worker_command", lambda *a, **k: _python(
        "import os, signal; print('x' * 3000); os.kill(os.getpid(), signal.SIGKILL)"))
    with pytest.raises(RuntimeError) as e:
        simctl.engine.real._run_worker(simctl.engine.real.RealConfig(threads=1))
    assert str(e.value) == ("real-execution worker: killed by the kernel (SIGKILL), most likely out of "
                            "memory")


def test_a_profiler_child_error_is_its_last_line() -> None:
    from simctl.profiler.profile import run_child

    code = "def f():\n    raise MemoryError('DefaultCPUAllocator: not enough memory')\nf()\n"
    with pytest.raises(RuntimeError) as e:
        run_child(_python(code), {}, lambda msg: None)
    assert str(e.value) == "profiler worker: MemoryError: DefaultCPUAllocator: not enough memory"


def _bounded(call: object) -> None:
    """Run `call` in a thread and fail (rather than hang) if it does not return within GENEROUS_S."""
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(GENEROUS_S)
    assert not t.is_alive(), "the stop did not return"


def test_a_child_that_ignores_sigterm_is_killed() -> None:
    proc = subprocess.Popen(_python(STUBBORN), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    _bounded(lambda: stop(proc, grace_s=0.2))
    assert proc.returncode == -signal.SIGKILL
    proc.stdout.close()


def _ignore_sigterm(ready: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()  # type: ignore[attr-defined]


def _stubborn(ready: object) -> None:
    _ignore_sigterm(ready)
    time.sleep(600)


def test_a_multiprocessing_child_that_ignores_sigterm_is_killed() -> None:
    ready = multiprocessing.Event()
    child = multiprocessing.Process(target=_stubborn, args=(ready,), daemon=True)
    child.start()
    assert ready.wait(GENEROUS_S)
    _bounded(lambda: stop(child, grace_s=0.2))
    assert child.exitcode == -signal.SIGKILL


def test_a_pool_whose_worker_ignores_sigterm_is_stopped() -> None:
    """`Pool.terminate` joins its workers without a bound: a worker that does not die hung the command."""
    ready = multiprocessing.Event()
    pool = multiprocessing.Pool(1, initializer=_ignore_sigterm, initargs=(ready,))
    assert ready.wait(GENEROUS_S)
    pool.apply_async(time.sleep, (600,))
    _bounded(lambda: stop_pool(pool, grace_s=0.2))
    for child in multiprocessing.active_children():  # reaps the killed worker
        child.join(GENEROUS_S)
    assert not multiprocessing.active_children()
