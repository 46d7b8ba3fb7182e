"""The worker starter: ``"exec"`` workers are forks of one fresh interpreter the training process
keeps, and each is still what an exec'd worker was (its directory, environment and random
state of its own, no JAX); workers exec'd one by one where there is no starter."""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.workers import starter, starter_process

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not starter.AVAILABLE, reason="the starter is Linux's"),
              pytest.mark.filterwarnings("ignore:.*Map.where. drew from the global random")]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def where(record):
    """A transform reporting where its worker runs."""
    return {"pid": np.int64(os.getpid()), "parent": np.int64(os.getppid()),
            "jax": np.bool_("jax" in sys.modules), "cwd": os.getcwd(),
            "mark": os.environ.get("JAXLOADER_TEST_MARK", ""),
            "draw": np.int64(np.random.randint(1 << 62))}


def _run(num_workers=2, **kw):
    """Per worker (by pid): the records it made, as ``where`` saw them."""
    source = jl.ArraySource({"x": np.arange(16)})
    with jl.DataLoader(source, batch_size=2, transforms=[jl.Map(where)], prefetch=1,
                       num_workers=num_workers, process_index=0, process_count=1, **kw) as ld:
        batches = list(ld)
    seen: dict[int, list[dict]] = {}
    for batch in batches:
        for i in range(len(batch["pid"])):
            seen.setdefault(int(batch["pid"][i]), []).append({k: batch[k][i] for k in batch})
    return seen


def test_the_workers_of_two_loaders_are_forks_of_one_starter_without_jax():
    importlib.import_module("jax")  # the training process has JAX; the starter, workers not

    first, second = _run(), _run()
    assert len(first) == len(second) == 2 and not set(first) & set(second)
    parents = {int(r["parent"]) for seen in (first, second) for rs in seen.values() for r in rs}
    assert len(parents) == 1 and parents != {os.getpid()}
    (parent,) = parents
    assert _parent(parent) == os.getpid()  # the starter is this process's child
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        assert b"jaxloader.workers.starter" in f.read()
    assert not any(r["jax"] for seen in (first, second) for rs in seen.values() for r in rs)


def test_each_worker_draws_its_own_numpy_global_random_numbers():
    # a fork copies the starter's NumPy random state: without a new seed in each worker, the
    # workers' global draws would be one sequence, repeated
    seen = _run()
    firsts = [records[0]["draw"] for records in seen.values()]
    assert len(set(firsts)) == 2, firsts


def test_a_worker_runs_in_the_directory_and_environment_of_its_start(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXLOADER_TEST_MARK", "a")
    _run()  # (the starter for this environment, started in the old directory)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JAXLOADER_TEST_MARK", "b")
    records = [r for rs in _run().values() for r in rs]
    assert {str(r["cwd"]) for r in records} == {str(tmp_path)}
    assert {str(r["mark"]) for r in records} == {"b"}


def _descriptor_limit(record):
    import resource

    return {"limit": np.int64(resource.getrlimit(resource.RLIMIT_NOFILE)[0])}


def test_a_worker_has_the_descriptor_limit_of_its_loaders_making():
    # workers are forks of the starter, which kept the limits it started with: raising the
    # limit (the remedy the errors give) left the next loaders' workers at the old one
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    source = jl.ArraySource({"x": np.arange(4)})
    try:
        for limit in (soft - 7, soft - 3):
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            with jl.DataLoader(source, batch_size=2, transforms=[jl.Map(_descriptor_limit)],
                               num_workers=1, process_index=0, process_count=1) as loader:
                assert next(iter(loader))["limit"].tolist() == [limit, limit]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_worker_killed_is_reported_with_its_signal():
    def die(record):
        os.kill(os.getpid(), 9)

    source = jl.ArraySource({"x": np.arange(8)})
    with jl.DataLoader(source, batch_size=2, transforms=[jl.Map(die)], num_workers=1,
                       process_index=0, process_count=1) as loader:
        with pytest.raises(jl.WorkerError, match="SIGKILL"):
            next(iter(loader))


def test_a_worker_whose_start_was_cut_short_is_reaped_after_the_next_request():
    # a Ctrl-C as the training process asked for a start drops the reply: the pool never
    # learns the pid, never asks after it, and the worker stayed a zombie of the starter
    import pickle
    import socket
    from multiprocessing.connection import Pipe

    from jaxloader.workers.process import worker_environment

    forked = starter.Starter(worker_environment(os.environ))
    try:
        ours, theirs = Pipe()
        request = pickle.dumps((next(forked._numbers), "start", (os.getcwd(), [])))
        socket.send_fds(forked._socket, [request], [theirs.fileno()])  # (its reply unread)
        theirs.close()
        ours.close()  # the worker sees its pipe's end and exits
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _zombies_of(forked.pid):
            time.sleep(0.02)
        assert _zombies_of(forked.pid)  # exited, not yet reaped
        assert forked.poll(1 << 22) is not None  # the next request: its reply is read, and
        assert not _zombies_of(forked.pid) and forked.idle  # the worker it names asked after
    finally:
        forked.close()
        forked._popen.wait(30)


def test_a_worker_whose_starts_reply_was_read_as_a_ctrl_c_came_is_reaped_too():
    # the reply read, the Ctrl-C before it was kept: the pid in no list (a sweep that goes
    # on after its interrupts kept ~3 zombies in 80 trials, the sweeps audit)
    from multiprocessing.connection import Pipe

    from jaxloader.workers.process import worker_environment

    forked = starter.Starter(worker_environment(os.environ))
    asked = forked._ask

    def read_then_interrupted(request, fds=()):  # (the start's reply, then the children's:
        reply = asked(request, fds)  # a second Ctrl-C there forgot the lost start, the review)
        if request[0] in ("start", "children"):
            raise KeyboardInterrupt
        return reply

    try:
        forked._ask = read_then_interrupted
        ours, theirs = Pipe()
        with pytest.raises(KeyboardInterrupt):
            forked.start(theirs.fileno(), os.getcwd())
        with pytest.raises(KeyboardInterrupt):
            forked._ask_after_orphans()
        theirs.close()
        ours.close()  # the worker sees its pipe's end and exits
        forked._ask = asked
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _zombies_of(forked.pid):
            time.sleep(0.02)
        assert _zombies_of(forked.pid) and not forked._running  # (known to none)
        assert forked.poll(1 << 22) is not None  # the next request asks the starter
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not forked.idle:
            time.sleep(0.02)
        assert not _zombies_of(forked.pid) and forked.idle
    finally:
        forked.close()
        forked._popen.wait(30)


def _zombies_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and fields[0] == "Z" and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def test_without_a_starter_workers_are_exec_d_one_by_one(monkeypatch):
    monkeypatch.setattr(starter, "AVAILABLE", False)
    seen = _run()
    assert len(seen) == 2
    assert {int(r["parent"]) for rs in seen.values() for r in rs} == {os.getpid()}


def test_a_starter_that_ended_is_replaced_and_its_workers_reported_killed():
    from jaxloader.workers.process import worker_environment

    old = starter.starter_for(worker_environment(os.environ))
    old.close()
    assert starter.starter_for(worker_environment(os.environ)) is not old
    assert old.poll(12345) == -9
    assert len(_run()) == 2


def _starters() -> list[int]:
    """This process's live worker starters."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError):
            continue
        if int(ppid) == os.getpid() and state != "Z" and b"workers.starter" in cmdline:
            found.append(int(entry))
    return found


def test_a_starter_killed_is_replaced_at_the_next_loader():
    from jaxloader.workers.process import worker_environment

    _run()
    killed = starter.starter_for(worker_environment(os.environ))
    os.kill(killed.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while killed.pid in _starters() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_run()) == 2  # (not a broken pipe from the dead one)
    assert starter.starter_for(worker_environment(os.environ)).pid != killed.pid


def test_a_starter_of_an_environment_left_behind_is_closed_once_idle(monkeypatch):
    monkeypatch.setenv("JAXLOADER_TEST_MARK", "first")
    _run()
    monkeypatch.setenv("JAXLOADER_TEST_MARK", "second")
    _run()
    deadline = time.monotonic() + 10
    while len(_starters()) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_starters()) == 1


def test_a_worker_that_outlived_close_is_reaped_and_its_starter_closed_once_idle(monkeypatch):
    # close() waits 2 s for a worker's own threads; one that ended later stayed a zombie, its
    # starter never idle, never closed for another environment's
    def init(worker_id):
        threading.Thread(target=time.sleep, args=(2.5,)).start()  # (not a daemon)
    monkeypatch.setenv("JAXLOADER_TEST_MARK", "lingering")
    with jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=2, num_workers=1,
                       worker_init_fn=init, process_index=0, process_count=1) as loader:
        list(loader)
        (pid,) = loader.worker_pids
    time.sleep(1.5)  # (ended by now)
    monkeypatch.setenv("JAXLOADER_TEST_MARK", "next")
    _run(num_workers=1)
    assert not os.path.exists(f"/proc/{pid}") and len(_starters()) == 1


def shout(record):
    print(f"record {int(record['x'])} made", flush=True)
    return record


def test_a_worker_prints_where_the_training_process_prints_at_its_start(tmp_path):
    _run()  # (the starter started with the standard output of then)
    log = open(tmp_path / "out.txt", "w")
    saved = os.dup(1)
    os.dup2(log.fileno(), 1)  # (as a trainer sending its output to a file from now on)
    try:
        source = jl.ArraySource({"x": np.arange(4)})
        with jl.DataLoader(source, batch_size=2, transforms=[jl.Map(shout)], num_workers=1,
                           process_index=0, process_count=1) as loader:
            list(loader)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        log.close()
    assert sorted((tmp_path / "out.txt").read_text().splitlines()) == [
        f"record {i} made" for i in range(4)]


_KEPT: list = []  # (in a worker: what its worker_init_fn leaves open)


def leave_marks(worker_id):
    """A worker_init_fn leaving what Python's exit sees to: a thread still running (it waits
    for the test's word, then a while: longer than the stop's grace, and longer in worker 1,
    which must not be killed once worker 0 has ended), an executor left open, an atexit hook
    (which says whether the thread had ended: threads come first), and output not flushed."""
    import concurrent.futures

    here = os.environ["JAXLOADER_TEST_DIR"]

    def late():
        while not os.path.exists(os.path.join(here, "closing")):
            time.sleep(0.01)
        time.sleep(0.3 * (1 + worker_id))
        open(os.path.join(here, f"thread-{worker_id}"), "w").close()

    def hook():
        ended = os.path.exists(os.path.join(here, f"thread-{worker_id}"))
        open(os.path.join(here, f"atexit-{worker_id}-thread-ended-{ended}"), "w").close()

    atexit.register(hook)
    threading.Thread(target=late).start()
    _KEPT.append(concurrent.futures.ThreadPoolExecutor(1))
    _KEPT[-1].submit(int).result()  # (its thread started, waiting for work)
    print(f"worker {worker_id} unflushed;", end="")


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "exec'd"])
def test_a_worker_ends_with_its_threads_done_its_hooks_run_and_its_output_flushed(
        tmp_path, monkeypatch, capfd, forked):
    monkeypatch.setenv("JAXLOADER_TEST_DIR", str(tmp_path))
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # (a worker's output then waits)
    monkeypatch.setattr(starter, "AVAILABLE", forked)
    source = jl.ArraySource({"x": np.arange(8)})
    with jl.DataLoader(source, batch_size=2, num_workers=2, worker_init_fn=leave_marks,
                       process_index=0, process_count=1) as loader:
        assert len(list(loader)) == 4
        (tmp_path / "closing").touch()
    # close() waited for both workers' ends: each thread had ended before the hooks ran
    assert sorted(os.listdir(tmp_path)) == [
        "atexit-0-thread-ended-True", "atexit-1-thread-ended-True", "closing", "thread-0",
        "thread-1"]
    out = capfd.readouterr().out
    assert "worker 0 unflushed;" in out and "worker 1 unflushed;" in out


def test_thousands_of_orphans_are_asked_after_one_by_one():
    # starts cut short by rapid Ctrl-Cs leave orphans, each polled after a poll: each poll of
    # an orphan that had exited asked after the others inside it, a frame deeper each time
    # (a RecursionError past ~1,000, and the loader could not restart its workers)
    with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, num_workers=1,
                       process_index=0, process_count=1) as loader:
        next(iter(loader))
        worker = loader._engine._workers[0]
        the_starter = worker._starter
        gone = range(2_000_000_000, 2_000_003_000)  # (no such processes: each has ended)
        the_starter._orphans.update(gone)
        the_starter._running.update(gone)
        assert the_starter.poll(worker.pid) is None  # (the worker still runs)
        assert not the_starter._orphans & set(gone)


def test_a_starter_whose_trainer_closed_its_end_before_a_reply_ends_quietly():
    # a trainer that gave up on a request (interrupted) and exited: the starter's reply raised
    # ConnectionResetError, a traceback printed at a normal exit (the frameworks audit)
    import pickle
    import socket

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.sendmsg([pickle.dumps((1, "children", None))])
    theirs.close()
    with mine:
        starter_process._answer(mine, set())  # (returns: the link is closed)


def test_a_starter_the_process_limit_refuses_is_named_with_the_limits(monkeypatch):
    # a container's --pids-limit refused the worker starter's own start: a bare
    # "BlockingIOError: [Errno 11] Resource temporarily unavailable" (the containers audit)
    import errno

    from jaxloader.workers import launch

    def refused(*args, **kwargs):
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(launch, "launch", refused)
    with pytest.raises(OSError, match=r"could not start the worker starter process \(Resource "
                                      r"temporarily unavailable\): free processes or memory "
                                      r"\(ulimit -u .*num_workers=0") as raised:
        starter.Starter(dict(os.environ))
    assert raised.value.errno == errno.EAGAIN  # (autotune's growth ends on it, as on a fork's)
