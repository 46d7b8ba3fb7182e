"""A loader's keyword arguments given to a source, a stream or a transform, answered.

A tf.data user writes ``Map(fn, num_parallel_calls=4)``, a PyTorch user
``FileListSource(paths, transform=fn)`` or ``ArraySource(data, batch_size=32)``: in jaxloader
those belong to the loader. Python alone says "unexpected keyword argument"; classes marked
with ``@loader_names(kind)`` say whose argument it is and what to pass. A name the class does
take, or one not in the table, goes to the class as it would without the mark (Python's own
error for the latter).

Example:
    >>> import jaxloader as jl
    >>> jl.Map(lambda r: r, num_parallel_calls=4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    jaxloader.base.errors.ArgumentError: Map(num_parallel_calls=4): Map has no num_parallel_calls: \
transforms run in the loader's worker processes: DataLoader(source, num_workers=4) or ...
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Literal, TypeVar

from jaxloader.base.errors import ArgumentError

Kind = Literal["source", "stream", "transform"]
_CALLS = {"source": "DataLoader(source, {arg})", "stream": "StreamLoader(stream, {arg})",
          "transform": "DataLoader(source, {arg}) or StreamLoader(stream, {arg})"}
_LOADER = "it is the loader's: {call}"
_LAST = ("the loader's last_batch= says what a short last batch does: "
         "DataLoader(source, last_batch='drop') (the default), 'partial' or 'pad'")
_REMEDIES = {
    **dict.fromkeys(("batch_size", "shuffle", "seed", "num_workers", "num_epochs", "prefetch",
                     "device_prefetch", "sharding", "last_batch", "transforms", "read_threads",
                     "process_index", "process_count", "timeout_s"), _LOADER),
    "drop_last": _LAST, "drop_remainder": _LAST,
    "num_parallel_calls": "transforms run in the loader's worker processes: {call} (or 'auto')",
    "deterministic": "nothing to set: a batch is a function of the loader's (seed, epoch, step)",
    "transform": "the loader's transforms= runs it: {call} (jaxloader.RandomMap(fn) for "
                 "fn(record, rng))",
    "target_transform": "the loader's transforms= runs it: {call}, fn changing the label",
    "collate_fn": "batches are collated for you (a pytree of stacked arrays): to change a "
                  "whole batch, {call}",
    "rng": "RandomMap gives fn(record, rng) a generator a record, from the loader's seed= and "
           "the record's position",
}
_REMEDIES["generator"] = _REMEDIES["rng"]
_ARGS = {"num_parallel_calls": "num_workers={value!r}", "transform": "transforms=[jaxloader.Map(fn)]",
         "target_transform": "transforms=[jaxloader.Map(fn)]",
         "collate_fn": "transforms=[..., jaxloader.BatchMap(fn)]"}
_FULL = ("a stream's batches are all full: a pass that ends (StreamLoader(stream, "
         "num_epochs=n)) pads its last ones, marking the real rows in batch['mask']")
_STREAM_REMEDIES = {
    **_REMEDIES, "drop_last": _FULL, "drop_remainder": _FULL, "last_batch": _FULL,
    "shuffle": "records are shuffled within a window, shuffle_window=n (Stream(shards, "
               "shuffle_window=n), Stream.jsonl(paths, shuffle_window=n)); shards are "
               "reordered each epoch by the StreamLoader's seed=",
}

T = TypeVar("T", bound=type)


def loader_names(kind: Kind) -> Callable[[T], T]:
    """Marks a class (a ``kind`` of ``"source"``, ``"stream"`` or ``"transform"``) whose
    constructor answers a loader's argument names with an ``ArgumentError`` saying what to
    pass to the loader; its signature is unchanged.

    Example:
        >>> @loader_names("source")
        ... class Source:
        ...     def __init__(self, data): self.data = data
        >>> Source([1], batch_size=8)
        Traceback (most recent call last):
        ...
        jaxloader.base.errors.ArgumentError: Source(batch_size=8): Source has no batch_size: \
it is the loader's: DataLoader(source, batch_size=8)
    """
    remedies = _STREAM_REMEDIES if kind == "stream" else _REMEDIES

    def mark(cls: T) -> T:
        init: Callable[..., None] = getattr(cls, "__init__")
        taken = inspect.signature(init).parameters
        if any(p.kind is p.VAR_KEYWORD for p in taken.values()):
            raise TypeError(f"{cls.__name__} takes **kwargs: every name is its own")

        @functools.wraps(init)
        def checked(self: Any, *args: Any, **kwargs: Any) -> None:
            for name, value in kwargs.items():
                if name not in taken and name in remedies:
                    arg = _ARGS.get(name, f"{name}={{value!r}}").format(value=value)
                    call = _CALLS[kind].format(arg=arg)
                    owner = type(self).__name__
                    raise ArgumentError(f"{owner}({name}={value!r}): {owner} has no {name}: "
                                        + remedies[name].format(call=call))
            init(self, *args, **kwargs)

        cls.__init__ = checked  # type: ignore[misc]
        return cls
    return mark
