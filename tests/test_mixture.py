"""Weighted mixtures: proportions in every window, each component in its own epochs, exact and
elastic resume, weight changes that leave earlier steps alone."""

from __future__ import annotations

import itertools
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxloader as jl
from jaxloader.batching.mixture_sampler import _SPAN, MixtureSampler
from resume_harness import assert_same_stream, check_resume, check_split_resume, take

LENGTHS = (600, 250, 77)
WEIGHTS = (0.5, 0.3, 0.2)


def components():
    return [jl.ArraySource({"c": np.full(n, c, np.int64), "i": np.arange(n, dtype=np.int64)})
            for c, n in enumerate(LENGTHS)]


def sampler(weights=WEIGHTS, batch_size=1000, from_step=None, **kw):
    kw = {"shuffle": True, "seed": 7, "last_batch": "drop", **kw}
    return MixtureSampler(jl.mix(components(), weights, from_step), batch_size, **kw)


def component_of(indices):
    offsets = np.cumsum((0,) + LENGTHS)
    return np.searchsorted(offsets, indices, side="right") - 1


def test_every_window_of_10000_positions_is_within_1_percent_of_the_weights():
    s = sampler()
    positions = np.arange(300_000)
    comps = component_of(s.indices(positions))
    counts = np.stack([np.concatenate([[0], np.cumsum(comps == c)]) for c in range(3)])
    starts = np.arange(0, len(positions) - 10_000, 37)  # windows at every alignment, stepped
    shares = (counts[:, starts + 10_000] - counts[:, starts]) / 10_000
    worst = np.abs(shares - np.asarray(WEIGHTS)[:, None]).max()
    assert worst < 0.01, worst


def test_each_component_reads_its_records_once_per_epoch_of_its_own_reshuffled():
    s = sampler()
    offsets = np.cumsum((0,) + LENGTHS)
    for c, n in enumerate(LENGTHS):
        records = s._component_reads(c, np.arange(3 * n)) - offsets[c]  # its j-th reads, j = 0, 1, ...
        epochs = records.reshape(3, n)
        assert all(sorted(e.tolist()) == list(range(n)) for e in epochs)
        assert not np.array_equal(epochs[0], epochs[1])  # reshuffled as it wraps
    # In the stream: up to a block boundary, every record of a component is read as often as
    # every other one of it, give or take one (a small component has wrapped several times).
    indices = s.indices(np.arange(20 * s._block))
    for c, n in enumerate(LENGTHS):
        reads = np.bincount(indices[component_of(indices) == c] - offsets[c], minlength=n)
        assert reads.max() - reads.min() <= 1 and reads.min() >= 1, (c, reads.min(), reads.max())


@pytest.mark.parametrize("global_batch, components, block", [
    (256, 3, 256), (4096, 3, 1024), (300, 3, 300), (8, 3, 8), (5, 3, 1024), (1536, 3, 768),
    (256, 40, 1560), (60, 8, 60), (64, 9, 1024)])
def test_a_block_is_the_largest_divisor_of_the_global_batch_up_to_1024(global_batch,
                                                                        components, block):
    # a step then holds whole blocks (a worker lays out only its own steps' blocks); at least
    # m * (m - 1) positions for m components, so rounding never takes a share below zero
    parts = [jl.ArraySource({"x": np.arange(10)}) for _ in range(components)]
    s = MixtureSampler(jl.mix(parts, [1] * components), global_batch, shuffle=True, seed=0,
                       last_batch="drop")
    assert s._block == block


def test_the_plan_is_a_pure_function_of_position():
    a, b = sampler(), sampler()
    b.indices(np.arange(5000, 9000))  # other memos first
    # a batch's positions (consecutive: the memoised span of blocks) and the same scattered
    # (block by block) give the same indices
    consecutive = np.arange(5000, 9000)
    assert np.array_equal(a.indices(consecutive), b.indices(consecutive[::-1])[::-1])
    positions = np.random.default_rng(0).integers(0, 10**9, 500)
    assert np.array_equal(a.indices(positions), b.indices(positions))
    swapped = np.array([5000, 5002, 5001, 5003])  # a range, not in order: no slice of it
    assert np.array_equal(a.indices(swapped), a.indices(consecutive)[[0, 2, 1, 3]])
    assert np.array_equal(a.indices(np.arange(100)), sampler(seed=7).indices(np.arange(100)))
    assert not np.array_equal(a.indices(np.arange(100)), sampler(seed=8).indices(np.arange(100)))


@pytest.mark.parametrize("process_count", [2, 3])
def test_each_process_computes_its_own_rows_of_the_global_batches(process_count):
    # a process's memo holds its own rows of a span of steps; together they are the batches
    # of one process with the whole global batch, across spans, epochs and a weight change
    change = {70: (0.2, 0.2, 0.6)}
    whole = sampler(batch_size=24 * process_count, from_step=change)
    shares = [sampler(batch_size=24, from_step=change, process_index=p,
                      process_count=process_count) for p in range(process_count)]
    for step in list(range(0, 400)) + [10**6 + 3, 5]:
        joined = np.concatenate([s.batch(step).indices for s in shares])
        assert np.array_equal(joined, whole.batch(step).indices), step
        assert all(m.shape[1] == 24 for m in shares[1]._memo.classes.values())  # its own rows only


@settings(max_examples=40, deadline=None)
@given(batch_size=st.integers(1, 300), processes=st.integers(1, 3), stride=st.integers(1, 3),
       shuffle=st.booleans(), data=st.data())
def test_a_batch_is_the_plan_at_its_positions(batch_size, processes, stride, shuffle, data):
    # a memo lays out the blocks of its steps directly (whole blocks, part of them, or no
    # block size dividing the global batch): the same as the plan asked position by position
    index = data.draw(st.integers(0, processes - 1))
    s = sampler(batch_size=batch_size, process_index=index, process_count=processes,
                memo_stride=stride, shuffle=shuffle)
    plan = sampler(batch_size=batch_size, process_count=processes, shuffle=shuffle)
    for step in data.draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=4)):
        positions = step * s.global_batch_size + index * batch_size + np.arange(batch_size)
        expected = plan.indices(positions[::-1])[::-1]  # one at a time, the general path
        assert np.array_equal(s.batch(step).indices, expected), step


class _Huge:
    """A source of 3 * 2**31 records, none stored: only its length and its reads matter."""

    def __len__(self):
        return 3 << 31

    def __getitem__(self, index):
        return {"x": np.int64(index)}


def test_a_component_of_more_than_2_31_records_is_shuffled_in_64_bit_words():
    # the tight shuffle computes in 32-bit words up to 2**31 records, in 64-bit ones above
    s = MixtureSampler(jl.mix([_Huge(), components()[0]], [0.9, 0.1]), 1024, shuffle=True,
                       seed=1, last_batch="drop")
    indices = np.concatenate([s.batch(step).indices for step in (0, 1, 10**7)])
    huge = indices[indices < 3 << 31]
    assert len(np.unique(huge)) == len(huge) > 2500  # 90% of 3,072 reads, none twice
    assert len(indices) - len(huge) > 250 and (indices < (3 << 31) + LENGTHS[0]).all()
    assert huge.max() > 2**32  # spread over the whole component, not its first 2**32
    assert np.array_equal(indices[:1024], s.indices(np.arange(1024)))


def test_a_strided_memo_computes_only_the_class_of_steps_asked_for():
    # with N workers, worker s % N usually makes step s: its memo holds only those steps of
    # the span; asked in any order, every step's indices are the same as with one memo
    whole, strided = sampler(batch_size=64), sampler(batch_size=64, memo_stride=3)
    span_steps = _SPAN * 3 // 64  # positions a class of steps holds x classes / batch
    rng = np.random.default_rng(0)
    for span in (0, 1, 7):  # each span's steps in a random order
        # (the one memo asked in order: out of order it would compute its span at each step
        # of another span, as a memo holds one)
        expected = {step: whole.batch(step).indices
                    for step in range(span * span_steps, (span + 1) * span_steps)}
        for step in span * span_steps + rng.permutation(span_steps):
            assert np.array_equal(strided.batch(step).indices, expected[step]), step
    step = 10 * span_steps + 4  # a new span: its class only, a third of the span's steps
    strided.batch(step)
    in_class = [s for s in range(10 * span_steps, 11 * span_steps) if s % 3 == step % 3]
    assert list(strided._memo.classes) == [step % 3]
    assert len(strided._memo.classes[step % 3]) == len(in_class) < span_steps // 2


@pytest.mark.parametrize("case, digest", [
    ("b-True-0", "c68a092d16878020"), ("b-True-1", "b6a060bd0f44b739"),
    ("b-False-1", "dda41e03a8605247"), ("c-True-0", "800f9a0204aaabee"),
    ("d-True-0", "71756e4f177ff41f")])
def test_the_order_is_the_one_its_number_names(case, digest):
    # digests of the indices of the state's version (loaders.state.STATE_VERSION): a restore after
    # an upgrade must read what the checkpointed run would have read, so a change of order must
    # change the number, or mark its states (2026-12-03: components of up to 4,096 records
    # shuffled exactly, "exact_shuffle"; a state without it refused past step 0; 2026-12-06:
    # blocks across batches read each component in order, "reads_in_order"; a state without
    # it refused inside a block)
    import hashlib

    name, shuffle, process_index = case.split("-")
    lengths, weights, from_step, batch_size, process_count = {
        "b": ((5000, 3000, 2000), [0.5, 0.3, 0.2], {40: [1, 1, 0], 300: [0.1, 0.1, 0.8]}, 64, 2),
        "c": ((70000, 13, 9999, 1), [0.4, 0.3, 0.2, 0.1], None, 256, 1),
        "d": ((3000, 2000, 1000), [0.2, 0.3, 0.5], None, 5, 1)}[name]  # blocks of 1,024
    parts = [jl.ArraySource({"x": np.arange(n)}) for n in lengths]
    s = MixtureSampler(jl.mix(parts, weights, from_step), batch_size, shuffle=shuffle == "True",
                       seed=7, last_batch="drop", process_index=int(process_index),
                       process_count=process_count)
    steps = list(range(0, 400)) + list(range(12345, 12400))
    indices = np.stack([s.batch(step).indices for step in steps]).astype("<i8")
    assert hashlib.sha256(indices.tobytes()).hexdigest()[:16] == digest


@pytest.mark.parametrize("shuffle", [True, False])
def test_blocks_across_batches_read_each_component_in_its_epochs_in_turn(shuffle):
    # 4 components of 200, batch 8 (no divisor >= 12: blocks of 1,024 across 128 batches):
    # a component's 256 reads of a block went to positions all over it, its epoch 1's among
    # its epoch 0's: a pass read 140 records twice and 140 never (batch 12: none)
    parts = [jl.ArraySource({"x": np.arange(c * 1000, c * 1000 + 200)}) for c in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a batch not holding each component's share: said)
        loader = jl.DataLoader(jl.mix(parts, [1, 1, 1, 1]), batch_size=8, shuffle=shuffle,
                               seed=0, num_epochs=1, process_index=0, process_count=1)
    with loader:
        x = np.concatenate([b["x"] for b in loader])
    for c in range(4):  # each component's reads: its epoch 0 whole before any of epoch 1
        mine = x[x // 1000 == c]
        first = mine[:200]
        assert len(np.unique(first)) == len(first), (c, len(first) - len(np.unique(first)))
        if not shuffle:
            assert (mine[:200] == np.arange(c * 1000, c * 1000 + 200)[:len(first)]).all()
    assert len(np.unique(x)) >= 780  # (a component's share of a pass: a block's, to a few)
    state = dict(loader.state_dict(), step=3)  # (inside a block: refused without the mark)
    state.pop("reads_in_order")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = jl.DataLoader(jl.mix(parts, [1, 1, 1, 1]), batch_size=8, shuffle=shuffle,
                              seed=0, num_epochs=1, process_index=0, process_count=1)
    with again, pytest.raises(jl.StateDictError, match=r"saved at step 3 by a jaxloader "
                                                       r"before 2026-12-06.*blocks of 1,024"):
        again.load_state_dict(state)


def make(num_workers=0, batch_size=8, process_index=0, process_count=1, from_step=None):
    return lambda: jl.DataLoader(
        jl.mix(components(), WEIGHTS, from_step), batch_size=batch_size, shuffle=True, seed=3,
        num_workers=num_workers, num_epochs=None, transforms=[jl.Map(lambda r: r)],
        process_index=process_index, process_count=process_count)


@pytest.mark.parametrize("k", [3, 117])  # 927 records / global batch 8: epoch 0 ends at 115
def test_resume_into_other_worker_and_process_counts(k):
    check_resume(make(), total=k + 6, k=k, make_restored=make(num_workers=2))
    check_split_resume(make, batch_size=8, k=k, steps=6, keys=("c", "i"))


def test_a_weight_change_leaves_earlier_steps_alone_and_restores_exactly():
    change = {500: (0.0, 0.0, 1.0)}  # from step 500 (position 4,000): the third component only
    with make()() as plain, make(from_step=change)() as changed:
        before, after = take(plain, 600), take(changed, 600)
    assert_same_stream(after[:500], before[:500])
    # blocks divide the global batch (8 positions here): in force from the step itself
    assert (np.concatenate([b["c"] for b in after[500:]]) == 2).all()
    # a state saved before the change restores into the changed loader: the change may be new
    with make()() as first:
        take(first, 200)
        state = first.state_dict()
    with make(from_step=change)() as second:
        second.load_state_dict(state)
        assert_same_stream(take(second, 400), after[200:])
    # but a state saved after the change does not restore into a loader without it
    with make(from_step=change)() as first:
        take(first, 550)
        state = first.state_dict()
    with make()() as other, pytest.raises(jl.StateDictError, match="weights before step 550"):
        other.load_state_dict(state)


def test_weights_written_otherwise_that_normalise_one_rounding_apart_are_refused_on_restore():
    # [0.3, 0.35, 0.35] normalise to 0.30000000000000004, ...; [6, 7, 7] to 0.3, 0.35, 0.35:
    # each block's share is floored from them, so the two lay out other components
    decimals, whole = (0.3, 0.35, 0.35), (6, 7, 7)
    steps = np.arange(60 * 20)
    assert not np.array_equal(component_of(sampler(decimals, batch_size=60).indices(steps)),
                              component_of(sampler(whole, batch_size=60).indices(steps)))
    state = sampler(decimals, batch_size=60).extra_state()
    sampler(decimals, batch_size=60).check_extra_state(state, 5)  # the same: restores
    with pytest.raises(jl.StateDictError, match=r"only to their last digits.*\[6, 7, 7\]"):
        sampler(whole, batch_size=60).check_extra_state(state, 5)
    # a NumPy config's float32 weights were told they "differ" and "never change earlier ones"
    # (the config audit)
    saved = sampler((0.7, 0.2, 0.1), batch_size=60).extra_state()
    with pytest.raises(jl.StateDictError, match=r"only to their last digits.*float32 weights"):
        sampler(np.array([0.7, 0.2, 0.1], np.float32), batch_size=60).check_extra_state(saved, 5)
    with pytest.raises(jl.StateDictError, match=r"differ: expected"):  # (a change of the
        sampler((0.7, 0.2000002, 0.1), batch_size=60).check_extra_state(saved, 5)  # user's)


def test_a_long_schedule_that_differs_late_is_shown_where_it_differs():
    # cut at 400 characters, "expected" and "received" showed the same text, the step that
    # differs left out (the twenty-first review)
    from jaxloader.plans.mixture import check_weights_before

    schedule = {s: [0.25, 0.75] for s in range(30)}
    saved = [[s, [0.25, 0.75] if s < 29 else [0.5, 0.5]] for s in range(30)]
    with pytest.raises(jl.StateDictError) as refused:
        check_weights_before(schedule, saved, 40)
    said = str(refused.value)
    assert "(29, [0.25, 0.75])" in said and "(29, [0.5, 0.5])" in said, said


def test_components_that_differ_are_named_and_arrays_in_memory_refused_as_mixed():
    # the error said "in one, ... in another" (which of a multi-task mixture's?), and came at
    # the first batch holding both: step 12 for a component of weight 0.005 (the audit)
    cls = jl.ArraySource({"image": np.zeros((40, 4), np.float32), "label": np.zeros(40, int)})
    seg = jl.ArraySource({"image": np.zeros((40, 4), np.float32),
                          "mask": np.zeros((40, 4), np.uint8)})
    with pytest.raises(jl.ConfigError, match=r"keys \['image', 'label'\] in 'cls', dict with "
                                             r"keys \['image', 'mask'\] in 'seg'"):
        jl.mix({"cls": cls, "seg": seg}, {"cls": 0.995, "seg": 0.005})
    wide = jl.ArraySource({"image": np.zeros((40, 4)), "label": np.zeros(40, int)})
    with pytest.raises(jl.ConfigError, match=r"\['image'\].*float32\(4,\) in mix\(sources\)"
                                             r"\[0\], float64\(4,\) in mix\(sources\)\[1\]"):
        jl.mix([cls, wide], [0.5, 0.5])
    listed = [{"image": np.zeros(4), "label": 0}] * 40  # (read to be known: at its batch)
    mixed = jl.mix({"cls": cls, "list": listed}, {"cls": 0.5, "list": 0.5})
    with pytest.raises(jl.JaxloaderError, match=r"records differ: .*\('(list|cls)' record \d+\)"
                                                r".*\('(list|cls)' record \d+\)"):
        next(iter(jl.DataLoader(mixed, batch_size=8, shuffle=True)))
    with pytest.raises(jl.ConfigError, match=r"keys \['image', 'label'\] in sources\[0\]"):
        jl.DataLoader(jl.ConcatSource([cls, seg]), batch_size=8)  # (read in order: refused
        # at the batch that held both)

    def check(r):
        if r["label"] == 7:
            raise ValueError("bad record")
        return r

    pool = jl.ArraySource({"label": np.arange(40)})
    subsets = {n: jl.FilteredSource(pool, indices=np.arange(10)) for n in ("math", "code")}
    with pytest.raises(jl.RecordError, match=r"\(its source's record 7 in '(math|code)'\)"):
        list(jl.DataLoader(jl.mix(subsets, {"math": 0.5, "code": 0.5}), batch_size=4,
                           transforms=[jl.Map(check)], num_epochs=1))
    phases = jl.mix([cls, seg], [1, 0], from_step={10: [0, 1]})  # (never in one batch)
    # ... but in one loader, whose batches are all of one kind: a run of it stopped at step
    # 10 (the mixtures audit); refused as the loader is made, unless a Map may make them alike
    with pytest.raises(jl.ConfigError, match=r"keys \['image', 'label'\] in mix\(sources\)\[0\]"
                                             r".*or pass the loader a Map that makes every "
                                             r"record of one kind\. Its schedule .*stop at the "
                                             r"step that moves"):
        jl.DataLoader(phases, batch_size=8, shuffle=True)
    wide = jl.ArraySource({"image": np.zeros((40, 4)), "label": np.zeros(40, np.int64)})
    with pytest.raises(jl.ConfigError, match=r"float32\(4,\) in mix\(sources\)\[0\], "
                                             r"float64\(4,\) in mix\(sources\)\[1\].*Its sch"):
        jl.DataLoader(jl.mix([cls, wide], [1, 0], from_step={10: [0, 1]}), batch_size=8)
    larger = jl.ArraySource({"image": np.ones((40, 6), np.float32),
                             "label": np.ones(40, np.int64)})  # (row sizes may change)
    with jl.DataLoader(jl.mix([cls, larger], [1, 0], from_step={2: [0, 1]}),
                       batch_size=8) as loader:
        assert [b["image"].shape[1] for b in itertools.islice(loader, 4)] == [4, 4, 6, 6]
    same = jl.Map(lambda r: {"image": r["image"]})
    with jl.DataLoader(jl.mix([cls, seg], [1, 0], from_step={4: [0, 1]}), batch_size=8,
                       transforms=[same]) as loader:
        assert len(list(loader)) == 10
    # records of 256 KiB or more are read one by one: a record Map may make them alike (a
    # crop of two sites' volumes of other sizes, the review)
    site_a = jl.ArraySource({"vol": np.zeros((4, 64, 64, 64), np.float32)})
    site_b = jl.ArraySource({"vol": np.ones((4, 80, 80, 80), np.float32)})
    crop = jl.Map(lambda r: {"vol": np.ascontiguousarray(r["vol"][:8, :8, :8])})
    with jl.DataLoader(jl.mix([site_a, site_b], [0.5, 0.5]), batch_size=4, shuffle=True,
                       transforms=[crop]) as loader:
        assert next(iter(loader))["vol"].shape == (4, 8, 8, 8)


def test_read_locally_each_component_reads_its_records_once_an_epoch_a_window_at_a_time():
    # LocalShuffle in a mixture: each component's blocks (100 records here) permuted each
    # epoch, its records shuffled within windows of 2 blocks: a run of its reads stays in 2
    local = jl.LocalShuffle(window=2, block_size=100)
    s = sampler(shuffle=local)
    offsets = np.cumsum((0,) + LENGTHS)
    for c, n in enumerate(LENGTHS):
        records = s._component_reads(c, np.arange(3 * n)) - offsets[c]
        epochs = records.reshape(3, n)
        assert all(sorted(e.tolist()) == list(range(n)) for e in epochs)
        assert not np.array_equal(epochs[0], epochs[1])
        edges = np.unique(np.append(s._order(c, 0)._window_starts, n))  # (a short block's
        for a, b in zip(edges[:-1], edges[1:]):  # window is shorter: not every 200 records)
            assert len(set((epochs[0][a:b] // 100).tolist())) <= 2
    # the weights hold as with a full shuffle (which components: the same plan)
    assert np.array_equal(component_of(s.indices(np.arange(30_000))),
                          component_of(sampler().indices(np.arange(30_000))))
    # the state names each component's order: a full shuffle's state is refused, and back
    assert s.extra_state()["local_shuffle"] == ["window 2, blocks 100"] * 3
    with pytest.raises(jl.StateDictError, match=r"state\['local_shuffle'\]: expected"):
        s.check_extra_state(sampler().extra_state(), 10)
    with pytest.raises(jl.StateDictError, match=r"state\['local_shuffle'\]: expected None"):
        sampler().check_extra_state(s.extra_state(), 10)


def test_read_locally_each_components_order_is_made_once_an_epoch_with_many_components(
        monkeypatch):
    # the cache of block orders was cleared once it held 9: with 10 or more components each
    # span made every component's order again (8.8 against 0.3 ms a batch of large ones)
    from jaxloader.batching import mixture_sampler

    made = []

    class Counted(mixture_sampler.BlockOrder):
        def __init__(self, *args, **kw):
            made.append((len(args[0]), kw["epoch"]))  # (its blocks, its epoch)
            super().__init__(*args, **kw)

    monkeypatch.setattr(mixture_sampler, "BlockOrder", Counted)
    parts = [jl.ArraySource({"x": np.arange(100_000) + 100_000 * c}) for c in range(16)]
    small = jl.ArraySource({"x": np.arange(100) - 100})  # (wraps ~19 epochs a span)
    with jl.DataLoader(jl.mix([*parts, small], [1.0] * 17), batch_size=256, seed=0,
                       num_epochs=None,
                       shuffle=jl.LocalShuffle(window=2, block_size=100)) as loader:
        it = iter(loader)
        for _ in range(400):  # (~100,000 positions: spans of 32,768, in epoch 0)
            next(it)
    large = [epoch for blocks, epoch in made if blocks > 2]  # (the small: 1 block, 2 starts)
    assert large == [0] * 16 and len(made) - len(large) > 10, made  # (each once; the small: many)


@pytest.mark.parametrize("version", [None, 0, 2])
def test_a_mixture_state_of_another_version_is_refused(version):
    with make()() as first:
        take(first, 5)
        state = first.state_dict()
    assert state["version"] == 1
    if version is None:
        del state["version"]
    else:
        state["version"] = version
    with make()() as second, pytest.raises(jl.StateDictError, match=r"version"):
        second.load_state_dict(state)


def test_a_state_written_with_the_mixture_order_until_2026_11_27_restores_or_is_named():
    # such a state ("mixture_order": 5, the order read since) was refused as "edited by hand"
    with make()() as first:
        take(first, 5)
        state = first.state_dict()
        expected = take(first, 3)
    with make()() as second:
        second.load_state_dict({**state, "mixture_order": 5})
        assert_same_stream(take(second, 3), expected)
        with pytest.raises(jl.StateDictError, match=r"state\['mixture_order'\]: expected 5 "
                                                    r"\(or none\), received 2: a state of an "
                                                    r"earlier jaxloader.*the jaxloader that saved"):
            second.load_state_dict({**state, "mixture_order": 2})


@pytest.mark.parametrize("entry", [[0, [0.6, "x", 0.2]], ["0", ["0.6", "0.2", "0.2"]],
                                   [0, 5], [0.0, [0.6, 0.2, 0.2]], [0, [0.6, None, 0.2]],
                                   [True, [0.6, 0.2, 0.2]], [-1, [0.6, 0.2, 0.2]]])
def test_mixture_weights_in_a_state_that_are_not_numbers_are_refused_by_name(entry):
    # int() and float() turned some into numbers without a word, and raised on others
    with make()() as first:
        take(first, 5)
        state = first.state_dict()
    state["mixture"] = [entry] + state["mixture"][1:]
    with make()() as second, pytest.raises(jl.StateDictError, match=r"state\['mixture'\]\[0\]: "
                                                                     r"expected \[step \(an int"):
        second.load_state_dict(state)


def test_a_plain_state_is_not_restored_into_a_mixture_and_back():
    # refused by the fingerprints' differences (source: expected 'mixture:...', received None),
    # before the sampler's message naming the mixture could be said
    plain = jl.DataLoader(jl.ConcatSource(components()), batch_size=8, process_index=0,
                          process_count=1)
    with make()() as mixed, pytest.raises(jl.StateDictError, match=r"from a loader over a "
                                          r"plain source, and this loader reads a mixture .*"
                                          r"at weight 0 .*from_step"):
        mixed.load_state_dict(plain.state_dict())
    with make()() as mixed, pytest.raises(jl.StateDictError, match=r"from a loader over a "
                                          r"mixture \(jaxloader.mix\), and this loader reads "
                                          r"a plain source"):
        plain.load_state_dict(mixed.state_dict())


@pytest.mark.parametrize("weights,match", [
    ((0.5, -0.1, 0.6), r"finite and >= 0, got \[0.5, -0.1, 0.6\]"),  # (numbers, not np.float64)
    ((0, 0, 0), "sum to zero"),
    ((1, 2), r"one weight per source \(3\), got 2"),
    (("1", "2", "3"), r"one number per source \(3\), got tuple \('1', '2', '3'\)"),
    ((True, False, True), r"one number per source \(3\), got tuple \(True"),
    ((Fraction(1, 2), 1, 2), None),  # (numbers of any kind: accepted)
    ((1e308, 1e308, 0), None),  # (their sum is inf: was "sum to zero ([0.0, 0.0, 0.0])")
])
def test_bad_weights_are_named(weights, match):
    if match is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (1e308's sum: NumPy's overflow warning let out)
            jl.mix(components(), weights)
        return
    with pytest.raises(jl.ConfigError, match=match):
        jl.mix(components(), weights)
    with pytest.raises(jl.ConfigError, match=r"from_step\[9\].*" + match):
        jl.mix(components(), WEIGHTS, from_step={9: weights})


def test_a_weight_change_that_starts_after_its_step_says_where_it_starts():
    # 4 components need blocks of 12 positions or more: a global batch of 8 has no such
    # divisor, so positions are laid out in blocks of 1,024 and a change waits for the next
    four = [jl.ArraySource({"v": np.arange(50) + 1000 * i}) for i in range(4)]

    def loader(batch_size):
        return jl.DataLoader(jl.mix(four, [1, 1, 1, 1], from_step={10: [0, 0, 0, 1]}),
                             batch_size=batch_size, shuffle=True, seed=0, process_index=0,
                             process_count=1)

    with pytest.warns(UserWarning, match=r"mix\(from_step=\{10: ...\}\): the weights change "
                                         r"from step 128, not at step 10: with 4 components, "
                                         r".*blocks of 1,024.*a multiple of 12"):
        late = loader(8)
    with late:
        components = [np.unique(b["v"] // 1000).tolist() for b in take(late, 129)]
    assert components[127] != [3] and components[128] == [3]  # where the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a global batch of 12: each change at its step
        loader(12).close()
    with pytest.warns(UserWarning) as said:
        jl.DataLoader(jl.mix(four, [1, 1, 1, 1], from_step={10: [0, 0, 0, 1], 11: [1, 0, 0, 0]}),
                      batch_size=8, process_index=0, process_count=1).close()
    assert [str(w.message)[:96] for w in said] == [
        "mix(from_step={10: ...}): these weights are never used: the change at step 11 starts in "
        "the same",
        "mix(from_step={11: ...}): the weights change from step 128, not at step 11: with 4 "
        "components, p",
        "mix: a batch of this loader does not hold each of the 4 components' share: positions are"
        " laid ou"]


def test_no_sources_is_named():
    with pytest.raises(jl.ConfigError, match=r"mix\(sources\): expected a non-empty list"):
        jl.mix([], [])


def test_named_components_mix_as_the_list_in_the_dict_order():
    web, books, code = components()
    named = jl.mix({"web": web, "books": books, "code": code},
                   {"code": 0.2, "web": 0.5, "books": 0.3},  # weights in any order
                   from_step={6: {"web": 0.2, "books": 0.2, "code": 0.6}})
    listed = jl.mix([web, books, code], WEIGHTS, from_step={6: [0.2, 0.2, 0.6]})
    assert repr(named) == repr(listed) == (
        "Mixture(927 records in 3 sources, weights [0.5, 0.3, 0.2] and later)")

    def run(source):
        with jl.DataLoader(source, batch_size=8, shuffle=True, seed=3, num_epochs=None,
                           process_index=0, process_count=1) as loader:
            return take(loader, 12)
    assert_same_stream(run(named), run(listed))


@pytest.mark.parametrize("sources,weights,match", [
    ("list", {"web": 1, "books": 1, "code": 1}, r"weights by name .* need sources by name"),
    ("dict", {"web": 1, "books": 1}, r"missing \['code'\], unknown \[\]"),
    ("dict", {"web": 1, "books": 1, "code": 1, "wiki": 1}, r"unknown \['wiki'\]"),
    ("list", ["a", "b", "c"], r"expected one number per source \(3\), got list"),
])
def test_bad_named_weights_are_named(sources, weights, match):
    parts = components()
    given = dict(zip(("web", "books", "code"), parts)) if sources == "dict" else parts
    with pytest.raises(jl.ConfigError, match=match):
        jl.mix(given, weights)


def test_a_mixture_of_sources_inside_a_mixture_a_map_or_a_concatenation_is_refused():
    # each read the inner mixture by index: its components one after another, weights unused
    a, b = jl.ArraySource({"x": np.zeros(8)}), jl.ArraySource({"x": np.ones(8)})
    inner = jl.mix([a, b], [1, 0])
    with pytest.raises(jl.ConfigError, match=r"mixture of sources inside a mixture.*"
                                             r"mix\(\[a, b, c\], \[0.25, 0.25, 0.5\]\)"):
        jl.mix([inner, a], [1, 1])
    with pytest.raises(jl.ConfigError, match=r"MapSource\(source\): got a mixture.*"
                                             r"jl.mix\(\[MapSource\(a, ...\)"):
        jl.MapSource(inner, lambda r: r)
    with pytest.raises(jl.ConfigError, match=r"ConcatSource: sources\[1\] is a mixture"):
        jl.ConcatSource([a, inner])


def test_mix_names_arguments_of_the_wrong_kind_and_an_empty_component_by_its_place():
    a, b = (jl.ArraySource({"x": np.arange(n, dtype=np.float32)}) for n in (5, 3))
    with pytest.raises(jl.ConfigError, match=r"mix\(sources\): expected a list \(or dict\) of "
                                             r"sources, got ArraySource"):
        jl.mix(a, [1.0])  # (its 5 records were counted as 5 sources)
    with pytest.raises(jl.ConfigError, match=r"mix\(from_step=...\): expected a dict"):
        jl.mix([a, b], [1, 1], from_step=[(10, [1, 0])])  # (an AttributeError)
    empty = jl.ArraySource({"x": np.zeros(0, np.float32)})
    with pytest.raises(jl.ConfigError, match=r"^mix\(sources\)\[1\]: .*empty source"):
        jl.mix([a, empty], [1, 1])  # (named a ConcatSource's part)


def test_a_mixture_made_directly_checks_and_normalises_its_weights_as_mix_does():
    # Mixture is public: weights 3:1 given as they were read nothing of the first component
    a, b = jl.ArraySource({"x": np.zeros(30)}), jl.ArraySource({"x": np.ones(10)})
    with jl.DataLoader(jl.Mixture([a, b], {0: np.array([3.0, 1.0])}), batch_size=40,
                       process_index=0, process_count=1) as loader:
        x = next(iter(loader))["x"]
    assert ((x == 0).sum(), (x == 1).sum()) == (30, 10)
    made = jl.mix([a, b], [0.1, 0.2])
    assert jl.Mixture([a, b], made.schedule).schedule[0] is made.schedule[0]  # (kept as is)
    for bad, said in [({0: np.array([1.0])}, r"Mixture\(schedule\[0\]\): expected one weight "
                                             r"per source \(2\), got 1"),
                      ({0: [np.nan, 1]}, r"finite and >= 0, got \[nan, 1.0\]"),
                      ({5: [1, 1]}, r"with step 0, got \{5: \[1, 1\]\}; jl.mix"),
                      ([0.5, 0.5], r"expected a dict \{step: weights\} with step 0"),
                      ({0: [1, 1], -2: [1, 1]}, r"step: expected an int >= 0, got -2")]:
        with pytest.raises(jl.ConfigError, match=said):
            jl.Mixture([a, b], bad)
    with pytest.raises(jl.ConfigError, match=r"from_step=...\) step: expected an int, got str"
                                             r".*keys are str: \{int\(k\): w for"):
        jl.mix([a, b], [1, 1], from_step={"10": [1, 1], 20: [1, 1]})  # (a JSON config's: the
    # remedy said nothing of it; the config audit)


def test_a_small_component_read_locally_makes_few_block_orders_a_span(monkeypatch):
    # A 5-record component read locally wraps an epoch every 5 reads, and each epoch makes a
    # block order: a span of 32,768 positions made ~6,500 before the first batch (2 s). The
    # span now holds 64 of its epochs at most; the batches are those of a longer span
    from jaxloader.batching import mixture_sampler

    made = []

    class Counted(mixture_sampler.BlockOrder):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(mixture_sampler, "BlockOrder", Counted)

    def first_batches(n=40):
        mix = jl.mix([jl.ArraySource({"x": np.arange(5)}),
                      jl.ArraySource({"x": np.arange(100, 400)})], [1, 1])
        with jl.DataLoader(mix, batch_size=8, shuffle=jl.LocalShuffle(window=2, block_size=3),
                           seed=1, num_epochs=None, process_index=0, process_count=1) as loader:
            it = iter(loader)
            return [next(it)["x"].tolist() for _ in range(n)]
    capped = first_batches()
    assert 0 < len(made) <= 2 * (64 + 2)  # (two components' orders; a span's epochs)
    monkeypatch.setattr(mixture_sampler, "_EPOCHS_A_SPAN", 1000)  # (another span's)
    made.clear()
    assert first_batches() == capped and len(made) > 1000


def test_a_plain_streams_state_into_a_mixed_stream_and_back_says_so():
    # refused with the streams' descriptions alone (a mixture's {'mix': [...]} against a
    # plain one's), not said as a mixture against a plain stream
    def stream(value):
        return jl.Stream.from_generator(lambda i: ({"x": np.int64(value)} for _ in range(100)),
                                        shards=1)

    def saved(s):
        with jl.StreamLoader(s, batch_size=4, process_index=0, process_count=1) as loader:
            next(iter(loader))
            return loader.state_dict()

    for then, now, said in [(stream(0), jl.mix([stream(0), stream(1)], [1.0, 0.0]),
                             "from a loader over a plain stream, this one reads a mixture"),
                            (jl.mix([stream(0), stream(1)], [1.0, 0.0]), stream(0),
                             "from a loader over a mixture, this one reads a plain stream")]:
        state = saved(then)
        with jl.StreamLoader(now, batch_size=4, process_index=0, process_count=1) as loader, \
                pytest.raises(jl.StateDictError, match=rf"{said} \(to mix in streams later"):
            loader.load_state_dict(state)


def test_a_restore_over_a_mixture_grown_or_a_halved_batch_says_what_changed_and_the_remedy():
    # a corpus appended to was "the same kind (mixture) and size" beside num_records that
    # differ (the fingerprint counts components); one added was "restore over the same data";
    # a batch halved after an OOM had no remedy (the continual pretraining audit)
    def sources(n, k=2):
        return [jl.ArraySource({"x": np.arange(n + 100 * c, dtype=np.int32) % 7})
                for c in range(k)]

    def loader(parts, batch_size=8):
        return jl.DataLoader(jl.mix(parts, [1.0] * len(parts)), batch_size=batch_size,
                             process_index=0, process_count=1)
    with loader(sources(50)) as saved:
        next(iter(saved))
        state = saved.state_dict()
    with pytest.raises(jl.StateDictError, match=r"the mixture holds its 2 components, but "
                                                r"mix\(sources\)\[0\], mix\(sources\)\[1\] "
                                                r"differ inside: its records \(num_records"):
        loader(sources(60)).load_state_dict(state)
    with pytest.raises(jl.StateDictError, match=r"the same parts in another order: the state's "
                       r"was mix\(sources\)\[1\], mix\(sources\)\[0\]; pass them in that "
                       r"order"):  # (a dict built otherwise: the contrastive audit; it said
        loader(sources(50)[::-1]).load_state_dict(state)  # "differ inside ... or in another order")
    with pytest.raises(jl.StateDictError, match=r"its 2 components, but mix\(sources\)\[1\] "
                                                r"differs inside: its records \(num_records"):
        loader([sources(50)[0], sources(60)[1]]).load_state_dict(state)  # (the one named)
    with pytest.raises(jl.StateDictError, match=r"the mixture's components: 2 then, 3 now; to "
                                                r"mix a component in later, mix it from the "
                                                r"start at weight 0"):
        loader(sources(50, 3)).load_state_dict(state)
    with pytest.raises(jl.StateDictError, match=r"global_batch_size: expected 4, received 8.*"
                                                r"keep the batch size and split each batch in "
                                                r"the step \(gradient accumulation"):
        loader(sources(50), batch_size=4).load_state_dict(state)
    with pytest.raises(jl.StateDictError) as raised:  # (a larger batch: no such remedy)
        loader(sources(50), batch_size=16).load_state_dict(state)
    assert "gradient accumulation" not in str(raised.value)


def test_a_restore_names_the_component_or_part_that_changed():
    # one digest for the whole mixture said "one of them differs inside": with 30 corpora, which
    # one was edited was the user's to find (the last session's note); a ConcatSource the same
    def part(c, scale=1):
        return jl.MapSource(jl.ArraySource({"x": np.arange(40) + c}), lambda r: {"x": r["x"]})

    def edited(c):
        return jl.MapSource(jl.ArraySource({"x": np.arange(40) + c}), lambda r: {"x": r["x"] * 2})
    names = ["web", "books", "code"]
    mixed = jl.DataLoader(jl.mix(dict(zip(names, map(part, range(3)))), dict.fromkeys(names, 1)),
                          batch_size=6)
    state = mixed.state_dict()
    assert len(state["parts"]) == 3 and all(len(p) == 8 for p in state["parts"])
    state["parts"].append("edited")  # (the loader's own list was every state's: the review)
    assert len(mixed.state_dict()["parts"]) == 3
    state = mixed.state_dict()
    mixed.load_state_dict(state)  # (the same parts: restores)
    changed = {"web": part(0), "books": edited(1), "code": part(2)}
    with pytest.raises(jl.StateDictError, match=r"its 3 components, but 'books' differs inside"):
        jl.DataLoader(jl.mix(changed, dict.fromkeys(names, 1)), batch_size=6
                      ).load_state_dict(state)
    state = jl.DataLoader(jl.ConcatSource([part(c) for c in range(3)]), batch_size=6).state_dict()
    with pytest.raises(jl.StateDictError, match=r"same kind \(concat\) and size, so what differs "
                                                r"is inside it \(its part sources\[1\]\)"):
        jl.DataLoader(jl.ConcatSource([part(0), edited(1), part(2)]), batch_size=6
                      ).load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "parts"}  # (saved before 2026-12-03)
    with pytest.raises(jl.StateDictError, match=r"is inside it: a function"):
        jl.DataLoader(jl.ConcatSource([part(0), edited(1), part(2)]), batch_size=6
                      ).load_state_dict(older)
    jl.DataLoader(jl.ConcatSource([part(c) for c in range(3)]), batch_size=6).load_state_dict(older)
    with pytest.raises(jl.StateDictError, match=r"state\['parts'\]: expected a list of the parts"):
        jl.DataLoader(jl.ConcatSource([part(c) for c in range(3)]), batch_size=6
                      ).load_state_dict({**state, "parts": "abc"})


def test_batches_that_cannot_hold_each_components_share_are_warned_of():
    # (class-balanced batches as a mix of one source a class: 4 classes at a batch of 8 gave
    # [3, 1, 4, 0] without a word, and a class smaller than its share of a batch is in every
    # batch twice, its own in-batch negative; the contrastive audit)
    labels = np.repeat(np.arange(4), 100)
    source = jl.ArraySource({"y": labels})
    classes = [jl.FilteredSource(source, indices=np.flatnonzero(labels == c)) for c in range(4)]
    with pytest.warns(jl.JaxloaderWarning, match=r"does not hold each of the 4 components' "
                      r"share: .*at least 12, more than a global batch of 8.*a multiple of 12 "
                      r"holds each one's share"):
        jl.DataLoader(jl.mix(classes, [1] * 4), batch_size=8, shuffle=True).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with jl.DataLoader(jl.mix(classes, [1] * 4), batch_size=12, shuffle=True) as loader:
            counts = [np.bincount(b["y"], minlength=4).tolist() for b in take(loader, 20)]
    assert counts == [[3, 3, 3, 3]] * 20  # (what the warning says to do)
    with warnings.catch_warnings():  # (a batch over a block spans whole ones: each share
        warnings.simplefilter("error")  # within a few records, the review)
        big = [jl.ArraySource({"y": np.full(2000, c)}) for c in range(2)]
        jl.DataLoader(jl.mix(big, [1, 1]), batch_size=1031, num_epochs=None).close()
    few = jl.ArraySource({"y": np.arange(3)})
    with pytest.warns(jl.JaxloaderWarning, match=r"component 'few' holds 3 records, fewer than "
                      r"its share of a global batch of 8 \(weight 0.5\): every batch holds"):
        jl.DataLoader(jl.mix({"few": few, "many": source}, {"few": 1, "many": 1}),
                      batch_size=8).close()


def test_a_mixture_state_past_what_its_positions_count_exactly_is_refused():
    # (positions past 2**53 split among the components in float64, past 2**63 wrapped: a
    # state by hand restored into other components' shares, without a word; the scale audit)
    from test_local_shuffle import _Counted

    with jl.DataLoader(jl.mix([_Counted(2**40)] * 3, [0.3, 0.6, 0.1]), batch_size=1024,
                       num_epochs=None) as loader:
        state = loader.state_dict()
        loader.load_state_dict({**state, "step": 2**40})  # (far, but exact: taken)
        with pytest.raises(jl.StateDictError, match=r"past any step a mixture reaches: its "
                                                    r"positions .* exact to 2\*\*53"):
            loader.load_state_dict({**state, "step": 2**53})


def test_a_component_of_weight_zero_is_said_to_count_in_the_epoch():
    # its records counted in the epoch: num_epochs=1 read the weighted component's 100
    # records 11 times each (len(loader) 110), without a word
    a, b = jl.ArraySource({"x": np.arange(100)}), jl.ArraySource({"x": np.arange(1000)})
    for weights, said in (([1, 0], "at every step"), ({0: [1, 0], 5: [0.5, 0.5]}, "until step 5")):
        mixture = jl.mix([a, b], weights[0] if isinstance(weights, dict) else weights,
                         from_step={5: weights[5]} if isinstance(weights, dict) else None)
        with pytest.warns(jl.JaxloaderWarning, match=rf"component 1 has weight 0 {said}, but its "
                                                     r"1,000 records count in the loader's epoch"
                                                     r".*each 11 times an epoch"):
            loader = jl.DataLoader(mixture, batch_size=10, process_index=0, process_count=1)
        assert len(loader) == 110
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (trained by steps, as the warning asks: nothing)
            jl.DataLoader(mixture, batch_size=10, num_epochs=None, process_index=0,
                          process_count=1)


def test_components_that_differ_across_a_change_inside_a_step_are_refused_as_made():
    # each regime's components were checked alike, not those of two regimes a batch holds
    # where a change starts inside a step: refused at step 341, hours in
    parts = [jl.ArraySource({"x": np.zeros(100, dtype)}) for dtype in ("f4", "f8", "f4")]
    mixture = jl.mix(parts, [1, 0, 0], from_step={5: [0, 1, 0]})
    with pytest.warns(jl.JaxloaderWarning), pytest.raises(
            jl.ConfigError, match=r"mix\(from_step=\{5: \.\.\.\}\): the change starts inside "
                                  r"step 341, whose batch holds both weights' components: .*"
                                  r"float32\(\) in mix\(sources\)\[0\], float64\(\)"):
        jl.DataLoader(mixture, batch_size=3, process_index=0, process_count=1)
    with pytest.warns(jl.JaxloaderWarning), pytest.raises(  # (a change at a step's start:
            jl.ConfigError, match=r"float32\(\) in mix\(sources\)\[0\], float64\(\) .*Its "
                                  r"schedule"):  # each regime alone; but one loader's batches)
        jl.DataLoader(mixture, batch_size=6, process_index=0, process_count=1)
    alike = jl.mix(parts, [1, 0, 0], from_step={5: [0, 0, 1]})
    with pytest.warns(jl.JaxloaderWarning):
        jl.DataLoader(alike, batch_size=6, process_index=0, process_count=1)


def test_a_large_blocks_indices_are_made_once_not_each_span(monkeypatch):
    # a mixture of 3,000 components laid out blocks of 8,997,000 positions, whose order was
    # made whole again every span: a ~1 s stall every 1,024 steps at batch 32, 26 s at 10,000
    # components (the cliffs audit); past KEPT_BLOCK it is warned of
    from jaxloader.batching import mixture_layout, mixture_sampler

    parts = [jl.ArraySource({"x": np.arange(4) + 10 * k}) for k in range(300)]  # (89,700)
    sampler = mixture_sampler.MixtureSampler(jl.mix(parts, [1] * 300), 32, shuffle=True,
                                             seed=3, last_batch="drop", process_index=0,
                                             process_count=1)
    made = []
    table = sampler._table
    monkeypatch.setattr(sampler, "_table", lambda *a: made.append(a) or table(*a))
    positions = np.arange(0, 89_700, 7)
    kept = np.concatenate([sampler.indices(p) for p in np.array_split(positions, 40)])
    assert len(made) == 1  # (the block, once)
    fresh = mixture_sampler.MixtureSampler(jl.mix(parts, [1] * 300), 32, shuffle=True, seed=3,
                                           last_batch="drop", process_index=0, process_count=1)
    monkeypatch.setattr(mixture_sampler, "_KEEP_FROM", 1 << 40)  # (as made before: the same)
    assert np.array_equal(kept, fresh.indices(positions))
    with pytest.warns(jl.PerformanceWarning, match=r"6,000 components lay the positions out in "
                                                   r"blocks of 35,994,000"):
        mixture_layout.large_blocks(6_000, 32, 6_000 * 5_999)


def test_a_mixture_held_by_the_users_own_source_class_is_refused():
    # a PyTorch-style Dataset adding a field to a jl.mix read it by index: its components one
    # after another, the weights unused (a 90% component came at 10%), without a word (the
    # compositions audit)
    mixed = jl.mix([jl.ArraySource({"c": np.zeros(10, np.int64)}),
                    jl.ArraySource({"c": np.ones(90, np.int64)})], [0.9, 0.1])

    class WithField:
        def __init__(self, source):
            self.source = source

        def __len__(self):
            return len(self.source)

        def __getitem__(self, i):
            return {**self.source[i], "extra": np.int64(1)}

    for make in (lambda: jl.DataLoader(WithField(mixed), batch_size=4),
                 lambda: jl.MapSource(WithField(mixed), lambda r: r)):
        with pytest.raises(jl.ConfigError, match=r"the WithField holds a mixture \(jl.mix\) in "
                                                 r"\.source, which it reads by index: .* the "
                                                 r"weights unused"):
            make()
