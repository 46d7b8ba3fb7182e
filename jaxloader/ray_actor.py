"""What runs in a Ray actor (``jaxloader.ray``): the batch maker, its tasks, their timings.

::

    MakerActor(payload, *actor_arguments(i, n, actor_options))
                                    the maker unpickled once (its arrays the object store's)
      .where()                      (its pid, its node: node_label's)
      .make(first, count)           steps first .. first + count - 1: (batches, timings,
                                    where, failed)
      .make_stream(first, count, stride, reset)
                                    a stream's steps of the readers it hosts, each batch with
                                    its reader's state after it: (made, timings, where,
                                    failed)

``failed``: ``None``, or a step that raised (``workers.protocol.Failed``: its exception and
traceback), the batches before it made: they are handed out first, as a local worker's are.
(Its pid and node with each task: an actor Ray restarted while it had no task is seen by its
next.)
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import cloudpickle
import numpy as np

from jaxloader.base import file_identity, read_threads
from jaxloader.base.stats import queued_s
from jaxloader.batching import jit_cpu
from jaxloader.engines.in_process import Maker
from jaxloader.runtime import worker_info
from jaxloader.workers import relay, relay_worker
from jaxloader.workers.process import THREAD_DEFAULTS, WORKER_ENVIRONMENT, jax_environment
from jaxloader.workers.by_value import dumps_by_value
from jaxloader.workers.payload import SHARE_MIN_BYTES
from jaxloader.workers.protocol import Failed, failed
from jaxloader.workers.source_copies import NOTED_MIN_BYTES


CORE_WAIT_S = 0.25  # an actor reads its threads' waits for a core at most this often


def node_label() -> str:
    """This actor's node: its address and Ray's node id, 8 hex digits (the nodes of a
    cluster may share an address, as ``ray.cluster_utils.Cluster``'s do)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return f"{ray.util.get_node_ip_address()}, node {node[:8]}"


class MakerActor:
    """A Ray actor's body: the batch maker, unpickled where the actor runs once the training
    process's ``sys.path`` is there (its functions' modules, pickled by name, are then found,
    as a local worker's are); its arrays are the object store's, not copied."""

    def __init__(self, payload: tuple, path: list[str], argv: list[str] | None = None,
                 settings: tuple | None = None, place: tuple[int, int] | None = None,
                 folder: str | None = None) -> None:
        """``place``: ``(this actor's index, the actors)``, what ``get_worker_info()`` says
        in it as in a local worker (it said ``None``: code that opens a handle a worker, or
        asks whether it runs in one, took the actor for the training process). ``folder``:
        the training process's current folder, the actor's where it is there (a transform's
        relative path read another file, or none, where a local worker's read the one meant),
        unless ``runtime_env`` (the actor's or its job's) sets its own (``working_dir``)."""
        jit_cpu.IN_WORKER = True  # (its JitMaps' XLA sized to THREADS_ENV, donating)
        if folder is not None and os.path.isdir(folder) and not _working_dir_set():
            os.chdir(folder)
        if settings is not None:  # (a script's recursion limit for a deep transform, its
            relay_worker.apply(settings)  # warning filters: as a local worker's)
        sys.path.extend(p for p in path if p not in sys.path)
        if argv is not None:  # (a module that parses the command line as it is imported reads
            sys.argv[:] = argv  # the training script's, as in a local worker: workers/ties.py)
        blob, buffers = payload
        self._maker: Maker = relay_worker.imported(
            lambda: cloudpickle.loads(blob, buffers=buffers))
        read_threads.keep()  # (its read threads stay from one task to the next)
        self._waited = (time.monotonic(), queued_s(os.getpid()))  # (_core_wait's last read)
        if place is not None:
            worker_info.set_info(worker_info.WorkerInfo(*place, self._maker.seed))
        self._where = (os.getpid(), node_label())
        file_identity.RAY_NODE = self._where[1]  # (a file missing here: said of this node)

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> tuple[int, str]:
        """This process's pid and node, as the training process's messages name them."""
        return self._where

    def make(self, first: int, count: int,
             trace: bool = False) -> tuple[list, tuple, tuple[int, str], Failed | None]:
        """The batches of steps ``first .. first + count - 1`` (one object, one message),
        the task's stage timings (``jaxloader.base.timings``, as a local worker sends them)
        and this process's ``where()``."""
        began, cpu = self._clock(trace)
        made: list = []
        try:
            for step in range(first, first + count):
                made.append(self._maker.make(step)[0])
        except KeyboardInterrupt:  # (Ray's own, a task cancelled)
            raise
        except BaseException as e:  # noqa: BLE001 - the batches before it are handed out, then
            # this is raised (a transform's sys.exit() too, which ended the actor)
            return made, self._timings(began, cpu), self._where, failed(-1, step, e)
        return made, self._timings(began, cpu), self._where, None

    def make_stream(self, first: int, count: int, stride: int, reset: list | None,
                    trace: bool = False) -> tuple[list, tuple, tuple[int, str], Failed | None]:
        """A stream's task (``make_stream`` below), its stage timings and ``where()``."""
        began, cpu = self._clock(trace)
        made: list = []
        try:
            make_stream(self._maker, first, count, stride, reset, made)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - (sys.exit() too, as make's)
            step = first + len(made) * stride
            return made, self._timings(began, cpu), self._where, failed(-1, step, e)
        return made, self._timings(began, cpu), self._where, None

    def _clock(self, trace: bool) -> tuple[float, float]:
        if (self._maker.clock.trace is not None) != trace:  # (a profile's timeline asked for)
            self._maker.clock.trace = [] if trace else None
        return time.perf_counter(), time.process_time()

    def _timings(self, began: float, cpu: float) -> tuple:
        """The task's stage timings, the seconds this process waited for a core
        (``_core_wait``: read here, the training process has no /proc of another machine's,
        and took a core's wait for a read's), and when it began by the wall clock (the
        training process drops those of a task begun before its ``reset_stats()``: an
        actor's monotonic clock may be another machine's)."""
        busy = time.perf_counter() - began
        return (busy, time.process_time() - cpu, *self._maker.clock.take(busy),
                self._core_wait(), time.time() - busy)

    def _core_wait(self) -> float:
        """Seconds this process's threads waited for a core since the last read, read at most
        every ``CORE_WAIT_S`` (each read lists every thread's schedstat: ~0.2 ms in an actor
        of 20 threads, a task's cost where tasks are short); 0 between."""
        now = time.monotonic()
        if now - self._waited[0] < CORE_WAIT_S:
            return 0.0
        total = queued_s(os.getpid())
        waited, self._waited = total - self._waited[1], (now, total)
        return max(0.0, waited)  # (threads that ended since take their waits with them)


def make_stream(maker: Any, first: int, count: int, stride: int, reset: list | None,
                made: list | None = None) -> list:
    """An actor's task: steps ``first``, ``first + stride``, ... (``count`` of them) of the
    readers it hosts, each batch with its reader's state after it, appended to ``made``;
    ``reset``: those readers' states to continue from (a run's first task, or a new
    actor's)."""
    if reset is not None:
        maker.reset(reset)
    made = [] if made is None else made
    for k in range(count):
        batch, _ = maker.make(first + k * stride)
        made.append((batch, maker.report()))
    return made


def payload(maker: Any, note: Callable[[np.ndarray], None]) -> tuple[bytes, list]:
    """``maker`` pickled for the actors (``dumps_by_value``): the blob, and its arrays of
    ``SHARE_MIN_BYTES`` or more as out-of-band buffers (the object store's: every actor on a
    node reads the same memory; a smaller one in the blob, writable where it lands, as
    locally); each array of ``NOTED_MIN_BYTES`` or more given to ``note`` (``Copies``)."""
    buffers: list = []

    def out_of_band(buffer: Any) -> bool:
        view = buffer.raw()
        if isinstance(view.obj, np.ndarray) and view.nbytes >= NOTED_MIN_BYTES:
            note(view.obj)
        if view.nbytes < SHARE_MIN_BYTES:
            return True
        buffers.append(buffer)
        return False
    blob = dumps_by_value(maker, out_of_band)
    return blob, [np.frombuffer(b.raw(), np.uint8) for b in buffers]


def actor_arguments(index: int, count: int, options: dict) -> tuple:
    """A new ``MakerActor``'s arguments past the payload: the training process's ``sys.path``,
    ``sys.argv`` and ``relay.settings()``, as they are now, its place among ``count`` and the
    current folder (none where the actor ``options``' ``runtime_env`` has a ``working_dir``)."""
    own = "working_dir" in (options.get("runtime_env") or {})
    return (list(sys.path), list(sys.argv), relay.settings(), (index, count),
            None if own else _current_folder())


def _working_dir_set() -> bool:
    """Whether this actor's ``runtime_env`` (its own, or its job's: ``ray.init(runtime_env=)``)
    has a ``working_dir``, which Ray made its current folder."""
    try:
        import ray

        return bool((ray.get_runtime_context().runtime_env or {}).get("working_dir"))
    except Exception:  # noqa: BLE001 - no Ray context here (a test's actor body): none
        return False


def _current_folder() -> str | None:
    """The current folder, ``None`` where it was deleted (``os.getcwd()`` raises there)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def with_worker_environment(options: dict) -> dict:
    """``options`` with local workers' environment in ``runtime_env``'s ``env_vars`` (JAX on the
    CPU, one thread a math library and for a JitMap's XLA; ``-O``, which a local worker is
    started with: a transform's ``assert`` acts alike), where it does not set them."""
    runtime_env = dict(options.get("runtime_env") or {})
    optimized = {"PYTHONOPTIMIZE": str(sys.flags.optimize)} if sys.flags.optimize else {}
    runtime_env["env_vars"] = {**THREAD_DEFAULTS, **WORKER_ENVIRONMENT, **optimized,
                               **jax_environment(os.environ),  # (this process's 64-bit JAX...)
                               **(runtime_env.get("env_vars") or {})}
    return {**options, "runtime_env": runtime_env}
