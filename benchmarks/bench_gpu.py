"""What only an accelerator shows: host-to-device copy rate and the input wait on a real step.

Run on a machine with a GPU: ``python benchmarks/bench_gpu.py`` (``--quick`` for a dry run on
any backend). One process run, every variant over the same batches, medians of ``--repeats``:

1. **Host-to-device GB/s.** Batches of 256 images of 224 x 224 x 3 uint8 (38.5 MB) and of
   128 x 784 float32 (0.4 MB), made in advance, copied by a bare ``jax.device_put`` (one at a
   time, and two in flight: the best a loader can do from pageable host memory), against
   jaxloader delivering the same batches with ``device_prefetch=2`` (in process, and with
   workers making them in shared memory), the consumer blocking on each batch. The loader's
   host side alone (no device) says whether a row is bound by making or by copying.
2. **Input wait on an accelerator step.** A jitted bf16 step (a first layer of 4096 over the
   flattened image, then one 4096 x 16384 matmul over as many scaled copies of its activations
   as a target step time needs) eats batches of 128 images made by a per-record ``RandomMap``
   (a random vertical flip). ms a step and the share of the loop spent in ``next()``: the
   ceiling (batches made in advance, bare ``device_put``s kept two ahead of the step),
   jaxloader with ``device_prefetch`` 0 and 2, in process and with workers, placed by the
   device-put thread (one device) or dispatched in ``next()`` (what several devices get), and
   ``flax.jax_utils.prefetch_to_device(2)`` over jaxloader's host batches.

Each compiled step, and each loader with workers, runs ``--warm`` seconds before it is timed:
on an H200 a new step ran ~10x slower for its first ~50 calls, and 8 workers take 2-3 s to
start. Prints the tables last and writes ``gpu.json`` to ``$OUT`` (or ``benchmarks/out``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import jaxloader as jl  # noqa: E402
from common import input_wait, machine, table  # noqa: E402


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def bare_put(batches: list[np.ndarray], device: Any, n: int, in_flight: int) -> float:
    """Seconds for ``n`` copies by ``jax.device_put``, ``in_flight`` dispatched ahead."""
    pending: collections.deque = collections.deque()
    start = time.perf_counter()
    for i in range(n):
        pending.append(jax.device_put(batches[i % len(batches)], device))
        if len(pending) >= in_flight:
            pending.popleft().block_until_ready()
    for x in pending:
        x.block_until_ready()
    return time.perf_counter() - start


def warm(it: Iterator, seconds: float, block: bool) -> None:
    """Takes batches for ``seconds`` (at least 5): workers start one by one (each imports JAX),
    so a loader's first seconds are not its steady state."""
    start, taken = time.perf_counter(), 0
    while taken < 5 or time.perf_counter() - start < seconds:
        b = next(it)
        if block:
            jax.block_until_ready(b)
        taken += 1


def drain(it: Iterator, n: int, block: bool) -> float:
    """Seconds for ``n`` batches of ``it``, each blocked on when ``block``."""
    start = time.perf_counter()
    for _ in range(n):
        b = next(it)
        if block:
            jax.block_until_ready(b)
    return time.perf_counter() - start


def transfer(args: argparse.Namespace, device: Any) -> list[dict]:
    rng = np.random.default_rng(0)
    cases = [("256 x 224x224x3 uint8", (224, 224, 3), np.uint8, 256),
             ("128 x 784 float32", (784,), np.float32, 128)]
    if args.quick:
        cases = [("64 x 64x64x3 uint8", (64, 64, 3), np.uint8, 64),
                 ("128 x 784 float32", (784,), np.float32, 128)]
    sharding = jax.sharding.SingleDeviceSharding(device)
    rows = []
    for name, shape, dtype, batch in cases:
        records = batch * 12
        if dtype == np.uint8:
            data = rng.integers(0, 256, (records, *shape), dtype=np.uint8)
        else:
            data = rng.standard_normal((records, *shape), dtype=np.float32)
        source = jl.ArraySource({"x": data})
        host = [np.ascontiguousarray(data[i * batch:(i + 1) * batch]) for i in range(8)]
        nbytes = host[0].nbytes
        n = args.batches if nbytes > 1 << 20 else args.batches * 10
        bare_put(host, device, 8, 2)  # warm up
        result: dict[str, Any] = {"case": name, "batch_mb": nbytes / 1e6}
        for label, in_flight in (("bare device_put, one at a time", 1),
                                 ("bare device_put, two in flight", 2)):
            result[label] = statistics.median(
                gbps(nbytes * n, bare_put(host, device, n, in_flight))
                for _ in range(args.repeats))
        for workers in (0, args.workers):
            for placed in (False, True):
                loader = jl.DataLoader(source, batch_size=batch, shuffle=True, seed=0,
                                       num_epochs=None, num_workers=workers,
                                       sharding=sharding if placed else None,
                                       device_prefetch=2 if placed else 0,
                                       process_index=0, process_count=1)
                try:
                    it = iter(loader)
                    warm(it, args.warm if workers else 0.0, placed)
                    rate = statistics.median(gbps(nbytes * n, drain(it, n, placed))
                                             for _ in range(args.repeats))
                finally:
                    loader.close()
                what = f"{workers} workers" if workers else "in process"
                key = (f"jaxloader {what}, device_prefetch=2" if placed
                       else f"jaxloader {what}, host batches only")
                result[key] = rate
        rows.append(result)
        print(json.dumps(result), flush=True)
    return rows


def flip(record: dict, rng: np.random.Generator) -> dict:
    """Upside down, half of the time (whole rows: a cheap copy)."""
    image = record["image"]
    return {"image": image[::-1] if rng.random() < 0.5 else image, "label": record["label"]}


def make_step(d_in: int, hidden: int, wide: int) -> tuple[Callable, Any]:
    """A jitted step: a first layer (``d_in x hidden``) over the flattened image, then ``reps``
    copies of its activations (each scaled apart) through one ``hidden x wide`` matmul:
    ``reps`` (static) sets the step's length with one large matmul rather than a loop."""
    k1, k2 = jax.random.split(jax.random.key(0))
    params = (jax.random.normal(k1, (d_in, hidden), jnp.bfloat16) * 0.01,
              jax.random.normal(k2, (hidden, wide), jnp.bfloat16) * (hidden ** -0.5))

    @functools.partial(jax.jit, static_argnums=1)
    def step(params, reps, total, image, label):
        w1, w2 = params
        x = image.reshape(image.shape[0], -1).astype(jnp.bfloat16) * (1 / 255)
        h = jnp.tanh(x @ w1)
        if reps:
            scale = (1 + 0.01 * jnp.arange(reps, dtype=jnp.bfloat16))[:, None, None]
            h = jnp.tanh((h[None] * scale) @ w2)
        return total + h.astype(jnp.float32).sum() + label.sum()

    return step, params


def step_ms(step: Callable, params: Any, reps: int, x: Any, y: Any, n: int = 20,
            warm_s: float = 0.0) -> float:
    """ms a step, after ``warm_s`` seconds of steps (measured on an H200: a newly compiled
    step ran ~10x slower for its first ~50 calls)."""
    total = step(params, reps, jnp.zeros(()), x, y).block_until_ready()
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        total = step(params, reps, total, x, y).block_until_ready()
    start = time.perf_counter()
    for _ in range(n):
        total = step(params, reps, total, x, y).block_until_ready()
    return (time.perf_counter() - start) / n * 1e3


def calibrate(step: Callable, params: Any, x: Any, y: Any, warm_s: float
              ) -> Callable[[float], int]:
    """The step's ``reps`` for a target ms, from its time at 4 and at 32 reps."""
    low = step_ms(step, params, 4, x, y, n=50, warm_s=warm_s)
    high = step_ms(step, params, 32, x, y, n=50, warm_s=warm_s)
    per_rep = max((high - low) / 28, 1e-6)
    print(f"calibration: 4 reps {low:.3f} ms, 32 reps {high:.3f} ms", flush=True)
    return lambda target: min(2000, max(1, round(4 + (target - low) / per_rep)))


def arguments(batches: int, step_targets: list[float]) -> argparse.ArgumentParser:
    """The options both GPU benchmarks take."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a dry run anywhere")
    parser.add_argument("--batches", type=int, default=batches, help="large batches a repeat")
    parser.add_argument("--steps", type=int, default=150, help="steps timed a repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--step-ms", type=float, nargs="+", default=step_targets)
    parser.add_argument("--warm", type=float, default=3.0,
                        help="seconds of warm-up for the GPU and for each loader with workers")
    return parser


def step_case(args: argparse.Namespace, device: Any) -> tuple:
    """The input-wait case: ``(images, labels, batch, step, params, targets)``, ``targets()``
    yielding each ``--step-ms``'s ``(target, reps, ms of the step alone)``."""
    rng = np.random.default_rng(1)
    side, batch = (224, 128) if not args.quick else (32, 64)
    images = rng.integers(0, 256, (batch * 40, side, side, 3), dtype=np.uint8)
    labels = rng.integers(0, 1000, batch * 40).astype(np.int32)
    step, params = make_step(side * side * 3, *((4096, 16384) if not args.quick else (256, 256)))
    x = jax.device_put(images[:batch], device)
    y = jax.device_put(labels[:batch], device)
    reps_for = calibrate(step, params, x, y, args.warm)

    def targets() -> Iterator[tuple[float, int, float]]:
        for target in args.step_ms:
            reps = reps_for(target)
            yield target, reps, step_ms(step, params, reps, x, y, n=50, warm_s=args.warm)

    return images, labels, batch, step, params, targets


def step_wait(args: argparse.Namespace, device: Any) -> list[dict]:
    images, labels, batch, step, params, targets = step_case(args, device)
    source = jl.ArraySource({"image": images, "label": labels})
    sharding = jax.sharding.SingleDeviceSharding(device)
    rows = []
    for target, reps, alone in targets():
        live: list = []

        def loader(workers: int, prefetch: int, placed: bool = True,
                   in_caller: bool = False) -> jl.DataLoader:
            made = jl.DataLoader(source, batch_size=batch, shuffle=True, seed=0,
                                 transforms=[jl.RandomMap(flip)], num_epochs=None,
                                 num_workers=workers, device_prefetch=prefetch,
                                 sharding=sharding if placed else None,
                                 process_index=0, process_count=1)
            if in_caller:  # the copies dispatched in next(), as for several devices
                made._putter.single_device = False
            live.append(made)
            return made

        def flax_iter() -> Iterator:
            from flax import jax_utils
            host = iter(loader(args.workers, 0, placed=False))
            stacked = ({k: v[None] for k, v in b.items()} for b in host)
            return ({k: v[0] for k, v in b.items()}
                    for b in jax_utils.prefetch_to_device(stacked, 2, devices=[device]))

        def bare_ahead() -> Iterator:
            # The ceiling with copies: batches made in advance, copied by bare device_puts
            # kept two ahead of the step (no loader), as the transfer table's bare rows
            host = [{"image": images[i * batch:(i + 1) * batch],
                     "label": labels[i * batch:(i + 1) * batch]} for i in range(8)]
            pending: collections.deque = collections.deque()
            for i in itertools.count():
                pending.append(jax.device_put(host[i % len(host)], device))
                if len(pending) > 2:
                    yield pending.popleft()

        variants: dict[str, Callable[[], Iterator]] = {
            "bare device_put two ahead, batches made in advance": bare_ahead,
            "jaxloader in process, device_prefetch=0": lambda: iter(loader(0, 0)),
            "jaxloader in process, device_prefetch=2": lambda: iter(loader(0, 2)),
            f"jaxloader {args.workers} workers, device_prefetch=0":
                lambda: iter(loader(args.workers, 0)),
            f"jaxloader {args.workers} workers, device_prefetch=2":
                lambda: iter(loader(args.workers, 2)),
            f"jaxloader {args.workers} workers, device_prefetch=2, placed in next()":
                lambda: iter(loader(args.workers, 2, in_caller=True)),
            f"flax prefetch_to_device(2), jaxloader {args.workers} workers": flax_iter,
        }
        result: dict[str, Any] = {"target_ms": target, "reps": reps, "step_alone_ms": alone}
        for name, make in variants.items():
            runs = []
            for _ in range(args.repeats):
                try:
                    wait, seconds = input_wait(
                        make(), functools.partial(step, params, reps), jnp.zeros(()),
                        args.steps, warm_s=args.warm if "workers" in name else 0.0)
                    runs.append((wait, seconds * 1e3))
                except Exception as e:  # noqa: BLE001 - one peer's failure is a result
                    runs = [(float("nan"), float("nan"))]
                    print(f"{name}: {type(e).__name__}: {e}", flush=True)
                    break
                finally:
                    for made in live:
                        made.close()
                    live.clear()
            result[name] = {"wait": statistics.median(r[0] for r in runs),
                            "ms_per_step": statistics.median(r[1] for r in runs)}
        rows.append(result)
        print(json.dumps(result), flush=True)
    return rows


def main() -> None:
    parser = arguments(60, [2.0, 5.0, 15.0])
    parser.add_argument("--skip", nargs="*", default=[], choices=["transfer", "wait"])
    args = parser.parse_args()
    device = jax.devices()[0]
    info = {"machine": machine(), "device": f"{device.platform} {device.device_kind}",
            "jax": jax.__version__, "workers": args.workers}
    print(json.dumps(info), flush=True)
    out = {"info": info}
    if "transfer" not in args.skip:
        out["transfer"] = transfer(args, device)
    if "wait" not in args.skip:
        out["wait"] = step_wait(args, device)
    folder = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "out")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "gpu.json"), "w") as f:
        json.dump(out, f, indent=2)
    for r in out.get("transfer", []):
        bare = r["bare device_put, two in flight"]
        rows = [(k, f"{v:.2f}", f"{v / bare:.2f}") for k, v in r.items()
                if isinstance(v, float) and k != "batch_mb"]
        print(f"\n{r['case']} ({r['batch_mb']:.1f} MB a batch), GB/s")
        print(table(rows, ("copy", "GB/s", "vs bare, two in flight")))
    for r in out.get("wait", []):
        rows = [(k, f"{v['wait']:.1%}", f"{v['ms_per_step']:.2f}") for k, v in r.items()
                if isinstance(v, dict)]
        print(f"\nstep alone {r['step_alone_ms']:.2f} ms ({r['reps']} reps)")
        print(table(rows, ("input pipeline", "waiting", "ms a step")))


if __name__ == "__main__":
    main()
