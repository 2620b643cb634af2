"""The real-execution child process: `python -m simctl.engine.worker --config JSON --result PATH [--out DIR |
--probe]`.

`engine.real.real_main` starts it with OMP_WAIT_POLICY=PASSIVE and OMP_NUM_THREADS / MKL_NUM_THREADS set
(OpenMP reads them once, when torch starts it). It serves the run (`engine.real.run_real`), writes the output
folder if asked, and leaves one JSON object in the result file:
  {"event": "done", "summary": {...}}
  {"event": "done", "probe": {...}}    with --probe: the device as the run would find it
  (`simctl.engine.real.DeviceProbe`) {"event": "error", "input": true|false, "message": "..."}     then exit 2
  (input) or 1
Everything it prints goes to the parent's captured stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path


def _write(path: Path, msg: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(msg, allow_nan=False), encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simctl.engine.worker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--probe", action="store_true")
    args = parser.parse_args(argv)

    from simctl.common.errors import InputError

    try:
        from dataclasses import asdict

        from simctl.engine.real import RealConfig, measure_device, run_real, write_real

        config = RealConfig.from_dict(json.loads(args.config))
        if args.probe:
            _write(args.result, {"event": "done", "probe": asdict(measure_device(config))})
            return 0
        run = run_real(config, threads_env=True)
        if args.out is not None:
            write_real(run, args.out)
        _write(args.result, {"event": "done", "summary": run.summary})
        return 0
    except InputError as e:
        _write(args.result, {"event": "error", "input": True, "message": str(e)})
        return 2
    except Exception as e:  # noqa: BLE001 - reported to the parent with the traceback on stderr
        traceback.print_exc()
        _write(args.result, {"event": "error", "input": False, "message": f"{type(e).__name__}: {e}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
