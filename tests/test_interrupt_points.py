"""A Ctrl-C at every point of a call where one can land, in turn, leaves the loader sound.

Without workers every call runs in the main thread and is deterministic, so a sweep can put an
interrupt at each point of ``next()``, ``peek()``, ``state_dict()``, ``iter()`` and
``load_state_dict()`` where CPython may run a signal handler (``line_interrupts``: a call's
points listed once by ``points_of``, each then reached by ``raised_at_place``), one run each,
and check what the loader does next. Every place a point is at (a code location) is swept at its
first two passes and its last (a loop's first turn, a turn after another, its end), not at every
pass, for CI's time (a stream's ``peek()``, which reads a copy, at its first); and a point the
sweep of the same call on a loader listed earlier interrupted (the code loaders share: a
loader's own, a stream reader's) is interrupted again in one of ``SHARED_EVERY``, in this
loader's setting. ``JAXLOADER_EXHAUSTIVE=1`` sweeps every pass of every loader (a packing loop
over 110 records, each of its turns). What the sweep checks: the batches it hands out are the
reference stream's at their steps, with no step lost or repeated, and a restore leaves the old
position or the new one; after an interrupted ``close()``, a second one leaves no thread
running. ``test_interrupts.py`` fires timer interrupts at random into runs with workers and
device prefetch; this is the exhaustive, in-process counterpart (a sweep with workers starts
them anew for each point: ``tests/workers/test_pool.py`` puts its interrupts by hand).
"""

from __future__ import annotations

import collections
import functools
import os
import threading

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.base import read_threads
from line_interrupts import numbered, points_of, raised_at_place, raised_at_point
from resume_harness import assert_same_batch

# A point may be where a generator left unfinished by an earlier interrupt is closed by the
# garbage collector: Python prints that interrupt and drops it ("Exception ignored in"), as it
# would a real Ctrl-C there. The call then goes on, which the sweep checks like any other.
pytestmark = [pytest.mark.filterwarnings(  # (the sweep's own interrupt only)
                  r"ignore:(?s).*line_interrupts\.Tick:pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.e2e]  # (an exhaustive sweep: on one Python in CI)
PACKAGE = os.path.dirname(jl.__file__)
WARM, AFTER = 5, 4  # batches before the interrupted call, and checked after it
RESTORED = 3  # the step of the state restored into a loader at step WARM
EXHAUSTIVE = os.environ.get("JAXLOADER_EXHAUSTIVE", "0") == "1"


def _jitter(record, rng):
    return {**record, "noise": np.float32(rng.random())}


def _records(shard):
    for k in range(shard, 48, 4):
        yield {"tokens": np.arange(k % 9 + 1, dtype=np.int32) + 100 * k, "id": np.int64(k)}


def _padded(record):
    tokens = np.asarray(record["tokens"], np.int32)[:8]
    return {"tokens": np.pad(tokens, (0, 8 - len(tokens))), "id": record["id"]}


def _docs():
    return jl.RaggedSource.from_sequences({"tokens": [list(range(k % 7 + 1)) for k in range(40)]})


def _stream(window=3):
    return jl.Stream.from_generator(_records, shards=4, shuffle_window=window)


def _parquet(directory):
    from sources.test_parquet import write_parts

    paths = write_parts(directory)  # 3 files, row groups of 16 rows
    return jl.ParquetSource(paths, cache_bytes=4 << 10)  # 2 of its 9 row groups: evictions


def _device():
    import jax  # (a thread of its own moves the batches there: the main thread waits on it)

    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


class _Records:
    """Records read one by one (``source[i]``): on a loader's read threads."""

    def __len__(self):
        return 50

    def __getitem__(self, i):
        return {"x": np.arange(3, dtype=np.float32) + i, "id": np.int64(i)}


def _doubled(record):
    return {**record, "x": record["x"] * 2}


ONE = dict(process_index=0, process_count=1)
LOADERS = {
    "arrays, full shuffle, a RandomMap": lambda: jl.DataLoader(
        jl.ArraySource({"x": np.arange(150, dtype=np.float32).reshape(50, 3),
                        "id": np.arange(50)}), batch_size=4, shuffle=True, seed=3,
        transforms=[jl.RandomMap(_jitter)], **ONE),
    "arrays placed on a device, two prefetched there": lambda: jl.DataLoader(
        jl.ArraySource({"id": np.arange(50)}), batch_size=4, shuffle=True, seed=3,
        sharding=_device(), device_prefetch=2, **ONE),
    "arrays, read-local shuffle, partial last batch, one pass": lambda: jl.DataLoader(
        jl.ArraySource({"id": np.arange(30)}), batch_size=4, seed=3, last_batch="partial",
        shuffle=jl.LocalShuffle(window=2, block_size=5), num_epochs=1, **ONE),
    "parquet files, read-local shuffle, a small cache": lambda directory: jl.DataLoader(
        _parquet(directory), batch_size=4, seed=3, shuffle=jl.LocalShuffle(window=2), **ONE),
    "a mixture whose weights change": lambda: jl.DataLoader(
        jl.mix([jl.ArraySource({"id": np.arange(30)}),
                jl.ArraySource({"id": np.arange(100, 117)})], [0.6, 0.4],
               from_step={4: [0.2, 0.8]}), batch_size=4, shuffle=True, seed=3, **ONE),
    "records read on threads, a Map": lambda: jl.DataLoader(
        _Records(), batch_size=4, shuffle=True, seed=3, transforms=[jl.Map(_doubled)],
        read_threads=3, **ONE),
    "packed rows": lambda: jl.DataLoader(
        jl.PackedSource(_docs(), "tokens", 8), batch_size=3, shuffle=True, seed=1, **ONE),
    "a stream, a RandomMap": lambda: jl.StreamLoader(
        _stream(), batch_size=3, seed=2, transforms=[jl.Map(_padded), jl.RandomMap(_jitter)],
        readers_per_process=2, **ONE),
    "a stream's passes": lambda: jl.StreamLoader(
        _stream(), batch_size=3, seed=2, transforms=[jl.Map(_padded)], readers_per_process=2,
        num_epochs=1, **ONE),
    "a stream placed on a device, two prefetched there": lambda: jl.StreamLoader(
        _stream(), batch_size=3, seed=2, transforms=[jl.Map(_padded)], readers_per_process=2,
        sharding=_device(), device_prefetch=2, **ONE),
    "streams mixed, weights changing": lambda: jl.StreamLoader(
        jl.mix([_stream(), _stream(window=0)], [0.5, 0.5], from_step={3: [0.1, 0.9]}),
        batch_size=3, seed=2, transforms=[jl.Map(_padded)], readers_per_process=2, **ONE),
    "streams mixed and packed, a pass": lambda: jl.StreamLoader(
        jl.PackedStream(jl.mix([_stream(), _stream(window=0)], [0.5, 0.5],
                               stopping_strategy="first_exhausted"), "tokens", 8,
                        method="best_fit", window=4),
        batch_size=3, seed=2, readers_per_process=2, num_epochs=1, **ONE),
}


def _host(batch):
    return {k: np.asarray(v).copy() for k, v in batch.items()}


def _new_threads(before: set[int]) -> list[threading.Thread]:
    """The loaders' threads alive now that were not in ``before`` (idents), but for the read
    threads a loader holds while it lives (idle between batches; a closed one's end)."""
    return [t for t in threading.enumerate() if t.ident not in before and t.is_alive()
            and t.name.startswith("jaxloader") and not t.name.startswith("jaxloader-read")]


def _take(loader, it, n, out):
    """Appends ``(step, batch)`` until ``out`` holds ``n``; a new ``iter()`` at a pass's end."""
    while len(out) < n:
        step = loader.step
        try:
            out.append((step, _host(next(it))))
        except StopIteration:
            it = iter(loader)
    return it


def _ready(loader, call, restored):
    """``loader`` at step WARM, its batches so far (appended to by the ``next`` call), its
    iterator and ``call`` on it as a function of no argument."""
    got: list = []
    it = _take(loader, iter(loader), WARM, got)
    loader.state_dict()  # (a stream's reports filed in: its base is at WARM)
    calls = {"next": lambda: got.append((loader.step, _host(next(it)))),
             "peek": loader.peek, "state_dict": loader.state_dict,
             "iter": lambda: iter(loader),
             "load_state_dict": lambda: loader.load_state_dict(restored)}
    return got, it, calls[call]


CALLS = ["next", "peek", "state_dict", "iter", "load_state_dict"]


def swept(places: list, first_only: bool = False) -> list:
    """The points of ``places`` (``points_of``'s list) the sweep interrupts, as ``(place, k)``:
    each place's first two passes and its last (``first_only``: its first); every pass with
    ``JAXLOADER_EXHAUSTIVE=1``."""
    passes = collections.Counter(places)
    return [(place, k) for place, k in numbered(places)
            if EXHAUSTIVE or k == 1 or not first_only and (k == 2 or k == passes[place])]


def _restored(make) -> dict:
    """The state at step RESTORED that the ``load_state_dict`` sweep restores."""
    with make() as other:
        _take(other, iter(other), RESTORED, [])
        return other.state_dict()


def _listed(make, call: str) -> tuple[list, dict]:
    """The points of ``call`` on ``make()``'s loader at step WARM (``points_of``) and the
    state it restores."""
    restored = _restored(make)
    with make() as loader:  # the call's points, listed once: each is then reached alone
        return points_of(PACKAGE, _ready(loader, call, restored)[2]), restored


@functools.cache
def _swept_before(kind: str, call: str) -> frozenset:
    """The points ``call``'s sweep interrupts on the kinds listed before ``kind`` (but the
    parquet files', whose loader needs a directory): the loaders' code they share (the
    loader's own, a stream reader's) was swept there."""
    earlier = [k for k in list(LOADERS)[:list(LOADERS).index(kind)] if "parquet" not in k]
    return frozenset().union(*(swept(_listed(LOADERS[k], call)[0],
                                     call == "peek" and "stream" in k) for k in earlier))


SHARED_EVERY = 8
"""A point an earlier kind's sweep interrupted is interrupted again in one in this many."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("kind", list(LOADERS))
def test_a_ctrl_c_at_any_point_of_a_call_loses_and_repeats_nothing(kind, call, tmp_path):
    make = LOADERS[kind]
    if "parquet" in kind:  # (its files written once, each loader a new source)
        make = functools.partial(make, tmp_path)
        make().close()
    with make() as reference:
        stream: list = []
        _take(reference, iter(reference), WARM + AFTER + 2, stream)
        by_step = dict(stream)
    before = {t.ident for t in threading.enumerate()}
    done = frozenset() if EXHAUSTIVE else _swept_before(kind, call)  # (before the listing:
    places, restored = _listed(make, call)  # its runs fill caches, a first run's path)
    # (a StreamLoader's peek() reads a copy of the stream, the loader's states read, never
    # written: a place's later passes there are the copy's loops, which its first stands for;
    # they were a third of the sweep, of CI's 20 minutes)
    chosen = swept(places, call == "peek" and "stream" in kind)
    if done:  # (what an earlier kind swept: a sample, two thirds of the sweep)
        again = set([point for point in chosen if point in done][::SHARED_EVERY])
        chosen = [point for point in chosen if point not in done or point in again]
    missed = 0
    for points, (place, k) in enumerate(chosen, 1):
        where = f"{kind}, {call}, interrupted at point {points} of {len(chosen)} swept"
        # where a thread of the loader's own runs beside the call, the call's path depends on
        # timing (a wait loop's passes, a stop made twice): a point of the listing's run may
        # not come in another (the call then runs uninterrupted, checked all the same): tried
        # again, and a few may stay unreached
        for _ in range(3 if "prefetched" in kind else 1):
            with make() as loader:
                got, it, interrupted = _ready(loader, call, restored)
                reached = raised_at_place(place, k, interrupted)
                if call in ("iter", "load_state_dict"):
                    it = iter(loader)  # what a user does next: the old iterator is stale
                    assert loader.step in (WARM, RESTORED), where
                    # one thread drives the engine: the old run's, if any, was stopped and is gone
                    assert len(_new_threads(before)) <= 1, where
                _take(loader, it, len(got) + AFTER, got)
            steps = [s for s, _ in got]
            first = steps[WARM]  # where the loader went on: where it was, or where it was restored
            assert first in ((WARM, RESTORED) if call == "load_state_dict" else (WARM,)), where
            assert steps == [*range(WARM), *range(first, first + len(steps) - WARM)], where
            for step, batch in got:
                assert_same_batch(batch, by_step[step], f"{where}, step {step}")
            assert read_threads.count() == 1, where  # (no batch's read threads left set)
            if reached:
                break
        else:
            assert "prefetched" in kind, f"{where}: not reached ({place}, pass {k})"
            missed += 1
    assert len(places) > 5, f"{kind}, {call}: {len(places)} points"
    assert missed <= len(chosen) // 10, f"{kind}, {call}: {missed} of {len(chosen)} not reached"


@pytest.mark.parametrize("kind", [k for k in LOADERS if "prefetched" in k])
def test_a_ctrl_c_at_any_point_of_close_leaves_nothing_running_after_a_second_close(kind):
    """``close()`` stops the prefetch thread, then the engine; cut short at any point, the
    position is kept and a second ``close()`` finishes the job."""

    before = set(threading.enumerate())
    points = 0
    while True:
        with LOADERS[kind]() as loader:
            it = _take(loader, iter(loader), WARM, [])
            next(it)  # the prefetch thread is running
            state = loader.state_dict()
            if not raised_at_point(points + 1, PACKAGE, loader.close):
                break
            points += 1
            loader.close()
            assert loader.state_dict() == state, f"{kind}, interrupted at point {points}"
        threads = [t for t in threading.enumerate() if t not in before]
        for t in threads:
            t.join(10)
        assert not [t for t in threads if t.is_alive()], f"{kind}, point {points}"
    assert points > 5, f"{kind}: {points} points"
