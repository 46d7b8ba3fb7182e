"""What a source can do beyond ``__len__`` and ``__getitem__``: one small protocol an ability,
and one function each that returns what a source offers, or ``None`` where it has no such
ability.

The layers above ask through these (``isinstance`` against a runtime-checkable protocol), not
by an attribute's name spelled at each call. A user's source gains an ability by defining it,
as it is a source by defining ``__len__`` and ``__getitem__``: duck typing, as PyTorch and Grain
read sources.

=====================  ==================================================  ====================
ability                what it gives                                       who asks
=====================  ==================================================  ====================
``Fingerprinted``      a str that changes when the data does               a loader's state
``Blocked``            where blocks read together start (row groups)       ``LocalShuffle``
``Measured``           the lengths of a list column, no record read        ``PackedSource``
``OrderChecked``       its own check of an order (a cache too small)       ``DataLoader``
``ColumnGathering``    many records' columns in one read                   ``BatchMaker``
``FileBacked``         its files' paths and identities                     a loader's state
``Composite``          the sources it concatenates (a mixture's parts)     walks, ``close()``
``Wrapping``           the one source it reads (a map, a filter, packing)  walks, ``close()``
=====================  ==================================================  ====================

Example:
    >>> class Lines:
    ...     fingerprint = "lines-v1"
    ...     def __len__(self): return 2
    ...     def __getitem__(self, i): return {"i": i}
    >>> fingerprint_of(Lines()), block_starts_of(Lines()), lengths_of(Lines(), "i")
    ('lines-v1', None, None)
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from jaxloader.base.errors import ConfigError


@runtime_checkable
class Fingerprinted(Protocol):
    """A source that says what it holds: a str that changes when its data does (a method that
    returns it will do too)."""

    @property
    def fingerprint(self) -> Any: ...


@runtime_checkable
class Blocked(Protocol):
    """A source stored in blocks that are read together (a Parquet file's row groups): where
    each starts, and the record count last; ``None`` where it has none after all (a filter
    whose kept records are out of order)."""

    @property
    def block_starts(self) -> np.ndarray | None: ...


@runtime_checkable
class Measured(Protocol):
    """A source that knows the lengths of a list column without reading its records."""

    def lengths(self, key: str) -> np.ndarray | None: ...


@runtime_checkable
class OrderChecked(Protocol):
    """A source with its own check of what an order reads at once (``shuffle=`` of the
    loader: ``True``, ``False`` or a ``LocalShuffle``)."""

    def check_order(self, shuffle: Any) -> None: ...


@runtime_checkable
class ColumnGathering(Protocol):
    """A source that reads many records' columns at once (a ``ParquetSource``: strings as one
    buffer), or says ``None`` where it cannot."""

    def gather_columns(self, indices: np.ndarray) -> dict[str, Any] | None: ...


@runtime_checkable
class FileBacked(Protocol):
    """A source of files: each one's path and identity (``jaxloader.base.file_identity``)."""

    def file_identities(self) -> list[tuple[str, list[int]]]: ...


@runtime_checkable
class Composite(Protocol):
    """A source made of others, one after another (``ConcatSource``, a mixture)."""

    @property
    def sources(self) -> Sequence[Any]: ...


@runtime_checkable
class Wrapping(Protocol):
    """A source that reads one other (a ``MapSource``, ``FilteredSource``, ``PackedSource``)."""

    @property
    def source(self) -> Any: ...


@runtime_checkable
class Originating(Protocol):
    """A source that names where a record comes from (a ``FileListSource``'s file), for an
    error about the record (a transform's on it, its batch's): ``None`` where it cannot."""

    def record_origin(self, index: int) -> str | None: ...


@runtime_checkable
class Closable(Protocol):
    """Something that holds files or memory open until it is closed."""

    def close(self) -> None: ...


OLDER: contextvars.ContextVar[int] = contextvars.ContextVar("older", default=0)
"""Set to a generation of older versions (``sources.fingerprint.older_fingerprint``; 1: states
saved on 2026-11-28, 2: before it): ``fingerprint_of`` gives a source's fingerprint as that
generation wrote it, its ``older_fingerprints[k - 1]`` (the last where it holds fewer; ``None``:
today's), and the sources made of it combine those: what a state saved then holds."""
GENERATIONS = 2


OLDER_DIGESTS: contextvars.ContextVar[int] = contextvars.ContextVar("older_digests", default=0)
"""Set to describe a source or a stream as older versions wrote it, otherwise as today's: 1,
as versions until 2026-12-02's forty-fifth session did (a callable object of a class with no
source Python finds, a notebook's, by its ``__call__``'s names and constants alone:
``code_digest(methods=False)``, as every level after it too); 2, as versions until 2026-12-01's
fortieth session did (also a function's code's names and constants in the order each Python
lists them: ``code_digest(code_as_before=True)``); 3, as 2026-11-30's thirty-fourth session's
did (also a function's closure values and defaults by their text's first 200 characters, with
no digest of the rest); 4, as its thirty-third session's did (also a record's array-likes, a
``jax.Array``, a PIL image, by their type alone: ``array_likes_by_type()``; sets of values
other than strings in their run's order); 5, as those before it did (also functions' code
digests without their default arguments, a Hugging Face stream's joined datasets left out of
its digest, a record's structure whole: ``older_digests()``). Every ``OLDER`` generation wrote
them as 5 does."""
DIGEST_LEVELS = 5


def older_digests() -> bool:
    """Whether digests are taken as states saved before 2026-11-30's thirty-third session hold
    them (``OLDER_DIGESTS`` 5, or an ``OLDER`` generation)."""
    return OLDER_DIGESTS.get() >= 5 or bool(OLDER.get())


def digest_level() -> int:
    """Which of a function's digests a state holds (``code_digests``): 0, this version's; 1,
    the versions' until 2026-12-02's forty-fifth session; 2, until 2026-12-01's fortieth; 3,
    2026-11-30's thirty-fourth session's; 4, its thirty-third's; 5, the versions' before it
    (``older_digests()``)."""
    return DIGEST_LEVELS if older_digests() else OLDER_DIGESTS.get()


def array_likes_by_type() -> bool:
    """Whether a record's array-likes are described by their type alone, as states saved
    until 2026-11-30's thirty-fourth session hold them (``OLDER_DIGESTS`` 4 or more)."""
    return OLDER_DIGESTS.get() >= 4 or bool(OLDER.get())


def in_generation(generation: int, compute: Callable[[], Any]) -> Any:
    """``compute()`` with ``OLDER`` at ``generation``: a source's fingerprint, or a stream's
    description, as that generation of older versions wrote it into states."""
    token = OLDER.set(generation)
    try:
        return compute()
    finally:
        OLDER.reset(token)


ARRAYS_LEFT_OUT: contextvars.ContextVar[bool] = contextvars.ContextVar("arrays_left_out",
                                                                      default=False)
"""Set to describe a source as versions until 2026-12-05 wrote it: a ``MapSource``'s
fingerprint without the bytes of the arrays its function holds, the rest as today's."""


OWNER_LEFT_OUT: contextvars.ContextVar[bool] = contextvars.ContextVar("owner_left_out",
                                                                     default=False)
"""Set to describe a source as versions until 2026-12-07 wrote it: a ``MapSource`` of a bound
method's fingerprint without its object as its code reads it, the rest as today's."""


RECORDS_AS_BEFORE: contextvars.ContextVar[bool] = contextvars.ContextVar("records_as_before",
                                                                        default=False)
"""Set to describe a source as versions until 2026-12-07's eleventh session wrote it: a
``MapSource``'s fingerprint without its mapped records' hash, a record's object arrays
unhashed and its padded structured and long double values hashed with their padding bytes;
the rest as today's."""


def in_older_forms(compute: Callable[[], Any]) -> list[Any]:
    """``compute()`` as each older version wrote it: today's under each ``OLDER_DIGESTS`` level,
    the newest first, then each ``OLDER`` generation's, then (changes of their own, kept last so
    that the others keep their places) with ``ARRAYS_LEFT_OUT``, with ``OWNER_LEFT_OUT``, and
    with ``RECORDS_AS_BEFORE``."""
    found = []
    for level in range(1, DIGEST_LEVELS + 1):
        token = OLDER_DIGESTS.set(level)
        try:
            found.append(compute())
        finally:
            OLDER_DIGESTS.reset(token)
    found += [in_generation(g, compute) for g in range(1, GENERATIONS + 1)]
    left_out = ARRAYS_LEFT_OUT.set(True)
    try:
        found.append(compute())
    finally:
        ARRAYS_LEFT_OUT.reset(left_out)
    owner_out = OWNER_LEFT_OUT.set(True)
    try:
        found.append(compute())
    finally:
        OWNER_LEFT_OUT.reset(owner_out)
    mapped_out = RECORDS_AS_BEFORE.set(True)
    try:
        return found + [compute()]
    finally:
        RECORDS_AS_BEFORE.reset(mapped_out)


def fingerprint_of(source: object) -> str | None:
    """The source's own fingerprint, or ``None``."""
    generation = OLDER.get()
    if generation:
        older = getattr(source, "older_fingerprints", None)
        if isinstance(older, tuple) and older:
            then = older[min(generation, len(older)) - 1]
            if isinstance(then, str):
                return then
    if not isinstance(source, Fingerprinted):
        return None
    own = source.fingerprint
    if callable(own):
        own = own()
    return own if isinstance(own, str) else None


def block_starts_of(source: object) -> np.ndarray | None:
    """The source's blocks (``Blocked``) as int64, or ``None``; checked: where each block
    starts, from 0, never decreasing, and its record count last (an order over blocks that
    missed records or read some twice would follow them in silence)."""
    starts = source.block_starts if isinstance(source, Blocked) else None
    if starts is None:
        return None
    given = np.asarray(starts)
    count = len(source)  # type: ignore[arg-type]
    problem = None
    if given.ndim != 1 or given.dtype.kind not in "iu" or len(given) < 2:
        problem = f"a 1-D array of ints of 2 or more, got {given.dtype} of shape {given.shape}"
    elif given[0] != 0 or given[-1] != count:
        problem = (f"starts from 0 and the record count ({count}) last, got {int(given[0])} "
                   f"first and {int(given[-1])} last")
    elif np.any(given[1:] < given[:-1]):
        at = int(np.argmax(given[1:] < given[:-1]))
        problem = (f"starts that never decrease, got {int(given[at])} then "
                   f"{int(given[at + 1])} at blocks {at} and {at + 1}")
    if problem is not None:
        raise ConfigError(f"{type(source).__name__}.block_starts: expected {problem}; where "
                          "each block starts, then the record count")
    return given.astype(np.int64, copy=False)


def lengths_of(source: object, key: str) -> np.ndarray | None:
    """The source's lengths of list column ``key`` (``Measured``), or ``None``."""
    if not isinstance(source, Measured) or not callable(source.lengths):
        return None
    got = source.lengths(key)
    return None if got is None else np.asarray(got, np.int64)


def order_check_of(source: object) -> Callable[[Any], None] | None:
    """The source's own check of an order (``OrderChecked``), or ``None``."""
    return source.check_order if isinstance(source, OrderChecked) else None


def gatherer_of(source: object) -> Callable[[np.ndarray], dict[str, Any] | None] | None:
    """The source's read of many records' columns at once (``ColumnGathering``), or ``None``."""
    return source.gather_columns if isinstance(source, ColumnGathering) else None


def file_identities_of(source: object) -> list[tuple[str, list[int]]]:
    """The source's own files' paths and identities (``FileBacked``); none for other sources."""
    return source.file_identities() if isinstance(source, FileBacked) else []


def parts_of(source: object) -> list[Any]:
    """The sources ``source`` reads its records from: a ``Composite``'s ``sources``, a
    ``Wrapping``'s ``source``; none for a source of its own data."""
    if isinstance(source, Composite) and isinstance(source.sources, (list, tuple)):
        return list(source.sources)
    if isinstance(source, Wrapping):
        inner = source.source
        return [inner] if hasattr(inner, "__len__") and hasattr(inner, "__getitem__") else []
    return []


def origin_of(source: object, index: int) -> str | None:
    """Where ``source``'s record ``index`` comes from (``Originating``), or ``None``; never
    raises (it names a record in an error being said)."""
    if not isinstance(source, Originating):
        return None
    try:
        said = source.record_origin(index)
    except Exception:  # noqa: BLE001 - a name for a message only
        return None
    return said if isinstance(said, str) else None


def close_of(held: object) -> None:
    """Closes ``held`` where it can be closed (``Closable``)."""
    if isinstance(held, Closable):
        held.close()
