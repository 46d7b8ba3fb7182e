"""Passes over a stream that end (``StreamLoader(num_epochs=n)``): where each reader stops,
and whether it is done, from the readers' states.

A reader's state in a pass carries ``"ended"`` (its report: no record left in the pass); the
loader tells each reader the epoch it stops before (``"until"``, in the state it resets from).
A packing reader's state carries its inner reader's epoch, and passes ``until`` down to it.
The loader keeps the pass it is in (and its state saves it: ``saved``/``restored``): in a
pass's first steps a reader that has made no batch of it yet still holds the last pass's
state, so the readers' states alone may not say which pass the position is in.

Example:
    >>> states = [{"epoch": 0, "ended": True}, {"epoch": 0, "ended": False}]
    >>> stops_of(states, 1), done(states, stops_of(states, 1))  # a pass under way: to its end
    ([1, 1], [True, False])
    >>> stops_of([{"epoch": 0, "ended": True}] * 2, 1)  # every reader done: the next pass
    [2, 2]
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

from jaxloader.base.errors import ConfigError, JaxloaderWarning, StateDictError, user_stacklevel


def empty_files(stream: Any, endless: bool = False) -> None:
    """Warns of empty files among ``stream``'s shards, in a pass that ends (``num_epochs``, or
    ``endless``, a mixture's epochs that a ``stopping_strategy`` other than the default ends):
    they fail a pass whose deal gives a reader nothing else (at the pass the seed decides,
    maybe hours in)."""
    mixed = stream if hasattr(stream, "stopping_strategy") else getattr(stream, "stream", None)
    strategy = getattr(mixed, "stopping_strategy", None)
    if endless and strategy in (None, "all_exhausted_without_replacement"):
        return  # (read without end: an empty shard is passed over)
    empty = [path for shard in getattr(stream, "shards", None) or () if isinstance(
        path := getattr(shard, "path", None), str) and os.path.isfile(path)
        and os.path.getsize(path) == 0]
    if empty:
        ends = f"stopping_strategy={strategy!r}" if endless else "num_epochs"
        warnings.warn(
            f"{ends}: {len(empty)} of the stream's shards are empty files ({empty[0]}"
            f"{', ...' if len(empty) > 1 else ''}): a pass whose deal gives a reader only empty "
            "shards is refused, as it has no records to pad its last batches with, at the pass "
            "the seed's deal decides (the first, or one hours in); remove the empty files (a "
            "0-byte part file, as Spark writes them), or " + (
                "mix with the default stopping_strategy, whose components' epochs do not end "
                "the stream's" if endless else "read without end (num_epochs=None)"),
            JaxloaderWarning, stacklevel=user_stacklevel())


def idle_components(stream: Any, num_epochs: int) -> None:
    """Warns of a stream mixture's component of weight 0 from its last weight change on, or
    from step 0 until a later one: a pass ends once the components with weight have read
    their epochs, without (the rest of) its records (as a source mixture's idle component is
    warned of); not where a pass ends at the first component's end (``"first_exhausted"``)."""
    if not hasattr(stream, "schedule"):  # (a PackedStream's: of the stream it packs)
        stream = getattr(stream, "stream", None)
    schedule = getattr(stream, "schedule", None)
    if not schedule or getattr(stream, "stopping_strategy", "") == "first_exhausted":
        return
    steps = sorted(schedule)
    last = [c for c, w in enumerate(schedule[steps[-1]]) if w == 0]
    first = [c for c, w in enumerate(schedule[0]) if w == 0]
    if last:  # (from the last change on: never read again)
        when = f"from step {steps[-1]}" if steps[-1] else "at every step"
        what = f"without {'the rest of ' if steps[-1] else ''}its records"
    elif first:  # (until a later change: a pass that ends before it reads none of it)
        later = next(s for s in steps if schedule[s][first[0]] > 0)
        when, what = f"until step {later}", "without its records if that is before then"
    else:
        return
    warnings.warn(
        f"mix: component {(last or first)[0]} of the streams has weight 0 {when}, so a pass "
        f"(num_epochs={num_epochs}) ends once the components with weight have read their "
        f"epochs, {what}; give it a weight to read it whole each pass, or leave it out of "
        "the mixture", JaxloaderWarning, stacklevel=user_stacklevel())


def check(process_count: int) -> None:
    """Refuses a pass that ends (``num_epochs``) where its processes could not agree on its
    end."""
    if process_count > 1:
        import jax

        if jax.process_count() != process_count:
            raise ConfigError(
                f"num_epochs: the processes of a pass agree on its end through JAX (their "
                f"readers end at different steps), but process_count={process_count} and JAX "
                f"runs {jax.process_count()}; call jax.distributed.initialize() first, or read "
                "a held-out set into a list and use jl.DataLoader(records, batch_size=..., "
                "last_batch='pad')")


def stops_of(states: list[dict], num_epochs: int) -> list[int]:
    """The epoch each reader's pass stops before, from the readers' states alone (a loader
    that knows its pass keeps it). Passes are ``num_epochs`` epochs counted from epoch 0,
    ``[k n, (k+1) n)``, and every reader is in the same one: a pass under way (some reader
    not done) is the furthest reader's (one that has made no batch of it yet holds the last
    pass's state); once every reader is done, the next pass is the one after theirs."""
    new_pass = all(s.get("ended") is True for s in states)
    stop = max(((s.get("epoch", 0) + new_pass) // num_epochs + 1) * num_epochs for s in states)
    return [stop] * len(states)


def to_state(stops: list[int] | None, num_epochs: int | None,
             ended: bool = False) -> dict[str, Any]:
    """What a loader's state holds of the pass it is in (nothing before its first), and
    whether it was seen to end (by every process: one whose readers are done is not at the
    end while another's read on)."""
    if stops is None or num_epochs is None:
        return {}
    return {"pass": {"num_epochs": num_epochs, "until": stops[0], **({"ended": True} if ended
                                                                      else {})}}


def ended(state: dict, stops: list[int] | None) -> bool:
    """Whether the pass a state holds (``from_state``'s ``stops``) was seen to end."""
    return stops is not None and state["pass"].get("ended") is True


def pass_of(states: list[dict], ends: list[int] | None, ended: bool, num_epochs: int,
            process_count: int, ask: Any = None, vote: Callable[[bool], bool] | None = None,
            gone: Callable[[], bool] = lambda: False) -> list[int]:
    """The pass a position is in (each reader's end): the one under way (``ends``, from the
    run or the state restored) until it ``ended``, then the next. It ends once every reader
    of every process is done in it: one process's readers done is not the end while
    another's read on, so with several processes it is known from the run (or its state), or
    ``ask``ed of them all at an ``iter()`` they all make (a collective; ``ask``: the hosts'
    check of that ``iter()``, made first so that a process made otherwise is refused rather
    than left waiting, or ``True`` where there is none; ``vote``: asks through the hosts'
    store, not a collective, as ``everywhere``; ``gone``: the run was closed or restored
    meanwhile, which ends the wait for the others' settings)."""
    if ends is not None and not ended and (process_count == 1 or ask):
        if ask is not True and ask is not None:
            ask.due(0, gone)  # (raises where a process differs: its settings hold the pass)
        ended = everywhere(all(done(states, ends)), process_count, vote)
    return stops_of(states, num_epochs) if ends is None or ended else ends


def everywhere(done: bool, process_count: int,
               vote: Callable[[bool], bool] | None = None) -> bool:
    """Whether ``done`` holds in every process (each process asks alike): ``vote``'s answer
    (through ``jax.distributed``'s store: ``sharding.pass_votes``), else a collective."""
    if process_count == 1:
        return done
    if vote is not None:
        return vote(done)
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.array(done))))


def from_state(state: dict, num_epochs: int | None) -> list[int] | None:
    """The pass a saved state was in (each reader's end, as ``ends``), or ``None``: the state
    has none, or was saved with passes of another ``num_epochs`` (its readers' states then
    say where the position is)."""
    held = state.get("pass")
    if num_epochs is None:
        return None
    if held is None or isinstance(held, dict) and held.get("num_epochs") != num_epochs:
        _refuse_passes_apart(state, held, num_epochs)
        return None
    readers = state["readers"]
    until = held.get("until") if isinstance(held, dict) else None
    epochs = [r.get("epoch", 0) if isinstance(r, dict) else None for r in readers] if isinstance(
        readers, list) else [None]  # (the readers' states are checked as they are reset)
    # ``until`` ends the pass the readers are in, or once one ended, the next (a later pass's
    # end was taken: a restored pass read on for passes more, or for ever, without a word)
    known = [e for e in epochs if type(e) is int]
    ended = any(isinstance(r, dict) and r.get("ended") is True for r in readers)
    if (type(until) is not int or until < num_epochs or until % num_epochs
            or any(e >= until for e in known)
            or known and until > ((max(known) + ended) // num_epochs + 1) * num_epochs):
        raise StateDictError(
            f"state['pass']: expected {{num_epochs: {num_epochs}, until: a multiple of it above "
            f"every reader's epoch, the end of the pass they are in}}, received {held!r:.200}; "
            "pass the dict that state_dict() returned, unchanged")
    return [until] * len(readers)


def _refuse_passes_apart(state: dict, held: Any, num_epochs: int) -> None:
    """Refuses a state saved under another ``num_epochs`` (or endless) whose readers are in
    passes apart under this one: the pass under way (the furthest reader's, ``stops_of``)
    had the others read on through it, their records twice or more in one pass (readers at
    epochs 2 and 0 restored into ``num_epochs=1``: 48 records in a pass of 22)."""
    readers = state.get("readers")
    if not isinstance(readers, list) or not readers or not all(
            isinstance(r, dict) and type(r.get("epoch", 0)) is int for r in readers):
        return  # (the readers' states are checked as they are reset)
    start = stops_of(readers, num_epochs)[0] - num_epochs
    behind = [i for i, r in enumerate(readers)
              if r.get("epoch", 0) + (r.get("ended") is True) < start]
    if behind:
        saved = held.get("num_epochs") if isinstance(held, dict) else None
        said = (f"saved with num_epochs={saved}" if saved is not None else "its state holds "
                "no pass: saved endless, num_epochs=None, or by an older version")
        raise StateDictError(
            f"state['readers']: the readers are in epochs {[r.get('epoch', 0) for r in readers]}"
            f" ({said}); under num_epochs={num_epochs}, readers {behind} are in a pass before "
            f"the others' (from epoch {start}), which would read their records twice or more; "
            "restore it with the num_epochs it was saved with"
            + (f" ({saved}) and change it at a pass's end" if saved is not None else "")
            + ", or start a loader of the new setting from the start")


def done(states: list[dict], stops: list[int]) -> list[bool]:
    """Whether each reader has handed out its last epoch before its pass's end (``stops``,
    from ``ends``)."""
    return [s.get("ended") is True and s.get("epoch", 0) + 1 >= stop
            for s, stop in zip(states, stops)]


def stopping_at(states: list[dict], stops: list[int]) -> list[dict]:
    """The readers' states, each told the epoch its pass stops before."""
    return [{**s, "until": stop} for s, stop in zip(states, stops)]
