"""A cheap fingerprint of a source, so that a saved position is not restored into other data.

A step means the same batches only over the same records. The state therefore carries, besides
the source's length, the structure of its first record (leaf paths, dtypes and shapes) and a hash
of a few records at fixed positions (the first, the middle and the last): a few reads, however
large the source. A source may supply its own fingerprint: a ``fingerprint`` attribute (a str,
or a method returning one); a Hugging Face ``datasets.Dataset``'s own is used
(``sources.huggingface``). File sources also name their files' bytes (``source_files``: each
file's size and a hash of its footer or ends, ``jaxloader.base.file_identity``), so that a state
saved over other bytes is refused naming the file that changed.

Example:
    >>> from jaxloader.sources import ArraySource
    >>> fp = source_fingerprint(ArraySource({"x": np.zeros((5, 2), np.float32)}))
    >>> fp["record_spec"], len(fp["record_hash"])
    ("['x']: float32(2,)", 32)
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import threading
import warnings
from typing import Any, Sequence, cast

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.columns import memmap_under
from jaxloader.base.abilities import (RECORDS_AS_BEFORE, array_likes_by_type, digest_level,
                                      file_identities_of, fingerprint_of, in_older_forms,
                                      older_digests)
from jaxloader.base.errors import JaxloaderWarning, StateDictError, user_stacklevel
from jaxloader.base.random_state import draws, generator_state, global_examples
from jaxloader.base.source_locks import holding, source_lock
from jaxloader.sources.held_generators import held_generators
from jaxloader.sources.leaf_bytes import MEANT_SEEN, as_numpy, leaf_bytes, records_as_before
from jaxloader.sources.parts import locks_to_take, walk


# The most parts a state lists the fingerprints of (8 hex digits each), to name the part that
# changed; a source of more is named as a whole.
PARTS_NAMED = 4096


def source_fingerprint(source: Any) -> dict[str, Any]:
    """``{"source": its own}`` when the source has one, else ``{"record_spec", "record_hash"}``,
    its records read holding its locks (``base.source_locks``: a batch another thread makes
    from it waits, or this does); refused in a thread that is reading it (a signal handler that
    interrupted a read: reading again would move that read's file)."""
    own = fingerprint_of(source)
    if own is not None:
        parts = getattr(source, "part_digests", None)  # (a ConcatSource's: as ``own`` made them)
        if getattr(source, "reads_run_code", False) is True and not digest_level():
            _first_read(source)  # (a dataset's own transform may draw)
        if isinstance(parts, list) and 0 < len(parts) <= PARTS_NAMED and not digest_level():
            return {"source": own, "parts": list(parts)}
        return {"source": own}
    locks = source_lock(source, walk)
    _refuse_within_a_read(locks)
    return holding(locks, _records_hash, source)


def _refuse_within_a_read(locks: Any) -> None:
    """Refuses a read of the source's records in a thread that holds its locks: one that is
    reading it (a signal handler that interrupted a read)."""
    if any(getattr(lock, "_is_owned", lambda: False)() for lock in locks):
        raise StateDictError(
            "state_dict() (or a restore) was called in a thread that is reading the source "
            "(a signal handler that interrupted a batch's read?): the first one reads its "
            "records 0, n // 2 and n - 1 for the state's fingerprint, which would move the "
            "interrupted read; call loader.state_dict() once before (it is kept), save at a "
            "step's end (a handler that sets a flag the training loop checks), or give the "
            "source a `fingerprint` attribute")


def mapped_records(source: Any) -> str:
    """A hash of ``source``'s records 0, n // 2 and n - 1 as it makes them (``_records_hash``,
    under its locks), for a source whose own fingerprint names its function by its code and
    closure alone (a ``MapSource``); ``""`` where this process cannot read them (a source only
    its workers open), which its fingerprint then leaves out, as before."""
    locks = locks_to_take(source)  # (a read thread's maker's: held for it, as by it)
    _refuse_within_a_read(locks)  # (a signal handler's state_dict(): refused, as any source's)
    try:
        return holding(locks, _records_hash, source)["record_hash"]
    except Exception:  # noqa: BLE001 - (not readable here: the code's digest names it alone)
        return ""


def _records_hash(source: Any, drawn: bool | None = None) -> dict[str, str]:
    """``drawn``: named as a source that draws as it reads (by its records' structure), or
    not (by their values too), whatever its reads show; ``None``: as they show."""
    n = len(source)
    digest = hashlib.blake2b(digest_size=16)
    spec = ""
    for position in sorted({0, n // 2, n - 1}):
        if position == 0 and not digest_level() and drawn is None and not \
                records_as_before():  # (today's form: read again once)
            leaves, treedef, drawn = _first_read(source)
        else:
            leaves, treedef = _leaves(source, position)
        described = "; ".join(f"{path}: {_describe(leaf)}"
                              for path, leaf in zip(tree_lib.leaf_paths(treedef), leaves))
        if not spec:  # (whole until 2026-11-30: what an older state, or file kept, holds)
            spec = described if older_digests() else compact_spec(described)
            seen = _COMPACTED_SEEN.get()
            if seen is not None and spec != described:
                seen.append(source)
        digest.update(described.encode(errors="surrogatepass"))
        for leaf in leaves if not drawn else ():  # (drawn values: by their structure alone)
            digest.update(leaf_bytes(leaf))
    return {"record_spec": spec, "record_hash": ("drawn " if drawn else "") + digest.hexdigest()}


def _leaves(source: Any, position: int) -> tuple[list, tree_lib.TreeDef]:
    leaves, treedef = tree_lib.flatten(_read(source, position))
    if not array_likes_by_type():  # (an array-like, as a batch holds it; by its type until
        leaves = [_as_batched(leaf) for leaf in leaves]  # 2026-11-30's 34th session)
    return leaves, treedef


def _first_read(source: Any) -> tuple[list, tree_lib.TreeDef, bool]:
    """``source[0]``'s leaves and structure, and whether its values are drawn as it reads (an
    augmentation in ``__getitem__``): it moved NumPy's, Python's or PyTorch's global generators
    on both of two reads, or one it holds (``held_generators``), or gave other values read
    again. Warned of here (else seen only at the restore, which the hash of drawn values
    refused, every checkpoint of the run unusable; or never, where two reads drew alike)."""
    held = [(where, g) for _, where, g in held_generators((_Reads(source),))]
    # (another thread's draws may be taken for the source's: the warning names one such
    # thread, and a state named either way restores into a run whose reads showed the other,
    # ``older_records``)
    main = threading.current_thread() is threading.main_thread()
    others = [t.name for t in threading.enumerate()
              if t is not threading.current_thread() and "jaxloader" not in t.name]
    moved: list[list[str]] = []
    reads = []
    for _ in range(2):
        before, states = draws() if main else None, [generator_state(g) for _, g in held]
        reads.append(_leaves(source, 0))
        moved.append([where.replace("fn.__self__", "self", 1) for (where, g), state in zip(
            held, states) if generator_state(g) != state] + (
            ["-"] if before is not None and draws() != before else []))
    first, then = _values(*reads[0]), _values(*reads[1])
    differ = sorted(path for path in first.keys() | then.keys()
                    if first.get(path) != then.get(path))
    both = [m for m in moved[0] if m in moved[1]]  # (moved by each read: one seeded from
    held_one = next((m for m in both if m != "-"), "")  # the record moves it by the first
    global_ = "-" in both  # only, when it was elsewhere before)
    if differ or held_one or global_:
        what = f"a random generator it holds ({held_one})" if held_one else \
            f"the global random state ({global_examples()})" if global_ else \
            "np.random or a generator it holds"
        said = f"the source's record 0, read twice, gave other values ({differ[0]} differs): " \
            "it draws random numbers as it reads (an augmentation in __getitem__, from " \
            f"{what}){'' if held_one or global_ else ' or its data change'}" if differ else \
            f"the source drew from {what} as it read its record 0 (an augmentation in " \
            "__getitem__" + (", or another of this process's threads drew meanwhile: "
                             f"{others[0]!r}" if global_ and not held_one and others else "") + ")"
        warnings.warn(
            f"{said}; its batches then differ with the worker count, "
            "from run to run and after a restore" + (
                ", and each worker draws from a copy of the generator made in one state: the "
                "same numbers, one worker's augmentations another's" if held_one else "") +
            "; a state saved from it names its data by the records' structure alone; draw in "
            "a RandomMap (jl.RandomMap(lambda record, rng: ...): the loader's generator, a pure "
            "function of the seed and the record's place), or, for records that change on "
            "purpose, give the source a `fingerprint` attribute", JaxloaderWarning,
            stacklevel=user_stacklevel())
    return *reads[0], bool(differ or held_one or global_)


class _Reads:
    """A source's reads as ``held_generators`` looks into a transform: its ``fn``."""

    def __init__(self, source: Any) -> None:
        self.fn = getattr(source, "__getitem__", None)


def _values(leaves: list, treedef: tree_lib.TreeDef) -> dict[str, bytes]:
    """A record's leaves' contents by their paths, a Python number as NumPy's."""
    return {path: leaf_bytes(as_numpy(leaf))
            for path, leaf in zip(tree_lib.leaf_paths(treedef), leaves)}


def compact_spec(spec: str) -> str:
    """A record's structure as a state holds it: whole up to 2,000 characters, else its
    first 1,000 and a digest of the rest (a 30 s clip as a Python list is 480,000 leaves, 12 MB
    a state; the records' hash still reads every leaf). The same for an older state's whole one.

    Example:
        >>> compact_spec("['x']: int64()")
        "['x']: int64()"
    """
    if len(spec) <= 2000:
        return spec
    digest = hashlib.blake2b(spec.encode(errors="surrogatepass"), digest_size=16).hexdigest()
    return f"{spec[:1000]} ... ({len(spec):,} characters, blake2b {digest})"


# the sources whose records' structure was compacted while a combined fingerprint was made
_COMPACTED_SEEN: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "compacted", default=None)


def _read(source: Any, position: int) -> Any:
    try:
        return source[position]
    except Exception as e:  # noqa: BLE001 - any error of the user's source: said why it ran
        raise StateDictError(
            f"the loader's state names its data by a hash of the source's records 0, n // 2 "
            f"and n - 1, read in this process (the training process, also with workers); "
            f"source[{position}] raised {type(e).__name__}: {e}; give the source a "
            "`fingerprint` attribute (a str naming its data and version, e.g. 'reviews-v3'), "
            "which the state holds instead, or let the training process read its records "
            "(a handle opened in worker_init_fn: open it lazily in __getitem__)") from e


def _as_batched(leaf: Any) -> Any:
    """A leaf with the array protocol (a ``jax.Array``, a torch tensor, a PIL image, an
    xarray ``DataArray``) as the NumPy array a batch holds: its dtype, shape and bytes are
    then the state's (by its type alone, a restore over other such data was taken)."""
    if isinstance(leaf, (np.ndarray, np.generic)) or not any(
            hasattr(leaf, a) for a in ("__array__", "__array_interface__", "__array_struct__")):
        return leaf
    try:
        return np.asarray(leaf)
    except Exception:  # noqa: BLE001 - one that does not convert: by its type, as before
        return leaf


def _describe(leaf: Any) -> str:
    if isinstance(leaf, (np.ndarray, np.generic)):
        return f"{leaf.dtype}{leaf.shape}"
    return type(leaf).__name__


def older_fingerprint(source: Any) -> tuple[str, ...]:
    """``source``'s own fingerprint as older versions wrote it into states, where it differs
    from today's, so that such a state still restores (a file source's before 2026-11-28 took
    the whole paths, a ``ParquetSource``'s before 2026-11-29 the schema as printed: a mix or a
    filter of one too); ``()`` where none does.

    Example:
        >>> from jaxloader.sources import ArraySource
        >>> older_fingerprint(ArraySource({"x": np.zeros(3)}))
        ()
    """
    now, found = fingerprint_of(source), []
    for then in in_older_forms(lambda: fingerprint_of(source)):
        if then is not None and then != now and then not in found:
            found.append(then)
    return tuple(found)


def older_records(source: Any) -> list[dict]:
    """A source without a fingerprint of its own (or without one in older versions: a
    ``ConcatSource``'s, ``older_fingerprints`` ``(None,)``): its records' hash and structure as
    older versions wrote them into states, where they differ from today's (``source_fingerprint``
    under ``in_older_forms``; an array-like leaf by its type before 2026-11-30's 34th session).
    """
    now = source_fingerprint(source)
    if "record_hash" not in now and getattr(source, "older_fingerprints", None) != (None,):
        return []  # (one named by its own always; a ConcatSource until 2026-12-03 was not)
    other = [] if "record_hash" not in now else [holding(  # (drawn or not, as the run that
        source_lock(source, walk), _records_hash, source,  # saved saw its reads: another
        not now["record_hash"].startswith("drawn "))]  # thread's draws, a seed)
    return [then for then in [*other, *in_older_forms(lambda: source_fingerprint(source))]
            if then != now and "record_hash" in then]


def combined_generations(kind: str, size: int, sources: Sequence[Any],
                         *own: bytes | str) -> tuple[str, ...]:
    """``combined(...)``, then as older versions wrote it where it differs (their
    fingerprints of ``sources``, ``older_fingerprint``): what a file kept by them says.

    Example:
        >>> from jaxloader.sources import ArraySource
        >>> len(combined_generations("twice", 3, [ArraySource({"x": np.zeros(3)})]))
        1
    """
    token, seen = _COMPACTED_SEEN.set([]), MEANT_SEEN.set([])
    try:
        found = [combined(kind, size, sources, *own)]
        compacted = bool(_COMPACTED_SEEN.get())  # (a part's records' structure: whole before)
        meant = bool(MEANT_SEEN.get())  # (a record's leaf hashed otherwise before: objects)
    finally:
        _COMPACTED_SEEN.reset(token)
        MEANT_SEEN.reset(seen)
    if not compacted and not any(getattr(part, "older_fingerprints", None) is not None
                                 for source in sources for part in walk(source)):
        if meant:  # (its records as hashed until 2026-12-07's eleventh session)
            before = RECORDS_AS_BEFORE.set(True)
            try:
                found.append(combined(kind, size, sources, *own))
            finally:
                RECORDS_AS_BEFORE.reset(before)
        return tuple(dict.fromkeys(found))  # (none written otherwise: no source read again
        # for nothing)
    for then in in_older_forms(lambda: combined(kind, size, sources, *own)):
        if then not in found:
            found.append(then)
    return tuple(found)


def combined(kind: str, size: int, sources: Sequence[Any], *own: bytes | str,
             parts: list[str] | None = None) -> str:
    """The fingerprint of a source made of ``sources`` (their fingerprints, in order) and its
    ``own`` configuration: ``"<kind>:<size>:<digest>"``; ``parts``, where given, gets each
    source's fingerprint in 8 hex digits (a state names the part that changed by them).

    Example:
        >>> from jaxloader.sources import ArraySource
        >>> combined("twice", 6, [ArraySource({"x": np.zeros(3)})] * 2).startswith("twice:6:")
        True
    """
    digest = hashlib.blake2b(digest_size=16)
    for source in sources:
        described = repr(sorted((key, value) for key, value in source_fingerprint(
            source).items() if key != "parts")).encode()  # (a part's own parts: named apart)
        digest.update(described)
        if parts is not None:
            parts.append(hashlib.blake2b(described, digest_size=4).hexdigest())
    for part in own:
        digest.update(part if isinstance(part, bytes) else part.encode(
            errors="surrogatepass"))
    return f"{kind}:{size}:{digest.hexdigest()}"


def source_files(source: Any) -> list[tuple[str, list[int]]]:
    """The files ``source`` reads (through the sources it is made of), each with its identity
    as read when its source was made: ``(path, identity)`` in reading order.

    Example:
        >>> from jaxloader.sources import ArraySource
        >>> source_files(ArraySource({"x": np.zeros(3)}))
        []
    """
    found: list[tuple[str, list[int]]] = []
    for each in walk(source):
        found.extend(file_identities_of(each))
    return found


def file_stamps(source: Any) -> list[str]:
    """What a cache found from ``source``'s records (a filter's kept records, lengths) is
    checked against besides its fingerprint: each file's identity and modification time, so
    that a file rewritten under the same path is seen even where its size and footer are the
    same (rows in another order). (A state's check leaves the time out: a copied dataset
    resumes; a cache found again costs one more pass.) None for data in memory.

    Example:
        >>> from jaxloader.sources import ArraySource
        >>> file_stamps(ArraySource({"x": np.zeros(3)}))
        []
    """
    stamps = []
    for part in walk(source):  # (a Parquet file's by its size and footer, as before 2026-12-02's
        cut = getattr(part, "stamped", None)  # 45th session: a rewrite changes the time too)
        for path, identity in [(p, i[:cut]) for p, i in file_identities_of(part)]:
            try:
                stamps.append(f"{identity}@{os.stat(path).st_mtime_ns}")
            except (OSError, TypeError, ValueError):  # (a path of another file system)
                stamps.append(repr(identity))
    for path in _mapped_files(source):  # (memmaps: a label map saved again under its name
        try:  # was kept by the cache found from the old one, silently; by size and time, as
            found = os.stat(path)  # a file's own: a copy that keeps its time is the same)
            stamps.append(f"mapped {found.st_size}@{found.st_mtime_ns}")
        except OSError:
            stamps.append("mapped")
    return [repr(stamps)] if stamps else []


def _mapped_files(source: Any) -> list[str]:
    """The files of the memory-mapped arrays (``np.load(mmap_mode=...)``, views of them) the
    sources in ``source`` hold (an ``ArraySource``'s leaves, a ``RaggedSource``'s values and
    offsets: arrays among their attributes, in dicts and tuples there too), in order."""
    files: dict[str, None] = {}  # (in order, each once)
    for part in walk(source):
        if not any(c.__module__.startswith("jaxloader.") for c in type(part).__mro__):
            continue  # (a source of the user's own: its own fingerprint; a subclass of
            # jaxloader's holds its arrays)
        held = list(vars(part).values()) if hasattr(part, "__dict__") else []
        for value in held:
            inner = value.values() if isinstance(value, dict) else value if isinstance(
                value, (list, tuple)) else [value]
            for array in (x for item in inner for x in (
                    item if isinstance(item, tuple) else (item,))):
                mapped = memmap_under(array) if isinstance(array, np.ndarray) else None
                if mapped is not None:
                    files[os.fspath(cast(str, mapped.filename))] = None
    return list(files)
