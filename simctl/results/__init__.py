"""What a run yields: records, metrics, SLOs, saturation, and all-or-nothing output files."""
