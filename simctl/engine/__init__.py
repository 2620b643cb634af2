"""Real execution: the simulator's policies driving a real torch model (issue 4, `simctl real`).

- `simctl.engine.serve`: the serving loop (`Engine`), prompt ids, the run-alone reference (`generate_alone`).
- `engine.deployment`: a run's deployment, one engine or a prefill and a decode instance (`engine.disagg`),
  summarised as the simulated cluster's.
- `engine.real`: `RealConfig`, sizing, `run_real` (in process), `real_main` (child process + output files).
- `simctl.engine.worker`: the child process.

Importing this package does not import torch: `simctl.engine.serve` and `run_real` do, when called.
"""
