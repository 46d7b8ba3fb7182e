"""ConcatSource: sources one after another, as one index space."""

from __future__ import annotations

import numpy as np
import pytest

import jaxloader as jl
from resume_harness import assert_same_stream, check_resume


def parts():
    x = np.arange(70, dtype=np.float32).reshape(35, 2)
    return x, [jl.ArraySource({"x": x[:10]}), jl.ArraySource({"x": x[10:11]}),
               jl.ArraySource({"x": x[11:]})]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_concatenation_reads_like_the_whole(num_workers):
    x, sources = parts()

    def loader(source):
        return jl.DataLoader(source, batch_size=4, shuffle=True, seed=2, num_workers=num_workers,
                             transforms=[jl.Map(lambda r: r)], process_index=0, process_count=1)

    with loader(jl.ConcatSource(sources)) as joined, loader(jl.ArraySource({"x": x})) as whole:
        assert_same_stream(list(joined), list(whole))


def test_index_mapping_and_resume():
    _, sources = parts()
    both = jl.ConcatSource(sources)
    assert len(both) == 35 and both.locate(np.array([9, 10, 11, 34])).tolist() == [
        [0, 9], [1, 0], [2, 0], [2, 23]]
    with pytest.raises(IndexError, match=r"index 35 out of range \[0, 35\)"):
        both[35]
    check_resume(lambda: jl.DataLoader(jl.ConcatSource(sources), batch_size=4, shuffle=True,
                                       seed=1, process_index=0, process_count=1),
                 total=12, k=5)


def test_bad_parts_are_named():
    with pytest.raises(jl.ConfigError, match="non-empty list"):
        jl.ConcatSource([])
    with pytest.raises(jl.ConfigError, match=r"sources\[1\]: source: expected at least one"):
        jl.ConcatSource([jl.ArraySource({"x": np.zeros(2)}), []])


def test_vectorised_reads_merge_the_parts_in_order():
    x, sources = parts()
    both = jl.ConcatSource(sources)
    batch = both.__getitems__(np.array([34, 0, 10, 11, 9]))
    assert batch["x"].tolist() == x[[34, 0, 10, 11, 9]].tolist()

    class Listed:  # a part that answers __getitems__ with a list of records
        def __init__(self, dtype, key="x"):
            self.dtype, self.key = dtype, key

        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {self.key: np.full(2, 100 + i, self.dtype)}

        def __getitems__(self, indices):
            return [self[i] for i in indices]

    mixed = jl.ConcatSource([sources[0], Listed(np.float32)])
    rows = mixed.__getitems__(np.array([11, 2, 10]))
    assert [r["x"][0] for r in rows] == [101, 4, 100]

    class Batched(Listed):  # a user's part (read to be known), its rows as one batch
        def __getitems__(self, indices):
            return {self.key: np.stack([self[i][self.key] for i in indices])}

    with pytest.raises(jl.CollateError, match=r"\['x'\]: the parts of a ConcatSource differ"):
        jl.ConcatSource([sources[0], Batched(np.float64)]).__getitems__(np.array([0, 11]))
    # other keys: named as keys (was "int64() in one, int64() in another"), the parts by place
    with pytest.raises(jl.CollateError, match=r"structure: dict with keys \['x'\] in sources"
                                              r"\[0\], dict with keys \['z'\] in sources\[1\]"):
        jl.ConcatSource([sources[0], Batched(np.float32, "z")]).__getitems__(np.array([0, 11]))


def test_strings_of_other_widths_or_forms_merge_and_other_differences_are_named():
    narrow = jl.ArraySource({"t": np.asarray(["a", "bb", "ccc"])})  # <U3
    wide = jl.ArraySource({"t": np.asarray(["ddddd", "e"])})  # <U5

    class Python:  # a part whose strings are Python ones, batched (a Parquet column's form)
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"t": ["f", "gggggggg"][i]}

        def __getitems__(self, indices):
            column = np.empty(len(indices), object)
            column[:] = [self[int(i)]["t"] for i in indices]
            return {"t": column}

    batch = jl.ConcatSource([narrow, wide]).__getitems__(np.array([3, 0, 2, 4]))["t"]
    assert batch.dtype == np.dtype("<U5") and batch.tolist() == ["ddddd", "a", "ccc", "e"]
    batch = jl.ConcatSource([narrow, Python(), wide]).__getitems__(np.array([4, 0, 3, 5]))["t"]
    assert batch.dtype == object and batch.tolist() == ["gggggggg", "a", "f", "ddddd"]
    assert all(type(t) is str for t in batch)
    alone = jl.ConcatSource([narrow, wide]).__getitems__(np.array([2, 1]))["t"]
    assert alone.dtype == np.dtype("<U3")  # one part's rows: that part's own form
    for other in ({"t": np.asarray([b"x", b"y"])}, {"t": np.arange(2)},
                  {"t": np.asarray([["x", "y"], ["z", "w"]])}):
        with pytest.raises(jl.ConfigError, match=r"\['t'\]: the parts of a ConcatSource "
                                                 r"differ .*: <U3\(\) in sources\[0\], "):
            jl.DataLoader(jl.ConcatSource([narrow, jl.ArraySource(other)]), batch_size=2)


def test_parts_of_python_str_and_python_bytes_are_named_not_batched_together():
    # (the sources audit) a Parquet string part beside a binary one (both object columns of
    # Python values) batched one leaf of str and bytes mixed, without a word

    class Objects:  # a part whose values are Python objects, batched (a Parquet column's form)
        def __init__(self, values):
            self.values = values

        def __len__(self):
            return len(self.values)

        def __getitem__(self, i):
            return {"t": self.values[i]}

        def __getitems__(self, indices):
            column = np.empty(len(indices), object)
            column[:] = [self.values[int(i)] for i in indices]
            return {"t": column}

    text, raw = Objects(["a", "b", "c"]), Objects([b"d", b"e", b"f"])
    for rows in ([0, 1, 3, 4], [5, 0]):  # (a part's rows first, and the other's)
        with pytest.raises(jl.CollateError, match=r"\['t'\]: the parts of a ConcatSource differ"
                                                  r" .*: object\(\) of (str|bytes) in sources\["
                                                  r"\d\], object\(\) of (bytes|str) in "):
            jl.ConcatSource([text, raw]).__getitems__(np.array(rows))
    both = jl.ConcatSource([text, Objects(["g", "h"])]).__getitems__(np.array([0, 3]))["t"]
    assert both.tolist() == ["a", "g"]
    nulls = jl.ConcatSource([Objects([None, "a", "b"]), Objects(["c", "d", None])])
    for rows, want in (([0, 3], [None, "c"]), ([1, 5], ["a", None]), ([0, 5], [None, None])):
        assert nulls.__getitems__(np.array(rows))["t"].tolist() == want  # (a null: any kind's)


def test_parts_are_asked_for_their_rows_ascending_over_parts_and_in_order_alone():
    # a file source sorts what it is asked for by row group and puts the rows back: over
    # several parts each is asked in ascending order (nothing to put back); one part alone
    # is asked in the batch's order and its answer returned as it is
    x, sources = parts()
    asked = []

    class Spy:
        def __init__(self, source):
            self.source = source

        def __len__(self):
            return len(self.source)

        def __getitem__(self, i):
            return self.source[i]

        def __getitems__(self, indices):
            asked.append(np.asarray(indices).tolist())
            return self.source.__getitems__(indices)

    both = jl.ConcatSource([Spy(s) for s in sources])
    wanted = np.array([30, 3, 12, 0, 10, 9, 11, 20])
    assert both.__getitems__(wanted)["x"].tolist() == x[wanted].tolist()
    assert asked == [[0, 3, 9], [0], [0, 1, 9, 19]]
    asked.clear()
    assert both.__getitems__(np.array([9, 2, 5]))["x"].tolist() == x[[9, 2, 5]].tolist()
    assert both.__getitems__(np.array([], np.int64))["x"].shape == (0, 2)
    assert asked == [[9, 2, 5], []]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_without_transforms_gathers_alike_parts_straight_into_the_batch(num_workers):
    x, sources = parts()
    y = np.arange(35, dtype=np.int16)
    nested = [jl.ArraySource({"x": s.arrays[0], "y": (y[a:b],)})
              for s, (a, b) in zip(sources, ((0, 10), (10, 11), (11, 35)))]
    assert jl.ConcatSource(nested).alike_arrays

    def loader(source):
        return jl.DataLoader(source, batch_size=4, shuffle=True, seed=2, last_batch="pad",
                             num_workers=num_workers, process_index=0, process_count=1)

    with loader(jl.ConcatSource(nested)) as joined, loader(
            jl.ArraySource({"x": x, "y": (y,)})) as whole:
        assert_same_stream(list(joined), list(whole))


def test_parts_that_differ_are_refused_as_the_loader_is_made_not_at_a_batch_of_both():
    # Read in order, batches of 10 over parts of 100 rows of 3 floats and of 4: ten batches of
    # one shape, then ten of the other, without a word; a batch of 7 (across both) was refused
    # at step 14, which may be hours into a run (a mixture's components were checked as made)
    a = jl.ArraySource({"x": np.zeros((100, 3), np.float32)})
    for other, said in ((np.zeros((100, 4), np.float32), r"float32\(3,\) in sources\[0\], "
                         r"float32\(4,\) in sources\[1\]; .* pad or crop them"),
                        (np.zeros((100, 3)), r"float32\(3,\) in 'a', float64\(3,\) in 'b'; "
                                             r".*cast with a jl.MapSource\(part, fn\)")):
        names = ["a", "b"] if other.dtype == np.float64 else None
        both = jl.ConcatSource([a, jl.ArraySource({"x": other})], names=names)
        with pytest.raises(jl.ConfigError, match=r"batch leaf \['x'\]: the parts of a "
                                                 r"ConcatSource differ .*" + said):
            jl.DataLoader(both, batch_size=10, shuffle=False)
        if names is None:  # (one a batch: never read together; images of other sizes, records
            # that are whole batches; another dtype is refused as its first batch comes)
            assert len(list(jl.DataLoader(both, batch_size=1, num_epochs=1))) == 200
    with pytest.raises(jl.ConfigError, match=r"dict with keys \['x'\] in sources\[0\], dict "
                                             r"with keys \['z'\] in sources\[1\]"):
        jl.DataLoader(jl.FilteredSource(jl.ConcatSource(
            [a, jl.ArraySource({"z": np.zeros((100, 3), np.float32)})]), indices=np.arange(150)),
            batch_size=4)  # (inside another source too)
    # records of 256 KiB or more are read one by one: a record Map may make them alike
    volumes = [jl.ArraySource({"v": np.zeros((2, n, n, n), np.float32)}) for n in (64, 72)]
    crop = jl.Map(lambda r: {"v": np.ascontiguousarray(r["v"][:4, :4, :4])})
    with jl.DataLoader(jl.ConcatSource(volumes), batch_size=4, transforms=[crop],
                       process_index=0, process_count=1) as loader:
        assert next(iter(loader))["v"].shape == (4, 4, 4, 4)


def test_a_batch_of_alike_parts_is_split_among_the_parts_it_reads_alone():
    # a batch's cost, not the parts': 900 one-record parts split every in-process batch into
    # 900 (8.7 ms a batch of 4); now into the few parts it reads
    x = np.arange(900, dtype=np.int32)
    whole = jl.ConcatSource([jl.ArraySource({"x": x[i:i + 1]}) for i in range(900)])
    read, rows, local = whole.split(np.array([899, 3, 4, 3]))
    assert read == [3, 4, 899]
    assert [r.tolist() for r in rows] == [[1, 3], [2], [0]]
    assert [i.tolist() for i in local] == [[0, 0], [0], [0]]
    with jl.DataLoader(whole, batch_size=7, shuffle=True, seed=1, last_batch="pad",
                       process_index=0, process_count=1) as loader:
        got = np.concatenate([b["x"][b["mask"]] for b in loader])
    assert sorted(got.tolist()) == x.tolist()


def _doubled(r):
    return {"id": r["id"], "v": r["v"] * 2}


def _tripled(r):
    return {"id": r["id"], "v": r["v"] * 3}


def _parts(fn, inner=None, n=(10, 7, 13, 1000)):
    made = [jl.ArraySource({"id": np.arange(k), "v": np.arange(k, dtype=np.float32)})
            for k in n]
    if inner is not None:
        made[1] = inner
    made[1] = jl.MapSource(made[1], fn)
    return jl.ConcatSource(made)


def test_a_part_that_changed_is_seen_wherever_it_is(tmp_path):
    # the state named a concatenation by three of its records (0, n // 2, n - 1), which a
    # large last part held: an edited MapSource function, other arrays of the same length, a
    # FilteredSource's kept file, in a part between them restored or was kept silently (the
    # compositions audit)
    import warnings

    def loader(source):
        return jl.DataLoader(source, batch_size=4, shuffle=True, process_index=0,
                             process_count=1)

    saved = loader(_parts(_doubled))
    next(iter(saved))
    state = saved.state_dict()
    loader(_parts(_doubled)).load_state_dict(state)
    other = jl.ArraySource({"id": np.arange(7) + 50, "v": np.zeros(7, np.float32)})
    for changed in (_parts(_tripled), _parts(_doubled, other)):
        with pytest.raises(jl.StateDictError, match="source"):
            loader(changed).load_state_dict(state)
    kept = str(tmp_path / "kept.npy")
    whole = lambda r: float(r["v"]) % 4 == 0  # noqa: E731
    jl.FilteredSource(_parts(_doubled), whole, indices=kept)
    with pytest.warns(jl.JaxloaderWarning, match="kept.npy was found from another source"):
        jl.FilteredSource(_parts(_tripled), whole, indices=kept)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the same parts: the file as kept)
        jl.FilteredSource(_parts(_tripled), whole, indices=kept)


def test_a_concatenations_state_saved_before_its_parts_were_named_restores(monkeypatch):
    # (states until 2026-12-03 named it by three of its records, as OLDER_DIGESTS level 1
    # writes them; its mixtures' and filters' too)
    import warnings

    from jaxloader.base import abilities

    def loader(source):
        return jl.DataLoader(source, batch_size=4, shuffle=True, process_index=0,
                             process_count=1)

    for make in (lambda: _parts(_doubled),
                 lambda: jl.mix([_parts(_doubled), jl.ArraySource(
                     {"id": np.arange(9), "v": np.ones(9, np.float32)})], [1, 1])):
        token = abilities.OLDER_DIGESTS.set(1)
        try:
            before = loader(make())
            it = iter(before)
            next(it)
            state = before.state_dict()
        finally:
            abilities.OLDER_DIGESTS.reset(token)
        assert ("record_hash" in state) == ("mixture" not in state)
        again = loader(make())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again.load_state_dict(state)
        np.testing.assert_array_equal(next(iter(again))["v"], next(it)["v"])


def test_a_nested_concat_or_mixture_keeps_the_fingerprint_states_were_saved_with():
    # the parts a state lists (to name one that changed) went into the fingerprint of a source
    # holding a ConcatSource, so every state saved over a mixture of concats, a filter of one
    # or a concat of concats was refused (the values: fcc8ce7's, before the parts were listed)
    def a():
        return jl.ArraySource({"x": np.arange(10)})

    def b():
        return jl.ArraySource({"x": np.arange(10, 30)})
    assert jl.mix([jl.ConcatSource([a(), b()]), b()], [1, 1]).fingerprint == \
        "mixture:2:5d4882aaa4ef611937b470fcabb1de2b"
    assert jl.FilteredSource(jl.ConcatSource([a(), b()]), indices=np.arange(3)).fingerprint == \
        "filtered:3:62b4d2652dd724e3668d698ef6d9f12e"
    assert jl.ConcatSource([jl.ConcatSource([a(), b()]), a()]).fingerprint == \
        "concat:40:0297b6affc300d660f78062eae262e2c"
