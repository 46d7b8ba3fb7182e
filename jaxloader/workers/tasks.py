"""How the pool cuts the steps into tasks: how many steps a task, how many tasks ahead; a task
in flight (``InFlight``) and a step that failed (``Failure``), as the pool keeps them.

A task makes as many of a worker's steps as fit in ``TASK_BYTES`` of slots, up to
``MAX_TASK_STEPS`` (one a task while the batch size is not known, and for streams, whose
readers need no more). A worker has ``prefetch`` tasks in flight, or for small batches as many
as hold ``prefetch`` MiB of them, up to ``MAX_AHEAD_STEPS`` steps a worker and
``MAX_AHEAD_SLOTS`` in all (fewer under a low descriptor limit: ``ahead_slots``).

Example:
    >>> steps = steps_per_task(22_528, streaming=False)  # 256 rows of Parquet a batch
    >>> steps, tasks_ahead(22_528, steps, prefetch=2, workers=2)
    (16, 4)
"""

from __future__ import annotations

from typing import NamedTuple

from jaxloader.base.errors import WorkerError

# A task makes as many steps as fit in this many bytes of slots, up to MAX_TASK_STEPS: batches
# of 22 KB (256 rows of Parquet) take 16 a task, batches of 1 MiB or more one. Slots in flight:
# N * prefetch * steps a task, so at most ~prefetch MiB a worker for small batches. More steps a
# task, fewer messages a batch; too many and a task's rows outgrow the decoded row groups a
# worker keeps.
TASK_BYTES = 1 << 20
MAX_TASK_STEPS = 16
# Tasks in flight a worker: ``prefetch``, or for small batches as many as hold ``prefetch`` MiB
# of them, up to this many steps: a source that stalls now and then (a Parquet worker decoding
# the row groups of a new window, ~30 ms) leaves the consumer batches made ahead to take, and
# the workers room to run ahead after. With the margin of the
# block being submitted, a worker writes ~80 slots: under the mappings it keeps (worker.py).
MAX_AHEAD_STEPS = 64
# and at most this many steps for all the workers together: each slot holds a descriptor in the
# main process (two before Python 3.13; many systems allow 1,024), so 8 workers or more keep
# ``prefetch`` tasks, of fewer steps from 16 workers (``prefetch`` 2)
# ``ahead_slots()`` lowers it under a low descriptor limit: a quarter of the table a loader.
MAX_AHEAD_SLOTS = 256
# A task's batches go back together once it is done: a task is also at most this many seconds
# of a worker's steps (as its last timings say), so that batches that take long to make (0.5 s
# each: 16 a task were 8 s, the loop waiting for all of them) come as they are made; as many
# steps are kept ahead, in more tasks
TASK_SECONDS = 0.5


def ahead_slots(taken: int = 0, others: int = 0) -> int:
    """``MAX_AHEAD_SLOTS``, or fewer where a quarter of this process's descriptor limit holds
    fewer slots (a limit of 64; a slot holds one, ``runtime.mapping``); with ``others``
    loaders alive, ``1 / (4 + others)`` of the limit less the ``taken`` descriptors
    (``ring.SlotRing``): so that loaders alive at once fit the table, where their slots would
    fill it (four task loaders with workers filled 1,024 on Python 3.11)."""
    from jaxloader.runtime.descriptors import descriptor_share

    return descriptor_share(4 + others, MAX_AHEAD_SLOTS, untracked=True, taken=taken)


def steps_per_task(slot_size: int, streaming: bool, tasks: int = 1,
                   slots: int = MAX_AHEAD_SLOTS) -> int:
    """Steps a task for batches of ``slot_size`` bytes (0: not known yet), ``tasks`` of them
    in flight at least (workers x prefetch): together within ``slots`` steps where tasks of
    one step are."""
    if streaming or not slot_size:
        return 1
    return max(1, min(MAX_TASK_STEPS, TASK_BYTES // slot_size, slots // tasks))


def tasks_ahead(slot_size: int, steps: int, prefetch: int, workers: int,
                slots: int = MAX_AHEAD_SLOTS) -> int:
    """Tasks of ``steps`` steps in flight a worker: ``prefetch``, more for small batches
    (``MAX_AHEAD_STEPS``, ``slots`` in all). Tasks of one step (batches of 1 MiB or more,
    and streams) keep ``prefetch``."""
    if not slot_size or steps == 1:
        return prefetch
    held = prefetch * TASK_BYTES // (steps * slot_size)
    room = min(MAX_AHEAD_STEPS, slots // workers) // steps
    return max(prefetch, min(held, room))


def task_shape(slot_size: int, streaming: bool, prefetch: int, workers: int,
               timed: int = MAX_TASK_STEPS, slots: int | None = None) -> tuple[int, int, int]:
    """``(steps a task, tasks ahead a worker, steps ahead in all)`` for slots of
    ``slot_size`` bytes (0: not known yet); ``timed``: the steps a worker makes in
    ``TASK_SECONDS`` (``timed_steps``), at most a task's; ``slots``: the loader's slots ahead
    at most (its ring's; ``ahead_slots()`` where not given).

    Example:
        >>> task_shape(22_528, False, prefetch=2, workers=2)
        (16, 4, 128)
        >>> task_shape(22_528, False, prefetch=2, workers=2, timed=2)  # (as many ahead)
        (2, 32, 128)
    """
    slots = ahead_slots() if slots is None else slots
    steps = steps_per_task(slot_size, streaming, workers * prefetch, slots)
    ahead = tasks_ahead(slot_size, steps, prefetch, workers, slots)
    if timed < steps:
        steps, ahead = timed, ahead * steps // timed
    return steps, ahead, workers * ahead * steps


def timed_steps(timings: tuple) -> int:
    """The steps a worker makes in ``TASK_SECONDS`` (1 to ``MAX_TASK_STEPS``), from the
    timings a ``Done`` brings: ``(busy seconds, CPU seconds, stages, batches, ...)``.

    Example:
        >>> timed_steps((2.0, 1.9, (), 8)), timed_steps((0.01, 0.01, (), 8))
        (2, 16)
    """
    busy, batches = timings[0], timings[3]
    if busy <= 0 or batches <= 0:
        return MAX_TASK_STEPS
    return max(1, min(MAX_TASK_STEPS, int(TASK_SECONDS * batches / busy)))


class InFlight(NamedTuple):
    """A task in flight: which worker makes which steps, for which run, into which slots."""

    worker: int
    first: int  # its steps: first + nth * stride
    stride: int
    run: int
    segments: list  # each step's slot, in order; None once its batch is back


class Failure(NamedTuple):
    """A step that failed in its worker: raised at its turn, after the batches before it."""

    error: WorkerError
    cause: BaseException | None
