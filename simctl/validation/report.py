"""What a validation writes: its report's table, markdown, figure and JSON, all or none."""

from __future__ import annotations

from simctl.plots.validation import cdf_figure
from simctl.results.output import json_text, write_files
from simctl.results.validation_report import ValidationReport, jsonable, markdown


def write_report(report: ValidationReport) -> None:
    """validation.csv, validation.md, validation.png and validation.json into `report.out`, all or none."""
    frame = report.frame()
    md = markdown(report)
    text = json_text(jsonable(report.to_json()))
    write_files(report.out, {
        "validation.csv": lambda p: frame.to_csv(p, index=False),
        "validation.md": lambda p: p.write_text(md, encoding="utf-8"),
        "validation.png": lambda p: cdf_figure(report, p),
        "validation.json": lambda p: p.write_text(text, encoding="utf-8"),
    }, "the validation report")
