"""jaxloader vs Grain, tf.data and PyTorch's DataLoader with no worker processes: 60,000 x
(784 uint8 + int label), batch 128, shuffled.

Run: ``python benchmarks/bench_main_process.py [--repeats 5]`` (needs ``pip install -e
.[benchmark]``; tf.data and PyTorch join the table where installed, see ``peers.py``). All loaders read the same
arrays in the same process run; the table reports median records/s over the repeats and the
ratio to Grain's ``MapDataset.source(...).shuffle().batch()``. tf.data runs its pipeline on its
own threads (both cores); the others on the calling thread.
"""

from __future__ import annotations

import argparse
from typing import Callable

import numpy as np

import jaxloader as jl
import peers
from common import RecordSource, machine, rate, save, table

N, D, BATCH = 60_000, 784, 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (N, D), dtype=np.uint8)
    labels = rng.integers(0, 10, N).astype(np.int64)
    plain = RecordSource(images, labels)
    arrays = jl.ArraySource({"image": images, "label": labels})

    import grain

    grain_ds = grain.MapDataset.source(plain).shuffle(seed=0).batch(BATCH, drop_remainder=True)

    def grain_epoch() -> int:
        return sum(len(b["label"]) for b in grain_ds)

    def jaxloader_epoch(loader: jl.DataLoader) -> Callable:
        def run() -> int:
            return sum(len(b["label"]) for b in loader)
        return run

    vectorised = jl.DataLoader(arrays, batch_size=BATCH, shuffle=True, seed=0,
                               process_index=0, process_count=1)
    with_map = jl.DataLoader(arrays, batch_size=BATCH, shuffle=True, seed=0,
                             transforms=[jl.Map(lambda r: r)], process_index=0, process_count=1)
    perm = np.random.default_rng(1).permutation(N)

    def hand_loop() -> int:  # the floor the per-record path should reach: stack records by hand
        done = 0
        for s in range(N // BATCH):
            recs = [plain[i] for i in perm[s * BATCH:(s + 1) * BATCH]]
            batch = {k: np.stack([r[k] for r in recs]) for k in recs[0]}
            done += len(batch["label"])
        return done

    def peer_epoch(make: Callable) -> Callable:  # one epoch's batches from a fresh iterator
        def run() -> int:
            it = make()
            for _ in range(N // BATCH):
                next(it)
            return N // BATCH * BATCH
        return run

    candidates = {
        "grain MapDataset shuffle+batch": grain_epoch,
        "hand loop stacking records": hand_loop,
        "jaxloader, vectorised (__getitems__)": jaxloader_epoch(vectorised),
        "jaxloader, per-record Map(identity)": jaxloader_epoch(with_map),
    }
    have = peers.available()
    if have["tf.data"]:
        candidates["tf.data, batched gather (vectorised)"] = peer_epoch(
            peers.tf_data(images, labels, BATCH, workers=0))
        candidates["tf.data, per-record map (TF ops)"] = peer_epoch(
            peers.tf_data(images, labels, BATCH, workers=0, tf_map=lambda r: r))
    if have["torch"]:
        candidates["torch DataLoader, __getitems__ (vectorised)"] = peer_epoch(
            peers.torch_loader(images, labels, BATCH, workers=0, vectorised=True))
        candidates["torch DataLoader, per record"] = peer_epoch(
            peers.torch_loader(images, labels, BATCH, workers=0))
    results = {name: rate(fn, args.repeats) for name, fn in candidates.items()}
    base = results["grain MapDataset shuffle+batch"]["median"]
    rows = [(name, f"{r['median']:,.0f}", f"{r['median'] / base:.1f}x") for name, r in
            results.items()]
    print(f"main process, {N} x ({D} uint8 + label), batch {BATCH}, shuffled; {machine()}; "
          f"median of {args.repeats}; peers not installed: "
          f"{[name for name, ok in have.items() if not ok] or 'none'}")
    print(table(rows, ("loader", "records/s", "vs Grain")))
    save("main_process", {"machine": machine(), "results": results, "peers": have})


if __name__ == "__main__":
    main()
