"""A ``StreamLoader``'s run on Ray actors (``jaxloader.ray``): each actor hosts readers, as a
local worker does.

::

    n actors = n hosts; host w: readers w, w + n, ... of this process's R (n divides R);
    it makes steps s = w (mod n) (step s: reader s mod R's next batch)
      actor.make_stream.remote(first, count, n, reset)   tasks of a host, in order; its first
                                                          task in a run carries ``reset``
      ray.get in step order <── [(batch, reader state after it), ...]
    an actor lost (SIGKILL, its node gone): a new actor for its host, reset from the states
    after that host's last batch received, makes its tasks in flight again, in order

A stream's batches are a function of the readers' states, so a host's batches made again from
the states of its last batch received are the same batches: nothing is lost or repeated.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Generator

from jaxloader.base import tree as tree_lib
from jaxloader.base.errors import ConfigError, WorkerError
from jaxloader.ray_actor import actor_arguments
from jaxloader.ray_tasks import (TASK_SECONDS, check_session, gone, lost_errors, lost_reason,
                                 steps_text, task_steps)
from jaxloader.workers.failures import closed

log = logging.getLogger("jaxloader")
KILLS_PER_TASK = 3  # actors lost in turn making the same steps: those steps are the cause


def stream_batches(engine: Any, start: int, stop: int | None, resets: list,
                   reports: dict | None) -> Generator[Any, None, None]:
    """The batches of steps ``start``, ``start + 1``, ... of a stream whose readers the
    engine's actors host (``resets[w]``: host ``w``'s readers' states, continued from);
    ``reports[step]``: the state of step's reader after its batch, filed as it is handed out."""
    ray, spec = engine._ray, engine._spec
    hosts = len(resets)
    if hosts != len(engine._actors):
        raise ConfigError(f"{spec!r}: a stream's run over {hosts} hosts, expected one a Ray "
                          f"actor ({len(engine._actors)})")
    readers = sum(len(r) for r in resets)
    held = [list(r) for r in resets]  # each host's readers' states after its last task got
    flight: list[deque] = [deque() for _ in range(hosts)]  # (first, count, ref) a host
    next_for = [start + (w - start) % hosts for w in range(hosts)]  # its next step to send
    sent_reset = [False] * hosts
    ready: dict[int, tuple] = {}
    failures: dict[int, tuple] = {}  # a step that raised in its actor: (actor, Failed)
    killed: dict[tuple[int, int], int] = {}
    lost = lost_errors(ray)
    next_yield = start
    try:
        while stop is None or next_yield < stop:
            for w in range(hosts):  # each host, in_flight tasks ahead
                while len(flight[w]) < spec.in_flight and (stop is None or next_for[w] < stop):
                    most = engine._steps or 1
                    left = most if stop is None else len(range(next_for[w], stop, hosts))
                    count = min(most, left)
                    reset = None if sent_reset[w] else held[w]
                    sent_reset[w] = True
                    actors = engine._actors  # (close() from another thread empties it anew)
                    if engine._closed or w >= len(actors):  # (an IndexError, not "closed")
                        raise closed()
                    check_session(ray, engine._session)
                    flight[w].append((next_for[w], count, engine.tasks.sent(
                        w, actors[w].make_stream.remote(next_for[w], count, hosts, reset,
                                                        engine.gauges.trace))))
                    next_for[w] += count * hosts
            if next_yield in failures:  # (the batches before it handed out)
                engine.raise_failed(*failures[next_yield])
            if next_yield in ready:
                batch, report = ready.pop(next_yield)
                if reports is not None:
                    reports[next_yield] = report
                next_yield += 1
                yield batch
                del batch
                continue
            w = next_yield % hosts
            first, count, ref = flight[w][0]
            try:
                made = engine.get(w, ref, steps_text(first, count, hosts))
            except lost as e:
                _replace(engine, w, e, flight[w], held[w], hosts, killed)
                continue
            except ray.exceptions.GetTimeoutError as e:
                engine.hung(w, steps_text(first, count, hosts))
                _replace(engine, w, e, flight[w], held[w], hosts, killed)
                continue
            except ray.exceptions.RayTaskError as e:
                engine.raise_task_error(w, first, count, e, stride=hosts)
            flight[w].popleft()
            engine.tasks.received(w, ref)
            made, timings, where, failed = made
            engine.made_by(w, where, timings)
            if failed is not None:
                failures[failed.step] = (w, failed)
            if made:  # each task back sizes the next ones
                engine._steps = task_steps(tree_lib.flatten(made[0][0])[0], spec.task_bytes,
                                           timings[0] / len(made))
            for k, (batch, report) in enumerate(made):
                step = first + k * hosts
                ready[step] = (batch, report)
                j = (step % readers) // hosts
                until = held[w][j].get("until")  # (a pass's end: the loader's, not a report's)
                held[w][j] = report if until is None else {**report, "until": until}
            del made
    finally:
        for refs in flight:  # a run left early (a restore, a break): its tasks are dropped,
            refs.clear()  # not cancelled (Ray may stall an actor 30 s on a cancelled one)


def lost_in_turn(steps: str, where: str, error: BaseException, timeout_s: float | None,
                 actors: int = KILLS_PER_TASK) -> WorkerError:
    """The error for steps that ``actors`` in turn (``KILLS_PER_TASK``, or all of them) did
    not make: each died making them, or none made them within ``timeout_s``."""
    made_by = (f"{steps} ({where}) were being made by {actors} Ray actor"
               f"{'s in turn' if actors > 1 else ''}, and")
    if type(error).__name__ == "GetTimeoutError":
        return WorkerError(
            f"{made_by} none finished them within timeout_s={timeout_s:g} s (a task is up to "
            f"{TASK_SECONDS:g} s of steps, at most 32): raise timeout_s, or find what hangs "
            "by making those steps with num_workers=0")
    return WorkerError(
        f"{made_by} each died (the last: {lost_reason(error)}): something in making them "
        "ends the process (native code in a transform, memory); run those steps with "
        "num_workers=0 to see the error")


def _replace(engine: Any, w: int, error: BaseException, flight: deque, held: list,
             hosts: int, killed: dict) -> None:
    """Host ``w``'s actor is gone: a new one, reset from the states after that host's last
    batch received, is sent its tasks in flight again, in order."""
    first = flight[0][0]
    killed[(w, first)] = killed.get((w, first), 0) + 1
    # all its steps in flight, one run of the host's (which task it was making is not known:
    # one it finished may come back lost with it, its reply not yet sent)
    steps = steps_text(first, sum(count for _, count, _ in flight), hosts)
    if engine._closed:  # (by close() from another thread: not a death)
        raise closed() from error
    if killed[(w, first)] >= KILLS_PER_TASK:  # the steps, not the actors, are the cause
        raise lost_in_turn(steps, engine._location(first), error,
                           engine._spec.timeout_s) from error
    log.warning("%s is gone (%s); a new actor continues its readers from its last batch "
                "received, %s", engine.who(w), lost_reason(error), steps)
    restart_actor(engine, w, f"{steps} were in flight and are not made")
    actors = engine._actors  # (close() from another thread empties it anew)
    if engine._closed or w >= len(actors):
        raise closed() from error
    check_session(engine._ray, engine._session)
    for i, (first, count, ref) in enumerate(list(flight)):
        flight[i] = (first, count, engine.tasks.sent(w, actors[w].make_stream.remote(
            first, count, hosts, held if i == 0 else None, engine.gauges.trace)))

def restart_actor(engine: Any, actor: int, lost: str) -> None:
    """A new actor in ``actor``'s place (a stream's host: its readers' place); ``lost`` says
    what is lost if none starts within ``start_timeout_s``."""
    ray, spec = engine._ray, engine._spec
    engine.cancel_actor(actor)
    actors = engine._actors  # (close() from another thread empties it anew: said as closed,
    made = engine._remote.remote(engine._maker_ref,
                                 *actor_arguments(actor, spec.n, spec.actor_options))  # (the
    if actor < len(actors):  # new actor killed, whether close() came before or after this)
        actors[actor] = made
    if engine._closed or actor >= len(actors):
        ray.kill(made, no_restart=True)
        raise closed()
    try:
        engine._pids[actor], engine._nodes[actor] = ray.get(made.where.remote(),
                                                            timeout=spec.start_timeout_s)
    except SystemExit as e:  # (Ray shut down on another thread as it waited)
        raise gone(ray, e) or e from None
    except Exception as e:
        if engine._closed:  # (killed by close() as it started: not the cluster's doing)
            raise closed() from e
        failed = getattr(e, "_actor_init_failed", False)  # (its start raised: at once)
        remedy = ("fix what its start raised (the source's or a transform's unpickling: a "
                  "module not on its node, docs/workers.md \"What crosses\")" if failed else
                  f"the cluster has {ray.available_resources()} free: add nodes")
        raise WorkerError(
            f"Ray actor {actor} is gone and " + ("its replacement failed to start" if failed
                                                  else "no new one started within "
                                                  f"{spec.start_timeout_s:.0f} s")
            + f" ({lost_reason(e)}); {lost}; {remedy}, then create a new loader (or restore "
            "its last state into one)") from e
