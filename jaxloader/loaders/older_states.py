"""States that earlier jaxloader versions wrote otherwise, read as this version writes them
(the same position, the same records), or refused naming what differs: a stream's shard
names before 2026-11-29, a ``PackedStream``'s without its ``tokenize``, a mixture's order
named until 2026-11-27.

Example:
    >>> as_written_now({"stream": {"mix": [], "mixture_order": 1}}, {"mix": []}, lambda: None)
    {'stream': {'mix': []}}
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from jaxloader.base.abilities import DIGEST_LEVELS, in_older_forms
from jaxloader.base.checks import check_bounded, refuse_arrays
from jaxloader.base.errors import JaxloaderWarning, StateDictError, user_stacklevel


def as_written_now(state: Any, described: Any, describe: Callable[[], Any]) -> Any:
    """A stream state with its stream's description as this version writes it (``described``)
    where an older one wrote it otherwise: its functions' digests until 2026-11-30 (their
    defaults left out: ``OLDER_DIGESTS``), its shards' names before 2026-11-29 (``describe``
    under ``OLDER`` generation 1), or a ``PackedStream``'s without its ``tokenize`` (before
    2026-11-29's twenty-second session: that state's tokenizer is not known, nor checked; a
    warning says so), or a mixture's with its ``mixture_order`` (until 2026-11-27). Other
    states as they are."""
    check_bounded(state, "StreamLoader")  # (first: the comparisons below recurse)
    for key in ("stream", "generators", "transforms"):  # (before any ==: an array's is ambiguous)
        refuse_arrays(state.get(key) if isinstance(state, dict) else None, f"state[{key!r}]")
    if not isinstance(state, dict) or state.get("stream") == described:
        return state
    saved = _without_mixture_order(state.get("stream"), "state['stream']")
    if saved is not state.get("stream"):
        state = {**state, "stream": saved}
    for then in [described, *in_older_forms(describe)[:DIGEST_LEVELS + 1]]:
        if saved == then or saved == _untokenized(then):
            if saved != then and _tokenized(then):
                warnings.warn(
                    "a PackedStream's tokenize is checked by a state since 2026-11-29; this "
                    "state is older, and is restored without checking it: restore under the "
                    "saved run's tokenize, or the batches differ from that run's", JaxloaderWarning,
                    stacklevel=user_stacklevel())
            return {**state, "stream": described}
    return state


def _without_mixture_order(described: Any, name: str) -> Any:
    """A stream's description without the ``mixture_order`` (1) of its mixtures, at any
    depth (a ``PackedStream`` over a mixture held it inside); the same object if none."""
    if not isinstance(described, dict):
        return described
    out = {key: _without_mixture_order(value, f"{name}[{key!r}]")
           for key, value in described.items() if key != "mixture_order"}
    if "mixture_order" in described:
        check_mixture_order(described["mixture_order"], 1, f"{name}['mixture_order']")
    elif all(out[key] is described[key] for key in out):
        return described
    return out


def check_mixture_order(order: Any, now: int, name: str) -> None:
    """A mixture's state written until 2026-11-27 named the order of its reads (``now``: the
    order this version reads, the same records at each step); refused if another."""
    if order != now:
        raise StateDictError(
            f"{name}: expected {now} (or none), received {order!r:.40}: a state of an earlier "
            "jaxloader, whose mixture read other records at each step than this version's; "
            "restore it with the jaxloader that saved it")


def _untokenized(described: Any) -> Any:
    """A stream's description without its ``PackedStream``s' ``tokenize`` digests."""
    if isinstance(described, list):
        return [_untokenized(d) for d in described]
    if isinstance(described, dict):
        return {k: _untokenized(v) for k, v in described.items() if k != "tokenize"}
    return described


def _tokenized(described: Any) -> bool:
    """Whether a stream's description names a ``PackedStream``'s ``tokenize`` (not ``None``)."""
    if isinstance(described, list):
        return any(map(_tokenized, described))
    return isinstance(described, dict) and (described.get("tokenize") is not None or any(
        map(_tokenized, described.values())))
