"""vLLM's own output kept off the terminal (`simctl.engine.vllm_output`): what this process and the processes
it starts write to stderr while it is held goes to a file, shown only when asked (a failure)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from simctl.engine.vllm_output import EngineOutput


def test_held_output_of_this_process_and_its_children_is_shown_only_when_asked(
        capfd: pytest.CaptureFixture[str]) -> None:
    out = EngineOutput()
    try:
        with out.held():
            os.write(2, b"a warning of ours\n")  # descriptor 2, as sys.stderr is outside pytest's capture
            subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('a child warning\\n')"],
                           check=True)
        assert capfd.readouterr().err == ""  # held: nothing reached the terminal
        os.write(2, b"after\n")
        assert capfd.readouterr().err == "after\n"  # descriptor 2 is the terminal's again
        out.show()
        assert capfd.readouterr().err == "vLLM's output:\na warning of ours\na child warning\n"
    finally:
        out.close()


def test_nothing_held_shows_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    out = EngineOutput()
    with out.held():
        pass
    out.show()
    out.close()
    assert capfd.readouterr().err == ""
