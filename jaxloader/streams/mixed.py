"""Weighted mixtures of streams: which component each record of a reader comes from.

::

    reader r (of R), its batches of B records, in groups of K = g * B slots (K >= m * (m - 1)
    for m components; g = 1 for any batch of 256 up to 16 components)
      group q: component c takes n_c(q) slots, from the weights in force (cumulative, exact:
               c's slots before group q are floor(K * q * w_c), the largest weight takes what
               rounding leaves)
      slots [f_c, f_c + n_c) ─> a keyed permutation of the group (seed, r, q) ─> its order
      component c: its own StreamReader, reader r of R over c's shards, in c's own epochs
    state of a reader: {reader, epoch: its components' furthest, emitted, components: [each
                        component reader's state], started: [[step, group] of each weight
                        change it has started]}

A record's component is a pure function of ``(seed, r, its place among r's records)`` and the
weights; its content is the next record of that component's reader. So a restore reopens each
component where it was (the state holds each one's place, a few numbers) and lays out the
group again: nothing lost, nothing repeated. A weight change from step ``s`` (``from_step``)
takes effect from the first group at or after the reader's place as it begins its first batch
at step ``s`` or later (``begin_step``): a batch reads ``B`` records, or more under a
``Filter``, or what a ``PackedStream`` packs into its rows, so the group is found when the step
is made, and the state records it. Earlier steps stay what they were, and a restore may add
changes from its step on (as ``jaxloader.mix`` over sources). (A state saved before changes
were recorded has a change it passed placed where that version placed it: at the group of
the reader's first batch at step ``s`` or later, counting ``B`` records a batch.)

A pass that ends (``StreamLoader(num_epochs=n)``) reads each component's epochs of the pass,
every record once: a component out of records gives its slots up (they are passed over, so
the others keep their proportions to each other), and the reader is done when every
component is (or when those left have no weight). Whether a component is out is a function
of its state, so the slots passed over are the same after a restore; and every component
ends its pass at the end of an epoch, so the next pass starts each at an epoch's start.
With ``stopping_strategy="first_exhausted"`` or ``"all_exhausted"`` (``EpochedReader``) the
reader has epochs of its own: each ends once one component (or every one, those done first
starting their next epoch) has read its epoch, and every component then starts an epoch.

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

from jaxloader.plans.mixture import check_weights_before
from jaxloader.streams.mixed_reader import WITHOUT_REPLACEMENT, EpochedReader, MixedReader



class MixedStream:
    """Streams mixed by weight (made by ``jaxloader.mix`` from ``Stream``s); read by a
    ``StreamLoader``. ``schedule``: step -> normalised weights, from step 0."""

    def __init__(self, streams: Sequence[Any], schedule: dict[int, np.ndarray],
                 stopping_strategy: str = WITHOUT_REPLACEMENT,
                 names: Sequence[str] | None = None) -> None:
        self.streams, self.schedule = list(streams), schedule
        self.stopping_strategy = stopping_strategy
        self.names = None if names is None else list(names)  # (``mix({name: stream})``'s)

    def __repr__(self) -> str:
        weights = [round(float(w), 3) for w in self.schedule[0]]
        changes = f", {len(self.schedule) - 1} weight changes" if len(self.schedule) > 1 else ""
        return f"MixedStream({self.streams!r}, weights={weights}{changes})"

    def reader(self, *, reader: int, readers: int, seed: int, batch_size: int) -> "MixedReader":
        """Reader ``reader`` of ``readers`` (``streams.contract``), of the class that ends its
        epochs as ``stopping_strategy`` says."""
        kind = MixedReader if self.stopping_strategy == WITHOUT_REPLACEMENT else EpochedReader
        return kind(self, reader=reader, readers=readers, seed=seed, batch_size=batch_size)

    @property
    def shards(self) -> list:
        """Every component's shards (what a process closes)."""
        return [shard for stream in self.streams for shard in stream.shards]

    def describe(self) -> dict[str, Any]:
        """What a state is checked against: the components (the weights are checked apart:
        later ones may be added on restore)."""
        described: dict[str, Any] = {"mix": [s.describe() for s in self.streams]}
        if self.stopping_strategy != WITHOUT_REPLACEMENT:
            described["stopping_strategy"] = self.stopping_strategy
        return described

    def extra_state(self) -> dict[str, Any]:
        return {"mixture": [[step, w.tolist()] for step, w in sorted(self.schedule.items())]}

    def check_extra_state(self, state: dict, step: int) -> None:
        """Refuses a state whose weights before ``step`` were others."""
        check_weights_before(self.schedule, state.get("mixture"), step)
