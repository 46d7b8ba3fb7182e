"""``jl.mix``: sources, or streams, mixed by weight (``sources.mixture.Mixture`` for a
``DataLoader``, ``streams.mixed.MixedStream`` for a ``StreamLoader``), the weights changing at
given steps; the plan both follow is ``plans.mixture``'s."""

from __future__ import annotations

from typing import Any, Mapping, Sequence, overload

from jaxloader.base.checks import check_int
from jaxloader.base.errors import ConfigError
from jaxloader.plans.mixture import Weights, normalised
from jaxloader.sources.base import Source
from jaxloader.sources.mixture import Mixture
from jaxloader.streams.contract import ReadableStream, StreamLike
from jaxloader.streams.mixed import MixedStream
from jaxloader.streams.mixed_reader import STOPPING_STRATEGIES, Stopping
from jaxloader.streams.packed import PackedStream
from jaxloader.streams.reader import Stream, as_stream


@overload
def mix(sources: Sequence[ReadableStream] | Mapping[str, ReadableStream], weights: Weights,
        from_step: Mapping[int, Weights] | None = None,
        stopping_strategy: Stopping = "all_exhausted_without_replacement") -> MixedStream: ...


@overload
def mix(sources: Sequence[Source] | Mapping[str, Source], weights: Weights,
        from_step: Mapping[int, Weights] | None = None,
        stopping_strategy: Stopping = "all_exhausted_without_replacement") -> Mixture: ...


@overload
def mix(sources: Sequence[Source | StreamLike] | Mapping[str, Source | StreamLike],
        weights: Weights, from_step: Mapping[int, Weights] | None = None,
        stopping_strategy: Stopping = "all_exhausted_without_replacement",
        ) -> Mixture | MixedStream: ...


def mix(sources: Sequence[Source | StreamLike] | Mapping[str, Source | StreamLike],
        weights: Weights,
        from_step: Mapping[int, Weights] | None = None,
        stopping_strategy: Stopping = "all_exhausted_without_replacement",
        ) -> Mixture | MixedStream:
    """A mixture of ``sources``, a record of ``sources[c]`` at a position with probability
    ``weights[c]`` (normalised); ``from_step={step: weights}`` changes them from that step on.
    Components may be named: ``mix({"web": web, "code": code}, {"web": 0.7, "code": 0.3})``
    (weights by name, also in ``from_step``; the components in the dict's order).

    Pass it to ``DataLoader`` as the source: every component is reshuffled in its own epochs
    (``shuffle`` says whether components are shuffled), and the loader's epoch is the sum of
    the components' lengths. Streams (``jl.Stream``) mix too: the result is read by a
    ``StreamLoader`` (``jaxloader.streams.mixed``).

    ``stopping_strategy`` (streams only; Hugging Face's ``interleave_datasets`` names) says
    where a stream mixture's epoch ends, and so a ``StreamLoader(num_epochs=n)`` pass:
    ``"all_exhausted_without_replacement"`` (the default): once every component has read its
    epoch (every record once; a component run out gives its slots up);
    ``"first_exhausted"``: as soon as one component has read its epoch; ``"all_exhausted"``:
    once every component with weight has (those done first start their next: oversampled).
    Both then start every component's next epoch (the rest of one under way is passed over).
    An endless mixture (``num_epochs=None``) reads each component's epochs one after another
    by default.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> parts = [jl.ArraySource({"x": np.full(n, n)}) for n in (60, 30, 10)]
        >>> loader = jl.DataLoader(jl.mix(parts, [0.5, 0.3, 0.2], from_step={40: [1, 1, 0]}),
        ...                        batch_size=20, shuffle=True, process_index=0, process_count=1)
        >>> sorted(np.unique(next(iter(loader))["x"]).tolist())
        [10, 30, 60]
    """
    if not isinstance(sources, (Sequence, Mapping)) or isinstance(sources, (str, bytes)):
        # (a source passed alone: its records were counted as sources)
        raise ConfigError(f"mix(sources): expected a list (or dict) of sources, got "
                          f"{type(sources).__name__}; pass [source_a, source_b, ...] and one "
                          "weight each")
    if not len(sources):
        raise ConfigError("mix(sources): expected a non-empty list of sources, got none; pass "
                          "the sources to mix and one weight each")
    if from_step is not None and not isinstance(from_step, Mapping):
        raise ConfigError(f"mix(from_step=...): expected a dict {{step: weights}}, got "
                          f"{type(from_step).__name__}; e.g. from_step={{1000: [0.5, 0.5]}}")
    names = list(sources) if isinstance(sources, Mapping) else None
    sources = list(sources.values()) if isinstance(sources, Mapping) else sources
    schedule = {0: normalised(weights, len(sources), "weights", names)}
    for step in from_step or {}:  # (each checked before they are sorted: '10' beside 20)
        check_int("mix(from_step=...) step", step, low=1, remedy="steps after 0; weights= is "
                  "step 0" + ("; a JSON or YAML file's keys are str: {int(k): w for k, w in "
                              "from_step.items()}" if isinstance(step, str) else ""))
    for step, later in sorted((from_step or {}).items()):
        schedule[int(step)] = normalised(later, len(sources), f"from_step[{step}]", names)
    parts: list[Any] = [as_stream(s) for s in sources]  # Hugging Face IterableDatasets
    if any(isinstance(s, MixedStream) for s in parts):
        raise ConfigError(
            "mix(sources): a mixture of streams inside a mixture; mix the streams in one "
            "jl.mix, each weight the product of its own and its mixture's (mix([a, b], [1, 1]) "
            "at 0.5 beside c at 0.5: mix([a, b, c], [0.25, 0.25, 0.5]))"
        )
    if any(isinstance(s, PackedStream) for s in parts):
        raise ConfigError(
            "mix(sources): a PackedStream is mixed by packing the mixture: "
            "jl.PackedStream(jl.mix([stream_a, stream_b], weights), key, length), so that a "
            "row's documents come from the components by weight"
        )
    streams = [isinstance(s, Stream) for s in parts]
    if any(streams) and not all(streams):
        raise ConfigError(
            f"mix(sources): sources {[i for i, s in enumerate(streams) if s]} are streams "
            f"(jl.Stream) and {[i for i, s in enumerate(streams) if not s]} are not; mix "
            "streams with streams (for a StreamLoader) and random-access sources with sources "
            "(for a DataLoader); a source can be read as a stream with "
            "jl.Stream.from_generator(lambda i: (source[j] for j in range(i, len(source), n)), "
            "shards=n)"
        )
    if stopping_strategy not in STOPPING_STRATEGIES:
        raise ConfigError(f"mix(stopping_strategy=...): expected one of "
                          f"{list(STOPPING_STRATEGIES)} (Hugging Face's interleave_datasets "
                          f"names), got {stopping_strategy!r}")
    if all(streams):
        return MixedStream(parts, schedule, stopping_strategy, names)
    if any(isinstance(s, Mixture) for s in parts):  # read by index, it would lose its weights
        raise ConfigError(
            "mix(sources): a mixture of sources inside a mixture; mix the sources in one "
            "jl.mix, each weight the product of its own and its mixture's (mix([a, b], [1, 1]) "
            "at 0.5 beside c at 0.5: mix([a, b, c], [0.25, 0.25, 0.5]))"
        )
    if stopping_strategy != STOPPING_STRATEGIES[0]:
        raise ConfigError(
            f"mix(stopping_strategy={stopping_strategy!r}): a mixture of sources has no "
            "component epochs to stop at: the loader's epoch is the sum of the components' "
            "lengths, each component reshuffled as it wraps; leave stopping_strategy out, or "
            "set the epoch's length with a number of steps")
    try:
        return Mixture(parts, schedule, names)
    except ConfigError as e:  # (a part's error: named by its place in the mix, not a concat's)
        raise ConfigError(str(e).replace("ConcatSource: sources[", "mix(sources)[", 1)) from None
