"""Workers on other machines through Ray: ``DataLoader(..., workers=RayWorkers(n))``.

::

    training process                                   Ray actors (any node), n of them
      ray.put(batch maker)  ── once, in the object store ──> each actor holds the maker
      steps s..s+k ──> actor.make.remote(s, k)  (a task: k steps, one object; in_flight
                                                tasks an actor ahead, round robin)
      ray.get(ref) in step order <── the batches, NumPy in the object store (read without a copy
                                     on the same node: read-only views)
      an actor that dies (SIGKILL, its node gone): its tasks in flight go to the others

A batch is a pure function of its step, so any actor may make any step and a step made again
elsewhere is the same batch: nothing is lost or repeated when an actor or a node goes, and a
state saved with Ray workers restores into local workers and the reverse (the state is the
step). When no actor is left, a ``WorkerError`` names the steps lost and what to do.

Ray is optional (``pip install "jaxloader[ray]"``); the loader uses the program's Ray session,
or starts one as ``ray.init()`` would. A ``StreamLoader``'s readers are hosted by the actors as
by local workers (``jaxloader.ray_streams``). Actors the cluster places later (``min_actors``)
or Ray restarts take steps once they run; one that hangs past ``timeout_s`` is killed, its
steps made elsewhere. Each task's stage timings come back with its batches (``loader.stats``,
``diagnose()``); the actor's side is ``jaxloader.ray_actor``.

Example (needs Ray)::

    from jaxloader.ray import RayWorkers
    loader = jl.DataLoader(source, batch_size=64, transforms=[jl.Map(decode)],
                           workers=RayWorkers(8, num_cpus=1, scheduling_strategy="SPREAD"))
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections import deque
from typing import Any, Generator, NoReturn

from jaxloader.base import tree as tree_lib
from jaxloader.base.checks import check_int, is_seconds
from jaxloader.base.errors import ConfigError
from jaxloader.base.timings import Gauges
from jaxloader.engines.in_process import Maker
from jaxloader.ray_actor import MakerActor, actor_arguments, payload, with_worker_environment
from jaxloader.ray_streams import KILLS_PER_TASK, lost_in_turn, stream_batches
from jaxloader.ray_tasks import (WAIT_SAID_S, RayStallWatch, TaskQueues, actor_text, all_gone,
                                 broken_closes, check_session, get, gone, lost_errors,
                                 lost_reason, session, start_failed, step_failed, steps_text,
                                 task_failed, task_steps, waiting_to_start)
from jaxloader.workers.failures import closed, unpicklable
from jaxloader.workers.stalls import StallWatch
from jaxloader.workers.source_copies import Copies

log = logging.getLogger("jaxloader")
INSTALL = 'pip install "jaxloader[ray]"'


class RayWorkers:
    """``n`` Ray actors that make a loader's batches; ``actor_options`` go to
    ``ray.remote`` (``num_cpus``, ``resources``, ``scheduling_strategy``, ``runtime_env``, ...).

    ``in_flight``: tasks (a few steps each) each actor is asked for ahead; ``task_bytes``: the
    batches a task carries (as many steps as fit, and as an actor makes in half a second, at
    most 32; at least one): Ray costs the training process ~1 ms of CPU a call whatever its
    size, so larger tasks cost it less a batch and hold more of the object store (about
    ``in_flight x n x task_bytes``);
    ``min_actors``: the loader starts once this many actors run (``n`` by default); the others
    take steps as the cluster places them (an autoscaler adding nodes), and an actor Ray
    restarts (``max_restarts=``) takes steps again; ``timeout_s``: how long a task may take once
    the batches before it are received: an actor that takes longer is killed and its steps are
    made elsewhere, as a dead one's (``None``: wait); ``start_timeout_s``: how long the actors
    may take to start (Ray waits for free resources) before the loader says so. Actors get local
    workers' environment (``JAX_PLATFORMS=cpu``, a thread a math library) unless set.

    Example (needs Ray; a loader's batches on 4 actors of 2 CPUs each)::

        jl.DataLoader(source, batch_size=64, workers=RayWorkers(4, num_cpus=2))
    """

    def __init__(self, n: int, *, in_flight: int = 2, task_bytes: int = 160 << 20,
                 min_actors: int | None = None, timeout_s: float | None = None,
                 start_timeout_s: float = 120.0, **actor_options: Any) -> None:
        if importlib.util.find_spec("ray") is None:
            raise ImportError(f"RayWorkers needs Ray, which is not installed: {INSTALL}")
        self.n = check_int("RayWorkers(n=...)", n, low=1, remedy="the number of actors")
        self.in_flight = check_int("RayWorkers(in_flight=...)", in_flight, low=1,
                                   remedy="the tasks each actor is asked for ahead")
        self.task_bytes = check_int("RayWorkers(task_bytes=...)", task_bytes, low=1,
                                    remedy="the bytes of batches a task carries")
        self.min_actors = self.n if min_actors is None else check_int(
            "RayWorkers(min_actors=...)", min_actors, low=1, high=self.n,
            remedy=f"the actors the loader waits for at its start, 1 to n ({self.n})")
        for name, value, none in (("start_timeout_s", start_timeout_s, ""),
                                  ("timeout_s", timeout_s, " or None")):
            if (value is not None or not none) and not is_seconds(value):
                raise ConfigError(f"RayWorkers({name}=...): expected seconds > 0{none}, got "
                                  f"{value!r:.40}")
        self.start_timeout_s = float(start_timeout_s)
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        threads = {"max_concurrency", "concurrency_groups"} & set(actor_options)
        if threads and actor_options.get("max_concurrency", 1) != 1 or \
                "concurrency_groups" in threads:
            raise ConfigError(
                f"RayWorkers({', '.join(sorted(threads))}=...): an actor's batch maker (its "
                "readers, caches and a stream's position) runs one task at a time; leave it "
                "out: in_flight= asks each actor for more tasks ahead, n= for more actors")
        self.actor_options = {"num_cpus": 1, **actor_options}

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.actor_options.items()
                          if (k, v) != ("num_cpus", 1))
        task = f", task_bytes={self.task_bytes}" if self.task_bytes != 160 << 20 else ""
        least = f", min_actors={self.min_actors}" if self.min_actors != self.n else ""
        least += f", timeout_s={self.timeout_s:g}" if self.timeout_s is not None else ""
        least += f", start_timeout_s={self.start_timeout_s:g}" if self.start_timeout_s != 120 \
            else ""
        return f"RayWorkers({self.n}, in_flight={self.in_flight}{task}{least}{options})"

    def engine(self, maker: Maker, stall_warning_s: float | None = None,
               label: str = "jaxloader") -> "RayEngine":
        """The engine of ``maker``'s batches on this many actors (what a loader calls)."""
        return RayEngine(maker, self, RayStallWatch(stall_warning_s, None, label))


class RayEngine:
    """Makes batches on Ray actors in step order (see the module docstring); an ``Engine``.

    A task is a few consecutive steps (as many as make ``task_bytes``, at most
    ``ray_tasks.MAX_STEPS``), one remote call and one object: Ray's cost a call (~1 ms of the
    training process's CPU, whatever its size) is then paid once for several batches."""

    def __init__(self, maker: Maker, spec: RayWorkers, watch: StallWatch | None = None) -> None:
        import ray

        if not ray.is_initialized():
            ray.init()  # RAY_ADDRESS's cluster, else a local one: what Ray itself does
        self._ray, self._spec, self._location, self._watch = ray, spec, maker.location, watch
        self._session = session(ray)  # (a run after ray.shutdown() is refused)
        self.gauges = Gauges(spec.n, counted=False)  # each actor's stage timings, sent with
        # its tasks (not its time in use: an actor lost, or not placed yet, is out of use)
        # The maker once in the object store, its arrays as out-of-band buffers: every actor
        # on a node reads the same memory; the arrays it copies looked at as each run begins
        self.copies = Copies(maker)
        try:
            blob, arrays = payload(maker, self.copies.note)
        except Exception as e:
            raise unpicklable(e, maker, None, to="Ray actors") from e
        self._maker_ref: Any = ray.put((blob, arrays))
        self._remote = ray.remote(**with_worker_environment(spec.actor_options))(MakerActor)
        self._actors: list[Any] = [
            self._remote.remote(self._maker_ref, *actor_arguments(i, spec.n, spec.actor_options))
            for i in range(spec.n)]
        self._alive: list[int] = []
        self._pids: list[int | None] = [None] * spec.n
        self._nodes: list[str | None] = [None] * spec.n  # (ray_actor.node_label's)
        # actors not running yet (the cluster has not placed them, or Ray restarts them):
        # their where() call, which returns once they run
        self._pending: dict[int, Any] = {i: a.where.remote() for i, a in enumerate(self._actors)}
        self._back_by: dict[int, float] = {}  # an actor Ray restarts: asked again until then
        self._turn, self.actor_cpus = 0, float(spec.actor_options.get("num_cpus") or 0)
        self._steps: int | None = None  # steps a task (1 until a batch's size is known)
        self._killed: dict[int, int] = {}  # a task's first step -> actors lost while making it
        self.tasks = TaskQueues(spec.n, ray)  # each actor's, in the order sent: timeout_s's count
        try:
            self._admit(spec.start_timeout_s, spec.min_actors)
        except BaseException as e:  # (a Ctrl-C as it waited: raised as it is)
            error = start_failed(ray, spec, e, len(self._alive)) if isinstance(e, Exception) \
                else gone(ray, e)  # (said before close(): the free resources; Ray shut down)
            self.close()
            if error is None:
                raise
            raise error from e
        log.info("started %d Ray actor(s): pids %s%s", len(self._alive), self.pids,
                 f"; {len(self._pending)} more as the cluster places them"
                 if self._pending else "")

    @property
    def active(self) -> int:
        """Actors taking steps; once closed, those at close (what the stats, ``diagnose()``
        and ``num_workers`` read after a ``with`` block: not 0, the in-process loader's)."""
        return self._closed_with if self._closed else len(self._alive)

    @property
    def pids(self) -> list[int]:
        return [pid for i in self._alive if (pid := self._pids[i]) is not None]

    @property
    def maker_pids(self) -> list[int]:
        """Each actor's pid by its index, as ``gauges.makers`` lists their timings (0: none)."""
        return [pid or 0 for pid in self._pids]

    remote = True  # (its pids are other machines': no /proc of theirs here)
    _closed = False  # close() began (from another thread: a run waiting says so)
    _closed_with = 0  # actors taking steps as it closed

    def _admit(self, wait_s: float = 0.0, at_least: int = 0) -> None:
        """Actors that run now (placed by the cluster since, or restarted by Ray) take steps;
        waits up to ``wait_s`` until ``at_least`` run in all: else the error of an actor that
        failed to start, or Ray's ``GetTimeoutError``. One that failed for good is dropped."""
        ray, failed = self._ray, None
        deadline, said = time.monotonic() + wait_s, False
        while self._pending:
            need = max(0, at_least - len(self._alive))
            if need > len(self._pending):
                break
            refs = list(self._pending.values())
            ready, _ = ray.wait(refs, num_returns=need or len(refs), timeout=min(
                WAIT_SAID_S, max(0.0, deadline - time.monotonic())) if need else 0)
            if need and len(ready) < need and not said and time.monotonic() < deadline:
                said = waiting_to_start(ray, self._spec, len(self._alive) + len(ready),
                                        at_least, wait_s - (deadline - time.monotonic()))
            for actor, ref in list(self._pending.items()):
                if ref not in ready:
                    continue
                del self._pending[actor]
                try:
                    self._pids[actor], self._nodes[actor] = ray.get(ref)
                except lost_errors(self._ray) as e:
                    if time.monotonic() < self._back_by.get(actor, 0.0):  # still restarting
                        if need:  # (waiting for it: asked again shortly, not in a spin)
                            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                        self._pending[actor] = self._actors[actor].where.remote()
                        continue
                    log.warning("Ray actor %d did not start (%s)", actor, lost_reason(e))
                    failed = e  # (dead for good: it stays out)
                    continue
                self._back_by.pop(actor, None)
                self._alive.append(actor)
                if self._steps is not None:  # (not at the loader's start)
                    log.info("%s takes steps: %d actor(s) now", self.who(actor),
                             len(self._alive))
            if not need or len(self._alive) >= at_least or time.monotonic() >= deadline:
                break
        if len(self._alive) < at_least:
            raise failed or ray.exceptions.GetTimeoutError(
                f"{len(self._alive)} of {at_least} actors started")

    def _submit(self, first: int, count: int) -> tuple[int, int, int, Any]:
        check_session(self._ray, self._session)  # (before Ray's call, which would start one)
        actor = self._alive[self._turn % len(self._alive)]
        self._turn += 1
        return first, count, actor, self.tasks.sent(actor, self._actors[actor].make.remote(
            first, count, self.gauges.trace))

    def get(self, actor: int, ref: Any, steps: str) -> Any:
        """``actor``'s task ``ref`` (``ray_tasks.get``; ``TaskQueues.wait_s``'s time)."""
        wait_s = self.tasks.wait_s(self._ray, self._spec.timeout_s, actor, ref)
        return get(self._ray, ref, wait_s, self._watch,
                   lambda: f"{self.who(actor)} is making {steps}")

    def who(self, actor: int) -> str:
        """``actor`` as messages name it (``ray_tasks.actor_text``)."""
        return actor_text(actor, self._pids[actor], self._nodes[actor])

    def batches(self, start: int, stop: int | None, resets: list | None = None,
                reports: dict | None = None) -> Generator[Any, None, None]:
        """The batches of steps ``start``, ``start + 1``, ... in order; an actor's failure
        sends its tasks in flight to the others. A stream's run (``resets``: each actor's
        readers) is ``jaxloader.ray_streams``'."""
        self.copies.check()
        return broken_closes(self, stream_batches(self, start, stop, resets, reports)
                             if resets is not None else self._batches(start, stop))

    def _batches(self, start: int, stop: int | None) -> Generator[Any, None, None]:
        lost_actor = lost_errors(self._ray)
        flight: deque[tuple[int, int, int, Any]] = deque()
        next_submit = start
        try:
            while True:
                if self._pending:  # (placed or restarted since: they take the next steps)
                    self._admit()
                room = self._spec.in_flight * len(self._alive)
                while len(flight) < room and (stop is None or next_submit < stop):
                    count = self._steps or 1
                    count = count if stop is None else min(count, stop - next_submit)
                    flight.append(self._submit(next_submit, count))
                    next_submit += count
                if not flight:
                    return
                first, count, actor, ref = flight[0]
                try:
                    made = self.get(actor, ref, steps_text(first, count))
                except lost_actor as e:
                    self._lose(actor, e, flight)
                    continue
                except self._ray.exceptions.GetTimeoutError as e:
                    self.hung(actor, steps_text(first, count))
                    self._lose(actor, e, flight, hung=True)
                    continue
                except self._ray.exceptions.RayTaskError as e:
                    self.raise_task_error(actor, first, count, e)
                flight.popleft()
                self.tasks.received(actor, ref)
                self._killed.pop(first, None)  # (made: actors lost before on it are no sign)
                made, timings, where, failed = made
                self.made_by(actor, where, timings)
                if made:  # each task back sizes the next ones
                    self._steps = task_steps(tree_lib.flatten(made[0])[0], self._spec.task_bytes,
                                             timings[0] / len(made))
                while made:
                    yield made.pop(0)
                del made
                if failed is not None:  # (after the batches before it, as a local worker's)
                    self.raise_failed(actor, failed)
        finally:  # a run left early (a restore, a break): its tasks are dropped, not
            flight.clear()  # cancelled (Ray may stall an actor 30 s on a cancelled one)

    def hung(self, actor: int, steps: str) -> None:
        """Kills an actor that did not make a task within ``timeout_s``, saying so."""
        log.warning("%s did not make %s within timeout_s=%g s: killed, its steps are made "
                    "again elsewhere", self.who(actor), steps, self._spec.timeout_s)
        # (with max_restarts, Ray may start it again: it takes steps once it runs)
        self.cancel_actor(actor, restart=bool(self._spec.actor_options.get("max_restarts")))

    def cancel_actor(self, actor: int, restart: bool = False) -> None:
        """Kills an actor (gone already: nothing); ``restart``: Ray may start it again."""
        self.tasks.clear(actor)
        try:
            self._ray.kill(self._actors[actor], no_restart=not restart)
        except Exception:  # noqa: BLE001 - gone meanwhile
            pass

    def made_by(self, actor: int, where: tuple[int, str], timings: tuple) -> None:
        """A task of ``actor``'s came back from process ``where`` (its pid and node), with its
        stage timings and when it began (wall clock: machines' agree to NTP's skew); kept if
        since the reset."""
        if timings[-1] >= time.time() - (time.monotonic() - self.gauges.reset_at):
            self.gauges.makers[actor].absorb(timings[:-2])
            self.gauges.makers[actor].add_queued(timings[-2])
        # restarted by Ray with no task lost: it had none in flight, or Ray made them again
        # (its max_task_retries)
        if tuple(where) != (self._pids[actor], self._nodes[actor]):  # (a pid on 2 nodes)
            was = self.who(actor)
            self._pids[actor], self._nodes[actor] = where
            log.info("%s was restarted by Ray: now pid %s on %s", was, *where)

    def raise_failed(self, actor: int, failed: Any) -> NoReturn:
        """Raises a step's failure in ``actor`` (``ray_tasks.step_failed``)."""
        error, cause = step_failed(actor, self._pids[actor], self._nodes[actor], failed,
                                   self._location)
        raise error from cause

    def raise_task_error(self, actor: int, first: int, count: int, e: Any,
                         stride: int = 1) -> NoReturn:
        """Raises what a task raised outside its steps (``ray_tasks.task_failed``)."""
        error, cause = task_failed(self.who(actor), first, count, e, self._location,
                                   stride)
        raise error from cause

    def _lose(self, actor: int, error: BaseException, flight: deque, hung: bool = False) -> None:
        """Drops a dead actor (``hung``: killed, its oldest task not done within
        ``timeout_s``); its tasks in flight go, in order, to the actors left."""
        if self._closed:  # (by close() from another thread: not a death)
            raise closed() from error
        if actor in self._alive:
            self._alive.remove(actor)
            log.warning("%s is gone (%s); its steps go to the %d left", self.who(actor),
                        lost_reason(error), len(self._alive))
            if self._spec.actor_options.get("max_restarts", 0):  # Ray may start it again
                self._pending[actor] = self._actors[actor].where.remote()
                self._back_by[actor] = time.monotonic() + self._spec.start_timeout_s
            else:  # (an actor only unreachable for now would hold its CPUs until close())
                self.cancel_actor(actor)
        # A hung actor is charged the task it did not finish; a dead one each of its tasks in
        # flight, as which one it was making is not known (one it finished may come back
        # lost with it, its reply not yet sent)
        owned = [(first, count) for first, count, owner, _ in flight if owner == actor]
        for first, _ in owned[:1] if hung else owned:
            self._killed[first] = self._killed.get(first, 0) + 1
        # (hung, with no actor left to try, nor one to come: all of them in turn, fewer)
        most = 1 if hung and not (self._alive or self._pending) else KILLS_PER_TASK
        cause = [(first, count) for first, count in owned if self._killed.get(first, 0) >= most]
        if cause:  # the steps, not the actors, are the cause (one of the tasks, if several)
            raise lost_in_turn(" or ".join(steps_text(*task) for task in cause),
                               self._location(cause[0][0]), error, self._spec.timeout_s,
                               self._killed[cause[0][0]]) from error
        if not self._alive and self._pending:  # the actors still starting: wait for one
            try:
                self._admit(self._spec.start_timeout_s, 1)
            except (self._ray.exceptions.GetTimeoutError, *lost_errors(self._ray)):
                pass  # (none started: said below)
        if not self._alive:
            if self._closed:  # (close() from another thread meanwhile: not a death)
                raise closed() from error
            raise all_gone(self.who(actor), error, flight[0][0],
                           flight[-1][0] + flight[-1][1] - 1) from error
        for i, (first, count, owner, _) in enumerate(flight):
            if owner == actor:
                flight[i] = self._submit(first, count)

    def close(self) -> None:
        """Kills the actors (not where Ray was shut down: its call would start Ray anew) and
        drops the maker's object; idempotent. A run waiting meanwhile says it was closed."""
        if not self._closed:
            self._closed_with = len(self._alive)
        self._closed = True
        for actor in range(len(self._actors) if session(self._ray) == self._session else 0):
            self.cancel_actor(actor)
        self._actors, self._alive, self._maker_ref = [], [], None
