"""What a mixture's layout is warned of as its sampler is made: batches that do not hold each
component's share (``loose_batches``), components no weight ever reads (``idle_components``),
weight changes that start past their step (``late_changes``), and blocks so large that their
order costs seconds and memory (``large_blocks``: thousands of components).

Example:
    >>> large_blocks(1_000, 32, 999_000)
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from jaxloader.base.errors import JaxloaderWarning, PerformanceWarning, user_stacklevel

KEPT_BLOCK = 1 << 25  # positions of a block whose order (int64s) a sampler keeps whole, at most


def large_blocks(m: int, global_batch: int, block: int) -> None:
    """Warns where a mixture of ``m`` components lays its positions out in blocks too large to
    keep: each block's order is then made whole again every span of steps (a stall of
    seconds, every 1,024 steps at batch 32, 1.6 GB at 10,000 components)."""
    if block <= KEPT_BLOCK:
        return
    warnings.warn(
        f"mix(): {m:,} components lay the positions out in blocks of {block:,} (m * (m - 1), "
        f"for each batch to hold each one's share), whose order, made whole, takes "
        f"{block * 8 * 2 / 2**30:.1f} GiB and seconds, again every {32_768 // global_batch:,} "
        "steps in each process: mix fewer components (a ConcatSource of alike episodes or "
        "shards as one component, weighted by their sum), or read them as one source "
        "(ConcatSource, shuffled)", PerformanceWarning, stacklevel=user_stacklevel())


def loose_batches(mixture: Any, global_batch: int, block: int) -> None:
    """Warns where a batch does not hold each component's share (a global batch under
    ``m * (m - 1)``: positions laid out in blocks of 1,024, a batch a part of one), and where
    a component is smaller than its share of a batch (each batch then holds some of its
    records twice): class-balanced batches, in-batch negatives."""
    m = len(mixture.sources)
    if global_batch < block:  # (a larger one spans whole blocks: each share within a few)
        warnings.warn(
            f"mix: a batch of this loader does not hold each of the {m} components' share: "
            f"positions are laid out in blocks of {block:,} (each holds every component's "
            f"share; with {m} components a block holds at least {m * (m - 1)}, more than a "
            f"global batch of {global_batch}), and a batch takes its {global_batch} from one, "
            "so it may hold fewer or none of a component; a global batch that is a multiple "
            f"of {m * (m - 1)} holds each one's share (class-balanced batches)",
            JaxloaderWarning, stacklevel=5)
    lengths, names = np.diff(mixture.offsets), getattr(mixture, "names", None)
    for step, weights in sorted(mixture.schedule.items()):
        over = [c for c in range(m) if weights[c] * global_batch > lengths[c]]
        if over:
            c = over[0]
            warnings.warn(
                f"mix: component {repr(names[c]) if names else c} holds {lengths[c]} records, fewer "
                f"than its share of a global batch of {global_batch} (weight {weights[c]:.3g}"
                f"{f', from step {step}' if step else ''}): every batch holds some of them "
                "twice (an in-batch negative that is the record itself); give it more records, "
                "or a smaller weight", JaxloaderWarning, stacklevel=5)
            return


def idle_components(mixture: Any) -> None:
    """Warns of a component of weight 0 at step 0 (one to weigh in later, or never): its
    records count in the loader's epoch, the components' lengths summed, so an epoch reads
    the others' records several times each, and ``num_epochs=1`` and ``len(loader)`` with it
    (asked of a loader whose passes end: one trained by steps is as it should be)."""
    lengths, names = np.diff(mixture.offsets), getattr(mixture, "names", None)
    weights = sorted(mixture.schedule.items())
    idle = [c for c in range(len(lengths)) if weights[0][1][c] == 0]
    if not idle:
        return
    c, total = idle[0], int(lengths.sum())
    later = next((step for step, w in weights if w[c] > 0), None)
    read = int(sum(n for n, w in zip(lengths, weights[0][1]) if w > 0))
    warnings.warn(
        f"mix: component {repr(names[c]) if names else c} has weight 0 "
        f"{f'until step {later}' if later else 'at every step'}, but its {lengths[c]:,} records "
        f"count in the loader's epoch, the components' lengths summed ({total:,} records): "
        f"while its weight is 0, the epoch's steps read the other {read:,} records, each "
        f"{total / read:.3g} times an epoch (num_epochs=1 and len(loader) count them too); "
        "train by steps (num_epochs=None and a step count), or leave it out of the mixture "
        "(a state then restores only into a mixture without it)",
        JaxloaderWarning, stacklevel=user_stacklevel())


def late_changes(firsts: dict[int, int], global_batch: int, block: int, m: int) -> None:
    """Warns of each weight change that starts after its step: ``firsts``, each change's step
    and the first block it is in force from (the plan's, laid out in blocks of ``block``)."""
    in_block: dict[int, list[int]] = {}  # a block's changes, in order (one pass: a schedule
    for step in sorted(firsts):  # of 10,000 changes took 8 s as a loop over all of them each)
        in_block.setdefault(firsts[step], []).append(step)
    for step in sorted(firsts):
        first = firsts[step] * block  # the change's first position
        later = [s for s in in_block[firsts[step]] if s > step]
        if later:  # (plans.mixture.plan_regimes: two changes in one block, the later wins)
            warnings.warn(
                f"mix(from_step={{{step}: ...}}): these weights are never used: the change at "
                f"step {max(later)} starts in the same block of {block:,} positions (from "
                f"position {first:,}) and replaces them; with {m} components a global batch "
                f"that is a multiple of {m * (m - 1)} starts each change at its step",
                JaxloaderWarning,
                stacklevel=5)
        elif first != step * global_batch:
            where = (f"step {first // global_batch:,}" if first % global_batch == 0 else
                     f"position {first:,}, inside step {first // global_batch:,}")
            warnings.warn(
                f"mix(from_step={{{step}: ...}}): the weights change from {where}, not at step "
                f"{step}: with {m} components, positions are laid out in blocks "
                f"of {block:,} (a block holds each one's share; a global batch of "
                f"{global_batch} has no divisor of at least {m * (m - 1)} up to 1,024); a global "
                f"batch that is a multiple of {m * (m - 1)} starts each change at its step",
                JaxloaderWarning,
                stacklevel=5)
