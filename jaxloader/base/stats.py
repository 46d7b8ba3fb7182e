"""How long the consumer waited for batches against how long it ran between them.

A training loop is input-bound when ``wait_fraction`` is large: the step waited for data.

Example:
    >>> s = LoaderStats(batches=10, wait_s=0.1, run_s=0.9)
    >>> round(s.wait_fraction, 2)
    0.1
"""

from __future__ import annotations

from typing import NamedTuple


class LoaderStats(NamedTuple):
    """Counts since the loader was made (or since ``reset_stats()``)."""

    batches: int
    wait_s: float  # time spent inside next(): waiting for the loader
    run_s: float  # time between one next() returning and the following next() call

    @property
    def wait_fraction(self) -> float:
        """The share of the loop's time spent waiting for input (0 when nothing was timed)."""
        total = self.wait_s + self.run_s
        return self.wait_s / total if total else 0.0
