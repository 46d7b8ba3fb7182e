"""The order of records: a pure function of ``(seed, epoch, step)``.

::

    global step s ──> epoch e = s // steps_per_epoch, k = s % steps_per_epoch
                      positions [k*G + p*B, k*G + (p+1)*B)     (G = B * process_count)
                      index = shuffle(seed, e)(position)      (keyed bijection, O(1) memory)

Nothing here depends on the worker count or on what was iterated before, so a batch can be
recomputed anywhere (a worker, a restored loader, another host) from its step alone. The shuffle
is ``index_shuffle.IndexShuffle``, a keyed bijection with O(1) memory: a billion-record epoch
needs no billion-entry array.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Literal, NamedTuple, Protocol, get_args

import numpy as np

from jaxloader.base.checks import (BATCH_LIMIT, EPOCH_LIMIT, MASK64, check_int,
                                    past_epochs)
from jaxloader.base.difference import differ
from jaxloader.base.errors import ConfigError, JaxloaderWarning, StateDictError, user_stacklevel
from jaxloader.base.tree import RecordNames
from jaxloader.order.index_shuffle import EXACT_UP_TO, IndexShuffle
from jaxloader.order.local_shuffle import same_order

LastBatch = Literal["drop", "pad", "partial"]
LAST_BATCH_POLICIES: tuple[str, ...] = get_args(LastBatch)

# Shuffled indices are computed for a class of steps holding this many positions at a time and
# the chunk's classes are kept: amortises NumPy's per-call overhead over many small batches,
# bounded memory (64 KiB a class).
_CHUNK_POSITIONS = 8192


class StepMemo:
    """Rows of a chunk of steps, computed a class of steps (``step % stride``) at a time when
    one of them is first asked for: with ``N`` workers taking turns (worker ``s % N`` makes
    step ``s`` when it has room), each computes its own steps' rows. A new chunk drops them.

    Example:
        >>> memo = StepMemo(stride=2)
        >>> int(memo.get(chunk=0, step=3, first=0, end=8, compute=lambda steps: steps * 10))
        30
        >>> memo.classes[1].tolist()  # steps 1, 3, 5, 7 of the chunk
        [10, 30, 50, 70]
    """

    def __init__(self, stride: int) -> None:
        self.stride = stride
        # (chunk, {step % stride: its steps' rows}), replaced in one assignment: a Ctrl-C
        # between two (peek() and next() without workers run here) would pair a chunk with
        # another chunk's rows
        self._held: tuple[Any, dict[int, np.ndarray]] = (None, {})

    @property
    def classes(self) -> dict[int, np.ndarray]:
        return self._held[1]

    def get(self, chunk: Any, step: int, first: int, end: int,
            compute: Callable[[np.ndarray], np.ndarray]) -> Any:
        """Step ``step``'s row of ``chunk`` (steps ``[first, end)``); ``compute(steps)``
        gives the rows of steps, in order."""
        held, classes = self._held
        if chunk != held:
            classes = {}
            self._held = (chunk, classes)
        start = first + (step - first) % self.stride  # the class's first step in the chunk
        rows = classes.get(step % self.stride)
        if rows is None:
            steps = np.arange(start, end, self.stride, dtype=np.int64)
            rows = classes[step % self.stride] = compute(steps)
        return rows[(step - start) // self.stride]

    def run(self, chunk: Any, step: int, count: int, first: int, end: int,
            compute: Callable[[np.ndarray], np.ndarray]) -> Any:
        """``get`` of ``count`` steps ``step, step + stride, ...`` (all in ``[first, end)``)
        at once: their rows, one after another (a view where the class is held)."""
        self.get(chunk, step, first, end, compute)  # the class, computed if it is not held
        rows = self._held[1][step % self.stride]
        at = (step - (first + (step - first) % self.stride)) // self.stride
        return rows[at:at + count].reshape(-1)


class BatchSpec(NamedTuple):
    """Which records make up one process's batch at one global step.

    ``positions`` are places in the epoch's order (pad rows have positions >= num_records);
    ``indices`` are the source indices to read (pad rows repeat real records); ``valid`` is
    ``None`` unless the policy is ``"pad"``, then a bool array (in every batch), False on pad rows.
    """

    step: int
    epoch: int
    positions: np.ndarray
    indices: np.ndarray
    valid: np.ndarray | None

    def location(self, origin: Callable[[int], str | None] | None = None) -> str:
        """Where this batch is, for messages: ``step 5 (epoch 0, record positions 20..23)``;
        with ``origin`` (a source index's file and row: ``base.abilities.origin_of``), their
        files too where its records are few (a batch of one clip whose dtype differs)."""
        p = self.positions
        span = f"{p[0]}..{p[-1]}" if len(p) else "none"
        distinct = [] if origin is None else list(dict.fromkeys(self.indices.tolist()))
        named = [o for i in distinct if (o := origin(i))] if origin and len(distinct) <= 4 else []
        return f"step {self.step} (epoch {self.epoch}, record positions {span})" + (
            f" ({', '.join(named)})" if named else "")

    def names(self) -> RecordNames:
        """How messages name its records: positions, and source indices where they differ."""
        return RecordNames(self.positions, self.indices)

    def record_location(self, position: int, index: int) -> str:
        """One record of it: ``step 5 (epoch 0), record position 21 (source index 99)``."""
        return (f"step {self.step} (epoch {self.epoch}), record position {position} "
                f"(source index {index})")


class Order(Protocol):
    """What the loader needs of a sampler: ``Sampler`` or ``mixture.MixtureSampler``."""

    num_records: int
    batch_size: int
    global_batch_size: int
    shuffle: bool
    seed: int
    last_batch: str
    process_index: int
    process_count: int
    steps_per_epoch: int
    layout: str | None  # a read-local order's blocks (``local_shuffle.blocks_layout``)

    def batch(self, step: int) -> BatchSpec: ...

    def task_indices(self, steps: list[int]) -> np.ndarray | None:
        """The indices of ``steps`` one after another where the order gives them at once
        (whole batches), else ``None`` (then ``batch`` each)."""
        ...

    def extra_state(self) -> dict[str, Any]: ...

    def check_extra_state(self, state: dict, step: int) -> None: ...


class Sampler:
    """Maps a global step to this process's record positions and indices.

    Example:
        >>> s = Sampler(10, batch_size=4, shuffle=False, seed=0, last_batch="drop")
        >>> s.steps_per_epoch, s.batch(1).indices.tolist()
        (2, [4, 5, 6, 7])
    """

    def __init__(
        self,
        num_records: int,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        last_batch: str,
        process_index: int = 0,
        process_count: int = 1,
        order: Callable[..., Callable[[np.ndarray], np.ndarray]] | None = None,
        order_description: str | None = None,
        memo_stride: int = 1,
        rows: np.ndarray | None = None,
    ) -> None:
        """``order(epoch=e)``, when given, makes epoch ``e``'s shuffled order (a bijection of
        positions) instead of the full ``IndexShuffle``; ``order_description`` goes into the
        state (a read-local order: ``jaxloader.order.local_shuffle``). ``memo_stride``: shuffled
        indices are memoised for a chunk of steps in classes ``step % memo_stride``, each
        computed when first asked for (with ``N`` workers, worker ``s % N`` usually makes
        step ``s``, so each computes its own). ``rows``: this process's ``batch_size`` rows
        of each global batch, ascending (``check_rows``; default: block ``process_index``)."""
        # (as Python ints: a NumPy integer overflows in the seed's arithmetic, and is not JSON)
        batch_size = check_int("batch_size", batch_size, low=1, high=BATCH_LIMIT,
                               remedy="pass a positive batch size per process")
        num_records = check_int("num_records", num_records, low=1,
                                remedy="the source is empty: give it records")
        seed = check_int("seed", seed, low=0, high=MASK64, remedy="use a seed in [0, 2**64)")
        process_count = check_int("process_count", process_count, low=1,
                                  remedy="leave it None to use jax's")
        process_index = check_int(
            "process_index", process_index, low=0, high=process_count - 1,
            remedy=f"use an index in [0, {process_count}) (process_count={process_count})",
        )
        if last_batch not in LAST_BATCH_POLICIES:
            raise ConfigError(
                f"last_batch: expected one of {LAST_BATCH_POLICIES}, got {last_batch!r}; "
                "use 'drop' to skip the short last batch, 'pad' to fill it with masked rows, "
                "'partial' to keep it smaller"
            )
        if last_batch == "partial" and process_count > 1:
            raise ConfigError(
                f"last_batch='partial' with process_count={process_count}: the processes would "
                "get batches of different sizes; use last_batch='pad' (full batches with a mask) "
                "or 'drop'"
            )
        self.num_records = num_records
        self.batch_size = batch_size
        self.global_batch_size = batch_size * process_count
        self.shuffle = shuffle
        self.seed = seed
        self.last_batch = last_batch
        self.process_index = process_index
        self.process_count = process_count
        full, rest = divmod(num_records, self.global_batch_size)
        self.steps_per_epoch = full + (1 if rest and last_batch != "drop" else 0)
        if self.steps_per_epoch == 0:  # (before the rows: a batch_size of 10**9 made 8 GB)
            raise ConfigError(
                f"batch_size: with last_batch='drop', the global batch ({batch_size} x "
                f"{process_count} processes = {self.global_batch_size}) must be <= the number of "
                f"records ({num_records}); use a smaller batch_size or last_batch='pad'"
            )
        self._rows = check_rows(rows, batch_size, process_index, process_count)
        # a class of steps holds ~_CHUNK_POSITIONS of them, whatever the stride
        self._chunk_steps = max(1, _CHUNK_POSITIONS * memo_stride // self.global_batch_size)
        self._memo = StepMemo(memo_stride)  # chunk: (epoch, chunk of steps)
        self._order = order
        self.order_description = order_description
        self.layout: str | None = None  # a read-local order's blocks (local_shuffle's layout)
        self.exact_blocks = False  # a read-local order's blocks permuted exactly
        # (epoch, its shuffle), replaced in one assignment (see StepMemo)
        self._shuffled: tuple[int, Callable[[np.ndarray], np.ndarray]] | None = None

    def batch(self, step: int) -> BatchSpec:
        """The records of global step ``step`` (``step >= 0``) for this process."""
        epoch, k = divmod(step, self.steps_per_epoch)
        if epoch >= EPOCH_LIMIT:
            raise past_epochs(step, epoch)
        positions = k * self.global_batch_size + self._rows
        n = self.num_records
        valid = None
        if positions[-1] < n:
            indices = self._full_step_indices(epoch, k)
            if self.last_batch == "pad":  # every batch of a padded loader carries its mask
                valid = np.ones(self.batch_size, dtype=bool)
        elif self.last_batch == "partial":  # (one process: its rows are the whole batch)
            positions = positions[positions < n]
            indices = self._indices_of(epoch, positions)
        else:  # "pad": full size, pad rows repeat the batch's first record (its global
            # batch's, read by one process or another: a pad row adds no record to the batch,
            # so a bad record fails only in its own batch)
            valid = positions < n
            indices = self._indices_of(epoch, np.where(valid, positions,
                                                       k * self.global_batch_size))
        return BatchSpec(step, epoch, positions, indices, valid)

    def task_indices(self, steps: list[int]) -> np.ndarray | None:
        """The indices of ``steps`` one after another, a worker's task (``first``, ``first +
        stride``, ... with the memo's stride), without a ``BatchSpec`` a step: ``None``
        unless all are whole batches of one epoch, without a mask (then ``batch`` each). A
        task of 16 steps: one slice of the memo, not 16 ``batch`` calls (~100 us a task)."""
        if self.last_batch == "pad" or len(steps) < 2:
            return None
        stride = self._memo.stride
        epoch, k = divmod(steps[0], self.steps_per_epoch)
        last_epoch, last = divmod(steps[-1], self.steps_per_epoch)
        if last_epoch >= EPOCH_LIMIT:
            return None  # (batch() says so)
        G = self.global_batch_size
        full = (self.num_records - int(self._rows[-1]) - 1) // G + 1  # steps of whole rows
        if (last_epoch != epoch or last >= full or last - k != (len(steps) - 1) * stride
                or steps[1] - steps[0] != stride):
            return None
        if not self.shuffle:
            return np.concatenate([self._full_step_indices(epoch, j)
                                   for j in range(k, last + 1, stride)])
        chunk = k // self._chunk_steps
        if last // self._chunk_steps != chunk:  # across two chunks: a step at a time
            return np.concatenate([self._full_step_indices(epoch, j)
                                   for j in range(k, last + 1, stride)])
        return self._memo.run((epoch, chunk), k, len(steps), chunk * self._chunk_steps,
                              min((chunk + 1) * self._chunk_steps, full), self._rows_of(epoch))

    def _full_step_indices(self, epoch: int, k: int) -> np.ndarray:
        """This process's indices of step ``k`` of ``epoch`` (all its rows < num_records),
        from a memo of its class of steps in a chunk of ~8,192 positions (NumPy's cost is per
        call): only this process's rows, only the steps of that class."""
        G = self.global_batch_size
        if not self.shuffle:
            return k * G + self._rows
        chunk = k // self._chunk_steps
        full = (self.num_records - int(self._rows[-1]) - 1) // G + 1  # steps of whole rows
        return self._memo.get((epoch, chunk), k, chunk * self._chunk_steps,
                              min((chunk + 1) * self._chunk_steps, full), self._rows_of(epoch))

    def _rows_of(self, epoch: int) -> Callable[[np.ndarray], np.ndarray]:
        """For the memo: this process's indices of some steps of ``epoch``, a row a step."""
        B, G, rows = self.batch_size, self.global_batch_size, self._rows

        def compute(steps: np.ndarray) -> np.ndarray:
            positions = (steps[:, None] * G + rows).reshape(-1)
            return self._indices_of(epoch, positions).reshape(len(steps), B)

        return compute

    def _indices_of(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        if not self.shuffle:
            return positions
        shuffled = self._shuffled
        if shuffled is None or shuffled[0] != epoch:
            if self._order is not None:
                shuffled = (epoch, self._order(epoch=epoch))
            else:
                shuffled = (epoch, IndexShuffle(self.num_records, seed=self.seed, epoch=epoch,
                                                exact=True))
            self._shuffled = shuffled
        return shuffled[1](positions)

    def extra_state(self) -> dict[str, Any]:
        """A read-local order's description (a mixture's sampler adds its weights); that a
        small source's shuffle is exact (``IndexShuffle(exact=True)``: states saved before
        2026-12-03 had another)."""
        state: dict[str, Any] = {"exact_shuffle": True} if self._exact else {}
        if self.order_description:
            state["local_shuffle"] = self.order_description
        return state

    @property
    def _exact(self) -> bool:
        if self._order is not None:  # (a read-local order: its blocks')
            return self.shuffle and self.exact_blocks
        return self.shuffle and 1 < self.num_records <= EXACT_UP_TO

    def check_extra_state(self, state: dict, step: int) -> None:
        if not same_order(state.get("local_shuffle"), self.order_description):
            raise StateDictError(
                differ("state['local_shuffle']", self.order_description,
                       state.get("local_shuffle")) + "; restore into a loader with the same "
                "shuffle= (a full shuffle and a read-local one order the records differently, "
                "and so do windows and blocks of other sizes, or the source's own blocks starting "
                "elsewhere: length buckets of other edges)"
            )
        if "mixture" in state:
            raise StateDictError(
                "state['mixture']: this state is from a loader over a mixture (jaxloader.mix); "
                "restore it into a loader over the same mixture"
            )
        if self._exact and not state.get("exact_shuffle"):  # (a bool, checked: np.True_ too)
            _older_shuffle(step, self.steps_per_epoch, "its blocks read locally" if
                           self._order is not None else f"a source of {self.num_records:,} "
                           "records")

    def __getstate__(self) -> dict:
        # The cache is a per-process memo; a copy sent to a worker starts without it.
        state = dict(self.__dict__)
        state.update(_memo=StepMemo(self._memo.stride), _shuffled=None)
        return state


def _older_shuffle(step: int, steps_per_epoch: int, what: str) -> None:
    """A state of a shuffle of ``what`` (a source's records, or its blocks read locally: up to
    ``EXACT_UP_TO``) saved before that shuffle was exact: at an epoch's start, the next epochs
    are this version's (said); within one, refused: the rest of the epoch in another order
    would read some records twice and skip others."""
    epoch, into = divmod(step, steps_per_epoch)
    if into:
        raise StateDictError(
            f"state: saved at step {step}, {into} steps into epoch {epoch}, by a jaxloader "
            f"before 2026-12-03, whose shuffle of {what} (up to {EXACT_UP_TO:,}) was not "
            "uniform; this version shuffles it otherwise, and the rest of the epoch would "
            "read some records twice and others never: restore it with the jaxloader that "
            f"saved it, or from the epoch's start (state['step'] = {step - into})")
    warnings.warn(
        f"state: saved by a jaxloader before 2026-12-03, whose shuffle of {what} (up to "
        f"{EXACT_UP_TO:,}) was not uniform; the epochs from {epoch} on are shuffled "
        "uniformly, in another order than that version's",
        JaxloaderWarning, stacklevel=user_stacklevel())


def check_rows(rows: np.ndarray | None, batch_size: int, process_index: int,
               process_count: int) -> np.ndarray:
    """This process's rows of a global batch (int64, ascending): ``rows`` checked (``batch_size``
    distinct rows of the ``batch_size * process_count``), or block ``process_index``.

    Example:
        >>> check_rows(None, 2, 1, 2).tolist(), check_rows([0, 1, 4, 5], 4, 0, 2).tolist()
        ([2, 3], [0, 1, 4, 5])
    """
    if rows is None:
        return np.arange(process_index * batch_size, (process_index + 1) * batch_size,
                         dtype=np.int64)
    got = np.asarray(rows, np.int64)
    G = batch_size * process_count
    if got.shape != (batch_size,) or np.any(np.diff(got) <= 0) or got[0] < 0 or got[-1] >= G:
        raise ConfigError(f"rows: expected {batch_size} ascending rows of a global batch of "
                          f"{G}, got {got.tolist()[:8]}")
    return got
