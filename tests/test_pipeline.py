"""BatchMaker.make_steps: a worker's task read at once gives what its steps give one by one."""

from __future__ import annotations

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.batching.batch_maker import BatchMaker
from jaxloader.order.sampling import Sampler
from resume_harness import assert_same_batch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _parquet(tmp_path, n=103):
    path = str(tmp_path / "rows.parquet")
    vectors = np.arange(n * 3, dtype=np.float32).reshape(n, 3)  # rows of 3: a 2-D leaf
    pq.write_table(pa.table({"id": np.arange(n), "text": [f"row {i}" + "é" * (i % 3)
                                                          for i in range(n)],
                             "vector": pa.FixedSizeListArray.from_arrays(vectors.ravel(), 3)}),
                   path, row_group_size=10)
    return path


def _slots(count):
    buffers = [bytearray(1 << 16) for _ in range(count)]
    return buffers, [lambda nbytes, b=b: memoryview(b)[:nbytes] for b in buffers]


@pytest.mark.parametrize("last_batch", ["drop", "pad", "partial"])
def test_a_tasks_steps_read_at_once_equal_its_steps_made_one_by_one(tmp_path, last_batch):
    path = _parquet(tmp_path)

    def maker():  # a read-local order over 2 row groups a window
        return jl.DataLoader(jl.ParquetSource(path), batch_size=8, seed=3,
                             shuffle=jl.LocalShuffle(window=2), last_batch=last_batch,
                             process_index=0, process_count=1)._maker

    steps = [2, 4, 6, 8, 10, 12, 14]  # 12 is the last of epoch 0: short with "partial"
    one_by_one, at_once = maker(), maker()
    # read at once unless a step is short (then made one by one)
    assert (at_once._gather_steps(steps) is None) == (last_batch == "partial")
    buffers, allocs = _slots(len(steps))
    made = list(at_once.make_steps(steps, allocs))
    for step, (batch, layout), buffer in zip(steps, made, buffers):
        want, _ = one_by_one.make(step)
        got = layout.views(np.frombuffer(buffer, np.uint8),
                           [leaf for spec, leaf in zip(layout.leaves, batch.values())
                            if spec.offset < 0])
        assert_same_batch(got, want, f"step {step}")


def test_a_read_that_raises_is_made_again_step_by_step_and_names_its_own_step(tmp_path):
    class Flaky(jl.ParquetSource):
        def gather_columns(self, indices):
            if 42 in indices.tolist():
                raise ValueError("record 42")
            return super().gather_columns(indices)

    source = Flaky(_parquet(tmp_path))
    maker = BatchMaker(source, Sampler(103, 2, shuffle=False, seed=0, last_batch="drop"))
    _, allocs = _slots(4)
    batches = maker.make_steps([17, 19, 21, 23], allocs)  # step 21 holds record 42
    assert [int(next(batches)[0]["id"][0]) for _ in range(2)] == [34, 38]
    with pytest.raises(jl.RecordError, match=r"step 21 .*gather_columns raised ValueError"):
        next(batches)


def test_a_read_at_once_that_raised_and_then_did_not_is_said(tmp_path):
    # a task's rows read at once raised (a connection reset), read again step by step they
    # did not: the batches came and the error was gone without a word, only with workers
    class Once(jl.ParquetSource):
        failed = False

        def gather_columns(self, indices):
            if not Once.failed:
                Once.failed = True
                raise ConnectionResetError(104, "Connection reset by peer")
            return super().gather_columns(indices)

    maker = BatchMaker(Once(_parquet(tmp_path)),
                       Sampler(103, 2, shuffle=False, seed=0, last_batch="drop"))
    _, allocs = _slots(4)
    with pytest.warns(jl.JaxloaderWarning, match=r"steps 17..23: their rows read at once raised "
                      r"ConnectionResetError: .*Connection reset by peer; read again step by "
                      r"step, they were not"):
        made = maker.make_steps([17, 19, 21, 23], allocs)
        batches = [next(made) for _ in range(4)]  # (as a worker takes them: then closed)
        made.close()
    assert [int(batch["id"][0]) for batch, _ in batches] == [34, 38, 42, 46]
    Once.failed = False  # (again: said once a worker, not once a task)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(list(maker.make_steps([17, 19, 21, 23], allocs))) == 4
    assert not caught, caught


def test_a_gathered_column_of_objects_travels_beside_the_slot_as_one_by_one():
    class Gathers:  # a source whose gather_columns gives a column of Python objects
        def __len__(self):
            return 40

        def __getitems__(self, indices):
            return self.gather_columns(indices)

        def gather_columns(self, indices):
            tags = np.empty(len(indices), dtype=object)  # 1-D: a tuple a row, not a 2-D array
            tags[:] = [("t", int(i)) for i in indices]
            return {"id": indices * 10, "tag": tags}

    maker = BatchMaker(Gathers(), Sampler(40, 4, shuffle=False, seed=0, last_batch="drop"))
    steps = [1, 3, 5]
    buffers, allocs = _slots(len(steps))
    for step, (batch, layout), buffer in zip(steps, maker.make_steps(steps, allocs), buffers):
        got = layout.views(np.frombuffer(buffer, np.uint8),
                           [leaf for spec, leaf in zip(layout.leaves, batch.values())
                            if spec.offset < 0])
        rows = range(4 * step, 4 * step + 4)
        assert got["id"].tolist() == [10 * r for r in rows]
        assert got["tag"].tolist() == [("t", r) for r in rows]
