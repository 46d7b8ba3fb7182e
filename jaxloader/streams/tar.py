"""``TarShard``: a tar file in the WebDataset layout, read by parsing its headers.

::

    [header 512 B][data, padded to 512] [header][data] ... [two zero blocks]
    consecutive members with one key (name up to the first dot of its last part) ─> a record
        {"__key__": key, "<ext>": bytes, ...}
    state: {"offset": the next record's first header, "records": records read}

Example:
    >>> import io, os, tarfile, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.tar")
    >>> with tarfile.open(path, "w") as tar:
    ...     for name, data in (("k1.txt", b"hi"), ("k1.cls", b"3"), ("k2.txt", b"yo")):
    ...         info = tarfile.TarInfo(name); info.size = len(data)
    ...         tar.addfile(info, io.BytesIO(data))
    >>> shard = TarShard(path); shard.reset(); shard.next()
    {'__key__': 'k1', 'txt': b'hi', 'cls': b'3'}
    >>> shard.get_state()
    {'offset': 2048, 'records': 1}
"""

from __future__ import annotations

import os
from typing import Any

from jaxloader.errors import RecordError
from jaxloader.streams.shards import open_file, seek, state_ints, unreadable


class TarShard:
    """A tar file in the WebDataset layout: consecutive members sharing a key (the name up to
    the first dot of its last part) make one record ``{"__key__": key, ext: bytes, ...}``.
    State: the byte offset of the next record's first member and the records read.

    The headers are parsed here (ustar, GNU long names, pax ``path``), not by ``tarfile``: a
    member costs two reads and a slice (``tarfile`` builds an object a member, ~10x slower).
    A compressed tar file (``.tar.gz``) is read as the tar it holds (offsets in it); a resume
    then decompresses it up to its offset (``jaxloader.streams.compressed``).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        self._file: Any = None
        self._pending: tuple[int, str, bytes] | None = None  # (offset, name, data) read ahead
        self._records = 0

    def reset(self, state: dict | None = None) -> None:
        offset, records = state_ints(self, state, ("offset", "records"))
        self.close()
        self._file = open_file(self)
        seek(self, offset)
        self._records = records
        self._pending = self._member()

    def _member(self) -> tuple[int, str, bytes] | None:
        """The next regular file: (its header's offset, name, data); None at the end."""
        try:
            return self._read_member()
        except RecordError:
            raise
        except Exception as e:  # a compressed file cut short or corrupt
            raise unreadable(self, f"the member after record {self._records}", e) from e

    def _read_member(self) -> tuple[int, str, bytes] | None:
        f = self._file
        long_name = None
        start = f.tell()  # a long name's own header comes first: a resume starts there
        while True:
            offset = f.tell()
            header = f.read(512)
            if len(header) < 512 or header == _ZERO_BLOCK:
                return None
            try:
                size = _tar_size(header[124:136])
            except ValueError:
                raise RecordError(f"{self.path}: byte {offset}: not a tar header (size field "
                                  f"{header[124:136]!r}); is this a tar file?") from None
            data = f.read(size)
            f.seek(-size % 512, 1)  # members are padded to 512 bytes
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
        self._records += 1
        return {"__key__": key, **record}

    def get_state(self) -> dict:
        if self._file is None:
            return {"offset": 0, "records": self._records}
        offset = self._pending[0] if self._pending is not None else self._file.tell()
        return {"offset": offset, "records": self._records}

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._pending = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_file": None, "_pending": None, "_records": 0}


_ZERO_BLOCK = bytes(512)


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
