"""A Hugging Face datasets.Dataset passed as it is: list features as arrays, strings as str."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import time
import numpy as np
import pytest

import jaxloader as jl
from resume_harness import check_resume

datasets = pytest.importorskip("datasets")  # a test-only dependency


def dataset(n=40):
    rng = np.random.default_rng(0)
    return datasets.Dataset.from_dict({
        "vector": [list(rng.random(32, dtype=np.float32)) for _ in range(n)],
        "text": ["w" * (1 + i % 9) for i in range(n)],  # different lengths
        "label": list(range(n)),
    })


@pytest.mark.parametrize("fmt", [None, "numpy"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("per_record", [False, True])
def test_list_features_batch_as_one_array_and_strings_stay_strings(fmt, num_workers,
                                                                   per_record):
    ds = dataset() if fmt is None else dataset().with_format(fmt)
    transforms = [jl.Map(lambda r: r)] if per_record else []
    with jl.DataLoader(ds, batch_size=8, shuffle=True, seed=1, num_workers=num_workers,
                       transforms=transforms, process_index=0, process_count=1) as loader:
        batches = list(loader)
    assert len(batches) == 5
    for batch in batches:
        assert batch["vector"].shape == (8, 32) and batch["vector"].dtype == np.float32
        assert batch["text"].dtype == object and all(type(t) is str for t in batch["text"])
        assert [len(t) for t in batch["text"]] == [1 + i % 9 for i in batch["label"]]
        want = np.asarray(dataset().with_format("numpy")[batch["label"].tolist()]["vector"])
        assert np.array_equal(batch["vector"], want)
    assert sorted(np.concatenate([b["label"] for b in batches]).tolist()) == list(range(40))


def test_a_datasets_column_is_refused_with_the_dataset_as_the_remedy():
    # ds["vector"] (datasets 4 and later: a Column of Python rows) batched as 32 arrays of
    # shape (batch,), slowly, without a word (the Hugging Face audit)
    column = dataset()["vector"]
    with pytest.raises(jl.ConfigError, match=r"a datasets Column \(ds\['vector'\]\): .*pass "
                                             r"the dataset, or ds.select_columns"):
        jl.DataLoader(column, batch_size=8, process_index=0, process_count=1)
    with pytest.raises(jl.ConfigError, match=r"a Hugging Face dataset is read as it is: pass "
                                             r"it to the DataLoader"):
        jl.ArraySource(dataset())  # (its remedy was a source of one's own, a __getitem__)


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.e2e)])
def test_datasets_mixed_concatenated_filtered_or_mapped_batch_the_same_way(num_workers):
    """A Dataset inside jl.mix, ConcatSource, FilteredSource or MapSource is read as NumPy too
    (it gave lists of 32 arrays)."""
    wrapped = {"mix": jl.mix([dataset(), dataset(20)], [0.5, 0.5]),
               "concat": jl.ConcatSource([dataset(), dataset(20)]),
               "filtered": jl.FilteredSource(dataset(), lambda r: r["label"] % 3 == 0),
               "mapped": jl.MapSource(dataset(), lambda r: {**r, "label": r["label"]})}
    for name, source in wrapped.items():
        with jl.DataLoader(source, batch_size=4, shuffle=True, seed=2, num_workers=num_workers,
                           process_index=0, process_count=1) as loader:
            batch = next(iter(loader))
        assert batch["vector"].shape == (4, 32) and batch["vector"].dtype == np.float32, name
        assert all(type(t) is str for t in batch["text"]), name
        want = np.asarray(dataset().with_format("numpy")[batch["label"].tolist()]["vector"])
        assert np.array_equal(batch["vector"], want), name


def test_packing_a_dataset_takes_its_lengths_from_arrow_and_packs_its_rows(monkeypatch):
    from jaxloader.derived import packed_source as packing
    from jaxloader.sources.huggingface import HuggingFaceSource

    rng = np.random.default_rng(3)
    docs = [list(range(100 * i, 100 * i + int(n))) for i, n in enumerate(rng.integers(1, 40, 60))]
    ds = datasets.Dataset.from_dict({"ids": docs, "text": ["t"] * 60})
    ds = ds.shuffle(seed=2).filter(lambda r: len(r["ids"]) != 7)  # an indices mapping
    kept = [list(r) for r in ds["ids"]]
    assert HuggingFaceSource(ds).lengths("ids").tolist() == [len(r) for r in kept]
    assert HuggingFaceSource(ds).lengths("text") is None  # not lists of integers

    def no_reading(*args):
        raise AssertionError("the lengths come from the Arrow offsets")

    with monkeypatch.context() as patch:
        patch.setattr(packing, "_read_lengths", no_reading)
        packed = jl.PackedSource(ds, "ids", 32, seed=1)
    like = jl.PackedSource(jl.RaggedSource.from_sequences({"ids": kept}), "ids", 32, seed=1)
    assert len(packed) == len(like)
    rows = np.arange(len(like))
    for key, value in like.__getitems__(rows).items():
        assert np.array_equal(packed.__getitems__(rows)[key], value), key
    custom = ds.with_transform(lambda batch: {"ids": [[t + 1 for t in r] for r in batch["ids"]]})
    shifted = jl.PackedSource(custom, "ids", 32, seed=1)  # its transform's lists, read
    assert np.array_equal(shifted.plan.row_ptr, like.plan.row_ptr)


def test_times_in_a_zone_are_refused_naming_the_column_and_the_remedy_works():
    # they came out as UTC's datetime64, the zone dropped without a word
    import pyarrow as pa

    zoned = datasets.Dataset(pa.table({"t": pa.array([1, 2], pa.timestamp("s", tz="Asia/Tokyo")),
                                       "x": [1, 2]}))
    with pytest.raises(jl.ConfigError, match=r"column 't' holds times in the zone 'Asia/Tokyo'"):
        jl.DataLoader(zoned, batch_size=2)
    utc = zoned.cast_column("t", datasets.Value("timestamp[us, tz=UTC]"))
    with jl.DataLoader(utc, batch_size=2, process_index=0, process_count=1) as loader:
        times = next(iter(loader))["t"]
    assert times.dtype == np.dtype("datetime64[us]") and times[1] == np.datetime64(2, "s")


def test_a_null_in_a_numeric_column_is_refused_by_column_and_row_where_it_is_read():
    # NumPy format gave int64 ids through float32 (16777217 -> 16777216) and the null as
    # INT64_MIN; a float null as NaN
    ds = datasets.Dataset.from_dict({"id": [16_777_217, 123_456_789, None, 4],
                                     "v": [[0.5], [1.5], [2.5], [None]],
                                     "t": ["a", None, "c", "d"]})  # (a null string)
    with jl.DataLoader(ds.select([0, 1]).remove_columns("t"), batch_size=2, process_index=0,
                       process_count=1) as loader:
        assert next(iter(loader))["id"].tolist() == [16_777_217, 123_456_789]
    only_t = ds.with_format("numpy", columns=["t"])  # (a column not read is not checked)
    assert jl.sources.huggingface.HuggingFaceSource(only_t).__getitems__([2, 3])["t"].tolist() \
        == ["c", "d"]
    for rows, match in (([0, 1, 2], r"column 'id' \(int64\) holds a null in rows \[2\]"),
                        ([3], r"column 'v' \(list<item: double>\) holds a null in rows \[0\]")):
        with jl.DataLoader(ds.select(rows), batch_size=len(rows), process_index=0,
                           process_count=1) as loader, pytest.raises(jl.JaxloaderError,
                                                                     match=match + ".*ds.filter"):
            next(iter(loader))
    with pytest.raises(jl.RecordError, match=r"column 'id' .* rows \[2\]"):
        jl.sources.huggingface.HuggingFaceSource(ds)[2]
    # a null string, a struct's null field and a null image came out as None in the batch
    from datasets import Features, Image, Value
    from PIL import Image as Picture

    picture = Picture.fromarray(np.zeros((2, 2, 3), np.uint8))
    features = Features({"t": Value("string"), "m": {"x": Value("int32"), "s": Value("string")},
                         "img": Image()})
    rows = {"t": ["a", "b", "c"], "m": [{"x": 1, "s": "p"}] * 3, "img": [picture] * 3}
    fine = datasets.Dataset.from_dict(rows, features=features)
    with jl.DataLoader(fine, batch_size=3, process_index=0, process_count=1) as loader:
        batch = next(iter(loader))  # (an image's null path beside its bytes: how they are)
        assert batch["img"].shape == (3, 2, 2, 3) and batch["m"]["x"].dtype == np.int32
    deeper = datasets.Dataset.from_dict(  # (at any depth: a list of them, one in a dict)
        {"imgs": [[picture, picture]] * 2, "doc": [{"img": picture, "t": "a"}] * 2},
        features=Features({"imgs": datasets.Sequence(Image()),
                           "doc": {"img": Image(), "t": Value("string")}}))
    with jl.DataLoader(deeper, batch_size=2, process_index=0, process_count=1) as loader:
        assert next(iter(loader))["imgs"].shape == (2, 2, 2, 2, 3)
    # a dict of the user's own, shaped as an image is stored (bytes and a path), is no image
    own = datasets.Dataset.from_dict({"f": [{"bytes": b"a", "path": "p"},
                                            {"bytes": b"b", "path": None}]})
    with pytest.raises(jl.RecordError, match=r"column 'f' .* holds a null in rows \[1\]"):
        jl.sources.huggingface.HuggingFaceSource(own).__getitems__(np.arange(2))
    for key, value, kind in (("t", None, r"\(string\)"), ("m", {"x": None, "s": "p"}, r"\(struct"),
                             ("m", {"x": 1, "s": None}, r"\(struct"), ("img", None, r"\(struct")):
        nulled = datasets.Dataset.from_dict({**rows, key: [rows[key][0], value, rows[key][2]]},
                                            features=features)
        with jl.DataLoader(nulled, batch_size=3, process_index=0, process_count=1) as loader, \
                pytest.raises(jl.RecordError, match=rf"column '{key}' {kind}.*holds a null in "
                                                    r"rows \[1\].*None where the other rows"):
            next(iter(loader))
    # values stored behind a null list (Arrow allows them; flatten() leaves them out)
    import pyarrow as pa
    from datasets.table import InMemoryTable

    behind = pa.ListArray.from_arrays([0, 2, 4, 6], [1, 2, 9, 9, 5, None],
                                      mask=pa.array([False, True, False]))
    lists = jl.sources.huggingface.HuggingFaceSource(
        datasets.Dataset(InMemoryTable(pa.table({"v": behind}))))
    assert lists[0]["v"].tolist() == [1, 2]
    with pytest.raises(jl.RecordError, match=r"column 'v' .* rows \[1, 2\]"):
        lists.__getitems__(np.arange(3))
    ids = datasets.Dataset.from_dict({"ids": [[1, 2, 3], None, [4, 5]]})
    none = jl.sources.huggingface.HuggingFaceSource(ids.filter(lambda r: False))
    assert none.lengths("ids").tolist() == []  # (no rows: no null)
    with pytest.raises(ValueError, match=r"column 'ids' has 1 null list\(s\), in rows \[1\]"):
        jl.PackedSource(ids, "ids", 4)


def test_resume_and_the_datasets_own_fingerprint():
    ds = dataset()
    check_resume(lambda: jl.DataLoader(ds, batch_size=4, shuffle=True, seed=2, num_epochs=None,
                                       process_index=0, process_count=1), total=14, k=6)
    state = jl.DataLoader(ds, batch_size=4, process_index=0, process_count=1).state_dict()
    assert state["source"] == ds._fingerprint
    changed = ds.map(lambda r: {"label": r["label"] + 1})
    with pytest.raises(jl.StateDictError, match="source: expected"):
        jl.DataLoader(changed, batch_size=4, process_index=0, process_count=1).load_state_dict(
            state)
    # the same rows in another format: refused, and said why (it said only "restore it into
    # a loader over the same data", which it was)
    with pytest.raises(jl.StateDictError, match=r"the source's own fingerprint differs .*a "
                       r"Hugging Face Dataset's, which map, filter, with_format.*differs under "
                       r"another Python version"):  # (saved under 3.11, refused under 3.13:
        # the remedy was to make the source the same way, which it was; the Orbax audit)
        jl.DataLoader(ds.with_format("numpy"), batch_size=4, process_index=0,
                      process_count=1).load_state_dict(state)


@pytest.mark.parametrize("fmt", [None, "numpy"])
def test_struct_features_batch_as_dicts_of_fields_of_their_declared_dtypes(fmt):
    # NumPy format gives a batch of a dict feature as an object array of dicts (no device
    # takes it) and its fields as float64/int64: read as a dict of batched fields, typed as
    # declared, whether read a batch at a time or a record at a time (through a Map)
    n = 12
    feats = datasets.Features({
        "point": {"x": datasets.Value("float32"), "tag": datasets.Value("string"),
                  "v": datasets.Sequence(datasets.Value("int16"), length=2),
                  "inner": {"deep": datasets.Value("uint8")}},
        "answers": {"start": datasets.Sequence(datasets.Value("int32"))},
    })
    ds = datasets.Dataset.from_dict({
        "point": [{"x": i / 2, "tag": "t" * (1 + i % 4), "v": [i, -i], "inner": {"deep": i}}
                  for i in range(n)],
        "answers": [{"start": [i] * (1 + i % 2)} for i in range(n)],
    }, features=feats)
    ds = ds if fmt is None else ds.with_format(fmt)
    got = {}
    for per_record in (False, True):
        transforms = [jl.Map(lambda r: r)] if per_record else []
        with jl.DataLoader(ds.remove_columns("answers") if per_record else ds, batch_size=4,
                           shuffle=True, seed=3, num_workers=2, transforms=transforms,
                           process_index=0, process_count=1) as loader:
            got[per_record] = list(loader)
    for batch, other in zip(got[False], got[True]):
        point = batch["point"]
        assert point["x"].dtype == np.float32 and point["v"].dtype == np.int16
        assert point["v"].shape == (4, 2) and point["inner"]["deep"].dtype == np.uint8
        ids = point["v"][:, 0].astype(np.int64)
        assert point["x"].tolist() == (ids / 2).tolist()
        assert point["tag"].dtype == object and point["tag"].tolist() == [
            "t" * (1 + i % 4) for i in ids]
        starts = batch["answers"]["start"]  # lengths 1 and 2: a row each, as declared
        assert [s.tolist() for s in starts] == [[i] * (1 + i % 2) for i in ids]
        assert all(s.dtype == np.int32 for s in starts)
        for name in ("x", "v", "tag"):  # a record at a time: the same batches
            assert other["point"][name].dtype == point[name].dtype
            assert other["point"][name].tolist() == point[name].tolist()
        assert other["point"]["inner"]["deep"].dtype == np.uint8


def test_an_iterable_dataset_or_a_dataset_dict_is_refused_with_what_to_pass_instead():
    ds = dataset(10)
    with pytest.raises(jl.ConfigError, match=r"IterableDataset is a stream: "
                                             r"jaxloader.StreamLoader\(ds\) reads it"):
        jl.DataLoader(ds.to_iterable_dataset(), batch_size=2)
    with pytest.raises(jl.ConfigError, match=r"DatasetDict .*pass one of them: source\['train'\]"):
        jl.DataLoader(datasets.DatasetDict({"train": ds, "test": ds}), batch_size=2)


@pytest.mark.parametrize("fmt", [None, "numpy"])
def test_an_iterable_dataset_streams_a_shard_of_it_a_shard(fmt):
    # every record once an epoch, through 2 workers, in either format (NumPy format's
    # strings of other lengths did not batch: tests/streams/test_huggingface.py has the rest)
    ds = dataset(10).to_iterable_dataset(num_shards=2).with_format(fmt)
    with jl.StreamLoader(ds, batch_size=5, num_workers=2, process_index=0,
                         process_count=1) as loader:
        it = iter(loader)
        batches = [next(it) for _ in range(4)]
    labels = np.concatenate([b["label"] for b in batches])
    assert sorted(labels.tolist()) == sorted(list(range(10)) * 2)
    assert all(b["vector"].shape == (5, 32) and b["vector"].dtype == np.float32 for b in batches)
    assert all(type(t) is str for b in batches for t in b["text"])


def test_array_features_batch_as_their_declared_shapes_from_a_dataset_a_stream_or_parquet(
        tmp_path):
    # Array2D/Array3D are Arrow extension types whose value_type is a dtype's name (a str):
    # looking for a zone in it raised AttributeError: 'str' object has no attribute 'id'
    rows = [np.arange(24, dtype=np.float32).reshape(2, 3, 4) + i for i in range(4)]
    features = datasets.Features({"a": datasets.Array3D((2, 3, 4), "float32"),
                                  "b": datasets.Array2D((2, 3), "int16"),
                                  "y": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(
        {"a": rows, "b": [r[0, :2, :3].astype(np.int16) for r in rows], "y": list(range(4))},
        features=features)
    ds.to_parquet(tmp_path / "a.parquet")
    made = [jl.DataLoader(ds, batch_size=2),
            jl.DataLoader(jl.ParquetSource(tmp_path / "a.parquet"), batch_size=2),
            jl.StreamLoader(ds.to_iterable_dataset(num_shards=1), batch_size=2)]
    for loader in made:
        with loader:
            batch = next(iter(loader))
        assert batch["a"].shape == (2, 2, 3, 4) and batch["a"].dtype == np.float32
        assert batch["b"].shape == (2, 2, 3) and batch["b"].dtype == np.int16
        assert np.array_equal(batch["a"], np.stack([rows[y] for y in batch["y"]]))


def test_an_array_feature_of_rows_of_other_lengths_is_an_object_array_in_every_batch():
    # Array2D((None, 2)) was not seen as ragged (an Arrow extension type): float32 batches
    # and object ones by turns, a jitted step failing part way through (the HF audit)
    lengths = [1, 1, 2, 3, 2, 2]
    ds = datasets.Dataset.from_dict(
        {"a": [np.full((k, 2), i, np.float32) for i, k in enumerate(lengths)]},
        features=datasets.Features({"a": datasets.Array2D((None, 2), "float32")}))
    with jl.DataLoader(ds, batch_size=2, process_index=0, process_count=1) as loader:
        batches = [b["a"] for b in loader]
    assert all(b.dtype == object and b.shape == (2,) for b in batches)
    assert [row.shape for b in batches for row in b] == [(k, 2) for k in lengths]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_saved_datasets_file_changed_in_place_is_refused_at_the_next_batch(tmp_path,
                                                                           num_workers):
    # Arrow maps load_from_disk's files: one written again in place mixed versions, one cut
    # shorter killed the process by SIGBUS (in process, printing nothing)
    datasets.Dataset.from_dict({"x": np.arange(4096)}).save_to_disk(tmp_path)
    ds = datasets.load_from_disk(str(tmp_path))
    with jl.DataLoader(ds, batch_size=64, shuffle=False, num_workers=num_workers,
                       process_index=0, process_count=1) as loader:
        batches = iter(loader)
        assert next(batches)["x"][:2].tolist() == [0, 1]
        datasets.Dataset.from_dict({"x": -np.arange(4096)}).save_to_disk(tmp_path / "b")
        (file,) = [f["filename"] for f in ds.cache_files]
        time.sleep(0.05)  # (a file's time ticks every few ms: a rewrite in its tick is unseen)
        with open(file, "r+b") as out:  # (the same size, other values)
            out.write((tmp_path / "b" / os.path.basename(file)).read_bytes())
        with pytest.raises(jl.JaxloaderError, match=r"a datasets.Dataset: the memory-mapped "
                                                    r"file .*changed in place.*save_to_disk"):
            for _ in range(63):  # (the workers may have made a few batches ahead)
                assert next(batches)["x"].min() >= 0 or num_workers  # (a worker: read as
                # the file is written, after its check, it may have the new values)
    # replaced by a rename: a worker started after it mapped the new file by its name (datasets
    # pickles a table by its files), the training process the old one
    datasets.Dataset.from_dict({"x": np.arange(4096)}).save_to_disk(tmp_path / "c")
    ds = datasets.load_from_disk(str(tmp_path / "c"))
    with jl.DataLoader(ds, batch_size=64, num_workers=num_workers, process_index=0,
                       process_count=1) as loader:
        (file,) = [f["filename"] for f in ds.cache_files]
        os.replace(tmp_path / "b" / os.path.basename(file), file)
        with pytest.raises(jl.JaxloaderError, match=r"file .* was replaced since the source was "
                                                    r"made .*load it again"):
            next(iter(loader))


def test_a_saved_datasets_file_cut_before_its_workers_start_is_named_by_them(tmp_path):
    # made, then its file cut, then the workers started: a worker unpickling the Dataset maps
    # its files again and failed in Arrow's words ("Expected to read 248 metadata bytes"),
    # naming no file
    datasets.Dataset.from_dict({"x": np.arange(1000)}).save_to_disk(tmp_path)
    ds = datasets.load_from_disk(str(tmp_path))
    loader = jl.DataLoader(ds, batch_size=10, num_workers=2, process_index=0, process_count=1)
    (file,) = [f["filename"] for f in ds.cache_files]
    os.truncate(file, 100)
    with loader, pytest.raises(jl.WorkerError, match=r"raised while starting .*; in this "
                                                     r"process, a datasets.Dataset: the memory-"
                                                     r"mapped file .*data-00000-of-00001.arrow' "
                                                     r"changed in place since the source was made "
                                                     r"\([\d,]+ bytes then, 100 now.*save_to_disk"):
        next(iter(loader))


_CUT_BEFORE = """
import os, shutil, sys, datasets, numpy as np, jaxloader as jl
datasets.disable_progress_bars()
here = sys.argv[1]
datasets.Dataset.from_dict({"x": np.arange(200_000)}).save_to_disk(here + "/a")
datasets.Dataset.from_dict({"x": np.arange(1000)}).save_to_disk(here + "/small")
old = datasets.load_from_disk(here + "/a")
for name in os.listdir(here + "/small"):  # (written again in place: the same inode, cut)
    shutil.copyfile(os.path.join(here, "small", name), os.path.join(here, "a", name))
new = datasets.load_from_disk(here + "/a")  # (mapped after: read, the old one kept its map)
print(sum(len(b["x"]) for b in jl.DataLoader(new, batch_size=100, num_epochs=1)), flush=True)
for batch in jl.DataLoader(old, batch_size=10_000, num_epochs=1):
    pass
"""


def test_a_saved_datasets_file_cut_before_the_loader_is_refused_as_it_is_made(tmp_path):
    # load_from_disk, then its file written again smaller in place, then a loader of it: its
    # stamps were the cut file's, and a read past the file's end killed the process by SIGBUS,
    # printing nothing (a list column's: as the loader was made); run apart, so the code before
    # it died
    done = subprocess.run([sys.executable, "-c", _CUT_BEFORE, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout == "1000\n", done.stderr[-2000:]
    assert done.returncode == 1 and re.search(
        r"ConfigError: a datasets.Dataset: the memory-mapped file '.*a/data-00000-of-00001."
        r"arrow' holds [\d,]+ bytes, fewer than the [\d,]+ this process mapped of it: .*SIGBUS"
        r".*load it again after it is written", done.stderr), done.stderr[-2000:]


def _augment(batch):  # a with_transform function: batch in, batch out (HF's convention)
    return {"scaled": [np.asarray(v, np.float32) * 10 for v in batch["vector"]],
            "label": batch["label"], "tag": [f"t{i}" for i in batch["label"]]}


def _uneven(batch):  # a transform whose rows differ in kind, as the sources audit wrote it
    i = batch["i"]
    return {"y": [1 if k % 2 == 0 else 2.5 for k in i],  # int beside float
            "id": [2**63 + 5 if k % 2 == 0 else 1 for k in i],  # uint64 beside int64
            "t": ["a" if k % 2 == 0 else b"b" for k in i],  # str beside bytes
            "v": [np.ones(2, np.float32 if k % 2 == 0 else np.float64) for k in i],
            "ok": [np.float32(k) for k in i]}


def test_a_datasets_transform_whose_rows_differ_in_kind_is_named_not_promoted():
    # (the sources audit) its rows were stacked by NumPy's promotion: ints beside floats made
    # float64, an id past 2**63 rounded, float32 rows beside float64 ones made float64, str
    # beside bytes one object leaf: the same records from a list were refused
    ds = datasets.Dataset.from_dict({"i": [0, 1, 2, 3]})
    for key, kinds in (("y", "'float64', 'int64'"), ("id", "'int64', 'uint64'"),
                       ("t", "'S', 'U'"), ("v", "'float32', 'float64'")):
        keep = functools.partial(_kept, key=key)
        with pytest.raises(jl.RecordError, match=rf"transform gave column '{key}' rows of other "
                                                 rf"kinds \(\[{kinds}\]\), .*make them one dtype"):
            next(iter(jl.DataLoader(ds.with_transform(keep), batch_size=4)))
    fine = next(iter(jl.DataLoader(ds.with_transform(functools.partial(_kept, key="ok")),
                                   batch_size=4)))
    assert fine["ok"].dtype == np.float32 and fine["ok"].tolist() == [0, 1, 2, 3]


def _kept(batch, key):
    return {key: _uneven(batch)[key]}


@pytest.mark.parametrize("per_record", [False, True])
def test_the_datasets_own_transform_is_kept(per_record):
    # with_transform / set_transform: the loader read the dataset in NumPy format, which
    # replaced the user's transform (the batches had the raw columns, silently)
    ds = dataset(12).with_transform(_augment)
    transforms = [jl.Map(lambda r: r)] if per_record else []
    with jl.DataLoader(ds, batch_size=4, shuffle=True, seed=1, num_workers=2,
                       transforms=transforms, process_index=0, process_count=1) as loader:
        batches = list(loader)
    raw = dataset(12).with_format("numpy")
    for batch in batches:
        assert sorted(batch) == ["label", "scaled", "tag"]
        assert batch["scaled"].shape == (4, 32) and batch["scaled"].dtype == np.float32
        want = raw[batch["label"].tolist()]["vector"] * 10
        np.testing.assert_allclose(batch["scaled"], want, rtol=1e-6)
        assert batch["tag"].tolist() == [f"t{i}" for i in batch["label"]]


def test_a_dataset_dict_is_named_wherever_a_source_goes():
    # only DataLoader named it; ConcatSource, mix, MapSource, FilteredSource and PackedSource
    # raised "'DatasetDict' object has no attribute 'format'", and an IterableDatasetDict was
    # told to wrap it in an ArraySource
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"ids": [[1, 2], [3]]})})
    for make in (lambda: jl.ConcatSource([splits]), lambda: jl.MapSource(splits, len),
                 lambda: jl.FilteredSource(splits, bool), lambda: jl.PackedSource(splits, "ids", 4),
                 lambda: jl.mix([splits, splits], [0.5, 0.5])):
        with pytest.raises(jl.ConfigError, match=r"got a DatasetDict .*pass one of them: "
                                                 r"source\['train'\]"):
            make()
    streams = datasets.IterableDatasetDict({"train": splits["train"].to_iterable_dataset()})
    with pytest.raises(jl.ConfigError, match=r"IterableDatasetDict .*pass one of them to a "
                                             r"StreamLoader: jaxloader.StreamLoader\(source"):
        jl.DataLoader(streams, batch_size=2)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_values_come_as_stored_not_as_numpy_formats_defaults(num_workers):
    # NumPy format cast every float to float32 (float64 values rounded, then cast back to
    # float64: the loss hidden), durations to int64, and made strings and bytes fixed-width
    # arrays, which cut trailing NULs
    import datetime

    feats = datasets.Features({
        "x": datasets.Value("float64"), "pair": datasets.Sequence(datasets.Value("float64")),
        "d": datasets.Value("duration[ms]"), "text": datasets.Value("string"),
        "blob": datasets.Value("binary"), "tags": datasets.Sequence(datasets.Value("string")),
        "st": {"n": datasets.Value("float32"), "s": datasets.Value("string")},
        "t": datasets.Value("time64[us]")})
    rows = {"x": [0.1, 1e-300, 123456789.123456789], "pair": [[0.1, 0.2], [0.3], []],
            "d": [datetime.timedelta(milliseconds=1500 + i) for i in range(3)],
            "text": ["abc\x00", "x", "\x00\x00"], "blob": [b"\x01\x00", b"\x00\x00", b"z"],
            "tags": [["a\x00", "b"], ["c"], []], "st": [{"n": i / 4, "s": f"q{i}\x00"}
                                                      for i in range(3)],
            "t": [datetime.time(0, 0, i) for i in range(3)]}  # (datetime.time: refused)
    ds = datasets.Dataset.from_dict(rows, features=feats)
    with jl.DataLoader(ds, batch_size=3, num_workers=num_workers, process_index=0,
                       process_count=1) as loader:
        batch = next(iter(loader))
    assert batch["x"].dtype == np.float64 and batch["x"].tolist() == rows["x"]
    assert [p.tolist() for p in batch["pair"]] == rows["pair"]
    assert batch["d"].dtype == np.dtype("timedelta64[ms]")
    assert batch["d"].astype(np.int64).tolist() == [1500, 1501, 1502]
    for key in ("text", "blob"):
        assert batch[key].dtype == object and batch[key].tolist() == rows[key]
    assert [t.tolist() for t in batch["tags"]] == rows["tags"]
    assert batch["st"]["s"].tolist() == [r["s"] for r in rows["st"]]
    assert batch["st"]["n"].dtype == np.float32
    assert batch["t"].dtype == np.dtype("timedelta64[us]")  # (as ParquetSource gives it)
    assert batch["t"].astype(np.int64).tolist() == [0, 1_000_000, 2_000_000]
    from jaxloader.sources.huggingface import HuggingFaceSource

    one = HuggingFaceSource(ds)[1]  # (a record at a time: the same values)
    assert one["x"] == rows["x"][1] and one["blob"] == b"\x00\x00" and one["st"]["s"] == "q1\x00"


def test_lists_of_strings_and_of_dicts_batch_as_numpy_format_gives_them():
    # a first fix read every column holding text from Arrow: a chat's list of messages came
    # as a dict of arrays a row (a Map over r["messages"] failed), lists of strings of one
    # length as (batch,) of rows, not (batch, n)
    messages = [[{"role": "user", "content": f"q{i}\x00"}, {"role": "assistant",
                                                           "content": "a"}] for i in range(4)]
    ds = datasets.Dataset.from_dict({"messages": messages, "tags": [["a", "b\x00"]] * 4})

    def as_text(r):
        return {"text": " ".join(m["role"] + ": " + m["content"] for m in r["messages"])}

    with jl.DataLoader(ds, batch_size=4, process_index=0, process_count=1) as loader:
        batch = next(iter(loader))
    assert batch["messages"].shape == (4, 2) and batch["messages"][1, 0]["content"] == "q1\x00"
    assert batch["tags"].shape == (4, 2) and batch["tags"].tolist() == [["a", "b\x00"]] * 4
    with jl.DataLoader(ds, batch_size=4, transforms=[jl.Map(as_text)], process_index=0,
                       process_count=1) as loader:
        assert next(iter(loader))["text"][2] == "user: q2\x00 assistant: a"


def test_times_of_day_in_lists_and_dicts_and_string_views_come_as_stored():
    # a second fix narrowed the Arrow reads to a column's own values: times in lists and
    # dicts came as datetime.time again (refused), and views of strings lost their NULs
    import datetime

    import pyarrow as pa

    table = {"t": pa.array([[datetime.time(0, 0, i), datetime.time(1)] for i in range(3)],
                           pa.list_(pa.time64("us"))),
             "s": pa.array([{"a": datetime.time(0, 0, i)} for i in range(3)],
                           pa.struct([("a", pa.time32("s"))]))}
    if hasattr(pa, "string_view"):
        table["v"] = pa.array(["a\x00", "b", "c"], pa.string_view())
    ds = datasets.Dataset(pa.table(table))
    with jl.DataLoader(ds, batch_size=3, process_index=0, process_count=1) as loader:
        batch = next(iter(loader))
    assert batch["t"].dtype == np.dtype("timedelta64[us]") and batch["t"].shape == (3, 2)
    assert batch["t"][2, 0] == np.timedelta64(2_000_000, "us")
    assert batch["s"]["a"].astype(np.int64).tolist() == [0, 1, 2]
    if "v" in table:
        assert batch["v"].tolist() == ["a\x00", "b", "c"]


def test_a_long_string_is_not_copied_to_every_rows_width():
    # NumPy format made a column of strings one fixed-width array: one 2 MB document in a
    # batch of 128 took 1 GiB
    import tracemalloc

    from jaxloader.sources.huggingface import HuggingFaceSource

    source = HuggingFaceSource(datasets.Dataset.from_dict(
        {"text": ["x" * 200_000] + ["short"] * 127, "n": list(range(128))}))
    tracemalloc.start()
    try:
        batch = source.__getitems__(np.arange(128))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(batch["text"][0]) == 200_000 and batch["text"][1] == "short"
    assert peak < 20 * 200_000, peak  # (fixed width: 128 rows x 200,000 x 4 bytes)


@pytest.mark.parametrize("release", ["2.18.0", "2.20.0", "2.21.0rc1"])
def test_a_datasets_release_whose_numpy_format_fails_under_numpy_2_is_named(monkeypatch,
                                                                            release):
    # datasets before 2.21 called np.array(copy=False) in its NumPy format: NumPy 2's bare
    # ValueError at the first batch, from inside datasets
    ds = datasets.Dataset.from_dict({"x": [1, 2, 3, 4]})
    monkeypatch.setattr(datasets, "__version__", release)
    with pytest.raises(jl.ConfigError, match=rf"datasets {release} reads no batch under NumPy "
                                             r".*pip install \"datasets>=2.21\""):
        jl.DataLoader(ds, batch_size=2, process_index=0, process_count=1)
    monkeypatch.setattr(datasets, "__version__", "2.21.0")
    assert len(jl.DataLoader(ds, batch_size=2, process_index=0, process_count=1)) == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_a_column_of_lists_of_other_lengths_is_an_object_array_in_every_batch(workers):
    # NumPy format stacked a batch whose rows happened to be of one length: that leaf went to
    # the devices as int64 (2, 3), the next as objects, and a jitted step failed mid-epoch.
    ds = datasets.Dataset.from_dict({"ids": [[1, 2, 3], [4, 5, 6], [7], [8, 9]]})
    with jl.DataLoader(ds, batch_size=2, num_workers=workers) as loader:
        batches = [b["ids"] for b in loader]
    assert [(b.dtype, b.shape) for b in batches] == [(np.dtype(object), (2,))] * 2
    assert [row.tolist() for b in batches for row in b] == [[1, 2, 3], [4, 5, 6], [7], [8, 9]]
    assert all(row.dtype == np.int64 for b in batches for row in b)
    same = datasets.Dataset.from_dict({"ids": [[1, 2, 3], [4, 5, 6]]})  # (one length: stacked)
    assert next(iter(jl.DataLoader(same, batch_size=2)))["ids"].dtype == np.int64


def test_lists_a_filter_left_of_one_length_are_stacked():
    # (the table's rows were looked at, not the dataset's: a filter to one length still gave
    # objects, which no device takes)
    ds = datasets.Dataset.from_dict({"ids": [[1, 2, 3], [7], [4, 5, 6], [8, 9], [1, 1, 1]]})
    kept = ds.filter(lambda r: len(r["ids"]) == 3)
    batch = next(iter(jl.DataLoader(kept, batch_size=3)))
    assert batch["ids"].dtype == np.int64 and batch["ids"].tolist() == [[1, 2, 3], [4, 5, 6],
                                                                       [1, 1, 1]]


def test_lists_of_lists_of_other_inner_lengths_are_objects_in_every_batch():
    ds = datasets.Dataset.from_dict({"spans": [[[1, 2], [3, 4]], [[5, 6], [7, 8]],
                                               [[1], [2, 3]], [[4, 5], [6]]]})
    kinds = [b["spans"].dtype for b in jl.DataLoader(ds, batch_size=2)]
    assert kinds == [np.dtype(object)] * 2


def test_lists_of_lists_a_filter_left_of_one_shape_stack_and_fixed_outer_lists_are_judged():
    # (the table's inner lists were looked at, rows a filter left out too; an outer list of
    # a fixed length was not looked into: its batches flipped between int32 and objects)
    ds = datasets.Dataset.from_dict({"spans": [[[1, 2], [3, 4]], [[1], [2, 3]], [[5, 6], [7, 8]]]})
    kept = ds.filter(lambda r: all(len(s) == 2 for s in r["spans"]))
    assert next(iter(jl.DataLoader(kept, batch_size=2)))["spans"].shape == (2, 2, 2)
    fixed = ds.cast_column("spans", datasets.List(datasets.List(datasets.Value("int32")),
                                                  length=2))
    kinds = [b["spans"].dtype for b in jl.DataLoader(fixed.select([0, 2, 1, 0]), batch_size=2)]
    assert kinds == [np.dtype(object)] * 2


def test_a_decimal_column_is_a_clear_collate_error_and_a_map_may_drop_it():
    # NumPy raises ValueError on the dtype "decimal128(2, 1)", which was not caught: every
    # read failed (a Map dropping the column too), and a stream's construction raised a bare
    # ValueError
    import decimal

    import pyarrow as pa

    table = pa.table({"price": pa.array([decimal.Decimal("1.5")] * 4, pa.decimal128(2, 1)),
                      "y": list(range(4))})
    ds = datasets.Dataset(table)
    with pytest.raises(jl.CollateError, match=r"\['price'\].*decimal.Decimal.*convert it in a "
                                              r"Map"):
        next(iter(jl.DataLoader(ds, batch_size=2)))
    dropped = jl.DataLoader(ds, batch_size=2, transforms=[jl.Map(lambda r: {"y": r["y"]})])
    assert next(iter(dropped))["y"].tolist() == [0, 1]
    with jl.StreamLoader(ds.to_iterable_dataset(), batch_size=2, transforms=[
            jl.Map(lambda r: {"y": r["y"]})], process_index=0, process_count=1) as stream:
        assert next(iter(stream))["y"].tolist() == [0, 1]


def test_a_null_field_of_a_media_struct_is_none_as_the_dataset_gives_it(tmp_path):
    # an image stored by path (Image(decode=False)): its null bytes came as array(None,
    # dtype=object), so a Map's `if r["img"]["bytes"] is not None` took the wrong branch
    from PIL import Image as PILImage

    paths = []
    for i in range(8):
        paths.append(str(tmp_path / f"{i}.png"))
        PILImage.new("RGB", (2, 2)).save(paths[-1])
    ds = datasets.Dataset.from_dict({"img": paths}, features=datasets.Features(
        {"img": datasets.Image(decode=False)}))
    seen = []

    def look(r):
        seen.append(r["img"]["bytes"])
        return {"path": r["img"]["path"]}

    with jl.DataLoader(ds, batch_size=4, transforms=[jl.Map(look)]) as loader:
        assert [str(p) for p in next(iter(loader))["path"]] == paths[:4]
    assert len(seen) == 4 and all(v is None for v in seen)  # (array(None) == None: True)
    batch = next(iter(jl.DataLoader(ds, batch_size=4)))
    assert all(v is None for v in batch["img"]["bytes"])


def test_a_transforms_column_mixing_none_and_numbers_gives_a_map_none():
    # with_transform's [1, None, 3, 4]: a Map saw array(None, dtype=object) for the None, and
    # `-1 if r["n"] is None else r["n"]` made it NaN
    def own(batch):
        return {"n": [None if v == 2 else v for v in batch["x"]],
                "s": [{"a": None if v == 2 else float(v)} for v in batch["x"]]}

    ds = datasets.Dataset.from_dict({"x": [1, 2, 3, 4]}).with_transform(own)

    def fill(r):
        return {"n": np.float32(-1 if r["n"] is None else r["n"]),
                "a": np.float32(-1 if r["s"]["a"] is None else r["s"]["a"])}

    batch = next(iter(jl.DataLoader(ds, batch_size=4, transforms=[jl.Map(fill)])))
    assert batch["n"].tolist() == batch["a"].tolist() == [1.0, -1.0, 3.0, 4.0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_image_that_does_not_decode_is_named_by_its_row_and_column(num_workers):
    # (a truncated JPEG among shuffled rows was "source.__getitems__ raised OSError:
    # Truncated File Read" at a step: no row, no column to filter on)
    import io

    from PIL import Image

    def jpeg(i):
        out = io.BytesIO()
        Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(out, "JPEG")
        return out.getvalue()

    images = [{"bytes": jpeg(i), "path": None} for i in range(12)]
    images[5] = {"bytes": images[5]["bytes"][:60], "path": "cat/5.jpeg"}  # (imagefolder's)
    ds = datasets.Dataset.from_dict({"id": list(range(12)), "image": images},
                                    features=datasets.Features({"id": datasets.Value("int64"),
                                                                "image": datasets.Image()}))
    with jl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers) as loader, \
            pytest.raises((jl.RecordError, jl.WorkerError)) as caught:
        list(loader)
    said = str(caught.value)
    assert "(source index 5): source.__getitems__ raised RecordError: the dataset's row 5, " \
           "column 'image' (file 'cat/5.jpeg'): OSError" in said, said
    assert "ds.cast_column('image', datasets.Image(decode=False))" in said


def _jittered(batch):  # Hugging Face's image example's augmentation, drawn as the dataset reads
    return {"x": [v + np.random.rand() for v in batch["x"]]}


def test_a_datasets_own_transform_that_draws_is_warned_of_at_the_first_state():
    # its numbers are not the loader's: other batches with another worker count and after a
    # restore, and the dataset's own fingerprint skipped the check a plain source gets
    import warnings

    ds = datasets.Dataset.from_dict({"x": [float(i) for i in range(32)]})
    ds.set_transform(_jittered)
    with jl.DataLoader(ds, batch_size=4, process_index=0, process_count=1) as loader:
        next(iter(loader))
        with pytest.warns(jl.JaxloaderWarning, match=r"record 0, read twice, gave other values"
                                                     r".*RandomMap"):
            loader.state_dict()
    ds.set_transform(lambda batch: {"x": [v * 2 for v in batch["x"]]})  # (decoding: nothing)
    with jl.DataLoader(ds, batch_size=4, process_index=0, process_count=1) as loader:
        next(iter(loader))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader.state_dict()


def test_a_formats_dtype_is_refused_not_left_out():
    # with_format("numpy", dtype=np.float16) gave float64 batches without a word
    ds = datasets.Dataset.from_dict({"x": [float(i) for i in range(8)]})
    with pytest.raises(jl.ConfigError, match=r"with_format\('numpy', dtype=.*float16.*cast in "
                                             r"a Map"):
        jl.DataLoader(ds.with_format("numpy", dtype=np.float16), batch_size=4)
    jl.DataLoader(ds.with_format("numpy", dtype=None), batch_size=4)  # (none given: taken)
