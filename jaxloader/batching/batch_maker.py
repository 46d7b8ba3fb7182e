"""One batch from its step: sample, read, transform, collate.

::

    step ─> Sampler.batch ─> source.__getitems__(indices)          (vectorised, no record transform)
                          └> source[i] -> Map / RandomMap(rng_i)   (per record)
          ─> columns ─> [+ pad mask] ─> BatchMap ... ─> buffer from alloc (one copy) ─> batch

``BatchMaker`` is plain, picklable data: the main process runs it with ``num_workers=0`` and every
worker runs its own copy, so a batch is the same wherever it is made. It keeps no state between
calls other than memos (the sampler's shuffle chunk, the RandomMap bit generator).

Example:
    >>> import numpy as np
    >>> from jaxloader.order.sampling import Sampler
    >>> from jaxloader.sources import ArraySource, ConcatSource, MapSource
    >>> maker = BatchMaker(ArraySource({"x": np.arange(10)}),
    ...                    Sampler(10, 4, shuffle=False, seed=0, last_batch="drop"))
    >>> maker.make(1)[0]["x"].tolist()
    [4, 5, 6, 7]
"""

from __future__ import annotations

import warnings
from time import perf_counter
from typing import Any, Callable, Iterator, cast

import numpy as np

from jaxloader.batching import collate
from jaxloader.batching.record_columns import batch_columns, record_columns
from jaxloader.base import tree as tree_lib
from jaxloader.base.batch_rows import split_rows
from jaxloader.base.tree import RecordNames
from jaxloader.base.read_threads import (Reads, count as threads_now, current, item_of, pool_key,
                                         using)
from jaxloader.base.abilities import Originating, gatherer_of, origin_of
from jaxloader.base.checks import check_positions
from jaxloader.base.errors import (ConfigError, JaxloaderError, JaxloaderWarning, RecordError,
                                   raised)
from jaxloader.base.source_locks import held, holding, reading
from jaxloader.order.sampling import BatchSpec, Order
from jaxloader.sources import ArraySource, ConcatSource, MapSource
from jaxloader.sources.base import large_views, one_each
from jaxloader.sources.parts import reads_each, walk
from jaxloader.base.string_column import StringColumn
from jaxloader.base.timings import COLLATE, LOOP, READ, SAMPLE, StageClock
from jaxloader.batching.record_transforms import (RecordTransforms, indices_hint,
                                                  read_failed, source_read_only_hint)
from jaxloader.batching.batch_finish import finish_batch
from jaxloader.batching.jit_map import JitMap
from jaxloader.batching.pad import pad_records, split_pad
from jaxloader.batching.refills import RecordRefills
from jaxloader.batching.transforms import BatchMap, RandomMap


class BatchMaker:
    """Makes the batch of a global step for one process (see the module docstring)."""

    reads_under_locks = True  # in the training process its reads hold the source's locks,
    # not its record transforms (``base.source_locks.made_under``)

    def __init__(self, source: Any, sampler: Order, record_transforms: tuple = (),
                 batch_transforms: tuple[BatchMap, ...] = (), mask_key: str = "mask",
                 read_threads: int = 1) -> None:
        self.source, self.mask_key = source, mask_key
        self._origins = isinstance(source, Originating)  # (its records' files, in errors)
        self.read_threads = read_threads  # a batch's records read on so many threads at once
        self.pool_key = pool_key(read_threads)  # (its own pool of them, in each process)
        self._ahead: dict[int, tuple[Reads, int]] = {}  # a task's step -> its reads in flight
        self.sampler, self.record_transforms = sampler, record_transforms
        self.batch_transforms = batch_transforms
        self._pad, self._finishing = split_pad(batch_transforms)  # (a Pad: on the records)
        self._refills = RecordRefills()  # (its first records: a buffer filled again?)
        self._vectorised = (not record_transforms and self._pad is None
                            and hasattr(source, "__getitems__"))
        # With record transforms, a source that reads many records at once still does (a file
        # source's row group decoded once); an ArraySource's records stay read-only views.
        self._batched_reads = (hasattr(source, "__getitems__")  # (large records: views)
                               and not isinstance(source, ArraySource) and not large_views(source))
        # A source that gathers its columns itself (a ParquetSource: strings as one buffer)
        self._gather = gatherer_of(source)
        self._gather_failed: str | None = None  # a task's read at once that raised,
        self._gather_said = False  # and whether one that passed step by step was said
        # (memory-mapped files a part reads, checked each batch: base.mapped_files)
        self._mapped = [p for p in walk(source) if callable(getattr(p, "check_mapped", None))]
        self._borrowed = any(not type(p).__module__.startswith("jaxloader.") or isinstance(
            p, MapSource) for p in walk(source))  # (the user's records, or a function's, kept
        # by it? its records copied by a transform, a batch it reads where no slot takes it)
        self._transforms = RecordTransforms(record_transforms, sampler.seed, self._borrowed)
        check_positions(sampler.steps_per_epoch * sampler.global_batch_size,
                        any(isinstance(t, RandomMap) or (isinstance(t, JitMap) and t.random)
                            for t in (*record_transforms, *batch_transforms)))
        self.clock = StageClock()  # where this process's batches' time goes (base/timings)

    @property
    def seed(self) -> int:
        return self.sampler.seed

    @property
    def threaded_reads(self) -> int | None:
        """The threads a batch's records are read on; ``None`` where ``read_threads`` changes
        nothing (``sources.parts.reads_each``: each source reads a batch at once)."""
        return self.read_threads if reads_each(self.source) else None

    def location(self, step: int, named: bool = True) -> str:
        """Where step ``step``'s batch is, for messages; ``named``: its few records' files too."""
        origin = (lambda i: origin_of(self.source, i)) if named else None
        return self.sampler.batch(step).location(origin)

    def make(self, step: int, alloc: Callable[[int], Any] | None = None) -> tuple[Any, collate.Layout]:
        """The batch of ``step`` and its layout; written into ``alloc(nbytes)`` when given."""
        if self.read_threads > 1:  # (asked by each read a record at a time: base/read_threads)
            return using(self.pool_key, self._make, step, alloc)
        return self._make(step, alloc)

    def _make(self, step: int, alloc: Callable[[int], Any] | None) -> tuple[Any, collate.Layout]:
        clock = self.clock
        clock.made += 1  # is it timed (the rule of base/timings, asked inline)
        timed = clock.made <= SAMPLE or not clock.made % SAMPLE or clock.trace is not None
        start = perf_counter() if timed else 0.0
        spec = self.sampler.batch(step)
        self._check_mapped()  # (each batch, on every path)
        if self._vectorised:
            treedef, columns = reading(self._read_vectorised, spec)
            if timed:
                start = clock.span(READ, start)
        else:
            records = self._read_records(spec, timed, self._ahead.pop(step, None))
            if timed:
                start = clock.span(LOOP, start)
            names = self._names(spec)
            if self._pad is not None:
                records = pad_records(self._pad, records, names)
            treedef, columns = record_columns(records, names)
        made = self._finish(spec, treedef, columns, alloc, timed)
        if timed:
            clock.span(COLLATE, start)
            clock.count(_real(spec), made[1].nbytes)
        return made

    def _finish(self, spec: BatchSpec, treedef: tree_lib.TreeDef, columns: list,
                alloc: Callable[[int], Any] | None, timed: bool = False
                ) -> tuple[Any, collate.Layout]:
        """The batch of ``spec`` from its columns: the pad mask, the ``BatchMap``s, the slot."""
        if spec.valid is not None:
            treedef, columns = collate.add_leaf(treedef, columns, self.mask_key, spec.valid)
        return finish_batch(treedef, columns, self._finishing, len(spec.indices),
                            spec.location, alloc, self.clock if timed else None,
                            (self.sampler.seed, spec.epoch, spec.positions),
                            None if spec.valid is None else self.mask_key, self.clock)

    def make_steps(self, steps: list[int], allocs: list[Callable[[int], Any]]
                   ) -> Iterator[tuple[Any, collate.Layout]]:
        """``make(step, alloc)`` for each of ``steps`` (a worker's task), in order. A source
        that gathers its own columns (``gather_columns``) reads the rows of all the steps at
        once, then each step's rows are written into its slot: a task then costs about one
        step's read and NumPy calls, not one each. A read that raises is made again step by
        step, so the error names its own step (and one that then passes is said, once)."""
        clock = self.clock
        start = perf_counter()
        self._gather_failed = None
        self._check_mapped()  # (before a task's reads at once: each step's comes after them)
        gathered = self._gather_steps(steps) if len(steps) > 1 else None
        if gathered is None:
            reads = self._read_ahead(steps)
            try:
                for step, alloc in zip(steps, allocs):
                    made = self.make(step, alloc)
                    if step == steps[-1] and self._gather_failed is not None and not (
                            self._gather_said):  # (before the last yield: a worker takes as
                        self._gather_said = True  # many as it asked for, then closes it)
                        warnings.warn(f"steps {steps[0]}..{steps[-1]}: their rows read at once "
                                      f"raised {self._gather_failed}; read again step by step, "
                                      "they were not: the storage's or the network's error "
                                      "that passed, or one of so many rows at once (said once "
                                      "a worker)", JaxloaderWarning, stacklevel=2)
                    yield made
            finally:
                if reads is not None:  # (a task left: what is still to read is not read)
                    self._ahead.clear()
                    reads.close()
            return
        clock.add(READ, perf_counter() - start)  # (a task's read: once, timed each time)
        specs, columns = gathered  # specs: None where the sampler gave the task's indices
        n = len(specs[0].indices) if specs else self.sampler.batch_size
        layout = None  # the steps' one layout, where nothing else is added to their columns
        if not self._finishing and all(spec.valid is None for spec in specs or ()):
            layout = collate.layout_of(*collate.gathered_columns(_rows(columns, 0, n), n))
            if any(spec.offset == collate.BESIDE for spec in layout.leaves):
                layout = None  # objects that travel beside the slot: materialize's way
        for j, (step, alloc) in enumerate(zip(steps, allocs)):
            a, b = j * n, (j + 1) * n
            clock.made += 1  # (timed: base/timings' rule)
            timed = clock.made <= SAMPLE or not clock.made % SAMPLE or clock.trace is not None
            start = perf_counter() if timed else 0.0
            if layout is not None:
                made = collate.write_rows(layout, columns, a, b, alloc), layout
            else:
                spec = specs[j] if specs else self.sampler.batch(step)
                made = self._finish(spec, *collate.gathered_columns(_rows(columns, a, b), n),
                                    alloc, timed)
            if timed:
                clock.span(COLLATE, start)
                clock.count(n if layout is not None else _real(spec), made[1].nbytes)
            yield made

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_ahead": {}}  # (reads in flight stay in this process)

    def _check_mapped(self) -> None:
        for part in self._mapped:  # (a file cut since, read, ends the process by SIGBUS)
            part.check_mapped()

    def _read_ahead(self, steps: list[int]) -> Reads | None:
        """On read threads, in a worker, the records of all the task's ``steps`` read at once,
        in order (``_ahead``: each step's place), overlapping; ``None`` where read otherwise."""
        if self.read_threads < 2 or len(steps) < 2 or self._batched_reads or held() or (
                self._vectorised):
            return None
        try:  # (a process's first records: watched, read a batch at a time; none at one a batch)
            specs = [self.sampler.batch(step) for step in steps]
            if self._refills.left and len(specs[0].indices) > 1:
                return None
        except ConfigError:  # (past the last epoch: said at its own step)
            return None
        reads = Reads(self.source.__getitem__, np.concatenate(
            [spec.indices for spec in specs]).tolist(), self.pool_key)
        offsets = np.cumsum([0] + [len(spec.indices) for spec in specs]).tolist()
        self._ahead = {step: (reads, offset) for step, offset in zip(steps, offsets)}
        return reads

    def _gather_steps(self, steps: list[int]) -> tuple[list[BatchSpec] | None, dict] | None:
        """The steps' specs (``None`` where the sampler gives a task's indices at once, all
        whole batches without a mask: ``Sampler.task_indices``) and their rows in one
        ``gather_columns`` read, or ``None`` where that does not serve (no such source,
        record transforms, steps of other sizes, a read that raises or gives ``None``)."""
        if self._gather is None or not self._vectorised:
            return None
        indices = self.sampler.task_indices(steps)
        specs: list[BatchSpec] | None = None
        if indices is None:
            try:
                specs = [self.sampler.batch(step) for step in steps]
            except ConfigError:  # (past the last epoch: said at its own step, step by step)
                return None
            if len({len(spec.indices) for spec in specs}) != 1:
                return None  # a partial last batch among them
            indices = np.concatenate([spec.indices for spec in specs])
        try:
            gathered = self._gather(indices)
        except Exception as e:  # noqa: BLE001 - made again step by step, where it raises as its own
            self._gather_failed = f"{type(e).__name__}: {e}"  # (said if they do not)
            return None
        return None if gathered is None else (specs, gathered)

    def _read_vectorised(self, spec: BatchSpec) -> tuple:
        if type(self.source) is ArraySource:  # gather straight into the output: one copy
            return collate.take_columns(self.source.treedef, self.source.arrays, spec.indices)
        if isinstance(self.source, ConcatSource):  # a mixture, too
            joined = self.source.joined  # alike parts, joined where they crossed to a worker
            if joined is not None:
                return collate.take_columns(joined.treedef, joined.arrays, spec.indices)
            if self.source.alike_arrays:
                read, rows, local = self.source.split(spec.indices)
                parts = cast("list[ArraySource]", self.source.sources)  # (alike: all arrays)
                return collate.take_parts_columns(parts[0].treedef,
                                                  [parts[k].arrays for k in read], rows, local)
        if self._gather is not None:
            gathered = self._getitems(spec, self._gather, "gather_columns")
            if gathered is not None:
                return collate.gathered_columns(gathered, len(spec.indices))
        got = self._getitems(spec)
        if isinstance(got, list):
            return record_columns(got, self._names(spec))
        return batch_columns(got, len(spec.indices), self._borrowed)

    def _where(self, spec: BatchSpec) -> Callable[[int, int], str]:
        """How an error names a record of ``spec``: its step, position and source index, and
        the file it comes from where the source says (``origin_of``: a ``FileListSource``)."""
        if not self._origins:
            return spec.record_location
        return lambda position, index: spec.record_location(position, index) + self._origin(
            index)

    def _origin(self, index: int) -> str:
        said = origin_of(self.source, index)
        return f" ({said})" if said else ""

    def _names(self, spec: BatchSpec) -> RecordNames:
        names = spec.names()
        names.origin = self._origin if self._origins else None
        return names

    def _getitems(self, spec: BatchSpec, read: Callable[[Any], Any] | None = None,
                  name: str = "__getitems__") -> Any:
        try:
            got = (read or self.source.__getitems__)(spec.indices)
        except Exception as e:  # (the record named where the source said which: item_of)
            j = item_of(e)
            where = self._where(spec)(int(spec.positions[j]), int(spec.indices[j])) if (
                j is not None and 0 <= j < len(spec.indices)) else spec.location()
            raise RecordError(
                f"{where}: source.{name} raised {raised(e)}"
                f"{source_read_only_hint(e)}{indices_hint(e, read)}") from e
        if read is None and isinstance(got, list):
            one_each(got, len(spec.indices), f"{spec.location()}: source")
        return got

    def _read_records(self, spec: BatchSpec, timed: bool = False,
                      read: tuple[Reads, int] | None = None) -> list:
        """Each record read (``read``: already in flight, from an offset) and transformed; a
        ``RandomMap`` gets its record's generator (each transform timed on a ``timed``
        batch)."""
        source, epoch, run = self.source, spec.epoch, self._transforms
        detail = timed and bool(run)
        run.detail(detail)  # (a loop cut short by an error leaves no timers on)
        start = perf_counter()
        raw = None
        if self._batched_reads:
            got = reading(self._getitems, spec)
            raw = got if isinstance(got, list) else split_rows(got, len(spec.indices))
        records: list = []
        locks = held() if raw is None else ()  # (a record's read holds them, not its transforms)
        threads = threads_now()
        if len(locks) > 1 or (locks and threads > 1):  # a source made of others: its parts'
            raw = holding(locks, self._read_each, spec)  # locks taken once a batch (not a
            locks = ()  # record), its records read first; on threads, all read under them
        lock = locks[0] if locks else None
        ahead, at = read or (None, 0)  # (in a worker, on threads: reads in flight meanwhile)
        where = self._where(spec)
        if raw is None and ahead is None and threads > 1 and len(spec.indices) > 1:
            raw = self._read_each(spec) if self._refills.left else None  # (its first: watched)
            ahead = None if raw else Reads(source.__getitem__, spec.indices.tolist(), current())
        try:
            for j, (position, index) in enumerate(zip(spec.positions.tolist(),
                                                      spec.indices.tolist())):
                try:
                    before = self._refills.before(records, ahead is None)
                    if raw is not None:
                        record = raw[j]
                    elif ahead is not None:
                        record = ahead[at + j]
                    elif lock is not None:  # (in the training process: the source's lock)
                        with lock:
                            record = source[index]
                    else:  # (in a worker)
                        record = source[index]
                except RecordError as e:  # (a source's own, naming its place)
                    raise e.at(spec.step, position, index)
                except JaxloaderError:
                    raise
                except Exception as e:
                    raise RecordError(read_failed(where, position, index, e)).at(
                        spec.step, position, index) from e
                self._refills.after(before, records, source, self.record_transforms)
                try:
                    records.append(run(record, epoch, position, where, (position, index)))
                except RecordError as e:
                    raise e.at(spec.step, position, index)
                self._refills.after(before, records, source, self.record_transforms, back=2)
        finally:
            if ahead is not None and read is None:  # (a task's: closed as the task ends)
                ahead.close()
        if detail:
            self.clock.loop_detail(perf_counter() - start, run.spent)
        return records

    def _read_each(self, spec: BatchSpec) -> list:
        """The batch's records, ``source[index]`` each (on the batch's read threads), an error
        naming its record; a process's first records watched (``RecordRefills.each``)."""
        positions, indices, where = spec.positions.tolist(), spec.indices.tolist(), \
            self._where(spec)
        return self._refills.each(
            self.source, indices,
            lambda j, e: RecordError(read_failed(where, positions[j], indices[j], e)).at(
                spec.step, positions[j], indices[j]),
            lambda j, e: e.at(spec.step, positions[j], indices[j]) if isinstance(
                e, RecordError) else e)


def _real(spec: BatchSpec) -> int:
    """The records of a batch, its padding (``last_batch="pad"``) left out: what the stats
    count."""
    return len(spec.indices) if spec.valid is None else int(np.count_nonzero(spec.valid))


def _rows(columns: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    """Rows ``a`` to ``b`` of a task's gathered columns (arrays, ``StringColumn``s and
    ``DeferredTake``s)."""
    deferred = (StringColumn, collate.DeferredTake)
    return {name: c.rows(a, b) if type(c) in deferred else c[a:b] for name, c in columns.items()}
