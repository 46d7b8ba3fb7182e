"""``IndexShuffle``: a keyed bijection of ``[0, n)``, evaluated on arrays of positions.

A Feistel network over the smallest even power of two >= n, with cycle-walking to land back in
``[0, n)``: a billion-record epoch needs no billion-entry array. Its halves are a few bits each
where n is small, and then its permutations are far from uniform (of 5 records, some orders
came twice as often as others); ``exact=True`` shuffles up to ``EXACT_UP_TO`` records by sorting
a random number each (a table, made once). A mixture's larger components and a read-local
window use a domain just above n (``tight``), in 32-bit words: a high digit mixed modulo
``ceil(n / 2**k)``, a low one of k bits.

Example:
    >>> perm = IndexShuffle(10, seed=0, epoch=0)(np.arange(10))
    >>> sorted(perm.tolist()) == list(range(10))
    True
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxloader.base.checks import MASK64

_FEISTEL_ROUNDS = 6  # 4 rounds make a pseudo-random permutation; 2 more for margin.
# Tight: 8, for small domains: with 6, the pairs (where 0 goes, where 1 goes) of a 16-record
# shuffle over 40,000 seeds gave a chi-square of 327 on 239 degrees of freedom; with 8, 244.
_TIGHT_ROUNDS = 8
# A tight domain's values past n (under 2 * sqrt(n)) walk by a table up to this many (n up to
# ~2**32); past it (64-bit words), by cycle-walking.
_MAX_WALK_TABLE = 1 << 17
# Up to this many records an exact shuffle makes a table (32 KiB; ~0.1 ms a table): past 128 the
# Feistel network's bias was not found, measured with 40,000 seeds
EXACT_UP_TO = 1 << 12
_EXACT_KEY = 0x5EED0F7AB1E5  # (its numbers drawn apart from the rounds' keys)
_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's step: key + i * step, i-th number
_MUL1, _MUL2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S31, _S29 = np.uint64(31), np.uint64(29)


class _Word(NamedTuple):
    """The words a shuffle computes in, and its round function's constants: a multiply,
    xor-shift, multiply hash (SplitMix64's finaliser in 64 bits, Wellons' lowbias32 in 32)."""

    dtype: type
    mul1: Any
    mul2: Any
    shift1: Any
    shift2: Any
    half: Any  # half the word: the top half of a hash is its best mixed


_WORD64 = _Word(np.uint64, _MUL1, _MUL2, _S31, _S29, np.uint64(32))
# 32-bit words: NumPy vectorises their multiplies (64-bit ones are emulated), ~3.7x faster
_WORD32 = _Word(np.uint32, np.uint32(0x7FEB352D), np.uint32(0x846CA68B), np.uint32(15),
                np.uint32(16), np.uint32(16))


def splitmix64(x: int) -> int:
    """One step of SplitMix64 on a Python int: a cheap, well-mixed 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """``splitmix64`` on an array of ``uint64`` (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= _MUL1
    x ^= x >> np.uint64(27)
    x *= _MUL2
    x ^= x >> _S31
    return x


class IndexShuffle:
    """A keyed bijection of ``[0, n)``, evaluated on arrays of positions.

    ``epoch`` may be an array, one epoch per position given to the call: each position is
    then mapped by its own epoch's bijection, in one vectorised pass (a small component of a
    mixture wraps many times in a few batches).

    Example:
        >>> perm = IndexShuffle(10, seed=0, epoch=0)
        >>> sorted(perm(np.arange(10)).tolist()) == list(range(10))
        True
        >>> later = IndexShuffle(10, seed=0, epoch=1)
        >>> both = IndexShuffle(10, seed=0, epoch=np.array([0, 1]))(np.array([3, 3]))
        >>> both.tolist() == [*perm(np.array([3])), *later(np.array([3]))]
        True
    """

    def __init__(self, n: int, *, seed: int, epoch: int | np.ndarray, tight: bool = False,
                 exact: bool = False) -> None:
        """``tight``: the domain is ``radix * 2**k`` values, ``2**k`` about ``sqrt(n)`` and
        ``radix = ceil(n / 2**k)``, under ``n + sqrt(n)`` (the high digit is mixed modulo
        ``radix``), computed in 32-bit words up to ``n = 2**31``: almost no value lands
        outside ``[0, n)``, against up to 3 in 4 over the even power of two, whose
        cycle-walking took most of a mixture's order; another order than the default's.
        ``exact``: up to ``EXACT_UP_TO`` records, a uniform permutation: records sorted by
        SplitMix64 numbers drawn from ``(seed, epoch)`` (a table an epoch); another order
        again."""
        self.n = n
        self._table: np.ndarray | None = None  # exact: the permutation, made at the first call
        self._exact_key: np.ndarray | None = None  # exact: each epoch's key (one: 0-d)
        if exact and n <= EXACT_UP_TO:
            given = np.asarray(epoch, np.uint64)  # (1-D to hash: NumPy warns of a scalar's
            self._exact_key = splitmix64_array(  # wrapping, not an array's)
                np.uint64(splitmix64(seed ^ _EXACT_KEY)) ^ given.reshape(-1)).reshape(given.shape)
        bits = max(2, int(n - 1).bit_length())
        low = (bits + 1) // 2
        word = self._word = _WORD32 if tight and bits <= 31 else _WORD64
        self._low_bits = word.dtype(low)
        self._low_mask = word.dtype((1 << low) - 1)
        # the high digit's range when tight (else the high half is a mask as wide as the low)
        self._radix = word.dtype(-(-n >> low)) if tight else None
        self.epoch = epoch
        # tight, one epoch: where each value of the domain past n walks to, made at the first
        # walk (see __call__); the domain's excess is under 2 * sqrt(n) values
        self._walked: np.ndarray | None = None
        self._excess = (-(-n >> low) << low) - n if tight else 0  # the domain's values past n
        self._keys: list = []  # a word each round; or an array of them, one per position
        rounds, mask = _TIGHT_ROUNDS if tight else _FEISTEL_ROUNDS, np.iinfo(word.dtype).max
        if self._exact_key is not None:
            return  # (no rounds: a table)
        if np.ndim(epoch) == 0:
            base = splitmix64(splitmix64(seed) ^ int(epoch))
            self._keys = [word.dtype(splitmix64(base + r) & mask) for r in range(rounds)]
        else:  # each distinct epoch's keys, then each position's
            epochs, which = np.unique(np.asarray(epoch, np.uint64), return_inverse=True)
            bases = splitmix64_array(np.uint64(splitmix64(seed)) ^ epochs)
            self._keys = [splitmix64_array(bases + np.uint64(r)).astype(word.dtype)[which]
                          for r in range(rounds)]

    def _permute_domain(self, x: np.ndarray, keys: list) -> np.ndarray:
        # Rounds alternate: the high half takes a hash of the low one, then the reverse (a
        # Feistel network; tight, the high digit is added modulo the radix). In place where
        # NumPy allows: the cycle-walking below calls this on many small arrays, where each
        # temporary costs as much as the arithmetic.
        word, radix, mask = self._word, self._radix, self._low_mask
        high, low = x >> self._low_bits, x & mask
        for r, key in enumerate(keys):
            f = (low if r % 2 == 0 else high) + key  # the round function: a hash cut to
            f *= word.mul1  # the digit's range
            f ^= f >> word.shift1
            f *= word.mul2
            if r % 2 == 1 or radix is None:  # xor a masked hash in (both halves as wide)
                f ^= f >> word.shift2
                f &= mask
                if r % 2 == 1:
                    low ^= f
                else:
                    high ^= f
            else:  # high = (high + f) mod radix, f in [0, radix) from the hash's top half
                f >>= word.half
                f *= radix
                f >>= word.half
                high += f
                np.minimum(high, high - radix, out=high)  # below radix: the subtraction wraps
        high <<= self._low_bits
        high |= low
        return high

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Maps positions (int array, each in ``[0, n)``; as many as epochs when ``epoch``
        is an array) to record indices (int64)."""
        if self.n <= 1:
            return np.asarray(positions, dtype=np.int64).copy()
        if self._exact_key is not None:
            return self._exactly(np.asarray(positions, dtype=np.int64))
        per_position = np.ndim(self.epoch) > 0
        x = self._permute_domain(np.asarray(positions).astype(self._word.dtype), self._keys)
        limit = self._word.dtype(self.n)
        at = np.flatnonzero(x >= limit)
        if len(at) and self._radix is not None and not per_position and (
                self._excess <= _MAX_WALK_TABLE):
            # Tight: the few values past n walk by a table of the excess, made once. Walking
            # them here took ~40% of a read-local chunk's shuffle (8,192 positions, ~40 of them
            # past n: 8 rounds of NumPy calls on a tiny array, each call's cost its overhead).
            x[at] = self._walk_table()[x[at] - limit]
            return x.astype(np.int64)
        while len(at):  # cycle-walking: the domain is < 4n (tight: < n + sqrt(n) + 1)
            keys = [k[at] for k in self._keys] if per_position else self._keys
            walked = self._permute_domain(x[at], keys)
            x[at] = walked
            at = at[walked >= limit]
        return x.astype(np.int64)

    def _exactly(self, positions: np.ndarray) -> np.ndarray:
        """``exact``: each position's record, by its epoch's table (made once, for one epoch;
        for each distinct epoch of an array of them, a row each). The numbers sorted are
        distinct (SplitMix64 is a bijection of 64-bit words, and the key plus ``i`` steps is
        distinct for each ``i``): any sort gives one order."""
        assert self._exact_key is not None
        numbers = np.arange(self.n, dtype=np.uint64) * _GAMMA
        if self._exact_key.ndim == 0:
            if self._table is None:
                self._table = np.argsort(splitmix64_array(numbers + self._exact_key[()]))
            return self._table[positions]
        keys, which = np.unique(self._exact_key, return_inverse=True)
        tables = np.argsort(splitmix64_array(numbers + keys[:, None]), axis=1)
        return tables[which.reshape(-1), positions]

    def _walk_table(self) -> np.ndarray:
        """Tight, one epoch: for each value ``n + k`` of the domain past ``n``, the first value
        under ``n`` that applying the permutation again and again reaches from it: what
        cycle-walking gives it (the same bijection). Made by pointer doubling: after ``t``
        rounds each entry has followed up to ``2**t`` steps, and a walk never takes more
        steps than there are values past ``n``. (A cycle of values all past ``n`` never
        ends; no position below ``n`` walks into one, so those entries are never read.)"""
        if self._walked is None:
            word, n = self._word.dtype, self.n
            excess = self._excess
            walked = self._permute_domain(np.arange(n, n + excess, dtype=word), self._keys)
            for _ in range(excess.bit_length() + 1):
                past = walked >= n
                if not past.any():
                    break
                walked[past] = walked[walked[past] - word(n)]
            self._walked = walked
        return self._walked
