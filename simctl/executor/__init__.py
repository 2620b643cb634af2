"""Running plans on a real model with torch: the random-weight model (`model`), the ragged executor with its
KV slab (`ragged`), and the process settings of the runtime (`runtime`). Used by the profiler and the real
engine alike."""
