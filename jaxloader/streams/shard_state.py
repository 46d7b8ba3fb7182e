"""A shard's ``get_state()`` as a reader keeps it: a copy taken as it is read, made JSON's types
when the reader's state is asked for.

A reader keeps where each window starts (a shard and its state) until the window's records are
all handed out, and a loader's ``state_dict()`` hands it on to be saved as JSON. The shard's
own dict may change as it reads on (a shard that keeps its place in a dict and returns that
dict), so the reader keeps a copy of it (``snapshot``, once a window: a record, without a
shuffle window): otherwise the saved start moves with the shard, and a restore skips
the records read since. A state that JSON cannot hold (a NumPy int, an array, a set) would
fail only at the checkpoint's save: ``plain`` makes NumPy scalars Python's and tuples lists,
and refuses the rest, naming the shard and the place, when the reader's state is asked for
(each batch).

Example:
    >>> import numpy as np
    >>> state = {"i": np.int64(2), "seen": (1, 2)}
    >>> plain(state, lambda: "r")
    {'i': 2, 'seen': [1, 2]}
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxloader.base.checks import MASK64
from jaxloader.base.errors import StateDictError
from jaxloader.base.state_copy import copied
from jaxloader.streams.shard_files import check_unchanged

__all__ = ["Crossings", "checked_reader_state", "copied", "crossings_of", "left_early",
           "mark_of", "plain", "snapshot"]  # (copied: the reader's, for a shard's reset)

_IDENTITY = ("size", "head", "tail")  # a file's, as a crossing's state names it
_SCALARS = (str, int, float, bool, type(None))
_PLAIN = frozenset(_SCALARS)  # (a set's lookup: the check made once a window)


def snapshot(shard: Any) -> Any:
    """A copy of ``shard.get_state()``: a flat dict's top level (numbers and strings, the
    usual state), else ``plain``'s, which is made anew (refused, naming the shard, where JSON
    cannot hold it); as it is from a shard whose state is made anew each time it is asked
    for (``fresh_state``: a Hugging Face dataset's)."""
    state = shard.get_state()
    if getattr(shard, "fresh_state", False):
        return state
    return dict(state) if _flat(state) else plain(state, lambda: shard.name)


def plain(state: Any, name: Callable[[], str]) -> dict | None:
    """``state`` (a snapshot) in JSON's types (dicts with string keys, lists, str, int,
    float, bool, None; tuples become lists and NumPy scalars Python's); ``None`` (a shard not
    started) as it is. ``name()`` names its shard in a refusal."""
    if state is None:
        return None
    if not isinstance(state, dict):
        raise StateDictError(
            f"stream shard {name()}: get_state() returned {type(state).__name__}, "
            "expected a dict of plain JSON (where the next record is: offsets, counts)")
    if _flat(state) and all(type(key) is str for key in state):
        return state  # (JSON's types already)
    return _plain(state, name, ())


def _flat(state: Any) -> bool:
    """Whether ``state`` is a dict of JSON's scalars (the usual state: offsets, counts), whose
    top level is then all a copy needs (its keys: ``plain``'s, once a batch, not a record's)."""
    if type(state) is not dict:
        return False
    scalars = _PLAIN
    for value in state.values():
        if type(value) not in scalars:
            return False
    return True


def _plain(value: Any, name: Callable[[], str], at: tuple) -> Any:
    """``value`` in JSON's types; ``at``: the keys and places leading to it (named only in a
    refusal)."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise _refused(name, (*at, key), f"a key of type {type(key).__name__}")
        return {k: _plain(v, name, (*at, k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, name, (*at, i)) for i, v in enumerate(value)]
    if isinstance(value, np.generic) and not isinstance(value, (np.datetime64, np.timedelta64,
                                                                np.void)):
        return _plain(value.item(), name, at)
    if isinstance(value, _SCALARS):  # a subclass (an IntEnum, a str's): its plain value
        return next(kind(value) for kind in (bool, int, float, str) if isinstance(value, kind))
    raise _refused(name, at, f"a {type(value).__name__}")


def _refused(name: Callable[[], str], at: tuple, what: str) -> StateDictError:
    where = "".join(f"[{k!r}]" for k in at) or "itself"
    return StateDictError(
        f"stream shard {name()}: get_state() {where} is {what}, which a checkpoint cannot keep "
        "as JSON; return plain JSON from get_state() (dicts with string keys, lists, str, int, "
        "float, bool, None), e.g. int(n) for a NumPy int, a list for an array")


_STATE_KEYS = ("reader", "epoch", "shard", "window", "emitted")


def checked_reader_state(state: Any, reader: int) -> dict:
    """A ``StreamReader``'s ``state``, checked as reader ``reader``'s."""
    if not isinstance(state, dict) or any(
            type(state.get(k)) is not int or state[k] < 0 for k in _STATE_KEYS) or not (
            "shard_state" in state and (state["shard_state"] is None or isinstance(
                state["shard_state"], dict))):
        raise StateDictError(f"stream state: expected {{reader, epoch, shard, shard_state, "
                             f"window, emitted}} of non-negative ints (shard_state a dict or "
                             f"None), got {state!r:.300}")
    if state["reader"] != reader:
        raise StateDictError(f"stream state: it is reader {state['reader']}'s, handed to "
                             f"reader {reader}")
    for key in ("epoch", "window"):  # (a window of 2**64 permuted as window 0 did)
        if state[key] > MASK64:
            raise StateDictError(f"stream state: {key} {state[key]} out of range")
    crossed = state.get("crossed", [])
    if not isinstance(crossed, list) or any(type(n) is not int for n in crossed) or any(
            not 0 <= a <= b for a, b in zip(crossed, crossed[1:] + [MASK64])):
        raise StateDictError(f"stream state: crossed: expected the records read from its "
                             f"window's start as it left each shard (ascending ints >= 0), got "
                             f"{crossed!r:.200}; not this stream's")
    files = state.get("crossed_files", [])
    if isinstance(files, list) and len(files) > len(crossed):  # (one a crossing, at most)
        raise StateDictError(f"stream state: crossed_files holds {len(files)} entries where "
                             f"crossed holds {len(crossed)} (an entry a crossing)"
                             + (", the state has no 'crossed'" if "crossed" not in state else "")
                             + "; it was cut or edited: not this stream's")
    if not isinstance(files, list) or any(
            f is not None and not _many_files(f) and not (
                isinstance(f, list) and len(f) == len(_IDENTITY) and all(
                    v is None or type(v) is int and v >= 0 for v in f)) for f in files):
        raise StateDictError(f"stream state: crossed_files: expected the identity of each file "
                             f"the window entered ([size, head, tail], a list of [name, size, "
                             f"head, tail] for a shard of several, or null), got "
                             f"{files!r:.200}; not this stream's")
    return state


def _many_files(entry: Any) -> bool:
    """Whether a crossing's ``entry`` names a shard's files (``[[name, size, head, tail],
    ...]``: a Hugging Face shard's), not one file's ``[size, head, tail]``."""
    return isinstance(entry, list) and bool(entry) and all(
        isinstance(f, list) and len(f) == 4 and isinstance(f[0], str) for f in entry)


def left_early(shard: Any, read: int, saved: int) -> StateDictError:
    """The refusal of a window read again whose shard ``shard`` ended after ``read`` of its
    records where the saved window read ``saved`` before it left it."""
    return StateDictError(
        f"stream shard {getattr(shard, 'name', shard)}: it ends after the window's first {read} "
        f"records, where the window the state was saved in read {saved} before leaving it: it "
        "holds fewer records than then (rewritten, or shortened); restore over the shards the "
        "state was saved with")


def innermost(shard: Any) -> Any:
    """The shard under the wrappers a reader opens it through: a ``RefillWatch`` (``_shard``)
    and each ``Stream.map`` (``MappedShard.shard``); a file's identity, ``append_only`` and
    path are its own.

    Example:
        >>> class Shard:
        ...     def __init__(self, shard=None): self.shard = shard
        ...     def next(self): ...
        >>> file = Shard()
        >>> innermost(Shard(Shard(file))) is file
        True
    """
    for _ in range(1000):  # (a wrapper of itself would loop for ever)
        under = getattr(shard, "_shard", None)
        under = getattr(shard, "shard", None) if under is None else under
        if under is None or not hasattr(under, "next"):  # (a shard: it reads records)
            return shard
        shard = under
    return shard


def ends_there(shard: Any, read: int) -> None:
    """Refuses a saved crossing, ``read`` records into a window, that leaves a file shard
    (not ``append_only``, whose size and ends the state names) before its end: the saved run
    left it at its end, so the state was edited or is another stream's (its records past
    there were left out without a word). Other shards (a generator's) may have grown."""
    shard = innermost(shard)  # (a Stream.map's: the file's, which a record read ends)
    if getattr(shard, "append_only", True) is not False:
        return
    try:
        shard.next()
    except StopIteration:
        return
    raise StateDictError(
        f"stream shard {getattr(shard, 'name', shard)}: the state's crossed says the window "
        f"left it after {read} records, and it holds more (its size is the state's): the "
        "state was saved reading it with append_only=True, which held its last line back "
        "while it had no line break (read it as that run did), or the state was edited or is "
        "another stream's (pass the dict that state_dict() returned, unchanged)")


class Crossings:
    """Where a ``StreamReader`` left each shard: the count of records it had read into windows
    (since its reset) as it left each: those of the window being read, and ``KEPT`` before it.
    A state's ``crossed`` is those since its window's start (``of``), and a restore
    (``Crossings(crossed)``) leaves each shard where the saved run did: an ``append_only``
    shard appended to since the save gave the window read again other records where the saved
    run had left it (its new records are read in its next epoch), and a packing reader's
    window, read again from a state taken before it, reads on past the reader's window.

    Example:
        >>> c = Crossings([2])  # the saved run left its first shard after 2 records
        >>> c.start(), c.left(2)  # (reading a window: where to leave, then left it)
        (2, -1)
    """

    KEPT = 1 << 16  # exits kept before the window being read (a packing reader's window,
    # read again from a state taken before it, spans a few shards; the window's own all kept)

    def __init__(self, crossed: list[int] | None = None, files: list | None = None) -> None:
        self.reads, self.exits, self.dropped = 0, list[int](), 0
        self.since = (0, 0)  # (the exits before and the records read before the window)
        self.leave = list(crossed or [])
        self.entered: list[list | None] = []  # the file entered at each exit: its identity
        self.expect = list(files or [])  # (a restore's: each checked as it is entered)

    def opened(self, shard: Any) -> None:
        """The shard entered at the last exit is open (``None``: none left this epoch): a file's
        identity kept for a state's ``crossed_files``, and a restore's checked against the
        saved one (a shard the window ran into, rewritten with as many records, repeated and
        lost records without a word: only the window's first shard was checked)."""
        shard = innermost(shard)  # (watched for refills, and a Stream.map's: the file's)
        identity = getattr(shard, "_identity", None)  # (a FileShard's: size, head, tail)
        self.entered.append([identity.get(k) for k in _IDENTITY] if isinstance(
            identity, dict) and identity else  # (a list: a state of many crossings)
            getattr(shard, "local_files", None))  # (a Hugging Face shard's files, each one's)
        then = self.expect.pop(0) if self.expect else None
        if not then or self.entered[-1] is None:
            return
        if _many_files(then):
            check_files = getattr(shard, "check_files", None)
            if check_files is None:
                raise StateDictError(f"stream state: crossed_files: files {then!r:.120} for "
                                     f"shard {getattr(shard, 'name', shard)}, which reads none "
                                     "of its own; restore a state this stream saved")
            check_files(then)
        elif not isinstance(identity, dict):
            raise StateDictError(f"stream state: crossed_files: one file's identity {then!r:.120}"
                                 f" for shard {getattr(shard, 'name', shard)}, which reads "
                                 "several files of its own; restore a state this stream saved")
        else:
            check_unchanged(shard, {k: v for k, v in zip(_IDENTITY, then) if v is not None})

    def start(self) -> int:
        """A window starts: the count of its records to leave the shard at, or -1."""
        self.since = (self.dropped + len(self.exits), self.reads)
        return self.leave[0] - self.reads if self.leave else -1

    def left(self, read: int) -> int:
        """The shard is left after ``read`` records of the window: ``start``'s for the next."""
        if self.leave:
            self.leave.pop(0)
        self.exits.append(self.reads + read)
        older = self.since[0] - self.dropped  # (the exits before this window)
        if older > self.KEPT:
            del self.exits[:older - self.KEPT // 2], self.entered[:older - self.KEPT // 2]
            self.dropped += older - self.KEPT // 2
        return self.leave[0] - self.reads if self.leave else -1

    def read(self, count: int) -> None:
        """The window read holds ``count`` records."""
        self.reads += count

    def mark(self) -> tuple["Crossings", int, int]:
        """Where the window being read starts (what ``of`` counts a state taken now from):
        these crossings', whose reader may be reset after (a mixture's component starting
        its epoch anew gets new ones: the exits before are these)."""
        return (self, *self.since)

    def of(self, state: dict, mark: tuple["Crossings", int, int]) -> dict:
        """``state``, taken at ``mark``, with ``crossed``: where the reader left each shard
        since, counted from that window's start, as ``mark``'s crossings kept them (a window
        left more than ``KEPT`` shards before the one read now: as it is)."""
        crossings, index, reads = mark
        at = index - crossings.dropped
        left = [e - reads for e in crossings.exits[at:]] if at >= 0 else []
        files = crossings.entered[at:at + len(left)] if left else []
        return {**state, "crossed": left, **({"crossed_files": files} if any(files) else {})} \
            if left else state


def mark_of(reader: Any) -> Any:
    """Where ``reader``'s current window starts (``StreamReader.mark``; a mixture's, each of its
    components'), for ``crossings_of`` a state of it taken now; ``None`` for other readers."""
    if isinstance(getattr(reader, "components", None), list):
        return [mark_of(c) for c in reader.components]
    mark = getattr(reader, "mark", None)
    return mark() if callable(mark) else None


def crossings_of(reader: Any, state: dict, mark: Any) -> dict:
    """``state`` of ``reader``, taken at ``mark`` (``mark_of``), with where it left each shard
    since (``Crossings.of``; a mixture's in each component's state)."""
    if isinstance(mark, list):
        return {**state, "components": [crossings_of(c, part, m) for c, part, m in zip(
            reader.components, state["components"], mark)]}
    return state if mark is None else reader.crossings(state, mark)
