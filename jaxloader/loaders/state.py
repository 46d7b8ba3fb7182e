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

import numbers
from typing import Any, Callable, Sequence

import numpy as np

from jaxloader.base.file_identity import as_now, check_files
from jaxloader.base.checks import EPOCH_LIMIT, MASK64, check_bounded, check_int, shown_names
from jaxloader.base.difference import differ, first_apart
from jaxloader.base.errors import StateDictError
from jaxloader.base.state_copy import copied
from jaxloader.loaders.foreign_arguments import grain_state_hint
from jaxloader.loaders.older_states import check_mixture_order
from jaxloader.loaders.transform_names import warn_changed_transforms
from jaxloader.loaders.source_changes import (changed_parts, moved, reordered,
                                              source_differences)
from jaxloader.order.sampling import LAST_BATCH_POLICIES, Order
from jaxloader.sources.fingerprint import compact_spec

# The state's one version: what a step reads (the orders of ``order`` and ``plans``, the state's
# layout) is this number's; a change to any of them changes it, or a key marks it (exact_shuffle),
# and a state of another is refused, not misread (the suite's order digests catch a change).
STATE_VERSION = 1
# Keys whose values must equal this loader's for a step to mean the same global batch.
_CHECKED = ("num_records", "global_batch_size", "seed", "shuffle", "last_batch")
# Fingerprint keys: what the data is (a source that cannot say leaves its key out; a state with
# the key where the loader has none, or without it where the loader has one, is another's).
_FINGERPRINT = ("source", "record_spec", "record_hash")


def make_state(sampler: Order, step: int, fingerprint: dict[str, Any],
               transforms: list[str] | None = None) -> dict[str, Any]:
    """The state of a loader over ``sampler`` whose next batch is global step ``step``;
    ``fingerprint``: the source's (``jaxloader.sources.fingerprint``), with ``"files"`` (each file's
    identity, ``file_identity``) for a source of files; ``transforms``: ``transforms_of``
    the loader's."""
    state = {
        "version": STATE_VERSION,
        "step": int(step),
        "num_records": sampler.num_records,
        "global_batch_size": sampler.global_batch_size,
        "seed": sampler.seed, "shuffle": sampler.shuffle, "last_batch": sampler.last_batch,
        **fingerprint,
        **sampler.extra_state(),  # a mixture's weights
        # Informational: a restore may use another split of the same global batch.
        "batch_size": sampler.batch_size,
        "process_count": sampler.process_count,
    }
    if transforms is not None:
        state["transforms"] = transforms
    # the caller's own: a list edited in it (a mixture's weights, a file's identity) leaves the
    # loader's, which the next state and a restore's checks are made from, as they were
    return copied(state)


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


def _digests(name: str, value: Any) -> None:
    if not isinstance(value, list) or any(type(v) is not str or len(v) > 64 for v in value):
        raise StateDictError(
            f"{name}: expected a list of the parts' fingerprints (short hex strings), received "
            f"{value!r:.120}; pass the dict that DataLoader.state_dict() returned, unchanged")


def _of_type(kind: type, choices: tuple = ()) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if type(value) not in (kind, np.bool_ if kind is bool else kind) or (  # (a pytree's)
                choices and value not in choices):
            want = f"one of {choices}" if choices else f"a {kind.__name__}"
            raise StateDictError(
                f"{name}: expected {want}, received {type(value).__name__} {value!r:.120}; "
                "pass the dict that DataLoader.state_dict() returned, unchanged")
    return check


_FIELDS: dict[str, Callable[[str, Any], None]] = {
    "version": _int(1),
    "step": _int(0),
    "num_records": _int(1),
    "global_batch_size": _int(1),
    "seed": _int(0, MASK64),
    "shuffle": _of_type(bool),
    "exact_shuffle": _of_type(bool),
    "reads_in_order": _of_type(bool),
    "last_batch": _of_type(str, LAST_BATCH_POLICIES),
    "batch_size": _int(1),
    "process_count": _int(1),
    **{key: _of_type(str) for key in _FINGERPRINT},
    "files": _identities,
    "parts": _digests,
}


def check_state(state: Any, sampler: Order, fingerprint: dict[str, Any],
                paths: Sequence[str] = (),
                older: Callable[[], Sequence[str | dict]] = tuple,
                transforms: list[str] | None = None,
                older_transforms: Callable[[], list[list[str]]] | None = None,
                part_name: Callable[[int], str] | None = None) -> int:
    """Validates ``state`` against ``sampler`` and the source's ``fingerprint`` (``paths``:
    the files its ``"files"`` are the identities of, to name one that changed; ``older()``:
    the source's fingerprints of older versions, which a state may hold, asked only where its
    fingerprint differs: its own, or its records' hash and structure, a dict); warns where
    it was saved under other ``transforms``; ``part_name``: how a ``ConcatSource`` or mixture
    names its part ``i``, to name one that changed; returns the step to continue from."""
    check_bounded(state, "DataLoader")
    expected = make_state(sampler, 0, fingerprint, transforms)
    if not isinstance(state, dict):
        raise StateDictError(
            f"state: expected a dict from DataLoader.state_dict(), got {type(state).__name__}"
        )
    if state.get("kind") == "stream":
        raise StateDictError(
            "state: expected a DataLoader's state_dict(), got a StreamLoader's (kind 'stream'); "
            "a StreamLoader's state restores into a StreamLoader")
    missing = sorted(set(("version", "step", *_CHECKED)) - set(state))
    if missing:
        raise StateDictError(
            f"state: missing keys {missing}; expected keys {sorted(expected)}, received "
            f"{shown_names(sorted(map(str, state)))}; pass the dict that DataLoader.state_dict() "
            "returned"
            + grain_state_hint(state))
    for key, check in _FIELDS.items():
        if key in state:
            check(f"state[{key!r}]", state[key])
    if state["version"] != STATE_VERSION:
        raise StateDictError(
            f"state['version']: expected {STATE_VERSION}, received {state['version']!r:.120}; this "
            "state was written by another jaxloader version that this one cannot read"
        )
    if ("mixture" in state) != ("mixture" in expected):  # (said before the fingerprints)
        kinds = ("a plain source", "a mixture (jaxloader.mix)")
        raise StateDictError(
            f"state: it is from a loader over {kinds['mixture' in state]}, and this loader reads "
            f"{kinds['mixture' in expected]}; a state restores into a loader over the same "
            "data: a mixture's into the same mixture, a plain source's into that source (to "
            "mix in sources later, mix them from the start at weight 0 and raise it with "
            "jl.mix(..., from_step={step: weights}))")
    if isinstance(state.get("record_spec"), str):  # (whole in a state until 2026-11-30)
        state = {**state, "record_spec": compact_spec(state["record_spec"])}
    if "mixture_order" in state and "mixture" in expected:  # (written until 2026-11-27)
        check_mixture_order(state["mixture_order"], 5, "state['mixture_order']")
        state = {k: v for k, v in state.items() if k != "mixture_order"}
    if {state["last_batch"], expected["last_batch"]} == {"pad", "partial"} and (
            "mixture" not in expected):  # (a step's records the same: 'partial' on one process
        state = {**state, "last_batch": expected["last_batch"]}  # moves to 'pad' on several)
    then, now = as_now(state.get("files"), expected.get("files")), expected.get("files")
    state = {**state, "files": then} if "files" in state else state
    if isinstance(then, list) and isinstance(now, list) and \
            sorted(map(str, then)) != sorted(map(str, now)):  # (not the same files reordered)
        check_files(then, now, paths)  # changed, added: named, before the fingerprint it moves
    if state.get("source") != expected.get("source") and state.get("source") in older():
        state = {**state, "source": expected.get("source")}  # (saved before: the same source)
    if "record_hash" in expected and state.get("record_hash") != expected["record_hash"] and any(
            isinstance(t, dict) and {**t, "record_spec": compact_spec(t["record_spec"])} == {
                k: state.get(k) for k in t} for t in older()):  # (its records as saved before)
        state = {**state, **{k: expected[k] for k in ("record_spec", "record_hash")}}
    if "source" in expected and "source" not in state and "record_hash" in state and any(
            isinstance(t, dict) and {**t, "record_spec": compact_spec(t["record_spec"])} == {
                k: state.get(k) for k in t} for t in older()):  # (a ConcatSource's until
        state = {**{k: v for k, v in state.items() if k not in ("record_spec", "record_hash")},
                 "source": expected["source"]}  # 2026-12-03: by three of its records)
    compared = [*_CHECKED, *(k for k in _FINGERPRINT if k in state or k in expected)]
    diffs = [differ(k, expected.get(k), state.get(k))
             for k in compared if state.get(k) != expected.get(k)]
    grown = state.get("num_records") != sampler.num_records
    files = moved(then, now, lambda i: repr(paths[i]) if i < len(paths) else f"file {i}")
    parts = moved(state.get("parts"), expected.get("parts"), part_name or "part {}".format)
    if files or parts:  # (a glob's order, a list built otherwise: named, not "inside it")
        diffs.append(f"the source reads the same {'files' if files else 'parts'} in another "
                     f"order: the state's was {files or parts}; pass them in that order"
                     + (" (sorted(glob(...)) gives one order on every machine)" if files else ""))
    else:
        diffs += source_differences(str(state.get("source")), str(expected.get("source")),
                                    not grown, changed_parts(state.get("parts"),
                                                             expected.get("parts"), part_name))
    diffs += reordered(state.get("record_spec"), expected.get("record_spec"))
    if (grown or state.get("record_hash") != expected.get("record_hash")) and \
            state.get("record_spec") == expected.get("record_spec") is not None:
        diffs.append("records appended or removed (a buffer that grew: a new loader reads it "
                     "from its start)" if grown else "records 0, n // 2, n - 1 are alike in "
                     "structure, not in values: other data, or records that differ from read to"
                     " read (augmentation in __getitem__: draw in a RandomMap, or give the "
                     "source a `fingerprint` attribute naming its data)")
    if diffs:
        raise StateDictError(
            "state does not fit this loader (" + "; ".join(diffs) + "); restore it into a "
            "loader over the same data with the same seed, shuffle, last_batch and global batch "
            "size (batch_size x process_count)" + (
                "; to use less memory a step, keep the batch size and split each batch in the "
                "step (gradient accumulation over micro-batches)" if isinstance(
                    state.get("global_batch_size"), numbers.Integral) and isinstance(
                        expected.get("global_batch_size"), int) and expected[
                    "global_batch_size"] < state["global_batch_size"] else "")
        )
    check_files(state.get("files"), expected.get("files"), paths)
    epochs = state["step"] // sampler.steps_per_epoch
    if epochs >= EPOCH_LIMIT:
        raise StateDictError(
            f"state['step']: {state['step']:,} is past any step this loader reaches: epoch "
            f"{epochs:,} of {sampler.steps_per_epoch:,} steps, where epochs stop at "
            f"{EPOCH_LIMIT:,} (a record's random numbers are keyed by its epoch and position "
            "in 64 bits); pass the dict that DataLoader.state_dict() returned, unchanged")
    sampler.check_extra_state(state, state["step"])
    refuse_unknown(state, expected, "DataLoader")
    if transforms is not None:
        warn_changed_transforms(state.get("transforms"), transforms, state["step"],
                                older_transforms)
    return int(state["step"])  # (a NumPy int from a pytree restore: overflowed in a shuffle)


def check_stream_state(state: Any, config: dict[str, Any], process_index: int,
                       extra: dict[str, Any], readers: int) -> list[dict]:
    """Validates a ``StreamLoader``'s ``state`` against its ``config`` (``_config()``), its
    process and the ``readers`` it hosts (a stream's ``extra`` state keys allowed); returns the
    readers' states (each checked by opening it, by the loader)."""
    if not isinstance(state, dict) or state.get("kind") != "stream":
        got = (type(state).__name__ if not isinstance(state, dict) else
               "a DataLoader's (no 'kind', a 'step')" if "kind" not in state and "step" in state
               else f"kind {state.get('kind')!r}")
        raise StateDictError(
            f"state: expected a StreamLoader's state_dict() (kind 'stream'), got {got}; a "
            "DataLoader's state restores into a DataLoader" + grain_state_hint(state, True))
    if state.get("version") != STATE_VERSION:
        raise StateDictError(f"state['version']: expected {STATE_VERSION}, received "
                             f"{state.get('version')!r:.120}; this state was written by another "
                             "jaxloader version that this one cannot read")
    then, now = (_mixes(s) for s in (state.get("stream"), config.get("stream")))
    diffs = [differ(*first_apart(k, v, state.get(k))) for k, v in config.items()
             if state.get(k) != v and (k != "stream" or then == now)]
    if state.get("process_index") != process_index:
        diffs.append(f"process_index: expected {process_index}, received "
                     f"{state.get('process_index')!r:.120}")
    if then != now:  # (a plain stream's state into a mixture, or back)
        diffs.append(f"the state is from a loader over {'a mixture' if then else 'a plain stream'}"
                     f", this one reads {'a mixture' if now else 'a plain stream'} (to mix in "
                     "streams later: mix them from the start at weight 0, raised by from_step)")
    if diffs:
        other = state.get("stream") != config.get("stream")
        raise StateDictError(
            "state does not fit this stream loader (" + "; ".join(diffs) + "); "
            + ("restore it over the same stream: the same shards (files are named relative to "
               "the folder they share), shuffle_window and shuffle_shards, the same parameters "
               "of its mixture and packing (named above), and the same "
               "functions in it (a Stream.map's and a PackedStream's tokenize: named by a "
               "digest of their code: -O drops asserts from it, and a state saved before "
               "2026-12-01 restores under the Python version that saved it; a Hugging Face "
               "dataset's shards by datasets' fingerprints of the Datasets it streams, which "
               "for from_dict or a map differ under another Python version too); " if other
               else "")
            + "a stream's order depends on the seed, the batch size, the process count and "
            "each process's readers (readers_per_process, which defaults to max(1, "
            "num_workers)): restore with the same ones, on as many processes (a stream state "
            "is not elastic; pass readers_per_process= to change num_workers)")
    refuse_unknown(state, {"version", "step", "readers_step", "process_index", "readers",
                           "pass", "transforms", "generators", *config, *extra}, "StreamLoader")
    # a record's random numbers are keyed by its place in the stream, in 64 bits
    last = MASK64 // (config["process_count"] * config["batch_size"])
    check_int("state['step']", state.get("step"), low=0, high=last, error=StateDictError,
              remedy="pass the dict that state_dict() returned, unchanged")
    at = state.get("readers_step", state["step"])  # (absent in states saved before 2026-12-07)
    if at != state["step"]:  # (a DataLoader's step may be set by hand: it is its position)
        raise StateDictError(
            f"state['step']: {state['step']}, where its readers' states are those of step "
            f"{at!r:.40}: a StreamLoader's position is its readers' too, which a step set by "
            "hand does not move (its next batch would hold the records after step "
            f"{at!r:.40}'s, with another step's random numbers); restore the state as "
            "state_dict() returned it (a trainer that reads ahead: take state_dict() as each "
            "batch is handed out, and save the one of the last batch the model trained)")
    found, first = state.get("readers"), process_index * readers
    if (not isinstance(found, list) or len(found) != readers or any(
            not isinstance(r, dict) or type(r.get("reader")) is not int or r.get("reader") !=
            first + i for i, r in enumerate(found))):  # (1.0 or np.int64(1): a slice's TypeError)
        raise StateDictError(f"state['readers']: expected the states of readers {first}.."
                             f"{first + readers - 1}, received {found!r:.200}")
    for i, r in enumerate(found):  # (a pass's end is counted from it: None raised a TypeError)
        check_int(f"state['readers'][{i}]['epoch']", r.get("epoch", 0), low=0, high=EPOCH_LIMIT,
                  error=StateDictError, remedy="pass the dict that state_dict() returned, "
                  "unchanged")
    return found


def _mixes(stream: Any) -> bool:
    """Whether a stream's description is a mixture's (a packed one's too)."""
    return isinstance(stream, dict) and ("mix" in stream or _mixes(stream.get("packed")))


def refuse_unknown(state: dict, expected: Any, loader: str) -> None:
    """Refuses keys of ``state`` that are not among ``expected``'s, naming them (checked last:
    a state of another configuration is named by what differs, not by its extra keys)."""
    unknown = sorted(map(str, set(state) - set(expected)))
    if unknown:
        raise StateDictError(
            f"state: unknown keys {shown_names(unknown)}; expected keys {sorted(expected)}: a "
            f"state edited by hand, another kind of loader's, or one a newer jaxloader saved "
            f"(restore it with that version or a later one); pass the dict that "
            f"{loader}.state_dict() returned, unchanged")

