"""FilteredSource: the kept records, found once; an ordinary source (shuffle, workers, resume)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import jaxloader as jl
from resume_harness import check_resume, check_split_resume, take
from sources.test_parquet import write_parts

pytest.importorskip("pyarrow")


def short_text(record):  # texts "row-<id>" + 0-4 x: keeps those with at most one x
    return len(record["text"]) - len(f"row-{record['id']}") <= 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_epoch_holds_each_kept_record_once(tmp_path, num_workers):
    source = jl.ParquetSource(write_parts(tmp_path))
    kept = jl.FilteredSource(source, short_text)
    want = [i for i in range(len(source)) if short_text(source[i])]
    assert kept.indices.tolist() == want and len(kept) == len(want)
    if num_workers:  # the one pass in workers finds the same records
        by_workers = jl.FilteredSource(source, short_text, num_workers=num_workers)
        assert by_workers.indices.tolist() == want
    assert [kept[j]["id"] for j in (0, 5, len(want) - 1)] == [want[0], want[5], want[-1]]
    with jl.DataLoader(kept, batch_size=5, shuffle=True, seed=2, num_workers=num_workers,
                       last_batch="partial", process_index=0, process_count=1) as loader:
        ids = np.concatenate([b["id"] for b in loader])
    assert sorted(ids.tolist()) == want and ids.tolist() != want  # shuffled, each once


@pytest.mark.parametrize("k", [1, 7])
def test_resume_read_locally_into_other_worker_and_process_counts(tmp_path, k):
    paths = write_parts(tmp_path, rows=(96, 64, 48))
    kept = jl.FilteredSource(jl.ParquetSource(paths), short_text)

    def make(num_workers=0, batch_size=8, process_index=0, process_count=1):
        return lambda: jl.DataLoader(
            kept, batch_size=batch_size, shuffle=jl.LocalShuffle(window=2), seed=3,
            num_workers=num_workers, num_epochs=None, process_index=process_index,
            process_count=process_count)

    check_resume(make(), total=k + 10, k=k, make_restored=make(num_workers=2))
    check_split_resume(make, batch_size=8, k=k, steps=10, keys=("id", "text"))
    # its blocks are the row groups' kept rows: a read-local order stays in 2 row groups
    starts = kept.block_starts
    assert starts[0] == 0 and starts[-1] == len(kept) and len(starts) == 13 + 1
    assert np.array_equal(kept.indices[starts[:-1]] // 16 * 16,
                          [0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192])
    with make()() as loader:
        local = np.concatenate([b["id"] for b in take(loader, 2)])
    with jl.DataLoader(kept, batch_size=8, shuffle=True, seed=3, process_index=0,
                       process_count=1) as loader:
        full = np.concatenate([b["id"] for b in take(loader, 2)])
    assert len(np.unique(local // 16)) <= 5 < 8 <= len(np.unique(full // 16))  # of 13


def test_a_full_shuffle_of_kept_parquet_rows_warns_of_the_files_cache(tmp_path):
    kept = jl.FilteredSource(jl.ParquetSource(write_parts(tmp_path), cache_bytes=1 << 10),
                             short_text)
    with pytest.warns(jl.PerformanceWarning, match=r"a full shuffle .* reads from all 10 row "
                                                   r"groups"):
        jl.DataLoader(kept, batch_size=4, shuffle=True, process_index=0,
                      process_count=1).close()


def test_indices_kept_in_a_file_are_read_back_and_guard_a_restore(tmp_path):
    source = jl.ArraySource({"x": np.arange(100)})
    path = tmp_path / "kept.npy"
    odd = jl.FilteredSource(source, lambda r: r["x"] % 2 == 1, indices=path)
    again = jl.FilteredSource(source, indices=path)  # no function: the file's indices
    assert np.array_equal(again.indices, odd.indices) and again.fingerprint == odd.fingerprint
    subset = jl.FilteredSource(source, indices=np.arange(0, 100, 3))  # PyTorch's Subset
    assert len(subset) == 34 and subset[2]["x"] == 6

    def loader(src):
        return jl.DataLoader(src, batch_size=4, shuffle=True, process_index=0, process_count=1)

    with loader(odd) as first:
        take(first, 3)
        state = json.loads(json.dumps(first.state_dict()))
    even = jl.FilteredSource(source, lambda r: r["x"] % 2 == 0)
    with loader(even) as other:
        with pytest.raises(jl.StateDictError, match="source: expected 'filtered:50:"):
            other.load_state_dict(state)
    with loader(again) as same:
        same.load_state_dict(state)


def test_indices_whose_save_failed_half_way_are_found_again_not_trusted(tmp_path,
                                                                       monkeypatch):
    # the array was written, then its .from failed (a disk full there, a job killed): a
    # .npy without its .from is read as the user's own, unchecked, so the run after the data
    # changed kept records the predicate drops; the failure was a bare OSError, the pass's
    # work lost (the disk-full audit)
    from jaxloader.sources import kept_arrays

    path = tmp_path / "kept.npy"
    writes, replace = [], kept_arrays._replace

    def full_at_the_second_write(target, write):
        writes.append(target)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        replace(target, write)

    monkeypatch.setattr(kept_arrays, "_replace", full_at_the_second_write)
    keep_even = lambda r: r["x"] % 2 == 0  # noqa: E731
    with pytest.warns(jl.JaxloaderWarning, match=r"kept.npy: the array found could not be "
                                                 r"saved \(No space left on device\); this run"):
        first = jl.FilteredSource(jl.ArraySource({"x": np.arange(10)}), keep_even,
                                  indices=path)
    assert [first[i]["x"] for i in range(len(first))] == [0, 2, 4, 6, 8]
    monkeypatch.setattr(kept_arrays, "_replace", replace)
    changed = jl.FilteredSource(jl.ArraySource({"x": np.arange(1, 11)}), keep_even,
                                indices=path)
    assert [changed[i]["x"] for i in range(len(changed))] == [2, 4, 6, 8, 10]


def test_bad_input_is_named(tmp_path):
    source = jl.ArraySource({"x": np.arange(10)})
    with pytest.raises(jl.ConfigError, match=r"FilteredSource\(keep\): expected a function"):
        jl.FilteredSource(source, "x > 3")
    with pytest.raises(jl.ConfigError, match=r"expected keep .* or indices.*does not exist yet"):
        jl.FilteredSource(source, indices=tmp_path / "none.npy")
    with pytest.raises(jl.ConfigError, match=r"record numbers in \[0, 10\), got numbers from "
                                             r"0 to 12 \(indices\[2\] is 12\); the source has 10 "
                                             r"records: indices of another"):
        jl.FilteredSource(source, indices=[0, 3, 12])  # (not "no negative ones": the audit)
    with pytest.raises(jl.ConfigError, match=r"shape \(1, 3\).*pass np.where\(...\)\[0\]"):
        jl.FilteredSource(source, indices=np.where(np.arange(10) > 6))
    # (a PyTorch sampler's generator or a set of indices: "shape () dtype object", no remedy)
    with pytest.raises(jl.ConfigError, match=r"a generator is not an array: pass "
                                             r"np.fromiter\(indices, np.int64\)"):
        jl.FilteredSource(source, indices=(i for i in range(0, 10, 2)))
    with pytest.raises(jl.ConfigError, match=r"a set is not an array: pass np.fromiter\(sorted"):
        jl.FilteredSource(source, indices={3, 1})
    assert len(jl.FilteredSource(source, indices=np.fromiter(sorted({3, 1}), np.int64))) == 2
    # indices in memory have no stale file to delete: a negative one (PyTorch's Subset takes
    # them) and a bool mask are named with their own remedy
    with pytest.raises(jl.ConfigError, match=r"got numbers from -1 to 1 \(indices\[0\] is "
                                             r"-1\); indices count from 0, with no "
                                             r"negative ones \(np.arange"):
        jl.FilteredSource(source, indices=[-1, 0, 1])
    with pytest.raises(jl.ConfigError, match=r"dtype bool; for a mask, pass np.flatnonzero"):
        jl.FilteredSource(source, indices=np.arange(10) > 4)
    with pytest.raises(jl.ConfigError, match=r"1-D array of record numbers, got shape \(1, 2\)"):
        jl.FilteredSource(source, indices=[[0, 1]])
    with pytest.raises(jl.ConfigError, match=r"keep .*<lambda> kept none of the 10 records"):
        jl.FilteredSource(source, lambda r: False)
    with pytest.raises(jl.ConfigError, match=r"FilteredSource\(source\): got a mixture"):
        jl.FilteredSource(jl.mix([source, source], [0.5, 0.5]), lambda r: True)
    with pytest.raises(jl.RecordError, match=r"FilteredSource\(keep\) .* raised KeyError on "
                                             r"record 0"):
        jl.FilteredSource(source, lambda r: r["y"])
    # keep and indices in memory: keep was never called, without a word
    with pytest.raises(jl.ConfigError, match=r"got both keep .*<lambda> and indices= record "
                                             r"numbers, of which only the indices would be "
                                             r"used; pass one of them, or indices= the path"):
        jl.FilteredSource(source, lambda r: r["x"] != 1, indices=[1, 2])


def _raises_at_4500(record):
    if int(record["x"]) == 4500:
        raise ValueError("bad")
    return True


def test_a_keep_that_raises_names_its_record_past_the_first_chunk():
    with pytest.raises(jl.RecordError, match=r"FilteredSource\(keep\) _raises_at_4500 raised "
                                             r"ValueError on record 4500: bad"):
        jl.FilteredSource(jl.ArraySource({"x": np.arange(6000)}), _raises_at_4500)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_keep_that_returns_none_or_a_string_is_refused_naming_its_record(num_workers):
    # a return left out dropped every record whose branch fell through (8 of 16 kept, nothing
    # said), and "no" kept them all, where a stream's Filter refused None (the errors audit)
    source = jl.ArraySource({"x": np.arange(16)})
    said = r"FilteredSource\(keep\) \S*<lambda>, on record 1, returned None, expected True"
    with pytest.raises(jl.RecordError, match=said):
        jl.FilteredSource(source, lambda r: True if r["x"] % 2 == 0 else None,
                          num_workers=num_workers)
    with pytest.raises(jl.RecordError, match=r"on record 0, returned ('no'|a string), expected "
                                              r"True .*which a string is not"):
        jl.FilteredSource(source, lambda r: "no", num_workers=num_workers)
    assert len(jl.FilteredSource(source, lambda r: np.bool_(r["x"] < 3),
                                 num_workers=num_workers)) == 3


def _even(record):
    return record["x"] % 2 == 0


def _third(record):
    return record["x"] % 3 == 0


class _Keeper:
    """A predicate's object that also holds a value of its run, which the predicate does not read."""

    def __init__(self, step, started):
        self.step, self.started = step, started

    def keep(self, record):
        return record["x"] % self.step == 0


def test_a_bound_predicates_object_counts_by_what_it_reads_and_older_files_are_kept(
        tmp_path, monkeypatch):
    # its object held a start time it did not read: every run found the records again over
    # the whole source, warning that the keep function had changed (it had not)
    from jaxloader.sources.code_digest import code_digest

    source, path = jl.ArraySource({"x": np.arange(20)}), tmp_path / "kept.npy"
    assert len(jl.FilteredSource(source, _Keeper(2, 1.0).keep, indices=path)) == 10
    with monkeypatch.context() as patched, warnings.catch_warnings():
        patched.setattr("jaxloader.derived.filtered._kept", lambda *a: 1 / 0)  # (read back)
        warnings.simplefilter("error")
        assert len(jl.FilteredSource(source, _Keeper(2, 2.0).keep, indices=path)) == 10
        said = json.loads((tmp_path / "kept.npy.from").read_text())
        for key, value in said.items():  # a file an older version wrote: the object whole
            if value == code_digest(_Keeper(2, 1.0).keep, deep=True):
                said[key] = code_digest(_Keeper(2, 1.0).keep, deep=True, whole_owner=True)
        assert said != json.loads((tmp_path / "kept.npy.from").read_text())
        (tmp_path / "kept.npy.from").write_text(json.dumps(said))
        assert len(jl.FilteredSource(source, _Keeper(2, 1.0).keep, indices=path)) == 10
    with pytest.warns(UserWarning, match="found from another keep function"):
        assert len(jl.FilteredSource(source, _Keeper(4, 1.0).keep, indices=path)) == 5


def test_an_indices_file_is_found_again_when_the_data_or_the_function_change(tmp_path,
                                                                           monkeypatch):
    # read back after such a change, it would give records the predicate no longer keeps
    source, path = jl.ArraySource({"x": np.arange(20)}), tmp_path / "kept.npy"
    assert jl.FilteredSource(source, _even, indices=path).indices.tolist() == list(range(0, 20, 2))
    with monkeypatch.context() as patched:  # read back: not found again
        patched.setattr("jaxloader.derived.filtered._kept", lambda *a: 1 / 0)
        assert jl.FilteredSource(source, _even, indices=path).indices.tolist()[:2] == [0, 2]
    with pytest.warns(UserWarning, match=r"kept.npy was found from another keep function than "
                                         r"this run's \(or the same function under another "
                                         r"Python.*\) \(as .*kept.npy.from says\): found "
                                         r"again, "
                                         r"and saved over it"):
        third = jl.FilteredSource(source, _third, indices=path)
    assert third.indices.tolist() == np.load(path).tolist() == list(range(0, 20, 3))
    with pytest.warns(UserWarning, match=r"from another source than"):  # the same function
        shifted = jl.FilteredSource(jl.ArraySource({"x": np.arange(1, 21)}), _third,
                                    indices=path)
    assert shifted.indices.tolist() == list(range(2, 20, 3))
    np.save(path, np.array([1, 2]))  # (a run cut short between the array and its .from)
    with pytest.warns(UserWarning, match=r"kept.npy is not the array .*kept.npy.from was written "
                                         r"with .*found again"):
        assert jl.FilteredSource(jl.ArraySource({"x": np.arange(1, 21)}), _third,
                                 indices=path).indices.tolist() == list(range(2, 20, 3))
    np.save(path, np.array([3, 4]))  # changed by hand: without keep, read as it is (over the
    assert jl.FilteredSource(jl.ArraySource({"x": np.arange(1, 21)}),  # source its .from names:
                             indices=path).indices.tolist() == [3, 4]  # another one's refused)
    np.save(path, np.array(list(range(2, 20, 3))))
    (tmp_path / "kept.npy.from").unlink()  # a file of the user's: read as it is
    assert jl.FilteredSource(source, _even, indices=path).indices.tolist() == list(
        range(2, 20, 3))


_LIMIT = 5


class _AtLeast:  # state in __slots__, Python's own repr (an address)
    __slots__ = ("n",)

    def __init__(self, n):
        self.n = n

    def __call__(self, record):
        return record["x"] >= self.n


class _Keeps:
    def __init__(self, n):
        self.n = n

    def keep(self, record):  # a bound method: its object holds what it keeps
        return record["x"] >= self.n


def test_an_indices_file_sees_what_the_function_reads_beyond_its_code(tmp_path, monkeypatch):
    """A global it names, a function of the user's module it calls, a bound method's object, an
    object's __slots__: each changed, the file is found again (it was read back stale)."""
    import importlib
    import sys

    source = jl.ArraySource({"x": np.arange(20)})

    def kept(keep, name):
        return jl.FilteredSource(source, keep, indices=tmp_path / f"{name}.npy").indices.tolist()

    over_limit = lambda r: r["x"] > _LIMIT  # noqa: E731 - one function, its global changed
    assert kept(over_limit, "global") == list(range(6, 20))
    monkeypatch.setitem(globals(), "_LIMIT", 15)
    with pytest.warns(UserWarning, match="found again"):
        assert kept(over_limit, "global") == list(range(16, 20))
    (tmp_path / "user_helpers.py").write_text("def keep_big(r):\n    return r['x'] > 5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_helpers
    calls_helper = lambda r: user_helpers.keep_big(r)  # noqa: E731 - its helper changed
    assert kept(calls_helper, "helper") == list(range(6, 20))
    (tmp_path / "user_helpers.py").write_text("def keep_big(r):\n    return r['x'] > 17\n")
    importlib.reload(user_helpers)
    with pytest.warns(UserWarning, match="found again"):
        assert kept(calls_helper, "helper") == [18, 19]
    sys.modules.pop("user_helpers")
    for make in (_AtLeast, lambda n: _Keeps(n).keep):
        name = getattr(make, "__name__", "bound")
        assert kept(make(5), name) == list(range(5, 20))
        assert kept(make(5), name) == list(range(5, 20))  # (an equal one: read back)
        with pytest.warns(UserWarning, match="found again"):
            assert kept(make(18), name) == [18, 19]


def test_an_indices_file_of_a_predicate_with_another_default_argument_is_found_again(tmp_path):
    # the phase's bound as a default (lambda r, m=m: ...): the second phase read the first's
    # kept records back, 90 where 10 passed, without a word
    def at_least(m):
        return lambda r, m=m: r["x"] >= m

    source, path = jl.ArraySource({"x": np.arange(100)}), tmp_path / "kept.npy"
    assert len(jl.FilteredSource(source, at_least(10), indices=path)) == 90
    with pytest.warns(UserWarning, match="found again"):
        assert len(jl.FilteredSource(source, at_least(90), indices=path)) == 10


def test_a_file_kept_over_long_records_by_an_older_version_is_read_back(tmp_path):
    # their record_spec whole then, compacted now (2026-11-30): the source's fingerprint
    # another, the records filtered again over the whole dataset, with a warning
    from jaxloader.base.abilities import in_generation
    from jaxloader.sources.fingerprint import combined, file_stamps

    records = [{"t": list(range(300)), "i": i} for i in range(10)]
    path, keep = tmp_path / "kept.npy", lambda r: r["i"] > 3
    assert len(jl.FilteredSource(records, keep, indices=path)) == 6
    said = json.loads((tmp_path / "kept.npy.from").read_text())
    then = in_generation(1, lambda: combined("source", 10, [records], *file_stamps(records)))
    assert then != said["source"]
    (tmp_path / "kept.npy.from").write_text(json.dumps({**said, "source": then}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(jl.FilteredSource(records, keep, indices=path)) == 6


def test_a_function_with_a_set_of_strings_has_one_digest_in_every_process():
    # a frozenset's repr follows the process's random string hashing: a file found again and
    # a warning on every run, each host rewriting it
    script = ("from jaxloader.sources.code_digest import code_digest\n"
              "print(code_digest(lambda r: r['lang'] in {'en', 'de', 'fr', 'es', 'it'}))\n")
    import subprocess
    import sys

    digests = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              check=True, env={**__import__("os").environ,
                                               "PYTHONHASHSEED": str(seed)}).stdout
               for seed in (1, 2, 3)}
    assert len(digests) == 1


def _positive(record):
    return record["v"] > 0


def test_an_indices_file_is_found_again_when_a_parquet_file_is_rewritten_alike(tmp_path):
    # the same rows in another order: the same size, row count, schema and footer statistics;
    # the kept records were read back stale, every one of them a record the function rejects
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    data, path = tmp_path / "d.parquet", tmp_path / "kept.npy"
    pq.write_table(pa.table({"v": np.array([1, -1, 2, -2, 3, -3])}), data)
    assert jl.FilteredSource(jl.ParquetSource(str(data)), _positive,
                             indices=path).indices.tolist() == [0, 2, 4]
    stat = os.stat(data)
    pq.write_table(pa.table({"v": np.array([-1, 1, -2, 2, -3, 3])}), data)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # (a coarse clock's)
    with pytest.warns(UserWarning, match=r"from another source than"):
        again = jl.FilteredSource(jl.ParquetSource(str(data)), _positive, indices=path)
    assert again.indices.tolist() == [1, 3, 5]


def test_an_indices_file_an_older_version_kept_over_parquet_is_read_back(tmp_path):
    # its .from holds the source as that version fingerprinted it (a ParquetSource's before
    # 2026-11-29 took the Arrow schema's text): it was found again over the whole dataset, with
    # a warning that it came "from another source"
    import warnings

    import pyarrow as pa
    import pyarrow.parquet as pq

    from jaxloader.base.abilities import OLDER
    from jaxloader.sources.fingerprint import combined, file_stamps

    data, path = tmp_path / "d.parquet", tmp_path / "kept.npy"
    pq.write_table(pa.table({"v": np.array([1, -1, 2, -2, 3, -3])}), data)
    source = jl.ParquetSource(str(data))
    jl.FilteredSource(source, _positive, indices=path)
    said = json.loads((tmp_path / "kept.npy.from").read_text())
    token = OLDER.set(1)
    try:
        said["source"] = combined("source", 6, [source], *file_stamps(source))
    finally:
        OLDER.reset(token)
    (tmp_path / "kept.npy.from").write_text(json.dumps(said))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = jl.FilteredSource(jl.ParquetSource(str(data)), _positive, indices=path)
    assert kept.indices.tolist() == [0, 2, 4]  # (read back: a finding again warns)


def has_foreground(r):
    return bool(r["label"].any())


def test_an_indices_file_is_found_again_when_a_memory_mapped_array_is_saved_again(tmp_path):
    # (a label map re-annotated and saved under its name: the source's fingerprint reads
    # records 0, n // 2 and n - 1 only, and the kept cases came from the old labels, silently)
    labels = np.ones((8, 4, 4), np.uint8)
    np.save(tmp_path / "labels.npy", labels)
    kept = str(tmp_path / "kept.npy")

    class Labels(jl.ArraySource):  # (a subclass of the user's holds its arrays as well)
        pass

    def kept_cases():
        source = Labels({"label": np.load(tmp_path / "labels.npy", mmap_mode="r")})
        return jl.FilteredSource(source, has_foreground, indices=kept).indices.tolist()

    assert kept_cases() == list(range(8))
    labels[3] = 0  # (case 3 emptied, written as a new file under the same name)
    np.save(tmp_path / "new.npy", labels)
    __import__("os").replace(tmp_path / "new.npy", tmp_path / "labels.npy")
    with pytest.warns(UserWarning, match=r"kept.npy was found from another source"):
        assert kept_cases() == [0, 1, 2, 4, 5, 6, 7]
    tokens = np.full(6400, 1000, np.int32)  # (a RaggedSource's values, memory-mapped: an LM's
    tokens[13] = 7  # tokens, filtered by a banned one, 7; its fingerprint samples every
    np.save(tmp_path / "tokens.npy", tokens)  # 100th value)

    def clean_documents():
        ragged = jl.RaggedSource({"ids": (np.load(tmp_path / "tokens.npy", mmap_mode="r"),
                                          np.arange(0, 6401, 800))})
        return jl.FilteredSource(ragged, lambda r: 7 not in r["ids"],
                                 indices=str(tmp_path / "clean.npy")).indices.tolist()

    assert clean_documents() == [1, 2, 3, 4, 5, 6, 7]
    tokens[13], tokens[4013] = 1000, 7  # (document 0 clean now, 5 not: same lengths)
    np.save(tmp_path / "new.npy", tokens)
    __import__("os").replace(tmp_path / "new.npy", tmp_path / "tokens.npy")
    with pytest.warns(UserWarning, match=r"clean.npy was found from another source"):
        assert clean_documents() == [0, 1, 2, 3, 4, 6, 7]
    from numpy.lib.stride_tricks import sliding_window_view  # (windows over a mapped series:

    def quiet_windows():  # the map is behind NumPy's own DummyArray base: stamped as well)
        series = np.load(tmp_path / "tokens.npy", mmap_mode="r")
        windows = jl.ArraySource({"w": sliding_window_view(series, 800)[::800]})
        return jl.FilteredSource(windows, lambda r: 7 not in r["w"],
                                 indices=str(tmp_path / "quiet.npy")).indices.tolist()

    assert quiet_windows() == [0, 1, 2, 3, 4, 6, 7]
    tokens[4013], tokens[2413] = 1000, 7  # (window 5 clean now, 3 not)
    np.save(tmp_path / "new.npy", tokens)
    __import__("os").replace(tmp_path / "new.npy", tmp_path / "tokens.npy")
    with pytest.warns(UserWarning, match=r"quiet.npy was found from another source"):
        assert quiet_windows() == [0, 1, 2, 4, 5, 6, 7]


def test_a_state_restored_over_another_subset_says_the_kept_records_differ():
    # (an active-learning round's subset recomputed after a preemption: the refusal blamed
    # a function, options or data, never the indices)
    pool = jl.ArraySource({"x": np.arange(1000)})
    with jl.DataLoader(jl.FilteredSource(pool, indices=np.arange(0, 400, 2)),
                       batch_size=10) as loader:
        next(iter(loader))
        state = loader.state_dict()
    with jl.DataLoader(jl.FilteredSource(pool, indices=np.arange(1, 400, 2)),
                       batch_size=10) as loader:
        with pytest.raises(jl.StateDictError, match=r"same kind \(filtered\) and size, so what "
                                                    r"differs is inside it: the records it keeps"):
            loader.load_state_dict(state)


def test_a_keep_map_or_transform_that_calls_hash_is_warned_of_unless_the_seed_is_set(
        monkeypatch):
    # a group k-fold by hash(r["user"]) % 5 kept 2,400 records with num_workers=0 and 4,000
    # with 2 (str hashes are drawn anew in each process: the Parquet audit), without a word
    import zlib
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    src = jl.ArraySource({"user": np.array(["ann", "bob", "cy"] * 10)})
    with pytest.warns(UserWarning, match=r"FilteredSource\(keep\): .*<lambda> calls hash\(\), "
                                         r"whose value for a str or bytes Python draws anew .*"
                                         r"zlib.crc32"):
        jl.FilteredSource(src, lambda r: hash(str(r["user"])) % 2 == hash("ann") % 2)
    with pytest.warns(UserWarning, match=r"MapSource\(fn\): .* calls hash\(\)"):
        jl.MapSource(src, lambda r: {"bucket": hash(str(r["user"])) % 7})
    with pytest.warns(UserWarning, match=r"transforms\[1\]: .* calls hash\(\)"):
        jl.DataLoader(src, batch_size=3, process_index=0, process_count=1, transforms=[
            jl.Map(lambda r: r), jl.Map(lambda r: {"bucket": hash(str(r["user"])) % 7})])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jl.FilteredSource(src, lambda r: zlib.crc32(str(r["user"]).encode()) % 2 == 0)
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # (set after this process started: the
    with pytest.warns(UserWarning, match=r"calls hash\(\)"):  # workers' alone, the review)
        jl.FilteredSource(src, lambda r: hash(str(r["user"])) % 2 == hash("ann") % 2)
    script = ("import warnings; warnings.simplefilter('error'); import numpy as np, jaxloader "
              "as jl; jl.FilteredSource(jl.ArraySource({'u': np.array(['a', 'b'])}), "
              "lambda r: hash(str(r['u'])) % 2 == hash('a') % 2)")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ,
                                                                   "PYTHONHASHSEED": "7"})


def test_a_kept_file_whose_header_claims_more_than_memory_is_named(tmp_path):
    # a .npy header of 10**11 rows gave a bare MemoryError ("Unable to allocate 745. GiB"),
    # naming no file (the hostile-input audit)
    path = tmp_path / "kept.npy"
    np.save(path, np.arange(10, dtype=np.int64))
    path.write_bytes(path.read_bytes().replace(b"(10,)", b"(100000000000,)"))
    with pytest.raises(jl.ConfigError, match=r"kept.npy: its header asks for int64\(100000000000,"
                                             r"\) \(800,000,000,000 bytes\), more memory than "
                                             r"this process has, where the file holds \d+ bytes"):
        jl.FilteredSource(jl.ArraySource({"x": np.arange(10)}), lambda r: True, indices=path)


def test_a_read_that_fails_in_a_filters_or_packers_pass_names_the_pass_and_the_record():
    # a source's KeyError in the scan FilteredSource or PackedSource makes as it is made came
    # bare: no record, no pass named (when keep raised, the record was; the compositions audit)
    class Broken:
        def __len__(self):
            return 40

        def __getitem__(self, i):
            if i == 13:
                raise KeyError("label")
            return {"t": np.arange(1 + i % 3, dtype=np.int32), "label": np.int64(i % 2)}

    for make, what in ((lambda: jl.FilteredSource(Broken(), lambda r: r["label"] == 0),
                        "FilteredSource"),
                       (lambda: jl.PackedSource(Broken(), "t", 8), "PackedSource")):
        with pytest.raises(KeyError, match="label") as caught:  # (its type kept: a note)
            make()
        assert f"{what}, reading its source once as it is made: record 13, source[13], " \
            "raised this" in caught.value.__notes__, caught.value.__notes__
