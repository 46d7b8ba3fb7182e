"""``JitMap`` (a jax.numpy transform compiled by XLA over the batch) against the same transform
as a NumPy ``RandomMap``, tf.data running it as TensorFlow ops, and a ceiling; one run.

Run: ``python benchmarks/bench_jitmap.py [--rounds 5]`` (tf.data joins where ``tensorflow`` is
installed: ``pip install tensorflow-cpu``; its 2 "workers" are ``num_parallel_calls=2``).

Cases (2 workers, batch 64, the loaders taking turns over several rounds, a fresh iterator each,
medians):
- crop: 2,048 images of 224x224x3 uint8, a random crop to 192, a random flip, cast and
  normalised to float32 (``bench_workers.py``'s cpu case);
- heavy: 4,096 images of 64x64x3 uint8 through colour jitter (brightness, contrast,
  saturation, each random a record), a 3x3 blur with edge padding and a clip: a pipeline of many
  small operations a record, where a NumPy transform pays Python on each;
- the ceiling of each: two bare processes doing nothing but run the JitMap on a ready batch
  (XLA on one core each, a chunk of rows at a time, as in the workers; its output into a buffer
  made once; started with a worker's ``GLIBC_TUNABLES``), asked for batches as a loader is and
  taking its turn in each round; "of ceiling" is the median of each round's ratio to it;
- first batch (construction -> first batch, 2 workers) with the JitMap and with the RandomMap;
- ``--cached-copies``: also the JitMap with its workers' copies through the caches at every size
  (``workers.process.NON_TEMPORAL_BYTES``: what bypassing them gains).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import sys
from typing import Iterator

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jaxloader as jl  # noqa: E402
from jaxloader.workers.process import NON_TEMPORAL, worker_environment  # noqa: E402
import peers  # noqa: E402
from bench_workers import (close, first_batch_seconds, interleaved_rates,  # noqa: E402
                           jaxloader_iter)
from bench_workers import crop_flip_normalise as np_crop  # noqa: E402  (the NumPy transform)
from common import machine, save, table  # noqa: E402

WORKERS, BATCH = 2, 64
CEILING = "ceiling: 2 processes, compiled fn"


# -- crop, flip, normalise ---------------------------------------------------------------------
def jax_crop(record: dict, key):
    import jax
    import jax.numpy as jnp

    k_crop, k_flip = jax.random.split(key)
    y, x = jax.random.randint(k_crop, (2,), 0, 224 - 192 + 1)
    image = jax.lax.dynamic_slice(record["image"], (y, x, 0), (192, 192, 3))
    image = jnp.where(jax.random.bernoulli(k_flip), image[:, ::-1], image)
    return {"image": (image.astype(jnp.float32) - 127.5) / 127.5, "label": record["label"]}


# -- colour jitter and a 3x3 blur --------------------------------------------------------------
def np_heavy(record: dict, rng: np.random.Generator) -> dict:
    image = record["image"].astype(np.float32) / 255.0
    brightness, contrast, saturation = rng.uniform([-0.2, 0.8, 0.8], [0.2, 1.2, 1.2])
    image = image + brightness
    mean = image.mean()
    image = (image - mean) * contrast + mean
    gray = image.mean(axis=-1, keepdims=True)
    image = (image - gray) * saturation + gray
    h, w = image.shape[:2]
    padded = np.pad(image, ((1, 1), (1, 1), (0, 0)), mode="edge")
    image = sum(padded[i:i + h, j:j + w] for i in range(3) for j in range(3)) / 9.0
    return {"image": np.clip(image, 0.0, 1.0), "label": record["label"]}


def jax_heavy(record: dict, key):
    import jax
    import jax.numpy as jnp

    brightness, contrast, saturation = jax.random.uniform(
        key, (3,), minval=jnp.array([-0.2, 0.8, 0.8]), maxval=jnp.array([0.2, 1.2, 1.2]))
    image = record["image"].astype(jnp.float32) / 255.0 + brightness
    mean = image.mean()
    image = (image - mean) * contrast + mean
    gray = image.mean(axis=-1, keepdims=True)
    image = (image - gray) * saturation + gray
    h, w = image.shape[:2]
    padded = jnp.pad(image, ((1, 1), (1, 1), (0, 0)), mode="edge")
    image = sum(padded[i:i + h, j:j + w] for i in range(3) for j in range(3)) / 9.0
    return {"image": jnp.clip(image, 0.0, 1.0), "label": record["label"]}


def tf_heavy(record: dict) -> dict:
    """``np_heavy`` in TF ops, as a tf.data user writes it."""
    import tensorflow as tf

    image = tf.cast(record["image"], tf.float32) / 255.0
    image = tf.image.random_brightness(image, 0.2)
    image = tf.image.random_contrast(image, 0.8, 1.2)
    image = tf.image.random_saturation(image, 0.8, 1.2)
    padded = tf.pad(image[None], [[0, 0], [1, 1], [1, 1], [0, 0]], mode="SYMMETRIC")
    kernel = tf.ones((3, 3, 3, 1), tf.float32) / 9.0
    image = tf.nn.depthwise_conv2d(padded, kernel, [1, 1, 1, 1], "VALID")[0]
    return {"image": tf.clip_by_value(image, 0.0, 1.0), "label": record["label"]}


# -- a worker's copies -------------------------------------------------------------------------
@contextlib.contextmanager
def tunables(value: str | None) -> Iterator[None]:
    """Processes started inside get ``GLIBC_TUNABLES=value`` (``None``: this one's)."""
    before = os.environ.get("GLIBC_TUNABLES")
    if value is not None:
        os.environ["GLIBC_TUNABLES"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GLIBC_TUNABLES", None)
        else:
            os.environ["GLIBC_TUNABLES"] = before


def cached_copies(make):
    """``make`` (a ``jaxloader_iter``) whose workers copy through the caches at every size, as
    glibc's own threshold has them do where it is larger than a slot (``workers.process``): what
    a worker's copies into its slots gain from bypassing them (``NON_TEMPORAL_BYTES``)."""
    def started() -> Iterator:
        with tunables(f"{NON_TEMPORAL}={1 << 40}"):
            return make()
    started.holder = make.holder  # type: ignore[attr-defined]
    return started


# -- the ceiling -------------------------------------------------------------------------------
def _compiled_loop(fn, shape: tuple, requests, done) -> None:
    """Runs the JitMap on one ready batch for each request, as a worker runs it (XLA on one
    core, a chunk of rows at a time) with nothing else: no source read, no slot, no hand-over;
    its output into one buffer, made once."""
    os.environ.setdefault("JAXLOADER_XLA_THREADS", "1")
    from jaxloader.batching.record_columns import batch_columns

    jit_map = jl.JitMap(fn)
    rng = np.random.default_rng(os.getpid())
    treedef, columns = batch_columns({"image": rng.integers(0, 256, (BATCH, *shape), np.uint8),
                                      "label": np.arange(BATCH, dtype=np.int64)}, BATCH)
    out: list = []

    def alloc(nbytes: int) -> np.ndarray:
        if not out:
            out.append(np.zeros(nbytes, np.uint8))
        return out[0]
    n = 0
    while requests.get() is not None:
        jit_map.run(treedef, columns, BATCH, seed=0, epoch=0, alloc=alloc,
                    positions=np.arange(n * BATCH, (n + 1) * BATCH))
        done.put(n)
        n += 1


class Ceiling:
    """``WORKERS`` bare processes running the compiled function on a ready batch, asked for
    batches as a loader is (two ahead a process), so that it takes its turn in each round with
    the loaders: this machine's speed moves by 3x over minutes, a ceiling measured apart
    would not be this round's."""

    def __init__(self, fn, shape: tuple) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.requests, self.done = ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=_compiled_loop, args=(fn, shape, self.requests,
                                                               self.done))
                      for _ in range(WORKERS)]
        # started as a worker is, with its copies' threshold (workers.process)
        with tunables(worker_environment(os.environ).get("GLIBC_TUNABLES")):
            for p in self.procs:
                p.start()
        self.out = 0
        self.holder: dict = {}

    def __call__(self) -> Iterator:
        while self.out:  # the last round's requests, finished before this one's clock
            self.done.get(timeout=120)
            self.out -= 1
        return self._batches()

    def _batches(self) -> Iterator:
        while True:
            while self.out < 2 * WORKERS:
                self.requests.put(1)
                self.out += 1
            made = self.done.get(timeout=120)
            self.out -= 1
            yield made

    def stop(self) -> None:
        for _ in self.procs:
            self.requests.put(None)
        for p in self.procs:
            p.join(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer batches")
    parser.add_argument("--cached-copies", action="store_true",
                        help="also the JitMap with its workers' copies through the caches")
    args = parser.parse_args()
    have_tf = peers.available()["tf.data"]
    rng = np.random.default_rng(0)
    data = {
        "crop": (rng.integers(0, 256, (2048, 224, 224, 3), np.uint8), np_crop, jax_crop,
                 peers.tf_crop_flip_normalise, 40 if args.quick else 600),
        "heavy": (rng.integers(0, 256, (4096, 64, 64, 3), np.uint8), np_heavy, jax_heavy,
                  tf_heavy, 100 if args.quick else 800),
    }
    results: dict = {"machine": machine(), "cases": {}}
    rows = []
    for case, (images, np_fn, jax_fn, tf_fn, count) in data.items():
        labels = rng.integers(0, 10, len(images)).astype(np.int64)
        source = jl.ArraySource({"image": images, "label": labels})
        loaders = {
            "jaxloader JitMap": jaxloader_iter(source, BATCH, WORKERS, [jl.JitMap(jax_fn)]),
            "jaxloader RandomMap (NumPy)": jaxloader_iter(source, BATCH, WORKERS,
                                                          [jl.RandomMap(np_fn)]),
        }
        if args.cached_copies:
            loaders["JitMap, copies cached"] = cached_copies(
                jaxloader_iter(source, BATCH, WORKERS, [jl.JitMap(jax_fn)]))
        if have_tf:
            loaders["tf.data, TF ops"] = peers.tf_data(images, labels, BATCH, workers=WORKERS,
                                                       tf_map=tf_fn)
        ceiling = Ceiling(jax_fn, images.shape[1:])
        loaders[CEILING] = ceiling
        print(f"{case}: {count} batches a round", flush=True)
        try:
            rates = interleaved_rates(loaders, warmup=10, count=count, rounds=args.rounds)
        finally:
            ceiling.stop()
        for make in loaders.values():
            close(make)
        first = {name: first_batch_seconds(loaders[name]) for name in list(loaders)[:2]}
        for make in loaders.values():
            close(make)
        medians = {name: statistics.median(r) for name, r in rates.items()}
        jit = medians["jaxloader JitMap"]
        results["cases"][case] = {"rates": rates, "first_batch_s": first}
        for name, median in medians.items():
            ratios = [a / b for a, b in zip(rates["jaxloader JitMap"], rates[name])]
            of = [a / b for a, b in zip(rates[name], rates[CEILING])]
            rows.append([case, name, f"{median:.1f}", f"{jit / median:.2f}x",
                         f"{min(ratios):.2f}-{max(ratios):.2f}",
                         f"{statistics.median(of):.0%}",
                         f"{first[name]:.2f} s" if name in first else ""])
    print(table(rows, ("case", "loader", "batches/s", "JitMap / it", "rounds", "of ceiling",
                       "first batch")))
    save("bench_jitmap", results)


if __name__ == "__main__":
    main()
