from __future__ import annotations

import os

import numpy as np

from jaxloader.workers.shm import PREFIX, Segment, attach


def test_names_carry_prefix_and_owner_pid_and_unlink_removes_them():
    seg = Segment.create(10_000)
    assert seg.name.startswith(f"{PREFIX}_{os.getpid()}_") and seg.size % 4096 == 0
    assert os.path.exists(f"/dev/shm/{seg.name}")
    other = attach(seg.name, seg.size)
    other[5] = 42
    assert seg.buf[5] == 42  # one memory, two mappings
    other.close()
    assert seg.destroy()
    assert not os.path.exists(f"/dev/shm/{seg.name}")
    seg.destroy()  # idempotent


def test_close_with_live_views_never_raises_and_the_views_stay_valid():
    seg = Segment.create(4096)
    view = np.frombuffer(seg.buf, np.uint8)
    view[:3] = [1, 2, 3]
    assert seg.destroy() is False  # still read by the view: unmapped when the view dies
    assert not os.path.exists(f"/dev/shm/{seg.name}")
    assert view[:3].tolist() == [1, 2, 3]
    del view
