"""SharedBlocks: a row group decoded once across workers; stale slots, dead decoders, memory
that runs out and too many open files never give wrong rows, a hang or a leak."""

from __future__ import annotations

import errno
import gc
import io
import os
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sources import shared_blocks
from jaxloader.sources.shared_blocks import SharedBlocks
from jaxloader.runtime import worker_info
from jaxloader.runtime import shm
from jaxloader.runtime.descriptors import descriptor_share
from resume_harness import assert_same_batch
from sources.test_parquet import write_parts

pa = pytest.importorskip("pyarrow")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not shm.MEMFD_AVAILABLE, reason="shared blocks are memory files (Linux)"),
]


class _Counting(jl.ParquetSource):
    """Notes each row group it decodes from its file, by process, in ``self.log``."""

    def _read(self, group):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {group}\n")
        return super()._read(group)


@pytest.mark.parametrize("share", [True, False])
def test_each_row_group_is_decoded_once_across_workers(tmp_path, share):
    paths = write_parts(tmp_path, rows=(400, 300, 324), group=64)
    src = _Counting(paths, share_decoded=share)
    src.log = str(tmp_path / "decodes.log")
    with jl.DataLoader(src, batch_size=32, shuffle=jl.LocalShuffle(window=4), seed=3,
                       num_workers=2, process_index=0, process_count=1) as loader:
        batches = list(loader)
        pids = set(map(str, loader.worker_pids))
    with jl.DataLoader(jl.ParquetSource(paths), batch_size=32, shuffle=jl.LocalShuffle(window=4),
                       seed=3, num_workers=0, process_index=0, process_count=1) as loader:
        for a, b in zip(batches, loader, strict=True):
            assert_same_batch(a, b)
    lines = [line.split() for line in open(src.log).read().splitlines()]
    decoders = {pid for pid, _ in lines}  # workers only; with sharing, maybe one did it all
    assert decoders == pids if not share else decoders <= pids
    counts = np.bincount([int(group) for _, group in lines], minlength=src.num_row_groups)
    # each worker reads every row group of a window: decoded twice unless shared
    assert counts.tolist() == [1 if share else 2] * src.num_row_groups


@pytest.fixture
def as_worker(tmp_path, monkeypatch):
    """A source of 32 row groups of 16 rows, as a worker of two sees it, with a cache of a few
    row groups; its decodes logged."""
    src = _Counting(write_parts(tmp_path, rows=(512,), group=16), cache_bytes=8 << 10)
    src.log = str(tmp_path / "decodes.log")
    copy = pickle.loads(pickle.dumps(src))  # the table is made here, as for workers
    monkeypatch.setattr(worker_info, "_INFO", worker_info.WorkerInfo(0, 2, 0))
    yield copy
    copy._shared.close()
    copy._reset_process_state()  # its cached row groups map memory files (and, before 3.13,
    gc.collect()  # each mapping holds a descriptor): gone before the check for leftovers


def _decodes(src):
    return [int(line.split()[1]) for line in open(src.log).read().splitlines()]


def test_fetching_ahead_stops_at_half_the_cache(as_worker):
    # what a batch fetches ahead must still be cached when the batch reads it: fetching more
    # would evict the first before their turn, and they would be decoded twice
    as_worker._fetch_free(list(range(32)))
    fetched = _decodes(as_worker)
    assert 1 < len(fetched) < 32 and set(fetched) <= set(as_worker._cache)
    assert sum(as_worker._sizes[g] for g in as_worker._cache) <= as_worker.cache_bytes


def test_a_batch_from_more_row_groups_than_the_cache_holds_decodes_privately(as_worker):
    # a full shuffle of a large file: publishing would cost a third of a decode for nothing
    spread = np.arange(0, 512, 4)  # every row group
    assert as_worker.__getitems__(spread)["id"].tolist() == spread.tolist()
    assert as_worker._sharing() and not as_worker._shared._owned
    local = np.arange(32, 64)  # two row groups: shared
    assert as_worker.__getitems__(local)["id"].tolist() == local.tolist()
    assert sorted(as_worker._shared._owned) == [2, 3]


def _table(block):
    return pa.table({"block": np.full(1000, block, np.int64), "text": [f"b{block}"] * 1000})


@pytest.fixture
def table():
    segment = SharedBlocks.create(8)
    yield segment
    segment.destroy()


def test_a_block_comes_from_shared_memory_and_is_decoded_once(table):
    blocks, calls = SharedBlocks(table.name, 8), []

    def decode(block):
        calls.append(block)
        return _table(block)

    other = SharedBlocks(table.name, 8)  # as another worker sees the table
    first = blocks.get(5, lambda: decode(5))
    again = other.get(5, lambda: decode(5))  # published: mapped, not decoded
    assert calls == [5] and first.equals(_table(5)) and again.equals(_table(5))
    blocks.close(), other.close()


def test_a_stale_slot_is_never_read_as_another_block(table):
    blocks, calls = SharedBlocks(table.name, 8), []

    def decode(block):
        calls.append(block)
        return _table(block)

    for block in (0, 1, 0, 2, 0):  # released each time: the next file may reuse its numbers
        assert blocks.get(block, lambda: decode(block)).column("block")[0].as_py() == block
        blocks.release(block)
    assert calls == [0, 1, 0, 2, 0]
    blocks.close()


@pytest.mark.parametrize("short", ["stream", "header"])
def test_short_memory_decodes_privately_and_publishes_nothing(table, monkeypatch, short):
    # a block's file is written, not reserved: the write that finds no memory (ENOSPC from
    # the stream's write or the header's) leaves the decode private, the file closed
    def refuse(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    class Full(io.RawIOBase):  # a memory file with no room left
        def writable(self):
            return True

        write = refuse

    if short == "stream":
        monkeypatch.setattr(shared_blocks, "open", lambda *a, **k: io.BufferedWriter(Full()),
                            raising=False)
    else:
        monkeypatch.setattr(shared_blocks.os, "pwrite", refuse)
    blocks = SharedBlocks(table.name, 8)
    assert blocks.get(3, lambda: _table(3)).equals(_table(3))
    assert not blocks._slots.any() and not blocks._owned
    blocks.close()


def test_a_worker_holds_at_most_an_eighth_of_its_descriptor_limit(monkeypatch):
    # 256 files whatever the limit: at 128, a worker held 149 and failed to open a Parquet file
    import resource

    each = 1 if sys.version_info >= (3, 13) else 2  # (a mapping's own descriptor before)
    for limit, most in ((128, 16 // each), (1024, 128 // each), (20_000, 256), (16, 4)):
        monkeypatch.setattr(resource, "getrlimit", lambda _, limit=limit: (limit, 1 << 20))
        assert shared_blocks.max_owned() == most


def test_before_python_313_the_blocks_mapped_at_once_stay_within_the_descriptor_limit(
        table, monkeypatch):
    # each mapping holds a descriptor there: a worker's cache of small row groups held 227 at a
    # limit of 256, and ran out as it mapped a slot; past max_owned a block stays private
    import resource

    monkeypatch.setattr(shared_blocks, "_UNTRACKED", {})  # (as Python 3.11 and 3.12 map)
    monkeypatch.setattr(shared_blocks, "_WARNED", [])
    monkeypatch.setattr(resource, "getrlimit", lambda _: (64, 1 << 20))  # max_owned: 4
    gc.collect()
    blocks, other = SharedBlocks(table.name, 8), SharedBlocks(table.name, 8)
    with pytest.warns(jl.PerformanceWarning, match=r"maps 4 shared row groups, a sixteenth "
                                                   r"of its descriptor limit, 64,.*raise the "
                                                   r"limit") as warned:
        kept = [blocks.get(block, lambda block=block: _table(block)) for block in range(6)]
    assert len(warned) == 1  # once a process, where the first block found no room
    assert len(shared_blocks._MAPPINGS) == 4 and sorted(blocks._owned) == [0, 1, 2, 3]
    assert [t.equals(_table(b)) for b, t in enumerate(kept)] == [True] * 6
    calls = []
    got = other.get(1, lambda: calls.append(1) or _table(1))  # no room: decoded here
    assert calls == [1] and got.equals(_table(1)) and len(shared_blocks._MAPPINGS) == 4
    del kept, got
    gc.collect()  # the tables let go: room again
    assert other.get(2, lambda: calls.append(2) or _table(2)).equals(_table(2)) and calls == [1]
    blocks.close(), other.close()


def test_the_budgets_warning_names_what_bounds_it(monkeypatch):
    import resource

    for limit, said in ((1024, r"maps 64 .*a sixteenth of its descriptor limit, 1,024.*raise"),
                        (1 << 16, r"maps 256 .*the most a process maps at once \(256\); "
                                  r"the others .*does: read fewer"),
                        (resource.RLIM_INFINITY, r"maps 256 .*at once \(256\)")):
        monkeypatch.setattr(resource, "getrlimit", lambda _, limit=limit: (limit, limit))
        most = descriptor_share(8, shared_blocks.MAX_OWNED, False)  # (as before 3.13)
        assert re.search(said, shared_blocks._budget_said(most)), (limit, most)


def test_a_worker_holds_at_most_max_owned_files(table, monkeypatch):
    monkeypatch.setattr(shared_blocks, "MAX_OWNED", 2)
    blocks = SharedBlocks(table.name, 8)
    for block in range(5):
        blocks.get(block, lambda: _table(block))
    assert sorted(blocks._owned) == [3, 4]
    calls = []
    other = SharedBlocks(table.name, 8)
    other.get(0, lambda: calls.append(0) or _table(0))  # let go: decoded again
    other.get(4, lambda: calls.append(4) or _table(4))  # still held: mapped
    assert calls == [0]
    blocks.close(), other.close()


_HOLDER = textwrap.dedent("""
    import sys, time
    from jaxloader.sources.shared_blocks import SharedBlocks
    blocks = SharedBlocks(sys.argv[1], 8)
    def decode():
        print("decoding", flush=True)
        time.sleep(600)
    blocks.get(3, decode)
""")


def test_a_decoder_killed_mid_decode_neither_hangs_nor_misleads_the_others(table):
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, table.name],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "decoding\n"  # it holds block 3's lock
        blocks = SharedBlocks(table.name, 8)
        assert blocks.get(3, lambda: _table(3), wait=False) is None  # being decoded
        assert blocks.get(4, lambda: _table(4), wait=False).equals(_table(4))
    finally:
        holder.kill()
        holder.wait()
    # the kernel dropped the dead holder's lock: a wait ends, and this process decodes it
    assert blocks.get(3, lambda: _table(3)).equals(_table(3))
    blocks.close()


def _memory_files(pid):
    """The memory files ``pid`` holds open (an mmap may hold a second descriptor of one)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"/memfd:{shm.PREFIX}"):
            found.add(target)
    return found


def test_no_memory_file_outlives_the_loader_or_the_source(tmp_path):
    before = len(_memory_files(os.getpid()))
    src = jl.ParquetSource(write_parts(tmp_path, rows=(300,), group=50))
    with jl.DataLoader(src, batch_size=32, shuffle=jl.LocalShuffle(window=2), num_workers=2,
                       process_index=0, process_count=1) as loader:
        next(iter(loader))
        held = set().union(*(_memory_files(pid) for pid in loader.worker_pids))
        assert any(f"{shm.PREFIX}_block_" in name for name in held)  # what workers decoded
    # the loader's close() let the table go too (a later loader over src makes another)
    assert len(_memory_files(os.getpid())) == before
    with jl.DataLoader(src, batch_size=32, num_workers=2, process_index=0,
                       process_count=1) as loader:
        next(iter(loader))
        held = set().union(*(_memory_files(pid) for pid in loader.worker_pids))
        assert any(f"{shm.PREFIX}_block_" in name for name in held)  # shared through a new table
    assert len(_memory_files(os.getpid())) == before
    del src, loader
    gc.collect()
    assert len(_memory_files(os.getpid())) == before


def test_a_lone_worker_decodes_for_itself(tmp_path, monkeypatch):
    src = jl.ParquetSource(write_parts(tmp_path))
    copy = pickle.loads(pickle.dumps(src))
    monkeypatch.setattr(worker_info, "_INFO", worker_info.WorkerInfo(0, 1, 0))  # no other to share with
    assert copy[60]["id"] == 60 and not copy._sharing()


def test_a_worker_started_alone_under_auto_shares_with_those_added_later(tmp_path, monkeypatch):
    # num_workers="auto" starts one worker, told 1 in use, and adds others: that first worker
    # decoded every row group again, with a cache of its own, for the loader's life (the
    # tuning audit); it shares where its pool may run more than one
    src = jl.ParquetSource(write_parts(tmp_path))
    copy = pickle.loads(pickle.dumps(src))
    monkeypatch.setattr(worker_info, "_INFO", worker_info.WorkerInfo(0, 1, 0))
    monkeypatch.setattr(worker_info, "_CAPACITY", 4)
    assert copy[60]["id"] == 60 and copy._sharing()
    copy._shared.close()
    copy._reset_process_state()
    gc.collect()


def test_tables_share_one_file_and_a_worker_holds_max_owned_files_of_all_of_them(monkeypatch):
    # a table a memory file, and max_owned files a table: a mixture of hundreds of one-file
    # sources held a descriptor a source in the main process and hundreds in each worker
    from jaxloader.sources import block_tables

    monkeypatch.setattr(shared_blocks, "MAX_OWNED", 3)
    leases = [SharedBlocks.create(2) for _ in range(4)]
    assert len({lease.name.split("@")[0] for lease in leases}) == 1  # (one file)
    views = [SharedBlocks(lease.name, 2) for lease in leases]
    assert len({view._fd for view in views}) == 1  # (one descriptor of it in this process)
    for i, view in enumerate(views):
        view.get(1, lambda i=i: _table(i))
    assert sum(len(view._owned) for view in views) == 3 and not views[0]._owned  # (oldest)
    other = SharedBlocks(leases[3].name, 2)  # a block of the last table, not another's slot
    assert other.get(1, lambda: _table(99)).equals(_table(3))
    for view in [*views, other]:
        view.close()
    assert not block_tables._OPENED
    assert [lease.destroy() for lease in leases] == [True] * 4 and not block_tables._FILES


def test_a_worker_holds_a_budget_of_open_files_for_every_source_together(monkeypatch):
    from jaxloader.sources import open_files

    closed: list = []
    sources = [open_files.OpenFiles(8, close=closed.append) for _ in range(3)]
    monkeypatch.setattr(open_files, "worker_budget", lambda: 4)
    sources[0].add("a", "a0")  # (the training process: each source's own limit alone)
    monkeypatch.setattr(open_files, "get_worker_info", lambda: object())  # (a worker)
    for name in "bc":
        for i, files in enumerate(sources):
            files.add(name, f"{name}{i}")
    assert closed == ["b0", "b1"] and sources[0].get("a") == "a0"  # (not counted, kept)
    assert sources[2].get("b") == "b2"  # (now the most recently used)
    sources[0].add("d", "d0")
    assert closed == ["b0", "b1", "c0"]
    for files in sources:
        files.close()
    assert not open_files._EVERY


_MANY_SOURCES = textwrap.dedent("""
    import os, resource, sys
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    import jaxloader as jl
    sources = []
    for i in range(600):
        path = os.path.join(sys.argv[1], f"{i}.parquet")
        pq.write_table(pa.table({"x": np.arange(8) + i * 8}), path)
        sources.append(jl.ParquetSource(path))
    with jl.DataLoader(jl.mix(sources, [1.0] * 600), batch_size=48, num_workers=2,
                       process_index=0, process_count=1) as loader:
        got = np.concatenate([b["x"] for b in loader])
    print(len(got), int(got.min()) >= 0, int(got.max()) < 4800)
""")


def test_a_mixture_of_600_one_file_sources_reads_under_a_limit_of_1024_descriptors(tmp_path):
    done = subprocess.run([sys.executable, "-c", _MANY_SOURCES, str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["4800", "True", "True"]  # (it ran out of descriptors)


def test_a_lease_let_go_by_a_collection_inside_another_lease_waits_on_nothing(monkeypatch):
    # a source's finalizer lets its lease go; a collection ran it inside lease() (an allocation
    # there), which held the lock destroy() took: a hang for good
    import threading

    from jaxloader.sources import block_tables

    first, made, got = block_tables.lease(2), block_tables._File.__init__, []

    def collected(self, slots):
        first.destroy()
        made(self, slots)

    monkeypatch.setattr(block_tables._File, "__init__", collected)
    thread = threading.Thread(target=lambda: got.append(block_tables.lease(1 << 16)),
                              daemon=True)  # (more than a file holds: a new one)
    thread.start()
    thread.join(20)
    assert not thread.is_alive() and len(got) == 1
    monkeypatch.undo()
    a = block_tables.lease(3)
    big = block_tables.lease(1 << 16)
    c = block_tables.lease(3)  # (a file with room is filled, not only the last made: small
    assert c.name.split("@") == [a.name.split("@")[0], "3"]  # ones after a big one had one each)
    assert all(lease.destroy() for lease in (got[0], a, big, c)) and not block_tables._FILES
