"""The worker process: make the batches it is asked for, straight into shared-memory slots.

::

    Init ──> set sys.path, loads(payload), init_fn(id)
    Task ──> [maker.reset(task.reset)] maker.make(step, alloc=the slot) ──> Done (+ report)
                                              (the heap keeps a batch's freed pages: heap.py)
                                              (Grow ... Slot when it needs more room)
                                              └─> Failed (the exception, its traceback)
    Stop / EOF ──> exit

The messages are in ``jaxloader.workers.protocol``.

The pipe is the only link: when the main process dies, ``recv`` sees EOF and the worker exits;
Ctrl-C in the terminal is left to the main process (the worker ignores SIGINT). The worker never
imports JAX and never unlinks a segment.
"""

from __future__ import annotations

import pickle
import signal
import sys
import traceback
from collections import OrderedDict, deque
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from jaxloader.tree import flatten, is_flat_dict
from jaxloader.workers import payload, protocol, shm
from jaxloader.workers.heap import Heap
from jaxloader.workers.protocol import Done, Failed, Grow, Slot, Stop, Task

_MAX_MAPPED = 32  # slot mappings kept per worker: more than a ring holds in steady state


class WorkerInfo(NamedTuple):
    """What ``get_worker_info()`` returns inside a worker."""

    id: int
    num_workers: int
    seed: int


_INFO: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """``WorkerInfo(id, num_workers, seed)`` inside a worker process, ``None`` elsewhere.

    Example:
        >>> get_worker_info() is None  # in the main process
        True
    """
    return _INFO


class _Slots:
    """The worker's mappings of slots by name, most recent last; at most ``_MAX_MAPPED``."""

    def __init__(self) -> None:
        self._maps: OrderedDict[str, Any] = OrderedDict()

    def get(self, name: str, size: int) -> memoryview:
        mapped = self._maps.pop(name, None)
        if mapped is None or len(mapped) < size:
            mapped = shm.attach(name, size)
        self._maps[name] = mapped
        while len(self._maps) > _MAX_MAPPED:  # slots the main process replaced or retired
            self._maps.popitem(last=False)[1].close()
        return memoryview(mapped)[:size]


class _Inbox:
    """Messages from the main process; those that arrive while a batch waits for a bigger
    slot are kept for later, in order."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._pending: deque = deque()

    def next(self) -> Any:
        return self._pending.popleft() if self._pending else protocol.receive(self.conn)

    def wait_for_slot(self, task_id: int) -> Slot:
        while True:
            message = protocol.receive(self.conn)
            if type(message) is Slot and message.task_id == task_id:
                return message
            if type(message) is Stop:
                raise SystemExit(0)
            self._pending.append(message)


class _Lease:
    """The slot a task writes into; ``alloc`` asks the main process for a bigger one if needed."""

    def __init__(self, task_id: int, name: str, size: int, inbox: _Inbox, slots: _Slots) -> None:
        self.task_id, self.name, self.size = task_id, name, size
        self._inbox, self._slots = inbox, slots
        self.used = 0

    def alloc(self, nbytes: int) -> memoryview:
        self.used = nbytes
        if nbytes > self.size:
            protocol.send(self._inbox.conn, Grow(self.task_id, nbytes))
            _, self.name, self.size = self._inbox.wait_for_slot(self.task_id)
        return self._slots.get(self.name, self.size)[:nbytes]


def serve(conn: Connection) -> None:
    """The worker loop; returns when told to stop or when the main process is gone."""
    global _INFO
    first = protocol.receive(conn)
    if type(first) is Stop:  # stopped before its payload came (a start cut short by Ctrl-C)
        return
    path, worker_id, num_workers, seed, blob = first
    sys.path[:] = path
    try:
        maker, init_fn = payload.loads(blob)
        _INFO = WorkerInfo(worker_id, num_workers, seed)
        if init_fn is not None:
            init_fn(worker_id)
    except BaseException as e:  # noqa: BLE001 - reported, then this worker ends
        protocol.send(conn, _failed(-1, None, e))
        return
    inbox, slots, heap = _Inbox(conn), _Slots(), Heap()
    last_layout = None
    streaming = hasattr(maker, "report")
    while True:
        message = inbox.next()
        if type(message) is not Task:  # Stop
            return
        task_id, step, name, size, reset = message
        lease = _Lease(task_id, name, size, inbox, slots)
        try:
            if reset is not None:  # a stream reader: continue from the loader's position
                maker.reset(reset)
            batch, layout = maker.make(step, lease.alloc)
            report = maker.report() if streaming else None
            heap.fit(lease.used)  # the next batch's records reuse this one's freed pages
        except SystemExit:
            return
        except BaseException as e:  # noqa: BLE001 - everything goes back to the main process
            protocol.send(conn, _failed(task_id, step, e))
            continue
        objects = []
        if any(spec.offset < 0 for spec in layout.leaves):  # strings/objects travel by pipe
            leaves = (list(batch.values()) if is_flat_dict(layout.treedef)  # (no tree walk)
                      else flatten(batch)[0])
            objects = [leaf for spec, leaf in zip(layout.leaves, leaves) if spec.offset < 0]
        del batch  # drop the views of the slot before the main process may reuse it
        same = layout == last_layout
        try:
            protocol.send(conn, Done(task_id, lease.name, None if same else layout, objects,
                                     report))
        except (pickle.PicklingError, AttributeError, TypeError) as e:  # not even by value
            protocol.send(conn, _failed(task_id, step, e))
            continue
        last_layout = layout


def _failed(task_id: int, step: int | None, e: BaseException) -> Failed:
    try:
        pickled = pickle.dumps(e)
    except Exception:  # noqa: BLE001 - an unpicklable exception still reaches the user as text
        pickled = None
    return Failed(task_id, step, f"{type(e).__name__}: {e}", traceback.format_exc(), pickled)


def main(fd: int) -> None:
    """Entry point of an exec'd worker: ``fd`` is its end of the pipe to the main process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        serve(conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process is gone or closed the pipe: nothing left to do
    finally:
        conn.close()
