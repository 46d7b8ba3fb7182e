"""ParquetSource: rows of several files, decoded by row group, exact resume, clear errors."""

from __future__ import annotations

import errno
import itertools
import os
import warnings
import zlib

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.batching import collate
from resume_harness import assert_same_batch, check_resume, check_split_resume, take

pa = pytest.importorskip("pyarrow")  # in the test extra; ParquetSource's optional dependency
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.timeout(180)


def write_parts(directory, rows=(50, 37, 41), group=16):
    """Parquet files of an int64 id, a float32[16] vector and a short string; small row
    groups, so that batches cross groups and files."""
    paths, start = [], 0
    for k, n in enumerate(rows):
        ids = np.arange(start, start + n, dtype=np.int64)
        vectors = (ids[:, None] * 100 + np.arange(16)).astype(np.float32)
        table = pa.table({
            "id": ids,
            "vector": pa.array(list(vectors), type=pa.list_(pa.float32(), 16)),
            "text": [f"row-{i}" + "x" * (i % 5) for i in ids],
        })
        paths.append(str(directory / f"part-{k}.parquet"))
        pq.write_table(table, paths[-1], row_group_size=group)
        start += n
    return paths


def test_rows_in_order_with_numpy_leaves_and_strings(tmp_path):
    src = jl.ParquetSource(write_parts(tmp_path))
    assert len(src) == 128 and src.num_row_groups == 4 + 3 + 3
    row = src[60]  # second file
    assert row["id"] == 60 and row["id"].dtype == np.int64
    assert row["vector"].dtype == np.float32 and row["vector"].tolist() == list(
        np.arange(6000, 6016, dtype=np.float32))
    assert row["text"] == "row-60" and type(row["text"]) is str
    batch = src.__getitems__(np.array([127, 3, 60, 4, 90]))
    assert batch["id"].tolist() == [127, 3, 60, 4, 90] and batch["vector"].shape == (5, 16)
    assert batch["text"].tolist() == [src[i]["text"] for i in (127, 3, 60, 4, 90)]
    empty = src.__getitems__(np.array([], dtype=np.int64))  # no rows: columns of none
    assert {k: (v.shape, v.dtype) for k, v in empty.items()} == {
        "id": ((0,), np.int64), "vector": ((0, 16), np.float32), "text": ((0,), object)}


def test_a_row_group_of_empty_lists_reads_as_its_type_says(tmp_path):
    # a row group whose molecules all have no edges: a list of fixed-size lists raised a bare
    # TypeError (no offsets), a list of lists gave (0,) object arrays, which Pad refused and
    # a batch took as objects (the graph audit)
    import pyarrow as pa
    import pyarrow.parquet as pq

    for kind, shape in [(pa.list_(pa.list_(pa.int32(), 2)), (0, 2)),
                        (pa.list_(pa.list_(pa.int32())), (0, 0))]:
        path = tmp_path / "edges.parquet"
        pq.write_table(pa.table({"e": pa.array([[[1, 2]], [], [], []], kind)}), path,
                       row_group_size=2)
        source = jl.ParquetSource(path)
        assert source[2]["e"].shape == shape and source[2]["e"].dtype == np.int32
        with jl.DataLoader(source, batch_size=4, transforms=[jl.Pad("e")]) as loader:
            batch = next(iter(loader))
        assert batch["e"].shape == (4, 1, 2) and batch["e_length"].tolist() == [1, 0, 0, 0]
        assert batch["e"][0].tolist() == [[1, 2]] and batch["e"].dtype == np.int32


def test_spark_int96_times_are_read_in_nanoseconds_or_refused_where_they_wrap(tmp_path):
    # pyarrow reads INT96 (Spark's default) as nanoseconds, wrapping a warehouse's 9999-12-31
    # to 1816-03-29 and 1500-01-01 to 2084, silently (the recsys audit)
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    def written(times):
        path = tmp_path / f"t{len(times)}.parquet"
        pq.write_table(pa.table({"t": pa.array(times, pa.timestamp("us"))}), path,
                       use_deprecated_int96_timestamps=True)
        return jl.ParquetSource(path)

    kept = written([datetime.datetime(2024, 1, 1, 12), datetime.datetime(1970, 1, 2)])
    assert kept[0]["t"] == np.datetime64("2024-01-01T12:00", "ns")
    exact = tmp_path / "ns.parquet"  # (nanoseconds, as Impala writes them: all their digits)
    pq.write_table(pa.table({"t": pa.array([1_625_054_401_123_456_789], pa.timestamp("ns"))}),
                   exact, use_deprecated_int96_timestamps=True)
    assert jl.ParquetSource(exact)[0]["t"] == np.datetime64(1_625_054_401_123_456_789, "ns")
    assert kept.__getitems__(np.array([1]))["t"].dtype == np.dtype("M8[ns]")
    far = written([datetime.datetime(2024, 1, 1), datetime.datetime(9999, 12, 31),
                   datetime.datetime(1500, 1, 1)])
    with pytest.raises(jl.RecordError, match=r"column 't' of .*t3.parquet', row group 0, holds "
                                             r"INT96 times .* from 1500-01-01 .* to 9999-12-31.*"
                                             r"TIMESTAMP_MICROS"):
        far[0]
    # inside a struct and a list too, of the footer's type (a file of TIMESTAMP(NANOS) beside
    # it batches with it; they were left in microseconds: the seventh review)
    when = pa.struct([("when", pa.timestamp("us")), ("k", pa.int64())])
    day = datetime.datetime(2020, 1, 1)
    table = pa.table({"s": pa.array([{"when": day, "k": 1}], when),
                      "l": pa.array([[day, day]], pa.list_(pa.timestamp("us")))})
    pq.write_table(table, tmp_path / "n.parquet", use_deprecated_int96_timestamps=True)
    nested = jl.ParquetSource(tmp_path / "n.parquet")[0]
    assert nested["s"]["when"] == np.datetime64(day, "ns") and nested["l"].dtype == "M8[ns]"
    pq.write_table(pa.table({"event.time": pa.array([day], pa.timestamp("us"))}),  # (a name
                   tmp_path / "d.parquet", use_deprecated_int96_timestamps=True)  # with a dot)
    assert jl.ParquetSource(tmp_path / "d.parquet")[0]["event.time"] == np.datetime64(day, "ns")
    pq.write_table(pa.table({"s": pa.array([{"when": datetime.datetime(9999, 1, 1), "k": 1}],
                                           when)}), tmp_path / "f.parquet",
                   use_deprecated_int96_timestamps=True)
    with pytest.raises(jl.RecordError, match=r"column 's' .* holds INT96 times .* before 1677"):
        jl.ParquetSource(tmp_path / "f.parquet")[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loader_reads_every_row_once_an_epoch_vectorised_or_per_record(tmp_path,
                                                                           num_workers):
    paths = write_parts(tmp_path)

    def epoch(transforms):
        with jl.DataLoader(jl.ParquetSource(paths), batch_size=16, shuffle=True, seed=4,
                           transforms=transforms, num_workers=num_workers, process_index=0,
                           process_count=1) as loader:
            return list(loader)

    vectorised, per_record = epoch([]), epoch([jl.Map(lambda r: r)])
    for a, b in zip(vectorised, per_record):
        assert_same_batch(a, b)
    ids = np.concatenate([b["id"] for b in vectorised])
    assert sorted(ids.tolist()) == list(range(128))
    for b in vectorised:
        assert np.array_equal(b["vector"][:, 0], b["id"].astype(np.float32) * 100)
        assert all(t.startswith(f"row-{i}") for t, i in zip(b["text"], b["id"]))


@pytest.mark.parametrize("k", [1, 9, 13])
def test_resume_over_three_files_into_other_worker_and_process_counts(tmp_path, k):
    paths = write_parts(tmp_path)

    def make(num_workers=0, batch_size=8, process_index=0, process_count=1):
        return lambda: jl.DataLoader(
            jl.ParquetSource(paths), batch_size=batch_size, shuffle=True, seed=1,
            num_workers=num_workers, transforms=[jl.RandomMap(_noisy)], last_batch="pad",
            process_index=process_index, process_count=process_count)

    check_resume(make(), total=20, k=k, make_restored=make(num_workers=2))
    # one process of batch 8 -> two processes of batch 4: the same global batches
    check_split_resume(make, batch_size=8, k=k, steps=20 - k, keys=("id", "vector", "mask"))


@pytest.mark.parametrize("k", [2, 11])
def test_a_mixture_of_parquet_files_read_locally_resumes_into_other_counts(tmp_path, k):
    # the harness: 3 Parquet sources mixed 0.5/0.3/0.2, each read locally (its row
    # groups permuted, rows shuffled within windows of 2), a weight change at step 6
    paths = write_parts(tmp_path, rows=(96, 64, 48))

    def make(num_workers=0, batch_size=8, process_index=0, process_count=1):
        return lambda: jl.DataLoader(
            jl.mix([jl.ParquetSource(p) for p in paths], [0.5, 0.3, 0.2],
                   from_step={6: [0.2, 0.2, 0.6]}),
            batch_size=batch_size, shuffle=jl.LocalShuffle(window=2), seed=4,
            num_workers=num_workers, num_epochs=None, process_index=process_index,
            process_count=process_count)

    check_resume(make(), total=k + 12, k=k, make_restored=make(num_workers=2))
    check_split_resume(make, batch_size=8, k=k, steps=12, keys=("id", "vector"))
    with make()() as loader:  # each file's reads: whole row groups of 16, 2 at a time
        ids = np.concatenate([b["id"] for b in take(loader, 30)])
    for lo, hi in ((0, 96), (96, 160), (160, 208)):
        # its first 24 reads as the stream has them: among its reads 0-31 (a block of 8
        # positions permutes the reads it holds), its first window of 2 row groups
        mine = ids[(ids >= lo) & (ids < hi)]
        assert len(mine) >= 24 and len(set(((mine[:24] - lo) // 16).tolist())) <= 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_parquet_file_mixes_with_a_list_of_python_records(tmp_path, num_workers):
    # Parquet's numbers come as NumPy scalars, the list's as Python ones: alike in a batch
    path = write_parts(tmp_path, rows=(40,))[0]
    extra = [{"id": 1000 + i, "vector": np.full(16, i, np.float32), "text": f"extra {i}"}
             for i in range(10)]
    with jl.DataLoader(jl.mix([jl.ParquetSource(path), extra], [0.5, 0.5]), batch_size=10,
                       shuffle=True, num_workers=num_workers, process_index=0,
                       process_count=1) as loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
    ids = np.concatenate([b["id"] for b in batches])
    assert batches[0]["id"].dtype == np.int64 and batches[0]["text"].dtype == object
    assert (ids < 1000).any() and (ids >= 1000).any() and len(ids) == 50


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_parquet_file_mixes_with_an_array_sources_fixed_width_strings(tmp_path, num_workers):
    # Parquet's strings are Python ones, an ArraySource's fixed width (<U): a batch holding
    # both has Python strings (it was refused: "object() in one, <U9() in another")
    path = write_parts(tmp_path, rows=(40,))[0]
    ids = np.arange(1000, 1030)
    arrays = jl.ArraySource({"id": ids, "vector": np.zeros((30, 16), np.float32),
                             "text": np.asarray([f"array {i}" for i in ids])})
    with jl.DataLoader(jl.mix([jl.ParquetSource(path), arrays], [0.5, 0.5]), batch_size=10,
                       shuffle=True, num_workers=num_workers, process_index=0,
                       process_count=1) as loader:
        batches = list(loader)
    for batch in batches:
        both = (batch["id"] < 1000).any() and (batch["id"] >= 1000).any()
        assert batch["text"].dtype == object or not both
        assert [str(t) for t in batch["text"]] == [
            f"array {i}" if i >= 1000 else f"row-{i}" + "x" * (i % 5) for i in batch["id"]]
    assert sum((b["id"] < 1000).any() and (b["id"] >= 1000).any() for b in batches) > 1


def test_concatenated_files_keep_their_row_groups_as_blocks(tmp_path):
    # LocalShuffle over a ConcatSource of files (and arrays): each part's own blocks, placed
    # where the part starts (it cut blocks of 1,024 records across the parts)
    paths = write_parts(tmp_path, rows=(50, 37))  # row groups of 16: 0 16 32 48 | 50 66 82
    files = [jl.ParquetSource(p) for p in paths]
    both = jl.ConcatSource([files[0], jl.ArraySource({"id": np.arange(2500)}), files[1]])
    assert both.block_starts.tolist() == [0, 16, 32, 48, 50, 1074, 2098, 2550, 2566, 2582, 2587]
    assert jl.ConcatSource([jl.ArraySource({"x": np.arange(3)})] * 2).block_starts is None
    local = jl.LocalShuffle(window=1)
    assert local.describe(jl.ConcatSource(files)).startswith("window 1, blocks the source's (7 ")
    with jl.DataLoader(jl.ConcatSource(files), batch_size=16, shuffle=local, last_batch="pad",
                       process_index=0, process_count=1) as loader:
        ids = np.concatenate([b["id"][b["mask"]] for b in loader])
    assert sorted(ids.tolist()) == list(range(87))
    # a window of one block: each row group's rows one run of the epoch (7 runs, 7 groups)
    group = np.searchsorted([0, 16, 32, 48, 50, 66, 82, 87], ids, side="right")
    assert (np.diff(group) != 0).sum() == 6


def _noisy(record, rng):
    return {**record, "vector": record["vector"] + rng.normal(size=16).astype(np.float32)}


def test_the_cache_stays_within_its_bound(tmp_path):
    src = jl.ParquetSource(write_parts(tmp_path, rows=(400,), group=50), cache_bytes=8 << 10)
    for i in range(0, 400, 7):
        src[i]
        assert sum(_sizes(src)) <= max(8 << 10, max(_sizes(src)))
    assert len(src._cache) < src.num_row_groups


def test_an_interrupt_at_any_line_of_caching_a_row_group_leaves_the_cache_sound(tmp_path):
    """Without workers the main process reads row groups, and a Ctrl-C may land anywhere in
    that. Raised at each line of caching one in turn, the reads after it give the right rows
    and the cache keeps its bound: a row group cached before its size was noted used to stop
    every later eviction with a KeyError, and a count of bytes cut short drifted for good."""
    from line_interrupts import raised_at_line

    paths = write_parts(tmp_path, rows=(400,), group=50)
    bound = 8 << 10
    raised = 0
    for n in range(1, 40):
        src = jl.ParquetSource(paths, cache_bytes=bound)
        for i in range(0, 200, 13):
            src[i]
        raised += raised_at_line(n, [type(src)._fetch], lambda: src[390])
        for i in [*range(0, 400, 7), *range(399, 0, -11)]:
            assert src[i]["id"] == i, f"interrupted at line {n}"
            assert sum(_sizes(src)) <= max(bound, max(_sizes(src))), f"interrupted at line {n}"
    assert raised > 10


def test_the_cache_holds_a_bounded_number_of_row_groups(tmp_path, monkeypatch):
    # each shared row group a worker maps may hold a descriptor: their count is bounded too
    monkeypatch.setattr("jaxloader.sources.parquet._MAX_CACHED_GROUPS", 3)
    src = jl.ParquetSource(write_parts(tmp_path, rows=(400,), group=50))
    for i in range(0, 400, 7):
        assert src[i]["id"] == i and len(src._cache) <= 3
    assert len(src._cache) == 3


def _sizes(src):
    from jaxloader.sources.arrow_columns import nbytes_of

    return [sum(nbytes_of(c) for c in group.values()) for group in src._cache.values()]


def test_ragged_lists_become_one_array_per_row(tmp_path):
    path = str(tmp_path / "ragged.parquet")
    pq.write_table(pa.table({"tokens": [[1, 2, 3], [4], [5, 6]]}), path)
    src = jl.ParquetSource(path)
    assert [src[i]["tokens"].tolist() for i in range(3)] == [[1, 2, 3], [4], [5, 6]]
    rows = src.__getitems__(np.array([2, 0]))
    assert isinstance(rows, list) and rows[1]["tokens"].tolist() == [1, 2, 3]


def test_strings_bytes_and_lists_come_from_arrows_buffers_row_by_row(tmp_path):
    # rows are made from the offsets and bytes of each row group (no Arrow call): check them
    # against Arrow's own conversion, over row groups, in and out of file order
    n = 23
    texts = ["", "é", "naïve ✓ 🙂", *(f"row {i}" * (i % 4) for i in range(n - 3))]
    table = pa.table({
        "text": pa.array(texts, pa.string()),
        "big": pa.array(texts, pa.large_string()),
        "raw": pa.array([t.encode() + b"\0" for t in texts], pa.binary()),
        "tokens": pa.array([[i] * (i % 3) for i in range(n)], pa.list_(pa.int32())),
        "pairs": pa.array([[i, -i] for i in range(n)], pa.large_list(pa.int64())),
    })
    path = str(tmp_path / "kinds.parquet")
    pq.write_table(table, path, row_group_size=5)
    whole = str(tmp_path / "kinds-whole.parquet")  # runs longer than _FEW_ROWS: read apart
    pq.write_table(table, whole, row_group_size=n)
    src, expected = jl.ParquetSource(path), table.to_pylist()
    orders = (np.arange(n), np.random.default_rng(0).permutation(n))
    mixed = str(tmp_path / "kinds-mixed.parquet")  # a batch of a short run and a long one
    with pq.ParquetWriter(mixed, table.schema) as writer:  # row groups of 3 and 20 rows
        writer.write_table(table.slice(0, 3))
        writer.write_table(table.slice(3))
    sources = (src, jl.ParquetSource(whole), jl.ParquetSource(mixed))
    for src, order in itertools.product(sources, orders):
        rows = src.__getitems__(order)
        assert isinstance(rows, list)  # "tokens" is ragged
        for j, row in zip(order, rows):
            want = expected[j]
            assert row["text"] == row["big"] == want["text"] and row["raw"] == want["raw"]
            assert row["tokens"].tolist() == want["tokens"]
            assert row["tokens"].dtype == np.int32 and not row["tokens"].flags.writeable
            assert row["pairs"].tolist() == want["pairs"]  # equal lengths: kept per row
    # "pairs" is one (rows, 2) array a row group; a batch over groups where "tokens" is of one
    # length in one group and ragged in another gets rows of both
    even = str(tmp_path / "even.parquet")
    pq.write_table(pa.table({"t": pa.array([[1, 2], [3, 4], [5], [6, 7, 8]])}), even,
                   row_group_size=2)
    rows = jl.ParquetSource(even).__getitems__(np.array([2, 0, 3, 1]))
    assert [r["t"].tolist() for r in rows] == [[5], [1, 2], [6, 7, 8], [3, 4]]
    batch = jl.ParquetSource(path, columns=["text", "raw"]).__getitems__(np.array([3, 0, 1]))
    assert batch["text"].tolist() == [texts[3], "", "é"] and batch["raw"][1] == b"\0"


def test_lists_of_lists_of_one_length_become_one_axis_a_depth(tmp_path):
    # a list of 2 lists of 3 numbers a row: rows of shape (2, 3), in process and in workers;
    # inner lists of other lengths in one row group: that group's rows are arrays of arrays
    n = 10
    table = pa.table({
        "grid": pa.array([[[i, i + 1, i + 2], [-i, 0, i]] for i in range(n)],
                         pa.list_(pa.list_(pa.int32()))),
        "fixed": pa.array([[[float(i)] * 2] * 3 for i in range(n)],
                          pa.list_(pa.list_(pa.float32(), 2), 3)),
    })
    path = str(tmp_path / "grid.parquet")
    pq.write_table(table, path, row_group_size=4)
    src, order = jl.ParquetSource(path), np.array([9, 0, 5, 1, 2, 8, 3, 4, 7, 6])
    batch = src.__getitems__(order)
    assert batch["grid"].dtype == np.int32 and batch["grid"].shape == (n, 2, 3)
    assert batch["fixed"].dtype == np.float32 and batch["fixed"].shape == (n, 3, 2)
    assert batch["grid"].tolist() == [table.column("grid")[int(i)].as_py() for i in order]
    assert src[3]["fixed"].tolist() == [[3.0, 3.0]] * 3 and not src[3]["grid"].flags.writeable
    with jl.DataLoader(src, batch_size=5, shuffle=jl.LocalShuffle(window=2), num_workers=2,
                       process_index=0, process_count=1) as loader:
        got = list(loader)
    assert {b["grid"].shape for b in got} == {(5, 2, 3)}
    ragged_inner = str(tmp_path / "ragged-inner.parquet")
    pq.write_table(pa.table({"g": pa.array([[[1, 2], [3]], [[4], [5, 6]]])}), ragged_inner)
    rows = jl.ParquetSource(ragged_inner).__getitems__(np.array([1, 0]))
    assert [[x.tolist() for x in r["g"]] for r in rows] == [[[4], [5, 6]], [[1, 2], [3]]]


def test_a_pad_of_a_row_group_made_arrays_of_arrays_by_another_row_says_so(tmp_path):
    # (the detection audit: one box of 5 numbers among boxes of 4 makes every row of its row
    # group an array of arrays; a Pad's error named row 0, which held none, and said no more)
    boxes = [[[1, 2, 3, 4]] * 2, [[5, 6, 7, 8]], [[1, 2, 3, 4, 5]], [[1, 2, 3, 4]]]
    path = str(tmp_path / "boxes.parquet")
    pq.write_table(pa.table({"boxes": pa.array(boxes, pa.list_(pa.list_(pa.float32())))}), path)
    with pytest.raises(jl.CollateError, match=r"row 0\)'s 'boxes' is ndarray of shape \(2,\) "
                                              r".*np.stack\(list\(x\)\)\); it holds 2 arrays, "
                                              r"inner lists of lengths \[4, 4\]: a Parquet list "
                                              r"of lists .*another row of its row group differs"):
        list(jl.DataLoader(jl.ParquetSource(path), batch_size=2, process_index=0,
                           process_count=1, transforms=[jl.Pad("boxes")]))


@pytest.mark.parametrize("files", [[[10, 10, 10, 4]], [[10, 10], [10, 3]], [[10, 7], [10, 10]],
                                   [[5], [7]], [[6]], [[4, 4], [4, 4]]])
def test_a_rows_row_group_is_found_by_division_where_they_are_of_one_size(tmp_path, files):
    # row groups of one size but the last: a division; any other layout: a search; both the
    # same groups, and the same rows read
    paths = []
    for f, sizes in enumerate(files):
        path = str(tmp_path / f"part{f}.parquet")
        with pq.ParquetWriter(path, pa.schema([("id", pa.int64())])) as writer:
            start = sum(map(sum, files[:f]))
            for size in sizes:
                writer.write_table(pa.table({"id": np.arange(start, start + size)}))
                start += size
        paths.append(path)
    src = jl.ParquetSource(paths)
    rows = [r for sizes in files for r in sizes]
    uniform = all(r == rows[0] for r in rows[:-1]) and rows[-1] <= rows[0]
    assert bool(src._group_rows) == uniform
    indices = np.arange(len(src))
    assert np.array_equal(src._groups_of(indices),
                          src._starts.searchsorted(indices, side="right") - 1)
    assert src.__getitems__(indices[::-1])["id"].tolist() == indices[::-1].tolist()


def test_a_sliced_fixed_size_list_decodes_its_own_rows_only():
    # a row group's column as Arrow may hand it over: a slice, its values an offset into the
    # child (decoded by slicing the child, not by Arrow's flatten); nulls inside still refused
    from jaxloader.sources.arrow_columns import decode

    fixed = pa.array([[[i, -i]] * 3 for i in range(6)], pa.list_(pa.list_(pa.int64(), 2), 3))
    got = decode(pa.chunked_array([fixed.slice(2, 3)]), "fixed", "f.parquet", compact=True)
    assert got.shape == (3, 3, 2) and got[:, 0, 0].tolist() == [2, 3, 4]
    holed = pa.array([[1, None], [3, 4]], pa.list_(pa.int64(), 2))
    with pytest.raises(ValueError, match=r"column 'v' of 'f.parquet' has 1 null value\(s\) "
                                         "inside its lists"):
        decode(pa.chunked_array([holed]), "v", "f.parquet")


def test_a_null_in_a_map_column_is_refused_not_made_a_float_beside_none(tmp_path):
    # one null item in a row group turned each of its maps' integers into floats (2**53 + 1
    # read 2**53, in a row with no null) and the null into None, without a word
    path = str(tmp_path / "m.parquet")
    holed = pa.array([[("id", 2**53 + 1)], [("id", 7), ("x", None)]],
                     pa.map_(pa.string(), pa.int64()))
    pq.write_table(pa.table({"m": holed}), path)
    with pytest.raises(jl.ConfigError, match=r"column 'm' of '.*m.parquet' has 1 null "
                                             r"value\(s\) inside its lists"):
        jl.ParquetSource(path)[0]
    pq.write_table(pa.table({"m": pa.array([[("id", 2**53 + 1)], [("id", 7), ("x", 5)]],
                                           pa.map_(pa.string(), pa.int64()))}), path)
    assert jl.ParquetSource(path)[0]["m"].tolist() == [("id", 2**53 + 1)]
    from jaxloader.sources.arrow_columns import nested_nulls

    assert nested_nulls(holed.slice(0, 1)) == 0 and nested_nulls(holed.slice(1, 1)) == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_map_columns_row_is_one_leaf_of_its_pairs_with_a_map_or_without(tmp_path,
                                                                         num_workers):
    # a map's rows were Arrow's lists of (key, value) tuples: no Map, an object array of lists;
    # a Map returning the record, a pytree batched by entry position (keys made arrays), which
    # rows of other lengths refused. A row is now an object array of its (key, value) tuples
    # (dict(row) a dict, as of pyarrow's list), in a struct too, the batch the same either way
    rows = [[(f"k{i}", i), ("n", -i)] for i in range(6)]
    path = str(tmp_path / "maps.parquet")
    pq.write_table(pa.table({
        "m": pa.array(rows, pa.map_(pa.string(), pa.int64())),
        "s": pa.array([{"m": r[:1]} for r in rows], pa.struct([("m", pa.map_(pa.string(),
                                                                            pa.int64()))]))}),
        path, row_group_size=4)
    src = jl.ParquetSource(path)
    assert src[4]["m"].tolist() == [("k4", 4), ("n", -4)] and dict(src[4]["m"])["n"] == -4
    assert src[4]["s"]["m"].tolist() == [("k4", 4)]
    batches = []
    for transforms in ([], [jl.Map(lambda r: r)]):
        with jl.DataLoader(src, batch_size=3, transforms=transforms,
                           num_workers=num_workers) as loader:
            batches.append(list(loader))
    for plain, mapped in zip(*batches):
        assert plain["m"].shape == mapped["m"].shape == (3, 2)
        assert plain["m"].tolist() == mapped["m"].tolist()
        assert plain["s"]["m"].tolist() == mapped["s"]["m"].tolist()
    assert batches[0][1]["m"][0].tolist() == [("k3", 3), ("n", -3)]


def test_structs_become_dicts_of_their_fields_batched(tmp_path):
    # a struct column (SQuAD's "answers", a point) is a dict of its fields, each read as a
    # column is: numbers batched into arrays, strings str, structs in structs dicts in dicts
    n = 11
    table = pa.table({
        "id": pa.array(range(n)),
        "point": pa.array([{"x": i * 0.5, "tag": f"p{i}", "v": [i, -i],
                            "inner": {"deep": [[i] * 2] * 3}} for i in range(n)]),
    })
    path = str(tmp_path / "points.parquet")
    pq.write_table(table, path, row_group_size=4)
    src, order = jl.ParquetSource(path), np.array([10, 3, 0, 7, 4, 1, 8, 5, 2, 9, 6])
    row = src[3]
    assert row["id"] == 3 and row["point"]["x"] == 1.5 and row["point"]["tag"] == "p3"
    assert row["point"]["v"].tolist() == [3, -3]
    assert row["point"]["inner"]["deep"].tolist() == [[3, 3]] * 3
    assert not src[3]["point"]["v"].flags.writeable
    batch = src.__getitems__(order)
    point = batch["point"]
    assert point["x"].dtype == np.float64 and point["x"].tolist() == (order * 0.5).tolist()
    assert point["tag"].tolist() == [f"p{i}" for i in order]
    assert point["v"].shape == (n, 2) and point["inner"]["deep"].shape == (n, 3, 2)
    assert point["inner"]["deep"][:, 0, 0].tolist() == order.tolist()
    with jl.DataLoader(src, batch_size=4, shuffle=jl.LocalShuffle(window=2), num_workers=2,
                       process_index=0, process_count=1) as loader:
        got = list(loader)
    assert all(b["point"]["x"].tolist() == (b["id"] * 0.5).tolist() for b in got)
    assert {b["point"]["inner"]["deep"].shape for b in got} == {(4, 3, 2)}
    # ragged lists in a struct (SQuAD's answers): a batch of rows; a null in a field raises
    answers = str(tmp_path / "answers.parquet")
    pq.write_table(pa.table({"answers": pa.array(
        [{"text": ["a"] * (i % 3 + 1), "start": [i] * (i % 3 + 1)} for i in range(6)])}),
        answers, row_group_size=4)
    rows = jl.ParquetSource(answers).__getitems__(np.array([5, 0]))
    assert [r["answers"]["start"].tolist() for r in rows] == [[5, 5, 5], [0]]
    pq.write_table(pa.table({"p": pa.array([{"x": 1, "y": None}, {"x": 2, "y": 3}])}), answers)
    with pytest.raises(ValueError, match="column 'p.y' of .*answers.parquet' has 1 null"):
        jl.ParquetSource(answers)[0]


def test_lists_of_one_length_a_row_group_but_another_in_the_next_read_as_rows(tmp_path):
    # each row group's lists are of one length (one array a group) but not the same length:
    # a batch over both gets rows, as for ragged lists (it raised from np.concatenate)
    path = str(tmp_path / "uneven.parquet")
    pq.write_table(pa.table({"t": [[1, 2], [3, 4], [5, 6, 7], [8, 9, 10]]}), path,
                   row_group_size=2)
    rows = jl.ParquetSource(path).__getitems__(np.array([3, 0, 2]))
    assert [r["t"].tolist() for r in rows] == [[8, 9, 10], [1, 2], [5, 6, 7]]
    with jl.DataLoader(jl.ParquetSource(path), batch_size=2, process_index=0,
                       process_count=1) as loader:
        assert [b["t"].shape for b in loader] == [(2, 2), (2, 3)]


def test_booleans_dates_times_categories_and_decimals_read_as_arrows_numpy_gives_them(tmp_path):
    # the columns that are not numbers, strings or lists go through Arrow's own conversion
    import datetime
    import decimal

    n = 7
    table = pa.table({
        "flag": [i % 3 == 0 for i in range(n)],
        "day": pa.array([datetime.date(2024, 1, 1 + i) for i in range(n)]),
        "at": pa.array([datetime.datetime(2024, 1, 1, 0, 0, i) for i in range(n)]),
        "flags": [[i % 2 == 0, True] for i in range(n)],
        "kind": pa.array(["cat", "dog", "cat", "emu", "dog", "cat", "emu"]).dictionary_encode(),
        "half": pa.array(np.arange(n, dtype=np.float16)),
        "price": pa.array([decimal.Decimal(f"{i}.25") for i in range(n)]),
    })
    path = str(tmp_path / "kinds.parquet")
    pq.write_table(table, path, row_group_size=3)
    order = np.array([6, 0, 4, 1, 5, 2, 3])
    batch = jl.ParquetSource(path).__getitems__(order)
    for name in table.column_names:
        want = table.column(name).to_numpy(zero_copy_only=False)
        if want.dtype == object and isinstance(want[0], np.ndarray):
            want = np.stack(want)
        assert batch[name].dtype == want.dtype, name
        np.testing.assert_array_equal(batch[name], want[order], err_msg=name)
    assert batch["flag"].dtype == bool and batch["day"].dtype == np.dtype("datetime64[D]")
    assert batch["kind"].tolist() == [table.column("kind")[int(i)].as_py() for i in order]
    batched = [c for c in table.column_names if c != "price"]  # (a batch refuses decimals)
    with jl.DataLoader(jl.ParquetSource(path, columns=batched), batch_size=n, num_workers=2,
                       process_index=0, process_count=1) as loader:
        (got,) = list(loader)
    np.testing.assert_array_equal(got["at"], table.column("at").to_numpy())
    assert got["flags"].shape == (n, 2)


@pytest.mark.parametrize("transforms", [[], [lambda r: r]])
def test_a_decimal_is_refused_in_a_batch_as_the_guide_says_whichever_way_it_is_read(tmp_path,
                                                                                      transforms):
    # read a column at a time (no Map), a batch held Decimal objects; a record at a time,
    # refused: the guide's CollateError, and a Map that converts them is the remedy
    import decimal

    path = str(tmp_path / "prices.parquet")
    pq.write_table(pa.table({"price": [decimal.Decimal(f"{i}.25") for i in range(4)]}), path)
    with pytest.raises(jl.CollateError, match=r"leaf \['price'\]: .* holds a decimal.Decimal, "
                                              r"which is neither .* convert it in a Map"):
        jl.DataLoader(jl.ParquetSource(path), batch_size=2, transforms=transforms).peek()
    loader = jl.DataLoader(jl.ParquetSource(path), batch_size=2,
                           transforms=[lambda r: {"price": float(r["price"])}])
    assert loader.peek()["price"].tolist() == [0.25, 1.25]


def test_text_that_is_not_utf8_as_a_whole_is_decoded_row_by_row(tmp_path):
    # a string column whose bytes are not valid UTF-8 (Arrow does not check them on write):
    # the valid rows read, the invalid one raises, in short runs and in long ones
    texts = [f"row {i} é".encode() for i in range(40)]
    texts[7] = b"\xff\xfe"
    path = str(tmp_path / "bad-text.parquet")
    pq.write_table(pa.table({"t": pa.array(texts, pa.binary()).view(pa.string())}), path)
    src = jl.ParquetSource(path)
    valid = np.array([i for i in range(40) if i != 7])
    for rows in (valid[::-1], valid[:3]):  # one run of 39 rows; one of 3
        assert src.__getitems__(rows)["t"].tolist() == [texts[i].decode() for i in rows]
    with pytest.raises(ValueError, match=r"column 't' of '.*bad-text.parquet' holds a string "
                                         r"that is not UTF-8 .*b'\\xff\\xfe'.*fix its writer"):
        src.__getitems__(np.array([3, 7]))


def test_another_file_list_is_refused_on_restore(tmp_path):
    paths = write_parts(tmp_path)
    state = jl.DataLoader(jl.ParquetSource(paths), batch_size=8, process_index=0,
                          process_count=1).state_dict()
    assert state["source"].startswith("parquet:128:")
    other = jl.DataLoader(jl.ParquetSource(paths[:2] + paths[2:][::-1]), batch_size=8,
                          process_index=0, process_count=1)
    other.load_state_dict(state)  # the same files in the same order: accepted
    swapped = jl.DataLoader(jl.ParquetSource([paths[1], paths[0], paths[2]]), batch_size=8,
                            process_index=0, process_count=1)
    with pytest.raises(jl.StateDictError, match="source: expected 'parquet:128:"):
        swapped.load_state_dict(state)


def test_bad_input_names_the_file_or_the_column(tmp_path):
    paths = write_parts(tmp_path, rows=(10, 10))
    with pytest.raises(jl.ConfigError, match=r"file '.*missing.parquet' does not exist"):
        jl.ParquetSource([paths[0], str(tmp_path / "missing.parquet")])
    (tmp_path / "notes.txt").write_text("not a parquet file")
    with pytest.raises(jl.ConfigError, match=r"'.*notes.txt' is not a Parquet file"):
        jl.ParquetSource(str(tmp_path / "notes.txt"))
    cut = open(paths[0], "rb").read()[:-100]  # (a copy that failed: told to copy it again)
    (tmp_path / "cut.parquet").write_bytes(cut)
    with pytest.raises(jl.ConfigError, match=r"cut.parquet' is not a Parquet file.*cut short "
                       r"or damaged.*copy it again"):
        jl.ParquetSource(str(tmp_path / "cut.parquet"))
    pq.write_table(pa.table({"id": np.arange(3, dtype=np.int32)}), tmp_path / "other.parquet")
    with pytest.raises(jl.ConfigError, match=r"other.parquet' has another schema.*id: int64"):
        jl.ParquetSource([paths[0], str(tmp_path / "other.parquet")])
    with pytest.raises(jl.ConfigError, match=r"\['label'\] not in .*columns are \['id', "):
        jl.ParquetSource(paths, columns=["id", "label"])
    assert list(jl.ParquetSource(paths, columns=["text"])[0]) == ["text"]
    assert list(jl.ParquetSource(paths, columns="text")[0]) == ["text"]  # not 't', 'e', ...
    with pytest.raises(jl.ConfigError, match=r"columns=\[\]\): expected the names .* None "
                                             r"reads them all"):
        jl.ParquetSource(paths, columns=[])  # (rows of no column: batches of {})
    for bad in (-1, 1.5, "64MB", True):
        with pytest.raises(jl.ConfigError, match=r"cache_bytes=...\): expected an int.*, got"
                                                 r".*; a number of bytes \(0: no row group"):
            jl.ParquetSource(paths, cache_bytes=bad)
    assert jl.ParquetSource(paths, cache_bytes=0)[3]["id"] == 3  # (nothing kept)
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"x": pa.array([1.0, None, 3.0])}), nulls)
    with pytest.raises(jl.ConfigError, match="column 'x' of .*nulls.parquet' has 1 null"):
        jl.ParquetSource(str(nulls))[0]
    # written without statistics: found as read, and named by its row group and row (it
    # named neither: rows of a file of thousands of row groups)
    pq.write_table(pa.table({"x": pa.array([1.0, 2.0, 3.0, None, 5.0, None])}), nulls,
                   write_statistics=False, row_group_size=2)
    with pytest.raises(jl.ConfigError, match=r"column 'x' of .*nulls.parquet' has 1 null "
                                             r"value\(s\) in row group 1, the first at its row 1;"):
        jl.ParquetSource(str(nulls))[2]
    # a null inside a list of numbers would turn its row group's integers into floats
    pq.write_table(pa.table({"x": pa.array([[1, 2], [3, None]])}), nulls)
    with pytest.raises(ValueError, match="'x' of .*nulls.parquet' has 1 null value.* inside"):
        jl.ParquetSource(str(nulls))[0]
    # and in a struct's field inside a list (boxes with labels): it came out as None
    boxes = pa.list_(pa.struct([("label", pa.int64())]))
    pq.write_table(pa.table({"x": pa.array([[{"label": 7}], [{"label": None}]], boxes)}), nulls)
    with pytest.raises(ValueError, match="'x' of .*nulls.parquet' has 1 null value.* inside"):
        jl.ParquetSource(str(nulls))[0]
    # a Hugging Face Image column as datasets writes it: a struct of bytes and a null path; the
    # remedy said to leave out 'img.path' with columns=, which takes no field of a struct
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pq.write_table(pa.table({"img": pa.array([{"bytes": b"\x89PNG", "path": None}], image)}),
                   nulls)
    with pytest.raises(ValueError, match=r"column 'img.path' .* leave the column 'img' out with "
                                         r"columns=; 'img' looks like a Hugging Face Image .*"
                                         r"datasets.load_dataset\('parquet'"):
        jl.ParquetSource(str(nulls))[0]


def test_a_null_the_footer_counts_is_refused_where_the_source_is_made(tmp_path):
    # it was found as its row group was decoded: here the last, an epoch into a run
    x = pa.array([float(i) if i != 2500 else None for i in range(3000)])
    table = pa.table({"x": x, "y": np.arange(3000)})
    pq.write_table(table, tmp_path / "late.parquet", row_group_size=1000)
    with pytest.raises(jl.ConfigError, match=r"column 'x' of .*late.parquet' has 1 null "
                                             r"value\(s\) in row group 2 \(rows 2000-2999 of "
                                             r"the file\), its footer says; fill them .*leave "
                                             r"the column 'x' out with columns="):
        jl.ParquetSource(str(tmp_path / "late.parquet"))
    assert jl.ParquetSource(str(tmp_path / "late.parquet"), columns=["y"])[2500] == {"y": 2500}
    # a file written without statistics: still refused, as the row group is decoded
    pq.write_table(table, tmp_path / "bare.parquet", row_group_size=1000, write_statistics=False)
    source = jl.ParquetSource(str(tmp_path / "bare.parquet"))
    assert source[0]["x"] == 0.0
    with pytest.raises(jl.ConfigError, match=r"column 'x' of .*bare.parquet' has 1 null "
                                             r"value"):
        source[2000]  # (a JaxloaderError, as every error jaxloader raises: it was a ValueError)
    # an empty list is no null: a list's values are left to the decoding, which knows
    pq.write_table(pa.table({"v": pa.array([[1], [], [2, 3]])}), tmp_path / "lists.parquet")
    assert jl.ParquetSource(str(tmp_path / "lists.parquet"))[1]["v"].tolist() == []


def _rows_claimed(path, rows, which):
    """The Parquet file at ``path`` with its footer's row counts (the file's, then each row
    group's: thrift field 3 and 2, an i64 each) at positions ``which`` set to ``rows``."""
    import struct

    def varint(n):
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
            n >>= 7
            if not n:
                return bytes(out)

    raw = path.read_bytes()
    size = struct.unpack("<I", raw[-8:-4])[0]
    meta = raw[-8 - size:-8]
    old = b"\x16" + varint(777 << 1)  # (a field delta of 1, type i64: 777 zigzagged)
    hits = [i for i in range(len(meta)) if meta.startswith(old, i)]
    patched = bytearray(meta)
    for i in sorted((hits[w] for w in which), reverse=True):
        patched[i:i + len(old)] = b"\x16" + varint(rows << 1)
    path.write_bytes(raw[:-8 - size] + bytes(patched) + struct.pack("<I", len(patched))
                     + b"PAR1")


def test_a_footer_that_claims_rows_the_file_lacks_is_named(tmp_path):
    # a row group counted as 10**15 rows was allocated as many at the first batch (pyarrow's
    # ArrowMemoryError named no file); one whose count differs from the file's passed too
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, which in (("file", [0]), ("group", [-1]), ("both", [0, -1])):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"x": np.arange(777), "s": [str(i) for i in range(777)]}), path)
        _rows_claimed(path, 10**15, which)
        meta = pq.ParquetFile(path).metadata
        assert [meta.num_rows, meta.row_group(0).num_rows].count(10**15) == len(which)
        if name != "both":
            with pytest.raises(jl.ConfigError, match=rf"{name}.parquet': its footer counts "
                                                     r"[\d,]+ rows, its row groups [\d,]+: the "
                                                     "footer is damaged"):
                jl.ParquetSource(path)
            continue
        loader = jl.DataLoader(jl.ParquetSource(path), batch_size=4, process_index=0,
                               process_count=1)
        with pytest.raises(jl.RecordError, match=r"both.parquet', row group 0 of 1,000,"
                                                 r"000,000,000,000 rows, columns \['x', 's'\]: "
                                                 r"does not fit in this process's memory"):
            next(iter(loader))


def test_a_row_group_whose_footer_counts_more_rows_than_its_data_is_refused(tmp_path):
    # footer and file both said 800 of 777 rows: the 23 rows past the data's end were
    # gathered as copies of its last row (clipped), trained on without a word
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "grown.parquet"
    pq.write_table(pa.table({"x": np.arange(777)}), path)
    _rows_claimed(path, 800, [0, -1])
    source = jl.ParquetSource(path)
    assert len(source) == 800
    loader = jl.DataLoader(source, batch_size=100, shuffle=False, process_index=0,
                           process_count=1)
    with pytest.raises(jl.RecordError, match=r"grown.parquet', row group 0: its footer counts "
                                             r"800 rows, its data holds 777; the file is damaged"):
        next(iter(loader))


def test_a_column_only_a_later_file_has_is_refused_not_dropped(tmp_path):
    # columns came from the first file: a later file's own were left out, silently (and the
    # same files in the other order were refused)
    pq.write_table(pa.table({"id": [0, 1]}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"id": [2, 3], "label": [7, 8]}), tmp_path / "part-1.parquet")
    with pytest.raises(jl.ConfigError, match=r"part-1.parquet' has another schema.*label: "
                                             r"missing in .*part-0.parquet', int64 here"):
        jl.ParquetSource(str(tmp_path))
    assert len(jl.ParquetSource(str(tmp_path), columns=["id"])) == 4


def test_a_column_named_with_a_dot_is_not_a_fields_struct(tmp_path):
    # pandas.json_normalize's names: "user.id" beside "user" was taken for a field of it, so
    # columns=["user"] was refused for a null in "user.id", with the remedy to leave out "user"
    path = tmp_path / "dots.parquet"
    pq.write_table(pa.table({"user": [10, 20], "user.id": pa.array([None, 5], pa.int64())}),
                   path)
    assert jl.ParquetSource(str(path), columns=["user"])[0] == {"user": 10}
    with pytest.raises(jl.ConfigError, match=r"column 'user.id' .* leave the column 'user.id' "
                                             r"out with columns="):
        jl.ParquetSource(str(path))
    point = pa.struct([("id", pa.int64()), ("n", pa.int64())])  # (a struct's field: its column)
    pq.write_table(pa.table({"user": pa.array([{"id": 1, "n": None}], point), "z": [1]}), path)
    with pytest.raises(jl.ConfigError, match=r"column 'user.n' .* leave the column 'user' out"):
        jl.ParquetSource(str(path))
    assert jl.ParquetSource(str(path), columns=["z"])[0] == {"z": 1}
    # columns stored in leaves counted another way (a list view's values, an extension's
    # storage): an IndexError as the source was made, for any columns=
    kinds = {"ext": pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((2, 2, 2)))}
    if hasattr(pa, "list_view"):
        kinds["view"] = pa.array([[point_row := {"id": 1, "n": 2}], [point_row]],
                                 pa.list_view(point))
    pq.write_table(pa.table({**kinds, "a": pa.array([1, None]), "b": [5, 6]}), path)
    assert jl.ParquetSource(str(path), columns=["b"])[1] == {"b": 6}
    with pytest.raises(jl.ConfigError, match=r"column 'a' .* leave the column 'a' out"):
        jl.ParquetSource(str(path), columns=["a"])


def test_tensors_keep_their_shape_and_times_of_day_are_durations(tmp_path):
    # a fixed-shape tensor came out as its storage's flat rows, (4, 6) for rows of (2, 3); a
    # time of day as datetime.time objects, refused at the first batch with a remedy that
    # did not work (np.asarray(x) gives an object array)
    import datetime

    x = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    pq.write_table(pa.table({
        "x": pa.FixedShapeTensorArray.from_numpy_ndarray(x),
        "t": pa.array([datetime.time(1, 2, 3, 4)] * 4, pa.time64("us")),
        "s": pa.array([datetime.time(0, 0, 5)] * 4, pa.time32("ms")),
        "l": pa.array([[datetime.time(0, 0, 5)]] * 4, pa.list_(pa.time32("ms")))}),
        tmp_path / "t.parquet")
    source = jl.ParquetSource(str(tmp_path / "t.parquet"))
    assert source[1]["x"].shape == (2, 3) and np.array_equal(source[1]["x"], x[1])
    for workers in (0, 2):
        with jl.DataLoader(source, batch_size=4, num_workers=workers, process_index=0,
                           process_count=1) as loader:
            batch = next(iter(loader))
        assert batch["x"].shape == (4, 2, 3) and np.array_equal(batch["x"], x)
        assert batch["t"].dtype == np.dtype("timedelta64[us]")
        assert batch["t"].astype(np.int64).tolist() == [3_723_000_004] * 4
        assert batch["s"].dtype == np.dtype("timedelta64[ms]")
        assert batch["s"].astype(np.int64).tolist() == [5_000] * 4
        assert batch["l"].dtype == np.dtype("timedelta64[ms]") and batch["l"].shape == (4, 1)


def test_times_of_day_inside_ragged_lists_and_lists_of_structs_are_durations_too(tmp_path):
    # lists of lists of other lengths and lists of structs came as datetime.time objects
    # inside their rows' object arrays, where the top level and uniform lists held durations
    import datetime

    t = datetime.time
    pq.write_table(pa.table({
        "ll": pa.array([[[t(1), t(2)], [t(3)]], [[t(0, 0, 4)]]],
                       pa.list_(pa.list_(pa.time64("us")))),
        "ls": pa.array([[{"x": t(0, 1), "n": 1}], [{"x": t(0, 0, 2), "n": 2}, {"x": t(3), "n": 3}]],
                       pa.list_(pa.struct([("x", pa.time32("s")), ("n", pa.int32())])))}),
        tmp_path / "t.parquet")
    source = jl.ParquetSource(str(tmp_path / "t.parquet"))
    first, second = source[0], source[1]
    assert [row.dtype for row in first["ll"]] == [np.dtype("timedelta64[us]")] * 2
    assert first["ll"][0].astype(np.int64).tolist() == [3_600_000_000, 7_200_000_000]
    assert second["ll"][0].astype(np.int64).tolist() == [4_000_000]
    assert [row["x"] for row in second["ls"]] == [datetime.timedelta(seconds=2),
                                                  datetime.timedelta(hours=3)]
    assert first["ls"][0] == {"x": datetime.timedelta(minutes=1), "n": 1}


def test_the_row_labels_pandas_stores_are_not_read_as_a_column(tmp_path):
    pd = pytest.importorskip("pandas")  # installed with datasets, in the test extra
    frame = pd.DataFrame({"x": np.arange(4.0)}, index=[10, 11, 12, 13])  # not a range
    frame.to_parquet(tmp_path / "labels.parquet")
    assert "__index_level_0__" in pq.ParquetFile(tmp_path / "labels.parquet").schema_arrow.names
    src = jl.ParquetSource(str(tmp_path / "labels.parquet"))
    assert src.columns == ["x"] and src[1] == {"x": 1.0}
    asked = jl.ParquetSource(str(tmp_path / "labels.parquet"), columns=["x", "__index_level_0__"])
    assert asked[1] == {"x": 1.0, "__index_level_0__": 11}
    frame.rename_axis("key").to_parquet(tmp_path / "named.parquet")  # a named index is data
    assert jl.ParquetSource(str(tmp_path / "named.parquet"))[2] == {"x": 2.0, "key": 12}


def test_lengths_come_from_a_list_columns_offsets_without_reading_rows(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 50, rng.integers(0, 9)).tolist() for _ in range(70)]
    for part in range(2):  # two files, row groups of 16
        pq.write_table(pa.table({"tokens": pa.array(docs[part * 35:(part + 1) * 35],
                                                   pa.list_(pa.int32())),
                                 "fixed": pa.array([[1, 2]] * 35, pa.list_(pa.int64(), 2)),
                                 "text": ["x"] * 35,
                                 "frames": pa.array([[[0.5] * 3] * (i % 4) for i in range(35)],
                                                    pa.list_(pa.list_(pa.float32())))}),
                       tmp_path / f"part-{part}.parquet", row_group_size=16)
    src = jl.ParquetSource(sorted(str(p) for p in tmp_path.glob("*.parquet")))
    assert src.lengths("tokens").tolist() == [len(d) for d in docs]
    assert src.lengths("fixed").tolist() == [2] * 70
    # (frames of features, or audio samples: their lengths bucket clips; refused until
    # 2026-11-30, only lists of integers counted)
    assert src.lengths("frames").tolist() == [i % 4 for i in range(35)] * 2

    def no_rows(*args):
        raise AssertionError("PackedSource read rows for their lengths")

    monkeypatch.setattr(jl.ParquetSource, "__getitems__", no_rows)
    monkeypatch.setattr(jl.ParquetSource, "__getitem__", no_rows)
    packed = jl.PackedSource(src, "tokens", 16, method="concat")
    assert packed.plan.rows == -(-sum(map(len, docs)) // 16)
    with pytest.raises(jl.ConfigError, match=r"lengths\('text'\): expected a column of lists "
                                             r".* got string"):
        src.lengths("text")
    # a column misspelled: was told to write the column as lists, or pass lengths=
    with pytest.raises(jl.ConfigError, match=r"lengths\('tokenz'\): no such column among "
                                             r"\[.*'tokens'.*\]; name one of them \('tokens'\?\)"):
        src.lengths("tokenz")
    # a null list: a bare ValueError, which no remedy of jaxloader's named as such
    pq.write_table(pa.table({"tokens": pa.array([[1], None, [2, 3]], pa.list_(pa.int32()))}),
                   tmp_path / "holes.parquet")
    with pytest.raises(jl.ConfigError, match=r"column 'tokens' of .*holes.parquet' has 1 null "
                                             r"list\(s\) in row group 0; fill them"):
        jl.ParquetSource(str(tmp_path / "holes.parquet")).lengths("tokens")


def test_a_cache_smaller_than_what_the_order_reads_at_once_warns(tmp_path):
    paths = write_parts(tmp_path)  # 10 row groups of up to 16 rows
    sizes = jl.ParquetSource(paths)._group_bytes
    two = int(np.sort(sizes)[-2:].sum())  # the two largest row groups, decoded

    def warned(source, shuffle):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            jl.DataLoader(source, batch_size=8, shuffle=shuffle, process_index=0,
                          process_count=1)
        slow = [w for w in caught if w.category is jl.PerformanceWarning]
        assert all(w.filename == __file__ for w in slow)  # points at the DataLoader(...) line
        return [str(w.message) for w in slow]

    small = jl.ParquetSource(paths, cache_bytes=two - 1)
    message, = warned(small, jl.LocalShuffle(window=2))
    assert f"cache_bytes={two - 1:,}" in message and f"at least {two:,}" in message
    assert "up to 2 row group(s) at a time" in message and "smaller window (window=1 fits)" \
        in message  # (it named none: window=8 warned again)
    assert warned(jl.ParquetSource(paths, cache_bytes=two), jl.LocalShuffle(window=2)) == []
    assert warned(small, False) == []  # file order: one row group at a time
    message, = warned(small, True)
    assert "full shuffle" in message and f"at least {int(sizes.sum()):,}" in message
    assert "LocalShuffle(window=1), which reads 1 row group(s) at a time, as many as it holds" \
        in message
    assert warned(jl.ParquetSource(paths, cache_bytes=int(sizes.sum())), True) == []
    # blocks of records straddle row groups: a window of 2 blocks of 20 rows reads up to 6
    six, blocks = int(np.sort(sizes)[-6:].sum()), jl.LocalShuffle(window=2, block_size=20)
    message, = warned(jl.ParquetSource(paths, cache_bytes=six - 1), blocks)
    assert "up to 6 row group(s) at a time" in message
    assert warned(jl.ParquetSource(paths, cache_bytes=six), blocks) == []
    # a file source within a mixture is read in the mixture's order
    mixed = jl.mix([small, jl.ArraySource({"id": np.arange(5)})], [0.5, 0.5])
    assert len(warned(mixed, True)) == 1 and warned(mixed, False) == []


def test_an_order_over_more_row_groups_than_the_cache_keeps_warns_whatever_its_bytes(
        tmp_path, monkeypatch):
    # the cache keeps at most 256 row groups: a full shuffle over 3,000 small ones decoded
    # ~2,400 a batch (~130x slower) without a word, and cache_bytes, the remedy, changed nothing
    monkeypatch.setattr("jaxloader.sources.parquet_footers.MAX_CACHED_GROUPS", 3)
    source = jl.ParquetSource(write_parts(tmp_path), cache_bytes=1 << 30)  # 10 row groups

    def warned(shuffle):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            jl.DataLoader(source, batch_size=8, shuffle=shuffle, process_index=0,
                          process_count=1)
        return [str(w.message) for w in caught if w.category is jl.PerformanceWarning]

    message, = warned(True)
    assert "more row groups than the 3 a process keeps decoded, whatever cache_bytes" in message
    assert "row_group_size=; 10 now" in message and "LocalShuffle(window=3)" in message
    message, = warned(jl.LocalShuffle(window=4))
    assert "up to 4 row group(s)" in message and "(window=3 fits)" in message
    assert warned(jl.LocalShuffle(window=3)) == [] and warned(False) == []


def test_gs_paths_are_read_through_epath_in_process_and_in_workers(gcs):
    import fake_gcs

    root, init = gcs
    (root / "bucket").mkdir()
    local = write_parts(root / "bucket")
    remote = [p.replace(str(root) + "/", "gs://") for p in local]
    src = jl.ParquetSource(remote)
    assert src.paths[0] == "gs://bucket/part-0.parquet" and len(src) == 128
    assert fake_gcs.FakeGcs.opened  # the footers were read through the gs:// filesystem
    batches = {}
    for name, paths, num_workers in (("local", local, 0), ("remote", remote, 2)):
        with jl.DataLoader(jl.ParquetSource(paths), batch_size=16, shuffle=True, seed=3,
                           num_workers=num_workers, worker_init_fn=init,
                           process_index=0, process_count=1) as loader:
            batches[name] = list(loader)
    assert len(batches["remote"]) == 8
    for a, b in zip(batches["local"], batches["remote"]):
        assert_same_batch(a, b)
    with pytest.raises(jl.ConfigError, match=r"'gs://bucket/nope.parquet' does not exist"):
        jl.ParquetSource([remote[0], "gs://bucket/nope.parquet"])


def _imports(record):
    import sys

    return {"id": record["id"], "pandas": np.bool_("pandas" in sys.modules),
            "epath": np.bool_("etils.epath" in sys.modules)}


def test_a_worker_decodes_without_pandas_or_epath(tmp_path):
    # pyarrow's to_numpy, pa.array and take import pandas where installed (27 MiB a worker);
    # epath costs 7 MiB: a worker reading local files needs neither (docs/benchmarks.md)
    paths = write_parts(tmp_path)
    with jl.DataLoader(jl.ParquetSource(paths), batch_size=32, shuffle=True, num_workers=1,
                       transforms=[jl.Map(_imports)], process_index=0,
                       process_count=1) as loader:
        batches = list(loader)
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(128))
    assert not any(b["pandas"].any() or b["epath"].any() for b in batches)


def test_a_worker_imports_pyarrow_as_it_starts_not_in_its_first_batch(tmp_path):
    # the import (~0.2 s) overlaps what the main process does before its first batch
    folder = str(tmp_path)

    def note(worker_id):  # made here: crosses by value, importing nothing (not this module)
        import sys

        with open(f"{folder}/worker-{worker_id}", "w") as f:
            f.write(str("pyarrow.parquet" in sys.modules))

    paths = write_parts(tmp_path)
    with jl.DataLoader(jl.ParquetSource(paths), batch_size=32, num_workers=2,
                       worker_init_fn=note, process_index=0, process_count=1) as loader:
        assert len(list(loader)) == 4
    assert [(tmp_path / f"worker-{i}").read_text() for i in range(2)] == ["True", "True"]


def test_a_batch_from_joined_row_groups_equals_one_read_run_by_run(tmp_path):
    # a batch whose row groups are not all joined yet joins them (a read-local window, a
    # batch across two windows, file order) and reads each column in one take; one from more
    # than _MAX_JOINED row groups, or a column that cannot be joined, is read run by run
    from jaxloader.sources import parquet

    n = 5 * (parquet._MAX_JOINED + 6)
    texts = ["", "é", "naïve ✓ 🙂", *(f"row {i}" * (i % 4) for i in range(n - 3))]
    table = pa.table({"id": np.arange(n), "grid": pa.array([[[i % 100, 1], [2, 3]] for i in range(n)],
                                                            pa.list_(pa.list_(pa.int8(), 2), 2)),
                      "text": texts, "raw": [t.encode() for t in texts],
                      "day": pa.array(np.arange(n, dtype=np.int32), pa.int32()).view(pa.date32())})
    path = str(tmp_path / "rows.parquet")
    pq.write_table(table, path, row_group_size=5)
    src, runs = jl.ParquetSource(path), jl.ParquetSource(path)
    rng = np.random.default_rng(0)
    batches = [rng.permutation(40)[:17], rng.permutation(40)[:9] + 30,  # a window, then across
               np.arange(60, 64), np.arange(63, 70),  # file order: one group, then two
               rng.permutation(n)[:300],  # every row group: run by run
               np.zeros(0, np.int64), np.array([n - 1])]
    joined = []
    for indices in batches:
        got = src.__getitems__(indices)
        joined.append(src._join is not None and src._join.rows(
            indices, src._starts.searchsorted(indices, side="right") - 1) is not None)
        want = runs._by_runs(indices, runs._starts.searchsorted(indices, side="right") - 1)
        assert got.keys() == want.keys()
        for key in got:
            assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
            assert got[key].tolist() == want[key].tolist(), key
        assert got["text"].tolist() == [texts[i] for i in indices]
    assert joined == [True, True, True, True, False, True, True]
    # the join counts (twice: the last one's pages) against the cache's bound, so a batch
    # joins row groups that fit in a third of it
    small = jl.ParquetSource(path, cache_bytes=6 * max(src._sizes.values()))  # 6 decoded
    cached = []
    for first in range(0, 60, 3):  # file order: joins of a row group or two
        rows = np.arange(first, first + 4)
        small.__getitems__(rows)
        held = sum(small._sizes[g] for g in small._cache)
        assert small._join is not None and held + 2 * small._join.nbytes <= small.cache_bytes
        # and it evicts none of the row groups it was made from (other workers read them)
        assert set((rows // 5).tolist()) <= set(small._cache)
        cached.append(len(small._cache))
        wide = np.arange(first, first + 11)  # 3 row groups: joined or not, none evicted
        assert small.__getitems__(wide)["id"].tolist() == wide.tolist()
        assert set((wide // 5).tolist()) <= set(small._cache)
    assert max(cached) > 2 and min(cached[5:]) < 12  # row groups cached, and evicted
    # the footers' sizes are estimates: where they understate, the decoded sizes decide
    under = jl.ParquetSource(path, cache_bytes=6 * max(src._sizes.values()))
    under._group_bytes = np.ones_like(under._group_bytes)
    for first in range(0, 60, 3):
        wide = np.arange(first, first + 11)  # 3 row groups decoded: too many to join
        assert under.__getitems__(wide)["id"].tolist() == wide.tolist()
        assert set((wide // 5).tolist()) <= set(under._cache)
        assert under._join is None or under._join.rows(
            wide, wide // 5) is None  # read run by run
    rows = np.arange(60, 62)  # one row group: joined
    assert under.__getitems__(rows)["id"].tolist() == rows.tolist()
    assert under._join is not None and 12 in under._cache
    gathered = src.gather_columns(np.array([3, 1]))  # for a worker: strings as one buffer
    assert type(gathered["text"]).__name__ == "StringColumn"
    assert gathered["text"].objects().tolist() == [texts[3], texts[1]]
    assert type(gathered["id"]) is collate.DeferredTake  # numbers gathered where they are written
    assert gathered["id"].taken().tolist() == [3, 1]
    # a struct column cannot be joined: every batch run by run, as before
    structs = str(tmp_path / "structs.parquet")
    pq.write_table(pa.table({"p": [{"x": i, "tag": str(i)} for i in range(20)]}), structs,
                   row_group_size=5)
    src = jl.ParquetSource(structs)
    assert src.__getitems__(np.array([7, 2]))["p"]["tag"].tolist() == ["7", "2"]
    assert src._join is None and not src._joins


def test_row_groups_whose_footers_say_less_than_they_decode_to_are_not_joined(tmp_path):
    """A column that compresses well (one long string over and over: its footer says 5 KB a
    row group, which decodes to 200 KB) passed the footers' check for a join; decoding the
    batch's row groups then evicted the first of them, whose size the decoded check looked up:
    ``KeyError: 0`` at step 0 of a shuffled epoch. The decoded check adds up what was decoded,
    and the batch is read run by run."""
    path = str(tmp_path / "repeated.parquet")
    pq.write_table(pa.table({"y": pa.array([b"z" * 200] * 8000), "i": np.arange(8000)}), path,
                   row_group_size=1000)
    src = jl.ParquetSource(path, cache_bytes=1 << 20)
    with jl.DataLoader(src, batch_size=64, shuffle=True, num_epochs=1, seed=0) as loader:
        seen = np.concatenate([batch["i"] for batch in loader])
    assert len(seen) == 8000 // 64 * 64 and len(set(seen.tolist())) == len(seen)


def test_a_full_shuffle_of_row_groups_that_decode_larger_than_their_footers_say_is_warned(
        tmp_path):
    """A dictionary's values are stored as its indices (a label of 10 classes, a string over
    and over): the footers said 660 bytes for 200 KB decoded, so a full shuffle of 40 row
    groups through a 1 MiB cache was said to fit, and ran tens of times slower unwarned."""
    path = str(tmp_path / "repeated.parquet")
    n = 40_000
    pq.write_table(pa.table({"y": pa.array([b"z" * 200] * n), "label": np.arange(n) % 10}),
                   path, row_group_size=1000)
    src = jl.ParquetSource(path, cache_bytes=1 << 20)
    src.__getitems__(np.arange(3))
    assert 0.9 < src._group_bytes[0] / src._sizes[0] < 1.1, (src._group_bytes[0], src._sizes)
    with pytest.warns(jl.PerformanceWarning, match="all 40 row groups at once"):
        jl.DataLoader(src, batch_size=64, shuffle=True).close()
    # a dictionary large beside its indices (1,800 values of 500 bytes), and a chunk that fell
    # back to plain pages (values all distinct): each told within 2x of its decoded size (the
    # second review: 1 MB said for 10 MB)
    for name, values in (("large dictionary", [f"{i % 1800:0500d}" for i in range(20_000)]),
                         ("plain", [f"{i:040d}" for i in range(20_000)])):
        path = str(tmp_path / "strings.parquet")
        pq.write_table(pa.table({"s": values}), path, row_group_size=20_000)
        src = jl.ParquetSource(path)
        src.__getitems__(np.arange(3))
        assert 0.5 < src._group_bytes[0] / src._sizes[0] < 2, (name, src._group_bytes, src._sizes)


def test_the_fingerprint_does_not_depend_on_an_extension_type_being_registered(tmp_path):
    # str(schema) showed a datasets Array2D column as its extension type only where datasets
    # was imported: a state saved by a training script that imports it was refused by a resume
    # script that does not
    class Pair(pa.ExtensionType):
        def __init__(self):
            super().__init__(pa.list_(pa.int32(), 2), "jaxloader.test.pair")

        def __arrow_ext_serialize__(self):
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type, serialized):
            return cls()

    pa.register_extension_type(Pair())
    try:
        storage = pa.array([[i, i] for i in range(6)], pa.list_(pa.int32(), 2))
        column = pa.ExtensionArray.from_storage(Pair(), storage)
        pq.write_table(pa.table({"pair": column, "y": np.arange(6)}), tmp_path / "p.parquet")
        registered = jl.ParquetSource(tmp_path / "p.parquet", columns=["y"]).fingerprint
    finally:
        pa.unregister_extension_type("jaxloader.test.pair")
    assert jl.ParquetSource(tmp_path / "p.parquet", columns=["y"]).fingerprint == registered


def test_files_that_differ_only_in_arrow_encoding_are_read_together(tmp_path):
    # pandas 3 writes str as large_string, datasets and Spark as string; a categorical's index
    # width follows its count: each file alone read the same values, together they were refused
    pq.write_table(pa.table({"s": pa.array(["a", "b"], pa.string()),
                             "t": pa.array([[1, 2], [3, 4]], pa.list_(pa.int64())),
                             "c": pa.array(["x", "y"]).dictionary_encode()}), tmp_path / "0.parquet")
    pq.write_table(pa.table({"s": pa.array(["c", "d"], pa.large_string()),
                             "t": pa.array([[5, 6], [7, 8]], pa.large_list(pa.int64())),
                             "c": pa.array(["z", "w"])}), tmp_path / "1.parquet")
    source = jl.ParquetSource(tmp_path)
    with jl.DataLoader(source, batch_size=4, shuffle=True, process_index=0,
                       process_count=1) as loader:
        batch = next(iter(loader))
    order = np.argsort(batch["s"].astype(str))
    assert batch["s"][order].tolist() == ["a", "b", "c", "d"]
    assert batch["c"][order].tolist() == ["x", "y", "z", "w"]
    assert batch["t"][order].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8]]
    pq.write_table(pa.table({"s": pa.array(["e"]), "t": pa.array([[9.0, 9.0]]),
                             "c": pa.array(["v"])}), tmp_path / "2.parquet")
    with pytest.raises(jl.ConfigError, match=r"another schema than the first file with rows: t: "
                                             r"list<\w+: int64>"):
        jl.ParquetSource(tmp_path)  # (numbers of another type still differ)


def test_a_maps_or_fixed_lists_items_of_another_arrow_encoding_are_read_together(tmp_path):
    # map<string, large_string> beside map<string, string> was refused (the Parquet audit)
    wide = pa.map_(pa.string(), pa.large_string())
    pq.write_table(pa.table({"m": pa.array([[("a", "x")]], wide),
                             "f": pa.array([["x"]], pa.list_(pa.large_string(), 1))}),
                   tmp_path / "0.parquet")
    pq.write_table(pa.table({"m": pa.array([[("a", "y")]], pa.map_(pa.string(), pa.string())),
                             "f": pa.array([["y"]], pa.list_(pa.string(), 1))}),
                   tmp_path / "1.parquet")
    source = jl.ParquetSource(tmp_path)
    assert [source[i]["f"].tolist() for i in range(2)] == [["x"], ["y"]]
    assert [source[i]["m"].tolist() for i in range(2)] == [[("a", "x")], [("a", "y")]]


def test_a_source_read_record_by_record_on_threads_reads_each_row_right(tmp_path):
    # a wrapper of __getitem__ alone, read_threads=8, a small cache: its threads read one
    # pyarrow file and the cache at once, and the process died (SIGSEGV, "double free"; with
    # workers, EDEADLK from the shared blocks' locks: the Parquet audit)
    n = 6000
    pq.write_table(pa.table({"id": np.arange(n), "s": [f"row {i}" for i in range(n)]}),
                   tmp_path / "a.parquet", row_group_size=100)

    class Lengths:
        def __init__(self, source):
            self.source = source

        def __len__(self):
            return len(self.source)

        def __getitem__(self, i):
            r = self.source[i]
            return {"id": r["id"], "n": len(r["s"])}

    source = jl.ParquetSource(tmp_path, cache_bytes=40_000)
    with jl.DataLoader(Lengths(source), batch_size=250, shuffle=True, read_threads=8,
                       num_epochs=2, process_index=0, process_count=1) as loader:
        batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == sorted(list(range(n)) * 2)
    assert all(b["n"].tolist() == [len(f"row {i}") for i in b["id"]] for b in batches)


@pytest.mark.parametrize("inner", [4, -1])
def test_rows_of_different_lengths_of_lists_of_one_length_are_arrays_of_one_more_axis(
        tmp_path, inner):
    # Feature frames of 4 values, T a record: each record was an object array of arrays (a
    # batch's rank then depended on whether its lengths happened to be equal, and no device
    # took it); a record is a (T, 4) array, and a batch of other lengths is refused.
    rng = np.random.default_rng(0)
    mels = [rng.random((t, 4), dtype=np.float32) for t in (5, 5, 7, 9)]
    path = str(tmp_path / "mel.parquet")
    kind = pa.list_(pa.list_(pa.float32(), inner))
    pq.write_table(pa.table({"mel": pa.array([m.tolist() for m in mels], kind)}), path)
    source = jl.ParquetSource(path)
    for i, mel in enumerate(mels):
        assert source[i]["mel"].dtype == np.float32 and np.array_equal(source[i]["mel"], mel)
    with jl.DataLoader(source, batch_size=2, num_workers=0) as loader:
        it = iter(loader)
        assert next(it)["mel"].shape == (2, 5, 4)
        with pytest.raises(jl.CollateError, match=r"shape \(7, 4\) dtype float32"):
            next(it)


def test_a_dictionary_column_is_decoded_as_its_values_and_counted_by_their_bytes(tmp_path):
    # A pandas categorical (a dictionary of strings) became an object array of str: the cache
    # counted 8 bytes a row for it (10x under in an audit: workers grew past cache_bytes), and
    # each str crossed from the workers alone, 2-20x slower than a column of plain strings.
    from jaxloader.sources.arrow_columns import decode

    names = np.array([f"category-number-{i:04d}" for i in range(50)])
    picks = np.random.default_rng(0).integers(0, 50, 1000)
    table = pa.table({"c": pa.array(names[picks]).dictionary_encode()})
    pq.write_table(table, tmp_path / "cat.parquet")
    column = pq.read_table(tmp_path / "cat.parquet").column("c")
    assert pa.types.is_dictionary(column.type)
    decoded = decode(column, "c", "cat.parquet")
    assert decoded.nbytes >= 1000 * len(names[0])
    source = jl.ParquetSource(str(tmp_path / "cat.parquet"))
    with jl.DataLoader(source, batch_size=100, num_workers=2) as loader:
        got = [v for batch in loader for v in batch["c"].tolist()]
    assert got == names[picks].tolist()


class _AskedToShare(jl.ParquetSource):
    """Says, for each row group a batch decodes, whether it asked to share it with the other
    workers (as a worker with shared blocks would: decoded here, privately)."""

    def _sharing(self):
        return True

    def _fetch_free(self, groups):
        pass

    def _decoded(self, group, share=True):
        self.asked.append((group, share))
        return super()._decoded(group, False)


def test_workers_share_row_groups_a_batch_straddles_where_two_do_not_fit_the_cache(tmp_path):
    # Row groups over half the cache, read in file order: a batch spanning two was decoded by
    # each worker for itself (14-16 decodes of 8 row groups, 8-10 after, in a throwaway count
    # over a loader; an audit's 120 MiB row groups with the default cache: 2 workers at a sixth
    # of the rate of none). How many decodes a loader makes depends on the workers' timing (a
    # worker ahead lets a row group go before the other reads it): asked here instead.
    path = str(tmp_path / "g.parquet")
    pq.write_table(pa.table({"x": np.arange(40_000.0), "y": np.ones(40_000)}), path,
                   row_group_size=10_000)
    size = int(jl.ParquetSource(path)._group_bytes.max())
    for cache, shared in [(int(1.5 * size), True), (size // 2, False)]:
        source = _AskedToShare(path, cache_bytes=cache)
        source.asked = []
        x = source.__getitems__(np.arange(9_000, 12_000))["x"]
        assert np.array_equal(x, np.arange(9_000.0, 12_000.0))
        assert source.asked == [(0, shared), (1, shared)]
    with jl.DataLoader(jl.ParquetSource(path, cache_bytes=int(1.5 * size)), batch_size=3000,
                       num_workers=2, shuffle=False) as loader:
        x = np.concatenate([batch["x"] for batch in loader])
    assert np.array_equal(x, np.arange(len(x), dtype=np.float64))


def test_a_null_that_pandas_wrote_for_nan_is_told_how_to_keep_nan(tmp_path):
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"x": [1.0, np.nan, 3.0], "i": [1, 2, 3]}).to_parquet(tmp_path / "f.parquet")
    with pytest.raises(jl.ConfigError, match=r"'x' .* 1 null value.*pandas writes a float NaN "
                       r"as a null.*from_pandas=False"):
        jl.ParquetSource(str(tmp_path / "f.parquet"))
    pq.write_table(pa.table({"i": pa.array([1, None])}), tmp_path / "i.parquet")
    with pytest.raises(jl.ConfigError, match=r"'i' .* 1 null value") as ints:
        jl.ParquetSource(str(tmp_path / "i.parquet"))
    assert "NaN" not in str(ints.value)
    fixed = pa.chunked_array([pa.array([1.5, None])])  # (no footer's count: as decoded)
    from jaxloader.sources.arrow_columns import decode
    with pytest.raises(jl.ConfigError, match="NaN as a null"):
        decode(fixed, "v", "f.parquet")


def test_remote_files_are_opened_once_for_their_footer_and_once_a_read(gcs, monkeypatch):
    # each remote footer was read four times: twice where the source is made (its footer,
    # then its identity), twice at each open to read (its identity, then pyarrow's footer),
    # one open and a round trip each; the footers of many files were read one by one
    import fake_gcs

    root, _ = gcs
    (root / "bucket").mkdir()
    local = write_parts(root / "bucket")
    remote = [p.replace(str(root) + "/", "gs://") for p in local]
    reads: list[str] = []
    plain_open = fake_gcs.FakeGcs._open

    def counted_open(self, path, mode="rb", **kwargs):
        opened = plain_open(self, path, mode, **kwargs)
        read = opened.read

        def counted_read(*args):
            reads.append(path)
            return read(*args)

        opened.read = counted_read
        return opened

    monkeypatch.setattr(fake_gcs.FakeGcs, "_open", counted_open)
    fake_gcs.FakeGcs.opened.clear()
    source = jl.ParquetSource(remote)
    assert len(fake_gcs.FakeGcs.opened) == 3 and len(reads) == 3
    fake_gcs.FakeGcs.opened.clear()
    with jl.DataLoader(source, batch_size=16) as loader:
        ids = np.concatenate([batch["id"] for batch in loader])
    assert ids.tolist() == list(range(128)) and len(fake_gcs.FakeGcs.opened) == 3
    assert [i for _, i in source.file_identities()] == [
        i for _, i in jl.ParquetSource(local).file_identities()]
    # a file rewritten under the loader is still told when it is opened again, as changed,
    # also one cut short (a writer caught mid-rewrite: it was told as no Parquet file, unnamed)
    pq.write_table(pa.table({"id": np.arange(50)}), local[0])
    with pytest.raises(jl.RecordError, match=r"part-0.parquet' changed while the loader reads"):
        next(iter(jl.DataLoader(source, batch_size=16)))
    with open(local[0], "r+b") as cut:
        cut.truncate(os.path.getsize(local[0]) // 2)
    with pytest.raises(jl.RecordError, match=r"part-0.parquet' changed while the loader reads"):
        next(iter(jl.DataLoader(source, batch_size=16)))


def test_a_connection_error_is_told_as_the_storages_not_as_a_damaged_file(gcs, monkeypatch):
    # a connection reset reading a remote footer was told as "not a Parquet file ... copy it
    # again": nothing was wrong with the file
    import fake_gcs

    root, _ = gcs
    (root / "bucket").mkdir()
    remote = [p.replace(str(root) + "/", "gs://") for p in write_parts(root / "bucket")]

    plain_open = fake_gcs.FakeGcs._open
    source = jl.ParquetSource(remote)
    monkeypatch.setattr(fake_gcs.FakeGcs, "_open", fake_gcs.connection_reset)
    with pytest.raises(jl.RecordError, match=r"ParquetSource: 'gs://bucket/part-0.parquet': "
                       r"reading the file failed .*not the file; try again"):
        next(iter(jl.DataLoader(source, batch_size=4)))
    class ClientOSError(OSError):  # (aiohttp's: an OSError, no ConnectionError)
        pass

    def reset_after_the_footer(self, path, mode="rb", **kwargs):  # (a read of rows: reset)
        opened = plain_open(self, path, mode, **kwargs)
        read, reads = opened.read, []

        def failing(*args):
            reads.append(1)
            if len(reads) > 1:
                raise ClientOSError(errno.ETIMEDOUT, "Connection timed out")
            return read(*args)

        opened.read = failing
        return opened

    monkeypatch.setattr(fake_gcs.FakeGcs, "_open", reset_after_the_footer)
    with pytest.raises(jl.RecordError, match=r"ParquetSource: 'gs://bucket/part-0.parquet': "
                       r"reading row group 0 failed \(ClientOSError: .*Connection timed out\): the "
                       r"storage or the network failed"):
        next(iter(jl.DataLoader(source, batch_size=4)))
    monkeypatch.setattr(fake_gcs.FakeGcs, "_open", fake_gcs.connection_reset)
    with pytest.raises(ConnectionResetError, match=r"ParquetSource: 'gs://bucket/part-0.parquet'"
                       r": reading its footer failed \(ConnectionResetError: .*the storage or "
                       r"the network failed, not the file; try again"):
        jl.ParquetSource(remote)


def test_a_footer_longer_than_one_read_gives_the_same_identity_and_footer(tmp_path):
    from jaxloader.base import file_identity
    from jaxloader.sources.parquet_files import remote_footer

    path = str(tmp_path / "wide.parquet")
    pq.write_table(pa.table({f"column_{i}": [i] for i in range(1500)}), path)
    with open(path, "rb") as raw:
        raw.seek(-8, 2)
        length = int.from_bytes(raw.read(4), "little")
        raw.seek(-8 - length, 2)
        footer = raw.read(length)
        assert length > 64 << 10
        raw.seek(-8 - length - 1024, 2)
        before = raw.read(1024)  # (the data's last KiB: rows moved within it change it)
        meta, identity = remote_footer(raw)
    assert identity == file_identity.parquet(path) == [os.path.getsize(path), zlib.crc32(footer),
                                                       zlib.crc32(before)]
    assert meta.num_columns == 1500 and meta.equals(pq.read_metadata(path))
    with open(path, "wb") as tiny:  # (under a footer's 8 bytes: pyarrow says so, of 4 bytes)
        tiny.write(b"PAR1")
    with open(path, "rb") as raw, pytest.raises(Exception, match=r"size is 4 bytes"):
        remote_footer(raw)


def test_an_error_about_a_record_names_its_file_and_row_there(tmp_path):
    # (a damaged image at row 4 of the second file was named "source index 54" alone: the
    # user had to add up the files' row counts to find it)
    paths = write_parts(tmp_path)
    source = jl.ParquetSource(paths)
    assert source.record_origin(0) == f"{paths[0]} row 0"
    assert source.record_origin(54) == f"{paths[1]} row 4"  # (its row group 0, of 16)
    assert source.record_origin(127) == f"{paths[2]} row 40"

    def decode(r):
        if r["id"] == 70:
            raise ValueError("truncated image")
        return r

    parts = jl.ConcatSource([jl.ParquetSource(paths[:1]), jl.ParquetSource(paths[1:])])
    loader = jl.DataLoader(parts, batch_size=8, transforms=[jl.Map(decode)])
    with pytest.raises(jl.RecordError, match=rf"\({paths[1]} row 20\): transforms\[0\]"):
        list(loader)


def test_a_state_under_other_columns_is_refused_naming_them(tmp_path):
    # (a recsys run that added a feature column was told of "a function it runs ... or its
    # data": columns= is part of a ParquetSource's fingerprint)
    paths = write_parts(tmp_path)
    with jl.DataLoader(jl.ParquetSource(paths, columns=["id", "text"]), batch_size=8) as loader:
        state = loader.state_dict()
    for columns in (["id", "text", "vector"], ["text", "id"]):
        with jl.DataLoader(jl.ParquetSource(paths, columns=columns), batch_size=8) as loader:
            with pytest.raises(jl.StateDictError, match=r"a ParquetSource's columns=, in their "
                                                        r"order"):
                loader.load_state_dict(state)


def test_a_part_file_of_no_rows_whose_text_column_has_no_type_is_read_with_the_others(tmp_path):
    # (pandas writes an empty frame's object column as type null: the whole dataset refused
    # as "another schema", for a file that adds no record)
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"row": np.arange(5), "s": list("abcde")}).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame({"row": pd.Series([], dtype="int64"), "s": pd.Series([], dtype=object)}
                 ).to_parquet(tmp_path / "b.parquet")
    for order in ("ab", "ba"):  # (the empty part first too: its schema is not the one)
        source = jl.ParquetSource([str(tmp_path / f"{name}.parquet") for name in order])
        assert len(source) == 5 and source[4]["s"] == "e"
    pd.DataFrame({"row": [9], "s": [None]}).to_parquet(tmp_path / "c.parquet")  # (rows: no)
    with pytest.raises(jl.ConfigError, match=r"another schema than the first file with rows: s: \w*string"):
        jl.ParquetSource([str(tmp_path / "a.parquet"), str(tmp_path / "c.parquet")])


def test_a_column_twice_all_null_or_in_a_later_file_only_is_refused_naming_the_files(tmp_path):
    # pyarrow's bare KeyError ("does not exist") for a column held twice, named no file; an
    # all-None column (Arrow's null type) was refused at its first row group, epochs in; a
    # column the first file lacks blamed columns= where the files' schemas differ (the
    # Parquet audit)
    pq.write_table(pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["a", "a"]),
                   tmp_path / "dup.parquet")
    pq.write_table(pa.table({"x": [1, 2], "n": pa.array([None, None], pa.null())}),
                   tmp_path / "null.parquet")
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"x": [1, 2], "y": [5, 6]}), tmp_path / "c.parquet")
    with pytest.raises(jl.ConfigError, match=r"dup.parquet' holds the column 'a' 2 times .*"
                                             r"rename_columns"):
        jl.ParquetSource(tmp_path / "dup.parquet")
    with pytest.raises(jl.ConfigError, match=r"column 'n' of '.*null.parquet' is of Arrow type "
                                             r"null .*leave it out with columns="):
        jl.ParquetSource(tmp_path / "null.parquet")
    assert len(jl.ParquetSource(tmp_path / "null.parquet", columns=["x"])) == 2
    pq.write_table(pa.table({"n": pa.array([], pa.null())}), tmp_path / "none.parquet")
    assert len(jl.ParquetSource(tmp_path / "none.parquet")) == 0  # (no rows: as before)
    with pytest.raises(jl.ConfigError, match=r"\['y'\] not in '.*b.parquet', whose columns are "
                                             r"\['x'\], though '.*c.parquet' holds them: the "
                                             r"files' schemas differ"):
        jl.ParquetSource([tmp_path / "b.parquet", tmp_path / "c.parquet"], columns=["y"])
    # (the review: a column twice in a later file was still a KeyError; a column of no values
    # in the first file and of values in another is the files' schemas differing)
    pq.write_table(pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["x", "x"]),
                   tmp_path / "dup2.parquet")
    with pytest.raises(jl.ConfigError, match=r"dup2.parquet' holds the column 'x' 2 times"):
        jl.ParquetSource([tmp_path / "b.parquet", tmp_path / "dup2.parquet"], columns=["x"])
    pq.write_table(pa.table({"x": [3], "n": ["z"]}), tmp_path / "values.parquet")
    with pytest.raises(jl.ConfigError, match=r"another schema than the first file with rows: "
                                             r"n: null in "):
        jl.ParquetSource([tmp_path / "null.parquet", tmp_path / "values.parquet"])


def test_a_struct_field_held_twice_is_refused_not_its_first_values_lost(tmp_path):
    # struct<a, a>: the records held {"a": the second field's values}, the first's gone
    # without a word (the sources audit); in a list of structs too
    twice = pa.StructArray.from_arrays([pa.array([1, 2]), pa.array([30, 40])], names=["a", "a"])
    listed = pa.ListArray.from_arrays(pa.array([0, 1, 2], pa.int32()), twice)
    pq.write_table(pa.table({"s": twice, "l": listed, "x": [5, 6]}), tmp_path / "dup.parquet")
    with pytest.raises(jl.ConfigError, match=r"column 'l' of '.*dup.parquet' holds the struct "
                                             r"field 'l\[\].a' 2 times .* leave the column out"):
        jl.ParquetSource(tmp_path / "dup.parquet", columns=["x", "l"])
    with pytest.raises(jl.ConfigError, match=r"column 's' .* field 's.a' 2 times"):
        jl.ParquetSource(tmp_path / "dup.parquet", columns=["s"])
    assert jl.ParquetSource(tmp_path / "dup.parquet", columns=["x"])[1] == {"x": 6}


def test_a_file_of_no_rows_may_hold_other_columns_or_types(tmp_path):
    # (an empty part of a folder, written from an empty frame of its own dtypes, was refused
    # as the files' schemas differing, and neither remedy named worked for it: a source of it
    # alone is empty, and the files shared no column; the CSV audit)
    pq.write_table(pa.table({"x": np.arange(5, dtype=np.int64)}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"x": pa.array([], pa.int32())}), tmp_path / "e32.parquet")
    pq.write_table(pa.table({"y": pa.array([], pa.string())}), tmp_path / "ey.parquet")
    names = ["e32", "b", "ey"]
    source = jl.ParquetSource([str(tmp_path / f"{n}.parquet") for n in names])
    assert source.columns == ["x"] and len(source) == 5
    for workers in (0, 2):
        with jl.DataLoader(source, batch_size=2, shuffle=True, num_workers=workers,
                           last_batch="partial") as loader:
            ids = np.concatenate([b["x"] for b in loader])
        assert sorted(ids.tolist()) == list(range(5)) and ids.dtype == np.int64


def test_lengths_read_the_type_in_the_first_file_with_rows_and_pass_empty_ones_over(tmp_path):
    # the column's type was read from the first file, an empty part of no type there (or with
    # no such column), and lengths() refused a column of lists the source read as lists
    pq.write_table(pa.table({"tok": pa.array([], pa.null())}), tmp_path / "a0.parquet")
    pq.write_table(pa.table({"other": pa.array([], pa.int64())}), tmp_path / "a1.parquet")
    pq.write_table(pa.table({"tok": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int64()))}),
                   tmp_path / "b.parquet")
    for first in ("a0", "a1"):
        source = jl.ParquetSource([str(tmp_path / f"{first}.parquet"),
                                   str(tmp_path / "b.parquet")])
        assert source.lengths("tok").tolist() == [2, 1, 3]
        assert jl.PackedSource(source, "tok", 4)[0]["tok"].tolist() == [4, 5, 6, 3]


def test_columns_given_as_a_set_are_refused_with_the_list_to_pass(tmp_path):
    # a set's order is the hash seed's: the batch's keys and the fingerprint changed from run
    # to run, and a state saved in one run was refused in the next
    pq.write_table(pa.table({"b": [1], "a": [2], "c": [3]}), tmp_path / "f.parquet")
    with pytest.raises(jl.ConfigError, match=r"got a set, \['a', 'b'\], whose order differs "
                                             r"from run to run.*columns=\['a', 'b'\]"):
        jl.ParquetSource(str(tmp_path / "f.parquet"), columns={"b", "a"})
    assert jl.ParquetSource(str(tmp_path / "f.parquet"), columns={"c"})[0] == {"c": 3}
    # a column named twice: read once, said twice in the repr (the API audit)
    with pytest.raises(jl.ConfigError, match=r"columns=...\): 'a' is named twice in "
                                             r"\['a', 'c', 'a'\]; name each column once"):
        jl.ParquetSource(str(tmp_path / "f.parquet"), columns=["a", "c", "a"])


def test_times_in_a_zone_are_refused_naming_it_and_utcs_are_read_exactly(tmp_path):
    # a column of times in New York's zone came out as UTC's datetime64 (09:00 read 14:00),
    # without a word, where an ArraySource of the same frame refuses it; UTC's (Spark's) are
    # NumPy's datetime64 exactly
    path = str(tmp_path / "t.parquet")
    at = pa.array([1_704_117_600_000_000], pa.timestamp("us", tz="America/New_York"))
    for table in (pa.table({"t": at}), pa.table({"t": pa.array([[v] for v in at.to_pylist()],
                                                                pa.list_(at.type))})):
        pq.write_table(table, path)
        with pytest.raises(jl.ConfigError, match=r"column 't' of .*t.parquet' holds times in the "
                                                 r"zone 'America/New_York' .*tz_convert\('UTC'\)"):
            jl.ParquetSource(path)
    for utc in ("UTC", "Etc/GMT", "Zulu", "+00:00"):  # (names of UTC's: read as they are)
        pq.write_table(pa.table({"t": at.cast(pa.timestamp("us", tz=utc)), "x": [1]}), path)
        assert jl.ParquetSource(path)[0]["t"] == np.datetime64("2024-01-01T14:00:00", "us")
    assert jl.ParquetSource(path, columns=["x"])[0] == {"x": 1}
