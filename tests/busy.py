"""Work that takes a known time, for tests of timings and verdicts: CPU spent (``spin``) and
reads that wait off the CPU (``WaitingSource``)."""

from __future__ import annotations

import time

import numpy as np


def spin(seconds: float) -> None:
    """Busy for ``seconds`` of this thread's CPU (a CPU-heavy transform)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class WaitingSource:
    """``n`` records whose reads wait ``wait_s`` each, off the CPU (storage)."""

    def __init__(self, n: int = 1 << 20, wait_s: float = 0.002) -> None:
        self.n, self.wait_s = n, wait_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        time.sleep(self.wait_s)
        return {"x": np.float32(i)}
