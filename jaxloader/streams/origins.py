"""Where a stream's record came from (its shard and its place there), for messages only; and a
shard opened, its failure named (``opened``).

A reader keeps no origin per record. It keeps, per window, where the window starts and where
it crossed into another shard (``Segments``); a message reads the shard again from there to
name the record's place (a line, a record count, or the shard's state after it). A loader's batch
maker likewise keeps its reader's state before each batch, and reads the batch again up to a
record that failed (``described``). Nothing is done for a record that raises no error. A
generator's shard (an ``IterableShard``, under a ``Stream.map`` too) resumes by running its
generator anew and reading up to the place: a window's record is counted instead, and a
batch is read again only while its generators' records to read again are few (``rerun``),
else its start is said: a simulator's error came minutes late after hours of training.

Example:
    >>> from jaxloader.streams.iterable_shards import IterableShard
    >>> shard = IterableShard(lambda: list("abc"), name="letters")
    >>> Segments([(0, None, 0)]).place([shard], [0], 2)
    'letters record 3'
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from jaxloader.base.abilities import close_of
from jaxloader.base.errors import JaxloaderError, JaxloaderWarning, RecordError
from jaxloader.base.state_copy import copied
from jaxloader.streams.iterable_shards import IterableShard
from jaxloader.streams.shard_state import innermost

_COUNTS = (("line", "line"), ("records", "record"), ("consumed", "record"))


class Segments(list):
    """A window's runs of records by shard, ``(shard, state, first)`` each: the reader's
    ``shard``-th of its epoch, read from ``state`` (``None``: its start) into the window's
    places from ``first`` on."""

    def place(self, shards: Sequence[Any], mine: Sequence[int], index: int) -> str:
        """The shard and place of the window's record ``index`` (before its permutation),
        read again from its run's start."""
        at, state, first = next(s for s in reversed(self) if s[2] <= index)
        shard = copy.copy(shards[mine[at]])
        if isinstance(innermost(shard), IterableShard):  # (its place by its records' count:
            # no generator run again)
            return named(shard.name, {"consumed": (state or {}).get("consumed", 0) + index
                                      - first + 1})
        try:
            shard.reset(state if state is None else copied(state))  # (it may keep, change it)
            for _ in range(index - first + 1):
                record = shard.next()
            after = shard.get_state()
        finally:
            close_of(shard)
        key = record.get("__key__") if isinstance(record, dict) else None  # (a tar's sample)
        return named(shard.name, after) + (f", key {key!r}" if isinstance(key, str) else "")


RERUN_MAX = 10_000  # a generator's records a message reads again at most


def rerun(stream: Any, state: Any = None) -> bool:
    """Whether reading ``stream`` again from ``state`` (a reader's; ``None``: from anywhere)
    runs generators anew over more than ``RERUN_MAX`` records (an ``IterableShard`` reads its
    records again up to its state, O(n) in them, and its window again after)."""
    if not any(isinstance(innermost(shard), IterableShard) for shard in stream.shards):
        return False
    windows = sum(getattr(s, "shuffle_window", 1) for s in getattr(stream, "streams", [stream]))
    return state is None or _consumed(state) + windows > RERUN_MAX


def _consumed(state: Any) -> int:
    """The ``"consumed"`` counts in a reader's ``state`` (its shards', its components')."""
    if isinstance(state, dict):
        return sum(v if k == "consumed" and type(v) is int else _consumed(v)
                   for k, v in state.items())
    return sum(map(_consumed, state)) if isinstance(state, (list, tuple)) else 0


def batch_start(reader: Any, before: Any) -> str:
    """`` (...)`` naming where ``reader``'s batch began (its state ``before`` it), for a record
    of a stream whose shards are not read again to name its place (``rerun``): the window it
    was in, read from a shard (named where the reader is still in that epoch) at a state, and
    the records of the window handed out before the batch."""
    if isinstance(before, dict) and "shard" in before:
        at, mine = before["shard"], getattr(reader, "_mine", ())
        shard = (reader.stream.shards[mine[at]].name if before.get("epoch") == getattr(
            reader, "_epoch", None) and at < len(mine) else f"its shard {at} of the epoch")
        start = (f"in epoch {before.get('epoch')}, in a window read from {shard} at "
                 f"{before.get('shard_state')!r:.80}, {before.get('emitted')} of it handed out")
    else:  # (a mixture's: its components' states)
        said = repr(before)
        start = f"at {said[:240]}" + ("..." if len(said) > 240 else "")
    return (f" (reader {reader.reader}'s batch began {start}; not read again to name the "
            "record: the generators would run anew)")


def last_origin(reader: Any) -> str | None:
    """A ``StreamReader``'s ``origin()``: the shard and place of the record its ``next()``
    handed out last (of the window before, where ``has_next()`` has read the next one)."""
    read = reader._read_from if reader._emitted else reader._previous
    if read is None:
        return None
    mine, (shard, state), crossed, permutation = read
    index = permutation[reader._emitted - 1] if reader._emitted else permutation[-1]
    runs = Segments([(shard, state, 0), *((at, None, first) for at, first in crossed or ())])
    return runs.place(reader.stream.shards, mine, int(index))


def component_name(names: Sequence[str] | None, c: int) -> str:
    """A mixed stream's component ``c`` as errors name it: by its name in ``mix``, else its
    place."""
    return f"mix(streams)[{c if names is None else names[c]!r}]"


def mixture_origin(reader: Any) -> str | None:
    """A ``MixedReader``'s ``origin()``: its component that handed out the last record, and
    that one's origin (``None`` where it names none: packed rows)."""
    origin = getattr(reader.components[reader._served], "origin", None)
    where = origin() if origin is not None else None
    return where and f"{component_name(reader.names, reader._served)}: {where}"


def named(name: str, state: Any) -> str:
    """``name`` and the place a shard's ``state`` (after a record) says: its line or record
    number where it counts them (from 1: the shard's first is its record 1), else the state
    itself."""
    for key, word in _COUNTS:
        if isinstance(state, dict) and key in state:
            return f"{name} {word} {state[key]}"
    return f"{name} (its state after the record: {state!r:.200})"


def described(replay: Callable[[], str | None]) -> str:
    """``" (origin)"``, the origin ``replay()`` finds; ``""`` where it finds none (packed
    rows), or why it could not."""
    try:
        origin = replay()
    except Exception as e:  # noqa: BLE001 - the message names the first error; this is extra
        why = e.__cause__ if isinstance(e, RecordError) and e.__cause__ is not None else e
        return f" (its shard is not known: reading it again raised {type(why).__name__}: {why})"
    return f" ({origin})" if origin else ""


def state_or_why(shard: Any) -> Any:
    """``shard.get_state()``, for a message: what it says, or why it could not."""
    try:
        return shard.get_state()
    except Exception as e:  # noqa: BLE001 - the shard is already failing; name that first
        return f"<no state: get_state raised {type(e).__name__}>"


def read_failed(shard: Any, reader: int, epoch: int, error: Exception) -> RecordError:
    """The error of a shard's ``next()`` that raised ``error``: the shard, the reader, the
    epoch and the shard's state, asked for here, not before every record (a Hugging Face
    shard's costs a copy of its state: 5 us of ~50 a record; a shard's state stays where it
    was when its ``next()`` raises: ``IterableShard`` counts only records returned)."""
    return RecordError(f"stream shard {shard.name} (reader {reader}, epoch {epoch}) raised "
                       f"{type(error).__name__} at {state_or_why(shard)}: {error}")


def opened(shard: Any, state: dict | None, reader: int, epoch: int) -> None:
    """``shard.reset(state)``, where a shard opens its files or connections: what it raises is a
    ``RecordError`` naming the shard, the reader and the epoch, as a record's read is (it was
    bare, naming no shard of thousands, and ``except jl.RecordError`` missed it)."""
    try:
        shard.reset(state)
    except (JaxloaderError, JaxloaderWarning):  # (jaxloader's own, or its warning made an error)
        raise
    except Exception as e:
        raise RecordError(
            f"stream shard {shard.name} (reader {reader}, epoch {epoch}) raised "
            f"{type(e).__name__} as it was opened (its reset({'state' if state else 'None'})): "
            f"{e}") from e
