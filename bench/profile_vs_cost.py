"""A measured simctl profile against another cost model's price of the same iterations, per kind: e.g. an H100
profile of llama-2-7b against the fit of the reference operator profiles (kernels summed, the execution
mode's step overheads added), to see what whole served steps cost beyond their kernels (simctl issue 26).

    simctl fit ../shared/reference/gpu_profiles --model llama-2-7b --gpu h100 --out /tmp/op-h100
    python bench/profile_vs_cost.py profiles/h100-llama /tmp/op-h100/cost_model.json

Each row is priced from its recorded features by the cost model's form, plus its step overheads' host terms
and launch floor (a row records its batch and sampled rows, not its requests' prompts, so a per-new-request
term is not priced). Prints measured / priced per kind (median, min..max) and overall.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def priced(df: pd.DataFrame, cost) -> np.ndarray:
    """Seconds `cost` (a `Fitted`) gives each profile row."""
    from simctl.profiler.fit_coefficients import predict

    gpu = predict(cost, df)
    steps = cost.step_overheads
    if steps is None:
        return gpu
    host = np.array([steps.host(int(b), int(r)) for b, r in zip(df["batch_size"], df["sampled_tokens"])])
    return np.maximum(gpu + host, host + steps.launch_floor_s)


def ratios(df: pd.DataFrame, cost) -> pd.DataFrame:
    """Measured / priced per kind: rows, median, min, max (and "overall")."""
    r = df.assign(ratio=df["time_s"].to_numpy() / priced(df, cost))
    table = r.groupby("kind")["ratio"].agg(["count", "median", "min", "max"])
    table.loc["overall"] = [len(r), r["ratio"].median(), r["ratio"].min(), r["ratio"].max()]
    return table


def main(argv: list[str] | None = None) -> int:
    from simctl.catalogue.recorded_model import model_spec_from_shape
    from simctl.common.errors import InputError
    from simctl.costs.fitted import Fitted
    from simctl.profiler.profile_data import load_profile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile", type=Path, help="a folder of `simctl profile` (profile.csv, meta.json)")
    p.add_argument("cost", type=Path, help="a cost_model.json of the same model")
    args = p.parse_args(argv)
    try:
        df, meta = load_profile(args.profile)
        cost = Fitted.load(args.cost)
        cost.check_model(model_spec_from_shape(meta["model"], meta["model_shape"]))
    except InputError as e:
        print(f"profile_vs_cost: {e}", file=sys.stderr)
        return 2
    print(f"{meta['model']} profiled on {meta.get('device_name')} against {args.cost} "
          f"({cost.meta.get('device_name', '?')}); measured / priced per kind:\n")
    print("| kind | rows | median | min | max |\n|---|---:|---:|---:|---:|")
    for kind, row in ratios(df, cost).iterrows():
        print(f"| {kind} | {int(row['count'])} | {row['median']:.3f} | {row['min']:.3f} | {row['max']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
