"""Random-access sources, one module per kind; ``base`` holds the protocol every one follows.

| module | source |
|---|---|
| ``arrays`` | ``ArraySource``: in-memory arrays, shared with the workers without copying |
| ``concat`` | ``ConcatSource``: sources one after another in one index space |
| ``parquet`` | ``ParquetSource``: rows of Parquet files, read by row group (pyarrow) |
| ``files`` | ``FileListSource``: one record per file: its bytes (and a label) |
| ``kept_arrays`` | arrays found once from the records, kept in a ``.npy`` (lengths, indices) |
| ``array_record`` | ``ArrayRecordSource``: records of ArrayRecord files, as bytes |
| ``ragged`` | ``RaggedSource``: variable-length sequences stored flat, with offsets |
| ``mapped`` | ``MapSource``: a source's records through a function of its own (before mixing) |
| ``huggingface`` | ``HuggingFaceSource``: a ``datasets.Dataset`` read as NumPy (automatic) |
| ``parquet_files`` | a ``ParquetSource``'s files: opened when read, checked against what they were |
| ``parts`` | the sources a source is made of, walked (closing them, naming their files) |
"""

from jaxloader.sources.array_record import ArrayRecordSource
from jaxloader.sources.arrays import ArraySource
from jaxloader.sources.base import Source, check_source
from jaxloader.sources.concat import ConcatSource
from jaxloader.sources.files import FileListSource
from jaxloader.sources.mapped import MapSource
from jaxloader.sources.parquet import ParquetSource
from jaxloader.sources.ragged import RaggedSource

__all__ = ["ArrayRecordSource", "ArraySource", "ConcatSource", "FileListSource", "MapSource",
           "ParquetSource", "RaggedSource", "Source", "check_source"]
