"""Seeded arrival-time generators (renewal processes with i.i.d. inter-arrival gaps).

Convention: the stream is observed from t = 0 and the first request arrives after the first gap,
i.e. ``arrivals[i] = gaps[0] + ... + gaps[i]``. That makes the output a genuine stationary-start renewal
process, so ``n / arrivals[-1]`` estimates the rate without an off-by-one, and a run never starts with a
request already waiting at t = 0 that a real client would not have sent.

Both generators draw exactly ``n`` gaps from the caller's ``rng``, so the caller owns determinism: one
``np.random.default_rng(seed)`` shared with the length sampler reproduces a whole trace.
"""

from __future__ import annotations

import math

import numpy as np

from simctl.common.errors import InputError


def _check_count(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise InputError(f"number of arrivals must be a non-negative integer, got {n!r}")


def _check_qps(qps: float) -> None:
    if isinstance(qps, bool) or not isinstance(qps, (int, float, np.floating, np.integer)):
        raise InputError(f"qps must be a number, got {qps!r}")
    if not math.isfinite(qps) or qps <= 0:
        raise InputError(f"qps must be a finite number > 0, got {qps!r}")


def _check_cv(cv: float) -> None:
    if isinstance(cv, bool) or not isinstance(cv, (int, float, np.floating, np.integer)):
        raise InputError(f"cv must be a number, got {cv!r}")
    if not math.isfinite(cv) or cv <= 0:
        raise InputError(
            f"cv (coefficient of variation of inter-arrival gaps) must be finite and > 0, got {cv!r}"
        )


def poisson_arrivals(n: int, qps: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times (seconds, float64, non-decreasing) of a Poisson process of rate ``qps``."""
    _check_count(n)
    _check_qps(qps)
    return np.cumsum(rng.exponential(1.0 / qps, size=n))


def gamma_arrivals(n: int, qps: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times whose gaps are Gamma with mean ``1/qps`` and coefficient of variation ``cv``.

    Gamma(shape k, scale theta) has mean k*theta and CV 1/sqrt(k), so k = 1/cv^2 and theta = 1/(qps*k).
    cv > 1 is bursty (clustered arrivals), cv < 1 is smoother than Poisson, and cv = 1 is exactly Poisson:
    numpy draws Gamma(1) through its exponential sampler, so the stream equals ``poisson_arrivals``'s.
    """
    _check_count(n)
    _check_qps(qps)
    _check_cv(cv)
    shape = 1.0 / (cv * cv)
    return np.cumsum(rng.gamma(shape, 1.0 / (qps * shape), size=n))


def arrival_times(n: int, qps: float | None, arrival: str, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times of the named process ("poisson", or "gamma" with ``cv``) at ``qps``."""
    if qps is None:
        raise InputError("an arrival rate (--qps) is needed: the trace does not give arrival times")
    if math.isinf(qps):  # a closed loop's clients, all ready at once (vLLM bench's --request-rate inf)
        return np.zeros(n)
    if arrival == "poisson":
        return poisson_arrivals(n, qps, rng)
    return gamma_arrivals(n, qps, cv, rng)
