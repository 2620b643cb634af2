"""The serving core shared by the simulator, the real engine and the replay of real runs: the one replica loop
(`loop`), the inbox requests reach it through (`inbox`), the per-iteration bookkeeping (`bookkeeping`) and the
constant-memory records (`records`). Nothing here imports SimPy or torch: what executes a plan and how time
passes are parameters (`loop.Backend`, `loop.Clock`)."""
