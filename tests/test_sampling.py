from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxloader.base.errors import ConfigError
from jaxloader.order.local_shuffle import BlockOrder, LocalShuffle
from jaxloader.order.index_shuffle import IndexShuffle
from jaxloader.order.sampling import Sampler, StepMemo
from line_interrupts import raised_at_line


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 3000), seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 10**6))
def test_index_shuffle_is_a_permutation(n, seed, epoch):
    for tight, exact in ((False, False), (True, False), (False, True)):
        out = IndexShuffle(n, seed=seed, epoch=epoch, tight=tight, exact=exact)(np.arange(n))
        assert out.dtype == np.int64
        assert np.array_equal(np.sort(out), np.arange(n))


@pytest.mark.parametrize("n", [2**31, 2**31 + 1, 2**40 + 3, 2**62 + 5])
def test_a_tight_shuffle_of_more_than_2_31_records_computes_in_64_bits(n):
    # up to 2**31 records a tight shuffle computes in 32-bit words; above, in 64-bit ones:
    # still a bijection (distinct values in range, each position mapped as alone)
    shuffle = IndexShuffle(n, seed=5, epoch=np.array([1, 2] * 2000), tight=True)
    positions = np.concatenate([np.arange(2000), n - 1 - np.arange(2000)]).astype(np.uint64)
    out = shuffle(positions)
    assert out.dtype == np.int64 and len(set(out[::2].tolist())) == 2000
    assert (out.astype(np.uint64) < np.uint64(n)).all()
    alone = IndexShuffle(n, seed=5, epoch=1, tight=True)(positions[::2])
    assert np.array_equal(out[::2], alone)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**64 - 1), tight=st.booleans(),
       exact=st.booleans(), epochs=st.lists(st.integers(0, 2**40), min_size=1, max_size=6))
def test_an_epoch_a_position_maps_each_as_its_own_epoch_would(n, seed, tight, exact, epochs):
    rng = np.random.default_rng(n)
    which = rng.integers(0, len(epochs), 3000)
    positions = rng.integers(0, n, 3000)
    got = IndexShuffle(n, seed=seed, epoch=np.asarray(epochs)[which], tight=tight,
                       exact=exact)(positions)
    for k, epoch in enumerate(epochs):
        alone = IndexShuffle(n, seed=seed, epoch=epoch, tight=tight, exact=exact)(
            positions[which == k])
        assert np.array_equal(got[which == k], alone)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 20000), seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 10**6))
def test_a_tight_shuffle_walks_values_past_n_by_its_table_as_cycle_walking_does(n, seed, epoch):
    # One epoch, tight: values past n walk by a table made once (pointer doubling); an epoch
    # a position walks them round after round. Every position maps the same either way.
    positions = np.arange(n)
    by_table = IndexShuffle(n, seed=seed, epoch=epoch, tight=True)(positions)
    walked = IndexShuffle(n, seed=seed, epoch=np.full(n, epoch), tight=True)(positions)
    assert np.array_equal(by_table, walked)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), batch=st.integers(1, 64), processes=st.integers(1, 3),
       stride=st.integers(1, 4), policy=st.sampled_from(["drop", "pad", "partial"]),
       shuffle=st.booleans(), seed=st.integers(0, 2**64 - 1))
def test_memoised_indices_are_the_order_of_the_positions_in_any_order_asked(
        n, batch, processes, stride, policy, shuffle, seed):
    # the memo (a chunk of steps, by class step % memo_stride, this process's rows) must give
    # what the order gives for the batch's positions, whatever steps were asked before
    if (policy == "partial" and processes > 1) or (policy == "drop" and batch * processes > n):
        return  # refused configurations (test_bad_arguments_name_the_field)
    rng = np.random.default_rng(n)
    for p in range(processes):
        s = Sampler(n, batch, shuffle=shuffle, seed=seed, last_batch=policy, process_index=p,
                    process_count=processes, memo_stride=stride)
        for step in rng.permutation(3 * s.steps_per_epoch)[:150]:
            spec = s.batch(int(step))
            k = int(step) % s.steps_per_epoch
            assert spec.positions[0] == k * batch * processes + p * batch
            # (pad rows: the global batch's first record)
            expected = np.where(spec.positions < n, spec.positions, k * batch * processes)
            if shuffle:
                expected = IndexShuffle(n, seed=seed, epoch=spec.epoch, exact=True)(expected)
            assert np.array_equal(spec.indices, expected), (step, p)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 3000), batch=st.integers(1, 64), processes=st.integers(1, 3),
       stride=st.integers(1, 4), policy=st.sampled_from(["drop", "pad", "partial"]),
       shuffle=st.sampled_from([False, True, LocalShuffle(window=2, block_size=37)]),
       count=st.integers(1, 40), data=st.data())
def test_a_tasks_indices_at_once_are_its_steps_indices_one_after_another(
        n, batch, processes, stride, policy, shuffle, count, data):
    # Sampler.task_indices (a worker's task read at once) must give what batch() gives step by
    # step, or None; whatever was asked before, across chunks and epochs
    if (policy == "partial" and processes > 1) or (policy == "drop" and batch * processes > n):
        return  # refused configurations (test_bad_arguments_name_the_field)
    order, description = None, None
    if isinstance(shuffle, LocalShuffle):
        starts = shuffle.block_starts(None, n)
        order = functools.partial(BlockOrder, starts, window=shuffle.window, seed=5)
        description = shuffle.describe(None)
    p = data.draw(st.integers(0, processes - 1))
    s = Sampler(n, batch, shuffle=bool(shuffle), seed=5, last_batch=policy, process_index=p,
                process_count=processes, memo_stride=stride, order=order,
                order_description=description)
    end = s.steps_per_epoch - 1 - (count - 1) * stride  # tasks that end at an epoch's end
    firsts = [data.draw(st.integers(0, 3 * s.steps_per_epoch)) for _ in range(4)]
    firsts += [e * s.steps_per_epoch + end + d for e in range(2) for d in (-1, 0, 1)]
    for first in (f for f in firsts if f >= 0):
        steps = [first + j * stride for j in range(count)]
        got = s.task_indices(steps)
        specs = [s.batch(step) for step in steps]
        if got is None:  # then a step is not a whole batch without a mask, or they span epochs
            assert count == 1 or policy == "pad" or len({sp.epoch for sp in specs}) > 1 or any(
                len(sp.positions) < batch or sp.positions[-1] >= n for sp in specs), steps
            continue
        assert all(spec.valid is None and len(spec.indices) == batch for spec in specs)
        assert np.array_equal(got, np.concatenate([spec.indices for spec in specs])), steps


def test_index_shuffle_depends_on_seed_and_epoch_only():
    n = 1000
    a = IndexShuffle(n, seed=1, epoch=2)(np.arange(n))
    assert np.array_equal(a, IndexShuffle(n, seed=1, epoch=2)(np.arange(n)))
    assert not np.array_equal(a, IndexShuffle(n, seed=1, epoch=3)(np.arange(n)))
    assert not np.array_equal(a, IndexShuffle(n, seed=2, epoch=2)(np.arange(n)))
    # any subset of positions maps like the whole: batches can be computed alone
    assert np.array_equal(a[500:600], IndexShuffle(n, seed=1, epoch=2)(np.arange(500, 600)))


def test_a_small_sources_shuffle_gives_every_order_equally_often():
    # the Feistel network's halves are 1 to 3 bits for a few records: of 5, some orders came
    # twice as often as others (70 to 151 of 12,000 seeds, against 100), over seeds and over
    # one seed's epochs alike
    import itertools

    orders = {p: i for i, p in enumerate(itertools.permutations(range(5)))}
    for by_seed in (True, False):
        counts = np.zeros(len(orders))
        for k in range(12_000):
            spec = Sampler(5, 5, shuffle=True, seed=k if by_seed else 3, last_batch="drop").batch(
                0 if by_seed else k)
            counts[orders[tuple(spec.indices.tolist())]] += 1
        chi2 = ((counts - 100) ** 2 / 100).sum()  # (119 degrees of freedom: p = 1e-5 at 190)
        assert chi2 < 190, counts  # (before: 484 and 443)


def test_a_small_mixture_components_epochs_give_every_order_equally_often():
    # a component's epochs were shuffled by the tight Feistel network: for 5 records some of
    # its orders came far more often than others
    import itertools

    import jaxloader as jl

    from jaxloader.batching.mixture_sampler import MixtureSampler

    orders = {p: i for i, p in enumerate(itertools.permutations(range(5)))}
    mixture = jl.mix([np.arange(5), np.arange(1000, 1995)], weights=[1, 199])
    sampler = MixtureSampler(mixture, 1000, shuffle=True, seed=3, last_batch="drop")
    reads = sampler._component_reads(0, np.arange(5 * 12_000))  # (its epochs, one by one)
    counts = np.zeros(len(orders))
    for order in reads.reshape(-1, 5).tolist():
        counts[orders[tuple(order)]] += 1
    chi2 = ((counts - 100) ** 2 / 100).sum()
    assert chi2 < 190, counts  # (119 degrees of freedom: p = 1e-5 at 190)
    loader = jl.DataLoader(mixture, batch_size=1000, shuffle=True, process_index=0,
                           process_count=1)
    next(iter(loader))
    state = loader.state_dict()
    assert state.pop("exact_shuffle") is True  # (as written before 2026-12-03)
    with pytest.raises(jl.StateDictError, match=r"saved at step 1 by a jaxloader before "
                                                r"2026-12-03, .*restore it with the jaxloader "
                                                r"that saved it"):
        jl.DataLoader(mixture, batch_size=1000, shuffle=True, process_index=0,
                      process_count=1).load_state_dict(state)
    jl.DataLoader(mixture, batch_size=1000, shuffle=True, process_index=0,
                  process_count=1).load_state_dict({**state, "step": 0})  # (no read to redo)


def test_a_state_saved_before_the_exact_shuffle_restores_only_at_an_epochs_start():
    import jaxloader as jl

    def loader():
        return jl.DataLoader(jl.ArraySource({"x": np.arange(40)}), batch_size=8, shuffle=True,
                             process_index=0, process_count=1)

    state = loader().state_dict()
    assert state.pop("exact_shuffle") is True  # (as written before 2026-12-03)
    restored = loader()
    with pytest.warns(jl.JaxloaderWarning, match=r"epochs from 2 on are shuffled uniformly"):
        restored.load_state_dict({**state, "step": 10})
    assert restored.state_dict()["step"] == 10
    with pytest.raises(jl.StateDictError, match=r"3 steps into epoch 2, by a jaxloader before "
                                                r"2026-12-03.*state\['step'\] = 10\)"):
        loader().load_state_dict({**state, "step": 13})
    big = jl.DataLoader(jl.ArraySource({"x": np.arange(5000)}), batch_size=8, shuffle=True)
    assert "exact_shuffle" not in big.state_dict()  # (its order is as it was)


def test_a_states_exact_shuffle_mark_as_numpy_or_another_type_is_read_as_its_other_fields():
    # np.True_ (a state through a NumPy pytree) was refused mid-epoch as "saved by a jaxloader
    # before 2026-12-03", where shuffle=np.True_ restores; a str was taken for an older state
    import jaxloader as jl

    def loader(mixed=False):
        source = jl.ArraySource({"x": np.arange(40)})
        return jl.DataLoader(jl.mix([source, source], [1, 1]) if mixed else source,
                             batch_size=8, shuffle=True, process_index=0, process_count=1)

    for mixed in (False, True):
        ran = loader(mixed)
        it = iter(ran)
        next(it)
        state = ran.state_dict()
        restored = loader(mixed)
        restored.load_state_dict({**state, "exact_shuffle": np.True_, "shuffle": np.True_})
        np.testing.assert_array_equal(next(iter(restored))["x"], next(it)["x"])
        with pytest.raises(jl.StateDictError, match=r"state\['exact_shuffle'\]: expected a bool, "
                                                    r"received str 'yes'"):
            loader(mixed).load_state_dict({**state, "exact_shuffle": "yes"})


@pytest.mark.parametrize("n", [10_000, 300_000, 2**18 + 1])
@pytest.mark.parametrize("tight", [False, True])
def test_index_shuffle_looks_shuffled(n, tight):
    out = IndexShuffle(n, seed=0, epoch=0, tight=tight)(np.arange(n))
    fixed = np.count_nonzero(out == np.arange(n))
    assert fixed < 20  # a random permutation has ~1 fixed point
    assert abs(np.corrcoef(out, np.arange(n))[0, 1]) < 0.05
    # neighbours stay neighbours about 2 times in a random permutation
    assert np.count_nonzero(np.abs(np.diff(out)) == 1) < 20
    # each tenth of the positions spreads over every tenth of the records as a random
    # permutation does: chi-square of the 10 x 10 table (81 degrees of freedom, ~81 +- 13)
    counts = np.histogram2d(np.arange(n), out, bins=10)[0]
    expected = np.outer(counts.sum(1), counts.sum(0)) / n
    assert ((counts - expected) ** 2 / expected).sum() < 150
    if tight:  # the domain is just above n: hardly any value needs cycle-walking
        shuffle = IndexShuffle(n, seed=0, epoch=0, tight=True)
        domain = int(shuffle._radix) << int(shuffle._low_bits)
        assert n <= domain < n + 2 * np.sqrt(n) + 2


def test_steps_per_epoch_and_policies():
    assert Sampler(10, 4, shuffle=False, seed=0, last_batch="drop").steps_per_epoch == 2
    assert Sampler(10, 4, shuffle=False, seed=0, last_batch="pad").steps_per_epoch == 3
    s = Sampler(10, 4, shuffle=False, seed=0, last_batch="partial")
    assert s.steps_per_epoch == 3 and s.batch(2).indices.tolist() == [8, 9]
    p = Sampler(10, 4, shuffle=False, seed=0, last_batch="pad").batch(2)
    assert p.positions.tolist() == [8, 9, 10, 11]
    assert p.valid.tolist() == [True, True, False, False]
    assert p.indices.tolist() == [8, 9, 8, 8]  # pad rows: the batch's first record


def test_process_slices():
    s = [Sampler(20, 3, shuffle=True, seed=5, last_batch="drop", process_index=p,
                 process_count=2) for p in range(2)]
    whole = Sampler(20, 6, shuffle=True, seed=5, last_batch="drop")
    for step in range(7):
        joined = np.concatenate([s[0].batch(step).indices, s[1].batch(step).indices])
        assert np.array_equal(joined, whole.batch(step).indices)


@pytest.mark.parametrize("kwargs,field", [
    (dict(num_records=10, batch_size=0), "batch_size"),
    (dict(num_records=10, batch_size=-3), "batch_size"),
    (dict(num_records=10, batch_size=2.5), "batch_size"),
    (dict(num_records=0, batch_size=2), "num_records"),
    (dict(num_records=10, batch_size=2, seed=-1), "seed"),
    (dict(num_records=10, batch_size=2, last_batch="dropp"), "last_batch"),
    (dict(num_records=10, batch_size=20), "batch_size"),
    (dict(num_records=10, batch_size=2, process_index=2, process_count=2), "process_index"),
    (dict(num_records=10, batch_size=2, last_batch="partial", process_count=2), "partial"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    kwargs = {"shuffle": False, "seed": 0, "last_batch": "drop", **kwargs}
    n = kwargs.pop("num_records")
    b = kwargs.pop("batch_size")
    with pytest.raises(ConfigError, match=field):
        Sampler(n, b, **kwargs)


def test_an_interrupt_at_any_line_of_the_order_caches_leaves_them_right():
    """A Ctrl-C lands between any two lines of ``peek()`` or of ``next()`` without workers,
    which run the sampler's caches in this process. Raised here at each line of them in turn,
    later batches are still the right ones: two attributes set one after the other used to
    pair epoch 0 with epoch 1's order once an interrupt fell between them."""
    def fresh():
        return Sampler(50, 4, shuffle=True, seed=3, last_batch="drop")  # 12 steps an epoch

    steps = (0, 1, 12, 13, 30)
    want = {step: fresh().batch(step).indices for step in steps}
    raised = 0
    for n in range(1, 60):
        sampler = fresh()
        sampler.batch(0)  # epoch 0's order and rows held
        # epoch 1: both caches move on
        raised += raised_at_line(n, [Sampler._indices_of, StepMemo.get], lambda: sampler.batch(13))
        for step in steps:
            np.testing.assert_array_equal(sampler.batch(step).indices, want[step],
                                          err_msg=f"interrupted at line {n}, step {step}")
    assert raised > 10  # every line of both, then none left to land on


class _Huge:
    """2**41 records, none stored."""

    def __len__(self) -> int:
        return 1 << 41

    def __getitem__(self, i: int) -> dict:
        return {"x": np.int64(i % 7)}


def test_random_transforms_over_more_positions_than_their_keys_hold_are_refused():
    # a record's key is (epoch << 40) | position: past 2**40 positions an epoch, positions p
    # and 2**40 + p drew the same numbers in epoch 1, silently
    import jaxloader as jl

    for transform in (jl.RandomMap(lambda r, rng: r), jl.JitMap(lambda r, key: r)):
        with pytest.raises(ConfigError, match="2,199,023,255,552 record positions.*40 bits"):
            jl.DataLoader(_Huge(), batch_size=4, transforms=[transform])
    with jl.DataLoader(_Huge(), batch_size=4, transforms=[jl.Map(lambda r: r)]) as loader:
        assert next(iter(loader))["x"].tolist() == [0, 1, 2, 3]  # (no key: no limit)


@pytest.mark.parametrize("mixed", [False, True])
def test_an_epoch_past_the_last_one_a_key_holds_is_refused_as_it_is_reached(mixed):
    # past epoch 2**24 a RandomMap raised OverflowError (blamed on the user's transform), a
    # JitMap's keys wrapped to epoch 0's, and the loader's own state was refused on restore
    import jaxloader as jl

    source = jl.ArraySource({"x": np.arange(4)})
    source = jl.mix([source, source], [0.5, 0.5]) if mixed else source
    with jl.DataLoader(source, batch_size=4, num_epochs=None, seed=1,
                       transforms=[jl.RandomMap(lambda r, rng: r)]) as loader:
        state = loader.state_dict()
        last = (1 << 24) * len(loader) - 1
        state["step"] = last
        loader.load_state_dict(state)
        it = iter(loader)
        next(it)
        with pytest.raises(ConfigError, match=f"step {last + 1:,} is in epoch 16,777,216"):
            next(it)


def test_a_global_batch_past_the_records_is_refused_before_its_rows_are_made(monkeypatch):
    # batch_size=10**9 over 100 records made 10**9 rows (8 GB, or a bare MemoryError) before
    # the refusal that names it (the hostile-input audit)
    import jaxloader as jl
    from jaxloader.order import sampling

    made = []
    monkeypatch.setattr(sampling, "check_rows", lambda *a: made.append(a) or np.arange(1))
    with pytest.raises(jl.ConfigError, match=r"batch_size: with last_batch='drop', the global "
                                             r"batch \(1000000000 x 1 processes"):
        sampling.Sampler(100, 10**9, shuffle=False, seed=0, last_batch="drop")
    assert not made
