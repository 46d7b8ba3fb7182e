"""Arrays found once from a source's records and kept in a ``.npy`` file for the next run: a
``PackedSource``'s lengths, a ``FilteredSource``'s indices.

Beside the file, ``<file>.from`` says what the array was found from (the source's fingerprint
and, for a filter, its predicate's code digest: ``sources.code_digest``) and which array it
is of (its digest), written before the array: a run cut short between the two (a full disk,
a killed job) leaves a ``.from`` that names another array, found again. A file found from
other data, or by another predicate, is found again and saved over, with a warning naming
which changed: read back, it would give rows that lost tokens or records the predicate no
longer keeps, without a word. A file without its ``.from`` (the user's own, or one an earlier
jaxloader wrote) is read as it is. An array that cannot be saved is warned of, and used.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "lengths.npy")
    >>> v1 = lambda: {"source": "data v1"}  # (a source's fingerprint, say)
    >>> kept_or_found(path, lambda: np.array([3, 1]), v1)[0].tolist()  # found, then saved
    [3, 1]
    >>> kept_or_found(path, lambda: 1 / 0, v1)[0].tolist()  # read back: not found again
    [3, 1]
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
import warnings
from typing import Any, Callable

import numpy as np

from jaxloader.base.errors import ConfigError, JaxloaderWarning

FROM = ".from"  # the suffix of the file that says what an array was found from


def kept_or_found(given: Any, find: Callable[[], Any],
                  found_from: Callable[[], dict[str, Any]] | None = None,
                  stacklevel: int = 3) -> tuple[Any, str | None]:
    """``(array, path)``: ``given`` itself, or when it is a path, the array in that file; when
    there is none yet, or the file was found from something other than ``found_from()`` says
    (``{what: digest}``, asked only when there is a path; a tuple of digests: today's, then
    those older versions wrote, any of which fits), ``find()`` (saved to the path, if
    one was given). ``path`` is ``None`` when ``given`` is not a path (for messages); the
    warning is said at the caller ``stacklevel`` frames up."""
    path, source = None, None
    if isinstance(given, (str, os.PathLike)):
        path, given = os.fspath(given), None
        source = None if found_from is None else found_from()
        if os.path.exists(path):
            kept_from = _kept_from(path + FROM)
            try:
                given = np.load(path)
            except MemoryError:  # (a header of a damaged file: 10**11 rows, 745 GiB)
                raise ConfigError(
                    f"{path}: its header asks for {_claimed(path)}, more memory than this "
                    f"process has, where the file holds {os.path.getsize(path):,} bytes: a "
                    "damaged .npy file, or not the one this reads and writes; remove it (a new "
                    "one is written), or pass another path") from None
            except (OSError, ValueError, EOFError) as e:  # (a folder, another file's bytes)
                raise ConfigError(
                    f"{path}: expected a .npy file of one array (np.save's), which this reads "
                    f"and writes; it is {'a folder' if os.path.isdir(path) else 'not one'} "
                    f"({type(e).__name__}: {str(e)[:120]}); pass the path of a .npy file "
                    "(a new one is written)") from None
            changed = [] if source is None or kept_from is None else [
                what for what, digest in source.items()
                if kept_from.get(what) not in (digest if isinstance(digest, tuple) else (digest,))]
            why = f"was found from another {' and another '.join(changed)} than this run's" + (
                " (or the same function under another Python's -O flag, which drops asserts "
                "from its code, or, for a file written before 2026-12-01, another Python "
                "version: 3.12 compiles comprehensions inline)"
                if any("function" in what for what in changed) else "")
            if source is not None and kept_from and not changed and kept_from.get(
                    "array") != _array_digest(given):  # (no source: the file as it is)
                changed, why = ["array"], f"is not the array {path + FROM} was written with"
            if changed:
                given = None
                warnings.warn(f"{path} {why} (as {path + FROM} says): found again, and saved "
                              "over it", JaxloaderWarning, stacklevel=stacklevel)
    if given is None:
        if path is not None and found_from is not None:  # (a pass to come, of hours maybe:
            _folder_there(path)  # a path that cannot be saved to said first; no pass, none)
        given = find()
        if path is not None:
            try:
                _save(path, given, source)
            except OSError as e:  # (the pass's work kept: said, and the run goes on)
                warnings.warn(f"{path}: the array found could not be saved ({e.strerror or e}); "
                              "this run goes on with it, and the next finds it again: free "
                              "space there, or pass another path", JaxloaderWarning,
                              stacklevel=stacklevel)
    return given, path


def _folder_there(path: str) -> None:
    """Refuses a path whose folder is not there (a typo, a config's ``~`` or ``$DATA`` not
    expanded), where the array found would be saved: it was said after the pass that found
    it, as a bare error naming a ``.partial`` file. (A folder that cannot be written is said
    after the pass, and the array used: ``kept_or_found``.)"""
    folder = os.path.dirname(path) or os.curdir
    if os.path.isdir(folder):
        return
    unexpanded = (" (~ and $NAME are not expanded in a path: os.path.expanduser, "
                  "os.path.expandvars)" if "~" in path or "$" in path else "")
    raise ConfigError(
        f"{path}: expected a path to save the array found to, whose folder is not there"
        f"{unexpanded}; make the folder, or pass another path")


def check_found_from(given: Any, found_from: Callable[[], dict[str, Any]], owner: str,
                     remedy: str) -> None:
    """Refuses the file ``given`` (when it is a path) whose ``.from`` says it was found from
    other than ``found_from()`` says, where nothing could find it again (``kept_or_found``
    finds it again): its array would be read over other data, without a word."""
    if not isinstance(given, (str, os.PathLike)):
        return
    path = os.fspath(given)
    then = _kept_from(path + FROM) if os.path.exists(path) else None
    if not then:  # (none, or one that cannot be read: the file as it is)
        return
    for what, digest in found_from().items():
        if then.get(what) not in (digest if isinstance(digest, tuple) else (digest,)):
            raise ConfigError(f"{owner}: {path} was found from another {what} than this one "
                              f"(as {path + FROM} says), and nothing here can find it again; "
                              f"{remedy}")


def _kept_from(path: str) -> dict | None:
    """What a ``.from`` file says (``None``: there is none); one that cannot be read says
    nothing this run's digests match (the array is found again)."""
    try:
        with open(path, encoding="utf-8") as f:
            said = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # (unreadable, or not whole JSON)
        return {}
    return said if isinstance(said, dict) else {}


def _save(path: str, array: Any, found_from: dict[str, Any] | None) -> None:
    """What the array was found from, then the array, each written whole or not at all
    (another process, or another host on shared storage, may read or write them at once). In
    that order: an array whose ``.from`` was not written (the disk full, the job killed
    between the two) was read as a file of the user's, unchecked, in every later run."""
    if found_from is None:
        if os.path.exists(path + FROM):
            os.remove(path + FROM)  # (what it said is no longer this file's)
    else:
        said = {**{what: digest[0] if isinstance(digest, tuple) else digest  # (today's)
                   for what, digest in found_from.items()},
                "array": _array_digest(np.asarray(array))}
        _replace(path + FROM, lambda f: f.write(json.dumps(said).encode() + b"\n"))
    _replace(path, lambda f: np.save(f, array))


def _array_digest(array: np.ndarray) -> str:
    """The array's bytes, shape and dtype, digested: a ``.from`` says which array it is of."""
    digest = hashlib.blake2b(f"{array.dtype}{array.shape}".encode(), digest_size=16)
    digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _replace(path: str, write: Callable[[Any], Any]) -> None:
    """``write`` into a file of a name no other process or host uses (opened as ``open`` does:
    its mode from the umask), then moved to ``path`` at once."""
    partial = f"{path}.{uuid.uuid4().hex}.partial"
    try:
        with open(partial, "xb") as f:
            write(f)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise


def _claimed(path: str) -> str:
    """The array a ``.npy`` file's header says it holds: its dtype, shape and bytes."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
        return f"{dtype}{shape} ({int(np.prod(shape, dtype=object)) * dtype.itemsize:,} bytes)"
    except Exception:  # noqa: BLE001 - (a header that cannot be read: the error says it)
        return "an array"
