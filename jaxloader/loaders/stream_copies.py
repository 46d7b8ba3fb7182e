"""The copy a ``StreamLoader`` keeps of its batch maker, the error where it cannot be made, and
the copy ``peek()`` and a message about a batch read the next batch with (``at_step``).

Each of a stream's readers reads its own copy of a shard, and ``peek()`` and
``load_state_dict()`` work on copies of the stream, with or without workers: a stream whose
shard, generator or transform holds what cannot be copied (an open connection, a file, a lock)
fails as the loader is made. The error names the part that failed (a shard by its name) and
where such things are opened instead.

Example:
    >>> import threading
    >>> import jaxloader as jl
    >>> class Rows:
    ...     def __init__(self): self.lock = threading.Lock()
    ...     def shard(self, n): return iter(range(n, n + 3))
    >>> try:
    ...     jl.StreamLoader(jl.Stream.from_generator(Rows().shard, shards=2), batch_size=2)
    ... except jl.JaxloaderError as e:
    ...     print(str(e)[:90])
    StreamLoader: cannot copy the shard Rows.shard[0]: TypeError: cannot pickle '_thread.lock'
"""

from __future__ import annotations

import copy
import weakref
from typing import Any, Callable, TypeVar

from jaxloader.base.errors import ArgumentError
from jaxloader.base.state_copy import copied
from jaxloader.loaders.stream_runs import overlaid
from jaxloader.streams import passes
from jaxloader.streams.origins import described, rerun

T = TypeVar("T")


def pristine(maker: T) -> T:
    """A copy of ``maker`` (``copy.deepcopy``), or an error naming what could not be copied."""
    try:
        return copy.deepcopy(maker)
    except Exception as e:  # noqa: BLE001 - any copy's failure: named below, then raised
        raise _uncopyable(e, maker) from e


def at_step(loader: Any, use: Callable[[Any, int], T], step: int | None = None,
            unless: Callable[[Any], bool] | None = None) -> T | None:
    """``use(maker, step)``, ``maker`` a copy of ``loader``'s (a ``StreamLoader``'s) pristine
    maker hosting step ``step``'s reader at its state before it (in the pass ``next()`` is in,
    or the one ``iter()`` starts), its shards its own (the running reader's stay put) and
    closed after; ``step``: the next batch handed out, or one before it whose states are still
    kept (``None`` returned for one filed past, 64 batches back or more, or not yet made, or
    where ``unless(the reader's state)`` says not to read it)."""
    with loader._filing:  # (the step, the states and the pass read together)
        now = loader._progress.step
        step = now if step is None else step
        if not loader._base_step <= step <= now:
            return None
        states = [copied(s) for s in overlaid(loader._base, loader._base_step, loader._reports,
                                               step)]
        until, ended = loader._until, loader._ended
    if loader.num_epochs is not None:
        states = passes.stopping_at(states, passes.pass_of(
            states, until, ended, loader.num_epochs, loader.process_count))
    if unless is not None and unless(states[step % loader._readers]):
        return None
    maker = copy.deepcopy(loader._pristine)
    try:
        maker.reset(states[step % loader._readers])
        return use(maker, step)
    finally:
        maker.close()


def where_of(loader: Any) -> Callable[[int], str]:
    """How ``loader`` (a ``StreamLoader``) names a step's batch in a message about it as a
    whole (``BatchKinds``: other leaves than the first batch's): its reader, and where its
    readers' states before it are still kept, its first record's shard and place, read again
    on a copy (made in a worker, its records are not at hand here; one of thousands of shards
    differs). Holds the loader weakly: its progress holds this, and a cycle kept a loader
    dropped by its last name, and its workers, to the cycle collector."""
    ref, location = weakref.ref(loader), loader._maker.location

    def where(step: int) -> str:
        live = ref()
        return location(step) + ("" if live is None else described(lambda: at_step(
            live, lambda maker, at: maker.first_origin(at), step,
            lambda state: rerun(live._stream, state))))
    return where


def _uncopyable(e: Exception, maker: Any) -> ArgumentError:
    stream = maker.stream
    suspects: list[tuple[str, Any]] = [
        (f"shard {getattr(s, 'name', i)}", s) for i, s in enumerate(getattr(stream, "shards", ()))]
    suspects += [(f"transform {t!r:.60}", t)
                 for t in [*maker.record_transforms, *maker.batch_transforms]]
    name, error = f"stream ({stream!r:.80})", e
    for suspect, obj in suspects:
        try:
            copy.deepcopy(obj)
        except Exception as inner:  # noqa: BLE001 - the first part that fails is the one named
            name, error = suspect, inner
            break
    return ArgumentError(
        f"StreamLoader: cannot copy the {name}: {type(error).__name__}: {error}; "
        "each reader reads its own copy of a shard, and peek() and load_state_dict() copy the "
        "stream, with or without workers: open connections, files and locks in a shard's "
        "reset() or inside the generator function, not in the object they are made from")
