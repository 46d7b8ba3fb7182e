"""Two trees of jaxloader side by side: the same cases in alternating fresh processes, ratios.

    python benchmarks/bench_ab.py --before /path/to/old/checkout --cases parquet_local,tar

For a change's cost on the paths it touches, measured against the tree before it in one run
(the machine's speed drifts between runs: only ratios within a run mean something). Each
round runs every case once in each tree, the order alternating, each in a fresh process whose
``sys.path`` puts that tree's ``jaxloader`` first; the data are written once, here. Reported:
the median rate of each case in each tree, the ratio after / before, the CPU a batch (this
process and the workers, from ``/proc``) and this process's alone (the training process: what
the loader takes from the step).

Cases (jaxloader only, with 2 workers, batches of 256, as ``bench_files.py`` and
``bench_streams.py`` read them):

- ``parquet_local``: one pass of a 1,000,000-row Parquet file (row groups of 10,000: an id, a
  float32[16] vector, a short string) with ``LocalShuffle(window=8)``, from ``iter()`` to
  the end, the workers started before the clock;
- ``tar``: 300 batches after 20 of a stream of 200 tar shards of 1,000 records (``.txt`` and
  ``.cls``), ``Map(decode)``;
- ``small``, ``large``, ``huge``: 2,000 batches of 256 records of 16 float32 (16 KiB), 60 of 64
  records of 150 KiB (9.4 MiB), 60 of 16 records of 2 MiB (32 MiB), from an ``ArraySource``
  shuffled, after a warm-up;
- ``small_here``: ``small`` made in process (``num_workers=0``): the main process's own
  per-batch path, with nothing to overlap it;
- ``small_mapped``: ``small`` from a ``.npy`` file memory-mapped (``np.load(mmap_mode="r")``);
- ``small_placed``: ``small`` made in process and placed on the CPU device (``sharding=``):
  the device-put thread's path, and ``next()`` waiting on it;
- ``threads``, ``threads_here``: 300 batches of 256 records of a source read a record at a
  time (no ``__getitems__``) on ``read_threads=8``, with 2 workers and in process: the read
  threads' hand-over of each record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("parquet_local", "tar", "small", "large", "huge", "small_here", "small_mapped",
         "small_placed", "threads", "threads_here")


class OneByOne:
    """Records read one at a time (no ``__getitems__``): each on the loader's read threads."""

    def __init__(self, n: int) -> None:
        import numpy as np

        self.x = np.random.default_rng(0).random((n, 16), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": i}


def child(case: str, data: str) -> dict:
    """One measurement of ``case`` in this process (its ``jaxloader`` from ``sys.path``)."""
    import numpy as np

    import jaxloader as jl

    sys.path.insert(1, HERE)
    from bench_files import cpu_seconds, jaxloader_pass, one_pass

    if case == "parquet_local":
        make = jaxloader_pass(os.path.join(data, "rows.parquet"), jl.LocalShuffle())
        cpu: list = []
        main = time.process_time()
        rate = one_pass(make, cpu)
        main_us = (time.process_time() - main) / -(-1_000_000 // 256) * 1e6
        make.holder.pop("loader").close()  # type: ignore[attr-defined]
        return {"rate": rate, "cpu_us": cpu[0], "main_us": main_us, "jaxloader": jl.__file__}
    if case == "tar":
        from bench_streams import decode

        paths = sorted(os.path.join(data, "tar", n) for n in os.listdir(os.path.join(data, "tar")))
        loader = jl.StreamLoader(jl.Stream.tar(paths), batch_size=256, seed=0, num_workers=2,
                                 transforms=[jl.Map(decode)], process_index=0, process_count=1)
        warm, count = 20, 300
    elif case.startswith("threads"):  # (the read threads' hand-over, a record at a time)
        loader = jl.DataLoader(OneByOne(256 * 40), batch_size=256, shuffle=True, num_epochs=None,
                               read_threads=8, num_workers=0 if case == "threads_here" else 2,
                               process_index=0, process_count=1)
        warm, count = 10, 300
    else:
        rows, width, many = {"small": (256, 16, 40), "large": (64, 150 * 256, 40),
                             "huge": (16, 512 * 1024, 16), "small_here": (256, 16, 40),
                             "small_mapped": (256, 16, 40), "small_placed": (256, 16, 40)}[case]
        x = np.random.default_rng(0).random((rows * many, width), dtype=np.float32)
        if case == "small_mapped":
            x = np.load(os.path.join(data, "small.npy"), mmap_mode="r")
        placed = {}
        if case == "small_placed":
            import jax

            placed = {"sharding": jax.devices("cpu")[0]}
        loader = jl.DataLoader(jl.ArraySource({"x": x, "y": np.arange(len(x))}),
                               batch_size=rows, shuffle=True, num_epochs=None,
                               num_workers=0 if case in ("small_here", "small_placed") else 2,
                               process_index=0, process_count=1, **placed)
        warm, count = 20, 2000 if case.startswith("small") else 60
    with loader:
        it = iter(loader)
        for _ in range(warm):
            next(it)
        make = lambda: it  # noqa: E731 - cpu_seconds reads the loader from make.holder
        make.holder = {"loader": loader}  # type: ignore[attr-defined]
        used, start, records = cpu_seconds(make), time.perf_counter(), 0
        main = time.process_time()
        for _ in range(count):
            batch = next(it)
            records += len(batch["y" if "y" in batch else "cls"])
        elapsed = time.perf_counter() - start
        main_us = (time.process_time() - main) / count * 1e6
        cpu_us = (cpu_seconds(make) - used) / count * 1e6
    return {"rate": records / elapsed, "cpu_us": cpu_us, "main_us": main_us,
            "jaxloader": jl.__file__}


def write_data(data: str, cases: list[str]) -> None:
    sys.path.insert(0, HERE)
    if "small_mapped" in cases:
        import numpy as np

        x = np.random.default_rng(0).random((256 * 40, 16), dtype=np.float32)
        np.save(os.path.join(data, "small.npy"), x)
    if "parquet_local" in cases:
        from bench_files import write_parquet

        write_parquet(os.path.join(data, "rows.parquet"), 1_000_000)
    if "tar" in cases:
        from bench_streams import write_shards

        os.makedirs(os.path.join(data, "tar"))
        write_shards(os.path.join(data, "tar"), 200, 1000)


def run(tree: str, case: str, data: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    out = subprocess.run([sys.executable, __file__, "--child", case, "--data", data],
                         env=env, capture_output=True, text=True, check=True, timeout=900)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    expected = os.path.join(os.path.abspath(tree), "jaxloader")
    if not found["jaxloader"].startswith(expected):
        raise RuntimeError(f"{tree}: imported {found['jaxloader']}, not the tree's")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", help="the tree to compare against (a checkout's root)")
    parser.add_argument("--after", default=os.path.dirname(HERE))
    parser.add_argument("--cases", default="parquet_local,tar")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.data)))
        return
    cases = args.cases.split(",")
    trees = {"before": args.before, "after": args.after}
    got: dict = {(case, name): [] for case in cases for name in trees}
    with tempfile.TemporaryDirectory() as data:
        write_data(data, cases)
        for round_ in range(args.rounds):
            order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
            for case in cases:
                for name, tree in order:
                    got[case, name].append(run(tree, case, data))
    print(f"{args.rounds} rounds; before {args.before}, after {args.after}")
    print("| case | before (median) | after (median) | after / before | rounds | CPU a batch, "
          "us (before -> after) | main process alone |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        before = [r["rate"] for r in got[case, "before"]]
        after = [r["rate"] for r in got[case, "after"]]
        cpu = [statistics.median(r["cpu_us"] for r in got[case, n]) for n in trees]
        main = [statistics.median(r["main_us"] for r in got[case, n]) for n in trees]
        ratios = ", ".join(f"{a / b:.3f}" for a, b in zip(after, before))
        print(f"| {case} | {statistics.median(before):,.0f} | {statistics.median(after):,.0f} | "
              f"**{statistics.median(after) / statistics.median(before):.3f}** | {ratios} | "
              f"{cpu[0]:,.0f} -> {cpu[1]:,.0f} | {main[0]:,.0f} -> {main[1]:,.0f} |")


if __name__ == "__main__":
    main()
