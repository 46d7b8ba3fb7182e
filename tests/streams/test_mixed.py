"""Streams mixed by weight: exact shares a group, each component in its own epochs, exact
resume (with a weight change), refusals that name the component."""

from __future__ import annotations

import json

import numpy as np
import pytest

import jaxloader as jl
from resume_harness import assert_same_stream, check_resume, check_resume_at_every_step, take
from streams.test_shards import write_jsonl, write_tar

SIZES = (60, 40, 10)  # records of each component (ids 0.., 1000.., 2000..)


def components(tmp_path, window=8):
    """A JSONL stream, a tar stream and a generator: 4 shards each."""
    jsonl = [write_jsonl(tmp_path / f"a-{s}.jsonl", range(s * 15, s * 15 + 15)) for s in range(4)]
    tars = [write_tar(tmp_path / f"b-{s}.tar", range(1000 + s * 10, 1010 + s * 10))
            for s in range(4)]
    return [jl.Stream.jsonl(jsonl, shuffle_window=window),
            jl.Stream.tar(tars, shuffle_window=window),
            jl.Stream.from_generator(lambda s: ({"id": 2000 + s * 3 + i} for i in range(3)
                                                if s * 3 + i < SIZES[2]), 4,
                                     shuffle_window=window)]


def same_keys(record):  # the tar component's record as the others' ({"id"})
    if "__key__" in record:
        return {"id": int(record["__key__"][6:])}
    return {"id": record["id"]}


def loader_of(streams, weights=(0.5, 0.3, 0.2), workers=0, batch_size=20, from_step=None, **kw):
    return jl.StreamLoader(jl.mix(streams, list(weights), from_step=from_step),
                           batch_size=batch_size, seed=3, num_workers=workers,
                           transforms=[jl.Map(same_keys)], process_index=0, process_count=1, **kw)


def component_of(ids):
    return np.asarray(ids) // 1000


@pytest.mark.parametrize("workers", [0, 2])
def test_each_batch_holds_the_weights_shares_and_each_component_its_own_epochs(tmp_path,
                                                                              workers):
    steps = 60
    with loader_of(components(tmp_path), workers=workers) as loader:
        ids = np.stack([b["id"] for b in take(loader, steps)])
    counts = np.stack([np.bincount(component_of(row), minlength=3) for row in ids])
    assert (counts[:, 0] == 10).all()  # 0.5 of 20: exact in every batch
    # cumulative shares within one record of the weights, for each reader's batches
    for reader in range(max(1, workers)):
        mine = counts[reader::max(1, workers)].cumsum(axis=0)
        ideal = np.arange(1, len(mine) + 1)[:, None] * 20 * np.array([0.5, 0.3, 0.2])
        assert np.abs(mine - ideal).max() <= 1, (reader, mine[-1])
    flat = ids.reshape(-1)
    assert len(set(flat[:20].tolist())) == 20, "a batch mixes distinct records"
    small = np.bincount(flat[component_of(flat) == 2] - 2000, minlength=SIZES[2])
    if workers == 0:  # one reader: the generator (10 records, 0.2 of 1200) went through 24
        assert small.min() == small.max() == 24, small  # epochs, each record once in each
    else:  # two readers, each through its own share of the shards, epoch after epoch
        assert small.sum() == 240 and small.min() > 0, small


@pytest.mark.parametrize("k", [1, 7, 23])
def test_resume_continues_the_same_mixed_stream(tmp_path, k):
    streams = components(tmp_path)
    for workers in (0, 2):
        check_resume(lambda: loader_of(streams, workers=workers, from_step={10: [0.2, 0.2, 0.6]}),
                     total=k + 10, k=k)


def test_a_mixed_streams_state_written_with_its_mixture_order_restores_or_is_named(tmp_path):
    # until 2026-11-27 a mixed stream's description held "mixture_order": 1 (the order read
    # since): refused, naming the shards as what differed
    streams = components(tmp_path)
    with loader_of(streams) as first:
        state = first.state_dict()
        expected = take(first, 3)
    older = {**state, "stream": {**state["stream"], "mixture_order": 1}}
    with loader_of(streams) as second:
        second.load_state_dict(older)
        assert_same_stream(take(second, 3), expected)
        with pytest.raises(jl.StateDictError, match=r"state\['stream'\]\['mixture_order'\]: "
                                                    r"expected 1 \(or none\), received 0"):
            second.load_state_dict({**older, "stream": {**older["stream"], "mixture_order": 0}})

    def ordered(described):  # (a PackedStream's description held its mixture's inside)
        if isinstance(described, dict):
            return {**{k: ordered(v) for k, v in described.items()},
                    **({"mixture_order": 1} if "mix" in described else {})}
        return described

    def packed():
        return jl.StreamLoader(jl.PackedStream(jl.mix(streams[:1] * 2, [0.5, 0.5]), "t", 8,
                                               tokenize=lambda r: {"t": np.full(2, r["id"])}),
                               batch_size=4, seed=3, process_index=0, process_count=1)
    with packed() as first:
        state = first.state_dict()
        expected = take(first, 2)
    assert ordered(state["stream"]) != state["stream"] and "mix" not in state["stream"]
    with packed() as second:
        second.load_state_dict({**state, "stream": ordered(state["stream"])})
        assert_same_stream(take(second, 2), expected)


def test_a_weight_change_keeps_the_steps_before_it(tmp_path):
    streams = components(tmp_path)
    with loader_of(streams, workers=2) as plain:
        before = take(plain, 12)
    with loader_of(streams, workers=2, from_step={6: [0, 0, 1]}) as changed:
        after = take(changed, 12)
    for s in range(6):
        assert before[s]["id"].tolist() == after[s]["id"].tolist(), s
    for s in range(6, 12):
        assert (component_of(after[s]["id"]) == 2).all(), s


def test_a_restore_may_add_weight_changes_from_its_step_on_only(tmp_path):
    streams = components(tmp_path)
    with loader_of(streams) as first:
        take(first, 5)
        state = json.loads(json.dumps(first.state_dict()))
    assert state["mixture"] == [[0, [0.5, 0.3, 0.2]]]
    with loader_of(streams, from_step={5: [0, 1, 0]}) as later:
        later.load_state_dict(state)
        assert (component_of(take(later, 1)[0]["id"]) == 1).all()
    with loader_of(streams, from_step={3: [0, 1, 0]}) as earlier:
        with pytest.raises(jl.StateDictError, match=r"weights before step 5 differ"):
            earlier.load_state_dict(state)
    with loader_of(streams, weights=(0.2, 0.3, 0.5)) as other:
        with pytest.raises(jl.StateDictError, match=r"weights before step 5 differ"):
            other.load_state_dict(state)
    with loader_of(streams, weights=(5, 3, 2)) as same:  # normalised: the same numbers
        same.load_state_dict(state)
    with loader_of(streams, weights=(0.3, 0.35, 0.35)) as first:
        take(first, 5)
        state = json.loads(json.dumps(first.state_dict()))
    with loader_of(streams, weights=(6, 7, 7)) as other:  # one rounding apart: other steps
        with pytest.raises(jl.StateDictError, match=r"only to their last digits"):
            other.load_state_dict(state)


def record_tokens(record):
    """Record ``i``'s tokens: ``1 + i % 5`` of them, each ``i + 1`` (0 is padding)."""
    i = same_keys(record)["id"]
    return {"t": np.full(1 + i % 5, i + 1)}


def keep_a_quarter_of_the_first(record):
    return record["id"] >= 1000 or record["id"] % 4 == 0


def reading_more_than_its_rows(streams, how, from_step=None, workers=0):
    """A mixture whose batches read more records than their rows: packed (rows of 12
    tokens, ~4 records a row) or under a Filter that drops 3 of 4 of the first component's
    records. Two readers, so a state restores into 0 or 2 workers."""
    mixed = jl.mix(streams, [1, 0, 1], from_step=from_step)
    if how == "filter":
        return jl.StreamLoader(mixed, batch_size=4, seed=3, num_workers=workers,
                               readers_per_process=2, process_index=0, process_count=1,
                               transforms=[jl.Map(same_keys),
                                           jl.Filter(keep_a_quarter_of_the_first)])
    packed = jl.PackedStream(mixed, "t", 12, tokenize=record_tokens, method=how, window=5)
    return jl.StreamLoader(packed, batch_size=2, seed=3, num_workers=workers,
                           readers_per_process=2, process_index=0, process_count=1)


def components_in(batch):
    ids = batch["id"] if "id" in batch else batch["t"][batch["t"] > 0] - 1
    return set(component_of(ids).tolist())


@pytest.mark.parametrize("how", ["filter", "concat", "best_fit"])
def test_a_weight_change_starts_at_its_step_when_batches_read_more_records(tmp_path, how):
    # Its group is where the reader is as it makes its first batch at the step, not where
    # it would be at batch_size records a batch (here ~4 times fewer than it reads).
    streams = components(tmp_path)
    with reading_more_than_its_rows(streams, how, workers=2) as loader:
        plain = take(loader, 24)
    with reading_more_than_its_rows(streams, how, {12: [1, 0, 0]}, workers=2) as loader:
        changed = take(loader, 24)
    assert set().union(*(components_in(b) for b in plain[:12])) == {0, 2}
    for s in range(12):  # the steps before it are the same
        assert_same_stream([changed[s]], [plain[s]], f"step {s}")
    after = [components_in(b) for b in changed[12:]]
    assert all(c == {0} for c in after[4:]), after  # each reader's group ends within 2 steps


@pytest.mark.parametrize("how", ["filter", "concat", "best_fit"])
@pytest.mark.parametrize("k", [3, 9])
def test_a_restore_may_add_a_weight_change_when_batches_read_more_records(tmp_path, how, k):
    streams = components(tmp_path)
    change = {k + 2: [0, 0, 1]}
    check_resume(lambda: reading_more_than_its_rows(streams, how, change),
                 total=k + 12, k=k,
                 make_restored=lambda: reading_more_than_its_rows(streams, how, change, 2))
    with reading_more_than_its_rows(streams, how, change) as loader:  # the change added there
        reference = take(loader, k + 12)
    with reading_more_than_its_rows(streams, how) as first:
        head = take(first, k)
        state = json.loads(json.dumps(first.state_dict()))
    with reading_more_than_its_rows(streams, how, change, workers=2) as restored:
        restored.load_state_dict(state)
        assert_same_stream(head + take(restored, 12), reference)


def test_a_state_names_where_its_weight_changes_started_and_a_bad_one_is_refused(tmp_path):
    streams = components(tmp_path)
    with loader_of(streams, from_step={5: [0.2, 0.2, 0.6]}, batch_size=4) as first:
        take(first, 9)
        state = json.loads(json.dumps(first.state_dict()))
    assert state["readers"][0]["started"] == [[5, 3]]  # groups of 2 batches of 4 (>= 3 x 2)
    for bad in ([[5, 3], [5, 4]], [[6, 3]], [[5, -1]], "5", None):
        state["readers"][0]["started"] = bad
        with loader_of(streams, from_step={5: [0.2, 0.2, 0.6]}, batch_size=4) as restored:
            with pytest.raises(jl.StateDictError, match=r"started: expected \[\[step, group\]"):
                restored.load_state_dict(state)


def test_small_batches_and_many_components_keep_every_share_whole(tmp_path):
    """A batch of 4 for 3 components: groups of 2 batches (8 slots >= 3 * 2), no share
    below zero; the shares hold over each group."""
    streams = components(tmp_path, window=0)
    with loader_of(streams, weights=(0.1, 0.1, 0.8), batch_size=4) as loader:
        ids = np.concatenate([b["id"] for b in take(loader, 40)])
    counts = np.bincount(component_of(ids), minlength=3)
    assert counts.tolist() == [16, 16, 128]


def test_bad_mixtures_are_refused_naming_the_component(tmp_path):
    streams = components(tmp_path)
    few = jl.Stream.from_generator(lambda s: iter(range(3)), 1)
    with pytest.raises(jl.ConfigError, match=r"mix\(streams\)\[1\]: Stream: 1 shards for 2 "
                                             r"readers"):
        jl.StreamLoader(jl.mix([streams[0], few], [1, 1]), batch_size=4, num_workers=2,
                        process_index=0, process_count=1)
    empty = jl.Stream.from_generator(lambda s: iter(()), 1)  # (named by its shards alone)
    with pytest.raises(jl.ConfigError, match=r"mix\(streams\)\[1\]: stream reader 0: no "
                                             r"records in any"):
        next(iter(jl.StreamLoader(jl.mix([streams[0], empty], [1, 1]), batch_size=4,
                                  process_index=0, process_count=1)))
    source = jl.ArraySource({"id": np.arange(5)})
    with pytest.raises(jl.ConfigError, match=r"sources \[0\] are streams .* and \[1\] are not"):
        jl.mix([streams[0], source], [1, 1])
    with pytest.raises(jl.ConfigError, match=r"weights must be finite and >= 0"):
        jl.mix(streams, [1, -1, 1])
    with pytest.raises(jl.ConfigError, match=r"a mixture of streams inside a mixture; mix the "
                                             r"streams in one jl.mix"):
        jl.mix([jl.mix(streams[:2], [1, 1]), streams[2]], [1, 1])
    with loader_of(streams) as loader:
        take(loader, 2)
        state = loader.state_dict()
    with jl.StreamLoader(streams[0], batch_size=20, seed=3, process_index=0,
                         process_count=1) as single:
        with pytest.raises(jl.StateDictError, match=r"\(the state is from a loader over a "
                                                    r"mixture, this one reads a plain stream "):
            single.load_state_dict(state)  # (that alone: not each key the two lack)


@pytest.mark.e2e
def test_two_processes_read_apart_and_change_weights_at_the_same_step(tmp_path):
    """2 processes x 2 workers: 4 readers, each its own share of every component; a change
    from step 5 applies to both processes' step 5 on (each reader's batches map to steps;
    a batch of 6 >= 3 * 2 is a group of its own)."""
    streams = components(tmp_path)
    got = []
    for p in range(2):
        with jl.StreamLoader(jl.mix(streams, [0.5, 0.5, 0], from_step={5: [0, 0, 1]}),
                             batch_size=6, seed=1, num_workers=2, transforms=[jl.Map(same_keys)],
                             process_index=p, process_count=2) as loader:
            got.append([b["id"] for b in take(loader, 9)])
        check_resume(lambda: jl.StreamLoader(
            jl.mix(streams, [0.5, 0.5, 0], from_step={5: [0, 0, 1]}), batch_size=6, seed=1,
            num_workers=2, transforms=[jl.Map(same_keys)], process_index=p, process_count=2),
            total=9, k=3)
    for p in range(2):
        assert all((component_of(b) < 2).all() for b in got[p][:5]), p
        assert all((component_of(b) == 2).all() for b in got[p][5:]), p
    first = [set(np.concatenate(got[p][:5]).tolist()) for p in range(2)]
    assert not first[0] & first[1], "the processes' readers read other shards"


def test_orbax_saves_and_restores_a_mixed_streams_position(tmp_path):
    import orbax.checkpoint as ocp

    from jaxloader.checkpoint import LoaderRestore, LoaderSave

    streams = components(tmp_path)
    with loader_of(streams, workers=2, from_step={6: [0.2, 0.2, 0.6]}) as loader:
        take(loader, 4)
        with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
            manager.save(4, args=ocp.args.Composite(loader=LoaderSave(loader)))
            manager.wait_until_finished()
        expected = [b["id"].tolist() for b in take(loader, 5)]
    with loader_of(streams, workers=2, from_step={6: [0.2, 0.2, 0.6]}) as fresh:
        with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
            manager.restore(4, args=ocp.args.Composite(loader=LoaderRestore(fresh)))
        assert fresh.step == 4 and [b["id"].tolist() for b in take(fresh, 5)] == expected


def uneven_components(window=3):
    """Two generator streams of 4 shards: 24 records (ids 0..) and 123 (ids 1000..), so the
    first runs out about halfway through a pass at 0.7 / 0.3."""
    def of(base, sizes):
        starts = np.cumsum([0, *sizes])
        return jl.Stream.from_generator(
            lambda s: ({"id": base + i} for i in range(starts[s], starts[s] + sizes[s])),
            len(sizes), shuffle_window=window)
    return [of(0, [7, 9, 3, 5]), of(1000, [30, 25, 28, 40])]


def mixed_pass(workers=0, num_epochs=1, how="plain", weights=(0.7, 0.3), from_step=None,
               window=3, stopping="all_exhausted_without_replacement", rows=2):
    """A pass over ``uneven_components``: 2 readers, so a state restores into 0, 1 or 2
    workers; plain, under a Filter (odd ids dropped) or packed (``record_tokens``)."""
    mixed = jl.mix(uneven_components(window), list(weights), from_step=from_step,
                   stopping_strategy=stopping)
    kw = dict(seed=3, num_workers=workers, readers_per_process=2, num_epochs=num_epochs,
              process_index=0, process_count=1)
    if how in ("concat", "best_fit"):
        packed = jl.PackedStream(mixed, "t", 8, tokenize=record_tokens, method=how, window=6)
        return jl.StreamLoader(packed, batch_size=rows, **kw)
    keep = [jl.Filter(lambda r: r["id"] % 2 == 0)] if how == "filter" else []
    return jl.StreamLoader(mixed, batch_size=4, transforms=keep, **kw)


ALL_IDS = [*range(24), *range(1000, 1123)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("num_epochs", [1, 2])
def test_a_pass_over_a_mixture_reads_every_record_of_every_component(workers, num_epochs):
    with mixed_pass(workers, num_epochs) as loader:
        passes = [[{k: np.array(v) for k, v in b.items()} for b in loader] for _ in range(2)]
    for batches in passes:
        ids = np.concatenate([b["id"][b["mask"]] for b in batches])
        assert sorted(ids.tolist()) == sorted(ALL_IDS * num_epochs)
    first = np.stack([b["id"] for b in passes[0]])
    # while both components last, each batch holds the weights' shares (1 of 4 from the
    # second at 0.3); once the first runs out, the second fills the batches
    assert (component_of(first[:8]) == 1).sum(axis=1).tolist() == [1] * 8
    assert all((component_of(b["id"][b["mask"]]) == 1).all() for b in passes[0][-8:])
    assert not all(np.array_equal(a["id"], b["id"]) for a, b in zip(*passes))  # reshuffled


def test_a_pass_over_a_mixture_resumes_at_every_step_and_the_next_pass_is_the_same():
    # A reader whose components have run out ends at the same place after a restore, found
    # out from the components' states (the next pass's records depend on it).
    check_resume_at_every_step(mixed_pass, 90)  # two passes of 41 and 42 steps, and a part


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["filter", "concat", "best_fit"])
@pytest.mark.parametrize("k", [5, 33, 45])
def test_a_pass_over_a_mixture_filtered_or_packed_resumes_into_other_worker_counts(how, k):
    check_resume(lambda: mixed_pass(2, how=how), total=k + 30, k=k,
                 make_restored=lambda: mixed_pass(0, how=how))
    with mixed_pass(how=how) as loader:
        batches = list(loader)
    if how == "filter":
        ids = np.concatenate([b["id"][b["mask"]] for b in batches])
        assert sorted(ids.tolist()) == [i for i in ALL_IDS if i % 2 == 0]
    else:  # every token once: record i's tokens are 1 + i % 5 of i + 1
        tokens = np.concatenate([b["t"][b["mask"]].reshape(-1) for b in batches])
        counts = np.bincount(tokens[tokens > 0] - 1, minlength=1123)
        assert counts[ALL_IDS].tolist() == [1 + i % 5 for i in ALL_IDS]
        assert counts.sum() == counts[ALL_IDS].sum()


def test_a_pass_over_a_mixture_ends_when_the_components_left_have_no_weight():
    # From step 3 the second component has weight 0: once the first has run out, nothing is
    # left to read by weight, and the pass ends (rather than scan for a slot forever); said as
    # the loader is made (it ended without the rest of its records, without a word)
    with pytest.warns(jl.JaxloaderWarning, match=r"component 1 of the streams has weight 0 "
                                                 r"from step 3, so a pass \(num_epochs=1\) "
                                                 r"ends .*without the rest of its records"):
        loader = mixed_pass(from_step={3: [1, 0]})
    with pytest.warns(jl.JaxloaderWarning, match=r"component 1 of the streams has weight 0 "
                                                 r"until step 1000, .*without its records if "
                                                 r"that is before then"):  # (it ends at ~41)
        mixed_pass(weights=(1, 0), from_step={1000: [1, 1]}).close()
    with loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
        again = [{k: np.array(v) for k, v in b.items()} for b in loader]
    ids = np.concatenate([b["id"][b["mask"]] for b in batches])
    assert set(range(24)) <= set(ids.tolist()) and len(ids) == len(set(ids.tolist()))
    assert (component_of(ids) == 1).sum() < 123 and len(batches) < 20
    assert again and np.concatenate([b["id"][b["mask"]] for b in again]).size


def test_a_pass_left_with_a_component_of_tiny_weight_finds_its_slots_without_a_scan(
        monkeypatch):
    # Once the first component ran out, the second (weight 1e-6: a slot every ~250,000 groups
    # of 4) was looked for group by group, each laid out: 55 s for its 3 records, hours at 1e-8
    from jaxloader.streams import mixed_reader as mixed

    laid_out = []
    lay_out = mixed.MixedReader._lay_out

    def counted(self, group):
        laid_out.append(group)
        assert len(laid_out) < 1000, "groups laid out one by one"
        return lay_out(self, group)

    monkeypatch.setattr(mixed.MixedReader, "_lay_out", counted)
    for weight in (1e-6, 1e-12):
        laid_out.clear()
        parts = [jl.Stream.from_generator(lambda i, v=v, n=n: ({"x": v} for _ in range(n)), 1)
                 for v, n in ((0, 6), (1, 3))]
        with jl.StreamLoader(jl.mix(parts, [1, weight]), batch_size=4, num_epochs=1,
                             process_index=0, process_count=1) as loader:
            batches = [(b["x"].tolist(), b["mask"].tolist()) for b in loader]
        assert batches == [([0, 0, 0, 0], [True] * 4), ([0, 0, 1, 1], [True] * 4),
                           ([1, 0, 0, 0], [True, False, False, False])]


def pass_ids(batches):
    return np.concatenate([b["id"][b["mask"]] for b in batches])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("num_epochs", [1, 2])
def test_a_first_exhausted_pass_ends_with_its_first_component(workers, num_epochs):
    # The first component (24 records at 0.7) runs out first: each reader's epoch ends
    # there, the second's (123 at 0.3) cut short; the next pass reads the second's next epoch
    with mixed_pass(workers, num_epochs, stopping="first_exhausted") as loader:
        passes = [[{k: np.array(v) for k, v in b.items()} for b in loader] for _ in range(2)]
    seconds = []
    for batches in passes:
        ids = pass_ids(batches)
        first, second = ids[ids < 1000], ids[ids >= 1000]
        assert sorted(first.tolist()) == sorted([*range(24)] * num_epochs)
        assert 0 < len(second) < 123 and np.bincount(second - 1000).max() <= num_epochs
        assert abs(len(second) / len(ids) - 0.3) < 0.08  # the weights' shares to the end
        seconds.append(sorted(second.tolist()))
    assert seconds[0] != seconds[1]  # the second pass: the second component's next epochs
    with mixed_pass(workers, num_epochs) as loader:  # the default: every record, longer
        assert sorted(pass_ids(list(loader)).tolist()) == sorted(ALL_IDS * num_epochs)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_all_exhausted_pass_oversamples_until_every_component_has_read_its_epoch(workers):
    # The second component (123 records at 0.3) ends each reader's pass: all of it once,
    # the first (24 at 0.7) started again each time it ran out
    with mixed_pass(workers, stopping="all_exhausted") as loader:
        passes = [[{k: np.array(v) for k, v in b.items()} for b in loader] for _ in range(2)]
    for batches in passes:
        ids = pass_ids(batches)
        first, second = ids[ids < 1000], ids[ids >= 1000]
        assert sorted(second.tolist()) == [*range(1000, 1123)]
        counts = np.bincount(first, minlength=24)
        assert counts.min() >= 3  # oversampled: its epochs one after another
        assert abs(len(second) / len(ids) - 0.3) < 0.05
    with pytest.warns(jl.JaxloaderWarning, match=r"component 1 .* weight 0 from step 3"):
        loader = mixed_pass(workers, stopping="all_exhausted", from_step={3: [1, 0]})
    with loader:
        ids = pass_ids(list(loader))  # a component with no weight is not waited for
    assert set(ids.tolist()) >= set(range(24)) and (ids >= 1000).sum() < 123


def test_an_endless_first_exhausted_mixture_starts_every_component_again():
    # one shard each, in order: the second component starts again each time the first has
    # run out (its ids stay low); by default it reads on through its own epoch
    def of(base, n):
        return jl.Stream.from_generator(lambda s: ({"id": base + i} for i in range(n)), 1,
                                        shuffle_shards=False)

    def ids(stopping):
        mixed = jl.mix([of(0, 10), of(1000, 1000)], [0.5, 0.5], stopping_strategy=stopping)
        with jl.StreamLoader(mixed, batch_size=4, process_index=0, process_count=1) as loader:
            return np.concatenate([b["id"] for b in take(loader, 30)])

    got = ids("first_exhausted")
    first, second = got[got < 1000], got[got >= 1000]
    assert first.tolist() == [*range(10)] * 6 and second.max() < 1000 + 15
    assert (np.diff(second) < 0).sum() == 5  # started again 5 times, in order between
    assert ids("all_exhausted_without_replacement").max() >= 1000 + 50


@pytest.mark.e2e
@pytest.mark.parametrize("stopping", ["first_exhausted", "all_exhausted"])
def test_a_pass_that_ends_by_its_strategy_resumes_at_every_step_and_into_other_worker_counts(
        stopping):
    def loader(workers=0, how="plain"):
        return mixed_pass(workers, how=how, stopping=stopping)

    check_resume_at_every_step(loader, 60)  # three passes and a part
    for how in ("filter", "concat", "best_fit"):
        for k in (4, 17, 30):
            check_resume(lambda: loader(2, how), total=k + 25, k=k,
                         make_restored=lambda: loader(0, how))


def test_stopping_strategies_are_checked_and_a_state_keeps_its_own():
    streams = uneven_components()
    with pytest.raises(jl.ConfigError, match=r"stopping_strategy=\.\.\.\): expected one of "
                                             r"\['all_exhausted_without_replacement', "
                                             r"'first_exhausted', 'all_exhausted'\] "
                                             r"\(.*\), got 'first'"):
        jl.mix(streams, [1, 1], stopping_strategy="first")
    with pytest.raises(jl.ConfigError, match="a mixture of sources has no component epochs"):
        jl.mix([[{"x": 1}], [{"x": 2}]], [1, 1], stopping_strategy="first_exhausted")
    with mixed_pass(stopping="first_exhausted") as first:
        take(first, 3)
        state = first.state_dict()
    for other in (mixed_pass(), mixed_pass(stopping="all_exhausted")):
        with other, pytest.raises(jl.StateDictError, match="stopping_strategy"):
            other.load_state_dict(state)
    with mixed_pass(stopping="all_exhausted") as first:
        take(first, 3)
        state = first.state_dict()
    state["readers"][0]["starts"] = [0, 5]
    with mixed_pass(stopping="all_exhausted") as other, pytest.raises(
            jl.StateDictError, match=r"starts \(each component's epoch .*\[0, 5\]"):
        other.load_state_dict(state)


@pytest.mark.parametrize("how, rows, change", [("concat", 1, 3), ("best_fit", 2, 6)])
@pytest.mark.parametrize("stopping", ["all_exhausted_without_replacement", "first_exhausted",
                                      "all_exhausted"])
def test_a_packed_pass_over_a_mixture_resumes_at_every_step_around_a_weight_change(
        how, rows, change, stopping):
    # In a pass a packing reader reads ahead what its next row is made of (whether a row is
    # left); read before a weight change starts, it was laid out by the old weights, where a
    # restore from the state before it read it by the new ones
    def loader():
        return mixed_pass(how=how, from_step={change: [0.2, 0.8]}, stopping=stopping,
                          rows=rows)

    check_resume_at_every_step(loader, 24)


def test_an_all_exhausted_mixture_on_two_readers_reads_every_record_each_pass():
    # each reader counted its components' epochs on from its own repeats, and a component's
    # shards are dealt to the readers by its epoch's number: from the third pass the readers
    # asked for other epochs, two read one shard and another none (up to 97 of 199 records
    # never read in a pass; the property-based audit)
    sizes = [[21, 22, 31, 38], [6, 10, 33, 38]]

    def make(c):
        return jl.Stream.from_generator(lambda shard: ({"id": np.int64(
            c * 100_000 + shard * 1000 + t)} for t in range(sizes[c][shard])), shards=4)

    every = {c * 100_000 + s * 1000 + t for c in range(2) for s, n in enumerate(sizes[c])
             for t in range(n)}
    mixed = jl.mix([make(0), make(1)], [0.5, 0.5], stopping_strategy="all_exhausted")
    with jl.StreamLoader(mixed, batch_size=4, readers_per_process=2, num_epochs=1,
                         process_index=0, process_count=1) as loader:
        for _ in range(5):
            read = {int(i) for b in loader for i in b["id"][b["mask"]]}
            assert read == every, sorted(every - read)[:8]


def test_a_packed_mixtures_state_into_a_mixture_is_refused_showing_both(tmp_path):
    # a PackedStream over a mixture was taken for a plain stream: the refusal said only "the
    # state is from a loader over a plain stream, this one reads a mixture" (the review)
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"t": list(range(1, 5 + i % 7))}) + "\n" for i in range(50)))

    def mixed():
        return jl.mix([jl.Stream.jsonl([str(tmp_path / "a.jsonl")]),
                       jl.Stream.jsonl([str(tmp_path / "b.jsonl")])], [0.5, 0.5])

    def make(stream):
        return jl.StreamLoader(stream, batch_size=4, process_index=0, process_count=1)
    with make(jl.PackedStream(mixed(), "t", 16)) as loader:
        next(iter(loader))
        state = loader.state_dict()
    with make(mixed()) as other, pytest.raises(
            jl.StateDictError, match=r"\(stream: expected \{'mix': .*received \{'packed': "):
        other.load_state_dict(state)
