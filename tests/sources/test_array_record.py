"""ArrayRecordSource: records of several files as bytes, parsed by a Map; clear errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

import jaxloader as jl
from resume_harness import check_resume

array_record = pytest.importorskip("array_record.python.array_record_module")


def write(tmp_path, counts=(20, 7, 13)):
    paths, start = [], 0
    for k, n in enumerate(counts):
        path = str(tmp_path / f"part-{k}.array_record")
        writer = array_record.ArrayRecordWriter(path, "group_size:4")
        for i in range(start, start + n):
            writer.write(np.arange(i, i + 3, dtype=np.int32).tobytes())
        writer.close()
        paths.append(path)
        start += n
    return paths


def parse(raw):
    return {"x": np.frombuffer(raw, np.int32).copy()}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_records_of_every_file_parsed_by_a_map(tmp_path, num_workers):
    src = jl.ArrayRecordSource(write(tmp_path))
    assert len(src) == 40 and np.frombuffer(src[21], np.int32).tolist() == [21, 22, 23]
    assert [np.frombuffer(r, np.int32)[0] for r in src.__getitems__(np.array([39, 0, 25]))] == [
        39, 0, 25]
    with jl.DataLoader(src, batch_size=8, shuffle=True, seed=0, transforms=[jl.Map(parse)],
                       num_workers=num_workers, process_index=0, process_count=1) as loader:
        firsts = np.concatenate([b["x"][:, 0] for b in loader])
    assert sorted(firsts.tolist()) == list(range(40))


def test_resume_and_bad_files(tmp_path):
    paths = write(tmp_path)
    check_resume(lambda: jl.DataLoader(jl.ArrayRecordSource(paths), batch_size=4, shuffle=True,
                                       seed=1, transforms=[jl.Map(parse)], num_epochs=None,
                                       process_index=0, process_count=1), total=14, k=5)
    with pytest.raises(jl.ConfigError, match=r"'.*nope.array_record' does not exist"):
        jl.ArrayRecordSource([paths[0], str(tmp_path / "nope.array_record")])
    (tmp_path / "text.array_record").write_text("not an array record file")
    with pytest.raises(jl.ConfigError, match=r"'.*text.array_record' could not be opened as an "
                                             r"ArrayRecord file: it is not one, or it is cut "
                                             r"short or damaged"):
        jl.ArrayRecordSource(str(tmp_path / "text.array_record"))
    # a remote path goes to array-record's own reader (gs:// in 0.8.6); "b" is not a valid
    # bucket name, so it fails at once, with no network, and the message says who opened it
    with pytest.raises(jl.ConfigError, match=r"reader could not open 'gs://b/a.array_record'"):
        jl.ArrayRecordSource("gs://b/a.array_record")


def test_a_file_rewritten_to_its_size_with_a_record_of_another_length_is_refused(tmp_path):
    # the writer pads a file with zeros to 64 KiB: its last KiB, which its identity hashed,
    # was zeros in every file, and a file rewritten to the same size restored (the files audit)
    import json

    path = str(tmp_path / "a.array_record")

    def write(last):
        writer = array_record.ArrayRecordWriter(path, "group_size:1")
        for i in range(200):
            writer.write(np.arange(64 if i < 199 else last, dtype=np.int64).tobytes())
        writer.close()

    write(64)
    size = os.path.getsize(path)
    with jl.DataLoader(jl.ArrayRecordSource(path), batch_size=50, process_index=0,
                       process_count=1) as loader:
        next(iter(loader))
        state = json.loads(json.dumps(loader.state_dict()))
    older = json.loads(json.dumps(state))  # (as saved before: [size, head, tail], restored)
    older["files"] = [identity[:3] for identity in state["files"]]
    with jl.DataLoader(jl.ArrayRecordSource(path), batch_size=50, process_index=0,
                       process_count=1) as loader:
        loader.load_state_dict(older)
    write(200)
    assert os.path.getsize(path) == size
    with jl.DataLoader(jl.ArrayRecordSource(path), batch_size=50, process_index=0,
                       process_count=1) as loader:
        with pytest.raises(jl.StateDictError, match=r"a.array_record: the same size and first "
                                                     r"and last KiB, another last KiB before the "
                                                     r"zeros its writer pads it with"):
            loader.load_state_dict(state)


def test_float_or_mask_indices_are_refused_as_every_sources_are(tmp_path):
    # [1.7, 3.9] read records 1 and 3, a mask positions 0 and 1 (the files audit)
    source = jl.ArrayRecordSource(write(tmp_path))
    for indices, said in [(np.array([1.7, 3.9]), "float64"), (np.arange(5) % 2 == 1, "bool")]:
        with pytest.raises(TypeError, match=rf"ArrayRecordSource.__getitems__: expected int "
                                            rf"positions, got an array of {said}"):
            source.__getitems__(indices)


def test_a_reader_that_raises_where_it_cannot_open_is_told_as_one_that_says_so(monkeypatch):
    # array-record 0.5 raised a bare RuntimeError from its constructor (later: ok() is False)
    from array_record.python import array_record_module

    def raising(path):
        raise RuntimeError("open() failed: GCS bucket name is invalid")

    monkeypatch.setattr(array_record_module, "ArrayRecordReader", raising)
    with pytest.raises(jl.ConfigError, match=r"reader could not open 'gs://b/a.array_record' "
                                             r"\(open\(\) failed: GCS bucket name is invalid\)"):
        jl.ArrayRecordSource("gs://b/a.array_record")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_file_rewritten_under_the_loader_is_an_error_naming_it(tmp_path, num_workers):
    # the identity was taken at construction, never checked when a reader opened the file:
    # other records of the same count were read in silence
    paths = write(tmp_path, counts=(8,))
    src = jl.ArrayRecordSource(paths)
    writer = array_record.ArrayRecordWriter(paths[0], "group_size:4")
    for i in range(8):
        writer.write(np.arange(i + 100, i + 103, dtype=np.int32).tobytes())
    writer.close()
    with jl.DataLoader(src, batch_size=4, transforms=[jl.Map(parse)], num_workers=num_workers,
                       process_index=0, process_count=1) as loader:
        with pytest.raises(jl.JaxloaderError, match=r"file '.*part-0.array_record' changed "
                                                     r"while the loader reads it \(the same "
                                                     r"size, other bytes in its first or last "
                                                     r"KiB\)"):  # (it named a Parquet footer)
            next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_file_rewritten_in_place_after_its_reader_opened_is_an_error_naming_it(tmp_path,
                                                                                  num_workers):
    # ArrayRecordWriter over the same path truncates it in place: the open reader read the new
    # records in the next epoch, without a word
    paths = write(tmp_path, counts=(8,))
    loader = jl.DataLoader(jl.ArrayRecordSource(paths), batch_size=4, num_epochs=None,
                           transforms=[jl.Map(parse)], num_workers=num_workers,
                           process_index=0, process_count=1, prefetch=1)
    with loader:
        it = iter(loader)  # (each worker's reader open once the epoch's two steps are made)
        assert [next(it)["x"][0, 0] for _ in range(2)] == [0, 4]
        writer = array_record.ArrayRecordWriter(paths[0], "group_size:4")
        for i in range(8):
            writer.write(np.arange(i + 100, i + 103, dtype=np.int32).tobytes())
        writer.close()
        with pytest.raises(jl.JaxloaderError, match=r"file '.*part-0.array_record' changed "
                                                     r"while the loader reads it \("):
            for _ in range(200):  # (workers make tasks of up to 16 steps ahead)
                assert next(it)["x"][:, 0].max() < 100


def test_a_damaged_chunk_is_an_error_naming_the_file_and_its_records(tmp_path):
    path = str(tmp_path / "damaged.array_record")
    writer = array_record.ArrayRecordWriter(path, "group_size:4,uncompressed")
    for i in range(8):
        writer.write(np.arange(i * 1000, i * 1000 + 3, dtype=np.int32).tobytes())
    writer.close()
    whole = bytearray(open(path, "rb").read())
    whole[whole.index(np.arange(5000, 5003, dtype=np.int32).tobytes())] ^= 0x01
    open(path, "wb").write(bytes(whole))
    src = jl.ArrayRecordSource(path)  # (its index is whole)
    assert parse(src[0])["x"].tolist() == [0, 1, 2]
    with pytest.raises(jl.RecordError, match=r"file '.*damaged.array_record', records \[4, 5\] "
                                             r"of it: cannot be read \(RuntimeError: .*hash "
                                             r"mismatch.*the file is damaged: re-create"):
        src.__getitems__(np.array([4, 5]))


def test_a_batched_read_out_of_range_names_the_source_and_the_range(tmp_path):
    src = jl.ArrayRecordSource(write(tmp_path, counts=(3,)))
    for bad in (-1, 3):
        with pytest.raises(IndexError, match=rf"ArrayRecordSource: index {bad} out of range"):
            src.__getitems__(np.array([bad]))
    # a record read alone counts from the end, as FileListSource's and ArraySource's do (it
    # raised IndexError for -1); a batch's indices are the loader's, never negative
    assert src[-1] == src[2] and src[-3] == src[0]
    with pytest.raises(IndexError, match=r"ArrayRecordSource: index -4 out of range"):
        src[-4]


class OneByOne:
    """A user's wrapper reading its records one at a time (``source[i]``): on read threads."""

    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        return parse(self.source[i])


@pytest.mark.parametrize("num_workers", [0, 1])
def test_records_read_on_many_threads_over_more_files_than_it_keeps_open(tmp_path, num_workers):
    # one thread's open closed the least recently used reader while another read through it:
    # "Object closed", told as a damaged file (the concurrency audit)
    src = jl.ArrayRecordSource(write(tmp_path, counts=(5,) * 40))  # (16 readers kept open)
    with jl.DataLoader(OneByOne(src), batch_size=50, shuffle=True, seed=0, read_threads=16,
                       num_epochs=8, num_workers=num_workers, process_index=0,
                       process_count=1) as loader:
        firsts = [batch["x"][:, 0] for batch in loader]
    assert len(firsts) == 32 and all(sorted(np.concatenate(firsts[e * 4:e * 4 + 4]).tolist())
                                     == list(range(200)) for e in range(8))
