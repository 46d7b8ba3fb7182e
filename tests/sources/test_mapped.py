"""MapSource and Stream.map: a component transformed before it is mixed, keeping what its source
can do (read-local blocks, packing lengths, files, the state)."""

from __future__ import annotations

import functools
import json
import pickle
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sources.parquet import ParquetSource
from resume_harness import check_resume, take

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.timeout(180)


def _wide(directory, rows=160, group=16):
    """A Parquet file of an id and a float64[4] vector (arrays beside it are float32)."""
    ids = np.arange(rows, dtype=np.int64)
    vectors = (ids[:, None] + np.arange(4) / 10).astype(np.float64)
    path = str(directory / "wide.parquet")
    pq.write_table(pa.table({"id": ids, "vector": pa.array(list(vectors),
                                                           type=pa.list_(pa.float64(), 4))}),
                   path, row_group_size=group)
    return path


def _as_float32(record):
    return {"id": record["id"], "vector": record["vector"].astype(np.float32)}


def _columns_as_float32(batch):
    return {"id": batch["id"], "vector": batch["vector"].astype(np.float32)}


def _arrays():
    ids = np.arange(1000, 1100, dtype=np.int64)
    return jl.ArraySource({"id": ids, "vector": (ids[:, None] * 1.0 + np.arange(4)).astype(
        np.float32)})


def _mixed(path, batched=False):
    cast = jl.MapSource(jl.ParquetSource(path), _columns_as_float32 if batched else _as_float32,
                        batched=batched)
    return jl.mix([cast, _arrays()], [0.6, 0.4])


def test_a_float64_parquet_component_is_refused_until_its_own_map_casts_it(tmp_path):
    path = _wide(tmp_path)
    with pytest.raises(jl.JaxloaderError, match=r"float64\(4,\) in mix\(sources\)\[0\], "
                                                r"float32\(4,\) in mix\(sources\)\[1\]; "
                                                r".*jl.MapSource\(part, fn\)"):
        with jl.DataLoader(jl.mix([jl.ParquetSource(path), _arrays()], [0.6, 0.4]),
                           batch_size=8, shuffle=True, process_index=0, process_count=1) as loader:
            take(loader, 3)
    with jl.DataLoader(_mixed(path), batch_size=8, shuffle=True, process_index=0,
                       process_count=1) as loader:
        batch = next(iter(loader))
    assert batch["vector"].dtype == np.float32 and batch["vector"].shape == (8, 4)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("k", [7])
def test_a_mapped_parquet_component_mixed_resumes_into_another_worker_count(tmp_path, k,
                                                                             batched):
    path = _wide(tmp_path)

    def make(num_workers):
        return lambda: jl.DataLoader(_mixed(path, batched), batch_size=8,
                                     shuffle=jl.LocalShuffle(window=2), seed=2,
                                     num_workers=num_workers, num_epochs=None,
                                     process_index=0, process_count=1)

    check_resume(make(2), total=k + 8, k=k, make_restored=make(0))
    check_resume(make(0), total=k + 8, k=k, make_restored=make(2))


def test_a_map_keeps_its_sources_row_groups_read_locally(tmp_path, monkeypatch):
    path = _wide(tmp_path)
    read = []
    real = ParquetSource._read
    monkeypatch.setattr(ParquetSource, "_read", lambda self, g: read.append(g) or real(self, g))

    def decodes(source):
        read.clear()
        with jl.DataLoader(source, batch_size=8, shuffle=jl.LocalShuffle(window=2), seed=2,
                           num_epochs=1, process_index=0, process_count=1) as loader:
            take(loader, len(loader))
        return list(read)

    plain = decodes(jl.ParquetSource(path))
    mapped = decodes(jl.MapSource(jl.ParquetSource(path), _as_float32))
    assert len(plain) == 10 and sorted(mapped) == sorted(plain)  # each row group once


def test_packing_a_mapped_source_reads_its_lengths_without_a_pass(tmp_path):
    path = str(tmp_path / "tokens.parquet")
    pq.write_table(pa.table({"tokens": [list(range(n % 7 + 1)) for n in range(60)]}), path,
                   row_group_size=20)
    calls = []

    def shifted(record):
        calls.append(1)
        return {"tokens": record["tokens"] + 1}

    packed = jl.PackedSource(jl.MapSource(jl.ParquetSource(path), shifted), "tokens", 16)
    assert not calls  # the lengths came from the Parquet offsets, no record was mapped
    rows = packed.__getitems__(np.arange(len(packed)))
    assert rows["tokens"].max() == 7 and calls  # the rows through the map



def _cut(record):
    return {"tokens": record["tokens"][:3]}


@pytest.mark.parametrize("kind", ["lengths changed", "a source without lengths"])
def test_packing_a_mapped_source_without_lengths_to_keep_reads_the_mapped_records(kind):
    """Where the map changes the lengths (``lengths_kept=False``) or its source has none, the
    lengths are read from the mapped records once (this raised, naming a remedy it blocked)."""
    docs = [{"tokens": np.arange(n % 7 + 1, dtype=np.int32)} for n in range(60)]
    if kind == "lengths changed":
        mapped = jl.MapSource(jl.RaggedSource.from_sequences(
            {"tokens": [d["tokens"] for d in docs]}), _cut, lengths_kept=False)
    else:
        mapped = jl.MapSource(docs, _cut)
    assert mapped.lengths("tokens") is None
    packed = jl.PackedSource(mapped, "tokens", 16)
    rows = packed.__getitems__(np.arange(len(packed)))
    cut = [min(3, n % 7 + 1) for n in range(60)]
    assert int((rows["tokens_segment_ids"] > 0).sum()) == sum(cut)  # the mapped lengths packed


def test_a_state_saved_under_another_function_is_refused(tmp_path):
    path = _wide(tmp_path)

    def loader(fn):
        return jl.DataLoader(jl.MapSource(jl.ParquetSource(path), fn), batch_size=8,
                             process_index=0, process_count=1)

    with loader(_as_float32) as first:
        take(first, 2)
        state = json.loads(json.dumps(first.state_dict()))
    with loader(_as_float32) as same:
        same.load_state_dict(state)
    def shifted(k):
        return lambda r, k=k: {**r, "id": r["id"] + k}

    with loader(shifted(1)) as first:  # (another value bound as a default: restored over)
        take(first, 2)
        bound_one = json.loads(json.dumps(first.state_dict()))
    with loader(shifted(2)) as other, pytest.raises(jl.StateDictError, match="source: expected"):
        other.load_state_dict(bound_one)
    with loader(lambda r: {**r, "id": r["id"] + 1}) as other:
        # (two hashes and a remedy about the seed and batch size: it now says what differs)
        with pytest.raises(jl.StateDictError, match=r"source: expected 'map:160:.*the source is "
                                                    r"of the same kind \(map\) and size, so what "
                                                    r"differs is inside it: a function it runs"
                                                    r".*or -O differs too.*older than a change"
                                                    r".*with the jaxloader that saved it"):
            other.load_state_dict(state)
    assert [path for path, _ in jl.DataLoader(
        jl.MapSource(jl.ParquetSource(path), _as_float32), batch_size=8, process_index=0,
        process_count=1)._files] == [path]  # the map's files: named in the state


def test_a_state_saved_over_another_table_the_function_holds_is_refused():
    # the function's digest read a closure's array by its repr, which summarises a large one:
    # a lookup table changed deep inside restored, and its next batch read the new values
    from jaxloader.sources.code_digest import code_digests
    from jaxloader.sources.fingerprint import combined

    base = jl.ArraySource({"x": np.arange(8)})
    table = np.arange(10_000) * 10

    def loader(held):
        return jl.DataLoader(jl.MapSource(base, lambda r: {"x": held[r["x"]]}), batch_size=2,
                             process_index=0, process_count=1)

    with loader(table) as first:
        take(first, 1)
        state = json.loads(json.dumps(first.state_dict()))
    changed = table.copy()
    changed[5] = -1
    with loader(changed) as other, pytest.raises(jl.StateDictError, match="source: expected"):
        other.load_state_dict(state)
    with loader(table.copy()) as same:  # (the same values: restored)
        same.load_state_dict(state)
        mapped = same._source
        # a state saved before the arrays were digested restores too: as that version wrote
        # it, also for a function whose older digests differ from today's (a notebook's class)
        mapped._fn_digests = (code_digests(mapped.fn)[0], *("0" * 32,) * 5)
        before = combined("map", 8, [base], mapped._fn_digests[0], b"records")
        same.load_state_dict({**state, "source": before})
        assert next(iter(same))["x"].tolist() == [20, 30]


class _Times:
    def __init__(self, k):
        self.k, self.table = k, np.arange(2000)  # (an array it holds: digested apart)

    def apply(self, r):
        return {"x": r["x"] * self.k}


def test_a_state_saved_under_a_bound_methods_object_of_other_attributes_is_refused():
    # MapSource(source, Scale(2).apply) restored over Scale(3).apply without a word: the
    # object its code reads (self.k) was not digested, as a loader Map's is (the files audit)
    from jaxloader.sources.code_digest import code_digests
    from jaxloader.sources.fingerprint import combined

    base = jl.ArraySource({"x": np.arange(8)})

    def loader(k):
        return jl.DataLoader(jl.MapSource(base, _Times(k).apply), batch_size=2,
                             process_index=0, process_count=1)

    with loader(2) as first:
        take(first, 1)
        state = json.loads(json.dumps(first.state_dict()))
    with loader(3) as other, pytest.raises(jl.StateDictError, match="source: expected"):
        other.load_state_dict(state)
    with loader(2) as same:
        same.load_state_dict(state)
        assert next(iter(same))["x"].tolist() == [4, 6]
        mapped = same._source
        for held in [(), (mapped._arrays,)]:  # (as saved before 12-05, and before 12-07)
            before = combined("map", 8, [base], code_digests(mapped.fn)[0], b"records", *held)
            same.load_state_dict({**state, "source": before})  # (restored)


VOCABULARY = {"alpha": 1, "beta": 2, "gamma": 3}


def _tokens(record):  # (reads a module's vocabulary: its code and closure do not show it)
    return {"t": np.array([VOCABULARY[w] for w in record["words"]], np.int32)}


def test_a_state_saved_over_other_records_a_function_makes_from_a_modules_value_is_refused(
        monkeypatch):
    # a tokenizer's vocabulary built at import from set(words), whose order differs in each
    # process: a MapSource's state restored in a new process over other token ids, without a
    # word (its fingerprint named the function by its code and closure; the journey audit)
    words = [{"words": ["alpha", "beta", "gamma"][i % 3:] + ["gamma"] * (i % 3)}
             for i in range(9)]

    def loader():
        return jl.DataLoader(jl.MapSource(words, _tokens), batch_size=3, shuffle=True,
                             process_index=0, process_count=1)

    with loader() as first:
        take(first, 1)
        state = json.loads(json.dumps(first.state_dict()))
    monkeypatch.setitem(VOCABULARY, "alpha", 7)  # (another process's order)
    with loader() as other, pytest.raises(jl.StateDictError, match=r"a MapSource's records as "
                                                                   r"mapped: what its function "
                                                                   r"reads beyond its code"):
        other.load_state_dict(state)
    monkeypatch.setitem(VOCABULARY, "alpha", 1)
    with loader() as same:
        same.load_state_dict(state)  # (the same records: restored)
        from jaxloader.base.abilities import RECORDS_AS_BEFORE
        token = RECORDS_AS_BEFORE.set(True)
        try:  # (a state saved before the records were hashed: restored too)
            before = same._source.fingerprint
        finally:
            RECORDS_AS_BEFORE.reset(token)
        assert before != state["source"]
        same.load_state_dict({**state, "source": before})


def test_a_function_that_fills_a_memo_it_holds_restores_in_a_fresh_process():
    # def norm(r, _cache={}): the digest read the memo as it was at state_dict(), filled by
    # the batches made in this process, and a fresh process's empty one: refused there
    def fresh():  # (a new process's function: its own empty memo)
        def norm(r, _cache={}):
            _cache.setdefault(int(r["x"]), 1)
            return {"x": r["x"] * 2}
        return norm

    def loader():
        return jl.DataLoader(jl.MapSource(jl.ArraySource({"x": np.arange(16)}), fresh()),
                             batch_size=4, process_index=0, process_count=1)

    with loader() as first, loader() as again:
        take(first, 2)
        again.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert next(iter(again))["x"].tolist() == [16, 18, 20, 22]
    with jl.DataLoader(jl.ArraySource({"x": np.arange(16)}), batch_size=4, process_index=0,
                       process_count=1, transforms=[jl.Map(fresh())]) as first:
        take(first, 2)
        state = first.state_dict()
    with jl.DataLoader(jl.ArraySource({"x": np.arange(16)}), batch_size=4, process_index=0,
                       process_count=1, transforms=[jl.Map(fresh())]) as again:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (the transform as made: not warned of)
            again.load_state_dict(state)


class _Scale:  # an object with Python's own repr: <_Scale object at 0x...>, another each run
    def __init__(self, k):
        self.k = k


def _scaled_by(scale):
    return lambda r: {"x": np.float32(r["value"]) * scale.k}


def test_a_function_closing_over_an_object_is_the_same_function_in_another_process():
    """The state names a mapped stream's shards by their function's code digest, which held the
    closure's repr: its memory address, another in the process a run is restored in, where the
    state was refused ("state does not fit this stream loader")."""
    def names(scale):
        return jl.Stream.from_generator(_records, 2).map(_scaled_by(scale)).describe()["shards"]

    one, alike = _Scale(2), _Scale(2)  # both alive: as the same object in another process
    assert names(one) == names(alike)
    assert names(one) != names(_Scale(3))  # what the object holds still counts


def _records(shard):
    for k in range(shard, 60, 2):
        yield {"value": np.float64(k), "name": f"r{k}"}


def _renamed(record):
    return {"x": np.float32(record["value"])}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mapped_stream_mixes_and_resumes(workers):
    def make(num_workers=workers):
        left = jl.Stream.from_generator(_records, shards=2).map(_renamed)
        right = jl.Stream.from_generator(lambda s: ({"x": np.float32(1000 + s)}
                                                    for _ in range(30)), shards=2)
        return lambda: jl.StreamLoader(jl.mix([left, right], [0.5, 0.5]), batch_size=6,
                                       num_workers=num_workers, readers_per_process=2,
                                       process_index=0, process_count=1)

    with make()() as loader:
        batch = next(iter(loader))
    assert batch["x"].dtype == np.float32 and batch["x"].shape == (6,)
    check_resume(make(), total=8, k=3, make_restored=make(0 if workers else 2))


def test_a_batched_map_over_a_source_that_reads_records_is_refused_naming_it(tmp_path):
    # A Parquet file with a column of lists of other lengths reads a list of records: a
    # batched function got the list, and failed inside ('list' object is not a mapping)
    path = str(tmp_path / "docs.parquet")
    pq.write_table(pa.table({"tokens": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int32())),
                             "value": [1.0, 2.0, 3.0]}), path)
    cast = jl.MapSource(ParquetSource(path), lambda rows: {**rows, "value": rows["value"]
                                                           .astype(np.float32)}, batched=True)
    for read in (lambda: cast.__getitems__(np.array([0, 2])), lambda: cast[1]):
        with pytest.raises(jl.ConfigError, match=r"MapSource\(batched=True\): the source "
                           r"\(ParquetSource\) reads a list where a batch of columns was "
                           r"expected: records.*batched=False"):
            read()
    assert float(jl.MapSource(ParquetSource(path), lambda r: {**r, "value": np.float32(
        r["value"])})[2]["value"]) == 3.0  # (its records one by one)
    with pytest.raises(jl.ConfigError, match=r"a MapSource of records \(batched=False\)"):
        jl.MapSource(jl.MapSource(_arrays(), dict), _columns_as_float32, batched=True)


def test_a_batched_map_of_tuples_or_nested_dicts_gives_one_record_by_index():
    # source[i] took the batch's output as a flat dict: a tuple raised AttributeError, a
    # nested dict a KeyError, where the loader read both
    pairs = jl.MapSource(jl.ArraySource((np.arange(10), np.arange(10) * 2)),
                         lambda b: (b[0] + 1, b[1]), batched=True)
    assert pairs[3] == (4, 6)
    nested = jl.MapSource(jl.ArraySource({"a": np.arange(10)}),
                          lambda b: {"n": {"x": b["a"] + 1}, "a": b["a"]}, batched=True)
    assert nested[3] == {"n": {"x": 4}, "a": 3}
    loader = jl.DataLoader(nested, batch_size=10, process_index=0, process_count=1)
    assert next(iter(loader))["n"]["x"][3] == nested[3]["n"]["x"]


def _draws(record):
    return {**record, "noise": np.random.random()}  # (not the loader's numbers)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_function_that_draws_from_the_global_state_as_it_maps_is_warned_of(workers):
    # a MapSource's function drawing from np.random gave other batches with 0 and 2 workers
    # and after a restore, without a word: its fingerprint is the function's code, so no
    # state reads its records twice, and no watch saw its calls, as a Map's are (the vision
    # audit)
    source = jl.ArraySource({"x": np.arange(16.0)})
    for fn, warned in ((_draws, True), (lambda r: {**r, "y": r["x"] * 2}, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with jl.DataLoader(jl.MapSource(source, fn), batch_size=4, num_workers=workers,
                               process_index=0, process_count=1) as loader:
                list(loader)
                loader.state_dict()
        said = [w for w in caught if "drew from the global random state" in str(w.message)]
        assert bool(said) == warned, [str(w.message) for w in caught]
        if warned:
            assert str(said[0].message).startswith("MapSource(ArraySource(16 records")
            assert said[0].lineno == _draws.__code__.co_firstlineno
    from jaxloader.sources import mapped
    from jaxloader.sources.code_digest import code_digest

    read = jl.MapSource(source, functools.partial(_draws))

    def keep(r):  # (a keep function holding it: a kept file is named by its digest)
        return read[0]["x"] >= 0

    digest = code_digest(keep, deep=True)
    read[0]  # (its counts in its attributes changed the digest: the kept file then stale)
    assert mapped._WATCHES[id(read)][1] == [15, 1] and code_digest(keep, deep=True) == digest
    copy = pickle.loads(pickle.dumps(read))
    assert id(copy) not in mapped._WATCHES  # (counted in each process)
    gone = jl.MapSource(source, _draws)
    gone[0]
    del gone
    assert not [r for r, _ in mapped._WATCHES.values() if r() is None]  # (let go with it)

    class Tagged(jl.MapSource):  # (no hash: a weak-keyed table of them raised at every read)
        def __eq__(self, other):
            return isinstance(other, Tagged) and self.fn is other.fn

    assert next(iter(jl.DataLoader(Tagged(source, _draws), batch_size=4)))["x"].tolist() == [
        0, 1, 2, 3]


def _boom(record):
    if int(record["x"]) == 1:
        raise ValueError("bad value 1")
    return record


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_map_sources_function_that_raises_is_named_as_a_maps_is(num_workers):
    # 'source.__getitems__ raised ValueError: bad value 1', the function unnamed, where a
    # Map's error names it (the compositions audit); inside a ConcatSource too
    inner = jl.MapSource(jl.ArraySource({"x": np.arange(8)}), _boom)
    for source in (inner, jl.ConcatSource([jl.ArraySource({"x": np.arange(3)}), inner])):
        with pytest.raises((jl.RecordError, jl.WorkerError),  # (a worker's: its RecordError)
                           match=r"raised ValueError: bad value 1 \(in MapSource\(_boom\)'s "
                                 r"function\)"):
            list(jl.DataLoader(source, batch_size=4, num_workers=num_workers,
                               process_index=0, process_count=1))


def test_functions_of_other_arities_are_refused_as_the_source_or_stream_is_made():
    # MapSource, Stream.map and PackedStream(tokenize) given fn(record, rng) failed at the
    # first record, in a worker, where Map and RandomMap refuse it when made (the API audit)
    source = jl.ArraySource({"x": np.arange(4)})
    stream = jl.Stream.from_generator(lambda i: ({"t": np.arange(3)} for _ in range(2)), 1)
    two = lambda r, rng: r  # noqa: E731
    for make, label in ((lambda: jl.MapSource(source, two), r"MapSource\(fn\): it is called "
                                                              r"as fn\(record\)"),
                        (lambda: stream.map(two),
                         r"Stream.map\(fn\): it is called as fn\(record\)"),
                        (lambda: jl.PackedStream(stream, "t", 4, tokenize=two),
                         r"PackedStream\(tokenize\): it is called as tokenize\(record\)")):
        with pytest.raises(jl.ConfigError, match=label + r", but .*<lambda>\(r, rng\) cannot "
                                                         r"be; pass a function of one argument"):
            make()
    assert jl.MapSource(source, lambda r: {"y": r["x"]})[1] == {"y": 1}


def _tokenized(batch):  # a batched map returning a list of token arrays, as tokenizers do
    return {"ids": [np.arange(int(n) + 1, dtype=np.int32) for n in batch["n"]], "n": batch["n"]}


class _Columns:  # a source whose __getitems__ answers a dict of lists and one row too many
    def __init__(self, extra=0):
        self.extra = extra

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": np.float32(i)}

    def __getitems__(self, indices):
        return {"x": np.arange(len(indices) + self.extra, dtype=np.float32)}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_whose_leaves_hold_no_row_a_record_is_refused_before_record_transforms(
        num_workers):
    # (the transforms audit) with a Map or a Pad, a source's batch was split into records
    # without a check: a batched MapSource's list of token arrays became rows of other records'
    # tokens (Pad: ids [[0, 0, 0, 0], [1, 1, 1, 1], ...], lengths [4, 4, 4, 4]), a row too many
    # was dropped, where the same batch without transforms is refused
    tokens = jl.MapSource(jl.ArraySource({"n": np.arange(5, 13)}), _tokenized, batched=True)
    for source, transforms, said in (
            (tokens, [jl.Pad("ids")], r"batch leaf \['ids'\]\[0\]: expected 4 rows .* got shape "
                                      r"\(6,\); .*a list or tuple in a batch is a pytree node"),
            (_Columns(1), [jl.Map(lambda r: r)], r"batch leaf \['x'\]: expected 4 rows \(a row a "
                                                 r"record asked for\) .* got shape \(5,\)")):
        with jl.DataLoader(source, batch_size=4, num_workers=num_workers, transforms=transforms,
                           process_index=0, process_count=1) as loader, pytest.raises(
                (jl.CollateError, jl.WorkerError), match=said):
            next(iter(loader))
    with jl.DataLoader(_Columns(), batch_size=4, num_workers=num_workers, process_index=0,
                       process_count=1, transforms=[jl.Map(lambda r: {"x": r["x"] * 2})]) as fine:
        assert next(iter(fine))["x"].tolist() == [0, 2, 4, 6]
