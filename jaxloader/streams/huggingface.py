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
when they are alike (as arrays of one shape are). Where the features are unknown (a JSON file
streamed without them), lists of numbers become arrays as ``JsonlShard`` reads them.

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

import datetime
import sys
from typing import Any

import numpy as np

from jaxloader.base import file_identity
from jaxloader.base.abilities import in_generation, older_digests
from jaxloader.base.checks import released_at_least
from jaxloader.base.columns import object_column
from jaxloader.base.errors import ConfigError, RecordError, StateDictError
from jaxloader.base.state_copy import copied
from jaxloader.sources.huggingface import _declared_dtype, refuse_zones
from jaxloader.streams import huggingface_chain
from jaxloader.streams.json_values import numbers_as_arrays

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
    # read in Python format whatever the dataset's, converted here as the features declare:
    # the dataset's NumPy format is several times slower a record, torch's would give tensors
    dataset = dataset.with_format(None)
    count = getattr(dataset, "num_shards", None) or dataset.n_shards
    name = getattr(getattr(dataset, "info", None), "dataset_name", None) or "IterableDataset"
    names = (name + huggingface_chain.data_digest(dataset),
             name + in_generation(1, lambda: huggingface_chain.data_digest(dataset)))
    return [HuggingFaceShard(dataset, i, count, tuple(f"{n}[{i}/{count}]" for n in names))
            for i in range(count)]


class HuggingFaceShard:
    """Shard ``index`` of ``count`` of a ``datasets.IterableDataset`` (``ds.shard(count,
    index)``), following the ``Shard`` protocol; the state is the dataset's own."""

    fresh_state = True  # (get_state() makes it anew: the reader keeps it without a copy)

    def __init__(self, dataset: Any, index: int, count: int, names: tuple[str, ...]) -> None:
        self.dataset, self.index, self.count, self._names = dataset, index, count, names
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

    def __getstate__(self) -> dict:  # the iterator stays with its process
        return {**self.__dict__, "_part": None, "_it": None, "_start": None, "_started": False,
                "_files": None}


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

    def __repr__(self) -> str:
        return f"HuggingFaceShard({self.name})"


def plan_of(features: Any) -> Any:
    """What ``as_declared`` does with each field of ``features`` (a ``Features`` dict),
    worked out once: a dict of fields' plans for a struct, the declared NumPy dtype of a
    number or of a list's numbers, ``_STRINGS`` for a list of strings, ``None`` for the rest
    (strings, images)."""
    if isinstance(features, dict):
        return {key: plan_of(feature) for key, feature in features.items()}
    inner = getattr(features, "feature", None)  # List / Sequence / LargeList
    if str(getattr(inner, "dtype", "")) in _TEXT:
        return _STRINGS
    declared = _declared_dtype(features)  # (tested for None: NumPy 1.x took a dtype with no
    # fields as false)
    return declared if declared is not None else _time_dtype(features)


def _time_dtype(feature: Any) -> np.dtype | None:
    """``datetime64``/``timedelta64`` for a ``Value`` of Arrow's ``timestamp[unit]``,
    ``date32``/``date64`` or ``duration[unit]`` (a ``Dataset`` in NumPy format gives
    these; Python format gives ``datetime`` objects, which do not batch)."""
    kind = str(getattr(feature, "dtype", ""))
    unit = kind[kind.find("[") + 1:].split(",")[0].rstrip("]") if "[" in kind else ""
    if kind.startswith("timestamp[") and unit in ("s", "ms", "us", "ns"):
        return np.dtype(f"datetime64[{unit}]")
    if kind.startswith("duration[") and unit in ("s", "ms", "us", "ns"):
        return np.dtype(f"timedelta64[{unit}]")
    return {"date32": np.dtype("datetime64[D]"), "date64": np.dtype("datetime64[ms]")}.get(kind)


class _Plan:
    """A plan that is not a dtype: one object in every process (unpickled by its name)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> str:
        return self.name


_UNKNOWN = _Plan("_UNKNOWN")  # a field the features do not name
_STRINGS = _Plan("_STRINGS")  # a list of strings (or bytes): an object array a row
_TEXT = ("string", "large_string", "binary", "large_binary")
_PYTHON = {int: np.dtype(np.int64), float: np.dtype(np.float64), bool: np.dtype(np.bool_)}


def _holds_none(value: list) -> bool:
    """Whether a ``None`` is among a list's items, through lists of lists."""
    if value and type(value[0]) is list:
        return any(v is None or type(v) is list and _holds_none(v) for v in value)
    return None in value


def as_declared(value: Any, plan: Any, name: str = "a record") -> Any:
    """A record in Python format with its lists of numbers as arrays and its numbers of the
    dtypes declared (``plan``, from ``plan_of``; ``_UNKNOWN``: lists of numbers as
    ``JsonlShard`` reads them); strings and other leaves as they are.

    Example:
        >>> import datasets
        >>> plan = plan_of(datasets.Features({"v": datasets.Sequence(datasets.Value("float32")),
        ...                                   "n": datasets.Value("int16")}))
        >>> record = as_declared({"v": [0.5, 1.0], "n": 3}, plan)
        >>> record["v"].dtype, record["n"].dtype
        (dtype('float32'), dtype('int16'))
    """
    if type(plan) is dict:
        if type(value) is not dict:
            return numbers_as_arrays(value)
        return {key: as_declared(v, plan.get(key, _UNKNOWN), f"{name}[{key!r}]")
                for key, v in value.items()}
    if plan is _UNKNOWN:
        return numbers_as_arrays(value)
    kind = type(value)
    if kind is list and (plan is _STRINGS or isinstance(plan, np.dtype)) and _holds_none(
            value):  # (NumPy made it NaN, or False; an int list's became a list: the batch's
        raise RecordError(  # structure changed; refused as a Dataset's is)
            f"{name}: a list of {'strings' if plan is _STRINGS else plan} holds a null (None): "
            f"{value!r:.80}; fill the nulls (ds.map) or drop those rows (ds.filter) before "
            "streaming")
    if plan is _STRINGS:
        return object_column(value) if kind is list else value
    if kind is list:
        if plan is not None:
            try:
                return np.asarray(value, plan)
            except (TypeError, ValueError):  # inner lists of other lengths, a None
                pass
        return numbers_as_arrays(value)
    # a Python number batches as int64, float64 or bool: cast only to another dtype
    if plan is not None and kind in _PYTHON and _PYTHON[kind] != plan:
        return plan.type(value)
    if isinstance(value, (datetime.date, datetime.timedelta)) and isinstance(plan, np.dtype):
        if isinstance(value, datetime.datetime) and value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)  # as Arrow
        return np.array(value, dtype=plan)[()]
    return value
