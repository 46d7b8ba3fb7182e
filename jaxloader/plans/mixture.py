"""Weighted mixtures: which component each position reads, as a pure function of counts.

::

    global position P = step * G + process_index * B + row          (G = B * process_count)
      block k = P // K              (K: the largest divisor of G up to 1,024 positions)
      per block: n_c slots for component c, from the weights        (cumulative, exact)
      component c: slots [f_c, f_c + n_c) of the block, in turn
      slot s ─> position permutation_k(s) of the block; its read j = C_c(k) + s - f_c
                       (C_c(k): component c's positions before block k, closed form); where
                       blocks span batches (K does not divide G), c's reads go to c's
                       positions in the block in order: j = C_c(k) + its rank among them
      record = shuffle(seed_c, j // len_c)(j % len_c)                 (c's own epochs)

Each block of ``K`` positions holds each component's share of the weights exactly (up to
rounding by one), spread over the block by a keyed permutation: any window of 10,000 positions
is within a fraction of a percent of the weights, and nothing depends on what was read before.
A component's reads in a block are a run, so a span of blocks is laid out one component at a
time, with no search; a step holds whole blocks, so a worker lays out only its own steps'.
Component ``c`` reads its records in its own reshuffled epochs (a Feistel network over a
domain just above its length: ``IndexShuffle(tight=True)``), or with ``shuffle=LocalShuffle``
read-locally (``BlockOrder`` over its own blocks, keyed by its seed: its consecutive reads stay
in a window of blocks), so a small component wraps (and is reshuffled) more often than a large
one. A weight change from step ``s`` takes effect from
the first block that starts at or after step ``s``'s first position; ``C_c(k)`` is summed over
the schedule's regimes, so the batches of every earlier step stay what they were. Everything
is computed per batch from the step: resume is O(1) and elastic, as for a single source.
The layout is part of what the state's version names.

The plan is pure NumPy over counts: ``batching.mixture_sampler`` turns it into a source
mixture's indices, ``streams.mixed`` into which component each of a reader's records comes
from.

Example:
    >>> regimes = plan_regimes([(0, normalised([3, 1], 2, "weights"))], block_size(1024, 2))
    >>> regime_counts(regimes, np.array([3]))[1].tolist()  # block 3: 768 and 256 positions
    [[768, 256]]
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Sequence, Union

import numpy as np

from jaxloader.base.difference import differ
from jaxloader.base.errors import ConfigError, StateDictError

# A component's weights: one number each, in the components' order, or by name
Weights = Union[Sequence[float], Mapping[str, float], np.ndarray]

BLOCK = 1024  # positions a block at most (see block_size)


def block_size(global_batch: int, components: int) -> int:
    """Positions a block: the largest divisor of the global batch up to 1,024, so that a step
    holds whole blocks and a worker lays out only its own steps' blocks; at least
    ``m * (m - 1)`` for ``m`` components (see ``Regime``). Without such a divisor, 1,024."""
    least = components * (components - 1)
    for size in range(min(BLOCK, global_batch), max(least, 1) - 1, -1):
        if global_batch % size == 0:
            return size
    return max(BLOCK, least)


def normalised(weights: Weights, count: int, name: str, names: list[str] | None = None,
               owner: str = "mix") -> np.ndarray:
    if isinstance(weights, Mapping):
        if names is None:
            raise ConfigError(
                f"{owner}({name}): weights by name ({sorted(map(str, weights))}) need sources by "
                "name: pass the sources as a dict with those keys, or the weights as a list "
                "in the sources' order")
        if set(weights) != set(names):
            raise ConfigError(
                f"{owner}({name}): expected a weight for each source by name {names}, got "
                f"{list(weights)} (missing {[n for n in names if n not in weights]}, unknown "
                f"{[n for n in weights if n not in names]})")
        weights = [weights[n] for n in names]
    given = np.asarray(weights, dtype=object)  # (what was given, to check each is a number)
    if given.ndim != 1 or not all(isinstance(v, numbers.Real)
                                  and not isinstance(v, (bool, np.bool_)) for v in given):
        raise ConfigError(
            f"{owner}({name}): expected one number per source ({count}), got "
            f"{type(weights).__name__} {weights!r:.80}")
    w = given.astype(np.float64)
    if w.shape != (count,):
        raise ConfigError(
            f"{owner}({name}): expected one weight per source ({count}), got {len(w)}: {w.tolist()}"
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ConfigError(f"{owner}({name}): weights must be finite and >= 0, got {w.tolist()}")
    if not w.any():
        raise ConfigError(f"{owner}({name}): weights sum to zero ({w.tolist()}); give one a weight "
                          "> 0")
    with np.errstate(over="ignore"):  # (weights of 1e308 sum to inf, handled below: not
        total = w.sum()  # NumPy's overflow warning)
    if not np.isfinite(total):  # (they once summed to inf, then "sum to zero"; scaled only
        w = w / np.max(w)  # then: other weights' values stay as they were, bit for bit)
    return w / w.sum()


class Regime:
    """Weights in force from block ``start``; ``before`` = each component's positions before."""

    def __init__(self, start: int, weights: np.ndarray, before: np.ndarray, block: int) -> None:
        self.start, self.weights, self.before, self.block = start, weights, before, block
        self.remainder = int(np.argmax(weights))  # takes what rounding leaves: never negative

    def counts(self, blocks: Any) -> np.ndarray:
        """Each component's positions in this regime's first ``blocks`` blocks (an int, or an
        array of them: one row each)."""
        total = np.asarray(blocks, np.int64) * self.block
        n = np.floor(total[..., None] * self.weights).astype(np.int64)
        n[..., self.remainder] = 0
        n[..., self.remainder] = total - n.sum(axis=-1)
        return n


def plan_regimes(starts: list[tuple[int, np.ndarray]], block: int) -> list[Regime]:
    """The regimes of ``(first block, weights)`` pairs in step order, each with the positions
    of each component before it; two changes in one block: the later one wins."""
    regimes: list[Regime] = []
    for start, weights in starts:
        if regimes:
            last = regimes[-1]
            if start <= last.start:
                regimes.pop()
                before, start = last.before, last.start
            else:
                before = last.before + last.counts(start - last.start)
        else:
            before = np.zeros(len(weights), np.int64)
        regimes.append(Regime(start, weights, before, block))
    return regimes


def regime_counts(regimes: list[Regime], blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each component's positions before each of ``blocks``, and in it (the regimes in
    force)."""
    m = len(regimes[0].weights)
    before = np.empty((len(blocks), m), np.int64)
    here = np.empty_like(before)
    starts = np.array([r.start for r in regimes])
    which = np.searchsorted(starts, blocks, side="right") - 1
    for r in np.unique(which):
        regime, at = regimes[r], which == r
        done = regime.counts(blocks[at] - regime.start)
        before[at] = regime.before + done
        here[at] = regime.counts(blocks[at] - regime.start + 1) - done
    return before, here


def first_block_with(regimes: list[Regime], components: np.ndarray, block: int,
                     size: int) -> int | None:
    """The first block from ``block`` on with a position of one of ``components`` (a bool
    mask), found from the positions before each block (which never decrease) by doubling the
    distance, then halving it: a component of weight 1e-6 has a position every ~10**6 /
    ``size`` blocks, too many to lay out in turn. ``None`` where there is none before the
    counts' range ends (a weight too small to ever have one).

    Example:
        >>> regimes = plan_regimes([(0, np.array([1 - 1e-6, 1e-6]))], 4)
        >>> first_block_with(regimes, np.array([False, True]), 0, 4)
        249999
    """
    def before(q: int) -> int:
        return int(regime_counts(regimes, np.array([q]))[0][0][components].sum())

    base, end = before(block), np.iinfo(np.int64).max // size // 2
    low, high, step = block, block + 1, 1  # before(low) == base; the block is in [low, high)
    while before(high) == base:  # once before(high) > base
        if high >= end:
            return None
        low, step = high, step * 2
        high = min(block + step, end)
    while high - low > 1:
        middle = (low + high) // 2
        if before(middle) == base:
            low = middle
        else:
            high = middle
    return low


def _is_real(x: Any) -> bool:
    """A number as a state holds one: an int or a float (NumPy's too), not a bool."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(
        x, (bool, np.bool_))


def check_weights_before(schedule: dict[int, Any], saved: Any, step: int) -> None:
    """Refuses a state's weights (``saved``: ``[[step, weights], ...]``) that differ from
    ``schedule``'s before ``step``: those steps were read with them."""
    if not isinstance(saved, list) or not all(
            isinstance(e, (list, tuple)) and len(e) == 2 for e in saved):
        raise StateDictError(
            "state['mixture']: expected the mixture's weights ([[step, weights], ...]), "
            f"received {saved!r:.200}; this state is not from a loader over a mixture"
        )
    for i, (at, weights) in enumerate(saved):
        if not (_is_real(at) and isinstance(at, (int, np.integer)) and at >= 0 and isinstance(
                weights, (list, tuple)) and weights and all(_is_real(x) for x in weights)):
            raise StateDictError(
                f"state['mixture'][{i}]: expected [step (an int >= 0), [a weight (a number) "
                f"for each component]], received {[at, weights]!r:.200}; pass the dict that "
                "state_dict() returned, unchanged")
    ours = {s: [float(x) for x in w] for s, w in schedule.items() if s < step}
    theirs = {int(s): [float(x) for x in w] for s, w in saved if s < step}
    if ours == theirs:  # bit for bit: a block's share is floored from them, so weights one
        return  # ulp apart ([6, 7, 7] and [0.3, 0.35, 0.35], normalised) lay out other steps
    if ours.keys() == theirs.keys() and all(
            len(ours[s]) == len(theirs[s]) and all(
                math.isclose(a, b, rel_tol=2.5e-7) for a, b in zip(ours[s], theirs[s]))
            for s in ours):  # (float32's rounding, normalised, within 2.5e-7)
        raise StateDictError(
            differ(f"state['mixture']: the weights before step {step} are the state's only to "
                   "their last digits", sorted(ours.items()), sorted(theirs.items()))
            + " (normalised: each divided by their sum); each block's share is rounded down "
            "from them, so the steps after would read other components than the run that "
            "saved it; write the weights as that run did, of the same type ([6, 7, 7] and "
            "[0.3, 0.35, 0.35] normalise to numbers one rounding apart; float32 weights, a "
            "NumPy config's, hold 0.7 as 0.699999988, Python's float as 0.7)")
    raise StateDictError(
        differ(f"state['mixture']: the weights before step {step} differ", sorted(ours.items()),
               sorted(theirs.items())) + "; a restore may add weight changes at or after the "
        "step it resumes from, never change earlier ones")
