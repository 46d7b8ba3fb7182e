"""``StreamBatchMaker``: a reader's next ``batch_size`` records, transformed and collated.

::

    reset(states) ──> the readers hosted here continue from their states (or the first's start)
    make(step, alloc) ──> records = reader s % K .next() x batch_size ──> Map / RandomMap
                          (a Filter drops a record: the next one is read in its place)
                          [a pass that ends: padded to batch_size, + a mask leaf]
                          ──> collate (into alloc: a worker's shared-memory slot) ──> BatchMap
    report() ──> the reader's state after the batch just made (JSON; in a pass, + "ended")

Step ``s`` of a process is made by its reader ``s % K`` (``K`` readers a process:
``readers_per_process``, by default ``max(1, num_workers)``), as that reader's ``s // K``-th
batch, in worker ``s % W``, which hosts readers ``w, w + W, ...`` (``W`` divides ``K``; in
process one maker hosts all ``K``). A batch is the same whichever worker makes it, so a
state restores into any worker count that divides ``K``. A ``RandomMap``
gets a generator keyed by ``(seed, (step * process_count + process) * batch_size + row)``, and
by how many records a ``Filter`` dropped at that row before (each try its own numbers); a
``JitMap``'s keys are those of the row.

Example:
    >>> from jaxloader.streams.reader import Stream
    >>> maker = StreamBatchMaker(Stream.from_generator(lambda i: ({"x": j} for j in range(5)),
    ...                                                shards=1),
    ...                          batch_size=2, seed=0, process_index=0, process_count=1,
    ...                          per_process=1)
    >>> maker.reset(None); maker.make(0)[0]["x"].tolist(), maker.report()["emitted"]
    ([0, 1], 1)
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable, Iterator

import numpy as np

from jaxloader.batching import collate
from jaxloader.batching.record_columns import record_columns
from jaxloader.base.checks import POSITION_BITS as _POSITION_BITS
from jaxloader.base.errors import JaxloaderError, RecordError, closed_on_failure
from jaxloader.base.timings import COLLATE, LOOP, SAMPLE, StageClock
from jaxloader.base.tree import RecordNames
from jaxloader.batching.batch_finish import finish_batch
from jaxloader.streams.contract import ReadableStream, RecordReader
from jaxloader.streams.origins import batch_start, described, rerun
from jaxloader.streams.packed import PackedStream
from jaxloader.batching.pad import pad_records, split_pad
from jaxloader.batching.record_transforms import DROPPED, RecordTransforms
from jaxloader.batching.transforms import Filter

_POSITION_MASK = (1 << _POSITION_BITS) - 1
DROP_RUN = 100_000  # records in a row a Filter drops before a reader gives up


class StreamBatchMaker:
    """Batches of the readers of ``stream`` given to ``reset`` (one, or those a worker hosts):
    step ``s`` is made by this process's reader ``s % per_process``."""

    def __init__(self, stream: ReadableStream, *, batch_size: int, seed: int,
                 process_index: int, process_count: int, per_process: int,
                 record_transforms: tuple = (), batch_transforms: tuple = (),
                 mask_key: str | None = None) -> None:
        self.stream, self.batch_size, self.seed = stream, batch_size, seed
        self.mask_key = mask_key  # a pass that ends: batches padded, this leaf True on records
        self._ended = False  # (a pass) the last batch's reader has no record left
        self.source = stream  # what the worker pool names when it cannot be pickled
        self.process_index, self.process_count, self.per_process = (process_index,
                                                                    process_count, per_process)
        self.record_transforms, self.batch_transforms = record_transforms, batch_transforms
        self._pad, self._finishing = split_pad(batch_transforms)  # (a Pad: on the records)
        self._transforms = RecordTransforms(record_transforms, seed, copies=True)  # (a
        # generator may yield dicts it keeps)
        self.clock = StageClock()  # where this process's batches' time goes (base/timings)
        self._hosted: dict[int, RecordReader] = {}  # this process's reader k -> it, as reset
        self._reader: RecordReader | None = None  # the one that made the last batch
        self._before: dict | None = None  # its state before that batch (errors read it again)
        self._reads_at: list[int] | None = None  # (Filters) each row's count of records read
        self._untils: dict[int, dict] = {}  # each reader's pass end, as reset: {"until": e}
        self.readers = process_count * per_process
        for k in range(per_process):  # refuses too few shards now, not in a worker later
            self.reader_for(k)

    def reader_for(self, local: int) -> RecordReader:
        """This process's reader ``local`` (``streams.contract``: a ``StreamReader``, or a
        ``MixedReader`` or a packing reader over such readers)."""
        return self.stream.reader(reader=self.process_index * self.per_process + local,
                                  readers=self.readers, seed=self.seed,
                                  batch_size=self.batch_size)

    def initial_states(self) -> list[dict]:
        """Each of this process's readers' state at the start of the stream."""
        return [self.reader_for(k).initial_state() for k in range(self.per_process)]

    def reset(self, state: dict | list | None) -> None:
        """Hosts the readers of ``state``: one reader's state, a list of them (those a worker
        hosts: ``k``, ``k + W``, ...), or ``None`` (this process's first reader, at its
        start); each continues from its state."""
        self.close()
        self._hosted, self._reader = {}, None
        first = self.process_index * self.per_process
        for one in state if isinstance(state, list) else [state]:
            local = (first if one is None else one.get("reader") or 0) - first
            reader = self.reader_for(local if 0 <= local < self.per_process else 0)
            # (not hosted yet if it fails: close() would not reach its open shard)
            with closed_on_failure(reader.close, f"reader {reader.reader}'s shard"):
                reader.reset(one)  # (opens its shard, reads its window again)
            self._hosted[reader.reader - first] = reader
            self._untils[reader.reader] = {"until": one["until"]} if one and "until" in one else {}

    def close(self) -> None:
        """Closes the shards the readers hosted here have open."""
        for reader in self._hosted.values():
            reader.close()

    def make_steps(self, steps: list[int], allocs: list[Callable[[int], Any]]
                   ) -> Iterator[tuple[Any, Any]]:
        """``make(step, alloc)`` for each of ``steps`` (a worker's task), in order."""
        for step, alloc in zip(steps, allocs):
            yield self.make(step, alloc)

    def location(self, step: int, named: bool = True) -> str:
        """Where step ``step``'s batch is, for messages (``named``: no files to name here)."""
        reader = self.process_index * self.per_process + step % self.per_process
        return f"stream step {step} (reader {reader}, its batch {step // self.per_process})"

    def first_origin(self, step: int) -> str | None:
        """``"its first record: "`` and the shard and place of step ``step``'s batch's first
        record, read by the reader hosted here (a copy reset to the state before the step: a
        message about a batch made elsewhere); ``None`` where that reader names none."""
        reader = self._hosted[step % self.per_process]
        if getattr(reader, "origin", None) is None:  # (packed rows)
            return None
        reader.begin_step(step)
        reader.next()
        return f"its first record: {reader.origin()}"  # type: ignore[attr-defined]

    def report(self) -> dict:
        """The state of the last batch's reader after it; in a pass that ends, with
        ``"ended"``: whether that reader has no record left in the pass."""
        assert self._reader is not None
        state = self._reader.get_state()
        return state if self.mask_key is None else {**state, "ended": self._ended}

    def make(self, step: int, alloc: Callable[[int], Any] | None = None) -> tuple[Any, Any]:
        if not self._hosted:
            self.reset(None)
        self._reader = self._hosted.get(step % self.per_process)
        if self._reader is None:  # (the loader routes a step to the worker hosting its reader)
            raise JaxloaderError(f"{self.location(step)}: this maker hosts readers "
                                 f"{sorted(self._hosted)} of this process, not its")
        self._before = {**self._reader.get_state(), **self._untils.get(self._reader.reader, {})
                        } if getattr(self._reader, "origin", None) is not None else None
        self._reader.begin_step(step)  # (a mixture's weight changes start where it is)
        clock, run = self.clock, self._transforms
        clock.made += 1  # is it timed (the rule of base/timings, asked inline)
        timed = clock.made <= SAMPLE or not clock.made % SAMPLE or clock.trace is not None
        run.detail(timed and bool(run))
        start = perf_counter() if timed else 0.0
        records = self._filtered(step) if run.filters else self._taken(step)
        if timed:
            if run:
                clock.loop_detail(perf_counter() - start, run.spent)
            start = clock.span(LOOP, start)
        real = len(records)
        names = RecordNames(origin=lambda row: self._origin(step, self._reads(row, real)))
        records = self._padded(step, records)
        if self._pad is not None:
            records = pad_records(self._pad, records, names)
        treedef, columns = record_columns(records, names)
        if self.mask_key is not None:  # a pass that ends: True on the records
            valid = np.arange(self.batch_size) < real
            treedef, columns = collate.add_leaf(treedef, columns, self.mask_key, valid,
                                                "StreamLoader(num_epochs=...)")
        first = (step * self.process_count + self.process_index) * self.batch_size
        made = finish_batch(treedef, columns, self._finishing, self.batch_size,
                            lambda: self.location(step), alloc, clock if timed else None,
                            (self.seed, 0, np.arange(first, first + self.batch_size)),
                            self.mask_key, clock)
        if timed:
            clock.span(COLLATE, start)
            clock.count(real, made[1].nbytes)
        return made

    def _taken(self, step: int) -> list:
        """``batch_size`` records, transformed (fewer at the end of a pass: its reader's
        ``next()`` raises ``StopIteration`` there, an endless one never)."""
        assert self._reader is not None
        records: list = []
        take, keep = self._reader.next, records.append
        try:
            for _ in range(self.batch_size):
                keep(take())
        except StopIteration:
            pass
        if self._transforms:  # (the loop of _transform, inlined: it runs once a record)
            run, first = self._transforms, self._position(step, 0)
            records = [run(record, (first + row) >> _POSITION_BITS,
                           (first + row) & _POSITION_MASK, self._where, (step, row, row + 1))
                       for row, record in enumerate(records)]
        self._reads_at = None  # (row r is the (r + 1)-th record read)
        return records

    def _padded(self, step: int, records: list) -> list:
        """In a pass that ends, ``records`` filled up to ``batch_size`` with a padding record,
        and whether the reader is done noted for the report; otherwise ``records``."""
        if self.mask_key is None:
            return records
        assert self._reader is not None
        real = len(records)
        if real < self.batch_size:
            records = records + [self._padding(step, records)] * (self.batch_size - real)
        self._ended = not self._reader.has_next()
        return records

    def _padding(self, step: int, records: list) -> Any:
        """The record that pads step ``step`` after its ``records``: the last record of the
        pass that the ``Filter``s keep, transformed as the first padded row (a pure function of
        the reader's state: the same after a restore, in any worker). Where the Filters drop
        all of the last window (a window of one record: no ``shuffle_window``), the batch's
        own last record; in a batch with none, the last record through the Maps alone (its
        rows are masked False: what a Filter would drop is never read as a record)."""
        assert self._reader is not None
        row = len(records)
        last = self._reader.last_records()
        for record in last:
            record = self._transform(step, row, record)
            if record is not DROPPED:
                return record
        if isinstance(self.stream, PackedStream):
            raise RecordError(
                f"{self.location(step)}: the pass has ended, and the Filters drop the row of "
                "padding (tokens and segment ids 0) that pads a PackedStream's last batches; "
                "let the Filter keep a row whose segment ids are all 0 (the batch's mask is "
                "False there), or mark rows in a Map instead")
        if records:
            return records[-1]
        try:
            return self._transform(step, row, last[0], filters=False)
        except RecordError as e:
            raise RecordError(
                f"{self.location(step)}: the pass has ended, and its batch of padding alone is "
                "padded with the reader's last record run through the Maps only (the Filters "
                f"drop it), where {e}; let the Filters keep that record, give the stream a "
                "shuffle_window (a padding record is then one of its last window's), or let "
                "the Maps take it") from e

    def _filtered(self, step: int) -> list:
        """``batch_size`` records that every ``Filter`` keeps, read on past those dropped."""
        assert self._reader is not None
        out: list = []
        dropped = reads = 0  # dropped in a row, at this row; read for the batch
        self._reads_at = reads_at = []
        while len(out) < self.batch_size:
            try:
                raw = self._reader.next()
            except StopIteration:  # the end of a pass: the rest of the batch is padding
                break
            reads += 1
            record = self._transform(step, len(out), raw, dropped, reads=reads)
            if record is not DROPPED:
                out.append(record)
                reads_at.append(reads)
                dropped = 0
                continue
            dropped += 1
            if dropped == DROP_RUN:  # an endless stream of them would never fill a batch
                names = ", ".join(repr(t) for t in self.record_transforms
                                  if isinstance(t, Filter))
                raise RecordError(
                    f"{self.location(step)}: {names} dropped {DROP_RUN:,} records in a row; "
                    "check the filter (it keeps a record when it returns True)")
        return out

    def _transform(self, step: int, row: int, record: Any, dropped: int = 0,
                   filters: bool = True, reads: int = 0) -> Any:
        """``record``, the batch's row ``row``, through the record transforms (``DROPPED``
        when a ``Filter`` drops it, ``dropped`` being how many it dropped at this row; with
        ``filters=False`` through the others only); the ``reads``-th record read for the
        batch (0: a padding record). A ``RandomMap`` is keyed by the record's place in the
        process-major stream."""
        at = self._position(step, row)
        return self._transforms(record, at >> _POSITION_BITS, at & _POSITION_MASK,
                                self._where, (step, row, reads), dropped << 32, filters)

    def _where(self, step: int, row: int, reads: int) -> str:
        """Names the batch's row ``row``, the ``reads``-th record read for it, in an error."""
        return f"stream step {step}, row {row}{self._origin(step, reads)}"

    def _reads(self, row: int, real: int) -> int:
        """Which record read for the last batch its row ``row`` is (0: padding)."""
        if row >= real:
            return 0
        return row + 1 if self._reads_at is None else self._reads_at[row]

    def _origin(self, step: int, reads: int) -> str:
        """`` (shard and place)`` of the ``reads``-th record read for step ``step``'s batch:
        its reader is made anew at its state before the batch, and reads up to it."""
        live, before = self._reader, self._before
        if not reads or live is None or before is None:
            return ""
        if rerun(self.stream, before):  # (its generators would run anew, long)
            return batch_start(live, before)

        def replay() -> str | None:
            assert live is not None and before is not None
            reader = self.reader_for(live.reader - self.process_index * self.per_process)
            try:
                reader.reset(before)
                reader.begin_step(step)
                for _ in range(reads):
                    reader.next()
                return reader.origin()  # type: ignore[attr-defined]
            finally:
                reader.close()
        return described(replay)

    def _position(self, step: int, row: int) -> int:
        """The place of the batch's row ``row`` in the process-major stream of records."""
        return (step * self.process_count + self.process_index) * self.batch_size + row


