"""The loader's state: plain JSON-serialisable data, checked on restore.

The position is one number, the global step; the rest is the configuration a restore must match
for that step to mean the same batches, and a fingerprint of the source (``fingerprint.py``).
Prefetched batches are not part of it: they are recomputed. Restore is O(1): no replay, no
fast-forward. Every field is checked for its type and range before it is compared, and a state
that does not fit lists what differs.

Example:
    >>> from jaxloader.order.sampling import Sampler
    >>> s = Sampler(100, 10, shuffle=True, seed=1, last_batch="drop")
    >>> fp = {"record_spec": "['x']: int64()", "record_hash": "00"}
    >>> check_state(make_state(s, 7, fp), s, fp)
    7
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from jaxloader.base import file_identity
from jaxloader.base.checks import EPOCH_LIMIT, MASK64, check_int
from jaxloader.base.errors import StateDictError
from jaxloader.order.sampling import LAST_BATCH_POLICIES, Order

STATE_VERSION = 1
# Keys whose values must equal this loader's for a step to mean the same global batch.
_CHECKED = ("num_records", "global_batch_size", "seed", "shuffle", "last_batch")
# Fingerprint keys: compared when both the state and the loader have them (states written
# before fingerprints existed have none).
_FINGERPRINT = ("source", "record_spec", "record_hash")


def make_state(sampler: Order, step: int, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The state of a loader over ``sampler`` whose next batch is global step ``step``;
    ``fingerprint``: the source's (``jaxloader.sources.fingerprint``), with ``"files"`` (each file's
    identity, ``file_identity``) for a source of files."""
    state = {
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
    if "files" in state:  # the state's own lists: changing one leaves the loader's alone
        state["files"] = [list(identity) for identity in state["files"]]
    return state


def _int(low: int, high: int | None = None) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        check_int(name, value, low=low, high=high, error=StateDictError,
                  remedy="pass the dict that DataLoader.state_dict() returned, unchanged")
    return check


def _identities(name: str, value: Any) -> None:
    if not isinstance(value, list) or any(
            not isinstance(v, list) or any(type(x) is not int or x < 0 for x in v)
            for v in value):
        raise StateDictError(
            f"{name}: expected a list of file identities (lists of non-negative ints), "
            f"received {value!r:.120}; pass the dict that DataLoader.state_dict() returned, "
            "unchanged")


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
    "files": _identities,
}


def check_state(state: Any, sampler: Order, fingerprint: dict[str, Any],
                paths: Sequence[str] = ()) -> int:
    """Validates ``state`` against ``sampler`` and the source's ``fingerprint`` (``paths``:
    the files its ``"files"`` are the identities of, to name one that changed); returns the
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
    _check_files(state.get("files"), expected.get("files"), paths)
    epochs = state["step"] // sampler.steps_per_epoch
    if epochs >= EPOCH_LIMIT:
        raise StateDictError(
            f"state['step']: {state['step']:,} is past any step this loader reaches: epoch "
            f"{epochs:,} of {sampler.steps_per_epoch:,} steps, where epochs stop at "
            f"{EPOCH_LIMIT:,} (a record's random numbers are keyed by its epoch and position "
            "in 64 bits); pass the dict that DataLoader.state_dict() returned, unchanged")
    sampler.check_extra_state(state, state["step"])
    refuse_unknown(state, expected, "DataLoader")
    return state["step"]


def refuse_unknown(state: dict, expected: Any, loader: str) -> None:
    """Refuses keys of ``state`` that are not among ``expected``'s, naming them (checked last:
    a state of another configuration is named by what differs, not by its extra keys)."""
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise StateDictError(
            f"state: unknown keys {unknown}; expected keys {sorted(expected)}: a state edited by "
            f"hand, or another kind of loader's; pass the dict that {loader}.state_dict() "
            "returned, unchanged")


def _check_files(then: Any, now: Any, paths: Sequence[str]) -> None:
    """Refuses a state saved over other bytes than the source's files hold now, naming the
    files that changed (a state's ``"files"`` and the source's, the paths equal)."""
    if then == now:
        return
    if then is None or now is None or len(then) != len(now):
        raise StateDictError(
            f"state['files']: expected the identities of the source's {len(now or ())} files "
            f"(state_dict() records them), received {'none' if then is None else len(then)}: "
            "a state edited by hand or saved by another jaxloader version; restore a state "
            "this version saved over the same files")
    changed = [f"{paths[i] if i < len(paths) else f'file {i}'}: "
               f"{file_identity.change(a, b)}" for i, (a, b) in enumerate(zip(then, now))
               if a != b]
    raise StateDictError(
        f"state['files']: {len(changed)} of the source's {len(now)} files changed since the "
        f"state was saved ({'; '.join(changed[:3])}{'; ...' if len(changed) > 3 else ''}): "
        "the saved step would read other records than it named; restore over the files as "
        "they were (put them back), or start the run again without this state")
