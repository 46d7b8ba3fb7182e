"""A Hugging Face IterableDataset read as a stream: arrays of the declared dtypes, exact
restores through the dataset's own state, and clear refusals."""

from __future__ import annotations

import datetime
import inspect
import itertools
import json
import re
import shutil
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.base.errors import ConfigError, StateDictError
from jaxloader.streams.huggingface import HuggingFaceShard
from resume_harness import check_resume

datasets = pytest.importorskip("datasets")  # a test-only dependency


def iterable(n=96, shards=4):
    ds = datasets.Dataset.from_dict({
        "vec": [[float(i)] * 16 for i in range(n)],
        "text": ["w" * (1 + i % 9) for i in range(n)],  # strings of different lengths
        "label": list(range(n)),
        "small": [i % 100 for i in range(n)],
    }).cast(datasets.Features({
        "vec": datasets.Sequence(datasets.Value("float32")), "text": datasets.Value("string"),
        "label": datasets.Value("int64"), "small": datasets.Value("int16")}))
    return ds.to_iterable_dataset(num_shards=shards)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pass_holds_every_record_once_as_arrays_of_the_declared_dtypes(num_workers):
    with jl.StreamLoader(iterable(), batch_size=8, num_workers=num_workers, num_epochs=1,
                         process_index=0, process_count=1) as loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
    labels = np.concatenate([b["label"][b["mask"]] for b in batches])
    assert sorted(labels.tolist()) == list(range(96))
    for b in batches:
        # a list feature is one array (Python format alone batches it as 16 arrays of (8,))
        assert b["vec"].shape == (8, 16) and b["vec"].dtype == np.float32
        assert np.array_equal(b["vec"][:, 0], b["label"].astype(np.float32))
        assert b["small"].dtype == np.int16 and b["label"].dtype == np.int64
        assert b["text"].dtype == object and all(type(t) is str for t in b["text"])
        assert [len(t) for t in b["text"]] == [1 + i % 9 for i in b["label"]]


@pytest.mark.parametrize("k", [3, 11, 30])  # in the first shards, later, past the first epoch
def test_a_restore_continues_the_same_stream_into_other_worker_counts(k):
    ds = iterable()

    def make(num_workers):
        return lambda: jl.StreamLoader(jl.Stream.huggingface(ds, shuffle_window=7), batch_size=5,
                                       num_workers=num_workers, readers_per_process=2,
                                       process_index=0, process_count=1)
    check_resume(make(2), total=36, k=k, make_restored=make(0))


@pytest.mark.parametrize("kind", ["parquet", "json"])
def test_a_restore_over_files_continues_the_same_stream(tmp_path, kind):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = []
    for f in range(2):
        ids = list(range(f * 40, f * 40 + 40))
        files.append(str(tmp_path / f"part-{f}.{kind}"))
        if kind == "parquet":
            pq.write_table(pa.table({"id": ids, "v": [[float(i)] * 3 for i in ids]}), files[-1],
                           row_group_size=10)
        else:
            with open(files[-1], "w") as out:
                out.write("".join(json.dumps({"id": i, "v": [float(i)] * 3}) + "\n"
                                  for i in ids))
    ds = datasets.load_dataset(kind, data_files=files, split="train", streaming=True)
    ds = ds.map(lambda r: {**r, "twice": r["id"] * 2})

    def make(num_workers):
        return lambda: jl.StreamLoader(jl.Stream.huggingface(ds, shuffle_window=6), batch_size=4,
                                       num_workers=num_workers, readers_per_process=2,
                                       process_index=0, process_count=1)
    check_resume(make(2), total=30, k=7, make_restored=make(0))


@pytest.mark.parametrize("kind", ["parquet", "json"])
def test_a_restore_over_files_rewritten_since_is_refused_naming_the_file(tmp_path, kind):
    # the stream's names digest the files' paths only: a restore over rewritten files (the
    # same names and row counts) resumed inside the new rows, without a word
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(path, offset):
        ids = list(range(offset, offset + 30))
        if kind == "parquet":
            pq.write_table(pa.table({"id": ids}), path, row_group_size=10)
        else:
            with open(path, "w") as out:
                out.write("".join(json.dumps({"id": i}) + "\n" for i in ids))

    files = [str(tmp_path / f"part-{f}.{kind}") for f in range(2)]
    for f, path in enumerate(files):
        write(path, 100 * f)

    def loader():
        return jl.StreamLoader(datasets.load_dataset(kind, data_files=files, split="train",
                                                     streaming=True), batch_size=4,
                               process_index=0, process_count=1)

    with loader() as first:
        next(iter(first))
        state = json.loads(json.dumps(first.state_dict()))
    with loader() as same:
        same.load_state_dict(state)  # (the files as they were)
    for f, path in enumerate(files):  # (the shard the state is in, whichever it is)
        write(path, 1000 + 100 * f)
    with loader() as other, pytest.raises(StateDictError, match=rf"its file part-\d.{kind} "
                                          r"changed since the state was saved \(size"):
        other.load_state_dict(state)
        next(iter(other))

    def joined():  # (its parts' files under the join: none were found, nothing was checked)
        parts = [datasets.load_dataset(kind, data_files=[path], split="train", streaming=True)
                 for path in files]
        return jl.StreamLoader(datasets.concatenate_datasets(parts), batch_size=4,
                               process_index=0, process_count=1)

    with joined() as first:
        next(iter(first))
        state = json.loads(json.dumps(first.state_dict()))
    for f, path in enumerate(files):
        write(path, 2000 + 100 * f)
    with joined() as other, pytest.raises(StateDictError, match=rf"its file part-\d.{kind} "
                                          r"changed since the state was saved"):
        other.load_state_dict(state)
        next(iter(other))


def test_a_restore_in_a_shards_first_window_over_its_file_rewritten_is_refused(tmp_path):
    # a window that starts at the shard's start saves no place of the dataset's ("hf": None),
    # and its files were checked only beside one: the first window's records were read from
    # the new file at the saved run's place, without a word
    path = str(tmp_path / "a.jsonl")

    def write(ids):
        with open(path, "w") as out:
            out.write("".join(json.dumps({"id": i}) + "\n" for i in ids))

    def loader():
        ds = datasets.load_dataset("json", data_files=[path], split="train", streaming=True)
        return jl.StreamLoader(jl.Stream.huggingface(ds, shuffle_window=4), batch_size=1,
                               process_index=0, process_count=1)

    write(range(10, 18))
    with loader() as first:
        it = iter(first)
        next(it), next(it)
        state = json.loads(json.dumps(first.state_dict()))
    assert state["readers"][0]["shard_state"]["hf"] is None
    write(range(70, 90))
    with loader() as other, pytest.raises(StateDictError, match=r"its file a.jsonl changed "
                                                                r"since the state was saved"):
        other.load_state_dict(state)
        next(iter(other))


def test_a_restore_over_a_file_the_window_crossed_into_rewritten_is_refused(tmp_path):
    # a window that runs from one shard into the next reads the next one's first records
    # again on a restore: its files were not in the state (only the window's first shard's),
    # so records of the rewritten file came in place of the saved run's, without a word
    paths = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]

    def write(path, ids):
        with open(path, "w") as out:
            out.write("".join(json.dumps({"id": i}) + "\n" for i in ids))

    def loader():
        ds = datasets.load_dataset("json", data_files=paths, split="train", streaming=True)
        stream = jl.Stream.huggingface(ds, shuffle_window=8, shuffle_shards=False)
        return jl.StreamLoader(stream, batch_size=1, process_index=0, process_count=1)

    write(paths[0], range(10, 15))
    write(paths[1], range(20, 25))
    with loader() as first:
        it = iter(first)
        next(it), next(it)
        state = json.loads(json.dumps(first.state_dict()))
        rest = [int(next(it)["id"][0]) for _ in range(6)]
    assert state["readers"][0]["crossed"] == [5]  # (the window's 8: 5 of a, 3 of b)
    with loader() as same:  # (the files as they were: the same records)
        same.load_state_dict(state)
        assert [int(b["id"][0]) for b in itertools.islice(same, 6)] == rest
    edited = json.loads(json.dumps(state))  # (one file's [size, head, tail] where the
    edited["readers"][0]["crossed_files"] = [[1, 2, 3]]  # shard's files were: AttributeError)
    with loader() as other, pytest.raises(StateDictError, match=r"crossed_files: one file's "
                                                                r"identity \[1, 2, 3\] for "
                                                                r"shard .*restore a state"):
        other.load_state_dict(edited)
        next(iter(other))
    write(paths[1], range(70, 75))  # (as many rows: its place in the window is the same)
    with loader() as other, pytest.raises(StateDictError, match=r"its file b.jsonl changed "
                                                                r"since the state was saved"):
        other.load_state_dict(state)
        next(iter(other))


def test_a_restore_does_not_read_the_shard_again_through_the_datasets_map():
    """The state is the dataset's own: a restore passes over the examples read before below
    the dataset's map, where skipping records (Stream.from_generator) maps every one."""
    calls = []
    ds = iterable(n=400, shards=2).map(lambda r: calls.append(1) or r)
    def make():
        return jl.StreamLoader(ds, batch_size=10, process_index=0, process_count=1)
    with make() as first:
        it = iter(first)
        for _ in range(17):  # 170 records of the first shard (200 a shard)
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        expected = next(it)["label"].tolist()
    shard_state = state["readers"][0]["shard_state"]["hf"]
    assert "examples_iterable" in shard_state
    calls.clear()
    with make() as second:
        second.load_state_dict(state)
        assert next(iter(second))["label"].tolist() == expected
    assert len(calls) <= 20, f"the restore mapped {len(calls)} records"


def test_a_state_is_refused_by_a_stream_over_other_data(tmp_path):
    def saved(ds):
        with jl.StreamLoader(ds, batch_size=4, process_index=0, process_count=1) as loader:
            next(iter(loader))
            return json.loads(json.dumps(loader.state_dict()))

    state = saved(iterable())
    with jl.StreamLoader(iterable(), batch_size=4, process_index=0, process_count=1) as same:
        same.load_state_dict(state)  # the same data, made again: accepted
    with jl.StreamLoader(iterable(n=95), batch_size=4, process_index=0,
                         process_count=1) as other:
        with pytest.raises(StateDictError, match=r"does not fit.*shards"):
            other.load_state_dict(state)
    files = []
    for f in range(2):
        files.append(str(tmp_path / f"part-{f}.jsonl"))
        with open(files[-1], "w") as out:
            out.write("".join(json.dumps({"id": f * 10 + i}) + "\n" for i in range(5)))
    two = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    renamed = [str(tmp_path / f"other-{f}.jsonl") for f in range(2)]
    for a, b in zip(files, renamed):
        shutil.copy(a, b)
    moved = datasets.load_dataset("json", data_files=renamed, split="train", streaming=True)
    with jl.StreamLoader(moved, batch_size=4, process_index=0, process_count=1) as loader:
        with pytest.raises(StateDictError, match=r"does not fit.*shards"):
            loader.load_state_dict(saved(two))


def test_json_files_streamed_pack_and_mix(tmp_path):
    for f in range(2):
        with open(tmp_path / f"part-{f}.jsonl", "w") as out:
            for i in range(30):
                j = f * 30 + i
                out.write(json.dumps({"id": j, "tokens": list(range(j % 7 + 1))}) + "\n")
    files = sorted(str(p) for p in tmp_path.glob("*.jsonl"))
    ds = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    packed = jl.StreamLoader(jl.PackedStream(ds, "tokens", 16), batch_size=4,
                             process_index=0, process_count=1)
    with packed:
        batch = next(iter(packed))
    assert batch["tokens"].shape == (4, 16) and batch["tokens_segment_ids"].shape == (4, 16)
    mixed = jl.StreamLoader(jl.mix([ds, iterable()], [0.5, 0.5]), batch_size=8,
                            transforms=[jl.Map(lambda r: {"id": np.int64(r.get("id", -1))})],
                            process_index=0, process_count=1)
    with mixed:
        ids = next(iter(mixed))["id"]
    assert (ids == -1).sum() == 4 and (ids >= 0).sum() == 4  # each component's half


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_list_of_strings_is_one_object_array_a_row_as_a_datasets_is(num_workers):
    tags = [["a", "b"], ["c"], ["d", "e", "f"], []] * 2
    ds = datasets.Dataset.from_dict({"tags": tags, "i": list(range(8))})
    with jl.StreamLoader(ds.to_iterable_dataset(num_shards=2), batch_size=4,
                         num_workers=num_workers, num_epochs=1, process_index=0,
                         process_count=1) as loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
    with jl.DataLoader(ds, batch_size=4, process_index=0, process_count=1) as loader:
        mapped = next(iter(loader))["tags"]
    for b in batches:
        assert b["tags"].shape == (4,) and b["tags"].dtype == object == mapped.dtype
        assert [t.tolist() for t in b["tags"]] == [tags[i] for i in b["i"]]


def test_dates_and_times_batch_as_datetime64_as_a_datasets_do():
    days = [datetime.datetime(2020, 1, 1 + i, 12) for i in range(8)]
    ds = datasets.Dataset.from_dict({"t": days, "d": [d.date() for d in days],
                                     "i": list(range(8))})
    with jl.DataLoader(ds, batch_size=4, process_index=0, process_count=1) as loader:
        mapped = next(iter(loader))
    with jl.StreamLoader(ds.to_iterable_dataset(num_shards=1), batch_size=4,
                         process_index=0, process_count=1) as loader:
        streamed = next(iter(loader))
    for key in ("t", "d"):
        assert streamed[key].dtype == mapped[key].dtype, (key, streamed[key].dtype)
        assert streamed[key].tolist() == mapped[key].tolist()


def test_times_in_a_zone_are_refused_naming_the_column_as_a_datasets_are():
    import pyarrow as pa

    def dataset(zone):
        times = pa.array([datetime.datetime(2024, 1, 1, h) for h in range(4)],
                         pa.timestamp("us", tz=zone))
        return datasets.Dataset(pa.table({"when": pa.StructArray.from_arrays(
            [times], ["t"]), "i": list(range(4))})).to_iterable_dataset(num_shards=1)

    # their hours came out as UTC's (05:00 in Paris as 04:00), the zone dropped, no word
    with pytest.raises(ConfigError, match=r"column 'when' holds times in the zone "
                       r"'Europe/Paris'.*ds.cast_column"):
        jl.Stream.huggingface(dataset("Europe/Paris"))
    with jl.StreamLoader(dataset("UTC"), batch_size=4, process_index=0,
                         process_count=1) as loader:  # (UTC's instants are datetime64's)
        got = next(iter(loader))["when"]["t"]
    assert got.tolist() == [datetime.datetime(2024, 1, 1, h) for h in range(4)]


def _rows(parts):  # shard p of the generator: records 2p and 2p + 1
    for i in (j for p in parts for j in (2 * p, 2 * p + 1)):
        yield {"x": [i, i + 1, i + 2], "name": f"r{i}"}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_features_unknown_lists_of_numbers_still_become_arrays(num_workers):
    ds = datasets.IterableDataset.from_generator(_rows, gen_kwargs={"parts": [0, 1]})
    assert ds.features is None and ds.num_shards == 2
    with jl.StreamLoader(ds, batch_size=4, num_workers=num_workers, num_epochs=1,
                         process_index=0, process_count=1) as loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
    assert all(b["x"].shape == (4, 3) and b["x"].dtype.kind == "i" for b in batches)
    firsts = np.concatenate([b["x"][b["mask"], 0] for b in batches])
    assert sorted(firsts.tolist()) == [0, 1, 2, 3]
    assert all(type(n) is str for b in batches for n in b["name"])


def test_a_take_skip_batch_repeat_or_interleave_a_stream_of_shards_would_change_is_refused():
    # each shard read by itself took ds.take(6)'s 6 records of every shard (others than the
    # dataset's first 6), interleaved within each shard, batched to each shard's end: silently
    ds = iterable(n=20, shards=4)
    cases = [(ds.take(6), r"cut by IterableDataset.take.*ds.select\(range\(n\)\)"),
             (ds.skip(6).map(lambda r: r), r"cut by IterableDataset.skip"),
             (ds.batch(3), r"batched \(IterableDataset.batch\).*batch_size="),
             (datasets.interleave_datasets([ds, ds]), r"interleaved.*jl.mix\("),
             (datasets.interleave_datasets([ds, ds], probabilities=[0.5, 0.5], seed=0),
              r"interleaved"),
             (datasets.concatenate_datasets([ds, ds.take(2)]), r"IterableDataset.take"),
             (ds.repeat(2), r"repeated \(IterableDataset.repeat\).*num_epochs=n")]
    if "by_column" in inspect.signature(ds.batch).parameters:  # (datasets 5: a partial)
        cases.append((ds.map(lambda r: {**r, "g": r["label"] // 5}).batch(by_column="g"),
                      r"batched \(IterableDataset.batch\)"))
    for made, what in cases:
        with pytest.raises(ConfigError, match=what):
            jl.StreamLoader(made, batch_size=2)
    with jl.StreamLoader(datasets.concatenate_datasets([ds, ds.filter(lambda r: True)]),
                         batch_size=4, num_epochs=1) as loader:  # (joins and filters read all)
        assert len(list(loader)) == 10


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ConfigError, match=r"1 shards for 2 readers.*ds.reshard\(\)"):
        jl.StreamLoader(iterable(shards=1), batch_size=2, num_workers=2, process_index=0,
                        process_count=1)
    with pytest.raises(ConfigError, match=r"shuffle_window"):
        jl.Stream.huggingface(iterable().shuffle(seed=0, buffer_size=10))
    with pytest.raises(ConfigError, match=r"IterableDataset.shuffle"):  # below a map
        jl.StreamLoader(iterable().shuffle(seed=0, buffer_size=10).map(lambda r: r),
                        batch_size=2)
    with pytest.raises(ConfigError, match=r"random access: pass it to jl.DataLoader"):
        jl.Stream.huggingface(datasets.Dataset.from_dict({"x": [1, 2]}))

    with pytest.raises(ConfigError, match=r"jaxloader.StreamLoader\(ds\)"):
        jl.DataLoader(iterable(), batch_size=2)
    from datasets.distributed import split_dataset_by_node

    with pytest.raises(ConfigError, match=r"split by node.*pass the whole dataset"):
        jl.StreamLoader(split_dataset_by_node(iterable(), rank=0, world_size=2), batch_size=2)
    with pytest.raises(ConfigError, match=r"IterableDatasetDict of \['train'\]; pass one of "
                                          r"them: stream\['train'\]"):
        jl.StreamLoader(datasets.IterableDatasetDict({"train": iterable()}), batch_size=2)
    shard = jl.Stream.huggingface(iterable()).shards[0]
    assert isinstance(shard, HuggingFaceShard)
    with pytest.raises(StateDictError, match=r"expected a state \{'hf'"):
        shard.reset({"consumed": 3})
    shard.reset(None)
    shard.next()
    shard.close()  # still says where it stopped
    assert shard.get_state()["hf"]["examples_iterable"]
    shard.reset(shard.get_state())
    assert shard.next()["label"] == 1
    with pytest.raises(StateDictError, match=r"epoch 5"):
        shard.reset({"hf": {**shard.get_state()["hf"], "epoch": 5}})


def test_a_null_in_a_list_of_floats_is_refused_naming_the_shard_and_the_field():
    # NumPy made it NaN without a word; a bool list's became False, an int list's made the
    # leaf a list (the batch's structure changed), a string list's passed (the HF audit)
    for values, said in (([[1.0, 2.0], [3.0, None]], "float64"), ([[True, None]] * 2, "bool"),
                         ([[1, None]] * 2, "int64"), ([["a", None]] * 2, "strings")):
        ds = datasets.Dataset.from_dict({"v": values}).to_iterable_dataset()
        with jl.StreamLoader(ds, batch_size=2, process_index=0, process_count=1) as loader:
            with pytest.raises(jl.JaxloaderError, match=rf"HuggingFaceShard .*\['v'\]: a list "
                                                         rf"of {said} holds a null \(None\).*"
                                                         r"ds.filter"):
                next(iter(loader))


def test_lists_of_images_structs_or_lists_of_strings_are_one_leaf_a_row_as_a_datasets_are():
    # a Python list is a pytree node: a batch of them was transposed, its row 0 holding the
    # first frame of every record, without a word (the HF audit)
    from datasets import Features, Image, List, Value
    from PIL import Image as Pil

    def png(v):
        return {"bytes": _png(Pil.fromarray(np.full((2, 2), v, np.uint8))), "path": None}
    ds = datasets.Dataset.from_dict(
        {"frames": [[png(10 * i + j) for j in range(3)] for i in range(4)],
         "words": [[[f"r{i}w{j}"] * (1 + (i + j) % 2) for j in range(2)] for i in range(4)],
         "spans": [[{"p": i, "q": "a"}] * (1 + i % 2) for i in range(4)],
         "i": list(range(4))},
        features=Features({"frames": List(Image()), "words": List(List(Value("string"))),
                           "spans": List({"p": Value("int32"), "q": Value("string")}),
                           "i": Value("int64")}))
    with jl.StreamLoader(ds.to_iterable_dataset(num_shards=1), batch_size=4, num_epochs=1,
                         process_index=0, process_count=1) as loader:
        batch = next(iter(loader))
    assert batch["frames"].shape == (4, 3, 2, 2) and batch["frames"].dtype == np.uint8
    assert batch["frames"][:, :, 0, 0].tolist() == [[10 * i + j for j in range(3)]
                                                   for i in batch["i"]]
    assert [[w.tolist() for w in row] for row in batch["words"]] == [
        [[f"r{i}w{j}"] * (1 + (i + j) % 2) for j in range(2)] for i in batch["i"]]
    assert [[(s["p"], s["q"]) for s in row] for row in batch["spans"]] == [
        [(i, "a")] * (1 + i % 2) for i in batch["i"]]


def _png(image):
    import io

    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_an_empty_list_of_times_keeps_its_dtype_and_lists_of_other_lengths_are_named():
    # an empty list of times was an object array (batches of datetime64 and object by turns);
    # lists of lists of other lengths in one record an object array, of one length an array:
    # the batch's kind changed with the records (the review)
    from datasets import Features, List, Value

    days = [[datetime.datetime(2020, 1, 1 + i)] * 2 for i in range(3)] + [[]]
    ds = datasets.Dataset.from_dict({"t": days}, features=Features({"t": List(
        Value("timestamp[ms]"))}))
    streamed = HuggingFaceShard(ds.to_iterable_dataset(), 0, 1, ("d", "d"))
    rows = [streamed.next()["t"] for _ in range(4)]
    assert [r.dtype for r in rows] == [np.dtype("datetime64[ms]")] * 4 and rows[3].shape == (0,)
    ragged = datasets.Dataset.from_dict({"n": [[[1], [2, 3]]]}, features=Features({"n": List(
        List(Value("int32")))}))
    with jl.StreamLoader(ragged.to_iterable_dataset(), batch_size=1, process_index=0,
                         process_count=1) as loader:
        with pytest.raises(jl.JaxloaderError, match=r"\['n'\]: lists of int32 that make no one "
                                                     r"array \(\[\[1\], \[2, 3\]\]: lists of "
                                                     r"other lengths in one record\); pad them"):
            next(iter(loader))


def test_times_of_day_and_lists_of_times_batch_as_a_datasets_do():
    # a stream refused them (datetime.time, lists of datetimes do not batch; the HF audit)
    import pyarrow as pa

    table = pa.table({
        "t": pa.array([datetime.time(1, 2, i) for i in range(4)], pa.time64("us")),
        "s": pa.array([datetime.time(0, 0, i) for i in range(4)], pa.time32("s")),
        "ts": pa.array([[datetime.datetime(2020, 1, 1, 0, 0, i)] * 2 for i in range(4)],
                       pa.list_(pa.timestamp("ms"))),
        "i": list(range(4))})
    ds = datasets.Dataset(table)
    with jl.DataLoader(ds, batch_size=4, process_index=0, process_count=1) as loader:
        mapped = next(iter(loader))
    with jl.StreamLoader(ds.to_iterable_dataset(num_shards=1), batch_size=4,
                         process_index=0, process_count=1) as loader:
        streamed = next(iter(loader))
    for key in ("t", "s", "ts"):
        assert streamed[key].dtype == mapped[key].dtype, (key, streamed[key].dtype)
        assert streamed[key].tolist() == mapped[key].tolist()


def test_a_null_where_the_features_declare_a_number_or_a_struct_is_refused_naming_it():
    # a batch of nulls was "a record with no leaves", a column of them "a leaf missing"
    for values, feature, said in (([1.5, None], datasets.Value("float32"), "float32"),
                                  ([{"x": 1}, None], {"x": datasets.Value("int8")},
                                   r"a struct of \['x'\]")):
        ds = datasets.Dataset.from_dict({"v": values},
                                        features=datasets.Features({"v": feature}))
        with jl.StreamLoader(ds.to_iterable_dataset(), batch_size=2, process_index=0,
                             process_count=1) as loader:
            with pytest.raises(jl.JaxloaderError, match=rf"HuggingFaceShard .*\['v'\]: a null "
                                                         rf"\(None\) where the features declare "
                                                         rf"{said}; fill the nulls"):
                next(iter(loader))


def test_a_restore_over_a_dataset_whose_maps_or_filters_changed_is_refused():
    # a state saved under a map restored under a filter resumed at other records, silently
    # (a map added: the dataset's own KeyError 'shard_idx'; the HF audit)
    base = datasets.Dataset.from_dict({"x": list(range(40))})

    def stream(kind):
        ids = base.to_iterable_dataset(num_shards=2)
        return {"map": ids.map(lambda r: r), "filter": ids.filter(lambda r: True),
                "none": ids}[kind]
    with jl.StreamLoader(stream("map"), batch_size=2, process_index=0,
                         process_count=1) as loader:
        it = iter(loader)
        next(it), next(it)
        state = json.loads(json.dumps(loader.state_dict()))
    for kind, chain in (("filter", "Filtered > RebatchedArrow > Arrow"),
                        ("none", "RebatchedArrow > Arrow")):
        with jl.StreamLoader(stream(kind), batch_size=2, process_index=0,
                             process_count=1) as loader:
            with pytest.raises(StateDictError, match=r"saved over a dataset whose chain is "
                                                     r"Mapped > RebatchedArrow > Arrow, this "
                                                     rf"one's is {chain}: a map or filter"):
                loader.load_state_dict(state)
    with jl.StreamLoader(stream("map"), batch_size=2, process_index=0,
                         process_count=1) as loader:
        loader.load_state_dict(state)
        assert len(next(iter(loader))["x"]) == 2


def test_a_restore_over_other_map_filter_or_generator_functions_is_warned_of():
    # a state saved over ds.map(f), ds.filter(p) or IterableDataset.from_generator(g) restored
    # over another function with no word, and the run read other records from there (the
    # Orbax audit); a Stream.from_generator's is warned of, as these are now
    base = datasets.Dataset.from_dict({"x": list(range(40))})

    def generator(sign):
        def gen(parts):
            for p in parts:
                yield from ({"x": sign * (100 * p + i)} for i in range(10))
        return gen

    def stream(kind, k):
        ids = base.to_iterable_dataset(num_shards=2)
        return {"map": lambda: ids.map(lambda r: {"x": r["x"] * k}),
                "filter": lambda: ids.filter(lambda r: r["x"] % k == 0),
                "generator": lambda: datasets.IterableDataset.from_generator(
                    generator(k), gen_kwargs={"parts": [0, 1]})}[kind]()

    for kind in ("map", "filter", "generator"):
        def loader(k):
            return jl.StreamLoader(jl.Stream.huggingface(stream(kind, k)), batch_size=2,
                                   process_index=0, process_count=1)
        with loader(1) as first:
            it = iter(first)
            next(it), next(it)
            state = json.loads(json.dumps(first.state_dict()))
        assert len(state["generators"]) == 2, kind
        with loader(-1 if kind == "generator" else 3) as other:
            with pytest.warns(jl.JaxloaderWarning, match=r"functions that make the stream's "
                                                         r"records \(.*Hugging Face.*\) differ"):
                other.load_state_dict(state)
        with loader(1) as same, warnings.catch_warnings():
            warnings.simplefilter("error")
            same.load_state_dict(state)
        older = {key: value for key, value in state.items() if key != "generators"}
        with loader(3) as other, warnings.catch_warnings():  # (a state of a version before:
            warnings.simplefilter("error")  # its functions unknown, as a DataLoader's)
            other.load_state_dict(older)
    mixed = jl.mix([jl.Stream.from_generator(lambda shard: iter([{"x": shard}] * 9), shards=2),
                    jl.Stream.huggingface(stream("map", 1))], [0.5, 0.5])
    with jl.StreamLoader(mixed, batch_size=2, process_index=0, process_count=1) as loader:
        next(iter(loader))
        state = loader.state_dict()
        codes = state["generators"]
        assert codes[0] and codes[2], codes  # a state of the version before: the dataset's ""
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader.load_state_dict({**state, "generators": [*codes[:2], "", ""]})
    # of datasets' own functions, their arguments alone (their code changes with its
    # version): an add_column's values, a rename's names; a bound method's object is read
    # (a review: Tok(2).encode and Tok(3).encode were one digest)
    class Tok:
        def __init__(self, k):
            self.k = k

        def encode(self, record):
            return {"x": record["x"] * self.k}

    def code(make):
        return jl.Stream.huggingface(make(base.to_iterable_dataset(num_shards=2))).shards[0].code
    assert code(lambda d: d.rename_column("x", "y")) != code(lambda d: d.rename_column("x", "z"))
    assert code(lambda d: d.add_column("y", [0] * 40)) != code(
        lambda d: d.add_column("y", [1] * 40))
    assert code(lambda d: d.map(Tok(2).encode)) != code(lambda d: d.map(Tok(3).encode))
    assert code(lambda d: d) is None


def test_a_concatenation_of_parts_mapped_and_not_then_filtered_is_refused():
    # datasets restores the filter over the part not mapped at the end of the Arrow chunk it
    # had read: a restore at step 3 started that shard over, silently (the review)
    base = datasets.Dataset.from_dict({"x": list(range(40))})

    def concatenated(*, both):
        plain = base.to_iterable_dataset(num_shards=2)
        return datasets.concatenate_datasets([
            base.to_iterable_dataset(num_shards=2).map(lambda r: r),
            plain.map(lambda r: r) if both else plain]).filter(lambda r: r["x"] % 3 != 0)
    with pytest.raises(ConfigError, match=r"a concatenation \(concatenate_datasets\) of parts "
                                          r"mapped and not, then filtered or mapped: .*map every "
                                          r"part before concatenating them"):
        jl.Stream.huggingface(concatenated(both=False))
    check_resume(lambda: jl.StreamLoader(concatenated(both=True), batch_size=2,
                                         process_index=0, process_count=1, num_epochs=None),
                 total=12, k=3)


def test_a_map_that_leaves_no_features_over_declared_dtypes_is_warned_of():
    # the declared float32, int8 came as float64, int64 (JSON's rules) without a word
    ds = datasets.Dataset.from_dict({"v": [[0.1, 1.5]] * 4, "n": [1] * 4, "t": ["a"] * 4},
                                    features=datasets.Features({
                                        "v": datasets.List(datasets.Value("float32")),
                                        "n": datasets.Value("int8"),
                                        "t": datasets.Value("string")}))
    ids = ds.to_iterable_dataset(num_shards=1)
    with pytest.warns(jl.JaxloaderWarning, match=r"its map .*leaves it no features.*"
                                                 r"\['v'\] float32, \['n'\] int8; pass the map "
                                                 r"features="):
        jl.Stream.huggingface(ids.map(lambda r: r))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jl.Stream.huggingface(ids.map(lambda r: r, features=ids.features))  # (kept: none)
        jl.Stream.huggingface(ids.select_columns(["t"]).map(lambda r: r))  # (str: the same)
        # (the columns a map removes, or a select leaves out, come from no declared feature:
        # warned of for tokenize(remove_columns=...), the review)
        jl.Stream.huggingface(ids.map(lambda r: {"m": 1}, remove_columns=["v", "n"]))
        jl.Stream.huggingface(ids.map(lambda r: r).select_columns(["t"]))


@pytest.mark.parametrize("release", ["4.8.4", "3.2.0", "4.8.5rc1", "4.8.5.dev0", "4.8.5-rc1",
                                     "4.8.5c1"])
def test_a_datasets_release_whose_states_restart_the_stream_is_refused(monkeypatch, release):
    # 3.4 to 4.8.4 restored a mapped IterableDataset's state at its first record (the records
    # after the state's place came again, silently); before 3.4 its states had another form
    monkeypatch.setattr(datasets, "__version__", release)
    with pytest.raises(ConfigError, match=rf"datasets {re.escape(release)} cannot restore "
                                          r"this stream .* pip install \"datasets>=4.8.5\""):
        jl.Stream.huggingface(iterable().map(lambda r: r))
    for later in ("4.8.5", "4.9.0.dev0", "5.0.0rc1", "4.10.0", "4.8.5+g1a2b3c",
                  "4.8.5.post1.dev2"):
        monkeypatch.setattr(datasets, "__version__", later)
        jl.Stream.huggingface(iterable().map(lambda r: r))
