"""What crosses to a worker: the batch maker and init function, by ``cloudpickle``.

Lambdas, notebook functions and classes defined in ``__main__`` cross by value (also a script
run as ``__mp_main__``, a ``multiprocessing`` spawn or forkserver child's), and so do
``functools.cache`` / ``lru_cache`` functions defined there (cloudpickle would name them, and
a worker has no such name: each worker gets its own empty cache of the same size). Large NumPy
arrays anywhere in the payload (an ``ArraySource``'s leaves, arrays captured by a closure) do not
cross as bytes: ``dumps`` copies each once into a shared-memory segment owned by the main process
and pickles a reference, and ``loads`` maps it, read-only, in the worker (a ``JoinedArrays``,
the alike parts of a ``ConcatSource``, is copied part by part into one segment). 10 GB of arrays then
cost 10 GB however many workers there are; so do Arrow tables (an in-memory ``datasets.Dataset``),
as their IPC stream, read in place. Memory-mapped ``.npy`` arrays and their views cross
as their file (on Linux, checked to be the one mapped; a copy-on-write map written to is
copied); a view whose elements overlap (windows) as the bytes it spans and its strides.

Example:
    >>> import numpy as np
    >>> shared = []
    >>> blob = dumps({"a": np.ones(1 << 20, np.uint8)}, shared.append)
    >>> loads(blob)["a"].sum(), len(shared)
    (np.uint64(1048576), 1)
    >>> shared[0].destroy()
    True
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import importlib
import io
import itertools
import os
import pickle
import threading
from typing import Any, Callable

import numpy as np

from jaxloader.base.columns import byte_span, memmap_under, overlapping
from jaxloader.base.errors import ConfigError, SharedMemoryError
from jaxloader.sources.concat import JoinedArrays
from jaxloader.workers.by_value import GlobalsByName, importable, script_by_value
from jaxloader.workers.source_copies import NOTED_MIN_BYTES
from jaxloader.runtime.descriptors import out_of_descriptors
from jaxloader.runtime.shm import SLOTS_REMEDY, Segment, attach

_MAPPED = ("a memory-mapped file, which the workers map and nothing is copied (np.save(path, "
           "array), then np.load(path, mmap_mode='r')), or num_workers=0")
SHARE_MIN_BYTES = 1 << 20  # arrays under 1 MiB cross as plain bytes: a segment costs more
_ONE_EACH = ("each array of a source of 1 MiB or more goes to the workers in a memory file of "
             "its own, a descriptor each while the loader lives: hold the records' arrays in "
             "fewer, larger ones (an ArraySource of columns, or np.stack them), or pass "
             "num_workers=0")
SPLIT_MIN_BYTES = 64 << 20  # copies over 64 MiB run on up to 4 threads: faulting in fresh
# shared pages is CPU-bound, and it is on the path to the first batch


class _Pickler(GlobalsByName):
    def __init__(self, file: io.BytesIO, keep: Callable[[Segment], None],
                 note: Callable[[np.ndarray], None] | None = None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._keep, self._note = keep, note or (lambda array: None)
        self._shared: dict[int, tuple[tuple, Any]] = {}
        self._mappings: _Mappings | None = None  # read at the first memmap

    def persistent_id(self, obj: Any) -> Any:
        mapped = memmap_under(obj) if type(obj) in (np.memmap, np.ndarray) else None
        if mapped is not None:
            if self._mappings is None:
                self._mappings = _Mappings()
            found = _as_its_file(obj, mapped, self._mappings)
            if found is not None:
                return found
        if type(obj).__name__ == "Table" and type(obj).__module__.startswith("pyarrow") and \
                obj.nbytes >= SHARE_MIN_BYTES and (modules := _registering(obj.schema)) is not None:
            return self._share_table(obj, modules)
        if type(obj) not in (np.ndarray, JoinedArrays, np.memmap) \
                or obj.nbytes < SHARE_MIN_BYTES or obj.dtype.hasobject:
            if type(obj) is np.ndarray and obj.nbytes >= NOTED_MIN_BYTES:
                self._note(obj)  # (a copy in the pickle: as fixed as one in shared memory)
            return None
        ref, _ = self._shared.get(id(obj), (None, None))
        if ref is None and type(obj) is not JoinedArrays and overlapping(obj):
            ref = self._share_span(obj)
        if ref is None:
            segment = self._make(obj.nbytes)
            shared = np.ndarray(obj.shape, obj.dtype, buffer=segment.memory)
            if type(obj) is JoinedArrays:  # each part into its rows
                ends = np.cumsum([len(part) for part in obj.arrays])
                for part, end in zip(obj.arrays, ends):
                    _copy(shared[end - len(part):end], part)
                    self._note(part)
            else:
                _copy(shared, obj)
                self._note(obj)
            ref = ("shm", segment.name, segment.size, obj.shape, obj.dtype)  # (the dtype
            # itself: a bfloat16's or a structured dtype's .str is raw bytes, "<V2")
            self._shared[id(obj)] = ref, obj  # obj kept: its id is not reused while pickling
        return ref

    def _make(self, nbytes: int) -> Segment:
        try:
            segment = Segment.create(nbytes, prefault=False)
        except SharedMemoryError as e:
            cause = e.__cause__
            if not (isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE)):
                raise SharedMemoryError(  # (the slots' remedy in its place, which changes
                    f"the source's array {len(self._shared) + 1} ({nbytes:,} bytes) is shared "
                    "with the workers as a copy in memory, which could not be made: " + str(
                        e).replace(SLOTS_REMEDY.capitalize(), f"Read it from {_MAPPED}").replace(
                        SLOTS_REMEDY, f"read it from {_MAPPED}")) from e  # nothing of its size)
            raise out_of_descriptors(cause, f"the source's array {len(self._shared) + 1} "
                                     f"of {SHARE_MIN_BYTES >> 20} MiB or more", _ONE_EACH) \
                from cause
        self._keep(segment)  # before the copy: its owner destroys it if the copy fails
        return segment

    def _share_table(self, table: Any, modules: list[str]) -> tuple:
        """An Arrow table (an in-memory ``datasets.Dataset``'s) crosses as its IPC stream in a
        segment, which a worker reads without a copy: pickled, each worker held its own. The
        worker imports ``modules`` first: they register its extension types."""
        import pyarrow as pa

        ref, _ = self._shared.get(id(table), (None, None))
        if ref is None:
            sink = pa.MockOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            segment = self._make(max(1, sink.size()))
            with pa.ipc.new_stream(pa.FixedSizeBufferWriter(pa.py_buffer(segment.memory)),
                                   table.schema) as writer:
                writer.write_table(table)
            ref = ("arrow", segment.name, segment.size, sink.size(), tuple(modules))
            self._shared[id(table)] = ref, table
        return ref

    def _share_span(self, obj: np.ndarray) -> tuple:
        """A view whose elements overlap (``sliding_window_view``'s windows, a
        ``broadcast_to``) crosses as the bytes it spans and its strides: a copy of its
        elements would be up to a window's length times larger."""
        start, size = byte_span(obj)
        segment = self._make(size)
        np.ndarray(size, np.uint8, buffer=segment.memory)[:] = np.ctypeslib.as_array(
            (ctypes.c_ubyte * size).from_address(start))
        first = obj.__array_interface__["data"][0] - start
        ref = ("span", segment.name, segment.size, obj.shape, obj.dtype, first, obj.strides)
        self._shared[id(obj)] = ref, obj
        return ref


def _registering(schema: Any) -> list[str] | None:
    """The modules that register ``schema``'s Arrow extension types (at any depth), which a
    worker imports before it reads the table; ``None`` where one is not importable (a type
    of ``__main__``'s: the table is pickled, and the type with it, as before)."""
    import pyarrow as pa

    found: set[str] = set()
    types_ = [field.type for field in schema]
    while types_:
        kind = types_.pop()
        if isinstance(kind, pa.ExtensionType):
            if type(kind).__module__.startswith("pyarrow"):
                pass  # (pyarrow's own: registered as it is imported)
            elif not importable(type(kind)):
                return None
            else:
                found.add(type(kind).__module__)
            kind = kind.storage_type
        types_ += [kind.field(i).type for i in range(kind.num_fields)]
    return sorted(found)


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src``, split by rows over threads when large (NumPy copies without the GIL)."""
    parts = min(4, os.cpu_count() or 1, len(src) if src.ndim else 1)
    if src.nbytes < SPLIT_MIN_BYTES or parts < 2:
        dst[...] = src
        return
    bounds = [len(src) * i // parts for i in range(parts + 1)]
    errors: list[BaseException] = []

    def copy_rows(a: int, b: int) -> None:
        try:
            np.copyto(dst[a:b], src[a:b])
        except BaseException as e:  # noqa: BLE001 - raised in the calling thread below
            errors.append(e)

    helpers = [threading.Thread(target=copy_rows, args=bounds_, daemon=True)
               for bounds_ in itertools.pairwise(bounds[1:])]
    for helper in helpers:
        helper.start()
    try:
        np.copyto(dst[:bounds[1]], src[:bounds[1]])
    finally:
        for helper in helpers:
            helper.join()
    if errors:  # a part not copied must not pass for shared data
        raise errors[0]


def _as_its_file(array: np.ndarray, mm: np.memmap, mappings: "_Mappings") -> tuple | None:
    """``array`` (``mm`` or a view of it) as ``mm``'s file's name, place and identity (device,
    inode), or ``None`` where the file would not give a worker the array's bytes: a
    copy-on-write map (``mmap_mode="c"``) written to, or a file replaced since it was mapped
    (Linux names the mapped file ``(deleted)``, or by another name). Those cross as other
    arrays do, copied (and so does any copy-on-write map where Linux's word is not to be had)."""
    filename = os.fspath(mm.filename or "")  # (memmap_under: a name)
    try:
        found = os.stat(filename)
    except OSError:
        return None
    mapped = mappings.at(_base_address(mm))
    if mapped is None and mm.mode == "c":
        return None
    if mapped is not None and (mapped[0] != os.path.realpath(filename)
                               or mm.mode == "c" and mapped[1]):
        return None
    array = np.asarray(array)
    offset = array.__array_interface__["data"][0] - _base_address(mm)
    return ("memmap", filename, mm.offset + offset, array.shape, array.dtype,
            array.strides, (found.st_dev, found.st_ino))


class _Mappings:
    """This process's memory mappings as Linux's ``/proc/self/smaps`` gives them, read once
    for a payload's memmaps: each one's path (`` (deleted)`` after it once replaced or
    removed; its device and inode are the layer's below on overlay file systems, not
    ``os.stat``'s) and bytes written copy-on-write (``Anonymous``). None where not readable."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._spans: list[list] = []  # [end, path, anonymous bytes]
        try:
            with open("/proc/self/smaps", encoding="utf-8", errors="surrogateescape") as smaps:
                for line in smaps:
                    head = line.split(None, 5)
                    if head and ":" not in head[0]:  # a mapping's line: its span first
                        start, _, end = head[0].partition("-")
                        path = head[5].rstrip("\n") if len(head) > 5 else ""
                        self._starts.append(int(start, 16))
                        self._spans.append([int(end, 16), path, 0])
                    elif head and head[0] in ("Anonymous:", "Swap:") and self._spans:
                        self._spans[-1][2] += int(head[1]) * 1024  # (written pages swapped
                        # out count as Swap)
        except (OSError, ValueError):
            self._starts, self._spans = [], []

    def at(self, address: int) -> tuple[str, int] | None:
        """``(path, anonymous bytes)`` of the mapping holding ``address``, or None."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0 or address >= self._spans[i][0]:
            return None
        return self._spans[i][1], self._spans[i][2]


def _base_address(mm: np.memmap) -> int:
    base: np.ndarray = mm
    while isinstance(base.base, np.ndarray):
        base = base.base
    return np.asarray(base).__array_interface__["data"][0]


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self._loaded: dict[tuple, Any] = {}  # pickle does not memoize persistent ids

    def persistent_load(self, pid: tuple) -> Any:
        array = self._loaded.get(pid)
        if array is None:
            array = self._loaded[pid] = self._load(pid)
        return array

    @staticmethod
    def _load(pid: tuple) -> Any:
        if pid[0] == "arrow":  # (zero-copy: the table's buffers are the segment's)
            import pyarrow as pa

            _, name, size, used, modules = pid
            for module in modules:
                importlib.import_module(module)
            return pa.ipc.open_stream(pa.py_buffer(attach(name, size)).slice(0, used)).read_all()
        if pid[0] == "shm":
            _, name, size, shape, dtype = pid
            array = np.ndarray(shape, np.dtype(dtype), buffer=attach(name, size))
        elif pid[0] == "span":
            _, name, size, shape, dtype, first, strides = pid
            array = np.ndarray(shape, np.dtype(dtype), buffer=attach(name, size), offset=first,
                               strides=strides)
        else:
            _, filename, offset, shape, dtype, strides, identity = pid
            try:
                found = os.stat(filename)
                now = f"device and inode {(found.st_dev, found.st_ino)}"
            except OSError as e:
                found, now = None, f"{type(e).__name__}: {e.strerror}"
            if found is None or (found.st_dev, found.st_ino) != identity:
                raise ConfigError(
                    f"{filename}: replaced or removed since the loader's payload was made "
                    f"({now}, expected device and inode {identity}): a worker would read "
                    "other data than the training process maps; replace files by writing a "
                    "new name, or make the loader again after replacing one")
            try:
                mm = np.memmap(filename, dtype=np.uint8, mode="r")
                array = np.ndarray(shape, np.dtype(dtype), buffer=mm, offset=offset,
                                   strides=strides)
            except (ValueError, TypeError) as e:  # (cut since: empty, or short of the array)
                raise ConfigError(
                    f"{filename}: changed in place since the loader's payload was made "
                    f"({found.st_size:,} bytes now; {type(e).__name__}: {e}): a worker cannot "
                    "map the array the training process does; replace files by writing a new "
                    "name, and make the loader again after replacing one") from e
        array.flags.writeable = False  # the source is shared: a transform must not write it
        return array


def dumps(obj: Any, keep: Callable[[Segment], None],
          note: Callable[[np.ndarray], None] | None = None) -> bytes:
    """Pickles ``obj``; each shared segment is passed to ``keep`` (its owner must destroy it),
    each array copied into one to ``note`` (``source_copies``)."""
    script_by_value()
    buffer = io.BytesIO()
    _Pickler(buffer, keep, note).dump(obj)
    return buffer.getvalue()


def loads(blob: bytes) -> Any:
    return _Unpickler(io.BytesIO(blob)).load()
