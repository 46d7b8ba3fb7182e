"""Where NumPy's, Python's and (once imported) PyTorch's global random generators are
(``draws``): a draw moves them, so a function that drew from them, where the loader's numbers
were meant, is found by asking before and after it (``batching.global_draws`` watches
transforms so, ``sources.mapped`` its function). PyTorch's is torchvision's transforms' (a
``RandomCrop`` draws there): watched where the user's code has imported torch, never imported
here.

Example:
    >>> before = draws()
    >>> _ = np.random.random()
    >>> draws() != before
    True
"""

from __future__ import annotations

import inspect
import random
import sys
import warnings
from typing import Any

import numpy as np

from jaxloader.base.errors import JaxloaderWarning


def draws() -> tuple | None:
    """Where NumPy's, Python's and PyTorch's global generators are (a draw moves them);
    ``None`` where that cannot be asked."""
    try:
        numpy = np.random.get_state(legacy=False)  # (a dict for every bit generator, with
        python = random.getstate()  # the legacy Gaussian that every other normal() takes)
        torch = sys.modules.get("torch")
        torch_state = None if torch is None or not hasattr(torch, "get_rng_state") else \
            TorchState(torch.initial_seed(), torch.get_rng_state())
    except Exception:  # noqa: BLE001 - (a watch only: nothing to say then)
        return None
    return brief(numpy), python[1][0], python[1][-1], python[2], torch_state


class TorchState:
    """Where a PyTorch generator is: equal to another of the same seed only where no draw
    came between, and to any of another seed (``torch.manual_seed`` from the record, or from a
    ``RandomMap``'s rng, is the remedy, not a draw to warn of)."""

    def __init__(self, seed: int, state: Any) -> None:
        self.seed, self.state = seed, bytes(state.numpy())

    def __eq__(self, other: object) -> bool:
        return not isinstance(other, TorchState) or self.seed != other.seed or \
            self.state == other.state

    __hash__ = None  # type: ignore[assignment]  # (compared, never a key)


def global_examples() -> str:
    """The global generators' calls a message names: PyTorch's where it is imported."""
    return "np.random.randint, random.random, " + (
        "torch.rand, a torchvision random transform, " if "torch" in sys.modules else "") + "..."


def brief(value: Any) -> Any:
    """A state's values, an array by its size and ends (MT19937's position moves each draw,
    its key each 624)."""
    if isinstance(value, dict):
        return tuple((key, brief(item)) for key, item in value.items())
    if isinstance(value, np.ndarray):
        return (value.size, value.flat[0].item(), value.flat[-1].item()) if value.size else ()
    return value


def warn_at(fn: Any, text: str, default: str) -> None:
    """Warns ``text`` at the line of ``fn``'s code (a partial's function's; a worker has no
    frame of the user's, and the relay says it there), or at ``default`` where it has none."""
    fn = inspect.unwrap(getattr(fn, "func", fn))
    code = getattr(fn, "__code__", None)
    warnings.warn_explicit(text, JaxloaderWarning, code.co_filename if code else default,
                           code.co_firstlineno if code else 0)


def generator_state(generator: Any) -> Any:
    """Where ``generator`` is (a draw moves it); ``None`` where that cannot be asked."""
    try:
        if isinstance(generator, random.Random):
            state = generator.getstate()
            return state[1][0], state[1][-1], state[2]
        if isinstance(generator, np.random.RandomState):
            return brief(generator.get_state(legacy=False))
        if type(generator).__module__.startswith("torch"):  # (a torch.Generator)
            return TorchState(generator.initial_seed(), generator.get_state())
        bits = generator if isinstance(generator, np.random.BitGenerator) else \
            generator.bit_generator
        return brief(bits.state)
    except Exception:  # noqa: BLE001 - (a SystemRandom: no state; a watch only)
        return None
