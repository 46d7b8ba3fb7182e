"""``check_packed_order``: what an order of a ``PackedSource``'s rows reads of the Parquet
files under it at once, against their cache (``PackedSource.check_order``).

A packed row holds several records. With ``seed=``, they come from all over the source, so
any order of the rows reads from every row group at once. With ``seed=None`` a row's records
are neighbours: a block of rows reads the row groups its records are in (``spans``), about one
or two for a block of one row group's worth of rows, and a ``LocalShuffle`` of the rows reads
the row groups of ``window`` blocks at a time. The files' own check
(``parquet_footers.check_order``) warns where that is more than the cache holds, with a
window of blocks that fits.

Example:
    >>> spans_of(np.array([0, 0, 1, 1, 2]), np.array([0, 2, 4, 5]), np.array([0, 2, 3]))
    array([2, 1])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxloader.base.abilities import order_check_of
from jaxloader.derived.filtered import FilteredSource
from jaxloader.order.local_shuffle import LocalShuffle
from jaxloader.plans import packing as packing_plan
from jaxloader.sources import parquet_footers
from jaxloader.sources.mapped import MapSource
from jaxloader.sources.parquet import ParquetSource


def check_packed_order(packed: Any, shuffle: Any) -> None:
    """``PackedSource.check_order``: warns (``PerformanceWarning``) where ``shuffle`` of
    ``packed``'s rows reads from more row groups at once than the Parquet files' cache holds,
    with the remedies (``cache_bytes=``; ``seed=None`` and a ``LocalShuffle`` of the rows that
    fits)."""
    seed = packed.config["seed"]
    files, rows_of = _parquet_under(packed.source)
    if files is None:  # (a source of the user's with a check: its records' full shuffle)
        check = order_check_of(packed.source)
        if check is not None and (seed is not None or shuffle is True):
            check(True)
        return
    if seed is None and shuffle is False:
        return  # (the rows in stored order: their records' too)
    plan, count = packed.plan, len(files._group_bytes)
    if seed is None and isinstance(shuffle, LocalShuffle):
        groups = files._starts.searchsorted(rows_of(plan.record), side="right") - 1
        starts = shuffle.block_starts(packed, len(packed))
        spans = np.sort(spans_of(groups, plan.row_ptr, starts))[::-1]
        count = int(spans[:shuffle.window].sum())
    per_group = max(1, round(len(packed) / len(files._group_bytes)))

    def told(fits: int) -> tuple[str, str]:
        stored = plan if seed is None else _stored_order(packed)  # (seed=None's rows)
        advised = np.sort(spans_of(
            files._starts.searchsorted(rows_of(stored.record), side="right") - 1,
            stored.row_ptr, _blocks(per_group, stored.rows)))[::-1]
        window = int(np.searchsorted(np.cumsum(advised), fits, side="right"))
        local = (f"shuffle=jl.LocalShuffle(window={window}, block_size={per_group}) of the "
                 f"rows, which reads up to {int(advised[:window].sum())} row group(s) at a "
                 "time" if window else "a LocalShuffle of the rows (not one block of them "
                 "fits: it needs that much)")
        if seed is not None:
            return (f"PackedSource(seed={seed}) packs records from all over the files into "
                    f"each row, so its rows read from all {count} row groups at once, "
                    "whatever the loader's shuffle"), (
                "or PackedSource(seed=None), whose rows pack neighbouring records (the loader "
                f"still shuffles the rows), with {local}")
        if isinstance(shuffle, LocalShuffle):
            return (f"{shuffle!r} of a PackedSource's rows (blocks of "
                    f"{int(shuffle.block_starts(packed, len(packed))[1])} rows) reads up to "
                    f"{count} row group(s) at a time"), f"or {local}"
        return (f"a full shuffle (shuffle=True) of a PackedSource's rows reads from all "
                f"{count} row groups at once"), f"or {local}"

    parquet_footers.check_order(files, True, (count, told))


def _stored_order(packed: Any) -> Any:
    """``packed``'s plan with ``seed=None``: its rows as the advice would pack them."""
    config = {**packed.config, "seed": None}
    if config.pop("method") == "concat":
        return packing_plan.concat(packed._lengths, int(packed.row_length[0]), None)
    return packing_plan.fit(packed._lengths, packed.row_length, method=packed.config["method"],
                            warn=False, **config)  # (the source warned as it was made)


def spans_of(groups: np.ndarray, row_ptr: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """How many row groups each block of rows (``starts``, the row count last) reads: from
    the least to the greatest row group of its segments' records (``groups``, a segment's;
    ``row_ptr``, where each row's segments start)."""
    first = row_ptr[starts[:-1]]
    return np.maximum.reduceat(groups, first) - np.minimum.reduceat(groups, first) + 1


def _blocks(size: int, rows: int) -> np.ndarray:
    return np.append(np.arange(0, rows, size, dtype=np.int64), rows)


def _parquet_under(source: Any) -> tuple[ParquetSource | None, Any]:
    """The ``ParquetSource`` under ``source`` through ``MapSource``s (the same records) and
    ``FilteredSource``s (some of them), and the function from ``source``'s records to its
    rows; ``(None, None)`` where another source is in between."""
    maps: list[np.ndarray] = []
    while isinstance(source, (MapSource, FilteredSource)):
        if isinstance(source, FilteredSource):
            maps.append(source.indices)
        source = source.source
    if not isinstance(source, ParquetSource):
        return None, None

    def rows_of(records: np.ndarray) -> np.ndarray:
        for indices in maps:
            records = indices[records]
        return records
    return source, rows_of
