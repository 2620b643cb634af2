"""The text `simctl fit` prints: the fitted coefficients and curves, and the held-out error per kind."""

from __future__ import annotations

import math

from simctl.costs.fit_results import FitReport
from simctl.costs.fitted_form import CURVES


def pct(v: float) -> str:
    return f"{100 * v:6.2f}%"



def fmt_s(v: float) -> str:
    """Seconds in an engineering unit (ms, us, ns, ps)."""
    if not math.isfinite(v):
        return "inf"
    if v == 0:
        return "0"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(v) >= f:
            return f"{v / f:.4g} {unit}"
    return f"{v / 1e-12:.4g} ps"



UNITS = {"overhead_s": "per iteration",
          "attn_unit_s": "per q(c+q/2)", "attn_kv_token_s": "per c+q token", "attn_segment_s": "per segment",
          "decode_pad_token_s": "per KV padding token", "decode_row_s": "per decode row (1 KV)",
          "eager_step_s": "per eager step"}



def format_report(report: FitReport) -> str:
    """A plain-text table of the fit: errors per kind, tile, coefficients, files written."""
    lines = [
        (f"profile   {report.profile_dir}  ({report.rows} rows: {report.train_rows} fitted, "
         f"{report.holdout_rows} held out)"),
        f"model     {report.model} on {report.device}",
        f"tile      {report.tile}   (training RMS rel. error by tile: "
        + ", ".join(f"{t}: {100 * e:.2f}%" for t, e in report.tile_errors.items()) + ")",
        "",
        f"{'kind':<16}{'held out':>9}{'MAPE':>9}{'P95':>9}   {'fitted':>7}{'MAPE':>9}{'P95':>9}",
    ]
    kinds = [k for k in sorted(set(report.train) | set(report.holdout)) if k != "overall"] + ["overall"]
    for k in kinds:
        h, t = report.holdout.get(k), report.train.get(k)
        hs = f"{h.n:>9}{pct(h.mape):>9}{pct(h.p95):>9}" if h else f"{0:>9}{'-':>9}{'-':>9}"
        ts = f"{t.n:>7}{pct(t.mape):>9}{pct(t.p95):>9}" if t else f"{0:>7}{'-':>9}{'-':>9}"
        lines.append(f"{k:<16}{hs}   {ts}")
    lines += ["", f"{'coefficient':<20}{'value':>11}  {'':<22}{'std. error':>12}"]
    for k, v in report.coefficients.items():
        se = report.stderr.get(k, math.nan)
        if k in report.not_covered:
            note = "not covered by the profile"
        elif not math.isfinite(se):
            note = "unidentified"
        elif v > se:
            note = f"±{se / v:.2%}"
        else:
            note = f"±{fmt_s(se)}"
        lines.append(f"{k:<20}{fmt_s(v):>11}  {UNITS[k]:<22}{note:>12}")
    if any(not math.isfinite(v) for v in report.stderr.values()):
        lines.append("(unidentified: the profile cannot tell this coefficient apart from others; only their "
                     "combination is determined, and predictions of shapes like the profiled ones are "
                     "unaffected)")
    for name, knots in report.curves.items():
        lines.append("")
        lines.append(f"{name} curve ({CURVES[name][0]} -> ms), {len(knots)} knots:")
        cells = [f"{n}: {v * 1e3:.4g}" for n, v in knots]
        for i in range(0, len(cells), 8):
            lines.append("  " + ", ".join(cells[i:i + 8]))
    if report.roofline is not None:
        r = report.roofline
        p = r.params
        ov = r.holdout.get("overall") or r.train.get("overall")
        lines += ["", f"roofline  {r.gpu}: mfu {p['mfu']:.4f}  mbu {p['mbu']:.4f}  "
                      f"attn_mfu {p['attn_mfu']:.4f}  "
                      f"overhead {p['overhead_s'] * 1e3:.4g} ms  (tile {r.tile})"
                      + (f"; at bound: {', '.join(r.at_bound)}" if r.at_bound else "")]
        if ov is not None:
            which = "held-out" if r.holdout.get("overall") else "training"
            lines.append(f"          calibrated roofline {which} MAPE {pct(ov.mape).strip()}, "
                         f"P95 {pct(ov.p95).strip()}")
    if report.step_overheads is not None and report.served:
        lines += ["", f"served    host terms {report.step_overheads.describe()}",
                  f"{'batch':>7}{'served ms':>11}{'model ms':>10}{'profile ms':>12}{'calibrated ms':>15}"]
        lines += [f"{r['batch']:>7}{r['served_ms']:>11.3f}{r['model_ms']:>10.3f}{r['profile_ms']:>12.3f}"
                  f"{r['calibrated_ms']:>15.3f}" for r in report.served]
    lines.append("")
    written = (report.cost_model_path, report.plot_path, report.roofline.path if report.roofline else None)
    lines.append("wrote     " + ", ".join(str(p) for p in written if p is not None))
    return "\n".join(lines)

