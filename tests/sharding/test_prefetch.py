"""The device-put thread: held arrays never change, errors cross, stats, clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from jaxloader.sharding import prefetch
from jaxloader.sharding.prefetch import DevicePrefetcher, HostPrefetcher
from sharding.devices import run_with_devices

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("put_in_thread", [False, True])
def test_prefetcher_orders_bounds_and_passes_errors(put_in_thread):
    made = []

    def host():
        for i in range(10):
            made.append(i)
            if i == 6:
                raise KeyError("host batch 6")
            yield i

    p = DevicePrefetcher(host(), put=lambda b: b * 2, depth=3, put_in_thread=put_in_thread)
    p.start()
    assert p.next() == 0
    threading.Event().wait(0.2)
    # one taken; then `depth` placed batches (the thread places them), or `depth` copies in
    # flight and `depth` host batches behind them (the caller places them)
    assert len(made) <= (1 + 3 if put_in_thread else 1 + 2 * 3)
    assert [p.next() for _ in range(5)] == [2, 4, 6, 8, 10]
    with pytest.raises(KeyError, match="host batch 6"):
        p.next()
    with pytest.raises(KeyError, match="host batch 6"):  # and again: it stays failed
        p.next()
    p.close()
    p.close()


@pytest.mark.parametrize("put_in_thread", [False, True])
def test_an_error_in_put_comes_after_the_batches_before_it(put_in_thread):
    def put(b):
        if b == 4:
            raise ValueError("cannot place 4")
        return -b

    p = DevicePrefetcher(iter(range(10)), put, depth=2, put_in_thread=put_in_thread).start()
    assert [p.next() for _ in range(4)] == [0, -1, -2, -3]
    for _ in range(2):
        with pytest.raises(ValueError, match="cannot place 4"):
            p.next()
    p.close()


def test_close_stops_an_endless_thread():
    def endless():
        i = 0
        while True:
            yield i
            i += 1

    before = threading.active_count()
    p = DevicePrefetcher(endless(), put=lambda b: b, depth=2).start()
    p.next()
    p.close()
    assert threading.active_count() == before


def _until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_after_a_take_the_thread_waits_while_a_batch_is_ready_unless_asked_again(monkeypatch):
    monkeypatch.setattr(prefetch, "_BACK_OFF_S", 60.0)  # long enough to tell waiting from not
    pulled = []

    def host():
        for i in range(100):
            pulled.append(i)
            yield i

    p = HostPrefetcher(host(), depth=2)
    p.start()
    assert _until(lambda: len(pulled) == 2)  # filling up: no waiting
    assert p.get() == (0, None)  # batch 1 still ready: the consumer is stepping, stay away
    time.sleep(0.3)
    assert len(pulled) == 2
    assert p.get() == (1, None)  # asked again: the wait ends at once, the thread fills up
    assert _until(lambda: len(pulled) == 4)
    assert p.get() == (2, None)  # waiting again (batch 3 ready); close() must end that too
    started = time.monotonic()
    p.close()
    assert time.monotonic() - started < 10
    assert not p._thread.is_alive()
    assert len(pulled) == 4


def test_held_jax_and_numpy_batches_never_change():
    out = run_with_devices("""
    mesh = jax.make_mesh((2,), ("data",))
    kw = dict(batch_size=4, shuffle=True, seed=3, transforms=[jl.RandomMap(noise)],
              num_epochs=None)
    ref = reference(30, num_epochs=10, **{k: v for k, v in kw.items() if k != "num_epochs"})
    held = {}
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[1])  # placed in the thread
    for name, extra in [("jax", dict(sharding=jl.data_sharding(mesh), device_prefetch=2)),
                        ("jax one device", dict(sharding=one_device, device_prefetch=2)),
                        ("numpy", {})]:
        with jl.DataLoader(source(30), num_workers=2, process_index=0, process_count=1,
                           **kw, **extra) as loader:
            it = iter(loader)
            held[name] = [next(it) for _ in range(50)]
            for _ in range(20):  # keep the ring turning while the 50 are held
                next(it)
            for got, want in zip(held[name], ref[:50]):
                assert np.array_equal(np.asarray(got["x"]), want["x"]), name
                assert np.array_equal(np.asarray(got["y"]), want["y"]), name
    ref = ref[:50]
    print("ok", len(ref))
    """, n=2)
    assert out.split() == ["ok", "50"]


def test_errors_in_the_thread_reach_the_user_and_break_the_loader():
    out = run_with_devices("""
    mesh = jax.make_mesh((2,), ("data",))
    def bad(r):
        if int(r["y"]) == 9:
            raise ZeroDivisionError("nine")
        return r
    def raised(it, kind):
        try:
            next(it)
        except kind as e:
            return e
        raise AssertionError(f"next() did not raise {kind.__name__}")
    loader = jl.DataLoader(source(20), batch_size=4, transforms=[jl.Map(bad)], num_workers=2,
                           sharding=jl.data_sharding(mesh), process_index=0, process_count=1)
    it = iter(loader)
    next(it); next(it)
    first = raised(it, jl.WorkerError)
    assert "record position 9" in str(first) and "nine" in str(first)
    again = raised(it, jl.WorkerError)  # (a copy without the first call's frames)
    assert again is not first and str(again) == str(first)
    loader.close()
    for sharding in (jl.data_sharding(mesh), jax.sharding.SingleDeviceSharding(jax.devices()[0])):
        loader0 = jl.DataLoader(source(20), batch_size=4, transforms=[jl.Map(bad)],
                                sharding=sharding, process_index=0, process_count=1)
        it = iter(loader0)
        next(it); next(it)
        assert isinstance(raised(it, jl.RecordError).__cause__, ZeroDivisionError)
        loader0.close()
    print("ok")
    """, n=2)
    assert out.strip() == "ok"


def test_restore_and_close_stop_the_thread_and_stats_add_up():
    out = run_with_devices("""
    import threading, time
    mesh = jax.make_mesh((2,), ("data",))
    base = threading.active_count()
    loader = jl.DataLoader(source(40), batch_size=4, num_workers=1, num_epochs=None,
                           sharding=jl.data_sharding(mesh), process_index=0, process_count=1)
    it = iter(loader)
    for _ in range(3):
        next(it)
        time.sleep(0.02)  # "training"
    state = loader.state_dict()
    assert threading.active_count() == base + 1
    loader.load_state_dict(state)
    assert threading.active_count() == base
    it = iter(loader)
    batch = next(it)
    assert np.asarray(batch["y"]).tolist() == [12, 13, 14, 15]
    stats = loader.stats
    assert stats.batches == 4 and stats.run_s >= 0.04 and 0 < stats.wait_fraction < 1
    loader.close()
    assert threading.active_count() == base
    print("ok")
    """, n=2)
    assert out.strip() == "ok"


def test_jax_is_called_only_from_the_stepping_thread_around_a_collective_step():
    """Placing batches from a background thread hung an all-reduce on 8 CPU devices (plain JAX,
    no jaxloader: 7 runs in 10 hung); the copies are dispatched from the consumer's thread,
    ordered with the steps. The run records which threads call JAX's placement functions.

    Few steps on purpose: JAX's CPU all-reduce over 8 virtual devices can also hang when the
    2 cores are busy, even with every call in one thread (docs/benchmarks.md), so the thread
    check, not the absence of a hang over many steps, is what guards the design here."""
    out = run_with_devices("""
    import threading
    import jax.numpy as jnp
    mesh = jax.make_mesh((8,), ("data",))
    src = jl.ArraySource({"x": np.random.default_rng(0).random((2048, 32)).astype(np.float32)})
    w = jax.device_put(jnp.ones((32, 32)), NamedSharding(mesh, P()))
    callers = []  # from here on, only the loader places arrays
    for name in ("device_put", "make_array_from_process_local_data"):
        real = getattr(jax, name)
        def spy(*a, _real=real, **k):
            callers.append(threading.current_thread().name)
            return _real(*a, **k)
        setattr(jax, name, spy)

    @jax.jit
    def step(w, b):
        return w - 1e-3 * jax.grad(lambda w: jnp.tanh(b["x"] @ w).sum())(w)

    with jl.DataLoader(src, batch_size=64, num_epochs=None, num_workers=1, device_prefetch=2,
                       sharding=jl.data_sharding(mesh), process_index=0,
                       process_count=1) as loader:
        it = iter(loader)
        for _ in range(40):
            w = step(w, next(it))
        w.block_until_ready()
    print(len(callers), sorted(set(callers)))
    """, timeout=100)
    count, threads = out.strip().split(" ", 1)
    assert int(count) >= 40 and threads == "['MainThread']", out


def test_one_device_batches_are_placed_in_the_thread_and_many_device_ones_are_not():
    """With one device no step can wait in a collective, so the copies leave the training
    thread; with several they stay in it (see the collective test above)."""
    out = run_with_devices("""
    import threading
    callers = []
    real = jax.device_put
    def spy(*a, **k):
        callers.append(threading.current_thread().name)
        return real(*a, **k)
    jax.device_put = spy
    one = jax.sharding.SingleDeviceSharding(jax.devices()[1])
    for sharding in (one, jl.data_sharding(jax.make_mesh((2,), ("data",)))):
        callers.clear()
        with jl.DataLoader(source(40), batch_size=4, num_epochs=None, device_prefetch=2,
                           sharding=sharding, process_index=0, process_count=1) as loader:
            it = iter(loader)
            batches = [next(it) for _ in range(12)]
        assert [b["y"].sharding for b in batches] == [sharding] * 12
        print(len(callers) >= 12, sorted(set(callers)))
    """, n=2)
    assert out.splitlines() == ["True ['jaxloader-host-prefetch']", "True ['MainThread']"], out


def test_a_loader_dropped_mid_pass_without_close_leaves_no_thread_and_no_worker():
    """A loop broken out of, then its loader deleted: the device-put thread, waiting for a
    taker with the host batches (and so the worker pool) in hand, used to keep the workers
    alive until the training process ended."""
    out = run_with_devices("""
    import gc, os, threading, time
    mesh = jax.make_mesh((2,), ("data",))
    def gone(pids, base):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            gc.collect()
            alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
            if not alive and threading.active_count() == base:
                return True
            time.sleep(0.05)
        return False
    base = threading.active_count()
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[1])  # placed in the thread
    for sharding in (jl.data_sharding(mesh), one_device):
        for num_workers in (0, 2):
            loader = jl.DataLoader(source(40), batch_size=4, num_workers=num_workers,
                                   sharding=sharding, device_prefetch=2, process_index=0,
                                   process_count=1)
            for i, batch in enumerate(loader):
                if i == 1:
                    break
            pids = loader.worker_pids
            assert len(pids) == num_workers and threading.active_count() == base + 1
            del loader, batch
            assert gone(pids, base), (sharding, num_workers, threading.enumerate())
    def shard(k):
        return ({"x": np.float32(i)} for i in range(k, 40, 2))
    stream = jl.StreamLoader(jl.Stream.from_generator(shard, shards=2), batch_size=2,
                             num_workers=2, sharding=jl.data_sharding(mesh),
                             process_index=0, process_count=1)
    next(iter(stream))
    pids = stream.worker_pids
    del stream
    assert gone(pids, base)
    print("ok")
    """, n=2)
    assert out.strip() == "ok"


class _Tick(BaseException):
    pass


_SEND_SIGPROF = """
import os, random, signal, sys, time
target, rng = int(sys.argv[1]), random.Random(0)
while os.getppid() == target:
    time.sleep(rng.uniform(0, 3e-4))
    os.kill(target, signal.SIGPROF)
"""


@pytest.mark.timeout(60)  # the old failure was a hang: a lock nobody would release
def test_interrupts_in_the_consumers_calls_never_leave_a_lock_held():
    """Ctrl-C lands anywhere in ``get()`` and ``stop()`` (here: thousands of interrupts).
    With ``threading.Event``/``Semaphore`` there, one landing inside their Python-level
    ``set()``/``release()`` left their lock held: the thread and the next ``get()`` or
    ``close()`` then waited for it forever (within a second or two of this test).

    The interrupts are SIGPROF (pytest-timeout keeps SIGALRM), sent to this process every 0
    to 300 us of wall time by another process, so that they land anywhere in this thread's
    code, as a terminal's Ctrl-C does. (A CPU-time timer, as before, fires only when a clock
    tick finds this process running: with other processes on the 2 cores a prefetcher took
    seconds to be interrupted and the test ran past its minute. A thread of this process
    cannot send them instead: it holds the GIL when it sends, so they never land in the
    middle of this thread's Python code, where the old failure was.)"""
    armed = [False]

    def tick(signum, frame):
        if armed[0]:
            armed[0] = False
            raise _Tick()

    def endless():
        i = 0
        while True:
            yield i
            i += 1

    def interrupted(call) -> int:
        try:
            armed[0] = True
            call()
        except _Tick:
            return 1
        finally:
            armed[0] = False
        return 0

    previous = signal.signal(signal.SIGPROF, tick)
    sender = subprocess.Popen([sys.executable, "-c", _SEND_SIGPROF, str(os.getpid())])
    made = 0
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline or made < 25:  # (at least 25, however loaded the CPU)
            p = HostPrefetcher(endless(), depth=2)
            p.start()
            made += 1
            # as LoaderIterator does: an interrupted get() ends this prefetcher, which close()
            # must still stop, however its stop() was interrupted too
            while not interrupted(lambda: [p.get() for _ in range(100)]):
                pass
            interrupted(p.stop)
            p.close()
            assert not p._thread.is_alive()
    finally:
        sender.kill()
        sender.wait()  # all it sent is delivered now, to tick(): none after the next line
        signal.signal(signal.SIGPROF, previous)


def test_a_forked_child_is_refused_the_device_put_thread_not_left_waiting():
    # it waited for good on a queue whose thread was the parent's (a loader with sharding=,
    # used after os.fork(): no worker pool to refuse it first)
    script = f"""
import os, signal, sys
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))!r})
from jaxloader.base.errors import JaxloaderError
from jaxloader.sharding.prefetch import DevicePrefetcher
for in_thread in (False, True):
    p = DevicePrefetcher(iter(range(100)), put=lambda b: b, depth=2, put_in_thread=in_thread)
    p.start()
    assert p.next() == 0
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)  # (the hang: killed by SIGALRM)
        try:
            p.next()
            os._exit(3)
        except JaxloaderError as e:
            os._exit(7 if "forked this one" in str(e) else 4)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), p.next())
    p.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split("\n")[:2] == ["7 1", "7 1"], done.stderr


def test_a_forked_child_makes_its_own_run_of_a_loader_whose_parent_has_a_device_put_thread():
    # iter() and load_state_dict() in the child waited for good for the parent's thread to
    # end (its copy kept the parent's thread's ident): an evaluation in a fork pool (the
    # concurrency audit)
    script = f"""
import os, signal, sys
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))!r})
import numpy as np, jax, jaxloader as jl
loader = jl.DataLoader([{{"x": np.float32(i)}} for i in range(20)], batch_size=4,
                       sharding=jax.devices()[0], process_index=0, process_count=1)
next(iter(loader))
state = loader.state_dict()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # (the hang: killed by SIGALRM)
    loader.load_state_dict(state)
    os._exit(10 + sum(1 for _ in loader))
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), sum(1 for _ in loader))
"""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True,
                          text=True, timeout=90)
    assert done.stdout.split("\n")[0] == "14 4", (done.stdout, done.stderr[-3000:])


def test_a_get_waiting_as_the_thread_is_stopped_is_told_not_left_waiting():
    # close() or load_state_dict() from another thread stopped the thread at a stop check,
    # with nothing put: a next() waiting for its batch waited for good (no permit here: the
    # thread waits for one, as it does with its batches made ahead)
    host = HostPrefetcher(iter([1, 2]), depth=0)
    host.start()
    got: list = []

    def wait() -> None:
        try:
            got.append(host.get())
        except prefetch.Stopped as e:
            got.append(e)

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    time.sleep(0.1)
    host.stop()
    waiting.join(10)
    assert not waiting.is_alive() and isinstance(got[0], prefetch.Stopped)
    assert host.close()
    with pytest.raises(prefetch.Stopped):  # (and a later get() too)
        host.get()


@pytest.mark.parametrize("put_in_thread", [True, False])
def test_device_prefetch_keeps_its_depth_placed_ahead_of_the_batch_handed_out(put_in_thread):
    # placed in the caller's thread (several devices), depth=1 kept none ahead of the step and
    # depth=N kept N - 1: the same setting meant one batch less than on one device
    placed: list[int] = []

    def put(batch):
        placed.append(batch)
        return batch

    for depth in (1, 2):
        placed.clear()
        p = DevicePrefetcher(iter(range(20)), put=put, depth=depth,
                             put_in_thread=put_in_thread).start()
        for taken in range(1, 5):
            assert p.next() == taken - 1
            time.sleep(0.05)  # (the host thread makes its batches ahead)
            if taken > 1:
                assert len(placed) - taken == depth, (depth, taken, placed)
        p.close()


def test_a_close_from_another_thread_ends_a_next_whose_source_blocks():
    # num_workers=0 with a device-put thread: a generator waiting on an empty queue (the
    # actors stopped) left next() waiting for good after a watchdog's close(), where the
    # thread, blocked in the source, never ended its batch to say so (the online audit)
    import queue

    import jax
    import numpy as np

    import jaxloader as jl

    rollouts = queue.Queue()
    for i in range(8):
        rollouts.put(i)

    def actor(shard):
        while True:
            yield {"i": np.float32(rollouts.get())}
    loader = jl.StreamLoader(jl.Stream.from_generator(actor, shards=1), batch_size=4,
                             sharding=jax.devices()[0], process_index=0, process_count=1)
    it = iter(loader)
    assert [next(it)["i"].tolist() for _ in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    raised = []

    def third():
        try:
            next(it)
        except jl.JaxloaderError as e:
            raised.append(str(e))
    waiting = threading.Thread(target=third, daemon=True)
    waiting.start()
    waiting.join(0.5)
    loader.close()
    waiting.join(10)
    assert raised and "closed" in raised[0], raised
    for _ in range(4):  # (the thread, blocked in the source, ends the batch it makes and then
        rollouts.put(99)  # itself: one record alone left it blocked for the second, and every
    deadline = time.monotonic() + 10  # later test in the process waited 3 s for it: no_leaks)
    while any(t.name == "jaxloader-host-prefetch" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the device-put thread did not end"
        time.sleep(0.01)


def test_a_closed_loaders_placed_batches_go_though_its_iterator_lives():
    # the host thread's queue kept its placed batches (one device, device_prefetch=4: 4 of 1
    # MiB) while an iterator of the closed loader was referenced (the device audit)
    import gc

    import jax
    import numpy as np

    import jaxloader as jl

    def live():
        gc.collect()
        return sum(1 for a in jax.live_arrays() if a.shape == (16, 1000))
    loader = jl.DataLoader(jl.ArraySource({"x": np.zeros((512, 1000), np.float32)}),
                           batch_size=16, sharding=jax.devices()[0], device_prefetch=4,
                           num_epochs=None, process_index=0, process_count=1)
    it = iter(loader)
    for _ in range(20):
        next(it)
    loader.close()
    assert live() == 0
    del it
    # (a batch the thread was still making as close() stopped waiting for it, 0.2 s: put
    # behind the stop mark and kept while the iterator lived; the eighteenth review)
    slow = jl.DataLoader(jl.ArraySource({"x": np.zeros((64, 1000), np.float32)}),
                         batch_size=16, sharding=jax.devices()[0], device_prefetch=4,
                         num_epochs=None, process_index=0, process_count=1,
                         transforms=[jl.BatchMap(lambda b: time.sleep(0.4) or b)])
    it = iter(slow)
    next(it)
    slow.close()
    time.sleep(1.5)
    assert live() == 0
    del it


def test_a_device_prefetch_of_many_batches_is_warned_of():
    # device_prefetch=100000 was taken: 2,751 batches placed 4 s in (the device audit)
    import numpy as np

    import jaxloader as jl

    import jax

    with pytest.warns(UserWarning, match=r"device_prefetch=100: that many batches are placed"):
        with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
                           device_prefetch=100, sharding=jax.devices()[0], process_index=0,
                           process_count=1) as loader:
            next(iter(loader))
    with pytest.warns(jl.JaxloaderWarning) as said:  # (placed nowhere: batches stay NumPy,
        with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,  # none ahead)
                           device_prefetch=100, process_index=0, process_count=1) as loader:
            next(iter(loader))
    assert [str(w.message)[:45] for w in said] == [
        "device_prefetch=100 without a sharding: batch"]
    # 10**9 was taken too, and iter() gave the device thread a permit each, for minutes (the
    # API audit): refused past 4,096
    with pytest.raises(jl.ConfigError, match=r"device_prefetch: expected an int in \[0, 4096\], "
                                             r"got 1000000000; batches kept ready on device"):
        jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, device_prefetch=10**9)


def test_a_script_that_ends_with_its_loader_open_exits_cleanly():
    # the thread's placed batches, still queued as the interpreter tore down, aborted it
    # after the script's work was done ("terminate called without an active exception", exit
    # code 134, each run of this on JAX 0.10 and 0.12): a finished run marked failed
    for _ in range(2):
        out = run_with_devices("""
        rows = jl.ArraySource({"x": np.zeros((1024, 256), np.float32), "y": np.arange(1024)})
        loader = jl.DataLoader(rows, batch_size=256, num_epochs=None,
                               sharding=tuple(jax.devices()[:2]),
                               transforms=[jl.Map(lambda r: (r["x"], r["y"]))])
        x, y = next(iter(loader))  # (left open: the thread places the next two meanwhile)
        print("ok", x.devices() == {jax.devices()[0]})
        """, n=2)
        assert out.strip() == "ok True"


def test_the_device_put_thread_makes_and_places_under_the_callers_jax_settings():
    # with jax.enable_x64(True) around the loop, the thread's puts were 32-bit: int64 values
    # past 2**31 refused as out of range (float64 made float32) where device_prefetch=0,
    # placing in the caller's thread, took them as they are
    import numpy as np

    import jax

    import jaxloader as jl

    rows = jl.ArraySource({"x": np.arange(8, dtype=np.int64) + 2**40,
                           "f": np.linspace(0, 1, 8, dtype=np.float64)})
    assert not jax.enable_x64.get_global()
    halved = [jl.JitMap(lambda r: {"x": r["x"], "f": r["f"] / 2})]  # (made on the thread too)
    with jax.enable_x64(True):
        for ahead, transforms in [(0, []), (2, []), (0, halved), (2, halved)]:
            with jl.DataLoader(rows, batch_size=4, sharding=jax.devices()[0],
                               device_prefetch=ahead, transforms=transforms) as loader:
                batch = next(iter(loader))
            assert batch["x"].dtype == np.int64 and int(batch["x"][0]) == 2**40, ahead
            assert batch["f"].dtype == np.float64, (ahead, transforms)
    with pytest.raises(jl.ConfigError, match=r"leaf \['x'\] of dtype int64 holds values"):
        with jl.DataLoader(rows, batch_size=4, sharding=jax.devices()[0]) as loader:
            next(iter(loader))  # (outside it, 32-bit as before: the global setting's)
    mixed = [jl.JitMap(lambda r: {"s": r["i"] + r["f"]})]  # (int and float: not under strict)
    small = jl.ArraySource({"i": np.arange(8, dtype=np.int32), "f": np.ones(8, np.float32)})
    with jax.numpy_dtype_promotion("strict"):  # (the others workers take too: the same)
        for ahead in (0, 2):
            with jl.DataLoader(small, batch_size=4, sharding=jax.devices()[0], transforms=mixed,
                               device_prefetch=ahead) as loader:
                with pytest.raises(jl.RecordError, match=r"TypePromotionError"):
                    next(iter(loader))


def test_a_new_run_waiting_for_a_device_put_thread_blocked_in_the_source_says_so(monkeypatch):
    # iter() after a batch: the device-put thread read the next batch ahead from a generator
    # waiting on a queue the loop fills later, and iter() waited for it for good, without a
    # word (the sharding audit); it is said, with where the thread waits and the remedies
    import queue
    import warnings

    import jax
    import numpy as np

    import jaxloader as jl

    monkeypatch.setattr(prefetch, "SAY_WAIT_S", 0.3)
    given: queue.Queue = queue.Queue()
    waiting = threading.Event()  # (the thread blocked reading ahead, before iter() asks)

    def records(shard):
        while True:
            if given.empty():
                waiting.set()
            yield given.get()

    for i in range(4):
        given.put({"x": np.float32(i)})
    with jl.StreamLoader(jl.Stream.from_generator(records, shards=1), batch_size=4,
                         sharding=jax.devices()[0], device_prefetch=2, process_index=0,
                         process_count=1) as loader:
        assert np.asarray(next(iter(loader))["x"]).tolist() == [0, 1, 2, 3]
        assert waiting.wait(30)
        filler = threading.Timer(1.5, lambda: [given.put({"x": np.float32(9)})
                                               for _ in range(8)])
        filler.start()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            iter(loader)
        filler.join()
    deadline = time.monotonic() + 10  # (the thread, reading ahead in the source as the
    while any(t.name == "jaxloader-host-prefetch" for t in threading.enumerate()):  # loader
        given.put({"x": np.float32(0)})  # closed, ends its batch, then itself: left waiting,
        assert time.monotonic() < deadline  # a later test that waits for every such thread
        time.sleep(0.01)  # to end failed, as the tests were dealt to the processes)
    texts = [str(w.message) for w in said if issubclass(w.category, jl.JaxloaderWarning)]
    assert any("waits for the device-put thread of the run before" in t and
               "device_prefetch=0" in t and "in records" in t for t in texts), texts
