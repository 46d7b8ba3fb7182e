"""Weighted mixtures of streams: which component each record of a reader comes from.

::

    reader r (of R), its batches of B records, in groups of K = g * B slots (K >= m * (m - 1)
    for m components; g = 1 for any batch of 256 up to 16 components)
      group q: component c takes n_c(q) slots, from the weights in force (cumulative, exact:
               c's slots before group q are floor(K * q * w_c), the largest weight takes what
               rounding leaves)
      slots [f_c, f_c + n_c) ─> a keyed permutation of the group (seed, r, q) ─> its order
      component c: its own StreamReader, reader r of R over c's shards, in c's own epochs
    state of a reader: {reader, emitted, components: [each component reader's state]}

A record's component is a pure function of ``(seed, r, its place among r's records)`` and the
weights; its content is the next record of that component's reader. So a restore reopens each
component where it was (the state holds each one's place, a few numbers) and lays out the
group again: nothing lost, nothing repeated. A weight change from step ``s`` (``from_step``)
takes effect from each reader's first group whose first batch is at step ``s`` or later;
earlier steps stay what they were, and a restore may add changes from its step on (as
``jaxloader.mix`` over sources).

Example:
    >>> import jaxloader as jl
    >>> a = jl.Stream.from_generator(lambda i: ({"x": 0} for _ in range(1000)), shards=1)
    >>> b = jl.Stream.from_generator(lambda i: ({"x": 1} for _ in range(1000)), shards=1)
    >>> loader = jl.StreamLoader(jl.mix([a, b], [0.75, 0.25]), batch_size=64,
    ...                          process_index=0, process_count=1)
    >>> int(next(iter(loader))["x"].sum())  # b's share of the batch: exactly a quarter
    16
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxloader.errors import ConfigError, StateDictError
from jaxloader.mixture import check_weights_before, plan_regimes, regime_counts
from jaxloader.sampling import splitmix64, splitmix64_array

ORDER = 1  # this layout's number, in the state: a state of another is refused


class MixedStream:
    """Streams mixed by weight (made by ``jaxloader.mix`` from ``Stream``s); read by a
    ``StreamLoader``. ``schedule``: step -> normalised weights, from step 0."""

    def __init__(self, streams: Sequence[Any], schedule: dict[int, np.ndarray]) -> None:
        self.streams, self.schedule = list(streams), schedule

    @property
    def shards(self) -> list:
        """Every component's shards (what a process closes)."""
        return [shard for stream in self.streams for shard in stream.shards]

    def describe(self) -> dict[str, Any]:
        """What a state is checked against: the components and the layout's number (the
        weights are checked apart: later ones may be added on restore)."""
        return {"mix": [s.describe() for s in self.streams], "mixture_order": ORDER}

    def extra_state(self) -> dict[str, Any]:
        return {"mixture": [[step, w.tolist()] for step, w in sorted(self.schedule.items())]}

    def check_extra_state(self, state: dict, step: int) -> None:
        """Refuses a state whose weights before ``step`` were others."""
        check_weights_before(self.schedule, state.get("mixture"), step)


class MixedReader:
    """Reader ``reader`` of ``readers`` over a ``MixedStream``: the same protocol as a
    ``StreamReader`` (``initial_state``, ``reset``, ``next``, ``get_state``)."""

    def __init__(self, mixed: MixedStream, *, reader: int, readers: int, seed: int,
                 batch_size: int, per_process: int) -> None:
        from jaxloader.streams.reader import StreamReader

        self.reader, self.readers, self.seed = reader, readers, seed
        self.components = []
        for c, stream in enumerate(mixed.streams):
            try:
                self.components.append(StreamReader(  # each its own shard orders, windows
                    stream, reader=reader, readers=readers,
                    seed=splitmix64(seed ^ splitmix64(c + 1))))
            except ConfigError as e:
                raise ConfigError(f"mix(streams)[{c}]: {e}") from None
        m = len(mixed.streams)
        groups = max(1, -(-m * (m - 1) // batch_size))  # batches a group: no count below 0
        self._size = groups * batch_size
        self._key = splitmix64(seed ^ splitmix64(0x6D1C ^ splitmix64(reader + 1)))
        worker = reader % per_process

        def first_group(step: int) -> int:
            """The reader's first group whose first batch is at ``step`` or later (its batch
            ``j`` is its process's step ``j * per_process + worker``)."""
            batch = max(0, -(-(step - worker) // per_process))
            return -(-batch // groups)

        self._regimes = plan_regimes([(first_group(step), weights) for step, weights
                                      in sorted(mixed.schedule.items())], self._size)
        self._emitted = 0
        self._group: int | None = None
        self._layout = np.zeros(0, np.int64)

    def _lay_out(self, group: int) -> np.ndarray:
        """The component of each slot of ``group``: runs of each, through a keyed permutation."""
        _, here = regime_counts(self._regimes, np.array([group]))
        here = here[0]
        runs = np.repeat(np.arange(len(here)), here)
        keys = splitmix64_array(np.uint64(group) * np.uint64(self._size)
                                + np.arange(self._size, dtype=np.uint64) + np.uint64(self._key))
        return runs[np.argsort(keys)]

    # -- the StreamReader protocol ----------------------------------------------------------
    def initial_state(self) -> dict:
        return {"reader": self.reader, "emitted": 0,
                "components": [c.initial_state() for c in self.components]}

    def reset(self, state: dict | None) -> None:
        state = self.initial_state() if state is None else state
        parts = state.get("components") if isinstance(state, dict) else None
        if (not isinstance(state, dict) or type(state.get("emitted")) is not int
                or state["emitted"] < 0 or not isinstance(parts, list)
                or len(parts) != len(self.components)):
            raise StateDictError(
                f"mixed stream state: expected {{reader, emitted, components: one state for "
                f"each of the {len(self.components)} streams}}, got {state!r:.200}")
        if state.get("reader") != self.reader:
            raise StateDictError(f"mixed stream state: it is reader {state.get('reader')}'s, "
                                 f"handed to reader {self.reader}")
        for component, part in zip(self.components, parts):
            component.reset(part)
        self._emitted = state["emitted"]

    def get_state(self) -> dict:
        return {"reader": self.reader, "emitted": self._emitted,
                "components": [c.get_state() for c in self.components]}

    def close(self) -> None:
        """Closes the shards its components have open."""
        for component in self.components:
            component.close()

    def next(self) -> Any:
        group, slot = divmod(self._emitted, self._size)
        if group != self._group:
            self._layout, self._group = self._lay_out(group), group
        record = self.components[int(self._layout[slot])].next()
        self._emitted += 1
        return record
