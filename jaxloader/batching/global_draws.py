"""``DrawWatch``: a loader's record transforms, watched on their first records for draws from
NumPy's or Python's global random state (``np.random.randint``, ``random.random``; an
augmentation library may draw there inside).

Such numbers are not the loader's: the batches then differ with the worker count, from run to
run, and after a restore, without a word. The same holds of a generator a transform holds (an
augmentation object's ``self.rng``, one its closure or the globals its code names hold:
``held_generators``), and worse: each worker gets a copy of it in one state, so the workers
draw the same numbers (one worker's augmentations another's); it is watched the same way.

``RecordTransforms`` runs each transform through the watch for the first ``WATCHED`` records a
loader makes in a process, on the process's main thread only (the training process's other
threads, a device-put thread's batches beside the training loop, draw too), and warns once a
transform has moved the global state on ``SEEN`` records (a module a transform imports once may
draw as it is imported: JAX does). Then the transforms run bare.

Example:
    >>> import warnings
    >>> import numpy as np
    >>> from jaxloader.batching.transforms import Map
    >>> noisy = Map(lambda r: r + np.random.randint(10))
    >>> watch = DrawWatch((noisy,))
    >>> ((_, (fn, _)),) = watch.steps(((0, (noisy.fn, 0)),))
    >>> with warnings.catch_warnings(record=True) as said:
    ...     warnings.simplefilter("always")
    ...     _ = [fn(1) for _ in range(SEEN)]
    ...     watch.say()  # (once the record's transforms have returned)
    >>> str(said[0].message)[:61]
    'transforms[0] Map(<lambda>) drew from the global random state'
"""

from __future__ import annotations

import inspect
import sys
import threading
import warnings
import weakref
from typing import Any, Callable

from jaxloader.base.errors import JaxloaderWarning
from jaxloader.base.random_state import draws, generator_state, global_examples, warn_at
from jaxloader.sources.held_generators import held_generators, unseeded_makers

WATCHED = 16  # records a loader's transforms are watched on, in each process
SEEN = 2  # records a transform drew on before it is said


class DrawWatch:
    """The watch of ``transforms`` (a loader's record transforms, in order)."""

    def __init__(self, transforms: tuple, batches: bool = False) -> None:
        """``batches``: a ``BatchMap`` (one, ``transforms[0]``), watched on batches, held
        weakly: its watch is the value of a weak dict keyed by it, which a strong hold kept,
        with all its function holds, for the life of the process."""
        self._batches = batches
        self._transforms: Any = weakref.ref(transforms[0]) if batches else transforms
        self.said = False
        self._held: list | None = None  # (found in each process: a copy pickled with the
        # watch is not the generator an imported module's function draws from there)
        self._drew: dict[int, int] = {}
        self._from: dict[int, str] = {}  # a transform's held generator it drew from
        self._pending: int | None = None  # a transform to say, once its call has returned
        self._steps: dict[int, tuple] = {}  # id of the steps given -> them watched

    @property
    def transforms(self) -> tuple:
        """The transforms watched (a ``BatchMap``'s watch: it, while it lives)."""
        return (self._transforms(),) if self._batches else self._transforms

    def steps(self, steps: tuple) -> tuple:
        """``steps`` (``(index, (fn, kind))`` each: the bare ones, or the timed ones of a
        timed batch) with each ``fn`` watched."""
        watched = self._steps.get(id(steps))
        if watched is None or watched[0] is not steps:
            watched = self._steps[id(steps)] = (steps, tuple(
                (i, (self._watched(fn, i), kind)) for i, (fn, kind) in steps))
        return watched[1]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_held": None, "_steps": {}}

    def _watched(self, fn: Callable[..., Any], index: int) -> Callable[..., Any]:
        if self._held is None:
            self._held = held_generators(self.transforms)
            self._unseeded()
        held = [(where, g) for i, where, g in self._held if i == index]
        searched = [False]  # (again after its first call: a module it imports then, in a

        def call(*args: Any) -> Any:  # fresh worker, from augs import TRAIN, held its own)
            before, states = draws(), [generator_state(g) for _, g in held]
            out = fn(*args)
            moved = [where for (where, g), state in zip(held, states) if generator_state(g) != state]
            if not searched[0]:
                searched[0] = True
                known = {id(g) for _, g in held}
                held.extend((where, g) for _, where, g in held_generators(
                    self.transforms[index:index + 1]) if id(g) not in known)
            if moved:
                self._from[index] = moved[0]
            if moved or before is not None and draws() != before:
                self._drawn(index)
            return out
        return call

    def _unseeded(self) -> None:
        """Warns of a generator the transforms' code makes without a seed, at its line: its
        numbers are the operating system's, not the loader's, whatever the seed."""
        for index, where, what, file, line in unseeded_makers(self.transforms):
            named = f"{self.transforms[index]!r}" if self._batches else \
                f"transforms[{index}] {self.transforms[index]!r}"
            warnings.warn_explicit(
                f"{named} makes a random generator without a seed ({what} in {where}): each "
                "one draws from the operating system's entropy, so the batches differ from run "
                "to run, with the worker count and after a restore, whatever the loader's seed; "
                "draw from the generator a RandomMap gives (jl.RandomMap(lambda record, rng: "
                "... rng.random() ...)), or seed it from the record itself", JaxloaderWarning,
                file, line)

    def _drawn(self, index: int) -> None:
        self._drew[index] = self._drew.get(index, 0) + 1
        if self._drew[index] >= SEEN and not self.said and self._pending is None:
            self._pending = index

    def say(self) -> None:
        """Warns of the transform that drew, if one did: called once its record's transforms
        have returned (a warning made an error is then no error of the transform's)."""
        if self._pending is None or self.said:
            return
        index, self._pending, self.said = self._pending, None, True
        transform = self.transforms[index]
        fn = inspect.unwrap(getattr(transform.fn, "func", transform.fn))
        code = getattr(fn, "__code__", None)
        held = self._from.get(index)
        what = f"the global random state ({global_examples()})" \
            if held is None else f"a random generator it holds ({held})"
        named = f"{transform!r}" if self._batches else f"transforms[{index}] {transform!r}"
        unit = "batch" if self._batches else "record"
        remedy = ("draw in a RandomMap what each record needs (returned as a leaf: a mixing "
                  "weight, negative samples), or from a JitMap's key, and use it here"
                  if self._batches else "draw from the generator a RandomMap gives (jl."
                  "RandomMap(lambda record, rng: ... rng.random() ...); a random Filter: draw "
                  "in a RandomMap, then filter on what it drew)")
        others = held is None and any(  # (a thread of the user's may draw meanwhile)
            "jaxloader" not in t.name for t in threading.enumerate()
            if t is not threading.current_thread())
        warnings.warn_explicit(  # (at the transform's code: a worker has no frame of yours)
            f"{named} drew from {what} on {SEEN} of the first "
            f"{'batches' if self._batches else 'records'}" + (
                " (or another of this process's threads drew while it ran)" if others else "")
            + f": unless it seeds it from the {unit} itself first (then leave this be), or its "
            f"draws do not shape what it returns, its numbers are not the loader's, so the "
            "batches differ with the worker count" + (
                ", from run to run and after a restore (and workers seeded alike, "
                "np.random.seed(get_worker_info().seed) in worker_init_fn, draw the same "
                "numbers: their augmentations repeat)" if held is None else
                " and after a restore (and from run to run, unless it is seeded), and each "
                "worker draws from a copy made in one state: the same numbers, one worker's "
                "augmentations another's") + f"; {remedy} (a library's own generator: set it "
            "from the RandomMap's rng before each call)", JaxloaderWarning,
            code.co_filename if code else "<transform>", code.co_firstlineno if code else 0)


WATCHED_BATCHES = 8  # batches a BatchMap is watched on, in each process
_BATCH_WATCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # BatchMap -> watch


def batch_call(transform: Any, batch: Any) -> Any:
    """``transform.fn(batch)`` (a ``BatchMap``'s), watched as a record transform is on its first
    ``WATCHED_BATCHES`` batches in this process's main thread: a mixup drawing its weights from
    ``np.random``, or from a generator it holds (a copy in each worker: the same weights), was
    not watched at all."""
    if threading.current_thread() is not threading.main_thread():
        return transform.fn(batch)
    try:
        watch = _BATCH_WATCHES.get(transform)
        if watch is None:
            watch = _BATCH_WATCHES[transform] = [WATCHED_BATCHES, DrawWatch((transform,), True)]
    except TypeError:  # (not weakly referable: not watched)
        return transform.fn(batch)
    if watch[0] <= 0:
        return transform.fn(batch)
    watch[0] -= 1
    ((_, (fn, _)),) = watch[1].steps(((0, (transform.fn, 0)),))
    return fn(batch)


def batch_said(transform: Any) -> None:
    """Warns of a ``BatchMap`` whose watched calls drew (``batch_call``), once its call has
    returned: a warning made an error is then no error of the transform's (a ``RecordError``
    naming the batch, its cause the warning)."""
    watch = _BATCH_WATCHES.get(transform)
    if watch is not None and watch[1]._pending is not None:
        watch[0] = 0
        watch[1].say()


def traced_call(transform: Any, call: Callable[[], Any]) -> Any:
    """``call()``, a ``JitMap``'s function as JAX traces it, warned of where it drew from
    NumPy's or Python's global random state: it runs once, as it is compiled, so the draw is
    one constant for every record (another in each worker and each run), where the same
    code in a ``Map`` is watched. Asked on the main thread alone (another may draw)."""
    before = draws() if threading.current_thread() is threading.main_thread() else None
    modules = len(sys.modules)
    out = call()
    if before is not None and draws() != before and len(sys.modules) == modules:  # (a module
        # imported as it was traced may draw as it is imported: flax.linen does)
        warn_at(transform.fn, (
            f"{transform!r} drew from the global random state ({global_examples()}) as JAX "
            "traced it: a JitMap's function runs once, as it is compiled, so that draw is one "
            "number for every record, another in each worker and each run; draw from the key "
            "the JitMap gives (jl.JitMap(lambda record, key: ... jax.random.randint(key, ...) "
            "...)), or in a RandomMap before it"),
            "<transform>")
    return out

