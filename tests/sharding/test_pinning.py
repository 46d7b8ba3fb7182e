"""Page-locked slots (jaxloader.sharding.pinning, workers/ring.py), on the CPU backend: a client
that records ``dma_map``/``dma_unmap`` stands in for a GPU's (the copy's speed is measured on one,
benchmarks/bench_pinned.py). What must hold: each slot registered once as it is made, and
unregistered while still mapped, never while a view of it (a copy in flight) is alive."""

from __future__ import annotations

import gc
import warnings

import jax
import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sharding import pinning
from jaxloader.workers import ring as ring_module
from jaxloader.workers.ring import SlotRing
from tests.workers.test_ring import _fill


class Client:
    """A JAX client's ``dma_map``/``dma_unmap``, recorded and checked as a GPU's would be."""

    def __init__(self, refuse: bool = False) -> None:
        self.mapped: dict[int, int] = {}  # address -> size, registered now
        self.maps = 0
        self.refuse = refuse

    def dma_map(self, address: int, size: int) -> None:
        if self.refuse:
            raise RuntimeError("UNIMPLEMENTED: DmaMap is not supported.")
        assert not any(a < address + size and address < a + n for a, n in self.mapped.items()), (
            "a range registered twice")
        self.mapped[address] = size
        self.maps += 1

    def dma_unmap(self, address: int) -> None:
        assert address in self.mapped, "unregistered an address not registered"
        del self.mapped[address]


class Watched(pinning.Pinner):
    """Checks, as each slot is unpinned, that it is still mapped here."""

    def unpin(self, segment):
        if self.pinned(segment):
            assert segment.buf is not None, "unpinned after it was unmapped"
        super().unpin(segment)


def test_a_slot_is_pinned_once_and_unpinned_before_it_is_unmapped():
    client = Client()
    ring = SlotRing(Watched(client))
    seg = ring.take()
    assert client.maps == 1
    ring.hand_out(seg, _fill(ring, seg, 1), [])  # (dropped at once)
    gc.collect()
    assert ring.take() is seg and client.maps == 1  # reused: registered once
    grown = ring.grow(seg, seg.size * 3)  # the old one unmapped: unpinned first
    assert client.maps == 2 and len(client.mapped) == 1 and seg.buf is None
    ring.give_back(grown)
    ring.close()
    assert client.mapped == {} and grown.buf is None


def test_a_slot_read_by_a_view_is_unpinned_only_once_the_view_dies():
    client = Client()
    ring = SlotRing(Watched(client))
    seg = ring.take()
    batch = ring.hand_out(seg, _fill(ring, seg, 7), [])  # e.g. held by a copy in flight
    ring.close()
    assert len(client.mapped) == 1 and seg.buf is not None and not seg.linked
    assert batch["v"].sum() == 7 * 400  # still readable
    other = SlotRing(Watched(Client()))
    other.take()
    assert len(client.mapped) == 1  # looked at, still read
    del batch
    gc.collect()
    other.take()  # any ring, looking, unpins it
    assert client.mapped == {} and seg.buf is None and ring_module._UNPIN_LATER == []
    other.close()


def test_a_kept_slot_destroyed_by_a_settle_waits_for_its_views():
    client = Client()
    ring = SlotRing(Watched(client))
    seg = ring.take()
    batch = ring.hand_out(seg, _fill(ring, seg, 2), [])
    ring._destroy(seg)  # (what a settle or a kept batch past the budget leads to)
    assert len(client.mapped) == 1 and seg.buf is not None
    del batch
    gc.collect()
    ring.take()
    assert len(client.mapped) == 1 and seg.buf is None  # (the new slot's alone)
    ring.close()
    assert client.mapped == {}


def _batches(client, monkeypatch, **options):
    if client is not None:
        monkeypatch.setattr(pinning, "pinner_for",
                            lambda putter, label: pinning.Pinner(client, label))
    data = np.arange(60 * 512, dtype=np.int32).reshape(60, 512)
    loader = jl.DataLoader(jl.ArraySource({"x": data}), batch_size=8, shuffle=True, seed=3,
                           num_epochs=2, num_workers=2, sharding=jax.devices()[0],
                           process_index=0, process_count=1, **options)
    try:
        out = [np.array(b["x"]) for b in loader]  # (copies: a CPU array may alias its slot)
    finally:
        loader.close()
    return out


def test_a_loader_placing_batches_pins_its_ring_and_unpins_all_of_it(monkeypatch):
    client = Client()
    pinned = _batches(client, monkeypatch)
    gc.collect()
    looking = SlotRing()  # (a slot still read at close(): unpinned by the next ring to look)
    looking.take()
    looking.close()
    assert client.maps >= 2 and client.mapped == {}
    monkeypatch.undo()
    assert all(np.array_equal(a, b) for a, b in zip(pinned, _batches(None, monkeypatch)))


def test_a_backend_refusing_is_said_once_and_the_batches_are_the_same(monkeypatch):
    client = Client(refuse=True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        refused = _batches(client, monkeypatch)
    texts = [str(w.message) for w in said if issubclass(w.category, jl.JaxloaderWarning)]
    assert len(texts) == 1 and "page-locked" in texts[0] and "DmaMap" in texts[0], texts
    monkeypatch.undo()
    assert all(np.array_equal(a, b) for a, b in zip(refused, _batches(None, monkeypatch)))


@pytest.mark.parametrize("where", ["cpu", None])
def test_no_pinner_without_a_gpu(where):
    from jaxloader.sharding.put import Putter

    assert pinning.pinner_for(None) is None
    if where:
        assert pinning.pinner_for(Putter(jax.devices(where)[0], 1)) is None
