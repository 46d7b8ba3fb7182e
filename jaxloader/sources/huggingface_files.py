"""A Hugging Face ``Dataset`` over files, as it crosses to a worker: its pickle names its Arrow
files, which ``datasets`` maps again there by their names. Loaded here, a file cut, written
again or deleted since the loader was made is named with the remedy, where pyarrow's own error
named no file ("Expected to be able to read 17008 bytes for message body, got 172") or no
remedy.

Example:
    >>> import pickle
    >>> from jaxloader.base.mapped_files import MappedFiles
    >>> pickle.loads(pickle.dumps(MappedAgain([1, 2], []))).load(MappedFiles("a list"))
    [1, 2]
"""

from __future__ import annotations

from typing import Any

import cloudpickle

from jaxloader.base.errors import ConfigError
from jaxloader.base.mapped_files import MappedFiles


class MappedAgain:
    """``dataset`` pickled apart (its files' names, not their bytes), to be loaded where its
    failure can name ``paths``."""

    def __init__(self, dataset: Any, paths: list[str]) -> None:
        self.pickled = cloudpickle.dumps(dataset)
        self.paths = paths

    def load(self, mapped: MappedFiles) -> Any:
        """The dataset, its files mapped again; refuses one changed since ``mapped``'s
        stamps, or gone, naming it."""
        try:
            return cloudpickle.loads(self.pickled)
        except Exception as e:
            mapped.check()  # (a file cut or replaced: said by the stamps' check)
            raise ConfigError(
                f"{mapped.who}: a worker could not map its files again ({', '.join(self.paths)})"
                f": {type(e).__name__}: {e}; one was deleted or changed since the loader was "
                f"made: {mapped.remedy}") from e
