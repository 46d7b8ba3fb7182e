"""The pool's worker processes: those started, those in use, and how the main process hears
them.

::

    Roster(count) ── workers[0..started)   processes (process.py), a pipe each
                     active                those given tasks now: workers[0..active)
                     poller, by_fd          one poll() over every pipe (a parked worker's too:
                                            its last tasks come back, its death is seen) and
                                            every worker's pidfd (~i: its end, said also where
                                            another process holds a copy of its pipe)
                     in_flight, layouts     tasks out a worker; the last layout each sent
    resize(n) ──> target; apply() between two blocks of tasks: starts workers up to n (their
                  payload sent), or parks those past n (they finish their tasks, then idle)

Parked workers stay started, so a count that goes down and up again costs no start. Worker
``i`` is always ``workers[i]``: a task's results go back to the worker that made them.

Example:
    >>> from jaxloader.base.timings import Gauges
    >>> roster = Roster(0, capacity=4, start_method="exec", gauges=Gauges(0))
    >>> roster.resize(9); roster.target  # bounded by the capacity
    4
"""

from __future__ import annotations

import logging
import os
import select
import sys
from typing import Any, Callable

from jaxloader.base.timings import Gauges, StageTotals
from jaxloader.workers.endings import stop_all
from jaxloader.workers.process import WorkerProcess

log = logging.getLogger("jaxloader")


class Roster:
    """See the module docstring; not thread-safe but for ``resize``."""

    def __init__(self, count: int, *, capacity: int, start_method: str, gauges: Gauges,
                 active: int | None = None, workers: list[WorkerProcess] | None = None,
                 environment: dict[str, str] | None = None) -> None:
        """``workers``: the list the workers go in, the caller's before any starts (an
        interrupt as the roster is made, or as it returns, leaves none the caller cannot
        stop: ``jaxloader.base.interrupts``, 3). ``environment``: every worker's, those
        the tuner adds later (from another thread) too (``process.worker_environment``)."""
        self.capacity = max(count, capacity)
        self._fork_said = False  # (a fork refused once JAX is imported: said once)
        if start_method == "fork" and active is not None and "jax" in sys.modules:
            # workers started again after an interrupted run, once JAX is imported, which a
            # fork refuses: the loader stayed broken, blaming a start method that was fine
            # when chosen. The payload is the same pickle; fresh interpreters load it.
            log.warning("the workers are started again after an interrupted run, and JAX is "
                        "imported now: they are fresh interpreters (start_method='exec'), "
                        "not forks of this process, which could deadlock")
            start_method = "exec"
        self._start_method = start_method
        self._environment = environment
        self._gauges = gauges
        self.workers: list[WorkerProcess] = [] if workers is None else workers
        # One poller for the pool's life: blocking in poll() costs a syscall, where
        # multiprocessing.connection.wait builds and fills a new selector every call.
        self.poller = select.poll()
        self.by_fd: dict[int, int] = {}
        self.in_flight: list[int] = []
        self.layouts: list[Any] = []
        self.active = self.target = count if active is None else active
        self.since = 0  # the first step submitted with the count in use
        self._catching_up = False  # a count grew: blocks for those behind (takers)
        gauges.in_use(self.active)
        try:
            for _ in range(count):
                self.add()
            if count:  # (a Ctrl-C in the log's I/O, too: the workers are stopped)
                log.info("%s %d worker process(es): pids %s", "started" if active is None
                         else "restarted (after an interrupted run)", count, self.pids)
        except BaseException:  # (a fork refused: those started must not be left running)
            stop_all(self.workers)
            raise

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def add(self) -> int:
        """Starts one more worker process (its payload is sent apart); its index."""
        worker = WorkerProcess(self._start_method, into=self.workers,
                               environment=self._environment)
        i = len(self.workers) - 1
        self.by_fd[worker.conn.fileno()] = i
        self.poller.register(worker.conn.fileno(), select.POLLIN)
        if worker.sentinel is not None:  # (its end, where no EOF comes: ~i, pool._receive)
            self.by_fd[worker.sentinel] = ~i
            self.poller.register(worker.sentinel, select.POLLIN)
        self.in_flight.append(0)
        self.layouts.append(None)
        while len(self._gauges.makers) <= i:
            self._gauges.makers.append(StageTotals())
        return i

    def ended(self, i: int) -> bool:
        """Whether worker ``i``, whose pidfd says it has ended, has nothing left in its pipe
        (else that is read first, without waiting: the rest of a message cut short by its
        end never comes where another process holds a copy of its pipe, so such a read
        fails, and its end is said then)."""
        conn = self.workers[i].conn
        try:
            if conn.poll(0):
                os.set_blocking(conn.fileno(), False)
                return False
        except OSError:  # (closed)
            pass
        return True

    @property
    def most(self) -> int:
        """The workers that may be in use: ``capacity``, or those started where no more can
        start (forked, once JAX is imported, which ``WorkerProcess`` refuses)."""
        if self._start_method != "fork" or "jax" not in sys.modules:
            return self.capacity
        return max(1, min(len(self.workers), self.capacity))

    def resize(self, workers: int) -> None:
        """Asks for ``workers`` in use (1 to ``most``, the cap said once); safe from any
        thread."""
        most = self.most
        if int(workers) > most and most < self.capacity and not self._fork_said:
            log.warning("num_workers='auto' keeps %d worker process(es): start_method='fork' "
                        "starts no more once JAX is imported (start_method='exec' does)", most)
            self._fork_said = True
        self.target = max(1, min(int(workers), most))

    def apply(self, send_payload: Callable[[int], None], step: int) -> None:
        """Takes ``resize``'s count from ``step`` on: starts what is missing
        (``send_payload(first new)``)."""
        target, started = self.target, len(self.workers)
        while len(self.workers) < target:
            try:
                self.add()
            except (OSError, MemoryError) as e:  # a limit met as the tuner grows the pool
                # (descriptors, processes: ulimit -u, a container's pids): the run goes on
                # with the count in use (a stream's divides its readers), those started the
                # most from now on
                for worker in self.workers[len(self.layouts):]:  # (started, not registered)
                    stop_all([worker])
                del self.workers[len(self.layouts):]
                if len(self.workers) < max(1, self.active):
                    raise
                self.capacity = len(self.workers)
                target = self.target = max(1, self.active)
                log.warning("num_workers='auto': no more worker processes start here "
                            "(%s: %s); %d in use, %d at most from now on", type(e).__name__,
                            e, target, self.capacity)
        if started < len(self.workers):  # (those started past a failed start: parked)
            log.info("started worker process(es) %s: %d in use", self.pids[started:], target)
        elif target < self.active:
            log.info("parked %d worker process(es) (kept, idle): %d in use",
                     self.active - target, target)
        self._catching_up = target > self.active  # (takers)
        self.active, self.since = target, step
        self._gauges.in_use(target)
        if started < len(self.workers):
            send_payload(started)

    def settled(self, step: int) -> bool:
        """Whether step ``step`` and those after it are made by the count asked for."""
        return self.target == self.active and step >= self.since

    def takers(self, ahead: int, balance: bool = True) -> list[int]:
        """The workers in use the next block of tasks goes to, each holding fewer than
        ``ahead``: all of them; or, ``balance``-d after a count grew, as long as one holds two
        tasks more than another (those in use before, their backlog), those with at most one
        more than the fewest. Blocks for all alike kept the backlog: the workers started got
        tasks only as the others made room, busy half their time (autotune's 8 workers made
        50 batches a second where 8 from the start made 97: the audit). (Not otherwise: the
        tasks of a pool of small batches come back apart, and blocks for a few cost 10%.)"""
        flights = self.in_flight[:self.active]
        least = min(flights)
        if self._catching_up and balance and max(flights) - least >= 2:
            return [w for w, n in enumerate(flights) if n <= least + 1 and n < ahead]
        self._catching_up = False
        return list(range(self.active)) if max(flights) < ahead else []
