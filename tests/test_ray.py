"""RayWorkers on a Ray cluster of three nodes simulated on this machine: the same batches as in
process, states that cross between Ray and local workers, actors and nodes lost mid-run."""

import builtins
import functools
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections import deque

import numpy as np
import pytest

import jaxloader as jl

ray = pytest.importorskip("ray", reason='Ray is optional: pip install -e ".[test,ray]"')
from ray.cluster_utils import Cluster  # noqa: E402

from jaxloader.ray import RayWorkers  # noqa: E402



@pytest.fixture
def cluster():
    """A head and two more nodes, one CPU each; a check may remove and add nodes. What Ray
    changes in this process (``print``, signal handlers) is put back for the tests after."""
    kept = builtins.print, {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    nodes = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "resources": {"any": 1}})
    try:
        for _ in range(2):
            nodes.add_node(num_cpus=1)
        ray.init(address=nodes.address, log_to_driver=False)
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()
        builtins.print = kept[0]
        for number, handler in kept[1].items():
            signal.signal(number, handler)


ON_NODE = r"\(pid \d+ on [\d.]+, node [0-9a-f]{8}\)"  # (an actor as messages name it)


def noisy(r, rng):  # a RandomMap: its numbers come from (seed, epoch, position)
    return {"x": r["x"] + np.float32(rng.random()), "y": r["y"]}


def slow(r):  # 1 ms a record: an actor's tasks are still in flight when it is killed
    time.sleep(0.001)
    return r


def loader(slowly=False, extra=(), **kw):
    source = jl.ArraySource({"x": np.arange(2000, dtype=np.float32).reshape(500, 4),
                             "y": np.arange(500)})
    return jl.DataLoader(source, batch_size=16, shuffle=True, seed=7, num_epochs=2,
                         transforms=[jl.RandomMap(noisy)] + [jl.Map(slow)] * slowly + [*extra],
                         process_index=0, process_count=1, **kw)


def same(a, b):
    return len(a) == len(b) and all(
        np.array_equal(x["x"], y["x"]) and np.array_equal(x["y"], y["y"]) for x, y in zip(a, b))


def in_process():
    with loader() as loaded:
        return list(loaded)


def live_actors(within_s=10.0):
    """The actors Ray's state still has alive, once those killed have had time to go."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [a for a in ray._private.state.actors().values() if a["State"] != "DEAD"]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def held_objects():
    """The objects this process holds references to in Ray's object store."""
    return set(ray._private.worker.global_worker.core_worker.get_all_reference_counts())


def check_the_same_batches_and_states_across_ray_and_local_workers(cluster, expected):
    held = held_objects()
    with loader(workers=RayWorkers(3, scheduling_strategy="SPREAD")) as on_ray:
        assert len({pid for pid in on_ray.worker_pids}) == 3
        it = iter(on_ray)
        made = [next(it) for _ in range(20)]
        ray_state = on_ray.state_dict()
        made += list(it)
        stats = on_ray.stats  # the actors' stage timings, sent with their tasks
        assert sum(w.batches for w in stats.workers) == len(expected)
        assert {w.pid for w in stats.workers if w.batches} == set(on_ray.worker_pids)
        assert stats.stages["RandomMap(noisy)"] > 0 and stats.records == 16 * len(expected)
        assert on_ray.diagnose().bottleneck in ("step", "workers", "source", "main", "device")
    assert same(made, expected)  # as in process, bit for bit
    del it, made
    assert not live_actors()  # close() left no actor behind
    assert held_objects() <= held  # nor an object (the maker, batches in flight)
    with loader(num_workers=2) as local:  # Ray -> local workers
        local.load_state_dict(ray_state)
        assert same(list(local), expected[20:])
        local.load_state_dict(ray_state)
        it = iter(local)
        [next(it) for _ in range(5)]
        local_state = local.state_dict()
    with loader(workers=RayWorkers(2)) as on_ray:  # local -> Ray
        on_ray.load_state_dict(local_state)
        assert same(list(on_ray), expected[25:])


def check_an_actor_killed_mid_run_loses_and_repeats_nothing(cluster, expected, caplog):
    with loader(slowly=True, workers=RayWorkers(3)) as on_ray:
        it = iter(on_ray)
        made = [next(it)]  # step 0, a task of its own; steps 1..32 are actor 1's, ~0.5 s of work
        os.kill(on_ray.worker_pids[1], signal.SIGKILL)  # steps in flight at it go to the others
        made += list(it)
        assert len(on_ray.worker_pids) == 2
        # (the lost actor is no idle one: in use for a time not counted, "busy only 43%: a
        # larger in_flight helps" was said of the one left, busy all its time; the Ray audit)
        assert all(w.in_use_s is None for w in on_ray.stats.workers)
    assert same(made, expected)
    # (its steps were made again, not found done); said with its node and Ray's reason (it
    # said "ActorDiedError" alone, and no node: the Ray audit)
    assert any(re.search(rf"Ray actor 1 {ON_NODE} is gone \(ActorDiedError: The actor is dead "
                         r"because its worker process has died", r.getMessage())
               for r in caplog.records), caplog.text


def check_a_node_removed_mid_run_loses_and_repeats_nothing(cluster, expected, caplog):
    node = cluster.add_node(num_cpus=1, resources={"any": 1})  # one actor here, one on the head
    cluster.wait_for_nodes()
    with loader(slowly=True, workers=RayWorkers(2, resources={"any": 1})) as on_ray:
        it = iter(on_ray)
        made = [next(it)]  # step 0; steps 1..32 are actor 1's, on the new node or the head
        cluster.remove_node(node)  # the actor there is gone with it, and its steps
        made += list(it)
        assert len(on_ray.worker_pids) == 1
    assert same(made, expected)
    assert any(re.search(rf"Ray actor \d {ON_NODE} is gone \(ActorDiedError: .*because its "
                         r"node has died", r.getMessage()) for r in caplog.records), caplog.text


def check_when_every_actor_is_gone_the_error_says_what_was_lost(cluster):
    with loader(workers=RayWorkers(1)) as on_ray:
        it = iter(on_ray)
        next(it)
        os.kill(on_ray.worker_pids[0], signal.SIGKILL)
        time.sleep(0.5)
        with pytest.raises(jl.WorkerError, match=rf"every Ray actor is gone \(the last: Ray "
                           rf"actor 0 {ON_NODE}, ActorDiedError: The actor is dead because .*\); "
                           r"steps \d+\.\.\d+ were in flight .* restore its last state"):
            list(it)


def dies_at_37(r):
    if r["y"] == 37:
        os.kill(os.getpid(), signal.SIGKILL)  # (a crash in native code, say)
    return r


def check_a_file_missing_on_an_actors_node_is_said_of_that_node(cluster, tmp_path):
    # a file the training process's machine has and an actor's node has not (the first thing
    # tried on a cluster) was "cannot read file ...: No such file", no node named (the Ray audit)
    paths, folder = [], tmp_path / "files"
    folder.mkdir()
    for i in range(8):
        paths.append(str(folder / f"{i}.bin"))
        open(paths[-1], "wb").write(bytes([i]))
    source = jl.FileListSource(paths)
    os.remove(paths[5])  # (as on a node that never had it)
    with jl.DataLoader(source, batch_size=4, workers=RayWorkers(1), process_index=0,
                       process_count=1) as on_ray:
        with pytest.raises(jl.WorkerError, match=rf"Ray actor 0 {ON_NODE} raised at step 1 .*"
                                                 r"cannot read file .*5\.bin.*; or this Ray "
                                                 r"actor's node \([\d.]+, node [0-9a-f]{8}\) "
                                                 r"has no such file: .* gs://"):
            list(on_ray)


def check_steps_that_kill_every_actor_making_them_are_named(cluster):
    source = jl.ArraySource({"y": np.arange(64)})
    with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(dies_at_37)],
                       workers=RayWorkers(3), process_index=0, process_count=1) as bad:
        with pytest.raises(jl.WorkerError, match=r"steps \d+\.\.\d+ \(step \d+ .*\) were being "
                                                 r"made by 3 Ray actors in turn, and each died "
                                                 r"\(the last: ActorDiedError: The actor is dead "
                                                 r"because its worker process has died"):
            list(bad)


def check_actors_the_cluster_cannot_place_are_said_not_waited_for(cluster, monkeypatch):
    with pytest.raises(jl.WorkerError, match=r"0 of the 1 actors it waits for started within "
                                             r"start_timeout_s=2 s; each asks \{'num_cpus': 64\}"
                                             r", and the cluster has \{'CPU': .*\} free .* of "
                                             r"\{'CPU': 3.0\}: ask for fewer actors"):
        loader(workers=RayWorkers(1, start_timeout_s=2, num_cpus=64))
    assert not live_actors()
    # a Ctrl-C as the loader waited for its actors was "an actor failed to start:
    # KeyboardInterrupt" (the Ray audit): raised as it is, the actors gone
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        loader(workers=RayWorkers(2))
    monkeypatch.undo()
    assert not live_actors()


def shard(i):  # a stream's shard: its records a function of i
    rng = np.random.default_rng(i)
    return ({"x": rng.random(4).astype(np.float32), "y": np.int64(1000 * i + j)}
            for j in range(200))


def short_shard(i):  # 24 records: a pass of 4 such shards is 24 steps of 4
    return ({"x": np.full(4, i, np.float32), "y": np.int64(100 * i + j)} for j in range(24))


def stream_loader(slowly=False, readers=4, shards=shard, extra=(), **kw):
    return jl.StreamLoader(jl.Stream.from_generator(shards, shards=4), batch_size=4, seed=3,
                           readers_per_process=readers,
                           transforms=[jl.RandomMap(noisy)] + [jl.Map(slow)] * slowly + [*extra],
                           process_index=0, process_count=1, **kw)


def check_a_stream_on_actors_is_the_stream_in_process_and_survives_a_lost_actor(cluster, caplog):
    def take(loader, n, state=None):
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        return [next(it) for _ in range(n)], loader.state_dict()

    with stream_loader() as plain:
        expected, _ = take(plain, 60)
    with stream_loader(workers=RayWorkers(2)) as on_ray:  # 2 actors, 2 readers each
        made, ray_state = take(on_ray, 20)
    assert same(made, expected[:20])
    with stream_loader(num_workers=4) as local:  # Ray -> local workers
        made, local_state = take(local, 20, ray_state)
    assert same(made, expected[20:40])
    caplog.clear()
    with stream_loader(slowly=True, workers=RayWorkers(2)) as on_ray:  # local -> Ray
        with pytest.warns(UserWarning, match=r"transforms\[1\]: saved none, now Map\(slow\)"):
            on_ray.load_state_dict(local_state)  # (a slow Map added: the same records)
        it = iter(on_ray)
        made = [next(it)]  # step 40; actor 1's tasks of odd steps are in flight (4 ms a step)
        os.kill(on_ray.worker_pids[1], signal.SIGKILL)
        made += [next(it) for _ in range(19)]
        assert len(on_ray.worker_pids) == 2  # a new actor hosts its readers
    assert same(made, expected[40:60])  # continued from the last batch received, exactly
    assert any("Ray actor 1" in r.getMessage() and "a new actor continues its readers" in
               r.getMessage() for r in caplog.records)
    with stream_loader(shards=short_shard, num_epochs=1) as plain:  # a pass: it ends
        expected = list(plain)
    # (10 ms a record: actor 1's last task, steps 5..23, is ~0.4 s of work when it is killed)
    with stream_loader(slowly=10, shards=short_shard, num_epochs=1,
                       workers=RayWorkers(2)) as on_ray:
        it = iter(on_ray)
        made = [next(it) for _ in range(4)]  # steps 1 and 3 from actor 1: its readers' states
        caplog.clear()
        os.kill(on_ray.worker_pids[1], signal.SIGKILL)  # ... and their pass's end go along
        made += list(it)
    assert len(made) == len(expected) == 24 and same(made, expected)
    assert any("a new actor continues its readers" in r.getMessage() for r in caplog.records)
    assert not live_actors()


def hangs_once(marker, r):  # the first actor to reach record 37 hangs there, no other
    if r["y"] == 37 and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(600)
    return r


def check_a_hung_actor_is_killed_after_timeout_s_and_its_steps_made_elsewhere(
        cluster, expected, caplog):
    hang = jl.Map(functools.partial(hangs_once, os.path.join(tempfile.mkdtemp(), "hung")))
    caplog.clear()
    with loader(extra=[hang], workers=RayWorkers(2, timeout_s=2),
                stall_warning_s=0.5) as on_ray:
        made = list(on_ray)
        assert len(on_ray.worker_pids) == 1
    assert same(made, expected)
    assert any("did not make steps" in r.getMessage() and "within timeout_s=2 s: killed" in
               r.getMessage() for r in caplog.records)
    # meanwhile the wait is said every stall_warning_s, as a local worker's (it was taken,
    # and a hung actor waited for without a word: the Ray audit)
    assert any(re.search(rf"no batch for [01]\.\d s: Ray actor \d {ON_NODE} is making "
                         r"steps? \d+", r.getMessage()) for r in caplog.records), caplog.text
    assert not live_actors()


def with_pid(r):  # which actor made a record
    return {**r, "pid": np.int64(os.getpid())}


def long_run(**kw):  # endless; 1 ms a record with Ray: ~16 ms a batch an actor
    source = jl.ArraySource({"x": np.arange(2000, dtype=np.float32).reshape(500, 4),
                             "y": np.arange(500)})
    extra = [jl.Map(slow), jl.Map(with_pid)] if "workers" in kw else []
    return jl.DataLoader(source, batch_size=16, shuffle=True, seed=7, num_epochs=None,
                         transforms=[jl.RandomMap(noisy), *extra], process_index=0,
                         process_count=1, **kw)


LONG = 600  # batches (~5 s or more on Ray) an actor has to come back or join in


def long_expected():
    with long_run() as plain:
        it = iter(plain)
        return [next(it) for _ in range(LONG + 20)]


def until_joined(loader, it, made, joined):
    """Takes batches until ``joined()`` (an actor has come), then 20 more; returns where it
    came (within ``LONG`` batches, or the check fails saying so)."""
    while not joined():
        assert len(made) < LONG, f"no actor joined within {LONG} batches: {loader.worker_pids}"
        made.append(next(it))
    came = len(made)
    made += [next(it) for _ in range(20)]
    return came


def makers(batches):
    return {int(pid) for b in batches for pid in b["pid"]}


def check_an_actor_placed_mid_run_takes_steps(cluster):
    expected = long_expected()
    cluster.add_node(num_cpus=1, resources={"late": 1})
    cluster.wait_for_nodes()
    with long_run(workers=RayWorkers(2, min_actors=1, task_bytes=1,
                                     resources={"late": 1})) as on_ray:
        assert len(on_ray.worker_pids) == 1  # the second waits for a node with "late"
        it = iter(on_ray)
        made = [next(it) for _ in range(10)]
        cluster.add_node(num_cpus=1, resources={"late": 1})  # as an autoscaler adds one
        came = until_joined(on_ray, it, made, lambda: len(on_ray.worker_pids) == 2)
    assert same(made, expected[:len(made)])
    assert len(makers(made[came + 4:])) == 2  # the new actor made steps


def check_an_actor_ray_restarts_takes_steps_again(cluster, caplog):
    caplog.set_level(logging.INFO, logger="jaxloader")
    expected = long_expected()
    with long_run(workers=RayWorkers(2, max_restarts=1, task_bytes=1)) as on_ray:  # a step
        it = iter(on_ray)  # a task: the actors take turns step by step
        made = [next(it) for _ in range(10)]
        killed = on_ray.worker_pids[1]
        os.kill(killed, signal.SIGKILL)
        came = until_joined(on_ray, it, made, lambda: len(on_ray.worker_pids) == 2 and
                            killed not in on_ray.worker_pids)  # Ray restarted it
    assert same(made, expected[:len(made)])
    assert len(makers(made[came + 4:])) == 2  # the restarted actor made steps again
    assert any("takes steps: 2 actor(s) now" in r.getMessage() for r in caplog.records)


def check_an_actor_ray_restarts_while_idle_is_seen_by_its_next_task(cluster, expected,
                                                                   caplog):
    caplog.set_level(logging.INFO, logger="jaxloader")
    caplog.clear()
    with loader(workers=RayWorkers(2, max_restarts=1)) as on_ray:
        killed = on_ray.worker_pids[1]
        os.kill(killed, signal.SIGKILL)  # no task in flight: the loader sees no error
        actor, deadline = on_ray._engine._actors[1], time.monotonic() + 60
        while True:  # until Ray runs it again (asked apart from the loader)
            try:
                if ray.get(actor.pid.remote(), timeout=10) != killed:
                    break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            assert time.monotonic() < deadline, "Ray did not restart the actor"
            time.sleep(0.1)
        made = list(on_ray)
        assert killed not in on_ray.worker_pids and len(on_ray.worker_pids) == 2
    assert same(made, expected)
    assert any(re.search(rf"Ray actor 1 {ON_NODE} was restarted by Ray: now pid \d+ on [\d.]+, "
                         r"node [0-9a-f]{8}$", r.getMessage()) for r in caplog.records), caplog.text


def fails_at_37(r):
    if int(r["y"]) == 37:
        raise ValueError("record 37 is bad")
    return r


def exits_at_37(r):
    if int(r["y"]) == 37:
        sys.exit(3)
    return r


def check_a_transform_error_comes_after_the_batches_before_it_with_its_traceback(cluster):
    # the task failed as a whole: 2 or 4 batches handed out (of the 9 before the step in
    # process and with local workers), the task's first step named, no traceback
    source = jl.ArraySource({"x": np.zeros((200, 2), np.float32), "y": np.arange(200)})

    def until_raised(transform):  # the batches made, and the error
        with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(transform)],
                           process_index=0, process_count=1, workers=RayWorkers(2)) as on_ray:
            made = []
            with pytest.raises(jl.WorkerError) as raised:
                for batch in on_ray:
                    made.append(batch)
            assert not live_actors()  # (broken: its actors gone before close(), as a local
        return made, raised  # pool's workers; they held the cluster's CPUs: the Ray audit)

    made, raised = until_raised(fails_at_37)
    said = str(raised.value)
    assert len(made) == 9 and "raised at step 9 " in said, (len(made), said)
    assert "ValueError: record 37 is bad" in said and "--- traceback in the actor ---" in said
    assert "in fails_at_37" in said and isinstance(raised.value.__cause__, jl.RecordError), said
    assert re.search(r'test_ray\.py", line \d+, in fails_at_37\n +raise ValueError', said), said
    # a transform's sys.exit() ended the actors, one after another, the step never named
    # (the Ray audit): raised at its step, as a local worker's
    made, raised = until_raised(exits_at_37)
    assert len(made) == 9 and "raised at step 9 " in str(raised.value), str(raised.value)
    assert "SystemExit: 3" in str(raised.value), str(raised.value)
    counts = []
    for kw in ({}, {"workers": RayWorkers(2)}):
        with stream_loader(readers=2, extra=[jl.Map(stream_fails)], **kw) as streamed:
            made = []
            with pytest.raises(jl.JaxloaderError) as raised:
                for batch in streamed:
                    made.append(batch)
            counts.append(len(made))
    assert counts[0] == counts[1] > 0, counts  # (on Ray: the batches of the task before)
    assert re.search(rf"Ray actor \d {ON_NODE} raised at stream step {counts[0]} ",
                     str(raised.value)), str(raised.value)


def stream_fails(r):
    if int(r["y"]) % 1000 == 9:  # (each shard's tenth record)
        raise ValueError("bad record")
    return r


def busy_2ms(r):
    began = time.perf_counter()
    while time.perf_counter() - began < 0.002:
        pass
    return r


def check_after_reset_stats_the_actors_timings_are_of_work_begun_since(cluster):
    # a task's timings come back with its batches: those of tasks made ahead before the
    # reset were counted in the window after it (an actor busy 30x the window's wall time)
    source = jl.ArraySource({"x": np.arange(4000)})
    with jl.DataLoader(source, batch_size=16, num_epochs=None, transforms=[jl.Map(busy_2ms)],
                       process_index=0, process_count=1, workers=RayWorkers(1)) as on_ray:
        it = iter(on_ray)
        for _ in range(3):
            next(it)
        time.sleep(1.0)  # the actor makes its tasks in flight meanwhile
        on_ray.reset_stats()
        for _ in range(20):  # (made before the reset)
            next(it)
        stats = on_ray.stats
        assert sum(w.busy_s for w in stats.workers) <= stats.wall_s + 0.05, stats
        for _ in range(150):  # past those: the actor's work since is counted
            next(it)
        stats = on_ray.stats
    busy = sum(w.busy_s for w in stats.workers)
    assert 0 < busy <= stats.wall_s + 0.05, stats


def check_the_actors_waits_for_a_core_are_counted_and_their_count_kept_at_close(cluster):
    # an actor's time waiting for a core was 0 (not read where it runs), so diagnose() took
    # three busy actors on this machine's two cores for transforms waiting on I/O, and
    # advised more actors; and after close it took the loader for one of num_workers=0
    source = jl.ArraySource({"x": np.arange(1184)})
    with jl.DataLoader(source, batch_size=16, num_epochs=1, transforms=[jl.Map(busy_2ms)],
                       process_index=0, process_count=1, workers=RayWorkers(3)) as on_ray:
        list(on_ray)
        stats = on_ray.stats
    assert sum(w.queued_s for w in stats.workers) > 0, stats
    assert all(w.queued_s <= w.busy_s - w.cpu_s + 1e-9 for w in stats.workers), stats
    assert on_ray.num_workers == on_ray.stats.num_workers == 3
    assert on_ray.diagnose().num_workers == 3


def check_what_cannot_go_to_the_actors_is_named(cluster):
    lock = threading.Lock()

    def uses_lock(r):
        with lock:
            return r

    with pytest.raises(jl.WorkerError, match=r"cannot send the transform Map\(.*uses_lock\).* "
                                             r"to Ray actors: .*make it picklable.* without "
                                             r"workers="):
        loader(extra=[jl.Map(uses_lock)], workers=RayWorkers(1))
    scratch = np.zeros(4, np.float32)  # (small: writable in the actor, as in a local worker)

    def writes(r):
        scratch[:] = r["x"]
        return r

    with loader(extra=[jl.Map(writes)], workers=RayWorkers(1)) as on_ray:
        assert len(list(on_ray)) == len(in_process())


# Ray starts its nodes' processes through subprocess (fork, then exec at once), which JAX's
# fork hook warns of once JAX has run in this test process
def sleepy(r):  # 50 ms a record: 0.2 s a batch of 4
    time.sleep(0.05)
    return r


def check_a_run_left_early_cancels_nothing_and_tasks_are_sized_by_time(cluster, monkeypatch):
    # Ray (2.60) stalled an actor 30 s on a cancelled queued task (a stream's new iter(), one
    # run in three), then took it for gone; and a new run waited for a whole task of 32 steps
    cancelled = []
    monkeypatch.setattr(ray, "cancel", lambda *a, **k: cancelled.append(a))
    source = jl.ArraySource({"y": np.arange(64)})
    with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(sleepy)], num_epochs=None,
                       workers=RayWorkers(1), process_index=0, process_count=1) as on_ray:
        for _ in range(2):
            it = iter(on_ray)
            [next(it) for _ in range(3)]
            del it  # (left early)
        assert 1 <= on_ray._engine._steps <= 2  # 0.5 s of 0.2 s steps (by bytes: 32)
    with stream_loader(slowly=True, workers=RayWorkers(2)) as on_ray:
        for _ in range(2):
            it = iter(on_ray)
            [next(it) for _ in range(3)]
            del it
    assert cancelled == []


def scaled(r):  # a config read from the command line, as a module parsing it when imported
    try:  # (and the trainer's recursion limit, and its warning filters: "error" on this one)
        warnings.warn("a deprecated path")
        said = 0
    except UserWarning:
        said = 1
    info = jl.get_worker_info()  # (None in an actor: it was taken for the training process;
    return {"x": r["x"] * np.float32(sys.argv[-1]), "y": r["y"],  # the parity audit)
            "limit": np.int64(sys.getrecursionlimit()), "raised": np.int64(said),
            "here": np.int64(os.path.exists("noisy_on_ray.py")),  # (a relative path)
            "worker": np.int64(-1 if info is None else info.id),
            "workers": np.int64(-1 if info is None else info.num_workers),
            "seed": np.int64(-1 if info is None else info.seed)}


def check_actors_see_the_training_scripts_argv(cluster, monkeypatch, tmp_path):
    # an actor's sys.argv was Ray's worker's: a config parsed from it got its defaults (or
    # Ray's flags), silently, as a local worker's did before it was given the trainer's; its
    # recursion limit was Python's 1,000 (a script's setrecursionlimit for a deep transform:
    # RecursionError on Ray alone), and the trainer's warning filters were not there. Those
    # filters are not the actor's as it imports a transform's module: one that warns as it is
    # imported (said in the trainer, before "error" was set) broke every actor (a review's)
    (tmp_path / "noisy_on_ray.py").write_text(
        "import warnings\nwarnings.warn('optional C extension not found')\n"
        "def same(r):\n    return r\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # (after ray.init(): an actor ran in the folder of that call,
    with warnings.catch_warnings():  # a transform's relative path read another file or none)
        warnings.simplefilter("ignore")
        import noisy_on_ray
    monkeypatch.setattr(sys, "argv", ["train.py", "--scale", "10"])
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(4321)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="a deprecated path|optional C extension")
            with jl.DataLoader(jl.ArraySource({"x": np.ones(8, np.float32),
                                               "y": np.arange(8)}), batch_size=4,
                               transforms=[jl.Map(noisy_on_ray.same), jl.Map(scaled)],
                               workers=RayWorkers(1), seed=11,
                               process_index=0, process_count=1) as on_ray:
                batch = next(iter(on_ray))
    finally:
        sys.setrecursionlimit(before)
    assert batch["x"].tolist() == [10.0] * 4
    assert batch["limit"].tolist() == [4321] * 4 and batch["raised"].tolist() == [1] * 4
    assert batch["here"].tolist() == [1] * 4
    assert (batch["worker"].tolist(), batch["workers"].tolist(), batch["seed"].tolist()) == (
        [0] * 4, [1] * 4, [11] * 4)


def check_a_close_from_another_thread_says_the_loader_was_closed(cluster):
    for make in (lambda: loader(slowly=True, workers=RayWorkers(2)),
                 lambda: stream_loader(slowly=True, workers=RayWorkers(2))):
        closing = make()
        it = iter(closing)
        next(it)
        threading.Timer(0.3, closing.close).start()
        with pytest.raises(jl.JaxloaderError, match="the loader was closed|is closed; create "
                                                    "a new one") as info:  # (inside a next(),
            while True:  # or between two) (a DataLoader's said every actor was gone, a
                next(it)  # StreamLoader's raised IndexError from the actors close() emptied)
        assert not isinstance(info.value, jl.WorkerError)
    assert not live_actors()


def check_an_array_changed_after_the_actors_copied_it_is_warned_of(cluster):
    # the actors read the copy they took, the training process the array as it is now: the
    # batches differ from num_workers=0's (and peek()'s from next()'s), warned of with local
    # workers, not with Ray actors (the Ray audit); in the blob (8 KB) and out of it (2.4 MB)
    for n in (1000, 300_000):
        labels = np.arange(n)
        with jl.DataLoader(jl.ArraySource({"y": labels}), batch_size=8, num_epochs=1,
                           process_index=0, process_count=1,
                           workers=RayWorkers(1)) as on_ray:
            next(iter(on_ray))
            labels[:] = -1
            with pytest.warns(jl.JaxloaderWarning, match="the source the workers copied as the "
                                                         "loader started"):
                assert next(iter(on_ray))["y"][:3].tolist() == [8, 9, 10]


def check_a_reconnect_within_a_second_is_a_session_gone(cluster):
    # ray.shutdown() and ray.init() again within SESSION_S: the next batch was Ray's bare
    # Exception ("Can't find actor ... different cluster"), not the session's error (the Ray
    # audit; a reconnect after a second was said)
    on_ray = loader(workers=RayWorkers(1))
    it = iter(on_ray)
    next(it)
    ray.shutdown()
    ray.init(address=cluster.address, log_to_driver=False)
    with pytest.raises(jl.WorkerError, match="the Ray session this loader's actors ran in is "
                                             "gone"):
        next(it)
    on_ray.close()


@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_ray_workers_on_a_cluster_of_three_nodes(cluster, caplog, monkeypatch, tmp_path):
    """One test, one simulated cluster (its start is most of the cost: CI's 20 minutes)."""
    expected = in_process()
    check_the_same_batches_and_states_across_ray_and_local_workers(cluster, expected)
    check_an_actor_killed_mid_run_loses_and_repeats_nothing(cluster, expected, caplog)
    check_a_node_removed_mid_run_loses_and_repeats_nothing(cluster, expected, caplog)
    check_when_every_actor_is_gone_the_error_says_what_was_lost(cluster)
    check_steps_that_kill_every_actor_making_them_are_named(cluster)
    check_a_file_missing_on_an_actors_node_is_said_of_that_node(cluster, tmp_path)
    check_actors_the_cluster_cannot_place_are_said_not_waited_for(cluster, monkeypatch)
    check_a_stream_on_actors_is_the_stream_in_process_and_survives_a_lost_actor(cluster, caplog)
    check_an_actor_ray_restarts_takes_steps_again(cluster, caplog)
    check_an_actor_ray_restarts_while_idle_is_seen_by_its_next_task(cluster, expected, caplog)
    check_an_actor_placed_mid_run_takes_steps(cluster)
    check_a_hung_actor_is_killed_after_timeout_s_and_its_steps_made_elsewhere(
        cluster, expected, caplog)
    check_a_transform_error_comes_after_the_batches_before_it_with_its_traceback(cluster)
    check_what_cannot_go_to_the_actors_is_named(cluster)
    check_after_reset_stats_the_actors_timings_are_of_work_begun_since(cluster)
    check_the_actors_waits_for_a_core_are_counted_and_their_count_kept_at_close(cluster)
    check_a_close_from_another_thread_says_the_loader_was_closed(cluster)
    check_actors_see_the_training_scripts_argv(cluster, monkeypatch, tmp_path)
    check_a_run_left_early_cancels_nothing_and_tasks_are_sized_by_time(cluster, monkeypatch)
    check_an_array_changed_after_the_actors_copied_it_is_warned_of(cluster)
    check_a_reconnect_within_a_second_is_a_session_gone(cluster)


def bookkeeping(spec):
    """A RayEngine of ``spec.n`` actors, its bookkeeping alone: no actor, no cluster."""
    from jaxloader.ray import RayEngine

    class Engine(RayEngine):
        def __init__(self):
            self._alive, self._pids = list(range(spec.n)), [7 + i for i in range(spec.n)]
            self._nodes = ["10.0.0.2, node 0316a2f4"] * spec.n
            self._pending, self._killed, self._spec, self._turn = {}, {}, spec, 0
            self._location = "a source".format

        def cancel_actor(self, actor):
            pass

        def _submit(self, first, count):
            actor = self._alive[self._turn % len(self._alive)]
            self._turn += 1
            return first, count, actor, None

    return Engine()


def test_an_actor_lost_is_charged_each_of_its_tasks_in_flight():
    """An actor killed making steps 6..15 while its earlier task, finished, came back lost
    with it (its reply not sent: seen 1 run in 6 on the cluster above): 6..15 is charged too,
    so the third actor that dies making it names it (it was charged the earlier task alone,
    and the loader said every actor was gone instead)."""
    engine, died = bookkeeping(RayWorkers(3)), RuntimeError("died")
    flight = deque([(3, 1, 0, None), (4, 1, 1, None), (6, 10, 0, None)])
    engine._lose(0, died, flight)  # step 3 came back lost with actor 0, which made 6..15
    assert [(first, owner) for first, _, owner, _ in flight] == [(3, 1), (4, 1), (6, 2)]
    flight.popleft(), flight.popleft()  # steps 3 and 4 made by actor 1
    engine._lose(2, died, flight)  # 6..15 goes to actor 1
    with pytest.raises(jl.WorkerError, match=r"^steps 6\.\.15 \(a source\) were being made by "
                                             r"3 Ray actors in turn, and each died"):
        engine._lose(1, died, flight)  # (^: it alone; step 3, made, was charged no more)
    hung = bookkeeping(RayWorkers(3))  # one killed after timeout_s: charged the task it did
    # not finish alone
    hung._lose(0, TimeoutError(), deque([(3, 1, 0, None), (6, 10, 0, None)]), hung=True)
    assert hung._killed == {3: 1}


def test_steps_that_every_actor_of_fewer_than_three_did_not_make_in_time_are_named():
    """Two actors, each killed after timeout_s on the same steps: the loader said "every Ray
    actor is gone ... check the cluster's nodes and memory", not the steps and timeout_s."""
    class GetTimeoutError(Exception):  # (named as Ray's)
        pass

    engine, hung = bookkeeping(RayWorkers(2, timeout_s=3)), GetTimeoutError()
    flight = deque([(4, 8, 0, None), (12, 8, 1, None)])
    engine._lose(0, hung, flight, hung=True)
    with pytest.raises(jl.WorkerError, match=r"^steps 4\.\.11 \(a source\) were being made by 2 "
                                             r"Ray actors in turn, and none finished them "
                                             r"within timeout_s=3 s .* raise timeout_s"):
        engine._lose(1, hung, flight, hung=True)
    closed = bookkeeping(RayWorkers(2))  # a close() from another thread: not a death
    closed._closed = True
    with pytest.raises(jl.JaxloaderError, match="the loader was closed"):
        closed._lose(0, RuntimeError("killed"), deque([(4, 8, 0, None)]))


def test_an_actor_ray_restarted_on_another_node_with_the_same_pid_is_named_by_it(caplog):
    # (the review) a restart was told by the pid alone: one on another node with the same pid
    # (each container numbers its own) left every later message naming the dead node
    from jaxloader.base.timings import Gauges

    engine = bookkeeping(RayWorkers(1))
    engine.gauges = Gauges(1, counted=False)
    caplog.set_level(logging.INFO, logger="jaxloader")
    engine.made_by(0, (7, "10.0.0.3, node 5679ee89"), (0.0, 0.0, 0.0))  # (begun before reset)
    assert engine.who(0) == "Ray actor 0 (pid 7 on 10.0.0.3, node 5679ee89)"
    assert "Ray actor 0 (pid 7 on 10.0.0.2, node 0316a2f4) was restarted by Ray: now pid 7 on " \
        "10.0.0.3, node 5679ee89" in caplog.text


def test_rays_reasons_are_said_short_with_what_they_name():
    # (the review) Ray's memory monitor's kill escaped as a bare OutOfMemoryError, its steps
    # not made elsewhere; an actor whose start raised was said by its traceback's head, cut
    # before the error; Ray's memory message lost its first line, which names the node
    from jaxloader.ray_tasks import lost_errors, lost_reason

    assert ray.exceptions.OutOfMemoryError in lost_errors(ray)

    class ActorDiedError(Exception):
        _actor_init_failed = True

    init = ActorDiedError("The actor died because of an error raised in its creation task, "
                          "ray::MakerActor.__init__() (pid=7, ip=10.0.0.2)\n" + "  File "
                          "x.py, line 3, in f\n    ^^^^^^^^\n" * 40 + "FileNotFoundError: "
                          "[Errno 2] No such file or directory: '/data/vocab.json'\n")
    said = lost_reason(init)
    assert said.startswith("ActorDiedError: The actor died because of an error raised in its "
                           "creation task") and said.endswith("No such file or directory: "
                                                              "'/data/vocab.json'"), said
    memory = RuntimeError("2 worker(s) were killed due to the node running low on memory. "
                          "Memory on the node (IP: 10.0.0.2, ID: 8ceff4) was 3.54GB used / "
                          "23.54GB limit\nOOM kill reason: Memory usage exceeded threshold")
    assert lost_reason(memory).startswith("RuntimeError: 2 worker(s) were killed due to the node "
                                          "running low on memory. Memory on the node (IP: "
                                          "10.0.0.2")
    assert lost_reason(RuntimeError("\x1b[31mred\x1b[0m")) == "RuntimeError: red"


def test_a_close_that_lands_while_an_actor_is_dropped_or_replaced_says_so():
    """A close() from another thread landing inside _lose (the last actor dropped) said
    "every Ray actor is gone ... check the cluster's nodes"; inside a stream's restart_actor,
    IndexError, or "no new one started within 120 s ... add nodes" (the sixth review)."""
    from types import SimpleNamespace

    from jaxloader.ray_streams import restart_actor

    engine = bookkeeping(RayWorkers(1))
    engine.cancel_actor = lambda actor: setattr(engine, "_closed", True)  # (close() lands)
    with pytest.raises(jl.JaxloaderError, match="the loader was closed") as raised:
        engine._lose(0, RuntimeError("killed"), deque([(4, 8, 0, None)]))
    assert not isinstance(raised.value, jl.WorkerError)
    killed = []

    class Made:
        where = SimpleNamespace(remote=lambda: "where")

    def stream_engine(close_in):
        fake = SimpleNamespace(_closed=False, _actors=["lost"], _pids=[1], _nodes=["a"],
                               _maker_ref=None, cancel_actor=lambda actor: None)

        def close():
            fake._closed, fake._actors = True, []

        def get(ref, timeout):
            if close_in == "get":
                close()
                raise RuntimeError("actor died")  # (killed by close())
            if close_in == "init":  # (its start raised: not the cluster's room; the review)
                raise type("ActorDiedError", (Exception,), {"_actor_init_failed": True})(
                    "The actor died because of an error raised in its creation task\n"
                    "FileNotFoundError: vocab.json")
            return 9, "10.0.0.2, node 0316a2f4"

        def remote(*args):
            if close_in == "remote":
                close()
            return Made()

        fake._ray = SimpleNamespace(get=get, kill=lambda a, no_restart: killed.append(a),
                                    available_resources=dict)
        fake._spec, fake._remote = RayWorkers(1), SimpleNamespace(remote=remote)
        return fake

    for close_in in ("remote", "get"):
        with pytest.raises(jl.JaxloaderError, match="the loader was closed") as raised:
            restart_actor(stream_engine(close_in), 0, "steps 4..7 are not made")
        assert not isinstance(raised.value, jl.WorkerError)
    assert len(killed) == 1 and isinstance(killed[0], Made)  # (the new actor: not left on)
    # (its start raised at once: "no new one started within 120 s", and worker_init_fn in the
    # remedy, which a loader on Ray refuses: the Ray audit)
    with pytest.raises(jl.WorkerError, match=r"its replacement failed to start \(ActorDiedError: "
                                             r"The actor died because of an error raised in its "
                                             r"creation task ... FileNotFoundError: vocab.json\); "
                                             r"steps 4..7 are not made; fix what its start "
                                             r"raised \(the source's or a transform's unpickling: "
                                             r"a module not on its node.*, then create a new "
                                             r"loader") as raised:
        restart_actor(stream_engine("init"), 0, "steps 4..7 are not made")
    assert "worker_init_fn" not in str(raised.value)
    running = stream_engine(None)
    restart_actor(running, 0, "")
    assert isinstance(running._actors[0], Made) and running._pids == [9]
    assert running._nodes == ["10.0.0.2, node 0316a2f4"]


def test_a_task_waits_timeout_s_for_itself_and_each_task_its_actor_runs_before_it():
    """A lost actor's tasks go behind a survivor's own; a run left early leaves tasks Ray
    runs anyway: the clock of ``timeout_s`` counted them as the task's own time, and healthy
    actors were killed as hung until none was left."""
    from jaxloader.ray_tasks import TaskQueues

    class Ray:  # what wait_s asks of Ray: which tasks are done
        done: set = set()

        def wait(self, refs, num_returns, timeout):
            return [r for r in refs if r in self.done], [r for r in refs if r not in self.done]

    ray, queues = Ray(), TaskQueues(2)
    old, own, lost = (queues.sent(0, name) for name in ("cancelled", "own", "lost's"))
    assert queues.wait_s(ray, 10, 0, old) == 10 and queues.wait_s(ray, 10, 0, lost) == 30
    ray.done = {old}  # (the cancelled one ran and is done)
    assert queues.wait_s(ray, 10, 0, lost) == 20
    queues.received(0, own)
    assert queues.wait_s(ray, 10, 0, lost) == 10 and queues.wait_s(ray, 10, 1, "none") == 10
    assert queues.wait_s(ray, None, 0, lost) is None


def test_the_results_of_tasks_a_run_left_early_are_let_go_once_done():
    """A run left early (a break, a restore, a stream's pass, which sends past its end) drops
    its tasks, and Ray runs them: their queue entries, which held their results in the object
    store (1,121 MB spilled after 8 runs of 2 batches, the Ray audit), went only at close().
    A task done leaves the queue as the next is sent; one received takes those its actor ran
    before it."""
    from jaxloader.ray_tasks import TaskQueues

    class Ray:
        done: set = set()

        def wait(self, refs, num_returns, timeout):
            return [r for r in refs if r in self.done], [r for r in refs if r not in self.done]

    ray = Ray()
    queues = TaskQueues(2, ray)
    for name in ("a0", "a1", "a2"):
        queues.sent(0, name)
    queues.sent(1, "b0")
    ray.done = {"a0", "b0"}
    queues.sent(1, "b1")
    assert queues._queued == [{"a1": 2, "a2": 3}, {"b1": 5}]
    queues.received(0, "a2")  # (it ran a1 before it)
    assert queues._queued == [{}, {"b1": 5}]


def test_a_loader_used_after_ray_shutdown_says_its_session_is_gone():
    """After ray.shutdown() (a notebook's cell), the next batch started a new local cluster
    (Ray's own ray.init() at the actor's call) and failed there after seconds, a bare
    Exception ("Can't find actor ... different cluster"), and close() started one too, left
    running (the Ray audit)."""
    kept = builtins.print, {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    environment = dict(os.environ)  # (a local Ray sets PYTHONBREAKPOINT to its own debugger
    try:  # here, which this process's later tests' scripts then inherited)
        ray.init(address="local", num_cpus=1, include_dashboard=False,  # (its own, not the
                 log_to_driver=False)  # cluster another test's process runs meanwhile)
        with loader(workers=RayWorkers(1, num_cpus=None)) as unset:  # (Ray's own default:
            next(iter(unset))  # float(None) raised, the actors left running: the review)
        on_ray = loader(workers=RayWorkers(1))
        it = iter(on_ray)
        next(it)
        ray.shutdown()
        for again in (lambda: next(it), lambda: next(iter(on_ray))):
            with pytest.raises(jl.WorkerError, match=r"the Ray session this loader's actors ran "
                                                     r"in is gone \(ray.shutdown\(\) since"):
                again()
        on_ray.close()
        assert not ray.is_initialized()
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(environment)
        builtins.print = kept[0]
        for number, handler in kept[1].items():
            signal.signal(number, handler)


def test_a_ray_shutdown_on_another_thread_during_a_wait_is_a_worker_error_not_an_exit():
    # Ray's get raises SystemExit(0) as ray.shutdown() runs on another thread: the training
    # script ended with status 0 and no word (the Ray audit); a process's own exit goes on
    from jaxloader import ray_tasks

    class Gone:
        initialized = False

        def get(self, ref, timeout=None):
            raise SystemExit(0)

        def is_initialized(self):
            return self.initialized

    gone = Gone()
    with pytest.raises(jl.WorkerError, match=r"the Ray session this loader's actors ran in is "
                                             r"gone \(ray.shutdown\(\) since"):
        ray_tasks.get(gone, object(), None, None, str)
    gone.initialized = True
    with pytest.raises(SystemExit):
        ray_tasks.get(gone, object(), None, None, str)
    gone.initialized = False  # (a signal handler's sys.exit(3) after its ray.shutdown(): an
    gone.get = lambda ref, timeout=None: sys.exit(3)  # exit, not an input error: the review)
    with pytest.raises(SystemExit, match="3"):
        ray_tasks.get(gone, object(), None, None, str)


def test_an_actor_that_cannot_import_a_module_is_told_how_to_ship_it():
    # Ray's bare traceback ended in "No module named 'augmod'", no remedy (the Ray audit)
    from jaxloader.ray_tasks import start_failed

    error = start_failed(ray, RayWorkers(1), RuntimeError(
        "ActorDiedError: ... ModuleNotFoundError: No module named 'augmod.crops'"), 0)
    assert re.search(r"an actor failed to start: RuntimeError: .*No module named 'augmod.crops'"
                     r"\n\(the module 'augmod.crops' .* is not on the actor's node: install it "
                     r"there, or ship it, RayWorkers\(n, runtime_env=\{'py_modules': \[augmod\]"
                     r"\}\)", str(error)), str(error)


def test_bad_ray_workers_arguments_are_refused():
    with pytest.raises(jl.ConfigError, match=r"RayWorkers\(n=...\): expected an int >= 1"):
        RayWorkers(0)
    assert repr(RayWorkers(4, num_cpus=2)) == "RayWorkers(4, in_flight=2, num_cpus=2)"
    assert repr(RayWorkers(1, task_bytes=1 << 20)) == ("RayWorkers(1, in_flight=2, "
                                                       "task_bytes=1048576)")
    with pytest.raises(jl.ConfigError, match=r"RayWorkers\(task_bytes=...\): expected an int"):
        RayWorkers(1, task_bytes=0)
    with pytest.raises(jl.ConfigError, match="with num_workers=0"):
        loader(workers=RayWorkers(1), num_workers=2)
    with pytest.raises(jl.ConfigError, match="no worker_init_fn, timeout_s"):
        loader(workers=RayWorkers(1), timeout_s=5)
    for given in ({"prefetch": 8}, {"start_method": "fork"}):  # (taken, to no effect: the
        with pytest.raises(jl.ConfigError, match=r"prefetch or start_method .*in_flight"):
            loader(workers=RayWorkers(1), **given)  # parity audit)
        with pytest.raises(jl.ConfigError, match=r"prefetch or start_method"):
            stream_loader(workers=RayWorkers(1), **given)
    with pytest.raises(jl.ConfigError, match=r"readers_per_process: expected a multiple of "
                                             r"RayWorkers\(n\) \(2\), got 3"):
        stream_loader(workers=RayWorkers(2), readers=3)
    with pytest.raises(jl.ConfigError, match="hosted by all n actors from its start"):
        stream_loader(workers=RayWorkers(2, min_actors=1))
    with pytest.raises(jl.ConfigError, match="continuing its readers .* leave max_restarts out"):
        stream_loader(workers=RayWorkers(2, max_restarts=1))
    with pytest.raises(jl.ConfigError, match=r"RayWorkers\(min_actors=...\): expected an int"):
        RayWorkers(2, min_actors=3)
    assert repr(RayWorkers(2, min_actors=1)) == "RayWorkers(2, in_flight=2, min_actors=1)"
    assert repr(RayWorkers(2, timeout_s=30)) == "RayWorkers(2, in_flight=2, timeout_s=30)"
    with pytest.raises(jl.ConfigError, match=r"timeout_s=...\): expected seconds > 0"):
        RayWorkers(2, timeout_s=0)
    for bad in ({"start_timeout_s": None}, {"start_timeout_s": -5}, {"timeout_s": "30"},
                {"timeout_s": float("inf")}):  # (inf: taken, where DataLoader refuses it)
        with pytest.raises(jl.ConfigError, match=r"_s=...\): expected seconds > 0"):
            RayWorkers(2, **bad)  # (a bare TypeError, or accepted)
    assert RayWorkers(2, timeout_s=np.float32(30)).timeout_s == 30.0  # (a config's: refused)
    assert repr(RayWorkers(2, start_timeout_s=30)) == "RayWorkers(2, in_flight=2, " \
        "start_timeout_s=30)"
    for threads in ({"max_concurrency": 4}, {"concurrency_groups": {"io": 2}}):
        with pytest.raises(jl.ConfigError, match=r"runs one task at a time"):
            RayWorkers(2, **threads)  # (a stream's batches came out wrong without a word)
