"""``Pad``: records of other lengths padded to their batch's longest, with their lengths."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import jaxloader as jl


def clips(n: int = 23, seed: int = 0) -> list[dict]:
    """Records of other lengths: a clip of 1-40 samples (its value its index), frames of 2
    features, a label, and text."""
    lengths = np.random.default_rng(seed).integers(1, 41, n)
    return [{"audio": np.full(k, i, np.float32), "frames": np.full((k // 2 + 1, 2), i, np.int16),
             "label": np.int64(i % 3), "text": f"clip {i}"} for i, k in enumerate(lengths)]


def unpadded(batch: dict, key: str) -> list[list]:
    return [row[:n].tolist() for row, n in zip(batch[key], batch[key + "_length"])]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_batch_is_padded_to_its_longest_and_its_lengths_said(workers):
    records = clips()
    pad = jl.Pad(["audio", "frames"], value=-1, multiple_of=8)
    with jl.DataLoader(records, batch_size=4, shuffle=True, seed=3, num_workers=workers,
                       transforms=[pad]) as loader:
        batches = list(loader)
    assert len(batches) == 5
    seen = []
    for batch in batches:
        lengths = batch["audio_length"]
        assert batch["audio"].shape == (4, -(-int(lengths.max()) // 8) * 8)
        assert batch["audio"].dtype == np.float32 and lengths.dtype == np.int32
        for row, n, label in zip(batch["audio"], lengths, batch["label"]):
            i = int(row[0])
            assert n == len(records[i]["audio"]) and label == i % 3
            assert (row[:n] == i).all() and (row[n:] == -1).all()
            seen.append(i)
        frames = batch["frames"]
        assert frames.dtype == np.int16 and frames.shape[2] == 2 and frames.shape[1] % 8 == 0
        assert [r.shape[0] for r in map(np.asarray, unpadded(batch, "frames"))] == [
            len(records[int(row[0])]["frames"]) for row in batch["audio"]]
        assert [str(t) for t in batch["text"]] == [f"clip {int(row[0])}" for row in batch["audio"]]
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 20


def test_batches_are_the_same_with_any_worker_count_and_after_a_restore_into_another():
    def loader(workers):
        return jl.DataLoader(clips(40), batch_size=4, shuffle=True, seed=5, num_workers=workers,
                             transforms=[jl.Map(lambda r: {**r, "audio": r["audio"] * 2}),
                                         jl.Pad(["audio", "frames"]),
                                         jl.BatchMap(lambda b: {**b, "n": np.full(
                                             len(b["label"]), b["audio"].shape[1])})])

    with loader(0) as zero, loader(2) as two:
        want = list(zero)
        got = list(two)
        assert [unpadded(b, "audio") for b in got] == [unpadded(b, "audio") for b in want]
        assert all(b["audio"].shape == a["audio"].shape and (b["n"] == a["audio"].shape[1]).all()
                   for a, b in zip(want, got))
    with loader(2) as saving:
        it = iter(saving)
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(saving.state_dict()))
    with loader(2) as again, loader(0) as alone:
        for restored in (again, alone):
            restored.load_state_dict(state)
            rest = list(restored)
            assert [unpadded(b, "audio") for b in rest] == [unpadded(b, "audio")
                                                            for b in want[3:]]


def test_a_restore_under_other_pad_settings_is_told_as_other_transforms_are():
    pad = ["audio", "frames"]
    state = jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad)]).state_dict()
    jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad)]).load_state_dict(state)
    other = jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad, multiple_of=16)])
    with pytest.warns(UserWarning, match=r"transforms differ.*multiple_of=16"):
        other.load_state_dict(state)
    # a state another jaxloader saved: its Pad's code digest another (the library's code,
    # edited since), its settings the same: every such state warned to change the transforms
    older = {**state, "transforms": [t.rsplit(" ", 1)[0] + " 0540857f131c391a"
                                     for t in state["transforms"]]}
    fresh = jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad)])  # (its 23 clips:
    with warnings.catch_warnings():  # its last 3 dropped, said as it is made)
        warnings.simplefilter("error")
        fresh.load_state_dict(older)
    # a config's pad value 0.0, or a NumPy one, pads as 0 does: no warning (the config audit)
    for saved, values in ((0, (0.0, np.float32(0), np.int64(0))), (0.5, (np.float32(0.5),)),
                          ({"audio": 0, "frames": -1}, ({"audio": 0.0, "frames": np.int8(-1)},))):
        zero = jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad, value=saved)])
        for value in values:
            again = jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad, value=value)])
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                again.load_state_dict(zero.state_dict())
    zero = jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad, value=0)]).state_dict()
    minus = jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad, value=-100.5)])
    with pytest.warns(UserWarning, match=r"transforms differ.*value=-100.5"):
        minus.load_state_dict(zero)
    # np.float16(0.1) is another number than 0.1, and a key '1.0' another than '1' (the
    # twenty-first review: both were taken as the same)
    tenth = jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad, value=np.float16(0.1))])
    with pytest.warns(UserWarning, match=r"transforms differ.*value=0.1"):
        jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad(pad, value=0.1)]).load_state_dict(
            tenth.state_dict())
    from jaxloader.loaders.transform_names import compared_transforms
    assert len(set(compared_transforms([f"{jl.Pad(k)!r} 0" for k in ("1.0", "1")]))) == 2
    with warnings.catch_warnings():  # (a complex value's float() warned, an error under
        warnings.simplefilter("error")  # "error"; nan is held exactly: the twenty-third
        assert len(set(compared_transforms([  # review)
            f"{jl.Pad('x', value=v)!r} 0" for v in (np.complex64(1 + 2j), 1 + 2j)]))) == 2
        assert len(set(compared_transforms([
            f"{jl.Pad('x', value=v)!r} 0" for v in (np.float32("nan"), float("nan"))]))) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_pads_its_batches_and_its_last_one(workers):
    def records(shard):
        for i in range(shard * 100, shard * 100 + 7):
            yield {"ids": list(range(i % 5 + 1)), "i": i}

    stream = jl.Stream.from_generator(records, shards=2)
    with jl.StreamLoader(stream, batch_size=4, num_workers=workers, num_epochs=1,
                         readers_per_process=2, transforms=[jl.Pad("ids")]) as loader:
        batches = list(loader)
    got = sorted(int(i) for b in batches for i, m in zip(b["i"], b["mask"]) if m)
    assert got == [*range(7), *range(100, 107)]
    for b in batches:
        assert b["ids"].shape[1] == int(b["ids_length"].max())
        assert all(row[:n].tolist() == list(range(n)) for row, n in zip(b["ids"], b["ids_length"]))


def test_parquet_lists_of_other_lengths_are_padded(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tokens = [list(range(k)) for k in (3, 1, 4, 1, 5, 9, 2, 6)]
    pq.write_table(pa.table({"tokens": tokens}), tmp_path / "t.parquet")
    with jl.DataLoader(jl.ParquetSource(str(tmp_path / "t.parquet")), batch_size=4,
                       transforms=[jl.Pad("tokens")]) as loader:
        batches = list(loader)
    assert [b["tokens"].shape for b in batches] == [(4, 4), (4, 9)]
    assert [row for b in batches for row in unpadded(b, "tokens")] == tokens


def test_placement_and_records_it_cannot_pad_are_told():
    with pytest.raises(jl.ConfigError, match=r"Pad\('audio'.*after BatchMap.*before BatchMap"):
        jl.DataLoader(clips(), batch_size=4, transforms=[jl.BatchMap(lambda b: b),
                                                         jl.Pad("audio")])
    with pytest.raises(jl.ConfigError, match=r"Map\(.*after Pad.*put it before the Pad"):
        jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad("audio"), jl.Map(lambda r: r)])
    with pytest.raises(jl.ConfigError, match=r"one Pad takes several keys"):
        jl.DataLoader(clips(), batch_size=4, transforms=[jl.Pad("audio"), jl.Pad("frames")])
    for bad, said in [(dict(keys=3), r"Pad\(keys\)"),
                      (dict(keys="a", multiple_of=0), "multiple_of"),
                      (dict(keys="a", value="x"), r"Pad\(value\)"),
                      (dict(keys=["a", "a"]), "twice")]:
        with pytest.raises(jl.ConfigError, match=said):
            jl.Pad(**bad)

    def first(records, **kw):
        return next(iter(jl.DataLoader(records, batch_size=2, transforms=[jl.Pad("a", **kw)])))

    for records, said in [
            ([(np.arange(2),), (np.arange(3),)], r"record position 0 is a tuple, expected a dict"),
            ([{"b": np.arange(2)}] * 2, r"has no key 'a' \(its keys: \['b'\]\)"),
            ([{"a": 1.5}] * 2, r"'a' is float of shape \(\) .* a length axis"),
            ([{"a": [1, 2], "a_length": 2}] * 2, r"already has the key 'a_length'.*length_suffix"),
            ([{"a": np.zeros((2, 3))}, {"a": np.zeros((4, 2))}],
             r"record position 1 has shape \(4, 2\) and of record position 0 \(2, 3\): a Pad "
             r"pads the first axis only"),
            # a reward model's responses (a bare ValueError of NumPy's, naming nothing: the
            # DPO audit), and text (told to pass value="", which a Pad refuses)
            ([{"a": [np.arange(4), np.arange(2)]}, {"a": [np.arange(3)]}],
             r"record position 0's 'a' is a list of sequences of other lengths.*first axis "
             r"only; in a Map before the Pad, pad each inner sequence"),
            ([{"a": np.array(["x", "yz"])}] * 2, r"'a' holds text \(<U2\), and a Pad pads "
                                                  r"numbers")]:
        with pytest.raises(jl.CollateError, match=said):
            first(records)
    assert "a_length" not in first([{"a": [1, 2]}, {"a": [3]}], length_suffix=None)
    assert first([{"a": [1, 2]}, {"a": [3]}], length_suffix="_n")["a_n"].tolist() == [2, 1]


def test_a_fixed_length_is_what_several_processes_need_and_the_longest_is_refused_there():
    records = [{"a": np.arange(n)} for n in (3, 9, 2, 5, 4, 1, 7, 6)]
    # each process pads its own rows: to their longest, widths would differ (3 and 9 here)
    with pytest.raises(jl.ConfigError, match=r"each of the 2 processes pads .*length=N"):
        jl.DataLoader(records, batch_size=2, process_index=0, process_count=2,
                      transforms=[jl.Pad("a")])
    with pytest.raises(jl.ConfigError, match=r"each of the 2 processes"):
        jl.StreamLoader(jl.Stream.from_generator(lambda i: iter(records), shards=2),
                        batch_size=2, process_index=1, process_count=2, transforms=[jl.Pad("a")])
    widths = []
    for index in range(2):
        with jl.DataLoader(records, batch_size=2, process_index=index, process_count=2,
                           transforms=[jl.Pad("a", length=10)]) as loader:
            widths += [b["a"].shape for b in loader]
    assert widths == [(2, 10)] * 4
    with pytest.raises(jl.CollateError, match=r"'a' of record position 1 .*9 rows, more than "
                       r"length=8; crop it"):
        next(iter(jl.DataLoader(records, batch_size=2, transforms=[jl.Pad("a", length=8)])))
    with pytest.raises(jl.ConfigError, match="pass one of the two"):
        jl.Pad("a", length=8, multiple_of=4)


def test_an_empty_list_takes_the_batch_dtype_and_a_value_the_dtype_cannot_hold_is_refused():
    # (an empty Python list is float64 to NumPy: the batch became float64, or was refused
    # with advice to add the Pad it had)
    batch = next(iter(jl.DataLoader([{"ids": []}, {"ids": [4, 5]}], batch_size=2,
                                    transforms=[jl.Pad("ids")])))
    assert batch["ids"].dtype == np.int64 and batch["ids"].tolist() == [[0, 0], [4, 5]]
    small = [{"b": np.ones(n, np.uint8)} for n in (1, 3)]
    for value, held in [(-1, "255"), (0.5, "0")]:
        with pytest.raises(jl.CollateError, match=rf"'b' is uint8, which cannot hold "
                           rf"value={value} \(it would be .*{held}"):
            next(iter(jl.DataLoader(small, batch_size=2, transforms=[jl.Pad("b", value=value)])))
    floats = next(iter(jl.DataLoader([{"f": np.ones(1)}, {"f": np.ones(2)}], batch_size=2,
                                     transforms=[jl.Pad("f", value=float("nan"))])))
    assert np.isnan(floats["f"][0, 1]) and floats["f"][1].tolist() == [1.0, 1.0]


def test_an_empty_leaf_takes_the_others_trailing_shape_and_a_masked_one_is_refused():
    # a graph of no edges read from JSON ([], shape (0,)) beside edges of shape (n, 2) was
    # refused; a masked array (netCDF4's missing data) was padded with its fill values as data
    graphs = [{"edges": []}, {"edges": [[0, 1], [1, 2]]}, {"edges": np.zeros((0, 2), np.int32)}]
    batch = next(iter(jl.DataLoader(graphs, batch_size=3, transforms=[jl.Pad("edges")])))
    assert batch["edges"].shape == (3, 2, 2) and batch["edges_length"].tolist() == [0, 2, 0]
    assert batch["edges"][1].tolist() == [[0, 1], [1, 2]] and not batch["edges"][0].any()
    profiles = [{"t": np.ma.masked_equal(np.array([1.0, -999.0, 3.0][:2 + i]), -999.0)}
                for i in range(2)]
    with pytest.raises(jl.CollateError, match=r"record position 0's 't' is a masked array with "
                                              r"1 masked value.*x.filled\(0\)"):
        next(iter(jl.DataLoader(profiles, batch_size=2, transforms=[jl.Pad("t")])))


def test_an_empty_leaf_of_a_shape_keeps_it_and_the_record_that_differs_is_named():
    # (the detection audit: an image of no boxes, (0, 4), was made the shape of another
    # record's rows, so a record of (3, 5) boxes beside it passed, (2, 8, 5); one box given as
    # (4,) was 4 boxes; and the error named the empty record at a shape it never had)
    def boxes(n, width=4):
        return {"boxes": np.ones((n, width), np.float32)}

    def first(records, **kw):
        return next(iter(jl.DataLoader(records, batch_size=len(records), process_index=0,
                                       process_count=1, transforms=[jl.Pad("boxes", **kw)])))

    for records, said in (
            ([boxes(0), boxes(3, 5)], r"'boxes' of record position 1 has shape \(3, 5\) "
                                      r"and of record position 0 \(0, 4\)"),
            ([boxes(0), {"boxes": np.ones(4, np.float32)}], r"record position 1 has shape "
                                                            r"\(4,\) and of record position 0"),
            ([boxes(0), boxes(9, 5), boxes(1), boxes(2)], r"record position 1 has shape "
                                                          r"\(9, 5\) and of record position 0")):
        with pytest.raises(jl.CollateError, match=said):
            first(records, length=8)
    batch = first([{"boxes": np.zeros(0)}, boxes(2), {"boxes": np.zeros((0, 0))}, boxes(0)])
    assert batch["boxes"].shape == (4, 2, 4) and batch["boxes_length"].tolist() == [0, 2, 0, 0]
    for empty in (np.zeros((0, 0), np.float32), np.zeros(0, np.float32)):  # (none has rows: the
        batch = first([boxes(0), {"boxes": empty}])  # shape given was not written back)
        assert batch["boxes"].shape == (2, 0, 4) and batch["boxes_length"].tolist() == [0, 0]


def test_records_that_differ_past_the_first_axis_are_not_told_to_take_a_pad():
    images = [{"image": np.zeros((4, 5, 3), np.uint8)}, {"image": np.zeros((4, 6, 3), np.uint8)}]
    with pytest.raises(jl.CollateError, match=r"one shape in a Map: resize, crop or pad it "
                                              r"there \(a Pad pads the first axis only") as e:
        next(iter(jl.DataLoader(images, batch_size=2, process_index=0, process_count=1)))
    assert "jaxloader.Pad('image')" not in str(e.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_of_only_empty_lists_has_the_dtype_given_or_its_error_names_the_pad(workers):
    # sorted by length, the empty transcripts filled a batch alone: float64 (NumPy's empty
    # list) where the others were int64, the run refused at the next batch, the remedy to cast
    # the token ids to float64; nothing gave the dtype
    records = [{"ids": []} for _ in range(4)] + [{"ids": list(range(n))} for n in (3, 5, 2, 4)]

    def batches(pad):
        with jl.DataLoader(records, batch_size=4, num_workers=workers, transforms=[pad]) as l:
            return list(l)

    got = batches(jl.Pad("ids", dtype=np.int32))
    assert [b["ids"].dtype for b in got] == [np.int32, np.int32]
    assert [unpadded(b, "ids") for b in got] == [[[]] * 4, [[0, 1, 2], [0, 1, 2, 3, 4], [0, 1],
                                                            [0, 1, 2, 3]]]
    with pytest.raises(jl.CollateError, match=r"int64 \(2-D\), where the first batch, .*, had "
                       r"float64 .* a Pad's batch whose records all held empty lists, float64 for "
                       r"NumPy: give the Pad dtype="):
        batches(jl.Pad("ids"))
    for bad, said in [([1.5], r"is float64, which dtype=int32 would change in kind"),
                      ([2**40], r"holds values int32 does not \(from 1099511627776"),
                      (np.array([1e6]), r"holds values float16 does not"),
                      ([2**53 + 1], r"holds values float64 does not"),  # (were rounded,
                      (np.array([2**64 - 1], np.uint64), r"values float64 does not")]:  # silently)
        kind = next((k for k in (np.float16, np.float64) if f"values {np.dtype(k)}" in said),
                    np.int32)
        with pytest.raises(jl.CollateError, match=said):
            next(iter(jl.DataLoader([{"ids": bad}], batch_size=1, transforms=[jl.Pad(
                "ids", dtype=kind)])))
    for kind, given in [(np.uint16, [1, 2]), (np.int8, [True, False]), (np.float32, [3, 4])]:
        batch = next(iter(jl.DataLoader([{"ids": given}], batch_size=1,
                                        transforms=[jl.Pad("ids", dtype=kind)])))
        assert batch["ids"].dtype == kind and batch["ids"].tolist() == [[1, 2] if kind is np.uint16
                                                                     else list(map(int, given))]
    with pytest.raises(jl.ConfigError, match=r"Pad\(dtype\): expected a numeric dtype for keys "
                       r"of \['ids'\], got \{'x'"):
        jl.Pad("ids", dtype={"x": np.int32})
    assert "dtype={'ids': np.int16}" in repr(jl.Pad(["ids", "a"], dtype={"ids": np.int16}))
    # a value the dtype given cannot hold, both known as the Pad is made: refused then, not at
    # the first batch (the API audit)
    with pytest.raises(jl.ConfigError, match=r"Pad: 'ids' is made int8 \(dtype=\), which cannot "
                                             r"hold value=300 \(it would be 44\)"):
        jl.Pad("ids", value=300, dtype=np.int8)
    assert repr(jl.Pad(["a", "b"], dtype={"b": np.int8, "a": "M8[ns]"})).endswith(
        "dtype={'a': np.dtype('<M8[ns]'), 'b': np.int8})")  # (the keys' order; valid Python)


def test_ragged_lists_without_a_pad_are_told_to_take_one():
    for key in ("t", "it's"):
        with pytest.raises(jl.CollateError, match=r"records differ in structure.*pad the lists "
                           rf"to the batch's longest with jaxloader.Pad\({key!r}\)"):
            next(iter(jl.DataLoader([{key: [1, 2]}, {key: [3]}], batch_size=2)))
    for records in ([{"text": {"ids": [1, 2]}}, {"text": {"ids": [3]}}], [([1, 2],), ([3],)]):
        with pytest.raises(jl.CollateError, match=r"records differ in structure") as said:
            next(iter(jl.DataLoader(records, batch_size=2)))  # (not a key a Pad pads)
        assert "jaxloader.Pad(" not in str(said.value) and "move them to a key of the " \
            "record, which jaxloader.Pad pads" in str(said.value)
    pairs = [{"r": [np.arange(4), np.arange(2)]}, {"r": [np.arange(3), np.arange(1)]}]
    with pytest.raises(jl.CollateError, match=r"leaf \['r'\]\[0\].*a Pad pads a record's "
                                              r"top-level keys: return this leaf under a key"):
        next(iter(jl.DataLoader(pairs, batch_size=2)))  # (not Pad('<key>'), the DPO audit)


def test_a_configs_list_and_mappings_are_taken_and_a_length_of_0_is_refused():
    # OmegaConf's ListConfig and DictConfig (a Sequence, a Mapping, neither a list nor a dict)
    # were refused as "expected a key ... or a list of them, got ['ids', 'labels']"; length=0
    # was taken, then refused at the first batch (the config audit)
    import collections
    import types

    records = [{"ids": np.arange(n), "labels": np.arange(n)} for n in (2, 5, 3)]
    plain = jl.Pad(["ids", "labels"], value={"ids": 0, "labels": -100}, length={"ids": 8,
                                                                                "labels": 8})
    config = jl.Pad(collections.UserList(["ids", "labels"]),
                    value=types.MappingProxyType({"ids": 0, "labels": -100}),
                    length=types.MappingProxyType({"ids": 8, "labels": 8}))
    assert repr(config) == repr(plain)
    got = next(iter(jl.DataLoader(records, batch_size=3, transforms=[config])))
    assert got["labels"].tolist()[0] == [0, 1] + [-100] * 6
    with pytest.raises(jl.ConfigError, match=r"Pad\(length\) of 'ids': expected an int in "
                                             r"\[1, 2147483647\], got 0"):
        jl.Pad("ids", length=0)
    for huge in (2**31, __import__("sys").maxsize):  # (maxsize: NumPy's bare error at a batch)
        with pytest.raises(jl.ConfigError, match=rf"got {huge}; .* an int32 as its lengths"):
            jl.Pad("ids", length=huge)
    with pytest.raises(jl.ConfigError, match=r"got 'None'; a YAML file's None is null"):
        jl.Pad("ids", length_suffix="None")  # (a key 'idsNone' made)


def test_records_of_other_dtypes_are_refused_not_cast_to_the_first():
    # (int32 beside int64 made every record int32: 2**40 became 0, with only NumPy's warning;
    # the other order made the batch float64)
    records = [{"a": np.array([1, 2, 3], np.int32)}, {"a": np.array([2**40], np.int64)}]
    with pytest.raises(jl.CollateError, match=r"'a' of record position 0 is int32 and of record "
                       r"position 1 int64; give every record one dtype"):
        next(iter(jl.DataLoader(records, batch_size=2, transforms=[jl.Pad("a")])))
    with pytest.raises(jl.CollateError, match=r"cannot hold value=18446744073709551616"):
        next(iter(jl.DataLoader([{"a": [1]}, {"a": [1, 2]}], batch_size=2,
                                transforms=[jl.Pad("a", value=2**64)])))


_STARTS: list[int] = []


def test_a_stream_pads_without_reading_its_shards_again():
    # Each record's name (for an error) was made as the batch was padded: a stream's name
    # reads its shard again up to the record, 531 ms a batch of 64 here (0.55 now).
    def records(shard):
        _STARTS.append(shard)
        for i in range(1000):
            yield {"ids": np.arange(i % 7 + 1)}

    stream = jl.Stream.from_generator(records, shards=1)
    with jl.StreamLoader(stream, batch_size=16, transforms=[jl.Pad("ids")]) as loader:
        it = iter(loader)
        for _ in range(5):
            next(it)
    assert _STARTS == [0]


def test_each_key_may_have_its_own_value_and_times_pad_with_not_a_time():
    # (datetime64 leaves could not be padded: a NaT was refused as "not a number" and 0 as a
    # value the dtype cannot hold; one Pad took one value, so NaN for features beside -1 for
    # integer ids could not be said)
    when = np.array(["2020-01-01T00:00", "2020-01-01T00:15", "2020-01-01T00:30"], "datetime64[s]")
    records = [{"t": when[:n], "x": np.ones(n), "ids": np.arange(n)} for n in (3, 1)]
    pad = jl.Pad(["t", "x", "ids"], value={"t": np.datetime64("NaT", "s"), "x": np.nan, "ids": -1})
    for workers in (0, 2):
        with jl.DataLoader(records, batch_size=2, transforms=[pad], num_workers=workers) as loader:
            batch = next(iter(loader))
        assert batch["t"].dtype == when.dtype and batch["t"][0].tolist() == when.tolist()
        assert np.isnat(batch["t"][1, 1:]).all() and batch["t"][1, 0] == when[0]
        assert np.isnan(batch["x"][1, 1:]).all() and batch["ids"][1].tolist() == [0, -1, -1]
        assert batch["t_length"].tolist() == [3, 1]
    with pytest.raises(jl.CollateError, match=r"'t' is datetime64\[s\], which cannot hold "
                       r"value=0 .* pass np.datetime64\('NaT', 's'\), for that key alone: "
                       r"value=\{'t': \.\.\., \.\.\.\}"):
        next(iter(jl.DataLoader(records, batch_size=2, transforms=[jl.Pad(["x", "t"])])))
    reordered = {"ids": -1, "x": np.nan, "t": np.datetime64("NaT", "s")}
    assert pad.settings == jl.Pad(["t", "x", "ids"], value=reordered).settings  # (a state's
    # record of it: not the dict's order)
    with pytest.raises(jl.ConfigError, match=r"a dict gives the value of each key of \['t', "
                       r"'x'\], got one for \['t'\]"):
        jl.Pad(["t", "x"], value={"t": np.datetime64("NaT", "s")})


def test_a_time_dtype_that_cuts_the_records_times_is_refused_and_one_that_holds_them_kept():
    # (the sources audit) Pad(dtype="M8[s]") over milliseconds failed with NumPy's bare
    # UFuncTypeError ('absolute'), and dtype="m8[s]" cut 1500 ms to 1 s without a word
    stamps = [{"t": np.array(["2020-01-01T00:00:00.500"], "M8[ms]")},
              {"t": np.array(["2020-01-01T00:00:01", "2020-01-01T00:00:02"], "M8[ms]")}]
    spans = [{"d": np.array([1500], "m8[ms]")}, {"d": np.array([2000, 3000], "m8[ms]")}]
    for records, key, unit in ((stamps, "t", "M8"), (spans, "d", "m8")):
        nat = np.datetime64("NaT", "s") if unit == "M8" else np.timedelta64("NaT", "s")
        with pytest.raises(jl.CollateError, match=rf"record position 0's '{key}' holds values "
                                                  rf"{'datetime' if unit == 'M8' else 'timedelta'}"
                                                  r"64\[s\] does not"):
            next(iter(jl.DataLoader(records, batch_size=2, transforms=[
                jl.Pad(key, value=nat, dtype=f"{unit}[s]")])))
        finer = next(iter(jl.DataLoader(records, batch_size=2, transforms=[
            jl.Pad(key, value=nat, dtype=f"{unit}[us]")])))[key]
        assert finer.dtype == np.dtype(f"{unit}[us]") and np.isnat(finer[0, 1])
        assert finer[0, 0] == records[0][key][0] and finer[1].tolist() == records[1][key].tolist()
    far = [{"t": np.array(["3000-01-01"], "M8[D]")}, {"t": np.array(["2020-01-01"], "M8[D]")}]
    with pytest.raises(jl.CollateError, match=r"holds values datetime64\[ns\] does not"):
        next(iter(jl.DataLoader(far, batch_size=2, transforms=[  # (NumPy 2.5: its bare
            jl.Pad("t", value=np.datetime64("NaT", "ns"), dtype="M8[ns]")])))  # OverflowError)
    with pytest.raises(jl.ConfigError, match=r"'t' of sequence 0 is datetime64\[ms\] and holds "
                                             r"values datetime64\[s\] does not .*a finer unit"):
        jl.RaggedSource.from_sequences({"t": [stamps[0]["t"]]}, dtype="M8[s]")


def test_ml_dtypes_numbers_are_a_pads_dtype():
    # Pad(dtype=ml_dtypes.bfloat16) was refused as "not numeric" (NumPy's kind for it is V,
    # raw bytes), and two float8 Pads had one repr, a state's settings (the diffusion audit)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    records = [{"z": np.ones(n, np.float32)} for n in (2, 3)]
    pad = jl.Pad("z", value=-1.5, dtype=ml_dtypes.bfloat16)
    batch = next(iter(jl.DataLoader(records, batch_size=2, transforms=[pad])))
    assert batch["z"].dtype == ml_dtypes.bfloat16
    assert batch["z"].astype(np.float32).tolist() == [[1, 1, -1.5], [1, 1, 1]]
    assert "dtype=ml_dtypes.bfloat16" in repr(pad)
    assert repr(jl.Pad("z", dtype=ml_dtypes.float8_e4m3fn)) != repr(
        jl.Pad("z", dtype=ml_dtypes.float8_e5m2))
    with pytest.raises(jl.ConfigError, match=r"expected a numeric dtype"):
        jl.Pad("z", dtype=np.dtype("V2"))  # (raw bytes stay refused)
    from jaxloader.base.columns import device_dtype_problem  # (np.save's bfloat16: |V2)

    assert "x.view(ml_dtypes.bfloat16)" in device_dtype_problem(np.dtype("V2"))
    if np.dtype(np.longdouble).itemsize > 8:  # (placed under sharding=, a longdouble was
        for kind, cast in (("f", "float64"), ("c", "complex128")):  # told to "divide evenly")
            said = device_dtype_problem(np.dtype(f"{kind}{2 * np.dtype(np.longdouble).itemsize}"
                                                 if kind == "c" else np.longdouble))
            assert "extended precision (np.longdouble)" in said and cast in said, said


def test_a_pad_value_or_dtype_that_overflows_a_float_is_refused_not_made_inf_or_nan():
    # (-1e9, the attention mask's pad, became -inf in float16 as NumPy 2 casts the value
    # before it compares; 1e6 became NaN under Pad(dtype=float8_e4m3fn), which has no inf;
    # a pad value of ml_dtypes' own type was "not a number"; the dtypes audit)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    records = [{"x": np.ones(n, np.float16)} for n in (2, 3)]
    with pytest.raises(jl.CollateError, match=r"float16, which cannot hold value=-1000000000.0 "
                       r"\(it would be .*-inf.*\); pass one it holds \(float16 from -65504.0"):
        next(iter(jl.DataLoader(records, batch_size=2, transforms=[jl.Pad("x", value=-1e9)])))
    batch = next(iter(jl.DataLoader(records, batch_size=2, transforms=[jl.Pad(
        "x", value=-65504.0)])))  # (what the message says: held)
    assert batch["x"][0].tolist() == [1, 1, -65504]
    assert next(iter(jl.DataLoader(records, batch_size=2, transforms=[jl.Pad(
        "x", value=float("-inf"))])))["x"][0].tolist() == [1, 1, float("-inf")]  # (asked for)
    big = [{"x": np.full(n, 1e6, np.float32)} for n in (2, 3)]
    with pytest.raises(jl.CollateError, match=r"holds values float8_e4m3fn does not"):
        next(iter(jl.DataLoader(big, batch_size=2, transforms=[jl.Pad(
            "x", dtype=ml_dtypes.float8_e4m3fn)])))
    own = [{"x": np.ones(n, ml_dtypes.bfloat16)} for n in (2, 3)]
    batch = next(iter(jl.DataLoader(own, batch_size=2, transforms=[jl.Pad(
        "x", value=ml_dtypes.bfloat16(0.5))])))
    assert batch["x"].dtype == ml_dtypes.bfloat16 and batch["x"][0, 2] == 0.5
    weighted = [{"t": np.arange(n, dtype=np.int32), "w": np.ones(n, np.float32)} for n in (2, 3)]
    packed = jl.PackedSource(weighted, ["t", "w"], 4, value={"t": 0, "w": ml_dtypes.bfloat16(.5)})
    rows = [packed[i]["w"].tolist() for i in range(len(packed))]
    assert sorted(map(sorted, rows)) == [[0.5, 0.5, 1, 1], [0.5, 1, 1, 1]], rows


def test_a_pads_cast_that_wraps_an_int_or_saturates_a_float_is_refused():
    # (-1 into uint8 wrapped to 255 and back unseen; float4_e2m1fn, which has neither inf nor
    # NaN, made NaN -0 and 1e6 6; a np.float64(0.1) pad value into float32 was refused, its
    # remedy a range that held it; the second review)
    ml_dtypes = pytest.importorskip("ml_dtypes")

    def padded(values, **kw):
        records = [{"x": np.asarray(v)} for v in values]
        return next(iter(jl.DataLoader(records, batch_size=2, transforms=[jl.Pad("x", **kw)])))

    for given, kind in [(np.array([-1, 5], np.int8), np.uint8),
                        (np.array([200, 5], np.uint8), np.int8),
                        (np.array([1, -7], ml_dtypes.int4), ml_dtypes.uint4),
                        (np.array([1.0, np.nan], np.float32), ml_dtypes.float4_e2m1fn),
                        (np.array([1.0, 1e6], np.float32), ml_dtypes.float4_e2m1fn),
                        (np.array([1.0, 7.0], np.float32), ml_dtypes.float4_e2m1fn)]:  # (8:
        # clamped to 6, not rounded; the fourth review)
        with pytest.raises(jl.CollateError, match=r"holds values \w+ does not"):
            padded([given, given[:1]], dtype=kind)
    assert padded([np.array([1, 5], np.int8), np.array([2], np.int8)],
                  dtype=np.uint8)["x"].tolist() == [[1, 5], [2, 0]]
    assert np.isnan(padded([np.array([1.0, np.nan], np.float32), np.array([2.0], np.float32)],
                           dtype=np.float16)["x"][0, 1])  # (NaN kept, not refused)
    batch = padded([np.ones(2, np.float32), np.ones(1, np.float32)], value=np.float64(0.1))
    assert batch["x"].dtype == np.float32 and batch["x"][1, 1] == np.float32(0.1)
    for given, kind, made in [(65510.0, np.float16, 65504.0),  # (rounding to the largest:
                              (450.0, ml_dtypes.float8_e4m3fn, 448.0),  # taken, as 0.1 is;
                              (6.9, ml_dtypes.float4_e2m1fn, 6.0)]:  # the third review)
        batch = padded([np.array([given], np.float32), np.array([1.0], np.float32)], dtype=kind)
        assert float(batch["x"][0, 0]) == made


def test_each_key_may_have_its_own_length_a_graphs_node_and_edge_budgets():
    # one length for all keys padded a graph's nodes to its edge budget, and several hosts
    # (which need a length) could not give each its own (the graph audit)
    graphs = [{"nodes": np.ones((n, 4), np.float32), "edges": np.zeros((2 * n, 2), np.int32)}
              for n in (3, 5, 2, 4)]
    pad = jl.Pad(["nodes", "edges"], length={"edges": 12, "nodes": 6})
    assert repr(pad) == ("Pad(['nodes', 'edges'], value=0, length={'nodes': 6, 'edges': 12}, "
                         "length_suffix='_length')")
    for process in (0, 1):
        with jl.DataLoader(graphs, batch_size=2, transforms=[pad], process_index=process,
                           process_count=2) as loader:
            batch = next(iter(loader))
        assert batch["nodes"].shape == (2, 6, 4) and batch["edges"].shape == (2, 12, 2)
    mixed = jl.Pad(["nodes", "edges"], multiple_of={"nodes": 4, "edges": 1},
                   length={"nodes": None, "edges": 10})
    batch = next(iter(jl.DataLoader(graphs, batch_size=2, transforms=[mixed])))
    assert batch["nodes"].shape == (2, 8, 4) and batch["edges"].shape == (2, 10, 2)
    rounded = jl.Pad(["nodes", "edges"], multiple_of=4, length={"nodes": None, "edges": 10})
    batch = next(iter(jl.DataLoader(graphs, batch_size=2, transforms=[rounded])))
    assert batch["nodes"].shape == (2, 8, 4) and batch["edges"].shape == (2, 10, 2)
    with pytest.raises(jl.ConfigError, match=r"a dict gives the length of each key of "
                                             r"\['nodes', 'edges'\], got one for \['nodes'\]"):
        jl.Pad(["nodes", "edges"], length={"nodes": 6})
    with pytest.raises(jl.ConfigError, match=r"each of the 2 processes pads"):
        jl.DataLoader(graphs, batch_size=2, transforms=[mixed], process_index=0,
                      process_count=2)
