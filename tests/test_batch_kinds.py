"""Every batch has the leaves, dtypes and ranks of the first (``base.batch_kinds``): two batches
of other dtypes were handed out without a word, where two records of them in one batch were
refused."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import jaxloader as jl


class Part:
    """A user's source of records ``{"x": x[i]}``: parts of a ConcatSource whose records are
    known to differ without a read (ArraySources) are refused as it is made; a user's parts are
    known as their batches are read, the case of these tests."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i]}

    def __getitems__(self, indices):
        return {"x": self.x[np.asarray(indices)]}


def in_turn(*arrays):
    return jl.ConcatSource([Part(x) for x in arrays])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_parts_of_other_dtypes_read_in_turn_are_refused_at_the_first_batch_that_differs(
        num_workers):
    # int64 batches, then float64 ones, in file order; a full shuffle met both in one batch
    parts = in_turn(np.arange(8), np.arange(4.0))
    with jl.DataLoader(parts, batch_size=4, num_workers=num_workers, process_index=0,
                       process_count=1) as loader:
        it = iter(loader)
        assert [next(it)["x"].dtype for _ in range(2)] == [np.int64, np.int64]
        for _ in range(2):  # (the same step again: nothing lost)
            with pytest.raises(jl.CollateError, match=r"step 2 \(epoch 0, record positions "
                                                      r"8..11\) \(sources\[1\] record 0, .*"
                                                      r"record 3\): batch leaf \['x'\] is float64 "
                                                      r"\(1-D\), where the first batch, step 0 \(epoch"
                                                      r" 0, .*sources\[0\].*, had int64 \(1-D\).*"
                                                      r"np.asarray\(x, 'float64'\)"):
                next(it)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_batch_of_a_few_files_that_differs_names_them(tmp_path, num_workers):
    # (the video audit: clips a batch each, one saved float32, was named by its position
    # alone, to be found by hand in a shuffled epoch)
    for i in range(4):
        np.save(tmp_path / f"c{i}.npy", np.zeros((2, 3), np.float32 if i == 2 else np.uint8))
    source = jl.FileListSource(sorted(str(p) for p in tmp_path.glob("*.npy")))
    with jl.DataLoader(source, batch_size=1, num_workers=num_workers, process_index=0,
                       process_count=1, transforms=[jl.Map(lambda r: np.load(r["path"]))],
                       ) as loader:
        with pytest.raises(jl.CollateError, match=r"step 2 \(epoch 0, record positions 2..2\) "
                                                  r"\(\S*/c2.npy\): batch leaf <root> is float32"):
            list(loader)


def test_a_stream_whose_numbers_turn_to_floats_is_refused_whatever_the_batch_size(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"a": v}) + "\n" for v in [1, 2, 1.5, 2.5]))
    for batch_size, message in ((2, r"leaf \['a'\] is float64 \(1-D\), where the first batch"),
                                (4, r"leaf \['a'\]")):  # (4: within one batch, as before)
        loader = jl.StreamLoader(jl.Stream.jsonl(str(path)), batch_size=batch_size,
                                 num_epochs=1, process_index=0, process_count=1)
        with pytest.raises(jl.CollateError, match=message):
            list(loader)


def test_int64_then_uint64_is_told_to_be_uint64_not_float64_which_rounds():
    parts = in_turn(np.arange(4), np.arange(4, dtype=np.uint64) + 2**63)
    with pytest.raises(jl.CollateError, match=r"uint64 \(1-D\), where the first batch, step 0 "
                                              r"\(.*\), had int64 \(1-D\).*hold no common int.*"
                                              r"np.asarray\(x, 'uint64'\)"):
        list(jl.DataLoader(parts, batch_size=4, process_index=0, process_count=1))


def test_a_byte_order_or_a_structure_that_differs_is_named_by_the_dtype_not_its_name():
    # (">f4 then <f4" read "float32, where ... had float32", and two structures "void32 ...
    # void32" with the remedy np.asarray(x, 'void32'), which raises; the dtypes audit)
    def refused(first, then):
        parts = in_turn(np.zeros(4, first), np.zeros(4, then))
        with pytest.raises(jl.CollateError) as caught:
            list(jl.DataLoader(parts, batch_size=4, process_index=0, process_count=1))
        return str(caught.value)

    said = refused(">f4", "<f4")
    assert ("is float32 (1-D), where the first batch, step 0 (epoch 0, record positions 0..3) "
            "(sources[0] record 0, " in said)  # (the first batch's records named too)
    assert "sources[0] record 3), had >f4 (1-D)" in said
    assert "np.asarray(x, 'float32')" in said
    said = refused([("a", "<i4")], [("a", "<f4")])
    assert "[('a', '<f4')] (1-D), where the first batch, step 0 (epoch 0, " in said
    assert "had [('a', '<i4')]" in said
    assert "{f: x[f] for f in x.dtype.names}" in said and "void" not in said


def test_strings_of_other_lengths_nested_leaves_and_partial_batches_pass():
    words = np.array(["a", "bb", "ccc", "dddd", "eeeee"])  # batches of <U2, then <U4, <U5
    source = jl.ArraySource({"w": words, "p": {"q": np.arange(5.0)}})
    loader = jl.DataLoader(source, batch_size=2, last_batch="partial", process_index=0,
                           process_count=1)
    assert [b["w"].tolist() for b in loader] == [["a", "bb"], ["ccc", "dddd"], ["eeeee"]]


def test_host_leaves_that_batches_make_in_other_forms_pass():
    # (the review's cases, refused by the first version) lists of strings of one length in a
    # batch are stacked (object, 2-D), of other lengths a column of rows (object, 1-D); a
    # mixture of fixed-width and Python strings is <U where only the first is in a batch,
    # objects where both are
    tags = [{"tags": np.array(t, object)} for t in (["a", "b"], ["c"], ["d", "e"], ["f", "g"])]
    loader = jl.DataLoader(tags, batch_size=2, process_index=0, process_count=1)
    assert [b["tags"].ndim for b in loader] == [1, 2]
    mixed = jl.mix([jl.ArraySource({"t": np.array(["ab"] * 50)}), [{"t": "zz"}] * 100],
                   [0.9, 0.1])
    loader = jl.DataLoader(mixed, batch_size=4, shuffle=True, num_epochs=1, process_index=0,
                           process_count=1)
    assert {b["t"].dtype.kind for b in loader} == {"U", "O"}


def test_a_rank_or_a_text_kind_that_changes_is_refused_with_its_own_remedy():
    ranks = in_turn(np.zeros((8, 2)), np.zeros(4))
    with pytest.raises(jl.CollateError, match=r"leaf \['x'\] is 1-D, where the first batch"
                                              r", step 0 \(.*\), had 2-D: .* reshape or pad it"):
        list(jl.DataLoader(ranks, batch_size=4, process_index=0, process_count=1))
    text = in_turn(np.array(["a"] * 8), np.array([b"b"] * 4))
    with pytest.raises(jl.CollateError, match=r"leaf \['x'\] is bytes, where the first batch"
                                              r", step 0 \(.*\), had str: "):
        list(jl.DataLoader(text, batch_size=4, process_index=0, process_count=1))


def test_python_strings_bytes_and_numbers_that_change_between_batches_are_refused():
    # A leaf of Python objects was compared with anything: str in one batch and bytes in the
    # next (refused within a batch) passed, as did numbers then bytes
    for records, now, then in (([{"x": "a"}, {"x": b"b"}], "bytes", "str"),
                               ([{"x": 7}, {"x": b"b"}], "bytes", "int64"),
                               ([{"x": 1.5}, {"x": "text"}], "str", "float64")):
        for workers in (0, 1):
            with jl.DataLoader(records, batch_size=1, num_workers=workers, process_index=0,
                               process_count=1) as loader:
                with pytest.raises(jl.CollateError, match=rf"step 1 .*leaf \['x'\] is {now}, "
                                   rf"where the first batch, step 0 \(.*\), had {then}") as caught:
                    list(loader)
            if now == "str":  # (the remedy's dtype was 'str672', which NumPy has not)
                assert "np.asarray(x, 'str'))" in str(caught.value)
    # a leaf of objects that tell nothing first (a None, a ragged row), then str, then bytes
    told = [np.array([None, "a"], object), np.array(["b", "c"], object),
            np.array([b"d", b"e"], object)]
    with jl.DataLoader(jl.ArraySource({"i": np.arange(6)}), batch_size=2, process_index=0,
                       process_count=1, transforms=[jl.BatchMap(
                           lambda b: {"x": told[int(b["i"][0]) // 2]})]) as loader:
        with pytest.raises(jl.CollateError, match=r"step 2 .*leaf \['x'\] is bytes, where the "
                           r"batch of step 1 \(the first to tell its kind\), had str"):
            list(loader)
    same = [{"x": "a"}, {"x": "bc"}, {"x": np.array(["d"])[0]}, {"x": np.array(["ef"])}]
    assert [b["x"].tolist() for b in jl.DataLoader(same, batch_size=1, process_index=0,
                                                   process_count=1)] == [["a"], ["bc"], ["d"],
                                                                         [["ef"]]]


def test_a_batch_map_that_changes_the_structure_is_refused_naming_the_leaf():
    def odd_steps_more(batch):
        return {**batch, "extra": batch["x"]} if batch["x"][0] >= 4 else batch

    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4,
                           transforms=[jl.BatchMap(odd_steps_more)], process_index=0,
                           process_count=1)
    with pytest.raises(jl.CollateError, match=r"step 1 .*batch leaf \['extra'\] is new in this "
                                              r"batch, against the first batch, step 0 \(epoch 0, "):
        list(loader)
    def renamed(batch):  # (a shard of another schema: which leaves came instead, unsaid;
        return {"y": batch["x"]} if batch["x"][0] >= 4 else batch  # the errors audit)
    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4,
                           transforms=[jl.BatchMap(renamed)], process_index=0, process_count=1)
    with pytest.raises(jl.CollateError, match=r"step 1 .*batch leaf \['x'\] is missing in this "
                                              r"batch \(missing: \['x'\]; new: \['y'\]\)"):
        list(loader)


def test_the_same_leaves_in_another_structure_are_refused_naming_where():
    # compared by leaf path alone: tuple records then list ones, one namedtuple then another,
    # a None dropped, a dict then an OrderedDict all passed, and a jitted step was traced
    # again for each (the pytrees audit); dict keys in another order stay one structure
    import collections

    P, Q = collections.namedtuple("P", "a b"), collections.namedtuple("Q", "a b")

    def batches(first, then):
        records = [first(i) for i in range(2)] + [then(i) for i in range(2)]
        with jl.DataLoader(records, batch_size=2, process_index=0, process_count=1) as loader:
            return list(loader)

    for first, then, said in [
            (lambda i: (np.float32(i), i), lambda i: [np.float32(i), i],
             r"structure at <root> is a list of 2, where the first batch, step 0 \(.*\), "
             r"had a tuple"),
            (lambda i: P(np.float32(i), i), lambda i: Q(np.float32(i), i), r"is a Q, .* had a P"),
            (lambda i: {"x": np.float32(i), "aux": None}, lambda i: {"x": np.float32(i)},
             r"is a dict of keys \['x'\], .* had a dict of keys \['aux', 'x'\]"),
            (lambda i: {"x": np.float32(i)}, lambda i: collections.OrderedDict(x=np.float32(i)),
             r"is an OrderedDict of keys \['x'\]"),
            (lambda i: {"x": {"b": (1, 2)}}, lambda i: {"x": {"b": [1, 2]}},
             r"structure at \['x'\]\['b'\] is a list of 2")]:
        with pytest.raises(jl.CollateError, match=r"step 1 .*" + said):
            batches(first, then)
    got = batches(lambda i: {"x": 1.0, "y": (i, None)}, lambda i: {"y": (i, None), "x": 1.0})
    assert [b["y"][0].tolist() for b in got] == [[0, 1], [0, 1]]


def test_a_dict_whose_keys_jax_cannot_sort_is_warned_of_at_the_first_batch():
    # batched as NumPy, then JAX's bare "Comparator raised exception while sorting pytree
    # dictionary keys" from the device-put thread once a sharding was given (the pytrees audit);
    # an OrderedDict's, which JAX does not sort, is not
    import collections

    records = [{"x": {1: np.float32(i), "a": 2.0}} for i in range(4)]
    with jl.DataLoader(records, batch_size=2, process_index=0, process_count=1) as loader:
        with pytest.warns(jl.JaxloaderWarning, match=r"step 0 .*dict at \['x'\] has keys of int "
                                                     r"and str \(\[1, 'a'\]\), which JAX "
                                                     r"cannot sort.*str\(key\)"):
            assert next(iter(loader))["x"][1].tolist() == [0.0, 1.0]
    ordered = [{"x": collections.OrderedDict([(1, np.float32(i)), ("a", 2.0)])} for i in range(4)]
    with jl.DataLoader(ordered, batch_size=2, process_index=0, process_count=1) as loader:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            next(iter(loader))
