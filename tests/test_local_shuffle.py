"""Read-local shuffling: a bijection every epoch, batches from few blocks, exact resume."""

from __future__ import annotations

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.order.local_shuffle import BlockOrder
from resume_harness import check_resume, check_split_resume


def test_every_epoch_is_a_bijection_of_blocks_read_window_by_window():
    starts = np.array([0, 7, 30, 31, 64, 100, 130, 131, 160])  # blocks of uneven sizes
    seen = []
    for epoch in range(3):
        order = BlockOrder(starts, window=3, seed=5, epoch=epoch)
        indices = order(np.arange(160))
        assert sorted(indices.tolist()) == list(range(160))
        blocks = np.searchsorted(starts, indices, side="right") - 1
        permuted = order._order
        at = np.concatenate([[0], np.cumsum(np.diff(starts)[permuted])])
        for w in range(0, len(permuted), 3):  # a window's positions read only its own blocks
            window = blocks[at[w]:at[min(w + 3, len(permuted))]]
            assert set(window.tolist()) == set(permuted[w:w + 3].tolist())
        seen.append(indices)
    assert not np.array_equal(seen[0], seen[1]) and not np.array_equal(seen[1], seen[2])


def test_the_order_is_the_one_its_number_names():
    # a digest of the read-local order (part of the state's version): a restore after an
    # upgrade must read what the checkpointed run would have read (2026-12-03: up to 4,096
    # blocks permuted exactly, its states marked "exact_shuffle"; was a0a7821574ae62c3)
    import hashlib

    starts = np.append(np.arange(0, 100_000, 1000), 100_003)  # a last block of 1,003
    out = np.concatenate([BlockOrder(starts, window=8, seed=11, epoch=e)(np.arange(100_003))
                          for e in (0, 7)])
    assert hashlib.sha256(out.astype("<i8").tobytes()).hexdigest()[:16] == "94e403d12a52b37c"


def test_a_state_of_another_read_local_order_is_refused():
    src = jl.ArraySource({"x": np.arange(5000)})

    def make(window=2):
        return jl.DataLoader(src, batch_size=100, shuffle=jl.LocalShuffle(window=window),
                             process_index=0, process_count=1)

    state = make().state_dict()
    assert state["local_shuffle"] == "window 2, blocks 1024"
    with pytest.raises(jl.StateDictError, match="windows and blocks of other sizes"):
        make(window=4).load_state_dict(state)


def parquet(tmp_path, rows=(300, 220, 180), group=40):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    paths, start = [], 0
    for k, n in enumerate(rows):
        ids = np.arange(start, start + n, dtype=np.int64)
        paths.append(str(tmp_path / f"part-{k}.parquet"))
        pq.write_table(pa.table({"id": ids, "v": ids.astype(np.float32) * 2}), paths[-1],
                       row_group_size=group)
        start += n
    return jl.ParquetSource(paths)


def test_a_parquet_epoch_reads_each_row_once_and_few_row_groups_a_batch(tmp_path):
    src = parquet(tmp_path)
    with jl.DataLoader(src, batch_size=32, shuffle=jl.LocalShuffle(window=2), seed=1,
                       process_index=0, process_count=1) as loader:
        batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    assert len(ids) == 21 * 32 and len(set(ids.tolist())) == len(ids)
    groups_per_batch = [len(np.unique(np.searchsorted(src.block_starts, b["id"], "right")))
                        for b in batches]
    assert max(groups_per_batch) <= 4  # a window (2 row groups), rarely two windows
    with jl.DataLoader(src, batch_size=32, shuffle=True, seed=1, process_index=0,
                       process_count=1) as full:
        spread = [len(np.unique(np.searchsorted(src.block_starts, b["id"], "right")))
                  for b in full]
    assert np.median(spread) > 2 * np.median(groups_per_batch)  # the point of it


def test_a_read_local_pass_decodes_each_row_group_once_in_the_cache_it_is_advised(
        tmp_path, monkeypatch):
    # a batch across two windows read its runs by row group number: the next window's groups,
    # decoded first, evicted the cached window's, decoded again for the batch after (24
    # decodes of 12 row groups, up to 3 of one, at the cache the warning calls enough; the
    # read-local audit). Its runs go in the order it first reads them
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    sizes = [400, 1300, 700, 900, 500, 1100, 800, 600, 1000, 1200, 450, 950]
    ids = np.arange(sum(sizes))
    writer = None
    for start, n in zip(np.cumsum([0, *sizes[:-1]]), sizes):
        part = pa.table({"id": ids[start:start + n], "v": np.ones((n,), np.float64)})
        writer = writer or pq.ParquetWriter(tmp_path / "g.parquet", part.schema)
        writer.write_table(part)
    writer.close()
    advised = int(np.sort(jl.ParquetSource(tmp_path / "g.parquet")._group_bytes)[-2:].sum())
    source = jl.ParquetSource(tmp_path / "g.parquet", cache_bytes=advised)
    decoded = []
    read = jl.ParquetSource._read
    monkeypatch.setattr(jl.ParquetSource, "_read", lambda self, g: decoded.append(g) or read(
        self, g))
    with jl.DataLoader(source, batch_size=64, shuffle=jl.LocalShuffle(window=2), seed=0,
                       num_workers=0, num_epochs=1, last_batch="partial", process_index=0,
                       process_count=1) as loader:
        assert sorted(np.concatenate([b["id"] for b in loader]).tolist()) == ids.tolist()
    assert sorted(decoded) == list(range(12))


@pytest.mark.parametrize("k", [2, 25])
def test_resume_into_other_worker_and_process_counts(tmp_path, k):
    src = parquet(tmp_path)

    def make(num_workers=0, batch_size=16, process_index=0, process_count=1):
        return lambda: jl.DataLoader(src, batch_size=batch_size, seed=3,
                                     shuffle=jl.LocalShuffle(window=3), num_workers=num_workers,
                                     process_index=process_index, process_count=process_count)

    check_resume(make(), total=k + 8, k=k, make_restored=make(num_workers=2))
    check_split_resume(make, batch_size=16, k=k, steps=8, keys=("id", "v"))


def test_fixed_blocks_for_in_memory_data_and_a_full_shuffle_state_is_refused():
    src = jl.ArraySource({"x": np.arange(5000)})
    local = jl.DataLoader(src, batch_size=100, shuffle=jl.LocalShuffle(window=2, block_size=50),
                          process_index=0, process_count=1)
    batch = next(iter(local))["x"]
    assert len(np.unique(batch // 50)) == 2  # one window: two blocks of 50
    full = jl.DataLoader(src, batch_size=100, shuffle=True, process_index=0, process_count=1)
    with pytest.raises(jl.StateDictError, match=r"local_shuffle.*window 2, blocks 50"):
        full.load_state_dict(local.state_dict())
    with pytest.raises(jl.StateDictError, match="local_shuffle"):
        local.load_state_dict(full.state_dict())
    # a mixture reads each component locally (it was refused): its state names each one's
    mixed = jl.DataLoader(jl.mix([src, src], [1, 1]), batch_size=10, shuffle=jl.LocalShuffle(),
                          process_index=0, process_count=1)
    assert mixed.state_dict()["local_shuffle"] == ["window 8, blocks 1024"] * 2
    with pytest.raises(jl.ConfigError, match=r"LocalShuffle\(window\)"):
        jl.LocalShuffle(window=0)


class Blocks:
    """A source of 35 records that says where its blocks start."""

    def __init__(self, starts):
        self.block_starts = starts

    def __len__(self):
        return 35

    def __getitem__(self, i):
        return {"id": np.int64(i)}


@pytest.mark.parametrize("starts, said", [
    ([0, 10, 20, 30], r"the record count \(35\) last, got 0 first and 30 last"),
    ([0, 20, 10, 35], r"never decrease, got 20 then 10 at blocks 1 and 2"),
    ([0.0, 35.0], r"a 1-D array of ints of 2 or more, got float64"),
])
def test_a_sources_block_starts_are_checked(starts, said):
    # block_starts without the record count last: LocalShuffle read 35 records of which 30
    # distinct, records 30..34 never
    with pytest.raises(jl.ConfigError, match=r"Blocks\.block_starts: expected .*" + said):
        jl.DataLoader(Blocks(starts), batch_size=5, shuffle=jl.LocalShuffle(),
                      process_index=0, process_count=1)
    with jl.DataLoader(Blocks([0, 10, 20, 35]), batch_size=5, shuffle=jl.LocalShuffle(),
                       process_index=0, process_count=1) as loader:
        assert sorted(int(i) for b in loader for i in b["id"]) == list(range(35))


def test_a_state_over_a_sources_own_blocks_names_them_and_is_refused_over_others():
    # length buckets made anew with other edges over the same records, in the same order: a
    # restore was accepted and read other batches, 64 of 512 records never read that epoch
    # (the bucketing audit; the state said only "blocks the source's")
    records = [{"i": np.int64(i)} for i in range(512)]

    class Blocks:
        def __init__(self, starts):
            self.block_starts = np.array(starts)

        def __len__(self):
            return len(records)

        def __getitem__(self, i):
            return records[i]

    def make(starts):
        return jl.DataLoader(Blocks(starts), batch_size=32, shuffle=jl.LocalShuffle(window=1),
                             process_index=0, process_count=1)
    with make([0, 128, 256, 512]) as loader:
        next(iter(loader))
        state = loader.state_dict()
    assert state["local_shuffle"].startswith("window 1, blocks the source's (3 blocks, starts ")
    with pytest.raises(jl.StateDictError, match=r"state\['local_shuffle'\]: expected \"window 1, "
                                                r"blocks the source's \(2 blocks.*the source's "
                                                r"own blocks starting elsewhere"):
        make([0, 256, 512]).load_state_dict(state)
    older = {**state, "local_shuffle": "window 1, blocks the source's"}  # (before 2026-12-01:
    with make([0, 128, 256, 512]) as loader:  # restored as then)
        loader.load_state_dict(older)
        assert loader.step == 1


class _Counted:
    """``n`` records, each made from its index (no memory of them)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"id": np.int64(i)}


def test_blocks_past_what_an_order_can_hold_are_refused_naming_the_block_size(monkeypatch):
    # (2**40 records in blocks of 1,024: NumPy's bare "Unable to allocate 8.00 GiB" as the
    # loader was made, naming neither LocalShuffle nor block_size; the scale audit)
    from jaxloader.order import local_shuffle

    with pytest.raises(jl.ConfigError, match=r"LocalShuffle: 1,099,511,627,776 records in "
                       r"blocks of 1,024 are 1,073,741,824 blocks.*LocalShuffle\(window=4, "
                       r"block_size=8192\) or more"):
        jl.DataLoader(_Counted(2**40), batch_size=4, shuffle=jl.LocalShuffle(window=4))
    monkeypatch.setattr(local_shuffle, "MAX_BLOCKS", 1000)  # (what it says is taken: here
    with pytest.raises(jl.ConfigError, match=r"block_size=10000\) or more"):  # small)
        jl.DataLoader(_Counted(10**7), batch_size=4, shuffle=jl.LocalShuffle(window=4))
    with jl.DataLoader(_Counted(10**7), batch_size=4, shuffle=jl.LocalShuffle(
            window=4, block_size=10_000)) as loader:
        assert len(next(iter(loader))["id"]) == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_the_last_epoch_gives_its_batches_then_the_step_past_it_is_refused(workers):
    # (with workers, the step past the last epoch raised as its failure was described, at
    # once: the valid batches before it were lost, as many as the workers had made; the
    # scale audit)
    with jl.DataLoader(np.arange(8), batch_size=8, num_epochs=None,
                       num_workers=workers) as loader:
        loader.load_state_dict({**loader.state_dict(), "step": 2**24 - 3})
        batches = iter(loader)
        assert [len(next(batches)) for _ in range(3)] == [8, 8, 8]
        with pytest.raises(jl.JaxloaderError, match=r"step 16,777,216"):
            next(batches)


def test_a_few_blocks_are_permuted_uniformly():
    # the block order was the Feistel network's over 1-2-bit halves: of 5 blocks, some orders
    # came 742 times in 60,000 epochs and others 347 (chi-square ~1,960 on 119 degrees of
    # freedom); of 16 blocks, no odd permutation ever (the read-local audit)
    import itertools

    orders = {p: i for i, p in enumerate(itertools.permutations(range(5)))}
    counts = np.zeros(len(orders))
    starts = np.arange(0, 6) * 10
    for epoch in range(12_000):
        counts[orders[tuple(BlockOrder(starts, window=1, seed=3, epoch=epoch)._order.tolist())]] += 1
    chi2 = ((counts - 100) ** 2 / 100).sum()
    assert chi2 < 190, chi2  # (119 degrees of freedom: p = 1e-5 at 190)
    parity = {int(np.linalg.det(np.eye(16)[BlockOrder(np.arange(17), window=1, seed=s,
                                                       epoch=0)._order]).round())
              for s in range(40)}
    assert parity == {-1, 1}


def test_a_read_local_state_of_the_order_before_restores_at_an_epochs_start_only():
    src = jl.ArraySource({"x": np.arange(3000)})

    def loader(shuffle=jl.LocalShuffle(window=2, block_size=100)):
        return jl.DataLoader(src, batch_size=100, shuffle=shuffle, process_index=0,
                             process_count=1)

    state = loader().state_dict()
    assert state.pop("exact_shuffle") is True  # (as written before 2026-12-03)
    with pytest.warns(jl.JaxloaderWarning, match=r"shuffle of its blocks read locally \(up to "
                                                 r"4,096\) was not uniform; the epochs from 1"):
        loader().load_state_dict({**state, "step": 30})
    with pytest.raises(jl.StateDictError, match=r"5 steps into epoch 1, by a jaxloader before "
                                                r"2026-12-03.*state\['step'\] = 30\)"):
        loader().load_state_dict({**state, "step": 35})
    # this version's read-local state into a full shuffle: told so (was told it came from a
    # jaxloader before 2026-12-03, to restore it with that one)
    local = loader()
    it = iter(local)
    next(it)
    with pytest.raises(jl.StateDictError, match=r"local_shuffle.*window 2, blocks 100.*same "
                                                r"shuffle="):
        loader(shuffle=True).load_state_dict(local.state_dict())
    # a mixture's component read locally: refused past step 0
    mixed = jl.DataLoader(jl.mix([src, src], [1, 1]), batch_size=10, shuffle=jl.LocalShuffle(
        window=2, block_size=100), process_index=0, process_count=1)
    saved = mixed.state_dict()
    assert saved.pop("exact_shuffle") is True
    with pytest.raises(jl.StateDictError, match=r"component of up to 4,096 records \(or blocks "
                                                r"read locally\) was not uniform"):
        mixed.load_state_dict({**saved, "step": 3})
