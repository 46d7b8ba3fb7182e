"""What a stream is to its loader: a ``ReadableStream`` gives each reader a ``RecordReader``.

A ``Stream`` (shards), a ``MixedStream`` (streams mixed by weight) and a ``PackedStream`` (a
stream packed into rows) are each a ``ReadableStream``. ``StreamBatchMaker`` asks one for
reader ``r`` of ``R`` and reads ``batch_size`` records at a time from it, whichever it is; a
new kind of stream is one more class with these methods (``docs/architecture.md``).

Example:
    >>> from jaxloader.streams.reader import Stream
    >>> stream = Stream.from_generator(lambda i: ({"x": j} for j in range(3)), shards=1)
    >>> reader = stream.reader(reader=0, readers=1, seed=0, batch_size=2)
    >>> isinstance(stream, ReadableStream), isinstance(reader, RecordReader)
    (True, True)
    >>> reader.reset(None); [reader.next()["x"] for _ in range(3)]
    [0, 1, 2]
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, Union, runtime_checkable


@runtime_checkable
class RecordReader(Protocol):
    """One reader's records of a stream, in order, from a state it can say and resume."""

    reader: int  # which of the stream's readers it is

    def initial_state(self) -> dict:
        """The state at the stream's start."""
        ...

    def reset(self, state: dict | None) -> None:
        """Continues from ``state`` (``None``: the start)."""
        ...

    def get_state(self) -> dict:
        """Where it is: JSON, what ``reset`` takes."""
        ...

    def changes_due(self, step: int) -> bool:
        """Whether ``begin_step(step)`` changes what it reads next (a mixture's weights)."""
        ...

    def begin_step(self, step: int) -> None:
        """The loader's step whose records come next (a mixture's weights change at steps)."""
        ...

    def next(self) -> Any:
        """The next record; ``StopIteration`` at the end of a pass."""
        ...

    def has_next(self) -> bool:
        """Whether ``next`` has a record left in the pass."""
        ...

    def last_records(self) -> list:
        """The pass's last records (what pads its last batch)."""
        ...

    def close(self) -> None:
        """Closes the shards it has open."""
        ...


@runtime_checkable
class ReadableStream(Protocol):
    """A stream a ``StreamLoader`` reads: its readers, shards and what its state holds."""

    @property
    def shards(self) -> list:
        """Every shard it reads (what a process closes)."""
        ...

    def reader(self, *, reader: int, readers: int, seed: int, batch_size: int) -> RecordReader:
        """Reader ``reader`` of ``readers``, keyed by ``seed``, for batches of ``batch_size``."""
        ...

    def describe(self) -> dict[str, Any]:
        """What a state is checked against."""
        ...

    def extra_state(self) -> dict[str, Any]:
        """What a state holds beyond the readers' places (a mixture: its weights)."""
        ...

    def check_extra_state(self, state: dict, step: int) -> None:
        """Refuses a state whose ``extra_state`` does not fit this stream at ``step``."""
        ...


StreamLike = Union[ReadableStream, Iterable[Any]]
"""What ``StreamLoader``, ``jl.mix`` of streams and ``PackedStream`` take: a ``ReadableStream``,
a Hugging Face ``datasets.IterableDataset`` (read as ``Stream.huggingface(ds)``), or a list of
shards (``StreamLoader`` only: read as ``Stream(shards)``); any other iterable is refused,
naming ``Stream.from_generator``."""
