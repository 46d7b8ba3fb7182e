"""The loader's state: plain JSON-serialisable data, checked on restore.

The position is one number, the global step; the rest is the configuration a restore must match
for that step to mean the same batches. Prefetched batches are not part of it: they are
recomputed. Restore is O(1): no replay, no fast-forward.

Example:
    >>> from jaxloader.sampling import Sampler
    >>> s = Sampler(100, 10, shuffle=True, seed=1, last_batch="drop")
    >>> check_state(make_state(s, step=7), s)
    7
"""

from __future__ import annotations

from typing import Any

from jaxloader.errors import StateDictError
from jaxloader.sampling import Sampler

STATE_VERSION = 1
# Keys whose values must equal this loader's for a step to mean the same global batch.
_CHECKED = ("num_records", "global_batch_size", "seed", "shuffle", "last_batch")


def make_state(sampler: Sampler, step: int) -> dict[str, Any]:
    """The state of a loader over ``sampler`` whose next batch is global step ``step``."""
    return {
        "version": STATE_VERSION,
        "step": int(step),
        "num_records": sampler.num_records,
        "global_batch_size": sampler.global_batch_size,
        "seed": sampler.seed,
        "shuffle": sampler.shuffle,
        "last_batch": sampler.last_batch,
        # Informational: a restore may use another split of the same global batch.
        "batch_size": sampler.batch_size,
        "process_count": sampler.process_count,
    }


def check_state(state: Any, sampler: Sampler) -> int:
    """Validates ``state`` against ``sampler``; returns the step to continue from."""
    expected = make_state(sampler, 0)
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
    if state["version"] != STATE_VERSION:
        raise StateDictError(
            f"state['version']: expected {STATE_VERSION}, received {state['version']!r}; this "
            "state was written by another jaxloader version that this one cannot read"
        )
    diffs = [f"{k}: expected {expected[k]!r}, received {state[k]!r}" for k in _CHECKED
             if state[k] != expected[k]]
    if diffs:
        raise StateDictError(
            "state does not fit this loader (" + "; ".join(diffs) + "); restore it into a "
            "loader over the same data with the same seed, shuffle, last_batch and global batch "
            "size (batch_size x process_count)"
        )
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise StateDictError(f"state['step']: expected an int >= 0, received {step!r}")
    return step
