"""Shards that are not files: ``IterableShard`` (records of a function that makes an
iterable: a generator function, a simulator's reset), ``Stream.from_generator``'s shards
(``generator_shards``), and ``MappedShard`` (a shard's records through ``Stream.map``'s
function). The file shards and the shard protocol are ``jaxloader.streams.shards``'.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import time
import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from jaxloader.base.abilities import close_of, digest_level
from jaxloader.base.loader_names import loader_names
from jaxloader.base.own_records import top_copy
from jaxloader.base.checks import (Int, callable_name, check_int, check_one_argument,
                                   refused_call)
from jaxloader.base.errors import (ConfigError, JaxloaderWarning, RecordError, StateDictError,
                                   user_stacklevel)
from jaxloader.sources.code_digest import OLDER_FORMS, code_digest, code_digests
from jaxloader.streams.shard_state import innermost
from jaxloader.streams.shards import state_ints

log = logging.getLogger("jaxloader")
_TELL_S = 10.0  # a resume that reads records again says how far it is, this often


class Bound:
    """``make(i)`` as a function of nothing (picklable where ``make`` is)."""

    def __init__(self, make: Callable[[int], Iterable], index: int) -> None:
        self.make, self.index = make, index

    def __call__(self) -> Iterable:
        return self.make(self.index)


def generator_shards(make: Callable[[int], Iterable], shards: Int) -> list["IterableShard"]:
    """``Stream.from_generator``'s shards: shard ``i`` reads ``make(i)``, ``make`` checked
    first (a generator object cannot start again; a function of no shard number, as tf.data's
    ``from_generator`` takes, would fail at the first read)."""
    if not callable(make):
        what = getattr(make, "__name__", None)
        code = getattr(make, "gi_code", None)  # (a generator's: did its function take a shard?)
        call = (f"lambda shard: {what}()" if what and code is not None and not (
            code.co_argcount or code.co_flags & inspect.CO_VARARGS) else what or "make")
        raise ConfigError(
            f"Stream.from_generator(make): got a {type(make).__name__} object, which cannot "
            "start again (for each shard, each worker, a restore, the next epoch); pass the "
            "generator function itself, called as make(shard): "
            f"Stream.from_generator({call}, shards={shards})")
    shards = check_int("Stream.from_generator(shards)", shards, low=1, high=1 << 22,
                       remedy="one shard per independent part of the generator (each is an "
                       "object held by every reader; more parts: let a shard read a range)")
    name = getattr(make, "__qualname__", "generator")
    signature = refused_call(make, 0)
    if signature is not None:
        raise ConfigError(
            f"Stream.from_generator(make): make is called as make(shard), but {name}"
            f"{signature} does not take the shard number; pass a function of it, such as "
            f"lambda shard: {name}() for one shard (tf.data's from_generator calls it "
            "without one)")
    code = code_digest(_held(make), defaults=False)[:16]
    before = _OlderCodes(make)  # (one for all shards: digested at a restore that needs them)
    return [IterableShard(Bound(make, i), name=f"{name}[{i}]", code=code, code_before=before)
            for i in range(shards)]


def _held(make: Callable) -> functools.partial:
    """``make`` with its defaults bound, as digested (a state warns of another: the records'
    function, its closure and its defaults, def read(i, files=FILES); the partial holds them,
    as it did before code_digest took defaults, and as older versions took it)."""
    return functools.partial(make, *(getattr(make, "__defaults__", None) or ()),
                             **(getattr(make, "__kwdefaults__", None) or {}))


class _OlderCodes:
    """A generator function's digests as older versions took them (``codes_of(before=)``),
    made when a restore first compares an older state's (a state of this version needs
    none): three digests cost a ``Stream.from_generator`` three times its own. It holds the
    function, as the shards do, not its defaults bound: a module's function copies and
    pickles by its name, where a default holding a lock or a queue could not be copied."""

    def __init__(self, make: Callable) -> None:
        self.make = make
        self._codes: tuple[str, ...] | None = None

    def __call__(self) -> tuple[str, ...]:
        if self._codes is None:
            held = _held(self.make)
            self._codes = tuple(code_digest(held, defaults=False, methods=False, **form)[:16]
                                for form in OLDER_FORMS[:3])
        return self._codes


def older_codes_of(shards: Sequence[Any]) -> list[list[str]]:
    """``codes_of(shards)`` as older versions took them: what their states hold (and as this
    version's until 2026-12-07's eleventh session: a Hugging Face dataset's functions, whose
    shards' ``code_before`` is ``("",)``, not digested)."""
    now = codes_of(shards)
    plain = [code if getattr(innermost(shard), "code_before", None) != ("",) else ""
             for shard, code in zip(shards, now)]
    return [*(codes_of(shards, before) for before in (1, 2, 3)),
            *([plain if any(plain) else []] if plain != now else [])]


def codes_of(shards: Sequence[Any], before: int = 0) -> list[str]:
    """Each ``Stream.from_generator`` shard's function's digest (under any ``Stream.map``s),
    and a Hugging Face dataset's shard's functions', ``""`` for another shard; ``[]`` where
    none has one: what a stream loader's state holds, so that a restore over a generator of
    other files is said (``loaders.transform_names``).
    ``before``: as versions until 2026-12-02's forty-fifth session took them (1: a notebook's
    class by its ``__call__``'s names alone), until 2026-12-01's fortieth (2: also the code's
    names and constants in each Python's order), until 2026-11-30's thirty-fifth (3)."""
    codes = []
    for shard in shards:
        while isinstance(shard, MappedShard):
            shard = shard.shard
        older = getattr(shard, "code_before", ()) if before else ()
        older = older() if callable(older) else older
        code = older[min(before, len(older)) - 1] if before and older else getattr(
            shard, "code", None)
        codes.append(code or "")
    return codes if any(codes) else []


@loader_names("stream")
class IterableShard:
    """Records of ``make()`` (a function returning an iterable: a generator function, a
    simulator's reset); a list or other re-iterable object is accepted as it is. Resumes by
    skipping the records already read: O(n) in them.

    A generator object itself cannot start again, so it is refused: pass the function that
    makes it (``IterableShard(lambda: my_generator(...))``).

    Example:
        >>> import jaxloader as jl
        >>> shard = jl.IterableShard(lambda: iter(range(5)), name="counts")
        >>> shard.reset(None)
        >>> shard.next(), shard.next(), shard.get_state()
        (0, 1, {'consumed': 2})
        >>> again = jl.IterableShard(lambda: iter(range(5)), name="counts")
        >>> again.reset({"consumed": 2})  # resumes: skips the 2 read
        >>> again.next()
        2
    """

    def __init__(self, make: Callable[[], Iterable] | Iterable, name: str | None = None,
                 code: str | None = None,
                 code_before: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()) -> None:
        if isinstance(make, (str, bytes, os.PathLike)):  # (a str's characters, records)
            raise ConfigError(
                f"IterableShard: got the {type(make).__name__} {make!r:.80}, whose characters "
                "would be its records; for a file's records, read it with Stream.jsonl(paths), "
                "Stream.text(paths) or Stream.tar(paths); for records in a list, pass the list")
        if isinstance(make, Mapping):
            raise ConfigError(f"IterableShard: got the {type(make).__name__} {make!r:.80}, "
                              "whose keys would be its records; pass a list of the records "
                              "([record] for one)")
        if callable(make) and (signature := refused_call(make)) is not None:
            raise ConfigError(
                f"IterableShard: make is called as make(), but {callable_name(make)}"
                f"{signature} cannot be; pass a function of no arguments that makes the "
                "records (for one of a shard number: Stream.from_generator(make, shards=n))")
        for label, value in (("name", name), ("code", code)):
            if value is not None and not (isinstance(value, str) and value):
                raise ConfigError(f"IterableShard({label}): expected a non-empty str or None, "
                                  f"got {type(value).__name__} {value!r:.60}")
        if not callable(code_before) and not (isinstance(code_before, tuple) and all(
                isinstance(c, str) for c in code_before)):
            raise ConfigError(f"IterableShard(code_before): expected a tuple of str (the "
                              f"digests older versions wrote), got {code_before!r:.60}")
        if callable(make):
            self._make = make
        elif isinstance(make, Iterable) and iter(make) is not make:  # re-iterable (a list)
            self._make = lambda: make
        else:
            raise ConfigError(
                f"IterableShard: got a {type(make).__name__}, an iterator that cannot start "
                "again (for workers, for a restore, for the next epoch); pass the function that "
                "makes it, e.g. IterableShard(lambda: my_generator(...))"
            )
        self.name: str = name or str(getattr(make, "__qualname__", type(make).__name__))
        self.code = code  # (``codes_of``: a restore warns of another, where given)
        self.code_before = code_before  # (older versions' digests: ``codes_of(before=)``)
        self._it: Iterator | None = None
        self._consumed = 0

    def __repr__(self) -> str:
        return f"IterableShard({self.name!r})"

    def reset(self, state: dict | None = None) -> None:
        (skip,) = state_ints(self, state, ("consumed",))
        made = self._make()
        if isinstance(made, (str, bytes, bytearray, Mapping)):  # (iterable: its keys or its
            raise ConfigError(                                  # characters as records)
                f"IterableShard {self.name}: its function returned {type(made).__name__} "
                f"{made!r:.60}, which would be read as records one "
                f"{'key' if isinstance(made, Mapping) else 'character'} each; return a list "
                f"of the records ([record] for one) or yield them (a generator function)")
        try:
            self._it = iter(made)
        except TypeError:
            raise ConfigError(
                f"IterableShard {self.name}: its function returned {type(made).__name__} "
                f"{made!r:.60}, expected an iterable of records; yield the records (a "
                "generator function) or return a list or an iterator (a missing `return`?)"
            ) from None
        self._consumed = 0
        told = time.monotonic() + _TELL_S
        for done in range(skip):
            try:
                next(self._it)
            except StopIteration:
                raise StateDictError(
                    f"IterableShard {self.name}: the state says {skip} records were read, but "
                    f"it ends after {self._consumed}; it must make the same records each time"
                ) from None
            except Exception as e:
                raise RecordError(
                    f"IterableShard {self.name}: its generator raised {type(e).__name__} at "
                    f"record {done + 1:,} of the {skip:,} it reads again to resume (it cannot "
                    f"skip them): {e}") from e
            self._consumed += 1
            if done & 15 == 15 and time.monotonic() > told:  # (a resume of hours: seen; a
                # record a second: its first word after 16 s, not 17 minutes)
                told += _TELL_S
                log.warning("IterableShard %s: resuming by reading its records again up to "
                            "the saved position (it cannot skip them): %s of %s", self.name,
                            f"{done + 1:,}", f"{skip:,}")

    def next(self) -> Any:
        if self._it is None:
            self.reset(None)
        assert self._it is not None
        record = next(self._it)
        self._consumed += 1
        return record

    def get_state(self) -> dict:
        return {"consumed": self._consumed}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_it": None, "_consumed": 0}


def warn_same_names(shards: Sequence[Any]) -> None:
    """Warns where two generators' shards (an ``IterableShard``, under a ``Stream.map`` too)
    share a name, their functions' (``<lambda>``): a state names each shard by its name, so
    one restored over them in another order reads other records, without a word. (Files are
    named by their paths: the same file twice reads the same records.)"""
    seen: dict[str, int] = {}
    for i, shard in enumerate(shards):
        if isinstance(innermost(shard), IterableShard):
            if shard.name in seen:
                warnings.warn(
                    f"Stream: shards {seen[shard.name]} and {i} are both named {shard.name!r}: "
                    "a state names each shard by its name, so one restored over these shards "
                    "in another order would read other records, without a word; give each a "
                    "name of its own (IterableShard(fn, name='part-0'))", JaxloaderWarning,
                    stacklevel=user_stacklevel())
                return
            seen[shard.name] = i


def mapped_shards(shards: Sequence[Any], fn: Callable[[Any], Any]) -> list["MappedShard"]:
    """``shards`` each through ``fn`` (``Stream.map``), the function's digests taken once."""
    if not shards:
        return []
    first = MappedShard(shards[0], fn)
    return [first, *(MappedShard(shard, fn, first._codes) for shard in shards[1:])]


class MappedShard:
    """``shard``'s records through ``fn`` (``Stream.map``); its state is the shard's, its name
    the shard's and the function's code digest (``sources.code_digest``), so a
    stream state saved under another function is refused."""

    def __init__(self, shard: Any, fn: Callable[[Any], Any],
                 codes: tuple[str, ...] | None = None) -> None:
        if not callable(fn):  # (said where the stream is made, not at its first read)
            raise ConfigError(f"Stream.map(fn): expected a function of a record, got "
                              f"{type(fn).__name__} {fn!r:.80}")
        if codes is None:  # (the first shard's: said once)
            check_one_argument("Stream.map(fn)", fn)
        self.shard, self.fn = shard, fn
        self._codes = codes or tuple(d[:16] for d in code_digests(fn))

    @property
    def name(self) -> str:
        """The shard's and the function's digest (at ``digest_level()``: as
        versions until 2026-11-30 wrote it)."""
        return f"{self.shard.name} | map {self._codes[digest_level()]}"

    def reset(self, state: dict | None = None) -> None:
        self.shard.reset(state)

    def next(self) -> Any:
        return self.fn(top_copy(self.shard.next()))  # (a generator may yield dicts it keeps)

    def get_state(self) -> dict:
        return self.shard.get_state()

    def close(self) -> None:
        close_of(self.shard)

    def __copy__(self) -> "MappedShard":
        """A reader's own copy: of the shard under it too (each reader reads its own)."""
        return MappedShard(copy.copy(self.shard), self.fn, self._codes)
