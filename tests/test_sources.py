from __future__ import annotations

import os
import re
import time
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sources import check_source


def test_array_source_records_and_vectorised_reads():
    src = jl.ArraySource({"img": np.arange(24).reshape(6, 4), "nested": (np.arange(6) * 2,)})
    assert len(src) == 6 and isinstance(src, jl.Source)
    assert src[2]["img"].tolist() == [8, 9, 10, 11] and src[2]["nested"][0] == 4
    batch = src.__getitems__(np.array([5, 0]))
    assert batch["img"].shape == (2, 4) and batch["nested"][0].tolist() == [10, 0]


def second_batch_and_its_peak(loader):
    """The loader's second batch and the most memory this process allocated making it."""
    import tracemalloc

    it = iter(loader)
    next(it)
    tracemalloc.start()
    try:
        return next(it), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_windows_of_a_series_are_gathered_without_copying_every_window(num_workers):
    # take() made a strided view (sliding_window_view's windows, troubleshooting.md's recipe)
    # contiguous first, every batch: 128 MiB of windows copied for a batch of 128 KiB
    series = np.arange(32_768 * 32, dtype=np.float32).reshape(32_768, 32)  # 4 MiB
    windows = np.lib.stride_tricks.sliding_window_view(series, 32, axis=0)  # 128 MiB's view
    src = jl.ArraySource({"x": windows})
    assert src.__getitems__(np.array([7, 3]))["x"].tolist() == [windows[7].tolist(),
                                                                windows[3].tolist()]
    with jl.DataLoader(src, batch_size=32, shuffle=True, num_workers=num_workers) as loader:
        batch, peak = second_batch_and_its_peak(loader)
    first = batch["x"][0]
    assert np.array_equal(first, series[int(first[0, 0]) // 32:][:32].T)
    assert peak < 16 * 2**20, peak  # (the batch is 128 KiB; the windows 128 MiB)


def test_large_records_under_a_wrapper_are_read_as_views_not_copied_whole():
    # a FilteredSource, MapSource or mixture over volumes read a batch through __getitems__,
    # copying every volume whole before a RandomMap cut a patch of each; a filter's pass read
    # 4,096 whole volumes at a time (the medical imaging audit)
    volumes = jl.ArraySource({"v": np.arange(8 * 64**3, dtype=np.float32).reshape(8, 64, 64, 64)})

    def patch(r, rng):
        z = int(rng.integers(0, 56))
        return {"p": np.array(r["v"][z:z + 8, :8, :8])}

    for source in (jl.FilteredSource(volumes, indices=np.arange(8)),
                   jl.MapSource(volumes, lambda r: r), jl.ConcatSource([volumes, volumes]),
                   jl.FilteredSource(volumes, lambda r: r["v"][0, 0, 0] >= 0)):
        with jl.DataLoader(source, batch_size=4, transforms=[jl.RandomMap(patch)]) as loader:
            batch, peak = second_batch_and_its_peak(loader)
        assert batch["p"].shape == (4, 8, 8, 8) and peak < 2**20, (source, peak)  # (4 MiB)


def test_a_batched_map_source_over_large_records_gets_the_batch_a_call():
    # read one by one as views, a MapSource(batched=True)'s function got one-row batches from
    # 256 KiB records on when a loader had a transform: a function of the batch (centring by
    # its mean, a tokenizer's vectorised call) gave other data, or ran once a row
    calls = []

    def centre(batch):
        calls.append(len(batch["x"]))
        return {"x": batch["x"] - batch["x"].mean(axis=0, keepdims=True)}

    x = np.zeros((8, 2**16), np.float32)  # 256 KiB a record
    x[:, 0] = np.arange(8)
    source = jl.MapSource(jl.ArraySource({"x": x}), centre, batched=True)
    with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(lambda r: r)]) as loader:
        first = next(iter(loader))["x"][:, 0]
    assert first.tolist() == [-1.5, -0.5, 0.5, 1.5] and calls == [4]


@pytest.mark.parametrize("transforms", [[jl.Map(lambda r: r)], [jl.Pad("x", length=20)]])
def test_a_memory_mapped_file_changed_in_place_is_refused_under_record_transforms(
        tmp_path, transforms, monkeypatch):
    # records read one by one (a Map, a Pad) went past the check of the batched read: a file
    # rewritten was read as it now is, batch after batch, and one cut ended the process by
    # SIGBUS (the file sources audit)
    from jaxloader.base import mapped_files  # (a stat slow on a loaded machine: checked 1% of
    monkeypatch.setattr(mapped_files, "_CHEAP_S", 1.0)  # the time, in process)
    path = tmp_path / "x.npy"
    np.save(path, np.arange(4096 * 16, dtype=np.float32).reshape(4096, 16))
    source = jl.ArraySource({"x": np.load(path, mmap_mode="r")})
    with jl.DataLoader(source, batch_size=4, shuffle=False, num_workers=0,
                       transforms=transforms, process_index=0, process_count=1) as loader:
        batches = iter(loader)
        assert next(batches)["x"][0, 1] == 1
        np.save(path, -np.ones((4096, 16), np.float32))
        with pytest.raises(jl.RecordError, match=r"x.npy' changed in place"):
            next(batches)
    time.sleep(0.05)  # (a record read outside a loader: looked at, at most every 10 ms)
    with pytest.raises(jl.RecordError, match=r"x.npy' changed in place"):
        source[5]

@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_memory_mapped_file_changed_in_place_is_refused_at_the_next_batch(tmp_path, num_workers,
                                                                            monkeypatch):
    # cut while read: num_workers=0 ended the trainer by SIGBUS, printing nothing; rewritten
    # to the same size: a batch mixed the two versions without a word
    from jaxloader.base import mapped_files  # (a stat slowed past 50 us on a loaded machine:
    monkeypatch.setattr(mapped_files, "_CHEAP_S", 1.0)  # checked 1% of the time, in process)
    path = tmp_path / "x.npy"
    np.save(path, np.arange(4096 * 16, dtype=np.float32).reshape(4096, 16))
    loader = jl.DataLoader(jl.ArraySource({"x": np.load(path, mmap_mode="r")}), batch_size=4,
                           shuffle=False, num_workers=num_workers, prefetch=1,
                           process_index=0, process_count=1)
    with loader:
        batches = iter(loader)
        assert next(batches)["x"][0, 1] == 1
        next(batches)  # (step 1 is worker 1's: each worker has mapped the file; one still
        # starting as it is cut dies "while starting, exit code 0", not named: left to do)
        np.save(path, -np.ones((4096, 16), np.float32))  # (np.save: opened "wb", cut first)
        refused = r"memory-mapped file '.*x.npy' changed in place .*rename it over \(os.replace\)"
        with pytest.raises(jl.JaxloaderError, match=refused + (  # (a worker in a batch as the
                r"|SIGBUS: memory it mapped lost its pages: a memory-mapped file" if  # file is
                num_workers else "")):  # cut, past its check: dies, the cause named; half the runs)
            for _ in range(1024):  # (the workers may have made a few batches ahead)
                next(batches)
    writable = np.lib.format.open_memmap(tmp_path / "buffer.npy", "w+", np.float32, (8, 2))
    batches = iter(jl.DataLoader(jl.ArraySource({"x": writable}), batch_size=4, shuffle=False,
                                 process_index=0, process_count=1))
    next(batches)
    writable[4:] = 7  # (a replay buffer the user writes: read as written, not refused)
    writable.flush()
    assert next(batches)["x"].tolist() == [[7, 7]] * 4
    tokens = tmp_path / "train.bin"  # (a token file another job appends to: read as mapped,
    np.arange(64, dtype=np.uint16).tofile(tokens)  # warned of once; it was refused)
    batches = iter(jl.DataLoader(jl.ArraySource({"t": np.memmap(tokens, np.uint16, "r")}),
                                 batch_size=4, shuffle=False, process_index=0, process_count=1))
    next(batches)
    with open(tokens, "ab") as f:
        f.write(np.arange(64, dtype=np.uint16).tobytes())
    with pytest.warns(jl.JaxloaderWarning, match=r"train.bin' grew since the source was made "
                                                 r"\(128 bytes then, 256 now\)"):
        assert next(batches)["t"].tolist() == [4, 5, 6, 7]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [b["t"][0] for b in batches] == list(range(8, 64, 4))
    np.save(path, np.zeros((8, 16), np.float32))  # (a .npy grown: written again, refused)
    batches = iter(jl.DataLoader(jl.ArraySource({"x": np.load(path, mmap_mode="r")}),
                                 batch_size=4, shuffle=False, process_index=0, process_count=1))
    next(batches)
    np.save(path, np.ones((16, 16), np.float32))
    with pytest.raises(jl.RecordError, match=r"x.npy' changed in place .*\(640 bytes then, "
                                             r"1,152 now"):
        next(batches)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_ragged_values_mapped_from_a_file_changed_in_place_are_refused(tmp_path, packed,
                                                                       num_workers, monkeypatch):
    # read through np.load(mmap_mode="r"): rewritten in place, batches mixed versions without
    # a word; cut shorter, the process died by SIGBUS (in process: printing nothing)
    from jaxloader.base import mapped_files  # (a stat slowed past 50 us on a loaded machine:
    monkeypatch.setattr(mapped_files, "_CHEAP_S", 1.0)  # checked 1% of the time, in process)
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(4096, dtype=np.int32))
    source = jl.RaggedSource({"ids": (np.load(path, mmap_mode="r"),
                                      np.arange(0, 4097, 16))})
    if packed:
        source = jl.PackedSource(source, "ids", 32)
    with jl.DataLoader(source, batch_size=2, shuffle=False, num_workers=num_workers,
                       process_index=0, process_count=1) as loader:
        batches = iter(loader)
        assert next(batches)["ids"].min() >= 0
        time.sleep(0.05)  # (a file's time ticks every few ms: a rewrite of the same size in
        np.save(path, -np.arange(4096, dtype=np.int32))  # the tick it was made is not seen)
        refused = r"RaggedSource: the memory-mapped file '.*tokens.npy' changed in place"
        with pytest.raises(jl.JaxloaderError, match=refused + (  # (a worker in a batch as the
                r"|SIGBUS: memory it mapped lost its pages: a memory-mapped file" if  # file is
                num_workers else "")):  # cut, past its check: dies, the cause named)
            for _ in range(64):  # (the workers may have made a few batches ahead, and one
                # may read the file as it is rewritten, after its check: in process, none)
                assert next(batches)["ids"].min() >= 0 or num_workers
    with jl.DataLoader(source, batch_size=2, shuffle=False, process_index=0,
                       process_count=1) as loader:  # (a source made before: refused again)
        with pytest.raises(jl.RecordError, match=refused):
            next(iter(loader))
    np.save(path, np.arange(4096, dtype=np.int32))
    made = jl.RaggedSource({"ids": (np.load(path, mmap_mode="r"), np.arange(0, 4097, 16))})
    with open(path, "r+b") as f:
        f.truncate(256)  # (cut: refused before a read past its end)
    with pytest.raises(jl.RecordError, match=r"\(16,512 bytes then, 256 now"):
        made[200]


def test_a_file_cut_between_its_mapping_and_the_source_is_refused_as_the_source_is_made(tmp_path):
    # np.load(mmap_mode="r"), then np.save of a smaller array over it (another cell), then the
    # source: stamped as cut, nothing later saw it, and the first read past the file's end
    # killed the process (SIGBUS) without a word, in process
    path = tmp_path / "x.npy"
    np.save(path, np.arange(4096, dtype=np.int64))
    mapped = np.load(path, mmap_mode="r")
    np.save(path, np.arange(1024, dtype=np.int64))
    cut = (r"the memory-mapped file '.*x.npy' holds 8,320 bytes, fewer than the 32,896 mapped "
           r"from it \(int64 \((3996|4096),\)\): .*SIGBUS.*np.load\(path, mmap_mode='r'\)")
    with pytest.raises(jl.ConfigError, match="ArraySource: " + cut):
        jl.ArraySource({"x": mapped[100:]})  # (a view: its file's whole array is checked)
    with pytest.raises(jl.ConfigError, match="RaggedSource: " + cut):
        jl.RaggedSource({"ids": (mapped, np.arange(0, 4097, 16))})
    whole = np.load(path, mmap_mode="r")  # (mapped again: read)
    assert jl.ArraySource({"x": whole})[1023]["x"] == 1023


def test_a_costly_check_of_mapped_files_waits_a_hundred_times_its_time(tmp_path, monkeypatch):
    # thousands of a dataset's files on a network file system were stat-ed each batch
    from jaxloader.base import mapped_files

    path = tmp_path / "a.arrow"
    path.write_bytes(b"0" * 64)
    files = mapped_files.MappedFiles("a source", paths=[str(path)])
    times = iter([0.0, 1e-5,  # (a check of 10 us, cheap: each time; a real clock on a loaded
                  10.0, 11.0,  # machine was not) (one of 1 s, after a cheap one: the OS's
                  20.0, 21.5,  # doing, each time still) (a second: from 20 + 1.5 + 100 s)
                  60.0, 122.0])
    monkeypatch.setattr(mapped_files, "perf_counter", lambda: next(times))
    files.check()
    files.check()
    assert files._next_at == 0.0
    files.check()
    path.write_bytes(b"1" * 32)
    files.check()  # (at 60 s: not looked at)
    with pytest.raises(jl.RecordError, match=r"a.arrow' changed in place .*64 bytes then, 32"):
        files.check()  # (at 122 s)


def test_one_slow_check_of_mapped_files_skips_none_after_it(tmp_path, monkeypatch):
    # a check the OS preempted (20 ms) skipped the checks of the next 2 s: a file cut then
    # was read, and killed the process by SIGBUS without a word (the data audit)
    from jaxloader.base import mapped_files

    path = tmp_path / "a.arrow"
    path.write_bytes(b"0" * 64)
    files = mapped_files.MappedFiles("a source", paths=[str(path)])
    times = iter([0.0, 0.02, 0.03])
    monkeypatch.setattr(mapped_files, "perf_counter", lambda: next(times))
    files.check()
    path.write_bytes(b"1" * 32)
    with pytest.raises(jl.RecordError, match=r"a.arrow' changed in place .*64 bytes then, 32"):
        files.check()  # (at 30 ms)


def test_a_file_of_many_mapped_ones_changed_between_passes_is_refused(tmp_path):
    # 40 local files took a check over 50 us: the next ones were skipped for 100 times that,
    # and a file cut as a pass ended was read by the next pass's first batches: a SIGBUS, in
    # process without a word (rewritten in place, as here: batches of the new data, unseen)
    leaves = {}
    for k in range(100):
        np.save(tmp_path / f"x{k}.npy", np.full((16, 4), k, np.float32))
        leaves[f"x{k}"] = np.load(tmp_path / f"x{k}.npy", mmap_mode="r")
    with jl.DataLoader(jl.ArraySource(leaves), batch_size=8, shuffle=False, num_workers=0,
                       process_index=0, process_count=1) as loader:
        assert [b["x7"][0, 0] for b in loader] == [7.0, 7.0]
        stamp = os.stat(tmp_path / "x7.npy").st_mtime_ns
        with open(tmp_path / "x7.npy", "r+b") as f:  # (in place: its inode and size kept)
            f.seek(-4, os.SEEK_END)
            f.write(np.float32(-1).tobytes())
        os.utime(tmp_path / "x7.npy", ns=(stamp + 10**9, stamp + 10**9))
        with pytest.raises(jl.RecordError, match=r"x7.npy' changed in place"):
            next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_array_subclasses_batch_as_plain_arrays_with_any_worker_count(num_workers):
    # a recarray's batch was a recarray in process and an ndarray from workers (b["r"].a failed
    # with 2 workers only), a matrix's (4, 2) or (4, 1, 2) by whether a Map ran, and a recarray
    # was pickled whole into each worker (a plain array is shared once; the interop audit)
    rec = np.rec.fromarrays([np.arange(8), np.arange(8.0)], names="a,b")
    with warnings.catch_warnings():  # (NumPy's own: the matrix subclass is not recommended)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        tree = {"r": rec, "m": np.matrix(np.arange(16).reshape(8, 2))}
    assert all(type(a) is np.ndarray for a in jl.ArraySource(tree).arrays)
    for transforms in ([], [jl.Map(lambda r: r)]):
        with jl.DataLoader(jl.ArraySource(tree), batch_size=4, num_workers=num_workers,
                           transforms=transforms) as loader:
            batch = next(iter(loader))
        assert type(batch["r"]) is type(batch["m"]) is np.ndarray
        assert batch["m"].shape == (4, 2) and batch["r"]["a"].tolist() == [0, 1, 2, 3]


def test_array_source_leaves_of_different_lengths():
    with pytest.raises(jl.ConfigError, match=r"same number of records.*\['a'\]: 3.*\['b'\]: 4"):
        jl.ArraySource({"a": np.zeros(3), "b": np.zeros(4)})
    volumes = [np.zeros((12, 4, 4)), np.zeros((10, 4, 4))]  # (a list of volumes: told to
    with pytest.raises(jl.ConfigError, match=r"a list of arrays is a node .*np.stack"):
        jl.ArraySource({"image": volumes, "case": np.arange(2)})  # slice them)
    images = [np.zeros((64, 64), np.uint8)] * 1000  # (of one shape: 64 records of 1,000
    for tree in ({"image": images}, images):  # leaves, in silence; the errors audit)
        with pytest.warns(jl.JaxloaderWarning, match=r"is a list of 1,000 arrays \(the first of "
                          r"shape \(64, 64\)\).*64 records of 1,000 leaves each.*np.stack\(arrays"
                          r"\).*name them in a dict") as said:  # (warned: a state saved over a
            jl.ArraySource(tree)  # list of few rows' columns still restores; the upgrade audit)
        assert said[0].filename == __file__
    assert len(jl.ArraySource({"columns": [np.zeros(100)] * 20})) == 100  # (as it reads)
    assert len(jl.ArraySource([np.zeros(10)] * 20)) == 10  # (20 sensors' columns of 10 rows:
    assert len(jl.ArraySource({i: np.zeros(10) for i in range(20)})) == 10  # the review)
    assert len(jl.ArraySource([np.zeros((3, 2))] * 2)) == 3  # ((X, y) as a list)


def test_array_source_rejects_scalars_and_objects():
    with pytest.raises(jl.ConfigError, match=r"\['a'\]"):
        jl.ArraySource({"a": np.float32(3)})
    with pytest.raises(jl.ConfigError, match="numbers or fixed-width strings"):
        jl.ArraySource([np.array([{"a": 1}, None], dtype=object)])
    # an object array of str (from pandas, or dtype=object): the fixes a user can take
    with pytest.raises(jl.ConfigError, match=r"\['t'\].*dtype object; for strings, "
                                             r"np.asarray\(leaf, dtype=str\).*list of records"):
        jl.ArraySource({"t": np.array(["a", "bb"], dtype=object)})
    fixed = jl.ArraySource({"t": np.asarray(np.array(["a", "bb"], dtype=object), dtype=str)})
    assert fixed[1]["t"] == "bb"


def test_empty_and_non_sources():
    with pytest.raises(jl.ConfigError, match="empty source"):
        check_source(jl.ArraySource({"a": np.zeros((0, 3))}))
    with pytest.raises(jl.ConfigError, match="__len__ and __getitem__.*is a stream: jaxloader"):
        check_source(iter([1, 2]))

    class StoreArray:  # (a zarr array: shape and [i], no __len__; told to wrap it whole)
        shape = (10**9, 64)

        def __getitem__(self, i):
            return np.zeros(64)

    with pytest.raises(jl.ConfigError, match=r"an array of a store \(zarr, HDF5\): a source of "
                                             r"your own .*ArraySource\(array\) reads it whole"):
        check_source(StoreArray())


def test_a_dict_passed_as_the_source_gets_the_array_source_hint():
    with pytest.raises(jl.ConfigError, match=r"dict of 2 entries.*'x', 'y'.*ArraySource"):
        jl.DataLoader({"x": np.zeros((10, 3)), "y": np.zeros(10)}, batch_size=4,
                      process_index=0, process_count=1)
    with pytest.raises(jl.ConfigError, match=r"dict of 1 entries.*ArraySource"):
        check_source({"x": [1.0, 2.0]})  # lists are columns too, not splits
    with pytest.raises(jl.ConfigError, match=r"pass one of them: source\['train'\]"):
        check_source({"train": jl.ArraySource({"x": np.zeros(3)})})  # sources by split
    with pytest.raises(jl.ConfigError, match=r"dict of 3 entries \(0, 1, 2\).*for records keyed "
                                             r"by their index, pass a list of them in order"):
        check_source({i: {"a": i} for i in range(3)})  # (told "pass one: source[0]", a record)


def test_a_tuple_of_columns_passed_as_the_source_gets_the_array_source_hint():
    x, y = np.zeros((10, 3)), np.arange(10)
    with pytest.raises(jl.ConfigError, match=r"tuple of 2 arrays of shapes \(10, 3\), \(10,\).*"
                                             r"read as 2 records.*10 rows.*ArraySource"):
        jl.DataLoader((x, y), batch_size=4, process_index=0, process_count=1)
    with pytest.raises(jl.ConfigError, match=r"tuple of 3 arrays"):
        check_source((x, y, y[:, None]))
    # of one shape too (a language model's inputs and targets): they were read as 2 records,
    # and with batch_size=2 or last_batch="partial" the "batch" was the two whole arrays
    with pytest.raises(jl.ConfigError, match=r"tuple of 2 arrays of shapes \(10, 3\), \(10, "
                                             r"3\).*ArraySource\(your_tuple\) \(for whole "
                                             r"arrays as records, pass a list of them\)"):
        jl.DataLoader((x, x), batch_size=2, process_index=0, process_count=1)
    # records that are arrays stay records: of different lengths, or in a list
    assert check_source((np.zeros(3), np.zeros(5))) == 2 and check_source([x, x]) == 2
    assert check_source([np.zeros((32, 40, 3)), np.zeros((32, 50, 3))]) == 2
    with jl.DataLoader(jl.ArraySource((x, y)), batch_size=4, process_index=0,
                       process_count=1) as loader:
        first = next(iter(loader))
    assert first[0].shape == (4, 3) and first[1].tolist() == [0, 1, 2, 3]



def test_a_data_frame_is_read_by_row_position_as_a_dict_of_its_columns():
    pd = pytest.importorskip("pandas")  # installed with datasets (the test extra)
    frame = pd.DataFrame({"age": np.arange(10), "income": np.linspace(0, 1, 10, dtype="f4"),
                          7: np.arange(10) % 2 == 0})
    kept = frame[frame["age"] % 3 != 0]  # row labels 1, 2, 4, 5, 7, 8: not positions
    with pytest.raises(jl.ConfigError, match=r"pandas DataFrame of 6 rows.*label.*"
                                             r"ArraySource\(your_dataframe\)"):
        jl.DataLoader(kept, batch_size=2, process_index=0, process_count=1)
    with pytest.raises(jl.ConfigError, match=r"pandas Series of 6 rows.*ArraySource"):
        check_source(kept["age"])
    for workers in (0, 2):
        with jl.DataLoader(jl.ArraySource(kept), batch_size=3, num_workers=workers,
                           process_index=0, process_count=1) as loader:
            batches = [{k: v.copy() for k, v in b.items()} for b in loader]
        assert [b["age"].tolist() for b in batches] == [[1, 2, 4], [5, 7, 8]]
        assert batches[0]["income"].dtype == np.float32 and batches[0]["7"].dtype == bool
    assert jl.ArraySource(kept["age"])[0] == 1  # a Series: its values


def test_a_data_frame_column_that_is_not_numbers_is_named_with_the_remedy():
    pd = pytest.importorskip("pandas")
    with pytest.raises(jl.ConfigError, match=r"column 'text' has dtype .*expected numbers.*"
                                             r"Dataset.from_pandas"):
        jl.ArraySource(pd.DataFrame({"id": [1, 2], "text": ["a", "bb"]}))
    with pytest.raises(jl.ConfigError, match=r"column 'text' has dtype .*Dataset.from_pandas"):
        jl.ArraySource(pd.DataFrame({"text": ["a", None]}))  # (a missing one: still strings)
    zoned = pd.DataFrame({"t": pd.date_range("2020-01-01", periods=2, freq="h", tz="UTC")})
    with pytest.raises(jl.ConfigError, match=r"column 't' has dtype datetime64\[\w+, UTC\].*"
                                             r"drop the zone \(df\['t'\].dt.tz_convert\(None\)"):
        jl.ArraySource(zoned)  # (it was told to encode times as categories' codes)
    zoned["t"] = zoned["t"].dt.tz_convert(None)
    assert jl.ArraySource(zoned)[1]["t"] == np.datetime64("2020-01-01T01:00")
    for leaf, drop in ((zoned_times := pd.Series(pd.date_range(  # a Series or an Index as a
            "2020-01-01", periods=2, freq="h", tz="Asia/Tokyo")), "s.dt.tz_convert"),  # leaf: it
                       (pd.DatetimeIndex(zoned_times), "idx.tz_convert")):  # was told to keep
        with pytest.raises(jl.ConfigError, match=rf"leaf \['t'\] has dtype datetime64\[\w+, "
                                                 rf"Asia/Tokyo\], whose zone.*{drop}\(None\)"):
            jl.ArraySource({"t": leaf})  # objects in a source of its own, not of the zone
    with pytest.raises(jl.ConfigError, match=r"names must differ, got \['a', 'a'\]"):
        jl.ArraySource(pd.DataFrame([[1, 2]], columns=["a", "a"]))
    atoms = pd.DataFrame({"pos": [np.zeros((3, 3)), np.zeros((2, 3))]})  # (told to encode it
    with pytest.raises(jl.ConfigError, match=r"an array a row .* df.to_dict\('records'\)"):
        jl.ArraySource(atoms)  # as categories' codes: the arrays lost)


def test_a_polars_frame_is_a_dict_of_its_columns_of_their_dtypes():
    # (np.asarray made it one float64 matrix: ids past 2**53 rounded, times and bools as
    # floats, the names lost; passed as the source, each record a frame of one row)
    import datetime

    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"t": [datetime.datetime(2020, 1, 1, h) for h in range(4)],
                          "x": pl.Series([0.5, 1.5, 2.5, 3.5], dtype=pl.Float32),
                          "id": [2**53 + 1 + 2 * i for i in range(4)], "ok": [True, False] * 2})
    for workers in (0, 2):
        with jl.DataLoader(jl.ArraySource(frame), batch_size=2, num_workers=workers,
                           process_index=0, process_count=1) as loader:
            batch = next(iter(loader))
        assert batch["id"].tolist() == [2**53 + 1, 2**53 + 3] and batch["ok"].dtype == bool
        assert batch["t"].dtype.kind == "M" and batch["x"].dtype == np.float32
    with pytest.raises(jl.ConfigError, match=r"polars DataFrame of 4 rows.*ArraySource"):
        jl.DataLoader(frame, batch_size=2)
    assert jl.ArraySource(frame["id"])[1] == 2**53 + 3  # (a Series: its values)
    assert next(iter(jl.DataLoader(frame["id"], batch_size=2)))[1] == 2**53 + 3  # (its [i])
    with pytest.raises(jl.ConfigError, match=r"leaf \['x'\]: a DataFrame inside the tree"):
        jl.ArraySource({"x": frame, "y": np.arange(4)})  # (one float64 matrix: ids rounded)
    both = jl.ArraySource((np.zeros((4, 2)), frame["id"]))  # (a Series in the tree: as alone)
    assert both[1][1] == 2**53 + 3
    with pytest.raises(jl.ConfigError, match=r"column 'v' \(Int64\) has 1 null.*fill_null"):
        jl.ArraySource(pl.DataFrame({"v": [1, None, 3]}))
    text = jl.ArraySource({"s": pl.Series(["a", "bb"]), "t": pl.DataFrame({"u": ["c", "d"]})
                           .get_column("u")})  # (strings: fixed width, as np.asarray gave)
    assert text[1] == {"s": "bb", "t": "d"} and text.arrays[0].dtype == np.dtype("<U2")
    with pytest.raises(jl.ConfigError, match=r"column 'l' has dtype List.*to_dicts"):
        jl.ArraySource(pl.DataFrame({"l": [[1], [2, 3]]}))


def test_polars_structs_long_text_and_frames_of_one_dtype_in_a_tree():
    # a Struct column became one float64 matrix (ids rounded, names lost); one long document
    # among short ones made every string its width (200 MB for 60 KB of text); a frame of one
    # dtype of numbers inside a tree (sklearn's {"X": X_df, "y": y}) was refused since the
    # last session, where it had been a matrix and loses nothing as one
    pl = pytest.importorskip("polars")
    pd = pytest.importorskip("pandas")
    meta = pl.Series("meta", [{"id": 2**53 + 1, "w": 0.5}, {"id": 3, "w": 1.5}])
    with pytest.raises(jl.ConfigError, match=r"column 'meta' is a Struct.*df.unnest\('meta'\)"):
        jl.ArraySource(pl.DataFrame({"meta": meta, "y": [0, 1]}))
    assert jl.ArraySource(pl.DataFrame({"meta": meta}).unnest("meta"))[0]["id"] == 2**53 + 1
    texts = ["short review"] * 999 + ["x" * 50_000]
    with pytest.raises(jl.ConfigError, match=r"column 'text' holds 1000 strings of 61988 "
                                             r"characters .* 191 MiB; pass df.to_dicts\(\)"):
        jl.ArraySource(pl.DataFrame({"text": texts}))
    with pytest.raises(jl.ConfigError, match=r"1 null\(s\), expected strings.*fill_null\(''\)"):
        jl.ArraySource(pl.DataFrame({"s": ["a", None]}))
    for frame in (pd.DataFrame({"a": np.float32([1, 2, 3]), "b": np.float32([4, 5, 6])}),
                  pl.DataFrame({"a": [1, 2, 3], "b": [2**53 + 1, 5, 6]})):
        both = jl.ArraySource({"X": frame, "y": np.arange(3)})
        assert both[0]["X"].tolist() == frame.to_numpy()[0].tolist()
        assert both.arrays[0].dtype == frame.to_numpy().dtype
    with pytest.raises(jl.ConfigError, match=r"DataFrame inside the tree"):  # (two dtypes)
        jl.ArraySource({"X": pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]})})
    decimals = pl.DataFrame({"d": pl.Series(["1.5", "2.25"]).str.to_decimal()})
    with pytest.raises(jl.ConfigError, match=r"DataFrame inside the tree"):  # (no NumPy form)
        jl.ArraySource({"X": decimals})
    with pytest.raises(jl.ConfigError, match=r"cast it \(df\['d'\].cast\(pl.Float64\)"):
        jl.ArraySource(decimals)  # (told a category's codes)
    with pytest.raises(jl.ConfigError, match=r"would make 3819 MiB"):  # (asked before NumPy
        jl.ArraySource(pl.DataFrame({"t": ["a"] * 1000 + ["x" * 1_000_000]}))  # makes it)
    labels = pd.DataFrame({"c": pd.Categorical(["a", None, "b"])})  # (strings: -1 is refused)
    with pytest.raises(jl.ConfigError, match=r"missing value.*; take its codes") as said:
        jl.ArraySource(labels)
    assert "add_categories" not in str(said.value)


def test_nullable_columns_keep_their_numbers_and_missing_values_are_refused():
    # pandas' Int64 and Float64 became float64 with NaN for a missing value: integers past
    # 2**53 rounded, a missing one a NaN, silently
    pd = pytest.importorskip("pandas")
    whole = pd.DataFrame({"id": pd.array([2**53 + 1, 2, 3], dtype="Int64"),
                          "ok": pd.array([True, False, True], dtype="boolean")})
    source = jl.ArraySource(whole)
    assert source[0]["id"] == 2**53 + 1 and source.arrays[0].dtype == np.int64
    assert source.arrays[1].dtype == bool
    for column in (pd.array([1, None, 3], dtype="Int64"), pd.array([0.5, None, 1.0],
                                                                   dtype="Float64")):
        with pytest.raises(jl.ConfigError, match=r"column 'v' \(\w+\) has 1 missing value.*"
                                                 r"rows \[1\].*fillna"):
            jl.ArraySource(pd.DataFrame({"v": column}))
    with pytest.raises(jl.ConfigError, match=r"ArraySource\(Series\) .*missing.*s.fillna"):
        jl.ArraySource(pd.Series(pd.array([1, None], dtype="Int64"), name="v"))
    assert jl.ArraySource(pd.DataFrame({"v": [0.5, np.nan]})).arrays[0].dtype == np.float64
    ids = pd.Categorical([2**53 + 1, 2**53 + 3, None])  # (to_numpy: float64, rounded, NaN)
    with pytest.raises(jl.ConfigError, match=r"column 'v' \(category\) has 1 missing value.*"
                                             r"rows \[2\].*cat.codes"):
        jl.ArraySource(pd.DataFrame({"v": ids}))
    kept = jl.ArraySource(pd.DataFrame({"v": ids[:2]}))
    assert kept.arrays[0].dtype == np.int64 and kept[0]["v"] == 2**53 + 1


def test_a_masked_arrays_mask_is_not_dropped():
    masked = np.ma.masked_array([1, 2, 3], mask=[False, True, False])
    with pytest.raises(jl.ConfigError, match=r"masked array with 1 masked value.*filled"):
        jl.ArraySource({"x": masked})
    plain = jl.ArraySource({"x": np.ma.masked_array([1, 2, 3])})  # (nothing masked: its data)
    assert type(plain.arrays[0]) is np.ndarray and plain[1]["x"] == 2


def test_a_configs_list_of_columns_is_read_as_a_list_not_stacked_into_one_array():
    # a UserList (OmegaConf's ListConfig, any sequence but a list) was one leaf: np.asarray
    # stacked [features, labels] into 2 records of 1,000 floats, the int labels float64 (the
    # config audit)
    import collections
    import types

    features, labels = np.arange(1000.0), np.arange(1000)
    for given in (collections.UserList([features, labels]),
                  {"x": collections.UserList([features, labels])},
                  types.MappingProxyType({"x": collections.UserList([features, labels])})):
        src = jl.ArraySource(given)
        assert len(src) == 1000, type(given)
        record = src[7] if isinstance(given, collections.UserList) else src[7]["x"]
        assert isinstance(record, list) and [r.dtype for r in record] == [np.float64, np.int64]
    tree = {"x": (features, labels)}  # (a tree without one: as given)
    assert type(jl.ArraySource(tree)[0]["x"]) is tuple
    with pytest.raises(jl.ConfigError, match=r"\['y'\]\[0\].*pass a column of values as "
                                             r"np.asarray\(values\)"):
        jl.ArraySource({"y": [0, 1, 1, 0]})
    import array  # (a sequence of numbers or text is a column, as it was: the twenty-first
    for column in (array.array("f", [1, 2, 3]), collections.deque([1.0, 2.0, 3.0]),  # review)
                   collections.UserList(["a", "b", "c"]), collections.UserList([0, 1, 1])):
        assert len(jl.ArraySource({"y": column})) == len(column)

def _writes_in_place(record):
    record["x"][0] = -1.0  # the mistake: the record is the source's memory
    return record


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("rows", [4, 1 << 16], ids=["small array", "2 MiB array"])
def test_in_place_writes_fail_alike_in_every_mode_and_change_nothing(num_workers, rows):
    x = np.ones((rows, 8), np.float32)  # 2 MiB or more is shared with the workers, not copied
    loader = jl.DataLoader(jl.ArraySource({"x": x}), batch_size=2, num_workers=num_workers,
                           transforms=[jl.Map(_writes_in_place)], process_index=0,
                           process_count=1)
    with loader, pytest.raises((jl.RecordError, jl.WorkerError)) as e:
        next(iter(loader))
    msg = str(e.value)
    assert "assignment destination is read-only" in msg
    assert "source records are read-only views" in msg and ".copy()" in msg
    assert np.all(x == 1.0)  # the caller's array is untouched


def test_a_record_read_by_a_float_or_a_str_is_refused_naming_the_source(tmp_path):
    # source[len(source) / 2]: ParquetSource and ConcatSource read record int(2.5) without a
    # word (HuggingFaceSource cut it too), others a bare NumPy or comparison error
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"x": np.arange(5)}), tmp_path / "a.parquet")
    (tmp_path / "f").write_bytes(b"f")
    sources = {"ParquetSource": jl.ParquetSource(str(tmp_path / "a.parquet")),
               "ConcatSource": jl.ConcatSource([jl.ArraySource({"x": np.arange(5)})]),
               "ArraySource": jl.ArraySource({"x": np.arange(5)}),  # (True read every record)
               "RaggedSource": jl.RaggedSource.from_sequences({"t": [[1, 2], [3]] * 2 + [[4]]}),
               "FileListSource": jl.FileListSource([str(tmp_path / "f")] * 5),
               "FilteredSource": jl.FilteredSource(jl.ArraySource({"x": np.arange(9)}),
                                                   lambda r: r["x"] % 2 == 0),
               "MapSource": jl.MapSource(jl.ArraySource({"x": np.arange(5)}), lambda c: c,
                                         batched=True)}
    for name, src in sources.items():
        for bad in (2.5, "2", True, np.bool_(True)):  # (True was record 1)
            with pytest.raises(TypeError, match=rf"{name}\[{re.escape(repr(bad))}\]: expected"
                                                rf" an int in \[(-5|0), 5\), got "
                                                rf"{type(bad).__name__}; pass"):
                src[bad]
        assert src[np.array(4)] == src[4]  # (an int of any kind, as before)
    assert sources["RaggedSource"][-1]["t"].tolist() == [4]  # (from the end, as before)
    assert sources["ParquetSource"][-1]["x"] == 4  # (as every source: a list's rule)
    with pytest.raises(IndexError, match=r"ArraySource: index 5 out of range \[0, 5\) \(or "):
        sources["ArraySource"][5]  # (NumPy's "axis 0 with size 5" named no source)
    assert sources["ArraySource"][[1, -1]]["x"].tolist() == [1, 4]  # (rows at once: NumPy's)
    for rows in ([0, 10], np.array([0, 10])):
        with pytest.raises(IndexError, match=r"ArraySource: index 10 out of range \[-5, 5\)"):
            sources["ArraySource"][rows]


def test_a_batched_read_out_of_range_names_the_source_and_the_range(tmp_path):
    # __getitems__ checked nothing: a bare assert, NumPy's "axis 0 with size 2", a pybind
    # TypeError, a list's IndexError, none naming the source or the range
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"x": np.arange(10)}), tmp_path / "a.parquet", row_group_size=5)
    parquet = jl.ParquetSource(str(tmp_path / "a.parquet"))
    concat = jl.ConcatSource([jl.ArraySource({"x": np.arange(3)})] * 2)
    for name, src in (("ParquetSource", parquet), ("ConcatSource", concat)):
        for bad in (-1, len(src)):
            with pytest.raises(IndexError, match=rf"{name}: index {bad} out of range "
                                                 rf"\[0, {len(src)}\)"):
                src.__getitems__(np.array([0, bad]))
        # floats were cut to other records, a mask read as positions 0 and 1, and a uint64
        # past int64 named wrapped negative
        for bad, kind in ((np.array([1.7, 2.9]), "float64"), (np.array([True, False]), "bool")):
            with pytest.raises(TypeError, match=rf"{name}.__getitems__: expected int positions,"
                                                rf" got an array of {kind}"):
                src.__getitems__(bad)
        with pytest.raises(IndexError, match=rf"{name}: index {2**63 + 1} out of range"):
            src.__getitems__(np.array([2**63 + 1], np.uint64))


# Grain's MapDataset steps, as their classes look to jaxloader (grain is not a test dependency;
# checked by hand against grain 0.2.18's own datasets: .shuffle, .window_shuffle, .repeat,
# .repeat(3), .filter, .batch, a FlatMapMapDataset and .map after .shuffle refused; a slice,
# .map, .seed, .random_map and MapDataset.mix taken)
def _grain(name, parent=None, length=8):
    module = "grain._src.python.dataset.transformations." + name.lower()
    kind = type(name, (), {"__module__": module, "__len__": lambda self: length,
                           "__getitem__": lambda self, i: {"x": np.int64(i)},
                           "parents": property(lambda self: [] if parent is None else [parent])})
    return kind()


@pytest.mark.parametrize("step, remedy", [
    ("ShuffleMapDataset", r"\.shuffle\(seed\).*use shuffle=True and seed=: a new order each "
                          "epoch"),
    ("RepeatMapDataset", r"\.repeat\(\).*use num_epochs="),
    ("FilterMapDataset", r"\.filter\(fn\).*use jaxloader\.FilteredSource\(dataset, fn\)"),
    ("BatchMapDataset", r"\.batch\(n\).*use batch_size=n"),
    ("WindowShuffleMapDataset", r"WindowShuffleMapDataset\(\.\.\.\).*LocalShuffle\(window=8\)"),
    ("FlatMapMapDataset", r"FlatMapMapDataset\(\.\.\.\).*a Map returning a record's examples "
                          "stacked"),
    ("RandomMapMapDataset", r"\.random_map\(fn, seed\).*transforms=\[fn\].*new draws each "
                            "epoch, where the dataset's are keyed by the record's index alone"),
])
def test_a_grain_dataset_made_with_a_step_the_loader_takes_is_refused_with_it(step, remedy):
    # each was read as it is, its meaning lost without a word: one shuffled order read in every
    # epoch, a dropped record's None failing collation, batches of batches
    mapped = _grain("MapMapDataset", _grain(step, _grain("RangeMapDataset")))
    with pytest.raises(jl.ConfigError, match=rf"a Grain MapMapDataset made with .*\(a {step} in "
                                             rf"its chain\).*{remedy}"):
        jl.DataLoader(mapped, batch_size=2)
    kept = _grain("MapMapDataset", _grain("SliceMapDataset", _grain("RangeMapDataset")))
    with jl.DataLoader(kept, batch_size=2, process_index=0, process_count=1) as loader:
        assert len(loader) == 4
    seeded = _grain("MapMapDataset", _grain("RangeMapDataset"))  # (.map of a RandomMap, or
    seeded._rng_pool = object()  # given a seed: grain's draws are keyed by the index alone)
    with pytest.raises(jl.ConfigError, match=r"a Grain MapMapDataset made with \.random_map"):
        jl.DataLoader(seeded, batch_size=2)


def test_a_grain_iter_dataset_is_told_to_pass_the_map_dataset_before_it():
    # (the migration audit: the page's own .to_iter_dataset().mp_prefetch() form was told to
    # become a stream of a generator, losing the shuffle and the restore in O(1))
    prefetched = type("PrefetchIterDataset", (), {
        "__module__": "grain._src.python.dataset.transformations.prefetch",
        "__iter__": lambda self: iter(())})()
    with pytest.raises(jl.ConfigError, match=r"a Grain IterDataset .* pass the MapDataset "
                                             r"before \.to_iter_dataset\(\)"):
        jl.DataLoader(prefetched, batch_size=2)



def test_a_concatenations_names_are_one_a_part():
    """names= was taken as given: a short list failed at the first record as an IndexError,
    hiding the error it named a part for (parts of another structure); an int was a bare
    TypeError; names alike were taken (the API audit)."""
    a, b = jl.ArraySource({"x": np.zeros(4)}), jl.ArraySource({"y": np.zeros(4)})
    for names in (["a"], 0, ["a", "a"], "ab"):
        with pytest.raises(jl.ConfigError, match=r"ConcatSource\(names=...\): expected one name "
                                                 r"a source, 2 distinct ones"):
            jl.ConcatSource([a, b], names=names)
    with pytest.raises(jl.ConfigError, match=r"Mixture\(names=...\)"):
        jl.Mixture([a, a], {0: [0.5, 0.5]}, names=["a"])
    named = jl.ConcatSource([a, b], names=("first", "second"))
    assert named.names == ["first", "second"]
    with pytest.raises(jl.ConfigError, match=r"dict with keys \['x'\] in 'first', dict with "
                                             r"keys \['y'\] in 'second'"):  # (parts named)
        jl.DataLoader(named, batch_size=2)
    assert jl.mix({0: a, 1: a}, {0: 0.5, 1: 0.5}).names == ["0", "1"]  # (jl.mix's keys)


def test_labels_and_worker_counts_of_another_kind_are_refused_where_made():
    """FileListSource(labels=0) was a bare TypeError (len of an int), and FilteredSource's
    num_workers=[] or None ran in process, the truthiness of what was given (the API audit)."""
    for labels in (0, "ab", {"a": 1, "b": 2}):
        with pytest.raises(jl.ConfigError, match=r"FileListSource\(labels\): expected a list of "
                                                 r"ints, one a path \(2\)"):
            jl.FileListSource(["a.txt", "b.txt"], labels=labels)
    source = jl.ArraySource({"x": np.arange(10)})
    for count in ([], "", None, -1, 2.0):
        with pytest.raises(jl.ConfigError, match=r"FilteredSource\(num_workers=...\): expected "
                                                 r"an int"):
            jl.FilteredSource(source, lambda r: True, num_workers=count)
    # indices and workers, which have no keep to run: the workers asked for, without a word
    with pytest.warns(jl.JaxloaderWarning, match=r"FilteredSource\(num_workers=2\) without "
                                                 r"keep: no function runs over the source"):
        kept = jl.FilteredSource(source, indices=np.array([1, 2, 3]), num_workers=2)
    assert len(kept) == 3


def test_indices_found_from_another_source_without_keep_are_refused_naming_the_file(tmp_path):
    # FilteredSource(other, indices=path) read the file's record numbers over another source
    # without a word, though its .from file named the source they were found from
    path = str(tmp_path / "kept.npy")
    first = jl.ArraySource({"x": np.array([1, 5, 2, 8, 3])})
    assert jl.FilteredSource(first, lambda r: r["x"] > 2, indices=path).indices.tolist() == [
        1, 3, 4]
    assert jl.FilteredSource(first, indices=path).indices.tolist() == [1, 3, 4]  # (the same)
    other = jl.ArraySource({"x": np.zeros(7)})
    with pytest.raises(jl.ConfigError, match=r"FilteredSource: .*kept.npy was found from another "
                                             r"source than this one \(as .*kept.npy.from says\)"
                                             r".*pass keep="):
        jl.FilteredSource(other, indices=path)
    np.save(str(tmp_path / "mine.npy"), np.array([0, 2]))  # (a file of the user's: no .from)
    assert jl.FilteredSource(other, indices=str(tmp_path / "mine.npy")).indices.tolist() == [0, 2]


def test_array_source_getitems_refuses_a_mask_and_names_itself_out_of_range():
    # a bool mask read as records 1 and 0, and NumPy's IndexError named no source (the API
    # audit)
    source = jl.ArraySource({"x": np.arange(10)})
    with pytest.raises(TypeError, match=r"ArraySource.__getitems__: expected an array of "
                                        r"record numbers, got dtype bool; for a mask, pass "
                                        r"np.flatnonzero\(mask\)"):
        source.__getitems__(np.array([True, False]))
    with pytest.raises(TypeError, match=r"got dtype float64"):
        source.__getitems__(np.array([1.0]))
    with pytest.raises(IndexError, match=r"ArraySource.__getitems__: record numbers in "
                                         r"\[0, 10\) expected, got 1 to 20"):
        source.__getitems__(np.array([1, 20]))
    assert source.__getitems__(np.array([3, 4]))["x"].tolist() == [3, 4]
    assert source.__getitems__([])["x"].tolist() == []


def test_every_source_takes_an_index_from_the_end(tmp_path):
    # ArraySource, MapSource and the file sources took source[-1]; ConcatSource (a mixture's
    # named "ConcatSource"), ParquetSource, FilteredSource and PackedSource raised IndexError
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    a = jl.ArraySource({"x": np.arange(10)})
    pq.write_table(pa.table({"x": np.arange(10)}), tmp_path / "a.parquet")
    sources = [jl.ConcatSource([a, a]), jl.ParquetSource(str(tmp_path / "a.parquet")),
               jl.FilteredSource(a, indices=np.arange(5)), jl.mix([a, a], [1, 1]),
               jl.PackedSource(jl.ArraySource({"t": np.ones((4, 3), np.int32)}), "t", 6)]
    for source in sources:
        last, first = source[-1], source[-len(source)]
        assert jax_tree_equal(last, source[len(source) - 1]), source
        assert jax_tree_equal(first, source[0]), source
        with pytest.raises(IndexError, match=rf"{type(source).__name__}: index {-len(source) - 1}"
                                             rf" out of range"):
            source[-len(source) - 1]


def jax_tree_equal(a, b):
    import jax

    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
