"""Streams: records without random access, read in order from shards with checkpointable state.

| module | what |
|---|---|
| ``shards`` | the ``Shard`` protocol (``reset(state)``, ``next()``, ``get_state()``) and ready shards: ``JsonlShard``, ``TextShard``, ``IterableShard`` |
| ``tar`` | ``TarShard``: tar files in the WebDataset layout, headers parsed here |
| ``reader`` | ``Stream`` (shards, shuffle window) and its makers (``jsonl``, ``text``, ``tar``, ``from_generator``, ``huggingface``) |
| ``stream_reader`` | ``StreamReader`` (one reader's share, epochs, windows, state) |
| ``compressed`` | gzip, bzip2, xz and Zstandard files read as what they hold |
| ``mixed`` | ``MixedStream`` (``jl.mix`` of streams) and ``MixedReader`` (a reader's records by weight) |
| ``packed`` | ``PackedStream``: a stream's token sequences end to end, cut into rows of one length |
| ``huggingface`` | ``HuggingFaceShard``: a Hugging Face ``IterableDataset``'s shard, resumed by its own state (``Stream.huggingface``) |
| ``huggingface_values`` | a Hugging Face stream's records as a ``Dataset``'s rows: its features' dtypes |
| ``maker`` | ``StreamBatchMaker``: a reader's batches, transformed and collated |

``jaxloader.StreamLoader`` reads a ``Stream`` in the main process or in worker processes.
"""

from jaxloader.streams.packed import PackedStream
from jaxloader.streams.reader import Stream
from jaxloader.streams.stream_reader import StreamReader
from jaxloader.streams.iterable_shards import IterableShard
from jaxloader.streams.shards import JsonlShard, Shard, TextShard
from jaxloader.streams.tar import TarShard

__all__ = ["IterableShard", "JsonlShard", "PackedStream", "Shard", "Stream", "StreamReader",
           "TarShard", "TextShard"]
