"""``TarShard``: a tar file in the WebDataset layout, read by parsing its headers.

::

    [header 512 B][data, padded to 512] [header][data] ... [two zero blocks]
    consecutive members with one key (name up to the first dot of its last part) ─> a record
        {"__key__": key, "<ext>": bytes, ...}
    state: {"offset": the next record's first header, "records": records read, + the file's
            identity (shards.FileShard): its size, hashes of its first and last KiB}

Damage is an error, never a short record: a header whose checksum fails, a member or its
padding cut short, a size field past the end of the file, a file that ends inside a header or
without its end-of-archive marker (two zero blocks) each raise ``RecordError`` naming the shard,
the member and its byte offset. ``tolerate_missing_end=True`` accepts a shard that stops at a
member boundary without the marker (some writers leave it out; a member cut short is still an
error).

Example:
    >>> import io, os, tarfile, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.tar")
    >>> with tarfile.open(path, "w") as tar:
    ...     for name, data in (("k1.txt", b"hi"), ("k1.cls", b"3"), ("k2.txt", b"yo")):
    ...         info = tarfile.TarInfo(name); info.size = len(data)
    ...         tar.addfile(info, io.BytesIO(data))
    >>> shard = TarShard(path); shard.reset(); shard.next()
    {'__key__': 'k1', 'txt': b'hi', 'cls': b'3'}
    >>> shard.get_state()["offset"], shard.get_state()["records"]
    (2048, 1)
"""

from __future__ import annotations

import os
import zlib
from typing import Any

from jaxloader.errors import RecordError
from jaxloader.streams.shards import FileShard, unreadable

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
# A member's data is read at most this many bytes at a time: a damaged size field (8 GiB) must
# not have a reader allocate it before finding the file shorter.
_READ_CHUNK = 64 << 20
_ADLER_MOD = 65521  # zlib.adler32's modulus (its low half is 1 + the bytes' sum, modulo this)
_CHECKSUM_SPACES = 8 * ord(" ")  # the checksum is summed with its own field as 8 spaces


class TarShard(FileShard):
    """A tar file in the WebDataset layout: consecutive members sharing a key (the name up to
    the first dot of its last part) make one record ``{"__key__": key, ext: bytes, ...}``.
    State: the byte offset of the next record's first member, the records read and the file's
    identity (a restore over a changed file is refused: ``FileShard``).

    The headers are parsed here (ustar, GNU long names, pax ``path``), not by ``tarfile``: a
    member costs a few reads and a slice (``tarfile`` builds an object a member, ~10x slower).
    Each header's checksum is verified. A compressed tar file (``.tar.gz``) is read as the tar
    it holds (offsets in it); a resume then decompresses it up to its offset
    (``jaxloader.streams.compressed``).

    Args:
        path: the file, local or remote (``gs://``).
        tolerate_missing_end: accept a file that ends at a member boundary without the two
            zero blocks that end a tar archive (by default an error: a shard cut there looks
            the same).
        append_only: see ``FileShard``.
    """

    _COUNTER = "records"

    def __init__(self, path: str | os.PathLike, *, tolerate_missing_end: bool = False,
                 append_only: bool = False) -> None:
        super().__init__(path, append_only=append_only)
        self.tolerate_missing_end = tolerate_missing_end
        self._pending: tuple[int, str, bytes] | None = None  # (offset, name, data) read ahead
        self._end: int | None = None  # where the end-of-archive marker starts, once read

    def _opened(self) -> None:
        self._end = None
        self._pending = self._member()

    def _member(self) -> tuple[int, str, bytes] | None:
        """The next regular file: (its header's offset, name, data); None at the end."""
        try:
            return self._read_member()
        except RecordError:
            raise
        except Exception as e:  # a compressed file cut short or corrupt
            raise unreadable(self, f"the member after record {self._count}", e) from e

    def _read_member(self) -> tuple[int, str, bytes] | None:
        f = self._file
        long_name = None
        start = f.tell()  # a long name's own header comes first: a resume starts there
        while True:
            offset = f.tell()
            header = f.read(_BLOCK)
            if len(header) < _BLOCK or header == _ZERO_BLOCK:  # (a member's never is)
                self._end_of_archive(offset, header)
                return None
            size = self._checked_size(header, offset)
            data = self._read_data(size, header, offset)
            kind = header[156:157]
            if kind in (b"L",):  # GNU: the next member's long name
                long_name = data.rstrip(b"\0").decode("utf-8", "replace")
                continue
            if kind in (b"x",):  # pax: the next member's attributes
                long_name = _pax_path(data) or long_name
                continue
            if kind not in (b"0", b"\0", b"7"):  # directories, links, globals: no record
                long_name = None
                start = f.tell()
                continue
            name = long_name or _header_name(header)
            return start, name, data

    def _checked_size(self, header: bytes, offset: int) -> int:
        """The member's size, once its header's checksum is verified."""
        try:
            size = _tar_size(header[124:136])
            stored = int(header[148:156].rstrip(b"\0 ").strip() or b"-1", 8)
        except ValueError:
            raise RecordError(f"{self.path}: byte {offset}: not a tar header (size field "
                              f"{header[124:136]!r}, checksum field {header[148:156]!r}); is "
                              "this a tar file?") from None
        # Adler-32's first half is 1 + the bytes' sum modulo 65521: the sum in C, 0.2 us a
        # header against 2.7 for Python's sum(); a mismatch is confirmed exactly below.
        field = sum(header[148:156])
        if ((zlib.adler32(header) & 0xFFFF) - 1 - field + _CHECKSUM_SPACES - stored) % _ADLER_MOD:
            unsigned = sum(header) - field + _CHECKSUM_SPACES
            signed = unsigned - 256 * sum(b >= 128 for b in header[:148] + header[156:])
            if stored not in (unsigned, signed):  # (some old writers summed signed bytes)
                raise RecordError(
                    f"{self.path}: byte {offset}: the header of member "
                    f"{_header_name(header)!r} fails its checksum (stored {stored}, computed "
                    f"{unsigned}): the header is damaged; replace the shard (re-download or "
                    "re-create it), or drop it from the stream")
        return size

    def _read_data(self, size: int, header: bytes, offset: int) -> bytes:
        """The member's data and its padding to the next block; a file that ends first is an
        error naming the member."""
        f = self._file
        padded = size + (-size % _BLOCK)
        left = self._bytes_left(offset + _BLOCK)
        if left is not None and left < padded:
            self._cut(header, offset, size, left)
        if size <= _READ_CHUNK:
            data = f.read(size)
        else:
            parts, wanted = [], size
            while wanted:
                part = f.read(min(wanted, _READ_CHUNK))
                if not part:
                    break
                parts.append(part)
                wanted -= len(part)
            data = b"".join(parts)
        pad = f.read(padded - size) if padded > size else b""
        if len(data) + len(pad) < padded:
            self._cut(header, offset, size, len(data) + len(pad))
        return data

    def _bytes_left(self, position: int) -> int | None:
        """Bytes of the file after ``position``, where known without reading them (a local
        file that is not compressed)."""
        if self._size_known is None:
            return None
        return self._size_known - position

    def _cut(self, header: bytes, offset: int, size: int, left: int) -> None:
        raise RecordError(
            f"{self.path}: byte {offset}: member {_header_name(header)!r} is cut short: its "
            f"header says {size:,} bytes (padded to "
            f"{size + (-size % _BLOCK):,}), the file holds {max(0, left):,} more: a copy that "
            "stopped, or a damaged size field; replace the shard (re-download or re-create "
            "it), or drop it from the stream")

    def _end_of_archive(self, offset: int, header: bytes) -> None:
        """At ``header`` (read at ``offset``, a whole block of zeros or the file's last
        bytes): the two zero blocks that end the archive, or else the error that says how the
        file ends instead. ``tolerate_missing_end`` accepts an end at a member boundary, or
        inside the marker."""
        self._end = offset
        zeros = header.count(0) == len(header)
        second = self._file.read(_BLOCK) if len(header) == _BLOCK and zeros else b""
        if second.count(0) != len(second):
            how = "a zero block is followed by data, not by a second zero block"
        elif not zeros:
            how = f"it ends inside a header ({len(header)} of {_BLOCK} bytes)"
        elif len(header) + len(second) == 2 * _BLOCK or self.tolerate_missing_end:
            return  # (what follows the marker, if anything, is not read: as tarfile)
        elif header:
            how = (f"its end-of-archive marker is cut short ({len(header) + len(second)} of "
                   f"{2 * _BLOCK} bytes)")
        else:
            how = ("it ends without the end-of-archive marker (two zero blocks) after a "
                   "member: a copy that stopped at a member boundary")
        raise RecordError(
            f"{self.path}: byte {offset}: {how}; replace the "
            "shard (re-download or re-create it), or drop it from the stream"
            + ("; if its writer leaves the marker out, read it with "
               "Stream.tar(paths, tolerate_missing_end=True)" if zeros else ""))

    def next(self) -> dict:
        if self._file is None:
            self.reset(None)
        record: dict = {}
        key = None
        while self._pending is not None:
            _, name, data = self._pending
            last = name.rsplit("/", 1)[-1]
            stem, _, ext = last.partition(".")
            member_key = name[: len(name) - len(last)] + stem
            if key is not None and member_key != key:
                break
            key = member_key
            record[ext] = data
            self._pending = self._member()
        if key is None:
            raise StopIteration
        self._count += 1
        return {"__key__": key, **record}

    def _offset(self) -> int:
        """The next record's first header; at the end, the end-of-archive marker's offset (a
        resume reads the marker again)."""
        if self._pending is not None:
            return self._pending[0]
        return self._end if self._end is not None else self._file.tell()

    def close(self) -> None:
        super().close()
        self._pending = None

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_pending": None, "_end": None}


def _tar_size(field: bytes) -> int:
    if field[:1] == b"\x80":  # GNU base-256 for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    return int(field.rstrip(b"\0 ").strip() or b"0", 8)


def _header_name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "replace")


def _pax_path(data: bytes) -> str | None:
    for line in data.split(b"\n"):
        _, _, field = line.partition(b" ")
        key, _, value = field.partition(b"=")
        if key == b"path":
            return value.decode("utf-8", "replace")
    return None
