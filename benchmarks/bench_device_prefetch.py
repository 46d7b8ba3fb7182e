"""Fraction of step time spent waiting for input, with and without device prefetch.

Run: ``python benchmarks/bench_device_prefetch.py`` (needs ``pip install -e .[benchmark,examples]``).

A jitted step costing about T ms (matmuls on the batch) consumes batches of 128 x 784 float32
made by a per-record ``Map`` (a few ms a batch, so a loader that supplies faster than the step
but not for free). Every variant runs the same loop: ``batch = next(it)`` timed as waiting, then
the step, blocked until done. Side by side, one process run:

- jaxloader ``device_prefetch=0`` (each batch made and copied inside ``next()``);
- jaxloader ``device_prefetch=2`` (the device-put thread);
- the same two with 2 workers making the batches (the thread then only copies);
- ``flax.jax_utils.prefetch_to_device(size=2)`` over jaxloader's NumPy batches;
- ``grain.experimental.device_put`` over the same data in Grain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Iterator

if "--step-on-one-core" in sys.argv:  # must be set before JAX starts
    # Emulates an accelerator: the step keeps one core busy and leaves the other to the host.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen="
                               "false intra_op_parallelism_threads=1")

import jax
import jax.numpy as jnp
import numpy as np

import jaxloader as jl
from common import RecordSource, input_wait, machine, save, table

N, D, BATCH = 20_000, 784, 128


def per_record(record: dict) -> dict:
    image = record["image"].astype(np.float32) / 255.0
    for _ in range(3):  # ~20 us of NumPy a record
        image = np.sqrt(image * image + 1e-3)
    return {"image": image, "label": record["label"]}


def make_step(hidden: int, layers: int) -> Callable:
    keys = jax.random.split(jax.random.key(0), layers + 1)
    weights = [jax.random.normal(keys[0], (D, hidden)) / 30.0]
    weights += [jax.random.normal(k, (hidden, hidden)) / 30.0 for k in keys[1:]]

    @jax.jit
    def step(total, image, label):
        h = image
        for w in weights:
            h = jnp.tanh(h @ w)
        return total + h.sum() + label.sum()

    return step


def measure(make_iter: Callable[[], Iterator], step: Callable, steps: int, unwrap=lambda b: b):
    return input_wait(make_iter(), step, jnp.zeros(()), steps, unwrap)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--step-on-one-core", action="store_true",
                        help="run the jitted step on one core, as if on an accelerator")
    args = parser.parse_args()
    from absl import flags

    flags.FLAGS.mark_as_parsed()
    import grain
    from flax import jax_utils

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (N, D), dtype=np.uint8)
    labels = rng.integers(0, 10, N).astype(np.int32)
    source = jl.ArraySource({"image": images, "label": labels})
    device = jax.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    step = make_step(args.hidden, args.layers)

    # the step alone, on a batch already on device
    x = jax.device_put(np.zeros((BATCH, D), np.float32))
    y = jax.device_put(np.zeros(BATCH, np.int32))
    total = step(jnp.zeros(()), x, y).block_until_ready()
    t = time.perf_counter()
    for _ in range(50):
        total = step(total, x, y).block_until_ready()
    step_ms = (time.perf_counter() - t) / 50 * 1e3
    loader_ms = _loader_ms(source)

    loaders: dict[str, Callable] = {}
    live: list = []

    def jaxloader_iter(prefetch: int, workers: int = 0) -> Callable:
        def make():
            loader = jl.DataLoader(source, batch_size=BATCH, shuffle=True, seed=0,
                                   transforms=[jl.Map(per_record)], num_epochs=None,
                                   sharding=sharding, device_prefetch=prefetch,
                                   num_workers=workers, process_index=0, process_count=1)
            live.append(loader)
            return iter(loader)
        return make

    def flax_iter():
        loader = jl.DataLoader(source, batch_size=BATCH, shuffle=True, seed=0,
                               transforms=[jl.Map(per_record)], num_epochs=None,
                               process_index=0, process_count=1)
        live.append(loader)
        stacked = ({k: v[None] for k, v in b.items()} for b in loader)
        return jax_utils.prefetch_to_device(stacked, 2, devices=[device])

    def grain_iter():
        ds = (grain.MapDataset.source(RecordSource(images, labels)).shuffle(seed=0).repeat()
              .map(per_record).batch(BATCH, drop_remainder=True).to_iter_dataset())
        return iter(grain.experimental.device_put(ds, device))

    loaders["jaxloader device_prefetch=0"] = jaxloader_iter(0)
    loaders["jaxloader device_prefetch=2"] = jaxloader_iter(2)
    loaders["jaxloader 2 workers, device_prefetch=0"] = jaxloader_iter(0, 2)
    loaders["jaxloader 2 workers, device_prefetch=2"] = jaxloader_iter(2, 2)
    loaders["flax prefetch_to_device(2)"] = flax_iter
    loaders["grain.experimental.device_put"] = grain_iter
    unwrap = {"flax prefetch_to_device(2)": lambda b: {k: v[0] for k, v in b.items()}}

    results = {}
    for name, make in loaders.items():
        runs = [measure(make, step, args.steps, unwrap.get(name, lambda b: b))
                for _ in range(args.repeats)]
        for loader in live:
            loader.close()
        live.clear()
        results[name] = {"wait_fraction": statistics.median(r[0] for r in runs),
                         "ms_per_step": statistics.median(r[1] * 1e3 for r in runs)}
        print(f"{name:40s} waiting {results[name]['wait_fraction']:.1%}, "
              f"{results[name]['ms_per_step']:.2f} ms/step", flush=True)
    rows = [(n, f"{r['wait_fraction']:.1%}", f"{r['ms_per_step']:.2f}") for n, r in results.items()]
    print(f"\nstep alone {step_ms:.2f} ms; loader alone {loader_ms:.2f} ms/batch "
          f"(in-process, host only); {machine()}; median of {args.repeats} x {args.steps} steps")
    print(table(rows, ("input pipeline", "time waiting for input", "ms per step")))
    name = "device_prefetch_one_core" if args.step_on_one_core else "device_prefetch"
    save(name, {"machine": machine(), "step_ms": step_ms, "loader_ms": loader_ms,
                             "results": results})


def _loader_ms(source: jl.ArraySource) -> float:
    loader = jl.DataLoader(source, batch_size=BATCH, transforms=[jl.Map(per_record)],
                           num_epochs=None, process_index=0, process_count=1)
    it = iter(loader)
    next(it)
    t = time.perf_counter()
    for _ in range(30):
        next(it)
    return (time.perf_counter() - t) / 30 * 1e3


if __name__ == "__main__":
    main()
