"""What the command line loads before a command does its work: the app, its help and its option parsing
import no numerical library, so that `simctl --help` and a mistyped option answer at once (issue 42); a
command imports what it uses when it runs. The process boundary is what is tested: a module once imported
stays in `sys.modules`, so each check starts a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from simctl.common.checks import is_int, is_number

pytestmark = pytest.mark.cli

NUMERICAL = ("numpy", "pandas", "scipy", "matplotlib", "torch", "simpy")
PROBE = """
import json, sys
from simctl.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
wanted = json.loads(sys.argv[2])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in wanted)), file=sys.stderr)
"""


def _numerical_loaded(argv: list[str], wanted: tuple[str, ...] = NUMERICAL) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(wanted)],
                          check=True, capture_output=True, text=True, timeout=120)
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["capacity", "--help"], ["plan", "--help"],
                                  ["real", "--help"], ["validate", "--help"], ["run", "--no-such-option"],
                                  ["run", "--qps", "fast"]])
def test_help_and_option_errors_load_no_numerical_library(argv: list[str]) -> None:
    assert _numerical_loaded(argv) == []


def test_a_simulation_loads_no_plotting_and_no_torch() -> None:
    loaded = _numerical_loaded(["run", "--policy", "vllm", "--trace", "sharegpt", "--num-requests", "20"])
    assert "numpy" in loaded  # the probe saw the run happen
    assert not [m for m in loaded if m.split(".")[0] in ("matplotlib", "torch")]


def test_a_summary_alone_loads_no_pandas() -> None:
    # the request and iteration tables are built only when asked for (--out, plots, studies): a run that
    # prints its summary, JSON or a table, with an SLO and vLLM's goodput, reads numpy columns (issue 42);
    # its JSON needs no rich either, its length profile no scipy (traces.lengths: math.erfc), and its options
    # no pydantic (simctl.option_values)
    for tail, unwanted in ((["--json"], ("pandas", "rich", "scipy", "pydantic")),
                           (["--slo", "ttft=1,tpot=0.1", "--goodput", "ttft:1000"],
                            ("pandas", "scipy", "pydantic"))):
        loaded = _numerical_loaded(["run", "--policy", "vllm", "--trace", "sharegpt", "--num-requests", "20",
                                    *tail], (*NUMERICAL, "rich", "pydantic"))
        assert "simpy" in loaded  # the probe saw the run happen
        assert not [m for m in loaded if m.split(".")[0] in unwanted], tail


def test_option_checks_take_numpy_scalars() -> None:
    # common.checks finds numpy's scalar types only once numpy is loaded (it is: this module imports it)
    assert is_int(np.int64(3)) and not is_int(np.float64(3)) and not is_int(True)
    assert is_number(np.float32(0.5)) and is_number(np.int8(1)) and is_number(2) and not is_number(False)
    assert not is_number("1")
