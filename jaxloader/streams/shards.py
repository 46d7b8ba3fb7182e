"""Shards of a stream: records read in order, opened from a JSON-able state, reporting it.

A shard follows a protocol as small as torchdata.nodes' ``BaseNode``: ``reset(state)`` opens it
at the start (``None``) or where ``get_state()`` said it was, ``next()`` returns the next record
(``StopIteration`` at the end), ``get_state()`` says where the next record is, as a plain dict
that survives JSON. A shard is picklable before it is reset (it travels to a worker), and
``name`` says which one it is in messages.

Ready shards: ``JsonlShard`` (a JSON value a line), ``TextShard`` (a line, as ``str``) and
``jaxloader.streams.tar.TarShard`` (WebDataset layout: files grouped by key), each resuming by
seeking to a byte offset (O(1); a compressed file, ``jaxloader.streams.compressed``, is read
up to it); ``IterableShard`` over a function that makes an iterable (a generator function,
a simulator), resuming by skipping the records already read (O(n)). A file shard's state also
names the file as it was opened (its size, hashes of its first and last KiB): a restore over
a file that changed since is refused, naming it (``FileShard``).

Example:
    >>> shard = IterableShard(lambda: iter(range(5)), name="numbers")
    >>> shard.reset(None); [shard.next(), shard.next()], shard.get_state()
    ([0, 1], {'consumed': 2})
    >>> shard.reset({"consumed": 4}); shard.next()
    4
"""

from __future__ import annotations

import copy
import json
import os
import zlib
from typing import Any, Callable, Iterable, Iterator, Protocol, runtime_checkable

from jaxloader.base import file_identity
from jaxloader.base.abilities import close_of
from jaxloader.base.checks import check_int, refused_call
from jaxloader.base.errors import ConfigError, RecordError, StateDictError
from jaxloader.sources.code_digest import code_digest
from jaxloader.streams.compressed import compression, decompressed
from jaxloader.streams.json_values import numbers_as_arrays

# a compressed file's first bytes, left out of its identity's tail: gzip's header holds the
# time it compressed (bytes 4 to 8), and a small file's last KiB would reach into it
_HEADER_BYTES = 16


@runtime_checkable
class Shard(Protocol):
    """One shard of a stream (see the module docstring)."""

    name: str

    def reset(self, state: dict | None = None) -> None: ...

    def next(self) -> Any: ...

    def get_state(self) -> dict: ...


class FileShard:
    """A shard read from a file (``path``: local, or remote such as ``gs://``), resumed by
    seeking to a byte offset. Its state holds the offset, a count (``_COUNTER``: lines,
    records) and the file's identity when it was opened: its size and CRC-32s of its first
    and last KiB (``jaxloader.base.file_identity``). A restore over a file whose identity changed
    is refused, naming the file and what changed: the offset would land inside other
    records. Content, not a modification time: a shard copied elsewhere resumes; an edit
    inside that keeps the size and both ends is not seen. ``append_only=True`` accepts a
    file that only grew (no shorter, its first KiB as it was), for shards that records are
    appended to.
    """

    _COUNTER = "line"

    def __init__(self, path: str | os.PathLike, *, append_only: bool = False) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        self.append_only = append_only
        self._file: Any = None
        self._count = 0
        self._identity: dict[str, int] = {}
        self._size_known: int | None = None  # the bytes the reader reads, if known unread

    def reset(self, state: dict | None = None) -> None:
        offset, count = state_ints(self, state, ("offset", self._COUNTER))
        self.close()
        self._file, self._identity, plain = open_file(self)
        self._size_known = self._identity.get("size") if plain else None
        if state is not None:
            check_unchanged(self, state)
        seek(self, offset)
        self._count = count
        self._opened()

    def _opened(self) -> None:
        """Called once the file is open at the state's place."""

    def get_state(self) -> dict:
        if self._file is None:
            return {"offset": 0, self._COUNTER: self._count}
        return {"offset": self._offset(), self._COUNTER: self._count, **self._identity}

    def _offset(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __getstate__(self) -> dict:  # an open file stays with its process
        return {**self.__dict__, "_file": None, "_count": 0, "_identity": {},
                "_size_known": None}


_BLANK = object()  # a line that is no record


class _LineShard(FileShard):
    """Lines of a file; state: the byte offset of the next line and its number."""

    def next(self) -> Any:
        if self._file is None:
            self.reset(None)
        while True:  # (blank lines a JSONL file skips: a loop, not a call each)
            try:
                raw = self._file.readline()
            except Exception as e:  # (gzip's EOFError, lzma's LZMAError: no common base)
                raise unreadable(self, f"line {self._count + 1}", e) from e
            if not raw:
                raise StopIteration
            self._count += 1
            record = self._parse(raw.rstrip(b"\r\n"))
            if record is not _BLANK:
                return record

    def _parse(self, raw: bytes) -> Any:
        """The record of a line (without its line break), or ``_BLANK`` to skip it."""
        raise NotImplementedError


class JsonlShard(_LineShard):
    """A JSON value a line (``.jsonl``); blank lines are skipped. A list of numbers (or of
    such lists, of one length) becomes one NumPy array: a Python list is a pytree node, so
    ``"tokens": [5, 8, 13]`` would batch as 3 arrays of one number a record.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "a.jsonl")
        >>> _ = open(path, "w").write('{"x": 1, "t": [5, 8]}\\n{"x": 2, "t": [1, 2]}\\n')
        >>> shard = JsonlShard(path); shard.reset(); shard.next()
        {'x': 1, 't': array([5, 8])}
    """

    def _parse(self, raw: bytes) -> Any:
        if not raw.strip():
            return _BLANK
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise RecordError(f"{self.path}: line {self._count}: not JSON ({e}): "
                              f"{raw[:80]!r}") from None
        return numbers_as_arrays(value)


class TextShard(_LineShard):
    """A line of text a record (``str``, without its line break)."""

    def _parse(self, raw: bytes) -> Any:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RecordError(f"{self.path}: line {self._count}: not UTF-8 ({e}): {raw[:80]!r}; "
                              "convert the file (iconv -f <its encoding> -t utf-8)") from None


class Bound:
    """``make(i)`` as a function of nothing (picklable where ``make`` is)."""

    def __init__(self, make: Callable[[int], Iterable], index: int) -> None:
        self.make, self.index = make, index

    def __call__(self) -> Iterable:
        return self.make(self.index)


def generator_shards(make: Callable[[int], Iterable], shards: int) -> list["IterableShard"]:
    """``Stream.from_generator``'s shards: shard ``i`` reads ``make(i)``, ``make`` checked
    first (a generator object cannot start again; a function of no shard number, as tf.data's
    ``from_generator`` takes, would fail at the first read)."""
    if not callable(make):
        what = getattr(make, "__name__", None)
        raise ConfigError(
            f"Stream.from_generator(make): got a {type(make).__name__} object, which cannot "
            "start again (for each shard, each worker, a restore, the next epoch); pass the "
            "generator function itself, called as make(shard): "
            f"Stream.from_generator({what or 'make'}, shards={shards})")
    shards = check_int("Stream.from_generator(shards)", shards, low=1,
                       remedy="one shard per independent part of the generator")
    name = getattr(make, "__qualname__", "generator")
    signature = refused_call(make, 0)
    if signature is not None:
        raise ConfigError(
            f"Stream.from_generator(make): make is called as make(shard), but {name}"
            f"{signature} does not take the shard number; pass a function of it, such as "
            f"lambda shard: {name}() for one shard (tf.data's from_generator calls it "
            "without one)")
    return [IterableShard(Bound(make, i), name=f"{name}[{i}]") for i in range(shards)]


class IterableShard:
    """Records of ``make()`` (a function returning an iterable: a generator function, a
    simulator's reset); a list or other re-iterable object is accepted as it is. Resumes by
    skipping the records already read: O(n) in them.

    A generator object itself cannot start again, so it is refused: pass the function that
    makes it (``IterableShard(lambda: my_generator(...))``).
    """

    def __init__(self, make: Callable[[], Iterable] | Iterable, name: str | None = None) -> None:
        if callable(make):
            self._make = make
        elif isinstance(make, Iterable) and iter(make) is not make:  # re-iterable (a list)
            self._make = lambda: make
        else:
            raise ConfigError(
                f"IterableShard: got a {type(make).__name__}, an iterator that cannot start "
                "again (for workers, for a restore, for the next epoch); pass the function that "
                "makes it, e.g. IterableShard(lambda: my_generator(...))"
            )
        self.name: str = name or str(getattr(make, "__qualname__", type(make).__name__))
        self._it: Iterator | None = None
        self._consumed = 0

    def reset(self, state: dict | None = None) -> None:
        (skip,) = state_ints(self, state, ("consumed",))
        made = self._make()
        try:
            self._it = iter(made)
        except TypeError:
            raise ConfigError(
                f"IterableShard {self.name}: its function returned {type(made).__name__} "
                f"{made!r:.60}, expected an iterable of records; yield the records (a "
                "generator function) or return a list or an iterator (a missing `return`?)"
            ) from None
        self._consumed = 0
        for _ in range(skip):
            try:
                next(self._it)
            except StopIteration:
                raise StateDictError(
                    f"IterableShard {self.name}: the state says {skip} records were read, but "
                    f"it ends after {self._consumed}; it must make the same records each time"
                ) from None
            self._consumed += 1

    def next(self) -> Any:
        if self._it is None:
            self.reset(None)
        assert self._it is not None
        record = next(self._it)
        self._consumed += 1
        return record

    def get_state(self) -> dict:
        return {"consumed": self._consumed}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_it": None, "_consumed": 0}


class MappedShard:
    """``shard``'s records through ``fn`` (``Stream.map``); its state is the shard's, its name
    the shard's and the function's code digest (``sources.code_digest``), so a
    stream state saved under another function is refused."""

    def __init__(self, shard: Any, fn: Callable[[Any], Any], name: str | None = None) -> None:
        self.shard, self.fn = shard, fn
        self.name = name or f"{shard.name} | map {code_digest(fn)[:16]}"

    def reset(self, state: dict | None = None) -> None:
        self.shard.reset(state)

    def next(self) -> Any:
        return self.fn(self.shard.next())

    def get_state(self) -> dict:
        return self.shard.get_state()

    def close(self) -> None:
        close_of(self.shard)

    def __copy__(self) -> "MappedShard":
        """A reader's own copy: of the shard under it too (each reader reads its own)."""
        return MappedShard(copy.copy(self.shard), self.fn, self.name)


def open_file(shard: Any) -> tuple[Any, dict[str, int], bool]:
    """``shard.path`` opened for reading the bytes it holds (decompressed if it is gzip,
    bzip2, xz or Zstandard: ``jaxloader.streams.compressed``), with the file's identity as
    opened (``file_identity.ends``; of a compressed file, the head is its first KiB once
    decompressed: gzip writes the time it compressed into its first bytes, so the same records
    compressed again would otherwise look changed) and whether the reader is the file itself
    (local, not compressed); an error naming the shard if it cannot be opened."""
    try:
        raw = file_identity.open_binary(shard.path)  # (remote: gs://, s3://)
        try:
            plain = compression(raw) is None
            found = file_identity.ends(raw, skip=0 if plain else _HEADER_BYTES)
        except BaseException:
            raw.close()
            raise
        reader = decompressed(raw, shard.path)
        if reader is not raw:
            try:
                found["head"] = _head(reader, file_identity.ENDS_BYTES)
            except Exception as e:  # (cut short or corrupt: EOFError, LZMAError, zlib.error)
                try:
                    reader.close()
                finally:  # (a decompressor leaves its file open)
                    raw.close()
                raise e if isinstance(e, OSError) else unreadable(shard, "its first KiB", e)
        return reader, found, reader is raw and "://" not in shard.path
    except OSError as e:
        raise ConfigError(f"{type(shard).__name__}: cannot open {shard.path!r}: {e}; check the "
                          "path, or drop the shard from the stream") from None


def check_unchanged(shard: Any, state: dict) -> None:
    """Refuses to resume ``shard`` (just opened) from ``state`` if the file is not the one the
    state was saved over (``FileShard``), naming what changed. A state without an identity (a
    shard's first, never opened) resumes as it is."""
    then = {key: state[key] for key in ("size", "head", "tail") if key in state}
    for key, value in then.items():
        if type(value) is not int or value < 0:
            raise StateDictError(f"{type(shard).__name__} {shard.name}: state[{key!r}]: "
                                 f"expected a non-negative int, got {value!r}")
    now = shard._identity
    if not then or then == {key: now.get(key) for key in then}:
        return
    if shard.append_only and "size" in then and now["size"] >= then["size"]:
        # it only grew if it starts as it did (its old end may be rewritten: a tar's marker)
        if "head" not in then or _prefix_head(shard, then["size"]) == then["head"]:
            return
    changed = ([f"size {then['size']:,} bytes then, {now['size']:,} now"]
               if then.get("size", now["size"]) != now["size"] else ["the same size"])
    changed += [f"its {'first' if key == 'head' else 'last'} KiB differs"
                for key in ("head", "tail") if key in then and then[key] != now.get(key)]
    kind = "shorter or rewritten" if shard.append_only else "changed"
    raise StateDictError(
        f"stream shard {shard.path}: {kind} since the state was saved ({'; '.join(changed)}): "
        f"the state's offset {state.get('offset')} would resume inside other records; restore "
        "over the shards the state was saved with, or drop this shard from the stream"
        + ("" if shard.append_only else "; if records are only appended to it, read the "
           "shards with append_only=True (Stream.jsonl(paths, append_only=True))"))


def _prefix_head(shard: Any, size: int) -> int:
    """The head of ``shard``'s identity as it was when the file had ``size`` bytes, read from
    the file as it is now: its first KiB (a plain file's first ``size`` bytes, if fewer)."""
    if shard._size_known is None:  # (compressed: the first KiB of what it holds, as opened)
        return shard._identity["head"]
    with file_identity.open_binary(shard.path) as raw:
        return _head(raw, min(size, file_identity.ENDS_BYTES))


def _head(reader: Any, count: int) -> int:
    """The CRC-32 of ``reader``'s first ``count`` bytes; ``reader`` left at its start."""
    head = zlib.crc32(reader.read(count))
    reader.seek(0)
    return head


def seek(shard: Any, offset: int) -> None:
    """``shard._file`` to ``offset`` (a compressed file: read up to it, where it may turn out
    cut short)."""
    try:
        shard._file.seek(offset)
    except Exception as e:
        raise unreadable(shard, f"byte {offset} (a restore's place)", e) from e


def unreadable(shard: Any, where: str, error: Exception) -> RecordError:
    """The error for a shard whose bytes cannot be read at ``where`` (a compressed file cut
    short or corrupt, a failing disk)."""
    return RecordError(f"{shard.path}: {where}: cannot be read ({type(error).__name__}: "
                       f"{error}); is the file whole? replace it, or drop the shard from the "
                       "stream")


def state_ints(shard: Any, state: dict | None, keys: tuple[str, ...]) -> tuple[int, ...]:
    """The ints ``keys`` of a shard's ``state`` (zeros for ``None``), each checked."""
    if state is None:
        return tuple(0 for _ in keys)
    if not isinstance(state, dict) or any(
            not isinstance(state.get(k), int) or state[k] < 0 for k in keys):
        raise StateDictError(f"{type(shard).__name__} {shard.name}: expected a state with "
                             f"non-negative ints {list(keys)}, got {state!r}")
    return tuple(state[k] for k in keys)
