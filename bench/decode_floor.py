"""A decode step against its memory floor, eager and from a CUDA graph (simctl issue 26): `rows` requests at
`context` tokens each, the step timed back to back as serving runs it (host included), beside the floor
(weights + the rows' KV over the device's copy bandwidth, measured here with a device-to-device copy).

    python3 bench/decode_floor.py --model mistral-7b --dtype bfloat16 --rows 32 --context 2047
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from catalogue.models import get_model
from executor.config import ExecutorConfig
from executor.model import build_model
from executor.ragged import RaggedExecutor, Segment


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mistral-7b")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--context", type=int, default=2047)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    model = build_model(get_model(args.model), "cuda", args.dtype, seed=0)
    device = model.device
    bandwidth = copy_bandwidth(device)
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    span = args.context + args.steps + 8
    print(f"{args.model} {args.dtype} on {torch.cuda.get_device_name(device)}; copy bandwidth "
          f"{bandwidth / 1e12:.2f} TB/s; weights {weights / 2**30:.2f} GiB")
    print("| mode | contexts | KV read / row | ms / step (median) | floor ms | step / floor |")
    print("|---|---|---:|---:|---:|---:|")
    for eager in (True, False):
        ex = RaggedExecutor(model, args.rows, span, ExecutorConfig(eager=eager))
        for grow in (False, True):
            med = statistics.median(step_times(ex, args.rows, args.context, grow, args.steps))
            kv_read = args.context + 1 if eager else ex.graphs.shapes.kv(args.context + 1)
            floor = (weights + args.rows * kv_read * ex.kv_bytes_per_token) / bandwidth
            print(f"| {'eager' if eager else 'CUDA graph'} | {'growing' if grow else 'fixed'} | {kv_read} | "
                  f"{med * 1e3:.2f} | {floor * 1e3:.2f} | {med / floor:.2f} |", flush=True)
        del ex
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
