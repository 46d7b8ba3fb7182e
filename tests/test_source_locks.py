"""A source is read by one thread at a time in the training process: ``peek()`` beside a
device-put thread, two loaders over one source or a shared part, a loader closed while
another reads (a ParquetSource crashed the process, or said its file was damaged)."""

from __future__ import annotations

import os
import signal
import threading
import time

import jax
import numpy as np

import jaxloader as jl


class Watched:
    """A source that counts the times two threads read it at once."""

    def __init__(self, n: int, base: int = 0) -> None:
        self.n, self.base, self.inside, self.overlaps = n, base, 0, 0
        self.guard = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        with self.guard:
            self.inside += 1
            self.overlaps += self.inside > 1
        time.sleep(0.0005)  # (a read that takes a while: a row group's decode)
        with self.guard:
            self.inside -= 1
        return {"x": np.int64(self.base + i)}


def test_peek_beside_the_device_put_thread_reads_the_source_in_turn():
    source = Watched(400)
    with jl.DataLoader(source, batch_size=8, shuffle=True, seed=1, num_workers=0,
                       sharding=jax.devices()[0], device_prefetch=4) as loader, \
            jl.DataLoader(source, batch_size=8, shuffle=True, seed=1) as reference:
        it, expected = iter(loader), list(reference)
        for step in range(30):
            peeked = loader.peek()
            got = next(it)
            assert np.array_equal(np.asarray(peeked["x"]), expected[step]["x"])
            assert np.array_equal(np.asarray(got["x"]), expected[step]["x"])
    assert source.overlaps == 0


def test_peek_beside_the_device_put_thread_draws_each_records_own_numbers():
    # only the reads held the source's lock: peek()'s copy of the maker and the device-put
    # thread ran their RandomMaps at once, on the one generator they share, each re-keying it
    # for its own record in the middle of the other's draws (other numbers, silently)
    def draw(record, rng):
        first = rng.integers(1 << 30)
        time.sleep(0.002)  # (longer than a read: the other thread's transform runs meanwhile)
        return {"x": record["x"], "a": np.int64(first), "b": np.int64(rng.integers(1 << 30))}

    def make(**kw):
        return jl.DataLoader(Watched(400), batch_size=8, shuffle=True, seed=1,
                             transforms=[jl.RandomMap(draw)], **kw)

    with make(sharding=jax.devices()[0], device_prefetch=4) as loader, make() as reference:
        it, expected = iter(loader), list(reference)
        for step in range(12):
            peeked, got = loader.peek(), next(it)
            for key in ("x", "a", "b"):
                assert np.array_equal(np.asarray(peeked[key]), expected[step][key]), step
                assert np.array_equal(np.asarray(got[key]), expected[step][key]), step


def test_two_loaders_sharing_a_part_read_it_in_turn_and_a_close_waits_for_a_read():
    shared = Watched(200)
    whole = jl.ConcatSource([shared, Watched(50, base=1000)])
    first = jl.DataLoader(shared, batch_size=8, shuffle=True, num_workers=0,
                          sharding=jax.devices()[0])
    second = jl.DataLoader(whole, batch_size=8, shuffle=True, num_workers=0,
                           sharding=jax.devices()[0])
    with first, second:
        done = []
        thread = threading.Thread(target=lambda: done.append(len(list(second))))
        thread.start()
        count = len(list(first))
        for _ in range(5):
            jl.DataLoader(whole, batch_size=8).close()  # (closes the parts between reads)
        thread.join(60)
    assert (count, done) == (25, [31]) and shared.overlaps == 0


class Slotted:
    """``Watched`` with ``__slots__``: it takes no weak reference."""

    __slots__ = ("n", "base", "inside", "overlaps", "guard")
    __init__, __len__, __getitem__ = Watched.__init__, Watched.__len__, Watched.__getitem__


def test_a_source_that_takes_no_weak_reference_is_read_in_turn_too():
    # an object without weak references got a new lock at each read, which held nothing
    # back: two loaders over one such source read it at once (another record's bytes)
    source = Slotted(400)
    with jl.DataLoader(source, batch_size=8, shuffle=True, seed=1,
                       sharding=jax.devices()[0], device_prefetch=4) as first, \
            jl.DataLoader(source, batch_size=8, shuffle=True, seed=2) as second:
        done = []
        thread = threading.Thread(target=lambda: done.append(len(list(second))))
        thread.start()
        count = len(list(first))
        thread.join(60)
    assert (count, done) == (50, [50]) and source.overlaps == 0


def test_a_transform_that_asks_another_loader_over_its_source_for_a_batch_gets_it():
    # the source's lock was held while the record transforms ran: a transform waiting on a
    # batch of another loader over the same source, made in that loader's device-put
    # thread, waited for good on a lock its own thread held
    source = Watched(40)
    with jl.DataLoader(source, batch_size=4, shuffle=True, seed=1, num_epochs=None,
                       sharding=jax.devices()[0]) as partner:
        partners = iter(partner)

        def mix(record):
            return {"x": record["x"] + 1000 * np.asarray(next(partners)["x"])[0]}

        with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(mix)]) as loader:
            done = []
            thread = threading.Thread(target=lambda: done.append(len(list(loader))),
                                      daemon=True)
            thread.start()
            thread.join(30)
    assert done == [10] and source.overlaps == 0


def test_a_source_of_a_thousand_parts_is_read_peeked_and_closed():
    # holding() took a frame for each part's lock: past ~990 parts every batch in the
    # training process, peek() and close() raised RecursionError
    class Part:
        def __init__(self, base: int) -> None:
            self.base = base

        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> dict:
            return {"x": np.int64(self.base + i)}

    parts = [Part(10 * c) for c in range(1200)]
    with jl.DataLoader(jl.ConcatSource(parts), batch_size=8, num_epochs=1) as loader:
        peeked = loader.peek()
        batches = list(loader)
    assert np.array_equal(peeked["x"], batches[0]["x"]) and len(batches) == 300
    assert sorted(np.concatenate([b["x"] for b in batches]).tolist()) == sorted(
        10 * c + i for c in range(1200) for i in range(2))


def test_a_source_of_twenty_thousand_parts_is_read_peeked_and_closed():
    # a frame took 8 parts' locks: past ~7,900 parts (an offline RL buffer, an episode a
    # part) every batch, peek() and close() raised RecursionError again
    parts = [jl.ArraySource({"x": np.arange(2) + 10 * c}) for c in range(20_000)]
    with jl.DataLoader(jl.ConcatSource(parts), batch_size=8, num_epochs=1) as loader:
        peeked = loader.peek()
        it = iter(loader)
        first, second = next(it), next(it)
    assert np.array_equal(peeked["x"], first["x"])
    assert first["x"].tolist() + second["x"].tolist() == [
        10 * c + i for c in range(8) for i in range(2)]


def test_array_parts_take_no_lock_and_other_parts_and_subclasses_do():
    # a concatenation of 50,000 episodes took 50,000 locks a batch (42 ms; the cliffs audit):
    # an ArraySource's reads are NumPy's of read-only arrays, safe from any thread
    from jaxloader.base.source_locks import source_lock
    from jaxloader.sources.parts import walk

    class Mine(jl.ArraySource):  # (a subclass may read otherwise: locked)
        pass

    parts = [jl.ArraySource({"x": np.arange(2) + 10 * c}) for c in range(1000)]
    both = jl.ConcatSource([*parts, Mine({"x": np.arange(2)}), Watched(2)])
    assert len(source_lock(both, walk)) == 3  # (the concatenation, Mine and Watched)
    with jl.DataLoader(both, batch_size=8, num_epochs=1, process_index=0,
                       process_count=1) as loader:
        assert len(list(loader)) == 250


def test_loaders_over_lists_keep_no_lock_and_a_sources_lock_goes_with_it():
    import gc

    from jaxloader.base import source_locks

    gc.collect()
    before = len(source_locks._LOCKS)
    for _ in range(20):  # (a list takes no weak reference: a lock kept for it stayed)
        with jl.DataLoader([{"x": np.int64(i)} for i in range(8)], batch_size=4) as loader:
            next(iter(loader))
        with jl.DataLoader(Watched(8), batch_size=4) as loader:
            loader.peek()
    del loader
    gc.collect()
    assert len(source_locks._LOCKS) == before


def test_a_ctrl_c_anywhere_in_taking_or_letting_go_of_the_locks_leaves_none_held():
    # taken in a loop, a lock whose acquire() had returned, or one a release loop had not yet
    # reached, stayed held by the main thread: the device-put thread then hung for good
    import signal

    from jaxloader.base.source_locks import holding, source_lock

    class Part:
        pass

    parts = [Part() for _ in range(4)]
    locks = source_lock(parts[0], lambda _: parts)

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        for round_ in range(400):
            try:  # (the timer set inside: one that fired as setitimer returned ended the run)
                signal.setitimer(signal.ITIMER_REAL, 1e-5 * (1 + round_ % 37))
                while True:
                    holding(locks, int)
            except KeyboardInterrupt:
                pass
            signal.setitimer(signal.ITIMER_REAL, 0)
            assert not any(lock._is_owned() for lock in locks), round_
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Counted:
    """A source that counts its reads made while another is (``overlaps``)."""

    def __init__(self, n, seconds):
        self.n, self.seconds, self.inside, self.overlaps = n, seconds, 0, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.__getitems__(np.array([i]))[0]

    def __getitems__(self, indices):
        self.inside += 1
        self.overlaps += self.inside > 1
        time.sleep(self.seconds)
        self.inside -= 1
        return [{"tokens": np.arange(1 + i % 5, dtype=np.int32), "fold": i % 4}
                for i in indices]


def test_a_filters_scan_and_a_packers_lengths_read_the_source_in_turn_with_a_loader():
    # two trials' FilteredSource(keep) over one ParquetSource in two threads, or one while
    # another thread trained on it, read it at once: pyarrow segfaulted, said "the file is
    # damaged", or hung (the sweeps audit). A source that counts reads at once stands in.
    probe = _Counted(64, 0.002)
    done = threading.Event()

    def train():
        with jl.DataLoader(probe, batch_size=4, num_epochs=None,
                           transforms=[jl.Map(lambda r: {"fold": r["fold"]})]) as loader:
            for _, _ in zip(range(400), loader):
                if done.is_set():
                    break

    def build(k):
        for _ in range(4):
            assert len(jl.FilteredSource(probe, lambda r: r["fold"] != k)) == 48
            jl.PackedSource(probe, "tokens", 8)

    threads = [threading.Thread(target=train)] + [
        threading.Thread(target=build, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    done.set()
    threads[0].join()
    assert probe.overlaps == 0


class _EvenRows:
    """A user's dataset over a pool, its subset made as it is first read."""

    def __init__(self, pool):
        self.source, self._sub = pool, None

    def __len__(self):
        return len(self.source) // 2

    def __getitem__(self, i):
        if self._sub is None:
            self._sub = jl.FilteredSource(self.source, lambda r: r["x"] % 2 == 0)
        return self._sub[i]


def test_a_filter_made_on_a_read_thread_or_in_a_forked_child_does_not_wait_for_ever():
    # a filter's scan holds the source's locks (read_locked): made on a batch's read thread,
    # it waited for the locks the batch's maker held; made in a forked child (a worker's
    # init), for locks a thread of the parent held, which the child does not have (the review)
    import os

    from jaxloader.base.source_locks import holding, source_lock
    from jaxloader.sources.parts import walk

    pool = jl.ArraySource({"x": np.arange(1000)})
    got = []

    def read():
        with jl.DataLoader(_EvenRows(pool), batch_size=8, read_threads=4) as loader:
            got.append(next(iter(loader))["x"].tolist())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(30)
    assert got == [[0, 2, 4, 6, 8, 10, 12, 14]]
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=holding, daemon=True, args=(
        source_lock(pool, walk), lambda: (held.set(), release.wait(30))))
    holder.start()
    held.wait(10)
    try:
        child = os.fork()
        if child == 0:
            try:
                os._exit(0 if len(jl.FilteredSource(pool, lambda r: r["x"] < 10)) == 10 else 1)
            finally:
                os._exit(2)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        if done[0] == 0:
            os.kill(child, 9)
            os.waitpid(child, 0)
        assert done[0] == child and os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        release.set()
        holder.join(10)


class _Trainer(threading.Thread):
    """A thread training on ``source`` (a ``Map`` of each record's fold) until ``stop()``."""

    def __init__(self, source, **kwargs):
        super().__init__(daemon=True)
        self.source, self.kwargs, self.done = source, kwargs, threading.Event()
        self.start()

    def run(self):
        with jl.DataLoader(self.source, batch_size=4, num_epochs=None, **self.kwargs,
                           transforms=[jl.Map(lambda r: {"fold": r["fold"]})]) as loader:
            for _ in loader:
                if self.done.is_set():
                    break

    def stop(self):
        self.done.set()
        self.join(30)


class _Lazy:
    """A dataset that makes its subset of ``other`` as it is first read (on a read thread)."""

    def __init__(self, other):
        self.other, self.sub = other, None

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if self.sub is None:
            self.sub = jl.FilteredSource(self.other, lambda r: r["fold"] % 2 == 0)
        return {"y": i}


def test_a_filter_made_on_a_read_thread_takes_the_locks_its_maker_does_not_hold():
    # a read thread took none (0ff843d): a dataset making its subset of another source as it
    # is first read scanned that source beside another thread's loader over it (the review)
    other = _Counted(400, 0.0005)
    trainer = _Trainer(other)
    try:
        for _ in range(3):
            with jl.DataLoader(_Lazy(other), batch_size=8, read_threads=4) as loader:
                next(iter(loader))
    finally:
        trainer.stop()
    assert other.overlaps == 0


class _CountedEach:
    """``_Counted``'s records read one at a time (no ``__getitems__``: a loader's read threads
    read them)."""

    def __init__(self, n, seconds):
        self.counted = _Counted(n, seconds)

    def __len__(self):
        return len(self.counted)

    def __getitem__(self, i):
        return self.counted[i]


def test_read_threads_shared_by_two_loaders_never_wait_on_each_other_for_good():
    # The pool of a thread count is the process's: a loader's reads that made a subset of a
    # source (waiting for its lock) filled it, while the thread holding that lock, a trainer
    # reading it record by record, waited for its own reads queued behind them (8af8a6b; the
    # fifteenth review). Each loader reads on a pool of its own now, and no longer waits for
    # reads it cancelled (a cancelled read is done for wait() only once dequeued).
    other, made = _CountedEach(400, 0.0005), []

    def lazy():
        for _ in range(3):
            with jl.DataLoader(_Lazy(other), batch_size=8, read_threads=4) as loader:
                made.append(next(iter(loader))["y"].tolist())

    trainer = _Trainer(other, read_threads=4)
    time.sleep(0.2)
    other_loaders = threading.Thread(target=lazy, daemon=True)
    other_loaders.start()
    other_loaders.join(60)
    trainer.stop()
    assert made == [list(range(8))] * 3 and not trainer.is_alive()  # (the trainer's own
    # reads overlap each other: read_threads=4 reads one source on four threads)


def test_a_sources_own_lock_held_by_a_thread_at_a_fork_is_free_in_the_child():
    # a ParquetSource's reads take turns on its own lock: held by a reading thread as the
    # process forked (a fork pool), the child's first read waited for ever (the review)
    from jaxloader.base.source_locks import OwnLock

    lock, held, release = OwnLock(), threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(10)
    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # (the child: the lock free, or the alarm's exit 2)
            signal.alarm(5)
            with lock:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0
