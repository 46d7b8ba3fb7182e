"""Restore cost against the step: load_state_dict + first batch at step 10 and at step 10**7.

Run: ``python benchmarks/bench_restore.py``. Restore moves a cursor, so both should cost the same
(one batch of work); the table gives the median over repeats and their ratio.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import jaxloader as jl
from common import machine, save, table

N, BATCH, REPEATS = 10**9, 128, 30


class Computed:
    """10**9 records computed on demand (no storage)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"x": np.full(16, i % 251, np.uint8), "y": np.int64(i)}


def restore_seconds(step: int) -> float:
    loader = jl.DataLoader(Computed(), batch_size=BATCH, shuffle=True, seed=0, num_epochs=None,
                           process_index=0, process_count=1)
    state = {**loader.state_dict(), "step": step}
    start = time.perf_counter()
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def main() -> None:
    results = {}
    for step in (10, 10**7):
        times = [restore_seconds(step) for _ in range(REPEATS)]
        results[step] = statistics.median(times)
    rows = [(f"{s:,}", f"{t * 1e3:.2f} ms") for s, t in results.items()]
    print(f"restore + first batch, {N:,} records, batch {BATCH}; {machine()}")
    print(table(rows, ("step", "median time")))
    print(f"ratio step 10**7 / step 10: {results[10**7] / results[10]:.2f}")
    save("restore", {"machine": machine(), "median_seconds": results})


if __name__ == "__main__":
    main()
