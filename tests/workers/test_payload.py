from __future__ import annotations

import numpy as np
import pytest

from jaxloader.workers.payload import SHARE_MIN_BYTES, dumps, loads


def test_large_arrays_cross_once_through_shared_memory_read_only():
    big = np.arange(SHARE_MIN_BYTES, dtype=np.uint8)
    small = np.arange(10)
    segments = []
    blob = dumps({"a": big, "again": big, "fn": lambda: small.sum()}, segments.append)
    assert len(segments) == 1 and len(blob) < SHARE_MIN_BYTES // 4
    out = loads(blob)
    assert np.array_equal(out["a"], big) and out["a"] is out["again"]
    assert out["fn"]() == 45
    with pytest.raises(ValueError, match="read-only"):
        out["a"][0] = 1
    del out
    for seg in segments:
        seg.destroy()


def test_memmaps_cross_as_their_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(2 * SHARE_MIN_BYTES, dtype=np.int32).reshape(1024, -1))
    mm = np.load(path, mmap_mode="r")
    segments = []
    out = loads(dumps([mm, mm[100:200, 3:]], segments.append))
    assert not segments
    assert np.array_equal(out[0], mm) and np.array_equal(out[1], mm[100:200, 3:])
