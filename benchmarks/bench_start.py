"""A loader's start with workers: each ``"exec"`` worker forked from the worker starter
(``jaxloader/workers/starter.py``, Linux's default) against each exec'd by ``subprocess`` one by
one (as before it, and elsewhere than Linux), the two taking turns in one process run.

Run: ``python benchmarks/bench_start.py [--rounds N]``.

Per loader, a new one each time (what a restore into another worker count, a restart, or a
notebook cell run again makes): the seconds from ``DataLoader(...)`` to its first batch, and
from then to the end of ``close()``, and the CPU seconds the whole machine spent on it
(``os.times``' children do not see the starter's workers: ``/proc/stat`` does); 60,000 x 784
uint8 records, batch 128, shuffled, a per-record identity ``Map``. The starter's own start (once
a process and environment) is paid in a warm-up loader before the rounds, and reported apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import jaxloader as jl
from common import machine, save, table
from jaxloader.workers import starter


def identity(record: dict) -> dict:
    return record


def machine_cpu_s() -> float:
    """CPU seconds every process of the machine has run (user and system), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2]) / os.sysconf("SC_CLK_TCK")


def one_loader(source: jl.ArraySource, workers: int) -> dict:
    cpu, start = machine_cpu_s(), time.perf_counter()
    loader = jl.DataLoader(source, batch_size=128, shuffle=True, transforms=[jl.Map(identity)],
                           num_workers=workers, process_index=0, process_count=1)
    next(iter(loader))
    first = time.perf_counter()
    loader.close()
    end = time.perf_counter()
    return {"first_batch_s": first - start, "close_s": end - first,
            "cpu_s": machine_cpu_s() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    source = jl.ArraySource({"image": rng.integers(0, 255, (60_000, 784), dtype=np.uint8),
                             "label": rng.integers(0, 10, 60_000)})
    ways = {"exec'd one by one": False, "forked from the starter": True}
    warm = time.perf_counter()
    one_loader(source, 2)  # (the starter started; the page cache warm for both ways)
    warm_s = time.perf_counter() - warm
    results: dict = {"machine": machine(), "first_loader_with_the_starter_s": warm_s,
                     "cases": {}}
    rows = []
    for workers in (2, 8):
        runs: dict = {way: [] for way in ways}
        for r in range(args.rounds):
            for way in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                starter.AVAILABLE = ways[way]
                runs[way].append(one_loader(source, workers))
        starter.AVAILABLE = True
        results["cases"][workers] = runs
        med = {way: {k: statistics.median(run[k] for run in runs[way]) for k in runs[way][0]}
               for way in ways}
        for way in ways:
            rows.append((workers, way, f"{med[way]['first_batch_s']:.3f}",
                         f"{med[way]['close_s']:.3f}", f"{med[way]['cpu_s']:.2f}"))
        old, new = med["exec'd one by one"], med["forked from the starter"]
        first, cpu = old["first_batch_s"] / new["first_batch_s"], old["cpu_s"] / new["cpu_s"]
        rows.append((workers, "**ratio**", f"**{first:.1f}x**", "", f"**{cpu:.1f}x**"))
    print(machine())
    print(f"the first loader of the process (the starter's start included): {warm_s:.3f} s")
    print(table(rows, ("workers", "start", "to first batch (s)", "close (s)",
                       "machine CPU a loader (s)")))
    print("saved", save("start", results))


if __name__ == "__main__":
    main()
