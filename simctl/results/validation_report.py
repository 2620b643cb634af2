"""A validation's results: the report data (`ValidationReport`, one `RunPair` per policy and load), its JSON
and its markdown table (its figure: `simctl.plots.validation`; its files: `simctl.validation.report`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simctl.common.errors import InputError
from simctl.serving.records import GapHistogram

METRICS = ("ttft_p50", "ttft_p90", "ttft_p99", "tbt_p50", "tbt_p90", "tbt_p99", "e2e_p50", "e2e_p90",
           "e2e_p99", "throughput_rps", "throughput_tokens_per_s")
LABELS = {"ttft": "TTFT", "tbt": "TBT", "e2e": "E2E", "throughput_rps": "req/s",
          "throughput_tokens_per_s": "out tok/s"}


def metric_label(m: str, labels: dict[str, str] = LABELS) -> str:
    """A metric key as a report row names it: `ttft_p50` -> "P50 TTFT"."""
    if m in labels:
        return labels[m]
    base, p = m.rsplit("_", 1)
    return f"{p.upper()} {labels[base]}"


def pct_error(predicted: Any, measured: Any) -> float | None:
    """(predicted - measured) / measured in percent; None when undefined."""
    if predicted is None or measured is None or not math.isfinite(predicted) or not math.isfinite(measured):
        return None
    if measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


@dataclass
class RunPair:
    """One real run at one load and its simulated twin, in memory (for the figure)."""

    policy: str
    load: float
    real_ttft: np.ndarray
    sim_ttft: np.ndarray
    real_gaps: GapHistogram  # replayed from the real times
    sim_gaps: GapHistogram
    replay_complete: bool


@dataclass
class ValidationReport:
    config: dict[str, Any]  # options, cost model, SLO, machine load, timing
    rows: list[dict[str, Any]]  # one per policy and load: real, predicted and % error of each metric
    capacity: dict[str, dict[str, Any]]  # policy -> simulated (and real) capacity, probes
    evidence: list[dict[str, Any]]  # one per policy and load: per-iteration measured vs predicted
    out: Path
    pairs: list[RunPair] = field(default_factory=list, repr=False)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "rows": self.rows, "capacity": self.capacity,
                "evidence": self.evidence}

    def error(self, policy: str, load: float, metric: str) -> float | None:
        for r in self.rows:
            if r["policy"] == policy and r["load"] == load:
                return r[f"{metric}_err_pct"]
        raise KeyError((policy, load))


VALIDATION_FILES = ("validation.csv", "validation.md", "validation.png", "validation.json")


def load_report(out: str | Path) -> ValidationReport:
    """A finished validation's report from its validation.json (without the CDF data)."""
    import json

    path = Path(out) / "validation.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a finished validation ({e})") from None
    return ValidationReport(data["config"], data["rows"], data["capacity"], data["evidence"], Path(out))


def jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def fmt_err(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def fmt_ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _fmt_value(metric: str, v: float | None) -> str:
    if v is None:
        return "n/a"
    if metric.startswith("throughput"):
        return f"{v:.3g}"
    return f"{v * 1e3:.3g}" if v < 10 else f"{v:.3g} s"


def markdown(report: ValidationReport) -> str:
    """validation.md: the set-up, a table per question (capacity, latency and throughput, errors at the
    machine's speed, run-to-run spread, per-iteration evidence) and whether the requests were identical."""
    lines = _setup(report.config)
    for section in (_capacity_table, _latency_table, _adjusted_table, _spread_table, _evidence_table):
        lines += section(report)
    bad = [r for r in report.rows if not r["identical_requests"]]
    lines += ["", "Identical requests (ids, lengths, arrivals) in every real run and its twin: "
              + ("yes" if not bad else "NO for " + ", ".join(f"{r['policy']}@{r['load']:g}" for r in bad)),
              ""]
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _head(cells: list[str]) -> list[str]:
    """A table's header and its rule."""
    return [_row(cells), "|" + "---|" * len(cells)]


def _setup(c: dict[str, Any]) -> list[str]:
    return [
        "# Simulator validation against real execution",
        "",
        (f"{c['model']} on {c.get('device_name') or 'this CPU'} ({c.get('device', 'cpu')}, {c['dtype']}, "
         f"{c['threads'] or 'all'} CPU thread(s)), trace {c['trace']} x "
         f"{c['scale']:g} (lengths), {c['num_requests']} requests, seed {c['seed']}; cost model "
         f"`{c['cost']}`."),
        (f"Capacity SLO: {c['slo_text']}. Loads are fractions of the simulated capacity. Errors are "
         "(predicted - measured) / measured"
         + (f"; measured values are medians of {c['repeats']} real runs (spread below)."
            if c.get("repeats", 1) > 1
            else ".")),
        (f"Load average {c['loadavg_start']} at the start, {c.get('loadavg_end')} at the end; "
         f"{c.get('wall_s')} s in all; {c['date']}."),
    ]


def load_unit(record: dict[str, Any]) -> tuple[str, str]:
    """What a validation's row (or capacity record) gives its load in, and its unit: ("qps", "QPS"), or with
    closed-loop clients and no rate ("concurrency", "clients")."""
    return ("qps", "QPS") if "qps" in record or "sim_qps" in record else ("concurrency", "clients")


def _capacity_table(report: ValidationReport) -> list[str]:
    """Simulated capacity per policy, and the real one where the validation searched it."""
    var, unit = load_unit(next(iter(report.capacity.values()), {"qps": None}))
    real_cap = any(f"real_{var}" in v for v in report.capacity.values())
    lines = ["", f"## Capacity ({unit})", "",
             *_head(["policy", "simulated"] + (["real", "real: first failing", "error", "real probes"]
                                               if real_cap else []))]
    for p, v in report.capacity.items():
        cells = [p, f"{v[f'sim_{var}']:.4g}"]
        if real_cap:
            fail = v.get(f"real_fail_{var}")
            cells += [f"{v.get(f'real_{var}', 0):.4g}", "none" if fail is None else f"{fail:.4g}",
                      fmt_err(v.get("error_pct")), str(len(v.get("real_probes", [])))]
        lines.append(_row(cells))
    return lines


def _latency_table(report: ValidationReport) -> list[str]:
    lines = ["", "## Latency and throughput: measured / predicted (error)", "",
             "Latencies in ms; throughput in requests/s and output tokens/s.", "",
             *_head(["policy", "load", load_unit(report.rows[0])[1] if report.rows else "QPS"]
                    + [metric_label(m) for m in METRICS])]
    for r in report.rows:
        lines.append(_row([r["policy"], f"{r['load']:g}", f"{r[load_unit(r)[0]]:.3g}"]
                          + [f"{_fmt_value(m, r[f'{m}_real'])} / {_fmt_value(m, r[f'{m}_sim'])} "
                             f"({fmt_err(r[f'{m}_err_pct'])})" for m in METRICS]))
    why = [f"- {r['policy']} at load {r['load']:g}: {unavailable(r)}" for r in report.rows if unavailable(r)]
    return lines + (["", "Why the cells are n/a:", *why] if why else [])


def unavailable(row: dict[str, Any]) -> str | None:
    """Why a row's latencies are n/a (a run, real or simulated, that completed no request), or None."""
    runs = [name for side, name in (("real", "the real run"), ("sim", "its twin"))
            if row.get(f"{side}_completed") == 0]
    if not runs:
        return None
    gave_up = not row.get("real_sustainable", True) or not row.get("sim_sustainable", True)
    var, unit = load_unit(row)
    over = (f" at {row['load']:g}x the simulated capacity ({row[var]:.3g} {unit})" if row["load"] > 1 else "")
    return (f"{' and '.join(runs)} completed no request{over}"
            + (" (overloaded: a run gives up once too many requests wait; loads up to 1 compare latencies)"
               if gave_up else ""))


def _adjusted_table(report: ValidationReport) -> list[str]:
    """The latency errors once the twin runs at the machine's speed during the real runs."""
    latencies = METRICS[:9]
    lines = ["", "## Errors at the machine's speed during the runs", "",
             ("The twin simulated again with every iteration time multiplied by the real runs' busy time "
              "over their repriced busy time (the machine's speed then, relative to the profile; "
              "per-iteration evidence below). What remains is the error of the scheduling and queueing "
              "model and of the cost model's shape, not the machine's drift."), "",
             *_head(["policy", "load", "speed factor"] + [metric_label(m) for m in latencies])]
    for r in report.rows:
        lines.append(_row([r["policy"], f"{r['load']:g}", fmt_ratio(r["busy_ratio_real_over_repriced"])]
                          + [fmt_err(r.get(f"{m}_adj_err_pct")) for m in latencies]))
    return lines


def _spread_table(report: ValidationReport) -> list[str]:
    """Min - max over the real runs of each policy and load (none from a single run)."""
    repeats = report.config.get("repeats", 1)
    if repeats <= 1:
        return []
    spread = ("ttft_p50", "tbt_p50", "e2e_p50", "tbt_p99", "throughput_rps")
    lines = ["", f"## Run-to-run spread: min - max over {repeats} real runs", "",
             *_head(["policy", "load"] + [metric_label(m) for m in spread] + ["P50 TBT max / min"])]
    for r in report.rows:
        lo, hi = r["tbt_p50_real_min"], r["tbt_p50_real_max"]
        lines.append(_row([r["policy"], f"{r['load']:g}"]
                          + [f"{_fmt_value(m, r[f'{m}_real_min'])} - {_fmt_value(m, r[f'{m}_real_max'])}"
                             for m in spread]
                          + [fmt_ratio(hi / lo if lo and hi else None)]))
    return lines


def _evidence_table(report: ValidationReport) -> list[str]:
    lines = ["", "## Per-iteration evidence", "",
             ("The real run's iterations replayed through its policy and priced by the cost model (per real "
              "run: means over the repeats) "
              "(*repriced*: the same plans); *sim*: the twin simulation's own iterations. *between*: "
              "measured time between back-to-back iterations (sampling, bookkeeping), which the simulator "
              "does not model; *non-forward*: time inside the logged iterations outside the forward pass "
              "(draining arrivals, scheduling, inputs). Per kind: measured / predicted total (iterations)."),
             "",
             ("Decode excess: least squares of (measured - predicted) of decode-only iterations on a "
              "constant and the decode rows (ms per row). Other CPU: the share of the machine other "
              "processes used during the real run (it slows the real run, not the simulation)."),
             "",
             *_head(["policy", "load", "iterations real / sim", "replayed", "busy real s", "repriced s",
                     "real / repriced", "sim s", "real / sim", "between s (mean ms)", "non-forward s",
                     "per kind", "decode excess", "other CPU"])]
    by_key = {(r["policy"], r["load"]): r for r in report.rows}
    for e in report.evidence:
        lines.append(_row(_evidence_cells(e, by_key[(e["policy"], e["load"])])))
    return lines


def _evidence_cells(e: dict[str, Any], r: dict[str, Any]) -> list[str]:
    """One real run's evidence `e` (and its row `r` of the report) as the evidence table's cells."""
    kinds = "; ".join(f"{k} {v['ratio_total']:.2f} ({v['n']})" for k, v in sorted(e["kinds"].items()))
    between = (f"{e['real_between_s']:.2f} ({e['real_between_mean_s'] * 1e3:.2f})"
               if e["real_between_mean_s"] is not None else "0")
    nonfwd = ("n/a" if e["real_in_iteration_overhead_s"] is None
              else f"{e['real_in_iteration_overhead_s']:.2f}")
    other = "n/a" if r["foreign_cpu_share"] is None else f"{r['foreign_cpu_share']:.0%}"
    x = e.get("decode_excess")
    excess = "n/a" if x is None else f"{x['const_ms']:+.2f} ms {x['per_row_ms']:+.3f} ms/row"
    iterations = f"{e['iterations'] / e.get('repeats', 1):.0f} / {e['sim_iterations']}"
    return [e["policy"], f"{e['load']:g}", iterations, f"{e['replay_matched']}/{e['iterations']}",
            f"{e['real_busy_s']:.2f}", f"{e['repriced_busy_s']:.2f}",
            fmt_ratio(e["busy_ratio_real_over_repriced"]), f"{e['sim_busy_s']:.2f}",
            fmt_ratio(e["busy_ratio_real_over_sim"]), between, nonfwd, kinds, excess, other]
