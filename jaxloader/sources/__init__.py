"""Random-access sources, one module per kind; ``base`` holds the protocol every one follows.

| module | source |
|---|---|
| ``arrays`` | ``ArraySource``: in-memory arrays, shared with the workers without copying |
| ``concat`` | ``ConcatSource``: sources one after another in one index space |
| ``parquet`` | ``ParquetSource``: rows of Parquet files, read by row group (pyarrow) |
| ``files`` | ``FileListSource``: one record per file: its bytes (and a label) |
"""

from jaxloader.sources.arrays import ArraySource
from jaxloader.sources.base import Source, check_source
from jaxloader.sources.concat import ConcatSource
from jaxloader.sources.files import FileListSource
from jaxloader.sources.parquet import ParquetSource

__all__ = ["ArraySource", "ConcatSource", "FileListSource", "ParquetSource", "Source",
           "check_source"]
