"""What a file is, in a loader's state: its size and hashes of its bytes, not its time.

A saved position means the same records only over the same bytes. File sources and stream shards
therefore record each file's identity as they open it, and a restore over a file whose identity
changed is refused, naming it (a stream: the shard it was in; a source: every file it reads):

    a stream shard     {"size", "head", "tail"}: CRC-32s of its first and last KiB (``ends``)
    a Parquet file     [size, CRC-32 of its footer (row groups' offsets, sizes and statistics),
                        CRC-32 of the data before it in the same read (its last rows' bytes)]
    an ArrayRecord     [size, CRC-32 of its first KiB, of its last KiB] (``whole``)

Content, not a modification time: a dataset copied to another disk (``cp``, ``gsutil cp``)
keeps its identity and resumes; an edit inside a file that keeps its size and both ends (or
its footer and its last data) is not seen.

Example:
    >>> import io
    >>> ends(io.BytesIO(b"0123456789"))["size"]
    10
"""

from __future__ import annotations

import errno
import os
import weakref
from stat import S_ISREG
import zlib
from typing import Any, Sequence

from jaxloader.base.errors import RecordError, StateDictError

ENDS_BYTES = 1024  # a stream shard's first and last bytes, hashed into its identity
_PARQUET_TAIL = 8  # a Parquet file ends with its footer's length (4 bytes) and b"PAR1"
_TAIL_BYTES = 64 << 10  # read at once from a Parquet file's end: its footer with them (pyarrow's
# own first read of a footer is as long)
RAY_NODE: str | None = None  # this process's node where it is a Ray actor (ray_actor sets it)


def not_on_this_node(path: str) -> str:
    """What a file missing in a Ray actor may mean, for its error (``""`` in other processes
    and for a remote path): its node has no such file, where the training process's has.

    Example:
        >>> not_on_this_node("/data/a.parquet")  # (not in an actor: nothing to add)
        ''
    """
    if RAY_NODE is None or "://" in path:
        return ""
    return (f"; or this Ray actor's node ({RAY_NODE}) has no such file: the actors open the "
            "files by the paths the training process gave, so each node needs them there (on "
            "storage every node mounts, or in a bucket: gs://, s3://), or use local workers "
            "(num_workers=) where the files are")


def open_binary(path: str) -> Any:
    """``path`` opened for reading bytes: a local file, or a remote one (``gs://``) through
    ``etils.epath``, the path layer Orbax uses. A local one is opened without waiting (a
    FIFO's open waits for a writer: a file replaced by one hung the loader) and refused where
    it is not a regular file (a FIFO, a device, a socket, whose reading would wait or never
    end); a folder is refused by ``open()`` itself, naming it."""
    if "://" in path:
        from etils import epath

        return epath.Path(path).open("rb")
    raw: Any
    try:
        raw = open(path, "rb", opener=lambda name, flags: os.open(name, flags | _NO_WAIT))
    except BlockingIOError:  # (a lease another process holds: waited for, as before)
        raw = open(path, "rb") if S_ISREG(os.stat(path).st_mode) else None
    try:
        if raw is None or not S_ISREG(os.fstat(raw.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, a device or a socket, "
                                        "whose reading would wait or never end); put the data "
                                        "in a file and name that", path)
        if _NO_WAIT:
            os.set_blocking(raw.fileno(), True)  # (a network file system may honour it)
    except BaseException:
        if raw is not None:
            raw.close()
        raise
    _OPEN.add(raw)
    return raw


_NO_WAIT = getattr(os, "O_NONBLOCK", 0)
_OPEN: weakref.WeakSet = weakref.WeakSet()  # the local files open_binary opened, still held


def _forking() -> None:
    """Notes where each file ``open_binary`` opened is, as this process forks: the child's
    copy starts there (after the fork, this process reads on at once, and moved the offset
    they share before the child took it)."""
    _AT.clear()
    try:
        files = list(_OPEN)
    except RuntimeError:  # (another thread opened a file as this one forks: the child takes
        return  # the offsets as it starts instead)
    for raw in files:
        try:
            _AT[raw.fileno()] = os.lseek(raw.fileno(), 0, os.SEEK_CUR)
        except (OSError, ValueError):  # (closed meanwhile)
            continue


_AT: dict[int, int] = {}  # descriptor -> offset, as this process forks


def _forked() -> None:
    """In a forked child, each local file ``open_binary`` opened gets an offset of its own,
    the one the parent's had: the two shared one, and a child that read its copy of a stream
    (a loader without workers) moved the parent's reads, whose batches lost, repeated and
    garbled records without a word (the process-model audit). Its descriptor's number stays,
    so the file object over it goes on as it was."""
    for raw in list(_OPEN):
        if raw.closed:
            continue
        fd = raw.fileno()
        try:
            at = _AT[fd] if fd in _AT else os.lseek(fd, 0, os.SEEK_CUR)
            own = os.open(f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else raw.name,
                          os.O_RDONLY | os.O_CLOEXEC)  # (through /proc: the same file, even
        except OSError:  # one renamed since)
            raw.close()  # (read no more here: a read in this child would fail, not move the
            continue  # parent's offset)
        try:
            os.lseek(own, at, os.SEEK_SET)
            os.dup2(own, fd, inheritable=False)
        finally:
            os.close(own)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_forking, after_in_child=_forked, after_in_parent=_AT.clear)


def ends(raw: Any, size: int | None = None, skip: int = 0) -> dict[str, int]:
    """``{"size", "head", "tail"}`` of the file ``raw`` (binary, seekable; left at its start):
    its size, and CRC-32s of its first and of its last KiB (of its first ``size`` bytes, if
    given: the file as it was before records were appended); the tail never reaches into its
    first ``skip`` bytes (a compressed file's header, where gzip writes a time)."""
    end = raw.seek(0, os.SEEK_END) if size is None else size
    raw.seek(0)
    head = raw.read(min(end, ENDS_BYTES))
    start = min(end, max(skip, end - ENDS_BYTES))
    raw.seek(start)
    tail = raw.read(end - start)
    raw.seek(0)
    return {"size": end, "head": zlib.crc32(head), "tail": zlib.crc32(tail)}


def parquet(path: str) -> list[int]:
    """``[size, CRC-32 of the footer, CRC-32 of the data before it]`` of the Parquet file at
    ``path``: the data the footer's read holds (64 KiB less the footer, or a KiB), the last column
    chunks' bytes, which rows moved within their row groups change where the footer (sizes,
    statistics) stays the same (pyarrow's default writer, values that do not compress)."""
    with open_binary(path) as raw:
        return parquet_tail(raw)[0]


def parquet_tail(raw: Any) -> tuple[list[int], bytes]:
    """``parquet``'s identity of the open file ``raw``, and the file's last bytes, which hold
    its footer (what ``pyarrow.parquet.read_metadata`` parses): one read where the footer is
    under ``_TAIL_BYTES``, as most are (a round trip a read on remote storage)."""
    size = raw.seek(0, os.SEEK_END)
    if size < _PARQUET_TAIL:  # (the whole file: pyarrow says what it lacks)
        raw.seek(0)
        return [size, 0, 0], raw.read(size)
    start = max(0, size - _TAIL_BYTES)
    raw.seek(start)
    tail = raw.read(size - start)
    length = int.from_bytes(tail[-_PARQUET_TAIL:-4], "little")
    if start and length + _PARQUET_TAIL + ENDS_BYTES > len(tail):  # (a footer larger than
        # the read, or with less than a KiB of data before it there)
        start = max(0, size - _PARQUET_TAIL - length - ENDS_BYTES)  # (and the data's last KiB)
        raw.seek(start)
        tail = raw.read(size - start)
    at = max(0, len(tail) - _PARQUET_TAIL - length)
    return [size, zlib.crc32(tail[at:at + length]), zlib.crc32(tail[:at])], tail


# what a connection, and the file systems over one, give up with (aiohttp's ClientOSError, a
# socket's OSError, are no ConnectionError: their errno says it)
_NETWORK_ERRNOS = {errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.ETIMEDOUT,
                   errno.EPIPE, errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTUNREACH}


def storage_failed(error: BaseException) -> bool:
    """Whether ``error`` is the storage's or the network's failing (``storage_failure``)."""
    return isinstance(error, (ConnectionError, TimeoutError)) or (
        isinstance(error, OSError) and error.errno in _NETWORK_ERRNOS)


def storage_failure(owner: str, path: str, what: str, error: Exception) -> Exception:
    """The error (of ``error``'s type) for a file the storage or the network failed to give
    (a ``ConnectionError``, a ``TimeoutError``): not the file's fault, so not "damaged" or "not
    found", and worth trying again."""
    message = (f"{owner}: {path!r}: reading {what} failed ({type(error).__name__}: {error}): "
               "the storage or the network failed, not the file; try again (remote file "
               "systems retry before they give up: gcsfs's and s3fs's retries= settings)")
    try:
        return type(error)(message)
    except Exception:  # noqa: BLE001 - a type of its own that takes other arguments
        return OSError(message)


def stat(path: str) -> tuple[int, int, int] | None:
    """A local file's size, modification time and inode, which change when it is written
    (``None`` for a remote one: a stat is a round trip there); ``OSError`` where it is gone."""
    if "://" in path:
        return None
    found = os.stat(path)
    return found.st_size, found.st_mtime_ns, found.st_ino


def whole(path: str, padded: bool = False) -> list[int]:
    """``[size, CRC-32 of the first KiB, CRC-32 of the last KiB]`` of the file at ``path``;
    ``padded``: and ``data_tail``'s (a file its writer ends with zeros, as ``ArrayRecordWriter``
    does: its last KiB the same in every file, where its last records' edits are)."""
    with open_binary(path) as raw:
        found = ends(raw)
        last = [data_tail(raw, found["size"])] if padded else []
    return [found["size"], found["head"], found["tail"], *last]


def data_tail(raw: Any, size: int) -> int:
    """The CRC-32 of the last KiB of the plain file ``raw`` (``size`` bytes) before the zero
    bytes it ends with, and of where that is, looked for in its last MiB (a tar's two zero
    blocks and its record's padding, an ArrayRecord file's: the same in every file, where its
    last records' edits are); ``raw`` left at its start."""
    end = size
    while end > max(0, size - (1 << 20)):
        start = max(0, end - (64 << 10), size - (1 << 20))
        raw.seek(start)
        data = raw.read(end - start).rstrip(b"\0")
        if data:
            end = start + len(data)
            break
        end = start
    raw.seek(max(0, end - ENDS_BYTES))
    tail = zlib.crc32(raw.read(min(end, ENDS_BYTES)))
    raw.seek(0)
    return zlib.crc32(end.to_bytes(8, "little"), tail)  # (and where it ends: a record put in
    # the middle, which the padding's room kept at the same size, moves it)


def change(then: list[int], now: list[int], path: str = "", parquet: bool | None = None) -> str:
    """What differs between two identities of a file (``parquet``, ``whole``), in words: of
    the parts a Parquet file's identity holds or another's (told by ``parquet``, else by the
    name ``path``: both where neither tells)."""
    if then[0] != now[0]:
        return f"size {then[0]:,} bytes then, {now[0]:,} now"
    if len(then) == 2:
        return "the same size, another footer (its row groups' sizes or statistics differ)"
    if len(then) == 4 and then[:3] == now[:3]:  # (an ArrayRecord file's: its index)
        return ("the same size and first and last KiB, another last KiB before the zeros its "
                "writer pads it with (its index: a record of another length)")
    name = os.path.basename(path).lower()
    if parquet is None and name.endswith((".parquet", ".pq", ".parq")):
        parquet = True
    elif parquet is None and "array_record" in name:
        parquet = False
    footer, ends = "its footer, or the rows before it", "other bytes in its first or last KiB"
    return "the same size, " + (footer if parquet else ends if parquet is False else
                                f"{ends} (a Parquet file: {footer})")


def as_now(then: Any, now: Any) -> Any:
    """A state's file identities (``then``) with each written before one more part was
    taken, taken as ``now``'s where the parts it has are the same (wherever it is among
    them): a Parquet file's before 2026-12-02's forty-fifth session, ``[size, footer's
    CRC]``, and an ArrayRecord file's before 2026-12-07, ``[size, head, tail]`` (not
    ``data_tail``'s). Such a state restores, checked as it was then.

    Example:
        >>> as_now([[10, 1], [20, 2]], [[20, 3, 8], [10, 1, 7]])
        [[10, 1, 7], [20, 2]]
    """
    if not isinstance(then, list) or not isinstance(now, list):
        return then

    def older(a: Any) -> bool:  # (of the parts a file's identity had before)
        return isinstance(a, list) and len(a) in (2, 3)

    found = list(then)
    for i, a in enumerate(then):  # (in its place first)
        if older(a) and i < len(now) and isinstance(now[i], list) and \
                len(now[i]) == len(a) + 1 and now[i][:len(a)] == a:
            found[i] = now[i]
    taken, left = {id(f) for f in found}, dict[str, list]()  # (else wherever it is: the
    for b in now:  # files reordered; two of one identity taken in their order)
        if isinstance(b, list) and len(b) in (3, 4) and id(b) not in taken:
            left.setdefault(repr(b[:-1]), []).append(b)
    for i, a in enumerate(then):
        if found[i] is a and older(a) and left.get(repr(a)):
            found[i] = left[repr(a)].pop(0)
    return found


def changed_error(owner: str, path: str, then: list[int], now: list[int] | None,
                  held: str) -> RecordError:
    """The error for a file that is no longer the one ``owner`` read at construction (``now``:
    its identity now, ``None`` where it cannot be read whole), whose ``held`` (its rows, its
    records) the order names."""
    what = (f"it cannot be found or read whole now: moved, or being written?"
            f"{not_on_this_node(path) if not os.path.exists(path) else ''}" if now is None
            else change(then, now, path, parquet=owner == "ParquetSource"))
    return RecordError(
        f"{owner}: file {path!r} changed while the loader reads it ({what}): its {held} are no "
        "longer those the order (and a saved state) names; put the file back, or make a new "
        "source and loader over the files as they are now")


def check_files(then: Any, now: Any, paths: Sequence[str]) -> None:
    """Refuses a state saved over other bytes than a source's files hold now (a state's
    ``"files"``, ``then``, and the source's, ``now``, of ``paths``), naming the files that
    changed, or those added since (by identity: a file among the saved, wherever it was, is
    not new).

    Example:
        >>> check_files([[10, 1]], [[10, 1], [20, 2]], ["a.parquet", "b.parquet"])
        Traceback (most recent call last):
        ...
        jaxloader.base.errors.StateDictError: state['files']: the state was saved over 1 file...
    """
    if then == now:
        return
    if not isinstance(then, list) or not isinstance(now, list):
        raise StateDictError(
            f"state['files']: expected the identities of the source's {len(now or ())} files "
            f"(state_dict() records them), received {'none' if then is None else then!r:.80}: "
            "a state edited by hand or saved by another jaxloader version; restore a state "
            "this version saved over the same files")
    named = [paths[i] if i < len(paths) else f"file {i}" for i in range(len(now))]
    if len(then) != len(now):
        saved, read = set(map(str, then)), set(map(str, now))
        new = [name for name, b in zip(named, now) if str(b) not in saved]
        gone = sum(str(a) not in read for a in then)
        raise StateDictError(
            f"state['files']: the state was saved over {len(then)} file(s), the source reads "
            f"{len(now)}" + (f"; not among the saved: {', '.join(new[:3])}"
                             f"{', ...' if len(new) > 3 else ''} (added or changed since)"
                             if new else "") +
            (f"; {gone} saved file(s) are not read now (removed or changed)" if gone else "") +
            ": the saved step would read other records than it named; restore over the files "
            "the state was saved over (a folder read whole: pass the saved files by name), or "
            "start the run again without this state")
    changed = [f"{name}: {change(a, b, name)}" for name, a, b in zip(named, then, now) if a != b]
    raise StateDictError(
        f"state['files']: {len(changed)} of the source's {len(now)} files changed since the "
        f"state was saved, or are other files ({'; '.join(changed[:3])}"
        f"{'; ...' if len(changed) > 3 else ''}): the saved step would read other records "
        "than it named; restore over the files the state was saved over, as they were (put "
        "them back), or start the run again without this state")
