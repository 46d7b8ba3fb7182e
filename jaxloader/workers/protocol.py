"""The messages between the main process and a worker, one class each, and how they travel.

::

    main process                                           worker
    Init(path, worker_id, num_workers, seed, payload, status, argv, relay, capacity)
                                                      ──>  sys.path, its status row (status.py),
                                                            loads(payload), init_fn(id)
                                                      <──  Said(items, dropped)  (what its
                                                                code logged and warned:
                                                                relay.py; at any time)
                                                      <──  Failed(-1, None, ...)  (could not start)
    Task(task_id, step, stride, slots, reset, trace, run)
                                                      ──>  make steps step, step + stride, ...,
                                                            each straight into its slot
                                                      <──  Done(task_id, made, timings)  (a
                                                                tuple a step made: nth, layout,
                                                                objects, report; the task's
                                                                stage timings)
                                                      <──  Grow(task_id, nth, nbytes)  (that
                                                                step's slot is too small)
    Slot(task_id, nth, slot, size) ──────────────────────>  (a bigger slot for that step)
                                                      <──  Failed(task_id, step, summary,
                                                                  traceback, pickled exception)
    Stop() ──────────────────────────────────────────────>  exit (so does EOF: the main is gone)

A task is a few steps of one worker (``stride``: the workers of its block), so that a small batch
costs its share of two messages, not two messages (``jaxloader.workers.pool``). ``slots`` names a
shared-memory segment a step (``shm.attach`` maps it) with its size. In ``made``, ``layout`` is
``None`` when it equals the worker's previous one (the main process keeps the last per worker);
``objects`` are the batch's object leaves (strings), which cannot live in shared memory, or the
bytes of a ``StringColumn`` written into the slot after the numbers (``collate.TEXT_AFTER``). A
task that fails at a step sends ``Done`` for the steps before it, then ``Failed``; its later
steps are not made. A stream's batches are made by the worker that owns their reader:
``Task.reset`` (``None`` but for the first task of a run) is the reader state to continue from,
``report`` the state after each batch. A step of a run that is no longer the pool's
(``StatusBoard.begin_run``: a restore, an ``iter()``, a Ctrl-C since) is not made: its entry in
``made`` has the layout ``SKIPPED``, and those after it too, so its slot comes back at once. A
message is pickled in C (``pickle.dumps``; ``Connection.send`` would build a
``ForkingPickler`` per message) and sent as one frame on the worker's pipe; everything here is
plain data and never imports JAX.

Example:
    >>> from multiprocessing import Pipe
    >>> main, worker = Pipe()
    >>> send(main, Task(task_id=7, step=42, stride=2, slots=(("memfd:1:5:99", 4096),)))
    >>> receive(worker)  # doctest: +NORMALIZE_WHITESPACE
    Task(task_id=7, step=42, stride=2, slots=(('memfd:1:5:99', 4096),), reset=None, trace=False,
         run=0)
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import traceback
from multiprocessing.connection import Connection
from typing import Any, Iterator, NamedTuple


class Init(NamedTuple):
    """The first message to a worker: where to import from and what to run."""

    path: list[str]  # the main process's sys.path, so the payload's modules import alike
    worker_id: int
    num_workers: int
    seed: int
    payload: bytes  # payload.dumps((maker, init_fn))
    status: tuple  # StatusBoard.names(worker_id): where it says what it is doing
    argv: list[str]  # the main process's sys.argv (workers.ties.take_the_trainers)
    relay: tuple  # its logger levels and warning filters (relay.settings)
    capacity: int  # the most workers the pool may run (num_workers="auto" grows to)


class Task(NamedTuple):
    """Make the batches of steps ``step + i * stride`` into ``slots[i]`` (name, bytes)."""

    task_id: int
    step: int
    stride: int
    slots: tuple
    reset: Any = None  # a stream reader's state to continue from (the first task of a run)
    trace: bool = False  # whether to send each stage's start and end (a profile's timeline)
    run: int = 0  # the pool's run it is for: its steps are skipped once another began


SKIPPED = "skipped"  # a step's layout in ``Done.made``: not made, its run no longer the pool's


class Slot(NamedTuple):
    """A bigger slot for step ``nth`` of task ``task_id``, which asked with ``Grow``."""

    task_id: int
    nth: int
    slot: str
    size: int


class Stop(NamedTuple):
    """Finish the current batch, then exit."""


class Made(NamedTuple):
    """One batch of a task, in ``Done.made`` (sent as a plain tuple), in its step's slot."""

    nth: int  # which of the task's steps
    layout: Any  # collate.Layout, or None: the same as this worker's previous one
    objects: list  # the object leaves, in layout order
    report: Any  # a stream reader's state after this batch, else None


class Done(NamedTuple):
    """Batches of task ``task_id`` are in their slots: a ``Made`` tuple each, in order."""

    task_id: int
    made: tuple
    # (busy s, CPU s, stages, batches, records, bytes, trace): the task's timings
    # (``jaxloader.base.timings``); None when they went with an earlier Done of the task
    timings: tuple | None = None


class Grow(NamedTuple):
    """Step ``nth`` of task ``task_id`` needs ``nbytes``: more than its slot holds."""

    task_id: int
    nth: int
    nbytes: int


class Failed(NamedTuple):
    """Task ``task_id`` raised (``task_id == -1``, ``step is None``: the worker could not start)."""

    task_id: int
    step: int | None
    summary: str  # "TypeError: ..."
    traceback: str  # formatted in the worker
    pickled: bytes | None  # the exception and its causes, each where it pickles (``chain``)


class Said(NamedTuple):
    """What the worker's code logged and warned since its last message (``relay.py``)."""

    items: list  # (pickled, text) each: a LogRecord, its message formatted, or a warning's
    # (message, filename, lineno); the text where it does not unpickle (relay.load)
    dropped: int  # records and warnings over relay.MOST_KEPT, not kept


def failed(task_id: int, step: int | None, e: BaseException) -> Failed:
    """``Failed`` for ``e``, raised making ``step`` (in its ``except`` block: the traceback is
    the one being handled); the exception itself with it, and its ``__cause__``s, where they
    pickle (pickle keeps no cause: the chain goes link by link)."""
    links: list[bytes | None] = []
    link: BaseException | None = e
    while link is not None and len(links) < 8:
        try:
            links.append(pickle.dumps(link))
        except Exception:  # noqa: BLE001 - an unpicklable one still reaches the user as text
            links.append(_by_value(link))
        link = link.__cause__
    pickled = None if links[0] is None else pickle.dumps(links)
    return Failed(task_id, step, f"{type(e).__name__}: {e}", traceback.format_exc(), pickled)


def _by_value(link: BaseException) -> bytes | None:
    """``link`` pickled by cloudpickle, or ``None``: an exception of a class defined in the
    user's script (``__main__``), which pickle names and a worker's ``__main__`` lacks; the
    training process loads it as its own class again (cloudpickle tracks the classes it sent),
    so ``except MyError`` catches it there."""
    import cloudpickle  # a worker has it imported (its payload came by it)

    try:
        return cloudpickle.dumps(link, pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - it still reaches the user as text
        return None


def chain(pickled: bytes) -> BaseException:
    """The exception ``failed`` pickled, its causes linked again (up to one that did not
    pickle)."""
    links = pickle.loads(pickled)
    if isinstance(links, BaseException):  # (a Failed of a version before the chain)
        return links
    first = link = _link(links[0])
    if first is None:
        raise ValueError("the exception did not unpickle as one")  # (the caller's text says)
    for following in links[1:]:
        cause = _link(following)
        if cause is None:
            break
        link.__cause__ = link = cause
    return first


def _link(pickled: bytes | None) -> BaseException | None:
    """One link of a chain unpickled, or ``None``: an exception may pickle and not unpickle
    (its ``__init__`` takes other arguments), or unpickle as something else."""
    try:
        link = pickle.loads(pickled) if pickled is not None else None
    except Exception:  # noqa: BLE001 - the chain up to it is kept; the worker's text has it
        return None
    return link if isinstance(link, BaseException) else None


# On the wire a message is a plain tuple (its kind's number, *fields): pickling a NamedTuple by
# class calls Python code on both ends, and the main process handles two messages a batch.
_KINDS: tuple[type, ...] = (Init, Task, Slot, Stop, Done, Grow, Failed, Said)
_NUMBER = {kind: number for number, kind in enumerate(_KINDS)}
_new = tuple.__new__


def send(conn: Connection, message: Any) -> None:
    """Sends one message as one frame. A batch's layout can name a class the user defined in
    ``__main__`` (a ``namedtuple`` record): a worker's ``__main__`` has no such name, so pickle
    cannot name it there, and the message goes by ``cloudpickle``, which sends the class by
    value and which the main process maps back to its own class."""
    wire = (_NUMBER[type(message)], *message)
    try:
        try:
            frame = pickle.dumps(wire, pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError):
            import cloudpickle  # a worker has it imported (its payload came by it)

            frame = cloudpickle.dumps(wire, pickle.HIGHEST_PROTOCOL)
    except MemoryError as e:  # (a bare MemoryError under ulimit -v: the containers audit)
        from jaxloader.runtime.limits import memory_left

        raise MemoryError(f"out of memory as a message between the loader and a worker was "
                          f"pickled ({type(message).__name__}): {memory_left()}") from e
    with pipe_errors_raised():
        conn.send_bytes(frame)


@contextlib.contextmanager
def pipe_errors_raised() -> Iterator[None]:
    """A write in it to a pipe or socket whose reader is gone raises ``BrokenPipeError``, as
    Python's own start makes it, also in a process that set ``SIGPIPE`` back to its default (a
    script's ``signal.signal(SIGPIPE, SIG_DFL)``, for ``| head``): the kernel's signal would end
    it at once, without a word, where a worker died (the out-of-memory killer). The signal is
    blocked for this thread while it writes, and one it caused taken, not delivered."""
    if signal.getsignal(signal.SIGPIPE) is signal.SIG_IGN:
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
    try:
        yield
    finally:
        if signal.SIGPIPE not in before:
            if signal.SIGPIPE in signal.sigpending():
                signal.sigwait({signal.SIGPIPE})
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


def receive(conn: Connection) -> Any:
    """The next message; raises ``EOFError`` when the other side is gone."""
    wire = pickle.loads(conn.recv_bytes())
    return _new(_KINDS[wire[0]], wire[1:])
