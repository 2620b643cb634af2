"""The sessions generator's trace name and its assumed mean think time (`simctl.traces.sessions`), here so
that the light `Workload` (its options' defaults) and the generator read one value."""

SESSION_TRACE = "sessions"
DEFAULT_THINK_S = 10.0  # an assumption: no published statistic (simctl.traces.sessions)
