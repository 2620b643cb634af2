"""Options read without pydantic (`simctl.option_values`) read every value as typer's pydantic adapter does:
over random command-line text, a value read plainly equals the adapter's, type and sign included; any other
is left to the adapter, whose errors the command line reports as before."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simctl.option_values import OTHER, plain_value

pydantic = pytest.importorskip("pydantic")

DECIMAL = st.from_regex(r"\A[+-]?([0-9]{0,25}\.?[0-9]{0,25})([eE][+-]?[0-9]{1,4})?\Z")
TEXT = st.one_of(DECIMAL, st.text(alphabet="0123456789+-.eE_ xinfa\t", max_size=12), st.text(max_size=8))


def _adapter_reads(annotation: type, value: object) -> object:
    try:
        return pydantic.TypeAdapter(annotation).validate_python(value)
    except pydantic.ValidationError:
        return OTHER


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (a == b and math.copysign(1, a) == math.copysign(1, b)) or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_a_plain_reading_is_the_adapters(text: str) -> None:
    for annotation in (int, float, str, Path):
        plain = plain_value(annotation, text)
        if plain is not OTHER:
            assert _same(plain, _adapter_reads(annotation, text)), (annotation, text, plain)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-2 ** 60, 2 ** 60), st.floats(allow_nan=False), st.booleans()))
def test_a_default_keeps_the_adapters_type(default: object) -> None:
    # an option's default arrives as a Python value: `qps: float = 1` reads 1.0, as the adapter gives
    for annotation in (int, float):
        plain = plain_value(annotation, default)
        if plain is not OTHER:
            assert _same(plain, _adapter_reads(annotation, default)), (annotation, default)


def test_what_is_plain_and_what_is_left() -> None:
    assert plain_value(int, "-0012") == -12 and plain_value(float, "1e3") == 1000.0
    assert plain_value(float, 2) == 2.0 and type(plain_value(float, 2)) is float
    assert plain_value(Path, "out/x") == Path("out/x")
    for annotation, text in ((int, "1_000"), (int, " 5"), (int, "1.0"), (float, "inf"), (float, "0x10"),
                             (int, True), (Path, ""), (bool, "yes")):
        assert plain_value(annotation, text) is OTHER, (annotation, text)


@pytest.mark.cli
def test_values_left_to_typer_read_and_fail_as_before() -> None:
    # `1_000` and ` 20` are not plain: typer's adapter reads them; `fast` fails with its message
    probe = ("import sys\nfrom simctl.cli import main\nmain(sys.argv[1:])")
    base = [sys.executable, "-c", probe, "run", "--policy", "vllm", "--trace", "sharegpt", "--json"]
    runs = {n: subprocess.run([*base, "--num-requests", n], check=True, capture_output=True, text=True,
                              timeout=120)
            for n in ("20", " 20", "2_0")}
    summaries = {n: json.loads(r.stdout) for n, r in runs.items()}
    for s in summaries.values():
        s.pop("sim_wall_s")  # a wall time
    assert summaries["20"]["num_requests"] == 20
    assert summaries[" 20"] == summaries["20"] == summaries["2_0"]
    bad = subprocess.run([*base, "--qps", "fast"], check=False, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("simctl: error: invalid value 'fast' for --qps: Input should be a valid "
                                 "number"), bad.stderr
