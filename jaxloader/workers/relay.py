"""A worker's log records and warnings, said again in the training process, as if its own code
had logged or warned them there.

::

    training process                                 worker
    Init(..., relay.settings())  ─────────────>  take(): the trainer's logger levels and
                                                 warning filters, warnings and the root
                                                 logger's records kept (run_init: unless
                                                 worker_init_fn configures logging itself)
    Heard.replay(said) <───── Said(records, ..) ─  before each Done and Failed: what was kept

A record goes to its logger's handlers in the training process (``Logger.handle``, as
``logging.handlers.QueueListener``'s cookbook recipe does), its message and traceback formatted
in the worker (``QueueHandler.prepare``), its ``processName`` the worker's
(``jaxloader-worker-3``). A warning goes through ``warnings.warn_explicit`` there: the
trainer's filters of the moment, ``pytest.warns`` and ``catch_warnings(record=True)`` see it,
and a warning several workers give is shown once a loader under the ``"default"`` action (the
workers' filters are the trainer's as they start: a warning made an error raises where it is
given, as with ``num_workers=0``). Levels are the trainer's as its workers start: a worker
logs no record its logger would drop there. Up to ``MOST_KEPT`` between two messages; more are
counted and the count said. Without this a worker's ``log.info`` went nowhere and its warnings
to its standard error, out of ``pytest.warns``' and the trainer's handlers' reach.

Example:
    >>> import subprocess, sys
    >>> from jaxloader.workers.launch import PACKAGE_ROOT
    >>> code = '''
    ... import logging, warnings
    ... from jaxloader.workers import relay
    ... relay.take(relay.settings(), 0)
    ... logging.getLogger("aug").warning("record %d is blank", 7)
    ... warnings.warn("fell back to bilinear")
    ... said = relay.kept()
    ... print([r.getMessage() for r in said.records], [str(w[0]) for w in said.warnings])
    ... '''
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
    ...                cwd=PACKAGE_ROOT).stdout.strip()
    "['record 7 is blank'] ['fell back to bilinear']"
"""

from __future__ import annotations

import logging
import logging.handlers
import pickle
import sys
import threading
import warnings
from multiprocessing.connection import Connection
from typing import Any, Callable

from jaxloader.workers import protocol
from jaxloader.workers.protocol import Said

MOST_KEPT = 10_000  # records and warnings a worker keeps between two messages
_log = logging.getLogger("jaxloader")


def settings() -> tuple:
    """What a worker takes from the training process: its loggers' levels (those set), the
    level ``logging.disable`` set, and its warning filters (by ``cloudpickle``: a filter's
    category may be a class of the script's ``__main__``, which a worker's lacks)."""
    import cloudpickle

    manager = logging.root.manager
    levels = {name: logger.level for name, logger in list(manager.loggerDict.items())
              if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET}
    levels[""] = logging.root.level
    return levels, manager.disable, cloudpickle.dumps(list(warnings.filters))


class _Kept:
    """What the worker's code said since the worker's last message (any of its threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[logging.LogRecord] = []
        self.warnings: list[tuple] = []
        self.dropped = 0

    def put_nowait(self, record: logging.LogRecord) -> None:  # (QueueHandler's queue)
        with self.lock:
            if len(self.records) + len(self.warnings) < MOST_KEPT:
                self.records.append(record)
            else:
                self.dropped += 1

    def warning(self, message: Any, category: type, filename: str, lineno: int,
                file: Any = None, line: str | None = None) -> None:  # (warnings.showwarning)
        if not isinstance(message, Warning):
            message = category(message)
        with self.lock:
            if len(self.records) + len(self.warnings) < MOST_KEPT:
                self.warnings.append((message, filename, lineno))
            else:
                self.dropped += 1


_KEPT = _Kept()
_HANDLER = logging.handlers.QueueHandler(_KEPT)  # type: ignore[arg-type]


def take(given: tuple, worker_id: int) -> None:
    """In a worker, before the payload's imports: the training process's levels and warning
    filters (``settings()``), its warnings and records kept (a forked worker's root logger has
    the trainer's handlers: it logs through them), named as this worker's."""
    import multiprocessing
    import pickle

    levels, disable, filters = given
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)
    logging.disable(disable)
    warnings.resetwarnings()
    for action, message, category, module, lineno in pickle.loads(filters):  # (in order)
        warnings.filterwarnings(action, getattr(message, "pattern", ""), category,
                                getattr(module, "pattern", ""), lineno, append=True)
    warnings.showwarning = _KEPT.warning
    if not logging.root.handlers:
        logging.root.addHandler(_HANDLER)
    multiprocessing.current_process().name = f"jaxloader-worker-{worker_id}"


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
        if not (_KEPT.records or _KEPT.warnings or _KEPT.dropped):
            return None
        said = Said(_KEPT.records, _KEPT.warnings, _KEPT.dropped)
        _KEPT.records, _KEPT.warnings, _KEPT.dropped = [], [], 0
    return said


def send_kept(conn: Connection) -> None:
    """Sends what was kept, before a ``Done`` or ``Failed`` (so a warning of a batch's records
    is said before the batch is handed out). A record whose ``extra`` fields, or a warning,
    that pickles not even by ``cloudpickle`` goes as its text."""
    said = kept()
    if said is None:
        return
    try:
        protocol.send(conn, said)
        return
    except (pickle.PicklingError, AttributeError, TypeError):
        pass
    records = [r if _pickles(r) else _plain(r) for r in said.records]
    told = [w if _pickles(w) else (UserWarning(f"{type(w[0]).__name__}: {w[0]}"), *w[1:])
            for w in said.warnings]
    protocol.send(conn, Said(records, told, said.dropped))


def spill() -> None:
    """As a worker ends: what was kept and not sent, on its standard error (a record a thread
    logged after the worker's last batch, an atexit hook's)."""
    said = kept()
    if said is None:
        return
    for record in said.records:
        print(f"{record.processName} {record.levelname} {record.name}: {record.msg}",
              file=sys.stderr)
    for message, filename, lineno, _ in said.warnings:
        print(warnings.formatwarning(message, type(message), filename, lineno),
              end="", file=sys.stderr)


class Heard:
    """The training process's end (the pool keeps one): says each worker's ``Said`` again."""

    def __init__(self) -> None:
        self.registry: dict = {}  # warn_explicit's: a warning shown once a loader ("default")
        self._modules: dict[str, str] = {}  # a warning's file: its module's name

    def replay(self, said: Said, worker: int) -> None:
        for record in said.records:
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)
        for message, filename, lineno in said.warnings:
            module = self._modules.get(filename) or self._modules.setdefault(
                filename, _module_of(filename))
            warnings.warn_explicit(message, type(message), filename, lineno, module,
                                   self.registry)
        if said.dropped:
            _log.warning("worker %d logged and warned more than %d times between two of its "
                         "messages: %d records and warnings were dropped. Log less from a "
                         "transform (a level, a count), or configure logging in "
                         "worker_init_fn to log there", worker, MOST_KEPT, said.dropped)


def _module_of(filename: str) -> str:
    """The name of the module of ``filename`` in the training process, as ``warnings.warn``
    names it there (a filter's module is matched against it: ``__main__`` for the script's
    functions, as in the worker, where they run in their module's globals); the file's path
    less ``.py`` where none is."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return filename[:-3] if filename.endswith(".py") else filename


def _pickles(item: Any) -> bool:
    import cloudpickle  # a worker has it imported (its payload came by it)

    try:
        cloudpickle.dumps(item)
        return True
    except Exception:  # noqa: BLE001 - (pickle's and the objects' own errors alike)
        return False


def _plain(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` without the fields a user added (``extra=``): those did not pickle."""
    standard = logging.makeLogRecord({}).__dict__
    return logging.makeLogRecord({k: v for k, v in record.__dict__.items() if k in standard})
