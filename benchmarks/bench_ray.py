"""``RayWorkers(2)`` against 2 local workers on one machine: batches a second and the training
process's CPU a batch (what stays scarce when the workers move to other machines). One run.

Run: ``python benchmarks/bench_ray.py [--rounds 5]`` (needs ``pip install -e ".[ray]"``).

Cases (the two loaders taking turns over the rounds, a fresh loader each, medians):
- large: 2,048 images of 224x224x3 uint8 + label, batch 64 (9.6 MB a batch), no transform;
- small: 60,000 x (784 uint8 + label), batch 128, a per-record ``Map`` scaling the image to
  float32.
Ray runs a local cluster of this machine's 2 cores (``ray.init(num_cpus=2)``); each loader
gets a warm-up of 10 batches (and its actors' or workers' start) before the clock.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import ray

import jaxloader as jl
from jaxloader.ray import RayWorkers


def scale(record: dict) -> dict:
    return {"image": record["image"].astype(np.float32) / 255.0, "label": record["label"]}


def measure(make, count: int) -> tuple[float, float]:
    """Batches a second and the training process's CPU microseconds a batch."""
    with make() as loader:
        it = iter(loader)
        for _ in range(10):
            next(it)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            next(it)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return count / wall, 1e6 * cpu / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated: large, small")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rng = np.random.default_rng(0)
    large = jl.ArraySource({"image": rng.integers(0, 256, (2048, 224, 224, 3), np.uint8),
                            "label": np.arange(2048)})
    small = jl.ArraySource({"image": rng.integers(0, 256, (60_000, 784), np.uint8),
                            "label": np.arange(60_000)})
    cases = {"large": (large, 64, [], 300), "small": (small, 128, [jl.Map(scale)], 600)}
    if args.only:
        cases = {k: v for k, v in cases.items() if k in args.only.split(",")}
    rows = []
    for case, (source, batch, transforms, count) in cases.items():
        def make(where: dict, source=source, batch=batch, transforms=transforms):
            return lambda: jl.DataLoader(source, batch_size=batch, shuffle=True,
                                         transforms=transforms, num_epochs=None,
                                         process_index=0, process_count=1, **where)
        loaders = {"2 local workers": make({"num_workers": 2}),
                   "RayWorkers(2)": make({"workers": RayWorkers(2)})}
        found: dict = {name: [] for name in loaders}
        for r in range(args.rounds):
            for name in list(loaders)[r % 2:] + list(loaders)[:r % 2]:
                found[name].append(measure(loaders[name], count))
                print(f"  {case} round {r + 1}: {name:16s} {found[name][-1][0]:8.1f} batches/s "
                      f"{found[name][-1][1]:8.1f} us CPU a batch", flush=True)
        local = found["2 local workers"]
        for name, got in found.items():
            rate = statistics.median(g[0] for g in got)
            cpu = statistics.median(g[1] for g in got)
            ratio = statistics.median(g[0] / lo[0] for g, lo in zip(got, local))
            cpu_ratio = statistics.median(g[1] / lo[1] for g, lo in zip(got, local))
            rows.append(f"| {case} | {name} | {rate:.1f} | {ratio:.2f}x | {cpu:.0f} us | "
                        f"{cpu_ratio:.2f}x |")
    print("| case | loader | batches/s | / local | main CPU a batch | / local |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    ray.shutdown()


if __name__ == "__main__":
    main()
