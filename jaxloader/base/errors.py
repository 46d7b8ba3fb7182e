"""The exceptions jaxloader raises, and its warnings.

Every error says what was expected, what came instead, where (step, record position, leaf path)
and what to do. They derive from the builtin a user would catch anyway (``ValueError`` for bad
arguments and data), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar, cast

E = TypeVar("E", bound=BaseException)


class JaxloaderError(Exception):
    """Base class of every error raised by jaxloader itself.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> try:
        ...     jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=0)
        ... except jl.JaxloaderError as e:  # (each names what, expected, received, remedy)
        ...     type(e).__name__
        'ConfigError'
    """


def kept(error: E) -> E:
    """A copy of ``error`` for a broken loader to keep, and raise anew at every later call
    (``again``): with no traceback, nor its causes. A traceback holds its frames, and each
    finished frame the frame that called it (Python 3.11+), so a loader broken by a worker's
    error, or that error kept once handled, held the training function's frame and its
    locals (its model, its last batch and that batch's slot) as long as either was kept: 16
    MiB a trial of a sweep that kept its loaders (the soak audit)."""
    return _frameless(error)


def again(error: E) -> E:
    """A copy of ``error`` (``kept``) to raise: a raise gives an exception the raiser's frames
    (a broken loader asked five times showed five calls' frames, and kept their locals alive).

    Example:
        >>> error = kept(WorkerError("worker 0 died"))
        >>> for _ in range(3):
        ...     try:
        ...         raise again(error)
        ...     except WorkerError as e:
        ...         frames, tb, said = 0, e.__traceback__, str(e)
        ...         while tb is not None:
        ...             frames, tb = frames + 1, tb.tb_next
        >>> frames, error.__traceback__, said
        (1, None, 'worker 0 died')
    """
    return _frameless(error)


def _frameless(error: E, depth: int = 0) -> E:
    """``error`` copied (its class, arguments, attributes and notes) with its cause and
    context, themselves so copied where they hold a traceback. One that cannot be copied as
    it reads (an ``__init__`` of other arguments than it keeps: its copy fails, or says other
    text) is, as a link, a stand-in of its type's name and text; a group's exceptions are
    copied with it."""
    import copy

    made: Any = None
    try:
        if isinstance(error, BaseExceptionGroup):
            made = error.derive([_frameless(e, depth + 1) for e in error.exceptions])
            made.__dict__.update(error.__dict__)
        else:
            made = copy.copy(cast(BaseException, error))
        alike = type(made) is type(error) and str(made) == str(error)
    except Exception:  # noqa: BLE001 - (a stand-in below)
        alike = False
    if not alike:
        if depth == 0:
            return error  # (the loader's own WorkerError copies; another kind is kept as is)
        return cast(E, _StandIn(f"{type(error).__module__}.{type(error).__qualname__}: "
                                f"{error}"))
    if "__notes__" in error.__dict__:  # (its own list: a note added to one raised is not
        made.__notes__ = list(error.__notes__)  # said by every later one)
    seen = _Seen()
    for link in ("__cause__", "__context__"):
        linked = getattr(error, link)
        if linked is not None and depth < _LINKS and seen.holds_frames(linked, depth):
            linked = _frameless(linked, depth + 1)
        setattr(made, link, linked if depth < _LINKS else None)
    made.__suppress_context__ = error.__suppress_context__
    return made


class _StandIn(Exception):
    """An exception of a broken loader's error's chain that could not be copied without its
    frames: its type's name and text."""


class _Seen:
    """What the exceptions of a chain were found to hold (a cause that is also the context:
    each looked at once, where a chain of 20 took 2**20 looks)."""

    def __init__(self) -> None:
        self._found: dict[int, bool] = {}

    def holds_frames(self, error: BaseException, depth: int) -> bool:
        """Whether ``error``, an exception it links to or one of its group holds a
        traceback."""
        if id(error) in self._found or depth > _LINKS:  # (one being looked at: a cycle)
            return self._found.get(id(error), False)
        self._found[id(error)] = False
        linked = [error.__cause__, error.__context__, *getattr(error, "exceptions", ())]
        found = self._found[id(error)] = error.__traceback__ is not None or any(
            e is not None and self.holds_frames(e, depth + 1) for e in linked)
        return found


_LINKS = 16  # causes and contexts followed at most (a chain of more is cut there)


class ConfigError(JaxloaderError, ValueError):
    """An argument of the loader or of a source is invalid (a ``ValueError``).

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> try:
        ...     jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
        ...                   last_batch="keep")
        ... except jl.ConfigError as e:
        ...     isinstance(e, ValueError), "last_batch" in str(e)
        (True, True)
    """


class ArgumentError(JaxloaderError, TypeError):
    """A call's arguments do not fit its signature: a second positional argument, a missing
    one, or a name the callee does not take (PyTorch's, Grain's and tf.data's names say what
    to pass instead). A ``TypeError``, as Python's own for a bad call.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> try:
        ...     jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, drop_last=True)
        ... except jl.ArgumentError as e:
        ...     print(str(e).split(": use ")[0])
        DataLoader(drop_last=True): DataLoader has no drop_last
    """


class RecordError(JaxloaderError, RuntimeError):
    """Reading or transforming one record failed.

    Names the step, the record position in its epoch and the source index; the original
    exception is kept as ``__cause__``. A ``DataLoader``'s error about one record also has them
    as attributes, ``step``, ``position`` and ``index`` (``None`` where not known: a stream's
    record, a batch's error), for a job that reports the records it could not read.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> def check(record):
        ...     if record["x"] == 5:
        ...         raise ValueError("bad value")
        ...     return record
        >>> try:
        ...     list(jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
        ...                        transforms=[jl.Map(check)]))
        ... except jl.RecordError as e:
        ...     e.step, e.position, e.index, type(e.__cause__).__name__
        (2, 5, 5, 'ValueError')
    """

    step: int | None = None
    position: int | None = None
    index: int | None = None

    def at(self, step: int, position: int, index: int) -> "RecordError":
        """This error with the record it is about, in the loader that raises it (one a loader
        read inside a source raised is about that loader's record: replaced)."""
        self.step, self.position, self.index = step, position, index
        return self


class CollateError(JaxloaderError, ValueError):
    """Records of one batch cannot be stacked: structure, shape or dtype differ.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> records = [{"x": np.zeros(2)}, {"x": np.zeros(3)}]
        >>> try:
        ...     next(iter(jl.DataLoader(records, batch_size=2)))
        ... except jl.CollateError as e:  # (the remedy: pad them, jl.Pad("x"))
        ...     print(str(e).split("): ", 1)[1].split(" dtype")[0])
        batch leaf ['x']: records differ: record position 0 has shape (2,)
    """


class StateDictError(JaxloaderError, ValueError):
    """A state dict does not fit this loader (other data, seed, batch or version).

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> source = jl.ArraySource({"x": np.arange(8)})
        >>> state = jl.DataLoader(source, batch_size=2).state_dict()
        >>> try:
        ...     jl.DataLoader(source, batch_size=4).load_state_dict(state)
        ... except jl.StateDictError as e:
        ...     print(str(e).split(";")[0])
        state does not fit this loader (global_batch_size: expected 4, received 2)
    """


class WorkerError(JaxloaderError, RuntimeError):
    """A worker process raised or died. The loader is broken: every later call raises this.

    Names the worker id, its pid, its exit code or the exception, the step and record
    positions, and carries the worker's traceback in the message. A ``RecordError`` raised
    in a worker reaches you as this, its message after the worker's (a ``StallError`` is one
    too). A job that goes on after it makes a new loader and restores its last state::

        try:
            for batch in loader:
                state = loader.state_dict(); train_step(batch)
        except jl.WorkerError as e:
            log.error("input failed: %s", e)   # the worker, the step, its traceback
            loader = jl.DataLoader(source, **settings); loader.load_state_dict(state)
    """


class StallError(WorkerError):
    """No batch came within the loader's ``timeout_s``: names the step awaited and what each
    worker was doing then (its step, for how long, its process state and Python stack). The
    loader is broken, as for any ``WorkerError``. Asked for by ``timeout_s``::

        loader = jl.DataLoader(source, batch_size=64, num_workers=4, timeout_s=600)
        try:
            batch = next(it)
        except jl.StallError as e:
            print(e)    # step 1234 awaited 600 s; worker 2: in step 1236 for 598 s, its stack
    """


class SharedMemoryError(JaxloaderError, MemoryError):
    """Shared memory for a batch or a shared source could not be reserved.

    Names the bytes asked for, what was free (memory, or ``/dev/shm`` on the POSIX path) and
    what to do. Raised where the memory is asked for (at construction for a shared source, at
    the batch that needs a bigger slot), never as a SIGBUS during a copy; and with
    ``num_workers=0`` where the training process has no memory for a batch's arrays. A
    ``MemoryError``, so a handler of those catches it; in a container of 64 MB ``/dev/shm``
    (Docker's default) its remedy is ``--shm-size`` or fewer ``prefetch`` tasks::

        try:
            batch = next(it)
        except jl.SharedMemoryError as e:
            print(e)    # the bytes asked for, the free /dev/shm, what to change
    """


class JaxloaderWarning(UserWarning):
    """Base class of the warnings jaxloader gives: data it leaves out or cuts, a restore that
    reads other batches, a setting that works but surprises (each says what, where and the
    remedy). A ``UserWarning``, so filters of those keep working; filter jaxloader's alone by
    this class (the warnings name your line, not a module of jaxloader's).

    Example:
        >>> import warnings, jaxloader as jl
        >>> with warnings.catch_warnings():  # (an evaluation's loader: every record is read)
        ...     warnings.simplefilter("error", category=jl.JaxloaderWarning)
        ...     try:
        ...         jl.DataLoader(list(range(10)), batch_size=4, last_batch="drop")
        ...     except jl.JaxloaderWarning as e:
        ...         print(str(e)[:72])
        DataLoader(last_batch='drop', shuffle=False): the last 2 of the 10 recor
    """


class PerformanceWarning(JaxloaderWarning):
    """A configuration that works but reads far slower than it could: what, by how much, and
    the remedy (e.g. a file source's cache smaller than what its shuffle reads at once).

    Example:
        >>> import warnings, jaxloader as jl
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", jl.PerformanceWarning)  # (a CI run: raised)
        ...     issubclass(jl.PerformanceWarning, jl.JaxloaderWarning)
        True
    """


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARIES = tuple(p + os.sep for p in {sysconfig.get_paths().get(k) for k in (
    "stdlib", "platstdlib", "purelib", "platlib")} if p)


@contextlib.contextmanager
def closed_on_failure(close: Callable[[], object], what: str) -> Iterator[None]:
    """Runs the block; if it raises, calls ``close`` (what the block opened: ``what``) and
    raises the block's error again. A ``close`` that fails too is added to that error as a note,
    not raised in its place: the failure that came first is the one to fix.

    >>> try:
    ...     with closed_on_failure(lambda: 1 / 0, "the file"):
    ...         raise ValueError("bad header")
    ... except ValueError as e:
    ...     print(e, e.__notes__)
    bad header ['(closing the file afterwards failed too: ZeroDivisionError: division by zero)']
    """
    try:
        yield
    except BaseException as error:
        try:
            close()
        except Exception as failed:
            error.add_note(f"(closing {what} afterwards failed too: "
                           f"{type(failed).__name__}: {failed})")
        raise


def raised(error: BaseException) -> str:
    """``error`` as a message says what a read raised: its type, its text and the notes added
    to it on its way (``add_note``: a ``MapSource`` names its function so).

    Example:
        >>> e = ValueError("bad value 305")
        >>> e.add_note("in MapSource(boom)'s function")
        >>> raised(e)
        "ValueError: bad value 305 (in MapSource(boom)'s function)"
    """
    notes = [n for n in getattr(error, "__notes__", ()) if isinstance(n, str)]
    text = f"{type(error).__name__}{f': {error}' if str(error) else ''}"
    return text + (f" ({'; '.join(notes)})" if notes else "")


def user_stacklevel() -> int:
    """The ``stacklevel`` of a warning said by this function's caller at the first frame of
    the user's code up the stack: not jaxloader's, nor an installed library's (Orbax's, where
    it restores a state). A fixed level pointed into jaxloader or Orbax there, and Python's
    default filter said the warning once a process, however many restores. The first frame
    outside jaxloader where there is no user's code (in a worker, whose stack is jaxloader's,
    the caller's own line)."""
    frame: FrameType | None = sys._getframe(1)
    level, outside = 1, 0
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_PACKAGE) and not str(frame.f_globals.get("__name__")).startswith(
                "jaxloader.") and not frame.f_globals.get("__jaxloader_boot__"):  # (a
            # dataclass's __init__ is jaxloader's, made in "<string>"; so is a worker's -c)
            outside = outside or level
            if not name.startswith(_LIBRARIES) and not name.startswith("<frozen") and (
                    "site-packages" not in name and "dist-packages" not in name):
                return level
        frame, level = frame.f_back, level + 1
    return outside or 1
