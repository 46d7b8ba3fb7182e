"""A stream record's error names its shard and its place there (line, record), whichever
window, reader, component, filter or restore it came through."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import jaxloader as jl
from streams.test_mixed import components, same_keys
from streams.test_shards import write_jsonl


class Bad(Exception):
    pass


def failing_at(target):
    def check(record):
        if record["id"] == target:
            raise Bad(f"record {target}")
        return record
    return check


GENERATOR_SHARD = "components.<locals>.<lambda>[{}]"  # components()' generator's shards' names


def expected(tmp_path, record_id):
    """Where ``components``' record ``record_id`` is: its component, shard and place."""
    if record_id < 1000:
        shard, k = divmod(record_id, 15)
        return f"mix(streams)[0]: {tmp_path / f'a-{shard}.jsonl'} line {k + 1}"
    if record_id < 2000:
        shard, k = divmod(record_id - 1000, 10)
        return (f"mix(streams)[1]: {tmp_path / f'b-{shard}.tar'} record {k + 1}, "
                f"key 'sample{record_id:05d}'")  # (the sample's __key__, which users search)
    shard, k = divmod(record_id - 2000, 3)
    return f"mix(streams)[2]: {GENERATOR_SHARD.format(shard)} record {k + 1}"


def error_of(loader, steps=40):
    with loader, pytest.raises((jl.RecordError, jl.WorkerError)) as e:
        for _ in zip(range(steps), loader):
            pass
    return str(e.value)


@pytest.mark.parametrize("window", [1, 3, 8])
def test_a_map_error_names_the_records_shard_and_place(tmp_path, window):
    streams = components(tmp_path, window=window)
    for target in (0, 14, 31, 59, 1000, 1017, 1039, 2000, 2004, 2009):
        loader = jl.StreamLoader(
            jl.mix(streams, [0.5, 0.3, 0.2]), batch_size=7, seed=3,
            transforms=[jl.Map(same_keys), jl.Map(failing_at(target))])
        message = error_of(loader)
        assert (f"): transforms[1] Map(failing_at.<locals>.check) raised Bad: record "
                f"{target}") in message
        assert expected(tmp_path, target) + ")" in message, (target, message)


def test_a_named_component_is_named_by_its_name(tmp_path):
    # mix({"web": ..., "code": ...}): its streams' errors named them by place, [1], where a
    # mixture of sources names them as mix was given them
    a, b, c = components(tmp_path, window=1)
    named = {"web": a, "code": b, "sim": c}
    loader = jl.StreamLoader(jl.mix(named, {"web": 0.5, "code": 0.3, "sim": 0.2}), batch_size=7,
                             seed=3, transforms=[jl.Map(same_keys), jl.Map(failing_at(1017))])
    assert expected(tmp_path, 1017).replace("[1]", "['code']") + ")" in error_of(loader)
    with pytest.raises(jl.ConfigError, match=r"mix\(streams\)\['web'\]: Stream: \d+ shards for "
                                             r"32 readers"):
        jl.StreamLoader(jl.mix(named, [1, 1, 1]), batch_size=4, readers_per_process=32,
                        num_workers=0)


def test_origins_through_filters_a_restore_and_blank_lines(tmp_path):
    """Records a Filter drops are counted among those read; a loader restored mid-window
    reads its reader again from the restored state; a line count passes blank lines."""
    paths = []
    for s in range(2):
        lines = [f'{{"id": {s * 100 + i}}}' for i in range(30)]
        for at in (3, 4, 11):  # blank lines a JSONL file skips
            lines.insert(at, "")
        (path := tmp_path / f"p{s}.jsonl").write_text("\n".join(lines) + "\n")
        paths.append(path)
    line_of = {s * 100 + i: i + 1 + sum(at <= i + n for n, at in enumerate((3, 4, 11)))
               for s in range(2) for i in range(30)}
    stream = jl.Stream.jsonl(paths, shuffle_window=5)
    keep_even = jl.Filter(lambda r: r["id"] % 2 == 0)
    for target in (0, 10, 28, 104, 126):
        made = dict(batch_size=4, seed=5, num_workers=0)
        with jl.StreamLoader(stream, transforms=[keep_even], **made) as first:
            it = iter(first)
            next(it), next(it)
            state = first.state_dict()
        restored = jl.StreamLoader(stream, transforms=[keep_even, jl.Map(failing_at(target))],
                                   **made)
        with pytest.warns(UserWarning, match="transforms differ"):  # (the Map added)
            restored.load_state_dict(state)
        message = error_of(restored)
        path = paths[target // 100]
        assert f"({path} line {line_of[target]})" in message, (target, line_of[target], message)


def test_collation_names_both_rows_origins_with_workers(tmp_path):
    """In a worker: the rows a CollateError names, each with its file and line."""
    paths = [write_jsonl(tmp_path / f"c{s}.jsonl", range(s * 20, s * 20 + 20)) for s in range(2)]

    def to_array(record):
        return {"x": np.zeros(3 if record["id"] == 27 else 2)}
    loader = jl.StreamLoader(jl.Stream.jsonl(paths, shuffle_window=6), batch_size=5, seed=1,
                             num_workers=2, transforms=[jl.Map(to_array)])
    with loader, pytest.raises(jl.WorkerError, match="CollateError") as e:
        list(zip(range(20), loader))
    message = str(e.value)
    assert f"({paths[1]} line 8) has shape (3,)" in message, message
    assert message.count(f"{tmp_path}") >= 2  # the first row's origin too


def test_a_shard_that_cannot_be_read_again_says_so():
    """Where the shard cannot be read again, the message says why in the origin's place."""
    failed = []

    def numbers(shard):
        if failed:
            raise OSError("gone")
        return ({"id": i} for i in range(6))

    def check(record):
        if record["id"] == 5:
            failed.append(1)
            raise Bad("five")
        return record
    loader = jl.StreamLoader(jl.Stream.from_generator(numbers, 1), batch_size=4, seed=0,
                             transforms=[jl.Map(check)])
    message = error_of(loader)
    assert "row 1 (its shard is not known: reading it again raised OSError: gone)" in message


class Unreachable:
    """A shard whose reset opens a connection that is refused."""

    def __init__(self, name):
        self.name = name

    def reset(self, state=None):
        raise ConnectionRefusedError(f"{self.name}: connection refused")

    def next(self):
        raise StopIteration

    def get_state(self):
        return {}


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_shard_that_fails_to_open_is_named(num_workers):
    """A shard's reset, where it opens its files or connections, raised bare, naming no
    shard of thousands (the API audit); a record's read was named."""
    stream = jl.Stream([Unreachable(f"host-{i}") for i in range(4)], shuffle_shards=False)
    with jl.StreamLoader(stream, batch_size=2, num_workers=num_workers,
                         readers_per_process=1, process_index=0, process_count=1) as loader:
        with pytest.raises((jl.RecordError, jl.WorkerError)) as raised:
            next(iter(loader))
    error = raised.value if num_workers == 0 else raised.value.__cause__
    assert isinstance(error, jl.RecordError), repr(raised.value)
    assert str(error).startswith("stream shard host-0 (reader 0, epoch 0) raised "
                                 "ConnectionRefusedError as it was opened (its reset(None)): "
                                 "host-0: connection refused"), str(error)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_of_other_leaves_than_the_first_names_both_batches_first_shards(tmp_path,
                                                                               num_workers):
    """A batch whose leaves differ from the first batch's (one shard of many written with
    other fields) names where each batch's records came from: made in a worker, the batch
    named its step and reader alone, and the first batch its step."""
    paths = [write_jsonl(tmp_path / f"c{s}.jsonl", range(s * 8, s * 8 + 8)) for s in range(4)]
    paths[2].write_text(paths[2].read_text().replace('"text"', '"txt"'))
    loader = jl.StreamLoader(jl.Stream.jsonl(paths), batch_size=4, seed=0,
                             num_workers=num_workers)
    with loader, pytest.raises(jl.CollateError) as e:
        list(zip(range(12), loader))
    message = str(e.value)
    firsts = [f"(its first record: {p} line 1)" for p in paths]
    assert "'txt'" in message and "against the first batch, stream step 0" in message, message
    assert sum(f in message for f in firsts) == 2 and firsts[2] in message, message


@pytest.mark.parametrize("workers", [0, 1])
def test_a_record_after_many_of_a_generator_is_named_without_running_it_again(workers):
    # the message read the batch again from its state: the generator made anew and 12,000
    # records made again to name the place (a simulator's error came minutes late after
    # hours of training; a queue's generator, drained, waited for good: the streams audit)
    made = []

    def simulate(shard):
        made.append(shard)
        return ({"id": i} for i in itertools.count())
    loader = jl.StreamLoader(jl.Stream.from_generator(simulate, 1), batch_size=100, seed=0,
                             num_workers=workers, transforms=[jl.Map(failing_at(12_345))])
    message = error_of(loader, steps=200)
    assert "row 45 (reader 0's batch began in epoch 0, in a window read from " in message and \
        ".simulate[0] at {'consumed': 12299}, 1 of it handed out; not read again to name the " \
        "record" in message, message
    if not workers:  # (made in this process: counted here)
        assert made == [0], made
