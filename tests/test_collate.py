from __future__ import annotations

import decimal
import enum
import threading
import re
from collections import namedtuple

import numpy as np
import pytest

import jaxloader as jl

from jaxloader.batching.collate import materialize
from jaxloader.batching.record_columns import batch_columns, record_columns
from jaxloader.base.errors import CollateError

Pair = namedtuple("Pair", "image label")


def collate(records, positions=None, alloc=None):
    """Records -> (batch, layout), as the batch maker does."""
    return materialize(*record_columns(records, positions), alloc)


def test_containers_scalars_and_strings():
    records = [
        {"img": np.full((2, 2), i, np.uint8), "pair": Pair(np.float32(i), i), "tags": [b"x", "y"],
         "t": (True, 1.5)}
        for i in range(3)
    ]
    batch, layout = collate(records)
    assert batch["img"].shape == (3, 2, 2) and batch["img"].dtype == np.uint8
    assert isinstance(batch["pair"], Pair)
    assert batch["pair"].image.dtype == np.float32
    assert batch["pair"].label.tolist() == [0, 1, 2]
    assert batch["tags"][0].dtype == object and batch["tags"][0].tolist() == [b"x"] * 3
    assert batch["tags"][1].dtype == object and batch["tags"][1].tolist() == ["y"] * 3
    assert batch["t"][0].dtype == np.bool_ and batch["t"][1].dtype == np.float64
    assert [spec.path for spec in layout.leaves][:2] == ["['img']", "['pair'].image"]


def test_stacks_into_a_given_buffer_and_views_it():
    records = [{"a": np.arange(5, dtype=np.int16) + i, "s": "str"} for i in range(4)]
    buffers = []

    def alloc(n):
        buffers.append(bytearray(n))
        return buffers[-1]

    batch, layout = collate(records, alloc=alloc)
    assert len(buffers) == 1 and len(buffers[0]) == layout.nbytes
    assert np.shares_memory(batch["a"], np.frombuffer(buffers[0], np.uint8))
    again = layout.views(buffers[0], [batch["s"]])
    assert again["a"].tolist() == [list(range(i, i + 5)) for i in range(4)]
    assert again["s"].tolist() == ["str"] * 4
    assert all(spec.offset % 64 == 0 for spec in layout.leaves if spec.offset >= 0)


def test_shape_mismatch_names_leaf_shapes_and_positions():
    records = [{"x": {"y": np.zeros((2, 3))}}, {"x": {"y": np.zeros((2, 4))}}]
    with pytest.raises(CollateError) as e:
        collate(records, positions=[40, 41])
    msg = str(e.value)
    for part in ["['x']['y']", "(2, 3)", "(2, 4)", "position 40", "position 41"]:
        assert part in msg

    assert "resize, crop or pad it" in msg  # (past the first axis: no Pad, nor packing)
    with pytest.raises(CollateError, match=r"jaxloader.Pad\('t'\).*PackedSource"):
        collate([{"t": np.zeros(2)}, {"t": np.zeros(3)}], positions=[0, 1])  # (1-D: tokens)


def test_lists_of_other_lengths_are_told_they_are_nodes_not_arrays():
    with pytest.raises(CollateError, match=r"list of length 2.*list of length 3; a list \(of "
                                           r"numbers, say\) is a node.*np.asarray.*PackedSource"):
        collate([{"tokens": [5, 8]}, {"tokens": [5, 8, 13]}], positions=[0, 1])
    with pytest.raises(CollateError, match=r"record position 1 lacks \['a'\] and has \['b'\], "
                                           r"which the other lacks.*same structure"):
        collate([{"a": 1}, {"b": 1}], positions=[0, 1])  # not a sequence: the general remedy
    # two sorted lists of 5,000 keys (88,152 characters), the one missing left to the eye
    wide = {f"f{i}": 1 for i in range(5000)}  # (the errors audit)
    with pytest.raises(CollateError, match=r"record position 1 lacks \['f4321'\], against "
                                           r"record position 0;") as raised:
        collate([wide, {k: v for k, v in wide.items() if k != "f4321"}], positions=[0, 1])
    assert len(str(raised.value)) < 600
    with pytest.raises(CollateError, match=r"lacks \[1\] and has \['1'\]"):  # (alike as text)
        collate([{1: 0}, {"1": 0}], positions=[0, 1])


def test_dtype_mismatch_is_refused_not_upcast():
    records = [np.zeros(3, np.float32), np.zeros(3, np.float64)]
    with pytest.raises(CollateError, match=r"float32.*float64; give every record one dtype "
                                           r"there: cast in a Map \(np.asarray\(x, 'float64'\)"):
        collate(records, positions=[0, 1])  # (told to Pad them, or batch_size=1: both refuse)
    x = records[0]  # (the one that holds both: the first record's narrowed the second's)
    assert collate([np.asarray(x, 'float64'), records[1]], positions=[0, 1])[0].dtype == np.float64
    with pytest.raises(CollateError, match=r"one width.*np.asarray\(x, '<U64'\).*for one "
                                           r"string a record, give it as a str \(str\(x.item"):
        collate([np.array(["abc"]), np.array(["abcde"])], positions=[0, 1])  # (not '<U3')
    wide = [np.array(["a", "b"]), np.array(["abc", "d"])]  # (two a record: x.item() raises)
    assert collate([np.asarray(x, '<U64') for x in wide], positions=[0, 1])[0].shape == (2, 2)
    for scalars, cast in (((np.uint8(1), np.float64(0.5)), "float64"),  # (not 'uint8': 0.5
                          ((np.int64(7), np.uint64(2**63 + 5)), r"int64'\); 'uint64")):  # as 0)
        with pytest.raises(CollateError, match=rf"np.asarray\(x, '{cast}"):
            collate([{"w": scalars[0]}, {"w": scalars[1]}], positions=[0, 1])
    assert collate([str(np.array(["abc"]).item()), str(np.array(["abcde"]).item())],
                   positions=[0, 1])[0].tolist() == ["abc", "abcde"]
    with pytest.raises(CollateError, match=r"np.asarray\(x, 'int64'\); 'uint64'"):  # (not
        collate([np.zeros(1, np.int64), np.zeros(1, np.uint64)], positions=[0, 1])  # float64)
    with pytest.raises(CollateError, match=r"cast in a Map \(to the one your data needs\)"):
        collate([np.zeros(1, "datetime64[s]"), np.zeros(1)], positions=[0, 1])
    with pytest.raises(CollateError, match="int.*float"):
        collate([{"a": 1}, {"a": 2.0}], positions=[0, 1])


def test_python_and_numpy_scalars_of_one_dtype_batch_together():
    # a list source mixed with a Parquet one, or a Map's default beside a source's value
    batch, _ = collate([{"i": 1, "f": 0.5, "b": True}, {"i": np.int64(2), "f": np.float64(1),
                                                         "b": np.bool_(False)},
                        {"i": np.array(3), "f": 2.5, "b": np.array(True)}])
    assert batch["i"].dtype == np.int64 and batch["i"].tolist() == [1, 2, 3]
    assert batch["f"].dtype == np.float64 and batch["f"].tolist() == [0.5, 1.0, 2.5]
    assert batch["b"].dtype == np.bool_ and batch["b"].tolist() == [True, False, True]
    buffers = []
    batch, layout = collate([{"i": np.int64(7)}, {"i": 8}],
                            alloc=lambda n: buffers.append(bytearray(n)) or buffers[-1])
    assert layout.views(buffers[0])["i"].tolist() == [7, 8]  # into shared memory too
    label = enum.IntEnum("Label", {"CAT": 1})  # (beside a plain int: refused, with a remedy
    batch, _ = collate([{"y": 0}, {"y": label.CAT}])  # to pad it; the transforms audit)
    assert batch["y"].dtype == np.int64 and batch["y"].tolist() == [0, 1]


def test_scalars_of_other_dtypes_are_refused_naming_the_record_that_differs():
    with pytest.raises(CollateError, match=r"position 0 has int 1 \(batched as int64\), "
                                           r"record position 2 has shape \(\) dtype int32; "
                                           r"give every record one dtype there"):
        collate([{"a": 1}, {"a": 2}, {"a": np.int32(3)}], positions=[0, 1, 2])
    with pytest.raises(CollateError, match=r"position 2 has float 2.5"):
        collate([{"a": 1}, {"a": 2}, {"a": 2.5}], positions=[0, 1, 2])
    with pytest.raises(CollateError, match=r"position 1 has int 3 \(batched as int64\); give "
                                           r"every record one kind there"):
        collate([{"a": "s"}, {"a": 3}], positions=[0, 1])
    # one beyond int64 would make its batch uint64, float64 or objects; after NumPy ints it
    for big in (2**63, 2**64, -2**63 - 1):  # was told to pad (the data audit)
        for first in (4, np.int64(4)):
            with pytest.raises(CollateError, match=rf"position 1 holds the int {big}, beyond "
                                                   r"int64 .*as a string, split it into int64"):
                collate([{"a": first}, {"a": big}, {"a": 7}], positions=[0, 1, 2])
    assert collate([{"a": 2**63 - 1}, {"a": -2**63}])[0]["a"].dtype == np.int64


def test_batch_columns_checks_the_batch_axis():
    with pytest.raises(CollateError, match=r"\['b'\].*expected 4 rows.*\(3,\)"):
        batch_columns({"a": np.zeros(4), "b": np.zeros(3)}, 4)
    treedef, cols = batch_columns({"a": np.zeros((4, 2))}, 4)
    batch, layout = materialize(treedef, cols)
    assert batch["a"].shape == (4, 2) and layout.nbytes == 64


# -- leaves that are not NumPy arrays ----------------------------------------------------------
class _ArrayLike:
    """Speaks only the array protocol, as a torch tensor or a jax.Array does."""

    def __init__(self, value):
        self.value = value

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.value, dtype=dtype)


def test_array_protocol_leaves_become_numpy_arrays():
    batch, _ = collate([{"x": _ArrayLike(np.full((2, 3), i, np.int16))} for i in range(3)])
    assert type(batch["x"]) is np.ndarray and batch["x"].dtype == np.int16
    assert batch["x"].shape == (3, 2, 3) and batch["x"][:, 0, 0].tolist() == [0, 1, 2]


def test_jax_arrays_become_numpy_arrays():
    jnp = pytest.importorskip("jax.numpy")
    batch, _ = collate([jnp.arange(4, dtype=jnp.float32) + i for i in range(2)])
    assert type(batch) is np.ndarray and batch.dtype == np.float32 and batch.shape == (2, 4)


def test_pil_images_become_numpy_arrays():
    image = pytest.importorskip("PIL.Image")  # in the test extra
    records = [{"img": image.new("RGB", (5, 4), color=(i, 2 * i, 3 * i))} for i in range(3)]
    batch, _ = collate(records)
    assert batch["img"].shape == (3, 4, 5, 3) and batch["img"].dtype == np.uint8
    assert batch["img"][:, 0, 0].tolist() == [[0, 0, 0], [1, 2, 3], [2, 4, 6]]


def test_torch_tensors_become_numpy_arrays():
    torch = pytest.importorskip("torch")  # optional: tested where torch is installed
    batch, _ = collate([{"t": torch.full((2,), float(i))} for i in range(3)])
    assert type(batch["t"]) is np.ndarray and batch["t"].tolist() == [[0, 0], [1, 1], [2, 2]]


def test_strings_and_bytes_stay_objects_of_any_length():
    batch, _ = collate([{"s": "a" * (i + 1), "b": b"x" * i} for i in range(3)])
    assert batch["s"].dtype == object and batch["s"].tolist() == ["a", "aa", "aaa"]
    assert batch["b"].tolist() == [b"", b"x", b"xx"]
    with pytest.raises(CollateError, match=r"\['s'\].*position 0 has str.*position 1 has int"):
        collate([{"s": "a"}, {"s": 1}], positions=[0, 1])
    # str and bytes in one leaf: one type a leaf (they batched together without a word)
    with pytest.raises(CollateError, match=r"\['s'\].*position 0 has str 'a', record position "
                                           r"2 has bytes b'c'; .*decode the bytes"):
        collate([{"s": "a"}, {"s": np.str_("b")}, {"s": b"c"}], positions=[0, 1, 2])
    # a string in a 0-d object array (as a 0-d str array) batches as the string: it came out
    # as an object array of 0-d arrays, batch["o"][0] an ndarray
    batch, _ = collate([{"o": np.array(f"s{i}", dtype=object)} for i in range(3)])
    assert batch["o"].tolist() == ["s0", "s1", "s2"] and type(batch["o"][0]) is str


def test_object_arrays_of_other_lengths_are_one_entry_a_record():
    # lists of strings (a Hugging Face List(string) feature), as a source's batch gives them
    tags = [np.array(t, dtype=object) for t in (["a", "b"], ["c"], [])]
    batch, _ = collate([{"tags": t} for t in tags])
    assert batch["tags"].shape == (3,) and batch["tags"].dtype == object
    assert [t.tolist() for t in batch["tags"]] == [["a", "b"], ["c"], []]
    # numbers of other lengths are still refused (PackedSource packs them)
    with pytest.raises(CollateError, match=r"records differ.*PackedSource"):
        collate([{"t": np.arange(2)}, {"t": np.arange(3)}])


def test_numbers_after_objects_and_numbers_in_0_d_object_arrays_are_refused_as_anywhere():
    # an object leaf took a record of numbers after it (np.stack cast them in), though the
    # other order was refused; and 0-d object arrays of numbers, Decimals, went into a batch
    # of 0-d arrays unchecked, which the 1-d form refuses
    import decimal

    text = np.array(["a", "b"], dtype=object)
    for values in ([text, np.array([1.5, 2.5])], [text, np.array([1, 2])],
                   [np.array([1.5, 2.5]), text]):
        with pytest.raises(CollateError, match=r"records differ: item 0 has shape \(2,\) "
                                               r"dtype (object|float64), item 1 .*give every "
                                               r"record one kind there: the numbers as numbers"):
            collate([{"x": v} for v in values])
    with pytest.raises(CollateError, match=r"is an array of Python objects holding numbers"):
        collate([{"x": np.array(5, dtype=object)}, {"x": np.array(6, dtype=object)}])
    with pytest.raises(CollateError, match=r"holds a decimal.Decimal"):
        collate([{"x": np.array(decimal.Decimal("1.5"), dtype=object)}] * 2)
    # a str, then a 0-d text array: one kind (as the other order is), not "parse the text"
    batch, _ = collate([{"s": "a"}, {"s": np.array("bc")}, {"s": np.array("d", dtype=object)}])
    assert batch["s"].tolist() == ["a", "bc", "d"]


def test_object_arrays_of_other_lengths_are_checked_as_arrays_of_one_length_are():
    # (the sources audit) object arrays of numbers, Decimals or locks batched without a word
    # where their lengths differed (a Parquet list<decimal> column's ragged rows), refused
    # where they were alike; a lock then failed workers as "cannot pickle '_thread.lock'"
    import threading

    for values, said in (([1, 2], r"is an array of Python objects holding numbers"),
                         ([decimal.Decimal("1.1")] * 2, r"holds a decimal.Decimal"),
                         ([threading.Lock()] * 2, r"holds a _thread.lock")):
        rows = [np.array(values, dtype=object), np.array(values[:1], dtype=object)]
        with pytest.raises(CollateError, match=r"batch leaf \['x'\]: item 0 " + said):
            collate([{"x": row} for row in rows])
    words = [np.array(["a", "bc"], dtype=object), np.array(["d"], dtype=object)]
    batch, _ = collate([{"w": w} for w in words])  # (lists of strings: as before)
    assert [w.tolist() for w in batch["w"]] == [["a", "bc"], ["d"]]


def test_a_jax_array_after_a_numpy_value_batches_as_before_one_and_its_dtype_is_named():
    # (the sources audit) [np.int32(2), jnp.array(1, int32)] was refused, the other order
    # batched: shuffled, some batches failed; a float32 jax.Array beside float64 NumPy rows
    # was told to pad them, though their shapes were one
    jnp = pytest.importorskip("jax").numpy
    for values in ([jnp.array(1, jnp.int32), np.int32(2)],
                   [np.int32(2), jnp.array(1, jnp.int32)]):
        batch, _ = collate([{"y": v} for v in values])
        assert batch["y"].dtype == np.int32 and sorted(batch["y"].tolist()) == [1, 2]
    with pytest.raises(CollateError, match=r"item 0 has shape \(3,\) dtype float64, item 1 has "
                                           r"shape \(3,\) dtype float32; give every record one "
                                           r"dtype there: cast in a Map"):
        collate([{"x": np.zeros(3)}, {"x": jnp.ones(3, jnp.float32)}])


def test_empty_rows_of_other_dtypes_are_refused_as_rows_with_values_are():
    # (the sources audit) a batch of (0,) rows took the first record's dtype, float32 or
    # int64 by the order the records came in; rows with values are refused
    for dtypes in ((np.float32, np.int64), (np.int64, np.float32)):
        with pytest.raises(CollateError, match=r"records differ: item 0 has shape \(0,\) dtype "
                                               rf"{np.dtype(dtypes[0])}, item 1 has shape \(0,\) "
                                               rf"dtype {np.dtype(dtypes[1])}"):
            collate([{"x": np.zeros(0, d)} for d in dtypes])
    batch, _ = collate([{"x": np.zeros((0, 4), np.float32)}] * 3)
    assert batch["x"].shape == (3, 0, 4) and batch["x"].dtype == np.float32


def test_text_beside_a_number_is_told_to_be_made_one_kind_not_padded():
    # was told to pad them with jaxloader.Pad('s'), which refuses text (the pytrees audit)
    for values in (["a", 1], [2.5, b"x"]):
        with pytest.raises(CollateError, match=r"records differ: .*give every record one kind "
                                               r"there: parse the text to a number, or make the "
                                               r"number text \(str\(x\)\), in a Map$"):
            collate([{"s": v} for v in values])


def test_other_objects_are_refused_naming_the_leaf_the_type_and_the_fix():
    class Opaque:
        pass

    with pytest.raises(CollateError) as e:
        collate([{"a": {"b": Opaque()}}, {"a": {"b": Opaque()}}], positions=[7, 8])
    for part in ["['a']['b']", "position 7", "Opaque", "np.asarray(x)", "register"]:
        assert part in str(e.value)


def test_none_where_another_record_has_an_array_is_refused_naming_the_leaf():
    with pytest.raises(CollateError, match=r"\['y'\].*position 6 has None; give every record an array"):
        collate([{"y": np.zeros(2)}, {"y": None}], positions=[5, 6])


@pytest.mark.parametrize("value, fill", [("a caption", "a str ('' where it has none"),
                                         (b"x", "a bytes (b'' where it has none"),
                                         (1.5, "a number (a fill value")])
def test_none_where_another_record_has_text_or_a_number_is_told_what_to_give(value, fill):
    # (a caption of None among str was told "give every record an array")
    with pytest.raises(CollateError, match=rf"has None; give every record {re.escape(fill)}"):
        collate([{"y": value}, {"y": None}])
    with pytest.raises(CollateError, match="has None, .* where others have a value must "
                                           "become one: '' for a str, a fill number"):
        collate([{"y": None}, {"y": value}])  # (a None first: a node, told by structure)


class _Prices:
    """A source whose ``__getitems__`` gives batched columns: an object column of Decimals,
    with a None first."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"price": None if i == 0 else decimal.Decimal(i)}

    def __getitems__(self, indices):
        return {"price": np.array([self[int(i)]["price"] for i in indices], dtype=object)}


def test_an_object_column_of_another_type_is_refused_past_its_nones():
    # only its first value was looked at: a None there let the Decimals through
    with pytest.raises(jl.CollateError, match=r"leaf \['price'\]: the batch's value 1 holds a "
                                              r"decimal.Decimal"):
        jl.DataLoader(_Prices(), batch_size=4).peek()


def test_a_record_nested_past_the_recursion_limit_is_named_not_a_bare_recursion_error():
    # JSON nested 900 deep is parsed, then batching raised a bare RecursionError
    deep: dict = {"a": 1}
    for _ in range(5000):
        deep = {"a": deep}
    cyclic: dict = {}
    cyclic["a"] = cyclic
    for records, which in (([{"ok": 1}, deep], "item 1"), ([deep, {"a": 1}], "item 0"),
                           ([{"ok": 1}, cyclic], "item 1")):
        with pytest.raises(CollateError, match=rf"collate: {which} is nested deeper than "
                                               r"Python's recursion limit"):
            collate(records)


def test_a_masked_array_with_masked_values_is_refused_not_batched_as_its_fill_values():
    # (netCDF4 reads missing data as masked arrays: the fill value -999 was batched as data)
    sst = [np.ma.masked_array([1.0, 2.0], mask=[False, j == 1], fill_value=-999.0)
           for j in range(3)]
    with pytest.raises(CollateError, match=r"\['sst'\]: item 1 is a masked array "
                                           r"with 1 masked value.*x.filled\(0\)"):
        collate([{"sst": v} for v in sst])
    with pytest.raises(CollateError, match=r"the batch's column is a masked array"):
        batch_columns({"sst": np.ma.masked_array([1.0, 2.0], mask=[True, False])}, 2)
    for first in (np.float32(280.5), 280.5, np.ma.masked):  # (netCDF4's scalar where missing:
        with pytest.raises(CollateError, match=r"is a masked array with 1 masked"):  # np.ma.
            collate([{"t": first}, {"t": np.ma.masked}])  # masked: a TypeError, then a NaN)
    plain = [np.ma.masked_array([1.0, 2.0]) for _ in range(2)]  # (none masked: its data)
    assert collate([{"sst": v} for v in plain])[0]["sst"].tolist() == [[1.0, 2.0]] * 2


def test_a_whole_decimal_is_told_to_become_an_integer_not_a_float():
    # (DECIMAL(20, 0) ids, Hive's and Spark's uint64: the remedy float(x) lost their digits)
    import decimal

    ids = [{"uid": decimal.Decimal(2**63 + 57)}, {"uid": decimal.Decimal(7)}]
    with pytest.raises(jl.CollateError, match=r"9223372036854775865 is a whole number.*"
                                              r"np.uint64\(int\(x\)\)"):
        next(iter(jl.DataLoader(ids, batch_size=2)))
    with pytest.raises(jl.CollateError) as raised:  # (a price of 38 digits: a float rounds
        # it; the Parquet audit)
        next(iter(jl.DataLoader([{"p": decimal.Decimal("0.5")}] * 2, batch_size=2)))
    assert "whole number" not in str(raised.value)
    assert "float(x) may round 0.5; str(x) keeps its digits" in str(raised.value)


def test_leaves_with_an_axis_of_no_values_are_batched():
    # (records of shape (3, 0), or a Pad of empty lists to a length: "cannot reshape array of
    # size 0", a bare ValueError at a step)
    records = [{"x": np.zeros((3, 0), np.float32)} for _ in range(4)]
    assert next(iter(jl.DataLoader(records, batch_size=4)))["x"].shape == (4, 3, 0)
    empty = [{"e": np.zeros((0, 0), np.int64)} for _ in range(4)]  # (a Parquet row group of
    with pytest.raises(jl.CollateError, match=r"every record's 'e' in this batch is empty, "
                                              r"of shape \(0, 0\).*np.reshape\(x, \(-1, 4\)\)"):
        next(iter(jl.DataLoader(empty, batch_size=4, transforms=[jl.Pad("e", length=4)])))
    # empty lists of lists, padded: (4, 4, 0) where other batches had (4, 4, 4), silently)


def test_a_scipy_sparse_leaf_is_told_to_be_made_dense():
    # a BatchMap's OneHotEncoder output was "expected 4 rows, got shape ()" (np.asarray of it:
    # one object), and a record's was told np.asarray(x), which makes the same object
    sparse = pytest.importorskip("scipy.sparse")
    import jaxloader as jl

    source = jl.ArraySource({"x": np.arange(8)})
    for t, where in ((jl.BatchMap(lambda b: {"oh": sparse.csr_matrix(np.eye(4, 3))}),
                      r"a SciPy sparse csr_matrix of shape \(4, 3\)"),
                     (jl.Map(lambda r: {"oh": sparse.csr_matrix(np.eye(1, 3))}),
                      r"record position 0 holds a scipy.sparse.*csr_matrix")):
        with pytest.raises(CollateError, match=where + r".*x.toarray\(\)"):
            next(iter(jl.DataLoader(source, batch_size=4, transforms=[t])))
    dense = jl.Map(lambda r: {"oh": sparse.csr_matrix(np.eye(1, 3)).toarray()[0]})
    assert next(iter(jl.DataLoader(source, batch_size=4, transforms=[dense])))["oh"].shape == (
        4, 3)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_array_of_objects_in_a_record_is_checked_as_a_batchs_column_is(num_workers):
    # a record's object array was batched whatever it held: a lock (batched in process, a
    # pickling error with workers), Decimals (refused as leaves of their own), and floats (an
    # object batch sharding= left on the host; the interop and errors audits)
    class Held:
        def __init__(self, value):
            self.value = value

        def __len__(self):
            return 8

        def __getitem__(self, i):  # (a lock made as read: a source holding one is refused
            value = threading.Lock() if self.value == "lock" else self.value  # at its send)
            if self.value == "text, then a lock":  # (only its first value was looked at)
                return {"x": np.array(["text", None, threading.Lock()], dtype=object)}
            return {"x": np.array([value, None], dtype=object)}

    for value, said in [(decimal.Decimal("1.10"), r"holds a decimal.Decimal"),
                        ("lock", r"holds a _thread.lock"),
                        ("text, then a lock", r"holds a _thread.lock"),
                        (1.5, r"is an array of Python objects holding numbers \(a float first\)"
                              r".*np.asarray\(x, np.float32\)")]:
        with pytest.raises((jl.CollateError, jl.WorkerError),
                           match=r"batch leaf \['x'\]: record position 0 " + said):
            jl.DataLoader(Held(value), batch_size=4, num_workers=num_workers).peek()
    with jl.DataLoader(Held("text"), batch_size=4, num_workers=num_workers) as loader:
        assert next(iter(loader))["x"][0].tolist() == ["text", None]  # (strings: as they were)


def test_numpy_scalars_of_two_dtypes_and_pandas_missing_values_get_their_own_remedy():
    # datetime64 of seconds beside milliseconds, and pandas' NA among ints, were told to pad
    # with jaxloader.Pad, which refuses both (the interop audit)
    with pytest.raises(CollateError, match=r"give every record one dtype there: cast in a Map "
                                           r"\(np.asarray\(x, 'datetime64\[ms\]'\)"):
        collate([{"t": np.datetime64(1, "ms")}, {"t": np.datetime64(1, "s")}], positions=[0, 1])
    pd = pytest.importorskip("pandas")
    with pytest.raises(CollateError, match=r"give every record a number .* there, not <NA>"):
        collate([{"x": 0}, {"x": pd.NA}], positions=[0, 1])


def test_a_memoryview_leaf_is_refused_with_any_worker_count():
    # cloudpickle sent a list source's memoryviews to the workers as bytes, which batched,
    # where num_workers=0 refused the memoryview: a source worked by its worker count (the
    # interop audit)
    records = [{"x": memoryview(bytes([i, 1]))} for i in range(4)]
    with pytest.raises(jl.CollateError, match=r"holds a memoryview, .*\(a buffer: bytes\(x\) for "
                                              r"its bytes"):
        next(iter(jl.DataLoader(records, batch_size=2, num_workers=0)))
    with pytest.raises(jl.JaxloaderError, match=r"does not pickle: TypeError: cannot pickle "
                                                r"'memoryview' object"):
        with jl.DataLoader(records, batch_size=2, num_workers=2) as loader:
            next(iter(loader))
