"""What a loader does on its own while it runs: ``num_workers="auto"``, ``prefetch="auto"`` and
the periodic summary (``log_every_s=``), each decided in ``next()`` once a window has passed.

::

    next() ── batch handed out ── now >= monitor.next_at? ── monitor.tick(now)
                                                              ├ AutoTune.decide: a window's
                                                              │   rate, the consumer's wait,
                                                              │   the workers' busy and CPU time
                                                              │   ──> pool.roster.resize(n), prefetch
                                                              └ a one-line summary, logged

``AutoTune`` climbs: while the consumer waits (more than ``WAITING`` of a window) and a bound
allows, it tries more workers (doubling while the consumer waits most of the time, else one
more), keeps them if the rate rose by ``GAIN`` and goes back otherwise (that count is then the
ceiling, for ``RETRY_WINDOWS`` windows: another program may have had the cores); when the
consumer does not wait and the workers idle, it tries one fewer, kept if the
rate holds. A window is judged from the step the pool makes with the new count (those
submitted before it are made by the count before), new workers started. Bounds: the
cores this process may use (``runtime.limits``: a container's quota too), more while the
workers spend more than ``READS_WAIT`` of their busy time off the CPU and not queued for it
(reads that wait overlap): ``READ_WAIT_FACTOR`` times as many, or one over the share on the
CPU (up to ``MAX_READ_WAIT_FACTOR``), and a memory budget (half the memory available, a
container's limit too, at a worker's resident size). A batch is the same whichever worker
makes it, so the count changes nothing but the speed. Every decision is logged
(``logging.getLogger("jaxloader")``, INFO).

Example:
    >>> tune = AutoTune(pool=None, cores=2)
    >>> tune.bound(off_cpu=0.5), tune.bound(off_cpu=0.0)  # (0.95: 32, ulimit -n permitting)
    (8, 2)
"""

from __future__ import annotations

import logging
import os
from time import perf_counter
from typing import Any, Callable

from jaxloader.base.stats import queued_s
from jaxloader.loaders.diagnosis import cores_available
from jaxloader.runtime import limits

log = logging.getLogger("jaxloader")

WINDOW_S = 1.0  # a decision a window
MIN_BATCHES = 8  # a window holds at least this many batches, and two rounds of tasks
WAITING = 0.05  # the consumer waiting more than this share of a window: more input helps
GAIN = 0.08  # more workers are kept if the rate rose at least this much
LOSS = 0.05  # fewer workers are kept if the rate fell at most this much
IDLE = 0.50  # workers busy less than this, the consumer not waiting: one fewer is tried
READS_WAIT = 0.30  # workers off the CPU this share of their busy time: reads wait
READ_WAIT_FACTOR = 4  # then up to this many workers a core, or 1 / the share on the CPU
MAX_READ_WAIT_FACTOR = 16  # (a read waiting 95% of the time: 16 a core at most)
MAX_WORKERS = 64
RETRY_WINDOWS = 30  # a ceiling or floor found holds this many windows, then may be tried again
MAX_PREFETCH = 8


def _resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _workers_by_descriptors() -> int:
    """The workers whose descriptors here (``WORKER_DESCRIPTORS`` each) take at most half of
    those the limit leaves, the rest the batch slots' (``ulimit -n``: the tuner grew to 16
    workers under 256, and its next start failed in ``next()``, "Too many open files");
    ``MAX_WORKERS`` where unknown."""
    import resource

    from jaxloader.runtime.descriptors import WORKER_DESCRIPTORS, open_descriptors

    soft, now = resource.getrlimit(resource.RLIMIT_NOFILE)[0], open_descriptors()
    if soft == resource.RLIM_INFINITY or now is None:
        return MAX_WORKERS
    return max(1, (soft - now) // (2 * WORKER_DESCRIPTORS))


def _available_bytes() -> int:
    """The memory this process may still take, its container's limit's too (``runtime.limits``:
    a pod's 16 GiB on a node's 1 TiB was no bound)."""
    return limits.available_bytes()


class AutoTune:
    """Chooses the number of workers of a running pool (see the module docstring)."""

    def __init__(self, pool: Any, cores: int | None = None, tune_prefetch: bool = False,
                 counts: list[int] | None = None) -> None:
        self.pool = pool
        self.label = "jaxloader"  # which loader, in its log lines (its Monitor's)
        self.cores = cores or cores_available()
        self._by_descriptors = _workers_by_descriptors()  # (measured once: the table's size)
        self.tune_prefetch = tune_prefetch
        self.counts = counts  # the counts allowed (a stream's: those dividing its readers)
        self.ceiling = MAX_WORKERS  # a count tried and not faster
        self.floor = 1  # a count below which the rate fell
        self._bounds_for = 0  # windows left before the ceiling and floor are forgotten
        self._last: tuple | None = None  # (time, batches, wait_s, busy_s, CPU + queued s)
        self._trial: tuple[int, float] | None = None  # (the count before, its rate)
        self._settling = True  # until a change (or the start) is in use: not judged
        self._said_memory = False  # that memory bounds the count (logged once)
        self._by_shm = False  # /dev/shm's free space does, not the memory
        self._said_bound = False  # that no more workers are worth running (logged once)

    def capacity(self) -> int:
        """The most workers it may ever ask for (the pool's status table is this big)."""
        most = min(MAX_WORKERS, MAX_READ_WAIT_FACTOR * self.cores, self._by_descriptors)
        return max(n for n in self.counts or [most] if n <= most or n == 1)

    def allowed(self, wanted: int, low: int, high: int) -> int | None:
        """The count to try for ``wanted`` within ``[low, high]``: itself, or for a stream
        the nearest that divides its readers (toward ``low`` when none is past it)."""
        if self.counts is None:
            return wanted if low <= wanted <= high else None
        fits = [n for n in self.counts if low <= n <= high]
        if not fits:
            return None
        return min(fits, key=lambda n: (abs(n - wanted), n))

    def bound(self, off_cpu: float) -> int:
        """The most workers worth running now: the cores, more while reads wait (as many as
        keep each core busy, were the waits overlapped)."""
        return max(1, min(self._by_cores(off_cpu), self.ceiling, self.capacity()))

    def _by_cores(self, off_cpu: float) -> int:
        """The cores, times the reads' waits' factor (``bound``'s first part)."""
        factor = 1 if off_cpu < READS_WAIT else min(MAX_READ_WAIT_FACTOR, max(
            READ_WAIT_FACTOR, round(1 / max(1e-9, 1.0 - off_cpu))))
        return self.cores * factor

    def _memory_bound(self, active: int) -> int:
        """The most workers in half the memory they may have: what is free now and what the
        workers started hold (each the largest one's resident size). Half of what was free
        each window, after the workers took some, let them grow to ~90% of it. Where the
        slots are in /dev/shm, the fewer of that and ``_dev_shm_bound``'s."""
        started = self.pool.pids
        each = max((_resident_bytes(p) for p in started[:active]), default=0)
        bound = max(1, int(0.5 * (_available_bytes() + len(started) * each) // each)) if each \
            else MAX_WORKERS
        slots, in_shm = self._dev_shm_bound()
        self._by_shm = slots < bound  # (which one the count is held by, said)
        if min(bound, slots) <= active and not self._said_memory:
            self._said_memory = True
            if slots < bound:
                log.info("%s: autotune: /dev/shm holds the workers to %d (their batch slots, "
                         "%.1f MiB each, in half of its free space and the loader's slots): "
                         "none more is started; a container's --shm-size=1g lets more run",
                         self.label, slots, in_shm / 2**20)
            else:
                log.info("%s: autotune: memory holds the workers to %d (%.0f MiB resident "
                         "each, half of what is free and theirs): none more is started (those "
                         "running stay: parked, a worker keeps its memory)", self.label, bound,
                         each / 2**20)
        return min(bound, slots)

    def _dev_shm_bound(self) -> tuple[int, int]:
        """Where the batch slots are POSIX shared memory (no memory files), the most workers
        whose slots ahead fit in half of /dev/shm's free space and the loader's slots, and the
        bytes of a worker's: autotune grew to 8 workers in a container's 64 MB, and the run
        ended with a SharedMemoryError (the containers audit)."""
        from jaxloader.runtime import shm

        if shm.MEMFD_AVAILABLE:
            return MAX_WORKERS, 0
        each, held = self.pool.slot_room()
        try:
            st = os.statvfs("/dev/shm")
        except OSError:
            return MAX_WORKERS, each
        return (max(1, int(0.5 * (st.f_bavail * st.f_frsize + held) // each)) if each else
                MAX_WORKERS), each

    def restart(self) -> None:
        """A window starts afresh: the stats were reset, or a run starts after time away (an
        evaluation): a window across either would judge counts that went back, or hours
        apart. A change on trial is judged by the first window after."""
        self._last, self._settling = None, True

    def decide(self, now: float, step: int, batches: int, wait_s: float) -> None:
        """One window's decision, from the loader's counts now, ``step`` being the next
        step it hands out (see the module docstring)."""
        makers = [m.fold() for m in self.pool.gauges.makers]
        busy_s = sum(m.busy_s for m in makers)
        cpu_s = sum(m.cpu_s for m in makers) + sum(map(queued_s, self.pool.pids))  # (no reads)
        snap = (now, batches, wait_s, busy_s, cpu_s)
        if self._last is not None and (batches < self._last[1] or wait_s < self._last[2]):
            self.restart()  # the loader's counts started again (its stats were reset)
        if self._settling:  # a window starts once the count is in use for the next steps
            if self.pool.roster.settled(step):
                self._settling, self._last = False, snap
            return
        last, self._last = self._last, snap
        if last is None:
            return
        span, made = now - last[0], batches - last[1]
        # Batches come back a task at a time (up to 16 steps): a window holds two rounds
        if made < max(MIN_BATCHES, 2 * self.pool.round_steps(self.counts is not None)) \
                and span < 8 * WINDOW_S:
            self._last = last  # a longer window
            return
        active = self.pool.active
        rate = made / span
        self._bounds_for -= 1
        if self._bounds_for == 0:
            self.ceiling, self.floor = MAX_WORKERS, 1
        waited = (wait_s - last[2]) / span
        busy = min(1.0, (busy_s - last[3]) / (span * active))
        off_cpu = max(0.0, 1.0 - (cpu_s - last[4]) / (busy_s - last[3])) if busy_s > last[3] \
            else 0.0
        if self._trial is not None:
            before, before_rate = self._trial
            self._trial = None
            if self._judge(before, before_rate, active, rate):
                return
        memory = self._memory_bound(active)
        by_cores, most = self.bound(off_cpu), self.pool.roster.most
        high = min(by_cores, memory, most)
        more = self.allowed(min(high, 2 * active if waited > 0.5 else active + 1), active + 1,
                            high)
        if more is None and self.counts is not None and high > active:  # (a stream's next
            # count past the cores' bound, its readers dividing among no count between: tried,
            # and kept only if it pays)
            more = self.allowed(active + 1, active + 1, min(self.ceiling, self.pool.roster.most,
                                                            memory))
        if more is None and waited > WAITING and not self._said_bound:
            self._said_bound = True
            why = f"{self.cores} cores, their work {off_cpu:.0%} off the CPU"  # (what holds it)
            if memory == high < by_cores:
                why = ("/dev/shm: half of its free space for their batch slots" if self._by_shm
                       else "memory: half of what is free and the workers' own")
            elif self.ceiling == high < min(self._by_cores(off_cpu), self.capacity()):
                why = (f"more were tried and made batches no faster; tried again in "
                       f"{self._bounds_for} windows")
            elif most == high < min(by_cores, self.pool.roster.capacity):  # (forked ones)
                why = "start_method='fork' starts no more once JAX is imported"
            log.info("%s: autotune: %d worker(s), the most worth running here (%s%s), while the "
                     "consumer waits %.0f%%", self.label, active, why, "" if self.counts is None
                     else f", worker counts dividing the readers: {self.counts}", 100 * waited)
        fewer = self.allowed(active - 1, self.floor, active - 1)
        if waited > WAITING and more is not None:
            self._change(active, more, rate, f"the consumer waited {waited:.0%}, the workers "
                                             f"busy {busy:.0%} ({off_cpu:.0%} off the CPU)")
        elif waited > WAITING and self.tune_prefetch and busy < IDLE:
            prefetch = min(MAX_PREFETCH, 2 * self.pool.prefetch)
            if prefetch != self.pool.prefetch:
                log.info("%s: autotune: prefetch %d -> %d: the consumer waited %.0f%% while the "
                         "workers were busy %.0f%%", self.label, self.pool.prefetch, prefetch,
                         100 * waited, 100 * busy)
                self.pool.prefetch = prefetch
        elif waited < WAITING / 2 and busy < IDLE and fewer is not None:
            self._change(active, fewer, rate, f"the consumer waited {waited:.0%}, the workers "
                                              f"busy {busy:.0%}")

    def _change(self, before: int, after: int, rate: float, why: str) -> None:
        log.info("%s: autotune: %d -> %d workers (%.1f batches/s): %s", self.label, before, after,
                 rate, why)
        self._trial = (before, rate)
        self._settling = True
        self.pool.roster.resize(after)

    def _judge(self, before: int, before_rate: float, active: int, rate: float) -> bool:
        """Keeps a change that paid, else goes back; whether it went back."""
        up = active > before
        kept = rate >= before_rate * (1 + GAIN) if up else rate >= before_rate * (1 - LOSS)
        log.info("%s: autotune: %s %d workers: %.1f batches/s against %.1f with %d", self.label,
                 "kept" if kept else "back from", active, rate, before_rate, before)
        if kept:
            return False
        if up:
            self.ceiling = before
        else:
            self.floor = before
        self._bounds_for = RETRY_WINDOWS
        self._settling = True
        self.pool.roster.resize(before)
        return True


class Monitor:
    """A loader's autotune and periodic summary, run from ``next()`` when ``next_at`` comes."""

    def __init__(self, tune: AutoTune | None, log_every_s: float | None,
                 summary: Callable[[], str], label: str = "jaxloader") -> None:
        self.tune, self.label = tune, label  # (label: which loader, in its log lines)
        if tune is not None:
            tune.label = label
        self.log_every_s = log_every_s
        self._summary, self._log_due = summary, False
        self._log_at = perf_counter() + log_every_s if log_every_s else float("inf")
        self.next_at = perf_counter() if tune is not None else self._log_at

    def restart(self) -> None:
        """The stats were reset, or a run starts: the tuning's window starts afresh."""
        if self.tune is not None:
            self.tune.restart()

    def tick(self, now: float, step: int, batches: int, wait_s: float) -> None:
        if self.tune is not None:
            self.tune.decide(now, step, batches, wait_s)
        if self._log_due:  # (the batch its time came at handed out since: its wait counted)
            self._log_due = False
            log.info("%s: %s", self.label, self._summary())
        elif now >= self._log_at and batches > 1:  # (a batch past the first, and the one
            self._log_at = now + (self.log_every_s or 0.0)  # being handed out, whose wait
            self._log_due = True  # is not counted yet: a long one went to the next window,
            # named "main" there, its worker's read counted in this one; the diagnosis audit)
        self.next_at = 0.0 if self._log_due else min(
            now + WINDOW_S if self.tune is not None else float("inf"), self._log_at)
