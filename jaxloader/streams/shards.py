"""Shards of a stream: records read in order, opened from a JSON-able state, reporting it.

A shard follows a protocol as small as torchdata.nodes' ``BaseNode``: ``reset(state)`` opens it
at the start (``None``) or where ``get_state()`` said it was, ``next()`` returns the next record
(``StopIteration`` at the end), ``get_state()`` says where the next record is, as a plain dict
that survives JSON. A shard is picklable before it is reset (it travels to a worker), and
``name`` says which one it is in messages.

Ready shards: ``JsonlShard`` (a JSON value a line), ``TextShard`` (a line, as ``str``) and
``streams.tar.TarShard`` (WebDataset layout: files grouped by key), each resuming by seeking to
a byte offset (O(1); a compressed file, ``streams.compressed``, is read up to it);
``streams.iterable_shards.IterableShard`` over a function that makes an iterable (a generator
function, a simulator), resuming by skipping the records read (O(n)). A file shard's state
names the file as opened (its size, hashes of its first and last KiB): a restore over a file
changed since is refused, naming it (``FileShard``; ``TextShard`` shows one read, resumed).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any, Protocol, runtime_checkable

from jaxloader.base.checks import check_bool
from jaxloader.base.errors import (ConfigError, JaxloaderWarning, RecordError, StateDictError,
                                   closed_on_failure, user_stacklevel)
from jaxloader.base.loader_names import loader_names
from jaxloader.streams.json_values import numbers_as_arrays
from jaxloader.streams.shard_files import check_unchanged, open_file, starts_as, unreadable

@runtime_checkable
class Shard(Protocol):
    """One shard of a stream, the protocol a shard of your own follows: ``reset(state)``
    starts at the beginning (``None``) or where ``get_state()`` said it was; ``next()``
    returns the next record (``StopIteration`` at the end); ``get_state()`` says where the
    next record is, as plain JSON (dicts with string keys, lists, str, int, float, bool,
    None; NumPy scalars are made Python's; the reader keeps a copy as it reads, so a dict
    the shard goes on changing is fine); ``name`` names it in messages. A loader copies a
    shard (``copy.copy``) for each reader: open files and connections in ``reset``.

    Example:
        >>> class Countdown:
        ...     def __init__(self, n): self.n, self.name = n, f"countdown-{n}"
        ...     def reset(self, state=None): self.left = self.n if state is None else state["left"]
        ...     def next(self):
        ...         if self.left == 0:
        ...             raise StopIteration
        ...         self.left -= 1
        ...         return {"value": self.left + 1}
        ...     def get_state(self): return {"left": self.left}
        >>> import jaxloader as jl
        >>> isinstance(Countdown(3), jl.Shard)
        True
    """

    @property
    def name(self) -> str: ...  # (an attribute, or a property: read only)

    def reset(self, state: dict | None) -> None: ...  # (the loader always passes one)

    def next(self) -> Any: ...

    def get_state(self) -> dict: ...


@loader_names("stream")
class FileShard:
    """A shard read from a file (``path``: local, or remote such as ``gs://``), resumed by
    seeking to a byte offset. Its state holds the offset, a count (``_COUNTER``: lines,
    records) and the file's identity when it was opened: its size and CRC-32s of its first
    and last KiB (``jaxloader.base.file_identity``). A restore over a file whose identity changed
    is refused, naming the file and what changed: the offset would land inside other
    records. Content, not a modification time: a shard copied elsewhere resumes; an edit
    inside that keeps the size and both ends is not seen. ``append_only=True`` accepts a
    file that only grew (no shorter, its first KiB as it was), for shards that records are
    appended to. While a local plain file is read, its modification time is looked at every
    ``_LOOK_EVERY`` records and at its end (``_check_unmoved``): a file rewritten in place as
    it is read (``open(path, "w")`` by a writer job) gave the rest of its records from the new
    file, from inside one of its lines, without a word.
    """

    _COUNTER = "line"
    _PADDED = False  # whether the file ends in zeros every such file has (``shard_files``)
    _LOOK_EVERY = 256  # records between two looks at the file's modification time

    def __init__(self, path: str | os.PathLike, *, append_only: bool = False) -> None:
        if not isinstance(path, (str, os.PathLike)):  # (None, a number: os.fspath's TypeError)
            raise ConfigError(f"{type(self).__name__}(path): expected a file's path (a str or "
                              f"pathlib.Path), got {type(path).__name__} {path!r:.80}; a list "
                              "of files is Stream.jsonl/text/tar(paths)'s")
        self.path = os.fspath(path)
        self.name = self.path
        self.append_only = check_bool(f"{type(self).__name__}(append_only)", append_only)
        if os.path.isdir(self.path):  # (as a missing file is said: a reader reached it later)
            raise ConfigError(f"{type(self).__name__}: {self.path!r} is a folder, not a file; "
                              "pass its files: Stream.jsonl/text/tar(folder) reads each")
        if not self.append_only and "://" not in self.path and not os.path.exists(self.path):
            warnings.warn(  # (as the stream is made: a reader reached it hours in)
                f"{type(self).__name__}: {self.path!r} does not exist here (or links to nothing):"
                " check the path, as a reader reaching it raises (where it is on the machines "
                "that read it alone, Ray actors', leave this be)", JaxloaderWarning,
                stacklevel=user_stacklevel())
        self._file: Any = None
        self._count = 0
        self._identity: dict[str, int] = {}
        self._size_known: int | None = None  # the bytes the reader reads, if known unread
        self._mtime: int | None = None  # the local plain file's st_mtime_ns as last looked at
        self._said_held = False  # a last line without its line break was said (_held_back)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"

    def reset(self, state: dict | None = None) -> None:
        offset, count = state_ints(self, state, ("offset", self._COUNTER))
        self.close()
        self._file, self._identity, plain = open_file(self)
        self._size_known = self._identity.get("size") if plain else None
        self._mtime = os.fstat(self._file.fileno()).st_mtime_ns if plain else None
        # (a shard refused is left closed: its file was left open)
        with closed_on_failure(self.close, f"{self.path!r}"):
            if state is not None:
                check_unchanged(self, state)
                self._check_place(offset)
            seek(self, offset)
            if state is not None and self._size_known is None and self._file.tell() < offset:
                raise self._not_a_place(offset, f"past its end ({self._file.tell():,} bytes "
                                                "read to it, decompressed)")
            self._count = count
            self._opened()  # (a tar's first header read: one that fails leaves it closed too)

    def _opened(self) -> None:
        """Called once the file is open at the state's place."""

    def _check_place(self, offset: int) -> None:
        """Refuses a state's ``offset`` that no read of this file stops at: past its end (an
        edited state's, which skipped its records without a word)."""
        if self._size_known is not None and offset > self._size_known:
            raise self._not_a_place(offset, f"past its end ({self._size_known} bytes)")

    def _not_a_place(self, offset: int, why: str) -> StateDictError:
        return StateDictError(
            f"{type(self).__name__} {self.name}: the state's offset {offset} is {why}, where no "
            "read of it stops: the state was edited, or is another file's; pass the dict that "
            "state_dict() returned, unchanged")

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

    def _moved(self) -> os.stat_result | None:
        """The open file's stat where it was modified since it was opened (or the last look),
        else ``None`` (also where it cannot say)."""
        if self._mtime is None or self._file is None or self._file.closed:
            return None
        try:
            now = os.fstat(self._file.fileno())
        except OSError:  # (not to hide the error being reported: it says what it can)
            return None
        return None if now.st_mtime_ns == self._mtime else now

    def _check_unmoved(self, where: str) -> None:
        """Raises if the file was modified since it was opened (or, ``append_only``, since
        the last look) other than by records appended to it."""
        if (now := self._moved()) is None:
            return
        if self.append_only and now.st_size >= self._file.tell() and starts_as(
                self, self._identity["size"], self._identity["head"], self._file.fileno()):
            self._mtime = now.st_mtime_ns  # (records appended: read on)
            return
        raise RecordError(
            f"{self.path}: the file was modified while read ({where}; {self._identity['size']:,}"
            f" bytes when opened, {now.st_size:,} now"
            + (", shorter than read or its first KiB not as it was" if self.append_only
               else "")
            + "): the records from then on may be another file's, from inside one of them; "
            "write a shard to a new file and rename it into place (a reader keeps the file it "
            "opened)" + ("" if self.append_only else ", or, if records are only appended to "
                         "it, read the shards with append_only=True"))

    def __getstate__(self) -> dict:  # an open file stays with its process
        return {**self.__dict__, "_file": None, "_count": 0, "_identity": {},
                "_size_known": None, "_mtime": None}


_BLANK = object()  # a line that is no record
_SAID_HELD: set[str] = set()  # the files whose last line was said to be being written


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
            held = bool(raw) and self.append_only and not raw.endswith(b"\n") and (
                self._mtime is not None)  # (a local plain file: seeks back)
            if held:  # (being written: read in a later pass, whole)
                self._file.seek(self._file.tell() - len(raw))
                self._held_back(len(raw))
            if not raw or held:
                self._check_unmoved(f"at its end, after line {self._count}")
                if not held:
                    self._check_whole()
                raise StopIteration
            self._count += 1
            if not self._count % self._LOOK_EVERY:
                self._check_unmoved(f"by line {self._count}")
            try:
                record = self._parse(self._first(raw) if self._count == 1 else
                                     raw.rstrip(b"\r\n"))
            except RecordError:  # (a line of a file rewritten as read: said as that)
                self._check_unmoved(f"by line {self._count}")
                raise
            if record is not _BLANK:
                return record

    def _parse(self, raw: bytes) -> Any:
        """The record of a line (without its line break), or ``_BLANK`` to skip it."""
        raise NotImplementedError

    def _check_place(self, offset: int) -> None:
        """(and inside a line: a cut line was read as a record; the end of a last line
        without its line break is a place)"""
        super()._check_place(offset)
        if offset:
            try:  # (a byte at a time: a compressed file is not read back from its start)
                self._file.seek(offset - 1)
                inside = self._file.read(1) != b"\n" and self._file.read(1) != b""
            except Exception:  # noqa: BLE001 - (cut short there: said at the offset's seek)
                return
            if inside:
                raise self._not_a_place(offset, "inside a line")

    def _held_back(self, size: int) -> None:
        """Said once a file in this process: an ``append_only`` file's last line has no line
        break, so it is taken as being written (read half, it was two records) and left for a
        later pass (a live log is caught mid-line most epochs: said each, the words changing
        with the line, it was said nine times in ten)."""
        if not self._said_held and self.path not in _SAID_HELD:
            self._said_held = True
            _SAID_HELD.add(self.path)
            warnings.warn(
                f"{self.path}: its last line ({size:,} bytes after line {self._count}) has no "
                "line break: with append_only=True it is taken as a record being written and "
                "read once its line break is; a writer ends every record with one (a file "
                "that is whole: append it, or read it without append_only)", JaxloaderWarning,
                stacklevel=user_stacklevel())

    def _check_whole(self) -> None:
        """At the end: a plain file that ends before the bytes it held when opened was cut
        as it was read (its last records lost, the pass ended early with no error)."""
        if self._size_known is not None and (at := self._file.tell()) < self._size_known:
            raise RecordError(
                f"{self.path}: the file ends at byte {at:,} (after line {self._count}), but "
                f"it held {self._size_known:,} bytes when opened: it was cut while read; "
                "restore the file (and resume from a state saved before), or write shards "
                "to a new file and rename it into place")

    def _first(self, raw: bytes) -> bytes:
        """The file's first line without a UTF-8 byte order mark (a Windows tool's: it stayed
        in a text record, '\\ufeffhello'); a UTF-16 or UTF-32 one refused."""
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise RecordError(f"{self.path}: line 1: UTF-16 (or UTF-32) text, by its byte order "
                              f"mark, where lines of UTF-8 are read; convert the file (iconv -f "
                              "utf-16 -t utf-8)")
        return raw.removeprefix(b"\xef\xbb\xbf").rstrip(b"\r\n")


class JsonlShard(_LineShard):
    """A JSON value a line (``.jsonl``); blank lines are skipped. A list of numbers (or of
    such lists, of one length) becomes one NumPy array: a Python list is a pytree node, so
    ``"tokens": [5, 8, 13]`` would batch as 3 arrays of one number a record.
    ``append_only=True`` accepts a file that grew since a state was saved (``FileShard``).

    Example:
        >>> import tempfile, os, jaxloader as jl
        >>> path = os.path.join(tempfile.mkdtemp(), "a.jsonl")
        >>> with open(path, "w") as f:
        ...     _ = f.write('{"x": 1, "t": [5, 8]}\\n{"x": 2, "t": [1, 2]}\\n')
        >>> shard = jl.JsonlShard(path); shard.reset(); shard.next()
        {'x': 1, 't': array([5, 8])}
        >>> shard.close()
    """

    def _parse(self, raw: bytes) -> Any:
        if not raw.strip():
            return _BLANK
        if b"\x00" in raw:  # (JSON of UTF-8 holds none; json.loads took one for UTF-16)
            raise RecordError(f"{self.path}: line {self._count}: holds NUL bytes, which JSON "
                              f"lines of UTF-8 do not (a UTF-16 or UTF-32 file?): {raw[:80]!r}; "
                              "convert the file (iconv -f utf-16 -t utf-8)")
        try:  # (json's parser and numbers_as_arrays recurse: a line nested past the limit)
            try:
                value = json.loads(raw)
            except ValueError as e:
                whole = raw.strip() in (b"[", b"{")  # (a .json file, pretty-printed)
                raise RecordError(f"{self.path}: line {self._count}: not JSON ({e}): "
                                  f"{raw[:80]!r}" + ("; JSON lines hold a whole value a line: "
                                  "this looks like one JSON value over many lines (a .json "
                                  "file); write it a record a line (jq -c '.[]' in.json > "
                                  "out.jsonl)" if whole else "; JSON is UTF-8: convert the "
                                  "file (iconv -f <its encoding, latin1?> -t utf-8)" if
                                  isinstance(e, UnicodeDecodeError) else "")) from None
            try:
                return numbers_as_arrays(value)
            except ValueError as e:  # (booleans among a list's numbers)
                raise RecordError(f"{self.path}: line {self._count}: {e}") from None
        except RecursionError:
            raise RecordError(f"{self.path}: line {self._count}: nested deeper than Python "
                              f"reads (a limit of {sys.getrecursionlimit()} calls); flatten "
                              f"it, or leave the line out: {raw[:80]!r}") from None


class TextShard(_LineShard):
    """A line of text a record (``str``, without its line break). ``append_only=True``
    accepts a file that grew since a state was saved (``FileShard``).

    Example:
        >>> import os, tempfile, jaxloader as jl
        >>> path = os.path.join(tempfile.mkdtemp(), "lines.txt")
        >>> with open(path, "w") as f:
        ...     _ = f.write("first\\nsecond\\n")
        >>> shard = jl.TextShard(path)
        >>> shard.reset(None)
        >>> shard.next()
        'first'
        >>> again = jl.TextShard(path)
        >>> again.reset(shard.get_state())  # resumes: a seek to the next line
        >>> again.next()
        'second'
        >>> shard.close(); again.close()
    """

    def _parse(self, raw: bytes) -> Any:
        if b"\x00" in raw and len(raw) >= 4 and 2 * max(  # (every other byte NUL: ASCII in
                raw[::2].count(0), raw[1::2].count(0)) >= len(raw) - 1:  # UTF-16 or UTF-32)
            raise RecordError(
                f"{self.path}: line {self._count}: {raw.count(0)} of its {len(raw)} bytes are "
                f"NUL, as in UTF-16 or UTF-32 text without a byte order mark, expected UTF-8: "
                f"{raw[:80]!r}; convert the file (iconv -f utf-16le -t utf-8)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RecordError(f"{self.path}: line {self._count}: not UTF-8 ({e}): {raw[:80]!r}; "
                              "convert the file (iconv -f <its encoding> -t utf-8)") from None
        if self._count == 1 and "\r" in text and (  # (lines ended by \r alone: one record)
                folder := os.path.dirname(self.path)) not in CR_SAID:
            CR_SAID.add(folder)
            warnings.warn(f"{self.path}: line 1 holds carriage returns (\\r) inside it, where "
                          "lines end at \\n (or \\r\\n): a file of lines ended by \\r alone "
                          "(classic Mac OS) reads as one record; convert it (tr '\\r' '\\n' "
                          "< in > out) (said once a folder)", JaxloaderWarning,
                          stacklevel=user_stacklevel())
        return text


CR_SAID: set[str] = set()  # folders whose shards' first lines holding \r were warned of


def seek(shard: Any, offset: int) -> None:
    """``shard._file`` to ``offset`` (a compressed file: read up to it, where it may turn out
    cut short)."""
    try:
        shard._file.seek(offset)
    except Exception as e:
        raise unreadable(shard, f"byte {offset} (a restore's place)", e) from e


def state_ints(shard: Any, state: dict | None, keys: tuple[str, ...]) -> tuple[int, ...]:
    """The ints ``keys`` of a shard's ``state`` (zeros for ``None``), each checked."""
    if state is None:
        return tuple(0 for _ in keys)
    if not isinstance(state, dict) or any(
            type(state.get(k)) is not int or state[k] < 0 for k in keys):
        raise StateDictError(f"{type(shard).__name__} {shard.name}: expected a state with "
                             f"non-negative ints {list(keys)}, got {state!r:.300}")
    return tuple(state[k] for k in keys)
