"""Predictions checked against real runs: simctl's engine and vLLM, side by side."""
