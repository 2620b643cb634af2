"""Options that write one file follow `--out`'s rule (issue 35, item 2): `run --trace victim.csv
--trace-events victim.csv` replaced the input trace with JSON, exit 0, and `--trace-events` and `plot --out`
overwrote any file. Now an input or a file of another kind is refused in one line before any work, and only
an earlier file of the same kind is replaced (with a note), all or nothing."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

from simctl.cli import main
from simctl.plot_cmd import FORMATS, is_figure

matplotlib.use("Agg")
pytestmark = pytest.mark.unit

TRACE = "num_prefill_tokens,num_decode_tokens\n100,20\n200,30\n50,10\n"


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    return int(e.value.code or 0), capsys.readouterr().err


def refused(result: tuple[int, str], *words: str) -> None:
    code, err = result
    assert code == 2 and err.count("\n") == 1 and err.startswith("simctl: error: "), (code, err)
    for w in words:
        assert w in err, (w, err)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "victim.csv"
    path.write_text(TRACE)
    return path


def test_the_input_trace_is_never_the_output(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(cli(capsys, "run", "--trace", trace, "--trace-events", trace), "is the input of --trace")
    assert trace.read_text() == TRACE


def test_trace_events_replace_only_an_earlier_trace(trace: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    refused(cli(capsys, "run", "--trace", trace, "--trace-events", notes), "not an earlier trace-events file")
    assert notes.read_text() == '{"mine": 1}'
    events = tmp_path / "t.json"
    assert cli(capsys, "run", "--trace", trace, "--trace-events", events)[0] == 0
    first = events.read_text()
    code, err = cli(capsys, "run", "--trace", trace, "--trace-events", events, "--qps", "3")
    assert code == 0 and "replacing the earlier t.json" in err
    assert events.read_text() != first and events.read_text().startswith('{"traceEvents":')


def test_trace_events_are_not_written_into_out(trace: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    refused(cli(capsys, "run", "--trace", trace, "--out", out, "--trace-events", out / "summary.json"),
            "holds only the run's files")
    assert not out.exists()


def test_plot_out_replaces_only_an_earlier_figure(trace: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert cli(capsys, "run", "--trace", trace, "--out", run)[0] == 0
    photo = tmp_path / "photo.png"
    photo.write_bytes(b"\x89PNG not a figure of ours")
    refused(cli(capsys, "plot", "cdf", run, "--out", photo), "not an earlier figure")
    assert photo.read_bytes() == b"\x89PNG not a figure of ours"
    for fmt in FORMATS:
        fig = tmp_path / f"cdf.{fmt}"
        assert cli(capsys, "plot", "cdf", run, "--out", fig)[0] == 0 and is_figure(fig)
        code, err = cli(capsys, "plot", "cdf", run, "--out", fig)
        assert code == 0 and f"replacing the earlier cdf.{fmt}" in err
