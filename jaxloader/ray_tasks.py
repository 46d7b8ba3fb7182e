"""What the training process keeps of the tasks it sends to Ray actors (``jaxloader.ray``):
each actor's queue, which sets how long a task may take, and the errors of a task that raised.

::

    sent(actor, ref)       a task sent: at the end of its actor's queue (Ray runs an actor's
                           tasks in the order sent, those cancelled by a run left early too)
    wait_s(actor, ref)     timeout_s for the task and for each task still queued before it
    received(actor, ref)   its batches came back: out of the queue, with every task sent to
                           that actor before it (run before it); and a task done leaves the
                           queue as the next is sent (a run left early's results, which the
                           queue alone held, left Ray's object store only at close())

Example:
    >>> queues = TaskQueues(1)
    >>> first, second = queues.sent(0, "a"), queues.sent(0, "b")
    >>> queues.ahead(0, "b")
    ['a']
    >>> queues.received(0, "b"); queues.ahead(0, "b")  # (it ran "a" first)
    []
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable, Generator, Iterator

from jaxloader.base.errors import WorkerError
from jaxloader.workers.failures import raised
from jaxloader.workers.stalls import StallWatch
from jaxloader.workers.tasks import TASK_SECONDS  # (an actor's as a local worker's: Ray's
# ~1 ms a call is under 0.2% of it)

log = logging.getLogger("jaxloader")


class TaskQueues:
    """Each actor's tasks not known done, in the order sent."""

    def __init__(self, actors: int, ray: Any = None) -> None:
        self._queued: list[dict[Any, int]] = [{} for _ in range(actors)]
        self._sent = 0
        self._ray = ray

    def sent(self, actor: int, ref: Any) -> Any:
        """``ref``, a task just sent to ``actor``, noted at the end of its queue; the tasks
        Ray has done are let go first (``ray`` given): a run left early (a ``break``, a
        restore, a stream's pass, which sends past its end) dropped its tasks, whose results,
        up to ``task_bytes`` each, stayed in Ray's object store (spilled to disk) while the
        queue held their references."""
        queued = [r for queue in self._queued for r in queue]
        if self._ray is not None and queued:
            done, _ = self._ray.wait(queued, num_returns=len(queued), timeout=0)
            for queue in self._queued:
                for r in done:
                    queue.pop(r, None)
        self._sent += 1
        self._queued[actor][ref] = self._sent
        return ref

    def ahead(self, actor: int, ref: Any) -> list:
        """The tasks ``actor`` was sent before ``ref`` and that are not known done."""
        mine = self._queued[actor].get(ref, 0)
        return [r for r, n in self._queued[actor].items() if n < mine]

    def wait_s(self, ray: Any, timeout_s: float | None, actor: int, ref: Any) -> float | None:
        """How long to wait for task ``ref`` of ``actor``: ``timeout_s`` for it and for each
        task the actor runs before it (in flight, or cancelled and run anyway: a lost actor's
        tasks sent behind a survivor's own, a run left early); ``None``: wait."""
        if timeout_s is None:
            return None
        ahead = self.ahead(actor, ref)
        done: list = []
        if ahead:
            done, _ = ray.wait(ahead, num_returns=len(ahead), timeout=0)
            for r in done:
                self._queued[actor].pop(r, None)
        return timeout_s * (1 + len(ahead) - len(done))

    def received(self, actor: int, ref: Any) -> None:
        """Task ``ref`` of ``actor`` came back: out of its queue, and the tasks sent to it
        before ``ref``, which it ran first (a run left early's: see ``sent``)."""
        queue = self._queued[actor]
        mine = queue.pop(ref, None)
        if mine is not None and queue and next(iter(queue.values())) < mine:
            for earlier in [r for r, n in queue.items() if n < mine]:
                del queue[earlier]

    def clear(self, actor: int) -> None:
        """``actor`` is gone: its tasks with it."""
        self._queued[actor].clear()


def get(ray: Any, ref: Any, wait_s: float | None, watch: StallWatch | None,
        said: Callable[[], str]) -> Any:
    """``ray.get(ref)``, a ``GetTimeoutError`` past ``wait_s`` (``None``: no end), the wait said
    in the log every ``stall_warning_s`` meanwhile (``watch``'s; ``said()``: who makes it), as
    a local worker's is: it was waited for without a word, a hung transform's forever."""
    if watch is None or watch.warn_s is None:
        return _got(ray, ref, wait_s)
    began = time.monotonic()
    watch.begin(id(ref))
    while True:
        left = min(watch.left(), 3600.0)
        if wait_s is not None:
            left = min(left, max(0.0, wait_s - (time.monotonic() - began)))
        try:
            return _got(ray, ref, left)
        except ray.exceptions.GetTimeoutError:
            if wait_s is not None and time.monotonic() - began >= wait_s:
                raise
            watch.due(lambda: f"{said()} (Ray shows its stack: `ray stack` on its node, or the "
                      "dashboard)")


def _got(ray: Any, ref: Any, timeout: float | None) -> Any:
    """``ray.get(ref)``; the Ray session shut down meanwhile a ``WorkerError`` (``gone``)."""
    try:
        return ray.get(ref, timeout=timeout)
    except SystemExit as e:
        error = gone(ray, e)
        if error is None:
            raise
        raise error from None


def gone(ray: Any, e: BaseException) -> WorkerError | None:
    """The error for ``e``, a ``SystemExit(0)`` Ray's ``get``/``wait`` raise where the session
    shut down as they waited (``ray.shutdown()`` on another thread: it ended the training
    script with status 0 and no word), or ``None``: an exit of the process's own (a signal's
    handler's ``sys.exit(3)``, Ray still running or not) goes on as it is."""
    if isinstance(e, SystemExit) and e.code in (0, None) and not ray.is_initialized():
        return WorkerError(_GONE)
    return None


class RayStallWatch(StallWatch):
    """A ``StallWatch`` whose remedy for a wait too long is a Ray actor's (the loader's own
    ``timeout_s`` is refused with Ray workers)."""

    timed_out_by = "RayWorkers(n, timeout_s=) kills an actor that takes longer"


SESSION_S = 1.0
_SESSION_SEEN: dict[tuple, float] = {}  # a session -> until when it is taken as the one now


def session(ray: Any) -> tuple:
    """The Ray session this process is connected to: its cluster (the GCS's address, this
    node's id) and job; ``()`` where Ray is shut down."""
    if not ray.is_initialized():
        return ()
    context = ray.get_runtime_context()
    return getattr(context, "gcs_address", None), context.get_node_id(), context.get_job_id()


def _client(ray: Any) -> bool:
    """Whether this process reaches its cluster through Ray Client (whose asks go to a server)."""
    client = getattr(getattr(getattr(ray, "util", None), "client", None), "ray", None)
    return bool(client is not None and client.is_connected())


def check_session(ray: Any, then: tuple) -> None:
    """Raises where the Ray session the actors started in (``then``) is gone: a ``ray.shutdown()``
    since (a notebook's cell), maybe a new ``ray.init()``. A task sent then started a new local
    cluster (Ray's own ``ray.init()``) and failed there after seconds, a bare ``Exception``
    ("Can't find actor ... different cluster"), the new cluster left running. Ray shut down is
    asked each call, and this connection's job (a reconnect within ``SESSION_S`` is another,
    the actors gone: ~2 us); another session at most every ``SESSION_S`` (Ray Client asks a
    server, for the job too)."""
    now = time.monotonic()
    if ray.is_initialized() and now < _SESSION_SEEN.get(then, 0.0) and (
            _client(ray) or ray.get_runtime_context().get_job_id() == then[2]):
        return
    if session(ray) != then:
        raise WorkerError(_GONE)
    _SESSION_SEEN[then] = now + SESSION_S


_GONE = ("the Ray session this loader's actors ran in is gone (ray.shutdown() since they "
         "started), and the actors with it; make a new loader (after ray.init()), and load "
         "this one's state_dict() into it to continue where it stopped")


def step_failed(actor: int, pid: int | None, node: str | None, failed: Any,
                where: Callable[[int], str]) -> tuple[WorkerError, BaseException | None]:
    """The error of a step that raised in an actor (its ``workers.protocol.Failed``: the
    exception, the actor's traceback), named as a local worker's is, with its node, and its
    cause."""
    return raised(actor, _pid_text(pid or 0, node), failed, where, who="Ray actor")


def task_failed(who: str, first: int, count: int, e: Any, where: Callable[[int], str],
                stride: int = 1) -> tuple[WorkerError, BaseException]:
    """The error of a task Ray says raised (outside a step: its reply, say), naming the actor
    (``who``: ``actor_text``'s) and its steps, and its cause."""
    cause = e.cause if getattr(e, "cause", None) is not None else e
    return WorkerError(
        f"{who} raised making {steps_text(first, count, stride)} "
        f"({where(first)}): {type(cause).__name__}: {cause}; the loader is broken; fix the "
        "cause and create a new loader"), cause


def task_steps(leaves: list, task_bytes: int, step_s: float = 0.0) -> int:
    """Steps a task, from a batch's ``leaves`` and the seconds an actor took a step: as many
    as fit ``task_bytes`` and ``TASK_SECONDS``, at most ``MAX_STEPS``, at least one. (A task
    once sent is made whole: a run left early, or a new ``iter()``, waits for it.)

    Example:
        >>> import numpy as np
        >>> task_steps([np.zeros(1000)], 160 << 20), task_steps([np.zeros(1000)], 160 << 20, 0.2)
        (32, 2)
    """
    nbytes = sum(getattr(leaf, "nbytes", 0) for leaf in leaves)
    timed = int(TASK_SECONDS / step_s) if step_s > 0 else MAX_STEPS
    return max(1, min(MAX_STEPS, task_bytes // max(1, nbytes), timed))


def actor_text(actor: int, pid: int | None, node: str | None) -> str:
    """An actor as messages name it: its index, pid and node (``ray_actor.node_label``)
    once it ran: a file missing, or memory short, on one machine shows which.

    Example:
        >>> actor_text(1, 4720, "10.0.0.2, node 0316a2f4"), actor_text(2, None, None)
        ('Ray actor 1 (pid 4720 on 10.0.0.2, node 0316a2f4)', 'Ray actor 2')
    """
    return f"Ray actor {actor}" + (f" (pid {_pid_text(pid, node)})" if pid else "")


def _pid_text(pid: int, node: str | None) -> str:
    """An actor's pid, and its node once known: ``4720 on 10.0.0.2, node 0316a2f4``."""
    return f"{pid} on {node}" if node else str(pid)


def lost_reason(error: BaseException) -> str:
    r"""What Ray says an actor was lost of, short: its reason (the process died, and how; its
    node did, and why) without the fields it lists of the actor first; where its start raised,
    that and the error's last line (the review: a traceback's head, cut before its error);
    else (Ray's memory monitor's kill, a timeout) its message from its first line.

    Example:
        >>> lost_reason(RuntimeError("The actor died.\n\tpid: 7\n\tip: 10.0.0.2\nThe actor "
        ...     "died because its node has died.\n\tthe node was terminated: received SIGTERM"))
        'RuntimeError: The actor died because its node has died. the node was terminated: ...'
    """
    lines = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines()  # (Ray's, in colour)
    if len(lines) > 1 and lines[1].startswith("\t"):  # "The actor died ...", its fields
        lines = lines[1:]
        while lines and lines[0].startswith("\t"):  # (class_name, actor_id, pid, ip: named
            lines.pop(0)  # by us)
    elif getattr(error, "_actor_init_failed", False) or "Traceback (most" in str(error):
        last = next((line for line in reversed(lines) if line.strip()), "")
        lines = [lines[0][:_REASON_CHARS // 2] + " ...", last.strip()[:_REASON_CHARS // 2]]
    text = " ".join(line.strip() for line in lines if line.strip())
    text = text.split(" If the process was killed by the kernel OOM")[0]  # (Ray's advice on
    if len(text) > _REASON_CHARS:  # its own options; its list of causes, the OOM killer's
        text = text[:_REASON_CHARS - 3].rstrip() + "..."  # first, is kept)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


_REASON_CHARS = 400  # of Ray's reason for an actor lost, in a message


def all_gone(last: str, error: BaseException, first: int, stop: int) -> WorkerError:
    """The error once no actor is left: ``last`` (``actor_text``'s) went of ``error``, steps
    ``first..stop`` were in flight."""
    return WorkerError(
        f"every Ray actor is gone (the last: {last}, {lost_reason(error)}); steps "
        f"{first}..{stop} were in flight and are not made; check the cluster's nodes and "
        "memory (or whether making those steps ends a process: run them with num_workers=0), "
        "then create a new loader (or restore its last state into one)")


def lost_errors(ray: Any) -> tuple:
    """Ray's errors for an actor (or its object) gone: its steps are made again."""
    errors = ray.exceptions
    return tuple(getattr(errors, name) for name in (  # (OutOfMemoryError: Ray's memory
        "RayActorError", "ActorUnavailableError", "ObjectLostError", "OutOfMemoryError")
        if hasattr(errors, name))  # monitor killed it, which its steps may not do elsewhere)


MAX_STEPS = 32  # steps a task at most


def steps_text(first: int, count: int, stride: int = 1) -> str:
    """A task's steps for messages: ``first``, ``first + stride``, ... (``count`` of them).

    Example:
        >>> steps_text(4, 3), steps_text(4, 3, 2), steps_text(4, 1, 2), steps_text(4, 1)
        ('steps 4..6', 'steps 4, 6, ..., 8', 'step 4', 'step 4')
    """
    last = first + (count - 1) * stride
    if stride == 1 and count > 1:
        return f"steps {first}..{last}"
    return (f"step {first}" if count == 1 else f"steps {first} and {last}" if count == 2 else
            f"steps {first}, {first + stride}, ..., {last}")


WAIT_SAID_S = 10.0  # actors not all started after this long: the wait is said, once


def waiting_to_start(ray: Any, spec: Any, running: int, wanted: int, waited_s: float) -> bool:
    """Says (a warning) that the loader waits for actors the cluster has not placed: a wait
    for free CPUs went unsaid up to ``start_timeout_s`` (the Ray audit); True."""
    log.warning("%r: %d of the %d actors it waits for run after %.0f s; it waits up to "
                "start_timeout_s=%g s in all for the cluster to place the others (each asks "
                "%s; the cluster has %s free of %s)", spec, running, wanted, waited_s,
                spec.start_timeout_s, _asked(spec), *_held(ray, spec))
    return True


def start_failed(ray: Any, spec: Any, e: Exception, running: int) -> WorkerError:
    """The error of actors that did not start (Ray's ``GetTimeoutError``: not placed within
    ``start_timeout_s``; else the error of one that failed as it started)."""
    if isinstance(e, ray.exceptions.GetTimeoutError):
        return WorkerError(
            f"{spec!r}: {running} of the {spec.min_actors} actors it waits for started within "
            f"start_timeout_s={spec.start_timeout_s:g} s; each asks {_asked(spec)}, and the "
            "cluster has %s free (the actors started hold theirs) of %s: ask for fewer actors "
            "(min_actors= to start with fewer) or smaller ones (num_cpus=, resources=), or "
            "add nodes" % _held(ray, spec))
    said = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # (Ray's, in colour)
    missing = re.search(r"No module named '([^']+)'", said)
    remedy = "" if missing is None else (
        f"\n(the module {missing.group(1)!r} a function of the loader's comes from is not "
        "on the actor's node: install it there, or ship it, RayWorkers(n, runtime_env="
        f"{{'py_modules': [{missing.group(1).split('.')[0]}]}}) or runtime_env={{'working_dir':"
        " ...}}; docs/workers.md, \"What crosses\")")
    return WorkerError(f"{spec!r}: an actor failed to start: {type(e).__name__}: {said}{remedy}")


def _asked(spec: Any) -> str:
    """What one actor asks of a node: its CPUs, GPUs, memory and custom resources."""
    options = spec.actor_options
    asked = {k: options[k] for k in ("num_cpus", "num_gpus", "memory") if options.get(k)}
    return str({**asked, **(options.get("resources") or {})})


def _held(ray: Any, spec: Any) -> tuple[dict, dict]:
    """The cluster's free and whole resources of the kinds an actor asks for (and CPUs)."""
    asked = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
    kinds = {"CPU", *(asked[k] for k in asked if spec.actor_options.get(k)), *(
        spec.actor_options.get("resources") or {})}
    return tuple({k: v for k, v in sorted(r.items()) if k in kinds}  # type: ignore[return-value]
                 for r in (ray.available_resources(), ray.cluster_resources()))


def broken_closes(engine: Any, run: Iterator[Any]) -> Generator[Any, None, None]:
    """``run``'s batches; a ``WorkerError`` that breaks the loader ends its actors first, as a
    broken local pool stops its workers: they held the cluster's CPUs until ``close()`` (a
    notebook's traceback keeps the loader), and the next loader could not start (the Ray
    audit)."""
    try:
        yield from run
    except WorkerError:
        engine.close()
        raise
