"""Workers: same stream as in-process, resume across worker counts, failures, no leaks."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing.connection import wait

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.batching.batch_maker import BatchMaker
from jaxloader.order.sampling import Sampler
from jaxloader.workers import starter
from jaxloader.workers.pool import WorkerPool
from jaxloader.workers.tasks import steps_per_task, task_shape
from resume_harness import assert_same_stream, check_resume, take
from workers.shm_probe import held_segments, running, still_held

pytestmark = pytest.mark.timeout(120)


def source(n=61):
    return jl.ArraySource({"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4),
                           "y": np.arange(n, dtype=np.int64)})


def jitter(r, rng):
    return {"x": r["x"] + rng.normal(size=4).astype(np.float32), "y": r["y"]}


def make(num_workers, random_map=True, shuffle=True, last_batch="drop", **kw):
    transforms = [jl.RandomMap(jitter)] if random_map else []
    return lambda: jl.DataLoader(source(), batch_size=6, shuffle=shuffle, seed=5,
                                 transforms=transforms, num_workers=num_workers,
                                 last_batch=last_batch, process_index=0, process_count=1, **kw)


def make_pool(num_workers) -> WorkerPool:
    """make()'s loader as a bare pool (tests of the pool's own bookkeeping)."""
    maker = BatchMaker(source(), Sampler(61, 6, shuffle=True, seed=5, last_batch="drop"),
                       (jl.RandomMap(jitter),))
    return WorkerPool(maker, num_workers)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("random_map,last_batch", [(True, "drop"), (False, "pad"),
                                                   (True, "partial")])
def test_workers_give_the_in_process_stream(num_workers, random_map, last_batch):
    total = 25  # crosses two epoch boundaries
    with make(0, random_map, last_batch=last_batch)() as ref_loader:
        reference = [dict((k, v.copy()) for k, v in b.items()) for b in take(ref_loader, total)]
    with make(num_workers, random_map, last_batch=last_batch)() as loader:
        got = take(loader, total)
        assert_same_stream(got, reference)


@pytest.mark.parametrize("restored_workers", [0, pytest.param(1, marks=pytest.mark.e2e)])
def test_state_from_3_workers_restores_into_fewer(restored_workers):
    for k in (0, 4, 10, 19):
        check_resume(make(3), 22, k, make_restored=make(restored_workers))


def test_restore_mid_run_drops_in_flight_batches():
    with make(2)() as loader:
        it = iter(loader)
        next(it)
        next(it)
        state = loader.state_dict()
        next(it)  # more batches are in flight now
        loader.load_state_dict(state)
        again = take(loader, 3)
        expected = take(make(0)(), 5)[2:]
        assert_same_stream(again, expected)


def test_held_numpy_batches_never_change():
    with make(2, prefetch=3)() as loader:
        held = take(loader, 30)  # every slot stays referenced
        assert_same_stream(held, take(make(0)(), 30))


def test_slots_are_reused_in_steady_state():
    from jaxloader.workers.tasks import MAX_AHEAD_STEPS, MAX_TASK_STEPS

    pool = make_pool(2)
    try:
        counts = []
        for _ in pool.batches(0, 600):
            counts.append(pool.segment_count)
        # tiny batches: tasks of MAX_TASK_STEPS steps, MAX_AHEAD_STEPS of them in flight a
        # worker; at most a block (one task a worker) beyond, and the batch in hand
        assert max(counts[300:]) == counts[300] <= 2 * (MAX_AHEAD_STEPS + MAX_TASK_STEPS) + 1, (
            counts)
    finally:
        pool.close()


def test_small_batches_run_further_ahead_within_the_bounds():
    from jaxloader.workers.tasks import MAX_AHEAD_SLOTS, TASK_BYTES, tasks_ahead

    def ahead(workers, size, steps, prefetch=2):
        return tasks_ahead(size, steps, prefetch, workers)

    assert ahead(2, 22_528, 16) == 4  # 256 Parquet rows: 4 tasks of 16 a worker
    assert ahead(8, 22_528, 16) == 2  # 8 workers: 256 slots in all, prefetch tasks each
    assert ahead(2, 100_000, 10) == 2  # tasks of 1 MiB: prefetch of them
    assert ahead(2, 2 << 20, 1) == ahead(2, 4096, 1) == 2  # a step a task: large, or a stream
    assert ahead(2, 0, 1) == 2 and ahead(2, 22_528, 16, prefetch=5) == 5
    for workers in range(1, 33):
        for size in (512, 4096, 22_528, 100_000, 3 << 20):
            steps = max(1, min(16, TASK_BYTES // size))
            tasks = ahead(workers, size, steps)
            assert workers * tasks * steps <= max(MAX_AHEAD_SLOTS, workers * 2 * steps)
            steps = steps_per_task(size, False, workers * 2)  # as the pool asks, prefetch 2
            assert workers * ahead(workers, size, steps) * steps <= max(MAX_AHEAD_SLOTS,
                                                                        workers * 2)


def sleepy(r):  # 50 ms a record: 0.2 s a batch of 4
    time.sleep(0.05)
    return r


def test_batches_that_take_long_to_make_come_in_tasks_of_half_a_second():
    # a task's batches go back together: small batches of 0.2 s each went 16 a task (3.2 s
    # before the first of them), as their bytes allowed
    maker = BatchMaker(jl.ArraySource({"y": np.arange(200)}), Sampler(
        200, 4, shuffle=False, seed=0, last_batch="drop"), (jl.Map(sleepy),))
    pool = WorkerPool(maker, num_workers=1)
    try:
        assert pool._task_shape(False)[0] == 1  # (the batch's size not known yet)
        made = [b["y"][0] for b in pool.batches(0, 6)]
        steps, ahead, in_all = pool._task_shape(False)
        assert made == [0, 4, 8, 12, 16, 20] and 1 <= steps <= 2, (steps, ahead)
        by_bytes = task_shape(pool._ring.slot_size, False, prefetch=2, workers=1)
        assert by_bytes[0] == 16 and by_bytes[2] - steps < in_all <= by_bytes[2]  # as far ahead
    finally:
        pool.close()


class Ragged:
    """Records whose length grows with the index: every batch needs a bigger slot."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return {"v": np.full(1000 * (i + 1), i, np.int32)}


def test_slots_grow_for_variable_length_batches():
    with jl.DataLoader(Ragged(), batch_size=1, num_workers=2, process_index=0,
                       process_count=1) as loader:
        for i, batch in enumerate(loader):
            assert batch["v"].shape == (1, 1000 * (i + 1)) and (batch["v"] == i).all()


def test_a_raising_transform_names_worker_pid_step_position_and_traceback():
    def boom(r):
        if int(r["y"]) == 13:
            raise ValueError("record thirteen is bad")
        return r

    loader = jl.DataLoader(source(), batch_size=6, transforms=[jl.Map(boom)], num_workers=2,
                           process_index=0, process_count=1)
    pids = loader.worker_pids
    it = iter(loader)
    with pytest.raises(jl.WorkerError) as e:
        list(it)
    msg = str(e.value)
    assert "at step 2" in msg and "record position 13" in msg
    assert any(f"pid {p}" in msg for p in pids) and "worker " in msg
    assert "traceback in the worker" in msg and "record thirteen is bad" in msg
    assert "boom" in msg  # the remote traceback names the user's function
    assert isinstance(e.value.__cause__, jl.RecordError)
    # the original error is the RecordError's cause, as in process (pickle keeps no cause)
    assert repr(e.value.__cause__.__cause__) == "ValueError('record thirteen is bad')"
    with pytest.raises(jl.WorkerError) as again:  # broken is a state: the same error, a copy
        iter(loader)  # of it without the frames of the call that raised it first (the soak
    assert again.value is not e.value and str(again.value) == str(e.value)  # audit)
    assert repr(again.value.__cause__.__cause__) == repr(e.value.__cause__.__cause__)
    with pytest.raises(jl.WorkerError):
        next(it)
    frames = []  # (each raise of the kept error added its raiser's frames to its traceback:
    for _ in range(3):  # a notebook's later cell showed every earlier call's frames)
        with pytest.raises(jl.WorkerError) as later:
            next(iter(loader))
        tb, n = later.value.__traceback__, 0
        while tb is not None:
            tb, n = tb.tb_next, n + 1
        frames.append(n)
    assert frames[0] == frames[1] == frames[2], frames
    import pickle  # (and it crosses to another process: a kept traceback cannot be pickled)
    assert str(pickle.loads(pickle.dumps(later.value))) == str(later.value)
    loader.close()


class _Params:  # (a weakref can follow it: a model's parameters in a training function)
    pass


def test_a_broken_loader_or_its_error_kept_holds_nothing_of_the_function_that_ran_it():
    # a loader broken by a worker's error kept that error, whose traceback held the frame of
    # the function that iterated it, and so its locals (its model, its last batch and slot):
    # 16 MiB a trial in a sweep that kept each trial's loader, closed; and an error kept with
    # its __traceback__ dropped still held them, through a traceback the loader hid in it
    # (the soak audit)
    import gc
    import weakref

    def boom(r):
        if int(r["y"]) == 13:
            raise ValueError("record thirteen is bad")
        return r

    params, errors = [], []

    def train(loader):
        model = _Params()
        params.append(weakref.ref(model))
        for batch in loader:
            pass

    for keep in ("loader", "error"):
        loader = jl.DataLoader(source(), batch_size=6, transforms=[jl.Map(boom)], num_workers=1,
                               process_index=0, process_count=1)
        try:
            train(loader)
        except jl.WorkerError as e:
            e.__traceback__ = None  # (the user's own: let go)
            errors.append(e) if keep == "error" else None
        with pytest.raises(jl.WorkerError, match="record thirteen is bad"):
            train(loader)  # (raised again)
        loader.close()
        if keep == "error":
            del loader
        gc.collect()
        assert [p() for p in params] == [None] * len(params), keep  # (each call's model)
    assert "record thirteen is bad" in str(errors[0])


class _Custom(Exception):  # (an __init__ of other arguments than it keeps: copy.copy fails)
    def __init__(self, path, code):
        super().__init__(f"{path}: {code}")


def test_a_kept_errors_causes_hold_no_frames_and_its_notes_are_its_own():
    # (the review) a cause copy.copy could not copy was kept as it was, its traceback with
    # it; a group's exceptions too; and a note added to an error raised again was said by
    # every later one
    import gc
    import weakref

    from jaxloader.base.errors import again, kept

    def train():
        model = _Params()
        try:
            try:
                raise _Custom("/data/x", 3)
            except _Custom as c:
                group = ExceptionGroup("reads", [c])
                raise jl.WorkerError("worker 0 raised") from group
        except jl.WorkerError as e:
            e.add_note("a note")
            return kept(e), weakref.ref(model)

    error, model = train()
    gc.collect()
    assert model() is None  # (nothing of train() held)
    assert isinstance(error.__cause__, ExceptionGroup)
    assert str(error.__cause__.exceptions[0]).endswith("_Custom: /data/x: 3")
    raised = again(error)
    raised.add_note("the user's")
    assert error.__notes__ == ["a note"] and raised.__notes__ == ["a note", "the user's"]


def test_a_worker_dead_on_a_file_names_it_and_a_raised_error_names_it_once(tmp_path):
    # (the video audit: a worker killed decoding one clip, a batch each, was named by its step
    # and positions alone; the review: the file named twice where the error names its record)
    for i in range(4):
        np.save(tmp_path / f"c{i}.npy", np.zeros((2, 3), np.uint8))

    def load(record):
        if record["path"].endswith("c2.npy"):
            os.kill(os.getpid(), signal.SIGKILL)
        return np.load(record["path"])

    def bad(record):
        if record["path"].endswith("c2.npy"):
            raise ValueError("a bad clip")
        return np.load(record["path"])

    source = jl.FileListSource(sorted(str(p) for p in tmp_path.glob("*.npy")))
    for fn, said in ((load, r"died while making step 2 \(epoch 0, record positions 2..2\) "
                            r"\(\S*c2.npy\): killed by signal 9"), (bad, r"raised at step 2")):
        with jl.DataLoader(source, batch_size=1, num_workers=1, process_index=0,
                           process_count=1, transforms=[jl.Map(fn)]) as loader:
            with pytest.raises(jl.WorkerError, match=said) as e:
                list(loader)
        assert str(e.value).split("--- traceback")[0].count("c2.npy") == 1, str(e.value)[:400]


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_a_dead_worker_is_reported_at_once(how):
    def die(r):
        if int(r["y"]) == 20:
            if how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        return r

    loader = jl.DataLoader(source(), batch_size=6, transforms=[jl.Map(die)], num_workers=2,
                           process_index=0, process_count=1)
    start = time.monotonic()
    with pytest.raises(jl.WorkerError) as e:
        list(loader)
    # the workers' start (~1.2 s in a fresh venv on a loaded machine) and the detection:
    # never a wait for a stall (no timeout_s here: that would be forever)
    assert time.monotonic() - start < 5.0
    msg = str(e.value)
    want = "killed by signal 9" if how == "sigkill" else "exit code 3"
    assert want in msg and "pid " in msg and "step 3" in msg, msg
    loader.close()


def test_a_worker_killed_while_idle_is_named_with_the_step_the_loader_awaits():
    # "died while idle": no step said, where the docs promise it and its records (the
    # lifecycle audit: a long training step, the workers waiting for slots, one killed)
    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(20_000)}), batch_size=10,
                           num_workers=2, process_index=0, process_count=1)
    with loader:
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        time.sleep(1.0)  # (a training step: its tasks made, it waits idle for slots)
        os.kill(loader.worker_pids[1], signal.SIGKILL)
        with pytest.raises(jl.WorkerError, match=r"worker 1 \(pid \d+\) died while (idle, the "
                           r"loader awaiting|making) step \d+ \(epoch 0, record positions "
                           r"\d+..\d+\): killed by signal 9"):  # (making: a loaded machine's)
            for _ in range(2000):
                next(batches)


def test_a_worker_dead_between_runs_is_not_named_with_the_last_runs_step():
    # the step the loader awaits stayed the last run's after it ended: a death noticed before
    # the next run (a stream's payload sent to workers started between two runs) named it
    from jaxloader.workers import failures

    pool = WorkerPool(BatchMaker(source(), Sampler(61, 6, shuffle=False, seed=0,
                                                   last_batch="drop")), num_workers=2)
    try:
        assert len(list(pool.batches(0, 4))) == 4
        said = str(failures.died(1, 123, -9, pool._board, lambda step: f"step {step}"))
        assert "died while idle: killed by signal 9" in said, said
    finally:
        pool.close()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="a worker's end is seen by pidfd")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork")
def test_a_dead_worker_is_reported_while_another_process_holds_its_pipe():
    # a death was seen only by its pipe's EOF, which never came while another process held a
    # copy of the worker's end (a fork of a transform, or a worker of another loader forked
    # while this one started): the training process waited for good
    def fork_once(r):
        child = 0
        if int(r["y"]) == 0:
            child = os.fork()
            if child == 0:  # (a child that holds every descriptor of the worker)
                time.sleep(30)
                os._exit(0)
        if int(r["y"]) == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"y": r["y"], "child": np.int64(child)}

    loader = jl.DataLoader(source(), batch_size=6, transforms=[jl.Map(fork_once)],
                           num_workers=1, process_index=0, process_count=1)
    got: list = []

    def run():
        try:
            for batch in loader:
                got.extend(batch["child"][batch["child"] > 0].tolist())
        except jl.WorkerError as e:
            got.append(str(e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(15)
    for pid in got[:-1]:
        os.kill(pid, signal.SIGKILL)
    loader.close()
    assert len(got) == 2 and "killed by signal 9" in got[1] and "step 3" in got[1], got


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="a worker's end is seen by pidfd")
def test_broken_and_closed_pools_leave_no_descriptor_behind():
    # a worker's pidfd was closed only by a let_go() that found it running: a worker that
    # raised or died, or one killed by a close() from another thread, left its pidfd open
    def fail(r):
        os._exit(3)  # (its exit code known: let_go() had nothing to do)

    def run(n):
        for _ in range(n):
            loader = jl.DataLoader(source(), batch_size=6, transforms=[jl.Map(fail)],
                                   num_workers=2, process_index=0, process_count=1)
            with pytest.raises(jl.WorkerError):
                list(loader)
            loader.close()

    run(1)  # (the worker starter's own descriptors, opened once)
    before = len(os.listdir("/proc/self/fd"))
    run(4)
    assert len(os.listdir("/proc/self/fd")) == before


_NEVER_ENDING = textwrap.dedent("""
    import os, sys, threading, time
    import numpy as np
    import jaxloader as jl
    from jaxloader.workers import endings, process

    process.LEAVE_S = endings.LEAVE_S = 0.5  # (5 s by default)

    def init(worker_id):  # a thread of the user's, non-daemon (threading's default)
        threading.Thread(target=lambda: [time.sleep(0.1) for _ in iter(int, 1)]).start()

    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(16)}), batch_size=4, num_workers=2,
                           worker_init_fn=init, start_method=sys.argv[1], process_index=0,
                           process_count=1)
    assert len(list(loader)) == 4
    pids, begun = loader.worker_pids, time.monotonic()
    loader.close()
    took = time.monotonic() - begun
    time.sleep(0.5)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}") and
             open(f"/proc/{p}/stat").read().split()[2] != "Z"]
    print(f"closed in {took:.1f} s, alive {alive}")
""")


@pytest.mark.parametrize("start_method", ["exec", "fork"])
def test_a_worker_kept_alive_by_a_thread_that_never_ends_is_killed_at_close_and_said(
        start_method):
    # close() waited for a forked one for good (os.waitpid), and left one started by "exec"
    # running, its slots mapped, for the process's life, without a word
    done = subprocess.run([sys.executable, "-c", _NEVER_ENDING, start_method],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    took = float(re.search(r"closed in ([\d.]+) s", done.stdout).group(1))
    assert "alive []" in done.stdout and took < 5, done.stdout
    assert re.search(r"worker process \d+ still ran 0 s after it was asked to stop .*killed; "
                     r"make such a thread daemon=True", done.stderr), done.stderr[-2000:]


def test_a_worker_killed_at_close_takes_the_programs_its_transform_runs(tmp_path):
    # a worker is a process group of its own: a close() that kills it (busy past its grace)
    # left a program its transform had started running on, orphaned, in the background
    started = tmp_path / "child"

    def run_child(r):
        import subprocess

        child = subprocess.Popen(["sleep", "60"])
        started.write_text(str(child.pid))
        time.sleep(60)
        return r

    loader = jl.DataLoader(source(), batch_size=1, transforms=[jl.Map(run_child)],
                           num_workers=1, process_index=0, process_count=1)
    it = iter(loader)

    def wait() -> None:
        try:
            next(it)
        except jl.JaxloaderError:  # (closed meanwhile)
            pass

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not started.exists() or not started.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(started.read_text())
    loader.close()

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 5
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    ended = gone()
    if not ended:
        os.kill(pid, signal.SIGKILL)
    assert ended


@pytest.mark.skipif(not starter.AVAILABLE, reason="the worker starter is Linux's")
def test_workers_started_before_one_that_cannot_start_are_stopped_and_reaped(monkeypatch):
    real, started = starter.Starter.start, []

    def start(self, *args):
        if len(started) == 2:
            raise OSError("the worker starter could not fork a worker: [Errno 11] (a test)")
        started.append(real(self, *args))
        return started[-1]
    monkeypatch.setattr(starter.Starter, "start", start)
    with pytest.raises(OSError, match="could not fork"):
        make(3)()
    assert len(started) == 2 and not [pid for pid in started if os.path.exists(f"/proc/{pid}")]


def test_a_forked_workers_end_is_waited_for_not_looked_at_once():
    # after its pipe's EOF a worker may not be reaped yet: one look said "exit code None"
    import subprocess

    from jaxloader.workers.process import WorkerProcess

    child = subprocess.Popen(["sh", "-c", "sleep 0.3; exit 3"])
    worker = object.__new__(WorkerProcess)
    worker._exitcode, worker._starter, worker._popen, worker._asked = None, None, None, False
    worker.pid = worker._fork_pid = child.pid
    assert worker.exitcode(timeout=0.0) is None
    assert worker.exitcode(timeout=10.0) == 3
    child.returncode = 3  # (reaped above)


def test_worker_info_is_set_before_the_source_is_unpickled():
    class Source:
        loaded_in = -2  # (the training process's)

        def __init__(self):
            self.size = 4  # (a state: pickle calls __setstate__ only with one)

        def __len__(self):
            return self.size

        def __getitem__(self, i):
            return {"x": np.int64(i), "id_when_loaded": np.int64(self.loaded_in)}

        def __setstate__(self, state):
            info = jl.get_worker_info()
            self.__dict__.update(state, loaded_in=-1 if info is None else info.id)

    with jl.DataLoader(Source(), batch_size=2, num_workers=2, process_index=0,
                       process_count=1) as loader:
        assert sorted(b["id_when_loaded"][0] for b in loader) == [0, 1]


def test_a_transform_that_calls_sys_exit_is_a_failure_with_its_traceback():
    # the worker took it for its own stop: "died ... exit code 0; check memory use"
    def leave(r):
        if int(r["y"]) == 20:
            sys.exit(3)
        return r

    with jl.DataLoader(source(), batch_size=6, transforms=[jl.Map(leave)], num_workers=1,
                       process_index=0, process_count=1) as loader:
        with pytest.raises(jl.WorkerError, match=r"raised at step 3 .*SystemExit: 3(.|\n)*"
                                                 r"in leave"):
            list(loader)


def test_an_unpicklable_transform_is_named_at_construction():
    lock = threading.Lock()

    def uses_lock(r):
        with lock:
            return r

    big = jl.ArraySource({"x": np.zeros((64, 1 << 15), np.float32)})  # 8 MiB: shared, probed
    for src in (source(), big):  # the fixture checks that the probes' segments are gone
        with pytest.raises(jl.WorkerError, match=r"transform Map\(.*uses_lock.*lock"):
            jl.DataLoader(src, batch_size=6, transforms=[jl.Map(uses_lock)], num_workers=2,
                          process_index=0, process_count=1)


def test_a_handle_the_training_process_opened_lazily_is_told_of_getstate():
    # A handle opened lazily in __getitem__ (as the PyTorch guide advises) is opened in the
    # training process too, by state_dict()'s reads: the next loader over the source could not
    # send it, and its remedy was to open the handle lazily, which the user had done.
    class Rows:
        def __init__(self) -> None:
            self.handle = None

        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int):
            self.handle = self.handle or threading.Lock()  # (opened lazily: a file, say)
            return {"x": np.int64(i)}

    rows = Rows()
    with jl.DataLoader(rows, batch_size=4, num_workers=2) as loader:
        next(iter(loader))
        loader.state_dict()
    with pytest.raises(jl.WorkerError, match=r"cannot send the source .*lock.*leave out in "
                       r"__getstate__ one the training process opened: .*state_dict\(\)"):
        jl.DataLoader(rows, batch_size=4, num_workers=2)


def test_worker_info_and_init_fn():
    def tag(r):
        info = jl.get_worker_info()
        return {"worker": np.int64(info.id), "count": np.int64(info.num_workers),
                "inited": np.int64(os.environ.get("JAXLOADER_TEST_INIT", "-1")),
                "jax": np.bool_("jax" in sys.modules)}

    def init(worker_id):
        os.environ["JAXLOADER_TEST_INIT"] = str(worker_id)

    with jl.DataLoader(source(), batch_size=3, transforms=[jl.Map(tag)], num_workers=2,
                       worker_init_fn=init, process_index=0, process_count=1) as loader:
        batches = list(loader)
    workers = np.concatenate([b["worker"] for b in batches])
    assert set(workers.tolist()) == {0, 1}
    assert all((b["count"] == 2).all() for b in batches)
    assert all((b["inited"] == b["worker"]).all() for b in batches)
    assert not any(b["jax"].any() for b in batches)  # workers stay light: no JAX
    assert jl.get_worker_info() is None


def _fails_in_worker_1(worker_id):
    if worker_id == 1:
        raise RuntimeError("init failed in worker 1")


def test_a_worker_init_fn_that_raised_is_reported_when_a_task_finds_its_worker_gone():
    # worker 1 reported its failure and ended; a task sent to it then met a closed pipe, and
    # the failure left unread in it was dropped: "died while starting: exit code 0; check
    # memory use and native code" (1 run in 3 with the race; always once it has ended)
    maker = BatchMaker(source(), Sampler(61, 6, shuffle=True, seed=5, last_batch="drop"), ())
    pool = WorkerPool(maker, 2, worker_init_fn=_fails_in_worker_1)
    try:
        it = pool.batches(0, None)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and running(pool.pids[1]):
            time.sleep(0.05)
        with pytest.raises(jl.WorkerError, match=r"worker 1 \(pid \d+\) raised while starting "
                                                 r".*RuntimeError: init failed in worker 1"):
            next(it)
    finally:
        pool.close()


def test_worker_info_dataset_names_what_to_do():
    # PyTorch's get_worker_info().dataset was a bare "'WorkerInfo' object has no attribute"
    def uses_dataset(r):
        return jl.get_worker_info().dataset

    with jl.DataLoader(source(), batch_size=3, transforms=[jl.Map(uses_dataset)],
                       num_workers=1, process_index=0, process_count=1) as loader:
        with pytest.raises(jl.WorkerError, match=r"WorkerInfo has no dataset \(PyTorch's "
                                                 r"get_worker_info\(\).dataset\): open .* lazily"):
            next(iter(loader))


def test_bad_worker_arguments():
    with pytest.raises(jl.ConfigError, match="prefetch"):
        make(1, prefetch=0)()
    with pytest.raises(jl.ConfigError, match="start_method.*'spawn'"):
        make(1, start_method="spawn")()


def _run_script(tmp_path, body: str, **popen) -> subprocess.Popen:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, **popen)


def _wait_gone(pids, names, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if running(p)]
        left = still_held(names)
        if not alive and not left:
            return [], []
        time.sleep(0.05)
    return alive, left


SCRIPT_HEAD = f"\n    PROBE_DIR = {os.path.dirname(os.path.abspath(__file__))!r}" + """
    import os, sys, time
    import numpy as np
    import jaxloader as jl
    open("side_effects.txt", "a").write("main script ran\\n")   # unguarded top level
    src = jl.ArraySource({"x": np.zeros((4000, 300), np.float32), "y": np.arange(4000)})
    loader = jl.DataLoader(src, batch_size=8, num_workers=2, num_epochs=None,
                           transforms=[jl.Map(lambda r: r)], process_index=0, process_count=1)
    it = iter(loader)
    next(it)
    sys.path.insert(0, PROBE_DIR)
    from shm_probe import held_segments
    print(" ".join(map(str, loader.worker_pids)), "|", " ".join(held_segments()), flush=True)
"""


def test_killed_main_process_leaves_no_workers_and_no_segments(tmp_path):
    proc = _run_script(tmp_path, SCRIPT_HEAD + "    time.sleep(60)\n")
    pids_part, names_part = proc.stdout.readline().split("|")
    pids = [int(p) for p in pids_part.split()]
    names = names_part.split()
    assert len(pids) == 2 and names
    proc.kill()
    proc.wait()
    alive, left = _wait_gone(pids, names)
    assert not alive, f"workers outlived their parent: {alive}"
    assert not left, f"shared memory still held after the kill: {left}"
    assert (tmp_path / "side_effects.txt").read_text().count("ran") == 1  # never re-run


def test_a_forked_child_is_refused_the_loader_and_the_parent_loses_nothing(tmp_path):
    # The child read the parent's workers' messages and sent tasks down their pipes: it got a
    # batch, and the parent a bare KeyError, or a hang when both iterated
    proc = _run_script(tmp_path, """
        import os, numpy as np, jaxloader as jl
        src = jl.ArraySource({"x": np.arange(4000)})
        want = [b["x"].tolist() for b in jl.DataLoader(src, batch_size=8, shuffle=True)]
        with jl.DataLoader(src, batch_size=8, shuffle=True, num_workers=2) as loader:
            it = iter(loader)
            got = [next(it)["x"].tolist() for _ in range(3)]
            codes = []
            for fresh in (False, True):  # the parent's iterator, or an iter() of its own
                pid = os.fork()
                if pid == 0:
                    try:
                        next(iter(loader) if fresh else it)
                        os._exit(3)
                    except jl.JaxloaderError as e:
                        os._exit(7 if "belong to process" in str(e) else 4)
                codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
                got.append(next(it)["x"].tolist())
            got += [b["x"].tolist() for b in it]
        print(*codes, got == want)
    """)
    out, err = proc.communicate(timeout=60)
    assert out.split() == ["7", "7", "True"], err


def _logged(folder):
    def slow(r):  # a 5 ms transform that counts, in a file a worker, the records it made
        time.sleep(0.005)
        with open(os.path.join(folder, str(os.getpid())), "a") as f:
            f.write("x")
        return r
    return slow


def test_a_new_run_does_not_wait_behind_the_steps_of_the_one_before(tmp_path):
    # A restore (so an iter() after a break, or a Ctrl-C) left the workers making every step
    # they had been sent for the run before (tasks of 16 steps, 64 steps ahead a worker): the
    # next batch came after ~1,000 records nobody wanted (5 s here), not after a step's.
    def made():
        return sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))

    with jl.DataLoader(jl.ArraySource({"x": np.arange(4000)}), batch_size=8, num_workers=2,
                       transforms=[jl.Map(_logged(str(tmp_path)))], process_index=0,
                       process_count=1) as loader:
        it = iter(loader)
        want = [next(it)["x"].tolist() for _ in range(3)]
        state = loader.state_dict()
        loader.load_state_dict({**state, "step": 1})
        before = made()
        assert next(iter(loader))["x"].tolist() == want[1]
        assert made() - before < 200  # a step or two a worker, the new run's first steps


def test_close_from_another_thread_while_one_iterates_names_the_close(tmp_path):
    # close() raised "ValueError: generator already executing", and the iterating thread was
    # told its workers were killed by SIGKILL, "often the out-of-memory killer"
    import threading

    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(4000)}), batch_size=16,
                           num_workers=2, num_epochs=None, process_index=0, process_count=1,
                           transforms=[jl.Map(_logged(str(tmp_path)))])
    raised: list = []

    def consume():
        try:
            for _ in loader:
                pass
        except BaseException as e:  # noqa: BLE001 - what the thread saw is the test
            raised.append(e)

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(0.3)
    loader.close()
    thread.join(10)
    assert not thread.is_alive() and len(raised) == 1
    # (waiting for a batch: "the loader was closed ..."; between two: "DataLoader is closed")
    assert type(raised[0]) is jl.JaxloaderError and "closed" in str(raised[0])


def test_a_ctrl_c_while_the_pool_is_made_leaves_no_worker(monkeypatch):
    # Interrupted as the payload was made (a large source copied), the pool closed itself on an
    # Exception only: the workers lived on while the traceback (a notebook's last one) held it
    from conftest import live_children
    from jaxloader.workers import payload

    before = {pid for pid, _ in live_children()}

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(payload, "dumps", interrupted)
    with pytest.raises(KeyboardInterrupt) as held:  # (kept, as sys.last_traceback keeps it)
        make_pool(2)
    deadline = time.monotonic() + 5
    while [pid for pid, _ in live_children() if pid not in before] and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid, _ in live_children() if pid not in before]
    assert held.value is not None


def test_a_low_descriptor_limit_holds_fewer_slots_not_a_failure(tmp_path):
    # With 64 descriptors a loader of small batches failed at its first batches, even with one
    # worker and prefetch=1: its slots in flight (up to 256) did not depend on the limit
    proc = _run_script(tmp_path, """
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        import numpy as np, jaxloader as jl
        src = jl.ArraySource({"x": np.arange(8000)})
        want = [b["x"].tolist() for b in jl.DataLoader(src, batch_size=8, shuffle=True)]
        with jl.DataLoader(src, batch_size=8, shuffle=True, num_workers=2) as loader:
            print([b["x"].tolist() for b in loader] == want)
    """)
    out, err = proc.communicate(timeout=120)
    assert out.split() == ["True"], err[-2000:]


def test_batches_kept_past_the_descriptor_limit_hold_none(tmp_path):
    # a batch kept (list(loader)) keeps its slot, unlinked: before Python 3.13 its mapping
    # still held a descriptor (mmap's own), and 857 kept batches filled a limit of 1,024 on
    # Python 3.11 (the workers audit); here 400 under 256
    proc = _run_script(tmp_path, """
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        import numpy as np, jaxloader as jl
        src = jl.ArraySource({"x": np.arange(1600 * 20_000, dtype=np.uint8).reshape(1600, -1)})
        with jl.DataLoader(src, batch_size=4, num_workers=2) as loader:
            kept = list(loader)
        print(len(kept), all((b["x"] == src[4 * i: 4 * i + 4]["x"]).all()
                             for i, b in enumerate(kept)))
    """)
    out, err = proc.communicate(timeout=120)
    assert out.split() == ["400", "True"], err[-2000:]


def test_loaders_alive_at_once_share_the_descriptor_table(tmp_path):
    # each loader took a quarter of the table whatever the others held: under 1,024, the
    # fourth task loader of a multi-task loop (the seventh on Python 3.13) ran out of
    # descriptors, before the warning of many loaders open (the multi-task audit)
    proc = _run_script(tmp_path, """
        import resource, warnings
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))
        import numpy as np, jaxloader as jl
        warnings.simplefilter("ignore")  # (6 loaders open: said)
        loaders = [jl.DataLoader(jl.ArraySource({"x": np.arange(4000) + 10_000 * t}),
                                 batch_size=8, shuffle=True, seed=t, num_epochs=None,
                                 num_workers=2) for t in range(8)]
        steps = [iter(loader) for loader in loaders]
        for _ in range(40):
            for t, it in enumerate(steps):
                assert (next(it)["x"] // 10_000 == t).all()
        for loader in loaders:
            loader.close()
        print("ok")
    """)
    out, err = proc.communicate(timeout=120)
    assert out.split() == ["ok"], err[-2000:]


def test_ctrl_c_shuts_down_cleanly(tmp_path):
    proc = _run_script(tmp_path, SCRIPT_HEAD + """
    while True:
        next(it)
    """)
    try:
        pids_part, names_part = proc.stdout.readline().split("|")
        pids, names = [int(p) for p in pids_part.split()], names_part.split()
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"Ctrl-C did not stop the loop within 20 s; its stderr:\n{err[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in err and "Exception ignored" not in err, err[-3000:]
    alive, left = _wait_gone(pids, names, seconds=2.0)
    assert not alive and not left, (alive, left, err)
    assert "leaked shared_memory" not in err  # we unlinked them, not the resource tracker


def test_a_message_lost_to_an_interrupt_restarts_the_workers_and_loses_no_batch(monkeypatch):
    with make(0)() as ref_loader:  # more than the interrupted run can have made: the
        reference = [b["x"].copy() for b in take(ref_loader, 250)]  # pool's 2 x 64 steps ahead
    pool = make_pool(2)
    try:
        it = pool.batches(0, None)
        old_pids = pool.pids
        got = [next(it)["x"].copy() for _ in range(3)]
        real_receive = pool._receive

        def cut(run, ready, block=True, awaited=None):  # reads a worker's report and drops
            # it, as a Ctrl-C mid-recv would
            monkeypatch.setattr(pool, "_receive", real_receive)
            wait([w.conn for w in pool._workers])[0].recv()
            raise KeyboardInterrupt

        monkeypatch.setattr(pool, "_receive", cut)
        with pytest.raises(KeyboardInterrupt):
            while True:
                got.append(next(it)["x"].copy())
        it = pool.batches(len(got), None)  # what the loader's next next() does: the same step
        # (10 batches more, however many came before the cut: with tasks of 16 steps, the
        # batches ready before it may already be more than a fixed count)
        for _ in range(10):
            got.append(next(it)["x"].copy())
        # Without a restart the dropped report's in-flight place would be lost for good (and a
        # report cut in half would leave the pipe unreadable): fresh workers took over.
        assert pool.restarts == 1 and not set(pool.pids) & set(old_pids)
    finally:
        pool.close()
    assert len(got) <= len(reference)
    for step, (a, b) in enumerate(zip(got, reference)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


def test_workers_started_again_after_an_interrupt_keep_the_count_in_use():
    # the restart looked for the pool's "_roster", which it never had: it started the count the
    # pool began with, all in use, where num_workers="auto" had parked some
    pool = make_pool(3)
    try:
        pool.roster.resize(1)
        it = pool.batches(0, None)
        first = [next(it)["x"].copy() for _ in range(3)]
        it.close()
        pool._mixed_up = True  # (what an interrupt outside the wait leaves)
        again = pool.batches(0, None)
        assert [next(again)["x"].tolist() for _ in range(3)] == [b.tolist() for b in first]
        assert pool.restarts == 1 and len(pool.pids) == 3 and pool.active == 1
    finally:
        pool.close()


class SleepyRows:
    """Records whose read waits 2 ms (storage): workers busy without a core each."""

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.002)
        return {"x": np.full(4, i, np.int64)}


def test_workers_autotune_adds_share_the_work_of_one_with_a_backlog():
    # blocks of tasks went to every worker alike once each had room: the first one's backlog
    # of tasks ahead (made alone) stayed, and the workers started beside it were given a task
    # only as it made room, busy half their time (autotune's 8 workers made 50 batches a
    # second where 8 from the start made 97; the diagnosis audit)
    from jaxloader.workers.roster import Roster

    maker = BatchMaker(SleepyRows(), Sampler(10_000, 4, shuffle=False, seed=0,
                                             last_batch="drop"))
    pool = WorkerPool(maker, 1, max_workers=4)
    strides, submit = [], pool._submit  # (each task's block: its stride, the workers in it)

    def recorded(w, first, count, stride, run, reset):
        strides.append(stride)
        return submit(w, first, count, stride, run, reset)

    pool._submit = recorded
    try:
        batches = pool.batches(0, None)
        for _ in range(150):  # (its tasks ahead: a backlog once others start)
            next(batches)
        pool.roster.resize(4)
        del strides[:]
        for _ in range(300):
            next(batches)
    finally:
        pool.close()
    assert pool.roster.active == 4 and 4 in strides, strides
    behind = strides.index(4)  # (the first blocks after it: for the 3 workers behind alone,
    assert behind > 0 and set(strides[:behind]) <= {1, 2, 3}, strides  # then for all 4)
    roster = Roster.__new__(Roster)  # (its choice alone: no workers)
    roster.active, roster.in_flight, roster._catching_up = 4, [12, 0, 1, 3], True
    assert roster.takers(12) == [1, 2] and roster.takers(12, balance=False) == []
    roster.in_flight = [3, 4, 4, 3]  # (one task apart: a block for all, once all have room;
    assert roster.takers(4) == [] and roster.takers(5) == [0, 1, 2, 3]  # caught up for good)
    roster.in_flight = [4, 0, 4, 4]  # (a pool of small batches: tasks come back apart)
    assert roster.takers(4) == []


def test_workers_asked_for_but_not_yet_started_are_started_by_a_restart():
    # resize() asks for 3; apply() starts the third at the next submission; an interrupt in
    # between restarted 2 workers with 3 in use: a bare IndexError at every later call
    maker = BatchMaker(source(), Sampler(61, 6, shuffle=True, seed=5, last_batch="drop"),
                       (jl.RandomMap(jitter),))
    pool = WorkerPool(maker, 2, max_workers=3)
    try:
        it = pool.batches(0, None)
        first = [next(it)["x"].copy() for _ in range(2)]
        pool.roster.resize(3)
        it.close()
        pool._mixed_up = True
        again = pool.batches(0, None)
        assert [next(again)["x"].tolist() for _ in range(2)] == [b.tolist() for b in first]
        assert len(pool.pids) == 3 and pool.active == 3
    finally:
        pool.close()


def test_an_interrupted_close_still_stops_every_worker_and_unlinks_every_segment(monkeypatch):
    from jaxloader.workers.process import WorkerProcess

    pool = make_pool(3)
    it = pool.batches(0, None)
    next(it)
    pids = pool.pids
    names = held_segments()
    assert names
    real_let_go, calls = WorkerProcess.let_go, []

    def let_go(self, *deadline):
        calls.append(pids.index(self.pid))
        if calls == [0]:
            real_let_go(self, *deadline)
            raise KeyboardInterrupt  # a Ctrl-C during the first worker's drain
        return real_let_go(self, *deadline)

    monkeypatch.setattr(WorkerProcess, "let_go", let_go)
    with pytest.raises(KeyboardInterrupt):
        pool.close()
    assert calls == [0, 1, 2]  # the other workers were still stopped
    import gc

    gc.collect()  # (a view of a slot in a reference cycle holds its file until collected)
    alive, left = _wait_gone(pids, names, seconds=2.0)
    assert not alive and not left, (alive, left)
    pool.close()  # idempotent after an interrupted close (it runs its steps again, at no cost)
    assert pool.segment_count == 0


@pytest.mark.parametrize("line", [1, 2])
def test_a_close_interrupted_before_its_steps_began_is_finished_by_the_next(line):
    """A Ctrl-C as the shutdown starts (its first lines, before any step) runs no step; the
    next close() runs them all. The shutdown used to run as a finalizer, which runs once: the
    second close() did nothing, and the workers lived on until the pool was collected."""
    from jaxloader.workers import endings as process_module
    from line_interrupts import raised_at_line

    before = set(held_segments())  # (another test's on this process: not this pool's)
    pool = make_pool(2)
    try:
        it = pool.batches(0, None)
        next(it)
        next(it)  # (step 1 is worker 1's: each worker has loaded its payload; one still
        # loading fails to open the memory the interrupted close() releases, and exits)
        pids, names = pool.pids, [n for n in held_segments() if n not in before]
        assert raised_at_line(line, [process_module.stop_all], pool.close)
        assert all(running(p) for p in pids)  # nothing was stopped yet
    finally:
        pool.close()
    alive, left = _wait_gone(pids, names, seconds=5.0)
    assert not alive and not left, (alive, left)
    assert pool.segment_count == 0


def test_a_pool_whose_start_is_refused_leaves_no_memory_file_while_its_error_is_kept():
    # a notebook (and pytest) keeps an error's frames, and the pool in them: a start refused
    # (start_method="fork" beside JAX) kept its status board and stack files open until the
    # next error replaced it (the augmentation audit's test found it)
    import jax  # (fork is refused in a process that imported it)

    assert jax.__name__ == "jax"
    before = held_segments()
    maker = BatchMaker(source(), Sampler(61, 6, shuffle=True, seed=5, last_batch="drop"))
    with pytest.raises(jl.ConfigError, match="start_method='fork': JAX is imported") as kept:
        WorkerPool(maker, 2, start_method="fork")
    assert held_segments() == before, kept  # (the error, and its frames, still held here)


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def test_an_in_memory_source_is_shared_not_copied_into_workers():
    n = 256  # 256 records of 1 MiB: a 256 MiB source
    arrays = {"x": np.ones((n, 1 << 20), np.uint8), "y": np.arange(n)}
    with jl.DataLoader(jl.ArraySource(arrays), batch_size=8, transforms=[jl.Map(lambda r: r)],
                       num_workers=2, process_index=0, process_count=1) as loader:
        assert sum(int(b["x"][:, 0].sum()) for b in loader) == n  # every record read
        for pid in loader.worker_pids:
            private_mib = _status_kib(pid, "RssAnon") / 1024
            shared_mib = _status_kib(pid, "RssShmem") / 1024
            assert private_mib < 128, f"worker {pid} holds {private_mib:.0f} MiB privately"
            assert shared_mib > 64, f"worker {pid} maps only {shared_mib:.0f} MiB shared"


def test_fork_is_refused_once_jax_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", sys.modules.get("jax", object()))
    with pytest.raises(jl.ConfigError, match="fork.*JAX is imported.*'exec'"):
        make(2, start_method="fork")()


def test_fork_start_method_gives_the_same_stream(tmp_path):
    proc = _run_script(tmp_path, """
    import numpy as np, jaxloader as jl, sys
    assert "jax" not in sys.modules
    src = jl.ArraySource({"x": np.arange(50.0), "y": np.arange(50)})
    def noise(r, rng):
        return {"x": r["x"] + rng.random(), "y": r["y"]}
    def run(**kw):
        with jl.DataLoader(src, batch_size=4, shuffle=True, transforms=[jl.RandomMap(noise)],
                           process_index=0, process_count=1, num_epochs=2, **kw) as dl:
            return [b["x"].copy() for b in dl]
    a, b = run(num_workers=2, start_method="fork"), run(num_workers=0)
    print(len(a), all(np.array_equal(x, y) for x, y in zip(a, b)))
    """)
    out, err = proc.communicate(timeout=60)
    assert out.split() == ["24", "True"], err


def test_auto_workers_forked_keep_their_count_once_jax_is_imported(tmp_path):
    # the tuner grew the workers by forking after a notebook's next cell imported JAX: the
    # refusal (a ConfigError) broke the loader mid-training, at every call after
    proc = _run_script(tmp_path, """
    import sys, types, numpy as np, jaxloader as jl
    with jl.DataLoader(jl.ArraySource({"x": np.arange(400)}), batch_size=4, num_epochs=None,
                       num_workers="auto", start_method="fork", process_index=0,
                       process_count=1) as loader:
        it = iter(loader)
        next(it)
        sys.modules["jax"] = types.ModuleType("jax")  # (as a cell that imports it; no runtime)
        loader._engine.roster.resize(3)  # what the tuner asks for
        steps = [int(next(it)["x"][0]) // 4 for _ in range(20)]
        print(steps == list(range(1, 21)), loader.num_workers)
    """)
    out, err = proc.communicate(timeout=60)
    assert out.split() == ["True", "1"], err
    assert "keeps 1 worker process(es): start_method='fork' starts no more" in err


def test_a_loader_left_to_jax_for_its_place_does_not_import_it_so_fork_stays_open(tmp_path):
    # it imported JAX to ask for the process count, after which fork was refused
    proc = _run_script(tmp_path, """
    import numpy as np, jaxloader as jl, sys
    src = jl.ArraySource({"x": np.arange(20)})
    with jl.DataLoader(src, batch_size=4, num_workers=1, start_method="fork") as dl:
        print(dl.process_index, dl.process_count, len(list(dl)), "jax" in sys.modules)
    dl = jl.DataLoader(src, batch_size=4)
    state = dl.state_dict()
    import jax
    jax.process_index, jax.process_count = (lambda: 1), (lambda: 2)  # as after distributed init
    for call in (lambda: iter(dl), dl.peek, lambda: dl.load_state_dict(state)):
        try:
            call()
        except jl.ConfigError as e:
            print(e)
    """)
    out, err = proc.communicate(timeout=60)
    lines = out.splitlines()
    assert lines[0] == "0 1 5 False", err
    assert len(lines) == 4, out + err  # iter(), peek() and load_state_dict() each refuse
    for line in lines[1:]:
        assert line.startswith("process_index/process_count: the loader was made before JAX "
                               "was imported or started") and "process 1 of 2" in line and \
            "after jax.distributed.initialize()" in line, out + err


def test_a_loader_made_after_import_jax_leaves_jax_distributed_initialize_possible(tmp_path):
    # it asked JAX for the process's place, which started JAX's runtime: the initialize after
    # it failed ("must be called before any JAX calls that might initialise the XLA backend")
    proc = _run_script(tmp_path, """
    import socket, numpy as np, jax, jaxloader as jl
    dl = jl.DataLoader(jl.ArraySource({"x": np.arange(20)}), batch_size=4)
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    jax.distributed.initialize(f"localhost:{port}", num_processes=1, process_id=0)
    print(dl.process_index, dl.process_count, len(list(dl)))
    jax.distributed.shutdown()
    """)
    out, err = proc.communicate(timeout=120)
    assert out.split() == ["0", "1", "5"], err[-2000:]


def test_a_worker_error_surfaces_at_its_own_step_after_the_earlier_batches():
    import time as _time

    def slow_then_bad(r):
        y = int(r["y"])
        if y < 6:
            _time.sleep(0.05)  # step 0 is slow, so step 1's failure arrives first
        if y == 6:
            raise ValueError("step one fails")
        return r

    with jl.DataLoader(source(), batch_size=6, transforms=[jl.Map(slow_then_bad)],
                       num_workers=2, process_index=0, process_count=1) as loader:
        it = iter(loader)
        assert next(it)["y"].tolist() == [0, 1, 2, 3, 4, 5]
        with pytest.raises(jl.WorkerError, match="at step 1"):
            next(it)


def _slow_from(first_slow: int, seconds: float):
    def slow(record):
        if record["y"] >= first_slow:
            time.sleep(seconds)
        return record
    return slow


def test_close_while_the_prefetch_thread_waits_on_a_slow_worker_never_shares_the_pipes(
        monkeypatch):
    """close() must not read the worker pipes (or touch the ring) from the main thread while the
    device-prefetch thread still drives the pool: it used to, once the join timed out."""
    import jax

    from jaxloader.sharding import prefetch
    from jaxloader.workers import pool, process

    monkeypatch.setattr(prefetch, "_JOIN_TIMEOUT_S", 0.2)  # the thread outlives close()'s wait
    spans: list[tuple[int, float, float]] = []  # (thread, entered, left) of every pipe reader

    def spied(fn):
        def reader(*args, **kwargs):
            entered = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                spans.append((threading.get_ident(), entered, time.monotonic()))
        return reader

    monkeypatch.setattr(pool.WorkerPool, "_receive", spied(pool.WorkerPool._receive))
    monkeypatch.setattr(process.WorkerProcess, "_wait_for_eof",
                        spied(process.WorkerProcess._wait_for_eof))
    src = jl.ArraySource({"x": np.zeros((64, 3), np.float32), "y": np.arange(64)})
    loader = jl.DataLoader(src, batch_size=4, num_workers=1, num_epochs=None,
                           transforms=[jl.Map(_slow_from(4, 30.0))], process_index=0,
                           process_count=1, device_prefetch=1,
                           sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    it = iter(loader)
    assert np.asarray(next(it)["y"]).tolist() == [0, 1, 2, 3]
    time.sleep(0.3)  # the thread now waits in poll() for step 1, which takes 4 x 30 s
    pids = loader.worker_pids
    started = time.monotonic()
    loader.close()  # no error
    assert time.monotonic() - started < 15, "close() waited for the slow record"
    alive, _ = _wait_gone(pids, [], seconds=5.0)
    assert not alive
    assert any(t != threading.get_ident() for t, _, _ in spans), spans  # the thread received
    for a in spans:
        for b in spans:
            if a[0] != b[0]:
                assert a[2] <= b[1] or b[2] <= a[1], f"two threads read the pipes at once: {a} {b}"


def test_a_task_of_several_steps_fails_at_its_own_step_after_the_batches_before_it():
    # small batches go 16 steps a task: a record that raises in the middle of one (step 21 is
    # not the first of worker 1's task) comes after every batch before it, the batches the
    # task made before it included
    def bad_at(r):
        if int(r["y"]) == 21 * 2:
            raise ValueError("record 42")
        return r

    def loader(num_workers=2):
        return jl.DataLoader(source(200), batch_size=2, transforms=[jl.Map(bad_at)],
                             num_workers=num_workers, process_index=0, process_count=1)

    with loader(0) as reference:
        want = [b["y"].tolist() for b in take(reference, 21)]
    pool_steps = []
    with loader() as pooled:
        assert steps_per_task(pooled._engine._ring.slot_size, streaming=False) == 1  # no slot
        it = iter(pooled)
        got = [next(it)["y"].tolist() for _ in range(21)]
        pool_steps.append(steps_per_task(pooled._engine._ring.slot_size, streaming=False))
        with pytest.raises(jl.WorkerError, match=r"worker 1 .* at step 21 .*record 42"):
            next(it)
        with pytest.raises(jl.WorkerError, match="at step 21"):
            next(it)  # broken is a state
    assert got == want and pool_steps == [16]


# -- closing does not wait for batches nobody wants --------------------------------------------
def _slow(record):
    if int(record["x"]) >= 8:  # the first batch is quick; every later one sleeps 5 s a record
        time.sleep(5)
    return record


def _busy(prefetch):
    """A loader whose workers are both inside a 5 s transform, its first batch taken."""
    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(200)}), batch_size=8, num_workers=2,
                           transforms=[jl.Map(_slow)], prefetch=prefetch, process_index=0,
                           process_count=1)
    it = iter(loader)
    next(it)
    return loader, it


@pytest.mark.parametrize("prefetch", [2, 4])
def test_close_does_not_wait_for_batches_in_flight(prefetch):
    loader, _ = _busy(prefetch)
    pids = loader.worker_pids
    start = time.monotonic()
    loader.close()
    assert time.monotonic() - start < 1.0
    assert not [p for p in pids if running(p)]


def test_a_loader_dropped_while_its_workers_are_busy_ends_them_at_once():
    loader, it = _busy(2)  # (as after a `break` out of its loop)
    pids = loader.worker_pids
    start = time.monotonic()
    del loader, it
    alive, _ = _wait_gone(pids, [], seconds=1.0)
    assert not alive and time.monotonic() - start < 1.0


def test_a_training_script_interrupted_by_ctrl_c_exits_at_once():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "interrupt_exit_run.py")
    run = subprocess.Popen([sys.executable, script, "4"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert run.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # in next(), waiting on the workers' 5 s records
        start = time.monotonic()
        run.send_signal(signal.SIGINT)
        run.wait(timeout=10)
        assert time.monotonic() - start < 1.5, "exit waited for the workers' batches"
        assert "KeyboardInterrupt" in run.stderr.read()
    finally:
        run.kill()
        run.wait()


def test_a_loader_made_in_a_worker_makes_its_batches_there_with_a_warning(monkeypatch):
    from jaxloader.runtime import worker_info

    monkeypatch.setattr(worker_info, "_INFO", worker_info.WorkerInfo(1, 2, 0))
    source = jl.ArraySource({"x": np.arange(12)})
    with pytest.warns(UserWarning, match=r"StreamLoader with num_workers=2 was made in worker 1 "
                                         r".*in this process.*in a function"):
        streamed = jl.StreamLoader(jl.Stream.from_generator(lambda i: ({"x": j} for j in
                                                                       range(8)), 2),
                                   batch_size=2, num_workers=2)
    with pytest.warns(UserWarning, match=r"StreamLoader with num_workers='auto'"):
        tuned = jl.StreamLoader(jl.Stream.from_generator(lambda i: ({"x": j} for j in
                                                                    range(8)), 2),
                                batch_size=2, num_workers="auto", prefetch="auto",
                                readers_per_process=2)
    with pytest.warns(UserWarning, match=r"DataLoader with num_workers='auto' was made in "
                                         r"worker 1 \(pid \d+\).*same batches") as warned:
        loader = jl.DataLoader(source, batch_size=4, shuffle=True, num_workers="auto")
    assert warned[0].filename == __file__  # (the line that made it)
    with loader, streamed:
        assert loader.num_workers == 0 and streamed.num_workers == 0
        monkeypatch.setattr(worker_info, "_INFO", None)
        with jl.DataLoader(source, batch_size=4, shuffle=True) as here:
            assert_same_stream(list(loader), list(here))
        assert len(list(zip(range(4), streamed))) == 4
    with tuned:  # (its runs asked the in-process engine for a roster)
        assert len(list(zip(range(4), tuned))) == 4 and tuned.num_workers == 0


def test_a_transforms_module_that_makes_a_loader_on_import_starts_no_workers_of_workers(
        tmp_path, monkeypatch):
    # each worker imports the module to find its transform: its loader started workers that
    # imported it again, without end (exponentially with 2 workers)
    (tmp_path / "made_on_import.py").write_text(textwrap.dedent(f"""
        import os
        import numpy as np, jaxloader as jl
        with open({str(tmp_path / "imports.log")!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        def double(r):
            return {{"x": r["x"] * 2}}
        loader = jl.DataLoader(jl.ArraySource({{"x": np.arange(16)}}), batch_size=4,
                               num_workers=2, transforms=[double])
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "made_on_import", raising=False)
    import made_on_import

    with made_on_import.loader as loader, pytest.warns(
            UserWarning, match=r"num_workers=2 was made in worker \d .* of another loader"):
        assert [b["x"].tolist() for b in loader][1] == [8, 10, 12, 14]
        time.sleep(0.5)  # (a worker's loader would be starting its own workers by now)
        pids = (tmp_path / "imports.log").read_text().split()
        assert len(pids) == 3 and len(set(pids)) == 3, pids  # this process and 2 workers
    del sys.modules["made_on_import"]


def test_a_module_the_workers_cannot_import_is_named_with_where_this_process_found_it(
        tmp_path, monkeypatch):
    # a notebook imports a module of its directory ('' on sys.path), then changes directory:
    # the workers, started there, said only "No module named ..."; a module of source now
    # crosses by value (by_value), one without (a .pyc alone here) is still imported by name
    import py_compile

    import cloudpickle

    (tmp_path / "first").mkdir(), (tmp_path / "second").mkdir()
    for name in ("helpers_left_behind", "helpers_left_source"):
        (tmp_path / "first" / f"{name}.py").write_text("def same(r):\n    return r\n")
        monkeypatch.delitem(sys.modules, name, raising=False)
    py_compile.compile(str(tmp_path / "first" / "helpers_left_behind.py"),
                       str(tmp_path / "first" / "helpers_left_behind.pyc"))
    os.remove(tmp_path / "first" / "helpers_left_behind.py")
    monkeypatch.chdir(tmp_path / "first")
    monkeypatch.syspath_prepend("")
    import helpers_left_behind
    import helpers_left_source

    with jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=4, num_workers=1,
                       transforms=[helpers_left_source.same]) as loader:  # (found by its name
        next(iter(loader))  # here: it was not checked again from the next folder)
    monkeypatch.chdir(tmp_path / "second")
    with pytest.raises(jl.WorkerError, match=(
            rf"No module named 'helpers_left_behind' \(this process imported "
            rf"helpers_left_behind from {tmp_path}/first/helpers_left_behind.pyc.*'' is the "
            rf"directory of the moment, {tmp_path}/second\): put {tmp_path}/first on sys.path")):
        with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, num_workers=1,
                           transforms=[helpers_left_behind.same]) as loader:
            next(iter(loader))
    try:
        with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, num_workers=1,
                           transforms=[helpers_left_source.same]) as loader:
            assert [b["x"].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    finally:
        cloudpickle.unregister_pickle_by_value(helpers_left_source)
    del sys.modules["helpers_left_behind"], sys.modules["helpers_left_source"]


def _pidfds():
    return sum(os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
               for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))


@pytest.mark.parametrize("where", ["in the roster's log line", "as the roster returns"])
def test_a_ctrl_c_as_workers_are_started_again_leaves_none_behind(monkeypatch, where):
    # an interrupt storm left a pidfd a worker behind (7-12 a run): a Ctrl-C in the roster's
    # log line (after the try that stops what it started), or as it returned to the pool
    # (before the pool held it), left its workers where nothing stopped them
    import jaxloader.workers.pool as pool_module
    import jaxloader.workers.roster as roster_module

    pool = make_pool(2)
    before, started = _pidfds(), []
    try:
        it = pool.batches(0, None)
        next(it)
        it.close()
        pool._mixed_up = True  # (what an interrupt outside the wait leaves: a restart next)
        if where == "as the roster returns":
            class Interrupted(roster_module.Roster):
                def __init__(self, *args, **kwargs):
                    super().__init__(*args, **kwargs)
                    started.extend(self.pids)
                    raise KeyboardInterrupt
            monkeypatch.setattr(pool_module, "Roster", Interrupted)
        else:
            said = roster_module.log.info

            def interrupted(message, *args):
                if "worker process(es): pids" not in message:  # (not the roster's line)
                    return said(message, *args)
                started.extend(args[-1])  # (the pids it names)
                raise KeyboardInterrupt
            monkeypatch.setattr(roster_module.log, "info", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pool.batches(0, None).send(None)
        monkeypatch.undo()
    finally:
        pool.close()
    assert len(started) == 2 and _pidfds() <= before - 2  # (the first workers' closed too)
    time.sleep(0.2)
    assert not [pid for pid in started if running(pid)]


def test_workers_that_end_with_their_killed_starter_name_the_starter(tmp_path):
    # a kill -9 of the worker starter ended its workers, each blamed on the out-of-memory killer
    # and on "native code in transforms"; run apart: the starter is this process's
    done = _run_script(tmp_path, """
        import os, signal, time
        import numpy as np
        import jaxloader as jl

        def slow(r):
            time.sleep(0.001)
            return r

        loader = jl.DataLoader(jl.ArraySource({"x": np.arange(4000)}), batch_size=10,
                               num_workers=2, transforms=[jl.Map(slow)], process_index=0,
                               process_count=1)
        it = iter(loader)
        next(it)
        starter = loader._engine._workers[0]._starter
        os.kill(starter.pid, signal.SIGKILL)
        try:
            for _ in it:
                pass
        except jl.WorkerError as e:
            print(e)
        loader.close()
        again = jl.DataLoader(jl.ArraySource({"x": np.arange(40)}), batch_size=10,
                              num_workers=2, process_index=0, process_count=1)
        print(sum(len(b["x"]) for b in again))
        again.close()
    """)
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err[-3000:]
    said, made = out.strip().splitlines()[-2:]
    assert re.search(r"died .*: the worker starter \(pid \d+, the process that starts the "
                     r"workers\) ended first, killed by signal 9, and its workers end with it; "
                     r"the loader is broken; check what ended it", said), said
    assert "native code" not in said and made == "40"  # (a new loader starts a new starter)


def test_an_unpicklable_part_of_a_source_made_of_others_is_named():
    # The error named the outer source alone (MapSource(ConcatSource(...))), not the part.
    class Locked:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):
            return {"x": np.int64(i)}

        def __repr__(self) -> str:
            return "Locked()"

    inner = jl.ConcatSource([jl.ArraySource({"x": np.arange(4)}), Locked()])
    with pytest.raises(jl.WorkerError, match=r"cannot send the source MapSource.*: its part "
                       r"Locked\(\): the object at Locked.lock \(<unlocked _thread.lock .*\) "
                       r"does not pickle: TypeError: cannot pickle '_thread.lock'"):
        jl.DataLoader(jl.MapSource(inner, lambda r: r), batch_size=2, num_workers=2)


def test_an_open_text_file_of_a_source_is_refused_not_sent_as_its_text(tmp_path):
    # cloudpickle sent a file opened "r" read whole, as a StringIO: the file's text in each
    # worker, stale as the file grew, and .mode or fileno() an AttributeError there (an "rb"
    # one was refused; the user-sources audit)
    (tmp_path / "index.jsonl").write_text("{}\n" * 100)

    class Indexed:
        def __init__(self) -> None:
            self.f = open(tmp_path / "index.jsonl")

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):
            return {"x": np.int64(i)}

    source = Indexed()
    try:
        with pytest.raises(jl.WorkerError, match=r"the object at Indexed.f \(<_io.TextIOWrapper "
                           r"name=.*\) does not pickle: TypeError: cannot pickle 'TextIOWrapper'"
                           r".*open them lazily in the worker"):
            jl.DataLoader(source, batch_size=2, num_workers=1, process_index=0, process_count=1)
    finally:
        source.f.close()


_LOCK = threading.Lock()


class _StateHoldsLock:
    def __init__(self) -> None:
        self.table = np.zeros(3 << 20, np.uint8)  # (not copied by the probes)
        self.handle = threading.Lock()  # left out of the state: not the culprit
        self.stats = {"mean": 0.0, "guard": threading.Lock()}

    def __getstate__(self) -> dict:
        return {"table": self.table, "stats": self.stats}

    def __call__(self, r):
        return r


_HOLDER = _StateHoldsLock()
_HOLDER._LOCK = None


def test_an_unpicklable_transform_names_the_variable_that_holds_the_object():
    # The error named the transform and the pickler's error (cannot pickle '_thread.lock'),
    # not which of the function's variables or the object's attributes held the lock
    def make():
        handle = threading.Lock()

        def scale(r):
            with handle:
                return r
        return scale

    def add(r, guard):
        return r

    cases = [
        (make(), r"the object at Map.fn > scale's captured variable 'handle' \(<unlocked "
                 r"_thread.lock"),
        (functools.partial(add, guard=_LOCK), r"Map.fn > the partial's argument 'guard' "),
        (_StateHoldsLock(), r"Map.fn > _StateHoldsLock.stats > item 'guard' \(<unlocked"),
        (lambda r: _LOCK and r, r"Map.fn > <lambda>'s global '_LOCK' \(<unlocked"),
        # a global only its nested code reads; an attribute named as a global that is not read
        # (co_names holds both: the unsent global '_LOCK' was named for _HOLDER's lock)
        (lambda r: any(_LOCK for _ in r) or r, r"Map.fn > <lambda>'s global '_LOCK' \("),
        (lambda r: _HOLDER._LOCK or r, r"Map.fn > <lambda>'s global '_HOLDER' > "
                                       r"_StateHoldsLock.stats > item 'guard'"),
    ]
    for fn, said in cases:
        with pytest.raises(jl.WorkerError, match=r"cannot send the transform Map\(.* to worker "
                           r"processes: .*" + said + r".* does not pickle: TypeError"):
            jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=2, num_workers=1,
                          transforms=[jl.Map(fn)])


def test_a_stale_run_driven_on_ends_and_leaves_the_newer_runs_batches():
    # An iter() from another thread while this thread's next() runs inside the pool's run
    # cannot close that run (its generator is running): the older run is driven on after the
    # newer was made. It must end there (its iterator says it is stale), not send tasks or read
    # the newer run's reports: it dropped the newer run's batches, which then waited forever.
    # Driven from one thread here, each order of the two that threads gave, deterministically.
    maker = BatchMaker(jl.ArraySource({"y": np.arange(64)}),
                       Sampler(64, 2, shuffle=False, seed=0, last_batch="drop"))
    pool = WorkerPool(maker, num_workers=2, timeout_s=30)  # (a lost batch: an error, no hang)
    try:
        old = pool.batches(0, None)
        assert next(old)["y"].tolist() == [0, 1]
        new = pool.batches(1, None)  # made, not yet started: the older resumes first
        with pytest.raises(StopIteration):
            next(old)
        assert [next(new)["y"].tolist() for _ in range(3)] == [[2, 3], [4, 5], [6, 7]]
        newer = pool.batches(4, None)
        assert next(newer)["y"].tolist() == [8, 9]  # started: it has tasks in flight
        with pytest.raises(StopIteration):
            next(new)  # (before: it read and dropped the newer run's batches)
        assert [next(newer)["y"].tolist() for _ in range(20)] == [
            [2 * s, 2 * s + 1] for s in range(5, 25)]
        pool.close()
        with pytest.raises(jl.JaxloaderError, match="was closed"):
            next(newer)  # (before: OSError "handle is closed", or a segment used after close)
    finally:
        pool.close()


def test_a_worker_killed_by_sigbus_names_a_memory_mapped_file_cut_as_it_was_read(tmp_path):
    # an .npy opened with mmap_mode and truncated by another job: "killed by signal 7; ...
    # check memory use and native code in transforms", naming neither the signal nor the file
    path = tmp_path / "x.npy"
    np.save(path, np.arange(64 * 8192, dtype=np.int64).reshape(64, 8192))

    class Rows:  # (a source of the user's: an ArraySource refuses a file cut between batches)
        def __init__(self):
            self.x = np.load(path, mmap_mode="r")

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"x": self.x[i]}

    with jl.DataLoader(Rows(), batch_size=4, num_workers=1, prefetch=1, process_index=0,
                       process_count=1) as loader:
        it = iter(loader)
        next(it)
        os.truncate(path, 128)
        with pytest.raises(jl.WorkerError, match=r"killed by signal 7 \(SIGBUS: .*a memory-mapped "
                                                 r"file the source reads.*truncated"):
            list(it)


def test_a_ctrl_c_as_the_pool_is_made_leaves_no_board_behind(monkeypatch):
    # its status board was made before the finalizer that destroys it: a Ctrl-C in between
    # (here, as the gauges are made) left its memory files and pipes open for good
    from jaxloader.workers import pool as pool_module

    def descriptors():  # (the board's memory files: its pipes went with them)
        return sorted(name for f in os.listdir("/proc/self/fd") if os.path.exists(
            f"/proc/self/fd/{f}") and "memfd:jaxloader" in (name := os.readlink(
                f"/proc/self/fd/{f}")))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    before = descriptors()
    monkeypatch.setattr(pool_module, "Gauges", interrupted)
    with pytest.raises(KeyboardInterrupt):
        jl.DataLoader(source(), batch_size=4, num_workers=2, process_index=0, process_count=1)
    monkeypatch.undo()
    import gc

    gc.collect()
    assert descriptors() == before


def test_a_ctrl_c_in_the_first_step_of_stopping_the_workers_leaves_nothing_held(monkeypatch):
    # (the lifecycle audit) the first step, each worker's exit code asked of the starter (a
    # round trip), ran before the others' run_all: a Ctrl-C there (a collected loader's
    # finalizer, 1 in 2 real signals) left its slots and pidfds open for good
    from jaxloader.workers.process import WorkerProcess

    before = set(held_segments())
    pool = WorkerPool(BatchMaker(source(), Sampler(61, 6, shuffle=False, seed=0,
                                                   last_batch="drop")), num_workers=2)
    assert len(list(pool.batches(0, 4))) == 4
    mine, pids = set(held_segments()) - before, pool.pids
    real, fired = WorkerProcess.exitcode, []

    def exitcode(self, timeout=0.0):
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt  # (a Ctrl-C landing in the round trip)
        return real(self, timeout)

    monkeypatch.setattr(WorkerProcess, "exitcode", exitcode)
    with pytest.raises(KeyboardInterrupt):
        pool.close()
    assert fired and mine
    assert _wait_gone(pids, mine) == ([], []), "workers or slots left"
