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
the member and its byte offset, as does a link (no data of its own), and a member of a key read
before (a sample's members apart: a record each part; the keys' hashes kept, ~60 B a record).
``tolerate_missing_end=True`` accepts a shard that stops at a member boundary without the
marker (some writers leave it out). A compressed shard is read to its end, where gzip, xz and
Zstandard check their checksums: a tar has none of its data. A member not named ``key.ext`` (no
extension, or a dot first: macOS's ``._name``) is left out, as WebDataset leaves it, and warned
of once a folder. A shard rewritten while read is said to be, not taken for a damaged one.
"""

from __future__ import annotations

import os
import warnings
from jaxloader.base.checks import check_bool
from jaxloader.base.errors import JaxloaderWarning, RecordError
from jaxloader.base.loader_names import loader_names
from jaxloader.streams.shards import FileShard, unreadable
from jaxloader.streams.tar_headers import BLOCK as _BLOCK
from jaxloader.streams.tar_headers import DROP as _DROP
from jaxloader.streams.tar_headers import CHECKSUM_SPACES as _CHECKSUM_SPACES
from jaxloader.streams.tar_headers import check_after_end, header_sum
from jaxloader.streams.tar_headers import header_name as _header_name
from jaxloader.streams.tar_headers import pax as _pax
from jaxloader.streams.tar_headers import sparse as _sparse

_ZERO_BLOCK = bytes(_BLOCK)
_READ_CHUNK = 64 << 20  # a member's data read at a time: a damaged size field (8 GiB) not allocated
_SMALL = 4096  # a member up to this is read with its padding in one call, then sliced
LEFT_OUT_SAID: set[str] = set()  # folders whose shards' members left out were warned of
_NAMES = (0x4C, 0x4B, 0x78, 0x67)  # b"L", b"K", b"x", b"g": a long name, link, attributes
_NAMES_UP_TO = 1 << 20  # bytes of such a member read, at most (PATH_MAX: 4,096)
_KEPT = (0x30, 0, 0x37, 0x4C, 0x78)  # members whose data is read: files, names, attributes
# the remedies a damaged shard's error and a cut one's end with (the whole copy: the cut grown)
_REPLACE = ("replace the shard (re-download or re-create it; a state saved inside the cut copy "
            "resumes over the whole one read with Stream.tar(paths, append_only=True)), " + _DROP)


@loader_names("stream")
class TarShard(FileShard):
    """A tar file in the WebDataset layout: consecutive members sharing a key (the name up to
    the first dot of its last part) make one record ``{"__key__": key, ext: bytes, ...}``.
    State: the byte offset of the next record's first member, the records read and the file's
    identity (a restore over a changed file is refused: ``FileShard``).

    The headers are parsed here (ustar, GNU long names, pax ``path``), not by ``tarfile``: a
    member costs a few reads and a slice (``tarfile`` builds an object a member, ~10x slower).
    Each header's checksum is verified. A compressed tar file (``.tar.gz``) is read as the tar
    it holds (offsets in it); a resume decompresses it to its offset (``streams.compressed``).

    Args:
        path: the file, local or remote (``gs://``).
        tolerate_missing_end: accept a file that ends at a member boundary without the two
            zero blocks that end a tar archive (by default an error: a shard cut there looks
            the same).
        append_only: see ``FileShard``.

    Example:
        >>> import io, os, tarfile, tempfile, jaxloader as jl
        >>> path = os.path.join(tempfile.mkdtemp(), "shard-0.tar")
        >>> with tarfile.open(path, "w") as tar:
        ...     for name, data in (("a.txt", b"cat"), ("a.cls", b"0"), ("b.txt", b"dog")):
        ...         info = tarfile.TarInfo(name)
        ...         info.size = len(data)
        ...         tar.addfile(info, io.BytesIO(data))
        >>> shard = jl.TarShard(path)
        >>> shard.reset(None)
        >>> shard.next()
        {'__key__': 'a', 'txt': b'cat', 'cls': b'0'}
        >>> shard.get_state()["offset"], shard.get_state()["records"]
        (2048, 1)
        >>> shard.close()
    """

    _COUNTER, _PADDED = "records", True  # (its last KiB zeros in every tar: the tail its data's)

    def __init__(self, path: str | os.PathLike, *, tolerate_missing_end: bool = False,
                 append_only: bool = False) -> None:
        super().__init__(path, append_only=append_only)
        self.tolerate_missing_end = check_bool("TarShard(tolerate_missing_end)",
                                               tolerate_missing_end)
        # the member read ahead: (its first header's offset, key, extension, data)
        self._pending: tuple[int, str, str, bytes] | None = None
        self._end: int | None = None  # where the end-of-archive marker starts, once read
        self._at = 0  # the offset of the next header to read
        self._keys: set[int] = set()  # hashes of the keys of the records read since reset()

    def _check_unmoved(self, where: str) -> None:
        """A tar changed while read is refused, ``append_only`` or not: one appended to in
        place has its end marker rewritten, and what follows it was read as another archive
        joined on, or left out (``FileShard``'s check took the growth for lines appended)."""
        if (now := self._moved()) is not None:
            raise RecordError(
                f"{self.path}: the file was modified while read ({where}; "
                f"{self._identity['size']:,} bytes when opened, {now.st_size:,} now): the "
                "records read on may be another file's, and a tar appended to in place has its "
                "end marker rewritten; add whole tar files to the stream (a shard each), or "
                "write a shard to a new file and rename it into place")

    def _check_place(self, offset: int) -> None:
        """(and inside a 512-byte block: a member's header is at a block's start)"""
        super()._check_place(offset)
        if offset % 512:
            raise self._not_a_place(offset, "inside a tar block of 512 bytes")

    def _opened(self) -> None:
        self._end, self._keys = None, set()
        self._at = self._file.tell()  # the next header's offset (kept here, not asked for)
        self._pending = self._member()

    def _member(self) -> tuple[int, str, str, bytes] | None:
        """The next regular file: (its first header's offset, its key, its extension, its
        data); None at the end. Every header's checksum is verified, and every member and its
        padding read whole (the loop is written for speed: it runs twice a record)."""
        f = self._file
        read = f.read
        long_name = pax_size = None
        offset = start = self._at  # a long name's own header comes first: a resume starts there
        try:
            while True:
                header = read(_BLOCK)
                if len(header) < _BLOCK or header == _ZERO_BLOCK:  # (a member's never is)
                    self._end_of_archive(offset, header)
                    return None
                try:
                    field = header[124:136]
                    size = (int.from_bytes(field[1:], "big") if field[0] == 0x80  # GNU, >8 GiB
                            else int(field.rstrip(b"\0 ").strip() or b"0", 8))
                    if size < 0:  # (int() takes a sign: -1 to -511 read an empty member)
                        raise ValueError
                    stored = int(header[148:156].rstrip(b"\0 ").strip() or b"-1", 8)
                    if pax_size is not None:  # (a pax size: over 8 GiB, the field then 0)
                        size, pax_size = pax_size, None
                except ValueError:
                    raise RecordError(
                        f"{self.path}: byte {offset}: not a tar header (size field {field!r}, "
                        f"checksum field {header[148:156]!r}); is this a tar file?") from None
                if header_sum(header) != stored:
                    self._check_exactly(header, offset, stored)
                padded = (size + _BLOCK - 1) & -_BLOCK
                if padded <= _SMALL:  # one read, data and padding
                    block = read(padded)
                    if len(block) < padded:
                        self._cut(header, offset, size, len(block))
                    data = block if padded == size else block[:size]
                elif header[156] in _NAMES and size > _NAMES_UP_TO:  # (read whole: 3 GiB of a
                    raise self._too_large(header, offset, size)  # "long name", an OOM kill)
                else:
                    data = self._read_large(header, offset, size, padded,
                                            keep=header[156] in _KEPT)
                offset += _BLOCK + padded
                kind = header[156]
                if kind == 0x30 or kind == 0 or kind == 0x37:  # b"0", b"\0", b"7": a file
                    name = long_name or _header_name(header)
                    # the key: the name up to the first dot of its last part; the extension:
                    # the rest; a name without (none, or a dot first) is no key.ext: left out
                    base = name.rfind("/") + 1
                    dot = name.find(".", base)
                    if dot > base:
                        break
                    self._left_out(name, start)
                    long_name = None
                    start = offset
                elif kind == 0x4C:  # b"L" (GNU): the next member's long name
                    long_name = data.rstrip(b"\0").decode("utf-8", "replace")
                elif kind == 0x78:  # b"x" (pax): the next member's attributes
                    path, pax_size = _pax(data, self.path, offset - _BLOCK - padded)
                    long_name = path or long_name
                elif kind == 0x31 or kind == 0x32:  # b"1", b"2": a hard or symbolic link
                    self._link(header, start, long_name)
                elif kind == 0x53:  # b"S" (GNU): a sparse file, its data packed with a map
                    raise _sparse(self.path, start, long_name or _header_name(header))
                else:  # directories, globals, devices: no record
                    long_name = None
                    start = offset
        except Exception as e:  # (a file rewritten while read is no damaged one: said first)
            self._check_unmoved(f"by record {self._count}")
            if isinstance(e, (RecordError, Warning)):  # (a warning made an error: as it is)
                raise
            raise unreadable(self, f"the member after record {self._count}", e) from e
        self._at = offset
        return start, name[:dot], name[dot + 1:], data

    def _left_out(self, name: str, offset: int) -> None:
        """Warns, once a folder of shards in a process, of a member not named ``key.ext``,
        which no record holds (as WebDataset leaves such members out): a record of key ``''``
        or of extension ``''`` failed later, far from the shard (macOS's resource files
        ``._name`` are such). Once a shard said it for each of a thousand shards tarred on a
        Mac, each pass."""
        folder = os.path.dirname(self.path)
        if folder not in LEFT_OUT_SAID:
            LEFT_OUT_SAID.add(folder)
            warnings.warn(
                f"{self.path}: byte {offset}: member {name!r} is left out, as any other of this "
                "shard whose name has no extension or starts with a dot (no key.ext: macOS's "
                "resource files ._name are such; tar there with COPYFILE_DISABLE=1): WebDataset "
                "leaves them out too; re-create the shard without them to silence this (said "
                "once a folder in this process: its other shards may hold such members too)",
                JaxloaderWarning,
                stacklevel=2)

    def _check_exactly(self, header: bytes, offset: int, stored: int) -> None:
        """An error unless ``stored`` is the header's signed sum (some old writers summed
        signed bytes); the unsigned one did not match."""
        unsigned = sum(header) - sum(header[148:156]) + _CHECKSUM_SPACES
        signed = unsigned - 256 * sum(b >= 128 for b in header[:148] + header[156:])
        if stored not in (unsigned, signed):
            raise RecordError(
                f"{self.path}: byte {offset}: the header of member {_header_name(header)!r} "
                f"fails its checksum (stored {stored}, computed {unsigned}): the header is "
                "damaged; replace the shard (re-download or re-create it), or drop it from "
                "the stream")

    def _read_large(self, header: bytes, offset: int, size: int, padded: int,
                    keep: bool = True) -> bytes:
        """A member larger than ``_SMALL``: its data, then its padding; a file that ends first
        (known before reading, for a local file not compressed) is an error naming it. Not
        ``keep``: its data read and let go (a directory's, a device's: no record), ``b""``."""
        read = self._file.read
        if self._size_known is not None and offset + _BLOCK + padded > self._size_known:
            self._cut(header, offset, size, self._size_known - offset - _BLOCK)
        if size <= _READ_CHUNK and keep:
            data = read(size)
        else:  # a damaged size field (8 GiB) must not be allocated before the file runs out
            parts, wanted, got = [], size, 0
            while wanted:
                part = read(min(wanted, _READ_CHUNK))
                if not part:
                    break
                if keep:
                    parts.append(part)
                wanted -= len(part)
                got += len(part)
            if not keep:  # (its length alone: what the cut check below counts)
                if got + len(read(padded - size)) < padded:
                    self._cut(header, offset, size, got)
                return b""
            data = b"".join(parts)
        got = len(data) + len(read(padded - size))
        if got < padded:
            self._cut(header, offset, size, got)
        return data

    def _too_large(self, header: bytes, offset: int, size: int) -> RecordError:
        kind = {0x4C: "a GNU long name", 0x4B: "a GNU long link name", 0x78: "pax attributes",
                0x67: "global pax attributes"}[header[156]]
        return RecordError(
            f"{self.path}: byte {offset}: member {_header_name(header)!r} holds {kind} of "
            f"{size:,} bytes, where such a member takes a few hundred (read whole: up to "
            f"{_NAMES_UP_TO:,} are): a damaged size field, or not a tar of records; "
            + _REPLACE)

    def _cut(self, header: bytes, offset: int, size: int, left: int) -> None:
        raise RecordError(
            f"{self.path}: byte {offset}: member {_header_name(header)!r} is cut short: its "
            f"header says {size:,} bytes (padded to {(size + _BLOCK - 1) & -_BLOCK:,}), the "
            f"file holds {max(0, left):,} more: a copy that stopped, or a damaged size field; "
            + _REPLACE)

    def _end_of_archive(self, offset: int, header: bytes) -> None:
        """At ``header`` (read at ``offset``, a whole block of zeros or the file's last
        bytes): the two zero blocks that end the archive, or else the error that says how the
        file ends instead. ``tolerate_missing_end`` accepts an end at a member boundary, or
        inside the marker."""
        self._end = offset
        zeros = header.count(0) == len(header)
        second = self._file.read(_BLOCK) if len(header) == _BLOCK and zeros else b""
        if offset == 0 and not header:  # (not even an empty archive's marker: also with
            # tolerate_missing_end, a failed download read as a shard of no records)
            how = ("the file holds no bytes (decompressed, where it is compressed; an empty "
                   "archive holds its end marker, 1,024)")
        elif second.count(0) != len(second):
            how = "a zero block is followed by data, not by a second zero block"
        elif not zeros:
            how = f"it ends inside a header ({len(header)} of {_BLOCK} bytes)"
        elif len(header) + len(second) == 2 * _BLOCK or self.tolerate_missing_end:
            self._read_to_end(offset)
            return
        elif header:
            how = (f"its end-of-archive marker is cut short ({len(header) + len(second)} of "
                   f"{2 * _BLOCK} bytes)")
        else:
            how = ("it ends without the end-of-archive marker (two zero blocks) after a "
                   "member: a copy that stopped at a member boundary")
        raise RecordError(
            f"{self.path}: byte {offset}: {how}; {_REPLACE}"
            + ("; if its writer leaves the marker out, read it with "
               "Stream.tar(paths, tolerate_missing_end=True)" if zeros and (header or offset)
               else ""))

    def _link(self, header: bytes, offset: int, long_name: str | None) -> None:
        """An error for a link member (its first header at ``offset``): it holds no data,
        only the name of a file (a hard link: an earlier member's, which ``tar`` writes for a
        file linked twice, and a sample's files may be), so its record would be missing or
        lack that member."""
        name = long_name or _header_name(header)
        target = header[157:257].split(b"\0", 1)[0].decode("utf-8", "replace")
        kind, flag = (("hard link", "--hard-dereference") if header[156] == 0x31
                      else ("symbolic link", "--dereference (-h)"))
        raise RecordError(
            f"{self.path}: byte {offset}: member {name!r} is a {kind} to {target!r}, which holds "
            f"no data of its own; re-create the shard with each member's data in it (GNU tar "
            f"{flag}), {_DROP}")

    def _read_to_end(self, offset: int) -> None:
        """What follows the end-of-archive marker (at ``offset``), read to the end: zeros or
        an error (``tar_headers.check_after_end``: another archive joined after it, whose
        members were left unread without a word). Read so, gzip's CRC-32 and Zstandard's and
        xz's checksums are checked as the end of their stream is read: a tar holds no
        checksum of its data (a flipped bit gave records of wrong bytes, without a word)."""
        try:
            check_after_end(self._file, self.path, offset)
        except (RecordError, Warning):  # (a warning made an error: its own, not a stream's)
            raise
        except Exception as e:  # (BadGzipFile: CRC check failed; ZstdError; LZMAError)
            raise unreadable(self, f"its compressed stream, read to its end after the "
                                   f"end-of-archive marker at byte {offset} (the records read "
                                   "from it before may be damaged)", e) from e

    def next(self) -> dict:
        if self._file is None:
            self.reset(None)
        pending = self._pending
        if pending is None:
            raise StopIteration
        offset, key, ext, data = pending
        if hash(key) in self._keys:
            raise RecordError(  # (ray-project/ray#44068: read as two records, each half empty)
                f"{self.path}: byte {offset}: member {key}.{ext} has the key of a record before "
                f"it, apart from its members (a sample's members not stored together: each part "
                f"a record lacking the others'); re-create the shard with them together, {_DROP}")
        self._keys.add(hash(key))
        record = {"__key__": key, ext: data}
        while True:  # the members that follow with the same key
            pending = self._member()
            if pending is None or pending[1] != key:
                break
            if pending[2] in record:  # (written twice: one would be lost)
                raise RecordError(
                    f"{self.path}: byte {pending[0]}: member {key}.{pending[2]} follows another "
                    f"of the same name; expected one member a key and extension: re-create the "
                    f"shard with each sample's files once, {_DROP}")
            record[pending[2]] = pending[3]
        self._pending = pending
        self._count += 1
        if pending is None or not self._count % self._LOOK_EVERY:
            self._check_unmoved(f"by record {self._count}")
        return record

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
        return {**super().__getstate__(), "_pending": None, "_end": None, "_keys": set()}

