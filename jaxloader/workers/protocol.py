"""The messages between the main process and a worker, one class each, and how they travel.

::

    main process                                           worker
    Init(path, worker_id, num_workers, seed, payload) ──>  sys.path, loads(payload), init_fn(id)
                                                      <──  Failed(-1, None, ...)  (could not start)
    Task(task_id, step, slot, size, reset) ──────────────>  make(step) straight into the slot
                                                      <──  Done(task_id, slot, layout, objects,
                                                                report)
                                                      <──  Grow(task_id, nbytes)  (slot too small)
    Slot(task_id, slot, size) ───────────────────────────>  (a bigger slot for that task)
                                                      <──  Failed(task_id, step, summary,
                                                                  traceback, pickled exception)
    Stop() ──────────────────────────────────────────────>  exit (so does EOF: the main is gone)

``slot`` names a shared-memory segment (``shm.attach`` maps it). ``Done.layout`` is ``None`` when
it equals the worker's previous one (the main process keeps the last per worker); ``objects`` are
the batch's object leaves (strings), which cannot live in shared memory. A stream's batches
are made by the worker that owns their reader: ``Task.reset`` (``None`` but for the first task
of a run) is the reader state to continue from, ``Done.report`` the state after the batch. A message is pickled in
C (``pickle.dumps``; ``Connection.send`` would build a ``ForkingPickler`` per message) and sent as
one frame on the worker's pipe; everything here is plain data and never imports JAX.

Example:
    >>> from multiprocessing import Pipe
    >>> main, worker = Pipe()
    >>> send(main, Task(task_id=7, step=42, slot="memfd:1:5:99", size=4096))
    >>> receive(worker)
    Task(task_id=7, step=42, slot='memfd:1:5:99', size=4096, reset=None)
"""

from __future__ import annotations

import pickle
from multiprocessing.connection import Connection
from typing import Any, NamedTuple


class Init(NamedTuple):
    """The first message to a worker: where to import from and what to run."""

    path: list[str]  # the main process's sys.path, so the payload's modules import alike
    worker_id: int
    num_workers: int
    seed: int
    payload: bytes  # payload.dumps((maker, init_fn))


class Task(NamedTuple):
    """Make the batch of ``step`` into the slot ``slot`` of ``size`` bytes."""

    task_id: int
    step: int
    slot: str
    size: int
    reset: Any = None  # a stream reader's state to continue from (the first task of a run)


class Slot(NamedTuple):
    """A bigger slot for task ``task_id``, which asked for one with ``Grow``."""

    task_id: int
    slot: str
    size: int


class Stop(NamedTuple):
    """Finish the current batch, then exit."""


class Done(NamedTuple):
    """The batch of task ``task_id`` is in ``slot``."""

    task_id: int
    slot: str
    layout: Any  # collate.Layout, or None: the same as this worker's previous one
    objects: list  # the object leaves, in layout order
    report: Any = None  # a stream reader's state after this batch


class Grow(NamedTuple):
    """Task ``task_id``'s batch needs ``nbytes``: more than its slot holds."""

    task_id: int
    nbytes: int


class Failed(NamedTuple):
    """Task ``task_id`` raised (``task_id == -1``, ``step is None``: the worker could not start)."""

    task_id: int
    step: int | None
    summary: str  # "TypeError: ..."
    traceback: str  # formatted in the worker
    pickled: bytes | None  # the exception itself, if it pickles


# On the wire a message is a plain tuple (its kind's number, *fields): pickling a NamedTuple by
# class calls Python code on both ends (measured: 1.9 + 1.4 us a message, against 0.7 + 0.4 for
# a tuple), and the main process handles two messages a batch.
_KINDS: tuple[type, ...] = (Init, Task, Slot, Stop, Done, Grow, Failed)
_NUMBER = {kind: number for number, kind in enumerate(_KINDS)}
_new = tuple.__new__


def send(conn: Connection, message: Any) -> None:
    """Sends one message as one frame. A batch's layout can name a class the user defined in
    ``__main__`` (a ``namedtuple`` record): a worker's ``__main__`` has no such name, so pickle
    cannot name it there, and the message goes by ``cloudpickle``, which sends the class by
    value and which the main process maps back to its own class."""
    wire = (_NUMBER[type(message)], *message)
    try:
        frame = pickle.dumps(wire, pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        import cloudpickle  # a worker has it imported (its payload came by it)

        frame = cloudpickle.dumps(wire, pickle.HIGHEST_PROTOCOL)
    conn.send_bytes(frame)


def receive(conn: Connection) -> Any:
    """The next message; raises ``EOFError`` when the other side is gone."""
    wire = pickle.loads(conn.recv_bytes())
    return _new(_KINDS[wire[0]], wire[1:])
