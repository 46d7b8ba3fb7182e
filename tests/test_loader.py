from __future__ import annotations

import functools
import json
import logging
import re
import sys
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.base.errors import JaxloaderError, RecordError, StateDictError
from resume_harness import assert_same_stream


def source(n=10):
    return jl.ArraySource({"x": np.arange(n, dtype=np.int32), "y": np.arange(n) % 3})


def loader(n=10, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("process_index", 0)
    kw.setdefault("process_count", 1)
    return jl.DataLoader(source(n), **kw)


def test_len_and_policies():
    assert len(loader()) == 2 and [b["x"].tolist() for b in loader()] == [[0, 1, 2, 3],
                                                                         [4, 5, 6, 7]]
    partial = [b["x"].tolist() for b in loader(last_batch="partial")]
    assert partial[-1] == [8, 9] and len(loader(last_batch="partial")) == 3
    padded = list(loader(last_batch="pad"))
    assert padded[-1]["x"].tolist() == [8, 9, 8, 8]
    assert padded[-1]["mask"].tolist() == [True, True, False, False]
    assert all(b["mask"].dtype == np.bool_ for b in padded)


def _digits(shard):
    yield from range(5)


def _words(shard):
    yield from "ab"


def test_repr_says_what_a_loader_reads_how_and_where_it_is():
    # it was <jaxloader.loader.DataLoader object at 0x...>
    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(10)}), batch_size=4,
                           process_index=0, process_count=1)
    it = iter(loader)
    next(it)
    assert repr(loader) == ("DataLoader(ArraySource(10 records; ['x'] (10,) int64), 2 batches an "
                            "epoch, batch_size=4, num_workers=0, step=1)")
    # an iterator's was <jaxloader.loaders.iterator.LoaderIterator object at 0x...>
    assert repr(it) == "LoaderIterator(DataLoader, next step 1, ends before step 2)"
    later = iter(loader)
    assert repr(it) == "LoaderIterator(DataLoader, stale: a later iter() or restore of its loader)"
    loader.close()
    assert repr(later) == "LoaderIterator(DataLoader, closed)"
    assert repr(loader).endswith("num_workers=0, step=1, closed)")  # (said as the open one)
    pair = jl.ArraySource({"image": np.zeros((3, 2, 2), np.uint8), "label": np.arange(3)})
    assert repr(pair) == "ArraySource(3 records; ['image'] (3, 2, 2) uint8, ['label'] (3,) int64)"
    digits = jl.Stream.from_generator(_digits, shards=4, shuffle_window=10)
    words = jl.Stream.from_generator(_words, shards=4)
    assert repr(digits) == ("Stream(4 shards: _digits[0], _digits[1], _digits[2], ... "
                            "(1 more); shuffle_window=10)")
    stream = jl.StreamLoader(jl.mix([digits, words], [0.25, 0.75]), batch_size=2,
                             process_index=1, process_count=2)
    assert repr(stream) == (f"StreamLoader(MixedStream([{digits!r}, {words!r}], weights=[0.25, "
                            "0.75]), batch_size=2, process 1 of 2, num_workers=0, step=0)")
    assert repr(jl.PackedStream(digits, "tokens", 16)).startswith(
        "PackedStream(Stream(4 shards: ")
    records = jl.DataLoader([{"x": i} for i in range(10_000)], batch_size=10,
                            process_index=0, process_count=1)
    assert repr(records) == ("DataLoader([{'x': 0}, {'x': 1}, {'x': 2}, {'x': 3}, ...] (10,000 "
                             "records), 1000 batches an epoch, batch_size=10, num_workers=0, "
                             "step=0)")
    assert repr(jl.MapSource(records._source, lambda r: r)).startswith(
        "MapSource([{'x': 0}, {'x': 1}, {'x': 2}, {'x': 3}, ...] (10,000 records), test_repr")


def test_pad_needs_dict_records_and_a_free_mask_key():
    tuple_source = jl.ArraySource((np.arange(10),))
    # (eval: 'drop' alone as the way out would lose records; 'partial' keeps them)
    with pytest.raises(jl.CollateError, match="dicts.*last_batch='partial'"):
        next(iter(jl.DataLoader(tuple_source, batch_size=4, last_batch="pad", process_index=0,
                                process_count=1)))
    with pytest.raises(jl.CollateError, match="mask_key"):
        next(iter(jl.DataLoader(jl.ArraySource({"mask": np.arange(10)}), batch_size=4,
                                last_batch="pad", process_index=0, process_count=1)))
    named = loader(last_batch="pad", mask_key="valid")
    assert "valid" in next(iter(named))
    with pytest.raises(jl.ConfigError, match=r"mask_key: expected a non-empty str .*got str ''"):
        loader(last_batch="pad", mask_key="")  # (was taken: a batch[""] leaf)


def test_epoch_loop_and_num_epochs():
    dl = loader(shuffle=True)
    first, second = [list(dl) for _ in range(2)]
    assert len(first) == len(second) == 2 and dl.epoch == 2 and dl.step == 4
    assert len(list(loader(num_epochs=3))) == 6
    it = iter(loader(num_epochs=None))
    assert len([next(it) for _ in range(50)]) == 50


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pass_of_several_epochs_restored_mid_pass_ends_where_the_saved_run_would(
        num_workers, caplog):
    """num_epochs=3: a run restored in its third epoch gave that epoch's rest and 2 more."""
    full = [b["x"].copy() for b in loader(20, shuffle=True, num_epochs=3)]  # 3 x 5 steps
    for k in (3, 7, 12):
        dl = loader(20, shuffle=True, num_epochs=3)
        it = iter(dl)
        for _ in range(k):
            next(it)
        with loader(20, shuffle=True, num_epochs=3, num_workers=num_workers) as restored:
            restored.load_state_dict(dl.state_dict())
            rest = [b["x"].copy() for b in restored]
            assert restored.epoch == 3 and len(list(restored)) == 15  # then the next pass
        assert len(rest) == 15 - k and all(np.array_equal(a, b) for a, b in zip(rest, full[k:]))
    dl = loader(20, shuffle=True, num_epochs=3)
    list(dl)
    with loader(20, shuffle=True, num_epochs=3, num_workers=num_workers) as restored:
        restored.load_state_dict(dl.state_dict())  # (at the end of the pass: dl ran through)
        with pytest.warns(UserWarning, match=r"DataLoader was restored at the end of a pass: "
                                             r"this iter\(\) begins the next one, epoch 3 to 5"):
            assert len(list(restored)) == 15  # (a run that had ended there trains on: said)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (once: not at an iter() without a restore)
            assert len(list(restored)) == 15
    dl = loader(20, shuffle=True)  # an epoch loop's loader, saved at an epoch's end: its
    for _ in range(2):  # restore goes on, the next epoch; said in the log, no warning
        list(dl)
    with loader(20, shuffle=True) as restored, warnings.catch_warnings(), \
            caplog.at_level(logging.INFO, "jaxloader"):
        warnings.simplefilter("error")
        restored.load_state_dict(dl.state_dict())
        assert [b["x"].tolist() for b in restored] == [b["x"].tolist() for b in dl]
        assert "restored at the end of a pass: this iter() begins the next one, epoch 2," \
            in caplog.text
    dl = loader(20, shuffle=True, num_epochs=3)
    it = iter(dl)
    head = [next(it)["x"].copy() for _ in range(7)]
    again = [b["x"].copy() for b in dl]  # iter() again mid-pass: the rest of that pass
    assert len(head) + len(again) == 15 and np.array_equal(again[0], full[7])


def test_vectorised_and_per_record_paths_agree():
    fast = list(loader(shuffle=True, num_epochs=2))
    slow = list(loader(shuffle=True, num_epochs=2, transforms=[jl.Map(lambda r: r)]))
    for a, b in zip(fast, slow):
        assert a["x"].tolist() == b["x"].tolist() and a["y"].dtype == b["y"].dtype


def test_batch_map_runs_after_collation():
    dl = loader(transforms=[jl.Map(lambda r: {**r, "x": r["x"] * 2}),
                            jl.BatchMap(lambda b: {**b, "sum": b["x"].sum(keepdims=True)
                                                   .repeat(len(b["x"]))})])
    batch = next(iter(dl))
    assert batch["x"].tolist() == [0, 2, 4, 6] and batch["sum"].tolist() == [12] * 4


def test_list_getitems_sources_are_collated():
    class ListBatches:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"v": np.float32(i)}

        def __getitems__(self, idx):
            return [self[i] for i in idx]

    batch = next(iter(jl.DataLoader(ListBatches(), batch_size=3, process_index=0,
                                    process_count=1)))
    assert batch["v"].dtype == np.float32 and batch["v"].tolist() == [0, 1, 2]

    class ListColumn(ListBatches):  # (a column of text as a Python list: a pytree node)
        def __getitems__(self, idx):
            return {"v": np.asarray(idx, np.float32), "s": [f"r{i}" for i in idx]}

    with pytest.raises(jl.CollateError, match=r"leaf \['s'\]\[0\].*a list or tuple in a batch "
                       r"is a pytree node.*dtype=object for strings"):
        next(iter(jl.DataLoader(ListColumn(), batch_size=3)))


@pytest.mark.parametrize("extra", [-1, 1])
@pytest.mark.parametrize("how", ["plain", "map", "concat", "worker"])
def test_a_getitems_list_of_another_length_is_refused(extra, how):
    # A __getitems__ that left out a record it could not decode made batches of 3 rows for
    # batch_size=4 (a quarter of the records never seen), one record too many made batches of 5;
    # with a Map the records after it shifted, and a ConcatSource's part left a None in place.
    class OffByOne:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"x": np.int64(i)}

        def __getitems__(self, idx):
            got = [self[i] for i in idx]
            return got[:-1] if extra < 0 else got + got[:1]

    source: object = OffByOne()
    if how == "concat":
        source = jl.ConcatSource([source, OffByOne()])
    transforms = [jl.Map(lambda r: r)] if how == "map" else []
    dl = jl.DataLoader(source, batch_size=4, transforms=transforms,
                       num_workers=1 if how == "worker" else 0, process_index=0, process_count=1)
    with dl, pytest.raises(JaxloaderError, match=r"__getitems__ returned [35] records for 4 "
                           r"indices: expected one record an index.*FilteredSource"):
        next(iter(dl))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_source_whose_length_moved_is_refused_at_iter(num_workers):
    # Records appended after the loader was made were never read (its order covers the
    # records it had), and with workers a shortened source was read from their copies.
    records = [{"x": np.int64(i)} for i in range(8)]
    with jl.DataLoader(records, batch_size=4, num_workers=num_workers, process_index=0,
                       process_count=1) as dl:
        assert [b["x"].tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        records.extend({"x": np.int64(i)} for i in range(8, 12))
        for call in (iter, jl.DataLoader.peek):
            with pytest.raises(jl.ConfigError, match=r"the source's length changed from 8 to "
                               r"12 since the loader was made: .*make a new DataLoader"):
                call(dl)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_source_that_grows_under_an_endless_loader_is_refused_at_the_next_epoch(num_workers):
    # a replay buffer (a list appended to) read by a step loop's one iter(): the records added
    # were never read, without a word, and state_dict() saved the grown source's fingerprint
    # with the loader's length: a state no source restores (refused at load, blaming the data)
    records = [{"x": np.int64(i)} for i in range(8)]
    with jl.DataLoader(records, batch_size=4, num_epochs=None, num_workers=num_workers,
                       process_index=0, process_count=1) as dl:
        it = iter(dl)
        assert next(it)["x"].tolist() == [0, 1, 2, 3]
        records.extend({"x": np.int64(i)} for i in range(8, 12))
        with pytest.raises(jl.ConfigError, match=r"length changed from 8 to 12"):
            dl.state_dict()
        assert next(it)["x"].tolist() == [4, 5, 6, 7]  # (the epoch the loader began)
        for _ in range(2):  # (and again: the next epoch is not read over the old order)
            with pytest.raises(jl.ConfigError, match=r"length changed from 8 to 12 since the "
                               r"loader was made: .*make a new DataLoader"):
                next(it)
        del records[8:]
        assert next(it)["x"].tolist() == [0, 1, 2, 3]


def test_a_raising_transform_names_the_record_and_keeps_the_cause():
    def boom(r):
        if int(r["x"]) == 6:
            raise KeyError("bad record")
        return r

    dl = loader(transforms=[jl.Map(boom)])
    it = iter(dl)
    next(it)
    with pytest.raises(RecordError) as e:
        next(it)
    msg = str(e.value)
    assert "record position 6" in msg and "step 1" in msg and "KeyError" in msg
    assert isinstance(e.value.__cause__, KeyError)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_collate_error_names_the_step_and_the_source_index_of_a_shuffled_record(num_workers):
    records = [{"x": np.zeros(3, np.float32)} for _ in range(40)]
    records[17] = {"x": np.zeros(4, np.float32)}  # the one a user must find in the data
    dl = jl.DataLoader(records, batch_size=8, shuffle=True, seed=1, num_workers=num_workers,
                       process_index=0, process_count=1)
    bad = next(s for s in range(5) if 17 in dl._sampler.batch(s).indices)
    spec = dl._sampler.batch(bad)
    position = int(spec.positions[spec.indices.tolist().index(17)])
    with dl, pytest.raises(jl.JaxloaderError) as e:
        list(dl)
    msg = str(e.value)
    assert f"step {bad} (epoch 0" in msg  # (with workers, as with none)
    assert f"record position {position} (source index 17) has shape (4,)" in msg
    # the CollateError itself (a worker's: the WorkerError's cause), as the process's: its
    # step first (a worker's lost it, for code that logs the cause)
    cause = e.value if num_workers == 0 else e.value.__cause__
    assert isinstance(cause, jl.CollateError)
    assert re.match(rf"step {bad} \(epoch 0, record positions \d+\.\.\d+\): batch leaf \['x'\]",
                    str(cause)), str(cause)
    with jl.DataLoader(records, batch_size=8, shuffle=True, seed=1, process_index=0,
                       process_count=1) as peeked:
        peeked.load_state_dict({**peeked.state_dict(), "step": bad})
        with pytest.raises(jl.CollateError, match=rf"^step {bad} \(epoch 0, record positions "):
            peeked.peek()  # (made in this process, outside the engine)


def test_a_streams_collate_error_in_process_names_its_step_and_row():
    def numbers(shard):
        for i in range(12):
            yield {"x": np.zeros(4 if i == 6 else 3, np.float32)}

    for peek in (False, True):
        with jl.StreamLoader(jl.Stream.from_generator(numbers, 1), batch_size=4,
                             num_workers=0) as dl, pytest.raises(jl.CollateError) as e:
            if peek:
                it = iter(dl)
                next(it)
                dl.peek()
            else:
                list(dl)
        assert str(e.value).startswith("stream step 1 (reader 0, its batch 1): batch leaf ['x']")
        shard = "test_a_streams_collate_error_in_process_names_its_step_and_row.<locals>.numbers[0]"
        assert (f"row 0 ({shard} record 5) has shape (3,) dtype float32, row 2 ({shard} record "
                "7) has shape (4,)") in str(e.value)


def test_an_error_in_the_main_process_repeats_its_step_instead_of_ending_the_stream():
    failures = {"left": 1}

    def flaky(r):  # fails once at record 6, like a network read that times out
        if int(r["x"]) == 6 and failures["left"]:
            failures["left"] -= 1
            raise OSError("timed out")
        return r

    with loader(transforms=[jl.Map(flaky)]) as dl:
        it = iter(dl)
        first = next(it)
        with pytest.raises(RecordError):
            next(it)
        assert dl.step == 1
        retried = next(it)  # the same step again, not the one after, not StopIteration
    with loader() as plain:
        want = [b["x"].copy() for b in plain]
    assert first["x"].tolist() == want[0].tolist() and retried["x"].tolist() == want[1].tolist()


def test_a_lasting_error_raises_again_at_the_same_step():
    def broken(r):
        if int(r["x"]) == 6:
            raise ValueError("corrupt record")
        return r

    with loader(transforms=[jl.Map(broken)]) as dl:
        it = iter(dl)
        next(it)
        for _ in range(2):
            with pytest.raises(RecordError, match="step 1"):
                next(it)


def test_a_raising_source_names_the_index():
    class Broken:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 5:
                raise OSError("disk")
            return {"i": i}

    with pytest.raises(RecordError, match=r"source index 5.*source\[index\].*OSError"):
        list(jl.DataLoader(Broken(), batch_size=4, process_index=0, process_count=1))


@pytest.mark.parametrize("kw,match", [
    (dict(batch_size=0), "batch_size"),
    (dict(batch_size=-1), "batch_size"),
    (dict(last_batch="padd"), "last_batch.*'padd'"),
    (dict(num_epochs=0), "num_epochs"),
    (dict(num_workers=-1), "num_workers"),
    (dict(transforms=[5]), r"transforms\[0\]"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(jl.ConfigError, match=match):
        loader(**kw)


def test_a_flag_given_anything_but_true_or_false_is_refused_naming_it(tmp_path, monkeypatch):
    # checked by truth: "no" was taken as True (a MapSource's function given columns, shards
    # shuffled), and PackedSource took seed=True where NumPy's ints were refused
    monkeypatch.chdir(tmp_path)  # (shards of files that are there: a.jsonl, a.tar)
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "a.tar").write_bytes(b"")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    src = jl.ArraySource({"x": np.arange(4)})

    class Records:  # reads no batch: batched="no" was told so, not that "no" is no bool
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"x": i}

    made = [("Stream(shuffle_shards)", lambda v: jl.Stream([jl.JsonlShard("a.jsonl")],
                                                            shuffle_shards=v)),
            ("JsonlShard(append_only)", lambda v: jl.JsonlShard("a.jsonl", append_only=v)),
            ("TarShard(tolerate_missing_end)",
             lambda v: jl.TarShard("a.tar", tolerate_missing_end=v)),
            ("ParquetSource(share_decoded)",
             lambda v: jl.ParquetSource(tmp_path / "a.parquet", share_decoded=v)),
            ("MapSource(batched)", lambda v: jl.MapSource(src, dict, batched=v)),
            ("MapSource(batched)", lambda v: jl.MapSource(Records(), dict, batched=v)),
            ("MapSource(lengths_kept)", lambda v: jl.MapSource(src, dict, lengths_kept=v)),
            ("JitMap(random)", lambda v: jl.JitMap(lambda r: r, random=v))]
    for name, make in made:
        for value in ("no", 2, None)[:2 if name == "JitMap(random)" else 3]:  # (None: asked
            with pytest.raises(jl.ConfigError, match=rf"^{re.escape(name)}: expected True or "
                                                     rf"False, got {type(value).__name__}"):
                make(value)  # of the function, for a JitMap)
        make(np.bool_(False))  # (NumPy's bool is one)
    tokens = jl.ArraySource({"tokens": np.ones((4, 3), np.int32)})
    with pytest.raises(jl.ConfigError, match=r"PackedSource\(seed=...\): expected an int, got "
                                             r"bool True"):
        jl.PackedSource(tokens, "tokens", 6, seed=True)
    assert jl.PackedSource(tokens, "tokens", 6, seed=np.int64(3)).config["seed"] == 3


def test_empty_source_is_refused():
    with pytest.raises(jl.ConfigError, match="empty"):
        jl.DataLoader(jl.ArraySource({"a": np.zeros((0,))}), batch_size=1)


@pytest.mark.parametrize("change,key", [
    (dict(n=12), "num_records"),
    (dict(seed=3), "seed"),
    (dict(batch_size=2), "global_batch_size"),
    (dict(shuffle=False), "shuffle"),
    (dict(last_batch="pad"), "last_batch"),
])
def test_state_from_another_loader_lists_expected_and_received(change, key):
    n = change.pop("n", 10)
    state = loader(shuffle=True, seed=1).state_dict()
    kw = {"shuffle": True, "seed": 1, **change}
    with pytest.raises(StateDictError, match=f"{key}: expected .*, received "):
        loader(n=n, **kw).load_state_dict(state)


def test_state_with_unknown_version_or_missing_keys():
    dl = loader()
    state = dl.state_dict()
    with pytest.raises(StateDictError, match="version.*expected 1, received 99"):
        dl.load_state_dict({**state, "version": 99})
    with pytest.raises(StateDictError, match=r"missing keys \['seed'\]"):
        dl.load_state_dict({k: v for k, v in state.items() if k != "seed"})
    with pytest.raises(StateDictError, match="step"):
        dl.load_state_dict({**state, "step": -1})


def test_stale_iterators_and_close():
    dl = loader(num_epochs=None)
    it = iter(dl)
    next(it)
    dl.load_state_dict(dl.state_dict())
    with pytest.raises(jl.JaxloaderError, match="stale"):
        next(it)
    with dl:
        pass
    dl.close()  # idempotent
    with pytest.raises(jl.JaxloaderError, match="closed"):
        iter(dl)
    with pytest.raises(jl.JaxloaderError, match="closed"):
        next(it)
    stream = jl.StreamLoader(jl.Stream.from_generator(_digits, shards=1), batch_size=2,
                             process_index=0, process_count=1)
    it = iter(stream)
    iter(stream)
    with pytest.raises(jl.JaxloaderError, match="called on its StreamLoader since"):
        next(it)  # it said "its DataLoader"
    stream.close()
    with pytest.raises(jl.JaxloaderError, match="^StreamLoader is closed"):
        iter(stream)
    workers = jl.DataLoader(source(), batch_size=2, num_workers=1, process_index=0,
                            process_count=1)
    next(iter(workers))
    assert len(workers.worker_pids) == 1
    workers.close()  # (its workers' pids were still said: another process's, in time)
    assert workers.worker_pids == []


def test_process_defaults_come_from_jax(monkeypatch):
    import jax

    dl = jl.DataLoader(source(), batch_size=2)
    assert dl.state_dict()["process_count"] == jax.process_count() == 1
    monkeypatch.setattr(jax, "process_index", lambda: 1)  # JAX imported: asked
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    dl = jl.DataLoader(source(), batch_size=2)
    assert (dl.process_index, dl.process_count) == (1, 2)
    dl = jl.DataLoader(source(), batch_size=2, process_index=0)  # one given: JAX says the other
    assert (dl.process_index, dl.process_count) == (0, 2)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_peek_shows_the_next_batch_and_leaves_the_stream_unchanged(num_workers):
    def make():
        return jl.DataLoader(jl.ArraySource({"x": np.arange(40.0).reshape(20, 2)}), batch_size=4,
                             shuffle=True, seed=3, num_workers=num_workers,
                             transforms=[jl.RandomMap(lambda r, g: {"x": r["x"] + g.random()})],
                             process_index=0, process_count=1)

    with make() as reference:
        want = [b["x"].copy() for b in reference]
    with make() as loader:
        first = loader.peek()
        assert loader.step == 0 and np.array_equal(first["x"], want[0])
        it = iter(loader)
        got = [next(it)["x"].copy()]
        assert np.array_equal(loader.peek()["x"], want[1]) and loader.step == 1
        got += [b["x"].copy() for b in it]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_numpy_integers_as_arguments_give_the_same_batches_and_a_json_state():
    # a config read from arrays, a seed from np.random: np.int64 overflowed in the seed's
    # arithmetic (OverflowError) and put np.int64 into the state (json.dumps failed)
    src = jl.ArraySource({"x": np.arange(100)})
    ragged = jl.RaggedSource({"t": (np.arange(50), np.arange(0, 51, 5))})

    def run(i):
        made = [
            jl.DataLoader(src, batch_size=i(4), shuffle=True, seed=i(3), num_epochs=i(1),
                          process_index=i(0), process_count=i(1)),
            jl.DataLoader(src, batch_size=4, shuffle=jl.LocalShuffle(window=i(2),
                                                                     block_size=i(10)),
                          seed=i(1), process_index=0, process_count=1),
            jl.DataLoader(jl.mix([src, src], [0.5, 0.5]), batch_size=i(4), seed=i(2),
                          process_index=0, process_count=1),
            jl.DataLoader(jl.PackedSource(ragged, "t", i(8)), batch_size=2, seed=i(2),
                          process_index=0, process_count=1),
        ]
        out = []
        for loader in made:
            with loader:
                batches = [next(iter(loader)) for _ in range(2)]
                out.append((batches, json.loads(json.dumps(loader.state_dict()))))
        return out
    for (a, state_a), (b, state_b) in zip(run(np.int64), run(int)):
        assert_same_stream(a, b)
        assert state_a == state_b


def test_shuffle_takes_a_bool_or_a_local_shuffle_and_names_them_otherwise():
    for bad in ("yes", 1, "local"):
        with pytest.raises(jl.ConfigError, match=r"shuffle: expected True, False or "
                                                 r"jl.LocalShuffle\(window=...\), got"):
            loader(shuffle=bad)
    for good in (True, np.bool_(True), None, jl.LocalShuffle(window=2, block_size=2)):
        with loader(shuffle=good) as ok:  # None: PyTorch's default, no shuffle
            assert len(next(iter(ok))["x"]) == 4


def test_more_workers_than_sixteen_a_core_are_warned_of_at_the_users_line(monkeypatch):
    # num_workers=1000 (a typo) started 1000 interpreters without a word; PyTorch warns too.
    # Reads that wait 95% of the time keep 16 a core busy (the warning said 4: 32 workers
    # read a 2 ms-a-record source 3.7x faster than 8, on 2 cores)
    import jaxloader.loaders.options as options

    monkeypatch.setattr(options, "cores_available", lambda: 1)
    src = jl.ArraySource({"x": np.arange(8)})
    with pytest.warns(jl.PerformanceWarning, match=r"num_workers=17: 17 worker processes on 1 "
                                                   r"cores, more than 16 a core") as said:
        jl.DataLoader(src, batch_size=4, num_workers=17, process_index=0,
                      process_count=1).close()
    assert said[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jl.DataLoader(src, batch_size=4, num_workers=16, process_index=0, process_count=1,
                      timeout_s=np.float32(2)).close()  # (NumPy's float: refused before)


def test_a_wrong_kind_of_argument_is_named_not_a_pythons_error_deep_inside(tmp_path,
                                                                           monkeypatch):
    # each gave a bare TypeError, AttributeError, ValueError or IsADirectoryError from inside
    monkeypatch.chdir(tmp_path)  # (a shard of a file that is there: a.jsonl)
    (tmp_path / "a.jsonl").write_text("")
    import jaxloader.checkpoint as ckpt

    (tmp_path / "not.npy").write_text("hello")
    src = jl.ArraySource({"x": np.arange(8)})
    loader = jl.DataLoader(src, batch_size=4, process_index=0, process_count=1)

    class LengthOfAFloat:
        def __len__(self):
            return 8.0

        def __getitem__(self, i):
            return {"x": i}

    calls = [
        (lambda: jl.DataLoader(src, batch_size=4, transforms=3),
         r"transforms: expected a transform, a function or a list of them, got int 3"),
        # (it failed at record 0, in a RecordError of the TypeError)
        (lambda: jl.FilteredSource(src, lambda r, g: True),
         r"FilteredSource\(keep\): it is called as keep\(record\), but .*<lambda>\(r, g\) "
         r"cannot be"),
        # (run in the set's order: {double, inc} ran inc first)
        (lambda: jl.DataLoader(src, batch_size=4, transforms={abs, int}),
         r"transforms: got a set, whose order is not the one written.*pass a list"),
        # (the class: the first batch said "Map(fn): expected a callable, got dict")
        (lambda: jl.DataLoader(src, batch_size=4, transforms=[jl.Map]),
         r"transforms\[0\]: got the class Map, not one of its transforms; make one: Map\(fn\)"),
        (lambda: jl.PackedSource(jl.ArraySource({"t": np.ones((4, 3), np.int32)}), "t", 6,
                                 lengths=np.array([3, -1, 3, 3])),
         r"dtype int64, the least -1; pass each record's token count"),
        (lambda: jl.ConcatSource(src), r"ConcatSource\(sources\): expected a non-empty list of "
                                       r"sources, got ArraySource"),
        (lambda: jl.FileListSource(None), r"FileListSource\(paths\): expected a list of paths"),
        (lambda: jl.FileListSource(["a.bin", None]), r"FileListSource\(paths\[1\]\): expected "
                                                     r"a path"),
        (lambda: jl.ParquetSource(3), r"ParquetSource\(paths\): expected a path .* got int 3"),
        (lambda: jl.Stream.jsonl(None), r"Stream.jsonl\(paths\): expected a path"),
        (lambda: jl.JsonlShard(3), r"JsonlShard\(path\): expected a file's path"),
        (lambda: jl.TextShard(b"a.txt"), r"TextShard\(path\): expected a file's path"),
        (lambda: jl.ConcatSource({src}), r"expected a non-empty list of sources, got set"),
        (lambda: jl.Stream.from_generator(lambda i: iter([{"x": 1}]), 1).map(3),
         r"Stream.map\(fn\): expected a function of a record, got int 3"),
        (lambda: jl.PackedStream(jl.Stream([jl.JsonlShard("a.jsonl")]), "x", 8, dtype="int33"),
         r"PackedStream\(dtype\): expected an integer dtype for tokens .* got 'int33'"),
        (lambda: jl.DataLoader(LengthOfAFloat(), batch_size=4),
         r"LengthOfAFloat.__len__ must return an int >= 0"),
        (lambda: jl.FilteredSource(src, indices=tmp_path / "not.npy"),
         r"not.npy: expected a .npy file of one array .* it is not one"),
        (lambda: jl.FilteredSource(src, indices=tmp_path), r"expected a .npy file .* a folder"),
        (lambda: ckpt.write_state(tmp_path, iter(loader)),
         r"checkpoint.write_state\(directory, loader\): expected a DataLoader or StreamLoader "
         r".* got LoaderIterator; pass the loader itself"),
        (lambda: ckpt.restore_into(tmp_path, None), r"read_state\(directory, loader\): expected"),
        (lambda: jl.profile(loader, steps=None), r"profile\(steps=\): expected an int, got "
                                                 r"NoneType"),
        (lambda: jl.profile(lambda num_workers: loader, workers=2, out=None),
         r"profile\(workers=\): expected a list of worker counts"),
        (lambda: jl.profile(loader, out=tmp_path), r"profile\(out=.*\): a folder"),
    ]
    with loader:
        for call, said in calls:
            with pytest.raises(jl.ConfigError, match=said):
                call()
    assert len(jl.ConcatSource(s for s in [src, src])) == 16  # (a generator of parts: taken)
    assert len(jl.ConcatSource({"a": src, "b": src}.values())) == 16  # (and a dict's values)
    assert len(jl.Stream(jl.JsonlShard("a.jsonl")).shards) == 1  # (one shard: a list of it)
    with pytest.raises(OSError, match=r"make the directory first"):
        ckpt.write_state(tmp_path / "missing", loader)
    ckpt.write_state(tmp_path, loader)
    with pytest.raises(jl.StateDictError, match=r"found a file, not a directory \(pass its "
                                                r"folder"):
        ckpt.restore_into(tmp_path / "process_0-of-1.json", loader)


@pytest.mark.parametrize("call, said", [
    # (each was a bare ValueError from NumPy, a hang making shards, or a failure at a later step)
    (lambda: jl.DataLoader(np.arange(10), batch_size=10**30, process_index=0, process_count=1),
     r"batch_size: expected an int in \[1, 2147483648\], got 10{30}"),
    (lambda: jl.DataLoader(np.arange(10), batch_size=2**40, process_index=0, process_count=1),
     r"batch_size: expected an int in \[1, 2147483648\]"),
    (lambda: jl.Stream.from_generator(lambda i: range(3), shards=10**30),
     r"Stream.from_generator\(shards\): expected an int in \[1, 4194304\]"),
    (lambda: jl.Pad("x", length=10**30),
     r"Pad\(length\) of 'x': expected an int in \[1, 2147483647\]"),
    (lambda: jl.mix([np.arange(10), np.arange(5)], weights=[1, 1], from_step={10**30: [1, 2]}),
     r"mix\(from_step=...\) step: expected an int <= 2\*\*63 - 1"),
], ids=["batch_size", "batch_size_2**40", "shards", "Pad_length", "from_step"])
def test_an_absurd_size_is_refused_where_it_is_given(call, said):
    with pytest.raises(jl.ConfigError, match=said):
        call()


def test_sys_maxsize_for_no_bound_is_taken():
    # (int64's largest, which may mean "no bound": taken, as before the absurd sizes' bound)
    assert jl.LocalShuffle(window=sys.maxsize).window == sys.maxsize
    assert jl.DataLoader(np.arange(10), batch_size=2, num_epochs=sys.maxsize, process_index=0,
                         process_count=1).num_epochs == sys.maxsize


class _OneBad:
    """13 records; record 1 cannot be read (a missing file)."""

    def __len__(self) -> int:
        return 13

    def __getitem__(self, i: int):
        if i == 1:
            raise OSError("001.bin: no such file")
        return {"id": np.int64(i)}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_record_fails_only_its_own_batch_with_pad_and_the_documented_skip_ends(workers):
    # Pad rows repeated the epoch's first records: record 1 failed again in the last batch, as a
    # masked row, and the documented skip lost record 12 there, then began the next pass.
    seen, errors = [], []
    state = None
    while True:
        with jl.DataLoader(_OneBad(), batch_size=4, last_batch="pad", num_workers=workers) as lo:
            if state is not None:
                lo.load_state_dict(state)
                if state["step"] % len(lo) == 0:  # (troubleshooting.md: the pass is over)
                    break
            try:
                for batch in lo:
                    seen += batch["id"][batch["mask"]].tolist()
                break
            except jl.JaxloaderError as e:
                errors.append(e)
                state = lo.state_dict()
                state["step"] += 1
    assert len(errors) == 1 and "record position 1 " in str(errors[0])
    assert seen == [*range(4, 13)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_record_error_says_its_step_position_and_index_as_attributes(workers):
    # (an inference job that reports the records it could not read parsed the message)
    def bad_map(r):
        if int(r["id"]) == 9:
            raise ValueError("bad")
        return r

    for source, transforms, index in [(_OneBad(), [], 1),
                                      (jl.ArraySource({"id": np.arange(13)}), [jl.Map(bad_map)],
                                       9)]:
        with jl.DataLoader(source, batch_size=4, num_workers=workers, shuffle=True, seed=1,
                           transforms=transforms) as loader:
            with pytest.raises(jl.JaxloaderError) as raised:
                list(loader)
        error = raised.value if workers == 0 else raised.value.__cause__
        assert isinstance(error, jl.RecordError) and error.index == index
        position = loader._sampler.batch(error.step).positions.tolist().index(error.position)
        assert loader._sampler.batch(error.step).indices[position] == index
        assert f"record position {error.position} (source index {index})" in str(error)

    class Inner:  # (a source reading through a loader of its own: its error is about its own
        def __len__(self) -> int:  # record, and says this loader's as it passes through)
            return 13

        def __getitem__(self, i: int):
            if i == 4:
                next(iter(jl.DataLoader(_OneBad(), batch_size=4)))
            return {"id": np.int64(i)}

    for threads in (1, 2):  # (2, in process: a user's source read on threads under its lock)
        with jl.DataLoader(Inner(), batch_size=4, num_workers=workers,
                           read_threads=threads) as loader:
            with pytest.raises(jl.JaxloaderError) as raised:
                list(loader)
        error = raised.value if workers == 0 else raised.value.__cause__
        assert (error.step, error.position, error.index) == (1, 4, 4)


def test_drop_without_a_shuffle_says_which_records_no_epoch_reads():
    # (an evaluation loader of 127 records, batch 64, with the defaults read 64, the same 64
    # every epoch, without a word: PyTorch's default keeps the short batch)
    with pytest.warns(UserWarning, match=r"the last 63 of the 127 records are never read, in "
                                         r"any epoch .* last_batch='pad'.* or 'partial'"):
        jl.DataLoader(list(range(127)), batch_size=64)
    with pytest.warns(UserWarning, match=r"the last 31 of the 127 records") as said:  # (of two
        jl.DataLoader(list(range(127)), batch_size=16, process_index=0, process_count=2)
    assert "'partial'" not in str(said[0].message)  # (which several hosts refuse)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kw in ({"shuffle": True}, {"last_batch": "pad"}, {"last_batch": "partial"},
                   {"shuffle": jl.LocalShuffle(4)}):
            jl.DataLoader(list(range(127)), batch_size=64, **kw)
        jl.DataLoader(list(range(128)), batch_size=64)
        # (a loader refused for another argument is not warned of first: it is not made)
        with pytest.raises(jl.ConfigError, match=r"read_threads: expected an int"):
            jl.DataLoader(list(range(127)), batch_size=64, read_threads=0)


def test_an_evaluation_pass_over_a_mixture_is_told_its_last_positions_run_on():
    # (a mixture of validation sets, last_batch='pad', num_epochs=1, batch 7 over 100
    # records: 98 read a pass, other records missed each evaluation, without a word)
    parts = [jl.ArraySource({"id": np.arange(k, k + n)}) for k, n in ((0, 60), (100, 30),
                                                                       (200, 10))]
    for last_batch in ("pad", "partial"):
        with pytest.warns(UserWarning, match=rf"mix\(\.\.\.\), last_batch='{last_batch}', "
                                             r"num_epochs=1\): .* read 98 of its 100 positions "
                                             r"and the last 2 run on .*jl.ConcatSource"):
            jl.DataLoader(jl.mix(parts, weights=[0.6, 0.3, 0.1]), batch_size=7,
                          last_batch=last_batch, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (trained by steps, or whole epochs: nothing to say)
        jl.DataLoader(jl.mix(parts, weights=[0.6, 0.3, 0.1]), batch_size=7, last_batch="pad",
                      num_epochs=None)
        jl.DataLoader(jl.mix(parts, weights=[0.6, 0.3, 0.1]), batch_size=10, last_batch="pad")


def test_next_from_a_second_thread_at_once_is_refused_by_name_and_loses_no_batch():
    # (Keras' PyDataset(workers=N) calls next() from several threads: "ValueError: generator
    # already executing", and the other thread's batch dropped with the iterator's work)
    import threading

    entered, go = threading.Event(), threading.Event()

    class Held:
        def __len__(self):
            return 64

        def __getitem__(self, i):
            if i == 0:
                entered.set()
                go.wait(10)
            return {"x": np.int64(i)}

    loader = jl.DataLoader(Held(), batch_size=4, num_epochs=None, process_index=0,
                           process_count=1)
    it, got = iter(loader), []
    first = threading.Thread(target=lambda: got.append(next(it)["x"].tolist()))
    first.start()
    assert entered.wait(10)
    with pytest.raises(jl.JaxloaderError, match=r"next\(\) on this DataLoader iterator from "
                                                r"two threads at once.*PyDataset"):
        next(it)
    go.set()
    first.join(10)
    assert got == [[0, 1, 2, 3]] and next(it)["x"].tolist() == [4, 5, 6, 7]
    loader.close()


def test_a_loader_pickled_or_copied_says_to_make_it_where_it_is_read():
    # a spawn or forkserver Process given a loader said "cannot pickle '_thread.RLock' object"
    # (the process-managers audit)
    import copy
    import multiprocessing
    import pickle

    src = jl.ArraySource({"x": np.arange(8)})
    for loader in (jl.DataLoader(src, batch_size=4, process_index=0, process_count=1),
                   jl.StreamLoader(jl.Stream.from_generator(lambda i: iter([{"x": 1}]), 1),
                                   batch_size=1)):
        spawned = multiprocessing.get_context("spawn").Process(target=print, args=(loader,))
        with loader:
            for copying in (lambda: pickle.dumps(loader), lambda: copy.deepcopy(loader),
                            spawned.start):
                with pytest.raises(jl.JaxloaderError, match=r"Loader does not pickle .*make the "
                                                           r"\w+Loader in the process that reads"):
                    copying()


@pytest.mark.parametrize("path", ["data/train-*.parquet", b"abc"])
def test_a_path_given_as_the_source_is_refused_not_read_as_characters(path):
    # a str has len and [i]: its characters were the records, a batch of ['r', 'e', 't', '.']
    with pytest.raises(jl.ConfigError, match=r"source: got a (str|bytes) .*, a path, which "
                                             r"would be read as \d+ records, one a character; "
                                             r"read the files it names with a source: "
                                             r"jaxloader.ParquetSource\(path\), "
                                             r"ArrayRecordSource\(paths\), FileListSource"
                                             r"\(paths\) \(each file's bytes, decoded by a "
                                             r"Map\)"):  # (it said FileListSource(paths,
        jl.DataLoader(path, batch_size=4)  # read=...), which takes no read=)


def test_a_packed_or_mixed_stream_given_to_a_data_loader_is_named_a_stream():
    # its remedy was "wrap NumPy arrays as ArraySource(arrays)"
    stream = jl.Stream.from_generator(lambda i: iter([{"tokens": np.arange(3)}]), shards=1)
    for given in (jl.PackedStream(stream, "tokens", 4), jl.mix([stream, stream], [1, 1])):
        with pytest.raises(jl.ConfigError, match=rf"got a {type(given).__name__}, a stream, "
                                                 r"with no random access; read it with "
                                                 r"jaxloader.StreamLoader"):
            jl.DataLoader(given, batch_size=4)
        with pytest.raises(jl.ConfigError, match=rf"got {type(given).__name__}; a jaxloader "
                                                 r"stream, which has no random access: read it "
                                                 r"with jaxloader.StreamLoader; pack its tokens "
                                                 r"with jaxloader.PackedStream"):
            jl.PackedSource(given, "tokens", 4)  # (its remedy was ArraySource too)
    # the other way round: a mixture of sources given to a StreamLoader, said a stream's shards
    sources = jl.mix([jl.ArraySource({"x": np.arange(4)})] * 2, [1, 1])
    with pytest.raises(jl.ConfigError, match=r"StreamLoader\(stream\): got a Mixture, a source "
                                             r"with random access, not a stream; read it with "
                                             r"jaxloader.DataLoader"):
        jl.StreamLoader(sources, batch_size=4)
    for given in ("data/*.jsonl", {"x": [1, 2]}, np.arange(4)):  # (these have len and [i]
        with pytest.raises(jl.ConfigError, match=r"expected a jaxloader.Stream or a list of "
                                                 r"shards.*Stream.jsonl/text/tar"):  # too)
            jl.StreamLoader(given, batch_size=4)


class _NoReturn:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        {"x": i}  # (the record made, its return left out)


class _NoReturnBatches(_NoReturn):
    def __getitems__(self, indices):
        {"x": indices}  # (its return left out)


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("source", [_NoReturn(), _NoReturnBatches()], ids=["item", "items"])
def test_a_source_whose_read_returns_none_is_refused_not_made_into_none_batches(source,
                                                                               num_workers):
    # every batch was None, without a word
    with pytest.raises((jl.CollateError, jl.WorkerError),
                       match=r"step 0 .* is None, expected a (record|batch of 4 records); "
                             r"return it from what made it \(a missing `return`\?\): the "
                             r"source's __getitems?__"):
        next(iter(jl.DataLoader(source, batch_size=4, num_workers=num_workers)))


def test_a_process_count_given_alone_where_jax_knows_one_process_is_refused():
    # process_count=2 without jax.distributed: JAX's index was taken, 0 on every host, and
    # each read the same half of the data without a word
    arrays = jl.ArraySource({"x": np.arange(8)})
    with pytest.raises(jl.ConfigError, match=r"process_count=2 was given without "
                                             r"process_index, .* JAX knows 1 process.* pass "
                                             r"process_index= too"):
        jl.DataLoader(arrays, batch_size=2, process_count=2)
    with pytest.raises(jl.ConfigError, match=r"use an index in \[0, 1\) \(JAX's count: pass "
                                             r"process_count= too\)"):
        jl.DataLoader(arrays, batch_size=2, process_index=1)
    with pytest.raises(jl.ConfigError, match=r"process_count=2 was given without"):
        jl.DataLoader(arrays, batch_size=2, process_count=np.int64(2))  # (a config's)
    with pytest.raises(jl.ConfigError, match=r"process_count=2 was given without"):
        jl.DataLoader(arrays, batch_size=2, process_count=np.array(2))  # (a 0-d array's: it
        # passed the guard once JAX scalars were taken as ints, process 0 of 2: a review's)
    with jl.DataLoader(arrays, batch_size=2, process_count=1) as one:  # (what JAX says)
        assert next(iter(one))["x"].tolist() == [0, 1]


def test_prefetch_below_one_is_told_one_bound():
    # prefetch=-1 said "an int >= 0", and prefetch=0 then "an int >= 1"
    arrays = jl.ArraySource({"x": np.arange(8)})
    for value in (-1, 0):
        with pytest.raises(jl.ConfigError, match=rf"prefetch: expected an int >= 1, got "
                                                 rf"{value}; .*\(with num_workers='auto'\)"):
            jl.DataLoader(arrays, batch_size=2, prefetch=value)


def test_a_jax_or_numpy_scalar_is_taken_as_the_int_it_holds():
    # seed=jnp.int32(3) (a seed drawn or read with JAX) was refused: "expected an int"
    jnp = pytest.importorskip("jax.numpy")
    source = jl.ArraySource({"x": np.arange(20)})
    want = [b["x"].tolist() for b in jl.DataLoader(source, batch_size=4, shuffle=True, seed=3)]
    class Index:  # (any __index__, as the Int type says: a review's)
        def __init__(self, n):
            self.n = n

        def __index__(self):
            return self.n

    for seed, size in [(jnp.int32(3), jnp.int32(4)), (np.array(3, np.uint64), np.array(4)),
                       (Index(3), Index(4))]:
        got = [b["x"].tolist() for b in jl.DataLoader(source, batch_size=size, shuffle=True,
                                                      seed=seed)]
        assert got == want
    for bad in (jnp.float32(3), np.array([3]), jnp.array([3]), jnp.bool_(True), np.bool_(1)):
        with pytest.raises(jl.ConfigError, match=r"seed: expected an int, got"):
            jl.DataLoader(source, batch_size=4, shuffle=True, seed=bad)


def test_arguments_in_the_wrong_shape_or_order_are_told_the_call_that_works():
    # each was a bare AttributeError or TypeError from inside, or an error of the wrong thing
    source = jl.ArraySource({"x": np.arange(20)})
    with pytest.raises(jl.ConfigError, match=r"MapSource\(source, fn\): got a callable "
                                             r"\(<lambda>\) as the source and ArraySource"
                                             r".* the source comes first"):
        jl.MapSource(lambda r: r, source)
    for fn, named in [(functools.partial(lambda r, k: r, k=2), "partial"), (np.sqrt, "sqrt")]:
        with pytest.raises(jl.ConfigError, match=rf"got a callable \({named}\) as the source"):
            jl.MapSource(fn, source)  # (not a routine, still a function: a review's)

    class Callable(list):  # (a source object that is also callable is not "a function")
        def __call__(self):
            return self

    with pytest.raises(jl.ConfigError, match=r"MapSource\(fn\): expected a function of a "
                                             r"record .*, got dict$"):
        jl.MapSource(Callable(range(4)), {"x": 1})
    with pytest.raises(jl.ConfigError, match=r"from_sequences\(columns\): expected a dict .* "
                                             r"got list \[\[1, 2\], \[3\]\]; name the column"):
        jl.RaggedSource.from_sequences([[1, 2], [3]])
    ragged = jl.RaggedSource.from_sequences({"t": [[1, 2], [3]] * 4})
    with pytest.raises(jl.ConfigError, match=r"keys of the records' token arrays, got None; "
                                             r"name them, e.g. PackedSource\(source, 't', "):
        jl.PackedSource(ragged, None, 8)

    class Frame:  # (a DataFrame's columns, by items(): taken, as before the check; a review's)
        columns = ["t"]

        def items(self):
            return iter([("t", [[1, 2], [3]] * 4)])

    class Series:  # (a column, df["t"]: its items are its rows, not columns; no .columns)
        name = "t"

        def items(self):
            return enumerate([[1, 2], [3]] * 4)

    with pytest.raises(jl.ConfigError, match=r"got Series <.*name the column: RaggedSource"
                                             r"\.from_sequences\(\{'t': sequences\}\)"):
        jl.RaggedSource.from_sequences(Series())

    by_items = jl.RaggedSource.from_sequences(Frame())
    assert len(by_items) == 8 and by_items[1]["t"].tolist() == [3]
    jnp = pytest.importorskip("jax.numpy")
    for keys, length in [({"t": 0}, jnp.int32(8)), ("t", {"t": np.array(8)})]:  # (its keys, as
        assert len(jl.PackedSource(ragged, keys, length)) == 2  # before; a JAX int's length)
    two = jl.RaggedSource.from_sequences({"t": [[1, 2], [3]] * 4, "u": [[1, 2], [3]] * 4})
    with pytest.raises(jl.ConfigError, match=r"got a set, \['t', 'u'\], whose order differs "
                                             r".* PackedSource\(source, \['t', 'u'\], \.\.\.\)"):
        jl.PackedSource(two, {"t", "u"}, 8)  # (the hash seed's order: a review's)
    columns = [np.zeros((20, 2)), np.arange(20)]  # (PyTorch's TensorDataset(X, y), as a list)
    with pytest.raises(jl.ConfigError, match=r"records \(2\).*DataLoader\(\[X, y\]\)\) is that "
                                             r"many records, each a whole array: .* "
                                             r"jaxloader.ArraySource\(\(X, y\)\)"):
        jl.DataLoader(columns, batch_size=4)
    with pytest.raises(jl.ConfigError, match=r"last_batch='pad'$"):  # (not told of a list of
        jl.DataLoader(jl.ArraySource(np.arange(3)), batch_size=4)  # arrays it is not: a review's)
    with pytest.raises(jl.ConfigError, match=r"last_batch='pad'$"):  # (images of one shape)
        jl.DataLoader([np.zeros((8, 8))] * 3, batch_size=4)
    with pytest.raises(jl.ConfigError, match=r"'partial' to keep it smaller$"):  # (another
        jl.DataLoader(columns, batch_size=4, last_batch="bogus")  # error than few records)
    rows = jl.DataLoader(jl.ArraySource(tuple(columns)), batch_size=4)  # (the remedy)
    assert len(rows) == 5


def test_a_mask_key_given_where_no_mask_is_added_is_warned_of():
    # mask_key="is_real" with last_batch="drop" (or an endless stream) added no mask and said
    # nothing: an evaluation loop reading batch["is_real"] failed far from the argument
    source = jl.ArraySource({"x": np.arange(10)})
    for last_batch in ("drop", "partial"):
        with pytest.warns(jl.JaxloaderWarning, match=r"mask_key='is_real': no mask is added "
                                                     r"to these batches, which only "
                                                     r"last_batch='pad' adds"):
            jl.DataLoader(source, batch_size=4, mask_key="is_real", last_batch=last_batch,
                          shuffle=True).close()
    stream = jl.Stream.from_generator(lambda s: iter([{"x": 1}] * 4), 1)
    with pytest.warns(jl.JaxloaderWarning, match=r"which only num_epochs=n \(a pass's end\)"):
        jl.StreamLoader(stream, batch_size=2, mask_key="is_real").close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (where a mask is added, or none named: nothing said)
        with jl.DataLoader(source, batch_size=4, mask_key="is_real", last_batch="pad") as pad:
            assert "is_real" in next(iter(pad))
        jl.DataLoader(source, batch_size=4, shuffle=True).close()
        jl.StreamLoader(stream, batch_size=2, mask_key="is_real", num_epochs=1).close()


def test_a_device_prefetch_given_without_a_sharding_is_warned_of():
    # it acts on placed batches alone: device_prefetch=8 for a slow copy, the sharding left out
    # (or dropped on a CPU run), kept nothing ahead, without a word
    source = jl.ArraySource({"x": np.arange(8)})
    with pytest.warns(jl.JaxloaderWarning, match=r"device_prefetch=8 without a sharding: "
                                                 r"batches stay NumPy arrays on the host"):
        loader = jl.DataLoader(source, batch_size=4, device_prefetch=8)
    assert next(iter(loader))["x"].tolist() == [0, 1, 2, 3]
    with pytest.warns(jl.JaxloaderWarning, match=r"device_prefetch=3 without a sharding"):
        jl.StreamLoader(jl.Stream.from_generator(lambda s: iter([{"x": 1}] * 4), 1),
                        batch_size=2, device_prefetch=3)
    jax = pytest.importorskip("jax")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (not given, 0, or with a sharding: nothing said)
        jl.DataLoader(source, batch_size=4)
        jl.DataLoader(source, batch_size=4, device_prefetch=0)
        placed = jl.DataLoader(source, batch_size=4, device_prefetch=8,
                               sharding=jax.devices()[0])
        assert placed.device_prefetch == 8
        assert jl.DataLoader(source, batch_size=4).device_prefetch == 2
        # the options copied (a loader made in a worker: the workers audit) took the default
        # 2 for one given, and said so
        import dataclasses
        from jaxloader.loaders.options import LoaderOptions
        dataclasses.replace(LoaderOptions(num_workers=2, unplaced=True), auto_workers=False)


def test_a_loop_over_epochs_around_passes_of_several_is_said_once():
    # num_epochs=3 in a loop over 3 epochs (a Grain or tf.data user's repeat(3)) read 9
    # epochs without a word
    loader = jl.DataLoader(np.arange(8), batch_size=4, shuffle=True, num_epochs=3)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        batches = sum(1 for _ in range(3) for _ in loader)
    found = [str(w.message) for w in said if "a pass after the first" in str(w.message)]
    assert batches == 18 and len(found) == 1, [str(w.message) for w in said]
    assert "begins epochs 3 to 5" in found[0] and "pass num_epochs=1" in found[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (an epoch a pass, the usual loop: nothing)
        one = jl.DataLoader(np.arange(8), batch_size=4, shuffle=True, num_epochs=1)
        assert sum(1 for _ in range(3) for _ in one) == 6
        again = jl.DataLoader(np.arange(8), batch_size=4, shuffle=True, num_epochs=3)
        list(again)
        jl.profile(again, steps=3, out=None)  # (its own iter(), a later pass: not said)
