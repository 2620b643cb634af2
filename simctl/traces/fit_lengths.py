"""Re-derive the length-profile parameters shipped in ``traces/lengths.py``: ``python -m traces.fit_lengths``.

Kept in the repo so the constants are reproducible rather than magic; the simulator never runs it.
The procedure is described in the ``simctl.traces.lengths`` docstring.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy.stats import spearmanr

from simctl.traces.lengths import (
    PAPER_QUANTILES,
    PROFILES,
    SHAREGPT_SPEARMAN,
    LengthProfile,
    Weibull,
    draw_untruncated,
)

_LN2 = math.log(2.0)
_K_NUM = math.log(math.log(10.0) / _LN2)  # Weibull: P90/median = (ln 10 / ln 2)^(1/k)


def weibull_from_quantiles(median: float, p90: float) -> Weibull:
    shape = _K_NUM / math.log(p90 / median)
    return Weibull(median / _LN2 ** (1.0 / shape), shape)


def generated_stats(z: np.ndarray, prof: LengthProfile) -> tuple[np.ndarray, float]:
    """Post-truncation (median, P90) of prompt and output, and their Spearman correlation."""
    p, o = draw_untruncated(z, prof)
    keep = p + o <= prof.max_total_tokens
    p, o = p[keep], o[keep]
    q = np.array([np.median(p), np.quantile(p, 0.9), np.median(o), np.quantile(o, 0.9)])
    return q, float(spearmanr(p, o).statistic)


def _profile_at(name: str, x: np.ndarray) -> LengthProfile:
    """x = (log of the untruncated prompt median, P90, output median, P90; copula rho)."""
    t = np.exp(x[:4])
    return dataclasses.replace(
        PROFILES[name],
        prompt=weibull_from_quantiles(t[0], t[1]),
        output=weibull_from_quantiles(t[2], t[3]),
        copula_rho=float(x[4]),
    )


def fit(name: str, samples: int = 1_000_000, iterations: int = 6) -> LengthProfile:
    """Newton iteration (finite-difference Jacobian, common random numbers) on the untruncated quantiles.

    Residuals: log(generated / table) for the four quantiles, and generated - measured Spearman for
    sharegpt (rho is pinned to 0 for arxiv, which has no measured correlation).
    """
    table = np.log(PAPER_QUANTILES[name])
    z = np.random.default_rng(0).standard_normal((samples, 2))
    fit_rho = name == "sharegpt"

    def residual(x: np.ndarray) -> np.ndarray:
        q, spearman = generated_stats(z, _profile_at(name, x))
        return np.append(np.log(q) - table, spearman - SHAREGPT_SPEARMAN if fit_rho else 0.0)

    x = np.append(table, 0.0)  # start from the table itself and independence
    for _ in range(iterations):
        r = residual(x)
        jac = np.eye(5)
        for j in range(5 if fit_rho else 4):
            step = 0.02
            dx = x.copy()
            dx[j] += step
            jac[:, j] = (residual(dx) - r) / step
        x = x - np.linalg.solve(jac, r)
    return _profile_at(name, x)


def main() -> None:
    for name in PAPER_QUANTILES:
        prof = fit(name)
        rounded = dataclasses.replace(
            prof,
            prompt=Weibull(round(float(prof.prompt.scale)), round(prof.prompt.shape, 4)),
            output=Weibull(round(float(prof.output.scale), 1), round(prof.output.shape, 4)),
            copula_rho=round(prof.copula_rho, 4),
        )
        z = np.random.default_rng(1).standard_normal((1_000_000, 2))
        q, spearman = generated_stats(z, rounded)
        err = q / np.array(PAPER_QUANTILES[name]) - 1.0
        print(f"{name}: prompt {rounded.prompt}  output {rounded.output}  rho {rounded.copula_rho}")
        print(
            f"  generated median/P90 prompt {q[0]:.0f}/{q[1]:.0f} output {q[2]:.0f}/{q[3]:.0f}; "
            f"rel. err {np.round(err * 100, 2)} %; spearman {spearman:.4f}"
        )


if __name__ == "__main__":
    main()
