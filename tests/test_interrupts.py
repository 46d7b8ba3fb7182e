"""Ctrl-C anywhere inside ``next()`` loses nothing: the next call gives the same stream.

A thread sends SIGUSR1 to the main thread at random moments; while the test is inside
``next(it)`` the handler raises ``_Tick`` (a ``BaseException`` standing in for
``KeyboardInterrupt``, which pytest would take as the user stopping the run). The loop catches it
and carries on with the same iterator. Every batch received must equal the uninterrupted
stream's batch at the step the loader says it was, and after an interrupt the loader's step is
either unchanged (the batch will come again) or one further (``next`` had returned and the
interrupt landed in the caller, before the assignment). The autouse fixture checks that no
segment and no worker is left behind.
"""

from __future__ import annotations

import contextlib
import random
import signal
import sys
import threading
import time

import numpy as np
import pytest

import jaxloader as jl
from workers.shm_probe import running

# An interrupt may land in a callback the garbage collector runs (a weak reference's, XLA's):
# Python prints it and drops it there ("Exception ignored in"), as it would a real Ctrl-C; the
# run then goes on, which the test checks like any other.
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.filterwarnings(  # (the test's own interrupt only)
                  r"ignore:(?s).*test_interrupts\._Tick:pytest.PytestUnraisableExceptionWarning")]


class _Tick(BaseException):
    pass


@contextlib.contextmanager
def interrupts(low_s: float, high_s: float, seed: int):
    """Raises ``_Tick`` in the main thread at random moments while ``state["armed"]``."""
    state = {"armed": False, "sent": 0}

    def handler(signum, frame):
        if state["armed"]:
            state["armed"] = False
            raise _Tick()

    previous = signal.signal(signal.SIGUSR1, handler)
    stop = threading.Event()
    rng = random.Random(seed)
    main = threading.main_thread().ident

    def fire():
        while not stop.wait(rng.uniform(low_s, high_s)):
            signal.pthread_kill(main, signal.SIGUSR1)  # to the main thread: ends a blocked wait
            state["sent"] += 1

    # the firing thread runs when the main thread gives up the GIL: at Python's 5 ms switch,
    # 30 interrupts inside next() took ~18,000 steps of 0.3 ms without workers (the rest
    # landed between calls; 30 s of CI's 20 minutes); a 0.1 ms switch puts them anywhere
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join()
        signal.signal(signal.SIGUSR1, previous)
        sys.setswitchinterval(switch)


def source():
    return jl.ArraySource({"x": np.arange(4000 * 300, dtype=np.float32).reshape(4000, 300),
                           "y": np.arange(4000)})


def noisy(r, rng):
    return {"x": r["x"] + rng.random(), "y": r["y"]}


def make(num_workers, **kw):
    return jl.DataLoader(source(), batch_size=8, shuffle=True, seed=3, num_epochs=None,
                         transforms=[jl.RandomMap(noisy)], num_workers=num_workers,
                         process_index=0, process_count=1, **kw)


def host(batch):
    return {k: np.asarray(v).copy() for k, v in batch.items()}


def interrupted_run(loader, steps: int, low_s: float, high_s: float, seed: int,
                    min_caught: int = 30, deadline_s: float = 90.0):
    """Reads until ``steps`` steps and ``min_caught`` interrupts inside ``next()``; the
    interrupts stop at ``min_caught`` (with workers, one landing as they start again makes
    that ``next()`` start them again: a run of interrupts a few ms apart kept a slow machine
    at it up to a minute, in CI's 20)."""
    got, caught, wrong = {}, 0, []
    it = iter(loader)
    deadline = time.monotonic() + deadline_s
    with interrupts(low_s, high_s, seed) as state:
        while ((loader.step < steps or caught < min_caught)
               and time.monotonic() < deadline):
            before = loader.step
            try:
                state["armed"] = caught < min_caught
                batch = next(it)
                state["armed"] = False
                got[before] = host(batch)
                if loader.step != before + 1:
                    wrong.append(("returned", before, loader.step))
            except _Tick:
                caught += 1
                if loader.step not in (before, before + 1):
                    wrong.append(("interrupted", before, loader.step))
    return got, caught, wrong


@pytest.mark.parametrize("num_workers,steps,low_s,high_s", [
    (0, 400, 0.001, 0.004),
    (2, 150, 0.02, 0.08),  # an interrupt outside wait() restarts the workers: ~0.3 s each
])
def test_interrupts_inside_next_lose_and_repeat_nothing(num_workers, steps, low_s, high_s):
    with make(num_workers) as loader:
        got, caught, wrong = interrupted_run(loader, steps, low_s, high_s, seed=num_workers)
        reached = loader.step
        assert next(iter(loader)) is not None  # still usable afterwards
    assert not wrong, wrong
    assert reached >= steps, f"only {reached} of {steps} steps in the time allowed"
    assert caught >= 30, f"only {caught} interrupts landed inside next()"
    with make(0) as reference:
        it = iter(reference)
        want = [host(next(it)) for _ in range(reached)]
    for step, batch in got.items():
        for key in batch:
            np.testing.assert_array_equal(batch[key], want[step][key], err_msg=f"step {step}")


def test_interrupts_with_device_prefetch_lose_and_repeat_nothing():
    import jax

    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with make(2, sharding=sharding, device_prefetch=2) as loader:
        got, caught, wrong = interrupted_run(loader, 120, 0.02, 0.08, seed=7)
        reached = loader.step
    assert not wrong, wrong
    assert reached >= 120 and caught >= 30, (reached, caught)
    with make(0) as reference:
        it = iter(reference)
        want = [host(next(it)) for _ in range(reached)]
    for step, batch in got.items():
        np.testing.assert_array_equal(batch["x"], want[step]["x"], err_msg=f"step {step}")


def test_no_thread_is_left_after_interrupted_device_prefetch():
    import jax

    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    before = {t.ident for t in threading.enumerate()}
    with make(1, sharding=sharding, device_prefetch=2) as loader:
        interrupted_run(loader, 40, 0.005, 0.02, seed=11, min_caught=10)
    time.sleep(0.1)
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()
            and t.name.startswith("jaxloader")]
    assert not left, left  # the autouse fixture checks processes and /dev/shm


def _records(shard):
    for k in range(shard, 400, 4):
        yield {"x": np.full(3, k, np.float32), "y": np.int64(k)}


def make_stream(**kw):
    return jl.StreamLoader(jl.Stream.from_generator(_records, shards=4, shuffle_window=3),
                           batch_size=8, seed=2, readers_per_process=2, process_index=0,
                           process_count=1, **kw)


@pytest.mark.parametrize("make_loader", [make, lambda n, **kw: make_stream(**kw)],
                         ids=["arrays", "stream"])
def test_an_iter_interrupted_as_its_thread_starts_leaves_that_thread_to_the_next_iter(
        make_loader, monkeypatch):
    """iter() used to start the device-prefetch thread before the loader held the iterator: a
    Ctrl-C just after the start left that thread running, owned by no one, and the next iter()
    started a second one beside it. With a stream made in process both drove the one reader,
    and batches came out wrong (once in CI's point sweep, where the timing fell that way)."""
    import jax

    from jaxloader.sharding.prefetch import DevicePrefetcher

    start = DevicePrefetcher.start

    def interrupted_start(self):
        start(self)
        raise _Tick()

    with make_loader(0) as reference:
        it = iter(reference)
        want = [host(next(it)) for _ in range(12)]
    before = {t.ident for t in threading.enumerate()}
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with make_loader(0, sharding=sharding, device_prefetch=2) as loader:
        it = iter(loader)
        got = [host(next(it)) for _ in range(4)]
        monkeypatch.setattr(DevicePrefetcher, "start", interrupted_start)
        with pytest.raises(_Tick) as interrupted:  # (its traceback holds the iterator)
            iter(loader)
        monkeypatch.undo()
        it = iter(loader)
        threads = [t.name for t in threading.enumerate()
                   if t.ident not in before and t.is_alive() and t.name.startswith("jaxloader")]
        assert threads == ["jaxloader-host-prefetch"], threads  # the old one stopped and gone
        got += [host(next(it)) for _ in range(8)]
        del interrupted
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"step {step} {key}")


def test_an_interrupt_while_close_stops_the_iterator_still_stops_the_workers(monkeypatch):
    """close() first stops the live iterator, joining the device-prefetch thread (up to 10 s
    while it waits for a slow worker): a Ctrl-C there used to skip stopping the workers, and a
    second close() did nothing (the loader already counted as closed). The interrupt is put
    where it lands in such a join."""
    from jaxloader.loaders.iterator import IteratorWork

    stop_work = IteratorWork.stop

    def interrupted_stop_work(self, until_gone=False):
        stop_work(self, until_gone)
        raise _Tick()

    loader = make(2)
    it = iter(loader)
    next(it)
    pids = loader.worker_pids
    monkeypatch.setattr(IteratorWork, "stop", interrupted_stop_work)
    with pytest.raises(_Tick):
        loader.close()
    monkeypatch.undo()
    alive = [pid for pid in pids if running(pid)]
    assert not alive, alive  # and the autouse fixture finds no segment left
    loader.close()
    with pytest.raises(jl.JaxloaderError, match="closed"):
        next(it)
