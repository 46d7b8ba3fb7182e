"""StreamLoader(num_epochs=n): passes that end (every record n times, padded and masked),
the same with any worker count, resumed exactly mid-pass and across passes."""

from __future__ import annotations

import json
import logging
import os
import re
import warnings

import numpy as np
import pytest

import jaxloader as jl
from launch import run_hosts
from resume_harness import assert_same_stream, check_resume, take
from test_stream_loader import (PER_SHARD, SHARDS, STREAMS, generator_stream, jsonl_stream,
                                keep_not_multiple_of_3, loader_of)

pytestmark = pytest.mark.timeout(180)
RECORDS = SHARDS * PER_SHARD


def uneven_stream(**kw):
    """4 shards of 40, 3, 50 and 1 records: readers end far apart."""
    sizes = [40, 3, 50, 1]
    starts = np.cumsum([0, *sizes])
    return jl.Stream.from_generator(
        lambda s: ({"id": i} for i in range(starts[s], starts[s] + sizes[s])), len(sizes), **kw)


def counted(batches, key="id"):
    """Each record's count over ``batches``, the masked rows left out."""
    ids = np.concatenate([b[key][b["mask"]] for b in batches])
    return np.bincount(ids)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", list(STREAMS))
def test_a_pass_holds_every_record_once_and_ends(tmp_path, kind, num_workers):
    make, transforms = STREAMS[kind]
    with loader_of(make(tmp_path, shuffle_window=16), transforms, num_workers,
                   batch_size=7, num_epochs=1) as loader:
        batches = list(loader)
        again = list(loader)  # the next pass: the next epoch, reshuffled
    for one in (batches, again):
        assert all(b["id"].shape == (7,) and b["mask"].dtype == bool for b in one)
        counts = counted(one)
        assert len(counts) == RECORDS and counts.min() == counts.max() == 1
        assert all(b["mask"].all() for b in one[:-max(1, num_workers)])  # padding at the end
    assert not all(np.array_equal(a["id"], b["id"]) for a, b in zip(batches, again))


@pytest.mark.parametrize("num_workers", [0, 2, 4])
def test_readers_done_early_give_masked_batches_until_the_last_is_done(num_workers):
    with jl.StreamLoader(uneven_stream(shuffle_window=4), batch_size=4, num_epochs=2, seed=3,
                         num_workers=num_workers, readers_per_process=4, process_index=0,
                         process_count=1) as loader:
        batches = list(loader)
    counts = counted(batches)
    assert len(counts) == 94 and counts.min() == counts.max() == 2
    # the pass ends with the batch that holds the last record: its round of 4 steps has one
    assert batches[-4:] and any(b["mask"].any() for b in batches[-4:])
    assert sum(not b["mask"].any() for b in batches) > 0  # the short readers' steps
    padding = [b["id"][~b["mask"]] for b in batches]
    assert all(np.isin(p, np.concatenate([b["id"][b["mask"]] for b in batches])).all()
               for p in padding)  # rows that pad repeat a record of the pass


def test_the_batches_are_the_same_with_any_worker_count():
    def run(workers):
        with jl.StreamLoader(uneven_stream(shuffle_window=5), batch_size=3, num_epochs=1,
                             transforms=[jl.RandomMap(lambda r, rng: {**r, "u": rng.random()})],
                             num_workers=workers, readers_per_process=4, process_index=0,
                             process_count=1) as loader:
            return take(loader, 60)  # three passes and a part
    reference = run(0)
    for workers in (1, 2, 4):
        assert_same_stream(run(workers), reference, f"{workers} workers")


@pytest.mark.e2e
@pytest.mark.parametrize("k", [1, 9, 17, 40, 47])  # mid-pass, a reader done, the last
def test_resume_mid_pass_and_across_passes_continues_the_same_stream(k):  # step, next pass
    # 94 records in readers of 41, 3+... : a pass is 4 x 13 = 52 steps of 1
    for workers, other in ((0, 2), (2, 4), (4, 0)):
        check_resume(lambda: jl.StreamLoader(
            uneven_stream(shuffle_window=4), batch_size=4, num_epochs=1, num_workers=workers,
            readers_per_process=4, process_index=0, process_count=1), total=k + 20, k=k,
            make_restored=lambda: jl.StreamLoader(
                uneven_stream(shuffle_window=4), batch_size=4, num_epochs=1,
                num_workers=other, readers_per_process=4, process_index=0, process_count=1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_resume_as_the_next_pass_begins_continues_that_pass(seed):
    # In the next pass's first steps some of the 4 readers have made no batch of it yet
    # (their states are the last pass's, ended), and a short shard's reader may end it in its
    # first batch: a restore must put every reader in the second pass.
    def make(workers=0):
        return lambda: jl.StreamLoader(uneven_stream(shuffle_window=4), batch_size=4,
                                       num_epochs=1, seed=seed, num_workers=workers,
                                       readers_per_process=4, process_index=0,
                                       process_count=1)
    with make()() as loader:
        first = len(list(loader))
    for k in range(first, first + 5):
        check_resume(make(), total=k + 60, k=k, make_restored=make(2))


def test_a_state_names_its_pass_and_a_malformed_one_is_refused():
    def make(num_epochs=1):
        return jl.StreamLoader(uneven_stream(), batch_size=4, num_epochs=num_epochs,
                               readers_per_process=4, process_index=0, process_count=1)
    with make() as loader:
        assert "pass" not in loader.state_dict()  # before the first pass: its readers say
        list(loader)
        next(iter(loader))
        state = loader.state_dict()
    assert state["pass"] == {"num_epochs": 1, "until": 2}
    for bad in ({"num_epochs": 1, "until": 1}, {"num_epochs": 1, "until": "2"}, [1, 2]):
        with make() as loader, pytest.raises(jl.StateDictError, match=r"state\['pass'\]"):
            loader.load_state_dict({**state, "pass": bad})
    with make(num_epochs=2) as other:  # passes of another length: the readers' states say
        other.load_state_dict(state)
        assert "pass" not in other.state_dict()
        assert counted(list(other)).max() == 1  # the rest of epoch 1: to the end of [0, 2)
        # (run to its end: the state says the pass ended, which every process saw)
        assert other.state_dict()["pass"] == {"num_epochs": 2, "until": 2, "ended": True}


def test_a_state_whose_readers_are_passes_apart_under_another_num_epochs_is_refused():
    # saved endless (or with num_epochs=2), the readers epochs apart, restored into
    # num_epochs=1: the furthest reader's pass had the others read on through it, records
    # two or three times in one pass (48 records in a pass of 22), without a word
    def make(num_epochs):
        return jl.StreamLoader(uneven_stream(), batch_size=4, num_epochs=num_epochs,
                               readers_per_process=4, process_index=0, process_count=1)
    for saved_with in (None, 2):
        with make(saved_with) as loader:
            batches = iter(loader)
            for _ in range(12):
                next(batches)
            state = loader.state_dict()
        epochs = [r["epoch"] for r in state["readers"]]
        assert max(epochs) >= 1 > min(epochs), epochs  # (the 1-record shard's reader ahead)
        with make(1) as other, pytest.raises(
                jl.StateDictError, match=r"the readers are in epochs \[.*\] \((saved with "
                r"num_epochs=2|its state holds no pass: saved endless.*)\); under num_epochs=1, "
                r"readers \[.*\] are in a pass before the others' .*restore it with the "
                r"num_epochs it was saved with"):
            other.load_state_dict(state)


def test_iter_again_as_the_next_pass_begins_finishes_that_pass():
    for k in range(1, 4):  # batches of the second pass before iter() again
        with jl.StreamLoader(uneven_stream(shuffle_window=4), batch_size=4, num_epochs=1,
                             readers_per_process=4, process_index=0,
                             process_count=1) as loader:
            list(loader)
            it = iter(loader)
            head = [jl_copy(next(it)) for _ in range(k)]
            second = head + [jl_copy(b) for b in loader]  # the rest of the second pass
        counts = counted(second)
        assert len(counts) == 94 and counts.min() == counts.max() == 1, k


def test_a_loop_over_epochs_around_passes_of_several_is_said_once():
    # (as a DataLoader says it: num_epochs=2 in a loop over 3 epochs read 6, without a word)
    for epochs, expected in ((2, ["begins epochs 2 to 3"]), (1, [])):
        with jl.StreamLoader(uneven_stream(), batch_size=4, num_epochs=epochs,
                             readers_per_process=2, process_index=0, process_count=1) as loader:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                passes = [counted(list(loader)) for _ in range(3)]
        found = [re.search(r"begins epochs \d+ to \d+", str(w.message)).group() for w in said
                 if "a pass after the first" in str(w.message)]
        assert found == expected and all(c.min() == c.max() == epochs for c in passes), found


@pytest.mark.parametrize("kind", ["tar", "compressed jsonl"])
def test_resume_of_file_streams_in_a_pass(tmp_path, kind):
    make, transforms = STREAMS[kind]
    for k in (3, 11):  # a pass of 120 records in 2 readers: 2 x 9 steps of 7
        check_resume(lambda: loader_of(make(tmp_path, shuffle_window=8), transforms, 2,
                                       batch_size=7, num_epochs=1), total=k + 12, k=k)


def test_a_state_at_the_end_of_a_pass_starts_the_next_pass(caplog):
    def make():
        return jl.StreamLoader(uneven_stream(shuffle_window=4), batch_size=8, num_epochs=1,
                               readers_per_process=2, process_index=0, process_count=1)
    with make() as loader:
        first, second = list(loader), list(loader)
        state = None
    with make() as loader:
        assert_same_stream(list(loader), first)
        state = loader.state_dict()
    assert all(r["ended"] is True for r in state["readers"])
    with make() as restored:  # (a run that had ended there would train on: said, once, in
        restored.load_state_dict(state)  # the log: a pass of one epoch, an epoch loop's)
        with warnings.catch_warnings(), caplog.at_level(logging.INFO, "jaxloader"):
            warnings.simplefilter("error")
            assert_same_stream(list(restored), second)
            assert re.search(r"StreamLoader was restored at the end of a pass: this iter\(\) "
                             r"begins the next one, 1 more", caplog.text)
            caplog.clear()
            assert list(restored)  # (a stream's passes may differ in batches)
            assert "end of a pass" not in caplog.text
    with make() as loader:  # (saved in the loop, after the last batch: no "ended" yet)
        inside = [loader.state_dict() for _ in loader]
    with make() as restored:
        restored.load_state_dict(inside[-1])
        with caplog.at_level(logging.INFO, "jaxloader"):
            assert_same_stream(list(restored), second)
        assert "restored at the end of a pass" in caplog.text
        restored.load_state_dict(inside[-2])  # (one batch before: the rest of that pass)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(list(restored)) == 1


def test_a_pass_of_two_epochs_restored_in_its_second_ends_where_the_saved_run_would():
    def make(workers=0):
        return jl.StreamLoader(uneven_stream(shuffle_window=4), batch_size=5, num_epochs=2,
                               num_workers=workers, readers_per_process=2, process_index=0,
                               process_count=1)
    with make() as loader:
        full = list(loader)
    assert counted(full).min() == counted(full).max() == 2
    k = len(full) - 4  # every reader in its second epoch (or done)
    with make() as loader:
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = loader.state_dict()
    assert {r["epoch"] for r in state["readers"]} == {1}
    with make(2) as restored:
        restored.load_state_dict(state)
        assert_same_stream(list(restored), full[k:])
        ended = restored.state_dict()  # (at the pass's end: a pass of two epochs warns)
    with make() as restored:
        restored.load_state_dict(ended)
        with pytest.warns(UserWarning, match=r"StreamLoader was restored at the end of a "
                                             r"pass: this iter\(\) begins the next one, 2 more"):
            next(iter(restored))


def test_iter_again_mid_pass_finishes_that_pass():
    with jl.StreamLoader(uneven_stream(), batch_size=5, num_epochs=1, readers_per_process=2,
                         process_index=0, process_count=1) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(4)]
        rest = list(loader)  # iter() again: the same pass, to its end
        assert loader.peek()["mask"].all()  # the next pass's first batch
        nxt = next(iter(loader))
    counts = counted(head + rest)
    assert len(counts) == 94 and counts.min() == counts.max() == 1
    assert nxt["mask"].all()


def test_peek_in_a_pass_gives_the_next_batch(tmp_path):
    with loader_of(jsonl_stream(tmp_path, shuffle_window=4), [], 2, batch_size=7,
                   num_epochs=1) as loader:
        it = iter(loader)
        for _ in range(16):  # into the last, padded batches
            next(it)
        peeked = loader.peek()
        assert_same_stream([peeked], [next(it)])
        assert not peeked["mask"].all()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_filter_in_a_pass_pads_with_a_record_it_keeps(tmp_path, num_workers):
    with loader_of(generator_stream(tmp_path, shuffle_window=5),
                   [jl.Filter(keep_not_multiple_of_3)], num_workers, batch_size=8,
                   num_epochs=1) as loader:
        batches = list(loader)
    counts = counted(batches)
    kept = np.arange(RECORDS)[np.arange(RECORDS) % 3 != 0]
    assert np.array_equal(np.nonzero(counts)[0], kept) and counts[kept].max() == 1
    assert all((b["id"] % 3 != 0).all() for b in batches)  # padding too


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.e2e)])
def test_a_filter_that_drops_a_readers_last_record_with_no_shuffle_window(num_workers):
    # Each window is one record, and both shards' last records (9, 21) are dropped: a partial
    # batch pads with its own last record, a batch with none with the last record through the
    # Maps alone (masked either way).
    def make(workers):
        stream = jl.Stream.from_generator(lambda s: ({"id": i} for i in range(s * 10, 10 + s * 12)),
                                          shards=2)
        return jl.StreamLoader(stream, batch_size=4, num_epochs=1, num_workers=workers,
                               transforms=[jl.Map(lambda r: {**r, "twice": 2 * r["id"]}),
                                           jl.Filter(keep_not_multiple_of_3)],
                               readers_per_process=2, process_index=0, process_count=1)
    with make(num_workers) as loader:
        batches = [jl_copy(b) for b in loader]
    kept = [i for i in range(22) if i % 3]
    assert sorted(np.concatenate([b["id"][b["mask"]] for b in batches]).tolist()) == kept
    assert all((b["twice"] == 2 * b["id"]).all() for b in batches)
    assert any(not b["mask"].any() for b in batches)  # a batch of padding alone
    for k in range(1, len(batches) + 2):
        check_resume(lambda: make(0), total=len(batches) + 3, k=k,
                     make_restored=lambda: make(2))


def test_a_map_that_cannot_take_the_padding_record_is_named_with_the_remedy():
    def parse(record):  # fails on what the Filter drops (id 21, the reader's last)
        return {"id": record["id"], "half": record["id"] // (record["id"] % 3)}

    stream = jl.Stream.from_generator(lambda s: ({"id": i} for i in range(s * 10, 10 + s * 12)),
                                      shards=2)
    with jl.StreamLoader(stream, batch_size=4, num_epochs=1, readers_per_process=2,
                         transforms=[jl.Filter(keep_not_multiple_of_3), jl.Map(parse)],
                         process_index=0, process_count=1) as loader:
        with pytest.raises(jl.RecordError, match=r"batch of padding alone .* Maps only .* "
                                                 r"ZeroDivisionError.*shuffle_window"):
            list(loader)


def tokens_of(record):
    """Record ``i``'s tokens: ``1 + i % 7`` of them, each ``i + 1`` (0 is padding)."""
    return {"t": np.full(1 + record["id"] % 7, record["id"] + 1)}


def packed_pass(method, workers, num_epochs=1):
    """Rows of 8 tokens packed from ``uneven_stream``'s 94 records, in passes that end."""
    packed = jl.PackedStream(uneven_stream(shuffle_window=4), "t", 8, tokenize=tokens_of,
                             method=method, window=5)
    return jl.StreamLoader(packed, batch_size=3, num_epochs=num_epochs, num_workers=workers,
                           readers_per_process=4, process_index=0, process_count=1)


def check_packed_pass(batches, method, num_epochs=1):
    """Every record's tokens placed ``num_epochs`` times, a segment of one record each (whole,
    for a fitting method), positions counting up; masked rows are padding."""
    rows = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    mask, tokens, ids, positions = (rows["mask"], rows["t"], rows["t_segment_ids"],
                                    rows["t_positions"])
    assert not tokens[~mask].any() and not ids[~mask].any()
    real = tokens[mask]
    placed = np.bincount(real[real > 0] - 1, minlength=94)
    assert np.array_equal(placed, num_epochs * (1 + np.arange(94) % 7))
    assert np.array_equal(tokens == 0, ids == 0)  # padding only where no segment is
    for row_tokens, row_ids, row_positions in zip(tokens[mask], ids[mask], positions[mask]):
        for segment in np.unique(row_ids[row_ids > 0]):
            at = row_ids == segment
            values = np.unique(row_tokens[at])
            assert len(values) == 1  # one record a segment
            assert np.array_equal(row_positions[at], np.arange(at.sum()))
            if method != "concat":  # whole records
                assert at.sum() == 1 + (values[0] - 1) % 7
    short = (tokens[mask] == 0).any(axis=1).sum()
    if method == "concat":  # full rows but each reader's last of the pass
        assert short <= 4 * num_epochs


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("method", ["concat", "best_fit"])
def test_a_packed_pass_places_every_token_once_and_the_next_pass_reshuffles(method,
                                                                            num_workers):
    with packed_pass(method, num_workers) as loader:
        first = [jl_copy(b) for b in loader]
        second = [jl_copy(b) for b in loader]
        third = [jl_copy(b) for b in loader]
    for batches in (first, second, third):
        check_packed_pass(batches, method)
        assert batches[-1]["mask"].any()  # the pass ends with the step of its last row
    assert not all(len(a) == len(b) and all(np.array_equal(x["t"], y["t"]) for x, y in
                                            zip(a, b)) for a, b in ((first, second),
                                                                    (second, third)))


@pytest.mark.parametrize("method", ["concat", "best_fit"])
def test_a_packed_pass_of_two_epochs_places_every_token_twice(method):
    with packed_pass(method, 2, num_epochs=2) as loader:
        check_packed_pass([jl_copy(b) for b in loader], method, num_epochs=2)


@pytest.mark.e2e
@pytest.mark.parametrize("method", ["concat", "best_fit"])
@pytest.mark.parametrize("k", [5, 31, 45])  # readers done, near the end, the next pass
def test_resume_of_a_packed_pass_into_other_worker_counts(method, k):
    # a pass is ~33 steps (concat) or ~41 (best_fit); the stream runs into the next pass
    for workers, other in ((0, 2), (4, 0)):
        check_resume(lambda: packed_pass(method, workers), total=k + 20, k=k,
                     make_restored=lambda: packed_pass(method, other))


@pytest.mark.parametrize("method", ["concat", "best_fit"])
def test_resume_of_a_packed_pass_as_the_next_pass_begins(method):
    with packed_pass(method, 0) as loader:
        first = len(list(loader))
    for k in range(first, first + 4):  # some readers have made no row of the next pass yet
        check_resume(lambda: packed_pass(method, 0), total=k + 40, k=k,
                     make_restored=lambda: packed_pass(method, 2))


def test_a_filter_of_packed_rows_in_a_pass_keeps_or_names_the_padding_row():
    def full(row):  # drops rows with fewer than 4 tokens, the padding row among them
        return int((row["t_segment_ids"] > 0).sum()) >= 4

    def full_or_padding(row):
        return not row["t_segment_ids"].any() or full(row)

    packed = jl.PackedStream(uneven_stream(shuffle_window=4), "t", 8, tokenize=tokens_of)
    with jl.StreamLoader(packed, batch_size=3, num_epochs=1, transforms=[jl.Filter(full)],
                         readers_per_process=4, process_index=0, process_count=1) as loader:
        with pytest.raises(jl.RecordError, match=r"Filters drop the row of padding.*keep a row "
                                                 r"whose segment ids are all 0"):
            list(loader)
    with jl.StreamLoader(packed, batch_size=3, num_epochs=1,
                         transforms=[jl.Filter(full_or_padding)], readers_per_process=4,
                         process_index=0, process_count=1) as loader:
        batches = [jl_copy(b) for b in loader]
    ids = np.concatenate([b["t_segment_ids"] for b in batches])
    mask = np.concatenate([b["mask"] for b in batches])
    assert ((ids[mask] > 0).sum(axis=1) >= 4).all() and not ids[~mask].any()


def jl_copy(batch):
    return {k: np.array(v) for k, v in batch.items()}


def test_a_pass_is_refused_where_it_cannot_end_evenly_and_names_the_remedy(tmp_path):
    with pytest.raises(jl.ConfigError, match=r"process_count=2 and JAX runs 1; call "
                                             r"jax.distributed.initialize\(\) first"):
        jl.StreamLoader(generator_stream(tmp_path), batch_size=2, num_epochs=1,
                        process_index=0, process_count=2)
    with pytest.raises(jl.ConfigError, match=r"num_epochs: expected an int >= 1, got 0"):
        loader_of(generator_stream(tmp_path), [], num_epochs=0)
    lines = jl.Stream.from_generator(lambda s: iter(["a", "b"]), shards=1)
    with jl.StreamLoader(lines, batch_size=2, num_epochs=1, process_index=0,
                         process_count=1) as loader:
        with pytest.raises(jl.CollateError, match=r"num_epochs.*adds a 'mask' leaf.*dicts.*"
                                                  r"Map\(lambda r: \{'record': r\}\)"):
            next(iter(loader))
    with jl.StreamLoader(generator_stream(tmp_path), batch_size=2, num_epochs=1,
                         mask_key="id", process_index=0, process_count=1) as loader:
        with pytest.raises(jl.CollateError, match=r"already have a key 'id'.*mask_key="):
            next(iter(loader))


def passes_of_two_hosts(tmp_path, *mode):
    """Each host's two passes of ``sharding/pass_run.py`` (``mode``: "packed", "mixed")."""
    here = os.path.dirname(os.path.abspath(__file__))
    pythonpath = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    run_hosts(os.path.join(here, "sharding", "pass_run.py"), 2,
              ["{port}", str(tmp_path), "2", *mode], env={"PYTHONPATH": pythonpath},
              timeout=150)
    return [json.loads((tmp_path / f"pass_{i}.json").read_text()) for i in range(2)]


@pytest.mark.e2e
def test_two_hosts_end_each_pass_at_the_same_step(tmp_path):
    # jax.distributed on the CPU backend: host 0's readers hold 45 records, host 1's 63, and
    # each step runs a collective; without agreeing, host 0 would stop first and leave host 1
    # waiting in it (the test's timeout)
    hosts = passes_of_two_hosts(tmp_path)
    for p in range(2):
        # reader 3's 60 records are 15 batches, one every 2 steps: 30 steps on both hosts
        assert hosts[0][p]["steps"] == hosts[1][p]["steps"] == 30
        assert sorted(hosts[0][p]["ids"]) == list(range(45))
        assert sorted(hosts[1][p]["ids"]) == list(range(45, 108))


@pytest.mark.e2e
def test_two_hosts_resume_a_pass_where_one_hosts_readers_are_done(tmp_path):
    # Left at step 24, host 0's readers are done and host 1's read on: the pass is not over.
    # A new iter(), a restore and peek() there gave host 0 the next pass's records again
    hosts = passes_of_two_hosts(tmp_path, "resume")
    for host in hosts:
        rest = host["full"][24:]
        assert host["again"] == host["restored"] == rest and len(rest) == 6
        assert host["peeked"] == host["restored_peek"] == rest[:1]
    assert hosts[0]["full"][24:] == [[]] * 6  # (host 0's: done, its batches all padding)


@pytest.mark.e2e
def test_a_host_whose_batch_fails_in_a_pass_is_named_by_the_other_not_waited_for(tmp_path):
    # host 1's transform raised, and host 0 waited in the pass's end (a collective each step)
    # for as long as host 1 lived, or until JAX's shutdown barrier aborted both
    here = os.path.dirname(os.path.abspath(__file__))
    pythonpath = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    run_hosts(os.path.join(here, "sharding", "pass_run.py"), 2,
              ["{port}", str(tmp_path), "1", "fails"], env={"PYTHONPATH": pythonpath},
              timeout=60)
    said = [json.loads((tmp_path / f"pass_{i}.json").read_text()) for i in range(2)]
    assert said[1].startswith("RecordError: ") and "record 70 is damaged" in said[1], said
    assert said[0].startswith("JaxloaderError: StreamLoader: process 1 of 2 failed at step ")
    assert "record 70 is damaged" in said[0] and "see that process's error" in said[0], said


@pytest.mark.e2e
def test_two_hosts_end_a_packed_pass_at_the_same_step(tmp_path):
    # the same hosts, their records packed into rows of 8 tokens (concat): every token of the
    # host's records once a pass, and both hosts stop at the same step
    hosts = passes_of_two_hosts(tmp_path, "packed")
    for p in range(2):
        assert hosts[0][p]["steps"] == hosts[1][p]["steps"]
        for host, records in ((0, range(45)), (1, range(45, 108))):
            placed = np.bincount(hosts[host][p]["ids"], minlength=108)
            expected = np.zeros(108, np.int64)
            expected[list(records)] = 1 + np.array(records) % 5
            assert np.array_equal(placed, expected)


@pytest.mark.e2e
def test_two_hosts_end_a_pass_over_a_mixture_at_the_same_step(tmp_path):
    # the same hosts' stream mixed with a second one (host 0's readers hold 8 of its records,
    # host 1's 10): every record of both once a pass, and both hosts stop at the same step
    hosts = passes_of_two_hosts(tmp_path, "mixed")
    for p in range(2):
        assert hosts[0][p]["steps"] == hosts[1][p]["steps"]
        assert sorted(hosts[0][p]["ids"]) == [*range(45), *range(1000, 1008)]
        assert sorted(hosts[1][p]["ids"]) == [*range(45, 108), *range(1008, 1018)]



@pytest.mark.e2e
def test_two_hosts_end_a_first_exhausted_pass_over_a_mixture_at_the_same_step(tmp_path):
    # the same mixture, each reader's pass ending with its first component run out: both
    # hosts stop at the same step, each reader read one of its components whole, none twice
    hosts = passes_of_two_hosts(tmp_path, "first_exhausted")
    big, small = np.cumsum([0, 5, 40, 3, 60]), np.cumsum([0, 2, 6, 1, 9])
    for p in range(2):
        assert hosts[0][p]["steps"] == hosts[1][p]["steps"]
        for host in range(2):
            ids = hosts[host][p]["ids"]
            assert len(ids) == len(set(ids))
            for r in (2 * host, 2 * host + 1):
                whole = [set(range(big[r], big[r + 1])), set(range(1000 + small[r],
                                                                   1000 + small[r + 1]))]
                mine = [set(ids) & w for w in whole]
                assert any(m == w for m, w in zip(mine, whole))
                assert sum(map(len, mine)) < sum(map(len, whole))  # one of them cut short


def test_a_pass_over_empty_files_is_warned_of_as_the_loader_is_made(tmp_path):
    # a pass failed only where the seed's deal gave a reader nothing but empty shards: the
    # first pass, or one hours in, with the same files
    paths = []
    for k in range(8):
        path = tmp_path / f"part-{k}.jsonl"
        path.write_text("" if k in (3, 6) else "".join(f'{{"x": {i}}}\n' for i in range(5)))
        paths.append(str(path))
    stream = jl.Stream.jsonl(paths)
    with pytest.warns(jl.JaxloaderWarning, match=r"num_epochs: 2 of the stream's shards are "
                                                 r"empty files \(.*part-3\.jsonl, \.\.\.\).*"
                                                 r"remove the empty files"):
        jl.StreamLoader(stream, batch_size=2, num_epochs=1, process_index=0, process_count=1)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (endless: an epoch of empty shards is passed over)
        jl.StreamLoader(stream, batch_size=2, process_index=0, process_count=1)
    # endless, but a mixture whose stopping_strategy ends its epochs: its first batch failed,
    # unwarned, the warning's remedy (read without end) no help (the compositions audit)
    other = jl.Stream.jsonl(paths[:3])
    for strategy in ("first_exhausted", "all_exhausted"):
        mixed = jl.mix([other, stream], [0.5, 0.5], stopping_strategy=strategy)
        with pytest.warns(jl.JaxloaderWarning, match=rf"stopping_strategy='{strategy}': 2 of "
                                                     r"the stream's shards are empty files .*"
                                                     r"mix with the default stopping_strategy"):
            jl.StreamLoader(mixed, batch_size=2, process_index=0, process_count=1)


def _forty(i):
    for j in range(40):
        yield {"x": np.int64(i * 1000 + j)}


def test_a_pass_end_past_the_pass_the_readers_are_in_is_refused():
    # (a damaged-states audit) any multiple of num_epochs above the readers' epochs was taken:
    # a restored pass of one epoch read 2 or 3 of them, or never ended, without a word
    def make():
        return jl.StreamLoader(jl.Stream.from_generator(_forty, shards=4, shuffle_window=5),
                               batch_size=4, seed=5, num_epochs=1, readers_per_process=2,
                               process_index=0, process_count=1)

    with make() as there:
        it = iter(there)
        for _ in range(5):
            next(it)
        state = there.state_dict()
        rest = len(list(it))
    with make() as here:
        for until in (2, 3, 2**70):
            with pytest.raises(jl.StateDictError, match=r"state\['pass'\]: expected"):
                here.load_state_dict({**state, "pass": {**state["pass"], "until": until}})
        here.load_state_dict(state)
        assert len(list(here)) == rest
