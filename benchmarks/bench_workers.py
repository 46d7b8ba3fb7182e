"""jaxloader workers vs Grain (``mp_prefetch`` and ``grain.DataLoader``), tf.data and PyTorch's
DataLoader, 2 workers, one run.

Run: ``python benchmarks/bench_workers.py [--quick]`` (needs ``pip install -e .[benchmark]``;
tf.data and PyTorch join where installed, written as ``peers.py`` says; tf.data's 2 "workers"
are ``num_parallel_calls=2``, threads of this process).

Cases (same data, same process run; the loaders take turns, a fresh iterator each, over several
rounds; medians per loader and the median of each round's ratio; warm-up: 5 batches, one epoch
for the large data):
- large: 2,048 records of 224x224x3 uint8 + label, batch 64, in-memory, no transform;
- small: 60,000 x (784 uint8 + label), batch 128, shuffled, per-record identity Map;
- cpu: the large images through a random crop to 192, flip and normalise to float32;
- time to first batch (construction -> first batch) on the small and the large data;
- resident memory of the workers and the shared memory the loader holds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from multiprocessing import shared_memory
from typing import Callable, Iterator

import numpy as np

import jaxloader as jl
import peers
from common import RecordSource, machine, save, shared_bytes, table

WORKERS = 2


def identity(record: dict) -> dict:
    return record


def crop_flip_normalise(record: dict, rng: np.random.Generator) -> dict:
    image = record["image"]
    y, x = rng.integers(0, 224 - 192 + 1, size=2)
    image = image[y:y + 192, x:x + 192]
    if rng.random() < 0.5:
        image = image[:, ::-1]
    image = (image.astype(np.float32) - 127.5) / 127.5
    return {"image": image, "label": record["label"]}


def batches_per_second(make_iter: Callable[[], Iterator], warmup: int, count: int) -> float:
    """One fresh iterator: ``warmup`` batches, then the rate over ``count`` batches."""
    it = make_iter()
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(count):
        next(it)
    rate = count / (time.perf_counter() - start)
    del it
    return rate


def interleaved_rates(loaders: dict, warmup: int, count: int, rounds: int) -> dict:
    """Each round runs every loader once, starting from a different one each round, so a slow
    moment of the machine hits all of them alike; returns the list of rates per loader."""
    names = list(loaders)
    rates: dict = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rates[name].append(batches_per_second(loaders[name], warmup, count))
            close(loaders[name])
            print(f"  round {r + 1}: {name:26s} {rates[name][-1]:10.1f} batches/s", flush=True)
    return rates


def first_batch_seconds(make_iter: Callable[[], Iterator], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        close(make_iter)  # the previous loader's shutdown is not part of this one's start
        start = time.perf_counter()
        it = make_iter()
        next(it)
        times.append(time.perf_counter() - start)
        del it
    return statistics.median(times)


# -- the loaders -------------------------------------------------------------------------------
def grain_mp(source, batch, map_fn=None, random_fn=None, shuffle=True) -> Callable[[], Iterator]:
    import grain

    def make() -> Iterator:
        ds = grain.MapDataset.source(source)
        ds = ds.shuffle(seed=0) if shuffle else ds
        ds = ds.repeat()
        if map_fn is not None:
            ds = ds.map(map_fn)
        if random_fn is not None:
            ds = ds.random_map(random_fn, seed=0)
        ds = ds.batch(batch, drop_remainder=True).to_iter_dataset()
        return iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=WORKERS)))
    return make


def grain_loader(source, batch, map_fn=None, random_fn=None, shuffle=True):
    import grain

    ops = []
    if map_fn is not None:
        ops.append(_GrainMap(map_fn))
    if random_fn is not None:
        ops.append(_GrainRandomMap(random_fn))
    ops.append(grain.transforms.Batch(batch, drop_remainder=True))

    def make() -> Iterator:
        sampler = grain.samplers.IndexSampler(len(source), shuffle=shuffle, num_epochs=None,
                                              seed=0)
        return iter(grain.DataLoader(data_source=source, sampler=sampler, operations=ops,
                                     worker_count=WORKERS))
    return make


def _grain_classes():
    import grain

    class GrainMap(grain.transforms.Map):
        def __init__(self, fn):
            self.fn = fn

        def map(self, element):
            return self.fn(element)

    class GrainRandomMap(grain.transforms.RandomMap):
        def __init__(self, fn):
            self.fn = fn

        def random_map(self, element, rng):
            return self.fn(element, rng)

    return GrainMap, GrainRandomMap


_GrainMap, _GrainRandomMap = _grain_classes()


def jaxloader_iter(source, batch, workers, transforms=(), shuffle=True):
    holder = {}

    def make() -> Iterator:
        old = holder.pop("loader", None)
        if old is not None:
            old.close()
        loader = jl.DataLoader(source, batch_size=batch, shuffle=shuffle, seed=0,
                               transforms=list(transforms), num_workers=workers, num_epochs=None,
                               process_index=0, process_count=1)
        holder["loader"] = loader
        return iter(loader)
    make.holder = holder  # type: ignore[attr-defined]
    return make


def close(make) -> None:
    loader = getattr(make, "holder", {}).pop("loader", None)
    if loader is not None:
        loader.close()


# -- the copy ceiling --------------------------------------------------------------------------
def _gather(name: str, shape: tuple, batch: int, seconds: float, go, rates) -> None:
    shm = shared_memory.SharedMemory(name=name)
    source = np.ndarray(shape, np.uint8, buffer=shm.buf)
    out = np.zeros((4, batch, *shape[1:]), np.uint8)  # reused and touched, like the slots
    rng = np.random.default_rng(os.getpid())
    go.wait()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        np.take(source, rng.integers(0, shape[0], batch), axis=0, out=out[n % 4], mode="clip")
        n += 1
    rates.put(n / (time.perf_counter() - start))
    del source
    shm.close()


def gather_ceiling(images: np.ndarray, batch: int, processes: int = WORKERS,
                   seconds: float = 3.0) -> float:
    """Batches/s of ``processes`` processes doing nothing but gathering random rows of a
    shared copy of ``images`` into reused buffers: what any loader's copies cost here."""
    ctx = multiprocessing.get_context("spawn")
    shm = shared_memory.SharedMemory(create=True, size=images.nbytes)
    try:
        np.ndarray(images.shape, np.uint8, buffer=shm.buf)[...] = images
        go, rates = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_gather, args=(shm.name, images.shape, batch, seconds, go,
                                                    rates)) for _ in range(processes)]
        for p in procs:
            p.start()
        time.sleep(1.0)  # let both interpreters start before the clock does
        go.set()
        total = sum(rates.get(timeout=60 + seconds) for _ in procs)
        for p in procs:
            p.join()
        return total
    finally:
        shm.close()
        shm.unlink()


# -- memory ------------------------------------------------------------------------------------
def rss_kib(pid: int) -> dict:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssShmem", "RssFile"):
                fields[key] = int(value.split()[0])
    return fields


def memory_report(source_bytes: int, arrays: dict, workers: int) -> dict:
    loader = jl.DataLoader(jl.ArraySource(arrays), batch_size=64, shuffle=True, seed=0,
                           transforms=[jl.Map(identity)], num_workers=workers, num_epochs=None,
                           process_index=0, process_count=1)
    it = iter(loader)
    for _ in range(3 * len(loader)):  # touch every record a few times
        next(it)
    report = {
        "source_MiB": source_bytes / 2**20,
        "workers": workers,
        "worker_rss_MiB": [rss_kib(p)["VmRSS"] / 1024 for p in loader.worker_pids],
        "worker_private_MiB": [rss_kib(p)["RssAnon"] / 1024 for p in loader.worker_pids],
        "worker_shared_MiB": [rss_kib(p)["RssShmem"] / 1024 for p in loader.worker_pids],
        "shared_MiB": shared_bytes(os.getpid()) / 2**20,
    }
    loader.close()
    return report


def add_peers(cases: dict, large_images: np.ndarray, large_labels: np.ndarray,
              small_images: np.ndarray, small_labels: np.ndarray) -> None:
    """tf.data and PyTorch's DataLoader in each case, where installed (see ``peers.py``)."""
    have = peers.available()
    print(f"peers not installed, left out: {[k for k, ok in have.items() if not ok] or 'none'}")
    if have["tf.data"]:
        cases["large"][2]["tf.data"] = peers.tf_data(large_images, large_labels, 64,
                                                     workers=WORKERS)
        cases["small"][2]["tf.data, TF ops"] = peers.tf_data(
            small_images, small_labels, 128, workers=WORKERS, tf_map=lambda record: record)
        cases["small"][2]["tf.data, numpy_function"] = peers.tf_data(
            small_images, small_labels, 128, workers=WORKERS, map_fn=identity)
        cases["cpu"][2]["tf.data, TF ops"] = peers.tf_data(
            large_images, large_labels, 64, workers=WORKERS, tf_map=peers.tf_crop_flip_normalise)
        cases["cpu"][2]["tf.data, numpy_function"] = peers.tf_data(
            large_images, large_labels, 64, workers=WORKERS, random_fn=crop_flip_normalise)
    if have["torch"]:
        cases["large"][2]["torch DataLoader"] = peers.torch_loader(
            large_images, large_labels, 64, workers=WORKERS)
        cases["small"][2]["torch DataLoader"] = peers.torch_loader(
            small_images, small_labels, 128, workers=WORKERS, map_fn=identity)
        cases["cpu"][2]["torch DataLoader"] = peers.torch_loader(
            large_images, large_labels, 64, workers=WORKERS, random_fn=crop_flip_normalise)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer batches and repeats")
    parser.add_argument("--rounds", type=int, default=None, help="default 5, 3 with --quick")
    parser.add_argument("--big-source-gib", type=float, default=2.0)
    parser.add_argument("--only", default="large,small,cpu,first,memory",
                        help="comma-separated subset of: large, small, cpu, first, memory")
    args = parser.parse_args()
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain's workers read absl flags; we pass none
    rounds = args.rounds or (3 if args.quick else 5)
    rng = np.random.default_rng(0)
    large_images = rng.integers(0, 256, (2048, 224, 224, 3), dtype=np.uint8)
    large_labels = rng.integers(0, 10, 2048).astype(np.int64)
    small_images = rng.integers(0, 256, (60_000, 784), dtype=np.uint8)
    small_labels = rng.integers(0, 10, 60_000).astype(np.int64)
    large_plain = RecordSource(large_images, large_labels)
    small_plain = RecordSource(small_images, small_labels)
    large_arrays = jl.ArraySource({"image": large_images, "label": large_labels})
    small_arrays = jl.ArraySource({"image": small_images, "label": small_labels})
    random_map = jl.RandomMap(crop_flip_normalise)

    cases = {
        "large": (64, 40 if args.quick else 150, {
            "grain mp_prefetch": grain_mp(large_plain, 64),
            "grain.DataLoader": grain_loader(large_plain, 64),
            "jaxloader 0 workers": jaxloader_iter(large_arrays, 64, 0),
            "jaxloader 2 workers": jaxloader_iter(large_arrays, 64, WORKERS),
        }),
        "small": (128, 200 if args.quick else 600, {
            "grain mp_prefetch": grain_mp(small_plain, 128, map_fn=identity),
            "grain.DataLoader": grain_loader(small_plain, 128, map_fn=identity),
            "jaxloader 0 workers": jaxloader_iter(small_arrays, 128, 0, [jl.Map(identity)]),
            "jaxloader 2 workers": jaxloader_iter(small_arrays, 128, WORKERS,
                                                  [jl.Map(identity)]),
        }),
        "cpu": (64, 10 if args.quick else 30, {
            "grain mp_prefetch": grain_mp(large_plain, 64, random_fn=crop_flip_normalise),
            "grain.DataLoader": grain_loader(large_plain, 64, random_fn=crop_flip_normalise),
            "jaxloader 0 workers": jaxloader_iter(large_arrays, 64, 0, [random_map]),
            "jaxloader 2 workers": jaxloader_iter(large_arrays, 64, WORKERS, [random_map]),
        }),
    }
    add_peers(cases, large_images, large_labels, small_images, small_labels)
    only = set(args.only.split(","))
    results: dict = {"machine": machine(), "peers": peers.available(), "throughput": {},
                     "rates": {}, "ratio_per_round": {}, "first_batch_s": {}}
    for case, (batch, count, loaders) in cases.items():
        if case not in only:
            continue
        # large: one epoch (32 batches) first, so every loader has touched each source page once
        # (the first touch is a page fault: ~15,000 a run, ~12% of a 150-batch stretch)
        warmup = 40 if case == "large" else 5
        rates = interleaved_rates(loaders, warmup=warmup, count=count, rounds=rounds)
        results["rates"][case] = rates
        results["throughput"][case] = {name: statistics.median(r) for name, r in rates.items()}
        results["ratio_per_round"][case] = [
            a / b for a, b in zip(rates["jaxloader 2 workers"], rates["grain mp_prefetch"])]
        for name, bps in results["throughput"][case].items():
            print(f"{case:6s} {name:26s} {bps:10.1f} batches/s (median)", flush=True)
        if case == "large":
            ceiling = [gather_ceiling(large_images, batch) for _ in range(3)]
            results["large_copy_ceiling"] = statistics.median(ceiling)
            print(f"large  copy ceiling ({WORKERS} processes, np.take only) "
                  f"{results['large_copy_ceiling']:10.1f} batches/s (median of 3)", flush=True)
    for case in ("small", "large") if "first" in only else ():
        results["first_batch_s"][case] = {}
        for name in ("grain mp_prefetch", "grain.DataLoader", "jaxloader 2 workers"):
            make = cases[case][2][name]
            seconds = first_batch_seconds(make)
            close(make)
            results["first_batch_s"][case][name] = seconds
            print(f"first batch {case:6s} {name:22s} {seconds:.3f} s", flush=True)

    if "memory" in only:
        big_n = int(args.big_source_gib * 2**30 // (224 * 224 * 3))
        big = {"image": np.resize(large_images, (big_n, 224, 224, 3)),
               "label": np.resize(large_labels, big_n)}
        source_bytes = big["image"].nbytes + big["label"].nbytes
        results["memory"] = memory_report(source_bytes, big, 4)
        del big
        print(results["memory"])

    for case, (batch, _, _) in cases.items():
        if case not in results["throughput"]:
            continue
        rows, base = [], results["throughput"][case]["grain mp_prefetch"]
        for name, bps in results["throughput"][case].items():
            rows.append((name, f"{bps:,.1f}", f"{bps * batch / 1e3:,.1f}k", f"{bps / base:.2f}x"))
        per_round = ", ".join(f"{x:.1f}x" for x in results["ratio_per_round"][case])
        print(f"\n{case}, batch {batch}; {machine()}; median of {rounds} rounds")
        if case == "large" and "large_copy_ceiling" in results:
            c = results["large_copy_ceiling"]
            rows.append((f"ceiling: {WORKERS} processes only copying", f"{c:,.1f}",
                         f"{c * batch / 1e3:,.1f}k", f"{c / base:.2f}x"))
        print(table(rows, ("loader", "batches/s", "records/s", "vs grain mp_prefetch")))
        print(f"jaxloader 2 workers / grain mp_prefetch, round by round: {per_round} "
              f"(median {statistics.median(results['ratio_per_round'][case]):.1f}x)")
        peer_rates = {name: r for name, r in results["rates"][case].items()
                      if not name.startswith("jaxloader")}
        best = max(peer_rates, key=lambda name: statistics.median(peer_rates[name]))
        ratios = [a / b for a, b in zip(results["rates"][case]["jaxloader 2 workers"],
                                        peer_rates[best])]
        results.setdefault("vs_fastest_peer", {})[case] = {"peer": best, "per_round": ratios}
        print(f"jaxloader 2 workers / the fastest peer ({best}), round by round: "
              f"{', '.join(f'{x:.2f}x' for x in ratios)} (median {statistics.median(ratios):.2f}x)")
    save("workers", results)


if __name__ == "__main__":
    main()
