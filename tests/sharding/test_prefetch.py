"""The device-put thread: held arrays never change, errors cross, stats, clean stop."""

from __future__ import annotations

import threading

import pytest

from jaxloader.sharding.prefetch import DevicePrefetcher
from sharding.devices import run_with_devices

pytestmark = pytest.mark.timeout(180)


def test_prefetcher_orders_bounds_and_passes_errors():
    made = []

    def host():
        for i in range(10):
            made.append(i)
            if i == 6:
                raise KeyError("host batch 6")
            yield i

    p = DevicePrefetcher(host(), put=lambda b: b * 2, depth=3)
    assert p.next() == 0
    threading.Event().wait(0.2)
    assert len(made) <= 1 + 2 * 3  # one taken; `depth` copies in flight, `depth` host batches
    assert [p.next() for _ in range(5)] == [2, 4, 6, 8, 10]
    with pytest.raises(KeyError, match="host batch 6"):
        p.next()
    with pytest.raises(KeyError, match="host batch 6"):  # and again: it stays failed
        p.next()
    p.close()
    p.close()


def test_close_stops_an_endless_thread():
    def endless():
        i = 0
        while True:
            yield i
            i += 1

    before = threading.active_count()
    p = DevicePrefetcher(endless(), put=lambda b: b, depth=2)
    p.next()
    p.close()
    assert threading.active_count() == before


def test_held_jax_and_numpy_batches_never_change():
    out = run_with_devices("""
    mesh = jax.make_mesh((2,), ("data",))
    kw = dict(batch_size=4, shuffle=True, seed=3, transforms=[jl.RandomMap(noise)],
              num_epochs=None)
    ref = reference(30, num_epochs=10, **{k: v for k, v in kw.items() if k != "num_epochs"})
    held = {}
    for name, extra in [("jax", dict(sharding=jl.data_sharding(mesh), device_prefetch=2)),
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
    loader = jl.DataLoader(source(20), batch_size=4, transforms=[jl.Map(bad)], num_workers=2,
                           sharding=jl.data_sharding(mesh), process_index=0, process_count=1)
    it = iter(loader)
    next(it); next(it)
    try:
        next(it)
    except jl.WorkerError as e:
        assert "record position 9" in str(e) and "nine" in str(e)
        first = e
    try:
        next(it)
    except jl.WorkerError as e:
        assert e is first
    loader.close()
    loader0 = jl.DataLoader(source(20), batch_size=4, transforms=[jl.Map(bad)],
                            sharding=jl.data_sharding(mesh), process_index=0, process_count=1)
    it = iter(loader0)
    next(it); next(it)
    try:
        next(it)
    except jl.RecordError as e:
        assert isinstance(e.__cause__, ZeroDivisionError)
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


def test_prefetch_never_deadlocks_a_collective_step():
    """Placing batches from a background thread hung an all-reduce on 8 CPU devices; the copies
    are now dispatched from the consumer's thread, ordered with the steps."""
    out = run_with_devices("""
    import jax.numpy as jnp
    mesh = jax.make_mesh((8,), ("data",))
    src = jl.ArraySource({"x": np.random.default_rng(0).random((2048, 32)).astype(np.float32)})
    replicated = NamedSharding(mesh, P())
    w = jax.device_put(jnp.ones((32, 32)), replicated)

    @jax.jit
    def step(w, b):
        return w - 1e-3 * jax.grad(lambda w: jnp.tanh(b["x"] @ w).sum())(w)

    with jl.DataLoader(src, batch_size=64, num_epochs=None, num_workers=2, device_prefetch=2,
                       sharding=jl.data_sharding(mesh), process_index=0,
                       process_count=1) as loader:
        it = iter(loader)
        for _ in range(300):
            w = step(w, next(it))
        w.block_until_ready()
    print("ok")
    """, timeout=100)
    assert out.strip() == "ok"
