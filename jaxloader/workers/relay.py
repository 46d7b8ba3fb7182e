"""A worker's log records and warnings, said again in the training process, as if its own code
had logged or warned them there.

::

    training process                                 worker
    Init(..., relay.settings())  ─────────────>  take(): the trainer's logger levels and
                                                 warning filters, warnings and the root
                                                 logger's records kept (run_init: unless
                                                 worker_init_fn configures logging itself)
    Heard.replay(said) <────── Said(items, ..) ──  (relay_worker.py) a new warning or a
                                                 record of WARNING and over at once, and
                                                 others every FLUSH_S, while the pipe has
                                                 room; all before each Done and Failed

A record goes to its logger's handlers in the training process (``Logger.handle``, as
``logging.handlers.QueueListener``'s cookbook recipe does), its message and traceback formatted
in the worker (``QueueHandler.prepare``), its ``processName`` the worker's
(``jaxloader-worker-3``); one that a handler in the worker wrote (a named logger's of
``worker_init_fn``, one a forked worker inherited) is not sent again. A warning goes through
``warnings.warn_explicit`` there: the trainer's filters of the moment, ``pytest.warns`` and
``catch_warnings(record=True)`` see it; a warning several workers give is shown once a loader
under the ``"default"`` action. A worker's filters are the trainer's as it starts: one made an
error raises where it is given, as with ``num_workers=0``; one shown once is shown again after
each task that gave it (``relay_worker.said_again``); one shown each time is counted, and the
count sent. A filter's category is matched by its module and name in a worker: no filter
makes a worker import a module (JAX) or fail on one it cannot. Levels are the trainer's as its
workers start. Up to ``MOST_KEPT`` wait in a worker (the training process
reads them as it reads batches, in ``next()``); more are counted and the count said.

Example:
    >>> import subprocess, sys
    >>> from jaxloader.workers.launch import PACKAGE_ROOT
    >>> code = '''
    ... import logging, warnings
    ... from jaxloader.workers import relay, relay_worker
    ... relay_worker.take(relay.settings(), 0, None)
    ... logging.getLogger("aug").info("dropped: below the trainer's level")
    ... logging.getLogger("aug").warning("record %d is blank", 7)
    ... warnings.warn("fell back to bilinear")
    ... told = [relay.load(item) for item in relay_worker.kept()[0]]
    ... print(told[0].getMessage(), told[0].processName, "|", *told[1])
    ... '''
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
    ...                cwd=PACKAGE_ROOT).stdout.strip()
    'record 7 is blank jaxloader-worker-0 | fell back to bilinear <string> 7 __main__'
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import traceback
import warnings
from typing import Any

from jaxloader.base.errors import WorkerError
from jaxloader.workers import protocol
from jaxloader.workers.protocol import Failed, Said

MOST_KEPT = 50_000  # records and warnings a worker keeps for the training process to read
FLUSH_S = 0.1  # how often a worker sends the records kept, where the pipe has room
_log = logging.getLogger("jaxloader")

def settings() -> tuple:
    """What a worker takes from the training process: its loggers' levels (those set), the
    level ``logging.disable`` set, and its warning filters, each category by its module and
    name (a class of the script's ``__main__``, or of a module a worker cannot import, would
    not unpickle there; one of JAX's would import JAX), and its recursion limit (a script's
    ``sys.setrecursionlimit(10_000)`` for a deep transform: a RecursionError with workers
    alone)."""
    manager = logging.root.manager
    levels = {name: logger.level for name, logger in list(manager.loggerDict.items())
              if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET}
    filters = [(action, getattr(message, "pattern", ""),
                (category.__module__, getattr(category, "__qualname__", "Warning")),
                getattr(module, "pattern", ""), lineno)
               for action, message, category, module, lineno in list(warnings.filters)]
    return levels, logging.root.level, manager.disable, filters, sys.getrecursionlimit()


def load(item: list) -> Any:
    """A kept item (``[pickled, text, repeats]``) as it was: a ``LogRecord``, or a warning's
    ``(message, filename, lineno, module)`` (``module`` ``None`` where the worker found none);
    or as its text where it does not unpickle here (an exception class whose ``__init__``
    takes other arguments, a class this process lacks)."""
    pickled, plain = item[0], item[1]
    try:
        if pickled is not None:
            return pickle.loads(pickled)
    except Exception:  # noqa: BLE001 - its text below
        pass
    if plain[0] == "w":
        return UserWarning(plain[1]), plain[2], plain[3], None
    keys = ("name", "levelno", "msg", "pathname", "lineno", "funcName", "processName",
            "created")
    record = logging.makeLogRecord(dict(zip(keys, plain[1:])))
    record.levelname = logging.getLevelName(record.levelno)
    record.msecs = (record.created - int(record.created)) * 1000
    return record


class Heard:
    """The training process's end (the pool keeps one): says each worker's ``Said`` again."""

    def __init__(self) -> None:
        self.registries: dict[str, dict] = {}  # warn_explicit's, a file each (a module's
        # in Python; "default": shown once a loader)
        self._modules: dict[str, str] = {}  # a warning's file: its module's name

    def replay(self, said: Said, worker: int) -> None:
        for item in said.items:
            told = load(item)
            if isinstance(told, logging.LogRecord):
                logger = logging.getLogger(told.name)
                if logger.isEnabledFor(told.levelno):
                    _handle(logger, told, worker)
                continue
            message, filename, lineno, module = told
            if module is None:  # (a file no module of the worker's is: the script's)
                module = self._modules.get(filename) or self._modules.setdefault(
                    filename, _module_of(filename))
            registry = self.registries.setdefault(filename, {})
            for _ in range(1 + item[2]):  # (and as many times as it was given again)
                self._warn(worker, message, filename, lineno, module, registry)
                text = str(message)  # (shown once under "default" or "module": no more calls)
                if registry.get((text, type(message), lineno)) or registry.get(
                        (text, type(message), 0)):
                    break
        if said.dropped:
            _log.warning("worker %d logged and warned more than %d times before this process "
                         "read them (it reads them as it reads batches, in next()): %d records "
                         "and warnings were dropped. Log less from a transform (a level, a "
                         "count), or configure logging in worker_init_fn to log there",
                         worker, MOST_KEPT, said.dropped)

    def last_words(self, conn: Any, worker: int) -> Failed | None:
        """What worker ``worker``, found dead or being stopped, said and left unread in its
        pipe (``conn``): its last records, an error logged just before a kill, a thread's
        record after its last batch, replayed; the first failure it reported (why it ended:
        a ``worker_init_fn`` that raised, found as a task sent to it met no reader) returned;
        the rest dropped. Read without waiting (a message cut short, whose end never comes
        where a process the worker forked holds the pipe)."""
        failed = None
        try:
            fd = conn.fileno()
            blocking = os.get_blocking(fd)
        except (OSError, ValueError):  # (closed)
            return None
        os.set_blocking(fd, False)
        try:
            while conn.poll(0):
                message = protocol.receive(conn)
                if type(message) is Said:
                    self.replay(message, worker)
                elif type(message) is Failed and failed is None:
                    failed = message
        except Exception:  # noqa: BLE001 - a message cut, a record that fails: the rest goes
            pass
        finally:
            os.set_blocking(fd, blocking)
        return failed

    def all_last_words(self, workers: list) -> None:
        """``last_words`` of each worker in ``workers`` (``WorkerProcess``es), as they stop."""
        for worker, process in enumerate(workers):
            self.last_words(process.conn, worker)

    def _warn(self, worker: int, message: Warning, filename: str, lineno: int,
              module: str, registry: dict) -> None:
        try:
            warnings.warn_explicit(message, type(message), filename, lineno, module, registry)
        except Warning as e:  # (the "error" action: a filter set since the workers began)
            raise WorkerError(
                f"worker {worker} warned {type(e).__name__}: {e} ({filename}:{lineno}), "
                "which this process's warning filters make an error: filters set after "
                "the workers started are not theirs, so the step and record are not "
                "known; set the filter before the loader is made (a worker then raises "
                "it at the record, naming it), or ignore the warning") from e


def _handle(logger: logging.Logger, record: logging.LogRecord, worker: int) -> None:
    """``record`` to ``logger``'s handlers, with the fields this process's record factory adds
    (``logging.setLogRecordFactory``: a rank a format names, which the worker's record lacks:
    "Formatting field not found"); a handler that raises is said as ``logging`` says one
    (``Handler.handleError``), not raised: raised in ``next()``, it was a bare error naming no
    step, the workers were started again and the batch's records logged twice."""
    factory = logging.getLogRecordFactory()
    try:
        if factory is not logging.LogRecord:  # (what it adds, a rank, and what it changes,
            given = (record.name, record.levelno, record.pathname, record.lineno,  # a prefix)
                     record.msg, record.args, None, record.funcName, record.stack_info)
            made, plain = vars(factory(*given)), vars(logging.LogRecord(*given))
            record.__dict__.update({k: v for k, v in made.items() if k not in vars(record) or (
                k not in _THIS_PROCESS and k in plain and v != plain[k])})
        logger.handle(record)
    except Exception:  # noqa: BLE001 - said below, as logging says a failing handler
        if logging.raiseExceptions:
            sys.stderr.write(f"--- Logging error (worker {worker}'s record of "
                             f"{record.pathname}:{record.lineno}, said again here) ---\n")
            traceback.print_exc(file=sys.stderr)


_THIS_PROCESS = {"created", "msecs", "relativeCreated", "thread", "threadName", "process",
                 "processName", "taskName"}  # (a record's fields of where and when it was made)


def _module_of(filename: str) -> str:
    """The name of the module of ``filename`` in the training process, as ``warnings.warn``
    names it there (a filter's module is matched against it: ``__main__`` for the script's
    functions, as in the worker, where they run in their module's globals); the file's path
    less ``.py`` where none is."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return filename[:-3] if filename.endswith(".py") else filename
