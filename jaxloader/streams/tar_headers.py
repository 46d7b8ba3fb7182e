"""A tar shard's parts read apart from its member loop (``streams.tar``): a header's name, a pax
header's path and size, and what follows the end-of-archive marker.

After the marker (two zero blocks) a tar holds zeros up to its record size (10,240 bytes for
GNU tar and ``tarfile``), or nothing. A file whose bytes go on is most often two archives joined
end to end (``cat a.tar b.tar``, or ``.tar.gz`` files so joined): ``tar`` and ``tarfile`` stop
at the first marker and read none of the second's members, without a word. So a tar header
there is an error; other data (a signature some tools append) is warned of, and left unread.

Example:
    >>> header = bytearray(512); header[:9] = b"key.jpg\\0\\0"
    >>> header_name(bytes(header))
    'key.jpg'
"""

from __future__ import annotations

import warnings
from typing import BinaryIO, NoReturn
from zlib import adler32

from jaxloader.base.errors import JaxloaderWarning, RecordError

BLOCK = 512
CHECKSUM_SPACES = 8 * ord(" ")  # the checksum is summed with its own field as 8 spaces
READ_AFTER_END = 1 << 16  # what follows the end-of-archive marker, read at a time
TRAILING_SAID: set[str] = set()  # files whose data after the marker was warned of
# the remedy a damaged shard's error ends with
DROP = "or drop it from the stream (a state saved while it was in the stream is then refused)"


def header_name(header: bytes) -> str:
    """A member's name: a POSIX ustar header's prefix before it (a GNU header, whose magic is
    ``"ustar  \0"``, holds times there where ``tar -G`` writes them, not a name)."""
    name = header[:100].split(b"\0", 1)[0]
    if header[345] and header[257:263] == b"ustar\0":
        name = header[345:500].split(b"\0", 1)[0] + b"/" + name
    return name.decode("utf-8", "replace")


def header_sum(header: bytes) -> int:
    """The header's bytes summed, its checksum field's as 8 spaces, in C: Adler-32's first
    half is 1 + the sum of up to 256 bytes exactly (0.5 us a header; Python's sum() 2.7)."""
    return ((adler32(header[:148]) & 0xFFFF) + (adler32(header[156:412]) & 0xFFFF)
            + (adler32(header[412:]) & 0xFFFF) - 3 + CHECKSUM_SPACES)


def pax(data: bytes, path: str, offset: int) -> tuple[str | None, int | None]:
    """The path and size a pax header gives the member after it (``None``: not given)."""
    name = size = None
    for line in data.split(b"\n"):
        _, _, field = line.partition(b" ")
        key, _, value = field.partition(b"=")
        if key == b"path":
            name = value.decode("utf-8", "replace")
        elif key.startswith(b"GNU.sparse."):  # (pax's sparse files: the same, by attributes)
            raise sparse(path, offset, name or "after it")
        elif key == b"size":
            try:
                size = int(value)
                if size < 0:
                    raise ValueError(size)
            except ValueError:
                raise RecordError(f"{path}: byte {offset}: a pax header's size is {value!r}, "
                                  "expected a number of bytes: the header is damaged; replace "
                                  f"the shard, {DROP}") from None
    return name, size


def sparse(path: str, offset: int, name: str) -> RecordError:
    return RecordError(f"{path}: byte {offset}: member {name!r} is a sparse file (tar "
                       "--sparse), whose bytes are stored packed, with a map of its holes, "
                       f"which this reader does not expand: re-create the shard without "
                       f"--sparse (-S), {DROP}")


def check_after_end(file: BinaryIO, path: str, marker: int) -> None:
    """Reads what follows the end-of-archive marker at byte ``marker`` (``file`` is at its
    end) to the file's end: zeros; a tar header at a block's start, another archive joined
    after it, an error; other data (a signature some tools append) warned of once a file. Read
    to the end, a compressed stream's checksum is checked too (its errors are the caller's)."""
    at, said = marker + 2 * BLOCK, False
    while chunk := file.read(READ_AFTER_END):
        if chunk.count(0) != len(chunk):
            for k in range(-at % BLOCK, len(chunk) - BLOCK + 1, BLOCK):  # (each block's start)
                if chunk[k] and _is_header(chunk[k:k + BLOCK]):
                    _joined(path, marker, at + k, chunk[k:k + BLOCK])
            if not said:
                first = len(chunk) - len(chunk.lstrip(b"\0"))
                said = _trailing(path, marker, at + first)
        at += len(chunk)


def _is_header(block: bytes) -> bool:
    try:
        stored = int(block[148:156].rstrip(b"\0 ").strip() or b"-1", 8)
    except ValueError:
        return False
    return stored == header_sum(block)


def _joined(path: str, marker: int, at: int, header: bytes) -> NoReturn:
    """The error for another archive's header at byte ``at``, after the marker."""
    raise RecordError(
        f"{path}: byte {marker}: the end-of-archive marker (two zero blocks) is followed by a "
        f"tar header (member {header_name(header)!r}) at byte {at:,}: another archive joined "
        f"after this one (cat a.tar b.tar), whose members tar and tarfile do not read either; "
        f"make the archives one (GNU tar --concatenate --file=a.tar b.tar) or list each as a "
        f"shard of its own, {DROP}")


def _trailing(path: str, marker: int, first: int) -> bool:
    """Warns, once a file in a process, of data after the marker that is no tar member."""
    if path not in TRAILING_SAID:
        warnings.warn(
            f"{path}: byte {first:,}: data that is not a tar member follows the end-of-archive "
            f"marker at byte {marker:,} (a signature or padding some tools append?): left "
            f"unread, as tar and tarfile leave it; cut the file to its archive "
            f"({marker + 2 * BLOCK:,} bytes) to silence this (said once a file)",
            JaxloaderWarning, stacklevel=3)
        TRAILING_SAID.add(path)  # (after the warning: one made an error is said again)
    return True
