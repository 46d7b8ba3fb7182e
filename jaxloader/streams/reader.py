"""``Stream``: shards and how they are read (``stream_reader.StreamReader``: one reader's
records), and its makers for files (``jsonl``, ``text``, ``tar``), generators and Hugging Face
streams.

Example:
    >>> import jaxloader as jl
    >>> from jaxloader.streams.iterable_shards import IterableShard
    >>> jl.Stream([IterableShard(lambda: range(3), name="a"), IterableShard(lambda: [7], name="b")])
    Stream(2 shards: a, b)
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Never, Sequence

from jaxloader.base.abilities import OLDER
from jaxloader.base.checks import Int, check_bool, check_int, check_keywords
from jaxloader.base.errors import ConfigError
from jaxloader.base.loader_names import loader_names
from jaxloader.sources.paths import expand, path_names
from jaxloader.streams.compressed import or_compressed
from jaxloader.streams.huggingface import is_iterable_dataset, shards_of
from jaxloader.streams.iterable_shards import generator_shards, mapped_shards, warn_same_names
from jaxloader.streams.shards import JsonlShard, Shard, TextShard
from jaxloader.streams.stream_reader import StreamReader
from jaxloader.streams.tar import TarShard

_OPTIONS = ("shuffle_window", "shuffle_shards")  # what Stream's class methods hand Stream()


@loader_names("stream")
class Stream:
    """Shards read in sequence, each reader taking its share of them every epoch.

    Args:
        shards: objects following the ``Shard`` protocol (``jaxloader.streams.shards``).
        shuffle_window: records permuted together (0 or 1: the shards' own order); each
            reader holds one window in memory.
        shuffle_shards: reorder the shards every epoch (by the loader's seed).

    Example:
        >>> import jaxloader as jl
        >>> stream = jl.Stream.from_generator(lambda shard: range(shard * 10, shard * 10 + 3),
        ...                                   shards=4)
        >>> len(stream.shards), stream.shards[1].name
        (4, '<lambda>[1]')
    """

    def __init__(self, shards: Sequence[Shard], *, shuffle_window: Int = 0,
                 shuffle_shards: bool = True) -> None:
        shards = list(shards) if isinstance(shards, Iterable) else [shards]  # (one: a list)
        if not shards:
            raise ConfigError("Stream(shards): expected at least one shard, got none")
        for i, shard in enumerate(shards):
            if not isinstance(shard, Shard):
                raise ConfigError(
                    f"Stream(shards)[{i}]: expected a shard (reset(state), next(), "
                    f"get_state(), name), got {type(shard).__name__}; wrap an iterable in "
                    "IterableShard(lambda: ...), or use Stream.jsonl/text/tar/from_generator"
                )
        shuffle_window = check_int("Stream(shuffle_window)", shuffle_window, low=0,
                                   remedy="records permuted together; 0 keeps the shards' order")
        self.shards = shards
        warn_same_names(shards)  # (a state names shards by name: two '<lambda>'s, told)
        self.shuffle_window = max(1, shuffle_window)
        self.shuffle_shards = check_bool("Stream(shuffle_shards)", shuffle_shards)

    def __repr__(self) -> str:
        names = [getattr(s, "name", type(s).__name__) for s in self.shards[:3]]
        more = f", ... ({len(self.shards) - 3} more)" if len(self.shards) > 3 else ""
        window = f"; shuffle_window={self.shuffle_window}" if self.shuffle_window > 1 else ""
        return f"Stream({len(self.shards)} shards: {', '.join(map(str, names))}{more}{window})"

    @classmethod
    def jsonl(cls, paths: Any, *, append_only: bool = False, shuffle_window: Int = 0,
              shuffle_shards: bool = True, **unknown: Never) -> "Stream":
        """A stream of JSON lines files, one shard a file. ``paths``: a path, a list, a folder
        (its ``*.jsonl`` files, and ``*.jsonl.gz``, ``.bz2``, ``.xz``, ``.zst``) or a glob
        pattern (``jaxloader.sources.paths``). Compressed files are read as what they hold
        (``jaxloader.streams.compressed``; a resume reads one up to its place). A restore
        over a file that changed since the state was saved is refused; ``append_only=True``
        accepts files that only grew (``shards.FileShard``).

        Example:
            >>> import json, os, tempfile, jaxloader as jl
            >>> folder = tempfile.mkdtemp()
            >>> for part in range(2):
            ...     with open(os.path.join(folder, f"part-{part}.jsonl"), "w") as f:
            ...         _ = f.write("".join(json.dumps({"x": [part, i]}) + "\\n" for i in range(3)))
            >>> stream = jl.Stream.jsonl(folder, shuffle_window=4)
            >>> with jl.StreamLoader(stream, batch_size=3, num_epochs=1, process_index=0,
            ...                      process_count=1) as loader:
            ...     [batch["x"].shape for batch in loader]
            [(3, 2), (3, 2)]
        """
        shards = [JsonlShard(p, append_only=append_only)
                  for p in expand(paths, or_compressed(".jsonl"), "Stream.jsonl")]
        return cls(shards, shuffle_window=shuffle_window, shuffle_shards=shuffle_shards,
                   **check_keywords("Stream.jsonl", unknown, (*_OPTIONS, "append_only")))

    @classmethod
    def text(cls, paths: Any, *, append_only: bool = False, shuffle_window: Int = 0,
             shuffle_shards: bool = True, **unknown: Never) -> "Stream":
        """A stream of text files, a line a record (``paths`` and ``append_only`` as for
        ``jsonl``; ``*.txt``, compressed or not).

        Example:
            >>> import os, tempfile, jaxloader as jl
            >>> path = os.path.join(tempfile.mkdtemp(), "lines.txt")
            >>> with open(path, "w") as f:
            ...     _ = f.write("first line\\nsecond\\n")
            >>> with jl.StreamLoader(jl.Stream.text(path), batch_size=2, num_epochs=1,
            ...                      transforms=[jl.Map(lambda line: {"line": line})],
            ...                      process_index=0, process_count=1) as loader:
            ...     next(iter(loader))["line"].tolist()
            ['first line', 'second']
        """
        shards = [TextShard(p, append_only=append_only)
                  for p in expand(paths, or_compressed(".txt"), "Stream.text")]
        return cls(shards, shuffle_window=shuffle_window, shuffle_shards=shuffle_shards,
                   **check_keywords("Stream.text", unknown, (*_OPTIONS, "append_only")))

    @classmethod
    def tar(cls, paths: Any, *, tolerate_missing_end: bool = False, append_only: bool = False,
            shuffle_window: Int = 0, shuffle_shards: bool = True, **unknown: Never) -> "Stream":
        """A stream of tar shards in the WebDataset layout (``paths`` and ``append_only`` as
        for ``jsonl``; ``*.tar``, compressed or not: ``*.tar.gz``, ``*.tgz``). Every host is
        given the same list (``process_index`` deals it out). A damaged or cut shard is an
        error naming it and the member (``jaxloader.streams.tar``); ``tolerate_missing_end=True``
        accepts shards written without the end-of-archive marker.

        Example:
            >>> import io, os, tarfile, tempfile, jaxloader as jl
            >>> path = os.path.join(tempfile.mkdtemp(), "shard-0.tar")
            >>> with tarfile.open(path, "w") as tar:
            ...     for name, data in (("a.jpg", b"\\xff\\xd8"), ("a.cls", b"7"),
            ...                        ("b.jpg", b"\\xff\\xd9"), ("b.cls", b"3")):
            ...         info = tarfile.TarInfo(name); info.size = len(data)
            ...         tar.addfile(info, io.BytesIO(data))
            >>> with jl.StreamLoader(jl.Stream.tar(path), batch_size=2, num_epochs=1,
            ...                      process_index=0, process_count=1) as loader:
            ...     batch = next(iter(loader))
            >>> batch["__key__"].tolist(), batch["cls"].tolist(), batch["jpg"][0]
            (['a', 'b'], [b'7', b'3'], b'\\xff\\xd8')
        """
        shards = [TarShard(p, tolerate_missing_end=tolerate_missing_end, append_only=append_only)
                  for p in expand(paths, (*or_compressed(".tar"), ".tgz"), "Stream.tar")]
        return cls(shards, shuffle_window=shuffle_window, shuffle_shards=shuffle_shards,
                   **check_keywords("Stream.tar", unknown, (*_OPTIONS, "append_only",
                                                            "tolerate_missing_end")))

    @classmethod
    def from_generator(cls, make: Callable[[int], Iterable[Any]], shards: Int, *,
                       shuffle_window: Int = 0, shuffle_shards: bool = True,
                       **unknown: Never) -> "Stream":
        """``shards`` shards, shard ``i`` reading ``make(i)`` (a generator function of the
        shard number; a generator object, which cannot start again, is refused); resumed by
        skipping the records already read. Each record must be new: a buffer refilled and
        yielded again is warned of (``streams.refill_watch``).

        Example:
            >>> import jaxloader as jl
            >>> def numbers(shard):
            ...     yield from range(shard * 100, shard * 100 + 3)
            >>> jl.Stream.from_generator(numbers, shards=2)
            Stream(2 shards: numbers[0], numbers[1])
        """
        return cls(generator_shards(make, shards), shuffle_window=shuffle_window,
                   shuffle_shards=shuffle_shards,
                   **check_keywords("Stream.from_generator", unknown, _OPTIONS))

    @classmethod
    def huggingface(cls, dataset: Any, *, shuffle_window: Int = 0, shuffle_shards: bool = True,
                    **unknown: Never) -> "Stream":
        """A Hugging Face ``datasets.IterableDataset`` (``load_dataset(..., streaming=True)``),
        a shard of it a shard, restored by the dataset's own state, list features of numbers
        as arrays (``jaxloader.streams.huggingface``). ``StreamLoader(dataset)`` reads one
        this way, with no shuffle window.

        Example (``tests/streams/test_huggingface.py`` runs it)::

            ds = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
            loader = jl.StreamLoader(jl.Stream.huggingface(ds, shuffle_window=10_000),
                                     batch_size=256, num_workers=2)
        """
        return cls(shards_of(dataset), shuffle_window=shuffle_window,
                   shuffle_shards=shuffle_shards,
                   **check_keywords("Stream.huggingface", unknown, _OPTIONS))

    def map(self, fn: Callable[[Any], Any]) -> "Stream":
        """This stream with each record passed through ``fn`` in its readers, before the
        loader's transforms: a component renamed, cast or parsed before ``jl.mix`` or
        ``jl.PackedStream`` (``sources.mapped.MapSource`` does it for a source). The shards'
        names carry the function's code, so a state saved under another function is refused.

        Example:
            >>> import jaxloader as jl
            >>> stream = jl.Stream.from_generator(lambda i: ({"x": i} for _ in range(2)),
            ...                                   shards=1)
            >>> with jl.StreamLoader(stream.map(lambda r: {"y": r["x"] + 1}), batch_size=2,
            ...                      process_index=0, process_count=1) as loader:
            ...     next(iter(loader))["y"].tolist()
            [1, 1]
        """
        return Stream(mapped_shards(self.shards, fn),
                      shuffle_window=self.shuffle_window, shuffle_shards=self.shuffle_shards)

    def reader(self, *, reader: int, readers: int, seed: int = 0,
               batch_size: int = 1) -> "StreamReader":
        """Reader ``reader`` of ``readers`` (``streams.contract``; no use of ``batch_size``)."""
        return StreamReader(self, reader=reader, readers=readers, seed=seed)

    def describe(self) -> dict[str, Any]:
        """What a state is checked against: the shards' names, the window, the shuffle. Files
        are named relative to the folder they share, as a file source's fingerprint names
        them (the same files staged at another path restore); whole, as states saved before
        2026-11-29 hold them, under ``base.abilities.OLDER``."""
        names = [s.name for s in self.shards]
        paths = [p for s in self.shards if isinstance(p := getattr(
            getattr(s, "shard", s), "path", None), str)]  # (a Stream.map's: its shard's)
        if paths and not OLDER.get():
            folder = paths[0][:len(paths[0]) - len(path_names(paths)[0])]
            names = [n[len(folder):] if folder and n.startswith(folder) else n for n in names]
        return {"shards": names, "shuffle_window": self.shuffle_window,
                "shuffle_shards": self.shuffle_shards}

    def extra_state(self) -> dict[str, Any]:
        """What a state holds beyond the readers' places: nothing (a mixture: its weights)."""
        return {}

    def check_extra_state(self, state: dict, step: int) -> None:
        """Nothing to check beyond ``describe`` (a mixture checks its earlier weights)."""


def as_stream(value: Any) -> Any:
    """``Stream.huggingface(value)`` for a ``datasets.IterableDataset``, ``value`` otherwise:
    what ``StreamLoader``, ``jl.mix`` and ``PackedStream`` take in place of a stream."""
    return Stream.huggingface(value) if is_iterable_dataset(value) else value
