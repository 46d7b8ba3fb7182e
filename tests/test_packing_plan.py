"""Packing plans: every token placed once (concat), every record once or reported (fit)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxloader.plans import packing as pp
from jaxloader.base.errors import ConfigError

LENGTHS = st.lists(st.integers(0, 40), min_size=1, max_size=120)


def covered(plan, records, key=0):
    """{record: sorted list of (offset, length)} of the plan's segments for one key."""
    out: dict = {r: [] for r in range(records)}
    for rec, off, n in zip(plan.record, plan.record_offset[:, key], plan.length[:, key]):
        out[int(rec)].append((int(off), int(n)))
    return {r: sorted(v) for r, v in out.items()}


def assert_rows_well_formed(plan):
    assert plan.row_ptr[0] == 0 and np.all(np.diff(plan.row_ptr) >= 1)  # no empty row
    for r in range(plan.rows):
        s = slice(plan.row_ptr[r], plan.row_ptr[r + 1])
        for k, width in enumerate(plan.row_length):
            start, n = plan.row_offset[s, k], plan.length[s, k]
            end = start + n
            assert start.min() >= 0 and end.max() <= width
            assert np.all(start[1:] >= end[:-1]), "segments of a row overlap"


@settings(max_examples=60, deadline=None)
@given(LENGTHS, st.integers(1, 50), st.sampled_from([None, 0, 3]))
def test_concat_places_every_token_exactly_once(lengths, width, seed):
    plan = pp.concat(np.array(lengths), width, seed=seed)
    assert_rows_well_formed(plan)
    for r, pieces in covered(plan, len(lengths)).items():
        at = 0
        for off, n in pieces:  # pieces tile [0, len) with no gap and no overlap
            assert off == at and n > 0
            at += n
        assert at == lengths[r]
    total = sum(lengths)
    assert plan.tokens == total and plan.rows == -(-total // width)
    full = plan.length[:, 0].sum() - plan.length[plan.row_ptr[-2]:, 0].sum() if plan.rows else 0
    assert full == (plan.rows - 1) * width if plan.rows else True  # only the last row pads


@settings(max_examples=60, deadline=None)
@given(LENGTHS, st.integers(1, 50), st.sampled_from(["first_fit", "best_fit"]),
       st.integers(1, 5), st.integers(1, 30), st.sampled_from([None, 1]))
def test_fit_places_each_record_once_split_into_pieces(lengths, width, method, bins, window,
                                                       seed):
    plan = pp.fit(np.array(lengths)[:, None], [width], method=method, bins=bins, window=window,
                  seed=seed)
    assert_rows_well_formed(plan)
    for r, pieces in covered(plan, len(lengths)).items():
        if lengths[r] == 0:
            assert pieces == []  # empty records are skipped
            continue
        expected = [(o, min(width, lengths[r] - o)) for o in range(0, lengths[r], width)]
        assert pieces == expected, r
    assert len(plan.truncated) == 0 and plan.tokens == sum(lengths)


@settings(max_examples=40, deadline=None)
@given(LENGTHS, st.integers(1, 50), st.sampled_from(["first_fit", "best_fit"]))
def test_fit_truncates_overlong_records_and_reports_them(lengths, width, method):
    plan = pp.fit(np.array(lengths), [width], method=method, overlong="truncate", bins=3)
    assert_rows_well_formed(plan)
    for r, pieces in covered(plan, len(lengths)).items():
        assert pieces == ([(0, min(width, lengths[r]))] if lengths[r] else [])
    long = [r for r, n in enumerate(lengths) if n > width]
    assert plan.truncated.tolist() == long
    assert plan.dropped == sum(n - width for n in lengths if n > width)


def test_several_keys_fit_together():
    lengths = np.array([[5, 2], [3, 6], [4, 1], [9, 3]])
    with pytest.warns(UserWarning, match=r"1 record\(s\) .* \(record 3: 'in' 9 of 8, 't' 3 of 6"):
        plan = pp.fit(lengths, [8, 6], method="best_fit", bins=2, seed=None, keys=["in", "t"])
    assert_rows_well_formed(plan)
    for k in range(2):
        got = covered(plan, 4, key=k)
        for r in range(4):  # record 3's inputs (9 > 8) split into 8 + 1, targets 3 + 0
            want = [(0, min(8, lengths[r, 0])), (8, 1)] if (r == 3 and k == 0) else None
            if want:
                assert got[r] == want
            else:
                assert sum(n for _, n in got[r]) == lengths[r, k]


def test_keys_of_one_length_and_row_length_are_cut_together_without_a_word():
    # tokens and their labels (10 and 10 of 8) are cut at the same places; a key with no
    # tokens has no pieces to match; a graph's nodes fit, its edges are cut: warned
    lengths = np.array([[10, 10, 0], [3, 3, 2]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = pp.fit(lengths, [8, 8, 4], seed=None)
    assert plan.length[plan.record == 0].tolist() == [[8, 8, 0], [2, 2, 0]]
    with pytest.warns(UserWarning, match=r"edges without its nodes.*overlong='truncate'"):
        pp.fit(np.array([[5, 10]]), [8, 8], seed=None, keys=["nodes", "edges"])
    with warnings.catch_warnings():  # (the plan in stored order, which a loader's check of a
        warnings.simplefilter("error")  # Parquet order makes: said again, keys unnamed)
        pp.fit(np.array([[5, 10]]), [8, 8], seed=None, warn=False)


def test_best_fit_wastes_less_than_first_fit_on_long_tailed_lengths():
    lengths = np.minimum(np.random.default_rng(0).lognormal(np.log(300), 1.0, 20_000)
                         .astype(np.int64) + 1, 8192)
    first = pp.fit(lengths, [2048], method="first_fit", window=5000)
    best = pp.fit(lengths, [2048], method="best_fit", window=5000)
    assert best.padding_fraction < first.padding_fraction < 0.05
    assert best.padding_fraction < 0.01


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=150), st.integers(30, 40),
       st.booleans(), st.integers(1, 5), st.integers(1, 60))
def test_windows_fitted_in_python_pack_as_the_numpy_steps(lengths, width, best, bins,
                                                          window):
    """Up to PYTHON_WINDOWS windows take a Python loop, window after window; more take NumPy
    steps over all windows at once: the same rows and offsets."""
    n = np.array(lengths, np.int64)[:, None]
    rows, offsets = pp._fit_windows(n, np.array([width]), best, bins, window)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pp, "PYTHON_WINDOWS", 0)
        numpy_rows, numpy_offsets = pp._fit_windows(n, np.array([width]), best, bins, window)
    assert rows.tolist() == numpy_rows.tolist() and offsets.tolist() == numpy_offsets.tolist()


def test_a_plan_is_a_pure_function_of_lengths_and_seed():
    lengths = np.random.default_rng(1).integers(1, 100, 500)
    a, b = pp.fit(lengths, [256], seed=4), pp.fit(lengths.copy(), [256], seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a.record, pp.fit(lengths, [256], seed=5).record)


def test_bad_parameters_are_named():
    with pytest.raises(ConfigError, match=r"method=.*'first_fit', 'best_fit', 'concat'.*'nope'"):
        pp.fit(np.ones(3), [4], method="nope")
    with pytest.raises(ConfigError, match=r"overlong=.*'split', 'truncate'.*'drop'"):
        pp.fit(np.ones(3), [4], overlong="drop")
    with pytest.raises(ConfigError, match=r"bins=...\): expected an int >= 1, got 0"):
        pp.fit(np.ones(3), [4], bins=0)
    with pytest.raises(ConfigError, match="method='concat'.*one packed key, got 2"):
        pp.concat(np.ones((3, 2)), 4)
