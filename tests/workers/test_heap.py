"""A worker keeps the pages its last batch freed: records that are new arrays fault no pages
in once the worker has made a batch of them."""

from __future__ import annotations

import os

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.workers import heap
from jaxloader.workers.heap import Heap

pytestmark = pytest.mark.timeout(120)

glibc = pytest.mark.skipif(heap._glibc_mallopt() is None, reason="glibc's malloc is tuned only")


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def as_float(record: dict) -> dict:  # a new 256 KiB array a record, as a cast or crop makes
    return {"x": record["x"].astype(np.float32), "y": record["y"]}


@glibc
def test_a_worker_making_new_arrays_a_record_faults_no_pages_in_after_its_first_batches():
    source = jl.ArraySource({"x": np.ones((64, 256, 256), np.uint8), "y": np.arange(64)})
    batch, batches = 32, 12
    pages_a_batch = batch * 256 * 256 * 4 // os.sysconf("SC_PAGE_SIZE")  # the records' pages
    with jl.DataLoader(source, batch_size=batch, transforms=[jl.Map(as_float)], num_workers=1,
                       num_epochs=None, process_index=0, process_count=1) as loader:
        it = iter(loader)
        for _ in range(4):
            assert next(it)["x"].dtype == np.float32
        (pid,) = loader.worker_pids
        before = _minor_faults(pid)
        for _ in range(batches):
            next(it)
        faults = (_minor_faults(pid) - before) / batches
    # glibc's defaults gave the freed records back and faulted them in again: ~2,100 a batch
    assert faults < pages_a_batch / 8, (faults, pages_a_batch)


def test_the_kept_top_grows_with_the_largest_batch_and_is_bounded(monkeypatch):
    calls: list = []
    monkeypatch.setattr(heap, "_glibc_mallopt", lambda: lambda *args: calls.append(args))
    h = Heap()
    assert calls == [(heap._M_MMAP_THRESHOLD, heap.MMAP_THRESHOLD),
                     (heap._M_TRIM_THRESHOLD, heap.SLACK)]
    h.fit(100 << 20)
    h.fit(10 << 20)  # a smaller batch keeps what was kept
    h.fit(10 << 30)
    assert calls[2:] == [(heap._M_TRIM_THRESHOLD, (100 << 20) + heap.SLACK),
                         (heap._M_TRIM_THRESHOLD, heap.MAX_KEPT)]
    assert h.kept == heap.MAX_KEPT


def test_elsewhere_than_glibc_nothing_is_tuned(monkeypatch):
    monkeypatch.setattr(heap.os, "confstr", lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert heap._glibc_mallopt() is None
    h = Heap()
    h.fit(1 << 20)
    assert h.kept == 0
