"""The exceptions jaxloader raises, and its one warning.

Every error says what was expected, what came instead, where (step, record position, leaf path)
and what to do. They derive from the builtin a user would catch anyway (``ValueError`` for bad
arguments and data), so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class JaxloaderError(Exception):
    """Base class of every error raised by jaxloader itself."""


class ConfigError(JaxloaderError, ValueError):
    """An argument of the loader or of a source is invalid."""


class RecordError(JaxloaderError, RuntimeError):
    """Reading or transforming one record failed.

    Names the step, the record position in its epoch and the source index; the original
    exception is kept as ``__cause__``.
    """


class CollateError(JaxloaderError, ValueError):
    """Records of one batch cannot be stacked: structure, shape or dtype differ."""


class StateDictError(JaxloaderError, ValueError):
    """A state dict does not fit this loader (other data, seed, batch or version)."""


class WorkerError(JaxloaderError, RuntimeError):
    """A worker process raised or died. The loader is broken: every later call raises this.

    Names the worker id, its pid, its exit code or the exception, the step and record
    positions, and carries the worker's traceback in the message.
    """


class StallError(WorkerError):
    """No batch came within the loader's ``timeout_s``: names the step awaited and what each
    worker was doing then (its step, for how long, its process state and Python stack). The
    loader is broken, as for any ``WorkerError``."""


class SharedMemoryError(JaxloaderError, MemoryError):
    """Shared memory for a batch or a shared source could not be reserved.

    Names the bytes asked for, what was free (memory, or ``/dev/shm`` on the POSIX path) and
    what to do. Raised where the memory is asked for (at construction for a shared source, at
    the batch that needs a bigger slot), never as a SIGBUS during a copy.
    """


class PerformanceWarning(UserWarning):
    """A configuration that works but reads far slower than it could: what, by how much, and
    the remedy (e.g. a file source's cache smaller than what its shuffle reads at once)."""
