"""Page-locked slots (jaxloader.sharding.pinning, workers/ring.py, workers/unpinning.py), on the
CPU backend: a client that records ``dma_map``/``dma_unmap`` stands in for a GPU's (the copy's
speed is measured on one: benchmarks/bench_pinned.py). What must hold: each slot registered
once, as it is made; unregistered while still mapped, never while a view of it is alive; no
address left registered once unmapped, wherever a Ctrl-C lands."""

from __future__ import annotations

import functools
import gc
import threading
import time
import warnings

import jax
import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sharding import pinning
from jaxloader.workers import unpinning
from jaxloader.workers.ring import SlotRing
from line_interrupts import Tick, raised_at_line
from tests.workers.test_ring import _fill


def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= address < end:
                return True
    return False


class Client:
    """A JAX client's ``dma_map``/``dma_unmap``, refusing as a GPU's would; what a real one
    could not tell (a range registered twice) is written down, not raised (``Pinner`` takes
    an exception for the backend's refusal)."""

    def __init__(self, refuse: bool = False, refuse_unmap: bool = False) -> None:
        self.mapped: dict[int, int] = {}  # address -> size, registered now
        self.maps, self.refuse, self.refuse_unmap = 0, refuse, refuse_unmap
        self.violations: list[str] = []

    def dma_map(self, address: int, size: int) -> None:
        if self.refuse:
            raise RuntimeError("UNIMPLEMENTED: DmaMap is not supported.")
        if any(a < address + size and address < a + n for a, n in self.mapped.items()):
            self.violations.append(f"{address:#x} registered twice")
            raise RuntimeError("INVALID_ARGUMENT: already registered")
        self.mapped[address] = size
        self.maps += 1

    def dma_unmap(self, address: int) -> None:
        if address not in self.mapped:
            raise RuntimeError("INVALID_ARGUMENT: not registered")
        if self.refuse_unmap:
            raise RuntimeError("INTERNAL: could not unregister")
        del self.mapped[address]

    def stale(self) -> list[int]:
        """Addresses registered that nothing maps any more: what must never be."""
        return [a for a in self.mapped if not _mapped(a)]


def test_a_slot_is_pinned_once_and_unpinned_before_it_is_unmapped():
    client = Client()
    ring = SlotRing(pinning.Pinner(client))
    seg = ring.take()
    assert client.maps == 1
    ring.hand_out(seg, _fill(ring, seg, 1), [])  # (dropped at once)
    gc.collect()
    assert ring.take() is seg and client.maps == 1  # reused: registered once
    grown = ring.grow(seg, seg.size * 3)  # the old one unmapped: unpinned first
    assert client.maps == 2 and len(client.mapped) == 1 and seg.buf is None
    ring.give_back(grown)
    ring.close()
    assert client.mapped == {} and grown.buf is None and not client.violations


def test_a_slot_read_at_close_is_unpinned_by_a_thread_once_its_views_die():
    client = Client()
    ring = SlotRing(pinning.Pinner(client))
    seg = ring.take()
    batch = ring.hand_out(seg, _fill(ring, seg, 7), [])  # e.g. held by a copy in flight
    ring.close()
    assert len(client.mapped) == 1 and seg.buf is not None and not seg.linked
    assert unpinning.waiting() == 1 and batch["v"].sum() == 7 * 400  # still readable
    del batch  # (no other ring, no later call of ours: the thread does it)
    assert unpinning.wait_all(5.0)
    assert client.mapped == {} and seg.buf is None and not client.violations
    deadline = time.monotonic() + 5.0  # and the thread ends, none waiting
    while any(t.name == "jaxloader-unpin" for t in threading.enumerate()):
        assert time.monotonic() < deadline, threading.enumerate()
        time.sleep(0.01)


def _scenario(ring: SlotRing, held: list) -> None:
    seg = ring.take()
    held.append(ring.hand_out(seg, _fill(ring, seg, 1), []))
    other = ring.take()
    ring.give_back(ring.grow(other, other.size * 3))
    dropped = ring.take()
    ring.hand_out(dropped, _fill(ring, dropped, 2), [])
    ring.close()


def test_a_ctrl_c_anywhere_leaves_no_address_registered_once_unmapped():
    functions = [pinning.Pinner.pin, pinning.Pinner.unpin, SlotRing._create, SlotRing._destroy,
                 SlotRing._release, SlotRing.close, unpinning.release, unpinning._unpin]
    n = 0
    while True:
        n += 1
        client, held = Client(), []
        ring = SlotRing(pinning.Pinner(client))
        try:
            raised = raised_at_line(n, functions, functools.partial(_scenario, ring, held))
        except Tick:  # (raised where raised_at_line's own bookkeeping cannot see it)
            raised = True
        assert not client.stale(), f"line {n}: registered, unmapped"
        ring.close()  # what the pool's close() does again after an interrupted one
        held.clear()  # (no cycle holds a slot's views: they go now, without a collection)
        assert unpinning.wait_all(5.0)
        assert client.mapped == {} and not client.violations, f"line {n}: {client.mapped}"
        if not raised:
            break
    assert n > 20, n  # (the sweep went through the code)


def test_a_slot_that_cannot_be_unregistered_stays_mapped_and_is_said():
    client = Client(refuse_unmap=True)
    ring = SlotRing(pinning.Pinner(client))
    seg = ring.take()
    with pytest.warns(jl.JaxloaderWarning, match="could not be unregistered"):
        ring._release(seg)  # (then a close() cut short before it forgot the slot)
    ring.close()  # releases it again: still kept
    try:
        assert seg.buf is not None and len(client.mapped) == 1 and not client.stale()
        assert any(held is seg for held in pinning._HELD)
    finally:  # (the test's own clean-up: a process keeps it for good)
        pinning._HELD.remove(seg)
        seg.destroy()


def test_a_forked_child_waits_for_no_slot_its_parents_thread_was_unpinning():
    # a fork as the parent's jaxloader-unpin was between claiming a slot and finishing it left
    # the claim in the child, where no thread ends it: its wait_all() waited out every timeout
    import os

    unpinning._DOING[(-1, threading.get_ident())] = "a claim in flight"
    try:
        pid = os.fork()
        if pid == 0:  # (the child: says, by its exit code, whether it waits for nothing)
            os._exit(0 if unpinning.waiting() == 0 and unpinning.wait_all(0.0) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        del unpinning._DOING[(-1, threading.get_ident())]
    assert os.waitstatus_to_exitcode(status) == 0


def _batches(client, monkeypatch, keep: list | None = None):
    if client is not None:
        monkeypatch.setattr(pinning, "pinner_for",
                            lambda putter, label: pinning.Pinner(client, label))
    data = np.arange(60 * 20_000, dtype=np.int32).reshape(60, 20_000)  # (80 KB rows: a CPU
    # device array may alias its slot, as a GPU's copy in flight reads it)
    loader = jl.DataLoader(jl.ArraySource({"x": data}), batch_size=4, shuffle=True, seed=3,
                           num_epochs=2, num_workers=2, sharding=jax.devices()[0],
                           process_index=0, process_count=1)
    try:
        out = []
        for b in loader:
            out.append(np.array(b["x"]))
            if keep is not None:
                keep[:] = [b]
    finally:
        loader.close()
    return out


def test_a_loader_placing_batches_pins_its_ring_and_unpins_all_of_it(monkeypatch):
    client, kept = Client(), []
    pinned = _batches(client, monkeypatch, kept)
    assert client.maps >= 2 and not client.stale()
    kept.clear()  # the last batch, held past close()
    gc.collect()
    assert unpinning.wait_all(5.0)
    assert client.mapped == {} and not client.violations
    monkeypatch.undo()
    assert all(np.array_equal(a, b) for a, b in zip(pinned, _batches(None, monkeypatch)))


def test_a_backend_refusing_is_said_once_and_the_batches_are_the_same(monkeypatch):
    client = Client(refuse=True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        refused = _batches(client, monkeypatch)
    texts = [str(w.message) for w in said if issubclass(w.category, jl.JaxloaderWarning)]
    assert len(texts) == 1 and "does not register host memory" in texts[0], texts
    monkeypatch.undo()
    assert all(np.array_equal(a, b) for a, b in zip(refused, _batches(None, monkeypatch)))


class _Device:
    def __init__(self, platform: str, client: object) -> None:
        self.platform, self.client = platform, client


class _Sharding(jax.sharding.Sharding):
    def __init__(self, *devices: _Device) -> None:
        self._devices = devices

    @property
    def device_set(self) -> set:
        return set(self._devices)


class _Putter:
    def __init__(self, sharding: object) -> None:
        self.sharding = sharding


def test_a_pinner_only_for_gpus_of_one_client_that_registers():
    gpu_client, other = Client(), Client()
    gpus = [_Device("gpu", gpu_client) for _ in range(2)]
    made = pinning.pinner_for(_Putter({"x": _Sharding(*gpus), "y": _Sharding(gpus[0])}))
    assert made is not None and made._client is gpu_client
    for sharding in (_Sharding(_Device("cpu", gpu_client)), _Sharding(_Device("tpu", other)),
                     _Sharding(gpus[0], _Device("gpu", other)),  # (two clients)
                     {"x": _Sharding(gpus[0]), "y": _Sharding(_Device("cpu", gpu_client))},
                     _Sharding(_Device("gpu", object()))):  # (a client without dma_map)
        assert pinning.pinner_for(_Putter(sharding)) is None, sharding
    assert pinning.pinner_for(None) is None
    from jaxloader.sharding.put import Putter

    assert pinning.pinner_for(Putter(jax.devices("cpu")[0], 1)) is None
