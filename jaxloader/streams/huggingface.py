"""A Hugging Face ``datasets.IterableDataset`` (``streaming=True``) as a stream: a shard of it a
shard, resumed by its own state.

::

    IterableDataset of n shards (its files) ──> Stream of n HuggingFaceShard
    shard i:  ds.shard(n, i) ──iter──> records (Python format) ──as features declare──> arrays
    state:    {"hf": ds.shard(n, i).state_dict()}  (the file, and the example in it)

A restore hands the state to the dataset's ``load_state_dict``, which passes over the examples
already read in the current file below the dataset's own ``map``/``filter``: Arrow-backed data
(Parquet on the Hub, ``Dataset.to_iterable_dataset``) skips them as Arrow tables, with no Python
record made and no ``map`` run for them, where skipping records (``Stream.from_generator``)
makes and maps every one.

Records are read in Python format (whatever the dataset's format), converted as a
``Dataset``'s are (``jaxloader.sources.huggingface``): a list feature of numbers is one array
of the dtype the features declare (a 32-float list would batch as 32 arrays of shape
``(batch,)``), numbers take their declared dtype, dates and times ``datetime64`` (Python
format's ``datetime`` objects do not batch; times in a zone other than UTC refused, as a
``Dataset``'s are), strings stay ``str``. A list of strings is
an object array: batched one a row when the lengths differ, stacked to ``(batch, length)``
when they are alike (as arrays of one shape are); a list of images, structs or lists is one
leaf too (``huggingface_values``). Where the features are unknown (a JSON file streamed
without them, or a ``map`` without ``features=``, warned of where it loses declared dtypes),
lists of numbers become arrays as ``JsonlShard`` reads them. A restore over a dataset whose
chain of ``map``s and ``filter``s differs from the state's is refused; one over other functions
in it (and another ``from_generator`` function) is warned of (``functions_digest``).

The dataset's own ``shuffle`` is refused: its buffer is lost at every restore (the dataset's
documentation says so), so the rest of the stream would differ. The stream's
``shuffle_window`` shuffles instead, and restores exactly. So are its ``take``, ``skip``,
``batch`` and ``interleave_datasets``, which a stream of its shards, each read by itself,
would apply to each shard (``jl.mix`` interleaves streams). A restore is as exact as the
dataset's ``state_dict()``, which ``datasets`` documents as exact but for that buffer and a
batched ``map`` over its Arrow format (which may skip a batch). ``datasets`` is not a dependency:
an ``IterableDataset`` is recognised by its class's module.

Example (``tests/streams/test_huggingface.py`` runs it)::

    ds = datasets.Dataset.from_dict({"v": [[0.0, 1.0]] * 8}).to_iterable_dataset(num_shards=4)
    loader = jl.StreamLoader(ds, batch_size=2)  # or Stream.huggingface(ds, shuffle_window=n)
    next(iter(loader))["v"].shape               # (2, 2)
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np

from jaxloader.base import file_identity
from jaxloader.base.abilities import in_generation, older_digests
from jaxloader.base.checks import released_at_least
from jaxloader.base.errors import ConfigError, JaxloaderWarning, StateDictError, user_stacklevel
from jaxloader.base.state_copy import copied
from jaxloader.sources.huggingface import refuse_zones
from jaxloader.streams import huggingface_chain
from jaxloader.streams.huggingface_values import _PYTHON, _UNKNOWN, Listed, as_declared, plan_of

_RESTORES = (4, 8, 5)  # the first datasets release whose IterableDataset states restore right


def is_iterable_dataset(value: Any) -> bool:
    """Whether ``value`` is a Hugging Face ``datasets.IterableDataset`` (no import of it)."""
    return any(c.__name__ == "IterableDataset" and c.__module__.startswith("datasets.")
               for c in type(value).__mro__)


def shards_of(dataset: Any) -> list[HuggingFaceShard]:
    """The shards of ``dataset``, one a shard of the dataset (a file), checked."""
    if not is_iterable_dataset(dataset):
        remedy = ("a Dataset has random access: pass it to jl.DataLoader (shuffled in full, "
                  "restored in O(1)), or stream it with ds.to_iterable_dataset(num_shards=n)"
                  if type(dataset).__module__.startswith("datasets.") else
                  "load it with datasets.load_dataset(..., streaming=True)")
        raise ConfigError(f"Stream.huggingface(dataset): expected a datasets.IterableDataset, "
                          f"got {type(dataset).__name__}; {remedy}")
    given = str(getattr(sys.modules.get("datasets"), "__version__", ""))
    if not hasattr(dataset, "state_dict") or not released_at_least(given, _RESTORES):
        raise ConfigError(
            f"Stream.huggingface(dataset): datasets {given or '(of no version)'} cannot "
            "restore this stream (before 4.8.5 a mapped IterableDataset's state restarted it "
            "from its first record, silently; before 3.4 its states were of another form); "
            "pip install \"datasets>=4.8.5\"")
    if getattr(dataset, "_distributed", None) is not None:
        raise ConfigError(
            "Stream.huggingface(dataset): the dataset is split by node "
            "(datasets.distributed.split_dataset_by_node), and the loader deals its files to "
            "the hosts (process_index, process_count) and workers itself; pass the whole "
            "dataset, the same on every host"
        )
    refused = huggingface_chain.refused(dataset)
    if refused is not None:
        raise ConfigError(f"Stream.huggingface(dataset): the dataset is {refused}")
    features = getattr(dataset, "features", None)  # (None: a JSON stream without them, its
    if features is not None:  # datetime objects do not batch, and are refused there)
        refuse_zones("Stream.huggingface(dataset)", features.arrow_schema)
    else:
        _warn_features_lost(huggingface_chain.features_below(dataset))
    # read in Python format whatever the dataset's, converted here as the features declare:
    # the dataset's NumPy format is several times slower a record, torch's would give tensors
    dataset = dataset.with_format(None)
    count = getattr(dataset, "num_shards", None) or dataset.n_shards
    name = getattr(getattr(dataset, "info", None), "dataset_name", None) or "IterableDataset"
    names = (name + huggingface_chain.data_digest(dataset),
             name + in_generation(1, lambda: huggingface_chain.data_digest(dataset)))
    code = huggingface_chain.functions_digest(dataset)  # (a state's "generators")
    return [HuggingFaceShard(dataset, i, count, tuple(f"{n}[{i}/{count}]" for n in names), code)
            for i in range(count)]


def _warn_features_lost(below: Any) -> None:
    """Warns where a ``map`` left the dataset no features over ones that declare dtypes its
    records' Python values do not batch as (``int8``, ``float32``, times): they come as
    ``int64``/``float64`` (JSON's rules), other values than the dataset's without the map."""
    if not below:
        return
    changed = []

    def walk(plan: Any, path: str) -> None:
        if isinstance(plan, dict):
            for key, inner in plan.items():
                walk(inner, f"{path}[{key!r}]")
        elif isinstance(plan, Listed):
            walk(plan.inner, path + "[...]")
        elif isinstance(plan, np.dtype) and plan not in _PYTHON.values():
            changed.append(f"{path} {plan}")
    walk(plan_of(below), "")
    if changed:
        warnings.warn(
            f"Stream.huggingface(dataset): its map (IterableDataset.map without features=) "
            f"leaves it no features, so its records' numbers batch as int64/float64 (JSON's "
            f"rules), not as declared below the map: {', '.join(changed[:6])}"
            f"{' ...' if len(changed) > 6 else ''}; pass the map features= (what it returns: "
            "ds.map(f, features=ds.features) where it keeps them), or cast in it",
            JaxloaderWarning, stacklevel=user_stacklevel())


class HuggingFaceShard:
    """Shard ``index`` of ``count`` of a ``datasets.IterableDataset`` (``ds.shard(count,
    index)``), following the ``Shard`` protocol; the state is the dataset's own."""

    fresh_state = True  # (get_state() makes it anew: the reader keeps it without a copy)
    code_before = ("",)  # (states until 2026-12-07's eleventh session: its functions undigested)

    def __init__(self, dataset: Any, index: int, count: int, names: tuple[str, ...],
                 code: str | None = None) -> None:
        self.dataset, self.index, self.count, self._names = dataset, index, count, names
        self.code = code  # its functions' digest (``iterable_shards.codes_of``), if any
        features = getattr(dataset, "features", None)
        self._plan = plan_of(dict(features)) if features else _UNKNOWN
        self._part: Any = None
        self._it: Any = None
        self._start: dict | None = None  # the state reset() was given, until a record is read
        self._started = False
        self._files: list | None = None  # [name, size, CRC-32s of its ends] of its local files

    @property
    def name(self) -> str:
        """The dataset's name and its data's digest; under ``older_digests()``, as versions until
        2026-11-30 wrote it (the end of its chain alone: a joined dataset's undigested)."""
        return self._names[older_digests()]

    def reset(self, state: dict | None = None) -> None:
        given = self._checked(state)
        part = self.dataset.shard(num_shards=self.count, index=self.index)
        self._files = huggingface_chain.local_files(part)
        if isinstance(state, dict):  # (a state in the shard's first window has no "hf" place)
            _check_files(self.name, state.get("files"), self._files)
        if given is not None:
            if given["epoch"] != getattr(part, "epoch", 0):  # (the dataset would start over)
                raise StateDictError(
                    f"HuggingFaceShard {self.name}: the state is of the dataset's epoch "
                    f"{given['epoch']}, the dataset is in epoch {part.epoch}; restore into the "
                    "dataset the state was saved from")
            _check_chain(self.name, given, part.state_dict())
            part.load_state_dict(copied(given))  # (get_state() hands out ``given``)
        self._part, self._it = part, iter(part)
        self._start, self._started = given, False

    def next(self) -> Any:
        if self._it is None:
            self.reset(None)
        record = next(self._it)
        self._started = True
        return as_declared(record, self._plan, f"HuggingFaceShard {self._names[0]}: a record")

    @property
    def local_files(self) -> list | None:
        """``[name, size, head, tail]`` of each local file it reads, as last opened: its
        identity where a stream's window enters it (a state's ``crossed_files``)."""
        return self._files

    def check_files(self, then: Any) -> None:
        """Refuses a state's ``local_files`` ``then`` other than those open now, naming one."""
        _check_files(self.name, then, self._files)

    def get_state(self) -> dict:
        # the dataset has a state once it is iterating (its first example asked for)
        state = {"hf": self._part.state_dict() if self._started else self._start}
        return {**state, "files": self._files} if self._files else state

    def close(self) -> None:
        if self._started:  # get_state() still answers, with where it stopped
            self._start, self._started = self._part.state_dict(), False
        self._part = self._it = None

    def _checked(self, state: dict | None) -> dict | None:
        if state is None:
            return None
        given = state.get("hf", ()) if isinstance(state, dict) else ()
        if given is None:
            return None
        if not (isinstance(given, dict) and "examples_iterable" in given
                and type(given.get("epoch")) is int):
            raise StateDictError(
                f"HuggingFaceShard {self.name}: expected a state {{'hf': the dataset's "
                f"state_dict() or None}}, got {state!r:.200}; restore a state this stream saved")
        return given

    def __repr__(self) -> str:  # (it was a function nested in _check_files', never called)
        return f"HuggingFaceShard({self.name})"

    def __getstate__(self) -> dict:  # the iterator stays with its process
        return {**self.__dict__, "_part": None, "_it": None, "_start": None, "_started": False,
                "_files": None}


def _check_chain(name: str, then: dict, now: dict) -> None:
    """Refuses a state saved over another chain of ``map``s and ``filter``s than the dataset's
    (its iterables' kinds, in the order the state holds them): its places would be read as
    another kind's (a ``KeyError`` of the dataset's, or a restore at other records)."""
    saved, held = _kinds(then), _kinds(now)
    if saved != held:
        raise StateDictError(
            f"HuggingFaceShard {name}: the state was saved over a dataset whose chain is "
            f"{' > '.join(saved) or '(none)'}, this one's is {' > '.join(held) or '(none)'}: "
            "a map or "
            "filter was added, left out or reordered since; restore over the dataset made as "
            "the state's was (its map and filter calls, in order), or start the stream again "
            "without this state")


def _kinds(state: Any) -> list[str]:
    """The kinds of the iterables a dataset's ``state_dict()`` holds, outermost first
    (``"Mapped"`` for ``MappedExamplesIterable``)."""
    if isinstance(state, list):
        return [k for item in state for k in _kinds(item)]
    if not isinstance(state, dict):
        return []
    kind = state.get("type")
    own = [kind.removesuffix("ExamplesIterable") or kind] if isinstance(kind, str) else []
    return own + [k for key in sorted(state, key=str) if key != "previous_state"
                  for k in _kinds(state[key])]


def _check_files(name: str, then: Any, now: list | None) -> None:
    """Refuses a restore of shard ``name`` over local files other than its state names (a
    state without them, saved before 2026-11-30, resumes as it is)."""
    if then is None or then == now:
        return
    now_by_name = {f[0]: f[1:] for f in now or ()}
    for entry in then if isinstance(then, list) else [then]:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)):
            raise StateDictError(f"HuggingFaceShard {name}: state['files']: expected [name, "
                                 f"size, head, tail] of each file, got {entry!r:.120}; restore "
                                 "a state this stream saved")
        held = now_by_name.get(entry[0])
        if held != entry[1:]:
            what = ("not among the shard's files now" if held is None else
                    file_identity.change(entry[1:], held))
            raise StateDictError(
                f"HuggingFaceShard {name}: its file {entry[0]} changed since the state was "
                f"saved ({what}): the state's place would resume inside other rows; restore "
                "over the files the state was saved with, or start the stream again without "
                "this state")
