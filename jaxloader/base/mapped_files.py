"""Files a source reads through a memory map, stamped when the source is made and stat-ed before
each batch it reads: a file cut shorter in place kills the process that reads past its new end
(SIGBUS, in process with no word at all), and one written again in place mixes versions in a
batch. A file replaced by a rename, or deleted, is not a change: the mapping still reads the
old one (but for files a worker maps again by their names: a Hugging Face ``Dataset``'s).
A stat is ~1-2 us a local file, once a batch or record (``ArraySource``, ``RaggedSource``, a
``Dataset``'s cache files); where checks take longer than a local file's (a network file
system), at most 1% of the time.

Example:
    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(path, np.arange(4))
    >>> files = MappedFiles("ArraySource", [np.load(path, mmap_mode="r")])
    >>> files.check()  # (nothing changed: nothing said)
    >>> len(files.stamps)
    1
"""

from __future__ import annotations

import bisect
import mmap
import os
import warnings
from time import perf_counter
from typing import Any, Iterable

import numpy as np

from jaxloader.base.abilities import parts_of
from jaxloader.base.columns import memmap_under
from jaxloader.base.errors import ConfigError, JaxloaderWarning, RecordError

# A check costlier than both waits 100 times as long for the next (1%): a stat a file of a
# network file system. Not a local file's, ~1-3 us with the loop, and not one check slowed
# by the OS: a check skipped is a window where a file cut is read to a SIGBUS (40 local
# files had checks skipped, a file cut between passes killed the process; the data audit).
_CHEAP_S = 50e-6
_CHEAP_FILE_S = 10e-6
_SOON_S = 0.01  # soon(): a check at most this often
_REPLACE = ("write a new file beside it and rename it over (os.replace), which a mapping open "
            "on the old one keeps reading")
_RENAME = _REPLACE + ", and make the source again to read the new one"


class MappedFiles:
    """The memory-mapped files under ``arrays`` (``np.load(mmap_mode=...)``, views of them), or
    the ``paths`` given (files Arrow maps: grown, they were written again; replaced, a worker,
    which maps them again by their names, reads the new one), each with its inode, size and
    time now; ``check()`` refuses one changed since. ``addresses``: where the source reads
    through the maps of ``paths`` (an Arrow table's buffers), to refuse a file already cut.
    Pickled with its source: a worker checks the stamps the source was made with. ``check()``
    stats them each time where that is cheap, else at most 1% of the time (a network file
    system: two checks in a row over ``_CHEAP_FILE_S`` a file)."""

    _spent = 0.0  # (the last check's time: the first is taken as cheap)
    _cheap_s = _CHEAP_S  # (a check costlier than this, twice: a pickle of an older one)

    def __init__(self, who: str, arrays: Iterable[np.ndarray] = (), paths: Iterable[str] = (),
                 remedy: str = _RENAME, addresses: Iterable[int] = ()) -> None:
        self.who, self.remedy, paths = who, remedy, list(paths)
        stamps: dict[str, Any] = {}
        for array in arrays:
            mapped = memmap_under(array)
            path = None if mapped is None else os.fspath(mapped.filename)  # type: ignore[arg-type]
            if mapped is not None and path is not None and path not in stamps:
                stamps[path] = _stamp(path, mapped.mode in ("r+", "w+"),
                                      mapped.offset > 0 and _npy(path), False)
                _refuse_short(who, path, mapped, stamps[path])
        for path in paths:
            stamps.setdefault(path, _stamp(path, False, True, True))
        _refuse_cut_maps(who, [p for p in paths if stamps[p] is not None], list(addresses),
                         remedy)
        self.stamps = [(path, stamp) for path, stamp in stamps.items() if stamp is not None]
        self._said = set[str]()  # (the files that grew, warned of)
        self._next_at = 0.0  # (perf_counter: the next check's time, 100x the last's after it)
        self._cheap_s = max(_CHEAP_S, _CHEAP_FILE_S * len(self.stamps))
        self._soon_at = 0.0  # (perf_counter: when soon() next checks)

    def watch(self, soon: bool = False) -> None:
        """``check()`` (``soon``: ``soon()``) where a file is stamped: a source's
        ``check_mapped``, before each batch a loader makes of it."""
        if self.stamps:
            self.soon() if soon else self.check()

    def soon(self) -> None:
        """``check()`` where ``_SOON_S`` has passed since the last (a record's read, each
        ~1 us: a stat each, 2.6 us, read them at half their speed; a loader's batch maker
        checks each batch as well)."""
        if perf_counter() >= self._soon_at:
            self.check()

    def check(self) -> None:
        """Refuses a file changed in place since its stamp (the same inode): cut shorter, or,
        mapped read-only, rewritten (a ``.npy`` or Arrow file grown too); one of ``paths``
        replaced too. A raw file that grew is warned of, once (an append, a token file another
        job writes, reads as before; a rewrite, larger, would not). One mapped to be written
        (``r+``), written, is not."""
        start = perf_counter()
        if start < self._next_at:
            return
        for path, (inode, size, mtime, writable, fixed, by_name) in self.stamps:
            try:
                now = os.stat(path)
            except OSError:
                continue
            if now.st_ino != inode and by_name:
                raise RecordError(
                    f"{self.who}: the memory-mapped file {path!r} was replaced since the "
                    "source was made (another file by its name): a worker process maps it by "
                    f"its name, and would read other data than this one; {self.remedy}")
            if now.st_ino != inode or writable and now.st_size >= size or (
                    now.st_size, now.st_mtime_ns) == (size, mtime):
                continue
            if now.st_size > size and not fixed:
                if path not in self._said:
                    self._said.add(path)
                    warnings.warn(
                        f"{self.who}: the memory-mapped file {path!r} grew since the source "
                        f"was made ({size:,} bytes then, {now.st_size:,} now): its first "
                        f"{size:,} bytes are read as mapped, and are the data if it was only "
                        "appended to; if it was written again, batches mix versions: write a "
                        "new file and rename it over (os.replace)", JaxloaderWarning,
                        stacklevel=2)
                continue
            raise RecordError(
                f"{self.who}: the memory-mapped file {path!r} changed in place since the "
                f"source was made ({size:,} bytes then, {now.st_size:,} now; modified since):"
                " reading it would mix versions, or kill the process (SIGBUS) where it was "
                f"cut; {self.remedy}")
        spent = perf_counter() - start
        self._soon_at = start + _SOON_S
        cost, self._spent = min(spent, self._spent), spent  # (the cheaper of the last two)
        if cost > self._cheap_s:  # (local files: each time, a change seen at once)
            self._next_at = start + spent + 100 * cost


def changed_under(source: Any) -> str | None:
    """What changed of the memory-mapped files ``source`` (or a source it reads) was made with,
    as ``MappedFiles.check`` says it, or None: a worker that failed to start is told it (it
    unpickles a ``Dataset`` by mapping its files again by name, and one cut since failed in
    Arrow's words, naming no file)."""
    for held in (vars(source).values() if hasattr(source, "__dict__") else ()):
        if isinstance(held, MappedFiles):
            held._next_at = 0.0  # (checked now, whenever the last check was)
            try:
                held.check()
            except RecordError as e:
                return str(e)
    return next((said for part in parts_of(source) if (said := changed_under(part))), None)


def _refuse_short(who: str, path: str, mapped: np.memmap, stamp: tuple | None) -> None:
    """Refuses a file cut shorter than the array mapped from it needs before the source was
    made (``np.save`` of a smaller array over it after ``np.load(mmap_mode=...)``): stamped as
    it is now, no later check would see it, and the first read past its end killed the process
    (SIGBUS) without a word."""
    held = getattr(mapped, "_mmap", None)  # (np.memmap's map, shared by its views: from the
    # allocation boundary below its offset, through the array's end)
    need = (mapped.offset - mapped.offset % mmap.ALLOCATIONGRANULARITY + len(held)
            if isinstance(held, mmap.mmap) else mapped.offset + mapped.nbytes)
    if stamp is not None and stamp[1] < need:
        raise ConfigError(
            f"{who}: the memory-mapped file {path!r} holds {stamp[1]:,} bytes, fewer than the "
            f"{need:,} mapped from it ({mapped.dtype} {mapped.shape}): it was cut or written "
            "again in place since it was mapped, and reading past its end would kill the "
            "process (SIGBUS); map it again once it is written "
            "(np.load(path, mmap_mode='r')), and " + _REPLACE)


def _refuse_cut_maps(who: str, paths: list[str], addresses: list[int], remedy: str) -> None:
    """Refuses a file of ``paths`` (Arrow's) cut since this process mapped it (``load_from_disk``,
    then the file written again): the source's first scan of the table read the pages past its
    end and died (SIGBUS), in process and with workers. Linux's ``/proc/self/maps`` says each
    mapping's file and extent; the maps holding ``addresses`` (the table's buffers) are the
    source's (another ``Dataset`` loaded before the file was written keeps its own). Elsewhere
    nothing is checked."""
    if not paths or not addresses:
        return
    maps: dict[str, list[tuple[int, int, int]]] = {}
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6:
                    start, end = (int(a, 16) for a in fields[0].split("-"))
                    maps.setdefault(fields[5].rstrip("\n"), []).append(
                        (start, end, int(fields[2], 16)))
    except OSError:
        return
    held = sorted(addresses)
    for path in paths:
        used = [offset + end - start for start, end, offset in maps.get(os.path.realpath(path), ())
                if bisect.bisect_left(held, start) < bisect.bisect_left(held, end)]
        try:
            size = os.stat(path).st_size
        except OSError:  # (gone since its stamp: the mapping keeps its pages)
            continue
        if used and -(-size // mmap.PAGESIZE) * mmap.PAGESIZE < max(used):
            raise ConfigError(
                f"{who}: the memory-mapped file {path!r} holds {size:,} bytes, fewer than the "
                f"{max(used):,} this process mapped of it: it was cut since it was mapped, and "
                f"reading past its end would kill the process (SIGBUS); {remedy}")


def _stamp(path: str, writable: bool, fixed: bool, by_name: bool) -> tuple | None:
    try:
        found = os.stat(path)
    except OSError:  # (gone already: the mapping keeps its pages)
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns, writable, fixed, by_name


def _npy(path: str) -> bool:
    """Whether ``path`` is a ``.npy`` file (its header fixes its shape: grown, it was written
    again, where a raw file of numbers may be appended to)."""
    try:
        with open(path, "rb") as f:
            return f.read(6) == b"\x93NUMPY"
    except OSError:
        return False
