"""Compressed shards: a file in gzip, bzip2, xz or Zstandard read as the bytes it holds.

::

    file ──its first bytes (not its name)──> gzip / bz2 / lzma / zstd reader ──> lines
    state: offsets in the decompressed bytes; a resume decompresses up to its offset

Text corpora ship this way (C4's ``.json.gz``, the Pile's ``.jsonl.zst``, WebDataset's
``.tar.gz``). The readers are the standard library's (``gzip``, ``bz2``, ``lzma``;
Zstandard: ``compression.zstd`` from Python 3.14, ``backports.zstd`` before it, installed by
``pip install "jaxloader[zstd]"``). Records and states are those of the decompressed file, so
a shard's order is the same compressed or not; but a compressed stream has no random access,
so a resume reads the shard from its start to the state's offset: O(bytes before it), where
a plain file seeks in O(1).

Example:
    >>> import gzip, io
    >>> f = decompressed(io.BytesIO(gzip.compress(b"a\\nbb\\n")), "a.jsonl.gz")
    >>> f.readline(), f.tell()
    (b'a\\n', 2)
"""

from __future__ import annotations

import importlib
import io
from typing import Any

from jaxloader.base.errors import ConfigError, closed_on_failure

_MAGIC = {  # the first bytes of each format, as its specification gives them
    b"\x1f\x8b\x08": "gzip",  # (and deflate, its one method)
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}
# after "BZh" and the block size (a digit), a block (pi's digits) or, in a file of nothing,
# the end of the stream (sqrt(pi)'s): a text may begin "BZh"
_BZIP2_NEXT = (b"1AY&SY", b"\x17rE8P\x90")
_SKIPPABLE = {bytes([b]) for b in range(0x50, 0x60)}  # a skippable frame's first byte

# suffixes a folder's compressed files may end with, after the format's own (".jsonl.gz")
SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


def or_compressed(suffix: str) -> tuple[str, ...]:
    """A folder's files of a format: ``a.jsonl``, and ``a.jsonl.gz`` and the like."""
    return (suffix, *(suffix + c for c in SUFFIXES))


def compression(raw: Any) -> str | None:
    """The format ``raw`` (a binary file at its start) is compressed in, or ``None``; the
    file is left at its start."""
    head = raw.read(10)
    raw.seek(0)
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[4:] in _BZIP2_NEXT:
        return "bzip2"
    if head[:1] in _SKIPPABLE and head[1:4] == b"\x2a\x4d\x18":  # (a Zstandard skippable
        return "zstd"  # frame: pzstd's first, its sizes)
    return next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)


def decompressed(raw: Any, name: str) -> Any:
    """``raw`` (a binary file at its start, local or remote) as the bytes it holds: itself if
    it is not compressed, else a reader that decompresses it (``read``, ``readline``,
    ``tell`` and forward ``seek`` in decompressed bytes)."""
    with closed_on_failure(raw.close, repr(name)):  # (Zstandard without its module)
        return _reader(raw, name)


def _reader(raw: Any, name: str) -> Any:
    kind = compression(raw)
    if kind is None:
        return raw
    if kind == "gzip":
        import gzip

        reader: Any = gzip.GzipFile(fileobj=raw, mode="rb")
    elif kind == "bzip2":
        import bz2

        reader = _streams(raw, bz2.BZ2Decompressor) or bz2.BZ2File(raw, mode="rb")
    elif kind == "xz":
        import lzma

        reader = _streams(raw, lzma.LZMADecompressor) or lzma.LZMAFile(raw, mode="rb")
    else:
        reader = _zstd_module(name).ZstdFile(raw, mode="rb")
    return _Closing(reader, raw)


def _streams(raw: Any, decompressor: Any) -> Any:
    """bzip2 or xz streams one after another (pbzip2's files, ``cat a.xz b.xz``), read as
    ``BZ2File`` and ``LZMAFile`` read them, by the standard library's own stream reader, but
    with bytes after a stream that start none refused: those readers drop them, and every
    record after, without a word (gzip's and Zstandard's refuse them). ``None`` where this
    Python keeps that reader elsewhere (its readers then, as they are)."""
    for module in ("compression._common._streams", "_compression"):  # (3.14's, then before)
        try:
            reader = importlib.import_module(module).DecompressReader
        except (ImportError, AttributeError):
            continue
        return io.BufferedReader(reader(raw, lambda: _AfterPadding(decompressor),
                                        trailing_error=()))
    return None


class _AfterPadding:
    """A stream's decompressor that takes the zero bytes before it as padding, as bzip2's and
    xz's readers take them between or after streams (a tape's blocks, xz's stream padding):
    zeros alone are an end that asks for more bytes, the end of the file after them the
    file's; any other bytes are the stream's, refused where they start none."""

    def __init__(self, make: Any) -> None:
        self._make, self._padding = make, False
        self._inner: Any = None

    def decompress(self, data: bytes, max_length: int = -1) -> bytes:
        if self._inner is None:
            data = data.lstrip(b"\0")
            if not data:
                self._padding = True
                return b""
            self._inner = self._make()
        return self._inner.decompress(data, max_length)

    @property
    def eof(self) -> bool:
        return self._padding if self._inner is None else self._inner.eof

    @property
    def unused_data(self) -> bytes:
        return b"" if self._inner is None else self._inner.unused_data

    @property
    def needs_input(self) -> bool:
        return True if self._inner is None else self._inner.needs_input


class _Closing:
    """A decompressing reader whose ``close`` also closes the file under it (the standard
    library's readers leave a file object they were given open)."""

    def __init__(self, reader: Any, raw: Any) -> None:
        self._reader, self._raw = reader, raw
        self.read, self.readline = reader.read, reader.readline
        self.seek, self.tell = reader.seek, reader.tell

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            self._raw.close()


def _zstd_module(name: str) -> Any:
    for module in ("compression.zstd", "backports.zstd"):  # Python 3.14+, then the backport
        try:
            return importlib.import_module(module)
        except ImportError:
            pass
    raise ConfigError(
        f"{name!r} is compressed with Zstandard, which this Python reads only with "
        "backports.zstd (Python 3.14 has it built in): pip install \"jaxloader[zstd]\", or "
        "decompress the file (zstd -d)"
    )
