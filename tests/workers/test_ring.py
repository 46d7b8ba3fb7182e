from __future__ import annotations

import gc
import os
import types
import weakref

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.batching.collate import materialize
from jaxloader.batching.record_columns import record_columns
from jaxloader.workers.ring import SlotRing


def _fill(ring, segment, value):
    records = [{"v": np.full(100, value, np.int32)} for _ in range(4)]
    buf = segment.buf
    _, layout = materialize(*record_columns(records), alloc=lambda n: buf[:n])
    return layout


def test_slots_come_back_only_when_the_views_are_garbage():
    ring = SlotRing()
    first = ring.take()
    layout = _fill(ring, first, 1)
    batch = ring.hand_out(first, layout, [])
    second = ring.take()
    assert second.name != first.name  # the first is still read by the user
    ring.give_back(second)
    view = batch["v"][2:]  # a view of a view keeps the slot too
    del batch
    gc.collect()
    assert ring.take().name == second.name
    assert view.sum() == 100 * 2
    del view
    gc.collect()
    assert ring.take().name == first.name
    assert ring.segment_count == 2
    ring.close()


def test_a_slot_returns_without_running_python_code():
    # A weakref.finalize callback is Python code: a Ctrl-C landing in it is printed as
    # "Exception ignored" and lost, and the loop it should have stopped runs on (seen in CI).
    # The ring's callback is a builtin, which a signal handler cannot interrupt.
    ring = SlotRing()
    seg = ring.take()
    batch = ring.hand_out(seg, _fill(ring, seg, 3), [])
    base = batch["v"].base
    while base.base is not None and isinstance(base.base, np.ndarray):
        base = base.base
    callbacks = [r.__callback__ for r in weakref.getweakrefs(base)]
    assert callbacks and all(isinstance(c, types.BuiltinMethodType) for c in callbacks), callbacks
    del batch, base
    gc.collect()
    assert ring.take().name == seg.name
    ring.close()


def test_grow_replaces_the_slot_and_new_slots_get_the_largest_size():
    ring = SlotRing()
    small = ring.take()
    big = ring.grow(small, small.size * 3)
    assert big.size >= small.size * 3 and not os.path.exists(f"/dev/shm/{small.name}")
    ring.give_back(big)
    assert ring.take().size == big.size
    assert ring.take().size >= big.size  # a fresh slot is created at the grown size
    ring.close()


def test_close_unlinks_everything_even_while_views_live():
    ring = SlotRing()
    seg = ring.take()
    batch = ring.hand_out(seg, _fill(ring, seg, 7), [])
    ring.close()
    assert not os.path.exists(f"/dev/shm/{seg.name}")
    assert (batch["v"] == 7).all()  # still readable until the user drops it


def test_a_slot_goes_back_to_the_worker_that_wrote_it():
    # A worker keeps a mapping of each slot it wrote: handed its own slots back, it maps no
    # new one (with slots shared at random it would map every slot of the ring)
    ring = SlotRing()
    a, b = ring.take(0), ring.take(1)
    ring.give_back(b)
    ring.give_back(a)  # one free list, last in first out, would give worker 1 this one
    assert ring.take(1).name == b.name and ring.take(0).name == a.name
    batch = ring.hand_out(b, _fill(ring, b, 2), [])
    ring.give_back(a)
    del batch
    gc.collect()  # b's views died after a came back: b goes back to worker 1's slots
    assert ring.take(0).name == a.name and ring.take(1).name == b.name
    ring.give_back(a)
    assert ring.take(1).name == a.name  # its own all lent: another's, not a new slot
    assert ring.segment_count == 2
    ring.close()


def test_the_slot_size_is_unknown_until_a_batch_is_seen():
    # slots of a page are made before any batch: the pool must not size tasks by them (16
    # steps a task into slots too small for each, every one a round trip to grow)
    ring = SlotRing()
    seg = ring.take()
    assert ring.slot_size == 0
    batch = ring.hand_out(seg, _fill(ring, seg, 1), [])
    assert ring.slot_size >= seg.size > 0
    del batch
    ring.close()


def _growing(record):
    return {"x": np.ones(2**16 * (1 + int(record["i"]) // 4), np.uint8)}


def _slots_mapped(pid):
    """The bytes of jaxloader's memory files (the ring's slots, the status board: a page) that
    process ``pid`` maps."""
    total = 0
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if "memfd:jaxloader_" in line and "stack" not in line:
                start, end = line.split()[0].split("-")
                total += int(end, 16) - int(start, 16)
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux's /proc")
def test_a_worker_lets_go_of_the_slots_the_ring_replaced_by_larger_ones():
    # batches that grow (sorted lengths): each larger batch replaces its slot, and the workers
    # kept every smaller one mapped (up to 128 a worker), its memory held: 35-47 MB each here,
    # for batches of 6 MB at most
    with jl.DataLoader(jl.ArraySource({"i": np.arange(100)}), batch_size=4, num_workers=2,
                       transforms=[jl.Map(_growing)], prefetch=1, process_index=0,
                       process_count=1) as loader:
        for step, batch in enumerate(loader):
            if step == 22:
                largest = batch["x"].nbytes
                held = [_slots_mapped(pid) for pid in loader.worker_pids]
    assert max(held) <= 4 * largest, (held, largest)  # (a slot or two in flight)


class _Outlier:  # one batch of 32 MB (records 40 to 43) among batches of 1 KB
    def __len__(self):
        return 4000

    def __getitem__(self, i):
        return {"x": np.full(2_000_000 if 40 <= i < 44 else 64, i, np.float32)}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux's /proc")
def test_a_worker_lets_go_of_an_outlier_batchs_slot_once_the_ring_came_down(monkeypatch):
    # the ring destroyed the outlier's 40 MB slot once its size came down, but the worker
    # that wrote it kept it mapped (it let go of smaller slots only): its memory held for good
    monkeypatch.setattr("jaxloader.workers.ring._SETTLE", 16, raising=False)
    with jl.DataLoader(_Outlier(), batch_size=4, num_workers=2, process_index=0,
                       process_count=1) as loader:
        it = iter(loader)
        for _ in range(300):
            next(it)
        held = [_slots_mapped(pid) for pid in loader.worker_pids]
    assert max(held) < 4 << 20, held


def test_batches_kept_past_the_slots_budget_let_their_descriptors_go(monkeypatch):
    # each kept batch's slot held a descriptor of this process (two before Python 3.13):
    # list(loader) of 2,500 batches ran out of them at a limit of 1,024
    monkeypatch.setattr("jaxloader.workers.ring.ahead_slots", lambda taken=0, others=0: 3)
    monkeypatch.setattr("jaxloader.workers.ring.SMALL_LEAF", 0)  # (whole batches kept: their
    ring = SlotRing()  # leaves' copies would free the slots below)
    kept = []
    for value in range(5):
        segment = ring.take()
        kept.append((segment, ring.hand_out(segment, _fill(ring, segment, value), [])))
    assert [segment.linked for segment, _ in kept] == [False, False, True, True, True]
    assert [int(batch["v"][0, 0]) for _, batch in kept] == [0, 1, 2, 3, 4]  # (still mapped)
    unlinked = {kept[0][0].name, kept[1][0].name}
    del kept[:2]
    gc.collect()
    assert {ring.take().name, ring.take().name}.isdisjoint(unlinked)  # destroyed, not reused
    assert ring.segment_count == 5
    ring.close()


def _fill_two(segment, value):  # an image and a label, as an evaluation's batch holds them
    records = [{"image": np.full(200, value, np.float32), "label": np.int64(value)}] * 4
    buf = segment.buf
    return materialize(*record_columns(records), alloc=lambda n: buf[:n])[1]


def test_a_small_leaf_kept_from_each_batch_holds_a_copy_not_its_batchs_slot():
    # an evaluation keeping each batch's labels for its metric (NumPy batches: no sharding=)
    # held each batch's whole slot, a page a step here (a megabyte in the review's case): the
    # ring grew a slot a batch, and on 3.11 under a limit of 256 descriptors it ran out at 173
    ring, labels, dropped = SlotRing(), [], SlotRing()
    try:
        for value in range(300):
            segment = ring.take()
            batch = ring.hand_out(segment, _fill_two(segment, value), [])
            labels.append(batch["label"])
            del batch
        assert [int(label[0]) for label in labels] == list(range(300))
        assert ring.segment_count <= 2 * 64, ring.segment_count  # (it was 300: one a label)
        for value in range(300):  # a loop that keeps nothing is handed views alone, as before
            segment = dropped.take()
            batch = dropped.hand_out(segment, _fill_two(segment, value), [])
            assert batch["label"].base is not None and int(batch["image"][0, 0]) == value
        assert dropped.segment_count <= 2
        # nor at an epoch's end, its batches handed out with no take() between (which reads
        # the views that died): each then looked kept, and copies were made for good (the
        # twenty-sixth review)
        slots = [dropped.take() for _ in range(100)]
        for value, segment in enumerate(slots):
            batch = dropped.hand_out(segment, _fill_two(segment, value), [])
            assert batch["label"].base is not None, value
        del slots, batch
    finally:
        ring.close()
        dropped.close()


def test_batches_let_go_in_turn_reuse_their_slots_past_the_slots_budget():
    # a returned batch's weak reference is freed, and the next one may take its id: the budget
    # then unlinked (and so destroyed) a live slot every batch, a new segment each
    ring = SlotRing()
    held, names = None, set()
    for value in range(600):
        segment = ring.take()
        names.add(segment.name)
        held = ring.hand_out(segment, _fill(ring, segment, value), [])
        assert int(held["v"][0, 0]) == value
    assert len(names) <= 3, len(names)  # (it was 300 and more)
    ring.close()


def test_one_outlier_batch_leaves_the_slots_its_size_only_for_a_while(monkeypatch):
    # the slot size only grew: one large batch among small ones made every later slot its size,
    # and the pool (which sizes its tasks by it) ran a step a task for good, 3x slower
    monkeypatch.setattr("jaxloader.workers.ring._SETTLE", 8, raising=False)
    ring = SlotRing()

    def hand(value, n=100):
        segment = ring.take()
        records = [{"v": np.full(n, value, np.int32)} for _ in range(4)]
        buf = segment.buf
        if segment.size < 16 * n + 64:
            segment = ring.grow(segment, 16 * n + 64)
            buf = segment.buf
        _, layout = materialize(*record_columns(records), alloc=lambda k: buf[:k])
        batch = ring.hand_out(segment, layout, [])
        assert int(batch["v"][3, n - 1]) == value
        return segment.size

    small = hand(0)
    big = hand(1, 2**18)  # 4 MiB
    assert ring.slot_size >= big > 100 * small
    sizes = [hand(v) and ring.slot_size for v in range(2, 40)]
    assert sizes[0] >= big  # (kept for a window or two)
    assert sizes[-1] <= 2 * small, sizes  # then back to the small batches' size
    assert max(s.size for s in ring._segments.values()) <= 2 * small  # the big slot went
    again = hand(40, 2**18)  # and a large batch later grows it again
    assert again >= big and ring.slot_size >= big
    ring.close()


def test_a_ring_alone_keeps_a_quarter_of_the_limit_and_a_collected_loader_may_close_its_ring(
        monkeypatch):
    # (a ring alone: the slots of before other loaders were counted, the review; and a loader
    # collected as another's ring counted the descriptors (a garbage collection there) closed
    # its ring under the same lock: a plain lock waited for itself for good)
    import threading

    from jaxloader.workers import ring as ring_module
    from jaxloader.workers.tasks import ahead_slots

    import resource

    monkeypatch.setattr(ring_module, "_RINGS", weakref.WeakSet())  # (no other loader's)
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))  # (where it shows)
    alone = SlotRing()
    assert alone.budget == ahead_slots()
    other = SlotRing()
    assert other.budget <= alone.budget
    counted = ring_module.open_descriptors

    def collected_meanwhile():
        other.close()
        return counted()

    made = []
    thread = threading.Thread(target=lambda: made.append(SlotRing()), daemon=True)
    monkeypatch.setattr(ring_module, "open_descriptors", collected_meanwhile)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and made
    for each in (alone, made[0]):
        each.close()


def test_slots_of_batches_kept_and_dropped_go_once_fewer_are_in_use(monkeypatch):
    # itertools.cycle(loader), or a list of a pass, kept 300 batches: their slots went back to
    # the free list when they were dropped, and stayed there, a descriptor each, for the
    # loader's life (the paired-loaders audit: 273 memory files 1,800 batches later)
    monkeypatch.setattr("jaxloader.workers.ring._SETTLE", 16, raising=False)
    ring = SlotRing()

    def hand(value):
        segment = ring.take()
        return ring.hand_out(segment, _fill(ring, segment, value), [])
    kept = [hand(v) for v in range(60)]
    assert ring.segment_count >= 60
    del kept
    gc.collect()
    held = None
    for value in range(60, 120):  # (one batch at a time: two slots in use)
        held = hand(value)
    assert int(held["v"][0, 0]) == 119
    assert ring.segment_count <= 8, ring.segment_count  # (60 before)
    ring.close()
