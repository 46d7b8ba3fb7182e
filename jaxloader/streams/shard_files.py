"""A file shard's file: opened (decompressed where it is compressed) with its identity, and
checked at a restore to be the file the state was saved over (``check_unchanged``).

A file shard's state names the file as it was opened: its size and CRC-32s of its first and
last KiB (``file_identity.ends``). A restore over a file that changed since is refused, naming
what changed; one that only grew (its first bytes as they were) resumes where
``append_only=True``, and is told to take it otherwise.

Example:
    >>> import io
    >>> _head(io.BytesIO(b"abc"), 2) == zlib.crc32(b"ab")
    True
"""

from __future__ import annotations

import os
import zlib
from typing import Any

from jaxloader.base import file_identity
from jaxloader.base.errors import ConfigError, RecordError, StateDictError, closed_on_failure
from jaxloader.streams.compressed import compression, decompressed

# a compressed file's first bytes, left out of its identity's tail: gzip's header holds the
# time it compressed (bytes 4 to 8), and a small file's last KiB would reach into it
_HEADER_BYTES = 16


def open_file(shard: Any) -> tuple[Any, dict[str, int], bool]:
    """``shard.path`` opened for reading the bytes it holds (decompressed if it is gzip,
    bzip2, xz or Zstandard: ``jaxloader.streams.compressed``), with the file's identity as
    opened (``file_identity.ends``; of a compressed file, the head is its first KiB once
    decompressed: gzip writes the time it compressed into its first bytes, so the same records
    compressed again would otherwise look changed) and whether the reader is the file itself
    (local, not compressed); an error naming the shard if it cannot be opened."""
    try:
        raw = file_identity.open_binary(shard.path)  # (remote: gs://, s3://)
        with closed_on_failure(raw.close, repr(shard.path)):
            plain = compression(raw) is None
            found = file_identity.ends(raw, skip=0 if plain else _HEADER_BYTES)
            if getattr(shard, "_PADDED", False):  # (a tar's zero blocks and padding, its last
                # KiB in every tar, saw no edit: the tail is its data's; the older kept)
                shard._older_tail = found["tail"] if plain else None
                if plain:
                    found["tail"] = file_identity.data_tail(raw, found["size"])
        reader = decompressed(raw, shard.path)
        if reader is not raw:
            try:  # (its first KiB kept: a file that held less when a state was saved)
                shard._opened_start = reader.read(file_identity.ENDS_BYTES)
                reader.seek(0)
                found["head"] = zlib.crc32(shard._opened_start)
            except Exception as e:  # (cut short or corrupt: EOFError, LZMAError, zlib.error,
                try:  # BadGzipFile and bz2's "Invalid data stream", which are OSErrors)
                    reader.close()
                finally:  # (a decompressor leaves its file open)
                    raw.close()
                raise unreadable(shard, "its first KiB", e) from e
        shard._compressed = reader is not raw  # (its size: the compressed bytes')
        return reader, found, reader is raw and "://" not in shard.path
    except OSError as e:
        if file_identity.storage_failed(e):
            raise file_identity.storage_failure(type(shard).__name__, shard.path,
                                                "its start", e) from e
        raise ConfigError(f"{type(shard).__name__}: cannot open {shard.path!r}: {e}; check the "
                          "path, or drop the shard from the stream" + (
                              file_identity.not_on_this_node(shard.path)
                              if isinstance(e, FileNotFoundError) else "")) from None


def check_unchanged(shard: Any, state: dict) -> None:
    """Refuses to resume ``shard`` (just opened) from ``state`` if the file is not the one the
    state was saved over (``FileShard``), naming what changed. A state without an identity (a
    shard's first, never opened) resumes as it is."""
    then = {key: state[key] for key in ("size", "head", "tail") if key in state}
    for key, value in then.items():
        if type(value) is not int or value < 0:
            raise StateDictError(f"{type(shard).__name__} {shard.name}: state[{key!r}]: "
                                 f"expected a non-negative int, got {value!r:.120}")
    now = shard._identity
    if "tail" in then and then["tail"] == getattr(shard, "_older_tail", None):  # (a tar's,
        then["tail"] = now["tail"]  # saved before its tail was its data's: the zeros')
    if not then or then == {key: now.get(key) for key in then}:
        return
    # it only grew if it starts as it did (its old end may be rewritten: a tar's marker; a
    # tar appended to in place keeps its size in its padding's room)
    grew = "size" in then and now["size"] >= then["size"] and (
        "head" not in then or starts_as(shard, then["size"], then["head"]))
    if shard.append_only and grew:
        return
    if grew and now["size"] > then["size"] and getattr(shard, "_compressed", False):
        raise StateDictError(
            f"stream shard {shard.path}: its compressed size grew since the state was saved "
            f"({then['size']:,} bytes then, {now['size']:,} now, its first records as they "
            "were): records were appended to it, or it was compressed again (another level "
            "or tool, the same records); read the shards with append_only=True "
            f"({_maker(shard)}(paths, append_only=True)) to resume over them (right for "
            "either), or restore over the file as it was")
    if grew and now["size"] > then["size"]:  # ("its first KiB differs", it said: not so)
        raise StateDictError(
            f"stream shard {shard.path}: it grew since the state was saved ({then['size']:,} "
            f"bytes then, {now['size']:,} now, its first bytes as they were): records were "
            "appended to it, or it was cut short when the state was saved and is whole now "
            "(a copy that had stopped); read the shards with append_only=True "
            f"({_maker(shard)}(paths, append_only=True)) to resume over them, or restore over "
            "the file as it was")
    changed = ([f"size {then['size']:,} bytes then, {now['size']:,} now"]
               if then.get("size", now["size"]) != now["size"] else ["the same size"])
    last = "its last KiB differs" if getattr(shard, "_older_tail", None) is None else (
        "its last KiB of records (before the tar's closing zeros), or where they end, differs")
    changed += ["its first KiB differs" if key == "head" else last
                for key in ("head", "tail") if key in then and then[key] != now.get(key)]
    kind = "shorter or rewritten" if shard.append_only else "changed"
    raise StateDictError(
        f"stream shard {shard.path}: {kind} since the state was saved ({'; '.join(changed)}): "
        + (f"the state's offset {state['offset']} would resume inside other records" if
           "offset" in state else "the window the state was saved in read its first records,"
           " which it would read otherwise") + "; restore "
        "over the shards the state was saved with (a stream without this shard refuses "
        "the state: its shards are part of it)"
        + ("" if shard.append_only else "; if records are only appended to it, read the "
           f"shards with append_only=True ({_maker(shard)}(paths, append_only=True))"))


def _maker(shard: Any) -> str:
    """The ``Stream`` constructor of ``shard``'s kind, as a remedy names it."""
    return {"TarShard": "Stream.tar", "TextShard": "Stream.text"}.get(
        type(shard).__name__, "Stream.jsonl")


def starts_as(shard: Any, size: int, head: int, fd: int | None = None) -> bool:
    """Whether ``shard``'s file as it is now starts as it did when it had ``size`` bytes and
    ``head`` was its identity's head: its first KiB (a plain file's first ``size`` bytes, if
    fewer), read from the open file ``fd`` where given (its path may name another file now: a
    log rotated). A compressed file's size is of its compressed bytes: a head of fewer than a
    KiB of what it held is found among the prefixes of what it holds now, as opened."""
    if shard._size_known is None:  # (compressed: the first KiB of what it holds, as opened)
        start, crc = getattr(shard, "_opened_start", b""), 0
        if shard._identity["head"] == head or head == crc:
            return True
        for k in range(len(start)):
            crc = zlib.crc32(start[k:k + 1], crc)
            if crc == head:
                return True
        return False
    if fd is not None:
        return zlib.crc32(os.pread(fd, min(size, file_identity.ENDS_BYTES), 0)) == head
    with file_identity.open_binary(shard.path) as raw:
        return _head(raw, min(size, file_identity.ENDS_BYTES)) == head


def _head(reader: Any, count: int) -> int:
    """The CRC-32 of ``reader``'s first ``count`` bytes; ``reader`` left at its start."""
    head = zlib.crc32(reader.read(count))
    reader.seek(0)
    return head


def unreadable(shard: Any, where: str, error: Exception) -> RecordError:
    """The error for a shard whose bytes cannot be read at ``where`` (a compressed file cut
    short or corrupt, a failing disk), or does not fit in memory (a record of gigabytes)."""
    if isinstance(error, MemoryError):
        return RecordError(f"{shard.path}: {where}: does not fit in this process's memory "
                           f"({type(error).__name__}: {error}): a record that large is read "
                           "whole; split it, or drop the shard from the stream")
    return RecordError(f"{shard.path}: {where}: cannot be read ({type(error).__name__}: "
                       f"{error}); is the file whole? replace it, or drop the shard from the "
                       "stream")
