"""Read-local shuffling: blocks of neighbouring records in a keyed order, records shuffled
within a window of blocks. Still a bijection of positions, so still O(1) to restore.

::

    epoch e:  blocks (row groups, or block_size records) ── keyed permutation ──> b_0 b_1 b_2 ...
              windows of `window` consecutive permuted blocks:  [b_0 .. b_7] [b_8 .. b_15] ...
              position p ─> its window w ─> keyed permutation of w's records ─> (block, row)

A batch then reads from the `window` blocks of one window (rarely two) instead of one record out
of almost every block: a Parquet worker decodes a few row groups a batch, and its row-group
cache keeps them. Shuffling is weaker than a full shuffle (records of one window stay together
within the epoch), as for every read-local loader; the blocks and windows change every epoch.
Memory is O(number of blocks), computed once an epoch.

Example:
    >>> order = BlockOrder(np.arange(0, 101, 10), window=2, seed=0, epoch=0)
    >>> indices = order(np.arange(100))
    >>> sorted(indices.tolist()) == list(range(100))   # a bijection of the positions
    True
    >>> len(set((indices[:20] // 10).tolist()))       # the first 20 positions: 2 blocks
    2
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from jaxloader.base.abilities import block_starts_of
from jaxloader.base.checks import Int, check_int
from jaxloader.base.errors import ConfigError
from jaxloader.order.index_shuffle import EXACT_UP_TO, IndexShuffle, splitmix64

_BLOCK_ORDER_KEY = 0x5EED_B10C  # distinct keys for the block order and the windows
MAX_BLOCKS = 1 << 27  # blocks of a read-local order at most: ~4 GiB of their arrays


@dataclasses.dataclass(frozen=True, init=False)  # (its __init__ takes NumPy ints)
class LocalShuffle:
    """``shuffle=LocalShuffle(window=8)``: shuffle blocks, and records within windows of blocks.

    ``block_size=None`` takes the source's own blocks (a ``ParquetSource``'s row groups) and
    1,024 records elsewhere.

    Example:
        >>> import jaxloader as jl
        >>> jl.LocalShuffle(window=4).window
        4
    """

    window: int = 8
    block_size: int | None = None

    def __init__(self, window: Int = 8, block_size: Int | None = None) -> None:
        # (frozen; a NumPy int taken, kept as a Python int)
        object.__setattr__(self, "window", check_int(
            "LocalShuffle(window)", window, low=1, remedy="blocks shuffled together"))
        object.__setattr__(self, "block_size", None if block_size is None else check_int(
            "LocalShuffle(block_size)", block_size, low=1,
            remedy="records a block, or None for the source's own blocks"))

    def block_starts(self, source: object, num_records: int) -> np.ndarray:
        """Where each block starts, and ``num_records`` last."""
        own = block_starts_of(source) if self.block_size is None else None
        if own is not None:
            return own
        size = self.block_size or 1024
        if -(-num_records // size) > MAX_BLOCKS:  # (each process and worker holds a few
            least = -(-num_records // MAX_BLOCKS)  # arrays of them, made anew each epoch)
            raise ConfigError(
                f"LocalShuffle: {num_records:,} records in blocks of {size:,} are "
                f"{-(-num_records // size):,} blocks, whose order takes ~32 bytes a block in "
                f"each process and worker (a read-local order is made of its blocks); pass "
                f"LocalShuffle(window={self.window}, block_size={least}) or more (up to "
                f"{MAX_BLOCKS:,} blocks)")
        return np.append(np.arange(0, num_records, size, dtype=np.int64), num_records)

    def describe(self, source: object) -> str:
        """For the state: what must match for a step to mean the same records; the source's own
        blocks by where they start (``blocks_layout``: a user's length buckets, made anew with
        other edges over the same records, restored silently into other batches)."""
        own = block_starts_of(source) if self.block_size is None else None
        if own is None:
            return f"window {self.window}, blocks {self.block_size or 1024}"
        return f"window {self.window}, blocks the source's ({blocks_layout([own])})"


def same_order(saved: Any, now: Any) -> bool:
    """Whether a state's read-local order (``describe``'s, ``saved``) is this loader's (``now``):
    the same, or a state from before 2026-12-01 over the source's own blocks, which it did not
    name (restored as then)."""
    return saved == now or (isinstance(saved, str) and isinstance(now, str)
                            and saved.endswith("blocks the source's")
                            and now.startswith(saved + " ("))


def exact_blocks(starts: np.ndarray) -> bool:
    """Whether a read-local order of the blocks starting at ``starts`` (the records' count
    last) permutes them exactly: a state of it saved before 2026-12-03 had another order."""
    return 1 < len(starts) - 1 <= EXACT_UP_TO


def blocks_layout(starts: list[np.ndarray]) -> str:
    """Where the blocks of a read-local order start (a source's, or each component's), short:
    what the processes of a run compare, which a state's ``local_shuffle`` does not name (the
    same rows in other row groups: other blocks, another order).

    Example:
        >>> blocks_layout([np.array([0, 50, 100])])[:22]
        '2 blocks, starts sha1 '
    """
    digest = hashlib.sha1()
    for part in starts:
        digest.update(np.asarray(part, "<i8").tobytes() + b"/")
    return f"{sum(len(part) - 1 for part in starts)} blocks, starts sha1 {digest.hexdigest()[:12]}"


class BlockOrder:
    """Epoch ``epoch``'s read-local order of the records between ``block_starts[0]`` and
    ``block_starts[-1]``: a bijection of positions, evaluated on arrays. Up to
    ``EXACT_UP_TO`` blocks are permuted exactly (``exact_blocks``; before 2026-12-03, by the
    Feistel network, whose orders of 5 blocks came from 0.7 to 1.5 times as often as they
    should, and which makes no odd permutation of 16 or 64)."""

    def __init__(self, block_starts: np.ndarray, *, window: int, seed: int, epoch: int) -> None:
        self.epoch = epoch
        self._starts = block_starts
        blocks = len(block_starts) - 1
        self._order = IndexShuffle(blocks, seed=splitmix64(seed ^ _BLOCK_ORDER_KEY),
                                   epoch=epoch, exact=True)(np.arange(blocks))
        sizes = np.diff(block_starts)[self._order]
        self._at = np.concatenate([[0], np.cumsum(sizes)])  # position of each permuted block
        self._window = window
        self._window_starts = self._at[::window]  # the last entry is num_records when aligned
        self._seed = seed
        self._shufflers: dict[int, IndexShuffle] = {}

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if not len(positions):
            return positions.copy()
        # A sampler's chunk is mostly in one window: its least and greatest positions tell
        # (two searches, not one a position: ~60 us of 8,192 positions in ~640)
        first, last = self._window_starts.searchsorted(
            [positions.min(), positions.max()], side="right") - 1
        if first == last:
            return self._in_window(int(first), positions)
        windows = self._window_starts.searchsorted(positions, side="right") - 1
        out = np.empty(len(positions), np.int64)
        for w in np.unique(windows).tolist():
            at = windows == w
            out[at] = self._in_window(w, positions[at])
        return out

    def _in_window(self, window: int, positions: np.ndarray) -> np.ndarray:
        """The records at ``positions``, all in window ``window``."""
        first = window * self._window
        last = min(first + self._window, len(self._order))
        at = self._at[first:last + 1]  # where the window's blocks start, and its end
        start = int(at[0])
        shuffled = self._shuffler(window, int(at[-1]) - start)(positions - start) + start
        block = at.searchsorted(shuffled, side="right") - 1  # among the window's blocks only
        return shuffled + (self._starts[self._order[first:last]] - at[:-1])[block]

    def _shuffler(self, window: int, length: int) -> IndexShuffle:
        shuffler = self._shufflers.get(window)
        if shuffler is None:
            if len(self._shufflers) > 4:
                self._shufflers.clear()
            key = splitmix64(splitmix64(self._seed ^ self.epoch) ^ window)
            shuffler = self._shufflers[window] = IndexShuffle(length, seed=key, epoch=self.epoch,
                                                              tight=True)
        return shuffler
