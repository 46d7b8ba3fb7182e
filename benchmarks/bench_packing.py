"""Sequence packing: jaxloader's ``PackedSource`` against Grain's first-fit and best-fit packers.

Run: ``python benchmarks/bench_packing.py [--docs 100000] [--grain-docs 20000]`` (needs
``pip install -e ".[benchmark]"``; Grain is optional).

Documents: lengths from a lognormal (median 300 tokens, sigma 1, seed 0), cut to [1, 8192];
rows of 2,048 tokens; tokens are int32 ids. Grain refuses records longer than a row, so the
comparison cuts them to 2,048 in both (``overlong="truncate"``); jaxloader's default splits
them into row-sized pieces instead (also reported). Reported:
- padding fraction of each packer over the same documents (Grain with 16 bins, as the issue
  measured it; jaxloader with 16 bins and windows of 10,000 documents), and of jaxloader's
  plans on 1,000,000 documents;
- packed rows per second: jaxloader with 2 workers and in process (batches of 32 rows,
  shuffled), Grain's iterators in one process, and the ceiling: one process copying the same
  tokens out of one flat array into rows, with nothing else to do;
- plan time for 10,000,000 documents (one core);
- ``PackedStream`` (best-fit and first-fit over windows of 1,000 records of a stream), Grain's
  peers (packers of an iterator), over the documents Grain packs: padding and rows/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import jaxloader as jl
from common import machine, save, table
from jaxloader.plans import packing as packing_plan

ROW, BATCH, WORKERS = 2048, 32, 2


def lengths(n: int) -> np.ndarray:
    raw = np.random.default_rng(0).lognormal(np.log(300), 1.0, n)
    return np.clip(raw.astype(np.int64), 1, 8192)


def documents(n: int) -> jl.RaggedSource:
    ends = np.cumsum(lengths(n))
    return jl.RaggedSource({"tokens": (np.arange(1, ends[-1] + 1, dtype=np.int32) % 50_000,
                                       np.concatenate([[0], ends]))})


def jaxloader_rate(packed: jl.PackedSource, workers: int, batches: int) -> float:
    with jl.DataLoader(packed, batch_size=BATCH, shuffle=True, seed=0, num_workers=workers,
                       num_epochs=None, process_index=0, process_count=1) as loader:
        it = iter(loader)
        for _ in range(5):
            next(it)
        start = time.perf_counter()
        for _ in range(batches):
            next(it)
        return batches * BATCH / (time.perf_counter() - start)


def ceiling_rate(source: jl.RaggedSource, batches: int) -> float:
    """Copying the rows' tokens out of the flat array, ids and positions filled: nothing else."""
    values, _ = source.flat("tokens")
    rows = len(values) // ROW
    order = np.random.default_rng(0).permutation(rows)
    start = time.perf_counter()
    for b in range(batches):
        picked = order[(np.arange(BATCH) + b * BATCH) % rows]
        tokens = np.empty((BATCH, ROW), np.int32)
        for i, r in enumerate(picked):
            tokens[i] = values[r * ROW:(r + 1) * ROW]
        ids, positions = np.ones((BATCH, ROW), np.int32), np.zeros((BATCH, ROW), np.int32)
        positions[:] = np.arange(ROW)
    return batches * BATCH / (time.perf_counter() - start)


def grain(method: str, docs: int) -> dict:
    import grain.python as gp
    from grain import experimental as ge

    n = np.minimum(lengths(docs), ROW)  # Grain needs records cut to the row
    records = [{"tokens": np.arange(k, dtype=np.int32) % 50_000} for k in n]
    cls = {"first_fit": ge.FirstFitPackIterDataset, "best_fit": ge.BestFitPackIterDataset}[method]
    dataset = cls(gp.MapDataset.source(records).to_iter_dataset(),
                  length_struct={"tokens": ROW}, num_packing_bins=16, seed=0)
    start, rows, used = time.perf_counter(), 0, 0
    for row in dataset:
        rows += 1
        used += int(np.count_nonzero(row["tokens_segment_ids"]))
    seconds = time.perf_counter() - start
    return {"rows_per_s": rows / seconds, "padding": 1 - used / (rows * ROW), "rows": rows}


def stream(method: str, docs: int) -> dict:
    """``PackedStream`` over the records Grain packs (cut to a row), read as a stream in
    process, batches of 32 rows, until every record was packed once (windows of 1,000)."""
    n = np.minimum(lengths(docs), ROW)
    records = [{"tokens": np.arange(k, dtype=np.int32) % 50_000} for k in n]
    packed = jl.PackedStream(jl.Stream.from_generator(lambda shard: iter(records), 1,
                                                      shuffle_shards=False),
                             "tokens", ROW, method=method, bins=16, window=1000)
    total, rows, used = int(n.sum()), 0, 0
    with jl.StreamLoader(packed, batch_size=BATCH, process_index=0,
                         process_count=1) as loader:
        start = time.perf_counter()
        for batch in loader:
            rows += BATCH
            used += int(np.count_nonzero(batch["tokens_segment_ids"]))
            if used >= total:  # (the last batch may hold a few rows of the next pass)
                break
        seconds = time.perf_counter() - start
    return {"rows_per_s": rows / seconds, "padding": 1 - used / (rows * ROW), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--grain-docs", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plan-docs", type=int, default=10_000_000)
    args = parser.parse_args()
    results: dict = {"machine": machine(), "docs": args.docs}

    padding = {}
    for docs in (args.grain_docs, 1_000_000):
        for method in ("first_fit", "best_fit"):
            for overlong in ("truncate", "split"):
                plan = packing_plan.fit(lengths(docs), [ROW], method=method, bins=16,
                                        overlong=overlong)
                padding[f"jaxloader {method}, {overlong}, {docs:,} docs"] = plan.padding_fraction
    plan = packing_plan.concat(lengths(1_000_000), ROW)
    padding["jaxloader concat, 1,000,000 docs"] = plan.padding_fraction

    source = documents(args.docs)
    packed = jl.PackedSource(source, "tokens", ROW, method="best_fit", bins=16)
    rates: dict = {"jaxloader best_fit, 2 workers": [], "jaxloader best_fit, in process": [],
                   "ceiling: copy rows out of one array, 1 process": []}
    for _ in range(args.rounds):  # taking turns
        rates["jaxloader best_fit, 2 workers"].append(
            jaxloader_rate(packed, WORKERS, args.batches))
        rates["jaxloader best_fit, in process"].append(jaxloader_rate(packed, 0, args.batches))
        rates["ceiling: copy rows out of one array, 1 process"].append(
            ceiling_rate(source, args.batches))
    medians = {name: statistics.median(v) for name, v in rates.items()}
    try:
        for method in ("first_fit", "best_fit"):
            got = grain(method, args.grain_docs)
            medians[f"grain {method}, 16 bins, 1 process"] = got["rows_per_s"]
            padding[f"grain {method}, 16 bins, {args.grain_docs:,} docs"] = got["padding"]
    except ImportError as e:
        print(f"grain not measured: {e}")
    for method in ("first_fit", "best_fit"):  # the stream packers' peer: Grain's iterators
        got = stream(method, args.grain_docs)
        name = f"jaxloader PackedStream {method}, window 1,000, 16 bins, 1 process"
        medians[name] = got["rows_per_s"]
        padding[f"{name}, {args.grain_docs:,} docs"] = got["padding"]

    plan_lengths = lengths(args.plan_docs)
    plan_seconds = {}
    for method in ("best_fit", "concat"):
        start = time.perf_counter()
        if method == "concat":
            packing_plan.concat(plan_lengths, ROW)
        else:
            packing_plan.fit(plan_lengths, [ROW], method=method, bins=16)
        plan_seconds[method] = time.perf_counter() - start

    print(f"{machine()}; rows of {ROW}, batch {BATCH}, {args.docs:,} docs for rates")
    print(table([(k, f"{v:.4%}") for k, v in padding.items()], ("packer", "padding")))
    grain_best = medians.get("grain best_fit, 16 bins, 1 process")
    print(table([(k, f"{v:,.0f}", f"{v / grain_best:.1f}x" if grain_best else "")
                 for k, v in medians.items()], ("loader", "rows/s (median)", "vs grain best_fit")))
    print(f"plan time, {args.plan_docs:,} docs: " +
          ", ".join(f"{k} {v:.2f} s" for k, v in plan_seconds.items()))
    results.update(padding=padding, rows_per_s=medians, rounds=rates, plan_seconds=plan_seconds)
    print("saved", save("packing", results))


if __name__ == "__main__":
    main()
