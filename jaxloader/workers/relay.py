"""A worker's log records and warnings, said again in the training process, as if its own code
had logged or warned them there.

::

    training process                                 worker
    Init(..., relay.settings())  ─────────────>  take(): the trainer's logger levels and
                                                 warning filters, warnings and the root
                                                 logger's records kept (run_init: unless
                                                 worker_init_fn configures logging itself)
    Heard.replay(said) <────── Said(items, ..) ──  a warning or a record of WARNING and over
                                                 at once; others within FLUSH_S, and before
                                                 each Done and Failed

A record goes to its logger's handlers in the training process (``Logger.handle``, as
``logging.handlers.QueueListener``'s cookbook recipe does), its message and traceback formatted
in the worker (``QueueHandler.prepare``), its ``processName`` the worker's
(``jaxloader-worker-3``); one that a handler in the worker wrote (a named logger's of
``worker_init_fn``, one a forked worker inherited) is not sent again. A warning goes through
``warnings.warn_explicit`` there: the trainer's filters of the moment, ``pytest.warns`` and
``catch_warnings(record=True)`` see each one; a warning several workers give is shown once a
loader under the ``"default"`` action. A worker's filters are the trainer's as it starts, but
for their showing once (each warning is sent; the trainer's filters and registry decide): one
made an error raises where it is given, as with ``num_workers=0``. A filter's category is
matched by its module and name in a worker (``_named``): no filter makes a worker import a
module (JAX) or fail on one it cannot. Levels are the trainer's as its workers start. A
warning or a record of ``WARNING`` and over is sent as it is given, others within ``FLUSH_S``
(a worker that crashes or hangs right after loses none of them). Up to ``MOST_KEPT`` between
two messages; more are counted and the count said.

Example:
    >>> import subprocess, sys
    >>> from jaxloader.workers.launch import PACKAGE_ROOT
    >>> code = '''
    ... import logging, warnings
    ... from jaxloader.workers import relay
    ... relay.take(relay.settings(), 0, None)
    ... logging.getLogger("aug").info("dropped: below the trainer's level")
    ... logging.getLogger("aug").warning("record %d is blank", 7)
    ... warnings.warn("fell back to bilinear")
    ... told = [relay.load(item) for item in relay.kept().items]
    ... print(told[0].getMessage(), told[0].processName, "|", *told[1])
    ... '''
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
    ...                cwd=PACKAGE_ROOT).stdout.strip()
    'record 7 is blank jaxloader-worker-0 | fell back to bilinear <string> 7'
"""

from __future__ import annotations

import builtins
import logging
import logging.handlers
import os
import pickle
import sys
import threading
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any, Callable

from jaxloader.base.errors import WorkerError
from jaxloader.workers import protocol
from jaxloader.workers.protocol import Said

MOST_KEPT = 10_000  # records and warnings a worker keeps between two messages
FLUSH_S = 0.1  # a record under WARNING waits this long at most in a worker
_log = logging.getLogger("jaxloader")


def settings() -> tuple:
    """What a worker takes from the training process: its loggers' levels (those set), the
    level ``logging.disable`` set, and its warning filters, each category by its module and
    name (a class of the script's ``__main__``, or of a module a worker cannot import, would
    not unpickle there; one of JAX's would import JAX)."""
    manager = logging.root.manager
    levels = {name: logger.level for name, logger in list(manager.loggerDict.items())
              if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET}
    filters = [(action, getattr(message, "pattern", ""),
                (category.__module__, getattr(category, "__qualname__", "Warning")),
                getattr(module, "pattern", ""), lineno)
               for action, message, category, module, lineno in list(warnings.filters)]
    return levels, logging.root.level, manager.disable, filters


class _Kept:
    """What the worker's code said and the worker has not sent yet (any of its threads): each
    an item ``(pickled, plain)``, in the order said."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple] = []
        self.dropped = 0
        self.since = 0.0  # when the first item kept was
        self.conn: Connection | None = None  # where to send them (None: not a worker's)
        self.flusher: threading.Thread | None = None

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
        self.keep(_item((message, filename, lineno),
                        ("w", f"{category.__name__}: {message}", filename, lineno)), True)

    def keep(self, item: tuple, urgent: bool) -> None:
        with self.lock:
            if len(self.items) >= MOST_KEPT:
                self.dropped += 1
                return
            if not self.items:
                self.since = time.monotonic()
            self.items.append(item)
            start = self.flusher is None and self.conn is not None
            if start:
                self.flusher = threading.Thread(target=self._flush_now_and_then, daemon=True,
                                                name="jaxloader-relay")
        if start:
            self.flusher.start()  # type: ignore[union-attr]
        if urgent and self.conn is not None:
            try:
                send_kept(self.conn)
            except (OSError, EOFError, ValueError):  # (the pipe closed: kept for spill())
                pass

    def _flush_now_and_then(self) -> None:
        while (conn := self.conn) is not None:
            time.sleep(FLUSH_S)
            if self.items and time.monotonic() - self.since >= FLUSH_S:
                try:
                    send_kept(conn)
                except (OSError, EOFError, ValueError):  # (the pipe closed: the worker ends)
                    return


_KEPT = _Kept()
_HANDLER = logging.handlers.QueueHandler(_KEPT)  # type: ignore[arg-type]
_SENDING = threading.RLock()  # one frame at a time on the pipe (re-entered: a warning given
# as a message is pickled is sent before it)


def send(conn: Connection, message: Any) -> None:
    """``protocol.send``, one thread at a time: every message a worker sends goes by it."""
    with _SENDING:
        protocol.send(conn, message)


def take(given: tuple, worker_id: int, conn: Connection | None) -> None:
    """In a worker, before the payload's imports: the training process's levels and warning
    filters (``settings()``), its warnings and records kept and sent on ``conn`` (a forked
    worker's root logger has the trainer's handlers: it logs through them), named as this
    worker's."""
    import multiprocessing

    levels, root_level, disable, filters = given
    for name, level in levels.items():  # (attributes: setLevel clears every logger's cache)
        logging.getLogger(name).level = level
    logging.root.setLevel(root_level)
    logging.disable(disable)
    warnings.resetwarnings()
    for action, message, category, module, lineno in filters:  # (in order: appended)
        always: Any = "always" if action in ("default", "module", "once") else action
        warnings.filterwarnings(always, message, _named(*category), module, lineno, append=True)
    setattr(warnings, "defaultaction", "always")  # (no filter that matches: each said)
    warnings.showwarning = _KEPT.warning
    if not logging.root.handlers:
        logging.root.addHandler(_HANDLER)
    multiprocessing.current_process().name = f"jaxloader-worker-{worker_id}"
    _KEPT.conn = conn
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_not_in_a_child)


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


def kept() -> Said | None:
    """What was kept since the last call, as the message that carries it; ``None`` if nothing."""
    with _KEPT.lock:
        if not (_KEPT.items or _KEPT.dropped):
            return None
        said = Said(_KEPT.items, _KEPT.dropped)
        _KEPT.items, _KEPT.dropped = [], 0
    return said


def send_kept(conn: Connection) -> None:
    """Sends what was kept (before a ``Done`` or ``Failed``: a warning of a batch's records is
    said before the batch is handed out)."""
    with _SENDING:  # (taken before: two threads' sends keep the items' order)
        said = kept()
        if said is not None:
            protocol.send(conn, said)


def stop_sending() -> None:
    """As the worker's pipe closes: what is said from then on is kept for ``spill()``."""
    _KEPT.conn = None


def spill() -> None:
    """As a worker ends: what was kept and not sent, on its standard error (a record a thread
    logged after the worker's last batch, an atexit hook's)."""
    _KEPT.conn = None
    said = kept()
    for _, plain in said.items if said is not None else ():
        print(f"{plain[7]} {logging.getLevelName(plain[2])} {plain[1]}: {plain[3]}"
              if plain[0] == "r" else f"{plain[2]}:{plain[3]}: {plain[1]}", file=sys.stderr)


def load(item: tuple) -> Any:
    """A kept item as it was (a ``LogRecord``, or a warning's ``(message, filename,
    lineno)``), or as its text where it does not unpickle here (an exception class whose
    ``__init__`` takes other arguments, a class this process lacks)."""
    pickled, plain = item
    try:
        if pickled is not None:
            return pickle.loads(pickled)
    except Exception:  # noqa: BLE001 - its text below
        pass
    if plain[0] == "w":
        return UserWarning(plain[1]), plain[2], plain[3]
    keys = ("name", "levelno", "msg", "pathname", "lineno", "funcName", "processName",
            "created")
    record = logging.makeLogRecord(dict(zip(keys, plain[1:])))
    record.levelname = logging.getLevelName(record.levelno)
    record.msecs = (record.created - int(record.created)) * 1000
    return record


class Heard:
    """The training process's end (the pool keeps one): says each worker's ``Said`` again."""

    def __init__(self) -> None:
        self.registry: dict = {}  # warn_explicit's: a warning shown once a loader ("default")
        self._modules: dict[str, str] = {}  # a warning's file: its module's name

    def replay(self, said: Said, worker: int) -> None:
        for item in said.items:
            told = load(item)
            if isinstance(told, logging.LogRecord):
                logger = logging.getLogger(told.name)
                if logger.isEnabledFor(told.levelno):
                    logger.handle(told)
                continue
            message, filename, lineno = told
            module = self._modules.get(filename) or self._modules.setdefault(
                filename, _module_of(filename))
            try:
                warnings.warn_explicit(message, type(message), filename, lineno, module,
                                       self.registry)
            except Warning as e:  # (the "error" action: a filter set since the workers began)
                raise WorkerError(
                    f"worker {worker} warned {type(e).__name__}: {e} ({filename}:{lineno}), "
                    "which this process's warning filters make an error: filters set after "
                    "the workers started are not theirs, so the step and record are not "
                    "known; set the filter before the loader is made (a worker then raises "
                    "it at the record, naming it), or ignore the warning") from e
        if said.dropped:
            _log.warning("worker %d logged and warned more than %d times in %g s: %d records "
                         "and warnings were dropped. Log less from a transform (a level, a "
                         "count), or configure logging in worker_init_fn to log there",
                         worker, MOST_KEPT, FLUSH_S, said.dropped)


def _item(told: Any, plain: tuple) -> tuple:
    """``told`` pickled (by ``cloudpickle`` where pickle cannot: a class of the script's
    ``__main__``; ``None`` where neither can), and its text."""
    try:
        return pickle.dumps(told, pickle.HIGHEST_PROTOCOL), plain
    except Exception:  # noqa: BLE001 - (pickle's and the objects' own errors alike)
        pass
    try:
        import cloudpickle  # a worker has it imported (its payload came by it)

        return cloudpickle.dumps(told, pickle.HIGHEST_PROTOCOL), plain
    except Exception:  # noqa: BLE001 - its text, then
        return None, plain


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
    warnings.showwarning = _showwarning


_showwarning = warnings.showwarning


def _module_of(filename: str) -> str:
    """The name of the module of ``filename`` in the training process, as ``warnings.warn``
    names it there (a filter's module is matched against it: ``__main__`` for the script's
    functions, as in the worker, where they run in their module's globals); the file's path
    less ``.py`` where none is."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return filename[:-3] if filename.endswith(".py") else filename
