"""Experiments over many runs: capacity, goodput, sweeps, and the papers' experiments."""
