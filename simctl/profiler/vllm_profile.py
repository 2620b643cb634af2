"""`profile_vllm()`: time the installed vLLM's own engine steps and write `profile.csv` + `meta.json`, the
files `simctl profile` writes for simctl's executor (the same columns: `simctl fit` fits them unchanged), so a
simulated vLLM (`--policy vllm-v1`) can price its plans with vLLM's per-step cost, host overhead included.

The timing runs in a child process (`python -m profiler.vllm_worker`, which says how steps are made, checked
and timed), the grid's served stage in another after it (`profiler.vllm_served`); vLLM starts its engine core
in that child, with its own CPU threads (as `simctl real --engine vllm` runs it). meta.json records engine
"vllm", vLLM's version, the device, the dtype and the engine's settings as it resolved them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from simctl.common.errors import InputError
from simctl.executor.model import DTYPES
from simctl.executor.vllm_runtime import require_vllm
from simctl.profiler.profile import progress_events, run_child, write_profile
from simctl.profiler.vllm_grid import VLLM_GRIDS, vllm_grid

_PACKAGES = Path(__file__).resolve().parents[2]  # on the child's path, wherever it starts


def profile_vllm(model_name: str, dtype: str, quick: bool, out_dir: str | Path, progress: bool = True, *,
                 grid: str | None = None, seed: int = 0) -> Path:
    """Profile vLLM's steps on `model_name` (a catalogue shape, random weights) on the CPU into `out_dir`;
    returns `out_dir`. grid: "full" (default), "quick" (`quick`) or "test". InputError without vLLM, for an
    unknown model or dtype, or a bad `out_dir`."""
    from simctl.catalogue.models import get_model, model_in_working_folder
    from simctl.results.output import check_out_dir

    require_vllm()
    grid = grid if grid is not None else ("quick" if quick else "full")
    if grid not in VLLM_GRIDS:
        raise InputError(f"grid {grid!r} unknown; choose one of {', '.join(VLLM_GRIDS)}")
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r} not supported; choose one of {', '.join(DTYPES)}")
    model_name = model_in_working_folder(model_name)  # the child finds the same config.json
    spec = get_model(model_name)
    out = check_out_dir(Path(out_dir))
    env = dict(os.environ)  # vLLM's CPU threads as a real vLLM run has them (no OMP settings of ours)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGES), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "simctl.profiler.vllm_worker", "--model", spec.name, "--dtype", dtype,
               "--grid", grid, "--seed", str(seed)]
    with progress_events(f"vLLM {spec.name} on cpu", progress) as on_event:
        rows, meta = run_child(command, env, on_event)
    if vllm_grid(grid).served:  # a fresh process: see simctl.profiler.vllm_served
        with progress_events(f"served vLLM {spec.name} on cpu", progress) as on_event:
            _, served = run_child([*command, "--stage", "served"], env, on_event)
        meta.update({k: x for k, x in served.items() if k.startswith("served_")})
    write_profile(out, rows, meta)
    return out
