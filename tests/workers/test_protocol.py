from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import jaxloader as jl

SCRIPT = '''
import collections
import numpy as np
import jaxloader as jl

Point = collections.namedtuple("Point", "x label")  # defined in the script: __main__.Point


def to_point(record):
    return {"point": Point(record["x"] * 2, record["x"] % 3)}


if __name__ == "__main__":
    source = jl.ArraySource({"x": np.arange(8)})
    for workers in (0, 2):
        with jl.DataLoader(source, batch_size=4, num_workers=workers,
                           transforms=[jl.Map(to_point)]) as loader:
            for batch in loader:
                point = batch["point"]
                print(workers, type(point) is Point, point.x.tolist(), point.label.tolist())
'''


def test_a_record_class_defined_in_the_script_comes_back_as_that_class(tmp_path):
    """A worker's ``__main__`` is not the script, so pickle cannot name ``__main__.Point`` in
    the batch's layout there (the worker died, reported as "check memory use"); the layout
    crosses by value, and the main process gets its own ``Point`` back."""
    (tmp_path / "train.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(tmp_path / "train.py")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")
    assert lines[:2] == ["0 True [0, 2, 4, 6] [0, 1, 2, 0]", "0 True [8, 10, 12, 14] [1, 2, 0, 1]"]
    assert lines[2:4] == ["2 True [0, 2, 4, 6] [0, 1, 2, 0]", "2 True [8, 10, 12, 14] [1, 2, 0, 1]"]


class _LockedReader:
    """A stream's reader whose state holds a lock: no pickler can send it back (a shard's
    state is copied into JSON's types, or refused, as it is read: a reader of a stream of
    one's own is not)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_state(self):
        return {**self.inner.get_state(), "lock": threading.Lock()}


class _LockedStream(jl.Stream):
    def reader(self, **kw):
        return _LockedReader(super().reader(**kw))


def test_a_batch_that_cannot_be_sent_is_reported_with_its_error_not_as_a_death():
    stream = _LockedStream.from_generator(lambda i: ({"x": np.int64(n)} for n in range(9)), 1)
    with jl.StreamLoader(stream, batch_size=4, num_workers=1) as loader:
        with pytest.raises(jl.WorkerError, match="cannot pickle '_thread.lock'"):
            next(iter(loader))


class _TwoArguments(Exception):
    """Pickles, and does not unpickle (its args are the one message made of two)."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")


def test_a_cause_that_does_not_unpickle_keeps_the_chain_above_it():
    from jaxloader.workers.protocol import chain, failed

    try:
        try:
            try:
                raise _TwoArguments(5, "locked")
            except _TwoArguments as e:
                raise ValueError("read failed") from e
        except ValueError as e:
            raise jl.RecordError("step 0: record 3") from e
    except jl.RecordError as e:
        sent = failed(1, 0, e)
    got = chain(sent.pickled)
    assert isinstance(got, jl.RecordError) and repr(got.__cause__) == "ValueError('read failed')"
    assert got.__cause__.__cause__ is None  # (the one that did not unpickle, and what follows)


class _NotAnException(Exception):
    """Unpickles as a str (a proxy of the error, say)."""

    def __reduce__(self):
        return (str, ("a proxy",))


def test_a_link_that_unpickles_as_no_exception_ends_the_chain_there():
    from jaxloader.workers.protocol import chain, failed

    try:
        try:
            raise _NotAnException("odd")
        except _NotAnException as e:
            raise jl.RecordError("step 0: record 3") from e
    except jl.RecordError as e:
        sent = failed(1, 0, e)
    got = chain(sent.pickled)
    assert isinstance(got, jl.RecordError) and got.__cause__ is None
    try:
        raise _NotAnException("top")
    except _NotAnException as e:
        alone = failed(1, 0, e)
    with pytest.raises(ValueError, match="did not unpickle as one"):
        chain(alone.pickled)
