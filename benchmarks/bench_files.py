"""Data in files: Parquet and ArrayRecord against Grain and Hugging Face datasets; mixtures.

Run: ``python benchmarks/bench_files.py [--rows 1000000] [--rounds 3]`` (needs
``pip install -e ".[benchmark,parquet,array-record]" datasets``).

Cases, batch 256, rows of an int64 id, a float32[16] vector and a short string:
- Parquet (one file, row groups of 10,000 rows): jaxloader ``ParquetSource`` with 2 workers
  and ``LocalShuffle(window=8)`` (also without the string column), with the full shuffle, and
  in file order; the loader's floor (the numeric columns in memory, an ``ArraySource``); Grain's
  ``ParquetIterDataset`` in file order (it has no shuffle); a Hugging Face ``Dataset`` over the
  same file (NumPy format) in file order and in shuffled batches. Peers in one process, as the
  issue measured them. Ceilings: one bare process reading the row groups in file order, and
  two at once (the 2 workers' cores), each reading half of them.
- ArrayRecord (the same rows serialised): jaxloader ``ArrayRecordSource`` + a parsing ``Map``,
  2 workers, against Grain ``MapDataset.source(ArrayRecordDataSource)`` with the same parse,
  shuffled, ``mp_prefetch`` with 2 workers.
- A mixture of 3 in-memory sources (0.5/0.3/0.2) against one ``ArraySource`` of the same rows.
- Parquet mixtures: the same rows in 3 files (half, 3/10, 1/5) mixed 0.5/0.3/0.2, each read
  with ``LocalShuffle(window=8)`` or fully shuffled, against one file read locally and the 3
  files concatenated (``ConcatSource``), 2 workers, whole passes.

The loaders take turns over ``--rounds`` rounds; the table gives median rows/s and ratios.
Parquet: each turn is one whole pass over the file from a fresh reader (a new
``ParquetSource``: nothing decoded yet), so every row group is decoded once inside the timed
span, as in a first epoch, whatever the order; jaxloader's workers finish starting before the
timer starts (the time to the first batch is reported apart). ArrayRecord and the mixture
(nothing decoded ahead): a fresh iterator, a warm-up, a timed stretch.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import struct
import tempfile
import time
import types
from typing import Any, Callable, Iterable, Iterator

import numpy as np

import jaxloader as jl
from common import machine, save, table

BATCH, WORKERS, GROUP_ROWS = 256, 2, 10_000


def write_parquet(path: str, rows: int, first: int = 0) -> None:
    """Rows ``first`` to ``rows`` (ids), in row groups of ``GROUP_ROWS``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    for start in range(first, rows, 100_000):
        ids = np.arange(start, min(start + 100_000, rows), dtype=np.int64)
        vectors = np.random.default_rng(start).random((len(ids), 16), dtype=np.float32)
        table_ = pa.table({
            "id": ids,
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 16),
            "text": [f"row {i}" for i in ids],
        })
        writer = writer or pq.ParquetWriter(path, table_.schema)
        writer.write_table(table_, row_group_size=GROUP_ROWS)
    assert writer is not None
    writer.close()


_LAYOUT = "<q64s"  # id, then the 16 float32 of the vector (a str: parse crosses to workers)
_HEAD = struct.calcsize(_LAYOUT)


def serialise(i: int, vector: np.ndarray) -> bytes:
    text = f"row {i}".encode()
    return struct.pack(_LAYOUT, i, vector.tobytes()) + text


def parse(raw: bytes) -> dict:
    i, vector = struct.unpack_from(_LAYOUT, raw)
    return {"id": np.int64(i), "vector": np.frombuffer(vector, np.float32),
            "text": raw[_HEAD:].decode()}


def write_array_record(path: str, rows: int) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(path, "group_size:1")
    for start in range(0, rows, 100_000):
        vectors = np.random.default_rng(start).random((min(100_000, rows - start), 16),
                                                       dtype=np.float32)
        for k, vector in enumerate(vectors):
            writer.write(serialise(start + k, vector))
    writer.close()


def rows_per_second(make: Callable[[], Iterator], warmup: int = 10, count: int = 200,
                    cpu: list | None = None) -> float:
    """Rows a second over ``count`` batches; appends the CPU a batch (us) to ``cpu`` if given."""
    it = make()
    for _ in range(warmup):
        next(it)
    start, rows, used = time.perf_counter(), 0, cpu_seconds(make)
    for _ in range(count):
        batch = next(it)
        rows += len(batch["id"])
    if cpu is not None:
        cpu.append((cpu_seconds(make) - used) / count * 1e6)
    return rows / (time.perf_counter() - start)


def cpu_seconds(make: Callable[[], Iterator]) -> float:
    """CPU time so far of this process and of a jaxloader's worker processes (/proc)."""
    loader = getattr(make, "holder", {}).get("loader")
    pids = getattr(getattr(loader, "_engine", None), "pids", [])  # a pool's property
    return time.process_time() + _ticks(pids) / os.sysconf("SC_CLK_TCK")


def _ticks(pids: list) -> int:
    """CPU time of processes ``pids`` (user and system), in clock ticks (/proc)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def jaxloader_iter(source, shuffle, workers=WORKERS, transforms=()) -> Callable[[], Iterator]:
    holder: dict = {}

    def make() -> Iterator:
        if "loader" in holder:
            holder.pop("loader").close()
        holder["loader"] = jl.DataLoader(source, batch_size=BATCH, shuffle=shuffle, seed=0,
                                         num_workers=workers, transforms=list(transforms),
                                         num_epochs=None, process_index=0, process_count=1)
        return iter(holder["loader"])
    make.holder = holder  # type: ignore[attr-defined]
    return make


def one_pass(make: Callable[[], Iterator], cpu: list | None = None,
             first: list | None = None) -> float:
    """Rows a second over the whole of ``make()``'s iterator (one pass of the file); appends
    the CPU a batch (us) to ``cpu`` and the seconds to the first batch to ``first``. A
    stretch after a warm-up would leave out what a read-local or full shuffle decodes first
    (its window, or every row group), and the decoding of rows read before."""
    it = make()
    start, used, rows, batches = time.perf_counter(), cpu_seconds(make), 0, 0
    for batch in it:
        if not batches and first is not None:
            first.append(time.perf_counter() - start)
        rows, batches = rows + len(batch["id"]), batches + 1
    elapsed = time.perf_counter() - start
    if cpu is not None:
        cpu.append((cpu_seconds(make) - used) / batches * 1e6)
    return rows / elapsed


def jaxloader_pass(path: str, shuffle, workers=WORKERS, **options) -> Callable[[], Iterator]:
    """A fresh ``ParquetSource(path, **options)`` and loader over one epoch; returns once
    its workers have started (their imports are not the reading measured)."""
    return source_pass(lambda: jl.ParquetSource(path, **options), shuffle, workers)


def source_pass(make_source: Callable, shuffle, workers=WORKERS) -> Callable[[], Iterator]:
    """``jaxloader_pass`` over a fresh ``make_source()`` (files: nothing decoded yet)."""
    holder: dict = {}

    def make() -> Iterator:
        if "loader" in holder:
            holder.pop("loader").close()
        loader = holder["loader"] = jl.DataLoader(
            make_source(), batch_size=BATCH, shuffle=shuffle, seed=0,
            num_workers=workers, num_epochs=1, process_index=0, process_count=1)
        _settle(getattr(loader._engine, "pids", []))
        return iter(loader)
    make.holder = holder  # type: ignore[attr-defined]
    return make


def _settle(pids: list, quiet: int = 3, limit: float = 20.0) -> None:
    """Waits until ``pids`` use no CPU for ``quiet`` polls of 0.1 s (workers started)."""
    last, still, deadline = _ticks(pids), 0, time.monotonic() + limit
    while pids and still < quiet and time.monotonic() < deadline:
        time.sleep(0.1)
        now = _ticks(pids)
        still, last = (still + 1 if now == last else 0), now


def grain_parquet(path: str) -> Callable[[], Iterator]:
    import grain

    def make() -> Iterator:
        ds = grain.experimental.ParquetIterDataset(path).batch(BATCH, drop_remainder=True)
        return iter(ds)
    return make


def bare_parquet(path: str) -> Callable[[], Iterator]:
    """The ceiling of one process: pyarrow reading row groups in file order, numbers to NumPy
    and strings to ``str`` (what a batch must hold), sliced into batches; no loader, no
    shuffle, no hand-over to another process."""
    def make() -> Iterator:
        import pyarrow.parquet as pq

        return _bare_batches(path, range(pq.ParquetFile(path).num_row_groups))
    return make


def _bare_batches(path: str, groups: Iterable[int]) -> Iterator[dict]:
    import pyarrow.parquet as pq

    handle = pq.ParquetFile(path)
    for group in groups:
        table = handle.read_row_group(group, use_threads=False)
        ids = table.column("id").to_numpy()
        vectors = table.column("vector").combine_chunks().flatten().to_numpy().reshape(-1, 16)
        texts = table.column("text").to_pylist()
        for i in range(0, len(ids) - BATCH + 1, BATCH):
            yield {"id": ids[i:i + BATCH], "vector": vectors[i:i + BATCH],
                   "text": texts[i:i + BATCH]}


def numeric_columns(path: str) -> dict:
    """The file's ``id`` and ``vector`` columns in memory: what jaxloader's cheapest path (an
    ``ArraySource`` gathered straight into shared memory, nothing decoded, no ``str`` made)
    reads, the loader's own floor for these rows."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["id", "vector"])
    vectors = table.column("vector").combine_chunks().flatten().to_numpy().reshape(-1, 16)
    return {"id": table.column("id").to_numpy(), "vector": vectors}


def bare_parquet_processes(path: str, processes: int = WORKERS) -> Callable[[], Iterator]:
    """The ceiling of ``processes`` processes at once (the cores 2 workers have): each reads
    every ``processes``-th row group as ``bare_parquet`` does and only counts its batches,
    which never reach this process. Started (forked) before the timer, like jaxloader's
    workers; their CPU is read from /proc before they exit."""
    holder: dict = {}

    def make() -> Iterator:
        if "loader" in holder:
            holder.pop("loader").close()
        holder["loader"] = pair = _BareProcesses(path, processes)
        return pair.batches()
    make.holder = holder  # type: ignore[attr-defined]
    return make


class _BareProcesses:
    def __init__(self, path: str, processes: int) -> None:
        import multiprocessing

        import pyarrow.parquet as pq

        context = multiprocessing.get_context("fork")
        groups = range(pq.ParquetFile(path).num_row_groups)
        self._go, self._done, self._counts = context.Event(), context.Event(), context.Queue()
        self._processes = [context.Process(target=_count_bare, daemon=True, args=(
            path, groups[k::processes], self._go, self._done, self._counts))
            for k in range(processes)]
        for process in self._processes:
            process.start()
        self._engine = types.SimpleNamespace(pids=[p.pid for p in self._processes])

    def batches(self) -> Iterator[dict]:
        self._go.set()
        counts = [self._counts.get() for _ in self._processes]
        row = {"id": range(BATCH)}
        for _ in range(sum(counts)):
            yield row

    def close(self) -> None:
        self._done.set()
        for process in self._processes:
            process.join()


def _count_bare(path: str, groups: range, go: Any, done: Any, counts: Any) -> None:
    go.wait()
    counts.put(sum(1 for _ in _bare_batches(path, groups)))
    done.wait()  # alive until closed: the parent reads this process's CPU in /proc


def hf_batches(path: str, shuffled: bool) -> Callable[[], Iterator]:
    import datasets

    ds = datasets.Dataset.from_parquet(path).with_format("numpy")

    def make() -> Iterator:
        if not shuffled:
            return iter(ds.iter(batch_size=BATCH))
        order = np.random.default_rng(0).permutation(len(ds))
        return (ds[order[i:i + BATCH].tolist()] for i in range(0, len(ds) - BATCH, BATCH))
    return make


def grain_array_record(path: str) -> Callable[[], Iterator]:
    import grain

    def make() -> Iterator:
        ds = (grain.MapDataset.source(grain.sources.ArrayRecordDataSource([path]))
              .shuffle(seed=0).repeat().map(parse).batch(BATCH, drop_remainder=True)
              .to_iter_dataset())
        return iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=WORKERS)))
    return make


def memory(gib: float, workers: int = 4, batches: int = 200) -> dict:
    """Memory of each worker reading a ``gib`` GiB Parquet file, read-locally and with a full
    shuffle, with the workers sharing what they decode and with each decoding for itself:
    each worker's private (``RssAnon``) and mapped shared (``RssShmem``) peaks, and what the
    workers cost together (the sum of their ``Pss``: a shared page counted once in all)."""
    rows = int(gib * 2**30 / 90)  # ~90 bytes a row on disk: the vector does not compress
    big = tempfile.mkdtemp(prefix="bench_files_big_")
    atexit.register(shutil.rmtree, big, True)
    path = os.path.join(big, "big.parquet")
    started = time.perf_counter()
    write_parquet(path, rows)
    written = time.perf_counter() - started
    report: dict = {"file_bytes": os.path.getsize(path), "rows": rows, "write_s": written}
    # read-local: enough batches to fill the cache (~150 row groups; a window is 8 of them)
    for order, shuffle, count in (("read-local", jl.LocalShuffle(), batches * 30),
                                  ("full shuffle", True, batches)):
        for share in (True, False):
            with jl.DataLoader(jl.ParquetSource(path, share_decoded=share), batch_size=BATCH,
                               shuffle=shuffle, seed=0, num_workers=workers, num_epochs=None,
                               process_index=0, process_count=1) as loader:
                it = iter(loader)
                peak = {"RssAnon": [0] * workers, "RssShmem": [0] * workers}
                total = 0
                started = time.perf_counter()
                for step in range(count):
                    next(it)
                    if step % (count // 10) == count // 10 - 1:
                        for w, pid in enumerate(loader.worker_pids):
                            for field, kib in _status_kib(pid).items():
                                peak[field][w] = max(peak[field][w], kib)
                        total = max(total, sum(_pss_kib(pid) for pid in loader.worker_pids))
                report[f"{order}, {'shared' if share else 'each decoding'}"] = {
                    "batches": count, "seconds": time.perf_counter() - started,
                    "worker_private_peak_MiB": [p / 1024 for p in peak["RssAnon"]],
                    "worker_shared_peak_MiB": [p / 1024 for p in peak["RssShmem"]],
                    "workers_pss_peak_MiB": total / 1024}
    os.remove(path)
    return report


def _status_kib(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        return {line.split(":")[0]: int(line.split()[1]) for line in f
                if line.startswith(("RssAnon:", "RssShmem:"))}


def _pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def take_turns(loaders: dict, rounds: int, count: int = 200, cpu: bool = False,
               passes: bool = False) -> dict:
    """Each loader ``rounds`` times, in turns; with ``cpu``, also the CPU a batch (jaxloader
    only: the process and its workers); with ``passes``, each turn is ``one_pass``."""
    rates: dict = {name: [] for name in loaders}
    used: dict = {name: [] for name in loaders}
    firsts: dict = {name: [] for name in loaders}
    names = list(loaders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            spent = used[name] if cpu else None
            rates[name].append(one_pass(loaders[name], spent, firsts[name]) if passes else
                               rows_per_second(loaders[name], count=count, cpu=spent))
    for make in loaders.values():
        holder = getattr(make, "holder", {})
        if "loader" in holder:
            holder.pop("loader").close()
    return {name: {"median": statistics.median(v), "all": v,
                   **({"cpu_us_median": statistics.median(used[name]), "cpu_us": used[name]}
                      if cpu else {}),
                   **({"first_batch_s": firsts[name]} if passes else {})}
            for name, v in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="parquet,array_record,mixture,parquet_mixture",
                        help="comma-separated subset of: parquet, array_record, mixture, "
                        "parquet_mixture")
    parser.add_argument("--memory-gib", type=float, default=0.0,
                        help="only measure workers' private memory on a file of this size")
    args = parser.parse_args()
    if args.memory_gib:
        report = memory(args.memory_gib)
        print(f"{machine()}; {report}")
        print("saved", save("files_memory", report))
        return
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain's workers read absl flags; we pass none
    work = tempfile.mkdtemp(prefix="bench_files_")
    atexit.register(shutil.rmtree, work, True)  # the files written (hundreds of MB)
    parquet, records = os.path.join(work, "rows.parquet"), os.path.join(work, "rows.array_record")
    only = args.only.split(",")
    results = {}
    if "parquet" in only:
        write_parquet(parquet, args.rows)
        numbers = numeric_columns(parquet)
        results["parquet"] = take_turns({
            "jaxloader LocalShuffle(window=8), 2 workers": jaxloader_pass(
                parquet, jl.LocalShuffle()),
            "jaxloader full shuffle, 2 workers": jaxloader_pass(parquet, True),
            "jaxloader file order, 2 workers": jaxloader_pass(parquet, False),
            "jaxloader LocalShuffle(window=8), 2 workers, each decoding": jaxloader_pass(
                parquet, jl.LocalShuffle(), share_decoded=False),
            "jaxloader full shuffle, 2 workers, each decoding": jaxloader_pass(
                parquet, True, share_decoded=False),
            "jaxloader LocalShuffle(window=8), in process": jaxloader_pass(
                parquet, jl.LocalShuffle(), workers=0),
            "jaxloader file order, in process": jaxloader_pass(parquet, False, workers=0),
            "jaxloader LocalShuffle(window=8), 2 workers, id and vector only": jaxloader_pass(
                parquet, jl.LocalShuffle(), columns=["id", "vector"]),
            "floor: jaxloader ArraySource of id and vector in memory, full shuffle, 2 workers": (
                source_pass(lambda: jl.ArraySource(numbers), True)),
            "grain ParquetIterDataset, file order": grain_parquet(parquet),
            "datasets, file order": hf_batches(parquet, shuffled=False),
            "datasets, shuffled batches": hf_batches(parquet, shuffled=True),
            "ceiling: one bare process, pyarrow row groups -> NumPy + str": bare_parquet(parquet),
            "ceiling: two bare processes at once, each half the row groups": (
                bare_parquet_processes(parquet)),
        }, args.rounds, cpu=True, passes=True)
    if "array_record" in only:
        write_array_record(records, args.rows)
        results["array_record"] = take_turns({
            "jaxloader ArrayRecordSource + Map, 2 workers": jaxloader_iter(
                jl.ArrayRecordSource(records), True, transforms=[jl.Map(parse)]),
            "grain ArrayRecordDataSource + map, mp_prefetch 2": grain_array_record(records),
        }, args.rounds)
    if "mixture" in only:
        results["mixture"] = mixture(args.rows, args.rounds)
    if "parquet_mixture" in only:
        results["parquet_mixture"] = parquet_mixture(work, args.rows, args.rounds)
    print(f"{machine()}; {args.rows:,} rows, batch {BATCH}, {args.rounds} rounds")
    for case, rates in results.items():
        first = next(iter(rates.values()))["median"]
        print(f"\n{case}")
        print(table([(name, f"{r['median']:,.0f}", f"{first / r['median']:.2f}",
                      f"{r['cpu_us_median']:.0f}" if "cpu_us_median" in r else "-",
                      f"{statistics.median(r['first_batch_s']):.2f}"
                      if "first_batch_s" in r else "-")
                     for name, r in rates.items()],
                    ("loader", "rows/s (median)", "first row / this", "CPU us a batch",
                     "s to the first batch")))
    print("saved", save("files", {"machine": machine(), "rows": args.rows, **results}))


def parquet_mixture(work: str, rows: int, rounds: int) -> dict:
    """The rows in 3 files (half, 3/10, 1/5), mixed 0.5/0.3/0.2, read locally or fully
    shuffled, against the same rows in one file read locally and the 3 concatenated; whole
    passes (a mixture's epoch: the rows, each component read about once)."""
    cuts = [0, rows // 2, rows * 4 // 5, rows]
    paths = [os.path.join(work, f"part-{k}.parquet") for k in range(3)]
    for path, a, b in zip(paths, cuts, cuts[1:]):
        write_parquet(path, b, first=a)
    whole = os.path.join(work, "rows.parquet")
    if not os.path.exists(whole):
        write_parquet(whole, rows)

    def mixed() -> jl.Mixture:
        return jl.mix([jl.ParquetSource(p) for p in paths], [0.5, 0.3, 0.2])

    local = jl.LocalShuffle()
    return take_turns({
        "one file, LocalShuffle(window=8), 2 workers": jaxloader_pass(whole, local),
        "3 files concatenated, LocalShuffle(window=8), 2 workers": source_pass(
            lambda: jl.ConcatSource([jl.ParquetSource(p) for p in paths]), local),
        "mix of 3 files (0.5/0.3/0.2), LocalShuffle(window=8), 2 workers": source_pass(
            mixed, local),
        "mix of 3 files, full shuffle, 2 workers": source_pass(mixed, True),
    }, rounds, cpu=True, passes=True)


def mixture(rows: int, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    ids = np.arange(rows, dtype=np.int64)
    vectors = rng.random((rows, 16), dtype=np.float32)
    whole = jl.ArraySource({"id": ids, "vector": vectors})
    thirds = [jl.ArraySource({"id": ids[a:b], "vector": vectors[a:b]})
              for a, b in ((0, rows // 2), (rows // 2, rows * 4 // 5), (rows * 4 // 5, rows))]
    return take_turns({
        "one ArraySource, in process": jaxloader_iter(whole, True, workers=0),
        "mix of 3 (0.5/0.3/0.2), in process": jaxloader_iter(
            jl.mix(thirds, [0.5, 0.3, 0.2]), True, workers=0),
        "one ArraySource, 2 workers": jaxloader_iter(whole, True),
        "mix of 3, 2 workers": jaxloader_iter(jl.mix(thirds, [0.5, 0.3, 0.2]), True),
    }, rounds, count=10_000, cpu=True)  # 39-78 spans of the mixture's memo a turn


if __name__ == "__main__":
    main()
