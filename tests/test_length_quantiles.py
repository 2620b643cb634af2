"""The length profiles' Weibull quantile without scipy (issue 42): `math.erfc` gives the cumulative hazard,
and scipy's `log_ndtr`, which drew the goldens, decides only a quantile within rounding of an integer, so
every length is the one scipy's hazard gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import log_ndtr
from scipy.stats import norm

from simctl.traces import lengths
from simctl.traces.lengths import PROFILES, Weibull

DISTS = [d for p in PROFILES.values() for d in (p.prompt, p.output)]


def _scipy_tokens(z: np.ndarray, dist: Weibull) -> np.ndarray:
    return np.maximum(np.ceil(dist.scale * (-log_ndtr(-z)) ** (1.0 / dist.shape)), 1.0).astype(np.int64)


def test_fast_hazard_is_scipys_to_a_few_ulp() -> None:
    z = np.concatenate([np.linspace(-lengths._FAST_Z, lengths._FAST_Z, 400_001),
                        np.random.default_rng(0).standard_normal(400_000)])
    exact = -log_ndtr(-z)
    gap = np.abs(lengths._fast_hazard(z) - exact) / exact
    # a hundred times inside the margin the fast path trusts
    assert gap.max() <= lengths._NEAR_INTEGER / 100


@settings(max_examples=60, deadline=None)
@given(dist=st.sampled_from(DISTS),
       z=st.lists(st.floats(-40.0, 40.0, allow_nan=False), min_size=1, max_size=50))
def test_lengths_are_scipys_for_any_normal_score(dist: Weibull, z: list[float]) -> None:
    scores = np.asarray(z)
    assert np.array_equal(lengths._weibull_tokens(scores, dist), _scipy_tokens(scores, dist))


@pytest.mark.parametrize("nudge", [1.0 - 1e-12, 1.0 + 1e-12])
def test_a_quantile_at_an_integer_is_left_to_scipy(monkeypatch, nudge: float) -> None:
    # normal scores whose exact quantile is (about) an integer 1..5000: a fast hazard off by a relative 1e-12,
    # less than the margin, would round half of them to the other side; the guard hands them to scipy
    dist = PROFILES["sharegpt"].prompt
    whole = np.arange(1.0, 5001.0)
    z = norm.isf(np.exp(-((whole / dist.scale) ** dist.shape)))
    fast = lengths._fast_hazard
    monkeypatch.setattr(lengths, "_fast_hazard", lambda s: fast(s) * nudge)
    assert np.array_equal(lengths._weibull_tokens(z, dist), _scipy_tokens(z, dist))
