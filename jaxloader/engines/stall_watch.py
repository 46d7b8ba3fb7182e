"""``StallWatch``: a batch made in process (``num_workers=0``) on the device-put thread
(``sharding=``) said in the log when it is late, with the stack of the thread making it, as a
worker's late batch is (``workers.failures``): a source that blocks (a hung mount, a lock)
was otherwise waited on in silence.

The thread that waits for the batch looks (``look_all``, from the device-put thread's
``get()``), a few times a ``stall_warning_s``: no thread of its own (one counted among the
process's threads, and outlived a test's loaders). A batch made in the thread that asks for
it has no one waiting to say it (Ctrl-C shows where). A batch costs its watch two assignments.

Example:
    >>> watch = StallWatch(300.0, "DataLoader 1", lambda step: f"step {step}")
    >>> watch.begin(4); watch.end()
    >>> watch.close()
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
import weakref
from typing import Callable

_LOG = logging.getLogger("jaxloader")
_FRAMES = 12  # innermost frames of the making thread's stack said


class StallWatch:
    """The watch of one in-process engine's batches: each said once it has been made for
    ``warn_s`` seconds, and again every ``warn_s`` (``None``: never); ``where(step)`` names a
    step's batch."""

    def __init__(self, warn_s: float | None, label: str, where: Callable[[int], str]) -> None:
        self.warn_s, self.label, self._where = warn_s, label, where
        self._making: tuple[int, float, int] | None = None  # step, since, thread ident
        self._said = 0  # reports of the batch being made
        if warn_s is not None:
            _watching(self)

    def begin(self, step: int) -> None:
        """The calling thread begins making ``step``'s batch."""
        if self.warn_s is not None:
            self._said, self._making = 0, (step, time.monotonic(), threading.get_ident())

    def end(self) -> None:
        self._making = None

    def close(self) -> None:
        self.warn_s = self._making = None

    def look(self, now: float) -> None:
        """Says the batch being made if it is late (called by a thread that waits in this
        process: ``look_all``)."""
        making, warn_s = self._making, self.warn_s
        if making is None or warn_s is None or now - making[1] < warn_s * (self._said + 1):
            return
        step, since, ident = making
        frames = sys._current_frames()
        frame = frames.get(ident)
        thread = next((t.name for t in threading.enumerate() if t.ident == ident), "?")
        stack = "".join(traceback.format_stack(frame)[-_FRAMES:]) if frame is not None else ""
        stack += _reads_under_way(frames)
        try:
            where = self._where(step)
        except Exception:  # noqa: BLE001 - (a report: the step alone)
            where = f"step {step}"
        _LOG.warning(  # (said by a next() waiting in this process: perhaps another loader's)
            "%s: a batch in the making for %.1f s: %s, made in this process (num_workers=0) "
            "by thread %r, at:\n%sNothing times it out (workers and timeout_s= would); "
            "stall_warning_s= sets when this is said", self.label, now - since, where,
            thread, stack)
        if self._making is making:
            self._said = int((time.monotonic() - since) // warn_s)


def _reads_under_way(frames: dict) -> str:
    """The stacks of the read threads (``read_threads=``) in a read now, the first two: the
    batch's thread waits for them, and its own stack ends in that wait, not the source's
    line that blocks."""
    said = []
    for t in threading.enumerate():
        frame = frames.get(t.ident) if t.name.startswith("jaxloader-read") else None
        if frame is not None and frame.f_code.co_name != "_run":  # (idle: in the pool's loop)
            said.append(f"and its read thread {t.name!r}, at:\n" + "".join(
                traceback.format_stack(frame)[-_FRAMES:]))
    return "".join(said[:2])


_WATCHES: weakref.WeakSet[StallWatch] = weakref.WeakSet()


def _watching(watch: StallWatch) -> None:
    _WATCHES.add(watch)


def look_all() -> float | None:
    """Says each live watch's batch that is late (called by a thread that waits for one: the
    training thread in ``next()``, while the device-put thread makes it); returns how long to
    wait before looking again, or ``None`` where no watch is live."""
    watches = [w for w in list(_WATCHES) if w.warn_s is not None]
    if not watches:
        return None
    now = time.monotonic()
    for watch in watches:
        watch.look(now)
    return max(0.05, min([1.0, *(w.warn_s / 4 for w in watches if w.warn_s is not None)]))
