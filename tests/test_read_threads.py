"""``DataLoader(read_threads=)``: a batch's records read on several threads, in a worker or in
the training process, the batches the same bit for bit."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.base import read_threads
from jaxloader.base.errors import ConfigError, RecordError
from jaxloader.base.source_locks import lock_of

ONE = {"process_index": 0, "process_count": 1}


class Records:
    """Records computed from their index (any thread may read them)."""

    def __init__(self, n: int = 300) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"x": np.arange(3, dtype=np.float32) + i, "y": np.int64(i * 7)}


class Together:
    """Reads that end only once ``k`` of them run at once (a barrier each ``k``): a batch of
    a multiple of ``k`` records is read only where its reads overlap. Each record says whether
    it was read on one of jaxloader's read threads."""

    def __init__(self, k: int = 4, n: int = 64, timeout_s: float = 30) -> None:
        self.k, self.n, self.timeout_s = k, n, timeout_s

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict:
        return {"k": self.k, "n": self.n, "timeout_s": self.timeout_s}  # (a barrier of its own)

    def __getitem__(self, i: int) -> dict:
        barrier = self.__dict__.get("barrier")
        if barrier is None:
            barrier = self.__dict__.setdefault("barrier", threading.Barrier(self.k))
        barrier.wait(timeout=self.timeout_s)
        return {"i": np.int64(i), "pooled": np.bool_(
            threading.current_thread().name.startswith("jaxloader-read"))}


def batches(loader: jl.DataLoader, n: int) -> list:
    with loader:
        it = iter(loader)
        return [next(it) for _ in range(n)]


def same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert x[key].dtype == y[key].dtype
            np.testing.assert_array_equal(x[key], y[key])


def double(record: dict) -> dict:
    return {**record, "x": record["x"] * 2}


@pytest.mark.parametrize("kind", ["records", "concat", "filtered", "mapped"])
def test_the_batches_are_the_same_on_threads_with_0_and_2_workers(kind):
    source = {"records": lambda: Records(),
              "concat": lambda: jl.ConcatSource([Records(100), Records(200)]),
              "filtered": lambda: jl.FilteredSource(Records(), lambda r: r["y"] % 3 != 0),
              "mapped": lambda: jl.MapSource(Records(), double)}[kind]

    def made(workers: int, threads: int, transforms: list) -> list:
        return batches(jl.DataLoader(source(), batch_size=16, shuffle=True, seed=5,
                                     transforms=transforms, num_workers=workers,
                                     read_threads=threads, last_batch="pad", num_epochs=2,
                                     **ONE), 20)

    for transforms in ([], [double]):
        reference = made(0, 1, transforms)
        same(made(0, 8, transforms), reference)
        if kind in ("records", "concat"):  # (the workers' side, twice, not for every kind)
            same(made(2, 8, transforms), reference)


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("wrapped", [False, True])
def test_the_reads_overlap_on_the_threads(workers, wrapped):
    # 4 reads must run at once for any to end: with read_threads=4 every batch is made (on
    # the pool's threads), one record after the other they would wait out the barrier
    source = Together(4)
    if wrapped:  # (read by the ConcatSource's own __getitems__, on the batch's threads)
        source = jl.ConcatSource([source])
    got = batches(jl.DataLoader(source, batch_size=8, read_threads=4, num_workers=workers,
                                **ONE), 4)
    assert np.concatenate([b["i"] for b in got]).tolist() == list(range(32))
    assert all(b["pooled"].all() for b in got)


def test_a_task_of_one_record_batches_is_read_ahead_from_its_first():
    # (the review:) the refill watch held a worker's first task off its read-ahead, and with
    # a batch of one record the watch never ends: every task read a step at a time, for good
    from jaxloader.batching.batch_maker import BatchMaker
    from jaxloader.order.sampling import Sampler

    maker = BatchMaker(Together(8, timeout_s=5), Sampler(64, 1, shuffle=False, seed=0,
                                                         last_batch="drop"), read_threads=8)
    made = [batch for batch, _ in maker.make_steps(list(range(8)), [None] * 8)]
    assert [b["i"].tolist() for b in made] == [[i] for i in range(8)]


def test_a_map_sources_function_runs_on_the_read_threads_with_each_read():
    # a waiting fetch in a MapSource (a source read record by record): its calls ran one after
    # the other on the batch's thread, the docs' remedy for a transform that waits
    together = Together(4)

    def fetch(record: dict) -> dict:
        return {**record, **together[int(record["y"]) // 7]}

    got = batches(jl.DataLoader(jl.MapSource(Records(64), fetch), batch_size=8, read_threads=4,
                                **ONE), 2)
    assert np.concatenate([b["i"] for b in got]).tolist() == list(range(16))
    assert all(b["pooled"].all() for b in got)


def test_a_workers_task_reads_the_records_of_all_its_steps_at_once():
    # a task of two steps of 4 records, read by a worker on 8 threads: its 8 reads must run
    # at once (a barrier of 8); read a step at a time, they waited out the barrier
    from jaxloader.batching.batch_maker import BatchMaker
    from jaxloader.order.sampling import Sampler

    maker = BatchMaker(Together(8, timeout_s=5), Sampler(64, 4, shuffle=False, seed=0,
                                                         last_batch="drop"), read_threads=8)
    maker._refills.left = 0  # (its first task is read a step at a time, for the refill watch)
    made = [batch for batch, _ in maker.make_steps([2, 3], [None, None])]
    assert [b["i"].tolist() for b in made] == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert maker._ahead == {}  # (the task's reads let go as it ended)
    left = maker.make_steps([4, 5, 6, 7], [None] * 4)  # a task left after its first step
    assert next(left)[0]["i"].tolist() == [16, 17, 18, 19]
    left.close()  # (its reads in flight end; the others are not read)
    assert maker._ahead == {}


def test_a_failed_read_names_the_first_record_in_order_after_every_read_in_flight_ended():
    active, ended = [], []

    class Failing(Records):
        def __getitem__(self, i: int) -> dict:
            if i in (3, 5):
                raise OSError(f"record {i} is damaged")
            active.append(i)
            time.sleep(0.05)
            ended.append(i)
            return super().__getitem__(i)

    loader = jl.DataLoader(Failing(), batch_size=8, read_threads=8, **ONE)
    with pytest.raises(RecordError, match=r"index 3\b.*record 3 is damaged"):
        next(iter(loader))
    assert sorted(active) == sorted(ended)  # no read went on past the error
    loader.close()


def test_the_source_lock_is_held_while_the_threads_read_in_the_training_process():
    held = []

    class Checked(Records):
        def __getitem__(self, i: int) -> dict:
            lock = lock_of(self)  # (held by the batch's thread: a pool thread cannot take it)
            taken = lock.acquire(blocking=False)
            if taken:
                lock.release()
            held.append(not taken)
            return super().__getitem__(i)

    for transforms in ([], [double]):
        held.clear()
        batches(jl.DataLoader(Checked(), batch_size=8, read_threads=4, transforms=transforms,
                              **ONE), 2)
        assert held and all(held)


def test_reads_no_loader_holds_leave_no_thread():
    # a BatchMaker or read_threads.each used by hand (a doctest): its pool stayed for the
    # process's life, and a later check for jaxloader's threads (test_lifecycle) saw them
    before = {t.ident for t in threading.enumerate()}
    assert read_threads.using(3, read_threads.each, lambda i: i * 10, [3, 1, 2]) == [30, 10, 20]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [
            t for t in threading.enumerate() if t.ident not in before and t.name.startswith(
                "jaxloader-read")]:
        time.sleep(0.01)
    assert not [t for t in threading.enumerate()
                if t.ident not in before and t.name.startswith("jaxloader-read")]


def test_a_read_on_a_pool_thread_reads_its_own_records_one_by_one():
    inner = []

    def read(i: int) -> int:  # (a source made of others, read inside a read: no pool again)
        inner.append(read_threads.count())
        return read_threads.each(lambda j: j + i, [0, 1])[1]

    release = read_threads.hold(4)  # (let go after: no thread left to the other tests)
    try:
        assert read_threads.using(4, read_threads.each, read, [10, 20, 30]) == [11, 21, 31]
    finally:
        release()
    assert inner == [1, 1, 1] and read_threads.count() == 1


@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "16", 2000])
def test_a_wrong_count_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match="read_threads: expected an int"):
        jl.DataLoader(Records(), batch_size=4, read_threads=bad, **ONE)


def test_the_diagnosis_of_waiting_reads_offers_read_threads():
    from jaxloader.base.stats import LoaderStats, WorkerStats
    from jaxloader.loaders.diagnosis import diagnose

    waiting = (WorkerStats(0, 1, 50, 800, 1 << 20, busy_s=2.9, cpu_s=0.1,
                           stages={"read": 2.8, "collate": 0.1}),)
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=800, stages={"read": 2.8, "collate": 0.1,
                                             "consumer wait": 2.5, "step": 0.5},
                        workers=waiting, num_workers=1)
    d = diagnose(stats, num_workers=1, cores=2, read_threads=1)
    assert d.bottleneck == "source" and "read_threads=16" in d.advice[1], d
    # (16 threads still waiting: twice as many, up to the 1,024 a loader takes)
    assert "read_threads=32" in diagnose(stats, num_workers=1, cores=2,
                                         read_threads=16).advice[1]
    assert not any("read_threads" in a for a in diagnose(stats, num_workers=1, cores=2,
                                                         read_threads=1024).advice)
    assert not any("read_threads" in a for a in diagnose(stats, num_workers=1, cores=2).advice)


def test_a_closed_loader_leaves_no_read_thread():
    before = {t.ident for t in threading.enumerate()}

    def pool_threads() -> list:
        return [t for t in threading.enumerate()
                if t.name.startswith("jaxloader-read") and t.ident not in before]

    first = jl.DataLoader(Records(), batch_size=8, read_threads=3, **ONE)
    second = jl.DataLoader(Records(), batch_size=8, read_threads=3, num_epochs=None, **ONE)
    batches(first, 2)  # (closed: the second still holds the pool)
    it = iter(second)
    next(it)
    assert pool_threads()
    second.close()
    deadline = time.monotonic() + 10
    while pool_threads() and time.monotonic() < deadline:  # (woken, they end at once)
        time.sleep(0.01)
    assert not pool_threads()
    third = jl.DataLoader(Records(), batch_size=8, read_threads=3, **ONE)  # a pool anew
    same(batches(third, 2), batches(jl.DataLoader(Records(), batch_size=8, **ONE), 2))


def bad_at_13(record: dict) -> dict:
    if int(record["y"]) == 13 * 7:
        raise ValueError("record 13 is damaged")
    return record


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("inside", [False, True])
def test_a_map_sources_failing_function_names_its_record(threads, inside):
    # the message named the batch only ("record positions 24..31"), with or without threads
    source = jl.MapSource(Records(64), bad_at_13)
    if inside:  # (a part of a concatenation: its index among the whole's)
        source = jl.ConcatSource([Records(64), source])
    loader = jl.DataLoader(source, batch_size=8, shuffle=True, seed=1, read_threads=threads,
                           **ONE)
    part = r" \(sources\[1\] record 13\)" if inside else ""  # (and the part's own)
    with pytest.raises(RecordError, match=rf"record position \d+ \(source index "
                                          rf"{64 * inside + 13}\){part}: .*record 13 is damaged"):
        list(loader)
    loader.close()


def test_a_packings_failed_read_names_no_other_record():
    class Flaky(Records):  # its reads fail once the plan is made (a file replaced)
        planned = False

        def __getitem__(self, i: int) -> dict:
            if Flaky.planned and i == 2:
                raise OSError("record 2 is gone")
            return {"tokens": np.arange(i % 5 + 1, dtype=np.int32)}

    packed = jl.PackedSource(jl.MapSource(Flaky(40), dict), "tokens", 8)
    Flaky.planned = True
    with jl.DataLoader(packed, batch_size=3, read_threads=4, **ONE) as loader:
        with pytest.raises(RecordError, match="record 2 is gone") as info:
            list(loader)
    assert "(source index" not in str(info.value)  # (the source's third record (among those
    # the batch's rows read) is not the batch's third row)


STUCK_READ = """
import signal, sys, threading, time
import numpy as np, jaxloader as jl

signal.signal(signal.SIGINT, signal.default_int_handler)  # (a CI started in the background
# has SIGINT ignored, and its children inherit that: Python then leaves it ignored)
stuck = threading.Event()  # never set: a read on a mount whose server went away


class Src:
    def __len__(self): return 100
    def __getitem__(self, i):
        if i >= 8:
            stuck.wait()
        return {"x": np.float32(i)}


loader = jl.DataLoader(Src(), batch_size=4, read_threads=4, process_index=0, process_count=1)
it = iter(loader); next(it); next(it)
if sys.argv[1] == "close":  # a read under way as the loader closes
    threading.Thread(target=next, args=(it,), daemon=True).start()
    time.sleep(0.5)
else:  # a Ctrl-C while next() waits for the stuck read (again each 0.5 s: one that lands
    caught = []  # just before the wait begins is not seen by it, with any code)

    def press():  # (none once it is caught: the exit must not need one)
        for _ in range(10):
            time.sleep(0.5)
            if caught:
                return
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    threading.Thread(target=press, daemon=True).start()
    try:
        next(it)
    except KeyboardInterrupt:
        caught.append(1)
        print("interrupted", flush=True)
loader.close()
print("leaving", flush=True)
"""


@pytest.mark.parametrize("how", ["close", "interrupt"])
def test_a_read_that_never_returns_keeps_neither_a_ctrl_c_nor_the_exit_waiting(how, tmp_path):
    # the read threads were a ThreadPoolExecutor's, which the interpreter joins as it exits:
    # the process never ended after close(), and the first Ctrl-C waited for the read (the
    # concurrency audit)
    import subprocess
    import sys

    script = tmp_path / "stuck.py"
    script.write_text(STUCK_READ)
    try:
        done = subprocess.run([sys.executable, str(script), how], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the process did not end: {e.stdout!r} {e.stderr!r}")
    assert done.returncode == 0 and "leaving" in done.stdout, done.stderr[-3000:]
    if how == "interrupt":
        assert "interrupted" in done.stdout, done.stdout


def test_a_pool_whose_thread_cannot_start_queues_nothing_and_runs_later_calls(monkeypatch):
    # its thread was counted before it started: two failed starts filled a pool of 2 with
    # threads that never ran, and every later read waited for good (the review)
    import concurrent.futures as cf

    from jaxloader.base.daemon_pool import DaemonPool

    real, fails = threading.Thread.start, [2]

    def start(self):
        if self.name.startswith("failing_") and fails[0]:
            fails[0] -= 1
            raise RuntimeError("can't start new thread")
        return real(self)
    monkeypatch.setattr(threading.Thread, "start", start)
    pool = DaemonPool(2, "failing")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="can't start new thread"):
            pool.submit(int, 1)
    later = pool.submit(lambda: "read")
    assert cf.wait([later], timeout=10).done == {later} and later.result() == "read"
    started, running = threading.Event(), threading.Event()
    held = pool.submit(lambda: (started.set(), running.wait(10)))  # (a read under way: busy)
    assert started.wait(10) and pool.busy()
    running.set()
    held.result(timeout=10)
    pool.shutdown()
