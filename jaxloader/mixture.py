"""Weighted mixtures of sources: which component each position reads, as a pure function.

::

    global position P = step * G + process_index * B + row          (G = B * process_count)
      block k = P // K              (K: the largest divisor of G up to 1,024 positions)
      per block: n_c slots for component c, from the weights        (cumulative, exact)
      component c: slots [f_c, f_c + n_c) of the block, in turn
      slot s ─> position permutation_k(s) of the block; its read j = C_c(k) + s - f_c
                       (C_c(k): component c's positions before block k, closed form)
      record = shuffle(seed_c, j // len_c)(j % len_c)                 (c's own epochs)

Each block of ``K`` positions holds each component's share of the weights exactly (up to
rounding by one), spread over the block by a keyed permutation: any window of 10,000 positions
is within a fraction of a percent of the weights, and nothing depends on what was read before.
A component's reads in a block are a run, so a span of blocks is laid out one component at a
time, with no search; a step holds whole blocks, so a worker lays out only its own steps'.
Component ``c`` reads its records in its own reshuffled epochs (a Feistel network over a
domain just above its length: ``IndexShuffle(tight=True)``), or with ``shuffle=LocalShuffle``
read-locally (``BlockOrder`` over its own blocks, keyed by its seed: its consecutive reads stay
in a window of blocks), so a small component wraps (and is reshuffled) more often than a large
one. A weight change from step ``s`` takes effect from
the first block that starts at or after step ``s``'s first position; ``C_c(k)`` is summed over
the schedule's regimes, so the batches of every earlier step stay what they were. Everything
is computed per batch from the step: resume is O(1) and elastic, as for a single source.
``ORDER`` numbers this layout; a state records it, and one from another order is refused.

Example:
    >>> import numpy as np
    >>> from jaxloader.sources import ArraySource
    >>> a, b = ArraySource({"x": np.zeros(100)}), ArraySource({"x": np.ones(50)})
    >>> sampler = MixtureSampler(mix([a, b], [0.75, 0.25]), batch_size=1024, shuffle=True,
    ...                          seed=0, last_batch="drop")
    >>> int((sampler.batch(3).indices >= 100).sum())  # component b's records in block 3
    256
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from jaxloader.checks import MASK64, check_int
from jaxloader.errors import ConfigError, StateDictError
from jaxloader.local_shuffle import BlockOrder, LocalShuffle
from jaxloader.sampling import (LAST_BATCH_POLICIES, BatchSpec, IndexShuffle, StepMemo,
                                splitmix64, splitmix64_array)
from jaxloader.sources.concat import ConcatSource

if TYPE_CHECKING:
    from jaxloader.streams.mixed import MixedStream

ORDER = 5  # the layout's version, in the state (1: blocks of 1,000, shuffles over 4**k;
# 2: blocks of 1,024 whatever the global batch; 3: components shuffled over 2**k; 4: over
# radix * 2**k in 64-bit words, 6 rounds)
_BLOCK = 1024  # positions a block at most (see _block_size)
_SPAN = 1 << 15  # positions a span of steps covers: their indices are computed at once, memoised


class Mixture(ConcatSource):
    """The components as one source, and the weights (from step 0, and from later steps)."""

    def __init__(self, sources: Sequence[Any], schedule: dict[int, np.ndarray]) -> None:
        super().__init__(sources)
        self.schedule = schedule  # step -> normalised weights, from step 0

    def __repr__(self) -> str:
        weights = ", ".join(f"{w:.3g}" for w in self.schedule[0])
        return (f"Mixture({len(self)} records in {len(self.sources)} sources, weights "
                f"[{weights}]{' and later' if len(self.schedule) > 1 else ''})")

    @property
    def fingerprint(self) -> str:
        """The components' fingerprints; the weights are checked apart (``check_schedule``)."""
        from jaxloader.fingerprint import source_fingerprint

        digest = hashlib.blake2b(digest_size=16)
        for source in self.sources:
            digest.update(repr(sorted(source_fingerprint(source).items())).encode())
        return f"mixture:{len(self.sources)}:{digest.hexdigest()}"


def mix(sources: Sequence[Any] | Mapping[str, Any],
        weights: Sequence[float] | Mapping[str, float],
        from_step: Mapping[int, Sequence[float] | Mapping[str, float]] | None = None,
        stopping_strategy: str = "all_exhausted_without_replacement",
        ) -> Mixture | MixedStream:
    """A mixture of ``sources``, a record of ``sources[c]`` at a position with probability
    ``weights[c]`` (normalised); ``from_step={step: weights}`` changes them from that step on.
    Components may be named: ``mix({"web": web, "code": code}, {"web": 0.7, "code": 0.3})``
    (weights by name, also in ``from_step``; the components in the dict's order).

    Pass it to ``DataLoader`` as the source: every component is reshuffled in its own epochs
    (``shuffle`` says whether components are shuffled), and the loader's epoch is the sum of
    the components' lengths. Streams (``jl.Stream``) mix too: the result is read by a
    ``StreamLoader`` (``jaxloader.streams.mixed``).

    ``stopping_strategy`` (streams only; Hugging Face's ``interleave_datasets`` names) says
    where a stream mixture's epoch ends, and so a ``StreamLoader(num_epochs=n)`` pass:
    ``"all_exhausted_without_replacement"`` (the default): once every component has read its
    epoch (every record once; a component run out gives its slots up);
    ``"first_exhausted"``: as soon as one component has read its epoch; ``"all_exhausted"``:
    once every component with weight has (those done first start their next: oversampled).
    Both then start every component's next epoch (the rest of one under way is passed over).
    An endless mixture (``num_epochs=None``) reads each component's epochs one after another
    by default.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> parts = [jl.ArraySource({"x": np.full(n, n)}) for n in (60, 30, 10)]
        >>> loader = jl.DataLoader(jl.mix(parts, [0.5, 0.3, 0.2], from_step={40: [1, 1, 0]}),
        ...                        batch_size=20, shuffle=True, process_index=0, process_count=1)
        >>> sorted(np.unique(next(iter(loader))["x"]).tolist())
        [10, 30, 60]
    """
    if not len(sources):
        raise ConfigError("mix(sources): expected a non-empty list of sources, got none; pass "
                          "the sources to mix and one weight each")
    names = list(sources) if isinstance(sources, Mapping) else None
    sources = list(sources.values()) if isinstance(sources, Mapping) else sources
    schedule = {0: _weights(weights, len(sources), "weights", names)}
    for step, later in sorted((from_step or {}).items()):
        check_int("mix(from_step=...) step", step, low=1, remedy="steps after 0; weights= is step 0")
        schedule[int(step)] = _weights(later, len(sources), f"from_step[{step}]", names)
    from jaxloader.streams.huggingface import as_stream
    from jaxloader.streams.mixed import STOPPING_STRATEGIES, MixedStream
    from jaxloader.streams.packed import PackedStream
    from jaxloader.streams.reader import Stream

    sources = [as_stream(s) for s in sources]  # Hugging Face IterableDatasets: streams
    if any(isinstance(s, MixedStream) for s in sources):
        raise ConfigError(
            "mix(sources): a mixture of streams inside a mixture; mix the streams in one "
            "jl.mix, each weight the product of its own and its mixture's (mix([a, b], [1, 1]) "
            "at 0.5 beside c at 0.5: mix([a, b, c], [0.25, 0.25, 0.5]))"
        )
    if any(isinstance(s, PackedStream) for s in sources):
        raise ConfigError(
            "mix(sources): a PackedStream is mixed by packing the mixture: "
            "jl.PackedStream(jl.mix([stream_a, stream_b], weights), key, length), so that a "
            "row's documents come from the components by weight"
        )
    streams = [isinstance(s, Stream) for s in sources]
    if any(streams) and not all(streams):
        raise ConfigError(
            f"mix(sources): sources {[i for i, s in enumerate(streams) if s]} are streams "
            f"(jl.Stream) and {[i for i, s in enumerate(streams) if not s]} are not; mix "
            "streams with streams (for a StreamLoader) and random-access sources with sources "
            "(for a DataLoader); a source can be read as a stream with "
            "jl.Stream.from_generator(lambda i: (source[j] for j in range(i, len(source), n)), "
            "shards=n)"
        )
    if stopping_strategy not in STOPPING_STRATEGIES:
        raise ConfigError(f"mix(stopping_strategy=...): expected one of "
                          f"{list(STOPPING_STRATEGIES)} (Hugging Face's interleave_datasets "
                          f"names), got {stopping_strategy!r}")
    if all(streams):
        return MixedStream(sources, schedule, stopping_strategy)
    if stopping_strategy != STOPPING_STRATEGIES[0]:
        raise ConfigError(
            f"mix(stopping_strategy={stopping_strategy!r}): a mixture of sources has no "
            "component epochs to stop at: the loader's epoch is the sum of the components' "
            "lengths, each component reshuffled as it wraps; leave stopping_strategy out, or "
            "set the epoch's length with a number of steps")
    return Mixture(sources, schedule)


def _block_size(global_batch: int, components: int) -> int:
    """Positions a block: the largest divisor of the global batch up to 1,024, so that a step
    holds whole blocks and a worker lays out only its own steps' blocks; at least
    ``m * (m - 1)`` for ``m`` components (see ``_Regime``). Without such a divisor, 1,024."""
    least = components * (components - 1)
    for size in range(min(_BLOCK, global_batch), max(least, 1) - 1, -1):
        if global_batch % size == 0:
            return size
    return max(_BLOCK, least)


def _weights(weights: Sequence[float] | Mapping[str, float], count: int, name: str,
             names: list[str] | None = None) -> np.ndarray:
    if isinstance(weights, Mapping):
        if names is None:
            raise ConfigError(
                f"mix({name}): weights by name ({sorted(map(str, weights))}) need sources by "
                "name: pass the sources as a dict with those keys, or the weights as a list "
                "in the sources' order")
        if set(weights) != set(names):
            raise ConfigError(
                f"mix({name}): expected a weight for each source by name {names}, got "
                f"{list(weights)} (missing {[n for n in names if n not in weights]}, unknown "
                f"{[n for n in weights if n not in names]})")
        weights = [weights[n] for n in names]
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(
            f"mix({name}): expected one number per source ({count}), got "
            f"{type(weights).__name__} {weights!r:.80}") from None
    if w.shape != (count,):
        raise ConfigError(
            f"mix({name}): expected one weight per source ({count}), got {len(w)}: {list(w)}"
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ConfigError(f"mix({name}): weights must be finite and >= 0, got {list(w)}")
    if w.sum() <= 0:
        raise ConfigError(f"mix({name}): weights sum to zero ({list(w)}); give one a weight > 0")
    return w / w.sum()


class _Regime:
    """Weights in force from block ``start``; ``before`` = each component's positions before."""

    def __init__(self, start: int, weights: np.ndarray, before: np.ndarray, block: int) -> None:
        self.start, self.weights, self.before, self.block = start, weights, before, block
        self.remainder = int(np.argmax(weights))  # takes what rounding leaves: never negative

    def counts(self, blocks: Any) -> np.ndarray:
        """Each component's positions in this regime's first ``blocks`` blocks (an int, or an
        array of them: one row each)."""
        total = np.asarray(blocks, np.int64) * self.block
        n = np.floor(total[..., None] * self.weights).astype(np.int64)
        n[..., self.remainder] = 0
        n[..., self.remainder] = total - n.sum(axis=-1)
        return n


def plan_regimes(starts: list[tuple[int, np.ndarray]], block: int) -> list[_Regime]:
    """The regimes of ``(first block, weights)`` pairs in step order, each with the positions
    of each component before it; two changes in one block: the later one wins."""
    regimes: list[_Regime] = []
    for start, weights in starts:
        if regimes:
            last = regimes[-1]
            if start <= last.start:
                regimes.pop()
                before, start = last.before, last.start
            else:
                before = last.before + last.counts(start - last.start)
        else:
            before = np.zeros(len(weights), np.int64)
        regimes.append(_Regime(start, weights, before, block))
    return regimes


def regime_counts(regimes: list[_Regime], blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each component's positions before each of ``blocks``, and in it (the regimes in
    force)."""
    m = len(regimes[0].weights)
    before = np.empty((len(blocks), m), np.int64)
    here = np.empty_like(before)
    starts = np.array([r.start for r in regimes])
    which = np.searchsorted(starts, blocks, side="right") - 1
    for r in np.unique(which):
        regime, at = regimes[r], which == r
        done = regime.counts(blocks[at] - regime.start)
        before[at] = regime.before + done
        here[at] = regime.counts(blocks[at] - regime.start + 1) - done
    return before, here


def check_weights_before(schedule: dict[int, Any], saved: Any, step: int) -> None:
    """Refuses a state's weights (``saved``: ``[[step, weights], ...]``) that differ from
    ``schedule``'s before ``step``: those steps were read with them."""
    if not isinstance(saved, list) or not all(
            isinstance(e, (list, tuple)) and len(e) == 2 for e in saved):
        raise StateDictError(
            "state['mixture']: expected the mixture's weights ([[step, weights], ...]), "
            f"received {saved!r:.200}; this state is not from a loader over a mixture"
        )
    ours = {s: [float(x) for x in w] for s, w in schedule.items() if s < step}
    theirs = {int(s): [float(x) for x in w] for s, w in saved if int(s) < step}
    same = ours.keys() == theirs.keys() and all(
        len(ours[s]) == len(theirs[s]) and all(
            math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) for a, b in zip(ours[s], theirs[s]))
        for s in ours)
    if not same:
        raise StateDictError(
            f"state['mixture']: the weights before step {step} differ: expected "
            f"{sorted(ours.items())}, received {sorted(theirs.items())}; a restore may add "
            "weight changes at or after the step it resumes from, never change earlier ones"
        )


class MixtureSampler:
    """The ``Sampler`` of a ``Mixture``: global step -> this process's positions and indices
    into the mixture (a ``ConcatSource`` of the components)."""

    def __init__(self, mixture: Mixture, batch_size: int, *, shuffle: bool | LocalShuffle,
                 seed: int, last_batch: str, process_index: int = 0, process_count: int = 1,
                 memo_stride: int = 1) -> None:
        """``shuffle``: each component's records in a full shuffle (``True``), read-locally
        (a ``LocalShuffle``: blocks of the component, records within windows of them), or in
        order. ``memo_stride``: the steps of a span are memoised in ``memo_stride`` classes
        (``step % memo_stride``), computed when first asked for: with ``N`` workers, worker
        ``s % N`` usually makes step ``s`` (the pool prefers it), so each computes its own."""
        batch_size = check_int("batch_size", batch_size, low=1,
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
        self._block_orders: dict[tuple[int, int], BlockOrder] = {}
        self.process_index, self.process_count = process_index, process_count
        # A mixture has no short last batch: positions run on across epochs.
        self.steps_per_epoch = max(1, self.num_records // self.global_batch_size)
        self.schedule = {step: w.tolist() for step, w in mixture.schedule.items()}
        self._lengths = np.diff(mixture.offsets)
        self._offsets = mixture.offsets[:-1]
        m = len(self._lengths)
        self._block = _block_size(self.global_batch_size, m)
        self._regimes = self._plan(mixture.schedule)
        self._seeds = [splitmix64(seed ^ splitmix64(c + 1)) for c in range(m)]
        self._key = splitmix64(seed ^ 0x6D69787475726521)  # the blocks' permutations
        self._memo = StepMemo(memo_stride)  # chunk: the span
        # a class of steps holds ~_SPAN positions of them
        self._span_steps = max(1, _SPAN * memo_stride // self.global_batch_size)
        self._rows = np.arange(process_index * batch_size, (process_index + 1) * batch_size)

    def _plan(self, schedule: dict[int, np.ndarray]) -> list[_Regime]:
        """Each change from the first block at or after its step's first position."""
        return plan_regimes([(-(-step * self.global_batch_size // self._block), weights)
                             for step, weights in sorted(schedule.items())], self._block)

    def __getstate__(self) -> dict:  # a worker's own memo and block orders
        return {**self.__dict__, "_memo": StepMemo(self._memo.stride), "_block_orders": {}}

    def batch(self, step: int) -> BatchSpec:
        epoch, k = divmod(step, self.steps_per_epoch)
        start = k * self.global_batch_size + self.process_index * self.batch_size
        positions = np.arange(start, start + self.batch_size, dtype=np.int64)
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
        return self._table(covered, at)[at]

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
        if self._local is not None:
            within = self._read_locally(c, epochs, within)
        elif self.shuffle:
            within = IndexShuffle(length, seed=self._seeds[c], tight=True, epoch=epochs)(within)
        return self._offsets[c] + within

    def _read_locally(self, c: int, epochs: int | np.ndarray, within: np.ndarray) -> np.ndarray:
        """Component ``c``'s records ``within`` of ``epochs`` in its read-local order: its
        blocks permuted each epoch, records shuffled within windows of them (``BlockOrder``,
        keyed by the component's seed), so its consecutive reads stay in a few blocks."""
        if isinstance(epochs, int):
            return self._block_order(c, epochs)(within)
        out = np.empty_like(within)
        for epoch in np.unique(epochs).tolist():
            at = epochs == epoch
            out[at] = self._block_order(c, epoch)(within[at])
        return out

    def _block_order(self, c: int, epoch: int) -> BlockOrder:
        order = self._block_orders.get((c, epoch))
        if order is None:
            if len(self._block_orders) > 8:  # a small component wraps many epochs a span
                self._block_orders.clear()
            assert self._local is not None and self._block_starts is not None
            order = self._block_orders[(c, epoch)] = BlockOrder(
                self._block_starts[c], window=self._local.window, seed=self._seeds[c],
                epoch=epoch)
        return order

    # -- state: the weights that made the steps so far must be the same --------------------
    def extra_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "mixture": [[step, weights] for step, weights in sorted(self.schedule.items())],
            "mixture_order": ORDER}
        if self._local_description is not None:
            state["local_shuffle"] = self._local_description
        return state

    def check_extra_state(self, state: dict, step: int) -> None:
        saved = state.get("mixture")
        if not isinstance(saved, list):
            check_weights_before(self.schedule, saved, step)  # raises, naming what came
        if state.get("mixture_order") != ORDER:
            raise StateDictError(
                f"state['mixture_order']: expected {ORDER}, received "
                f"{state.get('mixture_order')!r}; the jaxloader that wrote this state ordered "
                "a mixture's records another way (before the order had a number: 1), so its "
                "steps would read other records here; resume with that jaxloader, or start "
                "this mixture's stream over without the restore"
            )
        if state.get("local_shuffle") != self._local_description:
            raise StateDictError(
                f"state['local_shuffle']: expected {self._local_description!r} (each "
                f"component's), received {state.get('local_shuffle')!r}; the components were "
                "read in another order (shuffle=, LocalShuffle's window or blocks), so its "
                "steps would read other records here; restore with the shuffle that wrote it"
            )
        check_weights_before(self.schedule, saved, step)
