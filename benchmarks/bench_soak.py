"""Soak: does anything grow over many epochs? 2 workers, memory sampled after every epoch.

Run: ``python benchmarks/bench_soak.py [--small-epochs 200] [--large-epochs 50]``.

Cases (bench_workers.py's data):
- small: 60,000 x (784 uint8 + label), batch 128, shuffled, per-record identity Map;
- large: 2,048 records of 224x224x3 uint8 + label, batch 64, shuffled, no transform.

After each epoch it samples the resident memory of the main process and of each worker
(``VmRSS``, and its private part ``RssAnon``) and the shared memory the loader holds (its memory
files, or its segments in ``/dev/shm``). Growth is reported per 10 epochs after the first epoch
(a least-squares slope, so one noisy sample does not decide it), and over the second half alone.
Goal: under 1 MiB per 10 epochs. A worker's RSS also counts the pages of the shared source it has
mapped so far, which grow towards the source's size as shuffled epochs touch them: the private
part (``RssAnon``) is what a leak would grow.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import jaxloader as jl
from common import machine, save, shared_bytes, table

WORKERS = 2
MIB = 2**20


def identity(record: dict) -> dict:
    return record


def status_bytes(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def soak(source: jl.ArraySource, batch: int, epochs: int, transforms: list) -> dict:
    samples = []
    start = time.perf_counter()
    with jl.DataLoader(source, batch_size=batch, shuffle=True, seed=0, transforms=transforms,
                       num_workers=WORKERS, process_index=0, process_count=1) as loader:
        pids = loader.worker_pids
        for epoch in range(epochs):
            for b in loader:
                del b
            main = status_bytes(os.getpid())
            workers = [status_bytes(p) for p in pids]
            samples.append({
                "epoch": epoch + 1,
                "main_rss": main["VmRSS"], "main_private": main["RssAnon"],
                "worker_rss": [w["VmRSS"] for w in workers],
                "worker_private": [w["RssAnon"] for w in workers],
                "shared": shared_bytes(os.getpid()),
            })
    return {"epochs": epochs, "seconds": time.perf_counter() - start, "samples": samples}


def growth_per_10_epochs(values: list[float]) -> float:
    """Least-squares slope after the first epoch, in MiB per 10 epochs."""
    y = np.asarray(values[1:], dtype=np.float64) / MIB
    if len(y) < 2:
        return 0.0
    x = np.arange(len(y), dtype=np.float64)
    return float(np.polyfit(x, y, 1)[0] * 10)


def summary(name: str, run: dict) -> list[tuple]:
    s = run["samples"]
    series = {
        "main process RSS": [v["main_rss"] for v in s],
        "main process private": [v["main_private"] for v in s],
        "shared memory held": [v["shared"] for v in s],
    }
    for w in range(WORKERS):
        series[f"worker {w} RSS"] = [v["worker_rss"][w] for v in s]
        series[f"worker {w} private"] = [v["worker_private"][w] for v in s]
    return [(name, what, f"{values[0] / MIB:.1f}", f"{values[-1] / MIB:.1f}",
             f"{growth_per_10_epochs(values):+.3f}",
             f"{growth_per_10_epochs(values[len(values) // 2:]):+.3f}")
            for what, values in series.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small-epochs", type=int, default=200)
    parser.add_argument("--large-epochs", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    small = jl.ArraySource({"image": rng.integers(0, 256, (60_000, 784), dtype=np.uint8),
                            "label": rng.integers(0, 10, 60_000).astype(np.int64)})
    large = jl.ArraySource({"image": rng.integers(0, 256, (2048, 224, 224, 3), dtype=np.uint8),
                            "label": rng.integers(0, 10, 2048).astype(np.int64)})
    runs = {"small": soak(small, 128, args.small_epochs, [jl.Map(identity)]),
            "large": soak(large, 64, args.large_epochs, [])}
    rows = summary("small", runs["small"]) + summary("large", runs["large"])
    print(f"{machine()}; small {args.small_epochs} epochs in {runs['small']['seconds']:.0f} s, "
          f"large {args.large_epochs} epochs in {runs['large']['seconds']:.0f} s")
    print(table(rows, ("case", "memory", "after epoch 1 (MiB)", "at the end (MiB)",
                       "growth per 10 epochs (MiB)", "same, second half")))
    print("saved", save("soak", {"machine": machine(), "runs": runs}))


if __name__ == "__main__":
    main()
