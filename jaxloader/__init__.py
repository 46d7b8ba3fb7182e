"""jaxloader: a JAX/NumPy-native data loader, deterministic in ``(seed, epoch, step)``.

Example:
    >>> import numpy as np, jaxloader
    >>> source = jaxloader.ArraySource({"x": np.arange(10), "y": np.arange(10) % 2})
    >>> loader = jaxloader.DataLoader(source, batch_size=4, shuffle=True, seed=0,
    ...                               process_index=0, process_count=1)
    >>> [b["x"].shape for b in loader]
    [(4,), (4,)]
"""

from typing import TYPE_CHECKING, Any

from jaxloader.base.errors import (
    ArgumentError,
    CollateError,
    ConfigError,
    JaxloaderError,
    JaxloaderWarning,
    PerformanceWarning,
    RecordError,
    SharedMemoryError,
    StallError,
    StateDictError,
    WorkerError,
)
from jaxloader.loaders.iterator import LoaderIterator
from jaxloader.loaders.data_loader import DataLoader
from jaxloader.order.local_shuffle import LocalShuffle
from jaxloader.mix import mix
from jaxloader.sources.mixture import Mixture
from jaxloader.derived.packed_source import PackedSource
from jaxloader.derived.filtered import FilteredSource
from jaxloader.sources import (
    ArrayRecordSource,
    ArraySource,
    ConcatSource,
    FileListSource,
    MapSource,
    ParquetSource,
    RaggedSource,
    Source,
)
from jaxloader.base.stats import LoaderStats, WorkerStats
from jaxloader.loaders.diagnosis import Diagnosis
from jaxloader.loaders.stream_loader import StreamLoader
from jaxloader.streams import (IterableShard, JsonlShard, PackedStream, Shard, Stream,
                               TarShard, TextShard)
from jaxloader.batching.jit_map import JitMap
from jaxloader.batching.pad import Pad
from jaxloader.batching.transforms import BatchMap, Filter, Map, RandomMap
from jaxloader.workers import WorkerInfo, get_worker_info
from jaxloader.profiling import profile

__all__ = [
    "ArgumentError",
    "ArrayRecordSource",
    "ArraySource",
    "BatchMap",
    "CollateError",
    "ConcatSource",
    "ConfigError",
    "DataLoader",
    "Diagnosis",
    "FileListSource",
    "Filter",
    "FilteredSource",
    "IterableShard",
    "JaxloaderError",
    "JaxloaderWarning",
    "JitMap",
    "JsonlShard",
    "LoaderIterator",
    "LoaderStats",
    "LocalShuffle",
    "Map",
    "MapSource",
    "Mixture",
    "PackedSource",
    "Pad",
    "ParquetSource",
    "PerformanceWarning",
    "RaggedSource",
    "RandomMap",
    "RecordError",
    "Shard",
    "SharedMemoryError",
    "Source",
    "StallError",
    "StateDictError",
    "PackedStream",
    "Stream",
    "StreamLoader",
    "TarShard",
    "TextShard",
    "WorkerError",
    "WorkerInfo",
    "WorkerStats",
    "data_sharding",
    "get_worker_info",
    "mix",
    "profile",
]
__version__ = "0.1.0"


def _lazy(name: str) -> Any:
    """Imports ``data_sharding`` (and with it JAX) on first use: ``import jaxloader``, and every
    worker, stay free of JAX; and the modules of optional parts (``jl.checkpoint``, Orbax's;
    ``jl.ray``), as ``import jaxloader.checkpoint`` would."""
    if name == "data_sharding":
        from jaxloader.sharding.put import data_sharding as value

        globals()[name] = value
        return value
    if name in ("checkpoint", "ray"):
        import importlib

        return importlib.import_module(f"jaxloader.{name}")  # (sets the attribute too)
    raise AttributeError(f"module 'jaxloader' has no attribute {name!r}")


if TYPE_CHECKING:  # for type checkers (a misspelt name is then theirs to flag); at run time
    from jaxloader import checkpoint, ray  # the module's __getattr__ serves these
    from jaxloader.sharding.put import data_sharding

    __all__ += ["checkpoint", "ray"]  # (to type checkers only: a star import leaves them)
else:
    __getattr__ = _lazy
