"""vLLM's own output, kept off the terminal unless something fails.

On a CPU a successful `simctl real --engine vllm` printed some 25 lines of vLLM's warnings (Triton without a
CPU backend, tcmalloc and libiomp not preloaded, NUMA binding, eager mode, the process manager killing its
engine core at shutdown): noise around a run that went well. vLLM's engine core and model worker are processes
that inherit this process's stderr (file descriptor 2) when they start, so Python's logging settings cannot
reach them; `EngineOutput.held()` points descriptor 2 at a temporary file while vLLM is imported, started
and stopped, and its processes keep writing there for their whole life. A failure shows what vLLM said
(`show`); a success drops it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


class EngineOutput:
    """Where vLLM's output goes while it is `held()`: a temporary file, until `close()`."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()  # noqa: SIM115 - open for the engine's life, until close()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Descriptor 2 into the file for the block (and for the processes started in it, for their life)."""
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)

    def show(self) -> None:
        """Write what vLLM said so far to stderr (for a failure: its reason is in there)."""
        self.file.flush()
        self.file.seek(0)
        text = self.file.read().decode(errors="replace")
        self.file.seek(0, os.SEEK_END)
        if text:
            sys.stderr.write("vLLM's output:\n" + text)
            sys.stderr.flush()

    def close(self) -> None:
        self.file.close()
