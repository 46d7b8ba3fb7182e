"""The training process's CPU a batch, two trees side by side: what a change to the per-batch
path costs where batches are small (the cost of the stage timings was measured with it).

    python benchmarks/bench_overhead.py --before /path/to/old/checkout [--rounds 7]

Each round runs, in fresh processes whose ``sys.path`` puts a tree's ``jaxloader`` first, the
trees alternating: 20,000 batches of 256 records of 16 float32 from a shuffled ``ArraySource``
after 200 of warm-up, made in process (``num_workers=0``: the whole batch's CPU) and with 2
workers (the training process's own CPU, ``time.process_time``, a batch). Medians, ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(workers: int) -> dict:
    import numpy as np

    import jaxloader as jl

    source = jl.ArraySource({"x": np.random.default_rng(0).random((1 << 20, 16), np.float32)})
    n = 20_000 if workers == 0 else 12_000
    with jl.DataLoader(source, batch_size=256, shuffle=True, num_workers=workers,
                       num_epochs=None, process_index=0, process_count=1) as loader:
        it = iter(loader)
        for _ in range(200):
            next(it)
        cpu = time.process_time()
        for _ in range(n):
            next(it)
        cpu = time.process_time() - cpu
    return {"cpu_us": 1e6 * cpu / n, "jaxloader": jl.__file__}


def run(tree: str, workers: int) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    out = subprocess.run([sys.executable, __file__, "--child", str(workers)], env=env,
                         capture_output=True, text=True, check=True, timeout=600)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    if not found["jaxloader"].startswith(os.path.join(os.path.abspath(tree), "jaxloader")):
        raise RuntimeError(f"{tree}: imported {found['jaxloader']}, not the tree's")
    return found["cpu_us"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", help="the tree to compare against (a checkout's root)")
    parser.add_argument("--after", default=os.path.dirname(HERE))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return
    results: dict = {}
    for r in range(args.rounds):
        trees = [args.before, args.after] if r % 2 == 0 else [args.after, args.before]
        for tree in trees:
            for workers in (0, 2):
                results.setdefault((tree, workers), []).append(run(tree, workers))
    print("| case | before, us | after, us | after / before |\n|---|---|---|---|")
    for workers, name in ((0, "in process: the whole batch"), (2, "2 workers: the training "
                                                                   "process alone")):
        before = statistics.median(results[(args.before, workers)])
        after = statistics.median(results[(args.after, workers)])
        print(f"| {name} | {before:.2f} | {after:.2f} | {after / before:.3f} |")


if __name__ == "__main__":
    main()
