"""A worker's end of ``relay.py``: what its code logs and warns, kept and sent to the training
process.

Kept from any of the worker's threads (``_Kept``), sent by the thread that gives an urgent item
(a new warning, a record of ``WARNING`` and over: at once, with what was kept before it, so
that a worker killed or hung right after has said it, where the pipe has room: a transform
never waits for the training process to read), before each ``Done`` and ``Failed``
(what a task said, before its batches: the training process reads the pipe as it reads
batches, in ``next()``, so a worker whose records fill the pipe waits for that, as a process
waits for its log handlers), and by a thread of its own (``jaxloader-relay``, every
``FLUSH_S``) while the pipe has room, so that a long task's records do not wait for its end.
Every message the worker sends goes by ``send``, one thread at a time. A warning given again (one a
record, under ``"always"``) is counted in the item kept for it, not kept again; one shown once
(``"default"``) is shown again after each task that showed it (``said_again``).

Example:
    >>> from jaxloader.workers import relay_worker
    >>> relay_worker.kept()  # (nothing said in this process)
    ([], 0)
"""

from __future__ import annotations

import builtins
import logging
import logging.handlers
import os
import pickle
import select
import sys
import threading
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any, Callable, TypeVar

from jaxloader.base.errors import JaxloaderWarning

from jaxloader.workers import protocol
from jaxloader.workers.protocol import Said
from jaxloader.workers.relay import FLUSH_S, MOST_KEPT

_CHUNK_BYTES = 1 << 16  # a Said's pickled items at most: a send the pipe's room takes at once
_SEEN_MOST = 4096  # warnings remembered as sent (a warning given again is counted, not urgent)
_SEND_WAIT_S = 0.01  # an urgent item waits this long at most for another thread's send


class _Kept:
    """What the worker's code said and the worker has not sent yet: each an item ``[pickled,
    text, repeats]``, in the order said."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[list] = []
        self.dropped = 0
        self.repeats: dict[tuple, list] = {}  # a warning's key: its item among those kept
        self.seen: set[tuple] = set()  # warnings' keys sent before
        self.conn: Connection | None = None  # where to send them (None: not a worker's)
        self.flusher: threading.Thread | None = None
        self.warned = False  # a warning shown since the last task's end (said_again)

    def put_nowait(self, record: logging.LogRecord) -> None:  # (QueueHandler's queue)
        if not _taken(record):
            self.keep(_item(record, ("r", record.name, record.levelno, record.msg,
                                     record.pathname, record.lineno, record.funcName,
                                     record.processName, record.created)),
                      record.levelno >= logging.WARNING)

    def warning(self, message: Any, category: type, filename: str, lineno: int,
                file: Any = None, line: str | None = None) -> None:  # (warnings.showwarning)
        if not isinstance(message, Warning):
            message = category(message)
        key = (category, str(message), filename, lineno)
        self.warned = True
        with self.lock:
            kept = self.repeats.get(key)
            if kept is not None:
                kept[2] += 1
                return
            urgent = key not in self.seen
            if len(self.seen) >= _SEEN_MOST:
                self.seen.clear()
            self.seen.add(key)
        module = _module_at(filename, lineno)
        self.keep(_item((message, filename, lineno, module),
                        ("w", f"{category.__name__}: {message}", filename, lineno)), urgent, key)

    def keep(self, item: list, urgent: bool, key: tuple | None = None) -> None:
        with self.lock:
            if len(self.items) >= MOST_KEPT:
                self.dropped += 1
                return
            self.items.append(item)
            if key is not None:
                self.repeats[key] = item
            start = self.flusher is None and self.conn is not None
            if start:
                self.flusher = threading.Thread(target=self._flush_now_and_then, daemon=True,
                                                name="jaxloader-relay")
        if start:
            try:
                self.flusher.start()  # type: ignore[union-attr]
            except RuntimeError:  # (at the process limit, ulimit -u: what is kept goes with
                pass  # each task's batches, not also now and then between; never tried again)
        conn = self.conn  # (a transform does not wait for the pipe: sent while it has room,
        if urgent and conn is not None and _SENDING.acquire(timeout=_SEND_WAIT_S):  # else later)
            try:
                send_kept(conn)
            except (OSError, EOFError, ValueError):  # (the pipe closed: kept for spill())
                pass
            finally:
                _SENDING.release()

    def _flush_now_and_then(self) -> None:
        while (conn := self.conn) is not None:
            time.sleep(FLUSH_S)
            try:
                send_kept(conn)
            except (OSError, EOFError, ValueError):  # (the pipe closed: the worker ends)
                return


_KEPT = _Kept()
_HANDLER = logging.handlers.QueueHandler(_KEPT)  # type: ignore[arg-type]
_SENDING = threading.RLock()  # one frame at a time on the pipe (re-entered: a warning given
# as a message is pickled is sent before it)
_showwarning = warnings.showwarning
_last_resort = logging.lastResort


def send(conn: Connection, message: Any) -> None:
    """``protocol.send``, one thread at a time: every message a worker sends goes by it."""
    with _SENDING:
        protocol.send(conn, message)


def take(given: tuple, worker_id: int, conn: Connection | None) -> None:
    """In a worker, before the payload's imports: the training process's levels and warning
    filters (``relay.settings()``), its warnings and records kept and sent on ``conn`` (a
    forked worker's root logger has the trainer's handlers: it logs through them), named as
    this worker's."""
    import multiprocessing

    apply(given)
    warnings.showwarning = _KEPT.warning
    if not logging.root.handlers:
        logging.root.addHandler(_HANDLER)
    multiprocessing.current_process().name = f"jaxloader-worker-{worker_id}"
    _KEPT.conn = conn
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_not_in_a_child)


def apply(given: tuple) -> None:
    """The training process's loggers' levels, warning filters and recursion limit
    (``relay.settings()``) taken here (a Ray actor's, whose output Ray relays itself)."""
    levels, root_level, disable, filters, recursion = given
    sys.setrecursionlimit(recursion)
    for name, level in levels.items():  # (attributes: setLevel clears every logger's cache)
        logging.getLogger(name).level = level
    logging.root.setLevel(root_level)
    logging.disable(disable)
    _filter(filters)


T = TypeVar("T")


def imported(load: Callable[[], T]) -> T:
    """``load()`` (a worker's or an actor's payload, unpickled: its modules imported), after
    ``apply``. What a module warns as its import runs here is not given again: the trainer's
    import said it, under its filters of the moment (``"error"`` set after it broke every
    worker, and every Ray actor); jaxloader's own warnings (a loader made on import) are given,
    but one a filter makes an error is not (as the module's others: a source made on import
    that warns broke every worker too)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loaded = load()
    for w in said:
        if issubclass(w.category, JaxloaderWarning):
            try:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            except Warning:  # (made an error: as the module's others, not given again)
                pass
    return loaded


def run_init(init_fn: Callable[[int], object], worker_id: int) -> None:
    """Runs ``worker_init_fn``, which may configure logging (``logging.basicConfig`` does
    nothing where the root logger has a handler): the root's keeper is taken off, and what
    ``init_fn`` logs with no handler of its own is kept all the same (``logging.lastResort``).
    Put back after it unless it gave the root logger handlers: the worker then logs as it was
    told to."""
    logging.root.removeHandler(_HANDLER)
    last, logging.lastResort = logging.lastResort, _HANDLER
    try:
        init_fn(worker_id)
    finally:
        logging.lastResort = last
        if not logging.root.handlers:
            logging.root.addHandler(_HANDLER)


def kept() -> tuple[list, int]:
    """What was kept since the last call and the count dropped, no longer kept."""
    with _KEPT.lock:
        taken = _KEPT.items, _KEPT.dropped
        _KEPT.items, _KEPT.dropped, _KEPT.repeats = [], 0, {}
    return taken


def send_kept(conn: Connection, wait: bool = False) -> None:
    """Sends what was kept, a message of up to ``_CHUNK_BYTES`` of items at a time: all of it
    (``wait``: before a ``Done`` or ``Failed``, so a warning of a batch's records is said
    before the batch is handed out), or while the pipe has room (the flusher's)."""
    with _SENDING:  # (taken before: two threads' sends keep the items' order)
        while _KEPT.items or _KEPT.dropped:
            if not wait and not _room(conn):
                return
            with _KEPT.lock:
                items, count, size = _KEPT.items, 0, 0
                while count < len(items) and (count == 0 or size <= _CHUNK_BYTES):
                    size += len(items[count][0] or b"")
                    count += 1
                chunk, dropped = items[:count], _KEPT.dropped
                _KEPT.items, _KEPT.dropped, _KEPT.repeats = items[count:], 0, {}
            try:
                protocol.send(conn, Said(chunk, dropped))
            except BaseException:
                with _KEPT.lock:  # (kept for spill(): the pipe closed as the worker ends)
                    _KEPT.items[:0], _KEPT.dropped = chunk, _KEPT.dropped + dropped
                raise


def stop_sending() -> None:
    """As the worker's pipe closes: what is said from then on is kept for ``spill()``."""
    _KEPT.conn = None


def spill() -> None:
    """As a worker ends: what was kept and not sent, on its standard error (a record a thread
    logged after the worker's last batch, an atexit hook's)."""
    _KEPT.conn = None
    for _, plain, repeats in kept()[0]:
        print((f"{plain[7]} {logging.getLevelName(plain[2])} {plain[1]}: {plain[3]}"
               if plain[0] == "r" else f"{plain[2]}:{plain[3]}: {plain[1]}")
              + (f" (and {repeats} times more)" if repeats else ""), file=sys.stderr)


def _room(conn: Connection) -> bool:
    """Whether the pipe takes a message without waiting (for ``_CHUNK_BYTES``: a socket is
    writable while under a quarter of its buffer is in use, ~200 KiB)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLOUT)
    return bool(poller.poll(0))


def _item(told: Any, plain: tuple) -> list:
    """``[told pickled, its text, 0 repeats]``: by ``cloudpickle`` where pickle cannot (a
    class of the script's ``__main__``), ``None`` where neither can."""
    for dumps in (pickle.dumps, _cloudpickle_dumps):
        try:
            return [dumps(told, pickle.HIGHEST_PROTOCOL), plain, 0]
        except Exception:  # noqa: BLE001 - (pickle's and the objects' own errors alike)
            pass
    return [None, plain, 0]


def _cloudpickle_dumps(told: Any, protocol: int) -> bytes:
    import cloudpickle  # a worker has it imported (its payload came by it)

    return cloudpickle.dumps(told, protocol)


def _module_at(filename: str, lineno: int) -> str | None:
    """The module ``warnings.warn`` named for a warning at ``filename:lineno``: its frame's
    ``__name__`` (a function of the script's runs in ``__main__``'s globals here, a module the
    worker alone imports is known here); ``None`` where no frame is there (``warn_explicit``)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == filename and frame.f_lineno == lineno:
            return frame.f_globals.get("__name__")
        frame = frame.f_back  # type: ignore[assignment]
    return None


def said_again() -> None:
    """After a task: a warning the worker showed once (``"default"``) is shown again in its
    next task, for the training process's filters of the moment to decide (``pytest.warns``
    around a later epoch), where it was sent once a worker; a warning given on every record
    costs one send a task. Only after a task that warned. Every registry of shown warnings is
    made outdated as a change of the filters makes them: by the ``warnings`` module's own
    function (private; without it, a warning is shown once a worker), not by setting the
    filters again, which would drop those ``worker_init_fn`` added."""
    if not _KEPT.warned:
        return
    _KEPT.warned = False
    mutated = getattr(warnings, "_filters_mutated", None)  # (Python 3.11 to 3.13)
    if mutated is not None:
        mutated()
        return
    lock = getattr(warnings, "_lock", None)  # (3.14: under the module's lock)
    mutated = getattr(warnings, "_filters_mutated_lock_held", None)
    if lock is not None and mutated is not None:
        with lock:
            mutated()


def _filter(filters: list[tuple]) -> None:
    """``filters`` (``relay.settings()``'s) as the warning filters."""
    warnings.resetwarnings()
    for action, message, category, module, lineno in filters:  # (in order: appended)
        warnings.filterwarnings(action, message, _named(*category), module, lineno, append=True)


def _taken(record: logging.LogRecord) -> bool:
    """Whether a handler in the worker other than the keeper (and a library's
    ``NullHandler``) writes ``record``: it is not sent again."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        for handler in logger.handlers:
            if handler is not _HANDLER and type(handler) is not logging.NullHandler and (
                    record.levelno >= handler.level):
                return True
        logger = logger.parent if logger.propagate else None
    return False


class _NamedCategory(type):
    """The class of a filter's category in a worker: matches a warning whose class, or one
    it derives from, has that module and name (the class itself is not imported)."""

    named: tuple[str, str]

    def __subclasscheck__(cls, sub: type) -> bool:
        return any((getattr(c, "__module__", None), getattr(c, "__qualname__", None))
                   == cls.named for c in getattr(sub, "__mro__", ()))


def _named(module: str, name: str) -> type:
    if module == "builtins":
        return getattr(builtins, name)
    return _NamedCategory(name, (Warning,), {"named": (module, name)})


def _not_in_a_child() -> None:
    """In a process the worker forks (a transform's ``multiprocessing.Pool``): nothing sent on
    the worker's pipe (two processes' frames would mix); it logs and warns as Python does."""
    _KEPT.conn = None
    _KEPT.flusher = None
    logging.root.removeHandler(_HANDLER)
    if logging.lastResort is _HANDLER:  # (forked as worker_init_fn ran: a Pool it starts)
        logging.lastResort = _last_resort
    warnings.showwarning = _showwarning
