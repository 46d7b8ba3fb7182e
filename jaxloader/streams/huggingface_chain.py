"""What a Hugging Face ``IterableDataset``'s chain of iterables holds (its ``_ex_iterable``:
maps and filters down to what reads the files, joins over the datasets they join): what its
shards' names digest, the local files a shard reads, and what a stream of its shards, each read
by itself, cannot do as the dataset does (``_REFUSED``). ``datasets``' iterables are read by
their attributes and classes' names: ``datasets`` is not imported here."""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Any, Iterator

from jaxloader.base import file_identity
from jaxloader.base.abilities import older_digests
from jaxloader.sources.code_digest import code_digest


def data_digest(dataset: Any) -> str:
    """``"@"`` and a digest of what the dataset reads (its files, or the fingerprints of the
    ``Dataset``s it streams), in its shards' names, which a state is checked against: a
    state is refused by a stream over other files, as a file source's is. Values with no
    stable text (a generator function) are left out; ``""`` where nothing is found."""
    digest, found = hashlib.blake2b(digest_size=6), False
    top = getattr(dataset, "_ex_iterable", None)
    for node in [_chain_end(top)] if older_digests() else _readers(top):  # (until 2026-11-30: the
        for is_key, value in _walked(getattr(node, "kwargs", None) or {}):  # chain's end)
            if is_key:
                digest.update(str(value).encode())
            elif isinstance(value, (str, int, float, bool)):
                digest.update(repr(value).encode())
                found = True
            elif isinstance(getattr(value, "_fingerprint", None), str):
                digest.update(value._fingerprint.encode())
                found = True
    return f"@{digest.hexdigest()}" if found else ""


def functions_digest(dataset: Any) -> str | None:
    """A digest of the user's functions the dataset's chain runs: each ``map``'s and
    ``filter``'s, with its ``fn_kwargs``, and an ``IterableDataset.from_generator``'s, with its
    ``gen_kwargs`` (``code_digest``: their code and what they hold), which a stream state holds
    as a ``Stream.from_generator``'s: a restore over other functions, which would read other
    records from the saved position, is warned of. Of ``datasets``' own functions (a
    ``rename_column``'s, an ``add_column``'s), their arguments alone: their code changes with
    its version, not the records. ``None`` where the chain runs none."""
    found = []
    for node in _nodes(getattr(dataset, "_ex_iterable", None)):
        fn, kwargs = getattr(node, "mask_function", None) or getattr(node, "function", None), \
            getattr(node, "fn_kwargs", None)
        if fn is None:  # (a generator's: the builder's method, its config the function)
            owner = getattr(getattr(node, "generate_examples_fn", None), "__self__", None)
            fn = getattr(getattr(owner, "config", None), "generator", None)
            kwargs = getattr(node, "kwargs", None)
        own = getattr(fn, "func", fn)  # (a partial's function: whose module?)
        module = str(getattr(own, "__module__", ""))
        if module == "datasets" or module.startswith("datasets."):  # (its arguments: the
            fn = functools.partial(tuple, (getattr(fn, "args", ()),  # user's, an add_column's
                                           getattr(fn, "keywords", {})))  # values)
        if callable(fn):
            found.append(code_digest(functools.partial(fn, **kwargs) if isinstance(
                kwargs, dict) and kwargs else fn, bound=True))
    return hashlib.blake2b("|".join(found).encode(), digest_size=8).hexdigest() \
        if found else None


def _walked(value: Any) -> Iterator[tuple[bool, Any]]:
    """A reader's arguments in order, each dict's keys sorted: ``(True, key)`` before the
    key's value's, ``(False, value)`` for each value not a list, tuple or dict."""
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _walked(item)
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            yield True, key
            yield from _walked(value[key])
    else:
        yield False, value


_CUT = ("the first records of each shard, not of the dataset (other records, silently); read "
        "only the records wanted: ds.select(range(n)).to_iterable_dataset() of a Dataset, "
        "fewer data_files, or a run of fewer steps")
_REFUSED = {  # an iterable's class: what it does, why a stream of the shards differs, the remedy
    "BufferShuffledExamplesIterable":
        "shuffled (IterableDataset.shuffle), whose buffer is lost at every restore, so a "
        "restored run would read other records; leave out its shuffle and pass shuffle_window= "
        "(records permuted together) to Stream.huggingface, which restores exactly",
    "TakeExamplesIterable": "cut by IterableDataset.take, which would take " + _CUT,
    "SkipExamplesIterable": "cut by IterableDataset.skip, which would skip " + _CUT,
    **dict.fromkeys(
        ["CyclingMultiSourcesExamplesIterable", "RandomlyCyclingMultiSourcesExamplesIterable"],
        "interleaved (datasets.interleave_datasets), whose turns and stop would be taken "
        "within each shard (other records, some twice); stream each dataset by itself and "
        "mix them: jl.mix([jl.Stream.huggingface(a), jl.Stream.huggingface(b)], weights=[...]), "
        "which restores exactly"),
    "batch": "batched (IterableDataset.batch), whose batches would end at each shard's end, "
             "each batched again by the loader; leave out its batch: the loader's batch_size= "
             "makes the batches",
    "RepeatExamplesIterable": "repeated (IterableDataset.repeat), which each shard would do by "
                              "itself (repeat(None): never past the first shard); leave out its "
                              "repeat: a StreamLoader reads its shards endlessly by default, "
                              "num_epochs=n for n passes",
}
_BATCHING = ("_batch_fn", "_batch_arrow_table", "_batch_accumulate_arrow_table_by_columns")


def refused(dataset: Any) -> str | None:
    """What makes a stream of the dataset's shards, each read by itself and restored by its
    own state, read other records than the dataset (``_REFUSED``), found anywhere in its
    iterables (below its maps, in each dataset it joins); ``None`` where nothing does."""
    if getattr(dataset, "_shuffling", None) is not None:  # (datasets before 3: a config)
        return _REFUSED["BufferShuffledExamplesIterable"]
    for node in _nodes(getattr(dataset, "_ex_iterable", None)):
        function = getattr(node, "function", None)  # (IterableDataset.batch: a batched map
        function = getattr(function, "func", function)  # of its function, or a partial of it)
        batches = getattr(function, "__name__", "") in _BATCHING
        found = _REFUSED.get("batch" if batches else type(node).__name__)
        if found is not None:
            return found
    return _UNBATCHED if _unbatched(getattr(dataset, "_ex_iterable", None), False, False) \
        else None


_UNBATCHED = (
    "a concatenation (concatenate_datasets) of parts mapped and not, then filtered or mapped: "
    "datasets restores the filter or map over a part not mapped at the end of the Arrow chunk "
    "it had read, so a restore would skip records, silently (datasets 5.2); map every part "
    "before concatenating them (part.map(lambda r: r) for one without a map), or concatenate "
    "the Datasets before .to_iterable_dataset()")


def _unbatched(node: Any, mapped: bool, rebatched: bool, depth: int = 0) -> bool:
    """Whether an Arrow reader under ``node`` has a ``map``/``filter`` above it with no
    ``RebatchedArrowExamplesIterable`` between (``mapped``, ``rebatched``: above ``node``)."""
    if node is None or depth > 64:
        return False
    kind = type(node).__name__
    if kind == "ArrowExamplesIterable":
        return mapped and not rebatched
    mapped = mapped or kind in ("MappedExamplesIterable", "FilteredExamplesIterable")
    rebatched = rebatched or kind == "RebatchedArrowExamplesIterable"
    joined = getattr(node, "ex_iterables", None)
    return any(_unbatched(inner, mapped, rebatched, depth + 1) for inner in [
        *(joined if isinstance(joined, (list, tuple)) else ()), getattr(node, "ex_iterable", None)])


def features_below(dataset: Any) -> dict | None:
    """The features declared below the dataset's chain's maps (an ``IterableDataset.map``
    without ``features=`` leaves the dataset none), the outermost found, less the columns the
    maps above it remove (``remove_columns=``, a rename's old name) and those a
    ``select_columns`` above it leaves out; ``None`` if none."""
    removed: set = set()
    selected: set | None = None
    for node in _nodes(getattr(dataset, "_ex_iterable", None)):
        features = getattr(node, "_features", None)
        if features:
            return {key: feature for key, feature in dict(features).items() if key not in
                    removed and (selected is None or key in selected)}
        removed.update(getattr(node, "remove_columns", None) or ())
        kept = getattr(node, "column_names", None)
        if type(node).__name__ == "SelectColumnsIterable" and isinstance(kept, list):
            selected = set(kept) if selected is None else selected & set(kept)
    return None


def _nodes(node: Any, depth: int = 0) -> Iterator[Any]:
    """``node`` and every iterable below it: its chain (``ex_iterable``) and its joins' parts."""
    if node is None or depth > 64:
        return
    yield node
    joined = getattr(node, "ex_iterables", None)
    for inner in [*(joined if isinstance(joined, (list, tuple)) else ()),
                  getattr(node, "ex_iterable", None)]:
        yield from _nodes(inner, depth + 1)


def local_files(part: Any) -> list | None:
    """``[name, size, head, tail]`` (``file_identity.whole``) of each local file the shard
    ``part`` reads (its data files, under its maps and filters), which its state holds: a
    restore over a file rewritten since resumed inside the new file's rows, silently. A file is
    named by its base name in the state (the shards' names digest the whole paths: a stream
    over a copy elsewhere is another stream); remote ones are not looked at."""
    paths: list[str] = []
    for node in _readers(getattr(part, "_ex_iterable", None)):
        for is_key, value in _walked(getattr(node, "kwargs", None) or {}):
            if not is_key and isinstance(value, str) and "://" not in value and (
                    value not in paths and os.path.isfile(value)):  # (base_files and
                paths.append(value)  # original_files name one file twice)
    return [[os.path.basename(p), *file_identity.whole(p)] for p in paths] or None


def _chain_end(node: Any) -> Any:
    """The end of ``node``'s chain of ``ex_iterable`` (a join's own node: not into its parts)."""
    for _ in range(64):
        inner = getattr(node, "ex_iterable", None)
        if inner is None:
            break
        node = inner
    return node


def _readers(node: Any) -> list:
    """What reads the data under ``node``, an ``IterableDataset``'s chain of iterables: the ends
    of its maps and filters, in each dataset it joins (``concatenate_datasets``)."""
    return [n for n in _nodes(node) if getattr(n, "ex_iterable", None) is None
            and not isinstance(getattr(n, "ex_iterables", None), (list, tuple))]
