"""``loader.diagnose()``: which stage limits the input, and what to change, from ``loader.stats``.

::

    consumer waited < 10% of its time ─────────────────────────────> "step" (input keeps up)
    batches made in the training process (num_workers=0) ──────────> "main" (or "device")
    workers busy (>= 60% of the time) ── reading the larger part ───> "source"
                                      └─ transforms, collation ────> "workers"
    workers idle while the consumer waits ── the training process's work a good part of the
                                             wait: placement the larger > "device", else "main"
                                          └─ else (they wait for tasks or a core): as if busy

The advice is measured where it can be: the cores this process may use (its affinity, at
most its container's CPU quota: ``runtime.limits``) against the workers in use, the expected
gain of more workers (bounded by how fast the step alone would run), how long the workers'
reads wait off the CPU (their busy time less their CPU time and their time waiting for a core,
a record), and a transform's share of the workers' time.

Example:
    >>> from jaxloader.base.stats import LoaderStats
    >>> d = diagnose(LoaderStats(batches=100, wait_s=0.05, run_s=2.0, wall_s=2.05,
    ...                          stages={"read": 0.2, "collate": 0.1}), num_workers=2, cores=4)
    >>> d.bottleneck
    'step'
"""

from __future__ import annotations

from typing import Sequence

from jaxloader.base.errors import JaxloaderError
from jaxloader.base.stats import LoaderStats
from jaxloader.base.timings import COLLATE, HANDOVER, PLACE, READ, SLOT_WAIT, once
from jaxloader.loaders.advice import mapped_functions, placement_advice
from jaxloader.loaders.verdict import MAIN_STAGES, Bottleneck, Diagnosis
from jaxloader.runtime import limits
from jaxloader.workers.tasks import MAX_TASK_STEPS

__all__ = ["Diagnosis", "cores_available", "diagnose", "mapped_functions"]

INPUT_BOUND = 0.10  # the consumer waiting more than this share of its time: input limits it
BUSY = 0.60  # workers busy at least this share of the time: they are what the consumer waits on
WAITS = 0.30  # a worker's busy time off the CPU above this share: its reads wait (storage)
CONTENDED = 0.25  # a worker's busy time waiting for a core above this share: the cores are
# taken (by other processes: another loader's workers), whatever this loader's count says
DOMINANT = 0.50  # a transform above this share of the workers' time is named
MAIN_SHARE = 0.30  # the training process's work this share of the loop's wait: "main"/"device"
STALL_SHARE = 0.50  # long waits (LoaderStats.stalls) this share of the loop's wait, at most
STALLS = 0.10  # this share of its batches, under this of its time: passes' starts, input
STALL_BOUND = 0.50  # keeping up otherwise (above it, the starts are the input's limit)
# a batch handed over from workers costs the training process at least this (a batch of one
# small leaf: docs/benchmarks.md, the figures behind choices): no worker count makes batches
# sooner than that, whatever their work
HANDOVER_FLOOR_S = 35e-6


def cores_available() -> int:
    """The cores this process may run on: its affinity's, at most its container's CPU quota
    (``runtime.limits``)."""
    return limits.cores()


def diagnose(stats: LoaderStats, num_workers: int, cores: int | None = None,
             counts: list[int] | None = None, remote: bool = False,
             placed_in_thread: bool = True, read_threads: int | None = None,
             mapped: Sequence[str] = (), endless: bool = False,
             actor_cpus: float | None = None) -> Diagnosis:
    """The verdict on ``stats`` of a loader with ``num_workers`` workers (see the module
    docstring); ``cores``: those this process may use (default: its affinity); ``counts``: the
    worker counts the loader takes (a ``StreamLoader``'s divide its readers; None: any), which
    the advice keeps to; ``remote``: the workers are Ray actors (``RayWorkers(n)``), whose
    cores are the cluster's, not this machine's, each taking ``actor_cpus`` of them (more of
    them whose waits are off the CPU: as many CPUs, shared); ``placed_in_thread``: batches
    are placed on the device-put thread (one device), not in the training thread (several:
    ``prefetch``);
    ``read_threads``: the threads a worker reads a batch's records on (a ``DataLoader``'s;
    ``None`` for a loader without them); ``mapped``: the functions the source runs as it
    reads (``mapped_functions``), timed as reading; ``endless``: ``num_epochs=None`` (no
    pass starts after the first)."""
    if stats.batches < 2:
        raise JaxloaderError(
            f"diagnose(): {stats.batches} batch(es) handed out " + (
                "in the window since the stats given (diagnose(since=...)); iterate a few "
                "batches more before asking" if stats.window else "since the stats began; "
                "iterate a few batches first (the first one includes the workers' start)")
            + ", or call jl.profile(loader)")
    cores = cores or cores_available()
    stages = dict(stats.stages)
    per = stats.batches
    # a JitMap's compilation, once a shape (in each worker): not a batch's cost, nor its share
    compiled = sum(v for k, v in stages.items() if once(k))
    made = {k: v for k, v in stages.items() if k not in MAIN_STAGES and not once(k)}
    made_total = sum(v for k, v in made.items() if k != SLOT_WAIT) or 1e-12  # (the makers'
    # own work: a slot wait is the training process's, which it waits on)
    read = made.get(READ, 0.0)
    transforms = {k: v for k, v in made.items() if k not in (READ, COLLATE, SLOT_WAIT)}
    place, handover = stages.get(PLACE, 0.0), stages.get(HANDOVER, 0.0)
    batch_bytes = stats.bytes / max(1, stats.batches_made)
    # After the first batch, whose wait is the workers' start
    waited = max(0.0, stats.wait_s - stats.first_batch_s)
    wait_fraction = waited / (waited + stats.run_s) if waited + stats.run_s else 0.0
    # a few long waits most of the rest (a pass's start, its workers' first tasks made): the
    # steady run's wait is the verdict's (batches ready on average hid them: "main" was said)
    stall = min(waited, stats.stalled_s) if (stats.stalls <= max(1, STALLS * per) and
                                             stats.stalled_s >= STALL_SHARE * waited > 0) else 0.0
    calm = max(0.0, waited - stall) / (max(0.0, waited - stall) + stats.run_s) if stats.run_s \
        else 1.0
    # over the workers in use (those autotune parked keep the busy time of when they ran)
    busy_s = sum(w.busy_s for w in stats.workers)
    steady = max(1e-12, stats.wall_s - stats.first_batch_s)
    # each worker's busy time in the steady run (or its own time in use, where shorter: one
    # autotune started late), less its JitMap compilations (in its first batch, before the
    # steady run: taken off before the share is capped) and its slot waits (a bigger slot
    # asked of the training process: its work, not the worker's); their share of that time
    spans = [steady if w.in_use_s is None else min(steady, w.in_use_s) for w in stats.workers]
    worked = [min(span, max(0.0, w.busy_s - w.stages.get(SLOT_WAIT, 0.0) - sum(
        v for k, v in w.stages.items() if once(k)))) for span, w in zip(spans, stats.workers)]
    whole = sum(spans) if all(w.in_use_s is not None for w in stats.workers) else \
        steady * max(1, stats.num_workers or len(worked))  # (times not counted: over those in
    busy = min(1.0, sum(worked) / max(1e-12, whole)) if worked else 0.0  # use now, at most 1)
    if busy >= BUSY:  # (workers busy the run through: their long waits are its own, a task's
        stall = 0.0  # batches coming at once, not a start's: taken off, they made the gain
        # of more workers look smaller: "~1.7x" said, 2.7x measured)
    slot_s = sum(w.stages.get(SLOT_WAIT, 0.0) for w in stats.workers)
    # the steps timed: one between each two batches, and one before a window's first
    steps = max(1, per if stats.window else per - 1)
    now_s = max(1e-12, steady - stall) / steps  # seconds a batch now (the start's long waits
    # once: not a batch's)
    # those long waits: passes' starts, each with the workers' first tasks; else the run's
    passes = bool(num_workers) and not endless  # (whose remedy is longer ones)
    starts = ("as passes started and the workers made their first tasks" if passes else
              "as the run started and the workers made their first tasks" if num_workers else
              "early in a pass (a slow first read or transform?)")
    step_s = stats.run_s / steps  # the training step's, between batches
    made_count = max(1, stats.batches_made)
    work_s = (max(0.0, busy_s - compiled - slot_s) if stats.workers else made_total) / \
        made_count
    # the training process's cores: its CPU time where workers make the batches (a step that
    # waits for an accelerator holds no core), else the step's and hand-over's wall time
    main_share = min(1.0, stats.main_cpu_s / steady if stats.main_cpu_s and stats.workers else
                     (stats.run_s + handover + place) / steady)
    # (Ray actors: the cluster's cores, not known here; more actors where they are busy)
    # a worker's cores: its busy share, or more where its threads ran beside it (GIL-free)
    used = [max(b, w.cpu_s / steady) for b, w in zip(stats.busy, stats.workers)] \
        if len(stats.workers) == len(stats.busy) else list(stats.busy)
    idle = 0 if remote else max(0, round(cores - sum(used) - main_share))
    named = "RayWorkers(n={})" if remote else "num_workers={}"
    advice: list[str] = []

    def fit(workers: int) -> int:
        """``workers``, or the nearest count the loader takes (the larger on a tie)."""
        if counts is None:
            return workers
        return min(counts, key=lambda n: (abs(n - workers), -n))

    def more_readers(workers: int) -> str:
        """A stream's ``workers`` where its readers (``max(counts)``) divide among none so
        many: readers they divide, as many as now or more."""
        readers = workers * -(-max(counts or [1]) // workers)
        return (f"readers_per_process={readers} and num_workers={workers} (readers they "
                "divide: the stream's batches then come in another order)")

    def factor(workers: int) -> float:
        """The expected gain of ``workers``: a batch then takes the longer of the step and
        the work of a batch shared by the workers (in process: their sum, now; with workers,
        not less than a hand-over), at most ``workers`` over those now."""
        then = max(step_s, work_s / workers, 0.0 if num_workers else HANDOVER_FLOOR_S)
        # (from the process, one worker overlaps the step as well: up to workers + 1)
        return min(now_s / then, workers / num_workers if num_workers else workers + 1)

    def gain(workers: int) -> str:
        return f"expected ~{max(1.0, factor(workers)):.1f}x"

    for name, seconds in sorted(transforms.items(), key=lambda kv: -kv[1]):
        if seconds / made_total >= DOMINANT:
            where = "the workers'" if num_workers else "the loader's"
            advice.append(f"the {name} takes {seconds / made_total:.0%} of {where} time "
                          f"({1e3 * seconds / max(1, stats.batches_made):.1f} ms a batch)")
    off_cpu = queued = 0.0
    if stats.workers:
        # a worker's wait for a core: its threads' summed, over the threads a batch is read on
        # (32 read threads waking from their reads queue at once: 0.24 s of 0.41 busy, with
        # the cores mostly idle, was read as a worker short of cores)
        waits_for_core = sum(w.queued_s for w in stats.workers) / (read_threads or 1)
        cpu_s = sum(w.cpu_s for w in stats.workers) + waits_for_core  # (no read waiting)
        working = busy_s - slot_s  # (a slot wait is off the CPU, and no read's)
        off_cpu = max(0.0, working - cpu_s) / working if working > 0 else 0.0
        queued = waits_for_core / working if working > 0 else 0.0

    bottleneck: Bottleneck
    if wait_fraction < INPUT_BOUND or stall and calm < INPUT_BOUND and busy < BUSY and \
            wait_fraction < STALL_BOUND:  # (busy workers: a slow stretch, not a start)
        bottleneck = "step"
        advice.insert(0, f"input keeps up: the training loop waited {wait_fraction:.0%} of "
                         "its time for batches" + (
                             f", {stall / waited:.0%} of it in {stats.stalls} long wait(s) "
                             f"({1e3 * stall / stats.stalls:.0f} ms each) {starts}, {calm:.0%} "
                             "otherwise" + ("; longer passes (num_epochs=None) stall less "
                                            "often" if passes else "")
                             if stall else ""))
        if num_workers > 1 and busy < 0.5:
            fewer = fit(max(1, round(num_workers * busy / 0.8)))
            if fewer < num_workers:
                advice.append(f"the workers are busy {busy:.0%} of the time: "
                              f"{named.format(fewer)} would keep up and free "
                              f"{num_workers - fewer} core(s)")
    elif num_workers == 0:
        bottleneck = "device" if place > made_total else "main"
        if bottleneck == "main":
            wanted = max(1, round(cores - main_share))
            workers = fit(wanted)
            if factor(workers) <= 1.1 and workers < wanted and factor(wanted) > 1.1:
                advice.insert(0, f"batches are made in the training process (num_workers=0): "
                                 f"{more_readers(wanted)} makes them in parallel, "
                                 f"{gain(wanted)}")
            elif factor(workers) > 1.1:
                advice.insert(0, f"batches are made in the training process (num_workers=0): "
                                 f"num_workers={workers} makes them in parallel, "
                                 f"{gain(workers)}")
                if read >= made_total / 2 and read_threads is not None and read_threads < 16:
                    # reads that take more time than the process's CPU: they wait, and 16
                    # threads overlap them (4.0x measured where workers' 2.2x came first)
                    each = read / per / min(16, max(1.0, stats.records / made_count))
                    sooner = now_s / max(step_s + work_s - read / per + each, 1e-12)  # (in
                    # the loop's time: the step and the batch one after the other)
                    waiting = stats.main_cpu_s < read / 2 and sooner > factor(workers)
                    advice.insert(0 if waiting else 1, (
                        f"the source's reads wait off the CPU: read_threads=16 reads a batch's "
                        f"records on 16 threads in this process, the waits overlapped, "
                        f"expected ~{sooner:.1f}x" if waiting else "or, where the source's reads "
                        "wait (files, the network), read_threads=16: this process reads a "
                        "batch's records on 16 threads, the waits overlapped"))
            elif work_s < 2 * HANDOVER_FLOOR_S or work_s <= now_s:  # (made in the loop's time)
                advice.insert(0, f"batches are made in the training process (num_workers=0), "
                                 f"{1e3 * now_s:.2f} ms a batch: workers would not make them "
                                 "much sooner; larger batches, or less work a record")
            else:  # (made here in more time than the loop waits: beside it, on a thread, or
                # into new memory each batch, where a worker's slot is reused; 128 MiB batches
                # took 250 ms to collate here, 66 in a worker: "would not" was said of 2.8x)
                advice.insert(0, f"batches are made in the training process (num_workers=0), "
                                 f"{1e3 * work_s:.1f} ms of its time a batch: num_workers="
                                 f"{max(1, workers)} makes them in a worker process (into shared "
                                 "memory reused batch after batch), beside the training step; "
                                 "measure it (jl.profile(loader))")
        else:
            advice.insert(0, placement_advice(place, per, placed_in_thread, batch_bytes))
    elif waited / per < 2 * HANDOVER_FLOOR_S and work_s < 2 * HANDOVER_FLOOR_S and \
            stats.ready_ahead >= 1 and place <= handover:
        # the loop waits about what handing a batch over costs: its wait is the training
        # process's own work of a batch (more of it than the hand-over's timers see)
        bottleneck = "main"
        advice.insert(0, f"the loop waits {1e3 * waited / per:.3f} ms a batch, about what the "
                         "training process's hand-over of a batch from the workers costs; for "
                         "batches this cheap to make, num_workers=0, or larger batches")
    elif busy >= BUSY:
        bottleneck = "source" if read >= made_total - read else "workers"
        wanted = 2 * num_workers if remote else max(2 * num_workers, 2 * cores)
        more = fit(wanted)
        readers = counts is not None and not remote and more <= num_workers < wanted
        if off_cpu >= WAITS and stats.records and (more > num_workers or readers):
            overlap = min(read_threads or 1, MAX_TASK_STEPS * stats.records / max(
                1, stats.batches_made)) if bottleneck == "source" else 1  # (a task's records,
            # of up to 16 batches, read on the worker's threads at once, each read waiting
            # that long: 1.3 ms was said of 20; 0.41 of 2 for batches of 4, 16 threads)
            waits = 1e3 * off_cpu * sum(w.busy_s for w in stats.workers) * overlap / stats.records
            what = "reads wait" if bottleneck == "source" else \
                "the transforms wait (files, the network, sleeps, locks)"
            advice.insert(0, f"{what} ~{waits:.2g} ms a record off the CPU: more workers "
                             "than cores overlap the waits: " + (
                                 f"{more_readers(wanted)}, {gain(wanted)}" if readers else
                                 f"RayWorkers(n={more}, num_cpus="  # (rounded down: fit)
                                 f"{int(actor_cpus * num_workers / more * 1e3) / 1e3:g}), "
                                 f"{gain(more)}"
                                 if remote and actor_cpus else
                                 f"{named.format(more)}, {gain(more)}"))
            if bottleneck == "source" and read_threads is not None and read_threads < 1024:
                threads = min(1024, max(16, 2 * read_threads))
                advice.insert(1, f"or read_threads={threads}: each worker reads a batch's "
                                 f"records on {threads} threads, the waits overlapped without "
                                 "more processes (a source read record by record, safe on "
                                 "several threads; a MapSource's function runs on them where "
                                 "its own source is such a one)")
        elif queued >= CONTENDED and (remote or num_workers < cores):  # (the cores this
            # loader leaves are not idle: its workers' own queueing needs more than the cores)
            advice.insert(0, (
                f"the Ray actors waited for a core {queued:.0%} of their busy time: their "
                "nodes' cores are taken (other actors, the training process on the head node), "
                "so more actors there would not make batches sooner; add nodes or CPUs to the "
                "cluster, or make the work a record cheaper" if remote else
                f"the workers waited for a core {queued:.0%} of their busy time: other "
                "processes hold the cores (another loader's workers, the training step's "
                "threads), so more workers would not make batches sooner; make the work a "
                "record cheaper, or give the other processes fewer cores"))
        elif idle > 0:
            workers = fit(num_workers + idle)  # (none where no count the loader takes is more)
            if workers > num_workers:
                advice.insert(0, f"{idle} of {cores} cores idle: num_workers={workers}, "
                                 f"{gain(workers)}")
            elif counts is not None and not remote:
                advice.insert(0, f"{idle} of {cores} cores idle: "
                                 f"{more_readers(num_workers + idle)}, "
                                 f"{gain(num_workers + idle)}")
        elif remote:  # (a stream's actors divide its readers: none more may be all it takes)
            advice.insert(0, f"the Ray actors are busy {busy:.0%} of the time: " + (
                f"more of them (the cluster's CPUs permitting), {named.format(more)}, "
                f"{gain(more)}" if more > num_workers else "each reads its share of the "
                f"stream's readers; more readers and actors, readers_per_process="
                f"{2 * num_workers} and RayWorkers(n={2 * num_workers}) (the batches then come "
                "in another order), or a cheaper read or transform"))
        else:
            what = "reading (the source's own code)" if bottleneck == "source" else \
                "the transforms and collation"
            advice.append(f"every core is in use ({num_workers} workers on {cores} cores): "
                          f"make {what} cheaper, or move work to the device")
    else:
        # The workers idle while the loop waits: the training process's own work, if it is
        # a good part of the wait, or where batches were ready ahead as it waited (its
        # hand-over costs more than its timers see); else they wait for tasks or for a core
        # (every worker idle: one busy, late, leaves the others' batches ready while the loop
        # waits on its own)
        ready = stats.ready_ahead >= 1 and max(stats.busy, default=0.0) < BUSY and not stall
        main_work = place + handover >= MAIN_SHARE * waited
        if main_work or ready:
            bottleneck = "device" if place > handover and main_work else "main"
        else:
            bottleneck = "source" if read >= made_total - read else "workers"
        if bottleneck == "device":
            said = placement_advice(place, per, placed_in_thread, batch_bytes)
            advice.insert(0, f"{said}, while the workers wait ({busy:.0%} busy)")
        elif bottleneck == "main":
            advice.insert(0, f"the workers are busy {busy:.0%} of the time while the loop "
                             f"waits: the training process's hand-over takes "
                             f"{1e3 * handover / per:.2f} ms a batch" + (
                                 f" ({stats.ready_ahead:.0f} batches ready behind each one "
                                 f"handed out: the loop waits {1e3 * waited / per:.3f} ms a "
                                 "batch on the training process itself)" if ready else ""))
            if ready and work_s < waited / per:
                advice.insert(1, f"a batch takes {1e3 * work_s:.3f} ms to make, less than the "
                                 "loop waits for its hand-over: num_workers=0, or larger "
                                 "batches")
        else:
            ahead = "RayWorkers(n, in_flight=)" if remote else "prefetch="
            advice.append(f"the workers are busy only {busy:.0%} of the time while the loop "
                          f"waits: they wait for tasks (a larger {ahead} helps where batches "
                          "come in bursts) or for a core (other processes on these cores?)")
    if bottleneck == "source" and mapped:  # (a decoder in a mixture's component: "reading")
        advice.append(f"reading includes {', '.join(mapped)}: its function's CPU work (a "
                      "decoder?) is timed as reading; workers share it as they share "
                      "transforms, and a loader Map (where every part takes it) is timed apart")
    if stall and bottleneck != "step":  # (most of the time: short passes' starts limit it)
        advice.append(f"{stall / waited:.0%} of the wait in {stats.stalls} long wait(s) "
                      f"{starts}" + (": longer passes (num_epochs=None, or more steps a pass) "
                                     "start less often" if passes else ""))
    return Diagnosis(bottleneck, stages, tuple(advice), stats.batches, wait_fraction,
                     num_workers, stats.batches_made)
