"""What a Parquet source's footers are checked for where the source is made: the columns asked
for (in the files, once each, with values), the rows the footers count, the nulls they count.

Example:
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> path = tempfile.mkdtemp() + "/a.parquet"
    >>> pq.write_table(pa.table({"id": [1, None]}), path)
    >>> try:
    ...     check_nulls(path, pq.ParquetFile(path).metadata, ["id"])
    ... except ConfigError as e:
    ...     print(str(e).replace(path, "a.parquet")[:61])
    ParquetSource: column 'id' of 'a.parquet' has 1 null value(s)
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from jaxloader.base.errors import ConfigError
from jaxloader.sources.arrow_columns import null_message
from jaxloader.sources.arrow_numpy import zone_in


def check_chosen(paths: Sequence[str], metas: list, schemas: list, first: int,
                 chosen: list[str]) -> None:
    """Refuses a column of ``chosen`` that the file ``first`` (whose schema the others must
    share) lacks, naming the files that hold it; one its schema holds twice (pyarrow's
    ``KeyError``, "does not exist", named no file); one of no values at all (Arrow's ``null``
    type, an all-null column: refused at its first row group, epochs in)."""
    schema = schemas[first]  # (each file's Arrow schema: ``schemas``)
    available = list(schema.names)
    known = set(available)
    missing = [c for c in chosen if c not in known]
    if missing:
        elsewhere = [p for p, other in zip(paths, schemas)
                     if set(missing) & set(other.names)]
        raise ConfigError(
            f"ParquetSource(columns): {missing} not in {paths[first]!r}, whose columns are "
            f"{available}" + (
                f", though {elsewhere[0]!r}{' and others' if len(elsewhere) > 1 else ''} "
                "holds them: the files' schemas differ; read them in separate sources (and "
                "ConcatSource them after a Map that makes them alike), or pass columns= those "
                "every file holds" if elsewhere else "; pass columns= some of them"))
    wanted = set(chosen)
    for path, other in zip(paths, schemas):
        counts = Counter(other.names)
        twice = sorted(name for name in wanted if counts[name] > 1)
        if twice:
            raise ConfigError(
                f"ParquetSource: {path!r} holds the column {twice[0]!r} {counts[twice[0]]} "
                f"times (its columns: {list(other.names)}); a column is read by its name: write "
                "the file again with names of their own (table.rename_columns), or pass "
                "columns= others")
        for name in (c for c in chosen if c in other.names):
            repeated = repeated_field(other.field(name).type, name)
            if repeated is not None:  # (a record's dict kept the last field's values alone)
                raise ConfigError(
                    f"ParquetSource: column {name!r} of {path!r} holds the struct field "
                    f"{repeated[0]!r} {repeated[1]} times ({other.field(name).type!s:.200}); a "
                    "field is read by its name, so the others' values would be lost: write the "
                    "file again with fields of names of their own, or leave the column out with "
                    "columns=")
    for c in chosen:
        zone = zone_in(schema.field(c).type)
        if zone is not None:  # (its times came out as UTC's datetime64, the zone dropped)
            raise ConfigError(
                f"ParquetSource: column {c!r} of {paths[first]!r} holds times in the zone "
                f"{zone!r} ({schema.field(c).type}), which NumPy's datetime64 has not: its "
                "values would come out as the instants in UTC, their hours UTC's, without a "
                "word; write them in UTC (df[name].dt.tz_convert('UTC')) or as local times "
                "without a zone (.dt.tz_localize(None)), or leave the column out with columns=")
    rows = [(other, meta) for other, meta in zip(schemas, metas) if meta.num_rows]
    empty = [c for c in chosen if rows and str(schema.field(c).type) == "null" and all(
        str(other.field(c).type) == "null" for other, _ in rows
        if c in other.names)]  # (values in another file: its type differs, said so there)
    if empty:
        raise ConfigError(
            f"ParquetSource: column {empty[0]!r} of {paths[first]!r} is of Arrow type null in "
            "every file with rows (every value missing: pandas writes an all-None column so), "
            "so no batch can hold it; leave it out with columns=, or write it with values and "
            "a type")


def repeated_field(kind: Any, path: str) -> tuple[str, int] | None:
    """The first field a struct in Arrow type ``kind`` holds twice, at any depth (in lists,
    structs, maps), as ``(its path from column path, times)``; ``None`` where none.

    Example:
        >>> import pyarrow as pa
        >>> twice = pa.struct([("a", pa.int8()), ("a", pa.int8())])
        >>> repeated_field(pa.list_(twice), "s"), repeated_field(pa.int8(), "s")
        (('s[].a', 2), None)
    """
    import pyarrow as pa

    if isinstance(kind, pa.BaseExtensionType):
        kind = kind.storage_type
    if pa.types.is_struct(kind):
        fields = [kind.field(i) for i in range(kind.num_fields)]
        counts = Counter(f.name for f in fields)
        twice = next((f.name for f in fields if counts[f.name] > 1), None)
        if twice is not None:
            return f"{path}.{twice}", counts[twice]
        inner = [(f"{path}.{f.name}", f.type) for f in fields]
    elif pa.types.is_map(kind):
        inner = [(f"{path}.key", kind.key_type), (f"{path}.value", kind.item_type)]
    elif hasattr(kind, "value_type"):  # (lists of any kind, a dictionary's values)
        inner = [(f"{path}[]", kind.value_type)]
    else:
        return None
    return next((found for at, inner_kind in inner
                 if (found := repeated_field(inner_kind, at)) is not None), None)


def check_rows(paths: Sequence[str], metas: list, rows: list[int]) -> None:
    """A ``ConfigError`` where a file's footer counts other rows than its row groups do (a
    damaged footer: a row group that claims 10**15 rows was read as that many)."""
    at = 0
    for path, meta in zip(paths, metas):
        counted = sum(rows[at:at + meta.num_row_groups])
        at += meta.num_row_groups
        fewest = min(rows[at - meta.num_row_groups:at], default=0)
        if counted != meta.num_rows or fewest < 0:
            raise ConfigError(
                f"ParquetSource: file {path!r}: its footer counts {meta.num_rows:,} rows, its "
                f"row groups {counted:,}" + (f" (one of them {fewest:,})" if fewest < 0 else "")
                + ": the footer is damaged; write the file again, or leave it out of the "
                "source's paths")


def check_nulls(path: str, meta: Any, columns: list[str], schema: Any = None) -> None:
    """A ``ConfigError`` where the footer of the file at ``path`` counts a null in a column
    read, so that it is refused where the source is made, not epochs into a run as its row
    group is decoded. Only columns outside lists are counted: a list's values count an empty
    list as a null (those nulls are found as they are decoded), as does a file written without
    statistics."""
    # each column's leaves by position (a name can hold a dot: "user.id" beside "user"); by
    # their paths where the count is not the file's (a type stored in leaves not counted)
    owners: list[str] = []
    for field in schema if schema is not None else meta.schema.to_arrow_schema():
        owners += [field.name] * leaf_count(field.type)
    schema = [meta.schema.column(i) for i in range(meta.num_columns)]
    if len(owners) != len(schema):
        owners = [next((c for c in columns if leaf.path == c or leaf.path.startswith(c + ".")),
                       "") for leaf in schema]
    read = set(columns)
    leaves = [i for i, leaf in enumerate(schema)  # (a required leaf holds no null)
              if owners[i] in read
              and leaf.max_repetition_level == 0 and leaf.max_definition_level > 0]
    start = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for i in leaves:
            stats = group.column(i).statistics
            if stats is not None and stats.has_null_count and stats.null_count:
                rows = f"rows {start}-{start + group.num_rows - 1}"
                raise ConfigError(null_message(
                    meta.schema.column(i).path, path,
                    f"{stats.null_count} null value(s) in row group {g} ({rows} of the file), "
                    "its footer says", column=owners[i],
                    floats=meta.schema.column(i).physical_type in ("FLOAT", "DOUBLE")))
        start += group.num_rows


def leaf_count(kind: Any) -> int:
    """The Parquet leaf columns an Arrow type is stored in (a struct's fields, a map's key
    and value, a list's values)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return sum(leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return leaf_count(kind.key_type) + leaf_count(kind.item_type)
    if isinstance(kind, pa.BaseExtensionType):
        return leaf_count(kind.storage_type)
    if hasattr(kind, "value_type") and not pa.types.is_dictionary(kind):  # (lists, views)
        return leaf_count(kind.value_type)
    return 1
