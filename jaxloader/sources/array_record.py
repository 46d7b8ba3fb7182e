"""``ArrayRecordSource``: the records of one or many ArrayRecord files (Grain's and MaxText's
format), as ``bytes``, parsed by a ``Map`` the user gives.

The files' record counts are read once, at construction; index ``i`` is then record ``i -
starts[k]`` of file ``k``. Each process (every worker) opens its own readers, on first use, at
most ``_MAX_OPEN`` at once (the least recently used closed first: thousands of files under a
1,024-descriptor limit). Each file's identity (size, hashes of its first and last KiB, and of
its last KiB before the zeros its writer pads it with) is taken at construction, and checked
again whenever a reader opens the file, and whenever a stat of a local file after a read finds
its size, time or inode changed (a file rewritten in place, as ``ArrayRecordWriter`` does over
the same path, would be read through the open reader): a state saved over other bytes, or a
file changed under the loader, is refused naming the file. A read that fails (a damaged chunk)
is an error naming the file and its records.
Needs the ``array-record`` package (``pip install "jaxloader[array-record]"``). Remote paths
(``gs://``) are opened by array-record's own reader, in releases built with Riegeli's GCS reader
(0.8.6 is); local paths are checked to exist first.

Example (``tests/sources/test_array_record.py`` runs it)::

    source = jl.ArrayRecordSource(sorted(glob.glob("data/train-*.array_record")))
    loader = jl.DataLoader(source, batch_size=64, shuffle=True,
                           transforms=[jl.Map(lambda raw: parse_example(raw))])
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from jaxloader.base import file_identity
from jaxloader.base.checks import int_indices, record_index
from jaxloader.base.errors import ConfigError, RecordError
from jaxloader.base.loader_names import loader_names
from jaxloader.sources.open_files import OpenFiles
from jaxloader.sources.paths import expand, files_fingerprints
from jaxloader.sources.protocol import Source

_MAX_OPEN = 16  # readers a process keeps open (a full shuffle touches every file: more help)


@loader_names("source")
class ArrayRecordSource(Source):
    """The records of ``paths`` (one path or a list, in that order; a folder or a glob
    pattern stands for its ``*.array_record`` files, sorted) as ``bytes``.

    Example (needs ``pip install array_record``; ``tests/sources/test_array_record.py``)::

        source = jl.ArrayRecordSource("data/")  # data/*.array_record, sorted
        loader = jl.DataLoader(source, batch_size=32, transforms=[jl.Map(decode)])
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike]) -> None:
        self.paths = expand(paths, ".array_record", "ArrayRecordSource")
        counts = []
        for path in self.paths:
            reader = _open(path)
            counts.append(reader.num_records())
            reader.close()
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._identities = [file_identity.whole(path, padded=True) if "://" not in path
                            else [0] for path in self.paths]  # (its writer's zeros at its end)
        self._stats = [_stat(path) for path in self.paths]
        self._readers = OpenFiles(_MAX_OPEN, close=lambda reader: reader.close())

    def __getstate__(self) -> dict:
        return {"paths": self.paths, "starts": self._starts, "identities": self._identities,
                "stats": self._stats}

    def __setstate__(self, state: dict) -> None:
        self.paths, self._starts = state["paths"], state["starts"]
        self._identities = state["identities"]
        self._stats = state.get("stats") or [None] * len(self.paths)
        self._readers = OpenFiles(_MAX_OPEN, close=lambda reader: reader.close())

    def file_identities(self) -> list[tuple[str, list[int]]]:
        """Each local file's path and identity (``jaxloader.base.file_identity.whole``), as read
        when the source was made (a remote file's: ``[0]``, not read)."""
        return list(zip(self.paths, self._identities))

    def close(self) -> None:
        """Closes the readers this process has open (a later read opens them again)."""
        self._readers.close()

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def fingerprint(self) -> str:
        """The files' names (``path_names``, which the same files elsewhere keep) and record
        counts, enough to tell other files, with no read."""
        return self._fingerprints()[0]

    @property
    def older_fingerprints(self) -> tuple[str | None, ...]:  # (base.abilities.OLDER)
        return None, self._fingerprints()[1]  # (2026-11-28's states hold today's)

    def _fingerprints(self) -> tuple[str, str]:
        return files_fingerprints("array_record", len(self), self.paths, self._starts.tobytes())

    def __getitem__(self, index: int) -> bytes:
        index = record_index(index, len(self), "ArrayRecordSource")
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self._read(k, [int(index - self._starts[k])])[0]

    def __getitems__(self, indices: np.ndarray) -> list[bytes]:
        """The records at ``indices``: one read per file touched."""
        indices = int_indices(indices, len(self), "ArrayRecordSource")  # (floats, a mask:
        # refused, as every source's are, not cut to other records)
        files = np.searchsorted(self._starts, indices, side="right") - 1
        out: list[Any] = [None] * len(indices)
        for k in np.unique(files):
            at = np.flatnonzero(files == k)
            records = self._read(int(k), (indices[at] - self._starts[k]).tolist())
            for j, record in zip(at, records):
                out[j] = record
        return out

    def _read(self, k: int, records: list[int], again: bool = True) -> list[bytes]:
        """Records ``records`` of file ``k``; an error naming the file where it changed or
        cannot be read. A stat after the read (one a file a read: a round trip on a network
        file system) finds a file changed since the last read or during this one: refused if
        its identity changed, else (a copy put in its place) read again, once. The reader is
        held open while read (``OpenFiles.using``): with ``read_threads`` over a wrapper's
        ``source[i]``, one thread's open closed the least recently used reader as another read
        through it ("Object closed", told as a damaged file)."""
        path = self.paths[k]
        with self._readers.using(k, lambda: self._opened(k)) as reader:  # (its open's errors
            try:  # as they are: a file changed, named so)
                got = reader.read(records)
            except (RuntimeError, OSError, ValueError) as e:  # (Riegeli's: "Corrupted ...")
                if again and self._stats[k] is not None and _stat(path) != self._stats[k]:
                    self._check(k)  # (rewritten as it was read: named as changed)
                    return self._read(k, records, again=False)
                shown = ", ".join(map(str, records[:4])) + (", ..." if len(records) > 4 else "")
                raise RecordError(
                    f"ArrayRecordSource: file {path!r}, records [{shown}] of it: cannot be read "
                    f"({type(e).__name__}: {e}); the file is damaged: re-create or re-download "
                    "it, or leave it out of the paths") from e
        if self._stats[k] is not None and _stat(path) != self._stats[k]:
            self._check(k)  # (written before or as it was read: records of the new file)
            if again:
                return self._read(k, records, again=False)
        return got

    def _opened(self, k: int) -> Any:
        """File ``k``'s reader, opened (in this process, or again after it was closed) only
        once the file is checked to be the one counted at construction."""
        self._check(k)
        return _open(self.paths[k])

    def _check(self, k: int) -> None:
        """Raises if local file ``k`` is not the one counted at construction; one with the
        same identity (a copy put in its place) is read anew."""
        path = self.paths[k]
        if "://" in path:
            return
        stat = _stat(path)  # (the tail before its padding read where it changed: a reader
        padded = stat != self._stats[k]  # opened again, one of 16, read 64 KiB more each time)
        try:
            now: list[int] | None = file_identity.whole(path, padded=padded)
        except OSError:
            now = None
        if now != self._identities[k][:None if padded else 3]:
            raise file_identity.changed_error("ArrayRecordSource", path, self._identities[k],
                                              now, "records")
        if stat != self._stats[k]:
            self._stats[k] = stat
            self._readers.drop(k)

    def __repr__(self) -> str:
        return f"ArrayRecordSource({len(self)} records in {len(self.paths)} file(s))"


def _open(path: str) -> Any:
    try:
        from array_record.python import array_record_module
    except ImportError as e:
        raise ConfigError(
            "ArrayRecordSource needs the array-record package, which is not installed: pip "
            "install \"jaxloader[array-record]\" (or pip install array-record)"
        ) from e
    if "://" not in path and not os.path.exists(path):
        raise ConfigError(f"ArrayRecordSource: file {path!r} does not exist; check the path")
    try:
        reader = array_record_module.ArrayRecordReader(path)
        opened, why = reader.ok(), ""
    except RuntimeError as e:  # (array-record 0.5 raises where later releases say not ok())
        opened, why = False, f" ({e})"
    if not opened and "://" in path:
        raise ConfigError(
            f"ArrayRecordSource: the array-record reader could not open {path!r}{why}: remote "
            "paths are opened by array-record's own reader (gs:// in releases built with "
            "Riegeli's GCS reader, such as 0.8.6); check the path, the credentials and the "
            "installed array-record, or copy the files to a local disk"
        )
    if not opened:
        raise ConfigError(
            f"ArrayRecordSource: file {path!r} could not be opened as an ArrayRecord file"
            f"{why}: it is not one, or it is cut short or damaged (its index is at its end); pass "
            "ArrayRecord files only, and re-create or re-download a damaged one"
        )
    return reader


def _stat(path: str) -> tuple[int, int, int] | None:
    """``file_identity.stat``; ``None`` also for a file that cannot be found (the identity's
    check then names it)."""
    try:
        return file_identity.stat(path)
    except OSError:
        return None
