"""Streams: tar shards (WebDataset layout) read by jaxloader, torch's DataLoader and WebDataset.

Run: ``python benchmarks/bench_streams.py [--shards 200] [--per-shard 1000]`` (Python 3.11 with
``pip install torch==2.13.0 webdataset``; both are optional).

Each record is two files, ``<key>.txt`` (a short line of text) and ``<key>.cls`` (a label);
every loader reads the same shards with 2 workers, groups the files by key, decodes them the
same way (``decode``: the label as an int, the text's length) and makes batches of 256:
- jaxloader ``StreamLoader(Stream.tar(paths), num_workers=2, transforms=[Map(decode)])``,
  and the same shards as 3 streams (half, 3/10, 1/5 of them) mixed 0.5/0.3/0.2 (``jl.mix``);
- torch ``DataLoader(TarRecords(paths), batch_size=256, num_workers=2)``, an
  ``IterableDataset`` that deals the shards to its workers by ``get_worker_info()`` and reads
  them with ``tarfile``, as jaxloader's ``TarShard`` does;
- WebDataset ``WebDataset(paths).map(decode)`` in the same torch ``DataLoader``;
- the ceiling: 2 bare processes, each reading half the shards (with ``TarShard``: ``tarfile``
  is slower) and decoding the records, with no batching and nothing sent anywhere.
Loaders take turns over ``--rounds``; each reads ``--batches`` batches after a warm-up.

``--only compressed``: JSON lines shards (a ~750-byte text and an id a line, as C4's) plain,
gzip (level 6) and Zstandard (level 3), read by ``StreamLoader(Stream.jsonl(paths),
num_workers=2)``: records/s against the plain files and against 2 bare processes each
reading and parsing a whole shard of the same files (the ceiling), and the seconds from
``load_state_dict`` of a state in the middle of every shard to the first batch (a
compressed shard is read from its start up to the state's offset).

``--only passes``: the plain JSON lines shards read by an endless ``StreamLoader`` and by one
whose ``iter()`` is a pass that ends (``num_epochs=1``: every batch carries a mask, a reader
checks for its next record after each batch, ``next()`` asks whether every reader is done),
in process and with 2 workers: records/s over the same stretch, and over whole passes (the
last, padded batches included, records counted by the mask).

``--only huggingface`` (needs ``datasets``): a Hugging Face ``IterableDataset`` over 4
Parquet files read by ``StreamLoader(ds)`` and by the generator recipe README gave before,
against the dataset iterated bare; the seconds to restore with each, every reader half-way
through a file.
"""

from __future__ import annotations

import argparse
import functools
import io
import multiprocessing
import os
import shutil
import statistics
import tarfile
import tempfile
import time
from typing import Any, Callable, Iterator

import jaxloader as jl
from common import machine, save, table

BATCH, WORKERS = 256, 2


def write_shards(directory: str, shards: int, per_shard: int) -> list[str]:
    paths = []
    for s in range(shards):
        path = os.path.join(directory, f"shard-{s:04d}.tar")
        with tarfile.open(path, "w") as tar:
            for i in range(per_shard):
                key = f"{s:04d}{i:06d}"
                for ext, data in (("txt", f"record {key} of the benchmark".encode()),
                                  ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def decode(record: dict) -> dict:
    return {"cls": int(record["cls"]), "length": len(record["txt"])}


def tar_records(path: str) -> Iterator[dict]:
    """A shard's records: consecutive members grouped by key (the WebDataset layout)."""
    with tarfile.open(path, "r:") as tar:
        record: dict = {}
        key = None
        for member in tar:
            stem, _, ext = member.name.partition(".")
            if key is not None and stem != key:
                yield record
                record = {}
            key = stem
            record[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
        if record:
            yield record


def stream_loader(make_stream: Callable[[], Any], parse: Callable = decode) -> Callable[[], Any]:
    """A ``StreamLoader`` factory over ``make_stream()``, 2 workers, ``Map(parse)``."""
    def make() -> Any:
        return jl.StreamLoader(make_stream(), batch_size=BATCH, seed=0, num_workers=WORKERS,
                               transforms=[jl.Map(parse)], process_index=0, process_count=1)
    return make


def jaxloader_loader(paths: list[str]) -> Callable[[], Any]:
    return stream_loader(lambda: jl.Stream.tar(paths))


def jaxloader_mixed(paths: list[str]) -> Callable[[], Any]:
    """The same shards as 3 streams (half, 3/10, 1/5 of them) mixed 0.5/0.3/0.2."""
    a, b = len(paths) // 2, len(paths) * 8 // 10
    parts = (paths[:a], paths[a:b], paths[b:])
    return stream_loader(lambda: jl.mix([jl.Stream.tar(p) for p in parts], [0.5, 0.3, 0.2]))


def torch_loader(paths: list[str]) -> Callable[[], Any]:
    import torch.utils.data as tud

    class TarRecords(tud.IterableDataset):
        def __iter__(self) -> Iterator[dict]:
            info = tud.get_worker_info()
            mine = paths[info.id::info.num_workers] if info else paths
            for path in mine:
                for record in tar_records(path):
                    yield decode(record)

    def make() -> Any:
        return tud.DataLoader(TarRecords(), batch_size=BATCH, num_workers=WORKERS)
    return make


def webdataset_loader(paths: list[str]) -> Callable[[], Any]:
    import torch.utils.data as tud
    import webdataset as wds

    def make() -> Any:
        dataset = wds.WebDataset(paths, shardshuffle=False, empty_check=False).map(decode)
        return tud.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    return make


def _bare(paths: list[str], out: Any, make: Any = None, parse: Any = decode) -> None:
    """Reads and decodes records with the fastest reader here (``TarShard``'s header parsing;
    ``tarfile`` is ~5x slower a member), nothing else."""
    start, n = time.perf_counter(), 0
    for path in paths:
        shard = (make or jl.TarShard)(path)
        shard.reset()
        while True:
            try:
                parse(shard.next())
            except StopIteration:
                break
            n += 1
        shard.close()
    out.put((n, time.perf_counter() - start))


def ceiling(paths: list[str], records: int) -> float:
    """Records per second of 2 bare processes reading and decoding their halves."""
    half = paths[: max(1, records // 1000 // WORKERS)]  # as many records as a timed stretch
    return _bare_processes([(half[w::WORKERS] if len(half) > 1 else half,)
                            for w in range(WORKERS)])


def _bare_processes(args: list[tuple]) -> float:
    """Records per second of one ``_bare(*a, queue)``-like process per ``a`` in ``args``
    (``a``: paths, then ``make`` and ``parse`` if given), run side by side."""
    context = multiprocessing.get_context("fork")
    queue: Any = context.Queue()
    procs = [context.Process(target=_bare, args=(a[0], queue, *a[1:])) for a in args]
    start = time.perf_counter()
    for p in procs:
        p.start()
    got = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(n for n, _ in got) / (time.perf_counter() - start)


def rate(make: Callable[[], Any], batches: int, warmup: int = 20,
         count: Callable[[Any], int] = lambda batch: len(batch["cls"])) -> float:
    """What ``count`` counts in a batch (records), a second, over ``batches`` after a
    warm-up."""
    loader = make()
    try:
        it = iter(loader)
        for _ in range(warmup):
            next(it)
        start = time.perf_counter()
        rows = 0
        for _ in range(batches):
            rows += count(next(it))
        return rows / (time.perf_counter() - start)
    finally:
        close = getattr(loader, "close", None)
        if close:
            close()


def write_jsonl(directory: str, shards: int, per_shard: int, suffix: str) -> list[str]:
    """``shards`` JSON lines files of ``per_shard`` records, compressed by ``suffix``."""
    import gzip
    import json

    from jaxloader.streams.compressed import _zstd_module

    pack = {"": lambda b: b, ".gz": gzip.compress,
            ".zst": lambda b: _zstd_module("bench").compress(b, 3)}[suffix]
    import numpy as np

    # words drawn at random from 4,096 (as compressible as English text: gzip ~3x)
    words = np.array([f"{chr(97 + i % 26)}{i:x}" for i in range(4096)], dtype=object)
    paths = []
    for s in range(shards):
        drawn = words[np.random.default_rng(s).zipf(1.2, (per_shard, 120)) % 4096]
        lines = [json.dumps({"id": s * per_shard + i, "text": " ".join(row)})
                 for i, row in enumerate(drawn.tolist())]
        path = os.path.join(directory, f"part-{s:04d}.jsonl{suffix}")
        with open(path, "wb") as f:
            f.write(pack(("\n".join(lines) + "\n").encode()))
        paths.append(path)
    return paths


def text_length(record: dict) -> dict:
    return {"cls": record["id"], "length": len(record["text"])}


def jsonl_loader(paths: list[str]) -> Callable[[], Any]:
    return stream_loader(lambda: jl.Stream.jsonl(paths), text_length)


def restore_seconds(make: Callable[[], Any], per_shard: int, shards: int) -> float:
    """Seconds from ``load_state_dict`` to the first batch, for a state whose readers are each
    in the middle of a shard (a fresh loader each time: its workers started before)."""
    loader = make()
    it = iter(loader)
    for _ in range(per_shard * WORKERS // BATCH // 2 or 1):  # half a shard for each reader
        next(it)
    state = loader.state_dict()
    loader.close()
    loader = make()
    try:
        next(iter(loader))  # the workers started
        start = time.perf_counter()
        loader.load_state_dict(state)
        next(iter(loader))
        return time.perf_counter() - start
    finally:
        loader.close()


def jsonl_ceiling(paths: list[str]) -> float:
    """Records per second of 2 bare processes, each reading and parsing one whole shard
    (``JsonlShard``, ``text_length``): no batching, nothing sent."""
    return _bare_processes([([paths[w]], jl.JsonlShard, text_length) for w in range(WORKERS)])


def seek_rate(path: str, offset: int) -> float:
    """MiB a second of a shard's ``reset`` to the state at ``offset`` (decompressed bytes):
    what a restore costs a reader, without the loader around it."""
    shard = jl.JsonlShard(path)
    start = time.perf_counter()
    shard.reset({"offset": offset, "line": 0})
    elapsed = time.perf_counter() - start
    shard.close()
    return offset / 2**20 / elapsed


def compressed(args: argparse.Namespace, work: str) -> None:
    shards, per_shard = max(WORKERS, args.shards // 10), args.per_shard * 10
    loaders, sizes, firsts, every = {}, {}, {}, {}
    for suffix, name in (("", "plain .jsonl"), (".gz", ".jsonl.gz"), (".zst", ".jsonl.zst")):
        folder = os.path.join(work, name.strip("."))
        os.makedirs(folder)
        paths = every[name] = write_jsonl(folder, shards, per_shard, suffix)
        sizes[name], firsts[name] = sum(map(os.path.getsize, paths)) / 2**20, paths[0]
        loaders[name] = jsonl_loader(paths)
    end = os.path.getsize(firsts["plain .jsonl"]) - 1  # the last line's last byte
    rates: dict = {name: [] for name in loaders}
    restores: dict = {name: [] for name in loaders}
    seeks: dict = {name: [] for name in loaders}
    ceilings: dict = {name: [] for name in loaders}
    names = list(rates)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rates[name].append(rate(loaders[name], args.batches))
            ceilings[name].append(jsonl_ceiling(every[name]))
            restores[name].append(restore_seconds(loaders[name], per_shard, shards))
            seeks[name].append(seek_rate(firsts[name], end))
    medians = {name: statistics.median(v) for name, v in rates.items()}
    tops = {name: statistics.median(v) for name, v in ceilings.items()}
    plain = medians["plain .jsonl"]
    print(f"{machine()}; {shards} JSON lines shards x {per_shard} records "
          f"({sizes['plain .jsonl'] / shards:.1f} MiB a shard), batch {BATCH}, "
          f"{args.rounds} rounds")
    print(table([(name, f"{sizes[name]:.0f}", f"{v:,.0f}", f"{v / plain:.2f}",
                  f"{tops[name]:,.0f}", f"{v / tops[name]:.0%}",
                  f"{statistics.median(restores[name]):.3f}",
                  f"{statistics.median(seeks[name]):,.0f}" if name != "plain .jsonl"
                  else "- (a seek)")
                 for name, v in medians.items()],
                ("shards", "MiB", "records/s (median)", "vs plain",
                 "ceiling: 2 bare readers, records/s", "% of ceiling",
                 "s from load_state_dict to a batch (mid-shard)",
                 "a shard's reset to its end, MiB/s")))
    print("saved", save("streams_compressed", {"machine": machine(), "rates": rates,
                                               "restore_s": restores, "seek_mib_s": seeks,
                                               "ceiling": ceilings, "mib": sizes}))


def passes(args: argparse.Namespace, work: str) -> None:
    """An endless loader against passes that end, the same shards, taking turns."""
    shards, per_shard = max(WORKERS, args.shards // 10), args.per_shard * 10
    paths = write_jsonl(work, shards, per_shard, "")
    real = lambda batch: int(batch["mask"].sum())  # noqa: E731 - records, not padding

    def make(workers: int, num_epochs: int | None) -> Callable[[], Any]:
        return lambda: jl.StreamLoader(jl.Stream.jsonl(paths, shuffle_window=256),
                                       batch_size=BATCH, num_workers=workers,
                                       num_epochs=num_epochs, transforms=[jl.Map(text_length)],
                                       readers_per_process=WORKERS, process_index=0,
                                       process_count=1)

    def whole_pass(workers: int) -> float:
        loader = make(workers, 1)()
        try:
            next(iter(loader))  # the workers started; the rest of the pass is timed
            start, rows = time.perf_counter(), 0
            for batch in loader:
                rows += real(batch)
            return rows / (time.perf_counter() - start)
        finally:
            loader.close()

    cases: dict[str, Callable[[], float]] = {}
    for workers in (0, WORKERS):
        where = "in process" if workers == 0 else f"{workers} workers"
        cases[f"endless, {where}"] = functools.partial(rate, make(workers, None), args.batches)
        cases[f"pass (num_epochs=1), {where}"] = functools.partial(
            rate, make(workers, 1), args.batches, count=real)
        cases[f"pass, the rest of a whole pass, {where}"] = functools.partial(whole_pass, workers)
    rates: dict = {name: [] for name in cases}
    names = list(cases)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rates[name].append(cases[name]())
    medians = {name: statistics.median(v) for name, v in rates.items()}
    print(f"{machine()}; {shards} JSON lines shards x {per_shard} records, batch {BATCH}, "
          f"{args.rounds} rounds")
    rows = []
    for name, v in medians.items():  # ratios within a round: this machine's speed drifts
        endless = rates[f"endless, {name.rsplit(', ', 1)[1]}"]
        ratios = [a / b for a, b in zip(rates[name], endless)]
        rows.append((name, f"{v:,.0f}", f"{statistics.median(ratios):.2f}x "
                     f"({min(ratios):.2f}-{max(ratios):.2f})"))
    print(table(rows, ("loader", "records/s (median)", "vs endless (a round's; range)")))
    print("saved", save("stream_passes", {"machine": machine(), "rates": rates}))


def huggingface(args: argparse.Namespace, work: str) -> None:
    """A Hugging Face ``IterableDataset`` over Parquet files: jaxloader reading it as it is
    (``Stream.huggingface``) against the generator recipe the README gave before (a shard of
    it a ``from_generator`` shard) and against the dataset iterated bare in one process
    (Python records, no batching); then the seconds to restore mid-shard with each."""
    import datasets
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards, per_shard = WORKERS * 2, args.per_shard * 25
    paths = []
    for i in range(shards):
        ids = np.arange(i * per_shard, (i + 1) * per_shard)
        vectors = np.random.default_rng(i).random((per_shard, 16), dtype=np.float32)
        paths.append(os.path.join(work, f"hf-{i:03d}.parquet"))
        pq.write_table(pa.table({"id": ids, "vector": pa.FixedSizeListArray.from_arrays(
            pa.array(vectors.ravel()), 16), "text": [f"row {j}" for j in ids]}), paths[-1],
            row_group_size=10_000)
    ds = datasets.load_dataset("parquet", data_files=paths, split="train", streaming=True)
    generator = jl.Stream.from_generator(lambda i: iter(ds.shard(ds.num_shards, i)),
                                         shards=ds.num_shards)

    def make(stream: Any, workers: int) -> Callable[[], Any]:
        return lambda: jl.StreamLoader(stream, batch_size=BATCH, num_workers=workers,
                                       process_index=0, process_count=1)

    def bare() -> float:
        start, rows = time.perf_counter(), 0
        for _ in ds:
            rows += 1
            if rows == args.batches * BATCH:
                break
        return rows / (time.perf_counter() - start)

    count = lambda batch: len(batch["id"])  # noqa: E731
    cases: dict[str, Callable[[], float]] = {"the dataset iterated bare, in process": bare}
    try:  # the dataset's own integration: an IterableDataset is torch's where torch is
        import torch.utils.data

        cases["torch DataLoader(ds), 2 workers (datasets deals the files)"] = functools.partial(
            rate, lambda: _TorchLoader(torch.utils.data.DataLoader(
                ds, batch_size=BATCH, num_workers=WORKERS)), args.batches, count=count)
    except ImportError:
        pass
    for workers in (0, WORKERS):
        where = "in process" if workers == 0 else f"{workers} workers"
        cases[f"jaxloader StreamLoader(ds), {where}"] = functools.partial(
            rate, make(ds, workers), args.batches, count=count)
        cases[f"the generator recipe (lists as lists), {where}"] = functools.partial(
            rate, make(generator, workers), args.batches, count=count)
    rates: dict = {name: [] for name in cases}
    names = list(cases)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rates[name].append(cases[name]())
    restores = {name: [restore_seconds(make(stream, WORKERS), per_shard, shards)
                       for _ in range(args.rounds)]
                for name, stream in (("Stream.huggingface (the dataset's state)", ds),
                                     ("the generator recipe (skips records)", generator))}
    print(f"{machine()}; datasets {datasets.__version__}; {shards} Parquet files x "
          f"{per_shard:,} rows (an id, float32[16], a short string), batch {BATCH}, "
          f"{args.rounds} rounds")
    bare_rates = rates["the dataset iterated bare, in process"]
    print(table([(name, f"{statistics.median(v):,.0f}",
                  f"{statistics.median([a / b for a, b in zip(v, bare_rates)]):.2f}x")
                 for name, v in rates.items()],
                ("reader", "records/s (median)", "vs the dataset bare (a round's)")))
    print(table([(name, f"{statistics.median(v):.2f}") for name, v in restores.items()],
                ("restore, each reader half-way through a file", "seconds to the first batch")))
    print("saved", save("stream_huggingface", {"machine": machine(), "rates": rates,
                                               "restores": restores}))


class _TorchLoader:
    """A torch ``DataLoader`` as ``rate`` reads it: ``iter()`` and ``close()``."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._it: Any = None

    def __iter__(self) -> Any:
        self._it = iter(self.loader)
        return self._it

    def close(self) -> None:
        shutdown = getattr(self._it, "_shutdown_workers", None)
        if shutdown:
            shutdown()


def byte_tokens(record: dict) -> dict:
    """A record's text as tokens: its UTF-8 bytes (a stand-in for a tokenizer), repeated or cut
    to a long-tailed length fixed by its id (lognormal, median ~300, at most 8,192), as
    documents' lengths are."""
    import numpy as np

    text = np.frombuffer(record["text"].encode(), np.uint8)
    return {"tokens": np.resize(text, _doc_lengths()[record["id"] % 65_536])}


@functools.cache
def _doc_lengths():
    import numpy as np

    drawn = np.random.default_rng(0).lognormal(np.log(300), 1.0, 65_536)
    return np.minimum(8192, 1 + drawn.astype(np.int64)).tolist()


def packed(args: argparse.Namespace, work: str) -> None:
    """Rows of 2,048 byte tokens packed from JSON lines (``PackedStream``, concatenated and
    best-fit), 2 workers, 8 rows a batch, against 2 bare processes reading the lines and
    tokenizing them, nothing packed. Tokens/s count tokens, not padding."""
    shards, per_shard = max(WORKERS, args.shards // 10), args.per_shard * 10
    folder = os.path.join(work, "packed")
    os.makedirs(folder)
    paths = write_jsonl(folder, shards, per_shard, "")
    shard = jl.JsonlShard(paths[0])
    shard.reset()
    per_record = sum(len(byte_tokens(shard.next())["tokens"]) for _ in range(per_shard))
    per_record /= per_shard
    shard.close()
    methods = {"concat": {}, "best_fit, window 1,000, 16 bins": {"method": "best_fit"}}
    rates: dict = {name: [] for name in methods}
    padding: dict = {name: [] for name in methods}
    ceilings: list = []
    for _ in range(args.rounds):
        for name, fit in methods.items():
            seen = [0, 0]

            def tokens(batch: dict) -> int:
                n = int((batch["tokens_segment_ids"] > 0).sum())
                seen[0], seen[1] = seen[0] + n, seen[1] + batch["tokens"].size
                return n

            rates[name].append(rate(lambda: jl.StreamLoader(
                jl.PackedStream(jl.Stream.jsonl(paths), "tokens", 2048, tokenize=byte_tokens,
                                dtype="uint8", **fit), batch_size=8, seed=0,
                num_workers=WORKERS, process_index=0, process_count=1), args.batches * 4,
                warmup=5, count=tokens))
            padding[name].append(1 - seen[0] / seen[1])
        ceilings.append(_bare_processes([([paths[w]], jl.JsonlShard, byte_tokens)
                                         for w in range(WORKERS)]) * per_record)
    top = statistics.median(ceilings)
    print(f"{machine()}; {shards} JSON lines shards x {per_shard} records "
          f"({per_record:.0f} tokens a record), rows of 2,048, batch 8, {args.rounds} rounds")
    print(table([(f"jaxloader StreamLoader(PackedStream(..., {name})), 2 workers",
                  f"{statistics.median(rates[name]):,.0f}",
                  f"{statistics.median(rates[name]) / top:.0%}",
                  f"{statistics.median(padding[name]):.2%}") for name in methods]
                + [("ceiling: 2 bare processes reading and tokenizing, nothing packed",
                    f"{top:,.0f}", "100%", "")],
                ("loader", "tokens/s (median)", "% of ceiling", "padding")))
    print("saved", save("streams_packed", {"machine": machine(), "tokens_s": rates,
                                           "padding": padding, "ceiling_tokens_s": ceilings}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="tar,compressed,packed,passes,huggingface",
                        help="comma-separated subset of: tar, compressed, packed, passes, "
                        "huggingface")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench_streams_")
    try:
        if "tar" in args.only.split(","):
            run(args, work)
        if "compressed" in args.only.split(","):
            compressed(args, work)
        if "packed" in args.only.split(","):
            packed(args, work)
        if "passes" in args.only.split(","):
            passes(args, work)
        if "huggingface" in args.only.split(","):
            huggingface(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # ~400 MB of shards


def run(args: argparse.Namespace, work: str) -> None:
    start = time.perf_counter()
    paths = write_shards(work, args.shards, args.per_shard)
    print(f"wrote {args.shards} shards of {args.per_shard} records in "
          f"{time.perf_counter() - start:.0f} s ({sum(map(os.path.getsize, paths)) / 2**20:.0f}"
          " MiB)")
    loaders = {"jaxloader StreamLoader, 2 workers": jaxloader_loader(paths),
               "jaxloader jl.mix of 3 tar streams (0.5/0.3/0.2), 2 workers":
               jaxloader_mixed(paths)}
    try:
        loaders["torch DataLoader(IterableDataset), 2 workers"] = torch_loader(paths)
    except ImportError as e:
        print(f"torch not measured: {e}")
    try:
        loaders["WebDataset in torch DataLoader, 2 workers"] = webdataset_loader(paths)
    except ImportError as e:
        print(f"webdataset not measured: {e}")
    rates: dict = {name: [] for name in loaders}
    rates["ceiling: 2 bare processes reading and decoding"] = []
    names = list(rates)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name.startswith("ceiling"):
                rates[name].append(ceiling(paths, args.batches * BATCH))
            else:
                rates[name].append(rate(loaders[name], args.batches))
    medians = {name: statistics.median(v) for name, v in rates.items()}
    torch_rate = medians.get("torch DataLoader(IterableDataset), 2 workers")
    top = medians["ceiling: 2 bare processes reading and decoding"]
    print(f"{machine()}; {args.shards} tar shards x {args.per_shard} records, batch {BATCH}, "
          f"{args.rounds} rounds")
    print(table([(name, f"{v:,.0f}", f"{v / torch_rate:.2f}x" if torch_rate else "",
                  f"{v / top:.0%}") for name, v in medians.items()],
                ("loader", "records/s (median)", "vs torch", "% of ceiling")))
    print("saved", save("streams", {"machine": machine(), "rates": rates, "medians": medians}))


if __name__ == "__main__":
    main()
