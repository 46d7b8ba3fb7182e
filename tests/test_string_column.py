"""A batch's strings as one buffer: the rows come back as they went in, in any order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxloader.batching import collate
from jaxloader.base.string_column import gather, rows_of, split

_TEXT = st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]),
                max_size=12)


def _arrow_like(rows: list, text: bool, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The rows' bytes and offsets as Arrow keeps them (``first`` bytes of another row group's
    before them, as in a slice of a larger buffer)."""
    raw = [r.encode() if text else r for r in rows]
    offsets = np.cumsum([first] + [len(r) for r in raw])
    data = np.frombuffer(b"z" * first + b"".join(raw) + b"tail", np.uint8)
    return data, offsets


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(_TEXT, min_size=1, max_size=30), first=st.integers(0, 5), data=st.data())
def test_any_rows_gathered_in_any_order_come_back_as_str(rows, first, data):
    at = np.array(data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=40)), np.int64)
    rows_ = rows_of([_arrow_like(rows, True, first)], text=True)
    column = gather(rows_, at)
    got = column.objects()
    assert got.dtype == object and len(column) == len(at)
    assert got.tolist() == [rows[i] for i in at] and all(type(r) is str for r in got)


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.lists(st.binary(max_size=6).filter(lambda b: b"\0" not in b),
                               min_size=1, max_size=8), min_size=1, max_size=4),
       firsts=st.lists(st.integers(0, 5), min_size=4, max_size=4),
       wide=st.lists(st.booleans(), min_size=4, max_size=4), data=st.data())
def test_bytes_of_several_row_groups_joined(parts, firsts, wide, data):
    """Each part as Arrow keeps a row group: offsets of 32 or 64 bits from any first value
    (a slice of a larger buffer); the join's offsets are from 0, its bytes one buffer."""
    rows = [r for part in parts for r in part]
    buffers = []
    for p, first, w in zip(parts, firsts, wide):
        raw, offsets = _arrow_like(p, False, first)
        buffers.append((raw, offsets.astype(np.int64 if w else np.int32)))
    joined = rows_of(buffers, text=False)
    assert joined is not None and joined.starts[0] == 0 and joined.starts.dtype == np.int64
    assert joined.starts[-1] == len(joined.data) == sum(len(r) for r in rows)
    at = np.array(data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=20)), np.int64)
    got = gather(joined, at).objects()
    assert got.tolist() == [rows[i] for i in at] and all(type(r) is bytes for r in got)


def test_a_row_holding_a_nul_cannot_be_split_on_it():
    clean = _arrow_like(["a", "b"], True)
    assert rows_of([clean, _arrow_like(["c", "d\0"], True)], text=True) is None  # in any part
    assert rows_of([_arrow_like(["a", "b\0c"], True)], text=True) is None
    assert rows_of([_arrow_like([b"a", b"\0"], False)], text=False) is None
    assert rows_of([_arrow_like(["", ""], True)], text=True) is not None  # empty rows are fine


def test_strings_written_after_the_numbers_are_read_back_from_the_slot():
    rows = rows_of([_arrow_like(["a", "", "naïve ✓"], True)], text=True)
    gathered = {"x": np.arange(3, dtype=np.int64), "text": gather(rows, np.array([2, 1, 0]))}
    slot = bytearray(4096)
    batch, layout = collate.materialize(*collate.gathered_columns(gathered, 3),
                                        lambda n: memoryview(slot)[:n])
    sent = batch["text"]  # what a worker sends beside the slot: the strings' bytes there
    assert sent == sum(len(t.encode()) + 1 for t in ["naïve ✓", "", "a"])  # rows and NULs
    assert layout.size([sent]) == layout.nbytes + sent
    assert layout.leaves[1].offset == collate.TEXT_AFTER
    got = layout.views(np.frombuffer(slot, np.uint8), [sent])
    assert got["x"].tolist() == [0, 1, 2] and got["text"].tolist() == ["naïve ✓", "", "a"]
    in_process, _ = collate.materialize(*collate.gathered_columns(gathered, 3))
    assert in_process["text"].tolist() == ["naïve ✓", "", "a"]


def test_no_rows():
    rows = rows_of([_arrow_like(["a"], True)], text=True)
    assert gather(rows, np.zeros(0, np.int64)).objects().shape == (0,)
    assert split(np.zeros(0, np.uint8), 0, True).shape == (0,)
