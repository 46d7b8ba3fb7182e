"""A late batch, said: the consumer's wait for a step watched (``StallWatch``), logged past
``stall_warning_s`` with what each worker is doing (``stall_report``), again every
``stall_warning_s``, and a ``StallError`` past ``timeout_s``; and said sooner
(``BEHIND_S``) where the step waits behind a worker still making a step for an iterator
before this one (``behind``: a Ctrl-C'd read that hangs, the notebook cell run again).

Example:
    >>> watch = StallWatch(300.0, None)
    >>> watch.begin(5); 299.0 < watch.left() <= 300.0
    True
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

from jaxloader.base.errors import StallError
from jaxloader.runtime import limits
from jaxloader.workers.status import StatusBoard

BEHIND_S = 10.0  # a wait behind a run before's step, then said (if stall_warning_s is later)

_LOG = logging.getLogger("jaxloader")


class StallWatch:
    """The consumer's wait for one step: when to say it is late, and when it is an error. The
    time counted is the time since the worker that holds the step last began a step (its
    ``progress``), or since the wait began if later: a task of 16 small steps is reported once
    all are made, and a healthy worker making one every 0.1 s kept the consumer waiting 1.6 s,
    past a ``timeout_s`` of 1."""

    timed_out_by = "timeout_s= makes a wait this long an error"  # (a Ray actor's: its own)

    def __init__(self, warn_s: float | None, timeout_s: float | None,
                 label: str = "jaxloader") -> None:
        self.warn_s, self.timeout_s, self.label = warn_s, timeout_s, label  # (label: which
        # loader waits, in the log line: a train and an eval loader may both be late)
        self.watching = warn_s is not None or timeout_s is not None
        self._awaited: int | None = None
        self._since = 0.0  # when the wait for the step began
        self._moved = 0.0  # and the holder's last step, if later
        self._warned = 0  # reports given since then
        self._behind_said = False  # that the step waits behind a run before's (said once)

    def begin(self, awaited: int | None) -> None:
        """Waiting for step ``awaited`` (the same as before: the clock runs on)."""
        if awaited is None or awaited != self._awaited:
            self._awaited, self._warned, self._behind_said = awaited, 0, False
            self._since = self._moved = time.monotonic()

    def left(self) -> float:
        """Seconds until the next report or the error is due (0 when overdue)."""
        due = [t for t in (None if self.warn_s is None else self.warn_s * (self._warned + 1),
                           self.timeout_s) if t is not None]
        return max(0.0, min(due) - (time.monotonic() - self._moved))

    def wait(self, poll: Callable[..., list], awaited: int | None,
             report: Callable[[int], str], progress: Callable[[int], float | None],
             behind: Callable[[int], str | None] = lambda step: None
             ) -> tuple[list, StallError | None]:
        """``poll(ms)`` until it gives events, the wait for step ``awaited`` said when late
        (``due``, of ``report(awaited)``): the events, or the ``StallError`` past ``timeout_s``.
        ``behind(awaited)``: what the step waits behind of a run before, said at ``BEHIND_S``
        if that comes before ``stall_warning_s`` (``None``: nothing)."""
        if awaited is None or not self.watching:
            return poll(), None
        step = awaited
        self.begin(step)
        early = self.warn_s is not None and self.warn_s > BEHIND_S
        while True:
            left = self.left()
            if early and not self._behind_said:
                left = min(left, max(0.0, BEHIND_S - (time.monotonic() - self._since)))
            events = poll(min(left, 3600.0) * 1000)  # (overdue: what came; ms: a C int)
            if events:
                return events, None
            if early and not self._behind_said and time.monotonic() - self._since >= BEHIND_S:
                self._behind_said = True
                said = behind(step)
                if said:
                    _LOG.warning("%s: %s", self.label, said)
            error = self.due(lambda: report(step), lambda: progress(step))
            if error is not None:
                return [], error

    def due(self, report: Callable[[], str],
            progress: Callable[[], float | None] = lambda: None) -> StallError | None:
        """The ``StallError`` if the wait is past ``timeout_s``; else logs ``report()`` if a
        report is due, and ``None``. ``progress()``: when the worker that holds the step began
        its last step (``time.monotonic``), or ``None`` (idle, or starting)."""
        moved = progress()
        if moved is not None and moved > self._moved:
            self._moved, self._warned = moved, 0  # (a step since: it is not stuck)
        now = time.monotonic()
        waited, still = now - self._since, now - self._moved
        late = f"no batch for {waited:,.1f} s"
        if f"{still:,.1f}" != f"{waited:,.1f}":  # (a step begun since the wait began)
            late += f", and no step begun by its worker for {still:,.1f} s"
        if self.timeout_s is not None and still >= self.timeout_s:
            return StallError(
                f"{late}, past timeout_s={self.timeout_s:g}: "
                + report() + "\n--- the loader is broken; fix what holds the worker, or raise "
                "timeout_s, then create a new loader ---")
        if self.warn_s is not None and still >= self.warn_s * (self._warned + 1):
            _LOG.warning("%s: %s: %s\nThe loader keeps waiting (%s; stall_warning_s= sets when "
                         "this is said)", self.label, late, report(), self.timed_out_by)
            # the next at the first multiple of stall_warning_s after this one was made (a
            # report takes time): the (_warned + 1)-th
            self._warned = int((time.monotonic() - self._moved) // self.warn_s)
        return None


def holder_progress(awaited: int, run: int, tasks: Iterable[Any], board: StatusBoard
                    ) -> float | None:
    """When the worker that holds step ``awaited`` of run ``run`` (in one of ``tasks``) began
    the step it is making (``time.monotonic``), or ``None``: idle or starting, or the step in
    no task."""
    task = _task_of(awaited, run, tasks)
    return None if task is None else board.making_since(task.worker)


def _task_of(awaited: int, run: int, tasks: Iterable[Any]) -> Any:
    """The task (``tasks.InFlight``) of step ``awaited`` in run ``run``, or ``None`` (a run
    before's of the same step, in flight still, is not it)."""
    return next((t for t in tasks if t.run == run and awaited in _steps(t)), None)


def _steps(task: Any) -> range:
    return range(task.first, task.first + task.stride * len(task.segments), task.stride)


def behind(awaited: int, run: int, tasks: Iterable[Any], board: StatusBoard,
           where: Callable[[int], str]) -> str | None:
    """What step ``awaited`` of run ``run`` waits behind: its worker still making a step of a
    task of a run before (an iterator ended by ``iter()``, ``load_state_dict()`` or a Ctrl-C),
    which a worker finishes before it takes the next; ``None`` where it is not so."""
    tasks = list(tasks)
    task = _task_of(awaited, run, tasks)
    making = None if task is None else board.making(task.worker)
    if task is None or making is None or not any(
            t.worker == task.worker and t.run != run and making in _steps(t) for t in tasks):
        return None
    return (f"{where(awaited)} waits behind worker {task.worker}, still "
            f"{board.doing(task.worker, where)} for an iterator before this one (ended by "
            "iter(), load_state_dict() or a Ctrl-C): a worker finishes the step it is making "
            "before it takes the next. If that step hangs, close() the loader (its workers "
            "are ended) and make a new one")


def stall_report(awaited: int, run: int, tasks: Iterable[Any], board: StatusBoard,
                 pids: list[int], where: Callable[[int], str], active: int | None = None
                 ) -> str:
    """What the consumer awaits (step ``awaited`` of run ``run``, in one of ``tasks``, the
    pool's ``tasks.InFlight``) and what each worker is doing, with their stacks; ``active``:
    the workers in use (those ``num_workers="auto"`` parked share no core)."""
    tasks = list(tasks)
    task = _task_of(awaited, run, tasks)
    steps = None if task is None else _steps(task)
    sent = "" if steps is None or len(steps) == 1 else (
        f" (in its task of steps {steps[0]}, {steps[1]}, ..., {steps[-1]}, reported once all "
        "are made)")
    worker = awaited % len(pids) if task is None else task.worker
    late = behind(awaited, run, tasks, board, where)
    cores, using = limits.cores(), len(pids) if active is None else active
    shared = [f"({using} workers share the {cores} core(s) this process may use: each "
              "makes its steps at a share of a core, slower than alone; fewer workers, or a "
              "larger timeout_s)"] if using > cores else []  # (16 on a quota of 1 core:
    # each "running", no cause said)
    return "\n".join([f"{where(awaited)} is awaited, from worker {worker}{sent}. " + (
        f"It waits behind worker {worker}'s step for an iterator before this one. " if late
        else "") + "The workers:", *board.report(pids, where), *shared])
