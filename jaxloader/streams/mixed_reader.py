"""A mixed stream's readers (``mixed``'s module docstring has their design): ``MixedReader``,
which reads each component's epochs of a pass to their end, and ``EpochedReader``, with epochs
of its own (``stopping_strategy="first_exhausted"`` or ``"all_exhausted"``): where each ends,
and the epoch each component starts then.

Example:
    >>> import jaxloader as jl
    >>> a = jl.Stream.from_generator(lambda i: ({"x": 0} for _ in range(3)), shards=1)
    >>> b = jl.Stream.from_generator(lambda i: ({"x": 1} for _ in range(9)), shards=1)
    >>> mixed = jl.mix([a, b], [0.5, 0.5], stopping_strategy="first_exhausted")
    >>> loader = jl.StreamLoader(mixed, batch_size=2, num_epochs=1, process_index=0,
    ...                          process_count=1)
    >>> [int(x) for batch in loader for x in batch["x"][batch["mask"]]].count(0)  # a's 3 once
    3
"""

from __future__ import annotations

import bisect
from typing import Any, Literal, get_args

import numpy as np

from jaxloader.base.errors import ConfigError, StateDictError
from jaxloader.plans.mixture import first_block_with, plan_regimes, regime_counts
from jaxloader.order.index_shuffle import splitmix64, splitmix64_array
from jaxloader.streams.origins import component_name, mixture_origin

Stopping = Literal["all_exhausted_without_replacement", "first_exhausted", "all_exhausted"]
STOPPING_STRATEGIES: tuple[str, ...] = get_args(Stopping)  # (Hugging Face's names)
WITHOUT_REPLACEMENT, FIRST_EXHAUSTED, ALL_EXHAUSTED = STOPPING_STRATEGIES


class MixedReader:
    """Reader ``reader`` of ``readers`` over a ``MixedStream``: the same protocol as a
    ``StreamReader`` (``initial_state``, ``reset``, ``next``, ``get_state``)."""

    def __init__(self, mixed: Any, *, reader: int, readers: int, seed: int,
                 batch_size: int) -> None:
        self.reader, self.readers, self.seed = reader, readers, seed
        self.names: list[str] | None = mixed.names  # (``mix({name: stream})``'s, for errors)
        self.components = []
        for c, stream in enumerate(mixed.streams):
            try:
                self.components.append(stream.reader(  # each its own shard orders, windows
                    reader=reader, readers=readers, seed=splitmix64(seed ^ splitmix64(c + 1)),
                    batch_size=batch_size))
            except ConfigError as e:
                raise ConfigError(f"{component_name(self.names, c)}: {e}") from None
        m = len(mixed.streams)
        self._groups = max(1, -(-m * (m - 1) // batch_size))  # batches a group: no count < 0
        self._size = self._groups * batch_size
        self._key = splitmix64(seed ^ splitmix64(0x6D1C ^ splitmix64(reader + 1)))
        self._changes = sorted(mixed.schedule.items())  # (step, weights), step 0 first
        self._started = {0: 0}  # a change's step -> the group it starts at
        self._regimes = self._plan()
        self._emitted = self._served = 0  # (_served: the component of the last record)
        self._group: int | None = None
        self._layout = np.zeros(0, np.int64)
        self._out: set[int] = set()  # (a pass) the components with no record left in it
        self._left: tuple[Any, int, list[int]] = (None, 0, [])  # (layout, out): its slots left

    def _plan(self) -> list:
        return plan_regimes([(self._started[step], weights) for step, weights in self._changes
                             if step in self._started], self._size)

    def changes_due(self, step: int) -> bool:
        """Whether ``begin_step(step)`` starts a weight change."""
        return any(s <= step and s not in self._started for s, _ in self._changes)

    def begin_step(self, step: int) -> None:
        """Starts the weight changes due by ``step``, this reader's next batch: each from the
        first group at or after the records read so far (see the module docstring)."""
        due = [s for s, _ in self._changes if s <= step and s not in self._started]
        for change in due:
            self._started[change] = max(-(-self._emitted // self._size), *self._started.values())
        if due:
            self._regimes, self._group = self._plan(), None

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
        return {"reader": self.reader, "epoch": 0, "emitted": 0,
                "components": [c.initial_state() for c in self.components], "started": []}

    def reset(self, state: dict | None) -> None:
        state = self.initial_state() if state is None else state
        parts = state.get("components") if isinstance(state, dict) else None
        if (not isinstance(state, dict) or type(state.get("emitted")) is not int
                or not 0 <= state["emitted"] < 1 << 62 or not isinstance(parts, list)
                or len(parts) != len(self.components)):
            raise StateDictError(
                f"mixed stream state: expected {{reader, emitted (an int, 0 to 2**62), components: "
                f"one state for each of the {len(self.components)} streams}}, got {state!r:.200}")
        if state.get("reader") != self.reader:
            raise StateDictError(f"mixed stream state: it is reader {state.get('reader')}'s, "
                                 f"handed to reader {self.reader}")
        started = self._started_of(state.get("started"))
        until = {"until": state["until"]} if "until" in state else {}  # (a pass's end)
        for c, (component, part) in enumerate(zip(self.components, parts)):
            try:
                component.reset({**part, **until} if isinstance(part, dict) else part)
            except ConfigError as e:  # (a component with no record: which of them)
                raise ConfigError(f"{component_name(self.names, c)}: {e}") from None
        self._emitted = state["emitted"]
        self._out = set()  # (each component out of records is found out again)
        self._started = {0: 0, **started}
        self._regimes, self._group = self._plan(), None

    def _started_of(self, started: Any) -> dict[int, int]:
        """A state's ``started``, checked: changes of this schedule, in order."""
        steps = {s for s, _ in self._changes}
        pairs = [tuple(p) for p in started] if isinstance(started, list) and all(
            isinstance(p, list) and len(p) == 2 for p in started) else None
        if pairs is None or any(type(s) is not int or type(g) is not int or s not in steps
                                or s == 0 or g < 0 for s, g in pairs) or [
                s for s, _ in pairs] != sorted({s for s, _ in pairs}) or [
                g for _, g in pairs] != sorted(g for _, g in pairs):
            raise StateDictError(
                f"mixed stream state: started: expected [[step, group], ...] of this mixture's "
                f"weight changes ({sorted(steps - {0})}), in order, got {started!r:.200}")
        return dict(pairs)

    def get_state(self) -> dict:
        parts = [c.get_state() for c in self.components]
        return {"reader": self.reader, "epoch": max(p["epoch"] for p in parts),
                "emitted": self._emitted, "components": parts,
                "started": [[s, g] for s, g in sorted(self._started.items()) if s]}

    def close(self) -> None:
        """Closes the shards its components have open."""
        for component in self.components:
            component.close()

    def next(self) -> Any:
        """The next record; ``StopIteration`` once every component's pass is over."""
        if self._out:  # (a pass: a component has run out)
            return self._next_of_those_left()
        group, slot = divmod(self._emitted, self._size)
        if group != self._group:
            self._layout, self._group = self._lay_out(group), group
        c = self._served = int(self._layout[slot])
        try:
            record = self.components[c].next()
        except StopIteration:  # its pass is over: its slots are passed over from now on
            self._out.add(c)
            return self._next_of_those_left()
        except ConfigError as e:  # (a component with no record: which of them)
            raise ConfigError(f"{component_name(self.names, c)}: {e}") from None
        self._emitted += 1
        return record

    def has_next(self) -> bool:
        """Whether ``next()`` has a record (slots of components out of records are passed
        over, and the next one's window may be read, as ``next()`` would: the state then
        names the same place)."""
        try:
            self._to_one_left()
        except StopIteration:
            return False
        return True

    origin = mixture_origin  # the component, shard and place of next()'s last record

    def last_records(self) -> list:
        """What pads the batches of a pass that has ended: each component's last records, in
        the components' order (a pure function of the state)."""
        return [r for component in self.components for r in component.last_records()]

    def _next_of_those_left(self) -> Any:
        c = self._served = self._to_one_left()
        record = self.components[c].next()
        self._emitted += 1
        return record

    def _to_one_left(self) -> int:
        """Moves to the next slot whose component has a record left, and returns that
        component; ``StopIteration`` where none with weight has (the place unchanged). Every
        component out of records is found out first, not at its slot, so where the pass
        ends is a function of the state (a restore ends where the run did)."""
        for c in range(len(self.components)):
            try:
                if c not in self._out and not self.components[c].has_next():
                    self._out.add(c)
            except ConfigError as e:
                raise ConfigError(f"{component_name(self.names, c)}: {e}") from None
        start = self._emitted
        while True:
            group, slot = divmod(self._emitted, self._size)
            slots = self._slots_left(group)
            i = bisect.bisect_left(slots, slot)
            if i < len(slots):
                self._emitted = group * self._size + slots[i]
                return int(self._layout[slots[i]])
            left = np.array([c not in self._out for c in range(len(self.components))])
            after = (first_block_with(self._regimes, left, group + 1, self._size)
                     if self._weight_left(group) else None)
            if after is None:
                self._emitted = start
                raise StopIteration
            self._emitted = after * self._size

    def _slots_left(self, group: int) -> list[int]:
        """The slots of ``group`` whose components have records left (kept while neither
        its layout nor the components out change)."""
        if group != self._group:
            self._layout, self._group = self._lay_out(group), group
        layout, out, slots = self._left
        if layout is not self._layout or out != len(self._out):  # (a layout is laid anew
            left = np.ones(len(self.components), bool)  # after a reset or a weight change)
            left[list(self._out)] = False
            slots = np.flatnonzero(left[self._layout]).tolist()
            self._left = (self._layout, len(self._out), slots)
        return slots

    def _weight_left(self, group: int) -> bool:
        """Whether a component with records left has weight from ``group`` on (in the
        regime in force there, or a later one already started)."""
        left = [c for c in range(len(self.components)) if c not in self._out]
        return any((r.weights[left] > 0).any() for i, r in enumerate(self._regimes)
                   if i + 1 == len(self._regimes) or self._regimes[i + 1].start > group)


# all_exhausted: each reader starts every component of its epoch e at the component's epoch
# e * _REPEATS, those it starts again within it at the next ones: a component's shards are
# dealt to the readers by its epoch's number, so the readers' first reads of it in an epoch
# must share one (each counting on from its own repeats, they drifted apart from the third
# epoch: two readers read one shard, and another none)
_REPEATS = 1 << 32


class EpochedReader(MixedReader):
    """A ``MixedReader`` with epochs of its own, which end where ``stopping_strategy`` says
    (``"first_exhausted"``: once one component has read its epoch; ``"all_exhausted"``: once
    every component with weight has, those done first starting their next, oversampled).
    An epoch starts every component at the start of an epoch of its own (the rest of one
    under way is passed over); in a pass that stops before the next epoch, the reader is done.

    A component that hands out its epoch's last record is found out at once, not when its
    slot comes next: where an epoch ends is then a function of the state (a restore ends it
    where the run did), and so is the next pass's start. The state adds ``epoch`` (the
    reader's own) and, for ``"all_exhausted"``, ``starts``: each component's epoch as the
    reader's began."""

    def __init__(self, mixed: Any, **kwargs: Any) -> None:
        super().__init__(mixed, **kwargs)
        self._every = mixed.stopping_strategy == ALL_EXHAUSTED
        self._epoch = 0
        self._at = [0] * len(self.components)  # each component's epoch
        self._starts = [0] * len(self.components)  # each one's epoch as the reader's began
        self._until: int | None = None  # the epoch a pass stops before (None: endless)
        self._done = False  # the pass is over

    def initial_state(self) -> dict:
        state = super().initial_state()
        return {**state, "starts": [0] * len(self.components)} if self._every else state

    def get_state(self) -> dict:
        state = super().get_state()
        state["epoch"] = self._epoch
        return {**state, "starts": list(self._starts)} if self._every else state

    def reset(self, state: dict | None) -> None:
        state = self.initial_state() if state is None else state
        until = state.get("until") if isinstance(state, dict) else None  # (the pass's end)
        parts = state.get("components") if isinstance(state, dict) else None
        if isinstance(parts, list) and all(isinstance(p, dict) and type(p.get("epoch")) is int
                                           for p in parts):
            state = {k: v for k, v in state.items() if k != "until"}  # (the pass's: kept)
            state["components"] = [{**p, "until": p["epoch"] + 1} for p in parts]
        super().reset(state)  # (names a state that is not this reader's)
        at: list[int] = [p["epoch"] for p in state["components"]]
        epoch, starts = state.get("epoch", max(at)), state.get("starts", at)
        if type(epoch) is not int or epoch < 0 or not isinstance(starts, list) or len(
                starts) != len(at) or any(type(e) is not int or not 0 <= e <= a
                                          for e, a in zip(starts, at)):
            raise StateDictError(
                f"mixed stream state: expected epoch (an int) and, for all_exhausted, starts "
                f"(each component's epoch as the reader's began, at most its epoch now), got "
                f"epoch {state.get('epoch')!r}, starts {state.get('starts')!r:.100}; pass the "
                "dict that state_dict() returned, unchanged")
        self._epoch, self._at, self._starts = epoch, at, list(starts)
        self._until, self._done = until, False
        for c, component in enumerate(self.components):
            if not component.has_next():
                self._ran_out(c)
                if self._done or self._starts == self._at:  # (the epoch ended)
                    break

    def next(self) -> Any:
        """The next record; ``StopIteration`` once the pass is over."""
        if self._done:
            raise StopIteration
        group, slot = divmod(self._emitted, self._size)
        if group != self._group:
            self._layout, self._group = self._lay_out(group), group
        c = self._served = int(self._layout[slot])
        record = self.components[c].next()
        self._emitted += 1
        if not self.components[c].has_next():  # (it may read its next window, as next() would)
            self._ran_out(c)
        return record

    def has_next(self) -> bool:
        """Whether ``next()`` has a record: every component has one until the pass is over."""
        return not self._done

    def _ran_out(self, c: int) -> None:
        """Component ``c`` has handed out its epoch's last record: it starts its next, or the
        reader's epoch ends (the next starts, or the pass is over)."""
        if self._every:
            weights = [r for r in self._regimes if r.start <= self._emitted // self._size][-1]
            if any(a == s and weights.weights[d] > 0 for d, (a, s) in enumerate(
                    zip(self._at, self._starts)) if d != c):  # one has not read an epoch yet
                self._start(c, self._at[c] + 1)
                return
        if self._until is not None and self._epoch + 1 >= self._until:
            self._done = True
            return
        self._epoch += 1
        for d in range(len(self.components)):  # (all_exhausted: see _REPEATS)
            self._start(d, self._epoch * _REPEATS if self._every else self._at[d] + 1)
        self._starts = list(self._at)

    def _start(self, c: int, epoch: int) -> None:
        self._at[c] = epoch
        component = self.components[c]
        component.reset({**component.initial_state(), "epoch": epoch, "until": epoch + 1})
