"""``num_workers="auto"``: the worker count changes while a run goes on, and nothing else does;
the tuner settles where the measurements say (``jaxloader.loaders.monitor``)."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import jaxloader as jl
from busy import WaitingSource, spin
from jaxloader.loaders import monitor

ONE = {"process_index": 0, "process_count": 1}


def heavy(record):
    spin(0.002)
    return record


def jitter(record, rng):
    return {"x": record["x"] + rng.integers(0, 1000, size=record["x"].shape)}


def arrays(n=600, width=3):
    return jl.ArraySource({"x": np.arange(n * width, dtype=np.int64).reshape(n, width)})


def make(workers, **kw):
    # Batches of 1 MiB: a task a step, two ahead a worker, so that a count asked for is taken
    # within a few steps (small batches go 16 steps a task, up to 64 ahead)
    return jl.DataLoader(arrays(n=200, width=16384), batch_size=8, shuffle=True, seed=7,
                         num_epochs=None,
                         transforms=[jl.RandomMap(jitter)], num_workers=workers, **ONE, **kw)


def test_a_run_whose_worker_count_changes_gives_the_batches_and_states_of_a_fixed_count():
    with make(0) as fixed:
        it = iter(fixed)
        expected = [next(it)["x"].copy() for _ in range(150)]
        states = {s: None for s in (40, 90, 149)}
    with make(0) as fixed:
        for s in states:
            fixed.load_state_dict({**fixed.state_dict(), "step": s})
            states[s] = fixed.state_dict()
    schedule = {10: 3, 30: 1, 60: 4, 100: 2, 120: 1}  # step -> workers asked for
    with make("auto") as auto:
        auto._monitor = None  # the schedule alone changes the count
        pool = auto._engine
        it = iter(auto)
        got, seen = [], set()
        for step in range(150):
            if step in schedule:
                pool.roster.resize(schedule[step])
            got.append(next(it)["x"].copy())
            seen.add(pool.active)
            if step + 1 in states:
                assert auto.state_dict() == states[step + 1]
        assert len(seen) >= 3 and max(seen) >= 3, seen  # the count did change
        assert all(w.batches > 0 for w in auto.stats.workers[:3])
    for step, (a, b) in enumerate(zip(expected, got)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    # the state of the run with changing counts restores into a fixed count, and the reverse
    with make(2) as two:
        two.load_state_dict(states[90])
        np.testing.assert_array_equal(next(iter(two))["x"], expected[90])


def test_a_worker_the_tuner_cannot_start_keeps_those_started_and_the_batches(monkeypatch,
                                                                            caplog):
    # under ulimit -n (or -u) the tuner grew till a worker's start failed ("Too many open
    # files", fork refused), which ended the training loop from next() (the limits audit)
    from jaxloader.workers import roster as rosters

    with make(0) as fixed:
        it = iter(fixed)
        expected = [next(it)["x"].copy() for _ in range(40)]
    real = rosters.WorkerProcess

    def limited(*args, **kw):
        if len(kw["into"]) >= 2:
            raise OSError(24, "Too many open files")
        return real(*args, **kw)
    monkeypatch.setattr(rosters, "WorkerProcess", limited)
    with make("auto") as auto, caplog.at_level(logging.WARNING, "jaxloader"):
        auto._monitor = None  # (asked by hand)
        it = iter(auto)
        got = [next(it)["x"].copy() for _ in range(10)]
        auto._engine.roster.resize(4)
        got += [next(it)["x"].copy() for _ in range(15)]
        assert auto.num_workers == 1 and auto._engine.roster.most == 2  # (the count in use:
        auto._engine.roster.resize(4)  # a stream's divides its readers) (at most those started)
        got += [next(it)["x"].copy() for _ in range(15)]
        assert auto.num_workers == 2 and len(auto.worker_pids) == 2
    for step, (a, b) in enumerate(zip(expected, got)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    said = [r.getMessage() for r in caplog.records if "no more worker" in r.getMessage()]
    assert len(said) == 1 and "OSError: [Errno 24] Too many open files); 1 in use, 2 at " \
        "most from now on" in said[0], said


def test_the_tuner_grows_no_further_than_the_descriptor_limit_leaves_room_for(monkeypatch):
    # at ulimit -n 128, "auto" made its table for 64 workers (three descriptors each, made at
    # once) and its first batch's slot found no descriptor left: "use fewer workers"
    import resource

    from jaxloader.runtime import descriptors

    monkeypatch.setattr(resource, "getrlimit", lambda which: (128, 128))
    monkeypatch.setattr(descriptors, "open_descriptors", lambda: 8)
    tune = monitor.AutoTune(FakePool(), cores=4)
    assert tune.capacity() == (128 - 8) // (2 * descriptors.WORKER_DESCRIPTORS) == 12
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    assert monitor.AutoTune(FakePool(), cores=4).capacity() == monitor.MAX_WORKERS


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(monitor, "WINDOW_S", 0.3)


@pytest.mark.e2e  # seconds of measured windows: run once in CI (its newest Python)
def test_autotune_settles_on_two_workers_for_a_cpu_bound_transform_on_two_cores(
        quick, caplog, monkeypatch):
    """Two cores (CI's, this machine's): it goes to 2 and never past. Another test on the same
    cores can make a second worker not pay for a while; the tuner tries again later
    (RETRY_WINDOWS, here a few seconds), so the run goes on until it is at 2 or 25 s passed."""
    cores = monitor.cores_available()
    caplog.set_level(logging.INFO, logger="jaxloader")
    monkeypatch.setattr(monitor, "RETRY_WINDOWS", 8)
    loader = jl.DataLoader(jl.ArraySource({"x": np.zeros((1 << 16, 4), np.float32)}),
                           batch_size=4, transforms=[jl.Map(heavy)], num_workers="auto",
                           num_epochs=None, **ONE)
    with loader:
        it = iter(loader)
        counts = [loader.num_workers]
        end = time.perf_counter() + 25.0
        settled_since = None
        while time.perf_counter() < end:
            next(it)
            counts.append(loader.num_workers)
            if counts[-1] == min(2, cores):
                settled_since = settled_since or time.perf_counter()
                if time.perf_counter() - settled_since > 2.0:
                    break  # at 2, and it stays there
            else:
                settled_since = None
        assert loader._monitor.tune.cores == cores
        assert counts[0] == 1 and counts[-1] == min(2, cores), counts[-40:]
        assert max(counts) <= cores  # never more than cores: the workers use the CPU
        assert loader.stats.num_workers == counts[-1]
    decisions = [r.getMessage() for r in caplog.records if "autotune" in r.getMessage()]
    assert any("1 -> 2 workers" in m for m in decisions), decisions


@pytest.mark.e2e  # seconds of measured windows: run once in CI (its newest Python)
def test_autotune_runs_more_workers_than_cores_for_a_source_that_waits_on_reads(quick):
    cores = monitor.cores_available()
    loader = jl.DataLoader(WaitingSource(), batch_size=8, num_workers="auto",
                           num_epochs=None, **ONE)
    with loader:
        it = iter(loader)
        end = time.perf_counter() + 20.0
        while loader.num_workers <= cores and time.perf_counter() < end:
            next(it)
        assert loader.num_workers > cores, cores
        assert loader.stats.num_workers == loader.num_workers


def numbered(shard):
    return ({"x": np.int64(shard * 100_000 + j)} for j in range(100_000))


def stream_loader(workers):
    stream = jl.Stream.from_generator(numbered, shards=4, shuffle_window=16)
    return jl.StreamLoader(stream, batch_size=4, seed=3, readers_per_process=4,
                           transforms=[jl.RandomMap(jitter)], num_workers=workers, **ONE)


def test_a_streams_worker_count_changes_among_those_dividing_its_readers_and_nothing_else():
    with stream_loader(2) as fixed:
        it = iter(fixed)
        expected, states = [], []
        for _ in range(70):
            expected.append(next(it)["x"].copy())
            states.append(fixed.state_dict())
    schedule = {5: 2, 20: 4, 40: 1, 55: 2}
    with stream_loader("auto") as auto:
        auto._monitor = None  # the schedule alone changes the count
        roster = auto._engine.roster
        it = iter(auto)
        seen = set()
        for step in range(70):
            if step in schedule:
                roster.resize(schedule[step])
            np.testing.assert_array_equal(next(it)["x"], expected[step], err_msg=f"step {step}")
            assert auto.state_dict() == states[step]
            seen.add(auto.num_workers)
        assert seen == {1, 2, 4}, seen
    with stream_loader(4) as four:  # its state restores into a fixed count
        four.load_state_dict(states[44])
        np.testing.assert_array_equal(next(iter(four))["x"], expected[45])


def test_auto_is_refused_where_it_cannot_choose_with_what_to_do():
    stream = jl.Stream.from_generator(lambda i: iter(range(4)), shards=1)
    with pytest.raises(jl.ConfigError, match="pass readers_per_process= too"):
        jl.StreamLoader(stream, batch_size=2, num_workers="auto", **ONE)
    with pytest.raises(jl.ConfigError, match="'auto' to let the loader choose"):
        jl.DataLoader(arrays(), batch_size=2, num_workers="many", **ONE)
    for num_workers in (0, 2):  # (accepted, and no tuning ran: prefetch stayed 2)
        with pytest.raises(jl.ConfigError, match=rf"prefetch='auto' with num_workers="
                                                 rf"{num_workers}: .*num_workers='auto' only"):
            jl.DataLoader(arrays(), batch_size=2, num_workers=num_workers, prefetch="auto", **ONE)


class FakePool:
    """What AutoTune reads of a pool, driven by hand: each window's batches and busy time."""

    def __init__(self, active=1, streaming_counts=None, capacity=8):
        from jaxloader.base.timings import Gauges
        from jaxloader.workers.roster import Roster

        self.gauges = Gauges(0)
        self.roster = Roster(0, capacity=capacity, start_method="exec", gauges=self.gauges)
        self.roster.active = self.roster.target = active
        self.pids = []
        self.prefetch = 2

    def round_steps(self, streaming):
        return 1

    @property
    def active(self):
        return self.roster.active

    def settle(self):  # the pool took the count asked for
        self.roster.active = self.roster.target


def windows(tune, pool, plan):
    """Feeds ``tune`` one window a (rate, waited share, busy share[, share of it on the CPU])
    of ``plan``; the counts asked for after each."""
    from jaxloader.base.timings import StageTotals

    now, batches, wait_s, asked = 0.0, 0, 0.0, []
    for rate, waited, busy, *on_cpu in plan:
        now += 1.0
        batches += int(rate)
        wait_s += waited
        totals = StageTotals()
        totals.absorb((busy * pool.active, busy * pool.active * (on_cpu or [1.0])[0], (), 0, 0,
                       0, None))
        pool.gauges.makers.append(totals)
        tune.decide(now, batches, batches, wait_s)
        pool.settle()
        asked.append(pool.active)
    return asked


def test_the_tuner_grows_no_further_than_dev_shm_holds_the_slots_where_they_are_there(
        monkeypatch, caplog):
    # on the POSIX path (no memory files) in a container's 64 MB /dev/shm, autotune grew
    # 1 -> 8 workers and the run ended with a SharedMemoryError mid-training (the containers
    # audit); with memory files /dev/shm holds nothing of theirs
    import logging
    import types

    from jaxloader.runtime import shm

    pool = FakePool(capacity=16)
    pool.slot_room = lambda: (6 << 20, 4 << 20)  # (a worker's slots ahead: 6 MiB; held: 4)
    monkeypatch.setattr(monitor.os, "statvfs", lambda path: types.SimpleNamespace(
        f_bavail=60 << 8, f_frsize=4096))  # (60 MiB free)
    monkeypatch.setattr(shm, "MEMFD_AVAILABLE", False)
    tune = monitor.AutoTune(pool, cores=8)
    assert tune._memory_bound(1) == 5  # ((60 + 4) / 2 / 6)
    with caplog.at_level(logging.INFO, logger="jaxloader"):
        asked = windows(tune, pool, [(100, 0.0, 1.0)] + [  # (each count paid: grown)
            (rate, 0.9, 1.0) for rate in (100, 0, 190, 0, 380, 0, 700, 0, 700)])
    assert asked == [1, 2, 2, 4, 4, 5, 5, 5, 5, 5], asked  # (not 8)
    assert any("/dev/shm holds the workers to 5" in r.getMessage() for r in caplog.records)
    assert not any("memory: half" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(shm, "MEMFD_AVAILABLE", True)
    assert tune._memory_bound(1) == monitor.MAX_WORKERS


def test_the_tuner_climbs_keeps_what_pays_goes_back_from_what_does_not_and_steps_down_idle():
    pool = FakePool()
    tune = monitor.AutoTune(pool, cores=4)
    asked = windows(tune, pool, [
        (100, 0.0, 1.0),  # the first window opens
        (100, 0.9, 1.0),  # waiting most of the time: doubled
        (0, 0.0, 1.0),    # (the window the change starts in opens the next)
        (190, 0.9, 1.0),  # 2 paid: kept, and doubled again
        (0, 0.0, 1.0),
        (195, 0.9, 1.0),  # 4 did not pay: back to 2, and 2 is the ceiling
        (0, 0.0, 1.0),
        (190, 0.9, 1.0),  # at the ceiling: stays
        (190, 0.0, 0.2),  # no wait, idle workers: one fewer
    ])
    assert asked == [1, 2, 2, 4, 4, 2, 2, 2, 1], asked
    assert tune.ceiling == 2


def test_reads_that_wait_most_of_the_time_take_up_to_sixteen_workers_a_core(monkeypatch):
    # the bound was 4 workers a core however long the reads waited: on 2 cores it stopped at
    # 8, where 32 read a 2 ms-a-record source 3.7x faster
    monkeypatch.setattr(monitor, "_workers_by_descriptors", lambda: monitor.MAX_WORKERS)
    pool = FakePool(capacity=64)  # (a machine's ulimit -n of 256 bounds it to 24)
    tune = monitor.AutoTune(pool, cores=2)
    assert tune.capacity() == 32
    plan = [(100, 0.0, 1.0, 0.05)]  # the first window opens
    for k in range(7):  # each count pays: doubled while the loop waits, the reads 95% off
        plan += [(100 * 1.9 ** k, 0.9, 1.0, 0.05), (0, 0.0, 1.0, 0.05)]
    asked = windows(tune, pool, plan)
    assert asked[-1] == 32 and max(asked) == 32, asked
    pool = FakePool(capacity=64)
    tune = monitor.AutoTune(pool, cores=2)
    plan = [(100, 0.0, 1.0, 0.6)] + [x for k in range(7) for x in (
        (100 * 1.9 ** k, 0.9, 1.0, 0.6), (0, 0.0, 1.0, 0.6))]  # 40% off the CPU: 4 a core
    assert max(windows(tune, pool, plan)) == 8


def test_prefetch_auto_doubles_the_tasks_ahead_while_the_loop_waits_on_idle_workers():
    pool = FakePool(active=4)
    tune = monitor.AutoTune(pool, cores=4, tune_prefetch=True)
    tune.ceiling = 4  # no more workers to try
    windows(tune, pool, [(100, 0.0, 0.3), (0, 0.0, 0.3), (100, 0.5, 0.3), (100, 0.5, 0.3)])
    assert pool.prefetch == 8 and pool.active == 4


def test_a_streams_counts_are_those_dividing_its_readers(monkeypatch):
    monkeypatch.setattr(monitor, "_workers_by_descriptors", lambda: monitor.MAX_WORKERS)
    tune = monitor.AutoTune(FakePool(), cores=4, counts=[1, 2, 3, 6])
    assert tune.allowed(4, 2, 8) == 3 and tune.allowed(5, 2, 8) == 6  # nearest, then lower
    assert tune.allowed(2, 4, 5) is None and tune.capacity() == 6


def test_a_stream_whose_next_count_is_past_the_cores_tries_it_and_a_bound_is_said(caplog):
    # readers 3 on 2 cores, a CPU-bound Map: counts [1, 3], and it stayed at 1 worker for the
    # whole run, the loop waiting 99.6%, nothing said (the tuning audit): 3 is tried, kept
    # only if it pays
    pool = FakePool(capacity=3)
    tune = monitor.AutoTune(pool, cores=2, counts=[1, 3])
    asked = windows(tune, pool, [(100, 0.0, 1.0), (100, 0.9, 1.0), (0, 0.0, 1.0),
                                 (105, 0.9, 1.0)])  # 3 did not pay: back to 1
    assert asked == [1, 3, 3, 1], asked
    pool = FakePool(active=2)  # at the cores' bound, the loop waiting: said, once
    tune = monitor.AutoTune(pool, cores=2)
    with caplog.at_level(logging.INFO, logger="jaxloader"):
        windows(tune, pool, [(100, 0.0, 1.0)] + [(100, 0.9, 1.0)] * 3)
    said = [r.getMessage() for r in caplog.records if "the most worth running" in
            r.getMessage()]
    assert len(said) == 1 and "2 worker(s)" in said[0] and "2 cores" in said[0], said
    # held by the memory, not the cores: the line named the cores all the same
    pool = FakePool(active=2)
    tune = monitor.AutoTune(pool, cores=8)
    tune._memory_bound = lambda active: 2  # (half of what is free holds two)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jaxloader"):
        windows(tune, pool, [(100, 0.0, 1.0)] + [(100, 0.9, 1.0)] * 3)
    said = [r.getMessage() for r in caplog.records if "the most worth running" in
            r.getMessage()]
    assert len(said) == 1 and "(memory: half of what is free" in said[0], said
    assert "cores" not in said[0], said
    # held by a count tried that did not pay (the ceiling): it named the cores
    pool = FakePool(active=2)
    tune = monitor.AutoTune(pool, cores=8)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jaxloader"):
        asked = windows(tune, pool, [(100, 0.0, 1.0), (100, 0.9, 1.0), (100, 0.9, 1.0)]
                        + [(100, 0.9, 1.0)] * 3)  # (4 workers: no faster, back to 2)
    said = [r.getMessage() for r in caplog.records if "the most worth running" in
            r.getMessage()]
    assert asked[:4] == [2, 4, 4, 2] and len(said) == 1, (asked, said)
    assert "(more were tried and made batches no faster; tried again in" in said[0], said
    assert "cores" not in said[0], said


def test_a_window_across_a_reset_of_the_stats_or_time_away_is_not_judged():
    # after reset_stats() the loader's counts went back: the wait came out negative and the
    # tuner took workers away while the loop waited; a window across an evaluation between
    # runs judged the count by hours apart
    pool = FakePool(active=4)
    tune = monitor.AutoTune(pool, cores=4)
    tune.ceiling = 4
    windows(tune, pool, [(100, 0.9, 1.0), (100, 0.9, 1.0)])  # at its ceiling, waiting
    tune.decide(10.0, 10, 10, 0.5)  # the counts after a reset: 10 batches, 0.5 s waited
    tune.decide(11.0, 110, 110, 1.4)
    assert pool.roster.target == 4, pool.roster.target


def test_a_change_on_trial_when_a_run_starts_is_judged_after_it():
    # the restart at each iter() dropped the trial: with an epoch a window or two long, each
    # epoch could keep one more worker that did not pay, never compared with the count before
    pool = FakePool()
    tune = monitor.AutoTune(pool, cores=4)
    assert windows(tune, pool, [(100, 0.0, 1.0), (100, 0.9, 1.0)]) == [1, 2]  # on trial
    tune.restart()  # a new run (an epoch's iter())
    assert windows(tune, pool, [(100, 0.9, 1.0), (100, 0.9, 1.0)])[-1] == 1  # did not pay
    assert tune.ceiling == 1


class Recorder:
    """A tuner that counts its restarts (and decides nothing)."""

    restarts = 0

    def restart(self):
        self.restarts += 1

    def decide(self, *args):
        pass


def test_each_run_and_each_reset_of_the_stats_starts_the_tuning_window_afresh():
    with jl.DataLoader(arrays(), batch_size=64, log_every_s=1000.0, **ONE) as loader:
        loader._monitor.tune = tune = Recorder()
        list(loader)
        list(loader)  # (an evaluation between the two passes: time away)
        assert tune.restarts == 2
        loader.reset_stats()
        assert tune.restarts == 3


def test_the_periodic_summary_counts_the_batch_its_time_came_at():
    # the summary was said as the batch whose return brought its time was handed out, before
    # that batch's wait was counted: a 1.4 s wait for a slow read went to the next window,
    # named "main" there, its worker's read counted in this one (the diagnosis audit)
    said = []
    watch = monitor.Monitor(None, 1.0, lambda: said.append("summary") or "summary")
    start = watch.next_at - 1.0
    watch.tick(start + 0.5, 10, 10, 0.0)
    assert not said and watch.next_at == start + 1.0
    watch.tick(start + 2.4, 11, 11, 1.4)  # (its time: said at the next batch, this one's counted)
    assert not said and watch.next_at == 0.0
    watch.tick(start + 2.45, 12, 12, 1.4)
    assert said == ["summary"] and watch.next_at == pytest.approx(start + 3.4)
