"""``num_workers="auto"`` against the best fixed count, and against Grain's
``pick_performance_config``, on two cases, in one process run.

    python benchmarks/bench_autotune.py [--auto-s 30] [--fixed-s 4]

Cases (batches taken as fast as they come, no model):

- ``cpu``: a CPU-heavy transform, ``Map`` spinning 0.4 ms of CPU a record, batches of 32 small
  records from an ``ArraySource``;
- ``reads``: a source whose reads wait 2 ms a record off the CPU (``time.sleep``: storage),
  batches of 16.

For each: the rate of each fixed count of the grid (0, 1, 2, 4, 8, 16, 32: the workers started
and 10 batches taken before the clock, then ``--fixed-s`` seconds); ``num_workers="auto"`` from
``iter()`` for ``--auto-s`` seconds: when its rate over 2 s first reached 90% of the best fixed
count's, its count and rate at the end; Grain's ``pick_performance_config`` (its count, and
Grain's rate with it, ``mp_prefetch``, its reads on 16 threads a worker); and jaxloader's
rate at Grain's count, one record after the other and with ``read_threads=16``. Needs Grain
(Python 3.11 here). Results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

import jaxloader as jl

ONE = {"process_index": 0, "process_count": 1}
GRID = (0, 1, 2, 4, 8, 16, 32)
THREADS = 16  # read_threads= against Grain's threads (its default ReadOptions)


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def heavy(record: dict) -> dict:
    spin(0.0004)
    return record


class WaitingSource:
    """Reads that wait 2 ms a record (storage)."""

    def __len__(self) -> int:
        return 1 << 24

    def __getitem__(self, i: int) -> dict:
        time.sleep(0.002)
        return {"x": np.full(4, i, np.float32)}


def case(name: str) -> tuple:
    """(source, transforms, batch size) of a case."""
    if name == "cpu":
        return (jl.ArraySource({"x": np.zeros((1 << 20, 4), np.float32)}), [jl.Map(heavy)],
                32)
    return WaitingSource(), [], 16


def loader(name: str, workers: int | str, threads: int = 1) -> jl.DataLoader:
    source, transforms, batch = case(name)
    return jl.DataLoader(source, batch_size=batch, transforms=transforms, num_workers=workers,
                         read_threads=threads, num_epochs=None, **ONE)


def rate(it: Any, seconds: float) -> float:
    """Batches a second of ``it`` over ``seconds``, after 10 (the start)."""
    for _ in range(10):
        next(it)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        next(it)
        n += 1
    return n / (time.perf_counter() - start)


def fixed_rate(name: str, workers: int, seconds: float, threads: int = 1) -> float:
    with loader(name, workers, threads) as dl:
        return rate(iter(dl), seconds)


def auto_run(name: str, seconds: float, best: float) -> dict:
    with loader(name, "auto") as dl:
        start = time.perf_counter()
        it = iter(dl)
        times, counts = [], []
        while time.perf_counter() - start < seconds:
            next(it)
            times.append(time.perf_counter() - start)
            counts.append(dl.num_workers)
    t = np.asarray(times)
    reached = None
    for i, end in enumerate(t):
        j = np.searchsorted(t, end - 2.0)
        if end >= 2.0 and (i - j) / 2.0 >= 0.9 * best:
            reached = float(end)
            break
    last = t >= seconds - 5.0
    return {"reached_90pct_s": reached, "final_workers": counts[-1],
            "final_rate": float(last.sum() / 5.0), "counts_seen": sorted(set(counts))}


def grain_run(name: str, seconds: float) -> dict:
    import grain
    from absl import flags
    from grain import experimental

    flags.FLAGS.mark_as_parsed()  # Grain's workers read absl flags; we pass none

    source, transforms, batch = case(name)
    ds = grain.MapDataset.source(source)
    for t in transforms:
        ds = ds.map(t.fn)
    ds = ds.batch(batch).to_iter_dataset()
    config = experimental.pick_performance_config(ds, ram_budget_mb=4096, max_workers=None,
                                                  max_buffer_size=None)
    workers = config.multiprocessing_options.num_workers
    it = iter(ds.mp_prefetch(config.multiprocessing_options) if workers else ds)
    return {"workers": workers, "rate": rate(it, seconds)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--auto-s", type=float, default=30.0)
    parser.add_argument("--fixed-s", type=float, default=4.0)
    parser.add_argument("--cases", default="cpu,reads")
    args = parser.parse_args()
    results = {}
    for name in args.cases.split(","):
        grid = {n: fixed_rate(name, n, args.fixed_s) for n in GRID}
        best_n = max(grid, key=grid.__getitem__)
        auto = auto_run(name, args.auto_s, grid[best_n])
        grain = grain_run(name, args.fixed_s)
        at_grains = grid.get(grain["workers"]) or fixed_rate(name, grain["workers"],
                                                              args.fixed_s)
        threaded = fixed_rate(name, grain["workers"], args.fixed_s, threads=THREADS)
        results[name] = {"grid": grid, "best": best_n, "auto": auto, "grain": grain,
                         "jaxloader_at_grains_count": at_grains,
                         "jaxloader_at_grains_count_threads": threaded}
        print(f"{name}: grid " + ", ".join(f"{n}: {r:.1f}" for n, r in grid.items())
              + f" batches/s (best {best_n})")
        print(f"  auto: 90% of the best after {auto['reached_90pct_s']} s; at the end "
              f"{auto['final_workers']} workers, {auto['final_rate']:.1f} batches/s "
              f"({auto['final_rate'] / grid[best_n]:.0%} of the best); counts {auto['counts_seen']}")
        print(f"  Grain pick_performance_config: {grain['workers']} workers, Grain "
              f"{grain['rate']:.1f} batches/s; jaxloader with that count {at_grains:.1f}, "
              f"and with read_threads={THREADS} {threaded:.1f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
