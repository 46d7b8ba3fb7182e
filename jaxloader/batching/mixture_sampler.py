"""``MixtureSampler``: the order of a ``Mixture``'s records, global step -> this process's
positions and indices, from the weights' plan (``plans.mixture``, whose docstring draws the
layout): each component in its own reshuffled epochs, or read-locally in its own blocks.

Example:
    >>> import numpy as np
    >>> from jaxloader.mix import mix
    >>> from jaxloader.sources import ArraySource
    >>> a, b = ArraySource({"x": np.zeros(100)}), ArraySource({"x": np.ones(50)})
    >>> sampler = MixtureSampler(mix([a, b], [0.75, 0.25]), batch_size=64, shuffle=True,
    ...                          seed=0, last_batch="drop")
    >>> int((sampler.batch(3).indices >= 100).sum())  # component b's records in block 3
    16
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxloader.base.checks import (BATCH_LIMIT, EPOCH_LIMIT, MASK64, check_int,
                                    past_epochs)
from jaxloader.base.difference import differ
from jaxloader.base.errors import ConfigError, StateDictError
from jaxloader.batching.mixture_layout import (KEPT_BLOCK, large_blocks, late_changes,
                                               loose_batches)
from jaxloader.order.local_shuffle import (BlockOrder, LocalShuffle, blocks_layout,
                                          exact_blocks, same_order)
from jaxloader.order.index_shuffle import EXACT_UP_TO, IndexShuffle, splitmix64, splitmix64_array
from jaxloader.order.sampling import LAST_BATCH_POLICIES, BatchSpec, StepMemo, check_rows
from jaxloader.plans.mixture import (block_size, check_weights_before,
                                      plan_regimes, regime_counts)
from jaxloader.sources.mixture import Mixture

_SPAN = 1 << 15  # positions a span of steps covers: their indices are computed at once, memoised
_EPOCHS_A_SPAN = 64  # read locally: a component's epochs a span covers at most
_KEEP_FROM = 1 << 16  # positions of a block from which its indices are kept whole


class MixtureSampler:
    """The ``Sampler`` of a ``Mixture``: global step -> this process's positions and indices
    into the mixture (a ``ConcatSource`` of the components)."""

    def __init__(self, mixture: Mixture, batch_size: int, *, shuffle: bool | LocalShuffle,
                 seed: int, last_batch: str, process_index: int = 0, process_count: int = 1,
                 memo_stride: int = 1, rows: np.ndarray | None = None) -> None:
        """``shuffle``: each component's records in a full shuffle (``True``), read-locally
        (a ``LocalShuffle``: blocks of the component, records within windows of them), or in
        order. ``memo_stride``: the steps of a span are memoised in ``memo_stride`` classes
        (``step % memo_stride``), computed when first asked for: with ``N`` workers, worker
        ``s % N`` usually makes step ``s`` (the pool prefers it), so each computes its own."""
        batch_size = check_int("batch_size", batch_size, low=1, high=BATCH_LIMIT,
                               remedy="pass a positive batch size per process")
        seed = check_int("seed", seed, low=0, high=MASK64, remedy="use a seed in [0, 2**64)")
        process_count = check_int("process_count", process_count, low=1,
                                  remedy="leave it None to use jax's")
        process_index = check_int("process_index", process_index, low=0,
                                  high=process_count - 1,
                                  remedy=f"use an index in [0, {process_count})")
        if last_batch not in LAST_BATCH_POLICIES:
            raise ConfigError(f"last_batch: expected one of {LAST_BATCH_POLICIES}, got "
                              f"{last_batch!r}")
        self.num_records = len(mixture)
        self.batch_size = batch_size
        self.global_batch_size = batch_size * process_count
        self.shuffle, self.seed, self.last_batch = bool(shuffle), seed, last_batch
        self._local = shuffle if isinstance(shuffle, LocalShuffle) else None
        self._local_description = None if self._local is None else [
            self._local.describe(part) for part in mixture.sources]
        # each component's blocks (its own starts, from 0), and its epochs' orders of them
        self._block_starts = None if self._local is None else [
            self._local.block_starts(part, len(part)) for part in mixture.sources]
        self.layout = None if self._block_starts is None else blocks_layout(self._block_starts)
        # (component, epoch) -> its order: blocks read locally, or a small component exactly
        self._orders: dict[tuple[int, int], BlockOrder | IndexShuffle] = {}
        self.process_index, self.process_count = process_index, process_count
        # A mixture has no short last batch: positions run on across epochs.
        self.steps_per_epoch = max(1, self.num_records // self.global_batch_size)
        self.schedule = {step: w.tolist() for step, w in mixture.schedule.items()}
        self._lengths = np.diff(mixture.offsets)
        self._offsets = mixture.offsets[:-1]
        m = len(self._lengths)
        self._block = block_size(self.global_batch_size, m)
        # A block larger than a step, or across steps: each component's reads in it go to its
        # positions in order, so that it reads its epochs one after another (its reads spread
        # over the block read a later epoch's records between an earlier one's: some twice,
        # others never, in a pass); a step of whole blocks keeps the permutation's order.
        self._in_order = bool(self.global_batch_size % self._block)
        # each change from the first block at or after its step's first position
        firsts = {step: -(-step * self.global_batch_size // self._block)
                  for step in mixture.schedule}
        self._regimes = plan_regimes([(firsts[step], weights) for step, weights
                                      in sorted(mixture.schedule.items())], self._block)
        late_changes(firsts, self.global_batch_size, self._block, m)
        regimes = sorted(mixture.schedule.items())  # (a change inside a step: its batch holds
        for (_, before), (step, after) in zip(regimes, regimes[1:]):  # both regimes' parts)
            if firsts[step] * self._block % self.global_batch_size:
                try:
                    mixture.check_alike([c for c in range(m) if before[c] > 0 or after[c] > 0])
                except ConfigError as e:
                    raise ConfigError(
                        f"mix(from_step={{{step}: ...}}): the change starts inside step "
                        f"{firsts[step] * self._block // self.global_batch_size:,}, whose batch "
                        f"holds both weights' components: {e}") from None
        loose_batches(mixture, self.global_batch_size, self._block)
        large_blocks(m, self.global_batch_size, self._block)
        self._blocks: dict[int, np.ndarray] = {}  # a large block's indices, kept whole (a
        # mixture of thousands: made again each span, a stall of seconds every 1,024 steps)
        self._seeds = [splitmix64(seed ^ splitmix64(c + 1)) for c in range(m)]
        self._key = splitmix64(seed ^ 0x6D69787475726521)  # the blocks' permutations
        self._memo = StepMemo(memo_stride)  # chunk: the span
        # a class of steps holds ~_SPAN positions of them; read locally, fewer where a small
        # component would wrap many epochs in them (a block order to make each: a 5-record
        # component took 2 s a span of 32,768)
        span = _SPAN
        if self._local is not None:  # (positions an epoch of a component takes, at the least)
            top = np.max(list(mixture.schedule.values()), axis=0)  # (each one's largest weight)
            epoch = self._lengths[top > 0] / top[top > 0]
            span = min(_SPAN, int(_EPOCHS_A_SPAN * np.min(epoch, initial=_SPAN)))
        self._span_steps = max(1, span * memo_stride // self.global_batch_size)
        self._rows = check_rows(rows, batch_size, process_index, process_count)  # (its own)

    def __getstate__(self) -> dict:  # a worker's own memo and block orders
        return {**self.__dict__, "_memo": StepMemo(self._memo.stride), "_orders": {},
                "_blocks": {}}

    def batch(self, step: int) -> BatchSpec:
        epoch, k = divmod(step, self.steps_per_epoch)
        if epoch >= EPOCH_LIMIT:
            raise past_epochs(step, epoch)
        positions = k * self.global_batch_size + self._rows
        # Step ``step``'s indices, from a memo computed for the span of steps it is in
        # (~32,768 positions a class; NumPy's cost is per call): each process computes only
        # its own rows, and each class of steps (``step % memo_stride``) when first asked
        # for, so workers that take turns share the work.
        span = step // self._span_steps
        indices = self._memo.get(span, step, span * self._span_steps,
                                 (span + 1) * self._span_steps, self._steps_indices)
        valid = np.ones(self.batch_size, bool) if self.last_batch == "pad" else None
        return BatchSpec(step, epoch, positions, indices, valid)

    def _steps_indices(self, steps: np.ndarray) -> np.ndarray:
        """This process's indices of ``steps`` (a row each)."""
        G, K, rows = self.global_batch_size, self._block, self._rows
        if G % K:  # no block size divides the global batch: the general path
            positions = (steps[:, None] * G + rows).reshape(-1)
            return self.indices(positions).reshape(len(steps), -1)
        # each step's blocks that hold these rows, laid end to end: no search
        lo, hi = int(rows[0]) // K, int(rows[-1]) // K + 1
        blocks = (steps[:, None] * (G // K) + np.arange(lo, hi)).reshape(-1)
        if (hi - lo) * K == len(rows):  # the rows are whole blocks: the table is the answer
            return self._table(blocks, slice(0, len(blocks) * K)).reshape(len(steps), -1)
        at = (np.arange(len(steps))[:, None] * ((hi - lo) * K) + rows - lo * K).reshape(-1)
        return self._table(blocks, at)[at].reshape(len(steps), -1)

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Indices into the mixture of global positions (any, vectorised): the blocks they
        fall in are laid out whole, and each component's shuffle runs on the reads of the
        positions asked for."""
        positions = np.asarray(positions, np.int64)
        blocks, slots = np.divmod(positions, self._block)
        at: Any
        if len(positions) and np.all(positions[1:] >= positions[:-1]):  # sorted: no sort
            new = np.empty(len(blocks), bool)
            new[0], new[1:] = True, blocks[1:] != blocks[:-1]
            covered, inverse = blocks[new], np.cumsum(new) - 1
            at = inverse * self._block + slots  # in the covered blocks, laid end to end
            if at[-1] - at[0] == len(at) - 1:  # sorted and consecutive: a slice, no gather
                at = slice(int(at[0]), int(at[-1]) + 1)
        else:
            covered, inverse = np.unique(blocks, return_inverse=True)
            at = inverse * self._block + slots
        if len(covered) == 1 and _KEEP_FROM <= self._block <= KEPT_BLOCK:
            return self._whole(int(covered[0]))[at]
        return self._table(covered, at)[at]

    def _whole(self, block: int) -> np.ndarray:
        """Block ``block``'s indices, all of them, kept (the last block asked for alone)."""
        whole = self._blocks.get(block)
        if whole is None:
            whole = self._table(np.array([block], np.int64), slice(0, self._block))
            self._blocks = {block: whole}  # (replaced in one assignment: another thread)
        return whole

    def _table(self, blocks: np.ndarray, asked: Any) -> np.ndarray:
        """The indices of the positions of ``blocks`` (laid end to end), filled at ``asked``.

        Component ``c`` holds a run of slots of each block, and its reads there are
        consecutive; the block's permutation sends each slot to its position. So each
        component's reads come as a run, with no search over the block's positions."""
        size = len(blocks) * self._block
        if not size:
            return np.empty(0, np.int64)
        before, here = self._counts(blocks)  # (blocks, components) each
        starts = np.arange(0, size, self._block)[:, None]  # the blocks laid end to end
        first = np.cumsum(here, axis=1) - here + starts  # each component's first slot a block
        position = self._block_permutations(blocks)  # (blocks, block): slot -> position
        position += starts
        position = position.reshape(-1)
        wanted = None
        if not isinstance(asked, slice) or asked.stop - asked.start < size:
            wanted = np.zeros(size, bool)
            wanted[asked] = True
        table = np.empty(size, np.int64)  # every slot is a component's: all positions filled
        for c in range(here.shape[1]):
            counts = here[:, c]
            runs = np.cumsum(counts) - counts  # where each block's reads start among c's
            ranks = np.arange(runs[-1] + counts[-1])
            at = position[ranks + np.repeat(first[:, c] - runs, counts)]  # c's slots, in turn
            if self._in_order:  # (blocks across steps: its reads in the order of positions)
                at.sort()
            reads = ranks + np.repeat(before[:, c] - runs, counts)  # ascending
            if wanted is not None:
                keep = wanted[at]
                at, reads = at[keep], reads[keep]
            if len(at):
                table[at] = self._component_reads(c, reads)
        return table

    def _counts(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each component's positions before each block, and in it (the regimes in force)."""
        return regime_counts(self._regimes, blocks)

    def _block_permutations(self, blocks: np.ndarray) -> np.ndarray:
        """A keyed permutation of ``[0, block)`` per block: the order of hashed keys (distinct,
        the hash being a bijection of 64-bit words: any sort gives the same order)."""
        keys = splitmix64_array(blocks[:, None].astype(np.uint64) * np.uint64(self._block)
                       + np.arange(self._block, dtype=np.uint64) + np.uint64(self._key))
        return np.argsort(keys, axis=1)

    def _component_reads(self, c: int, reads: np.ndarray) -> np.ndarray:
        """Indices into the mixture of component ``c``'s reads number ``reads`` (ascending):
        read ``j`` is record ``j % len`` of the component's epoch ``j // len``, reshuffled each
        epoch."""
        length = int(self._lengths[c])
        first, last = int(reads[0]) // length, int(reads[-1]) // length  # reads ascend
        epochs: int | np.ndarray
        if first == last:  # one epoch: no division a read
            epochs, within = first, reads - first * length
        else:
            epochs, within = np.divmod(reads, length)
        # blocks permuted each epoch, records within windows; or a small one's table
        if self._local is not None or self.shuffle and length <= EXACT_UP_TO and last - first < 3:
            within = self._by_epoch(within, epochs, lambda e: self._order(c, e))
        elif self.shuffle:  # (tight; exact, a component wrapping many epochs a span at once)
            within = IndexShuffle(length, seed=self._seeds[c], tight=True, epoch=epochs,
                                  exact=True)(within)
        return self._offsets[c] + within

    @staticmethod
    def _by_epoch(within: np.ndarray, epochs: int | np.ndarray,
                  order: Callable[[int], Callable[[np.ndarray], np.ndarray]]) -> np.ndarray:
        """``within`` mapped by the order of each one's epoch (``order(epoch)``)."""
        if isinstance(epochs, int):
            return order(epochs)(within)
        out = np.empty_like(within)
        for epoch in np.unique(epochs).tolist():
            at = epochs == epoch
            out[at] = order(epoch)(within[at])
        return out

    def _order(self, c: int, epoch: int) -> BlockOrder | IndexShuffle:
        """Component ``c``'s order of epoch ``epoch``: of its blocks read locally, or, small,
        exact (a table). A component's reads go up by epoch: its orders of other epochs than
        this one's neighbours go (a cache of 8 for all, cleared when full, made every large
        component's order again each span, where a small one wraps many epochs: 8.8 ms
        against 0.3)."""
        order = self._orders.get((c, epoch))
        if order is None:
            for old in [key for key in self._orders if key[0] == c and abs(key[1] - epoch) > 1]:
                self._orders.pop(old, None)  # (as before: another thread may take it first)
            if self._local is not None:
                assert self._block_starts is not None
                order = BlockOrder(self._block_starts[c], window=self._local.window,
                                   seed=self._seeds[c], epoch=epoch)
            else:
                order = IndexShuffle(int(self._lengths[c]), seed=self._seeds[c], epoch=epoch,
                                     exact=True)
            self._orders[(c, epoch)] = order
        return order

    def task_indices(self, steps: list[int]) -> None:
        """``None``: a mixture's steps are laid out one by one (``batch``)."""
        return None

    # -- state: the weights that made the steps so far must be the same --------------------
    def extra_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "mixture": [[step, weights] for step, weights in sorted(self.schedule.items())]}
        if self._local_description is not None:
            state["local_shuffle"] = self._local_description
        if self._exact():
            state["exact_shuffle"] = True  # (states saved before 2026-12-03 had another)
        if self._in_order:
            state["reads_in_order"] = True  # (states saved before 2026-12-06 had another)
        return state

    def _exact(self) -> bool:
        """Whether a component is shuffled exactly (``IndexShuffle(exact=True)``): its records,
        or its blocks read locally."""
        if self._block_starts is not None:
            return any(exact_blocks(starts) for starts in self._block_starts)
        return self.shuffle and bool(((self._lengths > 1) & (self._lengths <= EXACT_UP_TO)).any())

    def check_extra_state(self, state: dict, step: int) -> None:
        if (step + 1) * self.global_batch_size > 1 << 53:  # (a state by hand: a run reads
            raise StateDictError(  # 9e15 records first)
                f"state['step']: {step:,} is past any step a mixture reaches: its positions "
                f"(to {(step + 1) * self.global_batch_size:,}) are split among the components"
                " in float64, exact to 2**53; restore a state a run of this loader saved")
        saved = state.get("mixture")
        if not isinstance(saved, list):
            check_weights_before(self.schedule, saved, step)  # raises, naming what came
        saved_local, mine = state.get("local_shuffle"), self._local_description
        if saved_local != mine and not (isinstance(saved_local, list) and isinstance(
                mine, list) and len(saved_local) == len(mine) and all(
                    same_order(a, b) for a, b in zip(saved_local, mine))):
            raise StateDictError(
                differ("state['local_shuffle']", self._local_description,
                       state.get("local_shuffle")) + " (each component's); the components were "
                "read in another order (shuffle=, LocalShuffle's window or blocks), so its "
                "steps would read other records here; restore with the shuffle that wrote it"
            )
        check_weights_before(self.schedule, saved, step)
        if self._in_order and step * self.global_batch_size % self._block and not state.get(
                "reads_in_order"):  # (a bool, checked; at a block's start: nothing differs)
            raise StateDictError(
                f"state: saved at step {step} by a jaxloader before 2026-12-06, whose mixture "
                f"laid out in blocks of {self._block:,} positions, across batches of "
                f"{self.global_batch_size}, gave a component's reads in a block out of order; "
                "this version reads them in order, and the block under way would read some "
                "records twice and others never: restore it with the jaxloader that saved it")
        if self._exact() and step and not state.get("exact_shuffle"):  # (a bool, checked)
            raise StateDictError(
                f"state: saved at step {step} by a jaxloader before 2026-12-03, whose shuffle "
                f"of a mixture's component of up to {EXACT_UP_TO:,} records (or blocks read "
                "locally) was not uniform; this version shuffles such components otherwise, "
                "and the epochs of theirs under way would read some records twice and others "
                "never: restore it with the jaxloader that saved it")
