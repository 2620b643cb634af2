"""A decode step against its memory floor, eager and from a CUDA graph (simctl issue 26): `rows` requests at
`context` tokens each, the step timed back to back as serving runs it (host included), beside the floor
(weights + the rows' KV over the device's copy bandwidth, measured here with a device-to-device copy).
`--compile` adds graphed steps whose layers' pieces went through `torch.compile` first (issue 41: the
twenty-odd small kernels a layer launches besides its GEMMs are what a graphed step spends beyond its floor):
`norms` compiles each layer's two RMSNorms and its MLP (the executor's attention untouched), `layers` each
whole decoder layer, attention function included.

    python3 bench/decode_floor.py --model mistral-7b --dtype bfloat16 --rows 32 --context 2047 \
        --compile norms,layers
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from simctl.catalogue.models import get_model
from simctl.executor.config import ExecutorConfig
from simctl.executor.model import build_model
from simctl.executor.ragged import RaggedExecutor, Segment


def copy_bandwidth(device: torch.device, gib: float = 4.0) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and written (median of 10)."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return 2 * src.numel() / statistics.median(times[2:])


def step_times(ex: RaggedExecutor, rows: int, context: int, grow: bool, steps: int) -> list[float]:
    """Seconds of each of `steps` decode steps (contexts fixed, or growing by one token a step)."""
    times = []
    for k in range(steps + 3):
        segs = [Segment(i, [1 + i], context + k * grow) for i in range(rows)]
        torch.cuda.synchronize(ex.device)
        t = time.perf_counter()
        ex.run(segs)
        torch.cuda.synchronize(ex.device)
        if k >= 3:  # the first steps pay graph capture and kernel selection
            times.append(time.perf_counter() - t)
    return times


COMPILE_LEVELS = ("norms", "layers")


def compile_parts(model, level: str | None) -> None:
    """`torch.compile` the decoder layers' pieces of `level` (COMPILE_LEVELS; None: none), in place, undoing
    any earlier level first."""
    for m in model.modules():
        m._compiled_call_impl = None
    torch._dynamo.reset()
    if level is None:
        return
    # dynamo guards on each layer's index (an int attribute that picks its KV slab): one graph per layer, so
    # the default limit of 8 would leave the later layers eager
    torch._dynamo.config.recompile_limit = len(model.model.layers) + 8
    for layer in model.model.layers:
        parts = [layer] if level == "layers" else [layer.input_layernorm, layer.post_attention_layernorm,
                                                   layer.mlp]
        for part in parts:
            part.compile()
    if level == "norms":
        model.model.norm.compile()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mistral-7b")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--context", type=int, default=2047)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--compile", default="", help=f"comma list of {', '.join(COMPILE_LEVELS)}: graphed steps "
                   "with those pieces compiled, after the eager and graphed rows")
    args = p.parse_args()
    levels = [c for c in args.compile.split(",") if c]
    if any(c not in COMPILE_LEVELS for c in levels):
        p.error(f"--compile takes {', '.join(COMPILE_LEVELS)}")
    model = build_model(get_model(args.model), "cuda", args.dtype, seed=0)
    device = model.device
    bandwidth = copy_bandwidth(device)
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    span = args.context + args.steps + 8
    print(f"{args.model} {args.dtype} on {torch.cuda.get_device_name(device)}; copy bandwidth "
          f"{bandwidth / 1e12:.2f} TB/s; weights {weights / 2**30:.2f} GiB")
    print("| mode | contexts | KV read / row | ms / step (median) | floor ms | step / floor |")
    print("|---|---|---:|---:|---:|---:|")
    for eager, level in [(True, None), (False, None)] + [(False, c) for c in levels]:
        name = "eager" if eager else "CUDA graph" + (f", compiled {level}" if level else "")
        try:
            compile_parts(model, level)
            ex = RaggedExecutor(model, args.rows, span, ExecutorConfig(eager=eager))
            for grow in (False, True):
                t0 = time.perf_counter()
                med = statistics.median(step_times(ex, args.rows, args.context, grow, args.steps))
                kv_read = args.context + 1 if eager else ex.graphs.shapes.kv(args.context + 1)
                floor = (weights + args.rows * kv_read * ex.kv_bytes_per_token) / bandwidth
                print(f"| {name} | {'growing' if grow else 'fixed'} | {kv_read} | {med * 1e3:.2f} | "
                      f"{floor * 1e3:.2f} | {med / floor:.2f} |  ({time.perf_counter() - t0:.0f} s with "
                      "warm-up)", flush=True)
            del ex
        except RuntimeError as e:  # a level that fails to compile is reported, the others still run
            print(f"| {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:200]} |", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
