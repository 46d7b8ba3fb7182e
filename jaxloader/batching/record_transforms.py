"""``RecordTransforms``: a loader's record transforms run on one record, the one runner both
batch makers use (``batch_maker`` for sources, ``stream_batch_maker`` for streams).

::

    record ──Map: fn(record)──RandomMap: fn(record, rng(seed, epoch, position, index + salt))
           ──Filter: fn(record) false? DROPPED──> record
    an error, or a transform that returns None: RecordError naming where, the transform and
    its index (the original error its cause)

A ``RandomMap``'s generator is keyed by the record's place, never by the worker running it; a
stream redraws, with ``salt``, for a record read in place of one a ``Filter`` dropped.

Example:
    >>> from jaxloader.batching.transforms import Map, RandomMap
    >>> run = RecordTransforms((Map(lambda r: r + 1), RandomMap(lambda r, rng: r * 2)), seed=0)
    >>> run(3, 0, 7, lambda: "step 1")
    8
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any, Callable, Mapping

from jaxloader.base.errors import JaxloaderError, RecordError, raised
from jaxloader.base.own_records import top_copy
from jaxloader.base.read_threads import count as read_threads
from jaxloader.base.timings import stage_names, timed_calls
from jaxloader.batching.global_draws import WATCHED, DrawWatch
from jaxloader.batching.transforms import Filter, Map, RandomMap, RecordRng, returned_none

DROPPED = object()  # what a record a Filter drops becomes
_MAP, _RANDOM, _FILTER = 0, 1, 2


class RecordTransforms:
    """``transforms`` (``Map``, ``RandomMap``, ``Filter``) of a loader seeded ``seed``."""

    def __init__(self, transforms: tuple, seed: int, copies: bool = False) -> None:
        """``copies``: a dict or list record is given to the transforms as a copy of its top
        level (``base.own_records``: a source of the user's hands out its own)."""
        kinds = {Map: _MAP, RandomMap: _RANDOM, Filter: _FILTER}
        self._copies = copies and any(kinds[type(t)] != _FILTER for t in transforms)
        self.transforms = transforms
        self._steps = tuple(enumerate((t.fn, kinds[type(t)]) for t in transforms))
        self.names = stage_names(transforms)  # each one's stage in the timings
        self.spent: dict[str, float] = {}  # seconds a transform, while timed (``detail``)
        self._timed: tuple | None = None  # the steps, each timed: made when first asked for
        self._active = self._steps
        self._rng = RecordRng(seed)
        self.filters = any(kind == _FILTER for _, (_, kind) in self._steps)
        self._watch = DrawWatch(transforms)  # (a transform that draws from np.random)
        self._watched = WATCHED if transforms else 0  # records left to watch

    def __bool__(self) -> bool:
        return bool(self._steps)

    def detail(self, on: bool) -> None:
        """Times each transform into ``spent`` (on) or runs them bare (off)."""
        if on and self._timed is None:
            timed = timed_calls([(name, fn) for name, (_, (fn, _)) in zip(self.names,
                                                                          self._steps)],
                                self.spent)
            self._timed = tuple((i, (fn, kind)) for fn, (i, (_, kind)) in zip(timed,
                                                                              self._steps))
        self._active = self._timed if on and self._timed is not None else self._steps
        if on:
            self.spent.clear()

    def __call__(self, record: Any, epoch: int, position: int, where: Callable[..., str],
                 where_args: tuple = (), salt: int = 0, filters: bool = True) -> Any:
        """``record``, at ``position`` of ``epoch``, through the transforms (``DROPPED`` if a
        ``Filter`` drops it; with ``filters=False`` through the others only);
        ``where(*where_args)`` names the record in an error. (Called once a record: its
        arguments are positional.)"""
        if self._watched:
            return self._watching(record, epoch, position, where, where_args, salt, filters)
        if self._copies:
            record = top_copy(record)
        t_index = -1
        try:
            for t_index, (fn, kind) in self._active:
                if kind == _MAP:
                    record = fn(record)
                elif kind == _RANDOM:
                    record = fn(record, self._rng.at(epoch=epoch, position=position,
                                                     transform_index=t_index + salt))
                elif filters:
                    if not kept_answer(fn(record), lambda: f"{where(*where_args)}: transforms"
                                       f"[{t_index}] {self.transforms[t_index]!r}"):
                        return DROPPED
                if record is None:
                    raise returned_none(where(*where_args), self.transforms[t_index], t_index)
        except JaxloaderError:
            raise
        except Exception as e:
            raise RecordError(
                f"{where(*where_args)}: transforms[{t_index}] {self.transforms[t_index]!r} "
                f"raised {type(e).__name__}{f': {e}' if str(e) else ''}{read_only_hint(e)}"
                f"{keys_hint(e, record)}{arguments_hint(e, self.transforms[t_index].fn)}"
                f"{_memory_hint(e)}; the original error is the cause below") from e
        return record

    def _watching(self, record: Any, *args: Any) -> Any:
        """``self(record, *args)``, each transform watched for draws from the global random
        state (``global_draws``) on the process's main thread. Made elsewhere (a device-put
        thread's batches, this loader's in this process all are) or beside reads on threads,
        where others draw meanwhile, they are not watched, from then on."""
        if threading.current_thread() is not threading.main_thread() or read_threads() > 1:
            self._watched = 0
            return self(record, *args)
        left, self._watched = self._watched - 1, 0  # (the call below runs them watched)
        active = self._active
        self._active = self._watch.steps(active)
        try:
            record = self(record, *args)
        finally:
            self._active, self._watched = active, left
        self._watch.say()
        if self._watch.said:
            self._watched = 0
        return record


def keys_hint(e: Exception, given: Any, what: str = "record") -> str:
    """For a ``KeyError`` of a key ``given`` (a dict a transform was given) does not hold (a
    transform before renamed it): the keys it holds (else nothing)."""
    if not (type(e) is KeyError and e.args and isinstance(given, Mapping)):
        return ""
    try:
        if e.args[0] in given:
            return ""
    except TypeError:  # (an unhashable key)
        return ""
    keys = sorted(map(str, given))
    return f" (the {what} it was given has keys {keys[:20]}{' ...' if len(keys) > 20 else ''})"


def read_only_hint(e: Exception) -> str:
    """What to do about a transform that wrote into a read-only record, or spawned from a
    ``RandomMap``'s generator (else nothing)."""
    if isinstance(e, ValueError) and "read-only" in str(e):
        return (" (source records are read-only views, shared with the workers and the "
                "source itself: copy what you change, e.g. r['x'].copy() or np.array(r['x']))")
    if isinstance(e, TypeError) and "does not implement spawning" in str(e):
        return (" (a RandomMap's rng is a Philox keyed by the seed, epoch and record, which "
                "NumPy cannot spawn from: draw each view's numbers from rng itself, or make "
                "generators of it, [np.random.default_rng(s) for s in rng.integers(2**63, "
                "size=2)])")
    return ""


def _memory_hint(e: Exception) -> str:
    """What to look at for a transform that ran out of memory (a ``MemoryError`` says
    nothing of its own)."""
    if not isinstance(e, MemoryError):
        return ""
    return (" (out of memory in this transform: a record larger than the others, an image of "
            "very many pixels say; check its size before decoding it, e.g. PIL's "
            "Image.open(...).size, or give the process more memory)")


def arguments_hint(e: Exception, fn: Any) -> str:
    """What to do about a record transform ``fn`` called with other arguments than it takes (a
    tf.data-style ``fn(image, label)``: its code never ran), or with a generator it used as
    another kind (``rng.randint``: the legacy ``RandomState``'s; ``jax.random.*(rng)``), else
    nothing."""
    said = str(e)
    if "numpy.random._generator.Generator" in said:  # (RandomMap's rng)
        legacy = {"randint": "integers", "rand": "random", "randn": "standard_normal",
                  "random_sample": "random", "random_integers": "integers", "seed": ""}
        name = said.rsplit("'", 2)[-2] if isinstance(e, AttributeError) else ""
        return (" (a RandomMap's rng is a numpy.random.Generator, seeded for each record"
                + (f": rng.{legacy[name]} for RandomState's {name}" if legacy.get(name) else
                   ": it is seeded already, from (seed, epoch, position)" if name == "seed"
                   else "") + "; for a jax.random key, write the transform as a jl.JitMap, "
                "fn(record, key))")
    if not (isinstance(e, TypeError) and "positional argument" in said):
        return ""
    inner = inspect.unwrap(getattr(fn, "func", fn))  # (a partial's, a decorated function's)
    code = getattr(inner, "__code__", None) or getattr(  # (an object's __call__)
        getattr(type(inner), "__call__", None), "__code__", None)
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:  # (raised inside it: another call's arguments)
            return ""
        tb = tb.tb_next
    return (" (a Map calls fn(record), a RandomMap fn(record, rng): the record is one "
            "argument, a tuple record unpacked in the function: image, label = record)")


def source_read_only_hint(e: Exception) -> str:
    """What to do about a source that wrote into its own arrays in a worker, else nothing."""
    if isinstance(e, ValueError) and "read-only" in str(e) and _in_a_worker():
        return (" (a source's arrays of 1 MiB or more reach the workers as shared read-only "
                "views; with num_workers=0 they are your own: keep what the source changes, a "
                "cache, in arrays it makes in the worker, e.g. np.array(x) copies)")
    return ""


def indices_hint(e: Exception, read: Any) -> str:
    """For a ``TypeError`` from a ``__getitems__`` of the user's (not one of jaxloader's
    sources), at the top or under one of them: what it was given."""
    if read is not None or not isinstance(e, TypeError):
        return ""
    tb = e.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__getitems__" and not str(
                frame.f_globals.get("__name__", "")).startswith("jaxloader."):
            return (" (__getitems__ is given the indices as an int64 NumPy array, where "
                    "PyTorch gives a list: indices.tolist() where your code needs one)")
        tb = tb.tb_next
    return ""


def read_failed(where: Callable[[int, int], str], position: int, index: int,
                e: Exception) -> str:
    """The message of a record's ``source[index]`` that raised ``e`` (``where`` names it)."""
    return (f"{where(position, index)}: source[index] raised {raised(e)}"
            f"{source_read_only_hint(e)}; the original error is the cause below")


def _in_a_worker() -> bool:
    """Whether this process makes batches for a training process elsewhere: a worker, or a
    Ray actor (which gets the source's arrays as read-only views of Ray's object store)."""
    from jaxloader.runtime.worker_info import get_worker_info

    if get_worker_info() is not None:
        return True
    ray = sys.modules.get("ray")
    try:
        return bool(ray is not None and ray.is_initialized()
                    and ray.get_runtime_context().get_actor_id())
    except Exception:  # noqa: BLE001 (Ray's: not known to be an actor)
        return False


def kept_answer(kept: Any, said: Callable[[], str], shown: str = "") -> bool:
    """A filter's answer for a record as a bool; ``None`` (a return left out: every record
    dropped, silently) and a string (``"no"`` is true: every record kept) refused, ``said()``
    naming the filter and the record (``shown``: the answer, where it is not at hand).

    Example:
        >>> kept_answer(0, lambda: "Filter(f)")
        False
    """
    if kept is None or isinstance(kept, (str, bytes)):
        raise RecordError(
            f"{said()} returned {shown or f'{kept!r:.40}'}, expected True (keep the record) or "
            "False (drop it)" + ("; a return left out?" if kept is None else
                     ", which a string is not (any but '' is true)"))
    return bool(kept)
