"""The loader's state: plain JSON-serialisable data, checked on restore.

The position is one number, the global step; the rest is the configuration a restore must match
for that step to mean the same batches, and a fingerprint of the source (``fingerprint.py``).
Prefetched batches are not part of it: they are recomputed. Restore is O(1): no replay, no
fast-forward. Every field is checked for its type and range before it is compared, and a state
that does not fit lists what differs.

Example:
    >>> from jaxloader.sampling import Sampler
    >>> s = Sampler(100, 10, shuffle=True, seed=1, last_batch="drop")
    >>> fp = {"record_spec": "['x']: int64()", "record_hash": "00"}
    >>> check_state(make_state(s, 7, fp), s, fp)
    7
"""

from __future__ import annotations

from typing import Any, Callable

from jaxloader.checks import MASK64, check_int
from jaxloader.errors import StateDictError
from jaxloader.sampling import LAST_BATCH_POLICIES, Order

STATE_VERSION = 1
# Keys whose values must equal this loader's for a step to mean the same global batch.
_CHECKED = ("num_records", "global_batch_size", "seed", "shuffle", "last_batch")
# Fingerprint keys: compared when both the state and the loader have them (states written
# before fingerprints existed have none).
_FINGERPRINT = ("source", "record_spec", "record_hash")


def make_state(sampler: Order, step: int, fingerprint: dict[str, str]) -> dict[str, Any]:
    """The state of a loader over ``sampler`` whose next batch is global step ``step``."""
    return {
        "version": STATE_VERSION,
        "step": int(step),
        "num_records": sampler.num_records,
        "global_batch_size": sampler.global_batch_size,
        "seed": sampler.seed,
        "shuffle": sampler.shuffle,
        "last_batch": sampler.last_batch,
        **fingerprint,
        **sampler.extra_state(),  # a mixture's weights
        # Informational: a restore may use another split of the same global batch.
        "batch_size": sampler.batch_size,
        "process_count": sampler.process_count,
    }


def _int(low: int, high: int | None = None) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        check_int(name, value, low=low, high=high, error=StateDictError,
                  remedy="pass the dict that DataLoader.state_dict() returned, unchanged")
    return check


def _of_type(kind: type, choices: tuple = ()) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if type(value) is not kind or (choices and value not in choices):
            want = f"one of {choices}" if choices else f"a {kind.__name__}"
            raise StateDictError(
                f"{name}: expected {want}, received {type(value).__name__} {value!r}; pass the "
                "dict that DataLoader.state_dict() returned, unchanged"
            )
    return check


_FIELDS: dict[str, Callable[[str, Any], None]] = {
    "version": _int(1),
    "step": _int(0),
    "num_records": _int(1),
    "global_batch_size": _int(1),
    "seed": _int(0, MASK64),
    "shuffle": _of_type(bool),
    "last_batch": _of_type(str, LAST_BATCH_POLICIES),
    "batch_size": _int(1),
    "process_count": _int(1),
    **{key: _of_type(str) for key in _FINGERPRINT},
}


def check_state(state: Any, sampler: Order, fingerprint: dict[str, str]) -> int:
    """Validates ``state`` against ``sampler`` and the source's ``fingerprint``; returns the
    step to continue from."""
    expected = make_state(sampler, 0, fingerprint)
    if not isinstance(state, dict):
        raise StateDictError(
            f"state: expected a dict from DataLoader.state_dict(), got {type(state).__name__}"
        )
    missing = sorted(set(("version", "step", *_CHECKED)) - set(state))
    if missing:
        raise StateDictError(
            f"state: missing keys {missing}; expected keys {sorted(expected)}, received "
            f"{sorted(state)}; pass the dict that DataLoader.state_dict() returned"
        )
    for key, check in _FIELDS.items():
        if key in state:
            check(f"state[{key!r}]", state[key])
    if state["version"] != STATE_VERSION:
        raise StateDictError(
            f"state['version']: expected {STATE_VERSION}, received {state['version']!r}; this "
            "state was written by another jaxloader version that this one cannot read"
        )
    fingerprinted = any(k in state for k in _FINGERPRINT)  # older states have no fingerprint
    compared = [*_CHECKED, *(k for k in _FINGERPRINT
                             if fingerprinted and (k in state or k in expected))]
    diffs = [f"{k}: expected {expected.get(k)!r}, received {state.get(k)!r}" for k in compared
             if state.get(k) != expected.get(k)]
    if diffs:
        raise StateDictError(
            "state does not fit this loader (" + "; ".join(diffs) + "); restore it into a "
            "loader over the same data with the same seed, shuffle, last_batch and global batch "
            "size (batch_size x process_count)"
        )
    sampler.check_extra_state(state, state["step"])
    return state["step"]
