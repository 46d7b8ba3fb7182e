"""The order a DataLoader reads its source's records in: a mixture's own, a read-local one
(``LocalShuffle``), or the full one (``Sampler``), from the loader's checked arguments.

Example:
    >>> order = sampler_for(list(range(10)), 10, 4, shuffle=False, seed=0, last_batch="drop",
    ...                     process_index=0, process_count=1, num_workers=0)
    >>> order.steps_per_epoch
    2
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from jaxloader.base.checks import MASK64, Int, check_int
from jaxloader.base.errors import ConfigError, JaxloaderWarning, user_stacklevel
from jaxloader.batching.mixture_layout import idle_components
from jaxloader.batching.mixture_sampler import MixtureSampler
from jaxloader.order.local_shuffle import BlockOrder, LocalShuffle, blocks_layout, exact_blocks
from jaxloader.order.sampling import Order, Sampler
from jaxloader.sources.mixture import Mixture


def sampler_for(source: Any, num_records: int, batch_size: int, *,
                shuffle: bool | np.bool_ | LocalShuffle, seed: Int, last_batch: str,
                process_index: int, process_count: int,
                num_workers: int, rows: np.ndarray | None = None, ends: bool = False) -> Order:
    """The order of ``source``'s records: a mixture's own, a read-local one, or the full one
    (a mixture's idle components warned of where its passes ``end``: ``num_epochs``)."""
    seed = check_int("seed", seed, low=0, high=MASK64, remedy="use a seed in [0, 2**64)")
    if not (shuffle is None or isinstance(shuffle, (bool, np.bool_, LocalShuffle))):
        raise ConfigError(
            f"shuffle: expected True, False or jl.LocalShuffle(window=...), got "
            f"{type(shuffle).__name__} {shuffle!r}; True shuffles every record, LocalShuffle "
            "reads blocks of neighbours (files)")
    if isinstance(source, Mixture):  # each component in its own order (LocalShuffle too)
        mixed = MixtureSampler(source, batch_size, seed=seed,
                               shuffle=shuffle if isinstance(shuffle, LocalShuffle) else bool(
                                   shuffle),
                               last_batch=last_batch, process_index=process_index,
                               process_count=process_count, memo_stride=max(1, num_workers),
                               rows=rows)
        if ends:
            idle_components(source)
        return mixed
    order, described = None, None
    if isinstance(shuffle, LocalShuffle):
        starts = shuffle.block_starts(source, num_records)
        order = functools.partial(BlockOrder, starts, window=shuffle.window, seed=seed)
        described = shuffle.describe(source)
    try:
        sampler = Sampler(num_records, batch_size, shuffle=bool(shuffle), seed=seed,
                          last_batch=last_batch, process_index=process_index,
                          process_count=process_count, order=order,
                          order_description=described, memo_stride=max(1, num_workers),
                          rows=rows)
    except ConfigError as e:  # (fewer records than a batch: a list of whole arrays?)
        if last_batch != "drop" or num_records >= batch_size * process_count or not (
                whole_arrays(source)):
            raise
        raise ConfigError(
            f"{e}; a list of a few arrays (DataLoader([X, y])) is that many records, each a "
            "whole array: for their rows as records, pass jaxloader.ArraySource((X, y))"
        ) from None
    if isinstance(shuffle, LocalShuffle):
        sampler.layout = blocks_layout([starts])
        sampler.exact_blocks = exact_blocks(starts)
    return sampler


def unread_records(order: Order, source: Any, last_batch: str, shuffle: Any,
                   num_epochs: Int | None) -> None:
    """Warns of records a loader of ``order`` over ``source`` never reads, or reads in another
    pass: a short last batch dropped in order (an evaluation loader lost them), or a
    mixture's last positions of an epoch, which run on into the next pass (its batches are
    whole: an evaluation over a mixture read other records each pass)."""
    n, size = order.num_records, order.global_batch_size
    dropped = n % size
    if last_batch == "drop" and dropped and not shuffle and not isinstance(source, Mixture):
        warnings.warn(  # (PyTorch's default keeps them)
            f"DataLoader(last_batch='drop', shuffle=False): the last {dropped} of the {n} "
            "records are never read, in any epoch (each drops the same short last batch); pass "
            "last_batch='pad' (every record, a mask on the padding rows: an evaluation's)" + (
                "" if size > order.batch_size else " or 'partial'") + " to read them, or "
            "shuffle=True (each epoch drops others)", JaxloaderWarning,
            stacklevel=user_stacklevel())
    if last_batch != "drop" and dropped and num_epochs is not None and isinstance(
            source, Mixture):
        warnings.warn(
            f"DataLoader(mix(...), last_batch={last_batch!r}, num_epochs={num_epochs}): a "
            f"mixture's batches are all full, so an epoch's steps read {n - dropped} of its {n} "
            f"positions and the last {dropped} run on into the next epoch: a pass of "
            f"{num_epochs} epoch(s) reads other records each time, and not every record once; "
            "for an evaluation over every record, pass jl.ConcatSource([...]) of the parts with "
            "last_batch='pad' (a mask on the padding rows)", JaxloaderWarning,
            stacklevel=user_stacklevel())


def whole_arrays(source: Any) -> bool:
    """Whether ``source`` is a list of a few arrays of one number of rows and several shapes
    (PyTorch's ``TensorDataset(X, y)`` written as a list): records each a whole array, likely
    meant as columns (arrays of one shape are likely records: images).

    Example:
        >>> whole_arrays([np.zeros((20, 2)), np.arange(20)]), whole_arrays([np.zeros(2)] * 3)
        (True, False)
    """
    if not isinstance(source, list) or not 2 <= len(source) <= 64:
        return False
    shapes: list[Any] = [getattr(a, "shape", None) for a in source]
    return all(isinstance(s, tuple) and s for s in shapes) and len(
        {s[0] for s in shapes}) == 1 and len(set(shapes)) > 1
