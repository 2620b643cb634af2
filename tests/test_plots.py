"""`simctl plot`, `simctl run --timeline` and `--trace-events`: figures drawn from every kind of output
folder, the TBT gaps read back from iteration rows (against the run's exact percentiles and a hand-computed
case), the recorded timeline against the requests it recorded, and the Chrome trace's shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from simctl.cli import main
from simctl.common.errors import InputError
from simctl.plot_cmd import KINDS
from simctl.plots.decode_gaps import decode_gaps
from simctl.sim.run import RunConfig, run
from simctl.traces.workload import Workload

CONFIG = RunConfig(workload=Workload(trace="sharegpt", qps=1.5, num_requests=120))


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def one_line_error(result: tuple[int, str, str], *words: str) -> None:
    code, _, err = result
    assert code == 2 and err.count("\n") == 1 and err.startswith("simctl: error: "), (code, err)
    for w in words:
        assert w in err, (w, err)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plots")
    out = {"run_vllm": root / "run_vllm", "run_sarathi": root / "run_sarathi", "cap": root / "cap"}
    for policy in ("vllm", "sarathi"):
        with pytest.raises(SystemExit) as e:
            main(["run", "--policy", policy, "--trace", "sharegpt", "--qps", "1.5", "--num-requests", "120",
                  "--timeline", "200", "--trace-events", str(root / f"{policy}.json"),
                  "--out", str(out[f"run_{policy}"])])
        assert e.value.code == 0
    with pytest.raises(SystemExit) as e:
        main(["capacity", "--policy", "orca,sarathi", "--trace", "sharegpt", "--num-requests", "100",
              "--slo", "p99_tbt=0.1", "--slo", "ttft=2", "--workers", "1", "--out", str(out["cap"])])
    assert e.value.code == 0
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_figure_is_drawn(kind: str, folders: dict[str, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    dirs = {"capacity": ["cap"], "attainment": ["cap"], "pareto": ["cap", "run_vllm"],
            "timeline": ["run_vllm"], "cdf": ["run_vllm", "run_sarathi"],
            "tbt": ["run_vllm", "run_sarathi"]}[kind]
    png = tmp_path / f"{kind}.png"
    code, _, err = cli(capsys, "plot", kind, *(folders[d] for d in dirs), "--out", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == [png.name]  # no temporaries left


def test_bad_plot_input_is_one_line(folders: dict[str, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(cli(capsys, "plot", "violin", folders["cap"]), "unknown figure 'violin'")
    one_line_error(cli(capsys, "plot", "cdf", tmp_path), "holds no simctl output")
    one_line_error(cli(capsys, "plot", "cdf", tmp_path / "nowhere"), "not a folder")
    one_line_error(cli(capsys, "plot", "cdf", folders["cap"]), "needs a run's folder")
    one_line_error(cli(capsys, "plot", "capacity", folders["run_vllm"]), "no capacity results")
    one_line_error(cli(capsys, "plot", "tbt", folders["run_vllm"], "--window", "5:1"), "--window")
    one_line_error(cli(capsys, "plot", "cdf", folders["run_vllm"], "--out", tmp_path / "x.gif"), ".png")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text("{}")
    one_line_error(cli(capsys, "plot", "tbt", broken), "requests.parquet is missing")
    (broken / "requests.parquet").write_text("not parquet")
    one_line_error(cli(capsys, "plot", "tbt", broken), "cannot read")
    no_timeline = tmp_path / "plain"
    assert cli(capsys, "run", "--num-requests", "20", "--out", no_timeline)[0] == 0
    one_line_error(cli(capsys, "plot", "timeline", no_timeline), "--timeline")
    assert not list(tmp_path.glob("*.png"))


def test_decode_gaps_by_hand() -> None:
    rows = pd.DataFrame({  # a prefill of 2, their decode, a prefill of 1 stalling them, 3 decodes x 3, idle
        "start_s": [0.0, 1.0, 1.5, 2.5, 10.0], "duration_s": [1.0, 0.5, 1.0, 0.6, 1.0],
        "count": [1, 1, 1, 3, 1], "decode_tokens": [0, 2, 0, 3, 1], "batch_size": [2, 2, 1, 3, 1]})
    g = decode_gaps(rows)
    got = sorted(zip(g.time_s.round(9), g.gap_s.round(9), g.weight))
    # 1.5: both newcomers, 0.5 after their prefill; 2.7: the newcomer 0.2 after its prefill, the stalled two
    # 1.2 after their last token (1.5); 3.1: the stretch's 2 more iterations x 3 tokens at its mean 0.2; after
    # the idle spell nothing is known of the decode's previous token (and no such run exists: decodes never
    # idle)
    assert got == [(1.5, 0.5, 2), (2.7, 0.2, 1), (2.7, 1.2, 2), (3.1, 0.2, 6)]


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "orca", "faster-transformer"])
def test_decode_gaps_match_the_runs_own_percentiles(policy: str) -> None:
    r = run(RunConfig(policy=policy, workload=Workload(trace="sharegpt", qps=1.5, num_requests=150)))
    g = decode_gaps(r.result.iterations.frame())
    assert abs(int(g.weight.sum()) - r.result.gaps.total) <= 2
    for p in (50, 90, 99):
        assert g.percentile(p) == pytest.approx(r.summary[f"tbt_p{p}"], rel=2e-3), p


def test_timeline_records_its_window_and_changes_nothing() -> None:
    plain = run(CONFIG)
    recorded = run(CONFIG, timeline=3000)
    for k, v in plain.summary.items():
        if isinstance(v, float) and k != "sim_wall_s":
            assert recorded.summary[k] == pytest.approx(v, rel=1e-9), k
    tl = recorded.timeline
    assert tl["iteration"].nunique() == 3000 and (tl["end_s"] > tl["start_s"]).all()
    req = recorded.result.requests.set_index("request_id")
    last = tl["end_s"].max()
    inside = req[(req["completion_s"] >= 0) & (req["completion_s"] <= last)].index
    assert len(inside) > 0
    for rid in inside:  # a request served wholly within the window: its prompt, then one decode per token
        mine = tl[tl["request_id"] == rid]
        assert mine.loc[mine["prefill"], "tokens"].sum() == req.loc[rid, "prompt_tokens"]
        assert (~mine["prefill"]).sum() == req.loc[rid, "output_tokens"] - 1
    with pytest.raises(InputError, match="--timeline"):
        run(CONFIG, timeline=10**9)


def test_trace_events_are_ordered_and_bounded(folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = json.loads((folders["run_vllm"].parent / "vllm.json").read_text())
    its = pd.read_parquet(folders["run_vllm"] / "iterations.parquet")
    summary = json.loads((folders["run_vllm"] / "summary.json").read_text())
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(x) == len(its) and not trace["otherData"]["truncated"]
    assert sum(e["args"]["count"] for e in x) == summary["iterations"]
    ts = np.array([e["ts"] for e in x])
    ends = ts + np.array([e["dur"] for e in x])
    assert (np.diff(ts) > 0).all() and (ends[:-1] <= ts[1:]).all() and (ends > ts).all()
    assert {e["pid"] for e in x} == {0} and {e["tid"] for e in x} == {0}
    assert sum(e["args"]["prefill_tokens"] * e["args"]["count"] for e in x) >= summary["num_requests"]
    import simctl.results.trace_events

    monkeypatch.setattr(simctl.results.trace_events, "MAX_EVENTS", 50)
    path = tmp_path / "t.json"
    code, _, err = cli(capsys, "run", "--num-requests", "30", "--trace-events", path)
    assert code == 0 and "only the first 50" in err
    cut = json.loads(path.read_text())
    assert sum(e["ph"] == "X" for e in cut["traceEvents"]) == 50 and cut["otherData"]["truncated"]
    one_line_error(cli(capsys, "run", "--num-requests", "30", "--trace-events", tmp_path), "is a folder")


# ---- issue 35: figures that read at a glance ---------------------------------------------------------------
def test_a_window_beyond_the_run_is_one_line_and_writes_nothing(folders: dict[str, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "tbt.png"
    one_line_error(cli(capsys, "plot", "tbt", folders["run_vllm"], "--window", "1e6:2e6", "--out", png),
                   "no token in --window 1e+06:2e+06", "its tokens were sampled from")
    assert not png.exists()


def _point(policy: str, qps: float, tpot: float, **more: object) -> dict[str, object]:
    return {"policy": policy, "trace": "sharegpt", "model": "mistral-7b", "gpu": "a100-80gb", "tp": 1,
            "qps": qps, "tpot_p50": tpot, "throughput_tokens_per_s": 100 * qps, "sustainable": True, **more}


def _lines(fig: Figure) -> dict[str, np.ndarray]:
    """Each legend entry's x data (the markers of its sustainable runs)."""
    ax = fig.axes[0]
    return {str(h.get_label()): np.asarray(h.get_xdata()) for h in ax.get_lines()
            if not str(h.get_label()).startswith("_")}


def test_pareto_of_a_capacity_and_a_sweep_names_every_line_and_runs_along_x() -> None:
    from simctl.plots.across_runs import pareto_figure

    # a capacity search's probes name their configuration; a sweep's rows (two traces) do not
    cap = [_point("vllm", q, t, config="vllm", slo="strict") for q, t in ((1.5, 0.02), (4, 0.05), (3, 0.03))]
    sweep = [_point(p, q, t, trace=trace) for p in ("vllm", "sarathi") for trace in ("sharegpt", "arxiv")
             for q, t in ((0.5, 0.02), (1.0, 0.025), (2.0, 0.022))]
    fig = pareto_figure(pd.DataFrame(cap + sweep))
    lines = _lines(fig)
    assert sorted(lines) == ["sarathi / arxiv", "sarathi / sharegpt", "vllm / arxiv", "vllm / sharegpt"]
    assert all((np.diff(x) >= 0).all() for x in lines.values())
    assert len(lines["vllm / sharegpt"]) == 6  # the capacity's probes and the sweep's runs on one setup


def test_a_plans_many_lines_have_distinct_styles_and_labels_that_do_not_overlap() -> None:
    from simctl.plots.across_runs import pareto_figure

    names = [(p, f"{p} {s}") for p in ("vllm", "vllm-v1", "sarathi") for s in ("a", "b", "c", "d", "e", "f")]
    points = pd.DataFrame([_point(p, q, 0.01 * q + 0.001 * i, config=name, slo_met=True)
                           for i, (p, name) in enumerate(names) for q in (1.0, 2.0, 3.0)])
    chosen = [(f"choice {k}", 1 / (0.03 + 0.0001 * k), 300.0 - k) for k in range(5)]  # nearly one point
    fig = pareto_figure(points, chosen)
    ax = fig.axes[0]
    styles = {(h.get_color(), h.get_marker()) for h in ax.get_lines()
              if not str(h.get_label()).startswith("_")}
    assert len(styles) == len(names) == 18
    from matplotlib.text import Text

    fig.canvas.draw()
    boxes = [Text.get_window_extent(t) for t in ax.texts if t.get_text().startswith("#")]  # no leader line
    assert len(boxes) == 5
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
