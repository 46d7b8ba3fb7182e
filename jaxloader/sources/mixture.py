"""``Mixture``: sources mixed by weight, one index space (a ``ConcatSource`` of the components)
read in the order ``batching.mixture_sampler`` lays out from the weights' plan
(``plans.mixture``). ``jl.mix`` makes one.

Example:
    >>> import numpy as np
    >>> from jaxloader.sources import ArraySource
    >>> m = Mixture([ArraySource({"x": np.zeros(3)}), ArraySource({"x": np.ones(2)})],
    ...             {0: np.array([0.5, 0.5])})
    >>> len(m), len(m.sources)
    (5, 2)
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from jaxloader.base.checks import check_int
from jaxloader.base.errors import ConfigError
from jaxloader.base.loader_names import loader_names
from jaxloader.plans.mixture import Weights, normalised
from jaxloader.sources.base import Source
from jaxloader.sources.parts import walk
from jaxloader.sources.concat import ConcatSource


@loader_names("source")
class Mixture(ConcatSource):
    """The components as one source, and the weights (from step 0, and from later steps);
    made by ``jl.mix`` of sources.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> mixed = jl.mix([jl.ArraySource({"x": np.zeros(80)}),
        ...                 jl.ArraySource({"x": np.ones(20)})], [0.75, 0.25])
        >>> type(mixed).__name__, len(mixed)
        ('Mixture', 100)
    """

    read_by_index = False  # (ConcatSource)
    _PLACE = "mix(sources)"

    def __init__(self, sources: Sequence[Source], schedule: Mapping[int, Weights],
                 names: Sequence[str] | None = None) -> None:
        super().__init__(sources, names)
        self.schedule = checked_schedule(schedule, len(self.sources))
        for weights in self.schedule.values():  # (those of a regime share its batches;
            self.check_alike([c for c, w in enumerate(weights) if w > 0])  # not others)

    def check_phases(self) -> None:
        """Refuses components of the schedule's regimes whose records differ in keys, dtypes
        or ranks (in memory: ``check_alike``), where a loader reads them as they are (no
        transform that could make them alike): its batches are all of one kind
        (``base.batch_kinds``), and the run would stop at the step the schedule moves at."""
        if len(self.schedule) > 1:
            self.check_alike(sorted({c for weights in self.schedule.values()
                                     for c, w in enumerate(weights) if w > 0}), shapes=False)

    def __repr__(self) -> str:
        weights = ", ".join(f"{w:.3g}" for w in self.schedule[0])
        return (f"Mixture({len(self)} records in {len(self.sources)} sources, weights "
                f"[{weights}]{' and later' if len(self.schedule) > 1 else ''})")

    @property
    def fingerprint(self) -> str:
        """The components' fingerprints; the weights are checked apart (``check_schedule``)."""
        from jaxloader.sources.fingerprint import combined

        self.part_digests = []  # (each component's, as this fingerprint made them)
        return combined("mixture", len(self.sources), self.sources, parts=self.part_digests)


def refuse_mixture(source: Any, what: str) -> None:
    """Raises when ``source`` is a ``jl.mix`` of sources: ``what`` (a wrapper that reads its
    source by index) would read it as its components one after another, weights unused."""
    if isinstance(source, Mixture):
        raise ConfigError(
            f"{what}(source): got a mixture (jl.mix), which it would read as its components "
            f"one after another, the weights unused; wrap each component and mix those: "
            f"jl.mix([{what}(a, ...), {what}(b, ...)], weights)")
    refuse_held_mixture(source)


def refuse_held_mixture(source: Any) -> None:
    """Raises where the user's ``source`` (not one of jaxloader's; or a part of one of them, a
    component of a mix) holds a ``jl.mix`` in an attribute, or in a list, tuple or dict in
    one (a Dataset class that wraps one to add a field): it reads the mixture by index, as its
    components one after another, the weights unused, without a word."""
    for part in walk(source):
        module = type(part).__module__
        if not (module == "jaxloader" or module.startswith("jaxloader.")):
            _refuse_held(part)


def _refuse_held(source: Any) -> None:
    """``refuse_held_mixture`` of one of the user's objects, its attributes looked at."""
    held = dict(getattr(source, "__dict__", None) or {})
    held.update({name: getattr(source, name) for name in getattr(type(source), "__slots__", ())
                 if isinstance(name, str) and hasattr(source, name)})
    for name, value in held.items():
        inside = value.values() if isinstance(value, dict) else value if isinstance(
            value, (list, tuple)) else (value,)
        if any(isinstance(item, Mixture) and len(item) == _length(source)  # (the first 64:
               for item in itertools.islice(inside, 64)):  # not a million records' list)
            # (of its length: read record for record; one it holds beside others, not)
            raise ConfigError(
                f"source: the {type(source).__name__} holds a mixture (jl.mix) in .{name}, "
                "which it reads by index: as its components one after another, the weights "
                "unused; give the mixture itself to the loader, what the class adds made in a "
                "Map (DataLoader(jl.mix([...], weights), transforms=[jl.Map(fn)])), or wrap "
                f"each component in a {type(source).__name__} and mix those")


def _length(source: Any) -> int | None:
    try:
        return len(source)
    except Exception:  # noqa: BLE001 - (none: not a wrapper read record for record)
        return None


def checked_schedule(schedule: Any, count: int) -> dict[int, np.ndarray]:
    """``{step: weights}`` from step 0, each weights' list normalised and checked as ``jl.mix``
    checks them (a ``Mixture`` made directly took unnormalised weights as they were: 3:1 read
    nothing of the first component).

    Example:
        >>> checked_schedule({0: [3, 1], 10: [1, 1]}, 2)[0].tolist()
        [0.75, 0.25]
    """
    if not isinstance(schedule, Mapping) or 0 not in schedule:
        raise ConfigError(
            f"Mixture(sources, schedule): expected a dict {{step: weights}} with step 0, got "
            f"{schedule!r:.80}; jl.mix(sources, weights, from_step={{step: weights}}) makes one")
    for step in schedule:
        check_int("Mixture(schedule) step", step, low=0, remedy="steps from 0")
    return {int(step): _kept_or_normalised(schedule[step], count, f"schedule[{step}]")
            for step in sorted(schedule)}


def _kept_or_normalised(weights: Any, count: int, name: str) -> np.ndarray:
    """``weights`` as they are where ``jl.mix`` normalised them (bit for bit: the layout rounds
    from them), else normalised and checked."""
    w = normalised(weights, count, name, owner="Mixture")
    if isinstance(weights, np.ndarray) and weights.dtype == np.float64 and np.allclose(
            weights, w, rtol=1e-12, atol=0):
        return weights
    return w
