"""Per-record and per-batch transforms.

- ``Map(fn)``: ``fn(record) -> record``.
- ``RandomMap(fn)``: ``fn(record, rng) -> record``; ``rng`` is a ``np.random.Generator`` seeded
  from ``(seed, epoch, position, transform index)``, never from the worker running it, so the
  result does not depend on the worker count or on a restore.
- ``BatchMap(fn)``: ``fn(batch) -> batch`` after collation, on the stacked NumPy batch.
- ``JitMap(fn)`` (``jit_map.py``): ``fn(record[, key])`` in ``jax.numpy``, run over the collated
  batch, vectorised and compiled by XLA for the host CPU; a batch transform in its place.
- ``Filter(fn)``: ``fn(record) -> bool``; a ``StreamLoader`` drops the records it is false for
  and reads on to fill the batch. A ``DataLoader`` refuses it: its batch is a fixed set of
  positions, so filter the source once up front (``FilteredSource``).

Plain callables in ``transforms=`` are taken as ``Map``. Record transforms must come before
batch transforms (``BatchMap``, ``JitMap``).

Example:
    >>> import numpy as np
    >>> flip = RandomMap(lambda r, rng: r[::-1] if rng.random() < 0.5 else r)
    >>> rng = RecordRng(seed=0)
    >>> flip.fn(np.arange(3), rng.at(epoch=0, position=7, transform_index=0)).shape
    (3,)
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np

from jaxloader.base.checks import (MASK64, POSITION_BITS as _POSITION_BITS, callable_name,
                                   refused_call)
from jaxloader.base.errors import ConfigError, RecordError
from jaxloader.base.loader_names import loader_names
from jaxloader.batching.jit_map import JitMap
from jaxloader.batching.pad import Pad, check_hosts
from jaxloader.sources.code_digest import warn_hashing


@loader_names("transform")
class Map:
    """A per-record transform ``fn(record) -> record``.

    Example:
        >>> import jaxloader as jl
        >>> jl.Map(lambda r: {"x": r["x"] / 255.0}).fn({"x": 255})
        {'x': 1.0}
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        _check_callable(fn, "Map")
        self.fn = fn

    def __repr__(self) -> str:
        return f"Map({fn_name(self.fn)})"


@loader_names("transform")
class RandomMap:
    """A per-record transform ``fn(record, rng) -> record`` with a per-record seeded ``rng``,
    a pure function of ``(seed, epoch, position)`` and the transform's place in the list: two
    ``RandomMap`` transforms in one loader draw apart (two views of a record, for contrastive
    learning), where two loaders made with one seed draw the same numbers.

    Example:
        >>> import jaxloader as jl
        >>> noise = jl.RandomMap(lambda r, rng: r + rng.normal(size=r.shape))
        >>> views = [jl.RandomMap(lambda r, rng: {**r, "a": r["x"] * rng.uniform()}),
        ...          jl.RandomMap(lambda r, rng: {**r, "b": r["x"] * rng.uniform()})]
    """

    def __init__(self, fn: Callable[[Any, np.random.Generator], Any]) -> None:
        _check_callable(fn, "RandomMap")
        self.fn = fn

    def __repr__(self) -> str:
        return f"RandomMap({fn_name(self.fn)})"


@loader_names("transform")
class BatchMap:
    """A transform of a whole collated batch ``fn(batch) -> batch`` (leaves keep the batch axis).

    Example:
        >>> import jaxloader as jl
        >>> to_float = jl.BatchMap(lambda b: {**b, "x": b["x"].astype("float32") / 255})
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        _check_callable(fn, "BatchMap")
        self.fn = fn

    def __repr__(self) -> str:
        return f"BatchMap({fn_name(self.fn)})"


def split_transforms(transforms: Transforms, *, filters: bool = False,
                     process_count: int = 1) -> tuple[tuple, tuple]:
    """Validates ``transforms=``; returns ``(record_transforms, batch_transforms)``.
    ``filters``: whether ``Filter`` may be among them (a ``StreamLoader``'s)."""
    if transforms is None:  # (as PyTorch's collate_fn=None: none)
        transforms = ()
    if callable(transforms) or isinstance(transforms, _KINDS) or _grain_name(transforms):
        transforms = (transforms,)  # type: ignore[assignment]  # (one, a Grain object too)
    if not isinstance(transforms, Iterable) or isinstance(transforms, (str, bytes, Mapping)):
        raise ConfigError(f"transforms: expected a transform, a function or a list of them, "
                          f"got {type(transforms).__name__} {transforms!r:.80}")
    if isinstance(transforms, (set, frozenset)):  # (run in the set's order: not the one written)
        raise ConfigError(f"transforms: got a {type(transforms).__name__}, whose order is not "
                          "the one written, and transforms run in order: pass a list")
    transforms = tuple(transforms)
    record: list = []
    batch: list[Any] = []
    for i, t in enumerate(transforms):
        t = from_grain(t) or t
        if not isinstance(t, (JitMap, Pad, type)):  # (a JitMap's hash() fails as it traces)
            warn_hashing(getattr(t, "fn", t), f"transforms[{i}]")
        if isinstance(t, Filter) and not filters:
            before = ", ".join(repr(from_grain(m) or m) for m in transforms[:i])  # (its input)
            mapped = (f" (it sees the records {before} make: filter "
                      "jaxloader.MapSource(source, f), f doing what they do)" if before else "")
            raise ConfigError(
                f"transforms[{i}]: {t!r} drops records, but a DataLoader's batch is a fixed "
                "set of positions (a pure function of seed, epoch and step), so it cannot "
                "read on to fill it; filter the source once up front: "
                f"jaxloader.FilteredSource(source, fn){mapped} (or read a stream with a "
                "StreamLoader, which takes Filter)"
            )
        if isinstance(t, type) and issubclass(t, _KINDS):  # (the class: Map(record) at a batch)
            raise ConfigError(f"transforms[{i}]: got the class {t.__name__}, not one of its "
                              f"transforms; make one: {t.__name__}(fn)")
        if not isinstance(t, _KINDS):
            if not callable(t):
                grain = _grain_name(t)
                remedy = ("wrap functions as Map(fn)" if not grain else
                          "the batch is batch_size= and last_batch=; a batch_fn is a "
                          "BatchMap(fn) after the record transforms, fn rewritten for the "
                          "batch collated (a pytree of stacked arrays, not a list of "
                          "records)" if grain == "Batch" else
                          f"Grain's {grain} has no counterpart in transforms= (Map, RandomMap "
                          "and Filter objects are taken; docs/migrating/grain.md)" + (
                              "; several examples from one record: stack them from a Map, or "
                              "make a source of (record, part) pairs (docs/troubleshooting.md, "
                              "'Several examples from one record')" if "FlatMap" in grain
                              else ""))
                raise ConfigError(
                    f"transforms[{i}]: expected Map, RandomMap, {'Filter, ' * filters}BatchMap, "
                    f"JitMap or a callable, got {type(t).__name__} {t!r:.60}; {remedy}"
                )
            t = Map(t)
        if isinstance(t, Pad):  # (between the two: on the records, before their collation)
            if batch:
                raise ConfigError(
                    f"transforms[{i}]: {t!r} pads records before they are collated, but comes "
                    f"after {batch[0]!r}; " + ("one Pad takes several keys: Pad([...])" if
                                               isinstance(batch[0], Pad) else
                                               "put it after the Maps and before BatchMap and "
                                               "JitMap"))
            batch.append(t)
        elif isinstance(t, JitMap):  # (a loader's own: compiled anew, as in its workers; one
            if type(t) is not JitMap:  # kept across loaders kept the globals it first read)
                raise ConfigError(
                    f"transforms[{i}]: {type(t).__name__} is a subclass of JitMap, which runs "
                    "as a BatchMap on the whole batch and loses its attributes on the way to "
                    "the workers; pass the function to JitMap(fn), its settings in a closure "
                    "or a functools.partial")
            batch.append(t.fresh())
        elif isinstance(t, BatchMap):
            batch.append(t)
        elif batch and isinstance(batch[0], Pad) and len(batch) == 1:
            raise ConfigError(f"transforms[{i}]: {t!r} is a record transform after {batch[0]!r}, "
                              "which pads the records as they are collated; put it before the "
                              "Pad")
        elif batch:
            raise ConfigError(
                f"transforms[{i}]: {t!r} is a record transform after a batch transform "
                f"({batch[0]!r}), which runs on the collated batch; put record transforms "
                "(Map, RandomMap) before BatchMap and JitMap, or write this one as a BatchMap "
                "(or into the JitMap)"
            )
        else:
            record.append(t)
    check_hosts(batch, process_count)
    return tuple(record), tuple(batch)


def from_grain(t: Any) -> Map | RandomMap | Filter | None:
    """A Grain transform object (a subclass of ``grain.transforms.Map``, ``RandomMap`` or
    ``Filter``, found by its base's module and its method) as the same transform here, so
    that a Grain pipeline's transforms move over as they are; ``None`` for anything else.
    Grain's ``random_map(x, rng)`` gets the record's generator, as a ``RandomMap`` does.

    Example:
        >>> Base = type("Map", (), {"__module__": "grain.transforms"})  # grain's, in short
        >>> class Scale(Base):
        ...     def map(self, x):
        ...         return x * 2
        >>> from_grain(Scale()).fn(21)
        42
    """
    if callable(t) or isinstance(t, _KINDS) or not any(
            c.__module__.split(".")[0] == "grain" for c in type(t).__mro__[1:]):
        return None
    for method, kind in (("random_map", RandomMap), ("map", Map), ("filter", Filter)):
        if callable(getattr(t, method, None)):
            return kind(getattr(t, method))
    return None


def _grain_name(t: Any) -> str | None:
    """The name of the Grain class ``t``'s class derives from (``Batch``, ``MapWithIndex``),
    or its own where Grain defines it; ``None`` for anything not Grain's."""
    for c in type(t).__mro__:
        if c.__module__.split(".")[0] == "grain":
            return c.__name__
    return None


@loader_names("transform")
class Filter:
    """A per-record predicate ``fn(record) -> bool``: in a ``StreamLoader``'s transforms, the
    records it is false for are dropped and the batch is filled from the records after them
    (the reader's state counts the dropped ones, so a restore goes on after them too). A
    ``DataLoader`` reads fixed positions: filter its source with ``FilteredSource`` instead.

    Example:
        >>> import jaxloader as jl
        >>> long_enough = jl.Filter(lambda r: len(r["text"]) >= 200)
        >>> long_enough.fn({"text": "short"})
        False
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        _check_callable(fn, "Filter")
        self.fn = fn

    def __repr__(self) -> str:
        return f"Filter({fn_name(self.fn)})"


# What ``transforms=`` takes: a list of them, or one alone (a function is a ``Map``'s), or None;
# of the classes themselves, not their names: typing.get_type_hints(DataLoader.__init__) looked
# the names up in the loader's module, where they are not (typeguard, pydantic: NameError)
Transform = Union[Map, RandomMap, BatchMap, Filter, JitMap, Pad, Callable[[Any], Any]]
Transforms = Union[Sequence[Transform], Transform, None]


class RecordRng:
    """Per-record generators: Philox keyed by ``(seed, epoch, position)``, counter by transform.

    One bit generator is reset for each record (cheaper than constructing Philox); the stream equals that of ``np.random.Philox(key=..., counter=...)`` built fresh. The
    generator handed to a transform is valid until the next record.
    """

    def __init__(self, seed: int) -> None:
        self._reset(seed)

    def _reset(self, seed: int) -> None:
        self._seed = seed & MASK64
        self._bitgen = np.random.Philox(key=np.zeros(2, np.uint64))
        self._generator = np.random.Generator(self._bitgen)
        self._state: Any = self._bitgen.state  # set with lists, not the stubs' arrays

    @staticmethod
    def key_counter(seed: int, epoch: int, position: int, transform_index: int):
        key = np.array([seed & MASK64, (epoch << _POSITION_BITS) | position], dtype=np.uint64)
        counter = np.array([0, 0, 0, transform_index], dtype=np.uint64)
        return key, counter

    def at(self, *, epoch: int, position: int, transform_index: int) -> np.random.Generator:
        # key_counter's words as Python ints: Philox's state setter takes any sequence, and
        # two NumPy arrays a record cost more than the reset (8.3 against 3.1 us a record)
        state = self._state
        state["state"]["key"] = [self._seed, (epoch << _POSITION_BITS) | int(position)]
        state["state"]["counter"] = [0, 0, 0, transform_index]
        state["buffer_pos"] = 4  # Philox's 4-word output buffer: empty
        state["has_uint32"] = 0
        state["uinteger"] = 0
        self._bitgen.state = state
        return self._generator

    def __getstate__(self) -> dict:
        return {"seed": self._seed}

    def __setstate__(self, state: dict) -> None:
        self._reset(state["seed"])


def returned_none(where: str, transform: Any, index: int | None = None) -> RecordError:
    """The error for a transform (``transforms[index]``) that returned ``None`` (a ``return``
    left out, mostly): its batches would be ``None``, or the next transform would fail on
    ``None``.

    Example:
        >>> str(returned_none("step 0", Map(len), 1))[:54]
        'step 0: transforms[1] Map(len) returned None, expected'
    """
    drop = ("" if isinstance(transform, BatchMap) else
            "; to leave records out use jaxloader.FilteredSource (a Filter on a stream)")
    named = "" if index is None else f"transforms[{index}] "
    return RecordError(
        f"{where}: {named}{transform!r} returned None, expected the new "
        f"{'batch' if isinstance(transform, BatchMap) else 'record'}; return it from the "
        f"function (a missing `return`?){drop}")


_KINDS = (Map, RandomMap, BatchMap, Filter, JitMap, Pad)  # what transforms= takes as it is


def _check_callable(fn: Any, kind: str) -> None:
    """Refuses what is no function, or one that cannot be called as ``kind`` calls it (said
    as the transform is made, not at the first batch, in a worker)."""
    if not callable(fn):
        raise ConfigError(f"{kind}(fn): expected a callable, got {type(fn).__name__} {fn!r:.60}")
    if isinstance(fn, type) and fn.__module__ != "builtins" and "__call__" in {
            name for cls in fn.__mro__[:-1] for name in vars(cls)}:  # (its instances are)
        raise ConfigError(
            f"{kind}({fn.__qualname__}): got the class, whose instances are the transform "
            f"(it defines __call__); pass one: {kind}({fn.__qualname__}(...)) (called, the "
            "class would make an instance of each record)")
    called = "fn(record, rng)" if kind == "RandomMap" else "fn(batch)" if (
        kind == "BatchMap") else "fn(record)"
    made = getattr(type(fn), "__call__", None) if not inspect.isroutine(fn) and not isinstance(
        fn, functools.partial) else getattr(fn, "func", fn)  # (an instance: its __call__)
    if inspect.isgeneratorfunction(made) or inspect.isasyncgenfunction(made):
        raise ConfigError(  # (the batch refused "a generator" at record 0, naming no transform)
            f"{kind}(fn): {fn_name(fn)} yields, so a call returns a generator, not a "
            f"{'batch' if kind == 'BatchMap' else 'record'}: return it; several examples from "
            "one record (crops of an image) are returned stacked, np.stack([...]), a (k, ...) "
            "leaf folded into the batch in the step, or read from a source of (record, part) "
            "pairs (docs/troubleshooting.md, 'Several examples from one record')")
    signature = refused_call(fn, *[None] * called.count(","), None)
    if signature is None:
        return
    remedy = ("a function of the record alone is a Map's: jl.Map(fn)" if kind == "RandomMap"
              else "a BatchMap's draws come from a RandomMap before it, returned as a leaf"
              if kind == "BatchMap" else f"pass a function of one {called[3:-1]}")
    remedy += ("" if kind == "BatchMap" else " (the record is one argument, a tuple record "
               "unpacked in the function: image, label = record)") + (
        "; a function of the record and a generator is a RandomMap's: jl.RandomMap(fn)"
        if kind not in ("BatchMap", "RandomMap") and refused_call(fn, None, None) is None
        else "")
    raise ConfigError(f"{kind}(fn): fn is called as {called}, but {fn_name(fn)}{signature} "
                      f"cannot be; {remedy}")


fn_name = callable_name  # (its name here: what the loaders and derived sources import)
