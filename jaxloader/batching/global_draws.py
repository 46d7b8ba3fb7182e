"""``DrawWatch``: a loader's record transforms, watched on their first records for draws from
NumPy's or Python's global random state (``np.random.randint``, ``random.random``; an
augmentation library may draw there inside).

Such numbers are not the loader's: the batches then differ with the worker count, from run to
run, and after a restore, without a word. ``RecordTransforms`` runs each transform through the
watch for the first ``WATCHED`` records a loader makes in a process, on the process's main
thread only (the training process's other threads, a device-put thread's batches beside the
training loop, draw too), and warns once a transform has moved the global state on ``SEEN``
records (a module a transform imports once may draw as it is imported: JAX does). Then the
transforms run bare.

Example:
    >>> import warnings
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
import random
import warnings
from typing import Any, Callable

import numpy as np

from jaxloader.base.errors import JaxloaderWarning

WATCHED = 16  # records a loader's transforms are watched on, in each process
SEEN = 2  # records a transform drew on before it is said


class DrawWatch:
    """The watch of ``transforms`` (a loader's record transforms, in order)."""

    def __init__(self, transforms: tuple) -> None:
        self.transforms = transforms
        self.said = False
        self._drew: dict[int, int] = {}
        self._pending: int | None = None  # a transform to say, once its call has returned
        self._steps: dict[int, tuple] = {}  # id of the steps given -> them watched

    def steps(self, steps: tuple) -> tuple:
        """``steps`` (``(index, (fn, kind))`` each: the bare ones, or the timed ones of a
        timed batch) with each ``fn`` watched."""
        watched = self._steps.get(id(steps))
        if watched is None or watched[0] is not steps:
            watched = self._steps[id(steps)] = (steps, tuple(
                (i, (self._watched(fn, i), kind)) for i, (fn, kind) in steps))
        return watched[1]

    def _watched(self, fn: Callable[..., Any], index: int) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            before = _draws()
            out = fn(*args)
            if before is not None and _draws() != before:
                self._drawn(index)
            return out
        return call

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
        warnings.warn_explicit(  # (at the transform's code: a worker has no frame of yours)
            f"transforms[{index}] {transform!r} drew from the global random state "
            f"(np.random.randint, random.random, ...) on {SEEN} of the first records: its "
            "numbers are not the loader's, so the batches differ with the worker count, from "
            "run to run and after a restore (and workers forked from one state draw the same "
            "numbers: their records' augmentations repeat); draw from the generator a "
            "RandomMap gives (jl.RandomMap(lambda record, rng: ... rng.random() ...); a random "
            "Filter: draw in a RandomMap, then filter on what it drew). A transform that seeds "
            "the global state from the record itself may leave this be", JaxloaderWarning,
            code.co_filename if code else "<transform>", code.co_firstlineno if code else 0)


def _draws() -> tuple | None:
    """Where NumPy's and Python's global generators are (a draw moves them); ``None`` where
    that cannot be asked."""
    try:
        numpy = np.random.get_state(legacy=False)  # (a dict for every bit generator, with
        python = random.getstate()  # the legacy Gaussian that every other normal() takes)
    except Exception:  # noqa: BLE001 - (a watch only: nothing to say then)
        return None
    return _brief(numpy), python[1][0], python[1][-1], python[2]


def _brief(value: Any) -> Any:
    """A state's values, an array by its size and ends (MT19937's position moves each draw,
    its key each 624)."""
    if isinstance(value, dict):
        return tuple((key, _brief(item)) for key, item in value.items())
    if isinstance(value, np.ndarray):
        return (value.size, value.flat[0].item(), value.flat[-1].item()) if value.size else ()
    return value
