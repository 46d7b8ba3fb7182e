"""Packing plans: which record goes to which packed row, at which offset, from lengths alone.

::

    lengths (records x keys) ──> order = shuffle(seed)(records)            (keyed bijection)
      "concat":  cumulative tokens in that order, cut every L             (one key; exact)
      "first_fit" / "best_fit":  windows of W records, each packed into `bins` open rows;
                 a record that fits no open row closes the fullest one and opens a new row;
                 all windows are packed side by side (one NumPy step per record of a window)
      ──> segments (row, offset in row, record, offset in record, length), sorted by row

A plan is a pure function of the lengths and its parameters (``seed`` included), never of a
stream read so far: a loader over packed rows resumes in O(1), with any number of workers or
processes, and each record is placed exactly once (or reported as truncated).

Example:
    >>> plan = fit(np.array([[5], [3], [2], [4]]), [8], method="best_fit", bins=2)
    >>> plan.rows, plan.tokens, plan.padding_fraction
    (2, 14, 0.125)
"""

from __future__ import annotations

import warnings
from typing import Literal, NamedTuple, Sequence, get_args

import numpy as np

from jaxloader.base.errors import ConfigError, JaxloaderWarning
from jaxloader.order.index_shuffle import IndexShuffle

Method = Literal["first_fit", "best_fit", "concat"]
METHODS: tuple[str, ...] = get_args(Method)
PYTHON_WINDOWS = 32  # up to this many windows, fit one after another in Python; more: NumPy
# steps over all at once (a step's cost grows slowly with the windows, a Python loop's fast)
Overlong = Literal["split", "truncate"]
OVERLONG: tuple[str, ...] = get_args(Overlong)


def check_method(label: str, method: object, methods: Sequence[str] = METHODS) -> None:
    """Refuses a packing ``method`` not in ``methods``, naming ``label``."""
    if method not in methods:
        raise ConfigError(f"{label}: expected one of {METHODS}, got {method!r}")


def check_overlong(label: str, overlong: object, method: str) -> None:
    """Refuses an ``overlong`` not in ``OVERLONG``, naming ``label``, with what each does, and
    one other than ``"split"`` with ``method="concat"``, which has no use for it."""
    if overlong not in OVERLONG:
        raise ConfigError(
            f"{label}: expected one of {OVERLONG}, got {overlong!r}; 'split' cuts a record "
            "longer than a row into row-sized pieces, 'truncate' drops the rest")
    if method == "concat" and overlong != "split":
        raise ConfigError(
            f"{label}: {overlong!r} with method='concat', which places every token, cutting "
            "records at the rows' ends; to truncate records longer than a row, pack with "
            "method='best_fit' or 'first_fit'")


def method_of(label: str, method: str | None, bins: int, window: int, window_default: int
              ) -> str:
    """``method``, or ``"concat"`` where it is not given (``None``); refused then with
    ``bins`` or ``window`` other than their defaults, which only a fit reads (``bins=4``
    asked for a fit and got concat's rows, without a word)."""
    given = [f"{name}={value}" for name, value, default in (
        ("bins", bins, 16), ("window", window, window_default)) if value != default]
    if method is None and given:
        raise ConfigError(
            f"{label}: {' and '.join(given)} without method=, which is 'concat' by default: "
            "records packed in their order, a row after another, reading neither; pass "
            "method='best_fit' or 'first_fit' (what bins and window are for), or leave them out")
    return "concat" if method is None else method


class PackingPlan(NamedTuple):
    """Segments sorted by row: row ``r`` holds segments ``row_ptr[r]:row_ptr[r + 1]``.

    ``record``: the record each segment comes from; ``record_offset``, ``row_offset`` and
    ``length`` are ``(segments, keys)``: where the segment starts in the record's sequence and
    in the row, and how many tokens it has, for each packed key. ``truncated``: records cut
    to the row length (``overlong="truncate"``), with ``dropped`` tokens in all.
    """

    row_ptr: np.ndarray
    record: np.ndarray
    record_offset: np.ndarray
    row_offset: np.ndarray
    length: np.ndarray
    row_length: np.ndarray
    truncated: np.ndarray
    dropped: int

    @property
    def rows(self) -> int:
        return len(self.row_ptr) - 1

    @property
    def tokens(self) -> int:
        """Tokens placed, over all keys."""
        return int(self.length.sum())

    @property
    def padding_fraction(self) -> float:
        """The share of the rows' places that hold padding."""
        places = self.rows * int(self.row_length.sum())
        return 1.0 - self.tokens / places if places else 0.0


def order(records: int, seed: int | None) -> np.ndarray:
    """The records in the order they are packed: shuffled by ``seed``, or as stored (None)."""
    if seed is None:
        return np.arange(records, dtype=np.int64)
    return IndexShuffle(records, seed=seed, epoch=0)(np.arange(records, dtype=np.int64))


def concat(lengths: np.ndarray, row_length: int, seed: int | None = 0) -> PackingPlan:
    """Records one after another in ``order(seed)``, cut every ``row_length`` tokens: every
    token is placed exactly once; a record may be cut across rows (each piece its own segment).

    Example:
        >>> p = concat(np.array([3, 4]), 5, seed=None)
        >>> p.row_ptr.tolist(), p.record.tolist(), p.length[:, 0].tolist()
        ([0, 2, 3], [0, 1, 1], [3, 2, 2])
    """
    lengths = np.asarray(lengths, np.int64).reshape(len(lengths), -1)
    if lengths.shape[1] != 1:
        raise ConfigError(
            f"PackedSource(method='concat'): expected one packed key, got {lengths.shape[1]}; "
            "cutting several keys at one place would misalign them: use 'best_fit' or "
            "'first_fit' for several keys"
        )
    records = order(len(lengths), seed)
    n = lengths[records, 0]
    keep = n > 0
    records, n = records[keep], n[keep]
    ends = np.cumsum(n)
    starts = ends - n
    first, last = starts // row_length, (ends - 1) // row_length
    pieces = last - first + 1
    seg_record = np.repeat(records, pieces)
    piece_start = np.repeat(starts, pieces)
    row = np.repeat(first, pieces)
    more = np.flatnonzero(pieces > 1)  # records cut across rows: their later pieces
    if len(more):
        piece = np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(pieces) - pieces,
                                                                pieces)
        row += piece
    begin = np.maximum(piece_start, row * row_length)
    end = np.minimum(np.repeat(ends, pieces), (row + 1) * row_length)
    rows = int(-(-ends[-1] // row_length)) if len(ends) else 0
    return PackingPlan(
        row_ptr=_row_ptr(row, rows), record=seg_record,
        record_offset=(begin - piece_start)[:, None],
        row_offset=(begin - row * row_length)[:, None], length=(end - begin)[:, None],
        row_length=np.array([row_length], np.int64), truncated=np.zeros(0, np.int64), dropped=0)


def fit(lengths: np.ndarray, row_length: Sequence[int] | np.ndarray, *,
        method: str = "best_fit", bins: int = 16, window: int = 10_000,
        overlong: str = "split", seed: int | None = 0,
        keys: Sequence[str] = (), warn: bool = True) -> PackingPlan:
    """First-fit or best-fit packing of whole records (``lengths``: records x keys) into rows
    of ``row_length`` tokens per key, ``bins`` rows open at a time, over windows of ``window``
    records. Records longer than a row are split into row-sized pieces (``overlong="split"``)
    or cut to the row (``"truncate"``, reported in ``truncated``); empty records are skipped.
    ``keys`` names the keys in a warning (``warn``) of records split unaligned.

    Example:
        >>> p = fit(np.array([[6], [2], [5], [3]]), [8], method="first_fit", bins=2, seed=None)
        >>> [p.record[p.row_ptr[r]:p.row_ptr[r + 1]].tolist() for r in range(p.rows)]
        [[0, 1], [2, 3]]
    """
    check_method("PackedSource(method=...)", method, ("first_fit", "best_fit"))
    check_overlong("PackedSource(overlong=...)", overlong, method)
    for name, value in (("bins", bins), ("window", window)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"PackedSource({name}=...): expected an int >= 1, got {value!r}")
    limit = np.asarray(row_length, np.int64)
    lengths = np.asarray(lengths, np.int64).reshape(len(lengths), -1)
    records = order(len(lengths), seed)
    n = lengths[records]
    keep = n.sum(axis=1) > 0
    records, n = records[keep], n[keep]
    over = np.any(n > limit, axis=1)
    truncated, dropped = np.zeros(0, np.int64), 0
    if overlong == "truncate":
        truncated = np.sort(records[over])
        dropped = int((n - np.minimum(n, limit)).sum())
        items, start, n = records, np.zeros_like(n), np.minimum(n, limit)
    else:  # pieces of one row each, then the rest: pieces[i] of a record
        if warn:
            _warn_unaligned(records[over], n[over], limit, keys)
        pieces = np.max(-(-n // limit), axis=1)
        items = np.repeat(records, pieces)
        piece = np.arange(len(items), dtype=np.int64) - np.repeat(np.cumsum(pieces) - pieces,
                                                                  pieces)
        start = piece[:, None] * limit
        n = np.clip(np.repeat(n, pieces, axis=0) - start, 0, limit)
    row, offset = _fit_windows(n, limit, method == "best_fit", bins, window)
    # Within a row, items were placed in item order, each after the last: a stable sort by
    # row alone keeps them in offset order (and is ~30x faster than sorting by both).
    by_row = np.argsort(row, kind="stable")
    return PackingPlan(
        row_ptr=_row_ptr(row[by_row], int(row.max()) + 1 if len(row) else 0),
        record=items[by_row], record_offset=start[by_row], row_offset=offset[by_row],
        length=n[by_row], row_length=limit, truncated=truncated, dropped=dropped)


def _warn_unaligned(records: np.ndarray, n: np.ndarray, limit: np.ndarray,
                    keys: Sequence[str]) -> None:
    """Warns of records to split (longer than a row under a key) whose keys' pieces do not
    match: each key is cut at its row length, so a piece of a graph's edges lands in a row
    with none of its nodes. Only keys of one length and one row length (tokens and their
    labels) are cut at the same places; a key with no tokens has no pieces to match. (A
    warning, not a refusal: plans made so before are kept, states over them restore.)"""
    if n.shape[1] < 2 or not len(records):
        return
    has = n > 0
    first = np.argmax(has, axis=1)  # (a record to split has tokens under some key)
    same = np.all(~has | ((n == n[np.arange(len(n)), first][:, None])
                          & (limit == limit[first][:, None])), axis=1)
    bad = np.flatnonzero(~same)
    if len(bad):
        i = bad[np.argmin(records[bad])]
        names = list(keys) if len(keys) == n.shape[1] else list(range(n.shape[1]))
        held = ", ".join(f"{k!r} {int(a)} of {int(b)}" for k, a, b in zip(names, n[i], limit))
        warnings.warn(
            f"PackedSource(overlong='split'): {len(bad)} record(s) are longer than a row and "
            f"their keys are cut at other places (record {int(records[i])}: {held} tokens): "
            "a piece of one key lands in a row without the matching piece of another (a "
            "decoder's targets without their inputs, a graph's edges without its nodes); "
            "where a record's keys belong together, pass overlong='truncate' (each key cut "
            "to its row, the records listed in .truncated), row lengths that hold them, or "
            "drop them before packing (jl.FilteredSource)", JaxloaderWarning, stacklevel=4)


def _fit_windows(n: np.ndarray, limit: np.ndarray, best: bool, bins: int,
                 window: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows and offsets of items ``n`` (items x keys), packed window by window; every window
    advances one item per NumPy step, all windows at once."""
    items, keys = n.shape
    width = max(1, min(window, items))
    count = -(-items // width)
    if count <= PYTHON_WINDOWS and keys == 1:  # few windows (a stream's one): a Python loop
        rows_py: list[int] = []  # (one window of 1,000: 2.6 against 84 ms)
        offsets_py: list[int] = []
        rows_before = 0
        for lo in range(0, items, width):  # each window's rows after the window before's
            rows_w, offsets_w = fit_one_window(n[lo:lo + width, 0].tolist(), int(limit[0]),
                                               best, bins)
            rows_py += [r + rows_before for r in rows_w]
            offsets_py += offsets_w
            rows_before += max(rows_w) + 1  # its rows are 0.. in the order they opened
        return np.array(rows_py, np.int64), np.array(offsets_py, np.int64).reshape(-1, 1)
    lens = np.zeros((count * width, keys), np.int64)
    lens[:items] = n
    lens = lens.reshape(count, width, keys)
    valid = (np.arange(count * width) < items).reshape(count, width)
    space = np.broadcast_to(limit, (count, bins, keys)).copy()
    bin_row = np.full((count, bins), -1, np.int64)
    opened = np.zeros(count, np.int64)
    rows = np.empty((count, width), np.int64)
    offsets = np.empty((count, width, keys), np.int64)
    w = np.arange(count)
    for j in range(width):
        need = lens[:, j, :]
        fits = np.all(space >= need[:, None, :], axis=2)
        if best:
            left = np.where(fits, (space - need[:, None, :]).sum(axis=2), np.iinfo(np.int64).max)
            choice = np.argmin(left, axis=1)
        else:
            choice = np.argmax(fits, axis=1)
        none = ~fits[w, choice]  # no open row has room: close the fullest, open a new one
        if none.any():
            choice[none] = np.argmin(space[none].sum(axis=2), axis=1)
            space[none, choice[none]] = limit
        new = valid[:, j] & (none | (bin_row[w, choice] < 0))
        if new.any():
            bin_row[new, choice[new]] = opened[new]
            opened[new] += 1
        rows[:, j] = bin_row[w, choice]
        offsets[:, j] = limit - space[w, choice]
        space[w, choice] -= need
    base = np.cumsum(opened) - opened  # windows' rows one after another
    rows += base[:, None]
    return rows.reshape(-1)[:items], offsets.reshape(-1, keys)[:items]


def fit_one_window(lengths: list[int], limit: int, best: bool,
                   bins: int) -> tuple[list[int], list[int]]:
    """``_fit_windows`` for one key and one window, item by item in Python: the same rows
    and offsets (a test compares them). Each length is in ``1..limit``.

    Example:
        >>> fit_one_window([6, 2, 5, 3], 8, best=True, bins=2)
        ([0, 0, 1, 1], [0, 6, 0, 5])
    """
    space = [limit] * bins
    bin_row = [-1] * bins
    opened = 0
    rows, offsets = [], []
    for need in lengths:
        choice, left = -1, limit + 1
        for b, room in enumerate(space):  # best: the least room left; first: the first
            if need <= room and room - need < left:
                choice, left = b, room - need
                if not best:
                    break
        if choice < 0:  # no open row has room: close the fullest, open a new one
            choice = space.index(min(space))
            space[choice] = limit
            bin_row[choice] = -1
        if bin_row[choice] < 0:
            bin_row[choice] = opened
            opened += 1
        rows.append(bin_row[choice])
        offsets.append(limit - space[choice])
        space[choice] -= need
    return rows, offsets


def _row_ptr(row: np.ndarray, rows: int) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.bincount(row, minlength=rows))]).astype(np.int64)
