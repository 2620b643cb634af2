"""Calibrating the roofline on a profile: its efficiencies (mfu, mbu, attention mfu, overhead) fitted to the
measured times of the profile's plans, to be applied to another GPU's published specs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.recorded_model import dtype_bytes_of, model_spec_from_shape
from simctl.costs.calibration import ROOFLINE_PARAMS
from simctl.costs.roofline import Roofline
from simctl.policies.plan import BatchPlan, Layout
from simctl.policies.seq import Seq


def plans_from_rows(df: pd.DataFrame) -> list[BatchPlan]:
    """A `BatchPlan` per profile row with its shape fields. Prefill segments are rebuilt as `num_segments`
    equal segments (q, c) with the row's attn_units and attn_kv_tokens: exact when the profiled segments are
    equal (a batch of equal prompts or chunks; padded rows), an equivalent otherwise. Decode rows with
    padding to the longest (decode_pad_kv > 0) come with decode sequences of contexts that give the row's
    decode_kv and decode_pad_kv (one at the longest context, the others sharing the rest)."""
    plans = []
    for row in df.itertuples(index=False):
        n = round(row.num_segments)
        qs: list[float] = []
        cs: list[float] = []
        if n > 0:
            K, U = row.attn_kv_tokens / n, row.attn_units / n  # K = c + q, U = q (c + q/2)
            q = K - math.sqrt(max(K * K - 2.0 * U, 0.0))
            qs, cs = [q] * n, [max(K - q, 0.0)] * n
        rows, kv, pad = round(row.decode_rows), round(row.decode_kv), round(getattr(row, "decode_pad_kv", 0))
        seqs: list[Seq] = []
        if pad > 0 and rows > 1:
            longest = (kv + pad) // rows - 1
            rest, k = divmod(kv - rows - longest, rows - 1)  # the other contexts: rest or rest + 1
            contexts = [longest] + [rest + (i < k) for i in range(rows - 1)]
            for i, c in enumerate(contexts):
                seqs.append(Seq(i, 0.0, max(c, 1), 1))
                seqs[-1].computed = seqs[-1].prefill_end = c
        plans.append(BatchPlan(seqs, [1] * len(seqs), Layout.PACKED, round(row.linear_tokens),
                               round(row.sampled_tokens), qs, cs,  # type: ignore[arg-type]
                               rows, kv))
    return plans


def calibrate_roofline(df: pd.DataFrame, train: np.ndarray, meta: dict[str, Any], gpu: str,
                       tile: int) -> tuple[dict[str, float], list[str], np.ndarray]:
    """Roofline efficiencies (in (0, 1]) and overhead (>= 0) fitted to the training rows.

    Returns (params, names of the parameters at a bound, predictions for every row)."""
    spec = model_spec_from_shape(meta["model"], meta["model_shape"])
    g = get_gpu(gpu)
    dtype_bytes = dtype_bytes_of(meta["dtype"])
    plans = plans_from_rows(df)
    y = df["time_s"].to_numpy(dtype=np.float64)
    ymed = float(np.median(y[train]))
    train_plans = [p for p, t in zip(plans, train) if t]
    y_train = y[train]

    def model(x: np.ndarray) -> Roofline:
        return Roofline(spec, g, dtype_bytes=dtype_bytes, mfu=float(x[0]), mbu=float(x[1]),
                        attn_mfu=float(x[2]), overhead_s=float(x[3]) * ymed, request_s=0.0, tile=tile)

    def fun(x: np.ndarray) -> np.ndarray:
        rf = model(x)
        t = np.fromiter((rf.iteration_time(p) for p in train_plans), np.float64, len(train_plans))
        return t / y_train - 1

    lb, ub = np.array([1e-4, 1e-4, 1e-4, 0.0]), np.array([1.0, 1.0, 1.0, np.inf])
    best = None
    for start in ((0.7, 0.75, 0.5), (0.3, 0.3, 0.3), (0.95, 0.95, 0.95), (0.05, 0.05, 0.05)):
        x0 = np.array([*start, 0.5 * float(y_train.min()) / ymed])
        sol = least_squares(fun, x0, bounds=(lb, ub), method="trf", x_scale=np.array([0.1, 0.1, 0.1, 0.1]),
                            diff_step=1e-7, ftol=1e-14, xtol=1e-14, gtol=1e-14, max_nfev=400)
        if best is None or sol.cost < best.cost:
            best = sol
    assert best is not None
    x = best.x
    params = {"mfu": float(x[0]), "mbu": float(x[1]), "attn_mfu": float(x[2]),
              "overhead_s": float(x[3]) * ymed}
    at_bound = [k for k, v, lo, hi in zip(ROOFLINE_PARAMS, x, lb, ub) if v <= lo * 1.001 or v >= hi * 0.999]
    rf = model(x)
    return params, at_bound, np.array([rf.iteration_time(p) for p in plans])

