"""What each worker is doing: the step a dead worker died in, and a stall said, not waited out
in silence (``workers.status``)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.workers import failures, protocol, stacks, stalls, status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(120)


def _crash_at(record):
    if int(record["x"]) == 2500:
        os.kill(os.getpid(), signal.SIGSEGV)  # native code that crashes on this record
    return record


def test_a_worker_that_dies_names_the_step_it_died_in_not_its_tasks_first():
    with jl.DataLoader(jl.ArraySource({"x": np.arange(5000)}), batch_size=100, num_workers=2,
                       transforms=[jl.Map(_crash_at)], process_index=0,
                       process_count=1) as loader:
        with pytest.raises(jl.WorkerError, match=r"worker 1 \(pid \d+\) died while making "
                                                 r"step 25 \(epoch 0, record positions "
                                                 r"2500..2599\): killed by signal 11") as e:
            for _ in loader:
                pass
    # with its Python stack as the signal came: the line in the transform that called native code
    said = str(e.value).split("--- the worker's Python stacks as the signal came ---\n")[1]
    assert said.startswith("Fatal Python error: Segmentation fault"), said
    assert "in _crash_at" in said and "in make_steps" in said, said


def _crashing_shard(shard):
    for i in range(1000):
        if shard == 1 and i == 57:
            os.kill(os.getpid(), signal.SIGSEGV)
        yield {"x": np.int64(shard * 1000 + i)}


def test_a_stream_worker_that_dies_names_its_step():
    # reader 1 (worker 1) crashes in its 6th batch of 10: stream step 2 * 5 + 1
    with pytest.raises(jl.WorkerError, match=r"worker 1 \(pid \d+\) died while making "
                                             r"stream step 11 \(reader 1, its batch 5\)"):
        _read_stream(_crashing_shard, shuffle_shards=False)


def _read_stream(make, steps=40, shuffle_shards=True, **kwargs):
    """``steps`` batches of 10 of ``make``'s 2 shards, with 2 workers."""
    with jl.StreamLoader(jl.Stream.from_generator(make, shards=2,
                                                  shuffle_shards=shuffle_shards),
                         batch_size=10, num_workers=2, process_index=0, process_count=1,
                         **kwargs) as loader:
        it = iter(loader)
        for _ in range(steps):
            next(it)


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _slow_after(record):
    if int(record["x"]) >= 16:
        time.sleep(30)
    return record


@pytest.mark.parametrize("stop", ["sigstop", "sleep"])
def test_a_late_batch_is_logged_with_what_each_worker_does_then_an_error_past_timeout_s(
        caplog, stop, monkeypatch):
    from jaxloader.runtime import limits

    monkeypatch.setattr(limits, "cores", lambda: 1)  # (a quota of one core: said, not
    # just "running", as 16 workers sharing it went past timeout_s; the limits audit)
    transforms = [jl.Map(_slow_after)] if stop == "sleep" else []
    # (records enough that the stopped worker cannot have made all its batches before it stops,
    # however late the stop comes on a loaded machine)
    with jl.DataLoader(jl.ArraySource({"x": np.arange(40_000)}), batch_size=8, num_workers=2,
                       transforms=transforms, stall_warning_s=0.4, timeout_s=1.5,
                       prefetch=1, process_index=0, process_count=1) as loader:
        caplog.set_level(logging.WARNING, logger="jaxloader")
        it = iter(loader)
        next(it), next(it)
        caplog.clear()  # (a loaded machine may have reported the workers' start)
        stopped = loader.worker_pids[1]
        if stop == "sigstop":
            os.kill(stopped, signal.SIGSTOP)
        try:
            with pytest.raises(jl.StallError, match=r"no batch for [\d.]+ s, past timeout_s="
                                                    r"1.5: step \d+ \(epoch 0, record positions "
                                                    r"[\d.]+\) is awaited, from worker \d"):
                for _ in range(5000):
                    next(it)
        finally:
            if stop == "sigstop" and not _gone(stopped):
                os.kill(stopped, signal.SIGCONT)
    warned = [r.getMessage() for r in caplog.records if "no batch for" in r.getMessage()]
    assert len(warned) >= 2  # at 0.4 s and again at 0.8 s, before the error at 1.5 s
    assert "(2 workers share the 1 core(s) this process may use" in warned[0]
    if stop == "sigstop":
        assert "worker 1 (pid" in warned[0] and "stopped (SIGSTOP" in warned[0]
        assert "no stack: the process is stopped" in warned[0]
    else:
        assert "making step" in warned[0] and "in _slow_after" in warned[0]
        assert "The loader keeps waiting" in warned[0]


def _blocked(shard):
    for i in range(1000):
        if shard == 0 and i == 25:
            time.sleep(60)  # a generator that blocks (a socket, a queue)
        yield {"x": np.int64(shard * 1000 + i)}


def test_a_blocked_stream_generator_is_reported_with_its_stack(caplog):
    caplog.set_level(logging.WARNING, logger="jaxloader")
    # (timeout_s counts the workers' start too, ~1.2 s in a fresh venv on a loaded machine)
    with pytest.raises(jl.StallError, match=r"stream step \d+ \(reader \d, its batch 2\) "
                                            r"is awaited, from worker \d"):
        _read_stream(_blocked, stall_warning_s=0.4, timeout_s=3.0)
    warned = [r.getMessage() for r in caplog.records if "no batch for" in r.getMessage()
              and "in _blocked" in r.getMessage()]  # (not a report of the workers' start)
    assert warned and "making stream step" in warned[0]


def test_stall_arguments_are_checked():
    with pytest.raises(jl.ConfigError, match=r"timeout_s: expected a number of seconds > 0, "
                                             r"or None, got int 0"):
        jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=2, timeout_s=0,
                      process_index=0, process_count=1)


def test_a_stall_warning_or_timeout_of_a_year_is_taken():
    """"Never report" as a year: taken where the loader is made, then the first next() raised
    a bare OverflowError (poll's milliseconds are a C int: 24.8 days at most; the API audit)."""
    year = 365 * 24 * 3600
    for kw in ({"stall_warning_s": year}, {"stall_warning_s": None, "timeout_s": 1e10}):
        with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, num_workers=1,
                           process_index=0, process_count=1, **kw) as loader:
            assert len(list(loader)) == 4


def _slow_start(worker_id):
    time.sleep(0.5)


def test_a_stall_report_while_workers_start_leaves_them_alone(caplog):
    # (a worker asked for its stacks is never harmed, whatever it is doing: the next test)
    caplog.set_level(logging.WARNING, logger="jaxloader")
    with jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=8, num_workers=2,
                       worker_init_fn=_slow_start, stall_warning_s=0.02, process_index=0,
                       process_count=1) as loader:
        assert sorted(np.concatenate([b["x"] for b in loader]).tolist()) == list(range(64))
    warned = [r.getMessage() for r in caplog.records if "no batch for" in r.getMessage()]
    assert warned and "starting (loading the payload" in warned[0]


_CHURNING_WORKER = """
import ast, sys, threading, time
from jaxloader.workers.status import WorkerStatus

def count(n):
    return sum(range(n))

def churn_threads():  # a transform whose libraries start and end threads
    while True:
        helpers = [threading.Thread(target=count, args=(100,)) for _ in range(4)]
        for helper in helpers:
            helper.start()
        for helper in helpers:
            helper.join()

status = WorkerStatus(ast.literal_eval(sys.argv[1]), 0)
status.making(3)
print("started", flush=True)
churn_threads()
"""


def test_stacks_taken_many_times_never_kill_a_worker_whose_threads_come_and_go(monkeypatch):
    # stacks taken by a signal handler (faulthandler) walk frames while threads start and end:
    # such a worker died of SIGSEGV within ~50 requests (3.11 and 3.13)
    board = status.StatusBoard(1)
    worker = subprocess.Popen([sys.executable, "-c", _CHURNING_WORKER, repr(board.names(0))],
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"started\n"
        with monkeypatch.context() as quick:
            quick.setattr(stacks, "_STACK_SETTLE_S", 0.001)  # (many requests a second)
            for _ in range(300):
                board.stacks([worker.pid])
                assert worker.poll() is None, f"the worker died: exit code {worker.poll()}"
        for _ in range(5):  # (an answer within the second each has, on a loaded machine)
            stack = board.stacks([worker.pid])[0]
            if "no answer" not in stack:
                break
        assert 'Thread "MainThread"' in stack and "in churn_threads" in stack, stack
    finally:
        worker.kill()
        worker.wait()
        board.destroy()


_CRASHING_WORKER = """
import ast, os, signal, sys
from jaxloader.workers.status import WorkerStatus

status = WorkerStatus(ast.literal_eval(sys.argv[1]), 0, crash_dumps=True)
status.making(3)
os.kill(os.getpid(), signal.SIGSEGV)
"""


def test_a_crash_dump_is_said_for_the_worker_that_crashed_only():
    board = status.StatusBoard(1)
    try:
        worker = subprocess.run([sys.executable, "-c", _CRASHING_WORKER, repr(board.names(0))],
                                env={**os.environ, "PYTHONPATH": ROOT})
        assert worker.returncode == -signal.SIGSEGV
        said = str(failures.died(0, 7, -signal.SIGSEGV, board, lambda step: f"step {step}"))
        assert "died while making step 3: killed by signal 11" in said
        assert "stacks as the signal came ---\nFatal Python error: Segmentation fault" in said
        # the same slot's next worker, or a death with no dump (SIGKILL), is not given it
        assert "stacks" not in str(failures.died(0, 7, -signal.SIGKILL, board, str))
        board.restarted()
        assert board.crash(0) is None
    finally:
        board.destroy()


def _watch(monkeypatch, caplog, warn_s, timeout_s):
    """A ``StallWatch`` awaiting step 5 on a clock the test moves (``now[0]``, from 100 s)."""
    now = [100.0]
    monkeypatch.setattr(stalls.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.WARNING, logger="jaxloader")
    watch = stalls.StallWatch(warn_s, timeout_s)
    watch.begin(5)
    return watch, now


def test_a_stall_is_said_again_every_stall_warning_s(caplog, monkeypatch):
    watch, now = _watch(monkeypatch, caplog, 1.0, 10.0)
    said = []
    for t in [0.5, 1.0, 1.5, 2.0, 2.7, 3.0, 3.2, 4.6, 4.9]:  # seconds since the wait began
        now[0] = 100.0 + t
        caplog.clear()
        assert watch.due(lambda: "step 5 is awaited") is None
        if caplog.records:
            said.append(t)
    assert said == [1.0, 2.0, 3.0, 4.6], said  # (one a second; 4.6: the one due at 4, late)
    assert watch.left() == pytest.approx(0.1)  # to the next, at 5 s
    now[0] = 110.0
    assert "past timeout_s=10" in str(watch.due(lambda: "step 5 is awaited"))


def test_a_new_iterators_step_behind_a_step_of_the_one_before_is_said(tmp_path, monkeypatch,
                                                                       caplog):
    # Ctrl-C on a read that hangs, the cell run again: the new iterator's first step waited
    # behind the step its worker still made for the iterator before, without a word until
    # stall_warning_s (300 s by default: a notebook's user waited 5 minutes, the limits audit)
    flag = tmp_path / "hung"

    def hangs_once(record):
        if int(record["x"]) == 16 and not flag.exists():  # (step 2's first record)
            flag.touch()
            time.sleep(3.0)
        return record

    monkeypatch.setattr(stalls, "BEHIND_S", 0.5)
    caplog.set_level(logging.WARNING, logger="jaxloader")
    with jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=8, num_workers=1,
                       transforms=[jl.Map(hangs_once)], prefetch=4, stall_warning_s=60,
                       process_index=0, process_count=1) as loader:
        next(iter(loader))  # step 0; its worker goes on to steps 1, 2 (which hangs), ...
        while not flag.exists():
            time.sleep(0.01)
        again = iter(loader)  # (the iterator before ends: its steps are stale)
        assert int(next(again)["x"][0]) == 8  # step 1, made once step 2 of before is done
    said = [r.getMessage() for r in caplog.records if "waits behind worker 0" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"{loader._progress.label}: step 1 (epoch 0, record positions 8..15)"
                              " waits behind worker 0, still making step 2"), said[0]
    assert "for an iterator before this one" in said[0] and "close() the loader" in said[0]


def _a_little_slow(record):
    time.sleep(0.05 / 8)  # a batch of 8: 0.05 s
    return record


def test_a_task_of_small_steps_made_steadily_is_no_stall():
    # a task of 16 steps is reported once all are made: the consumer waits 0.8 s for its first
    # while its worker makes a step every 0.05 s; timeout_s=0.5 raised a StallError on a
    # healthy loader (and stall_warning_s said stalls that were none)
    with jl.DataLoader(jl.ArraySource({"x": np.arange(40_000, dtype=np.float32)}),
                       batch_size=8, num_workers=2, transforms=[jl.Map(_a_little_slow)],
                       timeout_s=0.5, process_index=0, process_count=1) as loader:
        it = iter(loader)
        got = [next(it)["x"][0] for _ in range(8)]  # (step 4 begins a task of 16)
    assert got == [8.0 * i for i in range(8)]


def test_the_stall_clock_runs_from_the_holders_last_step(caplog, monkeypatch):
    watch, now = _watch(monkeypatch, caplog, 1.0, 2.0)
    began = [100.0]  # when the worker holding step 5 began its last step
    for t in [0.5, 0.9, 1.4, 1.8, 2.3, 2.9, 3.5]:  # a step every 0.5 s: never late
        now[0] = 100.0 + t
        began[0] = 100.0 + t - 0.1
        assert watch.due(lambda: "step 5", lambda: began[0]) is None
    assert not caplog.records
    now[0] = 105.5  # its last step began at 103.4: 2.1 s
    error = watch.due(lambda: "step 5", lambda: began[0])
    assert "no batch for 5.5 s, and no step begun by its worker for 2.1 s, past timeout_s=2: " \
        "step 5" in str(error)
    assert watch.due(lambda: "step 5", lambda: None) is not None  # (idle: the same)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="Linux's /proc")
@pytest.mark.parametrize("where", ["after_create", "after_assignment"])
def test_a_ctrl_c_as_a_stack_file_is_made_leaves_no_descriptor(monkeypatch, where):
    # the descriptor was held in a local until the caller appended it: an interrupt there
    # left it open (1 of 4 runs of 40 interrupts fired as loaders were made)
    from jaxloader.runtime import shm

    if not shm.MEMFD_AVAILABLE:
        pytest.skip("memory files are Linux's")
    before = set(os.listdir("/proc/self/fd"))
    real_create, real_fstat = stacks.os.memfd_create, stacks.os.fstat

    def create_then_interrupt(*args):
        real_create(*args)  # (made, its number not yet held: found by the file's token)
        raise KeyboardInterrupt

    def fstat_interrupted(fd):
        raise KeyboardInterrupt

    if where == "after_create":
        monkeypatch.setattr(stacks.os, "memfd_create", create_then_interrupt)
    else:
        monkeypatch.setattr(stacks.os, "fstat", fstat_interrupted)
    with pytest.raises(KeyboardInterrupt):
        stacks.StackFiles(2)
    monkeypatch.setattr(stacks.os, "fstat", real_fstat)
    assert set(os.listdir("/proc/self/fd")) - before == set()


def test_a_stack_thread_that_cannot_start_names_the_limit_and_leaves_no_descriptor(
        monkeypatch):
    # ulimit -u: a bare "RuntimeError: can't start new thread", said to come from the payload
    # or worker_init_fn; then an error that ended the worker, and the run where
    # num_workers="auto" added one at the limit: it makes batches without the thread (the
    # process-model audit)
    files = stacks.StackFiles(1)
    try:
        before = set(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else set()

        def refused(self):
            raise RuntimeError("can't start new thread")
        monkeypatch.setattr(stacks.threading.Thread, "start", refused)
        with pytest.warns(jl.JaxloaderWarning, match=r"can't start new thread: this worker's "
                          r"stack thread .* could not start: .*ulimit -u .*it makes batches "
                          r"without it.*fewer workers"):
            stacks.WorkerStacks(*files.names(0))
        monkeypatch.undo()
        assert files.take([True])[0].startswith("(no stack: no answer within")
        if before:
            assert set(os.listdir("/proc/self/fd")) - before == set()
    finally:
        files.destroy()


def test_timeout_s_without_workers_is_said_to_time_nothing_out():
    # num_workers=0 took timeout_s without a word, and a source that blocked waited for good
    # (the online audit): the batch is made in the asking thread, which nothing can stop
    with pytest.warns(UserWarning, match=r"timeout_s=2.0: with num_workers=0 a batch is made "
                                         r"in the thread that asks for it"):
        jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=2, timeout_s=2,
                      process_index=0, process_count=1).close()


def test_worker_settings_without_workers_are_said_to_act_on_nothing():
    # num_workers=0 took a worker_init_fn, prefetch and start_method without a word (as
    # PyTorch does): a worker_init_fn's setup (a connection, thread limits) never ran
    import warnings

    calls = []
    with pytest.warns(jl.JaxloaderWarning, match=r"worker_init_fn, prefetch=8, start_method="
                                                 r"'fork': with num_workers=0 no worker process "
                                                 r"starts, so this acts on nothing"):
        with jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=2,
                           worker_init_fn=calls.append, prefetch=8, start_method="fork",
                           process_index=0, process_count=1) as loader:
            list(loader)
    assert calls == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the defaults: nothing said)
        jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=2,
                      process_index=0, process_count=1).close()


def _slow_at_5(record):
    if int(record["x"]) == 5:
        time.sleep(1.6)  # (a read that blocks: a mount that hangs)
    return record


def test_a_late_batch_made_on_the_device_put_thread_is_reported_with_its_stack(caplog):
    # with num_workers=0 and sharding= nothing was said of a batch however late, though the
    # timeout_s warning said stall_warning_s reports one (the concurrency audit): the
    # training thread, waiting for the device-put thread, says it (no thread of its own)
    import threading

    import jax

    caplog.set_level(logging.WARNING, logger="jaxloader")
    placing = {"sharding": jax.sharding.SingleDeviceSharding(jax.devices()[0])}
    threads = threading.active_count()
    with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, stall_warning_s=0.5,
                       transforms=[jl.Map(_slow_at_5)], process_index=0, process_count=1,
                       **placing) as loader:
        assert [int(b["x"][0]) for b in loader] == [0, 2, 4, 6]
        assert threading.active_count() <= threads + 1  # (the device-put thread alone)
    said = [r.getMessage() for r in caplog.records if "in the making for" in r.getMessage()]
    assert said and "step 2" in said[0] and "in _slow_at_5" in said[0], said
    assert "jaxloader-host-prefetch" in said[0] and "stall_warning_s=" in said[0]
    assert 1 <= len(said) <= 3, said  # (again every stall_warning_s: at 0.5, 1.0, 1.5 s; a
    caplog.clear()  # loaded machine's main thread may come to wait late)
    with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, stall_warning_s=0.5,
                       process_index=0, process_count=1, **placing) as loader:
        list(loader)
        time.sleep(1.0)  # (idle between batches: no batch is late)
        list(loader)
    assert not [r for r in caplog.records if "in the making for" in r.getMessage()]


class _SlowAt5:
    """Records read one by one (on read threads), the sixth slowly."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            time.sleep(1.6)
        return {"x": np.int64(i)}


def test_a_late_batch_read_on_read_threads_shows_the_read_that_blocks(caplog):
    # the report showed the batch's thread waiting for its reads, not the source's line that
    # blocked (a worker's report shows every thread: the concurrency audit)
    import jax

    caplog.set_level(logging.WARNING, logger="jaxloader")
    with jl.DataLoader(_SlowAt5(), batch_size=2, stall_warning_s=0.5, read_threads=2,
                       sharding=jax.devices()[0], process_index=0, process_count=1) as loader:
        assert [int(b["x"][0]) for b in loader] == [0, 2, 4, 6]
    said = [r.getMessage() for r in caplog.records if "in the making for" in r.getMessage()]
    assert said and "its read thread 'jaxloader-read_" in said[0] and (
        "in __getitem__\n    time.sleep(1.6)" in said[0]), said


def test_without_proc_the_workers_are_still_asked_for_their_stacks(monkeypatch):
    # (the portable-paths audit) a worker's state comes from /proc/<pid>/stat; without /proc
    # (macOS, a locked-down container) none is known, and a stall report asked none of the
    # workers for their stacks: "(no stack: the process is stopped, gone, ...)" for a worker
    # asleep in a transform, though its request pipe was there to ask
    board = status.StatusBoard(2)
    try:
        board._rows[:, 0] = 0  # (started: not _STARTING)
        asked = []
        monkeypatch.setattr(board._stacks, "take", lambda which: asked.append(which) or
                            ["", ""])
        monkeypatch.setattr(status, "_state", lambda pid: None)
        board.stacks([11, 12])
        real_isdir = os.path.isdir
        monkeypatch.setattr(os.path, "isdir", lambda p: p != "/proc/self" and real_isdir(p))
        board.stacks([11, 12])
        assert asked == [[False, False], [True, True]]  # (with /proc: None is a worker gone)
    finally:
        board.destroy()


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="Linux's /dev/shm")
def test_stack_files_and_pipes_without_memory_files_are_in_dev_shm_and_let_go_at_destroy():
    # (a killed loader's are unlinked by the resource tracker: test_process.py) made and
    # destroyed, none is left, nor registered with the tracker, which says what it unlinks
    script = textwrap.dedent("""
        import os
        from jaxloader.runtime import shm
        from jaxloader.workers import stacks
        shm.MEMFD_AVAILABLE = shm.PROC_FDS = False
        files = stacks.StackFiles(2)
        mine = stacks.WorkerStacks(*files.names(1))
        print(sorted(name.split("_")[1] for name in os.listdir("/dev/shm")
                     if f"_{os.getpid()}_" in name))
        print(files.take([False, True])[1].startswith('Thread "MainThread"'))
        mine.close()
        files.destroy()
        print([name for name in os.listdir("/dev/shm") if f"_{os.getpid()}_" in name])
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.stdout.splitlines() == ["['ask', 'ask', 'stack', 'stack']", "True", "[]"], \
        done.stdout + done.stderr
    assert "leaked" not in done.stderr, done.stderr


def test_no_writable_temporary_folder_for_the_stack_files_is_named(monkeypatch, tmp_path):
    # a read-only container without /proc's memory files: a bare "No usable temporary
    # directory found in [...]" as the loader was made (the containers audit)
    import tempfile

    from jaxloader.runtime import shm

    monkeypatch.setattr(shm, "MEMFD_AVAILABLE", False)
    monkeypatch.setattr(stacks, "_SHM_DIR", str(tmp_path / "no_dev_shm"))  # (nor /dev/shm)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    with pytest.raises(jl.JaxloaderError, match=r"stack files: no writable temporary folder "
                                                r".*set TMPDIR to a writable folder"):
        stacks._stack_file(0, [])


def test_an_address_space_limit_is_named_where_a_worker_aborts_or_the_payload_runs_out(
        monkeypatch):
    # under ulimit -v a worker's XLA aborted (SIGABRT: "check memory use and native code",
    # the limit unsaid) and a MemoryError pickling the source was "make it picklable by
    # cloudpickle" (the containers audit)
    import resource

    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit", lambda which: (
        (850 << 20,) * 2 if which == resource.RLIMIT_AS else real(which)))
    board = status.StatusBoard(1)
    try:
        said = str(failures.died(0, 7, -signal.SIGABRT, board, str))
        assert "killed by signal 6 (this process's address space is limited to 891,289,600 " \
               "bytes (ulimit -v, RLIMIT_AS: raise it), which a worker's native code" in said
        assert "ulimit -v" not in str(failures.died(0, 7, -signal.SIGKILL, board, str))
    finally:
        board.destroy()

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(failures.payload, "dumps", no_memory)
    with pytest.raises(MemoryError, match=r"out of memory as the loader pickled .*limited to "
                                          r"891,289,600 bytes .*num_workers=0"):
        failures.pickled(None, None, lambda s: None, lambda *a: None)
    monkeypatch.setattr(protocol.pickle, "dumps", no_memory)  # (the payload's message, sent)
    with pytest.raises(MemoryError, match=r"out of memory as a message between the loader and a "
                                          r"worker was pickled \(Stop\): .*limited to 891,289,6"):
        protocol.send(None, protocol.Stop())

