"""Where a crop ``JitMap`` worker's time goes on this machine, against what its memory allows:
the numbers behind "Compiled transforms" in docs/benchmarks.md.

Run: ``python benchmarks/jitmap_where.py [--rounds 3]``, alone on the machine, in
``bench_jitmap.py``'s environment (its crop function is imported from there; TensorFlow is not
used). Each round, in turn:

- bytes only: two processes doing nothing but write a crop batch's output (64 x 192x192x3
  float32, 28.3 MB) into a buffer, 16 chunks of 1.77 MB from one hot chunk, as a worker copies
  its chunks into its slot (its ``GLIBC_TUNABLES``: copies past the caches); batches/s of the
  two together: the most any loader writing float32 batches could make here;
- XLA alone: one process on one core running ``bench_jitmap.jax_crop`` ``jit(vmap)``-ed on one
  hot 4-row chunk (a worker's chunk), each call waited for; the same with the crop at a fixed
  place and no flip (no gather, no select), and with the keys only; microseconds a chunk, and
  the batches/s 16 such chunks a batch give one core.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CHUNK_ROWS, CHUNKS = 4, 16  # a worker's chunk of the crop case, and a batch of 64 in them
OUT_BYTES = CHUNK_ROWS * 192 * 192 * 3 * 4


def _write(seconds: float, done) -> None:
    chunk = np.ones(OUT_BYTES, np.uint8)
    out = np.zeros(OUT_BYTES * CHUNKS, np.uint8)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for c in range(CHUNKS):
            out[c * OUT_BYTES:(c + 1) * OUT_BYTES] = chunk
        n += 1
    done.put(n / (time.perf_counter() - start))


def bytes_only(seconds: float = 3.0) -> float:
    """Batches/s of two processes writing a batch's output, together."""
    from jaxloader.workers.process import worker_environment

    ctx = multiprocessing.get_context("spawn")
    done = ctx.Queue()
    before = os.environ.get("GLIBC_TUNABLES")
    tunables = worker_environment(os.environ).get("GLIBC_TUNABLES")
    if tunables:
        os.environ["GLIBC_TUNABLES"] = tunables
    try:
        procs = [ctx.Process(target=_write, args=(seconds, done)) for _ in range(2)]
        for p in procs:
            p.start()
        rates = [done.get(timeout=120) for _ in procs]
        for p in procs:
            p.join()
    finally:
        if before is None:
            os.environ.pop("GLIBC_TUNABLES", None)
        else:
            os.environ["GLIBC_TUNABLES"] = before
    return sum(rates)


def _xla(calls: int, done) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a worker's XLA
    import jax
    import jax.numpy as jnp

    from bench_jitmap import jax_crop
    from jaxloader.batching.jit_inputs import record_keys

    def fixed(record, key):
        image = record["image"][10:202, 10:202]
        return {"image": (image.astype(jnp.float32) - 127.5) / 127.5, "label": record["label"]}

    def keys_only(record, key):
        k_crop, k_flip = jax.random.split(key)
        y, x = jax.random.randint(k_crop, (2,), 0, 224 - 192 + 1)
        return {"y": y + x + jax.random.bernoulli(k_flip), "label": record["label"]}

    rng = np.random.default_rng(0)
    chunk = {"image": rng.integers(0, 256, (CHUNK_ROWS, 224, 224, 3), np.uint8),
             "label": np.arange(CHUNK_ROWS, dtype=np.int32)}
    keys = record_keys(0, 0, np.arange(CHUNK_ROWS), 0)
    out = {}
    for name, fn in (("crop", jax_crop), ("fixed crop, no flip", fixed), ("keys only", keys_only)):
        f = jax.jit(jax.vmap(lambda r, k, fn=fn: fn(r, jax.random.wrap_key_data(
            k, impl="threefry2x32"))))
        jax.block_until_ready(f(chunk, keys))
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            jax.block_until_ready(f(chunk, keys))
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times) * 1e6
    done.put(out)


def xla_alone(calls: int = 300) -> dict:
    """Microseconds a chunk (medians), in a fresh process on one core."""
    ctx = multiprocessing.get_context("spawn")
    done = ctx.Queue()
    p = ctx.Process(target=_xla, args=(calls, done))
    p.start()
    out = done.get(timeout=300)
    p.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for r in range(args.rounds):
        written = bytes_only()
        chunks = xla_alone()
        xla = ", ".join(f"{name} {us:.0f} us ({1e6 / (us * CHUNKS):.0f} batches/s)"
                        for name, us in chunks.items())
        print(f"round {r}: bytes only, 2 processes: {written:.0f} batches/s; XLA alone, one "
              f"core, a chunk: {xla}", flush=True)


if __name__ == "__main__":
    main()
