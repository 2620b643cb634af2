"""A profile on disk (profile.csv and meta.json, from `simctl profile`) read and checked, and its rows split
into training and held-out sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simctl.catalogue.recorded_model import dtype_bytes_of, model_spec_from_shape
from simctl.common.errors import InputError

PROFILE_COLUMNS: tuple[str, ...] = (
    "kind", "batch_size", "linear_tokens", "sampled_tokens", "num_segments", "attn_units", "attn_kv_tokens",
    "decode_rows", "decode_kv", "decode_pad_kv", "eager_step", "q", "c", "reps", "time_s", "time_p10_s",
    "time_p90_s",
)



NUMERIC_COLUMNS = PROFILE_COLUMNS[1:]



# Columns a profile may lack (written by an older profiler): derived in `load_profile`.
OPTIONAL_COLUMNS: tuple[str, ...] = ("decode_pad_kv", "eager_step")



def _numbers(raw: pd.Series, col: str, csv: Path) -> pd.Series:
    """A numeric column of profile.csv as float64: finite, not negative (time_s and reps: positive)."""
    num = pd.to_numeric(raw, errors="coerce").astype(np.float64)
    bad = ~np.isfinite(num.to_numpy())
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(f"profile {csv}: line {i + 2}: {col} = {raw.iloc[i]!r} is not a finite number")
    if col not in ("time_s", "reps"):
        neg = num.to_numpy() < 0.0
        if neg.any():
            i = int(np.argmax(neg))
            raise InputError(f"profile {csv}: line {i + 2}: {col} = {raw.iloc[i]!r} is negative")
    else:
        nonpos = num.to_numpy() <= 0
        if nonpos.any():
            i = int(np.argmax(nonpos))
            raise InputError(f"profile {csv}: line {i + 2}: {col} = {raw.iloc[i]!r} must be > 0")
    return num


def _read_meta(meta_path: Path) -> dict[str, Any]:
    """meta.json, checked for what a fit reads of it."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"profile {meta_path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise InputError(f"profile {meta_path}: not a JSON object")
    for key in ("model", "model_shape", "dtype"):
        if key not in meta:
            raise InputError(f"profile {meta_path}: missing key {key!r}")
    if not isinstance(meta["model"], str) or not meta["model"]:
        raise InputError(f"profile {meta_path}: model must be a non-empty string")
    try:
        model_spec_from_shape(meta["model"], meta["model_shape"])
        dtype_bytes_of(meta["dtype"])
    except InputError as e:
        raise InputError(f"profile {meta_path}: {e}") from None
    return meta


def load_profile(profile_dir: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """profile.csv as a validated frame and meta.json as a dict; InputError (one line, naming the file)."""
    d = Path(profile_dir)
    if not d.is_dir():
        raise InputError(f"profile {d}: no such directory")
    csv, meta_path = d / "profile.csv", d / "meta.json"
    for p in (csv, meta_path):
        if not p.is_file():
            raise InputError(f"profile {d}: {p.name} is missing")
    try:
        df = pd.read_csv(csv, dtype={"kind": str}, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise InputError(f"profile {csv}: empty file") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as e:
        raise InputError(f"profile {csv}: cannot parse ({str(e).strip().splitlines()[0]})") from None
    if "decode_pad_kv" not in df.columns and {"kind", "decode_rows", "decode_kv", "c"} <= set(df.columns):
        # an older profile: its ragged decode rows give their longest context as c (hybrids' decode rows all
        # had one context: no padding)
        rows, kv, c = (pd.to_numeric(df[k], errors="coerce") for k in ("decode_rows", "decode_kv", "c"))
        df["decode_pad_kv"] = np.where(df["kind"].astype(str).str.strip() == "decode",
                                       np.maximum(rows * (c + 1) - kv, 0), 0)
    meta = _read_meta(meta_path)
    if "eager_step" not in df.columns and "kind" in df.columns:
        # written before the column: eager throughout, or (decode graphs recorded in meta.json) every row but
        # the decode steps, which ran from graphs
        graphed = bool((meta.get("executor_config") or {}).get("cuda_graphs"))
        df["eager_step"] = (df["kind"].astype(str).str.strip() != "decode").astype(int) if graphed else 0
    missing = [c for c in PROFILE_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"profile {csv}: missing column(s) {', '.join(missing)}")
    if df.empty:
        raise InputError(f"profile {csv}: no rows")
    df = df[list(PROFILE_COLUMNS)].copy()
    kinds = df["kind"].astype(str).str.strip()
    bad = kinds.eq("") | df["kind"].isna()
    if bad.any():
        raise InputError(f"profile {csv}: line {int(np.argmax(bad.to_numpy())) + 2}: empty kind")
    df["kind"] = kinds
    for col in NUMERIC_COLUMNS:
        df[col] = _numbers(df[col], col, csv)
    return df, meta



def check_holdout(holdout: float) -> None:
    """InputError unless `holdout` is a share of rows `split_holdout` can hold out."""
    if not isinstance(holdout, (int, float)) or isinstance(holdout, bool) or not 0 <= holdout < 1:
        raise InputError(f"holdout must be a fraction in [0, 1), got {holdout!r}")


def split_holdout(kinds: np.ndarray, holdout: float, seed: int) -> np.ndarray:
    """Boolean mask of held-out rows: round(holdout x n) random rows of each kind (seeded), leaving every kind
    at least one training row."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(kinds), dtype=bool)
    for kind in sorted(set(kinds.tolist())):
        idx = np.flatnonzero(kinds == kind)
        n = min(round(holdout * len(idx)), len(idx) - 1)
        if n > 0:
            mask[rng.permutation(idx)[:n]] = True
    return mask

