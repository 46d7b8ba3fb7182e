"""Host-to-device copies from pageable shared-memory slots against page-locked (pinned) memory.

Run on a machine with a GPU: ``python benchmarks/bench_pinned.py`` (``--quick``: a dry run on
any backend, where the pinning rows say what the backend refuses). One process run, every row
over the same 38.5 MB batches (256 x 224x224x3 uint8), GB/s medians of ``--repeats``:

1. **Bare copies** two in flight (and one at a time) by ``jax.device_put`` from a NumPy array,
   from a memory-file slot as the loader's ring makes them, from such a slot registered with the
   GPU (``client.dma_map``: PJRT then copies from it directly instead of through its staging
   buffer), and from an array in JAX's ``pinned_host`` memory (with the copy into it timed
   apart). The ceiling: ``cudaMemcpyAsync`` from page-locked memory through CuPy, if present.
2. **Whether a registered slot is safe to hand out as the ring does**: the copy's bytes are
   the slot's; JAX holds the host array until its copy is done (the ring returns a slot only
   when its views are gone); what a write to the slot right after ``device_put`` does.
3. **The loader** with ``--workers`` workers and ``device_prefetch=2``, its ring's slots
   registered or not (turns taken, A B A B), the consumer blocking on each batch; its host side
   alone is the bound of the making.
4. **Stage timings and the verdict** on a real step (``bench_gpu.py``'s jitted bf16 step at
   ``--step-ms``), 128 images a batch through a per-record ``RandomMap``: ms a step, the share
   of the loop in ``next()``, and ``loader.diagnose()``, slots registered or not.

Writes ``pinned.json`` to ``$OUT`` (or ``benchmarks/out``) and prints the tables last.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import itertools
import json
import os
import statistics
import sys
import time
import weakref
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import jaxloader as jl  # noqa: E402
from bench_gpu import arguments, drain, flip, step_case, warm  # noqa: E402
from common import input_wait, machine, table  # noqa: E402
from jaxloader.runtime.shm import Segment  # noqa: E402
from jaxloader.sharding import pinning  # noqa: E402
from jaxloader.workers import unpinning  # noqa: E402


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def copies(put: Callable[[int], Any], n: int, in_flight: int) -> float:
    """Seconds for ``n`` calls of ``put(i)``, ``in_flight`` dispatched ahead of the wait."""
    pending: collections.deque = collections.deque()
    start = time.perf_counter()
    for i in range(n):
        pending.append(put(i))
        if len(pending) >= in_flight:
            pending.popleft().block_until_ready()
    for x in pending:
        x.block_until_ready()
    return time.perf_counter() - start


def slot_views(host: list[np.ndarray]) -> tuple[list[Segment], list]:
    """A slot (a memory-file segment, as the ring makes) holding each of ``host``."""
    segments = [Segment.create(h.nbytes, prefault=False) for h in host]
    views = []
    for h, s in zip(host, segments):
        view = np.frombuffer(s.memory, np.uint8, count=h.nbytes).reshape(h.shape)
        view[...] = h
        views.append(view)
    return segments, views


def address(segment: Segment) -> int:
    return np.frombuffer(segment.memory, np.uint8).ctypes.data


def bare(args: argparse.Namespace, device: Any) -> tuple[dict, dict]:
    rng = np.random.default_rng(0)
    shape = (256, 224, 224, 3) if not args.quick else (64, 64, 64, 3)
    host = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(4)]
    nbytes, n = host[0].nbytes, args.batches
    client = device.client
    rows: dict[str, Any] = {"batch_mb": nbytes / 1e6}
    checks: dict[str, Any] = {}
    _, slots = slot_views(host)
    mapped_segments, mapped = slot_views(host)
    started = time.perf_counter()
    try:
        for s in mapped_segments:
            client.dma_map(address(s), s.size)
        checks["dma_map ms a slot"] = (time.perf_counter() - started) / 4 * 1e3
    except Exception as e:  # noqa: BLE001 - the backend's refusal is the result
        checks["dma_map"] = f"{type(e).__name__}: {e}"
        mapped = []
    pinned_kind = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    on_device = jax.sharding.SingleDeviceSharding(device, memory_kind="device")
    try:
        pinned = [jax.device_put(h, pinned_kind) for h in host]
        jax.block_until_ready(pinned)
    except Exception as e:  # noqa: BLE001
        checks["pinned_host"] = f"{type(e).__name__}: {e}"
        pinned = []
    variants: dict[str, Callable[[int], Any]] = {
        "NumPy array (pageable)": lambda i: jax.device_put(host[i % 4], device),
        "memory-file slot (pageable)": lambda i: jax.device_put(slots[i % 4], device),
    }
    if mapped:
        variants["memory-file slot, dma_map'd"] = lambda i: jax.device_put(mapped[i % 4], device)
    if pinned:
        variants["pinned_host array -> device"] = lambda i: jax.device_put(pinned[i % 4],
                                                                           on_device)
        variants["NumPy -> pinned_host (the copy into it)"] = (
            lambda i: jax.device_put(host[i % 4], pinned_kind))
    for label, put in variants.items():
        copies(put, 8, 2)
        for in_flight in (1, 2):
            rows[f"{label}, {in_flight} in flight"] = statistics.median(
                gbps(nbytes * n, copies(put, n, in_flight)) for _ in range(args.repeats))
    if mapped:
        x = jax.device_put(mapped[0], device)
        checks["bytes equal"] = bool(np.array_equal(np.asarray(x), host[0]))
        view = np.frombuffer(mapped_segments[1].memory, np.uint8)[:nbytes].reshape(shape)
        base = weakref.ref(view.base)
        x = jax.device_put(view, device)
        del view
        checks["host array held during the copy"] = base() is not None
        x.block_until_ready()
        checks["host array held after it"] = base() is not None
        mapped[2][...] = host[2]
        x = jax.device_put(mapped[2], device)
        mapped[2][...] = 0  # before the copy is waited for
        checks["a write right after device_put reaches the copy"] = not np.array_equal(
            np.asarray(x), host[2])
        mapped[2][...] = host[2]
    rows.update(ceiling(host[0], n, args.repeats, checks))
    for s in mapped_segments:
        try:
            client.dma_unmap(address(s))
        except Exception:  # noqa: BLE001 - not mapped (refused above)
            pass
    return rows, checks


def ceiling(host: np.ndarray, n: int, repeats: int, checks: dict) -> dict:
    """cudaMemcpyAsync through CuPy, two in flight on two streams: from pinned memory (the
    link's rate) and from pageable memory (the driver's own staging)."""
    try:
        import cupy as cp
    except ImportError:
        checks["cupy"] = "not installed"
        return {}
    rows = {}
    nbytes = host.nbytes
    pinned = cp.cuda.alloc_pinned_memory(nbytes)
    np.frombuffer(pinned, np.uint8, nbytes)[:] = host.reshape(-1)
    dst = [cp.empty(nbytes, cp.uint8) for _ in range(2)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    kind = cp.cuda.runtime.memcpyHostToDevice
    for label, src in (("cudaMemcpyAsync from pinned (CuPy)", pinned.ptr),
                       ("cudaMemcpyAsync from pageable (CuPy)", host.ctypes.data)):
        def run() -> float:
            start = time.perf_counter()
            for i in range(n):
                cp.cuda.runtime.memcpyAsync(dst[i % 2].data.ptr, src, nbytes, kind,
                                            streams[i % 2].ptr)
            for s in streams:
                s.synchronize()
            return time.perf_counter() - start
        run()
        rows[label + ", 2 streams"] = statistics.median(gbps(nbytes * n, run())
                                                        for _ in range(repeats))
    return rows


class Pinning:
    """Switches the loaders' slot pinning (``jaxloader.sharding.pinning``) off and on."""

    def __init__(self) -> None:
        self.on, self.made = True, []
        real = pinning.pinner_for

        def pinner_for(putter: Any, label: str = "jaxloader") -> Any:
            made = real(putter, label) if self.on else None
            self.made.append(made)
            return made

        pinning.pinner_for = pinner_for  # type: ignore[assignment]

    @property
    def failed(self) -> list:
        return [p.failed for p in self.made if p is not None and p.failed]


def same_batches(args: argparse.Namespace, device: Any, switch: Pinning) -> dict:
    """Three epochs (a partial last batch each) with slots pinned and not: the same bytes on
    the device. Then a pinned loader closed after 5 batches, its thread and copies ahead:
    slots still read at ``close()`` wait, and none is left registered once they are done."""
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, (32 * 20 + 5, 64, 64, 3), dtype=np.uint8)

    def loader(pinned: bool, **options: Any) -> jl.DataLoader:
        switch.on = pinned
        return jl.DataLoader(jl.ArraySource({"x": data}), batch_size=32, shuffle=True, seed=0,
                             num_workers=args.workers, sharding=device, process_index=0,
                             process_count=1, **options)

    runs = {}
    for pinned in (False, True):
        with loader(pinned, num_epochs=3, last_batch="partial") as made:
            runs[pinned] = [np.asarray(b["x"]) for b in made]
    cut = loader(True, num_epochs=None)
    taken = list(itertools.islice(cut, 5))
    cut.close()
    waiting_at_close = unpinning.waiting()
    del taken, cut
    gc.collect()
    drained = unpinning.wait_all(10.0)
    pinners = [p for p in switch.made if p is not None]
    return {"batches": len(runs[True]), "same bytes": len(runs[False]) == len(runs[True]) and all(
        np.array_equal(a, b) for a, b in zip(runs[False], runs[True])),
            "pinners": len(pinners), "slots waiting at close()": waiting_at_close,
            "all unpinned once done": drained,
            "registered left": sum(len(p._at) for p in pinners)}


def loader_rates(args: argparse.Namespace, device: Any, switch: Pinning) -> dict:
    rng = np.random.default_rng(0)
    shape, batch = ((224, 224, 3), 256) if not args.quick else ((64, 64, 3), 64)
    data = rng.integers(0, 256, (batch * 12, *shape), dtype=np.uint8)
    source = jl.ArraySource({"x": data})
    sharding = jax.sharding.SingleDeviceSharding(device)
    nbytes, n = batch * data[0].nbytes, args.batches
    rates: dict[str, list] = collections.defaultdict(list)
    for turn in range(args.turns):
        for label, pinned, placed in (("slots pageable", False, True),
                                      ("slots pinned", True, True),
                                      ("host batches only", False, False)):
            if not placed and turn:
                continue
            switch.on = pinned
            loader = jl.DataLoader(source, batch_size=batch, shuffle=True, seed=0,
                                   num_epochs=None, num_workers=args.workers,
                                   sharding=sharding if placed else None,
                                   device_prefetch=2 if placed else 0,
                                   process_index=0, process_count=1)
            try:
                it = iter(loader)
                warm(it, args.warm, placed)
                rates[label].append(gbps(nbytes * n, drain(it, n, placed)))
            finally:
                loader.close()
            print(label, f"{rates[label][-1]:.2f} GB/s", flush=True)
    return {k: {"median": statistics.median(v), "all": v} for k, v in rates.items()}


def step_verdicts(args: argparse.Namespace, device: Any, switch: Pinning) -> list[dict]:
    images, labels, batch, step, params, targets = step_case(args, device)
    source = jl.ArraySource({"image": images, "label": labels})
    rows = []
    for target, reps, alone in targets():
        result: dict[str, Any] = {"target_ms": target, "step_alone_ms": alone}
        for label, workers, pinned in (("in process", 0, False),
                                       (f"{args.workers} workers", args.workers, False),
                                       (f"{args.workers} workers, slots pinned",
                                        args.workers, True)):
            switch.on = pinned
            loader = jl.DataLoader(source, batch_size=batch, shuffle=True, seed=0,
                                   transforms=[jl.RandomMap(flip)], num_epochs=None,
                                   num_workers=workers, device_prefetch=2, sharding=device,
                                   process_index=0, process_count=1)
            try:
                it = iter(loader)
                input_wait(it, functools.partial(step, params, reps), jnp.zeros(()), 5,
                           warm_s=args.warm if workers else 0.0)
                before = loader.stats  # (the timed window's alone: not the warm-up's)
                wait, seconds = input_wait(it, functools.partial(step, params, reps),
                                           jnp.zeros(()), args.steps)
                verdict = loader.diagnose(since=before)
                result[label] = {"wait": wait, "ms_per_step": seconds * 1e3,
                                 "bottleneck": verdict.bottleneck, "advice": verdict.advice,
                                 "stages": verdict.stages, "table": str(verdict)}
            finally:
                loader.close()
            print(f"step {alone:.2f} ms, {label}: {seconds * 1e3:.2f} ms a step, "
                  f"{wait:.1%} waiting\n{verdict}", flush=True)
        rows.append(result)
    return rows


def main() -> None:
    parser = arguments(40, [2.0, 15.0])
    parser.description = __doc__
    parser.add_argument("--turns", type=int, default=2, help="loader rounds, A B A B")
    parser.add_argument("--skip", nargs="*", default=[], choices=["bare", "same", "loader", "step"])
    args = parser.parse_args()
    device = jax.devices()[0]
    info = {"machine": machine(), "device": f"{device.platform} {device.device_kind}",
            "jax": jax.__version__, "workers": args.workers}
    print(json.dumps(info), flush=True)
    out: dict[str, Any] = {"info": info}
    switch = Pinning()
    if "bare" not in args.skip:
        out["bare"], out["checks"] = bare(args, device)
        print(json.dumps(out["checks"]), flush=True)
    if "same" not in args.skip:
        out["same"] = same_batches(args, device, switch)
        print(json.dumps(out["same"]), flush=True)
    if "loader" not in args.skip:
        out["loader"] = loader_rates(args, device, switch)
    if "step" not in args.skip:
        out["step"] = step_verdicts(args, device, switch)
    out["pinning failed"] = switch.failed
    folder = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "out")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "pinned.json"), "w") as f:
        json.dump(out, f, indent=2, default=str)
    if "bare" in out:
        ref = out["bare"].get("NumPy array (pageable), 2 in flight", 1.0)
        print(f"\nbare copies ({out['bare']['batch_mb']:.1f} MB a batch)")
        print(table([(k, f"{v:.2f}", f"{v / ref:.2f}") for k, v in out["bare"].items()
                     if k != "batch_mb"], ("copy", "GB/s", "vs NumPy, 2 in flight")))
    if "loader" in out:
        print(table([(k, f"{v['median']:.2f}", " ".join(f"{r:.2f}" for r in v["all"]))
                     for k, v in out["loader"].items()], ("loader", "GB/s", "runs")))
    for r in out.get("step", []):
        print(f"\nstep alone {r['step_alone_ms']:.2f} ms")
        print(table([(k, f"{v['ms_per_step']:.2f}", f"{v['wait']:.1%}", v["bottleneck"])
                     for k, v in r.items() if isinstance(v, dict)],
                    ("loader", "ms a step", "waiting", "bottleneck")))
    print("pinning failed:", switch.failed)


if __name__ == "__main__":
    main()
