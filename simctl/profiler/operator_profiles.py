"""Operator profiles in Vidur's profiling layout: per-layer operator times measured on a GPU, read for one
model, GPU and tensor-parallel degree (the fit that turns them into a cost model is
`profiler/fit_operators.py`).

    ROOT/compute/GPU/ORG/MODEL/mlp.csv        per-layer operator times (ms) vs num_tokens, per TP degree
    ROOT/compute/GPU/ORG/MODEL/attention.csv  attention kernel times, where measured
    ROOT/attention_GPU_*/attention.csv        the same, kept beside the layout (the reference data's A100 one)
    ROOT/network/GPU_*/all_reduce.csv         all-reduce times (ms) vs message bytes and workers

A catalogue GPU is found by its device-name word (`catalogue.gpus.catalogue_gpu_of`: folder `a100` is the
A100), a model by its per-layer shape (heads, KV heads, hidden, MLP width, gated MLP), which is all the
operators depend on: among equal shapes, the profile whose vocabulary is closest to the model's. """

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simctl.catalogue.gpus import catalogue_gpu_of
from simctl.catalogue.models import ModelSpec
from simctl.common.errors import InputError

# Operators per layer as Vidur names them, with how many times a Llama layer runs each: its two RMS norms are
# two columns, its two residual adds one column timed once.
LAYER_OPERATORS: dict[str, int] = {
    "input_layernorm": 1, "attn_pre_proj": 1, "attn_rope": 1, "attn_post_proj": 1,
    "post_attention_layernorm": 1, "mlp_up_proj": 1, "mlp_act": 1, "mlp_down_proj": 1, "add": 2,
}
ITERATION_OPERATORS = ("emb",)  # once per iteration
# Megatron TP: after the attention's O projection and after the MLP's down projection
ALL_REDUCES_PER_LAYER = 2
_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp")


@dataclass(frozen=True)
class OperatorProfile:
    """One model's operator times on one GPU at one TP degree (seconds, medians)."""

    root: Path
    gpu: str  # catalogue name
    model_dir: str  # GPU/ORG/MODEL under compute/
    tp: int
    tokens: np.ndarray  # measured token counts, increasing
    operators: dict[str, np.ndarray]  # name -> seconds per call at each count (per layer, or per iteration)
    vocab_size: int
    allreduce: tuple[np.ndarray, np.ndarray] | None  # (message bytes increasing, seconds); None at tp 1
    network: str | None  # the network folder the all-reduce came from
    # kind (prefill/decode), batch, q, kv, time_s per layer; None: not measured
    attention: pd.DataFrame | None
    attention_file: str | None


def _gpu_dir(root: Path, gpu: str) -> str:
    compute = root / "compute"
    if not compute.is_dir():
        raise InputError(f"{root}: not an operator profile directory (no compute/ folder: Vidur's layout "
                         "compute/GPU/ORG/MODEL/mlp.csv)")
    dirs = sorted(d.name for d in compute.iterdir() if d.is_dir())
    for d in dirs:
        if catalogue_gpu_of("cuda", d) == gpu:
            return d
    raise InputError(f"{root}: no profiles of {gpu} (compute/ has {', '.join(dirs) or 'nothing'})")


def _shape_of(csv: Path) -> dict[str, object]:
    row = pd.read_csv(csv, nrows=1)
    missing = [c for c in (*_SHAPE, "vocab_size") if c not in row]
    if missing:
        raise InputError(f"{csv}: lacks column(s) {', '.join(missing)}")
    return {c: row[c].iloc[0] for c in (*_SHAPE, "vocab_size")}


def _model_csv(root: Path, gpu_dir: str, model: ModelSpec) -> Path:
    want = (model.num_heads, model.num_kv_heads, model.hidden_size, model.intermediate_size,
            model.mlp == "gated")
    found = sorted((root / "compute" / gpu_dir).glob("*/*/mlp.csv"))
    match = [(abs(int(s["vocab_size"]) - model.vocab_size), str(p), p) for p in found
             if tuple((s := _shape_of(p))[c] for c in _SHAPE) == want]
    if not match:
        have = ", ".join(str(p.parent.relative_to(root / "compute" / gpu_dir)) for p in found) or "none"
        raise InputError(f"{root}: no {gpu_dir} profile of {model.name}'s layer shape ({model.num_heads} "
                         f"heads, {model.num_kv_heads} KV heads, hidden {model.hidden_size}, MLP "
                         f"{model.intermediate_size}); it has {have}")
    return min(match)[2]


def _medians(df: pd.DataFrame, key: str, names: tuple[str, ...]) -> pd.DataFrame:
    cols = {n: f"time_stats.{n}.median" for n in names}
    missing = [c for c in cols.values() if c not in df]
    if missing:
        raise InputError(f"lacks column(s) {', '.join(missing)}")
    return df.groupby(key)[list(cols.values())].median().rename(columns={v: k for k, v in cols.items()}) / 1e3


def _allreduce(root: Path, gpu_dir: str, tp: int) -> tuple[tuple[np.ndarray, np.ndarray], str] | None:
    """The all-reduce of `tp` GPUs within one node; an NVSwitch system (`_dgx`, the catalogue's SXM parts)
    before pairwise NVLink."""
    files = sorted((root / "network").glob(f"{gpu_dir}_*/all_reduce.csv"),
                   key=lambda p: not p.parent.name.endswith("_dgx"))
    for f in files:
        df = pd.read_csv(f)
        rows = df[(df["num_workers"] == tp) & (df["devices_per_node"] == tp)]
        if len(rows):
            t = _medians(rows, "size", ("all_reduce",))["all_reduce"]
            return (t.index.to_numpy(dtype=np.float64), t.to_numpy(dtype=np.float64)), f.parent.name
    return None


def _attention(root: Path, gpu_dir: str, model_csv: Path, model: ModelSpec, tp: int
               ) -> tuple[pd.DataFrame, str] | None:
    for f in [model_csv.with_name("attention.csv"),
              *sorted(root.glob(f"attention_{gpu_dir}_*/attention.csv"))]:
        if not f.is_file():
            continue
        df = pd.read_csv(f)
        df = df[(df["n_q_head"] == model.num_heads) & (df["n_kv_head"] == model.num_kv_heads)
                & (df["n_embd"] == model.hidden_size) & (df["num_tensor_parallel_workers"] == tp)]
        if not len(df):
            continue
        reshape = (df["time_stats.attn_input_reshape.median"].fillna(0)
                   + df["time_stats.attn_output_reshape.median"].fillna(0))
        prefill = df["is_prefill"].astype(bool)
        kernel = np.where(prefill, df["time_stats.attn_prefill.median"], df["time_stats.attn_decode.median"])
        out = pd.DataFrame({"kind": np.where(prefill, "prefill", "decode"), "batch": df["batch_size"],
                            "q": np.where(prefill, df["prefill_chunk_size"], 1), "kv": df["kv_cache_size"],
                            "time_s": (kernel + reshape) / 1e3})
        return (out[np.isfinite(out["time_s"]) & (out["time_s"] > 0)].reset_index(drop=True),
                str(f.relative_to(root)))
    return None


def load_operator_profile(root: str | Path, model: ModelSpec, gpu: str, tp: int) -> OperatorProfile:
    """`model`'s operator times on catalogue GPU `gpu` at `tp` from a directory in Vidur's layout; InputError
    (one line) when the directory lacks the GPU, the model's shape, the TP degree or its all-reduce."""
    root = Path(root)
    gpu_dir = _gpu_dir(root, gpu)
    csv = _model_csv(root, gpu_dir, model)
    df = pd.read_csv(csv)
    degrees = sorted(int(v) for v in df["num_tensor_parallel_workers"].unique())
    if tp not in degrees:
        raise InputError(
            f"{csv.relative_to(root)}: no times at tp={tp} (it has tp {', '.join(map(str, degrees))})")
    try:
        ops = _medians(df[df["num_tensor_parallel_workers"] == tp], "num_tokens",
                       (*LAYER_OPERATORS, *ITERATION_OPERATORS))
    except InputError as e:
        raise InputError(f"{csv.relative_to(root)}: {e}") from None
    allreduce = _allreduce(root, gpu_dir, tp) if tp > 1 else None
    if tp > 1 and allreduce is None:
        raise InputError(f"{root}: no all-reduce of {tp} GPUs in one node measured for {gpu_dir} "
                         f"(network/{gpu_dir}_*/all_reduce.csv), so tp={tp} cannot be priced")
    attention = _attention(root, gpu_dir, csv, model, tp)
    return OperatorProfile(
        root, gpu, str(csv.parent.relative_to(root / "compute")), tp, ops.index.to_numpy(dtype=np.int64),
        {k: ops[k].to_numpy(dtype=np.float64) for k in ops.columns}, int(_shape_of(csv)["vocab_size"]),
        allreduce[0] if allreduce else None, allreduce[1] if allreduce else None,
        attention[0] if attention else None, attention[1] if attention else None)
