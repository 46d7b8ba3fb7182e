"""Stage timings: where a batch's time goes, measured in the process that does the work.

::

    worker or in-process maker          StageClock: seconds a stage (read, each transform by
      read ─ transforms ─ collate          name, collate, slot wait), batches, records, bytes;
                                           busy and CPU seconds a task (workers)
      ──(a worker: with each Done)──>   main process: one clock a worker, + hand-over,
                                           placement, the consumer's wait and step

A process's first ``SAMPLE`` batches are timed, then one in ``SAMPLE`` (timers on every batch
cost ~5% of a small batch made in process): the time a process worked (each task's, or each
batch's in process: exact) is split by the timed batches' shares of each stage; batches are
counted each, records and bytes at the timed batches' mean size. On a timed batch the record
loop (a source's records read one by one and each transform run on it) is timed in detail too
(a timer a transform a record costs about what a small ``Map`` does), its split between the
read and each transform applied to the loop's time. While tracing (a profile), every batch is
timed (a maker asks ``made <= SAMPLE or not made % SAMPLE or trace`` inline: a call a batch
would cost what the timers cost). A slot wait is timed each time, and taken out of the timed
batch's collation it happens inside (``span``): counted in both, it took the rest's shares.

The training process times its receipts of workers' messages by the same rule (``weight``,
counted from the stats' reset), and on each timed one marks a batch waiting to be handed out
(``Timed``), a different one of those waiting each time; that batch's hand-over is timed. The
hand-over's seconds are the timed receipts' mean for each receipt plus the timed hand-overs'
mean for each batch handed out (``Gauges.hand_over_s``): no receipt or batch after the last
timed one is left out. A batch handed out plainly pays no test of its own: the pool's loop
asks whether what it took is a plain tuple, as it must anyway to find a failure.

Example:
    >>> clock = StageClock()
    >>> clock.add(SLOT_WAIT, 0.25)  # timed each time it happens
    >>> clock.take(busy=0.25)[0]
    (('slot wait', 0.25),)
"""

from __future__ import annotations

import time

import threading
from collections import deque
from time import perf_counter
from typing import Any, Callable

# stages, as named in LoaderStats.stages (a transform's stage is its repr: "Map(decode)")
READ = "read"  # the source's reads (its own decoding included); a stream's reader
COLLATE = "collate"  # records into columns, into the slot (BatchMaps are their own stages)
SLOT_WAIT = "slot wait"  # a worker waiting for a bigger slot (a batch that outgrew its slot)
HANDOVER = "hand-over"  # the main process taking a worker's batch (messages, views)
PLACE = "placement"  # device_put of the batch (sharding)
WAIT = "consumer wait"  # the training loop inside next()
STEP = "step"  # the training loop between next() calls
LOOP = "record loop"  # (internal) the read and record transforms of one batch, before the split
COMPILED = " compile"  # a JitMap's trace and compilation, once a shape ("JitMap(f) compile"):
# timed each time, apart from its batches' cost
SAMPLE = 16  # one batch (or receipt) in this many is timed, times scaled by it; a power of 2


def weight(n: int) -> int:
    """What the ``n``-th (from 1) of a process's like events stands for if timed: itself for
    the first ``SAMPLE``, ``SAMPLE`` of them for one in ``SAMPLE`` after; 0: not timed.

        >>> [weight(n) for n in (1, 16, 17, 32)]
        [1, 1, 0, 16]
    """
    return 1 if n <= SAMPLE else 0 if n & (SAMPLE - 1) else SAMPLE


class Timed(tuple):
    """A batch ready for hand-over whose hand-over is timed (see the module docstring)."""


class StageClock:
    """Seconds by stage, batches, records and bytes; see the module docstring.

    Example:
        >>> clock = StageClock()
        >>> for _ in range(3):  # three batches made, each timed (the first SAMPLE are)
        ...     clock.made += 1
        ...     _ = clock.span(READ, perf_counter() - 0.25)
        ...     clock.count(32, 4096)
        >>> stages, batches, records, nbytes, _ = clock.take(busy=0.8)
        >>> [(stage, round(s, 2)) for stage, s in stages], batches, records
        ([('read', 0.8)], 3, 96)
    """

    def __init__(self) -> None:
        self.exact: dict[str, float] = {}  # seconds of what is timed each time, since take()
        self.sampled: dict[str, float] = {}  # seconds of the timed batches, since made
        self.split: dict[str, float] = {}  # the record loop's detail, of the timed batches
        self.trace: list | None = None  # (stage, start, end) a stage of a batch, when tracing
        self.made = 0  # batches made since the clock was made (``batches``: since ``take``)
        self._taken = 0
        self._sized = [0, 0, 0]  # timed batches, their records and bytes, since made
        self._waits: list[tuple[float, float]] = []  # (end, seconds) of slot waits, recent

    def add(self, stage: str, seconds: float) -> None:
        """``seconds`` of ``stage`` timed each time it happens (a task's read, a slot wait)."""
        self.exact[stage] = self.exact.get(stage, 0.0) + seconds
        if stage == SLOT_WAIT:  # (inside a span of a timed batch: taken out of it by span())
            self._waits.append((perf_counter(), seconds))
            del self._waits[:-64]

    def add_sampled(self, stage: str, seconds: float) -> None:
        """``seconds`` of ``stage`` in a timed batch."""
        self.sampled[stage] = self.sampled.get(stage, 0.0) + seconds

    def span(self, stage: str, start: float) -> float:
        """Adds the time from ``start`` to now to ``stage`` of this timed batch (and to the
        trace), less the slot waits inside it (timed each time: counted twice, they took the
        rest's shares from the other stages); returns now."""
        now = perf_counter()
        spent = now - start
        if self._waits:
            spent = max(0.0, spent - sum(s for end, s in self._waits if end >= start))
            self._waits.clear()
        self.sampled[stage] = self.sampled.get(stage, 0.0) + spent
        if self.trace is not None:
            self.trace.append((stage, start, now))
        return now

    def count(self, records: int, nbytes: int) -> None:
        """A timed batch is made: its records and bytes."""
        self._sized[0] += 1
        self._sized[1] += records
        self._sized[2] += nbytes

    def loop_detail(self, total: float, transforms: dict[str, float]) -> None:
        """A detailed record loop: ``total`` seconds, of which ``transforms`` (by name); the
        rest was reading."""
        spent = sum(transforms.values())
        self.split[READ] = self.split.get(READ, 0.0) + max(0.0, total - spent)
        for name, seconds in transforms.items():
            self.split[name] = self.split.get(name, 0.0) + seconds

    def take(self, busy: float) -> tuple:
        """What a worker sends with a ``Done`` for the batches made since the last, ``busy``
        seconds of work: ``(stages, batches, records, bytes, trace)``. What is timed each time
        is as timed; the rest of ``busy`` is split by the timed batches' shares of each
        stage (the record loop's by its measured detail): the stages add up to the time
        worked, never more. Records and bytes at the timed batches' mean size. Then starts
        again from zero (the samples stay: shares over the clock's life)."""
        batches, (timed, records, nbytes) = self.made - self._taken, self._sized
        each = batches / timed if timed else 0.0
        out = dict(self.exact)
        sampled = dict(self.sampled)
        loop = sampled.pop(LOOP, 0.0)
        if loop:
            whole = sum(self.split.values())
            for name, part in (self.split.items() if whole else ((READ, 1.0),)):
                sampled[name] = sampled.get(name, 0.0) + loop * part / (whole or 1.0)
        whole = sum(seconds for seconds in sampled.values() if seconds > 0)
        rest = max(0.0, busy - sum(out.values()))
        for stage, seconds in sampled.items():
            if whole and seconds > 0:
                out[stage] = out.get(stage, 0.0) + rest * seconds / whole
        taken = (tuple(out.items()), batches, round(records * each), round(nbytes * each),
                 self.trace)
        self.exact, self._taken = {}, self.made
        if self.trace is not None:
            self.trace = []
        return taken


def timed_calls(fns: list[tuple[str, Callable[..., Any]]], into: dict[str, float]
                ) -> list[Callable[..., Any]]:
    """Each ``fn`` wrapped to add its seconds to ``into[name]`` (the detailed record loop).

    Example:
        >>> spent = {}
        >>> [double] = timed_calls([("Map(double)", lambda x: 2 * x)], spent)
        >>> double(4), list(spent)
        (8, ['Map(double)'])
    """
    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            start = perf_counter()
            try:
                return fn(*args)
            finally:
                into[name] = into.get(name, 0.0) + (perf_counter() - start)
        return run

    return [wrap(name, fn) for name, fn in fns]


def stage_name(transform: Any) -> str:
    """A transform's stage: its kind and its function's short name (``"Map(decode)"``)."""
    fn = getattr(transform, "fn", None)
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return f"{type(transform).__name__}({name})"


def once(stage: str) -> bool:
    """Whether ``stage`` is paid once, not a batch (a ``JitMap``'s compilation)."""
    return stage.endswith(COMPILED)


def stage_names(transforms: tuple) -> list[str]:
    """A stage name a transform (``stage_name``), with ``#i`` where two share one.

    Example:
        >>> stage_names(("Map(f)", "Map(g)", "Map(f)"))
        ['Map(f)', 'Map(g)', 'Map(f)#2']
    """
    names = [t if isinstance(t, str) else stage_name(t) for t in transforms]
    return [name if names.index(name) == i else f"{name}#{i}" for i, name in enumerate(names)]


TRACE_KEEP = 4096  # a process's last stage spans kept for a profile's timeline
FOLD_AT = 1024  # Done timings queued before they are added up without being asked


class StageTotals:
    """One process's timings added up: what its ``StageClock`` sent (a worker's, with each
    ``Done``), its busy and CPU seconds. ``absorb`` only queues what came (one append, in the
    thread that takes the batches); ``fold`` adds it up, when the stats are read.

    Example:
        >>> totals = StageTotals()
        >>> totals.absorb((0.5, 0.25, ((READ, 0.2), (COLLATE, 0.3)), 2, 64, 8192, None))
        >>> totals.fold().busy_s, totals.seconds[COLLATE], totals.records
        (0.5, 0.3, 64)
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.busy_s = self.cpu_s = 0.0
        self.queued_s = 0.0  # (sent by a remote maker; a local one's read from /proc here)
        self.in_use_s = 0.0  # (seconds it was in use: ``Gauges.in_use_s``)
        self.batches = self.records = self.bytes = 0
        self.trace: list = []  # (stage, start, end), the last TRACE_KEEP
        self._queued: deque = deque()  # absorbed, not yet added (append, popleft: atomic)
        self._folding = threading.Lock()
        self.pull: Callable[[], tuple] | None = None  # timings to absorb when folding

    def absorb(self, timings: tuple) -> None:
        self._queued.append(timings)
        if len(self._queued) > FOLD_AT:  # (nobody reads the stats: bounded all the same)
            self.fold()

    def fold(self) -> "StageTotals":
        """Adds up what was absorbed; returns itself."""
        queued = self._queued
        if self.pull is not None:  # (a maker in this process: its clock, read now)
            queued.append(self.pull())
        with self._folding:
            while queued:
                busy, cpu, stages, batches, records, nbytes, trace = queued.popleft()
                self.busy_s += busy
                self.cpu_s += cpu
                seconds = self.seconds
                for stage, spent in stages:
                    seconds[stage] = seconds.get(stage, 0.0) + spent
                self.batches += batches
                self.records += records
                self.bytes += nbytes
                if trace:
                    self.trace.extend(trace)
                    del self.trace[:-TRACE_KEEP]
        return self

    def stages(self) -> dict[str, float]:
        """Seconds by stage (a copy), what was absorbed added up first."""
        self.fold()
        with self._folding:
            return dict(self.seconds)

    def add(self, stage: str, seconds: float) -> None:
        with self._folding:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def add_queued(self, seconds: float) -> None:
        """Seconds its process waited for a core, as it measured them (a Ray actor's)."""
        with self._folding:
            self.queued_s += seconds


class Gauges:
    """An engine's timings: a ``StageTotals`` a process that makes batches (``makers``: each
    worker, or the training process with ``num_workers=0``), the training process's hand-over
    (its timed receipts and hand-outs, ``hand_over_s``), and how many batches were ready at
    each timed hand-out. ``trace``: the makers send their stages' spans (a profile's timeline).
    """

    def __init__(self, makers: int, counted: bool = True) -> None:
        self.makers = [StageTotals() for _ in range(makers)]
        self.counted = counted  # (each maker's time in use: Ray's actors, lost and back, not)
        self.trace = False
        self.reset_at = 0.0  # (``time.monotonic``, one clock for every process on Linux)
        self._active, self._active_at = makers, time.monotonic()  # (makers in use, since)
        self._using = threading.Lock()
        self._window()

    def _window(self) -> None:
        self.receipts = 0  # workers' messages received (the pool times them by ``weight``)
        self.receipt_s = 0.0  # timed receipts: seconds and receipts, each times its weight
        self.receipt_w = 0
        self.marks = 0  # batches marked ``Timed``: which of those waiting is marked next
        self.handouts = 0  # timed hand-overs: their number, seconds, and batches ready behind
        self.handout_s = 0.0
        self.ready = 0

    def reset(self) -> None:
        for old in self.makers:
            old.fold()  # (what a maker in this process has counted goes with the old)
        pulls = [old.pull for old in self.makers]
        self.makers = [StageTotals() for _ in self.makers]
        for totals, pull in zip(self.makers, pulls):
            totals.pull = pull
        self.reset_at = self._active_at = time.monotonic()  # a worker's timings of work
        self._window()  # begun before: dropped

    def in_use(self, active: int) -> None:
        """The first ``active`` makers are in use from now (``num_workers="auto"`` parks some,
        starts others): each one's busy share is of its own time in use (a worker started
        late, busy since, was told idle for the run before it came: the diagnosis audit)."""
        self.in_use_s(0)  # (the time so far counted at the count before)
        self._active = active

    def in_use_s(self, i: int) -> float | None:
        """Seconds maker ``i`` has been in use since the counts began (None: not counted)."""
        if not self.counted:
            return None
        with self._using:
            now = time.monotonic()
            for totals in self.makers[:self._active]:
                totals.in_use_s += now - self._active_at
            self._active_at = now
        return self.makers[i].in_use_s if i < len(self.makers) else 0.0

    def received(self, stands_for: int, seconds: float, ready: dict) -> None:
        """A timed receipt standing for ``stands_for`` receipts (``weight``), and one batch of
        ``ready`` (``{step: batch}``, in the order filed) made ``Timed``, each time the next of
        those waiting (marking always the newest would time the hand-over at the same point of
        each task's batches, and see as many waiting behind it each time)."""
        self.receipt_s += stands_for * seconds
        self.receipt_w += stands_for
        if ready:
            step = list(ready)[self.marks % len(ready)]
            if type(ready[step]) is tuple:
                ready[step] = Timed(ready[step])
                self.marks += 1

    def handed_out(self, seconds: float, waiting: int) -> None:
        """A timed hand-over, with ``waiting`` batches ready behind it."""
        self.handouts += 1
        self.handout_s += seconds
        self.ready += waiting

    def hand_over_s(self, batches: int) -> float:
        """The hand-over's seconds with ``batches`` handed out: the timed receipts' mean for
        each receipt, and the timed hand-overs' mean for each batch."""
        spent = self.receipt_s / self.receipt_w * self.receipts if self.receipt_w else 0.0
        return spent + (self.handout_s / self.handouts * batches if self.handouts else 0.0)

    def ready_ahead(self) -> float:
        """Batches ready behind one handed out, on average (of the timed hand-overs)."""
        return self.ready / self.handouts if self.handouts else 0.0
