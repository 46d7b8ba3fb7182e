"""``StreamPositions``: a ``StreamLoader``'s readers' states as of a step, under one lock.

Each batch brings its reader's state after it (``reports[step]``); the states as of the next
batch handed out are the base (as of ``base_step``) with the reports of the steps since filed
in (``stream_runs.overlaid``). ``StreamLoader`` sets the attributes named below as it is made.
"""

from __future__ import annotations

import threading
from typing import Any

from jaxloader.base.state_copy import copied
from jaxloader.loaders.stream_runs import overlaid
from jaxloader.sharding.prefetch import Stopped


class StreamPositions:
    """The readers' states of a ``StreamLoader`` (a mixin of it): as of the step handed out,
    as of a step, or ahead for a run made anew, each read or filed under ``_filing``."""

    _filing: threading.RLock  # (_fold's)
    _filing_now: bool  # whether a fold runs (on the thread holding _filing)
    _progress: Any  # (iterator.Progress: the step of the next batch handed out)
    _base: list[dict]  # the readers' states as of step _base_step
    _base_step: int
    _reports: dict[int, dict]  # each step's reader's state after its batch
    _until: list[int] | None  # a pass: the epoch each reader stops before
    _ended: bool  # whether the pass _until was seen to end

    def _states_now(self) -> tuple[int, list[dict], list[int] | None, bool]:
        """The step of the next batch handed out, each reader's state as of it (copies) and the
        pass (``_until``, ``_ended``), read together: another thread's ``state_dict()`` read
        the step apart, which the states the consumer had filed since were ahead of (a restore
        skipped the batches between), and the pass apart, which a restore may change."""
        with self._filing:
            step = self._progress.step
            return step, self._states_at(step), self._until, self._ended

    def _states_at(self, step: int) -> list[dict]:
        """Each reader's state once the batches before ``step`` are handed out (copies)."""
        return [copied(s) for s in self._fold(step)]

    def _fold(self, step: int) -> list[dict]:
        """The readers' states as of ``step`` (handed out), the reports before it filed in
        (not copies: read them only). One thread at a time (another's state_dict(), the
        consumer's, a run's on the device-put thread): two at once could file an older report
        over a newer one; and within a fold on this thread (a signal handler's state_dict()),
        read, not filed, for the same reason."""
        with self._filing:
            step = min(step, self._progress.step)  # (a stale run's, after a restore: not past it)
            base, reports = self._base, self._reports
            if self._filing_now:
                return overlaid(base, self._base_step, reports, step)
            self._filing_now = True
            try:  # filed, in one slice assignment, before taken out: a Ctrl-C between the two
                base[:] = overlaid(base, self._base_step, reports, step)  # files them again
                for s in range(self._base_step, step):  # (no branch here: a Ctrl-C at a branch's
                    reports.pop(s, None)  # back edge skipped the with's and finally's exits, 3.13)
                if self._base is base:  # (not replaced meanwhile: a handler's load_state_dict())
                    self._base_step = max(self._base_step, step)
            finally:
                self._filing_now = False
            return base

    def _states_ahead(self, start: int, generation: int) -> list[dict]:
        """Each reader's state once the batches before ``start`` are made (copies), for a run
        from ``start`` of ``generation``, the position left as it is: a run made anew on the
        device-put thread (``stream_runs.rehosted``) starts ahead of what was handed out, and
        filing to there moved the position past batches not handed out, which a state_dict()
        then skipped. A run made stale meanwhile gives way (``Stopped``): a signal handler's
        load_state_dict() within a fold waits, holding the lock, for this thread to end."""
        while not self._filing.acquire(timeout=0.05):
            if generation != self._progress.generation:
                raise Stopped(f"a run of {self._progress.owner} made stale")
        try:
            held, self._filing_now = self._filing_now, True  # (a handler's fold within: reads)
            try:
                return [copied(r) for r in overlaid(self._base, self._base_step,
                                                     self._reports, start)]
            finally:
                self._filing_now = held
        finally:
            self._filing.release()
