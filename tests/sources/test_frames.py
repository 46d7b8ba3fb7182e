"""ArraySource over data frames and Arrow tables: each column by its own values, or refused
naming it, with a remedy that works as written."""

from __future__ import annotations

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sources.base import check_source


def test_an_arrow_table_is_a_dict_of_its_columns_and_its_nulls_are_refused():
    # np.asarray made a table one float64 matrix (names lost, ids past 2**53 rounded, a null
    # NaN); passed as the source, each "record" was a whole column (its [i])
    pa = pytest.importorskip("pyarrow")
    pc = pytest.importorskip("pyarrow.compute")
    table = pa.table({"id": pa.array([2**53 + 1, 2**53 + 3, 5, 7], pa.int64()),
                      "x": pa.array([0.5, 1.5, 2.5, 3.5], pa.float32()),
                      "s": ["a", "bb", "c", "d"], "day": pa.array([0, 1, 2, 3], pa.date32())})
    for workers in (0, 2):
        with jl.DataLoader(jl.ArraySource(table), batch_size=2, num_workers=workers,
                           process_index=0, process_count=1) as loader:
            batch = next(iter(loader))
        assert batch["id"].tolist() == [2**53 + 1, 2**53 + 3] and batch["x"].dtype == np.float32
        assert batch["s"].tolist() == ["a", "bb"] and batch["day"].dtype.kind == "M"
    assert jl.ArraySource(table.to_batches()[0])[1]["id"] == 2**53 + 3
    chunked = jl.ArraySource({"a": pa.chunked_array([[1, 2], [3]]), "b": np.arange(3)})
    assert chunked.arrays[0].tolist() == [1, 2, 3]
    with pytest.raises(jl.ConfigError, match=r"Arrow Table of 4 rows, whose \[i\] is its "
                                             r"column i.*ArraySource\(table\)"):
        check_source(table)
    ages = pa.table({"age": pa.array([34, None, 45])})
    with pytest.raises(jl.ConfigError, match=r"column 'age' \(int64\) has 1 null.*NaN.*"
                                             r"fill them \(pc.fill_null\(table\['age'\], 0\)\)"):
        jl.ArraySource(ages)
    table = ages  # (the remedy, as written)
    assert jl.ArraySource({"age": pc.fill_null(table["age"], 0)}).arrays[0].tolist() == [
        34, 0, 45]
    with pytest.raises(jl.ConfigError, match=r"leaf \['a'\] \(int64\) has 1 null"):
        jl.ArraySource({"a": pa.array([1, None])})
    with pytest.raises(jl.ConfigError, match=r"leaf \['t'\]: an Arrow Table inside the tree"):
        jl.ArraySource({"t": ages})


@pytest.mark.parametrize("kind", ["dictionary", "decimal", "list", "struct"])
def test_an_arrow_column_numpy_holds_as_objects_is_refused_with_a_remedy_that_works(kind):
    pa = pytest.importorskip("pyarrow")
    column = {"dictionary": pa.array(["a", "b"]).dictionary_encode(),
              "decimal": pa.array([1, 2], pa.decimal128(5, 2)),
              "list": pa.array([[1], [2, 3]]), "struct": pa.array([{"a": 1}, {"a": 2}])}[kind]
    table = pa.table({"c": column})
    with pytest.raises(jl.ConfigError, match=r"column 'c' is .*Python objects") as said:
        jl.ArraySource(table)
    call = {"dictionary": "table['c'].cast(table['c'].type.value_type)",
            "decimal": "table['c'].cast(pa.float64())", "list": "table.to_pylist()",
            "struct": "table.flatten()"}[kind]
    assert call in str(said.value).split("; ", 1)[1]
    fixed = eval(call, {"table": table, "pa": pa})  # (as the message writes it)
    if kind != "list":
        fixed = pa.table({"c": fixed}) if not isinstance(fixed, pa.Table) else fixed
        assert len(jl.ArraySource(fixed)) == 2
    else:
        assert fixed == [{"c": [1]}, {"c": [2, 3]}]


def test_pandas_leaves_of_other_indexes_are_refused_not_paired_by_position():
    # y left in its order after X was sorted: features were paired with others' labels
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"date": [3, 1, 2, 0], "f": [30.0, 10.0, 20.0, 0.0],
                          "target": [300, 100, 200, 0]})
    y = frame.pop("target")
    X = frame.sort_values("date")
    for tree in ({"x": X["f"], "y": y}, (X, y)):
        with pytest.raises(jl.ConfigError, match=r"pandas objects of other indexes \(\[3, 1, "
                                                 r"2, 0\]\.\.\. against \[0, 1, 2, 3\].*"
                                                 r"y.loc\[X.index\]"):
            jl.ArraySource(tree)
    aligned = jl.ArraySource({"x": X["f"], "y": y.loc[X.index]})
    assert [(r["x"], r["y"]) for r in (aligned[i] for i in range(4))] == [
        (0.0, 0), (10.0, 100), (20.0, 200), (30.0, 300)]
    by_position = jl.ArraySource({"x": X["f"].reset_index(drop=True),
                                  "y": y.reset_index(drop=True)})
    assert by_position[0]["y"] == 300  # (asked for: their positions pair them)
    assert jl.ArraySource({"x": X["f"], "y": y.to_numpy()})[0]["y"] == 300  # (one of pandas)
    # a frame made from an array (a scaler's output) has index 0..n-1 where y kept the
    # split's: positions pair them, and y.loc[X.index] would mislabel (the review)
    train = pd.DataFrame({"f": [50.0, 20.0, 10.0], "label": [50, 20, 10]}, index=[5, 2, 1])
    X, y = pd.DataFrame(train[["f"]].to_numpy()), train["label"]
    with pytest.raises(jl.ConfigError, match=r"\['x'\]'s is 0..n-1, as a frame made from an "
                                             r"array has.*positions pair them, drop the "
                                             r"index of the one at \['y'\] \(its .reset_index"
                                             r"\(drop=True\)\); where 0..n-1 are labels too"):
        jl.ArraySource({"x": X, "y": y})
    fixed = jl.ArraySource({"x": X, "y": y.reset_index(drop=True)})
    assert [(fixed[i]["x"][0], fixed[i]["y"]) for i in range(3)] == [(50, 50), (20, 20),
                                                                      (10, 10)]


def test_a_time_zone_is_refused_on_every_pandas_and_polars_path():
    # a pyarrow-backed pandas column and a polars column kept UTC's instants without a word,
    # where NumPy-backed pandas was refused: hours of the day in UTC, not the data's zone
    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    pl = pytest.importorskip("polars")
    zone = pd.ArrowDtype(pa.timestamp("us", tz="Asia/Tokyo"))
    df = pd.DataFrame({"t": pd.array(["2020-01-01 05:00"], dtype=zone)})
    with pytest.raises(jl.ConfigError, match=r"column 't' has dtype timestamp\[us, tz=Asia/"
                                             r"Tokyo\]\[pyarrow\], whose zone .*df\['t'\]"
                                             r"\.dt\.tz_convert\(None\)"):
        jl.ArraySource(df)
    df["t"] = df["t"].dt.tz_convert(None)
    assert jl.ArraySource(df)[0]["t"] == np.datetime64("2019-12-31T20:00")
    df = pl.DataFrame({"t": pl.Series([3_600_000_000], dtype=pl.Datetime("us", "Asia/Tokyo"))})
    with pytest.raises(jl.ConfigError, match=r"column 't' is Datetime.*Asia/Tokyo.*whose zone"
                                             r".*\(df.with_columns\(pl.col\('t'\)"):
        jl.ArraySource(df)
    df = df.with_columns(pl.col('t').dt.convert_time_zone('UTC').dt.replace_time_zone(None))
    assert jl.ArraySource(df)[0]["t"] == np.datetime64("1970-01-01T01:00")
    table = pa.table({"t": pa.array([0], pa.timestamp("s", tz="UTC"))})
    with pytest.raises(jl.ConfigError, match=r"drop the zone \(table\['t'\]\.cast\(pa\."
                                             r"timestamp\('s'\)\)"):
        jl.ArraySource(table)
    assert jl.ArraySource({"t": table["t"].cast(pa.timestamp('s'))})[0]["t"] == np.datetime64(
        0, "s")


def _frames():
    import datetime
    import decimal

    pd = pytest.importorskip("pandas")
    pl = pytest.importorskip("polars")
    return [  # (each remedy was the same "encode it as a category's codes", or to_physical())
        (pd.DataFrame({"c": [decimal.Decimal("1.5"), decimal.Decimal("2")]}),
         "df['c'].astype(float)"),
        (pd.DataFrame({"c": pd.period_range("2020", periods=2, freq="M")}),
         "df['c'].dt.to_timestamp()"),
        (pd.DataFrame({"c": pd.interval_range(0, 2)}), "df['c'].array.left"),
        (pd.DataFrame({"c": pd.Categorical(["a", "b"])}), "df['c'].cat.codes"),
        (pd.DataFrame({"c": ["a", None]}), "df['c'].fillna('').to_numpy(dtype=str)"),
        (pl.DataFrame({"c": [datetime.time(1, 2), datetime.time(3)]}),
         "df['c'].cast(pl.Int64)"),
        (pl.DataFrame({"c": pl.Series(["a", "b"], dtype=pl.Categorical)}),
         "df['c'].to_physical()"),
        (pl.DataFrame({"c": [[1, 2], [3, 4]]}), "df['c'].list.to_array(2)"),
    ]


def test_a_column_numpy_holds_as_objects_is_told_the_remedy_of_its_kind():
    pl = pytest.importorskip("polars")
    for df, call in _frames():
        with pytest.raises(jl.ConfigError, match=r"column 'c' has dtype") as said:
            jl.ArraySource(df)
        assert call.replace("(2)", "(n)") in str(said.value), (call, str(said.value))
        fixed = eval(call, {"df": df, "pl": pl})  # (as the message writes it)
        assert len(jl.ArraySource({"c": fixed})) == 2
    # strings ending with a NUL: to_numpy(dtype=str), the remedy said, cut them without a
    # word (as polars' are refused); records of str leaves keep them (the interop audit)
    pd = pytest.importorskip("pandas")
    nul = pd.DataFrame({"c": ["ab\x00", "cd"]})
    with pytest.raises(jl.ConfigError, match=r"its strings end with a NUL character .*pass "
                                             r"df.to_dict\('records'\)") as said:
        jl.ArraySource(nul)
    assert "to_numpy(dtype=str)" not in str(said.value)


def test_a_restore_over_a_frames_columns_in_another_order_says_so_and_the_order_saved():
    # refused (its fingerprint hashes the leaves in order), told only that the specs differ
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1, 2, 3, 4], "b": [0.5, 1.0, 2.0, 3.0]})
    state = jl.DataLoader(jl.ArraySource(df), batch_size=2).state_dict()
    with pytest.raises(jl.StateDictError, match=r"same in another order: give them in the "
                                                r"order saved, \['a'\], \['b'\] \(a frame: "
                                                r"df\[\['a', 'b'\]\]\)"):
        jl.DataLoader(jl.ArraySource(df[["b", "a"]]), batch_size=2).load_state_dict(state)
    jl.DataLoader(jl.ArraySource(df[['a', 'b']]), batch_size=2).load_state_dict(state)


def test_arrow_embeddings_views_and_null_columns_as_the_review_read_them():
    # a fixed_size_list column (embeddings) was told to_pylist(), k scalar leaves a vector; a
    # string_view column was "Python objects"; a null-type column was told fill_null, which
    # raises for it; a polars Series with a zone was told df.with_columns(...)
    pa = pytest.importorskip("pyarrow")
    pl = pytest.importorskip("polars")
    table = pa.table({"e": pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32(), 2)),
                      "s": pa.array(["a", "bb", "c"], pa.string_view())})
    for workers in (0, 2):
        with jl.DataLoader(jl.ArraySource(table.slice(1)), batch_size=2, num_workers=workers,
                           process_index=0, process_count=1) as loader:
            batch = next(iter(loader))
        assert batch["e"].tolist() == [[3, 4], [5, 6]] and batch["e"].dtype == np.float32
        assert batch["s"].tolist() == ["bb", "c"]
    table = pa.table({"n": pa.array([None, None]), "x": [1, 2]})
    with pytest.raises(jl.ConfigError, match=r"'n' is of Arrow's null type.*"
                                             r"\(table.drop_columns\(\['n'\]\)\)"):
        jl.ArraySource(table)
    assert jl.ArraySource(table.drop_columns(['n']))[1] == {"x": 2}
    with pytest.raises(jl.ConfigError, match=r"null type: every value missing; leave it out$"):
        jl.ArraySource(pa.nulls(3))  # (it was told table.drop_columns([None]))
    zoned = pa.array([[0, 1]], pa.list_(pa.timestamp("s", tz="Asia/Tokyo"), 2))
    table = pa.table({"e": zoned})
    with pytest.raises(jl.ConfigError, match=r"whose zone NumPy's datetime64 has not.*\(table\["
                                             r"'e'\].cast\(pa.list_\(pa.timestamp\('s'\), 2\)\)"):
        jl.ArraySource(table)  # (kept as UTC's without a word)
    assert jl.ArraySource({"e": table['e'].cast(pa.list_(pa.timestamp('s'), 2))})[0][
        "e"].tolist() == [np.datetime64(0, "s"), np.datetime64(1, "s")]
    assert jl.ArraySource(pa.table({"e": pa.array([[], []], pa.list_(pa.float32(), 0))})
                          ).arrays[0].shape == (2, 0)  # (NumPy's reshape error)
    s = pl.Series([1], dtype=pl.Datetime("us", "Asia/Tokyo"))
    with pytest.raises(jl.ConfigError, match=r"drop the zone \(s.dt.convert_time_zone\('UTC'\)"
                                             r".dt.replace_time_zone\(None\):"):
        jl.ArraySource(s)
    assert jl.ArraySource(s.dt.convert_time_zone('UTC').dt.replace_time_zone(None))[0] == \
        np.datetime64(1, "us")


class _Records:
    """A source whose records (or batches) are what ``make`` returns for an index."""

    def __init__(self, make, batched=False):
        self.make, self.batched = make, batched

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return self.make(int(i))

    def __getitems__(self, indices):
        return self.make(list(indices)) if self.batched else [self.make(int(i)) for i in indices]


def _first_batch(source, num_workers=0):
    with jl.DataLoader(source, batch_size=4, num_workers=num_workers, process_index=0,
                       process_count=1) as loader:
        return next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_frames_series_and_arrow_arrays_in_records_are_checked_as_array_source_checks(
        num_workers):
    # a source over a frame returning {"row": df.iloc[i]} batched float64 (ids past 2**53
    # rounded, two users one id) and a nullable leaf's null as NaN, where ArraySource refuses
    # both (the interop audit)
    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    df = pd.DataFrame({"user_id": np.arange(8) + 2**53 + 1, "score": np.linspace(0, 1, 8)})
    refused = (r"batch leaf \['row'\]: record position 0 is a pandas Series indexed by "
               r"\['user_id', 'score'\], each record's named by a label: a DataFrame's row.*"
               r"cast already \(row.to_dict\(\) keeps them so\): read the frame's own "
               r"columns, \{c: df\[c\].iat\[i\] for c in df\}")
    with pytest.raises((jl.CollateError, jl.WorkerError), match=refused):
        _first_batch(_Records(lambda i: {"row": df.iloc[i]}), num_workers)
    # rows labelled alike (pd.concat without ignore_index: every row 0) went past it, as
    # float64 (the interop audit)
    alike = pd.concat([df.iloc[[i]].reset_index(drop=True) for i in range(8)])
    with pytest.raises((jl.CollateError, jl.WorkerError), match=refused):
        _first_batch(_Records(lambda i: {"row": alike.iloc[i]}), num_workers)
    exact = _first_batch(_Records(lambda i: {c: df[c].iat[i] for c in df}))  # (the remedy)
    assert exact["user_id"].tolist() == (np.arange(4) + 2**53 + 1).tolist()
    close = pd.Series(np.linspace(0, 1, 16), name="close")  # (one name for all, not rows:
    windows = _first_batch(_Records(lambda i: {  # a column's windows, a vector of features;
        "w": close.iloc[i:i + 4].reset_index(drop=True),  # the review: refused, once
        "f": pd.Series([0.5, 1.5, i * 1.0], index=["a", "b", "c"], name="features")}))
    assert windows["w"].shape == (4, 4) and windows["f"][2].tolist() == [0.5, 1.5, 2.0]
    if num_workers:
        return
    ints = pd.DataFrame({"a": np.arange(8), "b": np.arange(8) * 2})  # (nothing cast: as before)
    assert _first_batch(_Records(lambda i: {"row": ints.iloc[i]}))["row"][1].tolist() == [1, 2]
    for leaf, said in [(lambda i: pd.array([i, None], dtype="Int64"), r"\(Int64\) has 1 missing"),
                       (lambda i: pd.Categorical([1, None]), r"\(category\) has 1 missing.*"
                                                             r"s.cat.codes"),
                       (lambda i: pa.array([i, None]), r"\(int64\) has 1 null"),
                       (lambda i: df.iloc[i:i + 2], r"is a DataFrame of columns of several")]:
        with pytest.raises(jl.CollateError, match=r"batch leaf \['x'\]: record position 0 "
                                                  + said):
            _first_batch(_Records(lambda i: {"x": leaf(i)}))
    days = pd.Series(np.arange(8) + 2**53 + 1, index=[f"2024-01-0{d}" for d in range(1, 9)])
    batch = _first_batch(_Records(lambda i: {"window": days.iloc[i:i + 3]}))  # (a window of
    assert batch["window"][0].tolist() == (np.arange(3) + 2**53 + 1).tolist()  # a series
    # indexed by strings, not a row: the review)
    with pytest.raises(jl.ConfigError, match=r"ArraySource leaf \['v'\]: expected a NumPy"):
        jl.ArraySource({"v": pd.MultiIndex.from_arrays([[1, 2], [3, 4]])})  # (not pandas' bare
        # NotImplementedError from a Series of it)
    batch = _first_batch(_Records(lambda i: {"w": df[["score"]].iloc[i:i + 2],
                                             "a": pa.array([i, 2]), "s": df["score"].iloc[i:i + 2]}))
    assert batch["w"].shape == (4, 2, 1) and batch["a"].tolist()[1] == [1, 2]
    texts = _first_batch(_Records(lambda i: {"s": pa.array(["a" * (i + 1), None])}))  # (strings
    assert texts["s"].dtype == object and texts["s"][1].tolist() == ["aa", None]  # as objects,
    # as np.asarray made them: a state saved over them restores; the upgrade audit)
    assert batch["s"].dtype == np.float64
    with pytest.raises(jl.CollateError, match=r"batch leaf \['id'\]: the batch's column \(Int64\) "
                                              r"has 1 missing value"):  # (__getitems__'s)
        _first_batch(_Records(lambda rows: {"id": pd.Series([1, None, 3, 4], dtype="Int64")},
                              batched=True))
    with pytest.raises(jl.ConfigError, match=r"ArraySource leaf \['id'\] \(Int64\) has 1 missing"):
        jl.ArraySource({"id": pd.Index([1, None, 3], dtype="Int64")})  # (NaN: the audit)


def test_strings_ending_with_a_nul_are_refused_where_fixed_width_would_cut_it():
    # an Arrow table's and a polars frame's 'ab\x00' read 'ab': NumPy's fixed-width strings
    # take a trailing NUL for their padding
    pa = pytest.importorskip("pyarrow")
    pl = pytest.importorskip("polars")
    for make, remedy in ((pa.table, r"table\.to_pylist\(\)"), (pl.DataFrame, r"df\.to_dicts\(\)")):
        with pytest.raises(jl.ConfigError, match=r"column 'tok' holds strings ending with a NUL "
                                                 rf"character .*; pass {remedy}"):
            jl.ArraySource(make({"tok": ["ab\x00", "c"]}))
        assert jl.ArraySource(make({"tok": ["a\x00b", "c"]}))[0]["tok"] == "a\x00b"  # (inside)
    records = pa.table({"tok": ["ab\x00", "c"]}).to_pylist()  # (the remedy, as written)
    with jl.DataLoader(records, batch_size=2, process_index=0, process_count=1) as loader:
        assert next(iter(loader))["tok"].tolist() == ["ab\x00", "c"]
